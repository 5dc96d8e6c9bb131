// Generating CUDA source for row reductions: a strided loop per thread, warp shuffles, then a
// tree over the block's warps in shared memory.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "codegen/cuda_codegen.h"
#include "codegen/cuda_emit.h"
#include "ir/errors.h"

namespace lazyfuse {
namespace {

const char* type_name(DType dtype) { return cuda_emit::storage_type_name(dtype); }

}  // namespace

DType cuda_reduction_accumulator(Op op, DType in) {
  if (op == Op::Sum || op == Op::Mean) return is_floating(in) ? DType::Float64 : DType::Int64;
  return in == DType::Bool ? DType::Int64 : compute_dtype(in);
}

namespace {

struct Combiner {
  std::string identity, combine;
};

Combiner combiner(Op op, DType acc) {
  switch (op) {
    case Op::Sum:
    case Op::Mean:
      return {"0", "x + y"};
    case Op::Max:
      return {is_floating(acc) ? "-__longlong_as_double(0x7ff0000000000000LL)"
                               : "(-9223372036854775807LL - 1)",
              "lf_max(x, y)"};
    default:
      return {
          is_floating(acc) ? "__longlong_as_double(0x7ff0000000000000LL)" : "9223372036854775807LL",
          "lf_min(x, y)"};
  }
}

// Before the kernel: the combining function.
std::string reduction_preamble(Op op, DType acc) {
  const char* a = type_name(acc);
  return absl::StrCat("\n__device__ __forceinline__ ", a, " lf_combine(", a, " x, ", a,
                      " y) { return ", combiner(op, acc).combine, "; }\n");
}

// The kernel's start: which row and chunk this block reduces, and the accumulator.
std::string reduction_head(Op op, DType acc) {
  return absl::StrCat(
      R"(  const long long row = blockIdx.x / args.chunks, chunk = blockIdx.x % args.chunks;
  const long long begin = chunk * args.chunk;
  const long long end = min(args.columns, begin + args.chunk);
  )",
      type_name(acc), " acc = (", type_name(acc), ")(", combiner(op, acc).identity, ");\n");
}

// The kernel's end: each warp's threads, then the block's warps, then the row's result (or
// the chunk's partial, in the accumulator type).
std::string reduction_tail(Op op, DType acc, DType out) {
  const char* a = type_name(acc);
  return absl::StrCat(
      R"(  for (int offset = 16; offset > 0; offset /= 2) acc = lf_combine(acc, __shfl_down_sync(0xffffffffu, acc, offset));
  __shared__ )",
      a, R"( warp_results[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_results[warp] = acc;
  __syncthreads();
  if (warp != 0) return;
  acc = lane < (int)(blockDim.x / 32) ? warp_results[lane] : ()",
      a, ")(", combiner(op, acc).identity, R"();
  for (int offset = 16; offset > 0; offset /= 2) acc = lf_combine(acc, __shfl_down_sync(0xffffffffu, acc, offset));
  if (lane != 0) return;
  if (args.chunks == 1) {
)",
      op == Op::Mean ? "    acc = acc / args.divisor;\n" : "", "    ((", type_name(out),
      "*)args.out)[row] = lf_store<", type_name(out), R"(>(acc);
  } else {
    (()",
      a, R"(*)args.out)[row * args.chunks + chunk] = acc;
  }
}
)");
}

// The start of a kernel over a step's iteration space that reduces rows: its name, the
// prologue, the argument struct (sizes, inputs, strides, then `fields`), the combining
// function, the signature and the typed input pointers.
CudaSource begin_row_kernel(const Graph& graph, const Step& step, const CudaElementwiseSpec& spec,
                            bool fast_math, DType acc, const std::string& comment,
                            const std::string& fields) {
  const Node& node = graph.nodes[reduction_parts(graph, step).reduction];
  const size_t num_inputs = step.inputs.size();
  CudaSource source;
  source.kernel_name = absl::StrCat(step.kernel_name(), "_", spec.code());
  for (char& c : source.kernel_name)
    if (c == '.') c = '_';
  std::string& s = source.source;
  if (fast_math) s += "#define LF_FAST_MATH 1\n";
  s += cuda_prologue();
  absl::StrAppend(&s, "\n// ", comment, "\nstruct Args_", source.kernel_name,
                  " {\n  long long size[", spec.rank, "];\n");
  if (num_inputs)
    absl::StrAppend(&s, "  const void* in[", num_inputs, "];\n  long long stride[", num_inputs,
                    "][", spec.rank, "];\n");
  absl::StrAppend(&s, fields, "};\n", reduction_preamble(node.op, acc),
                  "\nextern \"C\" __global__ void __launch_bounds__(", kCudaReduceThreads, ") ",
                  source.kernel_name, "(const Args_", source.kernel_name, " args) {\n",
                  "  typedef ", spec.index64 ? "long long" : "unsigned int", " IDX;\n");
  s += cuda_emit::emit_input_pointers(graph, step.inputs);
  return source;
}

}  // namespace

CudaSource generate_cuda_reduction(Op op, DType in, DType out) {
  if (!is_reduction(op)) throw VerifierError(absl::StrCat(op_name(op), " is not a reduction"));
  const DType acc = cuda_reduction_accumulator(op, in);
  CudaSource source;
  source.kernel_name =
      absl::StrCat("r_", op_name(op), "_", dtype_ir_name(in), "_", dtype_ir_name(out));
  std::string& s = source.source;
  s = cuda_prologue();
  absl::StrAppend(&s, R"(
struct ReduceArgs {
  const void* in;
  void* out;
  long long rows, columns, chunk, chunks;
  double divisor;
};
)",
                  reduction_preamble(op, acc), "\nextern \"C\" __global__ void __launch_bounds__(",
                  kCudaReduceThreads, ") ", source.kernel_name, "(const ReduceArgs args) {\n");
  s += reduction_head(op, acc);
  absl::StrAppend(&s, "  const ", type_name(in), "* __restrict__ base = (const ", type_name(in),
                  "*)args.in + row * args.columns;\n",
                  "  for (long long j = begin + threadIdx.x; j < end; j += blockDim.x)\n",
                  "    acc = lf_combine(acc, (", type_name(acc), ")lf_load(base[j]));\n");
  s += reduction_tail(op, acc, out);
  return source;
}

CudaSource generate_cuda_fused_reduction(const Graph& graph, const Step& step,
                                         const CudaElementwiseSpec& spec, bool fast_math) {
  const ReductionParts parts = reduction_parts(graph, step);
  const Node& node = graph.nodes[parts.reduction];
  const ValueId operand = node.inputs[0];
  const DType acc = cuda_reduction_accumulator(node.op, graph.nodes[operand].dtype);
  const std::vector<ValueId>& prologue = parts.prologue;
  const int rank = spec.rank;
  CudaSource source = begin_row_kernel(
      graph, step, spec, fast_math, acc,
      absl::StrCat(op_name(node.op), " of ", prologue.size(), " fused nodes"),
      "  void* out;\n  long long rows, columns, chunk, chunks;\n  double divisor;\n");
  std::string& s = source.source;
  s += reduction_head(node.op, acc);
  s += "  for (long long j = begin + threadIdx.x; j < end; j += blockDim.x) {\n"
       "    const IDX i = (IDX)(row * args.columns + j);\n";
  s += cuda_emit::emit_coordinates(rank, "    ");
  s +=
      cuda_emit::emit_members(graph, step.inputs, prologue, cuda_emit::strided_loads(spec), "    ");
  absl::StrAppend(&s, "    acc = lf_combine(acc, (", type_name(acc), ")v", operand, ");\n  }\n");
  s += reduction_tail(node.op, acc, node.dtype);
  return source;
}

CudaSource generate_cuda_row_kernel(const Graph& graph, const Step& step,
                                    const CudaElementwiseSpec& spec, bool fast_math) {
  const ReductionParts parts = reduction_parts(graph, step);
  const Node& node = graph.nodes[parts.reduction];
  const ValueId operand = node.inputs[0];
  const DType acc = cuda_reduction_accumulator(node.op, graph.nodes[operand].dtype);
  const int rank = spec.rank;
  CudaSource source =
      begin_row_kernel(graph, step, spec, fast_math, acc,
                       absl::StrCat(op_name(node.op), " over each row, then ",
                                    parts.epilogue.size(), " fused nodes over the row again"),
                       absl::StrCat("  void* out[", step.outputs.size(),
                                    "];\n  long long rows, columns;\n  double divisor;\n"));
  std::string& s = source.source;
  const std::string identity = combiner(node.op, acc).identity;
  const char* a = type_name(acc);
  absl::StrAppend(&s, "  const long long row = blockIdx.x;\n  ", a, " acc = (", a, ")(", identity,
                  ");\n",
                  "  for (long long j = threadIdx.x; j < args.columns; j += blockDim.x) {\n",
                  "    const IDX i = (IDX)(row * args.columns + j);\n");
  const std::vector<std::string> loads = cuda_emit::strided_loads(spec);
  s += cuda_emit::emit_coordinates(rank, "    ");
  s += cuda_emit::emit_members(graph, step.inputs, parts.prologue, loads, "    ");
  absl::StrAppend(&s, "    acc = lf_combine(acc, (", a, ")v", operand, ");\n  }\n");
  // The row's result reaches every thread through shared memory, stored in the reduction's
  // dtype exactly as an unfused reduction would store it.
  const char* result_type = type_name(node.dtype);
  absl::StrAppend(
      &s,
      R"(  for (int offset = 16; offset > 0; offset /= 2) acc = lf_combine(acc, __shfl_down_sync(0xffffffffu, acc, offset));
  __shared__ )",
      a, R"( warp_results[32];
  __shared__ )",
      result_type, R"( total;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_results[warp] = acc;
  __syncthreads();
  if (warp == 0) {
    acc = lane < (int)(blockDim.x / 32) ? warp_results[lane] : ()",
      a, ")(", identity, R"();
    for (int offset = 16; offset > 0; offset /= 2) acc = lf_combine(acc, __shfl_down_sync(0xffffffffu, acc, offset));
)",
      node.op == Op::Mean ? "    acc = acc / args.divisor;\n" : "",
      "    if (lane == 0) total = lf_store<", result_type,
      ">(acc);\n  }\n  __syncthreads();\n  const ", type_name(compute_dtype(node.dtype)), " v",
      parts.reduction, " = lf_load(total);\n");
  for (size_t k = 0; k < step.outputs.size(); ++k) {
    if (step.outputs[k] == parts.reduction)
      absl::StrAppend(&s, "  if (threadIdx.x == 0) ((", result_type, "*)args.out[", k,
                      "])[row] = total;\n");
  }
  // The second pass: the prologue again (its values are not kept), then the epilogue.
  std::vector<ValueId> second = parts.prologue;
  second.insert(second.end(), parts.epilogue.begin(), parts.epilogue.end());
  std::sort(second.begin(), second.end());
  absl::StrAppend(&s, "  for (long long j = threadIdx.x; j < args.columns; j += blockDim.x) {\n",
                  "    const IDX i = (IDX)(row * args.columns + j);\n");
  s += cuda_emit::emit_coordinates(rank, "    ");
  s += cuda_emit::emit_members(graph, step.inputs, second, loads, "    ");
  for (size_t k = 0; k < step.outputs.size(); ++k) {
    if (step.outputs[k] == parts.reduction) continue;
    const char* type = type_name(graph.nodes[step.outputs[k]].dtype);
    absl::StrAppend(&s, "    ((", type, "*)args.out[", k, "])[i] = lf_store<", type, ">(v",
                    step.outputs[k], ");\n");
  }
  s += "  }\n}\n";
  return source;
}

CudaSource generate_cuda_step(const Graph& graph, const Step& step, const CudaElementwiseSpec& spec,
                              bool fast_math) {
  if (step.kind == StepKind::Elementwise)
    return generate_cuda_elementwise(graph, step, spec, fast_math);
  if (step.kind != StepKind::Reduction)
    throw VerifierError("only elementwise and reduction steps have generated kernels");
  const ReductionParts parts = reduction_parts(graph, step);
  if (!parts.epilogue.empty()) return generate_cuda_row_kernel(graph, step, spec, fast_math);
  if (!parts.prologue.empty()) return generate_cuda_fused_reduction(graph, step, spec, fast_math);
  const Node& node = graph.nodes[parts.reduction];
  return generate_cuda_reduction(node.op, graph.nodes[node.inputs[0]].dtype, node.dtype);
}

}  // namespace lazyfuse
