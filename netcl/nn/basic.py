"""Layers without parameters that pass, reshape, permute or mask their input: Identity, Flatten,
Transpose, Dropout."""
import math

import numpy as np

from netcl import ops
from netcl.nn.module import Module, as_float, as_int, rng


class Identity(Module):
    """y = x (a placeholder, e.g. a block's shortcut)."""
    CALL_STATE = ()

    # x -> x (a placeholder, e.g. a block's shortcut); the same tensor, no copy
    def forward(self, x):
        self._on(x)
        return x

    def backward(self, dy):
        return dy


def _dim(layer, d, shape):
    """Dimension `d` (negative counts from the end, as PyTorch) of `shape`, or ValueError."""
    if not -len(shape) <= d < len(shape):
        raise ValueError(f"{layer} does not fit an input of shape {tuple(shape)}: dimension {d} is out of range")
    return d % len(shape)


class Flatten(Module):
    """Flatten(start_dim=1, end_dim=-1): dimensions start_dim..end_dim merged into one (a view)."""
    CALL_STATE = ("_shape",)

    # x: (..., d_start, ..., d_end, ...) -> (..., prod(d_start..d_end), ...); a view, no copy.
    # The default (1, -1) gives (N, prod(...)); a 1-D input then becomes (N, 1), as netcl always did.
    def __init__(self, start_dim=1, end_dim=-1):
        super().__init__()
        self.start_dim, self.end_dim = as_int("start_dim", start_dim), as_int("end_dim", end_dim)

    def config(self):
        # the default records nothing: files, repr and ONNX doc strings stay as they were before the arguments
        if (self.start_dim, self.end_dim) == (1, -1):
            return {}
        return {"start_dim": self.start_dim, "end_dim": self.end_dim}

    def output_shape(self, shape):
        if len(shape) < 1:
            raise ValueError("Flatten expects at least a batch dimension")
        if (self.start_dim, self.end_dim) == (1, -1):
            return (shape[0], int(math.prod(shape[1:])))
        s, e = _dim(self, self.start_dim, shape), _dim(self, self.end_dim, shape)
        if s > e:
            raise ValueError(f"{self}: start_dim comes after end_dim for an input of shape {tuple(shape)}")
        return tuple(shape[:s]) + (int(math.prod(shape[s:e + 1])),) + tuple(shape[e + 1:])

    def forward(self, x):
        self._on(x)
        self._shape = x.shape
        return x.reshape(self.output_shape(x.shape))

    def backward(self, dy):
        return dy.reshape(self._shape)


class Transpose(Module):
    """Transpose(dim0, dim1): two dimensions swapped, as x.transpose(dim0, dim1)."""
    CALL_STATE = ("_shape",)

    # x: (..., a, ..., b, ...) -> (..., b, ..., a, ...), like x.transpose(dim0, dim1); a copy
    def __init__(self, dim0, dim1):
        super().__init__()
        self.dim0, self.dim1 = as_int("dim0", dim0), as_int("dim1", dim1)

    def config(self):
        return {"dim0": self.dim0, "dim1": self.dim1}

    def dims(self, shape):
        """The two dimensions of `shape` it swaps, lower first (ValueError if out of range)."""
        return tuple(sorted((_dim(self, self.dim0, shape), _dim(self, self.dim1, shape))))

    def output_shape(self, shape):
        lo, hi = self.dims(shape)
        out = list(shape)
        out[lo], out[hi] = shape[hi], shape[lo]
        return tuple(out)

    def _split(self, shape):
        """(D0, B, D1, C): `shape` read as (A, D0, B, D1, C) around the swapped dimensions, or None
        when the swap keeps the order of the elements (the same dimension, or all but one of D0, B,
        D1 of size 1): then the output is a view."""
        lo, hi = self.dims(shape)
        b = int(np.prod(shape[lo + 1:hi], dtype=np.int64))
        if lo == hi or sum(v > 1 for v in (shape[lo], b, shape[hi])) <= 1:
            return None
        return shape[lo], b, shape[hi], int(np.prod(shape[hi + 1:], dtype=np.int64))

    def forward(self, x):
        q = self._on(x)
        split, self._shape = self._split(x.shape), x.shape
        if split is None:
            return x.reshape(self.output_shape(x.shape))
        y = ops.new(q, self.output_shape(x.shape))
        d0, _, _, c = split
        ops.launch_rows(q, "shape", "transpose", y.size, y.size // (d0 * c), d0 * c, y.size, *split, x, y)
        return y.mark_written()

    def backward(self, dy):
        split = self._split(self._shape)
        if split is None:
            return dy.reshape(self._shape)
        d0, b, d1, c = split
        dx = ops.new(dy, self._shape)
        ops.launch_rows(dy.queue, "shape", "transpose", dx.size, dx.size // (d1 * c), d1 * c, dx.size, d1, b, d0, c,
                        dy, dx)
        return dx.mark_written()


def _seed():
    return np.uint32(int(rng().integers(0, 2**32)))


class Dropout(Module):
    """Dropout(p=0.5): in training zeroes each element with probability p and scales the rest by 1/(1-p); the identity in eval."""
    CALL_STATE = ("_mask",)

    # identity in eval; in training zeroes with probability p and scales the rest by 1/(1-p)
    def __init__(self, p=0.5):
        super().__init__()
        self.p = as_float("p", p, 0.0, 1.0)  # the probability of zeroing

    def config(self):
        return {"p": self.p}

    def forward(self, x):
        q = self._on(x)
        if not self.training or self.p == 0.0:
            self._mask = None
            return x
        self._mask, y = ops.new(q, x.shape), ops.new(q, x.shape)
        ops.launch1d(q, "pointwise", "dropout_fwd", x.size, x.size, _seed(), self.p, x, self._mask, y)
        ops.varies((1,), lambda: (_seed(),))  # a replayed step draws its seed as this call did
        self._mask.mark_written()
        return y.mark_written()

    def backward(self, dy):
        return dy if self._mask is None else ops.mul(dy, self._mask)
