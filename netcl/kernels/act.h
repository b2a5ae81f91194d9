// Activations: the one definition every kernel family includes (`#include "act.h"`, inlined by
// netcl.runtime.kernel_source). The codes are netcl.act.Act's; tests/test_act.py checks that
// they agree. The macros work on scalars and on vectors alike: PoCL turns float8 fmax/select
// into out-of-line calls, while a vector ?: stays an inline blend. `kind` is a compile-time
// constant in the fused kernels (the other branches fold away) and a kernel argument elsewhere.
#ifndef NETCL_ACT_H
#define NETCL_ACT_H

#define ACT_NONE 0
#define ACT_RELU 1
#define ACT_LEAKY_RELU 2
#define ACT_SIGMOID 3
#define ACT_TANH 4

// y = act(v); NaN stays NaN in every one, as in PyTorch (hence relu's v < 0 test, not v > 0 or fmax)
#define ACT_APPLY(kind, v, slope)                                   \
    ((kind) == ACT_RELU ? ((v) < 0.0f ? 0.0f : (v)) :               \
     (kind) == ACT_LEAKY_RELU ? ((v) > 0.0f ? (v) : (v) * (slope)) : \
     (kind) == ACT_SIGMOID ? 1.0f / (1.0f + exp(-(v))) :            \
     (kind) == ACT_TANH ? tanh(v) : (v))

// dx = dy * act'(.), from what the forward saved: the input for relu and leaky relu, the
// output for sigmoid and tanh (netcl.act.Act.saves_output)
#define ACT_GRAD(kind, s, g, slope)                                  \
    ((kind) == ACT_RELU ? ((s) > 0.0f ? (g) : 0.0f) :                \
     (kind) == ACT_LEAKY_RELU ? ((s) > 0.0f ? (g) : (g) * (slope)) :  \
     (kind) == ACT_SIGMOID ? (g) * (s) * (1.0f - (s)) :              \
     (kind) == ACT_TANH ? (g) * (1.0f - (s) * (s)) : (g))

#endif
