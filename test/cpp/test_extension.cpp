// C++ pieces the tests need: a hook registered from C++, C++ autograd
// Functions (a traceable one that saves a scalar, and one whose backward
// fails on request), and a Node subclass without compiled_args, as an
// extension may define one. Built once per test session by conftest.py.
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/extension.h>

#include <atomic>

namespace {

std::atomic<bool> fail_backward{false};

struct ScaleBy : public torch::autograd::Function<ScaleBy> {
  static constexpr bool is_traceable = true;
  static torch::Tensor forward(
      torch::autograd::AutogradContext* ctx,
      const torch::Tensor& x,
      double scale) {
    ctx->saved_data["scale"] = scale;
    return x * scale;
  }
  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list grads) {
    return {grads[0] * ctx->saved_data["scale"].toDouble(), torch::Tensor()};
  }
};

struct MultiplyBySaved : public torch::autograd::Function<MultiplyBySaved> {
  static constexpr bool is_traceable = true;
  static torch::Tensor forward(
      torch::autograd::AutogradContext* ctx,
      const torch::Tensor& x,
      const torch::Tensor& factor) {
    ctx->save_for_backward({factor});
    return x * factor;
  }
  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list grads) {
    TORCH_CHECK(!fail_backward.load(), "MultiplyBySaved: backward failed on request");
    auto factor = ctx->get_saved_variables()[0];
    return {grads[0] * factor, torch::Tensor()};
  }
};

// Multiplies the gradient by a saved tensor. It keeps Node's compiled_args,
// which refuses compiled autograd.
struct MultiplyNode : public torch::autograd::Node {
  torch::autograd::SavedVariable factor;

  torch::autograd::variable_list apply(
      torch::autograd::variable_list&& grads) override {
    return {grads[0] * factor.unpack()};
  }
  void release_variables() override {
    factor.reset_data();
  }
};

} // namespace

torch::Tensor multiply_with_node_subclass(
    const torch::Tensor& x,
    const torch::Tensor& factor) {
  auto out = x.detach() * factor;
  auto node = c10::make_intrusive<MultiplyNode>();
  node->factor = torch::autograd::SavedVariable(factor, /*is_output=*/false);
  node->set_next_edges(torch::autograd::collect_next_edges(x));
  torch::autograd::set_history(out, node);
  return out;
}

void register_doubling_hook(torch::Tensor t) {
  t.register_hook([](torch::Tensor grad) { return grad * 2; });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("register_doubling_hook", &register_doubling_hook);
  m.def("scale_by", [](const torch::Tensor& x, double scale) {
    return ScaleBy::apply(x, scale);
  });
  m.def("multiply_by_saved", [](const torch::Tensor& x, const torch::Tensor& factor) {
    return MultiplyBySaved::apply(x, factor);
  });
  m.def("multiply_with_node_subclass", &multiply_with_node_subclass);
  m.def("set_fail_backward", [](bool fail) { fail_backward = fail; });
}
