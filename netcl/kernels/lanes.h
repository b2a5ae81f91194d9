// Sums in 16 lanes with every lane index a constant: LANES16(i, from, n, l, stmt) runs stmt for
// i = from .. n - 1 (from a multiple of 16) in blocks of 16, l = i % 16 = 0 .. 15 unrolled, and a
// last block whose lanes from n on are skipped. Written as a private array indexed i % 16 at run
// time, such sums came out wrong past 16 terms on Intel's OpenCL CPU runtime (its vectoriser:
// LayerNorm's rstd at D > 16); with constant lane indices the array stays in registers.
#ifndef NETCL_LANES_H
#define NETCL_LANES_H
#define LANES16(i, from, n, l, ...)                                            \
    do {                                                                       \
        const int n_ = (n);                                                    \
        int b_ = (from);                                                       \
        for (; b_ + 16 <= n_; b_ += 16) {                                      \
            _Pragma("unroll") for (int l = 0; l < 16; l++) {                   \
                const int i = b_ + l;                                          \
                __VA_ARGS__;                                                   \
            }                                                                  \
        }                                                                      \
        _Pragma("unroll") for (int l = 0; l < 16; l++) {                       \
            const int i = b_ + l;                                              \
            if (i < n_) {                                                      \
                __VA_ARGS__;                                                   \
            }                                                                  \
        }                                                                      \
    } while (0)
#endif
