"""The generic tier and the background builds (netcl.runtime.tiers): a conv whose specialised
kernels are not built runs its generic route, the background thread builds them, and the next
step runs the full route; both tiers' results agree within float32 noise and against float64
PyTorch; a replayed TrainStep records again when the tiers change; NETCL_COMPILE is checked."""
import os

import numpy as np
import pytest
from conftest import assert_close

import netcl
from netcl import Tensor, TrainStep, nn, ops, optim
from netcl.runtime import tiers


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


@pytest.fixture
def background(monkeypatch, tmp_path):
    """Background mode on an empty kernel cache of its own (nothing of the test's specialised
    kernels built in this process either: a source token no build has seen)."""
    from netcl import runtime

    monkeypatch.setenv("NETCL_COMPILE", "background")
    monkeypatch.setenv("NETCL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(runtime, "_kernels", {})  # (kernels this process built stay in program's memory)
    monkeypatch.setattr(tiers, "IDLE_S", 0.0)
    yield
    assert tiers.settle(timeout=300)


def fresh_winot(monkeypatch):
    """conv_winot.cl as it is plus a comment no cache has seen: its programs are new to this process."""
    from netcl import runtime

    real = runtime.kernel_source
    token = f"\n// {os.urandom(8).hex()}\n"
    monkeypatch.setattr(runtime, "kernel_source", lambda family: real(family) + (token if family == "conv_winot" else ""))


def test_a_conv_runs_the_generic_tier_until_its_winograd_kernels_are_built(queue, rng, monkeypatch, background,
                                                                           torch):
    if not ops.is_cpu(queue):
        pytest.skip("the CPU training routes")
    monkeypatch.setenv("NETCL_CPU_WINOT", "1")
    fresh_winot(monkeypatch)
    layer = nn.Conv2d(8, 16, 3, padding=1).to(queue).train()
    x, dy = rng.standard_normal((2, 8, 16, 16)).astype(np.float32), rng.standard_normal((2, 16, 16, 16)).astype(
        np.float32)

    def step():
        layer.zero_grad()
        y = layer(Tensor.from_host(queue, x))
        dx = layer.backward(Tensor.from_host(queue, dy))
        return layer._saved.route, [y.to_host(), dx.to_host(), layer.weight.grad.to_host(), layer.bias.grad.to_host()]

    first = tiers.generation()
    generic, a = step()
    assert generic.tier == "generic" and generic.forward == "rows" and generic.wgrad == "rows"
    assert tiers.settle(timeout=300) and tiers.generation() > first
    full, b = step()
    assert full.tier == "specialised" and (full.forward, full.wgrad, full.dgrad) == ("winot", "winot", "winot")
    ref = torch.nn.Conv2d(8, 16, 3, padding=1).double()
    with torch.no_grad():
        ref.weight.copy_(torch.tensor(layer.weight.to_host(), dtype=torch.float64))
        ref.bias.copy_(torch.tensor(layer.bias.to_host(), dtype=torch.float64))
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    yt = ref(xt)
    yt.backward(torch.tensor(dy, dtype=torch.float64))
    want = [yt.detach().numpy(), xt.grad.numpy(), ref.weight.grad.numpy(), ref.bias.grad.numpy()]
    for got_a, got_b, w, what in zip(a, b, want, ("y", "dx", "dW", "db")):
        assert_close(got_a, w, what=f"generic {what}")
        assert_close(got_b, w, what=f"specialised {what}")
        assert_close(got_a, got_b, what=f"tiers {what}")


def test_a_replayed_step_records_again_when_the_tiers_change(queue, rng, monkeypatch, background):
    if not ops.is_cpu(queue):
        pytest.skip("the CPU training routes")
    monkeypatch.setenv("NETCL_CPU_WINOT", "1")
    fresh_winot(monkeypatch)
    netcl.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(),
                          nn.Linear(8 * 16 * 16, 4)).to(queue).train()
    step = TrainStep(model, nn.CrossEntropyLoss(), optim.SGD(model.parameters(), lr=1e-2))
    x, y = rng.standard_normal((4, 8, 16, 16)).astype(np.float32), np.arange(4) % 4
    from netcl.runtime import buildlog

    held = [True]  # the background thread waits while this holds
    monkeypatch.setattr(buildlog, "busy_within", lambda seconds: held[0])
    launched = []
    real = ops.launch

    def spy(q, family, name, *args, options=()):
        launched.append(name)
        return real(q, family, name, *args, options=options)
    monkeypatch.setattr(ops, "launch", spy)
    losses = [float(step(x, y)) for _ in range(4)]
    assert step.replays >= 1 and "conv_winot" not in launched and tiers.pending() > 0  # the generic tier's step
    replays = step.replays
    held[0] = False
    assert tiers.settle(timeout=300)
    launched.clear()
    losses += [float(step(x, y)) for _ in range(4)]
    assert "conv_winot" in launched  # recorded again, with the full route, then replayed
    assert step.replays > replays and np.all(np.isfinite(losses)) and losses[-1] < losses[0]


def test_compile_mode_is_checked(monkeypatch):
    monkeypatch.setenv("NETCL_COMPILE", "sometimes")
    with pytest.raises(ValueError, match="NETCL_COMPILE must be one of background, eager, got 'sometimes'"):
        tiers.mode()
    monkeypatch.setenv("NETCL_COMPILE", "EAGER")
    assert tiers.mode() == "eager"
    with tiers.with_mode("background"):
        assert tiers.mode() == "background"
    assert tiers.mode() == "eager"


def test_a_first_predict_runs_the_layers_while_the_fused_plan_builds(queue, rng, monkeypatch, background):
    """predict() whose fused plan's programs are not built yet (a fresh cache, the jit's program
    cache emptied) runs the layers' own eval forwards and hands the plan's build to the background;
    once built, the plan runs: the same result within float32 noise."""
    from netcl.jit import common

    if not ops.is_cpu(queue):
        pytest.skip("the background tier runs on CPUs")
    monkeypatch.setattr(common, "_programs", {})
    netcl.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(8 * 8 * 8, 10)).to(queue).eval()
    x = rng.standard_normal((2, 3, 16, 16)).astype(np.float32)
    from netcl.runtime import buildlog

    held = [True]  # the background thread waits while this holds
    monkeypatch.setattr(buildlog, "busy_within", lambda seconds: held[0])
    plan = model._fused
    first = model.predict(x)
    assert plan._compiled == {} and tiers.pending() > 0  # the layers ran; the plan builds in the background
    held[0] = False
    assert tiers.settle(timeout=300)
    second = model.predict(x)
    assert plan._compiled != {}
    assert_close(first, second, what="unfused vs fused predict")


_EXITS_WHILE_BUILDING = """
import os, time
import numpy as np
import netcl
from netcl import nn, Tensor
from netcl.runtime import tiers
tiers.IDLE_S = 0.0
q = netcl.default_queue()
layer = nn.Conv2d(16, 16, 3, padding=1).to(q).train()
layer(Tensor.from_host(q, np.zeros((2, 16, 32, 32), np.float32)))
assert tiers.pending() > 0
time.sleep(float(os.environ["PAUSE"]))
"""


def test_a_process_exits_cleanly_while_the_background_builds(queue, tmp_path):
    """The interpreter's exit waits for a build in flight (PoCL aborted the process when it ended
    inside the compiler) and drops the rest: several exits at different moments of the builds."""
    import subprocess
    import sys

    if not ops.is_cpu(queue):
        pytest.skip("the background tier runs on CPUs")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for i, pause in enumerate(("0", "0.05", "0.1", "0.3")):
        env = dict(os.environ, NETCL_COMPILE="background", NETCL_CPU_WINOT="1", NETCL_BUILD_HELPER="0",
                   NETCL_CACHE_DIR=str(tmp_path / f"n{i}"), POCL_CACHE_DIR=str(tmp_path / f"p{i}"), PAUSE=pause,
                   PYTHONPATH=os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH")) if p))
        (tmp_path / f"p{i}").mkdir()
        r = subprocess.run([sys.executable, "-c", _EXITS_WHILE_BUILDING], env=env, capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, (pause, r.returncode, r.stderr[-2000:])
