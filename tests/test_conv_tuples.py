"""Conv2d, MaxPool2d and AvgPool2d with (height, width) pairs and padding="same"/"valid": forward and
every gradient against float64 PyTorch over a grid of non-square, asymmetric settings (the column
route, netcl.nn.conv_cols), a 2-D keyword-spotting model on (N, 1, F, T) trained beside torch step
for step, eval()/predict, TrainStep, .netcl files, ONNX export (onnx.checker, onnxruntime at opsets
13 and 17) and import back, from_torch; and the square, symmetric convs keeping their routes.
ConvTranspose2d's pairs, ConvTranspose1d and InstanceNorm1d likewise."""
import itertools
import warnings

import numpy as np
import pytest
from conftest import assert_close, replays_as_the_loop, torch_state, train_beside_torch

import netcl
from netcl import Tensor, models, nn
from netcl.io import export_onnx, import_onnx
from test_conv1d_pool1d import against_torch, copy_to_torch
from test_embedding_bn1d_activations import check_eval_paths, check_save_load, rand, run_ort, strip_metadata


def quiet(fn, *args):
    with warnings.catch_warnings():  # (torch warns of a padded copy for padding="same" of even kernels)
        warnings.simplefilter("ignore")
        return fn(*args)


# -- Conv2d -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kernel", [(1, 5), (3, 1), (2, 3)], ids=str)
@pytest.mark.parametrize("groups", [1, 2])
def test_conv2d_pairs_vs_torch_over_a_grid(queue, rng, torch, kernel, groups):
    checked = 0
    for stride, padding, dilation, bias in itertools.product((1, (1, 2), (2, 1)), (0, (0, 2), (1, 0), "same", "valid"),
                                                             (1, (1, 2)), (True, False)):
        if padding == "same" and stride != 1:
            continue
        args = dict(stride=stride, padding=padding, dilation=dilation, groups=groups, bias=bias)
        layer = nn.Conv2d(4, 6, kernel, **args)
        assert layer.general and layer.weight.shape == (6, 4 // groups) + kernel
        ref = copy_to_torch(torch, layer, torch.nn.Conv2d(4, 6, kernel, **args).double())
        quiet(against_torch, torch, rng, layer, ref, (2, 4, 7, 9), f"k={kernel} {args}")
        checked += 1
    assert checked == 52


@pytest.mark.parametrize("k, dilation", [(3, 1), (5, 2), (2, 1), (4, 1), (3, 2), ((2, 3), 1), ((4, 1), (1, 3))],
                         ids=str)
def test_conv2d_padding_same_as_torch_odd_and_even_kernels(queue, rng, torch, k, dilation):
    """"same" pads the extra row and column of an even kernel at the bottom and right (as PyTorch);
    an odd square kernel's "same" is its int padding and keeps the square routes."""
    layer = nn.Conv2d(3, 5, k, padding="same", dilation=dilation)
    ref = copy_to_torch(torch, layer, torch.nn.Conv2d(3, 5, k, padding="same", dilation=dilation).double())
    quiet(against_torch, torch, rng, layer, ref, (2, 3, 8, 10), f"same k={k} d={dilation}")
    assert layer.output_shape((2, 3, 8, 10)) == (2, 5, 8, 10)
    symmetric = isinstance(k, int) and dilation * (k - 1) % 2 == 0
    assert layer.general is not symmetric


@pytest.mark.parametrize("config", ["native", "gpu"])
def test_conv2d_pairs_on_both_device_classes(queue, rng, torch, monkeypatch, config):
    """The column route's GEMMs on this device's kernels and on the GPU class's (forced here)."""
    from netcl import ops

    if config == "gpu":
        monkeypatch.setattr(ops, "_config_class", {queue.device.int_ptr: "gpu"})
    for args in (dict(kernel_size=(3, 5), stride=(2, 1), padding=(1, 2)),
                 dict(kernel_size=(1, 3), padding="same", dilation=(1, 3), groups=3),
                 dict(kernel_size=(5, 1), stride=(1, 3), padding=(2, 0), groups=6)):
        layer = nn.Conv2d(6, 6, **args)
        ref = copy_to_torch(torch, layer, torch.nn.Conv2d(6, 6, **args).double())
        against_torch(torch, rng, layer, ref, (3, 6, 11, 13), f"{config} {args}")


def test_conv2d_pair_gradients_accumulate_and_are_deterministic(queue, rng):
    layer = nn.Conv2d(4, 6, (3, 2), padding=(1, 0), groups=2)
    x, dy = netcl.tensor(rand(rng, 3, 4, 9, 7)), netcl.tensor(rand(rng, 3, 6, 9, 6))
    layer(x).backward(dy)
    once = [p.grad.numpy().copy() for p in layer.parameters()]
    layer(x).backward(dy)
    for p, g in zip(layer.parameters(), once):
        assert_close(p.grad.numpy(), 2 * g, 1e-6, what="accumulated")
    layer.zero_grad()
    layer(x).backward(dy)
    for p, g in zip(layer.parameters(), once):
        np.testing.assert_array_equal(p.grad.numpy(), g)


def test_conv2d_pair_arguments_are_checked(queue):
    with pytest.raises(ValueError, match="pair"):
        nn.Conv2d(2, 2, (3, 3, 3))
    with pytest.raises(ValueError, match="strided"):
        nn.Conv2d(2, 2, 3, stride=(1, 2), padding="same")
    with pytest.raises(ValueError, match="'same' or 'valid'"):
        nn.Conv2d(2, 2, 3, padding="full")
    with pytest.raises(ValueError, match="between 0 and"):
        nn.Conv2d(2, 2, 3, padding=(1, -1))
    with pytest.raises(ValueError, match=">= 1"):
        nn.Conv2d(2, 2, (0, 3))
    with pytest.raises(TypeError):
        nn.Conv2d(2, 2, (3, 1.5))
    with pytest.raises(ValueError, match="does not fit"):
        nn.Conv2d(2, 2, (1, 7)).output_shape((1, 2, 8, 5))
    square = nn.Conv2d(2, 4, (3, 3), stride=(2, 2), padding=(1, 1), dilation=[1, 1])
    assert square.config() == nn.Conv2d(2, 4, 3, stride=2, padding=1).config() and not square.general
    assert nn.Conv2d(2, 4, 3, padding="valid").padding == 0
    layer = nn.Conv2d(2, 4, (1, 5), stride=(1, 2), padding=(0, 2), groups=2)
    assert layer.tensor_shapes(**layer.config())["weight"] == (4, 1, 1, 5)
    assert layer.macs((3, 2, 4, 10)) == 3 * 4 * 4 * 5 * 1 * 5
    assert layer.pads() == (0, 2, 0, 2) and nn.Conv2d(1, 1, (2, 4), padding="same").pads() == (0, 1, 1, 2)


def test_square_convs_keep_their_routes_and_fusions(queue):
    """The square, symmetric convs of the reference models are not the column route's (their routes
    are tests/test_conv_route.py's table); padding="same" of an odd kernel is the same ConvSpec as its
    int padding; predict()'s plan fuses the square convs into their conv families and a general one
    (with its activation) into a column-route stage (netcl.jit.cols)."""
    from netcl.jit.stages import ColsStage, ConvStage, LayerStage, plan_stages

    for name, build in models.MODELS.items():
        for m in build().modules():
            if isinstance(m, nn.Conv2d):
                assert not m.general, (name, m)
    shape = (8, 16, 12, 12)
    for k, d in ((3, 1), (5, 1), (3, 2), (1, 1)):
        same = nn.Conv2d(16, 16, k, padding="same", dilation=d)
        explicit = nn.Conv2d(16, 16, k, padding=d * (k - 1) // 2, dilation=d)
        assert same.spec(shape) == explicit.spec(shape)
        assert str(same.route(queue, shape)) == str(explicit.route(queue, shape))
    stages, _ = plan_stages([nn.Conv2d(3, 8, 3, padding="same"), nn.ReLU(), nn.Conv2d(8, 8, (1, 3), padding=(0, 1)),
                             nn.ReLU(), nn.MaxPool2d((2, 1))])
    assert [type(s) for s in stages] == [ConvStage, ColsStage, LayerStage]
    assert [str(s) for s in stages] == ["Conv2d+act1", "Conv2d+act1", "MaxPool2d"]


# -- MaxPool2d, AvgPool2d ---------------------------------------------------------------------------
POOL_CASES = [((1, 3), None, 0), ((3, 1), (2, 1), (1, 0)), ((2, 3), (1, 2), (0, 1)), ((3, 2), 1, (1, 1)),
              ((2, 4), (2, 3), (1, 2)), (3, (2, 1), 1), (2, (1, 2), 0)]


@pytest.mark.parametrize("kind", ["MaxPool2d", "AvgPool2d", "MaxPool2d_ceil"])
def test_pool2d_pairs_vs_torch(queue, rng, torch, kind):
    name, ceil = kind.split("_")[0], kind.endswith("ceil")
    extra = {"ceil_mode": True} if ceil else {}
    for (k, s, p), hw in itertools.product(POOL_CASES, ((7, 10), (8, 9))):
        layer = getattr(nn, name)(k, s, p, **extra)
        ref = getattr(torch.nn, name)(k, s, p, **extra)
        against_torch(torch, rng, layer, ref, (2, 3) + hw, f"{kind} k={k} s={s} p={p} {hw}")


def test_pool2d_pair_arguments_are_checked():
    with pytest.raises(ValueError, match="padding must be between 0 and 0"):
        nn.MaxPool2d((3, 1), padding=(1, 1))
    with pytest.raises(ValueError, match="pair"):
        nn.AvgPool2d((2, 2, 2))
    assert nn.MaxPool2d((2, 2), (2, 2)).config() == nn.MaxPool2d(2).config()
    assert nn.AvgPool2d((1, 3)).config() == {"kernel_size": (1, 3), "stride": (1, 3), "padding": 0}


# -- a 2-D keyword-spotting model -------------------------------------------------------------------
def kws2d(t):
    """(N, 1, 10, 24) (features x time) -> (N, 4) logits, in netcl's or torch's layers (same names):
    (3, 1) convs along the features, (1, 3) along time, non-square pools and strides."""
    return t.Sequential(t.Conv2d(1, 8, (3, 1), padding=(1, 0)), t.BatchNorm2d(8), t.ReLU(), t.MaxPool2d((2, 1)),
                        t.Conv2d(8, 8, (1, 3), padding="same", groups=2, bias=False), t.BatchNorm2d(8), t.ReLU(),
                        t.Conv2d(8, 12, (3, 3), stride=(1, 2), padding=(1, 1)), t.ReLU(),
                        t.AvgPool2d((1, 2)), t.Conv2d(12, 12, (2, 1), dilation=(2, 1), padding="same"), t.ReLU(),
                        t.AdaptiveAvgPool2d(1), t.Flatten(), t.Linear(12, 4))


KWS_TYPES = ["Conv2d", "BatchNorm2d", "ReLU", "MaxPool2d", "Conv2d", "BatchNorm2d", "ReLU", "Conv2d", "ReLU",
             "AvgPool2d", "Conv2d", "ReLU", "AdaptiveAvgPool2d", "Flatten", "Linear"]


def kws_data(rng, n):
    """n noisy spectrograms of 4 words: word c is loud in feature rows 2c..2c+2."""
    y = rng.integers(0, 4, n)
    x = rand(rng, n, 1, 10, 24)
    for i, c in enumerate(y):
        x[i, 0, 2 * c:2 * c + 3] *= 3.0
    return x, y


def test_2d_keyword_spotting_model_trains_as_torch_step_for_step(queue, rng, torch):
    netcl.manual_seed(7)
    model = kws2d(nn)
    ref = kws2d(torch.nn).double()
    ref.load_state_dict(torch_state(torch, model), strict=False)
    x, y = kws_data(rng, 64)
    losses = quiet(train_beside_torch, torch, queue, model, ref, x, y, 48, 16, 0.1)
    assert np.mean(losses[-4:]) < 0.85 * np.mean(losses[:4])


def trained_looking_kws2d(rng):
    model = kws2d(nn).eval()
    sd = model.state_dict()
    for k in sd:
        if k.endswith("running_mean"):
            sd[k] = rand(rng, *sd[k].shape)
        elif k.endswith("running_var"):
            sd[k] = rng.uniform(0.5, 2.0, sd[k].shape).astype(np.float32)
    return model.load_state_dict(sd)


def test_2d_keyword_spotting_model_eval_predict_and_files(queue, rng, torch, tmp_path):
    model = trained_looking_kws2d(rng)
    x = rand(rng, 3, 1, 10, 24)
    check_eval_paths(queue, model, x)  # the fused plan runs the column-route convs as their own stages
    check_save_load(queue, model, x, tmp_path)
    ref = kws2d(torch.nn).double().eval()  # state_dict layouts as torch's: (out, in/groups, kH, kW)
    ref.load_state_dict(torch_state(torch, model), strict=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = ref(torch.tensor(x, dtype=torch.float64)).detach().numpy()
    np.testing.assert_allclose(model.predict(x, queue), want, rtol=1e-5, atol=1e-5)


def test_a_conv_with_bias_and_activation_predicts_as_its_layers(queue, rng):
    model = nn.Sequential(nn.Conv2d(3, 6, (1, 5), stride=(2, 1), padding=(0, 2)), nn.LeakyReLU(0.2),
                          nn.Conv2d(6, 4, (4, 2), padding="same"), nn.Sigmoid()).eval()
    check_eval_paths(queue, model, rand(rng, 2, 3, 9, 11))


@pytest.mark.parametrize("opset", [13, 17])
def test_2d_keyword_spotting_model_exports_and_imports(queue, rng, torch, ort, tmp_path, opset):
    onnx = pytest.importorskip("onnx")
    model = trained_looking_kws2d(rng)
    x = rand(rng, 3, 1, 10, 24)
    want = model(Tensor.from_host(queue, x)).to_host()
    path = tmp_path / "m.onnx"
    export_onnx(model, x.shape, path, opset=opset, dynamic_batch=True)
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)
    convs = [n for n in onnx.load(str(path)).graph.node if n.op_type == "Conv"]
    attrs = {a.name: list(a.ints) for a in convs[1].attribute}
    assert attrs["kernel_shape"] == [1, 3] and attrs["pads"] == [0, 1, 0, 1]  # "same" as explicit pads
    attrs = {a.name: list(a.ints) for a in convs[3].attribute}
    assert attrs["kernel_shape"] == [2, 1] and attrs["pads"] == [1, 0, 1, 0] and attrs["dilations"] == [2, 1]
    np.testing.assert_allclose(run_ort(path, x), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(run_ort(path, x[:1]), want[:1], rtol=1e-5, atol=1e-5)
    back = import_onnx(path)  # netcl's record of the layers
    assert repr(back) == repr(model)
    np.testing.assert_array_equal(back(Tensor.from_host(queue, x)).to_host(), want)
    strip_metadata(path, tmp_path / "bare.onnx")  # the nodes alone
    bare = import_onnx(tmp_path / "bare.onnx")
    assert [type(m).__name__ for _, m in bare.chain()] == KWS_TYPES
    np.testing.assert_allclose(bare(Tensor.from_host(queue, x)).to_host(), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("layer", [nn.Conv2d(3, 4, (2, 4), padding="same"), nn.Conv2d(3, 4, (3, 1), padding=(1, 0)),
                                   nn.Conv2d(3, 6, (1, 2), stride=(1, 2), dilation=(2, 1), groups=3),
                                   nn.MaxPool2d((3, 2), (1, 2), (1, 0), ceil_mode=True),
                                   nn.AvgPool2d((2, 4), 2, (1, 2))],
                         ids=repr)
def test_single_2d_pair_layers_export_and_import_back(queue, rng, ort, tmp_path, layer):
    model = nn.Sequential(layer).eval()
    x = rand(rng, 2, 3, 9, 11)
    want = model(Tensor.from_host(queue, x)).to_host()
    for opset in (13, 17):
        export_onnx(model, x.shape, tmp_path / "m.onnx", opset=opset)
        np.testing.assert_allclose(run_ort(tmp_path / "m.onnx", x), want, rtol=1e-5, atol=1e-6)
    strip_metadata(tmp_path / "m.onnx", tmp_path / "bare.onnx")
    bare = import_onnx(tmp_path / "bare.onnx")
    assert repr(bare) == repr(model)  # padding="same" of an even kernel comes back as "same"
    np.testing.assert_allclose(bare(Tensor.from_host(queue, x)).to_host(), want, rtol=1e-6, atol=1e-6)


def test_pads_pytorch_cannot_express_are_refused_or_padded_in_front(queue, rng, ort, tmp_path):
    """A Conv with pads [0, 1, 2, 0]: the chain of layers refuses it with the reason; import_onnx then
    replays the graph with a Pad in front of a Conv2d and agrees with onnxruntime."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    from netcl.io import onnx_import

    w = rand(rng, 4, 3, 2, 3)
    node = helper.make_node("Conv", ["input", "w"], ["output"], kernel_shape=[2, 3], pads=[0, 1, 2, 0], name="c")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [2, 3, 6, 7])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, [2, 4, 7, 6])],
                              [numpy_helper.from_array(w, "w")])
    path = tmp_path / "g.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), str(path))
    x = rand(rng, 2, 3, 6, 7)
    recorded, g, name, out, shape, dynamic = onnx_import.read(path)
    with pytest.raises(NotImplementedError, match="pads=\\[0, 1, 2, 0\\]"):
        onnx_import.chain(g, name, out, shape, dynamic)
    model = import_onnx(path)
    np.testing.assert_allclose(model(netcl.tensor(x, queue=queue)).numpy(), run_ort(path, x), rtol=1e-5, atol=1e-5)


def test_2d_keyword_spotting_model_from_torch_and_torch_onnx(queue, rng, torch, tmp_path):
    ref = kws2d(torch.nn).eval()
    with torch.no_grad():
        for m in ref.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.normal_()
                m.running_var.uniform_(0.5, 2.0)
    model = nn.from_torch(ref)
    assert [type(m).__name__ for m in model] == KWS_TYPES
    assert model[4].padding == "same" and model[0].kernel_size == (3, 1) and model[3].kernel_size == (2, 1)
    x = rand(rng, 4, 1, 10, 24)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = ref(torch.tensor(x)).detach().numpy()
    np.testing.assert_allclose(model.eval().predict(x, queue), want, rtol=1e-5, atol=1e-5)
    try:  # the graph torch.onnx writes ("same" as explicit pads)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(ref, (torch.tensor(x),), str(tmp_path / "t.onnx"), dynamo=False, opset_version=17,
                              input_names=["input"], output_names=["output"])
    except Exception as e:  # (as test_onnx_import_graph: an export torch cannot make here)
        pytest.skip(f"torch.onnx.export does not work here: {e}")
    back = import_onnx(tmp_path / "t.onnx")
    assert sum(isinstance(m, nn.Conv2d) for m in back.modules()) == 4
    np.testing.assert_allclose(back(netcl.tensor(x, queue=queue)).numpy(), want, rtol=1e-5, atol=1e-5)


def test_trainstep_replays_the_2d_keyword_spotter(queue, rng):
    def make():
        netcl.manual_seed(4)
        return kws2d(nn).to(queue).train()

    def batch():
        x, y = kws_data(rng, 8)
        x = Tensor.from_host(queue, x)
        return x, y

    replays_as_the_loop(make, (batch() for _ in range(5)))


# -- ConvTranspose2d pairs, ConvTranspose1d ----------------------------------------------------------
@pytest.mark.parametrize("args", [dict(kernel_size=(2, 3), stride=(2, 1), padding=(0, 1)),
                                  dict(kernel_size=(3, 1), stride=(1, 2), padding=(1, 0), output_padding=(0, 1)),
                                  dict(kernel_size=(1, 4), stride=(3, 2), output_padding=(2, 0), bias=False),
                                  dict(kernel_size=(4, 4), stride=(2, 2), padding=(1, 1))], ids=str)
def test_conv_transpose2d_pairs_vs_torch(queue, rng, torch, args):
    layer = nn.ConvTranspose2d(4, 6, **args)
    assert layer.weight.shape == (4, 6) + (tuple(args["kernel_size"]))  # (in, out, kH, kW), torch's layout
    ref = copy_to_torch(torch, layer, torch.nn.ConvTranspose2d(4, 6, **args).double())
    against_torch(torch, rng, layer, ref, (2, 4, 5, 7), str(args))
    assert layer.general is (args["kernel_size"] != (4, 4))  # a square pair keeps the square route


@pytest.mark.parametrize("args", [dict(kernel_size=(2, 3), stride=(2, 1), padding=(0, 1), groups=2),
                                  dict(kernel_size=3, stride=2, padding=1, output_padding=(1, 0), groups=4),
                                  dict(kernel_size=(3, 2), stride=(1, 2), padding=(2, 0), output_padding=(0, 1),
                                       dilation=2, bias=False),
                                  dict(kernel_size=3, stride=(2, 3), padding=(1, 2), output_padding=(1, 1),
                                       dilation=(1, 2), groups=2),
                                  dict(kernel_size=2, dilation=(1, 2), groups=4)], ids=str)
@pytest.mark.parametrize("config", ["native", "gpu"])
def test_conv_transpose2d_groups_and_dilation_vs_torch(queue, rng, torch, monkeypatch, args, config):
    from netcl import ops

    if config == "gpu":
        monkeypatch.setattr(ops, "_config_class", {queue.device.int_ptr: "gpu"})
    layer = nn.ConvTranspose2d(4, 8, **args)
    kh, kw = args["kernel_size"] if isinstance(args["kernel_size"], tuple) else (args["kernel_size"],) * 2
    assert layer.weight.shape == (4, 8 // args.get("groups", 1), kh, kw)  # (in, out/groups, kH, kW), torch's
    assert layer.general  # groups or dilation: the column route
    ref = copy_to_torch(torch, layer, torch.nn.ConvTranspose2d(4, 8, **args).double())
    against_torch(torch, rng, layer, ref, (2, 4, 5, 6), str(args))


@pytest.mark.parametrize("args", [dict(kernel_size=3), dict(kernel_size=4, stride=2, padding=1),
                                  dict(kernel_size=3, stride=3, padding=1, output_padding=2, groups=2, dilation=2),
                                  dict(kernel_size=2, dilation=3, output_padding=2, groups=2, bias=False),
                                  dict(kernel_size=(5,), stride=(2,), padding=(2,), output_padding=(1,))], ids=str)
@pytest.mark.parametrize("config", ["native", "gpu"])
def test_conv_transpose1d_vs_torch(queue, rng, torch, monkeypatch, args, config):
    from netcl import ops

    if config == "gpu":
        monkeypatch.setattr(ops, "_config_class", {queue.device.int_ptr: "gpu"})
    layer = nn.ConvTranspose1d(4, 6, **args)
    assert layer.weight.shape == (4, 6 // args.get("groups", 1), layer.kernel_size)  # (in, out/groups, k)
    ref = copy_to_torch(torch, layer, torch.nn.ConvTranspose1d(4, 6, **args).double())
    against_torch(torch, rng, layer, ref, (3, 4, 9), str(args))


def test_conv_transpose_arguments_are_checked(queue):
    with pytest.raises(ValueError, match="smaller than either stride"):
        nn.ConvTranspose2d(2, 2, 3, stride=(2, 1), output_padding=(1, 1))
    with pytest.raises(ValueError, match="smaller than either stride"):
        nn.ConvTranspose2d(2, 2, 3, stride=2, dilation=(3, 1), output_padding=(2, 2))
    with pytest.raises(ValueError, match="divisible"):
        nn.ConvTranspose2d(4, 6, 3, groups=4)
    with pytest.raises(ValueError, match="dilation"):
        nn.ConvTranspose2d(4, 4, 3, dilation=0)
    square = nn.ConvTranspose2d(4, 6, 3, stride=2, groups=1, dilation=(1, 1))  # the defaults: the square route
    assert not square.general and "groups" not in square.config() and "dilation" not in square.config()
    layer = nn.ConvTranspose2d(4, 6, 3, stride=2, output_padding=(1, 2), groups=2, dilation=(1, 3))
    assert layer.tensor_shapes(**layer.config()) == {"weight": (4, 3, 3, 3), "bias": (6,)}
    assert layer.output_shape((5, 4, 7, 8)) == (5, 6, 16, 23)
    assert layer.macs((5, 4, 7, 8)) == 5 * 4 * 7 * 8 * 3 * 9
    assert repr(layer) == "ConvTranspose2d(in_channels=4, out_channels=6, kernel_size=3, stride=2, padding=0, " \
                          "output_padding=(1, 2), bias=True, groups=2, dilation=(1, 3))"
    with pytest.raises(ValueError, match="smaller than either stride"):
        nn.ConvTranspose1d(2, 2, 3, stride=2, output_padding=2)
    with pytest.raises(ValueError, match="divisible"):
        nn.ConvTranspose1d(4, 6, 3, groups=4)
    with pytest.raises(ValueError, match="3-D input"):
        nn.ConvTranspose1d(4, 6, 3).output_shape((2, 4, 5, 5))
    with pytest.raises(ValueError, match="no output"):
        nn.ConvTranspose1d(4, 6, 1, padding=2).output_shape((2, 4, 3))
    assert nn.ConvTranspose2d(2, 4, (3, 3), (2, 2), (1, 1), (1, 1)).config() == \
        nn.ConvTranspose2d(2, 4, 3, 2, 1, 1).config()
    layer = nn.ConvTranspose1d(4, 6, 3, stride=2, groups=2)
    assert layer.tensor_shapes(**layer.config()) == {"weight": (4, 3, 3), "bias": (6,)}
    assert layer.output_shape((5, 4, 10)) == (5, 6, 21) and layer.macs((5, 4, 10)) == 5 * 4 * 10 * 3 * 3
    assert repr(layer) == "ConvTranspose1d(in_channels=4, out_channels=6, kernel_size=3, stride=2, padding=0, " \
                          "groups=2, bias=True)"


def upsampler(t):
    """(N, 4, 6) -> (N, 3) through grouped, dilated ConvTranspose1d layers and an InstanceNorm1d, in
    netcl's or torch's layers."""
    return t.Sequential(t.Conv1d(4, 8, 3, padding=1), t.ReLU(),
                        t.ConvTranspose1d(8, 4, 4, stride=2, padding=1, groups=2), t.InstanceNorm1d(4, affine=True),
                        t.ReLU(),
                        t.ConvTranspose1d(4, 2, 3, dilation=2, output_padding=1, stride=2), t.Flatten(),
                        t.Linear(2 * 28, 3))


def decoder2d(t):
    """(N, 2, 4, 5) -> (N, 3) through non-square ConvTranspose2d layers."""
    return t.Sequential(t.ConvTranspose2d(2, 4, (2, 3), stride=(2, 1), padding=(0, 1)), t.ReLU(),
                        t.ConvTranspose2d(4, 2, (1, 2), stride=(1, 2), output_padding=(0, 1)), t.Flatten(),
                        t.Linear(2 * 8 * 11, 3))


def grouped_decoder2d(t):
    """(N, 4, 4, 5) -> (N, 3) through grouped, dilated ConvTranspose2d layers."""
    return t.Sequential(t.ConvTranspose2d(4, 8, (2, 3), stride=(2, 1), padding=(0, 1), groups=2), t.ReLU(),
                        t.ConvTranspose2d(8, 4, 3, stride=2, padding=1, output_padding=(1, 0), groups=4,
                                          dilation=(1, 2)), t.Flatten(),
                        t.Linear(4 * 16 * 11, 3))


@pytest.mark.parametrize("build, shape", [(upsampler, (4, 6)), (decoder2d, (2, 4, 5)), (grouped_decoder2d, (4, 4, 5))],
                         ids=["1d", "2d", "2d-grouped"])
def test_transposed_models_train_save_export_and_import(queue, rng, torch, ort, tmp_path, build, shape):
    onnx = pytest.importorskip("onnx")
    netcl.manual_seed(5)
    model = build(nn)
    ref = build(torch.nn).double()
    ref.load_state_dict(torch_state(torch, model), strict=True)
    x = rand(rng, 32, *shape)
    y = (x.reshape(32, -1)[:, :5].sum(1) > 0).astype(np.int64) + (x.reshape(32, -1)[:, -5:].sum(1) > 0)
    train_beside_torch(torch, queue, model, ref, x, y, 8, 8, 0.05)
    xs = x[:3]
    check_eval_paths(queue, model, xs)
    check_save_load(queue, model, xs, tmp_path)
    want = model(Tensor.from_host(queue, xs)).to_host()
    for opset in (13, 17):
        export_onnx(model, xs.shape, tmp_path / "m.onnx", opset=opset, dynamic_batch=True)
        onnx.checker.check_model(onnx.load(str(tmp_path / "m.onnx")), full_check=True)
        np.testing.assert_allclose(run_ort(tmp_path / "m.onnx", xs), want, rtol=1e-5, atol=1e-5)
    assert repr(import_onnx(tmp_path / "m.onnx")) == repr(model)
    strip_metadata(tmp_path / "m.onnx", tmp_path / "bare.onnx")
    bare = import_onnx(tmp_path / "bare.onnx")  # (the graph's ConvTranspose nodes: a GraphModule of the layers)
    kinds = [type(m).__name__ for m in model.modules() if "ConvTranspose" in type(m).__name__]
    assert [type(m).__name__ for m in bare.modules() if "ConvTranspose" in type(m).__name__] == kinds
    np.testing.assert_allclose(bare(Tensor.from_host(queue, xs)).to_host(), want, rtol=1e-6, atol=1e-6)
    back = nn.from_torch(build(torch.nn).eval())
    assert repr(back) == repr(model)


def test_trainstep_replays_the_transposed_convs(queue, rng):
    def make():
        netcl.manual_seed(6)
        return upsampler(nn).to(queue).train()

    def batch():
        x = Tensor.from_host(queue, rand(rng, 8, 4, 6))
        y = rng.integers(0, 3, 8)
        return x, y

    replays_as_the_loop(make, (batch() for _ in range(4)))


def test_grouped_dilated_conv_transpose2d_from_torch_onnx(queue, rng, torch, tmp_path):
    """The ConvTranspose nodes torch.onnx writes (group, dilations, the weight (C, M/group, kH, kW))
    import to the same layers, and the model gives torch's output; an ungrouped, undilated one's
    export carries neither attribute, as before."""
    onnx = pytest.importorskip("onnx")
    ref = grouped_decoder2d(torch.nn).eval()
    x = rand(rng, 3, 4, 4, 5)
    with torch.no_grad():
        want = ref(torch.tensor(x)).numpy()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(ref, (torch.tensor(x),), str(tmp_path / "t.onnx"), dynamo=False, opset_version=17,
                              input_names=["input"], output_names=["output"])
    except Exception as e:  # (as test_onnx_import_graph: an export torch cannot make here)
        pytest.skip(f"torch.onnx.export does not work here: {e}")
    back = import_onnx(tmp_path / "t.onnx")
    convs = [m for m in back.modules() if isinstance(m, nn.ConvTranspose2d)]
    assert [(m.groups, m.dilation) for m in convs] == [(2, 1), (4, (1, 2))]
    np.testing.assert_allclose(back(netcl.tensor(x, queue=queue)).numpy(), want, rtol=1e-5, atol=1e-5)
    export_onnx(nn.Sequential(nn.ConvTranspose2d(4, 2, 3, stride=2)).eval(), (1, 4, 3, 3), tmp_path / "p.onnx")
    (node,) = [n for n in onnx.load(str(tmp_path / "p.onnx")).graph.node if n.op_type == "ConvTranspose"]
    assert sorted(a.name for a in node.attribute) == ["kernel_shape", "pads", "strides"]


def test_trainstep_replays_the_grouped_transposed_conv2d(queue, rng):
    def make():
        netcl.manual_seed(7)
        return grouped_decoder2d(nn).to(queue).train()

    def batch():
        return Tensor.from_host(queue, rand(rng, 8, 4, 4, 5)), rng.integers(0, 3, 8)

    replays_as_the_loop(make, (batch() for _ in range(4)))


# -- InstanceNorm1d ---------------------------------------------------------------------------------
@pytest.mark.parametrize("affine", [True, False])
def test_instancenorm1d_vs_torch(queue, rng, torch, affine):
    layer = nn.InstanceNorm1d(5, eps=1e-3, affine=affine)
    if affine:
        layer.load_state_dict({"weight": rng.uniform(0.5, 1.5, 5).astype(np.float32), "bias": rand(rng, 5)})
    ref = copy_to_torch(torch, layer, torch.nn.InstanceNorm1d(5, eps=1e-3, affine=affine).double())
    against_torch(torch, rng, layer, ref, (3, 5, 11), f"affine={affine}")
    with pytest.raises(ValueError, match="3-D input"):
        layer.output_shape((3, 5, 4, 4))
    with pytest.raises(ValueError, match="more than one position"):
        layer(netcl.tensor(rand(rng, 3, 5, 1)))
    with pytest.raises(ValueError, match="InstanceNorm1d: track_running_stats=True"):
        nn.InstanceNorm1d(5, track_running_stats=True)
