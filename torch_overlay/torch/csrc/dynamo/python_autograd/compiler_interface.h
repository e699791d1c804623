#pragma once

// libtorch's nodes call back into "the compiler" while they are applied with
// swapped saved values: Node::apply_with_saved binds the node's functional
// backward (bind_function) and asks for it to be called (call_function).
// The legacy engine answers by recording proxy calls into its graph; ours
// answers by running the functional right away, on whatever tensors were
// swapped in (real, fake, or make_fx proxies).

#include <torch/csrc/dynamo/compiled_autograd.h>

#include <exception>
#include <optional>

namespace torch::dynamo::python_autograd {

// One Node::apply_with_saved call in progress on this thread. While it
// lives, libtorch's PyCompilerInterface slot holds our implementation.
class NodeApplication {
 public:
  enum class Mode {
    kRun, // run the functional backward
    kProbe, // only record what the node binds; return empty gradients
  };

  // `unpacked`: what the unpack hooks of the node's saved variables returned,
  // by packed input id (the graph calls those hooks before the node).
  explicit NodeApplication(
      Mode mode,
      const torch::autograd::variable_list* unpacked = nullptr);
  ~NodeApplication();
  NodeApplication(const NodeApplication&) = delete;
  NodeApplication& operator=(const NodeApplication&) = delete;

  // A backward formula that throws must not leave the node holding swapped
  // values, so the interface catches the error, lets apply_with_saved finish
  // (restoring the node), and the caller rethrows it here.
  void rethrow_if_failed();

  // What a C++ custom function reported when it bound its functional.
  std::optional<bool> custom_function_traceable() const {
    return custom_function_traceable_;
  }

 private:
  friend class EngineCompilerInterface;

  Mode mode_;
  std::optional<bool> custom_function_traceable_;
  torch::autograd::functional_apply_t custom_function_;
  const torch::autograd::variable_list* unpacked_;
  std::exception_ptr error_;
  NodeApplication* outer_;
};

} // namespace torch::dynamo::python_autograd
