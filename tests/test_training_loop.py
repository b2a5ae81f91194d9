"""The training loop around the optimizers: parameter groups, learning-rate schedulers (their rates
step for step, torch's), a schedule inside netcl.TrainStep (replayed, not recorded anew),
gradient clipping on the device, losses composed of tensor operations inside TrainStep."""
import numpy as np
import pytest
from conftest import assert_close, loop_step

import netcl
from netcl import Tensor, TrainStep, nn, ops, optim
from netcl.optim import lr_scheduler


def kernel_class(queue, monkeypatch, cls):
    """cls "gpu": the GPU kernel variants (one work-item per element, work-groups of 64) on this device."""
    if cls == "gpu":
        monkeypatch.setattr(ops, "_config_class", {queue.device.int_ptr: "gpu"})


def launches_named(monkeypatch):
    names, enqueue = [], ops._enqueue
    monkeypatch.setattr(ops, "_enqueue", lambda q, k, *a: names.append(k.function_name) or enqueue(q, k, *a))
    return names


# -- parameter groups -------------------------------------------------------------------------------
GROUPED = [
    ("SGD", {"lr": 0.1, "momentum": 0.9}, [{"lr": 0.01, "weight_decay": 0.1}, {"momentum": 0.0}, {"nesterov": True}]),
    ("Adam", {"lr": 1e-2}, [{"lr": 3e-3, "betas": (0.8, 0.99)}, {"weight_decay": 0.1, "amsgrad": True}, {}]),
    ("AdamW", {"lr": 1e-2, "weight_decay": 0.05}, [{"lr": 3e-3}, {"weight_decay": 0.0}, {"amsgrad": True}]),
    ("RMSprop", {"lr": 1e-2}, [{"momentum": 0.5}, {"centered": True, "alpha": 0.9}, {"lr": 1e-3}]),
]


@pytest.mark.parametrize("cls", ["native", "gpu"])
@pytest.mark.parametrize("name,defaults,groups", GROUPED, ids=[g[0] for g in GROUPED])
def test_parameter_groups_vs_torch(queue, rng, torch, record_error, monkeypatch, name, defaults, groups, cls):
    """Groups with their own settings, a group's lr changed between steps, a group added after the
    first steps: torch's parameters step for step; one update launch per group."""
    kernel_class(queue, monkeypatch, cls)
    shapes = [[(4, 3), (5,)], [(2, 3, 3)], [(6,), (3, 2)]]
    init = [[rng.standard_normal(s).astype(np.float32) for s in g] for g in shapes]
    ours = [[Tensor.from_host(queue, a) for a in g] for g in init]
    refs = [[torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in g] for g in init]
    opt = getattr(optim, name)([{"params": p, **kw} for p, kw in zip(ours[:2], groups)], **defaults)
    ref = getattr(torch.optim, name)([{"params": p, **kw} for p, kw in zip(refs[:2], groups)], **defaults)
    assert [sorted(k for k in g if k != "params") for g in opt.param_groups] == \
        [sorted(k for k in g if k in defaults or k in groups[0] or k in opt.defaults) for g in ref.param_groups]
    names = launches_named(monkeypatch)
    err = 0.0
    for step in range(8):
        if step == 3:
            opt.add_param_group({"params": ours[2], **groups[2]})
            ref.add_param_group({"params": refs[2], **groups[2]})
        if step == 5:
            opt.param_groups[0]["lr"] *= 0.5
            ref.param_groups[0]["lr"] *= 0.5
        live = 3 if step >= 3 else 2
        for g_ours, g_refs in zip(ours[:live], refs[:live]):
            for p, r in zip(g_ours, g_refs):
                g = rng.standard_normal(p.shape).astype(np.float32)
                p.grad, r.grad = Tensor.from_host(queue, g), torch.tensor(g, dtype=torch.float64)
        names.clear()
        opt.step()
        ref.step()
        assert len([n for n in names if n.endswith(("_step", "_step_cpu"))]) == live  # one launch per group
        for p, r in zip(sum(ours[:live], []), sum(refs[:live], [])):
            err = max(err, assert_close(p.to_host(), r.detach().numpy(), what=f"{name} step {step}"))
    record_error(err)


def test_parameter_group_errors_and_settings_as_attributes(queue):
    a, b = (Tensor.from_host(queue, np.ones(3, np.float32)) for _ in range(2))
    with pytest.raises(ValueError, match="parameter 1 is parameter 0 again"):
        optim.SGD([{"params": [a]}, {"params": [a]}], lr=0.1)
    with pytest.raises(ValueError, match="'params'"):
        optim.SGD([{"lr": 0.1}])
    with pytest.raises(ValueError, match="lr must be in"):
        optim.SGD([{"params": [a], "lr": -1.0}])
    with pytest.raises(TypeError, match="single Tensor"):
        optim.Adam(a)
    opt = optim.SGD([{"params": [a]}, {"params": [b], "lr": 0.5}], lr=0.1, momentum=0.9)
    assert opt.lr == 0.1 and opt.param_groups[1]["lr"] == 0.5 and opt.param_groups[1]["momentum"] == 0.9
    opt.lr = 0.2  # every group, as netcl's optimizers always allowed
    assert [g["lr"] for g in opt.param_groups] == [0.2, 0.2]
    with pytest.raises(ValueError, match="momentum"):
        opt.momentum = -1.0
    assert opt.momentum == 0.9
    sd = opt.state_dict()
    assert [g["params"] for g in sd["param_groups"]] == [[0], [1]]
    with pytest.raises(ValueError, match="2 parameter groups"):
        optim.SGD([a, b], lr=0.1).load_state_dict(sd)


# -- schedulers against torch's --------------------------------------------------------------------
def s_sequential(m, opt):
    S = m.optim.lr_scheduler
    return S.SequentialLR(opt, [S.LinearLR(opt, start_factor=0.1, total_iters=3),
                                S.CosineAnnealingLR(opt, T_max=6, eta_min=1e-3),
                                S.StepLR(opt, step_size=2, gamma=0.5)], milestones=[3, 9])


SCHEDULERS = {  # name -> (make(module, optimizer), optimizer kind, epochs)
    "StepLR": (lambda m, o: m.optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.5), "SGD", 12),
    "MultiStepLR": (lambda m, o: m.optim.lr_scheduler.MultiStepLR(o, milestones=[2, 5, 5, 8], gamma=0.3), "SGD", 12),
    "ExponentialLR": (lambda m, o: m.optim.lr_scheduler.ExponentialLR(o, gamma=0.9), "Adam", 10),
    "CosineAnnealingLR": (lambda m, o: m.optim.lr_scheduler.CosineAnnealingLR(o, T_max=5, eta_min=0.01), "SGD", 17),
    "LinearLR": (lambda m, o: m.optim.lr_scheduler.LinearLR(o, start_factor=0.25, end_factor=0.9, total_iters=4),
                 "AdamW", 8),
    "ConstantLR": (lambda m, o: m.optim.lr_scheduler.ConstantLR(o, factor=0.5, total_iters=3), "SGD", 6),
    "PolynomialLR": (lambda m, o: m.optim.lr_scheduler.PolynomialLR(o, total_iters=6, power=2.0), "SGD", 9),
    "LambdaLR": (lambda m, o: m.optim.lr_scheduler.LambdaLR(o, [lambda e: 0.95 ** e, lambda e: 1 / (e + 1)]),
                 "SGD", 6),
    "OneCycleLR": (lambda m, o: m.optim.lr_scheduler.OneCycleLR(o, max_lr=[0.5, 0.1], total_steps=20), "SGD", 19),
    "OneCycleLR-adam-3phase-linear": (lambda m, o: m.optim.lr_scheduler.OneCycleLR(
        o, max_lr=0.05, epochs=3, steps_per_epoch=5, three_phase=True, anneal_strategy="linear", pct_start=0.25),
        "Adam", 14),
    "OneCycleLR-no-momentum": (lambda m, o: m.optim.lr_scheduler.OneCycleLR(
        o, max_lr=0.2, total_steps=10, cycle_momentum=False, div_factor=10.0, final_div_factor=100.0), "RMSprop", 9),
    "SequentialLR": (s_sequential, "SGD", 14),
    "ReduceLROnPlateau": (lambda m, o: m.optim.lr_scheduler.ReduceLROnPlateau(o, factor=0.5, patience=1, cooldown=1,
                                                                              min_lr=[0.01, 0.0]), "SGD", 14),
    "ReduceLROnPlateau-max-abs": (lambda m, o: m.optim.lr_scheduler.ReduceLROnPlateau(
        o, mode="max", threshold=0.05, threshold_mode="abs", patience=0, eps=1e-3), "Adam", 14),
}
METRICS = [1.0, 0.9, 0.95, 0.97, 0.96, 0.8, 0.85, 0.85, 0.84, 0.9, 0.7, 0.71, 0.72, 0.73]


def optimizer_of(m, kind, params):
    return getattr(m.optim, kind)([{"params": params[:1]}, {"params": params[1:], "lr": 0.01}], lr=0.1,
                                  **({"momentum": 0.9} if kind in ("SGD", "RMSprop") else {}))


def settings(opt):
    return [(g["lr"], g.get("momentum"), tuple(g["betas"]) if "betas" in g else None) for g in opt.param_groups]


@pytest.mark.parametrize("name", list(SCHEDULERS))
def test_scheduler_rates_match_torch_step_for_step(torch, name):
    """Two parameter groups; each epoch the optimizer steps, then the scheduler: the same learning
    rates (and OneCycleLR's momenta) as torch's, exactly; state_dict() restores a scheduler made anew
    mid-way, which then goes on as the original."""
    make, kind, epochs = SCHEDULERS[name]
    ours_p = [Tensor.from_host(None, np.zeros(2, np.float32)) for _ in range(2)]
    refs_p = [torch.zeros(2, requires_grad=True) for _ in range(2)]
    ours, ref = optimizer_of(netcl, kind, ours_p), optimizer_of(torch, kind, refs_p)
    s, r = make(netcl, ours), make(torch, ref)
    plateau = name.startswith("ReduceLROnPlateau")
    assert s.get_last_lr() == r.get_last_lr() and settings(ours) == settings(ref)
    for epoch in range(epochs):
        ours.step()
        ref.step()
        if plateau:
            s.step(METRICS[epoch])
            r.step(METRICS[epoch])
        else:
            s.step()
            r.step()
        assert s.get_last_lr() == r.get_last_lr(), f"epoch {epoch}"
        assert settings(ours) == settings(ref), f"epoch {epoch}"
        if epoch == epochs // 2 and name != "LambdaLR":  # a resumed run: a new optimizer and scheduler, loaded
            state, opt_state = s.state_dict(), ours.state_dict()
            ours = optimizer_of(netcl, kind, ours_p)
            s = make(netcl, ours) if name != "SequentialLR" else s_sequential(netcl, ours)
            ours.load_state_dict(opt_state)
            s.load_state_dict(state)
            assert s.get_last_lr() == r.get_last_lr() and settings(ours) == settings(ref)


def test_scheduler_errors():
    p = [Tensor.from_host(None, np.zeros(2, np.float32))]
    opt = optim.SGD(p, lr=0.1)
    S = lr_scheduler
    with pytest.raises(TypeError, match="netcl optimizer"):
        S.StepLR(object(), 3)
    with pytest.raises(ValueError, match="step_size"):
        S.StepLR(opt, 0)
    with pytest.raises(ValueError, match="start_factor"):
        S.LinearLR(opt, start_factor=0.0)
    with pytest.raises(ValueError, match="total_steps"):
        S.OneCycleLR(opt, max_lr=0.1)
    with pytest.raises(ValueError, match="one value per parameter group"):
        S.OneCycleLR(opt, max_lr=[0.1, 0.2], total_steps=5)
    with pytest.raises(ValueError, match="ReduceLROnPlateau"):
        S.SequentialLR(opt, [S.ReduceLROnPlateau(opt)], milestones=[])
    with pytest.raises(ValueError, match="one milestone fewer"):
        S.SequentialLR(opt, [S.StepLR(opt, 2), S.StepLR(opt, 3)], milestones=[])
    with pytest.raises(ValueError, match="mode"):
        S.ReduceLROnPlateau(opt, mode="lowest")
    with pytest.raises(KeyError, match="initial_lr"):
        S.StepLR(optim.SGD([Tensor.from_host(None, np.zeros(1, np.float32))], lr=0.1), 3, last_epoch=4)
    sched = S.OneCycleLR(opt, max_lr=0.1, total_steps=2)
    sched.step(), sched.step()
    with pytest.raises(ValueError, match="Tried to step 3 times"):
        sched.step()


# -- a schedule inside TrainStep -------------------------------------------------------------------
def mlp():
    return nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 20))


@pytest.mark.parametrize("kind", ["StepLR-per-epoch", "OneCycleLR-per-batch"])
def test_trainstep_replays_through_a_schedule(queue, rng, kind):
    """The optimizer's settings are replay arguments read from its groups: a scheduler stepping
    every epoch (StepLR) or every batch (OneCycleLR, which also cycles the momentum) never makes
    the step record again; the result equals the layer calls bit for bit."""
    def build():
        netcl.manual_seed(0)
        model = mlp().to(queue).train()
        opt = optim.SGD([{"params": model.parameters()[:2], "lr": 0.05}, {"params": model.parameters()[2:]}],
                        lr=0.1, momentum=0.9)
        sched = lr_scheduler.StepLR(opt, step_size=1, gamma=0.7) if kind.startswith("StepLR") else \
            lr_scheduler.OneCycleLR(opt, max_lr=[0.1, 0.2], total_steps=40)
        return model, nn.CrossEntropyLoss(), opt, sched
    (ma, la, oa, sa), (mb, lb, ob, sb) = build(), build()
    step = TrainStep(ma, la, oa)
    data = [(rng.standard_normal((8, 12)).astype(np.float32), rng.integers(0, 20, 8)) for _ in range(4)]
    rates = set()
    for epoch in range(8):
        for x, y in data:
            assert step(x, y).item() == loop_step(mb, lb, ob, x, y).item()
            if kind.startswith("OneCycleLR"):
                sa.step(), sb.step()
        if kind.startswith("StepLR"):
            sa.step(), sb.step()
        rates.add(oa.param_groups[1]["lr"])
    assert len(rates) == 8 and step.eager_reason is None
    assert step.replays == 8 * len(data) - 3  # the first call and the two recorded ones, then only replays
    for (key, a), (_, b) in zip(ma.named_tensors(), mb.named_tensors()):
        np.testing.assert_array_equal(a.to_host(), b.to_host(), err_msg=key)


@pytest.mark.parametrize("loss", ["ce-smoothing", "bce-logits", "huber"])
def test_trainstep_replays_composed_losses(queue, rng, loss):
    """A loss composed of tensor operations: recorded and replayed as the layer calls, bit for bit."""
    def build():
        netcl.manual_seed(0)
        model = mlp().to(queue).train()
        fn = {"ce-smoothing": lambda: nn.CrossEntropyLoss(label_smoothing=0.1, weight=np.linspace(0.5, 1.5, 20)),
              "bce-logits": lambda: nn.BCEWithLogitsLoss(pos_weight=np.full(20, 2.0, np.float32)),
              "huber": lambda: nn.HuberLoss(delta=0.5)}[loss]()
        return model, fn, optim.Adam(model.parameters(), lr=1e-2)
    a, b = build(), build()
    step = TrainStep(*a)
    for _ in range(7):
        x = rng.standard_normal((8, 12)).astype(np.float32)
        y = rng.integers(0, 20, 8) if loss == "ce-smoothing" else rng.integers(0, 2, (8, 20)).astype(np.float32)
        assert step(x, y).item() == loop_step(*b, x, y).item()
    assert step.replays == 4 and step.eager_reason is None
    for (key, ta), (_, tb) in zip(a[0].named_tensors(), b[0].named_tensors()):
        np.testing.assert_array_equal(ta.to_host(), tb.to_host(), err_msg=key)


# -- gradient clipping -----------------------------------------------------------------------------
@pytest.mark.parametrize("cls", ["native", "gpu"])
@pytest.mark.parametrize("norm_type", [2.0, 1.0, float("inf"), 3.0])
@pytest.mark.parametrize("max_norm", [0.5, 1e3])
@pytest.mark.parametrize("in_optimizer", [False, True])
def test_clip_grad_norm_vs_torch(queue, rng, torch, record_error, monkeypatch, norm_type, max_norm, in_optimizer,
                                 cls):
    """The total norm (a 0-d device Tensor, not read) and the clipped gradients, as torch's; with the
    gradients in an optimizer's flat buffer three launches and no read (a parameter without a gradient
    in the middle splits the run)."""
    import pyopencl as cl

    kernel_class(queue, monkeypatch, cls)
    shapes = [(5, 3), (7,), (2, 3, 3), (4,), (6, 2)]
    params = [Tensor.from_host(queue, rng.standard_normal(s).astype(np.float32)).requires_grad_() for s in shapes]
    grads = [rng.standard_normal(s).astype(np.float32) * 3 for s in shapes]
    grads[3] = None
    if in_optimizer:
        opt = optim.SGD(params, lr=0.1)
        for p in params:
            p.grad = Tensor.zeros(queue, p.shape)
        opt.step()
        opt.zero_grad()
    for p, g in zip(params, grads):
        if g is not None:
            t, _ = ops.grad_target(p)  # where a backward would write it
            t.set_(g)
    refs = [torch.zeros(s, dtype=torch.float64, requires_grad=True) for s in shapes]
    for r, g in zip(refs, grads):
        r.grad = None if g is None else torch.tensor(g, dtype=torch.float64)
    names, reads, copy = launches_named(monkeypatch), [0], cl.enqueue_copy
    monkeypatch.setattr(cl, "enqueue_copy", lambda q, d, s, **kw: reads.__setitem__(0, reads[0] + isinstance(
        d, np.ndarray)) or copy(q, d, s, **kw))
    norm = nn.utils.clip_grad_norm_(params, max_norm, norm_type)
    assert reads[0] == 0 and norm.shape == () and norm.on_device
    if in_optimizer:
        assert len(names) == 5  # the two runs' partial norms, the total, the two runs' scalings
    monkeypatch.setattr(cl, "enqueue_copy", copy)
    ref = torch.nn.utils.clip_grad_norm_(refs, max_norm, norm_type)
    err = assert_close(float(norm), ref.item(), what="norm")
    for p, r in zip(params, refs):
        if r.grad is not None:
            err = max(err, assert_close(p.grad.numpy(), r.grad.numpy(), what="clipped gradient"))
        else:
            assert p.grad is None
    record_error(err)


@pytest.mark.parametrize("cls", ["native", "gpu"])
def test_the_norm_has_the_same_bits_wherever_the_gradients_live(queue, rng, monkeypatch, cls):
    """In an optimizer's flat buffer (one run) or each in a buffer of its own: the same partials in the
    same order, so the same norm and clipped gradients, bit for bit (a resumed run clips as the
    uninterrupted one)."""
    kernel_class(queue, monkeypatch, cls)
    grads = [rng.standard_normal(s).astype(np.float32) * 3 for s in [(300, 7), (5,), (4097,), (2, 2)]]
    results = []
    for in_place in (False, True):
        params = [Tensor.from_host(queue, np.zeros(g.shape, np.float32)).requires_grad_() for g in grads]
        if in_place:
            opt = optim.SGD(params, lr=0.1)
            for p in params:
                p.grad = Tensor.zeros(queue, p.shape)
            opt.step()
            opt.zero_grad()
        for p, g in zip(params, grads):
            ops.grad_target(p)[0].set_(g)
        assert all(p.grad_home is not None and p.grad_home.holds(p.grad) for p in params) == in_place
        norm = nn.utils.clip_grad_norm_(params, 1.0)
        results.append((norm.numpy().copy(), [p.grad.to_host() for p in params]))
    (na, ga), (nb, gb) = results
    np.testing.assert_array_equal(na, nb)
    for a, b in zip(ga, gb):
        np.testing.assert_array_equal(a, b)


def test_clip_grad_value_and_errors(queue, rng, torch):
    params = [Tensor.from_host(queue, np.zeros(s, np.float32)) for s in [(4, 3), (5,)]]
    grads = [rng.standard_normal(p.shape).astype(np.float32) * 2 for p in params]
    grads[0][0, 0] = np.nan
    for p, g in zip(params, grads):
        p.grad = Tensor.from_host(queue, g)
    assert nn.utils.clip_grad_value_(params, 0.7) is None
    for p, g in zip(params, grads):
        want = torch.clamp(torch.tensor(g, dtype=torch.float64), -0.7, 0.7).numpy()
        np.testing.assert_array_equal(np.isnan(p.grad.numpy()), np.isnan(want))
        assert_close(np.nan_to_num(p.grad.numpy()), np.nan_to_num(want), what="clamped")
    with pytest.raises(RuntimeError, match="non-finite"):
        nn.utils.clip_grad_norm_(params, 1.0, error_if_nonfinite=True)
    assert np.isnan(params[0].grad.numpy()[0, 0])  # nothing clipped
    with pytest.raises(ValueError, match="norm_type"):
        nn.utils.clip_grad_norm_(params, 1.0, norm_type=0)
    with pytest.raises(TypeError, match="netcl Tensors"):
        nn.utils.clip_grad_norm_([np.zeros(3)], 1.0)
    assert float(nn.utils.clip_grad_norm_([Tensor.from_host(queue, np.zeros(2, np.float32))], 1.0)) == 0.0
