"""Sharing a cold first step's builds between processes (netcl.buildhelper, netcl.runtime.program's
claims): a program another live process is building is waited for (or, in a helper's dry run,
skipped), a dead builder's claim is taken over, and a helper's walk of a training step builds every
kernel the step runs."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

import netcl
from netcl.apps import recipes
from netcl.runtime import build, program

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fresh(i):
    return f"// {os.urandom(8).hex()}\n__kernel void k{i}(__global float *x) {{ x[0] = {i}.0f; }}\n"


@pytest.fixture
def binaries(queue, monkeypatch, tmp_path):
    monkeypatch.setenv("NETCL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("NETCL_BINARY_CACHE", "1")
    return tmp_path


def test_a_claim_names_a_live_builder_and_a_dead_ones_is_taken_over(binaries):
    path = str(binaries / "entry.bin")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with open(path + ".claim", "w") as f:
            f.write(str(sleeper.pid))
        assert not program._claim(path)  # another live process builds it
        sleeper.kill()
        sleeper.wait()
        assert program._claim(path) and program._claimant(path) == os.getpid()  # a dead one's: taken over
        program._unclaim(path)
        assert not os.path.exists(path + ".claim")
        assert program._claim(path) and program._claim(path)  # (this process's own, left over: still its)
        program._unclaim(path)
    finally:
        if sleeper.poll() is None:
            sleeper.kill()


def test_a_program_another_process_builds_is_waited_for_or_skipped_dry(queue, binaries, monkeypatch):
    """A build meeting another live process's claim waits for its binary (here: the claim's owner
    dies without one, and the build goes ahead itself); a helper's dry build skips it (Claimed)."""
    src = fresh(1)
    key = program._key(src, (), queue.device)
    path = os.path.join(str(binaries), key + ".bin")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with open(path + ".claim", "w") as f:
            f.write(str(sleeper.pid))
        monkeypatch.setattr(program, "dry", True)
        with pytest.raises(program.Claimed):
            build(queue.context, src)
        monkeypatch.setattr(program, "dry", False)
        monkeypatch.setattr(program, "CLAIM_WAIT_S", 0.2)
        waited = program.stats["waited"]
        prog = build(queue.context, src)  # waited 0.2 s, then built it itself
        assert [k.function_name for k in prog.all_kernels()] == ["k1"] and program.stats["waited"] >= waited + 0.2
    finally:
        sleeper.kill()


_FIRST = textwrap.dedent("""
    import json, sys
    import numpy as np
    import netcl
    from netcl import TrainStep, io, nn, optim
    from netcl.runtime import program
    model = io.load(sys.argv[1])
    q = netcl.default_queue()
    step = TrainStep(model.to(q).train(), nn.CrossEntropyLoss(), optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
    float(step(np.zeros((4, 1, 8, 8), np.float32), np.arange(4) % 10))
    print(json.dumps(program.stats))
""")


def test_a_helpers_dry_walk_builds_every_kernel_of_the_step(queue, tmp_path):
    """netcl.warmup --helper on a saved model and spec, on empty caches: afterwards a new process's
    first TrainStep call of that shape compiles nothing."""
    if not program.keeps_binaries(queue.device):
        pytest.skip("claims and helpers share binaries through the kernel cache")
    netcl.manual_seed(0)
    folder, model = tmp_path / "helper", tmp_path / "digits.netcl"
    folder.mkdir()
    netcl.io.save(recipes.digits_cnn(), str(folder / "model.netcl"))
    netcl.io.save(recipes.digits_cnn(), str(model))
    (folder / "spec.json").write_text(json.dumps({"x": [4, 1, 8, 8], "target": [4], "loss": "CrossEntropyLoss",
                                                  "optimizer": "SGD", "hyper": {"lr": 0.01, "momentum": 0.9},
                                                  "device": queue.device.name.strip()}))
    env = dict(os.environ, NETCL_CACHE_DIR=str(tmp_path / "netcl"), POCL_CACHE_DIR=str(tmp_path / "pocl"),
               NETCL_BUILD_HELPER="0", PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p))
    env.pop("NETCL_COMPILE", None)  # as a first call runs it: the generic tier, then the background's kernels
    (tmp_path / "pocl").mkdir()
    subprocess.run([sys.executable, "-m", "netcl.warmup", "--helper", str(folder)], env=env, check=True, timeout=600)
    assert not folder.exists()  # the helper removes what it was handed
    r = subprocess.run([sys.executable, "-c", _FIRST, str(model)], env=env, capture_output=True, text=True,
                       check=True, timeout=600)
    stats = json.loads(r.stdout.strip().splitlines()[-1])
    assert stats["compiled"] == 0 and stats["disk"] > 10, stats
