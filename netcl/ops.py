"""Thin launchers for the kernels in netcl/kernels: Python picks shapes and launch sizes,
OpenCL does the arithmetic. Every function takes device Tensors and enqueues without waiting."""
import math
import threading
from collections import namedtuple

import numpy as np

import netcl.runtime as runtime
from netcl import tuning
from netcl.runtime import alloc, device_class, kernels, recorder
from netcl.tensor import Tensor

_launch_lock = threading.Lock()
_LOCAL = 64  # fixed 1-D work-group size: PoCL recompiles for every new local size


def _args(args):
    """Kernel arguments: a Tensor's buffer; numbers go as they are (runtime.kernels declares each
    kernel's scalar types from its signature, and pyopencl converts to them). Exact type tests
    first: this runs for every argument of every launch, and they cost less than isinstance (a
    GPU training step is bound by the host's time per launch)."""
    out = []
    for a in args:
        t = type(a)
        if t is Tensor:
            buf = a._st.buf
            out.append(buf if buf is not None else a.buf)  # a host-only tensor: .buf says so
        elif t is bool or t is np.bool_:
            out.append(int(a))
        elif t is int or t is float or a is None:
            out.append(a)
        else:  # a numpy number, a buffer, or a Tensor subclass
            out.append(a.buf if isinstance(a, Tensor) else a)
    return out


def _enqueue(queue, k, gsize, lsize, args):
    """Set `args` on the (cached, shared) kernel and enqueue it, under one lock: another thread's
    launch of the same kernel object must not change the arguments in between."""
    import pyopencl as cl

    args = _args(args)
    rec = recorder()
    if rec is not None:  # a training step being recorded (netcl.trainstep)
        rec.launch(k, gsize, lsize, args)
    with _launch_lock:
        k.set_args(*args)
        return cl.enqueue_nd_range_kernel(queue, k, gsize, lsize)


def launch(queue, family, name, gsize, lsize, *args, options=()):
    """Enqueue kernel `name` of `family` (built with `options`); the global size is rounded up to the local size."""
    k = kernels(queue, family, options)[name]
    gsize = tuple(-(-g // l) * l for g, l in zip(gsize, lsize))
    return _enqueue(queue, k, gsize, lsize, args)


def varies(indices, fn):
    """The launch just made takes, at argument `indices`, values that change every step (a dropout
    seed, Adam's bias corrections): fn() gives the next ones, in order. A training step being
    recorded (netcl.trainstep) calls fn() before each replay instead of repeating the recorded
    values; otherwise this does nothing."""
    rec = recorder()
    if rec is not None:
        rec.vary(indices, fn)


def softmax_fwd(q, outer, D, inner, x, y):
    """y = softmax of x (outer, D, inner) over D: on CPUs a run of lines per work-item, contiguous
    lines in vectors (norm_cpu.cl); elsewhere a work-item per line (norm.cl)."""
    if is_cpu(q):
        rows, items = cpu_rows(outer * inner, 3 * D)
        launch(q, "norm_cpu", "softmax_fwd_cpu", (items,), (1,), outer, D, inner, x, y, outer * inner, rows)
    else:
        launch1d(q, "norm", "softmax_fwd", outer * inner, outer, D, inner, x, y)
    return y.mark_written()


def softmax_bwd(q, outer, D, inner, y, dy, dx, scale):
    """dx = y * (dy - sum(dy * y)) * scale over D, as softmax_fwd runs its lines."""
    if is_cpu(q):
        rows, items = cpu_rows(outer * inner, 2 * D)
        launch(q, "norm_cpu", "softmax_bwd_cpu", (items,), (1,), outer, D, inner, y, dy, dx, float(scale),
               outer * inner, rows)
    else:
        launch1d(q, "norm", "softmax_bwd", outer * inner, outer, D, inner, y, dy, dx, float(scale))
    return dx.mark_written()


def launch_rows(queue, family, name, n, rows_of, length, *args, options=()):
    """Enqueue kernel `name` over n elements, on CPUs as its `name`_cpu variant over their rows_of
    rows (about `length` floats each), a run of rows per work-item (the row count and the run its
    last two arguments): per-element index arithmetic cost PoCL more than the moves, and a
    work-group per 64 elements a dispatch each. Elsewhere one work-item per element (launch1d)."""
    if is_cpu(queue):
        rows, items = cpu_rows(rows_of, length)
        return launch(queue, family, name + "_cpu", (items,), (1,), *args, rows_of, rows, options=options)
    return launch1d(queue, family, name, n, *args, options=options)


def launch1d(queue, family, name, n, *args, options=()):
    """launch() over n work-items (at least one) in groups of the default local size."""
    return launch(queue, family, name, (max(n, 1),), (_LOCAL,), *args, options=options)


_MAX_ELEMENTS = 2**31 - 1  # kernels index with 32-bit ints
_alloc_limits = {}  # device -> max_mem_alloc_size (a driver query: once, not per allocation)


def _max_alloc(q):
    limit = _alloc_limits.get(q.device.int_ptr)
    if limit is None:
        limit = _alloc_limits[q.device.int_ptr] = q.device.max_mem_alloc_size
    return limit


def check_size(q, shape, nbytes=None):
    """ValueError unless a float32 buffer of `shape` (stored in `nbytes`, default 4 per element) fits
    the kernels' 32-bit indices and the device's largest allocation."""
    size = math.prod(int(s) for s in shape)  # np.prod costs ~4 us a call: this runs for every new tensor
    nbytes = 4 * size if nbytes is None else int(nbytes)
    if max(size, nbytes // 4) > _MAX_ELEMENTS or nbytes > _max_alloc(q):
        raise ValueError(f"a tensor of shape {tuple(shape)} ({nbytes / 2**30:.2f} GiB) is too large: netcl's "
                         f"kernels index up to 2**31 - 1 elements and {q.device.name.strip()} allocates at most "
                         f"{q.device.max_mem_alloc_size / 2**30:.2f} GiB per buffer; use a smaller batch")


def new(like_or_queue, shape):
    """An uninitialised device tensor on the queue (or the queue of a tensor)."""
    q = like_or_queue.queue if isinstance(like_or_queue, Tensor) else like_or_queue
    check_size(q, shape)
    return Tensor.empty(q, shape)


def dummy(queue):
    """A 4-byte buffer for an unused pointer argument."""
    return alloc(queue, 4)


# -- element-wise ------------------------------------------------------------------------
def act_fwd(act, x, slope=0.0, out=None):
    """y = act(x) for a netcl.act.Act code."""
    y = out if out is not None else new(x, x.shape)
    launch1d(x.queue, "pointwise", "act_fwd", x.size, x.size, int(act), float(slope), x, y)
    return y.mark_written()


def act_bwd(act, saved, dy, slope=0.0):
    """dx = dy * act'(.) from what the forward saved (the output where act.saves_output, else the input)."""
    dx = new(dy, dy.shape)
    launch1d(dy.queue, "pointwise", "act_bwd", dy.size, dy.size, int(act), float(slope), saved, dy, dx)
    return dx.mark_written()


def is_cpu(q):
    """Whether the queue's device runs the CPU kernel variants (ops.config_class, so tests can force
    the GPU ones on a CPU device)."""
    return config_class(q) != "gpu"


# CPU element-wise kernels (act_cpu.cl, norm_cpu.cl, ...): one work-item (local size 1) per chunk
# of a tensor, in float16 vectors. PoCL runs each work-group as a task (about a microsecond of
# overhead): chunks of 1-16K floats, at least _CPU_CHUNKS of them where the tensor allows.
_CPU_CHUNK_MIN, _CPU_CHUNK_MAX, _CPU_CHUNKS = 1024, 16384, 32


def cpu_chunk(n):
    """(floats per work-item, work-items) of a chunked CPU kernel over n elements; chunks are
    whole float16 vectors."""
    chunk = min(_CPU_CHUNK_MAX, max(_CPU_CHUNK_MIN, -(-n // _CPU_CHUNKS)))
    chunk = -(-chunk // 16) * 16
    return chunk, max(1, -(-n // chunk))


def cpu_rows(nrows, length):
    """(rows per work-item, work-items) of a CPU kernel over nrows rows (planes, lines) of about
    `length` floats of work each: cpu_chunk's sizes in whole rows."""
    length = max(length, 1)
    rows = max(1, cpu_chunk(nrows * length)[0] // length)
    return rows, max(1, -(-nrows // rows))


def act_fwd_cpu(act, x, slope=0.0, out=None):
    """act_fwd on a CPU device: act_cpu.cl, built for this activation."""
    y = out if out is not None else new(x, x.shape)
    chunk, items = cpu_chunk(x.size)
    launch(x.queue, "act_cpu", "act_fwd_cpu", (items,), (1,), x.size, chunk, float(slope), x, y,
           options=(f"-DACT_KIND={int(act)}",))
    return y.mark_written()


def act_bwd_cpu(act, saved, dy, slope=0.0):
    """act_bwd on a CPU device: act_cpu.cl, built for this activation."""
    dx = new(dy, dy.shape)
    chunk, items = cpu_chunk(dy.size)
    launch(dy.queue, "act_cpu", "act_bwd_cpu", (items,), (1,), dy.size, chunk, float(slope), saved, dy, dx,
           options=(f"-DACT_KIND={int(act)}",))
    return dx.mark_written()


# An activation a Residual ran in its sum (Residual._act), as its gradient needs it: its code
# (netcl.act.Act), slope and output; the layer after the block takes it into its dx (backward_act)
ActGrad = namedtuple("ActGrad", ["code", "slope", "out"])


def through_act(dx, act):
    """dx through the gradient of `act` (an ActGrad), for a layer that could not take it into its
    own pass: act_bwd_cpu (a new tensor); dx itself for None."""
    return dx if act is None else act_bwd_cpu(act.code, act.out, dx, act.slope)


def dx_act_options(act):
    """The build option of a kernel that takes `act` (an ActGrad) into its dx (DX_ACT), none for None."""
    return () if act is None else (f"-DDX_ACT={int(act.code)}",)


def dx_act_args(q, act):
    """The (output, slope) kernel arguments of `act` (an ActGrad) for DX_ACT, or unused ones for None."""
    return (dummy(q), 0.0) if act is None else (act.out, float(act.slope))


def add(a, b, out=None):
    """a + b on the device (blocks.cl); `out` may be a (a sum into it)."""
    y = out if out is not None else new(a, a.shape)
    launch1d(a.queue, "blocks", "add", a.size, a.size, a, b, y)
    return y.mark_written()


def mul(a, b):
    """a * b element-wise, a new Tensor (a and b of one shape: no broadcasting)."""
    y = new(a, a.shape)
    launch1d(a.queue, "pointwise", "mul", a.size, a.size, a, b, y)
    return y.mark_written()


# -- GEMM --------------------------------------------------------------------------------
# GPUs run gemm.cl's gemm_tile for every layout, with the tuning table's gemm_gpu sizes
# (netcl.tuning); CPUs run gemm_cpu.cl (_gemm_cpu), gemm.cl giving them only sum_axis, permute3
# and gemm_reduce. A tile side halves, down to 4 register blocks, while half still covers M or N
# (weight gradients are small); split-K where the tiles alone would leave the device idle.
_OPTION_KEYS = ("BM", "BN", "BK", "RM", "RN")


_config_class = {}  # device int_ptr -> config_class()
_compute_units = {}  # device int_ptr -> max_compute_units (a driver query: once)
_local_mem = {}  # device int_ptr -> local_mem_size (the same)
_float_lanes = {}  # device int_ptr -> runtime.device_lanes (driver queries: once)


def _device_value(cache, q, attr):
    """The queue's device's `attr`, asked of the driver once per device and kept in `cache`."""
    value = cache.get(q.device.int_ptr)
    if value is None:
        value = cache[q.device.int_ptr] = getattr(q.device, attr)
    return value


def compute_units(q):
    """The queue's device's compute units (cached: a driver query)."""
    return _device_value(_compute_units, q, "max_compute_units")


def float_lanes(q):
    """netcl.runtime.float_lanes of the queue's device: $NETCL_FLOAT_LANES (read per call), else what
    the device can do (runtime.device_lanes, cached; PoCL: 16 on AVX-512, 8 on AVX2)."""
    lanes = runtime.lanes_override()
    if lanes is None:
        lanes = _float_lanes.get(q.device.int_ptr)
        if lanes is None:
            lanes = _float_lanes[q.device.int_ptr] = runtime.device_lanes(q.device)
    return lanes


def local_mem(q):
    """The queue's device's local memory per work-group in bytes (cached); PoCL's CPU devices give
    about a core's L2 cache."""
    return _device_value(_local_mem, q, "local_mem_size")


def config_class(q):
    """The queue's device class ("cpu", "cpu16", "gpu": the tuning table's classes): it picks kernel
    variants and launch sizes (cached per device; tests override it through _config_class)."""
    cls = _config_class.get(q.device.int_ptr)
    if cls is None:
        cls = device_class(q)
        if cls == "cpu" and float_lanes(q) >= 16:
            cls = "cpu16"
        _config_class[q.device.int_ptr] = cls
    return cls


def _gemm_config(q):
    """(block and launch sizes, gemm.cl build options) for the queue's device: the tuning table's
    gemm_gpu row on GPUs; none on CPUs, whose GEMMs run gemm_cpu.cl."""
    cls = config_class(q)
    cfg = tuning.values("gemm_gpu", cls) if cls == "gpu" else {}
    return cfg, tuple(f"-D{k}={cfg[k]}" for k in _OPTION_KEYS if k in cfg)


def _launch_flat(q, name, options, total, local, *args):
    """A 1-D launch of `total` work-items of a gemm.cl kernel whose last argument is `total`."""
    k = kernels(q, "gemm", options)[name]
    _enqueue(q, k, (-(-total // local) * local,), (local,), (*args, total))


def gemm(M, N, K, A, sa, B, sb, C, sc, alpha=1.0, beta=0.0, bias=None, bias_mode=0, batch=1,
         offsets=(0, 0, 0)):
    """C[b] = alpha * A[b] @ B[b] + beta * C[b] (+ bias) with element strides
    sa = (m, k, batch), sb = (k, n, batch), sc = (m, n, batch).

    On CPUs gemm_cpu.cl (see _gemm_cpu), on GPUs gemm.cl's gemm_tile (see _gemm_tile); both take
    any layout and split K where the tiles alone would leave the device idle."""
    q = C.queue
    if M == 0 or N == 0 or batch == 0:  # an empty C: nothing to compute (an empty batch)
        return C.mark_written()
    cls = config_class(q)
    if cls != "gpu":
        _gemm_cpu(q, cls, M, N, K, A, sa, B, sb, C, sc, alpha, beta, bias, bias_mode, batch, offsets)
        return C.mark_written()
    cfg, _ = _gemm_config(q)
    _gemm_tile(q, cfg, M, N, K, A, sa, B, sb, C, sc, alpha, beta, bias if bias is not None else dummy(q), bias_mode,
               batch, offsets)
    return C.mark_written()


def _tile_side(full, reg, n):
    """A tile side for n rows or columns: the configured one, halved while half still covers n
    (and holds 4 register blocks)."""
    side = full
    while side // 2 >= max(n, 4 * reg):
        side //= 2
    return side


def _gemm_tile(q, cfg, M, N, K, A, sa, B, sb, C, sc, alpha, beta, bias_arg, bias_mode, batch, offsets):
    """gemm() on a GPU: gemm_tile, built for the operands' layouts (coalesced loads along the
    contiguous dimension) and the tile; split-K (partials + gemm_reduce) when the tiles alone
    would leave compute units idle."""
    bm, bn = _tile_side(cfg["BM"], cfg["RM"], M), _tile_side(cfg["BN"], cfg["RN"], N)
    a_k, b_k = int(sa[1] == 1), int(sb[0] == 1)
    options = (f"-DBM={bm}", f"-DBN={bn}", f"-DBK={cfg['BK']}", f"-DRM={cfg['RM']}", f"-DRN={cfg['RN']}",
               f"-DA_KMAJOR={a_k}", f"-DB_KMAJOR={b_k}")
    mt, nt = -(-M // bm), -(-N // bn)
    want, tiles = cfg["groups_per_cu"] * compute_units(q), mt * nt * batch
    splits = max(1, min(-(-want // tiles), K // cfg["min_kchunk"])) if tiles < want else 1
    ksteps = max(1, -(-K // cfg["BK"]))
    kchunk = -(-ksteps // splits) * cfg["BK"]
    splits = max(1, -(-K // kchunk))
    P = new(q, (batch, splits, M, N)) if splits > 1 else dummy(q)
    nthreads = (bm // cfg["RM"]) * (bn // cfg["RN"])
    launch(q, "gemm", "gemm_tile", (mt * nt * batch * splits * nthreads,), (nthreads,),
           M, N, K, A, offsets[0], *sa, B, offsets[1], *sb, C, offsets[2], *sc, float(alpha), float(beta),
           bias_arg, bias_mode, mt, nt, kchunk, splits, P, options=options)
    if splits > 1:
        _launch_flat(q, "gemm_reduce", options, batch * M * N, _LOCAL, M, N, splits, P,
                     C, offsets[2], *sc, float(alpha), float(beta), bias_arg, bias_mode)


# CPU classes (gemm_cpu.cl): the tuning table's gemm_cpu rows give the outer-product tile MR x NV
# vectors of VW floats, its K block KC and the dot-product block DM x DN; gemm_cpu_cutoffs which
# kernel a GEMM takes and how it splits (the table's rows say why each value, where measured).


def _cpu_config(cls):
    return tuning.values("gemm_cpu", cls)


def _cpu_cutoffs(cls):
    return tuning.values("gemm_cpu_cutoffs", cls)


_cpu_plans = {}  # (context, class, M, N, K, batch, dot, tuning version) -> _cpu_plan(): small GEMMs are host-bound


def _cdiv(a, b):
    return -(-a // b)


def _dot_blocks(cfg, N):
    """cfg with gemm_cpu_dot's block width for N columns: 3 where DN's blocks would repeat a fifth
    or more of their columns and 3's fewer (N = 9: 12 columns in 4s, 9 in 3s)."""
    padded = _cdiv(N, cfg["DN"]) * cfg["DN"]
    return dict(cfg, DN=3) if padded * 4 >= N * 5 and _cdiv(N, 3) * 3 < padded else cfg


def _cpu_plan(q, cls, M, N, K, batch, dot):
    """(kernel, its grid arguments, work-items, split-K chunks, reduce kernel) of a CPU GEMM; dot
    "dot" (gemm_cpu_dot), "nt" (gemm_cpu_nt) or None (gemm_cpu)."""
    cfg, cut = _cpu_config(cls), _cpu_cutoffs(cls)
    if dot == "dot":
        cfg = _dot_blocks(cfg, N)
    elif not dot and N <= cfg["VW"]:  # one vector of columns (a classifier's 10): half the multiply-adds
        cfg = dict(cfg, NV=1)
    ks = kernels(q, "gemm_cpu", tuple(f"-D{key}={v}" for key, v in cfg.items()))
    want = cut["items"] * compute_units(q)
    split = batch * M * N * K >= cut["split_work"]
    if dot:
        if dot == "nt":  # its blocks (gemm_cpu.cl's NTM x NTN) follow the class's vector width
            cfg = dict(cfg, DM=cut["nt_blocks"][cfg["VW"]][0], DN=cut["nt_blocks"][cfg["VW"]][1])
        mblocks, nblocks = _cdiv(M, cfg["DM"]), _cdiv(N, cfg["DN"])
        items = batch * mblocks * nblocks
        chunks = max(_cdiv(K, cut["dot_kchunk"]), min(_cdiv(want, items), K // cut["kmin"]) if split else 1)
        kchunk = max(1, _cdiv(_cdiv(K, chunks), cfg["VW"])) * cfg["VW"]  # whole vectors per chunk
        # blocks of few multiply-adds go nper to a work-item, as long as the cores keep enough
        if dot == "nt" and cfg["VW"] == 8:  # each work-item transposes its rows of A first
            work, most = cut["nt_item_work"], items * chunks // compute_units(q)
        else:
            work, most = cut["dot_item_work"], items * chunks // want
        nper = max(1, min(work // (cfg["DM"] * cfg["DN"] * kchunk), most, nblocks))
        items = batch * mblocks * _cdiv(nblocks, nper)
        grid = (mblocks, nblocks, nper)
    else:
        MR, NR, KC = cfg["MR"], cfg["NV"] * cfg["VW"], cfg["KC"]
        nblocks, mblocks = _cdiv(N, NR), _cdiv(M, MR)
        per_item = min(mblocks, _cdiv(cut["mstep"], MR))  # row blocks per work-item
        while per_item > 1 and batch * nblocks * _cdiv(mblocks, per_item) < want:
            per_item = _cdiv(per_item, 2)
        mgroups = _cdiv(mblocks, per_item)
        items = batch * nblocks * mgroups
        chunks = max(1, min(_cdiv(want, items), K // cut["kmin"]) if split else 1)
        kchunk = max(1, _cdiv(_cdiv(K, chunks), KC)) * KC  # whole K blocks per chunk
        grid = (nblocks, mgroups, per_item * MR)
    chunks = max(1, _cdiv(K, kchunk))  # one with K == 0: C = beta * C + bias
    return (ks[f"gemm_cpu_{dot}" if dot else "gemm_cpu"], grid + (kchunk, chunks), items * chunks, chunks,
            ks["gemm_cpu_reduce"])


def _gemm_cpu(q, cls, M, N, K, A, sa, B, sb, C, sc, alpha, beta, bias, bias_mode, batch, offsets):
    """gemm() on a CPU: gemm_cpu (any layout); for A and B both contiguous along k with few
    rows, gemm_cpu_dot, or with 16 rows or more and a short K, gemm_cpu_nt; C = A B
    with a short K into short rows, gemm_cpu_thin (_gemm_cpu_thin).
    Split-K chunks (partial sums in P, then gemm_cpu_reduce) when the blocks of C alone leave the
    cores idle or K is long."""
    cut = _cpu_cutoffs(cls)
    if (0 < K <= cut["thin_k"] and N <= cut["thin_vecs"] * _cpu_config(cls)["VW"] and sb[1] == 1 and sc[1] == 1
            and alpha == 1.0 and beta == 0.0 and bias_mode == 0):
        _gemm_cpu_thin(q, cls, M, N, K, A, sa, B, sb, C, sc, batch, offsets)
        return
    dot = None
    if sa[1] == 1 and sb[0] == 1 and M < cut["dot_rows"] and K >= cut["dot_kmin"]:
        dot = "nt" if M >= cut["nt_min_rows"] and K <= cut["nt_max_k"] else "dot"
    key = (q.context, cls, M, N, K, batch, dot, tuning.version())
    plan = _cpu_plans.get(key)
    if plan is None:
        plan = _cpu_plans[key] = _cpu_plan(q, *key[1:-1])
    k, grid, total, chunks, reduce = plan
    P = new(q, (batch, chunks, M, N)) if chunks > 1 else None
    if dot:
        sa, sb = (sa[0], sa[2]), (sb[1], sb[2])  # the k strides are 1
    _enqueue(q, k, (total,), (1,), (M, N, K, A, offsets[0], *sa, B, offsets[1], *sb, C, offsets[2], *sc,
                                    float(alpha), float(beta), bias, bias_mode, *grid, P, total))
    if chunks > 1:
        _enqueue(q, reduce, (_cdiv(batch * M * N, _LOCAL) * _LOCAL,), (_LOCAL,),
                 (M, N, chunks, P, C, offsets[2], *sc, float(alpha), float(beta), bias, bias_mode, batch * M * N))


def _gemm_cpu_thin(q, cls, M, N, K, A, sa, B, sb, C, sc, batch, offsets):
    """C = A B for a short K into rows of C of at most thin_vecs vectors, B and C contiguous along n
    (gemm_cpu_thin): work-items over the batch, then blocks of rows: about `items` per compute unit,
    each writing at least thin_work elements (the tuning table's gemm_cpu_cutoffs)."""
    key = (q.context, cls, "thin", M, N, K, batch, tuning.version())
    plan = _cpu_plans.get(key)
    if plan is None:
        cut = _cpu_cutoffs(cls)
        want = max(1, min(cut["items"] * compute_units(q), batch * M * N // cut["thin_work"]))
        mstep = _cdiv(M, max(1, min(_cdiv(want, batch), M)))
        ks = kernels(q, "gemm_cpu", tuple(f"-D{k}={v}" for k, v in _cpu_config(cls).items()) + (f"-DTK={K}",))
        plan = _cpu_plans[key] = (ks["gemm_cpu_thin"], (_cdiv(M, mstep), mstep), batch * _cdiv(M, mstep))
    k, grid, total = plan
    _enqueue(q, k, (total,), (1,), (M, N, A, offsets[0], *sa, B, offsets[1], sb[0], sb[2], C, offsets[2], sc[0],
                                    sc[2], *grid, total))


def matmul(a, b, trans_a=False, trans_b=False, out=None, beta=0.0, bias=None, bias_mode=0):
    """2-D: out = op(a) @ op(b) (+ beta*out) (+ bias); op transposes by strides, no copy."""
    (ra, ca), (rb, cb) = a.shape, b.shape
    M, K = (ca, ra) if trans_a else (ra, ca)
    K2, N = (cb, rb) if trans_b else (rb, cb)
    if K != K2:
        raise ValueError(f"matmul: inner dimensions differ: {a.shape} x {b.shape}")
    sa = (1, ca, 0) if trans_a else (ca, 1, 0)
    sb = (1, cb, 0) if trans_b else (cb, 1, 0)
    out = out if out is not None else new(a, (M, N))
    return gemm(M, N, K, a, sa, b, sb, out, (N, 1, 0), beta=beta, bias=bias, bias_mode=bias_mode)


# sum_axis runs one work-group per output: a conv's bias gradient (16 channels, 2M summands each)
# would leave a GPU all but idle, so on GPUs long sums take two stages: work-groups of
# _SUM_CHUNK summands write partial sums, then sum_axis adds them in a fixed order.
_SUM_SPLIT = 16384  # fewest summands per output for the two stages
_SUM_CHUNK = 4096  # summands per first-stage work-group


def sum_axis(x, I, J, si, sj, out, accumulate=False, off=0):
    """out[j] (+)= sum_i x[off + i*si + j*sj]"""
    q, options = x.queue, _gemm_config(x.queue)[1]
    if config_class(q) != "gpu":  # a work-item per output (norm_cpu.cl): no work-groups of 64 with barriers
        launch(q, "norm_cpu", "sum_axis_cpu", (max(J, 1),), (1,), I, J, x, off, si, sj, out, int(accumulate))
        return out.mark_written()
    if I >= _SUM_SPLIT:
        chunks = _cdiv(I, _SUM_CHUNK)
        part = new(q, (J, chunks))
        launch(q, "gemm", "sum_axis_part", (J * chunks * 64,), (64,), I, J, x, off, si, sj, _SUM_CHUNK, chunks,
               part, options=options)
        x, I, si, sj, off = part, chunks, 1, chunks, 0
    launch(q, "gemm", "sum_axis", (J * 64,), (64,), I, J, x, off, si, sj, out, int(accumulate), options=options)
    return out.mark_written()


def permute3(src, dims, src_strides, dst, dst_strides, accumulate=False, offset=0):
    """dst[b*d0 + i*d1 + j*d2] (+)= src[offset + b*s0 + i*s1 + j*s2] over a (B, I, J) walk.
    Work-items run along j first (16 of them, 4 values of i per work-group): its callers (conv
    backward's (N, K, P) -> (K, N*P), the CPU GEMM's B^T copy) keep j contiguous in src, and
    conv's in dst too, so on a GPU both sides coalesce without a local-memory transpose."""
    B, I, J = dims
    launch(src.queue, "gemm", "permute3", (J, I, B), (16, 4, 1), B, I, J, src, offset, *src_strides, dst,
           *dst_strides, int(accumulate), options=_gemm_config(src.queue)[1])
    return dst.mark_written()


def grad_target(p):
    """(the parameter's gradient tensor, whether to accumulate into it). A new gradient goes where
    the parameter's optimizer keeps it (p.grad_home: see netcl.optim), else in a new buffer. A frozen
    parameter (requires_grad False) gets a scratch buffer: its layer's backward computes the gradient
    and it is dropped, so the parameter keeps .grad None and no optimizer moves it."""
    if not p.requires_grad:
        return new(p, p.shape), False
    if p.grad is None:
        g = p.grad_home.lend(p) if p.grad_home is not None else None
        p.grad = g if g is not None else new(p, p.shape)
        return p.grad, False
    return p.grad, True
