"""What the applications share: an onnxruntime session on a checked provider, a median timer and
the command lines' argument types."""
import argparse
import os
import statistics
import sys
import time

PROVIDERS = ("cpu", "cuda")

# Instruction sets whose code paths a benchmark can run on a machine with a wider one (--isa): the
# environment that makes PoCL generate that set's code (its kernel library, and with it LLVM's
# CPU: "pthread-haswell-..."), netcl run that vector width's kernel variants, and the peers run
# theirs (PyTorch's ATen and oneDNN, numpy's OpenBLAS). Zen 4 running AVX2 code has Zen 3's
# 256-bit FMA throughput, so it stands in for an AVX2 machine (checked against a Zen 3: docs/performance.md).
ISA_ENVIRONMENTS = {"avx2": {"POCL_KERNELLIB_NAME": "avx2", "NETCL_FLOAT_LANES": "8", "ATEN_CPU_CAPABILITY": "avx2",
                             "ONEDNN_MAX_CPU_ISA": "AVX2", "OPENBLAS_CORETYPE": "Haswell", "NETCL_BENCH_ISA": "avx2"}}


def run_as_isa(isa, argv=None):
    """Make this process run `isa`'s code paths (ISA_ENVIRONMENTS; None: nothing to do): where its
    environment is not set yet, the process starts again with it (os.execv of sys.argv), before
    PoCL, numpy or PyTorch read it; the benchmarks' child processes inherit it. argv: the
    arguments main() was called with (not None: called from Python, which cannot restart)."""
    if isa is None:
        return
    env = ISA_ENVIRONMENTS[isa]
    if all(os.environ.get(k) == v for k, v in env.items()):
        return
    if argv is not None:
        raise ValueError(f"--isa {isa} restarts the process with its environment: run the tool as a command, or "
                         f"set {' '.join(f'{k}={v}' for k, v in env.items())} before it starts")
    os.environ.update(env)
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable] + sys.argv)


def ort_session(path, provider="cpu", *, threads=None, tf32=False):
    """An onnxruntime InferenceSession on `provider` ("cpu" or "cuda").

    "cuda" uses the CUDA execution provider with TF32 off unless `tf32` (off, results are close
    enough to float32 to compare) and the CPU as fallback for unsupported nodes; it raises
    RuntimeError if onnxruntime did not really put the CUDA provider first (a CPU-only build, or
    CUDA failing to load: the session then silently runs on the CPU). threads: onnxruntime's
    intra-op threads (default: all cores)."""
    import onnxruntime as ort

    if provider not in PROVIDERS:
        raise ValueError(f"provider must be one of {PROVIDERS}, got {provider!r}")
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if threads:
        opts.intra_op_num_threads = int(threads)
    if provider == "cuda":
        if hasattr(ort, "preload_dlls"):  # onnxruntime-gpu >= 1.21: load the CUDA/cuDNN libraries of pip wheels
            ort.preload_dlls()
        providers = [("CUDAExecutionProvider", {"use_tf32": int(bool(tf32))}), "CPUExecutionProvider"]
    else:
        providers = ["CPUExecutionProvider"]
    sess = ort.InferenceSession(os.fspath(path), opts, providers=providers)
    want = "CUDAExecutionProvider" if provider == "cuda" else "CPUExecutionProvider"
    if sess.get_providers()[0] != want:
        raise RuntimeError(f"onnxruntime runs on {sess.get_providers()}, not {want} "
                           f"(available: {ort.get_available_providers()})")
    return sess


def median_time(fn, repeats, *, warmup=0, min_seconds=0.0, max_repeats=50):
    """Median wall seconds of fn() over `repeats` timed runs after `warmup` untimed ones; while
    the timed runs total less than `min_seconds`, more of them (up to `max_repeats`)."""
    for _ in range(warmup):
        fn()
    times = []
    start = time.perf_counter()
    while len(times) < repeats or (time.perf_counter() - start < min_seconds and len(times) < max_repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


class PerBlock:
    """A runtime for interleaved_medians that exists only during its own blocks: make() returns
    (the callable to time, a function that closes it). For onnxruntime's CPU sessions, whose idle
    workers keep spinning after a run: on 2 cores they take a core from netcl's kernels timed next."""

    def __init__(self, make):
        self.make = make


def interleaved_medians(fns, repeats, rounds, *, warmup=0):
    """{key: median wall seconds} of the callables in `fns` (or PerBlock runtimes), timed in
    `rounds` rounds that take each in turn for `repeats` runs (after `warmup` untimed ones per
    round): peers share the machine's slow and fast moments instead of each getting its own
    stretch of them."""
    times = {k: [] for k in fns}
    for _ in range(rounds):
        for key, fn in fns.items():
            close = None
            if isinstance(fn, PerBlock):
                fn, close = fn.make()
            try:
                for _ in range(warmup):
                    fn()
                for _ in range(repeats):
                    t = time.perf_counter()
                    fn()
                    times[key].append(time.perf_counter() - t)
            finally:
                if close is not None:
                    close()
    return {k: statistics.median(v) for k, v in times.items()}


# -- argument types for argparse ---------------------------------------------------------
def _positive_ints(text, expected):
    try:
        values = tuple(int(v) for v in text.replace("x", ",").split(","))
    except ValueError:
        values = ()
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return values


def shape(text):
    """'1,3,256,256' or '1x3x256x256' -> (1, 3, 256, 256): positive integers."""
    return _positive_ints(text, "a shape of positive integers like 1,3,256,256")


def positive_ints(text):
    """'1,8,32' -> (1, 8, 32): a comma-separated list of positive integers (batch sizes)."""
    return _positive_ints(text, "comma-separated positive integers like 1,8,32")


def positive_int(text):
    """An argparse type: a positive integer, else an argparse error saying so."""
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


def names(text):
    """'a,b' -> ('a', 'b'): a comma-separated list of names."""
    return tuple(v for v in text.split(",") if v.strip())
