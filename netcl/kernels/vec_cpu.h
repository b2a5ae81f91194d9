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
