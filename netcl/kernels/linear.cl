// Fused linear family (netcl/jit/linear.py): Linear + activation in one kernel, built for one
// layer. Defines: IN_F OUT_F OUT_P (out padded to LJ) LJ, ACT SLOPE (kernels/act.h), RES ACT2 SLOPE2
// (RES 1: add res, a tensor of y's shape, after the activation, then apply ACT2: a Residual block
// ending in this Linear).
#include "act.h"

#define ACTF(v) ACT_APPLY(ACT, v, SLOPE)
#if RES
#define EPI(v, i) ACT_APPLY(ACT2, (v) + res[i], SLOPE2)
#else
#define EPI(v, i) (v)
#endif

// Linear + activation: y[row][j] = act(b[j] + sum_i x[row][i] * W[i][j]), W stored (in, out).
// Each work-item computes LJ adjacent outputs of one row.
__kernel void linear(const int rows, __global const float *restrict x, __global const float *restrict w,
                     __global const float *restrict b, __global float *restrict y,
                     __global const float *restrict res) {
    const int j0 = get_global_id(0) * LJ, row = get_global_id(1);
    if (j0 >= OUT_F || row >= rows) return;
    float acc[LJ];
    for (int j = 0; j < LJ; j++) acc[j] = 0.0f;
    __global const float *xr = x + row * IN_F;
    for (int i = 0; i < IN_F; i++) {
        const float xv = xr[i];
        __global const float *wr = w + i * OUT_P + j0;  // OUT_P: out padded to LJ, zeros beyond OUT_F
#pragma unroll
        for (int j = 0; j < LJ; j++) acc[j] = fma(xv, wr[j], acc[j]);
    }
    for (int j = 0; j < LJ; j++)
        if (j0 + j < OUT_F) y[row * OUT_F + j0 + j] = EPI(ACTF(acc[j] + b[j0 + j]), row * OUT_F + j0 + j);
}
