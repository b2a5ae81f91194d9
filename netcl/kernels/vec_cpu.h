// What the CPU (PoCL) kernel files share: unaligned vector types (a row of odd length starts
// anywhere; PoCL keeps a dereferenced vector in registers, where vloadN is an out-of-line call),
// MIN and MAX, and the horizontal sum of a float16.
//
// PyPI's PoCL 3.0 (pocl-binary-distribution, LLVM 14; the default device wherever it builds
// kernels) calls every builtin of its kernel library out of line, fma, min and max included
// (Debian's PoCL 3.1 inlines them): each call costs a call and, worse, sends the vector registers
// around it through the stack. So CPU kernels write a * b + c (contracted to one FMA: OpenCL's
// FP_CONTRACT is on by default; the same bits as fma on FMA hardware), dereference vector pointers
// and use these integer MIN and MAX (arguments without side effects; what the builtins cost:
// tuning.json's note on PoCL's builtins).
#ifndef NETCL_VEC_CPU_H
#define NETCL_VEC_CPU_H

#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))

// PREFETCH(p): the cache line of global float pointer p, ahead of its use: OpenCL C's prefetch(),
// which PoCL 3 compiles to nothing (no instruction in its kernel binaries), so under PoCL (its own
// predefined POCL_DEVICE_ADDRESS_BITS, a Clang front end) Clang's __builtin_prefetch, whose
// prefetch instructions pay in norm_cpu.cl and conv_winot.cl (their comments cite what they buy).
// Nowhere else: it is no OpenCL C, and Oclgrind, say, aborts on it.
#if defined(POCL_DEVICE_ADDRESS_BITS) && defined(__clang__)
#define PREFETCH(p) __builtin_prefetch(p)
#else
#define PREFETCH(p) prefetch((p), 1)
#endif

typedef float16 __attribute__((aligned(4))) ufloat16;
typedef float8 __attribute__((aligned(4))) ufloat8;
typedef float4 __attribute__((aligned(4))) ufloat4;
typedef float2 __attribute__((aligned(4))) ufloat2;
typedef int16 __attribute__((aligned(4))) uint16v;
typedef int8 __attribute__((aligned(4))) uint8v;
typedef int4 __attribute__((aligned(4))) uint4v;

// EVEN_LOAD(T, n, p): the even elements p[0], p[2], .. p[2n - 2] of a global row as T, a float<n>:
// two loads, the second ending at the last one (one load of 2n read a float past it), one shuffle
// (a stride-2 convolution's inputs, Winograd tiles of 2). JOIN_HALVES(n, a, b): float<n / 2> a, b as
// one float<n> (rows packed two to a vector).
#define VCAT_(a, b) a##b
#define VCAT(a, b) VCAT_(a, b)
#define EVENS_16 0, 2, 4, 6, 8, 10, 12, 14, 17, 19, 21, 23, 25, 27, 29, 31
#define EVENS_8 0, 2, 4, 6, 9, 11, 13, 15
#define EVENS_4 0, 2, 5, 7
#define EVENS_2 0, 3
#define EVEN_LOAD(T, n, p) \
    __builtin_shufflevector(*(__global const T *)(p), *(__global const T *)((p) + (n) - 1), VCAT(EVENS_, n))
#define HALVES_16 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15
#define HALVES_8 0, 1, 2, 3, 4, 5, 6, 7
#define HALVES_4 0, 1, 2, 3
#define JOIN_HALVES(n, a, b) __builtin_shufflevector(a, b, VCAT(HALVES_, n))
// the even and the odd lanes of two float16 (a, b) as one: __builtin_shufflevector(a, b, EVEN_LANES)
#define EVEN_LANES 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30
#define ODD_LANES 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31

// float16 (e0, o0, e1, o1, ...) from float8 e and o: one two-source shuffle (clang's builtin:
// OpenCL's shuffle2 is an out-of-line call on PoCL)
#define INTERLEAVE8(e, o) __builtin_shufflevector((float8)(e), (float8)(o), 0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15)

#define INTERLEAVE4(e, o) __builtin_shufflevector((float4)(e), (float4)(o), 0, 4, 1, 5, 2, 6, 3, 7)

inline float hsum4(const float4 v) {
    const float2 h2 = v.lo + v.hi;
    return h2.x + h2.y;
}

inline float hsum8(const float8 v) {
    const float4 h4 = v.lo + v.hi;
    const float2 h2 = h4.lo + h4.hi;
    return h2.x + h2.y;
}

inline float hsum16(const float16 v) {
    const float8 h8 = v.lo + v.hi;
    const float4 h4 = h8.lo + h8.hi;
    const float2 h2 = h4.lo + h4.hi;
    return h2.x + h2.y;
}

// hsum16 of 8 vectors at once, lane m = hsum16(a[m]): the same additions in the same order (bit for
// bit), two vectors a step (7 shuffle pairs and a last one, where 8 hsum16 take 24 narrowing steps)
inline float8 hsum16x8(const float16 a[8]) {
    float16 b[4], c[2];
#pragma unroll
    for (int m = 0; m < 4; m++)  // lanes 0-7: a[2m]'s lo + hi, 8-15: a[2m + 1]'s
        b[m] = __builtin_shufflevector(a[2 * m], a[2 * m + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
               __builtin_shufflevector(a[2 * m], a[2 * m + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
#pragma unroll
    for (int m = 0; m < 2; m++)  // four lanes each of a[4m .. 4m + 3]
        c[m] = __builtin_shufflevector(b[2 * m], b[2 * m + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
               __builtin_shufflevector(b[2 * m], b[2 * m + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    const float16 d = __builtin_shufflevector(c[0], c[1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
                      __builtin_shufflevector(c[0], c[1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
    return __builtin_shufflevector(d, d, 0, 2, 4, 6, 8, 10, 12, 14) + __builtin_shufflevector(d, d, 1, 3, 5, 7, 9, 11, 13, 15);
}

// TR16_SWAP(x, y, v, S, LO, HI), one stage of a transpose of 16 float16 (a bit of the vector index
// swapped with the same bit of the lane index): vectors v and v + S of x (bit S of v clear) to
// y[v] (the lanes of both whose bit S is clear) and y[v + S] (those where it is set), interleaved
// by that bit; LO and HI are TR16_LO<S> and TR16_HI<S>. Four stages (S = 1, 2, 4, 8) transpose
// 16 x 16; three (1, 2, 4) turn 8 vectors holding rows v and v + 8 of a 16 x 8 block into its
// 8 columns.
#define TR16_LO1 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30
#define TR16_HI1 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31
#define TR16_LO2 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29
#define TR16_HI2 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31
#define TR16_LO4 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27
#define TR16_HI4 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31
#define TR16_LO8 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23
#define TR16_HI8 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31
#define TR16_SWAP(x, y, v, S, LO, HI)                                  \
    do {                                                               \
        y[v] = __builtin_shufflevector(x[v], x[(v) + (S)], LO);        \
        y[(v) + (S)] = __builtin_shufflevector(x[v], x[(v) + (S)], HI); \
    } while (0)

// the same stages on float8 (TR16_SWAP with these): three (S = 1, 2, 4) transpose 8 x 8
#define TR8_LO1 0, 8, 2, 10, 4, 12, 6, 14
#define TR8_HI1 1, 9, 3, 11, 5, 13, 7, 15
#define TR8_LO2 0, 1, 8, 9, 4, 5, 12, 13
#define TR8_HI2 2, 3, 10, 11, 6, 7, 14, 15
#define TR8_LO4 0, 1, 2, 3, 8, 9, 10, 11
#define TR8_HI4 4, 5, 6, 7, 12, 13, 14, 15

// a[8] (float8) transposed into t[8] (lane i of a[j] becomes lane j of t[i]), a overwritten
#define TRANSPOSE8(a, t)                                                                                   \
    do {                                                                                                   \
        _Pragma("unroll") for (int v_ = 0; v_ < 8; v_ += 2) TR16_SWAP(a, t, v_, 1, TR8_LO1, TR8_HI1);      \
        _Pragma("unroll") for (int v_ = 0; v_ < 8; v_ += (v_ & 1) ? 3 : 1) TR16_SWAP(t, a, v_, 2, TR8_LO2, TR8_HI2); \
        _Pragma("unroll") for (int v_ = 0; v_ < 4; v_++) TR16_SWAP(a, t, v_, 4, TR8_LO4, TR8_HI4);         \
    } while (0)

// a[16] transposed in place through tmp[16] (lane i of a[j] becomes lane j of a[i])
#define TRANSPOSE16(a, tmp)                                                                        \
    do {                                                                                           \
        _Pragma("unroll") for (int v_ = 0; v_ < 16; v_ += 2) TR16_SWAP(a, tmp, v_, 1, TR16_LO1, TR16_HI1); \
        _Pragma("unroll") for (int v_ = 0; v_ < 16; v_ += (v_ & 1) ? 3 : 1)                        \
            TR16_SWAP(tmp, a, v_, 2, TR16_LO2, TR16_HI2);                                          \
        _Pragma("unroll") for (int v_ = 0; v_ < 16; v_ += (v_ & 3) == 3 ? 5 : 1)                   \
            TR16_SWAP(a, tmp, v_, 4, TR16_LO4, TR16_HI4);                                          \
        _Pragma("unroll") for (int v_ = 0; v_ < 8; v_++) TR16_SWAP(tmp, a, v_, 8, TR16_LO8, TR16_HI8); \
    } while (0)

#endif
