"""Losses (value and gradient) and optimizer steps against PyTorch in float64."""
import numpy as np
import pytest
from conftest import assert_close

from netcl import Tensor, nn, optim


def torch_loss(torch, fn, pred, target):
    p = torch.tensor(pred, dtype=torch.float64, requires_grad=True)
    loss = fn(p, torch.tensor(target))
    loss.backward()
    return loss.item(), p.grad.numpy()


def check_loss(record_error, got_value, got_grad, ref):
    value, grad = ref
    if isinstance(got_value, Tensor):  # a loss called: a 0-d tensor on the device
        assert got_value.shape == ()
        got_value = float(got_value)
    assert isinstance(got_value, float)  # (PendingLoss.item())
    err = abs(got_value - value)
    assert err <= 1e-6 * max(1.0, abs(value)), f"loss {got_value} != reference {value}"
    record_error(err, assert_close(got_grad, grad, what="gradient"))


@pytest.mark.parametrize("n,c,scale", [(5, 7, 1.0), (1, 3, 1.0), (64, 10, 3.0), (8, 4, 50.0), (3, 1000, 1.0)])
@pytest.mark.parametrize("labels_as_tensor", [False, True])
def test_cross_entropy_vs_torch(queue, rng, torch, record_error, n, c, scale, labels_as_tensor):
    logits = (rng.standard_normal((n, c)) * scale).astype(np.float32)
    labels = rng.integers(0, c, n)
    fn = nn.CrossEntropyLoss()
    value = fn(Tensor.from_host(queue, logits), Tensor.from_host(queue, labels) if labels_as_tensor else labels)
    check_loss(record_error, value, fn.backward().to_host(),
               torch_loss(torch, torch.nn.CrossEntropyLoss(), logits, labels))


@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 4, 5), (1, 1)])
def test_mse_vs_torch(queue, rng, torch, record_error, shape):
    pred, target = rng.standard_normal(shape).astype(np.float32), rng.standard_normal(shape)
    fn = nn.MSELoss()
    value = fn(Tensor.from_host(queue, pred), target)
    check_loss(record_error, value, fn.backward().to_host(), torch_loss(torch, torch.nn.MSELoss(), pred, target))


@pytest.mark.parametrize("shape,soft", [((6, 1), False), ((3, 4, 5), True)])
def test_bce_vs_torch(queue, rng, torch, record_error, shape, soft):
    p = (1 / (1 + np.exp(-3 * rng.standard_normal(shape)))).astype(np.float32)
    t = rng.uniform(0, 1, shape) if soft else rng.integers(0, 2, shape).astype(np.float64)
    fn = nn.BCELoss()
    value = fn(Tensor.from_host(queue, p), Tensor.from_host(queue, t))
    check_loss(record_error, value, fn.backward().to_host(), torch_loss(torch, torch.nn.BCELoss(), p, t))


def test_bce_clamps_log_as_torch(queue, torch):
    p, t = np.array([0.0, 1.0, 0.0, 1.0, 0.5], np.float32), np.array([1.0, 0.0, 0.0, 1.0, 1.0])
    fn = nn.BCELoss()
    value = fn(Tensor.from_host(queue, p), t)
    ref_value, ref_grad = torch_loss(torch, torch.nn.BCELoss(), p, t)
    assert abs(value - ref_value) <= 1e-5 * ref_value  # log(0) clamped at -100: finite
    np.testing.assert_allclose(fn.backward().to_host(), ref_grad, rtol=1e-6)


def test_cross_entropy_checks_device_labels_on_the_device(queue):
    logits = Tensor.from_host(queue, np.zeros((3, 4), np.float32))
    fn = nn.CrossEntropyLoss()
    for bad in ([0, 4, 1], [0, -1, 1], [0, 1.5, 2], [0, np.nan, 1]):
        loss = fn(logits, Tensor.from_host(queue, np.array(bad, np.float32)))  # checked on the device
        with pytest.raises(ValueError, match=r"integers in \[0, 4\)"):
            float(loss)  # reading the loss tells
        with pytest.raises(ValueError, match=r"integers in \[0, 4\)"):
            fn.backward()  # no gradient of a refused loss
        logits.requires_grad_()
        with pytest.raises(ValueError, match=r"integers in \[0, 4\)"):
            fn(logits, Tensor.from_host(queue, np.array(bad, np.float32))).backward()  # nor through autograd
        logits.requires_grad_(False)
    assert fn(logits, Tensor.from_host(queue, [3, 0, 2])) == pytest.approx(np.log(4))
    with pytest.raises(ValueError, match="3 class indices"):
        fn(logits, Tensor.from_host(queue, [3, 0]))


def test_loss_label_and_shape_errors(queue):
    x = Tensor.from_host(queue, np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match="class indices"):
        nn.CrossEntropyLoss()(x, np.array([0, 1, 2]))
    with pytest.raises(ValueError, match="integers"):
        nn.CrossEntropyLoss()(x, np.array([0, 3]))
    with pytest.raises(ValueError, match="target shape"):
        nn.MSELoss()(x, np.zeros((3, 2)))
    with pytest.raises(RuntimeError):
        nn.MSELoss().backward()


# -- optimizers ----------------------------------------------------------------------
OPTIMIZERS = [
    ("SGD", {"lr": 0.1}),
    ("SGD", {"lr": 0.05, "momentum": 0.9}),
    ("SGD", {"lr": 0.05, "momentum": 0.9, "dampening": 0.3}),
    ("SGD", {"lr": 0.05, "momentum": 0.8, "nesterov": True, "weight_decay": 0.01}),
    ("SGD", {"lr": 0.1, "weight_decay": 0.1}),
    ("Adam", {"lr": 1e-2}),
    ("Adam", {"lr": 3e-3, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.05}),
    ("Adam", {"lr": 1e-2, "amsgrad": True, "weight_decay": 0.01}),
    ("AdamW", {}),
    ("AdamW", {"lr": 3e-3, "betas": (0.8, 0.99), "weight_decay": 0.1, "amsgrad": True}),
    ("RMSprop", {}),
    ("RMSprop", {"lr": 3e-3, "alpha": 0.9, "eps": 1e-6, "weight_decay": 0.05, "momentum": 0.8}),
    ("RMSprop", {"lr": 1e-3, "centered": True, "momentum": 0.5}),
    ("RMSprop", {"lr": 1e-3, "centered": True}),
]


@pytest.mark.parametrize("name,kw", OPTIMIZERS)
def test_optimizer_steps_vs_torch(queue, rng, torch, record_error, name, kw):
    shapes = [(5, 3), (7,), (2, 3, 3, 3)]
    init = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    params = [Tensor.from_host(queue, a) for a in init]
    ref_params = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in init]
    opt, ref = getattr(optim, name)(params, **kw), getattr(torch.optim, name)(ref_params, **kw)
    err = 0.0
    for step in range(6):
        for i, (p, rp) in enumerate(zip(params, ref_params)):
            if step == 2 and i == 1:  # a parameter without a gradient is left alone, as in torch
                p.grad, rp.grad = None, None
                continue
            g = rng.standard_normal(p.shape).astype(np.float32)
            p.grad, rp.grad = Tensor.from_host(queue, g), torch.tensor(g, dtype=torch.float64)
        opt.step()
        ref.step()
        for p, rp in zip(params, ref_params):
            err = max(err, assert_close(p.to_host(), rp.detach().numpy(), what=f"{name} step {step}"))
    for i, rp in enumerate(ref_params):
        for slot, v in ref.state[rp].items():
            if slot != "step" and v is not None:
                assert_close(opt.state[i][slot].to_host(), v.numpy(), what=slot)
        assert set(opt.state[i]) - {"step"} == {k for k, v in ref.state[rp].items() if v is not None} - {"step"}
    record_error(err)


def device_values(t):
    """The tensor's data read from its device buffer (not its host copy)."""
    import pyopencl as cl

    a = np.empty(t.shape, np.float32)
    cl.enqueue_copy(t.queue, a, t.buf, is_blocking=True)
    return a


def test_gradients_in_the_optimizer_buffer_keep_torch_semantics(queue, rng, torch):
    """Gradients land in the optimizer's flat buffer, yet accumulate, survive being held, and may
    be set by hand, as torch's; the parameters may move to another context between steps."""
    import pyopencl as cl

    lin = nn.Linear(3, 2)
    model = nn.Sequential(lin).to(queue).train()
    ref = torch.nn.Linear(3, 2).double()
    with torch.no_grad():
        ref.weight.copy_(torch.tensor(lin.weight.to_host().T))
        ref.bias.copy_(torch.tensor(lin.bias.to_host()))
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    q = queue

    def backward(x):
        model(Tensor.from_host(q, x))
        model.backward(Tensor.from_host(q, np.ones((len(x), 2), np.float32)))
        ref(torch.tensor(x, dtype=torch.float64)).sum().backward()

    def check(what):
        assert_close(device_values(lin.weight.grad), ref.weight.grad.numpy().T, what=f"gradient {what}")
        assert_close(device_values(lin.weight), ref.weight.detach().numpy().T, what=f"weight {what}")
        assert_close(lin.bias.to_host(), ref.bias.detach().numpy(), what=f"bias {what}")

    def step():
        opt.step()
        ref_opt.step()

    xs = [rng.standard_normal((4, 3)).astype(np.float32) for _ in range(9)]
    backward(xs[0])
    backward(xs[1])
    check("accumulated")
    step()
    backward(xs[2])  # no zero_grad: onto the last gradient
    check("accumulated after a step")
    step()
    opt.zero_grad()
    ref_opt.zero_grad()
    backward(xs[3])
    check("after zero_grad")
    assert lin.weight.grad.buf is lin.weight.grad_home.region.buf  # written in place
    step()
    held, held_values = lin.weight.grad.reshape(-1), device_values(lin.weight.grad).reshape(-1)  # a view
    opt.zero_grad()
    ref_opt.zero_grad()
    backward(xs[4])
    check("after zero_grad, the last gradient held")
    np.testing.assert_array_equal(device_values(held), held_values)  # a held gradient keeps its values
    step()
    lin.weight.grad = held.reshape(lin.weight.shape)  # set by hand
    ref.weight.grad = torch.tensor(held_values.reshape(lin.weight.shape).T, dtype=torch.float64)
    step()
    check("set by hand")
    ctx = cl.Context([queue.device])  # another context (kept: Intel's OpenCL destroys an unreferenced one)
    q = cl.CommandQueue(ctx)  # the layout is made again there
    model.to(q)
    for x in xs[5:]:
        opt.zero_grad()
        ref_opt.zero_grad()
        backward(x)
        step()
        check("on another context")


def test_optimizer_refuses_a_parameter_twice(queue):
    p = Tensor.from_host(queue, np.ones((2, 3), np.float32))
    with pytest.raises(ValueError, match="parameter 1 is parameter 0 again"):
        optim.Adam([p, p.reshape(6)])


def test_zero_grad_and_argument_errors(queue):
    p = Tensor.from_host(queue, np.ones(3, np.float32))
    p.grad = Tensor.from_host(queue, np.ones(3, np.float32))
    opt = optim.SGD([p], lr=0.5)
    opt.step()
    np.testing.assert_array_equal(p.to_host(), 0.5)
    opt.zero_grad()
    assert p.grad is None
    opt.step()  # no gradient: no change
    np.testing.assert_array_equal(p.to_host(), 0.5)
    with pytest.raises(ValueError):
        optim.SGD([], lr=0.1)
    with pytest.raises(ValueError):
        optim.SGD([p], lr=-1)
    with pytest.raises(ValueError):
        optim.SGD([p], lr=0.1, nesterov=True)
    with pytest.raises(ValueError):
        optim.Adam([p], betas=(1.0, 0.9))
    with pytest.raises(TypeError):
        optim.Adam([np.zeros(3)])


# -- hyperparameter validation ---------------------------------------------------------------
@pytest.mark.parametrize("make, error", [
    (lambda p: optim.SGD(p, lr="0.1"), TypeError),
    (lambda p: optim.SGD(p, lr=float("nan")), ValueError),
    (lambda p: optim.SGD(p, lr=0.1, momentum=-1), ValueError),
    (lambda p: optim.Adam(p, betas=0.9), ValueError),
    (lambda p: optim.Adam(p, betas=(0.9,)), ValueError),
    (lambda p: optim.Adam(p, betas=(0.9, 1.0)), ValueError),
    (lambda p: optim.Adam(p, eps=-1.0), ValueError),
])
def test_optimizer_rejects_bad_hyperparameters(make, error):
    with pytest.raises(error):
        make(nn.Linear(2, 2).parameters())


def test_optimizer_load_state_dict_validates_hyperparameters():
    opt = optim.Adam(nn.Linear(2, 2).parameters())
    sd = opt.state_dict()
    sd["param_groups"][0]["betas"] = [0.9, 0.99, 0.5]
    with pytest.raises(ValueError, match="pair"):
        opt.load_state_dict(sd)


# -- argument errors -------------------------------------------------------------------------
def test_loss_argument_errors(queue):
    ce, mse = nn.CrossEntropyLoss(), nn.MSELoss()
    logits = Tensor.from_host(queue, np.zeros((2, 3)))
    with pytest.raises(TypeError, match="netcl Tensor"):
        ce(np.zeros((2, 3)), [0, 1])
    with pytest.raises(TypeError, match="class indices"):
        ce(logits, np.array(["a", "b"]))
    with pytest.raises(ValueError, match=r"\[0, 3\)"):
        ce(logits, [0, 3])
    with pytest.raises(ValueError, match="non-empty"):
        ce(Tensor.from_host(queue, np.zeros((0, 3))), np.zeros(0, np.int64))
    with pytest.raises(ValueError, match="on the host"):
        mse(Tensor.from_host(None, np.zeros(3)), np.zeros(3))
    with pytest.raises(ValueError, match="differs"):
        mse(logits, np.zeros(3))
    with pytest.raises(RuntimeError, match="before the loss"):
        nn.MSELoss().backward()


@pytest.mark.parametrize("bad", [1.5, -0.25, float("nan")])
def test_bce_refuses_predictions_outside_zero_one(queue, bad):
    p = np.full((2, 3), 0.5, np.float32)
    p[1, 2] = bad
    loss_fn = nn.BCELoss()
    loss = loss_fn(Tensor.from_host(queue, p), np.ones((2, 3), np.float32))  # checked on the device
    with pytest.raises(ValueError, match="between 0 and 1"):
        loss.item()
    with pytest.raises(ValueError, match="between 0 and 1"):
        loss_fn.backward()  # no gradient of a refused loss
    p[1, 2] = 1.0  # the borders are probabilities
    assert np.isfinite(loss_fn(Tensor.from_host(queue, p), np.zeros((2, 3), np.float32)))


@pytest.mark.parametrize("kind", ["cross_entropy", "mse", "bce"])
def test_enqueued_loss_reads_later_the_same_value_and_gradient(queue, rng, torch, record_error, kind):
    """loss_fn.enqueue() launches the same kernels without waiting: backward() gives the gradient at
    once, item() (and float()) reads the mean later, once (a second call returns the same float),
    equal to calling the loss and to float64 PyTorch."""
    if kind == "cross_entropy":
        pred, target = rng.standard_normal((6, 5)).astype(np.float32), rng.integers(0, 5, 6)
        make, ref = nn.CrossEntropyLoss, torch.nn.CrossEntropyLoss()
    elif kind == "mse":
        pred, target = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((3, 4))
        make, ref = nn.MSELoss, torch.nn.MSELoss()
    else:
        pred = (1 / (1 + np.exp(-rng.standard_normal((3, 4))))).astype(np.float32)
        target, make, ref = rng.uniform(0, 1, (3, 4)), nn.BCELoss, torch.nn.BCELoss()
    fn = make()
    pending = fn.enqueue(Tensor.from_host(queue, pred), target)
    assert repr(pending) == "PendingLoss(not read)"
    grad = fn.backward().to_host()
    value = pending.item()
    assert pending.item() is value and float(pending) == value and repr(pending) == f"PendingLoss({value})"
    check_loss(record_error, value, grad, torch_loss(torch, ref, pred, target))
    assert make()(Tensor.from_host(queue, pred), target) == value


def test_enqueued_loss_refusal_zeroes_its_gradient_and_raises_at_item(queue, rng):
    """A refused input is known only when the value is read: enqueue() gives a gradient whose
    refused rows (CrossEntropyLoss labels on the device) or elements (BCELoss predictions outside
    [0, 1]) are 0, so that a step taken before item() moves nothing through them; item() raises."""
    logits = rng.standard_normal((3, 4)).astype(np.float32)
    fn = nn.CrossEntropyLoss()
    pending = fn.enqueue(Tensor.from_host(queue, logits), Tensor.from_host(queue, np.array([0, 4, 1], np.float32)))
    grad = fn.backward().to_host()
    assert np.all(grad[1] == 0) and np.all(grad[[0, 2]] != 0)
    with pytest.raises(ValueError, match=r"integers in \[0, 4\)"):
        pending.item()
    with pytest.raises(ValueError, match=r"integers in \[0, 4\)"):  # every read says so
        float(pending)
    p = np.full((2, 3), 0.5, np.float32)
    p[1, 2] = np.nan
    bce = nn.BCELoss()
    pending = bce.enqueue(Tensor.from_host(queue, p), np.ones((2, 3), np.float32))
    grad = bce.backward().to_host()
    assert grad[1, 2] == 0 and np.all(np.isfinite(grad)) and np.count_nonzero(grad) == 5
    with pytest.raises(ValueError, match="between 0 and 1"):
        pending.item()
    with pytest.raises(ValueError, match=r"integers in \[0, 4\)"):  # host labels: checked at once
        fn.enqueue(Tensor.from_host(queue, logits), [0, 4, 1])
