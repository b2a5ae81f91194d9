// LSTM and GRU time steps (netcl/nn/rnn.py). The input projections of every step, x @ W_ih^T + b_ih,
// are one GEMM before the loop (gx); each launch here is one time step of one direction: the
// recurrent product with W_hh, the gates and the state update, a work-item per (batch row b,
// hidden unit j). Gate order as PyTorch's: LSTM i, f, g, o; GRU r, z, n. The forward reads W_hh
// transposed, wt (H, G*H), and the backward W_hh as it is, (G*H, H): either way consecutive
// work-items (consecutive j) read consecutive addresses.
//
// Per direction the forward keeps, indexed by time t: hp (T, B, H) the state h_{t-1} that step t
// read (the weight gradient's GEMM takes it whole), cs (T, B, H) LSTM's c_t, and sv (T, B, 4H) the
// activated gates (LSTM i, f, g, o; GRU r, z, n and W_hn h + b_hn). Rows of h are read at h_off
// with a stride of hs floats (h_0 alone, or the output y of the step before, whose rows hold both
// directions); the output y is written likewise at y_off with stride ys.

float sigm(const float x) { return 1.0f / (1.0f + exp(-x)); }

// LSTM step t: c = f * c_prev + i * g, h = o * tanh(c). gx0 + gx_off: this step's (B, 4H) rows; cp: c_{t-1}
// rows (B, H) (c_0, or cs of the step before)
__kernel void lstm_fwd(const int B, const int H, const int has_bias, __global const float *gx0, const int gx_off,
                       __global const float *wt, __global const float *bh,
                       __global const float *h, const int h_off, const int hs,
                       __global const float *cp, const int cp_off,
                       __global float *y, const int y_off, const int ys,
                       __global float *hp, __global float *cs, __global float *sv, const int t) {
    const int g = get_global_id(0);
    if (g >= B * H) return;
    const int b = g / H, j = g - b * H, G = 4 * H;
    __global const float *hrow = h + h_off + b * hs;
    float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
    for (int k = 0; k < H; k++) {
        const float hk = hrow[k];
        __global const float *w = wt + k * G + j;
        a0 += hk * w[0]; a1 += hk * w[H]; a2 += hk * w[2 * H]; a3 += hk * w[3 * H];
    }
    __global const float *x = gx0 + gx_off + b * G + j;
    if (has_bias) { a0 += bh[j]; a1 += bh[H + j]; a2 += bh[2 * H + j]; a3 += bh[3 * H + j]; }
    const float i = sigm(x[0] + a0), f = sigm(x[H] + a1), gg = tanh(x[2 * H] + a2), o = sigm(x[3 * H] + a3);
    const float c = f * cp[cp_off + g] + i * gg;
    const long s = (long)t * B * H + g;
    hp[s] = hrow[j];
    cs[s] = c;
    __global float *v = sv + (long)t * B * G + b * G + j;
    v[0] = i; v[H] = f; v[2 * H] = gg; v[3 * H] = o;
    y[y_off + b * ys + j] = o * tanh(c);
}

// GRU step t: r, z as LSTM's gates; n = tanh(W_in x + b_in + r * (W_hn h + b_hn)); h = (1 - z) n + z h_prev
__kernel void gru_fwd(const int B, const int H, const int has_bias, __global const float *gx0, const int gx_off,
                      __global const float *wt, __global const float *bh,
                      __global const float *h, const int h_off, const int hs,
                      __global float *y, const int y_off, const int ys,
                      __global float *hp, __global float *sv, const int t) {
    const int g = get_global_id(0);
    if (g >= B * H) return;
    const int b = g / H, j = g - b * H, G = 3 * H;
    __global const float *hrow = h + h_off + b * hs;
    float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f;
    for (int k = 0; k < H; k++) {
        const float hk = hrow[k];
        __global const float *w = wt + k * G + j;
        a0 += hk * w[0]; a1 += hk * w[H]; a2 += hk * w[2 * H];
    }
    if (has_bias) { a0 += bh[j]; a1 += bh[H + j]; a2 += bh[2 * H + j]; }
    __global const float *x = gx0 + gx_off + b * G + j;
    const float r = sigm(x[0] + a0), z = sigm(x[H] + a1), n = tanh(x[2 * H] + r * a2);
    const float hj = hrow[j];
    hp[(long)t * B * H + g] = hj;
    __global float *v = sv + (long)t * B * 4 * H + b * 4 * H + j;
    v[0] = r; v[H] = z; v[2 * H] = n; v[3 * H] = a2;
    y[y_off + b * ys + j] = (1.0f - z) * n + z * hj;
}

// The gradient reaching h_t from the step after it (in this direction's order): dg_next (B, G) @ W_hh,
// or, for the first step of the backward, dh_last (the gradient of h_n)
float dh_from_next(const int has_next, const int G, const int H, const int b, const int j,
                   __global const float *dgn, __global const float *w, __global const float *dhl) {
    if (!has_next) return dhl[b * H + j];
    float a = 0.0f;
    __global const float *d = dgn + b * G;
    for (int k = 0; k < G; k++) a += d[k] * w[k * H + j];
    return a;
}

// LSTM backward of step t: dg (T, B, 4H) gets the gates' pre-activation gradients at t (read at
// the step after, dg_off_next, for h_t's); dc carries dL/dc from the step after to this one (dc_n
// at the first), and leaves dL/dc_{t-1}. dy: the output's gradient rows (y's layout)
__kernel void lstm_bwd(const int B, const int H, const int has_next, __global const float *dy, const int y_off,
                       const int ys, __global const float *w, __global const float *dhl0, const int dhl_off,
                       __global const float *cs, __global const float *cp, const int cp_off,
                       __global const float *sv, __global float *dg, const int dg_off_next,
                       __global float *dc, const int t) {
    const int g = get_global_id(0);
    if (g >= B * H) return;
    const int b = g / H, j = g - b * H, G = 4 * H;
    const float dh = dy[y_off + b * ys + j] + dh_from_next(has_next, G, H, b, j, dg + dg_off_next, w, dhl0 + dhl_off);
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
// h @ W_hh^T + b_hh (n's scaled by r); dz carries dL/dh_t * z_t to the step before (h_{t-1}'s direct share)
__kernel void gru_bwd(const int B, const int H, const int has_next, __global const float *dy, const int y_off,
                      const int ys, __global const float *w, __global const float *dhl0, const int dhl_off,
                      __global const float *hp, __global const float *sv, __global float *dgi,
                      __global float *dgh, const int dg_off_next, __global float *dz, const int t) {
    const int g = get_global_id(0);
    if (g >= B * H) return;
    const int b = g / H, j = g - b * H, G = 3 * H;
    float dh = dy[y_off + b * ys + j] + dh_from_next(has_next, G, H, b, j, dgh + dg_off_next, w, dhl0 + dhl_off);
    if (has_next) dh += dz[g];
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
