"""Fused linear family (kernels/linear.cl): [LayerNorm +] Linear + activation [+ residual add +
activation], along the last axis or, between two Transposes, along an inner one. Weights stored
(in, out) with out padded to the vector width LJ; each work-item a block of RB rows x LJ outputs
(with a LayerNorm on CPUs, up to 4 vectors of them, one at a time)."""
import numpy as np

from netcl.jit.common import Launch, act_defines

_CPU_LJ, _CPU_RB = 16, 4  # one float16 of W per k, four rows broadcast against it (device/POCL.md)
_GPU_LJ, _GPU_RB = 4, 1


class LinearLaunch(Launch):
    """Arguments: (rows, x, w, b, y, res); rows counts the Linear's rows at the batch size."""
    in_arg, out_arg, res_arg = 1, 4, 5

    def __init__(self, target, stage, shape):
        in_f, out_f = stage.in_f, stage.out_f
        self.axis, self.inner = stage.axis_of(shape), stage.inner(shape)
        lj = _GPU_LJ if target.gpu else (_CPU_LJ if out_f > 8 else 8)
        self.rb, self.lj = (_GPU_RB if target.gpu else _CPU_RB), lj
        self.outp, self.out_f, self.stage = -(-out_f // lj) * lj, out_f, stage
        gx = self.outp // lj  # output vectors of a row
        # on CPUs a LayerNorm's row statistics serve up to 4 output vectors of a work-item (making
        # them costs about as much as one vector's products); more would starve the cores at batch 1
        self.jw = min(gx, 4) if stage.ln is not None and not target.gpu else 1
        defines = dict(IN_F=in_f, OUT_F=out_f, OUT_P=self.outp, LJ=lj, RB=self.rb, JW=self.jw, INNER=self.inner,
                       LN=int(stage.ln is not None), LN_EPS=repr(float(stage.ln.eps if stage.ln else 0.0)) + "f",
                       **act_defines(stage.act, stage.slope), RES=int(stage.res is not None),
                       **{k + "2": v for k, v in act_defines(stage.act2, stage.slope2).items()})
        self.program, self.name = target.program("linear", defines), "linear"
        if target.gpu:
            lx = min(64, 1 << max(0, (gx - 1).bit_length()))  # 64 work-items a group, the spare ones on rows
            self.lsize = (lx, 64 // lx)
        else:  # PoCL runs a group's work-items in a loop on one core: groups of one spread best
            self.lsize = (1, 1)
        self.w_buf = target.buffer(4 * in_f * self.outp)
        self.b_buf = target.buffer(4 * self.outp)

    def sized(self, target, shape):
        out_shape = list(shape)
        out_shape[self.axis] = self.out_f
        rows = int(np.prod(shape, dtype=np.int64)) // shape[self.axis]
        lx, ly = self.lsize
        gsize = (-(-(-(-self.outp // (self.lj * self.jw))) // lx) * lx, -(-(-(-rows // self.rb)) // ly) * ly)
        return [np.int32(rows), None, self.w_buf, self.b_buf, None, None], gsize, tuple(out_shape), 4 * rows * self.out_f

    def pack(self, w, b):
        host_w = np.zeros((w.shape[0], self.outp), np.float32)
        host_w[:, :self.out_f] = w
        host_b = np.zeros(self.outp, np.float32)
        host_b[:self.out_f] = b
        return host_w, host_b
