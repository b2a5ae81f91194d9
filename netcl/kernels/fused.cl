// Fused inference kernels (netcl/jit.py). Each program is built for one layer: shapes and
// constants arrive as -D defines, so loops unroll and index arithmetic folds.
//
// conv_*: Conv2d with BatchNorm folded into its weights and bias, then the activation, then
// (POOL == 2) a 2x2/2 max-pool, all in one pass. The stored input and output planes may carry
// a zero border (IPB, OPB): a layer writes its output already padded for the next convolution,
// so that convolution loads without bounds checks.
//
// Common defines: C H W (input channels and size), K (output channels), KS STRIDE PAD, OH OW
// (convolution output), POOL (1 or 2), ACT (a netcl.act.Act code, kernels/act.h),
// SLOPE, IPB OPB (stored borders; IPB is 0 or PAD).

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)

#include "act.h"
#define ACTF(v) ACT_APPLY(ACT, v, SLOPE)
// PoCL makes float8 fmax an out-of-line call; the vector ?: stays an inline blend
#define VMAX(a, b) ((a) > (b) ? (a) : (b))

#ifdef KS
#define R (C * KS * KS)      // reduction length
#define POH (OH / POOL)      // output size after the pool (floor, as MaxPool2d)
#define POW (OW / POOL)
#define IHS (H + 2 * IPB)    // stored input plane
#define IWS (W + 2 * IPB)
#define OHS (POH + 2 * OPB)  // stored output plane
#define OWS (POW + 2 * OPB)
#endif

#ifdef BM
// ---------------------------------------------------------------------------------------
// GPU: implicit GEMM out[k][pixel] = sum_r Wt[r][k] * im2col(x)[r][pixel]. A work-group
// computes a BM x BN tile through local memory, BK reduction rows at a time; each work-item a
// RM x RN register block. Columns are conv pixels; with POOL == 2 a work-item's RN = 4 columns
// are one 2x2 pool window, so the pool is a max over its registers. SPLIT > 1 splits the
// reduction over get_group_id(2); the last work-group of a tile to finish (atomic counter)
// sums the partials in a fixed order and runs the epilogue.
#define TX (BN / RN)
#define TY (BM / RM)
#define NT (TX * TY)
#define Q (POOL * POOL)
#define KP (((K + BM - 1) / BM) * BM)

__kernel __attribute__((reqd_work_group_size(NT, 1, 1)))
void conv_gpu(const int nout, __global const float *x, __global const float *wt, __global const float *bias,
              __global float *y, __global float *part, __global int *counters) {
    __local float As[BK][BM];
    __local float Bs[BK][BN];
    __local int last;
    const int tid = get_local_id(0), tx = tid % TX, ty = tid / TX;
    const int m0 = get_group_id(1) * BM;
    const int o0 = get_group_id(0) * (BN / Q);  // first output pixel of the tile

    // this work-item's B-loading column: fixed for the whole reduction
    const int bcol = tid % BN;
    int o = min(o0 + bcol / Q, nout - 1);
    const int n = o / (POH * POW), pp = o % (POH * POW);
#if POOL == 2
    const int sub = bcol % 4;
    const int oh = (pp / POW) * 2 + sub / 2, ow = (pp % POW) * 2 + sub % 2;
#else
    const int oh = pp / OW, ow = pp % OW;
#endif
    const int ih0 = oh * STRIDE - PAD, iw0 = ow * STRIDE - PAD;
    __global const float *xb = x + n * (C * IHS * IWS) + (ih0 + IPB) * IWS + (iw0 + IPB);

    float acc[RM][RN];
    for (int i = 0; i < RM; i++)
        for (int j = 0; j < RN; j++) acc[i][j] = 0.0f;

    const int rbeg = get_group_id(2) * RCHUNK;
    for (int r0 = rbeg; r0 < rbeg + RCHUNK; r0 += BK) {
#pragma unroll
        for (int i = 0; i < BK * BM / NT; i++) {
            const int e = tid + i * NT;
            As[e / BM][e % BM] = wt[(r0 + e / BM) * KP + m0 + e % BM];
        }
#pragma unroll
        for (int i = 0; i < BK * BN / NT; i++) {
            const int kk = tid / BN + i * (NT / BN);
            const int r = min(r0 + kk, R - 1);  // padded rows have zero weights
            const int c = r / (KS * KS), kh = (r / KS) % KS, kw = r % KS;
#if IPB == PAD
            Bs[kk][bcol] = xb[c * (IHS * IWS) + kh * IWS + kw];
#else
            const int ih = ih0 + kh, iw = iw0 + kw;
            Bs[kk][bcol] = (ih >= 0 && ih < H && iw >= 0 && iw < W) ? xb[c * (IHS * IWS) + kh * IWS + kw] : 0.0f;
#endif
        }
        barrier(CLK_LOCAL_MEM_FENCE);
#pragma unroll
        for (int kk = 0; kk < BK; kk++) {
            float a[RM], b[RN];
            for (int i = 0; i < RM; i++) a[i] = As[kk][ty * RM + i];
            for (int j = 0; j < RN; j++) b[j] = Bs[kk][tx * RN + j];
            for (int i = 0; i < RM; i++)
                for (int j = 0; j < RN; j++) acc[i][j] = fma(a[i], b[j], acc[i][j]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }

#if SPLIT > 1
    {
        const int tile = get_group_id(1) * get_num_groups(0) + get_group_id(0);
        const int ntile = get_num_groups(0) * get_num_groups(1);
        __global float *mine = part + ((get_group_id(2) * ntile + tile) * (RM * RN)) * NT + tid;
        for (int i = 0; i < RM; i++)
            for (int j = 0; j < RN; j++) mine[(i * RN + j) * NT] = acc[i][j];
        mem_fence(CLK_GLOBAL_MEM_FENCE);
        barrier(CLK_GLOBAL_MEM_FENCE | CLK_LOCAL_MEM_FENCE);
        if (tid == 0) last = atomic_inc(counters + tile) == SPLIT - 1;
        barrier(CLK_LOCAL_MEM_FENCE);
        if (!last) return;
        mem_fence(CLK_GLOBAL_MEM_FENCE);
        if (tid == 0) counters[tile] = 0;  // ready for the next launch
        for (int i = 0; i < RM; i++)
            for (int j = 0; j < RN; j++) acc[i][j] = 0.0f;
        for (int s = 0; s < SPLIT; s++) {  // fixed order: the result does not depend on who came last
            volatile __global float *ps = part + ((s * ntile + tile) * (RM * RN)) * NT + tid;
            for (int i = 0; i < RM; i++)
                for (int j = 0; j < RN; j++) acc[i][j] += ps[(i * RN + j) * NT];
        }
    }
#endif

    for (int i = 0; i < RM; i++) {
        const int m = m0 + ty * RM + i;
        if (m >= K) break;
        const float bm = bias[m];
#if POOL == 2
        const int oo = o0 + tx;
        if (oo < nout) {
            float v = ACTF(acc[i][0] + bm);
            for (int j = 1; j < 4; j++) v = fmax(v, ACTF(acc[i][j] + bm));
            const int nn = oo / (POH * POW), q = oo % (POH * POW);
            y[(nn * K + m) * (OHS * OWS) + (q / POW + OPB) * OWS + q % POW + OPB] = v;
        }
#else
        for (int j = 0; j < RN; j++) {
            const int oo = o0 + tx * RN + j;
            if (oo >= nout) break;
            const int nn = oo / (OH * OW), q = oo % (OH * OW);
            y[(nn * K + m) * (OHS * OWS) + (q / OW + OPB) * OWS + q % OW + OPB] = ACTF(acc[i][j] + bm);
        }
#endif
    }
}
#endif  // BM

#ifdef VW
// ---------------------------------------------------------------------------------------
// CPU (PoCL): explicit vectors and register blocking. A work-item computes RM output
// channels x RR conv rows x VW adjacent conv columns (float<VW> accumulators); weights are
// scalar broadcasts from a [K/RM][R][RM] layout, inputs vector loads along a row.
// Global size (UW / VW, OHU / RR, N * KB), UW/OHU = conv columns/rows that are used.
#define VEC CAT(float, VW)
// unaligned vector loads and stores by dereference: PoCL's vloadN/fma on wide vectors are
// out-of-line calls (the vectors go through memory), plain operators stay in registers
typedef VEC __attribute__((aligned(4))) uvec;
#if STRIDE == 2
typedef CAT(float, VW2) __attribute__((aligned(4))) uvec2;
#endif
#define VLOAD(o, p) (*(const uvec *)(p))
#define VSTORE(v, o, p) (*(uvec *)(p) = (v))
#if STRIDE == 1
#define LOADX(p) (*(__global const uvec *)(p))
#else
#define LOADX(p) (*(__global const uvec2 *)(p)).even
#endif

__kernel __attribute__((reqd_work_group_size(LX, LY, 1)))
void conv_cpu(__global const float *restrict x, __global const float *restrict wb,
              __global const float *restrict bias, __global float *restrict y) {
    const int seg = get_global_id(0), rp = get_global_id(1), z = get_global_id(2);
    const int n = z / KB, kb = z % KB;
    const int ow0 = seg * VW, oh0 = rp * RR;
    VEC acc[RR][RM];
#pragma unroll
    for (int t = 0; t < RR; t++)
#pragma unroll
        for (int m = 0; m < RM; m++) acc[t][m] = (VEC)(0.0f);

    __global const float *xn = x + n * (C * IHS * IWS);
    __global const float *wk = wb + kb * (R * RM);
    for (int c = 0; c < C; c++) {
        __global const float *xc = xn + c * (IHS * IWS);
        __global const float *wc = wk + c * (KS * KS * RM);
#pragma unroll
        for (int t = 0; t < (RR - 1) * STRIDE + KS; t++) {  // input rows feeding RR output rows
            const int ih = oh0 * STRIDE - PAD + t;
#if IPB != PAD
            if (ih < 0 || ih >= H) continue;
#endif
#pragma unroll
            for (int kw = 0; kw < KS; kw++) {
                const int iw = ow0 * STRIDE - PAD + kw;
                VEC xv;
#if IPB == PAD
                xv = LOADX(xc + (ih + IPB) * IWS + iw + IPB);
#else
                if (iw >= 0 && iw + (VW - 1) * STRIDE < W) {
                    xv = LOADX(xc + ih * IWS + iw);
                } else {
                    float tmp[VW];
                    for (int l = 0; l < VW; l++) {
                        const int il = iw + l * STRIDE;
                        tmp[l] = (il >= 0 && il < W) ? xc[ih * IWS + il] : 0.0f;
                    }
                    xv = VLOAD(0, tmp);
                }
#endif
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
    }

#pragma unroll
    for (int m = 0; m < RM; m++) {
        const int k = kb * RM + m;
        if (k >= K) break;
        const float bm = bias[k];
        __global float *yk = y + (n * K + k) * (OHS * OWS);
#if POOL == 2
        const VEC v = fmax(ACTF(acc[0][m] + bm), ACTF(acc[1][m] + bm));
#if VW == 2
        yk[(rp + OPB) * OWS + seg + OPB] = fmax(v.s0, v.s1);
#else
        typedef CAT(float, VWH) __attribute__((aligned(4))) uhvec;
        *(__global uhvec *)(yk + (rp + OPB) * OWS + ow0 / 2 + OPB) = fmax(v.even, v.odd);
#endif
#else
#pragma unroll
        for (int r = 0; r < RR; r++) *(__global uvec *)(yk + (oh0 + r + OPB) * OWS + ow0 + OPB) = ACTF(acc[r][m] + bm);
#endif
    }
}
#endif  // VW

#ifdef TB
// ---------------------------------------------------------------------------------------
// CPU (PoCL): Winograd F(WM x WM, 3x3) for 3x3 stride-1 convolutions, WM = 2 or 4: an output
// tile of WM x WM costs WA * WA (WA = WM + 2) multiplies per (input, output) channel pair
// instead of 9 * WM * WM (2.25x fewer for WM = 2, 4x for WM = 4). With POOL == 2 a tile holds
// whole 2x2 pool windows, so the pool is a max inside the tile.
// The weights arrive transformed on the host (U = G g G^T, the same fold that folds the batch
// norm) as [KBN][NXI][C][KV], KV = RV * 8 output channels per block, zero-padded past K.
// A work-item owns TT tiles (flattened over batch and tile rows, so any image size fills the
// block) and KBW blocks of KV output channels (get_global_id(1) picks which). It transforms its
// tiles' inputs once, V = B^T d B for every channel, into private memory; then for each channel
// block and each transform point it runs TB x RV register blocks (scalar broadcasts of V,
// float8 loads of U, reused from cache by the TT / TB sub-blocks), and ends with Y = A^T M A,
// bias, activation and the pool.
// Defines beyond the common ones: WM TB TT RV KBW KBN, TWN THN (tiles per row / column),
// NTILE (tiles in the whole batch), CHECK (1: input loads need bounds checks).
#define KV (RV * 8)
#define WA (WM + 2)
#define NXI (WA * WA)
#define UOH (POOL == 2 ? 2 * POH : OH)  // conv output rows / columns that are used
#define UOW (POOL == 2 ? 2 * POW : OW)
typedef float8 __attribute__((aligned(4))) uvec8;

// 1-D transforms; a 2-D transform is one along rows, then one along columns
#if WM == 2
#define WIN_IN(d, v) do { v[0] = d[0] - d[2]; v[1] = d[1] + d[2]; v[2] = d[2] - d[1]; v[3] = d[1] - d[3]; } while (0)
#define WIN_OUT(m, o) do { o[0] = m[0] + m[1] + m[2]; o[1] = m[1] - m[2] - m[3]; } while (0)
#else
#define WIN_IN(d, v) do { \
    v[0] = 4.0f * d[0] - 5.0f * d[2] + d[4];           v[1] = d[3] + d[4] - 4.0f * (d[1] + d[2]); \
    v[2] = 4.0f * (d[1] - d[2]) + d[4] - d[3];          v[3] = 2.0f * (d[3] - d[1]) + d[4] - d[2]; \
    v[4] = 2.0f * (d[1] - d[3]) + d[4] - d[2];          v[5] = 4.0f * d[1] - 5.0f * d[3] + d[5]; } while (0)
#define WIN_OUT(m, o) do { \
    const float8 a_ = m[1] + m[2], b_ = m[1] - m[2], c_ = m[3] + m[4], d_ = m[3] - m[4]; \
    o[0] = m[0] + a_ + c_; o[1] = b_ + 2.0f * d_; o[2] = a_ + 4.0f * c_; o[3] = b_ + 8.0f * d_ + m[5]; } while (0)
#endif

__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void conv_wino(__global const float *restrict x, __global const float *restrict u,
               __global const float *restrict bias, __global float *restrict y) {
    const int g0 = get_global_id(0) * TT;
    float v[NXI][C][TT];  // transformed inputs of this work-item's tiles
    int ty[TT], tx[TT], tn[TT];

    for (int t = 0; t < TT; t++) {
        const int g = min(g0 + t, NTILE - 1);
        tn[t] = g0 + t < NTILE ? g / (THN * TWN) : -1;
        ty[t] = (g / TWN) % THN, tx[t] = g % TWN;
        const int ih0 = WM * ty[t] - PAD, iw0 = WM * tx[t] - PAD;
        __global const float *xn = x + (g / (THN * TWN)) * (C * IHS * IWS) + (ih0 + IPB) * IWS + iw0 + IPB;
        for (int c = 0; c < C; c++) {
            __global const float *xc = xn + c * (IHS * IWS);
            float d[WA][WA], e[WA][WA], col[WA], vc[WA];
#pragma unroll
            for (int i = 0; i < WA; i++) {
#pragma unroll
                for (int j = 0; j < WA; j++) {
#if CHECK
                    const int ih = ih0 + i, iw = iw0 + j;
                    col[j] = (ih >= 0 && ih < H && iw >= 0 && iw < W) ? xc[i * IWS + j] : 0.0f;
#else
                    col[j] = xc[i * IWS + j];
#endif
                }
                WIN_IN(col, d[i]);  // along the row
            }
#pragma unroll
            for (int j = 0; j < WA; j++) {
#pragma unroll
                for (int i = 0; i < WA; i++) col[i] = d[i][j];
                WIN_IN(col, vc);  // along the column
#pragma unroll
                for (int i = 0; i < WA; i++) v[i * WA + j][c][t] = vc[i];
            }
        }
    }

    for (int kb = get_global_id(1) * KBW; kb < min(KBN, (int)(get_global_id(1) + 1) * KBW); kb++) {
        float8 m[NXI][TT][RV];
        __global const float *ub = u + kb * (NXI * C * KV);
        for (int xi = 0; xi < NXI; xi++)
        for (int t0 = 0; t0 < TT; t0 += TB) {
            float8 acc[TB][RV];
#pragma unroll
            for (int t = 0; t < TB; t++)
#pragma unroll
                for (int r = 0; r < RV; r++) acc[t][r] = (float8)(0.0f);
            __global const float *uc = ub + xi * (C * KV);
            for (int c = 0; c < C; c++) {
#pragma unroll
                for (int r = 0; r < RV; r++) {
                    const float8 ur = *(__global const uvec8 *)(uc + c * KV + r * 8);
#pragma unroll
                    for (int t = 0; t < TB; t++) acc[t][r] += v[xi][c][t0 + t] * ur;
                }
            }
#pragma unroll
            for (int t = 0; t < TB; t++)
#pragma unroll
                for (int r = 0; r < RV; r++) m[xi][t0 + t][r] = acc[t][r];
        }
        for (int r = 0; r < RV; r++) {
            const int k0 = kb * KV + r * 8;
            const float8 bk = *(__global const uvec8 *)(bias + k0);
            for (int t = 0; t < TT; t++) {
                if (tn[t] < 0) continue;
                float8 s[WM][WA], col[WA], o[WM][WM], oc[WM];
#pragma unroll
                for (int j = 0; j < WA; j++) {
#pragma unroll
                    for (int i = 0; i < WA; i++) col[i] = m[i * WA + j][t][r];
                    WIN_OUT(col, oc);  // along the column
#pragma unroll
                    for (int i = 0; i < WM; i++) s[i][j] = oc[i];
                }
#pragma unroll
                for (int i = 0; i < WM; i++) {
                    WIN_OUT(s[i], oc);  // along the row
#pragma unroll
                    for (int j = 0; j < WM; j++) o[i][j] = ACTF(oc[j] + bk);
                }
#if POOL == 2
#define PM (WM / 2)
                __global float *yt = y + (tn[t] * K + k0) * (OHS * OWS) + (PM * ty[t] + OPB) * OWS + PM * tx[t] + OPB;
#pragma unroll
                for (int i = 0; i < PM; i++)
#pragma unroll
                    for (int j = 0; j < PM; j++) {
                        if (PM * ty[t] + i >= POH || PM * tx[t] + j >= POW) continue;
                        const float8 p = VMAX(VMAX(o[2 * i][2 * j], o[2 * i][2 * j + 1]),
                                              VMAX(o[2 * i + 1][2 * j], o[2 * i + 1][2 * j + 1]));
                        const float pv[8] = {p.s0, p.s1, p.s2, p.s3, p.s4, p.s5, p.s6, p.s7};
#pragma unroll
                        for (int l = 0; l < 8; l++)
                            if (k0 + l < K) yt[l * (OHS * OWS) + i * OWS + j] = pv[l];
                    }
#else
                __global float *yt = y + (tn[t] * K + k0) * (OHS * OWS) + (WM * ty[t] + OPB) * OWS + WM * tx[t] + OPB;
#pragma unroll
                for (int i = 0; i < WM; i++)
#pragma unroll
                    for (int j = 0; j < WM; j++) {
                        if (WM * ty[t] + i >= OH || WM * tx[t] + j >= OW) continue;
                        const float ov[8] = {o[i][j].s0, o[i][j].s1, o[i][j].s2, o[i][j].s3,
                                             o[i][j].s4, o[i][j].s5, o[i][j].s6, o[i][j].s7};
#pragma unroll
                        for (int l = 0; l < 8; l++)
                            if (k0 + l < K) yt[l * (OHS * OWS) + i * OWS + j] = ov[l];
                    }
#endif
            }
        }
    }
}
#endif  // TB

#ifdef IN_F
// ---------------------------------------------------------------------------------------
// Linear + activation: y[row][j] = act(b[j] + sum_i x[row][i] * W[i][j]), W stored (in, out).
// Each work-item computes LJ adjacent outputs of one row.
__kernel void linear(const int rows, __global const float *restrict x, __global const float *restrict w,
                     __global const float *restrict b, __global float *restrict y) {
    const int j0 = get_global_id(0) * LJ, row = get_global_id(1);
    if (j0 >= OUT_F || row >= rows) return;
    float acc[LJ];
    for (int j = 0; j < LJ; j++) acc[j] = 0.0f;
    __global const float *xr = x + row * IN_F;
    for (int i = 0; i < IN_F; i++) {
        const float xv = xr[i];
        __global const float *wr = w + i * OUT_P + j0;  // OUT_P: out padded to LJ, zeros beyond OUT_F
#pragma unroll
        for (int j = 0; j < LJ; j++) acc[j] = fma(xv, wr[j], acc[j]);
    }
    for (int j = 0; j < LJ; j++)
        if (j0 + j < OUT_F) y[row * OUT_F + j0 + j] = ACTF(acc[j] + b[j0 + j]);
}
#endif
