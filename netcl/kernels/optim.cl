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

// Adam: weight decay as an L2 term of the gradient (torch.optim.Adam) or, decoupled, as a scaling of the
// parameter (AdamW: p *= 1 - lr*wd); bc1 = 1 - beta1^t, bc2 = 1 - beta2^t; amsgrad: the second moment's
// running maximum vmax in the denominator (vmax aliases v without it, and is not written).
inline void adam_one(const int i, __global float *p, __global const float *grad, __global float *m,
                     __global float *v, __global float *vmax, const float lr, const float beta1, const float beta2,
                     const float eps, const float wd, const float bc1, const float bc2, const int decoupled,
                     const int amsgrad) {
    float pi = p[i], g = grad[i];
    if (decoupled)
        pi *= 1.0f - lr * wd;
    else
        g += wd * pi;
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    float vh = vi;
    if (amsgrad) {
        vh = fmax(vmax[i], vi);
        vmax[i] = vh;
    }
    p[i] = pi - lr * (mi / bc1) / (sqrt(vh / bc2) + eps);
}

__kernel void adam_step(const int off, const int n, __global float *p, __global const float *grad,
                        __global float *m, __global float *v, __global float *vmax, const float lr,
                        const float beta1, const float beta2, const float eps, const float wd, const float bc1,
                        const float bc2, const int decoupled, const int amsgrad) {
    if (get_global_id(0) >= n) return;
    adam_one(off + get_global_id(0), p, grad, m, v, vmax, lr, beta1, beta2, eps, wd, bc1, bc2, decoupled, amsgrad);
}

__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void adam_step_cpu(const int off, const int n, __global float *p, __global const float *grad,
                   __global float *m, __global float *v, __global float *vmax, const float lr, const float beta1,
                   const float beta2, const float eps, const float wd, const float bc1, const float bc2,
                   const int decoupled, const int amsgrad, const int chunk) {
    const int i1 = off + min(n, (int)(get_global_id(0) + 1) * chunk);
    for (int i = off + get_global_id(0) * chunk; i < i1; i++)
        adam_one(i, p, grad, m, v, vmax, lr, beta1, beta2, eps, wd, bc1, bc2, decoupled, amsgrad);
}

// RMSprop (torch.optim.RMSprop): sq = alpha*sq + (1-alpha)*g^2; centered: avg = alpha*avg + (1-alpha)*g and
// the denominator sqrt(sq - avg^2) + eps; with momentum buf = momentum*buf + g/denominator, p -= lr*buf. buf
// and avg alias sq where unused (not written).
inline void rmsprop_one(const int i, __global float *p, __global const float *grad, __global float *sq,
                        __global float *buf, __global float *avg, const float lr, const float alpha,
                        const float eps, const float wd, const float momentum, const int use_momentum,
                        const int centered) {
    const float pi = p[i], g = grad[i] + wd * pi;
    const float s = alpha * sq[i] + (1.0f - alpha) * g * g;
    sq[i] = s;
    float d;
    if (centered) {
        const float a = alpha * avg[i] + (1.0f - alpha) * g;
        avg[i] = a;
        d = sqrt(s - a * a) + eps;
    } else {
        d = sqrt(s) + eps;
    }
    if (use_momentum) {
        const float b = momentum * buf[i] + g / d;
        buf[i] = b;
        p[i] = pi - lr * b;
    } else {
        p[i] = pi - lr * g / d;
    }
}

__kernel void rmsprop_step(const int off, const int n, __global float *p, __global const float *grad,
                           __global float *sq, __global float *buf, __global float *avg, const float lr,
                           const float alpha, const float eps, const float wd, const float momentum,
                           const int use_momentum, const int centered) {
    if (get_global_id(0) >= n) return;
    rmsprop_one(off + get_global_id(0), p, grad, sq, buf, avg, lr, alpha, eps, wd, momentum, use_momentum, centered);
}

__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void rmsprop_step_cpu(const int off, const int n, __global float *p, __global const float *grad,
                      __global float *sq, __global float *buf, __global float *avg, const float lr,
                      const float alpha, const float eps, const float wd, const float momentum,
                      const int use_momentum, const int centered, const int chunk) {
    const int i1 = off + min(n, (int)(get_global_id(0) + 1) * chunk);
    for (int i = off + get_global_id(0) * chunk; i < i1; i++)
        rmsprop_one(i, p, grad, sq, buf, avg, lr, alpha, eps, wd, momentum, use_momentum, centered);
}
