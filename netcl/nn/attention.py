"""MultiheadAttention: batch-first self-attention with PyTorch's names and (out, in) layouts."""
import math

import numpy as np

from netcl import ops
from netcl.nn.module import Module, Parameter, constant, positive, rng, uniform


class MultiheadAttention(Module):
    # x: (N, L, E) -> (N, L, E); self-attention, PyTorch's parameter names and (out, in) layouts
    """MultiheadAttention(embed_dim, num_heads): self-attention on (N, L, E) -> (N, L, E), PyTorch's projections and state_dict keys."""
    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.embed_dim = positive("embed_dim", embed_dim)
        self.num_heads = positive("num_heads", num_heads)
        if self.embed_dim % self.num_heads:
            raise ValueError(f"embed_dim ({self.embed_dim}) must be divisible by num_heads ({self.num_heads})")
        e = self.embed_dim
        bound = math.sqrt(6.0 / (e + 3 * e))  # xavier_uniform over the (3E, E) in-projection, as PyTorch
        shapes = self.tensor_shapes(e, self.num_heads)
        self.in_proj_weight = Parameter(rng().uniform(-bound, bound, shapes["in_proj_weight"]).astype(np.float32))
        self.in_proj_bias = constant(0.0, shapes["in_proj_bias"])
        self.out_proj_weight = uniform(1.0 / math.sqrt(e), shapes["out_proj.weight"])
        self.out_proj_bias = constant(0.0, shapes["out_proj.bias"])
        self._params = {"in_proj_weight": self.in_proj_weight, "in_proj_bias": self.in_proj_bias,
                        "out_proj.weight": self.out_proj_weight, "out_proj.bias": self.out_proj_bias}

    @classmethod
    def tensor_shapes(cls, embed_dim, num_heads):
        e = embed_dim
        return {"in_proj_weight": (3 * e, e), "in_proj_bias": (3 * e,), "out_proj.weight": (e, e),
                "out_proj.bias": (e,)}

    def config(self):
        return {"embed_dim": self.embed_dim, "num_heads": self.num_heads}

    def output_shape(self, shape):
        if len(shape) != 3 or shape[2] != self.embed_dim:
            raise ValueError(f"MultiheadAttention expects input (N, L, {self.embed_dim}), got {tuple(shape)}")
        return tuple(shape)

    def macs(self, shape):  # the four projections, then scores and their weighted sum
        n, L, e = self.output_shape(shape)
        return n * (4 * L * e * e + 2 * L * L * e)

    def _heads(self, src, rw, off, n, L):
        h, d = self.num_heads, self.embed_dim // self.num_heads
        out = ops.new(src, (n * h, L, d))
        ops.launch_rows(src.queue, "attention", "split_heads", out.size, n * h * L, d, n, L, h, d, src, rw, off, out)
        return out.mark_written()

    def _merge(self, src, dst, rw, off, n, L):
        h, d = self.num_heads, self.embed_dim // self.num_heads
        ops.launch_rows(src.queue, "attention", "merge_heads", src.size, n * h * L, d, n, L, h, d, src, rw, off, dst)
        return dst.mark_written()

    def forward(self, x):
        q = self._on(x)
        self.output_shape(x.shape)
        n, L, e = x.shape
        h, d = self.num_heads, e // self.num_heads
        x2 = x.reshape(n * L, e)
        qkv = ops.matmul(x2, self.in_proj_weight, trans_b=True, bias=self.in_proj_bias, bias_mode=1)
        Q, K, V = (self._heads(qkv, 3 * e, i * e, n, L) for i in range(3))
        S = ops.gemm(L, L, d, Q, (d, 1, L * d), K, (1, d, L * d), ops.new(q, (n * h, L, L)), (L, 1, L * L),
                     alpha=1.0 / math.sqrt(d), batch=n * h)
        P = ops.new(q, S.shape)
        ops.softmax_fwd(q, n * h * L, L, 1, S, P)
        O = ops.gemm(L, d, L, P, (L, 1, L * L), V, (d, 1, L * d), ops.new(q, (n * h, L, d)), (d, 1, L * d),
                     batch=n * h)
        Ocat = self._merge(O, ops.new(q, (n * L, e)), e, 0, n, L)
        y = ops.matmul(Ocat, self.out_proj_weight, trans_b=True, bias=self.out_proj_bias, bias_mode=1)
        self._saved = (x2, Q, K, V, P, Ocat, (n, L))
        return y.reshape(n, L, e)

    def backward(self, dy):
        x2, Q, K, V, P, Ocat, (n, L) = self._saved
        e, h = self.embed_dim, self.num_heads
        d, q = e // h, dy.queue
        dy2 = dy.reshape(n * L, e)
        gw, acc = ops.grad_target(self.out_proj_weight)
        ops.matmul(dy2, Ocat, trans_a=True, out=gw, beta=float(acc))
        gb, acc = ops.grad_target(self.out_proj_bias)
        ops.sum_axis(dy2, n * L, e, e, 1, gb, accumulate=acc)
        dO = self._heads(ops.matmul(dy2, self.out_proj_weight), e, 0, n, L)
        B = n * h
        dP = ops.gemm(L, L, d, dO, (d, 1, L * d), V, (1, d, L * d), ops.new(q, (B, L, L)), (L, 1, L * L), batch=B)
        dV = ops.gemm(L, d, L, P, (1, L, L * L), dO, (d, 1, L * d), ops.new(q, (B, L, d)), (d, 1, L * d), batch=B)
        dS = ops.new(q, (B, L, L))
        ops.softmax_bwd(q, B * L, L, 1, P, dP, dS, 1.0 / math.sqrt(d))
        dQ = ops.gemm(L, d, L, dS, (L, 1, L * L), K, (d, 1, L * d), ops.new(q, (B, L, d)), (d, 1, L * d), batch=B)
        dK = ops.gemm(L, d, L, dS, (1, L, L * L), Q, (d, 1, L * d), ops.new(q, (B, L, d)), (d, 1, L * d), batch=B)
        dqkv = ops.new(q, (n * L, 3 * e))
        for i, g in enumerate((dQ, dK, dV)):
            self._merge(g, dqkv, 3 * e, i * e, n, L)
        gw, acc = ops.grad_target(self.in_proj_weight)
        ops.matmul(dqkv, x2, trans_a=True, out=gw, beta=float(acc))
        gb, acc = ops.grad_target(self.in_proj_bias)
        ops.sum_axis(dqkv, n * L, 3 * e, 3 * e, 1, gb, accumulate=acc)
        return ops.matmul(dqkv, self.in_proj_weight).reshape(n, L, e)
