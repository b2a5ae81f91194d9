// Fused conv, CPU direct family (netcl/jit/conv_cpu.py). Defines: conv.h's, and VW VWH
// (vector width, half of it) RM RR KB (register block, channel blocks) LX LY (work-group), MULT
// (0: dense; else depthwise with this channel multiplier, RM = 1: output channel kb reads input
// channel kb / MULT only, weights [K][KS * KS]), PACK (1, or 2: a vector holds two output rows of
// VWH columns, for rows too short to fill one: 8x8 planes in float16).
#include "act.h"
#include "conv.h"
#include "vec_cpu.h"

// CPU (PoCL): explicit vectors and register blocking. A work-item computes RM output
// channels x RR conv rows x VW adjacent conv columns (float<VW> accumulators); weights are
// scalar broadcasts from a [K/RM][R][RM] layout, inputs vector loads along a row.
// Global size (UW / VW, OHU / RR, N * KB), UW/OHU = conv columns/rows that are used.
#define VEC CAT(float, VW)
#ifndef PACK
#define PACK 1
#endif
// unaligned vector loads and stores by dereference: PoCL's vloadN/fma on wide vectors are
// out-of-line calls (the vectors go through memory), plain operators stay in registers
typedef VEC __attribute__((aligned(4))) uvec;
#define VLOAD(o, p) (*(const uvec *)(p))
#define VSTORE(v, o, p) (*(uvec *)(p) = (v))
// LOADX(p): VW input elements from p at the stride (LOADH: VWH of them, for PACK 2); at stride 2
// vec_cpu.h's EVEN_LOAD.
#if STRIDE == 1
#define LOADV(T, n, p) (*(__global const T *)(p))
#else
#define LOADV(T, n, p) EVEN_LOAD(T, n, p)
#endif
#define LOADX(p) LOADV(uvec, VW, p)
#if VW > 2
typedef CAT(float, VWH) __attribute__((aligned(4))) uhvec;
#define LOADH(p) LOADV(uhvec, VWH, p)
#endif
#define JOINH(a, b) JOIN_HALVES(VW, a, b)

// An unpadded input's first and last vector of a row at stride 1 (a model's first conv): the
// vector at iw = -s holds x[0 .. VW-1-s] behind s zeros, the one ending s past the row holds
// x[iw .. W-1] and s zeros: one load inside the row and one shuffle with a zero vector, for s = 1
// and 2 (3x3 and 5x5 kernels), instead of a lane-by-lane fallback. ZL1 / ZR1: lanes for s = 1.
#if STRIDE == 1 && IPB < PAD && VW >= 4
#if VW == 16
#define ZR1 16, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14
#define ZR2 16, 17, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13
#define ZL1 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16
#define ZL2 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17
#elif VW == 8
#define ZR1 8, 0, 1, 2, 3, 4, 5, 6
#define ZR2 8, 9, 0, 1, 2, 3, 4, 5
#define ZL1 1, 2, 3, 4, 5, 6, 7, 8
#define ZL2 2, 3, 4, 5, 6, 7, 8, 9
#else
#define ZR1 4, 0, 1, 2
#define ZR2 4, 5, 0, 1
#define ZL1 1, 2, 3, 4
#define ZL2 2, 3, 4, 5
#endif
#define EDGE_LOADS 1
#endif

__kernel __attribute__((reqd_work_group_size(LX, LY, 1)))
void conv_cpu(__global const float *restrict x, __global const float *restrict wb,
              __global const float *restrict bias, __global float *restrict y, __global const float *restrict res) {
    const int seg = get_global_id(0), rp = get_global_id(1), z = get_global_id(2);
    const int n = z / KB, kb = z % KB;
    const int ow0 = seg * (VW / PACK), oh0 = rp * (RR * PACK);
    VEC acc[RR][RM];
#pragma unroll
    for (int t = 0; t < RR; t++)
#pragma unroll
        for (int m = 0; m < RM; m++) acc[t][m] = (VEC)(0.0f);

#if MULT
    __global const float *xn = x + (n * C + kb / MULT) * (IHS * IWS);
    __global const float *wk = wb + kb * (KS * KS);
    for (int c = 0; c < 1; c++) {
#else
    __global const float *xn = x + n * (C * IHS * IWS);
    __global const float *wk = wb + kb * (R * RM);
    for (int c = 0; c < C; c++) {
#endif
        __global const float *xc = xn + c * (IHS * IWS);
        __global const float *wc = wk + c * (KS * KS * RM);
#if IPB >= PAD
        // the input carries its border: tap by tap, each weight broadcast once for the RR rows
        // (in row-major order, broadcasts reused across rows are what LLVM spills; the sums are the
        // same in the same order)
#pragma unroll
        for (int kh = 0; kh < KS; kh++) {
#pragma unroll
            for (int kw = 0; kw < KS; kw++) {
                VEC xv[RR];
#pragma unroll
                for (int r = 0; r < RR; r++) {
#if PACK == 2  // (netcl.jit.conv_cpu.cpu_block: no pool, dense) vector r holds rows oh0 + 2r, + 1
                    __global const float *xr = xc + ((oh0 + 2 * r) * STRIDE - PAD + kh + IPB) * IWS
                                                  + ow0 * STRIDE - PAD + kw + IPB;
                    xv[r] = JOINH(LOADH(xr), LOADH(xr + STRIDE * IWS));
#else
                    xv[r] = LOADX(xc + ((oh0 + r) * STRIDE - PAD + kh + IPB) * IWS + ow0 * STRIDE - PAD + kw + IPB);
#endif
                }
#pragma unroll
                for (int m = 0; m < RM; m++) {
                    const float wv = wc[(kh * KS + kw) * RM + m];
#pragma unroll
                    for (int r = 0; r < RR; r++) acc[r][m] += wv * xv[r];
                }
            }
        }
#else
#pragma unroll
        for (int t = 0; t < (RR - 1) * STRIDE + KS; t++) {  // input rows feeding RR output rows
            const int ih = oh0 * STRIDE - PAD + t;
            if (ih < 0 || ih >= H) continue;
#pragma unroll
            for (int kw = 0; kw < KS; kw++) {
                const int iw = ow0 * STRIDE - PAD + kw;
                VEC xv;
                if (iw >= 0 && iw + (VW - 1) * STRIDE < W) {
                    xv = LOADX(xc + ih * IWS + iw);
#if defined(EDGE_LOADS) && VW <= W
                } else if (iw == -1 || iw == -2) {
                    const VEC v = *(__global const uvec *)(xc + ih * IWS);
                    xv = iw == -1 ? __builtin_shufflevector(v, (VEC)(0.0f), ZR1)
                                  : __builtin_shufflevector(v, (VEC)(0.0f), ZR2);
                } else if (iw + VW == W + 1 || iw + VW == W + 2) {
                    const VEC v = *(__global const uvec *)(xc + ih * IWS + W - VW);
                    xv = iw + VW == W + 1 ? __builtin_shufflevector(v, (VEC)(0.0f), ZL1)
                                          : __builtin_shufflevector(v, (VEC)(0.0f), ZL2);
#endif
                } else {
                    float tmp[VW];
                    for (int l = 0; l < VW; l++) {
                        const int il = iw + l * STRIDE;
                        tmp[l] = (il >= 0 && il < W) ? xc[ih * IWS + il] : 0.0f;
                    }
                    xv = VLOAD(0, tmp);
                }
#pragma unroll
                for (int r = 0; r < RR; r++) {
                    const int kh = t - r * STRIDE;
                    if (kh >= 0 && kh < KS) {
#pragma unroll
                        for (int m = 0; m < RM; m++) acc[r][m] += wc[(kh * KS + kw) * RM + m] * xv;
                    }
                }
            }
        }
#endif
    }

#pragma unroll
    for (int m = 0; m < RM; m++) {
        const int k = kb * RM + m;
        if (k >= K) break;
        const float bm = bias[k];
        __global float *yk = y + (n * KT + KOFF + k) * (OHS * OWS);
#if POOL == 2
        const VEC v0 = ACTF(acc[0][m] + bm), v1 = ACTF(acc[1][m] + bm);
        const VEC v = NAN_MAX(v0, v1);
#if VW == 2
        yk[(rp + OPB) * OWS + seg + OPB] = NAN_MAX(v.s0, v.s1);
#else
        *(__global uhvec *)(yk + (rp + OPB) * OWS + ow0 / 2 + OPB) = NAN_MAX(v.even, v.odd);
#endif
#elif PACK == 2
#pragma unroll
        for (int r = 0; r < RR; r++) {
            VEC v = ACTF(acc[r][m] + bm);
            const int oh = oh0 + 2 * r;
#if RES
            v = ACT2F(v + JOINH(*(__global const uhvec *)(res + RES_AT(n, k, oh, ow0)),
                                *(__global const uhvec *)(res + RES_AT(n, k, oh + 1, ow0))));
#endif
            *(__global uhvec *)(yk + (oh + OPB) * OWS + ow0 + OPB) = v.lo;
            *(__global uhvec *)(yk + (oh + 1 + OPB) * OWS + ow0 + OPB) = v.hi;
        }
#else
#pragma unroll
        for (int r = 0; r < RR; r++) {
            VEC v = ACTF(acc[r][m] + bm);
#if RES
            v = ACT2F(v + *(__global const uvec *)(res + RES_AT(n, k, oh0 + r, ow0)));
#endif
            *(__global uvec *)(yk + (oh0 + r + OPB) * OWS + ow0 + OPB) = v;
        }
#endif
    }
}
