// The fused path's element-wise stages (netcl/jit/eltwise.py): a residual add that no kernel's
// epilogue could take, with the activation that follows the block. Defines: ACT SLOPE.
#include "act.h"

#ifndef ACT  // (built without defines: no activation)
#define ACT ACT_NONE
#define SLOPE 0.0f
#endif

__kernel void add_act(const int n, __global const float *a, __global const float *b, __global float *y) {
    const int i = get_global_id(0);
    if (i < n) y[i] = ACT_APPLY(ACT, a[i] + b[i], SLOPE);
}

// A Concat branch's tensor into its slice of the output: rows of `inner` contiguous floats (the
// dimensions after the concat axis), row (o, j) of the branch (o < rows / part, j < part) going to
// row (o, offset + j) of the output (whole rows along the axis). Each work-item copies RUN floats.
#define RUN 16
__kernel void copy_rows(const int rows, const int inner, const int part, const int whole, const int offset,
                        __global const float *src, __global float *dst) {
    const int i0 = get_global_id(0) * RUN, row = get_global_id(1);
    if (row >= rows || i0 >= inner) return;
    __global const float *s = src + (long)row * inner;
    __global float *d = dst + ((long)(row / part) * whole + offset + row % part) * inner;
    if (i0 + RUN <= inner) {
#pragma unroll
        for (int t = 0; t < RUN; t++) d[i0 + t] = s[i0 + t];
    } else {
        for (int t = i0; t < inner; t++) d[t] = s[t];
    }
}
