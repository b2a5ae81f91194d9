"""import_onnx: netcl's own files come back as the same layers, weights and outputs; foreign graphs
(built with onnx.helper, or written by torch.onnx.export) become the equivalent layers; corrupt or
hostile files fail cleanly; the imported model trains."""
import os
import warnings

import numpy as np
import pytest

import netcl
from netcl import Tensor, models, nn
from netcl.errors import FormatError
from netcl.io import export_onnx, import_onnx
from netcl.io.onnx_export import onnx_pb2 as P
from conftest import randomize_batchnorm
from test_onnx_export import every_layer_model

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

CASES = {  # name -> (model builder, input shape)
    "mlp": (lambda: models.build("mlp"), (3, 64)),
    "cnn": (lambda: models.build("cnn"), (2, 3, 32, 32)),
    "detector26": (lambda: models.build("detector26"), (1, 3, 256, 256)),
    "every_layer": (every_layer_model, (2, 3, 12, 12)),
    "mha": (lambda: nn.Sequential(nn.Linear(8, 16), nn.MultiheadAttention(16, 4), nn.Softmax(dim=-1),
                                  nn.Dropout(0.1)), (2, 5, 8)),
    "nested": (lambda: nn.Sequential(nn.Sequential(nn.Linear(6, 5), nn.Identity()), nn.ReLU(),
                                     nn.Sequential(nn.Sequential(nn.Linear(5, 4, bias=False)), nn.Dropout(0.2))), (2, 6)),
}


def run(queue, model, x):
    return model(Tensor.from_host(queue, x)).to_host()


def types(model):
    return [type(m).__name__ for _, m in model.chain()]


def strip_metadata(src, dst):
    m = P.ModelProto.FromString(open(src, "rb").read())
    del m.metadata_props[:]
    with open(dst, "wb") as f:
        f.write(m.SerializeToString())


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("dynamic", [False, True], ids=["fixed", "dynamic"])
def test_netcl_files_round_trip(name, dynamic, queue, rng, tmp_path):
    build, shape = CASES[name]
    model = randomize_batchnorm(build(), rng).eval()
    export_onnx(model, shape, tmp_path / "m.onnx", dynamic_batch=dynamic)
    back = import_onnx(tmp_path / "m.onnx")
    assert repr(back) == repr(model) and not back.training  # the same layers and configs, nesting included
    got, want = back.state_dict(), model.state_dict()
    assert list(got) == list(want) and all(np.array_equal(got[k], want[k]) for k in want)
    x = rng.standard_normal(shape).astype(np.float32)
    assert np.array_equal(run(queue, back, x), run(queue, model, x))


@pytest.mark.parametrize("name", ["mlp", "cnn", "every_layer", "mha"])
def test_without_netcl_metadata_the_graph_alone_gives_the_same_outputs(name, queue, rng, tmp_path):
    """A netcl file whose metadata was lost (or a graph rewritten by a tool) is read from its nodes."""
    build, shape = CASES[name]
    model = randomize_batchnorm(build(), rng).eval()
    export_onnx(model, shape, tmp_path / "m.onnx", dynamic_batch=True)
    strip_metadata(tmp_path / "m.onnx", tmp_path / "bare.onnx")
    back = import_onnx(tmp_path / "bare.onnx")
    assert types(back) == [t for t in types(model) if t not in ("Dropout", "Identity")]  # they emit no node
    x = rng.standard_normal(shape).astype(np.float32)
    assert np.array_equal(run(queue, back, x), run(queue, model, x))


def test_a_graph_edited_after_export_is_read_from_its_nodes(queue, rng, tmp_path):
    """Metadata that no longer describes the graph is not trusted."""
    model = models.build("mlp").eval()
    export_onnx(model, (2, 64), tmp_path / "m.onnx")
    m = P.ModelProto.FromString((tmp_path / "m.onnx").read_bytes())
    relu = next(n for n in m.graph.node if n.op_type == "Relu")
    relu.op_type = "Sigmoid"
    (tmp_path / "e.onnx").write_bytes(m.SerializeToString())
    assert types(import_onnx(tmp_path / "e.onnx"))[1] == "Sigmoid"


def test_imported_model_trains(queue, rng, tmp_path):
    model = randomize_batchnorm(models.build("cnn"), rng).eval()
    export_onnx(model, (2, 3, 32, 32), tmp_path / "m.onnx")
    back = import_onnx(tmp_path / "m.onnx").train()
    loss_fn, opt = nn.CrossEntropyLoss(), netcl.optim.SGD(back.parameters(), lr=0.005)
    x, labels = rng.standard_normal((4, 3, 32, 32)).astype(np.float32), rng.integers(0, 10, 4)
    losses = []
    for _ in range(3):
        losses.append(loss_fn(back(Tensor.from_host(queue, x)), labels))
        back.backward(loss_fn.backward())
        assert all(p.grad is not None for p in back.parameters())
        opt.step()
        opt.zero_grad()
    assert losses[-1] < losses[0]


# -- foreign graphs ---------------------------------------------------------------------------
def save(nodes, inits, in_shape, out_shape, path, opset=17, ir=8, name="input", out="output"):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(name, TensorProto.FLOAT, in_shape)],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, out_shape)],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir, producer_name="x")
    onnx.save(m, str(path))
    return path


def check_against_ort(queue, path, x, atol=1e-5):
    ort = pytest.importorskip("onnxruntime")
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    model = import_onnx(path)
    got = run(queue, model, x)
    err = float(np.abs(got - want).max())
    assert err <= atol, f"max abs diff {err:.3g}"
    return model


def f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def test_gemm_with_transposed_weight(queue, rng, tmp_path):
    nodes = [helper.make_node("Gemm", ["input", "w1", "b1"], ["h"], transB=1, name="fc1"),
             helper.make_node("Relu", ["h"], ["r"], name="act"),
             helper.make_node("Gemm", ["r", "w2", "b2"], ["output"], name="fc2")]  # transB=0: (in, out)
    inits = {"w1": f32(rng, 7, 5), "b1": f32(rng, 7), "w2": f32(rng, 7, 3), "b2": f32(rng, 1, 3)}
    model = check_against_ort(queue, save(nodes, inits, ["N", 5], ["N", 3], tmp_path / "m.onnx"), f32(rng, 4, 5))
    assert types(model) == ["Linear", "ReLU", "Linear"]
    np.testing.assert_array_equal(model[0].weight.to_host(), inits["w1"].T)


def test_matmul_add_on_sequences(queue, rng, tmp_path):
    nodes = [helper.make_node("MatMul", ["input", "w"], ["h"], name="mm"),
             helper.make_node("Add", ["h", "b"], ["a"], name="bias"),
             helper.make_node("Tanh", ["a"], ["t"], name="tanh"),
             helper.make_node("MatMul", ["t", "w2"], ["output"], name="mm2")]
    inits = {"w": f32(rng, 6, 4), "b": f32(rng, 4), "w2": f32(rng, 4, 2)}
    model = check_against_ort(queue, save(nodes, inits, [2, 3, 6], [2, 3, 2], tmp_path / "m.onnx"), f32(rng, 2, 3, 6))
    assert types(model) == ["Linear", "Tanh", "Linear"] and model[2].bias is None


def test_cnn_with_folded_reshape_and_global_pool(queue, rng, tmp_path):
    """Conv/BN/pool/GAP, then a Reshape whose shape is computed from constants (as exporters do)."""
    c = 6
    nodes = [
        helper.make_node("Conv", ["input", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2], name="conv"),
        helper.make_node("BatchNormalization", ["c", "g", "beta", "mean", "var"], ["bn"], epsilon=1e-3, name="bn"),
        helper.make_node("LeakyRelu", ["bn"], ["r"], alpha=0.2, name="lrelu"),
        helper.make_node("AveragePool", ["r"], ["p"], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1],
                         count_include_pad=1, name="avg"),
        helper.make_node("MaxPool", ["p"], ["m"], kernel_shape=[2, 2], strides=[2, 2], name="max"),
        helper.make_node("GlobalAveragePool", ["m"], ["gap"], name="gap"),
        helper.make_node("Shape", ["like"], ["s"], name="shape"),          # (7, c) -> [7, c]
        helper.make_node("Gather", ["s", "one"], ["cdim"], axis=0, name="gather"),
        helper.make_node("Unsqueeze", ["cdim", "zero_axis"], ["cdim1"], name="unsq"),
        helper.make_node("Concat", ["minus1", "cdim1"], ["shape2"], axis=0, name="cat"),
        helper.make_node("Reshape", ["gap", "shape2"], ["flat"], name="reshape"),
        helper.make_node("Gemm", ["flat", "fw", "fb"], ["output"], transB=1, name="fc"),
    ]
    inits = {"w": f32(rng, c, 3, 3, 3), "b": f32(rng, c), "g": rng.uniform(.5, 1.5, c).astype(np.float32),
             "beta": f32(rng, c), "mean": f32(rng, c), "var": rng.uniform(.5, 2, c).astype(np.float32),
             "like": np.zeros((7, c), np.float32), "one": np.array(1, np.int64), "zero_axis": np.array([0], np.int64),
             "minus1": np.array([-1], np.int64), "fw": f32(rng, 4, c), "fb": f32(rng, 4)}
    path = save(nodes, inits, ["N", 3, 16, 16], ["N", 4], tmp_path / "m.onnx")
    model = check_against_ort(queue, path, f32(rng, 3, 3, 16, 16))
    assert types(model)[:5] == ["Conv2d", "BatchNorm2d", "LeakyReLU", "AvgPool2d", "MaxPool2d"]
    assert types(model)[-2:] == ["Flatten", "Linear"]
    check_against_ort(queue, path, f32(rng, 1, 3, 16, 16))  # the batch stays symbolic


def test_squeeze_and_flatten_after_global_pool(queue, rng, tmp_path):
    nodes = [helper.make_node("GlobalAveragePool", ["input"], ["g"], name="gap"),
             helper.make_node("Squeeze", ["g", "axes"], ["s"], name="sq"),
             helper.make_node("Softmax", ["s"], ["output"], axis=1, name="sm")]
    path = save(nodes, {"axes": np.array([2, 3], np.int64)}, [2, 5, 4, 4], [2, 5], tmp_path / "m.onnx")
    assert types(check_against_ort(queue, path, f32(rng, 2, 5, 4, 4)))[-2:] == ["Flatten", "Softmax"]


def test_torch_onnx_export_files(queue, rng, tmp_path):
    torch = pytest.importorskip("torch")
    tnn = torch.nn
    tm = tnn.Sequential(tnn.Conv2d(3, 8, 3, padding=1), tnn.BatchNorm2d(8), tnn.ReLU(), tnn.MaxPool2d(2),
                        tnn.Conv2d(8, 8, 3), tnn.ReLU(), tnn.AdaptiveAvgPool2d(1), tnn.Flatten(), tnn.Linear(8, 10),
                        tnn.Dropout(0.3), tnn.Linear(10, 4)).eval()
    with torch.no_grad():
        tm[1].running_mean.uniform_(-1, 1)
        tm[1].running_var.uniform_(.5, 2)
    x = f32(rng, 2, 3, 12, 12)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            torch.onnx.export(tm, (torch.from_numpy(x),), str(tmp_path / "t.onnx"), dynamo=False, opset_version=17,
                              input_names=["input"], output_names=["output"], dynamic_axes={"input": {0: "n"}})
        except Exception as e:  # an exporter that needs a network or extra packages here
            pytest.skip(f"torch.onnx.export does not work here: {e}")
    model = import_onnx(tmp_path / "t.onnx")
    with torch.no_grad():
        want = tm(torch.from_numpy(x)).numpy()
    assert np.abs(run(queue, model, x) - want).max() <= 1e-5


def test_softmax_before_opset_13(queue, rng, tmp_path):
    nodes = [helper.make_node("Softmax", ["input"], ["output"], axis=1, name="sm")]
    check_against_ort(queue, save(nodes, {}, [3, 4], [3, 4], tmp_path / "a.onnx", opset=11, ir=6), f32(rng, 3, 4))
    save(nodes, {}, [3, 4, 5], [3, 4, 5], tmp_path / "b.onnx", opset=11, ir=6)
    with pytest.raises(NotImplementedError, match="several dimensions"):
        import_onnx(tmp_path / "b.onnx")


# -- blocks (nn.Residual, nn.Concat and nn.Upsample come from the architectures branch) ----------
def residual_graph(rng, path):
    nodes = [helper.make_node("Conv", ["input", "w1"], ["a"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w2"], ["b"], pads=[1, 1, 1, 1], name="conv2"),
             helper.make_node("Add", ["b", "input"], ["s"], name="add"),
             helper.make_node("Conv", ["s", "w3"], ["c1"], name="left"),
             helper.make_node("Relu", ["s"], ["c2"], name="right"),
             helper.make_node("Concat", ["c1", "c2"], ["output"], axis=1, name="cat")]
    # weights scaled as initialised (1/sqrt(fan-in)): outputs of order 1, where atol 1e-5 is float32 rounding
    inits = {"w1": f32(rng, 4, 4, 3, 3) / 6, "w2": f32(rng, 4, 4, 3, 3) / 6, "w3": f32(rng, 2, 4, 1, 1) / 2}
    return save(nodes, inits, ["N", 4, 6, 6], ["N", 6, 6, 6], path)


def test_residual_add_and_concat_become_blocks(queue, rng, tmp_path):
    model = check_against_ort(queue, residual_graph(rng, tmp_path / "m.onnx"), f32(rng, 2, 4, 6, 6))
    assert [type(m).__name__ for m in model] == ["Residual", "Concat"]


@pytest.mark.parametrize("mode, attrs", [("nearest", {"coordinate_transformation_mode": "asymmetric",
                                                      "nearest_mode": "floor"}),
                                         ("linear", {"coordinate_transformation_mode": "half_pixel"})])
def test_resize_becomes_upsample(mode, attrs, queue, rng, tmp_path):
    nodes = [helper.make_node("Resize", ["input", "", "scales"], ["output"], mode=mode, name="up", **attrs)]
    path = save(nodes, {"scales": np.array([1, 1, 2, 2], np.float32)}, ["N", 3, 4, 5], ["N", 3, 8, 10],
                tmp_path / "m.onnx")
    check_against_ort(queue, path, f32(rng, 2, 3, 4, 5))


# -- what is refused ---------------------------------------------------------------------------
def test_unsupported_ops_are_all_named(rng, tmp_path):
    nodes = [helper.make_node("Erf", ["input"], ["a"], name="erf_1"),
             helper.make_node("Relu", ["a"], ["b"], name="ok"),
             helper.make_node("MyOp", ["b"], ["c"], domain="com.example", name="custom"),
             helper.make_node("Selu", ["c"], ["output"], name="selu_9")]
    path = save(nodes, {}, [2, 3], [2, 3], tmp_path / "m.onnx", opset=20, ir=9)
    with pytest.raises(NotImplementedError) as e:
        import_onnx(path)
    for part in ("Erf (node 'erf_1')", "MyOp (node 'custom')", "Selu (node 'selu_9')", "supported ops: "):
        assert part in str(e.value)
    assert "Relu (node" not in str(e.value)


@pytest.mark.parametrize("data", [b"", b"garbage\x00\xff" * 10, b'{"not": "onnx"}', b"\x89NETCL\r\n" + bytes(100)])
def test_not_onnx(tmp_path, data):
    (tmp_path / "x.onnx").write_bytes(data)
    with pytest.raises(FormatError, match="not an ONNX model"):
        import_onnx(tmp_path / "x.onnx")


def test_truncated_file(tmp_path):
    export_onnx(models.build("mlp").eval(), (1, 64), tmp_path / "m.onnx")
    data = (tmp_path / "m.onnx").read_bytes()
    (tmp_path / "t.onnx").write_bytes(data[: len(data) // 2])
    with pytest.raises(FormatError):
        import_onnx(tmp_path / "t.onnx")


def one_weight(tmp_path, tensor):
    nodes = [helper.make_node("MatMul", ["input", "w"], ["output"], name="mm")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 4])], [tensor])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    (tmp_path / "m.onnx").write_bytes(m.SerializeToString())
    return tmp_path / "m.onnx"


@pytest.mark.parametrize("dims, raw", [([4, 4], bytes(60)), ([1 << 40, 1 << 20], bytes(64)), ([-4, -4], bytes(64)),
                                       ([4] * 9, bytes(64))])
def test_sizes_checked_before_allocating(tmp_path, dims, raw):
    t = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=dims, raw_data=raw)
    with pytest.raises(FormatError, match="tensor 'w'"):
        import_onnx(one_weight(tmp_path, t))


def external(tmp_path, location, offset=0, length=64):
    t = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4, 4], data_location=TensorProto.EXTERNAL)
    for k, v in (("location", location), ("offset", str(offset)), ("length", str(length))):
        t.external_data.add(key=k, value=v)
    return one_weight(tmp_path, t)


def test_external_data_from_the_models_folder(queue, rng, tmp_path):
    w = f32(rng, 4, 4)
    (tmp_path / "w.bin").write_bytes(bytes(8) + w.tobytes())
    model = import_onnx(external(tmp_path, "w.bin", offset=8))
    np.testing.assert_array_equal(model[0].weight.to_host(), w)


@pytest.mark.parametrize("location", ["../secret.bin", "/etc/passwd", "sub/../../secret.bin", "", "C:/x.bin"])
def test_external_data_outside_the_folder_is_refused(tmp_path, location):
    (tmp_path / "secret.bin").write_bytes(bytes(64))
    d = tmp_path / "model"
    d.mkdir()
    with pytest.raises(FormatError, match="external data location"):
        import_onnx(external(d, location))


def test_external_data_that_does_not_fit(tmp_path):
    (tmp_path / "w.bin").write_bytes(bytes(64))
    with pytest.raises(FormatError, match="do not fit"):
        import_onnx(external(tmp_path, "w.bin", offset=8))
    with pytest.raises(FormatError, match="do not fit"):
        import_onnx(external(tmp_path, "missing.bin"))


def test_external_data_written_by_netcl(queue, rng, tmp_path):
    model = models.build("mlp").eval()
    export_onnx(model, (2, 64), tmp_path / "m.onnx", external_data=True)
    x = f32(rng, 2, 64)
    assert np.array_equal(run(queue, import_onnx(tmp_path / "m.onnx"), x), run(queue, model, x))


def test_two_inputs_refused(tmp_path):
    nodes = [helper.make_node("Add", ["input", "other"], ["output"], name="add")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 4])
                                           for n in ("input", "other")],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 4])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "m.onnx"))
    with pytest.raises(NotImplementedError, match="one input and one output"):
        import_onnx(tmp_path / "m.onnx")


def test_imports_without_the_onnx_package():
    import ast

    src = open(os.path.join(os.path.dirname(netcl.__file__), "io", "onnx_import.py")).read()
    names = {a.name for n in ast.walk(ast.parse(src)) if isinstance(n, (ast.Import, ast.ImportFrom))
             for a in n.names} | {n.module for n in ast.walk(ast.parse(src)) if isinstance(n, ast.ImportFrom)}
    assert not any(str(n).split(".")[0] == "onnx" for n in names)
