"""Optimizers with torch.optim's update rules; updates run on the device.

One launch per step updates all the parameters on a device. At its first step the optimizer moves
the parameters into one flat buffer (each parameter a sub-buffer of it, at the device's base
address alignment) and keeps their gradients and its state (momentum, Adam's moments) in flat
buffers of the same layout; a step launches the update over the flat range (once per run of
parameters that agree on the step count and on whether their state is new: once in a training
loop). The layout is rebuilt only when a parameter's buffer changes (moved to another device).

Gradients land in place: each parameter's `grad_home` (a GradHome) is where the first backward
after zero_grad writes its gradient, which overwrites, so zeroing costs nothing. A gradient or
state tensor from elsewhere (set by hand, loaded from a checkpoint) is copied in at the step.

`state_dict()` returns plain arrays and numbers (checkpoints store it without pickle)."""
import weakref

import numpy as np

from netcl import ops, runtime
from netcl.nn.module import as_bool, as_float
from netcl.tensor import Tensor

_MAX_BYTES = 4 * (2**31 - 1)  # the kernels index elements with 32-bit ints


class GradHome:
    """A parameter's piece of its optimizer's flat gradient buffer; ops.grad_target lends it as the
    next gradient. A gradient lent before and still held elsewhere (it or a view of it) first moves
    to a buffer of its own, so a held gradient keeps its values (as a fresh one would in torch)."""

    __slots__ = ("_lent", "region")

    def __init__(self, region):
        self.region, self._lent = region, None  # _lent: a weak reference to the storage lent last

    def _free(self):
        held = self._lent() if self._lent is not None else None
        if held is not None:
            shape = self.region.shape
            Tensor.of_storage(held, shape).adopt_(Tensor.empty(self.region.queue, shape))
        self._lent = None

    def lend(self, p):
        """A Tensor on the region for p's next gradient, or None if p is not on the region's device."""
        if p.queue is None or p.queue.context != self.region.queue.context:
            return None
        self._free()
        g = self.region.alias()
        self._lent = weakref.ref(g.storage)
        return g

    def holds(self, g):
        """Whether `g` is this home's region (the gradient already in place)."""
        return g.on_device and g.buf is self.region.buf

    def store(self, g):
        """Copy gradient `g` (from elsewhere) into the region."""
        self._free()
        self.region.copy_(g)


def _align(q):
    """Bytes: where a sub-buffer may start on q's device."""
    return max(4, q.device.mem_base_addr_align // 8)


def _padded(p, align):
    return -(-max(p.nbytes, 4) // align) * align


class _Flat:
    """Parameters of one device (up to a buffer's size of them), their gradients and the state
    slots, each a flat buffer; parameter k is at element offsets[k] of each, sizes[k] long."""

    def __init__(self, q, indices, params, slots):
        align = _align(q)
        self.q, self.indices, self.offsets, self.sizes = q, indices, [], []
        nbytes = 0
        for p in params:
            self.offsets.append(nbytes // 4)
            self.sizes.append(p.size)
            nbytes += _padded(p, align)
        self.param, self.grad = runtime.buffer(q, nbytes), runtime.buffer(q, nbytes)
        self.slot = {name: runtime.buffer(q, nbytes) for name in slots}
        self.state = [{name: self.region(buf, k, p.shape) for name, buf in self.slot.items()}
                      for k, p in enumerate(params)]  # parameter k's state tensors

    def region(self, buf, k, shape):
        return Tensor.region(self.q, buf, 4 * self.offsets[k], shape)


class Optimizer:
    """The base of netcl's optimizers: parameters in one flat buffer per device, one update launch per step."""
    slots = ()  # names of per-parameter state tensors
    zero_new_slots = True  # a new state tensor starts as zeros (SGD's momentum starts as the gradient)

    def __init__(self, params, lr):
        self.params = list(params)
        if not self.params:
            raise ValueError("optimizer got an empty parameter list: the model has no parameters that parameters() "
                             "finds (layers must be attributes, or held in nn.ModuleList / nn.ModuleDict; tensors "
                             "to learn must be nn.Parameter; frozen ones are left out)")
        for i, p in enumerate(self.params):
            if not isinstance(p, Tensor):
                raise TypeError(f"optimizer parameters must be netcl Tensors, got {type(p).__name__}")
            for j in range(i):
                if self.params[j].storage is p.storage:
                    raise ValueError(f"optimizer parameter {i} is parameter {j} again (or a view of it); "
                                     "give each tensor once")
        self.lr = as_float("lr", lr, 0.0)
        self.state = [dict() for _ in self.params]  # per parameter: slot -> Tensor, "step" -> int
        self._flats, self._placed, self._slots = [], [None] * len(self.params), None

    def zero_grad(self):
        """Drop every parameter's gradient (the next backward writes a new one)."""
        for p in self.params:
            p.grad = None

    def step(self):
        """Update every parameter that has a gradient."""
        live = [p.grad is not None for p in self.params]
        if not any(live):
            return
        for p, g in zip(self.params, live):
            if g and not p.on_device:  # a host-only parameter given a gradient by hand
                p.to(p.grad.queue)
        if not self._layout_holds():
            self._layout()
        for flat in self._flats:
            runs = []  # [first k, last k + 1, key] of consecutive parameters updated alike
            for k, i in enumerate(flat.indices):
                if not live[i]:
                    continue
                p, st = self.params[i], self.state[i]
                st["step"] = st.get("step", 0) + 1
                key = self._key(st)
                if not p.grad_home.holds(p.grad):
                    p.grad_home.store(p.grad)
                self._state_in_place(flat, k, st)
                if runs and runs[-1][1] == k and runs[-1][2] == key:
                    runs[-1][1] = k + 1
                else:
                    runs.append([k, k + 1, key])
            for a, b, key in runs:
                off = flat.offsets[a]
                self._launch(flat, off, flat.offsets[b - 1] + flat.sizes[b - 1] - off, key, flat.indices[a])
        for i in (i for i, g in enumerate(live) if g):
            self.params[i].mark_written()
            for name in self.slots:
                self.state[i][name].mark_written()

    # -- the flat layout -------------------------------------------------------------------
    def _layout_holds(self):
        return self._slots == self.slots and all(
            (p.on_device and p.buf is b) if b is not None else not p.on_device for p, b in zip(self.params, self._placed))

    def _layout(self):
        """Move the parameters on devices into new flat buffers (per context, each at most a
        buffer's size), with gradient homes and state slots at the same offsets."""
        groups = {}
        for i, p in enumerate(self.params):
            if p.on_device:
                groups.setdefault(p.queue.context, []).append(i)
        self._flats, self._placed, self._slots = [], [None] * len(self.params), self.slots
        for indices in groups.values():
            q = self.params[indices[0]].queue
            align, limit, chunk, nbytes = _align(q), min(q.device.max_mem_alloc_size, _MAX_BYTES), [], 0
            for i in indices:
                size = _padded(self.params[i], align)
                if chunk and nbytes + size > limit:
                    self._place(q, chunk)
                    chunk, nbytes = [], 0
                chunk.append(i)
                nbytes += size
            self._place(q, chunk)

    def _place(self, q, indices):
        flat = _Flat(q, indices, [self.params[i] for i in indices], self.slots)
        self._flats.append(flat)
        for k, i in enumerate(indices):
            p = self.params[i]
            p.adopt_(flat.region(flat.param, k, p.shape))
            self._placed[i] = p.buf
            p.grad_home = GradHome(flat.region(flat.grad, k, p.shape))

    def _state_in_place(self, flat, k, st):
        """Make flat parameter k's state tensors its regions of the slot buffers: new ones (zeros,
        or for SGD's momentum what the kernel writes), or state from elsewhere copied in."""
        for name, region in flat.state[k].items():
            t = st.get(name)
            if t is not region:
                st[name] = region.copy_(t) if t is not None else region.fill_(0.0) if self.zero_new_slots else region

    # -- checkpoints ---------------------------------------------------------------------
    def hyperparameters(self):
        """The settings a step uses ({name: value}), as TrainStep compares them."""
        raise NotImplementedError

    def state_dict(self):
        """{"type", "hyper": {...}, "state": {"<i>.<slot>": array, "<i>.step": int}}"""
        state = {}
        for i, st in enumerate(self.state):
            for k, v in st.items():
                state[f"{i}.{k}"] = v.to_host() if isinstance(v, Tensor) else v
        return {"type": type(self).__name__, "hyper": self.hyperparameters(), "state": state}

    def load_state_dict(self, d):
        """Restore state_dict()'s state (a checkpoint's)."""
        if d.get("type") != type(self).__name__:
            raise ValueError(f"optimizer state is for {d.get('type')!r}, not {type(self).__name__}")
        checked = type(self)(self.params, **d["hyper"])  # validates the hyperparameters
        for k in d["hyper"]:
            setattr(self, k, getattr(checked, k))
        self.state = [dict() for _ in self.params]
        for key, v in d["state"].items():
            i, name = key.split(".", 1)
            i = int(i)
            if not 0 <= i < len(self.params):
                raise ValueError(f"optimizer state names parameter {i}, the model has {len(self.params)}")
            p = self.params[i]
            if name == "step":
                self.state[i][name] = int(v)
            else:
                a = np.asarray(v, np.float32)
                if a.shape != p.shape:
                    raise ValueError(f"optimizer state {key!r} has shape {a.shape}, parameter has {p.shape}")
                self.state[i][name] = Tensor.from_host(p.queue, a)
        return self


def _step(q, name, n, *args):
    """Launch optim.cl's update `name` over n values: on CPUs its _cpu variant, a chunk of them per
    work-item (a work-group per 64 values cost PoCL a dispatch each), the chunk its last argument
    (the arguments before it keep their indices: ops.varies)."""
    if ops.is_cpu(q):
        chunk, items = ops.cpu_chunk(n)
        ops.launch(q, "optim", name + "_cpu", (items,), (1,), *args, chunk)
    else:
        ops.launch1d(q, "optim", name, n, *args)


class SGD(Optimizer):
    """SGD(params, lr, momentum=0, dampening=0, weight_decay=0, nesterov=False): torch.optim.SGD's update on the device."""
    zero_new_slots = False

    def __init__(self, params, lr=0.01, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False):
        super().__init__(params, lr)
        self.momentum, self.dampening = as_float("momentum", momentum, 0.0), as_float("dampening", dampening, 0.0, 1.0)
        self.weight_decay, self.nesterov = as_float("weight_decay", weight_decay, 0.0), as_bool("nesterov", nesterov)
        if nesterov and (self.momentum <= 0 or self.dampening != 0):
            raise ValueError("Nesterov momentum requires momentum > 0 and zero dampening")

    @property
    def slots(self):
        return ("momentum_buffer",) if self.momentum else ()

    def hyperparameters(self):
        return {"lr": self.lr, "momentum": self.momentum, "dampening": self.dampening,
                "weight_decay": self.weight_decay, "nesterov": self.nesterov}

    def _key(self, st):
        return bool(self.momentum) and "momentum_buffer" not in st  # the first update copies the gradient

    def _launch(self, flat, off, n, first, i):
        buf = flat.slot["momentum_buffer"] if self.momentum else flat.grad
        _step(flat.q, "sgd_step", n, off, n, flat.param, flat.grad, buf, self.lr, self.momentum, self.dampening,
              self.weight_decay, int(self.nesterov), int(first))


class Adam(Optimizer):
    """Adam(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0): torch.optim.Adam's update on the device."""
    slots = ("exp_avg", "exp_avg_sq")

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        super().__init__(params, lr)
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"Adam betas must be a pair (beta1, beta2), got {betas!r}")
        b1, b2 = (as_float(f"betas[{i}]", b, 0.0, 1.0) for i, b in enumerate(betas))
        if b1 >= 1.0 or b2 >= 1.0:
            raise ValueError(f"Adam betas must be in [0, 1), got {betas}")
        self.betas, self.eps = (b1, b2), as_float("eps", eps, 0.0)
        self.weight_decay = as_float("weight_decay", weight_decay, 0.0)

    def hyperparameters(self):
        return {"lr": self.lr, "betas": list(self.betas), "eps": self.eps, "weight_decay": self.weight_decay}

    def _key(self, st):
        return st["step"]  # the bias corrections

    def _corrections(self, t):
        b1, b2 = self.betas
        return 1.0 - b1 ** t, 1.0 - b2 ** t

    def _launch(self, flat, off, n, t, i):
        """Parameters from i on (flat offset off, n values) at step t."""
        b1, b2 = self.betas
        _step(flat.q, "adam_step", n, off, n, flat.param, flat.grad, flat.slot["exp_avg"], flat.slot["exp_avg_sq"],
              self.lr, b1, b2, self.eps, self.weight_decay, *self._corrections(t))
        ops.varies((11, 12), lambda: self._corrections(self.state[i]["step"]))  # a replay's step count
