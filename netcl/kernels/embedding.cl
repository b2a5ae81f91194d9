// Embedding: rows of a weight (V, D) gathered by int indices; the backward a scatter-add without
// atomics (a work-item per column walks the indices in order: the same sums in the same order on
// every run, whatever indices repeat).

// y[i, j] = w[idx[i], j]; n = indices * D. An index out of [0, V) reads zeros (the host refuses
// such indices where it holds them: Embedding._check)
__kernel void embedding_fwd(const int n, const int V, const int D, __global const int *idx,
                            __global const float *w, __global float *y) {
    const int g = get_global_id(0);
    if (g >= n) return;
    const int i = g / D, j = g - i * D, k = idx[i];
    y[g] = (k >= 0 && k < V) ? w[(long)k * D + j] : 0.0f;
}

// dw[idx[i], j] += dy[i, j] for i = 0 .. m-1 in order, a work-item per column j; the padding row
// (pad, -1 for none) and indices out of range get nothing
__kernel void embedding_bwd(const int m, const int V, const int D, const int pad, __global const int *idx,
                            __global const float *dy, __global float *dw) {
    const int j = get_global_id(0);
    if (j >= D) return;
    for (int i = 0; i < m; i++) {
        const int k = idx[i];
        if (k >= 0 && k < V && k != pad) dw[(long)k * D + j] += dy[(long)i * D + j];
    }
}
