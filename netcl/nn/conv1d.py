"""Conv1d: PyTorch's 1-D convolution on (N, C, L) (kernels/conv1d.cl). Two routes: depthwise convs
run direct kernels, a work-item per output element (forward, data and weight gradients); the rest
run the column route of netcl.nn.conv_cols as a Conv2d of height 1 (im2col into (C*k, N*L')
columns, ops.gemm per group, the data gradient gathered back by col2im: no atomics, deterministic)."""
import math

from netcl import ops
from netcl.nn import conv_cols
from netcl.nn.conv import Conv2d, _check_groups
from netcl.nn.module import MAX_INT, MAX_PADDING, Module, as_bool, as_int, check_rank, positive, uniform


def _one(name, v, low=1):
    """An int, or a 1-tuple of one (PyTorch's _single), as an int of at least `low`."""
    if isinstance(v, (tuple, list)):
        if len(v) != 1:
            raise ValueError(f"{name} must be an int or a 1-tuple, got {v!r}")
        v = v[0]
    return as_int(name, v, low, MAX_PADDING if name == "padding" else MAX_INT)


class Conv1d(Module):
    """Conv1d(in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1, bias=True):
    (N, C, L) -> (N, K, L'), weight (K, C/groups, kernel_size), PyTorch's semantics; padding an int or
    "same" (stride 1; an odd total puts the extra column on the right, as PyTorch) or "valid"."""

    STR_ARGS = ("padding",)  # "same" (files hold it; the constructor checks the string)

    # x: (N, C, L) -> (N, K, L'); weight (K, C/groups, k)
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                 bias=True):
        super().__init__()
        self.in_channels = positive("in_channels", in_channels)
        self.out_channels = positive("out_channels", out_channels)
        self.kernel_size = _one("kernel_size", kernel_size)
        self.stride = _one("stride", stride)
        self.dilation = _one("dilation", dilation)
        if padding == "valid":
            padding = 0
        if isinstance(padding, str):
            if padding != "same":
                raise ValueError(f"padding must be an int, 'same' or 'valid', got {padding!r}")
            if self.stride != 1:
                raise ValueError("padding='same' needs stride 1 (as PyTorch)")
        else:
            padding = _one("padding", padding, 0)
        self.padding = padding
        self.groups = _check_groups(self.in_channels, self.out_channels, groups)
        bias = as_bool("bias", bias)
        shapes = self.tensor_shapes(self.in_channels, self.out_channels, self.kernel_size, groups=self.groups,
                                    bias=bias)
        bound = 1.0 / math.sqrt(self.in_channels // self.groups * self.kernel_size)  # PyTorch's default init
        self.weight = uniform(bound, shapes["weight"])
        self.bias = uniform(bound, shapes["bias"]) if bias else None
        self._params = {"weight": self.weight, **({"bias": self.bias} if bias else {})}

    @classmethod
    def tensor_shapes(cls, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                      bias=True):
        g = _check_groups(in_channels, out_channels, groups)
        return {"weight": (out_channels, in_channels // g, kernel_size), **({"bias": (out_channels,)} if bias else {})}

    # Conv2d's constructor arguments, in its order; repr() names dilation and groups only when set
    config, extra_repr = Conv2d.config, Conv2d.extra_repr

    def pads(self):
        """(left, right) zero padding: padding="same" splits d*(k-1) with the extra column on the right."""
        if self.padding == "same":
            total = self.dilation * (self.kernel_size - 1)
            return total // 2, total - total // 2
        return self.padding, self.padding

    def output_shape(self, shape):
        check_rank("Conv1d", shape, 3, "(N, C, L)")
        n, c, length = shape
        if c != self.in_channels:
            raise ValueError(f"Conv1d expects {self.in_channels} input channels, got shape {tuple(shape)}")
        left, right = self.pads()
        span = self.dilation * (self.kernel_size - 1) + 1
        out = (length + left + right - span) // self.stride + 1
        if out < 1:
            raise ValueError(f"Conv1d kernel {self.kernel_size} (dilation {self.dilation}, padding {self.padding}) "
                             f"does not fit input length {length}")
        return (n, self.out_channels, out)

    def macs(self, shape):
        """Multiply-accumulates of one forward on `shape`: every output's (C/groups) * k products."""
        n, k, out = self.output_shape(shape)
        return n * k * out * (self.in_channels // self.groups) * self.kernel_size

    def _geometry(self, shape):
        n, k, out = self.output_shape(shape)
        return (n, self.in_channels, shape[2], k, out, self.kernel_size, self.stride, self.pads()[0], self.dilation,
                self.groups)

    def _direct(self):
        """Whether this conv runs conv1d.cl's direct kernels (depthwise: a few products per output, where
        they beat columns and a GEMM) rather than im2col + ops.gemm per group + col2im (the rest)."""
        return self.groups > 1 and self.groups == self.in_channels

    def forward(self, x):
        q = self._on(x)
        g = self._geometry(x.shape)
        if self._direct():
            y = ops.new(q, self.output_shape(x.shape))
            b = self.bias if self.bias is not None else ops.dummy(q)
            ops.launch1d(q, "conv1d", "conv1d_fwd", y.size, *g, int(self.bias is not None), x, self.weight, b, y)
            self._saved = (x, g, None)
            return y.mark_written()
        y, cols = conv_cols.forward(q, x, self.weight, self.bias, self._cols(g), self.output_shape(x.shape))
        self._saved = (x, g, cols)
        return y

    @staticmethod
    def _cols(g):
        """The column route's geometry (conv_cols): this conv as a Conv2d of height 1."""
        n, c, length, k, out, ks, s, pad, d, groups = g
        return conv_cols.Cols(n, c, 1, length, k, 1, out, 1, ks, 1, s, 0, pad, 1, d, groups)

    def backward(self, dy):
        x, g, cols = self._saved
        q = dy.queue
        if cols is None:
            dx = ops.new(dy, x.shape)
            self._param_grads(dy, None)
            ops.launch1d(q, "conv1d", "conv1d_bwd_data", dx.size, *g, dy, self.weight, dx)
            return dx.mark_written()
        rows = self._rows(dy)
        self._param_grads(dy, rows)
        return conv_cols.data_grad(q, rows, self.weight, self._cols(g), x.shape)

    def backward_params(self, dy):
        """The weight's and bias's gradients (added to .grad where they hold one); returns None."""
        self._param_grads(dy, None if self._saved[2] is None else self._rows(dy))

    def _rows(self, dy):
        """dy (N, K, L') as the GEMM route's (K, N*L') rows."""
        return conv_cols.rows_of(dy, self._cols(self._saved[1]))

    def _param_grads(self, dy, rows):
        x, g, cols = self._saved
        q = dy.queue
        n, k, out = g[0], g[3], g[4]
        if cols is None:
            gw, acc = ops.grad_target(self.weight)
            ops.launch1d(q, "conv1d", "conv1d_bwd_weight", gw.size, *g, x, dy, gw, int(acc))
            gw.mark_written()
        else:  # dW_g (K/G, C/G*k) (+)= dY_g (K/G, N*L') @ cols_g^T
            conv_cols.weight_grad(rows, cols, self.weight, self._cols(g))
        if self.bias is not None:
            gb, acc = ops.grad_target(self.bias)
            ops.launch1d(q, "conv1d", "conv1d_bwd_bias", k, n, k, out, dy, gb, int(acc))
            gb.mark_written()


class ConvTranspose1d(Module):
    """ConvTranspose1d(in_channels, out_channels, kernel_size, stride=1, padding=0, output_padding=0, groups=1, bias=True, dilation=1):
    (N, C, L) -> (N, K, (L-1)*stride - 2*padding + dilation*(kernel_size-1) + output_padding + 1), weight
    (C, K/groups, kernel_size), PyTorch's semantics: the data gradient of a Conv1d(K -> C) as a layer
    (netcl.nn.conv_cols' transposed route: the GEMM and col2im forward, im2col and the GEMM backward)."""

    # x: (N, C, L) -> (N, K, L'); weight (C, K/groups, k)
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, output_padding=0, groups=1,
                 bias=True, dilation=1):
        super().__init__()
        self.in_channels = positive("in_channels", in_channels)
        self.out_channels = positive("out_channels", out_channels)
        self.kernel_size = _one("kernel_size", kernel_size)
        self.stride = _one("stride", stride)
        self.padding = _one("padding", padding, 0)
        self.output_padding = _one("output_padding", output_padding, 0)
        self.groups = _check_groups(self.in_channels, self.out_channels, groups)
        self.dilation = _one("dilation", dilation)
        if self.output_padding >= max(self.stride, self.dilation):
            raise ValueError(f"output_padding ({self.output_padding}) must be smaller than either stride "
                             f"({self.stride}) or dilation ({self.dilation}), as PyTorch")
        bias = as_bool("bias", bias)
        shapes = self.tensor_shapes(self.in_channels, self.out_channels, self.kernel_size, groups=self.groups,
                                    bias=bias)
        bound = 1.0 / math.sqrt(self.out_channels // self.groups * self.kernel_size)  # PyTorch's fan-in of weight
        self.weight = uniform(bound, shapes["weight"])
        self.bias = uniform(bound, shapes["bias"]) if bias else None
        self._params = {"weight": self.weight, **({"bias": self.bias} if bias else {})}

    @classmethod
    def tensor_shapes(cls, in_channels, out_channels, kernel_size, stride=1, padding=0, output_padding=0, groups=1,
                      bias=True, dilation=1):
        g = _check_groups(in_channels, out_channels, groups)
        return {"weight": (in_channels, out_channels // g, kernel_size), **({"bias": (out_channels,)} if bias else {})}

    def config(self):
        return {"in_channels": self.in_channels, "out_channels": self.out_channels,
                "kernel_size": self.kernel_size, "stride": self.stride, "padding": self.padding,
                "output_padding": self.output_padding, "groups": self.groups, "bias": self.bias is not None,
                "dilation": self.dilation}

    def extra_repr(self):
        """The constructor's arguments as they read in repr() (output_padding, groups and dilation only when set)."""
        return ", ".join(f"{k}={v!r}" for k, v in self.config().items()
                         if not (k in ("output_padding", "groups", "dilation") and v == (0 if k == "output_padding"
                                                                                          else 1)))

    def output_shape(self, shape):
        check_rank("ConvTranspose1d", shape, 3, "(N, C, L)")
        n, c, length = shape
        if c != self.in_channels:
            raise ValueError(f"ConvTranspose1d expects {self.in_channels} input channels, got shape {tuple(shape)}")
        out = ((length - 1) * self.stride - 2 * self.padding + self.dilation * (self.kernel_size - 1)
               + self.output_padding + 1)
        if out < 1:
            raise ValueError(f"ConvTranspose1d with padding {self.padding} leaves no output for input length {length}")
        return (n, self.out_channels, out)

    def macs(self, shape):
        """Multiply-accumulates of one forward on `shape`: every input meets K/groups * k weights."""
        self.output_shape(shape)
        return shape[0] * shape[1] * shape[2] * self.out_channels // self.groups * self.kernel_size

    def _cols(self, shape):
        """The transposed column route's geometry at input `shape` (height 1)."""
        n, c, length = shape
        return conv_cols.transposed((n, c, 1, length), (n, self.out_channels, 1, self.output_shape(shape)[2]),
                                    (1, self.kernel_size), (1, self.stride), (0, self.padding), (1, self.dilation),
                                    self.groups)

    def forward(self, x):
        q = self._on(x)
        g = self._cols(x.shape)
        y, rows = conv_cols.transposed_forward(q, x, self.weight, self.bias, g, self.output_shape(x.shape))
        self._saved = (x.shape, g, rows)
        return y

    def backward(self, dy):
        shape, g, rows = self._saved
        dx = conv_cols.transposed_backward(dy.queue, dy, rows, self.weight, g, shape)
        if self.bias is not None:
            n, k, out = dy.shape
            gb, acc = ops.grad_target(self.bias)
            ops.launch1d(dy.queue, "conv1d", "conv1d_bwd_bias", k, n, k, out, dy, gb, int(acc))
            gb.mark_written()
        return dx
