"""autograd.grad and .backward() in all their forms, and the .grad contract,
behave as in eager."""

import pytest
import torch

from helpers import COMPILERS, captures, check_against_eager


@pytest.fixture(params=sorted(COMPILERS))
def compiler(request):
    return COMPILERS[request.param]


def test_grad_outputs(compiler):
    def fn():
        x = torch.randn(3, requires_grad=True)
        return list(torch.autograd.grad(x * 3, x, grad_outputs=torch.arange(3.0)))

    check_against_eager(fn, compiler)


def test_materialize_grads(compiler):
    def fn():
        x = torch.randn(3, requires_grad=True)
        unused = torch.randn(3, requires_grad=True)
        return list(torch.autograd.grad((x * 2).sum(), [x, unused], materialize_grads=True))

    check_against_eager(fn, compiler)


def test_functional_jacobian_captures_its_repeated_grads_once(compiler):
    # jacobian calls autograd.grad once per output element, retaining the graph.
    def fn():
        x = torch.randn(3, requires_grad=True)
        return [torch.autograd.functional.jacobian(lambda t: t.sin() * t.sum(), x)]

    check_against_eager(fn, compiler)
    assert captures() == 1


def test_torch_func_transforms_run_their_backwards_eagerly(compiler):
    # torch.func's grad and vjp turn compiled autograd off around their
    # backwards (torch/_functorch/eager_transforms.py), as for the legacy engine.
    def fn():
        x = torch.randn(4)
        grad = torch.func.grad(lambda t: (t.sin() ** 2).sum())(x)
        _, vjp = torch.func.vjp(torch.tanh, x)
        return [grad, vjp(torch.ones(4))[0]]

    check_against_eager(fn, compiler)
    assert captures() == 0


def test_a_grad_that_is_a_view_of_another_tensor_accumulates_into_it(compiler):
    def fn():
        w = torch.randn(4, requires_grad=True)
        storage = torch.zeros(2, 4)
        w.grad = storage[1]
        (w * w).sum().backward()
        return [w.grad, storage, torch.tensor(w.grad.data_ptr() == storage[1].data_ptr())]

    check_against_eager(fn, compiler)


def test_zero_size_tensors(compiler):
    def fn():
        x = torch.randn(0, 3, requires_grad=True)
        (x * 2).sum().backward()
        return [x.grad]

    check_against_eager(fn, compiler)


def test_gradient_undefined_along_an_edge(compiler):
    def fn():
        x = torch.randn(3, requires_grad=True)
        a, _ = x[:2], x[2:]
        (a * 2).sum().backward()
        return [x.grad]

    check_against_eager(fn, compiler)


def test_existing_grad_accumulates_in_place(compiler):
    def fn():
        x = torch.randn(3, requires_grad=True)
        x.grad = torch.ones(3)
        grad_before = x.grad
        (x * 2).sum().backward()
        return [x.grad, torch.tensor(x.grad is grad_before)]

    check_against_eager(fn, compiler)


def test_zeroed_grads_are_reused_and_set_to_none_grads_are_new(compiler):
    def fn():
        model = torch.nn.Linear(3, 2)
        model(torch.ones(1, 3)).sum().backward()
        model.zero_grad(set_to_none=False)
        zeroed = [p.grad for p in model.parameters()]
        model(torch.ones(1, 3)).sum().backward()
        reused = [p.grad is z for p, z in zip(model.parameters(), zeroed)]
        model.zero_grad(set_to_none=True)
        model(torch.ones(1, 3)).sum().backward()
        return [p.grad for p in model.parameters()] + [torch.tensor(reused)]

    check_against_eager(fn, compiler)


def test_sparse_gradients(compiler):
    def fn():
        embedding = torch.nn.Embedding(10, 3, sparse=True)
        for _ in range(2):
            embedding(torch.tensor([1, 2, 1])).sum().backward()
        return [embedding.weight.grad.to_dense(), torch.tensor(embedding.weight.grad.is_sparse)]

    check_against_eager(fn, compiler)


def test_a_dense_gradient_accumulates_into_a_sparse_grad(compiler):
    def fn():
        x = torch.randn(2, 2, requires_grad=True)
        x.grad = torch.sparse_coo_tensor(torch.tensor([[0, 1], [0, 1]]), torch.tensor([1.0, 1.0]), (2, 2))
        (x * 3).sum().backward()
        return [x.grad.layout, x.grad.to_dense()]

    check_against_eager(fn, compiler)


def test_complex_tensors(compiler):
    def fn():
        x = torch.randn(3, dtype=torch.cfloat, requires_grad=True)
        (x * x.conj()).real.sum().backward()
        return [x.grad]

    check_against_eager(fn, compiler)


def test_gradient_layout_follows_the_parameter(compiler):
    def fn():
        x = torch.randn(3, 4).t().requires_grad_()  # non-contiguous leaf
        (x * 2).sum().backward()
        return [x.grad, torch.tensor(x.grad.stride())]

    check_against_eager(fn, compiler)


def test_gradient_layout_of_a_channels_last_convnet_matches_eager(compiler):
    def fn():
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 3)
        ).to(memory_format=torch.channels_last)
        x = torch.randn(2, 3, 10, 10).to(memory_format=torch.channels_last).requires_grad_()
        model(x).pow(2).mean().backward()
        leaves = [x, *model.parameters()]
        return [leaf.grad for leaf in leaves] + [torch.tensor(leaf.grad.stride()) for leaf in leaves]

    check_against_eager(fn, compiler)


# Eager and the engine both warn, once per process (TORCH_WARN_ONCE).
@pytest.mark.filterwarnings("ignore:grad and param do not obey the gradient layout contract")
def test_accumulating_into_a_transposed_grad_keeps_its_layout(compiler):
    def fn():
        x = torch.randn(4, 5, requires_grad=True)
        x.grad = torch.randn(5, 4).t()
        (x * 3).sum().backward()
        return [x.grad, torch.tensor(x.grad.stride())]

    check_against_eager(fn, compiler)


def test_a_new_compiler_fn_compiles_again_only_after_reset():
    compiled_by = []

    def compiler_named(name):
        def compiler_fn(gm):
            compiled_by.append(name)
            return gm

        return compiler_fn

    x = torch.randn(3, requires_grad=True)
    for name in ("first", "second", "third"):
        if name == "third":
            torch._dynamo.compiled_autograd.reset()
        x.grad = None
        with torch._dynamo.compiled_autograd._enable(compiler_named(name)):
            (x * 2).sum().backward()
        assert torch.equal(x.grad, torch.full((3,), 2.0))

    assert compiled_by == ["first", "third"]
