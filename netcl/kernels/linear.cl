// Fused linear family (netcl/jit/linear.py): [LayerNorm +] Linear + activation [+ residual add +
// activation], built for one stage. Defines:
//   IN_F OUT_F          the Linear's sizes; W stored (IN_F, OUT_P), OUT_P = OUT_F padded to LJ (zeros)
//   LJ RB JW            each work-item: RB rows x JW vectors of LJ adjacent outputs (LJ = 4, 8 or 16),
//                       one vector at a time (the rows' LayerNorm statistics made once for JW vectors)
//   INNER               1: rows are contiguous; else the Linear runs along an inner axis (a Linear
//                       between two Transposes): row r = (o, i), x[o][k][i], y[o][j][i], i < INNER
//   LN LN_EPS           1: each row is normalised over IN_F first (the LayerNorm's weight and bias
//                       are folded into W and b); INNER is 1 then
//   ACT SLOPE           the activation (kernels/act.h); RES ACT2 SLOPE2: add res (y's layout), then ACT2
// PoCL vectorises explicit vectors, not loops across work-items (device/POCL.md): hence the
// register block of RB x LJ accumulators with one vector load of W per k and RB scalar broadcasts.
#include "act.h"
#include "linear.h"

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define VEC CAT(float, LJ)
#define VLOAD CAT(vload, LJ)
#define VSTORE CAT(vstore, LJ)

#if RES
#define EPI(v, i) ACT_APPLY(ACT2, (v) + res[i], SLOPE2)
#else
#define EPI(v, i) (v)
#endif

__kernel void linear(const int rows, __global const float *restrict x, __global const float *restrict w,
                     __global const float *restrict b, __global float *restrict y,
                     __global const float *restrict res) {
    const int jw0 = get_global_id(0) * JW * LJ, r0 = get_global_id(1) * RB;
    if (jw0 >= OUT_F || r0 >= rows) return;
    LIN_ROWS(r0, rows);
    for (int j0 = jw0; j0 < min(jw0 + JW * LJ, OUT_F); j0 += LJ) {
        VEC acc[RB];
        for (int rr = 0; rr < RB; rr++) acc[rr] = (VEC)(0.0f);
        for (int k = 0; k < IN_F; k++) {
            const VEC wv = VLOAD(0, w + (size_t)k * OUT_P + j0);
#pragma unroll
            for (int rr = 0; rr < RB; rr++) {
                const float xv = LIN_X(rr, k);
                acc[rr] = fma((VEC)(xv), wv, acc[rr]);
            }
        }
        const VEC bv = VLOAD(0, b + j0);
        for (int rr = 0; rr < RB && r0 + rr < rows; rr++) {
            const int r = r0 + rr;
            const size_t yo = (size_t)(r / INNER) * OUT_F * INNER + r % INNER;
            float t[LJ];
            VSTORE(ACT_APPLY(ACT, acc[rr] + bv, SLOPE), 0, t);
            for (int j = 0; j < LJ && j0 + j < OUT_F; j++) {
                const size_t i = yo + (size_t)(j0 + j) * INNER;
                y[i] = EPI(t[j], i);
            }
        }
    }
}
