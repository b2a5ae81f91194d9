"""The activation codes: netcl/act.py's enum and kernels/act.h define the same numbers, and every
kernel family that applies an activation includes the header."""
import re
from importlib import resources

from netcl.act import Act
from netcl.runtime import kernel_source


def test_enum_and_header_define_the_same_codes():
    header = resources.files("netcl.kernels").joinpath("act.h").read_text()
    codes = {m[1]: int(m[2]) for m in re.finditer(r"^#define ACT_([A-Z0-9_]+) (\d+)$", header, re.M)}
    assert codes == {a.name: a.value for a in Act}


def test_kernel_families_inline_the_header():
    for family in ("pointwise", "conv_gpu", "conv_cpu", "conv_wino", "linear"):
        src = kernel_source(family)
        assert not re.search(r"^#include", src, re.M) and "#define ACT_RELU 1" in src, family
