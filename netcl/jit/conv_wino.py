"""CPU Winograd conv families: kernels/conv_wino.cl, F(2x2, 3x3) or F(4x4, 3x3) for 3x3 stride-1
convolutions with output channels in the vector lanes (ConvWino), and kernels/conv_winot.cl,
F(2x2, 3x3) with output tiles in the lanes of float16 vectors (ConvWinoT). The weights are
transformed on the host (U = G g G^T) when they are folded; each work-item transforms its tiles'
inputs once and runs register blocks over channel blocks."""
import numpy as np

from netcl.convspec import winot_defines
from netcl.jit.common import Launch

# Winograd weight transforms G (WA x 3) for output tiles of 2 and 4 (points 0, +-1, +-2, inf);
# the matching input and output transforms are WIN_IN / WIN_OUT in conv_wino.cl
_WINO_G = {2: np.array([[1, 0, 0], [1 / 2, 1 / 2, 1 / 2], [1 / 2, -1 / 2, 1 / 2], [0, 0, 1]]),
           4: np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
                        [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]])}


def wino_tile(spec, config, n, direct_vw=0, native_vw=8):
    """The output tile at batch n: 4 (4x fewer multiplies than direct, but 2.25x the transformed
    weights of tile 2, streamed once per group of tiles) where there are enough output channels
    and 4x4 tiles to pay for it, else 2; 0 = not Winograd (not 3x3 stride 1, or config.cpu_wino = 0,
    or the direct kernel fills vectors of 16 or more lanes: direct_vw, its vector for this conv, is
    the device's native width native_vw).
    The batch moves it across one threshold only (stages.conv_families builds both sides)."""
    if spec.ks != 3 or spec.stride != 1:
        return 0
    if config.cpu_wino is not None:
        return config.cpu_wino
    # Winograd's blocks are float8: on AVX-512 (PoCL's native float width 16) they run at half
    # width, and the direct kernel's float16 rows beat them wherever a row fills one; 8-wide rows
    # (8x8 planes) go two to a float16 in the direct kernel where the input has its border
    # (conv_cpu.cpu_block's PACK: direct_vw 16), else still to Winograd, which beats the direct
    # kernel's 8-wide vectors (the figures: docs/performance.md)
    if native_vw >= 16 and direct_vw >= native_vw:
        return 0
    oh, ow = spec.used
    return 4 if spec.k >= 32 and n * -(-oh // 4) * -(-ow // 4) >= 32 else 2


def wino_block(k, c, wm, config):
    """(TB, RV, TT, KBN): TB tiles x RV float8 channel vectors per register block (TB * RV
    accumulators), TT tiles per work-item, KBN channel blocks."""
    tb, rv = 3, (4 if k % 32 == 0 else 2)  # chosen on a 2-core AVX2 PoCL (docs/performance.md)
    # transformed weights past L2 size: more tiles per work-item, so fewer passes stream them
    nsub = 6 if (wm + 2) ** 2 * c * k * 4 > (2 << 20) else 2
    while nsub > 1 and (wm + 2) ** 2 * c * tb * nsub * 4 > (1 << 20):  # private inputs stay <= 1 MB
        nsub -= 1
    if config.cpu_wino_block is not None:
        tb, rv, nsub = config.cpu_wino_block
    return tb, rv, tb * nsub, -(-k // (8 * rv))


class ConvWino(Launch):
    """Arguments: (ntile, kbw, x, u, bias, y, res); weights U packed [K block][transform point][C][KV]."""
    in_arg, out_arg, res_arg = 2, 5, 6

    def __init__(self, target, spec, wm):
        ohu, uw = spec.used
        thn, twn = -(-ohu // wm), -(-uw // wm)
        tb, rv, tt, kbn = wino_block(spec.k, spec.c, wm, target.config)
        check = int(spec.ipb < spec.pad or ohu % wm or uw % wm)  # the last tiles read past the stored border
        self.program, self.name = target.program("conv_wino", dict(spec.defines(), WM=wm, TB=tb, TT=tt, RV=rv, KBN=kbn,
                                                                   THN=thn, TWN=twn, CHECK=check),
                                                 ["-cl-mad-enable"], kernel="conv_wino"), "conv_wino"
        self.lsize, self.spec, self.tiles, self.tt = (1, 1, 1), spec, thn * twn, tt
        self.kbn, self.kv, self.wm, self.k, self.c = kbn, 8 * rv, wm, spec.k, spec.c
        self.w_buf = target.buffer(4 * kbn * self.kv * (wm + 2) ** 2 * spec.c)
        self.b_buf = target.buffer(4 * kbn * self.kv)
        self.out_border = spec.opb

    def sized(self, target, shape):
        n = shape[0]
        ntile = n * self.tiles
        groups = -(-ntile // self.tt)
        split = max(1, min(self.kbn, -(-4 * target.n_cu // groups)))  # enough work-items for every core
        kbw = -(-self.kbn // split)
        args = [np.int32(ntile), np.int32(kbw), None, self.w_buf, self.b_buf, None, None]
        return args, (groups, -(-self.kbn // kbw), 1), self.spec.out_shape(n), self.spec.out_bytes(n)

    def pack(self, w, b):
        g, wa, k, c = _WINO_G[self.wm], self.wm + 2, self.k, self.c
        u = np.zeros((self.kbn * self.kv, c, wa, wa))
        u[:k] = np.einsum("ai,kcij,bj->kcab", g, w.astype(np.float64), g)
        host_w = np.ascontiguousarray(u.reshape(self.kbn, self.kv, c, wa * wa).transpose(0, 3, 2, 1), np.float32)
        host_b = np.zeros(self.kbn * self.kv, np.float32)
        host_b[:k] = b
        return host_w, host_b


class ConvWinoT(Launch):
    """Arguments: (x, u, bias, y, res, st: the bias buffer, untouched without STATS); weights U
    packed [K block][transform point][C][KV]."""
    in_arg, out_arg, res_arg = 0, 3, 4

    def __init__(self, target, spec):
        defines = winot_defines(spec)
        t, vpr, kv, kb = defines["T"], defines["VPR"], defines["KV"], defines["KB"]
        self.program, self.name = target.program("conv_winot", defines, ["-cl-mad-enable"], kernel="conv_winot"), "conv_winot"
        self.lsize, self.spec = (1, 1), spec
        self.vectors = spec.oh // 2 // t * vpr  # per image
        self.kv, self.kb, self.k, self.c = kv, kb, spec.k, spec.c
        self.w_buf = target.buffer(4 * kb * 16 * spec.c * kv)
        self.b_buf = target.buffer(4 * kb * kv)
        self.out_border = spec.opb

    def sized(self, target, shape):
        n = shape[0]
        return ([None, self.w_buf, self.b_buf, None, None, self.b_buf], (self.vectors, n), self.spec.out_shape(n),
                self.spec.out_bytes(n))

    def pack(self, w, b):
        u = np.zeros((self.kb * self.kv, self.c, 4, 4))
        u[:self.k] = np.einsum("ai,kcij,bj->kcab", _WINO_G[2], w.astype(np.float64), _WINO_G[2])
        host_w = np.ascontiguousarray(u.reshape(self.kb, self.kv, self.c, 16).transpose(0, 3, 2, 1), np.float32)
        host_b = np.zeros(self.kb * self.kv, np.float32)
        host_b[:self.k] = b
        return host_w, host_b
