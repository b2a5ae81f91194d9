// One softmax line over D values `inner` apart from `base` (norm.cl's work-item per line,
// norm_cpu.cl's lines that are not contiguous): max, exp and sum, then the scale.
#ifndef NETCL_SOFTMAX_H
#define NETCL_SOFTMAX_H

inline void softmax_fwd_line(const int base, const int D, const int inner, __global const float *x,
                             __global float *y) {
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

// dx = y * (dy - sum(dy * y)) * scale along the line
inline void softmax_bwd_line(const int base, const int D, const int inner, __global const float *y,
                             __global const float *dy, __global float *dx, const float scale) {
    float s = 0.0f;
    for (int d = 0; d < D; d++) s += dy[base + d * inner] * y[base + d * inner];
    for (int d = 0; d < D; d++) {
        const int o = base + d * inner;
        dx[o] = y[o] * (dy[o] - s) * scale;
    }
}

#endif
