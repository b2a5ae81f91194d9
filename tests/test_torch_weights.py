"""PyTorch weights load in PyTorch's layouts: a torch Linear's (out, in) weight is transposed into
netcl's (in, out) because it is a torch tensor, never because of its shape, so a square layer
cannot load transposed; numpy arrays are taken in netcl's layout as before."""
import numpy as np
import pytest

from netcl import Tensor, nn

torch = pytest.importorskip("torch")


def _pair(features=128):
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(features, features), torch.nn.ReLU(), torch.nn.Linear(features, 10))
    model = nn.Sequential(nn.Linear(features, features), nn.ReLU(), nn.Linear(features, 10))
    return ref, model


def test_square_linear_from_torch_state_dict_matches_torch(queue, rng):
    ref, model = _pair()
    model.load_state_dict(ref.state_dict())
    x = rng.normal(size=(5, 128)).astype(np.float32)
    want = ref(torch.from_numpy(x)).detach().numpy()
    got = model.eval()(Tensor.from_host(queue, x)).to_host()
    assert np.abs(got - want).max() < 1e-5
    assert np.array_equal(model[0].weight.to_host(), ref[0].weight.detach().numpy().T)


def test_numpy_arrays_stay_in_netcl_layout():
    model = nn.Sequential(nn.Linear(6, 6))
    state = {"0.weight": np.arange(36, dtype=np.float32).reshape(6, 6), "0.bias": np.zeros(6, np.float32)}
    model.load_state_dict(state)  # an array is netcl's (in, out), whatever its shape
    assert np.array_equal(model[0].weight.to_host(), state["0.weight"])
    torch_state = {k: torch.from_numpy(v) for k, v in state.items()}
    model.load_state_dict(torch_state)  # the same values as a torch tensor: (out, in)
    assert np.array_equal(model[0].weight.to_host(), state["0.weight"].T)


def test_torch_weight_of_the_wrong_shape_is_refused_naming_the_key():
    ref = torch.nn.Sequential(torch.nn.Linear(4, 3))
    model = nn.Sequential(nn.Linear(3, 4))  # netcl (3, 4) == torch's (out=3, in=4)? no: torch wants (4, 3)
    with pytest.raises(ValueError, match=r"state_dict\['0.weight'\].*PyTorch weight has shape \(4, 3\)"):
        model.load_state_dict(ref.state_dict())


def test_torch_batchnorm_and_conv_load_as_they_are(queue, rng):
    torch.manual_seed(1)
    ref = torch.nn.Sequential(torch.nn.Conv2d(2, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU()).eval()
    with torch.no_grad():
        ref[1].running_mean.uniform_(-1, 1)
        ref[1].running_var.uniform_(0.5, 2)
    model = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU())
    model.load_state_dict(ref.state_dict()).eval()  # num_batches_tracked is ignored
    x = rng.normal(size=(2, 2, 6, 6)).astype(np.float32)
    got = model(Tensor.from_host(queue, x)).to_host()
    assert np.abs(got - ref(torch.from_numpy(x)).detach().numpy()).max() < 1e-5
