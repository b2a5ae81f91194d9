// Fused conv, CPU Winograd F(2x2, 3x3) with tiles in the vector lanes (netcl/jit/conv_wino.py,
// ConvWinoT), for 3x3 stride-1 convolutions with padding 1 whose input carries its zero border.
#include "act.h"
#include "conv.h"
#include "vec_cpu.h"

// conv_wino.cl puts output channels in its float8 lanes and transforms each tile's inputs in
// scalars: at 16 to 64 channels its transforms and half-wide vectors cost more than the 2.25x
// fewer multiplies save on AVX-512. Here the 16 lanes of a float16 are 16 output tiles of 2x2:
// a tile row (TW = OW / 2 >= 16 tiles: VPR vectors per tile row) or T = 16 / TW tile rows
// (8x8 and 16x16 outputs: T = 4 and 2). The input transform V = B^T d B is 32 vector adds and 16
// shuffles per channel on 16 vector loads (WINOT_BT), the products are U[point][k][c]
// (transformed on the host) broadcast against V[point][c] (the direct kernel's shape: a scalar weight times a vector of
// positions), 16 x C x K of them per vector instead of 36 x C x K, and the output transform
// Y = A^T M A, bias, activation, residual and border are vector operations and shuffles.
// A work-item owns one vector of tiles of one image for every output channel: it transforms its
// C channels once into private memory (16 x C float16), then for each block of KV output
// channels accumulates the 16 points (KV float16 accumulators) and writes KV x 4 output vectors.
// Defines beyond conv.h's: TW (tiles per tile row), T (tile rows per vector), VPR (vectors per
// tile row), KV (output channels per block: 16 or 8), KB (blocks; weights zero past K).

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

// the 32 inputs of a row (stride ws) from p of a tile vector's 16 tiles as two float16, tile q's
// two at lanes 2q and 2q + 1 of the pair (T rows of 32 / T, 2 (T = 2) or 4 (T = 4) rows apart)
#if T == 1
#define ROW_PAIR(p, ws, a, b) (a = *(__global const ufloat16 *)(p), b = *(__global const ufloat16 *)((p) + 16))
#elif T == 2
#define ROW_PAIR(p, ws, a, b) (a = *(__global const ufloat16 *)(p), b = *(__global const ufloat16 *)((p) + 2 * (ws)))
#else
#define ROW_PAIR(p, ws, a, b)                                                                                    \
    (a = JOIN_HALVES(16, *(__global const ufloat8 *)(p), *(__global const ufloat8 *)((p) + 2 * (ws))),          \
     b = JOIN_HALVES(16, *(__global const ufloat8 *)((p) + 4 * (ws)), *(__global const ufloat8 *)((p) + 6 * (ws))))
#endif
#define EVENS(a, b) __builtin_shufflevector(a, b, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30)
#define ODDS(a, b) __builtin_shufflevector(a, b, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31)

// B^T's row q (0..3) combines input rows BT_R0 + BT_S BT_R1 (row 0 - row 2, 1 + 2, 2 - 1, 1 - 3)
#define BT_R0(q) ((q) == 2 ? 2 : (q) == 0 ? 0 : 1)
#define BT_R1(q) ((q) <= 1 ? 2 : (q) == 2 ? 1 : 3)
#define BT_S(q) ((q) == 1 ? 1.0f : -1.0f)
// B^T over the columns of one transformed row, given its combined input row as the vector pairs
// from column 0 (ea, eb) and from column 2 (fa, fb): its 4 points at v(p0) .. v(p0 + 3)
#define BT_COLUMNS(ea, eb, fa, fb, v, p0)                                                              \
    do {                                                                                               \
        const float16 t0_ = EVENS(ea, eb), t1_ = ODDS(ea, eb), t2_ = EVENS(fa, fb), t3_ = ODDS(fa, fb); \
        v((p0) + 0) = t0_ - t2_, v((p0) + 1) = t1_ + t2_, v((p0) + 2) = t2_ - t1_, v((p0) + 3) = t1_ - t3_; \
    } while (0)

// V = B^T d B of one channel's 4 x 4 inputs of a tile vector's 16 tiles, from xc (its top left
// input, rows IWS apart), point p = 4 a + b at v(p): a row's 32 inputs loaded once for its 4
// column offsets (the even and odd lanes of two vector pairs), B^T's rows combined on the loaded
// vectors before the lanes are picked (16 loads, 16 shuffles, 32 adds)
#define WINOT_BT(xc, v)                                                                                     \
    do {                                                                                                  \
        float16 a_[4], b_[4], a2_[4], b2_[4]; /* rows 0-3 from column 0, and from column 2 */             \
        _Pragma("unroll") for (int r_ = 0; r_ < 4; r_++)                                                  \
            ROW_PAIR((xc) + r_ * IWS, IWS, a_[r_], b_[r_]), ROW_PAIR((xc) + r_ * IWS + 2, IWS, a2_[r_], b2_[r_]); \
        _Pragma("unroll") for (int q_ = 0; q_ < 4; q_++) { /* B^T over the rows, on the loaded pairs */   \
            const int r0_ = BT_R0(q_), r1_ = BT_R1(q_);                                                   \
            const float s_ = BT_S(q_);                                                                    \
            BT_COLUMNS(a_[r0_] + s_ * a_[r1_], b_[r0_] + s_ * b_[r1_], a2_[r0_] + s_ * a2_[r1_],          \
                       b2_[r0_] + s_ * b2_[r1_], v, 4 * q_);                                              \
        }                                                                                                 \
    } while (0)

// A over the columns of one row of dY's tiles (their even columns e, odd o): its 4 points at
// v(p0) .. v(p0 + 3)
#define A_COLUMNS(e, o, v, p0) (v((p0) + 0) = (e), v((p0) + 1) = (e) + (o), v((p0) + 2) = (e) - (o), v((p0) + 3) = -(o))

// RES_IN_PLACE: res is y (a data gradient added into the tensor it overwrites, each element read
// before it is written by the same work-item), so neither pointer is restrict.
#ifdef RES_IN_PLACE
#define RES_RESTRICT
#else
#define RES_RESTRICT restrict
#endif
// STATS 1 (training, no residual, no activation): a BatchNorm2d's batch-statistics parts of the
// output, 64 values a part (a work-item's for one channel): st[2 (k P + p)] their sum, st[2 (k P +
// p) + 1] their squared deviations from their own mean, p = n G + g of P = N G parts (norm.cl's
// layout: its bn_stats_finish combines them), so that the BatchNorm reads y once, not twice;
// STATS 0: st is not touched (the fused inference path passes its bias buffer).
#ifndef STATS
#define STATS 0
#endif
// WINOT_PREFETCH 1 (the training path's, netcl.convspec.winot_plain): after its own transforms a
// work-item prefetches the input rows of the next tile vector (g + 1, or the next image's first),
// so that, where the same thread runs that one next, they arrive during this one's products. A
// vector reads 2 T + 2 rows of each of C planes: C x (2 T + 2) short streams that the hardware's
// prefetchers do not follow. winot_plain's planes have a border of 1 (IPB 1, W even), so a row
// starts at an even float and its first, its last and (T 1) its 17th reach every cache line it
// spans. winot_wgrad's transforms (below) prefetch a plane ahead under the same switch. The
// results are the same bit for bit (what the prefetches buy: tuning.json's note on WINOT_PREFETCH).
// 0: none (the fused inference path, for which they are unmeasured).
#ifndef WINOT_PREFETCH
#define WINOT_PREFETCH 0
#endif
// prefetches of `rows` rows from p, ws apart, of last + 1 floats each (32 / T + 2 at most):
// at their first float, their last and (T 1) their 17th
#define PREFETCH_ROWS(p, ws, rows, last)                                   \
    do {                                                                   \
        _Pragma("unroll") for (int r_ = 0; r_ < (rows); r_++) {            \
            __global const float *pr_ = (p) + r_ * (ws);                   \
            PREFETCH(pr_), PREFETCH(pr_ + (last));                         \
            if (T == 1) PREFETCH(pr_ + 16);                                \
        }                                                                  \
    } while (0)
__kernel __attribute__((reqd_work_group_size(1, 1, 1))) __attribute__((min_vector_width(512)))
void conv_winot(__global const float *restrict x, __global const float *restrict u,
                __global const float *restrict bias, __global float *RES_RESTRICT y,
                __global const float *RES_RESTRICT res, __global float *restrict st) {
    const int g = get_global_id(0), n = get_global_id(1);
    const int tr0 = (g / VPR) * T, tc0 = (g % VPR) * 16;  // the vector's first tile row and column
    const int oh0 = 2 * tr0, ow0 = 2 * tc0;              // its first output row and column
    float16 v[16][C];

    __global const float *xb = x + n * (C * IHS * IWS) + (oh0 - 1 + IPB) * IWS + ow0 - 1 + IPB;
    for (int c = 0; c < C; c++) {
#define V_AT(p) v[p][c]
        WINOT_BT(xb + c * (IHS * IWS), V_AT);
#undef V_AT
    }

#if WINOT_PREFETCH
    {  // the next tile vector's rows, from its first column and its last (T 1: and the middle line)
        const int g1 = g + 1 < (int)get_global_size(0) ? g + 1 : 0, n1 = g1 ? n : n + 1;
        if (n1 < (int)get_global_size(1)) {
            const int oh1 = 2 * T * (g1 / VPR), ow1 = 32 * (g1 % VPR);
            __global const float *xn = x + n1 * (C * IHS * IWS) + (oh1 - 1 + IPB) * IWS + ow1 - 1 + IPB;
            for (int c = 0; c < C; c++) PREFETCH_ROWS(xn + c * (IHS * IWS), IWS, 2 * T + 2, 32 / T + 1);
        }
    }
#endif
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
            float16 z[4];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const float16 y0 = ACTF(s[i][0] + s[i][1] + s[i][2] + bk);
                const float16 y1 = ACTF(s[i][1] - s[i][2] - s[i][3] + bk);
                z[2 * i] = y0, z[2 * i + 1] = y1;
                STORE_ROW(ZLO(y0, y1), ZHI(y0, y1), n, k, oh0 + i, ow0);
            }
#if STATS  // the deviations' sum corrects the mean's rounding (norm.cl's bn_stats_part)
            const float sum = hsum16(z[0] + z[1] + z[2] + z[3]), mu = sum / 64.0f;
            const float16 d0 = z[0] - mu, d1 = z[1] - mu, d2 = z[2] - mu, d3 = z[3] - mu;
            const float sd = hsum16(d0 + d1 + d2 + d3), sq = hsum16(d0 * d0 + d1 * d1 + d2 * d2 + d3 * d3);
            __global float *o = st + 2 * ((k * (int)get_num_groups(1) + n) * (int)get_num_groups(0) + g);
            o[0] = sum, o[1] = sq - sd * sd / 64.0f;
#endif
        }
    }
}

// The training path's weights (netcl.nn.conv, its weights change every step, so transformed on
// the device): U[kb][p][c][KV] = G g G^T (p = 4a + b, G as conv_wino.py's _WINO_G[2]) for output
// channel k (zeros from K to KB * KV) and input channel c of the convolution conv_winot runs,
// g = w[k][c] (flip 0: that convolution's weights (K, C, 3, 3)), or w[c][k] turned by 180 degrees
// (flip 1: the data gradient of a convolution with weights (C, K, 3, 3)). Work-item (kb, c): the
// KV output channels of block kb in the lanes of a float16 (KV 8: float8), so that its 16 stores
// are whole vectors (a work-item per (k, c) would store 16 scalars 4 KiB apart).
// (Vectors through pointers to vec_cpu.h's unaligned types: vloadN and vstoreN are calls on PyPI's
// PoCL 3.0.)
#if KV == 16
#define VKV float16
#define UVKV ufloat16
#elif KV == 8
#define VKV float8
#define UVKV ufloat8
#else
#define VKV float4
#define UVKV ufloat4
#endif
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void winot_weights(__global const float *restrict w, __global float *restrict u, const int flip) {
    const int kb = get_global_id(0), c = get_global_id(1);
    float gl[9][KV];  // g's 9 taps of the block's output channels, lane by lane
    for (int q = 0; q < KV; q++) {
        const int k = kb * KV + q;
#pragma unroll
        for (int e = 0; e < 9; e++)
            gl[e][q] = k >= K ? 0.0f : flip ? w[(c * K + k) * 9 + 8 - e] : w[(k * C + c) * 9 + e];
    }
    VKV g[3][3], t[4][3];
#pragma unroll
    for (int e = 0; e < 9; e++) g[e / 3][e % 3] = *(UVKV *)gl[e];
#pragma unroll
    for (int j = 0; j < 3; j++) {  // G g
        t[0][j] = g[0][j];
        t[1][j] = 0.5f * (g[0][j] + g[1][j] + g[2][j]);
        t[2][j] = 0.5f * (g[0][j] - g[1][j] + g[2][j]);
        t[3][j] = g[2][j];
    }
    __global float *ub = u + (kb * 16 * C + c) * KV;  // point p at ub + p C KV
#pragma unroll
    for (int a = 0; a < 4; a++) {  // (G g) G^T
        *(__global UVKV *)(ub + (4 * a + 0) * C * KV) = t[a][0];
        *(__global UVKV *)(ub + (4 * a + 1) * C * KV) = 0.5f * (t[a][0] + t[a][1] + t[a][2]);
        *(__global UVKV *)(ub + (4 * a + 2) * C * KV) = 0.5f * (t[a][0] - t[a][1] + t[a][2]);
        *(__global UVKV *)(ub + (4 * a + 3) * C * KV) = t[a][2];
    }
}

// The training path's weight gradient of a 3x3 stride-1 padding-1 convolution of C -> K channels
// (netcl.nn.conv), the adjoint of the forward above: per tile, with M = (A dY A^T) . (B^T x B),
// dW = G^T (sum over the tiles of M) G. The sum over tiles is 16 small GEMMs (one per point p:
// M[p] (K x C) = D[p] (K x tiles) D[p] times X[p]^T) whose reduction runs along the vector lanes:
// 16 tiles per float16 laid out as the forward's (T, VPR). The N x NV tile vectors go in chunks of
// TV (zeros past nt); work-item w of nw takes chunks w, w + nw, .. in turn. Per chunk it transforms
// the vectors, all 16 points, into local memory (16 x (C + K) x TV float16, most of L2): a row's
// 32 inputs are loaded once for its 4 column offsets (the even and odd lanes of two vector pairs)
// and B^T's rows are combined on the loaded vectors before the lanes are picked, so that x costs
// 16 loads, 16 shuffles and 32 adds a channel and vector, dy 4 loads and 4 shuffles (a work-item
// per transformed row, each loading its input rows for itself, would cost about twice and four
// times that). Then for each point
// and 4 x 4 block of (k, c) it accumulates 16 float16 over the chunk (8-wide vectors: blocks of
// their own, below), adds their lanes (tree16: 15 two-vector steps, lane q = the total of
// accumulator q) and adds them to its sums, part[w][p][k / 4][c / 4][4 (k % 4) + c % 4].
// winot_wgrad_finish adds the work-items' sums in order and applies G. x: the input planes with
// their border (IPB); dy: (N, K) planes of dplane floats, rows dws apart, the first element at
// doff (a zero-bordered dy's border). Defines beyond winot_defines': TV (the program has these two
// kernels only with it); C and K multiples of 4.
#ifdef TV
#define NVI ((OH / 2 / T) * VPR)  // tile vectors per image
#define TVP (TV % 64 ? TV : TV + 1)  // a row of TV vectors 4 KiB long is a vector longer (L1 sets)
// point p's rows of x (c) and dy (k) at xs[p XPS + c TVP + v], ds[p DPS + k TVP + v]: the points a
// vector apart more than their rows, so that a vector's 16 stores do not share L1 sets
#define XPS (C * TVP + 1)
#define DPS (K * TVP + 1)
#define PTS (4 * ROWS)  // points a work-item takes: 16 (ROWS 4), or transformed row i's 4 (ROWS 1)
#define XS(p, c, v) xs[(p) * XPS + (c) * TVP + (v)]
#define DS(p, k, v) ds[(p) * DPS + (k) * TVP + (v)]

// the totals of 16 accumulators, lane q that of a[q]: each step adds two vectors' halves of
// their groups of lanes (16 -> 8 -> 4 -> 2 -> 1 partial sums per accumulator)
inline float16 tree16(float16 a[16]) {
    float16 b[8], c[4], d[2];
#pragma unroll
    for (int m = 0; m < 8; m++)
        b[m] = __builtin_shufflevector(a[2 * m], a[2 * m + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
               __builtin_shufflevector(a[2 * m], a[2 * m + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
#pragma unroll
    for (int m = 0; m < 4; m++)
        c[m] = __builtin_shufflevector(b[2 * m], b[2 * m + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
               __builtin_shufflevector(b[2 * m], b[2 * m + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
#pragma unroll
    for (int m = 0; m < 2; m++)
        d[m] = __builtin_shufflevector(c[2 * m], c[2 * m + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
               __builtin_shufflevector(c[2 * m], c[2 * m + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
    return __builtin_shufflevector(d[0], d[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
           __builtin_shufflevector(d[0], d[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}

// tile vector gv's image, and (oh0, ow0) its first output row and column
inline int vector_origin(const int gv, int *oh0, int *ow0) {
    const int vv = gv % NVI;
    *oh0 = 2 * T * (vv / VPR), *ow0 = 32 * (vv % VPR);
    return gv / NVI;
}

// chunk g's TV tile vectors (zeros past nt), all 16 points (ROWS 4) or the 4 of transformed row i
// (ROWS 1: local rows 0-3), into xs and ds. (The helpers' pointers are not `restrict`: the kernels'
// are, and an inlined restrict parameter becomes an LLVM intrinsic that Oclgrind cannot run.)
inline void wgrad_transform(__global const float *x, __global const float *dy, const int doff,
                            const int dplane, const int dws, const int nt, const int g, const int i, __local float16 *xs,
                            __local float16 *ds) {
    // a channel (or dy plane) at a time, its TV vectors in order, so that each plane's rows stream
    // through in turn (with the vectors outer, every channel's few rows for each, the loads stall).
    // Even so, at each vector's first new row a load misses, so with WINOT_PREFETCH each vector's
    // rows of the next plane are prefetched: a chunk's work a plane ahead of their use
    // (tuning.json's note on WINOT_PREFETCH). A ROWS 1 work-item prefetches all 2 T + 2 rows, its
    // siblings' too (resnet8's 64-channel launches are ROWS 1).
    const int nv = MIN(TV, nt - g * TV);  // the chunk's tile vectors, zeros after them
    for (int c = 0; c < C; c++)
        for (int v = 0; v < TV; v++) {
#define XS_AT(p) XS(p, c, v)
            if (v >= nv) {
                for (int p = 0; p < PTS; p++) XS(p, c, v) = 0.0f;
                continue;
            }
            int oh0, ow0;
            const int n = vector_origin(g * TV + v, &oh0, &ow0);
            __global const float *xb = x + (n * C + c) * (IHS * IWS) + (oh0 - 1 + IPB) * IWS + ow0 - 1 + IPB;
#if WINOT_PREFETCH  // the same vector's rows a plane ahead: channel c + 1's, after the last dy's first
            if (c + 1 < C)
                PREFETCH_ROWS(xb + IHS * IWS, IWS, 2 * T + 2, 32 / T + 1);
            else
                PREFETCH_ROWS(dy + doff + n * K * dplane + oh0 * dws + ow0, dws, 2 * T, 32 / T - 1);
#endif
#if ROWS == 4
            WINOT_BT(xb, XS_AT);
#else  // row i of B^T only
            const int r0 = BT_R0(i), r1 = BT_R1(i);
            const float s = BT_S(i);
            __global const float *p0 = xb + r0 * IWS, *p1 = xb + r1 * IWS;
            float16 a0, b0, a1, b1, a2, b2, a3, b3;
            ROW_PAIR(p0, IWS, a0, b0), ROW_PAIR(p1, IWS, a1, b1), ROW_PAIR(p0 + 2, IWS, a2, b2), ROW_PAIR(p1 + 2, IWS, a3, b3);
            BT_COLUMNS(a0 + s * a1, b0 + s * b1, a2 + s * a3, b2 + s * b3, XS_AT, 0);
#endif
#undef XS_AT
        }
    for (int k = 0; k < K; k++)
        for (int v = 0; v < TV; v++) {
#define DS_AT(p) DS(p, k, v)
            if (v >= nv) {
                for (int p = 0; p < PTS; p++) DS(p, k, v) = 0.0f;
                continue;
            }
            int oh0, ow0;
            const int n = vector_origin(g * TV + v, &oh0, &ow0);
            __global const float *pk = dy + doff + (n * K + k) * dplane + oh0 * dws + ow0;
#if WINOT_PREFETCH
            if (k + 1 < K) PREFETCH_ROWS(pk + dplane, dws, 2 * T, 32 / T - 1);
#endif
#if ROWS == 4
            float16 a0, b0, a1, b1;
            ROW_PAIR(pk, dws, a0, b0), ROW_PAIR(pk + dws, dws, a1, b1);
            const float16 e0 = EVENS(a0, b0), o0 = ODDS(a0, b0), e1 = EVENS(a1, b1), o1 = ODDS(a1, b1);
            const float16 e[4] = {e0, e0 + e1, e0 - e1, -e1}, o[4] = {o0, o0 + o1, o0 - o1, -o1};  // A over the rows
#pragma unroll
            for (int q = 0; q < 4; q++) A_COLUMNS(e[q], o[q], DS_AT, 4 * q);  // and over the columns
#else  // row i of A only: dy rows sg (d0 + sd 1), (0, 0 + 1, 0 - 1, -1)
            const int d0 = i == 3 ? dws : 0;
            const float sd = i == 1 ? 1.0f : i == 2 ? -1.0f : 0.0f, sg = i == 3 ? -1.0f : 1.0f;
            float16 a0, b0, a1, b1;
            ROW_PAIR(pk + d0, dws, a0, b0), ROW_PAIR(pk + dws, dws, a1, b1);
            const float16 ea = sg * (a0 + sd * a1), eb = sg * (b0 + sd * b1), e = EVENS(ea, eb), o = ODDS(ea, eb);
            A_COLUMNS(e, o, DS_AT, 0);
#endif
#undef DS_AT
        }
}

// the chunk's sums for each of its PTS points and 4 x 4 block of (k, c) into out (added where `add`)
#ifndef WGV
#define WGV 16
#endif
#if WGV == 16  // 16-wide vectors (AVX-512's 32 registers): 16 float16 accumulators, 4 + 4 operands
inline void wgrad_sums(__local const float16 *xs, __local const float16 *ds,
                       __global float16 *out, const int add) {
    for (int p = 0; p < PTS; p++)
        for (int kb = 0; kb < K / 4; kb++)
            for (int cb = 0; cb < C / 4; cb++) {
                float16 acc[16];
#pragma unroll
                for (int q = 0; q < 16; q++) acc[q] = 0.0f;
                for (int v = 0; v < TV; v++) {
                    float16 d[4], e[4];
#pragma unroll
                    for (int q = 0; q < 4; q++) d[q] = DS(p, 4 * kb + q, v), e[q] = XS(p, 4 * cb + q, v);
#pragma unroll
                    for (int q = 0; q < 4; q++)
#pragma unroll
                        for (int r = 0; r < 4; r++) acc[4 * q + r] += d[q] * e[r];
                }
                __global float16 *o = out + (p * (K / 4) + kb) * (C / 4) + cb;
                *o = add ? *o + tree16(acc) : tree16(acc);
            }
}
#else  // 8-wide vectors (AVX2's 16 registers): blocks of 6 output channels x 2 input channels, 12
// float8 accumulators, each taking a float16's low half and then its high half (per tile vector
// the 2 inputs' low halves and one dy half at a time in registers: 15 of 16), the blocks of 6
// outer so that their dy rows stay in L1 while the inputs stream past (K % 6 left: a block of 4
// or 2). The chains are what this buys: with 8 accumulators (4 x 2, two passes per 4 x 4 block)
// each would take 2 dependent multiply-adds a vector, 8 chains of 4-cycle latency feeding 2
// pipes, no slack; 12 leave a third of it (tuning.json's note on winot_wgrad's blocks of 6). The
// sums are those of 4 x 2 passes bit for bit (each total's lanes added as tree8 adds them).

// the totals of 8 accumulators, lane q that of a[q]: each step adds two vectors' halves of
// their groups of lanes (8 -> 4 -> 2 -> 1 partial sums per accumulator)
inline float8 tree8(float8 a[8]) {
    float8 b[4], c[2];
#pragma unroll
    for (int m = 0; m < 4; m++)
        b[m] = __builtin_shufflevector(a[2 * m], a[2 * m + 1], 0, 1, 2, 3, 8, 9, 10, 11) +
               __builtin_shufflevector(a[2 * m], a[2 * m + 1], 4, 5, 6, 7, 12, 13, 14, 15);
#pragma unroll
    for (int m = 0; m < 2; m++)
        c[m] = __builtin_shufflevector(b[2 * m], b[2 * m + 1], 0, 1, 4, 5, 8, 9, 12, 13) +
               __builtin_shufflevector(b[2 * m], b[2 * m + 1], 2, 3, 6, 7, 10, 11, 14, 15);
    return __builtin_shufflevector(c[0], c[1], 0, 2, 4, 6, 8, 10, 12, 14) +
           __builtin_shufflevector(c[0], c[1], 1, 3, 5, 7, 9, 11, 13, 15);
}

// half h (0 low, 1 high) of a float16 in local memory, loaded as a float8 (vload8 is an
// out-of-line call on PyPI's PoCL 3.0, as its other builtins are)
#define HALF8(v, h) (((__local const float8 *)&(v))[h])

// point p's sums of output channels k0 .. k0 + kn - 1 (kn 6, 4 or 2) and input channels c0, c0 + 1
// over the chunk, into their lanes of out (added where `add`). Always inlined, so that kn is a
// constant at each call and its loops unroll (called, it would test kn every vector)
inline __attribute__((always_inline)) void wgrad_block(__local const float16 *xs,
                                                       __local const float16 *ds,
                                                       __global float *out, const int add, const int p,
                                                       const int k0, const int c0, const int kn) {
    float8 acc[12];
#pragma unroll
    for (int q = 0; q < 12; q++) acc[q] = 0.0f;
    for (int v = 0; v < TV; v++) {
#pragma unroll
        for (int h = 0; h < 2; h++) {  // the low halves, then the high ones
            const float8 e0 = HALF8(XS(p, c0, v), h), e1 = HALF8(XS(p, c0 + 1, v), h);
#pragma unroll
            for (int q = 0; q < 6; q++) {
                if (q >= kn) break;
                const float8 d = HALF8(DS(p, k0 + q, v), h);
                acc[2 * q] += d * e0;  // contracted to one FMA (no fma(): a call on PyPI's PoCL 3.0)
                acc[2 * q + 1] += d * e1;
            }
        }
    }
    // the last 4 totals by tree8 too: its steps add only an accumulator's own lanes, so the zeros
    // beside them change none
    float8 rest[8] = {acc[8], acc[9], acc[10], acc[11], 0.0f, 0.0f, 0.0f, 0.0f};
    float t[12];
    *(ufloat8 *)t = tree8(acc);
    *(ufloat4 *)(t + 8) = tree8(rest).lo;
#pragma unroll
    for (int q = 0; q < 6; q++) {
        if (q >= kn) break;
        const int k = k0 + q;
#pragma unroll
        for (int r = 0; r < 2; r++) {  // lane 4 (k % 4) + c % 4 of block (p, k / 4, c / 4), as the 16-wide sums
            const int c = c0 + r;      // store it
            __global float *o = out + ((p * (K / 4) + k / 4) * (C / 4) + c / 4) * 16 + 4 * (k % 4) + c % 4;
            *o = add ? *o + t[2 * q + r] : t[2 * q + r];
        }
    }
}

inline void wgrad_sums(__local const float16 *xs, __local const float16 *ds,
                       __global float16 *out, const int add) {
    __global float *of = (__global float *)out;
    for (int p = 0; p < PTS; p++) {
        int k0 = 0;
        for (; k0 + 6 <= K; k0 += 6)
            for (int c0 = 0; c0 < C; c0 += 2) wgrad_block(xs, ds, of, add, p, k0, c0, 6);
        for (int c0 = 0; c0 < C; c0 += 2)
            if (K - k0 == 4)
                wgrad_block(xs, ds, of, add, p, k0, c0, 4);
            else if (K - k0 == 2)
                wgrad_block(xs, ds, of, add, p, k0, c0, 2);
    }
}
#endif

// Work-item (i, w) of (4 / ROWS, nw): chunks w, w + nw, .. (`chunks` of them), its sums in
// part[w][4 i ..]
__kernel __attribute__((reqd_work_group_size(1, 1, 1))) __attribute__((min_vector_width(512)))
void winot_wgrad(__global const float *restrict x, __global const float *restrict dy, const int doff, const int dplane,
                 const int dws, __global float16 *restrict part, const int nt, const int chunks) {
    const int i = get_global_id(0), w = get_global_id(1), nw = get_global_size(1);
    __local float16 xs[PTS * XPS], ds[PTS * DPS];
    for (int j = 0; j < chunks; j++) {
        wgrad_transform(x, dy, doff, dplane, dws, nt, w + j * nw, i, xs, ds);
        wgrad_sums(xs, ds, part + (w * 16 + (ROWS == 4 ? 0 : 4 * i)) * (K / 4) * (C / 4), j > 0);
    }
}

// dW (K, C, 3, 3) (+)= G^T M G, M[p] the sum over winot_wgrad's ng work-items, in order. Work-item
// blk = (k / 4) * (C / 4) + c / 4: a 4 x 4 block of (k, c), one per lane of float16 as winot_wgrad
// stores them (lane 4 (k % 4) + c % 4), so its loads are whole vectors and G runs on 16 at once.
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void winot_wgrad_finish(__global const float16 *restrict part, const int ng, __global float *restrict gw,
                        const int acc) {
    const int blk = get_global_id(0), nb = (K / 4) * (C / 4);
    if (blk >= nb)
        return;
    float16 m[16];
#pragma unroll
    for (int p = 0; p < 16; p++) m[p] = 0.0f;
    for (int g = 0; g < ng; g++)
#pragma unroll
        for (int p = 0; p < 16; p++) m[p] += part[(g * 16 + p) * nb + blk];
    float16 t[3][4];
#pragma unroll
    for (int q = 0; q < 4; q++) {  // G^T M
        t[0][q] = m[q] + 0.5f * (m[4 + q] + m[8 + q]);
        t[1][q] = 0.5f * (m[4 + q] - m[8 + q]);
        t[2][q] = 0.5f * (m[4 + q] + m[8 + q]) + m[12 + q];
    }
    float w[9][16];  // (G^T M) G, per output tap, lane by lane for the stores
#pragma unroll
    for (int r = 0; r < 3; r++) {
        *(ufloat16 *)w[3 * r + 0] = t[r][0] + 0.5f * (t[r][1] + t[r][2]);
        *(ufloat16 *)w[3 * r + 1] = 0.5f * (t[r][1] - t[r][2]);
        *(ufloat16 *)w[3 * r + 2] = 0.5f * (t[r][1] + t[r][2]) + t[r][3];
    }
    const int k0 = 4 * (blk / (C / 4)), c0 = 4 * (blk % (C / 4));
    for (int q = 0; q < 16; q++) {
        __global float *o = gw + ((k0 + q / 4) * C + c0 + q % 4) * 9;
#pragma unroll
        for (int e = 0; e < 9; e++) o[e] = acc ? o[e] + w[e][q] : w[e][q];
    }
}
#endif  // TV
