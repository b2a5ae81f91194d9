// Losses: per-row or per-element loss terms and the gradient of the mean loss, then one
// work-group sums the terms.
#define RED 64

// logits (N, C), integer labels; loss_i = logsumexp(x_i) - x_i[y_i]; grad = (softmax - onehot) / N
__kernel void cross_entropy(const int N, const int C, __global const float *x, __global const int *labels,
                            __global float *terms, __global float *grad) {
    const int i = get_global_id(0);
    if (i >= N) return;
    __global const float *r = x + i * C;
    float m = -INFINITY;
    for (int c = 0; c < C; c++) m = fmax(m, r[c]);
    float s = 0.0f;
    for (int c = 0; c < C; c++) s += exp(r[c] - m);
    const float lse = m + log(s);
    const int y = labels[i];
    terms[i] = lse - r[y];
    for (int c = 0; c < C; c++) grad[i * C + c] = (exp(r[c] - lse) - (c == y ? 1.0f : 0.0f)) / (float)N;
}

// flag: out[1] of the sum (unused by mse)
__kernel void mse(const int n, __global const float *x, __global const float *t, __global float *terms,
                  __global float *grad, __global float *flag) {
    const int i = get_global_id(0);
    if (i >= n) return;
    const float d = x[i] - t[i];
    terms[i] = d * d;
    grad[i] = 2.0f * d / (float)n;
}

// PyTorch clamps the logs at -100, and refuses a prediction outside [0, 1] (NaN too): flag[1] = 1
__kernel void bce(const int n, __global const float *x, __global const float *t, __global float *terms,
                  __global float *grad, __global float *flag) {
    const int i = get_global_id(0);
    if (i >= n) return;
    const float p = x[i], y = t[i];
    if (!(p >= 0.0f && p <= 1.0f)) flag[1] = 1.0f;  // every writer writes the same value
    const float lp = fmax(log(p), -100.0f), lq = fmax(log(1.0f - p), -100.0f);
    terms[i] = -(y * lp + (1.0f - y) * lq);
    const float eps = 1e-12f;
    grad[i] = (p - y) / fmax((1.0f - p) * p, eps) / (float)n;
}

__kernel void sum_all(const int n, __global const float *x, __global float *out) {
    __local float part[RED];
    const int t = get_local_id(0);
    float s = 0.0f;
    for (int i = t; i < n; i += RED) s += x[i];
    part[t] = s;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int w = RED / 2; w > 0; w >>= 1) {
        if (t < w) part[t] += part[t + w];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (t == 0) out[0] = part[0];
}
