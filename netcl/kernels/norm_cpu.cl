// BatchNorm2d's training passes for CPU devices (PoCL): explicit float16 vectors along the rows
// of (N, C, HW), one work-item (local size 1) per part of a channel or per chunk of the tensor,
// and no index division per element (a division per row). The parts are norm.cl's: a channel's
// M = N * HW values in (n, hw) order, `len` per part (the last one shorter), so norm.cl's
// bn_stats_finish and bn_bwd_finish combine them, in the same fixed order.
// The apply and backward kernels are built per activation (-DACT_KIND, -DACT_OUT: see BN_DZ):
// training fuses BatchNorm2d with the activation after it; ACT_NONE is plain BatchNorm.
#include "act.h"
#include "bn_act.h"

#include "vec_cpu.h"

// Sums run in float16 accumulators (VW lanes), flushed into a second set every FLUSH vectors:
// no lane adds more than about FLUSH + values / (16 * FLUSH) terms in a row (the rounding of a
// long sequential sum grows with its length; a GPU's 64 work-items and tree are as accurate).
#define FLUSH 32

// Batch statistics, stage 1: part p of channel c writes its sum and its sum of squared
// deviations from its own mean (two passes, the second from cache; corrected by the
// deviations' sum), as norm.cl's bn_stats_part. A part is walked as row segments: one
// division per row, vectors along it; a row's tail (HW not a multiple of 16) is summed on its
// own and added to lane 0.
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void bn_stats_part_cpu(const int N, const int C, const int HW, const int plen, __global const float *x,
                       __global float *part) {
    const int pi = get_global_id(0), c = get_global_id(1), parts = get_global_size(0);
    const int j0 = pi * plen, j1 = min(N * HW, j0 + plen);
    float16 s16 = 0.0f, r16 = 0.0f;
    int nv = 0;
    for (int j = j0, len; j < j1; j += len) {
        const int n = j / HW, hw = j - n * HW;
        __global const float *p = x + (n * C + c) * HW + hw;
        len = min(HW - hw, j1 - j);
        int i = 0;
        for (; i + 16 <= len; i += 16) {
            r16 += *(__global const ufloat16 *)(p + i);
            if (++nv == FLUSH) s16 += r16, r16 = 0.0f, nv = 0;
        }
        float t = 0.0f;
        for (; i < len; i++) t += p[i];
        r16.s0 += t;
    }
    const float cnt = (float)(j1 - j0), s = hsum16(s16 + r16), mu = s / cnt;
    float16 d16 = 0.0f, q16 = 0.0f, rd16 = 0.0f, rq16 = 0.0f;
    nv = 0;
    for (int j = j0, len; j < j1; j += len) {
        const int n = j / HW, hw = j - n * HW;
        __global const float *p = x + (n * C + c) * HW + hw;
        len = min(HW - hw, j1 - j);
        int i = 0;
        for (; i + 16 <= len; i += 16) {
            const float16 d = *(__global const ufloat16 *)(p + i) - mu;
            rd16 += d;
            rq16 += d * d;
            if (++nv == FLUSH) d16 += rd16, q16 += rq16, rd16 = rq16 = 0.0f, nv = 0;
        }
        float td = 0.0f, tq = 0.0f;
        for (; i < len; i++) {
            const float d = p[i] - mu;
            td += d;
            tq += d * d;
        }
        rd16.s0 += td;
        rq16.s0 += tq;
    }
    const float sd = hsum16(d16 + rd16), sq = hsum16(q16 + rq16);
    part[2 * (c * parts + pi)] = s;
    part[2 * (c * parts + pi) + 1] = sq - sd * sd / cnt;
}

// Backward, stage 1: part p of channel c writes sum(dz) and sum(dz * (x - mean)), dz = dy
// through the fused activation (BN_DZ).
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void bn_bwd_part_cpu(const int N, const int C, const int HW, const int plen, __global const float *x,
                     __global const float *dy, __global const float *mean, __global const float *var,
                     __global const float *gamma, __global const float *beta, const float eps, const float slope,
                     __global float *part) {
    const int pi = get_global_id(0), c = get_global_id(1), parts = get_global_size(0);
    const int j0 = pi * plen, j1 = min(N * HW, j0 + plen);
    const float mu = mean[c], inv = rsqrt(var[c] + eps), ga = gamma[c], be = beta[c];
    float16 b16 = 0.0f, g16 = 0.0f, rb16 = 0.0f, rg16 = 0.0f;
    int nv = 0;
    for (int j = j0, len; j < j1; j += len) {
        const int n = j / HW, hw = j - n * HW, o = (n * C + c) * HW + hw;
        __global const float *xp = x + o, *gp = dy + o;
        len = min(HW - hw, j1 - j);
        int i = 0;
        for (; i + 16 <= len; i += 16) {
            const float16 xv = *(__global const ufloat16 *)(xp + i);
            const float16 g = BN_DZ(xv, *(__global const ufloat16 *)(gp + i), mu, inv, ga, be, slope);
            rb16 += g;
            rg16 += g * (xv - mu);
            if (++nv == FLUSH) b16 += rb16, g16 += rg16, rb16 = rg16 = 0.0f, nv = 0;
        }
        float tb = 0.0f, tg = 0.0f;
        for (; i < len; i++) {
            const float g = BN_DZ(xp[i], gp[i], mu, inv, ga, be, slope);
            tb += g;
            tg += g * (xp[i] - mu);
        }
        rb16.s0 += tb;
        rg16.s0 += tg;
    }
    part[2 * (c * parts + pi)] = hsum16(b16 + rb16);
    part[2 * (c * parts + pi) + 1] = hsum16(g16 + rg16);
}

// The element-wise passes: work-item t runs the chunk [t * chunk, (t + 1) * chunk) of the
// (N*C*HW) tensor row by row, each row (n, c) with its channel's constants.

// y = act((x - mean) * rsqrt(var + eps) * gamma + beta) (batch or running statistics)
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void bn_apply_cpu(const int total, const int chunk, const int C, const int HW, __global const float *x,
                  __global const float *mean, __global const float *var, __global const float *gamma,
                  __global const float *beta, const float eps, const float slope, __global float *y) {
    const int i1 = min(total, (int)get_global_id(0) * chunk + chunk);
    for (int i = get_global_id(0) * chunk, e; i < i1; i = e) {
        const int r = i / HW, c = r % C;
        const float m = mean[c], inv = rsqrt(var[c] + eps), g = gamma[c], b = beta[c];
        e = min(i1, (r + 1) * HW);
        int k = i;
        for (; k + 16 <= e; k += 16)
            *(__global ufloat16 *)(y + k) = ACT_APPLY(ACT_KIND, BN_Z(*(__global const ufloat16 *)(x + k), m, inv, g, b),
                                                      slope);
        for (; k < e; k++) y[k] = ACT_APPLY(ACT_KIND, BN_Z(x[k], m, inv, g, b), slope);
    }
}

// Backward, stage 3, element-wise: with batch statistics
// dx = gamma * invstd * (dz - dbeta / M - (x - mean) * invstd * dgamma / M), with running
// statistics (eval mode: constants) dx = gamma * invstd * dz. sums[c] = (dbeta, dgamma); dz =
// dy through the fused activation (BN_DZ).
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void bn_bwd_apply_cpu(const int total, const int chunk, const int C, const int HW, __global const float *x,
                      __global const float *dy, __global const float *mean, __global const float *var,
                      __global const float *gamma, __global const float *beta, const float eps, const float slope,
                      __global const float *sums, __global float *dx, const int batch_stats) {
    const float inv_m = 1.0f / (float)(total / C);
    const int i1 = min(total, (int)get_global_id(0) * chunk + chunk);
    for (int i = get_global_id(0) * chunk, e; i < i1; i = e) {
        const int r = i / HW, c = r % C;
        const float inv = rsqrt(var[c] + eps), g = gamma[c] * inv, m = mean[c], ga = gamma[c], be = beta[c];
        const float k1 = batch_stats ? sums[2 * c] * inv_m : 0.0f;
        const float k2 = batch_stats ? sums[2 * c + 1] * inv * inv_m : 0.0f;
        e = min(i1, (r + 1) * HW);
        int k = i;
        for (; k + 16 <= e; k += 16) {
            const float16 xv = *(__global const ufloat16 *)(x + k);
            const float16 gv = BN_DZ(xv, *(__global const ufloat16 *)(dy + k), m, inv, ga, be, slope);
            *(__global ufloat16 *)(dx + k) = g * (gv - k1 - (xv - m) * k2);
        }
        for (; k < e; k++) dx[k] = g * (BN_DZ(x[k], dy[k], m, inv, ga, be, slope) - k1 - (x[k] - m) * k2);
    }
}
