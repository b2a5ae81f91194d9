// Strided, batched GEMM for the training path on GPUs (CPUs: gemm_cpu.cl), and the reductions
// and layout changes every device class uses:
//   C[b](m, n) = alpha * sum_k A[b](m, k) * B[b](k, n) + beta * C[b](m, n) + bias
// Any layout (transposes included) is a choice of strides. bias_mode: 0 none, 1 bias[n], 2 bias[m].
// gemm_tile is compiled only with its tile defines (BM ...).
#ifdef BM
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
