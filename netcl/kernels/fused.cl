// Fused inference kernels (netcl/jit.py). Each program is built for one layer: shapes and
// constants arrive as -D defines, so loops unroll and index arithmetic folds.
//
// conv_*: Conv2d with BatchNorm folded into its weights and bias, then the activation, then
// (POOL == 2) a 2x2/2 max-pool, all in one pass. The stored input and output planes may carry
// a zero border (IPB, OPB): a layer writes its output already padded for the next convolution,
// so that convolution loads without bounds checks.
//
// Common defines: C H W (input channels and size), K (output channels), KS STRIDE PAD, OH OW
// (convolution output), POOL (1 or 2), ACT (0 none, 1 relu, 2 leaky relu, 3 sigmoid, 4 tanh),
// SLOPE, IPB OPB (stored borders; IPB is 0 or PAD).

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)

#if ACT == 0
#define ACTF(v) (v)
#elif ACT == 1
#define ACTF(v) fmax((v), 0.0f)
#elif ACT == 2
#define ACTF(v) select((v) * SLOPE, (v), (v) > 0.0f)
#elif ACT == 3
#define ACTF(v) (1.0f / (1.0f + exp(-(v))))
#else
#define ACTF(v) tanh(v)
#endif

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
