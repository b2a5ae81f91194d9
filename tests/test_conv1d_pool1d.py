"""Conv1d, MaxPool1d and AvgPool1d: forward and backward against float64 PyTorch over a grid of
settings, a keyword-spotting model training against PyTorch step for step, .netcl round trips, ONNX
export checked by onnxruntime (opsets 13 and 17), the import back (netcl's record and the bare graph,
torch.onnx's graph), from_torch, eval()/predict in a Sequential."""
import itertools
import warnings

import numpy as np
import pytest
from conftest import assert_close, replays_as_the_loop, torch_state, train_beside_torch

import netcl
from netcl import Tensor, nn
from netcl.io import export_onnx, import_onnx
from test_embedding_bn1d_activations import check_eval_paths, check_save_load, rand, run_ort, strip_metadata


def copy_to_torch(torch, layer, ref):
    ref.load_state_dict({k: torch.tensor(v, dtype=torch.float64) for k, v in layer.state_dict().items()}, strict=False)
    return ref


def against_torch(torch, rng, layer, ref, shape, what):
    """Forward, dx and every parameter gradient of `layer` against float64 `ref` on an input of `shape`."""
    x = rand(rng, *shape)
    xt = netcl.tensor(x, requires_grad=True)
    y = layer(xt)
    rx = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    ry = ref(rx)
    assert y.shape == tuple(ry.shape), what
    dy = rand(rng, *y.shape)
    y.backward(netcl.tensor(dy))
    ry.backward(torch.tensor(dy, dtype=torch.float64))
    assert_close(y.numpy(), ry.detach().numpy(), 1e-5, atol=1e-6, what=f"{what} forward")
    assert_close(xt.grad.numpy(), rx.grad.numpy(), 1e-5, atol=1e-6, what=f"{what} dx")
    for (k, p), (rk, rp) in zip(layer.named_parameters(), ref.named_parameters()):
        assert k == rk
        assert_close(p.grad.numpy(), rp.grad.numpy(), 1e-5, atol=1e-6, what=f"{what} d{k}")


# -- Conv1d -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("groups", ["1", "2", "depthwise"])
def test_conv1d_vs_torch_over_a_grid(queue, rng, torch, k, groups):
    c, out = (4, 6) if groups != "depthwise" else (4, 8)
    g = {"1": 1, "2": 2, "depthwise": 4}[groups]
    checked = 0
    for stride, padding, dilation, bias, length in itertools.product((1, 2), (0, 1, 2), (1, 2), (True, False), (9, 12)):
        if length + 2 * padding < dilation * (k - 1) + 1:
            continue
        args = dict(stride=stride, padding=padding, dilation=dilation, groups=g, bias=bias)
        layer = nn.Conv1d(c, out, k, **args)
        ref = copy_to_torch(torch, layer, torch.nn.Conv1d(c, out, k, **args).double())
        against_torch(torch, rng, layer, ref, (3, c, length), f"k={k} {args} L={length}")
        checked += 1
    assert checked >= 40


@pytest.mark.parametrize("args", [dict(kernel_size=3, stride=2, padding=1, dilation=2, groups=2),
                                  dict(kernel_size=1), dict(kernel_size=5, padding=2, bias=False)], ids=str)
@pytest.mark.parametrize("config", ["native", "gpu"])
def test_conv1d_routes_agree(queue, rng, torch, monkeypatch, args, config):
    """The direct kernels (depthwise convs' route) and the GEMM route (the rest) give torch's numbers
    for the same non-depthwise conv: each route forced in turn, on this device's GEMM kernels and on
    the GPU class's (gemm_tile, forced on whatever device runs the tests)."""
    from netcl import ops

    if config == "gpu":
        monkeypatch.setattr(ops, "_config_class", {queue.device.int_ptr: "gpu"})
    for direct in (True, False):
        monkeypatch.setattr(nn.Conv1d, "_direct", lambda self: direct)
        layer = nn.Conv1d(4, 6, **args)
        ref = copy_to_torch(torch, layer, torch.nn.Conv1d(4, 6, **args).double())
        against_torch(torch, rng, layer, ref, (3, 4, 13), f"direct={direct} {args}")


@pytest.mark.parametrize("k, dilation, length", [(3, 1, 7), (4, 1, 8), (4, 2, 9), (2, 3, 5), (1, 1, 4)])
def test_conv1d_padding_same_and_valid_as_torch(queue, rng, torch, k, dilation, length):
    for padding in ("same", "valid"):
        layer = nn.Conv1d(3, 5, k, padding=padding, dilation=dilation)
        ref = copy_to_torch(torch, layer, torch.nn.Conv1d(3, 5, k, padding=padding, dilation=dilation).double())
        with warnings.catch_warnings():  # (torch warns of a padded copy for even kernels)
            warnings.simplefilter("ignore")
            against_torch(torch, rng, layer, ref, (2, 3, length), f"padding={padding!r} k={k} d={dilation}")


def test_conv1d_gradients_accumulate_and_are_deterministic(queue, rng):
    layer = nn.Conv1d(4, 6, 3, padding=1, groups=2)
    x, dy = netcl.tensor(rand(rng, 5, 4, 20)), netcl.tensor(rand(rng, 5, 6, 20))
    layer(x).backward(dy)
    once = [p.grad.numpy().copy() for p in layer.parameters()]
    layer(x).backward(dy)
    for p, g in zip(layer.parameters(), once):
        assert_close(p.grad.numpy(), 2 * g, 1e-6, what="accumulated")
    layer.zero_grad()
    layer(x).backward(dy)
    for p, g in zip(layer.parameters(), once):
        np.testing.assert_array_equal(p.grad.numpy(), g)


def test_conv1d_arguments_are_checked(queue):
    with pytest.raises(ValueError, match="divisible"):
        nn.Conv1d(4, 6, 3, groups=4)
    with pytest.raises(ValueError, match="stride 1"):
        nn.Conv1d(4, 6, 3, stride=2, padding="same")
    with pytest.raises(ValueError, match="padding"):
        nn.Conv1d(4, 6, 3, padding="full")
    with pytest.raises(ValueError, match="1-tuple"):
        nn.Conv1d(4, 6, (3, 3))
    with pytest.raises(ValueError, match="3-D input"):
        nn.Conv1d(4, 6, 3).output_shape((2, 4, 5, 5))
    with pytest.raises(ValueError, match="4 input channels"):
        nn.Conv1d(4, 6, 3).output_shape((2, 3, 5))
    with pytest.raises(ValueError, match="does not fit"):
        nn.Conv1d(4, 6, 5).output_shape((2, 4, 3))
    assert nn.Conv1d(2, 2, (3,), stride=(2,), padding=(1,)).config()["kernel_size"] == 3
    assert nn.Conv1d(2, 4, 3).tensor_shapes(2, 4, 3, groups=2) == {"weight": (4, 1, 3), "bias": (4,)}
    assert nn.Conv1d(4, 6, 3, padding=1, groups=2).macs((5, 4, 10)) == 5 * 6 * 10 * 2 * 3
    assert nn.Sequential(nn.Conv1d(4, 6, 3), nn.MaxPool1d(2)).macs((1, 4, 10)) == 6 * 8 * 4 * 3


# -- MaxPool1d, AvgPool1d ---------------------------------------------------------------------------
POOL_CASES = [(k, s, p, length) for k in (1, 2, 3, 4) for s in (None, 1, 2, 3) for p in range(k // 2 + 1)
              for length in (7, 10)]


@pytest.mark.parametrize("kind", ["MaxPool1d", "AvgPool1d", "MaxPool1d_ceil"])
def test_pool1d_vs_torch_over_a_grid(queue, rng, torch, kind):
    name, ceil = kind.split("_")[0], kind.endswith("ceil")
    extra = {"ceil_mode": True} if ceil else {}
    for k, s, p, length in POOL_CASES:
        layer = getattr(nn, name)(k, s, p, **extra)
        ref = getattr(torch.nn, name)(k, s, p, **extra)
        against_torch(torch, rng, layer, ref, (2, 3, length), f"{kind} k={k} s={s} p={p} L={length}")


def test_maxpool1d_routes_ties_to_the_first_maximum(queue, torch):
    x = np.array([[[1, 3, 3, 2, 5, 5, 5, -1, -1]]], np.float32)
    layer, ref = nn.MaxPool1d(3, 2, 1), torch.nn.MaxPool1d(3, 2, 1)
    xt, rx = netcl.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    layer(xt).backward(netcl.tensor(np.arange(1, 6, dtype=np.float32).reshape(1, 1, 5)))
    ref(rx).backward(torch.arange(1, 6, dtype=torch.float32).reshape(1, 1, 5))
    np.testing.assert_array_equal(xt.grad.numpy(), rx.grad.numpy())


def test_pool1d_arguments_are_checked():
    with pytest.raises(ValueError):
        nn.MaxPool1d(3, padding=2)  # (more than half the window, as PyTorch refuses)
    with pytest.raises(ValueError, match="3-D input"):
        nn.AvgPool1d(2).output_shape((2, 3, 4, 4))
    with pytest.raises(ValueError, match="does not fit"):
        nn.MaxPool1d(5).output_shape((2, 3, 4))
    with pytest.raises(TypeError):
        nn.MaxPool1d(2, ceil_mode=1)
    assert nn.AvgPool1d((3,), (2,)).config() == {"kernel_size": 3, "stride": 2, "padding": 0}


# -- a keyword-spotting model -----------------------------------------------------------------------
def kws(torch_nn):
    """(N, 8, 40) features -> (N, 5) logits, in netcl's or torch's layers (same names)."""
    t = torch_nn
    return t.Sequential(t.Conv1d(8, 16, 5, stride=2, padding=2), t.BatchNorm1d(16), t.ReLU(), t.MaxPool1d(2),
                        t.Conv1d(16, 16, 3, padding=1, groups=16, bias=False), t.Conv1d(16, 24, 1), t.BatchNorm1d(24),
                        t.ReLU(), t.AvgPool1d(3, 1, 1), t.Conv1d(24, 24, 3, padding=2, dilation=2), t.ReLU(),
                        t.AdaptiveAvgPool1d(1), t.Flatten(), t.Linear(24, 5))



def test_keyword_spotting_model_trains_as_torch_step_for_step(queue, rng, torch):
    netcl.manual_seed(7)
    model = kws(nn)
    ref = kws(torch.nn).double()
    ref.load_state_dict(torch_state(torch, model), strict=False)
    x = rand(rng, 64, 8, 40)
    y = (x[:, :2, :10].mean((1, 2)) > 0).astype(np.int64) + 2 * (x[:, 3, 20:].mean(1) > 0).astype(np.int64)
    losses = train_beside_torch(torch, queue, model, ref, x, y, steps=32, batch=16, lr=0.1)
    assert np.mean(losses[-4:]) < 0.7 * np.mean(losses[:4])


def trained_looking_kws(rng):
    model = kws(nn).eval()
    sd = model.state_dict()
    for k in sd:
        if k.endswith("running_mean"):
            sd[k] = rand(rng, *sd[k].shape)
        elif k.endswith("running_var"):
            sd[k] = rng.uniform(0.5, 2.0, sd[k].shape).astype(np.float32)
    return model.load_state_dict(sd)


KWS_TYPES = ["Conv1d", "BatchNorm1d", "ReLU", "MaxPool1d", "Conv1d", "Conv1d", "BatchNorm1d", "ReLU", "AvgPool1d",
             "Conv1d", "ReLU", "AdaptiveAvgPool1d", "Flatten", "Linear"]


@pytest.mark.parametrize("opset", [13, 17])
def test_keyword_spotting_model_saves_exports_and_imports(queue, rng, torch, ort, tmp_path, opset):
    model = trained_looking_kws(rng)
    x = rand(rng, 3, 8, 40)
    check_eval_paths(queue, model, x)
    check_save_load(queue, model, x, tmp_path)
    want = model(Tensor.from_host(queue, x)).to_host()
    path = tmp_path / "m.onnx"
    export_onnx(model, x.shape, path, opset=opset, dynamic_batch=True)
    np.testing.assert_allclose(run_ort(path, x), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(run_ort(path, x[:1]), want[:1], rtol=1e-5, atol=1e-5)
    back = import_onnx(path)  # netcl's record of the layers
    assert repr(back) == repr(model)
    np.testing.assert_array_equal(back(Tensor.from_host(queue, x)).to_host(), want)
    strip_metadata(path, tmp_path / "bare.onnx")  # the nodes alone
    bare = import_onnx(tmp_path / "bare.onnx")
    assert [type(m).__name__ for _, m in bare.chain()] == KWS_TYPES
    np.testing.assert_allclose(bare(Tensor.from_host(queue, x)).to_host(), want, rtol=1e-6, atol=1e-6)
    ref = kws(torch.nn).double().eval()  # and the torch model with the same weights gives the same
    ref.load_state_dict(torch_state(torch, model), strict=False)
    np.testing.assert_allclose(want, ref(torch.tensor(x, dtype=torch.float64)).detach().numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layer", [nn.Conv1d(3, 4, 4, padding="same"), nn.Conv1d(3, 4, 3, padding="same", dilation=3),
                                   nn.Conv1d(3, 6, 2, stride=2, groups=3), nn.MaxPool1d(3, 2, 1, ceil_mode=True),
                                   nn.AvgPool1d(4, 3, 2)], ids=repr)
def test_single_1d_layers_export_and_import_back(queue, rng, ort, tmp_path, layer):
    model = nn.Sequential(layer).eval()
    x = rand(rng, 2, 3, 11)
    want = model(Tensor.from_host(queue, x)).to_host()
    export_onnx(model, x.shape, tmp_path / "m.onnx", opset=13)
    np.testing.assert_allclose(run_ort(tmp_path / "m.onnx", x), want, rtol=1e-5, atol=1e-6)
    strip_metadata(tmp_path / "m.onnx", tmp_path / "bare.onnx")
    bare = import_onnx(tmp_path / "bare.onnx")
    if isinstance(layer, nn.Conv1d):  # padding="same" comes back as "same" where its sides differ, else as the int
        assert type(bare[0]) is nn.Conv1d and bare[0].pads() == layer.pads()
        assert {k: v for k, v in bare[0].config().items() if k != "padding"} == \
            {k: v for k, v in layer.config().items() if k != "padding"}
    else:
        assert repr(bare) == repr(model)
    np.testing.assert_allclose(bare(Tensor.from_host(queue, x)).to_host(), want, rtol=1e-6, atol=1e-6)


def test_keyword_spotting_model_from_torch(queue, rng, torch):
    ref = kws(torch.nn).eval()
    with torch.no_grad():
        for m in ref.modules():
            if isinstance(m, torch.nn.BatchNorm1d):
                m.running_mean.normal_()
                m.running_var.uniform_(0.5, 2.0)
    model = nn.from_torch(ref)
    assert [type(m).__name__ for m in model] == KWS_TYPES
    x = rand(rng, 4, 8, 40)
    np.testing.assert_allclose(model.eval().predict(x, queue), ref(torch.tensor(x)).detach().numpy(), rtol=1e-5,
                               atol=1e-5)
    same = nn.from_torch(torch.nn.Sequential(torch.nn.Conv1d(2, 3, 4, padding="same")))
    assert same[0].padding == "same"
    with pytest.raises(NotImplementedError, match="padding_mode"):
        nn.from_torch(torch.nn.Sequential(torch.nn.Conv1d(2, 3, 3, padding_mode="reflect")))
    with pytest.raises(NotImplementedError, match="count_include_pad"):
        nn.from_torch(torch.nn.Sequential(torch.nn.AvgPool1d(3, padding=1, count_include_pad=False)))


@pytest.mark.parametrize("opset", [13, 17])
def test_torch_onnx_export_of_a_keyword_spotter_imports(queue, rng, torch, tmp_path, opset):
    """A graph torch.onnx wrote (BatchNorm and Conv as it writes them, padding="same" as explicit pads):
    its nodes come back as a model that agrees with torch."""
    t = torch.nn
    ref = t.Sequential(t.Conv1d(8, 12, 4, padding="same"), t.BatchNorm1d(12), t.ReLU(), t.MaxPool1d(2),
                       t.Conv1d(12, 12, 3, groups=4), t.AvgPool1d(2), t.AdaptiveAvgPool1d(1), t.Flatten(),
                       t.Linear(12, 3)).eval()
    x = rand(rng, 2, 8, 30)
    try:
        torch.onnx.export(ref, (torch.tensor(x),), str(tmp_path / "t.onnx"), dynamo=False, opset_version=opset,
                          input_names=["input"], output_names=["output"])
    except Exception as e:  # (as test_onnx_import_graph: an export torch cannot make here)
        pytest.skip(f"torch.onnx.export does not work here: {e}")
    model = import_onnx(tmp_path / "t.onnx")
    assert sum(isinstance(m, nn.Conv1d) for m in model.modules()) == 2
    np.testing.assert_allclose(model(netcl.tensor(x, queue=queue)).numpy(), ref(torch.tensor(x)).detach().numpy(),
                               rtol=1e-5, atol=1e-5)


def test_trainstep_replays_the_1d_layers(queue, rng):
    """TrainStep records a step of the keyword spotter and replays it: the same losses and weights as
    the layer calls (conftest.loop_step)."""
    def make():
        netcl.manual_seed(4)
        return kws(nn).to(queue).train()

    def batch():
        x = Tensor.from_host(queue, rand(rng, 8, 8, 40))
        y = rng.integers(0, 5, 8)
        return x, y

    replays_as_the_loop(make, (batch() for _ in range(5)))


def test_a_1d_graph_with_uneven_pads_imports_as_onnxruntime_runs_it(queue, rng, ort, tmp_path):
    """A residual 1-D graph written by hand (not a chain: netcl.io.onnx_graph): Conv with pads [0, 2] and
    with auto_pad SAME_UPPER (a Pad in front of the Conv1d), MaxPool with pads [1, 0], AveragePool, Add."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    w1, b1, w2 = rand(rng, 4, 4, 3), rand(rng, 4), rand(rng, 4, 2, 4)
    nodes = [helper.make_node("Conv", ["input", "w1", "b1"], ["a"], kernel_shape=[3], pads=[0, 2], name="conv_a"),
             helper.make_node("Conv", ["a", "w2"], ["b"], kernel_shape=[4], auto_pad="SAME_UPPER", group=2,
                              name="conv_b"),
             helper.make_node("Relu", ["b"], ["c"], name="relu"),
             helper.make_node("MaxPool", ["c"], ["d"], kernel_shape=[2], strides=[1], pads=[1, 0], name="pool"),
             helper.make_node("AveragePool", ["a"], ["e"], kernel_shape=[3], strides=[1], pads=[1, 1],
                              count_include_pad=1, name="avg"),
             helper.make_node("Add", ["d", "e"], ["output"], name="add")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [2, 4, 10])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, [2, 4, 10])],
                              [numpy_helper.from_array(v, k) for k, v in (("w1", w1), ("b1", b1), ("w2", w2))])
    path = tmp_path / "g.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), str(path))
    x = rand(rng, 2, 4, 10)
    model = import_onnx(path)
    assert sum(isinstance(m, nn.Conv1d) for m in model.modules()) == 2
    assert any(isinstance(m, nn.MaxPool1d) for m in model.modules())
    np.testing.assert_allclose(model(netcl.tensor(x, queue=queue)).numpy(), run_ort(path, x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("make", [lambda m: m.MaxPool1d(3, 2, 1), lambda m: m.AvgPool1d(2),
                                  lambda m: m.MaxPool1d(2, ceil_mode=True)], ids=["max", "avg", "max_ceil"])
def test_pool1d_nan_and_inf_propagate_like_torch(queue, rng, torch, make):
    x = rand(rng, 2, 3, 11)
    x[0, 0, [1, 4]] = np.nan
    x[0, 1, 5], x[1, 2, [0, 7]] = np.inf, (-np.inf, np.nan)
    got = make(nn)(Tensor.from_host(queue, x)).to_host()
    want = make(torch.nn)(torch.from_numpy(x)).numpy()
    np.testing.assert_array_equal(got, want)


def res_block(lib):
    """A residual 1-D block as a Module subclass (not a Sequential) of `lib` (netcl.nn or torch.nn)."""
    class ResBlock1d(lib.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.bn = lib.Conv1d(4, 4, 3, padding=1, bias=False), lib.BatchNorm1d(4)
            self.conv2, self.pool = lib.Conv1d(4, 4, 4, padding="same", groups=2), lib.MaxPool1d(2)
            self.head = lib.Linear(4 * 6, 3)

        def forward(self, x):  # x: (N, 4, 12)
            h = self.conv2(self.bn(self.conv1(x)).relu())
            return self.head(self.pool(h + x).flatten(1))
    return ResBlock1d()


def test_a_module_of_1d_layers_traces_saves_exports_and_has_torch_gradients(queue, rng, torch, ort, tmp_path):
    from netcl.io import load, save

    netcl.manual_seed(3)
    model = res_block(nn).to(queue)
    ref = res_block(torch.nn).double()
    ref.load_state_dict(torch_state(torch, model), strict=False)
    x = rand(rng, 5, 4, 12)
    xt = netcl.tensor(x, queue=queue, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rx = torch.tensor(x, dtype=torch.float64, requires_grad=True)
        ry = ref(rx)
    y = model(xt)
    assert_close(y.numpy(), ry.detach().numpy(), 1e-5, atol=1e-6, what="forward")
    y.sum().backward()
    ry.sum().backward()
    assert_close(xt.grad.numpy(), rx.grad.numpy(), 1e-5, atol=1e-6, what="dx")
    for k, p in model.named_parameters():
        want = dict(ref.named_parameters())[k].grad.numpy()
        assert_close(p.grad.numpy(), want.T if k == "head.weight" else want, 1e-5, atol=1e-6, what=f"d{k}")
    model.eval()
    with netcl.no_grad():
        want = model(netcl.tensor(x, queue=queue)).numpy()
        gm = netcl.trace(model, netcl.tensor(x, queue=queue))
        np.testing.assert_allclose(gm(netcl.tensor(x, queue=queue)).numpy(), want, rtol=1e-5, atol=1e-6)
    save(model, tmp_path / "m.netcl", example_input=x)
    loaded = load(tmp_path / "m.netcl").to(queue)
    with netcl.no_grad():
        np.testing.assert_allclose(loaded(netcl.tensor(x, queue=queue)).numpy(), want, rtol=1e-5, atol=1e-6)
    for opset in (13, 17):
        export_onnx(model, (1, 4, 12), tmp_path / "m.onnx", dynamic_batch=True, opset=opset)
        np.testing.assert_allclose(run_ort(tmp_path / "m.onnx", x), want, rtol=1e-5, atol=1e-5)


def test_functional_1d_pools_as_torch_and_in_a_traced_graph(queue, rng, torch, ort, tmp_path):
    import netcl.nn.functional as F

    x = rand(rng, 2, 3, 11)
    for name, args in (("max_pool1d", (3, 2, 1)), ("avg_pool1d", (2,)), ("max_pool1d", (2, None, 0, 1, True))):
        xt, rx = netcl.tensor(x, queue=queue, requires_grad=True), torch.tensor(x, dtype=torch.float64,
                                                                                 requires_grad=True)
        y, ry = getattr(F, name)(xt, *args), getattr(torch.nn.functional, name)(rx, *args)
        y.sum().backward()
        ry.sum().backward()
        assert_close(y.numpy(), ry.detach().numpy(), 1e-6, what=name)
        assert_close(xt.grad.numpy(), rx.grad.numpy(), 1e-6, what=f"{name} dx")
    with pytest.raises(NotImplementedError, match="count_include_pad"):
        F.avg_pool1d(netcl.tensor(x), 3, padding=1, count_include_pad=False)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv1d(3, 4, 3, padding=1)

        def forward(self, x):  # (N, 3, 11) -> (N, 4, 2)
            return F.avg_pool1d(F.max_pool1d(F.relu(self.conv(x)), 3, 2, 1), 3)

    model = Net().to(queue).eval()
    with netcl.no_grad():
        want = model(netcl.tensor(x, queue=queue)).numpy()
        gm = netcl.trace(model, netcl.tensor(x, queue=queue))
        assert gm.lifted is not None and [type(m).__name__ for m in gm.lifted] == \
            ["Conv1d", "ReLU", "MaxPool1d", "AvgPool1d"]
        np.testing.assert_allclose(gm(netcl.tensor(x, queue=queue)).numpy(), want, rtol=1e-6, atol=1e-6)
    export_onnx(model, x.shape, tmp_path / "m.onnx")
    np.testing.assert_allclose(run_ort(tmp_path / "m.onnx", x), want, rtol=1e-5, atol=1e-6)
