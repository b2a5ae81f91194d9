"""LSTM and GRU: outputs, final states and every gradient against float64 PyTorch (layers, directions,
batch_first, initial states, bias); models trained beside torch step for step; state dicts both ways,
.netcl files, TrainStep, eval()/predict; ONNX export checked by onnxruntime, imports back, from_torch."""
import numpy as np
import pytest
from conftest import assert_close

import netcl
from netcl import nn, optim


def host(t):
    return t.detach().numpy() if hasattr(t, "detach") else t.numpy()


def pair(torch, queue, rng, kind, **kw):
    """A netcl layer and a float64 torch one holding the same (torch's) weights."""
    ref = getattr(torch.nn, kind)(**kw).double()
    for p in ref.parameters():  # (larger than torch's default, so that every gate saturates somewhere)
        p.data = torch.tensor(rng.uniform(-0.6, 0.6, p.shape))
    layer = getattr(nn, kind)(**kw)
    layer.load_state_dict(ref.state_dict())
    return layer, ref


def states(out):
    """(h_n, c_n) of a call's result, c_n None for a GRU's."""
    return (out[1][0], out[1][1]) if isinstance(out[1], tuple) else (out[1], None)


CASES = [  # num_layers, bidirectional, batch_first, initial states, bias
    (1, False, False, False, True),
    (1, False, True, True, True),
    (2, False, False, True, False),
    (1, True, False, False, True),
    (2, True, True, True, True),
    (2, True, False, False, False),
]


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
@pytest.mark.parametrize("layers,bidirectional,batch_first,init,bias", CASES)
def test_rnn_vs_torch(queue, rng, torch, record_error, kind, layers, bidirectional, batch_first, init, bias):
    T, B, I, H = 5, 3, 4, 6
    D = 2 if bidirectional else 1
    layer, ref = pair(torch, queue, rng, kind, input_size=I, hidden_size=H, num_layers=layers, bias=bias,
                      batch_first=batch_first, bidirectional=bidirectional)
    x = rng.standard_normal((B, T, I) if batch_first else (T, B, I))
    xn = netcl.tensor(x.astype(np.float32), queue=queue, requires_grad=True)
    xt = torch.tensor(x, requires_grad=True)
    hx, hxt, leaves = None, None, []
    if init:
        h0, c0 = rng.standard_normal((2, layers * D, B, H))
        leaves = [(netcl.tensor(a.astype(np.float32), queue=queue, requires_grad=True),
                   torch.tensor(a, requires_grad=True)) for a in ((h0, c0) if kind == "LSTM" else (h0,))]
        hx = tuple(n for n, _ in leaves) if kind == "LSTM" else leaves[0][0]
        hxt = tuple(t for _, t in leaves) if kind == "LSTM" else leaves[0][1]
    out, out_t = layer(xn, hx), ref(xt, hxt)
    got = [out[0], *(s for s in states(out) if s is not None)]
    want = [out_t[0], *(s for s in states(out_t) if s is not None)]
    assert out[0].shape == (B, T, D * H) if batch_first else (T, B, D * H)
    fwd = max(assert_close(host(g), host(w), 1e-5, 1e-6, what="forward") for g, w in zip(got, want))
    # a weighted sum of every output, so that each one's gradient is checked
    weights = [rng.standard_normal(g.shape) for g in got]
    loss = sum((g * netcl.tensor(w.astype(np.float32), queue=queue)).sum() for g, w in zip(got, weights))
    loss_t = sum((g * torch.tensor(w)).sum() for g, w in zip(want, weights))
    loss.backward()
    loss_t.backward()
    bwd = assert_close(host(xn.grad), host(xt.grad), 1e-5, 1e-6, what="dx")
    ref_params = dict(ref.named_parameters())
    assert [k for k, _ in layer.named_parameters()] == list(ref_params)
    for k, p in layer.named_parameters():
        bwd = max(bwd, assert_close(host(p.grad), host(ref_params[k].grad), 1e-5, 1e-6, what=k))
    for n, t in leaves:
        bwd = max(bwd, assert_close(host(n.grad), host(t.grad), 1e-5, 1e-6, what="initial state"))
    record_error(fwd, bwd)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
@pytest.mark.parametrize("config,size", [("gpu", (5, 9)), ("gpu", (4, 16)), ("native", (40, 72)), ("native", (6, 20)),
                                         ("native", (8, 32))])
def test_rnn_gemm_routes_and_vector_widths(queue, rng, torch, monkeypatch, kind, config, size):
    """The GPU class (gemm_tile, rnn.cl a hidden unit per work-item) forced on the test device, and on
    CPUs layers whose hidden size takes rnn.cl's vectors of 8, 4 and 16 (as the device's lanes allow)
    and the CPU GEMM's routes for larger layers: outputs and gradients as torch's."""
    from netcl import ops

    if config == "gpu":
        monkeypatch.setattr(ops, "_config_class", {queue.device.int_ptr: "gpu"})
    layer, ref = pair(torch, queue, rng, kind, input_size=size[0], hidden_size=size[1], num_layers=2,
                      bidirectional=True, batch_first=True)
    x = rng.standard_normal((3, 6, size[0])) * 0.5
    xn, xt = netcl.tensor(x.astype(np.float32), queue=queue, requires_grad=True), torch.tensor(x, requires_grad=True)
    out, out_t = layer(xn), ref(xt)
    assert_close(out[0].numpy(), host(out_t[0]), 1e-5, 1e-6)
    (out[0].sum() + states(out)[0].sum()).backward()
    (out_t[0].sum() + states(out_t)[0].sum()).backward()
    assert_close(xn.grad.numpy(), host(xt.grad), 1e-5, 1e-6)
    for k, p in dict(ref.named_parameters()).items():
        assert_close(dict(layer.named_parameters())[k].grad.numpy(), host(p.grad), 1e-5, 1e-6, what=k)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_rnn_unbatched_and_one_step(queue, rng, torch, kind):
    """Unbatched input (L, H_in) and states (layers * D, H), and a sequence of one step, as torch."""
    layer, ref = pair(torch, queue, rng, kind, input_size=3, hidden_size=4, num_layers=2, bidirectional=True)
    for shape in ((6, 3), (1, 2, 3)):
        x = rng.standard_normal(shape)
        out, out_t = layer(netcl.tensor(x.astype(np.float32), queue=queue)), ref(torch.tensor(x))
        assert_close(out[0].numpy(), host(out_t[0]), 1e-5, 1e-6)
        assert_close(states(out)[0].numpy(), host(states(out_t)[0]), 1e-5, 1e-6)


def test_rnn_only_outputs_used_and_frozen_weights(queue, rng, torch):
    """A loss of h_n alone (no gradient reaches the output sequence) and a layer whose weights are
    frozen: the input's gradient still agrees with torch."""
    layer, ref = pair(torch, queue, rng, "LSTM", input_size=3, hidden_size=5, num_layers=2)
    layer.requires_grad_(False)
    ref.requires_grad_(False)
    x = rng.standard_normal((4, 2, 3))
    xn, xt = netcl.tensor(x.astype(np.float32), queue=queue, requires_grad=True), torch.tensor(x, requires_grad=True)
    layer(xn)[1][0].sum().backward()
    ref(xt)[1][0].sum().backward()
    assert_close(xn.grad.numpy(), host(xt.grad), 1e-5, 1e-6)
    assert all(p.grad is None for p in layer.parameters())


def test_rnn_dropout_between_layers(queue, rng, torch):
    """dropout acts between layers in training only: eval agrees with torch; in training the outputs
    differ from eval's and the gradient of the second layer's input is masked (h_n of the first layer
    is untouched by it)."""
    layer, ref = pair(torch, queue, rng, "GRU", input_size=3, hidden_size=8, num_layers=2, dropout=0.5)
    x = rng.standard_normal((5, 4, 3))
    layer.eval()
    ref.eval()
    want = host(ref(torch.tensor(x))[0])
    assert_close(layer(netcl.tensor(x.astype(np.float32), queue=queue))[0].numpy(), want, 1e-5, 1e-6)
    layer.train()
    out, hn = layer(netcl.tensor(x.astype(np.float32), queue=queue))
    assert np.abs(out.numpy() - want).max() > 1e-2
    assert_close(hn.numpy()[0], host(ref(torch.tensor(x))[1])[0], 1e-5, 1e-6)  # the first layer's: no dropout


def test_rnn_arguments_are_checked(queue):
    with pytest.raises(NotImplementedError, match="proj_size"):
        nn.LSTM(3, 4, proj_size=2)
    with pytest.raises(TypeError):
        nn.GRU(3, 4, proj_size=2)
    with pytest.raises(ValueError, match="input_size"):
        nn.LSTM(0, 4)
    with pytest.raises(TypeError, match="bidirectional"):
        nn.GRU(3, 4, bidirectional=1)
    with pytest.raises(ValueError, match="dropout"):
        nn.LSTM(3, 4, dropout=1.5)
    lstm = nn.LSTM(3, 4, num_layers=2)
    x = netcl.tensor(np.zeros((5, 2, 3), np.float32), queue=queue)
    with pytest.raises(ValueError, match=r"expected input of shape \(L, N, 3\)"):
        lstm(netcl.tensor(np.zeros((5, 2, 4), np.float32), queue=queue))
    with pytest.raises(ValueError, match=r"h_0\) of shape \(2, 2, 4\)"):
        lstm(x, (netcl.tensor(np.zeros((1, 2, 4), np.float32)), netcl.tensor(np.zeros((2, 2, 4), np.float32))))
    with pytest.raises(TypeError, match=r"tuple \(h_0, c_0\)"):
        lstm(x, netcl.tensor(np.zeros((2, 2, 4), np.float32)))
    with pytest.raises(ValueError, match="at least one step"):
        lstm(netcl.tensor(np.zeros((0, 2, 3), np.float32), queue=queue))
    with pytest.raises(TypeError, match="GRU: hx must be a tensor"):
        nn.GRU(3, 4)(x, (None, None))


# -- models ---------------------------------------------------------------------------------------
class SeqClassifier(nn.Module):
    # idx: (N, L) -> (N, classes); the last step of the recurrent layer's output through a Linear
    def __init__(self, kind, vocab=10, emb=6, hidden=8, classes=3, bidirectional=False):
        super().__init__()
        self.emb = nn.Embedding(vocab, emb)
        self.rnn = getattr(nn, kind)(emb, hidden, batch_first=True, bidirectional=bidirectional)
        self.fc = nn.Linear(hidden * (2 if bidirectional else 1), classes)

    def forward(self, x):
        out, _ = self.rnn(self.emb(x))
        return self.fc(out[:, -1])


def torch_classifier(torch, kind, vocab=10, emb=6, hidden=8, classes=3, bidirectional=False):
    class Ref(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(vocab, emb)
            self.rnn = getattr(torch.nn, kind)(emb, hidden, batch_first=True, bidirectional=bidirectional)
            self.fc = torch.nn.Linear(hidden * (2 if bidirectional else 1), classes)

        def forward(self, x):
            out, _ = self.rnn(self.emb(x))
            return self.fc(out[:, -1])
    return Ref().double()


def to_torch_state(torch, model):
    """netcl's state dict in torch's layouts: Linear weights transposed, the recurrent layers' as they are."""
    linears = {p for p, m in model.named_modules() if isinstance(m, nn.Linear)}
    return {k: torch.tensor(v.T if k.rpartition(".")[0] in linears and k.endswith("weight") else v,
                            dtype=torch.float64) for k, v in model.state_dict().items()}


@pytest.mark.parametrize("kind,bidirectional", [("LSTM", False), ("GRU", True)])
def test_classifier_trains_as_torch_step_for_step(queue, rng, torch, kind, bidirectional):
    netcl.manual_seed(3)
    model = SeqClassifier(kind, bidirectional=bidirectional)
    ref = torch_classifier(torch, kind, bidirectional=bidirectional)
    ref.load_state_dict(to_torch_state(torch, model))
    idx = rng.integers(0, 10, (48, 7))
    y = (idx[:, -1] % 3).astype(np.int64)  # the last token decides: learnable from the last step
    opt, ref_opt = optim.Adam(model.parameters(), lr=0.03), torch.optim.Adam(ref.parameters(), lr=0.03)
    losses = []
    for step in range(25):
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
        assert abs(loss.item() - ref_loss.item()) < 1e-4 * max(1.0, abs(ref_loss.item())), step
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5])
    want = to_torch_state(torch, model)
    for k, v in ref.state_dict().items():
        assert_close(want[k].numpy(), v.numpy(), 1e-4, 1e-5, what=k)


def test_classifier_trains_with_trainstep(queue, rng, torch):
    """TrainStep (recorded, compared, then replayed) gives the losses of the plain loop."""
    from netcl.trainstep import TrainStep

    idx = rng.integers(0, 10, (32, 6))
    y = (idx[:, -1] % 3).astype(np.int64)
    losses = []
    for use_step in (False, True):
        netcl.manual_seed(4)
        model = SeqClassifier("LSTM")
        opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        step = TrainStep(model, nn.CrossEntropyLoss(), opt) if use_step else None
        run = []
        for s in range(6):
            i = (s * 16) % 32
            xb = netcl.tensor(idx[i:i + 16], queue=queue)
            if step is not None:
                run.append(float(step(xb, y[i:i + 16])))
            else:
                loss = nn.functional.cross_entropy(model(xb), y[i:i + 16])
                loss.backward()
                opt.step()
                opt.zero_grad()
                run.append(loss.item())
        losses.append(run)
    assert step.replays > 0 and step.eager_reason is None
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_state_dict_both_ways(queue, rng, torch, kind):
    """A torch module's state dict loads as it is (torch tensors or numpy arrays: the layouts are torch's),
    and netcl's loads into torch; each side then computes the other's outputs. hidden_size == input_size
    makes W_hh and W_ih's gate blocks square: a transposed block would load without a shape error."""
    ref = getattr(torch.nn, kind)(5, 5, num_layers=2, bidirectional=True).double()
    layer = getattr(nn, kind)(5, 5, num_layers=2, bidirectional=True)
    assert list(layer.state_dict()) == list(ref.state_dict())
    assert all(v.shape == tuple(ref.state_dict()[k].shape) for k, v in layer.state_dict().items())
    x = rng.standard_normal((4, 2, 5))
    layer.load_state_dict(ref.state_dict())
    assert_close(layer(netcl.tensor(x.astype(np.float32), queue=queue))[0].numpy(), host(ref(torch.tensor(x))[0]),
                 1e-5, 1e-6)
    layer.load_state_dict({k: v.numpy().astype(np.float32) for k, v in ref.state_dict().items()})
    assert_close(layer(netcl.tensor(x.astype(np.float32), queue=queue))[0].numpy(), host(ref(torch.tensor(x))[0]),
                 1e-5, 1e-6)
    fresh = getattr(nn, kind)(5, 5, num_layers=2, bidirectional=True)
    ref.load_state_dict({k: torch.tensor(v, dtype=torch.float64) for k, v in fresh.state_dict().items()})
    assert_close(fresh(netcl.tensor(x.astype(np.float32), queue=queue))[0].numpy(), host(ref(torch.tensor(x))[0]),
                 1e-5, 1e-6)


class LastState(nn.Module):
    # x: (L, N, 3) -> (N, 2); the top layer's h_n and c_n (torch's idiom h_n[-1]) through a Linear
    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(3, 5, num_layers=2, dropout=0.2)
        self.fc = nn.Linear(5, 2)

    def forward(self, x):
        out, (h, c) = self.rnn(x)
        return self.fc(h[-1] + c[-1])


@pytest.mark.parametrize("build,shape", [(lambda: SeqClassifier("LSTM", bidirectional=True), (3, 6)),
                                         (lambda: SeqClassifier("GRU"), (3, 6)), (LastState, (6, 3, 3))])
def test_models_save_load_and_predict(queue, rng, tmp_path, build, shape):
    """eval() and predict() give the layer calls' outputs; a .netcl file (the traced graph) gives them back."""
    from netcl.io import load, save

    model = build().eval()
    x = rng.integers(0, 10, shape) if len(shape) == 2 else rng.standard_normal(shape).astype(np.float32)
    want = model(netcl.tensor(x, queue=queue)).numpy()
    np.testing.assert_allclose(model.predict(x, queue), want, rtol=1e-6, atol=1e-6)
    save(model, tmp_path / "m.netcl")
    back = load(tmp_path / "m.netcl").eval()
    np.testing.assert_array_equal(back.predict(x, queue), want)
    assert back.state_dict().keys() == model.state_dict().keys()
    back.train()  # the loaded graph trains: its recurrent layer's call records on the tape
    back(netcl.tensor(x, queue=queue)).sum().backward()
    assert all(p.grad is not None for p in back.parameters())


class WithInitialState(nn.Module):
    # x: (L, 3, 4) -> (L, 3, 10); a bidirectional GRU started from a learned state (a parameter)
    def __init__(self):
        super().__init__()
        self.h0 = nn.Parameter(np.random.default_rng(7).uniform(-1, 1, (4, 3, 5)).astype(np.float32))
        self.rnn = nn.GRU(4, 5, num_layers=2, bidirectional=True)

    def forward(self, x):
        return self.rnn(x, self.h0)[0]


def run_ort(ort, path, x):
    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    inp = s.get_inputs()[0]
    return s.run(None, {inp.name: x.astype(np.int64 if "int" in inp.type else np.float32)})[0]


EXPORTS = [(lambda: SeqClassifier("LSTM", bidirectional=True), (3, 6), ["LSTM"]),
           (lambda: SeqClassifier("GRU"), (3, 6), ["GRU"]),
           (LastState, (6, 3, 3), ["LSTM", "LSTM"]),
           (WithInitialState, (5, 3, 4), ["GRU", "GRU"])]


@pytest.mark.parametrize("opset", [13, 17, 21])
@pytest.mark.parametrize("build,shape,rnn_nodes", EXPORTS)
def test_onnx_export_runs_in_onnxruntime(queue, rng, ort, tmp_path, opset, build, shape, rnn_nodes):
    """An ONNX LSTM/GRU node per layer, its weights in ONNX's gate order, agreeing with netcl in
    onnxruntime; onnx.checker accepts the file."""
    onnx = pytest.importorskip("onnx")
    from netcl.io import export_onnx

    model = build().eval()
    x = rng.integers(0, 10, shape) if len(shape) == 2 else rng.standard_normal(shape).astype(np.float32)
    want = model.predict(x, queue)
    path = tmp_path / "m.onnx"
    export_onnx(model, shape, path, opset=opset, dynamic_batch=True)
    proto = onnx.load(str(path))
    onnx.checker.check_model(proto, full_check=True)
    nodes = [n for n in proto.graph.node if n.op_type in ("LSTM", "GRU")]
    assert [n.op_type for n in nodes] == rnn_nodes
    for n in nodes:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        assert attrs.get("linear_before_reset", 1) == 1
    assert_close(run_ort(ort, path, x), want, 1e-5, 1e-5)


class SeqRegressor(nn.Module):
    # x: (N, L, 3) -> (N, 2); a batch-first two-layer LSTM's last step through a Linear
    def __init__(self, kind="LSTM"):
        super().__init__()
        self.rnn = getattr(nn, kind)(3, 6, num_layers=2, batch_first=True)
        self.fc = nn.Linear(6, 2)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.fc(out[:, -1])


@pytest.mark.parametrize("opset", [13, 17, 21])
@pytest.mark.parametrize("build,shape", [(SeqRegressor, (2, 5, 3)), (lambda: SeqRegressor("GRU"), (2, 5, 3)),
                                         (LastState, (2, 3, 3)), (WithInitialState, (2, 3, 4))])
def test_onnx_import_of_netcl_exports(queue, rng, ort, tmp_path, opset, build, shape):
    """import_onnx reads netcl's LSTM/GRU nodes back into nn.LSTM / nn.GRU layers (the graph importer).
    The graphs move the batch off the first dimension (ONNX's recurrent nodes run time-major); the
    imported graph follows it, and runs at another size of the input's first dimension too."""
    from netcl.io import export_onnx, import_onnx

    model = build().eval()
    x = rng.standard_normal(shape).astype(np.float32)
    want = model.predict(x, queue)
    export_onnx(model, shape, tmp_path / "m.onnx", opset=opset, dynamic_batch=True)
    back = import_onnx(tmp_path / "m.onnx")
    assert sum(isinstance(m, (nn.LSTM, nn.GRU)) for m in back.modules()) == len(
        [m for m in model.modules() if isinstance(m, (nn.LSTM, nn.GRU))]) * model.rnn.num_layers
    assert_close(back.eval().predict(x, queue), want, 1e-5, 1e-6)
    x = rng.standard_normal((3,) + shape[1:]).astype(np.float32)
    assert_close(back.predict(x, queue), model.predict(x, queue), 1e-5, 1e-6)


class TorchSeq:
    """torch's counterpart of SeqRegressor, with layers, directions and batch_first of choice."""

    @staticmethod
    def build(torch, kind, bidirectional, layers, batch_first):
        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.rnn = getattr(torch.nn, kind)(3, 5, num_layers=layers, bidirectional=bidirectional,
                                                   batch_first=batch_first)
                self.fc = torch.nn.Linear(5 * (2 if bidirectional else 1), 2)

            def forward(self, x):
                out, _ = self.rnn(x)
                return self.fc(out[:, -1] if batch_first else out[-1])
        return Net().eval()


@pytest.mark.parametrize("opset", [13, 17])
@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
@pytest.mark.parametrize("bidirectional,layers,batch_first", [(False, 1, True), (True, 2, False)])
def test_onnx_import_of_torch_exports(queue, rng, torch, tmp_path, opset, kind, bidirectional, layers, batch_first):
    """torch.onnx.export's LSTM/GRU graphs (its Squeeze/Transpose/Reshape of Y, its own weight layout)
    import as netcl LSTM/GRU layers that compute torch's outputs."""
    import warnings

    from netcl.io import import_onnx

    ref = TorchSeq.build(torch, kind, bidirectional, layers, batch_first)
    x = rng.standard_normal((2, 4, 3)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(ref, (torch.tensor(x),), str(tmp_path / "t.onnx"), opset_version=opset, dynamo=False,
                          input_names=["input"])
    back = import_onnx(tmp_path / "t.onnx")
    assert sum(isinstance(m, getattr(nn, kind)) for m in back.modules()) == layers
    assert_close(back.eval().predict(x, queue), host(ref(torch.tensor(x))), 1e-5, 1e-6)


def test_onnx_import_refuses_what_torch_layers_lack(tmp_path):
    """A GRU with linear_before_reset=0 (r applied before W_hn) and an LSTM with peepholes' clip are
    refused by name."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    from netcl.io import import_onnx

    H, I = 2, 3
    for kind, attrs, gates in (("GRU", {"linear_before_reset": 0}, 3), ("LSTM", {"clip": 1.0}, 4),
                               ("LSTM", {"direction": "reverse"}, 4)):
        w = helper.make_tensor("W", TensorProto.FLOAT, (1, gates * H, I), np.zeros(gates * H * I))
        r = helper.make_tensor("R", TensorProto.FLOAT, (1, gates * H, H), np.zeros(gates * H * H))
        node = helper.make_node(kind, ["input", "W", "R"], ["Y"], hidden_size=H, **attrs)
        graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("input", TensorProto.FLOAT, (4, 1, I))],
                                  [helper.make_tensor_value_info("Y", TensorProto.FLOAT, (4, 1, 1, H))],
                                  initializer=[w, r])
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "m.onnx"))
        with pytest.raises(NotImplementedError, match=list(attrs)[0] if kind == "GRU" else list(attrs)[0]):
            import_onnx(tmp_path / "m.onnx")


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_from_torch(queue, rng, torch, kind):
    """nn.from_torch of a torch module holding an LSTM/GRU (torch.fx: the layer's call, the tuple's
    element, the last step's index) computes torch's outputs and gradients; a bare layer converts too."""
    ref = TorchSeq.build(torch, kind, True, 2, True).double()
    model = nn.from_torch(ref)
    assert type(dict(model.named_modules())["rnn"]) is getattr(nn, kind)
    x = rng.standard_normal((3, 4, 3))
    assert_close(model.eval().predict(x.astype(np.float32), queue), host(ref(torch.tensor(x))), 1e-5, 1e-6)
    model.train()
    model(netcl.tensor(x.astype(np.float32), queue=queue)).sum().backward()
    ref(torch.tensor(x)).sum().backward()
    for k, p in model.named_parameters():
        assert_close(p.grad.numpy(), host(dict(ref.named_parameters())[k].grad).T if k == "fc.weight" else
                     host(dict(ref.named_parameters())[k].grad), 1e-5, 1e-6, what=k)
    bare = nn.from_torch(getattr(torch.nn, kind)(3, 4, batch_first=True))
    assert type(bare[0]) is getattr(nn, kind) and bare[0].batch_first


def test_from_torch_reads_h_n_and_refuses_projections(queue, rng, torch):
    class Ref(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = torch.nn.LSTM(3, 5, num_layers=2)
            self.fc = torch.nn.Linear(5, 2)

        def forward(self, x):
            out, (h, c) = self.rnn(x)
            return self.fc(h[-1] + c[-1])
    ref = Ref().double().eval()
    x = rng.standard_normal((6, 3, 3))
    assert_close(nn.from_torch(ref).eval().predict(x.astype(np.float32), queue), host(ref(torch.tensor(x))),
                 1e-5, 1e-6)
    with pytest.raises(NotImplementedError, match="proj_size=2"):
        nn.from_torch(torch.nn.LSTM(3, 4, proj_size=2))


class FinalStates(nn.Module):
    # x: (N, L, 3) -> (N, 2); a batch-first bidirectional GRU's last layer's two final states, joined
    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(3, 4, num_layers=2, batch_first=True, bidirectional=True)
        self.fc = nn.Linear(8, 2)

    def forward(self, x):
        out, h = self.rnn(x)
        return self.fc(netcl.cat([h[-1], h[-2]], 1))


def test_graph_reading_h_n_keeps_the_batch_free(queue, rng, ort, tmp_path):
    """h_n (layers * D, N, H) holds the batch second: a traced graph (a .netcl file, an ONNX export with
    a symbolic batch) that reads it runs at any batch."""
    from netcl.io import export_onnx, load, save

    model = FinalStates().eval()
    save(model, tmp_path / "m.netcl", example_input=np.zeros((3, 6, 3), np.float32))
    back = load(tmp_path / "m.netcl").eval()
    export_onnx(model, (2, 6, 3), tmp_path / "m.onnx", dynamic_batch=True, opset=17)
    for n in (1, 5):
        x = rng.standard_normal((n, 6, 3)).astype(np.float32)
        want = model.predict(x, queue)
        np.testing.assert_array_equal(back.predict(x, queue), want)
        assert_close(run_ort(ort, tmp_path / "m.onnx", x), want, 1e-5, 1e-6)


class TwoCalls(nn.Module):
    # x: (N, L, 3) -> (N, 2); one LSTM (dropout between its layers) called on two halves of the features
    def __init__(self, dropout=0.0):
        super().__init__()
        self.rnn = nn.LSTM(3, 4, num_layers=2, batch_first=True, dropout=dropout)
        self.fc = nn.Linear(8, 2)

    def forward(self, x):
        a, _ = self.rnn(x)
        b, _ = self.rnn(x * 0.5)
        return self.fc(netcl.cat([a[:, -1], b[:, 0]], 1))


def test_a_layer_called_twice_has_both_calls_gradients(queue, rng, torch):
    model = TwoCalls()
    rnn = torch.nn.LSTM(3, 4, num_layers=2, batch_first=True).double()
    rnn.load_state_dict({k: torch.tensor(v, dtype=torch.float64) for k, v in model.rnn.state_dict().items()})
    fc = torch.nn.Linear(8, 2).double()
    fc.load_state_dict({"weight": torch.tensor(model.fc.weight.numpy().T, dtype=torch.float64),
                        "bias": torch.tensor(model.fc.bias.numpy(), dtype=torch.float64)})
    x = rng.standard_normal((3, 5, 3))
    model(netcl.tensor(x.astype(np.float32), queue=queue)).sum().backward()
    xt = torch.tensor(x)
    fc(torch.cat([rnn(xt)[0][:, -1], rnn(xt * 0.5)[0][:, 0]], 1)).sum().backward()
    for k, p in rnn.named_parameters():
        assert_close(dict(model.rnn.named_parameters())[k].grad.numpy(), host(p.grad), 1e-5, 1e-6, what=k)


def test_trainstep_replays_dropout_between_layers(queue, rng):
    """A step with dropout between the layers replays (each replay draws its masks' seeds as a layer
    call does): the losses of TrainStep and of the plain loop agree from the same seed."""
    from netcl.trainstep import TrainStep

    x, y = rng.standard_normal((16, 5, 3)).astype(np.float32), rng.integers(0, 2, 16)
    losses = []
    for use_step, dropout in ((False, 0.3), (True, 0.3), (False, 0.0)):
        netcl.manual_seed(9)
        model = TwoCalls(dropout=dropout)
        opt = optim.SGD(model.parameters(), lr=0.1)
        step = TrainStep(model, nn.CrossEntropyLoss(), opt) if use_step else None
        run = []
        for _ in range(6):
            xb = netcl.tensor(x, queue=queue)
            if step is not None:
                run.append(float(step(xb, y)))
            else:
                loss = nn.functional.cross_entropy(model(xb), y)
                loss.backward()
                opt.step()
                opt.zero_grad()
                run.append(loss.item())
        losses.append(run)
        if step is not None:
            assert step.replays > 0 and step.eager_reason is None
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)
    assert np.abs(np.array(losses[2]) - losses[0]).max() > 1e-3  # (the dropout acted)


class TorchBatchFree:
    """torch classifiers taking (N, L, 3): a batch_first layer, or a time-major one behind a transpose."""

    @staticmethod
    def build(torch, kind, batch_first, bidirectional):
        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.rnn = getattr(torch.nn, kind)(3, 5, num_layers=2, batch_first=batch_first,
                                                   bidirectional=bidirectional)
                self.fc = torch.nn.Linear(5 * (2 if bidirectional else 1), 2)

            def forward(self, x):
                if batch_first:
                    return self.fc(self.rnn(x)[0][:, -1])
                return self.fc(self.rnn(x.transpose(0, 1))[0][-1])
        return Net().eval()


@pytest.mark.parametrize("opset", [13, 17])
@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
@pytest.mark.parametrize("batch_first,bidirectional", [(True, True), (False, False), (False, True)])
def test_onnx_import_of_torch_exports_keeps_the_batch_free(queue, rng, torch, tmp_path, opset, kind, batch_first,
                                                           bidirectional):
    """torch.onnx.export with a symbolic batch: the batch moves to ONNX's recurrent nodes' second axis
    (Transpose), through Y's Transpose/Squeeze/Reshape, and back; the imported graph follows it and runs
    at any batch, as torch does (its zero initial states, made from the input's shape, left to the layer)."""
    import warnings

    from netcl.io import import_onnx

    ref = TorchBatchFree.build(torch, kind, batch_first, bidirectional)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(ref, (torch.zeros(2, 4, 3),), str(tmp_path / "t.onnx"), opset_version=opset,
                          dynamo=False, input_names=["input"], dynamic_axes={"input": {0: "batch"}})
    back = import_onnx(tmp_path / "t.onnx").eval()
    assert isinstance(back, nn.GraphModule) and back.graph[0]["out"][0][0] == "N"
    for n in (1, 3, 5):
        x = rng.standard_normal((n, 4, 3)).astype(np.float32)
        assert_close(back.predict(x, queue), host(ref(torch.tensor(x))), 1e-5, 1e-6, what=f"batch {n}")


class TokenLSTM(nn.Module):
    # idx: (N, L) -> (N, 3); tokens embedded, a batch-first LSTM, its last step through a Linear
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 6)
        self.rnn = nn.LSTM(6, 8, batch_first=True)
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc(self.rnn(self.emb(x))[0][:, -1])


def test_onnx_import_of_a_module_subclass_starting_with_an_embedding(queue, rng, torch, tmp_path):
    """Embedding -> LSTM -> Linear exported by netcl and by torch.onnx imports back (the graph importer
    takes the Cast of the indices to int64 as the chain importer does: the Embedding reads them) and
    agrees with the model at batches other than the exported one."""
    import warnings

    from netcl.io import export_onnx, import_onnx

    model = TokenLSTM().eval()
    export_onnx(model, (2, 5), tmp_path / "m.onnx", opset=17, dynamic_batch=True)
    ref = torch.nn.Sequential()  # torch's counterpart holding the same weights
    ref.emb, ref.rnn, ref.fc = torch.nn.Embedding(10, 6), torch.nn.LSTM(6, 8, batch_first=True), torch.nn.Linear(8, 3)
    ref.load_state_dict({k: torch.tensor(v.T if k == "fc.weight" else v) for k, v in model.state_dict().items()})
    ref.forward = lambda x: ref.fc(ref.rnn(ref.emb(x))[0][:, -1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(ref, (torch.zeros(2, 5, dtype=torch.int64),), str(tmp_path / "t.onnx"), opset_version=17,
                          dynamo=False, input_names=["input"], dynamic_axes={"input": {0: "batch"}})
    ours, theirs = import_onnx(tmp_path / "m.onnx").eval(), import_onnx(tmp_path / "t.onnx").eval()
    assert [type(m).__name__ for m in theirs.modules() if type(m) in (nn.Embedding, nn.LSTM, nn.Linear)] == \
        ["Embedding", "LSTM", "Linear"]
    for n in (1, 3):
        x = rng.integers(0, 10, (n, 5))
        want = host(ref(torch.tensor(x)))
        assert_close(model.predict(x, queue), want, 1e-5, 1e-6)
        assert_close(ours.predict(x, queue), want, 1e-5, 1e-6, what=f"netcl's export, batch {n}")
        assert_close(theirs.predict(x, queue), want, 1e-5, 1e-6, what=f"torch's export, batch {n}")


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_inference_keeps_no_step_state(queue, rng, torch, monkeypatch, kind):
    """In eval() under no_grad (model(x), predict()) a call records no autograd node and allocates none of
    the per-step buffers backward reads (h_{t-1}, c_t, the gates: (T, B, H) or (T, B, 4H)); its outputs
    and states are the recorded call's and torch's."""
    from netcl import ops

    T, B, H = 7, 3, 8
    layer, ref = pair(torch, queue, rng, kind, input_size=4, hidden_size=H, num_layers=2, bidirectional=True)
    layer.eval()
    x = rng.standard_normal((T, B, 4))
    made = []
    new = ops.new
    monkeypatch.setattr(ops, "new", lambda q, shape, *a, **k: made.append(tuple(shape)) or new(q, shape, *a, **k))
    with netcl.no_grad():
        out = layer(netcl.tensor(x.astype(np.float32), queue=queue))
    monkeypatch.setattr(ops, "new", new)
    assert out[0].grad_fn is None and not out[0].requires_grad
    assert not [s for s in made if s in ((T, B, H), (T, B, 4 * H))], made
    recorded = layer(netcl.tensor(x.astype(np.float32), queue=queue))  # (grad on: the saving kernels)
    assert recorded[0].grad_fn is not None
    want = ref(torch.tensor(x))
    for got, rec, w in zip((out[0], *states(out)), (recorded[0], *states(recorded)), (want[0], *states(want))):
        if got is None:
            continue
        np.testing.assert_array_equal(got.numpy(), rec.numpy())
        assert_close(got.numpy(), host(w), 1e-5, 1e-6)


class TimeMajorInside(nn.Module):
    # x: (N, L, 3) -> (N, 2); a time-major GRU behind a permute, its output reshaped around the batch
    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(3, 4)
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        y = self.rnn(x.permute(1, 0, 2))[0]
        y = y.reshape((y.shape[0], y.shape[1], 2, 2)).reshape(y.shape[0], y.shape[1], 4)
        return self.fc(y[-1])


def test_trace_follows_the_batch_off_the_first_dimension(queue, rng, ort, tmp_path):
    """The tracer follows the batch through a permute, a time-major layer (second axis), reshapes that
    read it from shape[1] and the last step's index: the .netcl file and the ONNX export run at any batch."""
    from netcl.io import export_onnx, load, save

    model = TimeMajorInside().eval()
    save(model, tmp_path / "m.netcl", example_input=np.zeros((2, 5, 3), np.float32))
    back = load(tmp_path / "m.netcl").eval()
    assert [n["out"] for n in back.graph][3] == [[5, "N", 2, 2]]
    export_onnx(model, (2, 5, 3), tmp_path / "m.onnx", dynamic_batch=True, opset=17)
    for n in (1, 3):
        x = rng.standard_normal((n, 5, 3)).astype(np.float32)
        want = model.predict(x, queue)
        np.testing.assert_array_equal(back.predict(x, queue), want)
        assert_close(run_ort(ort, tmp_path / "m.onnx", x), want, 1e-5, 1e-6)
