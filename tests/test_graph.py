"""netcl.trace and GraphModule: a Module subclass's forward recorded as a graph replays exactly, for any
batch size; trains as the module does; saves and loads without the module's class; exports to ONNX
that onnxruntime and onnx.checker accept at every opset; refuses what a graph cannot hold."""
import numpy as np
import pytest

import netcl
import netcl.nn.functional as F
from netcl import models, nn, optim
from netcl.errors import FormatError
from netcl.io import export_onnx, load, save

ort = pytest.importorskip("onnxruntime")


class Attention(nn.Module):
    """Operations a graph records beyond layer calls: matmul, softmax, transpose, slicing, cat,
    reshape by x.size(0), reductions, a parameter and a constant used directly, comparisons."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 24)
        self.norm = nn.LayerNorm(8)
        self.scale = nn.Parameter(np.full(1, 0.5, np.float32))
        self.head = nn.Linear(8 * 4 + 4, 3)

    def forward(self, x):  # x: (N, 4, 8)
        h = self.norm(x)
        q, k, v = self.proj(h)[..., :8], self.proj(h)[..., 8:16], self.proj(h)[..., 16:]
        attn = (q @ k.transpose(1, 2) * self.scale).softmax(-1)
        y = attn @ v + x
        gate = (y.mean(2, keepdim=True) > 0).float() * 0.5 + 0.5
        y = (y * gate).clamp(-3.0, 3.0)
        stats = netcl.cat([y.amax(2), y.sum(2) / 8.0], 1)[:, ::2]
        flat = y.reshape(x.size(0), -1)
        return self.head(netcl.cat([flat, stats.exp().sqrt() + np.ones(4, np.float32)], 1))


def _bn_stats(model, q, shape, rng):
    model.train()
    with netcl.no_grad():
        for _ in range(2):
            model(netcl.tensor(rng.uniform(0, 1, shape).astype(np.float32), queue=q))
    return model.eval()


class Functional(nn.Module):
    """The layers-as-functions of netcl.nn.functional, each with its arguments: a graph of them lifts
    to a Sequential of their layers (functional.LAYER_OF) and exports as those layers."""

    def __init__(self):
        super().__init__()
        self.conv, self.head = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8 * 4 * 4, 5)

    def forward(self, x):  # x: (N, 3, 16, 16)
        h = F.leaky_relu(self.conv(x), negative_slope=0.2)
        h = F.max_pool2d(F.gelu(h, approximate="tanh"), 2)  # 8x8
        h = F.relu6(F.hardswish(F.silu(F.interpolate(h, size=16))))
        h = F.avg_pool2d(F.hardsigmoid(h), (2, 2), stride=2)  # 8x8
        h = F.dropout(F.adaptive_avg_pool2d(F.tanh(F.sigmoid(h)), 4), 0.25, self.training)
        return F.softmax(self.head(F.relu(h).flatten(1)), dim=1)


CASES = [(models.ResNet8, (3, 3, 32, 32)), (Attention, (3, 4, 8)), (Functional, (3, 3, 16, 16))]
IDS = ["resnet8_module", "attention", "functional"]


@pytest.mark.parametrize("make,shape", CASES, ids=IDS)
def test_a_trace_replays_the_module_for_any_batch(queue, rng, make, shape):
    model = _bn_stats(make().to(queue), queue, shape, rng)
    x = rng.standard_normal(shape).astype(np.float32)
    gm = netcl.trace(model, netcl.tensor(x, queue=queue))
    assert isinstance(gm, nn.GraphModule)
    ours, theirs = gm.state_dict(), model.state_dict()
    assert [k for k in ours if not k.startswith("const_")] == list(theirs)  # the model's keys, in its order
    assert all(np.array_equal(ours[k], v) for k, v in theirs.items())
    for batch in (shape[0], 1, 5):
        xb = rng.standard_normal((batch,) + shape[1:]).astype(np.float32)
        with netcl.no_grad():  # (a graph that lifts runs the Sequential's fused kernels: float32 noise)
            want = model(netcl.tensor(xb, queue=queue)).numpy()
            np.testing.assert_allclose(gm(netcl.tensor(xb, queue=queue)).numpy(), want, rtol=0,
                                       atol=1e-5 * float(np.abs(want).max()))
            np.testing.assert_allclose(gm.predict(xb, queue), want, rtol=0, atol=1e-5 * float(np.abs(want).max()))
    assert (gm.lifted is not None) == (make is not Attention)  # (the attention's operations do not lift)
    with pytest.raises(ValueError, match="traced for input"):
        gm(netcl.tensor(np.zeros((2,) + tuple(n + 1 for n in shape[1:]), np.float32), queue=queue))


@pytest.mark.parametrize("make,shape", CASES, ids=IDS)
def test_a_graph_saves_loads_and_exports(queue, rng, tmp_path, make, shape):
    model = _bn_stats(make().to(queue), queue, shape, rng)
    x = rng.standard_normal(shape).astype(np.float32)
    with netcl.no_grad():
        want = model(netcl.tensor(x, queue=queue)).numpy()
    save(model, tmp_path / "m.netcl", example_input=x)  # a Module subclass: traced, then saved
    loaded = load(tmp_path / "m.netcl")
    assert isinstance(loaded, nn.GraphModule) and not loaded.training
    with netcl.no_grad():
        np.testing.assert_allclose(loaded.to(queue)(netcl.tensor(x, queue=queue)).numpy(), want, rtol=0,
                                   atol=1e-5 * float(np.abs(want).max()))
    import onnx

    for opset in (11, 13, 17, 20, 25):
        path = tmp_path / f"m{opset}.onnx"
        export_onnx(model, (1,) + shape[1:], path, dynamic_batch=True, opset=opset)
        onnx.checker.check_model(onnx.load(path), full_check=True)
        got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-5 * max(1.0, float(np.abs(want).max())))
    export_onnx(loaded, shape, tmp_path / "loaded.onnx")  # a loaded graph exports without its class,
    export_onnx(model, shape, tmp_path / "model.onnx")  # to the bytes the module itself exports to
    assert (tmp_path / "loaded.onnx").read_bytes() == (tmp_path / "model.onnx").read_bytes()


def test_a_graph_trains_as_its_module(queue, rng):
    netcl.manual_seed(3)
    model = Attention().to(queue)
    netcl.manual_seed(3)
    twin = Attention().to(queue)
    x = rng.standard_normal((3, 4, 8)).astype(np.float32)
    gm = netcl.trace(twin, netcl.tensor(x, queue=queue))
    y = [0, 2, 1]
    for m in (model, gm):
        m.train()
        F.cross_entropy(m(netcl.tensor(x, queue=queue)), y).backward()
    for (k, p), (k2, p2) in zip(model.named_parameters(), gm.named_parameters()):
        assert k == k2
        np.testing.assert_allclose(p2.grad.numpy(), p.grad.numpy(), rtol=1e-5, atol=1e-6, err_msg=k)
    opt = optim.SGD(gm.parameters(), lr=0.1, momentum=0.9)
    step = netcl.TrainStep(gm, nn.CrossEntropyLoss(), opt)
    losses = [float(step(x, np.array(y))) for _ in range(6)]
    assert step.replays >= 3 and losses[-1] < losses[0]


class Dropped(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.drop = nn.Linear(6, 16), nn.Linear(16, 3), nn.Dropout(0.3)

    def forward(self, x):
        return self.fc2(self.drop(F.relu(self.fc1(x))) + F.dropout(x, 0.2, self.training).sum(1, keepdim=True))


def test_a_module_checkpoint_resumes_as_the_run_goes_on(queue, rng, tmp_path):
    """save_checkpoint traces a Module subclass (without drawing from the random generator: the
    dropout masks after it are the uninterrupted run's) and load_checkpoint resumes it exactly."""
    x, y = rng.standard_normal((8, 6)).astype(np.float32), rng.integers(0, 3, 8)

    def steps(model, opt, n):
        for _ in range(n):
            opt.zero_grad()
            F.cross_entropy(model(netcl.tensor(x, queue=queue)), y).backward()
            opt.step()

    netcl.manual_seed(11)
    plain = Dropped().to(queue)
    steps(plain, optim.Adam(plain.parameters(), lr=0.01), 4)  # a run that saves nothing
    netcl.manual_seed(11)
    model = Dropped().to(queue)
    opt = optim.Adam(model.parameters(), lr=0.01)
    steps(model, opt, 2)
    netcl.io.save_checkpoint(tmp_path / "c.netcl", model, opt, epoch=1)
    steps(model, opt, 2)
    loaded, opt2, meta = netcl.io.load_checkpoint(tmp_path / "c.netcl")
    assert isinstance(loaded, nn.GraphModule) and meta["epoch"] == 1
    steps(loaded.to(queue), opt2, 2)
    for k, a in model.state_dict().items():
        assert np.array_equal(plain.state_dict()[k], a), k  # (saving changed nothing)
        np.testing.assert_allclose(loaded.state_dict()[k], a, rtol=1e-6, atol=1e-7, err_msg=k)


def test_a_graph_of_blocks_lifts_to_the_sequential_and_trains_as_it(queue, rng):
    """ResNet8 traced lifts to resnet8's Sequential of blocks (the same layer objects): its training
    step is the Sequential's (its fusions), its gradients those of the module's own forward."""
    netcl.manual_seed(5)
    model = models.ResNet8().to(queue).train()
    x = rng.uniform(0, 1, (4, 3, 32, 32)).astype(np.float32)
    gm = netcl.trace(model, x)
    seq = gm.lifted
    assert [type(m).__name__ for m in seq] == [type(m).__name__ for m in models.resnet8()]
    assert gm.submodule("blocks.1.conv1") is seq[5].body[0]
    F.cross_entropy(model(netcl.tensor(x, queue=queue)), [1, 2, 3, 4]).backward()
    want = {k: p.grad.numpy().copy() for k, p in model.named_parameters()}
    model.zero_grad()
    F.cross_entropy(gm(netcl.tensor(x, queue=queue)), [1, 2, 3, 4]).backward()
    for k, p in gm.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), want[k], rtol=1e-4, atol=1e-5 * float(np.abs(want[k]).max()),
                                   err_msg=k)


def test_control_flow_on_values_is_refused_naming_the_line(queue):
    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, x):
            if x.sum() > 0:  # the refused line
                return self.lin(x)
            return x

    with pytest.raises(netcl.nn.TraceError, match=r"test_graph.py:\d+: +if x.sum\(\) > 0"):
        netcl.trace(Branchy(), np.ones((2, 3), np.float32))

    class Reads(nn.Module):
        def forward(self, x):
            return x * float(x.amax())

    with pytest.raises(netcl.nn.TraceError, match="item"):
        netcl.trace(Reads(), np.ones((2, 3), np.float32))

    seen = []

    class Prints(nn.Module):  # printing a tensor reads nothing while tracing
        def forward(self, x):
            y = x * 2
            seen.append(repr(y))
            return y

    netcl.trace(Prints(), np.ones((2, 3), np.float32))
    assert len(seen) == 1 and seen[0].startswith("Tensor(shape=(2, 3), on=")

    class MakesLayers(nn.Module):
        def forward(self, x):
            return nn.Linear(3, 3)(x)

    with pytest.raises(netcl.nn.TraceError, match="made inside forward"):
        netcl.trace(MakesLayers(), np.ones((2, 3), np.float32))

    class Doubled(nn.Linear):  # its kernels would run unseen by the graph
        def forward(self, x):
            return super().forward(x) * 2

    with pytest.raises(netcl.nn.TraceError, match="overrides forward"):
        netcl.trace(nn.Sequential(Doubled(3, 3)), np.ones((2, 3), np.float32))


@pytest.mark.parametrize("make", [lambda: nn.Sequential(nn.Linear(6, 4), nn.ReLU()), lambda: nn.Linear(6, 4)],
                         ids=["sequential", "layer"])
def test_tracing_what_is_layers_already_says_so(queue, make):
    with pytest.raises(TypeError, match="netcl layers only"):
        netcl.trace(make().to(queue), np.zeros((2, 6), np.float32))


def test_saving_a_module_needs_an_input_to_trace(queue, tmp_path):
    model = Attention()
    with pytest.raises(ValueError, match="example_input"):
        save(model, tmp_path / "x.netcl")
    model.to(queue)(netcl.tensor(np.zeros((2, 4, 8), np.float32), queue=queue))  # the last input's shape
    save(model, tmp_path / "x.netcl")
    assert isinstance(load(tmp_path / "x.netcl"), nn.GraphModule)


def test_a_file_with_a_broken_graph_is_refused(queue, tmp_path):
    model = Attention().to(queue).eval()
    save(model, tmp_path / "ok.netcl", example_input=np.zeros((2, 4, 8), np.float32))
    raw = (tmp_path / "ok.netcl").read_bytes()
    for old, new, why in [(b'"op": "add"', b'"op": "xyz"', "unknown operation"),  # (lengths kept)
                          (b'"args": [{"v": 0}]', b'"args": [{"v": 8}]', "no earlier value"),
                          (b'"target": "proj"', b'"target": "nope"', "does not resolve"),
                          (b'"op": "input"', b'"op": "const"', "starts with its input"),
                          (b'"args": [{"v": 5}, 1, 2]', b'"args": [{"v":5,"k":1}] ', "does not match node 5's 1 outputs"),
                          (b'"v": 33}], "out": [["N", 3]]', b'"v": 33}], "out": [["N", 4]]', "is not node 33's")]:
        assert old in raw, old
        bad = raw.replace(old, new, 1)
        (tmp_path / "bad.netcl").write_bytes(_refresh_checksum(bad))
        with pytest.raises(FormatError, match=why):
            load(tmp_path / "bad.netcl")


def test_a_graph_holds_to_the_output_shape_it_declares(queue, rng):
    gm = netcl.trace(Attention().to(queue).eval(), netcl.tensor(np.zeros((2, 4, 8), np.float32), queue=queue))
    gm.graph[-1]["out"] = gm.graph[-2]["out"] = [["N", 4]]  # (a consistent lie: the file check passes)
    with pytest.raises(ValueError, match=r"computes \(2, 3\) where it declares \(N, 4\)"):
        gm(netcl.tensor(rng.standard_normal((2, 4, 8)).astype(np.float32), queue=queue))


def _refresh_checksum(raw):
    """The file with its trailing SHA-256 made to fit its new bytes (the loader checks it first)."""
    import hashlib

    body = raw[:-32]
    return body + hashlib.sha256(body).digest()
