#!/usr/bin/env python3
"""The training loop's parts, measured on one model (--model: resnet8 or cnn, on 32x32 inputs; SGD
with momentum, cross-entropy) through netcl.TrainStep, each variant in one process, taking turns
epoch by epoch so that all see the same machine; each figure is the median over --rounds epochs.

1. A schedule: no scheduler, StepLR stepped after every epoch, OneCycleLR stepped after every batch
   (which also cycles the momentum). The schedule's settings are replay arguments: the table gives
   the step time and how many calls replayed (a schedule that made the step record anew would show
   two eager calls per change).
2. Data, shuffled: a loop that indexes (and collates) its batches itself and hands TrainStep host
   arrays (uploaded on the caller's thread), against a DataLoader (its thread makes and uploads the
   next batches while the step runs), the loss read after every step in both; for a TensorDataset
   and for a dataset doing per-item work (a random crop and flip in numpy, as image pipelines do).
3. Clipping: the step with nn.utils.clip_grad_norm_ after the backward (layer calls; TrainStep has
   no place for it), against the same step without; launches the clipping adds.

    python tools/benchmark_training_loop.py --batch 64 --batches 16 --rounds 5
    python tools/benchmark_training_loop.py --model cnn --batch 256 --batches 8 --rounds 9 --parts data
    python tools/benchmark_training_loop.py --device gpu --batch 256
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from netcl.apps import common  # noqa: E402


def _setup(q, args, schedule=None):
    import netcl
    from netcl import models, nn, optim
    from netcl.optim import lr_scheduler

    netcl.manual_seed(0)
    model = models.build(args.model).to(q).train()
    opt = optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    sched = None
    if schedule == "StepLR":
        sched = lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
    elif schedule == "OneCycleLR":
        sched = lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=(args.rounds + 2) * args.batches + 1)
    return model, nn.CrossEntropyLoss(), opt, sched


def _schedules(q, args, x, y):
    import netcl

    runs = {}
    for name in ("none", "StepLR", "OneCycleLR"):
        model, loss_fn, opt, sched = _setup(q, args, None if name == "none" else name)
        runs[name] = [netcl.TrainStep(model, loss_fn, opt), sched, [], 0]

    def epoch(name):
        step, sched, times, _ = runs[name]
        for k in range(args.batches):
            t = time.perf_counter()
            step(x[k], y[k]).item()
            times.append(time.perf_counter() - t)
            if isinstance(sched, netcl.optim.lr_scheduler.OneCycleLR):
                sched.step()
        if isinstance(sched, netcl.optim.lr_scheduler.StepLR):
            sched.step()
        runs[name][3] += args.batches

    for _ in range(2):  # warm-up epochs: builds, the layout, the recordings
        for name in runs:
            epoch(name)
    for name in runs:
        runs[name][2].clear()
    for _ in range(args.rounds):
        for name in runs:
            epoch(name)
    print(f"\n1. schedules (TrainStep, {args.batches} batches an epoch): median step, replayed calls")
    base = statistics.median(runs["none"][2])
    for name, (step, sched, times, calls) in runs.items():
        med = statistics.median(times)
        print(f"   {name:11s} {med * 1e3:8.2f} ms  x{med / base:5.2f}   {step.replays}/{calls} replayed"
              f"{'' if step.eager_reason is None else '  (eager: ' + step.eager_reason + ')'}")


class Augmented:
    """A map-style dataset doing per-item host work, as image pipelines do: a random crop of a
    zero-padded image (4 pixels a side) and a random horizontal flip, in numpy."""

    def __init__(self, x, y):
        self.x, self.y = np.pad(x, ((0, 0), (0, 0), (4, 4), (4, 4))), y
        self.rng = np.random.default_rng(1)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        h, w = self.x.shape[2] - 8, self.x.shape[3] - 8
        dy, dx = self.rng.integers(0, 9, 2)
        img = self.x[i, :, dy:dy + h, dx:dx + w]
        return (img[:, :, ::-1] if self.rng.random() < 0.5 else img), self.y[i]


def _data(q, args, x, y):
    import netcl
    from netcl.data import DataLoader, TensorDataset, default_collate

    xs, ys = np.concatenate(x), np.concatenate(y)
    plain, augmented = TensorDataset(xs, ys), Augmented(xs, ys)
    order = np.random.default_rng(2)
    variants = {  # name -> (dataset, through a DataLoader)
        "arrays, loop": (plain, False), "arrays, DataLoader": (plain, True),
        "augmented, loop": (augmented, False), "augmented, DataLoader": (augmented, True)}
    steps, loaders, times = {}, {}, {name: [] for name in variants}
    for name, (ds, loaded) in variants.items():
        model, loss_fn, opt, _ = _setup(q, args)
        steps[name] = netcl.TrainStep(model, loss_fn, opt)
        loaders[name] = DataLoader(ds, batch_size=args.batch, shuffle=True, queue=q) if loaded else None

    def epoch(name):
        ds, _ = variants[name]
        step, loader = steps[name], loaders[name]
        t = time.perf_counter()
        if loader is not None:
            for xb, yb in loader:
                step(xb, yb).item()
        else:  # what a loop without a loader does: index, collate and hand over host arrays
            perm = order.permutation(len(ds))
            for k in range(args.batches):
                idx = perm[k * args.batch:(k + 1) * args.batch]
                xb, yb = (ds.tensors[0][idx], ds.tensors[1][idx]) if ds is plain else \
                    default_collate([ds[i] for i in idx])
                step(xb, yb).item()
        return time.perf_counter() - t

    for _ in range(2):
        for name in variants:
            epoch(name)
    for _ in range(args.rounds):
        for name in variants:
            times[name].append(epoch(name))
    print(f"\n2. data (TrainStep, shuffled epochs of {args.batches} batches): median epoch; DataLoader / loop, "
          "the median of the rounds' ratios")
    for name, t in times.items():
        med = statistics.median(t)
        line = f"   {name:22s} {med * 1e3:8.1f} ms  ({med / args.batches * 1e3:.2f} ms a step)"
        if name.endswith("DataLoader"):
            loop = times[name.replace("DataLoader", "loop")]
            line += f"  x{statistics.median(a / b for a, b in zip(t, loop)):5.2f}"
        print(line)


def _clipping(q, args, x, y):
    import netcl
    from netcl import Tensor, nn, ops

    runs = {"no clipping": [], "clip_grad_norm_": []}
    made = {name: _setup(q, args) for name in runs}
    count = {"n": 0}
    enqueue = ops._enqueue

    def counted(*a):
        count["n"] += 1
        return enqueue(*a)

    def step(name, k, launches=None):
        model, loss_fn, opt, _ = made[name]
        t = time.perf_counter()
        pending = loss_fn.enqueue(model(Tensor.from_host(q, x[k])), y[k])
        model.backward(loss_fn.backward(), input_grad=False)
        if name == "clip_grad_norm_":
            ops._enqueue, count["n"] = counted, 0
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            ops._enqueue = enqueue
            if launches is not None:
                launches.append(count["n"])
        opt.step()
        opt.zero_grad()
        pending.item()
        return time.perf_counter() - t

    for k in range(4):
        for name in runs:
            step(name, k % args.batches)
    launches = []
    for r in range(args.rounds):
        for k in range(args.batches):
            for name in runs:
                runs[name].append(step(name, k, launches))
    print("\n3. clipping (layer calls): median step")
    base = statistics.median(runs["no clipping"])
    for name, times in runs.items():
        med = statistics.median(times)
        print(f"   {name:15s} {med * 1e3:8.2f} ms  x{med / base:5.3f}")
    print(f"   clip_grad_norm_ launches a step: {sorted(set(launches))}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet8", help="a model of netcl.models with (3, 32, 32) inputs")
    ap.add_argument("--batch", type=common.positive_int, default=64)
    ap.add_argument("--batches", type=common.positive_int, default=16, help="batches an epoch")
    ap.add_argument("--rounds", type=common.positive_int, default=5, help="timed epochs per variant")
    ap.add_argument("--device", default=None, help="netcl's device: gpu, cpu or a name substring")
    ap.add_argument("--parts", type=common.names, default=["schedules", "data", "clipping"])
    args = ap.parse_args(argv)
    import netcl

    q = netcl.default_queue(args.device)
    print(f"device: {q.device.name.strip()}; {args.model}, batch {args.batch}")
    rng = np.random.default_rng(0)
    x = [rng.uniform(0, 1, (args.batch, 3, 32, 32)).astype(np.float32) for _ in range(args.batches)]
    y = [rng.integers(0, 10, args.batch) for _ in range(args.batches)]
    for part in args.parts:
        {"schedules": _schedules, "data": _data, "clipping": _clipping}[part](q, args, x, y)


if __name__ == "__main__":
    main()
