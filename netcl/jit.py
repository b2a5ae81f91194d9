"""The fused inference path: Sequential.eval() turns the layer list into a plan of stages.

    Conv2d [+ BatchNorm2d] [+ activation] [+ MaxPool2d(2)]  -> one conv kernel (BN folded)
    Linear [+ activation]                                   -> one linear kernel
    Flatten, Dropout                                        -> no kernel (a view / identity)
    anything else                                           -> the layer's own forward

The layer list stays the source of truth: a plan only reads it. Each kernel is generated for
its layer (netcl/kernels/fused.cl with shapes and constants as -D defines) and launch sizes
follow the device class (GPU: local-memory implicit GEMM; CPU/PoCL: Winograd F(2x2 or 4x4, 3x3)
for 3x3 stride-1 convolutions, explicit-vector direct convolution otherwise).

Device state is made on the first call for a given (context, input shape) and kept: programs,
folded weights, intermediate buffers, kernels with their arguments already set. Later calls of
that shape build nothing and allocate nothing but the output tensor (from the buffer pool):
they enqueue the launches and return without waiting. Folded weights are checked against the
`version` of every source tensor on each call and re-folded when any changed, so weights
changed after eval() (load_state_dict, an optimizer step) are never run stale.
"""
import numpy as np

from netcl.nn.basic import Dropout, Flatten
from netcl.nn.conv import Conv2d
from netcl.nn.linear import Linear
from netcl.nn.norm import BatchNorm2d
from netcl.nn.pool import MaxPool2d
from netcl.tensor import Tensor

# counters for tests and benchmarks: program builds, device buffers made, kernels launched
STATS = {"builds": 0, "buffers": 0, "launches": 0, "folds": 0}

def _act_of(layer):
    """(Act code, slope) of an activation layer, or None."""
    act = getattr(layer, "act", None)
    if act is None or layer is None:
        return None
    return int(act), float(layer.slope)


# ---------------------------------------------------------------------------------------
# Stages: pure descriptions of what runs, made from the layer list without any device.
class _Conv:
    def __init__(self, conv, bn, act, pool):
        self.conv, self.bn, self.act, self.pool = conv, bn, act, pool
        self.sources = [t for lay in (conv, bn) if lay is not None for _, t in lay.named_parameters() +
                        lay.named_buffers()]

    def folded(self):
        """(weight (K, C, k, k), bias (K,)) with the batch norm folded in, float32."""
        w = self.conv.weight.numpy().astype(np.float64)
        b = (self.conv.bias.numpy().astype(np.float64) if self.conv.bias is not None
             else np.zeros(self.conv.out_channels))
        if self.bn is not None:
            bn = self.bn
            scale = bn.weight.numpy() / np.sqrt(bn.running_var.numpy().astype(np.float64) + bn.eps)
            w = w * scale[:, None, None, None]
            b = (b - bn.running_mean.numpy()) * scale + bn.bias.numpy()
        return w.astype(np.float32), b.astype(np.float32)


class _Linear:
    def __init__(self, lin, act):
        self.lin, self.act = lin, act
        self.sources = [t for _, t in lin.named_parameters()]


class _View:  # Flatten: the next stage reads the same buffer
    sources = ()

    def __init__(self, layer):
        self.layer = layer


class _Layer:  # not fused: the layer's own forward (allocates per call)
    sources = ()

    def __init__(self, layer):
        self.layer = layer


def _stages(layers):
    out, i = [], 0
    layers = [x for x in layers if not isinstance(x, Dropout)]  # identity in eval mode
    while i < len(layers):
        lay = layers[i]
        nxt = lambda j: layers[i + j] if i + j < len(layers) else None  # noqa: E731
        if isinstance(lay, Conv2d):
            j, bn, act, pool = 1, None, None, None
            if isinstance(nxt(j), BatchNorm2d) and nxt(j).num_features == lay.out_channels:
                bn, j = nxt(j), j + 1
            if _act_of(nxt(j)) is not None:
                act, j = _act_of(nxt(j)), j + 1
            p = nxt(j)
            if isinstance(p, MaxPool2d) and p.kernel_size == 2 and p.stride == 2 and p.padding == 0:
                pool, j = p, j + 1
            out.append(_Conv(lay, bn, act, pool))
            i += j
        elif isinstance(lay, Linear):
            act = _act_of(nxt(1))
            out.append(_Linear(lay, act))
            i += 2 if act is not None else 1
        elif isinstance(lay, Flatten):
            out.append(_View(lay))
            i += 1
        else:
            out.append(_Layer(lay))
            i += 1
    return out


def plan_fused(model):
    """A FusedPlan for `model` (a Sequential), or None when no stage would fuse."""
    stages = _stages([layer for _, layer in model.chain()])
    if not any(isinstance(s, (_Conv, _Linear)) for s in stages):
        return None
    return FusedPlan(model, stages)


# ---------------------------------------------------------------------------------------
# Launch configuration per device class.
def _gpu_conv_config(K, R, nout, pool, n_cu):
    """(BM, BN, RM, RN, BK, SPLIT, RCHUNK) for the local-memory kernel."""
    BK, RN = 16, 4
    BM = 64 if K > 32 else (32 if K > 16 else 16)
    RM = 4 if BM >= 32 else 2
    BN = 64
    tiles = -(-K // BM) * -(-nout * (4 if pool else 1) // BN)
    rtiles = -(-R // BK)
    split = 1
    import os

    target = 2 * n_cu
    if tiles < target and os.environ.get("NETCL_GPU_SPLIT", "1") != "0":  # "0": no split-K (tuning)
        split = max(1, min(-(-target // tiles), rtiles // 4, 64))
    rchunk = -(-rtiles // split) * BK
    split = -(-R // rchunk)
    return BM, BN, RM, RN, BK, split, rchunk


def _cpu_conv_config(K, uw, ohu):
    """(VW, RM, RR) for the vector kernel, or None when the shape does not suit it.
    Sized for 16 vector registers (AVX2): RR x RM x VW/8 accumulators."""
    import os

    maxvw, rm = 16, 3  # measured best on a 2-core AVX2 PoCL (tools/benchmark_onnx_vs_native.py)
    if os.environ.get("NETCL_CPU_CONV"):  # tuning: "maxvw,rm"
        maxvw, rm = (int(v) for v in os.environ["NETCL_CPU_CONV"].split(","))
    vw = next((v for v in (16, 8, 4, 2) if v <= maxvw and uw % v == 0), None)
    if vw is None or ohu % 2:
        return None
    return vw, min(rm, -(-K // 2) * 2) if K >= 2 else 1, 2


def _cpu_wino_tile(K, n, oh, ow):
    """Winograd output tile for the CPU: 4 (4x fewer multiplies than direct, but 2.25x the
    transformed weights of tile 2, streamed once per group of tiles) where there are enough
    output channels and 4x4 tiles to pay for it, else 2; 0 = direct (NETCL_CPU_WINO=0|2|4 forces)."""
    import os

    if os.environ.get("NETCL_CPU_WINO"):
        return int(os.environ["NETCL_CPU_WINO"])
    return 4 if K >= 32 and n * -(-oh // 4) * -(-ow // 4) >= 32 else 2


def _cpu_wino_config(K, C, wm, ntile, n_cu):
    """(TB, RV, TT, KBW, KBN) for the Winograd kernel: TB tiles x RV float8 channel vectors per
    register block (TB * RV accumulators), TT tiles per work-item, KBW of the KBN channel
    blocks per work-item."""
    import os

    tb, rv = 3, (4 if K % 32 == 0 else 2)  # measured on a 2-core AVX2 PoCL
    # transformed weights past L2 size: more tiles per work-item, so fewer passes stream them
    nsub = 6 if (wm + 2) ** 2 * C * K * 4 > (2 << 20) else 2
    while nsub > 1 and (wm + 2) ** 2 * C * tb * nsub * 4 > (1 << 20):  # private inputs stay <= 1 MB
        nsub -= 1
    if os.environ.get("NETCL_CPU_WINO_BLOCK"):  # tuning: "tb,rv,nsub"
        tb, rv, nsub = (int(v) for v in os.environ["NETCL_CPU_WINO_BLOCK"].split(","))
    tt = tb * nsub
    kbn = -(-K // (8 * rv))
    groups = -(-ntile // tt)
    split = max(1, min(kbn, -(-4 * n_cu // groups)))  # enough work-items for every core
    kbw = -(-kbn // split)
    return tb, rv, tt, kbw, kbn


# Winograd weight transforms G (WA x 3) for output tiles of 2 and 4 (points 0, +-1, +-2, inf);
# the matching input and output transforms are WIN_IN / WIN_OUT in fused.cl
_WINO_G = {2: np.array([[1, 0, 0], [1 / 2, 1 / 2, 1 / 2], [1 / 2, -1 / 2, 1 / 2], [0, 0, 1]]),
           4: np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
                        [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]])}


def _largest_divisor(n, limit):
    return max(d for d in range(1, min(n, limit) + 1) if n % d == 0)


# ---------------------------------------------------------------------------------------
class FusedPlan:
    """Callable: plan(x) -> Tensor, the eval-mode forward of the model through fused kernels."""

    def __init__(self, model, stages):
        self.model, self.stages = model, stages
        self._dev = {}  # context -> _Weights
        self._exe = {}  # (context, input shape) -> _Executable

    def __repr__(self):
        names = []
        for s in self.stages:
            if isinstance(s, _Conv):
                names.append("+".join(x for x in ("Conv2d", s.bn and "BatchNorm2d", s.act and f"act{s.act[0]}",
                                                   s.pool and "MaxPool2d") if x))
            elif isinstance(s, _Linear):
                names.append("Linear" + (f"+act{s.act[0]}" if s.act else ""))
            else:
                names.append(type(s.layer).__name__)
        return f"FusedPlan({', '.join(names)})"

    def launches(self, x_shape):
        """Kernel launches per forward for an input of x_shape (fused stages only)."""
        return sum(1 for s in self.stages if isinstance(s, (_Conv, _Linear)))

    def infer(self, x, queue=None):
        """Host array in, host array out: the whole round trip through pinned staging buffers
        (the upload is cut in chunks so that copying into pinned memory overlaps the transfer).
        Returns a new float32 numpy array; one wait per call."""
        from netcl.runtime import default_queue

        q = queue if queue is not None else default_queue()
        x = np.ascontiguousarray(x, np.float32)
        key = (q.context.int_ptr, x.shape)
        exe = self._exe.get(key)
        if exe is None:
            exe = self._exe[key] = _Executable(self, q, x.shape)
        return exe.infer(x)

    def __call__(self, x):
        if x.queue is None:
            from netcl.runtime import default_queue

            x.to(default_queue())
        q = x.queue
        key = (q.context.int_ptr, x.shape)
        exe = self._exe.get(key)
        if exe is None:
            exe = self._exe[key] = _Executable(self, q, x.shape)
        return exe.run(x)


_pool = None


def _copy_pool():
    """Threads for host copies into pinned staging memory (numpy releases the GIL while copying)."""
    global _pool
    if _pool is None:
        import os
        from concurrent.futures import ThreadPoolExecutor

        _pool = ThreadPoolExecutor(max(1, min(8, (os.cpu_count() or 1))), thread_name_prefix="netcl-copy")
    return _pool


class _StageRun:
    """One stage's device side for one input shape: kernel, sizes, buffers, weight refresh."""
    kernel = None


class _Executable:
    def __init__(self, plan, q, shape):
        import pyopencl as cl

        from netcl.runtime import device_class

        self._cl = cl
        self.q, self.shape = q, tuple(shape)
        import os

        # NETCL_JIT_CLASS=gpu|cpu overrides the kernel family (tests run the GPU kernels on PoCL)
        self.gpu = (os.environ.get("NETCL_JIT_CLASS") or device_class(q)) == "gpu"
        self.n_cu = q.device.max_compute_units
        stages = plan.stages
        # output border each stage must leave: the padding of the conv it feeds directly
        self.runs = []
        shape = tuple(shape)
        in_border = 0
        for idx, st in enumerate(stages):
            nxt = next((s for s in stages[idx + 1:] if not isinstance(s, _View)), None)
            if isinstance(st, _View):
                shape = st.layer.output_shape(shape)
                self.runs.append(("view", shape))
                continue
            if isinstance(st, _Layer):
                shape = st.layer.output_shape(shape)
                self.runs.append(("layer", st.layer))
                in_border = 0
                continue
            feeds_conv = isinstance(nxt, _Conv) and stages.index(nxt) == idx + 1
            if isinstance(st, _Conv):
                out_border = nxt.conv.padding if feeds_conv else 0
                r, shape = self._conv(st, shape, in_border, out_border)
                in_border = out_border
            else:
                r, shape = self._linear(st, shape)
                in_border = 0
            self.runs.append(("fused", r))
        self.out_shape = shape
        self._last_in = None
        self._versions = None
        self.refresh(force=True)

    # -- building ------------------------------------------------------------------------
    def _build(self, opts, name, extra=()):
        from netcl.runtime import build, kernel_source

        STATS["builds"] += 1  # counted whether or not the caches answer: a call here is a miss of ours
        prog = build(self.q.context, kernel_source("fused"), [f"-D{k}={v}" for k, v in opts.items()] + list(extra))
        import pyopencl as cl

        return cl.Kernel(prog, name)

    def _buffer(self, nbytes, zero=False):
        cl = self._cl
        STATS["buffers"] += 1
        buf = cl.Buffer(self.q.context, cl.mem_flags.READ_WRITE, max(int(nbytes), 4))
        if zero:
            cl.enqueue_fill_buffer(self.q, buf, np.float32(0), 0, max(int(nbytes), 4))
        return buf

    def _conv(self, st, shape, ib, ob):
        conv = st.conv
        n, c, h, w = shape
        _, k, oh, ow = conv.output_shape(shape)
        ks, s, p = conv.kernel_size, conv.stride, conv.padding
        ib = ib if ib == p else 0
        pool = st.pool is not None
        poh, pow_ = (oh // 2, ow // 2) if pool else (oh, ow)
        act, slope = st.act if st.act else (0, 0.0)
        opts = dict(C=c, H=h, W=w, K=k, KS=ks, STRIDE=s, PAD=p, OH=oh, OW=ow, POOL=2 if pool else 1, ACT=act,
                    SLOPE=repr(np.float32(slope).item()) + "f", IPB=ib, OPB=ob)
        R = c * ks * ks
        r = _StageRun()
        r.stage, r.kind = st, "conv"
        out_shape = (n, k, poh, pow_)
        r.out_shape = out_shape
        r.out_border = ob
        out_bytes = 4 * (n * k * (poh + 2 * ob) * (pow_ + 2 * ob) + 16)
        uw, ohu = (2 * pow_, 2 * poh) if pool else (ow, oh)
        cpu_cfg = None if self.gpu else _cpu_conv_config(k, uw, ohu)
        import os

        wm = 0 if self.gpu or ks != 3 or s != 1 else _cpu_wino_tile(k, n, ohu, uw)
        if wm:
            thn, twn = -(-ohu // wm), -(-uw // wm)
            ntile = n * thn * twn
            tb, rv, tt, kbw, kbn = _cpu_wino_config(k, c, wm, ntile, self.n_cu)
            check = int(ib != p or ohu % wm or uw % wm)  # the last tiles read past the stored border
            opts.update(WM=wm, TB=tb, TT=tt, RV=rv, KBW=kbw, KBN=kbn, THN=thn, TWN=twn, NTILE=ntile, CHECK=check)
            r.kernel = self._build(opts, "conv_wino", ["-cl-mad-enable"])
            r.gsize, r.lsize = (-(-ntile // tt), -(-kbn // kbw), 1), (1, 1, 1)
            r.layout = ("wino", kbn, 8 * rv, c, wm)
            r.w_buf = self._buffer(4 * kbn * 8 * rv * (wm + 2) ** 2 * c)
            r.b_buf = self._buffer(4 * kbn * 8 * rv)
            r.args = [None, r.w_buf, r.b_buf, None]
            r.in_idx, r.out_idx = 0, 3
        elif cpu_cfg is not None and s in (1, 2) and not (s == 2 and cpu_cfg[0] > 8):
            vw, rm, rr = cpu_cfg
            kb = -(-k // rm)
            gs = (uw // vw, ohu // rr, n * kb)
            lx = gs[0] if gs[0] <= 16 else _largest_divisor(gs[0], 16)
            ly = _largest_divisor(gs[1], max(1, 32 // lx))
            opts.update(VW=vw, VW2=2 * vw, VWH=vw // 2, RM=rm, RR=rr, KB=kb, LX=lx, LY=ly)
            r.kernel = self._build(opts, "conv_cpu", ["-cl-mad-enable"])
            r.gsize, r.lsize = gs, (lx, ly, 1)
            r.layout = ("cpu", kb, rm, R)
            r.w_buf = self._buffer(4 * kb * rm * R)
            r.b_buf = self._buffer(4 * kb * rm)
            r.args = [None, r.w_buf, r.b_buf, None]
            r.in_idx, r.out_idx = 0, 3
        else:
            nout = n * poh * pow_
            if self.gpu:
                BM, BN, RM, RN, BK, split, rchunk = _gpu_conv_config(k, R, nout, pool, self.n_cu)
            else:  # generic shapes on the CPU: the tiled kernel, unsplit
                BM, BN, RM, RN, BK = 16 if k <= 16 else 32, 64, 2 if k <= 16 else 4, 4, 16
                rchunk, split = -(-R // BK) * BK, 1
            nt = (BN // RN) * (BM // RM)
            opts.update(BM=BM, BN=BN, RM=RM, RN=RN, BK=BK, SPLIT=split, RCHUNK=rchunk)
            r.kernel = self._build(opts, "conv_gpu")
            kp = -(-k // BM) * BM
            rp = split * rchunk
            gx = -(-nout * (4 if pool else 1) // BN)
            gy = kp // BM
            r.gsize, r.lsize = (gx * nt, gy, split), (nt, 1, 1)
            r.layout = ("gpu", kp, rp, R)
            r.w_buf = self._buffer(4 * kp * rp)
            r.b_buf = self._buffer(4 * kp)
            part = self._buffer(4 * split * gx * gy * BM * BN) if split > 1 else self._buffer(4)
            counters = self._buffer(4 * gx * gy, zero=True)
            r.args = [np.int32(nout), None, r.w_buf, r.b_buf, None, part, counters]
            r.in_idx, r.out_idx = 1, 4
        r.out_bytes = out_bytes
        return r, out_shape

    def _linear(self, st, shape):
        lin = st.lin
        out_shape = lin.output_shape(shape)
        rows = int(np.prod(shape[:-1]))
        act, slope = st.act if st.act else (0, 0.0)
        lj = 4
        outp = -(-lin.out_features // lj) * lj
        opts = dict(IN_F=lin.in_features, OUT_F=lin.out_features, OUT_P=outp, LJ=lj, ACT=act,
                    SLOPE=repr(np.float32(slope).item()) + "f")
        r = _StageRun()
        r.stage, r.kind = st, "linear"
        r.kernel = self._build(opts, "linear")
        lx = 64 if self.gpu else 16
        r.gsize = (-(-(outp // lj) // lx) * lx, rows)
        r.lsize = (lx, 1)
        r.layout = ("linear", outp)
        r.w_buf = self._buffer(4 * lin.in_features * outp)
        r.b_buf = self._buffer(4 * outp)
        r.args = [np.int32(rows), None, r.w_buf, r.b_buf, None]
        r.in_idx, r.out_idx = 1, 4
        r.out_shape, r.out_border = out_shape, 0
        r.out_bytes = 4 * (rows * lin.out_features)
        return r, out_shape

    # -- weights -------------------------------------------------------------------------
    def _sources(self):
        return [t for kind, r in self.runs if kind == "fused" for t in r.stage.sources]

    def refresh(self, force=False):
        """Re-fold and upload the weights of every stage whose source tensors changed."""
        vers = [(id(t), t.version) for t in self._sources()]
        if not force and vers == self._versions:
            return
        cl = self._cl
        STATS["folds"] += 1
        for kind, r in self.runs:
            if kind != "fused":
                continue
            if r.kind == "conv":
                w, b = r.stage.folded()
                k, c, kh, kw = w.shape
                R = c * kh * kw
                w2 = w.reshape(k, R)
                if r.layout[0] == "wino":  # U = G g G^T, packed [K block][transform point][C][KV]
                    _, kbn, kv, _, wm = r.layout
                    g = _WINO_G[wm]
                    wa = wm + 2
                    u = np.zeros((kbn * kv, c, wa, wa))
                    u[:k] = np.einsum("ai,kcij,bj->kcab", g, w.astype(np.float64), g)
                    host_w = np.ascontiguousarray(u.reshape(kbn, kv, c, wa * wa).transpose(0, 3, 2, 1), np.float32)
                    host_b = np.zeros(kbn * kv, np.float32)
                elif r.layout[0] == "cpu":
                    _, kb, rm, _ = r.layout
                    wp = np.zeros((kb * rm, R), np.float32)
                    wp[:k] = w2
                    host_w = np.ascontiguousarray(wp.reshape(kb, rm, R).transpose(0, 2, 1))
                    host_b = np.zeros(kb * rm, np.float32)
                else:
                    _, kp, rp, _ = r.layout
                    host_w = np.zeros((rp, kp), np.float32)
                    host_w[:R, :k] = w2.T
                    host_b = np.zeros(kp, np.float32)
                host_b[:k] = b
            else:
                lin = r.stage.lin
                outp = r.layout[1]
                host_w = np.zeros((lin.in_features, outp), np.float32)
                host_w[:, :lin.out_features] = lin.weight.numpy()
                host_b = np.zeros(outp, np.float32)
                if lin.bias is not None:
                    host_b[:lin.out_features] = lin.bias.numpy()
            cl.enqueue_copy(self.q, r.w_buf, host_w, is_blocking=True)
            cl.enqueue_copy(self.q, r.b_buf, host_b, is_blocking=True)
        self._versions = vers

    # -- running -------------------------------------------------------------------------
    def _prepare(self, x):
        """Bind buffers between stages (first call of this shape)."""
        self.steps = []
        # the stage whose buffer is the model's output (only views after it) writes a fresh tensor
        tail = len(self.runs)
        while tail > 0 and self.runs[tail - 1][0] == "view":
            tail -= 1
        last = self.runs[tail - 1][1] if tail and self.runs[tail - 1][0] == "fused" else None
        for kind, r in self.runs:
            if kind == "fused":
                if r is not last:
                    r.out_buf = self._buffer(r.out_bytes, zero=r.out_border > 0)
                else:
                    r.out_buf = None  # the model output: a fresh pool buffer per call
                for i, a in enumerate(r.args):
                    if a is not None:
                        r.kernel.set_arg(i, a)
                if r.out_buf is not None:
                    r.kernel.set_arg(r.out_idx, r.out_buf)
                r.bound_in = None

    def _staging(self):
        """Pinned host buffers (mapped once) and a device input buffer for infer()."""
        cl, q = self._cl, self.q
        mf = cl.mem_flags
        nin = int(np.prod(self.shape)) * 4
        nout = int(np.prod(self.out_shape)) * 4
        self.pin_in = self._buffer(nin) if False else cl.Buffer(q.context, mf.READ_WRITE | mf.ALLOC_HOST_PTR, nin)
        self.pin_out = cl.Buffer(q.context, mf.READ_WRITE | mf.ALLOC_HOST_PTR, max(nout, 4))
        STATS["buffers"] += 2
        self.host_in, _ = cl.enqueue_map_buffer(q, self.pin_in, cl.map_flags.WRITE | cl.map_flags.READ, 0,
                                                self.shape, np.float32)
        self.host_out, _ = cl.enqueue_map_buffer(q, self.pin_out, cl.map_flags.WRITE | cl.map_flags.READ, 0,
                                                 self.out_shape, np.float32)
        self.dev_in = Tensor(self.shape, q, self._buffer(nin))
        flat = self.host_in.reshape(-1)
        step = max(1 << 18, -(-flat.size // 8))  # >= 1 MB chunks, at most 8
        self.chunks = [(i, min(i + step, flat.size)) for i in range(0, flat.size, step)]

    def infer(self, x):
        cl, q = self._cl, self.q
        if not hasattr(self, "host_in"):
            self._staging()
        src, dst = x.reshape(-1), self.host_in.reshape(-1)
        if len(self.chunks) > 1:  # copy chunks into pinned memory on several threads; send each when ready
            pool = _copy_pool()
            done = [pool.submit(np.copyto, dst[a:b], src[a:b]) for a, b in self.chunks]
        for i, (a, b) in enumerate(self.chunks):
            if len(self.chunks) > 1:
                done[i].result()
            else:
                np.copyto(dst[a:b], src[a:b])
            cl.enqueue_copy(q, self.dev_in.buf, dst[a:b], dst_offset=4 * a, is_blocking=False)
        y = self.run(self.dev_in)
        cl.enqueue_copy(q, self.host_out, y.buf, is_blocking=True)
        return self.host_out.copy()

    def run(self, x):
        from netcl.runtime import alloc

        if not hasattr(self, "steps"):
            self._prepare(x)
        self.refresh()
        cl, q = self._cl, self.q
        cur, cur_shape = x.buf, x.shape
        out_tensor = None
        enqueue = cl.enqueue_nd_range_kernel
        n_launch = 0
        for kind, r in self.runs:
            if kind == "fused":
                if r.bound_in is not cur:
                    r.kernel.set_arg(r.in_idx, cur)
                    r.bound_in = cur
                if r.out_buf is None:
                    out_tensor = Tensor(r.out_shape, q, alloc(q, r.out_bytes))
                    r.kernel.set_arg(r.out_idx, out_tensor.buf)
                    cur = out_tensor.buf
                else:
                    cur = r.out_buf
                enqueue(q, r.kernel, r.gsize, r.lsize)
                n_launch += 1
                cur_shape = r.out_shape
            elif kind == "view":
                cur_shape = r
            else:  # an unfused layer: it takes and returns Tensors
                t = Tensor(cur_shape, q, cur) if not isinstance(cur, Tensor) else cur
                y = r(t)
                cur, cur_shape = y.buf, y.shape
                out_tensor = y
        STATS["launches"] += n_launch
        if out_tensor is None or out_tensor.buf is not cur:
            out_tensor = Tensor(cur_shape, q, cur)  # ends in a view of an intermediate (rare)
        elif out_tensor.shape != cur_shape:
            out_tensor = out_tensor.reshape(cur_shape)
        return out_tensor.mark_written()
