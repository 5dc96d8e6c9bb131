// Tensor's methods and operators: each adds a pending node (op_builder.cc) and returns.
#include "lazyfuse/frontend/tensor.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "lazyfuse/frontend/attention.h"
#include "lazyfuse/frontend/op_builder.h"
#include "lazyfuse/frontend/tensor_format.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/ir/passes/passes.h"
#include "lazyfuse/runtime/devices.h"
#include "lazyfuse/runtime/executor.h"

namespace lazyfuse {

using detail::make_op;
using detail::scalar_operand;

const std::shared_ptr<TensorImpl>& Tensor::impl() const {
  if (!impl_) throw Error("use of an undefined Tensor (default-constructed or moved from)");
  return impl_;
}
const LazyRef& Tensor::value() const { return impl()->value; }

DType Tensor::dtype() const { return value()->node.dtype; }
Device Tensor::device() const { return value()->node.device; }
const Shape& Tensor::sizes() const { return value()->node.shape; }
int64_t Tensor::dim() const { return static_cast<int64_t>(sizes().size()); }
int64_t Tensor::numel() const { return lazyfuse::numel(sizes()); }
int64_t Tensor::size(int64_t d) const { return sizes()[normalize_dim(d, dim(), "size")]; }
bool Tensor::is_computed() const { return lazyfuse::is_computed(value()); }

const Strides& Tensor::strides() const { return value()->strides; }
int64_t Tensor::stride(int64_t d) const { return strides()[normalize_dim(d, dim(), "stride")]; }
int64_t Tensor::element_size() const { return dtype_size(dtype()); }
int64_t Tensor::nbytes() const { return numel() * element_size(); }

bool Tensor::shares_storage_with(const Tensor& other) const {
  eval({*this, other});
  return value()->buffer->storage == other.value()->buffer->storage;
}

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  const Strides& strides = value()->strides;
  for (size_t i = sizes().size(); i-- > 0;) {
    if (sizes()[i] != 1 && strides[i] != expected) return false;
    expected *= sizes()[i];
  }
  return true;
}

Tensor Tensor::to(Device device, Loc where) const {
  Device target = device;
  try {
    target = resolve_device(device);
  } catch (const Error&) {
    detail::rethrow_at(where);
  }
  if (target == this->device()) return *this;
  return make_op(Op::To, {*this}, {}, where, {}, DType::Float32, target);
}

Tensor Tensor::to(DType dtype, Loc where) const {
  if (dtype == this->dtype()) return *this;
  return make_op(Op::Cast, {*this}, {}, where, {}, dtype);
}

Tensor Tensor::neg(Loc where) const { return make_op(Op::Neg, {*this}, {}, where); }
#define LAZYFUSE_DEFINE_UNARY(name, op)                                                \
  Tensor Tensor::name(Loc where) const { return make_op(Op::op, {*this}, {}, where); } \
  Tensor name(const Tensor& t, Loc where) { return t.name(where); }
LAZYFUSE_UNARY_OPS(LAZYFUSE_DEFINE_UNARY)
#undef LAZYFUSE_DEFINE_UNARY
Tensor Tensor::pow(const Tensor& exponent, Loc where) const {
  return make_op(Op::Pow, {*this, exponent}, {}, where);
}
Tensor Tensor::pow(Scalar exponent, Loc where) const {
  return make_op(Op::Pow, {*this, scalar_operand(exponent, *this, where)}, {}, where);
}
Tensor Tensor::clamp(Scalar min, Scalar max, Loc where) const {
  return make_op(Op::Clamp,
                 {*this, scalar_operand(min, *this, where), scalar_operand(max, *this, where)}, {},
                 where);
}
Tensor Tensor::clamp(const Tensor& min, const Tensor& max, Loc where) const {
  return make_op(Op::Clamp, {*this, min, max}, {}, where);
}
// A floating clamp_min is a clamp to [min, inf], so that its gradient at x == min is
// PyTorch's (all of it to x; maximum would split a tie).
Tensor Tensor::clamp_min(Scalar min, Loc where) const {
  if (is_floating(dtype())) return clamp(min, std::numeric_limits<double>::infinity(), where);
  return make_op(Op::Maximum, {*this, scalar_operand(min, *this, where)}, {}, where);
}
Tensor Tensor::clamp_max(Scalar max, Loc where) const {
  if (is_floating(dtype())) return clamp(-std::numeric_limits<double>::infinity(), max, where);
  return make_op(Op::Minimum, {*this, scalar_operand(max, *this, where)}, {}, where);
}

namespace {
Tensor reduce(Op op, const Tensor& t, std::vector<int64_t> dims, bool keepdim, const Loc& where) {
  Attrs attrs;
  attrs.set("dims", std::move(dims));
  attrs.set("keepdim", keepdim);
  return make_op(op, {t}, std::move(attrs), where);
}
}  // namespace

Tensor Tensor::sum(Loc where) const { return reduce(Op::Sum, *this, {}, false, where); }
Tensor Tensor::sum(IntArrayRef dims, bool keepdim, Loc where) const {
  return reduce(Op::Sum, *this, dims.vec(), keepdim, where);
}
Tensor Tensor::mean(Loc where) const { return reduce(Op::Mean, *this, {}, false, where); }
Tensor Tensor::mean(IntArrayRef dims, bool keepdim, Loc where) const {
  return reduce(Op::Mean, *this, dims.vec(), keepdim, where);
}
Tensor Tensor::max(Loc where) const { return reduce(Op::Max, *this, {}, false, where); }
Tensor Tensor::max(IntArrayRef dims, bool keepdim, Loc where) const {
  return reduce(Op::Max, *this, dims.vec(), keepdim, where);
}
Tensor Tensor::min(Loc where) const { return reduce(Op::Min, *this, {}, false, where); }
Tensor Tensor::min(IntArrayRef dims, bool keepdim, Loc where) const {
  return reduce(Op::Min, *this, dims.vec(), keepdim, where);
}

Tensor Tensor::matmul(const Tensor& other, Loc where) const {
  // A softmax of scores times the values: attention written by hand, made one node where it can
  // be (Note [Attention written by hand] in attention_pattern.cc).
  if (Tensor attention = detail::attention_from_pattern(*this, other, where); attention.defined())
    return attention;
  return make_op(Op::Matmul, {*this, other}, {}, where);
}

namespace {
// Resolves one -1 in a requested shape, as PyTorch's infer_size.
Shape infer_size(Shape shape, int64_t total, const Loc& where) {
  int64_t known = 1;
  int infer = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      if (infer >= 0)
        throw ShapeError(absl::StrCat("only one dimension can be inferred (at ",
                                      SourceLoc::from(where).str(), ")"));
      infer = static_cast<int>(i);
    } else if (shape[i] < 0) {
      throw ShapeError(absl::StrCat("invalid shape dimension ", shape[i], " (at ",
                                    SourceLoc::from(where).str(), ")"));
    } else if (__builtin_mul_overflow(known, shape[i], &known)) {
      // No tensor has that many elements: the shape cannot be this tensor's.
      throw ShapeError(absl::StrCat("shape '", shape_str(shape), "' is invalid for input of size ",
                                    total, " (at ", SourceLoc::from(where).str(), ")"));
    }
  }
  if (infer >= 0) {
    if (known == 0 || total % known != 0)
      throw ShapeError(absl::StrCat("shape '", shape_str(shape), "' is invalid for input of size ",
                                    total, " (at ", SourceLoc::from(where).str(), ")"));
    shape[infer] = total / known;
  }
  return shape;
}
}  // namespace

Tensor Tensor::view(Shape shape, Loc where) const {
  return make_op(Op::Reshape, {*this}, {}, where, infer_size(std::move(shape), numel(), where));
}

Tensor Tensor::reshape(Shape shape, Loc where) const {
  shape = infer_size(std::move(shape), numel(), where);
  Strides strides;
  if (shape == sizes()) return *this;
  if (!view_strides(sizes(), value()->strides, shape, &strides)) {
    return make_op(Op::Reshape, {contiguous(where)}, {}, where, std::move(shape));
  }
  return make_op(Op::Reshape, {*this}, {}, where, std::move(shape));
}

namespace {
// Whether the strides the frontend foresaw for the pending view `value` are the ones it will
// have: a view's are derived from its operand's, so they hold when its chain of views ends on a
// computed value. A chain over a pending value may end otherwise: the passes may store that
// value in another layout (sink_views computes (x + 1).t() as x.t() + 1), and a reshape over it
// then copies (Note [Reshape of any layout] in runtime/executor.cc).
bool view_layout_is_settled(const LazyValue* value) {
  while (!value->computed() && is_view(value->node.op)) value = value->inputs[0].get();
  return value->computed();
}
}  // namespace

// Honest whether or not the value is computed: *this only where its layout is settled and
// dense (computed values have their buffer's strides, and a pending value that is not a view is
// stored densely), so that after evaluation is_contiguous() still holds and data_ptr() walks the
// elements in order; otherwise a copy, which evaluation stores densely.
Tensor Tensor::contiguous(Loc where) const {
  const LazyValue* v = value().get();
  const bool pending_view = !v->computed() && is_view(v->node.op);
  if (is_contiguous() && (!pending_view || view_layout_is_settled(v))) return *this;
  return make_op(Op::Copy, {*this}, {}, where);
}

Tensor Tensor::permute(std::vector<int64_t> dims, Loc where) const {
  Attrs attrs;
  attrs.set("dims", std::move(dims));
  return make_op(Op::Permute, {*this}, std::move(attrs), where);
}

Tensor Tensor::transpose(int64_t dim0, int64_t dim1, Loc where) const {
  std::vector<int64_t> dims(std::max<int64_t>(dim(), 1));
  for (size_t i = 0; i < dims.size(); ++i) dims[i] = static_cast<int64_t>(i);
  if (dim() == 0) return *this;
  try {
    std::swap(dims[normalize_dim(dim0, dim(), "transpose")],
              dims[normalize_dim(dim1, dim(), "transpose")]);
  } catch (const Error&) {
    detail::rethrow_at(where);
  }
  return permute(std::move(dims), where);
}

Tensor Tensor::t(Loc where) const {
  if (dim() > 2)
    throw ShapeError(absl::StrCat("t() expects a tensor with <= 2 dimensions, but self is ", dim(),
                                  "D (at ", SourceLoc::from(where).str(), ")"));
  return dim() < 2 ? *this : transpose(0, 1, where);
}

Tensor Tensor::unsqueeze(int64_t d, Loc where) const {
  Shape shape = sizes();
  try {
    d = normalize_dim(d, dim() + 1, "unsqueeze");
  } catch (const Error&) {
    detail::rethrow_at(where);
  }
  shape.insert(shape.begin() + d, 1);
  return make_op(Op::Reshape, {*this}, {}, where, std::move(shape));
}

Tensor Tensor::squeeze(Loc where) const {
  Shape shape;
  for (int64_t s : sizes())
    if (s != 1) shape.push_back(s);
  if (shape == sizes()) return *this;
  return make_op(Op::Reshape, {*this}, {}, where, std::move(shape));
}

Tensor Tensor::squeeze(int64_t d, Loc where) const {
  try {
    d = normalize_dim(d, dim(), "squeeze");
  } catch (const Error&) {
    detail::rethrow_at(where);
  }
  if (dim() == 0 || sizes()[d] != 1) return *this;
  Shape shape = sizes();
  shape.erase(shape.begin() + d);
  return make_op(Op::Reshape, {*this}, {}, where, std::move(shape));
}

Tensor Tensor::expand(Shape shape, Loc where) const {
  // -1 keeps the existing size, as in PyTorch.
  size_t offset = shape.size() >= sizes().size() ? shape.size() - sizes().size() : 0;
  for (size_t i = offset; i < shape.size(); ++i)
    if (shape[i] == -1) shape[i] = sizes()[i - offset];
  if (shape == sizes()) return *this;
  return make_op(Op::Expand, {*this}, {}, where, std::move(shape));
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length, Loc where) const {
  Shape shape = sizes();
  try {
    d = normalize_dim(d, dim(), "narrow");
    if (start < 0) start += shape[d];
  } catch (const Error&) {
    detail::rethrow_at(where);
  }
  shape[d] = length;  // the shape rule rejects a length that does not fit
  Attrs attrs;
  attrs.set("dim", d);
  attrs.set("start", start);
  return make_op(Op::Narrow, {*this}, std::move(attrs), where, std::move(shape));
}

namespace {

// The value's elements on the host, contiguous, converted to `as`.
std::vector<std::byte> host_values(const Tensor& t, DType as) {
  eval(t);
  std::vector<std::byte> out(t.numel() * dtype_size(as));
  read_to_host(*t.value()->buffer, as, out.data());
  return out;
}

template <typename T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, bool>)
    return DType::Bool;
  else if constexpr (std::is_same_v<T, int32_t>)
    return DType::Int32;
  else if constexpr (std::is_same_v<T, int64_t>)
    return DType::Int64;
  else if constexpr (std::is_same_v<T, float>)
    return DType::Float32;
  else
    return DType::Float64;
}

}  // namespace

void* Tensor::data_ptr(Loc where) const {
  (void)where;
  eval(*this);
  return value()->buffer->data();
}

template <typename T>
T* Tensor::data_ptr(Loc where) const {
  if (dtype_of<T>() != dtype())
    throw DTypeError(absl::StrCat("data_ptr: expected scalar type ", dtype_torch_name(dtype()),
                                  " but found ", dtype_torch_name(dtype_of<T>()), " (at ",
                                  SourceLoc::from(where).str(), ")"));
  return static_cast<T*>(data_ptr(where));
}
template bool* Tensor::data_ptr<bool>(Loc) const;
template int32_t* Tensor::data_ptr<int32_t>(Loc) const;
template int64_t* Tensor::data_ptr<int64_t>(Loc) const;
template float* Tensor::data_ptr<float>(Loc) const;
template double* Tensor::data_ptr<double>(Loc) const;

template <typename T>
std::vector<T> Tensor::to_vector() const {
  std::vector<std::byte> bytes = host_values(*this, dtype_of<T>());
  std::vector<T> out(numel());
  for (int64_t i = 0; i < numel(); ++i)
    std::memcpy(&out[i], bytes.data() + i * sizeof(T), sizeof(T));
  return out;
}

template <typename T>
T Tensor::item() const {
  if (numel() != 1)
    throw ShapeError(
        absl::StrCat("a Tensor with ", numel(), " elements cannot be converted to Scalar"));
  return to_vector<T>()[0];
}

template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<int32_t> Tensor::to_vector<int32_t>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;
template <>
std::vector<bool> Tensor::to_vector<bool>() const {
  std::vector<std::byte> bytes = host_values(*this, DType::Bool);
  std::vector<bool> out(numel());
  for (int64_t i = 0; i < numel(); ++i) out[i] = bytes[i] != std::byte{0};
  return out;
}
Scalar Tensor::item() const {
  if (dtype() == DType::Bool) return Scalar(item<bool>());
  if (is_floating(dtype())) return Scalar(item<double>());
  return Scalar(item<int64_t>());
}

template float Tensor::item<float>() const;
template double Tensor::item<double>() const;
template int32_t Tensor::item<int32_t>() const;
template int64_t Tensor::item<int64_t>() const;
template bool Tensor::item<bool>() const;

std::string Tensor::str() const {
  FormatInput in;
  in.shape = sizes();
  in.is_floating = is_floating(dtype());
  in.is_bool = dtype() == DType::Bool;
  if (is_integral(dtype())) {
    in.int_values = to_vector<int64_t>();
  } else {
    in.values = to_vector<double>();
  }
  bool default_dtype = dtype() == DType::Float32 ||
                       (numel() > 0 && (dtype() == DType::Int64 || dtype() == DType::Bool));
  if (!default_dtype) in.dtype_suffix = absl::StrCat("dtype=", dtype_torch_name(dtype()));
  if (!device().is_cpu()) in.device_suffix = absl::StrCat("device='", device().str(), "'");
  if (!is_leaf()) {
    in.grad_suffix = absl::StrCat("grad_fn=<", grad_fn_name(), ">");
  } else if (requires_grad()) {
    in.grad_suffix = "requires_grad=True";
  }
  return format_tensor(in);
}

std::string Tensor::ir() const {
  LazyRef v = value();
  BuiltGraph built = build_graph(std::span(&v, 1));
  return print_graph(built.graph);
}

std::string Tensor::fused_ir(const EvalOptions& options) const {
  return lazyfuse::fused_ir(std::vector<Tensor>{*this}, options);
}

std::string fused_ir(const std::vector<Tensor>& tensors, const EvalOptions& options) {
  std::vector<LazyRef> values;
  for (const Tensor& t : tensors) values.push_back(t.value());
  return scheduled_ir(values, options);
}

std::ostream& operator<<(std::ostream& os, const Tensor& tensor) { return os << tensor.str(); }

std::ostream& operator<<(std::ostream& os, const TensorOptions& options) {
  return os << "TensorOptions(dtype=" << options.dtype()
            << (options.has_dtype() ? "" : " (default)") << ", device=" << options.device()
            << (options.device() == Device::cpu() ? " (default)" : "")
            << ", requires_grad=" << (options.requires_grad() ? "true" : "false (default)") << ")";
}

// Operators.
namespace {
Tensor binary(Op op, const Tensor& a, const Tensor& b, const Loc& where) {
  return make_op(op, {a, b}, {}, where);
}
}  // namespace

#define LF_BINARY_OPERATOR(symbol, op)                                          \
  Tensor operator symbol(TensorArg a, const Tensor& b) {                        \
    return binary(op, a.tensor, b, a.where);                                    \
  }                                                                             \
  Tensor operator symbol(TensorArg a, Scalar b) {                               \
    return binary(op, a.tensor, scalar_operand(b, a.tensor, a.where), a.where); \
  }
LF_BINARY_OPERATOR(+, Op::Add)
LF_BINARY_OPERATOR(-, Op::Sub)
LF_BINARY_OPERATOR(*, Op::Mul)
LF_BINARY_OPERATOR(/, Op::Div)
LF_BINARY_OPERATOR(==, Op::Eq)
LF_BINARY_OPERATOR(!=, Op::Ne)
LF_BINARY_OPERATOR(<, Op::Lt)
LF_BINARY_OPERATOR(<=, Op::Le)
LF_BINARY_OPERATOR(>, Op::Gt)
LF_BINARY_OPERATOR(>=, Op::Ge)
#undef LF_BINARY_OPERATOR

#define LF_SCALAR_FIRST_OPERATOR(symbol, op)                                    \
  Tensor operator symbol(Scalar a, TensorArg b) {                               \
    return binary(op, scalar_operand(a, b.tensor, b.where), b.tensor, b.where); \
  }
LF_SCALAR_FIRST_OPERATOR(+, Op::Add)
LF_SCALAR_FIRST_OPERATOR(-, Op::Sub)
LF_SCALAR_FIRST_OPERATOR(*, Op::Mul)
LF_SCALAR_FIRST_OPERATOR(/, Op::Div)
LF_SCALAR_FIRST_OPERATOR(==, Op::Eq)
LF_SCALAR_FIRST_OPERATOR(!=, Op::Ne)
LF_SCALAR_FIRST_OPERATOR(<, Op::Lt)
LF_SCALAR_FIRST_OPERATOR(<=, Op::Le)
LF_SCALAR_FIRST_OPERATOR(>, Op::Gt)
LF_SCALAR_FIRST_OPERATOR(>=, Op::Ge)
#undef LF_SCALAR_FIRST_OPERATOR

Tensor operator-(TensorArg a) { return a.tensor.neg(a.where); }

Tensor pow(const Tensor& base, const Tensor& exponent, Loc where) {
  return base.pow(exponent, where);
}
Tensor pow(const Tensor& base, Scalar exponent, Loc where) { return base.pow(exponent, where); }
Tensor pow(Scalar base, const Tensor& exponent, Loc where) {
  return binary(Op::Pow, scalar_operand(base, exponent, where), exponent, where);
}
Tensor maximum(const Tensor& a, const Tensor& b, Loc where) {
  return binary(Op::Maximum, a, b, where);
}
Tensor minimum(const Tensor& a, const Tensor& b, Loc where) {
  return binary(Op::Minimum, a, b, where);
}
Tensor clamp(const Tensor& t, Scalar min, Scalar max, Loc where) {
  return t.clamp(min, max, where);
}
Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b, Loc where) {
  return make_op(Op::Where, {condition, a, b}, {}, where);
}
Tensor where(const Tensor& condition, const Tensor& a, Scalar b, Loc where) {
  return make_op(Op::Where, {condition, a, scalar_operand(b, a, where)}, {}, where);
}
Tensor where(const Tensor& condition, Scalar a, const Tensor& b, Loc where) {
  return make_op(Op::Where, {condition, scalar_operand(a, b, where), b}, {}, where);
}
Tensor where(const Tensor& condition, Scalar a, Scalar b, Loc where) {
  // Two scalars: the result takes their promoted dtype, as torch.where does.
  Tensor like =
      detail::constant(a, promote_with_scalar(promote_with_scalar(DType::Bool, a.kind()), b.kind()),
                       {}, condition.device(), where);
  return make_op(Op::Where, {condition, like, scalar_operand(b, like, where)}, {}, where);
}
Tensor matmul(const Tensor& a, const Tensor& b, Loc where) { return a.matmul(b, where); }

void eval(const Tensor& t) { evaluate(std::span(&t.value(), 1)); }
void eval(std::initializer_list<Tensor> tensors) { eval(std::vector<Tensor>(tensors)); }
void eval(const std::vector<Tensor>& tensors) { eval(tensors, EvalOptions()); }
void eval(const std::vector<Tensor>& tensors, const EvalOptions& options) {
  std::vector<LazyRef> values;
  for (const Tensor& t : tensors) values.push_back(t.value());
  evaluate(values, options);
}

}  // namespace lazyfuse
