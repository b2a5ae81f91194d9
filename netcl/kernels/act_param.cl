// Activations with settings of their own (ELU's alpha, Softplus's beta and threshold, PReLU's learnt
// slopes) and Mish: one work-item per element, PyTorch's formulas (aten's CPU kernels), each
// backward beside its forward. Training runs these; act.h's ACT_ELU, ACT_SOFTPLUS (threshold 20) and
// ACT_MISH, the same formulas, are the fused inference plan's epilogues of them (PReLU does not fuse).

// ELU: x where x > 0, else alpha * (exp(x) - 1); dx = dy * alpha * exp(x) where x <= 0 (a NaN's
// gradient passes as dy, as PyTorch's)
__kernel void elu_fwd(const int n, const float alpha, __global const float *x, __global float *y) {
    const int i = get_global_id(0);
    if (i >= n) return;
    const float v = x[i];
    y[i] = v > 0.0f ? v : alpha * expm1(v);
}

__kernel void elu_bwd(const int n, const float alpha, __global const float *x, __global const float *dy,
                      __global float *dx) {
    const int i = get_global_id(0);
    if (i >= n) return;
    const float v = x[i];
    dx[i] = v <= 0.0f ? dy[i] * alpha * exp(v) : dy[i];
}

// Softplus: log(1 + exp(beta x)) / beta, x itself where beta x > threshold
__kernel void softplus_fwd(const int n, const float beta, const float threshold, __global const float *x,
                           __global float *y) {
    const int i = get_global_id(0);
    if (i >= n) return;
    const float v = x[i], b = v * beta;
    y[i] = b > threshold ? v : log1p(exp(b)) / beta;
}

__kernel void softplus_bwd(const int n, const float beta, const float threshold, __global const float *x,
                           __global const float *dy, __global float *dx) {
    const int i = get_global_id(0);
    if (i >= n) return;
    const float b = x[i] * beta, z = exp(b);
    dx[i] = b > threshold ? dy[i] : dy[i] * z / (z + 1.0f);
}

// Mish: x tanh(softplus(x)); dx = dy (tanh(sp) + x sigmoid(x) (1 - tanh(sp)^2))
__kernel void mish_fwd(const int n, __global const float *x, __global float *y) {
    const int i = get_global_id(0);
    if (i >= n) return;
    const float v = x[i];
    y[i] = v * tanh(log1p(exp(v)));
}

__kernel void mish_bwd(const int n, __global const float *x, __global const float *dy, __global float *dx) {
    const int i = get_global_id(0);
    if (i >= n) return;
    const float v = x[i], t = tanh(log1p(exp(v))), s = 1.0f / (1.0f + exp(-v));
    dx[i] = dy[i] * (t + v * s * (1.0f - t * t));
}

// PReLU: x where x > 0, else w[c] x, c the channel (dimension 1) of element i: (i / inner) % C
// (C = 1: one slope for all)
__kernel void prelu_fwd(const int n, const int C, const int inner, __global const float *x,
                        __global const float *w, __global float *y) {
    const int i = get_global_id(0);
    if (i >= n) return;
    const float v = x[i];
    y[i] = v > 0.0f ? v : w[(i / inner) % C] * v;
}

__kernel void prelu_bwd_dx(const int n, const int C, const int inner, __global const float *x,
                           __global const float *w, __global const float *dy, __global float *dx) {
    const int i = get_global_id(0);
    if (i >= n) return;
    dx[i] = x[i] > 0.0f ? dy[i] : w[(i / inner) % C] * dy[i];
}

// dw[c] (+)= the sum of x dy where x <= 0 over channel c's elements, a work-item per channel walking
// them in order (deterministic); outer = n / (C inner)
__kernel void prelu_bwd_dw(const int outer, const int C, const int inner, __global const float *x,
                           __global const float *dy, __global float *dw, const int accumulate) {
    const int c = get_global_id(0);
    if (c >= C) return;
    float acc = 0.0f;
    for (int o = 0; o < outer; o++) {
        const long base = ((long)o * C + c) * inner;
        for (int j = 0; j < inner; j++) {
            const float v = x[base + j];
            acc += v > 0.0f ? 0.0f : v * dy[base + j];
        }
    }
    dw[c] = accumulate ? dw[c] + acc : acc;
}
