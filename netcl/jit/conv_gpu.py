"""GPU conv family (kernels/conv_gpu.cl): a local-memory implicit GEMM with register blocks and,
when there are too few output tiles to fill the device, split-K: the parts, then conv_gpu_reduce.
The CPU also runs it, unsplit, for the shapes its own families do not take."""
import logging

import numpy as np

import netcl.runtime as runtime
from netcl.errors import CompileError
from netcl.jit.common import Launch

_MAX_SPLIT = 64  # reduction parts at most


def gpu_tiles(k):
    """(BM, BN, RM, RN, BK) for the GPU: tile, register block, reduction step."""
    BM = 64 if k > 32 else (32 if k > 16 else 16)
    return BM, 64, 4 if BM >= 32 else 2, 4, 16


def cpu_tiles(k):
    """The same for generic shapes on the CPU: smaller tiles (and no split, see gpu_split)."""
    return 16 if k <= 16 else 32, 64, 2 if k <= 16 else 4, 4, 16


def gpu_split(k, r, nout, pool, n_cu, bm, bn, bk, split_k=True):
    """(split, rchunk): the reduction parts (when there are too few output tiles to fill the
    device) and the rows each part reduces; kernel arguments, so every batch runs one program."""
    tiles = -(-k // bm) * -(-nout * (4 if pool else 1) // bn)
    rtiles = -(-r // bk)
    split = 1
    enough = 2 * n_cu  # work-groups
    if tiles < enough and split_k:
        split = max(1, min(-(-enough // tiles), rtiles // 4, _MAX_SPLIT))
    rchunk = -(-rtiles // split) * bk
    return -(-r // rchunk), rchunk


class ConvGpu(Launch):
    """Arguments: (nout, split, rchunk, x, wt, bias, y, part, counters, res); weights [R padded][K padded]."""
    in_arg, out_arg, res_arg = 3, 6, 9

    def __init__(self, target, spec):
        k, r = spec.k, spec.r
        BM, BN, RM, RN, BK = gpu_tiles(k) if target.gpu else cpu_tiles(k)
        self.tiles, self.nt = (BM, BN, BK), (BN // RN) * (BM // RM)
        # split-K in one launch where the device orders work-groups' memory by OpenCL 2's atomics
        std = runtime.acq_rel_atomics(target.q.device) if target.gpu and target.config.gpu_split_atomic else None
        defines = dict(spec.defines(), BM=BM, BN=BN, RM=RM, RN=RN, BK=BK)
        self.atomic, self.name = std is not None, "conv_gpu"
        if self.atomic:
            try:
                self.program = target.program("conv_gpu", defines, (f"-cl-std={std}", "-DSPLIT_ATOMIC=1"))
            except CompileError as e:  # a device that names the features but does not build them
                logging.getLogger("netcl").info("conv_gpu with OpenCL %s atomics did not build; split-K in two "
                                                "launches: %s", std, e.log or e)
                self.atomic = False
        if not self.atomic:
            self.program = target.program("conv_gpu", defines)  # (conv_gpu_reduce too)
        self.kp, self.r, self.k, self.spec, self.gpu = -(-k // BM) * BM, r, k, spec, target.gpu
        # weight rows: padded to the longest split * rchunk any batch size can ask for (zeros past R)
        rtiles = -(-r // BK)
        self.rp = max(-(-r // (-(-rtiles // s) * BK)) * -(-rtiles // s) * BK for s in range(1, _MAX_SPLIT + 1))
        self.lsize = (self.nt, 1, 1)
        self.w_buf = target.buffer(4 * self.kp * self.rp)
        self.b_buf = target.buffer(4 * self.kp)
        self.out_border = spec.opb

    def sized(self, target, shape):
        spec, (BM, BN, BK) = self.spec, self.tiles
        n = shape[0]
        nout = n * spec.poh * spec.pow
        split, rchunk = (gpu_split(spec.k, spec.r, nout, spec.pool, target.n_cu, BM, BN, BK, target.config.gpu_split)
                         if self.gpu else (1, -(-spec.r // BK) * BK))
        gx, gy = -(-nout * (4 if spec.pool else 1) // BN), self.kp // BM
        part = target.buffer(4 * split * gx * gy * BM * BN) if split > 1 else target.buffer(4)
        # the one-launch split's arrival counters, zero-filled once: the kernel leaves them zero again
        counters = target.buffer(4 * gx * gy, zero=True) if split > 1 and self.atomic else target.buffer(4)
        args = [np.int32(nout), np.int32(split), np.int32(rchunk), None, self.w_buf, self.b_buf, None, part, counters,
                None]
        return args, (gx * self.nt, gy, split), spec.out_shape(n), spec.out_bytes(n)

    def passes(self, args, gsize):
        """Split over its reduction without the atomics, the parts and then their sum (conv_gpu_reduce,
        the same arguments); else one launch."""
        if gsize[2] == 1 or self.atomic:
            return [(self.name, gsize)]
        return [(self.name, gsize), ("conv_gpu_reduce", (gsize[0], gsize[1], 1))]

    def pack(self, w, b):
        host_w = np.zeros((self.rp, self.kp), np.float32)
        host_w[:self.r, :self.k] = w.reshape(self.k, self.r).T
        host_b = np.zeros(self.kp, np.float32)
        host_b[:self.k] = b
        return host_w, host_b
