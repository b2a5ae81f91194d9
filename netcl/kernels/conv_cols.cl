// The column route of convolutions of any geometry (Conv1d below depthwise, and Conv2d where its
// kernel, stride, padding or dilation differ between height and width, or padding="same"): im2col
// into (C*KH*KW, N*OH*OW) columns, a GEMM per group (ops.gemm), the product back into (N, K, OH, OW),
// and the data gradient gathered back from the columns' gradient (col2im: no atomics, deterministic).
// A transposed convolution is the data gradient of the convolution it transposes: its forward is
// the GEMM and col2im, its input gradient im2col and the GEMM.
// Conv1d is the case H = KH = sh = dh = 1, ph = 0. ph and pw are the top and left padding; the
// caller sizes OH and OW, so padding="same"'s extra bottom row and right column need nothing here.

#include "act.h"

// cols[(c*KH + a)*KW + b, n*OH*OW + oy*OW + ox] = x[n, c, oy*sh - ph + a*dh, ox*sw - pw + b*dw], zero outside
__kernel void cols_im2col(const int N, const int C, const int H, const int W, const int OH, const int OW,
                          const int KH, const int KW, const int sh, const int sw, const int ph, const int pw,
                          const int dh, const int dw, __global const float *x, __global float *cols) {
    const int idx = get_global_id(0);
    const int P = OH * OW, NP = N * P;
    if (idx >= C * KH * KW * NP) return;
    const int col = idx % NP, r = idx / NP;
    const int p = col % P, n = col / P, ox = p % OW, oy = p / OW;
    const int b = r % KW, a = (r / KW) % KH, c = r / (KW * KH);
    const int iy = oy * sh - ph + a * dh, ix = ox * sw - pw + b * dw;
    cols[idx] = (iy >= 0 && iy < H && ix >= 0 && ix < W) ? x[(((long)n * C + c) * H + iy) * W + ix] : 0.0f;
}

// dx[n, c, iy, ix] = sum over the taps (a, b) and outputs (oy, ox) that read it of dcols (a gather)
// (+ b[c]: a transposed convolution's bias, its forward being this gather)
__kernel void cols_col2im(const int N, const int C, const int H, const int W, const int OH, const int OW,
                          const int KH, const int KW, const int sh, const int sw, const int ph, const int pw,
                          const int dh, const int dw, __global const float *dcols, const int has_bias,
                          __global const float *b, __global float *dx) {
    const int idx = get_global_id(0);
    if (idx >= N * C * H * W) return;
    const int ix = idx % W, iy = (idx / W) % H, c = (idx / (W * H)) % C, n = idx / (W * H * C);
    const long P = (long)OH * OW, NP = (long)N * P;
    float acc = has_bias ? b[c] : 0.0f;
    for (int a = 0; a < KH; a++) {
        const int ty = iy + ph - a * dh;  // = oy * sh
        if (ty < 0 || ty % sh) continue;
        const int oy = ty / sh;
        if (oy >= OH) continue;
        for (int b = 0; b < KW; b++) {
            const int tx = ix + pw - b * dw;  // = ox * sw
            if (tx < 0 || tx % sw) continue;
            const int ox = tx / sw;
            if (ox < OW) acc += dcols[((long)(c * KH + a) * KW + b) * NP + n * P + (long)oy * OW + ox];
        }
    }
    dx[idx] = acc;
}

// CPU-class variants: a work-item per row of OW columns (im2col) or of W inputs (col2im), so that
// the index divisions come once a row, not once a value (per value they cost more than the copy).
// cols_im2col_rows: row (c, a, b) of cols at image n, output row oy
__kernel void cols_im2col_rows(const int N, const int C, const int H, const int W, const int OH, const int OW,
                               const int KH, const int KW, const int sh, const int sw, const int ph, const int pw,
                               const int dh, const int dw, __global const float *x, __global float *cols) {
    const int idx = get_global_id(0);
    if (idx >= C * KH * KW * N * OH) return;
    const int oy = idx % OH, n = (idx / OH) % N, r = idx / (OH * N);
    const int b = r % KW, a = (r / KW) % KH, c = r / (KW * KH);
    const int iy = oy * sh - ph + a * dh, x0 = b * dw - pw;
    __global float *out = cols + (long)r * N * OH * OW + ((long)n * OH + oy) * OW;
    if (iy < 0 || iy >= H) {
        for (int ox = 0; ox < OW; ox++) out[ox] = 0.0f;
        return;
    }
    __global const float *xr = x + (((long)n * C + c) * H + iy) * W;
    for (int ox = 0; ox < OW; ox++) {
        const int ix = ox * sw + x0;
        out[ox] = (ix >= 0 && ix < W) ? xr[ix] : 0.0f;
    }
}

// cols_col2im_rows: dx's row (n, c, iy), its sums in cols_col2im's order (taps a, then b)
__kernel void cols_col2im_rows(const int N, const int C, const int H, const int W, const int OH, const int OW,
                               const int KH, const int KW, const int sh, const int sw, const int ph, const int pw,
                               const int dh, const int dw, __global const float *dcols, const int has_bias,
                               __global const float *b, __global float *dx) {
    const int idx = get_global_id(0);
    if (idx >= N * C * H) return;
    const int iy = idx % H, c = (idx / H) % C, n = idx / (H * C);
    const long P = (long)OH * OW, NP = (long)N * P;
    __global float *out = dx + (long)idx * W;
    const float b0 = has_bias ? b[c] : 0.0f;
    for (int ix = 0; ix < W; ix++) out[ix] = b0;
    for (int a = 0; a < KH; a++) {
        const int ty = iy + ph - a * dh;  // = oy * sh
        if (ty < 0 || ty % sh) continue;
        const int oy = ty / sh;
        if (oy >= OH) continue;
        for (int k = 0; k < KW; k++) {  // output ox reads input ox*sw + k*dw - pw: each ix from one ox
            __global const float *row = dcols + ((long)(c * KH + a) * KW + k) * NP + n * P + (long)oy * OW;
            const int x0 = k * dw - pw;
            for (int ox = max(0, (-x0 + sw - 1) / sw); ox < OW; ox++) {
                const int ix = ox * sw + x0;
                if (ix >= W) break;
                out[ix] += row[ox];
            }
        }
    }
}

// y[n, k, p] = rows[k, n*P + p] (+ b[k]): the GEMM's (K, N*P) product in PyTorch's layout
__kernel void cols_rows_out(const int N, const int K, const int P, const int has_bias,
                            __global const float *rows, __global const float *b, __global float *y) {
    const int idx = get_global_id(0);
    if (idx >= N * K * P) return;
    const int p = idx % P, k = (idx / P) % K, n = idx / (P * K);
    y[idx] = rows[((long)k * N + n) * P + p] + (has_bias ? b[k] : 0.0f);
}

// y[n, k, p] = act(rows[k, n*P + p] + b[k]): the fused plan's one epilogue of a column-route conv,
// a BatchNorm after it folded into W and b (netcl.jit.cols); `act` is a netcl.act.Act code
__kernel void cols_rows_out_act(const int N, const int K, const int P, __global const float *rows,
                                __global const float *b, const int act, const float slope, __global float *y) {
    const int idx = get_global_id(0);
    if (idx >= N * K * P) return;
    const int p = idx % P, k = (idx / P) % K, n = idx / (P * K);
    const float v = rows[((long)k * N + n) * P + p] + b[k];
    y[idx] = ACT_APPLY(act, v, slope);
}

// rows[k, n*P + p] = dy[n, k, p]
__kernel void cols_rows_in(const int N, const int K, const int P, __global const float *dy, __global float *rows) {
    const int idx = get_global_id(0);
    if (idx >= N * K * P) return;
    const int p = idx % P, n = (idx / P) % N, k = idx / (P * N);
    rows[idx] = dy[((long)n * K + k) * P + p];
}
