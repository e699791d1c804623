"""The autograd graph is freed as in eager: saved activations die with the
backward unless retain_graph=True, and training loops do not grow."""

import gc
import weakref

import pytest
import torch

from helpers import COMPILERS, assert_same, compiled_autograd


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
