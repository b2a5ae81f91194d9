"""netcl.nn.functional: activations, pools, normalisation and losses as functions, with PyTorch's
signatures and reductions (import netcl.nn.functional as F). Each runs in OpenCL kernels and takes
part in autograd: a layer's function calls the layer's kernels (recorded as one node), the rest are
tensor operations (netcl.functions). Arguments netcl does not implement raise NotImplementedError."""
from netcl import functions, ops
from netcl.act import Act
from netcl.autograd import Node, attach, needs_record, traced
from netcl.nn.activation import GELU, Hardsigmoid, Hardswish, LeakyReLU, ReLU, ReLU6, Sigmoid, SiLU, Softmax, Tanh, layer_of
from netcl.nn.basic import Dropout
from netcl.nn.norm import GroupNorm, LayerNorm
from netcl.nn.loss import (BCELoss, BCEWithLogitsLoss, CrossEntropyLoss, HuberLoss, L1Loss, MSELoss, NLLLoss,
                           SmoothL1Loss)
from netcl.nn.pool import AdaptiveAvgPool2d, AvgPool1d, AvgPool2d, MaxPool1d, MaxPool2d
from netcl.nn.upsample import Upsample
from netcl.tensor import Tensor


# -- activations ----------------------------------------------------------------------------------
@traced("F.relu")
def relu(x, inplace=False):
    """max(x, 0)."""
    return functions.activation(x, Act.RELU)


@traced("F.relu6")
def relu6(x, inplace=False):
    """min(max(x, 0), 6)."""
    return functions.activation(x, Act.RELU6)


@traced("F.leaky_relu")
def leaky_relu(x, negative_slope=0.01, inplace=False):
    """x where x > 0, else negative_slope * x."""
    return functions.activation(x, Act.LEAKY_RELU, float(negative_slope))


@traced("F.gelu")
def gelu(x, approximate="none"):
    """x * Phi(x): approximate "none" (erf) or "tanh"."""
    return functions.activation(x, GELU(approximate).act)


@traced("F.silu")
def silu(x, inplace=False):
    """x * sigmoid(x)."""
    return functions.activation(x, Act.SILU)


@traced("F.hardswish")
def hardswish(x, inplace=False):
    """x * relu6(x + 3) / 6."""
    return functions.activation(x, Act.HARDSWISH)


@traced("F.hardsigmoid")
def hardsigmoid(x, inplace=False):
    """relu6(x + 3) / 6."""
    return functions.activation(x, Act.HARDSIGMOID)


@traced("F.sigmoid")
def sigmoid(x):
    """1 / (1 + exp(-x))."""
    return functions.sigmoid(x)


@traced("F.tanh")
def tanh(x):
    """tanh(x)."""
    return functions.tanh(x)


@traced("F.softmax")
def softmax(x, dim):
    """exp(x) / sum(exp(x)) along dim."""
    return functions.softmax(x, dim)


@traced("F.log_softmax")
def log_softmax(x, dim):
    """log(softmax(x)) along dim."""
    return functions.log_softmax(x, dim)


@traced("F.dropout")
def dropout(x, p=0.5, training=True, inplace=False):
    """Zeroes elements with probability p and scales the rest by 1/(1-p) when training."""
    if not training or p == 0.0:
        return x
    return Dropout(p)(x)


def stochastic_depth(input, p, mode, training=True):
    """torchvision.ops.stochastic_depth: in training, each sample's (mode "row") or the whole batch's
    ("batch") residual branch dropped with probability p and the kept ones scaled by 1/(1-p); the
    identity otherwise. The mask is Dropout's on ones, so a replayed step draws it anew."""
    if mode not in ("row", "batch"):
        raise ValueError(f"stochastic_depth: mode must be 'row' or 'batch', got {mode!r}")
    if not training or p == 0.0:
        return input
    shape = ((input.shape[0] if mode == "row" else 1),) + (1,) * (input.ndim - 1)
    return input * Dropout(p)(functions.ones(*shape, queue=input.queue))


# -- the layer of an operation ------------------------------------------------------------------------
# operation (its autograd.TRACEABLE name) -> the layer that does to the first argument what the
# operation does, built from the others (TypeError or ValueError where they are no layer's): what a
# traced graph lifts to (nn.graph.lift) and how the ONNX exporter writes the operation
LAYER_OF = {
    "activation": layer_of, "relu": lambda: ReLU(), "sigmoid": lambda: Sigmoid(), "tanh": lambda: Tanh(),
    "softmax": lambda dim: Softmax(dim),
    "F.relu": lambda inplace=False: ReLU(), "F.relu6": lambda inplace=False: ReLU6(),
    "F.leaky_relu": lambda negative_slope=0.01, inplace=False: LeakyReLU(negative_slope),
    "F.gelu": lambda approximate="none": GELU(approximate), "F.silu": lambda inplace=False: SiLU(),
    "F.hardswish": lambda inplace=False: Hardswish(), "F.hardsigmoid": lambda inplace=False: Hardsigmoid(),
    "F.sigmoid": lambda: Sigmoid(), "F.tanh": lambda: Tanh(), "F.softmax": lambda dim: Softmax(dim),
    "F.dropout": lambda p=0.5, training=True, inplace=False: Dropout(p),  # (follows the graph's mode)
    # (what max_pool2d and avg_pool2d refuse never reaches a graph)
    "F.max_pool2d": lambda kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False:
        MaxPool2d(kernel_size, stride, padding, ceil_mode),
    "F.avg_pool2d": lambda kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True:
        AvgPool2d(kernel_size, stride, padding),
    "F.adaptive_avg_pool2d": lambda output_size: AdaptiveAvgPool2d(output_size),
    "F.max_pool1d": lambda kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False:
        MaxPool1d(kernel_size, stride, padding, ceil_mode),
    "F.avg_pool1d": lambda kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True:
        AvgPool1d(kernel_size, stride, padding),
    "F.interpolate": lambda scale_factor, mode: Upsample(scale_factor, mode),
}


# -- layers as functions ------------------------------------------------------------------------------
class _LinearBackward(Node):
    def __init__(self, x2, weight, bias):
        super().__init__((x2, weight, bias))
        self.save(x2, weight)

    def backward(self, dy):  # dy (N, out); weight (out, in)
        x2, w = self.saved_tensors()
        wx, ww, wb = self.wants
        dx = ops.matmul(dy, w) if wx else None
        dw = ops.matmul(dy, x2, trans_a=True) if ww else None
        db = None
        if wb:
            db = ops.new(dy, (dy.shape[1],))
            ops.sum_axis(dy, dy.shape[0], dy.shape[1], dy.shape[1], 1, db)
        return dx, dw, db


@traced("F.linear")
def linear(x, weight, bias=None):
    """y = x @ weight^T + bias with weight in PyTorch's layout (out_features, in_features), as
    torch.nn.functional.linear (netcl's nn.Linear stores (in, out) for y = x @ W)."""
    x, weight = functions._tensor(x), functions._tensor(weight)
    if weight.ndim != 2 or x.ndim < 1 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"linear: input {x.shape} and weight {weight.shape} (out_features, in_features) do not fit")
    if bias is not None and functions._tensor(bias).shape != (weight.shape[0],):
        raise ValueError(f"linear: bias of shape {bias.shape}, expected ({weight.shape[0]},)")
    x2 = x._view((-1, x.shape[-1]))
    y = ops.matmul(x2, weight, trans_b=True, bias=bias, bias_mode=1 if bias is not None else 0)
    if needs_record(x, weight, bias):
        attach(_LinearBackward(x2, weight, bias), y)
        return y.reshape(x.shape[:-1] + (weight.shape[0],))
    return y._view(x.shape[:-1] + (weight.shape[0],))


@traced("F.max_pool2d")
def max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """Max pooling of (N, C, H, W) (MaxPool2d's kernels; padded positions never win)."""
    if dilation not in (1, (1, 1)) or return_indices:
        raise NotImplementedError("max_pool2d: dilation and return_indices are not supported")
    return MaxPool2d(kernel_size, stride, padding, ceil_mode)(x)


@traced("F.avg_pool2d")
def avg_pool2d(x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
    """Average pooling of (N, C, H, W) (AvgPool2d's kernels)."""
    if ceil_mode or not count_include_pad:
        raise NotImplementedError("avg_pool2d: ceil_mode and count_include_pad=False are not supported")
    return AvgPool2d(kernel_size, stride, padding)(x)


@traced("F.max_pool1d")
def max_pool1d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """Max pooling of (N, C, L) (MaxPool1d's kernels; padded positions never win)."""
    if dilation != 1 or return_indices:
        raise NotImplementedError("max_pool1d: dilation and return_indices are not supported")
    return MaxPool1d(kernel_size, stride, padding, ceil_mode)(x)


@traced("F.avg_pool1d")
def avg_pool1d(x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
    """Average pooling of (N, C, L) (AvgPool1d's kernels)."""
    if ceil_mode or not count_include_pad:
        raise NotImplementedError("avg_pool1d: ceil_mode and count_include_pad=False are not supported")
    return AvgPool1d(kernel_size, stride, padding)(x)


@traced("F.adaptive_avg_pool2d")
def adaptive_avg_pool2d(x, output_size):
    """Average pooling of (N, C, H, W) to output_size (AdaptiveAvgPool2d's kernels)."""
    return AdaptiveAvgPool2d(output_size)(x)


def interpolate(x, size=None, scale_factor=None, mode="nearest", align_corners=None):
    """Integer upsampling of (N, C, H, W), "nearest" or "bilinear" (align_corners False)."""
    if align_corners:
        raise NotImplementedError("interpolate: align_corners=True is not supported")
    if size is not None:
        h, w = (size, size) if isinstance(size, int) else size
        if h % x.shape[2] or w % x.shape[3] or h // x.shape[2] != w // x.shape[3]:
            raise NotImplementedError(f"interpolate to {size} from {x.shape[2:]}: netcl scales by one integer factor")
        scale_factor = h // x.shape[2]
    if scale_factor is None:
        raise ValueError("interpolate needs size or scale_factor")
    return _upsample(x, scale_factor, mode)


@traced("F.interpolate")
def _upsample(x, scale_factor, mode):
    """interpolate() as a graph records it: by its factor (a size is one for the traced shapes)."""
    return Upsample(scale_factor, mode)(x)


@traced("F.layer_norm")
def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """Normalises over the last dimension (netcl's LayerNorm); weight and bias: leaf tensors
    (parameters) or None."""
    layer = LayerNorm(normalized_shape, eps)
    for name, t in (("weight", weight), ("bias", bias)):
        if t is None:
            getattr(layer, name).requires_grad = False  # the identity affine: nothing to learn
            continue
        if not isinstance(t, Tensor) or not t.is_leaf:
            raise NotImplementedError("layer_norm takes weight and bias that are leaf tensors (parameters)")
        if t.shape != (layer.normalized_shape,):
            raise ValueError(f"layer_norm: {name} of shape {t.shape}, expected ({layer.normalized_shape},)")
        layer._params[name] = t
        object.__setattr__(layer, name, t)
    return layer(x)


@traced("F.group_norm")
def group_norm(x, num_groups, weight=None, bias=None, eps=1e-5):
    """GroupNorm's normalisation of (N, C, *) over num_groups groups of channels (netcl's GroupNorm);
    weight and bias: leaf tensors (parameters) of C values, or None (both None: no affine)."""
    x = functions._tensor(x)
    if x.ndim < 2:
        raise ValueError(f"group_norm expects input (N, C, *), got shape {x.shape}")
    layer = GroupNorm(num_groups, x.shape[1], eps, affine=weight is not None or bias is not None)
    for name, t in (("weight", weight), ("bias", bias)):
        if not layer.affine:
            break
        if t is None:
            getattr(layer, name).requires_grad = False  # the identity half of the affine: nothing to learn
            continue
        if not isinstance(t, Tensor) or not t.is_leaf:
            raise NotImplementedError("group_norm takes weight and bias that are leaf tensors (parameters)")
        if t.shape != (x.shape[1],):
            raise ValueError(f"group_norm: {name} of shape {t.shape}, expected ({x.shape[1]},)")
        layer._params[name] = t
        object.__setattr__(layer, name, t)
    return layer(x)


# -- losses: the loss modules (netcl.nn.loss) called once -------------------------------------------
@traced("F.nll_loss")
def nll_loss(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean"):
    """Negative log-likelihood of log-probabilities (N, C, d...) at class indices (N, d...), as nn.NLLLoss."""
    return NLLLoss(weight, size_average, ignore_index, reduce, reduction)(functions._tensor(input), target)


@traced("F.cross_entropy")
def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean",
                  label_smoothing=0.0):
    """log_softmax over dim 1, then nll_loss (class indices) or the cross-entropy of class
    probabilities, as nn.CrossEntropyLoss; (N, C) logits in the plain form run as one kernel."""
    return CrossEntropyLoss(weight, size_average, ignore_index, reduce, reduction, label_smoothing)(
        functions._tensor(input), target)


@traced("F.mse_loss")
def mse_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    """(input - target) ** 2, reduced."""
    return MSELoss(size_average, reduce, reduction)(functions._tensor(input), target)


@traced("F.l1_loss")
def l1_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    """|input - target|, reduced."""
    return L1Loss(size_average, reduce, reduction)(functions._tensor(input), target)


@traced("F.smooth_l1_loss")
def smooth_l1_loss(input, target, size_average=None, reduce=None, reduction="mean", beta=1.0):
    """0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta (d = input - target), reduced."""
    return SmoothL1Loss(size_average, reduce, reduction, beta)(functions._tensor(input), target)


@traced("F.huber_loss")
def huber_loss(input, target, reduction="mean", delta=1.0):
    """0.5 d^2 where |d| < delta, else delta (|d| - 0.5 delta), reduced."""
    return HuberLoss(reduction, delta)(functions._tensor(input), target)


@traced("F.binary_cross_entropy")
def binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None, reduction="mean"):
    """On probabilities; logs clamped at -100 as PyTorch."""
    return BCELoss(weight, size_average, reduce, reduction)(functions._tensor(input), target)


@traced("F.binary_cross_entropy_with_logits")
def binary_cross_entropy_with_logits(input, target, weight=None, size_average=None, reduce=None, reduction="mean",
                                     pos_weight=None):
    """Sigmoid and binary cross-entropy in one stable form, as nn.BCEWithLogitsLoss."""
    return BCEWithLogitsLoss(weight, size_average, reduce, reduction, pos_weight)(functions._tensor(input), target)
