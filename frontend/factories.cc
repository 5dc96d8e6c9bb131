// Factories: tensors from data (computed at once, on the CPU, then moved) and generators
// (pending nodes, computed where they are used).
#include <cmath>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "lazyfuse/frontend/autograd.h"
#include "lazyfuse/frontend/op_builder.h"
#include "lazyfuse/frontend/tensor.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/runtime/devices.h"
#include "lazyfuse/runtime/executor.h"

namespace lazyfuse {
namespace {

// The global generator: a seed, and the Philox counter the next random tensor starts at.
struct Generator {
  std::mutex mutex;
  uint64_t seed = 67280421310721ull;
  uint64_t offset = 0;
};
Generator& generator() {
  static Generator g;
  return g;
}

// Generators are made on the device they are asked for: nothing is computed, let alone moved.
Device target_device(const TensorOptions& options, const Loc& where) {
  try {
    return resolve_device(options.device());
  } catch (const Error&) {
    detail::rethrow_at(where);
  }
}

Tensor random(Op op, Shape shape, const TensorOptions& options, const Loc& where) {
  if (!is_floating(options.dtype()))
    throw DTypeError(absl::StrCat(
        op == Op::Rand ? "rand" : "randn", ": expected a floating dtype, got ",
        dtype_torch_name(options.dtype()), " (at ", SourceLoc::from(where).str(), ")"));
  Attrs attrs;
  const detail::RandomDraws draws = detail::take_random_draws(numel(shape));
  attrs.set("seed", static_cast<int64_t>(draws.seed));
  attrs.set("offset", static_cast<int64_t>(draws.offset));
  return detail::make_op(op, {}, std::move(attrs), where, std::move(shape), options.dtype(),
                         target_device(options, where));
}

// A new tensor is a leaf: it requires grad when the options ask for it.
Tensor leaf(Tensor t, const TensorOptions& options) {
  if (options.requires_grad()) t.requires_grad_(true);
  return t;
}

}  // namespace

detail::RandomDraws detail::take_random_draws(int64_t count) {
  Generator& g = generator();
  std::lock_guard lock(g.mutex);
  const RandomDraws draws{g.seed, g.offset};
  g.offset += static_cast<uint64_t>(count);
  return draws;
}

void manual_seed(uint64_t seed) {
  Generator& g = generator();
  std::lock_guard lock(g.mutex);
  g.seed = seed;
  g.offset = 0;
}

Tensor get_rng_state() {
  Generator& g = generator();
  std::lock_guard lock(g.mutex);
  return tensor({static_cast<int64_t>(g.seed), static_cast<int64_t>(g.offset)},
                TensorOptions(kInt64));
}

void set_rng_state(const Tensor& state) {
  if (!state.defined() || state.dtype() != kInt64 || state.sizes() != Shape{2})
    throw ValueError(absl::StrCat("set_rng_state: expected get_rng_state()'s int64 [2], got ",
                                  state.defined() ? absl::StrCat(dtype_torch_name(state.dtype()),
                                                                 " ", shape_str(state.sizes()))
                                                  : "an undefined tensor"));
  const std::vector<int64_t> values = state.cpu().to_vector<int64_t>();
  Generator& g = generator();
  std::lock_guard lock(g.mutex);
  g.seed = static_cast<uint64_t>(values[0]);
  g.offset = static_cast<uint64_t>(values[1]);
}

Tensor from_vector(const std::vector<double>& values, Shape shape, TensorOptions options,
                   Loc where) {
  if (static_cast<int64_t>(values.size()) != numel(shape))
    throw ShapeError(absl::StrCat("from_vector: ", values.size(), " values do not fill shape ",
                                  shape_str(shape), " (at ", SourceLoc::from(where).str(), ")"));
  BufferView buffer = host_buffer_from(values.data(), DType::Float64, options.dtype(), shape);
  Tensor t(make_leaf(std::move(buffer), SourceLoc::from(where)));
  return leaf(t.to(options.device(), where), options);
}

Tensor tensor(const TensorData& data, TensorOptions options, Loc where) {
  // The shape from the first element at each depth; then every element checked against it.
  Shape shape;
  for (const TensorData* at = &data; at->is_list(); at = &at->list().front()) {
    shape.push_back(static_cast<int64_t>(at->list().size()));
    if (at->list().empty()) break;
  }
  std::vector<double> values;
  std::vector<int64_t> integers;
  TensorData::Kind kind = TensorData::Kind::Bool;  // the highest kind among the numbers
  auto flatten = [&](auto&& self, const TensorData& node, size_t depth) -> void {
    const bool leaf_expected = depth == shape.size();
    if (node.is_list() == leaf_expected ||
        (node.is_list() && static_cast<int64_t>(node.list().size()) != shape[depth]))
      throw ShapeError(absl::StrCat(
          "tensor: expected ",
          leaf_expected ? std::string("a number") : absl::StrCat("a list of length ", shape[depth]),
          " at dim ", depth, ", got ",
          node.is_list() ? absl::StrCat("a list of length ", node.list().size()) : "a number",
          " (at ", SourceLoc::from(where).str(), ")"));
    if (!node.is_list()) {
      values.push_back(node.value());
      integers.push_back(node.integer());
      kind = std::max(kind, node.kind());
      return;
    }
    for (const TensorData& element : node.list()) self(self, element, depth + 1);
  };
  flatten(flatten, data, 0);
  if (!options.has_dtype()) {
    const bool floating = values.empty() || kind == TensorData::Kind::Floating;
    options = options.dtype(floating                            ? DType::Float32
                            : kind == TensorData::Kind::Integer ? DType::Int64
                                                                : DType::Bool);
  }
  // Integers into an integer dtype exactly, whatever their size.
  if (!values.empty() && kind != TensorData::Kind::Floating && !is_floating(options.dtype())) {
    BufferView buffer = host_buffer_from(integers.data(), DType::Int64, options.dtype(), shape);
    Tensor t(make_leaf(std::move(buffer), SourceLoc::from(where)));
    return leaf(t.to(options.device(), where), options);
  }
  return from_vector(values, shape, options, where);
}

Tensor scalar_tensor(Scalar value, TensorOptions options, Loc where) {
  return full({}, value, options, where);
}

Tensor full(Shape shape, Scalar value, TensorOptions options, Loc where) {
  for (int64_t s : shape)
    if (s < 0)
      throw ShapeError(
          absl::StrCat("full: negative dimension ", s, " (at ", SourceLoc::from(where).str(), ")"));
  return leaf(detail::constant(value, options.dtype(), std::move(shape),
                               target_device(options, where), where),
              options);
}
Tensor zeros(Shape shape, TensorOptions options, Loc where) {
  return full(std::move(shape), 0, options, where);
}
Tensor ones(Shape shape, TensorOptions options, Loc where) {
  return full(std::move(shape), 1, options, where);
}

Tensor arange(Scalar end, TensorOptions options, Loc where) {
  return arange(0, end, 1, options, where);
}

Tensor arange(Scalar start, Scalar end, Scalar step, TensorOptions options, Loc where) {
  double s = start.to_double(), e = end.to_double(), d = step.to_double();
  if (d == 0 || (d > 0 && e < s) || (d < 0 && e > s))
    throw ShapeError(
        absl::StrCat("arange: upper bound and larger bound inconsistent with step sign (at ",
                     SourceLoc::from(where).str(), ")"));
  int64_t count = static_cast<int64_t>(std::ceil((e - s) / d));
  // PyTorch: integer arguments give int64, any float argument the default float dtype.
  bool any_float = start.kind() == ScalarKind::Floating || end.kind() == ScalarKind::Floating ||
                   step.kind() == ScalarKind::Floating;
  DType dtype = options.dtype();
  if (!options.has_dtype() && !any_float) dtype = DType::Int64;
  Attrs attrs;
  attrs.set("start", s);
  attrs.set("step", d);
  return leaf(detail::make_op(Op::Arange, {}, std::move(attrs), where, {count}, dtype,
                              target_device(options, where)),
              options.dtype(dtype));
}

Tensor rand(Shape shape, TensorOptions options, Loc where) {
  return leaf(random(Op::Rand, std::move(shape), options, where), options);
}
Tensor randn(Shape shape, TensorOptions options, Loc where) {
  return leaf(random(Op::Randn, std::move(shape), options, where), options);
}

}  // namespace lazyfuse
