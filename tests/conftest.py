"""Shared fixtures: the device queue, a seeded generator, and a table of the per-layer maximum
errors against the references, printed at the end of the run.

Kernels are cached on disk (netcl/runtime/program.py; default ~/.cache/netcl, or
$NETCL_CACHE_DIR), so only the first run on a machine pays PoCL's compile time.
"""
import os

import numpy as np
import pytest

# Kernels specialised to a layer's sizes are built before the step that runs them (netcl.runtime.tiers),
# so that every test runs the routes it names whatever the kernel cache holds; tests of the
# background tier set it themselves
os.environ.setdefault("NETCL_COMPILE", "eager")

_ERRORS = []  # (test id, forward max abs error, backward max abs error)
_NOTES = []  # free-form lines for the summary (training accuracy and time)


@pytest.fixture(scope="session")
def queue():
    """The selected device's queue ($NETCL_DEVICE; the PoCL CPU device under `make test`)."""
    import netcl

    return netcl.default_queue()


@pytest.fixture(scope="module")
def q():
    """The default queue for the fused-path tests, which skip (rather than fail) without a device."""
    import netcl

    try:
        return netcl.default_queue()
    except netcl.NoDeviceError as e:
        pytest.skip(str(e))


@pytest.fixture
def torch():
    """PyTorch, the independent reference (the test skips where it is not installed), on one thread."""
    t = pytest.importorskip("torch")
    t.set_num_threads(1)
    return t


@pytest.fixture
def ort():
    """onnxruntime (the test skips where it is not installed)."""
    return pytest.importorskip("onnxruntime")


@pytest.fixture
def rng(request):
    """A generator seeded per test, so every test is reproducible on its own."""
    import zlib

    import netcl

    seed = zlib.crc32(request.node.nodeid.encode())
    netcl.manual_seed(seed)
    return np.random.default_rng(seed)


@pytest.fixture
def record_error(request):
    """record_error(forward_err, backward_err=None): add this test's errors to the summary table."""
    def record(fwd, bwd=None):
        _ERRORS.append((request.node.name, fwd, bwd))
    return record


@pytest.fixture
def record_note():
    """record_note(text): a line for the end-of-run summary."""
    return _NOTES.append


def max_err(got, ref):
    """Maximum absolute difference (shapes must match)."""
    got, ref = np.asarray(got), np.asarray(ref)
    assert got.shape == ref.shape, f"shape {got.shape} != reference {ref.shape}"
    return float(np.max(np.abs(got.astype(np.float64) - ref))) if got.size else 0.0


def assert_close(got, ref, rtol=1e-5, atol=1e-6, what=""):
    """|got - ref| <= atol + rtol * max|ref| elementwise; returns the max abs error.
    float32 sums of K terms drift by ~sqrt(K) ulps of the largest magnitude, hence scale by max|ref|."""
    err = max_err(got, ref)
    scale = float(np.max(np.abs(ref))) if np.size(ref) else 0.0
    assert err <= atol + rtol * scale, f"{what}: max abs error {err:.3g} (reference max |x| {scale:.3g})"
    return err


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: minutes of PoCL compilation on a cold kernel cache, or of "
                                       "training; runs when NETCL_SLOW_TESTS=1 (CI sets it)")


def pytest_collection_modifyitems(config, items):
    import os

    if os.environ.get("NETCL_SLOW_TESTS") == "1":
        return
    skip = pytest.mark.skip(reason="slow (minutes of PoCL compilation or of training): set NETCL_SLOW_TESTS=1 (CI does)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter):
    tr = terminalreporter
    for line in _NOTES:
        tr.write_line(line)
    if not _ERRORS:
        return
    worst = {}  # test function -> [cases, max forward error, max backward error]
    for name, f, b in _ERRORS:
        w = worst.setdefault(name.split("[")[0], [0, 0.0, None])
        w[0], w[1] = w[0] + 1, max(w[1], f)
        if b is not None:
            w[2] = max(w[2] or 0.0, b)
    tr.section("netcl max abs error vs reference (float64), worst case per test")
    tr.write_line(f"{'test':45s} {'cases':>5s} {'forward':>10s} {'backward':>10s}")
    for name, (n, f, b) in worst.items():
        tr.write_line(f"{name:45s} {n:5d} {f:10.2e} {'' if b is None else f'{b:10.2e}':>10s}")


def loop_step(model, loss_fn, opt, x, target):
    """A training step as layer calls (what netcl.TrainStep stands for); the model's output is kept
    in model.forward_output."""
    from netcl import Tensor

    xt = x if isinstance(x, Tensor) else Tensor.from_host(model.parameters()[0].queue, x)
    model.forward_output = model(xt)
    pending = loss_fn.enqueue(model.forward_output, target)
    model.backward(loss_fn.backward(), input_grad=False)
    opt.step()
    opt.zero_grad()
    return pending


def replays_as_the_loop(make, batches, lr=0.05, momentum=0.9):
    """TrainStep on one model and loop_step's layer calls on another (make() builds them alike, in
    training mode), each batch (x, y) of `batches` through both: the same loss every step, a step
    replayed, and the same weights at the end."""
    from netcl import nn, optim
    from netcl.trainstep import TrainStep

    a, b = make(), make()
    step = TrainStep(a, nn.CrossEntropyLoss(), optim.SGD(a.parameters(), lr=lr, momentum=momentum))
    loss_b, opt_b = nn.CrossEntropyLoss(), optim.SGD(b.parameters(), lr=lr, momentum=momentum)
    for i, (x, y) in enumerate(batches):
        got, want = step(x, y).item(), loop_step(b, loss_b, opt_b, x, y).item()
        assert abs(got - want) <= 1e-6 * max(1.0, abs(want)), i
    assert step.replays > 0 and step.eager_reason is None
    for k, v in b.state_dict().items():
        np.testing.assert_allclose(a.state_dict()[k], v, rtol=1e-5, atol=1e-6, err_msg=k)


def torch_state(torch, model):
    """netcl's state dict in torch's layouts, float64 (every 2-D tensor taken for a Linear's weight:
    transposed)."""
    return {k: torch.tensor(v.T if v.ndim == 2 else v, dtype=torch.float64) for k, v in model.state_dict().items()}


def train_beside_torch(torch, queue, model, ref, x, y, steps, batch, lr, momentum=0.9):
    """Train netcl's `model` and the float64 torch `ref` (holding the same weights) with SGD on
    cross-entropy, over batches of `batch` rows of x and y in turn; each step's loss must agree within
    1e-4 relative, and every state-dict entry at the end (a shape that differs compared transposed).
    Returns netcl's losses."""
    import netcl
    from netcl import nn, optim

    opt = optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=lr, momentum=momentum)
    model.train()
    losses = []
    for step in range(steps):
        i = (step * batch) % len(x)
        loss = nn.functional.cross_entropy(model(netcl.tensor(x[i:i + batch], queue=queue)), y[i:i + batch])
        loss.backward()
        opt.step()
        opt.zero_grad()
        ref_loss = torch.nn.functional.cross_entropy(ref(torch.tensor(x[i:i + batch], dtype=torch.float64)),
                                                     torch.tensor(y[i:i + batch]))
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        losses.append(loss.item())
        assert abs(loss.item() - ref_loss.item()) < 1e-4 * max(1.0, abs(ref_loss.item())), step
    ref_sd = ref.state_dict()
    for k, v in model.state_dict().items():
        want = ref_sd[k].numpy()
        assert_close(v, want.T if v.shape != want.shape else want, 1e-4, atol=1e-5, what=k)
    return losses


def use_cpu_class(queue, monkeypatch, cls):
    """Run the CPU kernels with the register blocks of device class `cls` (the tuning table's
    conv_train rows): "native" leaves the device's own, "other" takes AVX2's on an AVX-512 device and
    AVX-512's on an AVX2 one, so that both are checked on every machine (skipped on a GPU)."""
    from netcl import ops

    if cls == "native":
        return
    native = ops.config_class(queue)
    if native == "gpu":
        pytest.skip("the CPU classes' kernels (local size 1) on a GPU device")
    monkeypatch.setattr(ops, "_config_class", {queue.device.int_ptr: "cpu" if native == "cpu16" else "cpu16"})


def randomize_batchnorm(model, rng):
    """Non-default running statistics and affine parameters, so BatchNormalization is really tested."""
    from netcl.nn import BatchNorm2d

    for m in model:
        if isinstance(m, BatchNorm2d):
            c = m.num_features
            m.running_mean.set_(rng.normal(0, 0.5, c))
            m.running_var.set_(rng.uniform(0.5, 2.0, c))
            m.weight.set_(rng.uniform(0.5, 1.5, c))
            m.bias.set_(rng.normal(0, 0.2, c))
    return model


def hammer_threads(model, q, xs, calls, threads=4):
    """`threads` threads call one eval model `calls` times each, alternating predict() and
    model(Tensor) over the inputs `xs`; fails unless every result is the caller's own."""
    import threading

    from netcl import Tensor

    refs = [model.predict(x, q) for x in xs]
    wrong, errors = [], []

    def worker(t):
        try:
            for j in range(calls):
                i = (t + j) % len(xs)
                if not np.array_equal(model.predict(xs[i], q), refs[i]):
                    wrong.append(("predict", i))
                if not np.array_equal(model(Tensor.from_host(q, xs[i])).to_host(), refs[i]):
                    wrong.append(("call", i))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    pool = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert not errors and not wrong, (errors[:1], len(wrong))
