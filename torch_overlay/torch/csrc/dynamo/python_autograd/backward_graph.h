#pragma once

// The autograd graph of one backward call, as the Python engine sees it:
// the nodes in the order the eager engine would run them, and for each node
// the values lifted out of its saved state (tensors, sizes, scalars, hooks).
//
// Collection runs libtorch's own visitor, Node::compiled_args, on every node
// with an AutogradCompilerCall of the node's own. A private call per node is
// what lets us hand each node exactly its own saved values later: the shared
// call of the legacy engine de-duplicates tensors across nodes and keeps no
// record of which node used which tensor.

#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/dynamo/compiled_autograd.h>

#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace torch::dynamo::python_autograd {

using torch::autograd::GraphTask;
using torch::autograd::Node;
using torch::autograd::variable_list;
using torch::dynamo::autograd::AutogradCompilerCall;
using torch::dynamo::autograd::NodeCall;
using torch::dynamo::autograd::TensorArg;

// How the captured graph runs a node.
enum class NodeKind : uint8_t {
  // apply_with_saved in the graph: Dynamo and AOTAutograd trace through it.
  kApplyWithSaved = 0,
  // A C++ torch::autograd::Function with is_traceable = false, or a built-in
  // node whose formula reads saved values on the host: applied with its
  // saved values, behind a Dynamo graph break.
  kApplyWithSavedDynamoDisabled = 1,
  // The node itself runs, behind a graph break: a Python autograd.Function
  // the graph cannot call, or a C++ node without compiled_args.
  kEager = 2,
  // AccumulateGrad: torch.ops.inductor.accumulate_grad_ on the variable.
  kAccumulateGrad = 3,
  // A Python autograd.Function: its backward is called in the graph (with
  // the ctx's saved tensors lifted), so Dynamo traces it.
  kPythonFunction = 4,
  // The backward of a region compiled with torch.compile (AOTAutograd's
  // CompiledFunction): its backward graph is called in the graph, so Dynamo
  // and AOTAutograd trace it with the rest.
  kAotBackward = 5,
};

// One tensor pre-hook call, in the order the eager engine makes them.
struct TensorPreHook {
  bool is_python; // Python hook (index into hooks) or C++ hook (index into
                  // the node's own call->cpp_tensor_pre_hooks)
  int index;
  int input_nr;
};

// Hands a node's AutogradCompilerCall back, emptied, to a per-thread pool
// that the next backward's collection takes calls from. Most of what a call
// costs is allocating its maps and vectors; an emptied call keeps their
// capacity.
struct RecycleCall {
  void operator()(AutogradCompilerCall* call) const noexcept;
};
using PooledCall = std::unique_ptr<AutogradCompilerCall, RecycleCall>;

// The functions a Python hook object (a Tensor's, a Node's pre- or
// post-hooks, a leaf's post-accumulate-grad hooks) keeps in a dict, lifted
// into consecutive hook indices in the dict's order. A handle's remove()
// names the dict and key; the eager engine reads each dict when its node's
// turn comes (see skip_hook_removed_before_its_turn).
struct LiftedHookDict {
  PyObject* dict; // borrowed: owned by the hook object the node owns
  int begin; // index of the first function: the node's own index until the
             // node's hooks join BackwardGraph::hooks, then the global one
  std::vector<c10::SafePyObject> keys;
};

struct NodeRecord {
  c10::intrusive_ptr<Node> node;
  // Owns what compiled_args collected for this node alone; kept alive until
  // the backward ends because SwapSavedVariables looks saved values up in it.
  PooledCall call;
  NodeCall* node_call = nullptr; // lives inside call->node_calls
  NodeKind kind = NodeKind::kApplyWithSaved;
  // false: the node only captures a gradient for autograd.grad (exec_info).
  bool needed = true;

  // The node's tensors, in the order compiled_args collected them: where
  // SwapSavedVariables looks for their replacements (in `call`), and their
  // global index into BackwardGraph::tensors. The call itself keeps no
  // reference to them once collection is over (see detach_saved_values).
  std::vector<TensorArg*> tensor_args;
  std::vector<uint32_t> tensor_ids;
  // [sizes_begin, edge_sizes_begin): sizes from compiled_args;
  // [edge_sizes_begin, sizes_end): shapes of the next edges' input metadata.
  uint32_t sizes_begin = 0;
  uint32_t edge_sizes_begin = 0;
  uint32_t sizes_end = 0;
  uint32_t scalars_begin = 0;
  uint32_t scalars_end = 0;

  std::vector<TensorPreHook> tensor_pre_hooks;
  std::vector<int> pre_hooks; // global hook indices
  std::vector<int> post_hooks;
  std::vector<int> post_acc_grad_hooks;
  // Saved variables with saved-tensor hooks, by the node's packed input id:
  // (global index of the unpack hook, global index of the packed data).
  std::vector<std::pair<int, int>> unpack_hooks;
  std::vector<LiftedHookDict> hook_dicts;
  // Per next edge: (position of the target node, input_nr), or nullopt when
  // the edge is invalid or its target does not run in this backward.
  std::vector<std::optional<std::pair<int, int>>> next_edges;
  // (input_nr, output index) of gradients returned by autograd.grad.
  std::vector<std::pair<int, int>> captures;

  // kPythonFunction and kAotBackward: the ctx (an index into hooks), and for
  // each of its saved variables the position in tensor_args, or -1 for a
  // saved None.
  int python_ctx = -1;
  // kAotBackward of a region whose hooks on intermediates Dynamo moved into
  // a BackwardState: that object (an index into hooks), or -1.
  int backward_state = -1;
  std::vector<int> saved_layout;

  // registered_hooks(*node) when the graph was collected: the captured graph
  // runs these hooks, so one registered while it runs would not run.
  size_t hooks_registered = 0;
  // How many of those were removed while the graph ran.
  size_t hooks_removed = 0;
};

struct BackwardGraph {
  std::vector<NodeRecord> nodes; // eager execution order
  // Everything the captured graph specializes on; equal keys mean the same
  // captured graph runs correctly on both backwards.
  std::string key;
  // Where each node's part of `key` ends, to explain cache misses.
  std::vector<size_t> node_key_ends;
  std::vector<at::Tensor> tensors; // de-duplicated across nodes
  std::vector<int64_t> sizes;
  std::vector<c10::IValue> scalars;
  std::vector<c10::SafePyObject> hooks;
  // What saved-tensor pack hooks returned, for the unpack hooks.
  std::vector<c10::SafePyObject> packed_data;
  size_t num_outputs = 0;
  // While the captured graph runs: the list it reads the hooks from, whose
  // last item is [index of the hook the graph called last] (call_hook).
  PyObject* running_hooks = nullptr;
};

// Why a backward cannot run on the Python engine; it runs on the eager engine.
struct Unsupported {
  std::string reason;
  // true when collecting the graph raised an error that the eager engine may
  // raise itself (a saved tensor modified in place, a graph already freed):
  // the fallback warns only once eager has run the backward without
  // raising. Otherwise (e.g. a C++ hook that refuses compiled autograd, such
  // as DDP's C++ reducer) the user would get no word of the fallback.
  bool eager_may_raise = false;
};

// A backward that neither this engine nor the eager engine can run: raised
// to the user as a RuntimeError that says what to do.
struct UnrunnableBackward : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Walks the graph from root the way Engine::execute would for this graph
// task and collects every node that runs. Returns Unsupported instead when a
// node uses something the Python engine does not handle yet.
std::variant<BackwardGraph, Unsupported> collect_backward_graph(
    const c10::intrusive_ptr<Node>& root,
    const GraphTask& graph_task,
    bool accumulate_grad,
    size_t num_outputs);

// Leaves BackwardGraph::tensors as the only owner of the lifted tensors, so
// that whoever consumes that list frees them as it goes: drops the per-node
// calls' references and, unless the graph is retained, the data of the saved
// variables of nodes that the graph applies with substituted values (their
// structure stays, so apply_with_saved still finds and swaps them; the nodes
// are released for good after the backward).
void detach_saved_values(BackwardGraph& graph, bool keep_graph);

// How many hook functions are registered on `node` now (tensor pre-hooks,
// retain_grad's, pre-, post- and post-accumulate-grad hooks). GIL held.
size_t registered_hooks(Node& node);

// C++ torch::autograd::Function nodes (CppNode<T>) announce whether they are
// traceable only while being applied; see classify_custom_functions().
bool is_cpp_custom_function(const Node& node);
bool is_python_function(const Node& node);

} // namespace torch::dynamo::python_autograd
