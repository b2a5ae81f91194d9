// A classifier's head in a CPU training step (netcl.trainstep): Linear(IN, C), C <= 16, and the
// cross-entropy after it, forward and backward in one launch of one work-item:
//   y = x W + b, the loss's mean and refused labels, g = dL/dy (the CrossEntropyLoss's gradient; labels
//   equal to ignore_index count for nothing),
//   gw (+)= x^T g, gb (+)= the column sums of g, dx = g W^T (want_dx).
// As layer calls these are six launches (GEMM, loss, its sum, two GEMMs and a bias sum), each a
// few microseconds of arithmetic behind a PoCL launch that costs as much (the host side:
// CrossEntropyLoss.enqueue_linear). Every row of W and of g is one float16 (lanes past C unused):
// W's rows load as whole vectors where the 16 floats stay inside W (rows below `wide`), reading the
// next rows' values into lanes whose products nothing stores; g is kept padded (gp, N x 16, zeros
// past C) for the two gradients, and W transposed (wt, C x IN) for dx. The softmax runs in scalars
// as loss.cl's cross_entropy does (the same operations in the same order).
#include "vec_cpu.h"

#define ROWS 4  // rows of x (or columns of gw) a pass over W (or g) serves

inline float16 w_row(__global const float *w, const int i, const int C, const int wide) {
    if (i < wide) return *(__global const ufloat16 *)(w + i * C);
    float t[16];
    for (int c = 0; c < 16; c++) t[c] = c < C ? w[i * C + c] : 0.0f;
    return *(float16 *)t;
}

inline void store_row(__global float *dst, const float16 v, const int C, const int acc) {
    float t[16];
    *(float16 *)t = v;
    for (int c = 0; c < C; c++) dst[c] = acc ? dst[c] + t[c] : t[c];
}

__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void linear_ce_cpu(const int N, const int IN, const int C, __global const float *restrict x,
                   __global const float *restrict w, __global const float *restrict b, const int has_bias,
                   __global const float *restrict labels, const int ignore, __global float *restrict y,
                   __global float *restrict g,
                   __global float *restrict gp, __global float *restrict wt, __global float *restrict gw,
                   const int acc_w, __global float *restrict gb, const int acc_b, __global float *restrict dx,
                   const int want_dx, __global float *restrict out) {
    const int wide = IN - (16 - C + C - 1) / C;
    float16 bias = (float16)(0.0f);
    if (has_bias) {
        float t[16];
        for (int c = 0; c < 16; c++) t[c] = c < C ? b[c] : 0.0f;
        bias = *(float16 *)t;
    }
    float total = 0.0f, refused = 0.0f;
    int valid = 0;
    for (int r = 0; r < N; r++) valid += labels[r] != (float)ignore;
    const float scale = 1.0f / (float)valid;  // (no valid label: the mean is NaN, every gradient 0)
    // forward and the loss, ROWS rows a pass over W
    for (int r0 = 0; r0 < N; r0 += ROWS) {
        __global const float *xr[ROWS];
#pragma unroll
        for (int j = 0; j < ROWS; j++) xr[j] = x + MIN(r0 + j, N - 1) * IN;  // rows past N: computed, not stored
        float16 acc[ROWS];
#pragma unroll
        for (int j = 0; j < ROWS; j++) acc[j] = bias;
        for (int i = 0; i < IN; i++) {
            const float16 wv = w_row(w, i, C, wide);
#pragma unroll
            for (int j = 0; j < ROWS; j++) acc[j] += xr[j][i] * wv;
        }
        for (int j = 0; j < ROWS && r0 + j < N; j++) {
            const int r = r0 + j;
            float s[16];
            *(float16 *)s = acc[j];
            for (int c = 0; c < C; c++) y[r * C + c] = s[c];
            const float yf = labels[r];
            const int skip = yf == (float)ignore;
            const float bad = (skip || (yf >= 0.0f && yf < (float)C && yf == floor(yf))) ? 0.0f : 1.0f;
            const int keep = bad == 0.0f && !skip;
            const int lab = keep ? (int)yf : 0;  // a refused or ignored label still indexes inside the row
            float m = -INFINITY;
            for (int c = 0; c < C; c++) m = fmax(m, s[c]);
            float e = 0.0f;
            for (int c = 0; c < C; c++) e += exp(s[c] - m);
            const float lse = m + log(e);
            total += keep ? lse - s[lab] : 0.0f;
            refused += bad;
            float t[16];
            for (int c = 0; c < 16; c++)
                t[c] = c < C && keep ? (exp(s[c] - lse) - (c == lab ? 1.0f : 0.0f)) * scale : 0.0f;
            for (int c = 0; c < C; c++) g[r * C + c] = t[c];
            ((__global float16 *)gp)[r] = *(float16 *)t;
        }
    }
    out[0] = total * scale;
    out[1] = refused;
    // gw (+)= x^T g: ROWS columns of x a pass over g
    for (int i0 = 0; i0 < IN; i0 += ROWS) {
        float16 acc[ROWS];
#pragma unroll
        for (int j = 0; j < ROWS; j++) acc[j] = (float16)(0.0f);
        const int il = MIN(ROWS, IN - i0);
        for (int r = 0; r < N; r++) {
            const float16 gv = ((__global const float16 *)gp)[r];
            __global const float *xr = x + r * IN + i0;
#pragma unroll
            for (int j = 0; j < ROWS; j++) acc[j] += xr[MIN(j, il - 1)] * gv;
        }
        for (int j = 0; j < il; j++) store_row(gw + (i0 + j) * C, acc[j], C, acc_w);
    }
    if (has_bias) {
        float16 sum = (float16)(0.0f);
        for (int r = 0; r < N; r++) sum += ((__global const float16 *)gp)[r];
        store_row(gb, sum, C, acc_b);
    }
    if (!want_dx) return;
    // dx = g W^T, 16 inputs a vector: W transposed first (wt, C x IN)
    for (int i = 0; i < IN; i++)
        for (int c = 0; c < C; c++) wt[c * IN + i] = w[i * C + c];
    const int iv = IN / 16 * 16;
    for (int r = 0; r < N; r++) {
        float gr[16];
        *(float16 *)gr = ((__global const float16 *)gp)[r];
        __global float *d = dx + r * IN;
        for (int i0 = 0; i0 < iv; i0 += 16) {
            float16 v = (float16)(0.0f);
            for (int c = 0; c < C; c++) v += gr[c] * *(__global const ufloat16 *)(wt + c * IN + i0);
            *(__global ufloat16 *)(d + i0) = v;
        }
        for (int i = iv; i < IN; i++) {
            float v = 0.0f;
            for (int c = 0; c < C; c++) v += gr[c] * wt[c * IN + i];
            d[i] = v;
        }
    }
}
