"""The reference workloads of spec/MODELS.md, built from the public API."""
from netcl import nn

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
    """A reference model by name ('mlp', 'cnn', 'detector26')."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; expected one of {sorted(MODELS)}")
    return MODELS[name]()
