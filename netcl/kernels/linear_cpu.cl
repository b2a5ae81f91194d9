// Fused linear family, CPU kernel (netcl/jit/linear.py): [LayerNorm +] Linear + activation
// [+ residual add + activation], the same stage as linear.cl's, register-blocked for PoCL.
// Defines: linear.cl's (IN_F OUT_F OUT_P INNER LN LN_EPS ACT SLOPE RES ACT2 SLOPE2), and
//   RB JV       each work-item a block of RB rows x JV float16 vectors of outputs (RB * JV
//               accumulators; W stored (IN_F, OUT_P), OUT_P = OUT_F padded to 16 with zeros)
//   NJ          output vector groups of JV per row (OUT_P / 16 / JV, rounded up)
// Work-item (g, s): output group g % NJ, row blocks s, s + gsize(1), ... (a few per work-item:
// PoCL pays a dispatch per work-group, more than a small block's arithmetic).
// Per k: JV vector loads of W and RB scalar broadcasts of x feed RB * JV multiply-adds. Vectors
// are dereferenced, never vloadN/vstoreN or fma() (PoCL makes those out-of-line calls through
// memory); -cl-mad-enable fuses the multiply-adds.
#include "act.h"
#include "linear.h"
#include "vec_cpu.h"

#if RES
#define EPI(v, i) ACT_APPLY(ACT2, (v) + res[i], SLOPE2)
#define EPIV(v, p) ACT_APPLY(ACT2, (v) + *(__global const ufloat16 *)(p), SLOPE2)
#else
#define EPI(v, i) (v)
#define EPIV(v, p) (v)
#endif

__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void linear_cpu(const int rows, __global const float *restrict x, __global const float *restrict w,
                __global const float *restrict b, __global float *restrict y, __global const float *restrict res) {
    const int j0 = get_global_id(0) * JV * 16;  // this group's first output
    const int jv_n = MIN(JV, (OUT_P - j0) / 16);  // its vectors (the last group may have fewer)
    for (int r0 = get_global_id(1) * RB; r0 < rows; r0 += get_global_size(1) * RB) {
        LIN_ROWS(r0, rows);
        float16 acc[RB][JV];
#pragma unroll
        for (int rr = 0; rr < RB; rr++)
#pragma unroll
            for (int v = 0; v < JV; v++) acc[rr][v] = (float16)(0.0f);
        __global const float *wk = w + j0;
        for (int k = 0; k < IN_F; k++, wk += OUT_P) {
            float16 wv[JV];
#pragma unroll
            for (int v = 0; v < JV; v++) wv[v] = v < jv_n ? *(__global const ufloat16 *)(wk + 16 * v) : (float16)(0.0f);
#pragma unroll
            for (int rr = 0; rr < RB; rr++) {
                const float xv = LIN_X(rr, k);
#pragma unroll
                for (int v = 0; v < JV; v++) acc[rr][v] += xv * wv[v];
            }
        }
#pragma unroll
        for (int v = 0; v < JV; v++) {
            const int j = j0 + 16 * v;
            if (v >= jv_n) break;
            const float16 bv = *(__global const ufloat16 *)(b + j);
#pragma unroll
            for (int rr = 0; rr < RB; rr++) {
                const int r = r0 + rr;
                if (r >= rows) break;
                const float16 t = ACT_APPLY(ACT, acc[rr][v] + bv, SLOPE);
#if INNER == 1
                __global float *yr = y + (size_t)r * OUT_F + j;
                if (j + 16 <= OUT_F) {
                    *(__global ufloat16 *)yr = EPIV(t, res + (size_t)r * OUT_F + j);
                    continue;
                }
#endif
                const size_t yo = (size_t)(r / INNER) * OUT_F * INNER + r % INNER;
                float tt[16];
                *(ufloat16 *)tt = t;
                for (int l = 0; l < 16 && j + l < OUT_F; l++) {
                    const size_t i = yo + (size_t)(j + l) * INNER;
                    y[i] = EPI(tt[l], i);
                }
            }
        }
    }
}
