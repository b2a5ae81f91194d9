#!/usr/bin/env python3
"""Benchmark netcl's fused inference path against onnxruntime: the same as `netcl bench`
(netcl/apps/bench.py); `--help` lists the options."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from netcl.apps.bench import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(prog="benchmark_onnx_vs_native.py"))
