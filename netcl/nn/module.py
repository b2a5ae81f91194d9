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
import warnings
from collections import namedtuple

import numpy as np

from netcl import autograd
from netcl.rng import manual_seed, rng, set_rng  # noqa: F401 (manual_seed, set_rng: re-exported)
from netcl.runtime import default_queue
from netcl.tensor import FLOAT32, Tensor, _as_float32


class Parameter(Tensor):
    """A tensor a Module registers as its parameter when assigned to one of its attributes (as
    torch.nn.Parameter): it requires grad unless requires_grad=False. `data` is an array-like
    (copied) or a Tensor (shared: the parameter is that tensor's storage)."""

    __slots__ = ()

    def __init__(self, data=None, requires_grad=True):
        if isinstance(data, Tensor):
            super().__init__(data.shape, dtype=data.dtype)
            self._st = data.storage
        else:
            a = _as_float32(np.zeros(0, np.float32) if data is None else data)
            super().__init__(a.shape, None, None, a.copy())
        if self.dtype != FLOAT32:
            raise TypeError(f"a Parameter holds float32, got {self.dtype}")
        self.requires_grad = bool(requires_grad)

    def __repr__(self):
        return "Parameter containing:\n" + super().__repr__()


def uniform(bound, shape):
    """A Parameter of U(-bound, bound), drawn directly in float32 (no float64 temporary for large layers)."""
    a = rng().random(shape, dtype=np.float32)
    a *= 2 * bound
    a -= bound
    return Parameter(Tensor.from_host(None, a))


def constant(value, shape, parameter=True):
    """A Parameter (or, parameter=False, a buffer) of `shape` filled with `value`."""
    t = Tensor.from_host(None, np.full(shape, value, np.float32))
    return Parameter(t) if parameter else t


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


def int_or_pair(name, v, low=-MAX_INT, high=MAX_INT):
    """An int, or a pair (a, b) of ints in [low, high] for height and width (PyTorch's _pair); a
    square pair (k, k) comes back as k, so square, symmetric geometries keep the int their routes read."""
    if isinstance(v, (tuple, list)):
        if len(v) != 2:
            raise ValueError(f"{name} must be an int or a pair of ints, got {v!r:.50}")
        a, b = (as_int(name, x, low, high) for x in v)
        return a if a == b else (a, b)
    return as_int(name, v, low, high)


def pair(v):
    """(a, b) of an int_or_pair value."""
    return tuple(v) if isinstance(v, tuple) else (v, v)


def positive(name, v):
    """An int argument of at least 1, or a clear error."""
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
    """ValueError unless `shape` has `rank` dimensions."""
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
        """The error as seen from the block that holds the layer at `name` (the path gains it)."""
        return ShapeError(f"{name}.{self.path}" if self.path else str(name), self.kind, self.reason)


def child_shape(name, layer, shape):
    """Child `name`'s output shape for `shape`; its ValueError becomes a ShapeError naming the path."""
    try:
        return tuple(layer.output_shape(shape))
    except ShapeError as e:
        raise e.at(name) from None
    except ValueError as e:
        raise ShapeError(name, type(layer).__name__, str(e)) from None


IncompatibleKeys = namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])
LAYERS = {}  # class name -> layer type that files and graphs can hold (netcl.nn fills it)
_OWN_BACKWARD = {}  # class -> whether its forward and backward are defined together (_own_backward)


def _own_backward(cls):
    """"own" where cls differentiates its own forward (a backward defined by the class that defines
    forward, or by a subclass of it), "none" where no class but Module defines a backward (a user's
    model: autograd records its operations), "mismatch" where a subclass overrides forward alone."""
    own = _OWN_BACKWARD.get(cls)
    if own is None:
        mro = cls.__mro__
        fwd = next(c for c in mro if "forward" in vars(c))
        bwd = next(c for c in mro if "backward" in vars(c))
        own = "none" if bwd is Module else "own" if issubclass(bwd, fwd) else "mismatch"
        _OWN_BACKWARD[cls] = own
    return own


class Module:
    """Base class of every layer and model, as torch.nn.Module: attributes that are layers,
    Parameters or registered buffers register themselves (state_dict keys are their attribute
    paths). netcl's layers also declare the layer protocol above; a subclass that only writes
    __init__ and forward is differentiated by autograd through the operations its forward runs.

    CALL_STATE names the attributes a forward sets for its backward: autograd keeps them per call
    (netcl.autograd.LayerCall), so a layer called twice in one forward has both calls' gradients."""

    CALL_STATE = ("_saved",)
    HOLDS_ONLY = False  # a container that is never called itself (ModuleList, ModuleDict)
    IS_GRAPH = False  # a traced graph (nn.GraphModule): files and the exporter read its nodes

    def __init__(self):
        d = self.__dict__
        d["training"], d["_params"], d["_buffers"], d["_modules"] = True, {}, {}, {}

    def __setattr__(self, name, value):
        d = self.__dict__
        if isinstance(value, (Parameter, Module)):
            if "_modules" not in d:
                raise AttributeError(f"cannot assign {type(value).__name__} {name!r} before Module.__init__() is "
                                     f"called: call super().__init__() first in {type(self).__name__}.__init__")
            registry = d["_params"] if isinstance(value, Parameter) else d["_modules"]
            if name not in registry:  # (a replaced one keeps its place in state_dict order)
                self._unregister(name)
            registry[name] = value
        elif name in d.get("_params", ()) or name in d.get("_modules", ()):
            if value is not None:
                raise TypeError(f"{type(self).__name__}.{name} holds a "
                                f"{'parameter' if name in d['_params'] else 'layer'}: assign an nn.Parameter, an "
                                f"nn.Module or None, not a {type(value).__name__}")
            self._unregister(name)
        elif name in d.get("_buffers", ()):
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(f"{type(self).__name__}.{name} is a buffer: assign a Tensor or None")
            d["_buffers"][name] = value
            if value is None:
                del d["_buffers"][name]
        elif not name.startswith("_") and type(self).named_children is Module.named_children:
            _check_unregistered(self, name, value)
        object.__setattr__(self, name, value)

    def __delattr__(self, name):
        self._unregister(name)
        object.__delattr__(self, name)

    def _unregister(self, name):
        for registry in ("_params", "_modules", "_buffers"):
            self.__dict__.get(registry, {}).pop(name, None)

    def register_buffer(self, name, tensor):
        """A tensor the module keeps in its state_dict that is not a parameter (running statistics)."""
        if tensor is not None and not isinstance(tensor, Tensor):
            tensor = Tensor.from_host(None, tensor)
        self._unregister(name)
        if tensor is not None:
            self._buffers[name] = tensor
        object.__setattr__(self, name, tensor)

    def register_parameter(self, name, param):
        """Register an nn.Parameter (or None) as `name`."""
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(f"register_parameter takes an nn.Parameter or None, got {type(param).__name__}")
        if param is None:
            self._unregister(name)
            object.__setattr__(self, name, None)
        else:
            setattr(self, name, param)

    def add_module(self, name, module):
        """Register `module` as child `name` (as setattr), as torch.nn.Module."""
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"add_module takes an nn.Module or None, got {type(module).__name__}")
        setattr(self, name, module)

    register_module = add_module

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
        return list(self._modules.items())

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

    def forward(self, *args, **kwargs):
        """The module's computation: a Module subclass defines it (forward(self, x, ...) -> Tensor); call the module, not forward, so that autograd records it."""
        raise NotImplementedError(f"{type(self).__name__} has no forward(): a Module subclass defines "
                                  "forward(self, x) and computes its output there")

    def backward(self, dy):
        """dL/d(input) from dL/d(output), adding the parameters' gradients to their .grad (netcl's layers; autograd calls it for a layer call). A Module subclass with a forward of its own has none: autograd differentiates its operations."""
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

    def named_parameters(self, prefix="", recurse=True):
        """(key, Parameter) in state_dict order; a parameter shared by several layers once."""
        out, seen = [], set()
        for key, t in self._named_params(prefix, recurse):
            if id(t) not in seen:
                seen.add(id(t))
                out.append((key, t))
        return out

    def _named_params(self, prefix, recurse=True):
        yield from ((prefix + k, t) for k, t in self._params.items())
        if recurse:
            for name, child in self.named_children():
                yield from child._named_params(f"{prefix}{name}.")

    def named_buffers(self, prefix=""):
        """(key, buffer) in state_dict order."""
        out = [(prefix + k, t) for k, t in self._buffers.items()]
        for name, child in self.named_children():
            out += child.named_buffers(f"{prefix}{name}.")
        return out

    def parameters(self, recurse=True):
        """Every parameter of this module and the ones it holds, in state_dict order, each once."""
        return [p for _, p in self.named_parameters(recurse=recurse)]

    def buffers(self):
        """Every buffer of this module and the ones it holds (running statistics), in state_dict order."""
        return [b for _, b in self.named_buffers()]

    def children(self):
        """The modules this one holds directly."""
        return [c for _, c in self.named_children()]

    def named_modules(self, prefix=""):
        """(path, module) of this module and every one it holds, depth first; each once."""
        out, seen, todo = [], set(), [(prefix, self)]
        while todo:
            path, m = todo.pop()
            if id(m) in seen:
                continue
            seen.add(id(m))
            out.append((path, m))
            todo.extend(reversed([(f"{path}.{n}" if path else n, c) for n, c in m.named_children()]))
        return out

    def modules(self):
        """This module and every one it holds, each once, depth first."""
        return [m for _, m in self.named_modules()]

    def apply(self, fn):
        """fn(module) for every module held, then for this one; returns self (as torch.nn.Module)."""
        for child in self.children():
            child.apply(fn)
        fn(self)
        return self

    def requires_grad_(self, requires_grad=True):
        """Freeze (False) or unfreeze every parameter: a frozen one gets no gradient and no update."""
        for p in self.parameters():
            p.requires_grad = bool(requires_grad)
        return self

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
        """{key: numpy array} of every parameter and buffer; keys are attribute paths ("conv.weight", "0.bias")."""
        return {k: t.to_host() for k, t in self.named_tensors()}

    def load_state_dict(self, state, strict=True):
        """Copy arrays into the parameters and buffers, each key with its shape. strict: every key
        must match (ValueError naming them) and the model comes back; strict=False: the keys both
        have are loaded and (missing_keys, unexpected_keys) comes back, as in PyTorch.
        Values that are torch tensors are read in PyTorch's layouts (Linear.weight (out, in)),
        anything else in netcl's (Linear.weight (in, out)): the type decides, never the shape,
        so a square matrix cannot slip through transposed. Everything is checked before
        anything changes."""
        if not isinstance(state, dict):
            raise TypeError(f"load_state_dict expects a dict of name -> array, got {type(state).__name__}")
        own = {key: (t, layer, name) for key, t, layer, name in self._owned_tensors()}
        missing = [k for k in own if k not in state]
        # PyTorch's BatchNorm counter has no netcl counterpart: torch state dicts load as they are
        unexpected = [k for k in state if k not in own and k.rpartition(".")[2] != "num_batches_tracked"]
        if strict and (missing or unexpected):
            raise ValueError(f"state_dict keys do not match the model: missing {missing}, unexpected {unexpected}")
        if not strict:
            own = {k: v for k, v in own.items() if k in state}
        arrays = {}
        for k, (t, layer, name) in own.items():
            value, torch_layout = state[k], _is_torch_tensor(state[k])
            try:
                arrays[k] = _as_float32(value.detach().cpu().float().numpy() if torch_layout else value)
            except TypeError as e:
                raise TypeError(f"state_dict[{k!r}]: {e}") from None
            if torch_layout:
                try:
                    arrays[k] = np.asarray(layer.from_torch_layout(name, arrays[k]), order="C")  # (keeps 0-d)
                except ValueError as e:
                    raise ValueError(f"state_dict[{k!r}]: {e}") from None
            if arrays[k].shape != t.shape:
                raise ValueError(f"state_dict[{k!r}] has shape {arrays[k].shape}, the model expects {t.shape}")
        for k, (t, _, _) in own.items():
            t.set_(arrays[k])
        return self if strict else IncompatibleKeys(missing, unexpected)

    def zero_grad(self, set_to_none=True):
        """Drop every parameter's gradient (the next backward starts afresh), as torch.nn.Module;
        set_to_none=False fills them with zeros instead."""
        for p in self.parameters():
            if set_to_none or p.grad is None:
                p.grad = None
            else:
                p.grad.fill_(0.0)

    def train(self, mode=True):
        """Training mode (mode=True) or inference (False) for this module and every one it holds; returns the module."""
        self.training = bool(mode)
        for _, child in self.named_children():
            child.train(mode)
        return self

    def eval(self):
        """Inference mode (train(False)); returns the module."""
        return self.train(False)

    def to(self, device):
        """Move every parameter and buffer to a device: a pyopencl.CommandQueue (netcl.default_queue())
        or "cpu", "gpu" or a device name substring (as NETCL_DEVICE); returns the module."""
        q = default_queue(device) if isinstance(device, str) else device
        for _, t in self.named_tensors():
            t.to(q)
        return self

    def extra_repr(self):
        """The settings repr() shows (the constructor's arguments)."""
        return ", ".join(f"{k}={v!r}" for k, v in self.config().items())

    def __repr__(self):
        children = self.named_children()
        if children and type(self).named_children is Module.named_children:  # a user's module: torch's form
            return block_repr(type(self).__name__, children, self.extra_repr())
        return f"{type(self).__name__}({self.extra_repr()})"

    def __call__(self, *args, **kwargs):
        """forward(...), recorded by autograd as one node where this layer has its own backward
        (and an input or a parameter requires grad); a Module without one records the operations
        its forward runs."""
        if args and isinstance(args[0], Tensor):
            self.__dict__["_input_shape"] = args[0].shape  # what save() and export_onnx trace it with
        mode = autograd.MODE
        if mode.inside:  # inside a layer call recorded as one node: nothing to record
            return self.forward(*args, **kwargs)
        if mode.tracer is not None and not mode.tracer.busy:  # netcl.trace: a layer call is one node
            return mode.tracer.call(self, args, kwargs)
        if mode.enabled:
            x = args[0] if len(args) == 1 else None
            if isinstance(x, Tensor) and self.records_as_one():
                if x.requires_grad or self._wants_grads():
                    return autograd.call_layer(self, x, kwargs)
            elif _own_backward(type(self)) == "mismatch" and (
                    any(isinstance(a, Tensor) and a.requires_grad for a in args) or self._wants_grads()):
                raise NotImplementedError(
                    f"{type(self).__name__} overrides forward() of a netcl layer that has a backward() of its own, "
                    f"which then no longer matches it: autograd cannot differentiate it. Subclass nn.Module "
                    f"instead and hold the layer as an attribute")
        return self.forward(*args, **kwargs)

    def own_forward_modules(self):
        """(path, module) of the modules held (this one included) whose forward netcl's layer types do not
        describe: Module subclasses with a forward of their own (autograd records their operations, but
        files and the ONNX exporter record layers)."""
        return [(p, m) for p, m in self.named_modules()
                if not (m.HOLDS_ONLY or m.IS_GRAPH) and _own_backward(type(m)) != "own"
                and type(m).forward is not Module.forward]  # (one without a forward is an unknown layer type)

    def describe_own_forward(self):
        """own_forward_modules() in words, for error messages ("" where there are none)."""
        own = [f"{p or 'the model'} ({type(m).__name__})" for p, m in self.own_forward_modules()]
        if not own:
            return ""
        return (f"{own[0]} is a Module subclass" if len(own) == 1 else f"{', '.join(own)} are Module subclasses") + \
            " with a forward of its own"

    def knows_shapes(self):
        """Whether output_shape() holds for this module and every one it holds: netcl's layers declare
        it; a module with a forward of its own must define output_shape itself."""
        if not self.HOLDS_ONLY and _own_backward(type(self)) != "own" and \
                type(self).output_shape is Module.output_shape:
            return False
        return all(c.knows_shapes() for _, c in self.named_children())

    def predict(self, x, queue=None):
        """Inference on a host array: numpy in, numpy out, in eval mode and without autograd, on
        `queue` (default: netcl.default_queue())."""
        if self.training:
            raise RuntimeError("predict() runs inference: call model.eval() first")
        x = _as_float32(x)
        q = queue or default_queue()
        with autograd.no_grad():
            return self(Tensor.from_host(q, x)).to_host()

    def records_as_one(self):
        """Whether a call is one autograd node: this layer's backward differentiates its forward, and
        every layer it holds is such a layer too."""
        if not (self.HOLDS_ONLY or _own_backward(type(self)) == "own"):
            return False
        return all(c.records_as_one() for _, c in self.named_children())

    def _wants_grads(self):
        return any(p.requires_grad for _, p in self._named_params(""))

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


def declared_tensors(m):
    """{name: {"shape", "kind"}} of a container's own parameters and buffers (a graph's, or a
    ModuleDict's in one: the config that lets a file declare them)."""
    return {**{k: {"shape": list(t.shape), "kind": "parameter"} for k, t in m._params.items()},
            **{k: {"shape": list(t.shape), "kind": "buffer"} for k, t in m._buffers.items()}}


def make_declared(m, declared):
    """Zero parameters and buffers of the declared shapes on m (a file's data then loads into them)."""
    for name, d in (declared or {}).items():
        t = Tensor.from_host(None, np.zeros(d["shape"], np.float32))
        if d["kind"] == "parameter":
            setattr(m, name, Parameter(t))
        else:
            m.register_buffer(name, t)


def declared_problem(tensors):
    """What is wrong with a file's declared tensors, or None."""
    if tensors is None:
        return None
    if not isinstance(tensors, dict) or len(tensors) > 4096:
        return "'tensors' must be an object of at most 4096 entries"
    for name, d in tensors.items():
        if not (isinstance(name, str) and name.isidentifier() and len(name) <= 64) or not isinstance(d, dict) \
                or set(d) != {"shape", "kind"} or d["kind"] not in ("parameter", "buffer") \
                or not isinstance(d["shape"], list) or len(d["shape"]) > 8 \
                or any(type(n) is not int or not 0 <= n <= MAX_INT for n in d["shape"]):
            return f"tensor {name!r:.64}: expected {{'shape': [up to 8 sizes], 'kind': 'parameter' or 'buffer'}}"
    return None


def _check_unregistered(module, name, value):
    """TypeError where `value`, about to be a public attribute of a module that registers its
    attributes, holds what parameters() could not find: layers or parameters in a plain list,
    tuple or dict (a layer already registered elsewhere in the module is fine). A warning where it
    is or holds leaf tensors that require grad but are not nn.Parameters (a tensor kept in forward,
    `self.last_input = x`, is fine, but a weight made so is not trained by an optimizer over
    parameters())."""
    where = f"{type(module).__name__}.{name}"
    items = [value]
    if isinstance(value, (list, tuple, dict, set)):
        items = list(value.values()) if isinstance(value, dict) else list(value)
        known = {id(m) for m in module.modules()}
        if any(isinstance(v, Module) and id(v) not in known for v in items):
            holder = "nn.ModuleDict(...)" if isinstance(value, dict) else "nn.ModuleList(...)"
            raise TypeError(f"{where}: layers in a plain {type(value).__name__} are invisible to parameters(), "
                            f"state_dict(), train() and to(); hold them in {holder}")
        if any(isinstance(v, Parameter) for v in items):
            raise TypeError(f"{where}: parameters in a plain {type(value).__name__} are invisible to parameters() "
                            "and state_dict(); assign each to an attribute of its own")
    if any(isinstance(v, Tensor) and not isinstance(v, Parameter) and v.requires_grad and v.is_leaf for v in items):
        warnings.warn(f"{where} holds a tensor that requires grad but is not an nn.Parameter: parameters(), "
                      "state_dict() and optimizers over them do not see it (for a weight, assign "
                      "nn.Parameter(tensor))", stacklevel=3)


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
