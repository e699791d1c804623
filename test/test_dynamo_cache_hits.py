"""A captured graph compiled by torch.compile runs from Dynamo's cache without
the compiled module's call path on a cache hit (`_DynamoCacheHit`), and
through that call path -- which compiles again, honours the stance, records
profiler ranges, fires global module hooks, runs resume functions -- whenever
that matters. Every case compares gradients with eager's bit for bit."""

import contextlib
from unittest import mock

import pytest
import torch
from torch._dynamo.eval_frame import OptimizedModule

from helpers import compiled_autograd, CountingCompiler


@contextlib.contextmanager
def counting_module_calls():
    calls = []
    original = OptimizedModule.__call__

    def counted(self, *args, **kwargs):
        calls.append(self)
        return original(self, *args, **kwargs)

    with mock.patch.object(OptimizedModule, "__call__", counted):
        yield calls


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def eager_grads(model, x):
    model.zero_grad(set_to_none=True)
    model(x).pow(2).sum().backward()
    return [p.grad.clone() for p in model.parameters()]


def backward_matches_eager(model, x, compiler, context=contextlib.nullcontext):
    expected = eager_grads(model, x)
    model.zero_grad(set_to_none=True)
    with compiled_autograd(compiler), context():
        model(x).pow(2).sum().backward()
    for e, p in zip(expected, model.parameters()):
        assert torch.equal(p.grad, e)


def warmed_up(model, x, compiler):
    """The first backward, which compiles."""
    backward_matches_eager(model, x, compiler)


def test_a_cache_hit_runs_dynamos_code_without_calling_the_compiled_module():
    model, x, compiler = make_model(), torch.randn(5, 4), CountingCompiler()
    with counting_module_calls() as calls:
        warmed_up(model, x, compiler)
        assert len(calls) == 1
        for _ in range(3):
            backward_matches_eager(model, x, compiler)
    assert len(calls) == 1
    assert compiler.dynamo_compiles == 1


def test_a_failing_guard_goes_through_the_module_and_compiles_once():
    model, compiler = make_model(), CountingCompiler()
    with counting_module_calls() as calls:
        warmed_up(model, torch.randn(5, 4), compiler)
        backward_matches_eager(model, torch.randn(7, 4), compiler)
        assert (len(calls), compiler.dynamo_compiles) == (2, 2)
        for batch in (5, 7, 6):
            backward_matches_eager(model, torch.randn(batch, 4), compiler)
    assert (len(calls), compiler.dynamo_compiles) == (2, 2)


@contextlib.contextmanager
def global_module_forward_hook():
    handle = torch.nn.modules.module.register_module_forward_hook(lambda *args: None)
    try:
        yield
    finally:
        handle.remove()


@pytest.mark.parametrize(
    "context",
    [
        lambda: torch.compiler.set_stance("force_eager"),
        lambda: torch.profiler.profile(),
        global_module_forward_hook,
    ],
    ids=["force_eager_stance", "profiler", "global_module_hook"],
)
def test_the_module_is_called_where_its_call_does_more_than_a_cache_hit(context):
    model, x, compiler = make_model(), torch.randn(5, 4), CountingCompiler()
    with counting_module_calls() as calls:
        warmed_up(model, x, compiler)
        backward_matches_eager(model, x, compiler, context)
    assert len(calls) == 2
    assert compiler.dynamo_compiles == 1


def test_graphs_with_graph_breaks_run_through_the_module_and_its_resume_functions():
    def hook(grad):
        torch._dynamo.graph_break()
        return grad * 2

    compiler = CountingCompiler()

    def run():
        torch.manual_seed(0)
        x = torch.randn(3, requires_grad=True)
        y = x * x
        y.register_hook(hook)
        y.sum().backward()
        return x.grad

    expected = run()
    with counting_module_calls() as calls, compiled_autograd(compiler):
        results = [run() for _ in range(3)]
    assert len(calls) == 3
    compiles = compiler.dynamo_compiles
    assert compiles >= 2
    for result in results:
        assert torch.equal(result, expected)
    with compiled_autograd(compiler):
        assert torch.equal(run(), expected)
    assert compiler.dynamo_compiles == compiles


@contextlib.contextmanager
def frames_dynamo_evaluates():
    """The code of every frame Dynamo's frame-evaluation callback is asked
    to convert."""
    from torch._dynamo.convert_frame import CatchErrorsWrapper

    codes = []
    original = CatchErrorsWrapper.__call__

    def recording(self, frame, *args, **kwargs):
        codes.append(frame.f_code)
        return original(self, frame, *args, **kwargs)

    with mock.patch.object(CatchErrorsWrapper, "__call__", recording):
        yield codes


def test_a_backward_inside_a_compiled_function_runs_its_graph_outside_dynamos_callback():
    model, x, compiler = make_model(), torch.randn(5, 4), CountingCompiler()

    @torch.compile(backend="eager")
    def step(x):
        loss = model(x).pow(2).sum()
        torch._dynamo.graph_break()
        loss.backward()

    expected = eager_grads(model, x)
    with counting_module_calls() as calls:
        warmed_up(model, x, compiler)
    with frames_dynamo_evaluates() as codes:
        for _ in range(2):
            model.zero_grad(set_to_none=True)
            with compiled_autograd(compiler):
                step(x)
            for e, p in zip(expected, model.parameters()):
                assert torch.equal(p.grad, e)
    assert compiler.dynamo_compiles == 1
    assert len(calls) == 1
    captured_graph_code = calls[0]._orig_mod.forward.__code__.co_filename
    assert codes, "the test should see Dynamo convert step's frames"
    assert all(code.co_filename != captured_graph_code for code in codes)
