// BatchNorm2d, LayerNorm and Softmax. BatchNorm works on (N, C, HW), LayerNorm on (M, D);
// reductions use one work-group of RED work-items per channel (LayerNorm: per row, per column).
#define RED 64

float group_sum(__local float *part, float v) {
    const int t = get_local_id(0);
    barrier(CLK_LOCAL_MEM_FENCE);
    part[t] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int w = RED / 2; w > 0; w >>= 1) {
        if (t < w) part[t] += part[t + w];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    return part[0];
}

// Batch statistics of channel c (two passes: mean, then variance), and the running-stat update
// with the unbiased variance, as PyTorch does.
__kernel void bn_stats(const int N, const int C, const int HW, __global const float *x,
                       __global float *mean, __global float *var, __global float *run_mean,
                       __global float *run_var, const float momentum) {
    __local float part[RED];
    const int c = get_group_id(0), t = get_local_id(0), M = N * HW;
    float s = 0.0f;
    for (int i = t; i < M; i += RED) s += x[((i / HW) * C + c) * HW + i % HW];
    const float mu = group_sum(part, s) / (float)M;
    float q = 0.0f;
    for (int i = t; i < M; i += RED) {
        const float d = x[((i / HW) * C + c) * HW + i % HW] - mu;
        q += d * d;
    }
    const float v = group_sum(part, q) / (float)M;
    if (t == 0) {
        mean[c] = mu;
        var[c] = v;
        run_mean[c] = (1.0f - momentum) * run_mean[c] + momentum * mu;
        run_var[c] = (1.0f - momentum) * run_var[c] + momentum * v * (float)M / (float)max(M - 1, 1);
    }
}

// y = (x - mean) / sqrt(var + eps) * gamma + beta (batch or running statistics)
__kernel void bn_apply(const int N, const int C, const int HW, __global const float *x,
                       __global const float *mean, __global const float *var, __global const float *gamma,
                       __global const float *beta, const float eps, __global float *y) {
    const int i = get_global_id(0);
    if (i >= N * C * HW) return;
    const int c = (i / HW) % C;
    y[i] = (x[i] - mean[c]) * rsqrt(var[c] + eps) * gamma[c] + beta[c];
}

// dgamma = sum(dy * xhat), dbeta = sum(dy) (accumulated when acc), and
// dx = gamma * invstd / M * (M * dy - dbeta - xhat * dgamma) with batch statistics, or
// dx = gamma * invstd * dy with running statistics (eval mode: they are constants)
__kernel void bn_bwd(const int N, const int C, const int HW, __global const float *x,
                     __global const float *dy, __global const float *mean, __global const float *var,
                     __global const float *gamma, const float eps, __global float *dx,
                     __global float *dgamma, __global float *dbeta, const int acc, const int batch_stats) {
    __local float part[RED];
    const int c = get_group_id(0), t = get_local_id(0), M = N * HW;
    const float mu = mean[c], inv = rsqrt(var[c] + eps);
    float sg = 0.0f, sb = 0.0f;
    for (int i = t; i < M; i += RED) {
        const int o = ((i / HW) * C + c) * HW + i % HW;
        sg += dy[o] * (x[o] - mu) * inv;
        sb += dy[o];
    }
    const float dg = group_sum(part, sg);
    const float db = group_sum(part, sb);
    const float k = gamma[c] * inv / (float)M;
    for (int i = t; i < M; i += RED) {
        const int o = ((i / HW) * C + c) * HW + i % HW;
        dx[o] = batch_stats ? k * ((float)M * dy[o] - db - (x[o] - mu) * inv * dg) : gamma[c] * inv * dy[o];
    }
    if (t == 0) {
        dgamma[c] = acc ? dgamma[c] + dg : dg;
        dbeta[c] = acc ? dbeta[c] + db : db;
    }
}

// Softmax over the middle axis of (outer, D, inner); one work-item per (outer, inner) line.
__kernel void softmax_fwd(const int outer, const int D, const int inner, __global const float *x,
                          __global float *y) {
    const int g = get_global_id(0);
    if (g >= outer * inner) return;
    const int base = (g / inner) * D * inner + g % inner;
    float m = -INFINITY;
    for (int d = 0; d < D; d++) m = fmax(m, x[base + d * inner]);
    float s = 0.0f;
    for (int d = 0; d < D; d++) {
        const float e = exp(x[base + d * inner] - m);
        y[base + d * inner] = e;
        s += e;
    }
    const float r = 1.0f / s;
    for (int d = 0; d < D; d++) y[base + d * inner] *= r;
}

// dx = y * (dy - sum(dy * y)) * scale
__kernel void softmax_bwd(const int outer, const int D, const int inner, __global const float *y,
                          __global const float *dy, __global float *dx, const float scale) {
    const int g = get_global_id(0);
    if (g >= outer * inner) return;
    const int base = (g / inner) * D * inner + g % inner;
    float s = 0.0f;
    for (int d = 0; d < D; d++) s += dy[base + d * inner] * y[base + d * inner];
    for (int d = 0; d < D; d++) {
        const int o = base + d * inner;
        dx[o] = y[o] * (dy[o] - s) * scale;
    }
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
