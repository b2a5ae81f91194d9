"""Activations (codes shared with every kernel family: netcl/act.py, kernels/act.h) and Softmax."""

import numpy as np

from netcl import ops
from netcl.act import Act
from netcl.nn.module import Module, as_float, as_int


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
    """The activation layer of a netcl.act.Act code (slope: LeakyReLU's negative slope)."""
    act = Act(act)
    if act == Act.LEAKY_RELU:
        return LeakyReLU(slope)
    if act in _GELU_ACTS.values():
        return GELU(next(k for k, v in _GELU_ACTS.items() if v == act))
    for cls in (ReLU, Sigmoid, Tanh, SiLU, ReLU6, Hardswish, Hardsigmoid):
        if cls.act == act:
            return cls()
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
