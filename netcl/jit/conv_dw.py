"""Depthwise conv family (kernels/conv_dw.cl), both device classes: groups == input channels
(channel multiplier MULT = K / C), any stride and dilation; one work-item per output element."""
import numpy as np

from netcl.jit.common import Launch


def _pow2_at_most(v, limit):
    p = 1
    while p * 2 <= min(v, limit):
        p *= 2
    return p


class ConvDw(Launch):
    """Arguments: (x, w, bias, y, res); weights [K][KS * KS]."""
    in_arg, out_arg, res_arg = 0, 3, 4

    def __init__(self, target, spec):
        lx = _pow2_at_most(spec.ow, 32 if target.gpu else 16)
        ly = _pow2_at_most(spec.oh, max(1, (64 if target.gpu else 16) // lx))
        self.program, self.name = target.program("conv_dw", dict(spec.defines(), DIL=spec.dil, MULT=spec.k // spec.c,
                                                                 LX=lx, LY=ly), ["-cl-mad-enable"],
                                                  kernel="conv_dw"), "conv_dw"
        self.lsize, self.spec, self.k = (lx, ly, 1), spec, spec.k
        self.w_buf = target.buffer(4 * spec.k * spec.ks * spec.ks)
        self.b_buf = target.buffer(4 * spec.k)
        self.out_border = spec.opb

    def sized(self, target, shape):
        spec, (lx, ly, _) = self.spec, self.lsize
        n = shape[0]
        gsize = (-(-spec.ow // lx) * lx, -(-spec.oh // ly) * ly, n * spec.k)
        return [None, self.w_buf, self.b_buf, None, None], gsize, spec.out_shape(n), spec.out_bytes(n)

    def pack(self, w, b):
        return np.ascontiguousarray(w.reshape(self.k, -1), np.float32), np.ascontiguousarray(b, np.float32)
