"""One route selector for Conv2d's training passes: conv_route(spec, device) decides the forward, the
weight gradient and the data gradient together, from the convolution's sizes and the device class
alone (no device, no queue: tests print every reference model's routes without one), with the
register blocks and cut-offs of the tuning table (netcl.tuning). Conv2d (netcl.nn.conv) runs the
route it decided at forward time; its backward reads the route from what the forward saved.

Forward routes (CPU kernels of convtrain_cpu.cl unless named):
  winot       conv_winot.cl's Winograd F(2x2, 3x3) on the input's zero-bordered planes
  rows        corr_cpu on the zero-bordered planes (stride 1, rows of direct_min_width or more)
  channels    corrc_cpu, output channels in the lanes (narrower rows or stride 2, few weights)
  phases      corrc_cpu on a 3x3 stride-2 padding-1 conv's input as it is (UNPAD)
  pointwise2  pw2_fwd_cpu: a 1x1 stride-2 conv, 16 output positions a vector
  depthwise   dw_fwd_cpu on zero-bordered planes; depthwise_any: conv.cl's dw_forward
  gemm        im2col and a GEMM (grouped: one GEMM batched over the groups); every GPU conv
Weight gradients: winot (winot_wgrad), rows (wgrad_cpu on dy's planes), narrow (wgrad_narrow_cpu),
oc16 (wgrad_oc16_cpu), wgrad2o / wgrad2 (3x3 stride 2, output channels or positions in the lanes),
pointwise2, gemm_planes (im2col_cpu of the forward's planes, dy_rows_cpu, a GEMM), gemm_unpad (the
same of x as it is), gemm_cols (the forward's own columns), depthwise, depthwise_any, gemm (GPU,
groups). Data gradients: winot, rows (corr_cpu flipped), channels (corrc_cpu flipped), corrt
(corrt_cpu), corrt2 / corrt2p (phases), pointwise2, gemm_1x1 (W^T dy straight into dx), col2im,
depthwise, depthwise_s2, depthwise_any, gemm.

The generic tier (generic=True) takes no kernel built for one layer's sizes: no Winograd (its
programs are specialised to the planes and channels), no wgrad_narrow_cpu or wgrad_oc16_cpu and no
pooled weight gradient; the specialised programs of the full route are ConvRoute.kernels."""
from dataclasses import dataclass, field
from typing import Optional

from netcl import tuning
from netcl.convspec import WINOT_TRAIN_LANES, winot_enabled, winot_plain

FAMILY = "convtrain_cpu"
ROWS1 = ("-DPW2_ROWS=1",)  # the stride-2 kernels: one output row a vector
ROWS2 = ("-DPW2_ROWS=2",)  # two rows of 8 a vector


@dataclass(frozen=True)
class ConvSpec:
    """A convolution at one input shape: input (n, c, h, w), k output channels, square kernel ks."""
    n: int
    c: int
    h: int
    w: int
    k: int
    ks: int
    stride: int = 1
    padding: int = 0
    dilation: int = 1
    groups: int = 1

    @property
    def oh(self):
        """The output height."""
        return (self.h + 2 * self.padding - self.dilation * (self.ks - 1) - 1) // self.stride + 1

    @property
    def ow(self):
        """The output width."""
        return (self.w + 2 * self.padding - self.dilation * (self.ks - 1) - 1) // self.stride + 1

    @property
    def geometry(self):
        """(kernel size, stride, padding, dilation)."""
        return self.ks, self.stride, self.padding, self.dilation


@dataclass(frozen=True)
class DeviceClass:
    """What a route depends on of the device: its class (ops.config_class: "cpu16", "cpu", "gpu"),
    float vector width, local memory and compute units, and NETCL_CPU_WINOT's choice (None: by the
    vector width)."""
    kind: str
    lanes: int = 16
    local_mem: int = 1 << 20
    compute_units: int = 2
    winot: Optional[bool] = None

    @property
    def cpu(self):
        """Whether the class runs netcl's CPU kernels (cpu or cpu16)."""
        return self.kind != "gpu"

    def blocks(self):
        """The class's register blocks of the training convolutions (tuning.json's conv_train row)."""
        return tuning.values("conv_train", self.kind)

    def cutoffs(self):
        """The class's route cut-offs (tuning.json's conv_cutoffs row)."""
        return tuning.values("conv_cutoffs", self.kind)


@dataclass(frozen=True)
class ConvRoute:
    forward: str
    wgrad: str
    dgrad: str
    planes: Optional[tuple] = None  # (top, left, HP, WP): the input's zero-bordered planes the forward reads
    dy_planes: Optional[tuple] = None  # (top, left, HD, WD): dy's zero-bordered planes the backward reads
    takes_dy_planes: bool = False  # every read of dy in the backward is of dy_planes (Conv2d.padded_grad)
    winot: Optional[tuple] = None  # conv_winot.cl's (defines, options) for the forward
    winot_dx: Optional[tuple] = None  # ... for the data gradient, and with its result added (backward_into)
    winot_dx_add: Optional[tuple] = None
    winot_wgrad: Optional[tuple] = None  # winot_wgrad's (ROWS, TV, chunks, groups)
    stride2: tuple = ()  # the stride-2 kernels' build options (phases, pointwise2)
    direct: dict = field(default_factory=dict, compare=False)  # narrow / oc16 launch sizes and options
    pool_wgrad: Optional[tuple] = None  # (FW_C, FW_K) options of a pooled BatchNorm2d's weight gradient
    tier: str = "specialised"
    kernels: tuple = ()  # (family, kernel, options) of the specialised programs this route launches

    def __str__(self):
        return f"{self.forward} / {self.wgrad} / {self.dgrad}" + (" (generic tier)" if self.tier == "generic" else "")


def conv_route(s, d, generic=False):
    """The ConvRoute of convolution `s` (a ConvSpec) on device class `d` (a DeviceClass); `generic`:
    the generic tier's (the module's doc)."""
    if s.groups > 1 and s.groups == s.c:
        return _depthwise(s, d)
    if not d.cpu or s.groups > 1:
        return ConvRoute("gemm", "gemm", "gemm")
    blocks, cut = d.blocks(), d.cutoffs()
    k, st, p, dil = s.geometry
    mode = None
    if dil == 1 and k in blocks["RO"] and p <= k - 1:
        if st == 1 and min(s.w, s.ow) >= cut["direct_min_width"]:
            mode = "rows"
        elif st <= 2 and s.c * k * k <= cut["corrc_max_r"]:
            mode = "channels"
    phases = _stride2(s, d, (3, 2, 1, 1))
    if mode is not None and phases is None:
        return _direct(s, d, mode, generic)
    if phases is not None:
        dgrad = "corrt2p" if phases[:1] == ROWS1 and s.oh % 2 == 0 else "corrt2"
        if s.ow % blocks["WG2_VW"] == 0:
            return ConvRoute("phases", "wgrad2o" if blocks["WG2_OL"] else "wgrad2", dgrad, stride2=phases)
        return ConvRoute("phases", "gemm_unpad", dgrad, stride2=phases)
    pw = _stride2(s, d, (1, 2, 0, 1))
    if pw is not None:
        return ConvRoute("pointwise2", "pointwise2", "pointwise2", stride2=pw)
    return ConvRoute("gemm", "gemm_cols", "gemm_1x1" if s.geometry == (1, 1, 0, 1) else "col2im")


def _depthwise(s, d):
    k, st, p, dil = s.geometry
    fwd = "depthwise" if d.cpu and st in (1, 2) and dil == 1 else "depthwise_any"
    if d.cpu and dil == 1 and p <= k - 1 and st in (1, 2):
        dgrad = "depthwise" if st == 1 else "depthwise_s2"
    else:
        dgrad = "depthwise_any"
    return ConvRoute(fwd, fwd, dgrad)


def _stride2(s, d, geometry):
    """The stride-2 kernels' build options (16 consecutive output positions of a plane a vector) for a
    conv of `geometry`, or None: groups 1, a CPU, even planes whose output rows are a multiple of 16
    wide (ROWS1) or 8 wide and even in number (ROWS2); the class's blocks after them."""
    if s.geometry != geometry or s.groups != 1 or not d.cpu or s.h % 2 or s.w % 2:
        return None
    oh, ow = s.h // 2, s.w // 2
    rows = ROWS1 if ow % 16 == 0 else ROWS2 if ow == 8 and oh % 2 == 0 else None
    if rows is None:
        return None
    b = d.blocks()
    return rows + tuple(f"-D{name}={b[name]}" for name in ("PW_RM", "PW_WC", "CT2_RM"))


def bordered_extent(h, w, k, s, p, oh, ow):
    """(HP, WP) of zero-bordered planes holding an (h, w) input at (p, p) from which a k-tap read
    of stride s for oh x ow outputs (ow rounded up as its reader's vectors need) stays inside."""
    return max(s * (oh - 1) + k, h + p), max(s * (ow - 1) + k, w + p)


def input_planes(s, d, mode):
    """(top, left, HP, WP): the zero-bordered planes a "rows" or "channels" forward reads."""
    k, st, p, _ = s.geometry
    oh, ow = s.oh, s.ow
    if mode == "rows":
        rr = d.blocks()["RR"]
        return p, p, -(-oh // rr) * rr + k - 1, -(-ow // 16) * 16 + k - 1
    tc = d.blocks()["TC"]
    return (p, p) + bordered_extent(s.h, s.w, k, st, p, oh, -(-ow // tc) * tc)


def grad_planes(s, d, mode):
    """(top, left, HD, WD): the zero-bordered planes of dy that the stride-1 data-gradient
    correlations read after a "rows" or "channels" forward (dy at k - 1 - p)."""
    k, _, p, _ = s.geometry
    pd = k - 1 - p
    if mode == "rows":
        rr = d.blocks()["RR"]
        return pd, pd, -(-s.h // rr) * rr + k - 1, max(-(-s.w // 16) * 16 + k - 1, pd + -(-s.ow // 16) * 16)
    tc = d.blocks()["TC"]
    return pd, pd, s.h + k - 1, max(-(-s.w // tc) * tc + k - 1, pd + s.ow)


def winot_layout(s, d, transposed=False, add=False):
    """conv_winot.cl's (defines, build options) for this conv's forward (transposed: its data
    gradient), or None: undilated 3x3 stride-1 padding-1 convs whose planes its vectors tile, where
    NETCL_CPU_WINOT and the device allow it (float vectors of WINOT_TRAIN_LANES or more)."""
    if s.geometry != (3, 1, 1, 1) or s.groups != 1 or not d.cpu:
        return None
    if not winot_enabled(d.winot, d.lanes, WINOT_TRAIN_LANES):
        return None
    c, k = (s.k, s.c) if transposed else (s.c, s.k)
    return winot_plain(c, k, s.h, s.w, add, d.lanes)


def _direct(s, d, mode, generic):
    """The route of a "rows" or "channels" convolution (zero-bordered input planes)."""
    planes = input_planes(s, d, mode)
    fwd_layout = None if generic else winot_layout(s, d)
    wino_wgrad = None
    if s.stride == 1 and fwd_layout is not None and s.c % 4 == 0 and s.k % 4 == 0 \
            and planes[2:] == (s.h + 2, s.w + 2):
        dd = fwd_layout[0]
        nt = s.n * (s.h // 2 // dd["T"]) * dd["VPR"]
        wino_wgrad = winot_wgrad_groups(s.c, s.k, nt, d)
    dx_layout = None if generic or s.stride != 1 else winot_layout(s, d, transposed=True)
    takes = mode == "rows" or (s.stride == 1 and wino_wgrad is not None)
    dy_planes = grad_planes(s, d, mode) if takes or s.stride == 1 else None
    kernels = []
    if fwd_layout is not None:
        kernels += _winot_kernels(fwd_layout[1], stats=True)
    if dx_layout is not None:
        kernels += _winot_kernels(dx_layout[1]) + _winot_kernels(winot_layout(s, d, True, True)[1])
    if wino_wgrad is not None:
        extra = (f"-DTV={wino_wgrad[1]}", f"-DROWS={wino_wgrad[0]}")
        kernels += [("conv_winot", name, fwd_layout[1] + extra) for name in ("winot_wgrad", "winot_wgrad_finish")]
    direct, pool = {}, None
    if takes:
        wgrad = "winot" if wino_wgrad is not None else "rows"
        dgrad = "winot" if dx_layout is not None else mode
    else:
        wgrad = "gemm_planes"
        if s.stride == 1 and not generic:
            narrow = s.c * s.ks * s.ks <= d.cutoffs()["narrow_max_r"]
            direct = (narrow_launch(s, d) if narrow else oc16_launch(s, d, planes[3])) or {}
            if direct:
                wgrad = direct["kind"]
                kernels.append((FAMILY, direct["kernel"], direct["options"]))
            pool = _pool_wgrad(s)
        dgrad = ("winot" if dx_layout is not None else "channels") if s.stride == 1 else "corrt"
    return ConvRoute("winot" if fwd_layout is not None else mode, wgrad, dgrad, planes=planes, dy_planes=dy_planes,
                     takes_dy_planes=takes, winot=fwd_layout, winot_dx=dx_layout,
                     winot_dx_add=dx_layout and winot_layout(s, d, True, True), winot_wgrad=wino_wgrad,
                     direct=direct, pool_wgrad=pool, tier="generic" if generic else "specialised",
                     kernels=tuple(kernels))


def _winot_kernels(options, stats=False):
    out = [("conv_winot", "winot_weights", options), ("conv_winot", "conv_winot", options)]
    return out + ([("conv_winot", "conv_winot", options + ("-DSTATS=1",))] if stats else [])


def cpu_options(k, rm=8, ro=None, rr=2):
    """convtrain_cpu.cl's build options (only wgrad_cpu reads RO, only corr_cpu RM and RR; the
    others none of them: runtime.sources leaves what a kernel does not read out of its build)."""
    ro = {3: 3, 5: 1}.get(k, 1) if ro is None else ro
    return (f"-DKS={k}", f"-DRM={rm}", f"-DRR={rr}", f"-DRO={ro}")


def narrow_launch(s, d):
    """wgrad_narrow_cpu's launch (options, work-items, chunks, images per chunk, rows per run) for a
    stride-1 "channels" conv with few weights per output channel on rows of narrow_widths, or None."""
    cut = d.cutoffs()
    ckk = s.c * s.ks * s.ks
    if s.ow not in cut["narrow_widths"]:
        return None
    n, oc, oh, ow = s.n, s.k, s.oh, s.ow
    ro = max(1, min(oc, cut["narrow_acc"] // (ckk + 1)))
    blocks, want = -(-oc // ro), cut["narrow_items"] * d.compute_units
    items = min(blocks, want)  # a work-item takes every items-th block of output channels
    chunks = 1
    if blocks < want and n * oh * ow * ckk * oc >= cut["narrow_split"]:
        imgs = -(-n // min(n, -(-want // blocks)))
        chunks = -(-n // imgs)
    pair = ow in (4, 8) and oh % 2 == 0
    vw = 2 * ow if pair else ow  # a row one vector
    options = cpu_options(s.ks) + (f"-DWC={s.c}", f"-DWV={vw}", f"-DWRO={ro}") + (
        ("-DPAIR=1", f"-DWH={ow}") if pair else ())
    return {"kind": "narrow", "kernel": "wgrad_narrow_cpu", "options": options, "items": items, "chunks": chunks,
            "imgs": -(-n // chunks), "run": max(1, cut["narrow_run"] * vw // ow)}


def oc16_launch(s, d, xw):
    """wgrad_oc16_cpu's launch (options, work-items, tap groups) for input planes xw wide: an AVX-512
    class device, planes of 16k outputs in rows of oc16_widths; else None."""
    cut = d.cutoffs()
    if d.kind != "cpu16" or s.dilation != 1 or s.ow not in cut["oc16_widths"] or s.oh * s.ow % 16:
        return None
    taps = s.c * s.ks ** 2
    tgroups = -(-taps // 16)
    items = min(-(-s.k // 16) * tgroups, cut["oc16_items"] * d.compute_units)
    options = cpu_options(s.ks) + (f"-DXW={xw}", f"-DOW16={s.ow}")
    return {"kind": "oc16", "kernel": "wgrad_oc16_cpu", "options": options, "items": items, "tgroups": tgroups}


def _pool_wgrad(s):
    """bn_pool_bwd_wgrad_cpu's conv options where a pooled BatchNorm2d after this stride-1 "channels"
    conv can take its weight gradient (dy in rows of 8, an even number of them), else None."""
    if (s.stride, s.dilation, s.groups) != (1, 1, 1) or s.c * s.ks * s.ks > 27 or s.ow != 8 or s.oh % 2:
        return None
    return f"-DFW_C={s.c}", f"-DFW_K={s.ks}"


def _wgrad_row(tv):
    """conv_winot.cl's TVP: the vectors of a local-memory row of TV tile vectors."""
    return tv + 1 if tv % 64 == 0 else tv


def wgrad_rows(tv16, nt, t):
    """winot_wgrad's ROWS where a chunk of all 16 points holds tv16 of nt tile vectors (`t`: the
    tuning table's winot_wgrad row)."""
    return 4 if tv16 >= min(t["rows4_tv"], nt) else 1


def winot_wgrad_groups(c, k, nt, d):
    """(ROWS, TV, chunks, groups) of winot_wgrad for c -> k channels and nt tile vectors on device
    class d: work-items of all 16 points or (ROWS 1, a group of 4) one transformed row's 4 each,
    the tile vectors in chunks of TV (as many as a work-item's local memory holds), spread as evenly
    as whole chunks allow over the groups, each taking `chunks` of them; or None where its local
    memory or partial sums would not fit (the direct kernels take such convolutions)."""
    t = tuning.values("winot_wgrad", d.kind)
    budget = int(d.local_mem * t["share"])

    def fit(pts):  # the most tile vectors of PTS points of (C + K) x TVP float16, a vector more each
        tv = budget // (pts * 64 * (c + k))
        while tv >= 1 and pts * 64 * ((c + k) * _wgrad_row(tv) + 2) > budget:
            tv -= 1
        return tv

    rows = wgrad_rows(fit(16), nt, t)
    tv = fit(4 * rows)
    if tv < 1:
        return None
    per_group = 4 // rows  # work-items
    groups = max(1, min(nt // min(tv, t["min_tv"]),
                        -(-max(t["min_items"], t["items_per_cu"] * d.compute_units) // per_group)))
    chunks = -(-nt // (tv * groups))  # per group
    groups = min(groups, -(-nt // chunks))
    if 4 * groups * 16 * k * c > t["part_max"]:
        return None
    return rows, -(-nt // (chunks * groups)), chunks, groups  # the chunks evened out
