// Tensor: a handle to a value that may not be computed yet. Every op adds a node to the pending
// graph and returns at once; the graph runs when a value is needed (printing, item, to_vector)
// or when eval() is called. The API follows LibTorch.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <ostream>
#include <source_location>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "lazyfuse/ir/device.h"
#include "lazyfuse/ir/dtype.h"
#include "lazyfuse/ir/shape.h"
#include "lazyfuse/runtime/lazy.h"
#include "lazyfuse/runtime/pool_allocator.h"

namespace lazyfuse {

inline constexpr DType kBool = DType::Bool;
inline constexpr DType kInt32 = DType::Int32;
inline constexpr DType kInt64 = DType::Int64;
inline constexpr DType kFloat16 = DType::Float16;
inline constexpr DType kBFloat16 = DType::BFloat16;
inline constexpr DType kFloat32 = DType::Float32;
inline constexpr DType kFloat64 = DType::Float64;
inline constexpr DType kFloat = DType::Float32;
inline constexpr DType kDouble = DType::Float64;
inline constexpr DType kHalf = DType::Float16;
inline constexpr DType kLong = DType::Int64;
inline constexpr DType kInt = DType::Int32;
inline constexpr DeviceType kCPU = DeviceType::CPU;
inline constexpr DeviceType kCUDA = DeviceType::CUDA;

// A number as an operand: keeps whether it was written as a bool, an integer or a float, which
// decides the result dtype as in PyTorch (int tensor + 2 stays int; + 2.5 becomes float).
class Scalar {
 public:
  Scalar(bool v) : kind_(ScalarKind::Bool), value_(v), int_value_(v) {}     // NOLINT
  Scalar(int v) : kind_(ScalarKind::Integral), value_(v), int_value_(v) {}  // NOLINT
  Scalar(int64_t v)                                                         // NOLINT
      : kind_(ScalarKind::Integral), value_(static_cast<double>(v)), int_value_(v) {}
  Scalar(float v) : kind_(ScalarKind::Floating), value_(v), int_value_(0) {}   // NOLINT
  Scalar(double v) : kind_(ScalarKind::Floating), value_(v), int_value_(0) {}  // NOLINT
  ScalarKind kind() const { return kind_; }
  bool is_floating_point() const { return kind_ == ScalarKind::Floating; }
  bool is_integral() const { return kind_ == ScalarKind::Integral; }
  bool is_boolean() const { return kind_ == ScalarKind::Bool; }
  double to_double() const { return value_; }
  int64_t to_int() const {
    return kind_ == ScalarKind::Floating ? static_cast<int64_t>(value_) : int_value_;
  }
  // The value as T, as LibTorch's Scalar::to<T>(): an integer exactly, a float as converted.
  template <typename T>
  T to() const {
    if constexpr (std::is_floating_point_v<T>)
      return static_cast<T>(kind_ == ScalarKind::Floating ? value_
                                                          : static_cast<double>(int_value_));
    else
      return static_cast<T>(to_int());
  }

 private:
  ScalarKind kind_;
  double value_;
  int64_t int_value_;
};

// dtype and device of a new tensor, as LibTorch's TensorOptions: rand({2, 3}, kFloat64),
// zeros({3}, Device("cuda:1")), ones({2}, TensorOptions().dtype(kInt32).device("cpu")).
class TensorOptions {
 public:
  TensorOptions() = default;
  TensorOptions(DType dtype) : dtype_(dtype) {}                          // NOLINT
  TensorOptions(Device device) : device_(device) {}                      // NOLINT
  TensorOptions(const char* device) : device_(Device(device)) {}         // NOLINT
  TensorOptions(const std::string& device) : device_(Device(device)) {}  // NOLINT
  TensorOptions dtype(DType dtype) const {
    TensorOptions o = *this;
    o.dtype_ = dtype;
    return o;
  }
  // A Device, or what makes one, as LibTorch's: device("cuda:0"), device(std::string),
  // device(DeviceType::CUDA, 1). (The string overloads are here rather than a Device
  // constructor from std::string, which would make other overloads on Device ambiguous.)
  TensorOptions device(Device device) const {
    TensorOptions o = *this;
    o.device_ = device;
    return o;
  }
  TensorOptions device(const char* device) const { return this->device(Device(device)); }
  TensorOptions device(const std::string& device) const { return this->device(Device(device)); }
  TensorOptions device(DeviceType type, int index = -1) const {
    return device(Device(type, index));
  }
  // Whether the new tensor is a leaf whose gradient backward() accumulates (floating only).
  TensorOptions requires_grad(bool requires_grad) const {
    TensorOptions o = *this;
    o.requires_grad_ = requires_grad;
    return o;
  }
  DType dtype() const { return dtype_.value_or(DType::Float32); }
  bool has_dtype() const { return dtype_.has_value(); }
  Device device() const { return device_; }
  bool requires_grad() const { return requires_grad_; }

 private:
  std::optional<DType> dtype_;
  Device device_ = Device::cpu();
  bool requires_grad_ = false;
};

// TensorOptions(dtype=torch.float64, device=cpu (default), requires_grad=false (default)): as
// LibTorch prints its options, "(default)" after each value that is the default one.
std::ostream& operator<<(std::ostream& os, const TensorOptions& options);

using Loc = std::source_location;

// Dims given as one or several, as LibTorch's IntArrayRef takes them: 1, {0, 2}, a
// std::vector<int64_t>; {} is none (a reduction over every dim). Unlike LibTorch's, it holds its
// values.
class IntArrayRef {
 public:
  IntArrayRef() = default;
  IntArrayRef(int64_t value) : values_{value} {}                            // NOLINT
  IntArrayRef(int value) : values_{value} {}                                // NOLINT
  IntArrayRef(std::initializer_list<int64_t> values) : values_(values) {}   // NOLINT
  IntArrayRef(std::vector<int64_t> values) : values_(std::move(values)) {}  // NOLINT
  const std::vector<int64_t>& vec() const { return values_; }
  operator const std::vector<int64_t>&() const { return values_; }  // NOLINT

 private:
  std::vector<int64_t> values_;
};

struct AutogradMeta;  // frontend/autograd.h

// What a Tensor handle points at; copies of a handle share it, as LibTorch's TensorImpl. An
// in-place op (add_, copy_, ...) rebinds `value` to a new pending value and bumps `version`:
// values themselves never change, so everything made from the old value keeps meaning what it
// meant when it was made (Note [In-place updates] in in_place.cc).
struct TensorImpl {
  explicit TensorImpl(LazyRef value) : value(std::move(value)) {}
  LazyRef value;
  uint32_t version = 0;
  // Set when the tensor requires grad: a leaf's accumulated gradient, or the node that
  // computes a non-leaf's gradient.
  std::shared_ptr<AutogradMeta> autograd;
};

// The unary elementwise ops of ir/ops.def that are a method and a free function of the same name,
// as torch's x.exp() and torch::exp(x), each as X(name, Op enumerator). A new unary op is its
// ops.def line and its entry here.
// clang-format off
#define LAZYFUSE_UNARY_OPS(X)                                                \
  X(abs, Abs) X(exp, Exp) X(log, Log) X(sqrt, Sqrt) X(rsqrt, Rsqrt)          \
  X(log1p, Log1p) X(expm1, Expm1) X(erf, Erf) X(sin, Sin) X(cos, Cos)        \
  X(tanh, Tanh) X(sigmoid, Sigmoid) X(relu, Relu)
// clang-format on

class Tensor {
 public:
  Tensor() = default;  // undefined: every use but defined() throws
  explicit Tensor(LazyRef value) : impl_(make_pooled<TensorImpl>(std::move(value))) {}
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  DType dtype() const;
  DType scalar_type() const { return dtype(); }
  Device device() const;
  const Shape& sizes() const;
  Shape shape() const { return sizes(); }
  int64_t size(int64_t dim) const;
  int64_t dim() const;
  int64_t numel() const;
  // Whether the value has been computed (holds a buffer).
  bool is_computed() const;
  // The same tensor, not merely equal: t.to(t.device()).is_same(t).
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }
  // Whether both share one storage (views of one buffer).
  bool shares_storage_with(const Tensor& other) const;

  // Devices and dtypes. To the device or dtype the tensor already has, returns this tensor.
  Tensor to(Device device, Loc where = Loc::current()) const;
  Tensor to(const char* device, Loc where = Loc::current()) const {
    return to(Device(device), where);
  }
  Tensor to(const std::string& device, Loc where = Loc::current()) const {
    return to(Device(device), where);
  }
  Tensor to(DType dtype, Loc where = Loc::current()) const;
  Tensor cpu(Loc where = Loc::current()) const { return to(Device::cpu(), where); }

  // Elementwise: neg (also operator-), the unary ops of LAZYFUSE_UNARY_OPS (abs, exp, log,
  // sqrt, rsqrt, log1p, expm1, erf, sin, cos, tanh, sigmoid, relu), pow, clamp.
  Tensor neg(Loc where = Loc::current()) const;
#define LAZYFUSE_DECLARE_UNARY_METHOD(name, op) Tensor name(Loc where = Loc::current()) const;
  LAZYFUSE_UNARY_OPS(LAZYFUSE_DECLARE_UNARY_METHOD)
#undef LAZYFUSE_DECLARE_UNARY_METHOD
  Tensor pow(const Tensor& exponent, Loc where = Loc::current()) const;
  Tensor pow(Scalar exponent, Loc where = Loc::current()) const;
  Tensor clamp(Scalar min, Scalar max, Loc where = Loc::current()) const;
  Tensor clamp(const Tensor& min, const Tensor& max, Loc where = Loc::current()) const;
  Tensor clamp_min(Scalar min, Loc where = Loc::current()) const;
  Tensor clamp_max(Scalar max, Loc where = Loc::current()) const;

  // Reductions: over all dims, or the given ones: one (t.sum(1)) or several (t.sum({0, 2})).
  Tensor sum(Loc where = Loc::current()) const;
  Tensor sum(IntArrayRef dims, bool keepdim = false, Loc where = Loc::current()) const;
  Tensor mean(Loc where = Loc::current()) const;
  Tensor mean(IntArrayRef dims, bool keepdim = false, Loc where = Loc::current()) const;
  Tensor max(Loc where = Loc::current()) const;
  Tensor max(IntArrayRef dims, bool keepdim = false, Loc where = Loc::current()) const;
  Tensor min(Loc where = Loc::current()) const;
  Tensor min(IntArrayRef dims, bool keepdim = false, Loc where = Loc::current()) const;
  // The largest (smallest) values over the given dims, all when none are given; ties share the
  // gradient. max(dims) and min(dims) above are amax and amin: for LibTorch's values and
  // indices, whose gradient goes to the chosen element alone, use the free max(t, dim).
  Tensor amax(IntArrayRef dims = {}, bool keepdim = false, Loc where = Loc::current()) const;
  Tensor amin(IntArrayRef dims = {}, bool keepdim = false, Loc where = Loc::current()) const;

  Tensor matmul(const Tensor& other, Loc where = Loc::current()) const;

  // Views: no copy (reshape copies only when no view exists, as in PyTorch).
  Tensor reshape(Shape shape, Loc where = Loc::current()) const;
  Tensor view(Shape shape, Loc where = Loc::current()) const;
  Tensor transpose(int64_t dim0, int64_t dim1, Loc where = Loc::current()) const;
  Tensor t(Loc where = Loc::current()) const;
  Tensor permute(std::vector<int64_t> dims, Loc where = Loc::current()) const;
  Tensor unsqueeze(int64_t dim, Loc where = Loc::current()) const;
  Tensor squeeze(Loc where = Loc::current()) const;
  Tensor squeeze(int64_t dim, Loc where = Loc::current()) const;
  Tensor expand(Shape shape, Loc where = Loc::current()) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length, Loc where = Loc::current()) const;
  // A tensor whose elements lie densely in row-major order once computed: this one where that
  // is certain, else a copy. Certain means computed and dense, pending and not a view
  // (evaluation stores such a value densely), or a dense view of views of a computed value. A
  // view of a pending value is copied even where is_contiguous() says true, since the passes
  // may store that value in another layout than foreseen (Note [Reshape of any layout] in
  // runtime/executor.cc). So is_contiguous() of the result holds before and after evaluation,
  // and data_ptr() of it walks the elements in order.
  Tensor contiguous(Loc where = Loc::current()) const;
  // Whether the strides are the dense ones: the buffer's for a computed value, the frontend's
  // forecast for a pending one (exact except for views of pending values, as above).
  bool is_contiguous() const;
  // Pieces along `dim`, views sharing this tensor's storage (frontend/split_and_mask.cc):
  // split(n) into pieces of n (the last smaller), split({2, 3}) into pieces of those sizes
  // (summing to the dim's size), chunk(k) into at most k pieces of ceil(size / k).
  std::vector<Tensor> split(int64_t split_size, int64_t dim = 0, Loc where = Loc::current()) const;
  std::vector<Tensor> split(IntArrayRef split_sizes, int64_t dim = 0,
                            Loc where = Loc::current()) const;
  std::vector<Tensor> split_with_sizes(IntArrayRef split_sizes, int64_t dim = 0,
                                       Loc where = Loc::current()) const;
  std::vector<Tensor> chunk(int64_t chunks, int64_t dim = 0, Loc where = Loc::current()) const;
  // The lower (upper) triangle of the last two dims: elements with col - row <= diagonal
  // (>= diagonal) kept, the rest zero.
  Tensor tril(int64_t diagonal = 0, Loc where = Loc::current()) const;
  Tensor triu(int64_t diagonal = 0, Loc where = Loc::current()) const;
  // `value` where the bool `mask` (broadcast with this tensor) is true; this tensor's dtype.
  // value is a number or a 0-d tensor (whose gradient is the sum over the masked elements).
  Tensor masked_fill(const Tensor& mask, Scalar value, Loc where = Loc::current()) const;
  Tensor masked_fill(const Tensor& mask, const Tensor& value, Loc where = Loc::current()) const;
  // Elements between neighbours along each dim, as the value lies (or will lie) in memory.
  const Strides& strides() const;
  int64_t stride(int64_t dim) const;
  // Bytes of one element, and of all numel() elements.
  int64_t element_size() const;
  int64_t nbytes() const;
  // Where the value lies, computing it first: its first element (a view's, past its offset), on
  // its device (a CUDA pointer for a CUDA tensor). Writing through it changes the value for
  // everything that reads it afterwards, as in LibTorch; lazyfuse never writes into it again
  // (values do not change: Note [In-place updates] in in_place.cc). data_ptr<T>() checks that T
  // is the dtype's type (bool, int32_t, int64_t, float, double; void* for any dtype).
  void* data_ptr(Loc where = Loc::current()) const;
  template <typename T>
  T* data_ptr(Loc where = Loc::current()) const;

  // Index ops (frontend/indexing.cc), as the free functions of the same names.
  Tensor gather(int64_t dim, const Tensor& index, Loc where = Loc::current()) const;
  Tensor scatter_add(int64_t dim, const Tensor& index, const Tensor& src,
                     Loc where = Loc::current()) const;
  Tensor index_select(int64_t dim, const Tensor& index, Loc where = Loc::current()) const;

  // Reading values computes them, and copies them to the host when they live on a GPU. item()
  // of a one-element tensor of any dtype: a Scalar of its kind (bool, integral, floating), or as
  // T; a ShapeError for more elements.
  Scalar item() const;
  template <typename T>
  T item() const;
  template <typename T>
  std::vector<T> to_vector() const;
  // PyTorch's print format: tensor([1., 2., 3.]).
  std::string str() const;
  // The text of the pending graph that computes this tensor.
  std::string ir() const;
  // The same graph after the passes (placement, cse, dce, fusion): the fused kernels an
  // evaluation with `options` would run (fusion off runs one kernel per op, as LAZYFUSE_FUSION=0
  // does). Computes nothing. fused_ir({a, b}) shows what eval({a, b}) would run.
  std::string fused_ir(const EvalOptions& options = {}) const;

  // Autograd (frontend/autograd.h), as LibTorch's.
  bool requires_grad() const;
  // Makes this leaf record the ops applied to it, so backward() reaches it; floating only.
  Tensor& requires_grad_(bool requires_grad = true);
  Tensor& set_requires_grad(bool requires_grad) { return requires_grad_(requires_grad); }
  // Whether the tensor was made by the user rather than by an op that records a gradient.
  bool is_leaf() const;
  // The gradient backward() accumulated into this leaf (undefined until then).
  const Tensor& grad() const;
  Tensor& mutable_grad();
  // Also keep the gradient of this non-leaf in grad() on backward().
  void retain_grad();
  // The name of the node that computes this tensor's gradient ("MulBackward0"), or "" for a leaf.
  std::string grad_fn_name() const;
  // The same value, cut off from the graph of gradients.
  Tensor detach() const;
  // Accumulates d(this)/d(leaf) * gradient into every leaf's grad(). `gradient` may be omitted
  // for a one-element tensor. The graph's saved values are freed unless retain_graph.
  void backward(const Tensor& gradient = {}, std::optional<bool> retain_graph = std::nullopt,
                bool create_graph = false) const;

  // In place: the handle (and every copy of it) now names the new value; see TensorImpl.
  Tensor& add_(const Tensor& other, Scalar alpha = 1, Loc where = Loc::current());
  Tensor& add_(Scalar other, Loc where = Loc::current());
  Tensor& sub_(const Tensor& other, Scalar alpha = 1, Loc where = Loc::current());
  Tensor& sub_(Scalar other, Loc where = Loc::current());
  Tensor& mul_(const Tensor& other, Loc where = Loc::current());
  Tensor& mul_(Scalar other, Loc where = Loc::current());
  Tensor& div_(const Tensor& other, Loc where = Loc::current());
  Tensor& div_(Scalar other, Loc where = Loc::current());
  Tensor& copy_(const Tensor& source, Loc where = Loc::current());
  Tensor& fill_(Scalar value, Loc where = Loc::current());
  Tensor& zero_(Loc where = Loc::current());
  // Replaces the tensor's value with `new_data`'s (no op is recorded), keeping requires_grad and
  // grad(): how a module moves its parameters between devices.
  void set_data(const Tensor& new_data);
  // The number of in-place updates this tensor has had (PyTorch's version counter).
  uint32_t _version() const;

  const LazyRef& value() const;
  const std::shared_ptr<TensorImpl>& impl() const;

 private:
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& tensor);

// An operand of an operator together with where the operator was written: operators cannot
// take a defaulted source_location, but the implicit conversion to this type can.
struct TensorArg {
  TensorArg(const Tensor& t, Loc where = Loc::current()) : tensor(t), where(where) {}  // NOLINT
  const Tensor& tensor;
  Loc where;
};

Tensor operator+(TensorArg a, const Tensor& b);
Tensor operator-(TensorArg a, const Tensor& b);
Tensor operator*(TensorArg a, const Tensor& b);
Tensor operator/(TensorArg a, const Tensor& b);
Tensor operator+(TensorArg a, Scalar b);
Tensor operator-(TensorArg a, Scalar b);
Tensor operator*(TensorArg a, Scalar b);
Tensor operator/(TensorArg a, Scalar b);
Tensor operator+(Scalar a, TensorArg b);
Tensor operator-(Scalar a, TensorArg b);
Tensor operator*(Scalar a, TensorArg b);
Tensor operator/(Scalar a, TensorArg b);
Tensor operator==(Scalar a, TensorArg b);
Tensor operator!=(Scalar a, TensorArg b);
Tensor operator<(Scalar a, TensorArg b);
Tensor operator<=(Scalar a, TensorArg b);
Tensor operator>(Scalar a, TensorArg b);
Tensor operator>=(Scalar a, TensorArg b);
Tensor operator-(TensorArg a);
Tensor operator==(TensorArg a, const Tensor& b);
Tensor operator!=(TensorArg a, const Tensor& b);
Tensor operator<(TensorArg a, const Tensor& b);
Tensor operator<=(TensorArg a, const Tensor& b);
Tensor operator>(TensorArg a, const Tensor& b);
Tensor operator>=(TensorArg a, const Tensor& b);
Tensor operator==(TensorArg a, Scalar b);
Tensor operator!=(TensorArg a, Scalar b);
Tensor operator<(TensorArg a, Scalar b);
Tensor operator<=(TensorArg a, Scalar b);
Tensor operator>(TensorArg a, Scalar b);
Tensor operator>=(TensorArg a, Scalar b);

// Free functions, as torch::exp(t) and friends: each of LAZYFUSE_UNARY_OPS, then the rest.
#define LAZYFUSE_DECLARE_UNARY_FUNCTION(name, op) \
  Tensor name(const Tensor& t, Loc where = Loc::current());
LAZYFUSE_UNARY_OPS(LAZYFUSE_DECLARE_UNARY_FUNCTION)
#undef LAZYFUSE_DECLARE_UNARY_FUNCTION
Tensor pow(const Tensor& base, const Tensor& exponent, Loc where = Loc::current());
Tensor pow(const Tensor& base, Scalar exponent, Loc where = Loc::current());
Tensor pow(Scalar base, const Tensor& exponent, Loc where = Loc::current());
Tensor maximum(const Tensor& a, const Tensor& b, Loc where = Loc::current());
Tensor minimum(const Tensor& a, const Tensor& b, Loc where = Loc::current());
Tensor clamp(const Tensor& t, Scalar min, Scalar max, Loc where = Loc::current());
Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b, Loc where = Loc::current());
Tensor where(const Tensor& condition, Scalar a, Scalar b, Loc where = Loc::current());
Tensor where(const Tensor& condition, const Tensor& a, Scalar b, Loc where = Loc::current());
Tensor where(const Tensor& condition, Scalar a, const Tensor& b, Loc where = Loc::current());
Tensor matmul(const Tensor& a, const Tensor& b, Loc where = Loc::current());
// As the methods of the same names.
std::vector<Tensor> split(const Tensor& t, int64_t split_size, int64_t dim = 0,
                          Loc where = Loc::current());
std::vector<Tensor> split(const Tensor& t, IntArrayRef split_sizes, int64_t dim = 0,
                          Loc where = Loc::current());
std::vector<Tensor> chunk(const Tensor& t, int64_t chunks, int64_t dim = 0,
                          Loc where = Loc::current());
Tensor tril(const Tensor& t, int64_t diagonal = 0, Loc where = Loc::current());
Tensor triu(const Tensor& t, int64_t diagonal = 0, Loc where = Loc::current());
Tensor masked_fill(const Tensor& t, const Tensor& mask, Scalar value, Loc where = Loc::current());
Tensor masked_fill(const Tensor& t, const Tensor& mask, const Tensor& value,
                   Loc where = Loc::current());

// Index ops, as PyTorch's (frontend/indexing.cc). Indices are int64 (index_select also takes
// int32); one outside its dim is an IndexError when the value is computed.
// gather: out[i][j] = x[i][index[i][j]] for dim 1; out has index's shape, whose sizes are at most
// x's but along dim.
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index, Loc where = Loc::current());
// Out of place: self with src[i][j] added at [i][index[i][j]] for dim 1 (index no larger than
// src, nor than self but along dim). Deterministic, and the same bits on every device: Note
// [Deterministic scatter_add] in runtime/cpu/cpu_index.cc.
Tensor scatter_add(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src,
                   Loc where = Loc::current());
// The slices of x at the positions a 1-d index lists along dim.
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index, Loc where = Loc::current());
// The tensors one after another along dim: equal sizes but along dim, dtypes promoted.
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0, Loc where = Loc::current());
// Tensors of one shape, stacked along a new dim.
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0, Loc where = Loc::current());
// LibTorch's torch::max(t, dim) and torch::min(t, dim): the values and their int64 indices
// along dim (the first extreme; NaN counts as the extreme). The gradient goes to the chosen
// element alone, as PyTorch's does.
std::tuple<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim = false,
                               Loc where = Loc::current());
std::tuple<Tensor, Tensor> min(const Tensor& x, int64_t dim, bool keepdim = false,
                               Loc where = Loc::current());
Tensor amax(const Tensor& x, IntArrayRef dims = {}, bool keepdim = false,
            Loc where = Loc::current());
Tensor amin(const Tensor& x, IntArrayRef dims = {}, bool keepdim = false,
            Loc where = Loc::current());

// Factories. Tensors are created on the CPU as float32 unless the options say otherwise.
// The values of tensor(): a number, or a braced list of them nested to any depth, as LibTorch's
// TensorDataContainer takes them: 3.5, {1, 2}, {{2.0}, {-3.4}}, {{{1, 2}}}. Every sub-list of
// one level has the same length. Each number keeps its kind (bool, integer, floating), from
// which tensor() takes its dtype when the options give none.
class TensorData {
 public:
  enum class Kind : uint8_t { Bool, Integer, Floating };  // in promotion order
  TensorData(double value) : value_(value) {}             // NOLINT
  TensorData(float value) : value_(value) {}              // NOLINT
  TensorData(int value) : value_(value), integer_(value), kind_(Kind::Integer) {}  // NOLINT
  TensorData(int64_t value)                                                        // NOLINT
      : value_(static_cast<double>(value)), integer_(value), kind_(Kind::Integer) {}
  TensorData(bool value) : value_(value), integer_(value), kind_(Kind::Bool) {}        // NOLINT
  TensorData(std::initializer_list<TensorData> list) : list_(list), is_list_(true) {}  // NOLINT
  // A list held in a variable (std::initializer_list<double>, nested or not), or a vector. A
  // braced list of numbers alike takes this one too, with the same result.
  template <typename T>
  TensorData(std::initializer_list<T> list) : is_list_(true) {  // NOLINT
    for (const T& element : list) list_.emplace_back(element);
  }
  template <typename T>
  TensorData(const std::vector<T>& values) : is_list_(true) {  // NOLINT
    for (const T& element : values) list_.emplace_back(element);
  }
  bool is_list() const { return is_list_; }
  double value() const { return value_; }
  // A bool or integer number's value, exact past 2^53.
  int64_t integer() const { return integer_; }
  Kind kind() const { return kind_; }
  const std::vector<TensorData>& list() const { return list_; }

 private:
  double value_ = 0;
  int64_t integer_ = 0;
  Kind kind_ = Kind::Floating;
  std::vector<TensorData> list_;
  bool is_list_ = false;
};
// A tensor of `data`'s values and nesting (0-d for a number). Its dtype is the options' or, as
// PyTorch's torch.tensor infers it, int64 for integers, bool for bools and float32 for floating
// numbers (a list mixing kinds takes the highest: bool, then integer, then floating).
Tensor tensor(const TensorData& data, TensorOptions options = {}, Loc where = Loc::current());
Tensor from_vector(const std::vector<double>& values, Shape shape, TensorOptions options = {},
                   Loc where = Loc::current());
Tensor scalar_tensor(Scalar value, TensorOptions options = {}, Loc where = Loc::current());
Tensor zeros(Shape shape, TensorOptions options = {}, Loc where = Loc::current());
Tensor ones(Shape shape, TensorOptions options = {}, Loc where = Loc::current());
Tensor full(Shape shape, Scalar value, TensorOptions options = {}, Loc where = Loc::current());
Tensor arange(Scalar end, TensorOptions options = {}, Loc where = Loc::current());
Tensor arange(Scalar start, Scalar end, Scalar step = 1, TensorOptions options = {},
              Loc where = Loc::current());
// Uniform in [0, 1) and standard normal, from the global Philox generator.
Tensor rand(Shape shape, TensorOptions options = {}, Loc where = Loc::current());
Tensor randn(Shape shape, TensorOptions options = {}, Loc where = Loc::current());
void manual_seed(uint64_t seed);
// The global generator's state, as torch.get_rng_state: an int64 tensor [2] on the CPU, the seed
// and the count of draws taken (their bits). set_rng_state puts a state back, so that the
// random tensors made next are those made after it was taken: a ValueError for a tensor that is
// not such a state.
Tensor get_rng_state();
void set_rng_state(const Tensor& state);

// Computes the tensors' values in one evaluation that shares their common work.
void eval(const Tensor& t);
void eval(std::initializer_list<Tensor> tensors);
void eval(const std::vector<Tensor>& tensors);
// With options: EvalOptions{.fusion = false} runs one kernel per op.
void eval(const std::vector<Tensor>& tensors, const EvalOptions& options);
// What eval(tensors, options) would run, as Tensor::fused_ir() shows it for one tensor.
std::string fused_ir(const std::vector<Tensor>& tensors, const EvalOptions& options = {});

}  // namespace lazyfuse
