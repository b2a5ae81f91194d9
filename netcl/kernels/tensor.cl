// Tensor operations (netcl/functions.py through netcl/array_ops.py): element-wise kernels built
// once per operation (-DOP2, -DOP1 or -DRED, so the operation folds to one expression and PoCL vectorises
// the loops: with the operation as an argument it did not), one reduction kernel per reduction,
// strided copies, index gathers and casts. Sizes are arguments: a new shape builds nothing.
//
// Shapes come innermost dimension first as int8 vectors (up to 8 dimensions, after merging the
// ones every operand walks alike), each operand with its element strides (0 along a broadcast
// dimension); an output is contiguous. Built with -DCPU (netcl's CPU kernel classes) a work-item
// runs a chunk of the output row by row, its operands' row offsets computed once a row and a row
// in float16 vectors where the operands are contiguous along it; otherwise (GPUs) a work-item
// computes one output element.
#include "vec_cpu.h"

// Each program is built for one operation: -DOP2=<code> (ew2), -DOP1=<code> (ew1), -DRED=<code>
// (reduce); the others take their first code.
#ifndef OP2
#define OP2 0
#endif
#ifndef OP1
#define OP1 0
#endif
#ifndef RED
#define RED 0
#endif

// -- element-wise: two operands (netcl.array_ops.BINARY) ------------------------------------
// F2(T, x, y) for float or float16 T; p0, p1 are the kernel's two float parameters.
#if OP2 == 0
#define F2(T, x, y) ((x) + (y))
#elif OP2 == 1
#define F2(T, x, y) ((x) - (y))
#elif OP2 == 2
#define F2(T, x, y) ((x) * (y))
#elif OP2 == 3
#define F2(T, x, y) ((x) / (y))
#elif OP2 == 4
#define F2(T, x, y) pow((T)(x), (T)(y))
#elif OP2 == 5  // maximum: NaN wins, as in PyTorch
#define F2(T, x, y) (((x) > (y) || (x) != (x)) ? (x) : (y))
#elif OP2 == 6  // minimum
#define F2(T, x, y) (((x) < (y) || (x) != (x)) ? (x) : (y))
#elif OP2 == 7
#define F2(T, x, y) ((x) == (y) ? (T)(1.0f) : (T)(0.0f))
#elif OP2 == 8
#define F2(T, x, y) ((x) != (y) ? (T)(1.0f) : (T)(0.0f))
#elif OP2 == 9
#define F2(T, x, y) ((x) < (y) ? (T)(1.0f) : (T)(0.0f))
#elif OP2 == 10
#define F2(T, x, y) ((x) <= (y) ? (T)(1.0f) : (T)(0.0f))
#elif OP2 == 11
#define F2(T, x, y) ((x) > (y) ? (T)(1.0f) : (T)(0.0f))
#elif OP2 == 12
#define F2(T, x, y) ((x) >= (y) ? (T)(1.0f) : (T)(0.0f))
#elif OP2 == 13  // sqrt's gradient: x = dy, y = sqrt's output
#define F2(T, x, y) ((x) * 0.5f / (y))
#elif OP2 == 14  // abs's gradient: x = dy, y = abs's input (0 at 0, as PyTorch's sign)
#define F2(T, x, y) ((y) > 0.0f ? (x) : (y) < 0.0f ? -(x) : (T)(0.0f))
#elif OP2 == 15  // clamp's gradient: x = dy, y = clamp's input; passes inside [p0, p1], bounds included
#define F2(T, x, y) (((y) >= p0 && (y) <= p1) ? (x) : (T)(0.0f))
#elif OP2 == 16  // x ** p0's gradient: x = dy, y = the base (0 for p0 = 0, as PyTorch's)
#define F2(T, x, y) (p0 == 0.0f ? (T)(0.0f) : (x) * p0 * pow((T)(y), (T)(p0 - 1.0f)))
#elif OP2 == 17  // x = dy, y = the input of a maximum/minimum against a scalar or of max(dim): dy where y == p0
#define F2(T, x, y) ((y) == p0 ? (x) : (T)(0.0f))
#elif OP2 == 18  // a ** b's derivative in a: x = b, y = a; 0 where b = 0 (PyTorch's rule)
#define F2(T, x, y) ((x) == 0.0f ? (T)(0.0f) : (x) * pow((T)(y), (T)((x) - 1.0f)))
#elif OP2 == 19  // a ** b's derivative in b: x = a ** b, y = a; 0 where a = 0 and b >= 0 (a finite x)
#define F2(T, x, y) (((y) == 0.0f && (x) < INFINITY) ? (T)(0.0f) : (x) * log((T)(y)))
#endif

// -- element-wise: one operand (netcl.array_ops.UNARY) --------------------------------------
#if OP1 == 0
#define F1(T, x) (-(x))
#elif OP1 == 1
#define F1(T, x) exp(x)
#elif OP1 == 2
#define F1(T, x) log(x)
#elif OP1 == 3
#define F1(T, x) sqrt(x)
#elif OP1 == 4
#define F1(T, x) fabs(x)
#elif OP1 == 5  // min(max(x, p0), p1) (+-inf for a missing bound; p1 where p0 > p1); NaN stays NaN
#define F1(T, x) ((x) < p0 ? (T)(p0 > p1 ? p1 : p0) : (x) > p1 ? (T)(p1) : (x))
#elif OP1 == 6
#define F1(T, x) pow((T)(x), (T)(p0))
#elif OP1 == 7
#define F1(T, x) ((x) * (x))
#elif OP1 == 8
#define F1(T, x) (1.0f / (x))
#elif OP1 == 9
#define F1(T, x) ((x) > 0.0f ? (T)(1.0f) : (x) < 0.0f ? (T)(-1.0f) : (T)(0.0f))
#elif OP1 == 10
#define F1(T, x) sin(x)
#elif OP1 == 11
#define F1(T, x) cos(x)
#elif OP1 == 12  // x * p0 + p1 (an affine map: a scale, a shift, an rsub)
#define F1(T, x) ((x) * p0 + p1)
#endif

// The operands' offsets of row r (its index over the outer dimensions 1 .. nd - 1) added to ra, rb.
#define OUTER_DIM(k)                           \
    if (nd > k) {                              \
        const int c_ = r % shp.s##k;           \
        r /= shp.s##k;                         \
        ra += c_ * sa.s##k;                    \
        rb += c_ * sb.s##k;                    \
    }
#define ROW_OFFSETS OUTER_DIM(1) OUTER_DIM(2) OUTER_DIM(3) OUTER_DIM(4) OUTER_DIM(5) OUTER_DIM(6) OUTER_DIM(7)

// y = F2(a, b) over shp, broadcasting by the strides sa and sb; ascal/bscal: the operand is the
// scalar av/bv (its buffer unused). The innermost strides are 1 or 0.
__kernel void ew2(const int n, const int nd, const int8 shp, __global const float *a, const int8 sa, const int oa,
                  const float av, const int ascal, __global const float *b, const int8 sb, const int ob,
                  const float bv, const int bscal, const float p0, const float p1, __global float *y,
                  const int chunk) {
#ifdef CPU
    const int L = shp.s0, i1 = MIN(n, (int)get_global_id(0) * chunk + chunk);
    int i = get_global_id(0) * chunk;
    while (i < i1) {
        int r = i / L;
        const int c = i - r * L, run = MIN(L - c, i1 - i);
        int ra = oa, rb = ob;
        ROW_OFFSETS
        __global float *yo = y + i;
        int j = 0;
        if (sa.s0 && sb.s0) {  // both run along the row
            __global const float *pa = a + ra + c, *pb = b + rb + c;
            for (; j + 16 <= run; j += 16)
                *(__global ufloat16 *)(yo + j) =
                    F2(float16, *(__global const ufloat16 *)(pa + j), *(__global const ufloat16 *)(pb + j));
            for (; j < run; j++) yo[j] = F2(float, pa[j], pb[j]);
        } else if (sa.s0) {  // b is one value along the row
            __global const float *pa = a + ra + c;
            const float vb = bscal ? bv : b[rb];
            for (; j + 16 <= run; j += 16)
                *(__global ufloat16 *)(yo + j) = F2(float16, *(__global const ufloat16 *)(pa + j), (float16)(vb));
            for (; j < run; j++) yo[j] = F2(float, pa[j], vb);
        } else if (sb.s0) {  // a is one value along the row
            __global const float *pb = b + rb + c;
            const float va = ascal ? av : a[ra];
            for (; j + 16 <= run; j += 16)
                *(__global ufloat16 *)(yo + j) = F2(float16, (float16)(va), *(__global const ufloat16 *)(pb + j));
            for (; j < run; j++) yo[j] = F2(float, va, pb[j]);
        } else {
            const float v = F2(float, ascal ? av : a[ra], bscal ? bv : b[rb]);
            for (; j < run; j++) yo[j] = v;
        }
        i += run;
    }
#else
    const int i = get_global_id(0);
    if (i >= n) return;
    const int L = shp.s0;
    int r = i / L;
    const int c = i - r * L;
    int ra = oa + c * sa.s0, rb = ob + c * sb.s0;
    ROW_OFFSETS
    const float va = ascal ? av : a[ra], vb = bscal ? bv : b[rb];
    y[i] = F2(float, va, vb);
#endif
}

// y = F1(x), both contiguous (n elements)
__kernel void ew1(const int n, __global const float *x, const float p0, const float p1, __global float *y,
                  const int chunk) {
#ifdef CPU
    const int i0 = get_global_id(0) * chunk, i1 = MIN(n, i0 + chunk);
    int i = i0;
    for (; i + 16 <= i1; i += 16)
        *(__global ufloat16 *)(y + i) = F1(float16, *(__global const ufloat16 *)(x + i));
    for (; i < i1; i++) y[i] = F1(float, x[i]);
#else
    const int i = get_global_id(0);
    if (i < n) y[i] = F1(float, x[i]);
#endif
}

// -- reductions (netcl.array_ops.REDUCE) ---------------------------------------------------------
// x (outer, R, inner) -> y (outer, inner): RED 0 the sum times `scale` (a mean: 1/R), 1 the maximum,
// 2 the minimum (NaN wins both, as in PyTorch); with want_idx, idx gets the first index along R of
// the maximum or minimum (an int). An empty R gives the sum 0 (the caller refuses max and min).
#if RED == 0
#define R_INIT 0.0f
#define R_BETTER(v, m) 0
#elif RED == 1
#define R_INIT -INFINITY
#define R_BETTER(v, m) ((v) > (m) || ((v) != (v) && (m) == (m)))
#else
#define R_INIT INFINITY
#define R_BETTER(v, m) ((v) < (m) || ((v) != (v) && (m) == (m)))
#endif

__kernel void reduce(const int outer, const int R, const int inner, __global const float *x, __global float *y,
                     __global int *idx, const int want_idx, const float scale, const int per) {
#ifdef CPU
    if (inner == 1) {  // a run of `per` rows, each summed in float16 lanes (the sum), or scanned
        const int o1 = MIN(outer, (int)get_global_id(0) * per + per);
        for (int o = get_global_id(0) * per; o < o1; o++) {
            __global const float *p = x + (long)o * R;
#if RED == 0
            float16 acc = 0.0f;
            int k = 0;
            for (; k + 16 <= R; k += 16) acc += *(__global const ufloat16 *)(p + k);
            float s = hsum16(acc);
            for (; k < R; k++) s += p[k];
            y[o] = s * scale;
#else
            float m = R_INIT;
            int at = 0;
            for (int k = 0; k < R; k++) {
                const float v = p[k];
                if (R_BETTER(v, m)) {
                    m = v;
                    at = k;
                }
            }
            y[o] = m;
            if (want_idx) idx[o] = at;
#endif
        }
        return;
    }
    // a work-item per (o, block of 16 columns): the rows of the block walked down R, 16 lanes at once
    const int blocks = (inner + 15) / 16, o = get_global_id(0) / blocks, c0 = (get_global_id(0) % blocks) * 16;
    if (o >= outer) return;
    __global const float *p = x + (long)o * R * inner + c0;
    if (c0 + 16 <= inner) {
        float16 m = R_INIT;
#if RED != 0
        int16 at = 0;
#endif
        for (int k = 0; k < R; k++) {
            const float16 v = *(__global const ufloat16 *)(p + (long)k * inner);
#if RED == 0
            m += v;
#else
            const int16 better = R_BETTER(v, m);
            m = better ? v : m;
            at = better ? (int16)(k) : at;
#endif
        }
#if RED == 0
        *(__global ufloat16 *)(y + (long)o * inner + c0) = m * scale;
#else
        *(__global ufloat16 *)(y + (long)o * inner + c0) = m;
        if (want_idx) *(__global uint16v *)(idx + (long)o * inner + c0) = at;
#endif
        return;
    }
    for (int c = c0; c < inner; c++) {  // the last, partial block
        float m = R_INIT;
        int at = 0;
        for (int k = 0; k < R; k++) {
            const float v = p[(long)k * inner + c - c0];
#if RED == 0
            m += v;
#else
            if (R_BETTER(v, m)) {
                m = v;
                at = k;
            }
#endif
        }
        y[(long)o * inner + c] = RED == 0 ? m * scale : m;
        if (RED != 0 && want_idx) idx[(long)o * inner + c] = at;
    }
#else
    // a work-group of 64 per output element: a strided walk of R, then a tree over the group
    __local float lm[64];
    __local int li[64];
    const int t = get_local_id(0), g = get_group_id(0), o = g / inner, c = g - o * inner;
    __global const float *p = x + (long)o * R * inner + c;
    float m = R_INIT;
    int at = 0;
    for (int k = t; k < R; k += 64) {
        const float v = p[(long)k * inner];
#if RED == 0
        m += v;
#else
        if (R_BETTER(v, m)) {
            m = v;
            at = k;
        }
#endif
    }
    lm[t] = m;
    li[t] = at;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int w = 32; w > 0; w >>= 1) {
        if (t < w) {
#if RED == 0
            lm[t] += lm[t + w];
#else
            const float v = lm[t + w];
            const int k = li[t + w];
            // the earlier index wins a tie (first occurrence, as PyTorch)
            if (R_BETTER(v, lm[t]) || (v == lm[t] && k < li[t])) {
                lm[t] = v;
                li[t] = k;
            }
#endif
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (t == 0 && o < outer) {
        y[g] = RED == 0 ? lm[0] * scale : lm[0];
        if (RED != 0 && want_idx) idx[g] = li[0];
    }
#endif
}

// -- strided copies -------------------------------------------------------------------------------
// dst[do + sum c_k ds_k] (+)= src[so + sum c_k ss_k] over the index space shp (innermost first):
// transpose and permute, slices and their gradients, concatenation, broadcasting a tensor out.
#undef OUTER_DIM
#define OUTER_DIM(k)                           \
    if (nd > k) {                              \
        const int c_ = r % shp.s##k;           \
        r /= shp.s##k;                         \
        rs += c_ * ss.s##k;                    \
        rd += c_ * ds.s##k;                    \
    }

__kernel void copy_nd(const int n, const int nd, const int8 shp, __global const float *src, const int8 ss,
                      const int so, __global float *dst, const int8 ds, const int dof, const int acc,
                      const int chunk) {
#ifdef CPU
    const int L = shp.s0, i1 = MIN(n, (int)get_global_id(0) * chunk + chunk);
    int i = get_global_id(0) * chunk;
    while (i < i1) {
        int r = i / L;
        const int c = i - r * L, run = MIN(L - c, i1 - i);
        int rs = so + c * ss.s0, rd = dof + c * ds.s0;
        OUTER_DIM(1) OUTER_DIM(2) OUTER_DIM(3) OUTER_DIM(4) OUTER_DIM(5) OUTER_DIM(6) OUTER_DIM(7)
        __global const float *ps = src + rs;
        __global float *pd = dst + rd;
        const int s0 = ss.s0, d0 = ds.s0;
        if (acc)
            for (int j = 0; j < run; j++) pd[j * d0] += ps[j * s0];
        else if (s0 == 1 && d0 == 1)
            for (int j = 0; j < run; j++) pd[j] = ps[j];
        else
            for (int j = 0; j < run; j++) pd[j * d0] = ps[j * s0];
        i += run;
    }
#else
    const int i = get_global_id(0);
    if (i >= n) return;
    const int L = shp.s0;
    int r = i / L;
    const int c = i - r * L;
    int rs = so + c * ss.s0, rd = dof + c * ds.s0;
    OUTER_DIM(1) OUTER_DIM(2) OUTER_DIM(3) OUTER_DIM(4) OUTER_DIM(5) OUTER_DIM(6) OUTER_DIM(7)
    if (acc)
        dst[rd] += src[rs];
    else
        dst[rd] = src[rs];
#endif
}

// -- indices ----------------------------------------------------------------------------------------
// y[o, j] = x[o, idx[o, j], j] over x (outer, C, inner) and int indices idx (outer, inner): the
// class scores a target picks (nll_loss). An index outside [0, C) picks 0 (the host checks what it can).
__kernel void take(const int n, const int C, const int inner, __global const float *x, __global const int *idx,
                   __global float *y) {
    const int i = get_global_id(0);
    if (i >= n) return;
    const int o = i / inner, j = i - o * inner, k = idx[i];
    y[i] = (k >= 0 && k < C) ? x[((long)o * C + k) * inner + j] : 0.0f;
}

// dx[o, idx[o, j], j] += dy[o, j] into a dx that holds zeros or a gradient (each (o, j) one place)
__kernel void take_bwd(const int n, const int C, const int inner, __global const float *dy, __global const int *idx,
                       __global float *dx) {
    const int i = get_global_id(0);
    if (i >= n) return;
    const int o = i / inner, j = i - o * inner, k = idx[i];
    if (k >= 0 && k < C) dx[((long)o * C + k) * inner + j] += dy[i];
}

// y = x one element per work-item, between float and int (toward zero, as PyTorch's .int())
__kernel void int_to_float(const int n, __global const int *x, __global float *y) {
    const int i = get_global_id(0);
    if (i < n) y[i] = (float)x[i];
}

__kernel void float_to_int(const int n, __global const float *x, __global int *y) {
    const int i = get_global_id(0);
    if (i < n) y[i] = (int)x[i];
}
