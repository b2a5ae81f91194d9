"""nn.from_torch: torch.nn.Sequential models -> netcl models with the same layers and weights,
held against torch's own outputs (eval mode) and gradients (float64 references)."""
import re

import numpy as np
import pytest

from netcl import Tensor, nn
from netcl.nn import torch_import

torch = pytest.importorskip("torch")
tnn = torch.nn


def randomize(model, seed=0):
    """Non-trivial batch-norm statistics, so a mix-up of weight/bias/mean/var would show."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, tnn.BatchNorm2d):
            c = m.num_features
            m.running_mean.copy_(torch.randn(c, generator=g) * .5)
            m.running_var.copy_(torch.rand(c, generator=g) + .5)
            m.weight.data.copy_(torch.rand(c, generator=g) + .5)
            m.bias.data.copy_(torch.randn(c, generator=g) * .2)
    return model


MODELS = {
    "mlp": (lambda: tnn.Sequential(tnn.Linear(64, 128), tnn.ReLU(), tnn.Linear(128, 128), tnn.Tanh(),
                                   tnn.Dropout(0.2), tnn.Linear(128, 10), tnn.Softmax(dim=1)), (3, 64)),
    "cnn": (lambda: tnn.Sequential(
        tnn.Conv2d(3, 8, 3, padding=1), tnn.BatchNorm2d(8), tnn.ReLU(inplace=True), tnn.MaxPool2d(2),
        tnn.Conv2d(8, 16, (3, 3), stride=2, padding=(1, 1), bias=False), tnn.BatchNorm2d(16), tnn.LeakyReLU(0.1),
        tnn.AvgPool2d(3, stride=1, padding=1), tnn.Flatten(), tnn.Linear(16 * 4 * 4, 10), tnn.Sigmoid()), (2, 3, 16, 16)),
    "nested": (lambda: tnn.Sequential(
        tnn.Sequential(tnn.Conv2d(1, 4, 3), tnn.ReLU()), tnn.Sequential(tnn.Sequential(tnn.MaxPool2d(2)), tnn.Identity()),
        tnn.Flatten(), tnn.Linear(4 * 3 * 3, 5)), (1, 1, 8, 8)),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_outputs_match_torch(name, queue, rng, record_error):
    build, shape = MODELS[name]
    torch.manual_seed(0)
    tm = randomize(build()).eval()
    model = nn.from_torch(tm)
    assert not model.training
    x = rng.standard_normal(shape).astype(np.float32)
    with torch.no_grad():
        want = tm.double()(torch.from_numpy(x).double()).numpy()
    got = model(Tensor.from_host(queue, x)).to_host()
    err = float(np.abs(got - want).max())
    record_error(err)
    assert err <= 1e-5, f"{name}: max abs error {err:.3g}"


def test_same_layers_and_state_dict_keys():
    tm = MODELS["nested"][0]()
    model = nn.from_torch(tm)
    assert [type(m).__name__ for _, m in model.chain()] == ["Conv2d", "ReLU", "MaxPool2d", "Identity", "Flatten",
                                                           "Linear"]
    assert isinstance(model[0], nn.Sequential) and isinstance(model[1][0], nn.Sequential)
    assert list(model.state_dict()) == list(tm.state_dict())


def test_square_linear_is_transposed_by_type(queue, rng):
    tm = tnn.Sequential(tnn.Linear(16, 16))
    model = nn.from_torch(tm)
    np.testing.assert_array_equal(model[0].weight.to_host(), tm[0].weight.detach().numpy().T)
    x = rng.standard_normal((2, 16)).astype(np.float32)
    want = tm(torch.from_numpy(x)).detach().numpy()
    assert np.abs(model(Tensor.from_host(queue, x)).to_host() - want).max() <= 1e-5


def test_training_mode_follows_torch_and_trains(queue, rng, record_error):
    tm = MODELS["cnn"][0]().double().train()
    model = nn.from_torch(tm)
    assert model.training
    x = rng.standard_normal((4, 3, 16, 16))
    xt = torch.from_numpy(x).requires_grad_()
    yt = tm(xt)
    dy = rng.standard_normal(tuple(yt.shape))
    yt.backward(torch.from_numpy(dy))
    y = model(Tensor.from_host(queue, x.astype(np.float32)))
    dx = model.backward(Tensor.from_host(queue, dy.astype(np.float32))).to_host()
    fwd = float(np.abs(y.to_host() - yt.detach().numpy()).max())
    bwd = float(np.abs(dx - xt.grad.numpy()).max())
    gw = float(np.abs(model[0].weight.grad.to_host() - tm[0].weight.grad.numpy()).max())
    record_error(fwd, max(bwd, gw))
    assert fwd <= 1e-5 and bwd <= 1e-4 and gw <= 1e-3


def test_single_layer_becomes_a_sequential():
    model = nn.from_torch(tnn.Linear(3, 2))
    assert isinstance(model, nn.Sequential) and isinstance(model[0], nn.Linear)
    assert list(model.state_dict()) == ["0.weight", "0.bias"]


def test_unsupported_layers_are_all_named_with_the_supported_list():
    class Mine(tnn.Module):
        def forward(self, x):
            return x

    tm = tnn.Sequential(tnn.Linear(4, 4), tnn.ELU(), tnn.Sequential(tnn.Conv2d(1, 1, (3, 5)), Mine()),
                        tnn.MaxPool2d(2, ceil_mode=True))
    with pytest.raises(NotImplementedError) as e:
        nn.from_torch(tm)
    msg = str(e.value)
    for part in ("layer 1 (ELU)", "layer 2.0 (Conv2d): kernel_size=(3, 5)", "layer 2.1 (Mine)",
                 "layer 3 (MaxPool2d): ceil_mode=True", "Supported torch layers: Sequential, Linear, Conv2d"):
        assert part in msg


@pytest.mark.parametrize("layer, what", [
    (lambda: tnn.Conv2d(2, 2, 3, padding="same"), "padding='same'"),
    (lambda: tnn.Conv2d(2, 2, 3, padding_mode="reflect"), "padding_mode='reflect'"),
    (lambda: tnn.BatchNorm2d(3, affine=False), "affine=False"),
    (lambda: tnn.BatchNorm2d(3, momentum=None), "momentum=None"),
    (lambda: tnn.AvgPool2d(2, count_include_pad=False), "count_include_pad=False"),
    (lambda: tnn.Softmax(), "dim=None"),
])
def test_unsupported_settings(layer, what):
    with pytest.raises(NotImplementedError, match="layer 0.*" + re.escape(what)):
        nn.from_torch(tnn.Sequential(layer()))


def test_not_a_torch_module():
    with pytest.raises(TypeError, match="expects a torch.nn.Sequential"):
        nn.from_torch(nn.Sequential(nn.ReLU()))
    with pytest.raises(TypeError):
        nn.from_torch({"0.weight": np.zeros((2, 2))})


# layers that other branches add to netcl.nn: one CONVERTERS entry each, tested once they exist
MODERN = [("GELU", lambda: tnn.GELU(approximate="tanh"), (2, 7)), ("SiLU", tnn.SiLU, (2, 7)),
          ("ReLU6", tnn.ReLU6, (2, 7)), ("Hardswish", tnn.Hardswish, (2, 7)), ("Hardsigmoid", tnn.Hardsigmoid, (2, 7)),
          ("LayerNorm", lambda: tnn.LayerNorm(7), (2, 3, 7)),
          ("AdaptiveAvgPool2d", lambda: tnn.AdaptiveAvgPool2d(1), (2, 3, 5, 5)),
          ("ConvTranspose2d", lambda: tnn.ConvTranspose2d(3, 2, 3, stride=2, padding=1, output_padding=1), (2, 3, 4, 4)),
          ("Flatten", lambda: tnn.Flatten(0, 1), (2, 3, 4))]


@pytest.mark.parametrize("name, layer, shape", MODERN, ids=[f[0] for f in MODERN])
def test_layers_of_modern_architectures(name, layer, shape, queue, rng):
    assert name in torch_import.supported()
    torch.manual_seed(1)
    tm = tnn.Sequential(layer()).eval()
    model = nn.from_torch(tm)
    x = rng.standard_normal(shape).astype(np.float32)
    with torch.no_grad():
        want = tm.double()(torch.from_numpy(x).double()).numpy()
    assert np.abs(model(Tensor.from_host(queue, x)).to_host() - want).max() <= 1e-5
