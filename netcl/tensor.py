"""Tensor: float32 storage on the host, on an OpenCL device, or both.

A tensor made without a queue lives on the host only (parameters of a model that is built,
loaded or exported where pyopencl is absent); it moves to a device on first use. `version`
counts writes, so that derived data (fused inference weights) can tell when it is stale.
"""
import numpy as np


def _as_float32(x):
    if isinstance(x, Tensor):
        return x.to_host()
    try:
        a = np.asarray(x)
        # real numbers only: complex would silently lose its imaginary part
        if not (np.issubdtype(a.dtype, np.integer) or np.issubdtype(a.dtype, np.floating) or a.dtype == np.bool_):
            raise TypeError
        return np.ascontiguousarray(a, dtype=np.float32)
    except (TypeError, ValueError):
        raise TypeError(f"Tensor data must be an array-like of numbers convertible to float32, "
                        f"got {type(x).__name__}") from None


class Tensor:
    """A float32 array. `queue` is None for a host-only tensor."""

    __slots__ = ("shape", "queue", "_host", "_buf", "grad", "version", "__weakref__")

    def __init__(self, shape, queue=None, buf=None, host=None):
        self.shape = tuple(int(s) for s in shape)
        self.queue = queue
        self._buf = buf
        self._host = host
        self.grad = None
        self.version = 0

    # -- construction ------------------------------------------------------------------
    @classmethod
    def from_host(cls, queue, x):
        """Copy array-like `x` (as float32) to the device of `queue` (None: keep it on the host)."""
        a = _as_float32(x)
        t = cls(a.shape, None, None, a.copy() if a is x else a)
        return t.to(queue) if queue is not None else t

    @classmethod
    def empty(cls, queue, shape):
        from netcl.runtime import alloc

        t = cls(shape, queue)
        t._buf = alloc(queue, t.nbytes)
        return t

    @classmethod
    def zeros(cls, queue, shape):
        t = cls.empty(queue, shape)
        t.fill_(0.0)
        return t

    # -- properties --------------------------------------------------------------------
    @property
    def size(self):
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self):
        return 4 * self.size

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def on_device(self):
        return self._buf is not None

    @property
    def buf(self):
        """The device buffer (the tensor must be on a device: see `to`)."""
        if self._buf is None:
            raise ValueError("tensor is on the host only; call .to(queue) first")
        return self._buf

    def __repr__(self):
        where = "host" if self.queue is None else self.queue.device.name.strip()
        return f"Tensor(shape={self.shape}, on={where})"

    # -- movement ----------------------------------------------------------------------
    def to(self, queue):
        """Make the data present on `queue`'s device (uploading host data once); returns self."""
        import pyopencl as cl

        if self._buf is not None and self.queue is not None and self.queue.context == queue.context:
            self.queue = queue
            return self
        host = self.to_host() if self._buf is not None else self._host
        from netcl.runtime import alloc

        self.queue = queue
        self._buf = alloc(queue, self.nbytes)
        if host is not None and host.size:
            cl.enqueue_copy(queue, self._buf, np.ascontiguousarray(host, np.float32), is_blocking=False)
            self._host = host  # keep the host copy: still valid, and the upload may still read it
        return self

    def to_host(self):
        """A float32 numpy copy of the data."""
        return self.numpy().copy()

    def numpy(self):
        """The data on the host (read from the device if needed); do not modify it."""
        if self._host is None:
            import pyopencl as cl

            a = np.empty(self.shape, np.float32)
            if a.size:
                cl.enqueue_copy(self.queue, a, self._buf, is_blocking=True)
            self._host = a
        return self._host

    # -- writes ------------------------------------------------------------------------
    def mark_written(self):
        """Record that a kernel wrote the device buffer: the host copy is stale."""
        self._host = None
        self.version += 1
        return self

    def set_(self, x):
        """Overwrite the contents with array-like `x` of the same shape."""
        a = _as_float32(x)
        if a.shape != self.shape:
            raise ValueError(f"expected shape {self.shape}, got {a.shape}")
        a = a.copy()
        if self._buf is not None:
            import pyopencl as cl

            cl.enqueue_copy(self.queue, self._buf, a, is_blocking=True)
        self._host = a
        self.version += 1
        return self

    def fill_(self, value):
        from netcl.ops import fill

        fill(self, value)
        return self

    def reshape(self, *shape):
        """A view with a new shape sharing the same storage (the host copy is reshaped too)."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        shape = list(shape)
        if shape.count(-1) == 1:
            known = int(np.prod([s for s in shape if s != -1]))
            shape[shape.index(-1)] = self.size // max(known, 1)
        if int(np.prod(shape)) != self.size:
            raise ValueError(f"cannot reshape {self.shape} to {tuple(shape)}")
        host = None if self._host is None else self._host.reshape(shape)
        return Tensor(shape, self.queue, self._buf, host)
