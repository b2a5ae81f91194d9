"""Fused linear family: [LayerNorm +] Linear + activation [+ residual add + activation], along the
last axis or, between two Transposes, along an inner one. Weights stored (in, out) with out padded
to the vector width. GPUs (kernels/linear.cl): each work-item RB rows x LJ outputs. CPUs
(kernels/linear_cpu.cl): each work-item RB rows x JV float16 vectors of outputs at once, over
several row blocks."""
import numpy as np

from netcl.jit.common import Launch, act_defines

_GPU_LJ, _GPU_RB = 4, 1
# CPU register block: RB rows x JV float16 outputs, RB * JV <= 24 accumulators of the 32 AVX-512
# registers (the rest: JV loads of W, a broadcast); linear.cl's 4 x 1 vectors were slow on PoCL,
# where vloadN and fma() are out-of-line calls
_CPU_ACC, _CPU_JV, _CPU_RB = 24, 6, 8
_CPU_ITEMS = 16  # work-items per compute unit, at most: each runs several row blocks


def cpu_block(out_f):
    """(JV, RB, NJ): float16 output vectors and rows per work-item, output groups per row."""
    gx = -(-out_f // 16)
    jv = min(gx, _CPU_JV)
    nj = -(-gx // jv)
    jv = -(-gx // nj)  # the groups as even as they go: 7 vectors as 4 + 3, not 6 + 1
    return jv, min(_CPU_RB, _CPU_ACC // jv), nj


class LinearLaunch(Launch):
    """Arguments: (rows, x, w, b, y, res); rows counts the Linear's rows at the batch size."""
    in_arg, out_arg, res_arg = 1, 4, 5

    def __init__(self, target, stage, shape):
        in_f, out_f = stage.in_f, stage.out_f
        self.axis, self.inner = stage.axis_of(shape), stage.inner(shape)
        self.out_f, self.stage, self.gpu = out_f, stage, target.gpu
        defines = dict(IN_F=in_f, OUT_F=out_f, INNER=self.inner,
                       LN=int(stage.ln is not None), LN_EPS=repr(float(stage.ln.eps if stage.ln else 0.0)) + "f",
                       **act_defines(stage.act, stage.slope), RES=int(stage.res is not None),
                       **{k + "2": v for k, v in act_defines(stage.act2, stage.slope2).items()})
        if target.gpu:
            self.rb, self.lj = _GPU_RB, _GPU_LJ
            self.outp = -(-out_f // self.lj) * self.lj
            gx = self.outp // self.lj
            lx = min(64, 1 << max(0, (gx - 1).bit_length()))  # 64 work-items a group, the spare ones on rows
            self.lsize = (lx, 64 // lx)
            self.program, self.name = target.program("linear", dict(defines, OUT_P=self.outp, LJ=self.lj, RB=self.rb,
                                                                    JW=1), kernel="linear"), "linear"
        else:
            jv, self.rb, self.nj = cpu_block(out_f)
            self.outp, self.lsize, self.n_cu = -(-out_f // 16) * 16, (1, 1), target.n_cu
            self.program, self.name = target.program("linear_cpu", dict(defines, OUT_P=self.outp, RB=self.rb, JV=jv),
                                                     ["-cl-mad-enable"], kernel="linear_cpu"), "linear_cpu"
        self.w_buf = target.buffer(4 * in_f * self.outp)
        self.b_buf = target.buffer(4 * self.outp)

    def sized(self, target, shape):
        out_shape = list(shape)
        out_shape[self.axis] = self.out_f
        rows = int(np.prod(shape, dtype=np.int64)) // shape[self.axis]
        blocks = -(-rows // self.rb)
        if self.gpu:
            lx, ly = self.lsize
            gsize = (-(-(self.outp // self.lj) // lx) * lx, -(-blocks // ly) * ly)
        else:
            gsize = (self.nj, max(1, min(blocks, -(-_CPU_ITEMS * self.n_cu // self.nj))))
        return [np.int32(rows), None, self.w_buf, self.b_buf, None, None], gsize, tuple(out_shape), 4 * rows * self.out_f

    def pack(self, w, b):
        host_w = np.zeros((w.shape[0], self.outp), np.float32)
        host_w[:, :self.out_f] = w
        host_b = np.zeros(self.outp, np.float32)
        host_b[:self.out_f] = b
        return host_w, host_b
