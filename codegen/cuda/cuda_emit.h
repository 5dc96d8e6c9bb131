// Pieces of generated CUDA source shared by the elementwise and reduction generators
// (cuda_codegen.cc, cuda_reduction.cc). Internal to codegen/.
#pragma once

#include <string>
#include <vector>

#include "lazyfuse/codegen/cuda/cuda_codegen.h"

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
// in0, in1, ...: typed pointers to the inputs in args.in.
std::string emit_input_pointers(const Graph& graph, const std::vector<ValueId>& inputs);

}  // namespace lazyfuse::cuda_emit
