"""Tensor: float32 (or int32) storage on the host, on an OpenCL device, or both, with autograd.

A tensor made without a queue lives on the host only (parameters of a model that is built,
loaded or exported where pyopencl is absent); it moves to a device on first use. Views made by
`reshape` share their storage: a write through any of them is seen by all. The storage's
`version` counts writes, so that derived data (fused inference weights) can tell when it is stale,
and autograd can tell that a tensor saved for backward was changed in place.

Autograd: a tensor that `requires_grad` and was made by an operation carries the node that made
it (`grad_fn`); `backward()` walks those nodes (netcl.autograd). The operators and methods that
compute (`+`, `@`, `sum`, `exp`, indexing, ...) are netcl.functions', installed here by install():
this module sits below the kernels' launchers, which build on Tensor.
"""
import math
import threading

import numpy as np

from netcl.runtime import alloc, default_queue, recorder


FLOAT32, INT32 = np.dtype(np.float32), np.dtype(np.int32)  # what a device tensor can hold (4 bytes each)


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
# queued before it has run (a write behind a long kernel returns when the kernel is done): a
# training step's labels, uploaded after the forward is queued, would hold the host until the
# forward is done, and the device would then wait for the loss kernels. Up to _STAGED bytes go
# to a PoCL CPU device through a staging buffer on host memory of netcl's (USE_HOST_PTR, which
# PoCL's CPU drivers read in place; written on the host only once its last copy has run) and a
# device-side copy, queued at once. At most _SLOTS staging buffers per context: a training loop's
# uploads find theirs done (no allocation per step); with all of them busy an upload is a plain
# write.
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
                slot[0][:host.size] = host.view(np.float32)  # (int32 data copied bit for bit)
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
    """An array of float32 (or int32: class indices, gather indices) on the host or a device.
    `queue` is None for a host-only tensor. `grad_home`, set by an optimizer on its parameters, is
    where ops.grad_target puts the next gradient (see netcl.optim). `requires_grad`, `grad` and
    `grad_fn` are autograd's, as in PyTorch."""

    __slots__ = ("shape", "_st", "grad", "grad_home", "requires_grad", "_node", "_oi", "dtype", "_on_read",
                 "__weakref__")
    __array_priority__ = 1000  # numpy operands defer to Tensor's reflected operators (ndarray + Tensor -> Tensor)

    def __init__(self, shape, queue=None, buf=None, host=None, dtype=FLOAT32):
        self.shape = tuple(int(s) for s in shape)
        if dtype is not FLOAT32:  # (the common case without a numpy call: predict() makes tensors per call)
            dtype = np.dtype(dtype)
            if dtype != FLOAT32 and dtype != INT32:
                raise TypeError(f"a netcl Tensor holds float32 or int32, got {dtype}")
        self.dtype = dtype
        if host is not None:
            host = np.asarray(host, self.dtype).reshape(-1)
            if host.size != self.size:
                raise ValueError(f"host data has {host.size} elements, shape {self.shape} needs {self.size}")
        self._st = _Storage(queue, buf, host)
        self.grad = self.grad_home = self._node = self._on_read = None
        self.requires_grad, self._oi = False, 0

    # -- construction ------------------------------------------------------------------
    @classmethod
    def from_host(cls, queue, x):
        """Copy array-like `x` (as float32) to the device of `queue` (None: keep it on the host)."""
        a = _as_float32(x)
        t = cls(a.shape, None, None, a.copy() if (a is x or a.base is not None) else a)
        return t.to(queue) if queue is not None else t

    @classmethod
    def empty(cls, queue, shape, dtype=FLOAT32):
        """An uninitialised device tensor of `shape` on `queue` (float32 unless dtype says)."""
        t = cls(shape, queue, dtype=dtype)
        t._st.buf = alloc(queue, t.nbytes)
        return t

    @classmethod
    def zeros(cls, queue, shape):
        """A device tensor of zeros."""
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
        """The pyopencl.CommandQueue of the tensor's device (None: host only)."""
        return self._st.queue

    @property
    def version(self):
        """How many times the storage was written (views share it)."""
        return self._st.version

    @property
    def size(self):
        """The number of elements, as NumPy's `size`; also callable as PyTorch's `size()` (the
        shape) and `size(dim)`."""
        return _Size(math.prod(self.shape), self.shape)  # Python ints: np.prod costs ~4 us per call

    @property
    def nbytes(self):
        """The bytes of the data (4 per element)."""
        return 4 * self.size

    @property
    def ndim(self):
        """The number of dimensions."""
        return len(self.shape)

    @property
    def storage(self):
        """What this tensor's views share (compare with `is`: one storage, one set of data)."""
        return self._st

    @property
    def on_device(self):
        """Whether the data has a device buffer."""
        return self._st.buf is not None

    @property
    def buf(self):
        """The device buffer (the tensor must be on a device: see `to`)."""
        if self._st.buf is None:
            raise ValueError("tensor is on the host only; call .to(queue) first")
        return self._st.buf


    # -- movement ----------------------------------------------------------------------
    def to(self, queue):
        """Make the data present on `queue`'s device (uploading host data once); returns self.
        queue: a pyopencl.CommandQueue (netcl.default_queue()) or, as Module.to takes it, "cpu",
        "gpu" or a device name substring (as NETCL_DEVICE)."""
        import pyopencl as cl

        if isinstance(queue, str):
            queue = default_queue(queue)
        if not isinstance(queue, cl.CommandQueue):
            raise TypeError(f"expected a pyopencl.CommandQueue (netcl.default_queue()) or a device name, "
                            f"got {type(queue).__name__}")
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
        if _math is not None:
            _math.refuse_in_trace(self, "read to the host")
        st = self._st
        if self._on_read is not None:
            self._on_read()  # (a loss: raises where its kernel refused the input, or gives the value)
        if st.host is None:
            import pyopencl as cl

            a = np.empty(self.size, self.dtype)
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
        a = _as_float32(x) if self.dtype == FLOAT32 else np.asarray(x, self.dtype)
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
        view.shape, view._st, view.grad, view.grad_home, view.dtype = tuple(shape), storage, None, None, FLOAT32
        view.requires_grad, view._node, view._oi, view._on_read = False, None, 0, None
        return view

    def alias(self):
        """A tensor on the same device buffer with a storage record of its own (host copy, version):
        adopt_ can move either away without moving the other."""
        t = Tensor(self.shape, self.queue, self._st.buf, dtype=self.dtype)
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
            pattern = np.float32(value) if self.dtype == FLOAT32 else np.int32(value)
            cl.enqueue_fill_buffer(self.queue, self.buf, pattern, 0, self.nbytes)
            rec = recorder()
            if rec is not None:
                rec.fill(self.buf, pattern, self.nbytes)
        self.mark_written()
        if _math is not None and _math.tracing():
            _math.trace_inplace("full_like", (self, value), self)
        return self

    def reshape(self, *shape):
        """A view with a new shape sharing this tensor's storage (recorded by autograd where this
        tensor requires grad)."""
        if _math.tracing():  # netcl.trace records it as an operation
            return _math.reshape(self, *shape)
        view = self._view(shape)
        return _math.record_view(self, view) if self.requires_grad else view

    view = reshape

    def _view(self, shape):
        """reshape() without autograd: the view itself."""
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
        v = Tensor.of_storage(self._st, shape)
        v.dtype = self.dtype
        return v

    # -- autograd --------------------------------------------------------------------------
    @property
    def grad_fn(self):
        """The node that made this tensor (None for a leaf: made by the user, a parameter)."""
        return self._node

    @property
    def is_leaf(self):
        """Whether no recorded operation made this tensor (a parameter, an input)."""
        return self._node is None

    def requires_grad_(self, requires_grad=True):
        """Ask autograd to compute this leaf's gradient (into `.grad`); returns the tensor."""
        if self._node is not None and not requires_grad:
            raise RuntimeError("requires_grad_(False) on a tensor made by an operation: use detach() instead")
        if requires_grad and self.dtype != FLOAT32:
            raise TypeError(f"only float32 tensors can require gradients, this one holds {self.dtype}")
        self.requires_grad = bool(requires_grad)
        return self

    def backward(self, gradient=None, retain_graph=False):
        """Accumulate d(self)/d(leaf) into every leaf's `.grad` (self a scalar, or `gradient` given:
        a tensor or array of self's shape), as torch.Tensor.backward."""
        _math.backward(self, gradient, retain_graph)

    def detach(self):
        """The same data (shared storage) cut from the graph: requires no grad."""
        if _math.tracing():
            return _math.detach(self)
        v = Tensor.of_storage(self._st, self.shape)
        v.dtype = self.dtype
        return v

    # -- reading values --------------------------------------------------------------------
    def item(self):
        """The value of a one-element tensor as a Python number (a read from the device)."""
        _math.refuse_in_trace(self, "read with item()")
        if self.size != 1:
            raise ValueError(f"item() takes a tensor of one element, this one has shape {self.shape}")
        v = self.numpy().reshape(-1)[0]
        return int(v) if self.dtype == INT32 else float(v)

    def tolist(self):
        """The values as nested Python lists (a read from the device)."""
        return self.numpy().tolist()

    def __float__(self):
        return float(self.item())

    def __int__(self):
        return int(self.item())

    def __index__(self):
        if self.dtype != INT32:
            raise TypeError("only an integer tensor of one element can be used as an index")
        return self.item()

    def __bool__(self):
        if self.size != 1:
            raise ValueError(f"the truth value of a tensor of shape {self.shape} is ambiguous: use .any() or "
                             ".all() (of a comparison), or compare one element")
        _math.refuse_in_trace(self, "converted to bool (an if or while on a tensor's value)")
        return bool(self.item())

    def __format__(self, spec):
        if self.size == 1 and spec:
            return format(self.item(), spec)
        return format(repr(self), spec)

    def __array__(self, dtype=None, copy=None):
        a = self.to_host()
        return a if dtype is None else a.astype(dtype)

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __iter__(self):
        if not self.shape:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self.shape[0]))

    def __repr__(self):
        where = "host" if self.queue is None else self.queue.device.name.strip()
        extra = f", dtype={self.dtype.name}" if self.dtype != FLOAT32 else ""
        if self._node is not None:
            extra += f", grad_fn=<{self._node.name}>"
        elif self.requires_grad:
            extra += ", requires_grad=True"
        tracing = _math is not None and _math.autograd.tracer() is not None  # (netcl.trace: values unread)
        if self.size <= 1000 and (self._st.host is not None or self.on_device) and recorder() is None and not tracing:
            body = np.array2string(self.numpy(), separator=", ", prefix="tensor(")
            return f"tensor({body}, on={where}{extra})"
        return f"Tensor(shape={self.shape}, on={where}{extra})"

    def dim(self):
        """The number of dimensions (PyTorch's dim(); also ndim)."""
        return len(self.shape)

    def numel(self):
        """The number of elements (PyTorch's numel(); also size)."""
        return math.prod(self.shape)

    # -- computing (netcl.functions: forward and backward in OpenCL kernels) ----------------
    # arithmetic with NumPy broadcasting; a Python number, a NumPy array or a host tensor operand
    # is taken to this tensor's device
    def __add__(self, other):
        return _math.add(self, other)

    def __radd__(self, other):
        return _math.add(other, self)

    def __sub__(self, other):
        return _math.sub(self, other)

    def __rsub__(self, other):
        return _math.sub(other, self)

    def __mul__(self, other):
        return _math.mul(self, other)

    def __rmul__(self, other):
        return _math.mul(other, self)

    def __truediv__(self, other):
        return _math.div(self, other)

    def __rtruediv__(self, other):
        return _math.div(other, self)

    def __pow__(self, other):
        return _math.pow(self, other)

    def __rpow__(self, other):
        return _math.pow(other, self)

    def __matmul__(self, other):
        return _math.matmul(self, other)

    def __rmatmul__(self, other):
        return _math.matmul(other, self)

    def __neg__(self):
        return _math.neg(self)

    def __pos__(self):
        return self

    def __abs__(self):
        return _math.abs(self)

    # in place: on tensors outside autograd (no_grad, or no gradient wanted); the version counter
    # tells a backward that needs the old values
    def __iadd__(self, other):
        return _math.inplace("add", self, other)

    def __isub__(self, other):
        return _math.inplace("sub", self, other)

    def __imul__(self, other):
        return _math.inplace("mul", self, other)

    def __itruediv__(self, other):
        return _math.inplace("div", self, other)

    def add_(self, other, alpha=1.0):
        """x += alpha * other in place (outside autograd: see check_inplace)."""
        return _math.inplace("add", self, other if alpha == 1.0 else _math.mul(other, alpha))

    def sub_(self, other, alpha=1.0):
        """x -= alpha * other in place."""
        return _math.inplace("sub", self, other if alpha == 1.0 else _math.mul(other, alpha))

    def mul_(self, other):
        """x *= other in place."""
        return _math.inplace("mul", self, other)

    def div_(self, other):
        """x /= other in place."""
        return _math.inplace("div", self, other)

    def zero_(self):
        """Fill with zeros in place."""
        _math.check_inplace(self)
        return self.fill_(0.0)

    # comparisons: float tensors of 0 and 1 (PyTorch gives bool tensors)
    def __eq__(self, other):
        return _math.compare("eq", self, other)

    def __ne__(self, other):
        return _math.compare("ne", self, other)

    def __lt__(self, other):
        return _math.compare("lt", self, other)

    def __le__(self, other):
        return _math.compare("le", self, other)

    def __gt__(self, other):
        return _math.compare("gt", self, other)

    def __ge__(self, other):
        return _math.compare("ge", self, other)

    # element-wise functions
    def exp(self):
        """e ** x element by element."""
        return _math.exp(self)

    def log(self):
        """The natural logarithm element by element."""
        return _math.log(self)

    def sqrt(self):
        """The square root element by element."""
        return _math.sqrt(self)

    def abs(self):
        """|x| element by element."""
        return _math.abs(self)

    def neg(self):
        """-x."""
        return _math.neg(self)

    def square(self):
        """x * x element by element."""
        return _math.pow(self, 2)

    def pow(self, exponent):
        """x ** exponent (a number or a tensor)."""
        return _math.pow(self, exponent)

    def clamp(self, min=None, max=None):
        """x limited to [min, max] (either may be None; numbers or tensors)."""
        return _math.clamp(self, min, max)

    clip = clamp

    def relu(self):
        """max(x, 0) element by element (NaN stays NaN)."""
        return _math.relu(self)

    def sigmoid(self):
        """1 / (1 + exp(-x)) element by element."""
        return _math.sigmoid(self)

    def tanh(self):
        """tanh(x) element by element."""
        return _math.tanh(self)

    def softmax(self, dim):
        """exp(x) / sum(exp(x)) along `dim`."""
        return _math.softmax(self, dim)

    def log_softmax(self, dim):
        """log(softmax(x)) along `dim`, computed from the maximum (no overflow)."""
        return _math.log_softmax(self, dim)

    def maximum(self, other):
        """The larger of x and other element by element (broadcasting)."""
        return _math.maximum(self, other)

    def minimum(self, other):
        """The smaller of x and other element by element (broadcasting)."""
        return _math.minimum(self, other)

    # reductions: dim None (all), an int or a tuple of ints
    def sum(self, dim=None, keepdim=False):
        """The sum over `dim` (None: all; an int or a tuple of ints)."""
        return _math.sum(self, dim, keepdim)

    def mean(self, dim=None, keepdim=False):
        """The mean over `dim` (None: all; an int or a tuple of ints)."""
        return _math.mean(self, dim, keepdim)

    def max(self, dim=None, keepdim=False):
        """The maximum (dim None), or (values, indices) along `dim`, as torch.max."""
        return _math.max(self, dim, keepdim)

    def min(self, dim=None, keepdim=False):
        """The minimum (dim None), or (values, indices) along `dim`, as torch.min."""
        return _math.min(self, dim, keepdim)

    def amax(self, dim=None, keepdim=False):
        """The maximum over `dim` (None: all), as torch.amax; ties share the gradient."""
        return _math.amax(self, dim, keepdim)

    def amin(self, dim=None, keepdim=False):
        """The minimum over `dim` (None: all), as torch.amin."""
        return _math.amin(self, dim, keepdim)

    def argmax(self, dim=None, keepdim=False):
        """The index of the first maximum along `dim` (None: of the flattened tensor), int32."""
        return _math.argmax(self, dim, keepdim)

    def argmin(self, dim=None, keepdim=False):
        """The index of the first minimum along `dim` (None: of the flattened tensor), int32."""
        return _math.argmin(self, dim, keepdim)

    def any(self):
        """Whether any element is non-zero (a read from the device)."""
        return bool(_math.compare("ne", self, 0.0).amax().item())

    def all(self):
        """Whether every element is non-zero (a read from the device)."""
        return bool(_math.compare("ne", self, 0.0).amin().item())

    # shapes: views where the order of the elements stays, copies otherwise
    def flatten(self, start_dim=0, end_dim=-1):
        """Dimensions start_dim..end_dim merged into one (a view)."""
        return _math.flatten(self, start_dim, end_dim)

    def squeeze(self, dim=None):
        """Dimensions of size 1 dropped (all, or those of `dim`); a view."""
        return _math.squeeze(self, dim)

    def unsqueeze(self, dim):
        """A dimension of size 1 inserted at `dim` (a view)."""
        return _math.unsqueeze(self, dim)

    def transpose(self, dim0, dim1):
        """Dimensions dim0 and dim1 swapped (a copy unless the order of the elements stays)."""
        return _math.transpose(self, dim0, dim1)

    def permute(self, *dims):
        """The dimensions in a new order (a copy unless the order of the elements stays)."""
        return _math.permute(self, *dims)

    def t(self):
        """A matrix's transpose (a copy; tensors of 0 or 1 dimension come back as they are)."""
        if self.ndim > 2:
            raise ValueError(f"t() takes a tensor of at most 2 dimensions, got shape {self.shape}")
        return self if self.ndim < 2 else _math.transpose(self, 0, 1)

    @property
    def T(self):
        """The dimensions reversed (a copy; a matrix's transpose)."""
        return _math.permute(self, *reversed(range(self.ndim)))

    def expand(self, *shape):
        """The tensor broadcast out to `shape` (-1 keeps a dimension); a copy."""
        return _math.expand(self, *shape)

    def contiguous(self):
        """The tensor itself: netcl's tensors are always contiguous."""
        return self

    def clone(self):
        """A copy of the data, in autograd's graph (its gradient passes through)."""
        return _math.clone(self)

    def __getitem__(self, index):
        return _math.getitem(self, index)

    def split(self, split_size_or_sections, dim=0):
        """Pieces along dim (torch.split): a tuple of tensors."""
        return _math.split(self, split_size_or_sections, dim)

    def chunk(self, chunks, dim=0):
        """`chunks` pieces along dim (torch.chunk): a tuple of tensors."""
        return _math.chunk(self, chunks, dim)

    # types
    def float(self):
        """The tensor as float32 (itself when it is)."""
        return _math.cast(self, FLOAT32)

    def int(self):
        """The tensor as int32, rounded toward zero (itself when it is)."""
        return _math.cast(self, INT32)

    long = int


    __hash__ = object.__hash__  # identity, as torch.Tensor (== compares element by element)


class _Size(int):
    """A tensor's element count (an int, as NumPy's `size`) that, called, gives its shape or one
    dimension (PyTorch's `size()`, `size(dim)`)."""

    def __new__(cls, n, shape):
        v = int.__new__(cls, n)
        v.shape = shape
        return v

    def __reduce__(self):
        return _Size, (int(self), self.shape)

    def __call__(self, dim=None):
        if dim is None:
            return self.shape
        if not -len(self.shape) <= dim < len(self.shape):
            raise IndexError(f"dimension {dim} is out of range for shape {self.shape}")
        return self.shape[dim]


_math = None  # netcl.functions, set by install(): the operators above call it


def install(functions):
    """Connect Tensor's computing operators and methods to `functions` (netcl.functions, which
    builds on this module and calls this once when it loads)."""
    global _math
    _math = functions
