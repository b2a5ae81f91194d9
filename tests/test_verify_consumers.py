"""tools/verify_consumers.py without running a consumer (that installs about 4.5 GB, so it is not in
CI): its tables point at each other and at TARGETS, and the summary says what was measured."""
import importlib.util
import os

from netcl.io import onnx_export as ox
from test_onnx_opsets import LAYER_MODELS

PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools", "verify_consumers.py")
spec = importlib.util.spec_from_file_location("verify_consumers", PATH)
vc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(vc)


def test_tables_agree():
    for name, (venv, kind, target) in vc.CONSUMERS.items():
        assert venv in vc.VENVS, name
        assert target is None or target in ox.TARGETS, name
    models = {"mlp", "cnn", "detector26", "every-layer", "attention"} | {f"layer:{t.__name__}" for t in LAYER_MODELS}
    for name, (model, _) in vc.KNOWN.items():
        assert name in vc.CONSUMERS and model in models, name


def test_summary():
    ok, bad = {"diff": 1e-6}, {"diff": 0.3}
    runs = {"mlp": {11: ok, 13: ok, 17: ok, 21: {"error": "Fail: Load model from /tmp/x/m.onnx failed:/src/a.cc:149 "
                                                        "Unsupported model IR version: 10, max supported IR version: 9"}},
            "layer:AvgPool2d": {11: bad, 13: bad, 17: bad, 21: bad}}
    row = vc._summary("opencv-4.8", "4.8.1", runs, [11, 13, 17, 21])
    assert row["accepted"] == "11, 13, 17 (all but layer:AvgPool2d)" and row["accepted_list"] == [11, 13, 17]
    assert row["max_abs_diff"] == 0.3
    assert row["notes"][0] == "mlp at 21: reads IR 9 at most"
    assert row["notes"][1] == "layer:AvgPool2d at 11, 13, 17, 21: differs by up to 3.0e-01"
    assert row["notes"][2].startswith("cause: AveragePool's count_include_pad=1 is ignored")
    assert vc._summary("x", None, {"mlp": {11: bad}}, [11])["accepted"] == "none"
    assert vc._ranges([11, 12, 13, 15, 17, 18]) == "11-13, 15, 17-18"
    missing = {o: {"error": f"Converter is not implemented (OperationDescription(domain='', operation_type='Conv', "
                            f"version={o}))"} for o in (22, 23)}
    row = vc._summary("onnx2torch", "1.5", {"a": {17: ok, **missing}, "b": {17: ok, **missing}}, [17, 22, 23])
    assert row["accepted"] == "17" and row["notes"] == ["every model at 22-23: no converters for Conv-22, Conv-23"]
