"""Layers without parameters that pass, reshape or mask their input: Identity, Flatten, Dropout."""
import numpy as np

from netcl import ops
from netcl.nn.module import Module, as_float, rng


class Identity(Module):
    # x -> x (a placeholder, e.g. a block's shortcut); the same tensor, no copy
    def forward(self, x):
        self._on(x)
        return x

    def backward(self, dy):
        return dy


class Flatten(Module):
    # x: (N, ...) -> (N, prod(...)); a view, no copy
    def output_shape(self, shape):
        if len(shape) < 1:
            raise ValueError("Flatten expects at least a batch dimension")
        return (shape[0], int(np.prod(shape[1:], dtype=np.int64)))

    def forward(self, x):
        self._on(x)
        self._shape = x.shape
        return x.reshape(self.output_shape(x.shape))

    def backward(self, dy):
        return dy.reshape(self._shape)


class Dropout(Module):
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
        seed = int(rng().integers(0, 2**32))
        ops.launch1d(q, "pointwise", "dropout_fwd", x.size, x.size, np.uint32(seed), self.p, x, self._mask, y)
        self._mask.mark_written()
        return y.mark_written()

    def backward(self, dy):
        return dy if self._mask is None else ops.mul(dy, self._mask)
