// Strided, batched GEMM for the training path:
//   C[b](m, n) = alpha * sum_k A[b](m, k) * B[b](k, n) + beta * C[b](m, n) + bias
// Any layout (transposes included) is a choice of strides. Each work-item computes a TM x TN
// block; out-of-range rows/columns are clamped on load and skipped on store, so the inner loop
// has no branches. bias_mode: 0 none, 1 bias[n], 2 bias[m].
// CPU builds (no tile define BM) hold gemm, gemm_vn and gemm_dot; GPU builds gemm_tile alone.
#ifndef BM
#define TM 4
#define TN 4

__kernel void gemm(const int M, const int N, const int K,
                   __global const float *A, const int a_off, const int sam, const int sak, const int sab,
                   __global const float *B, const int b_off, const int sbk, const int sbn, const int sbb,
                   __global float *C, const int c_off, const int scm, const int scn, const int scb,
                   const float alpha, const float beta, __global const float *bias, const int bias_mode) {
    const int n0 = get_global_id(0) * TN, m0 = get_global_id(1) * TM, b = get_global_id(2);
    if (m0 >= M || n0 >= N) return;
    A += a_off + b * sab;
    B += b_off + b * sbb;
    C += c_off + b * scb;
    int ra[TM], cb[TN];
    for (int i = 0; i < TM; i++) ra[i] = min(m0 + i, M - 1) * sam;
    for (int j = 0; j < TN; j++) cb[j] = min(n0 + j, N - 1) * sbn;
    float acc[TM][TN];
    for (int i = 0; i < TM; i++)
        for (int j = 0; j < TN; j++) acc[i][j] = 0.0f;
    for (int k = 0; k < K; k++) {
        float a[TM], bv[TN];
        for (int i = 0; i < TM; i++) a[i] = A[ra[i] + k * sak];
        for (int j = 0; j < TN; j++) bv[j] = B[k * sbk + cb[j]];
        for (int i = 0; i < TM; i++)
            for (int j = 0; j < TN; j++) acc[i][j] = fma(a[i], bv[j], acc[i][j]);
    }
    for (int i = 0; i < TM; i++) {
        const int m = m0 + i;
        if (m >= M) break;
        for (int j = 0; j < TN; j++) {
            const int n = n0 + j;
            if (n >= N) break;
            float v = alpha * acc[i][j];
            if (bias_mode == 1) v += bias[n];
            else if (bias_mode == 2) v += bias[m];
            const int c = m * scm + n * scn;
            if (beta != 0.0f) v += beta * C[c];
            C[c] = v;
        }
    }
}

// Fast path (Python picks it when B and C are contiguous along n: sbn == scn == 1): each
// work-item computes an FM x VN block of C with VN-wide vector loads of B rows and scalar
// broadcasts of A (any A strides, so A may be transposed). PoCL on CPUs does not vectorise
// across work-items, so the vectors have to be explicit. The grid is 1-D over
// (batch, n-block, m-block), m fastest: one work-group shares a B panel across its m-blocks,
// and many tiny batched GEMMs (a conv over N images) leave no work-item idle.
#ifndef FM
#define FM 4
#endif
#ifndef VN
#define VN 16
#endif
#define VECN_(w) float##w
#define VECN(w) VECN_(w)
#define VLOADN_(w) vload##w
#define VLOADN(w) VLOADN_(w)
#define VSTOREN_(w) vstore##w
#define VSTOREN(w) VSTOREN_(w)
#define floatv VECN(VN)
#define vloadv VLOADN(VN)
#define vstorev VSTOREN(VN)

__kernel void gemm_vn(const int M, const int N, const int K,
                      __global const float *A, const int a_off, const int sam, const int sak, const int sab,
                      __global const float *B, const int b_off, const int sbk, const int sbb,
                      __global float *C, const int c_off, const int scm, const int scb,
                      const float alpha, const float beta, __global const float *bias, const int bias_mode,
                      const int mblocks, const int nblocks, const int total) {
    const int gid = get_global_id(0);
    if (gid >= total) return;
    const int per_batch = mblocks * nblocks;
    const int b = gid / per_batch, r = gid - b * per_batch;
    const int m0 = (r % mblocks) * FM, n0 = (r / mblocks) * VN;
    A += a_off + b * sab;
    B += b_off + b * sbb + n0;
    C += c_off + b * scb + n0;
    const int nl = min(VN, N - n0);  // columns of this block inside C
    const bool full = nl == VN;
    int ra[FM];
    for (int i = 0; i < FM; i++) ra[i] = min(m0 + i, M - 1) * sam;
    floatv acc[FM];
    for (int i = 0; i < FM; i++) acc[i] = (floatv)(0.0f);
    if (full) {
        for (int k = 0; k < K; k++) {
            const floatv bv = vloadv(0, B + k * sbk);
            const int ak = k * sak;
            for (int i = 0; i < FM; i++) acc[i] = fma((floatv)(A[ra[i] + ak]), bv, acc[i]);
        }
    } else {  // n tail: clamp the columns on load
        for (int k = 0; k < K; k++) {
            float t[VN];
            for (int j = 0; j < VN; j++) t[j] = B[k * sbk + min(j, nl - 1)];
            const floatv bv = vloadv(0, t);
            const int ak = k * sak;
            for (int i = 0; i < FM; i++) acc[i] = fma((floatv)(A[ra[i] + ak]), bv, acc[i]);
        }
    }
    for (int i = 0; i < FM; i++) {
        const int m = m0 + i;
        if (m >= M) break;
        __global float *c = C + m * scm;
        floatv v = alpha * acc[i];
        if (full) {
            if (bias_mode == 1) v += vloadv(0, bias + n0);
            else if (bias_mode == 2) v += (floatv)(bias[m]);
            if (beta != 0.0f) v += beta * vloadv(0, c);
            vstorev(v, 0, c);
        } else {
            float t[VN];
            vstorev(v, 0, t);
            for (int j = 0; j < nl; j++) {
                float e = t[j];
                if (bias_mode == 1) e += bias[n0 + j];
                else if (bias_mode == 2) e += bias[m];
                if (beta != 0.0f) e += beta * c[j];
                c[j] = e;
            }
        }
    }
}

// Dot-product path (Python picks it when A and B are both contiguous along k: sak == sbk == 1,
// e.g. a weight gradient dY @ cols^T or dx = dy @ W^T): each work-item a DM x DN block of C
// from VK-wide vector loads of A and B rows, over one chunk of K (split-K: the weight
// gradient has a small C and a huge K, so chunks give work-items enough to do in parallel and
// keep their rows in cache). With one chunk the result goes to C (alpha, beta, bias); with
// more, partial sums go to P[chunk][m][n] and gemm_reduce finishes.
#ifndef DM
#define DM 4
#endif
#ifndef DN
#define DN 4
#endif
#ifndef VK
#define VK 16
#endif
#define floatk VECN(VK)
#define vloadk VLOADN(VK)

inline float hsum(floatk v) {
#if VK == 16
    float8 h8 = v.lo + v.hi;
    float4 h4 = h8.lo + h8.hi;
#elif VK == 8
    float4 h4 = v.lo + v.hi;
#else
    float4 h4 = v;
#endif
    float2 h2 = h4.lo + h4.hi;
    return h2.x + h2.y;
}

__kernel void gemm_dot(const int M, const int N, const int K,
                       __global const float *A, const int a_off, const int sam, const int sab,
                       __global const float *B, const int b_off, const int sbn, const int sbb,
                       __global float *C, const int c_off, const int scm, const int scn, const int scb,
                       const float alpha, const float beta, __global const float *bias, const int bias_mode,
                       const int mblocks, const int nblocks, const int kchunk, const int chunks,
                       __global float *P, const int total) {
    const int gid = get_global_id(0);
    if (gid >= total) return;
    const int per_chunk = mblocks * nblocks, per_batch = per_chunk * chunks;
    const int b = gid / per_batch, r0 = gid - b * per_batch;
    const int ch = r0 / per_chunk, r = r0 - ch * per_chunk;
    const int m0 = (r % mblocks) * DM, n0 = (r / mblocks) * DN;
    const int k0 = ch * kchunk, k1 = min(K, k0 + kchunk);
    A += a_off + b * sab;
    B += b_off + b * sbb;
    __global const float *ap[DM], *bp[DN];
    for (int i = 0; i < DM; i++) ap[i] = A + min(m0 + i, M - 1) * sam;
    for (int j = 0; j < DN; j++) bp[j] = B + min(n0 + j, N - 1) * sbn;
    floatk acc[DM][DN];
    for (int i = 0; i < DM; i++)
        for (int j = 0; j < DN; j++) acc[i][j] = (floatk)(0.0f);
    int k = k0;
    for (; k + VK <= k1; k += VK) {
        floatk av[DM], bv[DN];
        for (int i = 0; i < DM; i++) av[i] = vloadk(0, ap[i] + k);
        for (int j = 0; j < DN; j++) bv[j] = vloadk(0, bp[j] + k);
        for (int i = 0; i < DM; i++)
            for (int j = 0; j < DN; j++) acc[i][j] = fma(av[i], bv[j], acc[i][j]);
    }
    float s[DM][DN];
    for (int i = 0; i < DM; i++)
        for (int j = 0; j < DN; j++) s[i][j] = hsum(acc[i][j]);
    for (; k < k1; k++)
        for (int i = 0; i < DM; i++)
            for (int j = 0; j < DN; j++) s[i][j] = fma(ap[i][k], bp[j][k], s[i][j]);
    for (int i = 0; i < DM; i++) {
        const int m = m0 + i;
        if (m >= M) break;
        for (int j = 0; j < DN; j++) {
            const int n = n0 + j;
            if (n >= N) break;
            if (chunks > 1) {
                P[((b * chunks + ch) * M + m) * N + n] = s[i][j];
                continue;
            }
            float v = alpha * s[i][j];
            if (bias_mode == 1) v += bias[n];
            else if (bias_mode == 2) v += bias[m];
            const int c = c_off + b * scb + m * scm + n * scn;
            if (beta != 0.0f) v += beta * C[c];
            C[c] = v;
        }
    }
}
#else  // BM
// GPU path (Python picks it for the "gpu" device class; built with the tile defines BM BN BK
// RM RN and the layout defines A_KMAJOR B_KMAJOR): a work-group computes a BM x BN tile of C
// through local memory, BK values of k at a time; each work-item a contiguous RM x RN register
// block (as the fused conv_gpu family: local reads can be vector-wide). Global loads are
// coalesced on whichever dimension of an operand is contiguous: A_KMAJOR (A contiguous along
// k) walks k fastest across work-items, else m; B_KMAJOR likewise for B against n.
// Out-of-range m/n are clamped on load and skipped on store; k past the chunk loads zeros. The
// 1-D grid of work-groups runs m-tiles fastest (neighbouring work-groups share a B panel: B is
// the large operand), then n-tiles, then batch * splits (no 65535 limit on any of them). With
// splits > 1 each work-group sums one kchunk of K into P[b][split][m][n] and gemm_reduce
// finishes in a fixed order (deterministic split-K for the weight gradients' small C, huge K).
#define TTX (BN / RN)
#define TTY (BM / RM)
#define TNT (TTX * TTY)

__kernel __attribute__((reqd_work_group_size(TNT, 1, 1)))
void gemm_tile(const int M, const int N, const int K,
               __global const float *A, const int a_off, const int sam, const int sak, const int sab,
               __global const float *B, const int b_off, const int sbk, const int sbn, const int sbb,
               __global float *C, const int c_off, const int scm, const int scn, const int scb,
               const float alpha, const float beta, __global const float *bias, const int bias_mode,
               const int mtiles, const int ntiles, const int kchunk, const int splits, __global float *P) {
    __local float As[BK][BM + 4];  // +4: k-fastest stores spread over banks, rows stay float4-aligned
    __local float Bs[BK][BN + 4];
    const int tid = get_local_id(0), tx = tid % TTX, ty = tid / TTX;
    const int g = get_group_id(0), mn = g % (mtiles * ntiles), z = g / (mtiles * ntiles), b = z / splits;
    const int m0 = (mn % mtiles) * BM, n0 = (mn / mtiles) * BN;
    const int k0 = (z - b * splits) * kchunk, k1 = min(K, k0 + kchunk);
    A += a_off + b * sab;
    B += b_off + b * sbb;
    float acc[RM][RN];
    for (int i = 0; i < RM; i++)
        for (int j = 0; j < RN; j++) acc[i][j] = 0.0f;
    for (int kt = k0; kt < k1; kt += BK) {
#pragma unroll
        for (int i = 0; i < (BK * BM + TNT - 1) / TNT; i++) {
            const int e = tid + i * TNT;
            if (BK * BM % TNT == 0 || e < BK * BM) {
#if A_KMAJOR
                const int kk = e % BK, mm = e / BK;
#else
                const int mm = e % BM, kk = e / BM;
#endif
                const int k = kt + kk;
                As[kk][mm] = k < k1 ? A[min(m0 + mm, M - 1) * sam + k * sak] : 0.0f;
            }
        }
#pragma unroll
        for (int i = 0; i < (BK * BN + TNT - 1) / TNT; i++) {
            const int e = tid + i * TNT;
            if (BK * BN % TNT == 0 || e < BK * BN) {
#if B_KMAJOR
                const int kk = e % BK, nn = e / BK;
#else
                const int nn = e % BN, kk = e / BN;
#endif
                const int k = kt + kk;
                Bs[kk][nn] = k < k1 ? B[k * sbk + min(n0 + nn, N - 1) * sbn] : 0.0f;
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        float blk[RM][RN];  // this step's sums, then added to acc: rounding grows with BK + K / BK, not K
        for (int i = 0; i < RM; i++)
            for (int j = 0; j < RN; j++) blk[i][j] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < BK; kk++) {
            float a[RM], bv[RN];
            for (int i = 0; i < RM; i++) a[i] = As[kk][ty * RM + i];
            for (int j = 0; j < RN; j++) bv[j] = Bs[kk][tx * RN + j];
            for (int i = 0; i < RM; i++)
                for (int j = 0; j < RN; j++) blk[i][j] = fma(a[i], bv[j], blk[i][j]);
        }
        for (int i = 0; i < RM; i++)
            for (int j = 0; j < RN; j++) acc[i][j] += blk[i][j];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    for (int i = 0; i < RM; i++) {
        const int m = m0 + ty * RM + i;
        if (m >= M) break;
        for (int j = 0; j < RN; j++) {
            const int n = n0 + tx * RN + j;
            if (n >= N) break;
            if (splits > 1) {
                P[(z * M + m) * N + n] = acc[i][j];
                continue;
            }
            float v = alpha * acc[i][j];
            if (bias_mode == 1) v += bias[n];
            else if (bias_mode == 2) v += bias[m];
            const int c = c_off + b * scb + m * scm + n * scn;
            if (beta != 0.0f) v += beta * C[c];
            C[c] = v;
        }
    }
}
#endif  // BM

// C[b](m, n) = alpha * sum_chunk P[b][chunk][m][n] (+ bias) + beta * C[b](m, n): split-K's second step.
__kernel void gemm_reduce(const int M, const int N, const int chunks, __global const float *P,
                          __global float *C, const int c_off, const int scm, const int scn, const int scb,
                          const float alpha, const float beta, __global const float *bias, const int bias_mode,
                          const int total) {
    const int gid = get_global_id(0);
    if (gid >= total) return;
    const int MN = M * N, b = gid / MN, mn = gid - b * MN, m = mn / N, n = mn - m * N;
    float s = 0.0f;
    for (int ch = 0; ch < chunks; ch++) s += P[(b * chunks + ch) * MN + mn];
    float v = alpha * s;
    if (bias_mode == 1) v += bias[n];
    else if (bias_mode == 2) v += bias[m];
    const int c = c_off + b * scb + m * scm + n * scn;
    if (beta != 0.0f) v += beta * C[c];
    C[c] = v;
}

// out[j] = sum_i X[off + i*si + j*sj] (+ out[j] when accumulate): bias gradients.
// One work-group of RED threads per output j.
#define RED 64

inline float group_sum(float s, __local float *part) {
    const int t = get_local_id(0);
    part[t] = s;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int w = RED / 2; w > 0; w >>= 1) {
        if (t < w) part[t] += part[t + w];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    return part[0];
}

__kernel void sum_axis(const int I, const int J, __global const float *X, const int off, const int si,
                       const int sj, __global float *out, const int accumulate) {
    __local float part[RED];
    const int j = get_group_id(0), t = get_local_id(0);
    float s = 0.0f;
    for (int i = t; i < I; i += RED) s += X[off + i * si + j * sj];
    s = group_sum(s, part);
    if (t == 0) out[j] = accumulate ? out[j] + s : s;
}

// sum_axis's first stage for a long I on GPUs: work-group (j, ch) sums i in [ch*L, ch*L + L)
// into part[j*chunks + ch]; sum_axis over part (I = chunks) finishes in a fixed order.
__kernel void sum_axis_part(const int I, const int J, __global const float *X, const int off, const int si,
                            const int sj, const int L, const int chunks, __global float *part) {
    __local float red[RED];
    const int g = get_group_id(0), j = g / chunks, ch = g - j * chunks, t = get_local_id(0);
    const int i1 = min(I, (ch + 1) * L);
    float s = 0.0f;
    for (int i = ch * L + t; i < i1; i += RED) s += X[off + i * si + j * sj];
    s = group_sum(s, red);
    if (t == 0) part[g] = s;
}

// dst[b][j][i] = src[b][i][j] for a (B, I, J) source: layout changes (conv, attention).
// Generalised: dst index from src index by strides (d0, d1, d2) over a (B, I, J) walk.
__kernel void permute3(const int B, const int I, const int J, __global const float *src, const int off,
                       const int s0, const int s1, const int s2,
                       __global float *dst, const int d0, const int d1, const int d2, const int accumulate) {
    const int j = get_global_id(0), i = get_global_id(1), b = get_global_id(2);
    if (j >= J || i >= I) return;
    const float v = src[off + b * s0 + i * s1 + j * s2];
    const int o = b * d0 + i * d1 + j * d2;
    dst[o] = accumulate ? dst[o] + v : v;
}
