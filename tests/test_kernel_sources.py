"""netcl.runtime.sources: each kernel of a file as a program of its own, with the -D options that can
change it. Checked without a device: the kernels it finds are the signatures' (runtime.arg_dtypes),
and for every kernel netcl ships, the C preprocessor gives its program the same text whatever the
options it leaves out say (so leaving them out cannot change what compiles); that every program
builds alone is test_runtime's test_every_kernel_declares_its_scalar_argument_types and the jit
tests'."""
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from netcl.runtime import arg_dtypes, sources
from netcl.runtime.program import kernel_source

FAMILIES = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "netcl" / "kernels").glob("*.cl"))
_DIRECTIVE_NAMES = re.compile(r"^\s*#\s*(?:if|ifdef|ifndef|elif|define|undef)\b(.*)$", re.M)


def test_the_split_finds_every_kernel_of_every_file():
    for family in FAMILIES:
        source = kernel_source(family)
        assert sorted(sources.split(source).names()) == sorted(arg_dtypes(source)), family


SAMPLE = """
#ifndef KS
#define KS 3
#endif
#define TAPS (KS * KS)
#if WIDE
typedef float16 vec;
#else
typedef float8 vec;
#endif
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
inline float hsum8(float8 v) { return v.s0 * SCALE; }
inline float helper(float x) { return x * TAPS; }
#define MAKE(T) inline T twice_##T(T x) { return x + x * LIFT; }
MAKE(float)
__kernel void plain(__global float *x) { x[0] = 1.0f; }
__kernel void taps(__global float *x) { x[0] = helper(x[1]); }
__kernel void vectors(__global vec *x) { x[0] = x[1]; }
__kernel void pasted(__global float8 *x, __global float *y) { y[0] = CAT(hsum, 8)(x[0]); }
#ifdef EXTRA
__kernel void extra(__global float *x) { x[0] = 2.0f; }
#endif
"""


def test_options_reach_a_kernel_through_helpers_conditions_and_pasted_names():
    s = sources.split(SAMPLE)
    options = ("-DKS=5", "-DWIDE=1", "-DSCALE=2.0f", "-DLIFT=1.0f", "-DEXTRA=1", "-cl-mad-enable")
    got = {name: s.options_for(name, options) for name in s.names()}
    # LIFT: a macro invoked at file scope (MAKE) is reached by every kernel
    assert got["plain"] == ("-DLIFT=1.0f", "-cl-mad-enable")
    assert got["taps"] == ("-DKS=5", "-DLIFT=1.0f", "-cl-mad-enable")  # helper -> TAPS -> KS
    assert got["vectors"] == ("-DWIDE=1", "-DLIFT=1.0f", "-cl-mad-enable")  # vec sits in #if WIDE
    assert got["pasted"] == ("-DSCALE=2.0f", "-DLIFT=1.0f", "-cl-mad-enable")  # CAT(hsum, 8) -> hsum8
    assert got["extra"] == ("-DLIFT=1.0f", "-DEXTRA=1", "-cl-mad-enable")  # inside #ifdef EXTRA
    text = s.program_source("taps")
    assert text.count("\n") == SAMPLE.count("\n")  # line numbers kept
    assert "helper" in text and "TAPS" in text and "hsum8" not in text and "__kernel void plain" not in text
    assert "MAKE(float)" in text  # (not placed: kept)


@pytest.mark.skipif(shutil.which("cpp") is None, reason="needs the C preprocessor (cpp)")
def test_the_options_a_kernel_leaves_out_cannot_change_its_program():
    """For each kernel of each file: every macro the file tests or defines that the kernel does not
    reach, defined to 7 (or to nothing), leaves the preprocessed text of its program unchanged
    (OpenCL's type names, which a -D option never names, aside)."""
    def cpp(text, names, value):
        r = subprocess.run(["cpp", "-P", "-undef", "-nostdinc"] + [f"-D{n}{value}" for n in names], input=text,
                           capture_output=True, text=True, timeout=60)
        return r.returncode, r.stdout

    checked = 0
    for family in FAMILIES:
        source = kernel_source(family)
        s = sources.split(source)
        macros = {m for expr in _DIRECTIVE_NAMES.findall(source) for m in re.findall(r"[A-Za-z_]\w*", expr)}
        for name in s.names():
            left_out = sorted(m for m in macros - s.reached(name) - {"defined"} if not sources._NOT_NAMES.fullmatch(m))
            text = s.program_source(name)
            plain = cpp(text, [], "")
            for value in ("=7", ""):
                assert cpp(text, left_out, value) == plain, (family, name, left_out)
            checked += 1
    assert checked > 100
