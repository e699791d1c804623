#include <torch/csrc/dynamo/python_autograd/size_relations.h>

#include <map>
#include <optional>
#include <unordered_map>

namespace torch::dynamo::python_autograd {

namespace {

// The dims a graph can read off a lifted tensor: those of a strided,
// non-nested tensor with concrete sizes.
std::optional<std::vector<int64_t>> readable_dims(const at::Tensor& tensor) {
  if (!tensor.defined() || tensor.is_nested() ||
      tensor.layout() != at::kStrided) {
    return std::nullopt;
  }
  std::vector<int64_t> dims;
  for (const c10::SymInt& dim : tensor.sym_sizes()) {
    auto value = dim.maybe_as_int();
    if (!value) {
      return std::nullopt;
    }
    dims.push_back(*value);
  }
  return dims;
}

// Where values first occur among some tensors' dims: a whole shape (of two
// dims or more), one dim, or the product of a run of consecutive dims (each
// above 1).
class DimsByValue {
 public:
  void add(uint32_t tensor_index, const std::vector<int64_t>& dims) {
    if (dims.size() >= 2) {
      shapes_.try_emplace(dims, tensor_index);
    }
    for (size_t begin = 0; begin < dims.size(); ++begin) {
      if (dims[begin] <= 1) {
        continue;
      }
      single_.try_emplace(dims[begin], Dims{tensor_index, begin, begin + 1});
      int64_t product = dims[begin];
      for (size_t end = begin + 1; end < dims.size() && dims[end] > 1; ++end) {
        product *= dims[end];
        products_.try_emplace(product, Dims{tensor_index, begin, end + 1});
      }
    }
  }

  // A tensor whose shape is sizes[begin, begin + length).
  std::optional<uint32_t> shape(
      const std::vector<int64_t>& sizes,
      size_t begin,
      size_t length) const {
    if (shapes_.empty()) {
      return std::nullopt;
    }
    std::vector<int64_t> key(
        sizes.begin() + begin, sizes.begin() + begin + length);
    auto it = shapes_.find(key);
    return it == shapes_.end() ? std::nullopt
                               : std::optional<uint32_t>(it->second);
  }

  std::optional<SizeRelation> single(uint32_t size_index, int64_t value) const {
    return find(single_, size_index, value);
  }

  std::optional<SizeRelation> product(uint32_t size_index, int64_t value) const {
    return find(products_, size_index, value);
  }

 private:
  struct Dims {
    uint32_t tensor_index;
    size_t begin;
    size_t end;
  };
  using Index = std::unordered_map<int64_t, Dims>;

  static std::optional<SizeRelation> find(
      const Index& index,
      uint32_t size_index,
      int64_t value) {
    auto it = index.find(value);
    if (it == index.end()) {
      return std::nullopt;
    }
    const Dims& dims = it->second;
    return SizeRelation{
        size_index,
        dims.tensor_index,
        static_cast<uint32_t>(dims.begin),
        static_cast<uint32_t>(dims.end)};
  }

  std::map<std::vector<int64_t>, uint32_t> shapes_;
  Index single_;
  Index products_;
};

// Sizes are mostly shapes of forward tensors (a node's saved input shape,
// the shapes its next edges expect), and the same tensor is often saved:
// matching whole shapes first ties each size to the dim in the same position,
// where a lone value could equally be another dim of the same value (a
// sequence length equal to the model width).
constexpr size_t kLongestShape = 8;

// The tensor (the node's own first) whose whole shape is the longest run of
// sizes[begin, end) from `begin`, and the run's length.
std::optional<std::pair<uint32_t, uint32_t>> longest_shape_at(
    const DimsByValue& own,
    const DimsByValue& everywhere,
    const std::vector<int64_t>& sizes,
    size_t begin,
    size_t end) {
  for (size_t length = std::min(kLongestShape, end - begin); length >= 2;
       --length) {
    for (const DimsByValue* index : {&own, &everywhere}) {
      if (auto tensor = index->shape(sizes, begin, length)) {
        return std::make_pair(*tensor, static_cast<uint32_t>(length));
      }
    }
  }
  return std::nullopt;
}

} // namespace

std::vector<SizeRelation> relate_sizes(const BackwardGraph& graph) {
  std::vector<std::optional<std::vector<int64_t>>> dims;
  dims.reserve(graph.tensors.size());
  DimsByValue everywhere;
  for (size_t t = 0; t < graph.tensors.size(); ++t) {
    dims.push_back(readable_dims(graph.tensors[t]));
    if (dims.back()) {
      everywhere.add(static_cast<uint32_t>(t), *dims.back());
    }
  }
  std::vector<SizeRelation> relations;
  for (const auto& record : graph.nodes) {
    if (record.sizes_begin == record.sizes_end) {
      continue;
    }
    DimsByValue own;
    for (uint32_t t : record.tensor_ids) {
      if (dims[t]) {
        own.add(t, *dims[t]);
      }
    }
    uint32_t i = record.sizes_begin;
    while (i < record.sizes_end) {
      if (auto shape = longest_shape_at(own, everywhere, graph.sizes, i,
                                        record.sizes_end)) {
        auto [tensor, length] = *shape;
        for (uint32_t d = 0; d < length; ++d) {
          relations.push_back(SizeRelation{i + d, tensor, d, d + 1});
        }
        i += length;
        continue;
      }
      int64_t value = graph.sizes[i];
      std::optional<SizeRelation> relation;
      if (value > 1) {
        relation = own.single(i, value);
        if (!relation) {
          relation = everywhere.single(i, value);
        }
        if (!relation) {
          relation = own.product(i, value);
        }
        if (!relation) {
          relation = everywhere.product(i, value);
        }
      }
      if (relation) {
        relations.push_back(*relation);
      }
      ++i;
    }
  }
  return relations;
}

} // namespace torch::dynamo::python_autograd
