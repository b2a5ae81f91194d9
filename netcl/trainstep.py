"""A training step as one call, replayed from a recording once it is known to repeat.

    step = netcl.TrainStep(model, loss_fn, optimizer)
    for x, y in batches:
        pending = step(x, y)          # forward, loss, backward, optimizer.step(), zero_grad()
    pending.item()                    # that step's mean loss

An eager step spends most of its host time in layer Python (about 30 us a launch on a 2-core CPU,
where the host competes with PoCL's workers for the cores). A step repeats itself: for the same
input shapes the same kernels run with the same arguments, on the same persistent buffers
(parameters, gradients, optimizer state) and on buffers that hold the step's intermediates. So
TrainStep runs the first call eagerly, records the device commands of the second and third
(runtime.Recorder: launches, fills, device copies), and when the two recordings agree command by
command (the same kernels, sizes and scalar arguments; buffers that correspond one to one) it
replays the third from then on: each launch a kernel object of its own with its arguments already
set, so a replay is one clEnqueueNDRangeKernel per launch (a few microseconds of host time). The
replay keeps its
intermediate buffers for itself (no other tensor can be given them), sharing them within the step
where the layer calls' pool did (_share_buffers).

On a CPU device a classifier's head (a Sequential's last layer, a Linear of at most 16 outputs,
with CrossEntropyLoss) runs as one kernel, CrossEntropyLoss.enqueue_linear (_head): the step's
results are then within float32 noise of the layer calls', and a replay equals the eager step.

Not replayed, run eagerly instead (after three recordings that did not agree; the reason in
`step.eager_reason`):
- steps whose recordings differ: a scalar argument that changes every step, unless the launch
  says how to draw it anew (ops.varies: a dropout seed from netcl's generator, Adam's bias
  corrections from its step count, both drawn as the layer calls would; an optimizer group's
  settings, read from the group, so that a learning-rate schedule replays), or control flow that
  changes;
- steps that move data between host and device in the middle (a layer reading a value), or
  draw from netcl's generator other than through ops.varies (a replay would not draw, and every
  later seed would differ).
A buffer that held data before a recording began (a parameter, a gradient, optimizer state, the
inputs) must be the same buffer in both recordings: state a layer carries from step to step in a
new buffer each time would otherwise be read from one buffer for ever.
Before each replay the step checks what it cannot see in the recording: the input shapes, every
layer's plain public settings and Tensor attributes, its parameters' and buffers' device buffers,
the layers each container holds, the optimizer's parameter groups and the settings that choose
its launches (launch_settings(): momentum on or off, amsgrad, ...), its parameter list, state (a
loaded checkpoint is new state) and step counts, every parameter's gradient (the model's and the
optimizer's), and the process-wide switches that
choose training kernels (_knobs). Any change records anew (two eager calls). A gradient the user
still holds from an eager backward moves to a buffer of its own first, as the next backward would
move it. Between calls, a layer's Python is not run: state it keeps in Python from step to step
(a counter, a schedule) is frozen at the recording; changes through private attributes or to the
kernels' sources are not seen."""
import copy
import os
import threading

import numpy as np

from netcl import autograd, buildhelper, nn, ops, optim
from netcl.nn import sequential
from netcl.nn.module import rng
from netcl.nn.loss import CrossEntropyLoss, PendingLoss
from netcl.runtime import Recorder, copy_kernel, kernel_arg_types, tiers
from netcl.tensor import Tensor, _upload

_RECORD_AT = 2  # calls of a shape run eagerly before the first recording (the first builds and lays out)
_TRIES = 3  # recordings of a shape that may disagree before it stays eager
_SHAPES = 4  # input shapes kept recorded at once (the oldest dropped first)
_SCALARS = (bool, int, float, str, type(None))
# Most rows x inputs of a classifier's head run as one kernel (_head): it runs on one core, and
# past this its six launches on both cores are as fast (tuning.json's note on _HEAD_MAX)
_HEAD_MAX = 1 << 16


class TrainStep:
    """forward, loss (`loss_fn.enqueue`), backward (no input gradient), `optimizer.step()`,
    `optimizer.zero_grad()`; a call returns the step's PendingLoss. See the module docstring for
    when a call replays a recording. `replay=False` always runs eagerly (a reference); the default
    is True unless the environment has NETCL_TRAIN_REPLAY=0 (or false, no, off).

    x: a device Tensor (used in place) or a host array (uploaded into a buffer the step keeps);
    target: the loss's target, likewise (CrossEntropyLoss: class indices, checked on the host).
    `step.output` is the call's model output, a device Tensor that the next call overwrites (as
    the loss's gradient). Calls from several threads take turns."""

    def __init__(self, model, loss_fn, optimizer, replay=None):
        if not isinstance(model, nn.Module):
            raise TypeError(f"TrainStep trains a netcl nn.Module, got {type(model).__name__}")
        if not isinstance(optimizer, optim.Optimizer):
            raise TypeError(f"TrainStep needs a netcl optimizer (optim.SGD, optim.Adam, ...), got "
                            f"{type(optimizer).__name__}")
        if not callable(getattr(loss_fn, "enqueue", None)) or not callable(getattr(loss_fn, "check_target", None)):
            raise TypeError(f"TrainStep needs a netcl loss (nn.MSELoss(), nn.CrossEntropyLoss(), ...), got "
                            f"{type(loss_fn).__name__}")
        if replay is None:  # NETCL_TRAIN_REPLAY=0: every TrainStep runs the layer calls (e.g. netcl train's)
            replay = os.environ.get("NETCL_TRAIN_REPLAY", "1").strip().lower() not in ("0", "false", "no", "off")
        self.model, self.loss_fn, self.optimizer, self.replay = model, loss_fn, optimizer, bool(replay)
        self.replays, self.eager_reason = 0, None  # replayed calls so far; why the last shape stays eager
        self.output = None  # the last call's model output (a device Tensor the next call overwrites)
        self._lock = threading.Lock()
        self._shapes = {}  # (x shape, queue) -> _Shape
        self._owned = {}  # ("x" or "target", shape, queue) -> a device Tensor host inputs are uploaded into

    def __call__(self, x, target):
        if not self.model.training:
            raise ValueError("TrainStep trains the model: call model.train() first (it is in eval mode)")
        with self._lock:
            q = self._queue(x)
            xt = self._on_device("x", q, x, None)
            key = (xt.shape, q)
            sh = self._shapes.pop(key, None) or _Shape()
            self._shapes[key] = sh  # most recently used last
            if len(self._shapes) > _SHAPES:
                del self._shapes[next(iter(self._shapes))]
            rp = sh.replay
            if rp is not None and rp.guard.holds():  # the model's output shape is still rp's
                tt = self._on_device("target", q, target, rp.out_shape)
                if rp.accepts(xt, tt):
                    self.replays += 1
                    return rp.run(self, xt, tt)
            else:
                tt = self._on_device("target", q, target, self._output_shape(sh, xt))
            sh.replay = None
            if not self.replay or sh.given_up:
                return self._eager(xt, tt, None)[0]
            sh.calls += 1
            if sh.calls < _RECORD_AT:
                with buildhelper.first_call(self, xt, tt):  # a second process shares its builds (cold cache)
                    return self._eager(xt, tt, None)[0]
            pending, rec = self._eager(xt, tt, Recorder())
            if rec.refused is not None:
                why, sh.recording = f"the step makes {rec.refused} in the middle", None
            elif sh.recording is None:
                sh.recording = rec
                return pending
            else:
                why = _differs(sh.recording, rec)
                if why is None:
                    sh.replay, sh.recording, self.eager_reason = _Replay(self, rec, xt, tt), None, None
                    return pending
                sh.recording = rec
            sh.tries += 1
            if sh.tries >= _TRIES:  # this shape's step does not repeat: eager from now on
                sh.given_up, sh.recording, self.eager_reason = True, None, why
            return pending

    @property
    def launches(self):
        """Device commands a replay of the most recent input shape enqueues (None: not replaying it)."""
        sh = next(reversed(self._shapes.values()), None)
        return len(sh.replay.commands) if sh is not None and sh.replay is not None else None

    # -- the eager step -----------------------------------------------------------------------
    def _eager(self, xt, tt, rec):
        """The step as layer calls (rec: recording its device commands); (its PendingLoss, rec)."""
        steps = [st.get("step", 0) for st in self.optimizer.state]
        if rec is not None:
            rec.inputs = {xt.buf.int_ptr: "x", tt.buf.int_ptr: "target"}
            gen, drawn_from = rng(), copy.deepcopy(rng().bit_generator.state)
            rec.start()
        try:
            head = _head(self.model, self.loss_fn, xt)
            if not self.model.records_as_one():  # a module with a forward of its own: through autograd
                self.output = self.model(xt)
                pending = self.loss_fn.enqueue(self.output, tt)
                if self.output.requires_grad:
                    self.output.backward(self.loss_fn.backward())
            elif head is None:
                self.output = self.model(xt)
                pending = self.loss_fn.enqueue(self.output, tt)
                self.model.backward(self.loss_fn.backward(), input_grad=False)
            else:  # the classifier's Linear and the loss as one kernel
                body, linear = head
                needs_dx = bool(body.parameters())
                self.output, pending, dh = self.loss_fn.enqueue_linear(linear, body(xt), tt, input_grad=needs_dx)
                if needs_dx:
                    body.backward(dh, input_grad=False)
            self.optimizer.step()
            self.optimizer.zero_grad()
        finally:
            if rec is not None:
                rec.stop()
        if rec is not None:
            rec.pending = pending
            rec.step_delta = [st.get("step", 0) - s for st, s in zip(self.optimizer.state, steps)]
            if not _draws_only_varying(rec, gen, drawn_from):
                rec.refuse("draws from netcl's generator that ops.varies does not declare (a replay would not make them)")
        return _own_loss(pending, pending._out), rec

    # -- inputs -------------------------------------------------------------------------------
    def _output_shape(self, sh, xt):
        """The model's output shape for input xt: its layers say it, or (a module with a forward of its
        own) a forward in eval mode without autograd tells it, once per input shape."""
        if self.model.records_as_one():
            return self.model.output_shape(xt.shape)
        if sh.out_shape is None:
            modules = self.model.modules()
            modes = [m.training for m in modules]
            try:
                for m in modules:
                    m.training = False  # (the flag alone: train() would also remake fused plans)
                with autograd.no_grad():
                    sh.out_shape = self.model(xt).shape
            finally:
                for m, mode in zip(modules, modes):
                    m.training = mode
        return sh.out_shape

    def _queue(self, x):
        if isinstance(x, Tensor) and x.on_device:
            return x.queue
        for p in self.optimizer.params:
            if p.on_device:
                return p.queue
        raise ValueError("TrainStep: the model is on the host; move it to a device first (model.to(queue))")

    def _on_device(self, role, q, value, out_shape):
        """value as a device Tensor on q: a device Tensor there as it is, else checked (target: as
        the loss checks it) and uploaded into the step's own buffer for that role and shape."""
        if isinstance(value, Tensor) and value.on_device:
            if value.queue.context != q.context:
                raise ValueError(f"TrainStep: the {role} is on another device than the model")
            return value
        if role == "x":
            a = np.asarray(value.to_host() if isinstance(value, Tensor) else value, np.float32)
        else:  # (class indices as float32, as the loss kernels read them)
            a = self.loss_fn.check_target(value, out_shape)
        key = (role, a.shape, q)
        t = self._owned.pop(key, None)
        if t is None:
            t = Tensor.empty(q, a.shape)
        self._owned[key] = t  # most recently used last
        if len(self._owned) > 2 * _SHAPES:
            del self._owned[next(iter(self._owned))]
        if a is value or a.base is not None or not a.flags.c_contiguous:
            a = np.array(a, np.float32, order="C")  # the caller's memory: they may refill it once we return
        if a.size:
            _upload(q, t.buf, a.reshape(-1))
        t.mark_written()
        t._st.host = a.reshape(-1)  # exactly the data, and kept alive while the upload may read it
        return t


def _head(model, loss_fn, x):
    """(the model's layers before the last, its last) where the step runs the last, a Linear of at
    most 16 outputs on (N, in) rows, and the cross-entropy as one kernel (CrossEntropyLoss.
    enqueue_linear; a CPU device, N * in <= _HEAD_MAX, training fusions on: sequential.TRAIN_FUSE);
    else None. Six launches of a few microseconds' arithmetic each become one
    (tuning.json's note on _HEAD_MAX)."""
    if not (sequential.TRAIN_FUSE and type(loss_fn) is CrossEntropyLoss and loss_fn.plain
            and type(model) is nn.Sequential and len(model) >= 2 and type(model.layers[-1]) is nn.Linear and model.layers[-1].out_features <= 16
            and ops.is_cpu(x.queue)):
        return None
    body = nn.Sequential(*model.layers[:-1])  # not model[:-1]: its train() would set every layer's mode
    body.training = model.training
    rows = body.output_shape(x.shape)
    return (body, model.layers[-1]) if len(rows) == 2 and rows[0] * rows[1] <= _HEAD_MAX else None


def _draws_only_varying(rec, gen, before):
    """Whether the recorded step drew from netcl's generator (gen, whose state was `before`) exactly
    what its ops.varies functions draw: they alone draw in a replay. Checked by running them from
    `before` and comparing the generator's state (then put back as the step left it)."""
    if rng() is not gen:
        return False  # the step replaced the generator
    after = gen.bit_generator.state
    gen.bit_generator.state = before
    try:
        for _, fn in (rec.varying[i] for i in sorted(rec.varying)):
            fn()
        return gen.bit_generator.state == after
    finally:
        gen.bit_generator.state = after


def _knobs(generation=None):
    """Process-wide switches that choose training kernels: NETCL_CPU_WINOT (read by each Conv2d
    call, nn/conv.py), Sequential's TRAIN_FUSE (nn/sequential.py), and the kernel tiers' generation
    (netcl.runtime.tiers: once kernels built in the background are ready, layers choose anew;
    `generation`: the one a recording began with, else the current one)."""
    generation = tiers.generation() if generation is None else generation
    return os.environ.get("NETCL_CPU_WINOT"), sequential.TRAIN_FUSE, generation


def _plain(v):
    """A setting compared by value: a Python or numpy scalar, or a tuple of them."""
    return type(v) in _SCALARS or isinstance(v, np.generic) or (
        type(v) is tuple and all(type(e) in _SCALARS or isinstance(e, np.generic) for e in v))


class _Guard:
    """What a replay depends on beyond its recorded commands, read when it is made; holds() says
    whether all of it is still so: every layer's plain public settings (training, stride, eps,
    ...), its parameters, buffers and public Tensor attributes (the same Tensors on the same
    device buffers), the layers a
    container holds, the optimizer's launch_settings(), its parameters' buffers and state tensors,
    and that no gradient is set."""

    def __init__(self, model, optimizer, generation=None):
        self.settings, self.tensors, self.children = [], [], []
        stack = [model]
        while stack:
            m = stack.pop()
            for k, v in vars(m).items():
                if not k.startswith("_") and _plain(v):
                    self.settings.append((m, k, v))
                elif not k.startswith("_") and isinstance(v, Tensor):  # a layer's own reference (Linear.weight)
                    self.tensors.append((vars(m), k, v, v._st.buf))
            for d in (m._params, m._buffers):
                self.tensors.append((d, len(d), None, None))
                self.tensors.extend((d, k, t, t._st.buf) for k, t in d.items())
            kids = [c for _, c in m.named_children()]
            if kids:
                self.children.append((m, kids))
            stack.extend(kids)
        self.optimizer, self.launch_settings = optimizer, optimizer.launch_settings()
        self.containers = (optimizer.params, optimizer.state, list(optimizer.params), list(optimizer.state))
        for p, st in zip(optimizer.params, optimizer.state):
            self.tensors.append((None, p, p, p._st.buf))
            self.tensors.extend((st, k, v, v._st.buf) for k, v in st.items() if isinstance(v, Tensor))
        # every parameter's gradient, the optimizer's or not (a frozen layer's accumulates)
        params = model.parameters()
        params += [p for p in optimizer.params if not any(p is q for q in params)]
        self.grads = [(p, p.grad) for p in params]
        self.steps = [st.get("step") for st in optimizer.state]  # a replay advances them (see _Replay.run)
        self.knobs = _knobs(generation)

    def holds(self):
        for m, k, v in self.settings:
            w = getattr(m, k, self)
            if w is not v and (type(w) is not type(v) or w != v):
                return False
        for d, k, t, buf in self.tensors:
            if t is None:
                if len(d) != k:
                    return False
            elif d is None:
                if t._st.buf is not buf:
                    return False
            elif d.get(k) is not t or t._st.buf is not buf:
                return False
        if any([c for _, c in m.named_children()] != kids for m, kids in self.children):
            return False
        params, state, param_list, state_list = self.containers
        opt = self.optimizer
        if opt.params is not params or opt.state is not state or len(params) != len(param_list) or \
                any(a is not b for a, b in zip(params, param_list)) or any(a is not b for a, b in zip(state, state_list)):
            return False  # e.g. optimizer.load_state_dict(), which makes new state dicts
        if any(p.grad is not g for p, g in self.grads):
            return False
        if any(st.get("step") != t for st, t in zip(opt.state, self.steps)):
            return False  # a step count set by hand (Adam's corrections, how its runs split)
        return opt.launch_settings() == self.launch_settings and _knobs() == self.knobs


def _own_loss(pending, out):
    """A PendingLoss reading a copy of `out` (the loss's 2-float result) made now: later steps
    (a replay rewrites `out`) cannot change what it reads."""
    return PendingLoss(Tensor.empty(out.queue, out.shape).copy_(out), pending._count, pending._refuse)


class _Shape:
    __slots__ = ("calls", "recording", "replay", "tries", "given_up", "out_shape")

    def __init__(self):
        self.calls, self.recording, self.replay, self.tries, self.given_up = 0, None, None, 0, False
        self.out_shape = None  # a module with a forward of its own: its output shape, once known


def _differs(a, b):
    """None if recordings a and b are the same step (commands, sizes and scalars equal, buffers
    corresponding one to one), else what differs first."""
    import pyopencl as cl

    if len(a.commands) != len(b.commands):
        return f"{len(a.commands)} device commands, then {len(b.commands)}"
    fwd, back = {}, {}

    def same_buffer(x, y):
        """x (in a) and y (in b) correspond: one to one, and a buffer that held data before its
        recording began (not made during it) must be the same one: if step 2 reads S1 and writes
        S2, and step 3 reads S2, a replay of step 3 would read S2 for ever (state carried between
        steps in new buffers). The inputs correspond by their role."""
        kx, ky = x.int_ptr, y.int_ptr
        if fwd.setdefault(kx, ky) != ky or back.setdefault(ky, kx) != kx:
            return False
        if kx in a.allocated and ky in b.allocated:
            return True
        return kx == ky or (a.inputs.get(kx) is not None and a.inputs.get(kx) == b.inputs.get(ky))

    for i, (ca, cb) in enumerate(zip(a.commands, b.commands)):
        if ca[0] != cb[0] or (ca[0] == "launch" and (ca[1] is not cb[1] or ca[2:4] != cb[2:4])):
            name = ca[1].function_name if ca[0] == "launch" else ca[0]
            return f"command {i} ({name}) changed"
        args_a, args_b = (ca[4], cb[4]) if ca[0] == "launch" else (ca[1:], cb[1:])
        if len(args_a) != len(args_b):
            return f"command {i} changed its arguments"
        va, vb = a.varying.get(i), b.varying.get(i)
        if (va and va[0]) != (vb and vb[0]):
            return f"command {i} changed which arguments vary"
        for j, (x, y) in enumerate(zip(args_a, args_b)):
            if va and j in va[0]:
                continue  # drawn anew for every step (ops.varies)
            if isinstance(x, cl.MemoryObjectHolder) and isinstance(y, cl.MemoryObjectHolder):
                ok = same_buffer(x, y)
            elif isinstance(x, cl.LocalMemory) and isinstance(y, cl.LocalMemory):
                ok = x.size == y.size
            else:
                ok = type(x) is type(y) and x == y
            if not ok:
                name = ca[1].function_name if ca[0] == "launch" else ca[0]
                return f"argument {j} of command {i} ({name}) changed: {x!r} then {y!r}"
    if a.step_delta != b.step_delta:
        return "the optimizer stepped other parameters"
    return None


class _Replay:
    """A recording made replayable: per launch a kernel of its own with the arguments set."""

    def __init__(self, step, rec, xt, tt):
        import pyopencl as cl

        self.queue = xt.queue
        self.commands = []
        inputs = {"x": xt.buf.int_ptr, "target": tt.buf.int_ptr}
        self.bindings = {"x": [], "target": []}  # role -> [(kernel, argument index)] that read it
        self.varying = []  # (kernel, argument indices, their dtypes, fn), in command order
        commands = _share_buffers(rec)
        for n, c in enumerate(commands):
            if c[0] == "launch":
                k = copy_kernel(c[1])
                k.set_args(*c[4])
                if n in rec.varying:
                    indices, fn = rec.varying[n]
                    types = kernel_arg_types(c[1])
                    self.varying.append((k, indices, [types[j] for j in indices], fn))
                for _, j, a in _buffers(c):
                    for role, ptr in inputs.items():
                        if a.int_ptr == ptr:
                            self.bindings[role].append((k, j))
                self.commands.append((cl.enqueue_nd_range_kernel, (self.queue, k, c[2], c[3])))
            elif c[0] == "fill":
                self.commands.append((cl.enqueue_fill_buffer, (self.queue, c[1], c[2], 0, c[3])))
            else:
                self.commands.append((_copy, (self.queue, c[1], c[2], c[3])))
        self.keep = commands  # the arguments' buffers: alive as long as the replay
        self.bound, self.out_shape = {"x": xt, "target": tt}, step.output.shape
        self.out, self.pending, self.output = rec.pending._out, rec.pending, step.output
        self.step_delta = rec.step_delta
        self.written = [t for _, t in step.model.named_tensors()] + [
            v for st in step.optimizer.state for v in st.values() if isinstance(v, Tensor)]
        self.written += [p.grad for p in step.model.parameters() if p.grad is not None]
        if isinstance(getattr(step.loss_fn, "_grad", None), Tensor):
            self.written.append(step.loss_fn._grad)
        self.homes = [p for p in step.optimizer.params if p.grad_home is not None]
        self.guard = _Guard(step.model, step.optimizer, rec.generation)
        if any(c[0] == "copy" and set(inputs.values()) & {c[1].int_ptr, c[2].int_ptr} for c in commands):
            self.bindings = None  # an input in a copy: replay only with the same input buffers

    def accepts(self, xt, tt):
        """Whether the replay can read these inputs: its own, or others it can bind in their place."""
        if tt.shape != self.bound["target"].shape:
            return False
        same = xt.buf is self.bound["x"].buf and tt.buf is self.bound["target"].buf
        return same or (self.bindings is not None and xt.buf.int_ptr != tt.buf.int_ptr)

    def run(self, step, xt, tt):
        for p in self.homes:  # a gradient lent before and still held moves out first, as lend() does
            if p.grad_home._lent is not None and p.grad_home._lent() is not None:
                p.grad_home._free()
        for role, t in (("x", xt), ("target", tt)):
            if t.buf is not self.bound[role].buf:
                for k, j in self.bindings[role]:
                    k.set_arg(j, t.buf)
                self.bound[role] = t
        for i, (st, d) in enumerate(zip(step.optimizer.state, self.step_delta)):
            if d:
                st["step"] += d
                self.guard.steps[i] = st["step"]
        for k, indices, types, fn in self.varying:  # after the step counts: Adam's corrections read them
            for j, t, v in zip(indices, types, fn()):
                k.set_arg(j, t(v))
        for enqueue, args in self.commands:
            enqueue(*args)
        for t in self.written:
            t.mark_written()
        step.output = self.output.mark_written()
        return _own_loss(self.pending, self.out)


def _buffers(c):
    """The buffers a recorded command names, with their places: [(field, argument index, buffer)]."""
    import pyopencl as cl

    if c[0] == "launch":
        return [(4, j, a) for j, a in enumerate(c[4]) if isinstance(a, cl.MemoryObjectHolder)]
    return [(1, None, c[1])] + ([(2, None, c[2])] if c[0] == "copy" else [])


def _own_refs():
    """What sys.getrefcount(objs[p]) counts beyond the commands' references: the dict's and the
    call's own (2 on CPython 3.11; measured, since Python versions count call arguments differently)."""
    import sys

    probe = object()
    objs, places = {0: probe}, (probe,)
    del probe
    return sys.getrefcount(objs[0]) - len(places)


def _share_buffers(rec):
    """rec's commands with buffers shared within the step where the layer calls' pool shared them:
    the recording kept every buffer the step made (so that none went back to the pool), which holds
    about twice the layer calls' memory. A buffer made during the recording that nothing but the
    recording references (not the model's output, the loss, a layer's saved tensor: sys.getrefcount)
    takes the place of an earlier one whose last command came before its first, if that one is as
    large. On an in-order queue its commands then run after the earlier one's, as in the pool."""
    import sys

    first, last, objs, uses = {}, {}, {}, {}
    for n, c in enumerate(rec.commands):
        for _, _, b in _buffers(c):
            p = b.int_ptr
            if p in rec.allocated:
                first.setdefault(p, n)
                last[p] = n
                if objs.setdefault(p, b) is not b:
                    uses[p] = -1  # two objects for one buffer: leave it alone
                elif uses.get(p, 0) >= 0:
                    uses[p] = uses.get(p, 0) + 1
    b, own = None, _own_refs()
    private = [p for p in first if uses[p] > 0 and sys.getrefcount(objs[p]) == uses[p] + own]
    slots, rename = [], {}  # slots: [buffer, the last command that uses it]
    for p in sorted(private, key=first.get):
        size = objs[p].size
        free = [sl for sl in slots if sl[1] < first[p] and sl[0].size >= size]
        if free:
            sl = min(free, key=lambda sl: sl[0].size)
            rename[p], sl[1] = sl[0], last[p]
        else:
            slots.append([objs[p], last[p]])
    out = []
    for c in rec.commands:
        places = [(field, j, rename[b.int_ptr]) for field, j, b in _buffers(c) if b.int_ptr in rename]
        if places:
            c, args = list(c), list(c[4]) if c[0] == "launch" else None
            for field, j, b in places:
                if j is None:
                    c[field] = b
                else:
                    args[j] = b
            if args is not None:
                c[4] = tuple(args)
            c = tuple(c)
        out.append(c)
    return out


def _copy(queue, dst, src, nbytes):
    import pyopencl as cl

    cl.enqueue_copy(queue, dst, src, byte_count=nbytes)
