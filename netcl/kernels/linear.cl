// Fused linear family (netcl/jit/linear.py): Linear + activation in one kernel, built for one
// layer. Defines: IN_F OUT_F OUT_P (out padded to LJ) LJ, ACT SLOPE (kernels/act.h).
#include "act.h"

#define ACTF(v) ACT_APPLY(ACT, v, SLOPE)

// Linear + activation: y[row][j] = act(b[j] + sum_i x[row][i] * W[i][j]), W stored (in, out).
// Each work-item computes LJ adjacent outputs of one row.
__kernel void linear(const int rows, __global const float *restrict x, __global const float *restrict w,
                     __global const float *restrict b, __global float *restrict y) {
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
        if (j0 + j < OUT_F) y[row * OUT_F + j0 + j] = ACTF(acc[j] + b[j0 + j]);
}
