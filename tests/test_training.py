"""Sequential's API, a whole model against PyTorch, and a small CNN trained on scikit-learn's
digits to at least 95% test accuracy."""
import time

import numpy as np
import pytest
from conftest import assert_close

import netcl
from netcl import Tensor, nn, optim


def small_cnn():
    return nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.BatchNorm2d(3), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(3 * 2 * 3, 4, bias=False))


def grads(model):
    return [p.grad.to_host() for p in model.parameters()]


def test_parameters_and_state_dict_names(queue):
    model = small_cnn()
    conv, bn, lin = model[0], model[1], model[5]
    expect = [conv.weight, conv.bias, bn.weight, bn.bias, lin.weight]
    assert len(model.parameters()) == len(expect)
    assert all(a is b for a, b in zip(model.parameters(), expect))  # layer order, weight before bias
    assert list(model.state_dict()) == ["0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean",
                                        "1.running_var", "5.weight"]
    assert model.state_dict()["5.weight"].shape == (18, 4)  # Linear: (in, out)


def test_load_state_dict(queue, rng):
    model, other = small_cnn(), small_cnn()
    sd = {k: rng.standard_normal(a.shape).astype(np.float32) for k, a in other.state_dict().items()}
    sd["1.running_var"] = np.abs(sd["1.running_var"])
    model(Tensor.from_host(queue, rng.standard_normal((2, 2, 4, 6))))  # parameters now on the device
    assert model.load_state_dict(sd) is model
    for k, a in model.state_dict().items():
        np.testing.assert_array_equal(a, sd[k])
    before = model.state_dict()
    bad = dict(sd, **{"0.weight": np.zeros((3, 2, 5, 5), np.float32)})
    with pytest.raises(ValueError, match=r"0\.weight"):
        model.load_state_dict(bad)
    missing = {k: v for k, v in sd.items() if k != "1.running_mean"}
    with pytest.raises(ValueError, match=r"1\.running_mean"):
        model.load_state_dict(missing)
    with pytest.raises(ValueError, match=r"7\.weight"):
        model.load_state_dict(dict(sd, **{"7.weight": np.zeros(3)}))
    for k, a in model.state_dict().items():  # a refused load changes nothing
        np.testing.assert_array_equal(a, before[k])
    # a torch-style state dict (with BatchNorm's num_batches_tracked) loads
    model.load_state_dict(dict(sd, **{"1.num_batches_tracked": np.array(3)}))


def test_modes_indexing_len(queue):
    model = small_cnn()
    assert len(model) == 6 and isinstance(model[2], nn.ReLU) and model[-1] is model.layers[5]
    assert isinstance(model[1:3], nn.Sequential) and len(model[1:3]) == 2
    assert model.eval() is model and not model.training and not any(m.training for m in model)
    assert model.train() is model and model.training and all(m.training for m in model)
    with pytest.raises(TypeError):
        nn.Sequential(nn.ReLU(), "relu")
    with pytest.raises(TypeError):
        model(np.zeros((1, 2, 4, 6), np.float32))


def test_gradients_accumulate_across_backward_calls(queue, rng):
    model = nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.BatchNorm2d(3), nn.Tanh(), nn.Flatten(),
                          nn.Linear(3 * 4 * 6, 5), nn.Sigmoid())
    xs = [rng.standard_normal((3, 2, 4, 6)).astype(np.float32) for _ in range(2)]
    dys = [rng.standard_normal((3, 5)).astype(np.float32) for _ in range(2)]
    single = []
    for x, dy in zip(xs, dys):
        model.zero_grad()
        model(Tensor.from_host(queue, x))
        model.backward(Tensor.from_host(queue, dy))
        single.append(grads(model))
    model.zero_grad()
    assert all(p.grad is None for p in model.parameters())
    for x, dy in zip(xs, dys):
        model(Tensor.from_host(queue, x))
        model.backward(Tensor.from_host(queue, dy))
    for a, b, total in zip(*single, grads(model)):
        assert_close(total, a + b, what="accumulated gradient")


INPUT_GRAD_MODELS = {
    # first layer: a conv on each CPU path (rows: 16 wide, stride 1; channels: narrow; im2col: 1x1) ...
    "conv rows": (lambda: nn.Sequential(nn.Conv2d(2, 5, 3, padding=1), nn.BatchNorm2d(5), nn.ReLU(),
                                        nn.Flatten(), nn.Linear(5 * 4 * 16, 3)), (3, 2, 4, 16)),
    "conv channels": (lambda: nn.Sequential(nn.Conv2d(3, 4, 3, stride=2, padding=1), nn.Tanh(), nn.Flatten(),
                                            nn.Linear(4 * 3 * 3, 2)), (2, 3, 6, 6)),
    "conv 1x1": (lambda: nn.Sequential(nn.Conv2d(3, 4, 1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 25, 2)),
                 (2, 3, 5, 5)),
    "depthwise": (lambda: nn.Sequential(nn.Conv2d(4, 4, 3, padding=1, groups=4), nn.Flatten(),
                                        nn.Linear(4 * 16, 2)), (2, 4, 4, 4)),
    # ... parameter-free layers before the first Linear, and a block first (its own full backward)
    "flatten first": (lambda: nn.Sequential(nn.Sigmoid(), nn.Flatten(), nn.Linear(12, 5), nn.ReLU(),
                                            nn.Linear(5, 2)), (4, 3, 4)),
    "residual first": (lambda: nn.Sequential(nn.Residual(nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 6)),
                                             nn.Linear(6, 2)), (3, 6)),
}


@pytest.mark.parametrize("kernels", ["device", "gpu"])
@pytest.mark.parametrize("name", INPUT_GRAD_MODELS)
def test_backward_without_the_input_gradient(queue, rng, monkeypatch, name, kernels):
    """backward(dy, input_grad=False) gives every parameter the gradient backward(dy) gives it,
    returns None and launches fewer kernels where the first layer's data gradient costs some
    (the device's kernels, and the GPU ones forced on it)."""
    from netcl import ops

    if kernels == "gpu":
        monkeypatch.setattr(ops, "_config_class", {queue.device.int_ptr: "gpu"})
    make, shape = INPUT_GRAD_MODELS[name]
    x = Tensor.from_host(queue, rng.standard_normal(shape).astype(np.float32))
    netcl.manual_seed(3)
    model = make().to(queue)
    dy = rng.standard_normal(model.output_shape(shape)).astype(np.float32)
    launches = []
    for input_grad in (True, False):
        model.zero_grad()
        model(x)
        calls = []
        real = ops._enqueue
        ops._enqueue = lambda *a: calls.append(1) or real(*a)
        try:
            dx = model.backward(Tensor.from_host(queue, dy), input_grad=input_grad)
        finally:
            ops._enqueue = real
        launches.append(len(calls))
        if input_grad:
            assert dx is not None and dx.shape == shape
            full = grads(model)
        else:
            assert dx is None
            for a, b in zip(grads(model), full):
                np.testing.assert_array_equal(a, b)
    if name != "residual first":
        assert launches[1] < launches[0], launches


def test_sequential_vs_torch(queue, rng):
    """A whole model, forward and backward, parameters and running statistics, vs PyTorch."""
    torch = pytest.importorskip("torch")
    model = nn.Sequential(nn.Conv2d(3, 6, 3, stride=2, padding=1), nn.BatchNorm2d(6), nn.LeakyReLU(0.1),
                          nn.AvgPool2d(2), nn.Conv2d(6, 5, 1), nn.ReLU(), nn.MaxPool2d(3, stride=1, padding=1),
                          nn.Flatten(), nn.Dropout(0.0), nn.Linear(5 * 2 * 2, 7), nn.Softmax(1))
    tmod = torch.nn.Sequential(torch.nn.Conv2d(3, 6, 3, stride=2, padding=1), torch.nn.BatchNorm2d(6),
                               torch.nn.LeakyReLU(0.1), torch.nn.AvgPool2d(2), torch.nn.Conv2d(6, 5, 1),
                               torch.nn.ReLU(), torch.nn.MaxPool2d(3, stride=1, padding=1), torch.nn.Flatten(),
                               torch.nn.Dropout(0.0), torch.nn.Linear(5 * 2 * 2, 7), torch.nn.Softmax(1)).double()
    sd = model.state_dict()
    tmod.load_state_dict({k: torch.tensor(v.T if k == "9.weight" else v) for k, v in sd.items()}, strict=False)
    x, dy = rng.standard_normal((2, 3, 9, 9)).astype(np.float32), rng.standard_normal((2, 7)).astype(np.float32)
    y = model(Tensor.from_host(queue, x)).to_host()
    dx = model.backward(Tensor.from_host(queue, dy)).to_host()
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    yt = tmod(xt)
    yt.backward(torch.tensor(dy, dtype=torch.float64))
    assert_close(y, yt.detach().numpy(), what="forward")
    assert_close(dx, xt.grad.numpy(), what="dx")
    tparams = dict(tmod.named_parameters())
    for (k, p) in model.named_parameters():
        ref = tparams[k].grad.numpy()
        assert_close(p.grad.to_host(), ref.T if k == "9.weight" else ref, what=k)
    tsd = tmod.state_dict()
    for k in ("1.running_mean", "1.running_var"):
        assert_close(model.state_dict()[k], tsd[k].numpy(), what=k)


def test_eval_mode_backward_vs_torch(queue, rng):
    """Gradients in eval mode (running statistics), also after the fused inference forward."""
    torch = pytest.importorskip("torch")
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Dropout(0.5), nn.Linear(4 * 3 * 3, 5))
    sd = model.state_dict()
    sd["1.running_mean"], sd["1.running_var"] = rng.standard_normal(4), rng.uniform(0.5, 2, 4)
    model.load_state_dict(sd)
    tmod = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                               torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Dropout(0.5),
                               torch.nn.Linear(4 * 3 * 3, 5)).double().eval()
    tmod.load_state_dict({k: torch.tensor(v.T if k == "6.weight" else v) for k, v in sd.items()}, strict=False)
    x, dy = rng.standard_normal((2, 3, 6, 6)).astype(np.float32), rng.standard_normal((2, 5)).astype(np.float32)
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    tmod(xt).backward(torch.tensor(dy, dtype=torch.float64))
    model.eval()
    for _ in range(2):  # the same gradients each time: nothing is left over from the first pass
        model.zero_grad()
        model(Tensor.from_host(queue, x))
        assert_close(model.backward(Tensor.from_host(queue, dy)).to_host(), xt.grad.numpy(), what="dx")
        tparams = dict(tmod.named_parameters())
        for k, p in model.named_parameters():
            ref = tparams[k].grad.numpy()
            assert_close(p.grad.to_host(), ref.T if k == "6.weight" else ref, what=k)
    np.testing.assert_array_equal(model.state_dict()["1.running_var"], sd["1.running_var"].astype(np.float32))
    # an eval (fused) forward, then train(), then backward: the replay follows the forward's mode
    # (running statistics, left unchanged), not the mode set since
    model.zero_grad()
    model(Tensor.from_host(queue, x))
    model.train()
    assert_close(model.backward(Tensor.from_host(queue, dy)).to_host(), xt.grad.numpy(), what="dx after train()")
    np.testing.assert_array_equal(model.state_dict()["1.running_var"], sd["1.running_var"].astype(np.float32))
    assert model.training and model[1].training


def test_digits_cnn_reaches_95_percent(queue, record_note):
    """Conv-BN-ReLU-Pool x2 + Linear, Adam, batch 64, 5 epochs on the 8x8 digits of scikit-learn."""
    datasets = pytest.importorskip("sklearn.datasets")
    from sklearn.model_selection import train_test_split

    digits = datasets.load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None]  # (1797, 1, 8, 8)
    xtr, xte, ytr, yte = train_test_split(x, digits.target, test_size=0.25, random_state=0, stratify=digits.target)
    netcl.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(32 * 2 * 2, 10))
    opt = optim.Adam(model.parameters(), lr=1e-2)
    loss_fn = nn.CrossEntropyLoss()
    shuffle = np.random.default_rng(0)
    start = time.perf_counter()
    losses = []
    for epoch in range(5):
        model.train()
        perm = shuffle.permutation(len(xtr))
        for i in range(0, len(perm), 64):
            b = perm[i:i + 64]
            losses.append(loss_fn(model(Tensor.from_host(queue, xtr[b])), ytr[b]))
            model.backward(loss_fn.backward())
            opt.step()
            opt.zero_grad()
    seconds = time.perf_counter() - start
    model.eval()
    accuracy = float((model(Tensor.from_host(queue, xte)).to_host().argmax(1) == yte).mean())
    record_note(f"digits CNN: test accuracy {accuracy:.4f} on {len(yte)} images, "
                f"training {seconds:.1f} s (5 epochs of {len(xtr)} images, batch 64)")
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5])
    assert accuracy >= 0.95, f"digits test accuracy {accuracy:.3f} < 0.95"
