"""A new input size or width on a warm cache builds nothing in the foreground: the generic tier's
kernels take the planes' sizes as arguments (bn_add_act_cpu's zero-bordered identity: a Residual
after a BatchNorm2d + ReLU reads its input as its first conv's planes), and a BatchNorm2d whose
statistics came from its conv's tiles hands the statistics kernels other shapes take to the
background after the first step (its own pass over x, for rows that do not fill those tiles: 24
wide against tiles of 16; the combination of any channel count, for widths not a multiple of 16).
The specialised kernels of the new shape (Winograd, the narrow weight gradients) build in the
background meanwhile. Builds are counted where the runtime makes them (runtime.build), on the
calling thread."""
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


def block_model(c):
    # x: (N, 3, H, W) -> (N, 4): conv, BatchNorm2d + ReLU writing the Residual's planes, the block's
    # sum applying its last BatchNorm2d (bn_add_act_cpu with S_BORDER), a classifier head
    return nn.Sequential(nn.Conv2d(3, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU(),
                         nn.Residual(nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU(),
                                     nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, 4))


def train(model, queue, x, y, steps):
    step = TrainStep(model.to(queue).train(), nn.CrossEntropyLoss(),
                     optim.SGD(model.parameters(), lr=1e-2, momentum=0.9))
    return [float(step(x, y)) for _ in range(steps)], step


def test_a_new_input_size_builds_nothing_in_the_foreground(queue, rng, monkeypatch, background):
    """Trained at 16x16 (statistics from the convs' tiles), then at 24x24 (rows of 24: a pass of
    their own) and 32x32."""
    if not ops.is_cpu(queue):
        pytest.skip("the CPU training routes")
    netcl.manual_seed(0)
    model, y = block_model(8), np.arange(4) % 4
    first = rng.standard_normal((4, 3, 16, 16)).astype(np.float32)
    assert model.to(queue).train().layers[3].padded_input(queue, (4, 8, 16, 16)) is not None  # the planes' route
    losses, step = train(model, queue, first, y, 3)
    assert tiers.settle(timeout=300)
    losses += [float(step(first, y)) for _ in range(2)]  # the specialised tier's steps
    built = foreground_builds(monkeypatch)
    for size in (24, 32):
        x = rng.standard_normal((4, 3, size, size)).astype(np.float32)
        losses += [float(step(x, y)) for _ in range(2)]
        assert built == [], f"a {size}x{size} input built {built} in the foreground"
    assert np.all(np.isfinite(losses))


def test_a_new_width_builds_nothing_in_the_foreground(queue, rng, monkeypatch, background):
    """Convs and BatchNorm2d + ReLU of 16 channels (statistics combined 16 channels a work-item),
    then the same model with 24 (a channel a work-item); Winograd off, whose statistics parts take
    the second kernel at any width."""
    if not ops.is_cpu(queue):
        pytest.skip("the CPU training routes")
    monkeypatch.setenv("NETCL_CPU_WINOT", "0")
    netcl.manual_seed(0)
    x, y = rng.standard_normal((4, 3, 16, 16)).astype(np.float32), np.arange(4) % 4

    def chain(c):
        return nn.Sequential(nn.Conv2d(3, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU(),
                             nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU(),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, 4))
    losses = train(chain(16), queue, x, y, 3)[0]
    assert tiers.settle(timeout=300)
    built = foreground_builds(monkeypatch)
    losses += train(chain(24), queue, x, y, 2)[0]
    assert built == [], f"24 channels built {built} in the foreground"
    assert np.all(np.isfinite(losses))
