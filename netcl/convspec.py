"""A fused conv stage's sizes and the -D defines every conv kernel shares (kernels/conv.h), and the
shape rule and build options of conv_winot.cl, the tile-lane Winograd kernel: below both the
fused planner (netcl.jit) and the layers (netcl.nn.conv runs conv_winot.cl in its CPU training
passes), so neither imports the other."""
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

import numpy as np

from netcl.act import Act


def act_defines(act, slope):
    """The ACT and SLOPE defines of kernels/act.h; act: a netcl.act.Act, or None for no activation."""
    return dict(ACT=int(act or 0), SLOPE=repr(np.float32(slope).item()) + "f")


@dataclass(frozen=True)
class ConvSpec:
    """One fused conv stage at one input shape without the batch: what every conv family needs to know."""
    c: int  # input channels, height, width
    h: int
    w: int
    k: int  # output channels
    ks: int  # kernel size, stride, padding
    stride: int
    pad: int
    oh: int  # convolution output size (before the pool)
    ow: int
    pool: bool  # a 2x2/2 max-pool follows
    ipb: int  # stored border of the input plane (0, or at least pad: no bounds checks)
    opb: int  # stored border the output plane must carry (the next conv's padding, else 0)
    act: Optional[Act]  # the activation, or None, and its slope
    slope: float
    kt: int = 0  # channels of the stored output (a Concat's), 0: k; this stage writes from channel koff
    koff: int = 0
    res: bool = False  # the residual add (its tensor stored with border rpb), then act2
    rpb: int = 0
    act2: Optional[Act] = None
    slope2: float = 0.0
    dil: int = 1  # dilation (the depthwise families)
    mult: int = 0  # 0: a dense conv; else depthwise (groups == c) with this channel multiplier

    @property
    def poh(self):
        """The output height after the fused 2x2 pool (floor, as MaxPool2d), else oh."""
        return self.oh // 2 if self.pool else self.oh

    @property
    def pow(self):
        """The output width after the fused 2x2 pool (floor, as MaxPool2d), else ow."""
        return self.ow // 2 if self.pool else self.ow

    @property
    def r(self):
        """The reduction length: input channels (one for a depthwise conv) x ks x ks."""
        return (1 if self.mult else self.c) * self.ks * self.ks

    @property
    def used(self):
        """(rows, columns) of the conv output that are used: the pool drops an odd last one."""
        return (2 * self.poh, 2 * self.pow) if self.pool else (self.oh, self.ow)

    def out_shape(self, n):
        """(N, K, poh, pow): the output's logical shape for batch n."""
        return n, self.k, self.poh, self.pow

    def stored_shape(self, n):
        """The stored output plane (with its border)."""
        return n, self.kt or self.k, self.poh + 2 * self.opb, self.pow + 2 * self.opb

    def out_bytes(self, n):
        """Bytes of the stored output planes for batch n, plus 16 floats of slack for wide vector accesses."""
        return 4 * (int(np.prod(self.stored_shape(n), dtype=np.int64)) + 16)

    def defines(self):
        """kernels/conv.h's defines; each family adds its own."""
        return dict(C=self.c, H=self.h, W=self.w, K=self.k, KS=self.ks, STRIDE=self.stride, PAD=self.pad,
                    OH=self.oh, OW=self.ow, POOL=2 if self.pool else 1, **act_defines(self.act, self.slope),
                    IPB=self.ipb, OPB=self.opb, KT=self.kt or self.k, KOFF=self.koff, RES=int(self.res),
                    RPB=self.rpb, MULT=self.mult, **{k + "2": v for k, v in act_defines(self.act2, self.slope2).items()})


WINOT_MAX_C = 512  # conv_winot.cl's input channels at most: 512 KiB of private transformed inputs


def winot_layout(spec):
    """(T, VPR) of conv_winot.cl for this conv: T tile rows per float16 of 16 tiles of 2x2 outputs
    (1 for rows of 32 or more outputs, 2 for 16, 4 for 8), VPR vectors per tile row; None where
    it does not apply: not 3x3 stride 1 padding 1, a depthwise conv or a pool after it, an input
    stored without its border (the kernel reads without bounds checks), output sizes that the
    vectors do not tile, fewer than 8 input or output channels (the transforms cost more than the
    multiplies they save: tuning.json's note on conv_winot's 8 channels), more
    than WINOT_MAX_C input channels (a work-item keeps 1 KiB of transformed inputs per channel in
    private memory, on the thread's stack: 8192 channels overflowed 8 MiB)."""
    if (spec.ks, spec.stride, spec.pad, spec.dil) != (3, 1, 1, 1) or spec.mult or spec.pool or spec.ipb < 1:
        return None
    if min(spec.c, spec.k) < 8 or spec.c > WINOT_MAX_C:
        return None
    if spec.oh % 2 or spec.ow % 2:
        return None
    tw, tr = spec.ow // 2, spec.oh // 2
    if tw % 16 == 0:
        return 1, tw // 16
    if tw in (8, 4) and tr % (16 // tw) == 0:
        return 16 // tw, 1
    return None


# conv_winot.cl's output channels per block (KV): its accumulators are KV float16, so on devices
# with 16-wide vectors (AVX-512's 32 registers) 16 (8 for at most 8 channels); on 8-wide ones
# (AVX2's 16 registers, each float16 two of them) 4: 8 registers of accumulators, where KV 16's
# spill (tuning.json's note on conv_winot's KV)
WINOT_TRAIN_LANES = 8  # the narrowest float vectors conv_winot.cl trains on where not forced


def winot_kv(k, lanes=16):
    """conv_winot.cl's KV for k output channels on a device with `lanes`-wide float vectors."""
    return (16 if k > 8 else 8) if lanes >= 16 else 4


def winot_defines(spec, lanes=16):
    """conv_winot.cl's build defines for `spec` (winot_layout must accept it): conv.h's, TW (tiles per
    tile row), T, VPR, KV (output channels per block, winot_kv) and KB (blocks)."""
    t, vpr = winot_layout(spec)
    kv = winot_kv(spec.k, lanes)
    return dict(spec.defines(), TW=spec.ow // 2, T=t, VPR=vpr, KV=kv, KB=-(-spec.k // kv))


def winot_choice(text):
    """$NETCL_CPU_WINOT's text as a choice: None (unset or empty: by device), else on unless "0"."""
    return text != "0" if text else None


def winot_enabled(choice, vector_width, minimum=16):
    """Whether conv_winot.cl runs where its layout fits: `choice` (winot_choice) when set, else on
    devices whose native float vector is `minimum` wide or more (the fused inference path: 16,
    AVX-512 on PoCL; training: WINOT_TRAIN_LANES)."""
    return vector_width >= minimum if choice is None else choice


@lru_cache(maxsize=256)
def winot_plain(c, k, h, w, add=False, lanes=16):
    """(defines, build options) of conv_winot.cl for a plain 3x3 stride-1 padding-1 convolution of
    c -> k channels on h x w planes stored with a border of 1 (no activation or output border:
    Conv2d's training passes; `add`: the result added into the output tensor, RES_IN_PLACE) on a
    device with `lanes`-wide float vectors (KV, and WGV: the vectors of winot_wgrad's sums, for the
    weight gradient's launches), or None where winot_layout refuses it."""
    spec = ConvSpec(c, h, w, k, 3, 1, 1, h, w, False, 1, 0, None, 0.0, res=add)
    if winot_layout(spec) is None:
        return None
    # WGV: winot_wgrad's vectors; WINOT_PREFETCH: conv_winot's next inputs fetched during its products
    defines = dict(winot_defines(spec, lanes), WGV=16 if lanes >= 16 else 8, WINOT_PREFETCH=1)
    return defines, (tuple(f"-D{n}={v}" for n, v in defines.items()) + ("-cl-mad-enable",)
                     + (("-DRES_IN_PLACE",) if add else ()))
