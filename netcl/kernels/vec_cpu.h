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

#endif
