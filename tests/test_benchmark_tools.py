"""tools/benchmark_training_step.py's per-kernel profile (--kernels) on a tiny step: every launch of
a training step is seen, and the kernel time it reports is the events' sum, no more than the wall time."""
import importlib.util
import os
import types

PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools", "benchmark_training_step.py")
spec = importlib.util.spec_from_file_location("benchmark_training_step", PATH)
bts = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bts)


def test_kernel_profile_sees_every_launch(queue, capsys):
    from netcl import ops

    args = types.SimpleNamespace(device=None, steps=2, warmup=1)
    rows, busy, wall = bts.kernel_profile_netcl("digits", 4, args)
    assert ops._enqueue is not None and ops._enqueue.__name__ == "_enqueue"  # restored
    launches = sum(n for _, n, _ in rows)
    assert launches >= 20 and {"sgd_step", "cross_entropy"} <= {k for k, _, _ in rows}
    assert all(ms >= 0 for _, _, ms in rows) and 0 < busy <= wall
    out = capsys.readouterr().out
    assert "netcl kernels per training step: digits batch 4" in out and "step wall time" in out


BT_PATH = os.path.join(os.path.dirname(PATH), "benchmark_training.py")
bt_spec = importlib.util.spec_from_file_location("benchmark_training", BT_PATH)
bt = importlib.util.module_from_spec(bt_spec)
bt_spec.loader.exec_module(bt)


def test_training_gemms_logs_every_gemm_of_a_step(queue):
    """The GEMM benchmark's training shapes come from a step's own calls: the digits CNN at batch 4
    as layer calls runs its Linear's three (forward, weight and input gradients) and its two convs'
    weight gradients, each named with its layer; as a TrainStep on a CPU the Linear and the loss
    are one kernel instead. ops.gemm and enqueue_linear are themselves again afterwards."""
    from netcl import nn, ops

    real = ops.gemm, nn.CrossEntropyLoss.enqueue_linear
    gemms, heads = bt.training_gemms(queue, [("digits", 4)], mode="loop")
    assert (ops.gemm, nn.CrossEntropyLoss.enqueue_linear) == real and heads == []
    shapes = {(label.split(" ", 2)[2], M, N, K, batch, bt._layout(sa, sb)) for label, M, N, K, batch, sa, sb, sc in gemms}
    linear = {("Linear.forward", 4, 10, 128, 1, "NN"), ("Linear._param_grads", 128, 10, 4, 1, "TN"),
              ("Linear.backward", 4, 128, 10, 1, "NT")}
    convs = {("Conv2d._backward_cpu", 32, 144, 64, 1, "NT"), ("Conv2d._backward_cpu", 16, 9, 256, 1, "NT")}
    if ops.is_cpu(queue):
        assert shapes == convs | linear, shapes
    else:  # (a GPU's convolutions run GEMMs of their own)
        assert linear <= shapes, shapes
    gemms, heads = bt.training_gemms(queue, [("digits", 4)])
    shapes = {(label.split(" ", 2)[2], M, N, K, batch, bt._layout(sa, sb)) for label, M, N, K, batch, sa, sb, sc in gemms}
    if ops.is_cpu(queue):
        assert shapes == convs and heads == [("digits b4 Linear + cross-entropy", 4, 128, 10)]
    else:
        assert linear <= shapes and heads == [], shapes


def test_gemm_benchmark_rows(queue, capsys):
    """bench_gemm on one step's GEMMs: every row agrees with float64 numpy, each side timed, and the
    summary names the empty launch's time."""
    from netcl import ops

    res = bt.bench_gemm(queue, 1, True, steps=[("digits", 2)])
    shapes = [r for r in res["shapes"] if r["label"] != "square"]
    assert (len(shapes) == 2 if ops.is_cpu(queue) else len(shapes) >= 3) and len(res["heads"]) == int(ops.is_cpu(queue))
    assert all(r["rel_err"] < 1e-5 for r in res["shapes"] + res["heads"])
    assert all(r[k] > 0 for r in res["shapes"] for k in ("netcl_us", "replayed_us", "numpy_us"))
    assert all(r[k] > 0 for r in res["heads"] for k in ("replayed_us", "numpy_us"))
    assert res["empty_launch_us"] > 0 and "an empty kernel's launch" in capsys.readouterr().out
