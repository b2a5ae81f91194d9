"""nn.Module as PyTorch's: registration, parameters and state_dict of a Module subclass with its
own forward, ModuleList/ModuleDict, freezing, errors instead of silence; and its training, step
for step against torch (SGD and Adam), with a layer called twice, shared weights and fan-out."""
import warnings

import numpy as np
import pytest

import netcl
import netcl.nn.functional as F
from netcl import nn, optim

torch = pytest.importorskip("torch")


class Net(nn.Module):
    """The spec's example: a conv used twice, a parameter of its own."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.head = nn.Linear(4 * 6 * 6, 5)
        self.scale = nn.Parameter(np.full(1, 0.7, np.float32))

    def forward(self, x):
        h = F.relu(self.bn(self.conv(x)))
        h = h + self.conv(x)
        return self.head(h.flatten(1)) * self.scale


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.head = torch.nn.Linear(4 * 6 * 6, 5)
        self.scale = torch.nn.Parameter(torch.full((1,), 0.7))

    def forward(self, x):
        h = torch.relu(self.bn(self.conv(x)))
        h = h + self.conv(x)
        return self.head(h.flatten(1)) * self.scale


def test_a_module_subclass_registers_what_it_holds():
    m = Net()
    names = [k for k, _ in m.named_parameters()]
    assert names == [k for k, _ in TorchNet().named_parameters()]
    assert list(m.state_dict()) == [k for k in TorchNet().state_dict() if not k.endswith("num_batches_tracked")]
    assert [n for n, _ in m.named_children()] == ["conv", "bn", "head"]
    assert [type(c).__name__ for c in m.modules()] == ["Net", "Conv2d", "BatchNorm2d", "Linear"]
    assert isinstance(m.scale, nn.Parameter) and isinstance(m.conv.weight, nn.Parameter)
    assert all(p.requires_grad for p in m.parameters())
    assert not m.bn.running_mean.requires_grad
    assert m.train() is m and m.training and not m.eval().conv.training
    assert "(conv): Conv2d" in repr(m)
    del m.head
    assert "head.weight" not in m.state_dict()


def test_weights_load_both_ways_with_torch():
    m, ref = Net(), TorchNet()
    m.load_state_dict(ref.state_dict())  # torch tensors: torch's layouts (Linear (out, in))
    np.testing.assert_array_equal(m.head.weight.numpy(), ref.head.weight.detach().numpy().T)
    partial = {k: v for k, v in ref.state_dict().items() if k.startswith("conv.")}
    with pytest.raises(ValueError, match="missing"):
        m.load_state_dict(partial)
    result = m.load_state_dict(dict(partial, extra=np.zeros(1)), strict=False)
    assert "head.weight" in result.missing_keys and result.unexpected_keys == ["extra"]
    bn, tbn = nn.BatchNorm2d(4), torch.nn.BatchNorm2d(4)  # a bare layer's counter has no prefix
    tbn.running_mean.fill_(0.5)
    bn.load_state_dict(tbn.state_dict())
    assert "num_batches_tracked" in tbn.state_dict() and np.all(bn.running_mean.numpy() == 0.5)


@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
def test_custom_module_trains_as_torch_step_for_step(queue, rng, opt_name):
    netcl.manual_seed(1)
    m, ref = Net(), TorchNet().double()
    ref.load_state_dict({k: torch.tensor(v, dtype=torch.float64) if k != "head.weight" else torch.tensor(v.T)
                         for k, v in m.state_dict().items()}, strict=False)
    m.to(queue)
    if opt_name == "sgd":
        opt, topt = optim.SGD(m.parameters(), lr=0.05, momentum=0.9), torch.optim.SGD(ref.parameters(), lr=0.05,
                                                                                         momentum=0.9)
    else:
        opt, topt = optim.Adam(m.parameters(), lr=0.01), torch.optim.Adam(ref.parameters(), lr=0.01)
    for step in range(5):
        x = rng.standard_normal((8, 1, 6, 6)).astype(np.float32)
        y = rng.integers(0, 5, 8)
        loss = F.cross_entropy(m(netcl.tensor(x, queue=queue)), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        tloss = torch.nn.functional.cross_entropy(ref(torch.tensor(x, dtype=torch.float64)), torch.tensor(y))
        topt.zero_grad()
        tloss.backward()
        topt.step()
        assert abs(loss.item() - tloss.item()) <= 1e-4 * max(1.0, abs(tloss.item())), f"step {step}"
    for k, v in m.state_dict().items():
        want = ref.state_dict()[k].numpy()
        want = want.T if k == "head.weight" else want
        np.testing.assert_allclose(v, want, rtol=1e-4, atol=1e-5, err_msg=k)


def test_a_layer_called_twice_gets_both_gradients(queue, rng):
    lin = nn.Linear(3, 3).to(queue)
    ref = torch.nn.Linear(3, 3).double()
    ref.load_state_dict({"weight": torch.tensor(lin.weight.numpy().T), "bias": torch.tensor(lin.bias.numpy())})
    x = rng.standard_normal((2, 3)).astype(np.float32)
    y = lin(lin(netcl.tensor(x, queue=queue, requires_grad=True)).relu())
    tx = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    ty = ref(ref(tx).relu())
    y.sum().backward()
    ty.sum().backward()
    np.testing.assert_allclose(lin.weight.grad.numpy(), ref.weight.grad.numpy().T, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lin.bias.grad.numpy(), ref.bias.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_a_sequential_inside_a_module_and_a_module_inside_a_sequential(queue, rng):
    class Scale(nn.Module):
        def __init__(self):
            super().__init__()
            self.s = nn.Parameter(np.full(1, 2.0, np.float32))

        def forward(self, x):
            return x * self.s

    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), Scale(), nn.Linear(8, 2)).to(queue)
    x = netcl.tensor(rng.standard_normal((3, 4)).astype(np.float32), queue=queue)
    model(x).sum().backward()
    assert model[2].s.grad is not None and model[0].weight.grad is not None
    model.eval()
    with netcl.no_grad():
        np.testing.assert_allclose(model(x).numpy(), model.predict(x.numpy()), rtol=1e-5)


def test_frozen_layers_get_no_gradient_and_no_update(queue, rng):
    m = Net().to(queue)
    m.conv.requires_grad_(False)
    before = m.conv.weight.numpy().copy()
    opt = optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.1)
    F.cross_entropy(m(netcl.tensor(rng.standard_normal((2, 1, 6, 6)).astype(np.float32), queue=queue)),
                    [1, 2]).backward()
    assert m.conv.weight.grad is None and m.head.weight.grad is not None
    opt.step()
    np.testing.assert_array_equal(m.conv.weight.numpy(), before)
    m.requires_grad_(False)
    with pytest.raises(RuntimeError, match="does not require grad"):
        m(netcl.tensor(np.zeros((1, 1, 6, 6), np.float32), queue=queue)).sum().backward()


def test_module_list_and_dict(queue, rng):
    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
            self.heads = nn.ModuleDict({"a": nn.Linear(4, 1), "b": nn.Linear(4, 2)})

        def forward(self, x):
            for b in self.blocks:
                x = b(x).tanh()
            return netcl.cat([self.heads["a"](x), self.heads["b"](x)], 1)

    m = Stack().to(queue)
    assert [k for k, _ in m.named_parameters()][:2] == ["blocks.0.weight", "blocks.0.bias"]
    assert "heads.b.bias" in m.state_dict() and len(m.parameters()) == 10
    m(netcl.tensor(rng.standard_normal((2, 4)).astype(np.float32), queue=queue)).sum().backward()
    assert all(p.grad is not None for p in m.parameters())
    m.blocks.append(nn.Linear(4, 4))
    assert len(m.blocks) == 4 and "blocks.3.weight" in m.state_dict()


def test_layers_where_parameters_cannot_find_them_are_an_error():
    class Hidden(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = [nn.Linear(2, 2)]

    with pytest.raises(TypeError, match="nn.ModuleList"):
        Hidden()

    class Dict(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = {"a": nn.Linear(2, 2)}

    with pytest.raises(TypeError, match="nn.ModuleDict"):
        Dict()

    class Tensor(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = netcl.tensor(np.ones(2, np.float32), requires_grad=True)

    with pytest.warns(UserWarning, match=r"Tensor.w holds a tensor that requires grad but is not an nn.Parameter"):
        Tensor()

    class Listed(nn.Module):
        def __init__(self):
            super().__init__()
            self.ws = [netcl.tensor(np.ones(2, np.float32), requires_grad=True)]

    with pytest.warns(UserWarning, match="not an nn.Parameter"):
        Listed()

    class Keeps(nn.Module):  # a tensor kept in forward is the user's business (as in PyTorch)
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)

        def forward(self, x):
            self.last_output = y = self.lin(x)
            return y

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Keeps()(netcl.tensor(np.ones((1, 2), np.float32)))

    class NoInit(nn.Module):
        def __init__(self):
            self.lin = nn.Linear(2, 2)

    with pytest.raises(AttributeError, match=r"call super\(\).__init__\(\) first"):
        NoInit()

    class Empty(nn.Module):
        def forward(self, x):
            return x

    with pytest.raises(ValueError, match="nn.ModuleList"):
        optim.SGD(Empty().parameters(), lr=0.1)


def test_overriding_forward_of_a_layer_is_refused(queue):
    class Doubled(nn.Linear):
        def forward(self, x):
            return super().forward(x) * 2

    with pytest.raises(NotImplementedError, match="Subclass nn.Module"):
        Doubled(2, 2).to(queue)(netcl.tensor(np.ones((1, 2), np.float32), queue=queue))


def test_losses_are_0d_tensors(queue, rng):
    pred = netcl.tensor(rng.standard_normal((4, 3)).astype(np.float32), queue=queue, requires_grad=True)
    for loss in (nn.CrossEntropyLoss()(pred, [0, 1, 2, 0]), nn.MSELoss()(pred, np.zeros((4, 3))),
                 F.cross_entropy(pred, netcl.tensor(np.array([0, 1, 2, 0]), queue=queue))):
        assert loss.shape == () and isinstance(float(loss), float) and f"{loss:.3f}"
        loss.backward()
    assert pred.grad is not None


def test_module_to_a_device_by_name(queue):
    m = nn.Linear(2, 2).to("cpu")
    assert m.weight.queue is not None


def test_every_attribute_a_layer_sets_after_init_is_kept_per_call():
    """autograd keeps a layer's CALL_STATE per call (a layer called twice has both calls'
    gradients): every attribute a layer's methods set on self outside __init__ must be in it,
    unless it lasts beyond a call (the fused plan, the mode)."""
    import ast
    import inspect
    import pathlib

    lasting = {"training", "_fused"}
    missing = []
    for path in sorted((pathlib.Path(netcl.__file__).parent / "nn").glob("*.py")):
        tree = ast.parse(path.read_text())
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            layer = getattr(nn, cls.name, None) or getattr(__import__(f"netcl.nn.{path.stem}",
                                                                      fromlist=[cls.name]), cls.name)
            if not (inspect.isclass(layer) and issubclass(layer, nn.Module)):
                continue
            for fn in (n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name != "__init__"):
                for node in ast.walk(fn):
                    targets = node.targets if isinstance(node, ast.Assign) else \
                        [node.target] if isinstance(node, ast.AugAssign) else []
                    flat = [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
                    for e in flat:  # (self.x[k] = ... changes what x holds, not x)
                        if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id == "self" \
                                and e.attr not in lasting and e.attr not in layer.CALL_STATE:
                            missing.append(f"{path.name}: {cls.name}.{fn.name} sets self.{e.attr}")
    assert not missing, "attributes set per call but not in CALL_STATE:\n" + "\n".join(missing)
