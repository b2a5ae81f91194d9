// BatchNorm2d's training passes for CPU devices (PoCL): explicit float16 vectors along the rows
// of (N, C, HW), one work-item (local size 1) per part of a channel or per chunk of the tensor,
// and no index division per element (a division per row). The parts are norm.cl's: a channel's
// M = N * HW values in (n, hw) order, `len` per part (the last one shorter), so norm.cl's
// bn_stats_finish and bn_bwd_finish combine them, in the same fixed order.
// The apply and backward kernels are built per activation (-DACT_KIND, -DACT_OUT: see BN_DZ):
// training fuses BatchNorm2d with the activation after it; ACT_NONE is plain BatchNorm.
#include "act.h"
#include "bn_act.h"

#include "lanes.h"
#include "vec_cpu.h"
#include "softmax.h"

// Sums run in float16 accumulators (VW lanes), flushed into a second set every FLUSH vectors:
// no lane adds more than about FLUSH + values / (16 * FLUSH) terms in a row (the rounding of a
// long sequential sum grows with its length; a GPU's 64 work-items and tree are as accurate).
#define FLUSH 32

// dx of one element or vector from its x and its output gradient d (through the fused activation),
// with the batch-statistics terms k1, k2 (0 with running statistics) and the channel's constants
// g = gamma * invstd, m, inv, ga, be, slope in scope: every backward element-wise pass's formula
#define BN_DX(xv, d) (g * (BN_DZ(xv, d, m, inv, ga, be, slope) - k1 - ((xv) - m) * k2))
// BN_DX of the T (a vector type or float) at input offset i of x and dy, stored at o: both loaded
// before the formula, so that a scalar activation gradient is a select, not a branch around the
// dy load (which the compiler may not move ahead of the test)
#define BN_DX_ROW(T, o, i)                                                                    \
    do {                                                                                      \
        const T xv_ = *(__global const T *)(x + (i)), dv_ = *(__global const T *)(dy + (i));  \
        *(__global T *)(o) = BN_DX(xv_, dv_);                                                 \
    } while (0)

// the forward's y = act(BN(x)) of the T at input offset i of x, stored at o (m, inv, g, b, slope
// in scope)
#define BN_APPLY_ROW(T, o, i) *(__global T *)(o) = BN_ACT(*(__global const T *)(x + (i)), m, inv, g, b, slope)

// ROW(T, o, i) over n values from output o_, input offset r_: vectors of 16, then one of 8, of 4,
// then scalars (the element-wise passes: bn_apply_cpu, bn_add_act_cpu, bn_bwd_apply_cpu, and PAD_PLANE
// per row or plane)
#define PAD_RUN(ROW, o_, r_, n)                                          \
    do {                                                                 \
        int w_ = 0;                                                      \
        for (; w_ + 16 <= (n); w_ += 16) ROW(ufloat16, (o_) + w_, (r_) + w_); \
        if (w_ + 8 <= (n)) { ROW(ufloat8, (o_) + w_, (r_) + w_); w_ += 8; } \
        if (w_ + 4 <= (n)) { ROW(ufloat4, (o_) + w_, (r_) + w_); w_ += 4; } \
        for (; w_ < (n); w_++) ROW(float, (o_) + w_, (r_) + w_);         \
    } while (0)

// Batch statistics, stage 1: part p of channel c writes its sum and its sum of squared
// deviations from its own mean (two passes, the second from cache; corrected by the
// deviations' sum), as norm.cl's bn_stats_part. A part is walked as row segments: one
// division per row, vectors along it; a row's tail (HW not a multiple of 16) is summed on its
// own and added to lane 0.
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void bn_stats_part_cpu(const int N, const int C, const int HW, const int plen, __global const float *x,
                       __global float *part) {
    const int pi = get_global_id(0), c = get_global_id(1), parts = get_global_size(0);
    const int j0 = pi * plen, j1 = MIN(N * HW, j0 + plen);
    float16 s16 = 0.0f, r16 = 0.0f;
    int nv = 0;
    for (int j = j0, len; j < j1; j += len) {
        const int n = j / HW, hw = j - n * HW;
        __global const float *p = x + (n * C + c) * HW + hw;
        len = MIN(HW - hw, j1 - j);
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
        len = MIN(HW - hw, j1 - j);
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
    const int j0 = pi * plen, j1 = MIN(N * HW, j0 + plen);
    const float mu = mean[c], inv = rsqrt(var[c] + eps), ga = gamma[c], be = beta[c];
    float16 b16 = 0.0f, g16 = 0.0f, rb16 = 0.0f, rg16 = 0.0f;
    int nv = 0;
    for (int j = j0, len; j < j1; j += len) {
        const int n = j / HW, hw = j - n * HW, o = (n * C + c) * HW + hw;
        __global const float *xp = x + o, *gp = dy + o;
        len = MIN(HW - hw, j1 - j);
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
            const float xv = xp[i], gv = gp[i], g = BN_DZ(xv, gv, mu, inv, ga, be, slope);  // loads first: BN_DX_ROW
            tb += g;
            tg += g * (xv - mu);
        }
        rb16.s0 += tb;
        rg16.s0 += tg;
    }
    part[2 * (c * parts + pi)] = hsum16(b16 + rb16);
    part[2 * (c * parts + pi) + 1] = hsum16(g16 + rg16);
}

// Stage 2 inside the element-wise passes (a launch less each way): every work-item combines
// channel c's parts itself, in order, as norm.cl's bn_stats_finish and bn_bwd_finish do with a
// work-group (the same formulas; all work-items of a pass get the same values), and the one that
// writes the channel's first plane (image 0) also writes what those wrote. parts == 0: the
// statistics come in mean and var (eval mode, or a pooled BatchNorm's finished ones).
inline void bn_channel_stats(const int c, const int first, __global const float *part, const int parts,
                             const int plen, const int M, __global float *mean, __global float *var,
                             __global float *run_mean, __global float *run_var, const float momentum, float *mu,
                             float *v) {
    if (!parts) {
        *mu = mean[c], *v = var[c];
        return;
    }
    __global const float *pc = part + 2 * c * parts;
    float s = 0.0f, q = 0.0f;
    for (int p = 0; p < parts; p++) s += pc[2 * p];
    const float m = s / (float)M;
    for (int p = 0; p < parts; p++) {
        const float n = (float)MIN(plen, M - p * plen), d = pc[2 * p] / n - m;
        q += pc[2 * p + 1] + n * d * d;
    }
    *mu = m, *v = q / (float)M;
    if (first) {
        mean[c] = m, var[c] = *v;
        run_mean[c] = (1.0f - momentum) * run_mean[c] + momentum * m;
        run_var[c] = (1.0f - momentum) * run_var[c] + momentum * *v * (float)M / (float)MAX(M - 1, 1);
    }
}

// Stage 2 on its own, work-item c: channel c's statistics from many parts (a convolution's, 64
// values each: Conv2d.output_statistics), with bn_channel_stats' formulas, each sum in 16 strided
// running sums added pairwise (no long sequential run over the parts), into mean and var, the
// running statistics updated. Part p of channel c at part[2 (c cs + p ps)]: cs = parts, ps = 1 (a
// channel's parts together), or cs = 1, ps = C (a part's channels together: corr_cpu's and
// corrc_cpu's, whose work-items write all their channels' parts at once).
inline float sum16(float *a) {
#pragma unroll
    for (int w = 8; w > 0; w /= 2)
#pragma unroll
        for (int i = 0; i < w; i++) a[i] += a[i + w];
    return a[0];
}

// The parts' terms of the variance, q + n (s / n - m)^2 = q + (s - n m)^2 / n for a part of n values,
// its sum s and squared deviations q: in a channel's parts together (ps 1) as float16 of 8 (s, q)
// pairs, two of them a step (16 running sums, as the scalar loop's), the parts of plen values, and
// the short last one, if any, on its own (no per-part division, no strided scalar loads).
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void bn_stats_finish_cpu(const int M, const int parts, const int plen, __global const float *part, const int cs,
                         const int ps, __global float *mean, __global float *var, __global float *run_mean,
                         __global float *run_var, const float momentum) {
    const int c = get_global_id(0);
    __global const float *pc = part + 2 * c * cs;
    const int full = MIN(parts, M / plen), vec = ps == 1 ? full / 16 * 16 : 0;  // parts in the vector loop
    const float inv = 1.0f / (float)plen;
    const float16 even = (float16)(1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0);  // the s lanes
    float16 s0 = 0.0f, s1 = 0.0f;
    for (int p = 0; p < vec; p += 16)
        s0 += *(__global const ufloat16 *)(pc + 2 * p), s1 += *(__global const ufloat16 *)(pc + 2 * p + 16);
    float a[16];
    *(float16 *)a = (s0 + s1) * even;
    LANES16(p, vec, parts, l, a[l] += pc[2 * p * ps]);
    const float m = sum16(a) / (float)M;
    const float16 nm = (float)plen * m * even;
    float16 b0 = 0.0f, b1 = 0.0f;
    for (int p = 0; p < vec; p += 16) {
        const float16 t0 = *(__global const ufloat16 *)(pc + 2 * p) - nm, t1 = *(__global const ufloat16 *)(pc + 2 * p + 16) - nm;
        b0 += even != 0.0f ? t0 * t0 * inv : t0, b1 += even != 0.0f ? t1 * t1 * inv : t1;  // (s - n m)^2 / n, q
    }
    float b[16];
    *(float16 *)b = b0 + b1;
    LANES16(p, vec, full, l, {
        const float d = pc[2 * p * ps] - (float)plen * m;
        b[l] += pc[2 * p * ps + 1] + d * d * inv;
    });
    if (full < parts) {  // the short last part (one at most), into lane full % 16
        const float n = (float)(M - full * plen), d = pc[2 * full * ps] - n * m;
        const float t = pc[2 * full * ps + 1] + d * d / n;
#pragma unroll
        for (int l = 0; l < 16; l++) b[l] += l == full % 16 ? t : 0.0f;
    }
    const float v = sum16(b) / (float)M;
    mean[c] = m, var[c] = v;
    run_mean[c] = (1.0f - momentum) * run_mean[c] + momentum * m;
    run_var[c] = (1.0f - momentum) * run_var[c] + momentum * v * (float)M / (float)MAX(M - 1, 1);
}

// bn_stats_finish_cpu for parts whose channels lie together (part[p][c] = (s, q), C a multiple of
// 16: corrc_cpu's and corr_cpu's), every part of plen values (M = parts * plen): work-item g takes
// channels 16 g .. 16 g + 15 in the lanes, each part's 16 pairs two contiguous vector loads (a
// work-item per channel would read them as scalars 2 C floats apart, every line of the parts once
// per channel, and corrc_cpu's 4-position tiles give thousands of parts). Each sum adds
// FINISH_RUN parts, then joins a running total (the scalar
// kernel's 16 strided sums, alike in rounding).
#define FINISH_RUN 64
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void bn_stats_finish_pm_cpu(const int M, const int C, const int parts, const int plen, __global const float *part,
                            __global float *mean, __global float *var, __global float *run_mean,
                            __global float *run_var, const float momentum) {
    const int c0 = get_global_id(0) * 16;
    __global const float *pc = part + 2 * c0;
    float16 tot = 0.0f;
    for (int p0 = 0; p0 < parts; p0 += FINISH_RUN) {
        float16 run = 0.0f;
        for (int p = p0; p < MIN(parts, p0 + FINISH_RUN); p++) {
            __global const float *pp = pc + 2 * p * C;
            run += __builtin_shufflevector(*(__global const ufloat16 *)pp, *(__global const ufloat16 *)(pp + 16),
                                           EVEN_LANES);
        }
        tot += run;
    }
    const float16 m = tot / (float)M, nm = (float)plen * m;
    const float inv = 1.0f / (float)plen;
    float16 vt = 0.0f;
    for (int p0 = 0; p0 < parts; p0 += FINISH_RUN) {
        float16 run = 0.0f;
        for (int p = p0; p < MIN(parts, p0 + FINISH_RUN); p++) {
            __global const float *pp = pc + 2 * p * C;
            const float16 a = *(__global const ufloat16 *)pp, b = *(__global const ufloat16 *)(pp + 16);
            const float16 sv = __builtin_shufflevector(a, b, EVEN_LANES), qv = __builtin_shufflevector(a, b, ODD_LANES);
            const float16 d = sv - nm;
            run += qv + d * d * inv;
        }
        vt += run;
    }
    const float16 v = vt / (float)M;
    float ms[16], vs[16];
    *(float16 *)ms = m, *(float16 *)vs = v;
    const float unbias = (float)M / (float)MAX(M - 1, 1);
    for (int i = 0; i < 16; i++) {
        const int c = c0 + i;
        mean[c] = ms[i], var[c] = vs[i];
        run_mean[c] = (1.0f - momentum) * run_mean[c] + momentum * ms[i];
        run_var[c] = (1.0f - momentum) * run_var[c] + momentum * vs[i] * unbias;
    }
}

// norm.cl's bn_bwd_finish for CPUs (the pooled backward's sums, between its two passes): channel
// c's dbeta = sum(dz) and dgamma = sum(dz * xhat) from its parts (C, parts, 2), in 16 lanes as
// bn_stats_finish_cpu adds, into the parameter gradients (added to where acc) and sums[c] = (db,
// dg). One work-item per channel: the GPU kernel's work-groups of 64 and their barriers cost
// PoCL tens of microseconds a launch where this takes a few.
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void bn_bwd_finish_cpu(const int parts, __global const float *part, __global const float *var, const float eps,
                       __global float *dgamma, __global float *dbeta, const int acc, __global float *sums) {
    const int c = get_global_id(0);
    __global const float *pc = part + 2 * c * parts;
    float a[16], b[16];
#pragma unroll
    for (int i = 0; i < 16; i++) a[i] = b[i] = 0.0f;
    LANES16(p, 0, parts, l, a[l] += pc[2 * p], b[l] += pc[2 * p + 1]);
    const float db = sum16(a), dg = sum16(b) * rsqrt(var[c] + eps);
    dgamma[c] = acc ? dgamma[c] + dg : dg;
    dbeta[c] = acc ? dbeta[c] + db : db;
    sums[2 * c] = db;
    sums[2 * c + 1] = dg;
}

// dbeta = sum(dz), dgamma = sum(dz * xhat) of channel c from bn_bwd_part_cpu's parts (into the
// parameter gradients, added where acc, by the work-item of the channel's first plane)
inline void bn_channel_sums(const int c, const int first, __global const float *part, const int parts,
                            const float inv, __global float *dgamma, __global float *dbeta, const int acc,
                            float *db, float *dg) {
    __global const float *pc = part + 2 * c * parts;
    float sb = 0.0f, sg = 0.0f;
    for (int p = 0; p < parts; p++) sb += pc[2 * p], sg += pc[2 * p + 1];
    *db = sb, *dg = sg * inv;
    if (first) {
        dgamma[c] = acc ? dgamma[c] + *dg : *dg;
        dbeta[c] = acc ? dbeta[c] + *db : *db;
    }
}

// The element-wise passes: work-item t runs the chunk [t * chunk, (t + 1) * chunk) of the
// (N*C*HW) tensor row by row, each row (n, c) with its channel's constants.

// y = act((x - mean) * rsqrt(var + eps) * gamma + beta) (batch or running statistics)
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void bn_apply_cpu(const int total, const int chunk, const int C, const int HW, __global const float *x,
                  __global float *mean, __global float *var, __global const float *gamma,
                  __global const float *beta, const float eps, const float slope, __global float *y,
                  __global const float *part, const int parts, const int plen, __global float *run_mean,
                  __global float *run_var, const float momentum) {
    const int i1 = MIN(total, (int)get_global_id(0) * chunk + chunk);
    for (int i = get_global_id(0) * chunk, e; i < i1; i = e) {
        const int r = i / HW, c = r % C;
        float m, v;
        bn_channel_stats(c, r < C && i == r * HW, part, parts, plen, total / C, mean, var, run_mean, run_var,
                         momentum, &m, &v);
        const float inv = rsqrt(v + eps), g = gamma[c], b = beta[c];
        e = MIN(i1, (r + 1) * HW);
        PAD_RUN(BN_APPLY_ROW, y + i, i, e - i);
    }
}

// y = act(BN(x) + BN_s(s)): a Residual block's sum (netcl.nn.blocks) with its body's last
// BatchNorm2d applied in the same pass, and its shortcut's last one where sbn (else BN_s is the
// identity: s as it is), then the activation after the block (ACT_KIND). Those BatchNorms'
// own outputs are never stored (their backward reads their input): the pass replaces their
// element-wise passes and the sum's. Each combines its statistics (stage 2) as bn_apply_cpu does
// and, parts == 0, takes them as given (a BatchNorm2d in eval mode).
// S_BORDER 1: s is the block input's zero-bordered planes, s_hp x s_wp with the input's s_w-wide
// rows from row s_top, column s_left (Residual.forward_padded: the BatchNorm2d before the block
// wrote them for its first conv), read a row at a time. The planes' sizes are arguments, not
// build options: a new input size builds nothing (they are used once per row, not per element).
#ifndef S_BORDER
#define S_BORDER 0
#endif
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void bn_add_act_cpu(const int total, const int chunk, const int C, const int HW, const float slope,
                    __global const float *x, __global float *mean, __global float *var,
                    __global const float *gamma, __global const float *beta, const float eps,
                    __global const float *part, const int parts, const int plen, __global float *run_mean,
                    __global float *run_var, const float momentum, __global const float *s, const int sbn,
                    __global float *smean, __global float *svar, __global const float *sgamma,
                    __global const float *sbeta, const float seps, __global const float *spart, const int sparts,
                    const int splen, __global float *srun_mean, __global float *srun_var, const float smomentum,
                    __global float *y, const int s_top, const int s_left, const int s_hp, const int s_wp,
                    const int s_w) {
    const int i1 = MIN(total, (int)get_global_id(0) * chunk + chunk);
    for (int i = get_global_id(0) * chunk, e; i < i1; i = e) {
        const int r = i / HW, c = r % C, first = r < C && i == r * HW;
        float m, v, sm = 0.0f, sv = 0.0f;
        bn_channel_stats(c, first, part, parts, plen, total / C, mean, var, run_mean, run_var, momentum, &m, &v);
        if (sbn)
            bn_channel_stats(c, first, spart, sparts, splen, total / C, smean, svar, srun_mean, srun_var, smomentum,
                             &sm, &sv);
        const float inv = rsqrt(v + eps), g = gamma[c], b = beta[c];
        const float sinv = sbn ? rsqrt(sv + seps) : 1.0f, sg = sbn ? sgamma[c] : 1.0f, sb = sbn ? sbeta[c] : 0.0f;
        e = MIN(i1, (r + 1) * HW);
#define ADD_ROW(T, o, k)                                                                                     \
    *(__global T *)(o) = ACT_APPLY(ACT_KIND, BN_Z(*(__global const T *)(x + (k)), m, inv, g, b) +           \
                                             BN_Z(*(__global const T *)(s + soff + (k)), sm, sinv, sg, sb), slope)
#if S_BORDER
        for (int k = i, len; k < e; k += len) {  // row segments: s's offset from k changes per row
            const int hw = k - r * HW, h = hw / s_w, w0 = hw - h * s_w;
            const int soff = r * (s_hp * s_wp) + (h + s_top) * s_wp + s_left + w0 - k;
            len = MIN(e - k, s_w - w0);
            PAD_RUN(ADD_ROW, y + k, k, len);
        }
#else
        const int soff = 0;
        PAD_RUN(ADD_ROW, y + i, i, e - i);
#endif
#undef ADD_ROW
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
                      __global const float *part, const int parts, __global float *dgamma, __global float *dbeta,
                      const int acc, __global float *dx, const int batch_stats) {
    const float inv_m = 1.0f / (float)(total / C);
    const int i1 = MIN(total, (int)get_global_id(0) * chunk + chunk);
    for (int i = get_global_id(0) * chunk, e; i < i1; i = e) {
        const int r = i / HW, c = r % C;
        const float inv = rsqrt(var[c] + eps), g = gamma[c] * inv, m = mean[c], ga = gamma[c], be = beta[c];
        float db, dg;
        bn_channel_sums(c, r < C && i == r * HW, part, parts, inv, dgamma, dbeta, acc, &db, &dg);
        const float k1 = batch_stats ? db * inv_m : 0.0f;
        const float k2 = batch_stats ? dg * inv * inv_m : 0.0f;
        e = MIN(i1, (r + 1) * HW);
        PAD_RUN(BN_DX_ROW, dx + i, i, e - i);
    }
}

// The two element-wise passes writing their output into zero-bordered planes (NC, HP, WP), the
// values at row `top`, column `left` of each: the padded planes the next (forward) or previous
// (backward) convolution's CPU kernels read (netcl.nn.conv: Sequential hands them over, and the
// convolution makes no padded copy of its own). `planes` planes per work-item. PAD_PLANE walks
// one plane (c its channel): zero rows, and per data row a zero left border, the row's W values
// as ROW(T, o, w) (a T of them, from input offset w: float16, 8 and 4 while they fit, then
// scalars) and a zero right border; a plane without border (HP = H, WP = W) as one run. Rows
// narrower than 16 (8x8 planes) stay vectors: a scalar activation gradient (relu's g where s > 0)
// becomes a branch on the sign there, mispredicted at random.
inline void zero_span(__global float *d, const int n) {
    int i = 0;
    for (; i + 16 <= n; i += 16) *(__global ufloat16 *)(d + i) = 0.0f;
    for (; i < n; i++) d[i] = 0.0f;
}

#define PAD_PLANE(pl, ROW)                                                 \
    do {                                                                   \
        __global float *d_ = out + (pl) * HP * WP;                         \
        if (HP == H && WP == W) {                                          \
            PAD_RUN(ROW, d_, (pl) * H * W, H * W);                         \
        } else {                                                           \
            zero_span(d_, top * WP);                                       \
            for (int h_ = 0; h_ < H; h_++) {                               \
                __global float *o_ = d_ + (top + h_) * WP;                 \
                zero_span(o_, left);                                       \
                PAD_RUN(ROW, o_ + left, ((pl) * H + h_) * W, W);           \
                zero_span(o_ + left + W, WP - left - W);                   \
            }                                                              \
            zero_span(d_ + (top + H) * WP, (HP - top - H) * WP);           \
        }                                                                  \
    } while (0)

// bn_apply_cpu into padded planes
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void bn_apply_pad_cpu(const int NC, const int planes, const int C, const int H, const int W, const int HP,
                      const int WP, const int top, const int left, __global const float *x,
                      __global float *mean, __global float *var, __global const float *gamma,
                      __global const float *beta, const float eps, const float slope, __global float *out,
                      __global const float *part, const int parts, const int plen, __global float *run_mean,
                      __global float *run_var, const float momentum) {
    const int p1 = MIN(NC, (int)get_global_id(0) * planes + planes);
    for (int pl = get_global_id(0) * planes; pl < p1; pl++) {
        const int c = pl % C;
        float m, v;
        bn_channel_stats(c, pl < C, part, parts, plen, NC / C * H * W, mean, var, run_mean, run_var, momentum, &m,
                         &v);
        const float inv = rsqrt(v + eps), g = gamma[c], b = beta[c];
        PAD_PLANE(pl, BN_APPLY_ROW);
    }
}

// bn_bwd_apply_cpu into padded planes
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void bn_bwd_apply_pad_cpu(const int NC, const int planes, const int C, const int H, const int W, const int HP,
                          const int WP, const int top, const int left, __global const float *x,
                          __global const float *dy, __global const float *mean, __global const float *var,
                          __global const float *gamma, __global const float *beta, const float eps,
                          const float slope, __global const float *part, const int parts, __global float *dgamma,
                          __global float *dbeta, const int acc, __global float *out, const int batch_stats) {
    const float inv_m = 1.0f / (float)(NC / C * H * W);
    const int p1 = MIN(NC, (int)get_global_id(0) * planes + planes);
    for (int pl = get_global_id(0) * planes; pl < p1; pl++) {
        const int c = pl % C;
        const float inv = rsqrt(var[c] + eps), g = gamma[c] * inv, m = mean[c], ga = gamma[c], be = beta[c];
        float db, dg;
        bn_channel_sums(c, pl < C, part, parts, inv, dgamma, dbeta, acc, &db, &dg);
        const float k1 = batch_stats ? db * inv_m : 0.0f;
        const float k2 = batch_stats ? dg * inv * inv_m : 0.0f;
        PAD_PLANE(pl, BN_DX_ROW);
    }
}

// The backward in one launch, a work-item per channel, where a channel's x and dy fit in L2
// together (netcl.nn.norm's _CHANNEL_L2): work-item c sums dz and dz (x - mean) over its N
// planes (bn_bwd_part_cpu's float16 lanes, flushed every FLUSH vectors), writes dbeta and dgamma
// (added where acc), then dx of the same planes, x and dy read again from its L2 rather than
// beyond it, into planes (N, C, HP, WP) at row top, column left (HP = H, WP = W, top = left = 0:
// dx as it is). A launch and a read of x and dy less than bn_bwd_part_cpu + bn_bwd_apply(_pad)_cpu.
// The first pass prefetches the next image's plane line by line: a plane is one 4 KiB page or
// less at 32x32 and below, and the hardware's stream prefetchers stop at page boundaries
// (tuning.json's note on bn_bwd_channel_cpu's prefetch).
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void bn_bwd_channel_cpu(const int N, const int C, const int H, const int W, const int HP, const int WP,
                        const int top, const int left, __global const float *x, __global const float *dy,
                        __global const float *mean, __global const float *var, __global const float *gamma,
                        __global const float *beta, const float eps, const float slope, __global float *dgamma,
                        __global float *dbeta, const int acc, __global float *out, const int batch_stats) {
    const int c = get_global_id(0), HW = H * W;
    const float m = mean[c], inv = rsqrt(var[c] + eps), ga = gamma[c], be = beta[c], g = ga * inv;
    float16 b16 = 0.0f, g16 = 0.0f, rb16 = 0.0f, rg16 = 0.0f;
    float tb = 0.0f, tg = 0.0f;
    int nv = 0;
    for (int n = 0; n < N; n++) {
        __global const float *xp = x + (n * C + c) * HW, *gp = dy + (n * C + c) * HW;
        int i = 0;
        for (; i + 16 <= HW; i += 16) {
            if (n + 1 < N) PREFETCH(xp + C * HW + i), PREFETCH(gp + C * HW + i);
            const float16 xv = *(__global const ufloat16 *)(xp + i);
            const float16 d = BN_DZ(xv, *(__global const ufloat16 *)(gp + i), m, inv, ga, be, slope);
            rb16 += d;
            rg16 += d * (xv - m);
            if (++nv == FLUSH) b16 += rb16, g16 += rg16, rb16 = rg16 = 0.0f, nv = 0;
        }
        for (; i < HW; i++) {
            const float xv = xp[i], gv = gp[i], d = BN_DZ(xv, gv, m, inv, ga, be, slope);  // loads first: BN_DX_ROW
            tb += d;
            tg += d * (xv - m);
        }
    }
    rb16.s0 += tb;
    rg16.s0 += tg;
    const float db = hsum16(b16 + rb16), dg = hsum16(g16 + rg16) * inv;
    dgamma[c] = acc ? dgamma[c] + dg : dg;
    dbeta[c] = acc ? dbeta[c] + db : db;
    const float inv_m = 1.0f / (float)(N * HW);
    const float k1 = batch_stats ? db * inv_m : 0.0f, k2 = batch_stats ? dg * inv * inv_m : 0.0f;
    for (int n = 0; n < N; n++) PAD_PLANE(n * C + c, BN_DX_ROW);
}

// BatchNorm2d (+ activation) whose output fed a 2x2 stride-2 MaxPool2d run in its forward pass
// (pool_cpu.cl's bn_maxpool2_cpu): the backward takes the pool's gradient dp (N, C, OH, OW) and
// argmax, and gives each input element g = dp of its window where the argmax points there, else
// 0 (maxpool2_bwd_cpu's rule; rows and columns no window covers get 0), without storing g.
// POOL_G: gt, gb = the g of input rows top and top + 1, columns 2 * ow .. 2 * ow + 15, of 8
// windows (a macro: a function's vector out-parameters go through memory)
#define POOL_G(dp, ar, top, W, ow, gt, gb)                                                        \
    do {                                                                                        \
        const float8 gv_ = *(__global const ufloat8 *)((dp) + (ow));                            \
        const int8 a_ = *(__global const uint8v *)((ar) + (ow));                                \
        const int8 i0_ = (top) + 2 * (ow) + (int8)(0, 2, 4, 6, 8, 10, 12, 14);                  \
        gt = INTERLEAVE8(a_ == i0_ ? gv_ : 0.0f, a_ == i0_ + 1 ? gv_ : 0.0f);                    \
        gb = INTERLEAVE8(a_ == i0_ + (W) ? gv_ : 0.0f, a_ == i0_ + (W) + 1 ? gv_ : 0.0f);        \
    } while (0)

// POOL_G4: the same for 4 windows (8 columns)
#define POOL_G4(dp, ar, top, W, ow, gt, gb)                                                       \
    do {                                                                                        \
        const float4 gv_ = *(__global const ufloat4 *)((dp) + (ow));                            \
        const int4 a_ = *(__global const uint4v *)((ar) + (ow));                                \
        const int4 i0_ = (top) + 2 * (ow) + (int4)(0, 2, 4, 6);                                 \
        gt = INTERLEAVE4(a_ == i0_ ? gv_ : 0.0f, a_ == i0_ + 1 ? gv_ : 0.0f);                    \
        gb = INTERLEAVE4(a_ == i0_ + (W) ? gv_ : 0.0f, a_ == i0_ + (W) + 1 ? gv_ : 0.0f);        \
    } while (0)

// POOL_G1: the same for one window (2 columns), as float2
#define POOL_G1(dp, ar, top, W, ow, gt, gb)                                                       \
    do {                                                                                        \
        const float gv_ = (dp)[ow];                                                             \
        const int a_ = (ar)[ow], i0_ = (top) + 2 * (ow);                                        \
        gt = (float2)(a_ == i0_ ? gv_ : 0.0f, a_ == i0_ + 1 ? gv_ : 0.0f);                      \
        gb = (float2)(a_ == i0_ + (W) ? gv_ : 0.0f, a_ == i0_ + (W) + 1 ? gv_ : 0.0f);          \
    } while (0)

// The inputs of pooled row oh that no window covers (g = 0 there): the last column of the two
// rows when W is odd, and the whole third row below the last pooled row when H is odd; UNCOVERED_AT
// is the e-th one's offset from the pooled row's first input
#define UNCOVERED_N(W, H, oh, OH) (((W) & 1 ? 2 : 0) + ((oh) == (OH) - 1 && ((H) & 1) ? (W) : 0))
#define UNCOVERED_AT(e, W) ((e) < ((W) & 1 ? 2 : 0) ? (e) * (W) + (W) - 1 : 2 * (W) + (e) - ((W) & 1 ? 2 : 0))

// Stage 1: part pi of channel c walks pooled rows [pi * prow, ...) of its N * OH (each two input
// rows, and the last one the uncovered row of an odd H) and writes sum(dz), sum(dz * (x - mean)).
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void bn_pool_bwd_part_cpu(const int N, const int C, const int H, const int W, const int OH, const int OW,
                          const int prow, __global const float *x, __global const float *dp,
                          __global const int *arg, __global const float *mean, __global const float *var,
                          __global const float *gamma, __global const float *beta, const float eps,
                          const float slope, __global float *part) {
    const int pi = get_global_id(0), c = get_global_id(1), parts = get_global_size(0);
    const int r0 = pi * prow, r1 = MIN(N * OH, r0 + prow);
    const float mu = mean[c], inv = rsqrt(var[c] + eps), ga = gamma[c], be = beta[c];
    float16 b16 = 0.0f, g16 = 0.0f, rb16 = 0.0f, rg16 = 0.0f;
    float8 b8 = 0.0f, g8 = 0.0f;  // the 4-window steps' sums (one a pooled row at most)
    float tb = 0.0f, tg = 0.0f;
    int nv = 0;
    for (int r = r0; r < r1; r++) {
        const int n = r / OH, oh = r - n * OH, top = 2 * oh * W;
        __global const float *xp = x + (n * C + c) * H * W + top;
        __global const float *dpr = dp + ((n * C + c) * OH + oh) * OW;
        __global const int *ar = arg + ((n * C + c) * OH + oh) * OW;
        int ow = 0;
        for (; ow + 8 <= OW; ow += 8) {
            float16 gt, gb;
            POOL_G(dpr, ar, top, W, ow, gt, gb);
            const float16 xt = *(__global const ufloat16 *)(xp + 2 * ow), xb = *(__global const ufloat16 *)(xp + W + 2 * ow);
            const float16 dt = BN_DZ(xt, gt, mu, inv, ga, be, slope), db = BN_DZ(xb, gb, mu, inv, ga, be, slope);
            rb16 += dt + db;
            rg16 += dt * (xt - mu) + db * (xb - mu);
            if (++nv == FLUSH) b16 += rb16, g16 += rg16, rb16 = rg16 = 0.0f, nv = 0;
        }
        if (ow + 4 <= OW) {  // 4 windows more (8x8 planes have only these)
            float8 gt, gb;
            POOL_G4(dpr, ar, top, W, ow, gt, gb);
            const float8 xt = *(__global const ufloat8 *)(xp + 2 * ow), xb = *(__global const ufloat8 *)(xp + W + 2 * ow);
            const float8 dt = BN_DZ(xt, gt, mu, inv, ga, be, slope), db = BN_DZ(xb, gb, mu, inv, ga, be, slope);
            b8 += dt + db;
            g8 += dt * (xt - mu) + db * (xb - mu);
            ow += 4;
        }
        for (; ow < OW; ow++) {  // one window at a time
            float2 gt, gb;
            POOL_G1(dpr, ar, top, W, ow, gt, gb);
            const float2 xt = *(__global const ufloat2 *)(xp + 2 * ow), xb = *(__global const ufloat2 *)(xp + W + 2 * ow);
            const float2 dt = BN_DZ(xt, gt, mu, inv, ga, be, slope), db = BN_DZ(xb, gb, mu, inv, ga, be, slope);
            const float2 sb = dt + db, sg = dt * (xt - mu) + db * (xb - mu);
            tb += sb.x + sb.y;
            tg += sg.x + sg.y;
        }
        for (int e = 0; e < UNCOVERED_N(W, H, oh, OH); e++) {
            const int at = UNCOVERED_AT(e, W);
            const float xv = xp[at], d = BN_DZ(xv, 0.0f, mu, inv, ga, be, slope);
            tb += d;
            tg += d * (xv - mu);
        }
    }
    part[2 * (c * parts + pi)] = hsum16(b16 + rb16) + hsum8(b8) + tb;
    part[2 * (c * parts + pi) + 1] = hsum16(g16 + rg16) + hsum8(g8) + tg;
}

// The constants BN_DX reads for channel c in the pooled passes after stage 2 (sums: the channel's
// finished sum(dz) and sum(dz * (x - mean)); inv_m = 1 / values per channel in scope)
#define BN_POOL_DX_CONSTANTS(c)                                                                              \
    const float inv = rsqrt(var[c] + eps), g = gamma[c] * inv, m = mean[c], ga = gamma[c], be = beta[c];     \
    const float k1 = batch_stats ? sums[2 * (c)] * inv_m : 0.0f;                                             \
    const float k2 = batch_stats ? sums[2 * (c) + 1] * inv * inv_m : 0.0f

// dx of pooled row oh's inputs (its two rows, then those no window covers) from xp (the row's first
// input, rows W apart) into dxp (rows WS apart); where SUM (a constant), their sum added to s16 and
// t. top: the first input's index in its plane, as the pool's argmax counts.
#define POOL_DX_ROW(xp, dpr, ar, top, oh, dxp, WS, SUM, s16, t)                                            \
    do {                                                                                               \
        int ow_ = 0;                                                                                   \
        for (; ow_ + 8 <= OW; ow_ += 8) {                                                              \
            float16 gt_, gb_;                                                                          \
            POOL_G(dpr, ar, top, W, ow_, gt_, gb_);                                                    \
            const float16 xt_ = *(__global const ufloat16 *)((xp) + 2 * ow_);                          \
            const float16 xb_ = *(__global const ufloat16 *)((xp) + W + 2 * ow_);                      \
            const float16 dt_ = BN_DX(xt_, gt_), db_ = BN_DX(xb_, gb_);                                \
            *(__global ufloat16 *)((dxp) + 2 * ow_) = dt_;                                             \
            *(__global ufloat16 *)((dxp) + (WS) + 2 * ow_) = db_;                                      \
            if (SUM) s16 += dt_ + db_;                                                                 \
        }                                                                                              \
        if (ow_ + 4 <= OW) {                                                                           \
            float8 gt_, gb_;                                                                           \
            POOL_G4(dpr, ar, top, W, ow_, gt_, gb_);                                                   \
            const float8 xt_ = *(__global const ufloat8 *)((xp) + 2 * ow_);                            \
            const float8 xb_ = *(__global const ufloat8 *)((xp) + W + 2 * ow_);                        \
            const float8 dt_ = BN_DX(xt_, gt_), db_ = BN_DX(xb_, gb_);                                 \
            *(__global ufloat8 *)((dxp) + 2 * ow_) = dt_;                                              \
            *(__global ufloat8 *)((dxp) + (WS) + 2 * ow_) = db_;                                       \
            if (SUM) t += hsum8(dt_ + db_);                                                            \
            ow_ += 4;                                                                                  \
        }                                                                                              \
        for (; ow_ < OW; ow_++) { /* one window at a time */                                           \
            float2 gt_, gb_;                                                                           \
            POOL_G1(dpr, ar, top, W, ow_, gt_, gb_);                                                   \
            const float2 xt_ = *(__global const ufloat2 *)((xp) + 2 * ow_);                            \
            const float2 xb_ = *(__global const ufloat2 *)((xp) + W + 2 * ow_);                        \
            const float2 dt_ = BN_DX(xt_, gt_), db_ = BN_DX(xb_, gb_);                                 \
            *(__global ufloat2 *)((dxp) + 2 * ow_) = dt_;                                              \
            *(__global ufloat2 *)((dxp) + (WS) + 2 * ow_) = db_;                                       \
            if (SUM) t += dt_.x + dt_.y + db_.x + db_.y;                                               \
        }                                                                                              \
        for (int e_ = 0; e_ < UNCOVERED_N(W, H, oh, OH); e_++) {                                       \
            const int at_ = UNCOVERED_AT(e_, W);                                                       \
            const float xv_ = (xp)[at_], d_ = BN_DX(xv_, 0.0f);                                        \
            (dxp)[(at_ / W) * (WS) + at_ % W] = d_;                                                    \
            if (SUM) t += d_;                                                                          \
        }                                                                                              \
    } while (0)

// Stage 3: dx as bn_bwd_apply_cpu's, for `rows` pooled rows (of N * C * OH) per work-item.
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void bn_pool_bwd_apply_cpu(const int NCOH, const int rows, const int C, const int H, const int W, const int OH,
                           const int OW, __global const float *x, __global const float *dp, __global const int *arg,
                           __global const float *mean, __global const float *var, __global const float *gamma,
                           __global const float *beta, const float eps, const float slope,
                           __global const float *sums, __global float *dx, const int batch_stats) {
    const float inv_m = 1.0f / (float)((NCOH / OH) / C * H * W);
    const int r1 = MIN(NCOH, (int)get_global_id(0) * rows + rows);
    for (int r = get_global_id(0) * rows; r < r1; r++) {
        const int nc = r / OH, oh = r - nc * OH, top = 2 * oh * W, c = nc % C;
        BN_POOL_DX_CONSTANTS(c);
        float16 s16 = 0.0f;  // (not summed: SUM 0)
        float t = 0.0f;
        POOL_DX_ROW(x + nc * H * W + top, dp + r * OW, arg + r * OW, top, oh, dx + nc * H * W + top, W, 0, s16, t);
    }
}

// Stage 3 into the zero-bordered planes (NC, HP, WP) of the convolution before the BatchNorm, its
// output gradient at row ptop, column pleft (Conv2d.padded_grad: no copy into them after), `planes`
// planes per work-item; where has_psum, psum[plane] = the plane's sum (the convolution's bias
// gradient per image, as pad_planes_cpu sums: float16 lanes, a pooled row's added at a time).
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void bn_pool_bwd_apply_pad_cpu(const int NC, const int planes, const int C, const int H, const int W, const int OH,
                               const int OW, const int HP, const int WP, const int ptop, const int pleft,
                               __global const float *x, __global const float *dp, __global const int *arg,
                               __global const float *mean, __global const float *var, __global const float *gamma,
                               __global const float *beta, const float eps, const float slope,
                               __global const float *sums, __global float *dx, const int batch_stats,
                               __global float *psum, const int has_psum) {
    const float inv_m = 1.0f / (float)(NC / C * H * W);
    const int p1 = MIN(NC, (int)get_global_id(0) * planes + planes);
    for (int pl = get_global_id(0) * planes; pl < p1; pl++) {
        const int c = pl % C;
        BN_POOL_DX_CONSTANTS(c);
        __global float *d = dx + pl * HP * WP;
        zero_span(d, ptop * WP);
        for (int h = 0; h < H; h++) {  // the side borders of every row
            zero_span(d + (ptop + h) * WP, pleft);
            zero_span(d + (ptop + h) * WP + pleft + W, WP - pleft - W);
        }
        zero_span(d + (ptop + H) * WP, (HP - ptop - H) * WP);
        float16 s16 = 0.0f;
        float t = 0.0f;
        for (int oh = 0; oh < OH; oh++) {
            const int r = pl * OH + oh, top = 2 * oh * W;
            float16 r16 = 0.0f;
            POOL_DX_ROW(x + pl * H * W + top, dp + r * OW, arg + r * OW, top, oh, d + (ptop + 2 * oh) * WP + pleft,
                        WP, 1, r16, t);
            s16 += r16;
        }
        if (has_psum) psum[pl] = hsum16(s16) + t;
    }
}

// Stage 3 with the weight gradient of the convolution before the BatchNorm instead of dx, where
// that convolution needs no data gradient (a training step's first layer) and has few weights per
// output channel (Conv2d's "channels" mode, stride 1: FW_T = FW_C * FW_K * FW_K <= 27 taps over
// its padded input xp (N, FW_C, HP, WP)), on rows of 8 (narrower than the "rows" mode's) and an
// even H (every element in a window). The convolution's dy, this pass's dx, is made two rows at a
// time in registers and never stored; dW and db are summed as wgrad_narrow_cpu sums them, a vector
// accumulator per tap, joined into running totals every 32 pooled rows (of any images). A
// work-item per channel c and every get_global_size(0)-th after it: no partial sums, no second
// launch. gw (C, FW_T) and, has_bias, gb (C) are written, or added to where acc_w / acc_b.
#ifdef FW_C
#define FW_T (FW_C * FW_K * FW_K)
__kernel __attribute__((reqd_work_group_size(1, 1, 1))) __attribute__((min_vector_width(512)))
void bn_pool_bwd_wgrad_cpu(const int N, const int C, const int H, __global const float *x, __global const float *dp,
                           __global const int *arg, __global const float *mean, __global const float *var,
                           __global const float *gamma, __global const float *beta, const float eps,
                           const float slope, __global const float *sums, const int batch_stats,
                           __global const float *xp, const int HP, const int WP, __global float *gw,
                           __global float *gb, const int has_bias, const int acc_w, const int acc_b) {
    const int W = 8, OH = H / 2, OW = 4;
    const float inv_m = 1.0f / (float)(N * H * W);
    for (int c = get_global_id(0); c < C; c += get_global_size(0)) {
        BN_POOL_DX_CONSTANTS(c);
        float tot[FW_T + 1];
        float8 acc[FW_T + 1];
#pragma unroll
        for (int t = 0; t <= FW_T; t++) tot[t] = 0.0f, acc[t] = 0.0f;
        int rows = 0;
        for (int n = 0; n < N; n++) {
            __global const float *xr = x + (n * C + c) * H * W, *dpr = dp + (n * C + c) * OH * OW;
            __global const int *ar = arg + (n * C + c) * OH * OW;
            __global const float *xpn = xp + n * FW_C * HP * WP;
            for (int oh = 0; oh < OH; oh++) {
                const int top = 2 * oh * W;
                float8 gt, gbt;
                POOL_G4(dpr + oh * OW, ar + oh * OW, top, W, 0, gt, gbt);
                const float8 xt = *(__global const ufloat8 *)(xr + top), xb = *(__global const ufloat8 *)(xr + top + W);
                const float8 dt = BN_DX(xt, gt), db = BN_DX(xb, gbt);  // the convolution's dy, rows 2 oh, 2 oh + 1
                acc[FW_T] += dt + db;
#pragma unroll
                for (int t = 0; t < FW_T; t++) {
                    const int ci = t / (FW_K * FW_K), j = t / FW_K % FW_K, l = t % FW_K;
                    __global const float *s = xpn + (ci * HP + 2 * oh + j) * WP + l;
                    acc[t] += dt * *(__global const ufloat8 *)s;
                    acc[t] += db * *(__global const ufloat8 *)(s + WP);
                }
                if (++rows == 32 || (n == N - 1 && oh == OH - 1)) {  // the run's sums join the totals
                    rows = 0;
#pragma unroll
                    for (int t = 0; t <= FW_T; t++) {
                        tot[t] += hsum8(acc[t]);
                        acc[t] = 0.0f;
                    }
                }
            }
        }
#pragma unroll
        for (int t = 0; t < FW_T; t++) gw[c * FW_T + t] = acc_w ? gw[c * FW_T + t] + tot[t] : tot[t];
        if (has_bias) gb[c] = acc_b ? gb[c] + tot[FW_T] : tot[FW_T];
    }
}
#endif

// LayerNorm over rows of D for CPUs: norm.cl's ln_* kernels run a work-group of 64 per row (or
// column) with barriers between their sums, which PoCL dispatches at about 1.7 us a row. Here a
// work-item takes `rows` rows, each row's sums in
// 16 lanes (sum16; norm.cl splits them 64 ways), the same formulas as norm.cl.
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void ln_fwd_cpu(const int M, const int D, const int rows, __global const float *x, __global const float *gamma,
                __global const float *beta, const float eps, __global float *y, __global float *mean,
                __global float *rstd) {
    const int m1 = MIN(M, (int)(get_global_id(0) + 1) * rows);
    for (int m = get_global_id(0) * rows; m < m1; m++) {
        __global const float *xr = x + (long)m * D;
        float a[16], b[16];
#pragma unroll
        for (int i = 0; i < 16; i++) a[i] = b[i] = 0.0f;
        LANES16(d, 0, D, l, a[l] += xr[d]);
        const float mu = sum16(a) / (float)D;
        LANES16(d, 0, D, l, b[l] += (xr[d] - mu) * (xr[d] - mu));
        const float inv = rsqrt(sum16(b) / (float)D + eps);
        __global float *yr = y + (long)m * D;
        for (int d = 0; d < D; d++) yr[d] = (xr[d] - mu) * inv * gamma[d] + beta[d];
        mean[m] = mu;
        rstd[m] = inv;
    }
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * gamma (norm.cl's ln_bwd_dx)
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void ln_bwd_dx_cpu(const int M, const int D, const int rows, __global const float *x, __global const float *dy,
                   __global const float *gamma, __global const float *mean, __global const float *rstd,
                   __global float *dx) {
    const int m1 = MIN(M, (int)(get_global_id(0) + 1) * rows);
    for (int m = get_global_id(0) * rows; m < m1; m++) {
        const long base = (long)m * D;
        const float mu = mean[m], inv = rstd[m];
        float sa[16], sb[16];
#pragma unroll
        for (int i = 0; i < 16; i++) sa[i] = sb[i] = 0.0f;
        LANES16(d, 0, D, l, {
            const float g = dy[base + d] * gamma[d];
            sa[l] += g;
            sb[l] += g * (x[base + d] - mu) * inv;
        });
        const float a = sum16(sa) / (float)D, b = sum16(sb) / (float)D;
        for (int d = 0; d < D; d++) {
            const float g = dy[base + d] * gamma[d];  // its own statement: not contracted into an fma with - a
            dx[base + d] = inv * ((g - a) - (x[base + d] - mu) * inv * b);
        }
    }
}

// dgamma[d] = sum_m dy * xhat, dbeta[d] = sum_m dy (added where acc), a work-item per column, the
// rows' terms in 16 lanes
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void ln_bwd_params_cpu(const int M, const int D, __global const float *x, __global const float *dy,
                       __global const float *mean, __global const float *rstd, __global float *dgamma,
                       __global float *dbeta, const int acc) {
    const int d = get_global_id(0);
    float sg[16], sb[16];
#pragma unroll
    for (int i = 0; i < 16; i++) sg[i] = sb[i] = 0.0f;
    LANES16(m, 0, M, l, {
        const long o = (long)m * D + d;
        sg[l] += dy[o] * (x[o] - mean[m]) * rstd[m];
        sb[l] += dy[o];
    });
    const float dg = sum16(sg), db = sum16(sb);
    dgamma[d] = acc ? dgamma[d] + dg : dg;
    dbeta[d] = acc ? dbeta[d] + db : db;
}

// ops.sum_axis for CPUs: out[j] (+)= sum_i X[off + i*si + j*sj] (a Linear's bias gradient, the
// column sums of dy), a work-item per output, the terms in 16 lanes: gemm.cl's sum_axis runs a
// work-group of 64 with barriers per output, about 2 us each on PoCL
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void sum_axis_cpu(const int I, const int J, __global const float *X, const int off, const int si, const int sj,
                  __global float *out, const int accumulate) {
    const int j = get_global_id(0);
    __global const float *xj = X + off + (long)j * sj;
    float a[16];
#pragma unroll
    for (int i = 0; i < 16; i++) a[i] = 0.0f;
    LANES16(i, 0, I, l, a[l] += xj[(long)i * si]);
    const float s = sum16(a);
    out[j] = accumulate ? out[j] + s : s;
}

// Softmax over the middle axis of (outer, D, inner) on CPUs: a run of `rows` lines per work-item
// (norm.cl's softmax_fwd/bwd take a work-item a line); a contiguous line (inner 1, D >= 16) in
// float16 vectors: its max, exp (on vectors) and sums in lanes, then a scalar tail; other lines as
// norm.cl's (softmax.h)
inline float hmax16(const float16 v) {
    const float8 a = fmax(v.lo, v.hi);
    const float4 b = fmax(a.lo, a.hi);
    const float2 c = fmax(b.lo, b.hi);
    return fmax(c.x, c.y);
}

__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void softmax_fwd_cpu(const int outer, const int D, const int inner, __global const float *x, __global float *y,
                     const int total, const int rows) {
    const int g1 = MIN(total, (int)(get_global_id(0) + 1) * rows);
    for (int g = get_global_id(0) * rows; g < g1; g++) {
        const int base = (g / inner) * D * inner + g % inner;
        if (inner == 1 && D >= 16) {
            __global const float *xr = x + base;
            __global float *yr = y + base;
            float16 mv = -INFINITY;
            int d = 0;
            for (; d + 16 <= D; d += 16) mv = fmax(mv, *(__global const ufloat16 *)(xr + d));
            float m = hmax16(mv);
            for (; d < D; d++) m = fmax(m, xr[d]);
            float16 sv = 0.0f;
            for (d = 0; d + 16 <= D; d += 16) {
                const float16 e = exp(*(__global const ufloat16 *)(xr + d) - m);
                *(__global ufloat16 *)(yr + d) = e;
                sv += e;
            }
            float s = hsum16(sv);
            for (; d < D; d++) {
                const float e = exp(xr[d] - m);
                yr[d] = e;
                s += e;
            }
            const float r = 1.0f / s;
            for (d = 0; d + 16 <= D; d += 16) *(__global ufloat16 *)(yr + d) = *(__global ufloat16 *)(yr + d) * r;
            for (; d < D; d++) yr[d] *= r;
        } else {
            softmax_fwd_line(base, D, inner, x, y);
        }
    }
}

// dx = y * (dy - sum(dy * y)) * scale, lines as softmax_fwd_cpu
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void softmax_bwd_cpu(const int outer, const int D, const int inner, __global const float *y,
                     __global const float *dy, __global float *dx, const float scale, const int total,
                     const int rows) {
    const int g1 = MIN(total, (int)(get_global_id(0) + 1) * rows);
    for (int g = get_global_id(0) * rows; g < g1; g++) {
        const int base = (g / inner) * D * inner + g % inner;
        if (inner == 1 && D >= 16) {
            __global const float *yr = y + base, *gr = dy + base;
            __global float *o = dx + base;
            float16 sv = 0.0f;
            int d = 0;
            for (; d + 16 <= D; d += 16) sv += *(__global const ufloat16 *)(gr + d) * *(__global const ufloat16 *)(yr + d);
            float s = hsum16(sv);
            for (; d < D; d++) s += gr[d] * yr[d];
            for (d = 0; d + 16 <= D; d += 16)
                *(__global ufloat16 *)(o + d) = *(__global const ufloat16 *)(yr + d) * (*(__global const ufloat16 *)(gr + d) - s) * scale;
            for (; d < D; d++) o[d] = yr[d] * (gr[d] - s) * scale;
        } else {
            softmax_bwd_line(base, D, inner, y, dy, dx, scale);
        }
    }
}
