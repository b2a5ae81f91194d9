"""from_torch: a torch.nn model -> the netcl model with the same layers and weights.

Read `CONVERTERS`: one entry per torch class, which says the netcl layer it becomes and which of
the torch module's attributes are its config. A torch layer is recognised by its class's module
path and read through its attributes, and the weights go through load_state_dict, which reads
torch tensors in torch's layouts (Linear transposed). A module with a forward of its own goes
through torch.fx (netcl.nn.torch_graph), the one place torch is imported.
"""
import inspect

from netcl.nn.module import Module, bound_config
from netcl.nn.sequential import Sequential
from netcl.nn.torch_graph import from_fx


class _Unsupported(Exception):
    """A torch setting netcl has no equivalent for (collected, then raised as NotImplementedError)."""


def _layer(kind, **config):
    """netcl layer `kind` from `config`, dropping values equal to the constructor's defaults; a
    value that the netcl class does not take at all (e.g. groups on a Conv2d without them) is
    unsupported rather than silently ignored."""
    cls = _netcl_layers()[kind]
    params = inspect.signature(cls).parameters
    kwargs = {}
    for k, v in config.items():
        if k in params:
            kwargs[k] = v
        elif v != _TORCH_DEFAULTS.get(k):
            raise _Unsupported(f"{k}={v!r} (netcl's {kind} has no {k!r})")
    return cls(**bound_config(cls, kwargs))


# torch settings that netcl does not need to be told when they hold these values
_TORCH_DEFAULTS = {"dilation": 1, "groups": 1, "start_dim": 1, "end_dim": -1, "output_padding": 0}


def _require(m, **expected):
    for k, v in expected.items():
        if getattr(m, k) != v:
            raise _Unsupported(f"{k}={getattr(m, k)!r} (netcl supports only {k}={v!r})")


def _linear(m):
    return _layer("Linear", in_features=m.in_features, out_features=m.out_features, bias=m.bias is not None)


def _conv2d(m):  # pairs as they are (Conv2d keeps a square one as an int), "same" and "valid" too
    _require(m, padding_mode="zeros")
    return _layer("Conv2d", in_channels=m.in_channels, out_channels=m.out_channels,
                  kernel_size=tuple(m.kernel_size), stride=tuple(m.stride),
                  padding=m.padding if isinstance(m.padding, str) else tuple(m.padding),
                  dilation=tuple(m.dilation), groups=m.groups, bias=m.bias is not None)


def _single(name, v):
    """A torch 1-D attribute (a 1-tuple) as its int."""
    return v[0] if isinstance(v, (tuple, list)) and len(v) == 1 else v


def _conv1d(m):
    _require(m, padding_mode="zeros")
    padding = m.padding if isinstance(m.padding, str) else _single("padding", m.padding)  # ("same", "valid")
    return _layer("Conv1d", in_channels=m.in_channels, out_channels=m.out_channels,
                  kernel_size=_single("kernel_size", m.kernel_size), stride=_single("stride", m.stride),
                  padding=padding, dilation=_single("dilation", m.dilation), groups=m.groups, bias=m.bias is not None)


def _pool1d(kind):
    def convert(m):
        extra = {}
        if kind == "MaxPool1d":
            _require(m, return_indices=False)
            if _single("dilation", m.dilation) != 1:
                raise _Unsupported(f"dilation={m.dilation}")
            extra = {"ceil_mode": True} if m.ceil_mode else {}
        else:
            _require(m, ceil_mode=False, count_include_pad=True)
        return _layer(kind, kernel_size=_single("kernel_size", m.kernel_size), stride=_single("stride", m.stride),
                      padding=_single("padding", m.padding), **extra)
    return convert


def _conv_transpose2d(m):
    _require(m, padding_mode="zeros")
    return _layer("ConvTranspose2d", in_channels=m.in_channels, out_channels=m.out_channels,
                  kernel_size=tuple(m.kernel_size), stride=tuple(m.stride), padding=tuple(m.padding),
                  output_padding=tuple(m.output_padding), dilation=tuple(m.dilation), groups=m.groups,
                  bias=m.bias is not None)


def _conv_transpose1d(m):
    _require(m, padding_mode="zeros")
    return _layer("ConvTranspose1d", in_channels=m.in_channels, out_channels=m.out_channels,
                  kernel_size=_single("kernel_size", m.kernel_size), stride=_single("stride", m.stride),
                  padding=_single("padding", m.padding), output_padding=_single("output_padding", m.output_padding),
                  groups=m.groups, bias=m.bias is not None, dilation=_single("dilation", m.dilation))


def _batchnorm(kind):
    def convert(m):
        _require(m, affine=True, track_running_stats=True)
        if m.momentum is None:
            raise _Unsupported("momentum=None (a cumulative average; netcl keeps an exponential one)")
        return _layer(kind, num_features=m.num_features, eps=m.eps, momentum=m.momentum)
    return convert


def _layernorm(m):
    shape = tuple(m.normalized_shape)
    if len(shape) != 1:
        raise _Unsupported(f"normalized_shape={shape} (netcl normalises over the last dimension only)")
    _require(m, elementwise_affine=True)
    if getattr(m, "bias", True) is None:
        raise _Unsupported("bias=False")
    return _layer("LayerNorm", normalized_shape=shape[0], eps=m.eps)


def _groupnorm(m):
    return _layer("GroupNorm", num_groups=m.num_groups, num_channels=m.num_channels, eps=m.eps, affine=m.affine)


def _instancenorm(kind):
    def convert(m):
        _require(m, track_running_stats=False)
        return _layer(kind, num_features=m.num_features, eps=m.eps, affine=m.affine)
    return convert


def _pool(kind):
    def convert(m):
        extra = {}
        if kind == "MaxPool2d":
            _require(m, return_indices=False)
            if m.dilation not in (1, (1, 1)):
                raise _Unsupported(f"dilation={m.dilation}")
            extra = {"ceil_mode": True} if m.ceil_mode else {}
        else:
            _require(m, ceil_mode=False, count_include_pad=True, divisor_override=None)
        as_is = lambda v: tuple(v) if isinstance(v, (tuple, list)) else v  # noqa: E731  (pairs as pairs)
        return _layer(kind, kernel_size=as_is(m.kernel_size), stride=as_is(m.stride), padding=as_is(m.padding),
                      **extra)
    return convert


def _same(kind, *attrs):
    """A layer whose netcl config is the torch module's attributes of the same names."""
    return lambda m: _layer(kind, **{a: getattr(m, a) for a in attrs})


def _attention(m):
    _require(m, batch_first=True, dropout=0.0, _qkv_same_embed_dim=True, bias_k=None, bias_v=None,
             add_zero_attn=False)
    if m.in_proj_bias is None:
        raise _Unsupported("bias=False")
    return _layer("MultiheadAttention", embed_dim=m.embed_dim, num_heads=m.num_heads)


def _log_softmax(m):
    if m.dim is None:
        raise _Unsupported("dim=None (torch's implicit dimension; give dim explicitly)")
    return _layer("LogSoftmax", dim=m.dim)


def _prelu(m):
    return _layer("PReLU", num_parameters=m.num_parameters, init=float(getattr(m, "init", 0.25)))


def _embedding(m):
    _require(m, max_norm=None, scale_grad_by_freq=False, sparse=False)
    return _layer("Embedding", num_embeddings=m.num_embeddings, embedding_dim=m.embedding_dim,
                  padding_idx=m.padding_idx)


def _softmax(m):
    if m.dim is None:
        raise _Unsupported("dim=None (torch's implicit dimension; give dim explicitly)")
    return _layer("Softmax", dim=m.dim)


def _rnn(kind):
    def convert(m):
        if getattr(m, "proj_size", 0):
            raise _Unsupported(f"proj_size={m.proj_size} (netcl's LSTM has no projection)")
        return _layer(kind, input_size=m.input_size, hidden_size=m.hidden_size, num_layers=m.num_layers,
                      bias=m.bias, batch_first=m.batch_first, dropout=float(m.dropout),
                      bidirectional=m.bidirectional)
    return convert


# torch class name -> converter (the netcl class has the same name); entries whose netcl class does
# not exist yet are left out of supported(), so a layer added to netcl.nn under its API name is
# supported here by the entry already written for it
CONVERTERS = {
    "Linear": _linear,
    "Conv2d": _conv2d,
    "Conv1d": _conv1d,
    "ConvTranspose2d": _conv_transpose2d,
    "ConvTranspose1d": _conv_transpose1d,
    "BatchNorm1d": _batchnorm("BatchNorm1d"),
    "BatchNorm2d": _batchnorm("BatchNorm2d"),
    "LayerNorm": _layernorm,
    "GroupNorm": _groupnorm,
    "InstanceNorm2d": _instancenorm("InstanceNorm2d"),
    "InstanceNorm1d": _instancenorm("InstanceNorm1d"),
    "MaxPool2d": _pool("MaxPool2d"),
    "AvgPool2d": _pool("AvgPool2d"),
    "MaxPool1d": _pool1d("MaxPool1d"),
    "AvgPool1d": _pool1d("AvgPool1d"),
    "AdaptiveAvgPool2d": _same("AdaptiveAvgPool2d", "output_size"),
    "AdaptiveAvgPool1d": _same("AdaptiveAvgPool1d", "output_size"),
    "ReLU": _same("ReLU"),
    "LeakyReLU": _same("LeakyReLU", "negative_slope"),
    "Sigmoid": _same("Sigmoid"),
    "Tanh": _same("Tanh"),
    "GELU": _same("GELU", "approximate"),
    "SiLU": _same("SiLU"),
    "ReLU6": _same("ReLU6"),
    "Hardswish": _same("Hardswish"),
    "Hardsigmoid": _same("Hardsigmoid"),
    "Softmax": _softmax,
    "Embedding": _embedding,
    "LogSoftmax": _log_softmax,
    "ELU": _same("ELU", "alpha"),
    "Softplus": _same("Softplus", "beta", "threshold"),
    "Mish": _same("Mish"),
    "PReLU": _prelu,
    "LSTM": _rnn("LSTM"),  # (weights in torch's layout and gate order: the same as netcl's)
    "GRU": _rnn("GRU"),
    "MultiheadAttention": _attention,  # (self-attention, query, key and value one tensor: netcl.nn.torch_graph)
    "Flatten": _same("Flatten", "start_dim", "end_dim"),
    "Dropout": _same("Dropout", "p"),
    "Identity": _same("Identity"),
}


def _netcl_layers():
    """netcl's public layer classes by name, found as Module's subclasses: this module sits inside
    netcl.nn and cannot import the package's registry without an import cycle."""
    found, todo = {}, [Module]
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if cls.__module__.startswith("netcl.nn.") and not cls.__name__.startswith("_"):
            found[cls.__name__] = cls
    return found


def supported():
    """The torch classes from_torch converts with this netcl (Sequential nests them)."""
    have = _netcl_layers()
    return ["Sequential"] + [k for k in CONVERTERS if k in have]


def _torch_class(m):
    """The torch.nn class name of `m`, or None if it is not a torch.nn module (checked by module path,
    so a user's class that happens to be called Linear is not mistaken for torch's)."""
    cls = type(m)
    return cls.__name__ if cls.__module__.startswith("torch.nn.modules.") else None


def _is_torch_module(m):
    return any(c.__module__ == "torch.nn.modules.module" and c.__name__ == "Module" for c in type(m).__mro__)


def _convert(m, path, problems):
    kind = _torch_class(m)
    where = f"layer {path or '(top)'} ({type(m).__name__})"
    if kind is None and _is_torch_module(m):  # a forward of its own: its torch.fx graph
        found = []
        layer = from_fx(m, _convert, found)
        problems += [f"{where}: {p}" for p in found]
        return layer
    if kind == "Sequential":
        layers = [_convert(child, f"{path}.{name}" if path else name, problems) for name, child in m.named_children()]
        return None if None in layers else Sequential(*layers)
    if kind not in supported():
        problems.append(f"{where}: not supported")
        return None
    try:
        return CONVERTERS[kind](m)
    except _Unsupported as e:
        problems.append(f"{where}: {e}")
        return None


def from_torch(module):
    """The netcl model of torch module `module`, with its weights: a torch.nn.Sequential of
    supported layers (nested Sequentials included) or one supported layer gives a netcl Sequential;
    any other module (a forward of its own) is traced with torch.fx and gives a TorchGraph, a netcl
    Module that takes the same steps with netcl layers and operations (netcl.trace makes it a
    GraphModule, which runs fused; save and export_onnx take it as any Module subclass). The
    state_dict keys are torch's; the result is in the torch module's mode (train or eval) and holds
    its weights on the host.

    Raises TypeError if `module` is not a torch.nn module, NotImplementedError naming every
    unsupported layer (its path and class), setting, function or method and listing the supported
    layer classes."""
    if not _is_torch_module(module):
        raise TypeError(f"from_torch expects a torch.nn.Module, got {type(module).__name__}")
    problems = []
    model = _convert(module, "", problems)
    if problems:
        raise NotImplementedError("cannot convert the torch model: " + "; ".join(problems)
                                  + f". Supported torch layers: {', '.join(supported())}")
    state = module.state_dict()
    if _torch_class(module) is not None and not isinstance(model, Sequential):
        model = Sequential(model)
        state = {f"0.{k}": v for k, v in state.items()}
    own = model.state_dict()
    model.load_state_dict({k: v for k, v in state.items() if k in own})  # (a torch layer forward never calls: left out)
    return model.train(bool(module.training))

