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
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def _list(text, conv=str):
    return tuple(conv(v) for v in text.split(",") if v.strip())


def main(argv=None):
    from netcl import bench

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", type=_list, default=bench.MODELS, help="comma-separated (default: %(default)s)")
    ap.add_argument("--batches", type=lambda s: _list(s, int), default=bench.BATCHES, help="default: 1,8,32")
    ap.add_argument("--repeats", type=int, default=50, help="timed runs per figure; the median is reported")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--providers", type=_list, default=("cpu", "cuda"),
                    help="onnxruntime providers: cpu, cuda (cuda is skipped when absent)")
    ap.add_argument("--ort-threads", type=int, default=None, help="onnxruntime CPU threads (default: all cores)")
    ap.add_argument("--device", default=None, help="netcl's OpenCL device: gpu, cpu or a name substring")
    ap.add_argument("--no-tf32-column", action="store_true", help="skip the CUDA TF32-on column")
    ap.add_argument("--torch", action="store_true", help="add a torch eager CUDA column (TF32 off)")
    ap.add_argument("--out-dir", default="out/bench", help="where results.json, table.md and the PNG go")
    ap.add_argument("--plot", default="bench.png", help="PNG file name inside --out-dir ('' for none)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    rows = bench.bench(args.models, args.batches, repeats=args.repeats, warmup=args.warmup,
                       providers=args.providers, ort_threads=args.ort_threads, device=args.device,
                       tf32_column=not args.no_tf32_column, torch_column=args.torch, seed=args.seed)
    os.makedirs(args.out_dir, exist_ok=True)
    table = bench.format_table(rows)
    dev = rows[0]["device"] if rows else "?"
    header = f"netcl on {dev}; onnxruntime CPU threads: {args.ort_threads or os.cpu_count()}; " \
             f"median of {args.repeats} round trips"
    print("\n" + header + "\n\n" + table)
    with open(os.path.join(args.out_dir, "table.md"), "w") as f:
        f.write(header + "\n\n" + table + "\n")
    with open(os.path.join(args.out_dir, "results.json"), "w") as f:
        json.dump(rows, f, indent=1)
    if args.plot:
        print("plot:", bench.plot(rows, os.path.join(args.out_dir, args.plot), title=header))
    return 0


if __name__ == "__main__":
    sys.exit(main())
