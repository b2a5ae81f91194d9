"""The reference architectures of netcl.models: they build to the documented shapes, train
(backward reaches every parameter), save, export and come back; slow-marked, they learn their
real tasks (the digits; the digits' foreground masks) to the figures docs/training.md quotes."""
import numpy as np
import pytest
from conftest import assert_close

import netcl
from netcl import Tensor, models
from netcl.apps import recipes
from netcl.io import export_onnx, import_onnx, load, save

ARCHITECTURES = {"resnet8": (10,), "mobilenetv2_tiny": (10,), "unet_tiny": (1, 64, 64), "vit_tiny": (10,)}


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_architecture_trains_saves_exports(name, queue, rng, tmp_path):
    netcl.manual_seed(0)
    model = models.build(name)
    x = rng.uniform(0, 1, (2,) + models.MODELS[name].input_shape).astype(np.float32)
    y = model.train()(Tensor.from_host(queue, x))
    assert y.shape == (2,) + ARCHITECTURES[name]
    model.backward(Tensor.from_host(queue, np.ones(y.shape, np.float32)))
    assert all(p.grad is not None for p in model.parameters())
    model.eval()
    ref = model(Tensor.from_host(queue, x)).to_host()
    save(model, tmp_path / "m.netcl")
    assert np.array_equal(load(tmp_path / "m.netcl").eval()(Tensor.from_host(queue, x)).to_host(), ref)
    export_onnx(model, x.shape, tmp_path / "m.onnx", dynamic_batch=True)
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    for batch in (1, 2):
        got = sess.run(None, {"input": x[:batch]})[0]
        assert np.abs(got - ref[:batch]).max() <= 1e-5 * max(1.0, np.abs(ref).max())
    back = import_onnx(tmp_path / "m.onnx")
    assert repr(back) == repr(model)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet8", "vit_tiny"])
def test_reference_classifier_reaches_97_percent_on_the_digits(name, queue, record_note):
    _, _, hist = recipes.train_reference(name, queue, progress=False)
    record_note(f"{name}: digits test accuracy {hist['test_acc'][-1]:.4f} after {len(hist['epoch'])} epochs")
    assert hist["test_acc"][-1] >= 0.97


@pytest.mark.slow
def test_unet_segments_the_noisy_digits(queue, record_note):
    data = recipes.digits_masks(64)
    baseline = recipes.iou(data[2].mean(1, keepdims=True) - 0.5, data[3])  # a threshold of the noisy input
    netcl.manual_seed(0)
    _, hist = recipes.train_segmentation(models.build("unet_tiny"), queue, data, progress=False)
    record_note(f"unet_tiny: test IoU {hist['test_iou'][-1]:.4f} (threshold baseline {baseline:.4f})")
    assert hist["test_iou"][-1] >= baseline + 0.1


@pytest.mark.parametrize("name", sorted(models.MODELS))
def test_pytorch_twin_computes_the_model(name, queue, rng):
    """The benchmarks' PyTorch peer (netcl.apps.bench.torch_layer: the same layers and weights in
    torch.nn, Linear weights transposed to (out, in), MultiheadAttention's copied as they are) gives
    the model's output in eval and in train mode (batch statistics) within float32 noise, so the
    training and inference tables time the same model on both sides."""
    torch = pytest.importorskip("torch")
    from netcl.apps.bench import torch_layer

    model = models.build(name).to(queue)
    twin = torch_layer(torch, model)
    assert twin is not None, f"{name}: a layer has no PyTorch twin"
    twin = twin.double()
    x = rng.standard_normal((1 if name == "detector26" else 3,) + models.MODELS[name].input_shape).astype(np.float32)
    for mode in ("eval", "train"):
        getattr(model, mode)()
        getattr(twin, mode)()
        got = model(Tensor.from_host(queue, x)).to_host()
        with torch.no_grad():
            ref = twin(torch.tensor(x, dtype=torch.float64)).numpy()
        assert_close(got, ref, 1e-5, 1e-6, what=f"{name} {mode}")
