"""The layer protocol and the package's shape: no import cycles, every registered layer
exportable (or listed with a reason), nested Sequentials handled alike by every walker."""
import ast
import pathlib

import numpy as np
import pytest

import netcl
from conftest import randomize_batchnorm
from netcl import Tensor, nn, optim
from netcl.io import export_onnx, load, save
from netcl.io import onnx_export as ox

ROOT = pathlib.Path(netcl.__file__).parent
# function-level imports are for optional dependencies only (a device, onnxruntime, plotting, the
# generated bindings that may not be built yet); netcl's own modules are imported at the top
OPTIONAL = {"pyopencl", "onnxruntime", "torch", "matplotlib", "tqdm", "sklearn", "PIL", "netcl._gen", "onnx"}


def _modules():
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imports(path, modules):
    """(target module, line, at top level) for every import of a netcl module in `path`."""
    tree = ast.parse(path.read_text())
    top = set(map(id, tree.body))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                     for a in node.names]
        else:
            continue
        for name in names:
            yield name, node.lineno, id(node) in top


def test_no_import_cycles_counting_function_level_imports():
    modules = _modules()
    graph = {m: {t for t, _, _ in _imports(p, modules) if t in modules and t != m} for m, p in modules.items()}
    state, stack, cycles = {}, [], []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                cycles.append(stack[stack.index(t):] + [t])
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_function_level_imports_are_for_optional_dependencies_only():
    modules = _modules()
    bad = []
    for m, path in modules.items():
        tree = ast.parse(path.read_text())
        top = set(map(id, tree.body))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in top:
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                for name in names:
                    if name.split(".")[0] == "netcl" and not name.startswith("netcl._gen"):
                        bad.append(f"{path.relative_to(ROOT.parent)}:{node.lineno} imports {name}")
    assert not bad, "\n".join(bad)


def test_every_registered_layer_has_an_emitter_or_a_reason():
    for name, cls in nn.LAYERS.items():
        assert (cls in ox.EMITTERS) != (cls in ox.NOT_EMITTED), name
    assert set(ox.EMITTERS) | set(ox.NOT_EMITTED) == set(nn.LAYERS.values())


def test_tensor_shapes_declare_what_each_layer_allocates():
    layers = [nn.Linear(5, 3), nn.Linear(4, 4, bias=False), nn.Conv2d(3, 8, 3, padding=1),
              nn.Conv2d(2, 4, 1, bias=False), nn.BatchNorm2d(6), nn.MultiheadAttention(8, 2), nn.ReLU()]
    for layer in layers:
        want = type(layer).tensor_shapes(**layer.config())
        assert {k: t.shape for k, t in layer.named_tensors()} == want, layer


def _nested():
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1),
                         nn.Sequential(nn.BatchNorm2d(4), nn.ReLU(), nn.Sequential(nn.MaxPool2d(2))),
                         nn.Flatten(), nn.Sequential(nn.Linear(64, 6), nn.Tanh()))


def _flat(model):
    return nn.Sequential(*[layer for _, layer in model.chain()])


def test_nested_sequential_keys_follow_attribute_paths():
    model = _nested()
    assert list(model.state_dict()) == [
        "0.weight", "0.bias", "1.0.weight", "1.0.bias", "1.0.running_mean", "1.0.running_var",
        "3.0.weight", "3.0.bias"]
    assert [p for p, _ in model.chain()] == ["0", "1.0", "1.1", "1.2.0", "2", "3.0", "3.1"]
    assert model.eval().training is False and all(not m.training for _, m in model.chain())


def test_nested_sequential_trains_saves_exports_and_fuses(queue, rng, tmp_path):
    model = _nested()
    randomize_batchnorm(_flat(model), rng)
    x = rng.normal(size=(2, 3, 8, 8)).astype(np.float32)
    flat = _flat(model)
    model.train()
    y = model(Tensor.from_host(queue, x))
    dx = model.backward(Tensor.from_host(queue, np.ones(y.shape, np.float32)))
    assert dx.shape == x.shape and all(p.grad is not None for p in model.parameters())
    flat.train()
    y_flat = flat(Tensor.from_host(queue, x))
    # float32 rounding apart: on CPUs the flat model's conv computes the BatchNorm's statistics in
    # its pass (Conv2d.output_statistics), the nested one's BatchNorm (first in its own Sequential)
    # reads its input for them
    np.testing.assert_allclose(y.to_host(), y_flat.to_host(), rtol=1e-6, atol=1e-6)

    model.eval()
    ref = flat.eval()(Tensor.from_host(queue, x)).to_host()  # fused, flat
    assert np.allclose(model(Tensor.from_host(queue, x)).to_host(), ref, atol=1e-6)
    assert model._fused is not None and model._fused.launches(x.shape) == 2

    save(model, tmp_path / "m.netcl")
    back = load(tmp_path / "m.netcl")
    assert repr(back) == repr(model)
    assert all(np.array_equal(a, b) for a, b in zip(back.state_dict().values(), model.state_dict().values()))

    export_onnx(model, x.shape, tmp_path / "nested.onnx")
    export_onnx(flat, x.shape, tmp_path / "flat.onnx")
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(str(tmp_path / "nested.onnx"), providers=["CPUExecutionProvider"])
    assert np.abs(sess.run(None, {"input": x})[0] - ref).max() < 1e-5


@pytest.mark.parametrize("make, error, message", [
    (lambda: nn.Linear(3, 2, bias=-8), TypeError, "bias must be a bool"),
    (lambda: nn.Linear(3, 2, bias=1), TypeError, "bias must be a bool"),
    (lambda: nn.Linear(True, 2), TypeError, "in_features must be an int"),
    (lambda: nn.Linear(2**31, 2), ValueError, "in_features must be between 1 and 2147483647"),
    (lambda: nn.Conv2d(1, 1, 3, padding=10**6), ValueError, "padding must be between 0 and 4096"),
    (lambda: nn.Conv2d(1, 1, 3, padding=-1), ValueError, "padding must be between 0 and 4096, got -1"),
    (lambda: nn.Conv2d(1, 1, 3, stride=2**53), ValueError, "stride must be between 1 and"),
    (lambda: nn.Conv2d(1, 1, 3, bias="yes"), TypeError, "bias must be a bool"),
    (lambda: nn.MaxPool2d(2, stride=2**53), ValueError, "stride must be between 1 and"),
    (lambda: nn.AvgPool2d(3, padding=2), ValueError, "padding must be between 0 and 1"),
    (lambda: nn.BatchNorm2d(3, eps=True), TypeError, "eps must be a number"),
    (lambda: nn.BatchNorm2d(3, momentum=float("nan")), ValueError, "momentum must be in"),
    (lambda: nn.BatchNorm2d(3, eps=0.0), ValueError, "eps > 0"),
    (lambda: nn.LeakyReLU(float("inf")), ValueError, "negative_slope must be in"),
    (lambda: nn.LeakyReLU("0.1"), TypeError, "negative_slope must be a number"),
    (lambda: nn.Dropout(True), TypeError, "p must be a number"),
    (lambda: nn.Dropout(1.5), ValueError, r"p must be in \[0.0, 1.0\]"),
    (lambda: nn.Softmax(dim=False), TypeError, "dim must be an int"),
    (lambda: nn.MultiheadAttention(8, 2**40), ValueError, "num_heads must be between"),
    (lambda: optim.SGD([Tensor.from_host(None, np.zeros(2))], nesterov=1), TypeError, "nesterov must be a bool"),
    (lambda: optim.Adam([Tensor.from_host(None, np.zeros(2))], lr=float("inf")), ValueError, "lr must be in"),
])
def test_constructors_refuse_what_they_would_otherwise_coerce(make, error, message):
    """One set of validators (module.as_int, as_bool, as_float): the constructors and the .netcl
    loader (which builds through them) apply the same rules."""
    with pytest.raises(error, match=message):
        make()
    assert np.bool_(True) is not True and nn.Linear(2, 2, bias=np.bool_(False)).bias is None


def test_every_package_is_in_the_wheel():
    """pyproject's package list names every folder of netcl with an __init__.py: a package left out
    installs a netcl that fails on import."""
    import tomllib

    listed = set(tomllib.loads((ROOT.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT.parent).parts) for p in ROOT.rglob("__init__.py")}
    assert found - {"netcl._gen"} <= listed, f"missing from pyproject.toml's packages: {sorted(found - listed)}"
