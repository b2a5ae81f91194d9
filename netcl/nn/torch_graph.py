"""from_torch of a torch module with a forward of its own: its torch.fx graph (symbolic_trace) as a
netcl Module whose forward takes the same steps with netcl layers and operations.

Each fx node becomes one step: a torch layer (a leaf module) the netcl layer CONVERTERS make of it, at
the same path; a torch function, tensor method or Python operator the netcl operation of the same
name (the tables below); a parameter or buffer read directly a netcl one at the same path. So the
state_dict keys are torch's, weights load through load_state_dict (torch's layouts converted), and
the model trains with autograd, saves, exports and traces (netcl.trace: a GraphModule that runs fused)
as any Module subclass. Everything is checked before anything is built: NotImplementedError names
every layer, function and method netcl has no counterpart for, with its fx node.
"""
import inspect
import operator

import numpy as np

from netcl import functions
from netcl.nn import functional
from netcl.nn.graph import _place
from netcl.nn.module import Module, Parameter
from netcl.tensor import Tensor

# Python operators as fx records them (`_operator.<name>`): the in-place forms run as the plain ones
# (an fx graph is functional: nothing else reads the tensor an augmented assignment replaced)
_OPERATORS = {name: getattr(operator, name) for name in (
    "add", "sub", "mul", "truediv", "matmul", "neg", "pow", "getitem", "floordiv", "eq", "ne", "lt", "le", "gt", "ge")}
_OPERATORS.update({"iadd": operator.add, "isub": operator.sub, "imul": operator.mul, "itruediv": operator.truediv})

# torch.<name>: netcl.functions.<name> takes the same arguments
_TORCH_FUNCTIONS = ("add", "sub", "mul", "div", "matmul", "maximum", "minimum", "pow", "neg", "exp", "log", "sqrt",
                    "abs", "clamp", "relu", "sigmoid", "tanh", "softmax", "log_softmax", "sum", "mean", "amax",
                    "amin", "max", "min", "argmax", "argmin", "flatten", "reshape", "squeeze", "unsqueeze",
                    "permute", "transpose", "cat", "stack", "detach", "clone", "split", "chunk")
# other libraries' functions that models call between layers -> netcl's
_OTHER = {"torchvision.ops.stochastic_depth.stochastic_depth": functional.stochastic_depth}


def _assert(condition, message):
    """torch._assert, which fx records for a model's shape checks: the same check."""
    if not condition:
        raise AssertionError(message)


_OTHER["torch._assert"] = _assert
_ALIASES = {"concat": "cat", "concatenate": "cat", "divide": "div", "multiply": "mul", "subtract": "sub",
            "clip": "clamp"}


class _Ref:
    """An argument that is the value of an earlier step."""
    __slots__ = ("i",)

    def __init__(self, i):
        self.i = i


def _resolve(a, env):
    if isinstance(a, _Ref):
        return env[a.i]
    if isinstance(a, (list, tuple)):
        items = [_resolve(v, env) for v in a]
        return items if isinstance(a, list) else tuple(items)
    if isinstance(a, dict):
        return {k: _resolve(v, env) for k, v in a.items()}
    if isinstance(a, slice):
        return slice(_resolve(a.start, env), _resolve(a.stop, env), _resolve(a.step, env))
    return a


class TorchGraph(Module):
    """A torch module converted through torch.fx (nn.from_torch): its layers as netcl layers and its
    free parameters and buffers as netcl ones, at torch's paths; forward takes the fx graph's steps
    with netcl operations. `steps` lists (kind, what, args, kwargs): kind "module" (what: a path),
    "call" (what: a netcl function), "method" (what: a Tensor method's name), "tensor" (what: a path)."""

    def __init__(self, steps, modules, tensors):
        super().__init__()
        _place(self, modules, tensors)
        self._steps = steps

    def forward(self, x):
        env = [x]
        for kind, what, args, kwargs in self._steps:
            if kind == "tensor":
                v = self.get_tensor(what)
            elif kind == "output":
                return _resolve(args[0], env)
            else:
                args, kwargs = _resolve(args, env), _resolve(kwargs, env)
                if kind == "module":
                    v = self.get_submodule(what)(*args, **kwargs)
                elif kind == "attention":  # torch's (output, weights), the weights never read
                    v = (self.get_submodule(what)(args[0]), None)
                elif kind == "method":
                    v = getattr(args[0], what)(*args[1:], **kwargs)
                else:
                    v = what(*args, **kwargs)
            env.append(v)
        raise AssertionError("an fx graph ends with its output")

    def get_submodule(self, path):
        """The module at a dotted path below this one."""
        m = self
        for part in path.split(".") if path else ():
            m = dict(m.named_children())[part]
        return m

    def get_tensor(self, path):
        """The parameter or buffer at a dotted path below this one."""
        owner, _, name = path.rpartition(".")
        return getattr(self.get_submodule(owner), name)

    def extra_repr(self):
        return f"{len(self._steps)} steps from torch.fx"


def _function(fn):
    """The netcl callable for an fx call_function target, or None."""
    module, name = getattr(fn, "__module__", None) or "", getattr(fn, "__name__", "")
    if module in ("_operator", "operator"):
        return _OPERATORS.get(name)
    if module == "torch.nn.functional":
        return getattr(functional, name, None) if not name.startswith("_") else None
    if (module == "torch" or module.startswith("torch._C")) and name in _TORCH_FUNCTIONS + tuple(_ALIASES):
        name = _ALIASES.get(name, name)
        return getattr(functions, name) if name in _TORCH_FUNCTIONS else None
    if fn is getattr:
        return getattr
    return _OTHER.get(f"{module}.{name}")


def _binds(fn, args, kwargs):
    """Whether fn takes these arguments (a torch-only keyword, such as torch.add's alpha, does not)."""
    try:
        inspect.signature(fn).bind(*args, **kwargs)
    except TypeError:
        return False
    except ValueError:  # (a builtin without a signature: tried as it is)
        pass
    return True


def _attention_problem(node):
    """What keeps an fx call of torch's MultiheadAttention from netcl's (self-attention, no mask,
    the weights unread), or None."""
    import inspect as _inspect

    import torch

    try:
        bound = _inspect.signature(torch.nn.MultiheadAttention.forward).bind(None, *node.args, **node.kwargs)
    except TypeError as e:
        return str(e)
    a = bound.arguments
    if not (a["query"] is a.get("key") is a.get("value")):
        return "query, key and value differ (netcl's MultiheadAttention is self-attention)"
    if any(a.get(k) is not None for k in ("key_padding_mask", "attn_mask")) or a.get("is_causal"):
        return "a mask (netcl's MultiheadAttention takes none)"
    if any(u.op != "call_function" or u.target is not operator.getitem or (u.args[1] != 0 and u.users)
           for u in node.users):  # (`y, _ = attn(x, x, x)` takes the weights and never reads them)
        return "the attention weights are used (netcl gives the output only)"
    return None


def from_fx(module, convert, problems):
    """The TorchGraph of torch module `module` (convert(child, path, problems) converts a leaf layer),
    or None with what stands in the way appended to `problems`."""
    import torch.fx

    try:
        gm = torch.fx.symbolic_trace(module)
    except Exception as e:  # (torch.fx's own errors: control flow on values, unsupported Python)
        raise NotImplementedError(f"from_torch traces {type(module).__name__} with torch.fx, which failed: "
                                  f"{type(e).__name__}: {e}. netcl converts modules whose forward torch.fx can "
                                  "trace (no control flow that depends on tensor values)") from None
    index, steps, modules, tensors = {}, [], {}, {}
    named_tensors = dict(module.named_parameters())
    named_tensors.update(module.named_buffers())
    inputs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(inputs) != 1:
        problems.append(f"forward takes {len(inputs)} inputs (netcl models take one tensor)")
        return None

    def ref(a):
        return torch.fx.node.map_arg(a, lambda n: _Ref(index[n]))

    for node in gm.graph.nodes:
        where = f"node {node.name} ({node.op} {getattr(node.target, '__name__', node.target)})"
        if node.op == "placeholder":
            index[node] = 0
            continue
        args, kwargs = ref(tuple(node.args)), ref(dict(node.kwargs))
        if node.op == "call_module":
            torch_layer = gm.get_submodule(node.target)
            if node.target not in modules:
                modules[node.target] = convert(torch_layer, node.target, problems)
            if isinstance(torch_layer, torch.nn.MultiheadAttention):
                problem = _attention_problem(node)
                if problem:
                    problems.append(f"{where}: {problem}")
                steps.append(("attention", node.target, args, {}))
            else:
                steps.append(("module", node.target, args, kwargs))
        elif node.op == "get_attr":
            t = named_tensors.get(node.target)
            if t is None:
                problems.append(f"{where}: reads {node.target!r}, which is no parameter or buffer")
            elif node.target not in tensors:
                value = t.detach().cpu().float().numpy()
                tensors[node.target] = Parameter(value) if isinstance(t, torch.nn.Parameter) else \
                    Tensor.from_host(None, np.asarray(value, order="C"))
            steps.append(("tensor", node.target, (), {}))
        elif node.op == "call_method":
            if getattr(Tensor, node.target, None) is None or node.target.startswith("_"):  # (size: a property)
                problems.append(f"{where}: netcl's Tensor has no method {node.target!r}")
            steps.append(("method", node.target, args, kwargs))
        elif node.op == "call_function":
            fn = _function(node.target)
            if fn is None:
                name = f"{getattr(node.target, '__module__', '')}.{getattr(node.target, '__name__', node.target)}"
                problems.append(f"{where}: netcl has no counterpart of {name}")
            elif not _binds(fn, args, kwargs):
                problems.append(f"{where}: netcl's {fn.__name__} does not take {sorted(node.kwargs)} "
                                f"({len(node.args)} positional arguments)")
            steps.append(("call", fn, args, kwargs))
        elif node.op == "output":
            if not isinstance(node.args[0], torch.fx.Node):
                problems.append(f"{where}: forward returns {type(node.args[0]).__name__} (netcl models return "
                                "one tensor)")
            steps.append(("output", None, args, {}))
        index[node] = len(steps)
    if problems or None in modules.values():
        return None
    order = {p: i for i, p in enumerate(list(dict(module.named_modules())) + list(module.state_dict()))}
    modules = dict(sorted(modules.items(), key=lambda kv: order[kv[0]]))  # (torch's order: its state_dict's)
    tensors = dict(sorted(tensors.items(), key=lambda kv: order[kv[0]]))
    return TorchGraph(steps, modules, tensors)
