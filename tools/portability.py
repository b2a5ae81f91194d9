#!/usr/bin/env python3
"""A training step and a predict() of every reference model (netcl.models) at tiny shapes, once per
kernel class: "gpu" (the GPU families, forced on any device), "cpu" (8 float lanes) and "cpu16"
(16), on the device netcl selects ($NETCL_DEVICE). Meant for a checking device such as Oclgrind,
which simulates every work-item and reports invalid accesses, races and API misuse on stderr:
with --oclgrind this script runs itself again under Oclgrind's ICD with its memory, race and API
checks on and netcl's exact-size buffers (NETCL_EXACT_BUFFERS=1), and fails on any report. Each
model's predict() is also checked against its own unfused forward. Not on: Oclgrind 21.10's
uninitialized-value check, which aborts kernels on LLVM's `freeze` instruction (gemm_tile's first
work-item: "Unsupported instruction: freeze"), so that everything after them reads garbage.

    python tools/portability.py --oclgrind                      # every model, every class
    python tools/portability.py --oclgrind --models cnn --classes gpu
    NETCL_DEVICE="Intel(R) OpenCL" python tools/portability.py   # no checker: a smoke run

docs/DEVICES.md says how Oclgrind and Intel's OpenCL CPU runtime are installed and registered.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLASSES = ("gpu", "cpu", "cpu16")
SIZES = (8, 16, 32)  # the smallest spatial size each model takes
OCLGRIND_ICD = "/usr/lib/oclgrind/liboclgrind-rt-icd.so"  # Debian's oclgrind package
OCLGRIND_ENV = {"OCLGRIND_CHECK_API": "1", "OCLGRIND_DATA_RACES": "1", "NETCL_EXACT_BUFFERS": "1",
                "NETCL_DEVICE": "Oclgrind", "NETCL_CPU_SERIAL": "0"}
# the first line of each of Oclgrind's reports (invalid access, race, divergence, uninitialized
# value, API error, a kernel it could not run)
REPORT = re.compile(r"^(Invalid |.*data race|Work-group divergence|Work-item divergence|Uninitiali[sz]ed|"
                    r"Oclgrind - |.*[Uu]nhandled|.*not supported|OCLGRIND FATAL)", re.M)
# API errors of pyopencl's own probing, not netcl's: it asks an OpenCL 1.2 device for later versions'
# device queries, and a Program made from a binary for a kernel named "_source" (its __getattr__)
PYOPENCL_PROBES = re.compile(r"Oclgrind - OpenCL runtime error detected\n\tFunction: (clGetDeviceInfo\n\tError: +"
                             r"CL_INVALID_VALUE\n\tFor argument 'param_name'|clCreateKernel\n\tError: +"
                             r"CL_INVALID_KERNEL_NAME\n\tKernel '_source' not found)\n")


def tiny_input(name, rng):
    """A batch of 2 at the smallest spatial size (SIZES) the model takes, else its own shape."""
    from netcl import models

    build = models.MODELS[name]
    shape = tuple(build.input_shape)
    model = build()
    if len(shape) == 3:
        for s in SIZES:
            try:
                model.output_shape((2, shape[0], s, s))
            except ValueError:
                continue
            shape = (shape[0], s, s)
            break
    return model, rng.normal(size=(2,) + shape).astype("float32")


def run_class(cls, names):
    """One kernel class over the models; prints a line per model."""
    import numpy as np

    import netcl
    from netcl import Tensor, nn, ops, optim

    q = netcl.default_queue()
    os.environ["NETCL_JIT_CLASS"] = "gpu" if cls == "gpu" else "cpu"
    if cls != "gpu":
        os.environ["NETCL_FLOAT_LANES"] = "16" if cls == "cpu16" else "8"
    ops._config_class[q.device.int_ptr] = cls
    ops._float_lanes.clear()
    rng = np.random.default_rng(0)
    for name in names:
        t0 = time.perf_counter()
        netcl.manual_seed(0)
        model, x = tiny_input(name, rng)
        model.to(q).train()
        loss_fn, opt = nn.MSELoss(), optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        out = model(Tensor.from_host(q, x))
        loss = loss_fn(out, np.zeros(out.shape, np.float32))
        model.backward(loss_fn.backward())
        opt.step()
        opt.zero_grad()
        model.eval()
        y = model.predict(x, q)
        plan, model._fused = model._fused, None
        ref = model(Tensor.from_host(q, x)).to_host()
        model._fused = plan
        if not np.isfinite(loss) or not np.allclose(y, ref, rtol=1e-4, atol=1e-4):
            raise SystemExit(f"{cls} {name}: loss {loss}, predict() off its unfused forward by "
                             f"{float(np.max(np.abs(y - ref))):.3g}")
        print(f"{cls:6s} {name:18s} input {x.shape}  loss {loss:.4g}  {time.perf_counter() - t0:.1f} s", flush=True)


def under_oclgrind(args):
    """This script again, on Oclgrind with its checks on; fails on any report."""
    if not os.path.exists(OCLGRIND_ICD):
        sys.exit(f"no {OCLGRIND_ICD}: install Debian's oclgrind (apt-get install oclgrind)")
    failed = []
    with tempfile.TemporaryDirectory() as icd:
        with open(os.path.join(icd, "oclgrind.icd"), "w") as f:
            f.write(OCLGRIND_ICD + "\n")
        env = {**os.environ, **OCLGRIND_ENV, "OCL_ICD_VENDORS": icd}
        for cls in args.classes.split(","):
            argv = [sys.executable, os.path.abspath(__file__), "--classes", cls, "--models", args.models]
            t0 = time.perf_counter()
            r = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            sys.stdout.write(r.stdout)
            stderr = PYOPENCL_PROBES.sub("", r.stderr)
            reports = REPORT.findall(stderr)
            print(f"{cls}: exit {r.returncode}, {len(reports)} Oclgrind reports, {time.perf_counter() - t0:.0f} s",
                  flush=True)
            if r.returncode != 0 or reports:
                failed.append(cls)
                sys.stdout.write(stderr[:20000])
    if failed:
        sys.exit(f"Oclgrind: failures in the {', '.join(failed)} kernel class(es)")
    print("Oclgrind: no reports")


def main():
    from netcl import models

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--models", default=",".join(models.MODELS), help="comma-separated (default: all)")
    ap.add_argument("--classes", default=",".join(CLASSES), help="comma-separated of gpu, cpu, cpu16")
    ap.add_argument("--oclgrind", action="store_true", help="run under Oclgrind with its checks; fail on any report")
    args = ap.parse_args()
    names = args.models.split(",")
    unknown = [n for n in names if n not in models.MODELS] + [c for c in args.classes.split(",") if c not in CLASSES]
    if unknown:
        sys.exit(f"unknown: {', '.join(unknown)}; models: {', '.join(models.MODELS)}; classes: {', '.join(CLASSES)}")
    if args.oclgrind:
        return under_oclgrind(args)
    for cls in args.classes.split(","):
        run_class(cls, names)


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    main()
