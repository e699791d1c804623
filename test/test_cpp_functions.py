"""C++ hooks and C++ autograd Functions under the Python engine."""

import warnings

import pytest
import torch

from helpers import (
    COMPILERS,
    CountingCompiler,
    captures,
    check_against_eager,
    compiled_autograd,
    eager_fallbacks,
)
from torch._dynamo.utils import counters


@pytest.fixture(params=sorted(COMPILERS))
def compiler(request):
    return COMPILERS[request.param]


def test_tensor_hook_registered_from_cpp(cpp_extension, compiler):
    def fn():
        x = torch.randn(3, requires_grad=True)
        y = x * 3
        cpp_extension.register_doubling_hook(y)
        y.register_hook(lambda g: g + 1)  # runs after the C++ hook, as registered
        y.sum().backward()
        return [x.grad]

    check_against_eager(fn, compiler)


def test_cpp_function_saving_a_scalar_lifts_it(cpp_extension, compiler):
    def fn():
        x = torch.randn(3, requires_grad=True)
        grads = []
        for scale in (2.0, 3.0):  # same graph: the scalar is an input, not a constant
            cpp_extension.scale_by(x.sin(), scale).sum().backward()
            grads.append(x.grad.clone())
        return grads

    check_against_eager(fn, compiler)


@pytest.mark.parametrize("compiler_name", ["no_dynamo", "aot_eager"])
def test_failing_backward_leaves_the_node_intact(cpp_extension, compiler_name):
    x = torch.randn(3, requires_grad=True)
    factor = torch.randn(3)
    loss = cpp_extension.multiply_by_saved(x * 2, factor).sum()
    cpp_extension.set_fail_backward(True)
    try:
        with compiled_autograd(COMPILERS[compiler_name]), pytest.raises(Exception, match="failed on request"):
            loss.backward(retain_graph=True)
    finally:
        cpp_extension.set_fail_backward(False)
    assert x.grad is None
    loss.backward()  # eager, on the node that was applied with swapped values
    assert torch.equal(x.grad, 2 * factor)


def test_a_backward_that_raises_while_dynamo_traces_it_raises_its_own_error_and_stays_compiled(
    cpp_extension,
):
    # Dynamo runs the Function's backward on FakeTensors, so it raises there
    # first; the graph is not taken for one Dynamo cannot trace.
    compiler = CountingCompiler()
    factor = torch.randn(3)

    def backward(fail):
        x = torch.randn(3, requires_grad=True)
        loss = cpp_extension.multiply_by_saved(x * 2, factor).sum()
        cpp_extension.set_fail_backward(fail)
        try:
            loss.backward()
        finally:
            cpp_extension.set_fail_backward(False)
        return x

    with compiled_autograd(compiler), warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeError, match="failed on request"):
            backward(fail=True)
        x = backward(fail=False)
    assert torch.equal(x.grad, 2 * factor)
    assert counters["compiled_autograd"]["graphs_run_without_dynamo"] == 0
    assert compiler.dynamo_compiles == 1
    assert captures() == 1


def test_node_subclass_without_compiled_args_runs_itself_inside_the_captured_graph(
    cpp_extension, compiler
):
    def fn():
        x = torch.randn(3, requires_grad=True)
        grads = []
        for factor in (torch.randn(3), torch.randn(3)):  # its own saved factor each time
            y = cpp_extension.multiply_with_node_subclass(x.sin(), factor)
            (y * y).sum().backward()
            grads.append(x.grad.clone())
        return grads

    check_against_eager(fn, compiler)
    assert captures() == 1
    assert eager_fallbacks() == 0


def test_node_subclass_without_compiled_args_releases_its_saved_tensor(cpp_extension):
    x = torch.randn(3, requires_grad=True)
    y = cpp_extension.multiply_with_node_subclass(x.exp(), torch.randn(3)).sum()
    with compiled_autograd(COMPILERS["aot_eager"]):
        y.backward()
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            y.backward()
