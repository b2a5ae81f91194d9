// Fused conv, CPU Winograd family (netcl/jit/conv_wino.py), for 3x3 stride-1 convolutions.
#include "act.h"
#include "conv.h"
#include "vec_cpu.h"

// CPU (PoCL): Winograd F(WM x WM, 3x3) for 3x3 stride-1 convolutions, WM = 2 or 4: an output
// tile of WM x WM costs WA * WA (WA = WM + 2) multiplies per (input, output) channel pair
// instead of 9 * WM * WM (2.25x fewer for WM = 2, 4x for WM = 4). With POOL == 2 a tile holds
// whole 2x2 pool windows, so the pool is a max inside the tile.
// The weights arrive transformed on the host (U = G g G^T, the same fold that folds the batch
// norm) as [KBN][NXI][C][KV], KV = RV * 8 output channels per block, zero-padded past K.
// A work-item owns TT tiles (flattened over batch and tile rows, so any image size fills the
// block) and kbw blocks of KV output channels (get_global_id(1) picks which). It transforms its
// tiles' inputs once, V = B^T d B for every channel, into private memory; then for each channel
// block and each transform point it runs TB x RV register blocks (scalar broadcasts of V,
// float8 loads of U, reused from cache by the TT / TB sub-blocks), and ends with Y = A^T M A,
// bias, activation and the pool.
// Defines beyond the common ones: WM TB TT RV KBN, TWN THN (tiles per row / column), CHECK (1:
// input loads need bounds checks). The batch-dependent sizes are arguments, so one program serves
// every batch size: ntile (tiles in the whole batch) and kbw (channel blocks per work-item).
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
void conv_wino(const int ntile, const int kbw, __global const float *restrict x, __global const float *restrict u,
               __global const float *restrict bias, __global float *restrict y, __global const float *restrict res) {
    const int g0 = get_global_id(0) * TT;
    float v[NXI][C][TT];  // transformed inputs of this work-item's tiles
    int ty[TT], tx[TT], tn[TT];

    for (int t = 0; t < TT; t++) {
        const int g = MIN(g0 + t, ntile - 1);
        tn[t] = g0 + t < ntile ? g / (THN * TWN) : -1;
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

    for (int kb = get_global_id(1) * kbw; kb < MIN(KBN, (int)(get_global_id(1) + 1) * kbw); kb++) {
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
                __global float *yt = y + OUT_AT(tn[t], k0, PM * ty[t], PM * tx[t]);
#pragma unroll
                for (int i = 0; i < PM; i++)
#pragma unroll
                    for (int j = 0; j < PM; j++) {
                        if (PM * ty[t] + i >= POH || PM * tx[t] + j >= POW) continue;
                        const float8 p0 = NAN_MAX(o[2 * i][2 * j], o[2 * i][2 * j + 1]);
                        const float8 p1 = NAN_MAX(o[2 * i + 1][2 * j], o[2 * i + 1][2 * j + 1]);
                        const float8 p = NAN_MAX(p0, p1);
                        const float pv[8] = {p.s0, p.s1, p.s2, p.s3, p.s4, p.s5, p.s6, p.s7};
#pragma unroll
                        for (int l = 0; l < 8; l++)
                            if (k0 + l < K) yt[l * (OHS * OWS) + i * OWS + j] = pv[l];
                    }
#else
                __global float *yt = y + OUT_AT(tn[t], k0, WM * ty[t], WM * tx[t]);
#pragma unroll
                for (int i = 0; i < WM; i++)
#pragma unroll
                    for (int j = 0; j < WM; j++) {
                        if (WM * ty[t] + i >= OH || WM * tx[t] + j >= OW) continue;
                        const float ov[8] = {o[i][j].s0, o[i][j].s1, o[i][j].s2, o[i][j].s3,
                                             o[i][j].s4, o[i][j].s5, o[i][j].s6, o[i][j].s7};
#pragma unroll
                        for (int l = 0; l < 8; l++)
                            if (k0 + l < K)
                                yt[l * (OHS * OWS) + i * OWS + j] = EPI(ov[l], tn[t], k0 + l, WM * ty[t] + i, WM * tx[t] + j);
                    }
#endif
            }
        }
    }
}
