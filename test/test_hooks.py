"""Every kind of hook behaves as in eager: same values, same call order, same
side effects, under every compiler of helpers.COMPILERS (no Dynamo, Dynamo's
eager backend, aot_eager and Inductor)."""

import pytest
import torch

from helpers import COMPILERS, captures, check_against_eager, compiled_autograd


def assert_raises_eagers_error(backward, compiler):
    """``backward`` raises under compiled autograd what it raises eagerly:
    the same type, and eager's message."""
    with pytest.raises(Exception) as eager_error:
        backward()
    with compiled_autograd(compiler), pytest.raises(Exception) as compiled_error:
        backward()
    assert type(compiled_error.value) is type(eager_error.value)
    assert str(eager_error.value) in str(compiled_error.value)


@pytest.fixture(params=sorted(COMPILERS))
def compiler(request):
    return COMPILERS[request.param]


def test_hook_calling_item_graph_breaks_and_runs(compiler):
    def fn():
        x = torch.randn(3, requires_grad=True)
        y = x * 2
        seen = []
        y.register_hook(lambda g: seen.append(g.sum().item()) or g * 2)
        y.sum().backward()
        return [x.grad, torch.tensor(seen)]

    check_against_eager(fn, compiler)


def test_hook_through_numpy(compiler):
    def fn():
        x = torch.randn(3, requires_grad=True)
        y = x * 2
        y.register_hook(lambda g: torch.from_numpy(g.numpy() * 3))
        y.sum().backward()
        return [x.grad]

    check_against_eager(fn, compiler)


def test_retain_grad_on_intermediate_and_on_the_root(compiler):
    def fn():
        x = torch.randn(3, requires_grad=True)
        y = x * 2
        y.retain_grad()
        z = y.sin()
        z.retain_grad()
        z.sum().backward()
        return [x.grad, y.grad, z.grad]

    check_against_eager(fn, compiler)


def test_optimizer_step_in_post_accumulate_grad_hook(compiler):
    def fn():
        model = torch.nn.Linear(4, 3)
        optimizers = {p: torch.optim.SGD([p], lr=0.1) for p in model.parameters()}

        def step_in_backward(p):
            optimizers[p].step()
            optimizers[p].zero_grad()

        for p in model.parameters():
            p.register_post_accumulate_grad_hook(step_in_backward)
        for _ in range(2):
            model(torch.ones(2, 4)).sum().backward()
        return [p.detach().clone() for p in model.parameters()] + [p.grad for p in model.parameters()]

    check_against_eager(fn, compiler)


def test_sgd_step_in_post_accumulate_grad_hook(compiler):
    """The hook's update ``p + (-lr) * grad`` has the weight gradient's matmul
    as its operand: Inductor fused it into one addmm and dropped the -lr
    (patches/0016), so every weight moved by +grad."""

    def fn():
        model = torch.nn.Linear(4, 4)

        def sgd_step(p):
            with torch.no_grad():
                p.add_(p.grad, alpha=-0.1)
            p.grad = None

        for p in model.parameters():
            p.register_post_accumulate_grad_hook(sgd_step)
        x = torch.randn(3, 4)
        for _ in range(3):
            model(x).pow(2).sum().backward()
        return [p.detach().clone() for p in model.parameters()]

    check_against_eager(fn, compiler)


def test_removing_a_hook_changes_the_captured_graph():
    def fn():
        x = torch.randn(3, requires_grad=True)
        grads = []
        for i in range(3):
            y = x * 2
            handle = y.register_hook(lambda g: g * 3)
            if i != 1:
                handle.remove()
            y.sum().backward()
            grads.append(x.grad.clone())
            x.grad = None
        return grads

    check_against_eager(fn)
    assert captures() == 2


@pytest.mark.parametrize(
    "bad_hook",
    [lambda g: torch.ones(5), lambda g: g.double(), lambda g: "not a tensor"],
    ids=["size", "dtype", "type"],
)
def test_hook_returning_a_bad_value_raises_eagers_error(compiler, bad_hook):
    def backward_with_bad_hook():
        x = torch.randn(3, requires_grad=True)
        y = x * 2
        y.register_hook(bad_hook)
        y.sum().backward()

    assert_raises_eagers_error(backward_with_bad_hook, compiler)


NODE_HOOK_BAD_RESULTS = {
    "post_hook_list": ("post", lambda grad_inputs, grad_outputs: list(grad_inputs)),
    "post_hook_too_few": ("post", lambda grad_inputs, grad_outputs: grad_inputs[:1]),
    "post_hook_not_a_tensor": ("post", lambda grad_inputs, grad_outputs: ("x", None)),
    "post_hook_size": ("post", lambda grad_inputs, grad_outputs: (torch.ones(5), None)),
    "post_hook_dtype": ("post", lambda grad_inputs, grad_outputs: (grad_inputs[0].double(), None)),
    "post_hook_value_for_none": ("post", lambda grad_inputs, grad_outputs: (grad_inputs[0], torch.ones(()))),
    "pre_hook_list": ("pre", lambda grad_outputs: list(grad_outputs)),
    "pre_hook_too_many": ("pre", lambda grad_outputs: grad_outputs * 2),
    "pre_hook_size": ("pre", lambda grad_outputs: (torch.ones(2),)),
}


@pytest.mark.parametrize("case", sorted(NODE_HOOK_BAD_RESULTS))
def test_node_hook_returning_a_bad_value_raises_eagers_error(compiler, case):
    kind, bad_hook = NODE_HOOK_BAD_RESULTS[case]

    def backward_with_bad_hook():
        x = torch.randn(3, requires_grad=True)
        y = x * 2  # MulBackward0: gradients for x and for the constant (None)
        z = y.exp()
        if kind == "post":
            y.grad_fn.register_hook(bad_hook)
        else:
            z.grad_fn.register_prehook(bad_hook)
        z.sum().backward()

    assert_raises_eagers_error(backward_with_bad_hook, compiler)


def test_saved_tensor_hooks_unpack_in_the_graph(compiler):
    def fn():
        x = torch.randn(4, requires_grad=True)
        packed, unpacked = [], []

        def pack(t):
            packed.append(t.shape)
            return t * 2  # what backward sees is what unpack returns

        def unpack(t):
            unpacked.append(t.shape)
            return t / 2

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            y = x.sin() * x
        y.sum().backward()
        return [x.grad, torch.tensor(len(packed)), torch.tensor(len(unpacked))]

    check_against_eager(fn, compiler)
    assert captures() == 1


def test_save_on_cpu(compiler):
    def fn():
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        with torch.autograd.graph.save_on_cpu():
            loss = model(torch.randn(3, 4)).sum()
        loss.backward()
        return [p.grad for p in model.parameters()]

    check_against_eager(fn, compiler)


def test_hooks_with_side_effects(compiler):
    def fn():
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
        seen, accumulated = [], []
        x = torch.randn(3, 4)
        hidden = model[1](model[0](x))
        hidden.register_hook(lambda g: seen.append(g.clone()) or g * 2)
        for p in model.parameters():
            p.register_post_accumulate_grad_hook(lambda p: accumulated.append(p.grad.clone()))
        model[2](hidden).sum().backward()
        return [p.grad for p in model.parameters()] + seen + accumulated

    check_against_eager(fn, compiler)


@pytest.mark.parametrize("mode", ["all", "any"])
def test_multi_grad_hook(compiler, mode):
    def fn():
        a, b, unused = (torch.randn(4, requires_grad=True) for _ in range(3))
        seen = []

        def hook(grads):
            grads = grads if mode == "all" else [grads]
            seen.extend(torch.zeros(()) if g is None else g.clone() for g in grads)

        torch.autograd.graph.register_multi_grad_hook((a, b, unused), hook, mode=mode)
        (a.sin() * b).sum().backward()
        return [a.grad, b.grad, unused.grad, *seen]

    check_against_eager(fn, compiler)


def test_module_full_backward_hooks(compiler):
    def fn():
        model = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))
        seen = []
        model[0].register_full_backward_hook(lambda module, grad_in, grad_out: seen.append(grad_out[0].clone()))
        model[2].register_full_backward_pre_hook(lambda module, grad_out: (grad_out[0] * 2,))
        x = torch.randn(3, 4, requires_grad=True)
        model(x).sum().backward()
        return [x.grad, *(p.grad for p in model.parameters()), *seen]

    check_against_eager(fn, compiler)


def test_a_hook_turning_off_requires_grad_of_a_leaf_yet_to_accumulate_skips_it(compiler):
    def fn():
        w1 = torch.randn(3, requires_grad=True)
        w2 = torch.randn(3, requires_grad=True)
        kept = []
        w2.register_post_accumulate_grad_hook(lambda p: kept.append(p.grad))
        y = ((w1 * 2).sum() + (w2.exp() * 3).sum()) * 1

        def turn_off_w2(grad):
            w2.requires_grad_(False)

        y.register_hook(turn_off_w2)
        y.backward()
        return [w1.grad, w2.grad, torch.tensor([g is None for g in kept])]

    check_against_eager(fn, compiler)


def register_on_intermediate(x, y):
    y.register_hook(lambda g: g * 10)


def register_on_intermediate_with_a_hook(x, y):
    register_on_intermediate(x, y)


def register_on_leaf(x, y):
    x.register_hook(lambda g: g * 10)


def scale_grad_by_ten(p):
    p.grad.mul_(10)


def register_post_accumulate_grad_hook(x, y):
    x.register_post_accumulate_grad_hook(scale_grad_by_ten)


@pytest.mark.parametrize(
    "register",
    [
        register_on_intermediate,
        register_on_intermediate_with_a_hook,
        register_on_leaf,
        register_post_accumulate_grad_hook,
    ],
    ids=lambda register: register.__name__,
)
def test_a_hook_registering_a_hook_on_a_node_yet_to_run_raises_rather_than_skip_it(
    compiler, register
):
    # Eager runs the new hook (x.grad 60 here); the captured graph could only
    # run the hooks registered when the backward started (x.grad 6).
    def backward():
        x = torch.randn(3, requires_grad=True)
        y = x * 2
        if register is register_on_intermediate_with_a_hook:
            y.register_hook(lambda g: g + 1)
        z = y * 3
        z.register_hook(lambda g: register(x, y) or g)
        z.sum().backward()
        return [x.grad]

    with compiled_autograd(compiler):
        with pytest.raises(RuntimeError, match="a hook was registered on .* while this backward ran"):
            backward()


def test_a_hook_replacing_a_hook_of_a_node_yet_to_run_raises(compiler):
    # One hook removed and one registered leave the node's count as it was.
    def backward():
        x = torch.randn(3, requires_grad=True)
        y = x * 2
        handle = y.register_hook(lambda g: g + 1)
        z = y * 3

        def replace(g):
            handle.remove()
            y.register_hook(lambda g: g * 10)

        z.register_hook(replace)
        z.sum().backward()

    with compiled_autograd(compiler):
        with pytest.raises(RuntimeError, match="a hook was registered on .* while this backward ran"):
            backward()


def test_a_hook_removing_itself_after_it_ran_runs_as_in_eager(compiler):
    def fn():
        x = torch.randn(3, requires_grad=True)
        grads = []
        handles = []

        def once(g):
            handles.pop().remove()
            return g * 3

        for _ in range(2):
            y = x * 2
            handles.append(y.register_hook(once))
            (y * y).sum().backward()
            grads.append(x.grad.clone())
        return grads

    check_against_eager(fn, compiler)


# Hooks that must not run: each would scale gradients by 100.
def times_100(grad):
    return grad * 100


def each_times_100(grads, *seen):
    return tuple(g * 100 for g in grads)


def grad_times_100(leaf):
    leaf.grad.mul_(100)


class RemovingBackward(torch.autograd.Function):
    """Identity whose backward removes ``handle``."""

    @staticmethod
    def forward(ctx, x, handle):
        ctx.handle = handle
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        ctx.handle.remove()
        return grad, None


def removed_by_a_hook_of_z(register):
    """Builds x -> y = x * 2 -> z = y * 3 (z's node runs first, x's
    AccumulateGrad last) with ``register(x, y)``'s hook, one that must not
    run, removed by a hook of z; returns the loss."""

    def build_loss(x):
        y = x * 2
        handle = register(x, y)
        z = y * 3
        z.register_hook(lambda g: handle.remove())
        return z.sum()

    return build_loss


def post_hook_of_the_node_whose_tensor_hook_removes_it(x):
    y = x * 2
    handle = y.grad_fn.register_hook(each_times_100)
    y.register_hook(lambda g: handle.remove())
    return (y * 3).sum()


def by_a_functions_backward(x):
    y = x * 2
    handle = y.register_hook(times_100)
    return RemovingBackward.apply(y * 3, handle).sum()


def one_of_two_tensors_sharing_the_hook(x):
    y1 = x * 2
    y2 = x * 3
    handle = y1.register_hook(times_100)
    y2.register_hook(times_100)
    z = y1 + y2
    z.register_hook(lambda g: handle.remove())
    return z.sum()


def the_second_of_two_registrations_on_y(x, y):
    y.register_hook(times_100)
    y.register_hook(lambda g: g + 1)
    return y.register_hook(times_100)


def by_a_hook_of_a_backward_that_a_hook_runs(x):
    y = x * 2
    handle = y.register_hook(times_100)
    a = torch.ones(2, requires_grad=True)
    b = a * 5
    b.register_hook(lambda g: handle.remove())
    b_sum = b.sum()
    z = y * 3
    z.register_hook(lambda g: torch.autograd.grad(b_sum, a) and None)
    return z.sum()


# Each builds a graph from x with a hook that must not run, and a hook or a
# Function that removes it while the backward runs; returns the loss.
REMOVED_BEFORE_THEIR_TURN = {
    "intermediate_tensor_hook": removed_by_a_hook_of_z(lambda x, y: y.register_hook(times_100)),
    "leaf_tensor_hook": removed_by_a_hook_of_z(lambda x, y: x.register_hook(times_100)),
    "node_pre_hook": removed_by_a_hook_of_z(lambda x, y: y.grad_fn.register_prehook(each_times_100)),
    "node_post_hook": removed_by_a_hook_of_z(lambda x, y: y.grad_fn.register_hook(each_times_100)),
    "post_accumulate_grad_hook": removed_by_a_hook_of_z(
        lambda x, y: x.register_post_accumulate_grad_hook(grad_times_100)
    ),
    "post_hook_of_the_node_whose_tensor_hook_removes_it": post_hook_of_the_node_whose_tensor_hook_removes_it,
    "by_a_functions_backward": by_a_functions_backward,
    "one_of_two_tensors_sharing_the_hook": one_of_two_tensors_sharing_the_hook,
    "one_of_two_registrations_on_one_tensor": removed_by_a_hook_of_z(the_second_of_two_registrations_on_y),
    "by_a_hook_of_a_backward_that_a_hook_runs": by_a_hook_of_a_backward_that_a_hook_runs,
}


@pytest.mark.parametrize(
    "removed", list(REMOVED_BEFORE_THEIR_TURN.values()), ids=list(REMOVED_BEFORE_THEIR_TURN)
)
def test_a_hook_removed_before_its_nodes_turn_does_not_run(compiler, removed):
    # Eager reads a node's hooks when the node's turn comes (x.grad 6 here);
    # the captured graph lifted the hook when the backward started (600).
    check_against_eager(lambda: grads_of_three_backwards(removed), compiler)


def by_an_earlier_hook_of_its_tensor(x):
    z = x * 2
    handles = []
    z.register_hook(lambda g: handles.pop().remove())
    handles.append(z.register_hook(times_100))
    return z.sum()


def after_its_node_ran(x):
    y = x * 2
    z = y * 3
    handle = z.register_hook(times_100)
    y.register_hook(lambda g: handle.remove())
    return z.sum()


@pytest.mark.parametrize(
    "removed", [by_an_earlier_hook_of_its_tensor, after_its_node_ran], ids=lambda removed: removed.__name__
)
def test_a_hook_removed_once_its_nodes_turn_came_runs_as_in_eager(compiler, removed):
    # Eager reads a node's hooks once, before calling the first: a hook that
    # an earlier hook of its tensor removes still runs.
    check_against_eager(lambda: grads_of_three_backwards(removed), compiler)


def grads_of_three_backwards(build_loss):
    """x.grad of each of three backwards of ``build_loss(x)``, which
    registers its hooks anew each time."""
    x = torch.ones(3, requires_grad=True)
    grads = []
    for _ in range(3):
        build_loss(x).backward()
        grads.append(x.grad.clone())
        x.grad = None
    return grads


@torch._dynamo.disable
def record_compiled_autograd_flags(seen):
    from torch._dynamo import compiled_autograd as frontend

    seen.append((frontend.compiled_autograd_enabled, frontend.active_disable_ctx))


def test_compiled_autograd_is_off_in_every_hook_of_a_running_graph(compiler):
    # AOTAutograd and Inductor compile the graph's frames inside
    # compiled_autograd._disable(), whose exit used to turn it back on for
    # the rest of the run (patches/0018).
    x = torch.ones(3, requires_grad=True)
    seen = []
    y = x * 2
    y.register_hook(lambda g: record_compiled_autograd_flags(seen))
    z = y * 3
    z.register_hook(lambda g: record_compiled_autograd_flags(seen))
    with compiled_autograd(compiler):
        z.sum().backward()
    assert seen == [(False, True), (False, True)]


def test_a_hook_running_a_backward_of_an_intermediate_with_a_hook(compiler):
    # The inner backward runs eagerly. When compiled autograd was wrongly on
    # (above), Dynamo moved the inner hook into a BackwardState, which only
    # a captured graph can run: "BackwardState requires CompiledAutograd".
    def fn():
        x = torch.ones(3, requires_grad=True)
        inner_grads = []

        def run_a_backward(g):
            with torch.enable_grad():
                a = torch.ones(2, requires_grad=True)
                b = a * 5
                b.register_hook(lambda g: g * 2)
                inner_grads.append(torch.autograd.grad(b.sum(), a)[0])

        for _ in range(2):
            z = x * 2 * 3
            z.register_hook(run_a_backward)
            z.sum().backward()
        return [x.grad] + inner_grads

    check_against_eager(fn, compiler)


FULLGRAPH_COMPILERS = {
    "no_dynamo": COMPILERS["no_dynamo"],
    # Dynamo traces queue_callback only with fullgraph=True (its own assertion
    # says so otherwise, on both engines).
    "eager": lambda gm: torch.compile(gm, backend="eager", fullgraph=True),
    "aot_eager": lambda gm: torch.compile(gm, backend="aot_eager", fullgraph=True),
}


@pytest.mark.parametrize("compiler_name", sorted(FULLGRAPH_COMPILERS))
def test_callbacks_queued_by_a_hook_run_after_the_backward(compiler_name):
    def fn():
        x = torch.randn(3, requires_grad=True)
        seen = []

        def queue(g):
            torch.autograd.Variable._execution_engine.queue_callback(
                lambda: seen.append(x.grad.sum())
            )
            return g * 2

        y = x.exp()
        y.register_hook(queue)
        y.sum().backward()
        return [x.grad, torch.stack(seen)]

    check_against_eager(fn, FULLGRAPH_COMPILERS[compiler_name])


def test_a_hook_registered_from_a_queued_callback_runs_in_the_next_backward():
    def fn():
        x = torch.randn(3, requires_grad=True)

        def register_after_backward(g):
            torch.autograd.Variable._execution_engine.queue_callback(
                lambda: x.register_hook(lambda g: g * 5)
            )
            return g

        y = x.exp()
        y.register_hook(register_after_backward)
        y.sum().backward()
        first = x.grad.clone()
        (x * 2).sum().backward()
        return [first, x.grad]

    check_against_eager(fn)


class GradientNone(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return None


class Holder:
    grad = None


def kept_in_a_list():
    kept = []
    return kept.append, lambda: kept[0]


def kept_in_a_dict():
    kept = {}
    return lambda grad: kept.update(grad=grad), lambda: kept["grad"]


def kept_as_an_attribute():
    kept = Holder()
    return lambda grad: setattr(kept, "grad", grad), lambda: kept.grad


@pytest.mark.parametrize(
    "keeper", [kept_in_a_list, kept_in_a_dict, kept_as_an_attribute], ids=lambda k: k.__name__
)
def test_a_post_accumulate_grad_hook_keeping_a_grad_the_backward_left_unchanged(compiler, keeper):
    # The hook runs although no gradient arrived, and what it keeps is the
    # parameter's .grad as it was: Dynamo rebuilds the container after the
    # graph from the parameter, an item of the input list the graph empties
    # (patches/0013).
    def fn():
        w = torch.randn(3, requires_grad=True)
        w.grad = torch.ones(3)
        keep, kept = keeper()
        w.register_post_accumulate_grad_hook(lambda p: keep(p.grad))
        GradientNone.apply(w).sum().backward()
        return [w.grad, kept(), torch.tensor([kept() is w.grad])]

    check_against_eager(fn, compiler)
