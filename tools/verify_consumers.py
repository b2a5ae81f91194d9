#!/usr/bin/env python3
"""Measure which ONNX consumers read netcl's exports, at which opsets, and how closely they agree.

Exports the reference models (mlp; cnn and detector26 with batch norm calibrated on crops of the
photographs shipped with scikit-learn, run on those photographs; an every-layer model; a
MultiheadAttention model) with a symbolic batch at each opset, computes netcl's outputs at batch
sizes 2 and 1, and runs every file in each consumer, installed from PyPI into its own cached venv
(~/.cache/netcl/consumers/<venv>, or $NETCL_CONSUMER_CACHE/consumers/<venv>). Prints a markdown
table (consumer, version, opsets accepted, max abs difference vs netcl, notes), then each TARGETS
row next to what was measured, and writes the details as JSON. Too heavy for CI (the venvs take
about 4.5 GB; a full run about 6 minutes here); tests/test_onnx_targets.py keeps the onnxruntime 1.15 check in the suite.

    python tools/verify_consumers.py                        # every consumer, opsets 11..25
    python tools/verify_consumers.py --consumer opencv-5 --opsets 11,17 --json out.json

This file is also the runner inside each venv (`--run KIND JOBS`): there it imports only numpy,
json and the consumer, never netcl.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
AGREE = 1e-4  # a consumer agrees with netcl when every output is within this (max abs difference)

# venv name -> pip requirements (numpy<2 for wheels built against numpy 1)
VENVS = {
    "onnxruntime": ["onnxruntime", "numpy"],
    "onnxruntime-1.15": ["onnxruntime==1.15.1", "numpy<2"],
    **{f"onnxruntime-1.{v}": [f"onnxruntime==1.{v}.*", "numpy<2"] for v in range(16, 23)},
    "opencv-4.8": ["opencv-python-headless==4.8.*", "numpy<2"],
    "opencv-4": ["opencv-python-headless<5", "numpy"],
    "opencv-5": ["opencv-python-headless>=5", "numpy"],
    "openvino-2023.0": ["openvino==2023.0.*", "numpy<2"],
    "openvino-2024.0": ["openvino==2024.0.*", "numpy<2"],
    "openvino": ["openvino", "numpy"],
    "onnx2torch": ["onnx2torch", "onnx", "numpy"],  # torch: see _onnx2torch_venv
    "onnxsim": ["onnxsim", "onnxruntime", "numpy"],
    "onnxslim": ["onnxslim", "onnxruntime", "numpy"],
    "onnx-reference": ["onnx", "numpy"],
    "tract-0.21": ["tract==0.21.*", "numpy<2"],
    "tract": ["tract", "numpy"],
}
# consumer -> (venv, runner kind, the TARGETS row it measures or None)
CONSUMERS = {
    "onnxruntime": ("onnxruntime", "onnxruntime", None),
    "onnxruntime, no graph optimisation": ("onnxruntime", "onnxruntime-noopt", None),
    **{f"onnxruntime-1.{v}": (f"onnxruntime-1.{v}", "onnxruntime", f"onnxruntime-1.{v}") for v in range(15, 23)},
    "opencv-4.8": ("opencv-4.8", "opencv", "opencv-4.8"),
    "opencv-4 (latest), path": ("opencv-4", "opencv", None),
    "opencv-4 (latest), buffer": ("opencv-4", "opencv-buffer", None),
    "opencv-5, path": ("opencv-5", "opencv", "opencv-5.0"),
    "opencv-5, path, classic engine": ("opencv-5", "opencv-classic", None),
    "opencv-5, buffer, classic engine": ("opencv-5", "opencv-classic-buffer", None),
    "openvino-2023.0": ("openvino-2023.0", "openvino", "openvino-2023.0"),
    "openvino-2024.0": ("openvino-2024.0", "openvino", "openvino-2024.0"),
    "openvino (latest)": ("openvino", "openvino", None),
    "openvino (latest), default precision": ("openvino", "openvino-default", None),
    "onnx2torch": ("onnx2torch", "onnx2torch", "onnx2torch-1.5"),
    "onnxsim, then onnxruntime": ("onnxsim", "onnxsim", None),
    "onnxslim, then onnxruntime": ("onnxslim", "onnxslim", None),
    "onnx reference evaluator": ("onnx-reference", "reference", None),
    "tract-0.21": ("tract-0.21", "tract", "tract-0.21"),
    "tract (latest)": ("tract", "tract", None),
}
_AVGPOOL = ("AveragePool's count_include_pad=1 is ignored (border windows divided by their valid count: 9/4 "
            "too large in a corner)")
# consumer -> (model, the cause, found by hand with one-layer models): noted while that model fails
KNOWN = {
    **{name: ("layer:AvgPool2d", _AVGPOOL + ", from a path and from a buffer")
       for name in ("opencv-4.8", "opencv-4 (latest), path", "opencv-4 (latest), buffer")},
    "opencv-5, path, classic engine": ("layer:AvgPool2d", _AVGPOOL + " when loaded from a path (from a buffer, right)"),
    "onnx reference evaluator": ("layer:BatchNorm2d", "BatchNormalization-9 (opsets 9-13) normalises with 0.9 x "
                                                      "running + 0.1 x batch statistics: the schema's default "
                                                      "momentum sends every call down its training branch"),
    "openvino (latest), default precision": ("cnn", "on a CPU with avx512_bf16 the default inference precision "
                                                    "is bf16; the other OpenVINO rows ask for f32"),
}


# -- the venvs --------------------------------------------------------------------------------
def _onnx2torch_venv(python, pip):
    """onnx2torch needs torch and torchvision. PyPI's torch wheels pull in CUDA (gigabytes), so the
    venv reads torch from netcl's own environment through a .pth file; PyPI's torchvision needs
    PyPI's torch, so it gets a stub: onnx2torch imports torchvision for its NMS/RoiAlign converters
    only, which netcl's models never need."""
    import torch

    site = Path(subprocess.run([python, "-c", "import site; print(site.getsitepackages()[0])"], check=True,
                               capture_output=True, text=True).stdout.strip())
    subprocess.run(pip + ["--no-deps", "onnx2torch"], check=True, capture_output=True)
    (site / "zz_torch_from_netcl.pth").write_text(str(Path(torch.__file__).parents[1]) + "\n")
    (site / "torchvision").mkdir(exist_ok=True)
    (site / "torchvision" / "__init__.py").write_text("from . import ops  # netcl's stub for onnx2torch\n")
    (site / "torchvision" / "ops.py").write_text("def nms(*a, **k):\n    raise NotImplementedError('stub')\n\n\n"
                                                 "box_convert = roi_align = nms\n")


def venv_python(name):
    """The python of the cached venv `name` (VENVS), built on first use or when its pins change."""
    requirements = VENVS[name]
    venv = Path(os.environ.get("NETCL_CONSUMER_CACHE", Path.home() / ".cache" / "netcl")) / "consumers" / name
    python, marker = venv / "bin" / "python", venv / "netcl-requirements.txt"
    if python.exists() and marker.exists() and marker.read_text() == "\n".join(requirements):
        return str(python)
    print(f"building {venv} ({' '.join(requirements)})", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, capture_output=True)
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    if name == "onnx2torch":
        _onnx2torch_venv(str(python), pip)
    r = subprocess.run(pip + [q for q in requirements if not (name == "onnx2torch" and q == "onnx2torch")],
                       capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"pip install {' '.join(requirements)} failed: {r.stderr[-600:]}")
    marker.write_text("\n".join(requirements))
    return str(python)


# -- inside a consumer's venv ------------------------------------------------------------------
def _consumer(kind):
    """(version, prepare): prepare(path) loads a model and returns run(x) -> y."""
    from importlib.metadata import version

    if kind.startswith("onnxruntime"):
        import onnxruntime as ort

        def prepare(path):
            so = ort.SessionOptions()
            if kind == "onnxruntime-noopt":
                so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
            return lambda x: s.run(None, {s.get_inputs()[0].name: x})[0]
        return ort.__version__, prepare
    if kind.startswith("opencv"):
        import cv2

        def prepare(path):
            src = np.fromfile(path, np.uint8) if kind.endswith("buffer") else path
            net = cv2.dnn.readNetFromONNX(src, cv2.dnn.ENGINE_CLASSIC) if "classic" in kind else \
                cv2.dnn.readNetFromONNX(src)

            def run(x):
                net.setInput(x)
                return net.forward()
            return run
        return cv2.__version__, prepare
    if kind.startswith("openvino"):
        try:
            from openvino import Core
        except ImportError:  # 2023.0 has it in openvino.runtime only
            from openvino.runtime import Core

        core = Core()
        # f32 unless the default is asked for: on a CPU with bf16 the default computes in bf16
        config = {} if kind == "openvino-default" else {"INFERENCE_PRECISION_HINT": "f32"}

        def prepare(path):
            compiled = core.compile_model(path, "CPU", config)
            return lambda x: compiled([x])[compiled.output(0)]
        return version("openvino"), prepare
    if kind == "onnx2torch":
        import onnx2torch
        import torch

        def prepare(path):
            m = onnx2torch.convert(path).eval()

            def run(x):
                with torch.no_grad():
                    return m(torch.from_numpy(x)).numpy()
            return run
        return f"{version('onnx2torch')} (torch {torch.__version__})", prepare
    if kind in ("onnxsim", "onnxslim"):
        import onnx
        import onnxruntime as ort

        def prepare(path):
            if kind == "onnxsim":
                import onnxsim

                model, ok = onnxsim.simplify(onnx.load(path))
                if not ok:
                    raise RuntimeError("onnxsim's check of the simplified model failed")
            else:
                import onnxslim

                model = onnxslim.slim(onnx.load(path))
            s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
            return lambda x: s.run(None, {s.get_inputs()[0].name: x})[0]
        return f"{version(kind)} (onnxruntime {ort.__version__})", prepare
    if kind == "reference":
        from onnx.reference import ReferenceEvaluator

        def prepare(path):
            sess = ReferenceEvaluator(path)
            return lambda x: sess.run(None, {sess.input_names[0]: x})[0]
        return version("onnx"), prepare
    if kind == "tract":
        import tract

        def prepare(path):
            o = tract.onnx()
            runnable = (o.load(path).into_model() if hasattr(o, "load") else  # 0.22 on
                        o.model_for_path(path).into_optimized()).into_runnable()
            return lambda x: runnable.run([x])[0].to_numpy()
        return tract.version(), prepare
    raise ValueError(f"unknown consumer kind {kind!r}")


def run_jobs(kind, jobs_path):
    """Runs each job (a model and its inputs); prints START/OK/ERR lines the parent reads, so a
    crash or hang loses only the job it happened in."""
    jobs = json.loads(Path(jobs_path).read_text())
    ver, prepare = _consumer(kind)
    print("VERSION", ver, flush=True)
    for i, job in enumerate(jobs):
        print("START", i, flush=True)
        try:
            run = prepare(job["model"])
            for x_path, y_path in job["io"]:
                np.save(y_path, np.asarray(run(np.load(x_path)), np.float32))
            print("OK", i, flush=True)
        except Exception as e:  # the consumer's refusal is the measurement
            print("ERR", i, json.dumps(f"{type(e).__name__}: {e}"[:600]), flush=True)


# -- netcl's side ------------------------------------------------------------------------------
def every_layer():
    """(N, 3, 16, 16) -> (N, 5): every exported layer type but MultiheadAttention, with padding,
    groups, dilation, a transposed convolution and a Softmax over channels (the pre-13 form). It
    ends in a Linear, not a Softmax, so that a consumer's mistake is not squashed out of sight."""
    from netcl import nn

    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AvgPool2d(3, 2, 1),
        nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.LeakyReLU(0.2),
        nn.Conv2d(8, 12, 3, padding=2, dilation=2, groups=2, bias=False), nn.MaxPool2d(3, 2, 1),
        nn.ConvTranspose2d(12, 6, 3, stride=2, padding=1, output_padding=1), nn.Softmax(1), nn.Conv2d(6, 6, 1),
        nn.Sigmoid(), nn.Flatten(), nn.Dropout(0.3), nn.Linear(6 * 8 * 8, 12), nn.Tanh(), nn.Identity(),
        nn.Linear(12, 5, bias=False))


def attention():
    from netcl import nn

    return nn.Sequential(nn.Linear(16, 32), nn.MultiheadAttention(32, 4), nn.Tanh(), nn.Linear(32, 8),
                         nn.Softmax(-1))


def reference_models(queue, seed=0):
    """name -> (model in eval mode, an input batch of 2): the reference models, then one model per layer type."""
    import netcl
    from netcl import models
    from netcl.apps import recipes

    rng = np.random.default_rng(seed)
    netcl.manual_seed(seed)
    out = {"mlp": (models.mlp(), rng.standard_normal((2, 64)).astype(np.float32))}
    for name, build, size in (("cnn", models.cnn, 32), ("detector26", models.detector26, 256),
                              ("every-layer", every_layer, 16)):
        model = build()
        recipes.calibrate_batchnorm(model, queue, recipes.photo_crops(8, size, seed=seed), batch_size=4)
        out[name] = (model, recipes.photos(size))
    model = attention()
    for _, t in model.named_parameters():  # weights large enough for peaked attention
        t.set_(rng.normal(0, 0.3, t.shape))
    out["attention"] = (model, rng.standard_normal((2, 5, 16)).astype(np.float32))
    # one model per exported layer type: the registry tests/test_onnx_opsets.py keeps complete
    sys.path.insert(0, str(ROOT / "tests"))
    from test_onnx_opsets import LAYER_MODELS, randomized

    for t, (build, shape) in LAYER_MODELS.items():
        out[f"layer:{t.__name__}"] = (randomized(build(), rng), rng.standard_normal((2,) + shape).astype(np.float32))
    return {k: (m.eval(), x) for k, (m, x) in out.items()}


def _run_consumer(name, jobs, work, timeout):
    venv, kind, _ = CONSUMERS[name]
    python = venv_python(venv)
    results, version, todo = {}, None, list(range(len(jobs)))
    while todo:
        path = work / "jobs.json"
        path.write_text(json.dumps([jobs[i] for i in todo]))
        current, lines = None, []
        try:
            r = subprocess.run([python, __file__, "--run", kind, str(path)], capture_output=True, text=True,
                               timeout=timeout, cwd=work)
            lines, tail = r.stdout.splitlines(), (r.stderr or "").strip().splitlines()[-1:] or [f"exit {r.returncode}"]
        except subprocess.TimeoutExpired as e:
            lines, tail = (e.stdout or b"").decode().splitlines(), [f"no answer in {timeout} s"]
        for line in lines:
            word, _, rest = line.partition(" ")
            if word == "VERSION":
                version = rest
            elif word == "START":
                current = todo[int(rest)]
            elif word in ("OK", "ERR"):
                i, _, msg = rest.partition(" ")
                results[todo[int(i)]] = None if word == "OK" else json.loads(msg)
                current = None
        if current is not None:  # it crashed or hung in this job: record it, go on after it
            results[current] = f"crashed: {tail[0][:300]}"
        elif not any(w.startswith(("OK", "ERR")) for w in lines):
            return version, {i: f"failed to start: {tail[0][:300]}" for i in todo}
        todo = [i for i in todo if i not in results]
    return version, results


def _ranges(opsets):
    out, run = [], []
    for o in sorted(opsets):
        if run and o != run[-1] + 1:
            out.append(run)
            run = []
        run.append(o)
    out += [run] if run else []
    return ", ".join(f"{r[0]}" if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in out) or "none"


# why a consumer failed, from its message (the rest is source paths and C++ signatures): a pattern
# and the note; with a group named op, the ops and versions are gathered into one note of that kind
_WHY = [(r"max supported IR version: (\d+)", "reads IR {0} at most"),
        (r"Opset (\d+) is under development", "calls opset {0} \"under development\""),
        (r"Could not find an implementation for (?P<op>\w+)\((\d+)\)", "no kernels for"),
        (r"operation_type='(?P<op>\w+)', version=(\d+)\)", "no converters for")]


def _short(msg):
    """(note, "Op-version" or None)."""
    for pattern, note in _WHY:
        m = re.search(pattern, msg)
        if m and "op" in m.groupdict():
            return note, f"{m['op']}-{m.group(2)}"
        if m:
            return note.format(*m.groups()), None
    msg = re.sub(r"Load model from \S+ failed:|/\S+:\d+:? ", "", msg)
    return " ".join(re.sub(r"\n>", " ", msg).split())[:200], None  # OpenCV starts lines with "> "


def _summary(name, version, runs, opsets):
    """One table row: the opsets at which every model ran and agreed (leaving out, and naming, a
    model that fails at every opset), the largest difference, and notes."""
    good = lambda v: v is not None and v.get("diff", np.inf) <= AGREE  # noqa: E731
    never = sorted(m for m, r in runs.items() if not any(good(v) for v in r.values()))
    ok = [o for o in opsets if all(good(r.get(o)) for m, r in runs.items() if m not in never)]
    diffs = [v["diff"] for r in runs.values() for v in r.values() if "diff" in v]
    notes = {}  # note -> ([(model, opset)], {op-version})
    for model, r in runs.items():
        for o, v in r.items():
            note, op = _short(v["error"]) if "error" in v else (f"differs by up to {v['diff']:.1e}", None) \
                if not good(v) else (None, None)
            if note:
                where, ops = notes.setdefault(note, ([], set()))
                where.append((model, o))
                ops.update([op] if op else [])
    lines = []
    for note, (where, ops) in notes.items():
        models = {m for m, _ in where}
        ops = sorted(ops, key=lambda s: (s.split("-")[0], int(s.split("-")[1])))
        lines.append(f"{'every model' if len(models) == len(runs) > 1 else ', '.join(sorted(models))} at "
                     f"{_ranges({o for _, o in where})}: {note}" + (f" {', '.join(ops)}" if ops else ""))
    if name in KNOWN and not all(good(v) for v in runs.get(KNOWN[name][0], {}).values()):
        lines.append(f"cause: {KNOWN[name][1]}")
    accepted = "none" if len(never) == len(runs) else _ranges(ok) + (f" (all but {', '.join(never)})" if never else "")
    return {"consumer": name, "version": version, "accepted": accepted, "accepted_list": ok,
            "max_abs_diff": max(diffs) if diffs else None, "notes": lines}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", nargs=2, metavar=("KIND", "JOBS"), help=argparse.SUPPRESS)
    ap.add_argument("--consumer", action="append", help="a consumer (repeatable; default all): substring of "
                                                        + "; ".join(CONSUMERS))
    ap.add_argument("--opsets", help="comma-separated opsets (default: every opset netcl writes)")
    ap.add_argument("--json", default="consumers.json", help="where to write the details (default consumers.json)")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds one consumer process may take")
    args = ap.parse_args(argv)
    if args.run:
        return run_jobs(*args.run)

    sys.path.insert(0, str(ROOT))
    import netcl
    from netcl.io import export_onnx
    from netcl.io import onnx_export as ox

    names = [n for n in CONSUMERS if not args.consumer or any(c in n for c in args.consumer)]
    opsets = [int(o) for o in args.opsets.split(",")] if args.opsets else sorted(ox.OPSET_IR_VERSION)
    queue = netcl.default_queue()
    with tempfile.TemporaryDirectory(prefix="netcl-consumers-") as tmp:
        work = Path(tmp)
        jobs, want = [], []  # want[i]: netcl's outputs for jobs[i]'s inputs
        for model_name, (model, x) in reference_models(queue).items():
            xs = [x, x[:1]]
            outs = [model(netcl.Tensor.from_host(queue, xi)).to_host() for xi in xs]
            for b, xi in enumerate(xs):
                np.save(work / f"{model_name}-x{b}.npy", xi)
            for o in opsets:
                path = work / f"{model_name}-{o}.onnx"
                export_onnx(model, x.shape, path, opset=o, dynamic_batch=True)
                io = [[str(work / f"{model_name}-x{b}.npy"), str(work / f"{model_name}-{o}-y{b}.npy")]
                      for b in range(len(xs))]
                jobs.append({"model": str(path), "io": io, "name": model_name, "opset": o})
                want.append(outs)
        report = []
        for name in names:
            t0 = time.perf_counter()
            for job in jobs:
                for _, y in job["io"]:
                    Path(y).unlink(missing_ok=True)
            try:
                version, results = _run_consumer(name, jobs, work, args.timeout)
            except (RuntimeError, OSError, subprocess.SubprocessError) as e:
                report.append({"consumer": name, "version": None, "accepted": "not installable", "accepted_list": [],
                               "max_abs_diff": None, "notes": [str(e)[:300]]})
                continue
            runs = {}
            for i, job in enumerate(jobs):
                entry = {"error": results[i]} if results.get(i) else {"diff": max(
                    float(np.abs(np.load(y).astype(np.float64) - w).max()) if np.load(y).shape == w.shape else np.inf
                    for (_, y), w in zip(job["io"], want[i]))}
                runs.setdefault(job["name"], {})[job["opset"]] = entry
            row = _summary(name, version, runs, opsets)
            row.update(target=CONSUMERS[name][2], seconds=round(time.perf_counter() - t0, 1), runs=runs)
            report.append(row)
            print(f"{name}: {row['accepted']} ({row['seconds']} s)", file=sys.stderr)

    print("| consumer | version | opsets accepted | max abs diff vs netcl | notes |\n|---|---|---|---|---|")
    for r in report:
        diff = "—" if r["max_abs_diff"] is None else f"{r['max_abs_diff']:.1e}"
        print(f"| {r['consumer']} | {r['version'] or '—'} | {r['accepted']} | {diff} | {'; '.join(r['notes'])} |"
              .replace("\n", " "))
    print("\n| TARGETS row | (opset, IR) in the table | highest opset measured (every lower one accepted too) |\n"
          "|---|---|---|")
    for r in report:
        if r.get("target"):
            ok = set(r["accepted_list"])
            top = max((o for o in opsets if all(p in ok for p in opsets if p <= o)), default=None)
            print(f"| {r['target']} | {ox.TARGETS[r['target']]} | {top} ({r['consumer']} {r['version']}) |")
    Path(args.json).write_text(json.dumps({"agree": AGREE, "opsets": opsets, "consumers": report}, indent=1,
                                          default=lambda v: None))
    print(f"\ndetails: {args.json}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
