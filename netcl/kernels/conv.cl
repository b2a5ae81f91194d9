// im2col / col2im for the training path of Conv2d (square kernel k, stride s, padding p).
// cols is (C*k*k, N*OH*OW): row r = (c, kh, kw), column q = (n, oh, ow).

__kernel void im2col(const int N, const int C, const int H, const int W, const int k, const int s,
                     const int p, const int OH, const int OW, __global const float *x, __global float *cols) {
    const int q = get_global_id(0), r = get_global_id(1);
    const int P = OH * OW, NP = N * P;
    if (q >= NP || r >= C * k * k) return;
    const int n = q / P, oh = (q % P) / OW, ow = q % OW;
    const int c = r / (k * k), kh = (r / k) % k, kw = r % k;
    const int ih = oh * s - p + kh, iw = ow * s - p + kw;
    float v = 0.0f;
    if (ih >= 0 && ih < H && iw >= 0 && iw < W) v = x[((n * C + c) * H + ih) * W + iw];
    cols[r * NP + q] = v;
}

// dx(n, c, ih, iw) = sum over the (kh, kw, oh, ow) that read it of dcols; a gather, so no atomics.
__kernel void col2im(const int N, const int C, const int H, const int W, const int k, const int s,
                     const int p, const int OH, const int OW, __global const float *dcols, __global float *dx) {
    const int idx = get_global_id(0);
    if (idx >= N * C * H * W) return;
    const int iw = idx % W, ih = (idx / W) % H, c = (idx / (W * H)) % C, n = idx / (W * H * C);
    const int NP = N * OH * OW;
    float acc = 0.0f;
    for (int kh = 0; kh < k; kh++) {
        const int th = ih + p - kh;
        if (th < 0 || th % s) continue;
        const int oh = th / s;
        if (oh >= OH) continue;
        for (int kw = 0; kw < k; kw++) {
            const int tw = iw + p - kw;
            if (tw < 0 || tw % s) continue;
            const int ow = tw / s;
            if (ow >= OW) continue;
            acc += dcols[((c * k + kh) * k + kw) * NP + (n * OH + oh) * OW + ow];
        }
    }
    dx[idx] = acc;
}
