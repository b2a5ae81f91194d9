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
// values, the same arithmetic per element. A work-group per 64 values costs PoCL a dispatch each.
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

// -- gradient clipping (netcl.nn.utils) ------------------------------------------------------------
// A norm of gradients. A launch covers a run of values of one buffer holding one or more gradients (an
// optimizer's flat buffer), each a segment: seg[SEG * s ...] = its element offset in the buffer, its
// length, the values a partial covers, the run's first partial (work-item or work-group) of it, its first
// place in part. Partials are per gradient, numbered in the order the caller gives the gradients, so
// that the norm has the same bits wherever the gradients live. grad_norm_total reduces them in that
// order and writes the norm and the clip coefficient min(max_norm / (norm + 1e-6), 1); grad_scale
// multiplies by it. kind: 0 |g|^p, 1 g^2, 2 max |g| (p = inf), 3 |g|.
#define NORM_LOCAL 64
#define SEG 5

inline float norm_term(const float g, const int kind, const float p) {
    const float a = fabs(g);
    return kind == 1 ? a * a : kind == 0 ? pow(a, p) : a;
}

// (a NaN gradient makes the norm NaN, as torch's: fmax would drop it)
inline float norm_join(const float a, const float b, const int kind) {
    return kind == 2 ? ((a > b || a != a) ? a : b) : a + b;
}

// the segment of the run's partial `item` (segments in order of their first partial)
inline int segment_of(const int item, __global const int *seg, const int nseg) {
    int s = 0;
    while (s + 1 < nseg && seg[SEG * (s + 1) + 3] <= item) s++;
    return s;
}

// GPUs: work-group w computes the run's partial w, its NORM_LOCAL work-items striding over its values
__kernel __attribute__((reqd_work_group_size(NORM_LOCAL, 1, 1)))
void grad_norm_part(const int nseg, __global const int *seg, __global const float *g, __global float *part,
                    const int kind, const float p) {
    __local float s[NORM_LOCAL];
    const int t = get_local_id(0), w = get_group_id(0);
    const int k = segment_of(w, seg, nseg);
    __global const int *e = seg + SEG * k;
    const int c = w - e[3], i1 = min(e[1], (c + 1) * e[2]);
    float acc = 0.0f;
    for (int i = c * e[2] + t; i < i1; i += NORM_LOCAL) acc = norm_join(acc, norm_term(g[e[0] + i], kind, p), kind);
    s[t] = acc;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int h = NORM_LOCAL / 2; h > 0; h >>= 1) {
        if (t < h) s[t] = norm_join(s[t], s[t + h], kind);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (t == 0) part[e[4] + c] = s[0];
}

// CPUs: work-item w computes the run's partial w in order
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void grad_norm_part_cpu(const int nseg, __global const int *seg, __global const float *g, __global float *part,
                        const int kind, const float p) {
    const int w = get_global_id(0);
    const int k = segment_of(w, seg, nseg);
    __global const int *e = seg + SEG * k;
    const int c = w - e[3], i1 = min(e[1], (c + 1) * e[2]);
    float acc = 0.0f;
    for (int i = c * e[2]; i < i1; i++) acc = norm_join(acc, norm_term(g[e[0] + i], kind, p), kind);
    part[e[4] + c] = acc;
}

// one work-item: norm[0] = the norm of the count partials, coef[0] = the clip coefficient
__kernel void grad_norm_total(const int count, __global const float *part, __global float *norm,
                              __global float *coef, const int kind, const float p, const float max_norm) {
    if (get_global_id(0) != 0) return;
    float acc = 0.0f;
    for (int i = 0; i < count; i++) acc = norm_join(acc, part[i], kind);
    const float r = kind == 1 ? sqrt(acc) : kind == 0 ? pow(acc, 1.0f / p) : acc;
    norm[0] = r;
    coef[0] = fmin(max_norm / (r + 1e-6f), 1.0f);
}

inline void scale_one(const int i, __global float *g, __global const float *coef) { g[i] *= coef[0]; }

inline void clamp_one(const int i, __global float *g, const float lo, const float hi) {
    const float x = g[i];
    g[i] = x < lo ? lo : x > hi ? hi : x;
}

__kernel void grad_scale(const int off, const int n, __global float *g, __global const float *coef) {
    if (get_global_id(0) >= n) return;
    scale_one(off + get_global_id(0), g, coef);
}

__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void grad_scale_cpu(const int off, const int n, __global float *g, __global const float *coef, const int chunk) {
    const int i1 = off + min(n, (int)(get_global_id(0) + 1) * chunk);
    for (int i = off + get_global_id(0) * chunk; i < i1; i++) scale_one(i, g, coef);
}

// clip_grad_value_: g = clamp(g, lo, hi); NaN stays NaN, as torch's clamp
__kernel void grad_clamp(const int off, const int n, __global float *g, const float lo, const float hi) {
    if (get_global_id(0) >= n) return;
    clamp_one(off + get_global_id(0), g, lo, hi);
}

__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void grad_clamp_cpu(const int off, const int n, __global float *g, const float lo, const float hi, const int chunk) {
    const int i1 = off + min(n, (int)(get_global_id(0) + 1) * chunk);
    for (int i = off + get_global_id(0) * chunk; i < i1; i++) clamp_one(i, g, lo, hi);
}
