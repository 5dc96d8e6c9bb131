// split, chunk, tril, triu and masked_fill, as PyTorch's. Each is composed from ops that already
// have gradient rules (narrow, where, arange and comparisons), so the gradients come from those
// and everything stays lazy and fusable: a split is views, a mask is an elementwise select.
#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "lazyfuse/frontend/op_builder.h"
#include "lazyfuse/frontend/tensor.h"
#include "lazyfuse/ir/errors.h"

namespace lazyfuse {
namespace {

std::string at(const Loc& where) {
  return absl::StrCat(" (at ", SourceLoc::from(where).str(), ")");
}

int64_t dim_of(const Tensor& t, int64_t dim, const char* what, const Loc& where) {
  try {
    return normalize_dim(dim, t.dim(), what);
  } catch (const Error&) {
    detail::rethrow_at(where);
  }
}

// Narrows of `t` along `dim` of the given sizes, one after another. The sizes are checked.
std::vector<Tensor> pieces(const Tensor& t, int64_t dim, const std::vector<int64_t>& sizes,
                           const Loc& where) {
  std::vector<Tensor> out;
  int64_t start = 0;
  for (int64_t size : sizes) {
    out.push_back(t.narrow(dim, start, size, where));
    start += size;
  }
  return out;
}

// A 0-d tensor of `value` in `like`'s dtype and device: where() between it and `like` then keeps
// like's dtype (a 0-d operand never raises a tensor's dtype within its category), unlike a
// Scalar, which PyTorch promotes (int tensor, 2.5 gives float).
Tensor fill_value(const Scalar& value, const Tensor& like, const Loc& where) {
  return detail::constant(value, like.dtype(), {}, like.device(), where);
}

// The bool [rows, cols] mask of col - row compared with `diagonal`, made on t's device.
Tensor triangle(const Tensor& t, int64_t diagonal, bool lower, const char* what, const Loc& where) {
  if (t.dim() < 2)
    throw ShapeError(absl::StrCat(what, ": input tensor must have at least 2 dimensions, got ",
                                  t.dim(), at(where)));
  const TensorOptions options = TensorOptions(kInt64).device(t.device());
  const Tensor rows = arange(t.size(-2), options, where).reshape({t.size(-2), 1}, where);
  const Tensor cols = arange(t.size(-1), options, where);
  const Tensor offset = operator-({cols, where}, rows);
  const Tensor keep =
      lower ? operator<=({offset, where}, diagonal) : operator>=({offset, where}, diagonal);
  return lazyfuse::where(keep, t, fill_value(0, t, where), where);
}

void check_mask(const Tensor& mask, const Loc& where) {
  if (mask.dtype() != kBool)
    throw DTypeError(
        absl::StrCat("masked_fill only supports boolean masks, but got mask with dtype ",
                     dtype_torch_name(mask.dtype()), at(where)));
}

}  // namespace

std::vector<Tensor> Tensor::split(int64_t split_size, int64_t dim, Loc where) const {
  if (this->dim() == 0)
    throw ShapeError(absl::StrCat("split expects at least a 1-dimensional tensor", at(where)));
  dim = dim_of(*this, dim, "split", where);
  if (split_size < 0)
    throw ShapeError(absl::StrCat(
        "split expects split_size be non-negative, but got split_size=", split_size, at(where)));
  const int64_t length = size(dim);
  if (split_size == 0 && length != 0)
    throw ShapeError(
        absl::StrCat("split_size can only be 0 if dimension size is 0, but got "
                     "dimension size of ",
                     length, at(where)));
  // As PyTorch: at least one piece, so a dim of size 0 gives one empty piece.
  const int64_t count =
      split_size == 0 ? 1 : std::max<int64_t>((length + split_size - 1) / split_size, 1);
  std::vector<int64_t> sizes(count, split_size);
  sizes.back() = length - split_size * (count - 1);
  return pieces(*this, dim, sizes, where);
}

std::vector<Tensor> Tensor::split_with_sizes(IntArrayRef split_sizes, int64_t dim,
                                             Loc where) const {
  if (this->dim() == 0)
    throw ShapeError(absl::StrCat("split expects at least a 1-dimensional tensor", at(where)));
  dim = dim_of(*this, dim, "split_with_sizes", where);
  int64_t total = 0;
  for (int64_t size : split_sizes.vec()) {
    if (size < 0)
      throw ShapeError(
          absl::StrCat("split_with_sizes expects split_sizes have only non-negative "
                       "entries, but got split_sizes=[",
                       absl::StrJoin(split_sizes.vec(), ", "), "]", at(where)));
    total += size;
  }
  if (total != size(dim))
    throw ShapeError(absl::StrCat("split_with_sizes expects split_sizes to sum exactly to ",
                                  size(dim), " (input tensor's size at dimension ", dim,
                                  "), but got split_sizes=[",
                                  absl::StrJoin(split_sizes.vec(), ", "), "]", at(where)));
  return pieces(*this, dim, split_sizes.vec(), where);
}

std::vector<Tensor> Tensor::split(IntArrayRef split_sizes, int64_t dim, Loc where) const {
  return split_with_sizes(std::move(split_sizes), dim, where);
}

std::vector<Tensor> Tensor::chunk(int64_t chunks, int64_t dim, Loc where) const {
  if (this->dim() == 0)
    throw ShapeError(absl::StrCat("chunk expects at least a 1-dimensional tensor", at(where)));
  if (chunks <= 0)
    throw ShapeError(
        absl::StrCat("chunk expects `chunks` to be greater than 0, got: ", chunks, at(where)));
  dim = dim_of(*this, dim, "chunk", where);
  const int64_t length = size(dim);
  const int64_t split_size = (length + chunks - 1) / chunks;
  // An empty dim gives `chunks` empty pieces, as PyTorch's chunk does (split would give one).
  if (split_size == 0 && length == 0)
    return pieces(*this, dim, std::vector<int64_t>(chunks, 0), where);
  return split(split_size, dim, where);
}

Tensor Tensor::tril(int64_t diagonal, Loc where) const {
  return triangle(*this, diagonal, /*lower=*/true, "tril", where);
}
Tensor Tensor::triu(int64_t diagonal, Loc where) const {
  return triangle(*this, diagonal, /*lower=*/false, "triu", where);
}

Tensor Tensor::masked_fill(const Tensor& mask, Scalar value, Loc where) const {
  check_mask(mask, where);
  return lazyfuse::where(mask, fill_value(value, *this, where), *this, where);
}

Tensor Tensor::masked_fill(const Tensor& mask, const Tensor& value, Loc where) const {
  check_mask(mask, where);
  if (value.dim() != 0)
    throw ShapeError(
        absl::StrCat("masked_fill only supports a 0-dimensional value tensor, but "
                     "got tensor with ",
                     value.dim(), " dimension(s)", at(where)));
  // A 0-d value may live on the CPU for a GPU tensor, as PyTorch allows; it takes this tensor's
  // dtype, as the filled elements do.
  const Tensor fill = value.to(device(), where).to(dtype(), where);
  return lazyfuse::where(mask, fill, *this, where);
}

std::vector<Tensor> split(const Tensor& t, int64_t split_size, int64_t dim, Loc where) {
  return t.split(split_size, dim, where);
}
std::vector<Tensor> split(const Tensor& t, IntArrayRef split_sizes, int64_t dim, Loc where) {
  return t.split_with_sizes(std::move(split_sizes), dim, where);
}
std::vector<Tensor> chunk(const Tensor& t, int64_t chunks, int64_t dim, Loc where) {
  return t.chunk(chunks, dim, where);
}
Tensor tril(const Tensor& t, int64_t diagonal, Loc where) { return t.tril(diagonal, where); }
Tensor triu(const Tensor& t, int64_t diagonal, Loc where) { return t.triu(diagonal, where); }
Tensor masked_fill(const Tensor& t, const Tensor& mask, Scalar value, Loc where) {
  return t.masked_fill(mask, value, where);
}
Tensor masked_fill(const Tensor& t, const Tensor& mask, const Tensor& value, Loc where) {
  return t.masked_fill(mask, value, where);
}

}  // namespace lazyfuse
