"""Every public name has a docstring (the API reference pages are built from them).

The rule: in every module of the netcl package (gen/'s bindings aside),
- the module itself has a docstring;
- so does every class and function it defines whose name has no leading underscore;
- and every method and property such a class defines in its own body (no leading underscore):
  a method that overrides a documented one of a base class inherits its docstring, as `help()`
  and the API reference show it.
Names imported from elsewhere are checked where they are defined.

PENDING lists the names that lack one today in modules other work is rewriting (tensor, nn,
optim, trainstep, ops, convspec); the list may only shrink: a name on it that has gained a
docstring, or no longer exists, fails the test until it is taken off."""
import importlib
import inspect
import pkgutil

import netcl

PENDING = {
    "netcl.convspec.ConvSpec.out_bytes", "netcl.convspec.ConvSpec.out_shape", "netcl.convspec.ConvSpec.poh",
    "netcl.convspec.ConvSpec.pow", "netcl.convspec.ConvSpec.r",
    "netcl.nn.activation.GELU", "netcl.nn.activation.Hardsigmoid", "netcl.nn.activation.Hardswish",
    "netcl.nn.activation.LeakyReLU", "netcl.nn.activation.ReLU", "netcl.nn.activation.ReLU6",
    "netcl.nn.activation.SiLU", "netcl.nn.activation.Sigmoid", "netcl.nn.activation.Softmax",
    "netcl.nn.activation.Softmax.backward", "netcl.nn.activation.Softmax.forward", "netcl.nn.activation.Tanh",
    "netcl.nn.attention.MultiheadAttention", "netcl.nn.attention.MultiheadAttention.backward",
    "netcl.nn.attention.MultiheadAttention.forward",
    "netcl.nn.basic.Dropout", "netcl.nn.basic.Dropout.backward", "netcl.nn.basic.Dropout.forward",
    "netcl.nn.basic.Flatten", "netcl.nn.basic.Flatten.backward", "netcl.nn.basic.Flatten.forward",
    "netcl.nn.basic.Identity", "netcl.nn.basic.Identity.backward", "netcl.nn.basic.Identity.forward",
    "netcl.nn.basic.Transpose", "netcl.nn.basic.Transpose.backward", "netcl.nn.basic.Transpose.forward",
    "netcl.nn.blocks.Concat", "netcl.nn.blocks.Concat.backward", "netcl.nn.blocks.Concat.forward",
    "netcl.nn.blocks.ModuleList.forward", "netcl.nn.blocks.Residual", "netcl.nn.blocks.Residual.backward",
    "netcl.nn.conv.Conv2d", "netcl.nn.conv.Conv2d.backward", "netcl.nn.conv.Conv2d.extra_repr",
    "netcl.nn.conv.ConvTranspose2d", "netcl.nn.conv.ConvTranspose2d.backward",
    "netcl.nn.conv.ConvTranspose2d.forward",
    "netcl.nn.linear.Linear", "netcl.nn.linear.Linear.backward", "netcl.nn.linear.Linear.forward",
    "netcl.nn.loss.MSELoss", "netcl.nn.loss.PendingLoss.item",
    "netcl.nn.module.Module.backward", "netcl.nn.module.Module.eval", "netcl.nn.module.Module.extra_repr",
    "netcl.nn.module.Module.forward", "netcl.nn.module.Module.named_buffers",
    "netcl.nn.module.Module.named_parameters", "netcl.nn.module.Module.parameters",
    "netcl.nn.module.Module.state_dict", "netcl.nn.module.Module.train", "netcl.nn.module.ShapeError.at",
    "netcl.nn.module.check_rank", "netcl.nn.module.constant", "netcl.nn.module.positive",
    "netcl.nn.module.set_rng",
    "netcl.nn.norm.BatchNorm2d", "netcl.nn.norm.LayerNorm", "netcl.nn.norm.LayerNorm.backward",
    "netcl.nn.norm.LayerNorm.forward",
    "netcl.nn.pool.AdaptiveAvgPool1d", "netcl.nn.pool.AdaptiveAvgPool2d", "netcl.nn.pool.AvgPool2d",
    "netcl.nn.pool.AvgPool2d.backward", "netcl.nn.pool.AvgPool2d.forward", "netcl.nn.pool.MaxPool2d",
    "netcl.nn.pool.MaxPool2d.backward", "netcl.nn.pool.MaxPool2d.forward",
    "netcl.nn.sequential.Sequential.forward", "netcl.nn.sequential.Sequential.train",
    "netcl.nn.upsample.Upsample", "netcl.nn.upsample.Upsample.backward", "netcl.nn.upsample.Upsample.forward",
    "netcl.ops.launch1d", "netcl.ops.mul",
    "netcl.optim.Adam", "netcl.optim.Adam.hyperparameters", "netcl.optim.GradHome.holds",
    "netcl.optim.Optimizer", "netcl.optim.Optimizer.hyperparameters", "netcl.optim.Optimizer.load_state_dict",
    "netcl.optim.Optimizer.step", "netcl.optim.Optimizer.zero_grad", "netcl.optim.SGD",
    "netcl.optim.SGD.hyperparameters", "netcl.optim.SGD.slots",
    "netcl.tensor.Tensor.empty", "netcl.tensor.Tensor.nbytes", "netcl.tensor.Tensor.ndim",
    "netcl.tensor.Tensor.on_device", "netcl.tensor.Tensor.queue", "netcl.tensor.Tensor.size",
    "netcl.tensor.Tensor.version", "netcl.tensor.Tensor.zeros",
}


def _modules():
    yield netcl
    for info in pkgutil.walk_packages(netcl.__path__, "netcl."):
        if not info.name.startswith("netcl._gen"):
            yield importlib.import_module(info.name)


def _undocumented():
    missing = set()
    for m in _modules():
        if not (m.__doc__ or "").strip():
            missing.add(f"module {m.__name__}")
        for name, obj in vars(m).items():
            if name.startswith("_") or getattr(obj, "__module__", None) != m.__name__:
                continue
            if not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            where = f"{m.__name__}.{name}"
            if not (obj.__doc__ or "").strip():
                missing.add(where)
            if inspect.isclass(obj):
                for attr, v in vars(obj).items():
                    if attr.startswith("_"):
                        continue
                    if isinstance(v, property):
                        doc = v.__doc__
                    elif inspect.isfunction(v) or isinstance(v, (staticmethod, classmethod)):
                        doc = inspect.getdoc(getattr(obj, attr))  # inherits an overridden method's
                    else:
                        continue
                    if not (doc or "").strip():
                        missing.add(f"{where}.{attr}")
    return missing


def test_public_names_have_docstrings():
    missing = _undocumented()
    new = sorted(missing - PENDING)
    assert not new, f"{len(new)} public names without a docstring (say what it is, its arguments and " \
                    f"shapes where they help): {new}"
    stale = sorted(PENDING - missing)
    assert not stale, f"these names have a docstring now (or are gone): take them off PENDING: {stale}"
