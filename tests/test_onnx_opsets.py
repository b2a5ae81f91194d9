"""Every opset netcl writes, and above all opsets 11 and 12, the forms from before opset 13 changed
Softmax's axis and moved Squeeze's, Unsqueeze's and ReduceSum's axes into inputs: one small model
per layer type (LAYER_MODELS, which must cover every EMITTERS entry) at every opset and the
reference models at 11 and 12, each exported with a symbolic batch, passed by onnx.checker
(full_check), run in onnxruntime at two batch sizes against netcl (<= 1e-5 of the largest output,
or of 1) and read back by import_onnx as the same layers and weights."""
import numpy as np
import pytest

import netcl
from netcl import models, nn
from netcl.io import export_onnx, import_onnx
from netcl.io import onnx_export as ox
from netcl.io.netcl_format import architecture
from conftest import randomize_batchnorm
from test_blocks import MODELS as BLOCK_MODELS
from test_conv_family import EXPORT_CASES
from test_onnx_export import every_layer_model, modern_model
from test_io import graph_model, rnn_model

OLD_OPSETS = (11, 12)
BATCHES = (1, 3)

# layer type -> (a small model that uses it, one sample's shape). Every type in EMITTERS needs an
# entry: test_layer_models_cover_every_emitter names the missing ones.
LAYER_MODELS = {
    nn.Linear: (lambda: nn.Sequential(nn.Linear(7, 5)), (7,)),
    nn.Conv2d: (lambda: nn.Sequential(nn.Conv2d(4, 6, 3, stride=2, padding=2, dilation=2, groups=2),
                                     nn.Conv2d(6, 4, (1, 3), stride=(2, 1), padding=(0, 2), dilation=(1, 2)),
                                     nn.Conv2d(4, 4, (2, 4), padding="same")), (4, 9, 8)),
    nn.ConvTranspose2d: (lambda: nn.Sequential(nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1, output_padding=1),
                                               nn.ConvTranspose2d(2, 2, (2, 3), (1, 2), (0, 1), (0, 1)),
                                               nn.ConvTranspose2d(2, 4, 3, 2, 1, (1, 0), groups=2, dilation=(1, 2))),
                        (3, 4, 5)),
    nn.Conv1d: (lambda: nn.Sequential(nn.Conv1d(4, 6, 3, stride=2, padding=2, dilation=2, groups=2),
                                     nn.Conv1d(6, 3, 4, padding="same")), (4, 11)),
    nn.BatchNorm2d: (lambda: nn.Sequential(nn.BatchNorm2d(3)), (3, 5, 4)),
    nn.ReLU: (lambda: nn.Sequential(nn.ReLU()), (6,)),
    nn.LeakyReLU: (lambda: nn.Sequential(nn.LeakyReLU(0.2)), (6,)),
    nn.Sigmoid: (lambda: nn.Sequential(nn.Sigmoid()), (6,)),
    nn.Tanh: (lambda: nn.Sequential(nn.Tanh()), (6,)),
    nn.MaxPool2d: (lambda: nn.Sequential(nn.MaxPool2d(3, 2, 1), nn.MaxPool2d(2, ceil_mode=True),
                                         nn.MaxPool2d((1, 2), (1, 1), (0, 1))), (2, 7, 6)),
    nn.AvgPool2d: (lambda: nn.Sequential(nn.AvgPool2d(3, 2, 1), nn.AvgPool2d((2, 1), (1, 2), (1, 0))), (2, 7, 6)),
    nn.MaxPool1d: (lambda: nn.Sequential(nn.MaxPool1d(3, 2, 1), nn.MaxPool1d(2, ceil_mode=True)), (2, 9)),
    nn.AvgPool1d: (lambda: nn.Sequential(nn.AvgPool1d(3, 2, 1)), (2, 9)),
    nn.Flatten: (lambda: nn.Sequential(nn.Flatten()), (3, 4, 5)),
    nn.Identity: (lambda: nn.Sequential(nn.Identity(), nn.Tanh()), (5,)),
    nn.Dropout: (lambda: nn.Sequential(nn.Linear(4, 6), nn.Dropout(0.4), nn.ReLU()), (4,)),
    nn.Softmax: (lambda: nn.Sequential(nn.Conv2d(3, 4, 1), nn.Softmax(1)), (3, 5, 6)),  # a non-last axis
    nn.MultiheadAttention: (lambda: nn.Sequential(nn.MultiheadAttention(8, 2)), (5, 8)),
    nn.GELU: (lambda: nn.Sequential(nn.GELU(), nn.GELU("tanh")), (6,)),
    nn.SiLU: (lambda: nn.Sequential(nn.SiLU()), (6,)),
    nn.ReLU6: (lambda: nn.Sequential(nn.Linear(4, 6), nn.ReLU6()), (4,)),
    nn.Hardswish: (lambda: nn.Sequential(nn.Hardswish()), (6,)),
    nn.Hardsigmoid: (lambda: nn.Sequential(nn.Hardsigmoid()), (6,)),
    nn.LayerNorm: (lambda: nn.Sequential(nn.LayerNorm(6)), (4, 6)),
    nn.GroupNorm: (lambda: nn.Sequential(nn.GroupNorm(2, 4), nn.GroupNorm(4, 4, affine=False)), (4, 5, 3)),
    nn.InstanceNorm1d: (lambda: nn.Sequential(nn.InstanceNorm1d(3, affine=True), nn.InstanceNorm1d(3)), (3, 7)),
    nn.ConvTranspose1d: (lambda: nn.Sequential(nn.ConvTranspose1d(4, 6, 3, stride=2, padding=1, output_padding=1,
                                                                  groups=2, dilation=2)), (4, 7)),
    nn.InstanceNorm2d: (lambda: nn.Sequential(nn.InstanceNorm2d(3, affine=True), nn.InstanceNorm2d(3)), (3, 5, 4)),
    nn.Transpose: (lambda: nn.Sequential(nn.Transpose(1, 2)), (3, 4)),
    nn.AdaptiveAvgPool2d: (lambda: nn.Sequential(nn.AdaptiveAvgPool2d(2)), (3, 6, 4)),
    nn.AdaptiveAvgPool1d: (lambda: nn.Sequential(nn.AdaptiveAvgPool1d(1)), (3, 6)),
    nn.Residual: (lambda: nn.Sequential(nn.Residual(nn.Conv2d(3, 3, 3, padding=1), nn.ReLU())), (3, 5, 4)),
    nn.Concat: (lambda: nn.Sequential(nn.Concat(nn.Conv2d(3, 2, 1), nn.Identity())), (3, 5, 4)),
    nn.Upsample: (lambda: nn.Sequential(nn.Upsample(2, "nearest"), nn.Upsample(2, "bilinear")), (2, 3, 4)),
    nn.BatchNorm1d: (lambda: nn.Sequential(nn.BatchNorm1d(3), nn.Flatten(), nn.BatchNorm1d(12)), (3, 4)),
    nn.ELU: (lambda: nn.Sequential(nn.ELU(0.5)), (6,)),
    nn.Softplus: (lambda: nn.Sequential(nn.Softplus(), nn.Softplus(2.0, 3.0)), (6,)),
    nn.Mish: (lambda: nn.Sequential(nn.Mish()), (6,)),
    nn.PReLU: (lambda: nn.Sequential(nn.PReLU(3), nn.PReLU()), (3, 4)),
    nn.LogSoftmax: (lambda: nn.Sequential(nn.Conv2d(3, 4, 1), nn.LogSoftmax(1)), (3, 5, 6)),  # a non-last axis
    nn.Embedding: (lambda: nn.Sequential(nn.Embedding(9, 4, padding_idx=0), nn.Flatten()), (5,)),  # int64 input
    nn.GraphModule: (graph_model, (3, 8, 8)),  # a conv, then a graph: a layer call, operations, a parameter
    nn.LSTM: (rnn_model, (5, 3)),  # (a graph's layers: they return several values)
    nn.GRU: (rnn_model, (5, 3)),
}


def attention_model():
    return nn.Sequential(nn.Linear(16, 32), nn.MultiheadAttention(32, 4), nn.Tanh(),
                         nn.Sequential(nn.Linear(32, 8), nn.Softmax(dim=-1)))


REFERENCE_MODELS = {  # name -> (model, one sample's shape); detector26 is fully convolutional: 64x64 suffices
    "mlp": (models.mlp, models.MODELS["mlp"].input_shape),
    "cnn": (models.cnn, models.MODELS["cnn"].input_shape),
    "detector26": (models.detector26, (3, 64, 64)),
    "every-layer": (every_layer_model, (3, 12, 12)),
    "multihead-attention": (attention_model, (5, 16)),
    "modern-layers": (modern_model, (3, 12, 12)),
    **{f"conv-{name}": case for name, case in EXPORT_CASES.items()},
    **{f"blocks-{name}": (build, shape[1:]) for name, (build, shape) in BLOCK_MODELS.items() if "batch1" not in name},
}


def randomized(model, rng):
    """Non-zero biases and weights large enough to make attention and softmax peaked, real statistics."""
    for _, t in model.named_parameters():
        t.set_(rng.normal(0, 0.4, t.shape))
    return randomize_batchnorm(model, rng).eval()


def check_at_opset(queue, rng, model, shape, opset, path, record_error):
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from netcl.apps.common import ort_session

    model._fused = None  # netcl's own layers are the reference
    export_onnx(model, (2,) + tuple(shape), path, opset=opset, dynamic_batch=True)
    m = onnx.load(str(path))
    onnx.checker.check_model(m, full_check=True)
    assert [(o.domain, o.version) for o in m.opset_import] == [("", opset)]
    assert m.ir_version == ox.OPSET_IR_VERSION[opset]
    session, err, scale = ort_session(path, "cpu"), 0.0, 1.0
    for n in BATCHES:
        if isinstance(model[0], nn.Embedding):  # indices: the graph's input is int64
            x = rng.integers(0, model[0].num_embeddings, (n,) + tuple(shape))
            got, want = session.run(None, {"input": x})[0], model(netcl.tensor(x, queue=queue)).to_host()
        else:
            x = rng.standard_normal((n,) + tuple(shape)).astype(np.float32)
            got = session.run(None, {"input": x})[0]
            want = model(netcl.Tensor.from_host(queue, x)).to_host()
        assert got.shape == want.shape
        err = max(err, float(np.abs(got.astype(np.float64) - want).max()))
        scale = max(scale, float(np.abs(want).max()))
    record_error(err)
    assert err <= 1e-5 * scale, f"opset {opset}: onnxruntime vs netcl max abs diff {err:.2e} (outputs up to {scale:.3g})"
    back = import_onnx(path)
    assert architecture(back) == architecture(model)
    want, got = model.state_dict(), back.state_dict()
    assert got.keys() == want.keys() and all(np.array_equal(v, want[k]) for k, v in got.items())


def test_layer_models_cover_every_emitter():
    missing = sorted(t.__name__ for t in ox.EMITTERS if t not in LAYER_MODELS)
    assert not missing, (f"no small model for {missing} in tests/test_onnx_opsets.py LAYER_MODELS: add one, so "
                         f"that opsets {OLD_OPSETS} are verified for every emitter")


@pytest.mark.parametrize("opset", OLD_OPSETS)
@pytest.mark.parametrize("layer", list(LAYER_MODELS), ids=lambda t: t.__name__)
def test_layer_at_old_opset(layer, opset, queue, rng, tmp_path, record_error):
    build, shape = LAYER_MODELS[layer]
    model = randomized(build(), rng)
    assert layer in {type(m) for m in model.modules()}
    check_at_opset(queue, rng, model, shape, opset, tmp_path / "m.onnx", record_error)


@pytest.mark.parametrize("layer", list(LAYER_MODELS), ids=lambda t: t.__name__)
def test_layer_at_every_later_opset(layer, queue, rng, tmp_path, record_error):
    """The same checks at opsets 13 to the newest netcl writes (one model per layer type, each opset
    exported, checked, run and read back)."""
    build, shape = LAYER_MODELS[layer]
    model = randomized(build(), rng)
    for opset in sorted(o for o in ox.OPSET_IR_VERSION if o >= 13):
        check_at_opset(queue, rng, model, shape, opset, tmp_path / f"m{opset}.onnx", record_error)


@pytest.mark.parametrize("opset", OLD_OPSETS)
@pytest.mark.parametrize("name", list(REFERENCE_MODELS))
def test_reference_model_at_old_opset(name, opset, queue, rng, tmp_path, record_error):
    build, shape = REFERENCE_MODELS[name]
    netcl.manual_seed(1)
    model = randomize_batchnorm(build(), rng).eval()
    if name == "multihead-attention":
        model = randomized(model, rng)
    check_at_opset(queue, rng, model, shape, opset, tmp_path / "m.onnx", record_error)


# -- the opset-dependent forms --------------------------------------------------------------
def ops(path):
    with open(path, "rb") as f:
        return [n.op_type for n in ox.onnx_pb2.ModelProto.FromString(f.read()).graph.node]


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_softmax_before_13_moves_its_axis_last(dim, queue, rng, tmp_path):
    """Softmax-11 over axis 1 of (N, C, H, W) would normalise C*H*W values together: the export
    swaps the axis with the last around a last-axis Softmax; from 13 on, one Softmax(axis=dim).
    Over the batch (dim 0) too, at two batch sizes."""
    model = nn.Sequential(nn.Softmax(dim)).eval()
    x = rng.standard_normal((3, 4, 2, 5)).astype(np.float32)
    export_onnx(model, x.shape, tmp_path / "old.onnx", opset=11, dynamic_batch=True)
    export_onnx(model, x.shape, tmp_path / "new.onnx", opset=13, dynamic_batch=True)
    assert ops(tmp_path / "new.onnx") == ["Softmax"]
    assert ops(tmp_path / "old.onnx") == (["Softmax"] if dim == -1 else ["Transpose", "Softmax", "Transpose"])
    pytest.importorskip("onnxruntime")
    from netcl.apps.common import ort_session

    for n in (3, 2):
        xn = x[:n]
        want = model(netcl.Tensor.from_host(queue, xn)).to_host()
        got = ort_session(tmp_path / "old.onnx", "cpu").run(None, {"input": xn})[0]
        assert float(np.abs(got - want).max()) <= 1e-6


@pytest.mark.parametrize("opset", sorted(ox.OPSET_IR_VERSION))
def test_axes_op_at_every_opset(opset, tmp_path):
    """_axes_op, the helper for emitters that squeeze, unsqueeze or reduce: the attribute before
    the opset that made `axes` an input, the input after; the same numbers at every opset."""
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    P = ox.onnx_pb2
    g = ox._Graph("batch", 2, opset)
    g.begin("t", None)
    y = ox._axes_op(g, "Unsqueeze", "input", [1], ("batch", 1, 3, 4))
    y = ox._axes_op(g, "ReduceMean", y, [-1], ("batch", 1, 3, 1), keepdims=1)
    y = ox._axes_op(g, "ReduceSum", y, [2, 3], ("batch", 1), keepdims=0)
    y = ox._axes_op(g, "Squeeze", y, [1], ("batch", 1))
    g.rename(y, "output", 0)
    inits = [P.TensorProto(name=n, dims=d, data_type=t, raw_data=ox._array(a).tobytes()) for n, d, t, a in g.inits]
    graph = P.GraphProto(node=g.nodes, name="t", initializer=inits, input=[ox._value_info("input", ("batch", 3, 4))],
                         output=[ox._value_info("output", ("batch",))])
    m = P.ModelProto(ir_version=ox.OPSET_IR_VERSION[opset], graph=graph,
                     opset_import=[P.OperatorSetIdProto(domain="", version=opset)])
    (tmp_path / "a.onnx").write_bytes(m.SerializeToString())
    onnx.checker.check_model(onnx.load(str(tmp_path / "a.onnx")), full_check=True)
    as_input = {n.op_type: len(n.input) == 2 for n in g.nodes}
    assert as_input == {"Unsqueeze": opset >= 13, "ReduceMean": opset >= 18, "ReduceSum": opset >= 13,
                        "Squeeze": opset >= 13}
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    got = ort.InferenceSession(str(tmp_path / "a.onnx"), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    np.testing.assert_allclose(got, x.mean(axis=-1).sum(axis=1), rtol=1e-6)
