// What the CPU (PoCL) kernel files share: unaligned vector types (a row of odd length starts
// anywhere; PoCL keeps a dereferenced vector in registers, where vloadN is an out-of-line call)
// and the horizontal sum of a float16.
#ifndef NETCL_VEC_CPU_H
#define NETCL_VEC_CPU_H

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

#endif
