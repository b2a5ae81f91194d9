"""import_onnx of graphs that are not a chain (netcl.io.onnx_graph): torch modules exported by
torch.onnx.export at opsets 9 to 18 come back as GraphModules that agree with onnxruntime and with
torch in float64, train, save and load, and export to ONNX again; an unsupported op is named once per
type with its count."""
import os
import warnings

import numpy as np
import pytest

import netcl
import netcl.nn.functional as F
from netcl import nn, optim
from netcl.io import export_onnx, import_onnx, load, save
from netcl.io import onnx_graph
from netcl.io import onnx_import as oi

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

tnn = torch.nn


# -- the torch modules -----------------------------------------------------------------------------------
def _bn(c):
    bn = tnn.BatchNorm2d(c)
    with torch.no_grad():
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2)
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
    return bn


class BasicBlock(tnn.Module):
    """ResNet's basic block with a projection shortcut (stride 2, more channels)."""

    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = tnn.Conv2d(3, 6, 3, 2, 1, bias=False), _bn(6)
        self.conv2, self.bn2 = tnn.Conv2d(6, 6, 3, 1, 1, bias=False), _bn(6)
        self.down = tnn.Sequential(tnn.Conv2d(3, 6, 1, 2, bias=False), _bn(6))
        self.fc = tnn.Linear(6, 5)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn2(self.conv2(y)) + self.down(x))
        return self.fc(y.mean((2, 3)))


class SqueezeExcite(tnn.Module):
    """MobileNet/EfficientNet's squeeze-excitation, by GlobalAveragePool and by ReduceMean, with SiLU."""

    def __init__(self):
        super().__init__()
        self.conv = tnn.Conv2d(3, 8, 3, padding=1)
        self.pool = tnn.AdaptiveAvgPool2d(1)
        self.reduce1, self.expand1 = tnn.Conv2d(8, 2, 1), tnn.Conv2d(2, 8, 1)
        self.reduce2, self.expand2 = tnn.Conv2d(8, 4, 1), tnn.Conv2d(4, 8, 1)

    def forward(self, x):
        x = tnn.functional.silu(self.conv(x))
        x = x * torch.sigmoid(self.expand1(torch.relu(self.reduce1(self.pool(x)))))
        s = x.mean((2, 3), keepdim=True)
        return x * torch.sigmoid(self.expand2(tnn.functional.silu(self.reduce2(s))))


class DenseBlock(tnn.Module):
    """DenseNet: each layer sees the concatenation of every earlier output."""

    def __init__(self):
        super().__init__()
        self.layers = tnn.ModuleList([tnn.Sequential(_bn(3 + 4 * i), tnn.ReLU(), tnn.Conv2d(3 + 4 * i, 4, 3, padding=1))
                                      for i in range(3)])
        self.pool = tnn.MaxPool2d(3, 2, ceil_mode=True)

    def forward(self, x):
        feats = [x]
        for layer in self.layers:
            feats.append(layer(torch.cat(feats, 1)))
        return self.pool(torch.cat(feats, 1))


class ShuffleUnit(tnn.Module):
    """ShuffleNet V2's unit: half the channels through a branch, the halves joined, the channels shuffled."""

    def __init__(self):
        super().__init__()
        self.stem = tnn.Conv2d(3, 8, 1)
        self.branch = tnn.Sequential(tnn.Conv2d(4, 4, 1), _bn(4), tnn.ReLU(), tnn.Conv2d(4, 4, 3, padding=1, groups=4))

    def forward(self, x):
        x = self.stem(x)
        a, b = x.chunk(2, dim=1)
        x = torch.cat((a, self.branch(b)), dim=1)
        n, c, h, w = x.shape
        x = x.view(n, 2, c // 2, h, w).transpose(1, 2).contiguous().view(n, -1, h, w)
        return torch.cat((x[:, :3], x[:, 5:]), 1)  # (a Slice of a tensor's channels)


class Mlp(tnn.Module):
    """Gemm transB=1 (Linear), a MatMul with a square constant and one with a non-square constant."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = tnn.Linear(12, 7), tnn.Linear(7, 3)
        self.square = tnn.Parameter(torch.randn(7, 7) * 0.3)  # (a transposed square weight would pass unseen)
        self.wide = tnn.Parameter(torch.randn(7, 9) * 0.3)
        self.back = tnn.Parameter(torch.randn(9, 7) * 0.3)

    def forward(self, x):
        h = torch.tanh(self.fc1(x.flatten(1)))
        h = h + torch.relu(h @ self.square) + (h @ self.wide) @ self.back
        return self.fc2(h)


class HardActivations(tnn.Module):
    """MobileNetV3's HardSwish and HardSigmoid, MobileNetV2's ReLU6 (Clip), a clamp and a GELU."""

    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = tnn.Conv2d(3, 6, 3, padding=1), tnn.Conv2d(6, 6, 1)

    def forward(self, x):
        y = tnn.functional.hardswish(self.conv1(x))
        y = tnn.functional.relu6(self.conv2(y)) * tnn.functional.hardsigmoid(y)
        return tnn.functional.gelu(y.clamp(-1.0, 2.5) - x.mean(1, keepdim=True))


class TokenMixer(tnn.Module):
    """A transformer MLP block on (N, L, D): LayerNorm (LayerNormalization at opset 17, ReduceMean/Sub/Pow/
    Sqrt/Div before), GELU (Erf), Linear on 3-D input (MatMul + Add), a residual and a transpose."""

    def __init__(self):
        super().__init__()
        self.norm, self.fc1, self.fc2 = tnn.LayerNorm(6), tnn.Linear(6, 10), tnn.Linear(10, 6)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        x = x + self.fc2(tnn.functional.gelu(self.fc1(self.norm(x))))
        return x.transpose(1, 2).softmax(-1)


class PatchEmbed(tnn.Module):
    """ViT's stem: patches by a strided Conv, a class token expanded over the batch and prepended, a
    position embedding added (Parameters as operands), LayerNorm, the class token's row (Gather)."""

    def __init__(self):
        super().__init__()
        self.patch = tnn.Conv2d(3, 6, 4, 4)
        self.cls = tnn.Parameter(torch.randn(1, 1, 6))
        self.pos = tnn.Parameter(torch.randn(1, 17, 6) * 0.5)
        self.norm, self.head = tnn.LayerNorm(6), tnn.Linear(6, 4)

    def forward(self, x):
        t = self.patch(x).flatten(2).transpose(1, 2)
        t = torch.cat([self.cls.expand(x.shape[0], -1, -1), t], dim=1) + self.pos
        return self.head(self.norm(t)[:, 0])


class Decoder(tnn.Module):
    """ConvTranspose, constant Pad, Split by sizes, Squeeze/Unsqueeze and a ReduceMax."""

    def __init__(self):
        super().__init__()
        self.up = tnn.ConvTranspose2d(3, 6, 2, stride=2)
        self.conv = tnn.Conv2d(2, 4, 3)

    def forward(self, x):
        y = tnn.functional.pad(self.up(x), (1, 1, 1, 1), value=0.5)
        a, b = y.split([2, 4], dim=1)
        m = b.amax(1, keepdim=True).squeeze(1).unsqueeze(1)
        return torch.relu(self.conv(a)) + m[:, :, 1:-1, 1:-1]


class SharedConv(tnn.Module):
    """One convolution applied twice (its weight shared): one layer, trained as one."""

    def __init__(self):
        super().__init__()
        self.conv = tnn.Conv2d(3, 3, 3, padding=1)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        return self.conv(y) + x


class Attention(tnn.Module):
    """torch's MultiheadAttention as its exporter writes it (the heads split by shapes computed with
    Shape, Gather, Div, Mod, Sqrt; MatMul of two values, Softmax), then a class-token read."""

    def __init__(self):
        super().__init__()
        self.attn = tnn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x):
        y, _ = self.attn(x, x, x, need_weights=False)
        return (y + x)[:, 0]


CASES = {  # name -> (torch module, input shape)
    "basic_block": (BasicBlock, (2, 3, 16, 16)),
    "squeeze_excite": (SqueezeExcite, (2, 3, 16, 16)),
    "dense_block": (DenseBlock, (2, 3, 16, 16)),
    "shuffle_unit": (ShuffleUnit, (2, 3, 16, 16)),
    "mlp": (Mlp, (2, 3, 2, 2)),
    "hard_activations": (HardActivations, (2, 3, 16, 16)),
    "token_mixer": (TokenMixer, (2, 5, 6)),
    "patch_embed": (PatchEmbed, (2, 3, 16, 16)),
    "decoder": (Decoder, (2, 3, 6, 6)),
    "shared_conv": (SharedConv, (2, 3, 8, 8)),
    "attention": (Attention, (2, 5, 8)),
}


def export(tm, shape, path, opset, fold=True):
    x = torch.zeros(shape)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            torch.onnx.export(tm, (x,), str(path), dynamo=False, opset_version=opset, do_constant_folding=fold,
                              input_names=["input"], output_names=["output"], dynamic_axes={"input": {0: "n"}})
        except Exception as e:  # an exporter that needs a network or extra packages here
            pytest.skip(f"torch.onnx.export does not work here: {e}")
    return path


def as_graph(path):
    """The GraphModule of the DAG path, even for a graph the chain importer takes."""
    m, opset = oi._read_model(path)
    g = oi._Graph(m, opset, os.path.dirname(os.path.abspath(path)))
    shape, dynamic = oi._shape_of(m.graph.input[0])
    return onnx_graph.import_graph(g, m.graph.input[0].name, m.graph.output[0].name, shape, dynamic)


def onnxruntime(path, x):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]


def run(queue, model, x):
    with netcl.no_grad():
        return model(netcl.tensor(x, queue=queue)).numpy()


def close(got, want, rtol=1e-5):
    err = float(np.abs(got.astype(np.float64) - want).max())
    assert err <= rtol * max(1.0, float(np.abs(want).max())), f"max abs error {err:.3g}"


def built(name, opset, tmp_path, fold=True):
    torch.manual_seed(0)
    make, shape = CASES[name]
    tm = make().eval()
    return tm, shape, export(tm, shape, tmp_path / f"{name}{opset}.onnx", opset, fold)


# -- forward, save/load, export ------------------------------------------------------------------------
@pytest.mark.parametrize("opset", [9, 10, 11, 13, 17, 18])
@pytest.mark.parametrize("name", sorted(CASES))
def test_agrees_with_onnxruntime_and_torch(queue, rng, tmp_path, name, opset):
    if name == "attention" and opset < 14:
        pytest.skip("torch exports scaled_dot_product_attention from opset 14 on")
    tm, shape, path = built(name, opset, tmp_path)
    model = import_onnx(path)
    assert isinstance(model, (nn.GraphModule, nn.Sequential)) and not model.training
    free = not isinstance(model, nn.GraphModule) or model.graph[0]["out"][0][0] == "N"
    assert free == (name != "attention")  # (torch's attention moves the batch off dimension 0)
    x = rng.standard_normal((3 if free else 2,) + shape[1:]).astype(np.float32)  # (3: not the traced batch)
    with torch.no_grad():
        want = tm.double()(torch.from_numpy(x).double()).numpy()
    close(onnxruntime(path, x), want)  # (the reference itself)
    close(run(queue, model, x), want)
    gm = model if isinstance(model, nn.GraphModule) else as_graph(path)
    close(run(queue, gm, x), want)


@pytest.mark.parametrize("name", sorted(CASES))
def test_saves_loads_and_exports(queue, rng, tmp_path, name):
    tm, shape, path = built(name, 17, tmp_path)
    gm = as_graph(path)
    x = rng.standard_normal(shape).astype(np.float32)
    want = run(queue, gm, x)
    save(gm, tmp_path / "m.netcl")
    loaded = load(tmp_path / "m.netcl")
    assert isinstance(loaded, nn.GraphModule) and list(loaded.state_dict()) == list(gm.state_dict())
    close(run(queue, loaded, x), want)
    export_onnx(loaded, shape, tmp_path / "again.onnx", dynamic_batch=True)
    close(onnxruntime(tmp_path / "again.onnx", x), want)
    close(run(queue, import_onnx(tmp_path / "again.onnx"), x), want)  # (and netcl's own export imports back)


@pytest.mark.parametrize("name", sorted(CASES))
def test_trains(queue, rng, tmp_path, name):
    tm, shape, path = built(name, 17 if name == "attention" else 13, tmp_path)
    gm = as_graph(path).train()
    x = rng.standard_normal(shape).astype(np.float32)
    target = netcl.tensor(run(queue, gm, x) + rng.standard_normal(gm.output_shape(shape)).astype(np.float32),
                          queue=queue)
    opt = optim.SGD(gm.parameters(), lr=0.02)
    losses = []
    for _ in range(5):
        loss = F.mse_loss(gm(netcl.tensor(x, queue=queue)), target)
        losses.append(float(loss.item()))
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert all(p.grad is not None for p in gm.parameters())
    assert losses[-1] < losses[0], losses


def test_batchnorm_nodes_and_the_chain_importer(queue, rng, tmp_path):
    """Without constant folding torch keeps BatchNormalization nodes; the residual block is a chain of
    blocks the chain importer takes (a Sequential), the DAG path gives the same values."""
    tm, shape, path = built("basic_block", 17, tmp_path, fold=False)
    assert any(n.op_type == "BatchNormalization" for n in onnx.load(str(path)).graph.node)
    x = rng.standard_normal(shape).astype(np.float32)
    with torch.no_grad():
        want = tm.double()(torch.from_numpy(x).double()).numpy()
    gm = as_graph(path)
    close(run(queue, gm, x), want)
    assert {"conv1.weight", "bn1.running_var", "down.0.weight", "down.1.bias", "fc.weight"} <= set(gm.state_dict())


def test_a_shared_weight_is_one_layer(tmp_path):
    _, _, path = built("shared_conv", 17, tmp_path)
    gm = as_graph(path)
    assert list(gm.state_dict()) == ["conv.weight", "conv.bias"]
    assert [n.get("target") for n in gm.graph if n["op"] == "call"] == ["conv", "Relu", "conv"]


def test_state_dict_keys_follow_the_initializers(tmp_path):
    _, _, path = built("mlp", 17, tmp_path)
    keys = list(as_graph(path).state_dict())
    assert {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"} <= set(keys)


# -- hand-written graphs: layouts and refusals --------------------------------------------------------------
def save_graph(nodes, inits, in_shape, out_shape, path, opset=17):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("input", TensorProto.FLOAT, in_shape)],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, out_shape)],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8), str(path))
    return path


@pytest.mark.parametrize("n_out", [4, 5], ids=["square", "non_square"])
def test_gemm_and_matmul_layouts(queue, rng, tmp_path, n_out):
    """Gemm transB=0 and 1 and MatMul with a constant on either side, x used twice (not a chain)."""
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    inits = {"b0": f32(4, n_out), "b1": f32(n_out, 4), "c": f32(n_out), "m": f32(4, n_out), "left": f32(3, 3)}
    nodes = [helper.make_node("Gemm", ["input", "b0", "c"], ["g0"], transB=0, name="gemm0"),
             helper.make_node("Gemm", ["input", "b1", "c"], ["g1"], transB=1, alpha=1.0, name="gemm1"),
             helper.make_node("MatMul", ["input", "m"], ["mm"], name="matmul"),
             helper.make_node("Add", ["g0", "g1"], ["s"], name="add"),
             helper.make_node("Mul", ["s", "mm"], ["p"], name="mul"),
             helper.make_node("MatMul", ["left", "p"], ["output"], name="left_matmul")]
    path = save_graph(nodes, inits, [3, 4], [3, n_out], tmp_path / "g.onnx")
    x = f32(3, 4)
    want = inits["left"].astype(np.float64) @ ((x @ inits["b0"] + inits["c"] + x @ inits["b1"].T + inits["c"])
                                               * (x @ inits["m"]))
    gm = import_onnx(path)
    assert isinstance(gm, nn.GraphModule)
    close(onnxruntime(path, x), want)
    close(run(queue, gm, x), want)


def test_unsupported_ops_named_once_with_counts(tmp_path):
    nodes = [helper.make_node("Erf", ["input"], ["a"], name="erf_1"),
             helper.make_node("Erf", ["a"], ["b"], name="erf_2"),
             helper.make_node("Mul", ["a", "b"], ["c"], name="mul"),
             helper.make_node("MyOp", ["c"], ["d"], domain="com.example", name="custom"),
             helper.make_node("Erf", ["d"], ["e"], name="erf_3"),
             helper.make_node("NonZero", ["e"], ["output"], name="nz")]
    path = save_graph(nodes, {}, [2, 3], [2, 3], tmp_path / "m.onnx")
    with pytest.raises(NotImplementedError) as e:
        import_onnx(path)
    text = str(e.value)
    assert "  Erf (node 'erf_1'): 3 nodes\n" in text and "  com.example.MyOp (node 'custom'): 1 node\n" in text
    assert "  NonZero (node 'nz'): 1 node\n" in text and "supported ops: " in text
    assert text.count("Erf (node") == 1 and "Mul (node" not in text


def test_symbolic_batch_stays_free(queue, rng, tmp_path):
    """A graph traced at the example batch runs at any batch: shape subgraphs give the batch back."""
    _, shape, path = built("shuffle_unit", 13, tmp_path)
    gm = import_onnx(path)
    assert gm.graph[0]["out"][0][0] == "N"
    for n in (1, 4):
        x = rng.standard_normal((n,) + shape[1:]).astype(np.float32)
        close(run(queue, gm, x), onnxruntime(path, x))


def test_gelu_written_the_other_way(queue, rng, tmp_path):
    """(x * 0.5) * (1 + erf(x * (1 / sqrt 2))) is GELU too: one F.gelu in the graph, no Erf left."""
    half, one, inv = (np.array(v, np.float32) for v in (0.5, 1.0, 2 ** -0.5))
    nodes = [helper.make_node("Mul", ["input", "inv"], ["d"], name="scale"),
             helper.make_node("Erf", ["d"], ["e"], name="erf"),
             helper.make_node("Add", ["one", "e"], ["a"], name="add"),
             helper.make_node("Mul", ["input", "half"], ["h"], name="half"),
             helper.make_node("Mul", ["h", "a"], ["g"], name="mul"),
             helper.make_node("Add", ["g", "input"], ["output"], name="residual")]
    path = save_graph(nodes, {"half": half, "one": one, "inv": inv}, ["n", 7], ["n", 7], tmp_path / "g.onnx")
    gm = import_onnx(path)
    assert [n["op"] for n in gm.graph] == ["input", "F.gelu", "add", "output"]
    x = rng.standard_normal((3, 7)).astype(np.float32) * 2
    from math import erf
    want = np.vectorize(lambda v: v * 0.5 * (1 + erf(v / 2 ** 0.5)))(x.astype(np.float64)) + x
    close(onnxruntime(path, x), want)
    close(run(queue, gm, x), want)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_opset_20_gelu_node(queue, rng, tmp_path, approximate):
    """Opset 20's Gelu node (torch.onnx writes it from opset 20 on): a GELU layer with its
    approximation, in a graph (a residual) and in a chain."""
    class Net(tnn.Module):
        def __init__(self, residual):
            super().__init__()
            self.a, self.b = tnn.Linear(6, 6), tnn.Linear(6, 3)
            self.gelu, self.residual = tnn.GELU(approximate=approximate), residual

        def forward(self, x):
            h = self.gelu(self.a(x))
            return self.b(h + x if self.residual else h)

    x = rng.standard_normal((4, 6)).astype(np.float32) * 2
    for residual in (True, False):
        torch.manual_seed(0)
        tm = Net(residual).eval()
        path = export(tm, (2, 6), tmp_path / f"gelu{residual}.onnx", 20, False)
        model = import_onnx(path)
        gelus = [m for m in model.modules() if isinstance(m, nn.GELU)]
        assert len(gelus) == 1 and gelus[0].approximate == approximate
        with torch.no_grad():
            want = tm.double()(torch.from_numpy(x).double()).numpy()
        close(onnxruntime(path, x), want)
        close(run(queue, model, x), want)


def test_a_batch_off_the_first_dimension_is_fixed(queue, rng, tmp_path):
    """torch's MultiheadAttention reshapes to (L, N * heads, d): the graph keeps the traced batch and
    refuses another one where it comes in."""
    _, shape, path = built("attention", 17, tmp_path)
    gm = import_onnx(path)
    assert gm.graph[0]["out"][0] == list(shape)
    with pytest.raises(ValueError, match="traced for input"):
        run(queue, gm, np.zeros((3,) + shape[1:], np.float32))


def test_more_elementwise_ops(queue, rng, tmp_path):
    """Sum, PRelu (a learnt slope per channel), Elu, Softplus (large inputs too), LogSoftmax, ReduceMin."""
    slope = rng.uniform(0.05, 0.5, (3, 1, 1)).astype(np.float32)
    nodes = [helper.make_node("PRelu", ["input", "slope"], ["p"], name="prelu"),
             helper.make_node("Elu", ["input"], ["e"], alpha=0.7, name="elu"),
             helper.make_node("Softplus", ["input"], ["s"], name="softplus"),
             helper.make_node("Sum", ["p", "e", "s"], ["t"], name="sum"),
             helper.make_node("ReduceMin", ["t"], ["r"], axes=[1], keepdims=1, name="rmin"),
             helper.make_node("Sub", ["t", "r"], ["d"], name="sub"),
             helper.make_node("LogSoftmax", ["d"], ["output"], axis=-1, name="lsm")]
    path = save_graph(nodes, {"slope": slope}, ["n", 3, 4, 5], ["n", 3, 4, 5], tmp_path / "g.onnx", opset=17)
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32) * 3
    x[0, 0, 0, :2] = (60.0, -60.0)  # (softplus of a large value must not overflow)
    xd = x.astype(np.float64)
    t = np.where(xd > 0, xd, slope * xd) + np.where(xd > 0, xd, 0.7 * np.expm1(xd)) + np.logaddexp(0, xd)
    d = t - t.min(1, keepdims=True)
    want = d - np.log(np.exp(d - d.max(-1, keepdims=True)).sum(-1, keepdims=True)) - d.max(-1, keepdims=True)
    close(onnxruntime(path, x), want)
    gm = import_onnx(path)
    close(run(queue, gm, x), want)
    assert "slope" in gm.state_dict()


def test_padding_netcl_convolutions_do_not_take(queue, rng, tmp_path):
    """Conv with pads on one side only, and auto_pad SAME_UPPER / SAME_LOWER with a stride, MaxPool
    padded on one side: a Pad in front of the layer; onnxruntime is the reference."""
    w1, w2, w3 = (rng.standard_normal(s).astype(np.float32) for s in ((4, 3, 3, 3), (4, 4, 2, 2), (5, 4, 3, 3)))
    nodes = [helper.make_node("Conv", ["input", "w1"], ["a"], pads=[0, 0, 1, 1], name="one_side"),
             helper.make_node("Conv", ["a", "w2"], ["b"], auto_pad="SAME_UPPER", strides=[2, 2], name="same_upper"),
             helper.make_node("Conv", ["b", "w3"], ["c"], auto_pad="SAME_LOWER", name="same_lower"),
             helper.make_node("Sub", ["c", "ten"], ["r"], name="negative"),
             helper.make_node("MaxPool", ["r"], ["output"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 0, 0],
                              name="pool")]  # (padded by -inf: the negative values next to the padding win)
    path = save_graph(nodes, {"w1": w1, "w2": w2, "w3": w3, "ten": np.array(100.0, np.float32)}, ["n", 3, 7, 7],
                      ["n", 5, 2, 2], tmp_path / "g.onnx")
    x = rng.standard_normal((2, 3, 7, 7)).astype(np.float32)
    want = onnxruntime(path, x).astype(np.float64)
    gm = import_onnx(path)
    assert isinstance(gm, nn.GraphModule)
    close(run(queue, gm, x), want)
