// Strided, batched GEMM for the training path:
//   C[b](m, n) = alpha * sum_k A[b](m, k) * B[b](k, n) + beta * C[b](m, n) + bias
// Any layout (transposes included) is a choice of strides. Each work-item computes a TM x TN
// block; out-of-range rows/columns are clamped on load and skipped on store, so the inner loop
// has no branches. bias_mode: 0 none, 1 bias[n], 2 bias[m].
#define TM 4
#define TN 4

__kernel void gemm(const int M, const int N, const int K,
                   __global const float *A, const int a_off, const int sam, const int sak, const int sab,
                   __global const float *B, const int b_off, const int sbk, const int sbn, const int sbb,
                   __global float *C, const int c_off, const int scm, const int scn, const int scb,
                   const float alpha, const float beta, __global const float *bias, const int bias_mode) {
    const int n0 = get_global_id(0) * TN, m0 = get_global_id(1) * TM, b = get_global_id(2);
    if (m0 >= M || n0 >= N) return;
    A += a_off + b * sab;
    B += b_off + b * sbb;
    C += c_off + b * scb;
    int ra[TM], cb[TN];
    for (int i = 0; i < TM; i++) ra[i] = min(m0 + i, M - 1) * sam;
    for (int j = 0; j < TN; j++) cb[j] = min(n0 + j, N - 1) * sbn;
    float acc[TM][TN];
    for (int i = 0; i < TM; i++)
        for (int j = 0; j < TN; j++) acc[i][j] = 0.0f;
    for (int k = 0; k < K; k++) {
        float a[TM], bv[TN];
        for (int i = 0; i < TM; i++) a[i] = A[ra[i] + k * sak];
        for (int j = 0; j < TN; j++) bv[j] = B[k * sbk + cb[j]];
        for (int i = 0; i < TM; i++)
            for (int j = 0; j < TN; j++) acc[i][j] = fma(a[i], bv[j], acc[i][j]);
    }
    for (int i = 0; i < TM; i++) {
        const int m = m0 + i;
        if (m >= M) break;
        for (int j = 0; j < TN; j++) {
            const int n = n0 + j;
            if (n >= N) break;
            float v = alpha * acc[i][j];
            if (bias_mode == 1) v += bias[n];
            else if (bias_mode == 2) v += bias[m];
            const int c = m * scm + n * scn;
            if (beta != 0.0f) v += beta * C[c];
            C[c] = v;
        }
    }
}

// out[j] = sum_i X[off + i*si + j*sj] (+ out[j] when accumulate): bias gradients.
// One work-group of RED threads per output j.
#define RED 64
__kernel void sum_axis(const int I, const int J, __global const float *X, const int off, const int si,
                       const int sj, __global float *out, const int accumulate) {
    __local float part[RED];
    const int j = get_group_id(0), t = get_local_id(0);
    float s = 0.0f;
    for (int i = t; i < I; i += RED) s += X[off + i * si + j * sj];
    part[t] = s;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int w = RED / 2; w > 0; w >>= 1) {
        if (t < w) part[t] += part[t + w];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (t == 0) out[j] = accumulate ? out[j] + part[0] : part[0];
}

// dst[b][j][i] = src[b][i][j] for a (B, I, J) source: layout changes (conv, attention).
// Generalised: dst index from src index by strides (d0, d1, d2) over a (B, I, J) walk.
__kernel void permute3(const int B, const int I, const int J, __global const float *src,
                       const int s0, const int s1, const int s2,
                       __global float *dst, const int d0, const int d1, const int d2, const int accumulate) {
    const int j = get_global_id(0), i = get_global_id(1), b = get_global_id(2);
    if (j >= J || i >= I) return;
    const float v = src[b * s0 + i * s1 + j * s2];
    const int o = b * d0 + i * d1 + j * d2;
    dst[o] = accumulate ? dst[o] + v : v;
}
