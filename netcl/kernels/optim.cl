// Optimizer updates, torch.optim's rules, one work-item per element of [off, off + n) of an
// optimizer's flat buffers: many parameters in one launch (the padding between them, which no
// tensor sees, is updated alike).

// SGD: g += wd*p; buf = first ? g : momentum*buf + (1-dampening)*g; step = nesterov ? g + momentum*buf : buf
__kernel void sgd_step(const int off, const int n, __global float *p, __global const float *grad,
                       __global float *buf, const float lr, const float momentum, const float dampening,
                       const float wd, const int nesterov, const int first) {
    if (get_global_id(0) >= n) return;
    const int i = off + get_global_id(0);
    float g = grad[i] + wd * p[i];
    if (momentum != 0.0f) {
        const float b = first ? g : momentum * buf[i] + (1.0f - dampening) * g;
        buf[i] = b;
        g = nesterov ? g + momentum * b : b;
    }
    p[i] -= lr * g;
}

// Adam (L2 weight decay as torch.optim.Adam); bc1 = 1 - beta1^t, bc2 = 1 - beta2^t.
__kernel void adam_step(const int off, const int n, __global float *p, __global const float *grad,
                        __global float *m, __global float *v, const float lr, const float beta1,
                        const float beta2, const float eps, const float wd, const float bc1, const float bc2) {
    if (get_global_id(0) >= n) return;
    const int i = off + get_global_id(0);
    const float g = grad[i] + wd * p[i];
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    p[i] -= lr * (mi / bc1) / (sqrt(vi / bc2) + eps);
}
