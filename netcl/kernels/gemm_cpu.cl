// GEMM for CPU devices (PoCL), the training path's device classes "cpu" and "cpu16":
//   C[b](m, n) = alpha * sum_k A[b](m, k) * B[b](k, n) + beta * C[b](m, n) + bias
// for any strides (transposes are strides). Defines: VW (float vector width: the device's
// native one), NV (vectors per tile row: a tile is MR x NR, NR = NV * VW), MR, KC (K block).
//
// One work-item per work-group (local size 1: no barriers, PoCL compiles one local size) owns
// an NR-column panel of C over a range of rows and one K chunk. Per K block it packs the
// KC x NR panel of B into local memory (contiguous, aligned, zero-padded past N: the
// microkernel has no tails and no strided or 4K-aliased loads, and the panel stays in L1 for
// every row block), then runs an MR x NR register tile per MR rows: NV vector loads of the
// panel and MR scalar broadcasts of A per k, MR * NV accumulators (16 of the 32 zmm
// registers at 8 x 32). The first K block writes the epilogue (alpha, bias, beta * C); later
// blocks add alpha * acc. Where one K block is the whole sum, alpha is 1 and there is no beta (a
// layer's plain product), whole tiles are stored without the epilogue's tests ("plain"). Split-K
// (the weight gradients' huge K) writes each chunk's raw sums to P[b][chunk][m][n] and
// gemm_cpu_reduce finishes.
//
// PoCL 3.0's vloadN/vstoreN/fma on wide vectors are out-of-line calls that send the
// accumulators through memory: loads and stores are pointer dereferences, and a * b + c
// contracts to an FMA (OpenCL's FP_CONTRACT is on by default).
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define VEC CAT(float, VW)
#define NR (NV * VW)
typedef VEC __attribute__((aligned(4))) uvec;  // unaligned vector access
#include "vec_cpu.h"

// min_vector_width: clang marks a function whose signature has no wide vector as preferring
// 256-bit vectors, and LLVM then splits every float16 into two ymm halves (32 accumulators
// spill); the attribute keeps the zmm registers.
__kernel __attribute__((reqd_work_group_size(1, 1, 1))) __attribute__((min_vector_width(8 * 4 * VW)))
void gemm_cpu(const int M, const int N, const int K,
              __global const float *A, const int a_off, const int sam, const int sak, const int sab,
              __global const float *B, const int b_off, const int sbk, const int sbn, const int sbb,
              __global float *C, const int c_off, const int scm, const int scn, const int scb,
              const float alpha, const float beta, __global const float *bias, const int bias_mode,
              const int nblocks, const int mgroups, const int mstep, const int kchunk, const int chunks,
              __global float *P, const int total) {
    __local VEC panel[KC * NV];
    const int gid = get_global_id(0);
    if (gid >= total) return;
    // n fastest: neighbouring work-items (on both cores) read the same rows of A
    int r = gid;
    const int nb = r % nblocks;
    r /= nblocks;
    const int mg = r % mgroups;
    r /= mgroups;
    const int ch = r % chunks, b = r / chunks;
    const int n0 = nb * NR, nl = MIN(NR, N - n0);
    const int m_lo = mg * mstep, m_hi = MIN(M, m_lo + mstep);
    const int k_lo = ch * kchunk, k_hi = MIN(K, k_lo + kchunk);
    A += a_off + b * sab;
    B += b_off + b * sbb + n0 * sbn;
    const bool split = chunks > 1;
    // A panel narrower than NR (N = 10: a classifier's head) is loaded as whole vectors too, rows
    // k below k_wide reading past their nl columns into the next rows of B: those lanes feed
    // accumulators no store reads. (Packed column by column, 10 columns cost more than 32.)
    const int k_wide = nl == NR ? K : sbn == 1 && sbk >= nl ? K - (NR - nl + sbk - 1) / sbk : 0;
    int kc = k_lo;
    do {  // at least once: with K == 0 the epilogue still writes beta * C + bias
        const int kl = MIN(KC, k_hi - kc);
        for (int k = 0; k < kl; k++) {
            __global const float *src = B + (kc + k) * sbk;
            if (sbn == 1 && kc + k < k_wide) {
#pragma unroll
                for (int v = 0; v < NV; v++) panel[k * NV + v] = *(__global const uvec *)(src + v * VW);
            } else {
                float t[NR];
                for (int j = 0; j < NR; j++) t[j] = j < nl ? src[j * sbn] : 0.0f;
#pragma unroll
                for (int v = 0; v < NV; v++) panel[k * NV + v] = *(const uvec *)(t + v * VW);
            }
        }
        const bool first = kc == k_lo;
        // the common epilogue (one K chunk, alpha 1, no beta, whole vectors of C) without a test per
        // vector: with a short K (a 1x1 convolution's 5 channels) the tests cost more than the sums
        const bool plain = first && !split && kc + KC >= k_hi && alpha == 1.0f && beta == 0.0f && nl == NR &&
                           scn == 1 && bias_mode != 2;
        VEC bias_v[NV];
#pragma unroll
        for (int v = 0; v < NV; v++)
            bias_v[v] = plain && bias_mode == 1 ? *(__global const uvec *)(bias + n0 + v * VW) : (VEC)(0.0f);
        for (int m0 = m_lo; m0 < m_hi; m0 += MR) {
            __global const float *ar[MR];  // rows past M repeat the last row (computed, not stored)
#pragma unroll
            for (int i = 0; i < MR; i++) ar[i] = A + MIN(m0 + i, M - 1) * sam + kc * sak;
            VEC acc[MR][NV];
#pragma unroll
            for (int i = 0; i < MR; i++)
#pragma unroll
                for (int v = 0; v < NV; v++) acc[i][v] = (VEC)(0.0f);
            for (int k = 0; k < kl; k++) {
                VEC bv[NV];
#pragma unroll
                for (int v = 0; v < NV; v++) bv[v] = panel[k * NV + v];
#pragma unroll
                for (int i = 0; i < MR; i++) {
                    const VEC a = (VEC)(ar[i][k * sak]);
#pragma unroll
                    for (int v = 0; v < NV; v++) acc[i][v] += a * bv[v];
                }
            }
            if (plain && m0 + MR <= m_hi) {  // a whole tile, C = A B (+ a column bias): stores alone
                __global float *c = C + c_off + b * scb + m0 * scm + n0;
                if (bias_mode == 1) {
#pragma unroll
                    for (int i = 0; i < MR; i++)
#pragma unroll
                        for (int v = 0; v < NV; v++) *(__global uvec *)(c + i * scm + v * VW) = acc[i][v] + bias_v[v];
                } else {  // (not + 0: a sum of -0.0 stays -0.0, as the general path stores it)
#pragma unroll
                    for (int i = 0; i < MR; i++)
#pragma unroll
                        for (int v = 0; v < NV; v++) *(__global uvec *)(c + i * scm + v * VW) = acc[i][v];
                }
                continue;
            }
            for (int i = 0; i < MR; i++) {
                const int m = m0 + i;
                if (m >= m_hi) break;
                // split-K: raw sums into this chunk's plane of P (row-major M x N)
                __global float *c = split ? P + ((b * chunks + ch) * M + m) * N + n0
                                          : C + c_off + b * scb + m * scm + n0 * scn;
                const int cs = split ? 1 : scn;
                const float al = split ? 1.0f : alpha;
                if (nl == NR && cs == 1) {
#pragma unroll
                    for (int v = 0; v < NV; v++) {
                        __global uvec *cv = (__global uvec *)(c + v * VW);
                        VEC y = al * acc[i][v];
                        if (!first) y += *cv;
                        else if (!split) {
                            if (bias_mode == 1) y += *(__global const uvec *)(bias + n0 + v * VW);
                            else if (bias_mode == 2) y += (VEC)(bias[m]);
                            if (beta != 0.0f) y += beta * *cv;
                        }
                        *cv = y;
                    }
                } else {
                    float t[NR];
#pragma unroll
                    for (int v = 0; v < NV; v++) *(uvec *)(t + v * VW) = al * acc[i][v];
                    for (int j = 0; j < nl; j++) {
                        float y = t[j];
                        if (!first) y += c[j * cs];
                        else if (!split) {
                            if (bias_mode == 1) y += bias[n0 + j];
                            else if (bias_mode == 2) y += bias[m];
                            if (beta != 0.0f) y += beta * c[j * cs];
                        }
                        c[j * cs] = y;
                    }
                }
            }
        }
        kc += KC;
    } while (kc < k_hi);
}

// Dot-product kernel for A and B both contiguous along k (sak == sbk == 1: the weight
// gradients dY @ cols^T and x @ W^T with few rows), where gemm_cpu would have to transpose B
// into its panels: a work-item computes nper DM x DN blocks of C along n (more than one where K
// is short: a dispatch each would cost more than the block), each as DM * DN vector dot products
// over one K chunk (VW-wide loads of DM rows of A and DN rows of B, reduced across lanes once
// at the end). Chunks are the outermost work-item index after the batch, so the work-items
// running together read the same chunk of rows (it stays in L2 for every block of C).
#ifndef DM
#define DM 4
#endif
#ifndef DN
#define DN 4
#endif

inline float hsum(VEC v) {
#if VW == 16
    const float8 h8 = v.lo + v.hi;
    const float4 h4 = h8.lo + h8.hi;
#else
    const float4 h4 = v.lo + v.hi;
#endif
    const float2 h2 = h4.lo + h4.hi;
    return h2.x + h2.y;
}

// A work-item's place in gemm_cpu_dot's and gemm_cpu_nt's grid (ops._cpu_plan; gid < total): batch
// entry b, K chunk ch, the first row m0 of its block of BM rows, its blocks along n [nb0, nb_end)
// and its k [k0, k1)
#define DOT_ITEM(BM)                                                                                   \
    const int ngroups = (nblocks + nper - 1) / nper; /* a work-item's blocks: nper along n */         \
    const int per_chunk = mblocks * ngroups, per_batch = per_chunk * chunks;                          \
    const int b = gid / per_batch, r0 = gid - b * per_batch;                                          \
    const int ch = r0 / per_chunk, r = r0 - ch * per_chunk;                                           \
    const int m0 = (r % mblocks) * (BM), nb0 = (r / mblocks) * nper, nb_end = MIN(nblocks, nb0 + nper); \
    const int k0 = ch * kchunk, k1 = MIN(K, k0 + kchunk)

// Their store of the sum s of C(m, n) of batch entry b: split-K's raw chunk sum into P, else
// alpha, the bias and beta * C applied
inline void dot_store(const float s, const int b, const int ch, const int m, const int n, const int M, const int N,
                      __global float *C, const int c_off, const int scm, const int scn, const int scb,
                      const float alpha, const float beta, __global const float *bias, const int bias_mode,
                      const int chunks, __global float *P) {
    if (chunks > 1) {
        P[((b * chunks + ch) * M + m) * N + n] = s;
        return;
    }
    float y = alpha * s;
    if (bias_mode == 1) y += bias[n];
    else if (bias_mode == 2) y += bias[m];
    const int c = c_off + b * scb + m * scm + n * scn;
    if (beta != 0.0f) y += beta * C[c];
    C[c] = y;
}

__kernel __attribute__((reqd_work_group_size(1, 1, 1))) __attribute__((min_vector_width(8 * 4 * VW)))
void gemm_cpu_dot(const int M, const int N, const int K,
                  __global const float *A, const int a_off, const int sam, const int sab,
                  __global const float *B, const int b_off, const int sbn, const int sbb,
                  __global float *C, const int c_off, const int scm, const int scn, const int scb,
                  const float alpha, const float beta, __global const float *bias, const int bias_mode,
                  const int mblocks, const int nblocks, const int nper, const int kchunk, const int chunks,
                  __global float *P, const int total) {
    const int gid = get_global_id(0);
    if (gid >= total) return;
    DOT_ITEM(DM);  // (more than one block along n: a short k, fewer dispatches)
    __global const float *ap[DM];  // rows past M or N repeat the last one (not stored)
#pragma unroll
    for (int i = 0; i < DM; i++) ap[i] = A + a_off + b * sab + MIN(m0 + i, M - 1) * sam;
    for (int nb = nb0; nb < nb_end; nb++) {
        const int n0 = nb * DN;
        __global const float *bp[DN];
#pragma unroll
        for (int j = 0; j < DN; j++) bp[j] = B + b_off + b * sbb + MIN(n0 + j, N - 1) * sbn;
        VEC acc[DM][DN];
#pragma unroll
        for (int i = 0; i < DM; i++)
#pragma unroll
            for (int j = 0; j < DN; j++) acc[i][j] = (VEC)(0.0f);
        int k = k0;
        for (; k + VW <= k1; k += VW) {
            VEC av[DM], bv[DN];
#pragma unroll
            for (int i = 0; i < DM; i++) av[i] = *(__global const uvec *)(ap[i] + k);
#pragma unroll
            for (int j = 0; j < DN; j++) bv[j] = *(__global const uvec *)(bp[j] + k);
#pragma unroll
            for (int i = 0; i < DM; i++)
#pragma unroll
                for (int j = 0; j < DN; j++) acc[i][j] += av[i] * bv[j];
        }
        float s[DM][DN];
#pragma unroll
        for (int i = 0; i < DM; i++)
#pragma unroll
            for (int j = 0; j < DN; j++) s[i][j] = hsum(acc[i][j]);
        for (; k < k1; k++)
#pragma unroll
            for (int i = 0; i < DM; i++)
#pragma unroll
                for (int j = 0; j < DN; j++) s[i][j] += ap[i][k] * bp[j][k];
        for (int i = 0; i < DM && m0 + i < M; i++)
            for (int j = 0; j < DN && n0 + j < N; j++)
                dot_store(s[i][j], b, ch, m0 + i, n0 + j, M, N, C, c_off, scm, scn, scb, alpha, beta, bias, bias_mode,
                          chunks, P);
    }
}

#if VW == 16 || VW == 8
// Transposing kernel for the same layout (A and B contiguous along k) with 16 rows or more and
// a short K (at most NT_KMAX, the tuning table's nt_max_k): a work-item computes nper blocks of C along n
// of one block of rows, its vectors' lanes rows of C (no sums across lanes). A's rows are
// transposed in registers 8 floats at a time (3 stages of 8 two-source shuffles, each swapping a
// bit of the vector index with a bit of the lane index) and multiplied by broadcast floats of B.
// VW 16 (AVX-512's 32 registers): 16 x 16 blocks; per 8 k the rows' 8 floats (8 vectors: rows v
// and v + 8 in each) are transposed into 8 vectors of A's columns and each multiplied by 16
// scalars of B: 16 loads and 32 shuffles per 128 vector multiply-adds, each column's 8 products
// summed before they join its accumulator (sums of K / 8 terms).
// VW 8 (AVX2's 16 registers): 16 x 5 blocks; the work-item first transposes its 16 rows of A over
// the whole K into private memory (2 float8 a k), then per k loads those 2 vectors and 5 floats
// of B for 10 multiply-adds: 10 accumulators, 2 operands and a broadcast, 13 registers (with 6
// columns LLVM keeps the row pointers of B in vector registers and spills). 8 x 8 blocks
// transposing in the loop need 8 columns, 8 accumulators and the broadcast: 17, and spill
// (tuning.json's gemm_cpu_cutoffs, nt_blocks). Its sums take their K
// products one by one (sums of K terms, K at most NT_KMAX); its whole blocks of a plain product
// are stored row by row, 5 floats each.
// VW 16: a plain product's whole 16 x 16 block is transposed back and stored as 16 row vectors.
// Other blocks, sums and epilogues element by element.
#define NT_KMAX 256
#if VW == 16
#define NTM 16
#define NTN 16
#else
#define NTM 16
#define NTN 5
#endif

__kernel __attribute__((reqd_work_group_size(1, 1, 1))) __attribute__((min_vector_width(32 * VW)))
void gemm_cpu_nt(const int M, const int N, const int K,
                 __global const float *A, const int a_off, const int sam, const int sab,
                 __global const float *B, const int b_off, const int sbn, const int sbb,
                 __global float *C, const int c_off, const int scm, const int scn, const int scb,
                 const float alpha, const float beta, __global const float *bias, const int bias_mode,
                 const int mblocks, const int nblocks, const int nper, const int kchunk, const int chunks,
                 __global float *P, const int total) {
    const int gid = get_global_id(0);
    if (gid >= total) return;
    DOT_ITEM(NTM);
#if VW == 8
    float8 at[2 * NT_KMAX];  // at[2 (k - k0) + h] lane i = A(m0 + 8 h + i, k)
    for (int h = 0; h < 2; h++) {
        __global const float *ap[8];  // rows past M repeat the last one (not stored)
#pragma unroll
        for (int i = 0; i < 8; i++) ap[i] = A + a_off + b * sab + MIN(m0 + 8 * h + i, M - 1) * sam;
        int k = k0;
        for (; k + 8 <= k1; k += 8) {
            float8 p[8], t[8];
#pragma unroll
            for (int v = 0; v < 8; v++) p[v] = *(__global const ufloat8 *)(ap[v] + k);
            TRANSPOSE8(p, t);  // t[kk] lane i = A(m0 + 8 h + i, k + kk)
#pragma unroll
            for (int kk = 0; kk < 8; kk++) at[2 * (k - k0 + kk) + h] = t[kk];
        }
        for (; k < k1; k++) {  // the tail: A's column k gathered
            float col[8];
#pragma unroll
            for (int i = 0; i < 8; i++) col[i] = ap[i][k];
            at[2 * (k - k0) + h] = *(float8 *)col;
        }
    }
#else
    __global const float *ap[VW];  // rows past M or N repeat the last one (not stored)
#pragma unroll
    for (int i = 0; i < VW; i++) ap[i] = A + a_off + b * sab + MIN(m0 + i, M - 1) * sam;
#endif
    for (int nb = nb0; nb < nb_end; nb++) {
        const int n0 = nb * NTN;
        __global const float *bp[NTN];
#pragma unroll
        for (int j = 0; j < NTN; j++) bp[j] = B + b_off + b * sbb + MIN(n0 + j, N - 1) * sbn;
        // a plain product's whole block: stored as rows, without the epilogue's tests
        const bool whole = chunks == 1 && scn == 1 && alpha == 1.0f && beta == 0.0f && bias_mode == 0 &&
                           m0 + NTM <= M && n0 + NTN <= N;
        __global float *c = C + c_off + b * scb + m0 * scm + n0;  // the block's first element
        float s[NTN][NTM];  // s[j][i] = C(m0 + i, n0 + j), for the element-by-element stores
#if VW == 8
        float8 acc[2][NTN];
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int j = 0; j < NTN; j++) acc[h][j] = (float8)(0.0f);
        for (int k = k0; k < k1; k++) {
            const float8 a0 = at[2 * (k - k0)], a1 = at[2 * (k - k0) + 1];
#pragma unroll
            for (int j = 0; j < NTN; j++) {
                const float bj = bp[j][k];
                acc[0][j] += a0 * bj;
                acc[1][j] += a1 * bj;
            }
        }
#pragma unroll
        for (int j = 0; j < NTN; j++) *(float8 *)&s[j][0] = acc[0][j], *(float8 *)&s[j][8] = acc[1][j];
        if (whole) {  // rows of 5 floats
            for (int i = 0; i < NTM; i++)
#pragma unroll
                for (int j = 0; j < NTN; j++) c[i * scm + j] = s[j][i];
            continue;
        }
#else
        VEC acc[NTN];
#pragma unroll
        for (int j = 0; j < NTN; j++) acc[j] = (VEC)(0.0f);
        int k = k0;
        for (; k + 8 <= k1; k += 8) {
            VEC p[8], t[8];
#pragma unroll
            for (int v = 0; v < 8; v++)  // lanes 0-7: row v's k..k+7, lanes 8-15: row v + 8's
                p[v] = __builtin_shufflevector(*(__global const ufloat8 *)(ap[v] + k),
                                               *(__global const ufloat8 *)(ap[v + 8] + k),
                                               0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
#pragma unroll
            for (int v = 0; v < 8; v += 2) TR16_SWAP(p, t, v, 1, TR16_LO1, TR16_HI1);
#pragma unroll
            for (int v = 0; v < 8; v += (v & 1) ? 3 : 1) TR16_SWAP(t, p, v, 2, TR16_LO2, TR16_HI2);  // v = 0, 1, 4, 5
#pragma unroll
            for (int v = 0; v < 4; v++) TR16_SWAP(p, t, v, 4, TR16_LO4, TR16_HI4);  // t[kk] lane i = A(m0 + i, k + kk)
#pragma unroll
            for (int j = 0; j < NTN; j++) {  // each chunk's 8 products summed first: a sum of K / 8 terms
                VEC part = t[0] * bp[j][k];
#pragma unroll
                for (int kk = 1; kk < 8; kk++) part += t[kk] * bp[j][k + kk];
                acc[j] += part;
            }
        }
        for (; k < k1; k++) {  // the tail: A's column k gathered
            float col[VW];
#pragma unroll
            for (int i = 0; i < VW; i++) col[i] = ap[i][k];
            const VEC a = *(VEC *)col;
#pragma unroll
            for (int j = 0; j < NTN; j++) acc[j] += a * bp[j][k];
        }
        if (whole) {  // transposed back, 16 row vectors
            VEC u[VW];
            TRANSPOSE16(acc, u);  // in place
#pragma unroll
            for (int i = 0; i < VW; i++) *(__global uvec *)(c + i * scm) = acc[i];
            continue;
        }
#pragma unroll
        for (int j = 0; j < NTN; j++) *(VEC *)s[j] = acc[j];
#endif
        for (int j = 0; j < NTN && n0 + j < N; j++)
            for (int i = 0; i < NTM && m0 + i < M; i++)
                dot_store(s[j][i], b, ch, m0 + i, n0 + j, M, N, C, c_off, scm, scn, scb, alpha, beta, bias, bias_mode,
                          chunks, P);
    }
}
#endif

// Short-K GEMM (TK = K <= 8, compiled in: a 1x1 convolution's data gradient from a detection
// head's 5 output channels, W^T dy per image), B and C contiguous along n, C = A B (no alpha, beta
// or bias), rows of C of a few vectors: a work-item owns a block of rows of one batch entry; per VW
// columns it holds B's TK vectors in registers and writes each row of C once, TK broadcast
// multiply-adds a vector.
// gemm_cpu's panel packing and 8-row tiles cost more than these sums (tuning.json's
// gemm_cpu_cutoffs, thin_*), the stores of C being most of the work.
#ifdef TK
__kernel __attribute__((reqd_work_group_size(1, 1, 1))) __attribute__((min_vector_width(8 * 4 * VW)))
void gemm_cpu_thin(const int M, const int N,
                   __global const float *A, const int a_off, const int sam, const int sak, const int sab,
                   __global const float *B, const int b_off, const int sbk, const int sbb,
                   __global float *C, const int c_off, const int scm, const int scb,
                   const int mgroups, const int mstep, const int total) {
    const int gid = get_global_id(0);
    if (gid >= total) return;
    const int b = gid / mgroups, m_lo = (gid - b * mgroups) * mstep, m_hi = MIN(M, m_lo + mstep);
    A += a_off + b * sab;
    B += b_off + b * sbb;
    C += c_off + b * scb;
    for (int n0 = 0; n0 < N; n0 += VW) {
        const int nl = MIN(VW, N - n0);
        VEC bv[TK];
#pragma unroll
        for (int k = 0; k < TK; k++) {
            if (nl == VW) {
                bv[k] = *(__global const uvec *)(B + k * sbk + n0);
            } else {  // the last columns: lanes past N read nothing and are not stored
                float t[VW];
                for (int j = 0; j < VW; j++) t[j] = j < nl ? B[k * sbk + n0 + j] : 0.0f;
                bv[k] = *(const uvec *)t;
            }
        }
        int m = m_lo;
        if (sam == 1 && nl == VW) {  // A contiguous along m (W^T): VW rows' k-th values in one load, then
            // broadcast from its lanes (per-row scalar loads keep their k offsets on the stack)
            for (; m + VW <= m_hi; m += VW) {
                VEC av[TK];
#pragma unroll
                for (int k = 0; k < TK; k++) av[k] = *(__global const uvec *)(A + m + k * sak);
                __global float *c = C + m * scm + n0;
#pragma unroll
                for (int r = 0; r < VW; r++) {
                    VEC acc = av[0][r] * bv[0];
#pragma unroll
                    for (int k = 1; k < TK; k++) acc += av[k][r] * bv[k];
                    *(__global uvec *)(c + r * scm) = acc;
                }
            }
        }
        for (; m < m_hi; m++) {
            __global const float *a = A + m * sam;
            VEC acc = a[0] * bv[0];
#pragma unroll
            for (int k = 1; k < TK; k++) acc += a[k * sak] * bv[k];
            __global float *c = C + m * scm + n0;
            if (nl == VW) {
                *(__global uvec *)c = acc;
            } else {
                float t[VW];
                *(uvec *)t = acc;
                for (int j = 0; j < nl; j++) c[j] = t[j];
            }
        }
    }
}
#endif

// C[b](m, n) = alpha * sum_chunk P[b][chunk][m][n] + bias + beta * C[b](m, n): split-K's second step.
__kernel void gemm_cpu_reduce(const int M, const int N, const int chunks, __global const float *P,
                              __global float *C, const int c_off, const int scm, const int scn, const int scb,
                              const float alpha, const float beta, __global const float *bias,
                              const int bias_mode, const int total) {
    const int gid = get_global_id(0);
    if (gid >= total) return;
    const int MN = M * N, b = gid / MN, mn = gid - b * MN, m = mn / N, n = mn - m * N;
    float s = 0.0f;
    for (int ch = 0; ch < chunks; ch++) s += P[(b * chunks + ch) * MN + mn];
    float y = alpha * s;
    if (bias_mode == 1) y += bias[n];
    else if (bias_mode == 2) y += bias[m];
    const int c = c_off + b * scb + m * scm + n * scn;
    if (beta != 0.0f) y += beta * C[c];
    C[c] = y;
}
