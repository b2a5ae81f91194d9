// GroupNorm on x (N, C, S) seen as N*G rows of D = C/G * S values each (a row is one image's group of
// channels, contiguous): a work-item per row for the statistics and dx, a work-item per channel for
// the affine parameters' gradients. Every sum runs in one work-item in a fixed order: deterministic.
// Sums run in 16 lanes (lanes.h), added pairwise at the end (sum16): independent chains a CPU's vector
// unit can run side by side, still in a fixed order.
// A row is walked channel by channel (its C / G channels of S positions each): no division per value.

#include "lanes.h"

inline float sum16(float *a) {
#pragma unroll
    for (int w = 8; w > 0; w /= 2)
#pragma unroll
        for (int i = 0; i < w; i++) a[i] += a[i + w];
    return a[0];
}

// y = (x - mean) * rstd * w[c] + b[c] (w, b unused when affine is 0); mean, rstd saved per row
__kernel void gn_fwd(const int R, const int D, const int S, const int G, const int Cg, __global const float *x,
                     __global const float *w, __global const float *b, const int affine, const float eps,
                     __global float *y, __global float *mean, __global float *rstd) {
    const int r = get_global_id(0);
    if (r >= R) return;
    __global const float *xr = x + (long)r * D;
    float s[16], v[16];
#pragma unroll
    for (int i = 0; i < 16; i++) s[i] = v[i] = 0.0f;
    LANES16(d, 0, D, l, s[l] += xr[d]);
    const float mu = sum16(s) / (float)D;
    LANES16(d, 0, D, l, v[l] += (xr[d] - mu) * (xr[d] - mu));
    const float inv = rsqrt(sum16(v) / (float)D + eps);
    __global float *yr = y + (long)r * D;
    const int c0 = (r % G) * Cg;
    for (int k = 0; k < Cg; k++) {  // a channel's positions at a time: its weight and bias are constants there
        // (x - mu) first: x * a - mu * a cancels where |mu| is much larger than the spread
        const float a = affine ? inv * w[c0 + k] : inv, bk = affine ? b[c0 + k] : 0.0f;
        __global const float *xc = xr + (long)k * S;
        __global float *yc = yr + (long)k * S;
        for (int p = 0; p < S; p++) yc[p] = (xc[p] - mu) * a + bk;
    }
    mean[r] = mu;
    rstd[r] = inv;
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) over the row, g = dy * w[c]
__kernel void gn_bwd_dx(const int R, const int D, const int S, const int G, const int Cg, __global const float *x,
                        __global const float *dy, __global const float *w, const int affine,
                        __global const float *mean, __global const float *rstd, __global float *dx) {
    const int r = get_global_id(0);
    if (r >= R) return;
    const long base = (long)r * D;
    const float mu = mean[r], inv = rstd[r];
    const int c0 = (r % G) * Cg;
    float sa = 0.0f, sb = 0.0f;
    for (int k = 0; k < Cg; k++) {  // per channel: sum(dy) and sum(dy * x), then times its weight
        const long o = base + (long)k * S;
        float s0[16], s1[16];
#pragma unroll
        for (int i = 0; i < 16; i++) s0[i] = s1[i] = 0.0f;
        LANES16(p, 0, S, l, {
            s0[l] += dy[o + p];
            s1[l] += dy[o + p] * (x[o + p] - mu);
        });
        const float wk = affine ? w[c0 + k] : 1.0f;
        sa += wk * sum16(s0);
        sb += wk * sum16(s1);
    }
    const float a = sa / (float)D, bm = sb * inv / (float)D;
    for (int k = 0; k < Cg; k++) {
        const long o = base + (long)k * S;
        const float wk = affine ? w[c0 + k] : 1.0f;
        for (int p = 0; p < S; p++) {
            const float g = dy[o + p] * wk;  // its own statement: not contracted into an fma with - a
            dx[o + p] = inv * ((g - a) - (x[o + p] - mu) * inv * bm);
        }
    }
}

// dw[c] (+)= sum over images and positions of dy * xhat, db[c] (+)= sum of dy; a work-item per channel
__kernel void gn_bwd_params(const int N, const int C, const int S, const int G, const int Cg,
                            __global const float *x, __global const float *dy, __global const float *mean,
                            __global const float *rstd, __global float *dw, __global float *db, const int acc) {
    const int c = get_global_id(0);
    if (c >= C) return;
    float sw = 0.0f, sb = 0.0f;
    for (int n = 0; n < N; n++) {
        const int r = n * G + c / Cg;
        const float mu = mean[r], inv = rstd[r];
        const long base = ((long)n * C + c) * S;
        float s0[16], s1[16];
#pragma unroll
        for (int i = 0; i < 16; i++) s0[i] = s1[i] = 0.0f;
        LANES16(s, 0, S, l, {
            s1[l] += dy[base + s] * (x[base + s] - mu);
            s0[l] += dy[base + s];
        });
        sw += sum16(s1) * inv;
        sb += sum16(s0);
    }
    dw[c] = acc ? dw[c] + sw : sw;
    db[c] = acc ? db[c] + sb : sb;
}

// -- GPUs: a work-group of RED work-items per row (per channel for the parameters' gradients), a
// work-item's strided partial sums added by a fixed tree (group_sum): deterministic too.
#define RED 64
#include "group_sum.h"

__kernel __attribute__((reqd_work_group_size(RED, 1, 1)))
void gn_fwd_wg(const int R, const int D, const int S, const int G, const int Cg, __global const float *x,
               __global const float *w, __global const float *b, const int affine, const float eps,
               __global float *y, __global float *mean, __global float *rstd) {
    __local float part[RED];
    const int r = get_group_id(0), t = get_local_id(0);
    __global const float *xr = x + (long)r * D;
    float s = 0.0f;
    for (int d = t; d < D; d += RED) s += xr[d];
    const float mu = group_sum(part, s) / (float)D;
    float v = 0.0f;
    for (int d = t; d < D; d += RED) v += (xr[d] - mu) * (xr[d] - mu);
    const float inv = rsqrt(group_sum(part, v) / (float)D + eps);
    const int c0 = (r % G) * Cg;
    for (int d = t; d < D; d += RED) {
        const int c = c0 + d / S;
        y[(long)r * D + d] = affine ? (xr[d] - mu) * (inv * w[c]) + b[c] : (xr[d] - mu) * inv;
    }
    if (t == 0) {
        mean[r] = mu;
        rstd[r] = inv;
    }
}

__kernel __attribute__((reqd_work_group_size(RED, 1, 1)))
void gn_bwd_dx_wg(const int R, const int D, const int S, const int G, const int Cg, __global const float *x,
                  __global const float *dy, __global const float *w, const int affine,
                  __global const float *mean, __global const float *rstd, __global float *dx) {
    __local float part[RED];
    const int r = get_group_id(0), t = get_local_id(0);
    const long base = (long)r * D;
    const float mu = mean[r], inv = rstd[r];
    const int c0 = (r % G) * Cg;
    float sa = 0.0f, sb = 0.0f;
    for (int d = t; d < D; d += RED) {
        const float g = affine ? dy[base + d] * w[c0 + d / S] : dy[base + d];
        sa += g;
        sb += g * (x[base + d] - mu);
    }
    const float a = group_sum(part, sa) / (float)D, bm = group_sum(part, sb) * inv / (float)D;
    for (int d = t; d < D; d += RED) {
        const float g = affine ? dy[base + d] * w[c0 + d / S] : dy[base + d];
        dx[base + d] = inv * ((g - a) - (x[base + d] - mu) * inv * bm);
    }
}

__kernel __attribute__((reqd_work_group_size(RED, 1, 1)))
void gn_bwd_params_wg(const int N, const int C, const int S, const int G, const int Cg,
                      __global const float *x, __global const float *dy, __global const float *mean,
                      __global const float *rstd, __global float *dw, __global float *db, const int acc) {
    __local float part[RED];
    const int c = get_group_id(0), t = get_local_id(0);
    float sw = 0.0f, sb = 0.0f;
    for (int j = t; j < N * S; j += RED) {  // (n, s) of the channel's N * S values
        const int n = j / S, s = j - n * S, r = n * G + c / Cg;
        const long o = ((long)n * C + c) * S + s;
        sw += dy[o] * (x[o] - mean[r]) * rstd[r];
        sb += dy[o];
    }
    sw = group_sum(part, sw);
    sb = group_sum(part, sb);
    if (t == 0) {
        dw[c] = acc ? dw[c] + sw : sw;
        db[c] = acc ? db[c] + sb : sb;
    }
}
