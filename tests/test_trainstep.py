"""netcl.TrainStep: a replayed step is the step. Every test trains a model with TrainStep and a twin
(same seed) with the layer calls it stands for, and compares them bit for bit: the replay runs the
same kernels with the same arguments in the same order, so any difference is a replay bug."""
import threading

import numpy as np
import pytest
from conftest import loop_step

import netcl
from netcl import Tensor, TrainStep, models, nn, ops, optim, runtime, trainstep


@pytest.fixture(autouse=True)
def layer_call_head(monkeypatch):
    """The classifier's head as the layer calls run it: these tests compare the replay with them bit
    for bit (tests/test_head.py has the head TrainStep runs as one kernel on CPUs)."""
    monkeypatch.setattr(trainstep, "_HEAD_MAX", 0)


def small_detector():
    layers = []
    for c_in, c_out in ((3, 8), (8, 16)):
        layers += [nn.Conv2d(c_in, c_out, 3, padding=1), nn.BatchNorm2d(c_out), nn.LeakyReLU(0.1), nn.MaxPool2d(2)]
    return nn.Sequential(*layers, nn.Conv2d(16, 5, 1), nn.Sigmoid())


CASES = {  # name -> (model, input shape, loss, optimizer, hyperparameters)
    "resnet8-sgd-ce": (models.resnet8, (2, 3, 32, 32), "ce", "SGD",
                       {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 5e-4}),
    "detector-sgd-mse": (small_detector, (2, 3, 32, 32), "mse", "SGD", {"lr": 0.01, "momentum": 0.9}),
    "mlp-sgd-ce": (models.mlp, (8, 64), "ce", "SGD", {"lr": 0.1, "momentum": 0.9, "dampening": 0.1}),
    "mlp-adam-mse": (models.mlp, (5, 64), "mse", "Adam", {"lr": 1e-2}),
}


def twins(queue, case):
    """Two identical (model, loss, optimizer) of CASES[case]."""
    build, shape, loss, opt_name, hyper = CASES[case]
    out = []
    for _ in range(2):
        netcl.manual_seed(0)
        model = build().to(queue).train()
        out.append((model, nn.MSELoss() if loss == "mse" else nn.CrossEntropyLoss(),
                    getattr(optim, opt_name)(model.parameters(), **hyper)))
    return out


def batches(rng, case, n, model):
    _, shape, loss, _, _ = CASES[case]
    out_shape = model.output_shape(shape)
    return [(rng.standard_normal(shape).astype(np.float32),
             rng.integers(0, out_shape[1], shape[0]) if loss == "ce" else rng.uniform(0, 1, out_shape).astype(np.float32))
            for _ in range(n)]


def assert_same_state(a, b):
    (ma, _, oa), (mb, _, ob) = a, b
    for (key, ta), (_, tb) in zip(ma.named_tensors(), mb.named_tensors()):
        np.testing.assert_array_equal(ta.to_host(), tb.to_host(), err_msg=key)
    sa, sb = oa.state_dict()["state"], ob.state_dict()["state"]
    assert sa.keys() == sb.keys()
    for i in sa:
        assert sa[i].keys() == sb[i].keys()
        for k in sa[i]:
            np.testing.assert_array_equal(sa[i][k], sb[i][k], err_msg=f"{i}.{k}")


def launches_during(monkeypatch, fn):
    n, enqueue = [0], ops._enqueue

    def counted(*args):
        n[0] += 1
        return enqueue(*args)
    monkeypatch.setattr(ops, "_enqueue", counted)
    try:
        return fn(), n[0]
    finally:
        monkeypatch.setattr(ops, "_enqueue", enqueue)


@pytest.mark.parametrize("case", list(CASES))
def test_replayed_steps_match_the_layer_calls_bit_for_bit(queue, rng, monkeypatch, case):
    a, b = twins(queue, case)
    step = TrainStep(*a)
    data = batches(rng, case, 7, a[0])
    got, want = [], []
    for i, (x, y) in enumerate(data):
        if i < 3:
            got.append(step(x, y))
        else:  # replays: no layer Python, so no launch through ops, no buffer made, nothing built
            before = runtime.stats()
            pending, launched = launches_during(monkeypatch, lambda: step(x, y))
            got.append(pending)
            assert launched == 0 and runtime.stats() == before
        want.append(loop_step(*b, x, y))
        np.testing.assert_array_equal(step.output.numpy(), b[0].forward_output.numpy())
    assert step.replays == 4 and step.eager_reason is None and step.launches > 0
    # each PendingLoss reads its own step's loss, read after all of them ran
    assert [p.item() for p in got] == [p.item() for p in want]
    assert_same_state(a, b)


def test_new_input_tensors_are_read_in_place(queue, rng):
    """Device inputs are bound into the replay (no copy), host ones uploaded; mixed freely."""
    a, b = twins(queue, "detector-sgd-mse")
    step = TrainStep(*a)
    for i, (x, y) in enumerate(batches(rng, "detector-sgd-mse", 8, a[0])):
        xin = Tensor.from_host(queue, x) if i % 3 else x
        yin = Tensor.from_host(queue, y) if i % 2 else y
        assert step(xin, yin).item() == loop_step(*b, xin, yin).item()
    assert step.replays == 5
    assert_same_state(a, b)


def test_dropout_draws_a_new_seed_for_every_replay(queue, rng):
    """Dropout's seed comes from netcl's generator at each call (ops.varies): a replay draws it as
    the layer calls would, so with the generator reseeded both runs give the same masks."""
    def build():
        netcl.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 3)).to(queue).train()
        return model, nn.CrossEntropyLoss(), optim.Adam(model.parameters(), lr=0.01)
    a, b = build(), build()
    data = [(rng.standard_normal((4, 8)).astype(np.float32), rng.integers(0, 3, 4)) for _ in range(8)]
    step = TrainStep(*a)
    netcl.manual_seed(1)
    got = [step(x, y).item() for x, y in data]
    netcl.manual_seed(1)
    want = [loop_step(*b, x, y).item() for x, y in data]
    assert step.replays == 5 and got == want and len(set(got)) == len(got)
    assert_same_state(a, b)


def test_a_changed_setting_records_anew(queue, rng):
    """A setting that chooses the optimizer's launches (nesterov), a layer's setting: the step sees
    each change and runs eagerly until it has recorded the new step. A changed learning rate (a
    scheduler's) is read by the replays themselves. Weights loaded in place, or train/eval and
    back, change nothing a replay depends on."""
    a, b = twins(queue, "detector-sgd-mse")
    step = TrainStep(*a)
    data = iter(batches(rng, "detector-sgd-mse", 24, a[0]))

    def both(calls):
        for _ in range(calls):
            x, y = next(data)
            assert step(x, y).item() == loop_step(*b, x, y).item()
    both(4)
    assert step.replays == 1
    for o in (a[2], b[2]):
        o.lr = 0.05
    both(4)
    assert step.replays == 5  # replayed with the new rate
    for o in (a[2], b[2]):
        o.nesterov = True
    both(4)
    assert step.replays == 7  # two eager calls (recorded), then replays
    for m in (a[0], b[0]):
        m.eval()
    with pytest.raises(ValueError, match="model.train"):
        step(*next(data))
    for m in (a[0], b[0]):
        m.train()
    both(2)
    assert step.replays == 9
    for m in (a[0], b[0]):
        act = next(l for _, l in m.chain() if isinstance(l, nn.LeakyReLU))
        act.negative_slope = act.slope = 0.2
    both(4)
    assert step.replays == 11
    state = {k: v * 0.5 for k, v in a[0].state_dict().items()}
    for m in (a[0], b[0]):
        m.load_state_dict(state)
    both(2)
    assert step.replays == 13
    assert_same_state(a, b)


def test_parameters_read_between_replays_are_current(queue, rng):
    """A replay marks what it wrote: host copies read before it are not served stale after it,
    and the fused inference path refolds the new weights."""
    a, b = twins(queue, "detector-sgd-mse")
    step = TrainStep(*a)
    pa, pb = a[0].parameters()[0], b[0].parameters()[0]
    x_eval = rng.standard_normal((2, 3, 32, 32)).astype(np.float32)
    for i, (x, y) in enumerate(batches(rng, "detector-sgd-mse", 7, a[0])):
        step(x, y)
        loop_step(*b, x, y)
        np.testing.assert_array_equal(pa.numpy(), pb.numpy())
        if i >= 4:
            a[0].eval(), b[0].eval()
            np.testing.assert_array_equal(a[0].predict(x_eval), b[0].predict(x_eval))
            a[0].train(), b[0].train()
    assert step.replays >= 1


class HostReader(nn.Module):
    """An identity layer that reads its input to the host in the middle of the step."""
    seen = None

    def forward(self, x, stats=False):
        self.seen = float(x.to_host().mean())
        return x

    def backward(self, dy):
        return dy


def test_a_step_reading_the_host_in_the_middle_stays_eager(queue, rng):
    netcl.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 4), HostReader(), nn.Linear(4, 3)).to(queue).train()
    step = TrainStep(model, nn.CrossEntropyLoss(), optim.SGD(model.parameters(), lr=0.1))
    for _ in range(5):
        x = rng.standard_normal((4, 8)).astype(np.float32)
        step(x, rng.integers(0, 3, 4)).item()
    assert step.replays == 0 and "read to the host" in step.eager_reason


def test_calls_from_two_threads_take_turns(queue, rng):
    """Both threads train on the same batch, so any order of their calls gives the same result."""
    a, b = twins(queue, "mlp-sgd-ce")
    step = TrainStep(*a)
    x, y = batches(rng, "mlp-sgd-ce", 1, a[0])[0]
    losses = {0: [], 1: []}

    def train(t):
        for _ in range(6):
            losses[t].append(step(x, y))
    threads = [threading.Thread(target=train, args=(t,)) for t in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    want = sorted(loop_step(*b, x, y).item() for _ in range(12))
    assert sorted(p.item() for p in losses[0] + losses[1]) == want
    assert step.replays == 9
    assert_same_state(a, b)


def test_bad_arguments_and_targets_raise_with_what_was_expected(queue, rng):
    netcl.manual_seed(0)
    model = models.mlp().to(queue).train()
    opt = optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(TypeError, match="optimizer"):
        TrainStep(model, nn.CrossEntropyLoss(), "sgd")
    with pytest.raises(TypeError, match="loss"):
        TrainStep(model, lambda p, t: 0.0, opt)
    step = TrainStep(model, nn.CrossEntropyLoss(), opt)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    with pytest.raises(ValueError, match=r"integers in \[0, 10\)"):
        step(x, [0, 1, 2, 10])
    with pytest.raises(ValueError, match="4 class indices"):
        step(x, [0, 1, 2])
    with pytest.raises(ValueError, match="target shape"):
        TrainStep(model, nn.MSELoss(), opt)(x, np.zeros((4, 3), np.float32))
    assert step.replays == 0


# -- what a replay cannot see in its commands (found in review, each reproduced first) ------------
def mlp_data(rng, n):
    return [(rng.standard_normal((8, 64)).astype(np.float32), rng.integers(0, 10, 8)) for _ in range(n)]


def test_an_optimizer_checkpoint_loaded_between_replays_is_used(queue, rng):
    """load_state_dict makes new state dicts and tensors: the replay's are no longer the optimizer's."""
    a, b = twins(queue, "mlp-sgd-ce")
    step = TrainStep(*a)
    for i, (x, y) in enumerate(mlp_data(rng, 12)):
        if i == 1:
            saved = b[2].state_dict()
        if i == 6:
            a[2].load_state_dict(saved), b[2].load_state_dict(saved)
        assert step(x, y).item() == loop_step(*b, x, y).item()
    assert step.replays >= 4
    assert_same_state(a, b)


def test_a_gradient_held_from_an_eager_backward_keeps_its_values(queue, rng):
    a, b = twins(queue, "mlp-sgd-ce")
    step = TrainStep(*a)
    data = mlp_data(rng, 7)
    for x, y in data[:5]:
        step(x, y), loop_step(*b, x, y)
    held = []
    for m, loss_fn, opt in (a, b):
        loss_fn.enqueue(m(Tensor.from_host(queue, data[5][0])), data[5][1])
        m.backward(loss_fn.backward(), input_grad=False)
        held.append([p.grad for p in m.parameters()])  # kept, e.g. for logging
        opt.zero_grad()
    replays = step.replays
    step(*data[6]), loop_step(*b, *data[6])
    assert step.replays == replays + 1
    for ga, gb in zip(*held):
        np.testing.assert_array_equal(ga.to_host(), gb.to_host())
    assert_same_state(a, b)


def test_a_parameter_outside_the_optimizer_keeps_its_gradient_current(queue, rng):
    """A frozen layer's gradient accumulates step after step; reads of it are current, and
    clearing it by hand starts it anew, as the layer calls do."""
    pairs = []
    for _ in range(2):
        netcl.manual_seed(0)
        m = models.mlp().to(queue).train()
        pairs.append((m, nn.CrossEntropyLoss(), optim.SGD(m.parameters()[-2:], lr=0.1, momentum=0.9)))
    a, b = pairs
    step = TrainStep(*a)
    fa, fb = a[0].parameters()[0], b[0].parameters()[0]
    for i, (x, y) in enumerate(mlp_data(rng, 10)):
        assert step(x, y).item() == loop_step(*b, x, y).item()
        np.testing.assert_array_equal(fa.grad.numpy(), fb.grad.numpy())
        if i == 5:
            fa.grad = fb.grad = None
    assert step.replays >= 4
    assert_same_state(a, b)


class Accumulate(nn.Module):
    """y = x + s, then s <- s + x as a new tensor: state carried from step to step in new buffers."""

    def __init__(self, queue, shape):
        super().__init__()
        self.s = Tensor.zeros(queue, shape)

    def forward(self, x, stats=False):
        y = ops.add(x, self.s)
        self.s = ops.add(self.s, x)
        return y

    def backward(self, dy):
        return dy


def test_state_carried_between_steps_in_new_buffers_is_not_replayed(queue, rng):
    """Step 2 reads S1 and writes S2, step 3 reads S2 and writes S3: the recordings correspond one
    to one, but a replay of step 3 would read S2 for ever. A buffer that held data before its
    recording must be the same in both."""
    pairs = []
    for _ in range(2):
        netcl.manual_seed(0)
        m = nn.Sequential(nn.Linear(16, 16), Accumulate(queue, (8, 16)), nn.Linear(16, 4)).to(queue).train()
        pairs.append((m, nn.MSELoss(), optim.SGD(m.parameters(), lr=0.01)))
    step = TrainStep(*pairs[0])
    for _ in range(7):
        x, y = rng.standard_normal((8, 16)).astype(np.float32), rng.standard_normal((8, 4)).astype(np.float32)
        assert step(x, y).item() == loop_step(*pairs[1], x, y).item()
    assert step.replays == 0 and "argument" in step.eager_reason


def test_a_process_wide_switch_records_anew(queue, rng, monkeypatch):
    """Sequential.TRAIN_FUSE and NETCL_CPU_WINOT choose kernels: a change records the step anew."""
    from netcl.nn import sequential

    a, b = twins(queue, "detector-sgd-mse")
    step = TrainStep(*a)
    data = batches(rng, "detector-sgd-mse", 8, a[0])
    for x, y in data[:4]:
        assert step(x, y).item() == loop_step(*b, x, y).item()
    assert step.replays == 1
    monkeypatch.setattr(sequential, "TRAIN_FUSE", not sequential.TRAIN_FUSE)
    for x, y in data[4:]:
        assert step(x, y).item() == loop_step(*b, x, y).item()
    assert step.replays == 3  # two recorded eager calls after the switch
    assert_same_state(a, b)


def test_replay_off_runs_the_layer_calls(queue, rng, monkeypatch):
    """replay=False, or NETCL_TRAIN_REPLAY=0 for the default: never a recording, the same results."""
    monkeypatch.setenv("NETCL_TRAIN_REPLAY", "0")
    a, b = twins(queue, "mlp-sgd-ce")
    for step in (TrainStep(*a), TrainStep(*a, replay=False)):
        for x, y in mlp_data(rng, 5):
            assert step(x, y).item() == loop_step(*b, x, y).item()
        assert step.replays == 0 and step.launches is None and step.eager_reason is None
    monkeypatch.delenv("NETCL_TRAIN_REPLAY")
    assert TrainStep(*a).replay and not TrainStep(*a, replay=False).replay
    assert_same_state(a, b)


# -- the second review's cases (each reproduced against the code before its fix) -----------------
def dropout_mlp(queue, opt="SGD", extra=None, block=None):
    netcl.manual_seed(0)
    layers = [nn.Linear(8, 16), nn.ReLU()] + ([block()] if block else []) + [nn.Dropout(0.5), nn.Linear(16, 3)]
    model = nn.Sequential(*layers).to(queue).train()
    params = model.parameters() + ([extra] if extra is not None else [])
    return model, nn.CrossEntropyLoss(), getattr(optim, opt)(params, lr=0.1)


def run_both(a, b, rng, n, before=lambda i, twin: None):
    """TrainStep on twin a, the layer calls on twin b, each from netcl's generator reseeded (Dropout
    draws from it); before(i, twin) runs ahead of call i. (the TrainStep, its losses, b's losses)"""
    data = [(rng.standard_normal((4, 8)).astype(np.float32), rng.integers(0, 3, 4)) for _ in range(n)]
    step, out = TrainStep(*a), []
    for twin, call in ((a, step), (b, lambda x, y: loop_step(*b, x, y))):
        netcl.manual_seed(5)
        losses = []
        for i, (x, y) in enumerate(data):
            before(i, twin)
            losses.append(call(x, y).item())
        out.append(losses)
    return step, out[0], out[1]


def test_a_setting_given_as_a_numpy_number_is_checked(queue, rng):
    a, b = dropout_mlp(queue), dropout_mlp(queue)
    ps = np.linspace(0.5, 0.1, 3)  # np.float64: Dropout.p set from an array

    def set_p(i, twin):
        twin[0][2].p = ps[min(i // 6, 2)]
    step, got, want = run_both(a, b, rng, 14, set_p)
    assert got == want and step.replays >= 4
    assert_same_state(a, b)


def test_a_hand_set_gradient_of_a_parameter_outside_the_model_is_used(queue, rng):
    extras = [Tensor.from_host(queue, np.ones(4, np.float32)) for _ in range(2)]
    a, b = dropout_mlp(queue, "Adam", extras[0]), dropout_mlp(queue, "Adam", extras[1])

    def set_grad(i, twin):
        if i == 7:
            extra = twin[2].params[-1]
            extra.grad = Tensor.from_host(queue, np.full(4, 0.5, np.float32))
    step, got, want = run_both(a, b, rng, 10, set_grad)
    assert got == want and step.replays >= 4 and extras[0].grad is None
    np.testing.assert_array_equal(extras[0].to_host(), extras[1].to_host())
    assert_same_state(a, b)


def test_a_step_count_set_by_hand_is_seen(queue, rng):
    """Adam's bias corrections restarted for one layer: its parameters get a launch of their own."""
    a, b = dropout_mlp(queue, "Adam"), dropout_mlp(queue, "Adam")

    def restart(i, twin):
        if i == 6:
            for st in twin[2].state[2:]:
                st["step"] = 0
    step, got, want = run_both(a, b, rng, 10, restart)
    assert got == want and step.replays >= 3
    assert_same_state(a, b)


class StochasticDepth(nn.Module):
    """Skips its block with probability p, drawn from netcl's generator on the host."""

    def __init__(self, p=0.01):
        super().__init__()
        self.p, self.block = p, nn.Linear(16, 16)

    def named_children(self):
        return [("block", self.block)]

    def forward(self, x, stats=False):
        self._skip = bool(netcl.nn.module.rng().random() < self.p)
        return x if self._skip else self.block(x)

    def backward(self, dy):
        return dy if self._skip else self.block.backward(dy)


def test_a_draw_from_netcls_generator_that_no_launch_declares_is_not_replayed(queue, rng):
    """A replay draws only through ops.varies: a layer drawing on the host would leave the generator
    behind the layer calls' (every later dropout seed different)."""
    a, b = dropout_mlp(queue, block=StochasticDepth), dropout_mlp(queue, block=StochasticDepth)
    step, got, want = run_both(a, b, rng, 8)
    assert got == want and step.replays == 0 and "generator" in step.eager_reason
    assert_same_state(a, b)


def test_the_replay_switch_reads_common_spellings(queue, monkeypatch):
    a = twins(queue, "mlp-sgd-ce")[0]
    for off in ("0", "false", "No", " off "):
        monkeypatch.setenv("NETCL_TRAIN_REPLAY", off)
        assert not TrainStep(*a).replay
    monkeypatch.setenv("NETCL_TRAIN_REPLAY", "1")
    assert TrainStep(*a).replay


def test_a_replay_shares_buffers_whose_commands_do_not_overlap(queue):
    """_share_buffers: a buffer the step made takes an earlier one's place once that one's last
    command has run, if it is as large and nothing but the recording holds it."""
    from netcl.runtime import Recorder, alloc
    from netcl.trainstep import _share_buffers

    rec = Recorder().start()
    try:
        b1, b2, b3, small, big = (alloc(queue, n) for n in (256, 256, 256, 64, 512))
    finally:
        rec.stop()
    for b in (b1, b1, b2, b3, small, big):
        rec.fill(b, 0.0, 4)
    held = b3  # a Python reference beyond the recording's: b3 must keep its own buffer
    ptrs = [b.int_ptr for b in (b1, b2, b3, small, big)]
    del b1, b2, b3, small, big, b
    out = [c[1].int_ptr for c in _share_buffers(rec)]
    assert out == [ptrs[0], ptrs[0], ptrs[0], ptrs[2], ptrs[0], ptrs[4]]  # b2 and small in b1; big alone
    assert held.int_ptr == ptrs[2]
