"""Activations (codes shared with every kernel family: netcl/act.py, kernels/act.h) and Softmax."""

import math

import numpy as np

from netcl import array_ops, ops
from netcl.act import Act
from netcl.nn.module import Module, as_float, as_int, constant, positive


class _Activation(Module):
    act = Act.NONE  # the code shared with every kernel family (netcl/act.py, kernels/act.h)
    slope = 0.0

    def forward(self, x):
        q = self._on(x)
        y = (ops.act_fwd_cpu if ops.is_cpu(q) else ops.act_fwd)(self.act, x, self.slope)
        self._saved = y if self.act.saves_output else x
        return y

    def backward(self, dy):
        return (ops.act_bwd_cpu if ops.is_cpu(dy.queue) else ops.act_bwd)(self.act, self._saved, dy, self.slope)


class ReLU(_Activation):
    """max(x, 0), element by element (NaN stays NaN)."""
    act = Act.RELU


class LeakyReLU(_Activation):
    """LeakyReLU(negative_slope=0.01): x where x > 0, else negative_slope * x."""
    act = Act.LEAKY_RELU

    def __init__(self, negative_slope=0.01):
        super().__init__()
        self.negative_slope = self.slope = as_float("negative_slope", negative_slope)

    def config(self):
        return {"negative_slope": self.negative_slope}


class Sigmoid(_Activation):
    """1 / (1 + exp(-x)), element by element."""
    act = Act.SIGMOID


class Tanh(_Activation):
    """tanh(x), element by element."""
    act = Act.TANH


_GELU_ACTS = {"none": Act.GELU, "tanh": Act.GELU_TANH}  # GELU's approximate -> its code


class GELU(_Activation):
    # x * Phi(x): "none" with erf, "tanh" with PyTorch's tanh approximation
    """GELU(approximate="none"): x * Phi(x), with erf ("none") or PyTorch's tanh approximation."""
    def __init__(self, approximate="none"):
        super().__init__()
        if not isinstance(approximate, str):
            raise TypeError(f"GELU approximate must be a string, got {type(approximate).__name__}")
        if approximate not in _GELU_ACTS:
            raise ValueError(f"GELU approximate must be one of {list(_GELU_ACTS)}, got {approximate!r}")
        self.approximate = approximate
        self.act = _GELU_ACTS[approximate]

    def config(self):
        return {"approximate": self.approximate}


class SiLU(_Activation):
    """x * sigmoid(x), element by element."""
    act = Act.SILU  # x * sigmoid(x)


class ReLU6(_Activation):
    """min(max(x, 0), 6), element by element."""
    act = Act.RELU6  # min(max(x, 0), 6)


class Hardswish(_Activation):
    """x * relu6(x + 3) / 6, element by element."""
    act = Act.HARDSWISH  # x * relu6(x + 3) / 6


class Hardsigmoid(_Activation):
    """relu6(x + 3) / 6, element by element."""
    act = Act.HARDSIGMOID  # relu6(x + 3) / 6


def layer_of(act, slope=0.0):
    """The activation layer of a netcl.act.Act code (slope: LeakyReLU's negative slope, ELU's alpha,
    Softplus's beta)."""
    act = Act(act)
    if act == Act.LEAKY_RELU:
        return LeakyReLU(slope)
    if act in _GELU_ACTS.values():
        return GELU(next(k for k, v in _GELU_ACTS.items() if v == act))
    for cls in (ReLU, Sigmoid, Tanh, SiLU, ReLU6, Hardswish, Hardsigmoid):
        if cls.act == act:
            return cls()
    if act == Act.ELU:  # the fused plan's inference-only codes (netcl.jit.stages._act_code)
        return ELU(slope)
    if act == Act.SOFTPLUS:
        return Softplus(slope)
    if act == Act.MISH:
        return Mish()
    raise ValueError(f"no activation layer has the code {act!r}")


class Softmax(Module):
    """Softmax(dim=1): exp(x) / sum(exp(x)) along dim."""
    CALL_STATE = ("_y",)

    # x: any shape -> same, normalised along `dim`
    def __init__(self, dim=1):
        super().__init__()
        self.dim = as_int("dim", dim)

    def config(self):
        return {"dim": self.dim}

    def _split(self, shape):
        d = self.dim if self.dim >= 0 else self.dim + len(shape)
        if not 0 <= d < len(shape):
            raise ValueError(f"Softmax(dim={self.dim}) does not fit an input of shape {tuple(shape)}")
        return int(np.prod(shape[:d], dtype=np.int64)), shape[d], int(np.prod(shape[d + 1:], dtype=np.int64))

    def output_shape(self, shape):
        self._split(shape)
        return tuple(shape)

    def forward(self, x):
        q = self._on(x)
        outer, D, inner = self._split(x.shape)
        y = ops.new(q, x.shape)
        ops.softmax_fwd(q, outer, D, inner, x, y)
        self._y = y
        return y

    def backward(self, dy):
        outer, D, inner = self._split(dy.shape)
        dx = ops.new(dy, dy.shape)
        return ops.softmax_bwd(dy.queue, outer, D, inner, self._y, dy, dx, 1.0)


class _Elementwise(Module):
    # x: any shape -> same; a kernel of act_param.cl (forward `_kernel`_fwd, backward `_kernel`_bwd) with the
    # layer's settings `_args()` before the tensors
    _kernel = ""

    def _args(self):
        return ()

    def forward(self, x):
        q = self._on(x)
        y = ops.new(q, x.shape)
        if y.size:
            ops.launch1d(q, "act_param", f"{self._kernel}_fwd", y.size, y.size, *self._args(), x, y)
        self._saved = x
        return y.mark_written()

    def backward(self, dy):
        x = self._saved
        dx = ops.new(dy, dy.shape)
        if dx.size:
            ops.launch1d(dy.queue, "act_param", f"{self._kernel}_bwd", dx.size, dx.size, *self._args(), x, dy, dx)
        return dx.mark_written()


class ELU(_Elementwise):
    """ELU(alpha=1.0): x where x > 0, else alpha * (exp(x) - 1), element by element."""
    _kernel = "elu"

    def __init__(self, alpha=1.0):
        super().__init__()
        self.alpha = as_float("alpha", alpha)

    def config(self):
        return {"alpha": self.alpha}

    def _args(self):
        return (self.alpha,)


class Softplus(_Elementwise):
    """Softplus(beta=1.0, threshold=20.0): log(1 + exp(beta * x)) / beta, element by element; x itself where beta * x > threshold."""
    _kernel = "softplus"

    def __init__(self, beta=1.0, threshold=20.0):
        super().__init__()
        self.beta, self.threshold = as_float("beta", beta), as_float("threshold", threshold)
        if self.beta == 0.0:
            raise ValueError("Softplus needs beta != 0, got 0")

    def config(self):
        return {"beta": self.beta, "threshold": self.threshold}

    def _args(self):
        return (self.beta, self.threshold)


class Mish(_Elementwise):
    """x * tanh(softplus(x)), element by element."""
    _kernel = "mish"


class PReLU(Module):
    # x: (N, C, ...) or any shape when num_parameters = 1 -> same; a learnt slope per channel (dimension 1)
    """PReLU(num_parameters=1, init=0.25): x where x > 0, else weight[c] * x, with a learnt slope for every channel c (dimension 1) or one for all (num_parameters=1)."""

    def __init__(self, num_parameters=1, init=0.25):
        super().__init__()
        self.num_parameters = positive("num_parameters", num_parameters)
        self.init = as_float("init", init)
        self.weight = constant(self.init, self.tensor_shapes(self.num_parameters)["weight"])

    @classmethod
    def tensor_shapes(cls, num_parameters=1, init=0.25):
        return {"weight": (num_parameters,)}

    def config(self):
        return {"num_parameters": self.num_parameters, "init": self.init}

    def output_shape(self, shape):
        if self.num_parameters != 1 and (len(shape) < 2 or shape[1] != self.num_parameters):
            raise ValueError(f"PReLU({self.num_parameters}) expects input (N, {self.num_parameters}, ...), "
                             f"got {tuple(shape)}")
        return tuple(shape)

    def _geometry(self, shape):
        """(outer, C, inner) of the slopes' channel in `shape` (C = 1: one slope for every element)."""
        if self.num_parameters == 1:
            return math.prod(shape), 1, 1
        return shape[0], shape[1], math.prod(shape[2:])

    def forward(self, x):
        q = self._on(x)
        self.output_shape(x.shape)
        _, c, inner = self._geometry(x.shape)
        y = ops.new(q, x.shape)
        if y.size:
            ops.launch1d(q, "act_param", "prelu_fwd", y.size, y.size, c, inner, x, self.weight, y)
        self._saved = x
        return y.mark_written()

    def backward(self, dy):
        x, q = self._saved, dy.queue
        outer, c, inner = self._geometry(x.shape)
        dx = ops.new(dy, dy.shape)
        gw, acc = ops.grad_target(self.weight)
        if dx.size:
            ops.launch1d(q, "act_param", "prelu_bwd_dx", dx.size, dx.size, c, inner, x, self.weight, dy, dx)
        ops.launch1d(q, "act_param", "prelu_bwd_dw", c, outer, c, inner, x, dy, gw, int(acc))
        gw.mark_written()
        return dx.mark_written()


class LogSoftmax(Module):
    """LogSoftmax(dim=1): x - log(sum(exp(x))) along dim, from the maximum (no overflow)."""
    CALL_STATE = ("_y",)

    # x: any shape -> same, along `dim`; tensor.cl's reductions and element-wise kernels
    def __init__(self, dim=1):
        super().__init__()
        self.dim = as_int("dim", dim)

    def config(self):
        return {"dim": self.dim}

    _split = Softmax._split

    def output_shape(self, shape):
        self._split(shape)
        return tuple(shape)

    def forward(self, x):
        self._on(x)
        outer, D, inner = self._split(x.shape)
        x3 = x._view((outer, D, inner))
        m = array_ops.reduce_dim("max", x3, outer, D, inner)[0]._view((outer, 1, inner))
        shifted = array_ops.binary("sub", x3, m)
        total = array_ops.reduce_dim("sum", array_ops.unary("exp", shifted), outer, D, inner)[0]
        y = array_ops.binary("sub", shifted, array_ops.unary("log", total)._view((outer, 1, inner)))
        self._y = y
        return y._view(x.shape)

    def backward(self, dy):  # dx = dy - softmax * sum(dy)
        y = self._y
        outer, D, inner = y.shape
        dy3 = dy._view(y.shape)
        total = array_ops.reduce_dim("sum", dy3, outer, D, inner)[0]._view((outer, 1, inner))
        dx = array_ops.binary("sub", dy3, array_ops.binary("mul", array_ops.unary("exp", y), total))
        return dx._view(dy.shape)
