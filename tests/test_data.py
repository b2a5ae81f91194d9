"""netcl.data: Dataset, TensorDataset and DataLoader: batches as device Tensors (float32, int32 for
integer data), shuffled by netcl's generator, made by a background thread; a batch's buffers are
not refilled while anything holds it; training over a loader equals training over host arrays."""
import threading
import time

import numpy as np
import pytest

import netcl
from netcl import TrainStep, nn, optim, runtime
from netcl.data import DataLoader, Dataset, TensorDataset, default_collate


def arrays(rng, n=23):
    return rng.standard_normal((n, 3, 2)), rng.integers(0, 5, n)


def test_batches_are_device_tensors_in_order(queue, rng):
    x, y = arrays(rng)
    loader = DataLoader(TensorDataset(x, y), batch_size=5, queue=queue)
    assert len(loader) == 5
    got = list(loader)  # every batch held at once: none is refilled
    assert [b[0].shape for b in got] == [(5, 3, 2)] * 4 + [(3, 3, 2)]
    for k, (xb, yb) in enumerate(got):
        assert xb.on_device and xb.queue is queue and xb.dtype == netcl.float32 and yb.dtype == netcl.int32
        np.testing.assert_array_equal(xb.to_host(), x[5 * k:5 * k + 5].astype(np.float32))
        np.testing.assert_array_equal(yb.to_host(), y[5 * k:5 * k + 5])
    assert len(DataLoader(TensorDataset(x, y), batch_size=5, drop_last=True)) == 4
    assert [b[0].shape[0] for b in DataLoader(TensorDataset(x, y), batch_size=5, drop_last=True)] == [5] * 4


def test_shuffle_draws_from_netcls_generator(queue, rng):
    x, y = arrays(rng, 40)
    loader = DataLoader(TensorDataset(np.arange(40), y), batch_size=8, shuffle=True, queue=queue)
    netcl.manual_seed(7)
    first = np.concatenate([b[0].to_host() for b in loader])
    second = np.concatenate([b[0].to_host() for b in loader])
    want = np.random.default_rng(7)
    np.testing.assert_array_equal(first, want.permutation(40))
    np.testing.assert_array_equal(second, want.permutation(40))  # a new order each epoch
    netcl.manual_seed(7)
    np.testing.assert_array_equal(np.concatenate([b[0].to_host() for b in loader]), first)
    own = DataLoader(TensorDataset(np.arange(40)), batch_size=40, shuffle=True, generator=np.random.default_rng(3))
    np.testing.assert_array_equal(next(iter(own))[0].to_host(), np.random.default_rng(3).permutation(40))


class Items(Dataset):
    """Samples as dicts of arrays, numbers and strings."""

    def __len__(self):
        return 7

    def __getitem__(self, i):
        return {"x": np.full((2,), i, np.float64), "label": i % 3, "name": f"s{i}", "pair": (i, 0.5 * i)}


def test_default_collate_and_a_custom_dataset(queue):
    b = next(iter(DataLoader(Items(), batch_size=4, queue=queue)))
    assert set(b) == {"x", "label", "name", "pair"}
    np.testing.assert_array_equal(b["x"].to_host(), np.repeat(np.arange(4.0), 2).reshape(4, 2))
    assert b["label"].dtype == netcl.int32 and b["label"].to_host().tolist() == [0, 1, 2, 0]
    assert b["name"] == ["s0", "s1", "s2", "s3"]
    assert isinstance(b["pair"], list) and b["pair"][1].to_host().tolist() == [0.0, 0.5, 1.0, 1.5]
    singles = list(DataLoader(TensorDataset(np.arange(3.0)), batch_size=None, queue=queue))
    assert [s[0].shape for s in singles] == [()] * 3 and [float(s[0]) for s in singles] == [0.0, 1.0, 2.0]
    loader = DataLoader(Items(), batch_size=3, sampler=[6, 0, 2], queue=queue,
                        collate_fn=lambda items: np.array([it["label"] * 10.0 for it in items]))
    assert [t.to_host().tolist() for t in loader] == [[0.0, 0.0, 20.0]]
    assert default_collate([(1, 2.0), (3, 4.0)])[0].tolist() == [1, 3]


def test_buffers_are_refilled_only_once_a_batch_is_gone(queue, rng):
    """A loop that drops each batch reuses a few buffers; batches held keep their values."""
    x = np.arange(60 * 4, dtype=np.float32).reshape(60, 4)
    loader = DataLoader(TensorDataset(x), batch_size=4, queue=queue, prefetch_factor=2)
    seen = set()
    for _ in range(2):
        for (xb,) in loader:
            seen.add(xb.buf.int_ptr)
    assert len(seen) <= 6  # the one in hand, two ready, one being made, and the finalizers' slack
    held = [xb for (xb,) in loader]
    for _ in loader:  # another epoch while they are held
        pass
    for k, xb in enumerate(held):
        np.testing.assert_array_equal(xb.numpy(), x[4 * k:4 * k + 4])
        np.testing.assert_array_equal(xb.to_host(), x[4 * k:4 * k + 4])


def test_training_over_a_loader_equals_host_batches(queue, rng):
    """TrainStep over the loader's device batches: the same bits as a TrainStep over the host
    arrays, replayed (each batch's buffers bound anew); the loader keeps a few buffers per field
    (the batches in hand, bound, ready and being made), the step none after its first calls."""
    x, y = rng.standard_normal((48, 12)).astype(np.float32), rng.integers(0, 4, 48)

    def build():
        netcl.manual_seed(0)
        model = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 4)).to(queue).train()
        return model, nn.CrossEntropyLoss(), optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    a, b = build(), build()
    step, host_step = TrainStep(*a), TrainStep(*b)
    loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True, queue=queue)
    netcl.manual_seed(5)
    order = np.random.default_rng(5)
    for epoch in range(3):
        perm = order.permutation(48)
        for k, (xb, yb) in enumerate(loader):
            idx = perm[8 * k:8 * k + 8]
            assert step(xb, yb).item() == host_step(x[idx], y[idx]).item()
    for (key, ta), (_, tb) in zip(a[0].named_tensors(), b[0].named_tensors()):
        np.testing.assert_array_equal(ta.to_host(), tb.to_host(), err_msg=key)
    del xb, yb
    made = sum(len(v) for v in loader._free.values())
    assert made <= 2 * (loader.prefetch_factor + 3)
    before = runtime.stats()["allocations"]
    for xb, yb in loader:
        step(xb, yb)
    assert runtime.stats()["allocations"] - before <= 2 * (loader.prefetch_factor + 3) - made
    assert step.replays == 4 * 6 - 3 and step.eager_reason is None


class Failing(Dataset):
    def __len__(self):
        return 10

    def __getitem__(self, i):
        if i == 6:
            raise KeyError("sample 6 is missing")
        return np.zeros(2)


def test_errors_reach_the_caller_and_an_abandoned_epoch_stops(queue):
    it = iter(DataLoader(Failing(), batch_size=3, queue=queue))
    next(it), next(it)
    with pytest.raises(KeyError, match="sample 6"):
        next(it)
    with pytest.raises(StopIteration):
        next(it)
    loader = DataLoader(TensorDataset(np.zeros((1000, 2))), batch_size=1, queue=queue)
    it = iter(loader)
    next(it)
    thread = it._thread
    del it
    deadline = time.time() + 5
    while thread.is_alive() and time.time() < deadline:
        time.sleep(0.05)
    assert not thread.is_alive()
    assert all(t.name != "netcl-DataLoader" or not t.is_alive() for t in threading.enumerate())
    with pytest.raises(ValueError, match="mutually exclusive"):
        DataLoader(TensorDataset(np.zeros(3)), shuffle=True, sampler=[0])
    with pytest.raises(ValueError, match="batch_size"):
        DataLoader(TensorDataset(np.zeros(3)), batch_size=0)
    with pytest.raises(ValueError, match="first dimension"):
        TensorDataset(np.zeros(3), np.zeros(4))
    with pytest.raises(TypeError, match="map-style"):
        DataLoader([1, 2, 3][0])
    with pytest.raises(TypeError, match="dtype"):
        next(iter(DataLoader(TensorDataset(np.array(["a", "b"], dtype=object)), batch_size=2, queue=queue)))
