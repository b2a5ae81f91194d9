#!/usr/bin/env python3
"""The detector26 training step in tinygrad (the peer of the training-speed issue): forward, MSE,
backward, SGD with momentum 0.9 under TinyJit, the loss read back every step; median of 12 steps
after 3. Needs `pip install tinygrad` (0.14 measured); pick its backend with DEV=CL (OpenCL), as
the issue does. Compare with `python tools/benchmark_training_step.py --models detector26`.

    DEV=CL python tools/benchmark_tinygrad_step.py 8 32

On a machine whose OpenCL comes from pip (pyopencl + pocl-binary-distribution) it uses that.
"""
import statistics
import sys
import time

import numpy as np


def _pip_opencl():
    """On a machine whose only OpenCL is pip's (pyopencl's bundled ICD loader and PoCL), point
    tinygrad at that loader, set up by importing pyopencl first: tinygrad's own load of it
    crashed in clGetPlatformIDs here (tinygrad 0.14, PoCL 3.0)."""
    import glob
    import os

    if os.environ.get("OPENCL_PATH") or os.environ.get("DEV", "").upper() != "CL":
        return
    try:
        import pyopencl
    except ImportError:
        return
    libs = glob.glob(os.path.join(os.path.dirname(pyopencl.__file__), ".libs", "libOpenCL*.so*"))
    if libs:
        pyopencl.get_platforms()
        os.environ["OPENCL_PATH"] = libs[0]


_pip_opencl()
from tinygrad import Device, Tensor, TinyJit, nn  # noqa: E402
from tinygrad.helpers import Context
from tinygrad.nn.optim import SGD
from tinygrad.nn.state import get_parameters


class Det26:
    """detector26 (docs/MODELS.md) in tinygrad."""

    def __init__(self):
        chans = [3, 16, 32, 64, 128, 256, 512]
        self.convs = [nn.Conv2d(a, b, 3, padding=1) for a, b in zip(chans, chans[1:])]
        self.bns = [nn.BatchNorm(b) for b in chans[1:]]
        self.head = nn.Conv2d(512, 5, 1)

    def __call__(self, x):
        for c, b in zip(self.convs, self.bns):
            x = b(c(x)).leaky_relu(0.1).max_pool2d(2)
        return self.head(x).sigmoid()


def main(batch, steps=12, warmup=3):
    model = Det26()
    opt = SGD(get_parameters(model), lr=1e-3, momentum=0.9)
    x = Tensor(np.random.default_rng(0).uniform(0, 1, (batch, 3, 256, 256)).astype(np.float32)).realize()
    y = Tensor(np.random.default_rng(1).uniform(0, 1, (batch, 5, 4, 4)).astype(np.float32)).realize()

    @TinyJit
    def step(x, y):
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        return loss.realize()

    with Context(TRAINING=1):
        for _ in range(warmup):
            step(x, y).item()
        ts = []
        for _ in range(steps):
            t = time.perf_counter()
            step(x, y).item()
            ts.append(time.perf_counter() - t)
    print(f"tinygrad {Device.DEFAULT} detector26 b{batch}: {1e3 * statistics.median(ts):.2f} ms", flush=True)


if __name__ == "__main__":
    for b in map(int, sys.argv[1:] or ["2"]):
        main(b)
