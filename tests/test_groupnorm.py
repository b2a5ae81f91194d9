"""GroupNorm and InstanceNorm2d (GroupNorm with a group per channel). GroupNorm: forward and every
gradient against float64 PyTorch (groups 1, 2 and C, affine on and off,
2-D, 3-D and 4-D inputs, a batch of 1), a small conv net training against PyTorch step for step, .netcl
round trips, ONNX export checked by onnxruntime (GroupNormalization at opset 21, its decomposition at
13 and 17), the import back (netcl's record and the bare graph; opset 18's per-group scale too),
from_torch, eval()/predict in a Sequential, TrainStep's replay, torch.onnx's GroupNorm (an
InstanceNormalization of x reshaped to (N, G, -1)). InstanceNorm2d: the same checks, InstanceNormalization
at every opset."""
import warnings

import numpy as np
import pytest
from conftest import assert_close, replays_as_the_loop, torch_state, train_beside_torch

import netcl
from netcl import Tensor, nn
from netcl.io import export_onnx, import_onnx
from test_conv1d_pool1d import against_torch, copy_to_torch
from test_embedding_bn1d_activations import check_eval_paths, check_save_load, rand, run_ort, strip_metadata


def with_weights(rng, layer):
    """`layer` with random weight and bias (ones and zeros would hide a per-channel indexing slip)."""
    sd = layer.state_dict()
    return layer.load_state_dict({k: rand(rng, *v.shape) for k, v in sd.items()}) if sd else layer


def norms_randomized(rng, model):
    """`model` with its norm layers' weights random (the convs and Linear keep PyTorch's initialisation:
    N(0, 1) weights everywhere make outputs whose near-zero entries no relative tolerance holds)."""
    for layer in model:
        if isinstance(layer, nn.GroupNorm):
            with_weights(rng, layer)
    return model


# -- forward and backward -------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(3, 6, 5, 7), (2, 6, 11), (1, 6, 4, 4), (1, 6, 9), (4, 6)], ids=str)
@pytest.mark.parametrize("groups", [1, 2, 6])
@pytest.mark.parametrize("affine", [True, False])
def test_groupnorm_vs_torch(queue, rng, torch, shape, groups, affine):
    layer = with_weights(rng, nn.GroupNorm(groups, 6, affine=affine))
    ref = copy_to_torch(torch, layer, torch.nn.GroupNorm(groups, 6, affine=affine).double())
    against_torch(torch, rng, layer, ref, shape, f"GroupNorm({groups}, 6, affine={affine}) on {shape}")


@pytest.mark.parametrize("config", ["native", "gpu"])
def test_groupnorm_both_device_classes_vs_torch(queue, rng, torch, monkeypatch, config):
    """This device's kernels and the GPU class's (a work-group per row and per channel, forced on whatever
    device runs the tests), on small rows and on rows of 8 * 40 * 40 offset values with a large eps."""
    from netcl import ops

    if config == "gpu":
        monkeypatch.setattr(ops, "_config_class", {queue.device.int_ptr: "gpu"})
    for groups, affine, shape in [(2, True, (3, 6, 5, 7)), (6, False, (1, 6, 9)), (1, True, (2, 6, 3, 1))]:
        layer = with_weights(rng, nn.GroupNorm(groups, 6, affine=affine))
        ref = copy_to_torch(torch, layer, torch.nn.GroupNorm(groups, 6, affine=affine).double())
        against_torch(torch, rng, layer, ref, shape, f"{config}: GroupNorm({groups}, 6, affine={affine}) on {shape}")
    layer = with_weights(rng, nn.GroupNorm(2, 16, eps=0.1))
    ref = copy_to_torch(torch, layer, torch.nn.GroupNorm(2, 16, eps=0.1).double())
    x, dy = rand(rng, 2, 16, 40, 40) * 3.0 + 5.0, rand(rng, 2, 16, 40, 40)
    xt, rx = netcl.tensor(x, requires_grad=True, queue=queue), torch.tensor(x, dtype=torch.float64, requires_grad=True)
    y, ry = layer(xt), ref(rx)
    y.backward(netcl.tensor(dy, queue=queue))
    ry.backward(torch.tensor(dy, dtype=torch.float64))
    assert_close(y.numpy(), ry.detach().numpy(), 1e-4, atol=1e-5, what=f"{config}: large rows forward")
    assert_close(xt.grad.numpy(), rx.grad.numpy(), 1e-4, atol=1e-5, what=f"{config}: large rows dx")
    assert_close(layer.weight.grad.numpy(), ref.weight.grad.numpy(), 1e-4, atol=1e-4, what=f"{config}: dweight")
    assert_close(layer.bias.grad.numpy(), ref.bias.grad.numpy(), 1e-4, atol=1e-4, what=f"{config}: dbias")


def test_groupnorm_gradients_accumulate_and_are_deterministic(queue, rng):
    layer = with_weights(rng, nn.GroupNorm(2, 4))
    x, dy = rand(rng, 3, 4, 5, 5), rand(rng, 3, 4, 5, 5)
    grads = []
    for _ in range(2):
        xt = netcl.tensor(x, requires_grad=True, queue=queue)
        layer(xt).backward(netcl.tensor(dy, queue=queue))
        grads.append((xt.grad.numpy(), layer.weight.grad.numpy().copy(), layer.bias.grad.numpy().copy()))
    np.testing.assert_array_equal(grads[0][0], grads[1][0])  # the same bits, run after run
    np.testing.assert_allclose(grads[1][1], 2 * grads[0][1], rtol=1e-6)  # accumulated into .grad
    np.testing.assert_allclose(grads[1][2], 2 * grads[0][2], rtol=1e-6)


def test_groupnorm_arguments_are_checked(queue):
    with pytest.raises(ValueError, match="divisible"):
        nn.GroupNorm(4, 6)
    with pytest.raises(ValueError, match="eps"):
        nn.GroupNorm(2, 6, eps=0.0)
    with pytest.raises(TypeError, match="affine"):
        nn.GroupNorm(2, 6, affine=1)
    with pytest.raises(ValueError, match="num_groups"):
        nn.GroupNorm(0, 6)
    with pytest.raises(ValueError, match=r"\(N, 6, \*\)"):
        nn.GroupNorm(2, 6)(netcl.tensor(np.zeros((2, 4, 3), np.float32), queue=queue))
    with pytest.raises(ValueError, match=r"\(N, 6, \*\)"):
        nn.GroupNorm(2, 6)(netcl.tensor(np.zeros((6,), np.float32), queue=queue))
    assert nn.GroupNorm(2, 6, affine=False).state_dict() == {}
    assert set(nn.GroupNorm(2, 6).state_dict()) == {"weight", "bias"}


# -- a small conv net -------------------------------------------------------------------------------
def gn_net(t):
    """(N, 3, 12, 12) -> (N, 4) logits, in netcl's or torch's layers (same names)."""
    return t.Sequential(t.Conv2d(3, 8, 3, padding=1), t.GroupNorm(2, 8), t.ReLU(), t.MaxPool2d(2),
                        t.Conv2d(8, 8, 3, padding=1, bias=False), t.GroupNorm(8, 8, affine=False), t.ReLU(),
                        t.Conv2d(8, 12, 3), t.GroupNorm(1, 12), t.ReLU(), t.AdaptiveAvgPool2d(1), t.Flatten(),
                        t.Linear(12, 4))



GN_TYPES = ["Conv2d", "GroupNorm", "ReLU", "MaxPool2d", "Conv2d", "GroupNorm", "ReLU", "Conv2d", "GroupNorm", "ReLU",
            "AdaptiveAvgPool2d", "Flatten", "Linear"]


def test_groupnorm_net_trains_as_torch_step_for_step(queue, rng, torch):
    netcl.manual_seed(3)
    model = gn_net(nn)
    ref = gn_net(torch.nn).double()
    ref.load_state_dict(torch_state(torch, model))
    x = rand(rng, 32, 3, 12, 12)
    y = (x[:, 0, :6].mean((1, 2)) > 0).astype(np.int64) + 2 * (x[:, 2, :, 6:].mean((1, 2)) > 0).astype(np.int64)
    losses = train_beside_torch(torch, queue, model, ref, x, y, steps=40, batch=8, lr=0.1)
    assert np.mean(losses[-4:]) < 0.8 * np.mean(losses[:4])


def test_trainstep_replays_groupnorm(queue, rng):
    """TrainStep records a step of GroupNorm and replays it: the losses and weights of the layer calls."""
    def make():
        netcl.manual_seed(5)
        return gn_net(nn).to(queue).train()

    def batch():
        x, y = Tensor.from_host(queue, rand(rng, 8, 3, 12, 12)), rng.integers(0, 4, 8)
        return x, y

    replays_as_the_loop(make, (batch() for _ in range(5)))


# -- files, ONNX, eval ------------------------------------------------------------------------------
@pytest.mark.parametrize("opset", [13, 17, 21])
def test_groupnorm_net_saves_exports_and_imports(queue, rng, torch, ort, tmp_path, opset):
    netcl.manual_seed(2)
    model = norms_randomized(rng, gn_net(nn)).eval()
    x = rand(rng, 3, 3, 12, 12)
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
    if opset >= 21:  # GroupNormalization nodes come back as the layers; before, the decomposition is replayed
        assert [type(m).__name__ for _, m in bare.chain()] == GN_TYPES
    np.testing.assert_allclose(bare(Tensor.from_host(queue, x)).to_host(), want, rtol=1e-5, atol=1e-5)
    ref = gn_net(torch.nn).double().eval()  # and the torch model with the same weights gives the same
    ref.load_state_dict(torch_state(torch, model))
    np.testing.assert_allclose(want, ref(torch.tensor(x, dtype=torch.float64)).detach().numpy(), rtol=1e-5, atol=1e-5)


def ops(path):
    from netcl.io.onnx_export import onnx_pb2 as P
    return [n.op_type for n in P.ModelProto.FromString(open(path, "rb").read()).graph.node]


@pytest.mark.parametrize("opset", [13, 17, 18, 21])
@pytest.mark.parametrize("layer", [nn.GroupNorm(2, 4), nn.GroupNorm(4, 4, affine=False), nn.GroupNorm(1, 4, 1e-3)],
                         ids=repr)
def test_groupnorm_on_3d_input_exports_at_each_opset(queue, rng, ort, tmp_path, opset, layer):
    """(N, C, L) and the opset's form: GroupNormalization from 21 (ones and zeros where affine=False), the
    decomposition before (opset 18's GroupNormalization takes a scale per group, not per channel)."""
    model = nn.Sequential(with_weights(rng, layer)).eval()
    x = rand(rng, 2, 4, 7)
    want = model(Tensor.from_host(queue, x)).to_host()
    path = tmp_path / "m.onnx"
    export_onnx(model, x.shape, path, opset=opset)
    assert ("GroupNormalization" in ops(path)) == (opset >= 21)
    np.testing.assert_allclose(run_ort(path, x), want, rtol=1e-5, atol=1e-6)
    strip_metadata(path, tmp_path / "bare.onnx")
    bare = import_onnx(tmp_path / "bare.onnx")
    np.testing.assert_allclose(bare(Tensor.from_host(queue, x)).to_host(), want, rtol=1e-5, atol=1e-6)
    if opset >= 21:
        assert type(bare[0]) is nn.GroupNorm and bare[0].num_groups == layer.num_groups


def test_opset18_group_normalization_imports_with_its_per_group_scale(queue, rng, ort, tmp_path):
    """A hand-written opset-18 GroupNormalization (scale and bias one per group) imports as a GroupNorm
    whose per-channel weight repeats each group's value, and agrees with onnxruntime."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper
    scale, bias = rand(rng, 3), rand(rng, 3)
    node = helper.make_node("GroupNormalization", ["input", "scale", "bias"], ["output"], num_groups=3, epsilon=1e-4)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [2, 6, 5])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, [2, 6, 5])],
                              [numpy_helper.from_array(scale, "scale"), numpy_helper.from_array(bias, "bias")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    path, x = tmp_path / "g18.onnx", rand(rng, 2, 6, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (onnx warns that opset 18's form is deprecated)
        onnx.save(m, str(path))
        want = run_ort(path, x)
    model = import_onnx(path)
    assert type(model[0]) is nn.GroupNorm and (model[0].num_groups, model[0].num_channels) == (3, 6)
    assert model[0].eps == pytest.approx(1e-4) and model[0].affine  # (the file holds eps as a float32)
    np.testing.assert_array_equal(model[0].weight.numpy(), np.repeat(scale, 2))
    np.testing.assert_allclose(model(netcl.tensor(x, queue=queue)).numpy(), want, rtol=1e-5, atol=1e-5)


def test_groupnorm_from_torch(queue, rng, torch):
    t = torch.nn
    ref = t.Sequential(t.Conv2d(3, 6, 3), t.GroupNorm(3, 6, eps=1e-4), t.ReLU(), t.GroupNorm(6, 6, affine=False),
                       t.Flatten(2), t.GroupNorm(2, 6)).eval()
    torch.manual_seed(1)
    with torch.no_grad():
        ref[1].weight.normal_()
        ref[1].bias.normal_()
    model = nn.from_torch(ref)
    assert type(model[1]) is nn.GroupNorm and model[1].config() == {"num_groups": 3, "num_channels": 6, "eps": 1e-4,
                                                                    "affine": True}
    assert model[3].config()["affine"] is False
    x = rand(rng, 2, 3, 7, 7)
    want = ref.double()(torch.tensor(x, dtype=torch.float64)).detach().numpy()  # (float32 torch is itself off by ~1e-5)
    np.testing.assert_allclose(model.eval().predict(x, queue), want, rtol=1e-4, atol=1e-5)


def test_a_module_with_groupnorm_traces_and_exports(queue, rng, torch, ort, tmp_path):
    """A Module subclass (a residual block with GroupNorm): torch's gradients through autograd, traced,
    exported at opsets 17 and 21."""
    def block(lib):
        class Block(lib.Module):
            def __init__(self):
                super().__init__()
                self.conv = lib.Conv2d(4, 4, 3, padding=1)
                self.norm = lib.GroupNorm(2, 4)

            def forward(self, x):
                return x + self.norm(self.conv(x)).relu()
        return Block()

    model, ref = block(nn), block(torch.nn).double()
    ref.load_state_dict({k: torch.tensor(v, dtype=torch.float64) for k, v in model.state_dict().items()})
    x = rand(rng, 2, 4, 6, 6)
    xt = netcl.tensor(x, requires_grad=True, queue=queue)
    y = model(xt)
    rx = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    ry = ref(rx)
    dy = rand(rng, *y.shape)
    y.backward(netcl.tensor(dy, queue=queue))
    ry.backward(torch.tensor(dy, dtype=torch.float64))
    assert_close(y.numpy(), ry.detach().numpy(), 1e-5, atol=1e-6, what="forward")
    assert_close(xt.grad.numpy(), rx.grad.numpy(), 1e-5, atol=1e-6, what="dx")
    for (k, p), (_, rp) in zip(model.named_parameters(), ref.named_parameters()):
        assert_close(p.grad.numpy(), rp.grad.numpy(), 1e-5, atol=1e-5, what=k)
    model.eval()
    for opset in (17, 21):
        export_onnx(model, x.shape, tmp_path / "m.onnx", opset=opset)
        np.testing.assert_allclose(run_ort(tmp_path / "m.onnx", x), y.numpy(), rtol=1e-5, atol=1e-5)


def test_torch_onnx_export_of_groupnorm_imports(queue, rng, torch, tmp_path):
    """torch.onnx writes GroupNorm as Reshape, InstanceNormalization (unit scale), Reshape, Mul, Add: the
    graph importer runs the InstanceNormalization on (N, G, -1) as a GroupNorm(G, G) and agrees with torch."""
    ref = torch.nn.Sequential(torch.nn.Conv2d(3, 6, 3), torch.nn.GroupNorm(3, 6), torch.nn.ReLU()).eval()
    with torch.no_grad():
        ref[1].weight.normal_()
        ref[1].bias.normal_()
    x = rand(rng, 2, 3, 7, 7)
    try:
        torch.onnx.export(ref, (torch.tensor(x),), str(tmp_path / "t.onnx"), dynamo=False, opset_version=17,
                          input_names=["input"], output_names=["output"])
    except Exception as e:  # (as test_onnx_import_graph: an export torch cannot make here)
        pytest.skip(f"torch.onnx.export does not work here: {e}")
    model = import_onnx(tmp_path / "t.onnx")
    assert any(type(m) is nn.GroupNorm for m in model.modules())
    np.testing.assert_allclose(model(netcl.tensor(x, queue=queue)).numpy(), ref(torch.tensor(x)).detach().numpy(),
                               rtol=1e-5, atol=1e-5)


# -- InstanceNorm2d -------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(3, 5, 6, 7), (1, 5, 4, 4)], ids=str)
@pytest.mark.parametrize("affine", [True, False])
def test_instancenorm2d_vs_torch(queue, rng, torch, shape, affine):
    layer = with_weights(rng, nn.InstanceNorm2d(5, affine=affine))
    ref = copy_to_torch(torch, layer, torch.nn.InstanceNorm2d(5, affine=affine).double())
    against_torch(torch, rng, layer, ref, shape, f"InstanceNorm2d(5, affine={affine}) on {shape}")


def test_instancenorm2d_arguments_are_checked(queue):
    with pytest.raises(ValueError, match="track_running_stats=True is not supported"):
        nn.InstanceNorm2d(4, track_running_stats=True)
    with pytest.raises(ValueError, match="4-D"):
        nn.InstanceNorm2d(4)(netcl.tensor(np.zeros((2, 4, 5), np.float32), queue=queue))
    with pytest.raises(ValueError, match="4 channels"):
        nn.InstanceNorm2d(4)(netcl.tensor(np.zeros((2, 3, 5, 5), np.float32), queue=queue))
    with pytest.raises(ValueError, match="more than one position"):
        nn.InstanceNorm2d(4)(netcl.tensor(np.zeros((2, 4, 1, 1), np.float32), queue=queue))
    assert nn.InstanceNorm2d(4).eval()(netcl.tensor(np.ones((2, 4, 1, 1), np.float32), queue=queue)).numpy().max() == 0
    with pytest.raises(ValueError, match="InstanceNorm2d needs eps > 0"):
        nn.InstanceNorm2d(4, eps=-1.0)
    layer = nn.InstanceNorm2d(4, eps=1e-3, momentum=0.5)
    assert layer.state_dict() == {} and layer.config() == {"num_features": 4, "eps": 1e-3, "affine": False}
    assert set(nn.InstanceNorm2d(4, affine=True).state_dict()) == {"weight", "bias"}


def in_net(t):
    """(N, 3, 10, 10) -> (N, 4) logits with InstanceNorm2d, affine and not, in netcl's or torch's layers."""
    return t.Sequential(t.Conv2d(3, 6, 3, padding=1), t.InstanceNorm2d(6, affine=True), t.ReLU(), t.MaxPool2d(2),
                        t.Conv2d(6, 8, 3), t.InstanceNorm2d(8), t.ReLU(), t.Flatten(), t.Linear(72, 4))


IN_TYPES = ["Conv2d", "InstanceNorm2d", "ReLU", "MaxPool2d", "Conv2d", "InstanceNorm2d", "ReLU", "Flatten", "Linear"]


def test_instancenorm_net_trains_as_torch_step_for_step(queue, rng, torch):
    netcl.manual_seed(6)
    model = in_net(nn)
    ref = in_net(torch.nn).double()
    ref.load_state_dict(torch_state(torch, model))
    x = rand(rng, 32, 3, 10, 10)
    y = (x[:, 0, :5].mean((1, 2)) > 0).astype(np.int64) + 2 * (x[:, 2, :, 5:].mean((1, 2)) > 0).astype(np.int64)
    losses = train_beside_torch(torch, queue, model, ref, x, y, steps=40, batch=8, lr=0.05)
    assert np.mean(losses[-4:]) < 0.8 * np.mean(losses[:4])


@pytest.mark.parametrize("opset", [13, 17, 21])
def test_instancenorm_net_saves_exports_and_imports(queue, rng, torch, ort, tmp_path, opset):
    netcl.manual_seed(2)
    model = norms_randomized(rng, in_net(nn)).eval()
    x = rand(rng, 3, 3, 10, 10)
    check_eval_paths(queue, model, x)
    check_save_load(queue, model, x, tmp_path)
    want = model(Tensor.from_host(queue, x)).to_host()
    path = tmp_path / "m.onnx"
    export_onnx(model, x.shape, path, opset=opset, dynamic_batch=True)
    assert ops(path).count("InstanceNormalization") == 2
    np.testing.assert_allclose(run_ort(path, x), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(run_ort(path, x[:1]), want[:1], rtol=1e-5, atol=1e-5)
    back = import_onnx(path)  # netcl's record of the layers
    assert repr(back) == repr(model)
    np.testing.assert_array_equal(back(Tensor.from_host(queue, x)).to_host(), want)
    strip_metadata(path, tmp_path / "bare.onnx")  # the nodes alone: affine=False comes back with ones and zeros
    bare = import_onnx(tmp_path / "bare.onnx")
    assert [type(m).__name__ for _, m in bare.chain()] == IN_TYPES
    np.testing.assert_allclose(bare(Tensor.from_host(queue, x)).to_host(), want, rtol=1e-5, atol=1e-5)
    ref = in_net(torch.nn).double().eval()
    ref.load_state_dict(torch_state(torch, model))
    np.testing.assert_allclose(want, ref(torch.tensor(x, dtype=torch.float64)).detach().numpy(), rtol=1e-5, atol=1e-5)


def test_instancenorm2d_from_torch(queue, rng, torch):
    t = torch.nn
    ref = t.Sequential(t.Conv2d(3, 4, 3), t.InstanceNorm2d(4, eps=1e-4, affine=True), t.ReLU(),
                       t.InstanceNorm2d(4)).eval()
    torch.manual_seed(1)
    with torch.no_grad():
        ref[1].weight.normal_()
        ref[1].bias.normal_()
    model = nn.from_torch(ref)
    assert type(model[1]) is nn.InstanceNorm2d and model[1].config() == {"num_features": 4, "eps": 1e-4,
                                                                         "affine": True}
    assert model[3].config()["affine"] is False
    x = rand(rng, 2, 3, 7, 7)
    want = ref.double()(torch.tensor(x, dtype=torch.float64)).detach().numpy()  # (float32 torch is itself off by ~1e-5)
    np.testing.assert_allclose(model.eval().predict(x, queue), want, rtol=1e-4, atol=1e-5)
    with pytest.raises(Exception, match="track_running_stats"):
        nn.from_torch(t.Sequential(t.InstanceNorm2d(4, track_running_stats=True)))


def test_functional_group_norm_from_torch_fx_traces_and_exports(queue, rng, torch, ort, tmp_path):
    """F.group_norm (PyTorch's signature, GroupNorm's kernels): a torch module that calls it converts
    through torch.fx with torch's gradients, traces, and exports (opsets 17 and 21) as onnxruntime runs it."""
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3)
            self.w = torch.nn.Parameter(torch.randn(4))
            self.b = torch.nn.Parameter(torch.randn(4))

        def forward(self, x):
            y = torch.nn.functional.group_norm(self.conv(x), 2, self.w, self.b, 1e-3)
            return torch.nn.functional.group_norm(y.relu(), 4)

    torch.manual_seed(3)
    ref = Net().double()
    model = nn.from_torch(ref)
    x = rand(rng, 2, 3, 6, 6)
    xt = netcl.tensor(x, requires_grad=True, queue=queue)
    y = model(xt)
    rx = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    ry = ref(rx)
    dy = rand(rng, *y.shape)
    y.backward(netcl.tensor(dy, queue=queue))
    ry.backward(torch.tensor(dy, dtype=torch.float64))
    assert_close(y.numpy(), ry.detach().numpy(), 1e-5, atol=1e-5, what="forward")
    assert_close(xt.grad.numpy(), rx.grad.numpy(), 1e-5, atol=1e-5, what="dx")
    grads = {k: p.grad.numpy() for k, p in model.named_parameters()}
    for k, p in ref.named_parameters():
        got = grads[k]
        assert_close(got, p.grad.numpy().reshape(got.shape), 1e-4, atol=1e-5, what=k)
    model.eval()
    with netcl.no_grad():
        graph = netcl.trace(model, netcl.tensor(x, queue=queue))
        np.testing.assert_allclose(graph(netcl.tensor(x, queue=queue)).numpy(), y.numpy(), rtol=1e-6, atol=1e-6)
    for opset in (17, 21):
        export_onnx(model, x.shape, tmp_path / "m.onnx", opset=opset)
        np.testing.assert_allclose(run_ort(tmp_path / "m.onnx", x), ry.detach().numpy(), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="divisible"):
        nn.functional.group_norm(netcl.tensor(x, queue=queue), 2)
