// The max-pooling window, one definition for the layer's kernel (pool.cl) and the fused path's
// (seq.cl): the maximum of output (oh, ow)'s k x k window (stride s, padding p) of a ph x pw
// plane (not H, W: seq.cl has those as defines), in row-major order with PyTorch's rule (a later
// value wins when greater or NaN, so a NaN wins; padded positions never do); *arg = its index
// ih * pw + iw in the plane.
#ifndef NETCL_POOL_H
#define NETCL_POOL_H

inline float window_max(__global const float *xp, const int ph, const int pw, const int k, const int s,
                        const int p, const int oh, const int ow, int *arg) {
    float best = -INFINITY;
    int bi = -1;
    for (int kh = 0; kh < k; kh++) {
        const int ih = oh * s - p + kh;
        if (ih < 0 || ih >= ph) continue;
        for (int kw = 0; kw < k; kw++) {
            const int iw = ow * s - p + kw;
            if (iw < 0 || iw >= pw) continue;
            const float v = xp[ih * pw + iw];
            if (v > best || v != v || bi < 0) { best = v; bi = ih * pw + iw; }  // v != v: NaN (isnan is a call on PoCL)
        }
    }
    *arg = bi;
    return best;
}

#endif
