"""torchvision's classifiers (random weights, 10 classes) through both ways in: nn.from_torch (torch.fx)
and import_onnx of torch.onnx.export's file at opsets 13 and 17. Each agrees with torch to 1e-4
relative and trains (five SGD steps on one batch lower the loss). Small inputs; the large models
under NETCL_SLOW_TESTS. tools/coverage_torchvision.py builds the models and prints the same table at
any size."""
import os
import sys
import tempfile
import warnings

import numpy as np
import pytest

import netcl
from netcl import nn
from netcl.io import import_onnx

torch = pytest.importorskip("torch")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from coverage_torchvision import build, rel, torchvision_models  # noqa: E402

SLOW = os.environ.get("NETCL_SLOW_TESTS") == "1"
# model -> input size: 64, where two images' batch statistics in the last blocks keep float32 training
# finite (at 32 torch's own float32 training of mobilenet_v2 turns NaN), 224 for vgg11_bn (its
# adaptive pool to 7x7 takes what five poolings leave of 224)
MODELS = {"resnet18": 64, "mobilenet_v2": 64, "mobilenet_v3_small": 64, "squeezenet1_1": 64,
          "shufflenet_v2_x0_5": 64, "efficientnet_b0": 64, "regnet_y_400mf": 64, "googlenet": 64,
          "densenet121": 64, "resnet50": 64, "vgg11_bn": 224}
FAST = {"resnet18"}
LR = {"vgg11_bn": 0.001}  # (at 0.01 torch's own five steps on this batch diverge too)


@pytest.fixture(scope="module")
def tvm():
    try:
        return torchvision_models()
    except ImportError:
        pytest.skip("torchvision is not installed (make test installs it)")


def _params():
    return [pytest.param(name, marks=() if name in FAST or SLOW else
                         pytest.mark.skip(reason="NETCL_SLOW_TESTS=1 runs the large models"))
            for name in MODELS]


def _input(name):
    """Two images: one and its mirror image (tools/coverage_torchvision.py's batch)."""
    x = np.random.default_rng(0).uniform(-1, 1, (1, 3, MODELS[name], MODELS[name])).astype(np.float32)
    return np.concatenate([x, x[:, :, :, ::-1]])


@pytest.mark.parametrize("name", _params())
def test_from_torch_agrees_and_trains(queue, tvm, name):
    tm = build(tvm, name, MODELS[name])
    x = _input(name)
    model = nn.from_torch(tm).to(queue)
    with torch.no_grad():
        want = tm(torch.from_numpy(x)).numpy()
    with netcl.no_grad():
        got = model(netcl.tensor(x, queue=queue)).numpy()
    assert rel(got, want) <= 1e-4
    model.train()
    opt = netcl.optim.SGD(model.parameters(), lr=LR.get(name, 0.01), momentum=0.9)
    y = np.array([1, 7])
    losses = []
    for _ in range(5):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(netcl.tensor(x, queue=queue)), y)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert np.isfinite(losses).all() and losses[-1] < losses[0], losses


@pytest.mark.parametrize("opset", [13, 17])
@pytest.mark.parametrize("name", _params())
def test_import_onnx_agrees(queue, tvm, name, opset):
    tm = build(tvm, name, MODELS[name])
    x = _input(name)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "m.onnx")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(tm, (torch.from_numpy(x),), path, dynamo=False, opset_version=opset,
                              input_names=["input"], output_names=["output"])
        model = import_onnx(path)
    with torch.no_grad():
        want = tm(torch.from_numpy(x)).numpy()
    assert rel(model.predict(x, queue), want) <= 1e-4
