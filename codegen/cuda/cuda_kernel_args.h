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
#include "lazyfuse/ir/shape.h"

namespace lazyfuse {

struct CudaElementwiseLaunch;
struct CudaElementwiseSpec;

// A launch's parameter words, inline for the usual few operands (no heap on a repeat launch).
using KernelArgs = absl::InlinedVector<uint64_t, 32>;

enum class ArgType : uint8_t { Int64, Double, Pointer, ConstPointer, Counters, ErrorSlot };

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

// A reduction of [rows, columns] in chunks (codegen/cuda/cuda_reduction.cc): after its operand (a
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
// A column reduction's (codegen/cuda/cuda_reduction.cc): in, stride (elements between one reduced
// element of a column and the next), then the reduction's fields, with `rows` the columns
// kept (each contiguous to the next) and `columns` the elements each reduces.
ArgLayout column_reduction_arg_layout();
KernelArgs pack_column_reduction_args(uint64_t in, int64_t stride, const ReductionWords& reduction);

// A reduction over leading dims with fused work, after its space: out[outputs] (what it stores,
// the reduction's result among them), then the reduction's fields as a column reduction's.
void add_column_step_fields(ArgLayout& layout, int outputs);
void append_column_step_args(std::span<const uint64_t> output_addresses,
                             const ReductionWords& reduction, KernelArgs& words);

// A row kernel after its space: out[outputs], rows, columns, divisor.
void add_row_fields(ArgLayout& layout, int outputs);
void append_row_args(std::span<const uint64_t> output_addresses, int64_t rows, int64_t columns,
                     KernelArgs& words);

// The index steps' kernels (codegen/cuda/cuda_index.cc), each over operands of one rank whose sizes
// and strides are words. `error` points at the device's error slot: the smallest row-major
// position in the index of an index outside [0, bound), or all ones when there is none (Note
// [Index errors on the GPU] in codegen/cuda/cuda_index.cc).
// gather: n (the index's elements), dim, bound (x's size along dim), x, index, out, error,
// size[rank] (the index's), x_stride[rank], index_stride[rank].
struct GatherWords {
  int64_t n = 0, dim = 0, bound = 0;
  uint64_t x = 0, index = 0, out = 0, error = 0;
  Shape sizes;
  Strides x_strides, index_strides;
};
ArgLayout gather_arg_layout(int rank);
KernelArgs pack_gather_args(const GatherWords& gather);
// scatter_add's lines (the index's positions with the coordinate along dim left out), each
// adding in order into `out`, self's dense copy: lines, length (the index's size along dim), dim,
// bound (self's size along dim), index, src, out, error, size[rank] (the index's),
// index_stride[rank], src_stride[rank], out_stride[rank].
struct ScatterAddWords {
  int64_t lines = 0, length = 0, dim = 0, bound = 0;
  uint64_t index = 0, src = 0, out = 0, error = 0;
  Shape sizes;
  Strides index_strides, src_strides, out_strides;
};
ArgLayout scatter_add_arg_layout(int rank);
KernelArgs pack_scatter_add_args(const ScatterAddWords& scatter);
// A strided copy with conversion (cat's operands into their places in the result): n, in, out,
// size[rank], in_stride[rank], out_stride[rank].
struct StridedCopyWords {
  int64_t n = 0;
  uint64_t in = 0, out = 0;
  Shape sizes;
  Strides in_strides, out_strides;
};
ArgLayout strided_copy_arg_layout(int rank);
KernelArgs pack_strided_copy_args(const StridedCopyWords& copy);

// A product of few rows (codegen/cuda/cuda_matmul.cc): c (rows x cols, dense) = a (rows x inner,
// rows lda apart) times b, stored as its transpose (cols rows of inner, ldb apart), with
// bias[col] added where the kernel has an epilogue (0 otherwise): a, b, bias, c, lda, ldb,
// inner, cols.
struct SkinnyMatmulWords {
  uint64_t a = 0, b = 0, bias = 0, c = 0;
  int64_t lda = 0, ldb = 0, inner = 0, cols = 0;
};
ArgLayout skinny_matmul_arg_layout();
KernelArgs pack_skinny_matmul_args(const SkinnyMatmulWords& product);

// An attention kernel's (codegen/cuda/cuda_attention.cc): sizes, the score's scale and cap,
// operands (null where absent; `result` the forward's output, dq or dk, `result2` dv, `lse`
// written by the forward and read by the gradients, `delta` the gradients' D_i written by the
// delta kernel and read by those on tensor cores), each operand's row stride (a mask's and
// bias's column stride too; rows are otherwise contiguous) and, over the `lead` dims before the
// rows (the query's sizes), each operand's strides there.
struct AttentionWords {
  int64_t heads = 0, key_heads = 0, queries = 0, keys = 0;
  double scale = 1, softcap = 0;
  // Dropout (Note [Attention]): the draw a probability is kept from, as its dtype holds it, the
  // factor a kept one is scaled by, and the Philox seed and offset.
  double keep_threshold = 0, keep_scale = 1;
  uint64_t seed = 0, offset = 0;
  uint64_t q = 0, k = 0, v = 0, mask = 0, bias = 0, out = 0, grad = 0, lse = 0, result = 0,
           result2 = 0, delta = 0;
  int64_t q_row = 0, k_row = 0, v_row = 0, out_row = 0, grad_row = 0, mask_row = 0, mask_column = 0,
          bias_row = 0, bias_column = 0;
  Strides lead, q_lead, k_lead, v_lead, out_lead, grad_lead, mask_lead, bias_lead;
};
ArgLayout attention_arg_layout(int lead);
KernelArgs pack_attention_args(const AttentionWords& words);

}  // namespace lazyfuse
