// im2col / col2im for the training path of Conv2d and ConvTranspose2d (square kernel k, stride s,
// padding p, dilation d). cols is (C*k*k, N*OH*OW): row r = (c, kh, kw), column q = (n, oh, ow).
// On CPUs im2col walks whole image rows per work-item: the index divisions happen once per row
// instead of once per element, and the row is read and written along w (GPU variants below;
// the CPUs' col2im is convbwd_cpu.cl's).
#include "lanes.h"

// One work-item per (cols row r, output row (n, oh)).
__kernel void im2col(const int N, const int C, const int H, const int W, const int k, const int s,
                     const int p, const int d, const int OH, const int OW, __global const float *x,
                     __global float *cols) {
    const int t = get_global_id(0), r = get_global_id(1);
    if (t >= N * OH || r >= C * k * k) return;
    const int n = t / OH, oh = t - n * OH;
    const int c = r / (k * k), kh = (r / k) % k, kw = r % k;
    const int ih = oh * s - p + kh * d;
    __global float *dst = cols + r * (N * OH * OW) + t * OW;
    if (ih < 0 || ih >= H) {
        for (int ow = 0; ow < OW; ow++) dst[ow] = 0.0f;
        return;
    }
    __global const float *src = x + ((n * C + c) * H + ih) * W;
    for (int ow = 0; ow < OW; ow++) {
        const int iw = ow * s - p + kw * d;
        dst[ow] = (iw >= 0 && iw < W) ? src[iw] : 0.0f;
    }
}

// GPU variants (device class "gpu"): one work-item per element, consecutive work-items on
// consecutive pixels, so a warp's reads and writes are contiguous (in the row walkers above its
// work-items are a row apart). The index divisions are cheap next to the memory traffic. The
// grids are 1-D: a 2-D one would put C*k*k rows on a dimension NVIDIA caps at 65535 groups.

// One work-item per element (r, q) of cols, q fastest.
__kernel void im2col_gpu(const int N, const int C, const int H, const int W, const int k, const int s,
                         const int p, const int d, const int OH, const int OW, __global const float *x,
                         __global float *cols) {
    const int P = OH * OW, NP = N * P;
    if (get_global_id(0) >= (size_t)C * k * k * NP) return;
    const int e = get_global_id(0), r = e / NP, q = e - r * NP;
    const int n = q / P, oh = (q - n * P) / OW, ow = q - n * P - oh * OW;
    const int c = r / (k * k), kh = (r / k) % k, kw = r % k;
    const int ih = oh * s - p + kh * d, iw = ow * s - p + kw * d;
    cols[e] = (ih >= 0 && ih < H && iw >= 0 && iw < W) ? x[((n * C + c) * H + ih) * W + iw] : 0.0f;
}

// dx(n, c, ih, iw) = the sum over the (kh, kw, oh, ow) that read it of dcols (+ bias[c] when
// has_bias: ConvTranspose2d's forward is this gather; no atomics), one work-item per dx
// element, iw fastest; convbwd_cpu.cl's col2im_cpu sums the same taps in the same order.
__kernel void col2im_gpu(const int N, const int C, const int H, const int W, const int k, const int s,
                         const int p, const int d, const int OH, const int OW, __global const float *dcols,
                         __global const float *bias, const int has_bias, __global float *dx) {
    if (get_global_id(0) >= (size_t)N * C * H * W) return;
    const int t = get_global_id(0), iw = t % W, row = t / W, ih = row % H, c = (row / H) % C, n = row / (H * C);
    const int NP = N * OH * OW;
    float acc = 0.0f;
    for (int kh = 0; kh < k; kh++) {
        const int th = ih + p - kh * d;
        if (th < 0 || th % s) continue;
        const int oh = th / s;
        if (oh >= OH) continue;
        __global const float *src = dcols + (c * k + kh) * k * NP + (n * OH + oh) * OW;
        for (int kw = 0; kw < k; kw++) {
            const int tw = iw + p - kw * d;
            if (tw < 0 || tw % s) continue;
            const int ow = tw / s;
            if (ow >= OW) continue;
            acc += src[kw * NP + ow];
        }
    }
    dx[t] = has_bias ? acc + bias[c] : acc;
}

// A grouped convolution's GEMMs write (OC, N*P); the layer's output is (N, OC, P), plus bias.
__kernel void cn_to_nchw(const int N, const int OC, const int P, __global const float *src,
                         __global const float *bias, const int has_bias, __global float *y) {
    const int t = get_global_id(0);
    if (t >= N * OC * P) return;
    const int q = t % P, o = (t / P) % OC, n = t / (P * OC);
    const float v = src[o * N * P + n * P + q];
    y[t] = has_bias ? v + bias[o] : v;
}

// Work-group reductions: one group of RED work-items per output value.
#define RED 64

inline float group_sum(float acc, __local float *part) {
    const int l = get_local_id(0);
    part[l] = acc;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int h = RED / 2; h > 0; h >>= 1) {
        if (l < h) part[l] += part[l + h];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    return part[0];
}

// out[c] (+)= sum over n and the P positions of x(n, c, .): the bias gradient of an (N, C, P) dy.
__kernel void channel_sum(const int N, const int C, const int P, __global const float *x,
                          __global float *out, const int accumulate) {
    __local float part[RED];
    const int c = get_group_id(0), l = get_local_id(0);
    float acc = 0.0f;
    for (int n = 0; n < N; n++) {
        __global const float *src = x + (n * C + c) * P;
        for (int i = l; i < P; i += RED) acc += src[i];
    }
    const float total = group_sum(acc, part);
    if (l == 0) out[c] = accumulate ? out[c] + total : total;
}

// Depthwise convolution (groups == C, M output channels per input channel: o = c*M + m, weight
// (C*M, 1, k, k)): direct kernels, as an im2col GEMM with K = k*k per group would be all overhead.

// Each work-item walks one image row, so the index divisions happen once per row.

// One work-item per output row (n, o, oh).
__kernel void dw_forward(const int N, const int C, const int H, const int W, const int M, const int k,
                         const int s, const int p, const int d, const int OH, const int OW,
                         __global const float *x, __global const float *w, __global const float *bias,
                         const int has_bias, __global float *y) {
    const int t = get_global_id(0);
    if (t >= N * C * M * OH) return;
    const int oh = t % OH, o = (t / OH) % (C * M), n = t / (OH * C * M);
    __global const float *src = x + (n * C + o / M) * H * W;
    __global const float *wk = w + o * k * k;
    __global float *dst = y + t * OW;
    for (int ow = 0; ow < OW; ow++) {
        float acc = 0.0f;
        for (int kh = 0; kh < k; kh++) {
            const int ih = oh * s - p + kh * d;
            if (ih < 0 || ih >= H) continue;
            for (int kw = 0; kw < k; kw++) {
                const int iw = ow * s - p + kw * d;
                if (iw >= 0 && iw < W) acc += src[ih * W + iw] * wk[kh * k + kw];
            }
        }
        dst[ow] = has_bias ? acc + bias[o] : acc;
    }
}

// One work-item per input row (n, c, ih): it scatters into its own row only, so no atomics.
__kernel void dw_backward_data(const int N, const int C, const int H, const int W, const int M, const int k,
                               const int s, const int p, const int d, const int OH, const int OW,
                               __global const float *dy, __global const float *w, __global float *dx) {
    const int t = get_global_id(0);
    if (t >= N * C * H) return;
    const int ih = t % H, c = (t / H) % C, n = t / (H * C);
    __global float *dst = dx + t * W;
    for (int iw = 0; iw < W; iw++) dst[iw] = 0.0f;
    for (int m = 0; m < M; m++) {
        const int o = c * M + m;
        for (int kh = 0; kh < k; kh++) {
            const int th = ih + p - kh * d;  // = oh * s for the output row that reads this one
            if (th < 0 || th % s || th / s >= OH) continue;
            __global const float *g = dy + ((n * C * M + o) * OH + th / s) * OW;
            for (int kw = 0; kw < k; kw++) {
                const float wv = w[(o * k + kh) * k + kw];
                for (int ow = 0; ow < OW; ow++) {
                    const int iw = ow * s - p + kw * d;
                    if (iw >= 0 && iw < W) dst[iw] += g[ow] * wv;
                }
            }
        }
    }
}

// dW(o, kh, kw) (+)= sum over (n, oh, ow) of dy(n, o, oh, ow) * x(n, o / M, ih, iw): one
// work-group per weight, its work-items over the output rows (n, oh).
__kernel void dw_backward_weight(const int N, const int C, const int H, const int W, const int M, const int k,
                                 const int s, const int p, const int d, const int OH, const int OW,
                                 __global const float *x, __global const float *dy, __global float *dw,
                                 const int accumulate) {
    __local float part[RED];
    const int g = get_group_id(0), l = get_local_id(0);
    const int o = g / (k * k), kh = (g / k) % k, kw = g % k, c = o / M;
    float acc = 0.0f;
    for (int r = l; r < N * OH; r += RED) {
        const int n = r / OH, oh = r - n * OH, ih = oh * s - p + kh * d;
        if (ih < 0 || ih >= H) continue;
        __global const float *gy = dy + ((n * C * M + o) * OH + oh) * OW;
        __global const float *src = x + ((n * C + c) * H + ih) * W;
        for (int ow = 0; ow < OW; ow++) {
            const int iw = ow * s - p + kw * d;
            if (iw >= 0 && iw < W) acc += gy[ow] * src[iw];
        }
    }
    const float total = group_sum(acc, part);
    if (l == 0) dw[g] = accumulate ? dw[g] + total : total;
}

// dw_backward_weight on CPUs: a work-item per weight, the output rows' terms in 16 lanes (one
// per row r % 16), where the GPU kernel's work-group of 64 with a barrier per weight costs PoCL
// about 2 us each
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void dw_backward_weight_cpu(const int N, const int C, const int H, const int W, const int M, const int k,
                            const int s, const int p, const int d, const int OH, const int OW,
                            __global const float *x, __global const float *dy, __global float *dw,
                            const int accumulate) {
    const int g = get_global_id(0);
    const int o = g / (k * k), kh = (g / k) % k, kw = g % k, c = o / M;
    float a[16];
    for (int i = 0; i < 16; i++) a[i] = 0.0f;
    LANES16(r, 0, N * OH, l, {
        const int n = r / OH, oh = r - n * OH, ih = oh * s - p + kh * d;
        if (ih >= 0 && ih < H) {
            __global const float *gy = dy + ((n * C * M + o) * OH + oh) * OW;
            __global const float *src = x + ((n * C + c) * H + ih) * W;
            float acc = 0.0f;
            for (int ow = 0; ow < OW; ow++) {
                const int iw = ow * s - p + kw * d;
                if (iw >= 0 && iw < W) acc += gy[ow] * src[iw];
            }
            a[l] += acc;
        }
    });
    for (int w = 8; w > 0; w /= 2)
        for (int i = 0; i < w; i++) a[i] += a[i + w];
    dw[g] = accumulate ? dw[g] + a[0] : a[0];
}
