"""The fused path's element-wise stages: a residual add that no kernel's epilogue takes
(kernels/eltwise.cl, with the activation that follows the block), and a copy into a Concat's
slice for a branch that does not end in a conv stage (kernels/eltwise.cl). No weights."""
import numpy as np

from netcl.jit.common import Launch, act_defines

_LOCAL = 64


class _NoWeights(Launch):
    w_buf = b_buf = None

    def refresh(self, target, stage):
        pass


class AddLaunch(_NoWeights):
    """Arguments: (n, a, b, y): y = act(a + b), element-wise."""
    in_arg, out_arg, res_arg = 1, 3, 2

    def __init__(self, target, stage, shape):
        self.program, self.name = target.program("eltwise", act_defines(stage.act, stage.slope), kernel="add_act"), "add_act"
        self.lsize = (_LOCAL,)

    def sized(self, target, shape):
        size = int(np.prod(shape, dtype=np.int64))
        return [np.int32(size), None, None, None], (max(1, -(-size // _LOCAL)) * _LOCAL,), tuple(shape), 4 * size


class CopyLaunch(_NoWeights):
    """Arguments: (rows, inner, part, whole, offset, src, dst): the branch's tensor into its slice,
    RUN floats per work-item along rows of the dimensions after the concat axis."""
    in_arg, out_arg = 5, 6
    RUN = 16  # eltwise.cl's

    def __init__(self, target, stage, whole_shape, offset):
        self.program, self.name = target.program("eltwise", {}, kernel="copy_rows"), "copy_rows"
        self.lsize, self.dim, self.whole, self.offset = (8, 8), stage.dim, tuple(whole_shape), offset

    def sized(self, target, shape):
        d, whole = self.dim % len(shape), (shape[0],) + self.whole[1:]
        rows = int(np.prod(shape[:d + 1], dtype=np.int64))
        inner = int(np.prod(shape[d + 1:], dtype=np.int64))
        lx, ly = self.lsize
        gsize = (-(-inner // (self.RUN * lx)) * lx, -(-rows // ly) * ly)
        args = [np.int32(rows), np.int32(inner), np.int32(shape[d]), np.int32(whole[d]), np.int32(self.offset),
                None, None]
        return args, gsize, whole, 4 * int(np.prod(whole, dtype=np.int64))
