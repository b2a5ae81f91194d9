#!/usr/bin/env python3
"""Autograd's cost: a model written as a Module subclass against the same layers as a Sequential,
and the host time of one eager tensor operation.

1. Training steps (forward, cross-entropy, backward, SGD with momentum, zero_grad, the loss read):
   netcl.models.resnet8() (a Sequential of blocks) against netcl.models.ResNet8 (the same layers,
   its blocks' sums written in Python: h + x), both through netcl.TrainStep (replayed) and as eager
   calls (loss.backward() for the Module, model.backward() for the Sequential). The two models take
   turns step by step in one process, so that both steps of a pair see the same machine; the table
   gives each one's median and the median of the pairs' ratios (Module / Sequential).
2. Eager operations: microseconds of host time per call (a queue of a million launches would wait on
   the device, so each figure is the median of --ops calls with the queue drained every 100), for an
   element-wise add, a ReLU and a sum over a small tensor, without and with autograd recording, and
   PyTorch's CPU time for the same calls beside them.

    python tools/benchmark_autograd.py --batch 64 --steps 40
    python tools/benchmark_autograd.py --device gpu --batch 128
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def _steps(args, q):
    import netcl
    from netcl import models, nn, optim

    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (args.batch, 3, 32, 32)).astype(np.float32)
    y = rng.integers(0, 10, args.batch)
    xt, yt = netcl.tensor(x, queue=q), netcl.Tensor.from_host(q, y.astype(np.float32))
    runs = {}
    for name, make in (("Sequential", models.resnet8), ("Module", models.ResNet8)):
        netcl.manual_seed(0)
        model = make().to(q).train()
        loss_fn = nn.CrossEntropyLoss()
        opt = optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
        if args.eager:
            def step(model=model, loss_fn=loss_fn, opt=opt):
                out = model(xt)
                loss = loss_fn(out, yt)
                if isinstance(model, nn.Sequential):  # the explicit API, as before autograd
                    model.backward(loss_fn.backward(), input_grad=False)
                else:
                    loss.backward()
                opt.step()
                opt.zero_grad()
                return loss
        else:
            train = netcl.TrainStep(model, loss_fn, opt)

            def step(train=train):
                return train(xt, yt)
            step.train = train
        runs[name] = step
    for step in runs.values():
        for _ in range(args.warmup):
            float(step())
    times = {name: [] for name in runs}
    for _ in range(args.steps):
        for name, step in runs.items():
            t = time.perf_counter()
            float(step())
            times[name].append(1e3 * (time.perf_counter() - t))
    ratios = [m / s for m, s in zip(times["Module"], times["Sequential"])]
    mode = "eager calls" if args.eager else "TrainStep"
    print(f"\nresnet8 training step, batch {args.batch}, {mode} ({args.steps} pairs after {args.warmup} warm-up steps)")
    print(f"{'model':<12}{'median ms':>12}{'launches':>10}")
    for name, step in runs.items():
        launches = step.train.launches if hasattr(step, "train") else "-"
        print(f"{name:<12}{statistics.median(times[name]):>12.2f}{str(launches):>10}")
    q1, med, q3 = np.percentile(ratios, [25, 50, 75])
    print(f"Module / Sequential: {med:.2f}x (pair median; middle half {q1:.2f}-{q3:.2f})")


def _per_call(fn, calls, sync):
    ts = []
    for i in range(calls):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
        if i % 100 == 99:
            sync()
    sync()
    return 1e6 * statistics.median(ts)


def _ops(args, q):
    import netcl

    a = np.random.default_rng(0).standard_normal((32, 32)).astype(np.float32)
    rows = []
    x, y = netcl.tensor(a, queue=q), netcl.tensor(a, queue=q)
    xg = netcl.tensor(a, queue=q, requires_grad=True)
    sync = q.finish
    ops = {"a + b": (lambda: x + y, lambda: xg + y), "relu": (lambda: x.relu(), lambda: xg.relu()),
           "sum": (lambda: x.sum(), lambda: xg.sum())}
    try:
        import torch

        torch.set_num_threads(2)
        ta, tb = torch.tensor(a), torch.tensor(a)
        tg = torch.tensor(a, requires_grad=True)
        theirs = {"a + b": (lambda: ta + tb, lambda: tg + tb), "relu": (lambda: ta.relu(), lambda: tg.relu()),
                  "sum": (lambda: ta.sum(), lambda: tg.sum())}
    except ImportError:
        theirs = None
    for name, (plain, recorded) in ops.items():
        for fn in (plain, recorded):
            fn()  # builds the kernels
        row = [name, _per_call(plain, args.ops, sync), _per_call(recorded, args.ops, sync)]
        if theirs:
            row += [_per_call(theirs[name][0], args.ops, lambda: None), _per_call(theirs[name][1], args.ops,
                                                                                   lambda: None)]
        rows.append(row)
    print(f"\neager operations on (32, 32), host microseconds per call (median of {args.ops})")
    head = f"{'op':<8}{'netcl':>10}{'recorded':>10}" + (f"{'torch':>10}{'recorded':>10}" if theirs else "")
    print(head)
    for r in rows:
        print(f"{r[0]:<8}" + "".join(f"{v:>10.1f}" for v in r[1:]))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default=None, help="gpu, cpu or a device name substring (default: NETCL_DEVICE's)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=40, help="timed step pairs")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps of each model first")
    ap.add_argument("--eager", action="store_true", help="time eager calls instead of TrainStep's replays")
    ap.add_argument("--ops", type=int, default=2000, help="calls per eager-operation figure")
    ap.add_argument("--only", choices=["steps", "ops"], default=None)
    args = ap.parse_args(argv)
    import netcl

    q = netcl.default_queue(args.device)
    print(f"device: {q.device.name.strip()}")
    if args.only != "ops":
        _steps(args, q)
    if args.only != "steps":
        _ops(args, q)


if __name__ == "__main__":
    main()
