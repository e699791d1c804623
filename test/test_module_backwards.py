"""Every module in PyTorch's ModuleInfo database, on its first three sample
inputs (training mode, float64 where the module supports it): the backward,
captured and compiled by Dynamo with aot_eager, gives eager's gradients for
the parameters and the inputs, with no backward on the eager engine and no
compiled-autograd warning (such as for a graph Dynamo gives up on).

Where test_opinfo_backwards.py checks each op's formula, this checks what
modules put together around them: parameters, buffers updated in training
(batch norm's running stats), RNN cells and whole RNNs, losses with their
reductions, attention."""

import warnings

import pytest
import torch
from torch.testing._internal.common_modules import module_db

from helpers import captures, compiled_autograd, dynamo_compiler, eager_fallbacks, tensors_in

SAMPLES_PER_MODULE = 3


def dtype_of(module_info):
    # FractionalMaxPool's samples draw their random samples in float64.
    return torch.float64 if torch.float64 in module_info.dtypes else torch.float32


def sample_inputs(module_info):
    """The module's sample inputs, the same values on every call."""
    torch.manual_seed(1)
    return module_info.module_inputs_func(
        module_info, device="cpu", dtype=dtype_of(module_info), requires_grad=True, training=True
    )


def gradients(module_info, index):
    """Gradients of a weighted sum of the outputs of a module built and called
    from sample ``index``, for its parameters and its inputs that require
    grad; None when no output is differentiable."""
    sample = sample_inputs(module_info)[index]
    torch.manual_seed(0)
    module = module_info.module_cls(*sample.constructor_input.args, **sample.constructor_input.kwargs)
    module.to(dtype_of(module_info))
    module.train()
    forward = sample.forward_input
    inputs = [t for t in tensors_in([forward.args, forward.kwargs]) if t.requires_grad]
    outputs = [
        o
        for o in tensors_in(module(*forward.args, **forward.kwargs))
        if o.requires_grad and o.is_floating_point()
    ]
    if not outputs:
        return None
    loss = sum((o * torch.linspace(0.5, 1.5, o.numel(), dtype=o.dtype).reshape(o.shape)).sum() for o in outputs)
    loss.backward()
    return [p.grad for p in module.parameters()] + [t.grad for t in inputs]


@pytest.mark.parametrize("module_info", module_db, ids=[m.name for m in module_db])
def test_module_backward_matches_eager(module_info):
    checked = 0
    for index in range(min(SAMPLES_PER_MODULE, len(sample_inputs(module_info)))):
        torch._dynamo.reset()
        try:
            expected = gradients(module_info, index)
        except Exception:  # the sample is not differentiable in eager either
            continue
        if expected is None:
            continue
        fallbacks, captured = eager_fallbacks(), captures()
        with compiled_autograd(dynamo_compiler("aot_eager")), warnings.catch_warnings():
            warnings.filterwarnings("error", message="Compiled autograd")
            actual = gradients(module_info, index)
        assert eager_fallbacks() == fallbacks, "a backward ran on the eager engine"
        assert captures() == captured + 1
        for e, a in zip(expected, actual):
            assert (e is None) == (a is None)
            if e is not None:
                torch.testing.assert_close(a, e, equal_nan=True)
        checked += 1
    if not checked:
        pytest.skip("no sample input eager can differentiate")
