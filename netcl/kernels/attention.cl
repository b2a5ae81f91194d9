// Head split/merge for MultiheadAttention: between a (N*L, RW) matrix whose columns
// off .. off+H*d hold the heads side by side, and (N*H, L, d) per-head blocks.

__kernel void split_heads(const int N, const int L, const int H, const int d, __global const float *src,
                          const int RW, const int off, __global float *dst) {
    const int i = get_global_id(0);
    if (i >= N * H * L * d) return;
    const int j = i % d, l = (i / d) % L, h = (i / (d * L)) % H, n = i / (d * L * H);
    dst[i] = src[(n * L + l) * RW + off + h * d + j];
}

__kernel void merge_heads(const int N, const int L, const int H, const int d, __global const float *src,
                          const int RW, const int off, __global float *dst) {
    const int i = get_global_id(0);
    if (i >= N * H * L * d) return;
    const int j = i % d, l = (i / d) % L, h = (i / (d * L)) % H, n = i / (d * L * H);
    dst[(n * L + l) * RW + off + h * d + j] = src[i];
}

// The CPU variants (ops.launch_rows): a run of `rows` head rows (n, h, l) per work-item, each a
// copy of d contiguous floats (one element per work-item costs PoCL about 70 ns an element in
// its index arithmetic)
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void split_heads_cpu(const int N, const int L, const int H, const int d, __global const float *src, const int RW,
                     const int off, __global float *dst, const int total, const int rows) {
    const int r1 = min(total, (int)(get_global_id(0) + 1) * rows);
    for (int r = get_global_id(0) * rows; r < r1; r++) {  // r = (n * H + h) * L + l
        const int l = r % L, h = (r / L) % H, n = r / (L * H);
        __global const float *s = src + (n * L + l) * RW + off + h * d;
        __global float *t = dst + r * d;
        for (int j = 0; j < d; j++) t[j] = s[j];
    }
}

__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void merge_heads_cpu(const int N, const int L, const int H, const int d, __global const float *src, const int RW,
                     const int off, __global float *dst, const int total, const int rows) {
    const int r1 = min(total, (int)(get_global_id(0) + 1) * rows);
    for (int r = get_global_id(0) * rows; r < r1; r++) {
        const int l = r % L, h = (r / L) % H, n = r / (L * H);
        __global const float *s = src + r * d;
        __global float *t = dst + (n * L + l) * RW + off + h * d;
        for (int j = 0; j < d; j++) t[j] = s[j];
    }
}
