"""OpenCL device selection: NETCL_DEVICE = gpu | cpu | <name substring>; default first GPU, else first CPU.

PoCL's serial CPU device: PoCL has two CPU drivers, "pthread" (a pool of worker threads, one per
core; netcl's CPU device) and "basic", which runs each command in the thread that enqueues it.
Unless POCL_DEVICES is set, netcl asks PoCL for both before its first OpenCL call (PoCL reads
POCL_DEVICES once, when a process first lists platforms; netcl removes it again then, so child
processes inherit the environment they were given), so that predict() can run calls too
small for two cores on the serial device (netcl.jit.plan): handing a kernel to a worker thread that
sleeps on another core costs ~20-45 us on this project's 2-core machine, more than many of a small
model's kernels take. The serial device is never chosen as "cpu" or by default, only by its name.
NETCL_CPU_SERIAL=0 leaves POCL_DEVICES alone (and predict() on the pthread device).

A device that cannot compile: PoCL 3.0 from PyPI (pocl-binary-distribution, LLVM 14) names a CPU
its LLVM does not know (AMD Zen 5, family 26, say) "generic", which its compiler then refuses
("unknown target CPU 'generic'"), so no kernel builds; on an AMD Zen 4 it builds, but aborts at
the first float16 fma (see _PROBE). Where the candidates (by type, by default, or by a name several
match) sit on more than one platform (a second PoCL beside it, such as Debian's pocl-opencl-icd,
which `make` installs where the first fails), netcl probes each in turn (compile_error: float16
kernels built and run in a child process, the verdict kept on disk) and takes the first that
passes; `netcl devices --check` probes every device."""
import hashlib
import os
import platform
import signal
import subprocess
import sys
from dataclasses import dataclass

from netcl.errors import NoDeviceError
from netcl.io.atomic import AtomicFile
from netcl.runtime.program import _hint, cache_dir

_INSTALL_HINT = (
    "netcl needs an OpenCL platform. On a plain CPU machine install PoCL: "
    "`pip install pocl-binary-distribution` (or `pip install netcl[cpu]`, or Debian's "
    "`apt-get install pocl-opencl-icd`). On NVIDIA GPUs register the driver's libnvidia-opencl.so.1 "
    "in an .icd file under /etc/OpenCL/vendors (or OCL_ICD_VENDORS)."
)


@dataclass(frozen=True)
class DeviceInfo:
    platform: str
    name: str
    type: str  # "gpu", "cpu", "accelerator" or "other"
    index: int  # position in the flat list of all devices

    def __str__(self):
        return f"[{self.index}] {self.type.upper():4s} {self.name} ({self.platform})"


def _cl():
    try:
        import pyopencl as cl
    except ImportError as e:  # the export-only install has no pyopencl
        raise NoDeviceError(f"pyopencl is not installed ({e}). `pip install pyopencl`. " + _INSTALL_HINT) from e
    return cl


SERIAL_PREFIXES = ("basic-", "cpu-minimal-")  # PoCL's serial CPU device, named by driver (PoCL 3; 5+)
SERIAL_MACS = 30_000_000  # predict() runs calls of at most this many multiply-accumulates on the serial device
_probed = {}  # device (int_ptr) -> None where it passes the probe (compile_error), else the error's text
_asked = []  # set once this process has listed platforms: POCL_DEVICES is read then, never again
_SERIAL_DEVICES = "pthread basic"  # POCL_DEVICES as netcl sets it
_set_by_netcl = []  # holds True where netcl set it (the probe's child process then sets it too)


def serial_bound(value=None):
    """$NETCL_CPU_SERIAL (or `value`) as the largest predict() call, in multiply-accumulates, that the
    serial device takes: unset or 1 -> SERIAL_MACS; 0 or less -> 0 (off); another number -> itself.
    ValueError naming the variable for anything else."""
    v = (os.environ.get("NETCL_CPU_SERIAL", "") if value is None else value).strip()
    if not v:
        return SERIAL_MACS
    try:
        n = float(v)
        bound = SERIAL_MACS if n == 1 else max(0, int(n))
    except (ValueError, OverflowError):
        raise ValueError(f"NETCL_CPU_SERIAL={v!r}: expected 0 (off), 1 (on, up to {SERIAL_MACS:.0e} "
                         "multiply-accumulates per call) or the largest call in multiply-accumulates "
                         "(e.g. 5e7)") from None
    return bound


def _ask_pocl_for_serial():
    """Set POCL_DEVICES for PoCL's first look (see the module's doc; _all_devices removes it again
    once PoCL has read it); True when this call set it."""
    if not _asked:
        _asked.append(True)
        try:
            on = serial_bound() > 0
        except ValueError:  # predict() reports it; the device list does not depend on it
            on = True
        if "POCL_DEVICES" not in os.environ and on:
            os.environ["POCL_DEVICES"] = _SERIAL_DEVICES
            _set_by_netcl.append(True)
            return True
    return False


# The probe: kernels built AND run, in a child process, on what netcl's CPU kernels lean on (float16
# vectors through the builtin library's fma, fmax and exp). PoCL 3.0 from PyPI (LLVM 14) on an AMD
# Zen 4 (family 25, model 0x11) compiles for "znver3" (no AVX-512) yet links its AVX-512 builtin
# library: a one-line kernel builds and runs, but LLVM aborts the whole process ("LLVM ERROR: Cannot
# select ... fma") at the first launch of such a kernel, so only another process can see it fail.
# Its verdict is kept on disk per device, PoCL and CPU (probe_path).
_PROBE_LINE = "__kernel void netcl_probe(__global float *a) { a[get_global_id(0)] *= 2.0f; }"
_PROBE = _PROBE_LINE + """
__kernel void netcl_probe16(__global float16 *a) {
    int i = get_global_id(0);
    a[i] = fmax(fma(a[i], a[i + 2], a[i + 4]), exp(a[i + 6]) - 1.0f);
}
"""
_PROBE_CHILD = """
import sys, warnings
try:
    import numpy as np
    import pyopencl as cl
except ImportError:  # another interpreter than the caller's (an embedded Python): the caller decides
    print("netcl-probe: cannot look"); sys.exit(0)
warnings.simplefilter("ignore")
pname, pversion, dname, source = sys.argv[1:5]
dev = next((d for p in cl.get_platforms() if p.name == pname and p.version == pversion
            for d in p.get_devices() if d.name == dname), None)
if dev is None:
    print("netcl-probe: device not found"); sys.exit(0)
ctx = cl.Context([dev]); q = cl.CommandQueue(ctx)
try:
    prog = cl.Program(ctx, source).build()
except cl.Error as e:
    print(str(e), file=sys.stderr); sys.exit(1)
if "netcl_probe16" not in [k.function_name for k in prog.all_kernels()]:
    print("error: the program built without its float16 kernel (the compiler dropped it)", file=sys.stderr)
    sys.exit(1)
a = np.linspace(-1.0, 1.0, 16 * 8, dtype=np.float32)
buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=a)
prog.netcl_probe16(q, (2,), None, buf)
out = np.empty_like(a); cl.enqueue_copy(q, out, buf); q.finish()
v = a.reshape(8, 16).astype(np.float64)
want = np.maximum(v[0:2] * v[2:4] + v[4:6], np.exp(v[6:8]) - 1.0)
if not np.allclose(out.reshape(8, 16)[:2], want, rtol=1e-5, atol=1e-6):
    print("error: float16 fma/fmax/exp gave wrong values", file=sys.stderr); sys.exit(1)
print("netcl-probe: ok")
"""
_PROBE_TIMEOUT_S = 300


def probe_path(device):
    """Where the probe's verdict on `device` is kept: in netcl's kernel cache, keyed by the probe,
    the device, its driver and platform, and the CPU (a home folder that moves to another machine
    probes again)."""
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:  # the first processor's identity and flags
            cpu = "".join(ln for ln in f.read().split("\n\n")[0].splitlines(True)
                          if ln.split(":")[0].strip() in ("vendor_id", "cpu family", "model", "flags"))
    except OSError:
        cpu = platform.processor()
    ident = "\0".join([_PROBE, _PROBE_CHILD, device.name, device.version, device.driver_version,
                       device.platform.name, device.platform.version, platform.machine(), cpu])
    return os.path.join(cache_dir(), "probe-" + hashlib.sha256(ident.encode()).hexdigest()[:40] + ".txt")


def _probe_in_child(device):
    """None where the probe builds and runs right on `device` in a child process, else the error's
    text (the child's own words, an LLVM abort's included); "" where the child could not look."""
    env = dict(os.environ)
    if _set_by_netcl:  # this process asked PoCL for its serial device: so does the child, to list the same
        env["POCL_DEVICES"] = _SERIAL_DEVICES
    argv = [sys.executable, "-c", _PROBE_CHILD, device.platform.name, device.platform.version, device.name, _PROBE]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        return f"the probe kernel did not finish within {_PROBE_TIMEOUT_S} s"
    except OSError:
        return ""  # no interpreter to start (an embedded Python): the in-process build decides
    if r.returncode == 0:
        return None if "netcl-probe: ok" in r.stdout else ""
    lines = [ln for ln in r.stderr.splitlines() if ln.strip() and "generated." not in ln]
    said = [ln for ln in lines if "error" in ln.lower()] or lines[-3:]
    if r.returncode > 0:
        how = f"exit status {r.returncode}"
    else:
        try:
            how = f"killed by {signal.Signals(-r.returncode).name}"
        except ValueError:
            how = f"killed by signal {-r.returncode}"
    return "\n".join([f"the probe kernels (float16 fma, fmax, exp) failed in a child process ({how})"] + said[:20])


def compile_error(device):
    """None where netcl's probe kernels build and run right on `device` (a pyopencl.Device), else the
    error's text. Probed in a child process (see _PROBE) once per device, its verdict kept on disk
    (a verdict file that is neither is probed again; no cache folder, no keeping); where no child
    can run, a one-line kernel built in this process decides."""
    key = device.int_ptr
    if key not in _probed:
        try:
            path = probe_path(device)
        except OSError:  # no cache folder to be made (a read-only home): probed, not kept
            path = None
        verdict = _read_verdict(path) if path else None
        if verdict is None:
            err = _probe_in_child(device)
            if err == "":
                err = _build_here(device)
            elif path:
                try:
                    with AtomicFile(path, "cache the device probe") as f:
                        f.write(("ok" if err is None else "error\n" + err).encode())
                except OSError:
                    pass  # the verdict is an optimisation only
            verdict = "ok" if err is None else "error\n" + err
        _probed[key] = None if verdict == "ok" else verdict.partition("\n")[2] or "the probe failed"
    return _probed[key]


def _read_verdict(path):
    """The probe's verdict kept at `path` ("ok" or "error\n<text>"), or None: not there, or damaged."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError):
        return None
    return text if text == "ok" or text.startswith("error\n") else None


def _build_here(device):
    """None where a one-line kernel builds on `device` in this process, else the error's text."""
    import warnings

    cl = _cl()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", cl.CompilerWarning)
            cl.Program(cl.Context([device]), _PROBE_LINE).build()
    except cl.Error as e:
        return str(e).strip() or type(e).__name__
    return None


def is_serial(device):
    """Whether `device` (a pyopencl.Device) is PoCL's serial CPU device (see the module's doc)."""
    return device.name.strip().startswith(SERIAL_PREFIXES) and _is_pocl(device.platform)


def _is_pocl(p):
    """Whether platform `p` (a pyopencl.Platform) is PoCL's (its vendor is "The pocl project")."""
    return "pocl" in p.name.lower() + p.vendor.lower()


def _all_devices():
    cl = _cl()
    asked = _ask_pocl_for_serial()
    out = []
    try:
        try:
            platforms = cl.get_platforms()
        except cl.Error as e:  # the ICD loader reports "no platforms" as an error
            raise NoDeviceError(f"no OpenCL platform found ({e}). " + _INSTALL_HINT) from e
        for p in platforms:
            try:
                out.extend((p, d) for d in p.get_devices())
            except cl.Error:
                continue  # a platform with no devices
    finally:
        if asked:  # PoCL has read it: gone again, so that child processes (another runtime measured
            os.environ.pop("POCL_DEVICES", None)  # beside netcl, say) see the environment they were given
    if not out:
        raise NoDeviceError("no OpenCL device found. " + _INSTALL_HINT)
    return out


def _type_name(d):
    cl = _cl()
    if d.type & cl.device_type.GPU:
        return "gpu"
    if d.type & cl.device_type.CPU:
        return "cpu"
    if d.type & cl.device_type.ACCELERATOR:
        return "accelerator"
    return "other"


def devices():
    """All OpenCL devices as DeviceInfo(platform, name, type, index)."""
    return [DeviceInfo(p.name.strip(), d.name.strip(), _type_name(d), i) for i, (p, d) in enumerate(_all_devices())]


def is_pocl_cpu(device):
    """Whether `device` is a CPU device of a PoCL platform (whose compiler the probe checks)."""
    return _type_name(device) == "cpu" and _is_pocl(device.platform)


def select_device(spec=None, probe=True):
    """The pyopencl.Device chosen by `spec` (default: $NETCL_DEVICE, else first GPU, else first CPU).
    A PoCL CPU device that fails netcl's probe (compile_error) is a NoDeviceError saying what to
    install, where its kernels would abort the process (probe=False: chosen all the same, as
    `netcl devices --check` lists them)."""
    spec = (spec if spec is not None else os.environ.get("NETCL_DEVICE", "")).strip()
    pairs = _all_devices()
    if spec and spec.lower() not in ("gpu", "cpu"):
        hits = [d for p, d in pairs if spec.lower() in f"{p.name} {d.name}".lower()]
    else:  # by type: never the serial device while its platform has the threaded one
        threaded = {p.int_ptr for p, d in pairs if not is_serial(d) and _type_name(d) == "cpu"}
        parallel = [(p, d) for p, d in pairs if not (is_serial(d) and p.int_ptr in threaded)]
        if spec:
            hits = [d for p, d in parallel if _type_name(d) == spec.lower()]
        else:
            hits = [d for p, d in parallel if _type_name(d) == "gpu"] or [d for p, d in parallel
                                                                          if _type_name(d) == "cpu"]
            hits = hits or [d for _, d in parallel]
    if len({d.platform.int_ptr for d in hits}) > 1:  # e.g. two PoCLs: the first that compiles (none:
        ok = next((d for d in hits if compile_error(d) is None), None)  # the first, whose error
        hits = [ok] if ok is not None else hits  # shows at its first kernel)
    if not hits:
        found = ", ".join(f"{d.name.strip()} ({p.name.strip()})" for p, d in pairs)
        raise NoDeviceError(f"NETCL_DEVICE={spec!r} matches no OpenCL device; expected 'gpu', 'cpu' or a "
                            f"substring of one of: {found}")
    chosen = hits[0]
    if probe and is_pocl_cpu(chosen):
        err = compile_error(chosen)
        if err is not None:
            from_hint = _hint(err) or " (`netcl devices --check` probes every device)"
            raise NoDeviceError(f"the OpenCL device {chosen.name.strip()} ({chosen.platform.version.strip()}) "
                                f"cannot run netcl's kernels: {err.splitlines()[0]}{from_hint}")
    return chosen
