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
