"""GPU conv family (kernels/conv_gpu.cl): a local-memory implicit GEMM with register blocks and,
when there are too few output tiles to fill the device, split-K with an in-kernel reduction.
The CPU also runs it, unsplit, for the shapes its own families do not take."""
import numpy as np

from netcl.jit.common import Launch


def gpu_config(k, r, nout, pool, n_cu, split_k=True):
    """(BM, BN, RM, RN, BK, SPLIT, RCHUNK) for the GPU: tile, register block, reduction step,
    reduction parts and the rows each part reduces."""
    BK, RN = 16, 4
    BM = 64 if k > 32 else (32 if k > 16 else 16)
    RM = 4 if BM >= 32 else 2
    BN = 64
    tiles = -(-k // BM) * -(-nout * (4 if pool else 1) // BN)
    rtiles = -(-r // BK)
    split = 1
    enough = 2 * n_cu  # work-groups
    if tiles < enough and split_k:
        split = max(1, min(-(-enough // tiles), rtiles // 4, 64))
    rchunk = -(-rtiles // split) * BK
    split = -(-r // rchunk)
    return BM, BN, RM, RN, BK, split, rchunk


def cpu_config(k, r):
    """The same for generic shapes on the CPU: smaller tiles, no split."""
    BM, BN, RM, RN, BK = 16 if k <= 16 else 32, 64, 2 if k <= 16 else 4, 4, 16
    return BM, BN, RM, RN, BK, 1, -(-r // BK) * BK


class ConvGpu(Launch):
    """Arguments: (nout, x, wt, bias, y, part, counters); weights [R padded][K padded]."""
    in_arg, out_arg = 1, 4

    def __init__(self, target, spec):
        k, r = spec.k, spec.r
        nout = spec.n * spec.poh * spec.pow
        if target.gpu:
            BM, BN, RM, RN, BK, split, rchunk = gpu_config(k, r, nout, spec.pool, target.n_cu,
                                                           target.config.gpu_split)
        else:
            BM, BN, RM, RN, BK, split, rchunk = cpu_config(k, r)
        nt = (BN // RN) * (BM // RM)
        self.kernel = target.kernel("conv_gpu", "conv_gpu", dict(spec.defines(), BM=BM, BN=BN, RM=RM, RN=RN, BK=BK,
                                                                 SPLIT=split, RCHUNK=rchunk))
        self.kp, self.rp, self.r, self.k = -(-k // BM) * BM, split * rchunk, r, k
        gx = -(-nout * (4 if spec.pool else 1) // BN)
        gy = self.kp // BM
        self.gsize, self.lsize = (gx * nt, gy, split), (nt, 1, 1)
        self.w_buf = target.buffer(4 * self.kp * self.rp)
        self.b_buf = target.buffer(4 * self.kp)
        part = target.buffer(4 * split * gx * gy * BM * BN) if split > 1 else target.buffer(4)
        counters = target.buffer(4 * gx * gy, zero=True)  # the kernel leaves them zero again
        self.args = [np.int32(nout), None, self.w_buf, self.b_buf, None, part, counters]
        self.out_shape, self.out_bytes, self.out_border = spec.out_shape, spec.out_bytes, spec.opb

    def pack(self, w, b):
        host_w = np.zeros((self.rp, self.kp), np.float32)
        host_w[:self.r, :self.k] = w.reshape(self.k, self.r).T
        host_b = np.zeros(self.kp, np.float32)
        host_b[:self.k] = b
        return host_w, host_b
