// Conv1d on (N, C, L), forward and backward, one work-item per output element (simple and
// deterministic: every gradient is a gather over what it sums, no atomics). pad is the left
// padding; the caller sizes OL, so padding="same"'s extra right column needs nothing here.
// weight (K, C/G, KS); groups G: output channel k reads input channels [g*C/G, (g+1)*C/G), g = k / (K/G).

// y[n, k, o] = b[k] + sum_{c, j} x[n, g*CG + c, o*s - pad + j*d] * w[k, c, j]
__kernel void conv1d_fwd(const int N, const int C, const int L, const int K, const int OL, const int KS,
                         const int s, const int pad, const int d, const int G, const int has_bias,
                         __global const float *x, __global const float *w, __global const float *b,
                         __global float *y) {
    const int idx = get_global_id(0);
    if (idx >= N * K * OL) return;
    const int o = idx % OL, k = (idx / OL) % K, n = idx / (OL * K);
    const int CG = C / G, g = k / (K / G);
    float acc = has_bias ? b[k] : 0.0f;
    for (int c = 0; c < CG; c++) {
        __global const float *xr = x + ((long)n * C + g * CG + c) * L;
        __global const float *wr = w + ((long)k * CG + c) * KS;
        for (int j = 0; j < KS; j++) {
            const int i = o * s - pad + j * d;
            if (i >= 0 && i < L) acc += xr[i] * wr[j];
        }
    }
    y[idx] = acc;
}

// dx[n, c, i] = sum over (k in c's group, j) with i = o*s - pad + j*d for a valid o of dy[n, k, o] * w[k, c', j]
__kernel void conv1d_bwd_data(const int N, const int C, const int L, const int K, const int OL, const int KS,
                              const int s, const int pad, const int d, const int G,
                              __global const float *dy, __global const float *w, __global float *dx) {
    const int idx = get_global_id(0);
    if (idx >= N * C * L) return;
    const int i = idx % L, c = (idx / L) % C, n = idx / (L * C);
    const int CG = C / G, KG = K / G, g = c / CG, cl = c % CG;
    float acc = 0.0f;
    for (int kk = 0; kk < KG; kk++) {
        const int k = g * KG + kk;
        __global const float *dyr = dy + ((long)n * K + k) * OL;
        __global const float *wr = w + ((long)k * CG + cl) * KS;
        for (int j = 0; j < KS; j++) {
            const int t = i + pad - j * d;  // = o * s
            if (t < 0 || t % s) continue;
            const int o = t / s;
            if (o < OL) acc += dyr[o] * wr[j];
        }
    }
    dx[idx] = acc;
}

// dw[k, c, j] (+)= sum_{n, o} dy[n, k, o] * x[n, g*CG + c, o*s - pad + j*d]; accumulate: add to dw
__kernel void conv1d_bwd_weight(const int N, const int C, const int L, const int K, const int OL, const int KS,
                                const int s, const int pad, const int d, const int G,
                                __global const float *x, __global const float *dy, __global float *dw,
                                const int accumulate) {
    const int idx = get_global_id(0);
    const int CG = C / G;
    if (idx >= K * CG * KS) return;
    const int j = idx % KS, c = (idx / KS) % CG, k = idx / (KS * CG);
    const int g = k / (K / G);
    float acc = 0.0f;
    for (int n = 0; n < N; n++) {
        __global const float *xr = x + ((long)n * C + g * CG + c) * L;
        __global const float *dyr = dy + ((long)n * K + k) * OL;
        for (int o = 0; o < OL; o++) {
            const int i = o * s - pad + j * d;
            if (i >= 0 && i < L) acc += dyr[o] * xr[i];
        }
    }
    dw[idx] = accumulate ? dw[idx] + acc : acc;
}

// db[k] (+)= sum_{n, o} dy[n, k, o]
__kernel void conv1d_bwd_bias(const int N, const int K, const int OL, __global const float *dy, __global float *db,
                              const int accumulate) {
    const int k = get_global_id(0);
    if (k >= K) return;
    float acc = 0.0f;
    for (int n = 0; n < N; n++) {
        __global const float *dyr = dy + ((long)n * K + k) * OL;
        for (int o = 0; o < OL; o++) acc += dyr[o];
    }
    db[k] = accumulate ? db[k] + acc : acc;
}
