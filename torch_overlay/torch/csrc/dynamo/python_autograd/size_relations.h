#pragma once

// Which lifted sizes (a view's input shape, an expand's target, the shapes
// the next edges expect) are a dim of a lifted tensor, or the product of
// consecutive dims of one. The captured graph tells Dynamo
// (torch._compiled_autograd.related_sizes): once Dynamo makes a size dynamic
// (it changed, and automatic dynamic shapes recompiled), a guard equates it
// with that expression in the tensors' size symbols, so a reshape to it is
// one Inductor indexes contiguously. Left alone, it would be a fresh symbol
// Inductor knows nothing about: kernels with div/mod index arithmetic.
//
// Relations are found by value, in one backward, so one may be a coincidence
// (a sequence length equal to the head size): once the two differ, Dynamo's
// guard fails and it compiles again without that relation, as it does for
// two input dims it unified by value (duck shaping). Never a wrong gradient.

#include <torch/csrc/dynamo/python_autograd/backward_graph.h>

#include <cstdint>
#include <vector>

namespace torch::dynamo::python_autograd {

// sizes[size_index] == the product of the dims [dim_begin, dim_end) of
// tensors[tensor_index] (BackwardGraph's lists).
struct SizeRelation {
  uint32_t size_index;
  uint32_t tensor_index;
  uint32_t dim_begin;
  uint32_t dim_end;
};

// Relates the sizes of `graph` it can: runs of sizes that are a lifted
// tensor's whole shape to its dims, position by position; other sizes above
// 1 to a dim of the owning node's own saved tensors, else of any lifted
// tensor, else likewise to a product of consecutive dims.
std::vector<SizeRelation> relate_sizes(const BackwardGraph& graph);

} // namespace torch::dynamo::python_autograd
