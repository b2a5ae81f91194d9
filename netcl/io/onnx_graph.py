"""import_onnx for graphs that are not a chain: the ONNX nodes replayed, in their (topological)
order, by a netcl Module, then traced (netcl.trace) into the GraphModule import_onnx returns.

Read `OPS` to see what each op becomes. A node
- of a layer (Conv, Gemm, MatMul with a constant weight, BatchNormalization, pools, activations, ...)
  runs the netcl layer onnx_import's CONVERTERS make of it (the chain importer's, so a setting one
  refuses the other refuses too), held at the path its weight's initializer names
  ("layer1.0.conv1.weight" -> layer1.0.conv1), else at the node's name, sanitized;
- of arithmetic, shapes or joins (Add/Sub/Mul/Div with broadcasting, Concat, Reshape, Transpose,
  Split, Slice, ...) runs the netcl operation of the same meaning; a float initializer it takes as
  an operand is a Parameter named after the initializer (sanitized), a number of one element a
  Python float;
- whose inputs are all known on the host (initializers, and shapes: Shape of a tensor is its shape)
  is computed with numpy (onnx_import's FOLDERS), so Shape -> Gather -> Unsqueeze -> Concat -> Reshape
  chains fold to a plain target shape.
A Reshape or Expand target's first entry equal to the input's batch size (the graph's own, or 2
where the graph's batch is symbolic) is taken to be the batch: the GraphModule keeps it free. The
trace follows the batch off the first dimension and back (a Transpose, ONNX's time-major LSTM/GRU, a
Squeeze or Unsqueeze, a Reshape that copies it with a 0, an index); a graph that loses it (torch's
MultiheadAttention folds it into another dimension) comes back for batch 2 only, and says so when
given another.
GELU as torch writes it before opset 20 (x * 0.5 * (1 + Erf(x / sqrt 2))) is recognised whole; an Erf
elsewhere is not supported."""
import collections
import math
import re

import numpy as np

from netcl import autograd, functions
from netcl.io import onnx_export as ox
from netcl.io import onnx_import as oi
from netcl.io.onnx_export import onnx_pb2 as P
from netcl.io.netcl_format import _scratch_rng
from netcl.nn import functional
from netcl.nn.blocks import ModuleDict
from netcl.nn.graph import GraphModule, _parent, trace
from netcl.nn.module import Module, Parameter
from netcl.tensor import INT32, Tensor

EXAMPLE_BATCH = 2  # the batch an ONNX graph with a symbolic batch is built and traced at


# -- host values (shapes, initializers) and tensor operands --------------------------------------------
def _host(v):
    return v is None or isinstance(v, np.ndarray)


def _ints(v, node, what):
    if not isinstance(v, np.ndarray):
        raise NotImplementedError(f"node {node.name!r} ({node.op_type}): its {what} must be known when the model is "
                                  "imported (a constant, or computed from shapes)")
    return [int(a) for a in v.ravel()]


# -- op handlers: (module, node, input values) -> output values (a list, or {name: value}) ---------------
def _layer_op(m, node, ins):
    """The netcl layers onnx_import's CONVERTERS make of the node, on its first input."""
    x = ins[0]
    if not isinstance(x, Tensor):
        raise NotImplementedError(f"node {node.name!r} ({node.op_type}): its data input is a constant")
    made = m._made.get(id(node))
    if made is None:
        made = m._make_layers(node, x)
    layers, y = made
    for layer in layers:
        x = m.get_submodule(layer)(x)
    return {y: x}


_ON_HOST = {"Pow": np.power, "Max": np.maximum, "Min": np.minimum}


def _binary(fn):
    def op(m, node, ins):
        a, b = ins[0], ins[1]
        if _host(a) and _host(b):
            return [oi.FOLDERS[node.op_type](a, b, k=m.attrs(node)) if node.op_type in oi.FOLDERS
                    else _ON_HOST[node.op_type](a, b)]
        return [fn(m.operand(node, 0, a, b), m.operand(node, 1, b, a))]
    return op


def _matmul(m, node, ins):
    if node.input[1] in m._g.consts and isinstance(ins[0], Tensor) and ins[1].ndim == 2:
        return _layer_op(m, node, ins)  # Linear (with the Add of a constant bias after it)
    return [functions.matmul(m.operand(node, 0, ins[0], ins[1]), m.operand(node, 1, ins[1], ins[0]))]


def _gemm(m, node, ins):
    if node.input[1] not in m._g.consts or not isinstance(ins[0], Tensor):
        raise NotImplementedError(f"node {node.name!r} (Gemm): only a data input times a constant weight B")
    return _layer_op(m, node, ins)


def _unary(fn, on_host):
    return lambda m, node, ins: [on_host(ins[0]) if _host(ins[0]) and on_host else fn(ins[0])]


def _clip(m, node, ins):
    k = m.attrs(node)
    if m._g.opset < 11:
        lo, hi = k.get("min"), k.get("max")
    else:
        lo, hi = (None if v is None else float(np.asarray(v).item()) for v in (ins + [None, None])[1:3])
    if lo == 0.0 and hi == 6.0:
        return [functional.relu6(ins[0])]
    if lo == 0.0 and hi is None:
        return [functional.relu(ins[0])]
    return [functions.clamp(ins[0], lo, hi)]


def _hard_sigmoid(m, node, ins):
    k = m.attrs(node)
    alpha, beta = k.get("alpha", 0.2), k.get("beta", 0.5)
    if math.isclose(alpha, 1 / 6, rel_tol=1e-6) and beta == 0.5:
        return [functional.hardsigmoid(ins[0])]
    return [functions.clamp(ins[0] * float(alpha) + float(beta), 0.0, 1.0)]


def _sum(m, node, ins):
    if all(_host(v) for v in ins):
        return [sum(ins[1:], ins[0])]
    values = [m.operand(node, i, v, None, tensor=True) for i, v in enumerate(ins)]
    out = values[0]
    for v in values[1:]:
        out = functions.add(out, v)
    return [out]


def _prelu(m, node, ins):  # x where x > 0, else slope * x (slope a Parameter: PyTorch's PReLU learns it)
    x = ins[0]
    return [functional.relu(x) + m.operand(node, 1, ins[1], x) * functions.minimum(x, 0.0)]


def _elu(m, node, ins):
    x, alpha = ins[0], float(m.attrs(node).get("alpha", 1.0))
    return [functional.relu(x) + (functions.exp(functions.minimum(x, 0.0)) - 1.0) * alpha]


def _softplus(m, node, ins):  # log(1 + exp(x)) = relu(x) + log(1 + exp(-|x|)), which never overflows
    x = ins[0]
    return [functional.relu(x) + functions.log(functions.exp(-functions.abs(x)) + 1.0)]


def _log_softmax(m, node, ins):
    x = ins[0]
    axis = m.attrs(node).get("axis", 1 if m._g.opset < 13 else -1) % x.ndim
    if m._g.opset < 13 and axis != x.ndim - 1:  # (before 13: the flattened trailing dimensions together)
        raise NotImplementedError(f"node {node.name!r} (LogSoftmax-{m._g.opset}): axis={axis} of a {x.ndim}-D "
                                  "input normalises several dimensions together")
    return [functions.log_softmax(x, axis)]


def _gelu(m, node, ins):
    return [functional.gelu(m._env_value(m._gelu[id(node)]))]


def _reduce(fn):
    def op(m, node, ins):
        k = m.attrs(node)
        axes = k.get("axes")
        if len(ins) > 1 and ins[1] is not None:  # (an input from opset 13 (ReduceSum) or 18 (the others) on)
            axes = _ints(ins[1], node, "axes")
        x = ins[0]
        if not axes:
            if k.get("noop_with_empty_axes", 0):
                return [x]
            axes = list(range(x.ndim))
        return [fn(x, tuple(a % x.ndim for a in axes), bool(k.get("keepdims", 1)))]
    return op


def _concat(m, node, ins):
    axis = m.attrs(node)["axis"]
    if all(_host(v) for v in ins):
        return [np.concatenate(ins, axis=axis)]
    tensors = [m.operand(node, i, v, None) for i, v in enumerate(ins)]
    return [functions.cat(tensors, axis % tensors[0].ndim) if len(tensors) > 1 else tensors[0]]


def _reshape(m, node, ins):
    x = ins[0]
    if _host(x):
        return [oi._reshape(x, ins[1], m.attrs(node))]
    spec = _ints(ins[1], node, "shape")
    if not m.attrs(node).get("allowzero", 0):  # 0 copies the input's dimension
        spec = [x.shape[i] if v == 0 and i < x.ndim else v for i, v in enumerate(spec)]
    return [functions.reshape(x, *m.batch_first(spec, x))]


def _flatten(m, node, ins):
    x = ins[0]
    axis = m.attrs(node).get("axis", 1) % max(x.ndim, 1)
    if axis == 0:
        return [functions.reshape(x, 1, -1)]
    return [functions.reshape(x, *m.batch_first(list(x.shape[:axis]) + [-1], x))]


def _transpose(m, node, ins):
    x = ins[0]
    perm = m.attrs(node).get("perm") or list(range(x.ndim))[::-1]
    if _host(x):
        return [np.transpose(x, perm)]
    return [functions.permute(x, *perm)]


def _squeeze(m, node, ins):
    x = ins[0]
    if _host(x):
        return [oi._squeeze(*[v for v in ins if v is not None], k=m.attrs(node), opset=m._g.opset)]
    axes = oi._axes(m.attrs(node), ins, m._g.opset)
    axes = [i for i, n in enumerate(x.shape) if n == 1] if axes is None else sorted(int(a) % x.ndim for a in axes)
    return [functions.squeeze(x, tuple(axes))]


def _unsqueeze(m, node, ins):
    x = ins[0]
    if _host(x):
        return [oi._unsqueeze(*[v for v in ins if v is not None], k=m.attrs(node), opset=m._g.opset)]
    axes = oi._axes(m.attrs(node), ins, m._g.opset)
    n = x.ndim + len(axes)
    for a in sorted(int(a) % n for a in axes):
        x = functions.unsqueeze(x, a)
    return [x]


def _split(m, node, ins):
    x, k = ins[0], m.attrs(node)
    axis = k.get("axis", 0) % x.ndim
    sizes = k.get("split") if m._g.opset < 13 else (_ints(ins[1], node, "split") if len(ins) > 1 and
                                                    ins[1] is not None else None)
    if not sizes:  # equal parts, one per output
        return list(functions.split(x, -(-int(x.shape[axis]) // len(node.output)), axis))
    return list(functions.split(x, [int(s) for s in sizes], axis))


def _slice(m, node, ins):
    x, k = ins[0], m.attrs(node)
    if m._g.opset < 10:
        starts, ends, axes, steps = k["starts"], k["ends"], k.get("axes"), None
    else:
        starts, ends = _ints(ins[1], node, "starts"), _ints(ins[2], node, "ends")
        axes = _ints(ins[3], node, "axes") if len(ins) > 3 and ins[3] is not None else None
        steps = _ints(ins[4], node, "steps") if len(ins) > 4 and ins[4] is not None else None
    axes = list(range(len(starts))) if axes is None else axes
    steps = steps or [1] * len(starts)
    if _host(x):  # (torch's Pad writes a reversed slice of its pads)
        index = [slice(None)] * x.ndim
        for a, s, e, st in zip(axes, starts, ends, steps):
            index[int(a) % x.ndim] = slice(int(s), int(e), int(st))
        return [x[tuple(index)]]
    shape = x.shape
    index = [slice(None)] * len(shape)
    for a, s, e, st in zip(axes, starts, ends, steps):
        if st <= 0:
            raise NotImplementedError(f"node {node.name!r} (Slice): step {st} (netcl slices forwards)")
        a = int(a) % len(shape)
        index[a] = slice(*slice(int(s), int(e), int(st)).indices(int(shape[a])))  # (ends like 2**63-1 clipped)
    return [functions.getitem(x, tuple(index))]


def _gather(m, node, ins):
    x, i = ins[0], ins[1]
    if _host(x) and _host(i):
        return [oi._gather(x, i, m.attrs(node))]
    if isinstance(i, Tensor) and node.input[0] in m._g.consts:  # a constant table's rows at a tensor's indices
        made = m._made.get(id(node))
        if made is None:  # an Embedding (onnx_import's converter), held at its table's path
            (layer,), y, _ = oi.CONVERTERS["Gather"](m._g, node, tuple(int(n) for n in i.shape))
            w = node.input[0]
            path = m._unique(".".join(_sanitize(p, "p") for p in w[:-len(".weight")].split(".")[:31])
                             if w.endswith(".weight") else _sanitize(node.name, "Gather"))
            layer.train(m.training)
            parent, name = _parent(m, path)
            setattr(parent, name, layer)
            made = m._made[id(node)] = ([path], y)
        return [m.get_submodule(made[0][0])(i)]
    if not isinstance(i, np.ndarray) or i.ndim > 0:
        raise NotImplementedError(f"node {node.name!r} (Gather): only one constant index of a tensor")
    axis = m.attrs(node).get("axis", 0) % x.ndim
    return [functions.getitem(x, (slice(None),) * axis + (int(i),))]


def _shape(m, node, ins):
    x, k = ins[0], m.attrs(node)
    return [np.array([int(n) for n in x.shape][k.get("start", 0):k.get("end", len(x.shape))], np.int64)]


def _expand(m, node, ins):
    x = ins[0]
    shape = _ints(ins[1], node, "shape")
    if _host(x) and x.dtype.kind != "f":
        return [x * np.ones(shape, x.dtype)]
    x = m.operand(node, 0, x, None, tensor=True)  # (a float constant expanded over the batch: a class token)
    out = tuple(int(n) for n in np.broadcast_shapes(tuple(int(n) for n in x.shape), tuple(shape)))
    if x.ndim < len(out):
        x = functions.reshape(x, *((1,) * (len(out) - x.ndim) + tuple(x.shape)))
    return [functions.expand(x, *m.batch_first(list(out), x))]


def _cast(m, node, ins):
    x, to = ins[0], m.attrs(node)["to"]
    if _host(x):
        return [oi.FOLDERS["Cast"](x, k=m.attrs(node))]
    if to in (oi.T.FLOAT, oi.T.DOUBLE, oi.T.FLOAT16):
        return [functions.cast(x, np.float32) if x.dtype == INT32 else x]
    if to in (oi.T.INT64, oi.T.INT32) and all(n.op_type == "Gather" for n in m._g.consumers.get(node.output[0], [])):
        return [x]  # (an Embedding's indices, as the chain importer takes them: whole float numbers do)
    raise NotImplementedError(f"node {node.name!r} (Cast): to type {to} of a tensor (netcl computes in float32)")


def _identity(m, node, ins):
    return [ins[0]]


def _layer_norm(m, node, ins):
    x, k = ins[0], m.attrs(node)
    if k.get("axis", -1) % x.ndim != x.ndim - 1 or any(v for v in node.output[1:]):
        raise NotImplementedError(f"node {node.name!r} (LayerNormalization): only over the last axis, one output")
    return _layer_op(m, node, ins)


def _make_layer_norm(g, node, shape):
    scale, bias = g.const(node, 1, "scale"), g.const(node, 2, "B")
    layer = oi._layer("LayerNorm", node, normalized_shape=int(shape[-1]), eps=float(g.attrs(node).get("epsilon", 1e-5)))
    bias = np.zeros(scale.shape, np.float32) if bias is None else bias
    return [oi._with(layer, weight=scale.reshape(-1), bias=bias.reshape(-1))], node.output[0], [node]


def _make_conv_transpose(g, node, shape):
    """ConvTranspose2d or, on a 3-D weight, ConvTranspose1d: groups and dilation too, ONNX's weight
    (C, M/group, k...) being theirs."""
    k, w, b = g.attrs(node), g.const(node, 1, "weight"), g.const(node, 2, "bias")
    groups = int(k.get("group", 1))
    if w.ndim == 3 and not k.get("output_shape"):
        pad = k.get("output_padding") or [0]
        layer = oi._layer("ConvTranspose1d", node, in_channels=w.shape[0], out_channels=w.shape[1] * groups,
                          kernel_size=oi._one(node, "kernel_shape", k.get("kernel_shape") or w.shape[2:], 1),
                          stride=oi._one(node, "strides", k.get("strides"), 1), padding=oi._pads1d(node, k),
                          output_padding=oi._one(node, "output_padding", pad, 0), groups=groups,
                          dilation=oi._one(node, "dilations", k.get("dilations"), 1), bias=b is not None)
    elif w.ndim == 4 and not k.get("output_shape"):
        pad = k.get("output_padding") or [0, 0]
        layer = oi._layer("ConvTranspose2d", node, in_channels=w.shape[0], out_channels=w.shape[1] * groups,
                          kernel_size=oi._two(node, "kernel_shape", k.get("kernel_shape") or w.shape[2:], 1),
                          stride=oi._two(node, "strides", k.get("strides"), 1), padding=oi._pads2d(node, k),
                          output_padding=oi._two(node, "output_padding", pad, 0), groups=groups,
                          dilation=oi._two(node, "dilations", k.get("dilations"), 1), bias=b is not None)
    else:
        raise NotImplementedError(f"node {node.name!r} (ConvTranspose): only 1-D or 2-D; no output_shape")
    return [oi._with(layer, weight=w, **({"bias": oi._bias(node, b, layer.out_channels)} if b is not None else {}))], \
        node.output[0], [node]


def _pad(m, node, ins):
    x, k = ins[0], m.attrs(node)
    pads = k.get("pads") if m._g.opset < 11 else _ints(ins[1], node, "pads")
    value = k.get("value", 0.0) if m._g.opset < 11 else (
        float(np.asarray(ins[2]).item()) if len(ins) > 2 and ins[2] is not None else 0.0)
    if k.get("mode", "constant") != "constant" or (len(ins) > 3 and ins[3] is not None) or min(pads) < 0:
        raise NotImplementedError(f"node {node.name!r} (Pad): only constant padding of every axis, by >= 0")
    return [_pad_tensor(m, x, pads[:x.ndim], pads[x.ndim:], value)]


def _pad_tensor(m, x, before, after, value=0.0):
    """x with `before[a]` and `after[a]` entries of `value` around each axis a (concatenations)."""
    for a in range(x.ndim):
        for side, p in ((0, before[a]), (1, after[a])):
            if p:
                shape = [int(d) for d in x.shape]
                shape[a] = int(p)
                fill = functions.zeros(*m.batch_first(shape, x))
                fill = fill + float(value) if value else fill
                x = functions.cat([fill, x] if side == 0 else [x, fill], a)
    return x


def _padded(value):
    """Conv or MaxPool with padding netcl's layers do not take (one side more than the other, auto_pad
    SAME_*): a Pad by `value` in front of the layer without any (for MaxPool -inf, which never wins)."""
    def op(m, node, ins):
        plan = m._pads.get(id(node))
        if plan is None:
            kernel = ins[1].shape[2:] if node.op_type == "Conv" else m.attrs(node).get("kernel_shape")
            plan = m._pads[id(node)] = _pad_plan(m, node, ins[0].shape, kernel)
        before, after, plain = plan
        x = ins[0] if not any(before + after) else _pad_tensor(m, ins[0], before, after, value)
        return _layer_op(m, plain, [x] + ins[1:])
    return op


def _pad_plan(m, node, shape, kernel):
    """(pads before, pads after, the node to convert): the node itself where netcl pads it."""
    k = m.attrs(node)
    auto, pads, n = k.get("auto_pad", "NOTSET"), k.get("pads"), len(shape) - 2
    if auto in ("NOTSET", "VALID") and (not pads or list(pads[:n]) == list(pads[n:])):  # each axis's sides alike
        return [0] * len(shape), [0] * len(shape), node
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        strides, dil = k.get("strides") or [1] * n, k.get("dilations") or [1] * n
        kernel = k.get("kernel_shape") or kernel
        total = [max((-(-int(shape[2 + i]) // strides[i]) - 1) * strides[i] + (kernel[i] - 1) * dil[i] + 1
                     - int(shape[2 + i]), 0) for i in range(n)]
        small = [t // 2 for t in total]
        pads = (small + [t - s for t, s in zip(total, small)] if auto == "SAME_UPPER"
                else [t - s for t, s in zip(total, small)] + small)
    elif auto != "NOTSET":
        raise NotImplementedError(f"node {node.name!r} ({node.op_type}): auto_pad={auto}")
    plain = P.NodeProto()
    plain.CopyFrom(node)
    del plain.attribute[:]
    plain.attribute.extend(a for a in node.attribute if a.name not in ("pads", "auto_pad"))
    return [0, 0] + list(pads[:n]), [0, 0] + list(pads[n:]), plain


def _host_only(fn):
    """An op netcl computes only on values known at import (shapes: torch's expand writes
    ConstantOfShape/Equal/Where on them)."""
    def op(m, node, ins):
        if not all(_host(v) for v in ins):
            raise NotImplementedError(f"node {node.name!r} ({node.op_type}): only on values known when the model is "
                                      "imported (constants and shapes), not on a tensor")
        return [fn(*ins, k=m.attrs(node))]
    return op


def _constant_of_shape(shape, k):
    value = k.get("value")
    value = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)
    return np.full([int(n) for n in shape.ravel()], value[0], value.dtype)


_RNN_DEFAULTS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"]}


def _rnn_layer(m, node, ins):
    """An ONNX LSTM or GRU node's netcl layer: ONNX's W, R, B (constants) with the gate blocks put back in
    torch's order (ONNX_GATES' inverse), directions split into the _reverse parameters. Settings torch's
    layers cannot express are refused by name."""
    kind, k = node.op_type, m.attrs(node)
    W, R = ins[1], ins[2]
    B = ins[3] if len(ins) > 3 else None
    where = f"node {node.name!r} ({kind})"
    if not all(isinstance(v, np.ndarray) for v in (W, R)) or (B is not None and not isinstance(B, np.ndarray)):
        raise NotImplementedError(f"{where}: its weights W, R and B must be constants")
    refused = [name for name, bad in (
        ("sequence_lens", len(ins) > 4 and ins[4] is not None),
        ("direction=reverse", k.get("direction", "forward") not in ("forward", "bidirectional")),
        ("clip", "clip" in k), ("input_forget=1", k.get("input_forget", 0) != 0), ("layout=1", k.get("layout", 0)),
        ("activations other than " + "/".join(_RNN_DEFAULTS[kind]),
         k.get("activations") not in (None, _RNN_DEFAULTS[kind] * (2 if k.get("direction") == "bidirectional" else 1))),
        ("linear_before_reset=0 (torch's GRU applies r after W_hn h + b_hn: linear_before_reset=1)",
         kind == "GRU" and k.get("linear_before_reset", 0) != 1),
        ("initial_h without initial_c", kind == "LSTM" and (len(ins) > 5 and ins[5] is not None) != (
            len(ins) > 6 and ins[6] is not None)),
        ("peepholes (input P)", len(ins) > 7 and ins[7] is not None))
        if bad]
    if refused:
        raise NotImplementedError(f"{where}: netcl's {kind} (torch's) has no {', '.join(refused)}")
    D, GH, fan_in = W.shape
    H = int(k.get("hidden_size") or R.shape[-1])
    order = ox.ONNX_GATES[kind]  # ONNX's block j is torch's block order[j]

    def torch_rows(a):
        return np.concatenate([a[order.index(b) * H:(order.index(b) + 1) * H] for b in range(len(order))])
    layer = oi._layer(kind, node, input_size=int(fan_in), hidden_size=H, bias=B is not None, bidirectional=D == 2)
    arrays = {}
    for d in range(D):
        sfx = "l0" + ("_reverse" if d else "")
        arrays[f"weight_ih_{sfx}"], arrays[f"weight_hh_{sfx}"] = torch_rows(W[d]), torch_rows(R[d])
        if B is not None:
            arrays[f"bias_ih_{sfx}"], arrays[f"bias_hh_{sfx}"] = torch_rows(B[d][:GH]), torch_rows(B[d][GH:])
    return oi._with(layer, **arrays)


def _rnn(m, node, ins):
    """LSTM/GRU (one layer, forward or bidirectional) on X (L, N, in): netcl's layer, whose output
    (L, N, D*H) becomes ONNX's Y (L, D, N, H); Y_h and Y_c as they are."""
    x = ins[0]
    if not isinstance(x, Tensor):
        raise NotImplementedError(f"node {node.name!r} ({node.op_type}): its data input is a constant")
    made = m._made.get(id(node))
    if made is None:
        layer = _rnn_layer(m, node, ins)
        path = m._unique(_sanitize(node.name, node.op_type))
        layer.train(m.training)
        parent, name = _parent(m, path)
        setattr(parent, name, layer)
        made = m._made[id(node)] = ([path], None)
    layer = m.get_submodule(made[0][0])
    # (zeros known at import, as torch.onnx writes them from the input's shape, are the layer's own
    # default: left out, the states follow the batch rather than the example's)
    states = [None if i >= len(ins) or ins[i] is None or (_host(ins[i]) and not np.any(ins[i])) else
              m.operand(node, i, ins[i], x, tensor=True) for i in (5, 6)]
    if node.op_type == "LSTM" and (states[0] is None) != (states[1] is None):
        states = [m.operand(node, i, ins[i], x, tensor=True) for i in (5, 6)]
    y, hx = layer(x, tuple(states) if node.op_type == "LSTM" and states[0] is not None else states[0])
    D, H = layer.num_directions, layer.hidden_size
    # (y.shape[1] is the batch: traced, a BatchSize the graph keeps free)
    Y = functions.permute(functions.reshape(y, y.shape[0], y.shape[1], D, H), 0, 2, 1, 3)
    return [Y, *(hx if isinstance(hx, tuple) else (hx,))]


_MAKERS = {"LayerNormalization": _make_layer_norm, "ConvTranspose": _make_conv_transpose}

# ONNX op -> handler (see the module docstring)
OPS = {
    "Conv": _padded(0.0),             # Conv2d or Conv1d (padding on one side more, or SAME: a Pad in front)
    "MaxPool": _padded(-math.inf),    # MaxPool2d or MaxPool1d (likewise, padded by -inf)
    **{op: _layer_op for op in ("BatchNormalization", "GroupNormalization", "InstanceNormalization", "Relu", "LeakyRelu", "Sigmoid", "Tanh",
                                "Gelu", "AveragePool", "GlobalAveragePool", "Softmax", "Dropout", "Resize", "Upsample", "Mish",
                                "ConvTranspose")},
    "Gemm": _gemm,                    # Linear; B transposed into netcl's (in, out) when transB=1
    "MatMul": _matmul,                # Linear where B is a constant matrix, else a matmul of two values
    "Add": _binary(functions.add), "Sub": _binary(functions.sub), "Mul": _binary(functions.mul),
    "Div": _binary(functions.div), "Pow": _binary(functions.pow),
    "Max": _binary(functions.maximum), "Min": _binary(functions.minimum),
    "Neg": _unary(functions.neg, np.negative), "Exp": _unary(functions.exp, np.exp),
    "Log": _unary(functions.log, np.log), "Sqrt": _unary(functions.sqrt, np.sqrt),
    "Abs": _unary(functions.abs, np.abs), "Reciprocal": _unary(lambda x: 1.0 / x, lambda a: 1 / a),
    "Sum": _sum, "PRelu": _prelu, "Elu": _elu, "Softplus": _softplus, "LogSoftmax": _log_softmax,
    "Clip": _clip,                    # F.relu6 for [0, 6], else clamp
    "HardSigmoid": _hard_sigmoid, "HardSwish": _unary(functional.hardswish, None),
    "Erf": _gelu,                     # only inside GELU's pattern: F.gelu
    "ReduceMean": _reduce(functions.mean), "ReduceSum": _reduce(functions.sum), "ReduceMax": _reduce(functions.amax),
    "ReduceMin": _reduce(functions.amin),
    "LayerNormalization": _layer_norm,  # LayerNorm over the last axis
    "Concat": _concat, "Reshape": _reshape, "Flatten": _flatten, "Transpose": _transpose,
    "Squeeze": _squeeze, "Unsqueeze": _unsqueeze, "Split": _split, "Slice": _slice,
    "Gather": _gather,                # an index of a tensor, or an Embedding (rows of a constant table)
    "ConstantOfShape": _host_only(_constant_of_shape), "Equal": _host_only(lambda a, b, k: np.equal(a, b)),
    "Where": _host_only(lambda c, a, b, k: np.where(c, a, b)),
    "Mod": _host_only(lambda a, b, k: np.fmod(a, b) if k.get("fmod", 0) else np.mod(a, b)), "Range": _host_only(lambda a, b, d, k: np.arange(a, b, d)),
    "LSTM": _rnn, "GRU": _rnn,        # nn.LSTM / nn.GRU of one layer; Y made (L, D, N, H) from the layer's output
    "Shape": _shape, "Expand": _expand, "Cast": _cast, "Identity": _identity, "Pad": _pad,
}


# -- GELU as torch writes it ---------------------------------------------------------------------------
def _gelu_patterns(g):
    """{id(the pattern's last node): x} for x * 0.5 * (1 + Erf(x / sqrt 2)) (either order of the
    multiplications), and the ids of the other nodes of each pattern (whose values nothing else uses)."""
    producer = {o: n for n in g.nodes for o in n.output}
    last, inner = {}, set()

    def sole_user(value):
        users = g.consumers.get(value, [])
        return users[0] if len(users) == 1 and not any(value == o.name for o in g.graph.output) else None

    def split(node, want):
        """(the data input, the constant) of a binary node whose constant is the number `want`."""
        if node is None or len(node.input) != 2:
            return None
        for i in (0, 1):
            c = g.consts.get(node.input[1 - i])
            if c is not None and c.size == 1 and math.isclose(float(c.ravel()[0]), want, rel_tol=1e-5) \
                    and node.input[i] not in g.consts:
                return node.input[i]
        return None

    for erf in (n for n in g.nodes if n.op_type == "Erf"):
        d = producer.get(erf.input[0])
        x = split(d, math.sqrt(2)) if d is not None and d.op_type == "Div" else \
            split(d, math.sqrt(0.5)) if d is not None and d.op_type == "Mul" else None
        add = sole_user(erf.output[0])
        if x is None or sole_user(d.output[0]) is not erf or add is None or add.op_type != "Add" \
                or split(add, 1.0) != erf.output[0]:
            continue
        m1 = sole_user(add.output[0])
        if m1 is None or m1.op_type != "Mul":
            continue
        other = [v for v in m1.input if v != add.output[0]]
        if len(other) != 1:
            continue
        if other[0] == x:  # (x * (1 + erf)) * 0.5
            m2 = sole_user(m1.output[0])
            if m2 is None or m2.op_type != "Mul" or split(m2, 0.5) != m1.output[0]:
                continue
            nodes = [d, erf, add, m1, m2]
        else:  # (x * 0.5) * (1 + erf)
            half = producer.get(other[0])
            if half is None or half.op_type != "Mul" or split(half, 0.5) != x or sole_user(half.output[0]) is not m1:
                continue
            nodes = [d, erf, add, half, m1]
        last[id(nodes[-1])] = x
        inner.update(id(n) for n in nodes[:-1])
    return last, inner


# -- unsupported ops -------------------------------------------------------------------------------------
def unsupported(g, gelu_nodes):
    """NotImplementedError's message for the nodes this path cannot run (one line per op type, with its
    count and its first node), or None."""
    counts, first = collections.Counter(), {}
    for n in g.nodes:
        ok = n.domain in ("", "ai.onnx") and n.op_type in OPS and (n.op_type != "Erf" or id(n) in gelu_nodes)
        if not ok:
            kind = n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}"
            counts[kind] += 1
            first.setdefault(kind, n.name or "?")
    if not counts:
        return None
    lines = [f"  {kind} (node {first[kind]!r}): {c} node{'s' if c > 1 else ''}" for kind, c in counts.items()]
    return ("cannot import: unsupported ops\n" + "\n".join(lines) + "\nsupported ops: " +
            ", ".join(sorted(set(OPS) - {"Erf"})) + " (Erf inside GELU), and initializer-only subgraphs of " +
            ", ".join(oi.FOLDERS))


# -- the module --------------------------------------------------------------------------------------------
_PART = re.compile(r"[^A-Za-z0-9_]")


def _sanitize(name, default):
    """`name` as one part of a module path (letters, digits, underscores; no leading underscore)."""
    return _PART.sub("_", name).strip("_")[:64] or default


class OnnxGraph(Module):
    """An ONNX graph as a netcl Module: forward runs its nodes in order through OPS. Built by running
    once on zeros of `example_shape` (which makes the layers and parameters: shapes are known then);
    import_onnx traces it into a GraphModule."""

    def __init__(self, g, input_name, output_name, example_shape):
        super().__init__()
        last, inner = _gelu_patterns(g)
        problem = unsupported(g, set(last) | inner)
        if problem:
            raise NotImplementedError(problem)
        d = self.__dict__
        d.update(_g=g, _input=input_name, _output=output_name, _made={}, _operands={}, _skip=set(inner),
                 _gelu=last, _env=None, _batch=int(example_shape[0]), _taken=set(), _shared={}, _pads={})
        self.eval()  # (building runs the layers: BatchNorm must not learn from it)
        x = Tensor.from_host(None, np.zeros(example_shape, np.float32))
        with autograd.no_grad(), _scratch_rng():
            self.forward(x)

    def forward(self, x):
        """Run the graph's nodes in order on input x; the graph's output."""
        g = self._g
        env = self.__dict__["_env"] = {self._input: x}
        try:
            for node in g.nodes:
                if id(node) in self._skip:
                    continue
                ins = [env[v] if v in env else g.consts[v] if v in g.consts else None for v in node.input]
                out = OPS[node.op_type](self, node, ins) if id(node) not in self._gelu else _gelu(self, node, ins)
                for name, v in (out.items() if isinstance(out, dict) else zip(node.output, out)):
                    env[name] = v if isinstance(v, Tensor) else np.asarray(v)  # (numpy's scalars as arrays)
            y = env[self._output]
        finally:
            self.__dict__["_env"] = None
        if not isinstance(y, Tensor):
            raise NotImplementedError(f"the graph's output {self._output!r} is a constant")
        return y

    def _env_value(self, name):
        return self._env[name]

    def attrs(self, node):
        """The node's attributes, {name: value}."""
        return self._g.attrs(node)

    def batch_first(self, shape, x):
        """A target shape whose first entry is the input's batch size with that entry as the batch (the
        traced value x's first dimension where it is the batch, else the graph input's)."""
        shape = list(shape)
        if shape and shape[0] == self._batch:
            shape[0] = x.shape[0] if int(x.shape[0]) == self._batch else self._env[self._input].shape[0]
        return shape

    def operand(self, node, i, v, other, tensor=False):
        """Input i of the node as an operand: a tensor as it is; a constant of one element a float (where
        it adds no dimension to `other`, and `tensor` is False); else a Parameter (an initializer) or
        buffer named after it."""
        if isinstance(v, Tensor):
            return v
        ndim = other.ndim if isinstance(other, (Tensor, np.ndarray)) else 0
        if v.size == 1 and v.ndim <= ndim and not tensor:
            return float(v.ravel()[0])
        name = node.input[i]
        t = self._operands.get(name)
        if t is None:
            key = self._unique(_sanitize(name, "const"))
            value = np.ascontiguousarray(v, np.float32)
            if name in {t.name for t in self._g.graph.initializer}:
                t = Parameter(value)
                setattr(self, key, t)
            else:
                t = Tensor.from_host(None, value)
                self.register_buffer(key, t)
            self._operands[name] = t
        return t

    def _unique(self, path):
        """`path`, or with a suffix, where it is free below this module (no part an attribute already)."""
        base, k = path, 1
        while not self._free(path):
            path, k = f"{base}_{k}", k + 1
        self._taken.add(path)
        return path

    def _free(self, path):
        parts = path.split(".")
        if any(hasattr(ModuleDict, p) or (i == 0 and (hasattr(OnnxGraph, p) or hasattr(GraphModule, p)))
               for i, p in enumerate(parts)):
            return False  # (a method's or attribute's name, here or in the traced GraphModule)
        return not any(t == path or t.startswith(path + ".") or path.startswith(t + ".") for t in self._taken)

    def _make_layers(self, node, x):
        """Build the node's layers (onnx_import's CONVERTERS, or _MAKERS) and hold them at their paths
        (a weight's initializer's, else the node's name); (the paths, the value they make), kept for the
        next runs."""
        make = _MAKERS.get(node.op_type) or oi.CONVERTERS[node.op_type]
        layers, y, used = make(self._g, node, tuple(int(n) for n in x.shape))
        same = (node.op_type, tuple(node.input[1:]), tuple(a.SerializeToString() for a in node.attribute))
        if len(used) == 1 and len(node.input) > 1 and same in self._shared:  # (weights two nodes share: one layer)
            self._made[id(node)] = (self._shared[same], y)
            return self._shared[same], y
        steps = []
        for layer in layers:
            w = node.input[1] if len(node.input) > 1 and layer.named_tensors() else ""
            path = self._unique(".".join(_sanitize(p, "p") for p in w[:-len(".weight")].split(".")[:31])
                                if w.endswith(".weight") else _sanitize(node.name, node.op_type))
            layer.train(self.training)
            parent, name = _parent(self, path)
            setattr(parent, name, layer)
            steps.append(path)
        self._skip.update(id(n) for n in used if n is not node)
        self._made[id(node)] = (steps, y)
        if len(used) == 1 and len(node.input) > 1:
            self._shared[same] = steps
        return steps, y

    def get_submodule(self, path):
        """The module at a dotted path below this one."""
        m = self
        for part in path.split("."):
            m = dict(m.named_children())[part]
        return m

    def extra_repr(self):
        return f"{len(self._g.nodes)} ONNX nodes"


def import_graph(g, input_name, output_name, shape, dynamic):
    """The GraphModule (eval mode) of graph g (onnx_import's _Graph) from input `input_name` (dims `shape`,
    the batch symbolic when `dynamic`) to output `output_name`."""
    example = (EXAMPLE_BATCH if dynamic else int(shape[0]),) + tuple(int(n) for n in shape[1:])
    model = OnnxGraph(g, input_name, output_name, example).eval()
    with _scratch_rng():
        gm = trace(model, Tensor.from_host(None, np.zeros(example, np.float32))).eval()
    if dynamic and not _runs_at(gm, (example[0] + 1,) + example[1:]):
        _fix_batch(gm, example[0])
    return gm


def _runs_at(gm, shape):
    """Whether the graph runs on an input of `shape` (a batch of its own: a graph whose batch moves off
    the first dimension, as torch's MultiheadAttention's does, holds the traced one in its shapes)."""
    try:
        with autograd.no_grad():
            gm(Tensor.from_host(None, np.zeros(shape, np.float32)))
    except ValueError:
        return False
    return True


def _fix_batch(gm, n):
    """Make the graph take batch n only (its shapes and batch arguments n), so that another batch is
    refused where it comes in ("this graph was traced for input ...") rather than deep inside."""
    def fixed(a):
        if isinstance(a, dict):
            return n if a == {"batch": 1} else {k: fixed(v) for k, v in a.items()}
        return [fixed(v) for v in a] if isinstance(a, list) else a

    for node in gm.graph:
        node["out"] = [[n if d == "N" else d for d in shape] for shape in node.get("out", [])]
        for field in ("args", "kwargs"):
            if field in node:
                node[field] = fixed(node[field])


def import_onnx(path):
    """An ONNX model file -> a netcl nn.Sequential (eval mode, weights on the host), or an
    nn.GraphModule where the graph is not a chain of layers and blocks.

    Files netcl wrote come back as the same layers with the same weights; other graphs in the
    same vocabulary (onnx_import's CONVERTERS, MERGES, FOLDERS) become the equivalent layers; any other graph of
    OPS is replayed by netcl layers and operations and traced (OnnxGraph). The model has one
    float input whose dims but the batch are fixed, and one output. Raises FormatError for a file
    that is not ONNX or is corrupt (sizes that do not fit, external data outside the model's
    folder), NotImplementedError naming every unsupported op (type and node) or setting."""
    recorded, g, input_name, output_name, shape, dynamic = oi.read(path)
    if recorded is not None:
        return recorded.eval()
    try:
        return oi.chain(g, input_name, output_name, shape, dynamic)
    except NotImplementedError:  # not a chain, or ops a chain of layers lacks: the graph replayed and traced
        return import_graph(g, input_name, output_name, shape, dynamic)
