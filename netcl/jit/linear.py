"""Fused linear family (kernels/linear.cl): Linear + activation [+ residual add + activation], each work-item LJ adjacent
outputs of one row, weights stored (in, out) with out padded to LJ."""
import numpy as np

from netcl.jit.common import Launch, act_defines

LJ = 4  # outputs per work-item


class LinearLaunch(Launch):
    """Arguments: (rows, x, w, b, y, res); weights [in][out padded to LJ]."""
    in_arg, out_arg, res_arg = 1, 4, 5

    def __init__(self, target, stage):
        lin = stage.lin
        self.outp, self.out_f = -(-lin.out_features // LJ) * LJ, lin.out_features
        self.program, self.name = target.program("linear", dict(IN_F=lin.in_features, OUT_F=lin.out_features,
                                                                OUT_P=self.outp, LJ=LJ,
                                                                **act_defines(stage.act, stage.slope), RES=int(stage.res is not None),
                                                                **{k + "2": v for k, v in act_defines(stage.act2, stage.slope2).items()})), "linear"
        self.lx = 64 if target.gpu else 16
        self.lsize, self.lin = (self.lx, 1), lin
        self.w_buf = target.buffer(4 * lin.in_features * self.outp)
        self.b_buf = target.buffer(4 * self.outp)

    def sized(self, target, shape):
        rows = int(np.prod(shape[:-1], dtype=np.int64))
        gsize = (-(-(self.outp // LJ) // self.lx) * self.lx, rows)
        return ([np.int32(rows), None, self.w_buf, self.b_buf, None, None], gsize, self.lin.output_shape(shape),
                4 * rows * self.out_f)

    def pack(self, w, b):
        host_w = np.zeros((w.shape[0], self.outp), np.float32)
        host_w[:, :self.out_f] = w
        host_b = np.zeros(self.outp, np.float32)
        host_b[:self.out_f] = b
        return host_w, host_b
