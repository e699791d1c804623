"""Every op in PyTorch's OpInfo database that supports autograd: the backward
of its first sample input, compiled by Dynamo with every size symbolic
(`compiled_autograd_symbolic_sizes`, aot_eager), gives eager's gradients,
and Dynamo compiles its captured graph; once in float64 (float32 where the op
has no float64 backward), and once more in complex128 for the ops that
differentiate it.

Symbolic sizes are the strictest setting for a backward formula: each runs
under FakeTensors whose sizes are symbols, as after any recompile for a
changed size. This sweep found the backward ops of patches/0010 and the
sparse inputs Dynamo cannot take (test_fallbacks_and_errors.py); its complex
run found the first-call pseudo-inverse of patches/0020."""

import warnings

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db

from helpers import (
    compiled_autograd,
    dynamo_compiler,
    graphs_run_without_dynamo,
    tensors_in,
    weighted_sum,
)

OPS = [op for op in op_db if op.supports_autograd]
COMPLEX_OPS = [op for op in OPS if torch.complex128 in op.supported_backward_dtypes("cpu")]


def op_ids(ops):
    return [f"{op.name}.{op.variant_test_name}".rstrip(".") for op in ops]


def gradients(op, sample):
    """Gradients of the weighted sums of the op's differentiable outputs with
    respect to the sample's tensors that require grad; None when there is
    nothing to differentiate."""
    inputs = [t for t in tensors_in([sample.input, sample.args, sample.kwargs]) if t.requires_grad]
    outputs = [
        o
        for o in tensors_in(op(sample.input, *sample.args, **sample.kwargs))
        if o.requires_grad and (o.is_floating_point() or o.is_complex())
    ]
    if not inputs or not outputs:
        return None
    loss = sum(weighted_sum(o) for o in outputs)
    return torch.autograd.grad(loss, inputs, allow_unused=True)


def check_backward_with_symbolic_sizes(op, dtype):
    sample = next(iter(op.sample_inputs("cpu", dtype, requires_grad=True)), None)
    if sample is None:
        pytest.skip("no sample input")
    torch.manual_seed(0)
    try:
        expected = gradients(op, sample)
    except Exception as error:  # the sample is not differentiable in eager either
        pytest.skip(f"eager raised {type(error).__name__}")
    if expected is None:
        pytest.skip("nothing to differentiate")

    torch._dynamo.config.compiled_autograd_symbolic_sizes = True
    torch.manual_seed(0)
    with compiled_autograd(dynamo_compiler("aot_eager")), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        actual = gradients(op, sample)
    # A graph Dynamo gives up on runs uncompiled, with eager's values.
    assert graphs_run_without_dynamo() == 0, "Dynamo gave up on the captured graph"

    tolerance = {"rtol": 1e-5, "atol": 1e-6} if dtype in (torch.float64, torch.complex128) else {}
    for e, a in zip(expected, actual):
        assert (e is None) == (a is None)
        if e is not None:
            torch.testing.assert_close(a, e, equal_nan=True, **tolerance)


@pytest.mark.parametrize("op", OPS, ids=op_ids(OPS))
def test_op_backward_with_symbolic_sizes_matches_eager(op):
    dtype = torch.float64 if torch.float64 in op.supported_backward_dtypes("cpu") else torch.float32
    check_backward_with_symbolic_sizes(op, dtype)


@pytest.mark.parametrize("op", COMPLEX_OPS, ids=op_ids(COMPLEX_OPS))
def test_complex_op_backward_with_symbolic_sizes_matches_eager(op):
    check_backward_with_symbolic_sizes(op, torch.complex128)
