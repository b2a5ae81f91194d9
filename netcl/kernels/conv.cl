// im2col / col2im for the training path of Conv2d (square kernel k, stride s, padding p).
// cols is (C*k*k, N*OH*OW): row r = (c, kh, kw), column q = (n, oh, ow).
// Both walk whole image rows per work-item: the index divisions happen once per row instead of
// once per element, and the row is read and written along w.

// One work-item per (cols row r, output row (n, oh)).
__kernel void im2col(const int N, const int C, const int H, const int W, const int k, const int s,
                     const int p, const int OH, const int OW, __global const float *x, __global float *cols) {
    const int t = get_global_id(0), r = get_global_id(1);
    if (t >= N * OH || r >= C * k * k) return;
    const int n = t / OH, oh = t - n * OH;
    const int c = r / (k * k), kh = (r / k) % k, kw = r % k;
    const int ih = oh * s - p + kh;
    __global float *dst = cols + r * (N * OH * OW) + t * OW;
    if (ih < 0 || ih >= H) {
        for (int ow = 0; ow < OW; ow++) dst[ow] = 0.0f;
        return;
    }
    __global const float *src = x + ((n * C + c) * H + ih) * W;
    for (int ow = 0; ow < OW; ow++) {
        const int iw = ow * s - p + kw;
        dst[ow] = (iw >= 0 && iw < W) ? src[iw] : 0.0f;
    }
}

// dx(n, c, ih, iw) = sum over the (kh, kw, oh, ow) that read it of dcols; a gather, so no atomics.
// One work-item per input row (n, c, ih).
__kernel void col2im(const int N, const int C, const int H, const int W, const int k, const int s,
                     const int p, const int OH, const int OW, __global const float *dcols, __global float *dx) {
    const int t = get_global_id(0);
    if (t >= N * C * H) return;
    const int ih = t % H, c = (t / H) % C, n = t / (H * C);
    const int NP = N * OH * OW;
    __global float *dst = dx + t * W;
    for (int iw = 0; iw < W; iw++) {
        float acc = 0.0f;
        for (int kh = 0; kh < k; kh++) {
            const int th = ih + p - kh;
            if (th < 0 || th % s) continue;
            const int oh = th / s;
            if (oh >= OH) continue;
            __global const float *src = dcols + (c * k + kh) * k * NP + (n * OH + oh) * OW;
            for (int kw = 0; kw < k; kw++) {
                const int tw = iw + p - kw;
                if (tw < 0 || tw % s) continue;
                const int ow = tw / s;
                if (ow >= OW) continue;
                acc += src[kw * NP + ow];
            }
        }
        dst[iw] = acc;
    }
}
