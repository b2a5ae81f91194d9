"""Nobody waits in silence, and nobody reads compiler chatter: builds that take a while say so
through the "netcl" logger (netcl.runtime.buildlog), NETCL_QUIET=1 keeps them to DEBUG records,
PoCL's compiler output never reaches the user's stderr, and a failed build still raises
CompileError with the whole log."""
import logging
import os
import subprocess
import sys
import textwrap

import pytest

from netcl import CompileError
from netcl.runtime import build, buildlog

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fresh(body):
    """A kernel source no cache has seen (a fresh token in a comment)."""
    return f"// {os.urandom(8).hex()}\n{body}\n"


WARNS = "__kernel void warns(__global float *x) { int z = 0; x[get_global_id(0)] = 1 / z + 1 / 0; }"
BROKEN = "__kernel void broken(__global float *x) { x[0] = undeclared_thing; }"

_CHILD = textwrap.dedent("""
    import logging, sys
    import netcl
    from netcl import CompileError
    from netcl.runtime import build, buildlog
    if sys.argv[3] == "debug":
        logging.basicConfig(level=logging.DEBUG, stream=sys.stdout, format="%(name)s %(levelname)s %(message)s")
    buildlog.BURST_S = 0.05  # (a build of a few tenths of a second is then "a while")
    q = netcl.default_queue()
    build(q.context, sys.argv[1], family="test", what="the warning kernel")
    try:
        build(q.context, sys.argv[2], family="test", what="the broken kernel")
    except CompileError as e:
        print("LOG:", e.log.replace(chr(10), " | "))
""")


def run_child(mode, env=None):
    env = dict({k: v for k, v in os.environ.items() if k != "NETCL_QUIET"}, **(env or {}))  # (the caller's own)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-c", _CHILD, fresh(WARNS), fresh(BROKEN), mode], env=env,
                          capture_output=True, text=True, timeout=300, check=True)


def test_a_fresh_build_says_what_it_builds_and_keeps_the_compiler_off_stderr(queue):
    r = run_child("plain")
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines and all(ln.startswith("netcl: ") for ln in lines), r.stderr  # nothing but netcl's own lines
    assert any("compiling OpenCL kernels" in ln for ln in lines), r.stderr
    assert "generated" not in r.stderr and "undeclared" not in r.stderr and "division" not in r.stderr
    log = r.stdout.split("LOG:", 1)[1]
    assert "undeclared_thing" in log  # the failed build's whole log, in the error


def test_the_compiler_output_is_in_the_debug_log_and_quiet_means_quiet(queue):
    r = run_child("debug")
    assert "netcl DEBUG compiler output building the warning kernel" in r.stdout
    assert "division by zero" in r.stdout  # the compiler's warning, at DEBUG
    assert "netcl INFO compiling OpenCL kernels" in r.stdout
    assert r.stderr.strip() == ""
    quiet = run_child("plain", {"NETCL_QUIET": "1"})
    assert quiet.stderr.strip() == ""


def test_a_short_burst_stays_silent_and_a_long_one_names_each_family(queue, caplog, monkeypatch):
    caplog.set_level(logging.DEBUG, logger="netcl")
    monkeypatch.delenv("NETCL_QUIET", raising=False)
    monkeypatch.setattr(buildlog, "GAP_S", 0.0)  # each build its own burst
    build(queue.context, fresh("__kernel void a(__global float *x) { x[0] = 1.0f; }"), family="short", what="a")
    assert not [r for r in caplog.records if r.levelno >= logging.INFO]
    assert any("built a in" in r.getMessage() for r in caplog.records)  # the DEBUG line of each build
    monkeypatch.setattr(buildlog, "BURST_S", 0.0)
    monkeypatch.setattr(buildlog, "GAP_S", 60.0)
    monkeypatch.setattr(buildlog, "_burst", None)
    for i, family in enumerate(("one", "one", "two")):
        build(queue.context, fresh(f"__kernel void k{i}(__global float *x) {{ x[0] = {i}.0f; }}"), family=family,
              what=f"{family} k{i}")
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any("compiling OpenCL kernels" in m for m in said), said
    assert [m for m in said if m.startswith("building")] == ["building two k2"], said  # "one": announced


def test_a_failed_build_keeps_what_pocl_wrote_to_stderr(queue):
    with pytest.raises(CompileError) as e:
        build(queue.context, fresh(BROKEN))
    assert "undeclared_thing" in e.value.log and "undeclared_thing" in str(e.value)


def test_quiet_stderr_keeps_the_compilers_words_and_gives_back_the_rest(capfd):
    """What the compiler writes during a build is kept for the DEBUG log; what another thread writes
    to stderr meanwhile goes back to stderr afterwards; descriptor 2 is stderr again."""
    captured = []
    with buildlog.quiet_stderr(captured):
        os.write(2, b"1 warning generated.\n")
    assert captured == ["1 warning generated.\n"] and capfd.readouterr().err == ""
    with buildlog.quiet_stderr(captured):
        os.write(2, b"a user's own line\n")
    assert captured == ["1 warning generated.\n"] and capfd.readouterr().err == "a user's own line\n"
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "after\n"
