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

// On CPUs (ops.launch_rows): a run of `rows` output rows (a, i1, b) per work-item, each D0 * C
// values, the index arithmetic once a row (once an element, it costs PoCL about 70 ns an element)
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void transpose_cpu(const int n, const int D0, const int B, const int D1, const int C, __global const float *x,
                   __global float *y, const int total, const int rows) {
    const int r1 = min(total, (int)(get_global_id(0) + 1) * rows);
    for (int r = get_global_id(0) * rows; r < r1; r++) {  // r = (a * D1 + i1) * B + b
        const int b = r % B, i1 = (r / B) % D1, a = r / (B * D1);
        __global float *out = y + (long)r * D0 * C;
        for (int i0 = 0; i0 < D0; i0++) {
            __global const float *in = x + ((((long)a * D0 + i0) * B + b) * D1 + i1) * C;
            for (int c = 0; c < C; c++) out[i0 * C + c] = in[c];
        }
    }
}
