// Residual and Concat blocks: a sum of two tensors, and copies between a branch's tensor and
// its slice of the concatenated one. One work-item per element; n is the element count.

// y = a + b; y may be a (branch gradients summed in place)
__kernel void add(const int n, __global const float *a, __global const float *b, __global float *y) {
    int i = get_global_id(0);
    if (i < n) y[i] = a[i] + b[i];
}

// The concat axis has length `part` in the branch's tensor and `whole` in the concatenated one,
// where the branch starts at `offset`; `inner` is the product of the dimensions after the axis.
// n = the branch tensor's size. to_whole = 1 (forward): whole[o, offset + j, k] = part[o, j, k];
// to_whole = 0 (backward): part[o, j, k] = whole[o, offset + j, k].
__kernel void copy_slice(const int n, const int part, const int whole, const int offset, const int inner,
                         const int to_whole, __global const float *src, __global float *dst) {
    int i = get_global_id(0);
    if (i >= n) return;
    int o = i / (part * inner);
    int w = (o * whole + offset) * inner + (i - o * part * inner);
    if (to_whole) dst[w] = src[i];
    else dst[i] = src[w];
}
