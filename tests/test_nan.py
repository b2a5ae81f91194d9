"""NaN and Inf propagate as in PyTorch: a NaN input never turns into a finite, wrong output."""
import numpy as np
import pytest

from netcl import Tensor, nn

torch = pytest.importorskip("torch")

LAYERS = {  # netcl layer, the torch module that is its reference
    "ReLU": (nn.ReLU, torch.nn.ReLU), "LeakyReLU": (lambda: nn.LeakyReLU(0.1), lambda: torch.nn.LeakyReLU(0.1)),
    "Sigmoid": (nn.Sigmoid, torch.nn.Sigmoid), "Tanh": (nn.Tanh, torch.nn.Tanh),
    "MaxPool2d": (lambda: nn.MaxPool2d(2), lambda: torch.nn.MaxPool2d(2)),
    "AvgPool2d": (lambda: nn.AvgPool2d(2), lambda: torch.nn.AvgPool2d(2)),
    "Softmax": (lambda: nn.Softmax(dim=1), lambda: torch.nn.Softmax(dim=1)),
    "BatchNorm2d": (lambda: nn.BatchNorm2d(3), lambda: torch.nn.BatchNorm2d(3)),
    "GELU-tanh": (lambda: nn.GELU("tanh"), lambda: torch.nn.GELU("tanh")), "SiLU": (nn.SiLU, torch.nn.SiLU),
    "ReLU6": (nn.ReLU6, torch.nn.ReLU6), "Hardswish": (nn.Hardswish, torch.nn.Hardswish),
    "Hardsigmoid": (nn.Hardsigmoid, torch.nn.Hardsigmoid),
    "LayerNorm": (lambda: nn.LayerNorm(4), lambda: torch.nn.LayerNorm(4)),
    "AdaptiveAvgPool2d": (lambda: nn.AdaptiveAvgPool2d(3), lambda: torch.nn.AdaptiveAvgPool2d(3)),
    "ELU": (lambda: nn.ELU(0.5), lambda: torch.nn.ELU(0.5)), "Mish": (nn.Mish, torch.nn.Mish),
    "Softplus": (lambda: nn.Softplus(2.0, 5.0), lambda: torch.nn.Softplus(2.0, 5.0)),
    "PReLU": (lambda: nn.PReLU(3), lambda: torch.nn.PReLU(3)),
    "LogSoftmax": (lambda: nn.LogSoftmax(dim=1), lambda: torch.nn.LogSoftmax(dim=1)),
}


def _input(rng):
    x = rng.normal(size=(2, 3, 4, 4)).astype(np.float32)
    x[0, 0, 0, 0], x[1, 2, 3, 1] = np.nan, np.inf
    x[1, 1, 2, 2] = -np.inf
    return x


@pytest.mark.parametrize("name", sorted(LAYERS))
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_nan_and_inf_propagate_like_torch(queue, rng, name, mode):
    make, make_ref = LAYERS[name]
    x = _input(rng)
    layer, ref = make(), make_ref()
    layer.train(mode == "train")
    ref.train(mode == "train")
    got = layer(Tensor.from_host(queue, x)).to_host()
    want = ref(torch.from_numpy(x)).detach().numpy()
    assert np.array_equal(np.isnan(got), np.isnan(want)), name
    assert np.array_equal(np.isinf(got), np.isinf(want)) and np.array_equal(got[np.isinf(got)], want[np.isinf(want)])


def test_gelu_keeps_nan(queue):
    """GELU: NaN stays NaN and -inf gives NaN (-inf * 0), as in PyTorch; +inf gives +inf, as PyTorch's
    scalar path does (its vectorised CPU path returns NaN there)."""
    x = np.array([[np.nan, -np.inf, np.inf, -2.0, 0.0, 2.0]], np.float32)
    y = nn.GELU()(Tensor.from_host(queue, x)).to_host()[0]
    assert np.isnan(y[:2]).all() and y[2] == np.inf and np.isfinite(y[3:]).all()
