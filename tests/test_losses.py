"""The loss modules and their nn.functional forms against float64 PyTorch: values and gradients
(through autograd, the explicit backward() and enqueue()), every reduction, class weights,
ignore_index, label smoothing, class-probability targets, pos_weight."""
import numpy as np
import pytest
from conftest import assert_close

import netcl
import netcl.nn.functional as F
from netcl import Tensor, nn


def class_targets(rng, shape, c, ignore=None):
    """Class indices of `shape`; with ignore, about one in four set to it (the first always)."""
    y = rng.integers(0, c, shape)
    if ignore is not None:
        y[rng.uniform(size=shape) < 0.25] = ignore
        y.reshape(-1)[0] = ignore
    return y


# (name, torch class / netcl class name, kwargs (arrays as numpy), prediction shape, target kind)
#   target kinds: "class" (indices), "class-ignore" (some equal to ignore_index), "prob" (probabilities),
#   "real" (any), "binary" (0/1, for the logits losses), "unit" (in [0, 1])
CASES = [
    ("ce-plain", "CrossEntropyLoss", {}, (6, 5), "class"),
    ("ce-sum", "CrossEntropyLoss", {"reduction": "sum"}, (6, 5), "class"),
    ("ce-none", "CrossEntropyLoss", {"reduction": "none"}, (6, 5), "class"),
    ("ce-weight", "CrossEntropyLoss", {"weight": "w"}, (7, 4), "class"),
    ("ce-ignore-host", "CrossEntropyLoss", {}, (8, 5), "class-ignore"),
    ("ce-ignore-2", "CrossEntropyLoss", {"ignore_index": 2}, (8, 5), "class-ignore"),
    ("ce-weight-ignore", "CrossEntropyLoss", {"weight": "w", "ignore_index": 1}, (9, 4), "class-ignore"),
    ("ce-smooth", "CrossEntropyLoss", {"label_smoothing": 0.1}, (6, 5), "class"),
    ("ce-smooth-weight-ignore-sum", "CrossEntropyLoss",
     {"label_smoothing": 0.2, "weight": "w", "ignore_index": 0, "reduction": "sum"}, (9, 4), "class-ignore"),
    ("ce-smooth-weight-ignore-none", "CrossEntropyLoss",
     {"label_smoothing": 0.2, "weight": "w", "ignore_index": 3, "reduction": "none"}, (9, 4), "class-ignore"),
    ("ce-smooth-weight-ignore-mean", "CrossEntropyLoss",
     {"label_smoothing": 0.3, "weight": "w", "ignore_index": 3}, (9, 4), "class-ignore"),
    ("ce-4d", "CrossEntropyLoss", {}, (2, 3, 4, 5), "class"),
    ("ce-4d-weight-smooth-ignore", "CrossEntropyLoss",
     {"weight": "w", "label_smoothing": 0.05, "ignore_index": 2}, (2, 3, 4, 5), "class-ignore"),
    ("ce-3d-none", "CrossEntropyLoss", {"reduction": "none"}, (3, 4, 6), "class"),
    ("ce-prob", "CrossEntropyLoss", {}, (5, 4), "prob"),
    ("ce-prob-sum-smooth", "CrossEntropyLoss", {"reduction": "sum", "label_smoothing": 0.1}, (5, 4), "prob"),
    ("ce-prob-none-weight", "CrossEntropyLoss", {"reduction": "none", "weight": "w"}, (5, 4), "prob"),
    ("ce-prob-mean-weight-4d", "CrossEntropyLoss", {"weight": "w", "label_smoothing": 0.2}, (2, 3, 2, 2), "prob"),
    ("nll", "NLLLoss", {}, (6, 5), "class"),
    ("nll-weight-ignore", "NLLLoss", {"weight": "w", "ignore_index": 0}, (9, 4), "class-ignore"),
    ("nll-none-4d", "NLLLoss", {"reduction": "none", "ignore_index": -100}, (2, 3, 2, 3), "class-ignore"),
    ("nll-sum", "NLLLoss", {"reduction": "sum"}, (6, 5), "class"),
    ("mse-sum", "MSELoss", {"reduction": "sum"}, (3, 4), "real"),
    ("mse-none", "MSELoss", {"reduction": "none"}, (3, 4), "real"),
    ("l1", "L1Loss", {}, (3, 4), "real"),
    ("l1-sum", "L1Loss", {"reduction": "sum"}, (2, 3, 4), "real"),
    ("l1-none", "L1Loss", {"reduction": "none"}, (5,), "real"),
    ("smoothl1", "SmoothL1Loss", {}, (4, 5), "real"),
    ("smoothl1-beta", "SmoothL1Loss", {"beta": 0.3, "reduction": "sum"}, (4, 5), "real"),
    ("smoothl1-beta0", "SmoothL1Loss", {"beta": 0.0}, (4, 5), "real"),
    ("huber", "HuberLoss", {}, (4, 5), "real"),
    ("huber-delta", "HuberLoss", {"delta": 0.4, "reduction": "none"}, (4, 5), "real"),
    ("bce-weight", "BCELoss", {"weight": "e"}, (4, 3), "unit"),
    ("bce-sum", "BCELoss", {"reduction": "sum"}, (4, 3), "unit"),
    ("bcelogits", "BCEWithLogitsLoss", {}, (6, 3), "binary"),
    ("bcelogits-soft-sum", "BCEWithLogitsLoss", {"reduction": "sum"}, (6, 3), "unit"),
    ("bcelogits-pos-weight", "BCEWithLogitsLoss", {"pos_weight": "c"}, (6, 3), "binary"),
    ("bcelogits-all-none", "BCEWithLogitsLoss", {"pos_weight": "c", "weight": "e", "reduction": "none"}, (6, 3),
     "unit"),
]


def make_inputs(rng, shape, kind, kw, cls=""):
    pred = (rng.standard_normal(shape) * 2).astype(np.float32)
    c = shape[1] if len(shape) > 1 else shape[0]
    tshape = (shape[0],) + shape[2:]
    if kind == "class":
        target = class_targets(rng, tshape, c)
    elif kind == "class-ignore":
        target = class_targets(rng, tshape, c, kw.get("ignore_index", -100))
    elif kind == "prob":
        e = np.exp(rng.standard_normal(shape))
        target = (e / e.sum(1, keepdims=True)).astype(np.float32)
    elif kind == "binary":
        target = rng.integers(0, 2, shape).astype(np.float32)
    elif kind == "unit":
        target = rng.uniform(0, 1, shape).astype(np.float32)
        if cls == "BCELoss":  # probabilities
            pred = (1 / (1 + np.exp(-pred))).astype(np.float32)
    else:
        target = rng.standard_normal(shape).astype(np.float32)
    arrays = {"w": rng.uniform(0.2, 2.0, c).astype(np.float32),  # a weight per class
              "e": rng.uniform(0.2, 2.0, shape).astype(np.float32),  # a weight per element
              "c": rng.uniform(0.5, 3.0, shape[-1]).astype(np.float32)}  # per class, the last dimension
    kwargs = {k: arrays[v] if isinstance(v, str) and v in arrays else v for k, v in kw.items()}
    return pred, target, kwargs


def torch_reference(torch, cls, kwargs, pred, target, upstream):
    p = torch.tensor(pred, dtype=torch.float64, requires_grad=True)
    t = torch.tensor(target) if np.issubdtype(np.asarray(target).dtype, np.integer) else \
        torch.tensor(target, dtype=torch.float64)
    tk = {k: torch.tensor(v, dtype=torch.float64) if isinstance(v, np.ndarray) else v for k, v in kwargs.items()}
    loss = getattr(torch.nn, cls)(**tk)(p, t)
    (loss * torch.tensor(upstream)).sum().backward() if loss.ndim else loss.backward()
    return loss.detach().numpy(), p.grad.numpy()


@pytest.mark.parametrize("name,cls,kw,shape,kind", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("target_on_device", [False, True])
def test_loss_vs_torch(queue, rng, torch, record_error, name, cls, kw, shape, kind, target_on_device):
    pred, target, kwargs = make_inputs(rng, shape, kind, kw, cls)
    fn = getattr(nn, cls)(**kwargs)
    out_shape = torch_reference(torch, cls, kwargs, pred, target, np.ones(1))[0].shape
    upstream = rng.standard_normal(out_shape)
    ref_value, ref_grad = torch_reference(torch, cls, kwargs, pred, target, upstream)
    t = netcl.tensor(target, queue=queue) if target_on_device else target

    x = netcl.tensor(pred, queue=queue, requires_grad=True)  # through autograd
    loss = fn(x, t)
    assert loss.shape == ref_value.shape
    loss.backward(netcl.tensor(upstream.astype(np.float32), queue=queue) if loss.ndim else None)
    fwd = assert_close(loss.numpy(), ref_value, what=f"{name} value")
    bwd = assert_close(x.grad.numpy(), ref_grad, what=f"{name} gradient")
    record_error(fwd, bwd)

    if loss.ndim == 0:  # the explicit API: backward() after the call, and enqueue()
        fn(Tensor.from_host(queue, pred), t)
        assert_close(fn.backward().numpy(), ref_grad, what=f"{name} backward()")
        pending = fn.enqueue(Tensor.from_host(queue, pred), t)
        assert_close(fn.backward().numpy(), ref_grad, what=f"{name} enqueue's gradient")
        assert_close(np.float32(pending.item()), ref_value, what=f"{name} enqueue's value")
    else:
        with pytest.raises(ValueError, match="reduction 'mean' or 'sum'"):
            fn.enqueue(Tensor.from_host(queue, pred), t)


FUNCTIONAL = [  # (F function, torch function name, kwargs, shape, kind)
    (F.cross_entropy, "cross_entropy", {"weight": "w", "ignore_index": 1, "label_smoothing": 0.1}, (7, 4),
     "class-ignore"),
    (F.cross_entropy, "cross_entropy", {"reduction": "sum"}, (5, 3), "prob"),
    (F.nll_loss, "nll_loss", {"weight": "w", "reduction": "mean"}, (6, 4), "class"),
    (F.l1_loss, "l1_loss", {"reduction": "sum"}, (3, 3), "real"),
    (F.smooth_l1_loss, "smooth_l1_loss", {"beta": 0.5}, (3, 3), "real"),
    (F.huber_loss, "huber_loss", {"delta": 2.0}, (3, 3), "real"),
    (F.mse_loss, "mse_loss", {"reduction": "none"}, (3, 3), "real"),
    (F.binary_cross_entropy_with_logits, "binary_cross_entropy_with_logits", {"pos_weight": "c"}, (4, 3), "binary"),
]


@pytest.mark.parametrize("fn,tname,kw,shape,kind", FUNCTIONAL, ids=[f[1] for f in FUNCTIONAL])
def test_functional_losses_vs_torch(queue, rng, torch, fn, tname, kw, shape, kind):
    pred, target, kwargs = make_inputs(rng, shape, kind, kw)
    x = netcl.tensor(pred, queue=queue, requires_grad=True)
    loss = fn(x, target, **kwargs)
    loss.sum().backward() if loss.ndim else loss.backward()
    p = torch.tensor(pred, dtype=torch.float64, requires_grad=True)
    t = torch.tensor(target) if kind.startswith("class") else torch.tensor(target, dtype=torch.float64)
    ref = getattr(torch.nn.functional, tname)(p, t, **{k: torch.tensor(v, dtype=torch.float64)
                                                        if isinstance(v, np.ndarray) else v for k, v in kwargs.items()})
    ref.sum().backward()
    assert_close(loss.numpy(), ref.detach().numpy(), what=f"{tname} value")
    assert_close(x.grad.numpy(), p.grad.numpy(), what=f"{tname} gradient")


def test_plain_cross_entropy_keeps_its_kernel_and_ignores_labels(queue, rng, torch, monkeypatch):
    """The plain form on (N, C) runs as the fused kernel (two launches), ignore_index included, the
    labels on the host or the device; all labels ignored gives NaN as torch's mean of nothing."""
    from netcl import ops

    names = []
    enqueue = ops._enqueue
    monkeypatch.setattr(ops, "_enqueue", lambda q, k, *a: names.append(k.function_name) or enqueue(q, k, *a))
    pred = rng.standard_normal((8, 5)).astype(np.float32)
    p = torch.tensor(pred, dtype=torch.float64, requires_grad=True)
    for ignore in (-100, 3):
        y = class_targets(rng, (8,), 5, ignore=ignore)
        p.grad = None
        ref = torch.nn.CrossEntropyLoss(ignore_index=ignore)(p, torch.tensor(y))
        ref.backward()
        for labels in (y, netcl.tensor(y, queue=queue)):
            names.clear()
            x = netcl.tensor(pred, queue=queue, requires_grad=True)
            loss = nn.CrossEntropyLoss(ignore_index=ignore)(x, labels)
            assert names[-2:] == ["cross_entropy", "ce_sum"] and len(names) <= 3  # (int labels: a cast)
            loss.backward()
            assert_close(float(loss), ref.item(), what="value")
            assert_close(x.grad.numpy(), p.grad.numpy(), what="gradient")
    fn = nn.CrossEntropyLoss()
    nothing = fn(Tensor.from_host(queue, pred), np.full(8, -100))
    assert np.isnan(float(nothing)) and np.all(fn.backward().numpy() == 0)


def test_class_indices_out_of_range_are_refused(queue):
    x = Tensor.from_host(queue, np.zeros((3, 4), np.float32))
    for fn in (nn.NLLLoss(), nn.CrossEntropyLoss(label_smoothing=0.1), nn.CrossEntropyLoss(weight=np.ones(4)),
               nn.CrossEntropyLoss()):
        with pytest.raises(ValueError, match=r"integers in \[0, 4\)"):
            fn(x, [0, 4, 1])  # on the host: at once
        loss = fn(x, netcl.tensor(np.array([0, 4, 1]), queue=queue))  # on the device: when read
        with pytest.raises(ValueError, match=r"integers in \[0, 4\)"):
            float(loss)
        pending = fn.enqueue(x, netcl.tensor(np.array([0, -3, 1]), queue=queue))
        with pytest.raises(ValueError, match=r"integers in \[0, 4\)"):
            pending.item()
    assert float(nn.CrossEntropyLoss(ignore_index=1, reduction="sum")(
        x, netcl.tensor(np.array([0, 1, 1]), queue=queue))) == pytest.approx(np.log(4))


def test_loss_argument_errors(queue):
    x = Tensor.from_host(queue, np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match="reduction"):
        nn.L1Loss(reduction="avg")
    with pytest.raises(ValueError, match="label_smoothing"):
        nn.CrossEntropyLoss(label_smoothing=1.5)
    with pytest.raises(ValueError, match="weight has 2 entries"):
        nn.CrossEntropyLoss(weight=[1.0, 2.0])(x, [0, 1])
    with pytest.raises(ValueError, match="not supported for class-probability"):
        nn.CrossEntropyLoss(ignore_index=0)(x, np.full((2, 3), 1 / 3))
    with pytest.raises(ValueError, match="delta must be positive"):
        nn.HuberLoss(delta=0.0)
    with pytest.raises(ValueError, match="expects 2 class indices"):
        nn.NLLLoss()(x, [0, 1, 2])
    with pytest.raises(TypeError, match="ignore_index"):
        nn.NLLLoss(ignore_index=1.5)
    assert nn.MSELoss(size_average=False).reduction == "sum" and nn.L1Loss(reduce=False).reduction == "none"


def test_soft_targets_get_gradients_too(queue, rng, torch):
    """A target that requires grad (a teacher's probabilities) is differentiated as in torch."""
    logits, soft = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((4, 3)).astype(np.float32)
    x = netcl.tensor(logits, queue=queue, requires_grad=True)
    s = netcl.tensor(soft, queue=queue, requires_grad=True)
    nn.CrossEntropyLoss(label_smoothing=0.1)(x, s.softmax(1)).backward()
    p, t = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (logits, soft))
    torch.nn.CrossEntropyLoss(label_smoothing=0.1)(p, t.softmax(1)).backward()
    assert_close(x.grad.numpy(), p.grad.numpy(), what="logits' gradient")
    assert_close(s.grad.numpy(), t.grad.numpy(), what="target's gradient")
