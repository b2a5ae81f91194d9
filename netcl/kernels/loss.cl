// Losses in two launches and one read: a loss kernel writes the gradient of the mean loss and, per
// work-group of RED items, the sum of its loss terms to part[group] and whether it saw a value the
// loss refuses to part[groups + group]; loss_sum then adds the groups' sums in a fixed order and
// writes out = (sum of the terms, refused), which the host reads (and divides in double precision).
#define RED 64

// The group's sum of `term` and maximum of `bad`, left in s[0] and f[0]. Every work-item of the
// group calls it (no early return before it: it has barriers).
static void group_reduce(const float term, const float bad, __local float *s, __local float *f) {
    const int t = get_local_id(0);
    s[t] = term;
    f[t] = bad;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int w = RED / 2; w > 0; w >>= 1) {
        if (t < w) {
            s[t] += s[t + w];
            f[t] = fmax(f[t], f[t + w]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
}

// ... written to the group's entries of part
static void group_sum(const float term, const float bad, __local float *s, __local float *f,
                      __global float *part) {
    group_reduce(term, bad, s, f);
    if (get_local_id(0) == 0) {
        part[get_group_id(0)] = s[0];
        part[get_num_groups(0) + get_group_id(0)] = f[0];
    }
}

// logits (N, C), class indices as floats. A label equal to `ignore` (ignore_index) adds nothing and gets a
// zero gradient; any other that is not an integer in [0, C) is refused: its row's gradient 0, so that a step
// taken before the host reads the refusal changes nothing through it. loss_i = logsumexp(x_i) - x_i[y_i];
// grad = (softmax - onehot) / N, which ce_sum rescales where labels were ignored. part: per work-group the sum
// of the terms, whether a label was refused, how many were ignored.
__kernel void cross_entropy(const int N, const int C, const int ignore, __global const float *x,
                            __global const float *labels, __global float *grad, __global float *part) {
    __local float s[RED], f[RED], k[RED], unused[RED];
    const int i = get_global_id(0);
    float term = 0.0f, bad = 0.0f, skip = 0.0f;
    if (i < N) {
        const float yf = labels[i];
        skip = yf == (float)ignore ? 1.0f : 0.0f;
        bad = (skip != 0.0f || (yf >= 0.0f && yf < (float)C && yf == floor(yf))) ? 0.0f : 1.0f;
        const int keep = bad == 0.0f && skip == 0.0f;
        const int y = keep ? (int)yf : 0;  // a refused or ignored label still indexes inside the row
        __global const float *r = x + i * C;
        float m = -INFINITY;
        for (int c = 0; c < C; c++) m = fmax(m, r[c]);
        float e = 0.0f;
        for (int c = 0; c < C; c++) e += exp(r[c] - m);
        const float lse = m + log(e);
        term = keep ? lse - r[y] : 0.0f;
        for (int c = 0; c < C; c++)
            grad[i * C + c] = keep ? (exp(r[c] - lse) - (c == y ? 1.0f : 0.0f)) / (float)N : 0.0f;
    }
    group_sum(term, bad, s, f, part);
    group_reduce(skip, 0.0f, k, unused);
    if (get_local_id(0) == 0) part[2 * get_num_groups(0) + get_group_id(0)] = k[0];
}

// cross_entropy's total: out[0] = mean[0] = the mean over the labels not ignored (NaN where every label
// was), out[1] = 1 if one was refused; where labels were ignored, grad (N, C) is rescaled from / N to
// / (N - ignored).
__kernel void ce_sum(const int groups, __global const float *part, __global float *out, __global float *mean,
                     const int N, const int C, __global float *grad) {
    __local float s[RED], f[RED], k[RED], unused[RED];
    const int t = get_local_id(0);
    float a = 0.0f, b = 0.0f, c = 0.0f;
    for (int g = t; g < groups; g += RED) {
        a += part[g];
        b = fmax(b, part[groups + g]);
        c += part[2 * groups + g];
    }
    group_reduce(a, b, s, f);
    group_reduce(c, 0.0f, k, unused);
    const int valid = N - (int)k[0];
    if (t == 0) {
        const float m = s[0] * (1.0f / (float)valid);
        out[0] = m;
        out[1] = f[0];
        mean[0] = m;
    }
    if (valid < N && valid > 0) {
        const float r = (float)N / (float)valid;
        for (int i = t; i < N * C; i += RED) grad[i] *= r;
    }
}

// Per target of a composed class loss (nn.NLLLoss, CrossEntropyLoss with options): w[i] = the class weight of
// int target t = idx[i] (1 without weights), 0 where t == ignore; a t that is neither a class in [0, C) nor
// ignore gets 0 and sets bad[0] (every such writer writes the same 1).
__kernel void class_weights(const int n, const int C, __global const int *idx, __global const float *weight,
                            const int has_weight, const int ignore, __global float *w, __global float *bad) {
    const int i = get_global_id(0);
    if (i >= n) return;
    const int t = idx[i];
    if (t == ignore) {
        w[i] = 0.0f;
    } else if (t < 0 || t >= C) {
        w[i] = 0.0f;
        bad[0] = 1.0f;
    } else {
        w[i] = has_weight ? weight[t] : 1.0f;
    }
}

__kernel void mse(const int n, __global const float *x, __global const float *t, __global float *grad,
                  __global float *part) {
    __local float s[RED], f[RED];
    const int i = get_global_id(0);
    float term = 0.0f;
    if (i < n) {
        const float d = x[i] - t[i];
        term = d * d;
        grad[i] = 2.0f * d / (float)n;
    }
    group_sum(term, 0.0f, s, f, part);
}

// PyTorch clamps the logs at -100, and refuses a prediction outside [0, 1] (NaN too: its gradient 0)
__kernel void bce(const int n, __global const float *x, __global const float *t, __global float *grad,
                  __global float *part) {
    __local float s[RED], f[RED];
    const int i = get_global_id(0);
    float term = 0.0f, bad = 0.0f;
    if (i < n) {
        const float p = x[i], y = t[i];
        bad = (p >= 0.0f && p <= 1.0f) ? 0.0f : 1.0f;
        const float lp = fmax(log(p), -100.0f), lq = fmax(log(1.0f - p), -100.0f);
        term = -(y * lp + (1.0f - y) * lq);
        const float eps = 1e-12f;
        grad[i] = bad == 0.0f ? (p - y) / fmax((1.0f - p) * p, eps) / (float)n : 0.0f;
    }
    group_sum(term, bad, s, f, part);
}

// out[0] = the sum of the groups' sums, out[1] = 1 if any group refused a value; mean = out[0] * scale
// (the loss as a tensor: scale = 1 / the number of terms)
__kernel void loss_sum(const int groups, __global const float *part, __global float *out, __global float *mean,
                       const float scale) {
    __local float s[RED], f[RED];
    const int t = get_local_id(0);
    float a = 0.0f, b = 0.0f;
    for (int g = t; g < groups; g += RED) {
        a += part[g];
        b = fmax(b, part[groups + g]);
    }
    group_reduce(a, b, s, f);
    if (t == 0) {
        out[0] = s[0];
        out[1] = f[0];
        mean[0] = s[0] * scale;
    }
}
