#!/usr/bin/env python3
"""Speed of netcl's training path (Linear and Conv2d forward + backward: im2col, GEMM, col2im)
against peers measured in the same run on the same machine.

Sections (all by default, or pick with --only):
  gemm    GEMM GFLOP/s of ops.gemm for squares and for every GEMM the training table's steps
          run (logged live from one step of each model and batch, as a netcl.TrainStep runs it
          or, --layer-calls, as layer calls: shapes, strides, the layer; a TrainStep on a CPU
          runs a classifier's head as one kernel, timed against numpy's head),
          against numpy (OpenBLAS) float32 @ on contiguous operands of the same transposes
          (NN, TN = A transposed, NT = B transposed), timed in alternating rounds (each side's
          best round); netcl as a layer calls it and replayed (its launches alone, as
          netcl.TrainStep runs them); a small GEMM is timed per call in a stream of up to 20
          calls drained once, as a training step enqueues them. Ends with an empty kernel's
          launch time: shapes whose numpy time is under about two of those cannot reach half of
          numpy's speed as a launch of their own.
  layers  per-layer forward and backward milliseconds (median of repetitions, the queue
          drained after each) for the digits CNN at batch 64, netcl.models.cnn at batch 32,
          detector26's first conv blocks at batch 8 x 256x256 in training mode, and the MLP;
          against torch CPU (float32, same thread count) when torch is installed.
  epoch   the digits classifier (netcl.apps.recipes.train_classifier) seconds per epoch, median
          over epochs after the first (which pays kernel compiles).

Every figure is a median of --repeat runs; ratios are netcl time / peer time (or GFLOP/s
ratios), so a busy shared machine moves both sides alike. Examples:

    python tools/benchmark_training.py                   # everything (~2-4 minutes)
    python tools/benchmark_training.py --only gemm layers --repeat 9
    python tools/benchmark_training.py --quick --json out.json
"""
import argparse
import json
import os
import statistics
import sys
import time

# The numpy peer runs OpenBLAS's own choice of kernel and cache sizes: these two (set on some of
# the machines netcl is measured on) slow current numpy, and OpenBLAS reads them when it loads;
# --isa sets its own (netcl.apps.common.ISA_ENVIRONMENTS, marked by NETCL_BENCH_ISA).
if "NETCL_BENCH_ISA" not in os.environ:
    for _var in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        os.environ.pop(_var, None)

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import netcl  # noqa: E402
from netcl import Tensor, nn, ops  # noqa: E402
from netcl.nn import conv as conv_module  # noqa: E402
from netcl.nn.conv_route import ConvRoute, conv_route  # noqa: E402
from netcl.apps import common  # noqa: E402
from netcl.apps.common import median_time  # noqa: E402


# -- GEMM ---------------------------------------------------------------------------------
SQUARES = [  # (label, M, N, K, layout): the kernels' quality on shapes with room for their tiles
    ("square", 256, 256, 256, "NN"), ("square", 512, 512, 512, "NN"), ("square", 1024, 1024, 1024, "NN"),
    ("square", 512, 512, 512, "TN"), ("square", 512, 512, 512, "NT"),
]
# The training table's models and batches: the GEMMs their steps run are logged live (training_gemms)
TRAINING_STEPS = [("resnet8", 8), ("resnet8", 64), ("detector26", 8), ("cnn", 8), ("cnn", 64), ("digits", 8),
                  ("digits", 64)]


# In-process peers alternate, and a BLAS's worker threads keep spinning on the cores after a call
# (OpenBLAS about 2^28 cycles, a tenth of a second; an OpenMP pool its block time): a measurement
# started at once shares the cores with them. Measured here, 1024^3 replayed: 9.9-12.9 ms right
# after numpy's rounds, 6.3-6.5 ms after half a second. Each timed side starts after this pause.
_SETTLE = 0.25


def _settled(fn, repeats=3, min_seconds=0.05):
    """median_time(fn) after _SETTLE seconds of quiet (the other side's threads asleep again) and
    one untimed call (this side's threads awake)."""
    time.sleep(_SETTLE)
    return median_time(fn, repeats, warmup=1, min_seconds=min_seconds)


def _blas_name():
    """numpy's BLAS and the kernel it runs (OpenBLAS's architecture, e.g. SkylakeX), if threadpoolctl says."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "BLAS unknown: no threadpoolctl"
    info = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    return ", ".join(f"{i['internal_api']} {i.get('version')} {i.get('architecture')} kernel, "
                     f"{i['num_threads']} threads" for i in info) or "BLAS unknown"


def _plain_strides(M, N, K, layout):
    """(sa, sb, sc) element strides of a layout: A (M, K) or stored transposed, B (K, N) likewise."""
    sa = (1, M, 0) if layout[0] == "T" else (K, 1, 0)
    sb = (1, K, 0) if layout[1] == "T" else (N, 1, 0)
    return sa, sb, (N, 1, 0)


def _layout(sa, sb):
    """"NN", "TN", "NT" or "TT" for operand strides: T where an operand is contiguous along m (A) or n (B)."""
    return ("T" if sa[1] != 1 else "N") + ("N" if sb[1] == 1 else "T")


def _caller():
    """"Layer.method" of the innermost netcl layer on the stack (whose GEMM this is)."""
    import inspect

    for info in inspect.stack()[2:]:
        obj = info.frame.f_locals.get("self")
        if isinstance(obj, nn.Module):
            return f"{type(obj).__name__}.{info.function}"
    return "?"


def training_gemms(q, steps=TRAINING_STEPS, mode="trainstep"):
    """(gemms, heads, direct) that one training step of each (model, batch) runs: gemms [(label, M,
    N, K, batch, sa, sb, sc)] every distinct GEMM (shape and strides), logged from ops.gemm; heads
    [(label, rows, inputs, classes)] the classifier heads run as one kernel (CrossEntropyLoss.
    enqueue_linear); direct [(label, kind, conv, xp shape, dy shape)] the weight gradients computed
    without a GEMM (a GEMM of M = out channels, N = weights per output channel, K = batch x output
    positions): kind "narrow" by Conv2d._wgrad_narrow, "oc16" by Conv2d._wgrad_oc16, "phases" by
    Conv2d._backward_phases (wgrad2o_cpu on AVX2, wgrad2_cpu on AVX-512; xp shape: the input as
    it is), "pooled" inside the backward pass of the BatchNorm2d (+ activation + MaxPool2d) after
    the conv (BatchNorm2d._conv_grads_pooled). mode "trainstep": the step as a netcl.TrainStep runs it (its
    first call, eager: the replays run the same launches), "loop": as layer calls. Labels name the
    first model, batch and layer method to run each."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import benchmark_training_step as bts

    gemms, heads, direct, where = {}, {}, {}, [None]
    real_gemm, real_head, real_narrow = ops.gemm, nn.CrossEntropyLoss.enqueue_linear, nn.Conv2d._wgrad_narrow
    real_pooled, real_oc16 = nn.BatchNorm2d._conv_grads_pooled, nn.Conv2d._wgrad_oc16
    real_phases = nn.Conv2d._backward_phases

    def gemm(M, N, K, A, sa, B, sb, C, sc, *args, batch=1, **kw):
        gemms.setdefault((M, N, K, batch, tuple(sa), tuple(sb), tuple(sc)), f"{where[0]} {_caller()}")
        return real_gemm(M, N, K, A, sa, B, sb, C, sc, *args, batch=batch, **kw)

    def head(self, linear, x, labels, input_grad=True):
        heads.setdefault((x.shape[0], linear.in_features, linear.out_features), f"{where[0]} Linear + cross-entropy")
        return real_head(self, linear, x, labels, input_grad)

    def conv_key(kind, conv, xp_shape, dy_shape):
        return (kind, conv.in_channels, conv.out_channels, conv.kernel_size, conv.padding, conv.bias is not None,
                tuple(xp_shape), tuple(dy_shape))

    def narrow(self, q_, xp, dy):
        direct.setdefault(conv_key("narrow", self, xp.shape, dy.shape), f"{where[0]} Conv2d._wgrad_narrow")
        return real_narrow(self, q_, xp, dy)

    def oc16(self, q_, xp, dy):
        direct.setdefault(conv_key("oc16", self, xp.shape, dy.shape), f"{where[0]} Conv2d._wgrad_oc16")
        return real_oc16(self, q_, xp, dy)

    def phases(self, dy, need_dx, options):
        direct.setdefault(conv_key("phases", self, self._saved.shape, dy.shape), f"{where[0]} Conv2d._backward_phases")
        return real_phases(self, dy, need_dx, options)

    def pooled(self, conv, fused, dp, arg, sums):
        direct.setdefault(conv_key("pooled", conv, fused[1].shape, self._saved[0].shape),
                          f"{where[0]} BatchNorm2d pass + Conv2d dW")
        return real_pooled(self, conv, fused, dp, arg, sums)

    ops.gemm, nn.CrossEntropyLoss.enqueue_linear, nn.Conv2d._wgrad_narrow = gemm, head, narrow
    nn.BatchNorm2d._conv_grads_pooled, nn.Conv2d._wgrad_oc16, nn.Conv2d._backward_phases = pooled, oc16, phases
    try:
        for name, batch in steps:
            where[0] = f"{name} b{batch}"
            bts.netcl_step(name, batch, q, mode=mode)()
    finally:
        ops.gemm, nn.CrossEntropyLoss.enqueue_linear, nn.Conv2d._wgrad_narrow = real_gemm, real_head, real_narrow
        nn.BatchNorm2d._conv_grads_pooled, nn.Conv2d._wgrad_oc16 = real_pooled, real_oc16
        nn.Conv2d._backward_phases = real_phases
    q.finish()
    return ([(label,) + key for key, label in gemms.items()], [(label,) + key for key, label in heads.items()],
            [(label,) + key for key, label in direct.items()])


def _replayable(q, fn):
    """A function enqueueing fn()'s launches `reps` times with their arguments already set (as a
    netcl.TrainStep replays them), then draining the queue; and the number of launches."""
    import pyopencl as cl

    from netcl import runtime

    rec = runtime.Recorder().start()
    try:
        fn()
    finally:
        rec.stop()
    launches = []
    for command in rec.commands:
        assert command[0] == "launch", f"{command[0]}: only launches are timed"
        _, k, gsize, lsize, args = command
        own = runtime.copy_kernel(k)
        own.set_args(*args)
        launches.append((own, gsize, lsize))

    def replayed(reps):
        for _ in range(reps):
            for k, gsize, lsize in launches:
                cl.enqueue_nd_range_kernel(q, k, gsize, lsize)
        q.finish()
    replayed.commands = rec.commands  # the buffers the kernels write stay theirs (not back in the pool)
    return replayed, len(launches)


def _operand(rng, rows, cols, strides, batch):
    """A flat host buffer holding a (batch, rows, cols) operand at element strides (r, c, b)."""
    r, c, b = strides
    size = (batch - 1) * b + (rows - 1) * r + (cols - 1) * c + 1
    flat = rng.standard_normal(size).astype(np.float32)
    view = np.lib.stride_tricks.as_strided(flat, (batch, rows, cols), (4 * b, 4 * r, 4 * c))
    return flat, view


def _empty_launch(q, repeat):
    """Microseconds a launch of an empty one-work-item kernel takes in a stream of 200 (PoCL's
    floor per launch: enqueueing on the host, waking a worker, completing)."""
    import pyopencl as cl

    k = cl.Kernel(cl.Program(q.context, "__kernel void empty(__global float *x) { }").build(), "empty")
    buf = cl.Buffer(q.context, cl.mem_flags.READ_WRITE, 4)  # held: a kernel argument keeps no reference
    k.set_args(buf)

    def run():
        for _ in range(200):
            cl.enqueue_nd_range_kernel(q, k, (1,), (1,))
        q.finish()
    run()
    return min(median_time(run, 3) for _ in range(repeat)) / 200 * 1e6


def bench_gemm(q, repeat, quick, steps=TRAINING_STEPS, mode="trainstep"):
    """GFLOP/s of the squares and of every GEMM the training steps run (mode: as a TrainStep runs
    them, or "loop": as layer calls), each against numpy (OpenBLAS) on contiguous operands of the
    same transposes. netcl two ways: "call", ops.gemm as a layer calls it (its host Python
    included), and "replayed", its launches enqueued with their arguments already set, as a
    netcl.TrainStep replays a step. Then the classifier heads a TrainStep runs as one kernel
    against the same arithmetic in numpy (bench_heads)."""
    rng = np.random.default_rng(0)
    cases = [(label, M, N, K, 1) + _plain_strides(M, N, K, lay) for label, M, N, K, lay in SQUARES]
    gemms, heads, direct = training_gemms(q, steps, mode)
    cases += gemms
    rows = []
    for label, M, N, K, batch, sa, sb, sc in cases:
        if quick and batch * M * N * K > 2 ** 28:
            continue
        a_flat, a = _operand(rng, M, K, sa, batch)
        b_flat, b = _operand(rng, K, N, sb, batch)
        ta, tb, out = Tensor.from_host(q, a_flat), Tensor.from_host(q, b_flat), ops.new(q, (batch * M * N,))
        sc = (N, 1, M * N)  # a dense C (training writes its own, possibly strided, C: same kernel work)
        lay = _layout(sa, sb)
        # numpy's best case: each operand contiguous in the same transposition
        an = np.ascontiguousarray(a.transpose(0, 2, 1)).transpose(0, 2, 1) if lay[0] == "T" else a.copy()
        bn = np.ascontiguousarray(b.transpose(0, 2, 1)).transpose(0, 2, 1) if lay[1] == "T" else b.copy()
        an, bn = (an[0], bn[0]) if batch == 1 else (an, bn)
        reps = max(1, min(20, int(2e7 // (batch * M * N * K))))  # small GEMMs: a stream of calls, drained once

        def call():
            for _ in range(reps):
                ops.gemm(M, N, K, ta, sa, tb, sb, out, sc, batch=batch)
            q.finish()

        replay, launches = _replayable(q, lambda: ops.gemm(M, N, K, ta, sa, tb, sb, out, sc, batch=batch))

        def replayed():
            replay(reps)

        def run_np():
            for _ in range(reps):
                an @ bn

        call()
        ref = np.matmul(a.astype(np.float64), b.astype(np.float64))
        err = float(np.max(np.abs(out.to_host().reshape(batch, M, N) - ref)) / max(np.max(np.abs(ref)), 1e-30))
        flop = 2.0 * batch * M * N * K
        # alternating rounds: a busy shared machine slows both sides of a round alike; each side's
        # best round (noise only adds time, and OpenBLAS's two threads wait a whole scheduler slice
        # when another process holds a core)
        rounds = [[_settled(fn) / reps for fn in (call, replayed, run_np)]
                  for _ in range(repeat)]
        t_call, t_rep, t_np = (min(r[i] for r in rounds) for i in range(3))
        rows.append({"label": label, "M": M, "N": N, "K": K, "batch": batch, "layout": lay,
                     "launches": launches, "netcl_us": t_call * 1e6, "replayed_us": t_rep * 1e6,
                     "numpy_us": t_np * 1e6, "netcl_gflops": flop / t_call / 1e9, "replayed_gflops": flop / t_rep / 1e9,
                     "numpy_gflops": flop / t_np / 1e9, "ratio": t_np / t_call, "replayed_ratio": t_np / t_rep,
                     "rel_err": err})
    floor = _empty_launch(q, repeat)
    print(f"\n== GEMM vs numpy float32 @ ({np.__version__}, {_blas_name()}): squares, then every GEMM the "
          f"training steps run ==")
    print(f"{'shape':18s} {'first run by':38s} {'netcl GF/s':>10s} {'replayed':>8s} {'numpy GF/s':>10s} "
          f"{'netcl/numpy':>11s} {'replayed':>8s} {'replayed us':>11s} {'numpy us':>8s} {'rel err':>8s}")
    for r in rows:
        shape = f"{r['M']}x{r['N']}x{r['K']}" + (f" b{r['batch']}" if r["batch"] > 1 else "") + f" {r['layout']}"
        print(f"{shape:18s} {r['label'][:38]:38s} {r['netcl_gflops']:10.1f} {r['replayed_gflops']:8.1f} "
              f"{r['numpy_gflops']:10.1f} {r['ratio']:11.3f} {r['replayed_ratio']:8.3f} {r['replayed_us']:11.1f} "
              f"{r['numpy_us']:8.1f} {r['rel_err']:8.1e}")
    direct_rows = bench_direct(q, repeat, direct, rng)
    head_rows = bench_heads(q, repeat, heads, rng)
    under = [r for r in rows + direct_rows + head_rows if r["replayed_ratio"] < 0.5]
    print(f"an empty kernel's launch, in a stream: {floor:.1f} us; replayed under half of numpy: {len(under)} of "
          f"{len(rows) + len(direct_rows) + len(head_rows)} ({sum(r['numpy_us'] < 2 * floor for r in under)} of them "
          "with numpy under two empty launches)")
    return {"shapes": rows, "direct": direct_rows, "heads": head_rows, "empty_launch_us": floor, "mode": mode}


def _cols(xp, k, oh, ow, stride=1):
    """The im2col columns (C*k*k, N*OH*OW) of a padded input, contiguous."""
    n, c = xp.shape[:2]
    cols = np.lib.stride_tricks.sliding_window_view(xp, (k, k), axis=(2, 3))[:, :, ::stride, ::stride][:, :, :oh, :ow]
    return np.ascontiguousarray(cols.transpose(1, 4, 5, 0, 2, 3).reshape(c * k * k, n * oh * ow))


def _numpy_wgrad(xp, dy, k, stride=1):
    """numpy's side of a weight gradient: ((M, N, K), reps, run) where run() computes dyr @ cols^T
    reps times on operands made beforehand, and (cols, dyr) for the error."""
    n, oc, oh, ow = dy.shape
    cols, dyr = _cols(xp, k, oh, ow, stride), np.ascontiguousarray(dy.transpose(1, 0, 2, 3).reshape(oc, n * oh * ow))
    M, N, K = oc, cols.shape[0], n * oh * ow
    reps = max(1, min(20, int(2e7 // (M * N * K))))

    def run():
        for _ in range(reps):
            dyr @ cols.T
    return (M, N, K), reps, run, cols, dyr


def _best_rounds(fns, repeat):
    """Each function's best settled time over `repeat` alternating rounds."""
    rounds = [[_settled(fn) for fn in fns] for _ in range(repeat)]
    return [min(r[i] for r in rounds) for i in range(len(fns))]


def _wgrad_err(conv, dyr, cols, extra=()):
    """Relative error of conv's dW (and db) against float64 dyr @ cols^T (and dyr's row sums); and
    of each dW in extra."""
    ref = dyr.astype(np.float64) @ cols.T.astype(np.float64)
    scale = max(np.max(np.abs(ref)), 1e-30)
    errs = [np.max(np.abs(g.reshape(ref.shape) - ref)) / scale for g in (conv.weight.grad.to_host(),) + tuple(extra)]
    if conv.bias is not None:  # the row sums of dy (about 0 before a BatchNorm: dW's scale)
        errs.append(np.max(np.abs(conv.bias.grad.to_host() - dyr.astype(np.float64).sum(axis=1))) / scale)
    return float(max(errs))


def bench_direct(q, repeat, direct, rng):
    """The weight gradients a step computes without a GEMM, against numpy's GEMM of the same
    product (dy as (OC, N*P) times the im2col columns, both contiguous and made beforehand: numpy
    is not charged for im2col or the bias's sums). "narrow" (Conv2d._wgrad_narrow: dW and db of a
    first layer from dy and its padded input in one launch) and "oc16" (Conv2d._wgrad_oc16, likewise
    for more weights, 16 output channels in the lanes) replayed, and the launches they replaced
    (im2col_cpu, dy_rows_cpu, the GEMM, the bias's sums: the generic tier's route,
    conv_route(..., generic=True)). "phases" (Conv2d._backward_phases: a 3x3 stride-2 convolution's dW from x as it is by
    per-chunk sums, then sum_chunks_cpu: on AVX2 dy_t8_cpu transposes dy for wgrad2o_cpu and sums
    its planes for the bias, on AVX-512 wgrad2_cpu reads dy as it is) likewise, against im2col_cpu from a padded
    copy of x, dy_rows_cpu and the GEMM. "pooled" (dW and db in the backward pass of the BatchNorm2d + ReLU + MaxPool2d after the
    conv, instead of its dy): its cost is that pass's replayed time less the same pass writing dy
    (the unfused step's), under 0.1 us counted as 0.1; the replaced launches are that pass and
    _wgrad_narrow."""
    bench = {"pooled": _bench_pooled, "phases": _bench_phases}
    rows = [bench.get(entry[1], _bench_narrow)(q, repeat, entry, rng) for entry in direct]
    one_launch, pooled = [r for r in rows if r["kind"] != "pooled"], [r for r in rows if r["kind"] == "pooled"]
    if one_launch:
        print("\n== weight gradients without a GEMM (one launch; phases: dy_t8_cpu + wgrad2o_cpu or wgrad2_cpu, then "
              "sum_chunks_cpu) vs numpy's GEMM of the same product ==")
        print(f"{'shape':18s} {'first run by':38s} {'replayed GF/s':>13s} {'numpy GF/s':>10s} {'numpy/netcl':>11s} "
              f"{'replayed us':>11s} {'numpy us':>8s} {'replaced us (launches)':>22s} {'rel err':>8s}")
    for r in one_launch:
        print(f"{r['M']}x{r['N']}x{r['K']} NT".ljust(18) + f" {r['label'][:38]:38s} {r['replayed_gflops']:13.1f} "
              f"{r['numpy_gflops']:10.1f} {r['replayed_ratio']:11.3f} {r['replayed_us']:11.1f} {r['numpy_us']:8.1f} "
              f"{r['replaced_us']:14.1f} ({r['replaced_launches']})     {r['rel_err']:8.1e}")
    if pooled:
        print("\n== weight gradients inside the BatchNorm2d's backward pass (its dy never stored) vs numpy's GEMM ==")
        print(f"{'shape':18s} {'first run by':38s} {'pass+dW us':>10s} {'pass+dy us':>10s} {'cost us':>8s} "
              f"{'numpy us':>8s} {'numpy/cost':>10s} {'replaced us (launches)':>22s} {'rel err':>8s}")
    for r in pooled:
        ratio = f"{r['replayed_ratio']:10.2f}" if r["cost_us"] > 0.1 else f"{'free':>10s}"
        print(f"{r['M']}x{r['N']}x{r['K']} NT".ljust(18) + f" {r['label'][:38]:38s} {r['pass_us']:10.1f} "
              f"{r['plain_pass_us']:10.1f} {r['cost_us']:8.1f} {r['numpy_us']:8.1f} {ratio} "
              f"{r['replaced_us']:14.1f} ({r['replaced_launches']})     {r['rel_err']:8.1e}")
    return rows


def _direct_row(q, repeat, entry, conv, new, old, xp, dy, stride=1):
    """bench_direct's row of a weight gradient computed without a GEMM: new() (its launches
    replayed) against old() (the launches it replaced, recorded while old() runs its own set-up)
    and numpy's GEMM of the same product from the padded input xp; both dW against float64."""
    label, kind, k, bias = entry[0], entry[1], entry[4], entry[6]

    def recorded(fn):
        def grads():
            conv.weight.grad = None
            if bias:
                conv.bias.grad = None
            fn()
        return _replayable(q, grads)
    replay, launches = recorded(new)
    replaced, replaced_launches = recorded(old)
    replaced(1)
    old_dw = conv.weight.grad.to_host()
    (M, N, K), reps, run_np, cols, dyr = _numpy_wgrad(xp, dy, k, stride)
    replay(1)
    err = _wgrad_err(conv, dyr, cols, (old_dw,))
    t_rep, t_np, t_old = (t / reps for t in _best_rounds((lambda: replay(reps), run_np, lambda: replaced(reps)),
                                                         repeat))
    flop = 2.0 * M * N * K
    return {"label": label, "kind": kind, "M": M, "N": N, "K": K, "batch": 1, "layout": "NT",
            "launches": launches, "replayed_us": t_rep * 1e6, "numpy_us": t_np * 1e6,
            "replayed_gflops": flop / t_rep / 1e9, "numpy_gflops": flop / t_np / 1e9, "replayed_ratio": t_np / t_rep,
            "rel_err": err, "replaced_us": t_old * 1e6, "replaced_launches": replaced_launches}


def _bench_narrow(q, repeat, entry, rng):
    _, _, c, oc, k, p, bias, xp_shape, dy_shape = entry
    conv = nn.Conv2d(c, oc, k, padding=p, bias=bias).to(q).train()
    xp = rng.standard_normal(xp_shape).astype(np.float32)
    dy = rng.standard_normal(dy_shape).astype(np.float32)
    xt, dyt = Tensor.from_host(q, xp), Tensor.from_host(q, dy)
    shape = (dy_shape[0], c, xp_shape[2] - 2 * p, xp_shape[3] - 2 * p)
    route = conv.route(q, shape)  # the route the step ran: its direct kernel for dW
    direct = conv._wgrad_narrow if route.wgrad == "narrow" else conv._wgrad_oc16
    # the path it replaced, from the same padded input: the generic tier's (im2col, dy_rows, a GEMM)
    generic = conv_route(conv.spec(shape), conv_module.device_class(q), generic=True)

    def new():
        conv._saved = conv_module._Saved(shape, route, xp=xt)
        direct(q, xt, dyt)

    def old():
        conv._saved = conv_module._Saved(shape, generic, xp=xt)
        conv._backward_cpu(dyt, False)
    return _direct_row(q, repeat, entry, conv, new, old, xp, dy)


def _bench_phases(q, repeat, entry, rng):
    label, _, c, oc, k, p, bias, x_shape, dy_shape = entry
    conv = nn.Conv2d(c, oc, k, stride=2, padding=p, bias=bias).to(q).train()
    x = rng.standard_normal(x_shape).astype(np.float32)
    dy = rng.standard_normal(dy_shape).astype(np.float32)
    xt, dyt = Tensor.from_host(q, x), Tensor.from_host(q, dy)
    conv(xt)
    if conv._saved.route.forward != "phases":
        raise RuntimeError(f"{label}: the forward did not run in phases mode here")
    options = conv._saved.route.stride2
    xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))
    xpt = Tensor.from_host(q, xp)

    def old():  # the path it replaced: im2col_cpu from a padded copy of x, dy_rows_cpu, the GEMM, the bias's sums
        saved = conv._saved
        conv._saved = conv_module._Saved(x_shape, ConvRoute("channels", "gemm_planes", "corrt"), xp=xpt)
        try:
            conv._backward_cpu(dyt, False)
        finally:
            conv._saved = saved
    return _direct_row(q, repeat, entry, conv, lambda: conv._backward_phases(dyt, False, options), old, xp, dy,
                       stride=2)


def _bench_pooled(q, repeat, entry, rng):
    label, _, c, oc, k, p, bias, xp_shape, dy_shape = entry
    n = dy_shape[0]
    model = nn.Sequential(nn.Conv2d(c, oc, k, padding=p, bias=bias), nn.BatchNorm2d(oc), nn.ReLU(),
                          nn.MaxPool2d(2)).to(q).train()
    conv, bn, pool = model.layers[0], model.layers[1], model.layers[3]
    x = rng.standard_normal((n, c, xp_shape[2] - 2 * p, xp_shape[3] - 2 * p)).astype(np.float32)
    model(Tensor.from_host(q, x))
    dp = Tensor.from_host(q, rng.standard_normal(pool.output_shape(dy_shape)).astype(np.float32))
    if conv.pool_wgrad(q, dy_shape) is None or 3 not in model._pooled:
        raise RuntimeError(f"{label}: the pass does not take this conv's weight gradient here")

    def fused():
        conv.weight.grad = conv.bias.grad = None
        bn.weight.grad = bn.bias.grad = None
        bn.backward(dp, pool=pool, wgrad=conv)
    replay, launches = _replayable(q, fused)
    out = []

    def plain():
        bn.weight.grad = bn.bias.grad = None
        out[:] = [bn.backward(dp, pool=pool)]
    replay_plain, _ = _replayable(q, plain)
    replay_plain(1)
    dyt = out[0]

    def unfused():
        plain()
        conv.weight.grad = conv.bias.grad = None
        conv._wgrad_narrow(q, conv._saved.xp, dyt)
    replaced, replaced_launches = _replayable(q, unfused)
    replaced(1)
    old_dw = conv.weight.grad.to_host()
    replay(1)
    (M, N, K), reps, run_np, cols, dyr = _numpy_wgrad(conv._saved.xp.to_host(), dyt.to_host(), k)
    err = _wgrad_err(conv, dyr, cols, (old_dw,))
    t_pass, t_plain, t_np, t_old = (t / reps for t in _best_rounds(
        (lambda: replay(reps), lambda: replay_plain(reps), run_np, lambda: replaced(reps)), repeat))
    cost = t_pass - t_plain
    return {"label": label, "kind": "pooled", "M": M, "N": N, "K": K, "batch": 1, "layout": "NT",
            "launches": launches, "pass_us": t_pass * 1e6, "plain_pass_us": t_plain * 1e6, "cost_us": cost * 1e6,
            "replayed_us": max(cost, 1e-7) * 1e6, "numpy_us": t_np * 1e6, "replayed_ratio": t_np / max(cost, 1e-7),
            "rel_err": err, "replaced_us": t_old * 1e6, "replaced_launches": replaced_launches}


def bench_heads(q, repeat, heads, rng):
    """The classifier heads a TrainStep runs as one kernel (CrossEntropyLoss.enqueue_linear: the
    Linear's forward, the cross-entropy, dW, db and dx) replayed, against numpy doing the same:
    x @ W + b, the softmax cross-entropy and its gradient, x^T g, g's column sums, g W^T."""
    rows = []
    for label, n, inputs, classes in heads:
        lin = nn.Linear(inputs, classes).to(q).train()
        x = rng.standard_normal((n, inputs)).astype(np.float32)
        y = rng.integers(0, classes, n)
        xt, yt = Tensor.from_host(q, x), Tensor.from_host(q, y.astype(np.float32))
        loss_fn, keep = nn.CrossEntropyLoss(), []

        def head():
            lin.weight.grad = lin.bias.grad = None
            keep[:] = loss_fn.enqueue_linear(lin, xt, yt)
        replay, _ = _replayable(q, head)
        w, b, rows_ = lin.weight.to_host(), lin.bias.to_host(), np.arange(n)
        reps = max(1, min(20, int(2e7 // (3 * n * inputs * classes))))

        def numpy_head():
            for _ in range(reps):
                z = x @ w + b
                m = z.max(axis=1, keepdims=True)
                e = np.exp(z - m)
                s = e.sum(axis=1, keepdims=True)
                float(np.mean(np.log(s[:, 0]) + m[:, 0] - z[rows_, y]))
                g = e / s
                g[rows_, y] -= 1.0
                g /= n
                x.T @ g, g.sum(axis=0), g @ w.T

        replay(1)
        z = x.astype(np.float64) @ w + b
        err = float(np.max(np.abs(keep[0].to_host() - z)) / max(np.max(np.abs(z)), 1e-30))
        rounds = [[_settled(lambda: replay(reps)) / reps, _settled(numpy_head) / reps] for _ in range(repeat)]
        t_rep, t_np = (min(r[i] for r in rounds) for i in range(2))
        rows.append({"label": label, "rows": n, "inputs": inputs, "classes": classes, "replayed_us": t_rep * 1e6,
                     "numpy_us": t_np * 1e6, "replayed_ratio": t_np / t_rep, "rel_err": err})
    if rows:
        print("\n== classifier heads as one kernel (Linear + cross-entropy, forward and gradients) vs numpy ==")
        print(f"{'rows x inputs x classes':24s} {'first run by':38s} {'replayed us':>11s} {'numpy us':>8s} "
              f"{'numpy/netcl':>11s} {'rel err':>8s}")
    for r in rows:
        shape = f"{r['rows']}x{r['inputs']}x{r['classes']}"
        print(f"{shape:24s} {r['label'][:38]:38s} {r['replayed_us']:11.1f} {r['numpy_us']:8.1f} "
              f"{r['replayed_ratio']:11.3f} {r['rel_err']:8.1e}")
    return rows


# -- layers -------------------------------------------------------------------------------
def _conv(c, oc, s=1):
    return lambda: nn.Conv2d(c, oc, 3, stride=s, padding=1)


def _block(c, oc):
    return lambda: nn.Sequential(nn.Conv2d(c, oc, 3, padding=1), nn.BatchNorm2d(oc), nn.LeakyReLU(0.1),
                                 nn.MaxPool2d(2))


LAYERS = [  # (group, name, factory, input shape)
    ("digits CNN b64", "Conv2d(1,16,3,p1) 8x8", _conv(1, 16), (64, 1, 8, 8)),
    ("digits CNN b64", "Conv2d(16,32,3,p1) 4x4", _conv(16, 32), (64, 16, 4, 4)),
    ("digits CNN b64", "Linear(128,10)", lambda: nn.Linear(128, 10), (64, 128)),
    ("models.cnn b32", "Conv2d(3,16,3,p1) 32x32", _conv(3, 16), (32, 3, 32, 32)),
    ("models.cnn b32", "Conv2d(16,32,3,s2,p1) 16x16", _conv(16, 32, 2), (32, 16, 16, 16)),
    ("models.cnn b32", "Linear(512,10)", lambda: nn.Linear(512, 10), (32, 512)),
    ("detector26 b8 256", "Conv2d(3,16,3,p1) 256x256", _conv(3, 16), (8, 3, 256, 256)),
    ("detector26 b8 256", "Conv2d(16,32,3,p1) 128x128", _conv(16, 32), (8, 16, 128, 128)),
    ("detector26 b8 256", "Conv2d(32,64,3,p1) 64x64", _conv(32, 64), (8, 32, 64, 64)),
    ("detector26 b8 256", "block1 Conv-BN-LReLU-Pool (train)", _block(3, 16), (8, 3, 256, 256)),
    ("detector26 b8 256", "block2 Conv-BN-LReLU-Pool (train)", _block(16, 32), (8, 16, 128, 128)),
    ("mlp b256", "Linear(64,128)", lambda: nn.Linear(64, 128), (256, 64)),
    ("mlp b256", "Linear(128,128)", lambda: nn.Linear(128, 128), (256, 128)),
    ("mlp b256", "Linear(128,10)", lambda: nn.Linear(128, 10), (256, 128)),
    ("mlp large b512", "Linear(1024,1024)", lambda: nn.Linear(1024, 1024), (512, 1024)),
]


def _torch_twin(layer, torch):
    """The same layer in torch (weights copied), or None for a type this benchmark does not mirror."""
    def conv(m):
        t = torch.nn.Conv2d(m.in_channels, m.out_channels, m.kernel_size, m.stride, m.padding)
        with torch.no_grad():
            t.weight.copy_(torch.tensor(m.weight.to_host()))
            t.bias.copy_(torch.tensor(m.bias.to_host()))
        return t

    if isinstance(layer, nn.Conv2d):
        return conv(layer)
    if isinstance(layer, nn.Linear):
        t = torch.nn.Linear(layer.in_features, layer.out_features)
        with torch.no_grad():
            t.weight.copy_(torch.tensor(layer.weight.to_host().T))
            t.bias.copy_(torch.tensor(layer.bias.to_host()))
        return t
    if isinstance(layer, nn.Sequential):
        c = list(layer)[0]
        return torch.nn.Sequential(conv(c), torch.nn.BatchNorm2d(c.out_channels), torch.nn.LeakyReLU(0.1),
                                   torch.nn.MaxPool2d(2))
    return None


def bench_layers(q, repeat, quick, torch):
    rows = []
    rng = np.random.default_rng(0)
    for group, name, factory, shape in LAYERS:
        if quick and "detector" in group and "block" in name:
            continue
        netcl.manual_seed(0)
        layer = factory().train()
        x = rng.standard_normal(shape).astype(np.float32)
        xt = Tensor.from_host(q, x)
        layer.to(q) if hasattr(layer, "to") else None
        y = layer(xt)
        dy = Tensor.from_host(q, rng.standard_normal(y.shape).astype(np.float32))
        layer.backward(dy)  # compiles and warms the pools
        q.finish()

        def fwd():
            layer(xt)
            q.finish()

        def fwd_bwd():
            layer(xt)
            layer.backward(dy)
            q.finish()

        t_f = _settled(fwd, repeat, min_seconds=0.1)
        t_fb = _settled(fwd_bwd, repeat, min_seconds=0.1)
        row = {"group": group, "layer": name, "shape": list(shape), "fwd_ms": t_f * 1e3,
               "bwd_ms": (t_fb - t_f) * 1e3, "fwd_bwd_ms": t_fb * 1e3}
        twin = _torch_twin(layer, torch) if torch is not None else None
        if twin is not None:
            twin.train()
            txx = torch.tensor(x, requires_grad=True)
            tdy = torch.tensor(dy.to_host())

            def t_fb_fn():
                twin.zero_grad(set_to_none=False)
                txx.grad = None
                twin(txx).backward(tdy)

            t_fb_fn()
            row["torch_fwd_bwd_ms"] = _settled(t_fb_fn, repeat, min_seconds=0.1) * 1e3
            row["ratio_vs_torch"] = row["fwd_bwd_ms"] / row["torch_fwd_bwd_ms"]
        rows.append(row)
    print("\n== layers: forward + backward, median ms ==" +
          (f" (torch {torch.__version__}, {torch.get_num_threads()} threads)" if torch is not None else ""))
    print(f"{'group':18s} {'layer':34s} {'fwd':>8s} {'bwd':>8s} {'fwd+bwd':>8s} {'torch':>8s} {'x torch':>8s}")
    for r in rows:
        tt = f"{r['torch_fwd_bwd_ms']:8.2f} {r['ratio_vs_torch']:8.2f}" if "torch_fwd_bwd_ms" in r else ""
        print(f"{r['group']:18s} {r['layer']:34s} {r['fwd_ms']:8.2f} {r['bwd_ms']:8.2f} {r['fwd_bwd_ms']:8.2f} {tt}")
    return rows


# -- digits epoch -------------------------------------------------------------------------
def bench_epoch(q, epochs, torch):
    from netcl.apps.recipes import digits_cnn, digits_data, train_classifier

    data = digits_data()
    netcl.manual_seed(0)
    model = digits_cnn()
    _, hist = train_classifier(model, q, data, epochs=epochs, batch_size=64, progress=False)
    secs = np.diff([0.0] + hist["seconds"])
    per = statistics.median(secs[1:]) if len(secs) > 1 else secs[0]
    row = {"epochs": epochs, "epoch_seconds": [float(s) for s in secs], "median_epoch_s": float(per),
           "test_acc": hist["test_acc"][-1], "steps_per_epoch": -(-len(data[0]) // 64)}
    print("\n== digits CNN training (train_classifier, batch 64, Adam) ==")
    print(f"epoch seconds: {' '.join(f'{s:.3f}' for s in secs)}  -> median after the first {per:.3f} s "
          f"({row['steps_per_epoch']} steps, {per / row['steps_per_epoch'] * 1e3:.1f} ms/step); "
          f"test accuracy {row['test_acc']:.3f}")
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--only", nargs="+", choices=["gemm", "layers", "epoch"], default=["gemm", "layers", "epoch"],
                    help="sections to run (default: all)")
    ap.add_argument("--repeat", type=common.positive_int, default=5,
                    help="repetitions per figure; the median is reported")
    ap.add_argument("--epochs", type=common.positive_int, default=4,
                    help="digits epochs (the first is excluded from the median)")
    ap.add_argument("--quick", action="store_true", help="skip the largest GEMMs and detector blocks")
    ap.add_argument("--layer-calls", action="store_true",
                    help="gemm: log the GEMMs of the steps as layer calls run them (default: as a TrainStep does, "
                         "which runs a CPU classifier's head as one kernel)")
    ap.add_argument("--no-torch", action="store_true", help="do not measure torch as a peer")
    ap.add_argument("--device", default=None, help="NETCL_DEVICE spec: gpu, cpu or a name substring")
    ap.add_argument("--json", default=None, help="also write the results to this JSON file")
    ap.add_argument("--isa", choices=sorted(common.ISA_ENVIRONMENTS), default=None,
                    help="run that instruction set's code paths (netcl's kernels, PoCL's code, the peers') on a CPU "
                         "with a wider one: the process starts again with netcl.apps.common.ISA_ENVIRONMENTS[ISA]")
    args = ap.parse_args(argv)
    common.run_as_isa(args.isa, argv)

    q = netcl.default_queue(args.device)
    torch = None
    if not args.no_torch:
        try:
            import torch

            torch.set_num_threads(os.cpu_count() or 1)
        except ImportError:
            torch = None
    print(f"device: {q.device.name.strip()} ({q.device.platform.name.strip()} {q.device.platform.version.strip()}), "
          f"{os.cpu_count()} host CPUs, repeat {args.repeat}")
    res = {"device": q.device.name.strip(), "repeat": args.repeat}
    if "gemm" in args.only:
        res["gemm"] = bench_gemm(q, args.repeat, args.quick, mode="loop" if args.layer_calls else "trainstep")
    if "layers" in args.only:
        res["layers"] = bench_layers(q, args.repeat, args.quick, torch)
    if "epoch" in args.only:
        res["epoch"] = bench_epoch(q, args.epochs, torch)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
