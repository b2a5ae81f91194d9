"""MaxPool2d and AvgPool2d (kernel_size, stride and padding each an int or a (height, width) pair;
MaxPool2d's ceil_mode), MaxPool1d and AvgPool1d, and AdaptiveAvgPool2d/1d (kernels/pool.cl)."""
from netcl import ops
from netcl.nn.module import Module, as_int, check_rank, conv_out, int_or_pair, pair, positive
from netcl.runtime import alloc


class _Pool2d(Module):
    PAIR_ARGS = ("kernel_size", "stride", "padding")  # files hold a pair as a list of two

    def __init__(self, kernel_size, stride=None, padding=0):
        super().__init__()
        self.kernel_size = int_or_pair("kernel_size", kernel_size, 1)
        self.stride = self.kernel_size if stride is None else int_or_pair("stride", stride, 1)
        self.padding = int_or_pair("padding", padding, 0)
        for p, k in zip(pair(self.padding), pair(self.kernel_size)):
            as_int("padding", p, 0, k // 2)  # at most half the window, as PyTorch's pools

    @property
    def general(self):
        """Whether the window, stride or padding differ between height and width (no fused pool takes those)."""
        return any(isinstance(v, tuple) for v in (self.kernel_size, self.stride, self.padding))

    def config(self):
        return {"kernel_size": self.kernel_size, "stride": self.stride, "padding": self.padding}

    ceil_mode = False  # (MaxPool2d's option)

    def output_shape(self, shape):
        check_rank(type(self).__name__, shape, 4, "(N, C, H, W)")
        n, c, h, w = shape
        oh, ow = (self._out(v, axis) for v, axis in ((h, 0), (w, 1)))
        if oh < 1 or ow < 1:
            raise ValueError(f"{type(self).__name__} kernel {self.kernel_size} does not fit input {h}x{w}")
        return (n, c, oh, ow)

    def _out(self, size, axis=0):
        """Output length over `size` along `axis` (0: height, 1: width): PyTorch's floor rule, or with
        ceil_mode its ceil rule (a last window that starts inside the input or its left padding)."""
        k, s, p = (pair(v)[axis] for v in (self.kernel_size, self.stride, self.padding))
        if not self.ceil_mode:
            return conv_out(size, k, s, p)
        out = -(-(size + 2 * p - k) // s) + 1
        return out - 1 if (out - 1) * s >= size + p else out

    def _geometry(self, shape):
        _, _, oh, ow = self.output_shape(shape)  # checks the rank first
        n, c, h, w = shape
        (kh, kw), (sh, sw), (ph, pw) = pair(self.kernel_size), pair(self.stride), pair(self.padding)
        return n * c, h, w, kh, kw, sh, sw, ph, pw, oh, ow


def _pool2_rows(q, g):
    """(work-items, output rows per work-item) of pool_cpu.cl's 2x2 kernels, or None where they do
    not apply (not a CPU, or another window than 2x2, stride 2, no padding)."""
    nc, h, w, kh, kw, sh, sw, ph, pw, oh, ow = g
    if ((kh, kw, sh, sw, ph, pw) != (2, 2, 2, 2, 0, 0) or 2 * oh > h or 2 * ow > w  # (ceil_mode's last window
            or not ops.is_cpu(q)):  # past the input: the generic kernel's bounds checks)
        return None
    rows, items = ops.cpu_rows(nc * oh, ow)
    return items, rows


class _CeilMode:
    """A max pool's ceil_mode (PyTorch's ceil rule for the output size) over its pool base."""
    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False):
        super().__init__(kernel_size, stride, padding)
        if not isinstance(ceil_mode, bool):
            raise TypeError(f"ceil_mode must be a bool, got {type(ceil_mode).__name__}")
        self.ceil_mode = ceil_mode

    def config(self):
        return dict(super().config(), **({"ceil_mode": True} if self.ceil_mode else {}))


class MaxPool2d(_CeilMode, _Pool2d):
    # x: (N, C, H, W) -> (N, C, H', W'); padded positions never win
    """MaxPool2d(kernel_size, stride=None, padding=0, ceil_mode=False): (N, C, H, W) window maxima
    (padded positions never win); ceil_mode: PyTorch's ceil rule for the output size, the last
    window reaching past the input."""
    def forward(self, x):
        q = self._on(x)
        g = self._geometry(x.shape)
        y = ops.new(q, self.output_shape(x.shape))
        arg = alloc(q, 4 * y.size)
        rows = _pool2_rows(q, g)
        if rows is not None:  # CPUs, 2x2 windows: pool_cpu.cl's vector kernel
            nc, h, w, oh, ow = g[:3] + g[-2:]
            ops.launch(q, "pool_cpu", "maxpool2_fwd_cpu", rows[:1], (1,), nc * oh, rows[1], h, w, oh, ow, x, y, arg)
        else:
            ops.launch1d(q, "pool", "maxpool_fwd", y.size, *g, x, y, arg)
        self._saved = (x.shape, g, arg)
        return y.mark_written()

    def backward(self, dy):
        shape, g, arg = self._saved
        q = dy.queue
        dx = ops.new(dy, shape)
        rows = _pool2_rows(q, g)
        if rows is not None:
            nc, h, w, oh, ow = g[:3] + g[-2:]
            ops.launch(q, "pool_cpu", "maxpool2_bwd_cpu", rows[:1], (1,), nc * oh, rows[1], h, w, oh, ow, dy, arg, dx)
        else:
            ops.launch1d(q, "pool", "maxpool_bwd", dx.size, *g, dy, arg, dx)
        return dx.mark_written()


class AvgPool2d(_Pool2d):
    # x: (N, C, H, W) -> (N, C, H', W'); padding counts as zeros (count_include_pad=True)
    """AvgPool2d(kernel_size, stride=None, padding=0): (N, C, H, W) window averages (padding counted, as PyTorch's default)."""
    _KERNELS = ("avgpool_fwd", "avgpool_bwd")  # pool.cl's, over _geometry()'s arguments

    def forward(self, x):
        q = self._on(x)
        g = self._geometry(x.shape)
        y = ops.new(q, self.output_shape(x.shape))
        ops.launch1d(q, "pool", self._KERNELS[0], y.size, *g, x, y)
        self._saved = (x.shape, g)
        return y.mark_written()

    def backward(self, dy):
        shape, g = self._saved
        dx = ops.new(dy, shape)
        ops.launch1d(dy.queue, "pool", self._KERNELS[1], dx.size, *g, dy, dx)
        return dx.mark_written()


def _single(name, v):
    """An int or a 1-tuple of one (PyTorch's 1-D pools take both) as the int."""
    if isinstance(v, (tuple, list)):
        if len(v) != 1:
            raise ValueError(f"{name} must be an int or a 1-tuple, got {v!r}")
        v = v[0]
    return v


class _Pool1d(_Pool2d):
    # x: (N, C, L) -> (N, C, L'); pool.cl's 1-D kernels over N*C rows
    PAIR_ARGS = ()
    def __init__(self, kernel_size, stride=None, padding=0):
        stride = None if stride is None else _single("stride", stride)
        super().__init__(_single("kernel_size", kernel_size), stride, _single("padding", padding))

    def output_shape(self, shape):
        check_rank(type(self).__name__, shape, 3, "(N, C, L)")
        n, c, length = shape
        out = self._out(length)
        if out < 1:
            raise ValueError(f"{type(self).__name__} kernel {self.kernel_size} does not fit input length {length}")
        return (n, c, out)

    def _geometry(self, shape):
        n, c, out = self.output_shape(shape)
        return n * c, shape[2], self.kernel_size, self.stride, self.padding, out


class MaxPool1d(_CeilMode, _Pool1d):
    # x: (N, C, L) -> (N, C, L'); padded positions never win, ties go to the first maximum
    """MaxPool1d(kernel_size, stride=None, padding=0, ceil_mode=False): (N, C, L) window maxima as
    torch.nn.MaxPool1d (padded positions never win; the gradient goes to the first maximum);
    ceil_mode: PyTorch's ceil rule for the output length."""
    def forward(self, x):
        q = self._on(x)
        g = self._geometry(x.shape)
        y = ops.new(q, self.output_shape(x.shape))
        arg = alloc(q, 4 * y.size)
        ops.launch1d(q, "pool", "maxpool1d_fwd", y.size, *g, x, y, arg)
        self._saved = (x.shape, g, arg)
        return y.mark_written()

    def backward(self, dy):
        shape, g, arg = self._saved
        dx = ops.new(dy, shape)
        ops.launch1d(dy.queue, "pool", "maxpool1d_bwd", dx.size, *g, dy, arg, dx)
        return dx.mark_written()


class AvgPool1d(_Pool1d):
    # x: (N, C, L) -> (N, C, L'); padding counts as zeros (count_include_pad=True)
    """AvgPool1d(kernel_size, stride=None, padding=0): (N, C, L) window averages as torch.nn.AvgPool1d
    with its defaults (padding counted, ceil_mode False)."""
    _KERNELS = ("avgpool1d_fwd", "avgpool1d_bwd")
    forward, backward = AvgPool2d.forward, AvgPool2d.backward


class _AdaptiveAvgPool(Module):
    # PyTorch's adaptive windows: output i of n averages inputs [floor(i*L/n), ceil((i+1)*L/n))
    rank = 0  # spatial dimensions

    def __init__(self, output_size):
        super().__init__()
        self.output_size = positive("output_size", output_size)  # square only (an int; the window pools take pairs)

    def config(self):
        return {"output_size": self.output_size}

    def output_shape(self, shape):
        what = "(N, C, H, W)" if self.rank == 2 else "(N, C, L)"
        check_rank(type(self).__name__, shape, 2 + self.rank, what)
        return tuple(shape[:2]) + (self.output_size,) * self.rank

    def _geometry(self, shape):
        self.output_shape(shape)
        n, c, *hw = shape
        h, w = hw if self.rank == 2 else (1, hw[0])
        o = self.output_size
        return n * c, h, w, o if self.rank == 2 else 1, o

    def forward(self, x):
        q = self._on(x)
        g = self._geometry(x.shape)
        y = ops.new(q, self.output_shape(x.shape))
        nc, h, w, oh, ow = g
        if oh * ow == 1 and ops.is_cpu(q):  # global average pooling: planes per work-item
            planes, items = ops.cpu_rows(nc, h * w)
            ops.launch(q, "pool_cpu", "global_avgpool_fwd_cpu", (items,), (1,), nc, planes, h * w, x, y)
        else:
            ops.launch1d(q, "pool", "adaptive_avgpool_fwd", y.size, *g, x, y)
        self._saved = (x.shape, g)
        return y.mark_written()

    def backward(self, dy):
        return self.backward_act(dy, None)

    def backward_act(self, dy, act):
        """backward(dy) through the gradient of `act` (an ops.ActGrad: the activation whose output is
        this layer's input, a Residual's that ran in its sum; Sequential's training path): global
        average pooling's pass on a CPU takes it (DX_ACT), else act_bwd_cpu. act None: backward."""
        shape, g = self._saved
        q, dx = dy.queue, ops.new(dy, shape)
        nc, h, w, oh, ow = g
        if oh * ow == 1 and ops.is_cpu(q):  # global average pooling: a broadcast in vectors
            planes, items = ops.cpu_rows(nc, h * w)
            ops.launch(q, "pool_cpu", "global_avgpool_bwd_cpu", (items,), (1,), nc, planes, h * w, dy, dx,
                       *ops.dx_act_args(q, act), options=ops.dx_act_options(act))
            return dx.mark_written()
        ops.launch1d(q, "pool", "adaptive_avgpool_bwd", dx.size, *g, dy, dx)
        dx.mark_written()
        return ops.through_act(dx, act)


class AdaptiveAvgPool2d(_AdaptiveAvgPool):
    # x: (N, C, H, W) -> (N, C, S, S); S = 1 is global average pooling
    """AdaptiveAvgPool2d(output_size): (N, C, H, W) averaged to (N, C, oh, ow) as PyTorch's windows (1: global average pooling)."""
    rank = 2


class AdaptiveAvgPool1d(_AdaptiveAvgPool):
    # x: (N, C, L) -> (N, C, S)
    """AdaptiveAvgPool1d(output_size): (N, C, L) averaged to (N, C, output_size) as PyTorch's windows."""
    rank = 1
