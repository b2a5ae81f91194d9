"""Ahead-of-time builds (netcl.warmup.compile_model, `netcl warmup`): after them a new process's first
training step and first predict compile nothing, and the model is left exactly as it was."""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import netcl
from netcl import Tensor, nn, optim
from netcl.apps import recipes
from netcl.nn.module import rng
from netcl.warmup import compile_model

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_FIRST_CALLS = textwrap.dedent("""
    import json, sys
    import numpy as np
    import netcl
    from netcl import TrainStep, io, nn, optim
    from netcl.runtime import program
    model = io.load(sys.argv[1])
    q = netcl.default_queue()
    x = np.random.default_rng(0).standard_normal((4, 1, 8, 8)).astype(np.float32)
    step = TrainStep(model.to(q).train(), nn.CrossEntropyLoss(), optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
    float(step(x, np.arange(4) % 10))
    trained = program.stats["compiled"]
    model.eval()
    model.predict(x)
    print(json.dumps({"train": trained, "predict": program.stats["compiled"] - trained}))
""")


def test_netcl_warmup_leaves_nothing_to_compile(queue, tmp_path):
    """`netcl warmup --train` and `netcl warmup` (predict) in one process, on empty kernel caches; then
    a new process's first TrainStep call and first predict() compile no program."""
    netcl.manual_seed(0)
    path = tmp_path / "digits.netcl"
    netcl.io.save(recipes.digits_cnn(), str(path))
    env = dict(os.environ, NETCL_CACHE_DIR=str(tmp_path / "netcl"), POCL_CACHE_DIR=str(tmp_path / "pocl"),
               PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p))
    env.pop("NETCL_COMPILE", None)  # (the tests' eager mode: warmup builds the specialised kernels itself)
    (tmp_path / "pocl").mkdir()
    for extra in (["--train"], []):
        r = subprocess.run([sys.executable, "-m", "netcl.apps.cli", "warmup", str(path), "--input-shape", "1,8,8",
                            "--batch", "4"] + extra, env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr
        assert "programs built" in r.stdout and ("training steps" in r.stdout) == bool(extra)
    r = subprocess.run([sys.executable, "-c", _FIRST_CALLS, str(path)], env=env, capture_output=True, text=True,
                       timeout=600, check=True)
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {"train": 0, "predict": 0}


def test_compile_model_leaves_the_model_as_it_was(queue):
    netcl.manual_seed(1)
    model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Dropout(0.5),
                          nn.Flatten(), nn.Linear(8 * 8 * 8, 10)).to(queue).train()
    model.layers[0].weight.grad = Tensor.from_host(queue, np.full((8, 1, 3, 3), 0.5, np.float32))
    before = {name: t.to_host() for name, t in model.named_tensors()}
    state = rng().bit_generator.state
    x = np.random.default_rng(0).standard_normal((4, 1, 8, 8)).astype(np.float32)
    done = compile_model(model, x, train=True, loss_fn=nn.CrossEntropyLoss(),
                         optimizer=optim.Adam(model.parameters()))
    assert done["programs"] >= 0 and done["seconds"] > 0
    assert all(np.array_equal(t.to_host(), before[name]) for name, t in model.named_tensors())
    assert np.all(model.layers[0].weight.grad.to_host() == 0.5) and model.layers[5].weight.grad is None
    assert rng().bit_generator.state == state and model.training
    compile_model(model, x)  # predict()'s plan
    assert model.training
    with pytest.raises(ValueError, match="both loss_fn and optimizer"):
        compile_model(model, x, train=True, loss_fn=nn.CrossEntropyLoss())
    with pytest.raises(ValueError):
        compile_model(model, np.zeros((4, 3, 8, 8), np.float32))  # 3 channels for a 1-channel conv
