"""netcl: a small deep-learning layer library on OpenCL, with a faithful ONNX exporter.

Importing netcl needs only numpy: pyopencl is imported when a device is first used, so that
models can be built, loaded and exported on machines without OpenCL.
"""
from netcl import errors, nn, optim
from netcl.errors import CompileError, FormatError, NetclError, NoDeviceError
from netcl.nn.layers import manual_seed
from netcl.tensor import Tensor
from netcl.version import __version__


def devices():
    """Available OpenCL devices: a list of DeviceInfo(platform, name, type, index)."""
    from netcl.runtime import devices as _devices

    return _devices()


def default_queue(spec=None):
    """The pyopencl.CommandQueue of the selected device ($NETCL_DEVICE: gpu, cpu or a name substring)."""
    from netcl.runtime import default_queue as _default_queue

    return _default_queue(spec)


def __getattr__(name):  # netcl.io on first use: keeps `import netcl` light
    if name == "io":
        import importlib

        return importlib.import_module("netcl.io")
    raise AttributeError(f"module 'netcl' has no attribute {name!r}")


__all__ = ["Tensor", "nn", "optim", "io", "errors", "devices", "default_queue", "manual_seed", "NetclError",
           "NoDeviceError", "CompileError", "FormatError", "__version__"]
