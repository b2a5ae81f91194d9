"""Check an ONNX export against netcl: run the model in netcl and in onnxruntime on the same
input and compare. Used by `netcl verify`, tools/verify_onnx_export.py and the tests.

    r = verify(model.eval(), x)                 # x: np.ndarray (N, ...)
    print(r.max_abs_diff, r.allclose, r.provider)
"""
import os
import tempfile
from dataclasses import dataclass, field

import numpy as np

import netcl
from netcl.apps.common import ort_session
from netcl.io.onnx_export import DEFAULT_OPSET, export_onnx

ATOL, RTOL = 1e-4, 1e-3


@dataclass
class VerifyResult:
    """What `verify` found; `ok` is `allclose` (np.allclose(onnx, netcl, atol, rtol))."""

    max_abs_diff: float
    allclose: bool
    provider: str  # the execution provider onnxruntime really ran first, e.g. "CPUExecutionProvider"
    batch: int
    atol: float
    rtol: float
    netcl_output: np.ndarray = field(repr=False)
    onnx_output: np.ndarray = field(repr=False)

    @property
    def ok(self):
        """Whether the two outputs agree (np.allclose with atol and rtol)."""
        return self.allclose

    HEADER = f"{'batch':>5s}  {'provider':24s} {'max abs diff':>12s}  allclose"

    def row(self):
        """One line under HEADER: batch, provider, largest absolute difference, allclose."""
        return f"{self.batch:5d}  {self.provider:24s} {self.max_abs_diff:12.3e}  {'yes' if self.allclose else 'NO'}"

    def __str__(self):
        return (f"netcl vs onnxruntime ({self.provider}), batch {self.batch}, output {self.netcl_output.shape}: "
                f"max abs diff {self.max_abs_diff:.3e}, allclose(atol={self.atol:g}, rtol={self.rtol:g}) "
                f"{'OK' if self.allclose else 'MISMATCH'}")


def verify(model, x, *, provider="cpu", queue=None, onnx_path=None, opset=None, dynamic_batch=True,
           atol=ATOL, rtol=RTOL, seed=0):
    """Export `model` to ONNX and compare onnxruntime's output with netcl's on input `x`.

    model: a netcl Sequential in eval mode (export refuses training mode).
    x: the input, array-like (N, ...), converted to float32; or an input shape (a tuple of ints,
        batch first), for which a standard-normal input is drawn with `seed`.
    provider: onnxruntime execution provider, "cpu" or "cuda" (see netcl.apps.common.ort_session).
    queue: the pyopencl queue netcl runs on (default: netcl.default_queue(), i.e. $NETCL_DEVICE).
    onnx_path: an existing .onnx file to check instead of exporting; None exports to a temporary
        file (with `opset`, default the exporter's, and `dynamic_batch`) and removes it afterwards.
    atol, rtol: the np.allclose tolerances (default 1e-4, 1e-3).
    Returns a VerifyResult (print it, or test `.ok`); raises what export_onnx raises (ValueError,
    NotImplementedError) and ImportError where onnxruntime is missing.
    """
    if isinstance(x, (tuple, list)) and all(isinstance(d, (int, np.integer)) for d in x):
        x = np.random.default_rng(seed).standard_normal(tuple(int(d) for d in x), dtype=np.float32)
    x = np.ascontiguousarray(x, dtype=np.float32)
    with tempfile.TemporaryDirectory(prefix="netcl-verify-") as tmp:
        path = onnx_path
        if path is None:
            path = os.path.join(tmp, "model.onnx")
            export_onnx(model, x.shape, path, opset=opset or DEFAULT_OPSET, dynamic_batch=dynamic_batch)
        sess = ort_session(path, provider)
        feed = {sess.get_inputs()[0].name: x}
        got = sess.run(None, feed)[0]
        used = sess.get_providers()[0]
        del sess  # release the file (external data) before the folder goes
    q = queue if queue is not None else netcl.default_queue()
    want = model(netcl.Tensor.from_host(q, x)).to_host()
    if got.shape != want.shape:
        raise ValueError(f"onnxruntime output shape {got.shape} differs from netcl's {want.shape}")
    diff = float(np.max(np.abs(got.astype(np.float64) - want))) if want.size else 0.0
    return VerifyResult(max_abs_diff=diff, allclose=bool(np.allclose(got, want, atol=atol, rtol=rtol)),
                        provider=used, batch=int(x.shape[0]), atol=atol, rtol=rtol, netcl_output=want,
                        onnx_output=got)
