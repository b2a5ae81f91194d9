"""export_test_case: a model and an input -> the ONNX backend-test layout, for any consumer to check.

    folder/model.onnx
    folder/test_data_set_0/input_0.pb     TensorProto of the input
    folder/test_data_set_0/output_0.pb    TensorProto of netcl's output for it

(onnx's backend tests and `onnx_test_runner` read this layout; the .pb files load with
onnx.numpy_helper.to_array(onnx.load_tensor(path))). Written with netcl's own bindings.
"""
import os

import numpy as np

from netcl import nn
from netcl.io.atomic import AtomicFile
from netcl.io.onnx_export import export_onnx, onnx_pb2 as P
from netcl.tensor import Tensor, _as_float32


def tensor_proto(array, name, int64=False):
    """A float32 (or, int64=True, int64) TensorProto (raw little-endian bytes) of `array`."""
    a = np.ascontiguousarray(array, dtype="<i8" if int64 else "<f4")
    return P.TensorProto(dims=a.shape, data_type=P.TensorProto.INT64 if int64 else P.TensorProto.FLOAT, name=name,
                         raw_data=a.tobytes())


def export_test_case(model, x, folder, **export_options):
    """Write an ONNX backend test case: `folder/model.onnx`, and `x` with netcl's output for it as
    `folder/test_data_set_0/input_0.pb` and `output_0.pb` (TensorProto).

    Args:
        model: a netcl model in eval mode.
        x: the input (a host array); the export's input shape is `x.shape`.
        folder: where to write (made if missing).
        **export_options: passed to export_onnx (opset, target, dynamic_batch, input_name,
            output_name, metadata, ...).

    Returns:
        The list of files written.
    """
    x = _as_float32(x)
    if model.training:
        raise ValueError("the model is in training mode; call model.eval() before exporting a test case")
    folder = os.fspath(folder)
    data = os.path.join(folder, "test_data_set_0")
    os.makedirs(data, exist_ok=True)
    files = export_onnx(model, x.shape, os.path.join(folder, "model.onnx"), **export_options)
    y = model(Tensor.from_host(None, x)).to_host()
    names = (export_options.get("input_name", "input"), export_options.get("output_name", "output"))
    indices = isinstance(next(iter(model.chain()), (None, None))[1], nn.Embedding)  # the graph input is int64
    for (array, name, ints), file in zip(((x, names[0], indices), (y, names[1], False)), ("input_0.pb", "output_0.pb")):
        with AtomicFile(os.path.join(data, file), "write test case") as f:
            f.write(tensor_proto(array, name, ints).SerializeToString())
        files.append(os.path.join(data, file))
    return files
