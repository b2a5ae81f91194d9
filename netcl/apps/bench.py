"""Inference latency: netcl's fused path against onnxruntime (CPU, and CUDA where present).

One process, the same weights and inputs for every runtime; each measurement is a full round
trip (host array in, host array out), the median of `repeats` runs after warm-up; outputs are
checked to agree before anything is timed. `bench()` returns the rows; `format_table()` and
`plot()` present them (tools/benchmark_onnx_vs_native.py and `netcl bench` call these).
"""
import gc
import os
import statistics
import tempfile
import time

import numpy as np

import netcl
from netcl import Tensor, jit, models, nn
from netcl.apps import common, recipes
from netcl.apps.common import PerBlock, interleaved_medians, ort_session
from netcl.io import export_onnx

MODELS = ("detector26", "resnet8", "mobilenetv2_tiny", "unet_tiny", "vit_tiny", "cnn", "mlp")
BATCHES = (1, 8, 32)


def prepare_model(name, queue, seed=0):
    """A reference model in eval mode with realistic batch-norm statistics (calibrated on the
    photographs shipped with scikit-learn, or on uniform noise without it), and an input source."""
    netcl.manual_seed(seed)
    model = models.build(name)
    shape = models.MODELS[name].input_shape
    rng = np.random.default_rng(seed)
    source = recipes.calibrate_batchnorm_on_photos(model, queue, shape, count=16, batch_size=8, seed=seed, rng=rng)
    model.to(queue).eval()

    def inputs(batch):
        if source == "photos":
            return recipes.photo_crops(batch, size=shape[-1], seed=seed + 1)
        return rng.uniform(0, 1, (batch,) + shape).astype(np.float32)
    return model, shape, inputs


def cuda_available():
    """Whether onnxruntime is installed with its CUDA execution provider."""
    try:
        import onnxruntime as ort
    except ImportError:
        return False
    return "CUDAExecutionProvider" in ort.get_available_providers()


def bench(models=MODELS, batches=BATCHES, *, repeats=50, warmup=5, providers=("cpu", "cuda"), ort_threads=None,
          device=None, tf32_column=True, torch_column=False, seed=0, rounds=1, log=print):
    """Time netcl (fused eval path) and onnxruntime on the reference models.

    models: names from netcl.models; batches: batch sizes; repeats: timed runs per round (the
    median over all rounds is reported); rounds: how often the runtimes take turns
    (interleaved_medians);
    providers: onnxruntime providers to compare against ('cpu', 'cuda'; 'cuda' is skipped with a
    note when onnxruntime has no CUDA provider); ort_threads: onnxruntime CPU threads (default: all
    cores); device: netcl's OpenCL device spec (as NETCL_DEVICE); tf32_column: also time CUDA with
    TF32 on (labelled); torch_column: also time torch eager CUDA (TF32 off) when available.
    Returns a list of dicts, one per (model, batch): latencies in ms per runtime, max abs
    differences, launches per forward and host microseconds per launch of the netcl path.
    Raises RuntimeError when outputs disagree or the CUDA provider is not really in use.
    """
    q = netcl.default_queue(device)
    providers = list(providers)
    if "cuda" in providers and not cuda_available():
        log("note: onnxruntime has no CUDAExecutionProvider here; CUDA columns skipped")
        providers.remove("cuda")
    dev_name = q.device.name.strip()
    rows = []
    tmp = tempfile.mkdtemp(prefix="netcl-bench-")
    for name in models:
        model, shape, inputs = prepare_model(name, q, seed)
        path = os.path.join(tmp, f"{name}.onnx")
        export_onnx(model, (1,) + tuple(shape), path, dynamic_batch=True)
        sessions = {}  # live for the whole model; the CPU session is made per use (PerBlock says why)
        cpu_session = (lambda: ort_session(path, "cpu", threads=ort_threads)) if "cpu" in providers else None
        if "cuda" in providers:
            sessions["ort_cuda"] = ort_session(path, "cuda", tf32=False)
            if tf32_column:
                sessions["ort_cuda_tf32"] = ort_session(path, "cuda", tf32=True)
        tmodel = _torch_model(model) if torch_column else None
        for b in batches:
            x = np.ascontiguousarray(inputs(b), np.float32)
            row = {"model": name, "batch": b, "device": dev_name}

            def run_netcl():
                return model(Tensor.from_host(q, x)).to_host()

            y = run_netcl()
            if model._fused is None:
                raise RuntimeError(f"{name}: no fused plan")
            # the unfused layer list on the same input: the fused path must equal it
            fused, model._fused = model._fused, None
            y_ref = run_netcl()
            model._fused = fused
            row["diff_unfused"] = float(np.abs(y - y_ref).max())
            checked = dict(sessions, ort_cpu=cpu_session()) if cpu_session else sessions
            for key, sess in checked.items():
                yo = sess.run(None, {"input": x})[0]
                d = float(np.abs(yo - y).max())
                row[f"diff_{key}"] = d
                tol = (1e-2, 1e-2) if key.endswith("tf32") else (1e-4, 1e-3)
                if not np.allclose(yo, y, atol=tol[0], rtol=tol[1]):
                    raise RuntimeError(f"{name} batch {b}: netcl and {key} disagree (max abs diff {d:.3g})")
            if row["diff_unfused"] > 1e-5 * max(1.0, float(np.abs(y_ref).max())):
                raise RuntimeError(f"{name} batch {b}: fused and unfused differ by {row['diff_unfused']:.3g}")

            # predict() as users call it: without a queue, so that on PoCL a small call takes the serial
            # device (netcl.runtime.serial_queue: the same kernel families, launch sizes for one core)
            pq = None if q is netcl.default_queue() else q
            y_inf = fused.infer(x, pq)
            if not np.allclose(y_inf, y, rtol=1e-5, atol=1e-6):
                raise RuntimeError(f"{name} batch {b}: predict() differs from model(Tensor) by "
                                   f"{np.abs(y_inf - y).max():.3g}")
            del checked, sess  # the CPU session among them: its workers end here
            timed = {"netcl": lambda: fused.infer(x, pq), "netcl_tensor": run_netcl}
            if cpu_session:
                timed["ort_cpu"] = PerBlock(lambda: _session_block(cpu_session(), x))
            for key, sess in sessions.items():
                timed[key] = lambda sess=sess: sess.run(None, {"input": x})
            if tmodel is not None:
                timed["torch_cuda"], row["diff_torch_cuda"] = _torch_run(tmodel, x, y)
            row.update({k: 1e3 * v for k, v in interleaved_medians(timed, repeats, rounds, warmup=warmup).items()})
            row["predict_serial"] = netcl.runtime.is_serial(fused.queue_for(x.shape, pq).device)  # where it ran
            # host cost of enqueueing one forward (no wait), per kernel launch
            xt = Tensor.from_host(q, x)
            q.finish()
            launches_before = jit.STATS["launches"]
            t_host = []
            for _ in range(max(10, repeats // 2)):
                t = time.perf_counter()
                model(xt)
                t_host.append(time.perf_counter() - t)
                q.finish()
            n_launch = (jit.STATS["launches"] - launches_before) // len(t_host)
            row["launches"], row["unfused_layers"] = n_launch, len(fused.unfused())
            row["host_us_per_launch"] = 1e6 * statistics.median(t_host) / max(n_launch, 1)
            log(format_row(row))
            rows.append(row)
    return rows


# -- torch eager CUDA (an extra column; TF32 off) ----------------------------------------
def _torch_model(model):
    """The PyTorch twin of `model` on CUDA (None without CUDA, or for a layer it cannot build)."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    twin = torch_layer(torch, model)
    return twin.cuda().eval() if twin is not None else None


def _torch_blocks(torch):
    class Residual(torch.nn.Module):
        def __init__(self, body, shortcut):
            super().__init__()
            self.body, self.shortcut = body, shortcut

        def forward(self, x):
            return self.body(x) + (x if self.shortcut is None else self.shortcut(x))

    class Concat(torch.nn.Module):
        def __init__(self, branches, dim):
            super().__init__()
            self.branches, self.dim = torch.nn.ModuleList(branches), dim

        def forward(self, x):
            return torch.cat([b(x) for b in self.branches], self.dim)

    class Transpose(torch.nn.Module):
        def __init__(self, dim0, dim1):
            super().__init__()
            self.dim0, self.dim1 = dim0, dim1

        def forward(self, x):
            return x.transpose(self.dim0, self.dim1)

    class SelfAttention(torch.nn.Module):  # netcl's MultiheadAttention: self-attention on (N, L, E)
        def __init__(self, embed_dim, num_heads):
            super().__init__()
            self.attn = torch.nn.MultiheadAttention(embed_dim, num_heads, batch_first=True)

        def forward(self, x):
            return self.attn(x, x, x, need_weights=False)[0]
    return Residual, Concat, Transpose, SelfAttention


def torch_layer(torch, m):
    """One netcl layer (or block) as a torch module with its weights and buffers (Linear weights
    transposed to torch's (out, in); blocks with netcl's attribute names, so state_dict keys match),
    or None when a layer is not covered. The benchmarks' PyTorch peer, for inference and training."""
    tnn = torch.nn
    if isinstance(m, nn.Sequential):
        parts = [torch_layer(torch, x) for x in m]
        return None if any(p is None for p in parts) else tnn.Sequential(*parts)
    if isinstance(m, nn.Residual):
        body = torch_layer(torch, m.body)
        sc = torch_layer(torch, m.shortcut) if m.shortcut is not None else None
        if body is None or (m.shortcut is not None and sc is None):
            return None
        return _torch_blocks(torch)[0](body, sc)
    if isinstance(m, nn.Concat):
        parts = [torch_layer(torch, b) for b in m.branches.layers]
        return None if any(p is None for p in parts) else _torch_blocks(torch)[1](parts, m.dim)
    if isinstance(m, nn.Conv2d):
        t = tnn.Conv2d(m.in_channels, m.out_channels, m.kernel_size, m.stride, m.padding, dilation=m.dilation,
                       groups=m.groups, bias=m.bias is not None)
    elif isinstance(m, nn.BatchNorm2d):
        t = tnn.BatchNorm2d(m.num_features, eps=m.eps, momentum=m.momentum)
        t.running_mean.data[:] = torch.from_numpy(m.running_mean.to_host())
        t.running_var.data[:] = torch.from_numpy(m.running_var.to_host())
    elif isinstance(m, nn.Linear):
        t = tnn.Linear(m.in_features, m.out_features, bias=m.bias is not None)
        t.weight.data[:] = torch.from_numpy(m.weight.to_host().T.copy())
        if m.bias is not None:
            t.bias.data[:] = torch.from_numpy(m.bias.to_host())
        return t
    elif isinstance(m, nn.LeakyReLU):
        return tnn.LeakyReLU(m.negative_slope)
    elif isinstance(m, (nn.MaxPool2d, nn.AvgPool2d)):
        return getattr(tnn, type(m).__name__)(m.kernel_size, m.stride, m.padding)
    elif isinstance(m, nn.Dropout):
        return tnn.Dropout(m.p)  # the identity in eval mode, as netcl's
    elif isinstance(m, nn.Flatten):
        return tnn.Flatten(m.start_dim, m.end_dim)
    elif isinstance(m, nn.AdaptiveAvgPool2d):
        return tnn.AdaptiveAvgPool2d(m.output_size)
    elif isinstance(m, nn.Upsample) and m.mode == "nearest":
        return tnn.Upsample(scale_factor=m.scale_factor, mode="nearest")
    elif isinstance(m, nn.AdaptiveAvgPool1d):
        return tnn.AdaptiveAvgPool1d(m.output_size)
    elif isinstance(m, nn.GELU):
        return tnn.GELU(approximate=m.approximate)
    elif isinstance(m, nn.Transpose):
        return _torch_blocks(torch)[2](m.dim0, m.dim1)
    elif isinstance(m, nn.LayerNorm):
        t = tnn.LayerNorm(m.normalized_shape, eps=m.eps)
    elif isinstance(m, nn.MultiheadAttention):  # netcl keeps PyTorch's names and (out, in) layouts: copied as they are
        t = _torch_blocks(torch)[3](m.embed_dim, m.num_heads)
        for name, p in m.named_parameters():
            target = t.attn.get_parameter(name)
            if tuple(target.shape) != tuple(p.shape):
                raise ValueError(f"MultiheadAttention {name}: netcl {p.shape} against torch {tuple(target.shape)}")
            target.data[:] = torch.from_numpy(p.to_host())
        return t
    else:
        make = {"ReLU": tnn.ReLU, "ReLU6": tnn.ReLU6, "Sigmoid": tnn.Sigmoid, "Tanh": tnn.Tanh, "SiLU": tnn.SiLU,
                "Hardswish": tnn.Hardswish, "Identity": tnn.Identity}.get(type(m).__name__)
        return make() if make is not None else None
    t.weight.data[:] = torch.from_numpy(m.weight.to_host())
    if m.bias is not None:
        t.bias.data[:] = torch.from_numpy(m.bias.to_host())
    return t


def _session_block(sess, x):
    """(a run of onnxruntime session `sess` on x, a function that drops the session: its threads end)."""
    held = [sess]

    def close():
        held.clear()
        gc.collect()
    return (lambda: held[0].run(None, {"input": x})), close


def _torch_run(tm, x, y_netcl):
    """(a round trip through the torch CUDA twin, its max abs difference from netcl's output)."""
    import torch

    def run():
        with torch.no_grad():
            return tm(torch.from_numpy(x).cuda()).cpu().numpy()
    return run, float(np.abs(run() - y_netcl).max())


# -- presentation ------------------------------------------------------------------------
COLUMNS = [("netcl", "netcl"), ("netcl_tensor", "netcl via Tensor API"), ("ort_cpu", "ort CPU"), ("ort_cuda", "ort CUDA"),
           ("ort_cuda_tf32", "ort CUDA TF32-on"), ("torch_cuda", "torch CUDA")]


def format_row(r):
    """One result row (a dict of run_model's) as a line of text: each runtime's time, launches, host time."""
    parts = [f"{r['model']:>10} b={r['batch']:<3}"]
    parts += [f"{label} {r[k]:.3f} ms" for k, label in COLUMNS if k in r]
    parts.append(f"{_launches(r)} launches, {r['host_us_per_launch']:.1f} us/launch host")
    return " | ".join(parts)


def _launches(r):
    """The plan's kernels per forward, and the unfused layers that enqueue their own besides."""
    extra = r.get("unfused_layers", 0)
    return f"{r['launches']}" + (f" +{extra} layers" if extra else "")


def format_table(rows):
    """A Markdown table: latency per runtime (ms) and netcl's ratio to each (lower is better for netcl)."""
    present = [(k, label) for k, label in COLUMNS if any(k in r for r in rows)]
    others = [(k, label) for k, label in present if not k.startswith("netcl")]
    serial = any(r.get("predict_serial") for r in rows)  # a column saying where predict() ran, when it moved
    head = (["model", "batch"] + [f"{label} ms" for _, label in present] +
            [f"netcl / {label}" for _, label in others] + ["launches", "host us/launch", "max |diff| vs ort"] +
            (["predict() on"] if serial else []))
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["model"], str(r["batch"])]
        cells += [f"{r[k]:.3f}" if k in r else "-" for k, _ in present]
        cells += [f"{r['netcl'] / r[k]:.2f}x" if k in r else "-" for k, _ in others]
        diffs = [r[k] for k in ("diff_ort_cuda", "diff_ort_cpu") if k in r]
        cells += [_launches(r), f"{r['host_us_per_launch']:.1f}", f"{max(diffs):.1e}" if diffs else "-"]
        if serial:
            cells.append("serial device" if r.get("predict_serial") else "threaded device")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows, path, title=""):
    """Latency against batch size, one panel per model, log scales; writes a PNG to `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(1, len(names), figsize=(5 * len(names), 4), squeeze=False)
    for ax, name in zip(axes[0], names):
        rs = [r for r in rows if r["model"] == name]
        for k, label in COLUMNS:
            pts = [(r["batch"], r[k]) for r in rs if k in r]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch size")
        ax.set_ylabel("latency, ms (round trip, median)")
        ax.set_title(name)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# -- command line ---------------------------------------------------------------------
_CLI_DOC = """Benchmark netcl's fused inference path against onnxruntime (CPU, and CUDA where present).

Reference models (detector26, resnet8, mobilenetv2_tiny, unet_tiny, vit_tiny, cnn, mlp) at
several batch sizes; every figure is a full
host -> device -> host round trip, the median of --rounds x --repeats runs after warm-up (the
runtimes take turns, --repeats runs each per round), in one process with the same weights and
inputs; outputs are checked to agree before timing. onnxruntime's
CUDA provider is checked to be really in use; TF32 off is the fair float32 column, TF32 on is
reported separately. Prints a Markdown table with ratios and writes results.json, table.md and
a PNG plot of latency against batch size into --out-dir. The launches column counts the fused
plan's kernels per forward; "+N layers" are unfused layers that enqueue their own kernels besides.

    netcl bench                         # all models, batches 1,8,32
    netcl bench --models detector26 --batches 1,8 --ort-threads 2
    NETCL_DEVICE=gpu netcl bench --providers cpu,cuda --torch
"""


def main(argv=None, prog=None):
    """`netcl bench` and tools/benchmark_onnx_vs_native.py: parse options, run, print, save."""
    import argparse
    import json

    ap = argparse.ArgumentParser(prog=prog, description=_CLI_DOC,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", type=common.names, default=MODELS, help="comma-separated (default: %(default)s)")
    ap.add_argument("--batches", type=common.positive_ints, default=BATCHES, help="default: 1,8,32")
    ap.add_argument("--repeats", type=common.positive_int, default=50,
                    help="timed runs per figure; the median is reported")
    ap.add_argument("--rounds", type=common.positive_int, default=3,
                    help="rounds in which the runtimes take turns (default: %(default)s)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--providers", type=common.names, default=("cpu", "cuda"),
                    help="onnxruntime providers: cpu, cuda (cuda is skipped when absent)")
    ap.add_argument("--ort-threads", type=int, default=None, help="onnxruntime CPU threads (default: all cores)")
    ap.add_argument("--device", default=None, help="netcl's OpenCL device: gpu, cpu or a name substring")
    ap.add_argument("--no-tf32-column", action="store_true", help="skip the CUDA TF32-on column")
    ap.add_argument("--torch", action="store_true", help="add a torch eager CUDA column (TF32 off)")
    ap.add_argument("--out-dir", default="out/bench", help="where results.json, table.md and the PNG go")
    ap.add_argument("--plot", default="bench.png", help="PNG file name inside --out-dir ('' for none)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    rows = bench(args.models, args.batches, repeats=args.repeats, warmup=args.warmup,
                       providers=args.providers, ort_threads=args.ort_threads, device=args.device,
                       tf32_column=not args.no_tf32_column, torch_column=args.torch, seed=args.seed,
                       rounds=args.rounds)
    os.makedirs(args.out_dir, exist_ok=True)
    table = format_table(rows)
    dev = rows[0]["device"] if rows else "?"
    header = f"netcl on {dev}; onnxruntime CPU threads: {args.ort_threads or os.cpu_count()}; " \
             f"median of {args.rounds} x {args.repeats} round trips, runtimes alternating"
    print("\n" + header + "\n\n" + table)
    with open(os.path.join(args.out_dir, "table.md"), "w") as f:
        f.write(header + "\n\n" + table + "\n")
    with open(os.path.join(args.out_dir, "results.json"), "w") as f:
        json.dump(rows, f, indent=1)
    if args.plot:
        print("plot:", plot(rows, os.path.join(args.out_dir, args.plot), title=header))
    return 0
