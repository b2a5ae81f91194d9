// What the fused conv families share (conv_gpu.cl, conv_cpu.cl, conv_wino.cl; netcl/jit/):
// Conv2d with BatchNorm folded into its weights and bias, then the activation, then (POOL == 2)
// a 2x2/2 max-pool, all in one pass. Each program is built for one layer: shapes and constants
// arrive as -D defines, so loops unroll and index arithmetic folds. The stored input and output
// planes may carry a zero border (IPB, OPB): a layer writes its output already padded for the
// next convolution, so that convolution loads without bounds checks (IPB >= PAD).
//
// Defines (netcl.jit.common.ConvSpec.defines): C H W (input channels and size), K (output
// channels), KS STRIDE PAD, OH OW (convolution output), POOL (1 or 2), ACT (a netcl.act.Act
// code, kernels/act.h), SLOPE, IPB OPB (stored borders; IPB is 0 or at least PAD:
// a plane read by convolutions of different paddings carries the widest), KT KOFF (the stored
// output has KT channels, this stage writes channels KOFF.. KOFF + K - 1: a Concat's slice),
// RES RPB ACT2 SLOPE2 (RES 1: add the residual tensor res (N, K, OH, OW, stored border RPB) after
// the activation, then apply ACT2: a Residual block ending in this conv, and the activation that
// follows the block; never with POOL == 2).
// Include act.h before this header.
#ifndef NETCL_CONV_H
#define NETCL_CONV_H

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)

#define ACTF(v) ACT_APPLY(ACT, v, SLOPE)
#define ACT2F(v) ACT_APPLY(ACT2, v, SLOPE2)

// The pool's max: b replaces a when greater or NaN, so NaN wins as in pool.cl's maxpool_fwd and
// PyTorch (fmax and a > b ? a : b would drop it). Scalars and vectors alike (a vector ?: is an
// inline blend on PoCL, where float8 fmax is an out-of-line call); arguments are evaluated twice.
#define NAN_MAX(a, b) ((b) > (a) || (b) != (b) ? (b) : (a))

#define R (C * KS * KS)      // reduction length
#define POH (OH / POOL)      // output size after the pool (floor, as MaxPool2d)
#define POW (OW / POOL)
#define IHS (H + 2 * IPB)    // stored input plane
#define IWS (W + 2 * IPB)
#define OHS (POH + 2 * OPB)  // stored output plane
#define OWS (POW + 2 * OPB)
#define RHS (OH + 2 * RPB)   // stored residual plane
#define RWS (OW + 2 * RPB)

// offsets of output element (n, k, row, col) in the stored output and residual planes
#define OUT_AT(n, k, r, c) (((n) * KT + KOFF + (k)) * (OHS * OWS) + ((r) + OPB) * OWS + (c) + OPB)
#define RES_AT(n, k, r, c) (((n) * K + (k)) * (RHS * RWS) + ((r) + RPB) * RWS + (c) + RPB)
// the epilogue after bias and activation: v, or ACT2(v + residual) (scalars)
#if RES
#if POOL == 2
#error "a residual add after a pooled conv is a separate stage"
#endif
#define EPI(v, n, k, r, c) ACT2F((v) + res[RES_AT(n, k, r, c)])
#else
#define EPI(v, n, k, r, c) (v)
#endif

#endif
