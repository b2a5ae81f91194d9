"""Residual, Concat and Upsample: forward (train and eval), dx and every parameter gradient
against float64 PyTorch (the torch models built by hand from the same layers, their weights
loaded by state_dict key, so the keys are PyTorch's attribute paths), nested blocks, batch 1;
.netcl round trips and checkpoint resume; ONNX export through onnxruntime; the fused plan;
and shape errors that name the failing layer's path."""
import json
import struct

import numpy as np
import pytest
from conftest import assert_close

import netcl
from netcl import FormatError, Tensor, nn, optim
from netcl.io import export_onnx, import_onnx, load, load_checkpoint, save, save_checkpoint


# -- the models ----------------------------------------------------------------------------
def resnet_like():
    # x: (N, 3, 9, 7) -> (N, 6, 5, 4): an identity block, then a stride-2 block with a Conv+BN shortcut
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
        nn.Residual(nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                    nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4)),
        nn.ReLU(),
        nn.Residual(nn.Conv2d(4, 6, 3, stride=2, padding=1), nn.BatchNorm2d(6), nn.ReLU(),
                    nn.Conv2d(6, 6, 3, padding=1), nn.BatchNorm2d(6),
                    shortcut=nn.Sequential(nn.Conv2d(4, 6, 1, stride=2, bias=False), nn.BatchNorm2d(6))),
        nn.ReLU())


def nested():
    # x: (N, 3, 8, 6) -> (N, 5, 8, 6): a Residual in a Residual's body, a Concat of Sequentials
    # holding a Residual, an Identity branch, a block with a single-layer shortcut, Upsample
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        nn.Residual(nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(), nn.Residual(nn.Conv2d(4, 4, 1), nn.Tanh()),
                    nn.BatchNorm2d(4)),
        nn.Concat(nn.Sequential(nn.Conv2d(4, 3, 1), nn.Residual(nn.Conv2d(3, 3, 3, padding=1), nn.ReLU())),
                  nn.Sequential(nn.MaxPool2d(2), nn.Conv2d(4, 2, 3, padding=1), nn.Upsample(2, "bilinear")),
                  nn.Identity(),
                  nn.Residual(nn.Conv2d(4, 2, 1), shortcut=nn.Conv2d(4, 2, 1, bias=False))),
        nn.BatchNorm2d(11), nn.Conv2d(11, 5, 1), nn.Upsample(1, "nearest"))


def concat_last_dim():
    # x: (N, 7, 6) -> (N, 7, 2): branches of different widths along dim -1
    return nn.Sequential(nn.Linear(6, 5), nn.Concat(nn.Linear(5, 4), nn.Sequential(nn.Linear(5, 3), nn.Tanh()),
                                                    nn.Identity(), dim=-1), nn.Linear(12, 2))


def concat_spatial():
    # x: (N, 3, 5, 4) -> (N, 2, 10, 8): along the width (dim -1), then the height (dim 2), upsampled
    return nn.Sequential(nn.Conv2d(3, 3, 3, padding=1),
                         nn.Concat(nn.Identity(), nn.Sequential(nn.Conv2d(3, 3, 1), nn.ReLU()), dim=-1),
                         nn.Concat(nn.Upsample(1), nn.Residual(nn.Conv2d(3, 3, 3, padding=1)), dim=2),
                         nn.Conv2d(3, 2, 1), nn.Upsample(2, "nearest"))


MODELS = {"resnet_like": (resnet_like, (2, 3, 9, 7)), "resnet_like_batch1": (resnet_like, (1, 3, 9, 7)),
          "nested": (nested, (3, 3, 8, 6)), "nested_batch1": (nested, (1, 3, 8, 6)),
          "concat_last_dim": (concat_last_dim, (2, 7, 6)), "concat_spatial": (concat_spatial, (1, 3, 5, 4))}


def torch_residual(torch, body, shortcut):
    class Residual(torch.nn.Module):  # y = body(x) + (x or shortcut(x))
        def __init__(self):
            super().__init__()
            self.body, self.shortcut = body, shortcut  # a None shortcut registers nothing

        def forward(self, x):
            return self.body(x) + (x if self.shortcut is None else self.shortcut(x))
    return Residual()


def torch_concat(torch, branches, dim):
    class Concat(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.branches = torch.nn.ModuleList(branches)

        def forward(self, x):
            return torch.cat([b(x) for b in self.branches], dim)
    return Concat()


def to_torch(torch, m):
    """The torch module with the same structure (and so the same state_dict keys) as netcl layer m."""
    T = torch.nn
    if isinstance(m, nn.Sequential):
        return T.Sequential(*[to_torch(torch, layer) for layer in m])
    if isinstance(m, nn.Residual):
        shortcut = None if m.shortcut is None else to_torch(torch, m.shortcut)
        return torch_residual(torch, to_torch(torch, m.body), shortcut)
    if isinstance(m, nn.Concat):
        return torch_concat(torch, [to_torch(torch, b) for b in m.branches.layers], m.dim)
    if isinstance(m, nn.Conv2d):
        return T.Conv2d(m.in_channels, m.out_channels, m.kernel_size, m.stride, m.padding, bias=m.bias is not None)
    if isinstance(m, nn.BatchNorm2d):
        return T.BatchNorm2d(m.num_features, m.eps, m.momentum)
    if isinstance(m, nn.Linear):
        return T.Linear(m.in_features, m.out_features, bias=m.bias is not None)
    if isinstance(m, nn.MaxPool2d):
        return T.MaxPool2d(m.kernel_size, m.stride, m.padding)
    if isinstance(m, nn.Upsample):
        return T.Upsample(scale_factor=m.scale_factor, mode=m.mode)
    return {nn.ReLU: T.ReLU, nn.Tanh: T.Tanh, nn.Identity: T.Identity}[type(m)]()


def twins(torch, build, rng):
    """(netcl model, float64 torch model) with the same weights and non-trivial BN statistics,
    loaded into netcl from torch's state_dict (which checks that the keys are torch's)."""
    model = build()
    torch.manual_seed(int(rng.integers(1 << 30)))  # torch's own initial weights: the same every run
    ref = to_torch(torch, model)
    g = torch.Generator().manual_seed(int(rng.integers(1 << 30)))
    with torch.no_grad():
        for mod in ref.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                c = mod.num_features
                mod.running_mean.copy_(torch.randn(c, generator=g) * 0.5)
                mod.running_var.copy_(torch.rand(c, generator=g) * 1.5 + 0.5)
                mod.weight.copy_(torch.rand(c, generator=g) + 0.5)
                mod.bias.copy_(torch.randn(c, generator=g) * 0.2)
    model.load_state_dict(ref.state_dict())
    return model, ref.double()


def check_against_torch(queue, torch, record_error, model, ref, x, rng):
    """Forward, dx, every parameter gradient (and, in training, the updated running statistics)."""
    y = model(Tensor.from_host(queue, x))
    dy = rng.standard_normal(y.shape).astype(np.float32)
    dx = model.backward(Tensor.from_host(queue, dy)).to_host()
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    yt = ref(xt)
    yt.backward(torch.tensor(dy, dtype=torch.float64))
    fwd = assert_close(y.to_host(), yt.detach().numpy(), what="forward")
    bwd = [assert_close(dx, xt.grad.numpy(), what="dx")]
    params = dict(ref.named_parameters())
    owned = {key: (layer, name) for key, _, layer, name in model._owned_tensors()}
    assert [k for k, _ in model.named_parameters()] == list(params)
    for key, p in model.named_parameters():
        layer, name = owned[key]
        want = layer.from_torch_layout(name, params[key].grad.numpy())  # Linear.weight is (in, out) in netcl
        # a bias before a training-mode BatchNorm has a true gradient of exactly 0: what netcl returns
        # there is the float32 rounding of a sum of N*H*W terms of order 1 that cancel (seen: 1e-5)
        atol = 1e-4 if np.abs(want).max() < 1e-9 else 1e-5
        bwd.append(assert_close(p.grad.to_host(), want, atol=atol, what=f"grad {key}"))
    buffers = dict(ref.named_buffers())
    for key, t in model.named_buffers():
        assert_close(t.to_host(), buffers[key].numpy(), what=key)
    record_error(fwd, max(bwd))


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_block_models_vs_torch(queue, rng, torch, record_error, name, mode):
    build, shape = MODELS[name]
    model, ref = twins(torch, build, rng)
    model.train(mode == "train")
    ref.train(mode == "train")
    x = rng.standard_normal(shape).astype(np.float32)
    check_against_torch(queue, torch, record_error, model, ref, x, rng)
    if mode == "train":  # a second step: gradients start afresh after zero_grad, statistics move on
        model.zero_grad()
        ref.zero_grad()
        check_against_torch(queue, torch, record_error, model, ref, x * 2 + 0.5, rng)


def test_state_dict_keys_follow_attribute_paths():
    assert list(resnet_like().state_dict())[6:8] == ["3.body.0.weight", "3.body.0.bias"]
    keys = list(nested().state_dict())
    for k in ("1.body.2.body.0.weight", "2.branches.0.1.body.0.bias", "2.branches.1.1.weight",
              "2.branches.3.body.0.weight", "2.branches.3.shortcut.weight"):
        assert k in keys
    assert {"5.shortcut.0.weight", "5.shortcut.1.running_var"} <= set(resnet_like().state_dict())
    # chain(): a block is one step of the model
    assert [type(m).__name__ for _, m in nested().chain()][1:3] == ["Residual", "Concat"]


@pytest.mark.parametrize("mode", ["nearest", "bilinear"])
@pytest.mark.parametrize("scale", [1, 2, 3])
@pytest.mark.parametrize("shape", [(2, 3, 5, 4), (1, 2, 1, 1), (1, 1, 2, 7)])
def test_upsample_vs_torch(queue, rng, torch, record_error, mode, scale, shape):
    layer = nn.Upsample(scale_factor=float(scale), mode=mode)  # torch's 2.0 is accepted as 2
    assert layer.config() == {"scale_factor": scale, "mode": mode}
    x = rng.standard_normal(shape).astype(np.float32)
    y = layer(Tensor.from_host(queue, x))
    dy = rng.standard_normal(y.shape).astype(np.float32)
    dx = layer.backward(Tensor.from_host(queue, dy)).to_host()
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    yt = torch.nn.Upsample(scale_factor=scale, mode=mode)(xt)
    yt.backward(torch.tensor(dy, dtype=torch.float64))
    # the borders (rows and columns clamped at 0 and at the last index) are where bilinear goes wrong
    record_error(assert_close(y.to_host(), yt.detach().numpy(), what="forward"),
                 assert_close(dx, xt.grad.numpy(), what="dx"))


# -- the fused path --------------------------------------------------------------------------
def _sequentials(layer):
    if isinstance(layer, nn.Sequential):
        yield layer
    for _, child in layer.named_children():
        yield from _sequentials(child)


@pytest.mark.parametrize("name", ["resnet_like", "nested", "concat_spatial"])
def test_fused_plan_of_a_model_with_blocks_equals_the_unfused_forward(queue, rng, torch, name):
    build, shape = MODELS[name]
    model, _ = twins(torch, build, rng)
    model.eval()
    assert model._fused is not None
    x = rng.standard_normal(shape).astype(np.float32)
    fused = model(Tensor.from_host(queue, x)).to_host()
    assert np.array_equal(model.predict(x), fused)
    for s in _sequentials(model):  # every Sequential, the blocks' bodies included, unfused
        s._fused = None
    plain = model(Tensor.from_host(queue, x)).to_host()
    assert_close(fused, plain, what="fused vs unfused")


# -- files -------------------------------------------------------------------------------
def _header(path):
    blob = path.read_bytes()
    _, _, hlen = struct.unpack_from("<8sII", blob)
    return json.loads(blob[16:16 + hlen])


@pytest.mark.parametrize("name", ["resnet_like", "nested", "concat_last_dim"])
def test_round_trip_of_composite_models(queue, rng, torch, tmp_path, name):
    build, shape = MODELS[name]
    model, _ = twins(torch, build, rng)
    save(model, tmp_path / "m.netcl")
    back = load(tmp_path / "m.netcl")
    assert repr(back) == repr(model)
    want, got = model.state_dict(), back.state_dict()
    assert list(got) == list(want) and all(np.array_equal(got[k], want[k]) for k in want)
    x = rng.standard_normal(shape).astype(np.float32)
    assert np.array_equal(model.eval()(Tensor.from_host(queue, x)).to_host(),
                          back.eval()(Tensor.from_host(queue, x)).to_host())
    save(back.train(), tmp_path / "again.netcl")
    assert (tmp_path / "again.netcl").read_bytes() == (tmp_path / "m.netcl").read_bytes()


def test_file_header_nests_the_architecture(tmp_path):
    save(nested(), tmp_path / "m.netcl")
    arch = _header(tmp_path / "m.netcl")["architecture"]
    block = arch[1]
    assert block["type"] == "Residual" and block["config"] == {} and [c[0] for c in block["children"]] == ["body"]
    assert block["children"][0][1]["children"][2][1]["type"] == "Residual"
    concat = arch[2]
    assert concat["type"] == "Concat" and concat["config"] == {"dim": 1}
    (name, branches), = concat["children"]
    assert name == "branches" and branches["type"] == "ModuleList"
    assert [c[1]["type"] for c in branches["children"]] == ["Sequential", "Sequential", "Identity", "Residual"]
    assert [c[0] for c in branches["children"][3][1]["children"]] == ["body", "shortcut"]
    up = branches["children"][1][1]["children"][2][1]
    assert up == {"type": "Upsample", "config": {"scale_factor": 2, "mode": "bilinear"}}


def _edited(path, edit):
    """The file at `path` with its header edited (the checksum recomputed, as an attacker would)."""
    import hashlib

    from netcl.io import netcl_format as fmt

    blob = path.read_bytes()
    _, version, hlen = struct.unpack_from("<8sII", blob)
    header = json.loads(blob[16:16 + hlen])
    edit(header)
    text = json.dumps(header).encode()
    text += b" " * (-(16 + len(text)) % 64)
    body = struct.pack("<8sII", fmt.MAGIC, version, len(text)) + text + blob[16 + hlen:-32]
    path.write_bytes(body + hashlib.sha256(body).digest())


@pytest.mark.parametrize("edit,message", [
    (lambda h: h["architecture"][1]["children"].append(["junk", {"type": "ReLU", "config": {}}]), "children"),
    (lambda h: h["architecture"][1]["children"].pop(), "Residual"),
    (lambda h: h["architecture"][2]["children"][0][1].update(type="Sequential"), "ModuleList"),
    (lambda h: h["architecture"][2]["config"].update(dim=0), "batch dimension"),
    (lambda h: h["architecture"][5].update(config={"mode": "bicubic"}), "mode"),
    (lambda h: h["architecture"][5].update(config={"mode": 3}), "mode"),
    (lambda h: h["architecture"][4].update(config={"in_channels": "x", "out_channels": 5, "kernel_size": 1}),
     "expected a finite number"),
])
def test_corrupt_block_entries_raise_format_error(tmp_path, edit, message):
    save(nested(), tmp_path / "m.netcl")
    _edited(tmp_path / "m.netcl", edit)
    with pytest.raises(FormatError, match=message):
        load(tmp_path / "m.netcl")


def small_net():
    # x: (N, 1, 8, 8) -> (N, 10)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.Residual(nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU()),
                         nn.Concat(nn.Identity(), nn.Sequential(nn.MaxPool2d(2), nn.Upsample(2, "bilinear"))),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Dropout(0.2), nn.Linear(8 * 4 * 4, 10))


def _train(queue, model, opt, x, labels, steps, start):
    loss_fn, losses = nn.CrossEntropyLoss(), []
    for s in range(start, start + steps):
        i = (s * 16) % len(x)
        losses.append(loss_fn(model(Tensor.from_host(queue, x[i:i + 16])), labels[i:i + 16]))
        model.backward(loss_fn.backward())
        opt.step()
        opt.zero_grad()
    return losses


def test_checkpoint_of_a_model_with_blocks_resumes_exactly(queue, tmp_path):
    gen = np.random.default_rng(0)
    x, labels = gen.standard_normal((64, 1, 8, 8)).astype(np.float32), gen.integers(0, 10, 64)
    netcl.manual_seed(3)
    model = small_net()
    straight = _train(queue, model, optim.Adam(model.parameters(), lr=3e-3), x, labels, 6, 0)
    final = model.state_dict()
    assert straight[-1] < straight[0]

    netcl.manual_seed(3)
    model = small_net()
    opt = optim.Adam(model.parameters(), lr=3e-3)
    first = _train(queue, model, opt, x, labels, 3, 0)
    save_checkpoint(tmp_path / "c.netcl", model, opt, epoch=1)
    del model, opt
    netcl.manual_seed(99)
    model, opt, _ = load_checkpoint(tmp_path / "c.netcl")
    second = _train(queue, model, opt, x, labels, 3, 3)
    assert first + second == straight
    for k, a in model.state_dict().items():
        assert np.array_equal(a, final[k]), k


# -- ONNX ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["resnet_like", "nested", "concat_last_dim", "concat_spatial"])
def test_export_matches_onnxruntime_at_two_batch_sizes(queue, rng, torch, tmp_path, record_error, name):
    ort = pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    build, shape = MODELS[name]
    model, _ = twins(torch, build, rng)
    model.eval()
    path = tmp_path / "m.onnx"
    export_onnx(model, shape, path, dynamic_batch=True)
    proto = onnx.load(str(path))
    onnx.checker.check_model(proto, full_check=True)
    inits = {i.name for i in proto.graph.initializer}
    assert set(model.state_dict()) <= inits  # initializers are named as in the state_dict
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    worst = 0.0
    for n in (1, 4):
        x = rng.standard_normal((n,) + shape[1:]).astype(np.float32)
        want = model(Tensor.from_host(queue, x)).to_host()
        got = sess.run(None, {"input": x})[0]
        worst = max(worst, float(np.abs(got - want).max()))
    assert worst <= 1e-5, worst
    record_error(worst)
    back = import_onnx(path)  # netcl's own file comes back as the same blocks and weights
    assert repr(back) == repr(model)
    assert all(np.array_equal(a, b) for a, b in zip(back.state_dict().values(), model.state_dict().values()))


@pytest.mark.parametrize("mode", ["nearest", "bilinear"])
def test_upsample_export_reproduces_torch_semantics(queue, rng, tmp_path, mode):
    """Resize's coordinate modes: asymmetric + floor (nearest) and half_pixel (bilinear) are
    what PyTorch computes; scale 3 on odd sizes shows any other choice at once."""
    ort = pytest.importorskip("onnxruntime")
    model = nn.Sequential(nn.Conv2d(2, 3, 1), nn.Upsample(3, mode)).eval()
    export_onnx(model, (1, 2, 5, 3), tmp_path / "m.onnx", dynamic_batch=True)
    sess = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    for n in (1, 3):
        x = rng.standard_normal((n, 2, 5, 3)).astype(np.float32)
        got = sess.run(None, {"input": x})[0]
        assert np.abs(got - model(Tensor.from_host(queue, x)).to_host()).max() <= 1e-5


def test_export_names_nodes_after_state_dict_paths(rng, tmp_path):
    onnx = pytest.importorskip("onnx")
    export_onnx(nested().eval(), (1, 3, 8, 6), tmp_path / "m.onnx")
    g = onnx.load(str(tmp_path / "m.onnx")).graph
    nodes = {n.name: n for n in g.node}
    for name in ("1.body.0.Conv", "1.body.2.body.0.Conv", "1.body.2.Add", "1.Add", "2.branches.0.1.Add",
                 "2.branches.1.2.Resize", "2.branches.3.shortcut.Conv", "2.Concat"):
        assert name in nodes, name
    assert list(nodes["2.Concat"].input) == ["2.branches.0.1.Residual", "2.branches.1.2.Upsample", "1.Residual",
                                              "2.branches.3.Residual"]
    assert nodes["2.Concat"].attribute[0].i == 1
    resize = {a.name: a.s.decode() for a in nodes["2.branches.1.2.Resize"].attribute if a.type == a.STRING}
    assert resize == {"mode": "linear", "coordinate_transformation_mode": "half_pixel"}
    resize = {a.name: a.s.decode() for a in nodes["5.Resize"].attribute if a.type == a.STRING}
    assert resize == {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}


# -- errors --------------------------------------------------------------------------------
def _bad_body():
    return nn.Sequential(nn.ReLU(), nn.ReLU(), nn.ReLU(), nn.Residual(nn.Conv2d(3, 4, 3, stride=2, padding=1)))


def _bad_inner():
    return nn.Sequential(nn.Conv2d(3, 4, 1), nn.Concat(nn.Identity(), nn.Sequential(
        nn.ReLU(), nn.Residual(nn.Conv2d(5, 4, 3, padding=1)))))


def _bad_concat():
    return nn.Sequential(nn.Conv2d(3, 4, 1), nn.Concat(nn.Identity(), nn.MaxPool2d(2)))


def _bad_shortcut():
    return nn.Sequential(nn.Conv2d(3, 4, 1), nn.Residual(nn.Conv2d(4, 6, 1), shortcut=nn.Conv2d(4, 5, 1)))


ERRORS = {"body changes the shape": (_bad_body, r"layer 3 \(Residual\): the body maps"),
          "inner layer": (_bad_inner, r"layer 1\.branches\.1\.1\.body\.0 \(Conv2d\): Conv2d expects 5"),
          "concat off-axis": (_bad_concat, r"layer 1 \(Concat\): the branches disagree off the concat axis"),
          "shortcut": (_bad_shortcut, r"layer 1 \(Residual\): the body gives \(2, 6, 6, 6\) but the shortcut")}


@pytest.mark.parametrize("case", sorted(ERRORS))
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_shape_errors_name_the_layer_path(queue, tmp_path, case, mode):
    build, message = ERRORS[case]
    model = build().train(mode == "train")
    shape = (2, 3, 6, 6)
    with pytest.raises(ValueError, match=message):
        model.output_shape(shape)
    with pytest.raises(ValueError, match=message):
        model(Tensor.from_host(queue, np.zeros(shape, np.float32)))
    with pytest.raises(ValueError, match=message):
        export_onnx(model.eval(), shape, tmp_path / "m.onnx")
    assert not (tmp_path / "m.onnx").exists()


def test_bad_arguments():
    with pytest.raises(TypeError, match="shortcut"):
        nn.Residual(nn.ReLU(), shortcut="conv")
    with pytest.raises(TypeError, match="argument 0"):
        nn.Residual(np.zeros(3))
    with pytest.raises(ValueError, match="at least one branch"):
        nn.Concat()
    with pytest.raises(ValueError, match="batch dimension"):
        nn.Concat(nn.ReLU(), dim=0)
    with pytest.raises(TypeError, match="dim"):
        nn.Concat(nn.ReLU(), dim=1.5)
    with pytest.raises(ValueError, match="not a non-batch axis"):
        nn.Concat(nn.ReLU(), dim=4).output_shape((2, 3, 4, 4))
    with pytest.raises(ValueError, match="not a non-batch axis"):
        nn.Concat(nn.ReLU(), dim=-4).output_shape((2, 3, 4, 4))
    with pytest.raises(ValueError, match="differ in rank"):
        nn.Concat(nn.Identity(), nn.Flatten()).output_shape((2, 3, 4, 4))
    with pytest.raises(ValueError, match="integer scale"):
        nn.Upsample(1.5)
    with pytest.raises(ValueError, match=">= 1"):
        nn.Upsample(0)
    with pytest.raises(ValueError, match="'nearest', 'bilinear'"):
        nn.Upsample(2, mode="bicubic")
    with pytest.raises(ValueError, match="4-D"):
        nn.Upsample(2).output_shape((2, 3, 4))
    with pytest.raises(ValueError, match="not applied"):
        nn.Sequential(nn.ModuleList(nn.ReLU())).output_shape((1, 2))


@pytest.mark.parametrize("k,stride,shape", [(1, 2, (2, 3, 7, 9)), (1, 1, (1, 4, 5, 6)), (1, 3, (2, 2, 8, 7)),
                                            (3, 2, (2, 3, 7, 9))])
def test_conv_backward_into_adds_its_gradient(queue, rng, k, stride, shape):
    """Conv2d.backward_into(dy, acc): acc + backward(dy) (a 1x1 conv without padding adds its
    columns into acc on CPUs: col2im_1x1_add_cpu, every stride; others take backward() and a sum),
    and the parameter gradients of backward()."""
    layer = nn.Conv2d(shape[1], 5, k, stride=stride, padding=k // 2).to(queue).train()
    x = Tensor.from_host(queue, rng.standard_normal(shape).astype(np.float32))
    dy = rng.standard_normal(layer.output_shape(shape)).astype(np.float32)
    acc0 = rng.standard_normal(shape).astype(np.float32)
    layer(x)
    dx = layer.backward(Tensor.from_host(queue, dy)).to_host()
    grads = {n: p.grad.to_host() for n, p in layer.named_parameters()}
    layer.zero_grad()
    layer(x)
    acc = Tensor.from_host(queue, acc0)
    assert layer.backward_into(Tensor.from_host(queue, dy), acc) is acc
    np.testing.assert_allclose(acc.to_host(), acc0 + dx, rtol=1e-6, atol=1e-6)
    for n, p in layer.named_parameters():
        np.testing.assert_array_equal(p.grad.to_host(), grads[n])


def test_residual_with_a_pass_through_body_does_not_write_into_dy(queue, rng, torch, record_error):
    """A Residual whose body hands dy back (Identity) sums into a new tensor and leaves the caller's
    dy as it was: the shortcut's gradient is added into the body's only where that is a tensor of
    its own."""
    def build():
        return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.Residual(nn.Identity(),
                             shortcut=nn.Sequential(nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4))), nn.ReLU())
    model, ref = twins(torch, build, rng)
    check_against_torch(queue, torch, record_error, model, ref, rng.standard_normal((2, 3, 6, 5)).astype(np.float32),
                        rng)
    block = model.layers[1]
    x = Tensor.from_host(queue, rng.standard_normal((2, 4, 6, 5)).astype(np.float32))
    g = rng.standard_normal((2, 4, 6, 5)).astype(np.float32)
    dy = Tensor.from_host(queue, g)
    block(x)
    dx = block.backward(dy)
    np.testing.assert_array_equal(dy.to_host(), g)
    assert dx.buf.int_ptr != dy.buf.int_ptr
