// Note [Kernel calling convention]
// Every generated CUDA kernel takes one parameter: a struct of 8-byte words (pointers, 64-bit
// integers, doubles). What the struct holds, in order, is written once per kind of kernel as an
// ArgLayout; the generators declare the struct from the layout, and the runtime's words are
// packed by the functions below, beside the layouts, in the same order. Tests pack each kind
// and read every field back at the offset its layout gives (tests/cuda_codegen_test.cc).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/inlined_vector.h"

namespace lazyfuse {

struct CudaElementwiseLaunch;
struct CudaElementwiseSpec;

// A launch's parameter words, inline for the usual few operands (no heap on a repeat launch).
using KernelArgs = absl::InlinedVector<uint64_t, 32>;

enum class ArgType : uint8_t { Int64, Double, Pointer, ConstPointer, Counters };

class ArgLayout {
 public:
  // A field of one word, of `count` words, or of `rows` x `columns` words. An array with no
  // elements takes no words and is left out of the struct (CUDA has no empty arrays).
  ArgLayout& add(std::string_view name, ArgType type);
  ArgLayout& add_array(std::string_view name, ArgType type, int count);
  ArgLayout& add_matrix(std::string_view name, ArgType type, int rows, int columns);
  // The struct as CUDA source: "struct <name> {\n  long long n;\n ... };\n".
  std::string declare(std::string_view struct_name) const;
  int words() const;
  // The word at which field `name` starts; -1 if there is none.
  int offset(std::string_view name) const;

 private:
  struct Field {
    std::string name;
    ArgType type;
    int dims;  // 0: one word; 1: rows words; 2: rows x columns words
    int rows, columns;
    int words() const { return dims == 0 ? 1 : dims == 1 ? rows : rows * columns; }
  };
  std::vector<Field> fields_;
};

// A kernel over a step's iteration space reads these first: its merged sizes, its operands and
// their strides (size[rank], in[inputs], stride[inputs][rank]).
void add_space_fields(ArgLayout& layout, const CudaElementwiseSpec& spec, int inputs);
void append_space_args(const CudaElementwiseLaunch& launch,
                       std::span<const uint64_t> input_addresses, KernelArgs& words);

// An elementwise kernel: n, the space, out[outputs].
ArgLayout elementwise_arg_layout(const CudaElementwiseSpec& spec, int inputs, int outputs);
KernelArgs pack_elementwise_args(const CudaElementwiseLaunch& launch,
                                 std::span<const uint64_t> input_addresses,
                                 std::span<const uint64_t> output_addresses);

// A reduction of [rows, columns] in chunks (codegen/cuda_reduction.cc): after its operand (a
// plain reduction's dense `in`, or a fused one's space), these.
struct ReductionWords {
  uint64_t out = 0;
  int64_t rows = 0, columns = 0, chunk = 0, chunks = 0;
  double divisor = 1;
  uint64_t partial = 0, counters = 0;
};
void add_reduction_fields(ArgLayout& layout);
void append_reduction_args(const ReductionWords& reduction, KernelArgs& words);
// A plain reduction's whole layout: in, then the reduction's fields.
ArgLayout plain_reduction_arg_layout();

// A row kernel after its space: out[outputs], rows, columns, divisor.
void add_row_fields(ArgLayout& layout, int outputs);
void append_row_args(std::span<const uint64_t> output_addresses, int64_t rows, int64_t columns,
                     KernelArgs& words);

}  // namespace lazyfuse
