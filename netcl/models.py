"""The reference workloads of spec/MODELS.md, built from the public API."""
from netcl import nn
from netcl.nn import functional as F

MODELS = {}


def _register(input_shape):
    def wrap(fn):
        fn.input_shape = input_shape  # per-sample shape; prepend the batch size
        MODELS[fn.__name__] = fn
        return fn
    return wrap


@_register((64,))
def mlp():
    """Linear(64, 128) -> ReLU -> Linear(128, 128) -> Tanh -> Linear(128, 10); input (N, 64)."""
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.Tanh(), nn.Linear(128, 10))


@_register((3, 32, 32))
def cnn():
    """A two-block CNN for (N, 3, 32, 32) inputs, 10 classes."""
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.LeakyReLU(0.1), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 4 * 4, 10))


@_register((3, 256, 256))
def detector26():
    """The 26-layer face-detector stack: six Conv-BN-LeakyReLU-MaxPool blocks (3 -> 512 channels),
    then Conv2d(512, 5, 1) -> Sigmoid. Input (N, 3, 256, 256), output (N, 5, 4, 4)."""
    layers, chans = [], [3, 16, 32, 64, 128, 256, 512]
    for c_in, c_out in zip(chans, chans[1:]):
        layers += [nn.Conv2d(c_in, c_out, 3, padding=1), nn.BatchNorm2d(c_out), nn.LeakyReLU(0.1), nn.MaxPool2d(2)]
    layers += [nn.Conv2d(512, 5, 1), nn.Sigmoid()]
    return nn.Sequential(*layers)


def build(name):
    """A reference model by name (one of MODELS)."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; expected one of {sorted(MODELS)}")
    return MODELS[name]()


# -- architectures with blocks (docs/MODELS.md) ---------------------------------------------
def _conv_bn(c_in, c_out, k=3, stride=1, act=None, groups=1):
    """Conv2d (no bias: the batch norm's shift replaces it) + BatchNorm2d [+ activation]."""
    layers = [nn.Conv2d(c_in, c_out, k, stride=stride, padding=k // 2, groups=groups, bias=False),
              nn.BatchNorm2d(c_out)]
    return layers + ([act()] if act is not None else [])


@_register((3, 32, 32))
def resnet8():
    """ResNet-8 (spec/MODELS.md): a 16-channel stem, three residual stages (16, 32, 64 channels;
    the last two halve the size through a strided conv and a 1x1 conv + BN shortcut), global
    average pooling, Linear(64, 10). Input (N, 3, 32, 32)."""
    stages = [nn.Residual(*_conv_bn(16, 16, act=nn.ReLU), *_conv_bn(16, 16)), nn.ReLU()]
    for c_in, c_out in ((16, 32), (32, 64)):
        stages += [nn.Residual(*_conv_bn(c_in, c_out, stride=2, act=nn.ReLU), *_conv_bn(c_out, c_out),
                               shortcut=nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=2, bias=False),
                                                      nn.BatchNorm2d(c_out))),
                   nn.ReLU()]
    return nn.Sequential(*_conv_bn(3, 16, act=nn.ReLU), *stages, nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(64, 10))


class BasicBlock(nn.Module):
    """resnet8's residual block as a PyTorch user writes it: relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut)."""

    def __init__(self, c_in, c_out, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = None
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x):
        """x: (N, C_in, H, W) -> (N, C_out, H / stride, W / stride)."""
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        return F.relu(h + (x if self.shortcut is None else self.shortcut(x)))


class ResNet8(nn.Module):
    """resnet8() written as a Module subclass: the same layers, the blocks' sums in Python (h + x).
    What a PyTorch user's model looks like; netcl trains it through autograd."""

    def __init__(self, num_classes=10):
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        self.blocks = nn.ModuleList([BasicBlock(16, 16), BasicBlock(16, 32, 2), BasicBlock(32, 64, 2)])
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x):
        """x: (N, 3, 32, 32) -> logits (N, num_classes)."""
        h = F.relu(self.bn(self.conv(x)))
        for block in self.blocks:
            h = block(h)
        return self.fc(F.adaptive_avg_pool2d(h, 1).flatten(1))


def _inverted_residual(c_in, c_out, stride, expand):
    """MobileNetV2's block: 1x1 expand (unless expand == 1), 3x3 depthwise, 1x1 linear projection;
    a residual connection where the shape is kept."""
    hidden = c_in * expand
    layers = _conv_bn(c_in, hidden, 1, act=nn.ReLU6) if expand != 1 else []
    layers += _conv_bn(hidden, hidden, 3, stride, act=nn.ReLU6, groups=hidden) + _conv_bn(hidden, c_out, 1)
    return nn.Residual(*layers) if stride == 1 and c_in == c_out else nn.Sequential(*layers)


@_register((3, 32, 32))
def mobilenetv2_tiny():
    """A small MobileNetV2 for (N, 3, 32, 32), 10 classes: stem, five inverted residual blocks
    (16 -> 16 -> 24 -> 24 -> 32 -> 32 channels, strides 1, 2, 1, 2, 1, expansion 1 then 4), a 1x1
    conv to 64, global average pooling, Linear(64, 10). ReLU6 throughout."""
    blocks = [_inverted_residual(a, b, s, t) for a, b, s, t in
              ((16, 16, 1, 1), (16, 24, 2, 4), (24, 24, 1, 4), (24, 32, 2, 4), (32, 32, 1, 4))]
    return nn.Sequential(*_conv_bn(3, 16, act=nn.ReLU6), *blocks, *_conv_bn(32, 64, 1, act=nn.ReLU6),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))


def _unet_level(c, depth):
    """One U-Net level at `c` channels: its features concatenated (a skip connection) with the
    upsampled result of the level below, which works at half the size and twice the channels."""
    if depth == 0:
        return nn.Sequential(*_conv_bn(c, c, act=nn.ReLU))
    inner = nn.Sequential(nn.MaxPool2d(2), *_conv_bn(c, 2 * c, act=nn.ReLU), _unet_level(2 * c, depth - 1),
                          nn.Upsample(scale_factor=2, mode="nearest"), *_conv_bn(2 * c, c, act=nn.ReLU))
    return nn.Sequential(nn.Concat(nn.Identity(), inner, dim=1), *_conv_bn(2 * c, c, act=nn.ReLU))


@_register((3, 64, 64))
def unet_tiny():
    """A three-level U-Net for (N, 3, 64, 64) -> (N, 1, 64, 64) segmentation logits: 8, 16 and 32
    channels, max-pool down, nearest upsampling up, Concat skip connections."""
    return nn.Sequential(*_conv_bn(3, 8, act=nn.ReLU), _unet_level(8, 2), nn.Conv2d(8, 1, 1))


def _encoder_block(dim, heads, hidden):
    """Pre-norm transformer encoder block: attention and MLP, each in a residual."""
    return [nn.Residual(nn.LayerNorm(dim), nn.MultiheadAttention(dim, heads)),
            nn.Residual(nn.LayerNorm(dim), nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))]


@_register((1, 8, 8))
def vit_tiny():
    """A vision transformer sized for the 8x8 digits (N, 1, 8, 8), 10 classes: a convolutional
    patch embedding (3x3, stride 1, padding 1: 64 tokens of 32), a learned token mixing in a
    residual (Linear over the token axis: where each token sits, which attention and the final
    average alone would not see), two pre-norm encoder blocks (4 heads, MLP 64 with GELU),
    LayerNorm, the average over tokens, Linear(32, 10)."""
    dim, tokens = 32, 64
    return nn.Sequential(nn.Conv2d(1, dim, 3, stride=1, padding=1), nn.Flatten(2), nn.Transpose(1, 2),
                         nn.Residual(nn.Transpose(1, 2), nn.Linear(tokens, tokens), nn.Transpose(1, 2)),
                         *_encoder_block(dim, 4, 2 * dim), *_encoder_block(dim, 4, 2 * dim), nn.LayerNorm(dim),
                         nn.Transpose(1, 2), nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(dim, 10))
