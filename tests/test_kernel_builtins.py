"""CPU kernels call no OpenCL builtin that PyPI's PoCL 3.0 leaves out of line where an inline form
exists (netcl/kernels/vec_cpu.h says why and what it measured): no fma or mad (a * b + c contracts to
one FMA), no vloadN or vstoreN (a dereferenced vector pointer), no min, max or clamp (vec_cpu.h's
MIN and MAX, or a ternary), no select or shuffle (clang's vector operators and
__builtin_shufflevector). Checked: the files that include vec_cpu.h and conv_dw.cl (the fused
depthwise kernel, built for GPUs and CPUs alike). Not checked: math functions (exp, log, sqrt, rsqrt,
fmax), GPU-only files, and the headers and other files that CPUs also build, where calls remain
outside the hot loops except in seq.cl's attention (one min a key; docs/device-setup.md
lists them)."""
import re
from pathlib import Path

KERNELS = Path(__file__).resolve().parents[1] / "netcl" / "kernels"
CALLED_OUT_OF_LINE = re.compile(r"(?<![\w.])(fma|mad|vload\d+|vstore\d+|min|max|clamp|select|shuffle2?)\s*\(")


# string literals and both kinds of comment, matched left to right (a "//" inside a block comment or
# a string, or a "/*" inside a line comment, is no comment of its own)
_NOT_CODE = re.compile(r'"(?:\\.|[^"\\\n])*"|//[^\n]*|/\*.*?\*/', re.S)


def _code(text):
    """The source without its comments and strings, line numbers kept."""
    return _NOT_CODE.sub(lambda m: "\n" * m.group(0).count("\n"), text).split("\n")


def out_of_line_calls(text):
    """(line, builtin) for each call of a checked builtin in OpenCL source `text`."""
    return [(n, m.group(1)) for n, line in enumerate(_code(text), 1) for m in CALLED_OUT_OF_LINE.finditer(line)]


SHARED = ("conv_dw.cl",)  # built for GPUs and CPUs alike


def cpu_kernel_files():
    return [p for p in sorted(KERNELS.glob("*.cl")) if '#include "vec_cpu.h"' in p.read_text() or p.name in SHARED]


def test_the_check_finds_calls_and_skips_comments_and_lookalikes():
    src = ("acc = fma(a, b, acc);  // fma(x) in a comment\n"
           "/* min(1, 2)\n max(3, 4) */ const int n = min(a, b);\n"
           "x = vload8(0, p); vstore4(v, 0, q); y = MIN(a, b); z = fmax(a, b); w = v.max(1); s = select(a, b, c);\n"
           "// a line comment with /* in it\n"
           "k = max(i, j); printf(\"min(%d)\", k);  /* // */ m = clamp(k, 0, 3);\n")
    assert out_of_line_calls(src) == [(1, "fma"), (3, "min"), (4, "vload8"), (4, "vstore4"), (4, "select"),
                                      (6, "max"), (6, "clamp")]


def test_cpu_kernels_call_no_builtin_that_has_an_inline_form():
    files = cpu_kernel_files()
    assert {"convtrain_cpu.cl", "conv_winot.cl", "norm_cpu.cl", "gemm_cpu.cl", "conv_wino.cl", "conv_dw.cl"} <= {
        p.name for p in files}
    found = [f"{p.name}:{line}: {name}()" for p in files for line, name in out_of_line_calls(p.read_text())]
    assert not found, ("PyPI's PoCL 3.0 calls these builtins out of line (vec_cpu.h): write a * b + c, "
                       "dereference vector pointers, use MIN/MAX:\n" + "\n".join(found))
