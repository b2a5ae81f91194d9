"""export_onnx's target=, metadata= and doc_string=: the opset and IR version each consumer reads,
provenance without timestamps, errors that leave no file; and a real older consumer
(onnxruntime==1.15.1 in a cached venv) running target="onnxruntime-1.15" exports."""
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

import netcl
from netcl import models
from netcl.io import export_onnx
from netcl.io import onnx_export as ox
from netcl.io.onnx_export import onnx_pb2 as P
from netcl.version import __version__
from conftest import randomize_batchnorm


def read(path):
    return P.ModelProto.FromString(Path(path).read_bytes())


def mlp():
    netcl.manual_seed(3)
    return models.build("mlp").eval()


@pytest.mark.parametrize("target", sorted(ox.TARGETS))
def test_every_target_gets_the_highest_opset_it_reads(target, tmp_path):
    export_onnx(mlp(), (2, 64), tmp_path / "m.onnx", target=target)
    m = read(tmp_path / "m.onnx")
    max_opset, max_ir = ox.TARGETS[target]
    opset = m.opset_import[0].version
    assert opset <= max_opset and m.ir_version <= max_ir and m.ir_version == ox.OPSET_IR_VERSION[opset]
    assert opset + 1 not in ox.OPSET_IR_VERSION or opset == max_opset or ox.OPSET_IR_VERSION[opset + 1] > max_ir


def test_target_rows():
    assert ox.resolve_opset(None, "onnxruntime-1.15") == (18, 8)
    assert ox.resolve_opset(None, "tensorrt-8.6") == (17, 8)
    assert ox.resolve_opset(None, "onnx2torch-1.5") == (17, 8)
    assert ox.resolve_opset(13, "onnxruntime-1.15") == (13, 7)
    assert ox.resolve_opset(None, None) == (17, 8)


def test_unknown_target_lists_the_known_ones(tmp_path):
    with pytest.raises(ValueError, match="unknown target 'onnxruntime-0.1'.*onnxruntime-1.15.*tensorrt-8.6"):
        export_onnx(mlp(), (2, 64), tmp_path / "m.onnx", target="onnxruntime-0.1")
    assert not os.listdir(tmp_path)


def test_opset_the_target_cannot_read(tmp_path):
    with pytest.raises(ValueError, match="onnxruntime-1.15 reads opsets up to 18.*opset=21"):
        export_onnx(mlp(), (2, 64), tmp_path / "m.onnx", target="onnxruntime-1.15", opset=21)
    assert not os.listdir(tmp_path)


def test_metadata_and_doc_string(tmp_path):
    model = mlp()
    export_onnx(model, (2, 64), tmp_path / "m.onnx", dynamic_batch=True, doc_string="digits classifier",
                metadata={"labels": "0,1,2,3,4,5,6,7,8,9", "author": "me", "mean": "0.5"})
    m = read(tmp_path / "m.onnx")
    props = {p.key: p.value for p in m.metadata_props}
    assert [p.key for p in m.metadata_props] == ["netcl.version", "netcl.input_layout", "netcl.input_shape",
                                                 "netcl.architecture", "author", "labels", "mean"]
    assert props["netcl.version"] == __version__
    assert props["netcl.input_layout"] == "NC" and props["netcl.input_shape"] == "batch,64"
    assert props["labels"] == "0,1,2,3,4,5,6,7,8,9" and m.doc_string == "digits classifier"
    assert str(tmp_path) not in m.SerializeToString().decode("latin-1")  # no paths
    export_onnx(model, (2, 64), tmp_path / "n.onnx", doc_string="digits classifier",
                metadata={"mean": "0.5", "author": "me", "labels": "0,1,2,3,4,5,6,7,8,9"}, dynamic_batch=True)
    # the same model and options give the same bytes, whatever the dict order and the time
    assert (tmp_path / "m.onnx").read_bytes() == (tmp_path / "n.onnx").read_bytes()


def test_input_layout_of_images(tmp_path):
    netcl.manual_seed(0)
    export_onnx(models.build("cnn").eval(), (3, 3, 32, 32), tmp_path / "m.onnx")
    props = {p.key: p.value for p in read(tmp_path / "m.onnx").metadata_props}
    assert props["netcl.input_layout"] == "NCHW" and props["netcl.input_shape"] == "3,3,32,32"


@pytest.mark.parametrize("metadata, error", [
    ({"epoch": 3}, TypeError), ({3: "x"}, TypeError), ("a=b", TypeError), ({"netcl.version": "9"}, ValueError)])
def test_bad_metadata_writes_nothing(tmp_path, metadata, error):
    (tmp_path / "m.onnx").write_bytes(b"old")
    with pytest.raises(error):
        export_onnx(mlp(), (2, 64), tmp_path / "m.onnx", metadata=metadata)
    assert (tmp_path / "m.onnx").read_bytes() == b"old" and os.listdir(tmp_path) == ["m.onnx"]


def test_onnx_reads_the_metadata(tmp_path):
    onnx = pytest.importorskip("onnx")
    export_onnx(mlp(), (2, 64), tmp_path / "m.onnx", metadata={"k": "v"}, doc_string="d", target="tensorrt-8.6")
    m = onnx.load(str(tmp_path / "m.onnx"))
    onnx.checker.check_model(m, full_check=True)
    assert {p.key: p.value for p in m.metadata_props}["k"] == "v" and m.doc_string == "d"


# -- a real older consumer ----------------------------------------------------------------------
ORT115 = """
import sys, numpy as np, onnxruntime as ort
assert ort.__version__ == "1.15.1", ort.__version__
model, x, out = sys.argv[1:]
try:
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
except Exception as e:
    print("REFUSED", type(e).__name__, str(e)[:1000])
    sys.exit(3)
np.save(out, sess.run(None, {"input": np.load(x)})[0])
"""


@pytest.fixture(scope="module")
def ort115():
    from old_consumers import consumer_python

    python = consumer_python("ort115")
    if not python:
        pytest.skip(str(python))
    return python


def run_ort115(python, model, x, tmp_path):
    np.save(tmp_path / "x.npy", x)
    r = subprocess.run([python, "-c", ORT115, str(model), str(tmp_path / "x.npy"), str(tmp_path / "y.npy")],
                       capture_output=True, text=True, timeout=300)
    return r, (np.load(tmp_path / "y.npy") if r.returncode == 0 else None)


def small_models():
    """name -> (model, one sample's shape): the reference models, and the ops whose newer versions
    older runtimes lack (AveragePool-19 in every-layer, Reshape-19 in multihead-attention)."""
    from test_onnx_opsets import REFERENCE_MODELS

    out = {name: (models.MODELS[name], models.MODELS[name].input_shape) for name in ("mlp", "cnn", "detector26")}
    out.update({name: REFERENCE_MODELS[name] for name in ("every-layer", "multihead-attention")})
    return out


@pytest.mark.parametrize("name", ["mlp", "cnn", "detector26", "every-layer", "multihead-attention"])
def test_onnxruntime_1_15_runs_its_target(name, ort115, queue, rng, tmp_path):
    build, shape = small_models()[name]
    netcl.manual_seed(2)
    model = randomize_batchnorm(build(), rng).eval()
    x = rng.standard_normal((2,) + tuple(shape)).astype(np.float32)
    export_onnx(model, x.shape, tmp_path / "m.onnx", target="onnxruntime-1.15", dynamic_batch=True)
    assert read(tmp_path / "m.onnx").opset_import[0].version == 18
    r, got = run_ort115(ort115, tmp_path / "m.onnx", x, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    want = model(netcl.Tensor.from_host(queue, x)).to_host()
    err = float(np.abs(got - want).max())
    print(f"{name}: onnxruntime 1.15.1 vs netcl max abs diff {err:.2e}")
    assert err <= 1e-5


@pytest.mark.parametrize("name, opset, why", [
    ("every-layer", 19, "AveragePool(19)"), ("multihead-attention", 19, "Reshape(19)"), ("mlp", 20, "Opset 20")])
def test_onnxruntime_1_15_refuses_what_its_row_excludes(name, opset, why, ort115, rng, tmp_path):
    """The table row is the boundary: 1.15 has no AveragePool-19 or Reshape-19 kernels, and
    refuses opset 20 whatever the ops."""
    build, shape = small_models()[name]
    export_onnx(build().eval(), (2,) + tuple(shape), tmp_path / "m.onnx", opset=opset)
    r, _ = run_ort115(ort115, tmp_path / "m.onnx", rng.standard_normal((2,) + tuple(shape)).astype(np.float32),
                      tmp_path)
    assert r.returncode == 3 and "REFUSED" in r.stdout and why in r.stdout, r.stdout + r.stderr
