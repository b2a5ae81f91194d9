// MaxPool2d with 2x2 windows, stride 2, no padding (the common down-sampling), for CPU devices
// (PoCL): a work-item runs `rows` output rows of (N*C*OH, OW), 8 (then 4) outputs at a time from
// vector loads of two input rows (.even and .odd are the windows' two columns). The saved
// argmax is pool.cl's (ih * W + iw within the plane), and PyTorch's order and NaN rule: the
// window's values in row-major order, a later one wins when greater or NaN.

#include "vec_cpu.h"
#include "act.h"
#include "bn_act.h"


// The maxima of windows (a, b / c, d): top-left, top-right, bottom-left, bottom-right values;
// i0 the top-left inputs' indices; *bi gets the winners' indices. Branch-free (a selection per
// candidate): random data would mispredict every other branch. One function per vector type.
#define MAX2X2_FN(F, I)                                                                      \
    inline F max2x2_##F(const F a, const F b, const F c, const F d, const I i0, const int W, I *bi) { \
        F best = a;                                                                          \
        I at = i0, m = (b != b) | (b > best);                                              \
        best = m ? b : best;                                                                 \
        at = m ? i0 + 1 : at;                                                                \
        m = (c != c) | (c > best);                                                         \
        best = m ? c : best;                                                                 \
        at = m ? i0 + W : at;                                                                \
        m = (d != d) | (d > best);                                                         \
        best = m ? d : best;                                                                 \
        *bi = m ? i0 + W + 1 : at;                                                           \
        return best;                                                                         \
    }
MAX2X2_FN(float16, int16)
MAX2X2_FN(float8, int8)
MAX2X2_FN(float4, int4)
MAX2X2_FN(float, int)

__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void maxpool2_fwd_cpu(const int NCOH, const int rows, const int H, const int W, const int OH, const int OW,
                      __global const float *x, __global float *y, __global int *arg) {
    const int r1 = MIN(NCOH, (int)get_global_id(0) * rows + rows);
    const int8 lane2 = (int8)(0, 2, 4, 6, 8, 10, 12, 14);
    for (int r = get_global_id(0) * rows; r < r1; r++) {
        const int nc = r / OH, oh = r - nc * OH, top = 2 * oh * W;  // the window rows' offsets in the plane
        __global const float *x0 = x + nc * H * W + top, *x1 = x0 + W;
        __global float *yr = y + r * OW;
        __global int *ar = arg + r * OW;
        int ow = 0;
        for (; ow + 8 <= OW; ow += 8) {
            const float16 t = *(__global const ufloat16 *)(x0 + 2 * ow), b = *(__global const ufloat16 *)(x1 + 2 * ow);
            int8 bi;
            *(__global ufloat8 *)(yr + ow) = max2x2_float8(t.even, t.odd, b.even, b.odd, top + 2 * ow + lane2, W, &bi);
            *(__global uint8v *)(ar + ow) = bi;
        }
        for (; ow + 4 <= OW; ow += 4) {
            const float8 t = *(__global const ufloat8 *)(x0 + 2 * ow), b = *(__global const ufloat8 *)(x1 + 2 * ow);
            int4 bi;
            *(__global ufloat4 *)(yr + ow) = max2x2_float4(t.even, t.odd, b.even, b.odd, top + 2 * ow + lane2.lo, W, &bi);
            *(__global uint4v *)(ar + ow) = bi;
        }
        for (; ow < OW; ow++) {
            const float2 t = *(__global const ufloat2 *)(x0 + 2 * ow), b = *(__global const ufloat2 *)(x1 + 2 * ow);
            int bi;
            yr[ow] = max2x2_float(t.x, t.y, b.x, b.y, top + 2 * ow, W, &bi);
            ar[ow] = bi;
        }
    }
}

// BatchNorm2d (batch statistics) + its activation + this 2x2 max pool in one pass (training, where
// Sequential pairs them: netcl.nn.norm): y and arg as maxpool2_fwd_cpu's from act(BN_Z(x)), the
// same expressions as bn_apply_cpu's, so the pool sees the values the unfused layers would give
// it; the BatchNorm's full-size output is never stored. Built with bn_act.h's ACT_KIND.
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void bn_maxpool2_cpu(const int NCOH, const int rows, const int C, const int H, const int W, const int OH, const int OW,
                     __global const float *x, __global const float *mean, __global const float *var,
                     __global const float *gamma, __global const float *beta, const float eps, const float slope,
                     __global float *y, __global int *arg) {
    const int r1 = MIN(NCOH, (int)get_global_id(0) * rows + rows);
    const int16 lane2 = (int16)(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
#define BNA(v) BN_ACT(v, m, inv, ga, be, slope)
    for (int r = get_global_id(0) * rows; r < r1; r++) {
        const int nc = r / OH, oh = r - nc * OH, top = 2 * oh * W, c = nc % C;
        const float m = mean[c], inv = rsqrt(var[c] + eps), ga = gamma[c], be = beta[c];
        __global const float *x0 = x + nc * H * W + top, *x1 = x0 + W;
        __global float *yr = y + r * OW;
        __global int *ar = arg + r * OW;
        int ow = 0;
        for (; ow + 16 <= OW; ow += 16) {  // 16 windows: two float16 of each input row
            const float16 t0 = BNA(*(__global const ufloat16 *)(x0 + 2 * ow)), t1 = BNA(*(__global const ufloat16 *)(x0 + 2 * ow + 16));
            const float16 b0 = BNA(*(__global const ufloat16 *)(x1 + 2 * ow)), b1 = BNA(*(__global const ufloat16 *)(x1 + 2 * ow + 16));
            int16 bi;
            *(__global ufloat16 *)(yr + ow) = max2x2_float16((float16)(t0.even, t1.even), (float16)(t0.odd, t1.odd),
                                                             (float16)(b0.even, b1.even), (float16)(b0.odd, b1.odd),
                                                             top + 2 * ow + lane2, W, &bi);
            *(__global uint16v *)(ar + ow) = bi;
        }
        for (; ow + 8 <= OW; ow += 8) {
            const float16 t = BNA(*(__global const ufloat16 *)(x0 + 2 * ow)), b = BNA(*(__global const ufloat16 *)(x1 + 2 * ow));
            int8 bi;
            *(__global ufloat8 *)(yr + ow) = max2x2_float8(t.even, t.odd, b.even, b.odd, top + 2 * ow + lane2.lo, W, &bi);
            *(__global uint8v *)(ar + ow) = bi;
        }
        for (; ow + 4 <= OW; ow += 4) {
            const float8 t = BNA(*(__global const ufloat8 *)(x0 + 2 * ow)), b = BNA(*(__global const ufloat8 *)(x1 + 2 * ow));
            int4 bi;
            *(__global ufloat4 *)(yr + ow) = max2x2_float4(t.even, t.odd, b.even, b.odd, top + 2 * ow + lane2.lo.lo, W, &bi);
            *(__global uint4v *)(ar + ow) = bi;
        }
        for (; ow < OW; ow++) {
            const float2 t = BNA(*(__global const ufloat2 *)(x0 + 2 * ow)), b = BNA(*(__global const ufloat2 *)(x1 + 2 * ow));
            int bi;
            yr[ow] = max2x2_float(t.x, t.y, b.x, b.y, top + 2 * ow, W, &bi);
            ar[ow] = bi;
        }
    }
#undef BNA
}

// dx from dy and the argmax: each input lies in at most one window, so a work-item writes the
// two input rows of each of its output rows whole (the gradient where the argmax points, else
// 0), and the row and column no window covers (odd H or W) with zeros. No atomics, no gather.
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void maxpool2_bwd_cpu(const int NCOH, const int rows, const int H, const int W, const int OH, const int OW,
                      __global const float *dy, __global const int *arg, __global float *dx) {
    const int r1 = MIN(NCOH, (int)get_global_id(0) * rows + rows);
    const int8 lane2 = (int8)(0, 2, 4, 6, 8, 10, 12, 14);
    for (int r = get_global_id(0) * rows; r < r1; r++) {
        const int nc = r / OH, oh = r - nc * OH, top = 2 * oh * W;
        __global float *d0 = dx + nc * H * W + top, *d1 = d0 + W;
        __global const float *g = dy + r * OW;
        __global const int *ar = arg + r * OW;
        int ow = 0;
        for (; ow + 8 <= OW; ow += 8) {
            const float8 gv = *(__global const ufloat8 *)(g + ow);
            const int8 a = *(__global const uint8v *)(ar + ow), i0 = top + 2 * ow + lane2;
            float16 t, b;
            t.even = a == i0 ? gv : 0.0f;
            t.odd = a == i0 + 1 ? gv : 0.0f;
            b.even = a == i0 + W ? gv : 0.0f;
            b.odd = a == i0 + W + 1 ? gv : 0.0f;
            *(__global ufloat16 *)(d0 + 2 * ow) = t;
            *(__global ufloat16 *)(d1 + 2 * ow) = b;
        }
        for (; ow + 4 <= OW; ow += 4) {
            const float4 gv = *(__global const ufloat4 *)(g + ow);
            const int4 a = *(__global const uint4v *)(ar + ow), i0 = top + 2 * ow + lane2.lo;
            float8 t, b;
            t.even = a == i0 ? gv : 0.0f;
            t.odd = a == i0 + 1 ? gv : 0.0f;
            b.even = a == i0 + W ? gv : 0.0f;
            b.odd = a == i0 + W + 1 ? gv : 0.0f;
            *(__global ufloat8 *)(d0 + 2 * ow) = t;
            *(__global ufloat8 *)(d1 + 2 * ow) = b;
        }
        for (; ow < OW; ow++) {
            const int i = top + 2 * ow, a = ar[ow];
            d0[2 * ow] = a == i ? g[ow] : 0.0f;
            d0[2 * ow + 1] = a == i + 1 ? g[ow] : 0.0f;
            d1[2 * ow] = a == i + W ? g[ow] : 0.0f;
            d1[2 * ow + 1] = a == i + W + 1 ? g[ow] : 0.0f;
        }
        if (W & 1) d0[W - 1] = d1[W - 1] = 0.0f;
        if ((H & 1) && oh == OH - 1)
            for (int iw = 0; iw < W; iw++) d1[W + iw] = 0.0f;
    }
}

// Global average pooling's forward for CPUs: y[p] = the mean of plane p, its values added in
// order as pool.cl's adaptive_avgpool_fwd adds them (the same result), `planes` planes per
// work-item (a work-group per 64 planes costs PoCL a dispatch each).
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void global_avgpool_fwd_cpu(const int NC, const int planes, const int HW, __global const float *x,
                            __global float *y) {
    const int p1 = MIN(NC, (int)get_global_id(0) * planes + planes);
    for (int p = get_global_id(0) * planes; p < p1; p++) {
        __global const float *s = x + (long)p * HW;
        float acc = 0.0f;
        for (int i = 0; i < HW; i++) acc += s[i];
        y[p] = acc / (float)HW;
    }
}

// AdaptiveAvgPool with one output per plane (global average pooling), backward: every input of
// plane p gets dy[p] / HW (pool.cl's adaptive_avgpool_bwd's value, without its per-element
// window arithmetic). `planes` planes per work-item.
// DX_ACT (an activation code): dx through the gradient of that activation, whose output `act_out`
// is (a Residual before the pool ran it in its sum: Sequential's training path), so that no
// act_bwd_cpu pass follows.
#ifndef DX_ACT
#define DX_ACT 0
#endif
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void global_avgpool_bwd_cpu(const int NC, const int planes, const int HW, __global const float *dy,
                            __global float *dx, __global const float *act_out, const float act_slope) {
    const int p1 = MIN(NC, (int)get_global_id(0) * planes + planes);
    for (int p = get_global_id(0) * planes; p < p1; p++) {
        const float v = dy[p] / (float)HW;
        __global float *d = dx + p * HW;
        int i = 0;
#if DX_ACT
        __global const float *s = act_out + p * HW;
        for (; i + 16 <= HW; i += 16)
            *(__global ufloat16 *)(d + i) =
                ACT_GRAD(DX_ACT, *(__global const ufloat16 *)(s + i), (float16)v, act_slope);
        for (; i < HW; i++) d[i] = ACT_GRAD(DX_ACT, s[i], v, act_slope);
#else
        for (; i + 16 <= HW; i += 16) *(__global ufloat16 *)(d + i) = v;
        for (; i < HW; i++) d[i] = v;
#endif
    }
}
