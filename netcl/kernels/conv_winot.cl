// Fused conv, CPU Winograd F(2x2, 3x3) with tiles in the vector lanes (netcl/jit/conv_wino.py,
// ConvWinoT), for 3x3 stride-1 convolutions with padding 1 whose input carries its zero border.
#include "act.h"
#include "conv.h"
#include "vec_cpu.h"

// conv_wino.cl puts output channels in its float8 lanes and transforms each tile's inputs in
// scalars: at 16 to 64 channels its transforms and half-wide vectors cost more than the 2.25x
// fewer multiplies save on AVX-512. Here the 16 lanes of a float16 are 16 output tiles of 2x2:
// a tile row (TW = OW / 2 >= 16 tiles: VPR vectors per tile row) or T = 16 / TW tile rows
// (8x8 and 16x16 outputs: T = 4 and 2). The input transform V = B^T d B is 16 vector adds per
// channel on stride-2 vector loads, the products are U[point][k][c] (transformed on the host)
// broadcast against V[point][c] (the direct kernel's shape: a scalar weight times a vector of
// positions), 16 x C x K of them per vector instead of 36 x C x K, and the output transform
// Y = A^T M A, bias, activation, residual and border are vector operations and shuffles.
// A work-item owns one vector of tiles of one image for every output channel: it transforms its
// C channels once into private memory (16 x C float16), then for each block of KV output
// channels accumulates the 16 points (KV float16 accumulators) and writes KV x 4 output vectors.
// Defines beyond conv.h's: TW (tiles per tile row), T (tile rows per vector), VPR (vectors per
// tile row), KV (output channels per block: 16 or 8), KB (blocks; weights zero past K).

// 16 lanes of input row offset i (0..3, from the tile's top row - 1) and column offset j (0..3,
// from its left column - 1): x[2 * row_of_lane - 1 + i][2 * col_of_lane - 1 + j], T pieces of
// 16 / T lanes, each the even elements of a stretch of one row (vec_cpu.h's EVEN_LOAD).
#if T == 1
#define LOADT(p) EVEN_LOAD(ufloat16, 16, p)
#elif T == 2  // tile rows two input rows apart
#define LOADT(p) JOIN_HALVES(16, EVEN_LOAD(ufloat8, 8, p), EVEN_LOAD(ufloat8, 8, (p) + 2 * IWS))
#else
#define LOADT(p) JOIN_HALVES(16, JOIN_HALVES(8, EVEN_LOAD(ufloat4, 4, p), EVEN_LOAD(ufloat4, 4, (p) + 2 * IWS)), \
                             JOIN_HALVES(8, EVEN_LOAD(ufloat4, 4, (p) + 4 * IWS), EVEN_LOAD(ufloat4, 4, (p) + 6 * IWS)))
#endif

// 32 interleaved outputs (a0, b0, a1, b1, ..) of lanes 0-7 and 8-15 of a, b: output columns 2t, 2t + 1
#define ZLO(a, b) __builtin_shufflevector(a, b, 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23)
#define ZHI(a, b) __builtin_shufflevector(a, b, 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31)

// one output row's 32 values z0, z1 (ZLO, ZHI) of output rows row, row + 2, .. (T tile rows):
// bias and activation applied, the residual added, stored
#if T <= 2  // z1: the row's second half (T 1), or tile row 1's (T 2: two output rows below)
#define Z1_ROW (T == 2 ? 2 : 0)
#define Z1_COL (T == 1 ? 16 : 0)
#define STORE_ROW(z0, z1, n, k, row, col)                                                             \
    do {                                                                                              \
        float16 a_ = z0, b_ = z1;                                                                     \
        if (RES) {                                                                                    \
            a_ = ACT2F(a_ + *(__global const ufloat16 *)(res + RES_AT(n, k, row, col)));              \
            b_ = ACT2F(b_ + *(__global const ufloat16 *)(res + RES_AT(n, k, (row) + Z1_ROW, (col) + Z1_COL))); \
        }                                                                                             \
        *(__global ufloat16 *)(y + OUT_AT(n, k, row, col)) = a_;                                      \
        *(__global ufloat16 *)(y + OUT_AT(n, k, (row) + Z1_ROW, (col) + Z1_COL)) = b_;                \
    } while (0)
#else
#define STORE_ROW(z0, z1, n, k, row, col)                                                   \
    do {                                                                                    \
        float8 p_[4] = {(z0).lo, (z0).hi, (z1).lo, (z1).hi};                               \
        _Pragma("unroll") for (int q_ = 0; q_ < 4; q_++) {                                  \
            float8 a_ = p_[q_];                                                             \
            if (RES) a_ = ACT2F(a_ + *(__global const ufloat8 *)(res + RES_AT(n, k, (row) + 2 * q_, col))); \
            *(__global ufloat8 *)(y + OUT_AT(n, k, (row) + 2 * q_, col)) = a_;              \
        }                                                                                   \
    } while (0)
#endif

__kernel __attribute__((reqd_work_group_size(1, 1, 1))) __attribute__((min_vector_width(512)))
void conv_winot(__global const float *restrict x, __global const float *restrict u,
                __global const float *restrict bias, __global float *restrict y, __global const float *restrict res) {
    const int g = get_global_id(0), n = get_global_id(1);
    const int tr0 = (g / VPR) * T, tc0 = (g % VPR) * 16;  // the vector's first tile row and column
    const int oh0 = 2 * tr0, ow0 = 2 * tc0;              // its first output row and column
    float16 v[16][C];

    __global const float *xb = x + n * (C * IHS * IWS) + (oh0 - 1 + IPB) * IWS + ow0 - 1 + IPB;
    for (int c = 0; c < C; c++) {
        __global const float *xc = xb + c * (IHS * IWS);
        float16 t[4][4];
#pragma unroll
        for (int i = 0; i < 4; i++) {  // along each row: B^T over j
            const float16 d0 = LOADT(xc + i * IWS), d1 = LOADT(xc + i * IWS + 1);
            const float16 d2 = LOADT(xc + i * IWS + 2), d3 = LOADT(xc + i * IWS + 3);
            t[i][0] = d0 - d2, t[i][1] = d1 + d2, t[i][2] = d2 - d1, t[i][3] = d1 - d3;
        }
#pragma unroll
        for (int j = 0; j < 4; j++) {  // along each column: B^T over i
            v[0 * 4 + j][c] = t[0][j] - t[2][j];
            v[1 * 4 + j][c] = t[1][j] + t[2][j];
            v[2 * 4 + j][c] = t[2][j] - t[1][j];
            v[3 * 4 + j][c] = t[1][j] - t[3][j];
        }
    }

    for (int kb = 0; kb < KB; kb++) {
        float16 m[16][KV];
        for (int p = 0; p < 16; p++) {
            float16 acc[KV];
#pragma unroll
            for (int q = 0; q < KV; q++) acc[q] = 0.0f;
            __global const float *up = u + (kb * 16 + p) * (C * KV);
            for (int c = 0; c < C; c++) {
                const float16 vc = v[p][c];
#pragma unroll
                for (int q = 0; q < KV; q++) acc[q] += up[c * KV + q] * vc;
            }
#pragma unroll
            for (int q = 0; q < KV; q++) m[p][q] = acc[q];
        }
        for (int q = 0; q < KV; q++) {
            const int k = kb * KV + q;
            if (k >= K) break;
            float16 s[2][4];  // A^T M over the rows, then M A over the columns
#pragma unroll
            for (int j = 0; j < 4; j++) {
                s[0][j] = m[0 * 4 + j][q] + m[1 * 4 + j][q] + m[2 * 4 + j][q];
                s[1][j] = m[1 * 4 + j][q] - m[2 * 4 + j][q] - m[3 * 4 + j][q];
            }
            const float bk = bias[k];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const float16 y0 = ACTF(s[i][0] + s[i][1] + s[i][2] + bk);
                const float16 y1 = ACTF(s[i][1] - s[i][2] - s[i][3] + bk);
                STORE_ROW(ZLO(y0, y1), ZHI(y0, y1), n, k, oh0 + i, ow0);
            }
        }
    }
}

// The training path's weights (netcl.nn.conv, its weights change every step, so transformed on
// the device): U[kb][p][c][KV] = G g G^T (p = 4a + b, G as conv_wino.py's _WINO_G[2]) for output
// channel k (zeros from K to KB * KV) and input channel c of the convolution conv_winot runs,
// g = w[k][c] (flip 0: that convolution's weights (K, C, 3, 3)), or w[c][k] turned by 180 degrees
// (flip 1: the data gradient of a convolution with weights (C, K, 3, 3)). Work-item (k, c).
__kernel void winot_weights(__global const float *restrict w, __global float *restrict u, const int flip) {
    const int k = get_global_id(0), c = get_global_id(1);
    float g[3][3], t[4][3];
#pragma unroll
    for (int i = 0; i < 3; i++)
#pragma unroll
        for (int j = 0; j < 3; j++)
            g[i][j] = k >= K ? 0.0f : flip ? w[((c * K + k) * 3 + 2 - i) * 3 + 2 - j] : w[((k * C + c) * 3 + i) * 3 + j];
#pragma unroll
    for (int j = 0; j < 3; j++) {  // G g
        t[0][j] = g[0][j];
        t[1][j] = 0.5f * (g[0][j] + g[1][j] + g[2][j]);
        t[2][j] = 0.5f * (g[0][j] - g[1][j] + g[2][j]);
        t[3][j] = g[2][j];
    }
    __global float *uk = u + ((k / KV) * 16 * C + c) * KV + k % KV;
#pragma unroll
    for (int a = 0; a < 4; a++) {  // (G g) G^T
        uk[(4 * a + 0) * C * KV] = t[a][0];
        uk[(4 * a + 1) * C * KV] = 0.5f * (t[a][0] + t[a][1] + t[a][2]);
        uk[(4 * a + 2) * C * KV] = 0.5f * (t[a][0] - t[a][1] + t[a][2]);
        uk[(4 * a + 3) * C * KV] = t[a][2];
    }
}
