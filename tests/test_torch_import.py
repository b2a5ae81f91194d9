"""nn.from_torch: torch.nn.Sequential models -> netcl models with the same layers and weights, and
modules with a forward of their own through torch.fx, held against torch's own outputs (eval mode)
and gradients (float64 references)."""
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
            return torch.cumsum(x, 1)

    tm = tnn.Sequential(tnn.Linear(4, 4), tnn.SELU(), tnn.Sequential(tnn.Conv2d(1, 1, 3, padding_mode="circular"), Mine()),
                        tnn.MaxPool2d(2, dilation=2))
    with pytest.raises(NotImplementedError) as e:
        nn.from_torch(tm)
    msg = str(e.value)
    for part in ("layer 1 (SELU)", "layer 2.0 (Conv2d): padding_mode='circular'", "layer 2.1 (Mine): node cumsum",
                 "layer 3 (MaxPool2d): dilation=2", "Supported torch layers: Sequential, Linear, Conv2d"):
        assert part in msg


@pytest.mark.parametrize("layer, what", [
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
    with pytest.raises(TypeError, match="expects a torch.nn.Module"):
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


# -- modules with a forward of their own: torch.fx ------------------------------------------------
class Block(tnn.Module):
    """torchvision's BasicBlock: an in-place residual add, a downsampling branch held or None."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1, self.bn1 = tnn.Conv2d(cin, cout, 3, stride, 1, bias=False), tnn.BatchNorm2d(cout)
        self.conv2, self.bn2 = tnn.Conv2d(cout, cout, 3, 1, 1, bias=False), tnn.BatchNorm2d(cout)
        self.relu = tnn.ReLU(inplace=True)
        self.down = None if stride == 1 and cin == cout else tnn.Sequential(
            tnn.Conv2d(cin, cout, 1, stride, bias=False), tnn.BatchNorm2d(cout))

    def forward(self, x):
        identity = x if self.down is None else self.down(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        return self.relu(out)


class ResNetish(tnn.Module):
    def __init__(self):
        super().__init__()
        self.stem = tnn.Conv2d(3, 8, 3, padding=1)
        self.layer1 = tnn.Sequential(Block(8, 8, 1), Block(8, 16, 2))
        self.pool, self.fc = tnn.AdaptiveAvgPool2d(1), tnn.Linear(16, 16)  # (a square Linear)

    def forward(self, x):
        x = torch.nn.functional.relu(self.stem(x))
        return self.fc(torch.flatten(self.pool(self.layer1(x)), 1))


class Mixer(tnn.Module):
    """Operations between layers: a free parameter, attention-like matmuls, view by x.size(0), cat."""

    def __init__(self):
        super().__init__()
        self.proj, self.norm = tnn.Linear(8, 8), tnn.LayerNorm(8)
        self.scale = tnn.Parameter(torch.tensor(0.7))
        self.head = tnn.Linear(4 * 8 + 4, 3)

    def forward(self, x):  # (N, 4, 8)
        h = self.norm(x)
        a = torch.softmax(self.proj(h) @ h.transpose(1, 2) * self.scale, dim=-1)
        y = a @ h + x
        stats = y.mean(2)
        return self.head(torch.cat([y.view(x.size(0), -1), stats.sigmoid()], dim=1))


class Encoder(tnn.Module):
    """A transformer layer as torchvision writes one: torch's MultiheadAttention (batch first, its
    weights taken and never read), chunk, GELU, LayerNorm."""

    def __init__(self):
        super().__init__()
        self.ln, self.attn = tnn.LayerNorm(8), tnn.MultiheadAttention(8, 2, batch_first=True)
        self.mlp = tnn.Sequential(tnn.Linear(4, 16), tnn.GELU(), tnn.Linear(16, 4))

    def forward(self, x):  # (N, 5, 8)
        h = self.ln(x)
        y, _ = self.attn(h, h, h, need_weights=False)
        a, b = (x + y).chunk(2, dim=-1)
        return torch.cat([a, self.mlp(b)], dim=-1).mean(1)


FX_MODELS = {"resnetish": (ResNetish, (2, 3, 16, 16)), "mixer": (Mixer, (3, 4, 8)), "encoder": (Encoder, (2, 5, 8))}


@pytest.mark.parametrize("name", sorted(FX_MODELS))
def test_a_module_with_its_own_forward_converts_through_fx(name, queue, rng, tmp_path, record_error):
    build, shape = FX_MODELS[name]
    torch.manual_seed(0)
    tm = randomize(build()).eval()
    model = nn.from_torch(tm).to(queue)
    assert type(model).__name__ == "TorchGraph" and not model.training
    assert list(model.state_dict()) == [k for k in tm.state_dict() if not k.endswith("num_batches_tracked")]
    x = rng.standard_normal(shape).astype(np.float32)
    with torch.no_grad():
        want = tm.double()(torch.from_numpy(x).double()).numpy()
    import netcl

    with netcl.no_grad():
        got = model(Tensor.from_host(queue, x)).to_host()
    err = float(np.abs(got - want).max())
    record_error(err)
    assert err <= 1e-5
    gm = netcl.trace(model, x)  # a GraphModule: a residual network lifts to the fused Sequential
    assert (gm.lifted is not None) == (name == "resnetish")
    assert float(np.abs(gm.predict(x, queue) - want).max()) <= 1e-5
    ort = pytest.importorskip("onnxruntime")
    netcl.io.export_onnx(model, shape, tmp_path / "m.onnx")
    onnx_out = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"]).run(
        None, {"input": x})[0]
    assert float(np.abs(onnx_out - want).max()) <= 1e-5


@pytest.mark.parametrize("name", sorted(FX_MODELS))
def test_a_module_converted_through_fx_has_torch_gradients(name, queue, rng, record_error):
    import netcl

    build, shape = FX_MODELS[name]
    torch.manual_seed(1)
    tm = randomize(build()).double().train()
    model = nn.from_torch(tm).to(queue)
    assert model.training
    x = rng.standard_normal(shape)
    yt = tm(torch.from_numpy(x))
    dy = rng.standard_normal(tuple(yt.shape))
    (yt * torch.from_numpy(dy)).sum().backward()
    y = model(netcl.tensor(x.astype(np.float32), queue=queue))
    (y * netcl.tensor(dy.astype(np.float32), queue=queue)).sum().backward()
    fwd = float(np.abs(y.numpy() - yt.detach().numpy()).max())
    theirs = dict(tm.named_parameters())
    worst = 0.0
    for key, p in model.named_parameters():
        g = theirs[key].grad.numpy()
        ours = p.grad.numpy()
        if isinstance(dict(model.named_modules()).get(key.rpartition(".")[0]), nn.Linear) and key.endswith("weight"):
            ours = ours.T  # (netcl's Linear stores (in, out))
        worst = max(worst, float(np.abs(ours - g).max() / max(1.0, np.abs(g).max())))
    record_error(fwd, worst)
    assert fwd <= 1e-4 and worst <= 1e-4


def test_what_fx_cannot_convert_is_named_node_by_node():
    class Odd(tnn.Module):
        def __init__(self):
            super().__init__()
            self.rnn, self.lin = tnn.RNN(4, 4), tnn.Linear(4, 4)  # (a plain RNN: netcl has LSTM and GRU)

        def forward(self, x):
            y = torch.add(self.lin(x), x, alpha=2.0)
            return torch.cumsum(y, 1) + x.cummax(1)[0] + self.rnn(y)[0]

    with pytest.raises(NotImplementedError) as e:
        nn.from_torch(Odd())
    msg = str(e.value)
    for part in ("layer rnn (RNN): not supported", "netcl's add does not take ['alpha']",
                 "netcl has no counterpart of torch.cumsum", "netcl's Tensor has no method 'cummax'",
                 "Supported torch layers:"):
        assert part in msg, part

    class Branchy(tnn.Module):
        def forward(self, x):
            return x if x.sum() > 0 else -x

    with pytest.raises(NotImplementedError, match="torch.fx"):
        nn.from_torch(Branchy())

    class CrossAttention(tnn.Module):
        def __init__(self):
            super().__init__()
            self.attn = tnn.MultiheadAttention(4, 2, batch_first=True)

        def forward(self, x):
            return self.attn(x, x * 2, x)[0] + self.attn(x, x, x)[1].sum()

    with pytest.raises(NotImplementedError) as e:
        nn.from_torch(CrossAttention())
    assert "query, key and value differ" in str(e.value) and "the attention weights are used" in str(e.value)


def test_stochastic_depth_drops_whole_rows_in_training_only(queue):
    import netcl
    from netcl.nn import functional as F

    x = netcl.tensor(np.ones((64, 3, 2, 2), np.float32), queue=queue)
    assert F.stochastic_depth(x, 0.5, "row", training=False) is x
    y = F.stochastic_depth(x, 0.5, "row").numpy().reshape(64, -1)
    assert set(np.unique(y)) <= {0.0, 2.0} and all(len(set(r)) == 1 for r in y) and 0 < (y[:, 0] == 0).sum() < 64
