"""Tensor: host/device coherence, views, and argument errors."""
import numpy as np
import pytest

from netcl import Tensor, nn, optim


def test_views_share_storage_both_ways(queue):
    t = Tensor.from_host(queue, np.arange(4, dtype=np.float32))
    t.numpy()  # cache a host copy
    v = t.reshape(2, 2)
    v.set_(np.zeros((2, 2)))
    assert t.to_host().tolist() == [0, 0, 0, 0]
    t.set_(np.ones(4))
    assert v.to_host().tolist() == [[1, 1], [1, 1]]
    assert v.version == t.version


def test_view_sees_an_optimizer_step(queue):
    lin = nn.Linear(3, 2)
    view = lin.weight.reshape(-1)
    before = view.to_host()
    y = lin(Tensor.from_host(queue, np.ones((4, 3))))
    lin.backward(y)
    optim.SGD(lin.parameters(), lr=0.5).step()
    assert not np.array_equal(view.to_host(), before)
    assert np.array_equal(view.to_host(), lin.weight.to_host().reshape(-1))


@pytest.mark.parametrize("shape", [(4, 4), (-1, 4), (2, -1, -1), (0, -1), (-2, 15)])
def test_reshape_rejects_impossible_shapes(shape):
    t = Tensor.from_host(None, np.zeros((3, 5)))
    with pytest.raises(ValueError, match="cannot reshape"):
        t.reshape(*shape)


def test_reshape_infers_one_dimension():
    assert Tensor.from_host(None, np.zeros((3, 5))).reshape(-1, 3).shape == (5, 3)


def test_scalar_keeps_its_shape(queue):
    t = Tensor.from_host(queue, 3.0)
    assert t.shape == () and t.to_host() == np.float32(3.0)


def test_to_needs_a_queue():
    from netcl.errors import NoDeviceError

    with pytest.raises(TypeError, match="CommandQueue"):
        Tensor.from_host(object(), np.zeros(3))
    with pytest.raises(NoDeviceError, match="no such device"):
        Tensor.from_host("no such device", np.zeros(3))


def test_to_takes_a_device_name_as_module_to_does(queue):
    t = Tensor.from_host(None, np.arange(3, dtype=np.float32))
    assert t.to("cpu") is t and t.on_device and t.numpy().tolist() == [0, 1, 2]
    with pytest.raises(TypeError, match="a device name"):
        t.to(3)


def test_size_pickles_as_it_is_called():
    import pickle

    size = pickle.loads(pickle.dumps(Tensor.from_host(None, np.zeros((2, 3), np.float32)).size))
    assert size == 6 and size() == (2, 3) and size(1) == 3


def test_host_data_must_fit_the_shape():
    with pytest.raises(ValueError, match="host data has 5 elements"):
        Tensor((7,), None, None, np.zeros(5, np.float32))
