"""export_test_case: the ONNX backend-test layout, read back with onnx.numpy_helper and run in
onnxruntime."""
import numpy as np
import pytest

from netcl import models
from netcl.io import export_test_case
from conftest import randomize_batchnorm

onnx = pytest.importorskip("onnx")
from onnx import numpy_helper  # noqa: E402


@pytest.mark.parametrize("name, options", [("mlp", {}), ("cnn", {"dynamic_batch": True, "target": "onnxruntime-1.15"}),
                                           ("mlp", {"input_name": "x", "output_name": "logits", "opset": 13})])
def test_layout_read_back_and_run(name, options, rng, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    model = randomize_batchnorm(models.build(name), rng).eval()
    x = rng.standard_normal((3,) + models.MODELS[name].input_shape).astype(np.float32)
    files = export_test_case(model, x, tmp_path / "case", **options)
    data = tmp_path / "case" / "test_data_set_0"
    assert sorted(files) == sorted(str(p) for p in (tmp_path / "case" / "model.onnx", data / "input_0.pb",
                                                    data / "output_0.pb"))
    x_back = numpy_helper.to_array(onnx.load_tensor(str(data / "input_0.pb")))
    y = numpy_helper.to_array(onnx.load_tensor(str(data / "output_0.pb")))
    assert np.array_equal(x_back, x) and y.dtype == np.float32
    m = onnx.load(str(tmp_path / "case" / "model.onnx"))
    onnx.checker.check_model(m, full_check=True)
    assert onnx.load_tensor(str(data / "input_0.pb")).name == m.graph.input[0].name
    sess = ort.InferenceSession(str(tmp_path / "case" / "model.onnx"), providers=["CPUExecutionProvider"])
    got = sess.run(None, {m.graph.input[0].name: x_back})[0]
    assert np.abs(got - y).max() <= 1e-5


def test_training_mode_refused(tmp_path):
    with pytest.raises(ValueError, match="training mode"):
        export_test_case(models.build("mlp"), np.zeros((1, 64), np.float32), tmp_path / "c")


def test_an_embedding_models_case_holds_int64_indices(rng, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    from netcl import nn

    model = nn.Sequential(nn.Embedding(10, 4), nn.Flatten(), nn.Linear(12, 3)).eval()
    x = rng.integers(0, 10, (2, 3))
    export_test_case(model, x, tmp_path / "case")
    data = tmp_path / "case" / "test_data_set_0"
    x_back = numpy_helper.to_array(onnx.load_tensor(str(data / "input_0.pb")))
    assert x_back.dtype == np.int64 and np.array_equal(x_back, x)
    onnx.checker.check_model(onnx.load(str(tmp_path / "case" / "model.onnx")), full_check=True)
    sess = ort.InferenceSession(str(tmp_path / "case" / "model.onnx"), providers=["CPUExecutionProvider"])
    y = numpy_helper.to_array(onnx.load_tensor(str(data / "output_0.pb")))
    assert np.abs(sess.run(None, {"input": x_back})[0] - y).max() <= 1e-5
