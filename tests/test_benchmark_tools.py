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
