// BatchNorm2d, LayerNorm and Softmax. BatchNorm works on (N, C, HW) in deterministic stages
// (fixed reduction orders): a channel's M = N * HW values, in (n, hw) order, form parts of `len`
// values; one work-group of RED work-items per (part, channel) writes a partial result, then one
// work-group per channel combines its parts (many work-groups even for 16 channels of 2M values:
// a GPU needs thousands; Python picks `len` per device class). LayerNorm works on (M, D): one
// work-group per row, and per column for the parameter gradients. bn_apply, bn_bwd_part and
// bn_bwd_apply are built per activation (bn_act.h): training fuses BatchNorm2d with the
// activation after it.
#include "act.h"
#include "bn_act.h"
#include "softmax.h"
#define RED 64
#include "group_sum.h"

// Offset in (N, C, HW) of value j of channel c; *hw is its position in the row.
inline int bn_offset(const int j, const int c, const int C, const int HW, int *hw) {
    const int n = j / HW;
    *hw = j - n * HW;
    return (n * C + c) * HW + *hw;
}

// The offset RED values further along the channel: a division only where a row ends.
inline int bn_step(int o, int *hw, const int C, const int HW) {
    *hw += RED;
    o += RED;
    if (*hw >= HW) {
        const int rows = *hw / HW;
        *hw -= rows * HW;
        o += rows * (C - 1) * HW;
    }
    return o;
}

// Batch statistics, stage 1: part p of channel c writes its sum and its sum of squared
// deviations from its own mean (two passes over the part, the second from cache, corrected by
// the deviations' sum): accurate whatever the data's offset.
__kernel void bn_stats_part(const int N, const int C, const int HW, const int len, __global const float *x,
                            __global float *part) {
    __local float red[RED];
    const int p = get_group_id(0), c = get_group_id(1), t = get_local_id(0), parts = get_num_groups(0);
    const int j0 = p * len + t, j1 = min(N * HW, (p + 1) * len);
    const float cnt = (float)(j1 - p * len);
    int hw, o = bn_offset(j0, c, C, HW, &hw);
    const int o0 = o, hw0 = hw;
    float s = 0.0f;
    for (int j = j0; j < j1; j += RED, o = bn_step(o, &hw, C, HW)) s += x[o];
    s = group_sum(red, s);
    const float mu = s / cnt;
    float d1 = 0.0f, d2 = 0.0f;
    o = o0;
    hw = hw0;
    for (int j = j0; j < j1; j += RED, o = bn_step(o, &hw, C, HW)) {
        const float d = x[o] - mu;
        d1 += d;
        d2 += d * d;
    }
    const float sd = group_sum(red, d1), sq = group_sum(red, d2);
    if (t == 0) {
        part[2 * (c * parts + p)] = s;
        part[2 * (c * parts + p) + 1] = sq - sd * sd / cnt;
    }
}

// Batch statistics, stage 2, one work-group per channel: the mean from the parts' sums, then
// the variance as the parts' own squared deviations plus their means' (the two-pass formula
// over parts; each work-item a strided subset in order, then a fixed tree), every work-item
// of the group getting both. The running statistics are updated with the unbiased variance, as
// PyTorch does.
inline void bn_stats_of(__local float *red, __global const float *pc, const int parts, const int len,
                        const int M, float *mean, float *var) {
    const int t = get_local_id(0);
    float s = 0.0f;
    for (int p = t; p < parts; p += RED) s += pc[2 * p];
    const float mu = group_sum(red, s) / (float)M;
    float q = 0.0f;
    for (int p = t; p < parts; p += RED) {
        const float n = (float)min(len, M - p * len), d = pc[2 * p] / n - mu;
        q += pc[2 * p + 1] + n * d * d;
    }
    *mean = mu;
    *var = group_sum(red, q) / (float)M;
}

// ... and the channel's batch statistics out, the running ones updated (one work-item).
inline void bn_stats_out(const int c, const int M, const float mu, const float v, __global float *mean,
                         __global float *var, __global float *run_mean, __global float *run_var,
                         const float momentum) {
    mean[c] = mu;
    var[c] = v;
    run_mean[c] = (1.0f - momentum) * run_mean[c] + momentum * mu;
    run_var[c] = (1.0f - momentum) * run_var[c] + momentum * v * (float)M / (float)max(M - 1, 1);
}

__kernel void bn_stats_finish(const int N, const int HW, const int len, const int parts,
                              __global const float *part, __global float *mean, __global float *var,
                              __global float *run_mean, __global float *run_var, const float momentum) {
    __local float red[RED];
    const int c = get_group_id(0), M = N * HW;
    float mu, v;
    bn_stats_of(red, part + 2 * c * parts, parts, len, M, &mu, &v);
    if (get_local_id(0) == 0) bn_stats_out(c, M, mu, v, mean, var, run_mean, run_var, momentum);
}

// Stage 2 and the element-wise pass in one launch (training on GPUs: a launch less per layer):
// work-group (k, c) combines channel c's parts exactly as bn_stats_finish does (group 0 also
// writes the statistics out), then writes y = act(z) for part k of the channel, as bn_apply.
__kernel void bn_apply_batch(const int N, const int C, const int HW, const int len, const int parts,
                             __global const float *part, __global const float *x, __global float *mean,
                             __global float *var, __global float *run_mean, __global float *run_var,
                             const float momentum, __global const float *gamma, __global const float *beta,
                             const float eps, const float slope, __global float *y) {
    __local float red[RED];
    const int k = get_group_id(0), c = get_group_id(1), t = get_local_id(0), M = N * HW;
    float mu, v;
    bn_stats_of(red, part + 2 * c * parts, parts, len, M, &mu, &v);
    if (k == 0 && t == 0) bn_stats_out(c, M, mu, v, mean, var, run_mean, run_var, momentum);
    const float inv = rsqrt(v + eps), ga = gamma[c], be = beta[c];
    const int j0 = k * len + t, j1 = min(M, (k + 1) * len);
    int hw, o = bn_offset(j0, c, C, HW, &hw);
    for (int j = j0; j < j1; j += RED, o = bn_step(o, &hw, C, HW))
        y[o] = ACT_APPLY(ACT_KIND, BN_Z(x[o], mu, inv, ga, be), slope);
}

// y = act((x - mean) / sqrt(var + eps) * gamma + beta) (batch or running statistics)
__kernel void bn_apply(const int N, const int C, const int HW, __global const float *x,
                       __global const float *mean, __global const float *var, __global const float *gamma,
                       __global const float *beta, const float eps, const float slope, __global float *y) {
    const int i = get_global_id(0);
    if (i >= N * C * HW) return;
    const int c = (i / HW) % C;
    y[i] = ACT_APPLY(ACT_KIND, BN_Z(x[i], mean[c], rsqrt(var[c] + eps), gamma[c], beta[c]), slope);
}

// Backward, stage 1: part p of channel c writes sum(dz) and sum(dz * (x - mean)), dz = dy
// through the fused activation (BN_DZ).
__kernel void bn_bwd_part(const int N, const int C, const int HW, const int len, __global const float *x,
                          __global const float *dy, __global const float *mean, __global const float *var,
                          __global const float *gamma, __global const float *beta, const float eps,
                          const float slope, __global float *part) {
    __local float red[RED];
    const int p = get_group_id(0), c = get_group_id(1), t = get_local_id(0), parts = get_num_groups(0);
    const int j0 = p * len + t, j1 = min(N * HW, (p + 1) * len);
    const float mu = mean[c], inv = rsqrt(var[c] + eps), ga = gamma[c], be = beta[c];
    int hw, o = bn_offset(j0, c, C, HW, &hw);
    float sb = 0.0f, sg = 0.0f;
    for (int j = j0; j < j1; j += RED, o = bn_step(o, &hw, C, HW)) {
        const float g = BN_DZ(x[o], dy[o], mu, inv, ga, be, slope);
        sb += g;
        sg += g * (x[o] - mu);
    }
    sb = group_sum(red, sb);
    sg = group_sum(red, sg);
    if (t == 0) {
        part[2 * (c * parts + p)] = sb;
        part[2 * (c * parts + p) + 1] = sg;
    }
}

// Backward, stage 2: one work-group per channel sums the parts in a fixed order into
// dbeta = sum(dy) and dgamma = sum(dy * xhat) (accumulated into the gradients when acc), and
// keeps both in sums[c] for bn_bwd_apply; every work-item of the group gets both.
inline void bn_bwd_sums_of(__local float *red, __global const float *pc, const int parts, const float inv,
                           float *db, float *dg) {
    const int t = get_local_id(0);
    float sb = 0.0f, sg = 0.0f;
    for (int p = t; p < parts; p += RED) {
        sb += pc[2 * p];
        sg += pc[2 * p + 1];
    }
    *db = group_sum(red, sb);
    *dg = group_sum(red, sg) * inv;
}

__kernel void bn_bwd_finish(const int parts, __global const float *part, __global const float *var,
                            const float eps, __global float *dgamma, __global float *dbeta, const int acc,
                            __global float *sums) {
    __local float red[RED];
    const int c = get_group_id(0);
    float db, dg;
    bn_bwd_sums_of(red, part + 2 * c * parts, parts, rsqrt(var[c] + eps), &db, &dg);
    if (get_local_id(0) == 0) {
        dgamma[c] = acc ? dgamma[c] + dg : dg;
        dbeta[c] = acc ? dbeta[c] + db : db;
        sums[2 * c] = db;
        sums[2 * c + 1] = dg;
    }
}

// Stages 2 and 3 in one launch with batch statistics (training on GPUs): work-group (k, c)
// sums channel c's parts exactly as bn_bwd_finish does (group 0 also writes the parameter
// gradients), then writes dx for part k of the channel, as bn_bwd_apply does.
__kernel void bn_bwd_apply_batch(const int N, const int C, const int HW, const int len, const int parts,
                                 __global const float *part, __global const float *x, __global const float *dy,
                                 __global const float *mean, __global const float *var,
                                 __global const float *gamma, __global const float *beta, const float eps,
                                 const float slope, __global float *dgamma, __global float *dbeta, const int acc,
                                 __global float *dx) {
    __local float red[RED];
    const int k = get_group_id(0), c = get_group_id(1), t = get_local_id(0), M = N * HW;
    const float inv = rsqrt(var[c] + eps);
    float db, dg;
    bn_bwd_sums_of(red, part + 2 * c * parts, parts, inv, &db, &dg);
    if (k == 0 && t == 0) {
        dgamma[c] = acc ? dgamma[c] + dg : dg;
        dbeta[c] = acc ? dbeta[c] + db : db;
    }
    const float mu = mean[c], ga = gamma[c], be = beta[c], g = ga * inv;
    const int j0 = k * len + t, j1 = min(M, (k + 1) * len);
    int hw, o = bn_offset(j0, c, C, HW, &hw);
    for (int j = j0; j < j1; j += RED, o = bn_step(o, &hw, C, HW)) {
        const float dz = BN_DZ(x[o], dy[o], mu, inv, ga, be, slope);
        dx[o] = g / (float)M * ((float)M * dz - db - (x[o] - mu) * inv * dg);
    }
}

// Backward, stage 3, element-wise: dx = gamma * invstd / M * (M * dz - dbeta - xhat * dgamma)
// with batch statistics, or dx = gamma * invstd * dz with running statistics (eval mode: they
// are constants); dz = dy through the fused activation (BN_DZ).
__kernel void bn_bwd_apply(const int N, const int C, const int HW, __global const float *x,
                           __global const float *dy, __global const float *mean, __global const float *var,
                           __global const float *gamma, __global const float *beta, const float eps,
                           const float slope, __global const float *sums, __global float *dx,
                           const int batch_stats) {
    const int i = get_global_id(0);
    if (i >= N * C * HW) return;
    const int c = (i / HW) % C, M = N * HW;
    const float inv = rsqrt(var[c] + eps), g = gamma[c] * inv;
    const float dz = BN_DZ(x[i], dy[i], mean[c], inv, gamma[c], beta[c], slope);
    dx[i] = batch_stats ? g / (float)M * ((float)M * dz - sums[2 * c] - (x[i] - mean[c]) * inv * sums[2 * c + 1])
                        : g * dz;
}

// Softmax over the middle axis of (outer, D, inner); one work-item per (outer, inner) line.
__kernel void softmax_fwd(const int outer, const int D, const int inner, __global const float *x,
                          __global float *y) {
    const int g = get_global_id(0);
    if (g < outer * inner) softmax_fwd_line((g / inner) * D * inner + g % inner, D, inner, x, y);
}

// dx = y * (dy - sum(dy * y)) * scale
__kernel void softmax_bwd(const int outer, const int D, const int inner, __global const float *y,
                          __global const float *dy, __global float *dx, const float scale) {
    const int g = get_global_id(0);
    if (g < outer * inner) softmax_bwd_line((g / inner) * D * inner + g % inner, D, inner, y, dy, dx, scale);
}

// LayerNorm over the last axis of (M, D): one work-group of RED work-items per row (two passes,
// as bn_stats); mean and rstd = 1/sqrt(var + eps) are kept for the backward.
__kernel void ln_fwd(const int M, const int D, __global const float *x, __global const float *gamma,
                     __global const float *beta, const float eps, __global float *y, __global float *mean,
                     __global float *rstd) {
    __local float part[RED];
    const int m = get_group_id(0), t = get_local_id(0);
    __global const float *xr = x + (long)m * D;
    float s = 0.0f;
    for (int d = t; d < D; d += RED) s += xr[d];
    const float mu = group_sum(part, s) / (float)D;
    float q = 0.0f;
    for (int d = t; d < D; d += RED) q += (xr[d] - mu) * (xr[d] - mu);
    const float inv = rsqrt(group_sum(part, q) / (float)D + eps);
    for (int d = t; d < D; d += RED) y[(long)m * D + d] = (xr[d] - mu) * inv * gamma[d] + beta[d];
    if (t == 0) {
        mean[m] = mu;
        rstd[m] = inv;
    }
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * gamma, one work-group per row
__kernel void ln_bwd_dx(const int M, const int D, __global const float *x, __global const float *dy,
                        __global const float *gamma, __global const float *mean, __global const float *rstd,
                        __global float *dx) {
    __local float part[RED];
    const int m = get_group_id(0), t = get_local_id(0);
    const long base = (long)m * D;
    const float mu = mean[m], inv = rstd[m];
    float sa = 0.0f, sb = 0.0f;
    for (int d = t; d < D; d += RED) {
        const float g = dy[base + d] * gamma[d];
        sa += g;
        sb += g * (x[base + d] - mu) * inv;
    }
    const float a = group_sum(part, sa) / (float)D;
    const float b = group_sum(part, sb) / (float)D;
    for (int d = t; d < D; d += RED) {
        const float g = dy[base + d] * gamma[d];  // its own statement: not contracted into an fma with - a
        dx[base + d] = inv * ((g - a) - (x[base + d] - mu) * inv * b);
    }
}

// dgamma[d] = sum_m dy * xhat, dbeta[d] = sum_m dy (accumulated when acc), one work-group per column
__kernel void ln_bwd_params(const int M, const int D, __global const float *x, __global const float *dy,
                            __global const float *mean, __global const float *rstd, __global float *dgamma,
                            __global float *dbeta, const int acc) {
    __local float part[RED];
    const int d = get_group_id(0), t = get_local_id(0);
    float sg = 0.0f, sb = 0.0f;
    for (int m = t; m < M; m += RED) {
        const long o = (long)m * D + d;
        sg += dy[o] * (x[o] - mean[m]) * rstd[m];
        sb += dy[o];
    }
    const float dg = group_sum(part, sg);
    const float db = group_sum(part, sb);
    if (t == 0) {
        dgamma[d] = acc ? dgamma[d] + dg : dg;
        dbeta[d] = acc ? dbeta[d] + db : db;
    }
}
