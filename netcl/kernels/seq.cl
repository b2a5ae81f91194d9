// The fused path's sequence and resampling kernels (netcl/jit/seq.py): LayerNorm, self-attention,
// the mean over an axis, Transpose, MaxPool2d and Upsample, each built for one stage's sizes (defines), with the batch as an argument; a
// program holds the kernel whose defines it was given.
#include "pool.h"
#include "resize.h"

// LayerNorm over the last axis, rows of D: y = (x - mean) / sqrt(var + EPS) * gamma + beta, biased
// variance in two passes, as PyTorch. One work-item per row. Defines: D EPS
#ifdef EPS
__kernel void layernorm(const int rows, __global const float *restrict x, __global const float *restrict gamma,
                        __global const float *restrict beta, __global float *restrict y) {
    const int r = get_global_id(0);
    if (r >= rows) return;
    __global const float *xr = x + (size_t)r * D;
    float s = 0.0f;
    for (int k = 0; k < D; k++) s += xr[k];
    const float m = s / D;
    float v = 0.0f;
    for (int k = 0; k < D; k++) {
        const float d = xr[k] - m;
        v += d * d;
    }
    const float rstd = 1.0f / sqrt(v / D + EPS);
    __global float *yr = y + (size_t)r * D;
    for (int k = 0; k < D; k++) yr[k] = (xr[k] - m) * rstd * gamma[k] + beta[k];
}

#endif

#ifdef HD
// Multi-head self-attention, after the input projection: qkv (N, L, 3E) holds q, k and v side by
// side (head h at columns h*HD of each); out (N, L, E) gets softmax(q k^T * SCALE) v, head h at
// columns h*HD. One work-item per (sample, head, QB queries), one pass over the keys in blocks of
// 16 with a running maximum (online softmax: each block's scores once, the sums so far rescaled
// when the maximum grows, where two passes would compute them twice), no L x L scores stored. On CPUs QB
// is 16, the queries one float16 (the dots and exponentials of 16 queries in one vector, each key
// element broadcast: PoCL vectorises nothing else); on GPUs 1. A NaN score is skipped by fmax and
// comes out through its exponential. Defines: L E HD SCALE QB
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#if QB == 1
#define QV float
#else
#define QV CAT(float, QB)
#endif
__kernel void attention(const int nh, __global const float *restrict qkv, __global float *restrict out) {
    const int i0 = get_global_id(0) * QB, bh = get_global_id(1);
    if (i0 >= L || bh >= nh) return;
    const int b = bh / (E / HD), h = bh % (E / HD);
    __global const float *base = qkv + (size_t)b * L * 3 * E + h * HD;
    QV q[HD], acc[HD];
    for (int d = 0; d < HD; d++) {  // queries past L repeat the last one; they are not written
        QV t;
        float *tp = (float *)&t;
        for (int c = 0; c < QB; c++) tp[c] = base[(size_t)min(i0 + c, L - 1) * 3 * E + d] * SCALE;
        q[d] = t;
        acc[d] = (QV)(0.0f);
    }
    QV m = (QV)(-INFINITY), l = (QV)(0.0f);
    for (int j0 = 0; j0 < L; j0 += 16) {  // a block of keys: its scores, then its share of the sums
        QV sc[16], mb = m;
        for (int c = 0; c < 16; c++) {
            __global const float *kj = base + (size_t)min(j0 + c, L - 1) * 3 * E + E;
            QV t = q[0] * kj[0];
            for (int d = 1; d < HD; d++) t += q[d] * kj[d];  // not fma(): an out-of-line call on PoCL
            sc[c] = j0 + c < L ? t : (QV)(-INFINITY);
            mb = sc[c] > mb ? sc[c] : mb;  // fmax (NaN skipped) as an inline blend: vector fmax is a call on PoCL
        }
        const QV corr = exp(m - mb);  // rescales what the earlier blocks summed (0 for the first)
        l *= corr;
        for (int d = 0; d < HD; d++) acc[d] *= corr;
        for (int c = 0; c < 16 && j0 + c < L; c++) {
            __global const float *vj = base + (size_t)(j0 + c) * 3 * E + 2 * E;
            const QV p = exp(sc[c] - mb);
            l += p;
            for (int d = 0; d < HD; d++) acc[d] += p * vj[d];
        }
        m = mb;
    }
    for (int d = 0; d < HD; d++) {
        QV t = acc[d] / l;
        float *tp = (float *)&t;
        for (int c = 0; c < QB && i0 + c < L; c++) out[((size_t)b * L + i0 + c) * E + h * HD + d] = tp[c];
    }
}
#endif

#ifdef INNER
// The mean over the middle axis of x read as (outer, R, INNER): y (outer, INNER). Global average
// pooling (INNER 1) and the average over tokens of a (N, L, E) sequence (R = L, INNER = E).
// One work-item per output. Defines: R INNER
__kernel void mean_axis(const int n, __global const float *restrict x, __global float *restrict y) {
    const int idx = get_global_id(0);
    if (idx >= n) return;
    __global const float *xr = x + (size_t)(idx / INNER) * R * INNER + idx % INNER;
    float s = 0.0f;
    for (int r = 0; r < R; r++) s += xr[(size_t)r * INNER];
    y[idx] = s / R;
}
#endif

#ifdef TD0
// x read as (A, TD0, TB, TD1, TC) written as (A, TD1, TB, TD0, TC) (a Transpose): one work-item per
// output row of TD0 x TC contiguous floats, so the index arithmetic is per row, not per element.
__kernel void transpose_rows(const int rows, __global const float *restrict x, __global float *restrict y) {
    const int r = get_global_id(0);
    if (r >= rows) return;
    const int b = r % TB, i1 = (r / TB) % TD1, a = r / (TB * TD1);
    __global const float *xr = x + (size_t)a * TD0 * TB * TD1 * TC + ((size_t)b * TD1 + i1) * TC;
    __global float *yr = y + (size_t)r * TD0 * TC;
    for (int i0 = 0; i0 < TD0; i0++)
        for (int c = 0; c < TC; c++) yr[i0 * TC + c] = xr[(size_t)i0 * TB * TD1 * TC + c];
}
#endif

#ifdef PK
// MaxPool2d (PK x PK windows, stride PS, padding PP: pool.h's window_max) of planes H x W into
// OH x OW: one work-item per output row.
__kernel void maxpool(const int rows, __global const float *restrict x, __global float *restrict y) {
    const int r = get_global_id(0);
    if (r >= rows) return;
    const int oh = r % OH;
    __global const float *xp = x + (size_t)(r / OH) * H * W;
    __global float *yr = y + (size_t)r * OW;
    int ow = 0;
#if PK == 2 && PS == 2 && PP == 0
    // 2x2/2 windows, eight outputs at a time: two rows of 16 inputs, their lane-wise max, then the
    // max of even and odd lanes (PyTorch's rule: a NaN wins, in either operand); ceil_mode's last
    // row and column, which reach past the input, are window_max's below
    typedef float16 __attribute__((aligned(4))) urow;
    typedef float8 __attribute__((aligned(4))) uout;
    __global const float *r0 = xp + 2 * oh * W;
    for (; ow + 8 <= OW && 2 * oh + 1 < H && 2 * (ow + 8) <= W; ow += 8) {
        const float16 a = *(__global const urow *)(r0 + 2 * ow), b = *(__global const urow *)(r0 + W + 2 * ow);
        const float16 m = b > a || b != b ? b : a;
        const float8 e = __builtin_shufflevector(m, m, 0, 2, 4, 6, 8, 10, 12, 14);
        const float8 o = __builtin_shufflevector(m, m, 1, 3, 5, 7, 9, 11, 13, 15);
        *(__global uout *)(yr + ow) = o > e || o != o ? o : e;
    }
#endif
    int arg;
    for (; ow < OW; ow++) yr[ow] = window_max(xp, H, W, PK, PS, PP, oh, ow, &arg);
}
#endif

#ifdef US
// Upsample by US, nearest (BILINEAR 0) or bilinear with align_corners=False (resize.h's source
// coordinates, as kernels/resize.cl), planes H x W: one work-item per output row.
__kernel void upsample_rows(const int rows, __global const float *restrict x, __global float *restrict y) {
    const int r = get_global_id(0);
    if (r >= rows) return;
    const int oy = r % (H * US);
    __global const float *xp = x + (size_t)(r / (H * US)) * H * W;
    __global float *yr = y + (size_t)r * W * US;
#if BILINEAR
    const float inv = 1.0f / US;
    int y0, y1, x0, x1;
    float fy, fx;
    source(oy, inv, H, &y0, &y1, &fy);
    __global const float *r0 = xp + y0 * W, *r1 = xp + y1 * W;
    for (int ox = 0; ox < W * US; ox++) {
        source(ox, inv, W, &x0, &x1, &fx);
        yr[ox] = (1.0f - fy) * ((1.0f - fx) * r0[x0] + fx * r0[x1]) + fy * ((1.0f - fx) * r1[x0] + fx * r1[x1]);
    }
#else
    __global const float *xr = xp + (oy / US) * W;
    for (int ox = 0; ox < W * US; ox++) yr[ox] = xr[ox / US];
#endif
}
#endif
