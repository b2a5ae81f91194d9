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
