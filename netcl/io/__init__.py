"""netcl.io: .netcl files, training checkpoints, ONNX export and import, ONNX test cases. Needs no OpenCL device."""


def __getattr__(name):  # each submodule loads on first use, so neither needs the other's dependencies
    import importlib

    where = {"save": "netcl_format", "load": "netcl_format", "save_checkpoint": "netcl_format",
             "load_checkpoint": "netcl_format", "export_onnx": "onnx_export", "import_onnx": "onnx_graph",
             "export_test_case": "onnx_test_case"}
    if name in where:
        return getattr(importlib.import_module(f"netcl.io.{where[name]}"), name)
    raise AttributeError(f"module 'netcl.io' has no attribute {name!r}")


__all__ = ["save", "load", "save_checkpoint", "load_checkpoint", "export_onnx", "import_onnx", "export_test_case"]
