"""First-tier autograd semantics: each case runs under eager autograd and under
the Python compiled autograd engine and must give the same tensors, the same
hook side effects and the same .grad fields."""

import pytest
import torch
import torch._functorch.config
import torch.autograd.forward_ad as fwAD
from torch.testing._internal.two_tensor import TwoTensor

from helpers import COMPILERS, assert_same, captures, check_against_eager, compiled_autograd


@pytest.fixture(params=sorted(COMPILERS))
def compiler(request):
    return COMPILERS[request.param]


def test_scalar_root(compiler):
    def fn():
        x = torch.randn(5, requires_grad=True)
        (x.sin() * x).sum().backward()
        return [x.grad]

    check_against_eager(fn, compiler)


def test_non_scalar_root_with_gradient(compiler):
    def fn():
        x = torch.randn(2, 3, requires_grad=True)
        y = x.exp() * 2
        y.backward(gradient=torch.arange(6.0).reshape(2, 3))
        return [x.grad]

    check_against_eager(fn, compiler)


def test_multiple_roots(compiler):
    def fn():
        x = torch.randn(2, 3, requires_grad=True)
        a, b = x.cos(), (x * 3).sum(1)
        torch.autograd.backward([a, b], [torch.full_like(a, 2.0), torch.arange(2.0)])
        return [x.grad]

    check_against_eager(fn, compiler)


def test_leaf_grad_accumulates_across_backwards(compiler):
    def fn():
        x = torch.randn(3, requires_grad=True)
        grads = []
        for scale in (1.0, 2.0, 3.0):
            (x * x * scale).sum().backward()
            grads.append(x.grad.clone())
        return grads

    check_against_eager(fn, compiler)


def test_grads_that_are_views_of_one_flat_buffer_accumulate_into_it(compiler):
    # As DDP's gradient_as_bucket_view leaves them: each parameter's .grad a
    # disjoint view of one buffer, added into in place.
    def fn():
        model = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
        flat = torch.zeros(sum(p.numel() for p in model.parameters()))
        offset = 0
        for p in model.parameters():
            p.grad = flat[offset : offset + p.numel()].view_as(p)
            offset += p.numel()
        for _ in range(2):
            model(torch.randn(3, 4)).pow(2).sum().backward()
        return [flat] + [p.grad for p in model.parameters()]

    actual = check_against_eager(fn, compiler)
    assert all(grad.untyped_storage().data_ptr() == actual[0].untyped_storage().data_ptr() for grad in actual[1:])


def test_hook_on_non_leaf_with_side_effect_and_new_grad(compiler):
    def fn():
        x = torch.randn(3, requires_grad=True)
        y = x**2
        seen = []

        def hook(grad):
            seen.append(grad.clone())
            return grad * 2

        y.register_hook(hook)
        y.sum().backward()
        return [x.grad, *seen]

    check_against_eager(fn, compiler)


def test_hook_on_leaf(compiler):
    def fn():
        x = torch.randn(3, requires_grad=True)
        x.register_hook(lambda grad: grad * 10)
        (x * x).sum().backward()
        return [x.grad]

    check_against_eager(fn, compiler)


def test_several_hooks_on_one_tensor_run_in_order(compiler):
    def fn():
        x = torch.randn(3, requires_grad=True)
        y = x * 2
        order = []
        y.register_hook(lambda g: order.append("first") or g + 1)
        y.register_hook(lambda g: order.append("second") or g * 3)
        y.sum().backward()
        return [x.grad, torch.tensor(len(order)), *(torch.tensor(o == "first") for o in order)]

    check_against_eager(fn, compiler)


def test_retain_graph_twice(compiler):
    def fn():
        x = torch.randn(4, requires_grad=True)
        y = (x.tanh() * x).sum()
        y.backward(retain_graph=True)
        first = x.grad.clone()
        y.backward()
        return [first, x.grad]

    check_against_eager(fn, compiler)


def test_autograd_grad_leaves_dot_grad_alone(compiler):
    def fn():
        x = torch.randn(3, requires_grad=True)
        y = torch.randn(3, requires_grad=True)
        (gx,) = torch.autograd.grad((x * y).sin().sum(), [x])
        assert x.grad is None and y.grad is None
        return [gx]

    check_against_eager(fn, compiler)


def test_autograd_grad_of_intermediate_and_leaf(compiler):
    def fn():
        x = torch.randn(3, requires_grad=True)
        a = x * 2
        seen = []
        a.register_hook(lambda g: seen.append(g.clone()) or g * 3)
        ga, gx = torch.autograd.grad(a.exp().sum(), [a, x])
        return [ga, gx, *seen]

    check_against_eager(fn, compiler)


def test_autograd_grad_allow_unused(compiler):
    def fn():
        x = torch.randn(3, requires_grad=True)
        unused = torch.randn(3, requires_grad=True)
        gx, gu = torch.autograd.grad((x * 2).sum(), [x, unused], allow_unused=True)
        return [gx, gu]

    check_against_eager(fn, compiler)


def test_backward_with_inputs(compiler):
    def fn():
        x = torch.randn(3, requires_grad=True)
        y = torch.randn(3, requires_grad=True)
        (x * y).sum().backward(inputs=[x])
        return [x.grad, y.grad]

    check_against_eager(fn, compiler)


def test_in_place_on_view(compiler):
    def fn():
        x = torch.randn(4, 4, requires_grad=True)
        y = x * 1
        y[:, 1] = y[:, 1] * 5
        y.sum().backward()
        return [x.grad]

    check_against_eager(fn, compiler)


def test_python_autograd_function_runs_as_itself(compiler):
    class SinWithSavedInput(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x.sin()

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return grad * x.cos()

    def fn():
        x = torch.randn(3, requires_grad=True)
        SinWithSavedInput.apply(x * 2).sum().backward()
        return [x.grad]

    check_against_eager(fn, compiler)


def test_retain_grad(compiler):
    def fn():
        x = torch.randn(3, requires_grad=True)
        a = x * 2
        a.retain_grad()
        (a * a).sum().backward()
        return [x.grad, a.grad]

    check_against_eager(fn, compiler)


def test_backward_of_an_autocast_forward(compiler):
    """Mixed precision: the backward computes in bfloat16 where the forward
    did. Inductor keeps a bfloat16 intermediate in float32 unless
    ``emulate_precision_casts`` is on (a bias gradient then differs from
    eager's by one bfloat16 step, on the legacy engine too), so the test sets
    it, as a user who wants eager's values would."""

    def fn():
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(torch.randn(3, 8))
        out.float().pow(2).sum().backward()
        return [p.grad for p in model.parameters()]

    with torch._inductor.config.patch(emulate_precision_casts=True):
        check_against_eager(fn, compiler)


class PlainSubclass(torch.Tensor):
    pass


@pytest.mark.parametrize("make_leaf", [
    lambda t: t.as_subclass(PlainSubclass).requires_grad_(),
    lambda t: torch.nn.Parameter(t.as_subclass(PlainSubclass)),
    lambda t: TwoTensor(t, t * 2).requires_grad_(),
], ids=["plain_subclass", "parameter_of_a_plain_subclass", "two_tensor"])
def test_a_tensor_subclass_leaf(compiler, make_leaf):
    """The backward of an eager forward on subclass tensors. AOTAutograd
    (torch 2.13) checks a compiled function's first call under a dispatch
    mode that refused tensor subclasses without ``__torch_dispatch__``
    ("Multiple dispatch failed ... _AnalyzeCustomOpInputOutputMode"), under
    plain ``torch.compile`` and the legacy engine too (patches/0021)."""

    def fn():
        leaf = make_leaf(torch.randn(3))
        hidden = (leaf * 2).sin()
        hidden.register_hook(lambda grad: grad * 3)
        hidden.sum().backward()
        return [leaf.grad]

    check_against_eager(fn, compiler)


def test_a_compiled_function_of_a_plain_subclass_runs_on_its_first_call():
    x = torch.randn(3).as_subclass(PlainSubclass)
    compiled = torch.compile(lambda t: t * 2, backend="aot_eager")
    assert_same([x * 2], [compiled(x)])


def test_node_pre_and_post_hooks(compiler):
    def fn():
        x = torch.randn(3, requires_grad=True)
        b = (x * 2).exp()
        b.grad_fn.register_prehook(lambda grad_outputs: (grad_outputs[0] * 2,))
        b.grad_fn.register_hook(lambda grad_inputs, grad_outputs: (grad_inputs[0] + 1,))
        b.sum().backward()
        return [x.grad]

    check_against_eager(fn, compiler)


def test_post_accumulate_grad_hook_sees_new_grad(compiler):
    def fn():
        x = torch.randn(3, requires_grad=True)
        seen = []
        x.register_post_accumulate_grad_hook(lambda p: seen.append(p.grad.clone()))
        (x * 3).sum().backward()
        return [x.grad, *seen]

    check_against_eager(fn, compiler)


def test_queue_callback_runs_after_backward():
    order = []

    def hook(grad):
        torch.autograd.Variable._execution_engine.queue_callback(lambda: order.append("callback"))
        order.append("hook")
        return grad

    x = torch.randn(3, requires_grad=True)
    y = x * 2
    y.register_hook(hook)
    with compiled_autograd():
        y.sum().backward()
    order.append("after backward")
    assert order == ["hook", "callback", "after backward"]


def test_hook_order_matches_eager():
    """Hooks on many tensors fire in the eager engine's order (by sequence
    number, AccumulateGrad first), not in graph-traversal order."""

    def fn():
        order = []
        params = [torch.randn(3, requires_grad=True) for _ in range(4)]
        for i, p in enumerate(params):
            p.register_hook(lambda g, i=i: order.append(("leaf", i)) or g)
        h = params[0]
        for i, p in enumerate(params[1:]):
            h = h * p + i
            h.register_hook(lambda g, i=i: order.append(("inner", i)) or g)
        h.sum().backward()
        return [torch.tensor([hash(o) for o in order])] + [p.grad for p in params]

    check_against_eager(fn)


def test_captured_graph_is_reused_for_a_new_forward():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    for _ in range(3):
        with compiled_autograd():
            model(torch.randn(5, 4)).sum().backward()
    assert captures() == 1


def test_changed_batch_size_does_not_capture_again():
    """(Dynamo itself recompiles once; see test_compiled_structure.py.)"""
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    for batch in (2, 3, 7):
        x = torch.randn(batch, 4)
        model.zero_grad()
        model(x).sum().backward()
        expected = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        with compiled_autograd(COMPILERS["eager"]):
            model(x).sum().backward()
        assert_same(expected, [p.grad for p in model.parameters()])
    assert captures() == 1


def backward_of_a_primal_unpacked_from_a_dual():
    x = torch.randn(4, requires_grad=True)
    with fwAD.dual_level():
        dual = fwAD.make_dual(x, torch.randn(4))
        primal, tangent = fwAD.unpack_dual((dual.sin() * 3).sum())
    (primal + tangent).backward()
    return [x.grad]


def test_a_saved_view_with_the_negative_bit_gives_eager_gradients(compiler):
    # z.conj().imag is a view whose memory holds the negated values, marked by
    # its negative bit; mul saves it. An Inductor kernel read that memory
    # without the bit and negated this gradient (both engines; plain
    # torch.compile of `x * y` with such an x too), so the graph gets the
    # values the bit stands for. A gradient passed in can carry the bit too.
    def fn():
        z = torch.randn(6, 4, dtype=torch.complex128, requires_grad=True)
        negated_imag = z.conj().imag
        y = (negated_imag * z.real).exp()
        y.backward(torch.randn(6, 4, dtype=torch.complex128).conj().imag)
        return [z.grad]

    check_against_eager(fn, compiler)
    assert captures() == 1


def test_a_complex_least_squares_backward_gives_eager_gradients_on_its_first_run(compiler):
    # lstsq's backward calls linalg_pinv, whose kernel makes conjugate views
    # itself. AOTAutograd runs a compiled graph's first call under its
    # custom-op analyzer, a TorchDispatchMode, which ran ops without the
    # Conjugate key: the first backward's gradients were wrong by up to 90
    # (both engines; patches/0020). Not bit for bit: eager's own gradients
    # here change in the last bits with where its buffers are allocated (two
    # eager runs differed by 4e-15).
    def fn():
        a = torch.randn(2, 3, dtype=torch.complex128, requires_grad=True)
        b = torch.randn(2, 3, dtype=torch.complex128, requires_grad=True)
        torch.linalg.lstsq(a, b).solution.abs().sum().backward()
        return [a.grad, b.grad]

    check_against_eager(fn, compiler, exact=False)


def test_a_compiled_function_gives_eagers_complex_pseudo_inverse_on_its_first_call():
    a = torch.randn(2, 3, dtype=torch.complex128)
    compiled = torch.compile(torch.linalg.pinv, backend="aot_eager")
    assert_same([torch.linalg.pinv(a)], [compiled(a)])


def test_backward_of_a_primal_unpacked_from_a_forward_ad_dual_is_captured(compiler):
    # unpack_dual gives the primal an Identity node, which has no compiled_args:
    # it runs as itself inside the captured graph. (A backward inside the dual
    # level runs on eager autograd: test_fallbacks_and_errors.py.) Forward AD
    # saved a zero as a ZeroTensor, which has no memory: the Inductor kernel
    # after the graph break read it through its null data pointer and crashed
    # the process, so the graph gets real zeros instead.
    check_against_eager(backward_of_a_primal_unpacked_from_a_dual, compiler)
    assert captures() == 1
