"""The chain importer: an ONNX file read with netcl's own protobuf bindings into a netcl Sequential
(netcl.io.onnx_graph's import_onnx tries it first, and replays the graphs it refuses).

Read `CONVERTERS` to see what each op becomes. The importer
1. reads the file (sizes checked before anything is allocated; external data only from the
   model's own folder) and folds every initializer-only subgraph (`FOLDERS`: a Reshape's shape
   computed by Shape/Gather/Concat/Unsqueeze on constants, a transposed weight, ...);
2. for a file netcl wrote, rebuilds the layer list recorded in its metadata (netcl.architecture)
   and keeps it only if exporting it gives exactly this graph: the same layers (Dropout and
   Identity emit no node), the same configs, weights by state_dict name;
3. otherwise walks the graph from its input: a node with one data input becomes layers through
   CONVERTERS (MatMul + Add fuse into one Linear); a value used by several nodes opens a block
   that ends where the paths meet (`MERGES`: Add -> Residual, Concat -> Concat); known multi-node
   subgraphs netcl itself writes (`PATTERNS`: MultiheadAttention) are recognised by their nodes'
   doc_strings and checked op by op;
4. where that walk refuses the graph (not a chain, or ops no layer is), replays it with netcl layers
   and tensor operations and traces it into a GraphModule (onnx_graph).
Unsupported ops raise NotImplementedError naming every one of them (op type and node); a file
that is not ONNX, or is corrupt, raises FormatError.
"""
import inspect
import json
import math
import os

import numpy as np

from netcl import nn
from netcl.errors import FormatError
from netcl.io import onnx_export as ox
from netcl.io.netcl_format import _build_layer, _scratch_rng
from netcl.io.onnx_export import onnx_pb2 as P
from netcl.nn.conv import same_pads

T = P.TensorProto
_MAX_NDIM = 8
_FOLD_SLACK = 1 << 10  # a folded constant may hold a few more elements than its inputs (a shape's dims)
# TensorProto data type -> (numpy dtype of its raw bytes, the typed field that may hold it instead)
DTYPES = {T.FLOAT: ("<f4", "float_data"), T.DOUBLE: ("<f8", None), T.FLOAT16: ("<f2", "int32_data"),
          T.INT64: ("<i8", "int64_data"), T.INT32: ("<i4", "int32_data"), T.INT16: ("<i2", "int32_data"),
          T.INT8: ("i1", "int32_data"), T.UINT8: ("u1", "int32_data"), T.UINT16: ("<u2", "int32_data"),
          T.BOOL: ("?", "int32_data")}


# -- reading ------------------------------------------------------------------------------
def _read_model(path):
    path = os.fspath(path)
    size = os.path.getsize(path)
    if size > ox.PROTOBUF_LIMIT:
        raise FormatError(f"{path}: {size} bytes, past protobuf's 2 GB limit: not an ONNX model file")
    with open(path, "rb") as f:
        data = f.read()
    try:
        m = P.ModelProto.FromString(data)
    except Exception as e:  # google.protobuf.message.DecodeError and friends
        raise FormatError(f"{path}: not an ONNX model ({type(e).__name__}: {e})") from None
    if not m.HasField("graph") or m.ir_version < 3 or not m.opset_import:
        raise FormatError(f"{path}: not an ONNX model (no graph, IR version or opset)")
    opsets = {o.domain or "ai.onnx": o.version for o in m.opset_import}
    if "ai.onnx" not in opsets or not 1 <= opsets["ai.onnx"] <= 10_000:
        raise FormatError(f"{path}: the model imports no ai.onnx opset")
    return m, opsets["ai.onnx"]


def _inside(folder, location):
    """The path of external data `location`, which must stay in `folder` (no absolute paths, no
    '..', no links out): a model file must not make netcl read anything else on the machine."""
    parts = location.replace("\\", "/").split("/")
    if not location or os.path.isabs(location) or location.startswith(("/", "\\")) or ".." in parts or ":" in location:
        raise FormatError(f"external data location {location!r} must be a relative path inside the model's folder")
    full = os.path.realpath(os.path.join(folder, *parts))
    if os.path.commonpath([full, os.path.realpath(folder)]) != os.path.realpath(folder):
        raise FormatError(f"external data location {location!r} leaves the model's folder")
    return full


def tensor_array(t, folder):
    """A TensorProto's values as a numpy array. Its dims are checked against the bytes that hold
    it (inline or in an external file in `folder`) before anything is allocated."""
    if t.data_type not in DTYPES:
        raise NotImplementedError(f"tensor {t.name!r}: data type {t.data_type} is not supported")
    dims = list(t.dims)
    if len(dims) > _MAX_NDIM or any(d < 0 for d in dims):
        raise FormatError(f"tensor {t.name!r}: dims {dims[:16]} are not a tensor shape")
    count = math.prod(dims)
    dtype, field = np.dtype(DTYPES[t.data_type][0]), DTYPES[t.data_type][1]
    nbytes = count * dtype.itemsize
    if t.data_location == T.EXTERNAL:
        info = {e.key: e.value for e in t.external_data}
        full = _inside(folder, info.get("location", ""))
        try:
            offset, length = int(info.get("offset", 0)), int(info.get("length", nbytes))
        except ValueError:
            raise FormatError(f"tensor {t.name!r}: external offset/length must be integers") from None
        have = os.path.getsize(full) if os.path.isfile(full) else -1
        if have < 0 or offset < 0 or length != nbytes or offset + length > have:
            raise FormatError(f"tensor {t.name!r}: {nbytes} bytes at offset {offset} of {info.get('location')!r} "
                              f"(length {length}) do not fit the file ({have} bytes)")
        with open(full, "rb") as f:
            f.seek(offset)
            a = np.frombuffer(f.read(nbytes), dtype)
    elif t.HasField("raw_data"):
        if len(t.raw_data) != nbytes:
            raise FormatError(f"tensor {t.name!r}: dims {dims} need {nbytes} bytes, raw_data holds {len(t.raw_data)}")
        a = np.frombuffer(t.raw_data, dtype)
    else:
        values = getattr(t, field) if field else []
        if len(values) != count:
            raise FormatError(f"tensor {t.name!r}: dims {dims} need {count} values, the file holds {len(values)}")
        if t.data_type == T.FLOAT16:
            a = np.asarray(values, np.uint16).view(np.float16)
        else:
            a = np.asarray(values, dtype)
    return a.reshape(dims)


def _attrs(node, folder):
    A = P.AttributeProto
    out = {}
    for a in node.attribute:
        kind = a.type or (A.FLOAT if a.HasField("f") else A.INT if a.HasField("i") else A.UNDEFINED)
        out[a.name] = {A.FLOAT: lambda: a.f, A.INT: lambda: a.i, A.STRING: lambda: a.s.decode("utf-8", "replace"),
                       A.FLOATS: lambda: list(a.floats), A.INTS: lambda: list(a.ints),
                       A.TENSOR: lambda: tensor_array(a.t, folder)}.get(kind, lambda: None)()
    return out


# -- folding initializer-only subgraphs ---------------------------------------------------
def _gather(a, i, k):
    return np.take(a, i.astype(np.int64), axis=k.get("axis", 0))


def _axes(node_attrs, inputs, opset, position=1):
    """Unsqueeze/Squeeze axes: an attribute before opset 13, an input from 13 on."""
    if opset < 13:
        return node_attrs.get("axes")
    return [int(v) for v in inputs[position].ravel()] if len(inputs) > position else None


def _unsqueeze(a, *rest, k, opset):
    out = a
    for ax in sorted(int(v) % (a.ndim + len(_axes(k, (a,) + rest, opset))) for v in _axes(k, (a,) + rest, opset)):
        out = np.expand_dims(out, ax)
    return out


def _squeeze(a, *rest, k, opset):
    axes = _axes(k, (a,) + rest, opset)
    return np.squeeze(a, axis=None if axes is None else tuple(axes))


def _reshape(a, shape, k):
    shape = [int(s) for s in shape]
    shape = [a.shape[i] if s == 0 and not k.get("allowzero", 0) else s for i, s in enumerate(shape)]
    return a.reshape(shape)


# op type -> numpy function of (inputs..., k=attributes[, opset]) for nodes whose inputs are all constant
FOLDERS = {
    "Constant": None,  # its value attribute (value, value_float(s), value_int(s))
    "Identity": lambda a, k: a,
    "Shape": lambda a, k: np.array(a.shape[k.get("start", 0):k.get("end", a.ndim)], np.int64),
    "Gather": lambda a, i, k: _gather(a, i, k),
    "Concat": lambda *xs, k: np.concatenate(xs, axis=k["axis"]),
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Reshape": _reshape,
    "Transpose": lambda a, k: np.transpose(a, k.get("perm")),
    "Cast": lambda a, k: a.astype(np.dtype(DTYPES[k["to"]][0])),
    "Add": lambda a, b, k: a + b, "Sub": lambda a, b, k: a - b, "Mul": lambda a, b, k: a * b,
    "Div": lambda a, b, k: a // b if a.dtype.kind == "i" else a / b,
    "Neg": lambda a, k: -a,
}
_NEEDS_OPSET = {"Unsqueeze", "Squeeze"}


def _constant(attrs, node):
    for key, make in (("value", lambda v: v), ("value_float", lambda v: np.float32(v)),
                      ("value_floats", lambda v: np.asarray(v, np.float32)), ("value_int", lambda v: np.int64(v)),
                      ("value_ints", lambda v: np.asarray(v, np.int64))):
        if attrs.get(key) is not None:
            return np.asarray(make(attrs[key]))
    raise NotImplementedError(f"Constant node {node.name!r}: only tensor, float(s) and int(s) values are supported")


def _fold(g):
    """Evaluate every node whose inputs are all constants (in graph order); the rest is the model."""
    dynamic = []
    for node in g.graph.node:
        ins = [v for v in node.input if v]
        if node.op_type in FOLDERS and node.domain in ("", "ai.onnx") and all(v in g.consts for v in ins):
            k = g.attrs(node)
            arrays = [g.consts[v] for v in ins]
            try:
                if node.op_type == "Constant":
                    out = _constant(k, node)
                else:
                    fn = FOLDERS[node.op_type]
                    out = fn(*arrays, k=k, opset=g.opset) if node.op_type in _NEEDS_OPSET else fn(*arrays, k=k)
            except (ValueError, IndexError, KeyError, TypeError, np.AxisError) as e:
                raise FormatError(f"node {node.name!r} ({node.op_type}) on constants fails: {e}") from None
            out = np.asarray(out)
            if out.size > sum(a.size for a in arrays) + _FOLD_SLACK:
                raise FormatError(f"node {node.name!r} ({node.op_type}) would make a constant of {out.size} values "
                                  "from far fewer: not a shape or weight computation")
            g.consts[node.output[0]] = out
        else:
            dynamic.append(node)
    return dynamic


# -- the graph being converted ------------------------------------------------------------
class _Graph:
    def __init__(self, model, opset, folder):
        self.graph, self.opset, self.folder = model.graph, opset, folder
        self.consts = {t.name: tensor_array(t, folder) for t in self.graph.initializer}
        self.nodes = _fold(self)
        self.consumers = {}
        for node in self.nodes:
            for v in node.input:
                self.consumers.setdefault(v, []).append(node)
        self.order = {id(n): i for i, n in enumerate(self.nodes)}

    def attrs(self, node):
        return _attrs(node, self.folder)

    def const(self, node, i, what, default=None):
        """Input i of `node`, which must be a constant (an initializer or folded)."""
        if i >= len(node.input) or not node.input[i]:
            return default
        if node.input[i] not in self.consts:
            raise NotImplementedError(f"node {node.name!r} ({node.op_type}): its {what} must be a constant")
        return self.consts[node.input[i]]

    def data_inputs(self, node):
        return [v for v in node.input if v and v not in self.consts]

    def used(self, value):
        return value in self.consumers or value in {o.name for o in self.graph.output}


def _shape_of(value_info):
    """(dims with None for the symbolic batch, batch is symbolic)."""
    t = value_info.type.tensor_type
    if not value_info.type.HasField("tensor_type") or t.elem_type not in (T.FLOAT, T.INT64, T.INT32):
        raise NotImplementedError(f"graph input {value_info.name!r} must be a float32 tensor (or integer indices "
                                  "of an Embedding)")
    dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
    if not dims or any(d is None for d in dims[1:]):
        raise NotImplementedError(f"graph input {value_info.name!r}: every dimension but the batch must be fixed, "
                                  f"got {dims}")
    return tuple(dims), dims[0] is None


# -- op converters: (graph, node, data input shape) -> [layers] ------------------------------
def _layer(kind, node, **config):
    """netcl layer `kind` of `config`; dilation/groups-like settings at their defaults are left out,
    and one that this netcl's class does not take is unsupported (not silently dropped)."""
    cls = getattr(nn, kind, None)
    if cls is None:
        raise NotImplementedError(f"node {node.name!r} ({node.op_type}) needs nn.{kind}, which this netcl lacks")
    params = inspect.signature(cls).parameters
    for k in [k for k in config if k not in params]:
        if config.pop(k) != _DEFAULTS.get(k):
            raise NotImplementedError(f"node {node.name!r} ({node.op_type}): netcl's {kind} has no {k!r}")
    try:
        return cls(**config)
    except (TypeError, ValueError) as e:
        raise NotImplementedError(f"node {node.name!r} ({node.op_type}): {e}") from None


_DEFAULTS = {"dilation": 1, "groups": 1}


def _with(layer, **arrays):
    layer.load_state_dict({k: np.ascontiguousarray(v, np.float32) for k, v in arrays.items()})
    return layer


def _two(node, name, values, default):
    """A 2-D node's (height, width) attribute as Conv2d takes it: an int where both match, else the pair."""
    values = list(values) if values is not None else [default, default]
    if len(values) != 2:
        raise NotImplementedError(f"node {node.name!r} ({node.op_type}): {name}={values} (expected 2 values)")
    return int(values[0]) if values[0] == values[1] else (int(values[0]), int(values[1]))


def _pads2d(node, k, kernel=None, dilation=1, stride=1):
    """A 2-D node's pads [top, left, bottom, right]: an int or (height, width) pair where each axis
    pads both sides alike, "same" where they are Conv2d's padding="same" (kernel given: a Conv);
    other one-sided pads PyTorch's layers cannot express are refused here (import_onnx's graph
    path, onnx_graph, then puts a Pad in front of such a node)."""
    if k.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        raise NotImplementedError(f"node {node.name!r} ({node.op_type}): auto_pad={k['auto_pad']} (give explicit pads)")
    top, left, bottom, right = (int(p) for p in (k.get("pads") or [0, 0, 0, 0]))
    if (top, left) == (bottom, right):
        return top if top == left else (top, left)
    if kernel is not None and stride == 1 and (top, left, bottom, right) == same_pads(kernel, dilation):
        return "same"
    raise NotImplementedError(f"node {node.name!r} ({node.op_type}): pads={[top, left, bottom, right]} (netcl pads "
                              "top and bottom alike and left and right alike, or as Conv2d's padding='same')")


def _bias(node, b, n):
    if b is None:
        return None
    if b.size not in (1, n) or b.ndim > 2:
        raise NotImplementedError(f"node {node.name!r} ({node.op_type}): bias of shape {b.shape} for {n} outputs")
    return np.broadcast_to(b.reshape(-1), (n,))


def _gemm(g, node, shape):
    k = g.attrs(node)
    w, c = g.const(node, 1, "weight B"), g.const(node, 2, "bias C")
    if k.get("transA", 0) or k.get("alpha", 1.0) != 1.0 or (c is not None and k.get("beta", 1.0) != 1.0) or w.ndim != 2:
        raise NotImplementedError(f"node {node.name!r} (Gemm): only alpha=1, beta=1, transA=0 with a 2-D weight")
    w = w.T if k.get("transB", 0) else w  # netcl's layout: (in, out)
    b = _bias(node, c, w.shape[1])
    layer = _layer("Linear", node, in_features=w.shape[0], out_features=w.shape[1], bias=b is not None)
    return [_with(layer, weight=w, **({"bias": b} if b is not None else {}))], node.output[0], [node]


def _matmul(g, node, shape):
    w = g.const(node, 1, "second input (a weight)")
    if w.ndim != 2 or node.input[0] in g.consts:
        raise NotImplementedError(f"node {node.name!r} (MatMul): only x @ W with a constant 2-D W")
    users = g.consumers.get(node.output[0], [])
    add = users[0] if len(users) == 1 and users[0].op_type == "Add" else None
    b = None
    if add is not None and len(g.data_inputs(add)) == 1:
        other = [v for v in add.input if v != node.output[0]]
        cand = g.consts.get(other[0]) if len(other) == 1 else None
        if cand is not None and cand.size == w.shape[1] and cand.shape[-1:] == (w.shape[1],):
            b = cand.reshape(-1)
    layer = _layer("Linear", node, in_features=w.shape[0], out_features=w.shape[1], bias=b is not None)
    layer = _with(layer, weight=w, **({"bias": b} if b is not None else {}))
    return ([layer], add.output[0], [node, add]) if b is not None else ([layer], node.output[0], [node])


def _one(node, name, values, default):
    values = list(values) if values is not None else [default]
    if len(values) != 1:
        raise NotImplementedError(f"node {node.name!r} ({node.op_type}): {name}={values} on a 1-D input")
    return int(values[0])


def _pads1d(node, k, kernel=None, dilation=1, stride=1):
    """A 1-D node's padding: an int where both sides match, "same" where (left, right) is Conv1d's
    padding="same" (kernel given: a Conv), else unsupported."""
    if k.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        raise NotImplementedError(f"node {node.name!r} ({node.op_type}): auto_pad={k['auto_pad']} (give explicit pads)")
    left, right = (int(p) for p in (k.get("pads") or [0, 0]))
    if left == right:
        return left
    total = dilation * (kernel - 1) if kernel is not None else -1
    if stride == 1 and (left, right) == (total // 2, total - total // 2):
        return "same"
    raise NotImplementedError(f"node {node.name!r} ({node.op_type}): pads={[left, right]} (netcl pads both sides "
                              "alike, or as Conv1d's padding='same')")


def _conv1d(g, node, k, w, b):
    size, groups = _one(node, "kernel_shape", k.get("kernel_shape") or w.shape[2:], 1), int(k.get("group", 1))
    stride, dilation = _one(node, "strides", k.get("strides"), 1), _one(node, "dilations", k.get("dilations"), 1)
    layer = _layer("Conv1d", node, in_channels=w.shape[1] * groups, out_channels=w.shape[0], kernel_size=size,
                   stride=stride, padding=_pads1d(node, k, size, dilation, stride), dilation=dilation, groups=groups,
                   bias=b is not None)
    return [_with(layer, weight=w, **({"bias": _bias(node, b, w.shape[0])} if b is not None else {}))], node.output[0], [node]


def _conv(g, node, shape):
    k, w, b = g.attrs(node), g.const(node, 1, "weight"), g.const(node, 2, "bias")
    if w.ndim == 3:  # a 1-D convolution on (N, C, L)
        return _conv1d(g, node, k, w, b)
    if w.ndim != 4:
        raise NotImplementedError(f"node {node.name!r} (Conv): only 1-D and 2-D convolutions (a 3-D or 4-D weight)")
    groups = int(k.get("group", 1))
    size = _two(node, "kernel_shape", k.get("kernel_shape") or w.shape[2:], 1)
    stride, dilation = _two(node, "strides", k.get("strides"), 1), _two(node, "dilations", k.get("dilations"), 1)
    layer = _layer("Conv2d", node, in_channels=w.shape[1] * groups, out_channels=w.shape[0], kernel_size=size,
                   stride=stride, padding=_pads2d(node, k, size, dilation, stride), dilation=dilation, groups=groups,
                   bias=b is not None)
    return [_with(layer, weight=w, **({"bias": _bias(node, b, w.shape[0])} if b is not None else {}))], node.output[0], [node]


def _batchnorm(g, node, shape):
    k = g.attrs(node)
    if k.get("training_mode", 0) or k.get("spatial", 1) != 1 or any(g.used(v) for v in node.output[1:] if v):
        raise NotImplementedError(f"node {node.name!r} (BatchNormalization): only inference form (one output)")
    if shape is None or len(shape) not in (2, 3, 4):
        raise NotImplementedError(f"node {node.name!r} (BatchNormalization): netcl has BatchNorm1d (2-D, 3-D input) "
                                  f"and BatchNorm2d (4-D), input {shape}")
    scale, bias, mean, var = (g.const(node, i, what) for i, what in enumerate(("scale", "B", "mean", "var"), 1))
    layer = _layer("BatchNorm2d" if len(shape) == 4 else "BatchNorm1d", node, num_features=scale.size,
                   eps=float(k.get("epsilon", 1e-5)))
    return [_with(layer, weight=scale, bias=bias, running_mean=mean, running_var=var)], node.output[0], [node]


def _groupnorm(g, node, shape):
    """GroupNorm; opset 18's per-group scale and bias (G values) repeated over each group's channels,
    opset 21's per-channel ones (C values) as they are."""
    k = g.attrs(node)
    scale, bias = g.const(node, 1, "scale"), g.const(node, 2, "bias")
    groups = int(k.get("num_groups", 0))
    c = int(shape[1]) if shape is not None and len(shape) >= 2 and shape[1] is not None else scale.size
    if groups < 1 or c % groups or scale.size not in (c, groups) or bias.size != scale.size:
        raise NotImplementedError(f"node {node.name!r} (GroupNormalization): num_groups={groups}, scale of "
                                  f"{scale.size} and bias of {bias.size} values for {c} channels")
    if scale.size != c:  # one per group (opset 18)
        scale, bias = np.repeat(scale.reshape(-1), c // groups), np.repeat(bias.reshape(-1), c // groups)
    layer = _layer("GroupNorm", node, num_groups=groups, num_channels=c, eps=float(k.get("epsilon", 1e-5)))
    return [_with(layer, weight=scale.reshape(-1), bias=bias.reshape(-1))], node.output[0], [node]


def _instancenorm(g, node, shape):
    """InstanceNorm2d on (N, C, H, W); on other ranks the same normalisation as GroupNorm(C, C) (torch.onnx
    writes GroupNorm before opset 18 as an InstanceNormalization of x reshaped to (N, G, -1))."""
    scale, bias = g.const(node, 1, "scale"), g.const(node, 2, "B")
    c, eps = scale.size, float(g.attrs(node).get("epsilon", 1e-5))
    if bias.size != c or (shape is not None and (len(shape) < 3 or shape[1] not in (None, c))):
        raise NotImplementedError(f"node {node.name!r} (InstanceNormalization): scale of {scale.size} and bias of "
                                  f"{bias.size} values on input {shape}")
    layer = (_layer("InstanceNorm2d", node, num_features=c, eps=eps, affine=True) if shape is not None and
             len(shape) == 4 else _layer("GroupNorm", node, num_groups=c, num_channels=c, eps=eps))
    return [_with(layer, weight=scale.reshape(-1), bias=bias.reshape(-1))], node.output[0], [node]


def _pool(kind):
    def convert(g, node, shape):
        k = g.attrs(node)
        ceil = bool(k.get("ceil_mode", 0))
        if (ceil and kind != "MaxPool2d") or k.get("storage_order", 0) or any(g.used(v) for v in node.output[1:] if v):
            raise NotImplementedError(f"node {node.name!r} ({node.op_type}): storage_order, indices and an "
                                      "AveragePool's ceil_mode are not supported")
        if len(k.get("kernel_shape") or ()) == 1:  # on (N, C, L): MaxPool1d, AvgPool1d
            name, read, pads = kind.replace("2d", "1d"), _one, _pads1d
        else:
            name, read, pads = kind, _two, _pads2d
        if read(node, "dilations", k.get("dilations"), 1) != 1:
            raise NotImplementedError(f"node {node.name!r} ({node.op_type}): dilated pooling")
        size, pad = read(node, "kernel_shape", k.get("kernel_shape"), None), pads(node, k)
        if name.startswith("AvgPool") and pad and not k.get("count_include_pad", 0):
            raise NotImplementedError(f"node {node.name!r} (AveragePool): count_include_pad=0 with padding "
                                      f"(netcl's {name} counts the padding, as PyTorch's default)")
        extra = {"ceil_mode": True} if ceil else {}
        layer = _layer(name, node, kernel_size=size, stride=read(node, "strides", k.get("strides"), 1), padding=pad,
                       **extra)
        return [layer], node.output[0], [node]
    return convert


def _global_avg_pool(g, node, shape):
    if shape is not None and len(shape) == 3:  # (N, C, L)
        return [_layer("AdaptiveAvgPool1d", node, output_size=1)], node.output[0], [node]
    if hasattr(nn, "AdaptiveAvgPool2d"):
        return [_layer("AdaptiveAvgPool2d", node, output_size=1)], node.output[0], [node]
    if shape is None or len(shape) != 4 or shape[2] != shape[3]:
        raise NotImplementedError(f"node {node.name!r} (GlobalAveragePool): on input {shape} needs nn.AdaptiveAvgPool2d")
    return [_layer("AvgPool2d", node, kernel_size=shape[2])], node.output[0], [node]  # one square window


def _flat(g, node, shape, target):
    """A reshape of (N, ...) to `target`: Flatten when it is (N, prod(...)), nothing when unchanged."""
    n = shape[0]
    if tuple(target) == tuple(shape):
        return [], node.output[0], [node]
    if len(target) == 2 and target[1] == math.prod(shape[1:]) and target[0] in (n, None):
        return [_layer("Flatten", node)], node.output[0], [node]
    raise NotImplementedError(f"node {node.name!r} ({node.op_type}): reshaping {shape} to {tuple(target)} "
                              "(netcl reshapes by Flatten only)")


def _flatten(g, node, shape):
    axis = g.attrs(node).get("axis", 1)
    if axis % len(shape) != 1:
        raise NotImplementedError(f"node {node.name!r} (Flatten): axis={axis} (netcl flattens from axis 1)")
    return _flat(g, node, shape, (shape[0], math.prod(shape[1:])))


def _reshape_node(g, node, shape):
    spec = [int(v) for v in g.const(node, 1, "shape").ravel()]
    if not g.attrs(node).get("allowzero", 0):  # 0 copies the input's dimension
        spec = [shape[i] if v == 0 and i < len(shape) else v for i, v in enumerate(spec)]
    if shape[0] is None and spec and spec[0] in (-1, None):  # the symbolic batch stays in front
        spec[0] = None
    if spec.count(-1) == 1:
        known = math.prod(v for v in spec if v not in (-1, None))
        total = math.prod(shape[1:]) * (1 if shape[0] is None else shape[0])
        spec[spec.index(-1)] = total // known if known else -1
    return _flat(g, node, shape, spec)


def _squeeze_node(g, node, shape):
    axes = _axes(g.attrs(node), [None] + [g.consts.get(v) for v in node.input[1:]], g.opset)
    axes = sorted({a % len(shape) for a in axes}) if axes is not None else [i for i, d in enumerate(shape) if d == 1]
    return _flat(g, node, shape, tuple(d for i, d in enumerate(shape) if i not in axes))


def _softmax(g, node, shape):
    axis = g.attrs(node).get("axis", 1 if g.opset < 13 else -1)
    if g.opset < 13 and axis % len(shape) != len(shape) - 1:  # before 13: softmax of the flattened trailing dims
        raise NotImplementedError(f"node {node.name!r} (Softmax-{g.opset}): axis={axis} of a {len(shape)}-D input "
                                  "normalises several dimensions together")
    return [_layer("Softmax", node, dim=axis)], node.output[0], [node]


def _log_softmax(g, node, shape):
    axis = g.attrs(node).get("axis", 1 if g.opset < 13 else -1)
    if g.opset < 13 and axis % len(shape) != len(shape) - 1:  # before 13: the flattened trailing dims together
        raise NotImplementedError(f"node {node.name!r} (LogSoftmax-{g.opset}): axis={axis} of a {len(shape)}-D "
                                  "input normalises several dimensions together")
    return [_layer("LogSoftmax", node, dim=axis)], node.output[0], [node]


def _prelu(g, node, shape):
    slope = g.const(node, 1, "slope")
    n = slope.size
    channels = shape[1] if shape is not None and len(shape) > 1 else None
    if n != 1 and (slope.ndim == 0 or n != channels or slope.shape[0] != n
                   or (len(shape) > 2 and slope.ndim != len(shape) - 1)):
        raise NotImplementedError(f"node {node.name!r} (PRelu): slope of shape {slope.shape} on input {shape} "
                                  "(netcl's PReLU has one slope, or one per channel of dimension 1)")
    layer = _layer("PReLU", node, num_parameters=n)
    return [_with(layer, weight=slope.reshape(n))], node.output[0], [node]


def _dropout(g, node, shape):
    if len(node.output) > 1 and g.used(node.output[1]):
        raise NotImplementedError(f"node {node.name!r} (Dropout): its mask output is used")
    ratio = g.attrs(node).get("ratio") if g.opset < 12 else g.const(node, 1, "ratio")
    return [_layer("Dropout", node, p=float(0.5 if ratio is None else np.asarray(ratio).item()))], node.output[0], [node]


def _resize(g, node, shape):
    """Resize/Upsample by an integer factor on H and W -> Upsample ("nearest" or "bilinear")."""
    k = g.attrs(node)
    if node.op_type == "Upsample" or g.opset == 10:  # scales only; asymmetric coordinates, floor
        scales = k.get("scales") if g.opset < 9 else g.const(node, 1, "scales")
        coord, nearest = "asymmetric", "floor"
    else:
        scales, sizes = g.const(node, 2, "scales"), g.const(node, 3, "sizes")
        if (scales is None or np.size(scales) == 0) and sizes is not None and shape is not None:
            scales = [1.0] + [s / d for s, d in zip(np.ravel(sizes)[1:], shape[1:])]  # the batch is kept
        coord = k.get("coordinate_transformation_mode", "half_pixel")
        nearest = k.get("nearest_mode", "round_prefer_floor")
    mode, half = k.get("mode", "nearest"), coord in ("half_pixel", "pytorch_half_pixel")
    # with an integer factor, nearest is the same under asymmetric+floor and half_pixel+round_prefer_*
    netcl_mode = ("nearest" if mode == "nearest" and ((coord == "asymmetric" and nearest == "floor")
                                                      or (half and nearest.startswith("round_prefer")))
                  else "bilinear" if mode in ("linear", "bilinear") and half else None)
    f = [float(v) for v in np.ravel(scales)] if scales is not None else []
    if netcl_mode is None or len(f) != 4 or f[:2] != [1.0, 1.0] or f[2] != f[3] or f[2] != int(f[2]) or f[2] < 1:
        raise NotImplementedError(f"node {node.name!r} ({node.op_type}): mode={mode}, coordinate_transformation_mode="
                                  f"{coord}, scales={f} (netcl upsamples (N, C, H, W) by one integer factor, nearest "
                                  "or bilinear with half_pixel)")
    return [_layer("Upsample", node, scale_factor=int(f[2]), mode=netcl_mode)], node.output[0], [node]


def _direct(kind, **attrs):
    """A layer whose config is the node's attributes (ONNX name -> (netcl name, default))."""
    def convert(g, node, shape):
        k = g.attrs(node)
        return [_layer(kind, node, **{ours: k.get(theirs, default) for theirs, (ours, default) in attrs.items()})], \
            node.output[0], [node]
    return convert


def _identity(g, node, shape):
    return [], node.output[0], [node]


def _gather_rows(g, node, shape):
    """Gather of a constant 2-D table's rows (axis 0) at the data input's indices -> Embedding."""
    table = g.consts.get(node.input[0])
    if table is None or table.ndim != 2 or g.attrs(node).get("axis", 0) != 0 or node.input[1] in g.consts:
        raise NotImplementedError(f"node {node.name!r} (Gather): only rows (axis 0) of a constant 2-D table at the "
                                  "data input's indices (an Embedding)")
    layer = _layer("Embedding", node, num_embeddings=table.shape[0], embedding_dim=table.shape[1])
    return [_with(layer, weight=table)], node.output[0], [node]


def _cast_to_indices(g, node, shape):
    """A Cast to integers that only Gathers read: nothing (Embedding takes whole float numbers as indices)."""
    if g.attrs(node).get("to") not in (T.INT64, T.INT32) or \
            any(n.op_type != "Gather" for n in g.consumers.get(node.output[0], [])):
        raise NotImplementedError(f"node {node.name!r} (Cast): only to the indices of an Embedding (netcl computes "
                                  "in float32)")
    return [], node.output[0], [node]


CONVERTERS = {
    "Gemm": _gemm,                           # Linear (transB=1: the weight transposed into (in, out))
    "MatMul": _matmul,                       # Linear, with the Add of a constant bias after it
    "Conv": _conv,                           # Conv2d, or Conv1d on a 3-D weight (groups/dilation as the layer has them)
    "BatchNormalization": _batchnorm,        # BatchNorm2d, or BatchNorm1d on 2-D/3-D input (inference form)
    "GroupNormalization": _groupnorm,        # GroupNorm (opset 18's per-group scale and bias repeated per channel)
    "InstanceNormalization": _instancenorm,  # InstanceNorm2d (affine) on 4-D input, GroupNorm(C, C) on others
    "Relu": _direct("ReLU"),
    "LeakyRelu": _direct("LeakyReLU", alpha=("negative_slope", 0.01)),
    "Sigmoid": _direct("Sigmoid"),
    "Tanh": _direct("Tanh"),
    "Gelu": _direct("GELU", approximate=("approximate", "none")),  # opset 20's node (before it: Erf's pattern)
    "MaxPool": _pool("MaxPool2d"),           # MaxPool2d, or MaxPool1d with a 1-D kernel_shape
    "AveragePool": _pool("AvgPool2d"),       # AvgPool2d, or AvgPool1d with a 1-D kernel_shape
    "GlobalAveragePool": _global_avg_pool,   # AdaptiveAvgPool2d(1) (AdaptiveAvgPool1d(1) on 3-D input)
    "Flatten": _flatten,                     # Flatten (axis 1)
    "Reshape": _reshape_node,                # Flatten, when it flattens (N, ...) to (N, -1)
    "Squeeze": _squeeze_node,                # Flatten, when it drops (N, C, 1, 1)'s unit dims
    "Softmax": _softmax,
    "LogSoftmax": _log_softmax,
    "Elu": _direct("ELU", alpha=("alpha", 1.0)),
    "Softplus": _direct("Softplus"),         # (beta 1; netcl's beta != 1 is read back from the file's record)
    "Mish": _direct("Mish"),
    "PRelu": _prelu,                         # PReLU (one slope, or one per channel)
    "Dropout": _dropout,
    "Identity": _identity,                   # no layer
    "Gather": _gather_rows,                  # Embedding (rows of a constant table at the input's indices)
    "Cast": _cast_to_indices,                # no layer, before an Embedding's Gather
    "Resize": _resize,                       # Upsample (integer scale)
    "Upsample": _resize,
}


# -- blocks: where a value is used by several nodes ----------------------------------------
def _residual(g, node, branches):
    if not hasattr(nn, "Residual"):
        raise NotImplementedError(f"node {node.name!r} (Add) joins two branches: it needs nn.Residual, which this "
                                  "netcl lacks")
    body, shortcut = sorted(branches, key=lambda b: -1 if b is None else len(b))[::-1]
    if body is None:
        raise NotImplementedError(f"node {node.name!r} (Add): x + x")
    shortcut = None if shortcut is None else shortcut[0] if len(shortcut) == 1 else nn.Sequential(*shortcut)
    return nn.Residual(*body, shortcut=shortcut)


def _concat(g, node, branches):
    if not hasattr(nn, "Concat"):
        raise NotImplementedError(f"node {node.name!r} (Concat) joins branches: it needs nn.Concat, which this "
                                  "netcl lacks")
    parts = [nn.Identity() if b is None else b[0] if len(b) == 1 else nn.Sequential(*b) for b in branches]
    return nn.Concat(*parts, dim=g.attrs(node).get("axis", 1))


MERGES = {"Add": _residual, "Concat": _concat}  # the node where branches meet -> the block


# -- netcl's own multi-node subgraphs --------------------------------------------------------
_MHA_OPS = ["Reshape", "Gemm", "Reshape", "Transpose", "Gather", "Gather", "Gather", "Transpose", "MatMul", "Mul",
            "Softmax", "MatMul", "Transpose", "Reshape", "Gemm", "Reshape"]


def _multihead_attention(g, nodes, shape):
    """onnx_export's MultiheadAttention subgraph, op by op; the head count from its qkv Reshape."""
    if [n.op_type for n in nodes] != _MHA_OPS:
        raise NotImplementedError(f"nodes {nodes[0].name!r}...: not the MultiheadAttention subgraph netcl writes")
    w_in, b_in = g.const(nodes[1], 1, "in_proj_weight"), g.const(nodes[1], 2, "in_proj_bias")
    w_out, b_out = g.const(nodes[14], 1, "out_proj.weight"), g.const(nodes[14], 2, "out_proj.bias")
    heads = int(g.const(nodes[2], 1, "shape").ravel()[3])
    e = w_in.shape[1]
    layer = _layer("MultiheadAttention", nodes[0], embed_dim=e, num_heads=heads)
    return [_with(layer, **{"in_proj_weight": w_in, "in_proj_bias": b_in, "out_proj.weight": w_out,
                            "out_proj.bias": b_out})], nodes[-1].output[0], nodes


PATTERNS = {"MultiheadAttention": _multihead_attention}  # netcl layer class (node doc_string) -> matcher


def _groups(g):
    """{id(first node): nodes} of the PATTERNS subgraphs, found by the layer netcl names in doc_strings."""
    by_layer = {}
    for node in g.nodes:
        doc = node.doc_string
        if doc.startswith("netcl layer ") and ": " in doc:
            kind = doc.split(": ", 1)[1].split("(", 1)[0]
            if kind in PATTERNS:
                by_layer.setdefault(doc, (kind, []))[1].append(node)
    return {id(nodes[0]): (kind, nodes) for kind, nodes in by_layer.values()}


# -- the walk ---------------------------------------------------------------------------------
class _Walk:
    def __init__(self, g):
        self.g, self.groups = g, _groups(g)
        self.grouped = {id(n) for _, nodes in self.groups.values() for n in nodes}

    def shape_after(self, layers, shape):
        for layer in layers:
            if shape is None:
                return None
            n = shape[0]
            out = layer.output_shape((1 if n is None else n,) + tuple(shape[1:]))
            shape = (n,) + tuple(out[1:])
        return shape

    def chain(self, x, shape, end, allowed):
        """The layers between value x and value `end`, through the nodes in `allowed` (ids)."""
        layers = []
        while x != end:
            users = [n for n in self.g.consumers.get(x, []) if id(n) in allowed]
            if not users:
                raise NotImplementedError(f"value {x!r} does not lead to {end!r}: the graph is not one model")
            if len(users) == 1 and self.g.data_inputs(users[0]) == [x]:
                node = users[0]
                if id(node) in self.groups:
                    kind, nodes = self.groups[id(node)]
                    new, y, used = PATTERNS[kind](self.g, nodes, shape)
                elif node.op_type not in CONVERTERS:  # e.g. an Add of a constant that follows no MatMul
                    raise NotImplementedError(f"node {node.name!r} ({node.op_type}) on one data input is not supported")
                else:
                    new, y, used = CONVERTERS[node.op_type](self.g, node, shape)
                for n in used:
                    allowed.discard(id(n))
            else:
                new, y = self.block(x, shape, allowed)
            layers += new
            shape, x = self.shape_after(new, shape), y
        return layers, shape

    def block(self, x, shape, allowed):
        merge = self.merge_node(x, allowed)
        if merge.op_type not in MERGES:
            raise NotImplementedError(f"the branches from {x!r} meet at node {merge.name!r} ({merge.op_type}); "
                                      f"netcl joins branches only with {', '.join(MERGES)}")
        branches = []
        for v in self.g.data_inputs(merge):
            if v == x:
                branches.append(None)
                continue
            between = self.between(x, v, allowed)
            allowed -= between
            layers, _ = self.chain(x, shape, v, between)
            branches.append(layers)
        allowed.discard(id(merge))
        return [MERGES[merge.op_type](self.g, merge, branches)], merge.output[0]

    def merge_node(self, x, allowed):
        """The first node after which every path from x has met (x's post-dominator)."""
        reach, left = {x}, {}
        for node in sorted((n for n in self.g.nodes if id(n) in allowed), key=lambda n: self.g.order[id(n)]):
            ins = [v for v in node.input if v in reach]
            if not ins:
                continue
            for v in ins:
                left[v] = left.get(v, len([u for u in self.g.consumers[v] if id(u) in allowed])) - 1
            reach.update(node.output)
            live = {v for v in reach if left.get(v, 1) > 0 and (v in self.g.consumers or v in self.outputs())}
            if len(ins) > 1 or node.op_type in MERGES:
                if live == {node.output[0]}:
                    return node
        raise NotImplementedError(f"the branches from {x!r} never meet again")

    def between(self, x, v, allowed):
        """Ids of the nodes on the paths from x to v."""
        out, todo = set(), [v]
        while todo:
            value = todo.pop()
            for node in self.g.nodes:
                if value in node.output and id(node) in allowed and id(node) not in out:
                    out.add(id(node))
                    todo += [i for i in self.g.data_inputs(node) if i != x]
        return out

    def outputs(self):
        return {o.name for o in self.g.graph.output}


def _unsupported(g, grouped):
    bad = [f"{n.op_type} (node {n.name or '?'!r})" for n in g.nodes
           if id(n) not in grouped and (n.domain not in ("", "ai.onnx")
                                         or (n.op_type not in CONVERTERS and n.op_type not in MERGES))]
    if bad:
        raise NotImplementedError(f"cannot import: unsupported {', '.join(bad)}; supported ops: "
                                  f"{', '.join(sorted(set(CONVERTERS) | set(MERGES)))}, and initializer-only "
                                  f"subgraphs of {', '.join(k for k in FOLDERS)}")


# -- netcl's own files: the recorded layer list, if it re-exports to exactly this graph -------
class _Recorded:
    """What netcl_format's layer builder needs: a place to fail and a table to check sizes against
    (here the file's initializers, named by state_dict keys), so a recorded config can never make
    netcl allocate what the file does not hold."""

    def __init__(self, consts):
        self.consts = consts

    def fail(self, msg):
        raise FormatError(msg)

    def check(self, name, shape):
        a = self.consts.get(name)
        if a is None or a.shape != tuple(shape) or a.dtype != np.float32:
            raise FormatError(f"recorded tensor {name!r} {tuple(shape)} is not an initializer of the graph")


def _recorded_model(m, g, shape, dynamic):
    arch = {p.key: p.value for p in m.metadata_props}.get("netcl.architecture")
    if m.producer_name != "netcl" or arch is None:
        return None
    try:
        entries = json.loads(arch)
        if not isinstance(entries, list):
            return None
        r = _Recorded(g.consts)
        with _scratch_rng():
            model = nn.Sequential(*(_build_layer(r, e, str(i), 1, [1 << 16]) for i, e in enumerate(entries)))
        for name, t in model.named_tensors():
            t.set_(g.consts[name])
        graph = m.graph
        rebuilt, inits, _ = ox._build(model.eval(), (shape[0] or 1,) + tuple(shape[1:]), dynamic,
                                      graph.input[0].name, graph.output[0].name, opset=g.opset)
    except (FormatError, ValueError, TypeError, KeyError, NotImplementedError, RecursionError):
        return None
    same = ([n.SerializeToString() for n in rebuilt.node] == [n.SerializeToString() for n in graph.node]
            and sorted(name for name, *_ in inits) == sorted(t.name for t in graph.initializer)
            and all(np.array_equal(src, g.consts[name]) for name, _, _, src in inits if isinstance(src, np.ndarray)))
    return model if same else None


# -- the entry point ----------------------------------------------------------------------------
def read(path):
    """The ONNX file at `path` read for import_onnx (netcl.io.onnx_graph): (the model netcl recorded in
    it, or None; the _Graph; the input's name; the output's name; the input's dims; whether its batch
    is symbolic). Raises FormatError for a file that is not ONNX or is corrupt, NotImplementedError
    for a graph without one float input and one output."""
    m, opset = _read_model(path)
    folder = os.path.dirname(os.path.abspath(os.fspath(path)))
    g = _Graph(m, opset, folder)
    inputs = [i for i in m.graph.input if i.name not in g.consts]
    if len(inputs) != 1 or len(m.graph.output) != 1:
        raise NotImplementedError(f"netcl models have one input and one output; the graph has {len(inputs)} inputs "
                                  f"and {len(m.graph.output)} outputs")
    shape, dynamic = _shape_of(inputs[0])
    return _recorded_model(m, g, shape, dynamic), g, inputs[0].name, m.graph.output[0].name, shape, dynamic


def chain(g, input_name, output_name, shape, dynamic):
    """The graph as an nn.Sequential of layers and blocks (NotImplementedError where it is not one)."""
    walk = _Walk(g)
    _unsupported(g, walk.grouped)
    allowed = {id(n) for n in g.nodes}
    with _scratch_rng():
        layers, _ = walk.chain(input_name, (None,) + shape[1:] if dynamic else shape, output_name, allowed)
    if allowed:
        left = [n for n in g.nodes if id(n) in allowed]
        raise NotImplementedError(f"nodes {', '.join(repr(n.name) for n in left[:10])} do not lie between the input "
                                  "and the output")
    return nn.Sequential(*layers).eval()
