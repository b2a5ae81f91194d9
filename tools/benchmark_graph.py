#!/usr/bin/env python3
"""predict() of traced graphs, paired in one process (the sides take turns round by round, half the
rounds B first); printed per (case, batch): each side's median over the rounds of its per-round
median, and the median of the per-round ratios B / A with their range. Every figure is a full
host -> device -> host predict().

    lift      A: resnet8() (a Sequential), B: netcl.trace(ResNet8()) (a Module subclass whose graph lifts)
    se        A: a graph that does not lift (squeeze-excitation blocks, SiLU written x * sigmoid(x)) run
              fused (segments and element-wise chains), B: the same replayed node by node (graph.FUSE off)

    onnx      A: a torchvision model (random weights) through torch.onnx.export and import_onnx, a graph
              that does not lift, run fused, B: the same replayed node by node (needs torch, torchvision)

    python tools/benchmark_graph.py --cases lift,se --batches 1,8,32
    python tools/benchmark_graph.py --cases onnx --onnx-models mobilenet_v3_small,efficientnet_b0 --batches 1,8
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import netcl  # noqa: E402
import netcl.io  # noqa: E402
from netcl import models, nn  # noqa: E402
from netcl.nn import functional as F  # noqa: E402
from netcl.nn import graph  # noqa: E402


class SE(nn.Module):
    """conv + BN, x * sigmoid(x), a squeeze-excitation gate, the block's input added."""

    def __init__(self, c, r=4):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc1, self.fc2 = nn.Conv2d(c, c // r, 1), nn.Conv2d(c // r, c, 1)

    def forward(self, x):
        h = self.bn(self.conv(x))
        h = h * F.sigmoid(h)
        return h * F.sigmoid(self.fc2(F.relu(self.fc1(self.pool(h))))) + x


class SENet(nn.Module):
    """(N, 3, 32, 32) -> 10: a stem, three SE blocks of 32 channels, pooling and a Linear."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU())
        self.blocks = nn.ModuleList([SE(32) for _ in range(3)])
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        h = self.stem(x)
        for b in self.blocks:
            h = b(h)
        return self.fc(F.adaptive_avg_pool2d(h, 1).flatten(1))


def _fuse(on):
    def set_it():
        graph.FUSE = on
    return set_it


def imported(name, x):
    """torchvision's `name` (random weights, 10 classes) exported by torch and read by import_onnx."""
    import tempfile
    import warnings

    import torch

    try:
        import torchvision.models as tvm
    except RuntimeError:  # its compiled operators built for another torch: the models need none of them
        torch.library.register_fake = lambda *a, **k: (lambda f: f)
        for m in [m for m in sys.modules if m.startswith("torchvision")]:
            del sys.modules[m]
        import torchvision.models as tvm
    torch.manual_seed(0)
    tm = getattr(tvm, name)(num_classes=10).eval()
    with tempfile.TemporaryDirectory() as d, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path = os.path.join(d, "m.onnx")
        torch.onnx.export(tm, (torch.from_numpy(x),), path, dynamo=False, opset_version=17,
                          input_names=["input"], output_names=["output"])
        gm = netcl.io.import_onnx(path).eval()
    with torch.no_grad():
        want = tm(torch.from_numpy(x)).numpy()
    graph.FUSE = False
    replayed = gm.predict(x)
    graph.FUSE = True
    fused = gm.predict(x)
    print(f"{name}: {len(gm._fusion.segments)} segments, {len(gm._fusion.chains)} chains; max |fused - replayed| "
          f"{np.abs(fused - replayed).max():.1e}, |fused - torch| {np.abs(fused - want).max():.1e}", flush=True)
    return gm


def cases(names, x_of, onnx_models=()):
    """{case: (side A, side B)}, each side (name, model, before each call)."""
    out = {}
    x = x_of(1)
    for name in onnx_models if "onnx" in names else ():
        gm = imported(name, x_of(2))
        assert getattr(gm, "lifted", 0) is None, f"{name} lifts whole"
        out[name] = ((f"{name} fused", gm, _fuse(True)), (f"{name} replayed", gm, _fuse(False)))
    if "lift" in names:
        netcl.manual_seed(0)
        seq = models.resnet8().eval()
        netcl.manual_seed(0)
        gm = netcl.trace(models.ResNet8(), x).eval()
        assert gm.lifted is not None, "ResNet8's graph no longer lifts"
        out["lift"] = (("resnet8() Sequential", seq, _fuse(True)), ("trace(ResNet8())", gm, _fuse(True)))
    if "se" in names:
        netcl.manual_seed(0)
        gm = netcl.trace(SENet(), x).eval()
        assert gm.lifted is None
        out["se"] = (("SE graph fused", gm, _fuse(True)), ("SE graph replayed", gm, _fuse(False)))
    return out


def time_side(side, x, repeats):
    _, model, before = side
    before()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        model.predict(x)
        times.append(time.perf_counter() - t)
    graph.FUSE = True
    return 1e3 * statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--cases", default="lift,se")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=30, help="timed predicts per side per round (their median)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--onnx-models", default="mobilenet_v3_small")
    ap.add_argument("--size", type=int, default=32, help="input height and width")
    args = ap.parse_args()
    x_of = lambda n: np.random.default_rng(n).normal(size=(n, 3, args.size, args.size)).astype(np.float32)  # noqa: E731
    table = cases(args.cases.split(","), x_of, args.onnx_models.split(","))
    q = netcl.default_queue()
    print(f"device: {q.device.name.strip()} ({q.device.platform.name.strip()})")
    print(f"{'case:batch':22s} {'A':28s} {'A ms':>9s} {'B':28s} {'B ms':>9s} {'B / A':>7s}  per round")
    for name, (a, b) in table.items():
        for batch in [int(n) for n in args.batches.split(",")]:
            x = x_of(batch)
            for side in (a, b):
                side[2]()
                for _ in range(args.warmup):
                    side[1].predict(x)
                graph.FUSE = True
            ta, tb = [], []
            for r in range(args.rounds):
                for s in ((a, b) if r % 2 == 0 else (b, a)):
                    (ta if s is a else tb).append(time_side(s, x, args.repeats))
            ratios = [y / v for v, y in zip(ta, tb)]
            print(f"{name + ':' + str(batch):22s} {a[0]:28s} {statistics.median(ta):9.3f} {b[0]:28s} "
                  f"{statistics.median(tb):9.3f} {statistics.median(ratios):7.3f}  {min(ratios):.3f}-{max(ratios):.3f}",
                  flush=True)


if __name__ == "__main__":
    main()
