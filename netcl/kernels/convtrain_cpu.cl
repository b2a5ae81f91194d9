// Conv2d's training passes on CPU devices (PoCL; netcl.nn.conv's Conv2d._cpu_mode picks them):
// explicit float16 vectors, one work-item (local size 1) per block of rows, register blocking.
//
// A stride-1, undilated convolution and its data gradient are both correlations of
// zero-bordered planes with the weights (the gradient: of dy with the weights flipped and
// transposed, padding k-1-p): corr_cpu computes either directly, register-blocked like the fused
// forward (kernels/conv_cpu.cl): a work-item owns RM channels x RR rows x 16 columns of the
// output (RR * RM float16 accumulators), loads input rows as vectors and broadcasts weights.
// The planes are first copied with their zero border (pad_planes_cpu), so the inner loops have
// no bounds checks; wgrad_cpu correlates padded dy and x into the weight gradient. Rows too
// narrow for 16-wide vectors, and stride 2: corrc_cpu (output channels in the lanes), corrt_cpu
// for a strided convolution's data gradient, im2col_cpu for the weight gradient's GEMM. Other
// convolutions gather their im2col columns (col2im_cpu, vectorised along the rows where the
// stride is 1).
//
// Defines (netcl.nn.conv, with defaults so the file builds without them): KS (kernel size),
// RM and RR (corr_cpu's channels and rows per work-item), RO (wgrad_cpu's output channels), TC
// (corrc_cpu's positions per work-item).
#ifndef KS
#define KS 3
#endif
#ifndef RM
#define RM 4
#endif
#ifndef RR
#define RR 2
#endif
#ifndef RO
#define RO 2
#endif
#ifndef TC
#define TC 8
#endif
// UNPAD 1: corrc_cpu and im2col_cpu read a 3x3 stride-2 padding-1 convolution's input as it is
// (HP = H, WP = W, both even): only its row -1 and column -1 fall outside it, and those are
// skipped or zero (no padded copy; Conv2d's "phases" mode, whose weight gradient kernels always
// read so)
#ifndef UNPAD
#define UNPAD 0
#endif
// The correlations' accumulators add FLUSH input channels' products, then join a running total:
// a plain running sum over C * KS * KS products (1152 for 128 channels) rounded several times
// worse than the GEMMs' blocked sums.
#define FLUSH 16

#include "vec_cpu.h"
#include "act.h"

// dyp (OC, N*P) from dy (N, OC, P), and sums[n * OC + o] = the sum of row (n, o): the weight
// gradient's GEMM operand and the bias gradient's per-image sums in one pass over dy. Rows
// [r * rows, (r + 1) * rows) of the N*OC rows per work-item; the sums in float16 lanes, flushed
// every 32 vectors (no lane adds a long sequential run: norm_cpu.cl's FLUSH).
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void dy_rows_cpu(const int NOC, const int rows, const int OC, const int P, const int NP, __global const float *dy,
                 __global float *dyp, __global float *sums) {
    const int r1 = MIN(NOC, (int)get_global_id(0) * rows + rows);
    for (int r = get_global_id(0) * rows; r < r1; r++) {
        const int n = r / OC, o = r - n * OC;
        __global const float *src = dy + r * P;
        __global float *dst = dyp + o * NP + n * P;
        float16 s16 = 0.0f, r16 = 0.0f;
        int i = 0, nv = 0;
        for (; i + 16 <= P; i += 16) {
            const float16 v = *(__global const ufloat16 *)(src + i);
            *(__global ufloat16 *)(dst + i) = v;
            r16 += v;
            if (++nv == 32) s16 += r16, r16 = 0.0f, nv = 0;
        }
        float t = 0.0f;
        for (; i < P; i++) {
            dst[i] = src[i];
            t += src[i];
        }
        r16.s0 += t;
        sums[r] = hsum16(s16 + r16);
    }
}

// out (N, C, H, W) += the data gradient of a 1x1 convolution of stride S without padding, from
// its GEMM's dcols (C, N * OH * OW): out[n][c][S y][S x] += dcols[c][(n * OH + y) * OW + x] (a
// Residual's shortcut added into the body's gradient: no zero-filled gradient of its own, no
// separate sum). `rows` of the N * C * OH output rows per work-item.
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void col2im_1x1_add_cpu(const int NCOH, const int rows, const int C, const int H, const int W, const int OH,
                        const int OW, const int S, __global const float *dcols, __global float *out) {
    const int r1 = MIN(NCOH, (int)get_global_id(0) * rows + rows), NP = NCOH / C * OW;
    for (int r = get_global_id(0) * rows; r < r1; r++) {
        const int nc = r / OH, y = r - nc * OH, n = nc / C, c = nc - n * C;
        __global const float *src = dcols + c * NP + (n * OH + y) * OW;
        __global float *dst = out + (nc * H + S * y) * W;
        for (int x = 0; x < OW; x++) dst[S * x] += src[x];
    }
}

// dst (NC, HP, WP) = src (NC, H, W) placed at row `top`, column `left` of zero planes, and
// (sums != 0) sums[plane] = the plane's sum (the bias gradient's per-image sums, in float16
// lanes flushed every 32 vectors: no lane adds a long sequential run). `planes` planes per
// work-item.
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void pad_planes_cpu(const int NC, const int planes, const int H, const int W, const int HP, const int WP,
                    const int top, const int left, __global const float *src, __global float *dst,
                    __global float *sums) {
    const int p1 = MIN(NC, (int)get_global_id(0) * planes + planes);
    for (int pl = get_global_id(0) * planes; pl < p1; pl++) {
        __global float *d = dst + pl * HP * WP;
        __global const float *s = src + pl * H * W;
        float16 s16 = 0.0f, r16 = 0.0f;
        int nv = 0;
        for (int h = 0; h < HP; h++, d += WP) {
            int i = 0;
            if (h < top || h >= top + H) {
                for (; i + 16 <= WP; i += 16) *(__global ufloat16 *)(d + i) = 0.0f;
                for (; i < WP; i++) d[i] = 0.0f;
                continue;
            }
            for (; i < left; i++) d[i] = 0.0f;
            __global float *dd = d + left;
            for (i = 0; i + 16 <= W; i += 16, s += 16) {
                const float16 v = *(__global const ufloat16 *)s;
                *(__global ufloat16 *)(dd + i) = v;
                r16 += v;
                if (++nv == 32) s16 += r16, r16 = 0.0f, nv = 0;
            }
            float t = 0.0f;
            for (; i < W; i++, s++) {
                dd[i] = *s;
                t += *s;
            }
            r16.s0 += t;
            for (i = left + W; i < WP; i++) d[i] = 0.0f;
        }
        if (sums) sums[pl] = hsum16(s16 + r16);
    }
}

// The weight gradient of a stride-1, undilated convolution, directly: dW[o][c][kh][kw] =
// sum over (n, y, x) of dy[n][o][y][x] * x[n][c][y + kh - p][x + kw - p], from the padded
// planes of dy (dyp: N, OC, HD, WD with dy at (pd, pd) and zeros past each row, so that whole
// vectors of 16 columns read zeros beyond OW) and x (xp: N, C, HX, WX with x at (p, p)).
// Work-item (c, ob, chunk): RO output channels ob*RO.. (the last block repeats the last one)
// and input channel c over the rows [chunk * rows, ...) of the N*OH output rows: RO * KS * KS
// accumulators of WGV floats, RO + KS * KS vector loads per KS * KS * RO multiply-adds. Writes the
// chunk's partial sums to part[chunk][o][c][kh][kw]; sum_chunks_cpu adds the chunks. WGV 16 by
// default; 8 on AVX2 (16 ymm registers, where 9 float16 accumulators spill): 8 columns a step (the
// rows of dy are zero past OW to a multiple of 16, so whole float8 read zeros too).
#ifndef WGV
#define WGV 16
#endif
#if WGV == 8
typedef float8 wgvec;
typedef ufloat8 uwgvec;
#define WG_HSUM hsum8
#else
typedef float16 wgvec;
typedef ufloat16 uwgvec;
#define WG_HSUM hsum16
#endif
__kernel __attribute__((reqd_work_group_size(1, 1, 1))) __attribute__((min_vector_width(512)))
void wgrad_cpu(const int N, const int OC, const int C, const int OH, const int OW, const int HD, const int WD, const int pd,
               const int HX, const int WX, const int rows, __global const float *dyp, __global const float *xp,
               __global float *part) {
    const int c = get_global_id(0), o0 = get_global_id(1) * RO, chunk = get_global_id(2);
    const int r0 = chunk * rows, r1 = MIN(N * OH, r0 + rows);
    wgvec acc[RO][KS * KS];
#pragma unroll
    for (int i = 0; i < RO; i++)
#pragma unroll
        for (int t = 0; t < KS * KS; t++) acc[i][t] = 0.0f;
    for (int r = r0; r < r1;) {  // the chunk's rows image by image (a division per image, not per row)
        const int n = r / OH, y0 = r - n * OH, y1 = MIN(OH, y0 + r1 - r);
        __global const float *g[RO];
#pragma unroll
        for (int i = 0; i < RO; i++) g[i] = dyp + ((n * OC + MIN(o0 + i, OC - 1)) * HD + pd + y0) * WD + pd;
        __global const float *xr = xp + ((n * C + c) * HX + y0) * WX;
        for (int y = y0; y < y1; y++, xr += WX) {
            for (int x0 = 0; x0 < OW; x0 += WGV) {
                wgvec gv[RO];
#pragma unroll
                for (int i = 0; i < RO; i++) gv[i] = *(__global const uwgvec *)(g[i] + x0);
#pragma unroll
                for (int kh = 0; kh < KS; kh++)
#pragma unroll
                    for (int kw = 0; kw < KS; kw++) {
                        const wgvec xv = *(__global const uwgvec *)(xr + kh * WX + kw + x0);
#pragma unroll
                        for (int i = 0; i < RO; i++) acc[i][kh * KS + kw] += gv[i] * xv;
                    }
            }
#pragma unroll
            for (int i = 0; i < RO; i++) g[i] += WD;
        }
        r += y1 - y0;
    }
#pragma unroll
    for (int i = 0; i < RO; i++) {
        if (o0 + i >= OC) break;
        __global float *dst = part + ((chunk * OC + o0 + i) * C + c) * KS * KS;
#pragma unroll
        for (int t = 0; t < KS * KS; t++) dst[t] = WG_HSUM(acc[i][t]);
    }
}

// out[i] (+)= sum over the chunks of part[chunk][i], in order: the weight gradient's chunks, and
// the bias gradient from per-image sums (N, OC) (chunks = N). Work-item v takes i = 16 v .. 16 v +
// 15 as a float16 (one work-item per i in work-groups of 64 runs scalar)
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void sum_chunks_cpu(const int size, const int chunks, __global const float *part, __global float *out,
                    const int accumulate) {
    const int i0 = get_global_id(0) * 16;
    if (i0 + 16 <= size) {
        float16 s = 0.0f;
        for (int ch = 0; ch < chunks; ch++) s += *(__global const ufloat16 *)(part + ch * size + i0);
        __global ufloat16 *o = (__global ufloat16 *)(out + i0);
        *o = accumulate ? *o + s : s;
        return;
    }
    for (int i = i0; i < size; i++) {
        float s = 0.0f;
        for (int ch = 0; ch < chunks; ch++) s += part[ch * size + i];
        out[i] = accumulate ? out[i] + s : s;
    }
}

// out (N, CO, OH, OW) = the stride-1 correlation of zero-bordered input planes (N, CI, HP, WP;
// HP >= OH rounded up to RR, plus KS - 1; WP >= OW rounded up to 16, plus KS - 1) with the
// weights, plus bias[co] when has_bias: out[co] += wgt(co, ci, j, l) * inp[ci] shifted by (j, l).
// wgt = w[co * SCO + ci * SCI + j * KS + l]; a data gradient (inp = dy) passes w (CI, CO, KS, KS)
// with each filter's taps reversed (netcl.nn.conv._taps_reversed), so it builds no program of its own.
// Work-item (y, z): rows RR*y.. of image z / CB, channels RM * (z % CB).. (past CO: the last
// one's weights, not stored), every 16 columns of them in turn (a work-group per 16 columns
// costs more in PoCL's dispatch than its arithmetic); weights are broadcast from memory.
__kernel __attribute__((reqd_work_group_size(1, 1, 1))) __attribute__((min_vector_width(512)))
void corr_cpu(const int CI, const int CO, const int OH, const int OW, const int HP, const int WP, const int CB,
              const int SCO, const int SCI, __global const float *inp, __global const float *w,
              __global const float *bias, const int has_bias, __global float *out, const int stats,
              __global float *st) {
    const int y0 = get_global_id(0) * RR, n = get_global_id(1) / CB, cb = get_global_id(1) % CB;
    int wm[RM];  // the channels' first weights
#pragma unroll
    for (int m = 0; m < RM; m++) wm[m] = MIN(cb * RM + m, CO - 1) * SCO;
    for (int x0 = 0; x0 < OW; x0 += 16) {
        float16 acc[RR][RM], tot[RR][RM];
#pragma unroll
        for (int r = 0; r < RR; r++)
#pragma unroll
            for (int m = 0; m < RM; m++) tot[r][m] = 0.0f;
        __global const float *src = inp + n * CI * HP * WP + y0 * WP + x0;
        __global const float *wk = w;
        for (int c0 = 0; c0 < CI; c0 += FLUSH) {
#pragma unroll
            for (int r = 0; r < RR; r++)
#pragma unroll
                for (int m = 0; m < RM; m++) acc[r][m] = 0.0f;
            for (int ci = c0; ci < MIN(CI, c0 + FLUSH); ci++, src += HP * WP, wk += SCI) {
#pragma unroll
                for (int j = 0; j < KS; j++) {  // tap by tap: each weight broadcast once for the RR rows
#pragma unroll
                    for (int l = 0; l < KS; l++) {
                        float16 v[RR];
#pragma unroll
                        for (int r = 0; r < RR; r++) v[r] = *(__global const ufloat16 *)(src + (r + j) * WP + l);
#pragma unroll
                        for (int m = 0; m < RM; m++) {
                            const float wv = wk[wm[m] + j * KS + l];
#pragma unroll
                            for (int r = 0; r < RR; r++) acc[r][m] += wv * v[r];
                        }
                    }
                }
            }
#pragma unroll
            for (int r = 0; r < RR; r++)
#pragma unroll
                for (int m = 0; m < RM; m++) tot[r][m] += acc[r][m];
        }
#pragma unroll
        for (int m = 0; m < RM; m++) {
            const int co = cb * RM + m;
            if (co >= CO) break;
            const float b = has_bias ? bias[co] : 0.0f;
#pragma unroll
            for (int r = 0; r < RR; r++) {
                if (y0 + r >= OH) break;
                __global float *d = out + ((n * CO + co) * OH + y0 + r) * OW + x0;
                const float16 v = tot[r][m] + b;
                if (x0 + 16 <= OW) {
                    *(__global ufloat16 *)d = v;
                } else {
                    float t[16];
                    *(ufloat16 *)t = v;
                    for (int i = 0; i < OW - x0; i++) d[i] = t[i];
                }
            }
        }
        // stats (OW a multiple of 16, OH of RR): a BatchNorm2d's batch-statistics parts, the RR x 16
        // outputs of a channel a part, part-major (bn_stats_finish_cpu's ps = CO, as corrc_cpu's):
        // st[2 (p CO + co)], p = (n (OH / RR) + y0 / RR) (OW / 16) + x0 / 16 of P; the RM channels'
        // lane sums at once (hsum16x8: per channel hsum16's additions; a channel's 4 of them at a
        // time, its parts P apart, would be a large share of a stem conv's time)
        if (stats) {
            float16 s16[8], d16[8], q16[8];
            float bm[RM];
#pragma unroll
            for (int m = 0; m < 8; m++) s16[m] = d16[m] = q16[m] = 0.0f;
#pragma unroll
            for (int m = 0; m < RM; m++) {
                bm[m] = has_bias ? bias[MIN(cb * RM + m, CO - 1)] : 0.0f;
#pragma unroll
                for (int r = 0; r < RR; r++) s16[m] += tot[r][m] + bm[m];
            }
            const float8 sum = hsum16x8(s16), mu = sum / (float)(16 * RR);
            float mus[8];
            *(ufloat8 *)mus = mu;
#pragma unroll
            for (int m = 0; m < RM; m++)
#pragma unroll
                for (int r = 0; r < RR; r++) {
                    const float16 dv = tot[r][m] + bm[m] - mus[m];
                    d16[m] += dv, q16[m] += dv * dv;
                }
            const float8 ds = hsum16x8(d16), dev = hsum16x8(q16) - ds * ds / (float)(16 * RR);
            const int P = get_global_size(1) / CB * (OH / RR) * (OW / 16);
            const int co0 = cb * RM, lanes = MIN(RM, CO - co0);
            __global float *o = st + 2 * (((n * (OH / RR) + y0 / RR) * (OW / 16) + x0 / 16) * CO + co0);
            if (lanes == 8) {
                *(__global ufloat16 *)o = INTERLEAVE8(sum, dev);
            } else {
                float sl[8], dl[8];
                *(ufloat8 *)sl = sum, *(ufloat8 *)dl = dev;
                for (int m = 0; m < lanes; m++) o[2 * m] = sl[m], o[2 * m + 1] = dl[m];
            }
        }
    }
}

// The same correlation (any stride) for planes too narrow for corr_cpu's row vectors: the
// output channels are the vector lanes. The weights are packed channel-last first (wt[ci][j *
// KS + l][COP], COP = CO rounded up to 32, zeros past CO: pack_weights_cpu); a work-item owns CW
// output channels (two vectors: float16 for CW 32; float8 for CW 16, AVX2's, whose 2 * TC
// accumulators, two operands and a broadcast then fit its 16 registers) x TC positions of one
// output row (2 * TC accumulators) and broadcasts the inputs. Work-item (t, z): row tile t of
// the OH * XT (XT tiles of TC positions per row; past OW they read the zero border and are not
// stored), z = block * N + n (ceil(CO / CW) blocks): the work-items that run together share
// their block's weights (all of them would not stay in L2). STRIDE (the stride argument as a
// constant) and a pointer per input row: the inputs' offsets fold into the loads (with the
// stride an argument and j * WP in each offset, the code keeps 36 of them on the stack).
#ifndef CW
#define CW 32
#endif
#if CW == 16
#define CWV float8
#define UCWV ufloat8
#else
#define CWV float16
#define UCWV ufloat16
#endif
__kernel __attribute__((reqd_work_group_size(1, 1, 1))) __attribute__((min_vector_width(512)))
void corrc_cpu(const int CI, const int CO, const int COP, const int OH, const int OW, const int HP, const int WP,
               const int XT, const int stride, __global const float *inp, __global const float *wt,
               __global const float *bias, const int has_bias, __global float *out, const int stats,
               __global float *st) {
#ifdef STRIDE
    const int S = STRIDE;
#else
    const int S = stride;
#endif
    const int t = get_global_id(0), y = t / XT, x0 = (t - y * XT) * TC, N = get_global_size(1) / ((CO + CW - 1) / CW);
    const int n = get_global_id(1) % N, co0 = get_global_id(1) / N * CW;
    CWV acc[TC][2], tot[TC][2];
#pragma unroll
    for (int i = 0; i < TC; i++) tot[i][0] = tot[i][1] = 0.0f;
    // UNPAD: the input's row y * S - 1 and column x0 * S - 1 are padded row y * S, column x0 * S
    __global const float *src = inp + n * CI * HP * WP + (y * S - UNPAD) * WP + x0 * S - UNPAD;
    __global const float *wk = wt + co0;
    for (int c0 = 0; c0 < CI; c0 += FLUSH) {
#pragma unroll
        for (int i = 0; i < TC; i++) acc[i][0] = acc[i][1] = 0.0f;
        for (int ci = c0; ci < MIN(CI, c0 + FLUSH); ci++, src += HP * WP) {
#pragma unroll
            for (int j = 0; j < KS; j++) {
                if (UNPAD && j == 0 && y == 0) {  // row -1: zeros
                    wk += KS * COP;
                    continue;
                }
                __global const float *row = src + j * WP;  // its offsets then constants (else 36 of them go to the stack)
#pragma unroll
                for (int l = 0; l < KS; l++, wk += COP) {
                    const CWV w0 = *(__global const UCWV *)wk, w1 = *(__global const UCWV *)(wk + CW / 2);
#pragma unroll
                    for (int i = 0; i < TC; i++) {
                        const float v = UNPAD && l == 0 && i == 0 && x0 == 0 ? 0.0f : row[i * S + l];  // column -1
                        acc[i][0] += v * w0;
                        acc[i][1] += v * w1;
                    }
                }
            }
        }
#pragma unroll
        for (int i = 0; i < TC; i++) tot[i][0] += acc[i][0], tot[i][1] += acc[i][1];
    }
    __global float *dst = out + (n * CO + co0) * OH * OW + y * OW + x0;
    const int lanes = MIN(CW, CO - co0);
    float bl[CW];  // the bias in the lanes (0 past CO)
    for (int m = 0; m < CW; m++) bl[m] = has_bias && m < lanes ? bias[co0 + m] : 0.0f;
    const CWV b0 = *(UCWV *)bl, b1 = *(UCWV *)(bl + CW / 2);
    float v[TC][CW];  // stored by lane: dst's channels are planes apart
#pragma unroll
    for (int i = 0; i < TC; i++) {
        tot[i][0] += b0, tot[i][1] += b1;
        *(UCWV *)v[i] = tot[i][0];
        *(UCWV *)(v[i] + CW / 2) = tot[i][1];
    }
#if TC == 8  // a channel's 8 (AVX2: 4) positions as one vector (scalar stores would be a large share of
            // a 16-channel stride-2 conv)
    if (x0 + TC <= OW) {
        for (int m = 0; m < lanes; m++)
            *(__global ufloat8 *)(dst + m * OH * OW) =
                (float8)(v[0][m], v[1][m], v[2][m], v[3][m], v[4][m], v[5][m], v[6][m], v[7][m]);
    } else
#elif TC == 4
    if (x0 + TC <= OW) {
        for (int m = 0; m < lanes; m++)
            *(__global ufloat4 *)(dst + m * OH * OW) = (float4)(v[0][m], v[1][m], v[2][m], v[3][m]);
    } else
#endif
    {
        for (int m = 0; m < lanes; m++)
            for (int i = 0; i < MIN(TC, OW - x0); i++) dst[m * OH * OW + i] = v[i][m];
    }
    // stats (OW a multiple of TC): a BatchNorm2d's batch-statistics parts, the TC outputs of each
    // channel a part, summed lane by lane (the lanes are the channels): st[2 (p CO + co)], p = n OH
    // XT + t, a part's channels together (bn_stats_finish_cpu's ps = CO; with a channel's parts
    // together, as pw2_fwd_cpu's, a work-item's 32 stores would go 16 KiB apart, into one L1 set)
    if (stats) {
        float sl[CW], ql[CW];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            CWV sum = 0.0f, sd = 0.0f, sq = 0.0f;
#pragma unroll
            for (int i = 0; i < TC; i++) sum += tot[i][h];
            const CWV mu = sum / (float)TC;
#pragma unroll
            for (int i = 0; i < TC; i++) {
                const CWV d = tot[i][h] - mu;
                sd += d, sq += d * d;
            }
            *(UCWV *)(sl + CW / 2 * h) = sum;
            *(UCWV *)(ql + CW / 2 * h) = sq - sd * sd / (float)TC;
        }
        __global float *o = st + 2 * ((n * OH * XT + t) * CO + co0);
        for (int m = 0; m < lanes; m++) o[2 * m] = sl[m], o[2 * m + 1] = ql[m];
    }
}

// A strided convolution's data gradient, channels in the vector lanes as corrc_cpu: dx[n][c][ih]
// [iw] = sum over (o, j, l) of w[o][c][j][l] * dy[n][o][(ih + p - j) / S][(iw + p - l) / S],
// over the taps where both divide. A work-item owns 16 * CV channels (CV float16: 2, or 1 where
// the gradient has at most 16 channels, which would leave half of two vectors' lanes zero) x TC
// positions iw0 + S * i of row ih (one phase of the row: the same taps are valid for all of them,
// and their dy inputs are consecutive), so no multiply-add meets an inserted zero. dyb: dy (N,
// CI, OH, OW) at row and column T = ceil((KS - 1) / S) of zero planes (N, CI, HD, WD); wt[o][j *
// KS + l][COP] (channels past CO zero). Work-item (t, z): t = ((ih * S) + phase) * XT + tile, z =
// block * N + n. Each FLUSH input channels' sums join the output tile in private memory.
#ifndef CV
#define CV 2
#endif
__kernel __attribute__((reqd_work_group_size(1, 1, 1))) __attribute__((min_vector_width(512)))
void corrt_cpu(const int CI, const int CO, const int COP, const int H, const int W, const int HD, const int WD,
               const int XT, const int S, const int p, const int T, __global const float *dyb,
               __global const float *wt, __global float *out) {
    const int t = get_global_id(0), tile = t % XT, phase = t / XT % S, ih = t / (XT * S);
    const int iw0 = phase + S * TC * tile, N = get_global_size(1) / (COP / (16 * CV));
    const int n = get_global_id(1) % N, co0 = get_global_id(1) / N * (16 * CV);
    float16 acc[TC][CV], tot[TC][CV];
#pragma unroll
    for (int i = 0; i < TC; i++)
#pragma unroll
        for (int v = 0; v < CV; v++) tot[i][v] = 0.0f;
    const int j0 = (ih + p) % S, l0 = (iw0 + p) % S;
    for (int c0 = 0; c0 < CI; c0 += FLUSH) {
#pragma unroll
        for (int i = 0; i < TC; i++)
#pragma unroll
            for (int v = 0; v < CV; v++) acc[i][v] = 0.0f;
        for (int ci = c0; ci < MIN(CI, c0 + FLUSH); ci++) {
            for (int j = j0; j < KS; j += S) {
                __global const float *row = dyb + ((n * CI + ci) * HD + (ih + p - j + S * T) / S) * WD;
                for (int l = l0; l < KS; l += S) {
                    __global const float *src = row + (iw0 + p - l + S * T) / S;
                    __global const float *wk = wt + (ci * KS * KS + j * KS + l) * COP + co0;
                    float16 wv[CV];
#pragma unroll
                    for (int v = 0; v < CV; v++) wv[v] = *(__global const ufloat16 *)(wk + 16 * v);
#pragma unroll
                    for (int i = 0; i < TC; i++)
#pragma unroll
                        for (int v = 0; v < CV; v++) acc[i][v] += src[i] * wv[v];
                }
            }
        }
#pragma unroll
        for (int i = 0; i < TC; i++)
#pragma unroll
            for (int v = 0; v < CV; v++) tot[i][v] += acc[i][v];
    }
    __global float *dst = out + (n * CO + co0) * H * W + ih * W + iw0;
    const int lanes = MIN(16 * CV, CO - co0), count = iw0 < W ? MIN(TC, (W - 1 - iw0) / S + 1) : 0;
    float vals[TC][16 * CV];
#pragma unroll
    for (int i = 0; i < TC; i++)
#pragma unroll
        for (int v = 0; v < CV; v++) *(ufloat16 *)(vals[i] + 16 * v) = tot[i][v];
    for (int m = 0; m < lanes; m++)
        for (int i = 0; i < count; i++) dst[m * H * W + S * i] = vals[i][m];
}

// wt[ci][tap][co] (COP >= CO columns, zeros past CO) from a convolution's weights for corrc_cpu
// and corrt_cpu: w (CO, CI, KS, KS), or (transposed) w (CI, CO, KS, KS), the taps in reverse
// order where `reverse` (a stride-1 data gradient). One work-item per (ci, co).
__kernel void pack_weights_cpu(const int CO, const int CI, const int COP, const int transposed, const int reverse,
                               __global const float *w, __global float *wt) {
    const int g = get_global_id(0);
    if (g >= CI * COP) return;
    const int ci = g / COP, co = g - ci * COP;
    __global float *d = wt + ci * KS * KS * COP + co;
    __global const float *s = w + (transposed ? ci * CO + co : co * CI + ci) * KS * KS;
    for (int tap = 0; tap < KS * KS; tap++) d[tap * COP] = co < CO ? s[reverse ? KS * KS - 1 - tap : tap] : 0.0f;
}

// im2col for CPUs from the zero-bordered planes xp (N, C, HP, WP): cols (C*KS*KS, N*OH*OW),
// row (c, j, l), column (n, y, x) = xp[n][c][S*y + j][S*x + l], no bounds checks. Work-item
// (r, g): cols row r, output rows (n, y) [g * rows, ...), copied in vectors (stride 2: the even
// lanes of two).
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void im2col_cpu(const int C, const int HP, const int WP, const int OH, const int OW, const int S, const int NOH,
                const int rows, __global const float *xp, __global float *cols) {
    const int r = get_global_id(0), c = r / (KS * KS), j = r / KS % KS, l = r % KS;
    const int t1 = MIN(NOH, (int)get_global_id(1) * rows + rows);
    for (int t = get_global_id(1) * rows; t < t1; t++) {
        const int n = t / OH, y = t - n * OH;
        __global float *dst = cols + r * NOH * OW + t * OW;
#if UNPAD  // x as it is (S 2, KS 3, padding 1): input row 2y + j - 1, column 2x + l - 1
        if (S * y + j == 0) {  // row -1
            for (int x = 0; x < OW; x++) dst[x] = 0.0f;
            continue;
        }
        __global const float *src = xp + ((n * C + c) * HP + S * y + j - 1) * WP + l - 1;
#else
        __global const float *src = xp + ((n * C + c) * HP + S * y + j) * WP + l;
#endif
        int x = 0;
        if (UNPAD && l == 0) {  // the first vector's first input is column -1: zero, the rest from column 0 on
            if (OW >= 16) {
                const float16 a = *(__global const ufloat16 *)(src + 1), b = *(__global const ufloat16 *)(src + 16);
                float16 v = __builtin_shufflevector(a, b, 0, 1, 3, 5, 7, 9, 11, 13, 16, 18, 20, 22, 24, 26, 28, 30);
                v.s0 = 0.0f;
                *(__global ufloat16 *)dst = v;
                x = 16;
            } else {
                const float8 a = *(__global const ufloat8 *)(src + 1), b = *(__global const ufloat8 *)(src + 7);
                float8 v = __builtin_shufflevector(a, b, 0, 1, 3, 5, 7, 11, 13, 15);
                v.s0 = 0.0f;
                *(__global ufloat8 *)dst = v;
                x = 8;
            }
        }
        if (S == 1) {
            for (; x + 16 <= OW; x += 16) *(__global ufloat16 *)(dst + x) = *(__global const ufloat16 *)(src + x);
            for (; x + 8 <= OW; x += 8) *(__global ufloat8 *)(dst + x) = *(__global const ufloat8 *)(src + x);
        } else if (S == 2) {
            // the even lanes of two loads, the second ending at the last element used (2x + 30,
            // 2x + 14): a row holds no more (a load at 2x + 16 would read one float past it)
            for (; x + 16 <= OW; x += 16) {
                const float16 a = *(__global const ufloat16 *)(src + 2 * x), b = *(__global const ufloat16 *)(src + 2 * x + 15);
                *(__global ufloat16 *)(dst + x) = __builtin_shufflevector(a, b, 0, 2, 4, 6, 8, 10, 12, 14, 17, 19, 21, 23,
                                                                          25, 27, 29, 31);
            }
            for (; x + 8 <= OW; x += 8) {  // 8x8 outputs
                const float8 a = *(__global const ufloat8 *)(src + 2 * x), b = *(__global const ufloat8 *)(src + 2 * x + 7);
                *(__global ufloat8 *)(dst + x) = __builtin_shufflevector(a, b, 0, 2, 4, 6, 9, 11, 13, 15);
            }
        }
        for (; x < OW; x++) dst[x] = src[S * x];
    }
}

// The weight and bias gradients of a stride-1 undilated convolution with few weights per output
// channel (Conv2d's "channels" mode, WC * KS * KS <= 27: a network's first layer on planes
// of rows of 4, 8 or 16 outputs) straight from dy (N, OC, OH, OW) and the forward's padded x (xp: N, WC, HP,
// WP; HP >= OH + KS - 1, WP >= OW + KS - 1), where im2col_cpu, dy_rows_cpu, a GEMM and
// sum_chunks_cpu take four launches. Work-item (ob, chunk): blocks of WRO output channels ob *
// WRO.., then every get_global_size(0)-th block after it (the last block repeats the last
// channel, not stored), over the images [chunk * imgs, ...): WRO * (WC * KS * KS + 1)
// accumulators of WV lanes (the last for the bias), WRO + WC * KS * KS vector loads per WRO * WC
// * KS * KS multiply-adds. PAIR (rows of WH = WV / 2, an even OH): a vector holds two output rows,
// dy's adjacent and x's two half rows joined, each half row of x loaded once for two taps; else
// a row is one vector (OW = WV; with a scalar tail, rows of 9-15 are slower than im2col and a
// GEMM, so Conv2d does not send them here: tuning.json's conv_cutoffs, narrow_widths). The
// accumulators join running totals every `run` output rows (about 32 vectors a lane: no lane adds
// a long sequential run). chunks == 1: gw (OC, WC*KS*KS) and, has_bias, gb (OC) written, or
// added to where acc_w / acc_b; else the chunk's sums go to part[chunk][OC * WC*KS*KS] and
// partb[chunk][OC] for sum_chunks_cpu.
#ifndef WC
#define WC 1
#endif
#ifndef WV
#define WV 8
#endif
#ifndef WRO
#define WRO 2
#endif
#ifndef PAIR  // 1: OW = WH = WV / 2 and OH even, a vector holds two output rows
#define PAIR 0
#define WH 4
#endif
#define RSTEP (PAIR ? 2 : 1)
#define WCK (WC * KS * KS)
#define WVEC VCAT(float, WV)
#define WHVEC VCAT(float, WH)
typedef WHVEC __attribute__((aligned(4))) uwhvec;
#define WHSUM VCAT(hsum, WV)
typedef WVEC __attribute__((aligned(4))) uwvec;

__kernel __attribute__((reqd_work_group_size(1, 1, 1))) __attribute__((min_vector_width(512)))
void wgrad_narrow_cpu(const int N, const int HP, const int WP, const int OC, const int OH, const int OW, const int imgs,
                      const int run, __global const float *xp, __global const float *dy, __global float *gw,
                      __global float *gb, const int has_bias, const int acc_w, const int acc_b, __global float *part,
                      __global float *partb) {
    const int chunk = get_global_id(1), n0 = chunk * imgs, n1 = MIN(N, n0 + imgs);
    for (int o0 = get_global_id(0) * WRO; o0 < OC; o0 += get_global_size(0) * WRO) {
        float tot[WRO][WCK + 1];
        WVEC acc[WRO][WCK + 1];
#pragma unroll
        for (int i = 0; i < WRO; i++)
#pragma unroll
            for (int t = 0; t <= WCK; t++) tot[i][t] = 0.0f, acc[i][t] = 0.0f;
        int rows = 0;
        for (int n = n0; n < n1; n++) {
            __global const float *g[WRO];
#pragma unroll
            for (int i = 0; i < WRO; i++) g[i] = dy + (n * OC + MIN(o0 + i, OC - 1)) * OH * OW;
            __global const float *xr = xp + n * WC * HP * WP;
            for (int y = 0; y < OH; y += RSTEP, xr += RSTEP * WP) {  // a vector: RSTEP rows of dy
                WVEC gv[WRO];
#pragma unroll
                for (int i = 0; i < WRO; i++) {
                    gv[i] = *(__global const uwvec *)(g[i] + y * OW);
                    acc[i][WCK] += gv[i];
                }
#if PAIR
#pragma unroll
                for (int c = 0; c < WC; c++)
#pragma unroll
                    for (int l = 0; l < KS; l++) {
                        WHVEC h[KS + 1];
#pragma unroll
                        for (int j = 0; j <= KS; j++) h[j] = *(__global const uwhvec *)(xr + (c * HP + j) * WP + l);
#pragma unroll
                        for (int j = 0; j < KS; j++) {
                            const WVEC xv = JOIN_HALVES(WV, h[j], h[j + 1]);
#pragma unroll
                            for (int i = 0; i < WRO; i++) acc[i][(c * KS + j) * KS + l] += gv[i] * xv;
                        }
                    }
#else
#pragma unroll
                for (int t = 0; t < WCK; t++) {
                    const int c = t / (KS * KS), j = t / KS % KS, l = t % KS;
                    const WVEC xv = *(__global const uwvec *)(xr + (c * HP + j) * WP + l);
#pragma unroll
                    for (int i = 0; i < WRO; i++) acc[i][t] += gv[i] * xv;
                }
#endif
                rows += RSTEP;
                if (rows >= run || (n == n1 - 1 && y + RSTEP >= OH)) {  // the run's sums join the totals
                    rows = 0;
#pragma unroll
                    for (int i = 0; i < WRO; i++)
#pragma unroll
                        for (int t = 0; t <= WCK; t++) {
                            tot[i][t] += WHSUM(acc[i][t]);
                            acc[i][t] = 0.0f;
                        }
                }
            }
        }
#pragma unroll
        for (int i = 0; i < WRO; i++) {
            const int o = o0 + i;
            if (o >= OC) break;
            if (part) {
#pragma unroll
                for (int t = 0; t < WCK; t++) part[(chunk * OC + o) * WCK + t] = tot[i][t];
                partb[chunk * OC + o] = tot[i][WCK];
                continue;
            }
#pragma unroll
            for (int t = 0; t < WCK; t++) gw[o * WCK + t] = acc_w ? gw[o * WCK + t] + tot[i][t] : tot[i][t];
            if (has_bias) gb[o] = acc_b ? gb[o] + tot[i][WCK] : tot[i][WCK];
        }
    }
}

// col2im for CPUs: dx(n, c, ih, iw) = the sum of the dcols (C*k*k, N*OH*OW) entries that
// read it (+ bias[c] when has_bias: ConvTranspose2d's forward is this gather). A work-item
// gathers `rows` input rows of (N*C*H) into their place in dx, tap by tap in conv.cl's col2im_gpu
// order; with stride 1 a tap adds a shifted dcols row, in vectors.
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void col2im_cpu(const int NCH, const int rows, const int C, const int H, const int W, const int k, const int s,
                const int p, const int d, const int OH, const int OW, __global const float *dcols,
                __global const float *bias, const int has_bias, __global float *dx) {
    const int NP = NCH / (C * H) * OH * OW, r1 = MIN(NCH, (int)get_global_id(0) * rows + rows);
    for (int r = get_global_id(0) * rows; r < r1; r++) {
        const int ih = r % H, c = (r / H) % C, n = r / (H * C);
        __global float *dst = dx + r * W;
        const float b = has_bias ? bias[c] : 0.0f;
        int i = 0;
        for (; i + 16 <= W; i += 16) *(__global ufloat16 *)(dst + i) = 0.0f;
        for (; i < W; i++) dst[i] = 0.0f;
        for (int kh = 0; kh < k; kh++) {
            const int th = ih + p - kh * d;
            if (th < 0 || th % s || th / s >= OH) continue;
            __global const float *row = dcols + (c * k + kh) * k * NP + (n * OH + th / s) * OW;
            for (int kw = 0; kw < k; kw++) {
                __global const float *src = row + kw * NP;
                // iw = ow * s - p + kw * d for ow in [0, OW), iw in [0, W)
                const int off = kw * d - p, last = W - 1 - off;
                const int ow0 = off < 0 ? (-off + s - 1) / s : 0, ow1 = last < 0 ? 0 : MIN(OW, last / s + 1);
                if (s == 1) {
                    __global float *dd = dst + off;
                    int ow = ow0;
                    for (; ow + 16 <= ow1; ow += 16)
                        *(__global ufloat16 *)(dd + ow) += *(__global const ufloat16 *)(src + ow);
                    for (; ow < ow1; ow++) dd[ow] += src[ow];
                } else {
                    for (int ow = ow0; ow < ow1; ow++) dst[ow * s + off] += src[ow];
                }
            }
        }
        if (has_bias)
            for (i = 0; i < W; i++) dst[i] += b;
    }
}

// A 1x1 convolution of stride 2 without padding on planes of even size (H = 2 OH, W = 2 OW; a
// ResNet shortcut): 16 consecutive output positions of a plane in the lanes of a float16, their
// inputs the even elements of one input row (OW a multiple of 16: EVEN_LOAD) or of two (OW = 8,
// PW2_ROWS 2: rows 2y and 2y + 2). Forward, weight gradient and data gradient (added into a
// tensor, or written with the zeros of the odd positions): no im2col columns, no GEMM operands,
// no col2im (whose copies, not the multiply-adds, would be most of the time). Work-item v
// of the N * OH * OW / 16 vectors.
#ifndef PW2_ROWS
#define PW2_ROWS 1
#endif
// PW_RM: pw2_fwd_cpu's and pw2_dgrad_cpu's channels a block, float16 accumulators each (8; 4 on
// AVX2, whose 16 registers 8 of them fill); the statistics take 8 channels at once (hsum16x8)
#ifndef PW_RM
#define PW_RM 8
#endif

// the inputs of the 16 positions from p = &x[n][c][2y][2x0]
#if PW2_ROWS == 1
#define PW2_LOAD(p, OW) EVEN_LOAD(ufloat16, 16, p)
#else
#define PW2_LOAD(p, OW) __builtin_shufflevector(*(__global const ufloat16 *)(p), \
    *(__global const ufloat16 *)((p) + 4 * (OW)), 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30)
#endif

// out[n][o][y][x] = sum over c of w[o][c] * x[n][c][2y][2x] (+ bias[o]), every output channel in
// blocks of PW_RM (the inputs of one vector stay in L1). st (where not 0): the batch-statistics
// parts of a BatchNorm2d after it, a part the 16 values of a vector, as conv_winot.cl's STATS:
// st[2 (o P + v)] their sum, st[2 (o P + v) + 1] their squared deviations from their mean, P the
// number of vectors.
__kernel __attribute__((reqd_work_group_size(1, 1, 1))) __attribute__((min_vector_width(512)))
void pw2_fwd_cpu(const int C, const int CO, const int OH, const int OW, __global const float *x,
                 __global const float *w, __global const float *bias, const int has_bias, __global float *out,
                 const int stats, __global float *st) {
    const int VP = OH * OW / 16, v = get_global_id(0), n = v / VP, p0 = (v - n * VP) * 16;
    const int y = p0 / OW, x0 = p0 - y * OW, HW = 4 * OH * OW;
    __global const float *src = x + n * C * HW + 4 * y * OW + 2 * x0;
    for (int o0 = 0; o0 < CO; o0 += PW_RM) {
        const int m1 = MIN(PW_RM, CO - o0);
        float16 acc[PW_RM], tot[PW_RM];
#pragma unroll
        for (int m = 0; m < PW_RM; m++) tot[m] = 0.0f;
        for (int c0 = 0; c0 < C; c0 += FLUSH) {
#pragma unroll
            for (int m = 0; m < PW_RM; m++) acc[m] = 0.0f;
            for (int c = c0; c < MIN(C, c0 + FLUSH); c++) {
                const float16 xv = PW2_LOAD(src + c * HW, OW);
#pragma unroll
                for (int m = 0; m < PW_RM; m++) acc[m] += w[(o0 + MIN(m, m1 - 1)) * C + c] * xv;
            }
#pragma unroll
            for (int m = 0; m < PW_RM; m++) tot[m] += acc[m];
        }
        __global float *dst = out + (n * CO + o0) * OH * OW + p0;
        float16 z[8], d[8], dd[8];  // zeros past PW_RM
#pragma unroll
        for (int m = 0; m < 8; m++) z[m] = 0.0f;
#pragma unroll
        for (int m = 0; m < PW_RM; m++) {
            z[m] = tot[m] + (has_bias ? bias[o0 + MIN(m, m1 - 1)] : 0.0f);
            if (m < m1) *(__global ufloat16 *)(dst + m * OH * OW) = z[m];
        }
        if (stats) {  // the deviations' sum corrects the mean's rounding (norm.cl's bn_stats_part)
            const float8 sum = hsum16x8(z);
            float mus[8];
            *(ufloat8 *)mus = sum / 16.0f;
#pragma unroll
            for (int m = 0; m < 8; m++) d[m] = z[m] - mus[m], dd[m] = d[m] * d[m];
            const float8 ds = hsum16x8(d), dev = hsum16x8(dd) - ds * ds / 16.0f;
            float sl[8], dl[8];
            *(ufloat8 *)sl = sum, *(ufloat8 *)dl = dev;
            for (int m = 0; m < m1; m++) {
                __global float *o = st + 2 * ((o0 + m) * (int)get_global_size(0) + v);
                o[0] = sl[m], o[1] = dl[m];
            }
        }
    }
}

// part[g][o][c] = the sum over images [g * chunk, ...) of dy[n][o] . x[n][c] at the even positions:
// a chunk's share of the weight gradient (sum_chunks_cpu adds the chunks in order). Work-item
// (c block of PW_WC, o block of 4, chunk g): 4 x PW_WC vector accumulators over a short chunk
// (_image_chunks). PW_WC 4: float16 accumulators; 2 (AVX2, whose 16 registers 4 x 4 float16
// would fill twice over): float8 ones, a product's two halves added into one
#ifndef PW_WC
#define PW_WC 4
#endif
#if PW_WC == 4
#define PW_ACC float16
#define PW_MAD(a, d, x) ((a) + (d) * (x))
#define PW_HSUM hsum16
#else
#define PW_ACC float8
#define PW_MAD(a, d, x) ((d).hi * (x).hi + ((d).lo * (x).lo + (a)))  // two FMAs (contracted; fma() is a call on PyPI's PoCL 3.0)
#define PW_HSUM hsum8
#endif
__kernel __attribute__((reqd_work_group_size(1, 1, 1))) __attribute__((min_vector_width(512)))
void pw2_wgrad_cpu(const int N, const int C, const int CO, const int OH, const int OW, const int chunk,
                   __global const float *x, __global const float *dy, __global float *part) {
    const int c0 = get_global_id(0) * PW_WC, o0 = get_global_id(1) * 4, g = get_global_id(2), P = OH * OW, HW = 4 * P;
    PW_ACC acc[4][PW_WC];
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
        for (int i = 0; i < PW_WC; i++) acc[j][i] = 0.0f;
    for (int n = g * chunk; n < MIN(N, g * chunk + chunk); n++)
        for (int y = 0, p0 = 0; y < OH; y += PW2_ROWS)
            for (int x0 = 0; x0 < OW; x0 += 16 / PW2_ROWS, p0 += 16) {
                float16 xv[PW_WC];
#pragma unroll
                for (int i = 0; i < PW_WC; i++)
                    xv[i] = PW2_LOAD(x + (n * C + MIN(c0 + i, C - 1)) * HW + 4 * y * OW + 2 * x0, OW);
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const float16 dv = *(__global const ufloat16 *)(dy + (n * CO + MIN(o0 + j, CO - 1)) * P + p0);
#pragma unroll
                    for (int i = 0; i < PW_WC; i++) acc[j][i] = PW_MAD(acc[j][i], dv, xv[i]);
                }
            }
    for (int j = 0; j < MIN(4, CO - o0); j++)
        for (int i = 0; i < MIN(PW_WC, C - c0); i++) part[(g * CO + o0 + j) * C + c0 + i] = PW_HSUM(acc[j][i]);
}

// dx[n][c][2y][2x] (+)= sum over o of w[o][c] * dy[n][o][y][x] where `add` (a Residual's shortcut
// into the body's gradient); otherwise dx written whole, its odd rows and columns zero. Every
// input channel in blocks of PW_RM for one vector of positions: the even lanes of 2 x 16 floats of
// their input rows (one row, or two rows apart for PW2_ROWS 2), and the odd rows below them.
// DX_ACT (an activation code, with `add`): the finished sum, odd rows too, goes through the
// gradient of that activation, whose output `act_out` is (a Residual before this convolution's
// block ran it in its sum: Sequential's training path), so that no act_bwd_cpu pass follows.
#ifndef DX_ACT
#define DX_ACT 0
#endif
__kernel __attribute__((reqd_work_group_size(1, 1, 1))) __attribute__((min_vector_width(512)))
void pw2_dgrad_cpu(const int C, const int CO, const int OH, const int OW, __global const float *dy,
                   __global const float *w, const int add, __global float *dx, __global const float *act_out,
                   const float act_slope) {
    const int VP = OH * OW / 16, v = get_global_id(0), n = v / VP, p0 = (v - n * VP) * 16;
    const int y = p0 / OW, x0 = p0 - y * OW, P = OH * OW, W = 2 * OW;
    const int hi_at = PW2_ROWS == 1 ? 16 : 2 * W;  // where lanes 8..15 go from lane 0's input
    __global const float *src = dy + n * CO * P + p0;
    for (int c0 = 0; c0 < C; c0 += PW_RM) {
        const int m1 = MIN(PW_RM, C - c0);
        float16 acc[PW_RM], tot[PW_RM];
#pragma unroll
        for (int m = 0; m < PW_RM; m++) tot[m] = 0.0f;
        for (int o0 = 0; o0 < CO; o0 += FLUSH) {
#pragma unroll
            for (int m = 0; m < PW_RM; m++) acc[m] = 0.0f;
            for (int o = o0; o < MIN(CO, o0 + FLUSH); o++) {
                const float16 dv = *(__global const ufloat16 *)(src + o * P);
#pragma unroll
                for (int m = 0; m < PW_RM; m++) acc[m] += w[o * C + c0 + MIN(m, m1 - 1)] * dv;
            }
#pragma unroll
            for (int m = 0; m < PW_RM; m++) tot[m] += acc[m];
        }
        for (int m = 0; m < m1; m++) {
            __global float *d = dx + ((n * C + c0 + m) * 2 * OH + 2 * y) * W + 2 * x0;
            const float16 lo = INTERLEAVE8(tot[m].lo, 0.0f), hi = INTERLEAVE8(tot[m].hi, 0.0f);
            if (add && DX_ACT) {  // rows 2y (+ lo, hi) and 2y + 1 (as they are) through the activation
                __global const float *s = act_out + (d - dx);
#define DX_AT(o) (*(__global ufloat16 *)(d + (o)))
#define DX_ACT_AT(o, g) (DX_AT(o) = ACT_GRAD(DX_ACT, *(__global const ufloat16 *)(s + (o)), g, act_slope))
                DX_ACT_AT(0, DX_AT(0) + lo);
                DX_ACT_AT(hi_at, DX_AT(hi_at) + hi);
                DX_ACT_AT(W, DX_AT(W));
                DX_ACT_AT(hi_at + W, DX_AT(hi_at + W));
#undef DX_ACT_AT
#undef DX_AT
            } else if (add) {
                *(__global ufloat16 *)d += lo;
                *(__global ufloat16 *)(d + hi_at) += hi;
            } else {
                *(__global ufloat16 *)d = lo;
                *(__global ufloat16 *)(d + hi_at) = hi;
                *(__global ufloat16 *)(d + W) = 0.0f;
                *(__global ufloat16 *)(d + hi_at + W) = 0.0f;
            }
        }
    }
}

// A 3x3 stride-2 padding-1 convolution's data gradient on planes of even size (H = 2 OH, W = 2 OW)
// by phases: dx row 2y takes dy row y through the weights' middle row, row 2y + 1 takes dy rows
// y + 1 and y through the first and the last; the columns alike. 16 consecutive dy positions of a
// plane in the lanes of a float16, as the pw2 kernels (one row, OW a multiple of 16; two rows for
// OW = 8, PW2_ROWS 2), and the same shifted one column (the lanes past a row's end zero): no
// multiply-add meets an inserted zero and dy needs no zero border (a corrt_cpu with channels in
// the lanes would store its outputs lane by lane, 2 apart, and read a padded copy of dy). Work-item
// (v, z): vector v of the N * OH * OW / 16, z = input channel block of CT2_RM; 4 accumulators
// per channel (dx rows 2y and 2y + 1, even and odd columns), each FLUSH output channels' sums
// joining a running total; stores of 16 interleaved columns.
#ifndef CT2_RM
#define CT2_RM 4
#endif
__kernel __attribute__((reqd_work_group_size(1, 1, 1))) __attribute__((min_vector_width(512)))
void corrt2_cpu(const int C, const int CO, const int OH, const int OW, __global const float *dy,
                __global const float *w, __global float *dx) {
    const int VP = OH * OW / 16, v = get_global_id(0), n = v / VP, p0 = (v - n * VP) * 16;
    const int y = p0 / OW, x0 = p0 - y * OW, P = OH * OW, W = 2 * OW, c0 = get_global_id(1) * CT2_RM;
    const int m1 = MIN(CT2_RM, C - c0);
    const int hi_at = PW2_ROWS == 1 ? 16 : 2 * W;  // where lanes 8..15 go from lane 0's output
    // the next dy row exists (PW2_ROWS 2: lanes 8..15's, rows y + 2; lanes 0..7's always do)
    const bool below = y + PW2_ROWS < OH, right = x0 + 16 < OW;
    float16 acc[CT2_RM][4], tot[CT2_RM][4];
#pragma unroll
    for (int m = 0; m < CT2_RM; m++)
#pragma unroll
        for (int t = 0; t < 4; t++) tot[m][t] = 0.0f;
    __global const float *src = dy + n * CO * P + p0;
    for (int o0 = 0; o0 < CO; o0 += FLUSH) {
#pragma unroll
        for (int m = 0; m < CT2_RM; m++)
#pragma unroll
            for (int t = 0; t < 4; t++) acc[m][t] = 0.0f;
        for (int o = o0; o < MIN(CO, o0 + FLUSH); o++) {
            __global const float *s = src + o * P;
            const float16 d0 = *(__global const ufloat16 *)s;
#if PW2_ROWS == 1
            const float16 d1 = below ? *(__global const ufloat16 *)(s + OW) : 0.0f;
            const float16 d0s = right ? *(__global const ufloat16 *)(s + 1) : __builtin_shufflevector(d0, (float16)0.0f,
                1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16);
            const float16 d1s = right && below ? *(__global const ufloat16 *)(s + OW + 1) : __builtin_shufflevector(d1,
                (float16)0.0f, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16);
#else
            const float8 d1lo = *(__global const ufloat8 *)(s + 8), d1hi = below ? *(__global const ufloat8 *)(s + 16) : 0.0f;
            const float16 d1 = JOIN_HALVES(16, d1lo, d1hi);
            const float16 d0s = __builtin_shufflevector(d0, (float16)0.0f, 1, 2, 3, 4, 5, 6, 7, 16, 9, 10, 11, 12, 13, 14, 15, 16);
            const float16 d1s = __builtin_shufflevector(d1, (float16)0.0f, 1, 2, 3, 4, 5, 6, 7, 16, 9, 10, 11, 12, 13, 14, 15, 16);
#endif
#pragma unroll
            for (int m = 0; m < CT2_RM; m++) {
                __global const float *k = w + (o * C + c0 + MIN(m, m1 - 1)) * 9;
                // one multiply-add a statement: a sum of products first would not contract
                acc[m][0] += k[4] * d0;
                acc[m][1] += k[3] * d0s;
                acc[m][1] += k[5] * d0;
                acc[m][2] += k[1] * d1;
                acc[m][2] += k[7] * d0;
                acc[m][3] += k[0] * d1s;
                acc[m][3] += k[2] * d1;
                acc[m][3] += k[6] * d0s;
                acc[m][3] += k[8] * d0;
            }
        }
#pragma unroll
        for (int m = 0; m < CT2_RM; m++)
#pragma unroll
            for (int t = 0; t < 4; t++) tot[m][t] += acc[m][t];
    }
    for (int m = 0; m < m1; m++) {
        __global float *d = dx + ((n * C + c0 + m) * 2 * OH + 2 * y) * W + 2 * x0;
        *(__global ufloat16 *)d = INTERLEAVE8(tot[m][0].lo, tot[m][1].lo);
        *(__global ufloat16 *)(d + hi_at) = INTERLEAVE8(tot[m][0].hi, tot[m][1].hi);
        *(__global ufloat16 *)(d + W) = INTERLEAVE8(tot[m][2].lo, tot[m][3].lo);
        *(__global ufloat16 *)(d + hi_at + W) = INTERLEAVE8(tot[m][2].hi, tot[m][3].hi);
    }
}

// part[g][o][c][j][l] = the sum over images [g * chunk, ...) and positions (y, x) of dy[n][o][y][x]
// * x[n][c][2y + j - 1][2x + l - 1]: a chunk's share of a 3x3 stride-2 padding-1 convolution's
// weight gradient from its input x (N, C, H, W) as it is (row -1 and column -1 zero) and dy (N, CO,
// OH, OW), OW a multiple of WG2_VW: WG2_VW dy positions of a row in the lanes. A vector's inputs
// for tap (j, l) are the even (l = 0) or odd (l = 1) lanes of two loads of input row 2y + j - 1
// from column 2 x0 - 1, or the odd lanes of the same one column on (l = 2). No im2col columns and
// no GEMM operand copy of dy. Work-item (c, block of WG2_O output channels, chunk g) takes the taps
// of one kernel row j at a time: WG2_O x 3 accumulators, the three tap vectors of an input row
// serving WG2_O dy vectors: float16 and 8 channels, 24 of AVX-512's 32 registers (AVX2 runs
// wgrad2o_cpu: in float8 x 4 this kernel's shuffles take 7 uops per 12 multiply-adds). All 9 taps
// of 2 channels at once are slower on AVX-512 (tuning.json's conv_train rows, WG2_VW). The
// chunks are short enough that no lane adds a long run (_image_chunks).
#define WG2_VW 16
#define WG2_O 8
typedef float16 wg2v;
typedef ufloat16 uwg2v;
#define WG2_ZSHIFT 0, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30
__kernel __attribute__((reqd_work_group_size(1, 1, 1))) __attribute__((min_vector_width(512)))
void wgrad2_cpu(const int N, const int C, const int CO, const int OH, const int OW, const int chunk,
                __global const float *x, __global const float *dy, __global float *part) {
    const int c = get_global_id(0), o0 = get_global_id(1) * WG2_O, g = get_global_id(2), P = OH * OW;
    for (int j = 0; j < 3; j++) {
        wg2v acc[WG2_O][3];
#pragma unroll
        for (int m = 0; m < WG2_O; m++)
#pragma unroll
            for (int l = 0; l < 3; l++) acc[m][l] = 0.0f;
        for (int n = g * chunk; n < MIN(N, g * chunk + chunk); n++) {
            // input row 2y + j - 1 from its column -1 (row -1, of j = 0 and y = 0, is zero: skipped)
            __global const float *xr = x + (n * C + c) * 4 * P + (j - 1) * 2 * OW - 1;
            __global const float *dn = dy + n * CO * P;
            for (int x0 = 0; x0 < OW; x0 += WG2_VW)
                for (int y = j == 0; y < OH; y++) {
                    __global const float *r = xr + 2 * y * 2 * OW + 2 * x0;
                    const wg2v a1 = *(__global const uwg2v *)(r + 1);
                    const wg2v b1 = *(__global const uwg2v *)(r + 1 + WG2_VW);
                    const wg2v a = x0 ? *(__global const uwg2v *)r
                                      : __builtin_shufflevector((wg2v)0.0f, a1, WG2_ZSHIFT);  // column -1: 0
                    const wg2v b = *(__global const uwg2v *)(r + WG2_VW);
                    const wg2v t0 = __builtin_shufflevector(a, b, EVEN_LANES);  // taps l = 0, 1, 2
                    const wg2v t1 = __builtin_shufflevector(a, b, ODD_LANES);
                    const wg2v t2 = __builtin_shufflevector(a1, b1, ODD_LANES);
#pragma unroll
                    for (int m = 0; m < WG2_O; m++) {
                        const wg2v d = *(__global const uwg2v *)(dn + MIN(o0 + m, CO - 1) * P + y * OW + x0);
                        acc[m][0] += d * t0;
                        acc[m][1] += d * t1;
                        acc[m][2] += d * t2;
                    }
                }
        }
        for (int m = 0; m < MIN(WG2_O, CO - o0); m++) {
            __global float *d = part + ((g * CO + o0 + m) * C + c) * 9 + 3 * j;
#pragma unroll
            for (int l = 0; l < 3; l++) d[l] = hsum16(acc[m][l]);
        }
    }
}

// dyt (N, P, COP) = dy (N, CO, P) with a position's channels in a row (COP: CO rounded up to 16,
// zero past CO), wgrad2o_cpu's operand, and sums[n * CO + o] = the sum of plane (n, o) (the bias
// gradient's per-image sums, flushed every 64 values a lane). Work-item: image n, in 8 x 8 blocks
// transposed in registers (P a multiple of 8). One image a work-item: the 8 channels of a block
// fill a part of each row's cache lines, whose rest another core's work-item would write if
// blocks of channels were work-items.
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void dy_t8_cpu(const int CO, const int COP, const int P, __global const float *dy, __global float *dyt,
               __global float *sums) {
    const int n = get_global_id(0);
    for (int o0 = 0; o0 < COP; o0 += 8) {
        __global const float *src = dy + (n * CO + o0) * P;
        __global float *dst = dyt + n * P * COP + o0;
        float8 s = 0.0f, r = 0.0f;
        for (int p0 = 0; p0 < P; p0 += 8) {
            float8 a[8], t[8];
#pragma unroll
            for (int i = 0; i < 8; i++) a[i] = o0 + i < CO ? *(__global const ufloat8 *)(src + i * P + p0) : 0.0f;
            TRANSPOSE8(a, t);
#pragma unroll
            for (int i = 0; i < 8; i++) {
                *(__global ufloat8 *)(dst + (p0 + i) * COP) = t[i];
                r += t[i];
            }
            if (p0 % 64 == 56) s += r, r = 0.0f;
        }
        union { float8 v; float f[8]; } u;
        u.v = s + r;
        for (int i = 0; i < 8 && o0 + i < CO; i++) sums[n * CO + o0 + i] = u.f[i];
    }
}

// wgrad2_cpu's per-chunk sums part[g][o][c][j][l] on AVX2, output channels in the lanes: from x
// (N, C, H, W) as it is and dyt (N, P, COP) (dy_t8_cpu). Work-item (input channels c0 and c0 + 1,
// 16 output channels o0.., chunk g; the second channel repeats the first past C, not stored)
// takes one kernel row j at a time: 2 channels x 3 taps x 2 float8 of output channels, 12
// accumulators; per position two dy loads and six broadcast inputs for 12 multiply-adds, no
// shuffles (wgrad2_cpu's positions in the lanes shuffled each input row into its three taps: 7
// shuffle uops per 12 multiply-adds). The accumulators join a running total after every 64 or
// more products a lane (whole rows), so no lane adds a long run.
__kernel __attribute__((reqd_work_group_size(1, 1, 1))) __attribute__((min_vector_width(512)))
void wgrad2o_cpu(const int N, const int C, const int CO, const int COP, const int OH, const int OW, const int chunk,
                 __global const float *x, __global const float *dyt, __global float *part) {
    const int c0 = get_global_id(0) * 2, o0 = get_global_id(1) * 16, g = get_global_id(2);
    const int P = OH * OW, W = 2 * OW, c1 = MIN(c0 + 1, C - 1), n1 = MIN(N, g * chunk + chunk);
    for (int j = 0; j < 3; j++) {
        float8 acc[2][2][3], tot[2][2][3];  // [input channel][half of the output channels][tap l]
#pragma unroll
        for (int e = 0; e < 2; e++)
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int l = 0; l < 3; l++) acc[e][h][l] = tot[e][h][l] = 0.0f;
        int run = 0;  // positions in the accumulators
        for (int n = g * chunk; n < n1; n++) {
            __global const float *xa = x + (n * C + c0) * 4 * P + (j - 1) * W;  // input row 2y + j - 1
            __global const float *xb = x + (n * C + c1) * 4 * P + (j - 1) * W;
            __global const float *dn = dyt + n * P * COP + o0;
            for (int y = j == 0; y < OH; y++) {  // row -1 (j = 0, y = 0) is zero: skipped
                __global const float *ra = xa + 2 * y * W, *rb = xb + 2 * y * W, *dr = dn + y * OW * COP;
                {  // column -1 (tap l = 0 at x = 0) is zero
                    const float8 d0 = *(__global const ufloat8 *)dr, d1 = *(__global const ufloat8 *)(dr + 8);
                    const float a1 = ra[0], a2 = ra[1], b1 = rb[0], b2 = rb[1];
                    acc[0][0][1] += d0 * a1;
                    acc[0][1][1] += d1 * a1;
                    acc[0][0][2] += d0 * a2;
                    acc[0][1][2] += d1 * a2;
                    acc[1][0][1] += d0 * b1;
                    acc[1][1][1] += d1 * b1;
                    acc[1][0][2] += d0 * b2;
                    acc[1][1][2] += d1 * b2;
                }
                for (int i = 1; i < OW; i++) {
                    __global const float *d = dr + i * COP;
                    const float8 d0 = *(__global const ufloat8 *)d, d1 = *(__global const ufloat8 *)(d + 8);
#pragma unroll
                    for (int l = 0; l < 3; l++) {
                        const float a = ra[2 * i + l - 1], b = rb[2 * i + l - 1];
                        acc[0][0][l] += d0 * a;
                        acc[0][1][l] += d1 * a;
                        acc[1][0][l] += d0 * b;
                        acc[1][1][l] += d1 * b;
                    }
                }
                if ((run += OW) >= 64) {
                    run = 0;
#pragma unroll
                    for (int e = 0; e < 2; e++)
#pragma unroll
                        for (int h = 0; h < 2; h++)
#pragma unroll
                            for (int l = 0; l < 3; l++) tot[e][h][l] += acc[e][h][l], acc[e][h][l] = 0.0f;
                }
            }
        }
#pragma unroll
        for (int e = 0; e < 2; e++)
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int l = 0; l < 3; l++) tot[e][h][l] += acc[e][h][l];
        for (int e = 0; e < 2 && c0 + e < C; e++)
            for (int h = 0; h < 2; h++)
                for (int l = 0; l < 3; l++) {
                    union { float8 v; float f[8]; } u;
                    u.v = tot[e][h][l];
                    for (int m = 0; m < 8 && o0 + 8 * h + m < CO; m++)
                        part[((g * CO + o0 + 8 * h + m) * C + c0 + e) * 9 + 3 * j + l] = u.f[m];
                }
    }
}

// corrt2_cpu for one row of dy a vector (PW2_ROWS 1) and an even number of rows: a work-item takes
// dy rows y and y + 1 (y even) of a column block, which share row y + 1 (the second's d0, the
// first's d1), so each weight it reads serves two vectors: 2 channels x 2 rows x 4 accumulators.
__kernel __attribute__((reqd_work_group_size(1, 1, 1))) __attribute__((min_vector_width(512)))
void corrt2p_cpu(const int C, const int CO, const int OH, const int OW, __global const float *dy,
                 __global const float *w, __global float *dx) {
    const int XB = OW / 16, VP = OH / 2 * XB, v = get_global_id(0), n = v / VP, r = v - n * VP;
    const int y = r / XB * 2, x0 = (r - r / XB * XB) * 16, P = OH * OW, W = 2 * OW, c0 = get_global_id(1) * 2;
    const int m1 = MIN(2, C - c0);
    const bool below = y + 2 < OH, right = x0 + 16 < OW;
    float16 acc[2][2][4], tot[2][2][4];
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int t = 0; t < 4; t++) tot[m][i][t] = 0.0f;
    __global const float *src = dy + n * CO * P + y * OW + x0;
    for (int o0 = 0; o0 < CO; o0 += FLUSH) {
#pragma unroll
        for (int m = 0; m < 2; m++)
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int t = 0; t < 4; t++) acc[m][i][t] = 0.0f;
        for (int o = o0; o < MIN(CO, o0 + FLUSH); o++) {
            __global const float *s = src + o * P;
            float16 d[3], ds[3];  // dy rows y, y + 1, y + 2 (zero past the plane), and one column on
            d[0] = *(__global const ufloat16 *)s;
            d[1] = *(__global const ufloat16 *)(s + OW);
            d[2] = below ? *(__global const ufloat16 *)(s + 2 * OW) : 0.0f;
#pragma unroll
            for (int i = 0; i < 3; i++)
                ds[i] = right && (i < 2 || below) ? *(__global const ufloat16 *)(s + i * OW + 1)
                                                  : __builtin_shufflevector(d[i], (float16)0.0f, 1, 2, 3, 4, 5, 6, 7, 8,
                                                                            9, 10, 11, 12, 13, 14, 15, 16);
#pragma unroll
            for (int m = 0; m < 2; m++) {
                __global const float *k = w + (o * C + c0 + MIN(m, m1 - 1)) * 9;
                const float k0 = k[0], k1 = k[1], k2 = k[2], k3 = k[3], k4 = k[4], k5 = k[5], k6 = k[6], k7 = k[7],
                            k8 = k[8];
#pragma unroll
                for (int i = 0; i < 2; i++) {  // dy row y + i: d0 = d[i], d1 = d[i + 1]
                    acc[m][i][0] += k4 * d[i];
                    acc[m][i][1] += k3 * ds[i];
                    acc[m][i][1] += k5 * d[i];
                    acc[m][i][2] += k1 * d[i + 1];
                    acc[m][i][2] += k7 * d[i];
                    acc[m][i][3] += k0 * ds[i + 1];
                    acc[m][i][3] += k2 * d[i + 1];
                    acc[m][i][3] += k6 * ds[i];
                    acc[m][i][3] += k8 * d[i];
                }
            }
        }
#pragma unroll
        for (int m = 0; m < 2; m++)
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int t = 0; t < 4; t++) tot[m][i][t] += acc[m][i][t];
    }
    for (int m = 0; m < m1; m++)
#pragma unroll
        for (int i = 0; i < 2; i++) {
            __global float *e = dx + ((n * C + c0 + m) * 2 * OH + 2 * (y + i)) * W + 2 * x0;
            *(__global ufloat16 *)e = INTERLEAVE8(tot[m][i][0].lo, tot[m][i][1].lo);
            *(__global ufloat16 *)(e + 16) = INTERLEAVE8(tot[m][i][0].hi, tot[m][i][1].hi);
            *(__global ufloat16 *)(e + W) = INTERLEAVE8(tot[m][i][2].lo, tot[m][i][3].lo);
            *(__global ufloat16 *)(e + 16 + W) = INTERLEAVE8(tot[m][i][2].hi, tot[m][i][3].hi);
        }
}

// A depthwise convolution's forward of stride DWS = 1 or 2 on CPUs (Conv2d._forward_other): output
// plane po = (n, o), o = c * M + m, from input plane (n, c) given as zero-bordered planes xp (N, C,
// HP, WP; x at (p, p), HP >= DWS * (OH - 1) + KS, WP >= DWS * (OW rounded up to DWV, less 1) + KS),
// so that whole vectors of DWV outputs need no bounds checks; its KS * KS weights broadcast from
// registers, the taps added in conv.cl's dw_forward order (kh, kw), the bias after. `planes`
// planes per work-item. Stride 2 loads a tap's inputs as the even elements of two vectors
// (EVEN_LOAD). (conv.cl's dw_forward, a work-item per row, tests bounds at every tap.)
#ifndef DWV
#define DWV 16
#endif
#ifndef DWS
#define DWS 1
#endif
#define DVEC VCAT(float, DWV)
typedef DVEC __attribute__((aligned(4))) udvec;
#if DWS == 2
#define DW_XLOAD(p) EVEN_LOAD(udvec, DWV, p)
#else
#define DW_XLOAD(p) (*(__global const udvec *)(p))
#endif

__kernel __attribute__((reqd_work_group_size(1, 1, 1))) __attribute__((min_vector_width(512)))
void dw_fwd_cpu(const int NO, const int planes, const int C, const int M, const int OH, const int OW, const int HP,
                const int WP, __global const float *xp, __global const float *w, __global const float *bias,
                const int has_bias, __global float *y) {
    const int p1 = MIN(NO, (int)get_global_id(0) * planes + planes);
    for (int po = get_global_id(0) * planes; po < p1; po++) {
        const int n = po / (C * M), o = po - n * C * M;
        __global const float *src = xp + ((long)n * C + o / M) * HP * WP;
        float wk[KS * KS];
#pragma unroll
        for (int t = 0; t < KS * KS; t++) wk[t] = w[o * KS * KS + t];
        const float b = has_bias ? bias[o] : 0.0f;
        __global float *dst = y + (long)po * OH * OW;
        for (int oh = 0; oh < OH; oh++) {
            for (int ow = 0; ow < OW; ow += DWV) {
                DVEC acc = 0.0f;
#pragma unroll
                for (int kh = 0; kh < KS; kh++)
#pragma unroll
                    for (int kw = 0; kw < KS; kw++)
                        acc += DW_XLOAD(src + (DWS * oh + kh) * WP + DWS * ow + kw) * (DVEC)(wk[kh * KS + kw]);
                if (has_bias) acc += b;
                if (ow + DWV <= OW) {
                    *(__global udvec *)(dst + oh * OW + ow) = acc;
                } else {
                    float t[DWV];
                    *(udvec *)t = acc;
                    for (int i = 0; i < OW - ow; i++) dst[oh * OW + ow + i] = t[i];
                }
            }
        }
    }
}

// Its data gradient (stride 1, padding <= KS - 1): dx plane (n, c) = the sum over m of the
// correlation of dy plane (n, c * M + m), zero-bordered by KS - 1 - p (dyp: N, C * M, HP, WP; HP >=
// H + KS - 1, WP >= W rounded up to DWV, plus KS - 1), with that channel's flipped weights: conv.cl's
// dw_backward_data without its bounds and stride tests. `planes` planes per work-item.
__kernel __attribute__((reqd_work_group_size(1, 1, 1))) __attribute__((min_vector_width(512)))
void dw_bwd_data_cpu(const int NC, const int planes, const int C, const int M, const int H, const int W,
                     const int HP, const int WP, __global const float *dyp, __global const float *w,
                     __global float *dx) {
    const int p1 = MIN(NC, (int)get_global_id(0) * planes + planes);
    for (int pc = get_global_id(0) * planes; pc < p1; pc++) {
        const int n = pc / C, c = pc - n * C;
        __global float *dst = dx + (long)pc * H * W;
        for (int ih = 0; ih < H; ih++) {
            for (int iw = 0; iw < W; iw += DWV) {
                DVEC acc = 0.0f;
                for (int m = 0; m < M; m++) {
                    const int o = c * M + m;
                    __global const float *src = dyp + ((long)n * C * M + o) * HP * WP;
                    __global const float *wk = w + o * KS * KS;
#pragma unroll
                    for (int kh = 0; kh < KS; kh++)
#pragma unroll
                        for (int kw = 0; kw < KS; kw++)
                            acc += *(__global const udvec *)(src + (ih + kh) * WP + iw + kw) *
                                   (DVEC)(wk[(KS - 1 - kh) * KS + KS - 1 - kw]);
                }
                if (iw + DWV <= W) {
                    *(__global udvec *)(dst + ih * W + iw) = acc;
                } else {
                    float t[DWV];
                    *(udvec *)t = acc;
                    for (int i = 0; i < W - iw; i++) dst[ih * W + iw + i] = t[i];
                }
            }
        }
    }
}

// Its data gradient at stride 2 (padding <= KS - 1): dx[n][c][ih][2t + e] = the sum over m, kh, kw
// of w[o][kh][kw] * dy[n][o][(ih + p - kh) / 2][t + (e + p - kw) / 2] (o = c * M + m) where both
// divisions are exact: per dx row, the taps of the row's parity; per lane parity e, the taps of
// column parity e + p, each one DWV-wide load of a dy row shifted by (e + p - kw) / 2. dy comes as
// zero-bordered planes dyb (N, C * M, HB, WB; dy at (B, B), B = (KS - p) / 2, zero rows and columns
// past it as far as any lane reads), so no tap tests bounds. The two parities' sums (DWV = 4 or 8
// lanes each: built for those only) interleave into 2 * DWV columns of dx. `planes` planes per
// work-item.
#if DWV == 8 || DWV == 4
#if DWV == 8
#define DW_INTERLEAVE(a, b) INTERLEAVE8(a, b)
#define DW_OUT float16
#define DW_UOUT ufloat16
#else
#define DW_INTERLEAVE(a, b) INTERLEAVE4(a, b)
#define DW_OUT float8
#define DW_UOUT ufloat8
#endif
__kernel __attribute__((reqd_work_group_size(1, 1, 1))) __attribute__((min_vector_width(512)))
void dw_bwd_data_s2_cpu(const int NC, const int planes, const int C, const int M, const int H, const int W,
                        const int p, const int HB, const int WB, __global const float *dyb, __global const float *w,
                        __global float *dx) {
    const int p1 = MIN(NC, (int)get_global_id(0) * planes + planes), B = (KS - p) / 2;
    for (int pc = get_global_id(0) * planes; pc < p1; pc++) {
        const int n = pc / C, c = pc - n * C;
        __global float *dst = dx + (long)pc * H * W;
        for (int ih = 0; ih < H; ih++) {
            for (int t0 = 0; 2 * t0 < W; t0 += DWV) {
                DVEC acc[2] = {0.0f, 0.0f};
                for (int m = 0; m < M; m++) {
                    const int o = c * M + m;
                    __global const float *src = dyb + ((long)n * C * M + o) * HB * WB + B + t0;
                    __global const float *wk = w + o * KS * KS;
#pragma unroll
                    for (int kh = 0; kh < KS; kh++) {
                        if ((ih + p - kh) & 1) continue;
                        __global const float *row = src + (B + (ih + p - kh) / 2) * WB;
#pragma unroll
                        for (int kw = 0; kw < KS; kw++) {
                            const int e = (kw + p) & 1;  // the lanes (columns 2t + e) this tap reaches
                            acc[e] += *(__global const udvec *)(row + (e + p - kw) / 2) * (DVEC)(wk[kh * KS + kw]);
                        }
                    }
                }
                const DW_OUT v = DW_INTERLEAVE(acc[0], acc[1]);
                if (2 * t0 + 2 * DWV <= W) {
                    *(__global DW_UOUT *)(dst + ih * W + 2 * t0) = v;
                } else {
                    float t[2 * DWV];
                    *(DW_OUT *)t = v;
                    for (int i = 0; i < W - 2 * t0; i++) dst[ih * W + 2 * t0 + i] = t[i];
                }
            }
        }
    }
}
#endif

// Its weight gradient (stride DWS): dW[o][kh][kw] (+)= sum over (n, oh, ow) of dy[n][o][oh][ow] *
// x[n][o / M][DWS * oh + kh - p][DWS * ow + kw - p], from dy in planes whose rows are padded with zeros to
// whole vectors (dyq: N, C * M, OH, WQ) and x bordered as dw_fwd_cpu reads it (xp). A work-item per
// output channel: KS * KS accumulators of DWV lanes, one dy load per KS * KS multiply-adds, added
// into running totals after every image (no lane adds a long sequential run).
__kernel __attribute__((reqd_work_group_size(1, 1, 1))) __attribute__((min_vector_width(512)))
void dw_bwd_weight_cpu(const int N, const int CM, const int M, const int OH, const int OW, const int WQ,
                       const int HP, const int WP, __global const float *xp, __global const float *dyq,
                       __global float *gw, const int accumulate) {
    const int o = get_global_id(0);
    if (o >= CM) return;
    float tot[KS * KS];
#pragma unroll
    for (int t = 0; t < KS * KS; t++) tot[t] = 0.0f;
    for (int n = 0; n < N; n++) {
        __global const float *src = xp + ((long)n * (CM / M) + o / M) * HP * WP;
        __global const float *g = dyq + ((long)n * CM + o) * OH * WQ;
        DVEC acc[KS * KS];
#pragma unroll
        for (int t = 0; t < KS * KS; t++) acc[t] = 0.0f;
        for (int oh = 0; oh < OH; oh++)
            for (int ow = 0; ow < OW; ow += DWV) {
                const DVEC gv = *(__global const udvec *)(g + oh * WQ + ow);
#pragma unroll
                for (int kh = 0; kh < KS; kh++)
#pragma unroll
                    for (int kw = 0; kw < KS; kw++)
                        acc[kh * KS + kw] += gv * DW_XLOAD(src + (DWS * oh + kh) * WP + DWS * ow + kw);
            }
#pragma unroll
        for (int t = 0; t < KS * KS; t++) tot[t] += VCAT(hsum, DWV)(acc[t]);
    }
#pragma unroll
    for (int t = 0; t < KS * KS; t++) gw[o * KS * KS + t] = accumulate ? gw[o * KS * KS + t] + tot[t] : tot[t];
}

// The weight and bias gradients of a stride-1 undilated convolution on planes of 16k outputs in
// rows of OW = 4 or 8 (Conv2d's "channels" mode past wgrad_narrow_cpu's 27 weights per output
// channel) straight from dy (N, OC, P = OH * OW) and the forward's padded x (N, C, HP, XW), output
// channels in the lanes: no im2col columns, no GEMM. Work-item block b: 16 output channels (o0 =
// (b / tgroups) * 16; past OC the last repeats, not stored) x 16 taps t = (c, j, l) of C * KS * KS
// (t0 = (b % tgroups) * 16; past the last likewise), then every get_global_size(0)-th block.
// Per image and 16 positions it loads the 16 channels' dy (16 vectors), transposes them in
// registers (TRANSPOSE16: 16 vectors of the 16 channels, one per position) and multiplies each by
// the 16 taps' inputs at that position (broadcast scalars of x): 64 shuffles per 256 multiply-adds.
// Each tap's 16 products are summed before they join its accumulator (sums of N * P / 16 terms).
// The blocks of taps from 0 also sum dy (the bias gradient). gw (OC, C * KS * KS) and gb (OC)
// written, or added to where acc_w / acc_b: whole blocks transposed back and stored as rows.
#ifndef XW
#define XW 6
#endif
#ifndef OW16
#define OW16 4
#endif

__kernel __attribute__((reqd_work_group_size(1, 1, 1))) __attribute__((min_vector_width(512)))
void wgrad_oc16_cpu(const int N, const int C, const int HP, const int OC, const int P, const int tgroups,
                    __global const float *xp, __global const float *dy, __global float *gw, __global float *gb,
                    const int has_bias, const int acc_w, const int acc_b) {
    const int T = C * KS * KS;
    for (int b = get_global_id(0); b < (OC + 15) / 16 * tgroups; b += get_global_size(0)) {
        const int o0 = b / tgroups * 16, t0 = b % tgroups * 16;
        int off[16];  // each tap's offset in an image's padded planes
#pragma unroll
        for (int t = 0; t < 16; t++) {
            const int tt = MIN(t0 + t, T - 1), c = tt / (KS * KS), j = tt / KS % KS, l = tt % KS;
            off[t] = (c * HP + j) * XW + l;
        }
        float16 acc[16], accb = 0.0f;
#pragma unroll
        for (int t = 0; t < 16; t++) acc[t] = 0.0f;
        for (int n = 0; n < N; n++) {
            __global const float *xn = xp + n * C * HP * XW;
            __global const float *dn = dy + n * OC * P;
            for (int p0 = 0; p0 < P; p0 += 16) {
                float16 d[16], u[16];
#pragma unroll
                for (int i = 0; i < 16; i++) d[i] = *(__global const ufloat16 *)(dn + MIN(o0 + i, OC - 1) * P + p0);
                TRANSPOSE16(d, u);  // d[p]: lane i = dy(o0 + i, p0 + p)
                if (t0 == 0) {
                    float16 part = d[0];
#pragma unroll
                    for (int p = 1; p < 16; p++) part += d[p];
                    accb += part;
                }
                __global const float *xr = xn + p0 / OW16 * XW;  // the chunk's first output row
                float16 part[16];
#pragma unroll
                for (int t = 0; t < 16; t++) part[t] = d[0] * xr[off[t]];
#pragma unroll
                for (int p = 1; p < 16; p++)
#pragma unroll
                    for (int t = 0; t < 16; t++) part[t] += d[p] * xr[off[t] + p / OW16 * XW + p % OW16];
#pragma unroll
                for (int t = 0; t < 16; t++) acc[t] += part[t];
            }
        }
        if (o0 + 16 <= OC && t0 + 16 <= T) {  // a whole block: rows of 16 taps
            float16 u[16];
            TRANSPOSE16(acc, u);
#pragma unroll
            for (int i = 0; i < 16; i++) {
                __global float *g = gw + (o0 + i) * T + t0;
                *(__global ufloat16 *)g = acc_w ? *(__global const ufloat16 *)g + acc[i] : acc[i];
            }
        } else {
            for (int t = 0; t < 16 && t0 + t < T; t++) {
                float s[16];
                *(float16 *)s = acc[t];
                for (int i = 0; i < 16 && o0 + i < OC; i++) {
                    __global float *g = gw + (o0 + i) * T + t0 + t;
                    *g = acc_w ? *g + s[i] : s[i];
                }
            }
        }
        if (has_bias && t0 == 0) {
            float s[16];
            *(float16 *)s = accb;
            for (int i = 0; i < 16 && o0 + i < OC; i++) gb[o0 + i] = acc_b ? gb[o0 + i] + s[i] : s[i];
        }
    }
}
