"""A new input size on a warm cache builds nothing in the foreground: the generic tier's kernels take
the planes' sizes as arguments (bn_add_act_cpu's zero-bordered identity: a Residual after a
BatchNorm2d + ReLU reads its input as its first conv's planes), so a model trained at one input
size trains at another with the programs it has, while the specialised kernels of the new size
(Winograd, the narrow weight gradients) build in the background. Builds are counted where the
runtime makes them (runtime.build), on the calling thread."""
import numpy as np
import pytest

import netcl
from netcl import TrainStep, nn, ops, optim
from netcl.nn import norm
from netcl.runtime import buildlog, tiers


@pytest.fixture
def background(monkeypatch, tmp_path):
    """Background mode on an empty kernel cache of its own (nothing built in this process counts)."""
    from netcl import runtime

    monkeypatch.setenv("NETCL_COMPILE", "background")
    monkeypatch.setenv("NETCL_BUILD_HELPER", "0")
    monkeypatch.setenv("NETCL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(runtime, "_kernels", {})
    monkeypatch.setattr(tiers, "_queued", set())  # (what earlier tests handed to the background)
    monkeypatch.setattr(norm, "_own_stats_queued", set())
    monkeypatch.setattr(tiers, "IDLE_S", 0.0)
    yield
    assert tiers.settle(timeout=300)


def foreground_builds(monkeypatch):
    """The programs runtime.build makes (from source or the disk cache) outside the background thread."""
    from netcl import runtime

    built, real = [], runtime.build

    def counted(*args, **kwargs):
        if not buildlog.in_background():
            built.append(kwargs.get("what") or kwargs.get("family"))
        return real(*args, **kwargs)
    monkeypatch.setattr(runtime, "build", counted)
    return built


def block_model():
    # x: (N, 3, H, W) -> (N, 4): conv, BatchNorm2d + ReLU writing the Residual's planes, the block's
    # sum applying its last BatchNorm2d (bn_add_act_cpu with S_BORDER), a classifier head
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Residual(nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                                     nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))


def test_a_new_input_size_builds_nothing_in_the_foreground(queue, rng, monkeypatch, background):
    if not ops.is_cpu(queue):
        pytest.skip("the CPU training routes")
    netcl.manual_seed(0)
    model = block_model().to(queue).train()
    step = TrainStep(model, nn.CrossEntropyLoss(), optim.SGD(model.parameters(), lr=1e-2, momentum=0.9))
    y = np.arange(4) % 4
    first = rng.standard_normal((4, 3, 16, 16)).astype(np.float32)
    assert model.layers[3].padded_input(queue, (4, 8, 16, 16)) is not None  # the planes' route is taken
    losses = [float(step(first, y)) for _ in range(3)]
    assert tiers.settle(timeout=300)
    losses += [float(step(first, y)) for _ in range(2)]  # the specialised tier's steps
    built = foreground_builds(monkeypatch)
    for size in (24, 32):
        x = rng.standard_normal((4, 3, size, size)).astype(np.float32)
        losses += [float(step(x, y)) for _ in range(2)]
        assert built == [], f"a {size}x{size} input built {built} in the foreground"
    assert np.all(np.isfinite(losses))
