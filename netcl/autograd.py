"""Autograd: the tape that Tensor operations and layer calls record, and backward() that walks it.

An operation on tensors of which one `requires_grad` (while grad mode is on: see `no_grad`)
records a Node on its output: the inputs that need gradients, what its backward needs (saved
tensors, with their versions), and `backward(dy) -> (dx per input)`. `Tensor.backward()` collects
the nodes its tensor depends on and runs them newest first (reverse creation order, a valid
topological order), summing the gradients of a tensor used more than once, and adds each leaf's
into its `.grad` (a parameter's lands in its optimizer's buffer: ops.grad_target). A node frees
what it saved after its backward unless `retain_graph=True`; a second backward through it then
raises.

A layer with its own backward (every netcl layer, a Sequential of them) is recorded as one node
per call (LayerCall): its forward runs as it always did, with its fusions, and the attributes it
keeps for backward (its class's CALL_STATE, its children's too) are captured per call and put
back before that call's backward, so a layer called twice in one forward gets both gradients.
Inside such a call nothing else records.
"""
import functools
import itertools
import threading

from netcl import array_ops, ops
from netcl.tensor import FLOAT32, Tensor


class _Mode(threading.local):
    enabled = True  # grad mode: no_grad() turns it off
    inside = 0  # depth of layer calls recorded as one node (their inner work records nothing)
    tracer = None  # netcl.trace's recorder of operations and layer calls (netcl.nn.graph.Tracer), or None


_mode = _Mode()
MODE = _mode  # (read directly on hot paths: Module.__call__)

# name -> function of every operation a trace can record (traced()): what a GraphModule replays
TRACEABLE = {}


def tracer():
    """The tracer recording this thread's top-level operations, or None (nearly always)."""
    t = _mode.tracer
    return t if t is not None and not t.busy and not _mode.inside else None


def traced(name):
    """Register an operation under `name` for graphs; while netcl.trace runs, a call made by the
    traced code itself (not by another operation or a layer) is recorded as one node."""
    def wrap(fn):
        @functools.wraps(fn)
        def op(*args, **kwargs):
            t = _mode.tracer
            if t is None or t.busy or _mode.inside:
                return fn(*args, **kwargs)
            t.busy += 1
            try:
                out = fn(*args, **kwargs)
            finally:
                t.busy -= 1
            t.op(name, args, kwargs, out)
            return out
        if name in TRACEABLE:
            raise AssertionError(f"two operations named {name!r}")
        TRACEABLE[name] = op
        return op
    return wrap


def is_grad_enabled():
    """Whether grad mode is on (off inside netcl.no_grad())."""
    return _mode.enabled


def recording():
    """Whether an operation on a tensor that requires grad records a node here and now."""
    return _mode.enabled and not _mode.inside


class set_grad_enabled:
    """Grad mode on or off inside a `with` block (or a decorated function), then as before."""

    def __init__(self, mode):
        self.mode, self._prev = bool(mode), []

    def __enter__(self):
        self._prev.append(_mode.enabled)
        _mode.enabled = self.mode
        return self

    def __exit__(self, *exc):
        _mode.enabled = self._prev.pop()
        return False

    def __call__(self, fn):
        def wrapped(*args, **kwargs):
            with type(self)(self.mode) if type(self) is set_grad_enabled else type(self)():
                return fn(*args, **kwargs)
        wrapped.__name__, wrapped.__doc__ = fn.__name__, fn.__doc__
        return wrapped


class no_grad(set_grad_enabled):
    """Record nothing and save nothing for backward inside the block, as torch.no_grad()."""

    def __init__(self):
        super().__init__(False)


class enable_grad(set_grad_enabled):
    """Record again inside a no_grad block."""

    def __init__(self):
        super().__init__(True)


class _Inside:
    """The inner work of a layer call recorded as one node: nothing in it records."""

    def __enter__(self):
        _mode.inside += 1

    def __exit__(self, *exc):
        _mode.inside -= 1
        return False


inside_layer = _Inside()

_seq = itertools.count()


class Node:
    """One recorded operation. Subclasses implement backward(*dys) -> one gradient (or None) per
    input, dys one per output (None for an output no gradient reached; `takes_one` nodes may get
    ONE, the seed of a scalar root, instead of a tensor of ones)."""

    n_out = 1
    takes_one = False

    def __init__(self, inputs):
        self.inputs = tuple(_edge(t) for t in inputs)
        self.seq = next(_seq)
        self.saved, self.freed = (), False

    @property
    def wants(self):
        """Per input, whether it takes a gradient (inputs holds None for those that do not: a leaf
        tensor that requires grad, or the Edge to the node that made a non-leaf input)."""
        return tuple(t is not None for t in self.inputs)

    def save(self, *tensors):
        """Keep tensors for backward with their versions (an in-place change is caught there), as
        views without a node: a node that saves its own output must not hold itself (a cycle would
        keep the buffers from the pool until the garbage collector runs)."""
        self.saved = tuple((t.detach(), t.version) for t in tensors)

    def saved_tensors(self):
        """The tensors saved for backward; RuntimeError if one was changed in place since."""
        for i, (t, v) in enumerate(self.saved):
            if t.version != v:
                raise RuntimeError(f"a tensor that {self.name} saved for backward (number {i}, shape {t.shape}) was "
                                   f"changed in place after the forward (its version is {t.version}, it was {v}): "
                                   "compute the change out of place (x = x + y) instead")
        return tuple(t for t, _ in self.saved)

    @property
    def name(self):
        """The node's name in messages and reprs (e.g. MulBackward)."""
        return type(self).__name__

    def release(self):
        """Drop what backward needed (after a backward without retain_graph)."""
        self.saved, self.freed = (), True

    def backward(self, *dys):
        """The gradients of the inputs (None where an input takes none) from those of the outputs."""
        raise NotImplementedError(self.name)

    def __repr__(self):
        return f"<{self.name}>"


class Edge:
    """Where a gradient goes for an input an operation made: its node and output index (and shape).
    A node keeps this, not the input tensor: a loss held after its backward must not keep the step's
    activations alive."""

    __slots__ = ("_node", "_oi", "shape")

    def __init__(self, t):
        self._node, self._oi, self.shape = t._node, t._oi, t.shape


def _edge(t):
    """A node's record of input t: None (no gradient), t itself (a leaf), or an Edge."""
    if not (isinstance(t, Tensor) and t.requires_grad):
        return None
    return t if t._node is None else Edge(t)


class _One:
    """The gradient of a scalar root with respect to itself: 1, materialised only where needed."""

    def __repr__(self):
        return "ONE"


ONE = _One()


def attach(node, outputs):
    """Make `outputs` (tensors, or one tensor) the outputs of `node`; returns them."""
    outs = outputs if isinstance(outputs, tuple) else (outputs,)
    for k, y in enumerate(outs):
        if y is None:
            continue
        if y.dtype == FLOAT32:
            y.requires_grad, y._node, y._oi = True, node, k
    return outputs


def needs_record(*tensors):
    """Whether an operation on `tensors` records a node: grad mode on, outside a layer call, one
    of them a tensor that requires grad."""
    return recording() and any(isinstance(t, Tensor) and t.requires_grad for t in tensors)


def ones_like(t):
    """A device tensor of ones of t's shape."""
    return ops.new(t, t.shape).fill_(1.0)


def backward(root, gradient=None, retain_graph=False):
    """Tensor.backward: every leaf's gradient of `root` (weighted by `gradient`) added to its .grad."""
    if not root.requires_grad:
        raise RuntimeError("backward() of a tensor that does not require grad: nothing it was computed from "
                           "requires grad (frozen parameters, an input without requires_grad, or computed "
                           "under netcl.no_grad())")
    if gradient is None:
        if root.size != 1:
            raise RuntimeError(f"backward() without a gradient needs a tensor of one element (a loss), this one has "
                               f"shape {root.shape}: pass gradient= of that shape")
        g = ONE
    else:
        g = gradient if isinstance(gradient, Tensor) else Tensor.from_host(root.queue, gradient)
        if g.shape != root.shape:
            raise ValueError(f"backward(gradient): the gradient has shape {g.shape}, the tensor {root.shape}")
        g = g.to(root.queue) if g.queue is None else g
    if root._node is None:  # a leaf: its own gradient
        _accumulate_leaf(root, ones_like(root) if g is ONE else g)
        return
    nodes, seen, todo = [], set(), [root._node]
    while todo:
        n = todo.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        nodes.append(n)
        todo.extend(t._node for t in n.inputs if t is not None and t._node is not None)
    nodes.sort(key=lambda n: n.seq, reverse=True)
    grads = {id(root._node): {root._oi: g}}
    with set_grad_enabled(False):
        for node in nodes:
            gs = grads.pop(id(node), None)
            if gs is None:
                continue  # no gradient reaches it (an output nobody used)
            if node.freed:
                raise RuntimeError(f"backward through {node.name} a second time: its saved tensors were freed by the "
                                   "first backward; pass retain_graph=True to the first one to keep them")
            dys = [gs.get(k) for k in range(node.n_out)]
            if not node.takes_one and any(d is ONE for d in dys):  # the root, not a loss: its gradient made of ones
                dys = [ones_like(root) if d is ONE else d for d in dys]
            dxs = node.backward(*dys)
            for t, dx in zip(node.inputs, dxs):  # (a leaf Tensor or an Edge)
                if t is None or dx is None:
                    continue
                if dx.shape != t.shape:
                    raise AssertionError(f"{node.name} gave a gradient of shape {dx.shape} for an input of {t.shape}")
                if t._node is not None:
                    slot = grads.setdefault(id(t._node), {})
                    slot[t._oi] = dx if t._oi not in slot else array_ops.binary("add", slot[t._oi], dx)
                else:
                    _accumulate_leaf(t, dx)
            if not retain_graph:
                node.release()


def _accumulate_leaf(t, g):
    """t.grad += g (a new gradient where the optimizer keeps it: ops.grad_target)."""
    target, acc = ops.grad_target(t)
    if acc:
        ops.add(target, g, out=target)
    else:
        target.copy_(g)


# -- layers with their own backward, called as one node ---------------------------------------------
_LASTING = {"training", "_params", "_buffers", "_modules"}  # what a call never changes


def _call_state(m):
    """The attributes of layer m that a forward sets for its backward: its class's CALL_STATE for
    netcl's layers (a test checks they declare all of them); every attribute for a layer of the user's
    own with a backward (what its forward keeps is unknown)."""
    if type(m).__module__.startswith("netcl."):
        return type(m).CALL_STATE
    return tuple(k for k in vars(m) if k not in _LASTING)


def _capture(layer):
    """The per-call attributes of `layer` and every layer it holds."""
    out, todo = [], [layer]
    while todo:
        m = todo.pop()
        names = _call_state(m)
        if names:
            out.append((m, names, tuple(getattr(m, a, None) for a in names)))
        todo.extend(c for _, c in m.named_children())
    return out


def _restore(state):
    for m, names, values in state:
        for name, v in zip(names, values):
            object.__setattr__(m, name, v)  # (the values a forward left: no registration to redo)


class LayerCall(Node):
    """A call of a layer that has its own backward: backward restores what the call saved and runs
    layer.backward (or backward_params where its input needs no gradient)."""

    def __init__(self, layer, x, y):
        super().__init__((x,))
        self.layer, self.state = layer, _capture(layer)
        self.save(x, y, *layer.parameters())  # (y: the layer may keep its output for backward, as Sigmoid does)

    @property
    def name(self):
        """The node\'s name in messages and reprs."""
        return f"{type(self.layer).__name__} (a layer call)"

    def backward(self, dy):
        self.saved_tensors()  # the input and the parameters as the forward saw them
        _restore(self.state)
        if self.inputs[0] is None:
            self.layer.backward_params(dy)
            return (None,)
        return (self.layer.backward(dy),)

    def release(self):
        super().release()
        self.state = None


def call_layer(layer, x, kwargs):
    """layer.forward(x, **kwargs) recorded as one LayerCall node."""
    with inside_layer:
        y = layer.forward(x, **kwargs)
    if not isinstance(y, Tensor):
        raise TypeError(f"{type(layer).__name__}.forward returned {type(y).__name__}, autograd records layers that "
                        "return one Tensor")
    # a tensor object of its own: the layer may keep its output (Sigmoid saves it, Identity passes x),
    # and a node reachable from what it saved would be a reference cycle
    y = y.detach()
    return attach(LayerCall(layer, x, y), y)
