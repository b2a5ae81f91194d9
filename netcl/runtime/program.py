"""Program builds: once per context in memory, and across processes on disk.

The disk cache is keyed by source, build options, device, driver and platform version, and
stores the device binary; a second process loads it instead of recompiling. Each entry is
`magic, u64 length, SHA-256 of the binary` then the binary, written atomically and synced
(AtomicFile): a truncated or damaged entry (a crash, a full disk, a bad sector) is detected,
rebuilt from source and rewritten, and never handed to the driver, which may crash on it. A PoCL
binary holds each kernel's compiled work-group functions (keeps_binaries), so a program holds one
kernel: netcl.runtime.sources.
"""
import hashlib
import os
import re
import struct
import threading
import time
import warnings
from contextlib import contextmanager
from importlib import resources

from netcl.errors import CompileError
from netcl.io.atomic import AtomicFile
from netcl.runtime import buildlog

_memory = {}  # (context, key) -> pyopencl.Program
# where this process's builds came from (tests read it), and the seconds compiling took
stats = {"memory": 0, "disk": 0, "compiled": 0, "damaged": 0, "seconds": 0.0, "waited": 0.0}
_ENTRY = struct.Struct("<8sQ32s")  # magic, binary length, SHA-256 of the binary
_MAGIC = b"NETCLBIN"


def cache_dir():
    """The folder of the disk cache of built programs: $NETCL_CACHE_DIR, else
    $XDG_CACHE_HOME/netcl/kernels or ~/.cache/netcl/kernels (made if missing)."""
    d = os.environ.get("NETCL_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "netcl", "kernels")
    os.makedirs(d, exist_ok=True)
    return d


_INCLUDE = re.compile(r'^#include "([A-Za-z0-9_]+\.h)"[ \t]*$', re.M)


def kernel_source(family):
    """The text of netcl/kernels/<family>.cl, its `#include "x.h"` lines replaced by the headers
    beside it (so the cache key covers the headers, and no -I path reaches the compiler)."""
    return with_headers(resources.files("netcl.kernels").joinpath(f"{family}.cl").read_text())


def with_headers(text):
    """Kernel source `text` with its `#include "x.h"` lines replaced by netcl/kernels' headers (a
    family's own file, or a patched copy of one: tools/ab_kernels.py)."""
    folder = resources.files("netcl.kernels")
    return _INCLUDE.sub(lambda m: folder.joinpath(m[1]).read_text(), text)


def _key(source, options, device):
    # (what a PoCL binary's work-group functions are specialised to is part of what it is: POCL_SPECIALISE)
    ident = "\0".join([source, " ".join(options), device.name, device.driver_version,
                       device.platform.version, device.platform.name, POCL_SPECIALISE])
    return hashlib.sha256(ident.encode()).hexdigest()


_UNKNOWN_CPU_HINT = (
    " (this PoCL's LLVM does not know the CPU, so no kernel builds on it: PoCL 3.0 from PyPI, LLVM 14, "
    "predates AMD Zen 5, for one. Install a newer PoCL beside it, e.g. Debian's `apt-get install "
    "pocl-opencl-icd`, which netcl then selects; `netcl devices --check` shows which devices build)")


_PROBE_HINT = (
    " (this PoCL cannot compile netcl's float16 vector code for this CPU: PoCL 3.0 from PyPI, LLVM 14, "
    "on an AMD Zen 4 compiles for Zen 3 but links AVX-512 builtins, and LLVM aborts. Install a newer "
    "PoCL beside it, e.g. Debian's `apt-get install pocl-opencl-icd` (`make system-pocl`), which netcl "
    "then selects; `netcl devices --check` shows which devices build)")


def _hint(log):
    """What to do about a build failure whose cause is the installation, not the kernel."""
    if "unknown target CPU" in log:
        return _UNKNOWN_CPU_HINT
    return _PROBE_HINT if "the probe kernels" in log else ""


# The work-group function a PoCL binary also holds, specialised (PoCL's cache-folder name: local size,
# global offset zero, grid of 32-bit sizes) for the launches of netcl's CPU kernels: a work-item a
# work-group. PoCL compiles a generic one into every binary; launches run a specialised one, which
# is faster (tuning.json's note on POCL_SPECIALISE), and compile it at first use unless the binary
# holds it.
POCL_SPECIALISE = "1-1-1-goffs0-smallgrid"


def keeps_binaries(device):
    """Whether netcl's disk cache keeps `device`'s program binaries: yes, unless NETCL_BINARY_CACHE=0
    (1 keeps them as well). On PoCL asking for a program's binary compiles each of its kernels'
    work-group functions (hence a program per kernel: netcl.runtime.sources), the one its
    launches run included (POCL_SPECIALISE): a later process compiles nothing."""
    return os.environ.get("NETCL_BINARY_CACHE", "").strip() != "0"


def build(context, source, options=(), family=None, what=None):
    """Build `source` for the (single) device of `context`, using the caches. `family` (the kernel
    file's name) and `what` (the kernel and options) name the build in the lines buildlog writes
    while builds take a while; the compiler's output goes to DEBUG records, and a failed build
    raises CompileError carrying the whole log (what PoCL wrote to stderr included)."""
    device = context.devices[0]
    options = tuple(options)
    key = _key(source, options, device)
    prog = _memory.get((context, key))
    if prog is not None:
        stats["memory"] += 1
        return prog
    buildlog.touch()  # (the tiers' thread waits while the foreground makes programs)
    keep = keeps_binaries(device)
    path = os.path.join(cache_dir(), key + ".bin") if keep else None
    prog = _load(context, device, path, options) if keep else None
    claimed = False
    if prog is None and keep:
        claimed = _claim(path)
        if not claimed and dry:
            raise Claimed(path)
        if not claimed:  # another process builds it now (a build helper: netcl.buildhelper): its binary
            prog = _await(context, device, path, options)
    if prog is None:
        for hook in list(on_compile):
            hook()
        try:
            prog = _compile(context, device, source, options, family or "an OpenCL program", what or family or "",
                            path)
        finally:
            if claimed:
                _unclaim(path)
    _memory[(context, key)] = prog
    return prog


CLAIM_WAIT_S = 300  # the longest a build waits for another process's build of the same program
on_compile = []  # callables run before this process compiles a program (netcl.buildhelper's)
dry = False  # a build helper's process: a program another process is building is skipped (Claimed)


class Claimed(Exception):
    """(A build helper's, dry) another process is building this program now."""


def _claim(path):
    """Whether this process may build the program cached at `path`: no other live process builds it
    now (`path`.claim, holding the builder's PID, linked into place whole; a dead builder's is
    taken over)."""
    mine = f"{path}.{os.getpid()}.claiming"
    try:
        with open(mine, "w") as f:
            f.write(str(os.getpid()))
    except OSError:
        return True  # no claims here (a read-only cache): build
    try:
        for _ in range(2):
            try:
                os.link(mine, path + ".claim")
                return True
            except FileExistsError:
                owner = _claimant(path)
                if owner is not None and owner != os.getpid() and _alive(owner):
                    return False
                try:
                    os.unlink(path + ".claim")  # its builder died (or it is this process's own, left over)
                except OSError:
                    pass
            except OSError:
                return True
        return True
    finally:
        try:
            os.unlink(mine)
        except OSError:
            pass


def _unclaim(path):
    try:
        if _claimant(path) == os.getpid():
            os.unlink(path + ".claim")
    except OSError:
        pass


def _claimant(path):
    try:
        with open(path + ".claim") as f:
            return int(f.read().strip() or 0) or None
    except (OSError, ValueError):
        return None


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # (another user's process)
    return True


def _await(context, device, path, options):
    """The program another process is building into `path`, loaded once its binary is there; None
    (this process builds it) where that process gives up, dies, or takes past CLAIM_WAIT_S."""
    start = time.monotonic()
    try:
        while time.monotonic() < start + CLAIM_WAIT_S:
            if os.path.exists(path):
                return _load(context, device, path, options)
            owner = _claimant(path)
            if owner is None or not _alive(owner):
                return _load(context, device, path, options) if os.path.exists(path) else None
            time.sleep(0.01)
        return None
    finally:
        stats["waited"] += time.monotonic() - start


def cached(context, source, options=()):
    """Whether build(context, source, options) is answered without compiling: built in this
    process, or a binary of it in netcl's disk cache (where it keeps binaries)."""
    device = context.devices[0]
    key = _key(source, tuple(options), device)
    if (context, key) in _memory:
        return True
    return keeps_binaries(device) and os.path.exists(os.path.join(cache_dir(), key + ".bin"))


def _load(context, device, path, options):
    """The program of cache entry `path`, or None (no whole entry, or a binary the driver refuses)."""
    import pyopencl as cl

    binary = _read_entry(path)
    if binary is None:
        return None
    try:
        with warnings.catch_warnings():  # PoCL's build chatter is not for users
            warnings.simplefilter("ignore", cl.CompilerWarning)
            prog = cl.Program(context, [device], [binary]).build(options=list(options))
    except cl.Error:
        return None  # a binary this driver refuses: rebuilt from source
    stats["disk"] += 1
    return prog


def _compile(context, device, source, options, family, what, path):
    """Build `source` from scratch (and keep its binary at `path` unless None: on PoCL, asking for
    it is when each kernel's work-group function compiles, so it counts as the build's time)."""
    import pyopencl as cl

    captured, name = [], device.name.strip()
    with buildlog.building(family, what, name):
        t = time.perf_counter()
        try:  # cache_dir=False: this module's cache is the one cache
            with warnings.catch_warnings(), buildlog.quiet_stderr(captured):
                warnings.simplefilter("ignore", cl.CompilerWarning)
                prog = cl.Program(context, source).build(options=list(options), cache_dir=False)
                if path is not None:
                    _store(prog, path)
        except cl.RuntimeError as e:  # pyopencl's message carries the compiler's log
            log = "\n".join(text.strip() for text in [str(e)] + captured if text.strip())
            raise CompileError(f"OpenCL build failed on {name}{_hint(log)}", log) from None
        finally:
            stats["seconds"] += time.perf_counter() - t
    stats["compiled"] += 1
    try:
        said = prog.get_build_info(device, cl.program_build_info.LOG) or ""
    except cl.Error:
        said = ""
    chatter = "\n".join(text.strip() for text in captured + [said] if text.strip())
    if chatter:
        buildlog.log.debug("compiler output building %s:\n%s", what, chatter)
    return prog


def _store(prog, path):
    """Keep `prog`'s binary at `path` (an optimisation only: nothing is kept where that fails)."""
    import pyopencl as cl

    try:
        with _specialising(prog.devices[0]):
            binary = prog.get_info(cl.program_info.BINARIES)[0]
        if binary:
            with AtomicFile(path, "cache a kernel") as f:  # synced, then renamed: whole or absent
                f.write(_ENTRY.pack(_MAGIC, len(binary), hashlib.sha256(binary).digest()) + binary)
    except (cl.Error, OSError):
        pass


_specialisers = [0, threading.Lock()]  # binaries being made under _specialising, and its lock


@contextmanager
def _specialising(device):
    """PoCL's POCL_BINARY_SPECIALIZE_WG while binaries are made (POCL_SPECIALISE), unless the user set it."""
    pocl = "pocl" in (device.platform.name + device.platform.vendor).lower()
    with _specialisers[1]:
        if not pocl or (_specialisers[0] == 0 and "POCL_BINARY_SPECIALIZE_WG" in os.environ):
            mine = False
        else:
            mine = True
            _specialisers[0] += 1
            os.environ["POCL_BINARY_SPECIALIZE_WG"] = POCL_SPECIALISE
    try:
        yield
    finally:
        if mine:
            with _specialisers[1]:
                _specialisers[0] -= 1
                if _specialisers[0] == 0:
                    os.environ.pop("POCL_BINARY_SPECIALIZE_WG", None)


def _read_entry(path):
    """The binary of cache entry `path` if it is whole (its length and checksum agree), else None;
    a damaged entry counts in stats["damaged"] and is rewritten by the rebuild."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None  # not cached yet
    binary = data[_ENTRY.size:]
    if len(data) >= _ENTRY.size and _ENTRY.unpack_from(data) == (_MAGIC, len(binary), hashlib.sha256(binary).digest()):
        return binary
    stats["damaged"] += 1
    return None
