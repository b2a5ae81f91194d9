"""tools/benchmark_training_step.py's per-kernel profile (--kernels) on a tiny step: every launch of
a training step is seen, and the kernel time it reports is the events' sum, no more than the wall time."""
import importlib.util
import os
import types

import numpy as np
import pytest

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
    names = {k for k, _, _ in rows}  # (the SGD update: sgd_step_cpu on CPUs)
    assert launches >= 20 and "cross_entropy" in names and names & {"sgd_step", "sgd_step_cpu"}
    assert all(ms >= 0 for _, _, ms in rows) and 0 < busy <= wall
    out = capsys.readouterr().out
    assert "netcl kernels per training step: digits batch 4" in out and "step wall time" in out


BT_PATH = os.path.join(os.path.dirname(PATH), "benchmark_training.py")
bt_spec = importlib.util.spec_from_file_location("benchmark_training", BT_PATH)
bt = importlib.util.module_from_spec(bt_spec)
bt_spec.loader.exec_module(bt)


def test_training_gemms_logs_every_gemm_of_a_step(queue, monkeypatch):
    """The GEMM benchmark's training shapes come from a step's own calls: the digits CNN at batch 4
    as layer calls runs its Linear's three (forward, weight and input gradients) and its second
    conv's weight gradient (on an AVX-512 class CPU one direct kernel, "oc16"), each named with its
    layer; on a CPU its first conv's weight gradient is computed in its BatchNorm's pooled backward
    pass ("pooled", logged with its geometry), without the training fusions by one direct kernel
    ("narrow"), and, as a TrainStep, the Linear and the loss are one kernel too. What it wraps is
    itself again afterwards."""
    from netcl import nn, ops
    from netcl.nn import sequential

    def wrapped():
        return (ops.gemm, nn.CrossEntropyLoss.enqueue_linear, nn.Conv2d._wgrad_narrow,
                nn.BatchNorm2d._conv_grads_pooled, nn.Conv2d._wgrad_oc16)

    real = wrapped()
    gemms, heads, direct = bt.training_gemms(queue, [("digits", 4)], mode="loop")
    assert wrapped() == real and heads == []
    shapes = {(label.split(" ", 2)[2], M, N, K, batch, bt._layout(sa, sb)) for label, M, N, K, batch, sa, sb, sc in gemms}
    linear = {("Linear.forward", 4, 10, 128, 1, "NN"), ("Linear._param_grads", 128, 10, 4, 1, "TN"),
              ("Linear.backward", 4, 128, 10, 1, "NT")}
    oc16 = ops.config_class(queue) == "cpu16"
    convs = set() if oc16 else {("Conv2d._backward_cpu", 32, 144, 64, 1, "NT")}
    geometry = (1, 16, 3, 1, True, (4, 1, 10, 10), (4, 16, 8, 8))
    first = [("digits b4 Conv2d._wgrad_oc16", "oc16", 16, 32, 3, 1, True, (4, 16, 6, 10), (4, 32, 4, 4))] * oc16
    first += [("digits b4 BatchNorm2d pass + Conv2d dW", "pooled") + geometry]
    if ops.is_cpu(queue):
        assert shapes == convs | linear and direct == first, (shapes, direct)
    else:  # (a GPU's convolutions run GEMMs of their own)
        assert linear <= shapes and direct == [], shapes
    gemms, heads, direct = bt.training_gemms(queue, [("digits", 4)])
    shapes = {(label.split(" ", 2)[2], M, N, K, batch, bt._layout(sa, sb)) for label, M, N, K, batch, sa, sb, sc in gemms}
    if ops.is_cpu(queue):
        assert shapes == convs and heads == [("digits b4 Linear + cross-entropy", 4, 128, 10)] and direct == first
    else:
        assert linear <= shapes and heads == [] and direct == [], shapes
    monkeypatch.setattr(sequential, "TRAIN_FUSE", False)
    direct = bt.training_gemms(queue, [("digits", 4)])[2]
    narrow = [("digits b4 Conv2d._wgrad_narrow", "narrow") + geometry]
    assert direct == (first[:-1] + narrow if ops.is_cpu(queue) else [])


def test_gemm_benchmark_rows(queue, capsys, monkeypatch):
    """bench_gemm on one step's GEMMs: every row agrees with float64 numpy, each side timed, and the
    summary names the empty launch's time."""
    from netcl import ops

    monkeypatch.setattr(bt, "_SETTLE", 0.0)  # (the pause between timed sides: rows, not timings, here)
    res = bt.bench_gemm(queue, 1, True, steps=[("digits", 2)])
    shapes = [r for r in res["shapes"] if r["label"] != "square"]
    cpu, oc16 = int(ops.is_cpu(queue)), int(ops.config_class(queue) == "cpu16")
    assert (len(shapes) == 1 - oc16 if cpu else len(shapes) >= 3) and len(res["heads"]) == cpu
    assert len(res["direct"]) == cpu + oc16
    assert all(r["rel_err"] < 1e-5 for r in res["shapes"] + res["heads"] + res["direct"])
    assert all(r[k] > 0 for r in res["shapes"] for k in ("netcl_us", "replayed_us", "numpy_us"))
    assert all(r[k] > 0 for r in res["heads"] + res["direct"] for k in ("replayed_us", "numpy_us"))
    assert [(r["M"], r["N"], r["K"], r["kind"]) for r in res["direct"]] == (
        [(32, 144, 32, "oc16")] * oc16 + [(16, 9, 128, "pooled")] * cpu)
    assert all(r["replaced_us"] > 0 and r["replaced_launches"] == 4
               and r["launches"] == (3 if r["kind"] == "pooled" else 1) for r in res["direct"])
    assert all(r["pass_us"] > 0 and r["plain_pass_us"] > 0 for r in res["direct"] if r["kind"] == "pooled")
    assert res["empty_launch_us"] > 0 and "an empty kernel's launch" in capsys.readouterr().out


def test_direct_weight_gradient_rows(queue, capsys, monkeypatch):
    """bench_direct on every kind: _wgrad_narrow's launch, _wgrad_oc16's (AVX-512 class), the
    BatchNorm pass that takes dW and a 3x3 stride-2 convolution's _backward_phases (AVX2: dy_t8_cpu,
    wgrad2o_cpu and the sums of its chunks and of the bias's per-image parts; AVX-512: wgrad2_cpu,
    its chunks' sum and the bias's), each against the launches it replaced, the results equal to
    float64 numpy's product."""
    from netcl import ops, tuning

    if not ops.is_cpu(queue):
        pytest.skip("CPU kernels")
    monkeypatch.setattr(bt, "_SETTLE", 0.0)
    geometry = (1, 16, 3, 1, True, (2, 1, 10, 10), (2, 16, 8, 8))
    oc16 = ops.config_class(queue) == "cpu16"
    entries = [("a", "narrow") + geometry, ("b", "pooled") + geometry]
    entries += [("c", "oc16", 16, 32, 3, 1, True, (2, 16, 6, 6), (2, 32, 4, 4))] * oc16
    entries += [("d", "phases", 3, 5, 3, 1, True, (2, 3, 32, 32), (2, 5, 16, 16))]
    rows = bt.bench_direct(queue, 1, entries, np.random.default_rng(0))
    assert [(r["kind"], r["launches"], r["replaced_launches"]) for r in rows] == (
        [("narrow", 1, 4), ("pooled", 3, 4)] + [("oc16", 1, 4)] * oc16
        + [("phases", 4 if tuning.values("conv_train", ops.config_class(queue))["WG2_OL"] else 3, 4)])
    assert all(r["rel_err"] < 1e-5 and r["numpy_us"] > 0 and r["replayed_us"] > 0 for r in rows)
    out = capsys.readouterr().out
    assert "without a GEMM" in out and "inside the BatchNorm2d's backward pass" in out


def test_step_benchmark_models_take_their_registered_input():
    """The training-step benchmark's per-sample input shapes are netcl.models' own (a model added
    there with another shape fails its first layer)."""
    from netcl import models

    for name, (shape, _, _) in bts.MODELS.items():
        if name in models.MODELS:
            assert shape == models.MODELS[name].input_shape, name


def test_interleaved_steps_pair_the_runtimes(queue, tmp_path, capsys):
    """--interleave: netcl and PyTorch each in a warm child process (--serve), their steps taken in
    turn; every pair timed, the table's ratio that of the medians, the pairs' median inside their
    range, netcl's step the replayed TrainStep, and both children gone afterwards."""
    pytest.importorskip("torch")
    out = tmp_path / "pairs.json"
    bts.main(["--models", "digits", "--batches", "2", "--steps", "3", "--warmup", "3", "--threads", "1",
              "--quiet", "0", "--interleave", "--json", str(out)])
    import json

    (row,) = json.loads(out.read_text())
    steps = row["steps_ms"]
    assert set(steps) == {"netcl", "torch"} and len(steps["netcl"]) == len(steps["torch"]) == 3
    assert all(ms > 0 for ms in steps["netcl"] + steps["torch"])
    pairs = [a / b for a, b in zip(steps["netcl"], steps["torch"])]
    assert min(pairs) <= row["ratio_pairs_median"] <= max(pairs)
    assert abs(row["ratio"] - row["netcl_ms"] / row["torch_ms"]) < 1e-12
    assert row["netcl_path"] == "replayed" and row["netcl_launches"] > 0
    assert "pairs: median" in capsys.readouterr().out


def test_ab_pairs_netcl_against_itself_with_an_environment(queue, tmp_path, capsys):
    """--ab: netcl as it is (A) and with the given environment (B: here the unfused training path,
    NETCL_TRAIN_FUSE=0), steps in turn; B / A per pair, each side's steps kept."""
    out = tmp_path / "ab.json"
    bts.main(["--models", "digits", "--batches", "2", "--steps", "3", "--warmup", "3", "--ab", "NETCL_TRAIN_FUSE=0",
              "--json", str(out)])
    import json

    (row,) = json.loads(out.read_text())
    assert row["b_env"] == "NETCL_TRAIN_FUSE=0" and set(row["steps_ms"]) == {"A", "B"}
    pairs = [b / a for a, b in zip(row["steps_ms"]["A"], row["steps_ms"]["B"])]
    assert len(pairs) == 3 and min(pairs) <= row["ratio_pairs_median"] <= max(pairs)
    assert "(B: NETCL_TRAIN_FUSE=0)" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        bts.main(["--models", "digits", "--ab", "NETCL_TRAIN_FUSE"])  # not NAME=VALUE


def test_isa_runs_avx2_code_paths_in_a_restarted_process(queue):
    """--isa avx2: the tool starts again with netcl.apps.common.ISA_ENVIRONMENTS["avx2"] (PoCL's
    AVX2 code, netcl's 8-wide kernel variants, the peers' AVX2 paths) and its netcl step runs there;
    called from Python (main(argv)), where it cannot restart, it says so."""
    import json
    import subprocess
    import sys

    from netcl.apps import common

    env = {k: v for k, v in os.environ.items() if k not in common.ISA_ENVIRONMENTS["avx2"]}
    run = subprocess.run([sys.executable, PATH, "--isa", "avx2", "--runtime", "netcl", "--models", "digits",
                          "--batches", "2", "--steps", "2", "--warmup", "1"], env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    (row,) = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert row["runtime"] == "netcl" and row["step_ms"] > 0 and row["lanes"] == 8
    with pytest.raises(ValueError, match="restarts the process"):
        bts.main(["--isa", "avx2", "--runtime", "netcl", "--models", "digits", "--batches", "2"])


WE_PATH = os.path.join(os.path.dirname(PATH), "winograd_error.py")
we_spec = importlib.util.spec_from_file_location("winograd_error", WE_PATH)
we = importlib.util.module_from_spec(we_spec)
we_spec.loader.exec_module(we)


def test_winograd_error_tool_measures_each_kernel(queue):
    """tools/winograd_error.py runs each of netcl's 3x3 kernels (direct, the training F(2x2), the
    inference F(2x2) and F(4x4)) against float64: every one a correct convolution within float32
    noise, and on a CPU the F(4x4) one's error the largest (docs/performance.md's reason not to train with it)."""
    from netcl import ops

    e = we.errors(16, k=8, size=8)
    assert set(e) == set(we.KERNELS) and all(0 < v < 2e-5 for v in e.values()), e
    if ops.is_cpu(queue):
        assert e["F(4x4) inference"] > 4 * max(e["F(2x2) inference"], e["F(2x2) training"]), e


AB_PATH = os.path.join(os.path.dirname(PATH), "ab_kernels.py")
ab_spec = importlib.util.spec_from_file_location("ab_kernels", AB_PATH)
abk = importlib.util.module_from_spec(ab_spec)
ab_spec.loader.exec_module(abk)
KERNELS = os.path.join(os.path.dirname(os.path.dirname(AB_PATH)), "netcl", "kernels")


def family_copy(tmp_path, family):
    """netcl's own source of kernel family `family`, and an unchanged copy of it in tmp_path."""
    with open(os.path.join(KERNELS, family + ".cl")) as f:
        original = f.read()
    same = tmp_path / (family + ".cl")
    same.write_text(original)
    return original, same


def test_kernel_ab_builds_side_b_from_the_patched_source(queue, tmp_path, capsys):
    """tools/ab_kernels.py: side B builds the family from the patched file, nothing else changes,
    and netcl's own kernel cache and sources are back afterwards. An unchanged copy reads as an A/A
    run with identical results; a copy whose ReLU forward doubles its outputs differs by exactly 1
    (relative to A's largest output). Bad arguments get errors that say what was expected."""
    from netcl import ops, runtime

    if not ops.is_cpu(queue):
        pytest.skip("act_cpu.cl is a CPU family")
    cache, source = runtime._kernels, runtime.kernel_source
    original, same = family_copy(tmp_path, "act_cpu")
    argv = ["--layer", "ReLU()", "--input", "2,4,8,16", "--rounds", "2", "--calls", "1"]
    r = abk.main(["--source", str(same)] + argv)
    assert r["same_source"] and r["difference"] == 0.0 and r["a_ms"] > 0 and r["b_ms"] > 0 and r["family"] == "act_cpu"
    doubled = original.replace("= ACT_APPLY(ACT_KIND, v, slope);", "= 2.0f * ACT_APPLY(ACT_KIND, v, slope);")
    assert doubled != original
    patched = tmp_path / "doubled.cl"
    patched.write_text(doubled)
    r = abk.main(["--source", str(patched), "--family", "act_cpu"] + argv)
    assert not r["same_source"] and abs(r["difference"] - 1.0) < 1e-6, r
    out = capsys.readouterr().out
    assert "A/A run" in out and "B / A" in out and "largest difference" in out
    assert runtime._kernels is cache and runtime.kernel_source is source
    with pytest.raises(ValueError, match="no kernel family 'doubled'"):
        abk.main(["--source", str(patched)] + argv)
    with pytest.raises(ValueError, match="not a netcl.nn layer expression"):
        abk.main(["--source", str(same), "--layer", "__import__('os')", "--input", "2,4,8,16"])
    with pytest.raises(SystemExit):
        abk.main(["--source", str(same), "--layer", "ReLU()", "--input", "2x4"])


def test_kernel_ab_pairs_replayed_training_steps_per_launch(queue, tmp_path, capsys):
    """tools/ab_kernels.py --step: two replayed steps of a benchmark model, each recorded with its
    side's kernels, per launch. An unchanged copy of the optimizer's family leaves the parameters
    equal bit for bit and lists its launch; a copy whose CPU SGD step takes twice the learning rate
    leaves them apart. A family the step does not launch, and bad arguments, get errors that say
    what was expected."""
    from netcl import ops, runtime

    if not ops.is_cpu(queue):
        pytest.skip("sgd_step_cpu is the CPU optimizer kernel")
    cache, source = runtime._kernels, runtime.kernel_source
    original, same = family_copy(tmp_path, "optim")
    r = abk.main(["--source", str(same), "--step", "digits:4", "--rounds", "2"])
    assert r["difference"] == 0.0 and r["a_ms"] > 0 and r["b_ms"] > 0 and r["a_kernels_ms"] > 0
    assert [name for _, name, *_ in r["launches"]] == ["sgd_step_cpu"], r["launches"]
    call = "        sgd_one(i, p, grad, buf, lr, momentum,"
    doubled = original.replace(call, call.replace("lr,", "2.0f * lr,"))
    assert doubled != original
    patched = tmp_path / "doubled.cl"
    patched.write_text(doubled)
    r = abk.main(["--source", str(patched), "--family", "optim", "--step", "digits:4", "--rounds", "2"])
    assert r["difference"] > 1e-4, r
    out = capsys.readouterr().out
    assert "launch" in out and "sgd_step_cpu" in out and "largest difference of B's parameters" in out
    assert runtime._kernels is cache and runtime.kernel_source is source
    with pytest.raises(ValueError, match="not a benchmark model"):
        abk.main(["--source", str(same), "--step", "lenet:4"])
    winot = os.path.join(KERNELS, "conv_winot.cl")
    with pytest.raises(ValueError, match="launches no kernel of conv_winot"):  # none of the digits CNN's convs
        abk.main(["--source", winot, "--step", "digits:4", "--rounds", "2"])
    for bad in (["--step", "digits"], ["--step", "digits:4", "--layer", "ReLU()"], []):
        with pytest.raises(SystemExit):
            abk.main(["--source", str(same)] + bad)
