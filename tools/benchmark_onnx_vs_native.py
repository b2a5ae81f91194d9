#!/usr/bin/env python3
"""Benchmark netcl's fused inference path against onnxruntime (CPU, and CUDA where present).

Reference models (detector26, cnn, mlp) at several batch sizes; every figure is a full
host -> device -> host round trip, the median of --repeats runs after warm-up, in one process
with the same weights and inputs; outputs are checked to agree before timing. onnxruntime's
CUDA provider is checked to be really in use; TF32 off is the fair float32 column, TF32 on is
reported separately. Prints a Markdown table with ratios and writes results.json, table.md and
a PNG plot of latency against batch size into --out-dir.

    python tools/benchmark_onnx_vs_native.py                         # all models, batches 1,8,32
    python tools/benchmark_onnx_vs_native.py --models detector26 --batches 1,8 --ort-threads 2
    NETCL_DEVICE=gpu python tools/benchmark_onnx_vs_native.py --providers cpu,cuda --torch
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from netcl.bench import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(prog="benchmark_onnx_vs_native.py"))
