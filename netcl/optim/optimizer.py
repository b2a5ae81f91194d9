"""The optimizers' base: parameter groups over flat device buffers, one update launch per run.

At its first step an optimizer moves its parameters into one flat buffer per device (each
parameter a sub-buffer of it, at the device's base address alignment) and keeps their gradients
and its state (momentum, Adam's moments) in flat buffers of the same layout; a step launches the
update over the flat range, once per run of consecutive parameters that share a parameter group
and agree on the step count and on whether their state is new: once per group in a training loop.
The layout is rebuilt only when a parameter's buffer changes (moved to another device) or a group
is added.

`param_groups` is torch's: a list of dicts, each with its "params" and its settings ("lr",
"momentum", "betas", ...), which a user or a scheduler may change between steps. The update
kernels take a group's float settings as arguments that netcl.TrainStep draws anew for every
replay (ops.varies): a schedule does not make a step record again. `launch_settings()` is what
decides the launches themselves (the groups, their parameters, momentum on or off, ...).

Gradients land in place: each parameter's `grad_home` (a GradHome) is where the first backward
after zero_grad writes its gradient, which overwrites, so zeroing costs nothing. A gradient or
state tensor from elsewhere (set by hand, loaded from a checkpoint) is copied in at the step.
The flat gradient buffer's padding between parameters stays zero (runtime.buffer fills it; no
kernel writes there), so that nn.utils.clip_grad_norm_ reduces a run of gradients as one range.

`state_dict()` is torch's layout with numpy arrays and plain numbers (checkpoints store it
without pickle)."""
import weakref

import numpy as np

from netcl import autograd, ops, runtime
from netcl.nn.module import as_float
from netcl.tensor import Tensor

_MAX_BYTES = 4 * (2**31 - 1)  # the kernels index elements with 32-bit ints


class GradHome:
    """A parameter's piece of its optimizer's flat gradient buffer (parameter k of `flat`);
    ops.grad_target lends it as the next gradient. A gradient lent before and still held elsewhere
    (it or a view of it) first moves to a buffer of its own, so a held gradient keeps its values (as
    a fresh one would in torch)."""

    __slots__ = ("_lent", "region", "flat", "k")

    def __init__(self, region, flat, k):
        self.region, self._lent = region, None  # _lent: a weak reference to the storage lent last
        self.flat, self.k = flat, k

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


class Flat:
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
        """Parameter k's part of flat buffer `buf`, as a Tensor of `shape`."""
        return Tensor.region(self.q, buf, 4 * self.offsets[k], shape)


def _setting(name):
    """A property for a group setting as an attribute (`opt.lr`): reads the first group's, sets
    every group's (and the default for groups added later)."""
    def get(self):
        return self.param_groups[0][name]

    def put(self, value):
        for g in [self.defaults] + self.param_groups:
            old = g[name]
            g[name] = value
            try:
                self._check_group(g)
            except (TypeError, ValueError):
                g[name] = old
                raise
    return property(get, put, doc=f"The {name} of every parameter group (reads the first group's; "
                                  f"param_groups[i][{name!r}] is one group's).")


class Optimizer:
    """The base of netcl's optimizers: parameter groups, parameters in one flat buffer per device,
    one update launch per group and step.

    params: an iterable of Tensors, or of dicts {"params": tensors, setting: value, ...} (a group
    each; settings a group leaves out are the constructor's). defaults: the constructor's settings."""
    slot_names = ()  # every per-parameter state tensor the rule may keep, in order
    zero_new_slots = True  # a new state tensor starts as zeros (SGD's momentum starts as the gradient)
    lr = _setting("lr")

    def __init__(self, params, defaults):
        if isinstance(params, Tensor):
            raise TypeError("optimizer params must be an iterable of Tensors or of dicts (parameter groups), got "
                            "a single Tensor: pass [tensor] or model.parameters()")
        self.defaults = self._check_group(dict(defaults))
        self.param_groups, self.params, self.state = [], [], []  # params: every group's, in order
        self._group_of, self._flats, self._placed, self._slots = [], [], [], None
        groups = list(params)
        if not groups:
            raise ValueError("optimizer got an empty parameter list: the model has no parameters that parameters() "
                             "finds (layers must be attributes, or held in nn.ModuleList / nn.ModuleDict; tensors "
                             "to learn must be nn.Parameter; frozen ones are left out)")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for g in groups:
            self.add_param_group(g)

    def add_param_group(self, param_group):
        """Add a group: a dict with "params" (a Tensor or an iterable of them) and settings; those
        it leaves out are the optimizer's defaults."""
        if not isinstance(param_group, dict):
            raise TypeError(f"a parameter group must be a dict with 'params', got {type(param_group).__name__}")
        if "params" not in param_group:
            raise ValueError("a parameter group must have 'params' (a Tensor or an iterable of Tensors)")
        params = param_group["params"]
        params = [params] if isinstance(params, Tensor) else list(params)
        for n, p in enumerate(params):
            i = len(self.params) + n
            if not isinstance(p, Tensor):
                raise TypeError(f"optimizer parameters must be netcl Tensors, got {type(p).__name__}")
            for j, q in enumerate(self.params + params[:n]):
                if q.storage is p.storage:
                    raise ValueError(f"optimizer parameter {i} is parameter {j} again (or a view of it); "
                                     "give each tensor once (in one parameter group)")
        group = {k: v for k, v in param_group.items() if k != "params"}
        for k, v in self.defaults.items():
            group.setdefault(k, v)
        group = {"params": params, **self._check_group(group)}
        self.param_groups.append(group)
        self.params.extend(params)
        self.state.extend(dict() for _ in params)  # per parameter: slot -> Tensor, "step" -> int
        self._group_of.extend(group for _ in params)
        self._placed.extend(None for _ in params)

    def _check_group(self, g):
        """Validate (and normalise, in place) a group's settings; returns g. Unknown keys (a
        scheduler's "initial_lr") pass."""
        g["lr"] = as_float("lr", g["lr"], 0.0)
        return g

    def zero_grad(self, set_to_none=True):
        """Drop every parameter's gradient (the next backward writes a new one). set_to_none=False
        fills the gradients with zeros instead, as torch's."""
        for p in self.params:
            if set_to_none or p.grad is None:
                p.grad = None
            else:
                p.grad.fill_(0.0)

    def step(self, closure=None):
        """Update every parameter that has a gradient. closure: a function that computes and returns
        the loss (called first, with grad mode on), as torch's; its value is returned."""
        loss = None
        if closure is not None:
            with autograd.enable_grad():
                loss = closure()
        live = [p.grad is not None for p in self.params]
        if not any(live):
            return loss
        for p, g in zip(self.params, live):
            if g and not p.on_device:  # a host-only parameter given a gradient by hand
                p.to(p.grad.queue)
        if not self._layout_holds():
            self._layout()
        for flat in self._flats:
            runs = []  # [first k, last k + 1, (group, key)] of consecutive parameters updated alike
            for k, i in enumerate(flat.indices):
                if not live[i]:
                    continue
                p, st, group = self.params[i], self.state[i], self._group_of[i]
                st["step"] = st.get("step", 0) + 1
                key = self._key(group, st)
                if not p.grad_home.holds(p.grad):
                    p.grad_home.store(p.grad)
                self._state_in_place(flat, k, st, self._group_slots(group))
                if runs and runs[-1][1] == k and runs[-1][2] is group and runs[-1][3] == key:
                    runs[-1][1] = k + 1
                else:
                    runs.append([k, k + 1, group, key])
            for a, b, group, key in runs:
                off = flat.offsets[a]
                self._launch(flat, off, flat.offsets[b - 1] + flat.sizes[b - 1] - off, key, group, flat.indices[a])
        for i in (i for i, g in enumerate(live) if g):
            self.params[i].mark_written()
            for name in self._group_slots(self._group_of[i]):
                self.state[i][name].mark_written()
        return loss

    def _key(self, group, st):
        """What must agree (besides the group) for parameters to share a launch."""
        return None

    def _group_slots(self, group):
        """The state tensors the rule keeps for a group's parameters (a subset of slot_names)."""
        return self.slot_names

    @property
    def slots(self):
        """The state tensors kept for some group's parameters, in slot_names' order."""
        used = set()
        for g in self.param_groups:
            used.update(self._group_slots(g))
        return tuple(s for s in self.slot_names if s in used)

    def launch_settings(self):
        """What decides which update launches a step makes, as netcl.TrainStep's guard compares it:
        the groups, their parameters and the settings that choose a kernel's branches (momentum on
        or off, nesterov, amsgrad, ...). Float settings (lr, betas, ...) are not in it: the kernels
        take them as arguments that a replay reads anew from the group."""
        return tuple((id(g), tuple(map(id, g["params"])), self._flags(g)) for g in self.param_groups)

    def _flags(self, group):
        return ()

    # -- the flat layout -------------------------------------------------------------------
    def _layout_holds(self):
        return self._slots == self.slots and all((p.on_device and p.buf is b) if b is not None else not p.on_device
                                                 for p, b in zip(self.params, self._placed))

    def _layout(self):
        """Move the parameters on devices into new flat buffers (per context, each at most a
        buffer's size), with gradient homes and state slots at the same offsets."""
        by_context = {}
        for i, p in enumerate(self.params):
            if p.on_device:
                by_context.setdefault(p.queue.context, []).append(i)
        self._flats, self._placed, self._slots = [], [None] * len(self.params), self.slots
        for indices in by_context.values():
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
        flat = Flat(q, indices, [self.params[i] for i in indices], self._slots)
        self._flats.append(flat)
        for k, i in enumerate(indices):
            p = self.params[i]
            p.adopt_(flat.region(flat.param, k, p.shape))
            self._placed[i] = p.buf
            p.grad_home = GradHome(flat.region(flat.grad, k, p.shape), flat, k)

    def _state_in_place(self, flat, k, st, names):
        """Make flat parameter k's state tensors `names` its regions of the slot buffers: new ones
        (zeros, or for SGD's momentum what the kernel writes), or state from elsewhere copied in."""
        for name in names:
            region, t = flat.state[k][name], st.get(name)
            if t is not region:
                st[name] = region.copy_(t) if t is not None else region.fill_(0.0) if self.zero_new_slots else region

    # -- checkpoints ---------------------------------------------------------------------
    def hyperparameters(self):
        """The optimizer's default settings ({name: value} as JSON values, the constructor's
        keyword arguments): what a checkpoint stores as the optimizer's "hyper"."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.defaults.items()}

    def state_dict(self):
        """torch's layout: {"state": {i: {"step": int, slot: numpy array}}, "param_groups": [{setting:
        value, ..., "params": [i, ...]}]}, i counting the parameters of every group in order."""
        state = {}
        for i, st in enumerate(self.state):
            if st:
                state[i] = {k: v.to_host() if isinstance(v, Tensor) else v for k, v in st.items()}
        groups, start = [], 0
        for g in self.param_groups:
            n = len(g["params"])
            groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": list(range(start, start + n))})
            start += n
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict):
        """Restore state_dict()'s groups' settings and state (a checkpoint's); the parameters stay
        this optimizer's (the groups must have as many). A bad state dict changes nothing."""
        sd = state_dict
        if not isinstance(sd, dict) or not isinstance(sd.get("state"), dict) or not isinstance(
                sd.get("param_groups"), (list, tuple)):
            raise ValueError("expected an optimizer state dict {'state': {...}, 'param_groups': [...]} "
                             "(optimizer.state_dict())")
        saved = sd["param_groups"]
        if len(saved) != len(self.param_groups):
            raise ValueError(f"the state dict has {len(saved)} parameter groups, the optimizer "
                             f"{len(self.param_groups)}")
        groups, ids = [], {}
        for n, (g, s) in enumerate(zip(self.param_groups, saved)):
            if not isinstance(s, dict) or not isinstance(s.get("params"), (list, tuple)) or \
                    len(s["params"]) != len(g["params"]):
                raise ValueError(f"parameter group {n} of the state dict does not match the optimizer's "
                                 f"({len(g['params'])} parameters)")
            new = {k: v for k, v in s.items() if k != "params"}
            for k in self.defaults:
                if k not in new:
                    raise ValueError(f"parameter group {n} of the state dict lacks {k!r}")
            groups.append(self._check_group(new))
            for saved_id in s["params"]:
                ids[saved_id] = len(ids)
        state = [dict() for _ in self.params]
        for key, entry in sd["state"].items():
            i = ids.get(key)
            if i is None or not isinstance(entry, dict):
                raise ValueError(f"optimizer state names parameter {key!r}, which no group of the state dict holds")
            p = self.params[i]
            for name, v in entry.items():
                if name == "step":
                    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                        raise ValueError(f"optimizer state {key}.step must be a non-negative int, got {v!r:.50}")
                    state[i][name] = int(v)
                elif name in self.slot_names:
                    a = np.asarray(v.to_host() if isinstance(v, Tensor) else v, np.float32)
                    if a.shape != p.shape:
                        raise ValueError(f"optimizer state {key}.{name} has shape {a.shape}, parameter has {p.shape}")
                    state[i][name] = Tensor.from_host(p.queue, a)
                else:
                    raise ValueError(f"optimizer state {key}.{name}: {type(self).__name__} keeps "
                                     f"{', '.join(('step',) + self.slot_names)}")
        for g, new in zip(self.param_groups, groups):
            params = g["params"]
            g.clear()
            g.update(params=params, **new)
        self.state = state
        return self


def update(q, name, n, *args):
    """Launch optim.cl's update `name` over n values: on CPUs its _cpu variant, a chunk of them per
    work-item (a work-group per 64 values cost PoCL a dispatch each), the chunk its last argument
    (the arguments before it keep their indices: ops.varies)."""
    if ops.is_cpu(q):
        chunk, items = ops.cpu_chunk(n)
        ops.launch(q, "optim", name + "_cpu", (items,), (1,), *args, chunk)
    else:
        ops.launch1d(q, "optim", name, n, *args)
