"""netcl.apps.common: the argument types of the command lines, the median timer, the
onnxruntime session builder."""
import argparse

import pytest

from netcl.apps import common


@pytest.mark.parametrize("text, want", [("1,3,8,8", (1, 3, 8, 8)), ("1x3x8x8", (1, 3, 8, 8)), ("7", (7,))])
def test_shape_accepts_positive_integers(text, want):
    assert common.shape(text) == want


@pytest.mark.parametrize("text", ["", "1,,8", "1,0,8", "-1", "a,b", "1.5"])
def test_shape_refuses_anything_else_and_says_what_it_expected(text):
    with pytest.raises(argparse.ArgumentTypeError, match="expected a shape of positive integers"):
        common.shape(text)


def test_positive_int_and_lists():
    assert common.positive_int("3") == 3
    for bad in ("0", "-2", "x"):
        with pytest.raises(argparse.ArgumentTypeError, match="expected a positive integer"):
            common.positive_int(bad)
    assert common.positive_ints("1,8,32") == (1, 8, 32)
    with pytest.raises(argparse.ArgumentTypeError, match="comma-separated positive integers"):
        common.positive_ints("1,0")
    assert common.names("cnn,mlp") == ("cnn", "mlp")


def test_median_time_warms_up_then_times_repeats():
    calls = []
    t = common.median_time(lambda: calls.append(1), 5, warmup=2)
    assert len(calls) == 7 and t >= 0.0
    calls.clear()
    common.median_time(lambda: calls.append(1), 1, min_seconds=60.0, max_repeats=4)
    assert len(calls) == 4  # min_seconds asks for more runs, max_repeats bounds them


def test_interleaved_medians_take_turns():
    order = []
    fns = {"a": lambda: order.append("a"), "b": lambda: order.append("b")}
    out = common.interleaved_medians(fns, 2, 3, warmup=1)
    assert set(out) == {"a", "b"} and all(v >= 0.0 for v in out.values())
    assert "".join(order) == "aaabbb" * 3  # per round: each runtime's warm-up and repeats in turn


def test_ort_session_refuses_an_unknown_provider(tmp_path):
    pytest.importorskip("onnxruntime")
    with pytest.raises(ValueError, match="provider must be one of"):
        common.ort_session(tmp_path / "m.onnx", "tpu")
