// What the CPU (PoCL) kernel files share: unaligned vector types (a row of odd length starts
// anywhere; PoCL keeps a dereferenced vector in registers, where vloadN is an out-of-line call)
// and the horizontal sum of a float16.
#ifndef NETCL_VEC_CPU_H
#define NETCL_VEC_CPU_H

typedef float16 __attribute__((aligned(4))) ufloat16;

inline float hsum16(const float16 v) {
    const float8 h8 = v.lo + v.hi;
    const float4 h4 = h8.lo + h8.hi;
    const float2 h2 = h4.lo + h4.hi;
    return h2.x + h2.y;
}

#endif
