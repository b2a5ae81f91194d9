"""Tensor operations and autograd: every operation's forward and gradient against float64 PyTorch
(broadcast shapes, odd sizes, 0-d and one-element tensors, copies made by transpose and slicing),
and the tape's rules (fan-out, retain_graph, no_grad, detach, in-place checks, devices, dtypes)."""
import numpy as np
import pytest

import netcl
from netcl import Tensor

torch = pytest.importorskip("torch")


def _t(a, q, grad=True):
    return netcl.tensor(np.asarray(a, np.float32), queue=q, requires_grad=grad)


def check(queue, rng, fn_netcl, fn_torch, arrays, grads=None, rtol=1e-5, atol=1e-6, gradient=True):
    """Run fn on netcl tensors and on float64 torch tensors of the same values; compare the output
    and, with a random output gradient, every input's gradient."""
    grads = [True] * len(arrays) if grads is None else grads
    ours = [_t(a, queue, g) for a, g in zip(arrays, grads)]
    theirs = [torch.tensor(np.asarray(a, np.float64), requires_grad=g) for a, g in zip(arrays, grads)]
    y, ref = fn_netcl(*ours), fn_torch(*theirs)
    got = y.numpy()
    assert got.shape == tuple(ref.shape), f"shape {got.shape} != {tuple(ref.shape)}"
    scale = float(np.max(np.abs(ref.detach().numpy()))) if ref.numel() else 0.0
    np.testing.assert_allclose(got, ref.detach().numpy(), rtol=0, atol=atol + rtol * scale)
    if not gradient or not any(grads):
        return
    g = rng.standard_normal(got.shape).astype(np.float32)
    y.backward(Tensor.from_host(queue, g))
    ref.backward(torch.tensor(g, dtype=torch.float64))
    for i, (t, r) in enumerate(zip(ours, theirs)):
        if not grads[i]:
            assert t.grad is None
            continue
        assert t.grad is not None, f"input {i} got no gradient"
        want = r.grad.numpy()
        gscale = float(np.max(np.abs(want))) if want.size else 0.0
        np.testing.assert_allclose(t.grad.numpy(), want, rtol=0, atol=atol + 10 * rtol * gscale,
                                   err_msg=f"gradient of input {i}")


BROADCAST = [((3, 4), (4,)), ((2, 1, 5), (3, 1)), ((), (2, 3)), ((1,), (17,)), ((33,), (33,)), ((2, 3, 1, 4), (1, 3, 5, 1)),
             ((300, 70), (300, 70)), ((300, 70), (70,))]


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "pow", "maximum", "minimum"])
@pytest.mark.parametrize("sa,sb", BROADCAST)
def test_binary_broadcasting_vs_torch(queue, rng, op, sa, sb):
    a, b = rng.standard_normal(sa), rng.standard_normal(sb)
    if op == "div":
        b = np.sign(b) * (np.abs(b) + 0.5)
    if op == "pow":
        a = np.abs(a) + 0.5
        b = np.clip(b, -2, 2)
    if op in ("maximum", "minimum"):
        b = b + 0.01  # no ties (their gradient is split, tested below)
    ours = {"add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y,
            "div": lambda x, y: x / y, "pow": lambda x, y: x ** y, "maximum": lambda x, y: x.maximum(y),
            "minimum": lambda x, y: x.minimum(y)}[op]
    theirs = {"maximum": torch.maximum, "minimum": torch.minimum}.get(op, ours)
    check(queue, rng, ours, theirs, [a, b], rtol=1e-5 if op != "pow" else 3e-5)


@pytest.mark.parametrize("expr", ["x + 2", "2 - x", "x * -3", "1 / x", "x / 4", "x ** 2", "x ** 3", "2 ** x",
                                  "-x", "+x", "abs(x)", "x - 1.5", "0.5 * x + 1"])
@pytest.mark.parametrize("shape", [(), (1,), (5, 7), (2, 3, 19)])
def test_scalar_operands_vs_torch(queue, rng, expr, shape):
    x = rng.standard_normal(shape)
    if "1 / x" in expr:
        x = np.sign(x) * (np.abs(x) + 0.5)
    fn = eval(f"lambda x: {expr}")
    check(queue, rng, fn, fn, [x])


@pytest.mark.parametrize("name", ["exp", "log", "sqrt", "abs", "neg", "relu", "sigmoid", "tanh", "square",
                                  "pow_half", "clamp", "clamp_min", "clamp_max"])
@pytest.mark.parametrize("shape", [(), (1,), (17,), (4, 33), (3, 2, 40)])
def test_unary_vs_torch(queue, rng, name, shape):
    x = rng.standard_normal(shape) * 2
    if name in ("log", "sqrt", "pow_half"):
        x = np.abs(x) + 0.1
    ours = {"exp": lambda t: t.exp(), "log": lambda t: t.log(), "sqrt": lambda t: t.sqrt(), "abs": lambda t: t.abs(),
            "neg": lambda t: t.neg(), "relu": lambda t: t.relu(), "sigmoid": lambda t: t.sigmoid(),
            "tanh": lambda t: t.tanh(), "square": lambda t: t.square(), "pow_half": lambda t: t.pow(0.5),
            "clamp": lambda t: t.clamp(-0.5, 0.7), "clamp_min": lambda t: t.clamp(min=0.2),
            "clamp_max": lambda t: t.clamp(max=-0.1)}[name]
    check(queue, rng, ours, ours, [x], rtol=2e-5)


@pytest.mark.parametrize("case", ["tensor_bounds", "min_tensor", "max_tensor", "number_and_tensor", "ties",
                                  "min_above_max"])
def test_clamp_with_tensor_bounds_vs_torch(queue, rng, case):
    """PyTorch's rule: min(max(x, min), max); at a tie the gradient goes to x, and where min > max to max."""
    x = rng.integers(-3, 4, (4, 6)).astype(np.float64)  # (integers: ties with the bounds)
    lo, hi = rng.integers(-3, 1, (4, 6)).astype(np.float64), rng.integers(0, 4, (6,)).astype(np.float64)
    if case == "min_above_max":
        lo = hi + 1.0
    fn = {"tensor_bounds": lambda t, a, b: t.clamp(a, b), "ties": lambda t, a, b: t.clamp(a, b),
          "min_above_max": lambda t, a, b: t.clamp(a, b),
          "min_tensor": lambda t, a, b: t.clamp(min=a) * b, "max_tensor": lambda t, a, b: t.clamp(max=b) * a,
          "number_and_tensor": lambda t, a, b: t.clamp(-1.0, b) * a}[case]
    theirs = fn if case != "number_and_tensor" else (  # (PyTorch takes a number bound as a tensor only)
        lambda t, a, b: t.clamp(torch.tensor(-1.0, dtype=torch.float64), b) * a)
    check(queue, rng, fn, theirs, [x, np.broadcast_to(lo, (4, 6)), hi])


def test_clamp_with_min_above_max_gives_max(queue):
    x = np.array([-5.0, 1.0, 5.0, np.nan], np.float32)
    got = netcl.tensor(x, queue=queue).clamp(2.0, 0.0).numpy()
    np.testing.assert_array_equal(got, torch.tensor(x).clamp(2.0, 0.0).numpy())


@pytest.mark.parametrize("exponent", [0.0, 0.5, 1.0, 2.0, 3.0, -1.0, "tensor", "number_base"])
def test_pow_gradient_at_zero_follows_torch(queue, exponent):
    """No gradient where the exponent is 0, nor in the exponent where the base is 0 and the exponent
    is not negative; infinities where PyTorch has them."""
    a, b = np.array([0.0, 0.0, 0.0, 2.0, 1.5]), np.array([0.0, 1.0, 2.5, 0.0, -1.0])
    if exponent == "tensor":
        arrays, fn = [a, b], lambda x, e: x ** e
    elif exponent == "number_base":
        arrays, fn = [b], lambda e: 0.0 ** e
    else:
        arrays, fn = [a], lambda x: x ** exponent
    ours = [_t(v, queue) for v in arrays]
    theirs = [torch.tensor(v, requires_grad=True) for v in arrays]
    fn(*ours).sum().backward()
    fn(*theirs).sum().backward()
    for t, r in zip(ours, theirs):
        np.testing.assert_allclose(t.grad.numpy(), r.grad.numpy(), rtol=3e-6, atol=1e-6)  # (infs must match)


@pytest.mark.parametrize("how", ["split2", "split_sections", "chunk3", "chunk_more"])
def test_split_and_chunk_vs_torch(queue, rng, how):
    x = rng.standard_normal((4, 7, 3))
    fn = {"split2": lambda t: t.split(2, 1), "split_sections": lambda t: t.split([1, 4, 2], dim=1),
          "chunk3": lambda t: t.chunk(3, dim=1), "chunk_more": lambda t: t.chunk(5, 0)}[how]
    weights = [float(k + 1) for k in range(len(fn(torch.zeros(x.shape))))]
    check(queue, rng, lambda t: netcl.cat([p * w for p, w in zip(fn(t), weights)], 1 if how != "chunk_more" else 0),
          lambda t: torch.cat([p * w for p, w in zip(fn(t), weights)], 1 if how != "chunk_more" else 0), [x])


@pytest.mark.parametrize("op", ["sum", "mean", "amax", "amin"])
@pytest.mark.parametrize("dim", [[], ()])
def test_an_empty_dim_list_reduces_every_dimension(queue, rng, op, dim):
    x = rng.standard_normal((3, 4))
    check(queue, rng, lambda t: getattr(t, op)(dim=dim), lambda t: getattr(t, op)(dim=dim), [x])


@pytest.mark.parametrize("fn", ["softmax", "log_softmax"])
@pytest.mark.parametrize("shape,dim", [((4, 10), 1), ((4, 10), 0), ((2, 3, 5), 1), ((2, 3, 5), -1), ((7,), 0),
                                       ((3, 200), 1), ((), 0), ((), -1)])
def test_softmax_vs_torch(queue, rng, fn, shape, dim):
    x = rng.standard_normal(shape) * 3
    check(queue, rng, lambda t: getattr(t, fn)(dim), lambda t: getattr(t, fn)(dim), [x], rtol=2e-5)


def test_log_softmax_of_large_logits_is_finite(queue):
    x = np.array([[1000.0, 0.0, -1000.0]], np.float32)
    y = netcl.tensor(x, queue=queue).log_softmax(1).numpy()
    np.testing.assert_allclose(y, torch.tensor(x, dtype=torch.float64).log_softmax(1).numpy(), atol=1e-4)


REDUCE_CASES = [((5, 7), None, False), ((5, 7), 0, False), ((5, 7), 1, True), ((2, 3, 4), (0, 2), False),
                ((2, 3, 4), (0, 1), True), ((2, 3, 4), -1, False), ((33,), 0, False), ((), None, False),
                ((300, 70), 0, False), ((70, 300), 1, False), ((4, 1, 3), 1, False)]


@pytest.mark.parametrize("op", ["sum", "mean"])
@pytest.mark.parametrize("shape,dim,keepdim", REDUCE_CASES)
def test_sum_and_mean_vs_torch(queue, rng, op, shape, dim, keepdim):
    x = rng.standard_normal(shape)
    if dim is None:
        check(queue, rng, lambda t: getattr(t, op)(), lambda t: getattr(t, op)(), [x])
    else:
        check(queue, rng, lambda t: getattr(t, op)(dim, keepdim), lambda t: getattr(t, op)(dim, keepdim), [x])


@pytest.mark.parametrize("op", ["amax", "amin"])
@pytest.mark.parametrize("shape,dim,keepdim", REDUCE_CASES[:-1])
def test_amax_amin_vs_torch(queue, rng, op, shape, dim, keepdim):
    x = rng.standard_normal(shape)
    if dim is None:
        check(queue, rng, lambda t: getattr(t, op)(), lambda t: getattr(t, op)(), [x])
    else:
        check(queue, rng, lambda t: getattr(t, op)(dim, keepdim), lambda t: getattr(t, op)(dim, keepdim), [x])


def test_amax_shares_the_gradient_between_ties_as_torch(queue, rng):
    x = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0]])
    check(queue, rng, lambda t: t.amax(1), lambda t: t.amax(1), [x])
    check(queue, rng, lambda t: t.max(), lambda t: t.max(), [x])
    check(queue, rng, lambda t: t.maximum(t * 0 + 2), lambda t: torch.maximum(t, t * 0 + 2), [x])


@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("shape,dim,keepdim", [((5, 7), 1, False), ((5, 7), 0, True), ((2, 3, 33), 2, False),
                                               ((3, 40, 5), 1, False), ((9,), 0, False)])
def test_max_min_along_a_dim_vs_torch(queue, rng, op, shape, dim, keepdim):
    x = rng.standard_normal(shape)
    check(queue, rng, lambda t: getattr(t, op)(dim, keepdim).values, lambda t: getattr(t, op)(dim, keepdim).values,
          [x])
    got = getattr(netcl.tensor(x.astype(np.float32), queue=queue), op)(dim, keepdim)
    ref = getattr(torch.tensor(x), op)(dim, keepdim)
    np.testing.assert_array_equal(got.indices.numpy(), ref.indices.numpy())
    assert got.indices.dtype == np.int32
    arg = getattr(netcl.tensor(x.astype(np.float32), queue=queue), "arg" + op)(dim, keepdim)
    np.testing.assert_array_equal(arg.numpy(), getattr(torch.tensor(x), "arg" + op)(dim, keepdim).numpy())


def test_argmax_of_everything_and_ties(queue):
    x = np.array([[0.0, 5.0, 5.0], [5.0, 1.0, 2.0]], np.float32)
    t = netcl.tensor(x, queue=queue)
    assert t.argmax().item() == 1  # the first maximum of the flattened tensor, as torch
    np.testing.assert_array_equal(t.argmax(1).numpy(), [1, 0])
    with pytest.raises(ValueError, match="empty"):
        netcl.tensor(np.zeros((0, 3), np.float32), queue=queue).max()


MATMUL = [((4, 5), (5, 3)), ((5,), (5, 3)), ((4, 5), (5,)), ((6,), (6,)), ((2, 4, 5), (5, 3)), ((2, 4, 5), (2, 5, 3)),
          ((2, 1, 4, 5), (3, 5, 6)), ((4, 5), (3, 5, 2)), ((1, 17), (17, 1)), ((33, 70), (70, 9))]


@pytest.mark.parametrize("sa,sb", MATMUL)
def test_matmul_vs_torch(queue, rng, sa, sb):
    a, b = rng.standard_normal(sa), rng.standard_normal(sb)
    check(queue, rng, lambda x, y: x @ y, lambda x, y: x @ y, [a, b], rtol=2e-5)


def test_matmul_shape_error(queue):
    with pytest.raises(ValueError, match="do not match"):
        _t(np.zeros((2, 3)), queue) @ _t(np.zeros((4, 2)), queue)


SHAPE_OPS = [
    ("reshape", (3, 4, 5), lambda t: t.reshape(12, 5)), ("view", (3, 4, 5), lambda t: t.view(-1)),
    ("flatten", (3, 4, 5), lambda t: t.flatten(1)), ("squeeze", (3, 1, 5), lambda t: t.squeeze(1)),
    ("unsqueeze", (3, 5), lambda t: t.unsqueeze(-1)), ("transpose", (3, 4, 5), lambda t: t.transpose(0, 2)),
    ("transpose_inner", (3, 4, 5), lambda t: t.transpose(1, 2)), ("permute", (2, 3, 4, 5), lambda t: t.permute(2, 0, 3, 1)),
    ("T", (6, 7), lambda t: t.T), ("expand", (3, 1), lambda t: t.expand(3, 4)),
    ("slice", (6, 7), lambda t: t[:, 1:5]), ("step", (10, 7), lambda t: t[1:9:3, ::2]),
    ("int_index", (4, 5, 6), lambda t: t[..., 0]), ("int_index2", (4, 5, 6), lambda t: t[2]),
    ("none", (4, 5), lambda t: t[None, :, 1]), ("negative", (4, 5), lambda t: t[-1, -3:]),
    ("chain", (4, 6), lambda t: (t.transpose(0, 1)[1:4] * 2).sum(0)),
]


@pytest.mark.parametrize("name,shape,fn", SHAPE_OPS, ids=[s[0] for s in SHAPE_OPS])
def test_shapes_and_indexing_vs_torch(queue, rng, name, shape, fn):
    check(queue, rng, fn, fn, [rng.standard_normal(shape)])


def test_cat_and_stack_vs_torch(queue, rng):
    a, b, c = rng.standard_normal((2, 3)), rng.standard_normal((2, 5)), rng.standard_normal((2, 1))
    check(queue, rng, lambda x, y, z: netcl.cat([x, y, z], 1), lambda x, y, z: torch.cat([x, y, z], 1), [a, b, c])
    check(queue, rng, lambda x, y: netcl.cat([x, y], 0), lambda x, y: torch.cat([x, y], 0), [a, a * 2])
    check(queue, rng, lambda x, y: netcl.stack([x, y], 1), lambda x, y: torch.stack([x, y], 1), [a, a + 1])
    check(queue, rng, lambda x, y: netcl.cat([x, y], 1), lambda x, y: torch.cat([x, y], 1), [a, b], grads=[True, False])
    with pytest.raises(ValueError, match="must agree"):
        netcl.cat([_t(a, queue), _t(np.zeros((3, 3)), queue)], 1)


def test_comparisons_give_zeros_and_ones(queue):
    a = netcl.tensor(np.array([1.0, 2.0, 3.0], np.float32), queue=queue)
    np.testing.assert_array_equal((a == 2).numpy(), [0, 1, 0])
    np.testing.assert_array_equal((a > 1.5).numpy(), [0, 1, 1])
    np.testing.assert_array_equal((a <= np.array([0, 2, 5])).numpy(), [0, 1, 1])
    labels = netcl.tensor(np.array([0, 2, 1]), queue=queue)
    logits = netcl.tensor(np.eye(3, dtype=np.float32)[[0, 1, 1]], queue=queue)
    assert (logits.argmax(1) == labels).sum().item() == 2.0  # accuracy as PyTorch code writes it
    assert bool(a[1] == 2) and not bool(a[0] == 2)
    with pytest.raises(ValueError, match="ambiguous"):
        bool(a == 2)


def test_numpy_operands_and_reflected_operators(queue):
    a = netcl.tensor(np.array([[1.0, 2.0]], np.float32), queue=queue)
    np.testing.assert_array_equal((np.array([10.0, 20.0]) + a).numpy(), [[11, 22]])
    np.testing.assert_array_equal((np.float32(2) * a).numpy(), [[2, 4]])
    np.testing.assert_array_equal(np.asarray(a), [[1, 2]])


def test_broadcast_error_names_the_shapes(queue):
    with pytest.raises(ValueError, match=r"\(3, 4\) and \(3,\) do not broadcast"):
        _t(np.zeros((3, 4)), queue) + _t(np.zeros(3), queue)


# -- the tape ---------------------------------------------------------------------------------------
def test_fan_out_adds_the_gradients(queue):
    x = _t([1.0, 2.0, 3.0], queue)
    y = x * x + x * 3 + x
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * np.array([1, 2, 3]) + 4)


def test_leaf_gradients_accumulate_across_backward_calls(queue):
    x = _t([1.0, -2.0], queue)
    (x * 2).sum().backward()
    (x * 3).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [5, 5])


def test_second_backward_needs_retain_graph(queue):
    x = _t([1.0, 2.0], queue)
    y = (x.exp() * x).sum()
    y.backward(retain_graph=True)
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * (np.exp([1, 2]) * np.array([2, 3])), rtol=1e-5)
    with pytest.raises(RuntimeError, match="a second time.*retain_graph=True"):
        y.backward()


def test_no_grad_records_nothing_and_detach_cuts(queue):
    x = _t([1.0, 2.0], queue)
    with netcl.no_grad():
        y = x * 2
    assert not y.requires_grad and y.grad_fn is None
    z = (x * 2).detach() * x
    z.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [2, 4])

    @netcl.no_grad()
    def f(t):
        return t + 1
    assert not f(x).requires_grad
    assert netcl.is_grad_enabled()


def test_backward_of_what_needs_no_grad_is_an_error(queue):
    x = _t([1.0], queue, grad=False)
    with pytest.raises(RuntimeError, match="does not require grad"):
        (x * 2).sum().backward()
    with pytest.raises(RuntimeError, match="one element"):
        (_t([1.0, 2.0], queue) * 2).backward()


def test_in_place_change_of_a_saved_tensor_is_caught(queue):
    x = _t([1.0, 2.0], queue)
    a = x * 1.0
    with netcl.no_grad():
        b = a.detach()
    y = (a * a).sum()
    with netcl.no_grad():
        b += 1  # b shares a's storage: the values a*a saved are gone
    with pytest.raises(RuntimeError, match="changed in place"):
        y.backward()


def test_in_place_on_a_tensor_that_requires_grad_is_refused(queue):
    x = _t([1.0, 2.0], queue)
    with pytest.raises(RuntimeError, match="in-place"):
        x += 1
    with netcl.no_grad():
        x -= 0.5  # a parameter update
    np.testing.assert_allclose(x.numpy(), [0.5, 1.5])


def test_tensors_of_two_devices_are_refused(queue):
    try:  # PoCL's serial device: another device, another context
        other = netcl.default_queue("basic")
    except (netcl.NoDeviceError, ValueError):
        pytest.skip("no second device")
    if other.context == queue.context:
        pytest.skip("no second device")
    with pytest.raises(ValueError, match="two devices"):
        _t([1.0], queue) + _t([1.0], other)


def test_integer_tensors(queue):
    i = netcl.tensor(np.array([[1, 2], [3, 4]]), queue=queue)
    assert i.dtype == np.int32 and i.numpy().dtype == np.int32 and not i.requires_grad
    assert i.sum().item() == 10.0  # arithmetic in float32
    assert i[1, 0].item() == 3 and isinstance(i[1, 0].item(), int)
    np.testing.assert_array_equal(i.float().numpy(), [[1, 2], [3, 4]])
    np.testing.assert_array_equal(netcl.tensor(np.array([1.7, -1.7]), queue=queue).int().numpy(), [1, -1])
    with pytest.raises(TypeError, match="float32"):
        i.requires_grad_()
    with pytest.raises(TypeError):
        netcl.tensor(np.array([1 + 2j]))


def test_making_tensors(queue):
    netcl.manual_seed(3)
    a = netcl.randn(2, 3, queue=queue).numpy()
    netcl.manual_seed(3)
    np.testing.assert_array_equal(a, netcl.randn((2, 3), queue=queue).numpy())
    np.testing.assert_array_equal(netcl.zeros(2, 2).numpy(), np.zeros((2, 2)))
    np.testing.assert_array_equal(netcl.ones(3, queue=queue).numpy(), np.ones(3))
    ar = netcl.arange(5)
    assert ar.dtype == np.int32 and ar.tolist() == [0, 1, 2, 3, 4]
    np.testing.assert_allclose(netcl.arange(0, 1, 0.25).numpy(), [0, 0.25, 0.5, 0.75])
    t = netcl.tensor([[1.0, 2.0]])  # on the host until used
    assert t.queue is None and (t + 1).queue is not None


def test_reading_values(queue):
    x = netcl.tensor(np.array([[2.5]], np.float32), queue=queue)
    assert x.item() == 2.5 and float(x) == 2.5 and f"{x:.2f}" == "2.50"
    assert x.size == 1 and x.size() == (1, 1) and x.size(-1) == 1 and x.numel() == 1 and x.dim() == 2
    assert len(netcl.zeros(3, 2)) == 3
    assert "2.5" in repr(x)
    with pytest.raises(ValueError, match="one element"):
        netcl.zeros(2).item()


def test_the_graph_holds_no_reference_cycles(queue, rng):
    """Buffers go back to the pool when the last tensor goes: a cycle (a node that saved its own
    output, a loss and its pending value) would hold them until the garbage collector runs."""
    import gc

    from netcl import nn
    from netcl.autograd import Node

    model = nn.Sequential(nn.Linear(4, 8), nn.Sigmoid()).to(queue)
    x = netcl.tensor(rng.standard_normal((3, 4)).astype(np.float32), queue=queue)
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for loss_fn in (nn.MSELoss(), nn.BCELoss()):
            y = model(x)
            h = (y.exp().sqrt() + y.sigmoid() + y.tanh()).softmax(1).log_softmax(1).amax(1)
            loss = loss_fn(y, np.full((3, 8), 0.5, np.float32)) + h.sum() * 0.1
            loss.backward()
            float(loss)
        del y, h, loss
        gc.collect()
        cycles = sorted({type(o).__name__ for o in gc.garbage if isinstance(o, (Tensor, Node))})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert not cycles, f"objects in reference cycles: {cycles}"
