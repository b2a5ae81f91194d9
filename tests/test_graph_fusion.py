"""A traced graph that does not lift whole into a Sequential (lift) in eval mode: the parts that do
run through their fused plans (graph.segments), element-wise chains through one generated kernel
each (netcl.jit.chain). Checked against the node-by-node replay (graph.FUSE off), numpy and float64
PyTorch; the chain's broadcasting, NaN and infinities; gradients, threads, saving."""
import numpy as np
import pytest

import netcl
from netcl import Tensor, nn, ops
from netcl.jit import chain
from netcl.nn import functional as F
from netcl.nn import graph
from netcl.nn.graph_chain import elementwise

from conftest import hammer_threads, torch_state


class SE(nn.Module):
    """conv + BN, SiLU written x * sigmoid(x), a squeeze-excitation gate, the block's input added."""

    def __init__(self, c, r=4):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc1, self.fc2 = nn.Conv2d(c, c // r, 1), nn.Conv2d(c // r, c, 1)

    def forward(self, x):
        h = self.bn(self.conv(x))
        h = h * F.sigmoid(h)
        s = F.sigmoid(self.fc2(F.relu(self.fc1(self.pool(h)))))
        return h * s + x


class SENet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem, self.b1, self.b2 = nn.Conv2d(3, 8, 3, padding=1), SE(8), SE(8)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5))

    def forward(self, x):
        return self.head(self.b2(self.b1(F.relu(self.stem(x)))))


def _torch_senet(torch):
    tnn = torch.nn

    class TSE(tnn.Module):
        def __init__(self, c, r=4):
            super().__init__()
            self.conv, self.bn = tnn.Conv2d(c, c, 3, padding=1), tnn.BatchNorm2d(c)
            self.pool = tnn.AdaptiveAvgPool2d(1)
            self.fc1, self.fc2 = tnn.Conv2d(c, c // r, 1), tnn.Conv2d(c // r, c, 1)

        def forward(self, x):
            h = self.bn(self.conv(x))
            h = h * torch.sigmoid(h)
            return h * torch.sigmoid(self.fc2(torch.relu(self.fc1(self.pool(h))))) + x

    class TNet(tnn.Module):
        def __init__(self):
            super().__init__()
            self.stem, self.b1, self.b2 = tnn.Conv2d(3, 8, 3, padding=1), TSE(8), TSE(8)
            self.head = tnn.Sequential(tnn.AdaptiveAvgPool2d(1), tnn.Flatten(), tnn.Linear(8, 5))

        def forward(self, x):
            return self.head(self.b2(self.b1(torch.relu(self.stem(x)))))

    return TNet().double().eval()


def _randomize_bn(model, rng):
    for _, m in model.named_modules():
        if isinstance(m, nn.BatchNorm2d):
            c = m.num_features
            m.running_mean.set_(rng.normal(0, 0.5, c))
            m.running_var.set_(rng.uniform(0.5, 2.0, c))
            m.weight.set_(rng.uniform(0.5, 1.5, c))
            m.bias.set_(rng.normal(0, 0.2, c))


def _same(got, want):
    """The fused result against the replay's: a fused conv stage folds BatchNorm into its weights
    (as a Sequential's fused path does), which rounds differently from running the BN after the conv."""
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)


def _replay(gm, x, monkeypatch):
    """gm's eval forward node by node (graph.FUSE off)."""
    with monkeypatch.context() as m:
        m.setattr(graph, "FUSE", False)
        return gm.predict(x)


@pytest.fixture
def senet(queue, rng):
    model = SENet()
    _randomize_bn(model, rng)
    gm = netcl.trace(model, rng.standard_normal((2, 3, 8, 8)).astype(np.float32)).eval()
    return model, gm


def test_a_graph_that_does_not_lift_runs_its_parts_fused_as_the_replay_gives(queue, rng, senet, monkeypatch):
    _, gm = senet
    assert gm.lifted is None
    segs, chains = gm._fusion.segments, gm._fusion.chains
    # stem conv + relu; per block conv + BN and the gate's pool, 1x1 convs and activations; the head
    assert len(segs) == 6 and all(s.seq._fused is not None for s in segs)
    # per block x * sigmoid(x), and h * s + x
    assert len(chains) == 4 and all(len(c.members) == 2 for c in chains)
    for n in (1, 3, 4):  # the batch stays free
        x = rng.standard_normal((n, 3, 8, 8)).astype(np.float32)
        _same(gm.predict(x), _replay(gm, x, monkeypatch))
        with netcl.no_grad():
            _same(gm(Tensor.from_host(queue, x)).to_host(), _replay(gm, x, monkeypatch))


def test_the_fused_graph_matches_float64_torch(queue, rng, senet):
    torch = pytest.importorskip("torch")
    model, gm = senet
    ref = _torch_senet(torch)
    missing, unexpected = ref.load_state_dict(torch_state(torch, model), strict=False)
    assert not unexpected and all(k.endswith("num_batches_tracked") for k in missing)
    x = rng.standard_normal((3, 3, 8, 8)).astype(np.float32)
    want = ref(torch.tensor(x, dtype=torch.float64)).detach().numpy()
    np.testing.assert_allclose(gm.predict(x), want, rtol=1e-4, atol=1e-5)


class Between(nn.Module):
    """Layer runs with a tensor operation between them, a residual block among them, and a layer
    with weights called twice (which stays out of every segment)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.c1, self.bn1 = nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.shared = nn.Conv2d(8, 8, 1)
        self.fc = nn.Linear(8 * 8 * 8, 4)

    def forward(self, x):
        h = self.a(x) * 0.5
        h = F.relu(self.bn1(self.c1(h)) + h)  # a Residual, inside the segment after the multiply
        h = self.shared(self.shared(h) - 1.0)
        return self.fc(h.flatten(1))


def test_layer_runs_between_tensor_operations_lift_as_segments(queue, rng, monkeypatch):
    model = Between()
    _randomize_bn(model, rng)
    gm = netcl.trace(model, rng.standard_normal((2, 3, 8, 8)).astype(np.float32)).eval()
    assert gm.lifted is None
    kinds = [[type(m).__name__ for m in s.seq.layers] for s in gm._fusion.segments]
    assert ["Sequential"] in kinds  # self.a, called whole
    assert ["Residual", "ReLU"] in kinds
    assert all("shared" not in gm.graph[j].get("target", "") for s in gm._fusion.segments for j in s.members)
    for n in (2, 5):
        x = rng.standard_normal((n, 3, 8, 8)).astype(np.float32)
        _same(gm.predict(x), _replay(gm, x, monkeypatch))


def test_a_segment_with_a_large_conv_on_the_generic_family_runs_its_layers(queue, rng, senet, monkeypatch):
    _, gm = senet
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    gm.predict(x)
    gates = [s for s in gm._fusion.segments if type(s.seq.layers[0]).__name__ == "AdaptiveAvgPool2d"
             and len(s.seq.layers) == 5]
    assert len(gates) == 2
    for s in gates:
        (key, took), = s._layers_only.items()
        h = Tensor.from_host(queue, np.zeros((2,) + key[1][1:], np.float32))
        macs = s.seq._fused.generic_conv_macs(queue, key[1])
        assert took == (macs > graph.GENERIC_CONV_MACS) and s.takes(h) == (not took)
        if not ops.is_cpu(queue):
            assert not took
    want = _replay(gm, x, monkeypatch)
    for bound in (-1, 1 << 30):  # every gate through its layers, then through its plan
        monkeypatch.setattr(graph, "GENERIC_CONV_MACS", bound)
        for s in gates:
            s._layers_only.clear()
        _same(gm.predict(x), want)
        assert all(s._layers_only and all(v == (bound < 0 and ops.is_cpu(queue) and
                                                 s.seq._fused.generic_conv_macs(queue, k[1]) > 0)
                                          for k, v in s._layers_only.items()) for s in gates)


def test_training_and_gradients_replay_the_graph(queue, rng, senet, monkeypatch):
    _, gm = senet
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    grads = []
    for fuse in (True, False):  # eval mode, gradients recorded: the chains step aside for the operations
        monkeypatch.setattr(graph, "FUSE", fuse)
        t = netcl.tensor(x, queue=queue, requires_grad=True)
        gm(t).sum().backward()
        grads.append(t.grad.to_host())
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-5, atol=1e-6)
    gm.train()
    assert all(s.seq.training for s in gm._fusion.segments)
    gm.eval()
    assert not any(s.seq.training for s in gm._fusion.segments)


def test_threads_share_one_fused_graph(queue, rng, senet):
    _, gm = senet
    xs = [rng.standard_normal((n, 3, 8, 8)).astype(np.float32) for n in (1, 2, 3)]
    hammer_threads(gm, queue, xs, calls=6)


def test_a_saved_graph_loads_with_its_fused_parts(queue, rng, senet, tmp_path, monkeypatch):
    _, gm = senet
    netcl.io.save(gm, tmp_path / "se.netcl")
    back = netcl.io.load(tmp_path / "se.netcl").eval()
    assert len(back._fusion.segments) == len(gm._fusion.segments)
    x = rng.standard_normal((3, 3, 8, 8)).astype(np.float32)
    _same(back.predict(x), _replay(gm, x, monkeypatch))


# -- the element-wise chain kernel ------------------------------------------------------------------
class Ops(nn.Module):
    """Every operation a chain takes, on x, a per-channel vector, a per-(sample, channel) gate and
    a scalar tensor (parameters of the model)."""

    def __init__(self):
        super().__init__()
        self.ch = nn.Parameter(np.linspace(0.5, 1.5, 4, dtype=np.float32).reshape(1, 4, 1, 1))
        self.last = nn.Parameter(np.linspace(-1, 1, 5, dtype=np.float32))
        self.one = nn.Parameter(np.array([2.0], np.float32))

    def forward(self, x):
        g = x.mean(dim=(2, 3), keepdim=True)  # (N, C, 1, 1)
        h = (x - self.ch) / self.one + g * 0.5
        h = netcl.functions.maximum(h, -2.0) - netcl.functions.minimum(h, 3.0) * self.last
        h = -F.silu(h) + F.hardswish(h) * F.tanh(h) + netcl.functions.exp(-h.relu()) / (1.0 + F.sigmoid(h))
        return F.leaky_relu(h, 0.2) + F.relu6(h) + F.hardsigmoid(h) - 3.0 + F.gelu(h, approximate="tanh")


def _numpy_ops(model, x):
    ch, last, one = (t.to_host().astype(np.float64) for t in (model.ch, model.last, model.one))
    x = x.astype(np.float64)
    sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    with np.errstate(all="ignore"):
        g = x.mean(axis=(2, 3), keepdims=True)
        h = (x - ch) / one + g * 0.5
        h = np.where(np.isnan(h) | (h > -2), h, -2) - np.where(np.isnan(h) | (h < 3), h, 3) * last
        hsw = h * np.clip(h + 3, 0, 6) / 6
        h = -(h * sig(h)) + hsw * np.tanh(h) + np.exp(-np.maximum(h, 0)) / (1 + sig(h))
        gelu = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h ** 3)))
        return np.where(h > 0, h, 0.2 * h) + np.clip(h, 0, 6) + np.clip(h + 3, 0, 6) / 6 - 3 + gelu


def test_a_chain_of_every_operation_is_one_kernel_as_numpy_and_the_replay_give(queue, rng, monkeypatch):
    model = Ops()
    x = rng.standard_normal((2, 4, 3, 5)).astype(np.float32) * 3
    gm = netcl.trace(model, x).eval()
    (c,) = gm._fusion.chains
    assert len(c.members) >= 20 and len(c.inputs) == 5  # x, ch, one, g, last: one kernel
    for n in (2, 3):
        xb = rng.standard_normal((n, 4, 3, 5)).astype(np.float32) * 3
        got = gm.predict(xb)
        np.testing.assert_allclose(got, _replay(gm, xb, monkeypatch), rtol=2e-6, atol=2e-6)
        np.testing.assert_allclose(got, _numpy_ops(model, xb), rtol=1e-4, atol=1e-5)


def test_the_gpu_variant_of_a_chain_gives_the_same(queue, rng, monkeypatch):
    """The one-element-per-work-item variant GPUs run (forced on a CPU device), its scalar body."""
    model = Ops()
    x = rng.standard_normal((3, 4, 3, 5)).astype(np.float32) * 3
    gm = netcl.trace(model, x).eval()
    want = gm.predict(x)
    monkeypatch.setattr(ops, "_config_class", {queue.device.int_ptr: "gpu"})
    assert not ops.is_cpu(queue)
    got = gm.predict(x)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(got, _numpy_ops(model, x), rtol=1e-4, atol=1e-5)


def test_nan_and_the_infinities_go_through_a_chain_as_through_its_operations(queue, monkeypatch):
    class M(nn.Module):
        def forward(self, x):
            return F.silu(x) * F.sigmoid(x) + F.relu(x) / (x - 1.0) - netcl.functions.exp(x * 0.5).tanh()

    x = np.array([[np.nan, np.inf, -np.inf, 0.0, 1.0, -1.0, 80.0, -80.0]], np.float32)
    gm = netcl.trace(M(), x).eval()
    assert len(gm._fusion.chains) == 1
    got, want = gm.predict(x), _replay(gm, x, monkeypatch)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = np.isfinite(want)
    np.testing.assert_array_equal(got[~finite], want[~finite])
    np.testing.assert_allclose(got[finite], want[finite], rtol=2e-6)
    assert np.isnan(got[0, 0]) and got[0, 4] == np.inf  # relu(1) / 0 = inf, the rest finite
    torch = pytest.importorskip("torch")
    t = torch.tensor(x, dtype=torch.float64)
    ref = (torch.nn.functional.silu(t) * torch.sigmoid(t) + torch.relu(t) / (t - 1) - torch.exp(t * 0.5).tanh())
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref.numpy()))
    np.testing.assert_allclose(got[finite], ref.numpy()[finite], rtol=1e-5)


def test_the_kernel_variants_are_one_per_signature(queue, rng):
    x = Tensor.from_host(queue, rng.standard_normal((2, 3, 4)).astype(np.float32))
    gate = Tensor.from_host(queue, rng.standard_normal((2, 3, 1)).astype(np.float32))
    steps = [("mul", (("in", 0), ("s", 0))), ("add", (("t", 0), ("in", 1)))]
    c = chain.Chain(steps, 2, 1)
    chain.run(c, [x, gate], [2.0], (2, 3, 4))
    built = chain.STATS["built"]
    for s in (3.0, -1.5):  # a new number is an argument: nothing builds
        y = chain.run(chain.Chain(steps, 2, 1), [x, gate], [s], (2, 3, 4)).to_host()
        np.testing.assert_allclose(y, x.to_host() * s + gate.to_host(), rtol=1e-6)
    assert chain.STATS["built"] == built
    y = chain.run(c, [x, x], [2.0], (2, 3, 4))  # the second input no longer broadcast: another variant
    assert chain.STATS["built"] == built + 1
    np.testing.assert_allclose(y.to_host(), x.to_host() * 3, rtol=1e-6)
    assert chain.run(c, [x, Tensor.from_host(queue, np.ones((2, 1, 4), np.float32))], [1.0], (2, 3, 4)) is None


def test_broadcast_index_reads_contiguous_runs_of_the_output_dimensions():
    out = (2, 3, 4, 5)
    assert chain.broadcast_index((1, 3, 1, 1), out) == (20, 3)
    assert chain.broadcast_index((2, 3, 1, 1), out) == (20, 6)
    assert chain.broadcast_index((5,), out) == (1, 5)
    assert chain.broadcast_index((4, 5), out) == (1, 20)
    assert chain.broadcast_index((1,), out) == (1, 1)
    assert chain.broadcast_index((), out) == (1, 1)
    assert chain.broadcast_index((2, 1, 4, 1), out) is None  # two runs
    assert chain.broadcast_index((3, 1), out) is None  # not the output's sizes
    assert chain.broadcast_index((1, 2, 3, 4, 5), out) is None


def test_the_generated_source_is_opencl_c_without_builtins():
    steps = [chain.act_step(7, ("in", 0)), ("div", (("t", 0), ("in", 1))), chain.act_step(2, ("t", 1), ("s", 0))]
    src = chain.Chain(steps, 2, 1).source("fb")
    assert "__builtin" not in src and "restrict" not in src and "FP_CONTRACT OFF" in src
    assert "x1[(i / d1) % m1]" in src and "ACT_APPLY(2, t1, ((float)s0))" in src and "vload16(0, x0 + i)" in src


def test_only_element_wise_nodes_of_the_shapes_they_take_join_a_chain():
    ref = {"v": 1}
    assert elementwise({"op": "mul", "args": [ref, 2.0]}) == ("mul", [ref, 2.0])
    assert elementwise({"op": "sub", "args": [{"inf": -1}, ref]}) == ("sub", [-np.inf, ref])
    assert elementwise({"op": "F.relu", "args": [ref], "kwargs": {"inplace": False}})[0] == ("act", 1, 0.0)
    assert elementwise({"op": "F.leaky_relu", "args": [ref, 0.3]})[0][2] == 0.3
    assert elementwise({"op": "F.gelu", "args": [ref], "kwargs": {"approximate": "tanh"}})[0] == ("act", 6, 0.0)
    assert elementwise({"op": "activation", "args": [ref, 2, 0.1]})[0] == ("act", 2, 0.1)
    assert elementwise({"op": "mul", "args": [2.0, 3.0]}) is None
    assert elementwise({"op": "pow", "args": [ref, 2.0]}) is None
    assert elementwise({"op": "add", "args": [ref, ref], "kwargs": {"alpha": 2}}) is None


def test_an_imported_onnx_graph_with_gates_runs_fused_as_torch(queue, rng, tmp_path, monkeypatch):
    """The torch twin of SENet (squeeze-excitation gates, x * sigmoid(x)) through torch.onnx.export and
    import_onnx: its parts run fused and agree with float64 torch."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnx")
    import warnings

    tm = _torch_senet(torch).float()
    for m in tm.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    path = tmp_path / "se.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            torch.onnx.export(tm, (torch.from_numpy(x),), str(path), dynamo=False, opset_version=13,
                              input_names=["input"], output_names=["output"], dynamic_axes={"input": {0: "n"}})
        except Exception as e:  # an exporter that needs a network or extra packages here
            pytest.skip(f"torch.onnx.export does not work here: {e}")
    gm = netcl.io.import_onnx(str(path)).eval()
    assert isinstance(gm, nn.GraphModule) and gm.lifted is None
    assert gm._fusion.segments and gm._fusion.chains
    ref = tm.double()
    for n in (2, 3):
        xb = rng.standard_normal((n, 3, 8, 8)).astype(np.float32)
        want = ref(torch.tensor(xb, dtype=torch.float64)).detach().numpy()
        got = gm.predict(xb)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        _same(got, _replay(gm, xb, monkeypatch))
