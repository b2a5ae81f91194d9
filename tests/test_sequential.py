"""Sequential's contract at its edges: slicing, atomic load_state_dict, predict, clear errors."""
import numpy as np
import pytest

from netcl import Tensor, models, nn


def test_slice_keeps_the_mode(queue, rng):
    model = models.cnn().eval()
    assert model[0:3].training is False
    assert models.cnn().train()[0:3].training is True
    # a slice shares the layers and leaves each one's own mode alone (it once called train() on them)
    model = models.cnn().train()
    model[1].eval()  # a frozen BatchNorm2d: running statistics in a training model
    part = model[0:4]
    assert part.training is True and model[1].training is False and model[0].training is True
    x = Tensor.from_host(queue, rng.standard_normal((2, 3, 32, 32)).astype(np.float32))
    assert np.array_equal(part(x).to_host(), model[3](model[2](model[1](model[0](x)))).to_host())
    model.eval()
    model[1].train()
    assert model[0:4].training is False and model[1].training is True
    ev = models.cnn().eval()
    ev.to(queue)
    assert ev[:]._fused is not None and np.array_equal(ev[:](x).to_host(), ev(x).to_host())  # fused too


def test_failed_load_state_dict_changes_nothing():
    model = models.mlp()
    before = model.state_dict()
    bad = dict(before)
    bad["0.weight"] = before["0.weight"] + 1
    bad["4.bias"] = np.array(["a"] * 10)
    with pytest.raises(TypeError, match="'4.bias'"):
        model.load_state_dict(bad)
    for k, v in model.state_dict().items():
        assert np.array_equal(v, before[k]), k


def test_predict_equals_forward(queue, rng):
    model = models.cnn().eval()
    x = rng.standard_normal((3, 3, 32, 32)).astype(np.float32)
    y = model.predict(x, queue)
    ref = Tensor.from_host(queue, x)
    for layer in model:  # the unfused layers, one by one
        ref = layer(ref)
    assert y.shape == ref.shape == (3, 10)
    np.testing.assert_allclose(y, ref.to_host(), atol=1e-5)


def test_predict_needs_eval():
    with pytest.raises(RuntimeError, match="eval"):
        models.mlp().predict(np.zeros((1, 64), np.float32))


def test_backward_errors(queue):
    model = models.mlp()
    with pytest.raises(RuntimeError, match="forward pass first"):
        model.backward(Tensor.from_host(queue, np.zeros((2, 10))))
    model(Tensor.from_host(queue, np.zeros((2, 64))))
    with pytest.raises(TypeError, match="netcl Tensor"):
        model.backward(np.zeros((2, 10)))
    with pytest.raises(ValueError, match=r"\(2, 10\)"):
        model.backward(Tensor.from_host(queue, np.zeros((3, 10))))


def test_batchnorm_needs_two_values_per_channel_in_training(queue):
    with pytest.raises(ValueError, match="more than one value per channel"):
        nn.BatchNorm2d(2)(Tensor.from_host(queue, np.ones((1, 2, 1, 1))))
    assert nn.BatchNorm2d(2).eval()(Tensor.from_host(queue, np.ones((1, 2, 1, 1)))).shape == (1, 2, 1, 1)


@pytest.mark.parametrize("layer", [nn.Conv2d(3, 2, 3), nn.MaxPool2d(2), nn.AvgPool2d(2), nn.BatchNorm2d(3)])
def test_four_d_layers_reject_other_ranks(queue, layer):
    with pytest.raises(ValueError, match=r"4-D input"):
        layer(Tensor.from_host(queue, np.zeros((3, 8, 8))))


def test_second_backward_without_forward_raises(queue):
    model = nn.Sequential(nn.Linear(3, 2)).train()
    y = model(Tensor.from_host(queue, np.ones((4, 3), np.float32)))
    model.backward(Tensor.from_host(queue, np.ones(y.shape, np.float32)))
    g = model[0].weight.grad.to_host()
    with pytest.raises(RuntimeError, match="once per forward"):
        model.backward(Tensor.from_host(queue, np.ones(y.shape, np.float32)))
    assert np.array_equal(model[0].weight.grad.to_host(), g)  # not doubled


@pytest.mark.parametrize("model", [nn.Sequential(nn.Linear(3, 2)), nn.Sequential(nn.Softmax(dim=1))])
def test_predict_refuses_complex_input(queue, model):
    with pytest.raises(TypeError, match="float32"):
        model.eval().predict(np.ones((2, 3), np.complex64), queue)
