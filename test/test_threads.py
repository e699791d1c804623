"""Backwards on several threads at once each get eager's gradients."""

import threading

import pytest
import torch

from helpers import COMPILERS, compiled_autograd


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
