"""The fused plan's column-route convolutions (netcl.jit.cols): Conv1d -> BatchNorm1d -> activation
and a Conv2d of the column route -> BatchNorm2d -> activation run as im2col, a GEMM per group with
the BatchNorm folded into the weights, and one bias + activation kernel. Checked against the layers'
own forwards and float64 PyTorch, the launches counted, the folded weights re-made when the
weights change."""
import numpy as np
import pytest
from conftest import assert_close, torch_state

import netcl
from netcl import Tensor, nn


def randomize_bn(model, rng):
    """Running statistics and affine parameters away from their defaults in every BatchNorm."""
    for m in model.modules() if hasattr(model, "modules") else model:
        if isinstance(m, nn.BatchNorm2d):  # BatchNorm1d too
            c = m.num_features
            m.load_state_dict({"weight": rng.uniform(0.5, 1.5, c).astype(np.float32),
                               "bias": rng.normal(0, 0.3, c).astype(np.float32),
                               "running_mean": rng.normal(0, 0.5, c).astype(np.float32),
                               "running_var": rng.uniform(0.5, 2.0, c).astype(np.float32)})
    return model


def kws(c_in=40, width=64, classes=12):
    """A keyword-spotting model: (Conv1d(k=5) -> BatchNorm1d -> ReLU) x 3, global average pool, Linear."""
    return nn.Sequential(nn.Conv1d(c_in, width, 5), nn.BatchNorm1d(width), nn.ReLU(),
                         nn.Conv1d(width, width, 5), nn.BatchNorm1d(width), nn.ReLU(),
                         nn.Conv1d(width, width, 5, padding=2), nn.BatchNorm1d(width), nn.ReLU(),
                         nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(width, classes))


def torch_kws(torch, c_in=40, width=64, classes=12):
    t = torch.nn
    return t.Sequential(t.Conv1d(c_in, width, 5), t.BatchNorm1d(width), t.ReLU(),
                        t.Conv1d(width, width, 5), t.BatchNorm1d(width), t.ReLU(),
                        t.Conv1d(width, width, 5, padding=2), t.BatchNorm1d(width), t.ReLU(),
                        t.AdaptiveAvgPool1d(1), t.Flatten(), t.Linear(width, classes)).double().eval()


def load_torch(torch, model, ref):
    ref.load_state_dict(torch_state(torch, model), strict=False)
    return ref


def layer_path(queue, model, x):
    """The eval forward through the layers' own kernels (no plan)."""
    with netcl.no_grad():
        h = Tensor.from_host(queue, x)
        for layer in model:
            h = layer.forward(h)
        return h.to_host()


def check_fused(queue, torch, model, ref, x, what):
    """predict() and model(Tensor) of eval `model` against the layers' path and float64 `ref`."""
    want = ref(torch.tensor(x, dtype=torch.float64)).detach().numpy()
    own = layer_path(queue, model, x)
    got = model.predict(x, queue)
    assert got.shape == want.shape, what
    assert_close(got, want, 1e-4, atol=1e-5, what=f"{what} predict vs torch")
    assert_close(got, own, 1e-4, atol=1e-5, what=f"{what} predict vs layers")
    assert_close(model(Tensor.from_host(queue, x)).to_host(), want, 1e-4, atol=1e-5, what=f"{what} call vs torch")


@pytest.mark.parametrize("batch", [1, 3])
def test_kws_fuses_and_matches_torch(queue, rng, torch, batch):
    netcl.manual_seed(0)
    model = randomize_bn(kws(), rng).eval()
    plan = model._fused
    assert str(plan).startswith("FusedPlan(Conv1d+BatchNorm1d+act1, Conv1d+BatchNorm1d+act1, Conv1d+BatchNorm1d+act1,")
    assert plan.unfused() == []
    ref = load_torch(torch, model, torch_kws(torch))
    check_fused(queue, torch, model, ref, rng.normal(size=(batch, 40, 49)).astype(np.float32), f"kws batch {batch}")


def count_launches(monkeypatch, fn):
    """Kernel launches fn() enqueues (every netcl launch, fused plan or layer, goes through
    pyopencl.enqueue_nd_range_kernel)."""
    import pyopencl as cl

    calls = []
    real = cl.enqueue_nd_range_kernel

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)

    with monkeypatch.context() as m:
        m.setattr(cl, "enqueue_nd_range_kernel", counting)
        fn()
    return len(calls)


def test_kws_launches_fewer(queue, rng, monkeypatch):
    netcl.manual_seed(0)
    model = randomize_bn(kws(), rng).eval()
    x = Tensor.from_host(queue, rng.normal(size=(4, 40, 49)).astype(np.float32))
    plan = model._fused
    with netcl.no_grad():
        plan(x).to_host()  # built and warm
        plan._unfused(x).to_host()
        fused = count_launches(monkeypatch, lambda: plan(x))
        layers = count_launches(monkeypatch, lambda: plan._unfused(x))
    # per conv block im2col, GEMM and the epilogue; the mean and the Linear: 11 (a GEMM split over its
    # reduction adds its reduction's launch)
    assert plan.launches(x.shape) == 11
    assert 11 <= fused <= 14, fused
    # the layers' path launches the conv's bias kernel, BatchNorm and ReLU besides
    assert layers >= fused + 2 * 3, (layers, fused)


@pytest.mark.parametrize("act", ["ReLU", "LeakyReLU", "GELU", "SiLU", "Sigmoid", "Tanh", "Hardswish", "ReLU6", None])
def test_column_conv2d_bn_act_vs_torch(queue, rng, torch, act):
    """Conv2d of the column route (a (3, 1) kernel, unequal padding and stride) -> BatchNorm2d -> act."""
    t = torch.nn
    make = {"LeakyReLU": lambda mod: mod.LeakyReLU(0.1)}.get(act, lambda mod: getattr(mod, act)())
    tail = [make(nn)] if act else []
    model = nn.Sequential(nn.Conv2d(3, 8, (3, 1), stride=(1, 2), padding=(1, 0)), nn.BatchNorm2d(8), *tail,
                          nn.Flatten(), nn.Linear(8 * 6 * 4, 5))
    randomize_bn(model, rng).eval()
    assert str(model._fused).startswith(f"FusedPlan(Conv2d+BatchNorm2d{'+act' if act else ','}")
    ref = t.Sequential(t.Conv2d(3, 8, (3, 1), stride=(1, 2), padding=(1, 0)), t.BatchNorm2d(8),
                       *([make(t)] if act else []), t.Flatten(), t.Linear(8 * 6 * 4, 5)).double().eval()
    load_torch(torch, model, ref)
    check_fused(queue, torch, model, ref, rng.normal(size=(2, 3, 6, 7)).astype(np.float32), f"Conv2d+BN+{act}")


def test_grouped_and_biasless_conv1d_vs_torch(queue, rng, torch):
    """Groups (a GEMM per group), no bias, no BatchNorm, padding='same', and a Conv1d alone."""
    t = torch.nn
    model = nn.Sequential(nn.Conv1d(4, 6, 3, groups=2, bias=False), nn.BatchNorm1d(6), nn.Tanh(),
                          nn.Conv1d(6, 6, 4, padding="same", dilation=2), nn.LeakyReLU(0.2),
                          nn.Conv1d(6, 3, 1, stride=2))
    randomize_bn(model, rng).eval()
    assert str(model._fused) == "FusedPlan(Conv1d+BatchNorm1d+act4, Conv1d+act2, Conv1d)"
    ref = t.Sequential(t.Conv1d(4, 6, 3, groups=2, bias=False), t.BatchNorm1d(6), t.Tanh(),
                       t.Conv1d(6, 6, 4, padding="same", dilation=2), t.LeakyReLU(0.2),
                       t.Conv1d(6, 3, 1, stride=2)).double().eval()
    load_torch(torch, model, ref)
    for n in (1, 5):
        check_fused(queue, torch, model, ref, rng.normal(size=(n, 4, 11)).astype(np.float32), f"batch {n}")


def test_depthwise_conv1d_and_mismatched_bn_stay_layers(queue, rng):
    """A depthwise Conv1d runs its direct kernel (a layer of the plan); a BatchNorm2d after a Conv1d,
    or one of other width, is not folded."""
    model = nn.Sequential(nn.Conv1d(4, 4, 3, groups=4), nn.BatchNorm1d(4), nn.ReLU(),
                          nn.Conv1d(4, 6, 3), nn.ReLU(), nn.BatchNorm1d(6), nn.Flatten(), nn.Linear(6 * 7, 2)).eval()
    assert model._fused.unfused() == ["Conv1d", "BatchNorm1d", "ReLU", "BatchNorm1d"]
    assert "Conv1d+act1" in str(model._fused)
    x = rng.normal(size=(2, 4, 11)).astype(np.float32)
    assert_close(model.predict(x, queue), layer_path(queue, model, x), 1e-5, atol=1e-6, what="mixed")


def test_weights_changed_after_eval_are_refolded(queue, rng, torch):
    """load_state_dict and a running statistic set in place after the first predict: the next call
    folds again (the sources' versions moved)."""
    netcl.manual_seed(0)
    model = randomize_bn(kws(8, 16, 3), rng).eval()
    x = rng.normal(size=(2, 8, 20)).astype(np.float32)
    model.predict(x, queue)
    netcl.manual_seed(1)
    other = randomize_bn(kws(8, 16, 3), rng)
    model.load_state_dict(other.state_dict())
    model[4].running_var.set_(rng.uniform(0.2, 3.0, 16).astype(np.float32))
    ref = load_torch(torch, model, torch_kws(torch, 8, 16, 3))
    check_fused(queue, torch, model, ref, x, "after load_state_dict")
