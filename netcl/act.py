"""The activation codes shared by every kernel family: netcl/kernels/act.h defines the same
numbers (ACT_<NAME>) and the arithmetic; adding an activation is one entry here and one there."""
from enum import IntEnum


class Act(IntEnum):
    """Activation codes, the same numbers as kernels/act.h, which holds the arithmetic."""

    NONE = 0
    RELU = 1
    LEAKY_RELU = 2
    SIGMOID = 3
    TANH = 4
    GELU = 5  # exact (erf)
    GELU_TANH = 6  # GELU(approximate="tanh")
    SILU = 7
    RELU6 = 8
    HARDSWISH = 9
    HARDSIGMOID = 10
    # inference-only: the fused plan's epilogues apply them (act.h's ACT_GRAD does not take them)
    ELU = 11  # slope: alpha
    SOFTPLUS = 12  # slope: beta; threshold 20
    MISH = 13

    @property
    def saves_output(self):
        """Whether backward differentiates through the output (else through the input)."""
        return self in (Act.SIGMOID, Act.TANH)

    @property
    def grads_from_output(self):
        """Whether act_bwd given the output (instead of the input) gives the same gradient: those
        that save it, and ReLU (y > 0 exactly where x > 0; a NaN input gives a NaN output)."""
        return self == Act.RELU or self.saves_output
