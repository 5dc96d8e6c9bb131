// dtype names, sizes and PyTorch's promotion lattice.
#include "lazyfuse/ir/dtype.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "lazyfuse/ir/errors.h"

namespace lazyfuse {

int64_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::Bool:
      return 1;
    case DType::Int32:
      return 4;
    case DType::Int64:
      return 8;
    case DType::Float16:
      return 2;
    case DType::BFloat16:
      return 2;
    case DType::Float32:
      return 4;
    case DType::Float64:
      return 8;
  }
  return 0;
}

bool is_floating(DType dtype) {
  return dtype == DType::Float16 || dtype == DType::BFloat16 || dtype == DType::Float32 ||
         dtype == DType::Float64;
}

bool is_integral(DType dtype) { return dtype == DType::Int32 || dtype == DType::Int64; }

const char* dtype_ir_name(DType dtype) {
  switch (dtype) {
    case DType::Bool:
      return "bool";
    case DType::Int32:
      return "i32";
    case DType::Int64:
      return "i64";
    case DType::Float16:
      return "f16";
    case DType::BFloat16:
      return "bf16";
    case DType::Float32:
      return "f32";
    case DType::Float64:
      return "f64";
  }
  return "?";
}

const char* dtype_torch_name(DType dtype) {
  switch (dtype) {
    case DType::Bool:
      return "torch.bool";
    case DType::Int32:
      return "torch.int32";
    case DType::Int64:
      return "torch.int64";
    case DType::Float16:
      return "torch.float16";
    case DType::BFloat16:
      return "torch.bfloat16";
    case DType::Float32:
      return "torch.float32";
    case DType::Float64:
      return "torch.float64";
  }
  return "?";
}

DType parse_dtype(std::string_view text) {
  for (DType dtype : kAllDTypes) {
    if (dtype_ir_name(dtype) == text) return dtype;
  }
  throw ParseError(absl::StrCat("unknown dtype '", std::string(text),
                                "' (expected bool, i32, i64, f16, bf16, f32 or f64)"),
                   0, 0);
}

DType compute_dtype(DType dtype) { return is_half(dtype) ? DType::Float32 : dtype; }

namespace {
int category(DType dtype) { return dtype == DType::Bool ? 0 : is_integral(dtype) ? 1 : 2; }
}  // namespace

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  if (category(a) != category(b)) return category(a) > category(b) ? a : b;
  // Same category, different types.
  if (category(a) == 1) return DType::Int64;
  if ((a == DType::Float16 && b == DType::BFloat16) ||
      (a == DType::BFloat16 && b == DType::Float16))
    return DType::Float32;
  return dtype_size(a) >= dtype_size(b) ? a : b;
}

DType promote_with_scalar(DType tensor_dtype, ScalarKind scalar) {
  int scalar_category = static_cast<int>(scalar);
  if (scalar_category <= category(tensor_dtype)) return tensor_dtype;
  // The scalar lifts the category: ints become int64, and anything becomes float32
  // (PyTorch's default dtype).
  return scalar == ScalarKind::Integral ? DType::Int64 : DType::Float32;
}

DType promote_operands(std::span<const DType> dtypes, std::span<const int64_t> ranks) {
  std::optional<DType> with_dims, zero_dim;
  for (size_t i = 0; i < dtypes.size(); ++i) {
    std::optional<DType>& group = ranks[i] > 0 ? with_dims : zero_dim;
    group = group ? promote_types(*group, dtypes[i]) : dtypes[i];
  }
  if (!with_dims) return *zero_dim;
  if (zero_dim && category(*zero_dim) > category(*with_dims))
    return promote_types(*with_dims, *zero_dim);
  return *with_dims;
}

std::ostream& operator<<(std::ostream& os, DType dtype) { return os << dtype_torch_name(dtype); }

}  // namespace lazyfuse
