"""netcl: a small deep-learning library on OpenCL, programmed as PyTorch is, with a faithful
ONNX exporter.

Importing netcl needs only numpy: pyopencl is imported when a device is first used, so that
models can be built, loaded and exported on machines without OpenCL.
"""
import importlib

from netcl import data, errors, nn, optim
from netcl.autograd import enable_grad, is_grad_enabled, no_grad, set_grad_enabled
from netcl.errors import CompileError, FormatError, NetclError, NoDeviceError
from netcl.functions import arange, cat, ones, randn, stack, tensor, zeros
from netcl.nn.graph import trace
from netcl.rng import manual_seed
from netcl.runtime import default_queue, devices
from netcl.tensor import FLOAT32 as float32
from netcl.tensor import INT32 as int32
from netcl.tensor import Tensor
from netcl.trainstep import TrainStep
from netcl.version import __version__


def __getattr__(name):  # netcl.io on first use: keeps `import netcl` light (no protobuf bindings loaded)
    if name == "io":
        return importlib.import_module("netcl.io")
    raise AttributeError(f"module 'netcl' has no attribute {name!r}")


__all__ = ["Tensor", "tensor", "trace", "zeros", "ones", "randn", "arange", "cat", "stack", "float32", "int32", "no_grad",
           "enable_grad", "set_grad_enabled", "is_grad_enabled", "TrainStep", "nn", "optim", "data", "io", "errors", "devices",
           "default_queue", "manual_seed", "NetclError", "NoDeviceError", "CompileError", "FormatError",
           "__version__"]
