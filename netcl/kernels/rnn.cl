// LSTM and GRU time steps (netcl/nn/rnn.py). The input projections of every step, x @ W_ih^T + b_ih,
// are one GEMM before the loop (gx); each step is then a GEMM of the recurrent product (netcl's own,
// ops.gemm: gh = h_{t-1} @ W_hh^T forward, dh = dg_{t+1} @ W_hh backward) and one launch here of the
// gates and the state update, a work-item per batch row b and VW hidden units j .. j + VW - 1 (VW 1,
// 4, 8 or 16, dividing H: on CPUs explicit vectors are what PoCL vectorises, and exp and tanh then
// run on vectors; GPUs take VW 1). Gate order as PyTorch's:
// LSTM i, f, g, o; GRU r, z, n.
//
// Per direction the forward keeps, indexed by time t: hp (T, B, H) the state h_{t-1} that step t
// read (the weight gradient's GEMM takes it whole), cs (T, B, H) LSTM's c_t, and sv (T, B, 4H) the
// activated gates (LSTM i, f, g, o; GRU r, z, n and W_hn h + b_hn). Rows of h are read at h_off
// with a stride of hs floats (h_0 alone, or the output y of the step before, whose rows hold both
// directions); the output y is written likewise at y_off with stride ys. An inference call (save 0)
// writes neither hp nor sv, and LSTM's c in place: cs is then one (B, H) block, read as cp from the
// second step on and indexed with t 0 (each work-item reads c_{t-1} where it writes c_t).

#ifndef VW
#define VW 1
#endif
#if VW == 1
#define floatV float
#define LD(p, o) ((p)[o])
#define ST(v, p, o) ((p)[o] = (v))
#else
#define RNN_CAT_(a, b) a##b
#define RNN_CAT(a, b) RNN_CAT_(a, b)
#define floatV RNN_CAT(float, VW)
#define LD(p, o) RNN_CAT(vload, VW)(0, (p) + (o))
#define ST(v, p, o) RNN_CAT(vstore, VW)((v), 0, (p) + (o))
#endif
#define SIGM(x) (1.0f / (1.0f + exp(-(x))))

// LSTM step t: c = f * c_prev + i * g, h = o * tanh(c). gx0 + gx_off: this step's (B, 4H) rows of
// x @ W_ih^T + b_ih; gh: h_{t-1} @ W_hh^T (B, 4H); cp: c_{t-1} rows (B, H) (c_0, or cs of the step before)
__kernel void lstm_fwd(const int B, const int H, const int has_bias, __global const float *gx0, const int gx_off,
                       __global const float *gh, __global const float *bh,
                       __global const float *h, const int h_off, const int hs,
                       __global const float *cp, const int cp_off,
                       __global float *y, const int y_off, const int ys,
                       __global float *hp, __global float *cs, __global float *sv, const int t, const int save) {
    const int g = get_global_id(0), HV = H / VW;
    if (g >= B * HV) return;
    const int b = g / HV, j = (g - b * HV) * VW, e = b * H + j, G = 4 * H;
    const int x = gx_off + b * G + j, r = b * G + j;
    floatV a0 = LD(gx0, x) + LD(gh, r), a1 = LD(gx0, x + H) + LD(gh, r + H);
    floatV a2 = LD(gx0, x + 2 * H) + LD(gh, r + 2 * H), a3 = LD(gx0, x + 3 * H) + LD(gh, r + 3 * H);
    if (has_bias) { a0 += LD(bh, j); a1 += LD(bh, H + j); a2 += LD(bh, 2 * H + j); a3 += LD(bh, 3 * H + j); }
    const floatV i = SIGM(a0), f = SIGM(a1), gg = tanh(a2), o = SIGM(a3);
    const floatV c = f * LD(cp, cp_off + e) + i * gg;
    const long s = (long)t * B * H + e;
    ST(c, cs, s);
    if (save) {
        ST(LD(h, h_off + b * hs + j), hp, s);
        const long v = (long)t * B * G + b * G + j;
        ST(i, sv, v); ST(f, sv, v + H); ST(gg, sv, v + 2 * H); ST(o, sv, v + 3 * H);
    }
    ST(o * tanh(c), y, y_off + b * ys + j);
}

// GRU step t: r, z as LSTM's gates; n = tanh(W_in x + b_in + r * (W_hn h + b_hn)); h = (1 - z) n + z h_prev
__kernel void gru_fwd(const int B, const int H, const int has_bias, __global const float *gx0, const int gx_off,
                      __global const float *gh, __global const float *bh,
                      __global const float *h, const int h_off, const int hs,
                      __global float *y, const int y_off, const int ys,
                      __global float *hp, __global float *sv, const int t, const int save) {
    const int g = get_global_id(0), HV = H / VW;
    if (g >= B * HV) return;
    const int b = g / HV, j = (g - b * HV) * VW, e = b * H + j, G = 3 * H;
    const int x = gx_off + b * G + j, q = b * G + j;
    floatV a0 = LD(gh, q), a1 = LD(gh, q + H), a2 = LD(gh, q + 2 * H);
    if (has_bias) { a0 += LD(bh, j); a1 += LD(bh, H + j); a2 += LD(bh, 2 * H + j); }
    const floatV r = SIGM(LD(gx0, x) + a0), z = SIGM(LD(gx0, x + H) + a1), n = tanh(LD(gx0, x + 2 * H) + r * a2);
    const floatV hj = LD(h, h_off + b * hs + j);
    if (save) {
        ST(hj, hp, (long)t * B * H + e);
        const long v = (long)t * B * 4 * H + b * 4 * H + j;
        ST(r, sv, v); ST(z, sv, v + H); ST(n, sv, v + 2 * H); ST(a2, sv, v + 3 * H);
    }
    ST((1.0f - z) * n + z * hj, y, y_off + b * ys + j);
}

// LSTM backward of step t: dg (T, B, 4H) gets the gates' pre-activation gradients at t. The gradient
// reaching h_t from the step after it is dhr = dg_{t+1} @ W_hh (B, H), or at the first step of the
// backward (has_next 0) dh_n's rows at dhl0 + dhl_off. dc carries dL/dc from the step after to this
// one (dc_n at the first) and leaves dL/dc_{t-1}. dy: the output's gradient rows (y's layout)
__kernel void lstm_bwd(const int B, const int H, const int has_next, __global const float *dy, const int y_off,
                       const int ys, __global const float *dhr, __global const float *dhl0, const int dhl_off,
                       __global const float *cs, __global const float *cp, const int cp_off,
                       __global const float *sv, __global float *dg, __global float *dc, const int t) {
    const int g = get_global_id(0), HV = H / VW;
    if (g >= B * HV) return;
    const int b = g / HV, j = (g - b * HV) * VW, e = b * H + j, G = 4 * H;
    floatV dh = LD(dy, y_off + b * ys + j);
    if (has_next) dh += LD(dhr, e);
    else dh += LD(dhl0, dhl_off + e);
    const long v = (long)t * B * G + b * G + j;
    const floatV i = LD(sv, v), f = LD(sv, v + H), gg = LD(sv, v + 2 * H), o = LD(sv, v + 3 * H);
    const floatV tc = tanh(LD(cs, (long)t * B * H + e));
    const floatV dct = LD(dc, e) + dh * o * (1.0f - tc * tc);
    ST(dct * gg * i * (1.0f - i), dg, v);
    ST(dct * LD(cp, cp_off + e) * f * (1.0f - f), dg, v + H);
    ST(dct * i * (1.0f - gg * gg), dg, v + 2 * H);
    ST(dh * tc * o * (1.0f - o), dg, v + 3 * H);
    ST(dct * f, dc, e);
}

// GRU backward of step t: dgi (T, B, 3H) the gradients of x @ W_ih^T + b_ih, dgh those of
// h @ W_hh^T + b_hh (n's scaled by r); dhr and dhl0 as LSTM's; dz carries dL/dh_t * z_t to the step
// before (h_{t-1}'s direct share)
__kernel void gru_bwd(const int B, const int H, const int has_next, __global const float *dy, const int y_off,
                      const int ys, __global const float *dhr, __global const float *dhl0, const int dhl_off,
                      __global const float *hp, __global const float *sv, __global float *dgi,
                      __global float *dgh, __global float *dz, const int t) {
    const int g = get_global_id(0), HV = H / VW;
    if (g >= B * HV) return;
    const int b = g / HV, j = (g - b * HV) * VW, e = b * H + j, G = 3 * H;
    floatV dh = LD(dy, y_off + b * ys + j);
    if (has_next) dh += LD(dhr, e) + LD(dz, e);
    else dh += LD(dhl0, dhl_off + e);
    const long v = (long)t * B * 4 * H + b * 4 * H + j;
    const floatV r = LD(sv, v), z = LD(sv, v + H), n = LD(sv, v + 2 * H), hn = LD(sv, v + 3 * H);
    const floatV dn = dh * (1.0f - z) * (1.0f - n * n);
    const floatV dr = dn * hn * r * (1.0f - r);
    const floatV dzp = dh * (LD(hp, (long)t * B * H + e) - n) * z * (1.0f - z);
    const long o = (long)t * B * G + b * G + j;
    ST(dr, dgi, o); ST(dzp, dgi, o + H); ST(dn, dgi, o + 2 * H);
    ST(dr, dgh, o); ST(dzp, dgh, o + H); ST(dn * r, dgh, o + 2 * H);
    ST(dh * z, dz, e);
}
