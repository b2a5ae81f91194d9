"""Conv2d: square kernels, symmetric padding; trains as im2col + GEMM (kernels/conv.cl, gemm.cl)."""
import math

from netcl import ops
from netcl.nn.module import MAX_PADDING, Module, as_bool, as_int, check_rank, conv_out, positive, uniform


class Conv2d(Module):
    # x: (N, C, H, W) -> (N, K, H', W'); im2col + GEMM for training
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, bias=True):
        super().__init__()
        self.in_channels = positive("in_channels", in_channels)
        self.out_channels = positive("out_channels", out_channels)
        self.kernel_size = positive("kernel_size", kernel_size)
        self.stride = positive("stride", stride)
        self.padding = as_int("padding", padding, 0, MAX_PADDING)
        bias = as_bool("bias", bias)
        shapes = self.tensor_shapes(self.in_channels, self.out_channels, self.kernel_size, bias=bias)
        bound = 1.0 / math.sqrt(self.in_channels * self.kernel_size ** 2)
        self.weight = uniform(bound, shapes["weight"])
        self.bias = uniform(bound, shapes["bias"]) if bias else None
        self._params = {"weight": self.weight, **({"bias": self.bias} if bias else {})}

    @classmethod
    def tensor_shapes(cls, in_channels, out_channels, kernel_size, stride=1, padding=0, bias=True):
        k = kernel_size
        return {"weight": (out_channels, in_channels, k, k), **({"bias": (out_channels,)} if bias else {})}

    def config(self):
        return {"in_channels": self.in_channels, "out_channels": self.out_channels,
                "kernel_size": self.kernel_size, "stride": self.stride, "padding": self.padding,
                "bias": self.bias is not None}

    def output_shape(self, shape):
        check_rank("Conv2d", shape, 4, "(N, C, H, W)")
        n, c, h, w = shape
        if c != self.in_channels:
            raise ValueError(f"Conv2d expects {self.in_channels} input channels, got shape {tuple(shape)}")
        oh, ow = (conv_out(v, self.kernel_size, self.stride, self.padding) for v in (h, w))
        if oh < 1 or ow < 1:
            raise ValueError(f"Conv2d kernel {self.kernel_size} (padding {self.padding}) does not fit input "
                             f"{h}x{w}")
        return (n, self.out_channels, oh, ow)

    def forward(self, x):
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
