"""The CPU kernels that sum in 16 lanes (term i into lane i % 16) at lengths around and past 16,
launched directly against float64 numpy. Written once as `a[i % 16] += ...` on a private array,
they gave wrong sums past 16 terms on Intel's OpenCL CPU runtime (its vectoriser: LayerNorm's rstd
off by 2.5 at D > 16) while PoCL's were right: these run on whatever device is selected, so they
prove it there (make test-portability runs them on Intel's)."""
import numpy as np
import pytest
from conftest import assert_close

from netcl import Tensor, ops

LENGTHS = (1, 15, 16, 17, 33, 100)


def dev(queue, a):
    return Tensor.from_host(queue, np.ascontiguousarray(a, np.float32))


def zeros(queue, *shape):
    return Tensor.from_host(queue, np.zeros(shape, np.float32))


def got(t):
    """A kernel's output tensor read back (marked written first: the launches here bypass ops)."""
    return t.mark_written().to_host()


@pytest.mark.parametrize("n", LENGTHS)
def test_sum_axis_cpu(queue, rng, n):
    x = rng.normal(size=(n, 5)) + 1.0
    out = dev(queue, np.full(5, 0.5))
    ops.launch(queue, "norm_cpu", "sum_axis_cpu", (5,), (1,), n, 5, dev(queue, x), 0, 5, 1, out, 1)
    assert_close(got(out), x.astype(np.float32).astype(np.float64).sum(0) + 0.5, what="sum_axis_cpu")


@pytest.mark.parametrize("d", LENGTHS)
def test_layernorm_cpu_kernels(queue, rng, d):
    """ln_fwd_cpu (rows of d), ln_bwd_dx_cpu, and ln_bwd_params_cpu (d rows a column)."""
    m = d + 2
    x = (rng.normal(size=(m, d)) * 2 + 1).astype(np.float32).astype(np.float64)
    gamma, beta = rng.uniform(0.5, 1.5, d), rng.normal(size=d)
    dy = rng.normal(size=(m, d)).astype(np.float32).astype(np.float64)
    gamma, beta = gamma.astype(np.float32).astype(np.float64), beta.astype(np.float32).astype(np.float64)
    eps = 1e-4
    mu = x.mean(1, keepdims=True)
    rstd = 1 / np.sqrt(((x - mu) ** 2).mean(1, keepdims=True) + eps)
    xhat = (x - mu) * rstd
    g = dy * gamma
    want_dx = rstd * (g - g.mean(1, keepdims=True) - xhat * (g * xhat).mean(1, keepdims=True))

    xt, y, mean, rs = dev(queue, x), zeros(queue, m, d), zeros(queue, m), zeros(queue, m)
    ops.launch(queue, "norm_cpu", "ln_fwd_cpu", (m,), (1,), m, d, 1, xt, dev(queue, gamma), dev(queue, beta), eps,
               y, mean, rs)
    assert_close(got(mean), mu[:, 0], what="mean")
    assert_close(got(rs), rstd[:, 0], rtol=1e-4, what="rstd")
    assert_close(got(y), xhat * gamma + beta, rtol=1e-4, atol=1e-5, what="y")
    dx = zeros(queue, m, d)
    ops.launch(queue, "norm_cpu", "ln_bwd_dx_cpu", (m,), (1,), m, d, 1, xt, dev(queue, dy), dev(queue, gamma),
               mean, rs, dx)
    assert_close(got(dx), want_dx, rtol=1e-4, atol=1e-5, what="dx")
    dg, db = dev(queue, np.ones(d)), dev(queue, np.ones(d))
    ops.launch(queue, "norm_cpu", "ln_bwd_params_cpu", (d,), (1,), m, d, xt, dev(queue, dy), mean, rs, dg, db, 1)
    assert_close(got(dg), (dy * xhat).sum(0) + 1, rtol=1e-4, atol=1e-5, what="dgamma")
    assert_close(got(db), dy.sum(0) + 1, what="dbeta")


def batch_parts(x, plen):
    """Per channel row of x (C, M): parts of plen values (the last shorter), each (sum, squared
    deviations from its own mean), as bn_stats_part writes them: (C, parts, 2)."""
    c, m = x.shape
    out = []
    for p0 in range(0, m, plen):
        v = x[:, p0:p0 + plen]
        out.append(np.stack([v.sum(1), ((v - v.mean(1, keepdims=True)) ** 2).sum(1)], 1))
    return np.stack(out, 1)


@pytest.mark.parametrize("parts", LENGTHS)
@pytest.mark.parametrize("layout", ["channel", "part"])
def test_bn_stats_finish_cpu(queue, rng, parts, layout):
    """Batch statistics from parts of 4 values and a short last one (ps 1: a channel's parts together;
    ps C: a part's channels together, the scalar path)."""
    c, plen = 3, 4
    m = plen * (parts - 1) + 3
    x = (rng.normal(size=(c, m)) * 2 + 3).astype(np.float32).astype(np.float64)
    part = batch_parts(x, plen)
    cs, ps, host = (parts, 1, part) if layout == "channel" else (1, c, part.transpose(1, 0, 2))
    mean, var = zeros(queue, c), zeros(queue, c)
    rm, rv = dev(queue, np.full(c, 0.5)), dev(queue, np.full(c, 2.0))
    ops.launch(queue, "norm_cpu", "bn_stats_finish_cpu", (c,), (1,), m, parts, plen, dev(queue, host), cs, ps,
               mean, var, rm, rv, 0.25)
    assert_close(got(mean), x.mean(1), what="mean")
    assert_close(got(var), x.var(1), rtol=1e-4, what="var")
    assert_close(got(rm), 0.75 * 0.5 + 0.25 * x.mean(1), what="running mean")
    assert_close(got(rv), 0.75 * 2.0 + 0.25 * x.var(1, ddof=1 if m > 1 else 0), rtol=1e-4, what="running var")


@pytest.mark.parametrize("parts", LENGTHS)
def test_bn_bwd_finish_cpu(queue, rng, parts):
    c = 3
    part = rng.normal(size=(c, parts, 2)).astype(np.float32).astype(np.float64)
    var = rng.uniform(0.5, 2.0, c).astype(np.float32).astype(np.float64)
    dg, db, sums = dev(queue, np.ones(c)), dev(queue, np.ones(c)), zeros(queue, c, 2)
    ops.launch(queue, "norm_cpu", "bn_bwd_finish_cpu", (c,), (1,), parts, dev(queue, part), dev(queue, var), 1e-3,
               dg, db, 1, sums)
    want_db, want_dg = part[:, :, 0].sum(1), part[:, :, 1].sum(1) / np.sqrt(var + 1e-3)
    assert_close(got(db), want_db + 1, what="dbeta")
    assert_close(got(dg), want_dg + 1, rtol=1e-4, what="dgamma")
    assert_close(got(sums), np.stack([want_db, want_dg], 1), rtol=1e-4, what="sums")


@pytest.mark.parametrize("rows", LENGTHS)
def test_dw_backward_weight_cpu(queue, rng, rows):
    """A depthwise 3x3 conv's weight gradient (stride 1, padding 1, 2 channels, multiplier 2) over
    N * OH = rows output rows: one image of `rows` rows."""
    n, c, h, w, mult, k = 1, 2, rows, 5, 2, 3
    x = rng.normal(size=(n, c, h, w)).astype(np.float32).astype(np.float64)
    dy = rng.normal(size=(n, c * mult, h, w)).astype(np.float32).astype(np.float64)
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    want = np.zeros((c * mult, k, k))
    for o in range(c * mult):
        for kh in range(k):
            for kw in range(k):
                want[o, kh, kw] = (dy[:, o] * xp[:, o // mult, kh:kh + h, kw:kw + w]).sum()
    gw = zeros(queue, c * mult, k, k)
    ops.launch(queue, "conv", "dw_backward_weight_cpu", (c * mult * k * k,), (1,), n, c, h, w, mult, k, 1, 1, 1, h, w,
               dev(queue, x), dev(queue, dy), gw, 0)
    assert_close(got(gw), want, rtol=1e-4, what="dw")
