// The max-pooling window, one definition for the layer's kernel (pool.cl) and the fused path's
// (seq.cl): the maximum of output (oh, ow)'s kh x kw window (strides sh, sw, padding top pt and
// left pl) of a ph x pw plane (not H, W: seq.cl has those as defines), in row-major order with
// PyTorch's rule (a later value wins when greater or NaN, so a NaN wins; padded positions never
// do); *arg = its index ih * pw + iw in the plane. window_max: the square, symmetric case.
#ifndef NETCL_POOL_H
#define NETCL_POOL_H

inline float window_max2(__global const float *xp, const int ph, const int pw, const int kh, const int kw,
                         const int sh, const int sw, const int pt, const int pl, const int oh, const int ow,
                         int *arg) {
    float best = -INFINITY;
    int bi = -1;
    for (int a = 0; a < kh; a++) {
        const int ih = oh * sh - pt + a;
        if (ih < 0 || ih >= ph) continue;
        for (int b = 0; b < kw; b++) {
            const int iw = ow * sw - pl + b;
            if (iw < 0 || iw >= pw) continue;
            const float v = xp[ih * pw + iw];
            if (v > best || v != v || bi < 0) { best = v; bi = ih * pw + iw; }  // v != v: NaN (isnan is a call on PoCL)
        }
    }
    *arg = bi;
    return best;
}

inline float window_max(__global const float *xp, const int ph, const int pw, const int k, const int s,
                        const int p, const int oh, const int ow, int *arg) {
    return window_max2(xp, ph, pw, k, k, s, s, p, p, oh, ow, arg);
}

#endif
