"""Backwards on several threads at once each get eager's gradients, and a
process forked while another thread is inside a backward compiles its own."""

import queue
import threading
import time

import pytest
import torch
import torch.multiprocessing

from helpers import COMPILERS, captures, compiled_autograd, identity_compiler


@pytest.mark.parametrize("compiler_name", ["no_dynamo", "eager"])
def test_two_threads_backward_on_independent_graphs(compiler_name):
    torch.manual_seed(0)
    models = [torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2)) for _ in range(2)]
    inputs = [torch.randn(4, 8) for _ in range(2)]

    def grads_of(model, x):
        model.zero_grad(set_to_none=True)
        model(x).pow(2).sum().backward()
        return [p.grad.clone() for p in model.parameters()]

    expected = [grads_of(m, x) for m, x in zip(models, inputs)]
    errors = []
    start = threading.Barrier(2)

    def train(model, x, want):
        try:
            start.wait()
            for _ in range(20):
                got = grads_of(model, x)
                for g, w in zip(got, want):
                    assert torch.equal(g, w)
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    with compiled_autograd(COMPILERS[compiler_name]):
        threads = [threading.Thread(target=train, args=args) for args in zip(models, inputs, expected)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a backward hung"
    assert errors == []
    assert not torch._dynamo.compiled_autograd.in_compiled_autograd_region
    assert torch._dynamo.compiled_autograd.compiled_autograd_enabled is False


def tanh_mlp_gradients():
    """Compiled-autograd captures and gradients of a fresh model's backward,
    and eager autograd's gradients of the same model, as lists (tensors sent
    between processes would share memory with a child that has exited)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1))
    x = torch.randn(4, 3)
    expected = torch.autograd.grad(model(x).pow(2).sum(), list(model.parameters()))
    captures_before = captures()
    with compiled_autograd(identity_compiler):
        model(x).pow(2).sum().backward()
    return captures() - captures_before, [p.grad.tolist() for p in model.parameters()], [e.tolist() for e in expected]


def report_tanh_mlp_gradients(results):
    results.put(tanh_mlp_gradients())


def gradients_from_forked_child():
    """Forks a process that runs tanh_mlp_gradients and returns its answer,
    or None when the child has not answered within a minute (it hung)."""
    context = torch.multiprocessing.get_context("fork")
    results = context.Queue()
    child = context.Process(target=report_tanh_mlp_gradients, args=(results,))
    child.start()
    try:
        return results.get(timeout=60)
    except queue.Empty:
        return None
    finally:
        child.join(timeout=5)
        if child.is_alive():
            child.kill()


def assert_child_compiled_eagers_gradients(answer):
    assert answer is not None, "the forked child's backward hung"
    child_captures, got, expected = answer
    assert child_captures == 1, "the forked child's backward was not compiled"
    assert got == expected


def test_process_forked_while_another_thread_runs_a_graph_compiles_its_own_backwards():
    inside_graph, forked = threading.Event(), threading.Event()

    def wait_for_the_fork(grad):
        inside_graph.set()
        forked.wait(timeout=120)
        return grad

    def backward_paused_in_a_hook():
        x = torch.randn(3, requires_grad=True)
        y = x * 2
        y.register_hook(wait_for_the_fork)
        y.sum().backward()

    with compiled_autograd(identity_compiler):
        paused = threading.Thread(target=backward_paused_in_a_hook)
        paused.start()
        assert inside_graph.wait(timeout=120)
        try:
            answer = gradients_from_forked_child()
        finally:
            forked.set()
            paused.join(timeout=120)
    assert_child_compiled_eagers_gradients(answer)


def test_process_forked_while_another_thread_holds_the_engines_lock_does_not_hang():
    running_graphs = torch._compiled_autograd._RUNNING
    holding = threading.Event()

    def hold_the_lock_briefly():
        with running_graphs.lock:
            holding.set()
            time.sleep(0.2)

    holder = threading.Thread(target=hold_the_lock_briefly)
    holder.start()
    assert holding.wait(timeout=120)
    answer = gradients_from_forked_child()
    holder.join(timeout=120)
    assert_child_compiled_eagers_gradients(answer)
