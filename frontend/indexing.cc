// The index ops (gather, scatter_add, cat: ir/ops.def) and what is composed from them:
// index_select, stack, max and min with indices, amax and amin.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "lazyfuse/frontend/functional.h"
#include "lazyfuse/frontend/op_builder.h"
#include "lazyfuse/ir/errors.h"

namespace lazyfuse {

using detail::make_op;

namespace {

std::string at(const Loc& where) {
  return absl::StrCat(" (at ", SourceLoc::from(where).str(), ")");
}

int64_t dim_of(int64_t dim, int64_t rank, const char* what, const Loc& where) {
  try {
    return normalize_dim(dim, rank, what);
  } catch (const Error&) {
    detail::rethrow_at(where);
  }
}

Attrs dim_attr(int64_t dim) {
  Attrs attrs;
  attrs.set("dim", dim);
  return attrs;
}

Tensor reduce_dims(Op op, const Tensor& x, std::vector<int64_t> dims, bool keepdim,
                   const Loc& where) {
  Attrs attrs;
  attrs.set("dims", std::move(dims));
  attrs.set("keepdim", keepdim);
  return make_op(op, {x}, std::move(attrs), where);
}

// max and min with indices: the index of the first extreme, and the values gathered there, so
// that the gradient reaches that element alone.
std::tuple<Tensor, Tensor> extreme_with_index(const Tensor& x, int64_t dim, bool keepdim,
                                              bool largest, const Loc& where) {
  dim = dim_of(dim, x.dim(), largest ? "max" : "min", where);
  Tensor index =
      largest ? argmax(x, dim, /*keepdim=*/true, where) : argmin(x, dim, /*keepdim=*/true, where);
  Tensor values = gather(x, dim, index, where);
  if (keepdim || x.dim() == 0) return {values, index};
  return {values.squeeze(dim, where), index.squeeze(dim, where)};
}

}  // namespace

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index, Loc where) {
  dim = dim_of(dim, x.dim(), "gather", where);
  return make_op(Op::Gather, {x, index}, dim_attr(dim), where);
}

Tensor scatter_add(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src,
                   Loc where) {
  dim = dim_of(dim, self.dim(), "scatter_add", where);
  return make_op(Op::ScatterAdd, {self, index, src}, dim_attr(dim), where);
}

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index, Loc where) {
  dim = dim_of(dim, x.dim(), "index_select", where);
  if (index.dim() > 1)
    throw ShapeError(absl::StrCat("index_select(): Index is supposed to be a vector", at(where)));
  if (index.dtype() != kInt64 && index.dtype() != kInt32)
    throw DTypeError(absl::StrCat("index_select(): Expected dtype int32 or int64 for index, got ",
                                  dtype_torch_name(index.dtype()), at(where)));
  const Tensor positions = index.to(kInt64, where);
  // A 0-d x takes one index, and stays 0-d.
  if (x.dim() == 0) return gather(x, 0, positions.reshape({}, where), where);
  // The index along dim, the same at every position of the other dims: one gather.
  const int64_t n = positions.numel();
  Shape line(static_cast<size_t>(x.dim()), 1), target = x.sizes();
  line[dim] = n;
  target[dim] = n;
  return gather(x, dim, positions.reshape(line, where).expand(target, where), where);
}

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim, Loc where) {
  if (tensors.empty())
    throw ShapeError(absl::StrCat("torch.cat(): expected a non-empty list of Tensors", at(where)));
  if (tensors[0].dim() > 0) dim = dim_of(dim, tensors[0].dim(), "cat", where);
  return make_op(Op::Cat, tensors, dim_attr(dim), where);
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim, Loc where) {
  if (tensors.empty())
    throw ShapeError(absl::StrCat("stack expects a non-empty TensorList", at(where)));
  for (size_t k = 1; k < tensors.size(); ++k)
    if (tensors[k].sizes() != tensors[0].sizes())
      throw ShapeError(absl::StrCat("stack expects each tensor to be equal size, but got ",
                                    shape_str(tensors[0].sizes()), " at entry 0 and ",
                                    shape_str(tensors[k].sizes()), " at entry ", k, at(where)));
  dim = dim_of(dim, tensors[0].dim() + 1, "stack", where);
  std::vector<Tensor> unsqueezed;
  for (const Tensor& t : tensors) unsqueezed.push_back(t.unsqueeze(dim, where));
  return cat(unsqueezed, dim, where);
}

std::tuple<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim, Loc where) {
  return extreme_with_index(x, dim, keepdim, true, where);
}
std::tuple<Tensor, Tensor> min(const Tensor& x, int64_t dim, bool keepdim, Loc where) {
  return extreme_with_index(x, dim, keepdim, false, where);
}

Tensor amax(const Tensor& x, IntArrayRef dims, bool keepdim, Loc where) {
  return reduce_dims(Op::Max, x, dims.vec(), keepdim, where);
}
Tensor amin(const Tensor& x, IntArrayRef dims, bool keepdim, Loc where) {
  return reduce_dims(Op::Min, x, dims.vec(), keepdim, where);
}

Tensor Tensor::amax(IntArrayRef dims, bool keepdim, Loc where) const {
  return lazyfuse::amax(*this, dims, keepdim, where);
}
Tensor Tensor::amin(IntArrayRef dims, bool keepdim, Loc where) const {
  return lazyfuse::amin(*this, dims, keepdim, where);
}
Tensor Tensor::gather(int64_t dim, const Tensor& index, Loc where) const {
  return lazyfuse::gather(*this, dim, index, where);
}
Tensor Tensor::scatter_add(int64_t dim, const Tensor& index, const Tensor& src, Loc where) const {
  return lazyfuse::scatter_add(*this, dim, index, src, where);
}
Tensor Tensor::index_select(int64_t dim, const Tensor& index, Loc where) const {
  return lazyfuse::index_select(*this, dim, index, where);
}

}  // namespace lazyfuse
