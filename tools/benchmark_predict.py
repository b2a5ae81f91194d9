#!/usr/bin/env python3
"""Fused predict() latency, paired: side A is this checkout's netcl as the environment has it, side B
the same with --ab's environment variables set, or another checkout's netcl (--against), or both.
Each side runs in a child process of its own (a fresh plan, built under its own environment); the
sides take turns round by round, half the rounds B first. Printed per (model, batch): each side's
median over the rounds of its per-round median, and the median of the per-round ratios B / A with
their range. Every figure is a full host -> device -> host predict() of a reference model.

    # the GPU conv family's split-K on and off (NETCL_GPU_SPLIT=0: one launch per conv, unsplit)
    NETCL_DEVICE=gpu python tools/benchmark_predict.py --models detector26,resnet8 --batches 1,8,32 \\
        --ab NETCL_GPU_SPLIT=0
    # this checkout against another (e.g. the main branch's), split-K on in both
    NETCL_DEVICE=gpu python tools/benchmark_predict.py --models detector26,resnet8 --against /work/main
    # the 1-D keyword-spotting workload (WORKLOADS) against the main branch, on the default device
    python tools/benchmark_predict.py --models kws1d --batches 1,32 --against /tmp/base
    # Intel's OpenCL CPU runtime against PoCL (docs/DEVICES.md says how to register Intel's)
    python tools/benchmark_predict.py --models resnet8 --batches 32 --ab 'NETCL_DEVICE="Intel(R) OpenCL"'
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def kws1d(nn):
    """Keyword spotting on 40 MFCC bands x 49 frames: (Conv1d(k=5) -> BatchNorm1d -> ReLU) x 3 at 64
    channels, global average pool, Linear(64, 12). Built here from the public API (not a reference
    model of netcl.models), so that a checkout without it measures it too."""
    block = lambda c_in, pad=0: [nn.Conv1d(c_in, 64, 5, padding=pad), nn.BatchNorm1d(64), nn.ReLU()]  # noqa: E731
    return nn.Sequential(*block(40), *block(64), *block(64, 2), nn.AdaptiveAvgPool1d(1), nn.Flatten(),
                         nn.Linear(64, 12))


def cnn_mish(nn):
    """netcl.models.cnn with Mish for its activations: Conv2d-BatchNorm2d-Mish-MaxPool2d(2) twice, Linear."""
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.Mish(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.Mish(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 4 * 4, 10))


kws1d.input_shape = (40, 49)
cnn_mish.input_shape = (3, 32, 32)
WORKLOADS = {"kws1d": kws1d, "cnn_mish": cnn_mish}  # --models names besides netcl.models' reference models


def child(args):
    """One side, one round: {"model:batch": median ms} as a JSON line."""
    sys.path.insert(0, args.checkout)
    import numpy as np

    import netcl
    from netcl import models

    q = netcl.default_queue()
    out = {"device": q.device.name.strip(), "platform": q.device.platform.name.strip()}
    for name in args.models.split(","):
        netcl.manual_seed(0)
        build = WORKLOADS.get(name)
        if build is None:
            build = getattr(models, name)
            model = build().eval()
        else:
            model = build(netcl.nn).eval()
        for batch in [int(b) for b in args.batches.split(",")]:
            x = np.random.default_rng(batch).normal(size=(batch,) + tuple(build.input_shape)).astype(np.float32)
            for _ in range(args.warmup):
                model.predict(x, q)
            times = []
            for _ in range(args.repeats):
                t = time.perf_counter()
                model.predict(x, q)
                times.append(time.perf_counter() - t)
            out[f"{name}:{batch}"] = 1e3 * statistics.median(times)
    print(json.dumps(out))


def run_side(args, checkout, env):
    argv = [sys.executable, os.path.abspath(__file__), "--child", "--checkout", checkout, "--models", args.models,
            "--batches", args.batches, "--repeats", str(args.repeats), "--warmup", str(args.warmup)]
    r = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **env})
    if r.returncode != 0:
        sys.exit(f"side {checkout} {env or ''} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--models", default="detector26,resnet8")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=30, help="timed predicts per side per round (their median)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--ab", default="", help="side B's environment, 'NAME=VALUE NAME=\"VALUE WITH SPACES\"'")
    ap.add_argument("--against", default=None, help="side B's checkout (its netcl/), default this one")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--checkout", default=HERE, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    env_b = dict(kv.split("=", 1) for kv in shlex.split(args.ab)) if args.ab else {}
    if "=" in args.ab and not env_b:
        sys.exit("--ab takes 'NAME=VALUE ...'")
    b_checkout = os.path.abspath(args.against) if args.against else HERE
    sides = {"A": [], "B": []}
    for r in range(args.rounds):
        order = ("A", "B") if r % 2 == 0 else ("B", "A")
        for s in order:
            sides[s].append(run_side(args, HERE, {}) if s == "A" else run_side(args, b_checkout, env_b))
    a0, b0 = sides["A"][0], sides["B"][0]
    print(f"A: {HERE} on {a0['device']} ({a0['platform']})")
    print(f"B: {b_checkout} {args.ab} on {b0['device']} ({b0['platform']})")
    print(f"{'model:batch':20s} {'A ms':>9s} {'B ms':>9s} {'B / A':>7s}  per round")
    for key in (k for k in a0 if ":" in k):
        a = [s[key] for s in sides["A"]]
        b = [s[key] for s in sides["B"]]
        ratios = [y / x for x, y in zip(a, b)]
        print(f"{key:20s} {statistics.median(a):9.3f} {statistics.median(b):9.3f} {statistics.median(ratios):7.3f}"
              f"  {min(ratios):.3f}-{max(ratios):.3f}")


if __name__ == "__main__":
    main()
