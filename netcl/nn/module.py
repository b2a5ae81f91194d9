"""Module: the layer protocol, and the helpers every layer module shares.

A layer class is the one place that says what the layer is:

    config()                     its constructor's keyword arguments (what a .netcl file records)
    tensor_shapes(**config)      (classmethod) its parameters' and buffers' names and shapes, in
                                 state_dict order, computed from the config alone: the constructor
                                 allocates from it, and the .netcl reader checks a file against it
                                 before building anything
    output_shape(shape)          the output shape, or ValueError (no device needed)
    forward(x) / backward(dy)    side by side; forward saves what backward needs
    named_children()             the layers it holds (a Sequential's, later a residual block's),
                                 and from_config(config, children) rebuilds it from them

Everything else (parameters, state_dict, load_state_dict, train/eval, moving to a device) is
derived here by walking that protocol, so that a layer never restates it. `chain()` is the one
walk the exporter and the fused planner share: the layers a model applies in order.
"""
import inspect
import math

import numpy as np

from netcl.runtime import default_queue
from netcl.tensor import Tensor, _as_float32

_rng = np.random.default_rng()


def manual_seed(seed):
    """Seed parameter initialisation and dropout masks."""
    global _rng
    _rng = np.random.default_rng(seed)


def rng():
    """netcl's random generator (initial weights, dropout masks; checkpoints save its state)."""
    return _rng


def set_rng(generator):
    global _rng
    _rng = generator


def uniform(bound, shape):
    """U(-bound, bound) drawn directly in float32 (no float64 temporary for large layers)."""
    a = _rng.random(shape, dtype=np.float32)
    a *= 2 * bound
    a -= bound
    return Tensor.from_host(None, a)


def constant(value, shape):
    return Tensor.from_host(None, np.full(shape, value, np.float32))


MAX_INT = 2**31 - 1  # int arguments: far past any real layer, and within the kernels' int arithmetic
MAX_PADDING = 4096  # padding beyond this is a mistake (10**6 would ask for terabytes), not a model


def as_int(name, v, low=-MAX_INT, high=MAX_INT):
    """An int argument in [low, high] (a square pair (k, k) is accepted as k), or a clear error;
    booleans are not ints here."""
    if isinstance(v, (tuple, list)):
        if len(v) == 2 and v[0] == v[1]:
            v = v[0]
        else:
            raise ValueError(f"{name} must be an int (square, symmetric), got {v!r}")
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    v = int(v)
    if not low <= v <= high:
        raise ValueError(f"{name} must be >= {low}, got {v}" if v < low and high == MAX_INT else
                         f"{name} must be between {low} and {high}, got {v}")
    return v


def positive(name, v):
    return as_int(name, v, 1)


def as_bool(name, v):
    """A bool argument (True or False, numpy's included): 1, "yes" or -8 are refused, not coerced."""
    if not isinstance(v, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool (True or False), got {type(v).__name__} {v!r:.50}")
    return bool(v)


def as_float(name, v, low=-math.inf, high=math.inf):
    """A float argument: a real, finite number (int or float, not a bool) in [low, high], or a clear error."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number, got {type(v).__name__} {v!r:.50}")
    v = float(v)
    if not low <= v <= high or not math.isfinite(v):  # NaN fails too
        raise ValueError(f"{name} must be in [{low}, {high}] and finite, got {v}")
    return v


def check_rank(layer, shape, rank, what):
    if len(shape) != rank:
        raise ValueError(f"{layer} expects a {rank}-D input {what}, got shape {tuple(shape)}")


def conv_out(size, k, s, p):
    """Output length of a convolution or pool window over `size` (PyTorch's floor rule)."""
    return (size + 2 * p - k) // s + 1


class ShapeError(ValueError):
    """A shape that does not fit a layer inside a block. `path` is relative to the block that
    raised it ("" for the block itself); each enclosing block prefixes its child's name (`at`),
    so the message a user sees names the full state_dict path: "layer 3.body.0 (Conv2d): ..."."""

    def __init__(self, path, kind, reason):
        self.path, self.kind, self.reason = path, kind, reason
        super().__init__(f"layer {path} ({kind}): {reason}" if path else f"{kind}: {reason}")

    def at(self, name):
        return ShapeError(f"{name}.{self.path}" if self.path else str(name), self.kind, self.reason)


def child_shape(name, layer, shape):
    """Child `name`'s output shape for `shape`; its ValueError becomes a ShapeError naming the path."""
    try:
        return tuple(layer.output_shape(shape))
    except ShapeError as e:
        raise e.at(name) from None
    except ValueError as e:
        raise ShapeError(name, type(layer).__name__, str(e)) from None


class Module:
    """Base class of every layer. Subclasses fill `_params`/`_buffers` (name -> Tensor, in
    state_dict order, as tensor_shapes declares them)."""

    def __init__(self):
        self.training = True
        self._params = {}
        self._buffers = {}

    # -- the protocol: what a layer declares ----------------------------------------------
    def config(self):
        """The constructor's keyword arguments (how .netcl files record the architecture)."""
        return {}

    @classmethod
    def tensor_shapes(cls, **config):
        """{name: shape} of the parameters, then the buffers, that a layer of this config holds."""
        return {}

    def named_children(self):
        """(name, layer) of the layers this one holds, in state_dict order."""
        return []

    @classmethod
    def from_config(cls, config, children):
        """The layer rebuilt from its config and its children ({name: layer}), as .netcl files do."""
        if children:
            raise ValueError(f"{cls.__name__} holds no layers, got children {list(children)}")
        return cls(**config)

    def output_shape(self, shape):
        """The output shape for an input of `shape` (no device needed); ValueError if it does not fit."""
        return tuple(shape)

    def macs(self, shape):
        """Multiply-accumulates of one forward for an input of `shape` (the batch included): the
        products of convolutions, Linear layers and attention; element-wise layers, normalisations
        and pooling count 0. What predict() sizes a call by (netcl.jit.plan); a model's cost at a
        glance. ValueError as output_shape() when the shape does not fit."""
        self.output_shape(shape)
        return 0

    def forward(self, x):
        raise NotImplementedError(type(self).__name__)

    def backward(self, dy):
        raise NotImplementedError(type(self).__name__)

    def backward_params(self, dy):
        """backward()'s parameter gradients without the input's (a model's first layer when its input
        needs no gradient, as PyTorch skips it for an input without requires_grad); returns None.
        Layers whose input gradient costs real work (Conv2d, Linear, Sequential) skip it; others
        run backward() and drop it."""
        self.backward(dy)

    # -- derived by walking the protocol ------------------------------------------------------
    def chain(self, prefix=""):
        """(path, layer) for each layer this one applies in order: itself here; a Sequential
        yields its layers' chains (nested Sequentials flattened), paths as in the state_dict."""
        yield prefix, self

    def named_parameters(self, prefix=""):
        out = [(prefix + k, t) for k, t in self._params.items()]
        for name, child in self.named_children():
            out += child.named_parameters(f"{prefix}{name}.")
        return out

    def named_buffers(self, prefix=""):
        out = [(prefix + k, t) for k, t in self._buffers.items()]
        for name, child in self.named_children():
            out += child.named_buffers(f"{prefix}{name}.")
        return out

    def parameters(self):
        return [p for _, p in self.named_parameters()]

    def named_tensors(self, prefix=""):
        """(key, Tensor) in state_dict order: each layer's parameters, then its buffers, then its children's."""
        return [(key, t) for key, t, _, _ in self._owned_tensors(prefix)]

    def _tensors(self):
        """Every tensor of this layer and its children (named_tensors' order, without the keys)."""
        out = list(self._params.values()) + list(self._buffers.values())
        for _, child in self.named_children():
            out += child._tensors()
        return out

    def _owned_tensors(self, prefix=""):
        """(key, Tensor, the layer that holds it, its name there), in state_dict order."""
        out = [(prefix + k, t, self, k) for k, t in list(self._params.items()) + list(self._buffers.items())]
        for name, child in self.named_children():
            out += child._owned_tensors(f"{prefix}{name}.")
        return out

    def from_torch_layout(self, name, array):
        """Tensor `name` given in PyTorch's layout -> netcl's (the same everywhere but Linear.weight)."""
        return array

    def state_dict(self):
        return {k: t.to_host() for k, t in self.named_tensors()}

    def load_state_dict(self, state):
        """Copy arrays into the parameters and buffers; every key must match, with its shape.
        Values that are torch tensors are read in PyTorch's layouts (Linear.weight (out, in)),
        anything else in netcl's (Linear.weight (in, out)): the type decides, never the shape,
        so a square matrix cannot slip through transposed. Everything is checked before
        anything changes."""
        if not isinstance(state, dict):
            raise TypeError(f"load_state_dict expects a dict of name -> array, got {type(state).__name__}")
        own = {key: (t, layer, name) for key, t, layer, name in self._owned_tensors()}
        missing = [k for k in own if k not in state]
        # PyTorch's BatchNorm counter has no netcl counterpart: torch state dicts load as they are
        unexpected = [k for k in state if k not in own and not k.endswith(".num_batches_tracked")]
        if missing or unexpected:
            raise ValueError(f"state_dict keys do not match the model: missing {missing}, unexpected {unexpected}")
        arrays = {}
        for k, (t, layer, name) in own.items():
            value, torch_layout = state[k], _is_torch_tensor(state[k])
            try:
                arrays[k] = _as_float32(value.detach().cpu().float().numpy() if torch_layout else value)
            except TypeError as e:
                raise TypeError(f"state_dict[{k!r}]: {e}") from None
            if torch_layout:
                try:
                    arrays[k] = np.ascontiguousarray(layer.from_torch_layout(name, arrays[k]))
                except ValueError as e:
                    raise ValueError(f"state_dict[{k!r}]: {e}") from None
            if arrays[k].shape != t.shape:
                raise ValueError(f"state_dict[{k!r}] has shape {arrays[k].shape}, the model expects {t.shape}")
        for k, (t, _, _) in own.items():
            t.set_(arrays[k])
        return self

    def zero_grad(self):
        """Drop every parameter's gradient (the next backward starts afresh), as torch.nn.Module."""
        for p in self.parameters():
            p.grad = None

    def train(self, mode=True):
        self.training = bool(mode)
        for _, child in self.named_children():
            child.train(mode)
        return self

    def eval(self):
        return self.train(False)

    def to(self, queue):
        """Move every parameter and buffer to `queue`'s device; returns the layer."""
        for _, t in self.named_tensors():
            t.to(queue)
        return self

    def extra_repr(self):
        return ", ".join(f"{k}={v!r}" for k, v in self.config().items())

    def __repr__(self):
        return f"{type(self).__name__}({self.extra_repr()})"

    def __call__(self, x):
        return self.forward(x)

    def _on(self, x):
        """The queue of input `x` (uploading a host tensor to the default queue), parameters moved there."""
        if not isinstance(x, Tensor):
            raise TypeError(f"{type(self).__name__} expects a netcl Tensor, got {type(x).__name__}")
        if x.queue is None:
            x.to(default_queue())
        q = x.queue
        for t in self._tensors():  # (a tensor on x's own queue needs no context comparison: the common case)
            tq = t.queue
            if tq is not q and (tq is None or tq.context != q.context):
                t.to(q)
        return q


def _is_torch_tensor(v):
    """A torch.Tensor, recognised without importing torch."""
    return any(c.__module__ == "torch" and c.__name__ == "Tensor" for c in type(v).__mro__)


def bound_config(cls, config):
    """`config` completed with the constructor's defaults (TypeError for unknown or missing keys)."""
    bound = inspect.signature(cls).bind(**config)
    bound.apply_defaults()
    return dict(bound.arguments)


def block_repr(name, children, extra=""):
    """A block's repr: its name, `extra` settings, then each (key, child) indented below."""
    body = "".join(f"\n  ({k}): " + repr(v).replace("\n", "\n  ") for k, v in children)
    return f"{name}({extra + ',' if extra else ''}{body}\n)"


class LayerList(Module):
    """Layers held in a list, keyed "0", "1", ... (Sequential, ModuleList): the list, its children,
    its rebuilding from a file and its repr."""

    def __init__(self, *layers):
        super().__init__()
        for i, layer in enumerate(layers):
            if not isinstance(layer, Module):
                raise TypeError(f"{type(self).__name__} takes netcl.nn layers; argument {i} is {type(layer).__name__}")
        self.layers = list(layers)

    def named_children(self):
        return [(str(i), layer) for i, layer in enumerate(self.layers)]

    @classmethod
    def from_config(cls, config, children):
        if config:
            raise ValueError(f"{cls.__name__} takes no config, got {config}")
        return cls(*children.values())

    def __repr__(self):
        return block_repr(type(self).__name__, self.named_children())
