"""torch.nn.utils' gradient clipping, on the device: `clip_grad_norm_` and `clip_grad_value_`.

Gradients are read where they are. Those an optimizer keeps side by side in its flat gradient
buffer (netcl.optim.optimizer: every gradient after a backward, in a training loop) are walked as
runs of consecutive parameters, one launch per run, the zero padding between them included; any
other gradient is a run of its own. clip_grad_norm_ is then a partial reduction per run (partials
per gradient, in the caller's order, so that the norm has the same bits wherever the gradients
live: a resumed run clips as the uninterrupted one), one launch that reduces the partials to the
norm and the clip coefficient, and a scale per run: three launches in a training loop, nothing
read to the host (a run's table of gradients is uploaded once per layout)."""
import math

import numpy as np

from netcl import functions, ops
from netcl.tensor import INT32, Tensor

_KINDS = {2.0: 1, math.inf: 2, 1.0: 3}  # optim.cl's norm kinds; any other p is kind 0 (|g|^p)


def _gradients(parameters, what):
    """The gradients of `parameters` (a Tensor or an iterable of them) that have one, all on one device."""
    params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    for p in params:
        if not isinstance(p, Tensor):
            raise TypeError(f"{what} takes netcl Tensors (model.parameters()), got {type(p).__name__}")
    live = [p for p in params if p.grad is not None]
    for p in live:
        if not p.grad.on_device or p.grad.queue.context != live[0].grad.queue.context:
            raise ValueError(f"{what}: the gradients must be on one device")
    return live


def _runs(params):
    """[(buffer, [(index into params, element offset, length)])]: runs covering exactly the
    gradients of params (each once), consecutive parameters of one optimizer flat buffer whose
    gradients are in place together, each other gradient alone."""
    homed, runs = {}, []
    for i, p in enumerate(params):
        home = p.grad_home
        if home is not None and home.holds(p.grad):
            homed.setdefault(id(home.flat), (home.flat, {}))[1][home.k] = i
        else:
            runs.append((p.grad.buf, [(i, 0, p.grad.size)]))
    for flat, at in homed.values():
        ks = sorted(at)
        starts = [j for j, k in enumerate(ks) if j == 0 or k != ks[j - 1] + 1] + [len(ks)]
        for a, b in zip(starts, starts[1:]):
            runs.append((flat.grad, [(at[k], flat.offsets[k], flat.sizes[k]) for k in ks[a:b]]))
    return runs


def _span(segs):
    """(offset, length) of the buffer range a run's segments cover (with the padding between them)."""
    return segs[0][1], segs[-1][1] + segs[-1][2] - segs[0][1]


_tables = {}  # (context, run layout) -> its segment table on the device: uploaded once per layout


def _table(q, values):
    key = (q.context.int_ptr, tuple(values))
    t = _tables.get(key)
    if t is None:
        if len(_tables) >= 256:
            _tables.clear()
        t = _tables[key] = functions.tensor(np.array(values, np.int64), queue=q, dtype=INT32)
    return t


def _each(q, name, n, *args):
    """optim.cl's element-wise kernel `name` over n values: on CPUs its _cpu variant, a chunk per
    work-item (its last argument)."""
    if ops.is_cpu(q):
        chunk, items = ops.cpu_chunk(n)
        ops.launch(q, "optim", name + "_cpu", (items,), (1,), *args, chunk)
    else:
        ops.launch1d(q, "optim", name, n, *args)


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None):
    """Scale the gradients of `parameters` in place so that their total norm (of all of them as one
    vector) is at most max_norm, as torch.nn.utils.clip_grad_norm_: each is multiplied by
    min(max_norm / (norm + 1e-6), 1). Returns the total norm before clipping, a 0-d device Tensor
    (computed on the device and not read: float(norm) reads it). norm_type: p > 0, or inf for the
    largest magnitude. error_if_nonfinite=True reads the norm and raises RuntimeError where it is
    NaN or infinite (nothing is clipped then). foreach: accepted for torch's signature."""
    if isinstance(norm_type, str) and norm_type.lower() == "inf":
        norm_type = math.inf
    if isinstance(norm_type, bool) or not isinstance(norm_type, (int, float, np.integer, np.floating)) or \
            not (norm_type > 0) or math.isnan(norm_type):
        raise ValueError(f"norm_type must be a positive number or inf, got {norm_type!r}")
    if isinstance(max_norm, bool) or not isinstance(max_norm, (int, float, np.integer, np.floating)) or \
            math.isnan(max_norm):
        raise TypeError(f"max_norm must be a number, got {max_norm!r:.50}")
    live = _gradients(parameters, "clip_grad_norm_")
    if not live:
        return Tensor.from_host(None, np.zeros((), np.float32))
    q, p, cpu = live[0].grad.queue, float(norm_type), ops.is_cpu(live[0].grad.queue)
    kind = _KINDS.get(p, 0)
    # partials per gradient, in the caller's order (each gradient's the same wherever it lives)
    shares, count = [], 0
    for prm in live:
        n = prm.grad.size
        if cpu:
            chunk, items = ops.cpu_chunk(n)
        else:
            items = max(1, min(256, -(-n // 4096)))
            chunk = max(1, -(-n // items))
        shares.append((chunk, items, count))
        count += items
    runs = _runs(live)
    part, norm, coef = ops.new(q, (count,)), ops.new(q, ()), ops.new(q, ())
    for buf, segs in runs:
        table, first = [], 0
        for i, off, n in segs:
            chunk, items, slot = shares[i]
            table += [off, n, chunk, first, slot]
            first += items
        seg = _table(q, table)
        if cpu:
            ops.launch(q, "optim", "grad_norm_part_cpu", (first,), (1,), len(segs), seg, buf, part, kind, p)
        else:
            ops.launch(q, "optim", "grad_norm_part", (first * 64,), (64,), len(segs), seg, buf, part, kind, p)
    ops.launch(q, "optim", "grad_norm_total", (1,), (1,), count, part, norm, coef, kind, p, float(max_norm))
    norm.mark_written()
    if error_if_nonfinite and not math.isfinite(norm.item()):
        raise RuntimeError(f"the total norm of order {norm_type} of the gradients is non-finite, so it cannot be "
                           "clipped; error_if_nonfinite=False clips anyway")
    for buf, segs in runs:
        off, n = _span(segs)
        if n:
            _each(q, "grad_scale", n, off, n, buf, coef)
    for prm in live:
        prm.grad.mark_written()
    return norm


def clip_grad_value_(parameters, clip_value, foreach=None):
    """Clamp the gradients of `parameters` in place to [-clip_value, clip_value] on the device, as
    torch.nn.utils.clip_grad_value_ (NaN stays NaN). foreach: accepted for torch's signature."""
    if isinstance(clip_value, bool) or not isinstance(clip_value, (int, float, np.integer, np.floating)) or \
            math.isnan(clip_value):
        raise TypeError(f"clip_value must be a number, got {clip_value!r:.50}")
    live = _gradients(parameters, "clip_grad_value_")
    if not live:
        return
    q, c = live[0].grad.queue, float(clip_value)
    for buf, segs in _runs(live):
        off, n = _span(segs)
        if n:
            _each(q, "grad_clamp", n, off, n, buf, -c, c)
    for p in live:
        p.grad.mark_written()
