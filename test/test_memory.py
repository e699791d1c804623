"""The autograd graph is freed as in eager: saved activations die with the
backward unless retain_graph=True, training loops do not grow, and a compiled
backward needs no more memory than eager's."""

import contextlib
import gc
import re
import weakref

import pytest
import torch
from torch._inductor.utils import run_and_get_code

from helpers import COMPILERS, assert_same, backward_memory, compiled_autograd, dynamo_compiler
from models import convnet, convnet_input


@pytest.mark.parametrize("compiler_name", sorted(COMPILERS))
def test_saved_activations_are_freed_by_backward(compiler_name):
    x = torch.randn(16, requires_grad=True)
    activation = x * 2
    activation_ref = weakref.ref(activation)
    loss = activation.sin().sum()  # SinBackward saves the activation
    del activation
    assert activation_ref() is not None
    with compiled_autograd(COMPILERS[compiler_name]):
        loss.backward()
    assert activation_ref() is None


def test_retain_graph_keeps_activations_for_a_second_backward():
    x = torch.randn(16, requires_grad=True)
    activation = x * 2
    activation_ref = weakref.ref(activation)
    loss = (activation.sin() * activation).sum()
    del activation
    with compiled_autograd():
        loss.backward(retain_graph=True)
        assert activation_ref() is not None
        first = x.grad.clone()
        loss.backward()
    assert activation_ref() is None
    assert_same([x.grad], [2 * first])


def test_training_loop_does_not_grow():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def train(steps):
        for _ in range(steps):
            optimizer.zero_grad(set_to_none=True)
            with compiled_autograd():
                model(torch.randn(4, 8)).pow(2).sum().backward()
            optimizer.step()

    train(100)
    gc.collect()
    objects_before = len(gc.get_objects())
    train(1000)
    gc.collect()
    assert len(gc.get_objects()) - objects_before < 50
    assert torch._compiled_autograd_C.cache_size() == 1


@pytest.fixture(params=[False, True], ids=["python_wrapper", "cpp_wrapper"])
def cpp_wrapper(request):
    """Inductor writes the code that calls its kernels in Python, or in C++
    (torch._inductor.config.cpp_wrapper); each frees an input its own way."""
    with torch._inductor.config.patch(cpp_wrapper=request.param):
        yield request.param


def test_inductor_frees_an_input_no_kernel_reads_before_the_first_kernel(cpp_wrapper):
    """patches/0005: max_pool2d's backward reads its input only for its
    shape, so no kernel reads it; Inductor used to hold it until the graph
    returned."""

    def pool_backward(grad, x, indices):
        return torch.ops.aten.max_pool2d_with_indices_backward(
            grad, x, [2, 2], [2, 2], [0, 0], [1, 1], False, indices
        )

    x = torch.randn(1, 2, 4, 4)
    out, indices = torch.ops.aten.max_pool2d_with_indices(x, [2, 2], [2, 2])
    grad = torch.randn_like(out)
    compiled = torch.compile(pool_backward, backend="inductor")
    result, (code,) = run_and_get_code(compiled, grad, x, indices)
    assert_same([pool_backward(grad, x, indices)], [result])
    lines = [line.strip() for line in code.splitlines()]
    first_kernel_call = next(i for i, line in enumerate(lines) if re.match(r"cpp_fused_\w+\(", line))
    assert ("arg1_1.reset();" if cpp_wrapper else "del arg1_1") in lines[:first_kernel_call]


def test_convnet_backward_with_inductor_peaks_within_a_tenth_of_eager(cpp_wrapper):
    """The convnet's max pool saves the ReLU's output, which its compiled
    backward never reads: it must not stay allocated for the whole graph."""
    torch.manual_seed(0)
    model, x = convnet(), convnet_input(8)
    inductor = dynamo_compiler("inductor")

    def forward():
        model.zero_grad(set_to_none=True)
        return model(x).pow(2).mean()

    with compiled_autograd(inductor):
        forward().backward()
    grads, peaks = {}, {}
    for engine, context in (("eager", contextlib.nullcontext), ("compiled", lambda: compiled_autograd(inductor))):
        peaks[engine], _ = backward_memory(forward, context())
        grads[engine] = [p.grad for p in model.parameters()]
    assert_same(grads["eager"], grads["compiled"], exact=False)
    assert peaks["compiled"] <= 1.1 * peaks["eager"], peaks
