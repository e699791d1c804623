"""Python autograd.Functions, custom ops, torch.compile'd regions and
activation checkpointing under the Python engine: eager's gradients, and
Function backwards traced into the compiled graph."""

import functools
import re

import numpy as np
import pytest
import torch
from torch._dynamo.utils import counters
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from helpers import (
    COMPILERS,
    assert_same,
    bit_exact,
    captures,
    check_against_eager,
    compiled_autograd,
    dynamo_compiler,
)


@pytest.fixture(params=sorted(COMPILERS))
def compiler(request):
    return COMPILERS[request.param]


class ScaledSin(torch.autograd.Function):
    """save_for_backward, a non-tensor ctx attribute, needs_input_grad."""

    @staticmethod
    def forward(ctx, x, scale):
        ctx.save_for_backward(x)
        ctx.scale = scale
        return x.sin() * scale

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        assert ctx.needs_input_grad == (True, False)
        return grad * x.cos() * ctx.scale, None


class TwoOutputs(torch.autograd.Function):
    """mark_non_differentiable, materialized gradients, setup_context."""

    @staticmethod
    def forward(x):
        return x * 2, (x > 0).float()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.mark_non_differentiable(output[1])

    @staticmethod
    def backward(ctx, grad, grad_mask):
        assert grad_mask is not None  # materialized as zeros
        return grad * 2 + grad_mask.sum()


class NoMaterialize(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.set_materialize_grads(False)
        return x.clone(), x.clone()

    @staticmethod
    def backward(ctx, grad_a, grad_b):
        assert grad_b is None
        return grad_a * 3


class OnceDifferentiable(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.exp()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * x.exp()


class SavesNone(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(None, x, x)
        return x * y

    @staticmethod
    def backward(ctx, grad):
        nothing, x, x_again = ctx.saved_tensors
        assert nothing is None and x_again is x
        return grad * 2, None


class ThroughNumpy(torch.autograd.Function):
    """A backward Dynamo cannot trace: it graph-breaks and runs."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return torch.from_numpy(2 * x.detach().numpy()) * grad * float(x.sum().item() > -1e9)


class ScaleInPlace(torch.autograd.Function):
    """Modifies its input in place (mark_dirty)."""

    @staticmethod
    def forward(ctx, x, scale):
        ctx.mark_dirty(x)
        ctx.scale = scale
        return x.mul_(scale)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.scale, None


def test_function_with_saved_tensor_and_ctx_attribute(compiler):
    def fn():
        x = torch.randn(4, requires_grad=True)
        ScaledSin.apply(x * 2, 1.5).sum().backward()
        return [x.grad]

    check_against_eager(fn, compiler)


def test_function_modifying_its_input_in_place(compiler):
    def fn():
        x = torch.randn(5, requires_grad=True)
        y = x * 2
        z = ScaleInPlace.apply(y, 3.0)
        (z.sin() * y).sum().backward()
        return [x.grad]

    check_against_eager(fn, compiler)


def test_function_with_non_differentiable_output_and_setup_context(compiler):
    def fn():
        x = torch.randn(4, requires_grad=True)
        a, mask = TwoOutputs.apply(x)
        (a * mask).sum().backward()
        return [x.grad]

    check_against_eager(fn, compiler)


def test_function_without_materialized_grads(compiler):
    def fn():
        x = torch.randn(4, requires_grad=True)
        a, _ = NoMaterialize.apply(x)
        a.sum().backward()
        return [x.grad]

    check_against_eager(fn, compiler)


def test_once_differentiable_function(compiler):
    def fn():
        x = torch.randn(4, requires_grad=True)
        OnceDifferentiable.apply(x).sum().backward()
        return [x.grad]

    check_against_eager(fn, compiler)


def test_function_saving_none_and_a_tensor_twice(compiler):
    def fn():
        x = torch.randn(4, requires_grad=True)
        SavesNone.apply(x, 3.0).sum().backward()
        return [x.grad]

    check_against_eager(fn, compiler)


class NonTensorOutput(torch.autograd.Function):
    """A non-tensor input and output: backward gets None for the output's
    gradient (materialized gradients notwithstanding) and returns None for
    the input."""

    @staticmethod
    def forward(ctx, x, n, z):
        return x * 2, n * 3, z * 4

    @staticmethod
    def backward(ctx, grad_x, grad_n, grad_z):
        assert grad_n is None
        return grad_x, grad_n, grad_z


def test_function_with_non_tensor_input_and_output(compiler):
    def fn():
        x = torch.randn(4, requires_grad=True)
        z = torch.randn(4, requires_grad=True)
        a, n, b = NonTensorOutput.apply(x, 1, z)
        (a + n + b).sum().backward()
        return [x.grad, z.grad]

    check_against_eager(fn, compiler)


def test_function_with_untraceable_backward(compiler):
    def fn():
        x = torch.randn(4, requires_grad=True)
        ThroughNumpy.apply(x.sin()).sum().backward()
        return [x.grad]

    check_against_eager(fn, compiler)


def test_function_returning_wrong_number_of_gradients_raises_eagers_error(compiler):
    class TooMany(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            return grad, grad

    def backward():
        TooMany.apply(torch.randn(3, requires_grad=True)).sum().backward()

    with pytest.raises(RuntimeError) as eager_error:
        backward()
    with compiled_autograd(compiler), pytest.raises(Exception) as compiled_error:
        backward()
    assert "returned an incorrect number of gradients" in str(eager_error.value)
    assert "returned an incorrect number of gradients" in str(compiled_error.value)


def test_same_function_twice_and_across_iterations_captures_and_compiles_once():
    compiles = []

    def counting_backend(gm, example_inputs):
        compiles.append(gm)
        return gm.forward

    def fn():
        x = torch.randn(4, requires_grad=True)
        grads = []
        for _ in range(4):
            y = ScaledSin.apply(ScaledSin.apply(x * 2, 1.5), 1.5)
            y.sum().backward()
            grads.append(x.grad.clone())
            x.grad = None
        return grads

    check_against_eager(fn, lambda gm: torch.compile(gm, backend=counting_backend))
    assert captures() == 1
    assert len(compiles) == 1


def inductor_backward_code(loss, x):
    """The Inductor code of loss's backward to x under the engine, after
    checking the gradient against eager's."""
    from torch._inductor.utils import run_and_get_code

    expected = torch.autograd.grad(loss, [x], retain_graph=True)[0]

    def backward():
        with compiled_autograd(dynamo_compiler("inductor")):
            return torch.autograd.grad(loss, [x])[0]

    actual, (code,) = run_and_get_code(backward)
    torch.testing.assert_close(actual, expected)
    return code


def test_function_backward_fuses_with_its_neighbours_under_inductor():
    """The Function's backward ops land in the same Inductor kernel as the
    pointwise ops around them: no separate call for the Function."""
    x = torch.randn(64, requires_grad=True)
    loss = (ScaledSin.apply(x.exp(), 1.5) * 2).tanh().sum()
    code = inductor_backward_code(loss, x)
    kernel_definitions = re.findall(r"^cpp_fused\w* = async_compile", code, flags=re.MULTILINE)
    assert len(kernel_definitions) == 1, code  # cos (the Function's backward), exp and tanh's backward
    assert ".cos()" in code or "std::cos" in code, code


class DropoutInBackward(torch.autograd.Function):
    """A backward that draws random numbers: dropout on the incoming gradient."""

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return torch.nn.functional.dropout(grad, 0.5, training=True) * 2


def _backward_drawing_random_numbers():
    x = torch.randn(256, requires_grad=True)
    DropoutInBackward.apply(x.exp()).sum().backward()
    # What the generator gives next: the backward drew as many numbers as eager's.
    return [x.grad, torch.rand(8)]


def test_random_draws_in_a_backward_match_eager(compiler):
    # Inductor draws random numbers with its own generator in every compiled
    # graph, as it does for a compiled forward; the tests' Inductor compiler
    # sets fallback_random, which makes it call eager's random ops.
    check_against_eager(_backward_drawing_random_numbers, compiler)


@torch.library.custom_op("pca_test::scaled_sin", mutates_args=())
def scaled_sin(x: torch.Tensor) -> torch.Tensor:
    return x.sin() * 2


@scaled_sin.register_fake
def _(x):
    return torch.empty_like(x)


def _setup_scaled_sin(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


def _scaled_sin_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return grad * x.cos() * 2


scaled_sin.register_autograd(_scaled_sin_backward, setup_context=_setup_scaled_sin)


def test_custom_op_with_registered_autograd(compiler):
    def fn():
        x = torch.randn(4, requires_grad=True)
        scaled_sin(x * 2).sum().backward()
        return [x.grad]

    check_against_eager(fn, compiler)


def small_mlp():
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))


def recording(compiler):
    """The compiler, and the graphs it was given."""
    graphs = []

    def record_and_compile(gm):
        graphs.append(gm)
        return compiler(gm)

    record_and_compile.bit_exact = bit_exact(compiler)
    return record_and_compile, graphs


@pytest.mark.parametrize("region_backend", ["aot_eager", "inductor"])
def test_backward_of_a_torch_compiled_region_is_inlined(compiler, region_backend):
    model = small_mlp()
    region = torch.compile(model, backend=region_backend)
    record_and_compile, graphs = recording(compiler)

    def fn():
        grads = []
        for batch in range(2, 5):
            (region(torch.randn(batch, 4)) * 2).sum().backward()
            grads += [p.grad for p in model.parameters()]
            model.zero_grad(set_to_none=True)
        return grads

    # Inductor's forward kernels may round differently from eager's.
    check_against_eager(fn, record_and_compile, exact=region_backend != "inductor")
    code = graphs[0].code
    assert "apply_eagerly" not in code and "self.CompiledFunctionBackward" in code, code


@pytest.mark.parametrize("region_backend", ["aot_eager", "inductor"])
def test_grads_through_a_channels_last_compiled_region_keep_eagers_layout(compiler, region_backend):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 3)
    ).to(memory_format=torch.channels_last)
    region = torch.compile(model, backend=region_backend)

    def fn():
        results = []
        for batch in (2, 3):
            x = torch.randn(batch, 3, 10, 10).to(memory_format=torch.channels_last).requires_grad_()
            region(x).pow(2).mean().backward()
            leaves = [x, *model.parameters()]
            results += [leaf.grad for leaf in leaves] + [torch.tensor(leaf.grad.stride()) for leaf in leaves]
            model.zero_grad(set_to_none=True)
        return results

    check_against_eager(fn, compiler, exact=region_backend != "inductor")


# An Inductor region's float32 forward is left out: eager autograd runs its
# backward as Inductor's code, which autocast does not reach, and the captured
# graph runs it under autocast (docs/design.md, *Known limits*).
@pytest.mark.parametrize(
    "region_backend, forward_in_autocast",
    [("aot_eager", False), ("aot_eager", True), ("inductor", True)],
)
def test_backward_of_a_compiled_region_called_inside_autocast_matches_eager(
    compiler, region_backend, forward_in_autocast
):
    """Eager autograd runs a backward called inside autocast under it (a
    float32 forward's gradients then come from bfloat16 matmuls); the
    region's backward, inlined into the captured graph, runs the same way."""
    model = small_mlp()
    region = torch.compile(model, backend=region_backend)

    def fn():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=forward_in_autocast):
            loss = region(torch.randn(8, 4)).float().pow(2).sum()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss.backward()
        grads = [p.grad for p in model.parameters()]
        model.zero_grad(set_to_none=True)
        return grads

    check_against_eager(fn, compiler, exact=region_backend != "inductor")


def test_backward_of_a_dynamic_shape_compiled_region(compiler):
    model = small_mlp()
    region = torch.compile(model, backend="aot_eager", dynamic=True)

    def fn():
        grads = []
        for batch in (3, 5, 7):
            region(torch.randn(batch, 4)).pow(2).sum().backward()
            grads += [p.grad for p in model.parameters()]
            model.zero_grad(set_to_none=True)
        return grads

    check_against_eager(fn, compiler)


def eager_and_cached_region_gradients(model, x, compiler):
    """The gradients of ``model(x).square().mean()`` with eager autograd, then
    through a new region (``torch.compile`` with dynamic shapes, after a Dynamo
    reset, as after a restart) whose compile hits AOTAutograd's cache, with
    compiled autograd on ``compiler``."""

    def gradients_through_a_fresh_region():
        model.zero_grad(set_to_none=True)
        torch.compile(model, backend="inductor", dynamic=True)(x).square().mean().backward()
        return [p.grad for p in model.parameters()]

    model(x).square().mean().backward()
    expected = [p.grad for p in model.parameters()]
    gradients_through_a_fresh_region()  # fills the cache
    torch._dynamo.reset()
    with compiled_autograd(compiler):
        actual = gradients_through_a_fresh_region()
    assert counters["aot_autograd"]["autograd_cache_hit"] == 1
    return expected, actual


def test_backward_of_a_compiled_region_loaded_from_aot_autograds_cache(monkeypatch, tmp_path):
    """A region compiled again after a restart gets its backward graph from
    AOTAutograd's cache, whose module keeps the graph's constant tensors
    (here from ReLU's backward, with dynamic shapes) as attributes that
    get_attr nodes read: the inlined copy takes them along."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    expected, actual = eager_and_cached_region_gradients(
        model, torch.randn(4, 4), dynamo_compiler("eager")
    )
    assert captures() == 1
    assert_same(expected, actual, exact=False)


def test_backward_of_a_region_aot_autograds_cache_cannot_hand_back_runs_as_itself(
    monkeypatch, tmp_path
):
    """Loading a region's backward graph from AOTAutograd's cache traces its
    code again with torch.fx, which fails in torch 2.13 on
    nn.MultiheadAttention's backward with dynamic shapes (an aten.full whose
    size list holds symbolic sizes; the legacy engine fails the backward).
    The region's backward runs as itself, with eager's gradients."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    record_and_compile, graphs = recording(dynamo_compiler("eager"))
    expected, actual = eager_and_cached_region_gradients(
        layer, torch.randn(2, 5, 8), record_and_compile
    )
    assert "apply_eagerly" in graphs[0].code, graphs[0].code
    assert_same(expected, actual, exact=False)


def test_compiled_region_backward_fuses_with_its_neighbours_under_inductor():
    """The region's backward (cos) and the pointwise backward around it
    (tanh's, exp's) compile into one Inductor kernel."""
    region = torch.compile(lambda x: x.sin() * 1.5, backend="inductor")
    x = torch.randn(64, requires_grad=True)
    loss = (region(x.exp()) * 2).tanh().sum()
    code = inductor_backward_code(loss, x)
    kernel_definitions = re.findall(r"^cpp_fused\w* = async_compile", code, flags=re.MULTILINE)
    assert len(kernel_definitions) == 1, code
    assert ".cos()" in code or "std::cos" in code, code


def test_compiled_region_with_tensor_subclass_runs_opaquely(compiler):
    from torch.testing._internal.two_tensor import TwoTensor

    region = torch.compile(lambda x: (x * x).sin(), backend="aot_eager")
    record_and_compile, graphs = recording(compiler)

    def fn():
        x = TwoTensor(torch.randn(4), torch.randn(4)).requires_grad_()
        region(x).sum().backward()
        return [x.grad.a, x.grad.b]

    check_against_eager(fn, record_and_compile)
    assert "apply_eagerly" in graphs[0].code


def test_node_run_eagerly_under_fullgraph_says_what_to_do():
    from torch.testing._internal.two_tensor import TwoTensor

    region = torch.compile(lambda x: (x * x).sin(), backend="aot_eager")
    x = TwoTensor(torch.randn(4), torch.randn(4)).requires_grad_()
    loss = region(x).sum()
    fullgraph = lambda gm: torch.compile(gm, backend="eager", fullgraph=True)  # noqa: E731
    with pytest.raises(Exception, match="without fullgraph=True.*compiled_autograd_engine"):
        with compiled_autograd(fullgraph):
            loss.backward()


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_activation_checkpointing_recomputes_and_captures_once(compiler, use_reentrant):
    forward_calls = []

    def fn():
        model = small_mlp()

        def counted_model(x):
            forward_calls.append(1)
            return model(x)

        x = torch.randn(3, 4, requires_grad=True)
        grads = []
        for _ in range(3):
            checkpoint(counted_model, x, use_reentrant=use_reentrant).sum().backward()
            grads += [x.grad] + [p.grad for p in model.parameters()]
            x.grad = None
            model.zero_grad()
        return grads

    check_against_eager(fn, compiler)
    assert len(forward_calls) == 2 * 2 * 3  # forward + recomputation, eager and compiled, 3 steps
    # The reentrant form runs a nested backward of the recomputed forward
    # inside the checkpoint's backward: it runs eagerly (the engine is off
    # while a captured graph runs), so each form captures one graph.
    assert captures() == 1


def test_selective_activation_checkpointing(compiler):
    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op == torch.ops.aten.mm.default else CheckpointPolicy.PREFER_RECOMPUTE

    def fn():
        model = small_mlp()
        x = torch.randn(3, 4, requires_grad=True)
        context_fn = functools.partial(create_selective_checkpoint_contexts, policy)
        checkpoint(model, x, use_reentrant=False, context_fn=context_fn).sum().backward()
        return [x.grad] + [p.grad for p in model.parameters()]

    check_against_eager(fn, compiler)


class CausalAttention(torch.autograd.Function):
    """Attention with a hand-written backward, as a GPT-2 block would use."""

    @staticmethod
    def forward(ctx, q, k, v):
        scale = q.shape[-1] ** -0.5
        scores = (q @ k.transpose(-2, -1)) * scale
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        probs = scores.masked_fill(~mask, float("-inf")).softmax(-1)
        ctx.save_for_backward(q, k, v, probs)
        ctx.scale = scale
        return probs @ v

    @staticmethod
    def backward(ctx, grad):
        q, k, v, probs = ctx.saved_tensors
        grad_v = probs.transpose(-2, -1) @ grad
        grad_probs = grad @ v.transpose(-2, -1)
        grad_scores = probs * (grad_probs - (grad_probs * probs).sum(-1, keepdim=True))
        grad_q = grad_scores @ k * ctx.scale
        grad_k = grad_scores.transpose(-2, -1) @ q * ctx.scale
        return grad_q, grad_k, grad_v


class Block(torch.nn.Module):
    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.qkv, self.proj = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        attention = CausalAttention.apply(q, k, v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(attention)
        return x + self.mlp(self.ln2(x))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_gpt2_style_block_with_custom_attention_trains_like_eager(backend):
    def train(compiled):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Embedding(50, 32), Block(), Block(), torch.nn.Linear(32, 50))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        tokens = torch.randint(0, 50, (4, 12))
        losses = []
        for _ in range(5):
            optimizer.zero_grad(set_to_none=True)
            logits = model(tokens[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 50), tokens[:, 1:].reshape(-1))
            if compiled:
                with compiled_autograd(dynamo_compiler(backend)):
                    loss.backward()
            else:
                loss.backward()
            optimizer.step()
            losses.append(loss.item())
        return losses

    eager_losses = train(False)
    compiled_losses = train(True)
    np.testing.assert_allclose(compiled_losses, eager_losses, rtol=0, atol=1e-5)
    assert counters["compiled_autograd"]["captures"] == 1


def hooked_region(x, scale):
    y = x.sin()
    shift = y + 1
    y.register_hook(lambda grad: grad * scale + shift)
    return y.sin()


def test_compiled_region_with_hooks_on_intermediates_runs_them_in_the_graph(compiler):
    """Compiled while compiled autograd is on, Dynamo moves the hook into a
    BackwardState that only the captured graph can bind (the region's
    backward asserts when run as itself): the graph passes it to the
    region's backward. Compared with the same code run eagerly."""
    region = torch.compile(hooked_region, backend="aot_eager")
    scale = torch.tensor(3.0)
    x = torch.randn(4, requires_grad=True)
    hooked_region(x, scale).sum().backward()
    y = x.detach().clone().requires_grad_()
    record_and_compile, graphs = recording(compiler)
    with compiled_autograd(record_and_compile):
        region(y, scale).sum().backward()
    assert_same([y.grad], [x.grad], exact=bit_exact(compiler))
    assert "apply_eagerly" not in graphs[0].code


def test_compiled_region_with_hooks_on_intermediates_that_cannot_inline_says_what_to_do():
    # Saved-tensor hooks make the region's backward run as itself, which a
    # BackwardState forbids: refused with what to do, and the engine stays usable.
    region = torch.compile(hooked_region, backend="aot_eager")

    def scaled_sin():
        x = torch.randn(4, requires_grad=True)
        ScaledSin.apply(x, 2.0).sum().backward()
        return [x.grad]

    with compiled_autograd(dynamo_compiler("aot_eager")):
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            loss = region(torch.ones(4, requires_grad=True), torch.tensor(2.0)).sum()
        with pytest.raises(RuntimeError, match="compiled_autograd_engine = 'legacy'"):
            loss.backward()
    check_against_eager(scaled_sin, dynamo_compiler("aot_eager"))
