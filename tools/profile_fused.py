"""Per-stage time of a reference model's fused inference plan on the default device: each stage
run alone, --chain launches back to back and the queue drained after them (the median of
--repeats, divided by --chain: the round trip's wait, ~50 us on PoCL, is spread over the chain),
with its kernel, beside the whole plan's round trip. Where the fused path's time goes, before
changing it.

    python tools/profile_fused.py --model vit_tiny --batch 32
"""
import argparse
import time

import numpy as np

import netcl.runtime as runtime
from netcl import models
from netcl.jit.executable import _Bound
from netcl.tensor import Tensor


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="resnet8")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--chain", type=int, default=10, help="launches per sample (1: each drained alone)")
    args = ap.parse_args(argv)
    q = runtime.default_queue()
    model = models.build(args.model)
    model.to(q).eval()
    shape = (args.batch,) + tuple(models.MODELS[args.model].input_shape)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    for _ in range(3):
        model.predict(x)
    times = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        model.predict(x)
        times.append(time.perf_counter() - t)
    plan = model._fused
    q = plan.queue_for(shape)  # predict() may run a small call on PoCL's serial device
    print(f"{args.model} batch {args.batch}: predict() {1e3 * np.median(times):.3f} ms on {q.device.name}")
    exe = next(iter(plan._exe.values()))
    bufs = list(exe.bufs)
    bufs[0] = exe.dev_in.buf
    rows = []
    for s in exe.steps:
        if isinstance(s, _Bound):
            for i, (j, v) in enumerate(s.binds):
                b = bufs[v] if bufs[v] is not None else exe.target.buffer(4 * int(np.prod(exe.shapes[v])))
                bufs[v] = b
                s.kernel.set_arg(j, b)
                s.bound[i] = None
            run = lambda s=s: exe.target.cl.enqueue_nd_range_kernel(q, s.kernel, s.gsize, s.lsize)  # noqa: E731
            name = f"{s.stage}  [{s.name} {'x'.join(map(str, s.gsize))}/{'x'.join(map(str, s.lsize))}]"
        else:
            st = s
            src = Tensor(exe.shapes[st.src], q, bufs[exe.root[st.src]] or exe.dev_in.buf)
            run = lambda st=st, src=src: st.layer(src)  # noqa: E731
            name = str(st) + " (unfused)"
        ts = []
        for r in range(args.repeats + 2):
            q.finish()
            t = time.perf_counter()
            for _ in range(args.chain):
                out = run()
            q.finish()
            ts.append((time.perf_counter() - t) / args.chain)
        if not isinstance(s, _Bound):
            bufs[s.dst] = out.buf
        rows.append((name, 1e3 * np.median(ts[2:])))
    total = sum(t for _, t in rows)
    for name, t in rows:
        print(f"  {t:8.3f} ms {100 * t / total:5.1f}%  {name}")
    print(f"  {total:8.3f} ms total, stage by stage")


if __name__ == "__main__":
    main()
