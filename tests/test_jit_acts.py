"""ELU, Softplus and Mish as activations of the fused plan's epilogues (kernels/act.h's inference-only
codes): Conv2d -> BatchNorm2d -> act in each conv family this device runs (Winograd, direct, the
generic family, depthwise, the column route), with MaxPool2d(2), after a residual add and after a
Linear, checked against float64 PyTorch and the layers' own forwards; the settings they do not
take (Softplus's threshold) leave the layer unfused."""
import numpy as np
import pytest
from conftest import assert_close
from test_jit_cols import check_fused, load_torch, randomize_bn

from netcl import Tensor, nn

ACTS = {"ELU": ({"alpha": 0.7}, "act11"), "Softplus": ({"beta": 1.5}, "act12"), "Mish": ({}, "act13")}


def layers(mod, act):
    """The same model in netcl (mod = netcl.nn) or torch (mod = torch.nn)."""
    kw = ACTS[act][0]
    a = lambda: getattr(mod, act)(**kw)  # noqa: E731
    return [mod.Conv2d(3, 8, 3, padding=1), mod.BatchNorm2d(8), a(),  # on CPUs the direct family
            mod.Conv2d(8, 8, 3, padding=1), mod.BatchNorm2d(8), a(),  # Winograd
            mod.Conv2d(8, 8, 5, stride=2, padding=2), mod.BatchNorm2d(8), a(), mod.MaxPool2d(2),  # pooled
            mod.Conv2d(8, 8, 3, padding=1, groups=8), mod.BatchNorm2d(8), a(),  # depthwise
            mod.Conv2d(8, 6, (3, 1), padding=(1, 0)), mod.BatchNorm2d(6), a(),  # the column route
            mod.Flatten(), mod.Linear(6 * 4 * 4, 10), a(), mod.Linear(10, 4)]


@pytest.mark.parametrize("act", sorted(ACTS))
def test_fused_act_vs_torch(queue, rng, torch, act):
    model = randomize_bn(nn.Sequential(*layers(nn, act)), rng).eval()
    code = ACTS[act][1]
    assert str(model._fused) == (f"FusedPlan(Conv2d+BatchNorm2d+{code}, Conv2d+BatchNorm2d+{code}, "
                                 f"Conv2d+BatchNorm2d+{code}+MaxPool2d, "
                                 f"DwConv2d+BatchNorm2d+{code}, Conv2d+BatchNorm2d+{code}, Flatten, Linear+{code}, "
                                 "Linear)")
    ref = load_torch(torch, model, torch.nn.Sequential(*layers(torch.nn, act)).double().eval())
    for n in (1, 3):
        x = rng.normal(0, 2.0, (n, 3, 16, 16)).astype(np.float32)  # both sides of each function's bends
        check_fused(queue, torch, model, ref, x, f"{act} batch {n}")


@pytest.mark.slow  # PoCL compiles the GPU family's local-memory kernels slowly (about 45 s a program)
def test_gpu_class_kernels_apply_them(queue, rng, torch, monkeypatch):
    """The GPU-class families (the local-memory conv, the depthwise family, the GPU linear kernel)
    with Mish in their epilogues, on this device."""
    monkeypatch.setenv("NETCL_JIT_CLASS", "gpu")
    model = randomize_bn(nn.Sequential(*layers(nn, "Mish")), rng).eval()
    ref = load_torch(torch, model, torch.nn.Sequential(*layers(torch.nn, "Mish")).double().eval())
    check_fused(queue, torch, model, ref, rng.normal(0, 2.0, (2, 3, 16, 16)).astype(np.float32), "Mish, GPU class")


@pytest.mark.parametrize("act", sorted(ACTS))
def test_residual_epilogue_act_vs_torch(queue, rng, torch, act):
    """The activation after a residual add, in the epilogue of the body's last conv."""
    kw = ACTS[act][0]
    model = nn.Sequential(nn.Residual(nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4)), getattr(nn, act)(**kw))
    randomize_bn(model, rng).eval()
    assert str(model._fused) == f"FusedPlan(Conv2d+BatchNorm2d+add+{ACTS[act][1]})"
    t = torch.nn
    conv, bn = t.Conv2d(4, 4, 3, padding=1).double(), t.BatchNorm2d(4).double().eval()
    sd = {k: torch.tensor(v, dtype=torch.float64) for k, v in model.state_dict().items()}
    conv.load_state_dict({k.rsplit(".", 1)[1]: v for k, v in sd.items() if k.startswith("0.body.0.")})
    bn.load_state_dict({k.rsplit(".", 1)[1]: v for k, v in sd.items() if k.startswith("0.body.1.")}, strict=False)
    x = rng.normal(0, 2.0, (2, 4, 6, 6)).astype(np.float32)
    xt = torch.tensor(x, dtype=torch.float64)
    want = getattr(t, act)(**kw)(bn(conv(xt)) + xt).detach().numpy()
    assert_close(model.predict(x, queue), want, 1e-4, atol=1e-5, what=f"Residual + {act}")


def test_softplus_off_its_default_threshold_stays_a_layer(queue, rng):
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Softplus(threshold=5.0), nn.Flatten(), nn.Linear(16, 2)).eval()
    assert model._fused.unfused() == ["Softplus"]
    x = rng.normal(0, 4.0, (2, 3, 4, 4)).astype(np.float32)
    h = Tensor.from_host(queue, x)
    for layer in model:
        h = layer.forward(h)
    assert_close(model.predict(x, queue), h.to_host(), 1e-5, atol=1e-6, what="Softplus(threshold=5)")


def test_layer_of_the_inference_codes():
    from netcl.act import Act
    from netcl.nn.activation import layer_of

    assert layer_of(Act.ELU, 0.5).config() == {"alpha": 0.5}
    assert layer_of(Act.SOFTPLUS, 2.0).config() == {"beta": 2.0, "threshold": 20.0}
    assert type(layer_of(Act.MISH)) is nn.Mish
