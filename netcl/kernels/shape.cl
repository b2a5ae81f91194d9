// Layers that only move data. Transpose swaps two axes: the input read as (A, D0, B, D1, C) is
// written as (A, D1, B, D0, C); one work-item per output element (contiguous writes). The
// backward is the same kernel with D0 and D1 exchanged.
__kernel void transpose(const int n, const int D0, const int B, const int D1, const int C,
                        __global const float *x, __global float *y) {
    const int idx = get_global_id(0);
    if (idx >= n) return;
    int r = idx / C;
    const int c = idx % C, i0 = r % D0;
    r /= D0;
    const int b = r % B;
    r /= B;
    const int i1 = r % D1, a = r / D1;
    y[idx] = x[(((a * D0 + i0) * B + b) * D1 + i1) * C + c];
}
