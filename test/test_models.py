"""Gradients of whole models under the Python engine equal eager autograd's."""

import pytest
import torch

from helpers import COMPILERS, assert_same, bit_exact, captures, compiled_autograd, dynamo_compiler
from models import MODELS


def parameter_grads(model, x, compiler=None):
    model.zero_grad(set_to_none=True)
    loss = model(x).pow(2).mean()
    if compiler is None:
        loss.backward()
    else:
        with compiled_autograd(compiler):
            loss.backward()
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("compiler_name", sorted(COMPILERS))
@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_model_gradients_equal_eager(model_name, compiler_name):
    make_model, make_input = MODELS[model_name]
    torch.manual_seed(0)
    model = make_model()
    for batch in (3, 3, 5):
        x = make_input(batch)
        expected = parameter_grads(model, x)
        actual = parameter_grads(model, x, COMPILERS[compiler_name])
        assert_same(expected, actual, exact=bit_exact(COMPILERS[compiler_name]))
    assert captures() == 1


@pytest.mark.parametrize(
    "model_name, model_kwargs, shapes",
    [
        ("mlp", {}, [(4,), (6,)]),
        # The recompiles for the new batch size and sequence length generate
        # kernels that loop over symbolic sizes, whose indices Inductor
        # simplifies with the bounds of those loops
        # (test_index_simplification.py).
        ("transformer_encoder", {"layers": 1}, [(4, 10), (5, 10), (5, 14), (4, 10)]),
    ],
)
def test_gradients_with_inductor_across_shapes(model_name, model_kwargs, shapes):
    make_model, make_input = MODELS[model_name]
    torch.manual_seed(0)
    model = make_model(**model_kwargs)
    for shape in shapes:
        x = make_input(*shape)
        expected = parameter_grads(model, x)
        actual = parameter_grads(model, x, dynamo_compiler("inductor"))
        assert_same(expected, actual, exact=False)
    assert captures() == 1


@pytest.mark.parametrize("compiler_name", sorted(COMPILERS))
def test_parametrized_layers_train_like_eager(compiler_name):
    # Parametrizations recompute the weight in every forward: spectral norm
    # updates its power-iteration vectors in place under no_grad, orthogonal's
    # weight is a matrix exponential, and `cached()` shares one weight between
    # two calls.
    def training_steps():
        torch.manual_seed(0)
        spectral = torch.nn.utils.parametrizations.spectral_norm(torch.nn.Linear(6, 5))
        orthogonal = torch.nn.utils.parametrizations.orthogonal(torch.nn.Linear(5, 5))
        x = torch.randn(3, 6)
        grads = []
        for _ in range(2):
            with torch.nn.utils.parametrize.cached():
                hidden = spectral(x)
                (orthogonal(hidden) + orthogonal(hidden * 2)).pow(2).sum().backward()
            grads += [p.grad.clone() for p in spectral.parameters()]
            grads += [p.grad.clone() for p in orthogonal.parameters()]
        return grads

    expected = training_steps()
    with compiled_autograd(COMPILERS[compiler_name]):
        actual = training_steps()
    assert_same(expected, actual, bit_exact(COMPILERS[compiler_name]))
    assert captures() == 1
