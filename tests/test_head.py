"""A classifier's head as one kernel (CrossEntropyLoss.enqueue_linear, head_cpu.cl): the Linear's
forward, the cross-entropy and every gradient against float64 PyTorch; and netcl.TrainStep, which
runs a CPU classifier's last Linear that way, against what it stands for."""
import numpy as np
import pytest
from conftest import assert_close, loop_step

import netcl
from netcl import Tensor, TrainStep, models, nn, ops, optim, trainstep
from netcl.nn import sequential


@pytest.fixture
def cpu(queue):
    if not ops.is_cpu(queue):
        pytest.skip("the one-kernel head runs on CPU devices")
    return queue


# (rows, inputs, classes, bias): a classifier's 10; 16 (whole vectors of W, no row read past), 1, 3
# (rows of W read past by more than one row), inputs not a multiple of 4 or 16, one row
SHAPES = [(64, 64, 10, True), (8, 512, 10, True), (5, 7, 3, False), (3, 33, 16, True), (1, 1, 1, True),
          (17, 130, 11, True), (6, 20, 2, False)]


@pytest.mark.parametrize("n,IN,C,bias", SHAPES)
@pytest.mark.parametrize("accumulate", [False, True])
def test_head_vs_torch(cpu, rng, torch, record_error, n, IN, C, bias, accumulate):
    lin = nn.Linear(IN, C, bias=bias).to(cpu).train()
    x = rng.standard_normal((n, IN)).astype(np.float32)
    labels = rng.integers(0, C, n)
    before = {}
    if accumulate:  # gradients already there (a parameter used twice): added to, as Linear.backward does
        for name, p in lin._params.items():
            before[name] = rng.standard_normal(p.shape).astype(np.float32)
            p.grad = Tensor.from_host(cpu, before[name])
    loss_fn = nn.CrossEntropyLoss()
    logits, pending, dx = loss_fn.enqueue_linear(lin, Tensor.from_host(cpu, x), labels)

    tx = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    tw = torch.tensor(lin.weight.to_host(), dtype=torch.float64, requires_grad=True)
    tb = torch.tensor(lin.bias.to_host(), dtype=torch.float64, requires_grad=True) if bias else None
    tz = tx @ tw + (tb if bias else 0)
    tz.retain_grad()
    loss = torch.nn.functional.cross_entropy(tz, torch.tensor(labels))
    loss.backward()
    fwd = assert_close(logits.to_host(), tz.detach().numpy(), what="logits")
    assert abs(pending.item() - loss.item()) <= 1e-6 * max(1.0, abs(loss.item()))
    errs = [assert_close(loss_fn.backward().to_host(), tz.grad.numpy(), what="dL/dlogits"),
            assert_close(dx.to_host(), tx.grad.numpy(), what="dx"),
            assert_close(lin.weight.grad.to_host(), tw.grad.numpy() + before.get("weight", 0), what="dW")]
    if bias:
        errs.append(assert_close(lin.bias.grad.to_host(), tb.grad.numpy() + before.get("bias", 0), what="db"))
    record_error(fwd, max(errs))


def test_head_without_input_gradient_and_its_errors(cpu, rng):
    lin = nn.Linear(6, 4).to(cpu).train()
    x = Tensor.from_host(cpu, rng.standard_normal((3, 6)).astype(np.float32))
    logits, pending, dx = nn.CrossEntropyLoss().enqueue_linear(lin, x, [0, 1, 3], input_grad=False)
    assert dx is None and logits.shape == (3, 4) and np.isfinite(pending.item()) and lin.weight.grad is not None
    with pytest.raises(ValueError, match="at most 16 outputs"):
        nn.CrossEntropyLoss().enqueue_linear(nn.Linear(6, 17).to(cpu), x, [0, 1, 2])
    with pytest.raises(ValueError, match=r"\(N, C\) prediction"):
        nn.CrossEntropyLoss().enqueue_linear(lin, Tensor.from_host(cpu, np.zeros((3, 2, 6), np.float32)), [0, 1, 2])
    with pytest.raises(ValueError, match=r"integers in \[0, 4\)"):
        nn.CrossEntropyLoss().enqueue_linear(lin, x, [0, 1, 4])  # host labels: checked at once


def test_head_refuses_device_labels_out_of_range(cpu, rng):
    """Labels on the device are checked by the kernel, as cross_entropy does: the row of a refused one
    gets a zero gradient and the loss's item() raises."""
    lin = nn.Linear(5, 3).to(cpu).train()
    x = Tensor.from_host(cpu, rng.standard_normal((4, 5)).astype(np.float32))
    loss_fn = nn.CrossEntropyLoss()
    _, pending, _ = loss_fn.enqueue_linear(lin, x, Tensor.from_host(cpu, np.array([0, 2, 3, 1.5], np.float32)))
    with pytest.raises(ValueError, match=r"integers in \[0, 3\)"):
        pending.item()
    g = loss_fn.backward().to_host()
    assert np.all(g[2:] == 0) and np.any(g[:2] != 0)


def classifier():
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Dropout(0.25), nn.Linear(8 * 4 * 4, 10))


def head_step(model, loss_fn, opt, x, y):
    """What TrainStep runs for a classifier on a CPU: the layers before the Linear, the head as one
    kernel, their backward, the optimizer."""
    xt = Tensor.from_host(model.parameters()[0].queue, x)
    body = nn.Sequential(*model.layers[:-1])
    model.forward_output, pending, dh = loss_fn.enqueue_linear(model.layers[-1], body(xt), y)
    body.backward(dh, input_grad=False)
    opt.step()
    opt.zero_grad()
    return pending


@pytest.mark.parametrize("build,opt_name", [(classifier, "Adam"), (models.resnet8, "SGD")])
def test_trainstep_runs_the_head_as_one_kernel(cpu, rng, build, opt_name):
    """Replayed, the step is head_step bit for bit (Dropout's seed and Adam's corrections drawn
    anew each replay, the generator reseeded for each run); five launches fewer than the layer
    calls, and within float32 noise of them (the losses; with SGD every parameter and buffer)."""
    shape = (4, 3, 8, 8) if build is classifier else (2, 3, 32, 32)
    data = [(rng.standard_normal(shape).astype(np.float32), rng.integers(0, 10, shape[0])) for _ in range(6)]

    def run(step_fn, head_max=trainstep._HEAD_MAX):
        netcl.manual_seed(0)
        model = build().to(cpu).train()
        trio = (model, nn.CrossEntropyLoss(), getattr(optim, opt_name)(model.parameters(), lr=0.01))
        old, trainstep._HEAD_MAX = trainstep._HEAD_MAX, head_max
        try:
            step = step_fn(*trio)
            netcl.manual_seed(1)
            losses, outputs = [], []
            for x, y in data:
                losses.append(step(x, y) if isinstance(step, TrainStep) else step_fn(*trio, x, y))
                outputs.append((step.output if isinstance(step, TrainStep) else model.forward_output).numpy())
        finally:
            trainstep._HEAD_MAX = old
        return model, [p.item() for p in losses], outputs, step

    fused, fused_losses, fused_out, step = run(TrainStep)
    ref, ref_losses, ref_out, _ = run(lambda *a: None if len(a) == 3 else head_step(*a))
    layers, layer_losses, _, _ = run(lambda *a: None if len(a) == 3 else loop_step(*a))
    _, _, _, plain = run(TrainStep, head_max=0)
    assert step.replays == 3 and step.eager_reason is None and plain.replays == 3
    assert fused_losses == ref_losses and len(set(fused_losses)) == len(fused_losses)
    for a, b in zip(fused_out, ref_out):
        np.testing.assert_array_equal(a, b)
    for (key, a), (_, b), (_, c) in zip(fused.named_tensors(), ref.named_tensors(), layers.named_tensors()):
        np.testing.assert_array_equal(a.to_host(), b.to_host(), err_msg=key)
        if opt_name == "SGD":  # (Adam divides a conv bias's near-zero gradient before BatchNorm by its own noise)
            assert_close(a.to_host(), c.to_host(), rtol=1e-4, atol=1e-5, what=key)
    np.testing.assert_allclose(fused_losses, layer_losses, rtol=1e-4)
    assert step.launches == plain.launches - 5


def test_which_steps_run_the_head_as_one_kernel(cpu, monkeypatch):
    x = Tensor.empty(cpu, (8, 3, 8, 8))
    model = classifier().to(cpu)
    body, linear = trainstep._head(model, nn.CrossEntropyLoss(), x)
    assert linear is model.layers[-1] and body.layers == model.layers[:-1]

    class Subclass(nn.Sequential):
        pass
    wide = nn.Sequential(nn.Flatten(), nn.Linear(192, 17)).to(cpu)
    for other, loss_fn, inp in [(model, nn.MSELoss(), x), (wide, nn.CrossEntropyLoss(), x),  # the loss; 17 classes
                                (Subclass(*model.layers), nn.CrossEntropyLoss(), x),  # a Sequential of its own
                                (nn.Sequential(nn.Linear(8, 4)), nn.CrossEntropyLoss(), x),  # no layers before
                                (model, nn.CrossEntropyLoss(), Tensor.empty(cpu, (1024, 3, 8, 8)))]:  # rows x in too many
        assert trainstep._head(other, loss_fn, inp) is None
    monkeypatch.setattr(sequential, "TRAIN_FUSE", False)  # NETCL_TRAIN_FUSE=0: no training fusion
    assert trainstep._head(model, nn.CrossEntropyLoss(), x) is None


def test_layers_in_eval_mode_stay_so(cpu, rng):
    """A layer the user put in eval mode (a frozen BatchNorm, a Dropout turned off) keeps it through
    TrainStep's steps, the head fused or not, as through the layer calls: the running statistics
    stay, nothing is dropped."""
    for head_max in (trainstep._HEAD_MAX, 0):
        netcl.manual_seed(0)
        model = classifier().to(cpu).train()
        bn, drop = model.layers[1], model.layers[5]
        bn.eval()
        drop.eval()
        mean = bn.running_mean.to_host().copy()
        old, trainstep._HEAD_MAX = trainstep._HEAD_MAX, head_max
        try:
            step = TrainStep(model, nn.CrossEntropyLoss(), optim.SGD(model.parameters(), lr=0.0))
            for _ in range(4):
                step(rng.standard_normal((4, 3, 8, 8)).astype(np.float32), rng.integers(0, 10, 4))
        finally:
            trainstep._HEAD_MAX = old
        assert not bn.training and not drop.training and model.training and step.replays == 1
        np.testing.assert_array_equal(bn.running_mean.to_host(), mean)
