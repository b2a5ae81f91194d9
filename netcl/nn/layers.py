"""The layer library: each layer's forward and backward side by side, and Sequential.

Layers keep PyTorch's argument and state_dict names, except Linear's weight, which is stored
(in_features, out_features) so that y = x @ W + b. Forward saves what backward needs;
backward returns dx and accumulates parameter gradients into `p.grad`. Parameters may live on
the host (no device needed to build, load or export a model) and move to the input's device
on first use.
"""
import math

import numpy as np

from netcl.act import Act
from netcl.tensor import Tensor, _as_float32

_rng = np.random.default_rng()


def manual_seed(seed):
    """Seed parameter initialisation and dropout masks."""
    global _rng
    _rng = np.random.default_rng(seed)


def _uniform(bound, shape):
    """U(-bound, bound) drawn directly in float32 (no float64 temporary for large layers)."""
    a = _rng.random(shape, dtype=np.float32)
    a *= 2 * bound
    a -= bound
    return Tensor.from_host(None, a)


def _int(name, v):
    if isinstance(v, (tuple, list)):
        if len(v) == 2 and v[0] == v[1]:
            v = v[0]
        else:
            raise ValueError(f"{name} must be an int (square, symmetric), got {v!r}")
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    return int(v)


def _positive(name, v):
    v = _int(name, v)
    if v < 1:
        raise ValueError(f"{name} must be >= 1, got {v}")
    return v


class Module:
    """Base class. Subclasses set `_params`/`_buffers` (name -> Tensor, in state_dict order)."""

    def __init__(self):
        self.training = True
        self._params = {}
        self._buffers = {}

    # -- structure -----------------------------------------------------------------------
    def named_parameters(self):
        return list(self._params.items())

    def named_buffers(self):
        return list(self._buffers.items())

    def parameters(self):
        return [p for _, p in self.named_parameters()]

    def state_dict(self):
        return {k: t.to_host() for k, t in self.named_parameters() + self.named_buffers()}

    def zero_grad(self):
        """Drop every parameter's gradient (the next backward starts afresh), as torch.nn.Module."""
        for p in self.parameters():
            p.grad = None

    def config(self):
        """The constructor's keyword arguments (how .netcl files record the architecture)."""
        return {}

    def extra_repr(self):
        return ", ".join(f"{k}={v!r}" for k, v in self.config().items())

    def __repr__(self):
        return f"{type(self).__name__}({self.extra_repr()})"

    # -- modes ---------------------------------------------------------------------------
    def train(self, mode=True):
        self.training = bool(mode)
        return self

    def eval(self):
        return self.train(False)

    # -- computation ---------------------------------------------------------------------
    def output_shape(self, shape):
        """The output shape for an input of `shape` (no device needed); ValueError if it does not fit."""
        return tuple(shape)

    def __call__(self, x):
        return self.forward(x)

    def forward(self, x):
        raise NotImplementedError(type(self).__name__)

    def backward(self, dy):
        raise NotImplementedError(type(self).__name__)

    def _on(self, x):
        """The queue of input `x` (uploading a host tensor to the default queue), parameters moved there."""
        if not isinstance(x, Tensor):
            raise TypeError(f"{type(self).__name__} expects a netcl Tensor, got {type(x).__name__}")
        if x.queue is None:
            from netcl.runtime import default_queue

            x.to(default_queue())
        for _, t in self.named_parameters() + self.named_buffers():
            if t.queue is None or t.queue.context != x.queue.context:
                t.to(x.queue)
        return x.queue


def _check_rank(layer, shape, rank, what):
    if len(shape) != rank:
        raise ValueError(f"{layer} expects a {rank}-D input {what}, got shape {tuple(shape)}")


# ---------------------------------------------------------------------------------------
class Linear(Module):
    # x: (..., in) -> (..., out);  y = x @ W + b with W (in, out)
    def __init__(self, in_features, out_features, bias=True):
        super().__init__()
        self.in_features = _positive("in_features", in_features)
        self.out_features = _positive("out_features", out_features)
        bound = 1.0 / math.sqrt(self.in_features)
        self.weight = _uniform(bound, (self.in_features, self.out_features))
        self.bias = _uniform(bound, (self.out_features,)) if bias else None
        self._params = {"weight": self.weight, **({"bias": self.bias} if bias else {})}

    def config(self):
        return {"in_features": self.in_features, "out_features": self.out_features, "bias": self.bias is not None}

    def output_shape(self, shape):
        if len(shape) < 2 or shape[-1] != self.in_features:
            raise ValueError(f"Linear({self.in_features}, {self.out_features}) expects input (N, ..., "
                             f"{self.in_features}), got {tuple(shape)}")
        return tuple(shape[:-1]) + (self.out_features,)

    def forward(self, x):
        from netcl import ops

        self._on(x)
        out_shape = self.output_shape(x.shape)
        x2 = x.reshape(-1, self.in_features)
        y = ops.matmul(x2, self.weight, bias=self.bias, bias_mode=1 if self.bias is not None else 0)
        self._x2 = x2
        return y.reshape(out_shape)

    def backward(self, dy):
        from netcl import ops

        dy2, x2 = dy.reshape(-1, self.out_features), self._x2
        gw, acc = ops.grad_target(self.weight)
        ops.matmul(x2, dy2, trans_a=True, out=gw, beta=float(acc))
        if self.bias is not None:
            gb, acc = ops.grad_target(self.bias)
            ops.sum_axis(dy2, dy2.shape[0], self.out_features, self.out_features, 1, gb, accumulate=acc)
        dx = ops.matmul(dy2, self.weight, trans_b=True)
        return dx.reshape(dy.shape[:-1] + (self.in_features,))


def _conv_out(size, k, s, p):
    return (size + 2 * p - k) // s + 1


class Conv2d(Module):
    # x: (N, C, H, W) -> (N, K, H', W'); im2col + GEMM for training
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, bias=True):
        super().__init__()
        self.in_channels = _positive("in_channels", in_channels)
        self.out_channels = _positive("out_channels", out_channels)
        self.kernel_size = _positive("kernel_size", kernel_size)
        self.stride = _positive("stride", stride)
        self.padding = _int("padding", padding)
        if self.padding < 0:
            raise ValueError(f"padding must be >= 0, got {self.padding}")
        k = self.kernel_size
        bound = 1.0 / math.sqrt(self.in_channels * k * k)
        self.weight = _uniform(bound, (self.out_channels, self.in_channels, k, k))
        self.bias = _uniform(bound, (self.out_channels,)) if bias else None
        self._params = {"weight": self.weight, **({"bias": self.bias} if bias else {})}

    def config(self):
        return {"in_channels": self.in_channels, "out_channels": self.out_channels,
                "kernel_size": self.kernel_size, "stride": self.stride, "padding": self.padding,
                "bias": self.bias is not None}

    def output_shape(self, shape):
        _check_rank("Conv2d", shape, 4, "(N, C, H, W)")
        n, c, h, w = shape
        if c != self.in_channels:
            raise ValueError(f"Conv2d expects {self.in_channels} input channels, got shape {tuple(shape)}")
        oh, ow = (_conv_out(v, self.kernel_size, self.stride, self.padding) for v in (h, w))
        if oh < 1 or ow < 1:
            raise ValueError(f"Conv2d kernel {self.kernel_size} (padding {self.padding}) does not fit input "
                             f"{h}x{w}")
        return (n, self.out_channels, oh, ow)

    def forward(self, x):
        from netcl import ops

        q = self._on(x)
        _, oc, oh, ow = self.output_shape(x.shape)  # checks the rank first
        n, c, h, w = x.shape
        k, s, p = self.kernel_size, self.stride, self.padding
        P, ckk = oh * ow, c * k * k
        cols = ops.new(q, (ckk, n * P))
        ops.launch(q, "conv", "im2col", (n * oh, ckk), (8, 1), n, c, h, w, k, s, p, oh, ow, x, cols)
        y = ops.new(q, (n, oc, oh, ow))
        ops.gemm(oc, P, ckk, self.weight, (ckk, 1, 0), cols, (n * P, 1, P), y, (P, 1, oc * P),
                 bias=self.bias, bias_mode=2 if self.bias is not None else 0, batch=n)
        self._saved = (x.shape, cols)
        return y

    def backward(self, dy):
        from netcl import ops

        (n, c, h, w), cols = self._saved
        _, oc, oh, ow = dy.shape
        k, s, p = self.kernel_size, self.stride, self.padding
        q, P, ckk = dy.queue, oh * ow, c * k * k
        NP = n * P
        dyp = ops.permute3(dy, (n, oc, P), (oc * P, P, 1), ops.new(q, (oc, NP)), (P, NP, 1))
        gw, acc = ops.grad_target(self.weight)
        ops.gemm(oc, ckk, NP, dyp, (NP, 1, 0), cols, (1, NP, 0), gw, (ckk, 1, 0), beta=float(acc))
        if self.bias is not None:
            gb, acc = ops.grad_target(self.bias)
            ops.sum_axis(dyp, NP, oc, 1, NP, gb, accumulate=acc)
        dcols = ops.gemm(ckk, NP, oc, self.weight, (1, ckk, 0), dyp, (NP, 1, 0), ops.new(q, (ckk, NP)),
                         (NP, 1, 0))
        dx = ops.new(q, (n, c, h, w))
        ops.launch(q, "conv", "col2im", (n * c * h,), (8,), n, c, h, w, k, s, p, oh, ow, dcols, dx)
        return dx.mark_written()


class BatchNorm2d(Module):
    # x: (N, C, H, W) -> same; batch statistics in training, running statistics in eval
    def __init__(self, num_features, eps=1e-5, momentum=0.1):
        super().__init__()
        self.num_features = _positive("num_features", num_features)
        self.eps, self.momentum = float(eps), float(momentum)
        if not (0.0 < self.eps < math.inf and 0.0 <= self.momentum <= 1.0):
            raise ValueError(f"BatchNorm2d needs eps > 0 (finite) and momentum in [0, 1], got eps={eps}, "
                             f"momentum={momentum}")
        c = self.num_features
        self.weight = Tensor.from_host(None, np.ones(c, np.float32))
        self.bias = Tensor.from_host(None, np.zeros(c, np.float32))
        self.running_mean = Tensor.from_host(None, np.zeros(c, np.float32))
        self.running_var = Tensor.from_host(None, np.ones(c, np.float32))
        self._params = {"weight": self.weight, "bias": self.bias}
        self._buffers = {"running_mean": self.running_mean, "running_var": self.running_var}

    def config(self):
        return {"num_features": self.num_features, "eps": self.eps, "momentum": self.momentum}

    def output_shape(self, shape):
        _check_rank("BatchNorm2d", shape, 4, "(N, C, H, W)")
        if shape[1] != self.num_features:
            raise ValueError(f"BatchNorm2d expects {self.num_features} channels, got shape {tuple(shape)}")
        return tuple(shape)

    def forward(self, x):
        from netcl import ops

        q = self._on(x)
        self.output_shape(x.shape)
        n, c, h, w = x.shape
        if self.training and n * h * w < 2:
            raise ValueError(f"BatchNorm2d in training needs more than one value per channel, got input {x.shape}")
        if self.training:
            mean, var = ops.new(q, (c,)), ops.new(q, (c,))
            ops.launch(q, "norm", "bn_stats", (c * 64,), (64,), n, c, h * w, x, mean, var, self.running_mean,
                       self.running_var, self.momentum)
            self.running_mean.mark_written()
            self.running_var.mark_written()
        else:
            mean, var = self.running_mean, self.running_var
        y = ops.new(q, x.shape)
        ops.launch1d(q, "norm", "bn_apply", x.size, n, c, h * w, x, mean, var, self.weight, self.bias, self.eps, y)
        self._saved = (x, mean, var, self.training)
        return y.mark_written()

    def backward(self, dy):
        from netcl import ops

        x, mean, var, training = self._saved  # eval mode (frozen statistics) differentiates as torch does
        n, c, h, w = x.shape
        dx = ops.new(dy, dy.shape)
        gw, acc_w = ops.grad_target(self.weight)
        gb, acc_b = ops.grad_target(self.bias)
        assert acc_w == acc_b
        ops.launch(dy.queue, "norm", "bn_bwd", (c * 64,), (64,), n, c, h * w, x, dy, mean, var, self.weight,
                   self.eps, dx, gw, gb, int(acc_w), int(training))
        gw.mark_written()
        gb.mark_written()
        return dx.mark_written()


class _Activation(Module):
    act = Act.NONE  # the code shared with every kernel family (netcl/act.py, kernels/act.h)
    slope = 0.0

    def forward(self, x):
        from netcl import ops

        self._on(x)
        y = ops.act_fwd(self.act, x, self.slope)
        self._saved = y if self.act.saves_output else x
        return y

    def backward(self, dy):
        from netcl import ops

        return ops.act_bwd(self.act, self._saved, dy, self.slope)


class ReLU(_Activation):
    act = Act.RELU


class LeakyReLU(_Activation):
    act = Act.LEAKY_RELU

    def __init__(self, negative_slope=0.01):
        super().__init__()
        self.negative_slope = self.slope = float(negative_slope)
        if not math.isfinite(self.slope):
            raise ValueError(f"negative_slope must be finite, got {negative_slope}")

    def config(self):
        return {"negative_slope": self.negative_slope}


class Sigmoid(_Activation):
    act = Act.SIGMOID


class Tanh(_Activation):
    act = Act.TANH


class _Pool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0):
        super().__init__()
        self.kernel_size = _positive("kernel_size", kernel_size)
        self.stride = self.kernel_size if stride is None else _positive("stride", stride)
        self.padding = _int("padding", padding)
        if not 0 <= self.padding <= self.kernel_size // 2:
            raise ValueError(f"padding must be between 0 and kernel_size // 2 = {self.kernel_size // 2}, "
                             f"got {self.padding}")

    def config(self):
        return {"kernel_size": self.kernel_size, "stride": self.stride, "padding": self.padding}

    def output_shape(self, shape):
        _check_rank(type(self).__name__, shape, 4, "(N, C, H, W)")
        n, c, h, w = shape
        oh, ow = (_conv_out(v, self.kernel_size, self.stride, self.padding) for v in (h, w))
        if oh < 1 or ow < 1:
            raise ValueError(f"{type(self).__name__} kernel {self.kernel_size} does not fit input {h}x{w}")
        return (n, c, oh, ow)

    def _geometry(self, shape):
        _, _, oh, ow = self.output_shape(shape)  # checks the rank first
        n, c, h, w = shape
        return n * c, h, w, self.kernel_size, self.stride, self.padding, oh, ow


class MaxPool2d(_Pool2d):
    # x: (N, C, H, W) -> (N, C, H', W'); padded positions never win
    def forward(self, x):
        from netcl import ops
        from netcl.runtime import alloc

        q = self._on(x)
        g = self._geometry(x.shape)
        y = ops.new(q, self.output_shape(x.shape))
        arg = alloc(q, 4 * y.size)
        ops.launch1d(q, "pool", "maxpool_fwd", y.size, *g, x, y, arg)
        self._saved = (x.shape, g, arg)
        return y.mark_written()

    def backward(self, dy):
        from netcl import ops

        shape, g, arg = self._saved
        dx = ops.new(dy, shape)
        ops.launch1d(dy.queue, "pool", "maxpool_bwd", dx.size, *g, dy, arg, dx)
        return dx.mark_written()


class AvgPool2d(_Pool2d):
    # x: (N, C, H, W) -> (N, C, H', W'); padding counts as zeros (count_include_pad=True)
    def forward(self, x):
        from netcl import ops

        q = self._on(x)
        g = self._geometry(x.shape)
        y = ops.new(q, self.output_shape(x.shape))
        ops.launch1d(q, "pool", "avgpool_fwd", y.size, *g, x, y)
        self._saved = (x.shape, g)
        return y.mark_written()

    def backward(self, dy):
        from netcl import ops

        shape, g = self._saved
        dx = ops.new(dy, shape)
        ops.launch1d(dy.queue, "pool", "avgpool_bwd", dx.size, *g, dy, dx)
        return dx.mark_written()


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
        if not 0.0 <= float(p) <= 1.0:
            raise ValueError(f"Dropout probability must be between 0 and 1, got {p}")
        self.p = float(p)

    def config(self):
        return {"p": self.p}

    def forward(self, x):
        from netcl import ops

        q = self._on(x)
        if not self.training or self.p == 0.0:
            self._mask = None
            return x
        self._mask, y = ops.new(q, x.shape), ops.new(q, x.shape)
        seed = int(_rng.integers(0, 2**32))
        ops.launch1d(q, "pointwise", "dropout_fwd", x.size, x.size, np.uint32(seed), self.p, x, self._mask, y)
        self._mask.mark_written()
        return y.mark_written()

    def backward(self, dy):
        from netcl import ops

        return dy if self._mask is None else ops.mul(dy, self._mask)


class Softmax(Module):
    # x: any shape -> same, normalised along `dim`
    def __init__(self, dim=1):
        super().__init__()
        self.dim = _int("dim", dim)

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
        from netcl import ops

        q = self._on(x)
        outer, D, inner = self._split(x.shape)
        y = ops.new(q, x.shape)
        ops.launch1d(q, "norm", "softmax_fwd", outer * inner, outer, D, inner, x, y)
        self._y = y
        return y.mark_written()

    def backward(self, dy):
        from netcl import ops

        outer, D, inner = self._split(dy.shape)
        dx = ops.new(dy, dy.shape)
        ops.launch1d(dy.queue, "norm", "softmax_bwd", outer * inner, outer, D, inner, self._y, dy, dx, 1.0)
        return dx.mark_written()


class MultiheadAttention(Module):
    # x: (N, L, E) -> (N, L, E); self-attention, PyTorch's parameter names and (out, in) layouts
    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.embed_dim = _positive("embed_dim", embed_dim)
        self.num_heads = _positive("num_heads", num_heads)
        if self.embed_dim % self.num_heads:
            raise ValueError(f"embed_dim ({self.embed_dim}) must be divisible by num_heads ({self.num_heads})")
        e = self.embed_dim
        bound = math.sqrt(6.0 / (e + 3 * e))  # xavier_uniform over the (3E, E) in-projection, as PyTorch
        self.in_proj_weight = Tensor.from_host(None, _rng.uniform(-bound, bound, (3 * e, e)).astype(np.float32))
        self.in_proj_bias = Tensor.from_host(None, np.zeros(3 * e, np.float32))
        self.out_proj_weight = _uniform(1.0 / math.sqrt(e), (e, e))
        self.out_proj_bias = Tensor.from_host(None, np.zeros(e, np.float32))
        self._params = {"in_proj_weight": self.in_proj_weight, "in_proj_bias": self.in_proj_bias,
                        "out_proj.weight": self.out_proj_weight, "out_proj.bias": self.out_proj_bias}

    def config(self):
        return {"embed_dim": self.embed_dim, "num_heads": self.num_heads}

    def output_shape(self, shape):
        if len(shape) != 3 or shape[2] != self.embed_dim:
            raise ValueError(f"MultiheadAttention expects input (N, L, {self.embed_dim}), got {tuple(shape)}")
        return tuple(shape)

    def _heads(self, src, rw, off, n, L):
        from netcl import ops

        h, d = self.num_heads, self.embed_dim // self.num_heads
        out = ops.new(src, (n * h, L, d))
        ops.launch1d(src.queue, "attention", "split_heads", out.size, n, L, h, d, src, rw, off, out)
        return out.mark_written()

    def _merge(self, src, dst, rw, off, n, L):
        from netcl import ops

        h, d = self.num_heads, self.embed_dim // self.num_heads
        ops.launch1d(src.queue, "attention", "merge_heads", src.size, n, L, h, d, src, rw, off, dst)
        return dst.mark_written()

    def forward(self, x):
        from netcl import ops

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
        ops.launch1d(q, "norm", "softmax_fwd", n * h * L, n * h * L, L, 1, S, P)
        P.mark_written()
        O = ops.gemm(L, d, L, P, (L, 1, L * L), V, (d, 1, L * d), ops.new(q, (n * h, L, d)), (d, 1, L * d),
                     batch=n * h)
        Ocat = self._merge(O, ops.new(q, (n * L, e)), e, 0, n, L)
        y = ops.matmul(Ocat, self.out_proj_weight, trans_b=True, bias=self.out_proj_bias, bias_mode=1)
        self._saved = (x2, Q, K, V, P, Ocat, (n, L))
        return y.reshape(n, L, e)

    def backward(self, dy):
        from netcl import ops

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
        ops.launch1d(q, "norm", "softmax_bwd", B * L, B * L, L, 1, P, dP, dS, 1.0 / math.sqrt(d))
        dS.mark_written()
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


# ---------------------------------------------------------------------------------------
class Sequential(Module):
    """Layers applied in order. The layer list is the single source of truth: training,
    saving and export walk it; the fused inference path (eval mode) is derived from it."""

    def __init__(self, *layers):
        super().__init__()
        if len(layers) == 1 and isinstance(layers[0], (list, tuple)):
            layers = tuple(layers[0])
        for i, layer in enumerate(layers):
            if not isinstance(layer, Module):
                raise TypeError(f"Sequential takes netcl.nn layers; argument {i} is {type(layer).__name__}")
        self.layers = list(layers)
        self._fused = None
        self._fused_input = None  # the input of a fused forward, which saves nothing for backward

    def __getitem__(self, i):
        if not isinstance(i, slice):
            return self.layers[i]
        part = Sequential(*self.layers[i])  # shares the layers; keeps this model's mode
        return part.train(self.training)

    def __len__(self):
        return len(self.layers)

    def __iter__(self):
        return iter(self.layers)

    def __repr__(self):
        body = "".join(f"\n  ({i}): {layer!r}" for i, layer in enumerate(self.layers))
        return f"Sequential({body}\n)"

    def named_parameters(self):
        return [(f"{i}.{k}", t) for i, layer in enumerate(self.layers) for k, t in layer.named_parameters()]

    def named_buffers(self):
        return [(f"{i}.{k}", t) for i, layer in enumerate(self.layers) for k, t in layer.named_buffers()]

    def state_dict(self):
        # torch's order: each layer's parameters, then its buffers
        return {f"{i}.{k}": a for i, layer in enumerate(self.layers) for k, a in layer.state_dict().items()}

    def load_state_dict(self, state):
        """Copy arrays into the parameters and buffers; every key must match, with its shape."""
        own = dict(self.named_parameters() + self.named_buffers())
        missing = [k for k in own if k not in state]
        # PyTorch's BatchNorm counter has no netcl counterpart: torch state dicts load as they are
        unexpected = [k for k in state if k not in own and not k.endswith(".num_batches_tracked")]
        if missing or unexpected:
            raise ValueError(f"state_dict keys do not match the model: missing {missing}, unexpected {unexpected}")
        arrays = {}
        for k, t in own.items():  # check and convert everything before changing anything
            try:
                arrays[k] = _as_float32(state[k])
            except TypeError as e:
                raise TypeError(f"state_dict[{k!r}]: {e}") from None
            if arrays[k].shape != t.shape:
                raise ValueError(f"state_dict[{k!r}] has shape {arrays[k].shape}, the model expects {t.shape}")
        for k, t in own.items():
            t.set_(arrays[k])
        return self

    def train(self, mode=True):
        super().train(mode)
        for layer in self.layers:
            layer.train(mode)
        self._fused = None
        if not mode:
            self._try_fuse_layers()
        return self

    def _try_fuse_layers(self):
        """Prepare the fused inference path (netcl.jit) from the layer list; None when nothing fuses.
        The plan holds no device state until its first call, so eval() needs no OpenCL."""
        from netcl.jit import plan_fused

        self._fused = plan_fused(self)

    def to(self, queue):
        """Move every parameter and buffer to `queue`'s device; returns the model."""
        for _, t in self.named_parameters() + self.named_buffers():
            t.to(queue)
        return self

    def output_shape(self, shape):
        for layer in self.layers:
            shape = layer.output_shape(shape)
        return tuple(shape)

    def forward(self, x):
        if not isinstance(x, Tensor):
            raise TypeError(f"Sequential expects a netcl Tensor, got {type(x).__name__}; "
                            "use Tensor.from_host(queue, array)")
        if not self.training and self._fused is not None:
            self._fused_input = x
            y = self._fused(x)
        else:
            self._fused_input = None
            y = x
            for layer in self.layers:
                y = layer(y)
        self._out_shape = y.shape
        return y

    def predict(self, x, queue=None):
        """Inference on a host array: numpy in, numpy out (eval mode uses the fused path's
        pinned-memory round trip). `queue` defaults to netcl.default_queue()."""
        if self.training:
            raise RuntimeError("predict() runs inference: call model.eval() first")
        if self._fused is not None:
            return self._fused.infer(x, queue)
        from netcl.runtime import default_queue

        return self.forward(Tensor.from_host(queue or default_queue(), x)).to_host()

    def backward(self, dy):
        """Back-propagate dL/d(output) through every layer; returns dL/d(input)."""
        if not isinstance(dy, Tensor):
            raise TypeError(f"backward expects the output gradient as a netcl Tensor, got {type(dy).__name__}")
        if getattr(self, "_out_shape", None) is None:
            raise RuntimeError("backward() needs a forward pass first")
        if dy.shape != self._out_shape:
            raise ValueError(f"backward expects a gradient of the last output's shape {self._out_shape}, "
                             f"got {dy.shape}")
        x, self._fused_input = self._fused_input, None
        if x is not None:  # after a fused (eval) forward: replay the layers so they save what backward needs
            for layer in self.layers:
                x = layer(x)
        for layer in reversed(self.layers):
            dy = layer.backward(dy)
        return dy


LAYERS = {cls.__name__: cls for cls in (Linear, Conv2d, BatchNorm2d, ReLU, LeakyReLU, Sigmoid, Tanh, MaxPool2d,
                                        AvgPool2d, Flatten, Dropout, Softmax, MultiheadAttention)}
