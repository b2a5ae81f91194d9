// LSTM and GRU time steps (netcl/nn/rnn.py). The input projections of every step, x @ W_ih^T + b_ih,
// are one GEMM before the loop (gx); each step is then a GEMM of the recurrent product (netcl's own,
// ops.gemm: gh = h_{t-1} @ W_hh^T forward, dh = dg_{t+1} @ W_hh backward) and one launch here of the
// gates and the state update, a work-item per (batch row b, hidden unit j). Gate order as PyTorch's:
// LSTM i, f, g, o; GRU r, z, n.
//
// Per direction the forward keeps, indexed by time t: hp (T, B, H) the state h_{t-1} that step t
// read (the weight gradient's GEMM takes it whole), cs (T, B, H) LSTM's c_t, and sv (T, B, 4H) the
// activated gates (LSTM i, f, g, o; GRU r, z, n and W_hn h + b_hn). Rows of h are read at h_off
// with a stride of hs floats (h_0 alone, or the output y of the step before, whose rows hold both
// directions); the output y is written likewise at y_off with stride ys.

float sigm(const float x) { return 1.0f / (1.0f + exp(-x)); }

// LSTM step t: c = f * c_prev + i * g, h = o * tanh(c). gx0 + gx_off: this step's (B, 4H) rows of
// x @ W_ih^T + b_ih; gh: h_{t-1} @ W_hh^T (B, 4H); cp: c_{t-1} rows (B, H) (c_0, or cs of the step before)
__kernel void lstm_fwd(const int B, const int H, const int has_bias, __global const float *gx0, const int gx_off,
                       __global const float *gh, __global const float *bh,
                       __global const float *h, const int h_off, const int hs,
                       __global const float *cp, const int cp_off,
                       __global float *y, const int y_off, const int ys,
                       __global float *hp, __global float *cs, __global float *sv, const int t) {
    const int g = get_global_id(0);
    if (g >= B * H) return;
    const int b = g / H, j = g - b * H, G = 4 * H;
    __global const float *x = gx0 + gx_off + b * G + j;
    __global const float *r = gh + b * G + j;
    float a0 = x[0] + r[0], a1 = x[H] + r[H], a2 = x[2 * H] + r[2 * H], a3 = x[3 * H] + r[3 * H];
    if (has_bias) { a0 += bh[j]; a1 += bh[H + j]; a2 += bh[2 * H + j]; a3 += bh[3 * H + j]; }
    const float i = sigm(a0), f = sigm(a1), gg = tanh(a2), o = sigm(a3);
    const float c = f * cp[cp_off + g] + i * gg;
    const long s = (long)t * B * H + g;
    hp[s] = h[h_off + b * hs + j];
    cs[s] = c;
    __global float *v = sv + (long)t * B * G + b * G + j;
    v[0] = i; v[H] = f; v[2 * H] = gg; v[3 * H] = o;
    y[y_off + b * ys + j] = o * tanh(c);
}

// GRU step t: r, z as LSTM's gates; n = tanh(W_in x + b_in + r * (W_hn h + b_hn)); h = (1 - z) n + z h_prev
__kernel void gru_fwd(const int B, const int H, const int has_bias, __global const float *gx0, const int gx_off,
                      __global const float *gh, __global const float *bh,
                      __global const float *h, const int h_off, const int hs,
                      __global float *y, const int y_off, const int ys,
                      __global float *hp, __global float *sv, const int t) {
    const int g = get_global_id(0);
    if (g >= B * H) return;
    const int b = g / H, j = g - b * H, G = 3 * H;
    __global const float *x = gx0 + gx_off + b * G + j;
    __global const float *q = gh + b * G + j;
    float a0 = q[0], a1 = q[H], a2 = q[2 * H];
    if (has_bias) { a0 += bh[j]; a1 += bh[H + j]; a2 += bh[2 * H + j]; }
    const float r = sigm(x[0] + a0), z = sigm(x[H] + a1), n = tanh(x[2 * H] + r * a2);
    const float hj = h[h_off + b * hs + j];
    hp[(long)t * B * H + g] = hj;
    __global float *v = sv + (long)t * B * 4 * H + b * 4 * H + j;
    v[0] = r; v[H] = z; v[2 * H] = n; v[3 * H] = a2;
    y[y_off + b * ys + j] = (1.0f - z) * n + z * hj;
}

// LSTM backward of step t: dg (T, B, 4H) gets the gates' pre-activation gradients at t. The gradient
// reaching h_t from the step after it is dhr = dg_{t+1} @ W_hh (B, H), or at the first step of the
// backward (has_next 0) dh_n's rows at dhl0 + dhl_off. dc carries dL/dc from the step after to this
// one (dc_n at the first) and leaves dL/dc_{t-1}. dy: the output's gradient rows (y's layout)
__kernel void lstm_bwd(const int B, const int H, const int has_next, __global const float *dy, const int y_off,
                       const int ys, __global const float *dhr, __global const float *dhl0, const int dhl_off,
                       __global const float *cs, __global const float *cp, const int cp_off,
                       __global const float *sv, __global float *dg, __global float *dc, const int t) {
    const int g = get_global_id(0);
    if (g >= B * H) return;
    const int b = g / H, j = g - b * H, G = 4 * H;
    const float dh = dy[y_off + b * ys + j] + (has_next ? dhr[g] : dhl0[dhl_off + g]);
    __global const float *v = sv + (long)t * B * G + b * G + j;
    const float i = v[0], f = v[H], gg = v[2 * H], o = v[3 * H];
    const float tc = tanh(cs[(long)t * B * H + g]);
    const float dct = dc[g] + dh * o * (1.0f - tc * tc);
    __global float *d = dg + (long)t * B * G + b * G + j;
    d[0] = dct * gg * i * (1.0f - i);
    d[H] = dct * cp[cp_off + g] * f * (1.0f - f);
    d[2 * H] = dct * i * (1.0f - gg * gg);
    d[3 * H] = dh * tc * o * (1.0f - o);
    dc[g] = dct * f;
}

// GRU backward of step t: dgi (T, B, 3H) the gradients of x @ W_ih^T + b_ih, dgh those of
// h @ W_hh^T + b_hh (n's scaled by r); dhr and dhl0 as LSTM's; dz carries dL/dh_t * z_t to the step
// before (h_{t-1}'s direct share)
__kernel void gru_bwd(const int B, const int H, const int has_next, __global const float *dy, const int y_off,
                      const int ys, __global const float *dhr, __global const float *dhl0, const int dhl_off,
                      __global const float *hp, __global const float *sv, __global float *dgi,
                      __global float *dgh, __global float *dz, const int t) {
    const int g = get_global_id(0);
    if (g >= B * H) return;
    const int b = g / H, j = g - b * H, G = 3 * H;
    const float dh = dy[y_off + b * ys + j] + (has_next ? dhr[g] + dz[g] : dhl0[dhl_off + g]);
    __global const float *v = sv + (long)t * B * 4 * H + b * 4 * H + j;
    const float r = v[0], z = v[H], n = v[2 * H], hn = v[3 * H];
    const float dn = dh * (1.0f - z) * (1.0f - n * n);
    const float dr = dn * hn * r * (1.0f - r);
    const float dzp = dh * (hp[(long)t * B * H + g] - n) * z * (1.0f - z);
    const long o = (long)t * B * G + b * G + j;
    dgi[o] = dr; dgi[o + H] = dzp; dgi[o + 2 * H] = dn;
    dgh[o] = dr; dgh[o + H] = dzp; dgh[o + 2 * H] = dn * r;
    dz[g] = dh * z;
}
