// Element-wise kernels: activations (forward and backward), dropout, multiply.
// One work-item per element; n is the element count (the launch is rounded up).

#include "act.h"

// kind: a netcl.act.Act code (act.h); slope: leaky relu's
__kernel void act_fwd(const int n, const int kind, const float slope,
                      __global const float *x, __global float *y) {
    int i = get_global_id(0);
    if (i < n) y[i] = ACT_APPLY(kind, x[i], slope);
}

// saved: the forward's input (relu, leaky relu) or output (sigmoid, tanh)
__kernel void act_bwd(const int n, const int kind, const float slope, __global const float *saved,
                      __global const float *dy, __global float *dx) {
    int i = get_global_id(0);
    if (i < n) dx[i] = ACT_GRAD(kind, saved[i], dy[i], slope);
}

// A counter-based hash (lowbias32): the mask of element i depends only on (seed, i).
uint hash32(uint x) {
    x ^= x >> 16; x *= 0x7feb352dU; x ^= x >> 15; x *= 0x846ca68bU; x ^= x >> 16;
    return x;
}

// mask[i] = 0 or 1/(1-p); y = x * mask
__kernel void dropout_fwd(const int n, const uint seed, const float p, __global const float *x,
                          __global float *mask, __global float *y) {
    int i = get_global_id(0);
    if (i >= n) return;
    float u = (float)(hash32(hash32((uint)i) ^ seed) >> 8) * (1.0f / 16777216.0f);
    float m = u >= p ? 1.0f / (1.0f - p) : 0.0f;
    mask[i] = m;
    y[i] = x[i] * m;
}

__kernel void mul(const int n, __global const float *a, __global const float *b, __global float *y) {
    int i = get_global_id(0);
    if (i < n) y[i] = a[i] * b[i];
}
