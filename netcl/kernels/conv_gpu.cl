// Fused conv, GPU family (netcl/jit/conv_gpu.py): a local-memory implicit GEMM. Defines: conv.h's,
// and BM BN RM RN BK (tile, register block, reduction step); split-K's parts and their rows are
// arguments (split, rchunk), as is the batch (nout), so one program serves every batch size.
#include "act.h"
#include "conv.h"

// GPU: implicit GEMM out[k][pixel] = sum_r Wt[r][k] * im2col(x)[r][pixel]. A work-group
// computes a BM x BN tile through local memory, BK reduction rows at a time; each work-item a
// RM x RN register block. Columns are conv pixels; with POOL == 2 a work-item's RN = 4 columns
// are one 2x2 pool window, so the pool is a max over its registers. split > 1 splits the
// reduction over get_group_id(2): each part's work-group writes its register blocks to `part`. Built
// with SPLIT_ATOMIC (devices with OpenCL 2.0's acquire-release atomics at device scope), the last
// work-group of a tile to arrive (an acq_rel increment of the tile's counter) sums every part in a
// fixed order and stores: one launch. Elsewhere conv_gpu_reduce, launched next over the same tiles,
// does that sum: OpenCL 1.2's mem_fence does not order one work-group's writes before another's
// reads (Oclgrind reported the one-launch form as a race).
#define TX (BN / RN)
#define TY (BM / RM)
#define NT (TX * TY)
#define Q (POOL * POOL)
#define KP (((K + BM - 1) / BM) * BM)

// A work-item's register block out: bias, activation, the 2x2 pool (POOL 2) or the residual (EPI).
inline void conv_gpu_store(float acc[RM][RN], const int nout, const int m0, const int o0, const int tx, const int ty,
                           __global const float *bias, __global float *y, __global const float *res) {
    for (int i = 0; i < RM; i++) {
        const int m = m0 + ty * RM + i;
        if (m >= K) break;
        const float bm = bias[m];
#if POOL == 2
        const int oo = o0 + tx;
        if (oo < nout) {
            float v = ACTF(acc[i][0] + bm);
            for (int j = 1; j < 4; j++) v = NAN_MAX(v, ACTF(acc[i][j] + bm));
            const int nn = oo / (POH * POW), q = oo % (POH * POW);
            y[OUT_AT(nn, m, q / POW, q % POW)] = v;
        }
#else
        for (int j = 0; j < RN; j++) {
            const int oo = o0 + tx * RN + j;
            if (oo >= nout) break;
            const int nn = oo / (OH * OW), q = oo % (OH * OW);
            y[OUT_AT(nn, m, q / OW, q % OW)] = EPI(ACTF(acc[i][j] + bm), nn, m, q / OW, q % OW);
        }
#endif
    }
}

// the register blocks of tile `tile` of part s, work-item tid's: part[s][tile][i][j][tid]
#define PART_AT(s, tile, i, j) ((((s) * ntile + (tile)) * (RM * RN) + (i) * RN + (j)) * NT + tid)

__kernel __attribute__((reqd_work_group_size(NT, 1, 1)))
void conv_gpu(const int nout, const int split, const int rchunk, __global const float *x, __global const float *wt,
              __global const float *bias, __global float *y, __global float *part, __global int *counters,
              __global const float *res) {
    __local float As[BK][BM];
    __local float Bs[BK][BN];
#ifdef SPLIT_ATOMIC
    __local int last;  // (the one-launch split-K's: whether this group arrived last at its tile)
#endif
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

    const int rbeg = get_group_id(2) * rchunk;
    for (int r0 = rbeg; r0 < rbeg + rchunk; r0 += BK) {
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
#if IPB >= PAD
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

    if (split > 1) {  // one part of the reduction
        const int tile = get_group_id(1) * get_num_groups(0) + get_group_id(0);
        const int ntile = get_num_groups(0) * get_num_groups(1);
        for (int i = 0; i < RM; i++)
            for (int j = 0; j < RN; j++) part[PART_AT(get_group_id(2), tile, i, j)] = acc[i][j];
#ifdef SPLIT_ATOMIC
        // the group's writes before its increment (a barrier at device scope), the increment a release
        // the last group's acquire pairs with, and the barrier after it hands the parts to its work-items
        work_group_barrier(CLK_GLOBAL_MEM_FENCE, memory_scope_device);
        if (tid == 0)
            last = atomic_fetch_add_explicit((volatile __global atomic_int *)(counters + tile), 1,
                                             memory_order_acq_rel, memory_scope_device) == split - 1;
        work_group_barrier(CLK_GLOBAL_MEM_FENCE | CLK_LOCAL_MEM_FENCE, memory_scope_device);
        if (!last) return;
        if (tid == 0)  // zero again for the next launch (which the queue orders after this one)
            atomic_store_explicit((volatile __global atomic_int *)(counters + tile), 0, memory_order_relaxed,
                                  memory_scope_device);
        for (int i = 0; i < RM; i++)
            for (int j = 0; j < RN; j++) acc[i][j] = 0.0f;
        for (int s = 0; s < split; s++)  // fixed order: the result does not depend on who came last
            for (int i = 0; i < RM; i++)
                for (int j = 0; j < RN; j++) acc[i][j] += part[PART_AT(s, tile, i, j)];
#else
        return;  // conv_gpu_reduce sums the parts and stores
#endif
    }
    conv_gpu_store(acc, nout, m0, o0, tx, ty, bias, y, res);
}

// split > 1: conv_gpu's parts of each tile summed in a fixed order (the result does not depend on
// which part finished first), then stored as conv_gpu stores an unsplit tile. The same arguments
// as conv_gpu, launched over its tiles with one part (global size (gx NT, gy, 1)).
__kernel __attribute__((reqd_work_group_size(NT, 1, 1)))
void conv_gpu_reduce(const int nout, const int split, const int rchunk, __global const float *x,
                     __global const float *wt, __global const float *bias, __global float *y,
                     __global const float *part, __global int *counters, __global const float *res) {
    const int tid = get_local_id(0), tx = tid % TX, ty = tid / TX;
    const int m0 = get_group_id(1) * BM, o0 = get_group_id(0) * (BN / Q);
    const int tile = get_group_id(1) * get_num_groups(0) + get_group_id(0);
    const int ntile = get_num_groups(0) * get_num_groups(1);
    float acc[RM][RN];
    for (int i = 0; i < RM; i++)
        for (int j = 0; j < RN; j++) acc[i][j] = 0.0f;
    for (int s = 0; s < split; s++)
        for (int i = 0; i < RM; i++)
            for (int j = 0; j < RN; j++) acc[i][j] += part[PART_AT(s, tile, i, j)];
    conv_gpu_store(acc, nout, m0, o0, tx, ty, bias, y, res);
}
