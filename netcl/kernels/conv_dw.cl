// Fused depthwise conv (netcl/jit/conv_dw.py), both device classes: each output channel k reads
// input channel k / MULT only, so a reduction is KS * KS taps; an implicit GEMM would starve
// (K = 9). One work-item per output element, work-items adjacent along the row (coalesced on GPUs,
// vectorised across work-items by PoCL on CPUs); BN folded into the weights, then the
// activation and the epilogue of conv.h (residual add, ACT2, channel offset into a Concat).
// Defines: conv.h's, and DIL (dilation) MULT (channel multiplier) LX LY (work-group).
#include "act.h"
#include "conv.h"

__kernel __attribute__((reqd_work_group_size(LX, LY, 1)))
void conv_dw(__global const float *restrict x, __global const float *restrict w, __global const float *restrict bias,
             __global float *restrict y, __global const float *restrict res) {
    const int ow = get_global_id(0), oh = get_global_id(1), z = get_global_id(2);
    if (ow >= OW || oh >= OH) return;
    const int n = z / K, k = z % K;
    __global const float *xc = x + (n * C + k / MULT) * (IHS * IWS);
    __global const float *wk = w + k * (KS * KS);
    float acc = 0.0f;
#pragma unroll
    for (int kh = 0; kh < KS; kh++) {
        const int ih = oh * STRIDE - PAD + kh * DIL;
#pragma unroll
        for (int kw = 0; kw < KS; kw++) {
            const int iw = ow * STRIDE - PAD + kw * DIL;
#if IPB >= PAD
            acc += xc[(ih + IPB) * IWS + iw + IPB] * wk[kh * KS + kw];
#else
            if (ih >= 0 && ih < H && iw >= 0 && iw < W) acc += xc[ih * IWS + iw] * wk[kh * KS + kw];
#endif
        }
    }
    y[OUT_AT(n, k, oh, ow)] = EPI(ACTF(acc + bias[k]), n, k, oh, ow);
}
