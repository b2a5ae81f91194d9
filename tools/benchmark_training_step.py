#!/usr/bin/env python3
"""Training-step speed: netcl against PyTorch (and with --tinygrad, tinygrad's OpenCL backend on the
same weights: tools/tinygrad_twin.py), each runtime in its own process, alternated, so that an
OpenCL and a CUDA context never share the GPU at once.

A step is: forward, the loss (MSE for detector26, cross-entropy for the classifiers), backward,
SGD with momentum 0.9, zero_grad; the loss is read back every step, after the optimizer step
(PyTorch: loss.item(); netcl: the PendingLoss's item(), so that neither waits for the device in
the middle of the step). netcl's step is a netcl.TrainStep, which replays the step it recorded
from its third call on (the table's "path" says whether it did); --loop makes it layer calls
(model, loss_fn.enqueue, backward, opt.step), and --eager-loss layer calls reading the loss as its
call returns it, before the backward pass. Each figure is the median of --steps steps after
--warmup steps, the table's the median over the rounds; "per round" is the range of netcl / PyTorch over the rounds (each round's
two processes ran back to back; --json keeps every round). The table also gives netcl's kernel
launches per step (counted in one more step).

    python tools/benchmark_training_step.py --models detector26,cnn,digits --batches 8,32
    python tools/benchmark_training_step.py --device gpu --torch-device cuda --rounds 2 --tinygrad
    python tools/benchmark_training_step.py --profile detector26 --batches 32   # per-layer fwd/bwd
    python tools/benchmark_training_step.py --kernels resnet8 --batches 64       # per-kernel, whole steps

--interleave alternates the runtimes step by step instead of run by run: each runtime stays in its
own warm process (--serve) and, when told, takes --turn-warmup untimed steps and one timed step (the
first step of a turn pays for waking threads and refilling caches after the other runtime's turn,
which a training loop does not; --quiet puts idle seconds between turns, which a training loop does
not have either), and the table gives each pair's netcl / PyTorch ratio (median and middle half)
beside the ratio of the medians: on a shared machine whose speed drifts by the minute, both steps of
a pair see the same conditions. Both processes hold their device contexts throughout (on one GPU:
two contexts, idle in turn).

    python tools/benchmark_training_step.py --threads 2 --models resnet8 --batches 64 --steps 60 --interleave
    python tools/benchmark_training_step.py --models resnet8 --batches 64 --steps 60 --ab NETCL_CPU_WINOT=0

--ab 'NAME=VALUE ...' pairs netcl against itself the same way, side B with those environment
variables set (a kernel choice, a PoCL setting): B / A per pair, where whole runs on a noisy machine
decide nothing about a few percent. Both modes take half their pairs with the processes started in
one order and half in the other: of two identical netcl processes, the one started second takes
shorter steps (a few percent in A/A runs). --ab NETCL_BENCH_SOURCE=/path/to/checkout pairs this
checkout's netcl with another's (before/after a change).

--runtime runs one runtime in this process and prints one JSON line per (model, batch) (the
driver uses it). PyTorch on CUDA runs float32 with TF32 off and cudnn.benchmark on.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

# NETCL_BENCH_SOURCE: another checkout whose netcl this process imports (--ab NETCL_BENCH_SOURCE=...: before/after)
sys.path.insert(0, os.environ.get("NETCL_BENCH_SOURCE") or os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from netcl.apps import common  # noqa: E402
from netcl.apps.bench import torch_layer  # noqa: E402

MODELS = {  # name -> (per-sample input shape, loss, number of classes or None)
    "detector26": ((3, 256, 256), "mse", None),
    "cnn": ((3, 32, 32), "ce", 10),
    "digits": ((1, 8, 8), "ce", 10),
    "resnet8": ((3, 32, 32), "ce", 10),
    "resnet8_module": ((3, 32, 32), "ce", 10),  # resnet8 as a Module subclass (models.ResNet8): autograd's path
    "mobilenetv2_tiny": ((3, 32, 32), "ce", 10),
    "unet_tiny": ((3, 64, 64), "mse", None),
    "vit_tiny": ((1, 8, 8), "ce", 10),
}


def build_netcl(name):
    import netcl
    from netcl import models
    from netcl.apps import recipes

    netcl.manual_seed(0)
    if name == "digits":
        return recipes.digits_cnn()
    if name == "resnet8_module":
        return models.ResNet8()
    return models.build(name)


def data(name, batch, seed=0):
    shape, loss, classes = MODELS[name]
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 1, (batch,) + shape).astype(np.float32)
    if loss == "ce":
        return x, rng.integers(0, classes, batch)
    return x, None  # the target is made from the output's shape


def time_steps(step, sync, steps, warmup):
    for _ in range(warmup):
        step()
    sync()
    ts = []
    for _ in range(steps):
        t = time.perf_counter()
        step()
        sync()
        ts.append(time.perf_counter() - t)
    return 1e3 * statistics.median(ts)


# -- netcl ----------------------------------------------------------------------------------
def netcl_step(name, batch, q, mode="trainstep"):
    """One training step of `name` at `batch` on queue q, as a function (the model built, the data
    on the device): forward, loss, backward, SGD with momentum, zero_grad, the loss's value read.
    mode "trainstep": netcl.TrainStep (replays the recorded step from its third call); "loop":
    the same as layer calls; "eager-loss": layer calls, the loss read as its call returns it,
    before the backward pass. The function's .trainstep is the TrainStep (or None)."""
    import netcl
    from netcl import Tensor, TrainStep, nn, optim

    model = build_netcl(name).to(q).train()
    x, y = data(name, batch)
    xt = Tensor.from_host(q, x)
    with netcl.no_grad():
        out_shape = model.eval()(Tensor.from_host(q, x)).shape if not model.records_as_one() else \
            model.output_shape(x.shape)
    model.train()
    target = y if y is not None else np.random.default_rng(1).uniform(0, 1, out_shape).astype(np.float32)
    # on the device once, as make_torch's target (class indices as float32, checked there by the loss)
    target = Tensor.from_host(q, np.asarray(target, np.float32))
    loss_fn = nn.MSELoss() if y is None else nn.CrossEntropyLoss()
    opt = optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

    if mode == "trainstep":
        train = TrainStep(model, loss_fn, opt)

        def step():
            float(train(xt, target))  # one read per step, after the optimizer step (as torch's loss.item())
        step.trainstep = train
        return step
    def step():
        out = model(xt)
        loss = loss_fn.enqueue(out, target)
        if mode == "eager-loss":
            float(loss)  # read as the call returns it: the queue drains there
        if model.records_as_one():
            model.backward(loss_fn.backward(), input_grad=False)  # as torch: x needs no gradient
        else:  # a Module subclass: autograd (x needs no gradient either)
            out.backward(loss_fn.backward())
        opt.step()
        opt.zero_grad()
        float(loss)  # one read per step (enqueue: here, as torch's loss.item() after the step)
    step.trainstep = None
    return step


def _mode(args):
    return "eager-loss" if getattr(args, "eager_loss", False) else "loop" if getattr(args, "loop", False) else "trainstep"


def make_netcl(name, batch, args):
    """(step, sync, info) of netcl's training step; info() is called after the timed steps."""
    import netcl
    from netcl import ops

    q = netcl.default_queue(args.device)
    step = netcl_step(name, batch, q, _mode(args))

    def info():
        ts = step.trainstep
        path = _mode(args) if ts is None else "replayed" if ts.replays else f"eager: {ts.eager_reason}"
        launches = ts.launches if ts is not None and ts.launches is not None else count_launches(step)
        return {"runtime": "netcl", "device": q.device.name.strip(), "model": name, "batch": batch,
                "launches": launches, "path": path, "lanes": ops.float_lanes(q)}
    return step, q.finish, info


def count_launches(step):
    """Kernel launches in one more step (calls of netcl.ops._enqueue, through which training launches)."""
    from netcl import ops

    enqueue, n = ops._enqueue, [0]

    def counted(*args):
        n[0] += 1
        return enqueue(*args)

    ops._enqueue = counted
    try:
        step()
    finally:
        ops._enqueue = enqueue
    return n[0]


def profile_netcl(name, batch, args):
    """Per-layer forward and backward milliseconds (the queue drained after each). A BatchNorm2d
    and the activation after it run fused as training runs them (netcl.nn.sequential.TRAIN_FUSE;
    NETCL_TRAIN_FUSE=0 turns it off): the BatchNorm's row holds both, the activation's shows 0."""
    import netcl
    from netcl import Tensor
    from netcl.nn.sequential import fuses_with_next

    q = netcl.default_queue(args.device)
    model = build_netcl(name).to(q).train()
    x, _ = data(name, batch)
    layers = [layer for _, layer in model.chain()]
    skipped = {i + 1 for i in range(len(layers) - 1) if fuses_with_next(layers[i], layers[i + 1])}
    rows = []
    for rep in range(args.warmup + args.steps):
        cur = Tensor.from_host(q, x)
        outs = []
        for i, layer in enumerate(layers):
            q.finish()
            t = time.perf_counter()
            if i + 1 in skipped:
                cur = layer.forward(cur, act=layers[i + 1])
            elif i not in skipped:
                cur = layer(cur)
            q.finish()
            outs.append((cur, time.perf_counter() - t))
        dy = Tensor.from_host(q, np.ones(cur.shape, np.float32))
        back = []
        for i in reversed(range(len(layers))):
            q.finish()
            t = time.perf_counter()
            if i not in skipped:
                dy = layers[i].backward(dy)
            q.finish()
            back.append(time.perf_counter() - t)
        if rep >= args.warmup:
            rows.append(([o[1] for o in outs], back[::-1]))
    print(f"== netcl per-layer profile: {name} batch {batch} on {q.device.name.strip()} (median ms) ==")
    print(f"{'#':>3s} {'layer':48s} {'fwd':>8s} {'bwd':>8s}")
    tf = tb = 0.0
    for i, layer in enumerate(layers):
        f = 1e3 * statistics.median(r[0][i] for r in rows)
        b = 1e3 * statistics.median(r[1][i] for r in rows)
        tf, tb = tf + f, tb + b
        print(f"{i:3d} {repr(layer)[:48]:48s} {f:8.3f} {b:8.3f}")
    print(f"    {'total':48s} {tf:8.3f} {tb:8.3f}")


def kernel_profile_netcl(name, batch, args):
    """Per-kernel device milliseconds of whole training steps, from OpenCL profiling events (a
    second queue on the device's context with profiling on; every training launch goes through
    netcl.ops._enqueue): per kernel name, its launches and median total a step, and the step's
    kernel time against its wall time (the rest: gaps between kernels and the host's share)."""
    import pyopencl as cl

    import netcl
    from netcl import ops

    base = netcl.default_queue(args.device)
    q = cl.CommandQueue(base.context, base.device, properties=cl.command_queue_properties.PROFILING_ENABLE)
    step = netcl_step(name, batch, q, "loop" if _mode(args) == "trainstep" else _mode(args))  # launches via ops
    events, enqueue = [], ops._enqueue

    def recorded(queue, k, gsize, lsize, a):
        ev = enqueue(queue, k, gsize, lsize, a)
        events.append((k.function_name, ev))
        return ev

    for _ in range(args.warmup):
        step()
    q.finish()
    per_step, walls = [], []
    ops._enqueue = recorded
    try:
        for _ in range(args.steps):
            events.clear()
            t = time.perf_counter()
            step()
            q.finish()
            walls.append(time.perf_counter() - t)
            by = {}
            for kname, ev in events:
                n, ns = by.get(kname, (0, 0))
                by[kname] = (n + 1, ns + ev.profile.end - ev.profile.start)
            per_step.append((by, len(events), sum(ns for _, ns in by.values())))
    finally:
        ops._enqueue = enqueue
    names = {k for by, _, _ in per_step for k in by}
    rows = sorted(((k, per_step[0][0].get(k, (0, 0))[0], 1e-6 * statistics.median(by.get(k, (0, 0))[1] for by, _, _ in per_step))
                   for k in names), key=lambda r: -r[2])
    busy = 1e-6 * statistics.median(t for _, _, t in per_step)
    wall = 1e3 * statistics.median(walls)
    print(f"== netcl kernels per training step: {name} batch {batch} on {q.device.name.strip()} "
          f"(median of {args.steps} steps) ==")
    print(f"{'kernel':32s} {'launches':>8s} {'ms':>8s} {'share':>6s}")
    for k, n, ms in rows:
        print(f"{k:32s} {n:8d} {ms:8.3f} {100 * ms / busy:5.1f}%")
    print(f"{'kernels (sum of medians may differ)':32s} {per_step[0][1]:8d} {busy:8.3f}")
    print(f"{'step wall time':32s} {'':8s} {wall:8.3f}   (gaps and host: {wall - busy:.3f} ms)")
    return rows, busy, wall


# -- PyTorch --------------------------------------------------------------------------------
def torch_twin(model, torch):
    """The same layers and weights in torch.nn (netcl.apps.bench's twin, shared with `netcl bench`)."""
    twin = torch_layer(torch, model)
    if twin is None:
        raise NotImplementedError(f"no PyTorch twin for a layer of {type(model).__name__}")
    return twin


def make_torch(name, batch, args):
    import torch

    dev = torch.device(args.torch_device)
    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    if dev.type == "cuda":
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.benchmark = True
    twin = "resnet8" if name == "resnet8_module" else name  # the same layers as a Sequential
    model = torch_twin(build_netcl(twin), torch).to(dev).train()
    x, y = data(name, batch)
    xt = torch.tensor(x, device=dev)
    with torch.no_grad():
        out_shape = model(xt).shape
    if y is None:
        target = torch.tensor(np.random.default_rng(1).uniform(0, 1, tuple(out_shape)).astype(np.float32), device=dev)
        loss_fn = torch.nn.MSELoss()
    else:
        target, loss_fn = torch.tensor(y, device=dev), torch.nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

    def step():
        loss = loss_fn(model(xt), target)
        loss.backward()
        opt.step()
        opt.zero_grad()
        loss.item()

    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    label = f"torch {torch.__version__} {dev.type}" + ("" if dev.type == "cuda" else
                                                        f" {torch.get_num_threads()}t {torch.backends.cpu.get_cpu_capability()}")
    return step, sync, lambda: {"runtime": "torch", "device": label, "model": name, "batch": batch}


# -- tinygrad -------------------------------------------------------------------------------
def make_tinygrad(name, batch, args):
    """The same model and weights in tinygrad (DEV=CL: its OpenCL backend), TinyJit, SGD momentum."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import tinygrad_twin

    tinygrad_twin.pip_opencl()
    from importlib.metadata import version

    from tinygrad import Device

    model = build_netcl(name).train()
    x, y = data(name, batch)
    if y is None:
        out_shape = model.output_shape(x.shape)
        target, loss = np.random.default_rng(1).uniform(0, 1, out_shape).astype(np.float32), "mse"
    else:
        target, loss = y, "ce"
    step = tinygrad_twin.train_step(model, x, target, loss)  # .item() each step: the sync
    dev = Device[Device.DEFAULT]
    label = f"tinygrad {version('tinygrad')} {Device.DEFAULT} {getattr(dev, 'device_name', '')}".strip()
    return step, lambda: None, lambda: {"runtime": "tinygrad", "device": label, "model": name, "batch": batch}


MAKERS = {"netcl": make_netcl, "torch": make_torch, "tinygrad": make_tinygrad}


def run_runtime(rt, name, batch, args):
    """One runtime's median step time over args.steps after args.warmup, with its info."""
    step, sync, info = MAKERS[rt](name, batch, args)
    ms = time_steps(step, sync, args.steps, args.warmup)
    return dict(info(), step_ms=ms)


def serve(rt, name, batch, args):
    """--serve: build the step, run the warm-up, print the runtime's info as a JSON line, then for
    each "step" line on stdin time one step and print its milliseconds (the --interleave driver's
    child); "quit" or the end of stdin ends it, with the info again (netcl's path and launches as
    the timed steps ran)."""
    step, sync, info = MAKERS[rt](name, batch, args)
    for _ in range(args.warmup):
        step()
    sync()
    print(json.dumps(info()), flush=True)
    for line in sys.stdin:
        if line.strip() != "step":
            break
        for _ in range(args.turn_warmup):  # after the other runtime's turn: threads awake, caches refilled
            step()
        sync()
        t = time.perf_counter()
        step()
        sync()
        print(f"{1e3 * (time.perf_counter() - t):.6f}", flush=True)
    print(json.dumps(info()), flush=True)


def driver(args):
    runtimes = ["netcl", "torch"] + (["tinygrad"] if args.tinygrad else [])
    results = {}
    env = dict(os.environ, DEV=os.environ.get("DEV", "CL"))  # tinygrad's OpenCL backend, as the issue measures it
    for rnd in range(args.rounds):
        for rt in (runtimes if rnd % 2 == 0 else runtimes[::-1]):
            cmd = [sys.executable, __file__, "--runtime", rt] + [a for a in sys.argv[1:] if a != "--runtime"]
            out = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if out.returncode != 0:
                print(f"{rt}: failed\n{out.stderr[-2000:]}", file=sys.stderr)
                continue
            for line in out.stdout.splitlines():
                if line.startswith("{"):
                    r = dict(json.loads(line), round=rnd)
                    results.setdefault((r["model"], r["batch"]), {}).setdefault(rt, []).append(r)
    tg = "tinygrad" in runtimes
    print(f"{'model':12s} {'batch':>5s} {'netcl ms':>10s} {'torch ms':>10s} {'netcl/torch':>12s} {'per round':>11s}"
          + (f" {'tinygrad ms':>12s} {'netcl/tinygrad':>15s}" if tg else "") + f" {'launches':>8s}  path; devices")
    rows = []

    def med(by, rt):
        return statistics.median(r["step_ms"] for r in by[rt]) if rt in by else float("nan")
    for (model, batch), by in results.items():
        n, t, g = med(by, "netcl"), med(by, "torch"), med(by, "tinygrad")
        launches = by["netcl"][0]["launches"] if "netcl" in by else 0
        path = "; ".join(sorted({r.get("path", "?") for r in by.get("netcl", [])}))
        devs = "; ".join(sorted({r["device"] for rs in by.values() for r in rs}))
        # each round's two processes ran back to back: their ratio, round by round, shows the spread
        rounds = {rt: {r["round"]: r["step_ms"] for r in by.get(rt, [])} for rt in runtimes}
        per_round = [ms / rounds["torch"][i] for i, ms in rounds["netcl"].items() if i in rounds["torch"]]
        rounds = {rt: [ms for _, ms in sorted(v.items())] for rt, v in rounds.items()}  # JSON: in round order
        spread = f"{min(per_round):.2f}-{max(per_round):.2f}x" if per_round else "-"
        print(f"{model:12s} {batch:5d} {n:10.2f} {t:10.2f} {n / t:11.2f}x {spread:>11s}"
              + (f" {g:12.2f} {n / g:14.2f}x" if tg else "") + f" {launches or 0:8d}  {path}; {devs}")
        rows.append({"model": model, "batch": batch, "netcl_ms": n, "torch_ms": t, "ratio": n / t,
                     "netcl_launches": launches, "netcl_path": path, "devices": devs, "rounds_ms": rounds, "ratio_rounds": per_round})
        if tg:
            rows[-1].update(tinygrad_ms=g, ratio_tinygrad=n / g)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


def interleave(args):
    """--interleave: each runtime in its own process (serve), kept warm; their turns alternate one
    by one (the order swapped every pair), args.quiet idle seconds apart. On a shared machine whose
    speed drifts by the minute, step pairs see the same conditions where a round of whole runs did
    not: per pair, the first side's step over the second's, and their median and middle half. With
    --ab, the sides are netcl as it is and netcl with the given environment (B / A per pair)."""
    env = dict(os.environ, DEV=os.environ.get("DEV", "CL"))
    if args.ab:
        sides = [("A", "netcl", env), ("B", "netcl", dict(env, **dict(kv.split("=", 1) for kv in args.ab.split())))]
        first, second = "B", "A"
    else:
        sides = [(rt, rt, env) for rt in ["netcl", "torch"] + (["tinygrad"] if args.tinygrad else [])]
        first, second = "netcl", "torch"
    tg = any(label == "tinygrad" for label, _, _ in sides)
    print(f"{'model':12s} {'batch':>5s} {first + ' ms':>10s} {second + ' ms':>10s} {first + '/' + second:>12s}"
          f" {'pairs: median':>14s} {'middle half':>12s}" + (f" {'tinygrad ms':>12s} {'netcl/tinygrad':>15s}" if tg else "")
          + "  steps; devices" + (f"  (B: {args.ab})" if args.ab else ""))
    rows = []
    labels = [label for label, _, _ in sides]
    for model in args.models:
        for batch in args.batches:
            times, infos = {label: [] for label in labels}, {}
            # two halves, the processes started in one order and then the other: of two identical
            # netcl processes the one started second takes shorter steps (A/A runs), a bias the
            # halves cancel
            for half, order in enumerate((sides, sides[::-1])):
                steps = args.steps // 2 if half == 0 else args.steps - args.steps // 2
                _pairs(model, batch, order, steps, args, times, infos)
            n, t = statistics.median(times[first]), statistics.median(times[second])
            pairs = [a / b for a, b in zip(times[first], times[second])]
            lo, pm, hi = statistics.quantiles(pairs, n=4, method="inclusive") if len(pairs) > 1 else pairs * 3
            g = statistics.median(times["tinygrad"]) if tg else None
            devs = "; ".join(sorted({info["device"] for info in infos.values()}))
            print(f"{model:12s} {batch:5d} {n:10.2f} {t:10.2f} {n / t:11.2f}x {pm:13.2f}x {lo:5.2f}-{hi:.2f}x"
                  + (f" {g:12.2f} {n / g:14.2f}x" if g else "") + f"  {args.steps}; {devs}")
            if args.ab:
                rows.append({"model": model, "batch": batch, "a_ms": t, "b_ms": n, "b_env": args.ab, "ratio": n / t,
                             "ratio_pairs_median": pm, "ratio_pairs_middle_half": [lo, hi], "steps_ms": times})
                continue
            rows.append({"model": model, "batch": batch, "netcl_ms": n, "torch_ms": t, "ratio": n / t,
                         "ratio_pairs_median": pm, "ratio_pairs_middle_half": [lo, hi], "steps_ms": times,
                         "netcl_launches": infos["netcl"].get("launches"), "netcl_path": infos["netcl"].get("path"),
                         "devices": devs} | ({"tinygrad_ms": g, "ratio_tinygrad": n / g} if g else {}))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


def _pairs(model, batch, sides, steps, args, times, infos):
    """`steps` turns of each side in alternation (--interleave), the sides' processes started in the
    order given; each timed step appended to times[label], each side's info to infos."""
    procs = {}
    try:
        for label, rt, side_env in sides:  # started one after another: each compiles and warms up alone
            cmd = [sys.executable, __file__, "--serve", rt, "--models", model, "--batches", str(batch)] + argv_of(args)
            procs[label] = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=side_env)
            line = procs[label].stdout.readline()
            if not line.startswith("{"):
                raise RuntimeError(f"{label} did not start: {procs[label].communicate()[1] or line}")
            infos[label] = json.loads(line)
        labels = [label for label, _, _ in sides]
        for i in range(steps):
            for label in (labels if i % 2 == 0 else labels[::-1]):
                time.sleep(args.quiet)
                procs[label].stdin.write("step\n")
                procs[label].stdin.flush()
                line = procs[label].stdout.readline()
                if not line.strip():
                    raise RuntimeError(f"{label} ({model}, batch {batch}) stopped at its step {i + 1} (its error above)")
                times[label].append(float(line))
    finally:
        for label, p in procs.items():
            try:
                p.stdin.write("quit\n")
                p.stdin.close()
                last = p.stdout.read().strip().splitlines()  # the info as the timed steps ran
                if last and last[-1].startswith("{"):
                    infos[label] = json.loads(last[-1])
            except OSError:
                pass
            p.wait(timeout=60)


def argv_of(args):
    """The options a --serve child needs from this run's (device, threads, warm-up, netcl's mode)."""
    out = ["--warmup", str(args.warmup), "--torch-device", args.torch_device, "--turn-warmup", str(args.turn_warmup)]
    out += ["--device", args.device] if args.device else []
    out += ["--threads", str(args.threads)] if args.threads else []
    out += ["--loop"] if args.loop else []
    out += ["--eager-loss"] if args.eager_loss else []
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--models", type=common.names, default=["detector26", "cnn", "digits"],
                    help=f"comma-separated, of {', '.join(MODELS)}")
    ap.add_argument("--batches", type=common.positive_ints, default=[8, 32], help="comma-separated batch sizes")
    ap.add_argument("--steps", type=common.positive_int, default=20, help="timed steps (median)")
    ap.add_argument("--warmup", type=common.positive_int, default=3, help="untimed steps first (compiles)")
    ap.add_argument("--rounds", type=common.positive_int, default=2, help="alternations of the runtimes")
    ap.add_argument("--device", default=None, help="netcl's device: gpu, cpu or a name substring")
    ap.add_argument("--torch-device", default="cpu", help="PyTorch's device: cpu or cuda")
    ap.add_argument("--threads", type=common.positive_int, default=None, help="PyTorch CPU threads")
    ap.add_argument("--runtime", choices=sorted(MAKERS), default=None, help="run one runtime here (JSON lines)")
    ap.add_argument("--serve", choices=sorted(MAKERS), default=None,
                    help="run one runtime here, a step per 'step' line on stdin (--interleave's child)")
    ap.add_argument("--interleave", action="store_true",
                    help="alternate the runtimes step by step (each in its own warm process) instead of whole "
                         "runs: per-pair ratios, robust to a shared machine's drifting speed")
    ap.add_argument("--ab", default=None, metavar="'NAME=VALUE ...'",
                    help="--interleave netcl against itself with these environment variables set on side B "
                         "(e.g. 'NETCL_CPU_WINOT=0'): B / A per pair")
    ap.add_argument("--quiet", type=float, default=0.0,
                    help="--interleave: idle seconds between turns (default none: the CPU stays as busy as in a "
                         "training loop, and each turn's untimed step absorbs the other runtime's spinning threads)")
    ap.add_argument("--turn-warmup", type=int, default=1,
                    help="--interleave: untimed steps at the start of each turn, before the timed one")
    ap.add_argument("--profile", default=None, help="print netcl's per-layer forward/backward times of this model")
    ap.add_argument("--kernels", default=None,
                    help="print netcl's per-kernel device time over whole training steps of this model")
    ap.add_argument("--eager-loss", action="store_true",
                    help="netcl reads the loss as its call returns it (a float), before the backward pass, "
                         "instead of after the optimizer step (loss_fn.enqueue)")
    ap.add_argument("--loop", action="store_true",
                    help="netcl's step as layer calls (model, loss.enqueue, backward, opt.step) instead of "
                         "netcl.TrainStep, which replays the recorded step")
    ap.add_argument("--json", default=None, help="also write the table to this JSON file")
    ap.add_argument("--tinygrad", action="store_true",
                    help="add tinygrad (pip tinygrad; its OpenCL backend, DEV=CL unless DEV is set) as a third runtime")
    ap.add_argument("--isa", choices=sorted(common.ISA_ENVIRONMENTS), default=None,
                    help="run that instruction set's code paths (netcl's kernels, PoCL's code, the peers') on a CPU "
                         "with a wider one: the process starts again with netcl.apps.common.ISA_ENVIRONMENTS[ISA]")
    args = ap.parse_args(argv)
    common.run_as_isa(args.isa, argv)
    unknown = [m for m in list(args.models) + [m for m in (args.profile, args.kernels) if m] if m not in MODELS]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; expected some of {list(MODELS)}")
    if args.quiet < 0 or args.turn_warmup < 0:
        ap.error(f"--quiet and --turn-warmup take 0 or more, got {args.quiet} and {args.turn_warmup}")
    if args.profile:
        for b in args.batches:
            profile_netcl(args.profile, b, args)
        return 0
    if args.kernels:
        for b in args.batches:
            kernel_profile_netcl(args.kernels, b, args)
        return 0
    if args.serve:
        serve(args.serve, args.models[0], args.batches[0], args)
        return 0
    if args.runtime:
        for m in args.models:
            for b in args.batches:
                print(json.dumps(run_runtime(args.runtime, m, b, args)), flush=True)
        return 0
    if args.ab and not all("=" in kv for kv in args.ab.split()):
        ap.error(f"--ab takes NAME=VALUE pairs, got {args.ab!r}")
    if args.interleave or args.ab:
        interleave(args)
        return 0
    driver(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
