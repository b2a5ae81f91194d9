"""The column route of a convolution of any geometry (kernels/conv_cols.cl): im2col into
(C*KH*KW, N*OH*OW) columns, ops.gemm per group, the product back into (N, K, OH, OW); the data
gradient is W^T dY per group gathered back onto the input (col2im), the weight gradient
dY cols^T per group. Conv1d runs it as the H = 1 case; Conv2d where its kernel, stride, padding or
dilation differ between height and width, or padding="same" (the square, symmetric ones keep
conv_route's routes); ConvTranspose1d, and ConvTranspose2d where it has groups, dilation or
non-square pairs, as the data gradient (transposed_forward)."""
from dataclasses import dataclass

from netcl import ops


@dataclass(frozen=True)
class Cols:
    """A convolution's geometry as the column kernels take it: input (n, c, h, w), output
    (n, k, oh, ow), kernel (kh, kw), stride (sh, sw), top and left padding (ph, pw), dilation
    (dh, dw), groups."""
    n: int
    c: int
    h: int
    w: int
    k: int
    oh: int
    ow: int
    kh: int
    kw: int
    sh: int
    sw: int
    ph: int
    pw: int
    dh: int
    dw: int
    groups: int

    def args(self):
        """(N, C, H, W, OH, OW, KH, KW, sh, sw, ph, pw, dh, dw): cols_im2col's and cols_col2im's sizes."""
        return (self.n, self.c, self.h, self.w, self.oh, self.ow, self.kh, self.kw, self.sh, self.sw, self.ph,
                self.pw, self.dh, self.dw)

    def gemm_sizes(self):
        """(K/G, C/G*KH*KW, N*OH*OW): a group's rows of W, columns of W and positions."""
        return self.k // self.groups, self.c // self.groups * self.kh * self.kw, self.n * self.oh * self.ow


def forward(q, x, weight, bias, g, out_shape):
    """(y of out_shape, the columns the gradients read): y = W cols per group (+ bias)."""
    rows, cols = _product(q, x, weight, g)
    y = ops.new(q, out_shape)
    has_bias = bias is not None
    ops.launch1d(q, "conv_cols", "cols_rows_out", y.size, g.n, g.k, g.oh * g.ow, int(has_bias), rows,
                 bias if has_bias else ops.dummy(q), y)
    return y.mark_written(), cols


def forward_act(q, x, weight, bias, g, out_shape, act, slope):
    """y of out_shape = act(W cols per group + bias): inference's route (netcl.jit.cols), the bias
    and activation in the one kernel that lays the product out; bias (K,) is required."""
    rows, _ = _product(q, x, weight, g)
    y = ops.new(q, out_shape)
    ops.launch1d(q, "conv_cols", "cols_rows_out_act", y.size, g.n, g.k, g.oh * g.ow, rows, bias, int(act or 0),
                 float(slope), y)
    return y.mark_written()


def _product(q, x, weight, g):
    """(rows (K, N*OH*OW) = W cols per group, cols): im2col, then a GEMM per group."""
    kg, ck, no = g.gemm_sizes()
    cols = ops.new(q, (g.c * g.kh * g.kw, no))
    if ops.config_class(q) == "gpu":  # a work-item per value: neighbours write neighbouring values
        ops.launch1d(q, "conv_cols", "cols_im2col", cols.size, *g.args(), x, cols)
    else:  # a work-item per row of values
        ops.launch1d(q, "conv_cols", "cols_im2col_rows", cols.size // g.ow, *g.args(), x, cols)
    cols.mark_written()
    rows = ops.new(q, (g.k, no))
    for i in range(g.groups):
        ops.gemm(kg, no, ck, weight, (ck, 1, 0), cols, (no, 1, 0), rows, (no, 1, 0),
                 offsets=(i * kg * ck, i * ck * no, i * kg * no))
    return rows.mark_written(), cols


def rows_of(dy, g):
    """dy (N, K, ...) as the GEMM's (K, N*OH*OW) rows."""
    rows = ops.new(dy, (g.k, g.n * g.oh * g.ow))
    ops.launch1d(dy.queue, "conv_cols", "cols_rows_in", rows.size, g.n, g.k, g.oh * g.ow, dy, rows)
    return rows.mark_written()


def weight_grad(rows, cols, weight, g):
    """weight.grad (+)= dY_g (K/G, N*P) @ cols_g^T per group."""
    kg, ck, no = g.gemm_sizes()
    gw, acc = ops.grad_target(weight)
    for i in range(g.groups):
        ops.gemm(kg, ck, no, rows, (no, 1, 0), cols, (1, no, 0), gw, (ck, 1, 0), beta=1.0 if acc else 0.0,
                 offsets=(i * kg * no, i * ck * no, i * kg * ck))
    gw.mark_written()


def data_grad(q, rows, weight, g, x_shape, bias=None):
    """dx of x_shape: dcols = W_g^T dY_g per group, gathered back onto the input (col2im), + bias per
    channel where given (a transposed convolution's forward)."""
    kg, ck, no = g.gemm_sizes()
    dcols = ops.new(q, (g.c * g.kh * g.kw, no))
    for i in range(g.groups):
        ops.gemm(ck, no, kg, weight, (1, ck, 0), rows, (no, 1, 0), dcols, (no, 1, 0),
                 offsets=(i * kg * ck, i * kg * no, i * ck * no))
    dx = ops.new(q, x_shape)
    has_bias, gpu = bias is not None, ops.config_class(q) == "gpu"
    ops.launch1d(q, "conv_cols", "cols_col2im" if gpu else "cols_col2im_rows", dx.size // (1 if gpu else g.w),
                 *g.args(), dcols.mark_written(), int(has_bias), bias if has_bias else ops.dummy(q), dx)
    return dx.mark_written()


def transposed(x_shape, out_shape, kernel, stride, pad, dilation, groups):
    """The Cols of the convolution whose data gradient is the transposed convolution of input
    x_shape (N, C, H, W) to out_shape (N, K, OH, OW): that convolution reads (N, K, OH, OW) and
    writes (N, C, H, W), and the transposed one's weight (C, K/groups, kh, kw) is its weight."""
    (n, c, h, w), (_, k, oh, ow) = x_shape, out_shape
    return Cols(n, k, oh, ow, c, h, w, *kernel, *stride, *pad, *dilation, groups)


def transposed_forward(q, x, weight, bias, g, out_shape):
    """(y of out_shape, x's GEMM rows for the weight gradient): the GEMM and col2im (+ bias)."""
    rows = rows_of(x, g)
    return data_grad(q, rows, weight, g, out_shape, bias), rows


def transposed_backward(q, dy, rows, weight, g, x_shape):
    """dx of x_shape, the convolution's forward of dy (im2col and the GEMM), and weight.grad (+)=
    from x's rows and dy's columns."""
    dx, cols = forward(q, dy, weight, None, g, x_shape)
    weight_grad(rows, cols, weight, g)
    return dx
