"""Training fuses a BatchNorm2d with the activation right after it (netcl.nn.sequential.TRAIN_FUSE,
kernels/bn_act.h): the forward output, dx, every parameter gradient and the running statistics
equal the unfused layers' (float32 noise) and float64 PyTorch's, on the CPU kernels and on the
GPU kernels (forced on this device), with fewer launches per step."""
import numpy as np
import pytest
from conftest import assert_close, use_cpu_class

from netcl import Tensor, nn, ops
from netcl.apps.bench import torch_layer
from netcl.nn import norm, sequential

# name -> (netcl layer class, its keyword arguments, the torch module): activations that
# differentiate through their input (z recomputed) and through their output (Sigmoid, Tanh: act(z))
ACTS = {"ReLU": (nn.ReLU, {}, "ReLU()"), "LeakyReLU": (nn.LeakyReLU, {"negative_slope": 0.1}, "LeakyReLU(0.1)"),
        "SiLU": (nn.SiLU, {}, "SiLU()"), "GELU": (nn.GELU, {}, "GELU()"),
        "GELU_tanh": (nn.GELU, {"approximate": "tanh"}, "GELU(approximate='tanh')"),
        "Sigmoid": (nn.Sigmoid, {}, "Sigmoid()"), "Tanh": (nn.Tanh, {}, "Tanh()"), "Hardswish": (nn.Hardswish, {}, "Hardswish()")}


def build(act):
    """BatchNorm2d + activation pairs at the top level, inside a Residual's body and in a nested
    Sequential at the very end (the model's output); a BatchNorm2d followed by a Sequential
    holding an activation (not fused), and an activation after a Residual (on CPUs fused into the
    block's sum where its output gives its gradient: ReLU, Sigmoid, Tanh)."""
    cls, kw, _ = ACTS[act]
    return nn.Sequential(  # convolutions before a BatchNorm2d without bias (its gradient is 0: noise only)
        nn.Conv2d(3, 6, 3, padding=1, bias=False), nn.BatchNorm2d(6), cls(**kw),
        nn.Residual(nn.Conv2d(6, 6, 3, padding=1, bias=False), nn.BatchNorm2d(6), cls(**kw),
                    nn.Conv2d(6, 6, 1, bias=False), nn.BatchNorm2d(6)),
        cls(**kw),
        nn.Conv2d(6, 5, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(5), nn.Sequential(cls(**kw)),
        nn.Sequential(nn.Conv2d(5, 5, 1, bias=False), nn.BatchNorm2d(5), cls(**kw)))


PAIRS = 3  # fused pairs in build(): one launch forward and one backward saved each


def build_padded(act):
    """BatchNorm2d + activation pairs between 3x3 convolutions (bias or not, stride 1 and 2): on
    CPUs the BatchNorm writes the next conv's zero-bordered input planes and, backward, the
    previous conv's zero-bordered output gradient (Conv2d.padded_input, padded_grad)."""
    cls, kw, _ = ACTS[act]
    return nn.Sequential(  # the BatchNorm after the biased conv frozen (eval): its bias gradient is not 0
        nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), cls(**kw),
        nn.Conv2d(8, 12, 3, padding=1, bias=True), nn.BatchNorm2d(12), cls(**kw),
        nn.Conv2d(12, 8, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(8), cls(**kw),
        nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8))


def build_pooled(act):
    """BatchNorm2d + activation + MaxPool2d(2) triples (on CPUs the pool runs in the BatchNorm's
    pass: netcl.nn.norm.pools_in_norm): odd sizes (a row and a column no window covers), one inside
    a Residual's body, one ending the model; and a 3x3 pool after a pair (not taken)."""
    cls, kw, _ = ACTS[act]
    return nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1, bias=False), nn.BatchNorm2d(6), cls(**kw), nn.MaxPool2d(2),
        nn.Residual(nn.Conv2d(6, 6, 3, padding=1, bias=False), nn.BatchNorm2d(6), cls(**kw), nn.MaxPool2d(2),
                    nn.Upsample(scale_factor=2)),
        nn.Conv2d(6, 5, 3, padding=1, bias=False), nn.BatchNorm2d(5), cls(**kw), nn.MaxPool2d(3, stride=1),
        nn.Conv2d(5, 4, 1, bias=False), nn.BatchNorm2d(4), cls(**kw), nn.MaxPool2d(2))


TRIPLES = 3  # pools run inside a BatchNorm's passes in build_pooled() on a CPU: two launches more each


def randomize(model, rng):
    for name, t in model.named_parameters():
        if name.endswith("weight") and t.shape == (t.shape[0],):  # BatchNorm's gamma: away from 0
            t.set_(rng.uniform(0.5, 1.5, t.shape).astype(np.float32))
        else:
            t.set_((rng.standard_normal(t.shape) * 0.3).astype(np.float32))
    return model


def torch_twin(torch, model, act):
    """float64 PyTorch twin (netcl.apps.bench.torch_layer, with act's module where it has none)."""
    mod = ACTS[act][2]
    ns = {"nn": torch.nn}

    def twin(m):
        if isinstance(m, nn.Sequential):
            return torch.nn.Sequential(*[twin(x) for x in m])
        if isinstance(m, nn.Residual):
            class Res(torch.nn.Module):
                def __init__(self, body, shortcut):
                    super().__init__()
                    self.body, self.shortcut = body, shortcut

                def forward(self, x):
                    return self.body(x) + (x if self.shortcut is None else self.shortcut(x))
            return Res(twin(m.body), None if m.shortcut is None else twin(m.shortcut))
        if isinstance(m, ACTS[act][0]):
            return eval("nn." + mod, ns)
        return torch_layer(torch, m)
    return twin(model).double().train()


def run(q, model, x, dy, fuse, monkeypatch, steps=2):
    """`steps` training steps (fresh gradients each): (y, dx, {name: grad}, {name: buffer}) of the last."""
    monkeypatch.setattr(sequential, "TRAIN_FUSE", fuse)
    for _ in range(steps):
        model.zero_grad()
        y = model(Tensor.from_host(q, x))
        dx = model.backward(Tensor.from_host(q, dy))
    return (y.to_host(), dx.to_host(), {k: p.grad.to_host() for k, p in model.named_parameters()},
            {k: b.to_host() for k, b in model.named_buffers()})


def run_torch(torch, ref, x, dy, steps=2):
    for _ in range(steps):
        ref.zero_grad()
        xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
        y = ref(xt)
        y.backward(torch.tensor(dy, dtype=torch.float64))
    return (y.detach().numpy(), xt.grad.numpy(), {k: p.grad.numpy() for k, p in ref.named_parameters()},
            {k: b.numpy() for k, b in ref.named_buffers() if not k.endswith("num_batches_tracked")})


def check(got, ref, what, rtol):
    errs = [assert_close(got[0], ref[0], rtol, what=f"{what} forward"),
            assert_close(got[1], ref[1], rtol, what=f"{what} dx")]
    assert set(got[2]) == set(ref[2]) and set(got[3]) == set(ref[3])
    errs += [assert_close(got[2][k], ref[2][k], rtol, what=f"{what} grad {k}") for k in got[2]]
    errs += [assert_close(got[3][k], ref[3][k], rtol, what=f"{what} {k}") for k in got[3]]
    return errs[0], max(errs[1:])


@pytest.mark.parametrize("cls", ["native", "gpu"])
@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("shape", [(3, 3, 9, 11), (1, 3, 6, 37)])
def test_fused_training_equals_unfused_and_torch(queue, rng, torch, record_error, monkeypatch, cls, act, shape):
    check_fusion(queue, rng, torch, record_error, monkeypatch, cls, act, shape)


@pytest.mark.parametrize("pooled", [False, True])
@pytest.mark.parametrize("cls", ["native", "gpu"])
@pytest.mark.parametrize("act", ["LeakyReLU", "Tanh"])
def test_fused_training_many_parts(queue, rng, torch, record_error, monkeypatch, cls, act, pooled):
    """Several parts per channel in the backward's part sums (a shorter last part)."""
    from netcl.nn import norm

    monkeypatch.setattr(norm, "PART_LEN", {"cpu": 37, "gpu": 37})
    if pooled:  # 37 values: one pooled row (two input rows of 21) per part
        check_fusion(queue, rng, torch, record_error, monkeypatch, cls, act, (3, 3, 13, 21), build_pooled)
    else:
        check_fusion(queue, rng, torch, record_error, monkeypatch, cls, act, (3, 3, 9, 11))


@pytest.mark.parametrize("cls", ["native", "gpu"])
@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("shape", [(2, 3, 13, 21), (1, 3, 8, 40)])
def test_pooled_training_equals_unfused_and_torch(queue, rng, torch, record_error, monkeypatch, cls, act, shape):
    check_fusion(queue, rng, torch, record_error, monkeypatch, cls, act, shape, build_pooled)


# input shape -> the convs whose dy planes the BatchNorm after them writes (Winograd on / off):
# the first two where "rows" (16 wide or more), the last where "rows" (its input halved) or
# "channels" with winot_wgrad (8x8), never the stride-2 one or narrow "channels" ones without it
PADDED_GRADS = {(2, 3, 8, 32): (3, 3), (2, 3, 16, 16): (3, 2), (1, 3, 6, 20): (2, 2), (2, 3, 5, 9): (0, 0)}
# the convs whose input planes the BatchNorm before them writes: all three, but the stride-2 one
# on even planes of 16-wide or an even number of 8-wide output rows ("phases": it reads its input
# as it is, Conv2d._phases)
PADDED_INPUTS = {(2, 3, 8, 32): 2, (2, 3, 16, 16): 2, (1, 3, 6, 20): 3, (2, 3, 5, 9): 3}


@pytest.mark.parametrize("winot", ["1", "0"])
@pytest.mark.parametrize("shape", list(PADDED_GRADS))
@pytest.mark.parametrize("per_channel", [True, False])
def test_padded_planes_training_equals_unfused_and_torch(queue, rng, torch, record_error, monkeypatch, winot, shape,
                                                         per_channel):
    """The BatchNorm passes that write a conv's zero-bordered planes: forward into "rows" (32, 20
    and 16 wide) and "channels" (9 wide, and the stride-2 conv) planes, backward into those of
    the direct kernels (wgrad_cpu, corr_cpu) and of the Winograd ones (winot_wgrad reading dy
    inside its border, conv_winot; NETCL_CPU_WINOT=1), equal to the unfused layers and torch; the
    backward by a work-item per channel (bn_bwd_channel_cpu, where a channel fits in L2) or by
    parts and planes (bn_bwd_part_cpu, bn_bwd_apply_pad_cpu)."""
    monkeypatch.setenv("NETCL_CPU_WINOT", winot)
    monkeypatch.setattr(norm, "_CHANNEL_L2", norm._CHANNEL_L2 if per_channel else 0)
    monkeypatch.setattr(norm, "_CHANNEL_ITEMS", 1)  # every BatchNorm here, whatever the cores
    calls = {"bn_apply_pad_cpu": 0, "bn_bwd_apply_pad_cpu": 0}
    enqueue = ops._enqueue

    def counted(queue, k, gsize, lsize, args):
        name = k.function_name
        if name == "bn_bwd_channel_cpu" and args[4:6] != args[2:4]:  # (HP, WP) != (H, W): padded
            name = "bn_bwd_apply_pad_cpu"
        if name in calls:
            calls[name] += 1
        return enqueue(queue, k, gsize, lsize, args)
    monkeypatch.setattr(ops, "_enqueue", counted)
    model = randomize(build_padded("ReLU"), rng).to(queue).train()
    ref = torch_twin(torch, model, "ReLU")
    for m in (model.layers[4], ref[4]):
        m.eval()
    state = {k: v.copy() for k, v in model.state_dict().items()}
    x = (rng.standard_normal(shape) * 2 + 0.3).astype(np.float32)
    dy = rng.standard_normal(model.output_shape(shape)).astype(np.float32)
    fused = run(queue, model, x, dy, True, monkeypatch)
    model.load_state_dict(state)
    counted = dict(calls)
    check(fused, run(queue, model, x, dy, False, monkeypatch), "padded vs unfused", 2e-6)
    record_error(*check(fused, run_torch(torch, ref, x, dy), "padded vs torch", 1e-5))
    calls.update(counted)
    if ops.is_cpu(queue):  # per step (two): every conv after a pair reads planes its pass wrote
        assert calls["bn_apply_pad_cpu"] == 2 * PADDED_INPUTS[shape]
        assert calls["bn_bwd_apply_pad_cpu"] == 2 * PADDED_GRADS[shape][winot == "0"]


@pytest.mark.parametrize("shape", [(2, 3, 7, 13), (1, 3, 15, 15), (2, 3, 12, 7), (3, 3, 4, 4)])
@pytest.mark.parametrize("per_channel", [True, False])
def test_row_widths_training_equals_torch(queue, rng, torch, record_error, monkeypatch, shape, per_channel):
    """Planes whose rows are no multiple of 16 (13 = 8 + 4 + 1, 15 = 8 + 4 + 3, 7 = 4 + 3, 4 and
    the stride-2 conv's 7, 8 and 4): the BatchNorm + ReLU passes walk a row as float16, then one
    float8, one float4 and scalars (norm_cpu.cl's PAD_RUN), into padded planes and, for the last
    BatchNorm, as the plane's one run (no border); the sign of the ReLU's input random, half of
    each plane's gradient masked: the same as float64 PyTorch."""
    monkeypatch.setattr(norm, "_CHANNEL_L2", norm._CHANNEL_L2 if per_channel else 0)
    monkeypatch.setattr(norm, "_CHANNEL_ITEMS", 1)
    model = randomize(build_padded("ReLU"), rng).to(queue).train()
    ref = torch_twin(torch, model, "ReLU")
    for m in (model.layers[4], ref[4]):  # after the biased conv: its bias gradient is not 0
        m.eval()
    x = rng.standard_normal(shape).astype(np.float32)
    dy = rng.standard_normal(model.output_shape(shape)).astype(np.float32)
    fused = run(queue, model, x, dy, True, monkeypatch)
    record_error(*check(fused, run_torch(torch, ref, x, dy), "row widths vs torch", 1e-5))


def check_fusion(queue, rng, torch, record_error, monkeypatch, cls, act, shape, builder=build):
    if cls == "gpu":
        monkeypatch.setattr(ops, "_config_class", {queue.device.int_ptr: "gpu"})
    model = randomize(builder(act), rng).to(queue).train()
    ref = torch_twin(torch, model, act)
    state = {k: v.copy() for k, v in model.state_dict().items()}
    x = (rng.standard_normal(shape) * 2 + 0.3).astype(np.float32)
    dy = rng.standard_normal(model.output_shape(shape)).astype(np.float32)
    fused = run(queue, model, x, dy, True, monkeypatch)
    model.load_state_dict(state)
    unfused = run(queue, model, x, dy, False, monkeypatch)
    # (4e-6: the two paths add in different orders; Intel's compiler came to 2.2e-6 where PoCL's stays under 2e-6)
    check(fused, unfused, "fused vs unfused", 4e-6)
    record_error(*check(fused, run_torch(torch, ref, x, dy), "fused vs torch", 1e-5))


@pytest.mark.parametrize("pooled", [False, True])
def test_frozen_batchnorm_in_a_training_model(queue, rng, monkeypatch, pooled):
    """A BatchNorm2d in eval mode (running statistics, as when fine-tuning) inside a model that
    trains: fused with its activation (and its pool, on CPUs) as unfused, statistics untouched."""
    model = randomize(build_pooled("ReLU") if pooled else build("ReLU"), rng).to(queue).train()
    for layer in model.layers:
        if isinstance(layer, nn.BatchNorm2d):
            layer.eval()
    shape = (2, 3, 13, 21) if pooled else (2, 3, 9, 11)
    x = rng.standard_normal(shape).astype(np.float32)
    dy = rng.standard_normal(model.output_shape(shape)).astype(np.float32)
    state = {k: v.copy() for k, v in model.state_dict().items()}
    fused = run(queue, model, x, dy, True, monkeypatch)
    model.load_state_dict(state)
    unfused = run(queue, model, x, dy, False, monkeypatch)
    check(fused, unfused, "frozen BatchNorm fused vs unfused", 2e-6)
    for layer in model.layers:
        if isinstance(layer, nn.BatchNorm2d):
            key = next(k for k, t in model.named_buffers() if t is layer.running_mean)
            np.testing.assert_array_equal(fused[3][key], state[key])


def count_launches(monkeypatch):
    n = [0]
    enqueue = ops._enqueue

    def counted(*args):
        n[0] += 1
        return enqueue(*args)
    monkeypatch.setattr(ops, "_enqueue", counted)
    return n


@pytest.mark.parametrize("pooled", [False, True])
@pytest.mark.parametrize("cls", ["native", "gpu"])
def test_fusion_saves_two_launches_per_pair(queue, rng, monkeypatch, cls, pooled):
    """Two launches per BatchNorm + activation pair; two more per pool in its passes (CPUs)."""
    if cls == "gpu":
        monkeypatch.setattr(ops, "_config_class", {queue.device.int_ptr: "gpu"})
    model = (build_pooled if pooled else build)("LeakyReLU").to(queue).train()
    # the pairs' launches alone: no statistics from the convs (test_batchnorm_statistics_from_the_conv)
    monkeypatch.setattr(sequential.Sequential, "_feeds_bn", lambda self, i: False)
    x = Tensor.from_host(queue, rng.standard_normal((2, 3, 8, 8)).astype(np.float32))
    dy = Tensor.from_host(queue, rng.standard_normal(model.output_shape(x.shape)).astype(np.float32))
    n = count_launches(monkeypatch)
    per_step = {}
    for fuse in (False, True):
        monkeypatch.setattr(sequential, "TRAIN_FUSE", fuse)
        model(x)
        model.backward(dy)  # a first step builds the kernels
        before = n[0]
        model(x)
        model.backward(dy)
        per_step[fuse] = n[0] - before
    # a pool in the pass saves its forward and backward launches too on CPUs, where the pooled
    # passes need the statistics' second stage launched before them (the unfused BatchNorm runs it
    # inside its element-wise passes): two launches back per triple
    saved = 2 * PAIRS if not pooled else 2 * (TRIPLES + 1)
    assert per_step[True] == per_step[False] - saved, per_step


@pytest.mark.parametrize("act", ["ReLU", "Tanh", "LeakyReLU", "GELU"])
@pytest.mark.parametrize("bn_tail", [True, False])
def test_residual_takes_the_activation_after_it(queue, rng, monkeypatch, act, bn_tail):
    """On CPUs training runs the activation after a Residual in the block's sum where its output
    gives its gradient (Act.grads_from_output): add_act_cpu, or bn_add_act_cpu where the body ends
    in a BatchNorm2d, whose element-wise pass it runs too (a launch less again); not otherwise. The
    values: test_fused_training_equals_unfused_and_torch, on the same model, and
    test_residual_sum_applies_the_batchnorms."""
    model = build(act)
    if not bn_tail:  # the body ends in a 1x1 conv: its output is the sum's operand
        model.layers[3].body.layers.pop()
    model = model.to(queue).train()
    x = Tensor.from_host(queue, rng.standard_normal((2, 3, 9, 11)).astype(np.float32))
    dy = Tensor.from_host(queue, rng.standard_normal(model.output_shape(x.shape)).astype(np.float32))
    names = []
    enqueue = ops._enqueue
    monkeypatch.setattr(ops, "_enqueue", lambda q, k, *a: names.append(k.function_name) or enqueue(q, k, *a))
    model(x)
    model.backward(dy)
    fused = ops.is_cpu(queue) and ACTS[act][0]().act.grads_from_output
    assert names.count("add_act_cpu") == int(fused and not bn_tail)
    assert names.count("bn_add_act_cpu") == int(fused and bn_tail)
    assert names.count("add") == 1 - int(fused) + 1  # the backward's sum of the branches' gradients


def build_shortcut(act):
    """Residuals whose sums (with the activation after them, on CPUs) apply BatchNorms: a strided
    one with a 1x1 conv + BatchNorm2d shortcut, an identity one."""
    cls, kw, _ = ACTS[act]
    return nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1, bias=False), nn.BatchNorm2d(6), cls(**kw),
        nn.Residual(nn.Conv2d(6, 8, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(8), cls(**kw),
                    nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8),
                    shortcut=nn.Sequential(nn.Conv2d(6, 8, 1, stride=2, bias=False), nn.BatchNorm2d(8))),
        cls(**kw),
        nn.Residual(nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)),
        cls(**kw))


def freeze_sum_batchnorms(model):
    """build_shortcut's Residuals' last BatchNorms (netcl layers or torch modules) to eval mode."""
    for block in (model[3], model[5]):
        for seq in (block.body, block.shortcut):
            if seq is not None:
                seq[-1].eval()


@pytest.mark.parametrize("cls", ["native", "other"])
@pytest.mark.parametrize("act", ["ReLU", "Sigmoid"])
@pytest.mark.parametrize("frozen", [False, True])
def test_residual_sum_applies_the_batchnorms(queue, rng, torch, record_error, monkeypatch, act, frozen, cls):
    """A Residual's sum that applies its body's last BatchNorm2d and its shortcut's (CPUs:
    bn_add_act_cpu, their own element-wise passes and outputs gone; batch statistics, or running
    ones for BatchNorms in eval mode, untouched then): forward, dx, every gradient and the running
    statistics equal the unfused layers' and float64 PyTorch's over two steps; with both CPU
    classes' blocks (the shortcut's pw2_fwd_cpu statistics in blocks of 8 or 4 channels)."""
    use_cpu_class(queue, monkeypatch, cls)
    model = randomize(build_shortcut(act), rng).to(queue).train()
    ref = torch_twin(torch, model, act)
    if frozen:  # in eval mode (running statistics) in a model that trains
        freeze_sum_batchnorms(model)
        freeze_sum_batchnorms(ref)
    state = {k: v.copy() for k, v in model.state_dict().items()}
    x = (rng.standard_normal((3, 3, 12, 16)) + 0.2).astype(np.float32)
    dy = rng.standard_normal(model.output_shape(x.shape)).astype(np.float32)
    names = []
    enqueue = ops._enqueue
    monkeypatch.setattr(ops, "_enqueue", lambda q, k, *a: names.append(k.function_name) or enqueue(q, k, *a))
    fused = run(queue, model, x, dy, True, monkeypatch)
    assert names.count("bn_add_act_cpu") == (4 if ops.is_cpu(queue) else 0)  # two blocks, two steps
    # every conv before a training BatchNorm (corr_cpu, corrc_cpu on these narrow planes, the
    # shortcut's pw2_fwd_cpu) computes its statistics parts: five BatchNorms a step, or two with
    # the sums' frozen
    assert names.count("bn_stats_finish_cpu") == ((4 if frozen else 10) if ops.is_cpu(queue) else 0)
    assert "bn_stats_part_cpu" not in names
    model.load_state_dict(state)
    check(fused, run(queue, model, x, dy, False, monkeypatch), "bn sum vs unfused", 2e-6)
    record_error(*check(fused, run_torch(torch, ref, x, dy), "bn sum vs torch", 1e-5))
    if frozen:
        for bn in ("3.body.4", "3.shortcut.1", "5.body.1"):
            for k in (f"{bn}.running_mean", f"{bn}.running_var"):
                np.testing.assert_array_equal(fused[3][k], state[k])


def build_chain(act, bare=False):
    """Residuals one after another, each with the activation after it run in its sum (CPUs), the
    last before a global average pool. The layer after such a block takes that activation's
    gradient into its own dx pass where it can (Sequential._act_before: backward_act): a strided
    block whose shortcut is a 1x1 stride-2 conv (+ BatchNorm2d, or `bare`) in the shortcut's
    pw2_dgrad_cpu, which adds its data gradient into the body's; the pool in
    global_avgpool_bwd_cpu; an identity block cannot (act_bwd_cpu there). The first block takes
    its input as the zero-bordered planes its first conv reads, written by the BatchNorm2d before
    it (Residual.forward_padded: no pad_planes_cpu copy), and its sum reads the identity from them."""
    cls, kw, _ = ACTS[act]
    shortcut = nn.Conv2d(8, 16, 1, stride=2, bias=False)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), cls(**kw),
        nn.Residual(nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)), cls(**kw),
        nn.Residual(nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(16), cls(**kw),
                    nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16),
                    shortcut=shortcut if bare else nn.Sequential(shortcut, nn.BatchNorm2d(16))),
        cls(**kw),
        nn.Residual(nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16)), cls(**kw),
        nn.AdaptiveAvgPool2d(1))


def unfused_blocks(monkeypatch):
    """Each Residual differentiates its own activation (act_bwd_cpu) and takes its input as it
    is, as before those fusions."""
    monkeypatch.setattr(sequential.Sequential, "_act_before", lambda self, i, first: None)
    monkeypatch.setattr(sequential, "_padded_block", lambda layers, j, x: None)


def chain_steps(queue, rng, monkeypatch, act, x_shape, bare=False):
    """(model, its state, x, dy, launch names list) of build_chain on the device (names recorded)."""
    model = randomize(build_chain(act, bare), rng).to(queue).train()
    state = {k: v.copy() for k, v in model.state_dict().items()}
    x = (rng.standard_normal(x_shape) + 0.2).astype(np.float32)
    dy = rng.standard_normal(model.output_shape(x.shape)).astype(np.float32)
    names = []
    enqueue = ops._enqueue
    monkeypatch.setattr(ops, "_enqueue", lambda q, k, *a: names.append(k.function_name) or enqueue(q, k, *a))
    return model, state, x, dy, names


@pytest.mark.parametrize("act", ["ReLU", "Sigmoid", "Tanh"])
@pytest.mark.parametrize("cls", ["native", "other"])
@pytest.mark.parametrize("x_shape", [(2, 3, 16, 32), (2, 3, 16, 16)])
def test_next_layer_takes_the_residual_activation(queue, rng, torch, record_error, monkeypatch, act, cls, x_shape):
    """The activation a Residual ran in its sum is differentiated in the pass of the layer after
    the block that finishes dx (the strided block's shortcut, pw2_dgrad_cpu; the pool's), not in
    an act_bwd_cpu pass of its own: forward, dx and every gradient bit for bit the unfused
    blocks' (each pass computes the same sum, then the same gradient), the running statistics too,
    and float64 PyTorch's over two steps; one act_bwd_cpu a step left (before the identity block),
    three unfused; a pad_planes_cpu a step fewer (the first block's input). Both CPU classes'
    blocks, on 16-wide and 8-wide output rows at stride 2."""
    use_cpu_class(queue, monkeypatch, cls)
    model, state, x, dy, names = chain_steps(queue, rng, monkeypatch, act, x_shape)
    ref = torch_twin(torch, model, act)
    taken = run(queue, model, x, dy, True, monkeypatch)
    cpu = ops.is_cpu(queue)
    assert names.count("act_bwd_cpu") == (2 if cpu else 0), names  # two steps
    assert names.count("pw2_dgrad_cpu") == (2 if cpu else 0)
    assert names.count("global_avgpool_bwd_cpu") == (2 if cpu else 0)
    pads = names.count("pad_planes_cpu")
    model.load_state_dict(state)
    names.clear()
    unfused_blocks(monkeypatch)
    own = run(queue, model, x, dy, True, monkeypatch)
    assert names.count("act_bwd_cpu") == (6 if cpu else 0)
    assert names.count("pad_planes_cpu") == pads + (2 if cpu else 0)
    bit_for_bit(taken, own)
    record_error(*check(taken, run_torch(torch, ref, x, dy), "act taken vs torch", 1e-5))


def test_residual_forward_padded_checks_its_planes(queue, rng):
    """Residual.padded_input names planes on CPUs only, for a block without a shortcut whose body
    begins with a conv that pads and ends in a BatchNorm2d; forward_padded refuses other planes
    and a missing activation, saying what it expected."""
    block = nn.Residual(nn.Conv2d(4, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4)).to(queue).train()
    shape = (2, 4, 8, 16)
    geometry = block.padded_input(queue, shape)
    assert (geometry is not None) == ops.is_cpu(queue)
    assert nn.Residual(nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4),
                       shortcut=nn.Conv2d(4, 4, 1)).to(queue).train().padded_input(queue, shape) is None
    assert nn.Residual(nn.Conv2d(4, 4, 3, padding=1)).to(queue).train().padded_input(queue, shape) is None
    if geometry is None:
        return
    xp = Tensor.from_host(queue, np.zeros(shape[:2] + tuple(geometry[2:]), np.float32))
    with pytest.raises(ValueError, match="are not the"):
        block.forward_padded(Tensor.from_host(queue, np.zeros(shape, np.float32)), shape, nn.ReLU())
    with pytest.raises(ValueError, match="activation after the block"):
        block.forward_padded(xp, shape, None)
    with pytest.raises(ValueError, match="activation after the block"):
        block.forward_padded(xp, shape, nn.GELU())
    assert block.forward_padded(xp, shape, nn.ReLU()).shape == shape


def bit_for_bit(got, want):
    """run()'s results (y, dx, gradients, buffers) equal, bit for bit."""
    for a, b in zip(got[:2], want[:2]):
        np.testing.assert_array_equal(a, b)
    for g, w in zip(got[2:], want[2:]):
        assert set(g) == set(w)
        for k in g:
            np.testing.assert_array_equal(g[k], w[k], err_msg=k)


@pytest.mark.parametrize("act", ["ReLU", "Tanh"])
def test_bare_shortcut_takes_the_activation(queue, rng, torch, record_error, monkeypatch, act):
    """A strided block whose shortcut is a bare 1x1 stride-2 conv (no BatchNorm2d after it) takes
    the activation before it into its pw2_dgrad_cpu pass as the conv + BatchNorm2d shortcut does:
    bit for bit the unfused blocks' values, and float64 PyTorch's."""
    model, state, x, dy, names = chain_steps(queue, rng, monkeypatch, act, (2, 3, 16, 32), bare=True)
    ref = torch_twin(torch, model, act)
    taken = run(queue, model, x, dy, True, monkeypatch)
    assert names.count("act_bwd_cpu") == (2 if ops.is_cpu(queue) else 0)
    assert names.count("pw2_dgrad_cpu") == (2 if ops.is_cpu(queue) else 0)
    model.load_state_dict(state)
    unfused_blocks(monkeypatch)
    bit_for_bit(taken, run(queue, model, x, dy, True, monkeypatch))
    record_error(*check(taken, run_torch(torch, ref, x, dy), "bare shortcut vs torch", 1e-5))


def test_layer_without_its_own_pass_differentiates_the_activation(queue, rng, monkeypatch):
    """A layer after a Residual that ran its activation, with no pass of its own to take it into (a
    pool of 2x2 outputs), applies it after its backward (act_bwd_cpu, as the block would have):
    bit for bit the unfused blocks' values."""
    model, state, x, dy, names = chain_steps(queue, rng, monkeypatch, "ReLU", (2, 3, 16, 32))
    model.layers[-1] = nn.AdaptiveAvgPool2d(2)
    dy = rng.standard_normal(model.output_shape(x.shape)).astype(np.float32)
    taken = run(queue, model, x, dy, True, monkeypatch)
    assert names.count("act_bwd_cpu") == (4 if ops.is_cpu(queue) else 0)  # the identity block's, the pool's
    model.load_state_dict(state)
    unfused_blocks(monkeypatch)
    bit_for_bit(taken, run(queue, model, x, dy, True, monkeypatch))


@pytest.mark.parametrize("k, x_shape", [(3, (4, 3, 6, 12)), (5, (4, 3, 8, 20)), (3, (2, 3, 16, 32))])
def test_block_input_as_its_conv_planes(queue, rng, monkeypatch, k, x_shape):
    """A Residual after a BatchNorm2d + ReLU takes its input as the planes its first conv reads
    (Residual.forward_padded) for any such planes: rows of 12 and 20 (vector tails), a 5x5
    padding-2 conv (a border of 2), sums whose chunks start mid-row and mid-plane
    (bn_add_act_cpu's S_BORDER row segments): outputs, dx, every gradient and the running
    statistics bit for bit the block's that takes its input as it is; a pad_planes_cpu a step fewer."""
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.Residual(nn.Conv2d(8, 8, k, padding=k // 2, bias=False), nn.BatchNorm2d(8)), nn.ReLU())
    model = randomize(model, rng).to(queue).train()
    state = {n: v.copy() for n, v in model.state_dict().items()}
    x = (rng.standard_normal(x_shape) + 0.2).astype(np.float32)
    dy = rng.standard_normal(model.output_shape(x.shape)).astype(np.float32)
    cpu = ops.is_cpu(queue)
    assert (model.layers[3].padded_input(queue, (x_shape[0], 8) + x_shape[2:]) is not None) == cpu
    names = []
    enqueue = ops._enqueue
    monkeypatch.setattr(ops, "_enqueue", lambda q, kn, *a: names.append(kn.function_name) or enqueue(q, kn, *a))
    taken = run(queue, model, x, dy, True, monkeypatch)
    pads = names.count("pad_planes_cpu")
    model.load_state_dict(state)
    names.clear()
    monkeypatch.setattr(sequential, "_padded_block", lambda layers, j, x: None)
    own = run(queue, model, x, dy, True, monkeypatch)
    assert names.count("pad_planes_cpu") == pads + (2 if cpu else 0)
    bit_for_bit(taken, own)


@pytest.mark.parametrize("builder", [build, build_pooled])
def test_nan_input_propagates_as_unfused(queue, rng, monkeypatch, builder):
    model = builder("ReLU").to(queue).train()
    x = rng.standard_normal((2, 3, 9, 11) if builder is build else (2, 3, 13, 21)).astype(np.float32)
    x[1, 2, 4, 5] = np.nan
    dy = rng.standard_normal(model.output_shape(x.shape)).astype(np.float32)
    state = {k: v.copy() for k, v in model.state_dict().items()}
    fused = run(queue, model, x, dy, True, monkeypatch, steps=1)
    model.load_state_dict(state)
    unfused = run(queue, model, x, dy, False, monkeypatch, steps=1)
    for a, b in zip(fused[:2], unfused[:2]):
        np.testing.assert_array_equal(np.isnan(a), np.isnan(b))
    assert np.isnan(fused[0]).any() and np.isnan(fused[1]).any()


def test_layers_called_one_by_one_and_eval_do_not_fuse(queue, rng, monkeypatch):
    """Calling the layers individually (or in eval mode) runs each on its own; the activation
    layer skipped by a fused forward keeps no stale input."""
    model = build("ReLU").to(queue).train()
    x = Tensor.from_host(queue, rng.standard_normal((2, 3, 8, 8)).astype(np.float32))
    y = model(x).to_host()
    assert model.layers[2]._saved is None  # ran inside layer 1
    cur = x
    for layer in model:
        cur = layer(cur)
    np.testing.assert_allclose(cur.to_host(), y, rtol=2e-6, atol=1e-6)
    assert model.layers[2]._saved is not None and model.layers[1]._saved[4] == 0  # unfused
    model.eval()
    model._fused = None  # eval without a fused plan runs the layer list: unfused, running statistics
    model(x)
    assert model.layers[1]._saved[4] == 0 and model.layers[2]._saved is not None


@pytest.mark.parametrize("k", [3, 5])
@pytest.mark.parametrize("stride", [1, 2])
def test_padded_planes_hold_their_plane(queue, rng, k, stride):
    """Conv2d.padded_input and padded_grad give planes that hold the input (output gradient) at
    their offsets for every padding, even and odd sizes (a stride-2 conv without padding on an even
    height once got a plane a row short, and the BatchNorm pass wrote into the next plane); the
    BatchNorm refuses planes that do not."""
    for p in range(k):
        for h, w in ((10, 10), (9, 17), (16, 33), (7, 8)):
            conv = nn.Conv2d(3, 4, k, stride=stride, padding=p, bias=False).to(queue)
            shape = (2, 3, h, w)
            try:
                out = conv.output_shape(shape)
            except ValueError:
                continue
            geometry = conv.padded_input(queue, shape)
            if geometry is None:
                continue
            top, left, hp, wp = geometry
            assert top + h <= hp and left + w <= wp, (k, stride, p, h, w, geometry)
            conv(Tensor.from_host(queue, rng.standard_normal(shape).astype(np.float32)))
            grad = conv.padded_grad(queue, out)
            if grad is not None:
                assert grad[0] + out[2] <= grad[2] and grad[1] + out[3] <= grad[3], (k, stride, p, h, w, grad)
    bn = nn.BatchNorm2d(3).to(queue).train()
    with pytest.raises(ValueError, match="cannot hold" if ops.is_cpu(queue) else "CPUs only"):
        bn.forward(Tensor.from_host(queue, np.ones((2, 3, 10, 10), np.float32)), pad=(0, 0, 9, 17))


def test_padded_pair_in_a_model_not_moved_to_the_device(queue, rng, monkeypatch):
    """A model built and trained without .to(queue) (its parameters move on first use): the conv
    after a BatchNorm + activation pair, which receives the BatchNorm's planes, moves its
    parameters too."""
    monkeypatch.setattr(sequential, "TRAIN_FUSE", True)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 3, padding=1))
    model.train()
    y = model(Tensor.from_host(queue, rng.standard_normal((2, 3, 6, 20)).astype(np.float32)))
    model.backward(Tensor.from_host(queue, np.ones(y.shape, np.float32)))
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("winot", ["1", "0"])
def test_identity_residual_adds_into_its_gradient(queue, rng, torch, record_error, monkeypatch, winot):
    """A Residual without a shortcut followed by ReLU (fused into its sum on CPUs): its body's
    input gradient is added into the block's own dy (Sequential.backward's into=); with Winograd
    the first conv's data gradient is written as conv + dy by conv_winot (RES_IN_PLACE), without a
    separate sum. Equal to the unfused layers and to torch."""
    monkeypatch.setenv("NETCL_CPU_WINOT", winot)
    in_place = []
    launch = ops.launch

    def spy(q, family, name, *args, options=()):
        if name == "conv_winot" and "-DRES_IN_PLACE" in options:
            in_place.append(args[-1])  # the res argument: the tensor it writes
        return launch(q, family, name, *args, options=options)
    monkeypatch.setattr(ops, "launch", spy)
    model = randomize(nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Residual(nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                    nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)),
        nn.ReLU()), rng).to(queue).train()
    ref = torch_twin(torch, model, "ReLU")
    state = {k: v.copy() for k, v in model.state_dict().items()}
    x = (rng.standard_normal((2, 3, 8, 32)) * 2 + 0.3).astype(np.float32)
    dy = rng.standard_normal(model.output_shape(x.shape)).astype(np.float32)
    fused = run(queue, model, x, dy, True, monkeypatch)
    model.load_state_dict(state)
    assert len(in_place) == (2 if ops.is_cpu(queue) and winot == "1" else 0)  # one a step
    check(fused, run(queue, model, x, dy, False, monkeypatch), "into vs unfused", 2e-6)
    record_error(*check(fused, run_torch(torch, ref, x, dy), "into vs torch", 1e-5))


@pytest.mark.parametrize("width", [32, 16, 8])  # conv_winot's three layouts: T = 1, 2, 4 tile rows a vector
def test_batchnorm_statistics_from_the_conv(queue, rng, torch, record_error, monkeypatch, width):
    """On CPUs with Winograd, a training Conv2d before a BatchNorm2d computes the BatchNorm's
    batch-statistics parts in its own pass (conv_winot STATS; bn_stats_finish_cpu combines them):
    no bn_stats_part_cpu for those BatchNorms, and forward, dx, every gradient and the running
    statistics equal the unfused layers' and float64 PyTorch's; a frozen BatchNorm (eval) asks
    for none."""
    monkeypatch.setenv("NETCL_CPU_WINOT", "1")
    model = randomize(nn.Sequential(
        nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16),
        nn.Conv2d(16, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU()), rng).to(queue).train()
    model.layers[6].eval()  # frozen: its conv computes no statistics
    ref = torch_twin(torch, model, "ReLU")
    ref[6].eval()
    state = {k: v.copy() for k, v in model.state_dict().items()}
    x = (rng.standard_normal((3, 8, 8, width)) * 2 + 0.5).astype(np.float32)
    dy = rng.standard_normal(model.output_shape(x.shape)).astype(np.float32)
    names, stats = [], []
    launch = ops.launch

    def spy(q, family, name, *args, options=()):
        names.append(name)
        if name == "conv_winot":
            stats.append("-DSTATS=1" in options)
        return launch(q, family, name, *args, options=options)
    monkeypatch.setattr(ops, "launch", spy)
    fused = run(queue, model, x, dy, True, monkeypatch, steps=1)
    if ops.is_cpu(queue):
        assert stats[:3] == [True, True, False], stats  # the forward's three convs, then the data gradients'
        assert names.count("bn_stats_finish_cpu") == 2 and names.count("bn_stats_part_cpu") == 0
    model.load_state_dict(state)
    unfused = run(queue, model, x, dy, False, monkeypatch, steps=1)
    model.load_state_dict(state)
    fused2 = run(queue, model, x, dy, True, monkeypatch)
    want = run_torch(torch, ref, x, dy)
    for got in (fused, unfused, fused2, want):  # the first conv's bias: in the statistics (its
        assert abs(got[2].pop("0.bias")).max() < 1e-4  # mean), its gradient 0 before a BatchNorm: noise
    check(fused, unfused, "conv statistics vs unfused", 2e-6)
    record_error(*check(fused2, want, "conv statistics vs torch", 1e-5))


def test_batchnorm_statistics_from_the_conv_before_a_pool(queue, rng, torch, record_error, monkeypatch):
    """The same where the BatchNorm2d also runs the ReLU and the MaxPool2d(2) after it in its pass
    (CPUs: pools_in_norm): its statistics come from the conv, its pass pools."""
    monkeypatch.setenv("NETCL_CPU_WINOT", "1")
    model = randomize(nn.Sequential(nn.Conv2d(8, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                                    nn.MaxPool2d(2)), rng).to(queue).train()
    ref = torch_twin(torch, model, "ReLU")
    state = {k: v.copy() for k, v in model.state_dict().items()}
    x = (rng.standard_normal((2, 8, 16, 32)) + 0.3).astype(np.float32)
    dy = rng.standard_normal(model.output_shape(x.shape)).astype(np.float32)
    names = []
    enqueue = ops._enqueue
    monkeypatch.setattr(ops, "_enqueue", lambda q, k, *a: names.append(k.function_name) or enqueue(q, k, *a))
    fused = run(queue, model, x, dy, True, monkeypatch)
    if ops.is_cpu(queue):
        assert "bn_maxpool2_cpu" in names and "bn_stats_finish_cpu" in names and "bn_stats_part_cpu" not in names
    model.load_state_dict(state)
    check(fused, run(queue, model, x, dy, False, monkeypatch), "pooled conv statistics vs unfused", 2e-6)
    record_error(*check(fused, run_torch(torch, ref, x, dy), "pooled conv statistics vs torch", 1e-5))


def check_conv_statistics(queue, rng, torch, record_error, monkeypatch, model, x_shape, kernel, what,
                          launches=None):
    """model (a Conv2d with bias, BatchNorm2d, ReLU, Conv2d, BatchNorm2d; train mode) with the
    convs' kernel computing both BatchNorms' statistics parts on CPUs: no bn_stats_part_cpu, two
    bn_stats_finish_cpu (the part-major variant bn_stats_finish_pm_cpu for the first BatchNorm2d
    where it has 16k channels), `kernel` run (`launches` times where given); one step and two equal
    the unfused layers' and float64 PyTorch's (the first conv's bias gradient: noise, its mean goes
    into the statistics)."""
    model = randomize(model, rng).to(queue).train()
    ref = torch_twin(torch, model, "ReLU")
    state = {k: v.copy() for k, v in model.state_dict().items()}
    x = (rng.standard_normal(x_shape) * 2 + 0.5).astype(np.float32)
    dy = rng.standard_normal(model.output_shape(x.shape)).astype(np.float32)
    names = []
    enqueue = ops._enqueue
    monkeypatch.setattr(ops, "_enqueue", lambda q, k, *a: names.append(k.function_name) or enqueue(q, k, *a))
    fused = run(queue, model, x, dy, True, monkeypatch, steps=1)
    if ops.is_cpu(queue):
        assert kernel in names and names.count(kernel) == (launches or names.count(kernel)), names
        assert names.count("bn_stats_finish_cpu") + names.count("bn_stats_finish_pm_cpu") == 2, names
        assert ("bn_stats_finish_pm_cpu" in names) == (model.layers[1].num_features % 16 == 0), names
        assert "bn_stats_part_cpu" not in names and "conv_winot" not in names, names
    model.load_state_dict(state)
    unfused = run(queue, model, x, dy, False, monkeypatch, steps=1)
    model.load_state_dict(state)
    fused2 = run(queue, model, x, dy, True, monkeypatch)
    want = run_torch(torch, ref, x, dy)
    for got in (fused, unfused, fused2, want):
        assert abs(got[2].pop("0.bias")).max() < 1e-4
    check(fused, unfused, f"{what} statistics vs unfused", 2e-6)
    record_error(*check(fused2, want, f"{what} statistics vs torch", 1e-5))


@pytest.mark.parametrize("cls", ["native", "other"])
# corrc_cpu's blocks of 32 channels: one partial, one and a partial; 48: bn_stats_finish_pm_cpu's 3 x 16
@pytest.mark.parametrize("channels", [24, 40, 48])
def test_batchnorm_statistics_from_a_stride2_conv(queue, rng, torch, record_error, monkeypatch, channels, cls):
    """A 3x3 stride-2 conv on even planes (CPUs: corrc_cpu, "phases" mode) computes the next
    BatchNorm2d's statistics parts in its own pass, a part's channels together (part-major:
    bn_stats_finish_cpu reads them so); with both CPU classes' blocks (the tuning table's conv_train rows: 32
    channels a work-item, or AVX2's 16, whose blocks of 24 and 40 end in a partial one too)."""
    use_cpu_class(queue, monkeypatch, cls)
    model = nn.Sequential(
        nn.Conv2d(8, channels, 3, stride=2, padding=1), nn.BatchNorm2d(channels), nn.ReLU(),
        nn.Conv2d(channels, 8, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(8))
    check_conv_statistics(queue, rng, torch, record_error, monkeypatch, model, (3, 8, 32, 32), "corrc_cpu",
                          "stride-2 conv", launches=2)


# corr_cpu's blocks of 8 channels (a partial one), and of 4; 16: bn_stats_finish_pm_cpu
@pytest.mark.parametrize("channels", [12, 4, 16])
def test_batchnorm_statistics_from_the_direct_conv(queue, rng, torch, record_error, monkeypatch, channels):
    """A stride-1 3x3 conv on rows of 16 without Winograd (CPUs: corr_cpu, a resnet stem's 3
    channels) computes the next BatchNorm2d's statistics parts in its own pass, a part's channels
    together (hsum16x8's sums)."""
    monkeypatch.setenv("NETCL_CPU_WINOT", "0")
    model = nn.Sequential(
        nn.Conv2d(3, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(),
        nn.Conv2d(channels, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8))
    check_conv_statistics(queue, rng, torch, record_error, monkeypatch, model, (3, 3, 8, 32), "corr_cpu",
                          "direct conv")


@pytest.mark.parametrize("preset", ["weight", "bias"])
@pytest.mark.parametrize("kind", ["plain", "channel", "pooled", "gpu", "layernorm"])
def test_one_parameter_gradient_already_there(queue, rng, torch, monkeypatch, kind, preset):
    """A BatchNorm2d (each backward path) or LayerNorm whose weight or bias alone already holds a
    gradient: that one adds this pass's, the other gets exactly this pass's. (One accumulate flag for
    both once added dbeta onto a recycled buffer's contents, or overwrote the bias's gradient.)"""
    if kind == "gpu":
        monkeypatch.setattr(ops, "_config_class", {queue.device.int_ptr: "gpu"})
    if kind == "layernorm":
        model, ref, shape = nn.Sequential(nn.LayerNorm(6)), torch.nn.Sequential(torch.nn.LayerNorm(6)), (3, 5, 6)
    else:
        layers = [nn.BatchNorm2d(4), nn.ReLU()] + ([nn.MaxPool2d(2)] if kind == "pooled" else [])
        model = nn.Sequential(*layers)
        ref = torch.nn.Sequential(torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                                  *([torch.nn.MaxPool2d(2)] if kind == "pooled" else []))
        shape = (2, 4, 6, 6) if kind != "channel" else (1, 4, 3, 3)
        if kind == "channel":  # the one-kernel-per-channel path: channels >= _CHANNEL_ITEMS per core
            monkeypatch.setattr(norm, "_CHANNEL_ITEMS", 1)
    model = model.to(queue).train()
    layer = model.layers[0]
    junk = [Tensor.from_host(queue, np.full(layer.weight.size, 1000.0, np.float32)) for _ in range(4)]
    del junk  # (their buffers back in the pool: a gradient written without clearing would show them)
    before = rng.standard_normal(layer.weight.shape).astype(np.float32)
    (layer.weight if preset == "weight" else layer.bias).grad = Tensor.from_host(queue, before)
    x = rng.standard_normal(shape).astype(np.float32)
    dy = rng.standard_normal(model.output_shape(shape)).astype(np.float32)
    model(Tensor.from_host(queue, x))
    model.backward(Tensor.from_host(queue, dy))
    ref = ref.double()
    ref(torch.tensor(x, dtype=torch.float64)).backward(torch.tensor(dy, dtype=torch.float64))
    gw, gb = ref[0].weight.grad.numpy(), ref[0].bias.grad.numpy()
    if preset == "weight":
        gw = gw + before
    else:
        gb = gb + before
    np.testing.assert_allclose(layer.weight.grad.to_host(), gw, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(layer.bias.grad.to_host(), gb, rtol=1e-5, atol=1e-5)


def fused_and_unfused(queue, model, x, dy, monkeypatch, steps, input_grad):
    """{fuse: ({name: gradient}, dx or None, the kernels launched)} of `steps` backward passes
    (their gradients added) from the model's state as it is, with training fusion on and off."""
    state = {name: v.copy() for name, v in model.state_dict().items()}
    out = {}
    for fuse in (True, False):
        monkeypatch.setattr(sequential, "TRAIN_FUSE", fuse)
        model.load_state_dict(state)
        model.zero_grad()
        names = []
        enqueue = ops._enqueue
        monkeypatch.setattr(ops, "_enqueue", lambda q, kern, *a: (names.append(kern.function_name), enqueue(q, kern, *a))[1])
        for _ in range(steps):
            model(Tensor.from_host(queue, x))
            dx = model.backward(Tensor.from_host(queue, dy), input_grad=input_grad)
        monkeypatch.setattr(ops, "_enqueue", enqueue)
        out[fuse] = ({name: p.grad.to_host() for name, p in model.named_parameters()},
                     dx.to_host() if dx is not None else None, names)
    return out


# (input shape, kernel size, activation, bias, BatchNorm frozen): a first layer's weights over rows of
# 8, the digits CNN's (1 channel, 3x3, batch 8), 27 and 25 weights an output channel, planes of 2
# rows (one pooled row), an activation differentiated through its output, running statistics
POOL_WGRAD_CASES = [((8, 1, 8, 8), 3, "ReLU", True, False), ((2, 3, 6, 8), 3, "LeakyReLU", False, False),
                    ((2, 1, 4, 8), 5, "Tanh", True, False), ((3, 2, 2, 8), 3, "ReLU", True, False),
                    ((4, 1, 8, 8), 3, "ReLU", True, True)]


@pytest.mark.parametrize("case", POOL_WGRAD_CASES)
def test_first_conv_weight_gradient_in_the_pooled_pass(queue, rng, torch, record_error, monkeypatch, case):
    """A backward without an input gradient (a training step's) whose first Conv2d feeds a
    BatchNorm2d + activation + MaxPool2d(2) on rows of 8: the conv's dW and db come from the
    BatchNorm's last pass (bn_pool_bwd_wgrad_cpu; the conv's dy is never stored), equal to float64
    PyTorch's and to the unfused layers', in one launch fewer; gradients that accumulate (a second
    backward without zero_grad) add."""
    if not ops.is_cpu(queue):
        pytest.skip("the CPU kernels' pooled passes")
    shape, k, act, bias, frozen = case
    cls, kw, _ = ACTS[act]
    model = randomize(nn.Sequential(nn.Conv2d(shape[1], 6, k, padding=k // 2, bias=bias), nn.BatchNorm2d(6),
                                    cls(**kw), nn.MaxPool2d(2), nn.Conv2d(6, 4, 3, padding=1)), rng).to(queue).train()
    if frozen:
        model.layers[1].eval()
    ref = torch_twin(torch, model, act)
    if frozen:
        ref[1].eval()
    x = rng.standard_normal(shape).astype(np.float32)
    dy = rng.standard_normal(model.output_shape(shape)).astype(np.float32)
    runs = fused_and_unfused(queue, model, x, dy, monkeypatch, 2, False)  # the second adds to the first's
    grads = {fuse: r[0] for fuse, r in runs.items()}
    kernels = {fuse: r[2] for fuse, r in runs.items()}
    assert runs[True][1] is None and runs[False][1] is None
    assert "bn_pool_bwd_wgrad_cpu" in kernels[True] and "bn_pool_bwd_wgrad_cpu" not in kernels[False]
    assert not {"wgrad_narrow_cpu", "bn_pool_bwd_apply_cpu"} & set(kernels[True]), \
        "the fused steps ran the conv's own weight gradient or stored its dy"
    xt = torch.tensor(x, dtype=torch.float64)
    for _ in range(2):
        ref(xt).backward(torch.tensor(dy, dtype=torch.float64))
    ref_grads = dict(ref.named_parameters())
    errs = []
    for name, g in grads[True].items():
        r = ref_grads[name].grad.numpy()
        scale = max(float(np.abs(ref_grads["0.weight"].grad.numpy()).max()), 1e-30) if name == "0.bias" else None
        # the conv's bias gradient: about 0 before a BatchNorm (float32 noise of dW's scale)
        errs.append(assert_close(g, r, 1e-5, 1e-6 * scale if scale else 1e-6, what=f"fused {name}"))
        assert_close(g, grads[False][name], 1e-5, 1e-6 * scale if scale else 1e-6, what=f"fused vs unfused {name}")
    record_error(0.0, max(errs))


# input shape -> launches of bn_pool_bwd_apply_pad_cpu a backward: the pooled BatchNorm2d passes
# that write the zero-bordered output gradient of the conv before them (Conv2d.padded_grad: a "rows"
# conv, 16 wide or more, or a stride-1 "channels" one with winot_wgrad); odd sizes leave a row and a
# column no window covers
POOLED_PADDED_GRADS = {(2, 3, 16, 40): 2, (1, 3, 17, 35): 2, (2, 3, 6, 10): 0}


@pytest.mark.parametrize("shape", list(POOLED_PADDED_GRADS))
@pytest.mark.parametrize("input_grad", [True, False])
def test_pooled_batchnorm_writes_the_conv_planes(queue, rng, torch, record_error, monkeypatch, shape, input_grad):
    """BatchNorm2d + activation + MaxPool2d(2) after a conv whose backward reads its output gradient
    as zero-bordered planes: the pooled pass writes those planes and their sums per plane (the
    conv's bias gradient) where the conv copied them (pad_planes_cpu), equal to the unfused layers
    and float64 PyTorch, with input gradient or without (a training step: the first conv too)."""
    if not ops.is_cpu(queue):
        pytest.skip("the CPU kernels' pooled passes")
    model = randomize(nn.Sequential(  # the first BatchNorm frozen: the biased conv's bias gradient is not 0
        nn.Conv2d(3, 8, 3, padding=1, bias=True), nn.BatchNorm2d(8), nn.LeakyReLU(0.1), nn.MaxPool2d(2),
        nn.Conv2d(8, 8, 3, padding=1, bias=True), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 4, 1, bias=True)), rng).to(queue).train()
    model.layers[1].eval()
    ref = torch_twin(torch, model, "ReLU")
    ref[1].eval()
    x = (rng.standard_normal(shape) * 2 + 0.3).astype(np.float32)
    dy = rng.standard_normal(model.output_shape(shape)).astype(np.float32)
    got = fused_and_unfused(queue, model, x, dy, monkeypatch, 1, input_grad)
    kernels = {fuse: r[2] for fuse, r in got.items()}
    assert kernels[True].count("bn_pool_bwd_apply_pad_cpu") == POOLED_PADDED_GRADS[shape]
    assert "bn_pool_bwd_apply_pad_cpu" not in kernels[False]
    # each plane write saves the conv's copy of its dy
    assert kernels[False].count("pad_planes_cpu") - kernels[True].count("pad_planes_cpu") >= POOLED_PADDED_GRADS[shape]
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=input_grad)
    ref(xt).backward(torch.tensor(dy, dtype=torch.float64))
    errs = []
    grads = dict(ref.named_parameters())
    for name, p in grads.items():
        # a conv's bias gradient before a BatchNorm in training: about 0 (float32 noise of its dW's scale)
        w = name[:-len("bias")] + "weight"
        scale = float(np.abs(grads[w].grad.numpy()).max()) if name.endswith("bias") and grads[w].dim() == 4 else 1.0
        errs.append(assert_close(got[True][0][name], p.grad.numpy(), 1e-5, 1e-6 * scale, what=f"fused {name}"))
        assert_close(got[True][0][name], got[False][0][name], 2e-6, 1e-7 * scale, what=f"fused vs unfused {name}")
    if input_grad:
        errs.append(assert_close(got[True][1], xt.grad.numpy(), 1e-5, 1e-6, what="fused dx"))
        assert_close(got[True][1], got[False][1], 2e-6, 1e-7, what="fused vs unfused dx")
    record_error(0.0, max(errs))


@pytest.mark.parametrize("parts,plen,major", [(37, 64, False), (64, 64, False), (16, 64, False), (5, 64, False),
                                             (40, 16, False), (37, 64, True)])
def test_stats_finish_combines_parts_as_float64(queue, rng, parts, plen, major):
    """bn_stats_finish_cpu: a channel's mean and variance (and the running statistics) from its
    parts' sums and squared deviations, against float64 numpy over the values themselves: parts of
    a channel together (the float16 loop of 16 parts a step, its scalar tail) or of a part's
    channels together (part-major, corr_cpu's), the last part short where the values end early."""
    if not ops.is_cpu(queue):
        pytest.skip("a CPU kernel")
    c, m = 3, (parts - 1) * plen + plen // 2 + 1  # the last part short
    x = (rng.standard_normal((c, m)) * 2 + 5).astype(np.float32)
    part = np.zeros((c, parts, 2), np.float32)
    for p in range(parts):
        v = x[:, p * plen:(p + 1) * plen].astype(np.float64)
        part[:, p, 0] = v.sum(1)
        part[:, p, 1] = ((v - v.mean(1, keepdims=True)) ** 2).sum(1)
    layout = np.ascontiguousarray(part.transpose(1, 0, 2)) if major else part
    bn = nn.BatchNorm2d(c, momentum=0.25).to(queue)
    mean, var = ops.new(queue, (c,)), ops.new(queue, (c,))
    bn._finish_stats((Tensor.from_host(queue, layout), parts, plen, major), m, mean, var)
    for t in (mean, var, bn.running_mean, bn.running_var):
        t.mark_written()
    ref_mean, ref_var = x.astype(np.float64).mean(1), x.astype(np.float64).var(1)
    assert_close(mean.to_host(), ref_mean, rtol=1e-6, atol=1e-6, what="mean")
    assert_close(var.to_host(), ref_var, rtol=1e-5, atol=1e-6, what="var")
    assert_close(bn.running_var.to_host(), 0.75 + 0.25 * ref_var * m / (m - 1), rtol=1e-5, atol=1e-6, what="running var")
