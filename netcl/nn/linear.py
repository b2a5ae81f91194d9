"""Linear: y = x @ W + b over the last dimension; W stored (in_features, out_features)."""
import math

import numpy as np

from netcl import ops
from netcl.nn.module import Module, as_bool, positive, uniform


class Linear(Module):
    """Linear(in_features, out_features, bias=True): y = x @ W + b over the last dimension, W stored (in_features, out_features) (PyTorch stores (out, in): state dicts convert by type, never by shape)."""
    CALL_STATE = ("_x2",)

    # x: (..., in) -> (..., out);  y = x @ W + b with W (in, out)
    def __init__(self, in_features, out_features, bias=True):
        super().__init__()
        self.in_features = positive("in_features", in_features)
        self.out_features = positive("out_features", out_features)
        bias = as_bool("bias", bias)
        shapes = self.tensor_shapes(self.in_features, self.out_features, bias)
        bound = 1.0 / math.sqrt(self.in_features)
        self.weight = uniform(bound, shapes["weight"])
        self.bias = uniform(bound, shapes["bias"]) if bias else None
        self._params = {"weight": self.weight, **({"bias": self.bias} if bias else {})}

    @classmethod
    def tensor_shapes(cls, in_features, out_features, bias=True):
        return {"weight": (in_features, out_features), **({"bias": (out_features,)} if bias else {})}

    def config(self):
        return {"in_features": self.in_features, "out_features": self.out_features, "bias": self.bias is not None}

    def from_torch_layout(self, name, array):
        # torch.nn.Linear stores weight (out, in) for y = x @ W^T; netcl (in, out) for y = x @ W
        if name == "weight":
            if array.shape != (self.out_features, self.in_features):
                raise ValueError(f"Linear({self.in_features}, {self.out_features}): a PyTorch weight has shape "
                                 f"({self.out_features}, {self.in_features}), got {array.shape}")
            return array.T
        return array

    def output_shape(self, shape):
        if len(shape) < 2 or shape[-1] != self.in_features:
            raise ValueError(f"Linear({self.in_features}, {self.out_features}) expects input (N, ..., "
                             f"{self.in_features}), got {tuple(shape)}")
        return tuple(shape[:-1]) + (self.out_features,)

    def macs(self, shape):
        return int(np.prod(self.output_shape(shape))) * self.in_features

    def forward(self, x):
        self._on(x)
        out_shape = self.output_shape(x.shape)
        x2 = x.reshape(-1, self.in_features)
        y = ops.matmul(x2, self.weight, bias=self.bias, bias_mode=1 if self.bias is not None else 0)
        self._x2 = x2
        return y.reshape(out_shape)

    def backward(self, dy):
        dy2 = self._param_grads(dy)
        dx = ops.matmul(dy2, self.weight, trans_b=True)
        return dx.reshape(dy.shape[:-1] + (self.in_features,))

    def backward_params(self, dy):
        self._param_grads(dy)

    def _param_grads(self, dy):
        """dW (+)= x^T dy, db (+)= the column sums of dy; returns dy as rows."""
        dy2, x2 = dy.reshape(-1, self.out_features), self._x2
        gw, acc = ops.grad_target(self.weight)
        ops.matmul(x2, dy2, trans_a=True, out=gw, beta=float(acc))
        if self.bias is not None:
            gb, acc = ops.grad_target(self.bias)
            ops.sum_axis(dy2, dy2.shape[0], self.out_features, self.out_features, 1, gb, accumulate=acc)
        return dy2
