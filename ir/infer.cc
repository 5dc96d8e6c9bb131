// Shape rules: broadcasting, reductions, matmul, views and index ops.
#include "lazyfuse/ir/infer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "lazyfuse/ir/attention.h"
#include "lazyfuse/ir/errors.h"

namespace lazyfuse {
namespace {

// The broadcast of every input, in one shape: each input is merged into the result from the
// right. An error names the first failing dim as PyTorch does, counted in the broadcast of the
// inputs before it with the failing one.
Shape broadcast_all(std::span<const Shape* const> inputs) {
  size_t rank = 0;
  for (const Shape* input : inputs) rank = std::max(rank, input->size());
  Shape result(rank, 1);
  size_t merged_rank = 0;  // the rank of the inputs merged so far
  for (const Shape* input : inputs) {
    const Shape& b = *input;
    const size_t offset = rank - b.size();
    for (size_t d = 0; d < b.size(); ++d) {
      int64_t& merged = result[offset + d];
      if (merged == b[d] || b[d] == 1) continue;
      if (merged == 1) {
        merged = b[d];
        continue;
      }
      const size_t pair_rank = std::max(merged_rank, b.size());
      throw ShapeError(
          absl::StrCat("The size of tensor a (", merged, ") must match the size of tensor b (",
                       b[d], ") at non-singleton dimension ", offset + d - (rank - pair_rank)));
    }
    merged_rank = std::max(merged_rank, b.size());
  }
  return result;
}

Shape matmul_shape(const Shape& a, const Shape& b) {
  if (a.empty() || b.empty()) throw ShapeError("matmul: both arguments need at least 1 dimension");
  int64_t k_a = a.back();
  int64_t k_b = b.size() == 1 ? b[0] : b[b.size() - 2];
  if (k_a != k_b) {
    auto dims = [](const Shape& s) {
      return s.size() == 1 ? absl::StrCat(s[0]) : absl::StrCat(s[s.size() - 2], "x", s.back());
    };
    throw ShapeError(absl::StrCat("mat1 and mat2 shapes cannot be multiplied (", dims(a), " and ",
                                  dims(b), ")"));
  }
  Shape batch_a(a.begin(), a.end() - std::min<size_t>(a.size(), 2));
  Shape batch_b(b.begin(), b.end() - std::min<size_t>(b.size(), 2));
  Shape batch;
  if (!broadcast_shapes(batch_a, batch_b, &batch))
    throw ShapeError(absl::StrCat("matmul: batch dims ", shape_str(batch_a), " and ",
                                  shape_str(batch_b), " do not broadcast"));
  Shape result = batch;
  if (a.size() >= 2) result.push_back(a[a.size() - 2]);
  if (b.size() >= 2) result.push_back(b.back());
  return result;
}

// Sizes as PyTorch's index ops see them: a 0-d tensor counts as [1] (ensure_nonempty_size).
int64_t nonempty_size(const Shape& shape, int64_t d) { return shape.empty() ? 1 : shape[d]; }
int64_t nonempty_rank(const Shape& shape) { return std::max<int64_t>(shape.size(), 1); }

// cat: operands of one rank (at least 1) and equal sizes but along `dim`, one after another.
Shape cat_shape(std::span<const Shape* const> inputs, const Attrs& attrs) {
  const Shape& first = *inputs[0];
  const int64_t rank = static_cast<int64_t>(first.size());
  for (size_t k = 0; k < inputs.size(); ++k)
    if (inputs[k]->empty())
      throw ShapeError(
          absl::StrCat("zero-dimensional tensor (at position ", k, ") cannot be concatenated"));
  const int64_t dim = normalize_dim(attrs.get_int("dim"), rank, "cat");
  Shape result = first;
  result[dim] = 0;
  for (size_t k = 0; k < inputs.size(); ++k) {
    const Shape& in = *inputs[k];
    if (static_cast<int64_t>(in.size()) != rank)
      throw ShapeError(absl::StrCat("Tensors must have same number of dimensions: got ", rank,
                                    " and ", in.size()));
    for (int64_t d = 0; d < rank; ++d)
      if (d != dim && in[d] != first[d])
        throw ShapeError(absl::StrCat("Sizes of tensors must match except in dimension ", dim,
                                      ". Expected size ", first[d], " but got size ", in[d],
                                      " for tensor number ", k, " in the list."));
    if (__builtin_add_overflow(result[dim], in[dim], &result[dim]))
      throw ShapeError("cat: the sizes along the dimension add past what an int64 holds");
  }
  return result;
}

// gather(x, index) has index's shape; scatter_add(self, index, src) self's. PyTorch's
// gather_shape_check and scatter_shape_check: one rank (0-d counting as 1-d), and index no
// larger than the others, except than x or self along `dim`.
Shape index_op_shape(Op op, std::span<const Shape* const> inputs, const Attrs& attrs) {
  const bool gather = op == Op::Gather;
  const char* name = gather ? "gather" : "scatter_add";
  const Shape& self = *inputs[0];
  const Shape& index = *inputs[1];
  const int64_t rank = nonempty_rank(self);
  const int64_t dim = normalize_dim(attrs.get_int("dim"), static_cast<int64_t>(self.size()), name);
  if (nonempty_rank(index) != rank)
    throw ShapeError(absl::StrCat(name,
                                  "(): Index tensor must have the same number of dimensions as ",
                                  gather ? "input" : "self", " tensor"));
  if (!gather && nonempty_rank(*inputs[2]) != rank)
    throw ShapeError(absl::StrCat(
        name, "(): Index tensor must have the same number of dimensions as src tensor"));
  for (int64_t d = 0; d < rank; ++d) {
    const bool fits_self = d == dim || nonempty_size(index, d) <= nonempty_size(self, d);
    const bool fits_src = gather || nonempty_size(index, d) <= nonempty_size(*inputs[2], d);
    if (fits_self && fits_src) continue;
    if (gather)
      throw ShapeError(absl::StrCat(
          name, "(): Size does not match at dimension ", d, " expected index ", shape_str(index),
          " to be smaller than self ", shape_str(self), " apart from dimension ", dim));
    throw ShapeError(absl::StrCat(
        name, "(): Expected index ", shape_str(index), " to be smaller than self ", shape_str(self),
        " apart from dimension ", dim, " and to be smaller size than src ", shape_str(*inputs[2])));
  }
  return gather ? index : self;
}

// all_gather multiplies dim's size by the process count; reduce_scatter divides it, evenly.
Shape collective_shape(Op op, const Shape& in, const Attrs& attrs) {
  if (op == Op::AllReduce || op == Op::Broadcast) return in;
  const char* name = op_name(op);
  const int64_t world = attrs.get_int("world");
  if (world < 1) throw ShapeError(absl::StrCat(name, "(): world size ", world, " is not positive"));
  if (in.empty())
    throw ShapeError(absl::StrCat(name, "(): a 0-d tensor has no dim to gather or scatter along"));
  const int64_t dim = normalize_dim(attrs.get_int("dim"), static_cast<int64_t>(in.size()), name);
  Shape out = in;
  if (op == Op::AllGather) {
    out[dim] = in[dim] * world;
    return out;
  }
  if (in[dim] % world != 0)
    throw ShapeError(absl::StrCat(name, "(): size ", in[dim], " of dim ", dim, " of ",
                                  shape_str(in), " does not divide among ", world, " processes"));
  out[dim] = in[dim] / world;
  return out;
}

}  // namespace

std::vector<int64_t> reduction_dims(const Attrs& attrs, int64_t rank) {
  std::vector<int64_t> dims;
  if (attrs.has("dims")) {
    for (int64_t d : attrs.get_ints("dims")) dims.push_back(normalize_dim(d, rank, "reduction"));
  }
  if (dims.empty()) {
    for (int64_t d = 0; d < rank; ++d) dims.push_back(d);
  }
  std::sort(dims.begin(), dims.end());
  if (std::adjacent_find(dims.begin(), dims.end()) != dims.end())
    throw ShapeError("reduction: a dim appears more than once in the list of dims");
  return dims;
}

bool reduces_trailing_dims(const std::vector<int64_t>& dims, int64_t rank) {
  const int64_t first = rank - static_cast<int64_t>(dims.size());
  for (size_t k = 0; k < dims.size(); ++k)
    if (dims[k] != first + static_cast<int64_t>(k)) return false;
  return true;
}

bool reduces_leading_dims(const std::vector<int64_t>& dims, int64_t rank) {
  for (size_t k = 0; k < dims.size(); ++k)
    if (dims[k] != static_cast<int64_t>(k)) return false;
  return !dims.empty() && static_cast<int64_t>(dims.size()) < rank;
}

Shape infer_shape(Op op, std::span<const Shape* const> inputs, const Attrs& attrs,
                  const Shape& given) {
  // A shape given from outside (a factory's, a reshape's, an expand's) is counted before any
  // rule multiplies its sizes.
  if ((op_kind(op) == OpKind::Source || op == Op::Reshape || op == Op::Expand) &&
      checked_numel(given) < 0)
    throw ShapeError(absl::StrCat("shape ", shape_str(given),
                                  " has a negative size or more elements than an int64 counts",
                                  zeros_as_ones(given)));
  switch (op_kind(op)) {
    case OpKind::Source:
      return given;
    case OpKind::Elementwise:
      return broadcast_all(inputs);
    case OpKind::Transfer:
      return *inputs[0];
    case OpKind::Matmul:
      return matmul_shape(*inputs[0], *inputs[1]);
    case OpKind::Index:
      return op == Op::Cat ? cat_shape(inputs, attrs) : index_op_shape(op, inputs, attrs);
    case OpKind::Collective:
      return collective_shape(op, *inputs[0], attrs);
    case OpKind::Attention:
      return attention_shape(op, inputs, attrs);
    case OpKind::Reduction: {
      const Shape& in = *inputs[0];
      std::vector<int64_t> dims = reduction_dims(attrs, static_cast<int64_t>(in.size()));
      bool keepdim = attrs.has("keepdim") && attrs.get_bool("keepdim");
      Shape result;
      for (int64_t d = 0; d < static_cast<int64_t>(in.size()); ++d) {
        bool reduced = std::binary_search(dims.begin(), dims.end(), d);
        if (reduced && in[d] == 0 && (op == Op::Max || op == Op::Min))
          throw ShapeError(absl::StrCat(op_name(op), "(): Expected reduction dim ", d,
                                        " to have non-zero size"));
        if (!reduced)
          result.push_back(in[d]);
        else if (keepdim)
          result.push_back(1);
      }
      return result;
    }
    case OpKind::View:
      break;
  }
  const Shape& in = *inputs[0];
  int64_t rank = static_cast<int64_t>(in.size());
  switch (op) {
    case Op::Reshape:
      if (numel(given) != numel(in))
        throw ShapeError(absl::StrCat("shape '", shape_str(given),
                                      "' is invalid for input of size ", numel(in)));
      return given;
    case Op::Permute: {
      const std::vector<int64_t>& dims = attrs.get_ints("dims");
      if (static_cast<int64_t>(dims.size()) != rank)
        throw ShapeError(
            absl::StrCat("permute: number of dimensions in the tensor input "
                         "does not match the length of the desired ordering of "
                         "dimensions i.e. input.dim() = ",
                         rank, " is not equal to len(dims) = ", dims.size()));
      Shape result(rank);
      std::vector<bool> seen(rank, false);
      for (int64_t i = 0; i < rank; ++i) {
        int64_t d = normalize_dim(dims[i], rank, "permute");
        if (seen[d]) throw ShapeError("permute(): duplicate dims are not allowed.");
        seen[d] = true;
        result[i] = in[d];
      }
      return result;
    }
    case Op::Expand: {
      if (given.size() < in.size())
        throw ShapeError(absl::StrCat("expand: the number of sizes provided (", given.size(),
                                      ") must be greater or equal to the number of dimensions in "
                                      "the tensor (",
                                      in.size(), ")"));
      size_t offset = given.size() - in.size();
      for (size_t i = 0; i < in.size(); ++i) {
        if (in[i] != given[offset + i] && in[i] != 1)
          throw ShapeError(absl::StrCat("The expanded size of the tensor (", given[offset + i],
                                        ") must match the existing size (", in[i],
                                        ") at non-singleton dimension ", offset + i,
                                        ".  Target sizes: ", shape_str(given),
                                        ".  Tensor sizes: ", shape_str(in)));
      }
      return given;
    }
    case Op::Narrow: {
      // normalize_dim accepts dim 0 of a scalar (as PyTorch's dims do), but a scalar has no
      // dim 0 to narrow: given[dim] below would read past the end.
      if (rank == 0) throw ShapeError("narrow() cannot be applied to a 0-dim tensor.");
      int64_t dim = normalize_dim(attrs.get_int("dim"), rank, "narrow");
      int64_t start = attrs.get_int("start");
      if (given.size() != in.size())
        throw ShapeError("narrow: the result must keep the operand's rank");
      int64_t length = given[dim];
      // Compared without start + length, which overflows for a start near INT64_MAX.
      if (start < 0 || length < 0 || start > in[dim] || length > in[dim] - start)
        throw ShapeError(absl::StrCat("start (", start, ") + length (", length,
                                      ") exceeds dimension size (", in[dim], ")."));
      Shape result = in;
      result[dim] = length;
      return result;
    }
    default:
      break;
  }
  return given;
}

}  // namespace lazyfuse
