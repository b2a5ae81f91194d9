"""Paired A/B of a kernel-source change on one layer's training passes (or a small Sequential's).

Side A builds netcl's kernels as they are; side B builds one family from a patched copy of
netcl/kernels/<family>.cl (--source, whose `#include "x.h"` lines take netcl's headers as the
original's do) and every other family as A does. Each side keeps its own program cache. The sides
take turns in rounds (--calls forward + backward passes on one side, then as many on the other;
every other round B goes first), so that a shared machine's drifting speed falls on both sides
of a pair. Printed: each side's median ms per call, the median of the per-round ratios B / A and
their middle half, and the largest difference between the two sides' outputs, input gradients and
parameter gradients (relative to A's largest value of each), which says whether the patch changed
the arithmetic or only the speed.

    python tools/ab_kernels.py --source /tmp/convtrain_cpu.cl \\
        --layer "Conv2d(16, 32, 3, stride=2, padding=1)" --input 64,16,32,32
    python tools/ab_kernels.py --source /tmp/norm_cpu.cl --isa avx2 --input 64,3,32,32 \\
        --layer "Sequential(Conv2d(3, 16, 3, padding=1), BatchNorm2d(16), ReLU())"

With --step MODEL:BATCH instead of --layer and --input, the sides are two replayed training steps
of a model of tools/benchmark_training_step.py (the same weights and data, each recorded with its
side's kernels, each pair's steps drawing the same random numbers), taking turns step by step in
one process on a profiling queue. Printed: the median duration of each launch of the family's
kernels on either side (OpenCL profiling events), the sums over all launches, the steps' wall
times and the median of the per-pair ratios B / A, and the largest difference of B's parameters
from A's after the same steps.

    python tools/ab_kernels.py --source /tmp/conv_winot.cl --step resnet8:64 --rounds 30

With --set GROUP.KEY=VALUE instead of --source, side B is netcl as it is with that value of the
tuning table (netcl/kernels/tuning.json, for --class or the device's class); --write records it
there, with the CPU, driver and commit it was measured on, when B is 3% faster or more:

    python tools/ab_kernels.py --set conv_train.RM=4 --layer "Conv2d(16, 16, 3, padding=1)" \
        --input 64,16,32,32 --write

The family is the source file's name (convtrain_cpu.cl: convtrain_cpu) unless --family names it.
The layer expression is evaluated with netcl.nn's public names only and no builtins: it is your
own command line, not a file's contents.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import netcl  # noqa: E402
from netcl import Tensor, nn, ops, runtime, tuning  # noqa: E402
from netcl.apps import common  # noqa: E402
from netcl.nn.module import manual_seed, rng, set_rng  # noqa: E402
from netcl.runtime import program  # noqa: E402


WIN = 0.03  # --write records a value that is at least this much faster (the pairs' median)


def build_layer(expr):
    """The netcl.nn layer `expr` describes, e.g. "Conv2d(16, 32, 3, padding=1)"."""
    names = {name: getattr(nn, name) for name in dir(nn) if not name.startswith("_")}
    try:
        layer = eval(expr, {"__builtins__": {}}, names)  # noqa: S307 (the user's own command line)
    except Exception as e:
        raise ValueError(f"--layer {expr!r} is not a netcl.nn layer expression: {e}") from e
    if not isinstance(layer, nn.Module):
        raise ValueError(f"--layer {expr!r} gives a {type(layer).__name__}, not a netcl.nn layer")
    return layer


class Side:
    """A side of the A/B: while entered, netcl builds kernels into this side's own cache, family
    `family` from `source` (already with its headers) where given, and with the tuning table's value
    `setting` (group, class, key, value) where given."""

    def __init__(self, family=None, source=None, setting=None):
        self.family, self.source, self.setting, self.cache = family, source, setting, {}

    def __enter__(self):
        self.saved = runtime._kernels, runtime.kernel_source
        runtime._kernels = self.cache
        if self.source is not None:
            original = self.saved[1]
            runtime.kernel_source = lambda family: self.source if family == self.family else original(family)
        self.overriding = tuning.override(*self.setting) if self.setting else None
        if self.overriding is not None:
            self.overriding.__enter__()
        return self

    def __exit__(self, *exc):
        if self.overriding is not None:
            self.overriding.__exit__(*exc)
        runtime._kernels, runtime.kernel_source = self.saved


def parse_setting(text, cls):
    """--set GROUP.KEY=VALUE (VALUE as JSON: 4, true, [4, 8]) for device class cls: (group, cls, key,
    value), checked against the table."""
    name, eq, value = text.partition("=")
    group, dot, key = name.partition(".")
    if not (eq and dot and group and key):
        raise ValueError(f"--set {text!r}: expected GROUP.KEY=VALUE, e.g. conv_train.RM=4")
    try:
        value = json.loads(value)
    except json.JSONDecodeError:
        raise ValueError(f"--set {text!r}: the value must be JSON (a number, true, [4, 8])") from None
    if key not in tuning.values(group, cls):
        raise ValueError(f"--set {text!r}: the tuning table's {group!r} rows have no {key!r}; expected one of "
                         f"{', '.join(map(str, tuning.values(group, cls)))}")
    return group, cls, key, value


def provenance(q):
    """Where a measurement ran, for the tuning table's rows: the CPU (or device), driver, commit."""
    cpu = q.device.name.strip()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=os.path.dirname(os.path.abspath(__file__)), timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return {"cpu": cpu, "driver": f"{q.device.platform.name.strip()} {q.device.platform.version.strip()}",
            "commit": commit or "unknown"}


def _largest_difference(a, b):
    """max |a - b| / max |a| over the arrays of two sides' results, in order (0 where both are 0)."""
    worst = 0.0
    for u, v in zip(a, b):
        scale = float(np.abs(u).max()) if u.size else 0.0
        diff = float(np.abs(u - v).max()) if u.size else 0.0
        worst = max(worst, diff / scale if scale > 0 else diff)
    return worst


def _sources(source_path, family):
    """(family, netcl's source of it, the patched source with its headers): the family is the
    file's name unless given."""
    family = family or os.path.splitext(os.path.basename(source_path))[0]
    try:
        original = program.kernel_source(family)
    except FileNotFoundError:
        raise ValueError(f"no kernel family {family!r} (netcl/kernels/{family}.cl) for --source {source_path}: "
                         "name it with --family") from None
    with open(source_path) as f:
        return family, original, program.with_headers(f.read())


def ab(source_path, layer_expr, input_shape, family=None, rounds=15, calls=10, device=None, seed=0, setting=None):
    """Run the A/B (module docstring); returns a dict of the figures it prints. `setting` (group,
    class, key, value) instead of a source: side B with that tuning table value."""
    if setting is None:
        family, original, patched = _sources(source_path, family)
    else:
        family, original, patched = "tuning " + ".".join(map(str, setting[:3])), None, None
    q = netcl.default_queue(device)
    layer = build_layer(layer_expr).to(q).train()
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(input_shape).astype(np.float32)
    dy = rng.standard_normal(layer.output_shape(x.shape)).astype(np.float32)
    xt, dyt = Tensor.from_host(q, x), Tensor.from_host(q, dy)
    state = {name: v.copy() for name, v in layer.state_dict().items()}
    sides = (Side(), Side(family, patched, setting))

    def call():
        layer.zero_grad()
        y = layer(xt)
        dx = layer.backward(dyt)
        return y, dx

    results = []
    for side in sides:  # the first call of each side builds its kernels, from the same state
        with side:
            layer.load_state_dict(state)
            y, dx = call()
            results.append([y.to_host(), dx.to_host()] + [p.grad.to_host() for p in layer.parameters()])
    times = ([], [])
    for r in range(rounds):
        for i in ((0, 1) if r % 2 == 0 else (1, 0)):
            with sides[i]:
                q.finish()
                t = time.perf_counter()
                for _ in range(calls):
                    call()
                q.finish()
                times[i].append((time.perf_counter() - t) * 1e3 / calls)
    ratios = sorted(b / a for a, b in zip(*times))
    quarter = len(ratios) // 4
    return {"family": family, "a_ms": statistics.median(times[0]), "b_ms": statistics.median(times[1]),
            "ratio": statistics.median(ratios), "middle": (ratios[quarter], ratios[-1 - quarter]),
            "difference": _largest_difference(results[0], results[1]),
            "same_source": setting is None and patched == original,
            "device": q.device.name.strip()}


class _Events:
    """While entered, every kernel launch through pyopencl's enqueue_nd_range_kernel is logged as
    (kernel, event); a replay made then keeps the logging launcher for its commands."""

    def __enter__(self):
        import pyopencl as cl

        self.log, self.original = [], cl.enqueue_nd_range_kernel

        def launch(queue, kernel, *args, **kwargs):
            ev = self.original(queue, kernel, *args, **kwargs)
            self.log.append((kernel, ev))  # its name read after the timing
            return ev
        cl.enqueue_nd_range_kernel = launch
        return self

    def __exit__(self, *exc):
        import pyopencl as cl

        cl.enqueue_nd_range_kernel = self.original


def ab_step(source_path, model, batch, family=None, rounds=30, device=None):
    """The A/B on `model`'s replayed training step at `batch` (module docstring); returns a dict:
    launches [(index, kernel, A us, B us, pairs' median B / A)] of the family's kernels, the
    kernel sums and wall medians in ms, the pairs' wall ratio and the parameters' difference."""
    import pyopencl as cl

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import benchmark_training_step as bts

    family, original, patched = _sources(source_path, family)
    if model not in bts.MODELS:
        raise ValueError(f"--step {model}: not a benchmark model (one of {', '.join(sorted(bts.MODELS))})")
    base = netcl.default_queue(device)
    q = cl.CommandQueue(base.context, base.device, properties=cl.command_queue_properties.PROFILING_ENABLE)
    names = set(re.findall(r"__kernel\b[^;{]*?\bvoid\s+(\w+)\s*\(", original))
    sides, saved = (Side(), Side(family, patched)), rng()
    try:
        with _Events() as events:
            steps = []
            for side in sides:
                with side:
                    step = bts.netcl_step(model, batch, q, "trainstep")
                    for k in range(4):  # eager, recorded twice, then replayed with this side's kernels
                        manual_seed(k)  # each side's k-th step draws the same (dropout masks)
                        step()
                if not step.trainstep.replays:
                    raise ValueError(f"{model}'s step did not replay ({step.trainstep.eager_reason}): "
                                     "no per-launch A/B")
                steps.append(step)
            q.finish()
            replays = [s.trainstep.replays for s in steps]
            per, walls = ({}, {}), ([], [])
            for r in range(rounds):
                for i in ((0, 1) if r % 2 == 0 else (1, 0)):
                    events.log.clear()
                    manual_seed(4 + r)
                    with sides[i]:  # should a step fall back to layer calls, it builds its own side's kernels
                        t = time.perf_counter()
                        steps[i]()
                        walls[i].append((time.perf_counter() - t) * 1e3)
                    for j, (kernel, ev) in enumerate(events.log):
                        per[i].setdefault(j, (kernel.function_name, []))[1].append(
                            max(ev.profile.end - ev.profile.start, 1) / 1e3)
    finally:
        set_rng(saved)
    if any(s.trainstep.replays != n + rounds for s, n in zip(steps, replays)):
        raise ValueError(f"{model}'s step stopped replaying during the pairs: no per-launch A/B")
    if [n for n, _ in per[0].values()] != [n for n, _ in per[1].values()]:
        raise ValueError("the two sides' steps launch different kernels: no per-launch pairs")
    launches, sums = [], [0.0, 0.0]
    for j, (name, a) in per[0].items():
        b = per[1][j][1]
        sums[0], sums[1] = sums[0] + statistics.median(a), sums[1] + statistics.median(b)
        if name in names:
            launches.append((j, name, statistics.median(a), statistics.median(b),
                             statistics.median(y / x for x, y in zip(a, b))))
    if not launches:
        raise ValueError(f"{model}'s step launches no kernel of {family} on {q.device.name.strip()}")
    params = [[p.to_host() for p in s.trainstep.model.parameters()] for s in steps]
    return {"family": family, "launches": launches, "a_kernels_ms": sums[0] / 1e3, "b_kernels_ms": sums[1] / 1e3,
            "a_ms": statistics.median(walls[0]), "b_ms": statistics.median(walls[1]),
            "ratio": statistics.median(y / x for x, y in zip(*walls)),
            "difference": _largest_difference(*params), "device": q.device.name.strip()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--source", help="a patched copy of netcl/kernels/<family>.cl (side B)")
    ap.add_argument("--set", dest="setting", metavar="GROUP.KEY=VALUE",
                    help="side B: netcl as it is with this tuning table value (netcl/kernels/tuning.json), e.g. "
                         "conv_train.RM=4 (instead of --source; with --layer and --input)")
    ap.add_argument("--class", dest="cls", help="the tuning table's device class --set changes (default: the device's)")
    ap.add_argument("--write", action="store_true",
                    help="with --set: record the value in the tuning table, with where it ran, when B is "
                         f"faster by {WIN:.0%} or more (the pairs' median)")
    ap.add_argument("--family", help="the kernel family the source replaces (default: the file's name)")
    ap.add_argument("--layer", help='a netcl.nn layer expression, e.g. "Conv2d(16, 16, 3, padding=1)"')
    ap.add_argument("--input", help="the input shape, comma-separated, e.g. 64,16,32,32")
    ap.add_argument("--step", metavar="MODEL:BATCH", help="pair a benchmark model's replayed training steps "
                    "per launch instead, e.g. resnet8:64 (no --layer, --input)")
    ap.add_argument("--rounds", type=int, default=None, help="turns of each side (15; --step: 30)")
    ap.add_argument("--calls", type=int, default=10, help="forward + backward passes a turn (not with --step: a step)")
    ap.add_argument("--device", default=None, help="netcl's device: gpu, cpu or a name substring")
    ap.add_argument("--isa", choices=sorted(common.ISA_ENVIRONMENTS), default=None,
                    help="run that instruction set's code paths (restarts the process with its environment)")
    args = ap.parse_args(argv)
    if (args.source is None) == (args.setting is None):
        ap.error("give --source (a patched kernel file) or --set GROUP.KEY=VALUE (a tuning table value)")
    if args.setting is not None and args.step is not None:
        ap.error("--set pairs one layer's passes: give --layer and --input")
    if args.write and args.setting is None:
        ap.error("--write records a --set value")
    if args.step is not None and (args.layer or args.input):
        ap.error("--step pairs whole training steps: leave out --layer and --input")
    if args.step is None and not (args.layer and args.input):
        ap.error("give --layer and --input (one layer's passes), or --step MODEL:BATCH")
    model, _, batch = (args.step or "").partition(":")
    if args.step is not None and (not batch.isdigit() or int(batch) < 1):
        ap.error(f"--step {args.step!r}: expected MODEL:BATCH, e.g. resnet8:64")
    rounds = args.rounds if args.rounds is not None else 30 if args.step else 15
    if rounds < 2 or args.calls < 1:
        ap.error("--rounds must be 2 or more and --calls 1 or more")
    common.run_as_isa(args.isa, argv)
    if args.step is not None:
        r = ab_step(args.source, model, int(batch), args.family, rounds, args.device)
        print(f"== {model} batch {batch}, replayed training steps, {r['device']}: B = {args.source} as "
              f"{r['family']} ({rounds} pairs) ==")
        for j, name, a, b, ratio in r["launches"]:
            print(f"launch {j:3d} {name:24s} A {a:8.1f} us  B {b:8.1f} us  B / A {b / a:.3f} "
                  f"(pairs' median {ratio:.3f})")
        print(f"all launches A {r['a_kernels_ms']:.2f} ms  B {r['b_kernels_ms']:.2f} ms; a step A {r['a_ms']:.2f} ms  "
              f"B {r['b_ms']:.2f} ms, pairs' median B / A {r['ratio']:.3f}; largest difference of B's parameters "
              f"from A's {r['difference']:.1e}")
        return r
    try:
        shape = tuple(int(v) for v in args.input.split(","))
    except ValueError:
        ap.error(f"--input {args.input!r}: expected integers separated by commas, e.g. 64,16,32,32")
    setting = None
    if args.setting is not None:
        q = netcl.default_queue(args.device)
        try:
            setting = parse_setting(args.setting, args.cls or ops.config_class(q))
        except (ValueError, KeyError) as e:
            ap.error(str(e).strip("'\""))
    r = ab(args.source, args.layer, shape, args.family, rounds, args.calls, args.device, setting=setting)
    print(f"== {args.layer} on {shape}, {r['device']}: B = {args.source or args.setting} as {r['family']} ==")
    if r["same_source"]:
        print("(B's source is the family's own: an A/A run)")
    print(f"A {r['a_ms']:.3f} ms  B {r['b_ms']:.3f} ms a forward + backward; B / A {r['ratio']:.3f} "
          f"(middle half {r['middle'][0]:.3f}-{r['middle'][1]:.3f}, {rounds} rounds of {args.calls}); "
          f"largest difference of B's results from A's {r['difference']:.1e}")
    if args.write:
        if r["ratio"] <= 1 - WIN:
            where = provenance(netcl.default_queue(args.device))
            tuning.write_value(*setting, where)
            print(f"written: {args.setting} for class {setting[1]} in {tuning.PATH} ({where})")
        else:
            print(f"not written: B is not {WIN:.0%} faster")
    return r


if __name__ == "__main__":
    main()
