"""A steady training step: after a shape's first steps, a step makes no device buffers and builds
no programs (netcl.runtime.stats()), the optimizer updates every parameter in one launch, the
loss costs two launches, and the loss value is the step's one read from the device."""
import numpy as np
import pytest

import netcl
from netcl import Tensor, models, nn, ops, optim, runtime


def small_detector():
    """detector26's blocks (Conv-BN-LeakyReLU-MaxPool) at 32x32, its 1x1 head and Sigmoid."""
    layers = []
    for c_in, c_out in ((3, 8), (8, 16)):
        layers += [nn.Conv2d(c_in, c_out, 3, padding=1), nn.BatchNorm2d(c_out), nn.LeakyReLU(0.1), nn.MaxPool2d(2)]
    return nn.Sequential(*layers, nn.Conv2d(16, 5, 1), nn.Sigmoid())


CASES = {  # name -> (model, input shape, loss, optimizer)
    "detector-sgd-mse": (small_detector, (2, 3, 32, 32), "mse", ("SGD", {"lr": 0.01, "momentum": 0.9})),
    "detector-adam-mse": (small_detector, (2, 3, 32, 32), "mse", ("Adam", {"lr": 1e-3, "weight_decay": 1e-4})),
    "resnet8-sgd-ce": (models.resnet8, (2, 3, 32, 32), "ce",
                       ("SGD", {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 5e-4})),
    "vit-adam-ce": (models.vit_tiny, (3, 1, 8, 8), "ce", ("Adam", {"lr": 1e-3})),
    "mlp-sgd-ce": (models.mlp, (8, 64), "ce", ("SGD", {"lr": 0.1, "momentum": 0.9, "dampening": 0.1})),
    "mlp-adam-mse": (models.mlp, (5, 64), "mse", ("Adam", {"lr": 1e-2})),
}


class Counter:
    """Kernel launches (ops._enqueue) and reads from the device into host arrays."""

    def __init__(self, monkeypatch):
        import pyopencl as cl

        self.launches = self.reads = 0
        enqueue, copy = ops._enqueue, cl.enqueue_copy

        def counted_enqueue(*args):
            self.launches += 1
            return enqueue(*args)

        def counted_copy(queue, dest, src, **kw):
            self.reads += isinstance(dest, np.ndarray)
            return copy(queue, dest, src, **kw)

        monkeypatch.setattr(ops, "_enqueue", counted_enqueue)
        monkeypatch.setattr(cl, "enqueue_copy", counted_copy)


@pytest.mark.parametrize("deferred", [False, True])
@pytest.mark.parametrize("case", list(CASES))
def test_steady_steps_make_no_buffers_build_nothing_and_read_once(queue, rng, monkeypatch, case, deferred):
    """deferred: the loss enqueued (loss_fn.enqueue) and read after the optimizer step."""
    build, shape, loss, (opt_name, hyper) = CASES[case]
    netcl.manual_seed(0)
    model = build().to(queue).train()
    out_shape = model.output_shape(shape)
    opt = getattr(optim, opt_name)(model.parameters(), **hyper)
    loss_fn = nn.MSELoss() if loss == "mse" else nn.CrossEntropyLoss()
    count = Counter(monkeypatch)
    losses = []
    for step in range(5):
        x = rng.uniform(0, 1, shape).astype(np.float32)
        y = rng.uniform(0, 1, out_shape).astype(np.float32) if loss == "mse" else rng.integers(0, out_shape[1],
                                                                                                 shape[0])
        if step == 2:  # the first two steps make the layout, the gradient homes and the pool's buffers
            before, reads = runtime.stats(), count.reads
        launches = count.launches
        if deferred:
            r0 = count.reads
            pending = loss_fn.enqueue(model(Tensor.from_host(queue, x)), y)
            assert count.reads == r0, "enqueue reads nothing"
        else:
            losses.append(float(loss_fn(model(Tensor.from_host(queue, x)), y)))  # (the loss read: one read)
        model.backward(loss_fn.backward())
        middle = count.launches
        opt.step()
        opt.zero_grad()
        if deferred:
            losses.append(pending.item())
        assert count.launches - middle == 1, "the optimizer updates every parameter in one launch"
        assert middle > launches
    assert runtime.stats() == before, "steady steps make no device buffers and build no programs"
    assert count.reads - reads == 3, "one read per step: the loss value"
    assert all(np.isfinite(losses))


def test_loss_is_two_launches_and_one_read(queue, rng, monkeypatch):
    pred = Tensor.from_host(queue, rng.uniform(0.1, 0.9, (4, 5)).astype(np.float32))
    on_device = Tensor.from_host(queue, rng.uniform(0, 1, (4, 5)))
    labels = Tensor.from_host(queue, [0, 4, 2, 1])
    queue.finish()
    count = Counter(monkeypatch)
    for fn, target in ((nn.MSELoss(), on_device), (nn.BCELoss(), on_device), (nn.CrossEntropyLoss(), labels)):
        launches, reads = count.launches, count.reads
        loss = fn(pred, target)  # a 0-d tensor: the read when its value is asked for
        assert (count.launches - launches, count.reads - reads) == (2, 0), type(fn).__name__
        float(loss), loss.item()
        assert count.reads - reads == 1, type(fn).__name__
        pending = fn.enqueue(pred, target)  # the same launches; the read when item() asks
        assert (count.launches - launches, count.reads - reads) == (4, 1), type(fn).__name__
        pending.item(), pending.item()
        assert count.reads - reads == 2, type(fn).__name__


def test_stats_count_new_buffers_and_builds(queue):
    runtime.alloc(queue, 4)
    runtime._pools[queue.context].free_held()  # the pool holds no buffer now
    before = runtime.stats()
    keep = [runtime.alloc(queue, 3 << 20) for _ in range(2)]
    assert runtime.stats()["allocations"] == before["allocations"] + 2
    del keep
    again = runtime.alloc(queue, 3 << 20)  # from the pool
    assert runtime.stats()["allocations"] == before["allocations"] + 2 and again is not None
    runtime.buffer(queue, 64)
    assert runtime.stats() == dict(before, allocations=before["allocations"] + 3)
