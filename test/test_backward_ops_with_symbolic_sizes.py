"""Backward ops that had only C++ meta kernels, which reject symbolic sizes
(patches/0010): compiled autograd runs their formulas under FakeTensors, so
with symbolic sizes -- `compiled_autograd_symbolic_sizes`, or Dynamo's
recompile after a size changed -- their backward raised inside Dynamo.

Found by running every OpInfo op with autograd support through the engine
with symbolic sizes; these were the ops that failed."""

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import (
    DimDynamic,
    ShapeEnv,
    StatelessSymbolicContext,
)

from helpers import assert_same, dynamo_compiler, run_eager_and_compiled, weighted_sum

aten = torch.ops.aten


def interpolate(mode, **kwargs):
    return lambda x: F.interpolate(x, scale_factor=2, mode=mode, **kwargs)


# (name, forward, input shape, memory format of the input)
FORWARDS = [
    ("nearest1d", interpolate("nearest"), (2, 3, 5), None),
    ("nearest_exact1d", interpolate("nearest-exact"), (2, 3, 5), None),
    ("linear1d", interpolate("linear"), (2, 3, 5), None),
    ("bilinear2d", interpolate("bilinear"), (2, 3, 5, 4), None),
    ("bilinear2d_channels_last", interpolate("bilinear"), (2, 3, 5, 4), torch.channels_last),
    ("bicubic2d", interpolate("bicubic", align_corners=True), (2, 3, 5, 4), None),
    ("bicubic2d_antialias", interpolate("bicubic", antialias=True), (2, 3, 5, 4), None),
    ("nearest3d", interpolate("nearest"), (2, 3, 3, 4, 5), None),
    ("nearest_exact3d", interpolate("nearest-exact"), (2, 3, 3, 4, 5), None),
    ("trilinear3d", interpolate("trilinear"), (2, 3, 3, 4, 5), None),
    (
        "trilinear3d_channels_last",
        interpolate("trilinear"),
        (2, 3, 3, 4, 5),
        torch.channels_last_3d,
    ),
    ("softshrink", lambda x: F.softshrink(x, 0.3), (4, 6), None),
    ("hardshrink", lambda x: F.hardshrink(x, 0.3), (4, 6), None),
]


def input_gradient(forward, shape, memory_format):
    x = torch.randn(shape, dtype=torch.float64)
    if memory_format is not None:
        x = x.contiguous(memory_format=memory_format)
    x.requires_grad_()
    out = forward(x)
    weighted_sum(out).backward()
    return [x.grad]


def grown(shape):
    return tuple(size + 1 for size in shape)


def assert_input_gradient_matches_eager(forward, sizes, memory_format):
    expected, actual = run_eager_and_compiled(
        lambda: input_gradient(forward, sizes, memory_format), dynamo_compiler("aot_eager")
    )
    assert_same(expected, actual)
    assert actual[0].stride() == expected[0].stride()


@pytest.mark.parametrize("name, forward, shape, memory_format", FORWARDS, ids=[f[0] for f in FORWARDS])
@pytest.mark.parametrize("engine", ["python", "legacy"])
def test_backward_with_sizes_symbolic_from_the_first_compile_matches_eager(
    engine, name, forward, shape, memory_format
):
    torch._dynamo.config.compiled_autograd_engine = engine
    torch._dynamo.config.compiled_autograd_symbolic_sizes = True
    for sizes in (shape, grown(shape)):
        assert_input_gradient_matches_eager(forward, sizes, memory_format)


@pytest.mark.parametrize("name, forward, shape, memory_format", FORWARDS, ids=[f[0] for f in FORWARDS])
def test_backward_recompiled_after_a_size_change_matches_eager(
    name, forward, shape, memory_format
):
    for sizes in (shape, grown(shape), grown(grown(shape))):
        assert_input_gradient_matches_eager(forward, sizes, memory_format)


def symbolic_fake(mode, tensor):
    context = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] * tensor.dim())
    return mode.from_tensor(tensor, symbolic_context=context)


# (op, the op's arguments after grad_output, output_size and input_size)
UPSAMPLE_BACKWARDS = [
    (aten.upsample_nearest1d_backward.default, ()),
    (aten._upsample_nearest_exact1d_backward.default, ()),
    (aten.upsample_linear1d_backward.default, (False,)),
    (aten.upsample_bilinear2d_backward.default, (False,)),
    (aten.upsample_bicubic2d_backward.default, (False,)),
    (aten._upsample_bicubic2d_aa_backward.default, (False,)),
    (aten.upsample_nearest3d_backward.default, ()),
    (aten._upsample_nearest_exact3d_backward.default, ()),
    (aten.upsample_trilinear3d_backward.default, (False,)),
]
MEMORY_FORMATS = {3: [None], 4: [None, torch.channels_last], 5: [None, torch.channels_last_3d]}


@pytest.mark.parametrize("op, extra_args", UPSAMPLE_BACKWARDS, ids=[str(o[0]) for o in UPSAMPLE_BACKWARDS])
def test_upsample_backward_meta_with_symbolic_sizes_lays_out_its_output_as_the_kernel_does(
    op, extra_args
):
    spatial_dims = next(n for n in (1, 2, 3) if f"{n}d" in op._opname)
    input_size = [2, 3, 4, 5, 6][: spatial_dims + 2]
    output_size = [2 * size for size in input_size[2:]]
    for memory_format in MEMORY_FORMATS[spatial_dims + 2]:
        grad_output = torch.randn(input_size[:2] + output_size)
        if memory_format is not None:
            grad_output = grad_output.contiguous(memory_format=memory_format)
        real = op(grad_output, output_size, input_size, *extra_args)

        with FakeTensorMode(shape_env=ShapeEnv()) as mode:
            fake_grad = symbolic_fake(mode, grad_output)
            symbolic_output_size = list(fake_grad.shape[2:])
            symbolic_input_size = list(fake_grad.shape[:2]) + [
                size // 2 for size in symbolic_output_size
            ]
            fake = op(fake_grad, symbolic_output_size, symbolic_input_size, *extra_args)
            assert all(isinstance(size, torch.SymInt) for size in fake.shape)
            assert [int(size) for size in fake.shape] == list(real.shape)
            assert [int(stride) for stride in fake.stride()] == list(real.stride()), memory_format
