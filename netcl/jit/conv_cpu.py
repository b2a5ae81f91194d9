"""CPU direct conv family (kernels/conv_cpu.cl): explicit float<VW> vectors along a row and a
register block of RM output channels x RR rows per work-item, for stride 1 and 2 when the used
output width splits into vectors (or half of one: two rows per vector); also depthwise
convolutions (dilation 1), one channel each."""
import numpy as np

from netcl.jit.common import Launch


def cpu_block(spec, config):
    """(VW, RM, RR, PACK) for this conv, or None when the shape does not suit the kernel.
    RR x RM float<VW> accumulators: 16 AVX-512 registers at the default (16, 8) and VW 16.
    PACK 2: rows of 8 (8x8 planes) go two to a float16, where the input carries its zero border (no
    bounds checks) and no pool follows: faster there than Winograd or one row a vector (measured with
    tools/profile_fused.py on resnet8's 8x8 convolutions: docs/performance.md)."""
    maxvw, rm = config.cpu_conv
    ohu, uw = spec.used
    if spec.stride not in (1, 2):
        return None
    rm = 1 if spec.mult else min(rm, -(-spec.k // 2) * 2) if spec.k >= 2 else 1
    if maxvw >= 16 and uw == 8 and ohu % 4 == 0 and spec.ipb >= spec.pad and not spec.pool and not spec.mult:
        return 16, rm, 2, 2
    vw = next((v for v in (16, 8, 4, 2) if v <= maxvw and uw % v == 0), None)
    if vw is None or ohu % 2:
        return None
    return vw, rm, 2, 1


def _largest_divisor(n, limit):
    return max(d for d in range(1, min(n, limit) + 1) if n % d == 0)


class ConvCpu(Launch):
    """Arguments: (x, wb, bias, y, res); weights [K / RM][R][RM]."""
    in_arg, out_arg, res_arg = 0, 3, 4

    def __init__(self, target, spec):
        vw, rm, rr, pack = cpu_block(spec, target.config)
        ohu, uw = spec.used
        kb = -(-spec.k // rm)
        self.grid = (uw * pack // vw, ohu // (rr * pack), kb)  # times the batch along z
        lx = self.grid[0] if self.grid[0] <= 16 else _largest_divisor(self.grid[0], 16)
        ly = _largest_divisor(self.grid[1], max(1, 32 // lx))
        self.program, self.name = target.program("conv_cpu", dict(spec.defines(), VW=vw, VWH=vw // 2,
                                                                  RM=rm, RR=rr, KB=kb, LX=lx, LY=ly, PACK=pack),
                                                 ["-cl-mad-enable"], kernel="conv_cpu"), "conv_cpu"
        self.lsize, self.spec, self.rows_per_vector = (lx, ly, 1), spec, pack
        self.kb, self.rm, self.r, self.k = kb, rm, spec.r, spec.k
        self.w_buf = target.buffer(4 * kb * rm * spec.r)
        self.b_buf = target.buffer(4 * kb * rm)
        self.out_border = spec.opb

    def sized(self, target, shape):
        n, (gx, gy, kb) = shape[0], self.grid
        return [None, self.w_buf, self.b_buf, None, None], (gx, gy, n * kb), self.spec.out_shape(n), self.spec.out_bytes(n)

    def pack(self, w, b):
        wp = np.zeros((self.kb * self.rm, self.r), np.float32)
        wp[:self.k] = w.reshape(self.k, self.r)
        host_w = np.ascontiguousarray(wp.reshape(self.kb, self.rm, self.r).transpose(0, 2, 1))
        host_b = np.zeros(self.kb * self.rm, np.float32)
        host_b[:self.k] = b
        return host_w, host_b
