"""Graphs: netcl.trace(model, example_input) runs the model's forward once and records, in order,
every layer call (a netcl layer, or a Sequential of them, as one node naming the layer's path in the
model) and every tensor operation (netcl.functions, nn.functional) into a GraphModule: a DAG that
trains through autograd, saves to .netcl without the model's Python class, and exports to ONNX.

A node is a small JSON object (what a .netcl header stores):

    {"op": "input"}                               the model's input (node 0)
    {"op": "call", "target": "blocks.0.conv1", "args": [...]}   a layer held at that path
    {"op": "layer", "type": "MaxPool2d", "config": {...}, "args": [...]}   a parameter-free layer made in forward
    {"op": "param", "target": "scale"}            a parameter or buffer used as a tensor operand
    {"op": "const", "target": "const_0"}          a tensor made in forward from no input (a buffer)
    {"op": "<operation>", "args": [...], "kwargs": {...}}   autograd.TRACEABLE's function of that name
    {"op": "output", "args": [ref]}

and carries "out": the shapes of the values it makes, the batch dimension written "N". Arguments
are JSON: numbers, booleans, null, short strings, lists, and the forms {"v": i} (node i's value;
"k": its k-th element for an operation returning a pair, nested tuples counted flat: LSTM's
(output, (h_n, c_n)) as 0, 1, 2), {"tuple": [...]}, {"slice": [a, b, c]},
{"ellipsis": 1}, {"dtype": "float32"} and {"batch": 1} (the input's batch size: a reshape's target
keeps the batch free). A graph is specialised to the traced input's shape but for its batch, which
the trace follows through each value (a permutation or index moves it, a layer says where its values
hold it: traced_batch_dims); the traced code reads it as a BatchSize wherever it sits.

Tracing refuses what a graph cannot hold, naming the line of the traced code: a tensor's value read
in Python (an `if` on a tensor, item(), numpy()), a layer with parameters made inside forward."""
import math
import os
import re
import traceback
from pathlib import Path

import numpy as np

from netcl import autograd, runtime
from netcl.nn import functional
from netcl.jit import chain
from netcl.jit.stages import plan_stages
from netcl.nn import graph_chain
from netcl.nn.blocks import ModuleDict
from netcl.nn.module import LAYERS, Module, Parameter, _own_backward, declared_problem, declared_tensors, make_declared
from netcl.tensor import FLOAT32, INT32, Tensor

_NETCL = str(Path(__file__).resolve().parents[1])
_PATH = re.compile(r"[A-Za-z_0-9]{1,64}(\.[A-Za-z_0-9]{1,64}){0,31}")
_NAME = re.compile(r"[A-Za-z_][A-Za-z_0-9]{0,63}")
MAX_NODES = 100_000
# eval mode runs the parts of a graph that does not lift whole fused (GraphModule.forward); NETCL_GRAPH_FUSE=0
# in the environment (or FUSE = False here) replays it node by node, as training does
FUSE = os.environ.get("NETCL_GRAPH_FUSE", "1") != "0"
# a segment whose plan runs a conv through the GPU family's kernel on a CPU runs its layers past this
# many multiply-accumulates per sample (FusedPlan.generic_conv_macs; where the two cross on PoCL:
# docs/performance.md#traced-graphs)
GENERIC_CONV_MACS = 1024
_MAX_ARG_DEPTH, _MAX_ARG_ITEMS = 6, 4096
_DTYPES = {"float32": FLOAT32, "int32": INT32}


class BatchSize(int):
    """The traced input's batch size as a traced value's first dimension carries it (x.shape[0],
    x.size(0)): an argument made of it is recorded as the batch, so the graph runs for any batch.
    Arithmetic on it gives plain ints (recorded as numbers)."""


class TraceError(RuntimeError):
    """What netcl.trace cannot record, with the line of the traced code that did it."""


def _user_line():
    """'file:line: code' of the innermost frame outside netcl (the traced model's own code)."""
    for frame in reversed(traceback.extract_stack()[:-1]):
        if not frame.filename.startswith(_NETCL):
            return f"{frame.filename}:{frame.lineno}: {frame.line}"
    return "(inside netcl)"


class Tracer:
    """Records one forward of `root` (autograd._mode.tracer while netcl.trace runs)."""

    def __init__(self, root, x):
        self.root, self.batch, self.busy = root, int(x.shape[0]), 0
        self.paths = {id(m): p for p, m in root.named_modules() if p}
        self.owned = {}  # id(tensor) -> its state_dict key (parameters and buffers)
        for key, t in root.named_tensors():
            self.owned.setdefault(id(t), key)
        # batch_dims: (node, k) -> where that value holds the batch, None where it does not (k None for a
        # node's one value)
        self.nodes, self.values = [{"op": "input", "out": [self._shape(x.shape, True)]}], {}
        self.batch_dims = {(0, None): 0}
        self.keep, self.consts, self.fixed = [x], {}, {}
        self.values[id(x)] = (0, None)
        self.shapes = []  # tensors whose first dimension this trace tagged, with their own shapes
        self._tag(x)

    def _tag(self, t, d=0):
        """Make t.shape[d] a BatchSize for the traced code (untag() puts the shape back)."""
        if len(t.shape) > d and not isinstance(t.shape[d], BatchSize):
            self.shapes.append((t, t.shape))
            t.shape = tuple(t.shape[:d]) + (BatchSize(t.shape[d]),) + tuple(t.shape[d + 1:])

    def untag(self):
        """Give the tensors this trace tagged (_tag) their plain shapes back."""
        for t, shape in self.shapes:
            t.shape = tuple(int(n) for n in shape)

    def _shape(self, shape, batched, dim=0):
        return ["N" if (k == dim and batched) else int(n) for k, n in enumerate(shape)]

    # -- values --------------------------------------------------------------------------
    def ref(self, t):
        """The argument form of tensor t: a node's value, a parameter, or a constant."""
        v = self.values.get(id(t))
        if v is None:
            key = self.owned.get(id(t))
            if key is not None:
                node = {"op": "param", "target": key, "out": [self._shape(t.shape, False)]}
            else:  # made in forward from nothing traced: its values become part of the graph
                name = f"const_{len(self.consts)}"
                self.busy += 1  # (the tracer's own read)
                try:
                    self.consts[name] = t.to_host().astype(np.float32, copy=False)
                finally:
                    self.busy -= 1
                node = {"op": "const", "target": name, "out": [self._shape(t.shape, False)]}
            self._add(node, t, None)
            v = self.values[id(t)]
        i, k = v
        return {"v": i} if k is None else {"v": i, "k": k}

    def _add(self, node, out, dims):
        """Record node making `out`; dims: where each of its values holds the batch (one int or None for
        all of them, or one per value), kept where that dimension has the batch's size."""
        i = len(self.nodes)
        if len(self.nodes) >= MAX_NODES:
            raise TraceError(f"the graph passes {MAX_NODES} nodes")
        outs = flat(out) if isinstance(out, tuple) else (out,)
        shapes = []
        for k, t in enumerate(outs):
            if isinstance(t, Tensor):
                d = dims[k] if isinstance(dims, (list, tuple)) else dims
                b = d is not None and len(t.shape) > d and t.shape[d] == self.batch
                self.values[id(t)] = (i, None if not isinstance(out, tuple) else k)
                self.keep.append(t)
                shapes.append(self._shape(t.shape, b, d))
                self.batch_dims[self.values[id(t)]] = d if b else None
                if b:
                    self._tag(t, d)
        node["out"] = shapes
        self.nodes.append(node)

    def encode(self, a, depth=0):
        """An argument in the graph's JSON form (tensors as references, see the module docstring)."""
        if depth > _MAX_ARG_DEPTH:
            raise TraceError(f"{_user_line()}: an argument nested too deep to record")
        if isinstance(a, Tensor):
            return self.ref(a)
        if a is None or isinstance(a, (bool, str)):
            if isinstance(a, str) and len(a) > 32:
                raise TraceError(f"{_user_line()}: a string argument longer than 32 characters")
            return a
        if isinstance(a, BatchSize):
            return {"batch": 1}
        if isinstance(a, (int, np.integer)):
            return int(a)
        if isinstance(a, (float, np.floating)):
            if not math.isfinite(a):
                if math.isinf(a):
                    return {"inf": 1 if a > 0 else -1}
                raise TraceError(f"{_user_line()}: a NaN argument")
            return float(a)
        if isinstance(a, np.dtype) or (isinstance(a, type) and a in (np.float32, np.int32)):
            return {"dtype": np.dtype(a).name}
        if isinstance(a, slice):
            return {"slice": [self.encode(a.start, depth + 1), self.encode(a.stop, depth + 1),
                              self.encode(a.step, depth + 1)]}
        if a is Ellipsis:
            return {"ellipsis": 1}
        if isinstance(a, np.ndarray):
            return self.ref(Tensor.from_host(None, a))
        if isinstance(a, (list, tuple)):
            if len(a) > _MAX_ARG_ITEMS:
                raise TraceError(f"{_user_line()}: an argument of more than {_MAX_ARG_ITEMS} items")
            items = [self.encode(v, depth + 1) for v in a]
            return {"tuple": items} if isinstance(a, tuple) else items
        if hasattr(a, "__index__"):  # an enum (netcl.act.Act)
            return int(a)
        raise TraceError(f"{_user_line()}: an argument of type {type(a).__name__} cannot be recorded")

    def _inputs_batch_dim(self, args):
        """Where the first batched value among these (encoded) arguments holds the batch; 0 where none is
        but they name the batch size; None where neither."""
        for ref in _ref_pairs(args):
            if self.batch_dims.get(ref) is not None:
                return self.batch_dims[ref]
        return 0 if _names_batch(args) else None

    # -- what Module.__call__ and autograd.traced report ---------------------------------------
    def op(self, name, args, kwargs, out):
        """Record operation `name` (autograd.traced) called with args, kwargs, giving out."""
        node = {"op": name, "args": self.encode(list(args))}
        if kwargs:
            node["kwargs"] = {k: self.encode(v) for k, v in kwargs.items()}
        if name == "F.dropout":  # dropping follows the graph's mode, as an nn.Dropout layer's does
            if len(node["args"]) > 2:
                node["args"][2] = {"mode": 1}
            else:
                node.setdefault("kwargs", {})["training"] = {"mode": 1}
        d = self._inputs_batch_dim([node["args"], node.get("kwargs", {})])
        self._add(node, out, _op_batch_dim(name, args, kwargs, node, d))

    def call(self, module, args, kwargs):
        """A module called while tracing: a netcl layer runs as one node; a module with a forward of its
        own runs its forward, whose operations and layer calls record themselves."""
        if _own_backward(type(module)) == "mismatch":
            raise TraceError(f"{_user_line()}: {type(module).__name__} overrides forward() of a netcl layer: its "
                             "kernels run outside what a graph records; subclass nn.Module and hold the layer")
        if _own_backward(type(module)) == "none" or not module.records_as_one():
            return module.forward(*args, **kwargs)  # a module with a forward of its own: its parts record
        path = self.paths.get(id(module))
        self.busy += 1
        try:
            out = module(*args, **kwargs)
        finally:
            self.busy -= 1
        if path is not None:
            node = {"op": "call", "target": path}
        elif not module.parameters() and not module.buffers() and LAYERS.get(type(module).__name__) is type(module):
            node = {"op": "layer", "type": type(module).__name__, "config": self.encode(module.config())}
        else:
            raise TraceError(f"{_user_line()}: a {type(module).__name__} made inside forward (not an attribute of "
                             "the model) holds parameters a graph cannot find: make it in __init__")
        node["args"] = self.encode(list(args))
        if kwargs:
            node["kwargs"] = {k: self.encode(v) for k, v in kwargs.items()}
        # (a layer of several values says where each holds the batch its input holds at d: LSTM's h_n
        # and c_n (layers, N, H) hold it second, or not at all, whatever their sizes)
        d = self._inputs_batch_dim(node["args"])
        if d is not None and hasattr(module, "traced_batch_dims"):
            d = module.traced_batch_dims(args[0], d)
        self._add(node, out, d)
        return out

    def refuse(self, what):
        """TraceError: a tensor's value was read in the traced code (`what` says how)."""
        raise TraceError(f"{_user_line()}: a tensor's value is {what} during netcl.trace; a graph cannot hold "
                         "control flow that depends on tensor values (compute it with tensor operations)")


def trace(model, example_input):
    """Run model(example_input) once, recording its layer calls and tensor operations into a
    GraphModule that holds the same layers (state_dict keys as the model's). No gradient is
    recorded; the model's mode (train or eval) is the trace's, and the graph keeps it."""
    if isinstance(model, GraphModule):
        return model
    if not isinstance(model, Module):
        raise TypeError(f"netcl.trace takes a netcl nn.Module, got {type(model).__name__}")
    if model.records_as_one():  # (a layer, a Sequential of layers: nothing of its own to record)
        raise TypeError(f"netcl.trace records a Module subclass's own forward; this {type(model).__name__} is netcl "
                        "layers only, which save, export_onnx and the fused path take as they are")
    x = example_input if isinstance(example_input, Tensor) else Tensor.from_host(None, example_input)
    if not x.shape:
        raise ValueError("netcl.trace needs an input with a batch dimension")
    tr = Tracer(model, x)
    prev = autograd._mode.tracer
    autograd._mode.tracer = tr
    try:
        with autograd.no_grad():
            out = model(x)
    finally:
        autograd._mode.tracer = prev
        tr.untag()
    if not isinstance(out, Tensor):
        raise TraceError(f"{type(model).__name__}.forward returned {type(out).__name__}: a graph has one tensor output")
    out_ref = tr.ref(out)
    tr.nodes.append({"op": "output", "args": [out_ref], "out": [tr.nodes[out_ref["v"]]["out"][out_ref.get("k", 0)]]})
    used_modules = {n["target"] for n in tr.nodes if n["op"] == "call"}
    used_tensors = {n["target"] for n in tr.nodes if n["op"] == "param"}
    modules = {p: m for p, m in model.named_modules() if p in used_modules}
    tensors = dict(model.named_tensors())
    gm = GraphModule(tr.nodes, modules, {k: tensors[k] for k in used_tensors}, tr.consts)
    for m in gm.modules():
        if isinstance(m, ModuleDict):
            m.training = model.training
    gm.training = model.training
    if gm._lifted is not None:
        gm._lifted.train(model.training)
    for part in gm._fusion.segments if gm._fusion is not None else ():
        part.seq.train(model.training)
    return gm


# -- GraphModule -------------------------------------------------------------------------------------
class GraphModule(Module):
    """A traced model: its nodes (see the module docstring) and the layers and tensors they use,
    held at their paths in the traced model (so its state_dict keys are the model's). forward
    replays the nodes; autograd records the replay as it records any code."""

    CALL_STATE = ()
    IS_GRAPH = True

    def __init__(self, graph, modules=None, tensors=None, constants=None):
        super().__init__()
        self.graph = [dict(n) for n in graph]
        _place(self, modules or {}, tensors or {})
        for name, a in (constants or {}).items():
            self.register_buffer(name, Tensor.from_host(None, np.asarray(a, np.float32)))
        self._layers = {}
        problem = self._check()
        if problem:
            raise ValueError(f"GraphModule: {problem}")
        self.__dict__["_lifted"] = lift(self)  # (not a child: it holds the same layers)
        self.__dict__["_fusion"] = _Fusion.of(self)

    # -- the layer protocol: what a .netcl file records ------------------------------------
    def config(self):
        return {"graph": self.graph, "tensors": declared_tensors(self)}

    @classmethod
    def tensor_shapes(cls, graph=(), modules=None, tensors=None, constants=None):
        return {name: tuple(d["shape"]) for name, d in (tensors or {}).items()}

    @classmethod
    def config_problem(cls, config):
        """What is wrong with a file's config for this class, or None (checked before anything is built)."""
        if not isinstance(config, dict) or set(config) - {"graph", "tensors"}:
            return "must be an object with fields 'graph' and 'tensors'"
        return declared_problem(config.get("tensors")) or _graph_problem(config.get("graph"))

    @classmethod
    def from_config(cls, config, children):
        gm = cls.__new__(cls)
        Module.__init__(gm)
        gm.graph = [dict(n) for n in config["graph"]]
        for name, module in children.items():
            setattr(gm, name, module)
        make_declared(gm, config.get("tensors"))
        gm._layers = {}
        problem = gm._check()
        if problem:
            raise ValueError(problem)
        gm.__dict__["_lifted"] = lift(gm)
        gm.__dict__["_fusion"] = _Fusion.of(gm)
        return gm

    def output_shape(self, shape):
        want = self.graph[0]["out"][0]
        if len(shape) != len(want) or any(w != "N" and int(s) != w for s, w in zip(shape, want)):
            raise ValueError(f"this graph was traced for input {_show(want)}, got {tuple(shape)}")
        return tuple(int(shape[0]) if n == "N" else n for n in self.graph[-1]["out"][0])

    def records_as_one(self):
        return False  # its forward replays operations: autograd records them

    def knows_shapes(self):
        return True

    # -- replay ----------------------------------------------------------------------------
    def forward(self, x):
        """Replay the graph on x (its batch size free, the rest as traced): through its lifted
        Sequential where it has one (lift: the Sequential's training fusions and fused inference);
        in eval mode a graph that does not lift runs its parts that do through their fused plans
        (segments) and its element-wise chains as one kernel each (graph_chain), the rest node by node."""
        self.output_shape(x.shape)
        if self._lifted is not None and autograd.tracer() is None:
            return self._lifted(x)
        fused = self._fusion if FUSE and not self.training and autograd.tracer() is None else None
        at, skip = (fused.at, fused.skip) if fused is not None else ({}, ())
        env = [None] * len(self.graph)
        for i, node in enumerate(self.graph):
            if i in skip:  # a value the fused part ending at a later node computes, or none needs
                continue
            part = at.get(i)
            if part is not None:
                if not self._run_part(part, env, x):
                    for j in part.members:
                        env[j] = self._node(j, env, x)
                continue
            if node["op"] == "output":
                y = self._arg(node["args"][0], env, x)
                if tuple(y.shape) != self.output_shape(x.shape):  # (what a file declares, held to)
                    raise ValueError(f"the graph computes {tuple(y.shape)} where it declares {_show(node['out'][0])}")
                return y
            env[i] = self._node(i, env, x)
        raise AssertionError("a checked graph ends with its output")

    def _node(self, i, env, x):
        """Node i's value (env: the values before it); a result holding tuples as one flat tuple."""
        node = self.graph[i]
        op = node["op"]
        if op == "input":
            return x
        if op in ("param", "const"):
            return self._tensor(node["target"])
        args = self._arg(node.get("args", []), env, x)
        kwargs = {k: self._arg(a, env, x) for k, a in node.get("kwargs", {}).items()}
        if op == "call":
            v = self.submodule(node["target"])(*args, **kwargs)
        elif op == "layer":
            v = self._layer(i, node)(*args, **kwargs)
        else:
            v = autograd.TRACEABLE[op](*args, **kwargs)
        return flat(v) if isinstance(v, tuple) else v

    def _run_part(self, part, env, x):
        """Set env[part.root] by a fused part (a Segment or a ChainGroup) and say True; False (nothing
        run) where it cannot take these values: its members then run one by one."""
        if isinstance(part, Segment):
            if part.seq.training:  # (a mode the graph's train() did not reach)
                return False
            x_in, plan = env[part.src], part.seq._fused
            if plan is None or x_in.dtype != FLOAT32 or not part.takes(x_in):
                return False
            if autograd.recording():
                env[part.root] = part.seq(x_in)
            else:
                env[part.root] = plan(x_in)  # (nothing for a backward to keep: the plan alone)
            return True
        inputs = [self._arg(a, env, x) for a in part.inputs]
        if not all(isinstance(t, Tensor) and t.dtype == FLOAT32 for t in inputs) or autograd.needs_record(*inputs):
            return False  # (a chain has no backward: a replay that records runs the operations)
        shape = tuple(x.shape[0] if n == "N" else n for n in self.graph[part.root]["out"][0])
        y = chain.run(part.chain, inputs, part.scalars, shape)
        if y is None:
            return False
        env[part.root] = y
        return True

    def _arg(self, a, env, x):
        return decode(a, lambda i, k: env[i] if k is None else env[i][k], x.shape[0], self.training)

    def submodule(self, path):
        """The layer held at `path` ("blocks.0.conv1")."""
        m = self
        for part in path.split("."):
            m = dict(m.named_children())[part]
        return m

    def _tensor(self, path):
        *where, name = path.split(".")
        m = self.submodule(".".join(where)) if where else self
        return dict(m.named_tensors())[name]

    def _layer(self, i, node):
        layer = self._layers.get(i)
        if layer is None:
            layer = self._layers[i] = LAYERS[node["type"]](**node["config"])
            layer.training = self.training
        return layer

    def train(self, mode=True):
        super().train(mode)
        for layer in self._layers.values():
            layer.train(mode)
        if self._lifted is not None:
            self._lifted.train(mode)  # (eval: its fused plan)
        for part in self._fusion.segments if self._fusion is not None else ():
            part.seq.train(mode)
        return self

    def predict(self, x, queue=None):
        """Inference on a host array, numpy in and out: through the lifted Sequential's fused path
        where the graph lifts (see lift), else by replaying the graph."""
        if self._lifted is not None and not self.training:
            self.output_shape(np.shape(x))
            return self._lifted.predict(x, queue)
        return super().predict(x, queue)

    @property
    def lifted(self):
        """The graph as a Sequential of blocks of the same layers (lift), or None."""
        return self._lifted

    def _check(self):
        """What is wrong with the graph and the layers and tensors it names, or None."""
        problem = _graph_problem(self.graph)
        if problem:
            return problem
        for i, node in enumerate(self.graph):
            op = node["op"]
            try:
                if op == "call":
                    m = self.submodule(node["target"])
                    if not m.records_as_one():
                        return f"node {i} calls {node['target']} ({type(m).__name__}), which is not a netcl layer"
                elif op in ("param", "const"):
                    self._tensor(node["target"])
                elif op == "layer":
                    cls = LAYERS.get(node["type"])
                    if cls is None or cls.tensor_shapes(**node["config"]):
                        return f"node {i}: {node['type']!r} is not a parameter-free netcl layer"
                    self._layer(i, node)
            except (KeyError, TypeError, ValueError) as e:
                return f"node {i} ({op}): {node.get('target', node.get('type'))!r} does not resolve: {e}"
        return None

    def extra_repr(self):
        return f"{len(self.graph)} nodes"

    def __repr__(self):
        lines = [f"  %{i} = {_show_node(n)}" for i, n in enumerate(self.graph)]
        return "GraphModule(\n" + "\n".join(lines) + "\n)"


def flat(out):
    """A result holding tuples (LSTM's (output, (h_n, c_n))) as one flat tuple: what a node's "k" indexes."""
    return tuple(v for item in out for v in (flat(item) if isinstance(item, tuple) else (item,)))


def decode(a, value, batch, mode):
    """An encoded argument (see the module docstring) as the Python value it stands for: value(i, k)
    for a reference to node i's value (its k-th element, or all of it for k None), `batch` for the
    batch size and `mode` for the graph's training flag."""
    if isinstance(a, list):
        return [decode(v, value, batch, mode) for v in a]
    if not isinstance(a, dict):
        return a
    if "v" in a:
        return value(a["v"], a.get("k"))
    if "tuple" in a:
        return tuple(decode(v, value, batch, mode) for v in a["tuple"])
    if "slice" in a:
        return slice(*a["slice"])
    if "ellipsis" in a:
        return Ellipsis
    if "dtype" in a:
        return _DTYPES[a["dtype"]]
    if "batch" in a:
        return batch
    if "mode" in a:
        return mode
    if "inf" in a:
        return math.inf * a["inf"]
    raise AssertionError(a)


def _show(shape):
    return "(" + ", ".join(str(n) for n in shape) + ")"


def _show_node(n):
    op = n["op"]
    what = n.get("target") or n.get("type") or ""
    args = ", ".join(_show_arg(a) for a in n.get("args", []))
    kw = ", ".join(f"{k}={_show_arg(v)}" for k, v in n.get("kwargs", {}).items())
    shape = " -> " + ", ".join(_show(s) for s in n.get("out", [])) if n.get("out") else ""
    return f"{op}{'[' + what + ']' if what else ''}({', '.join(p for p in (args, kw) if p)}){shape}"


def _show_arg(a):
    if isinstance(a, dict) and "v" in a:
        return f"%{a['v']}" + (f"[{a['k']}]" if "k" in a else "")
    if isinstance(a, list):
        return "[" + ", ".join(_show_arg(v) for v in a) + "]"
    if isinstance(a, dict) and "tuple" in a:
        return "(" + ", ".join(_show_arg(v) for v in a["tuple"]) + ")"
    if isinstance(a, dict) and "slice" in a:
        return ":".join("" if v is None else str(v) for v in a["slice"])
    if isinstance(a, dict):
        return next(iter(a)) if "batch" not in a else "N"
    return repr(a)


# -- where a graph keeps what it uses ----------------------------------------------------------------
def _place(gm, modules, tensors):
    """Put the traced layers and tensors at their paths below gm (ModuleDicts in between), each path's
    nearest held ancestor first (a Sequential called whole holds its layers already)."""
    for path in modules:  # (in the model's order: state_dict keys keep it)
        if any(path.startswith(q + ".") for q in modules if q != path):
            continue  # inside a layer placed already
        parent, name = _parent(gm, path)
        setattr(parent, name, modules[path])
    for path, t in tensors.items():
        if any(path.startswith(q + ".") for q in modules):
            continue  # a tensor of a placed layer
        parent, name = _parent(gm, path)
        if isinstance(t, Parameter):
            setattr(parent, name, t)
        else:
            parent.register_buffer(name, t)


def _parent(gm, path):
    """(the module that holds `path`'s last part, that part), making ModuleDicts on the way."""
    *where, name = path.split(".")
    m = gm
    for part in where:
        kids = dict(m.named_children())
        if part not in kids:
            m.add_module(part, ModuleDict())
        m = dict(m.named_children())[part]
    return m, name


_KINDS = {"input": set(), "output": {"args"}, "call": {"target", "args", "kwargs"},
          "layer": {"type", "config", "args", "kwargs"}, "param": {"target"}, "const": {"target"}}


def _graph_problem(graph):
    """What is wrong with a node list (structure, references, sizes), or None: nothing in it runs."""
    if not isinstance(graph, list) or not 2 <= len(graph) <= MAX_NODES:
        return f"'graph' must be a list of 2 to {MAX_NODES} nodes"
    for i, n in enumerate(graph):
        if not isinstance(n, dict) or not isinstance(n.get("op"), str):
            return f"node {i} must be an object with an 'op'"
        op = n["op"]
        allowed = _KINDS.get(op, {"args", "kwargs"} if op in autograd.TRACEABLE else None)
        if allowed is None:
            return f"node {i}: unknown operation {op!r:.64}"
        if set(n) - allowed - {"op", "out"}:
            return f"node {i} ({op}): unexpected fields {sorted(set(n) - allowed - {'op', 'out'})!r:.100}"
        if (op == "input") != (i == 0) or (op == "output") != (i == len(graph) - 1):
            return f"node {i} ({op}): a graph starts with its input and ends with its output"
        if "target" in allowed and not (isinstance(n.get("target"), str) and _PATH.fullmatch(n["target"])):
            return f"node {i} ({op}): 'target' must be a dotted path"
        if op == "layer" and not (isinstance(n.get("type"), str) and _NAME.fullmatch(n["type"])
                                  and isinstance(n.get("config"), dict)):
            return f"node {i} (layer): needs a layer 'type' and a 'config' object"
        for field in ("args", "kwargs", "config"):
            if field in n:
                value = n[field]
                if field != "args":  # an object of named arguments
                    if not isinstance(value, dict) or not all(isinstance(k, str) and _NAME.fullmatch(k) for k in value):
                        return f"node {i} ({op}): '{field}' must map argument names to values"
                    value = list(value.values())
                p = _arg_problem(value, i, 0)
                if p:
                    return f"node {i} ({op}) {field}: {p}"
        if "args" in allowed - {"kwargs"} and op != "output" and not isinstance(n.get("args", []), list):
            return f"node {i} ({op}): 'args' must be a list"
        out = n.get("out", [])
        if not isinstance(out, list) or len(out) > 8 or any(
                not isinstance(s, list) or len(s) > 8 or any(not (x == "N" or (type(x) is int and 0 <= x < 2**31))
                                                             for x in s) for s in out):
            return f"node {i} ({op}): 'out' must list shapes (sizes or \"N\")"
    if not (isinstance(graph[-1].get("args"), list) and len(graph[-1]["args"]) == 1
            and isinstance(graph[-1]["args"][0], dict) and "v" in graph[-1]["args"][0]):
        return "the output node names one value"
    if not graph[0].get("out") or not graph[-1].get("out"):
        return "the input and output nodes give their shapes"
    for i, n in enumerate(graph):
        for v in _ref_pairs(n.get("args", [])) + _ref_pairs(list(n.get("kwargs", {}).values())):
            outs = graph[v[0]].get("out", [])
            if outs and (len(outs) != 1 if v[1] is None else v[1] >= len(outs)):
                return f"node {i} ({n['op']}): {_ref_text(v)} does not match node {v[0]}'s {len(outs)} outputs"
    i, k = _ref_pairs(graph[-1]["args"])[0]
    outs = graph[i].get("out", [])
    if outs and graph[-1]["out"] != [outs[k or 0]]:
        return f"the output node's shape {graph[-1]['out']!r:.60} is not node {i}'s"
    return None


def _ref_pairs(args):
    """(node, output or None) of every value reference in args."""
    out = []
    for a in args:
        if isinstance(a, dict) and "v" in a:
            out.append((a["v"], a.get("k")))
        elif isinstance(a, dict):
            out += _ref_pairs(list(a.values()))
        elif isinstance(a, list):
            out += _ref_pairs(a)
    return out


def _ref_text(v):
    return f"value {v[0]}" if v[1] is None else f"value {v[0]}[{v[1]}]"


def _arg_problem(a, i, depth):
    if depth > _MAX_ARG_DEPTH:
        return "nested too deep"
    if a is None or isinstance(a, bool) or (isinstance(a, int) and abs(a) < 2**31):
        return None
    if isinstance(a, float):
        return None if math.isfinite(a) else "a non-finite number"
    if isinstance(a, str):
        return None if len(a) <= 32 else "a string longer than 32 characters"
    if isinstance(a, list):
        if len(a) > _MAX_ARG_ITEMS:
            return f"a list of more than {_MAX_ARG_ITEMS} items"
        return next((p for p in (_arg_problem(v, i, depth + 1) for v in a) if p), None)
    if isinstance(a, dict):
        if "v" in a:
            ok = set(a) <= {"v", "k"} and type(a["v"]) is int and 0 <= a["v"] < i and \
                (a.get("k", 0) in (0, 1, 2) and type(a.get("k", 0)) is int)  # (LSTM's three)
            return None if ok else f"{a!r:.60} refers to no earlier value"
        if set(a) == {"tuple"}:
            return _arg_problem(a["tuple"], i, depth + 1) if isinstance(a["tuple"], list) else "a malformed tuple"
        if set(a) == {"slice"}:
            s = a["slice"]
            ok = isinstance(s, list) and len(s) == 3 and all(v is None or (type(v) is int and abs(v) < 2**31) for v in s)
            return None if ok else "a malformed slice"
        if a in ({"ellipsis": 1}, {"batch": 1}, {"mode": 1}, {"inf": 1}, {"inf": -1}):
            return None
        if set(a) == {"dtype"} and a["dtype"] in _DTYPES:
            return None
        return f"an unknown argument form {a!r:.60}"
    return f"an argument of type {type(a).__name__}"


# -- lifting: a graph of layer calls, residual adds and concatenations as a Sequential of blocks -------
def _as_layer(gm, i, node, args):
    """The layer that does what node i does to its one tensor argument (functional.LAYER_OF), or None."""
    op = node["op"]
    if op == "call":
        return gm.submodule(node["target"])
    if op == "layer":
        return gm._layer(i, node)
    if op == "flatten":  # (a layer keeps the batch: start_dim 0 is no Flatten)
        start, end = (list(args[1:]) + [0, -1][len(args) - 1:])[:2]
        return LAYERS["Flatten"](start, end) if start != 0 and not node.get("kwargs") and \
            all(type(a) is int for a in args[1:]) else None
    make = functional.LAYER_OF.get(op)
    try:
        plain = [_plain_arg(a) for a in args[1:]], {k: _plain_arg(a) for k, a in node.get("kwargs", {}).items()}
        return make(*plain[0], **plain[1]) if make is not None else None
    except (TypeError, ValueError):  # (arguments no layer takes: the graph stays as it is)
        return None


def _plain_arg(a):
    """An encoded argument as the number, string or tuple it is (TypeError for a value or a marker,
    except the graph's mode, which a layer follows itself)."""
    if isinstance(a, dict):
        if set(a) == {"tuple"}:
            return tuple(_plain_arg(v) for v in a["tuple"])
        if a == {"mode": 1}:
            return True
        raise TypeError(a)
    return [_plain_arg(v) for v in a] if isinstance(a, list) else a


def lift(gm):
    """The graph as an nn.Sequential of the same layer objects (activations, pools and flattens made
    layers; `a + b` between two branches of one value a Residual; `cat` of branches a Concat), or None
    where the graph is not of that shape (an operation with a parameter, a layer called twice, ...).
    The Sequential runs the graph's training fusions and fused inference."""
    w = _Walk(gm)
    if any(gm.submodule(t).named_tensors() for t in w.again):
        return None  # a layer with weights twice in one Sequential would overwrite its own saved state
    nodes = gm.graph
    try:
        layers, end = w.walk(0)
    except (_NotLiftable, KeyError, TypeError, ValueError):
        return None
    if w.users.get(end) != [len(nodes) - 1] or nodes[-1]["args"][0] != {"v": end}:
        return None
    return LAYERS["Sequential"](*layers)


class Segment:
    """A part of a graph that lifts (segments): node `root`'s value is `seq` applied to value `src`;
    the values of its other `members` are used inside it only."""

    def __init__(self, src, root, members, seq):
        self.src, self.root, self.members, self.seq = src, root, tuple(sorted(members)), seq
        self._layers_only = {}  # (queue, input shape) -> whether its plan is slower than its layers

    def takes(self, x):
        """Whether the fused plan runs input x: not where it would run a conv of more than
        GENERIC_CONV_MACS multiply-accumulates through the GPU family's kernel on a CPU
        (FusedPlan.generic_conv_macs), which the layers' own forwards run faster."""
        if x.queue is None:
            return True
        key = (x.queue.int_ptr, tuple(x.shape))
        slow = self._layers_only.get(key)
        if slow is None:
            try:
                slow = self.seq._fused.generic_conv_macs(x.queue, x.shape) > GENERIC_CONV_MACS
            except runtime.tiers.NotReady:  # (building in the background: the plan runs its layers meanwhile)
                return True
            if len(self._layers_only) >= 64:
                self._layers_only.clear()
            self._layers_only[key] = slow
        return not slow


def segments(gm):
    """The parts of a graph that does not lift whole (lift) that do: every maximal run of layer calls
    from one value, through forks that rejoin in a residual add or a concatenation, as a Segment
    whose Sequential runs the fused inference path (netcl.jit); runs of which no stage would fuse
    are left out. A layer with weights called more than once stays out of every segment."""

    w = _Walk(gm, partial=True)
    nodes, out, inside = gm.graph, [], set()

    def keep(src, layers, end, mark):
        taken = w.taken[mark:]
        seq = LAYERS["Sequential"](*layers)
        stages, _ = plan_stages([layer for _, layer in seq.chain()])
        if seq.knows_shapes() and any(s.fused for s in stages):
            out.append(Segment(src, end, taken, seq))
            inside.update(j for j in taken if j != end)

    for v in range(len(nodes) - 1):
        if v in inside or len(nodes[v].get("out", [])) != 1:
            continue
        mark = len(w.taken)
        layers, end = w.reach(v)
        if layers:
            keep(v, layers, end, mark)
            continue
        us = w.users.get(v, [])
        for j in us if len(us) > 1 else ():  # branches that do not rejoin: each its own segment
            if j in inside:
                continue
            mark = len(w.taken)
            try:
                first = w.layer_at(j)
            except (KeyError, TypeError, ValueError):
                first = None
            if first is not None:
                rest, end = w.reach(j)
                keep(v, [first] + rest, end, mark)
            else:
                del w.taken[mark:]
    return out


class _Fusion:
    """What a graph that does not lift runs fused in eval mode: its segments and element-wise chains,
    `at` each by the node whose value it computes, `skip` the nodes whose values it makes unneeded."""

    def __init__(self, segments, chains):
        self.segments, self.chains = segments, chains
        parts = segments + chains
        self.at = {p.root: p for p in parts}
        self.skip = frozenset(j for p in parts for j in p.members if j != p.root)

    @classmethod
    def of(cls, gm):
        """The _Fusion of gm (None where it lifts whole, or nothing in it fuses)."""
        if gm._lifted is not None:
            return None
        segs = segments(gm)
        users = _Walk(gm).users
        found = graph_chain.chains(gm.graph, users, {j for s in segs for j in s.members})
        return cls(segs, found) if segs or found else None


class _Walk:
    """Walks a graph's values forward, making layers of the nodes it passes (lift, segments);
    `taken` lists the nodes made layers and the joins of blocks, in the order walked."""

    def __init__(self, gm, partial=False):
        self.gm, self.nodes, self.partial = gm, gm.graph, partial
        self.users = {}
        for j, n in enumerate(self.nodes):
            for ref in _refs(n.get("args", [])) + _refs(list(n.get("kwargs", {}).values())):
                self.users.setdefault(ref, []).append(j)
        calls = [n["target"] for n in self.nodes if n["op"] == "call"]
        self.again = {t for t in calls if calls.count(t) > 1}
        self.seen, self.taken = set(), []

    def layer_at(self, j):
        """The layer of node j applied to its one tensor argument, or None."""
        n = self.nodes[j]
        args = n.get("args", [])
        if not args or args[0] != {"v": _input_of(n)} or _refs(args[1:]) or _refs(list(n.get("kwargs", {}).values())):
            return None
        if self.partial and n["op"] == "call" and n["target"] in self.again and \
                self.gm.submodule(n["target"]).named_tensors():
            return None
        layer = _as_layer(self.gm, j, n, [None] + list(args[1:]))
        if layer is None:
            return None
        if n["op"] == "call" and n["target"] in self.seen and not layer.named_tensors():
            # a weightless layer called again (a block's one ReLU), or walked again after a walk that
            # stopped (segments): a layer of its own each call
            layer = LAYERS[type(layer).__name__](**layer.config())
        self.seen.add(n.get("target"))
        self.taken.append(j)
        return layer

    def walk(self, v):
        """(layers, the value reached) from value v along single uses, through forks that rejoin."""
        layers = []
        while True:
            us = self.users.get(v, [])
            if len(us) == 1:
                j = us[0]
                if self.nodes[j]["op"] in ("add", "cat", "output"):
                    return layers, v
                layer = self.layer_at(j)
                if layer is None:
                    raise _NotLiftable
                layers.append(layer)
                v = j
                continue
            block, v = self.fork(v, us)
            layers.append(block)

    def reach(self, v):
        """walk(v) as far as it goes: stopped before the first node that does not lift, and at a value
        whose uses do not rejoin (segments)."""
        layers = []
        while True:
            us, mark = self.users.get(v, []), len(self.taken)
            try:
                if len(us) == 1:
                    j = us[0]
                    layer = None if self.nodes[j]["op"] in ("add", "cat", "output") else self.layer_at(j)
                    if layer is None:
                        return layers, v
                    layers.append(layer)
                    v = j
                elif len(us) > 1:
                    block, v = self.fork(v, us)
                    layers.append(block)
                else:
                    return layers, v
            except (_NotLiftable, KeyError, TypeError, ValueError):
                del self.taken[mark:]
                return layers, v

    def fork(self, v, us):
        """The block of value v's branches (v used by every node in us) and the value they join at."""
        nodes, users = self.nodes, self.users
        branches, join = [], None
        for u in us:
            if nodes[u]["op"] in ("add", "cat"):
                b, end = [], v
                j = u
            else:
                layer = self.layer_at(u)
                if layer is None:
                    raise _NotLiftable
                rest, end = self.walk(u)
                b = [layer] + rest
                j = users.get(end, [None])[0]
                if len(users.get(end, [])) != 1:
                    raise _NotLiftable
            if join is not None and j != join:
                raise _NotLiftable
            join = j
            branches.append((b, end))
        n = nodes[join]
        ins = _refs(n["args"])
        if sorted(ins) != sorted(e for _, e in branches) or len(ins) != len(branches):
            raise _NotLiftable
        by_end = {e: b for b, e in branches}
        ordered = [by_end[e] for e in ins]
        if n["op"] == "add" and len(ordered) == 2 and len(n["args"]) == 2:
            body, short = sorted(ordered, key=len, reverse=True)
            if not body:
                raise _NotLiftable
            shortcut = None if not short else (short[0] if len(short) == 1 else LAYERS["Sequential"](*short))
            self.taken.append(join)
            return LAYERS["Residual"](*body, shortcut=shortcut), join
        if n["op"] == "cat" and isinstance(n["args"][0], list) and len(n["args"]) == 2 and isinstance(n["args"][1], int):
            dim = n["args"][1]
            parts = [LAYERS["Sequential"](*b) if b else LAYERS["Identity"]() for b in ordered]
            self.taken.append(join)
            return LAYERS["Concat"](*parts, dim=dim), join
        raise _NotLiftable


class _NotLiftable(Exception):
    pass


def _op_batch_dim(name, args, kwargs, node, d):
    """Where operation `name`'s result holds the batch its input holds at d: a permutation moves it, a
    reshape puts it where its target names the batch size, an index drops the dimensions its integers
    take; any other operation keeps it where it was (held only where that dimension has the batch's size)."""
    if d is None:
        return None
    if kwargs and name in ("permute", "transpose", "reshape", "squeeze", "unsqueeze", "getitem"):
        return 0 if d == 0 else None  # (followed from positional arguments only)
    if name in ("permute", "transpose"):
        order = list(args[1:])
        if name == "transpose":
            n = args[0].ndim
            a, b = args[1] % n, args[2] % n
            order = list(range(n))
            order[a], order[b] = order[b], order[a]
        elif len(order) == 1 and isinstance(order[0], (tuple, list)):
            order = list(order[0])
        order = [int(k) % args[0].ndim for k in order]
        return order.index(d) if d in order else None
    if name == "reshape":
        target = node["args"][1:]
        if len(target) == 1 and isinstance(target[0], (list, dict)):  # (one list or tuple of sizes)
            target = target[0]["tuple"] if isinstance(target[0], dict) and "tuple" in target[0] else target[0]
        named = [k for k, v in enumerate(target) if v == {"batch": 1}]
        return named[0] if named else (0 if d == 0 else None)
    if name == "squeeze":
        x, n = args[0], args[0].ndim
        dims = range(n) if len(args) < 2 or args[1] is None else \
            [k % n for k in (args[1] if isinstance(args[1], (tuple, list)) else (args[1],))]
        gone = [k for k in dims if x.shape[k] == 1]
        return None if d in gone else d - sum(k < d for k in gone)
    if name == "unsqueeze":
        k = args[1] % (args[0].ndim + 1)
        return d + 1 if k <= d else d
    if name == "getitem":
        index = args[1] if isinstance(args[1], tuple) else (args[1],)
        if any(i is None or i is Ellipsis or isinstance(i, (Tensor, list, np.ndarray)) for i in index):
            return 0 if d == 0 else None
        if len(index) > d and not isinstance(index[d], slice):
            return None  # (the batch indexed away)
        return d - sum(not isinstance(i, slice) for i in index[:d])
    return d


def _names_batch(args):
    """Whether encoded arguments hold the batch size ({"batch": 1})."""
    if isinstance(args, dict):
        return args == {"batch": 1} or any(_names_batch(v) for v in args.values())
    return isinstance(args, list) and any(_names_batch(v) for v in args)


def _refs(args):
    return [i for i, _ in _ref_pairs(args)]


def _input_of(node):
    refs = _refs(node.get("args", [])[:1])
    return refs[0] if refs else None
