"""CPU kernels call no OpenCL builtin that PyPI's PoCL 3.0 leaves out of line where an inline form
exists (netcl/kernels/vec_cpu.h says why and what it measured): no fma or mad (a * b + c contracts to
one FMA), no vloadN or vstoreN (a dereferenced vector pointer), no integer min, max or clamp (MIN,
MAX), no select or shuffle (clang's vector operators and __builtin_shufflevector). The CPU kernel
files are those that include vec_cpu.h. Math functions without an inline form (exp, log, sqrt,
rsqrt, fmax) are not checked."""
import re
from pathlib import Path

KERNELS = Path(__file__).resolve().parents[1] / "netcl" / "kernels"
CALLED_OUT_OF_LINE = re.compile(r"(?<![\w.])(fma|mad|vload\d+|vstore\d+|min|max|clamp|select|shuffle2?)\s*\(")


def _code(text):
    """The source without its comments, line numbers kept."""
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return [line.split("//", 1)[0] for line in text.split("\n")]


def out_of_line_calls(text):
    """(line, builtin) for each call of a checked builtin in OpenCL source `text`."""
    return [(n, m.group(1)) for n, line in enumerate(_code(text), 1) for m in CALLED_OUT_OF_LINE.finditer(line)]


def cpu_kernel_files():
    return [p for p in sorted(KERNELS.glob("*.cl")) if '#include "vec_cpu.h"' in p.read_text()] + [KERNELS / "vec_cpu.h"]


def test_the_check_finds_calls_and_skips_comments_and_lookalikes():
    src = ("acc = fma(a, b, acc);  // fma(x) in a comment\n"
           "/* min(1, 2)\n max(3, 4) */ const int n = min(a, b);\n"
           "x = vload8(0, p); vstore4(v, 0, q); y = MIN(a, b); z = fmax(a, b); w = v.max(1); s = select(a, b, c);\n")
    assert out_of_line_calls(src) == [(1, "fma"), (3, "min"), (4, "vload8"), (4, "vstore4"), (4, "select")]


def test_cpu_kernels_call_no_builtin_that_has_an_inline_form():
    files = cpu_kernel_files()
    names = {p.name for p in files}
    assert {"convtrain_cpu.cl", "conv_winot.cl", "norm_cpu.cl", "gemm_cpu.cl", "conv_wino.cl"} <= names
    found = [f"{p.name}:{line}: {name}()" for p in files for line, name in out_of_line_calls(p.read_text())]
    assert not found, ("PyPI's PoCL 3.0 calls these builtins out of line (vec_cpu.h): write a * b + c, "
                       "dereference vector pointers, use MIN/MAX:\n" + "\n".join(found))
