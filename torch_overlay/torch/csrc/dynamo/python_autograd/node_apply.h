#pragma once

// Running one autograd node with given saved values. These are the bodies of
// the ops the captured graph calls (apply_with_saved, validate_outputs, ...):
// they run on real tensors, and also on FakeTensors and make_fx proxies while
// Dynamo and AOTAutograd trace the captured graph.

#include <torch/csrc/dynamo/python_autograd/backward_graph.h>

namespace torch::dynamo::python_autograd {

// Makes `graph` the one whose nodes the graph ops look up by index, for as
// long as it lives. Nested backwards (a hook calling backward) stack.
class ActiveBackward {
 public:
  explicit ActiveBackward(BackwardGraph& graph);
  ~ActiveBackward();
  ActiveBackward(const ActiveBackward&) = delete;
  ActiveBackward& operator=(const ActiveBackward&) = delete;

  // The node at `node_idx` of the innermost active backward on this thread.
  static NodeRecord& node(int64_t node_idx);

  // A RemovableHandle is about to delete `dict[key]`. The eager engine reads
  // a hook dict when its node's turn comes, so a hook removed before then
  // does not run, and one removed after (by a hook of the same dict, or
  // later) still runs or already ran. In every active backward on this
  // thread whose graph has not yet called a hook of that dict, the hook is
  // replaced in the running graph's hooks list by `stand_in`, a hook that
  // does nothing. The graph reads a hook from the list when it calls it,
  // and under Dynamo a handle's remove() is a graph break, after which
  // Dynamo reads the list again. GIL held.
  static void skip_hook_removed_before_its_turn(
      PyObject* dict,
      PyObject* key,
      PyObject* stand_in);
};

// Node::apply_with_saved with the node's saved tensors, sizes and scalars
// replaced by the given ones. `sizes` are all the node's sizes; those of its
// saved state come first. `unpacked` are what the unpack hooks of its saved
// variables with saved-tensor hooks returned (NodeRecord::unpack_hooks).
// The node is left exactly as it was, also when the backward formula throws.
variable_list apply_with_saved(
    NodeRecord& record,
    const variable_list& inputs,
    const variable_list& saved_tensors,
    const std::vector<c10::SymInt>& sizes,
    const std::vector<c10::IValue>& saved_scalars,
    const variable_list& unpacked);

// The eager engine's validate_outputs against the node's next edges, with
// the shapes of their input metadata replaced by the tail of `sizes` (all
// the node's sizes, as for apply_with_saved).
variable_list validate_outputs(
    const NodeRecord& record,
    variable_list outputs,
    const std::vector<c10::SymInt>& sizes);

// Runs the node itself, on its own saved values, then validates its outputs.
variable_list apply_eagerly(NodeRecord& record, variable_list inputs);

at::Tensor call_cpp_tensor_pre_hook(
    const NodeRecord& record,
    int64_t hook_idx,
    const at::Tensor& grad);

// What PyNode::apply passes a Python autograd.Function's backward for the
// gradients it did not receive: zeros shaped like the forward's outputs (the
// node's sizes, in PyNode::compiled_args order), unless the Function turned
// that off. Other gradients pass through.
variable_list materialize_grads(
    const NodeRecord& record,
    variable_list grads,
    const std::vector<c10::SymInt>& sizes);

// AccumulateGrad::apply's accumulation, on a variable and a new gradient.
void accumulate_grad(const at::Tensor& variable, const at::Tensor& grad);

// Asks each C++ custom function whether it is traceable (CppNode reports it
// only when applied) and marks the non-traceable ones
// kApplyWithSavedDynamoDisabled. Runs nothing: the backward formula is not
// called.
void classify_custom_functions(BackwardGraph& graph);

} // namespace torch::dynamo::python_autograd
