#!/usr/bin/env python3
"""How long a user waits before the first result: the first training step and the first predict of
each reference model, with the kernel caches empty, then a new batch size, input size and width with
them warm, and the steady step for comparison.

Per model, NETCL_CACHE_DIR and POCL_CACHE_DIR point at new empty folders, and each phase runs in a
child process of its own (one JSON line back), in this order:

  cold    the first TrainStep call (forward, loss, backward, SGD with momentum, zero_grad; the
          loss read), wall clock from the call; then the first predict() of the same batch in eval
          mode; then (once the kernels building in the background are built: settle_s) the steady
          step and predict (medians of --steps after --warmup)
  batch   warm caches, a new process: the first step at --new-batch (and its first predict)
  input   the same at 1.5x the input's height and width (models whose layers take it)
  width   the same with every channel count a multiple of 8 times 1.5 (16 -> 24, ...; the input's
          channels and the classes kept; models whose layers take it)
  again   warm caches, a new process, the cold phase's shape: what a second run of a script pays

Each first call is timed by the wall clock and by the process's CPU time (every thread's: PoCL
compiles on one core, so on a busy machine the CPU seconds say more about the compiler's work than
the wall clock does). Each phase also reports the programs its process built ("compiled": from source; "loaded": from
netcl's disk cache) and the seconds spent in runtime.program.build. --source runs the children
against another checkout's netcl (before/after figures from one tool):

    python tools/benchmark_first_step.py                                  # every reference model
    python tools/benchmark_first_step.py --models resnet8,cnn --json out/first.json
    python tools/benchmark_first_step.py --models resnet8 --source /tmp/netcl-before
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = ("mlp", "cnn", "resnet8", "mobilenetv2_tiny", "unet_tiny", "vit_tiny", "detector26")
PHASES = ("cold", "batch", "input", "width", "again")
_WIDTH_KEYS = ("in_channels", "out_channels", "num_features", "groups", "in_features", "out_features",
               "normalized_shape", "embed_dim")


# -- the child: one phase of one model --------------------------------------------------------
def _widened(model, input_channels):
    """`model` rebuilt with every channel count (and feature count) that is a multiple of 8 times 1.5,
    except the first layer's input side (its `input_channels`): the same architecture, wider."""
    from netcl import nn
    from netcl.io.netcl_format import architecture

    first = [True]

    def scale(entry):
        config = dict(entry["config"])
        for key in _WIDTH_KEYS:
            v = config.get(key)
            keep = first[0] and key in ("in_channels", "in_features") and v == input_channels
            if isinstance(v, int) and not isinstance(v, bool) and v % 8 == 0 and v > 1 and not keep:
                config[key] = v * 3 // 2
        if any(k in config for k in ("in_channels", "in_features")):
            first[0] = False
        children = {name: scale(sub) for name, sub in entry.get("children", [])}
        return nn.LAYERS[entry["type"]].from_config(config, children)

    return nn.Sequential(*[scale(e) for e in architecture(model)])


def _setup(name, phase, batch):
    """(model, per-sample input shape) for the phase, or None where the model does not take it."""
    import netcl
    from netcl import models

    netcl.manual_seed(0)
    model, shape = models.build(name), tuple(models.MODELS[name].input_shape)
    if phase == "input":
        if len(shape) != 3:
            return None
        shape = (shape[0], shape[1] * 3 // 2, shape[2] * 3 // 2)
    if phase == "width":
        model = _widened(model, shape[0])
    try:
        model.output_shape((batch,) + shape)
    except ValueError:
        return None
    return model, shape


def _counts():
    from netcl.runtime import program

    s = program.stats
    return {"compiled": s["compiled"], "loaded": s["disk"], "build_s": round(s.get("seconds", 0.0), 2),
            "waited_s": round(s.get("waited", 0.0), 2)}


def _timed_builds():
    """Count the seconds runtime.program.build spends (where the library does not count them itself)."""
    from netcl.runtime import program

    if "seconds" in program.stats:
        return
    program.stats["seconds"] = 0.0
    build = program.build

    def timed(*args, **kwargs):
        t = time.perf_counter()
        try:
            return build(*args, **kwargs)
        finally:
            program.stats["seconds"] += time.perf_counter() - t
    import netcl.runtime as runtime

    program.build = runtime.build = timed


def child(name, phase, batch, steps, warmup):
    import numpy as np

    import netcl
    from netcl import TrainStep, nn, optim

    t = time.perf_counter()
    q = netcl.default_queue()
    setup_s = time.perf_counter() - t
    _timed_builds()
    made = _setup(name, phase, batch)
    if made is None:
        return {"model": name, "phase": phase, "skipped": "the model does not take this shape"}
    model, shape = made
    model.to(q).train()
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (batch,) + shape).astype(np.float32)
    out_shape = model.output_shape(x.shape)
    if len(out_shape) == 2 and out_shape[1] <= 16:  # a classifier
        loss_fn, y = nn.CrossEntropyLoss(), rng.integers(0, out_shape[1], batch)
    else:
        loss_fn, y = nn.MSELoss(), rng.uniform(0, 1, out_shape).astype(np.float32)
    step = TrainStep(model, loss_fn, optim.SGD(model.parameters(), lr=1e-3, momentum=0.9))
    row = {"model": name, "phase": phase, "batch": batch, "input": list(shape), "setup_s": round(setup_s, 2)}

    t, c = time.perf_counter(), time.process_time()
    float(step(x, y))
    row["train_s"], row["train_cpu_s"] = round(time.perf_counter() - t, 3), round(time.process_time() - c, 2)
    row.update({"train_" + k: v for k, v in _counts().items()})
    model.eval()
    before = _counts()
    t, c = time.perf_counter(), time.process_time()
    model.predict(x)
    row["predict_s"], row["predict_cpu_s"] = round(time.perf_counter() - t, 3), round(time.process_time() - c, 2)
    row.update({"predict_" + k: v - before[k] for k, v in _counts().items()})
    tiers = getattr(netcl.runtime, "tiers", None)  # (a checkout before the kernel tiers has none)
    if tiers is not None:  # the specialised kernels the background still builds: before the steady steps
        t = time.perf_counter()
        row["background_left"] = tiers.pending()
        tiers.settle()
        row["settle_s"] = round(time.perf_counter() - t, 2)
    if phase == "cold":
        ts = []
        for i in range(warmup + steps):
            t = time.perf_counter()
            model.predict(x)
            ts.append(time.perf_counter() - t)
        row["predict_ms"] = round(1e3 * statistics.median(ts[warmup:]), 2)
        model.train()
        ts = []
        for i in range(warmup + steps):
            t = time.perf_counter()
            float(step(x, y))
            ts.append(time.perf_counter() - t)
        row["step_ms"] = round(1e3 * statistics.median(ts[warmup:]), 2)
        row["replayed"] = bool(step.replays)
    return row


# -- the driver --------------------------------------------------------------------------------
def run_phase(name, phase, batch, env, args):
    argv = [sys.executable, os.path.abspath(__file__), "--child", phase, "--models", name, "--batch", str(batch),
            "--steps", str(args.steps), "--warmup", str(args.warmup)]
    t = time.perf_counter()
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=args.timeout)
    wall = time.perf_counter() - t
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if r.returncode or not lines:
        return {"model": name, "phase": phase, "error": (r.stderr.strip().splitlines() or ["?"])[-1][:300]}
    row = json.loads(lines[-1])
    row["process_s"] = round(wall, 2)
    row["stderr_lines"] = len([ln for ln in r.stderr.splitlines() if ln.strip()])
    return row


def fmt(v, unit=""):
    return "-" if v is None else f"{v:.2f}{unit}" if isinstance(v, float) else str(v)


def table(rows):
    head = ("| model | phase | batch | input | first step s (CPU s) | builds (compiled/loaded, s) | first predict s (CPU s) | "
            "steady step ms | steady predict ms | stderr lines |")
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        if "error" in r or "skipped" in r:
            out.append(f"| {r['model']} | {r['phase']} | | | {r.get('error') or r.get('skipped')} | | | | | |")
            continue
        builds = f"{r['train_compiled']}/{r['train_loaded']}, {r['train_build_s']:.1f}"
        out.append(f"| {r['model']} | {r['phase']} | {r['batch']} | {'x'.join(map(str, r['input']))} | "
                   f"{r['train_s']:.2f} ({r.get('train_cpu_s', 0):.1f}) | {builds} | {r['predict_s']:.2f} ({r.get('predict_cpu_s', 0):.1f}) | {fmt(r.get('step_ms'))} | "
                   f"{fmt(r.get('predict_ms'))} | {r['stderr_lines']} |")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated (default: every reference model)")
    ap.add_argument("--phases", default=",".join(PHASES), help="comma-separated, of " + ", ".join(PHASES))
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--new-batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=20, help="timed steady steps (and predicts)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--timeout", type=int, default=1800, help="seconds a phase may take")
    ap.add_argument("--source", default=None, help="a checkout whose netcl the children import (default: this one)")
    ap.add_argument("--keep-caches", default=None, help="a folder to keep each model's caches in (default: removed)")
    ap.add_argument("--json", default=None, help="write the rows here too")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    if args.child:
        print(json.dumps(child(models[0], args.child, args.batch, args.steps, args.warmup)), flush=True)
        return 0
    phases = [p for p in args.phases.split(",") if p]
    bad = [p for p in phases if p not in PHASES]
    if bad:
        ap.error(f"unknown phases {bad}; expected some of {', '.join(PHASES)}")
    source = os.path.abspath(args.source or ROOT)
    rows = []
    for name in models:
        caches = tempfile.mkdtemp(prefix=f"netcl-first-{name}-", dir=args.keep_caches)
        env = dict(os.environ, NETCL_CACHE_DIR=os.path.join(caches, "netcl"), POCL_CACHE_DIR=os.path.join(caches, "pocl"),
                   PYTHONPATH=os.pathsep.join([source] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
        os.makedirs(env["POCL_CACHE_DIR"])
        for phase in phases:
            batch = args.new_batch if phase == "batch" else args.batch
            row = run_phase(name, phase, batch, env, args)
            rows.append(row)
            print(json.dumps(row), flush=True)
        if args.keep_caches is None:
            shutil.rmtree(caches, ignore_errors=True)
    print("\nnetcl from", source, "\n")
    print(table(rows))
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
