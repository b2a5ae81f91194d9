"""BatchNorm1d, Embedding, ELU, Softplus, Mish, PReLU and LogSoftmax: forward and backward against float64 PyTorch, training
against PyTorch step for step, .netcl round trips, ONNX export checked by onnxruntime, the import
back (from netcl's own files and from the bare graph) and from_torch, eval()/predict in a Sequential."""
import numpy as np
import pytest
from conftest import assert_close, replays_as_the_loop, train_beside_torch

import netcl
from netcl import Tensor, nn, optim
from netcl.io import export_onnx, import_onnx, load, save
from netcl.io.onnx_export import onnx_pb2 as P


def rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def run_ort(path, x):
    from netcl.apps.common import ort_session

    return ort_session(path, "cpu").run(None, {"input": x})[0]


def strip_metadata(src, dst):
    m = P.ModelProto.FromString(open(src, "rb").read())
    del m.metadata_props[:]
    with open(dst, "wb") as f:
        f.write(m.SerializeToString())


def check_export_import(queue, model, x, tmp_path, types, rtol=1e-5, atol=1e-5):
    """Export to ONNX, compare onnxruntime with netcl; import back with and without netcl's metadata
    (the bare graph is read from its nodes); the imported models give netcl's outputs."""
    want = model(Tensor.from_host(queue, x)).to_host()
    path = tmp_path / "m.onnx"
    export_onnx(model, x.shape, path, dynamic_batch=True)
    np.testing.assert_allclose(run_ort(path, x), want, rtol=rtol, atol=atol)
    back = import_onnx(path)
    assert repr(back) == repr(model)
    np.testing.assert_array_equal(back(Tensor.from_host(queue, x)).to_host(), want)
    strip_metadata(path, tmp_path / "bare.onnx")
    bare = import_onnx(tmp_path / "bare.onnx")
    assert [type(m).__name__ for _, m in bare.chain()] == types
    np.testing.assert_allclose(bare(Tensor.from_host(queue, x)).to_host(), want, rtol=1e-6, atol=1e-6)
    return want


def check_save_load(queue, model, x, tmp_path):
    save(model, tmp_path / "m.netcl")
    back = load(tmp_path / "m.netcl").eval()
    model.eval()
    assert repr(back) == repr(model)
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(back.state_dict()[k], v)
    np.testing.assert_array_equal(back(Tensor.from_host(queue, x)).to_host(),
                                  model(Tensor.from_host(queue, x)).to_host())


def check_eval_paths(queue, model, x):
    """Sequential.eval() (the fused plan) and predict() agree with the layers' own forwards."""
    model.eval()
    with netcl.no_grad():
        h = Tensor.from_host(queue, x)
        for layer in model:
            h = layer.forward(h)
        want = h.to_host()
    np.testing.assert_allclose(model(Tensor.from_host(queue, x)).to_host(), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model.predict(x, queue), want, rtol=1e-5, atol=1e-6)


# -- BatchNorm1d --------------------------------------------------------------------------------------
def bn_pair(torch, rng, c):
    layer, ref = nn.BatchNorm1d(c, eps=1e-3, momentum=0.3), torch.nn.BatchNorm1d(c, eps=1e-3, momentum=0.3)
    sd = {"weight": rng.uniform(0.5, 1.5, c), "bias": rng.normal(size=c), "running_mean": rng.normal(size=c),
          "running_var": rng.uniform(0.5, 2.0, c)}
    layer.load_state_dict({k: v.astype(np.float32) for k, v in sd.items()})
    ref.load_state_dict({**{k: torch.tensor(v.astype(np.float32)) for k, v in sd.items()},
                         "num_batches_tracked": torch.tensor(0)})
    return layer, ref.double()


@pytest.mark.parametrize("shape", [(8, 5), (3, 6, 7), (2, 4, 1), (1, 3, 9),
                                   (40000, 3), (64, 2, 700)])  # (channels of several parts: norm.PART_LEN)
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_batchnorm1d_vs_torch(queue, rng, torch, shape, training):
    c = shape[1]
    layer, ref = bn_pair(torch, rng, c)
    layer.train(training)
    ref.train(training)
    x, dy = rand(rng, *shape) * 2 + 0.5, rand(rng, *shape)
    xt = netcl.tensor(x, queue=queue, requires_grad=True)
    y = layer(xt)
    y.backward(netcl.tensor(dy, queue=queue))
    rx = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    ry = ref(rx)
    ry.backward(torch.tensor(dy, dtype=torch.float64))
    assert y.shape == shape
    assert_close(y.numpy(), ry.detach().numpy(), 1e-5, what="forward")
    assert_close(xt.grad.numpy(), rx.grad.numpy(), 1e-5, atol=1e-5, what="dx")
    assert_close(layer.weight.grad.numpy(), ref.weight.grad.numpy(), 1e-5, what="dweight")
    assert_close(layer.bias.grad.numpy(), ref.bias.grad.numpy(), 1e-5, what="dbias")
    for k in ("running_mean", "running_var"):  # updated in training (unbiased variance), kept in eval
        assert_close(layer.state_dict()[k], getattr(ref, k).numpy(), 1e-6, what=k)


def test_batchnorm1d_refuses_other_ranks_and_one_value_per_channel(queue):
    with pytest.raises(ValueError, match="2-D input"):
        nn.BatchNorm1d(3).output_shape((2, 3, 4, 4))
    with pytest.raises(ValueError, match="3 channels"):
        nn.BatchNorm1d(3).output_shape((2, 4))
    with pytest.raises(ValueError, match="more than one value"):
        nn.BatchNorm1d(3)(Tensor.from_host(queue, np.ones((1, 3), np.float32)))


def tabular(c_in=6, hidden=12, classes=3):
    return nn.Sequential(nn.Linear(c_in, hidden), nn.BatchNorm1d(hidden), nn.ReLU(), nn.Linear(hidden, classes))


def test_tabular_mlp_trains_as_torch_step_for_step(queue, rng, torch):
    netcl.manual_seed(3)
    model = tabular()
    ref = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.BatchNorm1d(12), torch.nn.ReLU(),
                              torch.nn.Linear(12, 3)).double()
    ref.load_state_dict({k: torch.tensor(v.T if k.endswith("weight") and k[0] in "03" else v, dtype=torch.float64)
                         for k, v in model.state_dict().items()}, strict=False)
    x = rand(rng, 64, 6)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64) + (x[:, 2] > 1).astype(np.int64)
    losses = train_beside_torch(torch, queue, model, ref, x, y, steps=25, batch=16, lr=0.1)
    assert np.mean(losses[-5:]) < 0.6 * np.mean(losses[:5])


def test_batchnorm1d_saves_exports_imports_and_runs_fused(queue, rng, torch, ort, tmp_path):
    model = tabular().eval()
    model[1].load_state_dict({"weight": rng.uniform(0.5, 1.5, 12).astype(np.float32),
                              "bias": rand(rng, 12), "running_mean": rand(rng, 12),
                              "running_var": rng.uniform(0.5, 2.0, 12).astype(np.float32)})
    x = rand(rng, 5, 6)
    check_eval_paths(queue, model, x)
    check_save_load(queue, model, x, tmp_path)
    check_export_import(queue, model, x, tmp_path, ["Linear", "BatchNorm1d", "ReLU", "Linear"])
    seq = nn.Sequential(nn.BatchNorm1d(4)).eval()  # (N, C, L): BatchNormalization on a 3-D input
    seq[0].load_state_dict({"weight": rand(rng, 4), "bias": rand(rng, 4), "running_mean": rand(rng, 4),
                            "running_var": rng.uniform(0.5, 2.0, 4).astype(np.float32)})
    check_export_import(queue, seq, rand(rng, 3, 4, 7), tmp_path, ["BatchNorm1d"])


def test_batchnorm1d_from_torch(queue, rng, torch):
    ref = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.BatchNorm1d(12, eps=1e-4, momentum=0.2),
                              torch.nn.ReLU()).eval()
    with torch.no_grad():
        ref[1].running_mean.normal_()
        ref[1].running_var.uniform_(0.5, 2.0)
        ref[1].weight.normal_()
    model = nn.from_torch(ref)
    assert type(model[1]) is nn.BatchNorm1d and model[1].config() == {"num_features": 12, "eps": 1e-4,
                                                                      "momentum": 0.2}
    x = rand(rng, 4, 6)
    np.testing.assert_allclose(model.eval().predict(x, queue), ref(torch.tensor(x)).detach().numpy(), rtol=1e-5,
                               atol=1e-5)


# -- Embedding ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("padding_idx", [None, 2, -1])
@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_embedding_vs_torch_with_repeated_indices(queue, rng, torch, padding_idx, dtype):
    layer = nn.Embedding(9, 5, padding_idx=padding_idx)
    ref = torch.nn.Embedding(9, 5, padding_idx=padding_idx).double()
    with torch.no_grad():
        ref.weight.copy_(torch.tensor(layer.weight.numpy()))
    if padding_idx is not None:  # torch's row of zeros at padding_idx, and the same normalised index
        assert layer.padding_idx == ref.padding_idx and not layer.weight.numpy()[padding_idx].any()
    idx = np.array([[1, 2, 2, 8], [2, 0, 1, 2], [8, 8, 8, 3]], dtype)
    dy = rand(rng, 3, 4, 5)
    x = netcl.tensor(idx, queue=queue)
    assert x.dtype == np.int32
    y = layer(x)
    y.backward(netcl.tensor(dy, queue=queue))
    ry = ref(torch.tensor(idx.astype(np.int64)))
    ry.backward(torch.tensor(dy, dtype=torch.float64))
    assert_close(y.numpy(), ry.detach().numpy(), 1e-6, what="forward")
    assert_close(layer.weight.grad.numpy(), ref.weight.grad.numpy(), 1e-5, what="dweight")
    # a second backward accumulates, and numpy indices go straight in
    layer(idx).backward(netcl.tensor(dy, queue=queue))
    assert_close(layer.weight.grad.numpy(), 2 * ref.weight.grad.numpy(), 1e-5, what="dweight twice")


def test_embedding_backward_is_deterministic(queue, rng):
    layer = nn.Embedding(4, 33)
    idx = rng.integers(0, 4, (64, 7))
    dy = netcl.tensor(rand(rng, 64, 7, 33), queue=queue)
    grads = []
    for _ in range(3):
        layer.zero_grad()
        layer(netcl.tensor(idx, queue=queue)).backward(dy)
        grads.append(layer.weight.grad.numpy().copy())
    assert all(np.array_equal(g, grads[0]) for g in grads)


def test_embedding_refuses_indices_out_of_range_and_floats(queue):
    layer = nn.Embedding(5, 3)
    for bad in (np.array([0, 5]), np.array([[-1, 2]])):
        with pytest.raises(IndexError, match="out of range"):
            layer(bad)
        with pytest.raises(IndexError, match="out of range"):
            layer(netcl.tensor(bad, queue=queue))
    with pytest.raises(TypeError, match="integer indices"):
        layer(np.array([0.5, 1.0]))
    with pytest.raises(TypeError, match="whole numbers"):
        layer(netcl.tensor(np.array([0.5, 1.0], np.float32), queue=queue))
    with pytest.raises(ValueError):
        nn.Embedding(5, 3, padding_idx=5)
    with pytest.raises(ValueError):
        nn.Embedding(0, 3)


def test_embedding_model_trains_as_torch(queue, rng, torch):
    netcl.manual_seed(5)
    model = nn.Sequential(nn.Embedding(12, 6, padding_idx=0), nn.Flatten(), nn.Linear(18, 2))
    ref = torch.nn.Sequential(torch.nn.Embedding(12, 6, padding_idx=0), torch.nn.Flatten(),
                              torch.nn.Linear(18, 2)).double()
    ref.load_state_dict({k: torch.tensor(v.T if k == "2.weight" else v, dtype=torch.float64)
                         for k, v in model.state_dict().items()})
    idx = rng.integers(0, 12, (48, 3))
    y = (idx.sum(1) % 2).astype(np.int64)
    opt, ref_opt = optim.Adam(model.parameters(), lr=0.05), torch.optim.Adam(ref.parameters(), lr=0.05)
    losses = []
    for step in range(30):
        i = (step * 16) % 48
        loss = nn.functional.cross_entropy(model(netcl.tensor(idx[i:i + 16], queue=queue)), y[i:i + 16])
        loss.backward()
        opt.step()
        opt.zero_grad()
        ref_loss = torch.nn.functional.cross_entropy(ref(torch.tensor(idx[i:i + 16])), torch.tensor(y[i:i + 16]))
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        losses.append(loss.item())
        assert abs(loss.item() - ref_loss.item()) < 1e-3 * max(1.0, abs(ref_loss.item())), step
    assert np.mean(losses[-5:]) < 0.6 * np.mean(losses[:5])
    assert not model.state_dict()["0.weight"][0].any()  # the padding row never moved


def test_embedding_saves_exports_imports_and_runs_in_eval(queue, rng, torch, ort, tmp_path):
    model = nn.Sequential(nn.Embedding(10, 4, padding_idx=1), nn.Flatten(), nn.Linear(12, 5), nn.Tanh()).eval()
    idx = rng.integers(0, 10, (4, 3))
    want = model(netcl.tensor(idx, queue=queue)).numpy()
    np.testing.assert_allclose(model.predict(idx, queue), want, rtol=1e-6, atol=1e-6)  # (indices as floats)
    save(model, tmp_path / "m.netcl")
    back = load(tmp_path / "m.netcl").eval()
    assert repr(back) == repr(model)
    np.testing.assert_array_equal(back(netcl.tensor(idx, queue=queue)).numpy(), want)
    path = tmp_path / "m.onnx"
    export_onnx(model, idx.shape, path, dynamic_batch=True)
    m = P.ModelProto.FromString(path.read_bytes())
    assert m.graph.input[0].type.tensor_type.elem_type == P.TensorProto.INT64  # the indices, as Gather takes them
    assert m.graph.node[0].op_type == "Gather"
    np.testing.assert_allclose(run_ort(path, idx.astype(np.int64)), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(run_ort(path, idx[:1].astype(np.int64)), want[:1], rtol=1e-5, atol=1e-5)
    back = import_onnx(path)
    assert repr(back) == repr(model)
    np.testing.assert_array_equal(back(netcl.tensor(idx, queue=queue)).numpy(), want)
    strip_metadata(path, tmp_path / "bare.onnx")
    bare = import_onnx(tmp_path / "bare.onnx")  # from the nodes: Gather of a table -> Embedding
    assert [type(m).__name__ for m in bare] == ["Embedding", "Flatten", "Linear", "Tanh"]
    np.testing.assert_allclose(bare(netcl.tensor(idx, queue=queue)).numpy(), want, rtol=1e-6, atol=1e-6)


def test_embedding_after_a_layer_exports_a_cast(queue, rng, ort, tmp_path):
    model = nn.Sequential(nn.Identity(), nn.Embedding(6, 3)).eval()  # the graph input stays float
    idx = rng.integers(0, 6, (2, 5)).astype(np.float32)
    want = model.predict(idx, queue)
    export_onnx(model, idx.shape, tmp_path / "m.onnx")
    assert [n.op_type for n in P.ModelProto.FromString((tmp_path / "m.onnx").read_bytes()).graph.node] == \
        ["Cast", "Gather"]
    np.testing.assert_allclose(run_ort(tmp_path / "m.onnx", idx), want, rtol=1e-6)
    strip_metadata(tmp_path / "m.onnx", tmp_path / "bare.onnx")
    np.testing.assert_allclose(import_onnx(tmp_path / "bare.onnx").predict(idx, queue), want, rtol=1e-6)


def test_embedding_from_torch(queue, rng, torch):
    ref = torch.nn.Sequential(torch.nn.Embedding(7, 4, padding_idx=3), torch.nn.Flatten(), torch.nn.Linear(8, 2))
    model = nn.from_torch(ref)
    assert model[0].config() == {"num_embeddings": 7, "embedding_dim": 4, "padding_idx": 3}
    idx = rng.integers(0, 7, (3, 2))
    np.testing.assert_allclose(model(netcl.tensor(idx, queue=queue)).numpy(),
                               ref(torch.tensor(idx)).detach().numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(NotImplementedError, match="max_norm"):
        nn.from_torch(torch.nn.Sequential(torch.nn.Embedding(7, 4, max_norm=1.0)))


# -- ELU, Softplus, Mish, LogSoftmax, PReLU ------------------------------------------------------------
ACTIVATIONS = {  # id -> (netcl layer, torch layer, input shape)
    "elu": (lambda: nn.ELU(), lambda t: t.nn.ELU(), (3, 4, 5)),
    "elu_alpha": (lambda: nn.ELU(alpha=0.3), lambda t: t.nn.ELU(alpha=0.3), (6, 7)),
    "softplus": (lambda: nn.Softplus(), lambda t: t.nn.Softplus(), (3, 4, 5)),
    "softplus_beta": (lambda: nn.Softplus(beta=2.5, threshold=4.0), lambda t: t.nn.Softplus(2.5, 4.0), (6, 7)),
    "softplus_low_beta": (lambda: nn.Softplus(beta=0.5), lambda t: t.nn.Softplus(0.5), (2, 3, 4, 5)),
    "mish": (lambda: nn.Mish(), lambda t: t.nn.Mish(), (3, 4, 5)),
    "log_softmax_1": (lambda: nn.LogSoftmax(1), lambda t: t.nn.LogSoftmax(1), (3, 4, 5)),
    "log_softmax_last": (lambda: nn.LogSoftmax(dim=-1), lambda t: t.nn.LogSoftmax(dim=-1), (6, 7)),
    "prelu": (lambda: nn.PReLU(), lambda t: t.nn.PReLU(), (3, 4, 5)),
    "prelu_channels": (lambda: nn.PReLU(4, init=0.1), lambda t: t.nn.PReLU(4, init=0.1), (3, 4, 5)),
    "prelu_channels_2d": (lambda: nn.PReLU(7, init=0.2), lambda t: t.nn.PReLU(7, init=0.2), (6, 7)),
    "prelu_channels_4d": (lambda: nn.PReLU(3), lambda t: t.nn.PReLU(3), (2, 3, 4, 5)),
}


def act_input(rng, shape):
    x = rand(rng, *shape) * 4  # both sides of every kink, the Softplus thresholds, exp's range
    x.flat[:3] = [0.0, 25.0, -30.0]
    return x


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_vs_torch(queue, rng, torch, name):
    make, make_ref, shape = ACTIVATIONS[name]
    layer, ref = make(), make_ref(torch).double()
    if isinstance(layer, nn.PReLU):  # slopes of both signs, different per channel
        w = rng.uniform(-0.5, 0.8, layer.num_parameters).astype(np.float32)
        layer.load_state_dict({"weight": w})
        ref.load_state_dict({"weight": torch.tensor(w)})
    x, dy = act_input(rng, shape), rand(rng, *shape)
    xt = netcl.tensor(x, queue=queue, requires_grad=True)
    y = layer(xt)
    y.backward(netcl.tensor(dy, queue=queue))
    rx = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    ry = ref(rx)
    ry.backward(torch.tensor(dy, dtype=torch.float64))
    assert_close(y.numpy(), ry.detach().numpy(), 1e-6, what="forward")
    assert_close(xt.grad.numpy(), rx.grad.numpy(), 1e-5, atol=1e-6, what="dx")
    for (k, p), (rk, rp) in zip(layer.named_parameters(), ref.named_parameters()):
        assert k == rk
        assert_close(p.grad.numpy(), rp.grad.numpy(), 1e-5, what=f"d{k}")


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_saves_exports_imports_and_runs_in_eval(queue, rng, torch, ort, tmp_path, name):
    make, make_ref, shape = ACTIVATIONS[name]
    c = shape[1]
    model = nn.Sequential(nn.Linear(shape[-1], shape[-1]), make()).eval()
    if isinstance(model[1], nn.PReLU):
        model[1].load_state_dict({"weight": rng.uniform(-0.5, 0.8, model[1].num_parameters).astype(np.float32)})
    x = act_input(rng, shape)
    check_eval_paths(queue, model, x)
    check_save_load(queue, model, x, tmp_path)
    want = model(Tensor.from_host(queue, x)).to_host()
    for opset in (11, 13, 17, 18):
        path = tmp_path / f"m{opset}.onnx"
        export_onnx(model, x.shape, path, opset=opset, dynamic_batch=True)
        np.testing.assert_allclose(run_ort(path, x), want, rtol=1e-5, atol=1e-5, err_msg=f"opset {opset}")
        back = import_onnx(path)  # netcl's record of the layers
        assert repr(back) == repr(model)
        np.testing.assert_array_equal(back(Tensor.from_host(queue, x)).to_host(), want)
        strip_metadata(path, tmp_path / "bare.onnx")  # read from the nodes (a graph where they are several)
        if getattr(model[1], "threshold", 20.0) != 20.0:  # Softplus's threshold is a Where of a Greater:
            with pytest.raises(NotImplementedError, match="Greater"):  # netcl's record reads it, nodes alone not
                import_onnx(tmp_path / "bare.onnx")
            continue
        bare = import_onnx(tmp_path / "bare.onnx")
        np.testing.assert_allclose(bare(Tensor.from_host(queue, x)).to_host(), want, rtol=1e-5, atol=1e-5,
                                   err_msg=f"bare graph, opset {opset}")
    ref = torch.nn.Sequential(torch.nn.Linear(shape[-1], shape[-1]), make_ref(torch)).eval()
    from_torch = nn.from_torch(ref)
    assert repr(from_torch[1]) == repr(make()) and type(from_torch[1]) is type(model[1])
    np.testing.assert_allclose(from_torch.eval().predict(x, queue), ref(torch.tensor(x)).detach().numpy(),
                               rtol=1e-5, atol=1e-5)
    assert c  # (shape's channel dimension exists for every case)


def test_bare_graph_imports_give_the_layers(queue, rng, ort, tmp_path):
    """Without netcl's record, the nodes alone come back as the same layer types where ONNX has the op."""
    model = nn.Sequential(nn.Linear(5, 4), nn.ELU(0.5), nn.Softplus(), nn.Mish(), nn.PReLU(3), nn.LogSoftmax(-1)).eval()
    x = rand(rng, 2, 3, 5)
    want = model(Tensor.from_host(queue, x)).to_host()
    export_onnx(model, x.shape, tmp_path / "m.onnx", opset=18)
    strip_metadata(tmp_path / "m.onnx", tmp_path / "bare.onnx")
    bare = import_onnx(tmp_path / "bare.onnx")
    assert repr(bare) == repr(model)
    np.testing.assert_allclose(bare(Tensor.from_host(queue, x)).to_host(), want, rtol=1e-5, atol=1e-6)


def test_activation_arguments_are_checked():
    with pytest.raises(ValueError, match="beta"):
        nn.Softplus(beta=0)
    with pytest.raises(TypeError):
        nn.ELU(alpha="1")
    with pytest.raises(ValueError):
        nn.PReLU(0)
    with pytest.raises(ValueError, match="PReLU"):
        nn.PReLU(4).output_shape((2, 3, 5))


def test_prelu_trains_as_torch(queue, rng, torch):
    netcl.manual_seed(2)
    model = nn.Sequential(nn.Linear(4, 6), nn.PReLU(6), nn.Linear(6, 1))
    ref = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.PReLU(6), torch.nn.Linear(6, 1)).double()
    ref.load_state_dict({k: torch.tensor(v.T if k in ("0.weight", "2.weight") else v, dtype=torch.float64)
                         for k, v in model.state_dict().items()})
    x = rand(rng, 32, 4)
    y = (np.abs(x).sum(1, keepdims=True) - 2).astype(np.float32)
    opt, ref_opt = optim.SGD(model.parameters(), lr=0.05), torch.optim.SGD(ref.parameters(), lr=0.05)
    losses = []
    for step in range(20):
        loss = nn.functional.mse_loss(model(netcl.tensor(x, queue=queue)), netcl.tensor(y, queue=queue))
        loss.backward()
        opt.step()
        opt.zero_grad()
        ref_loss = torch.nn.functional.mse_loss(ref(torch.tensor(x, dtype=torch.float64)),
                                                torch.tensor(y, dtype=torch.float64))
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        losses.append(loss.item())
        assert abs(loss.item() - ref_loss.item()) < 1e-4 * max(1.0, ref_loss.item()), step
    assert losses[-1] < 0.7 * losses[0]
    assert_close(model.state_dict()["1.weight"], ref.state_dict()["1.weight"].numpy(), 1e-4, what="slopes")


@pytest.mark.parametrize("opset", [13, 17])
def test_torch_onnx_export_of_the_new_layers_imports(queue, rng, torch, tmp_path, opset):
    """A graph torch.onnx wrote (Mish as x * tanh(softplus(x)) before 18, the table's Gather): its nodes
    come back, through the graph importer, as a model that agrees with torch on int indices."""
    t = torch.nn
    ref = t.Sequential(t.Embedding(10, 4), t.Flatten(), t.Linear(12, 8), t.BatchNorm1d(8), t.ELU(0.5), t.Softplus(),
                       t.Mish(), t.PReLU(8), t.Linear(8, 3), t.LogSoftmax(1)).eval()
    with torch.no_grad():
        ref[3].running_mean.normal_()
        ref[3].running_var.uniform_(0.5, 2.0)
    idx = rng.integers(0, 10, (4, 3))
    try:
        torch.onnx.export(ref, (torch.tensor(idx),), str(tmp_path / "t.onnx"), dynamo=False, opset_version=opset,
                          input_names=["input"], output_names=["output"])
    except Exception as e:  # (as test_onnx_import_graph: an export torch cannot make here)
        pytest.skip(f"torch.onnx.export does not work here: {e}")
    model = import_onnx(tmp_path / "t.onnx")
    assert any(isinstance(m, nn.Embedding) for m in model.modules())
    np.testing.assert_allclose(model(netcl.tensor(idx, queue=queue)).numpy(), ref(torch.tensor(idx)).detach().numpy(),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["tabular", "embedding"])
def test_trainstep_replays_the_new_layers(queue, rng, case):
    """TrainStep records a step of the new layers and replays it: the same losses and weights as the
    layer calls (conftest.loop_step), step for step."""
    def make():
        netcl.manual_seed(4)
        if case == "tabular":
            return nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.PReLU(8), nn.ELU(), nn.Softplus(2.0), nn.Mish(),
                                 nn.Linear(8, 3), nn.LogSoftmax(1)).to(queue).train()
        return nn.Sequential(nn.Embedding(10, 4, padding_idx=0), nn.Flatten(), nn.Linear(12, 3)).to(queue).train()

    def batch():
        raw = rand(rng, 16, 6) if case == "tabular" else rng.integers(0, 10, (16, 3))
        x = Tensor.from_host(queue, raw) if case == "tabular" else netcl.tensor(raw, queue=queue)
        y = rng.integers(0, 3, 16)
        return x, y

    replays_as_the_loop(make, (batch() for _ in range(6)), lr=0.1)
