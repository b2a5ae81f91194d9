"""A netcl model rebuilt in tinygrad with the same weights: the training-step peer of
tools/benchmark_training_step.py (tinygrad 0.14; pick its OpenCL backend with DEV=CL, as the
training-speed issue does). Covers the layers of the training table's models: Sequential,
Residual, Concat, Conv2d (groups too), BatchNorm2d, Linear, the pools, nearest Upsample, Flatten,
Dropout, ReLU, ReLU6, LeakyReLU, Sigmoid, Tanh, Identity (so also mobilenetv2_tiny and unet_tiny;
not vit_tiny: no MultiheadAttention). netcl's Linear stores (in, out), tinygrad's (out, in) like
PyTorch's: transposed here."""
import numpy as np


def pip_opencl():
    """On a machine whose only OpenCL is pip's (pyopencl's bundled ICD loader and PoCL), point
    tinygrad at that loader, set up by importing pyopencl first: tinygrad's own load of it
    crashed in clGetPlatformIDs here (tinygrad 0.14, PoCL 3.0)."""
    import glob
    import os

    if os.environ.get("OPENCL_PATH") or os.environ.get("DEV", "").upper() != "CL":
        return
    try:
        import pyopencl
    except ImportError:
        return
    libs = glob.glob(os.path.join(os.path.dirname(pyopencl.__file__), ".libs", "libOpenCL*.so*"))
    if libs:
        pyopencl.get_platforms()
        os.environ["OPENCL_PATH"] = libs[0]


def twin(layer):
    """(callable x -> y, [tinygrad parameter Tensors]) for a netcl layer, weights copied."""
    from tinygrad import Tensor, nn

    kind = type(layer).__name__

    def t(array):  # a trainable tinygrad Tensor (SGD makes its parameters require gradients)
        return Tensor(np.ascontiguousarray(array.numpy() if hasattr(array, "numpy") else array))

    if kind == "Sequential":
        parts = [twin(child) for _, child in layer.named_children()]

        def seq(x):
            for f, _ in parts:
                x = f(x)
            return x
        return seq, [p for _, ps in parts for p in ps]
    if kind == "Residual":
        body = twin(layer.body)
        short = twin(layer.shortcut) if layer.shortcut is not None else (lambda x: x, [])
        return (lambda x: body[0](x) + short[0](x)), body[1] + short[1]
    if kind == "Concat":
        branches = [twin(b) for b in layer.branches.layers]
        return ((lambda x: Tensor.cat(*[f(x) for f, _ in branches], dim=layer.dim)),
                [p for _, ps in branches for p in ps])
    if kind == "Upsample" and layer.mode == "nearest":  # (netcl's scale factors are integers)
        f = layer.scale_factor
        return (lambda x: x.repeat_interleave(f, dim=2).repeat_interleave(f, dim=3)), []
    if kind == "Conv2d":
        conv = nn.Conv2d(layer.in_channels, layer.out_channels, layer.kernel_size, stride=layer.stride,
                         padding=layer.padding, dilation=layer.dilation, groups=layer.groups,
                         bias=layer.bias is not None)
        conv.weight = t(layer.weight)
        if layer.bias is not None:
            conv.bias = t(layer.bias)
        return conv, [conv.weight] + ([conv.bias] if layer.bias is not None else [])
    if kind == "BatchNorm2d":
        bn = nn.BatchNorm(layer.num_features, eps=layer.eps, momentum=layer.momentum)
        bn.weight, bn.bias = t(layer.weight), t(layer.bias)
        bn.running_mean, bn.running_var = t(layer.running_mean), t(layer.running_var)
        return bn, [bn.weight, bn.bias]
    if kind == "Linear":
        lin = nn.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None)
        lin.weight = t(layer.weight.numpy().T)  # netcl's (in, out) -> tinygrad's (out, in)
        if layer.bias is not None:
            lin.bias = t(layer.bias)
        return lin, [lin.weight] + ([lin.bias] if layer.bias is not None else [])
    if kind in ("MaxPool2d", "AvgPool2d"):
        k, s, p = layer.kernel_size, layer.stride, layer.padding
        if kind == "MaxPool2d":
            return (lambda x: x.max_pool2d((k, k), stride=s, padding=p)), []
        return (lambda x: x.avg_pool2d((k, k), stride=s, padding=p, count_include_pad=True)), []
    if kind == "AdaptiveAvgPool2d" and layer.output_size == 1:
        return (lambda x: x.mean(axis=(2, 3), keepdim=True)), []
    if kind == "Flatten":
        return (lambda x: x.flatten(layer.start_dim, layer.end_dim)), []
    if kind == "Dropout":
        return (lambda x: x.dropout(layer.p)), []
    acts = {"ReLU": lambda x: x.relu(), "Sigmoid": lambda x: x.sigmoid(), "Tanh": lambda x: x.tanh(),
            "LeakyReLU": lambda x: x.leaky_relu(getattr(layer, "slope", 0.01)), "ReLU6": lambda x: x.relu6(),
            "Identity": lambda x: x}
    if kind in acts:
        return acts[kind], []
    raise NotImplementedError(f"no tinygrad twin for {kind}")


def train_step(model, x, target, loss, lr=1e-3, momentum=0.9):
    """A TinyJit training step of the twin of `model`: forward, loss ("mse" against a float target
    array, "ce" against class indices), backward, SGD with momentum; returns step() -> loss float."""
    from tinygrad import Tensor, TinyJit
    from tinygrad.helpers import Context
    from tinygrad.nn.optim import SGD

    forward, params = twin(model)
    opt = SGD(params, lr=lr, momentum=momentum)
    xt = Tensor(x).realize()
    yt = Tensor(target.astype(np.int32) if loss == "ce" else target).realize()

    @TinyJit
    def step(x, y):
        opt.zero_grad()
        out = forward(x)
        value = out.sparse_categorical_crossentropy(y) if loss == "ce" else ((out - y) ** 2).mean()
        value.backward()
        opt.step()
        return value.realize()

    def run():
        with Context(TRAINING=1):
            return step(xt, yt).item()
    return run
