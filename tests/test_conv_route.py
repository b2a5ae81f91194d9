"""conv_route (netcl.nn.conv_route): one device-free decision of a Conv2d's forward, weight-gradient
and data-gradient kernels. Printed and checked for every convolution of every reference model at
batch 32 on both CPU classes and a GPU, without a device; the generic tier's routes use no program
built for one layer's sizes."""
import pytest

from netcl import models, nn
from netcl.apps import recipes
from netcl.nn.conv_route import ConvRoute, ConvSpec, DeviceClass, conv_route

CLASSES = {"cpu16": DeviceClass("cpu16", 16, 1 << 20, 2), "cpu": DeviceClass("cpu", 8, 1 << 20, 2),
           "gpu": DeviceClass("gpu", 4, 48 << 10, 132)}
REFERENCE = dict(models.MODELS, digits=recipes.digits_cnn)
SHAPES = dict({name: fn.input_shape for name, fn in models.MODELS.items()}, digits=(1, 8, 8))


def convs_of(model, shape):
    """(path, ConvSpec) of every Conv2d `model` applies to an input of `shape`, in order: the shapes
    as the layers' own output_shape walk passes them on."""
    names = {}

    def walk(module, prefix):
        for name, child in module.named_children():
            path = f"{prefix}.{name}" if prefix else name
            names[id(child)] = path
            walk(child, path)
    walk(model, "")
    found, real = [], nn.Conv2d.output_shape

    def spy(self, s):
        found.append((names[id(self)], self.spec(tuple(s))))
        return real(self, s)
    nn.Conv2d.output_shape = spy
    try:
        model.output_shape(shape)
    finally:
        nn.Conv2d.output_shape = real
    return found


# (model, conv path) -> the route on an AVX-512 class CPU (cpu16), forward / weight gradient / data
# gradient (the launches of each model's training step were those of the predicates this replaced)
EXPECTED_CPU16 = {
    ("cnn", "0"): "rows / rows / rows",  # 3 channels: too few for Winograd
    ("cnn", "4"): "phases / gemm_unpad / corrt2",  # 3x3 stride 2 on rows of 8: im2col for dW
    ("resnet8", "3.body.0"): "winot / winot / winot",
    ("resnet8", "5.body.0"): "phases / wgrad2 / corrt2p",
    ("resnet8", "5.shortcut.0"): "pointwise2 / pointwise2 / pointwise2",
    ("resnet8", "7.body.3"): "winot / winot / winot",
    ("mobilenetv2_tiny", "3.body.0"): "depthwise / depthwise / depthwise",
    ("mobilenetv2_tiny", "4.3"): "depthwise / depthwise / depthwise_s2",
    ("mobilenetv2_tiny", "4.0"): "gemm / gemm_cols / gemm_1x1",
    ("detector26", "0"): "rows / rows / rows",
    ("detector26", "4"): "winot / winot / winot",
    ("detector26", "20"): "gemm / gemm_cols / col2im",  # 2304 weights an output channel: past corrc_max_r
    ("detector26", "24"): "gemm / gemm_cols / gemm_1x1",
    ("unet_tiny", "3.1"): "winot / winot / winot",
    ("digits", "0"): "channels / narrow / channels",
    ("digits", "4"): "channels / oc16 / channels",
    ("vit_tiny", "0"): "channels / narrow / channels",
}


def all_routes(cls, generic=False):
    out = {}
    for name, build in REFERENCE.items():
        for path, spec in convs_of(build(), (32,) + tuple(SHAPES[name])):
            out[(name, path)] = (spec, conv_route(spec, CLASSES[cls], generic))
    return out


@pytest.mark.parametrize("cls", list(CLASSES))
def test_the_routes_of_every_reference_model(cls, capsys):
    routes = all_routes(cls)
    with capsys.disabled():
        print(f"\nconv routes at batch 32, device class {cls} (forward / weight gradient / data gradient):")
        for (name, path), (spec, route) in routes.items():
            print(f"  {name:17s} {path:14s} {spec.c:3d}->{spec.k:<3d} k{spec.ks} s{spec.stride} "
                  f"{spec.h}x{spec.w}: {route}")
    assert len({name for name, _ in routes}) == len(REFERENCE) - ("mlp" in REFERENCE)  # every model with a conv
    for (name, path), (spec, route) in routes.items():
        assert isinstance(route, ConvRoute)
        if cls == "gpu":
            assert str(route) in ("gemm / gemm / gemm", "depthwise_any / depthwise_any / depthwise_any"), (name, path)
        if route.planes is not None:  # the planes hold the input at (top, left)
            top, left, hp, wp = route.planes
            assert top + spec.h <= hp and left + spec.w <= wp
        if route.takes_dy_planes:
            assert route.dy_planes is not None and route.dgrad in ("winot", "rows", "channels")
        if route.forward == "winot":
            assert route.winot is not None and spec.geometry == (3, 1, 1, 1) and min(spec.c, spec.k) >= 8
    if cls == "cpu16":
        got = {key: str(routes[key][1]) for key in EXPECTED_CPU16}
        assert got == EXPECTED_CPU16
    if cls == "cpu":  # AVX2's blocks: the 3x3 stride-2 weight gradient with output channels in the lanes
        assert str(routes[("resnet8", "5.body.0")][1]) == "phases / wgrad2o / corrt2p"
        assert routes[("digits", "4")][1].wgrad == "gemm_planes"  # wgrad_oc16_cpu is AVX-512's


def test_the_generic_tier_takes_no_kernel_built_for_one_layer():
    """The generic tier: no Winograd, no wgrad_narrow_cpu or wgrad_oc16_cpu, no pooled weight
    gradient; the full route lists its specialised programs (ConvRoute.kernels), the generic none;
    both read their input from the same planes where both are direct."""
    full, generic = all_routes("cpu16"), all_routes("cpu16", generic=True)
    for key, (spec, route) in generic.items():
        assert route.forward != "winot" and route.wgrad not in ("winot", "narrow", "oc16"), key
        assert route.dgrad != "winot" and route.pool_wgrad is None and route.kernels == (), key
        best = full[key][1]
        if best.forward in ("winot", "rows", "channels"):
            assert route.planes == best.planes, key
        if best.wgrad in ("winot", "narrow", "oc16") or best.forward == "winot":
            assert best.kernels, key
            assert {f for f, _, _ in best.kernels} <= {"conv_winot", "convtrain_cpu"}


def test_winot_follows_the_environment_choice():
    spec = ConvSpec(8, 16, 32, 32, 16, 3, 1, 1)
    on = DeviceClass("cpu", 8, 1 << 20, 2, winot=True)
    off = DeviceClass("cpu16", 16, 1 << 20, 2, winot=False)
    assert conv_route(spec, on).forward == "winot" and conv_route(spec, off).forward == "rows"
    assert conv_route(spec, DeviceClass("cpu", 4, 1 << 20, 2)).forward == "rows"  # 4 lanes: not unforced
