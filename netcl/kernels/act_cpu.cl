// Activations, forward and backward, for CPU devices (PoCL): built once per activation
// (-DACT_KIND=<netcl.act.Act code>), so act.h's selection folds to one formula; each work-item
// runs a chunk of `chunk` elements in float16 vectors (a scalar tail at the end of the tensor).
// act.h's generic kernels (pointwise.cl) take the activation as an argument: its chain of
// branches per element keeps PoCL from vectorising them.
#include "act.h"

#ifndef ACT_KIND
#define ACT_KIND ACT_NONE
#endif

#include "vec_cpu.h"

__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void act_fwd_cpu(const int n, const int chunk, const float slope, __global const float *x, __global float *y) {
    const int i0 = get_global_id(0) * chunk, i1 = MIN(n, i0 + chunk);
    int i = i0;
    for (; i + 16 <= i1; i += 16) {
        const float16 v = *(__global const ufloat16 *)(x + i);
        *(__global ufloat16 *)(y + i) = ACT_APPLY(ACT_KIND, v, slope);
    }
    for (; i < i1; i++) y[i] = ACT_APPLY(ACT_KIND, x[i], slope);
}

// y = act(a + b): a Residual block's sum and the activation after it in one pass (Sequential's
// training path on CPUs, netcl.nn.blocks)
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void add_act_cpu(const int n, const int chunk, const float slope, __global const float *a, __global const float *b,
                 __global float *y) {
    const int i0 = get_global_id(0) * chunk, i1 = MIN(n, i0 + chunk);
    int i = i0;
    for (; i + 16 <= i1; i += 16) {
        const float16 v = *(__global const ufloat16 *)(a + i) + *(__global const ufloat16 *)(b + i);
        *(__global ufloat16 *)(y + i) = ACT_APPLY(ACT_KIND, v, slope);
    }
    for (; i < i1; i++) y[i] = ACT_APPLY(ACT_KIND, a[i] + b[i], slope);
}

// saved: the forward's input, or its output where netcl.act.Act.saves_output
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void act_bwd_cpu(const int n, const int chunk, const float slope, __global const float *saved,
                 __global const float *dy, __global float *dx) {
    const int i0 = get_global_id(0) * chunk, i1 = MIN(n, i0 + chunk);
    int i = i0;
    for (; i + 16 <= i1; i += 16) {
        const float16 s = *(__global const ufloat16 *)(saved + i), g = *(__global const ufloat16 *)(dy + i);
        *(__global ufloat16 *)(dx + i) = ACT_GRAD(ACT_KIND, s, g, slope);
    }
    for (; i < i1; i++) {  // both loaded before the test: a select, not a branch around dy's load
        const float s = saved[i], g = dy[i];
        dx[i] = ACT_GRAD(ACT_KIND, s, g, slope);
    }
}
