"""Dynamo's cost of tracing a captured graph, which grows with its size
(patches/0014, patches/0015): a guard installed again is held once, and
retracing a GraphModule reads its nodes' meta once per code object, while
keeping what it copies from that meta as before.

Both were quadratic in the graph's size: every read of the same global (the
graph calls the engine's functions through one module global) added one more
guard under the same hash, and every node Dynamo created from the graph's code
rebuilt a list of all the graph's nodes. The first backward of a 6,000-node
chain took 155 s with backend="eager" before, 40 s after (docs/performance.md);
times are measured there, not asserted here."""

import operator

import torch
from torch._dynamo.guards import GuardBuilder
from torch._dynamo.source import GlobalSource
from torch._guards import GuardsSet


def test_a_guard_installed_again_is_held_once():
    guards = GuardsSet()
    for _ in range(3):
        guards.add(GlobalSource("torch").make_guard(GuardBuilder.ID_MATCH))
    guards.add(GlobalSource("torch").make_guard(GuardBuilder.TYPE_MATCH))
    assert len(guards) == 2
    assert all(guard.user_stack is not None for guard in guards)


@torch.fx.wrap
def doubled(value):
    return value * 2


def test_retracing_a_graph_module_copies_each_nodes_meta_around_inlined_calls():
    graph_module = torch.fx.symbolic_trace(lambda x: doubled(x.sin()).cos())
    for node in graph_module.graph.nodes:
        node.meta["custom"] = {"original": node.name}
    traced = []

    def backend(gm, example_inputs):
        traced.append(gm)
        return gm

    x = torch.randn(4)
    torch.testing.assert_close(torch.compile(graph_module, backend=backend)(x), (x.sin() * 2).cos())
    (dynamo_graph,) = traced
    copied = {
        node.target: node.meta.get("custom")
        for node in dynamo_graph.graph.nodes
        if node.op in ("call_function", "call_method")
    }
    # sin and cos come from the graph's own code, before and after Dynamo
    # inlines doubled; the multiplication comes from doubled's code.
    assert copied == {"sin": {"original": "sin"}, operator.mul: None, "cos": {"original": "cos"}}
