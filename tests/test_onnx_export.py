"""export_onnx: the reference models and every layer type against netcl through onnxruntime (CPU),
the file's structure and bytes, the options, and the errors that must leave nothing behind."""
import os
import subprocess
import sys

import numpy as np
import pytest

import netcl
from netcl import models, nn
from netcl.io import export_onnx, import_onnx
from netcl.io import onnx_export as ox
from netcl.io.onnx_export import onnx_pb2 as P
from conftest import randomize_batchnorm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ATOL, RTOL = 1e-4, 1e-3
DIFFS = {}  # model -> max abs diff, printed at the end of the module


@pytest.fixture(scope="module", autouse=True)
def _report_diffs():
    yield
    if DIFFS:
        print("\nnetcl vs onnxruntime (CPU), max abs diff: "
              + ", ".join(f"{k} {v:.2e}" for k, v in DIFFS.items()))


def run_ort(path, x):
    from netcl.apps.common import ort_session

    return ort_session(path, "cpu").run(None, {"input": x})[0]


def run_netcl(queue, model, x):
    return model(netcl.Tensor.from_host(queue, x)).to_host()


def compare(name, got, want):
    diff = float(np.abs(got.astype(np.float64) - want).max())
    DIFFS[name] = max(diff, DIFFS.get(name, 0.0))
    print(f"{name}: max abs diff {diff:.3e}")
    assert np.allclose(got, want, atol=ATOL, rtol=RTOL), f"{name}: max abs diff {diff:.3e}"
    return diff


def load(path):
    with open(path, "rb") as f:
        return P.ModelProto.FromString(f.read())


def every_layer_model():
    """One of each layer type (but MultiheadAttention), padding everywhere it exists."""
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AvgPool2d(3, 2, 1),
        nn.Conv2d(8, 8, 3, bias=False), nn.LeakyReLU(0.2), nn.MaxPool2d(3, 2, 1), nn.Sigmoid(),
        nn.Flatten(), nn.Dropout(0.3), nn.Linear(8 * 2 * 2, 12), nn.Tanh(), nn.Identity(),
        nn.Linear(12, 5, bias=False), nn.Softmax(1))


# -- the reference models ----------------------------------------------------------------
@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_reference_model_matches_onnxruntime(name, ort, queue, rng, tmp_path):
    model = randomize_batchnorm(models.build(name), rng).eval()
    x = rng.standard_normal((4,) + models.MODELS[name].input_shape).astype(np.float32)
    export_onnx(model, x.shape, tmp_path / "m.onnx")
    compare(name, run_ort(tmp_path / "m.onnx", x), run_netcl(queue, model, x))


def test_detector26_on_photographs(ort, queue, rng, tmp_path):
    """detector26 with batch-norm statistics set from data (photo crops when scikit-learn and
    pillow are there, else noise), verified on the photographs (or noise) at 256x256."""
    from netcl.apps import recipes

    model = models.detector26()
    pytest.importorskip("sklearn")
    pytest.importorskip("PIL")
    x, calib = recipes.photos(256), recipes.photo_crops(4, seed=1)
    recipes.calibrate_batchnorm(model, queue, calib, batch_size=4)
    assert not np.allclose(model[1].running_var.to_host(), 1.0)
    export_onnx(model, x.shape, tmp_path / "d.onnx", dynamic_batch=True)
    compare("detector26", run_ort(tmp_path / "d.onnx", x), run_netcl(queue, model, x))


def test_dynamic_batch_runs_at_two_batch_sizes(ort, queue, rng, tmp_path):
    model = randomize_batchnorm(models.cnn(), rng).eval()
    export_onnx(model, (1, 3, 32, 32), tmp_path / "m.onnx", dynamic_batch=True)
    m = load(tmp_path / "m.onnx")
    for vi in list(m.graph.input) + list(m.graph.output) + list(m.graph.value_info):
        assert vi.type.tensor_type.shape.dim[0].dim_param == "batch", vi.name
    for n in (1, 5):
        x = rng.standard_normal((n, 3, 32, 32)).astype(np.float32)
        compare("cnn", run_ort(tmp_path / "m.onnx", x), run_netcl(queue, model, x))


def test_static_batch_is_fixed(tmp_path, rng):
    export_onnx(models.mlp().eval(), (3, 64), tmp_path / "m.onnx")
    dims = load(tmp_path / "m.onnx").graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_value for d in dims] == [3, 64]


# -- every layer, every opset ------------------------------------------------------------
def test_every_layer_at_every_opset(ort, queue, rng, tmp_path):
    model = randomize_batchnorm(every_layer_model(), rng).eval()
    x = rng.standard_normal((2, 3, 12, 12)).astype(np.float32)
    want = run_netcl(queue, model, x)
    for opset in sorted(ox.OPSET_IR_VERSION):
        path = tmp_path / f"m{opset}.onnx"
        export_onnx(model, x.shape, path, opset=opset, dynamic_batch=True)
        m = load(path)
        assert [(o.domain, o.version) for o in m.opset_import] == [("", opset)]
        assert m.ir_version == ox.OPSET_IR_VERSION[opset]
        compare("every-layer", run_ort(path, x), want)


def test_multihead_attention(ort, queue, rng, tmp_path):
    model = nn.Sequential(nn.Linear(16, 32), nn.MultiheadAttention(32, 4), nn.Tanh(),
                          nn.Sequential(nn.Linear(32, 8), nn.Softmax(dim=-1))).eval()
    for _, t in model.named_parameters():  # non-zero biases, weights large enough for peaked attention
        t.set_(rng.normal(0, 0.3, t.shape))
    x = rng.standard_normal((3, 5, 16)).astype(np.float32)
    export_onnx(model, x.shape, tmp_path / "a.onnx", dynamic_batch=True)
    names = {t.name for t in load(tmp_path / "a.onnx").graph.initializer}
    assert {"1.in_proj_weight", "1.in_proj_bias", "1.out_proj.weight", "3.0.weight"} <= names
    want = run_netcl(queue, model, x)
    compare("multihead-attention", run_ort(tmp_path / "a.onnx", x), want)
    compare("multihead-attention", run_ort(tmp_path / "a.onnx", x[:1]), want[:1])


# -- structure ---------------------------------------------------------------------------
def test_graph_structure(tmp_path):
    model = every_layer_model().eval()
    export_onnx(model, (2, 3, 12, 12), tmp_path / "m.onnx", input_name="pixels", output_name="probs")
    m = load(tmp_path / "m.onnx")
    assert (m.producer_name, m.producer_version) == ("netcl", netcl.__version__)
    g = m.graph
    assert [i.name for i in g.input] == ["pixels"] and [o.name for o in g.output] == ["probs"]
    assert [n.op_type for n in g.node] == ["Conv", "BatchNormalization", "Relu", "AveragePool", "Conv", "LeakyRelu",
                                           "MaxPool", "Sigmoid", "Flatten", "Gemm", "Tanh", "Gemm", "Softmax"]
    attrs = {n.name: {a.name: a for a in n.attribute} for n in g.node}
    assert attrs["3.AveragePool"]["count_include_pad"].i == 1
    assert list(attrs["3.AveragePool"]["pads"].ints) == [1, 1, 1, 1]
    assert attrs["10.Gemm"]["transB"].i == 0 and "13.Gemm" in attrs  # Dropout (9), Identity (12): no node
    assert attrs["5.LeakyRelu"]["alpha"].f == pytest.approx(0.2)
    assert attrs["1.BatchNormalization"]["epsilon"].f == pytest.approx(1e-5)
    for n in g.node:
        assert n.doc_string.startswith("netcl layer ") and type(model[int(n.name.split(".")[0])]).__name__ in n.doc_string
        assert [a.name for a in n.attribute] == sorted(a.name for a in n.attribute)
    assert g.node[-1].output == ["probs"] and g.node[0].input[0] == "pixels"
    # value_info: every intermediate with its shape
    vi = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in g.value_info}
    assert vi["0.Conv2d"] == [2, 8, 12, 12] and vi["8.Flatten"] == [2, 32] and len(vi) == len(g.node) - 1
    # initializers: raw little-endian bytes named as in the state_dict, weights as stored (no transpose)
    state = model.state_dict()
    inits = {t.name: t for t in g.initializer}
    assert set(inits) == set(state)
    for k, t in inits.items():
        assert t.data_type == P.TensorProto.FLOAT and list(t.dims) == list(state[k].shape)
        np.testing.assert_array_equal(np.frombuffer(t.raw_data, "<f4").reshape(t.dims), state[k])


def test_dropout_only_model_is_identity(ort, tmp_path, rng):
    export_onnx(nn.Sequential(nn.Dropout(0.5)).eval(), (2, 4), tmp_path / "d.onnx")
    x = rng.standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_array_equal(run_ort(tmp_path / "d.onnx", x), x)


def test_canonical_and_deterministic(tmp_path):
    """The streamed bytes are exactly protobuf's own serialization, and the same model gives the same file."""
    netcl.manual_seed(3)
    a = models.cnn().eval()
    netcl.manual_seed(3)
    b = models.cnn().eval()
    export_onnx(a, (1, 3, 32, 32), tmp_path / "a.onnx", dynamic_batch=True)
    export_onnx(b, (1, 3, 32, 32), tmp_path / "b.onnx", dynamic_batch=True)
    export_onnx(a, (1, 3, 32, 32), tmp_path / "c.onnx", dynamic_batch=True)
    data = (tmp_path / "a.onnx").read_bytes()
    assert data == (tmp_path / "b.onnx").read_bytes() == (tmp_path / "c.onnx").read_bytes()
    assert P.ModelProto.FromString(data).SerializeToString() == data


def test_onnx_checker_full_check(tmp_path, rng):
    onnx = pytest.importorskip("onnx")
    cases = [(models.mlp(), (2, 64)), (models.cnn(), (2, 3, 32, 32)), (every_layer_model(), (2, 3, 12, 12)),
             (nn.Sequential(nn.MultiheadAttention(8, 2), nn.Linear(8, 3)), (2, 4, 8))]
    for i, (model, shape) in enumerate(cases):
        for dyn in (False, True):
            path = tmp_path / f"m{i}{dyn}.onnx"
            export_onnx(model.eval(), shape, path, dynamic_batch=dyn)
            m = onnx.load(str(path))
            onnx.checker.check_model(m, full_check=True)
            assert m.SerializeToString() == path.read_bytes()  # onnx reads every field netcl wrote


def test_imports_with_onnx_in_either_order():
    pytest.importorskip("onnx")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    both = ("import onnx; onnx.ModelProto(ir_version=8)",
            "from netcl.io.onnx_export import onnx_pb2; onnx_pb2.ModelProto(ir_version=8)")
    for order in (both, both[::-1]):
        subprocess.run([sys.executable, "-c", "; ".join(order) + "; print('ok')"], check=True, env=env,
                       capture_output=True, timeout=120)


# -- external data -----------------------------------------------------------------------
def test_external_data_forced(ort, queue, rng, tmp_path):
    model = randomize_batchnorm(models.cnn(), rng).eval()
    x = rng.standard_normal((2, 3, 32, 32)).astype(np.float32)
    files = export_onnx(model, x.shape, tmp_path / "m.onnx", external_data=True)
    assert files == [str(tmp_path / "m.onnx"), str(tmp_path / "m.onnx.data")]
    m = load(tmp_path / "m.onnx")
    ext = [t for t in m.graph.initializer if t.data_location == P.TensorProto.EXTERNAL]
    assert ext and all(not t.raw_data for t in ext)
    assert all(len(t.raw_data) < ox.EXTERNAL_MIN_BYTES for t in m.graph.initializer if t not in ext)
    data = (tmp_path / "m.onnx.data").read_bytes()
    w = {t.name: t for t in ext}["0.weight"]
    e = {kv.key: kv.value for kv in w.external_data}
    assert e["location"] == "m.onnx.data"
    chunk = data[int(e["offset"]):int(e["offset"]) + int(e["length"])]
    np.testing.assert_array_equal(np.frombuffer(chunk, "<f4").reshape(w.dims), model[0].weight.to_host())
    compare("cnn (external data)", run_ort(tmp_path / "m.onnx", x), run_netcl(queue, model, x))


def test_external_data_chosen_past_the_limit(tmp_path, monkeypatch):
    model = models.mlp().eval()
    export_onnx(model, (1, 64), tmp_path / "small.onnx")
    size = os.path.getsize(tmp_path / "small.onnx")
    monkeypatch.setattr(ox, "PROTOBUF_LIMIT", size - 1)  # as if the model were past 2 GB
    assert len(export_onnx(model, (1, 64), tmp_path / "m.onnx")) == 2
    with pytest.raises(ValueError, match="2 GB"):
        export_onnx(model, (1, 64), tmp_path / "no.onnx", external_data=False)
    assert not (tmp_path / "no.onnx").exists()
    monkeypatch.setattr(ox, "PROTOBUF_LIMIT", size)
    assert len(export_onnx(model, (1, 64), tmp_path / "fits.onnx")) == 1


# -- errors: refused before anything is written ------------------------------------------
class MyLayer(nn.Module):
    def output_shape(self, shape):
        return shape


def no_files_but(folder, *names):
    assert sorted(os.listdir(folder)) == sorted(names)


def test_unsupported_layers_named(tmp_path):
    model = nn.Sequential(nn.Linear(4, 4), MyLayer(), nn.ReLU(), nn.Sequential(MyLayer())).eval()
    with pytest.raises(NotImplementedError) as e:
        export_onnx(model, (1, 4), tmp_path / "m.onnx")
    msg = str(e.value)
    assert "layer 1 (MyLayer)" in msg and "layer 3.0 (MyLayer)" in msg
    for t in ox.EMITTERS:
        assert t.__name__ in msg
    no_files_but(tmp_path)


def test_training_mode_refused(tmp_path):
    model = models.mlp()  # a new model is in training mode
    with pytest.raises(ValueError, match="training mode"):
        export_onnx(model, (1, 64), tmp_path / "m.onnx")
    model.eval()
    model[0].train()
    with pytest.raises(ValueError, match="training mode"):
        export_onnx(model, (1, 64), tmp_path / "m.onnx")
    no_files_but(tmp_path)


@pytest.mark.parametrize("shape", [(1, 63), (64,), (1, 3, 32, 32), (0, 64), (1.5, 64), "1,64", None])
def test_bad_input_shape(tmp_path, shape):
    with pytest.raises(ValueError):
        export_onnx(models.mlp().eval(), shape, tmp_path / "m.onnx")
    no_files_but(tmp_path)


def test_bad_options(tmp_path):
    model = models.mlp().eval()
    for kw in ({"opset": 10}, {"opset": 99}, {"input_name": ""}, {"input_name": "x", "output_name": "x"},
               {"input_name": "0.weight"}):
        with pytest.raises(ValueError):
            export_onnx(model, (1, 64), tmp_path / "m.onnx", **kw)
    no_files_but(tmp_path)


def test_failed_export_keeps_existing_file(tmp_path, monkeypatch):
    model = models.cnn().eval()
    target = tmp_path / "m.onnx"
    target.write_bytes(b"precious")
    calls = []

    def failing(f, source, nbytes):
        calls.append(nbytes)
        if len(calls) == 3:  # part of the file is written by now
            raise OSError("disk full")
        f.write(b"\0" * nbytes)

    monkeypatch.setattr(ox, "_write_tensor", failing)
    for external in (False, True):
        calls.clear()
        with pytest.raises(OSError, match="disk full"):
            export_onnx(model, (1, 3, 32, 32), target, external_data=external)
        assert target.read_bytes() == b"precious"
        no_files_but(tmp_path, "m.onnx")


# -- the activations, norms and shape layers of modern architectures ---------------------
def modern_model():
    # x: (N, 3, 12, 12) -> (N, 5); Linear on rank-4 and rank-3 input
    return nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1), nn.GELU(), nn.Conv2d(6, 6, 3), nn.Hardswish(), nn.AdaptiveAvgPool2d(5),
        nn.Linear(5, 4), nn.SiLU(), nn.Flatten(2, 3), nn.Transpose(1, 2), nn.LayerNorm(6, eps=1e-3),
        nn.GELU("tanh"), nn.Linear(6, 7), nn.ReLU6(), nn.Hardsigmoid(), nn.Transpose(-1, -2),
        nn.AdaptiveAvgPool1d(4), nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(7, 5))


OP_FORMS = {  # opset -> (ops that must appear, ops that must not)
    13: ({"Erf", "Tanh", "ReduceMean", "HardSigmoid", "Clip", "Sigmoid", "Transpose", "Reshape", "MatMul",
          "AveragePool", "GlobalAveragePool"}, {"Gelu", "LayerNormalization", "HardSwish"}),
    17: ({"Erf", "LayerNormalization", "HardSwish"}, {"Gelu", "ReduceMean"}),
    20: ({"Gelu", "LayerNormalization", "HardSwish"}, {"Erf", "Tanh", "ReduceMean"}),
    25: ({"Gelu", "LayerNormalization", "HardSwish"}, {"Erf", "Tanh", "ReduceMean"}),
}


@pytest.mark.parametrize("opset", sorted(OP_FORMS))
def test_modern_layers_match_onnxruntime(ort, queue, rng, tmp_path, opset):
    onnx = pytest.importorskip("onnx")
    model = modern_model().eval()
    for _, t in model.named_parameters():  # LayerNorm's weight and bias away from 1 and 0 too
        t.set_(rng.normal(0, 0.5, t.shape))
    path = tmp_path / "m.onnx"
    export_onnx(model, (2, 3, 12, 12), path, opset=opset, dynamic_batch=True)
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)
    ops = {n.op_type for n in load(path).graph.node}
    must, must_not = OP_FORMS[opset]
    assert must <= ops and not ops & must_not, sorted(ops)
    for n in (2, 5):
        x = rng.normal(0, 2, (n, 3, 12, 12)).astype(np.float32)
        assert compare(f"modern-layers-opset{opset}", run_ort(path, x), run_netcl(queue, model, x)) <= 1e-5
    back = import_onnx(path)  # netcl's own file: the recorded layers rebuild the same graph at this opset
    assert repr(back) == repr(model) and all(np.array_equal(a, b) for a, b in
                                             zip(back.state_dict().values(), model.state_dict().values()))


def test_gelu_tanh_attribute_at_opset_20(tmp_path):
    export_onnx(nn.Sequential(nn.GELU("tanh"), nn.GELU()).eval(), (1, 4), tmp_path / "g.onnx", opset=20)
    nodes = load(tmp_path / "g.onnx").graph.node
    assert [[(a.name, a.s) for a in n.attribute] for n in nodes] == [[("approximate", b"tanh")], []]


def test_adaptive_pool_forms(tmp_path):
    def ops(layer, shape):
        export_onnx(nn.Sequential(layer).eval(), shape, tmp_path / "p.onnx")
        return [(n.op_type, {a.name: list(a.ints) for a in n.attribute}) for n in load(tmp_path / "p.onnx").graph.node]

    assert ops(nn.AdaptiveAvgPool2d(1), (1, 2, 7, 5)) == [("GlobalAveragePool", {})]
    assert ops(nn.AdaptiveAvgPool2d(3), (1, 2, 9, 6)) == [("AveragePool", {"kernel_shape": [3, 2], "strides": [3, 2]})]
    assert ops(nn.AdaptiveAvgPool1d(2), (1, 2, 8)) == [("AveragePool", {"kernel_shape": [4], "strides": [4]})]
    with pytest.raises(NotImplementedError, match=r"layer 0 \(AdaptiveAvgPool2d\(output_size=3\)\) on input "
                                                  r"\(1, 2, 7, 6\).*multiple of output_size 3"):
        ops(nn.AdaptiveAvgPool2d(3), (1, 2, 7, 6))


def test_layers_that_move_the_batch_are_refused(tmp_path):
    for layer in (nn.Transpose(0, 1), nn.Transpose(-3, 2), nn.Flatten(0, 1)):
        with pytest.raises(NotImplementedError, match="moves the batch dimension"):
            export_onnx(nn.Sequential(layer).eval(), (2, 3, 4), tmp_path / "t.onnx")
    assert not (tmp_path / "t.onnx").exists()


def test_default_flatten_and_linear_on_rank_3(ort, queue, rng, tmp_path):
    """Flatten() stays Flatten(axis=1); Flatten(1, 2) keeps the batch symbolic (Reshape [0, -1, ...])."""
    model = nn.Sequential(nn.Linear(4, 6), nn.Flatten(1, 2), nn.Linear(18, 3), nn.Flatten()).eval()
    export_onnx(model, (2, 3, 4), tmp_path / "f.onnx", dynamic_batch=True)
    m = load(tmp_path / "f.onnx")
    assert [n.op_type for n in m.graph.node] == ["MatMul", "Add", "Reshape", "Gemm", "Flatten"]
    shape = next(t for t in m.graph.initializer if t.name.startswith("1.shape"))
    assert np.frombuffer(shape.raw_data, "<i8").tolist() == [0, -1]
    for n in (1, 4):
        x = rng.normal(size=(n, 3, 4)).astype(np.float32)
        assert compare("flatten-linear", run_ort(tmp_path / "f.onnx", x), run_netcl(queue, model, x)) <= 1e-5
