"""The fused path's sequence and resampling stages (kernels/seq.cl, a kernel per define set): LayerNorm
where no Linear follows it, the attention core of a MultiheadAttention (between its input and
output projections, which run in the linear family), the mean over an axis (global average
pooling, the average over tokens), a Transpose that no Linear or mean absorbed, a MaxPool2d no
convolution took and Upsample."""
import math

import numpy as np

from netcl.jit.common import Launch
from netcl.jit.eltwise import _NoWeights

_CPU_LOCAL, _GPU_LOCAL = 16, 64


def _groups(target, n):
    """(global size, local size) for n work-items in one dimension."""
    lx = _GPU_LOCAL if target.gpu else _CPU_LOCAL
    return (max(1, -(-n // lx)) * lx,), (lx,)


class LayerNormLaunch(Launch):
    """Arguments: (rows, x, gamma, beta, y); gamma and beta are w_buf and b_buf."""
    in_arg, out_arg = 1, 4

    def __init__(self, target, stage, shape):
        ln = stage.ln
        self.d = ln.normalized_shape
        self.program = target.program("seq", dict(D=self.d, EPS=repr(float(ln.eps)) + "f"), kernel="layernorm")
        self.name, self.lsize = "layernorm", _groups(target, 1)[1]
        self.w_buf, self.b_buf = target.buffer(4 * self.d), target.buffer(4 * self.d)

    def sized(self, target, shape):
        rows = int(np.prod(shape, dtype=np.int64)) // self.d
        gsize, _ = _groups(target, rows)
        return [np.int32(rows), None, self.w_buf, self.b_buf, None], gsize, tuple(shape), 4 * rows * self.d

    def pack(self, w, b):
        return w, b


class AttentionLaunch(_NoWeights):
    """Arguments: (samples x heads, qkv, out); qkv is the input projection's output (N, L, 3E)."""
    in_arg, out_arg = 1, 2

    def __init__(self, target, stage, shape):
        _, self.length, e3 = shape
        self.e, self.heads = e3 // 3, stage.mha.num_heads
        hd = self.e // self.heads
        self.qb = 1 if target.gpu else 16  # queries per work-item (kernels/seq.cl says why)
        self.program = target.program("seq", dict(L=self.length, E=self.e, HD=hd, QB=self.qb,
                                                  SCALE=repr(float(np.float32(1.0 / math.sqrt(hd)))) + "f"),
                                      ["-cl-mad-enable"], kernel="attention")
        self.name = "attention"
        self.blocks = -(-self.length // self.qb)
        self.lsize = (min(self.blocks, _GPU_LOCAL), 1) if target.gpu else (1, 1)

    def sized(self, target, shape):
        n = shape[0]
        lx = self.lsize[0]
        gsize = (-(-self.blocks // lx) * lx, n * self.heads)
        out = (n, self.length, self.e)
        return [np.int32(n * self.heads), None, None], gsize, out, 4 * int(np.prod(out, dtype=np.int64))


class MeanLaunch(_NoWeights):
    """Arguments: (outputs, x, y): the mean over the middle axis of x read as (outer, R, inner)."""
    in_arg, out_arg = 1, 2

    def __init__(self, target, stage, shape):
        self.stage = stage
        _, self.r, self.inner = stage.split(shape)
        self.program = target.program("seq", dict(R=self.r, INNER=self.inner), kernel="mean_axis")
        self.name, self.lsize = "mean_axis", _groups(target, 1)[1]

    def sized(self, target, shape):
        outer, _, _ = self.stage.split(shape)
        n = outer * self.inner
        gsize, _ = _groups(target, n)
        return [np.int32(n), None, None], gsize, self.stage.output_shape(shape), 4 * n


class TransposeLaunch(_NoWeights):
    """Arguments: (rows, x, y) of kernels/seq.cl's transpose_rows: x read as (A, D0, B, D1, C)
    around the swapped dimensions (Transpose._split), a work-item per output row; a swap that keeps
    the order of the elements is a copy (D0 = B = D1 = 1)."""
    in_arg, out_arg = 1, 2

    def __init__(self, target, stage, shape):
        self.layer = stage.layer
        split = self.layer._split(shape)
        self.d0, self.b, self.d1, self.c = split or (1, 1, 1, int(np.prod(shape[1:], dtype=np.int64)))
        self.program = target.program("seq", dict(TD0=self.d0, TB=self.b, TD1=self.d1, TC=self.c), kernel="transpose_rows")
        self.name, self.lsize = "transpose_rows", _groups(target, 1)[1]

    def sized(self, target, shape):
        n = int(np.prod(shape, dtype=np.int64))
        rows = n // (self.d0 * self.c)
        gsize, _ = _groups(target, rows)
        return [np.int32(rows), None, None], gsize, self.layer.output_shape(shape), 4 * n


class MaxPoolLaunch(_NoWeights):
    """Arguments: (rows, x, y) of kernels/seq.cl's maxpool: a work-item per output row."""
    in_arg, out_arg = 1, 2

    def __init__(self, target, stage, shape):
        self.layer = stage.layer
        _, _, h, w = shape
        _, _, self.oh, self.ow = self.layer.output_shape(shape)
        lay = self.layer
        self.program = target.program("seq", dict(PK=lay.kernel_size, PS=lay.stride, PP=lay.padding, H=h, W=w,
                                                  OH=self.oh, OW=self.ow), kernel="maxpool")  # (ceil_mode: OH, OW say it)
        self.name, self.lsize = "maxpool", _groups(target, 1)[1]

    def sized(self, target, shape):
        out = self.layer.output_shape(shape)
        rows = out[0] * out[1] * self.oh
        return [np.int32(rows), None, None], _groups(target, rows)[0], out, 4 * rows * self.ow


class UpsampleLaunch(_NoWeights):
    """Arguments: (rows, x, y) of kernels/seq.cl's upsample_rows (`upsample` is an OpenCL builtin's
    name): a work-item per output row."""
    in_arg, out_arg = 1, 2

    def __init__(self, target, stage, shape):
        self.layer = stage.layer
        _, _, h, self.w = shape
        self.program = target.program("seq", dict(US=self.layer.scale_factor, H=h, W=self.w,
                                                  BILINEAR=int(self.layer.mode == "bilinear")), kernel="upsample_rows")
        self.name, self.lsize = "upsample_rows", _groups(target, 1)[1]

    def sized(self, target, shape):
        out = self.layer.output_shape(shape)
        rows = out[0] * out[1] * out[2]
        return [np.int32(rows), None, None], _groups(target, rows)[0], out, 4 * rows * out[3]
