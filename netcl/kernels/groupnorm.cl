// GroupNorm on x (N, C, S) seen as N*G rows of D = C/G * S values each (a row is one image's group of
// channels, contiguous): a work-item per row for the statistics and dx, a work-item per channel for
// the affine parameters' gradients. Every sum runs in one work-item in a fixed order: deterministic.
// Channel of a row's value d: g * (C / G) + d / S.

// y = (x - mean) * rstd * w[c] + b[c] (w, b unused when affine is 0); mean, rstd saved per row
__kernel void gn_fwd(const int R, const int D, const int S, const int G, const int Cg, __global const float *x,
                     __global const float *w, __global const float *b, const int affine, const float eps,
                     __global float *y, __global float *mean, __global float *rstd) {
    const int r = get_global_id(0);
    if (r >= R) return;
    __global const float *xr = x + (long)r * D;
    float s = 0.0f;
    for (int d = 0; d < D; d++) s += xr[d];
    const float mu = s / (float)D;
    float v = 0.0f;
    for (int d = 0; d < D; d++) v += (xr[d] - mu) * (xr[d] - mu);
    const float inv = rsqrt(v / (float)D + eps);
    __global float *yr = y + (long)r * D;
    const int c0 = (r % G) * Cg;
    for (int d = 0; d < D; d++) {
        const float xh = (xr[d] - mu) * inv;
        const int c = c0 + d / S;
        yr[d] = affine ? xh * w[c] + b[c] : xh;
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
    for (int d = 0; d < D; d++) {
        const float g = affine ? dy[base + d] * w[c0 + d / S] : dy[base + d];
        sa += g;
        sb += g * (x[base + d] - mu) * inv;
    }
    const float a = sa / (float)D, bm = sb / (float)D;
    for (int d = 0; d < D; d++) {
        const float g = affine ? dy[base + d] * w[c0 + d / S] : dy[base + d];
        dx[base + d] = inv * ((g - a) - (x[base + d] - mu) * inv * bm);
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
        for (int s = 0; s < S; s++) {
            sw += dy[base + s] * (x[base + s] - mu) * inv;
            sb += dy[base + s];
        }
    }
    dw[c] = acc ? dw[c] + sw : sw;
    db[c] = acc ? db[c] + sb : sb;
}
