"""Device selection, one context and queue per device, cached programs, pooled buffers, and the
counters that tell a steady training step (no buffers made, no programs built) from a first one."""
import os
import re
import threading
from collections.abc import Mapping
from contextlib import contextmanager

import numpy as np

from netcl.errors import CompileError
from netcl.runtime import program, sources, tiers
from netcl.runtime.device import SERIAL_MACS, DeviceInfo, devices, is_serial, select_device, serial_bound
from netcl.runtime.program import build, kernel_source

_queues = {}  # device -> CommandQueue
_contexts = {}  # device -> the Context of its queue, kept: Intel's OpenCL destroys a context with its last
#                 reference even while a queue on it lives (clRetainContext: INVALID_CONTEXT)
_chosen = {}  # device spec as given (None: $NETCL_DEVICE's value) -> CommandQueue
_device_locks = {}  # device (int_ptr) -> a Lock for PoCL's serial device, None for any other
_made = threading.Lock()  # held while a queue or lock above is made (two threads must not make two)
_serial = {}  # a threaded PoCL CPU device's queue (int_ptr) -> its platform's serial device's queue, or None
_pools = {}  # context -> MemoryPool
# (context, family, options) -> _Kernels; (context, source digest, kernel name, its options) -> Kernel
_kernels = {}
_dtypes = {}  # a kernel source's digest -> arg_dtypes of it
_key_locks = {}  # kernel key -> a Lock held while that kernel's program is built


def _lock_of(key):
    with _made:
        return _key_locks.setdefault(key, threading.Lock())
_arg_types = {}  # Kernel.int_ptr -> (the Kernel, its scalar argument dtypes): for copy_kernel()


def default_queue(spec=None):
    """The pyopencl.CommandQueue of the selected device (see select_device); one per device per process."""
    key = (spec, os.environ.get("NETCL_DEVICE", "")) if spec is None else (spec, None)
    q = _chosen.get(key)  # selecting walks every platform's devices: too slow for every predict() to ask
    if q is not None:
        return q
    q = _chosen[key] = _queue_of(select_device(spec))
    return q


def _queue_of(device):
    import pyopencl as cl

    q = _queues.get(device.int_ptr)
    if q is None:
        with _made:
            q = _queues.get(device.int_ptr)
            if q is None:
                ctx = _contexts[device.int_ptr] = cl.Context([device])
                q = _queues[device.int_ptr] = cl.CommandQueue(ctx)
    return q


def serial_lock(queue):
    """The lock every use of PoCL's serial device through netcl's inference path takes (one per
    device, whatever the queue), or None for other devices: PoCL 3's serial driver deadlocks when two
    threads' commands meet in it (a command's completion runs the next one, which the other thread
    holds), so predict() and model(Tensor) in eval mode take turns there. Re-entrant: a layer the
    fused path does not fuse may call another eval model inside the turn."""
    dev = queue.device
    lock = _device_locks.get(dev.int_ptr, False)
    if lock is False:
        with _made:
            lock = _device_locks.setdefault(dev.int_ptr, threading.RLock() if is_serial(dev) else None)
    return lock


def _twin(queue):
    """The serial device's queue next to `queue`'s device, or None; cached per queue."""
    key = queue.int_ptr
    if key not in _serial:
        import pyopencl as cl

        dev, twin = queue.device, None
        if dev.type & cl.device_type.CPU and not is_serial(dev):
            twin = next((d for d in dev.platform.get_devices() if is_serial(d)), None)
        _serial[key] = _queue_of(twin) if twin is not None else None
    return _serial[key]


def serial_route(queue):
    """(serial queue, the largest call in multiply-accumulates it takes) for predict() on `queue`, or
    None: PoCL's serial CPU device (netcl.runtime.device: it runs each kernel in the thread that
    enqueues it) when `queue` is on the same PoCL platform's threaded CPU device (not for GPUs, other
    OpenCL CPUs, PoCL without it, or NETCL_CPU_SERIAL=0). Calls there take turns: serial_lock.
    $NETCL_CPU_SERIAL is read per call (one read; device.serial_bound)."""
    twin = _twin(queue)
    if twin is None:
        return None
    limit = serial_bound()
    return (twin, limit) if limit else None


def serial_queue(queue):
    """The queue of PoCL's serial CPU device next to `queue`'s (see serial_route), or None."""
    route = serial_route(queue)
    return None if route is None else route[0]


def device_class(queue):
    """'gpu' or 'cpu': picks launch sizes and kernel variants."""
    import pyopencl as cl

    return "gpu" if queue.device.type & cl.device_type.GPU else "cpu"


_LANES = (4, 8, 16)


def lanes_override():
    """$NETCL_FLOAT_LANES as an int (4, 8 or 16), or None where unset: another float vector width for
    netcl's CPU kernels than the device's (float_lanes). With PoCL generating that instruction set's
    code (POCL_KERNELLIB_NAME=avx2), an AVX-512 machine runs what an AVX2 one would (the benchmark
    tools' --isa avx2)."""
    text = os.environ.get("NETCL_FLOAT_LANES", "").strip()
    if not text:
        return None
    if text not in {str(n) for n in _LANES}:
        raise ValueError(f"NETCL_FLOAT_LANES must be one of {', '.join(map(str, _LANES))} (float vector width), "
                         f"got {text!r}")
    return int(text)


_ATOMICS = {}  # device int_ptr -> acq_rel_atomics' answer


def acq_rel_atomics(device):
    """The -cl-std option ("CL2.0" or "CL3.0") under which the device's OpenCL C has atomics with
    acquire-release order at device scope (every 2.x device; a 3.0 device that names both features),
    or None: then one work-group's writes are ordered before another's reads only by a new launch."""
    known = _ATOMICS.get(device.int_ptr, False)
    if known is not False:
        return known
    version, std = device.version.split()[1] if device.version.startswith("OpenCL ") else "1.2", None
    if version.startswith("2."):
        std = "CL2.0"
    elif version >= "3.0":
        try:
            names = {f.name for f in device.opencl_c_features}
        except Exception:  # noqa: BLE001 - a pyopencl or driver without the query: assume the minimum
            names = set()
        if {"__opencl_c_atomic_order_acq_rel", "__opencl_c_atomic_scope_device"} <= names:
            std = "CL3.0"
    _ATOMICS[device.int_ptr] = std
    return std


def float_lanes(device):
    """The float vector width netcl's CPU kernels size their vectors and register blocks by:
    lanes_override()'s, else device_lanes(device)."""
    return lanes_override() or device_lanes(device)


def device_lanes(device):
    """What the device can do: its preferred float vector width where that is a width netcl's CPU
    kernels have (4, 8, 16: PoCL's 16 on AVX-512, 8 on AVX2), else its native one (Intel's CPU
    runtime prefers 1 and is native 16 on AVX-512, where netcl's 16-lane kernels are the fast ones),
    else, for a CPU, the host's instruction set (host_lanes)."""
    for width in (device.preferred_vector_width_float, device.native_vector_width_float):
        if width in _LANES:
            return width
    import pyopencl as cl

    return host_lanes() if device.type & cl.device_type.CPU else _LANES[0]


def host_lanes(cpuinfo="/proc/cpuinfo"):
    """This machine's float vector width by its CPU's flags: 16 with AVX-512F, 8 with AVX, else 4."""
    try:
        with open(cpuinfo) as f:
            flags = next((ln.split(":", 1)[1].split() for ln in f if ln.startswith("flags")), [])
    except OSError:
        flags = []
    return 16 if "avx512f" in flags else 8 if "avx" in flags else 4


_SIGNATURE = re.compile(r"__kernel\b(?:\s*__attribute__\s*\(\(.*?\)\))?\s*void\s+(\w+)\s*\(([^)]*)\)", re.S)
_SCALARS = {"int": np.int32, "uint": np.uint32, "float": np.float32}


def arg_dtypes(source):
    """{kernel name: the numpy dtype of each scalar argument, None for a buffer}, read from the
    kernels' signatures in `source`."""
    out = {}
    for name, params in _SIGNATURE.findall(source):
        types = []
        for p in params.split(","):
            words = p.replace("const ", " ").split()
            types.append(None if "*" in p else _scalar_type(words[-2]))
        out[name] = types
    return out


def _scalar_type(name):
    """The numpy dtype of a kernel's scalar argument type: int, uint, float, or a vector int8 (index
    vectors of tensor.cl)."""
    if name == "int8":
        import pyopencl.cltypes as cltypes

        return cltypes.int8
    return _SCALARS[name]


class _Kernels(Mapping):
    """kernels()' answer: its family's kernels by name, each built on first use as a program of its
    own, with the options that can change it (netcl.runtime.sources): a new option set builds only
    what runs, and a kernel no option of the set reaches is the one already built. A missing name
    is a CompileError that says where it was looked for (PoCL 3.0 on a Zen 4 "builds" programs
    without their kernels: see netcl.runtime.device)."""

    def __init__(self, context, family, options, device_name):
        source = kernel_source(family)  # (looked up here: tools/ab_kernels.py patches it)
        self.context, self.family, self.options, self.split = context, family, options, sources.split(source)
        self.what = f"{family}.cl built with {' '.join(options) or 'no options'} on {device_name}"
        self._built = {}

    def __getitem__(self, name):
        k = self._built.get(name)
        if k is None and _collecting:  # (a build helper's dry run: which kernels, in which order)
            _collecting[-1].append((self.family, name, self.options))
            return None
        if k is None:
            try:
                k = self._built[name] = self._kernel(name)
            except program.Claimed:  # (a build helper's dry run: another process builds it)
                return None
        return k

    def ready(self, name):
        """Whether kernel `name` is built, or its program's binary is in the disk cache."""
        if name in self._built:
            return True
        if name not in self.split.kernels:
            return False
        options = self.split.options_for(name, self.options)
        if (self.context, self.split.digest, name, options) in _kernels:
            return True
        return program.cached(self.context, self.split.program_source(name), options)

    def __iter__(self):
        return iter(self.split.names())

    def __len__(self):
        return len(self.split.names())

    def _kernel(self, name):
        if name not in self.split.kernels:
            raise CompileError(f"no kernel {name!r} in {self.what}")
        options = self.split.options_for(name, self.options)
        key = (self.context, self.split.digest, name, options)
        k = _kernels.get(key)
        if k is not None:
            return k
        with _lock_of(key):  # one build of a program at a time; others go on (the tiers' thread builds here too)
            k = _kernels.get(key)
            if k is not None:
                return k
            what = f"{self.family}.cl {name}" + (f" ({' '.join(options)})" if options else "")
            prog = build(self.context, self.split.program_source(name), options, family=self.family, what=what)
            k = next((k for k in prog.all_kernels() if k.function_name == name), None)
            if k is None:
                raise CompileError(f"no kernel {name!r} in {self.what}: the compiler dropped it, or a -D option "
                                   "leaves it out; `netcl devices --check` tests the device")
            dtypes = _dtypes.get(self.split.digest)
            if dtypes is None:
                dtypes = _dtypes[self.split.digest] = arg_dtypes(self.split.source)
            dtypes = dtypes[name]
            k.set_scalar_arg_dtypes(dtypes)
            _arg_types[k.int_ptr] = (k, dtypes)
            _kernels[key] = k
            return k


def kernels(queue, family, options=()):
    """Kernels of netcl/kernels/<family>.cl for the queue's context, by name, built with `options`
    as each is first asked for (_Kernels; cached). Their scalar argument types are declared from
    the source, so set_args packs them without inspecting each value (which cost most of a
    launch's host time on NVIDIA's OpenCL)."""
    key = (queue.context, family, tuple(options))
    ks = _kernels.get(key)
    if ks is None:
        ks = _kernels[key] = _Kernels(queue.context, family, tuple(options), queue.device.name.strip())
    return ks


tiers.builder = lambda queue, family, name, options: kernels(queue, family, options)[name]
_collecting = []  # collecting()'s lists


@contextmanager
def collecting(into):
    """While the block runs, a kernel not built yet is not built: (family, kernel, options) is
    appended to the list `into` and kernels()[name] gives None (a build helper's dry run walks a
    step this way first, then builds what it found: netcl.buildhelper)."""
    _collecting.append(into)
    try:
        yield into
    finally:
        _collecting.pop()


def kernels_ready(queue, triples):
    """Whether every (family, kernel, options) of `triples` is built for the queue's context or its
    program's binary is in the disk cache (netcl.runtime.tiers: a route whose kernels are not runs
    its generic tier meanwhile)."""
    return all(kernels(queue, family, options).ready(name) for family, name, options in triples)


def kernel_arg_types(k):
    """kernels()' kernel k's scalar argument dtypes (None for a buffer), by argument index."""
    return _arg_types[k.int_ptr][1]


def copy_kernel(k):
    """A new Kernel object for kernels()' kernel `k` (same program and argument types), whose
    arguments are its own: a recorded launch keeps them set (see Recorder)."""
    import pyopencl as cl

    own, dtypes = _arg_types[k.int_ptr]
    assert own is k, "copy_kernel takes a kernel from kernels()"
    c = cl.Kernel(k.program, k.function_name)
    c.set_scalar_arg_dtypes(dtypes)
    return c


class Recorder:
    """The device commands one thread enqueues between start() and stop(): kernel launches (with
    their arguments as set), buffer fills and device copies, in order. A host transfer among them
    (an upload or a read) cannot be replayed: it is noted in `refused` instead. `allocated` holds
    the buffers alloc() and buffer() made meanwhile (int_ptr): any other buffer a command names
    held its data before the recording. netcl.trainstep records training steps with it."""

    def __init__(self):
        self.commands, self.refused, self.allocated, self.generation = [], None, set(), None
        self.varying = {}  # command index -> (argument indices, fn): see vary()

    def launch(self, k, gsize, lsize, args):
        """Record a kernel launch: kernel, global and local sizes, its arguments as set."""
        self.commands.append(("launch", k, tuple(gsize), tuple(lsize), tuple(args)))

    def fill(self, buf, value, nbytes):
        """Record a fill of `nbytes` of `buf` with `value` (a float, or a numpy float32 or int32: the
        4-byte pattern)."""
        pattern = value if isinstance(value, (np.float32, np.int32)) else np.float32(value)
        self.commands.append(("fill", buf, pattern, int(nbytes)))

    def copy(self, dst, src, nbytes):
        """Record a device-to-device copy of `nbytes`."""
        self.commands.append(("copy", dst, src, int(nbytes)))

    def vary(self, indices, fn):
        """The launch recorded last takes, at `indices`, arguments that change every step (a
        dropout seed, Adam's bias corrections): fn() gives their values for a replay, in order."""
        self.varying[len(self.commands) - 1] = (tuple(indices), fn)

    def refuse(self, what):
        """Note a command that cannot be replayed (a host transfer): the first such stays in `refused`."""
        if self.refused is None:
            self.refused = what

    def start(self):
        """Record this thread's device commands from now on (RuntimeError if it already records)."""
        if _recording.recorder is not None:
            raise RuntimeError("this thread is already recording device commands")
        self.generation = tiers.generation()  # the kernel tiers the recorded layers chose from
        _recording.recorder = self
        return self

    def stop(self):
        """Stop recording this thread's commands; returns the recorder."""
        _recording.recorder = None
        return self


class _Recording(threading.local):
    recorder = None  # a class default: reading it on a thread that never recorded costs no getattr fallback


_recording = _Recording()


def recorder():
    """The Recorder this thread is recording into, or None (nearly always)."""
    return _recording.recorder


_allocations = [0]  # device buffers created: pool misses of alloc() and buffer() calls


def context_of(queue):
    """queue.context, or a ValueError saying what to do where the context is gone: Intel's OpenCL
    destroys a context with its last reference, queues on it or not, so a queue made as
    cl.CommandQueue(cl.Context([dev])) has none left there."""
    import pyopencl as cl

    try:
        return queue.context
    except cl.LogicError as e:
        raise ValueError(f"the queue's OpenCL context is gone ({e}): this OpenCL implementation destroyed it "
                         "with its last reference; keep the pyopencl.Context the queue was made with "
                         "(ctx = cl.Context([device]); q = cl.CommandQueue(ctx)), or use netcl.default_queue()"
                         ) from e


def exact_buffers():
    """$NETCL_EXACT_BUFFERS=1: alloc() makes every buffer at its exact size, unpooled (the pool rounds
    sizes up to its bins, where a kernel reading or writing past its tensor goes unseen), so that a
    checker such as Oclgrind reports any access past a tensor's end. Read per call."""
    return os.environ.get("NETCL_EXACT_BUFFERS", "") == "1"


def alloc(queue, nbytes):
    """A device buffer of `nbytes` from the context's pool; it returns to the pool when dropped
    (exact_buffers(): a buffer of its own of exactly `nbytes`, at least 4)."""
    import pyopencl as cl
    import pyopencl.tools as clt

    ctx = context_of(queue)
    if exact_buffers():
        buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, max(int(nbytes), 4))
        _allocations[0] += 1
        if _recording.recorder is not None:
            _recording.recorder.allocated.add(buf.int_ptr)
        return buf
    pool = _pools.get(ctx)
    if pool is None:
        pool = _pools[ctx] = clt.MemoryPool(clt.ImmediateAllocator(queue))
    blocks = pool.active_blocks + pool.held_blocks
    buf = pool.allocate(max(int(nbytes), 4))
    if pool.active_blocks + pool.held_blocks != blocks:  # a hit moves a held block to active
        _allocations[0] += 1
    if _recording.recorder is not None:
        _recording.recorder.allocated.add(buf.int_ptr)
    return buf


def buffer(queue, nbytes):
    """A device buffer of its own (not pooled, so sub-buffers can be made of it), zero-filled."""
    import pyopencl as cl

    nbytes = max(int(nbytes), 4)
    buf = cl.Buffer(context_of(queue), cl.mem_flags.READ_WRITE, nbytes)
    _allocations[0] += 1
    cl.enqueue_fill_buffer(queue, buf, np.float32(0), 0, nbytes)
    if _recording.recorder is not None:
        _recording.recorder.allocated.add(buf.int_ptr)
        _recording.recorder.fill(buf, 0.0, nbytes)
    return buf


def stats():
    """This process's counts so far: {"allocations": device buffers created by netcl's training path
    (pool misses and buffer()), "builds": OpenCL programs built, compiled or loaded from the disk
    cache}. A copy; compare two calls: after a shape's first training step both stay put."""
    return {"allocations": _allocations[0], "builds": program.stats["compiled"] + program.stats["disk"]}


__all__ = ["DeviceInfo", "devices", "select_device", "default_queue", "serial_queue", "serial_route", "serial_lock",
           "serial_bound", "SERIAL_MACS", "device_class", "acq_rel_atomics", "float_lanes", "device_lanes",
           "lanes_override", "kernels", "kernels_ready", "tiers", "alloc", "buffer", "stats", "build", "kernel_source"]
