#!/usr/bin/env python3
"""Export speed and peak memory of netcl.io.export_onnx against writing the same bytes with numpy.

The model is a stack of Linear(F, F) layers built on the host (no OpenCL device needed); the
default, four Linear(8192, 8192), holds about 1 GiB of weights. Each repetition times:
  raw    - every parameter array written to one file with ndarray.tofile, then fsync
  export - export_onnx to a .onnx file (it fsyncs before its atomic rename)
and reports the peak resident memory during the export (VmHWM, reset before it through
/proc/self/clear_refs) as a multiple of the weights' size. Targets: export at least half the
raw write speed, peak at most 1.3x the weights.

    python tools/benchmark_export.py                          # ~1 GiB, the issue's benchmark
    python tools/benchmark_export.py --layers 3 --features 16384 --onnxruntime
        # ~3 GiB: past protobuf's 2 GB limit, so external data is chosen; then run in onnxruntime
"""
import argparse
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from netcl import nn  # noqa: E402
from netcl.apps import common  # noqa: E402
from netcl.io import export_onnx  # noqa: E402


def _status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _reset_peak():
    """Reset VmHWM to the current RSS (Linux >= 4.0); False where not permitted."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def build(layers, features, seed=0):
    """layers x Linear(features, features) with Tanh between, weights scaled to keep activations O(1)."""
    rng = np.random.default_rng(seed)
    mods = []
    for i in range(layers):
        lin = nn.Linear(features, features)
        w = rng.standard_normal((features, features), dtype=np.float32)
        w *= np.float32(1.0 / np.sqrt(features))
        lin.weight.set_(w)
        del w
        mods.append(lin)
        if i + 1 < layers:
            mods.append(nn.Tanh())
    return nn.Sequential(*mods).eval()


def raw_write(model, path):
    with open(path, "wb") as f:
        for _, t in model.named_parameters():
            t.numpy().tofile(f)
        f.flush()
        os.fsync(f.fileno())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=common.positive_int, default=4)
    ap.add_argument("--features", type=common.positive_int, default=8192)
    ap.add_argument("--repeat", type=common.positive_int, default=3, help="timed repetitions (best is reported)")
    ap.add_argument("--dir", default=None, help="where to write (default: a temporary folder)")
    ap.add_argument("--external-data", choices=["auto", "yes", "no"], default="auto")
    ap.add_argument("--onnxruntime", action="store_true",
                    help="also load the exported model in onnxruntime and check one batch against numpy")
    args = ap.parse_args(argv)

    model = build(args.layers, args.features)
    weights = sum(t.nbytes for t in model.parameters())
    print(f"model: {args.layers} x Linear({args.features}, {args.features}), weights {weights / 2**30:.3f} GiB")
    ext = {"auto": None, "yes": True, "no": False}[args.external_data]
    folder = args.dir or tempfile.mkdtemp(prefix="netcl-bench-")
    raw_path, onnx_path = os.path.join(folder, "raw.bin"), os.path.join(folder, "model.onnx")
    raw_t, exp_t, peak = [], [], 0
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        raw_write(model, raw_path)
        raw_t.append(time.perf_counter() - t0)
        os.unlink(raw_path)
        can_reset = _reset_peak()
        t0 = time.perf_counter()
        files = export_onnx(model, (1, args.features), onnx_path, dynamic_batch=True, external_data=ext)
        exp_t.append(time.perf_counter() - t0)
        peak = max(peak, _status("VmHWM") if can_reset else 0)
    size = sum(os.path.getsize(p) for p in files)
    raw_s, exp_s = min(raw_t), min(exp_t)
    print(f"files: {', '.join(f'{os.path.basename(p)} ({os.path.getsize(p) / 2**20:.1f} MiB)' for p in files)}")
    print(f"{'':8s} {'best s':>8s} {'GiB/s':>7s}")
    print(f"{'raw':8s} {raw_s:8.3f} {weights / raw_s / 2**30:7.2f}   (ndarray.tofile + fsync)")
    print(f"{'export':8s} {exp_s:8.3f} {size / exp_s / 2**30:7.2f}   (export_onnx, fsync + rename)")
    speed = raw_s / exp_s
    print(f"export speed / raw write speed: {speed:.2f} (target >= 0.5)")
    if peak:
        print(f"peak RSS during export: {peak / 2**30:.3f} GiB = {peak / weights:.3f} x weights (target <= 1.3)")
    else:
        print("peak RSS: not measured (/proc/self/clear_refs not writable)")
    ok = speed >= 0.5 and (not peak or peak <= 1.3 * weights)

    if args.onnxruntime:
        import onnxruntime as ort

        x = np.random.default_rng(1).standard_normal((2, args.features), dtype=np.float32)
        ref = x.astype(np.float64)
        for i, m in enumerate(model):
            ref = np.tanh(ref) if isinstance(m, nn.Tanh) else ref @ m.weight.numpy() + m.bias.numpy()
        t0 = time.perf_counter()
        sess = common.ort_session(onnx_path, "cpu")
        y = sess.run(None, {"input": x})[0]
        diff = float(np.abs(y - ref).max())
        print(f"onnxruntime {ort.__version__}: loaded and ran in {time.perf_counter() - t0:.1f} s, output {y.shape}, "
              f"max abs diff vs float64 numpy {diff:.2e}")
        ok = ok and diff < 1e-3
    for p in files:
        os.unlink(p)
    if not args.dir:
        os.rmdir(folder)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
