// Pieces of generated CUDA source shared by the elementwise and reduction generators
// (cuda_codegen.cc, cuda_reduction.cc, cuda_row.cc). Internal to codegen/.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "lazyfuse/codegen/cuda/cuda_codegen.h"
#include "lazyfuse/codegen/cuda/cuda_kernel_args.h"

namespace lazyfuse::cuda_emit {

// "float", "lf_f16", "int64_t": how a dtype is stored in generated source.
const char* storage_type_name(DType dtype);
// Statements that compute each of `nodes` (v<id> in its compute type) for element `i`, after
// reading input k as `load[k]`; half-type results rounded after every op where `round_each_op`
// (Note [Half precision in fused kernels] in ir/half_rounding.h), else only the values a cast reads
// or makes, constants and generators. `reciprocals` pairs division nodes with a variable
// holding the reciprocal of their divisor, known before the loop (a row's sum): those divisions
// multiply by it instead (the caller decides which may: Note [Half precision in fused
// kernels]).
using Reciprocals = std::vector<std::pair<ValueId, std::string>>;
std::string emit_members(const Graph& graph, const std::vector<ValueId>& inputs,
                         const std::vector<ValueId>& nodes, const std::vector<std::string>& load,
                         const std::string& indent, bool round_each_op,
                         const Reciprocals& reciprocals = {});
// How each input reads element `i` in the scalar (non-vector) loop.
std::vector<std::string> strided_loads(const CudaElementwiseSpec& spec);
// c0..c{rank-1}: the coordinates of `i` in args.size, for strided loads.
std::string emit_coordinates(int rank, const std::string& indent);
// A plain reduction (a row or a column one, cuda_codegen.h) as a device function `name` over the
// block `block` of `blocks`, for a group kernel, which declares the argument structs first
// (reduction_member_structs).
std::string reduction_member_function(Op op, DType in, DType out, DType acc, bool columns,
                                      const std::string& name);
std::string reduction_member_structs();
// A reduction with a fused prologue, over rows or columns (generate_cuda_fused_reduction), as a
// device function `name` over the block `block` of `blocks`, after the declaration of its
// argument struct Args_<name>.
std::string fused_reduction_member_function(const Graph& graph, const Step& step,
                                            const CudaElementwiseSpec& spec,
                                            const std::string& name);
// A reduction's identity in accumulator type `acc` (the op table's, ir/ops.def), as source.
std::string reduction_identity(Op op, DType acc);
// Before a kernel: the reduction's combining function `name` of two accumulators.
std::string reduction_preamble(Op op, DType acc, const std::string& name = "lf_combine");
// The start of a kernel over a step's iteration space that reduces rows: its name, the
// prologue, the argument struct (the space's fields, then those `add_fields` adds), the
// combining functions (`preamble`), the signature and the typed input pointers.
CudaSource begin_row_kernel(const Graph& graph, const Step& step, const CudaElementwiseSpec& spec,
                            bool fast_math, const std::string& preamble, const std::string& comment,
                            const std::function<void(ArgLayout&)>& add_fields,
                            int threads = kCudaReduceThreads);
// in0, in1, ...: typed pointers to the inputs in args.in.
std::string emit_input_pointers(const Graph& graph, const std::vector<ValueId>& inputs);
// An attention kernel on tensor cores (codegen/cuda/cuda_attention_mma.cc) after `common`, what
// every attention kernel of `spec` starts with.
std::string attention_mma_kernel(const CudaAttentionSpec& spec, CudaAttentionKernel kernel,
                                 const std::string& common);

}  // namespace lazyfuse::cuda_emit
