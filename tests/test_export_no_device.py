"""export_onnx where only numpy and protobuf are installed (no pyopencl, no OpenCL device), and
the protobuf runtime range of the generated bindings.

The bare virtual environments are cached under $NETCL_TEST_VENVS (default
~/.cache/netcl/test-venvs), keyed by Python, numpy and protobuf versions: only the first run
pays for pip (about 15 s). The protobuf matrix (oldest and newest supported runtime, each with
netcl installed by `pip install --no-deps .`, and the release just below the floor refused)
runs only with NETCL_PROTOBUF_MATRIX=1, for CI.
"""
import contextlib
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import netcl
from netcl import models

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENVS = os.environ.get("NETCL_TEST_VENVS") or os.path.join(os.path.expanduser("~"), ".cache", "netcl", "test-venvs")
PROTOBUF_OLDEST, PROTOBUF_NEWEST, PROTOBUF_TOO_OLD = "6.30.2", "7.36.2", "6.30.1"
CHILD = textwrap.dedent("""
    import importlib.util, os, sys
    assert importlib.util.find_spec("pyopencl") is None, "this environment must not have pyopencl"
    import numpy as np
    import netcl
    from netcl import models
    from netcl.io import export_onnx
    from netcl.io.onnx_export import onnx_pb2
    out = sys.argv[1]
    netcl.manual_seed(7)
    export_onnx(models.cnn().eval(), (1, 3, 32, 32), os.path.join(out, "built.onnx"), dynamic_batch=True)
    if os.path.exists(os.path.join(out, "model.netcl")):
        from netcl.io import load
        model = load(os.path.join(out, "model.netcl")).eval()
        export_onnx(model, (1, 3, 32, 32), os.path.join(out, "loaded.onnx"), dynamic_batch=True)
    import google.protobuf
    print("ok", google.protobuf.__version__, onnx_pb2.__name__)
""")


@contextlib.contextmanager
def _lock(path):
    import fcntl

    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def bare_venv(protobuf=None, netcl_installed=False):
    """The python of a cached venv with only numpy and protobuf (+ netcl itself, --no-deps, if asked)."""
    import google.protobuf

    protobuf = protobuf or google.protobuf.__version__
    name = (f"py{sys.version_info[0]}{sys.version_info[1]}-numpy{np.__version__}-protobuf{protobuf}"
            + ("-netcl" if netcl_installed else ""))
    path = os.path.join(VENVS, name)
    python = os.path.join(path, "bin", "python")
    pip = [sys.executable, "-m", "pip", "--python", python, "install", "-q", "--disable-pip-version-check"]
    with _lock(path):
        if not os.path.exists(os.path.join(path, ".ready")):
            shutil.rmtree(path, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", "--without-pip", path], check=True)
            subprocess.run(pip + [f"numpy=={np.__version__}", f"protobuf=={protobuf}"], check=True)
            open(os.path.join(path, ".ready"), "w").close()
        if netcl_installed:  # a wheel of the tree as it is now: setup.py generates the bindings
            subprocess.run(pip + ["--no-deps", "--force-reinstall", ROOT], check=True)
    return python


def run_child(python, out, from_tree=True):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NETCL_DEVICE")}
    if from_tree:
        env["PYTHONPATH"] = ROOT
    return subprocess.run([python, "-c", CHILD, str(out)], env=env, cwd=out, capture_output=True, text=True,
                          timeout=300)


def _model_file(tmp_path, rng):
    """A .netcl file of the CNN with non-default batch-norm statistics."""
    from netcl.io import save

    model = models.cnn().eval()
    for m in model:
        if isinstance(m, netcl.nn.BatchNorm2d):
            m.running_mean.set_(rng.normal(0, 0.5, m.num_features))
            m.running_var.set_(rng.uniform(0.5, 2.0, m.num_features))
    save(model, tmp_path / "model.netcl")
    return model


def _check_outputs(tmp_path, model):
    """The child's files are byte-identical to this process's export of the same models."""
    from netcl.io import export_onnx

    netcl.manual_seed(7)
    export_onnx(models.cnn().eval(), (1, 3, 32, 32), tmp_path / "here.onnx", dynamic_batch=True)
    assert (tmp_path / "built.onnx").read_bytes() == (tmp_path / "here.onnx").read_bytes()
    export_onnx(model, (1, 3, 32, 32), tmp_path / "here-loaded.onnx", dynamic_batch=True)
    assert (tmp_path / "loaded.onnx").read_bytes() == (tmp_path / "here-loaded.onnx").read_bytes()


def test_export_without_pyopencl(tmp_path, rng):
    model = _model_file(tmp_path, rng)
    r = run_child(bare_venv(), tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    _check_outputs(tmp_path, model)


def test_loaded_file_exported_without_device_runs_in_onnxruntime(tmp_path, rng, queue):
    """The .onnx exported where there is no device computes what netcl computes."""
    pytest.importorskip("onnxruntime")
    model = _model_file(tmp_path, rng)
    r = run_child(bare_venv(), tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    from netcl.apps.verify import verify

    x = rng.standard_normal((3, 3, 32, 32)).astype(np.float32)
    result = verify(model, x, onnx_path=tmp_path / "loaded.onnx", queue=queue)
    print(result)
    assert result.ok, result


matrix = pytest.mark.skipif(os.environ.get("NETCL_PROTOBUF_MATRIX") != "1",
                            reason="protobuf runtime matrix: set NETCL_PROTOBUF_MATRIX=1 (CI)")


@matrix
@pytest.mark.parametrize("protobuf", [PROTOBUF_OLDEST, PROTOBUF_NEWEST])
def test_protobuf_runtime_range_installed(protobuf, tmp_path, rng):
    """pip install --no-deps . with the oldest and the newest supported protobuf: the wheel carries
    netcl._gen.onnx_pb2 and exports the same bytes as the development environment."""
    model = _model_file(tmp_path, rng)
    python = bare_venv(protobuf, netcl_installed=True)
    r = subprocess.run([python, "-c", "import netcl._gen.onnx_pb2 as m; print(m.__file__)"], cwd=tmp_path,
                       capture_output=True, text=True, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert r.returncode == 0 and "site-packages" in r.stdout, r.stdout + r.stderr
    r = run_child(python, tmp_path, from_tree=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.split()[:2] == ["ok", protobuf]
    _check_outputs(tmp_path, model)


@matrix
def test_protobuf_below_the_range_is_refused(tmp_path):
    r = run_child(bare_venv(PROTOBUF_TOO_OLD), tmp_path)
    assert r.returncode != 0 and "VersionError" in r.stderr, r.stdout + r.stderr
