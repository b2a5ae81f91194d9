// Optimizer updates, torch.optim's rules, one work-item per element (on CPUs per chunk) of [off,
// off + n) of an optimizer's flat buffers: many parameters in one launch (the padding between them, which no
// tensor sees, is updated alike).

// SGD: g += wd*p; buf = first ? g : momentum*buf + (1-dampening)*g; step = nesterov ? g + momentum*buf : buf
inline void sgd_one(const int i, __global float *p, __global const float *grad, __global float *buf, const float lr,
                    const float momentum, const float dampening, const float wd, const int nesterov,
                    const int first) {
    float g = grad[i] + wd * p[i];
    if (momentum != 0.0f) {
        const float b = first ? g : momentum * buf[i] + (1.0f - dampening) * g;
        buf[i] = b;
        g = nesterov ? g + momentum * b : b;
    }
    p[i] -= lr * g;
}

__kernel void sgd_step(const int off, const int n, __global float *p, __global const float *grad,
                       __global float *buf, const float lr, const float momentum, const float dampening,
                       const float wd, const int nesterov, const int first) {
    if (get_global_id(0) >= n) return;
    sgd_one(off + get_global_id(0), p, grad, buf, lr, momentum, dampening, wd, nesterov, first);
}

// The CPU variants (PoCL): work-item t updates the chunk [t * chunk, (t + 1) * chunk) of the n
// values, the same arithmetic per element. A work-group per 64 values cost PoCL a dispatch each:
// resnet8's 78K parameters took sgd_step 76-85 us a step.
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void sgd_step_cpu(const int off, const int n, __global float *p, __global const float *grad,
                  __global float *buf, const float lr, const float momentum, const float dampening,
                  const float wd, const int nesterov, const int first, const int chunk) {
    const int i1 = off + min(n, (int)(get_global_id(0) + 1) * chunk);
    for (int i = off + get_global_id(0) * chunk; i < i1; i++)
        sgd_one(i, p, grad, buf, lr, momentum, dampening, wd, nesterov, first);
}

// Adam (L2 weight decay as torch.optim.Adam); bc1 = 1 - beta1^t, bc2 = 1 - beta2^t.
inline void adam_one(const int i, __global float *p, __global const float *grad, __global float *m,
                     __global float *v, const float lr, const float beta1, const float beta2, const float eps,
                     const float wd, const float bc1, const float bc2) {
    const float g = grad[i] + wd * p[i];
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    p[i] -= lr * (mi / bc1) / (sqrt(vi / bc2) + eps);
}

__kernel void adam_step(const int off, const int n, __global float *p, __global const float *grad,
                        __global float *m, __global float *v, const float lr, const float beta1,
                        const float beta2, const float eps, const float wd, const float bc1, const float bc2) {
    if (get_global_id(0) >= n) return;
    adam_one(off + get_global_id(0), p, grad, m, v, lr, beta1, beta2, eps, wd, bc1, bc2);
}

__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void adam_step_cpu(const int off, const int n, __global float *p, __global const float *grad,
                   __global float *m, __global float *v, const float lr, const float beta1,
                   const float beta2, const float eps, const float wd, const float bc1, const float bc2,
                   const int chunk) {
    const int i1 = off + min(n, (int)(get_global_id(0) + 1) * chunk);
    for (int i = off + get_global_id(0) * chunk; i < i1; i++)
        adam_one(i, p, grad, m, v, lr, beta1, beta2, eps, wd, bc1, bc2);
}
