"""CPU kernels call no OpenCL builtin that PyPI's PoCL 3.0 leaves out of line where an inline form
exists (netcl/kernels/vec_cpu.h says why and what it measured): no fma or mad (a * b + c contracts to
one FMA), no vloadN or vstoreN (a dereferenced vector pointer), no min, max or clamp (vec_cpu.h's
MIN and MAX, or a ternary), no select or shuffle (clang's vector operators and
__builtin_shufflevector). Checked: the files that include vec_cpu.h and conv_dw.cl (the fused
depthwise kernel, built for GPUs and CPUs alike). Not checked: math functions (exp, log, sqrt, rsqrt,
fmax), GPU-only files, and the headers and other files that CPUs also build, where calls remain
outside the hot loops except in seq.cl's attention (one min a key; docs/device-setup.md
lists them).

Every kernel file and header, GPU or CPU, uses OpenCL C only: no compiler builtin of Clang's or GCC's
(__builtin_prefetch aborted Oclgrind; OpenCL C has prefetch()), no __sync_ or __atomic_ atomics, no
x86 intrinsics or inline assembly, with two exceptions: Clang's __builtin_shufflevector (every
OpenCL front end netcl runs on is Clang's: PoCL, Intel's CPU runtime, Oclgrind, NVIDIA's; OpenCL's
shuffle2 PoCL calls out of line) and vec_cpu.h's PREFETCH, __builtin_prefetch under PoCL's own
macro only (PoCL compiles prefetch() to nothing)."""
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


NOT_OPENCL_C = re.compile(r"(?<![\w.])(__builtin_\w+|__sync_\w+|__atomic_\w+|_mm\d*_\w+|__asm__|__asm|asm)\s*\(")
CLANG_EVERYWHERE = {"__builtin_shufflevector"}
POCL_ONLY = "#if defined(POCL_DEVICE_ADDRESS_BITS) && defined(__clang__)"


def not_opencl_c(text):
    """(line, name) for each call of a builtin or intrinsic that is not OpenCL C in source `text`, but
    for CLANG_EVERYWHERE's and those on the line after POCL_ONLY."""
    lines = _code(text)
    return [(n, m.group(1)) for n, line in enumerate(lines, 1) for m in NOT_OPENCL_C.finditer(line)
            if m.group(1) not in CLANG_EVERYWHERE and not (n > 1 and lines[n - 2].strip() == POCL_ONLY)]


def test_the_opencl_c_check_finds_foreign_builtins():
    src = ("x = __builtin_prefetch(p);  // __builtin_expect(a) in a comment\n"
           "if (__builtin_expect(a, 0)) y = __sync_fetch_and_add(q, 1);\n"
           "v = __builtin_shufflevector(a, b, 0, 1); w = _mm256_add_ps(a, b); asm (\"nop\");\n"
           "prefetch(p, 1); z = my__builtin_x(1); k = atomic_inc(c);\n" +
           POCL_ONLY + "\n#define PREFETCH(p) __builtin_prefetch(p)\n#else\n__builtin_trap();\n")
    assert not_opencl_c(src) == [(1, "__builtin_prefetch"), (2, "__builtin_expect"), (2, "__sync_fetch_and_add"),
                                 (3, "_mm256_add_ps"), (3, "asm"), (8, "__builtin_trap")]


def test_kernels_use_opencl_c_builtins_only():
    files = sorted(KERNELS.glob("*.cl")) + sorted(KERNELS.glob("*.h"))
    found = [f"{p.name}:{line}: {name}()" for p in files for line, name in not_opencl_c(p.read_text())]
    assert not found, ("not OpenCL C (Oclgrind, Intel's runtime or another compiler may refuse or abort): use "
                       "OpenCL C's builtins (prefetch(), atomic_*), or vec_cpu.h's PREFETCH:\n" + "\n".join(found))


def test_cpu_kernels_call_no_builtin_that_has_an_inline_form():
    files = cpu_kernel_files()
    assert {"convtrain_cpu.cl", "conv_winot.cl", "norm_cpu.cl", "gemm_cpu.cl", "conv_wino.cl", "conv_dw.cl"} <= {
        p.name for p in files}
    found = [f"{p.name}:{line}: {name}()" for p in files for line, name in out_of_line_calls(p.read_text())]
    assert not found, ("PyPI's PoCL 3.0 calls these builtins out of line (vec_cpu.h): write a * b + c, "
                       "dereference vector pointers, use MIN/MAX:\n" + "\n".join(found))
