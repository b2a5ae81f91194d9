// MaxPool2d / AvgPool2d, forward and backward, on (N*C) planes of H x W.
// Backward passes gather over the windows that cover each input, so they need no atomics.
#include "pool.h"

__kernel void maxpool_fwd(const int NC, const int H, const int W, const int kh, const int kw, const int sh,
                          const int sw, const int ph, const int pw, const int OH, const int OW,
                          __global const float *x, __global float *y, __global int *arg) {
    const int idx = get_global_id(0);
    if (idx >= NC * OH * OW) return;
    const int ow = idx % OW, oh = (idx / OW) % OH, nc = idx / (OW * OH);
    int bi;
    const float best = window_max2(x + nc * H * W, H, W, kh, kw, sh, sw, ph, pw, oh, ow, &bi);
    y[idx] = best;
    arg[idx] = bi;
}

__kernel void maxpool_bwd(const int NC, const int H, const int W, const int kh, const int kw, const int sh,
                          const int sw, const int ph, const int pw, const int OH, const int OW,
                          __global const float *dy, __global const int *arg, __global float *dx) {
    const int idx = get_global_id(0);
    if (idx >= NC * H * W) return;
    const int iw = idx % W, ih = (idx / W) % H, nc = idx / (W * H), here = ih * W + iw;
    float acc = 0.0f;
    // output windows covering ih: oh*sh - ph <= ih <= oh*sh - ph + kh - 1 (and alike along the width)
    const int oh0 = max(0, (ih + ph - kh + sh) / sh), oh1 = min(OH - 1, (ih + ph) / sh);
    const int ow0 = max(0, (iw + pw - kw + sw) / sw), ow1 = min(OW - 1, (iw + pw) / sw);
    for (int oh = oh0; oh <= oh1; oh++)
        for (int ow = ow0; ow <= ow1; ow++) {
            const int o = (nc * OH + oh) * OW + ow;
            if (arg[o] == here) acc += dy[o];
        }
    dx[idx] = acc;
}

// count_include_pad semantics (PyTorch's default): always divide by kh*kw.
__kernel void avgpool_fwd(const int NC, const int H, const int W, const int kh, const int kw, const int sh,
                          const int sw, const int ph, const int pw, const int OH, const int OW,
                          __global const float *x, __global float *y) {
    const int idx = get_global_id(0);
    if (idx >= NC * OH * OW) return;
    const int ow = idx % OW, oh = (idx / OW) % OH, nc = idx / (OW * OH);
    __global const float *xp = x + nc * H * W;
    float acc = 0.0f;
    for (int a = 0; a < kh; a++) {
        const int ih = oh * sh - ph + a;
        if (ih < 0 || ih >= H) continue;
        for (int b = 0; b < kw; b++) {
            const int iw = ow * sw - pw + b;
            if (iw >= 0 && iw < W) acc += xp[ih * W + iw];
        }
    }
    y[idx] = acc / (float)(kh * kw);
}

__kernel void avgpool_bwd(const int NC, const int H, const int W, const int kh, const int kw, const int sh,
                          const int sw, const int ph, const int pw, const int OH, const int OW,
                          __global const float *dy, __global float *dx) {
    const int idx = get_global_id(0);
    if (idx >= NC * H * W) return;
    const int iw = idx % W, ih = (idx / W) % H, nc = idx / (W * H);
    const int oh0 = max(0, (ih + ph - kh + sh) / sh), oh1 = min(OH - 1, (ih + ph) / sh);
    const int ow0 = max(0, (iw + pw - kw + sw) / sw), ow1 = min(OW - 1, (iw + pw) / sw);
    float acc = 0.0f;
    for (int oh = oh0; oh <= oh1; oh++)
        for (int ow = ow0; ow <= ow1; ow++) acc += dy[(nc * OH + oh) * OW + ow];
    dx[idx] = acc / (float)(kh * kw);
}

// AdaptiveAvgPool (2-D, and 1-D as H = OH = 1), PyTorch's windows: output i of OH averages the
// inputs [floor(i*H/OH), ceil((i+1)*H/OH)); windows overlap or repeat when H is not a multiple.
__kernel void adaptive_avgpool_fwd(const int NC, const int H, const int W, const int OH, const int OW,
                                   __global const float *x, __global float *y) {
    const int idx = get_global_id(0);
    if (idx >= NC * OH * OW) return;
    const int ow = idx % OW, oh = (idx / OW) % OH, nc = idx / (OW * OH);
    const int h0 = oh * H / OH, h1 = ((oh + 1) * H + OH - 1) / OH;
    const int w0 = ow * W / OW, w1 = ((ow + 1) * W + OW - 1) / OW;
    __global const float *xp = x + (long)nc * H * W;
    float acc = 0.0f;
    for (int ih = h0; ih < h1; ih++)
        for (int iw = w0; iw < w1; iw++) acc += xp[ih * W + iw];
    y[idx] = acc / (float)((h1 - h0) * (w1 - w0));
}

// dx gathers dy / window size over the outputs whose windows hold the input: those o with
// floor(o*H/OH) <= ih < ceil((o+1)*H/OH), i.e. ih*OH/H <= o <= ((ih+1)*OH - 1)/H
__kernel void adaptive_avgpool_bwd(const int NC, const int H, const int W, const int OH, const int OW,
                                   __global const float *dy, __global float *dx) {
    const int idx = get_global_id(0);
    if (idx >= NC * H * W) return;
    const int iw = idx % W, ih = (idx / W) % H, nc = idx / (W * H);
    float acc = 0.0f;
    for (int oh = ih * OH / H; oh <= ((ih + 1) * OH - 1) / H; oh++) {
        const int nh = ((oh + 1) * H + OH - 1) / OH - oh * H / OH;
        for (int ow = iw * OW / W; ow <= ((iw + 1) * OW - 1) / W; ow++) {
            const int nw = ((ow + 1) * W + OW - 1) / OW - ow * W / OW;
            acc += dy[((long)nc * OH + oh) * OW + ow] / (float)(nh * nw);
        }
    }
    dx[idx] = acc;
}

// MaxPool1d / AvgPool1d on (N*C) rows of L (their own kernels: one window loop, no second axis).
// Max: padded positions never win; the first maximum (a NaN as PyTorch) is the one backward routes to.
__kernel void maxpool1d_fwd(const int NC, const int L, const int k, const int s, const int p, const int OL,
                            __global const float *x, __global float *y, __global int *arg) {
    const int idx = get_global_id(0);
    if (idx >= NC * OL) return;
    const int o = idx % OL, nc = idx / OL;
    __global const float *xr = x + (long)nc * L;
    const int i0 = max(o * s - p, 0), i1 = min(o * s - p + k, L);
    float best = xr[i0];
    int bi = i0;
    for (int i = i0 + 1; i < i1; i++) {
        const float v = xr[i];
        if (v > best || isnan(v)) { best = v; bi = i; }
    }
    y[idx] = best;
    arg[idx] = bi;
}

__kernel void maxpool1d_bwd(const int NC, const int L, const int k, const int s, const int p, const int OL,
                            __global const float *dy, __global const int *arg, __global float *dx) {
    const int idx = get_global_id(0);
    if (idx >= NC * L) return;
    const int i = idx % L, nc = idx / L;
    // windows covering i: o*s - p <= i <= o*s - p + k - 1
    const int o0 = max(0, (i + p - k + s) / s), o1 = min(OL - 1, (i + p) / s);
    float acc = 0.0f;
    for (int o = o0; o <= o1; o++)
        if (arg[nc * OL + o] == i) acc += dy[nc * OL + o];
    dx[idx] = acc;
}

// count_include_pad (PyTorch's default): always divide by k
__kernel void avgpool1d_fwd(const int NC, const int L, const int k, const int s, const int p, const int OL,
                            __global const float *x, __global float *y) {
    const int idx = get_global_id(0);
    if (idx >= NC * OL) return;
    const int o = idx % OL, nc = idx / OL;
    __global const float *xr = x + (long)nc * L;
    float acc = 0.0f;
    for (int i = max(o * s - p, 0); i < min(o * s - p + k, L); i++) acc += xr[i];
    y[idx] = acc / (float)k;
}

__kernel void avgpool1d_bwd(const int NC, const int L, const int k, const int s, const int p, const int OL,
                            __global const float *dy, __global float *dx) {
    const int idx = get_global_id(0);
    if (idx >= NC * L) return;
    const int i = idx % L, nc = idx / L;
    const int o0 = max(0, (i + p - k + s) / s), o1 = min(OL - 1, (i + p) / s);
    float acc = 0.0f;
    for (int o = o0; o <= o1; o++) acc += dy[nc * OL + o];
    dx[idx] = acc / (float)k;
}
