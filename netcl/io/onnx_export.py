"""export_onnx: a netcl Sequential -> a standard ONNX file, written with netcl's own protobuf
bindings (proto/onnx.proto -> gen/onnx_pb2.py); needs neither the `onnx` package nor a device.

Read `EMITTERS` to see what each layer becomes. The exporter walks the declared layer list
(never the fused inference path), builds the small part of the graph (nodes, value infos,
initializer headers) as protobuf messages and streams the weights' bytes into the file after
them, so peak memory stays near the size of the weights. The bytes are exactly the canonical
serialization of the whole ModelProto (fields in field-number order), hence deterministic.
"""
import importlib.util
import json
import math
import os
import sys
from pathlib import Path

import numpy as np

from netcl import nn
from netcl.io.atomic import AtomicFile, file_path
from netcl.io.netcl_format import _recordable, architecture
from netcl.nn import graph
from netcl.nn.functional import LAYER_OF
from netcl.nn.module import ShapeError, pair
from netcl.tensor import Tensor
from netcl.version import __version__


def _load_bindings():
    """netcl._gen.onnx_pb2 when installed; in a source checkout, gen/onnx_pb2.py next to netcl/."""
    try:
        from netcl._gen import onnx_pb2

        return onnx_pb2
    except ImportError:
        pass
    name = "netcl._gen.onnx_pb2"
    if name in sys.modules:
        return sys.modules[name]
    path = Path(__file__).resolve().parents[2] / "gen" / "onnx_pb2.py"
    if not path.exists():
        raise ImportError("netcl's ONNX bindings are missing: run `make proto` in the source tree "
                          "(or install netcl with pip, which generates them)")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


onnx_pb2 = _load_bindings()
P = onnx_pb2

# ai.onnx opset -> the IR version that introduced it (onnx.helper.VERSION_TABLE). The range is
# what the tests run through onnxruntime; emitters whose ops changed meaning inside it write the
# form of the opset being exported through the helpers `_softmax_at` and `_axes_op`.
OPSET_IR_VERSION = {11: 6, 12: 7, 13: 7, 14: 7, 15: 8, 16: 8, 17: 8, 18: 8, 19: 9, 20: 9, 21: 10, 22: 10,
                    23: 11, 24: 12, 25: 13}
DEFAULT_OPSET = 17

# A consumer and version -> (the highest ai.onnx opset, the highest IR version) it reads. The
# export takes the highest opset within both that netcl writes (OPSET_IR_VERSION), so a file for an
# older consumer is only ever a lower stamp of the same graph.
TARGETS = {
    # onnxruntime: measured by tools/verify_consumers.py with each line's last wheel
    # (1.15.1 ... 1.22.1): 1.15 has no AveragePool-19 or Reshape-19 kernels; 1.16, 1.18, 1.19 and
    # 1.20 call the next opset "under development"; 1.17 reads IR 9 at most, 1.21 and 1.22 IR 10.
    # (The matrix in onnxruntime's docs/reference/compatibility.md says one opset more for 1.15,
    # 1.20 and 1.22.)
    # tests/test_onnx_targets.py checks the 1.15 row against the real wheel, both sides of it
    "onnxruntime-1.15": (18, 8), "onnxruntime-1.16": (19, 9), "onnxruntime-1.17": (20, 9),
    "onnxruntime-1.18": (21, 10), "onnxruntime-1.19": (21, 10), "onnxruntime-1.20": (21, 10),
    "onnxruntime-1.21": (22, 10), "onnxruntime-1.22": (22, 10),
    # TensorRT: onnx-tensorrt docs/operators.md, release/8.6-GA: "TensorRT 8.6 supports operators up
    # to Opset 17"; release/10.0-GA: opset 9 to 20 (the 10.0 line is from its release notes, not seen
    # in a stored copy). IR: the version those opsets came with
    "tensorrt-8.6": (17, 8), "tensorrt-10.0": (20, 9),
    # Measured by tools/verify_consumers.py (every layer type, opsets 11-25): the highest
    # opset at which every layer runs and agrees (<= 1e-4), one below a layer's newer single-op form.
    # OpenVINO 2023.0.2, tract 0.21.19: no Gelu-20 (GELU is written decomposed below 20); OpenCV 4.8.1
    # and 5.0.0: their Gelu-20 differs by 1.7e-4 (the decomposition agrees to 6e-8); onnx2torch 1.5.15:
    # no Resize-18 (nor AveragePool-19, Reshape-19, Flatten-21, Conv-22). OpenVINO 2024.0.0 (f32) read
    # all of 11-25: its row stays at its vendored onnx 1.15 (opset 20). Bugs whatever the opset: OpenCV
    # 4.x, and 5's classic engine loading from a path, ignore AveragePool's count_include_pad; OpenCV
    # 4.8 fails on MultiheadAttention, LayerNorm, Transpose of 3-D and AdaptiveAvgPool1d
    "openvino-2023.0": (19, 9), "openvino-2024.0": (20, 9),
    "opencv-4.8": (19, 9), "opencv-5.0": (19, 9),
    "tract-0.21": (19, 9),
    "onnx2torch-1.5": (17, 8),
}
PROTOBUF_LIMIT = 2**31 - 1  # protobuf refuses to parse a message of 2 GiB or more
EXTERNAL_MIN_BYTES = 1024  # with external data, smaller tensors stay inline (as onnx does)
ALIGN_MIN_BYTES, ALIGN = 1 << 20, 1 << 16  # large external tensors start on 64 KiB boundaries (mmap)
FLOAT, INT64 = P.TensorProto.FLOAT, P.TensorProto.INT64


# -- the graph under construction --------------------------------------------------------
class _Graph:
    """Nodes, initializers and value infos, named after the netcl layer being emitted.

    Emitters call `param`, `const` and `op`; `op` returns the name of its output value; a
    block's emitter calls `emit` for each layer it holds. Shapes use `self.batch` for the batch
    dimension (an int, or a name when symbolic) and None for a dimension known only at run time;
    `self.opset` is the target opset."""

    def __init__(self, batch, n, opset):
        self.batch, self.n, self.opset = batch, n, opset  # n: the concrete batch, for the layers' output_shape
        self.nodes, self.inits, self.shapes = [], [], {}  # inits: (name, dims, ONNX type, source)
        self.named = {}  # id(tensor) -> its initializer's name
        self.int_input = None  # the graph input's name where it holds int64 indices (an Embedding first)
        self.layer = self.path = None

    def begin(self, path, layer):
        self.path, self.layer, self._count = path, layer, {}

    def _name(self, what):
        k = self._count.get(what, 0)
        self._count[what] = k + 1
        return f"{self.path}.{what}" + (f"_{k}" if k else "")

    def param(self, name):
        """The layer's parameter or buffer `name` as an initializer named as in the state_dict (once:
        a layer a graph calls twice reads the same one)."""
        tensor = dict(self.layer.named_parameters() + self.layer.named_buffers())[name]
        return self.tensor_init(f"{self.path}.{name}", tensor)

    def tensor_init(self, name, tensor):
        """Tensor `tensor` as an initializer `name`, or the name it already has."""
        known = self.named.get(id(tensor))
        if known is not None:
            return known
        self.named[id(tensor)] = name
        self.inits.append((name, tensor.shape, FLOAT, tensor))
        return name

    def const(self, what, values, dtype=np.int64):
        a = np.asarray(values, dtype=dtype)
        name = self._name(what)
        self.inits.append((name, a.shape, INT64 if dtype == np.int64 else FLOAT, a))
        return name

    def op(self, op_type, inputs, shape=None, **attrs):
        out = self._name(op_type)
        node = P.NodeProto(input=inputs, output=[out], name=out, op_type=op_type,
                           doc_string=f"netcl layer {self.path}: {self.layer!r}")
        node.attribute.extend(_attribute(k, v) for k, v in sorted(attrs.items()))
        self.nodes.append(node)
        if shape is not None:
            self.shapes[out] = shape
        return out

    def op_outputs(self, op_type, inputs, shapes, **attrs):
        """A node of several outputs (LSTM's Y, Y_h, Y_c), shapes one per output; their names."""
        outs = [self._name(f"{op_type}_{k}") for k in range(len(shapes))]
        node = P.NodeProto(input=inputs, output=outs, name=outs[0], op_type=op_type,
                           doc_string=f"netcl layer {self.path}: {self.layer!r}")
        node.attribute.extend(_attribute(k, v) for k, v in sorted(attrs.items()))
        self.nodes.append(node)
        for out, shape in zip(outs, shapes):
            if shape is not None:
                self.shapes[out] = shape
        return outs

    def chain(self, layer, path, x, shape):
        """Emit the layers `layer` applies in order (itself, or a Sequential's chain) at state_dict
        path `path` on value `x` of `shape`; returns the output value, named "<path>.<type>"."""
        shape = (self.n,) + tuple(shape[1:])
        for p, leaf in layer.chain(path):
            out = tuple(leaf.output_shape(shape))
            self.begin(p, leaf)
            first = len(self.nodes)
            y = EMITTERS[type(leaf)](self, leaf, x, self.sym(shape), self.sym(out))
            if y != x:  # name each layer's output after the layer
                name = f"{p}.{type(leaf).__name__}"
                self.rename(y, name, first)
                self.shapes[name] = self.sym(out)
                y = name
            x, shape = y, out
        return x

    def emit(self, layer, name, x, shape):
        """For a block's emitter: emit its child `name` (a layer or a Sequential) on `x`; returns
        the child's output value. Names follow the state_dict ("3.body.0.Conv")."""
        outer = self.path, self.layer, self._count
        y = self.chain(layer, f"{self.path}.{name}", x, shape)
        self.path, self.layer, self._count = outer
        return y

    def sym(self, shape):
        return (self.batch,) + tuple(shape[1:])

    def rename(self, old, new, first_node):
        """Give value `old` (made by nodes[first_node:]) the name `new`."""
        for node in self.nodes[first_node:]:
            for field in (node.input, node.output):
                field[:] = [new if v == old else v for v in field]
        self.shapes[new] = self.shapes.pop(old, None)


def _attribute(name, v):
    A = P.AttributeProto
    if isinstance(v, float):
        return A(name=name, type=A.FLOAT, f=v)
    if isinstance(v, str):
        return A(name=name, type=A.STRING, s=v.encode())
    if isinstance(v, int):
        return A(name=name, type=A.INT, i=v)
    if isinstance(v, (list, tuple)):
        return A(name=name, type=A.INTS, ints=[int(i) for i in v])
    if isinstance(v, str):
        return A(name=name, type=A.STRING, s=v.encode())
    raise TypeError(f"attribute {name}: unsupported value {v!r}")


# -- opset-dependent forms: emitters call these, so one emitter serves every opset ------------
def _softmax_at(g, x, axis, shape, out, op_type="Softmax"):
    """Softmax over `axis` of a value of `shape`. Softmax-11/12 coerce the input to 2-D at `axis`
    (normalising every dimension from it on together), so before opset 13 an axis other than the
    last is swapped with the last around a last-axis Softmax (exact: a Transpose only moves data)."""
    last = len(shape) - 1
    if g.opset >= 13 or axis % len(shape) == last:
        return g.op(op_type, [x], out, axis=axis)
    perm = list(range(len(shape)))
    perm[axis % len(shape)], perm[last] = last, axis % len(shape)
    swapped = tuple(shape[i] for i in perm)
    y = g.op(op_type, [g.op("Transpose", [x], swapped, perm=perm)], swapped, axis=last)
    last_axis = g._name(op_type.lower() + "_last_axis")  # not "<path>.Softmax", the name the layer's output gets
    g.rename(y, last_axis, len(g.nodes) - 1)
    return g.op("Transpose", [last_axis], out, perm=perm)  # the swap is its own inverse


# the opset from which each op takes `axes` as an input instead of an attribute
_AXES_INPUT_SINCE = {"Squeeze": 13, "Unsqueeze": 13, "ReduceSum": 13, "ReduceMean": 18, "ReduceMax": 18,
                     "ReduceMin": 18, "ReduceProd": 18, "ReduceL2": 18, "ReduceSumSquare": 18}


def _axes_op(g, op_type, x, axes, out, **attrs):
    """Squeeze, Unsqueeze or a Reduce* over `axes`: an attribute before the opset that made it an
    input (13 for Squeeze/Unsqueeze/ReduceSum, 18 for the other reductions), an input from it on."""
    if g.opset >= _AXES_INPUT_SINCE[op_type]:
        return g.op(op_type, [x, g.const("axes", list(axes))], out, **attrs)
    return g.op(op_type, [x], out, axes=list(axes), **attrs)


# -- the converter table: one function per layer type ------------------------------------
# Each takes (graph, layer, x, in_shape, out_shape) and returns the name of the layer's output.
def _linear(g, m, x, s, out):
    w = [g.param("weight")] + ([g.param("bias")] if m.bias is not None else [])
    if len(s) == 2:  # weight stored (in, out): y = x @ W + b is Gemm without a transpose
        return g.op("Gemm", [x] + w, out, transB=0)
    y = g.op("MatMul", [x, w[0]], out)
    return g.op("Add", [y, w[1]], out) if m.bias is not None else y


def _conv2d(g, m, x, s, out):  # pairs as (height, width); padding="same" as its explicit pads
    w = [g.param("weight")] + ([g.param("bias")] if m.bias is not None else [])
    extra = {}  # only where they differ from ONNX's defaults, so older models export to the same bytes
    if m.dilation != 1:
        extra["dilations"] = list(pair(m.dilation))
    if m.groups != 1:
        extra["group"] = m.groups
    return g.op("Conv", [x] + w, out, kernel_shape=list(pair(m.kernel_size)), pads=list(m.pads()),
                strides=list(pair(m.stride)), **extra)


def _conv1d(g, m, x, s, out):  # the same Conv, 1-D attributes; padding="same" as its explicit (left, right)
    left, right = m.pads()
    w = [g.param("weight")] + ([g.param("bias")] if m.bias is not None else [])
    extra = {"dilations": [m.dilation]} if m.dilation != 1 else {}
    if m.groups != 1:
        extra["group"] = m.groups
    return g.op("Conv", [x] + w, out, kernel_shape=[m.kernel_size], pads=[left, right], strides=[m.stride], **extra)


def _conv_transpose2d(g, m, x, s, out):  # weight (in, out/groups, kH, kW) is ONNX's (C, M/group, kH, kW)
    (ph, pw), op = pair(m.padding), pair(m.output_padding)
    w = [g.param("weight")] + ([g.param("bias")] if m.bias is not None else [])
    extra = {"output_padding": list(op)} if any(op) else {}
    if m.dilation != 1:
        extra["dilations"] = list(pair(m.dilation))
    if m.groups != 1:
        extra["group"] = m.groups
    return g.op("ConvTranspose", [x] + w, out, kernel_shape=list(pair(m.kernel_size)), pads=[ph, pw, ph, pw],
                strides=list(pair(m.stride)), **extra)


def _conv_transpose1d(g, m, x, s, out):  # weight (in, out/groups, k) is ONNX's (C, M/group, k)
    w = [g.param("weight")] + ([g.param("bias")] if m.bias is not None else [])
    extra = {"output_padding": [m.output_padding]} if m.output_padding else {}
    if m.dilation != 1:
        extra["dilations"] = [m.dilation]
    if m.groups != 1:
        extra["group"] = m.groups
    return g.op("ConvTranspose", [x] + w, out, kernel_shape=[m.kernel_size], pads=[m.padding, m.padding],
                strides=[m.stride], **extra)


def _batchnorm2d(g, m, x, s, out):  # inference form: the running statistics
    ins = [x] + [g.param(n) for n in ("weight", "bias", "running_mean", "running_var")]
    return g.op("BatchNormalization", ins, out, epsilon=m.eps)


def _pool(op_type, **extra):
    def emit(g, m, x, s, out):
        (ph, pw) = pair(m.padding)
        ceil = {"ceil_mode": 1} if m.ceil_mode else {}  # (MaxPool2d's; attributes at their defaults left out)
        return g.op(op_type, [x], out, kernel_shape=list(pair(m.kernel_size)), pads=[ph, pw, ph, pw],
                    strides=list(pair(m.stride)), **extra, **ceil)
    return emit


def _pool1d(op_type, **extra):
    def emit(g, m, x, s, out):
        p = m.padding
        ceil = {"ceil_mode": 1} if m.ceil_mode else {}
        return g.op(op_type, [x], out, kernel_shape=[m.kernel_size], pads=[p, p], strides=[m.stride], **extra,
                    **ceil)
    return emit


def _pointwise(op_type, **attrs):
    def emit(g, m, x, s, out):
        return g.op(op_type, [x], out, **{k: float(getattr(m, v)) for k, v in attrs.items()})
    return emit


def _identity(g, m, x, s, out):  # Identity, and Dropout at inference: no node
    return x


def _batch_stays_first(g, m, dims):
    """Refuse a layer that moves the batch dimension: every shape the exporter writes has it first."""
    if 0 in dims:
        raise NotImplementedError(f"cannot export layer {g.path} ({m!r}): it moves the batch dimension, and "
                                  "the exported graph keeps the batch first (dynamic_batch)")


def _flatten(g, m, x, s, out):
    if (m.start_dim, m.end_dim) == (1, -1):  # (N, prod(...)), the form every consumer reads
        return g.op("Flatten", [x], out, axis=1)
    start = m.start_dim % len(s)
    _batch_stays_first(g, m, [start])
    # 0 copies the leading dimensions (the batch stays symbolic), -1 infers the merged one
    return g.op("Reshape", [x, g.const("shape", [0] * start + [-1] + list(out[start + 1:]))], out)


def _transpose(g, m, x, s, out):
    lo, hi = m.dims(s)
    if lo == hi:
        return x
    _batch_stays_first(g, m, [lo])
    perm = list(range(len(s)))
    perm[lo], perm[hi] = hi, lo
    return g.op("Transpose", [x], out, perm=perm)


def _adaptive_avg_pool(g, m, x, s, out):
    size, spatial = m.output_size, s[2:]
    if size == 1:
        return g.op("GlobalAveragePool", [x], out)
    if any(n % size for n in spatial):  # PyTorch's windows then differ in size (or overlap)
        raise NotImplementedError(f"cannot export layer {g.path} ({m!r}) on input {tuple(s)}: its windows are "
                                  f"uniform (an AveragePool) only when every spatial size is a multiple of "
                                  f"output_size {size}")
    k = [n // size for n in spatial]
    return g.op("AveragePool", [x], out, kernel_shape=k, strides=k)


# Opset-dependent forms: each layer's choice in one small helper.
def _gelu(g, m, x, s, out):
    if g.opset >= 20:  # Gelu appeared in opset 20
        return g.op("Gelu", [x], out, **({"approximate": "tanh"} if m.approximate == "tanh" else {}))
    half, one = g.const("half", 0.5, np.float32), g.const("one", 1.0, np.float32)
    if m.approximate == "none":  # x * 0.5 * (1 + erf(x / sqrt(2)))
        phi = g.op("Erf", [g.op("Mul", [x, g.const("rsqrt2", math.sqrt(0.5), np.float32)], s)], s)
    else:  # 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))
        cube = g.op("Mul", [g.op("Mul", [x, x], s), x], s)
        inner = g.op("Add", [x, g.op("Mul", [cube, g.const("kappa", 0.044715, np.float32)], s)], s)
        phi = g.op("Tanh", [g.op("Mul", [inner, g.const("beta", math.sqrt(2 / math.pi), np.float32)], s)], s)
    return g.op("Mul", [g.op("Mul", [x, half], s), g.op("Add", [phi, one], s)], out)


def _silu(g, m, x, s, out):
    return g.op("Mul", [x, g.op("Sigmoid", [x], s)], out)


def _relu6(g, m, x, s, out):
    return g.op("Clip", [x, g.const("min", 0.0, np.float32), g.const("max", 6.0, np.float32)], out)


def _hardsigmoid(g, m, x, s, out):  # PyTorch's relu6(x + 3) / 6
    return g.op("HardSigmoid", [x], out, alpha=1.0 / 6.0, beta=0.5)


def _hardswish(g, m, x, s, out):
    if g.opset >= 14:  # HardSwish appeared in opset 14
        return g.op("HardSwish", [x], out)
    return g.op("Mul", [x, _hardsigmoid(g, m, x, s, s)], out)


def _layernorm(g, m, x, s, out):
    w, b = g.param("weight"), g.param("bias")
    if g.opset >= 17:  # LayerNormalization appeared in opset 17
        return g.op("LayerNormalization", [x, w, b], out, axis=-1, epsilon=m.eps)
    row = tuple(s[:-1]) + (1,)
    d = g.op("Sub", [x, _axes_op(g, "ReduceMean", x, [-1], row, keepdims=1)], s)
    var = _axes_op(g, "ReduceMean", g.op("Mul", [d, d], s), [-1], row, keepdims=1)
    std = g.op("Sqrt", [g.op("Add", [var, g.const("eps", m.eps, np.float32)], row)], row)
    return g.op("Add", [g.op("Mul", [g.op("Div", [d, std], s), w], s), b], out)


def _groupnorm(g, m, x, s, out):
    """GroupNormalization from opset 21 (per-channel scale and bias; opset 18's took one per group), else
    its decomposition: x as (N, G, -1), (x - mean) / sqrt(var + eps) over the last axis, shaped back,
    then * weight + bias, each (C, 1, ...) to broadcast over the positions."""
    c, rank = m.num_channels, len(s)
    if g.opset >= 21:
        w, b = ((g.param("weight"), g.param("bias")) if m.affine else
                (g.const("scale", np.ones(c), np.float32), g.const("bias", np.zeros(c), np.float32)))
        return g.op("GroupNormalization", [x, w, b], out, epsilon=m.eps, num_groups=m.num_groups)
    grouped = (s[0], m.num_groups, None)
    row = (s[0], m.num_groups, 1)
    x3 = g.op("Reshape", [x, g.const("grouped", [0, m.num_groups, -1])], grouped)
    d = g.op("Sub", [x3, _axes_op(g, "ReduceMean", x3, [2], row, keepdims=1)], grouped)
    var = _axes_op(g, "ReduceMean", g.op("Mul", [d, d], grouped), [2], row, keepdims=1)
    std = g.op("Sqrt", [g.op("Add", [var, g.const("eps", m.eps, np.float32)], row)], row)
    y = g.op("Reshape", [g.op("Div", [d, std], grouped), g.const("shape", [0] + list(s[1:]))],
             out if not m.affine else s)
    if not m.affine:
        return y
    per_channel = g.const("channel_shape", [c] + [1] * (rank - 2))
    w = g.op("Reshape", [g.param("weight"), per_channel], (c,) + (1,) * (rank - 2))
    b = g.op("Reshape", [g.param("bias"), per_channel], (c,) + (1,) * (rank - 2))
    return g.op("Add", [g.op("Mul", [y, w], s), b], out)


def _instancenorm2d(g, m, x, s, out):
    c = m.num_channels
    w, b = ((g.param("weight"), g.param("bias")) if m.affine else
            (g.const("scale", np.ones(c), np.float32), g.const("bias", np.zeros(c), np.float32)))
    return g.op("InstanceNormalization", [x, w, b], out, epsilon=m.eps)


def _elu(g, m, x, s, out):
    return g.op("Elu", [x], out, alpha=m.alpha)


def _softplus(g, m, x, s, out):
    """Softplus (log(exp(x) + 1)) on beta * x, divided by beta where beta != 1; the threshold as a Where
    unless it is PyTorch's 20, past which log1p(exp(-bx)) is below float32's resolution of x."""
    if m.beta == 1.0 and m.threshold == 20.0:
        return g.op("Softplus", [x], out)
    bx = x if m.beta == 1.0 else g.op("Mul", [x, g.const("beta", m.beta, np.float32)], s)
    y = g.op("Softplus", [bx], s)
    g.rename(y, g._name("softplus_inner"), len(g.nodes) - 1)  # not "<path>.Softplus", the layer output's name
    y = g.nodes[-1].output[0]
    if m.beta != 1.0:
        y = g.op("Div", [y, g.const("beta", m.beta, np.float32)], s if m.threshold != 20.0 else out)
    if m.threshold == 20.0:
        return y
    above = g.op("Greater", [bx, g.const("threshold", m.threshold, np.float32)], None)
    return g.op("Where", [above, x, y], out)


def _mish(g, m, x, s, out):
    if g.opset >= 18:  # Mish appeared in opset 18
        return g.op("Mish", [x], out)
    return g.op("Mul", [x, g.op("Tanh", [g.op("Softplus", [x], s)], s)], out)


def _prelu(g, m, x, s, out):  # the slopes (C,) as (C, 1, ...) to broadcast along dimension 1
    w = g.param("weight")
    if m.num_parameters != 1 and len(s) > 2:
        w = g.op("Reshape", [w, g.const("slope_shape", [m.num_parameters] + [1] * (len(s) - 2))], None)
    return g.op("PRelu", [x, w], out)


def _log_softmax_layer(g, m, x, s, out):  # before opset 13, Transposes around a last-axis LogSoftmax
    return _softmax_at(g, x, m.dim, s, out, "LogSoftmax")


def _embedding(g, m, x, s, out):  # the weight's rows by int64 indices: the graph input, else x cast
    if x != g.int_input:
        x = g.op("Cast", [x], None, to=INT64)  # (no value_info: those say float)
    return g.op("Gather", [g.param("weight"), x], out, axis=0)


# torch's gate blocks in ONNX's order: LSTM's i, o, f, c of torch's i, f, g, o; GRU's z, r, h of r, z, n
ONNX_GATES = {"LSTM": (0, 3, 1, 2), "GRU": (1, 0, 2)}


def rnn_onnx_weights(g, m, layer):
    """ONNX's W (D, G*H, in), R (D, G*H, H) and B (D, 2*G*H: W's bias, then R's; "" without bias) of layer
    `layer` of LSTM/GRU m, made in the graph from the parameters (initializers named as in the state dict,
    so that a file netcl wrote reads back as its layers): each one's gate blocks reordered by a Gather of
    rows, the directions concatenated and reshaped."""
    H, D, G = m.hidden_size, m.num_directions, m.GATES * m.hidden_size
    sfx = [f"l{layer}" + ("_reverse" if d else "") for d in range(D)]
    rows = g.const("gate_rows", np.concatenate([np.arange(k * H, (k + 1) * H) for k in ONNX_GATES[type(m).__name__]]))

    def reordered(name, shape):
        return g.op("Gather", [g.param(name), rows], shape, axis=0)

    def stacked(parts, shape, dims):
        v = g.op("Concat", parts, (D * shape[0],) + shape[1:], axis=0) if D > 1 else parts[0]
        return g.op("Reshape", [v, g.const("onnx_shape", dims)], (D,) + tuple(dims[1:]) if -1 not in dims else None)
    W = stacked([reordered(f"weight_ih_{x}", (G, None)) for x in sfx], (G, None), [D, G, -1])
    R = stacked([reordered(f"weight_hh_{x}", (G, H)) for x in sfx], (G, H), [D, G, H])
    if not m.bias:
        return W, R, ""
    B = stacked([g.op("Concat", [reordered(f"bias_ih_{x}", (G,)), reordered(f"bias_hh_{x}", (G,))], (2 * G,), axis=0)
                 for x in sfx], (2 * G,), [D, 2 * G])
    return W, R, B


def rnn_outputs(g, m, x, s, h0=None, c0=None):
    """LSTM/GRU m on value x of shape s as one ONNX LSTM/GRU node per layer; (output, h_n, c_n) names
    (c_n None for GRU). ONNX runs time-major, Y (L, D, N, H): a Transpose and Reshape make it (L, N, D*H)
    for the next layer and the output; batch_first input and output are transposed; the initial states
    (layers * D, N, H) are cut per layer by Gather. Dropout between layers is a training matter: none."""
    H, D, L, kind = m.hidden_size, m.num_directions, m.num_layers, type(m).__name__
    unbatched, bf = len(s) == 2, m.batch_first and len(s) == 3
    if unbatched:  # (T, in) -> (T, 1, in)
        x = g.op("Reshape", [x, g.const("batched", [0, 1, -1])], (s[0], 1, s[1]))
    elif bf:
        x = g.op("Transpose", [x], (s[1], s[0], s[2]), perm=[1, 0, 2])
    T, N = (s[0], 1) if unbatched else ((s[1], s[0]) if bf else (s[0], s[1]))
    states = [h0] + ([c0] if kind == "LSTM" else [])
    if unbatched:
        states = [v if v is None else g.op("Reshape", [v, g.const("batched", [0, 1, -1])], (L * D, 1, H))
                  for v in states]
    hs, cs = [], []
    for layer in range(L):
        inputs = [x, *rnn_onnx_weights(g, m, layer), ""]
        for v in states:
            rows = None if v is None else g.const(f"rows_l{layer}", list(range(layer * D, (layer + 1) * D)))
            inputs.append("" if v is None else g.op("Gather", [v, rows], (D, N, H), axis=0))
        while inputs[-1] == "":
            inputs.pop()
        extra = {"linear_before_reset": 1} if kind == "GRU" else {}  # torch's n: r * (W_hn h + b_hn)
        outs = g.op_outputs(kind, inputs, [(T, D, N, H), (D, N, H)] + ([(D, N, H)] if kind == "LSTM" else []),
                            direction="bidirectional" if D == 2 else "forward", hidden_size=H, **extra)
        y = g.op("Transpose", [outs[0]], (T, N, D, H), perm=[0, 2, 1, 3])
        x = g.op("Reshape", [y, g.const("merged", [0, 0, -1])], (T, N, D * H))
        hs.append(outs[1])
        if kind == "LSTM":
            cs.append(outs[2])
    hn = g.op("Concat", hs, (L * D, N, H), axis=0) if L > 1 else hs[0]
    cn = (g.op("Concat", cs, (L * D, N, H), axis=0) if L > 1 else cs[0]) if cs else None
    if unbatched:
        x = g.op("Reshape", [x, g.const("unbatched", [0, -1])], (T, D * H))
        hn, cn = (v if v is None else g.op("Reshape", [v, g.const("unbatched", [0, -1])], (L * D, H))
                  for v in (hn, cn))
    elif bf:
        x = g.op("Transpose", [x], (N, T, D * H), perm=[1, 0, 2])
    return x, hn, cn


def _rnn(g, m, x, s, out):  # the output sequence alone (a graph's call of the layer takes all three)
    return rnn_outputs(g, m, x, s)[0]


def _softmax(g, m, x, s, out):  # before opset 13, Transposes around a last-axis Softmax
    return _softmax_at(g, x, m.dim, s, out)


def _multihead_attention(g, m, x, s, out):
    # (N, L, E) -> (N, L, E), batch-first self-attention with PyTorch's packed in-projection
    n, length, e = g.batch, s[1], m.embed_dim
    h, d = m.num_heads, e // m.num_heads
    nl = None if isinstance(n, str) else n * length
    x2 = g.op("Reshape", [x, g.const("shape_in", [-1, e])], (nl, e))
    qkv = g.op("Gemm", [x2, g.param("in_proj_weight"), g.param("in_proj_bias")], (nl, 3 * e), transB=1)
    qkv = g.op("Reshape", [qkv, g.const("shape_qkv", [-1, length, 3, h, d])], (n, length, 3, h, d))
    qkv = g.op("Transpose", [qkv], (3, n, h, length, d), perm=[2, 0, 3, 1, 4])
    q, k, v = (g.op("Gather", [qkv, g.const(f"index_{w}", i)], (n, h, length, d), axis=0)
               for i, w in enumerate("qkv"))
    kt = g.op("Transpose", [k], (n, h, d, length), perm=[0, 1, 3, 2])
    scores = g.op("MatMul", [q, kt], (n, h, length, length))
    scores = g.op("Mul", [scores, g.const("scale", 1.0 / math.sqrt(d), np.float32)], (n, h, length, length))
    attn = _softmax_at(g, scores, -1, (n, h, length, length), (n, h, length, length))
    o = g.op("MatMul", [attn, v], (n, h, length, d))
    o = g.op("Transpose", [o], (n, length, h, d), perm=[0, 2, 1, 3])
    o = g.op("Reshape", [o, g.const("shape_heads", [-1, e])], (nl, e))
    y = g.op("Gemm", [o, g.param("out_proj.weight"), g.param("out_proj.bias")], (nl, e), transB=1)
    return g.op("Reshape", [y, g.const("shape_out", [-1, length, e])], out)


def _residual(g, m, x, s, out):
    y = g.emit(m.body, "body", x, s)
    return g.op("Add", [y, x if m.shortcut is None else g.emit(m.shortcut, "shortcut", x, s)], out)


def _concat(g, m, x, s, out):
    ys = [g.emit(branch, f"branches.{b}", x, s) for b, branch in enumerate(m.branches.layers)]
    return g.op("Concat", ys, out, axis=m.dim)


def _upsample(g, m, x, s, out):
    # the modes that reproduce PyTorch: floor(out / s) for nearest, half_pixel = align_corners=False
    k = float(m.scale_factor)
    ins = [x, g.const("roi", [], np.float32), g.const("scales", [1.0, 1.0, k, k], np.float32)]
    if m.mode == "nearest":
        return g.op("Resize", ins, out, mode="nearest", coordinate_transformation_mode="asymmetric",
                    nearest_mode="floor")
    return g.op("Resize", ins, out, mode="linear", coordinate_transformation_mode="half_pixel")


# -- traced graphs: a GraphModule's nodes, each layer call through the layer's own emitter ----------
class _V:
    """A graph value during export: its ONNX name and shape (the batch as g.batch), whether it holds
    int32 (argmax, indices, casts), and the tensor of a parameter or constant."""

    __slots__ = ("name", "shape", "tensor", "int")

    def __init__(self, name, shape, tensor=None, int32=False):
        self.name, self.shape, self.tensor, self.int = name, tuple(shape), tensor, int32


# operations that move or join values without arithmetic: an int32 value stays int32 through them
_MOVES = {"reshape", "flatten", "squeeze", "unsqueeze", "permute", "transpose", "expand", "clone", "detach", "getitem",
          "cat", "stack", "cast"}


def _as_float(g, a):
    """An operand of arithmetic: netcl computes on int32 values as float32, so does the graph (a Cast)."""
    if isinstance(a, _V) and a.int:
        return _V(g.op("Cast", [a.name], a.shape, to=FLOAT), a.shape, a.tensor)
    if isinstance(a, (list, tuple)) and not isinstance(a, _V):
        return type(a)(_as_float(g, v) for v in a)
    return a


def _int_out(op, args):
    """Whether operation op's value (or each of its pair) holds int32."""
    if op in ("argmax", "argmin"):
        return True
    if op in ("max", "min") and len(args) > 1 and args[1] is not None:
        return (False, True)
    if op == "cast":
        return np.dtype(args[1]) == np.int32
    if op in _MOVES:
        first = args[0][0] if isinstance(args[0], list) else args[0]
        return isinstance(first, _V) and first.int
    return False


def _graph_module(g, gm, x, s, out):
    """Each node in order: a layer call (or a layer made in forward) through EMITTERS, named by the
    layer's path; a parameter or constant used as an operand as an initializer named by its path;
    an operation through OP_EMITTERS. Names carry the node's index (an op's "add_9")."""
    env, outer, calls = [], g.path, {}
    base = f"{outer}." if outer else ""

    def shape_of(node, k=0):
        return tuple(g.batch if d == "N" else d for d in node["out"][k])

    def resolve(a):  # exported for inference: the graph's mode is eval
        return graph.decode(a, lambda i, k: env[i] if k is None else env[i][k], _BATCH, False)

    for i, node in enumerate(gm.graph):
        op = node["op"]
        if op == "input":
            env.append(_V(x, s))
            continue
        args = resolve(node.get("args", []))
        kwargs = {k: resolve(v) for k, v in node.get("kwargs", {}).items()}
        if op == "output":
            return args[0].name
        if op in ("param", "const"):
            t = gm._tensor(node["target"])
            env.append(_V(g.tensor_init(base + node["target"], t), t.shape, t))
            continue
        if op in ("call", "layer"):
            ints = False
            layer = gm.submodule(node["target"]) if op == "call" else gm._layer(i, node)
            path = base + (node["target"] if op == "call" else f"{node['type']}_{i}")
            calls[path] = calls.get(path, -1) + 1
            path += f"_{calls[path]}" if calls[path] else ""  # a layer called again: its values named apart
            if isinstance(layer, (nn.LSTM, nn.GRU)):  # (output, (h_n, c_n)) or (output, h_n): its values flat
                y, ints = _rnn_call(g, layer, path, args), (False,) * len(node["out"])
            else:
                y = _layer_at(g, layer, path, args[0], shape_of(node))
        else:
            emit = OP_EMITTERS.get(op)
            if emit is None:
                raise NotImplementedError(f"cannot export node {i} ({op}) of the graph: no ONNX form for it")
            g.begin(f"{base}{op}_{i}", gm)
            ints = _int_out(op, args)
            if op not in _MOVES:
                args, kwargs = _as_float(g, args), {k: _as_float(g, v) for k, v in kwargs.items()}
            g.graph_input = x
            y = emit(g, [shape_of(node, k) for k in range(len(node["out"]))], *args, **kwargs)
        if isinstance(y, tuple):
            env.append(tuple(_V(v, shape_of(node, k), int32=ints[k]) for k, v in enumerate(y)))
        else:
            env.append(_V(y, shape_of(node), int32=op not in ("call", "layer") and ints is True))
    raise AssertionError("a checked graph ends with its output")


def _rnn_call(g, layer, path, args):
    """A graph's call of an LSTM or GRU, initial states included: the names of its flat outputs."""
    outer = g.path, g.layer, getattr(g, "_count", {})
    hx = args[1] if len(args) > 1 else None
    h0, c0 = (hx if isinstance(hx, tuple) else (hx, None)) if hx is not None else (None, None)
    g.begin(path, layer)
    y, hn, cn = rnn_outputs(g, layer, args[0].name, args[0].shape, h0 and h0.name, c0 and c0.name)
    g.path, g.layer, g._count = outer
    return (y, hn, cn) if cn is not None else (y, hn)


_BATCH = object()  # a reshape or expand target's batch size


def _layer_at(g, layer, path, x, out_shape):
    """Emit `layer` (or a Sequential's chain) at state_dict path `path` on value x; the value's name."""
    outer = g.path, g.layer, getattr(g, "_count", {})
    y = g.chain(layer, path, x.name, (g.n,) + tuple(x.shape[1:]))
    g.path, g.layer, g._count = outer
    return y


def _operand(g, v, shape):
    """An operation's operand: a value's name, or a number as a scalar initializer."""
    if isinstance(v, _V):
        return v.name
    return g.const("scalar", float(v), np.float32)


def _binary(op_type):
    def emit(g, outs, a, b):
        return g.op(op_type, [_operand(g, a, outs[0]), _operand(g, b, outs[0])], outs[0])
    return emit


def _unary(op_type):
    def emit(g, outs, x):
        return g.op(op_type, [x.name], outs[0])
    return emit


_COMPARE = {"eq": ("Equal", False), "ne": ("Equal", True), "lt": ("Less", False), "gt": ("Greater", False),
            "le": ("Greater", True), "ge": ("Less", True)}  # (op, negated): before opset 12 no *OrEqual


def _compare(g, outs, name, a, b):
    op_type, negate = _COMPARE[name]
    y = g.op(op_type, [_operand(g, a, outs[0]), _operand(g, b, outs[0])], None)  # (booleans: no float value_info)
    if negate:
        y = g.op("Not", [y], None)
    return g.op("Cast", [y], outs[0], to=FLOAT)


def _as_layer(make):
    """An operation whose layer exists: emitted as that layer (make(args) builds it)."""
    def emit(g, outs, x, *args, **kwargs):
        return _layer_at(g, make(*args, **kwargs), g.path, x, outs[0])
    return emit


def _axes(dim, ndim):
    dims = (dim if isinstance(dim, (tuple, list)) else (dim,)) if dim is not None else ()
    dims = dims or range(ndim)  # (None or an empty sequence: every dimension)
    return sorted({d % ndim for d in dims})


def _reduce(op_type):
    def emit(g, outs, x, dim=None, keepdim=False):
        return _axes_op(g, op_type, x.name, _axes(dim, len(x.shape)), outs[0], keepdims=int(keepdim))
    return emit


def _arg_reduce(op_type):
    def emit(g, outs, x, dim=None, keepdim=False):
        src, axis = x.name, dim
        if dim is None:  # of the flattened tensor
            src, axis = g.op("Reshape", [x.name, g.const("shape", [-1])], (None,)), 0
        y = g.op(op_type, [src], None, axis=axis % max(1, len(x.shape)), keepdims=int(keepdim))
        return g.op("Cast", [y], None, to=P.TensorProto.INT32)  # (int32: no float value_info)
    return emit


def _extremum(reduce_op, arg_op):
    def emit(g, outs, x, dim=None, keepdim=False):
        if dim is None:
            return _axes_op(g, reduce_op, x.name, _axes(None, len(x.shape)), outs[0], keepdims=0)
        values = _axes_op(g, reduce_op, x.name, [dim % len(x.shape)], outs[0], keepdims=int(keepdim))
        idx = g.op(arg_op, [x.name], None, axis=dim % len(x.shape), keepdims=int(keepdim))
        return values, g.op("Cast", [idx], None, to=P.TensorProto.INT32)
    return emit


def _shape_arg(g, x, shape):
    """A reshape or expand target: the batch stays free (0 copies the input's first dimension)."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    return g.const("shape", [0 if v is _BATCH else int(v) for v in shape])


def _reshape(g, outs, x, *shape):
    return g.op("Reshape", [x.name, _shape_arg(g, x, shape)], outs[0])


def _flatten_op(g, outs, x, start_dim=0, end_dim=-1):
    return g.op("Reshape", [x.name, g.const("shape", [0 if (k == 0 and isinstance(n, str)) else n
                                                       for k, n in enumerate(outs[0])])], outs[0])


def _same_shape_view(g, outs, x, *args):  # squeeze, unsqueeze: a Reshape to the traced shape
    return _flatten_op(g, outs, x)


def _permute(g, outs, x, *dims):
    if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
        dims = tuple(dims[0])
    perm = [d % len(x.shape) for d in dims]
    return g.op("Transpose", [x.name], outs[0], perm=perm)


def _transpose_op(g, outs, x, dim0, dim1):
    perm = list(range(len(x.shape)))
    a, b = dim0 % len(perm), dim1 % len(perm)
    perm[a], perm[b] = perm[b], perm[a]
    return g.op("Transpose", [x.name], outs[0], perm=perm)


def _expand(g, outs, x, *shape):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    target = [1 if (v is _BATCH or v == -1) else int(v) for v in shape]  # 1: broadcast keeps the input's
    pad = len(shape) - len(x.shape)
    if shape and shape[0] is _BATCH and (pad > 0 or x.shape[0] == 1):  # (a class token over the batch)
        batch = g.op("Slice", [g.op("Shape", [g.graph_input], None), g.const("start", [0]), g.const("end", [1])], None)
        return g.op("Expand", [x.name, g.op("Concat", [batch, g.const("rest", target[1:])], None, axis=0)], outs[0])
    return g.op("Expand", [x.name, g.const("shape", target)], outs[0])


def _filled(value):
    """zeros/ones: a constant, or with the batch in its shape an Expand of it to (the input's batch, ...)."""
    def emit(g, outs, *shape, **kwargs):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        if not any(v is _BATCH for v in shape):
            return g.tensor_init(g._name("constant"), Tensor.from_host(None, np.full(shape, value, np.float32)))
        batch = g.op("Slice", [g.op("Shape", [g.graph_input], None), g.const("start", [0]), g.const("end", [1])], None)
        rest = g.const("rest", [int(v) for v in shape[1:]])
        return g.op("Expand", [g.const("value", value, np.float32), g.op("Concat", [batch, rest], None, axis=0)],
                    outs[0])
    return emit


def _full_like(g, outs, x, value):
    return g.op("Expand", [g.const("value", float(value), np.float32), g.op("Shape", [x.name], None)], outs[0])


def _identity_op(g, outs, x, *args, **kwargs):
    return g.op("Identity", [x.name], outs[0])


def _getitem(g, outs, x, index):
    if not isinstance(index, tuple):
        index = (index,)
    used = sum(1 for i in index if i is not None and i is not Ellipsis)
    if any(i is Ellipsis for i in index):
        k = index.index(Ellipsis)
        index = index[:k] + (slice(None),) * (len(x.shape) - used) + index[k + 1:]
    index = index + (slice(None),) * (len(x.shape) - sum(1 for i in index if i is not None))
    starts, ends, axes, steps, drop, add, d, out_dim = [], [], [], [], [], [], 0, 0
    for i in index:
        if i is None:
            add.append(out_dim)
            out_dim += 1
            continue
        n = x.shape[d]
        if isinstance(i, slice):
            if (i.start, i.stop, i.step) != (None, None, None):
                if isinstance(n, str):
                    raise NotImplementedError(f"cannot export {g.path}: a slice of the batch dimension with "
                                              "dynamic_batch")
                a, b, c = i.indices(n)
                starts, ends, axes, steps = starts + [a], ends + [b], axes + [d], steps + [c]
            out_dim += 1
        else:
            if isinstance(n, str):
                raise NotImplementedError(f"cannot export {g.path}: an index into the batch dimension with "
                                          "dynamic_batch")
            k = int(i) % n
            starts, ends, axes, steps = starts + [k], ends + [k + 1], axes + [d], steps + [1]
            drop.append(d)
        d += 1
    y = x.name
    if axes:
        y = g.op("Slice", [y, g.const("starts", starts), g.const("ends", ends), g.const("axes", axes),
                           g.const("steps", steps)], None)
    if drop:
        y = _axes_op(g, "Squeeze", y, drop, None)
    if add:
        y = _axes_op(g, "Unsqueeze", y, add, None)
    return y if y != x.name else g.op("Identity", [y], outs[0])


def _cat(g, outs, tensors, dim=0):
    if not all(t.int for t in tensors):  # int32 joins float32 as netcl's cat does: as floats
        tensors = _as_float(g, tensors)
    return g.op("Concat", [t.name for t in tensors], outs[0], axis=dim % len(outs[0]))


def _stack(g, outs, tensors, dim=0):
    if not all(t.int for t in tensors):
        tensors = _as_float(g, tensors)
    d = dim % len(outs[0])
    ups = [_axes_op(g, "Unsqueeze", t.name, [d], None) for t in tensors]
    return g.op("Concat", ups, outs[0], axis=d)


def _cast(g, outs, x, dtype):
    to = P.TensorProto.INT32 if np.dtype(dtype) == np.int32 else FLOAT
    return g.op("Cast", [x.name], outs[0] if to == FLOAT else None, to=to)


def _clamp(g, outs, x, min=None, max=None):
    if isinstance(min, _V) or isinstance(max, _V):
        y = x.name if min is None else g.op("Max", [x.name, _operand(g, min, outs[0])], outs[0])
        return y if max is None else g.op("Min", [y, _operand(g, max, outs[0])], outs[0])
    lo = g.const("min", -3.4028234663852886e38 if min is None else float(min), np.float32)
    hi = g.const("max", 3.4028234663852886e38 if max is None else float(max), np.float32)
    return g.op("Clip", [x.name, lo, hi], outs[0])


def _log_softmax(g, outs, x, dim):
    axis, last = dim % len(x.shape), len(x.shape) - 1
    if g.opset >= 13 or axis == last:
        return g.op("LogSoftmax", [x.name], outs[0], axis=axis)
    perm = list(range(len(x.shape)))
    perm[axis], perm[last] = last, axis
    swapped = tuple(x.shape[i] for i in perm)
    y = g.op("LogSoftmax", [g.op("Transpose", [x.name], swapped, perm=perm)], swapped, axis=last)
    return g.op("Transpose", [y], outs[0], perm=perm)


def _linear_fn(g, outs, x, weight, bias=None):  # weight in PyTorch's layout (out, in): x @ W^T + b
    ins = [x.name, weight.name] + ([bias.name] if bias is not None else [])
    if len(x.shape) == 2:
        return g.op("Gemm", ins, outs[0], transB=1)
    y = g.op("MatMul", [x.name, g.op("Transpose", [weight.name], None, perm=[1, 0])], outs[0])
    return g.op("Add", [y, bias.name], outs[0]) if bias is not None else y


def _layer_norm_fn(g, outs, x, normalized_shape, weight=None, bias=None, eps=1e-5):
    layer = nn.LayerNorm(normalized_shape, eps)
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None:
            layer._params[name] = t.tensor
    return _layer_at(g, layer, g.path, x, outs[0])


def _group_norm_fn(g, outs, x, num_groups, weight=None, bias=None, eps=1e-5):
    layer = nn.GroupNorm(num_groups, x.shape[1], eps, affine=weight is not None or bias is not None)
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None:
            layer._params[name] = t.tensor
    return _layer_at(g, layer, g.path, x, outs[0])


def _not_in_inference(what):
    def emit(g, outs, *args, **kwargs):
        raise NotImplementedError(f"cannot export {g.path}: {what} is not part of an inference graph")
    return emit


# operation name (autograd.TRACEABLE) -> emitter (graph, output shapes, the node's arguments with values
# as _V) returning its value's name (a pair for max/min along a dimension)
OP_EMITTERS = {
    "add": _binary("Add"), "sub": _binary("Sub"), "mul": _binary("Mul"), "div": _binary("Div"),
    "pow": _binary("Pow"), "maximum": _binary("Max"), "minimum": _binary("Min"), "compare": _compare,
    "neg": _unary("Neg"), "exp": _unary("Exp"), "log": _unary("Log"), "sqrt": _unary("Sqrt"),
    "abs": _unary("Abs"), "sin": _unary("Sin"), "cos": _unary("Cos"), "clamp": _clamp,
    **{op: _as_layer(make) for op, make in LAYER_OF.items()},  # (the operations that are a layer's)
    "log_softmax": _log_softmax,
    "sum": _reduce("ReduceSum"), "mean": _reduce("ReduceMean"), "amax": _reduce("ReduceMax"),
    "amin": _reduce("ReduceMin"), "max": _extremum("ReduceMax", "ArgMax"), "min": _extremum("ReduceMin", "ArgMin"),
    "argmax": _arg_reduce("ArgMax"), "argmin": _arg_reduce("ArgMin"),
    "matmul": lambda g, outs, a, b: g.op("MatMul", [a.name, b.name], outs[0]),
    "reshape": _reshape, "flatten": _flatten_op, "squeeze": _same_shape_view, "unsqueeze": _same_shape_view,
    "permute": _permute, "transpose": _transpose_op, "expand": _expand, "clone": _identity_op,
    "detach": _identity_op, "getitem": _getitem, "cat": _cat, "stack": _stack, "cast": _cast,
    "zeros": _filled(0.0), "ones": _filled(1.0), "full_like": _full_like,
    "randn": _not_in_inference("drawing random numbers"),
    "F.log_softmax": _log_softmax, "F.dropout": _identity_op, "F.linear": _linear_fn,
    "F.layer_norm": _layer_norm_fn,
    "F.group_norm": _group_norm_fn,
    **{f"F.{loss}": _not_in_inference("a loss") for loss in (
        "nll_loss", "cross_entropy", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy",
        "binary_cross_entropy_with_logits")},
}


EMITTERS = {
    nn.Linear: _linear,                          # Gemm (transB=0) for 2-D input, else MatMul + Add
    nn.Conv2d: _conv2d,                          # Conv (dilations, group when not 1)
    nn.ConvTranspose1d: _conv_transpose1d,       # ConvTranspose, 1-D attributes (group, dilations when set)
    nn.Conv1d: _conv1d,                          # Conv, 1-D attributes (padding="same": explicit pads)
    nn.ConvTranspose2d: _conv_transpose2d,       # ConvTranspose (output_padding, group, dilations when set)
    nn.BatchNorm1d: _batchnorm2d,                # BatchNormalization on (N, C) or (N, C, L), as on 4-D
    nn.BatchNorm2d: _batchnorm2d,                # BatchNormalization (running statistics, epsilon)
    nn.ReLU: _pointwise("Relu"),
    nn.LeakyReLU: _pointwise("LeakyRelu", alpha="negative_slope"),
    nn.Sigmoid: _pointwise("Sigmoid"),
    nn.Tanh: _pointwise("Tanh"),
    nn.MaxPool2d: _pool("MaxPool"),
    nn.AvgPool2d: _pool("AveragePool", count_include_pad=1),
    nn.MaxPool1d: _pool1d("MaxPool"),
    nn.AvgPool1d: _pool1d("AveragePool", count_include_pad=1),
    nn.Flatten: _flatten,                        # Flatten(axis=1) for (1, -1), else Reshape [0.., -1, dims]
    nn.Transpose: _transpose,                    # Transpose(perm)
    nn.AdaptiveAvgPool2d: _adaptive_avg_pool,    # GlobalAveragePool (size 1), AveragePool (uniform windows)
    nn.AdaptiveAvgPool1d: _adaptive_avg_pool,
    nn.LayerNorm: _layernorm,                    # LayerNormalization (opset >= 17), else its decomposition
    nn.GroupNorm: _groupnorm,                    # GroupNormalization (opset >= 21), else its decomposition
    nn.InstanceNorm2d: _instancenorm2d,
    nn.InstanceNorm1d: _instancenorm2d,          # the same node on (N, C, L)          # InstanceNormalization (scale ones, bias zeros when not affine)
    nn.GELU: _gelu,                              # Gelu (opset >= 20), else the Erf / Tanh formula
    nn.SiLU: _silu,                              # Mul(x, Sigmoid(x))
    nn.ReLU6: _relu6,                            # Clip(0, 6)
    nn.Hardswish: _hardswish,                    # HardSwish (opset >= 14), else Mul(x, HardSigmoid(x))
    nn.Hardsigmoid: _hardsigmoid,                # HardSigmoid(alpha=1/6, beta=0.5)
    nn.Identity: _identity,                     # no node
    nn.Dropout: _identity,                      # no node (identity at inference)
    nn.Softmax: _softmax,                        # Softmax(axis=dim)
    nn.LogSoftmax: _log_softmax_layer,           # LogSoftmax(axis=dim)
    nn.ELU: _elu,                                # Elu(alpha)
    nn.Softplus: _softplus,                      # Softplus; Mul/Div by beta where not 1, Where(threshold) where not 20
    nn.Mish: _mish,                              # Mish (opset >= 18), else x * Tanh(Softplus(x))
    nn.PReLU: _prelu,                            # PRelu (slopes reshaped to (C, 1, ...))
    nn.Embedding: _embedding,                    # Gather(weight, indices, axis=0); first: an int64 graph input
    nn.LSTM: _rnn,                               # an LSTM node per layer (gates reordered i, o, f, c), Transposes
    nn.GRU: _rnn,                                # a GRU node per layer (z, r, h; linear_before_reset=1), likewise
    nn.MultiheadAttention: _multihead_attention,  # Gemm, Reshape, Transpose, Gather, MatMul, Softmax
    nn.Residual: _residual,                      # the body's nodes, the shortcut's (if any), Add
    nn.Concat: _concat,                          # each branch's nodes, Concat(axis=dim)
    nn.Upsample: _upsample,                      # Resize (scales initializer, empty roi)
    nn.GraphModule: _graph_module,               # its nodes: layers by EMITTERS, operations by OP_EMITTERS
}

# Registered layers that need no emitter of their own, with the reason (tests check that every
# type in nn.LAYERS is in exactly one of the two tables).
NOT_EMITTED = {
    nn.Sequential: "walked by Module.chain(): a nested Sequential's layers are emitted in order",
    nn.ModuleList: "Concat's branches: emitted by Concat, branch by branch",
    nn.ModuleDict: "a traced graph's containers: the graph emits the layers they hold by path",
}


# -- checks ------------------------------------------------------------------------------
def _check(model, input_shape, input_name, output_name):
    if not isinstance(model, nn.Module):
        raise TypeError(f"export_onnx expects a netcl model (nn.Sequential), got {type(model).__name__}")
    leaves = list(model.chain())
    held = list(_held(model))
    if model.training or any(m.training for _, m in held):
        raise ValueError("the model is in training mode; call model.eval() before exporting "
                         "(BatchNorm would otherwise bake in meaningless statistics)")
    unsupported = [f"layer {p} ({type(m).__name__})" for p, m in held
                   if type(m) not in EMITTERS and type(m) not in NOT_EMITTED]
    if unsupported:
        supported = ", ".join(sorted(t.__name__ for t in EMITTERS))
        raise NotImplementedError(f"cannot export to ONNX: unsupported {', '.join(unsupported)}; "
                                  f"supported layers: {supported}")
    for what, v in (("input_name", input_name), ("output_name", output_name)):
        if not isinstance(v, str) or not v:
            raise ValueError(f"{what} must be a non-empty string, got {v!r}")
    if input_name == output_name:
        raise ValueError(f"input_name and output_name must differ, both are {input_name!r}")
    try:
        shape = tuple(int(s) for s in input_shape)
    except (TypeError, ValueError):
        raise ValueError(f"input_shape must be a sequence of ints, e.g. x.shape; got {input_shape!r}") from None
    if not shape or min(shape) < 1 or shape != tuple(input_shape):
        raise ValueError(f"input_shape must be positive ints with the batch first, got {tuple(input_shape)}")
    shapes = [shape]
    for p, m in leaves:
        try:
            shapes.append(tuple(m.output_shape(shapes[-1])))
        except ShapeError as e:  # inside a block: name the layer's full path
            raise ValueError(f"input_shape {shape} does not fit the model: {e.at(p)}") from None
        except ValueError as e:
            raise ValueError(f"input_shape {shape} does not fit the model: layer {p} ({type(m).__name__}) "
                             f"gets {shapes[-1]}: {e}") from None
    return shapes


def _traced(model, input_shape):
    """A Module subclass with a forward of its own as the GraphModule that netcl.trace records of it
    (in eval mode, on zeros of input_shape with a batch of at least 2, so the batch stays free)."""
    if not isinstance(model, nn.Module) or not model.own_forward_modules():
        return model
    if model.training or any(m.training for m in model.modules()):
        raise ValueError("the model is in training mode; call model.eval() before exporting "
                         "(BatchNorm would otherwise bake in meaningless statistics)")
    try:
        shape = tuple(int(s) for s in input_shape)
    except (TypeError, ValueError):
        raise ValueError(f"input_shape must be a sequence of ints, e.g. x.shape; got {input_shape!r}") from None
    if not shape or min(shape) < 1:
        raise ValueError(f"input_shape must be positive ints with the batch first, got {shape}")
    return _recordable(model, np.zeros((max(2, shape[0]),) + shape[1:], np.float32))


def _held(layer, path=""):
    """(path, layer) for every layer the model holds, blocks' children included."""
    for name, child in layer.named_children():
        p = f"{path}.{name}" if path else name
        yield p, child
        yield from _held(child, p)


# -- building ----------------------------------------------------------------------------
def _value_info(name, shape, elem_type=FLOAT):
    dims = [P.TensorShapeProto.Dimension(dim_param=d) if isinstance(d, str) else
            P.TensorShapeProto.Dimension(dim_value=d) if d is not None else P.TensorShapeProto.Dimension()
            for d in shape]
    t = P.TypeProto.Tensor(elem_type=elem_type, shape=P.TensorShapeProto(dim=dims))
    return P.ValueInfoProto(name=name, type=P.TypeProto(tensor_type=t))


def _build(model, input_shape, dynamic_batch, input_name, output_name, *, opset):
    """The graph for `opset` without the weights' bytes: (graph, initializer list, the input's shape)."""
    shapes = _check(model, input_shape, input_name, output_name)
    g = _Graph("batch" if dynamic_batch else shapes[0][0], shapes[0][0], opset)
    sym = g.sym
    first = next(iter(model.chain()), (None, None))[1]
    if type(first) is nn.Embedding:  # the model's input is its indices: int64, as ONNX's Gather takes them
        g.int_input = input_name
    x = g.chain(model, "", input_name, shapes[0])
    if x == input_name:  # nothing but dropped layers
        g.begin("output", None)
        g.nodes.append(P.NodeProto(input=[x], output=[output_name], name="output", op_type="Identity"))
    else:
        g.rename(x, output_name, 0)
    clash = {input_name, output_name} & {name for name, *_ in g.inits}
    if clash:
        raise ValueError(f"input_name/output_name {sorted(clash)} clash with initializer names")
    graph = P.GraphProto(node=g.nodes, name="netcl",
                         input=[_value_info(input_name, sym(shapes[0]), INT64 if g.int_input else FLOAT)],
                         output=[_value_info(output_name, sym(shapes[-1]))],
                         value_info=[_value_info(n, s) for n, s in g.shapes.items()
                                     if s is not None and n not in (input_name, output_name)])
    return graph, g.inits, sym(shapes[0])


# -- opset, target and metadata -----------------------------------------------------------
def resolve_opset(opset=None, target=None):
    """(opset, ir_version) for an explicit `opset`, a `target` consumer, both, or neither (17)."""
    if target is None:
        opset = DEFAULT_OPSET if opset is None else opset
        if opset not in OPSET_IR_VERSION:
            raise ValueError(f"opset must be between {min(OPSET_IR_VERSION)} and {max(OPSET_IR_VERSION)}, "
                             f"got {opset!r}")
        return opset, OPSET_IR_VERSION[opset]
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; known targets: {', '.join(TARGETS)}")
    max_opset, max_ir = TARGETS[target]
    readable = [o for o, ir in OPSET_IR_VERSION.items() if o <= max_opset and ir <= max_ir]
    if not readable:
        raise ValueError(f"{target} reads opsets up to {max_opset} (IR {max_ir}); netcl writes opsets "
                         f"{min(OPSET_IR_VERSION)} to {max(OPSET_IR_VERSION)}")
    if opset is None:
        opset = max(readable)
    elif opset not in readable:
        raise ValueError(f"{target} reads opsets up to {max_opset} (IR {max_ir}), got opset={opset!r}; "
                         f"leave opset out to get {max(readable)}")
    return opset, OPSET_IR_VERSION[opset]


_LAYOUTS = {2: "NC", 3: "NLC", 4: "NCHW"}


def _metadata_props(model, input_shape, batch, metadata):
    """netcl's provenance keys, then the user's (sorted): no timestamps or paths, so the same
    model and options always give the same bytes. netcl.architecture (the .netcl header's layer
    list) lets import_onnx restore layers that emit no node (Dropout, Identity) and exact configs."""
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise TypeError(f"metadata must be a dict of str -> str, got {type(metadata).__name__}")
    for k, v in metadata.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError(f"metadata must map str -> str, got {k!r}: {type(v).__name__}")
        if k.startswith("netcl."):
            raise ValueError(f"metadata key {k!r}: keys starting with 'netcl.' are netcl's own provenance")
    rank = len(input_shape)
    own = {"netcl.version": __version__,
           "netcl.input_layout": _LAYOUTS.get(rank, "N" + "D" * (rank - 1)),
           "netcl.input_shape": ",".join(str(d) for d in (batch,) + tuple(input_shape[1:])),
           "netcl.architecture": json.dumps(architecture(model), sort_keys=True, separators=(",", ":"))}
    return [P.StringStringEntryProto(key=k, value=v) for k, v in list(own.items()) + sorted(metadata.items())]


# -- writing -----------------------------------------------------------------------------
def _varint(n):
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number, length):
    """The tag and length prefix of a length-delimited field."""
    return _varint(number << 3 | 2) + _varint(length)


# The length-delimited fields the writer streams itself (the rest is serialized by protobuf),
# numbered as the generated bindings say, so proto/onnx.proto stays the one source of the schema.
_RAW_DATA = P.TensorProto.DESCRIPTOR.fields_by_name["raw_data"].number
_INITIALIZER = P.GraphProto.DESCRIPTOR.fields_by_name["initializer"].number
_GRAPH = P.ModelProto.DESCRIPTOR.fields_by_name["graph"].number


def _array(source):
    """A tensor's data as a contiguous little-endian numpy array (no copy when it already is one)."""
    a = source.numpy() if hasattr(source, "numpy") and not isinstance(source, np.ndarray) else source
    dtype = np.dtype("<i8") if a.dtype.kind == "i" else np.dtype("<f4")
    return np.ascontiguousarray(a, dtype=dtype)


def _tensor_header(name, dims, dtype):
    return P.TensorProto(dims=dims, data_type=dtype, name=name)


class _Plan:
    """Where every initializer goes: inline (raw_data streamed in the model) or in the side file."""

    def __init__(self, inits, external, data_name):
        self.items, self.data_size = [], 0  # items: (header bytes, nbytes, source, offset or None)
        for name, dims, dtype, source in inits:
            nbytes = int(np.prod(dims, dtype=np.int64)) * (8 if dtype == INT64 else 4)
            if external and nbytes >= EXTERNAL_MIN_BYTES:
                if nbytes >= ALIGN_MIN_BYTES:
                    self.data_size = -(-self.data_size // ALIGN) * ALIGN
                t = _tensor_header(name, dims, dtype)
                t.data_location = P.TensorProto.EXTERNAL
                for k, v in (("location", data_name), ("offset", self.data_size), ("length", nbytes)):
                    t.external_data.add(key=k, value=str(v))
                self.items.append((t.SerializeToString(), nbytes, source, self.data_size))
                self.data_size += nbytes
            else:
                head = _tensor_header(name, dims, dtype).SerializeToString() + _field(_RAW_DATA, nbytes)
                self.items.append((head, nbytes, source, None))

    def inline_size(self, head, tail):
        """Bytes of the graph field: both partial graphs and every initializer field."""
        size = len(head) + len(tail)
        for h, n, _, offset in self.items:
            t = len(h) + (n if offset is None else 0)
            size += len(_field(_INITIALIZER, t)) + t
        return size


def _write_tensor(f, source, nbytes):
    a = _array(source)
    assert a.nbytes == nbytes, f"initializer holds {a.nbytes} bytes, its header says {nbytes}"
    if a.size:
        f.write(memoryview(a).cast("B"))


def export_onnx(model, input_shape, path, *, opset=None, target=None, dynamic_batch=False, input_name="input",
                output_name="output", external_data=None, metadata=None, doc_string=""):
    """Write `model` (a netcl Sequential in eval mode) to `path` as a standard ONNX model.

    A literal, unfused translation of the declared layers, one EMITTERS entry per layer type;
    the same model and options always give the same bytes.

    Args:
        model: a netcl model in eval mode.
        input_shape: the input's shape with the batch first, e.g. `x.shape`; it must fit the first layer.
        path: the .onnx file to write (atomically: a failed export leaves any existing file untouched).
        opset: ai.onnx opset version, 11 to 25 (default 17, or the highest that `target` reads);
            the IR version follows from OPSET_IR_VERSION.
        target: a consumer and version from TARGETS, e.g. "onnxruntime-1.15", "tensorrt-8.6": the
            highest opset and IR version it reads; an explicit opset it cannot read is a ValueError.
        dynamic_batch: make the batch dimension symbolic ("batch") in the inputs, outputs and value infos.
        input_name: the graph input's name.
        output_name: the graph output's name.
        external_data: None chooses a side file (`<path>.data`) only if the model would pass
            protobuf's 2 GB limit; True forces it; False refuses (ValueError) a model past the limit.
        metadata: dict str -> str, written (keys sorted) as ModelProto.metadata_props after netcl's
            provenance keys (netcl.version, netcl.input_layout, netcl.input_shape, netcl.architecture).
        doc_string: the ModelProto's doc_string.

    Returns:
        The list of files written.

    Raises:
        ValueError: a model in training mode, or an input_shape that does not fit (naming the layer).
        NotImplementedError: unsupported layers, every one named, with the supported list.
        TypeError: metadata that is not str -> str. Nothing is written then.

    Example:
        ```python
        model.eval()
        export_onnx(model, (1, 3, 32, 32), "model.onnx", dynamic_batch=True, target="onnxruntime-1.15")
        ```
    """
    opset, ir_version = resolve_opset(opset, target)
    if not isinstance(doc_string, str):
        raise TypeError(f"doc_string must be a str, got {type(doc_string).__name__}")
    model = _traced(model, input_shape)
    graph, inits, in_shape = _build(model, input_shape, dynamic_batch, input_name, output_name, opset=opset)
    props = _metadata_props(model, in_shape, in_shape[0], metadata)
    # canonical field order: ModelProto fields 1-6 | graph (7) | opset_import (8), metadata_props (14)
    model_head = P.ModelProto(ir_version=ir_version, producer_name="netcl",
                              producer_version=__version__, doc_string=doc_string).SerializeToString()
    model_tail = P.ModelProto(opset_import=[P.OperatorSetIdProto(domain="", version=opset)],
                              metadata_props=props).SerializeToString()
    # GraphProto fields: node (1), name (2) | initializer (5) | input, output, value_info (11-13)
    graph_head = P.GraphProto(node=graph.node, name=graph.name).SerializeToString()
    graph_tail = P.GraphProto(input=graph.input, output=graph.output,
                              value_info=graph.value_info).SerializeToString()

    path = file_path(path, "export")
    data_name = os.path.basename(path) + ".data"
    plan = _Plan(inits, False, data_name)
    size = plan.inline_size(graph_head, graph_tail)
    total = len(model_head) + len(_field(_GRAPH, size)) + size + len(model_tail)
    if external_data is None:
        external_data = total > PROTOBUF_LIMIT
    elif not external_data and total > PROTOBUF_LIMIT:
        raise ValueError(f"the model would serialize to {total} bytes, past protobuf's 2 GB limit; "
                         "use external_data=True (or None)")
    if external_data:
        plan = _Plan(inits, True, data_name)
        size = plan.inline_size(graph_head, graph_tail)

    files = []
    try:
        files.append(AtomicFile(path, "export"))
        if external_data:
            files.append(AtomicFile(os.path.join(os.path.dirname(path), data_name), "export"))
        f = files[0].f
        f.write(model_head + _field(_GRAPH, size) + graph_head)
        for head, nbytes, source, offset in plan.items:
            t = len(head) + (nbytes if offset is None else 0)
            f.write(_field(_INITIALIZER, t) + head)
            if offset is None:
                _write_tensor(f, source, nbytes)
            else:
                data = files[1].f
                data.write(b"\0" * (offset - data.tell()))
                _write_tensor(data, source, nbytes)
        f.write(graph_tail + model_tail)
        assert f.tell() == len(model_head) + len(_field(_GRAPH, size)) + size + len(model_tail)
        for af in reversed(files):  # the side file first: the model never points at a missing one
            af.commit()
    except BaseException:
        for af in files:
            af.discard()
        raise
    return [af.path for af in files]
