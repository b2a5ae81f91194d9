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

The family is the source file's name (convtrain_cpu.cl: convtrain_cpu) unless --family names it.
The layer expression is evaluated with netcl.nn's public names only and no builtins: it is your
own command line, not a file's contents.
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import netcl  # noqa: E402
from netcl import Tensor, nn, runtime  # noqa: E402
from netcl.apps import common  # noqa: E402
from netcl.runtime import program  # noqa: E402


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
    """A side of the A/B: while entered, netcl builds kernels into this side's own cache, and
    family `family` from `source` (already with its headers) where given."""

    def __init__(self, family=None, source=None):
        self.family, self.source, self.cache = family, source, {}

    def __enter__(self):
        self.saved = runtime._kernels, runtime.kernel_source
        runtime._kernels = self.cache
        if self.source is not None:
            original = self.saved[1]
            runtime.kernel_source = lambda family: self.source if family == self.family else original(family)
        return self

    def __exit__(self, *exc):
        runtime._kernels, runtime.kernel_source = self.saved


def _largest_difference(a, b):
    """max |a - b| / max |a| over the arrays of two sides' results, in order (0 where both are 0)."""
    worst = 0.0
    for u, v in zip(a, b):
        scale = float(np.abs(u).max()) if u.size else 0.0
        diff = float(np.abs(u - v).max()) if u.size else 0.0
        worst = max(worst, diff / scale if scale > 0 else diff)
    return worst


def ab(source_path, layer_expr, input_shape, family=None, rounds=15, calls=10, device=None, seed=0):
    """Run the A/B (module docstring); returns a dict of the figures it prints."""
    family = family or os.path.splitext(os.path.basename(source_path))[0]
    try:
        original = program.kernel_source(family)
    except FileNotFoundError:
        raise ValueError(f"no kernel family {family!r} (netcl/kernels/{family}.cl) for --source {source_path}: "
                         "name it with --family") from None
    with open(source_path) as f:
        patched = program.with_headers(f.read())
    q = netcl.default_queue(device)
    layer = build_layer(layer_expr).to(q).train()
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(input_shape).astype(np.float32)
    dy = rng.standard_normal(layer.output_shape(x.shape)).astype(np.float32)
    xt, dyt = Tensor.from_host(q, x), Tensor.from_host(q, dy)
    state = {name: v.copy() for name, v in layer.state_dict().items()}
    sides = (Side(), Side(family, patched))

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
            "difference": _largest_difference(results[0], results[1]), "same_source": patched == original,
            "device": q.device.name.strip()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--source", required=True, help="a patched copy of netcl/kernels/<family>.cl (side B)")
    ap.add_argument("--family", help="the kernel family the source replaces (default: the file's name)")
    ap.add_argument("--layer", required=True, help='a netcl.nn layer expression, e.g. "Conv2d(16, 16, 3, padding=1)"')
    ap.add_argument("--input", required=True, help="the input shape, comma-separated, e.g. 64,16,32,32")
    ap.add_argument("--rounds", type=int, default=15, help="turns of each side")
    ap.add_argument("--calls", type=int, default=10, help="forward + backward passes a turn")
    ap.add_argument("--device", default=None, help="netcl's device: gpu, cpu or a name substring")
    ap.add_argument("--isa", choices=sorted(common.ISA_ENVIRONMENTS), default=None,
                    help="run that instruction set's code paths (restarts the process with its environment)")
    args = ap.parse_args(argv)
    common.run_as_isa(args.isa, argv)
    try:
        shape = tuple(int(v) for v in args.input.split(","))
    except ValueError:
        ap.error(f"--input {args.input!r}: expected integers separated by commas, e.g. 64,16,32,32")
    if args.rounds < 2 or args.calls < 1:
        ap.error("--rounds must be 2 or more and --calls 1 or more")
    r = ab(args.source, args.layer, shape, args.family, args.rounds, args.calls, args.device)
    print(f"== {args.layer} on {shape}, {r['device']}: B = {args.source} as {r['family']} ==")
    if r["same_source"]:
        print("(B's source is the family's own: an A/A run)")
    print(f"A {r['a_ms']:.3f} ms  B {r['b_ms']:.3f} ms a forward + backward; B / A {r['ratio']:.3f} "
          f"(middle half {r['middle'][0]:.3f}-{r['middle'][1]:.3f}, {args.rounds} rounds of {args.calls}); "
          f"largest difference of B's results from A's {r['difference']:.1e}")
    return r


if __name__ == "__main__":
    main()
