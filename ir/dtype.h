// Element types, their names in IR text and in PyTorch's spelling, and PyTorch's type promotion.
#pragma once

#include <cstdint>
#include <ostream>
#include <span>
#include <string>
#include <string_view>

namespace lazyfuse {

enum class DType : uint8_t { Bool, Int32, Int64, Float16, BFloat16, Float32, Float64 };

inline constexpr DType kAllDTypes[] = {DType::Bool,    DType::Int32,    DType::Int64,
                                       DType::Float16, DType::BFloat16, DType::Float32,
                                       DType::Float64};

int64_t dtype_size(DType dtype);
bool is_floating(DType dtype);
bool is_integral(DType dtype);  // Int32 and Int64; Bool is its own category.
// Float16 and BFloat16: stored in 16 bits, computed in float32 (Note [Half types]).
inline bool is_half(DType dtype) { return dtype == DType::Float16 || dtype == DType::BFloat16; }

// "f32", "bf16", "i64", "bool": the spelling of IR text.
const char* dtype_ir_name(DType dtype);
// "torch.float32": the spelling of printed tensors and error messages.
const char* dtype_torch_name(DType dtype);
// Parses the IR spelling; throws ParseError otherwise.
DType parse_dtype(std::string_view text);

// The type computations run in: half and bfloat16 compute in float32, as on every backend.
DType compute_dtype(DType dtype);

// PyTorch's promotion of two tensor operands: bool < integers < floating, wider wins,
// float16 with bfloat16 gives float32.
DType promote_types(DType a, DType b);

// The dtype a Python-like scalar takes when it meets a tensor of `tensor_dtype` (PyTorch's
// "wrapped number" rule: a scalar only lifts the category, never the width).
enum class ScalarKind : uint8_t { Bool, Integral, Floating };
DType promote_with_scalar(DType tensor_dtype, ScalarKind scalar);

// PyTorch's promotion of several tensor operands (torch.result_type): the operands with dims
// promote among themselves, and 0-d ones count only where their category (bool < integer <
// floating) is higher: float32[3] + float64[] is float32, int32[3] + float64[] float64. Where
// every operand is 0-d they promote among themselves. `ranks`: each operand's number of dims.
DType promote_operands(std::span<const DType> dtypes, std::span<const int64_t> ranks);

// As PyTorch prints a dtype: torch.float32.
std::ostream& operator<<(std::ostream& os, DType dtype);

}  // namespace lazyfuse
