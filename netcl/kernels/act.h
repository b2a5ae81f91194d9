// Activations: the one definition every kernel family includes (`#include "act.h"`, inlined by
// netcl.runtime.kernel_source). The codes are netcl.act.Act's; tests/test_act.py checks that
// they agree. The macros work on scalars and on vectors alike: PoCL turns float8 fmax/select
// into out-of-line calls, while a vector ?: stays an inline blend. `kind` is a compile-time
// constant in the fused kernels (the other branches fold away) and a kernel argument elsewhere.
// The formulas are PyTorch's (torch/nn/functional, aten's CPU kernels), so that NaN and the
// infinities come out as there.
#ifndef NETCL_ACT_H
#define NETCL_ACT_H

#define ACT_NONE 0
#define ACT_RELU 1
#define ACT_LEAKY_RELU 2
#define ACT_SIGMOID 3
#define ACT_TANH 4
#define ACT_GELU 5
#define ACT_GELU_TANH 6
#define ACT_SILU 7
#define ACT_RELU6 8
#define ACT_HARDSWISH 9
#define ACT_HARDSIGMOID 10
// inference-only codes (the fused plan's epilogues; ACT_GRAD does not take them: their layers train
// by act_param.cl's kernels): slope is ELU's alpha, Softplus's beta (its threshold 20)
#define ACT_ELU 11
#define ACT_SOFTPLUS 12
#define ACT_MISH 13

#define ACT_SQRT1_2 0.70710678118654752f    // 1/sqrt(2)
#define ACT_INV_SQRT_2PI 0.39894228040143268f  // 1/sqrt(2 pi)
#define ACT_SQRT_2_PI 0.79788456080286536f  // sqrt(2/pi), GELU tanh's beta
#define ACT_GELU_KAPPA 0.044715f
// min(max(v, 0), 6) with NaN kept: both tests are false for NaN
#define ACT_CLAMP6(v) ((v) < 0.0f ? 0.0f : (v) > 6.0f ? 6.0f : (v))
#define ACT_GELU_INNER(v) (ACT_SQRT_2_PI * ((v) + ACT_GELU_KAPPA * (v) * (v) * (v)))

// y = act(v); NaN stays NaN in every one, as in PyTorch (hence relu's v < 0 test, not v > 0 or fmax)
#define ACT_APPLY(kind, v, slope)                                                   \
    ((kind) == ACT_RELU ? ((v) < 0.0f ? 0.0f : (v)) :                               \
     (kind) == ACT_LEAKY_RELU ? ((v) > 0.0f ? (v) : (v) * (slope)) :                 \
     (kind) == ACT_SIGMOID ? 1.0f / (1.0f + exp(-(v))) :                            \
     (kind) == ACT_TANH ? tanh(v) :                                                 \
     (kind) == ACT_GELU ? (v) * 0.5f * (1.0f + erf((v) * ACT_SQRT1_2)) :            \
     (kind) == ACT_GELU_TANH ? (v) / (1.0f + exp(-2.0f * ACT_GELU_INNER(v))) :      \
     (kind) == ACT_SILU ? (v) / (1.0f + exp(-(v))) :                                \
     (kind) == ACT_RELU6 ? ACT_CLAMP6(v) :                                          \
     (kind) == ACT_HARDSWISH ? (v) * ACT_CLAMP6((v) + 3.0f) / 6.0f :                \
     (kind) == ACT_HARDSIGMOID ? ACT_CLAMP6((v) + 3.0f) / 6.0f :                   \
     (kind) == ACT_ELU ? ((v) > 0.0f ? (v) : (slope) * expm1(v)) :                  \
     (kind) == ACT_SOFTPLUS ? ((v) * (slope) > 20.0f ? (v) : log1p(exp((v) * (slope))) / (slope)) : \
     (kind) == ACT_MISH ? (v) * tanh(log1p(exp(v))) : (v))

// dx = dy * act'(.), from what the forward saved: the output for sigmoid and tanh, the input
// for all others (netcl.act.Act.saves_output). The piecewise ones use PyTorch's boundaries:
// relu6 (hardtanh) passes g strictly inside (0, 6) and for NaN; hardswish is 0 up to -3
// (inclusive), g from 3 on and for NaN; hardsigmoid g/6 strictly inside (-3, 3), 0 for NaN.
// GELU tanh uses 0.5 (1 + tanh(u)) = 1 / (1 + exp(-2u)) and 1 - tanh(u)^2 = 1 / cosh(u)^2: no
// cancellation in the tails (PoCL's tanh also stops one ulp short of +-1, so -inf would not give NaN).
#define ACT_GRAD(kind, s, g, slope)                                                          \
    ((kind) == ACT_RELU ? ((s) > 0.0f ? (g) : 0.0f) :                                        \
     (kind) == ACT_LEAKY_RELU ? ((s) > 0.0f ? (g) : (g) * (slope)) :                          \
     (kind) == ACT_SIGMOID ? (g) * (s) * (1.0f - (s)) :                                      \
     (kind) == ACT_TANH ? (g) * (1.0f - (s) * (s)) :                                         \
     (kind) == ACT_GELU ? (g) * (0.5f * (1.0f + erf((s) * ACT_SQRT1_2)) +                   \
                                 (s) * ACT_INV_SQRT_2PI * exp(-0.5f * (s) * (s))) :           \
     (kind) == ACT_GELU_TANH ? (g) * (1.0f / (1.0f + exp(-2.0f * ACT_GELU_INNER(s))) +          \
                                      0.5f * (s) / (cosh(ACT_GELU_INNER(s)) * cosh(ACT_GELU_INNER(s))) * \
                                      ACT_SQRT_2_PI * (1.0f + 3.0f * ACT_GELU_KAPPA * (s) * (s))) : \
     (kind) == ACT_SILU ? (g) / (1.0f + exp(-(s))) * (1.0f + (s) * (1.0f - 1.0f / (1.0f + exp(-(s))))) : \
     (kind) == ACT_RELU6 ? (((s) <= 0.0f || (s) >= 6.0f) ? 0.0f : (g)) :                     \
     (kind) == ACT_HARDSWISH ? ((s) <= -3.0f ? 0.0f : (s) < 3.0f ? (g) * ((s) / 3.0f + 0.5f) : (g)) : \
     (kind) == ACT_HARDSIGMOID ? (((s) > -3.0f && (s) < 3.0f) ? (g) / 6.0f : 0.0f) : (g))

#endif
