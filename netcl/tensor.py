"""Tensor: float32 storage on the host, on an OpenCL device, or both.

A tensor made without a queue lives on the host only (parameters of a model that is built,
loaded or exported where pyopencl is absent); it moves to a device on first use. Views made by
`reshape` share their storage: a write through any of them is seen by all. The storage's
`version` counts writes, so that derived data (fused inference weights) can tell when it is stale.
"""
import math
import threading

import numpy as np

from netcl.runtime import alloc, recorder


def _as_float32(x):
    if isinstance(x, Tensor):
        return x.to_host()
    if type(x) is np.ndarray and x.dtype == np.float32 and x.flags.c_contiguous:
        return x  # the common case, without the dtype checks below (predict()'s per-call cost)
    try:
        a = np.asarray(x)
        # real numbers only: complex would silently lose its imaginary part
        if a.dtype.kind not in "iubfm":  # (timedelta64 counts as an integer, as np.issubdtype says)
            raise TypeError
        return np.asarray(a, dtype=np.float32, order="C")
    except (TypeError, ValueError):
        raise TypeError(f"Tensor data must be an array-like of numbers convertible to float32, "
                        f"got {type(x).__name__}") from None


# PoCL's CPU devices return from a non-blocking write of host memory only once every command
# queued before it has run (a write behind a 25 ms kernel returned after 25 ms): a training step's
# labels, uploaded after the forward was queued, held the host until the forward was done, and
# the device then waited for the loss kernels. Up to _STAGED bytes go to a PoCL CPU device through
# a staging buffer on host memory of netcl's (USE_HOST_PTR, which PoCL's CPU drivers read in place;
# written on the host only once its last copy has run) and a device-side copy, queued at once. At
# most _SLOTS staging buffers per context: a training loop's uploads find theirs done (no
# allocation per step); with all of them busy an upload writes as before.
_STAGED, _SLOTS = 1 << 20, 4
_stages = {}  # context pointer -> (the context, kept alive with its buffers: its pointer is not reused,
#                                  [[host array, buffer, event of its last copy or None], ...] or None)
_stage_lock = threading.Lock()


def _stages_on(queue):
    """The staging slots of queue's context, or None where it is not a PoCL CPU device."""
    import pyopencl as cl

    entry = _stages.get(queue.context.int_ptr)
    if entry is None:
        d = queue.device
        pocl_cpu = bool(d.type & cl.device_type.CPU) and "portable computing language" in d.platform.name.lower()
        entry = _stages[queue.context.int_ptr] = (queue.context, [] if pocl_cpu else None)
    return entry[1]


def _upload(queue, buf, host):
    """Queue the copy of host array `host` into device buffer `buf` without waiting for the queue."""
    import pyopencl as cl

    rec = recorder()
    if rec is not None:
        rec.refuse("an upload from the host")
    slots = _stages_on(queue) if host.nbytes <= _STAGED else None
    if slots is not None:
        done = cl.command_execution_status.COMPLETE
        with _stage_lock:
            slot = next((s for s in slots if s[0].nbytes >= host.nbytes and
                         (s[2] is None or s[2].command_execution_status == done)), None)
            if slot is None and len(slots) < _SLOTS:
                size = 1 << max(8, (host.nbytes - 1).bit_length())  # bytes, a power of two
                staging = np.empty(size // 4, np.float32)
                slot = [staging, cl.Buffer(queue.context, cl.mem_flags.READ_ONLY | cl.mem_flags.USE_HOST_PTR,
                                           hostbuf=staging), None]
                slots.append(slot)
            if slot is not None:
                slot[0][:host.size] = host
                slot[2] = cl.enqueue_copy(queue, buf, slot[1], byte_count=host.nbytes)
                return
    cl.enqueue_copy(queue, buf, host, is_blocking=False)


class _Storage:
    """What views of one tensor share: the queue, the device buffer, the host copy (flat), the write count.
    `host` is None when the device holds newer data; `buf` is None for a host-only tensor; `base` is
    the buffer that `buf` is a sub-buffer of (kept alive with it), else None."""

    __slots__ = ("queue", "buf", "host", "version", "base", "__weakref__")

    def __init__(self, queue, buf, host):
        self.queue, self.buf, self.host, self.version, self.base = queue, buf, host, 0, None


class Tensor:
    """A float32 array. `queue` is None for a host-only tensor. `grad_home`, set by an optimizer on
    its parameters, is where ops.grad_target puts the next gradient (see netcl.optim)."""

    __slots__ = ("shape", "_st", "grad", "grad_home", "__weakref__")

    def __init__(self, shape, queue=None, buf=None, host=None):
        self.shape = tuple(int(s) for s in shape)
        if host is not None:
            host = np.asarray(host, np.float32).reshape(-1)
            if host.size != self.size:
                raise ValueError(f"host data has {host.size} elements, shape {self.shape} needs {self.size}")
        self._st = _Storage(queue, buf, host)
        self.grad = self.grad_home = None

    # -- construction ------------------------------------------------------------------
    @classmethod
    def from_host(cls, queue, x):
        """Copy array-like `x` (as float32) to the device of `queue` (None: keep it on the host)."""
        a = _as_float32(x)
        t = cls(a.shape, None, None, a.copy() if (a is x or a.base is not None) else a)
        return t.to(queue) if queue is not None else t

    @classmethod
    def empty(cls, queue, shape):
        t = cls(shape, queue)
        t._st.buf = alloc(queue, t.nbytes)
        return t

    @classmethod
    def zeros(cls, queue, shape):
        t = cls.empty(queue, shape)
        t.fill_(0.0)
        return t

    @classmethod
    def region(cls, queue, parent, offset, shape):
        """An uninitialised tensor stored in bytes [offset, offset + its size) of device buffer
        `parent` (a sub-buffer: offset a multiple of the device's base address alignment)."""
        t = cls(shape, queue)
        t._st.buf, t._st.base = parent.get_sub_region(offset, max(t.nbytes, 4)), parent
        return t

    # -- properties --------------------------------------------------------------------
    @property
    def queue(self):
        return self._st.queue

    @property
    def version(self):
        return self._st.version

    @property
    def size(self):
        return math.prod(self.shape)  # shape holds Python ints; np.prod costs ~4 us per call

    @property
    def nbytes(self):
        return 4 * self.size

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def storage(self):
        """What this tensor's views share (compare with `is`: one storage, one set of data)."""
        return self._st

    @property
    def on_device(self):
        return self._st.buf is not None

    @property
    def buf(self):
        """The device buffer (the tensor must be on a device: see `to`)."""
        if self._st.buf is None:
            raise ValueError("tensor is on the host only; call .to(queue) first")
        return self._st.buf

    def __repr__(self):
        where = "host" if self.queue is None else self.queue.device.name.strip()
        return f"Tensor(shape={self.shape}, on={where})"

    # -- movement ----------------------------------------------------------------------
    def to(self, queue):
        """Make the data present on `queue`'s device (uploading host data once); returns self."""
        import pyopencl as cl

        if not isinstance(queue, cl.CommandQueue):
            raise TypeError(f"expected a pyopencl.CommandQueue (netcl.default_queue()), got {type(queue).__name__}")
        st = self._st
        if st.buf is not None and st.queue is not None and st.queue.context == queue.context:
            st.queue = queue
            return self
        host = self.numpy().reshape(-1) if st.buf is not None else st.host
        st.queue, st.buf, st.base = queue, alloc(queue, self.nbytes), None
        if host is not None and host.size:
            _upload(queue, st.buf, host)
        st.host = host  # still valid; the upload may still be reading it
        return self

    def to_host(self):
        """A float32 numpy copy of the data."""
        return self.numpy().copy()

    def numpy(self):
        """The data on the host (read from the device once, then cached); do not modify it."""
        st = self._st
        if st.host is None:
            import pyopencl as cl

            a = np.empty(self.size, np.float32)
            rec = recorder()
            if rec is not None:
                rec.refuse("a read to the host")
            if a.size:
                cl.enqueue_copy(st.queue, a, st.buf, is_blocking=True)
            st.host = a
        return st.host.reshape(self.shape)

    # -- writes ------------------------------------------------------------------------
    def mark_written(self):
        """Record that a kernel wrote the device buffer: the host copy is stale."""
        self._st.host = None
        self._st.version += 1
        return self

    def set_(self, x):
        """Overwrite the contents with array-like `x` of the same shape."""
        a = _as_float32(x)
        if a.shape != self.shape:
            raise ValueError(f"expected shape {self.shape}, got {a.shape}")
        a = a.reshape(-1).copy()
        st = self._st
        if st.buf is not None and a.size:
            import pyopencl as cl

            rec = recorder()
            if rec is not None:
                rec.refuse("a write from the host (set_)")
            cl.enqueue_copy(st.queue, st.buf, a, is_blocking=True)
        st.host = a
        st.version += 1
        return self

    def copy_(self, src):
        """Overwrite the device contents with tensor `src`'s (the same size): a device copy on one
        context, else an upload of src's host data."""
        import pyopencl as cl

        if src.size != self.size:
            raise ValueError(f"cannot copy {src.size} elements into a tensor of shape {self.shape}")
        if self.size:
            if src.on_device and src.queue.context == self.queue.context:
                cl.enqueue_copy(self.queue, self.buf, src.buf, byte_count=self.nbytes)
                rec = recorder()
                if rec is not None:
                    rec.copy(self.buf, src.buf, self.nbytes)
            else:
                _upload(self.queue, self.buf, src.numpy().reshape(-1))
        return self.mark_written()

    @classmethod
    def of_storage(cls, storage, shape):
        """A view of `storage` (another tensor's .storage) with `shape` (as many elements)."""
        view = cls.__new__(cls)
        view.shape, view._st, view.grad, view.grad_home = tuple(shape), storage, None, None
        return view

    def alias(self):
        """A tensor on the same device buffer with a storage record of its own (host copy, version):
        adopt_ can move either away without moving the other."""
        t = Tensor(self.shape, self.queue, self._st.buf)
        t._st.base = self._st.base
        return t

    def adopt_(self, region):
        """Copy the data into `region` (a device tensor of the same size) and keep it there from now
        on, in region's buffer: views of this tensor follow; its host copy and version stay."""
        region.copy_(self)
        st = self._st
        st.queue, st.buf, st.base = region.queue, region.buf, region._st.base
        return self

    def fill_(self, value):
        """Set every element to `value` (a device fill: no kernel, no host copy)."""
        import pyopencl as cl

        if self.size:
            cl.enqueue_fill_buffer(self.queue, self.buf, np.float32(value), 0, self.nbytes)
            rec = recorder()
            if rec is not None:
                rec.fill(self.buf, value, self.nbytes)
        return self.mark_written()

    def reshape(self, *shape):
        """A view with a new shape sharing this tensor's storage."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        shape = [int(s) for s in shape]
        if shape.count(-1) > 1 or any(s < -1 for s in shape):
            raise ValueError(f"cannot reshape {self.shape} to {tuple(shape)}: at most one -1, no other negatives")
        if -1 in shape:
            known = math.prod(s for s in shape if s != -1)
            if known == 0 or self.size % known:
                raise ValueError(f"cannot reshape {self.shape} ({self.size} elements) to {tuple(shape)}")
            shape[shape.index(-1)] = self.size // known
        if math.prod(shape) != self.size:  # Python ints: exact, and no ~4 us np.prod
            raise ValueError(f"cannot reshape {self.shape} ({self.size} elements) to {tuple(shape)}")
        return Tensor.of_storage(self._st, shape)
