// Upsample by an integer factor s, PyTorch semantics: planes (N*C of them) of h x w become
// (h*s) x (w*s). Backward kernels gather (one work-item per input element, no atomics).
#include "resize.h"

// nearest: y[p, oy, ox] = x[p, oy / s, ox / s]; n = planes * h*s * w*s
__kernel void nearest_fwd(const int n, const int s, const int h, const int w,
                          __global const float *x, __global float *y) {
    int i = get_global_id(0);
    if (i >= n) return;
    int ow = w * s, oh = h * s;
    int ox = i % ow, t = i / ow, oy = t % oh, p = t / oh;
    y[i] = x[(p * h + oy / s) * w + ox / s];
}

// dx[p, iy, ix] = the sum of dy over its s x s block; n = planes * h * w
__kernel void nearest_bwd(const int n, const int s, const int h, const int w,
                          __global const float *dy, __global float *dx) {
    int i = get_global_id(0);
    if (i >= n) return;
    int ow = w * s, ix = i % w, t = i / w, iy = t % h, p = t / h;
    __global const float *b = dy + (p * h * s + iy * s) * ow + ix * s;
    float acc = 0.0f;
    for (int a = 0; a < s; a++)
        for (int c = 0; c < s; c++) acc += b[a * ow + c];
    dx[i] = acc;
}

// bilinear, align_corners=False: the source coordinates of resize.h
__kernel void bilinear_fwd(const int n, const int s, const int h, const int w,
                           __global const float *x, __global float *y) {
    int i = get_global_id(0);
    if (i >= n) return;
    int ow = w * s, oh = h * s;
    int ox = i % ow, t = i / ow, oy = t % oh, p = t / oh;
    float inv = 1.0f / s, fy, fx;
    int y0, y1, x0, x1;
    source(oy, inv, h, &y0, &y1, &fy);
    source(ox, inv, w, &x0, &x1, &fx);
    __global const float *r0 = x + (p * h + y0) * w, *r1 = x + (p * h + y1) * w;
    y[i] = (1.0f - fy) * ((1.0f - fx) * r0[x0] + fx * r0[x1]) + fy * ((1.0f - fx) * r1[x0] + fx * r1[x1]);
}

// The weight with which output index o reads input index k (both neighbours may be k at the border).
inline float weight(int o, int k, float inv, int size) {
    int lo, hi;
    float f;
    source(o, inv, size, &lo, &hi, &f);
    return (lo == k ? 1.0f - f : 0.0f) + (hi == k ? f : 0.0f);
}

// dx[p, iy, ix] = sum over the outputs that read it, dy * weight; only outputs in rows
// [(iy - 1) s, (iy + 2) s) (and likewise columns) can read input row iy.
__kernel void bilinear_bwd(const int n, const int s, const int h, const int w,
                           __global const float *dy, __global float *dx) {
    int i = get_global_id(0);
    if (i >= n) return;
    int ow = w * s, oh = h * s, ix = i % w, t = i / w, iy = t % h, p = t / h;
    float inv = 1.0f / s, acc = 0.0f;
    int ya = max(0, (iy - 1) * s), yb = min(oh, (iy + 2) * s);
    int xa = max(0, (ix - 1) * s), xb = min(ow, (ix + 2) * s);
    for (int oy = ya; oy < yb; oy++) {
        float wy = weight(oy, iy, inv, h);
        if (wy == 0.0f) continue;
        __global const float *row = dy + (p * oh + oy) * ow;
        float r = 0.0f;
        for (int ox = xa; ox < xb; ox++) r += weight(ox, ix, inv, w) * row[ox];
        acc += wy * r;
    }
    dx[i] = acc;
}
