// What the fused linear family's kernels share (linear.cl, linear_cpu.cl; defines IN_F INNER RB
// LN LN_EPS): each row's first input element, and a LayerNorm's statistics of RB rows.
#ifndef NETCL_LINEAR_H
#define NETCL_LINEAR_H

// xo[rr] = the offset of row r0 + rr's element 0 (rows past the end read the last row; their
// results are dropped)
__attribute__((always_inline)) inline void row_offsets(const int r0, const int rows, size_t *xo) {
#pragma unroll
    for (int rr = 0; rr < RB; rr++) {
        const int r = min(r0 + rr, rows - 1);
        xo[rr] = (size_t)(r / INNER) * IN_F * INNER + r % INNER;
    }
}

#if LN
// mean and 1 / sqrt(variance + eps) of each row: two passes, biased variance, as PyTorch
__attribute__((always_inline)) inline void ln_stats(__global const float *x, const size_t *xo, float *mean, float *rstd) {
    for (int rr = 0; rr < RB; rr++) {
        float s = 0.0f;
        for (int k = 0; k < IN_F; k++) s += x[xo[rr] + k];
        const float m = s / IN_F;
        float v = 0.0f;
        for (int k = 0; k < IN_F; k++) {
            const float d = x[xo[rr] + k] - m;
            v += d * d;  // fused with -cl-mad-enable (linear_cpu.cl; fma() is a call there: vec_cpu.h)
        }
        mean[rr] = m;
        rstd[rr] = 1.0f / sqrt(v / IN_F + LN_EPS);
    }
}
#endif

// LIN_ROWS(r0, rows) declares a kernel's row state for rows r0 .. r0 + RB - 1 (xo, and with a
// LayerNorm mean and rstd); LIN_X(rr, k) is then row rr's input k as the Linear sees it
// (normalised, or along the inner axis). Macros over the kernel's x: one expression both kernels use.
#if LN
#define LIN_ROWS(r0, rows) size_t xo[RB]; float mean[RB], rstd[RB]; row_offsets(r0, rows, xo); ln_stats(x, xo, mean, rstd)
#define LIN_X(rr, k) ((x[xo[rr] + (k)] - mean[rr]) * rstd[rr])
#else
#define LIN_ROWS(r0, rows) size_t xo[RB]; row_offsets(r0, rows, xo)
#define LIN_X(rr, k) (x[xo[rr] + (size_t)(k) * INNER])
#endif

#endif
