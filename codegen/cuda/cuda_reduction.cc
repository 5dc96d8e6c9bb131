// Generating CUDA source for row reductions: a strided loop per thread, warp shuffles, then a
// tree over the block's warps in shared memory.
#include <algorithm>
#include <bit>
#include <functional>

#include "absl/strings/str_cat.h"
#include "lazyfuse/codegen/cuda/cuda_codegen.h"
#include "lazyfuse/codegen/cuda/cuda_emit.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/ir/infer.h"

namespace lazyfuse {
namespace {

const char* type_name(DType dtype) { return cuda_emit::storage_type_name(dtype); }

struct Combiner {
  std::string identity, combine;
};

// The op table's meaning of the reduction (ir/ops.def), as CUDA source for accumulator `acc`.
// The identities of max and min are the accumulator type's own extremes: int32 accumulates
// int32 max and min, and an int64 extreme converted to int32 is -1 or 0.
Combiner combiner(Op op, DType acc) {
  const ReductionMeaning& meaning = reduction_meaning(op);
  switch (meaning.identity) {
    case ReductionIdentity::Zero:
      return {"0", meaning.combine};
    case ReductionIdentity::Lowest:
      return {is_floating(acc)      ? "-__longlong_as_double(0x7ff0000000000000LL)"
              : acc == DType::Int32 ? "(-2147483647 - 1)"
                                    : "(-9223372036854775807LL - 1)",
              meaning.combine};
    case ReductionIdentity::Highest:
      break;
  }
  return {is_floating(acc)      ? "__longlong_as_double(0x7ff0000000000000LL)"
          : acc == DType::Int32 ? "2147483647"
                                : "9223372036854775807LL",
          meaning.combine};
}

bool divides_by_count(Op op) {
  return reduction_meaning(op).finish == ReductionFinish::DivideByCount;
}

}  // namespace

namespace {

// Before the kernel: the combining function.
std::string reduction_preamble(Op op, DType acc, const std::string& name = "lf_combine") {
  const char* a = type_name(acc);
  return absl::StrCat("\n__device__ __forceinline__ ", a, " ", name, "(", a, " x, ", a,
                      " y) { return ", combiner(op, acc).combine, "; }\n");
}

// The kernel's start: which row and chunk this block (`block`, blockIdx.x in a kernel of its
// own) reduces, and the accumulator.
std::string reduction_head(Op op, DType acc, const std::string& block = "blockIdx.x") {
  return absl::StrCat(
      "  const long long row = ", block, " / args.chunks, chunk = ", block, R"( % args.chunks;
  const long long begin = chunk * args.chunk;
  const long long end = min(args.columns, begin + args.chunk);
  )",
      type_name(acc), " acc = (", type_name(acc), ")(", combiner(op, acc).identity, ");\n");
}

// `var` combined over a warp's lanes through shuffles, ending in lane 0.
std::string warp_combine(const std::string& indent, const std::string& var) {
  return absl::StrCat(indent, "for (int offset = 16; offset > 0; offset /= 2) ", var,
                      " = lf_combine(", var, ", __shfl_down_sync(0xffffffffu, ", var,
                      ", offset));\n");
}

// Warp 0's lanes take the warps' results (stored in warp_results) and combine them.
std::string combine_warp_results(Op op, DType acc, const std::string& indent,
                                 const std::string& var) {
  return absl::StrCat(indent, var, " = lane < (int)(blockDim.x / 32) ? warp_results[lane] : (",
                      type_name(acc), ")(", combiner(op, acc).identity, ");\n",
                      warp_combine(indent, var));
}

// The block's threads combined: each warp's through shuffles, then the warps' through shared
// memory. Leaves the block's result in `acc` of lane 0 of warp 0, and returns from every other
// thread.
std::string block_combine(Op op, DType acc) {
  return absl::StrCat(warp_combine("  ", "acc"),
                      "  if (lane == 0) warp_results[warp] = acc;\n  __syncthreads();\n"
                      "  if (warp != 0) return;\n",
                      combine_warp_results(op, acc, "  ", "acc"), "  if (lane != 0) return;\n");
}

// The kernel's end: the block's result is the row's (one chunk), or the chunk's partial, in
// the accumulator type. A row of several chunks is finished by whichever of its blocks ends
// last, in the same launch: each block stores its partial, then counts itself done; the one
// that counts last combines the row's partials in chunk order, exactly as a one-chunk
// reduction over them would, so the result never depends on which block that was. It sets the
// row's counter back to zero for the next launch (the counters start zeroed: the runtime's
// reduction_counters).
std::string reduction_tail(Op op, DType acc, DType out) {
  const char* a = type_name(acc);
  const std::string row_result =
      absl::StrCat(divides_by_count(op) ? "  acc = acc / args.divisor;\n" : "", "  ((",
                   type_name(out), "*)args.out)[row] = lf_store<", type_name(out), ">(acc);\n");
  return absl::StrCat(
      "  __shared__ ", a, R"( warp_results[32];
  __shared__ bool last_block;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (args.chunks == 1) {
)",
      block_combine(op, acc), row_result, R"(    return;
  }
  {
    // As block_combine, but every thread stays for the combination of the partials.
    )",
      a, " own = acc;\n", warp_combine("    ", "own"),
      "    if (lane == 0) warp_results[warp] = own;\n    __syncthreads();\n    if (warp == 0) {\n",
      combine_warp_results(op, acc, "      ", "own"), "      if (lane == 0) {\n        ((", a,
      R"(*)args.partial)[row * args.chunks + chunk] = own;
        __threadfence();
        last_block = atomicAdd(&args.counters[row], 1u) == (unsigned)(args.chunks - 1);
      }
    }
    __syncthreads();
  }
  if (!last_block) return;
  __threadfence();
  acc = ()",
      a, ")(", combiner(op, acc).identity, R"();
  for (long long j = threadIdx.x; j < args.chunks; j += blockDim.x)
    acc = lf_combine(acc, __ldcg(()",
      a, R"(*)args.partial + row * args.chunks + j));
)",
      block_combine(op, acc), row_result, "  args.counters[row] = 0;\n}\n");
}

// The start of a kernel over a step's iteration space that reduces rows: its name, the
// prologue, the argument struct (the space's fields, then those `add_fields` adds), the
// combining function, the signature and the typed input pointers.
template <typename AddFields>
CudaSource begin_row_kernel(const Graph& graph, const Step& step, const CudaElementwiseSpec& spec,
                            bool fast_math, const std::string& preamble, const std::string& comment,
                            AddFields add_fields, int threads = kCudaReduceThreads) {
  const size_t num_inputs = step.inputs.size();
  CudaSource source;
  source.kernel_name = absl::StrCat(step.kernel_name(), "_", spec.code());
  for (char& c : source.kernel_name)
    if (c == '.') c = '_';
  std::string& s = source.source;
  if (fast_math) s += "#define LF_FAST_MATH 1\n";
  s += cuda_prologue();
  ArgLayout layout;
  add_space_fields(layout, spec, static_cast<int>(num_inputs));
  add_fields(layout);
  absl::StrAppend(&s, "\n// ", comment, "\n",
                  layout.declare(absl::StrCat("Args_", source.kernel_name)), preamble,
                  "\nextern \"C\" __global__ void __launch_bounds__(", threads, ") ",
                  source.kernel_name, "(const Args_", source.kernel_name, " args) {\n",
                  "  typedef ", spec.index64 ? "long long" : "unsigned int", " IDX;\n");
  s += cuda_emit::emit_input_pointers(graph, step.inputs);
  return source;
}

}  // namespace

int64_t cuda_reduce_chunk(int64_t rows, int64_t columns) {
  const int64_t chunks_per_row =
      std::max<int64_t>(1, kCudaReduceBlocks / std::max<int64_t>(rows, 1));
  const int64_t columns_per_chunk = (columns + chunks_per_row - 1) / chunks_per_row;
  return std::max<int64_t>(kCudaReduceMinChunk,
                           static_cast<int64_t>(std::bit_ceil(
                               static_cast<uint64_t>(std::max<int64_t>(columns_per_chunk, 1)))));
}

namespace {

// A plain reduction's statements, for the block `block` of its grid, and the closing brace.
std::string plain_reduction_body(Op op, DType in, DType out, DType acc, const std::string& block) {
  return absl::StrCat(reduction_head(op, acc, block), "  const ", type_name(in),
                      "* __restrict__ base = (const ", type_name(in),
                      "*)args.in + row * args.columns;\n",
                      "  for (long long j = begin + threadIdx.x; j < end; j += blockDim.x)\n",
                      "    acc = lf_combine(acc, (", type_name(acc), ")lf_load(base[j]));\n",
                      reduction_tail(op, acc, out));
}

std::string column_reduction_body(Op op, DType in, DType out, DType acc, const std::string& block);

// A kernel name's suffix naming its accumulator where it is not the op table's.
std::string accumulator_suffix(Op op, DType in, DType acc) {
  return acc == reduction_accumulator(op, in) ? "" : absl::StrCat("_a", dtype_ir_name(acc));
}

}  // namespace

DType cuda_reduction_accumulator(Op op, DType in, bool round_each_op) {
  const DType table = reduction_accumulator(op, in);
  return !round_each_op && is_half(in) && table == DType::Float64 ? DType::Float32 : table;
}

DType step_accumulator(const Graph& graph, const Step& step, const Node& reduction) {
  return cuda_reduction_accumulator(reduction.op, graph.nodes[reduction.inputs[0]].dtype,
                                    step.round_each_op);
}

bool cuda_reduces_stored_half_in_vectors(const Graph& graph, const Step& step) {
  if (step.kind != StepKind::Reduction || step.nodes.size() != 1) return false;
  const Node& node = graph.nodes[step.nodes[0]];
  const Node& operand = graph.nodes[node.inputs[0]];
  const int64_t rank = static_cast<int64_t>(operand.shape.size());
  return is_half(operand.dtype) && step_accumulator(graph, step, node) == DType::Float32 &&
         reduces_trailing_dims(reduction_dims(node.attrs, rank), rank);
}

std::string cuda_reduction_kernel_name(Op op, DType in, DType out, DType acc) {
  return absl::StrCat("r_", op_name(op), "_", dtype_ir_name(in), "_", dtype_ir_name(out),
                      accumulator_suffix(op, in, acc));
}

CudaSource generate_cuda_reduction(Op op, DType in, DType out, DType acc) {
  if (!is_reduction(op)) throw VerifierError(absl::StrCat(op_name(op), " is not a reduction"));
  CudaSource source;
  source.kernel_name = cuda_reduction_kernel_name(op, in, out, acc);
  std::string& s = source.source;
  s = cuda_prologue();
  absl::StrAppend(&s, "\n", plain_reduction_arg_layout().declare("ReduceArgs"),
                  reduction_preamble(op, acc), "\nextern \"C\" __global__ void __launch_bounds__(",
                  kCudaReduceThreads, ") ", source.kernel_name, "(const ReduceArgs args) {\n",
                  plain_reduction_body(op, in, out, acc, "blockIdx.x"));
  return source;
}

int64_t cuda_column_chunk(int64_t kept, int64_t reduced) {
  const int64_t tiles = std::max<int64_t>(1, (kept + kCudaColumnTile - 1) / kCudaColumnTile);
  const int64_t chunks = std::max<int64_t>(1, kCudaReduceBlocks / tiles);
  const int64_t per_chunk = (reduced + chunks - 1) / chunks;
  return std::max<int64_t>(
      kCudaColumnMinChunk,
      static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(std::max<int64_t>(per_chunk, 1)))));
}

std::string cuda_column_reduction_kernel_name(Op op, DType in, DType out, DType acc) {
  return absl::StrCat("c_", op_name(op), "_", dtype_ir_name(in), "_", dtype_ir_name(out),
                      accumulator_suffix(op, in, acc));
}

namespace {

// A column reduction's statements, for the block `block` of its grid, and the closing brace: each
// block takes a tile of 32 kept columns (a lane each) over a chunk of the reduced elements, its
// warps (slices) walking the chunk's elements `walk` into `acc` (for element j of `column`);
// the result goes to `result` (a typed pointer expression) at `column`.
std::string column_reduction_body(Op op, DType acc, DType out, const std::string& block,
                                  const std::string& walk, const std::string& result) {
  const char* a = type_name(acc);
  const std::string identity = absl::StrCat("(", a, ")(", combiner(op, acc).identity, ")");
  const std::string store =
      absl::StrCat(divides_by_count(op) ? "acc = acc / args.divisor;\n      " : "", result,
                   "[column] = lf_store<", type_name(out), ">(acc);\n");
  std::string s;
  absl::StrAppend(&s, "  constexpr int kSlices = ", kCudaReduceThreads / kCudaColumnTile, ";\n",
                  "  const long long tile = ", block, " / args.chunks, chunk = ", block,
                  R"( % args.chunks;
  const int lane = threadIdx.x % 32, slice = threadIdx.x / 32;
  const long long column = tile * 32 + lane;
  const long long begin = chunk * args.chunk;
  const long long end = min(args.columns, begin + args.chunk);
  )",
                  a, " acc = ", identity, ";\n", "  if (column < args.rows) {\n", walk, R"(  }
  // The slices of each column combined in slice order by the first warp.
  __shared__ )",
                  a, R"( slices[kSlices][32];
  __shared__ bool last_block;
  slices[slice][lane] = acc;
  __syncthreads();
  if (slice != 0) return;
  for (int k = 1; k < kSlices; ++k) acc = lf_combine(acc, slices[k][lane]);
  if (args.chunks == 1) {
    if (column < args.rows) {
      )",
                  store, R"(    }
    return;
  }
  // Several chunks: each block stores its partials; the tile's last block combines them in
  // chunk order and sets the tile's counter back to zero.
  if (column < args.rows) (()",
                  a, R"(*)args.partial)[column * args.chunks + chunk] = acc;
  __threadfence();
  __syncwarp();
  if (lane == 0) last_block = atomicAdd(&args.counters[tile], 1u) == (unsigned)(args.chunks - 1);
  __syncwarp();
  if (!last_block) return;
  __threadfence();
  if (column < args.rows) {
    acc = )",
                  identity, R"(;
    for (long long c = 0; c < args.chunks; ++c)
      acc = lf_combine(acc, __ldcg(()",
                  a, R"(*)args.partial + column * args.chunks + c));
      )",
                  store, R"(  }
  if (lane == 0) args.counters[tile] = 0;
}
)");
  return s;
}

// A stored operand's column walk: its elements `args.stride` apart along a column.
std::string column_reduction_body(Op op, DType in, DType out, DType acc, const std::string& block) {
  const char* a = type_name(acc);
  const std::string walk =
      absl::StrCat("    const ", type_name(in), "* __restrict__ base = (const ", type_name(in),
                   "*)args.in + column;\n    for (long long j = begin + slice; j < end; j += "
                   "kSlices)\n      acc = lf_combine(acc, (",
                   a, ")lf_load(base[j * args.stride]));\n");
  return column_reduction_body(op, acc, out, block, walk,
                               absl::StrCat("((", type_name(out), "*)args.out)"));
}

// A reduction over leading dims with the elementwise work before it fused: the walk computes
// each element of the space (row j of the kept columns), stores what the step stores, and
// reduces the operand.
std::string fused_column_body(const Graph& graph, const Step& step, const CudaElementwiseSpec& spec,
                              const std::string& block) {
  const ReductionParts parts = reduction_parts(step);
  const Node& node = graph.nodes[parts.reduction];
  const ValueId operand = node.inputs[0];
  const DType acc = step_accumulator(graph, step, node);
  std::string walk =
      "    for (long long j = begin + slice; j < end; j += kSlices) {\n"
      "      const IDX i = (IDX)(j * args.rows + column);\n";
  walk += cuda_emit::emit_coordinates(spec.rank, "      ");
  walk += cuda_emit::emit_members(graph, step.inputs, parts.prologue,
                                  cuda_emit::strided_loads(spec), "      ", step.round_each_op);
  std::string result;
  for (size_t o = 0; o < step.outputs.size(); ++o) {
    const char* type = type_name(graph.nodes[step.outputs[o]].dtype);
    if (step.outputs[o] == parts.reduction) {
      result = absl::StrCat("((", type, "*)args.out[", o, "])");
      continue;
    }
    absl::StrAppend(&walk, "      ((", type, "*)args.out[", o, "])[i] = lf_store<", type, ">(v",
                    step.outputs[o], ");\n");
  }
  absl::StrAppend(&walk, "      acc = lf_combine(acc, (", type_name(acc), ")v", operand,
                  ");\n    }\n");
  return column_reduction_body(node.op, acc, node.dtype, block, walk, result);
}

}  // namespace

CudaSource generate_cuda_column_reduction(Op op, DType in, DType out, DType acc) {
  if (!is_reduction(op)) throw VerifierError(absl::StrCat(op_name(op), " is not a reduction"));
  CudaSource source;
  source.kernel_name = cuda_column_reduction_kernel_name(op, in, out, acc);
  source.source = absl::StrCat(
      cuda_prologue(), "\n", column_reduction_arg_layout().declare("ColumnReduceArgs"),
      reduction_preamble(op, acc), "\nextern \"C\" __global__ void __launch_bounds__(",
      kCudaReduceThreads, ") ", source.kernel_name, "(const ColumnReduceArgs args) {\n",
      column_reduction_body(op, in, out, acc, "blockIdx.x"));
  return source;
}

std::string cuda_emit::reduction_member_function(Op op, DType in, DType out, DType acc,
                                                 bool columns, const std::string& name) {
  const char* a = type_name(acc);
  // The combination as a local lambda: members of other ops define their own.
  return absl::StrCat("static __device__ __forceinline__ void ", name, "(const ",
                      columns ? "ColumnReduceArgs" : "ReduceArgs",
                      "& args, unsigned int block, unsigned int blocks) {\n  (void)blocks;\n",
                      "  const auto lf_combine = [](", a, " x, ", a, " y) -> ", a, " { return ",
                      combiner(op, acc).combine, "; };\n",
                      columns ? column_reduction_body(op, in, out, acc, "block")
                              : plain_reduction_body(op, in, out, acc, "block"));
}

std::string cuda_emit::reduction_member_structs() {
  return absl::StrCat(plain_reduction_arg_layout().declare("ReduceArgs"),
                      column_reduction_arg_layout().declare("ColumnReduceArgs"));
}

namespace {

// A fused reduction's statements after its input pointers, for the block `block` of its grid,
// and the closing brace.
std::string fused_reduction_body(const Graph& graph, const Step& step,
                                 const CudaElementwiseSpec& spec, const std::string& block) {
  const ReductionParts parts = reduction_parts(step);
  const Node& node = graph.nodes[parts.reduction];
  const ValueId operand = node.inputs[0];
  const DType acc = step_accumulator(graph, step, node);
  std::string s = reduction_head(node.op, acc, block);
  std::string first = "begin";
  if (spec.vectorized) {
    // 16 bytes of each operand a thread at a time (the runtime vectorizes only rows that are
    // whole vectors, and chunks are too). Element l of each vector goes to accumulator l, and
    // the accumulators are combined in order after the loop: independent chains of additions
    // (one float32 chain a thread held a bfloat16 sum of squares to 79-86% of the roof on the
    // H200, against 89-97% in float64), in the same order on every run.
    const int width = spec.vector_width;
    const char* a = type_name(acc);
    absl::StrAppend(&s, "  ", a, " lane_acc[", width, "];\n#pragma unroll\n  for (int l = 0; l < ",
                    width, "; ++l) lane_acc[l] = acc;\n");
    absl::StrAppend(&s, "  const long long vector_end = begin + (end - begin) / ", width, " * ",
                    width, ";\n  for (long long j0 = begin + ", width,
                    " * threadIdx.x; j0 < vector_end; j0 += ", width,
                    " * blockDim.x) {\n    const IDX i0 = (IDX)(row * args.columns + j0);\n");
    std::vector<std::string> loads;
    for (size_t k = 0; k < step.inputs.size(); ++k) {
      if (spec.inputs[k] == OperandAccess::Broadcast) {
        loads.push_back(absl::StrCat("in", k, "[0]"));
        continue;
      }
      const std::string vec =
          absl::StrCat("lf_vec<", type_name(graph.nodes[step.inputs[k]].dtype), ", ", width, ">");
      const std::string at = spec.inputs[k] == OperandAccess::Repeated
                                 ? absl::StrCat("i0 % (IDX)args.stride[", k, "][0]")
                                 : "i0";
      absl::StrAppend(&s, "    const ", vec, " x", k, " = *(const ", vec, "*)(in", k, " + ", at,
                      ");\n");
      loads.push_back(absl::StrCat("x", k, ".v[l]"));
    }
    absl::StrAppend(&s, "#pragma unroll\n    for (int l = 0; l < ", width,
                    "; ++l) {\n      const IDX i = i0 + l;\n      (void)i;\n");
    s += cuda_emit::emit_members(graph, step.inputs, parts.prologue, loads, "      ",
                                 step.round_each_op);
    absl::StrAppend(&s, "      lane_acc[l] = lf_combine(lane_acc[l], (", a, ")v", operand,
                    ");\n    }\n  }\n#pragma unroll\n  for (int l = 0; l < ", width,
                    "; ++l) acc = lf_combine(acc, lane_acc[l]);\n");
    first = "vector_end";
  }
  absl::StrAppend(&s, "  for (long long j = ", first,
                  " + threadIdx.x; j < end; j += blockDim.x) {\n"
                  "    const IDX i = (IDX)(row * args.columns + j);\n");
  s += cuda_emit::emit_coordinates(spec.rank, "    ");
  s += cuda_emit::emit_members(graph, step.inputs, parts.prologue, cuda_emit::strided_loads(spec),
                               "    ", step.round_each_op);
  absl::StrAppend(&s, "    acc = lf_combine(acc, (", type_name(acc), ")v", operand, ");\n  }\n");
  s += reduction_tail(node.op, acc, node.dtype);
  return s;
}

}  // namespace

namespace {

// A reduction step with fused work, over rows (trailing dims) or over columns (leading dims):
// its kernel's comment, the fields after its space, and its body for block `block`.
struct FusedReductionKind {
  std::string comment;
  std::function<void(ArgLayout&)> add_fields;
  std::string (*body)(const Graph&, const Step&, const CudaElementwiseSpec&, const std::string&);
};
FusedReductionKind fused_reduction_kind(const Graph& graph, const Step& step) {
  const ReductionParts parts = reduction_parts(step);
  const Node& node = graph.nodes[parts.reduction];
  if (step.kind != StepKind::Column)
    return {absl::StrCat(op_name(node.op), " of ", parts.prologue.size(), " fused nodes"),
            add_reduction_fields, fused_reduction_body};
  const int outputs = static_cast<int>(step.outputs.size());
  return {
      absl::StrCat(op_name(node.op), " over columns of ", parts.prologue.size(), " fused nodes"),
      [outputs](ArgLayout& layout) { add_column_step_fields(layout, outputs); }, fused_column_body};
}

DType fused_reduction_accumulator(const Graph& graph, const Step& step) {
  return step_accumulator(graph, step, graph.nodes[reduction_parts(step).reduction]);
}

}  // namespace

CudaSource generate_cuda_fused_reduction(const Graph& graph, const Step& step,
                                         const CudaElementwiseSpec& spec, bool fast_math) {
  const FusedReductionKind kind = fused_reduction_kind(graph, step);
  const Node& node = graph.nodes[reduction_parts(step).reduction];
  CudaSource source =
      begin_row_kernel(graph, step, spec, fast_math,
                       reduction_preamble(node.op, fused_reduction_accumulator(graph, step)),
                       kind.comment, kind.add_fields);
  source.source += kind.body(graph, step, spec, "blockIdx.x");
  return source;
}

std::string cuda_emit::fused_reduction_member_function(const Graph& graph, const Step& step,
                                                       const CudaElementwiseSpec& spec,
                                                       const std::string& name) {
  const FusedReductionKind kind = fused_reduction_kind(graph, step);
  const Node& node = graph.nodes[reduction_parts(step).reduction];
  const DType acc = fused_reduction_accumulator(graph, step);
  const char* a = type_name(acc);
  ArgLayout layout;
  add_space_fields(layout, spec, static_cast<int>(step.inputs.size()));
  kind.add_fields(layout);
  return absl::StrCat("\n// ", kind.comment, "\n", layout.declare(absl::StrCat("Args_", name)),
                      "static __device__ __forceinline__ void ", name, "(const Args_", name,
                      "& args, unsigned int block, unsigned int blocks) {\n  (void)blocks;\n",
                      "  const auto lf_combine = [](", a, " x, ", a, " y) -> ", a, " { return ",
                      combiner(node.op, acc).combine, "; };\n", "  typedef ",
                      spec.index64 ? "long long" : "unsigned int", " IDX;\n",
                      cuda_emit::emit_input_pointers(graph, step.inputs),
                      kind.body(graph, step, spec, "block"));
}

namespace {

// The members of `candidates` (in topological order) that `roots` need, through candidates
// alone, in order.
std::vector<ValueId> needed_members(const Graph& graph, const std::vector<ValueId>& candidates,
                                    const std::vector<ValueId>& roots) {
  std::vector<bool> needed(graph.nodes.size(), false), candidate(graph.nodes.size(), false);
  for (ValueId v : candidates) candidate[v] = true;
  for (ValueId v : roots) needed[v] = true;
  std::vector<ValueId> members;
  for (auto it = candidates.rbegin(); it != candidates.rend(); ++it) {
    if (!needed[*it]) continue;
    members.push_back(*it);
    for (ValueId in : graph.nodes[*it].inputs) needed[in] = needed[in] || candidate[in];
  }
  std::reverse(members.begin(), members.end());
  return members;
}

}  // namespace

void choose_cuda_row_layout(CudaElementwiseLaunch& plan, int64_t columns, size_t inputs,
                            bool outputs_aligned) {
  CudaElementwiseSpec& spec = plan.spec;
  // Measured on the H200 (docs/benchmarks.md): a warp a row of 4096 reread its row from memory
  // in every pass, at a third of the copy roof; a block a row keeps it in registers. Rows of
  // 1024 four-byte elements ran 2-8% faster with two warps a row (16 elements a lane) than with
  // one (32), and half-precision ones 0-4% slower: a warp takes a row while its lanes keep 64
  // bytes each of every operand. A bfloat16 LayerNorm's row (the row, a weight, a bias: 99
  // registers a lane, a quarter of the threads resident) ran at 67% of the roof with one warp
  // and 79% with two (2026-12-05): half-precision rows of more than two operands take two.
  constexpr int64_t kBlockRowRegisters = 16;
  const int64_t warp_limit =
      spec.vector_width == 8 && inputs <= 2 ? kCudaRowRegisters : kBlockRowRegisters;
  spec.row_warps =
      columns <= 32 * warp_limit
          ? 1
          : static_cast<int>(std::min<int64_t>(
                32, std::bit_ceil(static_cast<uint64_t>((columns + 32 * kBlockRowRegisters - 1) /
                                                        (32 * kBlockRowRegisters)))));
  const int64_t lanes = 32 * spec.row_warps;
  const int64_t per_lane = (columns + lanes - 1) / lanes;
  const int64_t limit = spec.row_warps == 1 ? warp_limit : kBlockRowRegisters;
  spec.row_in_registers =
      per_lane <= limit && inputs <= static_cast<size_t>(kCudaRowRegisterInputs);
  // The plan's width is 16 bytes of the narrowest operand; half of it where the row is whole
  // groups of that only.
  int width = spec.vector_width;
  if (columns % (lanes * width) != 0 && width == 8) width = 4;
  spec.vectorized =
      spec.vectorized && spec.row_in_registers && columns % (lanes * width) == 0 && outputs_aligned;
  spec.vector_width = spec.vectorized ? width : 4;
  bool repeated = false, whole_rows = true;
  for (size_t k = 0; k < spec.inputs.size(); ++k) {
    if (spec.inputs[k] != OperandAccess::Repeated) continue;
    repeated = true;
    whole_rows = whole_rows && spec.rank == 1 && plan.strides[k][0] == columns;
  }
  spec.periods_are_rows = spec.row_in_registers && repeated && whole_rows;
  // Registers for the lane's elements, a power of two (fewer kernels) of at least a vector.
  spec.row_registers = static_cast<int>(
      std::min<int64_t>(limit, std::bit_ceil(static_cast<uint64_t>(std::max<int64_t>(
                                   per_lane, spec.vectorized ? spec.vector_width : 1)))));
}

void choose_cuda_fused_reduction_layout(CudaElementwiseLaunch& plan, bool over_columns,
                                        int64_t columns, int64_t chunk) {
  CudaElementwiseSpec& spec = plan.spec;
  spec.vectorized = spec.vectorized && !over_columns && spec.rank == 1 &&
                    columns % spec.vector_width == 0 && chunk % spec.vector_width == 0;
}

int cuda_row_threads(const CudaElementwiseSpec& spec) {
  return spec.row_warps == 1 ? kCudaReduceThreads : 32 * spec.row_warps;
}

int64_t cuda_row_blocks(const CudaElementwiseSpec& spec, int64_t rows) {
  if (spec.row_warps > 1) return rows;
  constexpr int64_t kRowsPerBlock = kCudaReduceThreads / 32;
  return (rows + kRowsPerBlock - 1) / kRowsPerBlock;
}

CudaSource generate_cuda_row_kernel(const Graph& graph, const Step& step,
                                    const CudaElementwiseSpec& spec, bool fast_math) {
  const ReductionParts parts = reduction_parts(step);
  std::string preamble, names;
  for (size_t k = 0; k < parts.reductions.size(); ++k) {
    const Node& node = graph.nodes[parts.reductions[k]];
    preamble += reduction_preamble(node.op, step_accumulator(graph, step, node),
                                   absl::StrCat("lf_combine", k));
    absl::StrAppend(&names, k ? ", then " : "", op_name(node.op));
  }
  CudaSource source = begin_row_kernel(
      graph, step, spec, fast_math, preamble,
      absl::StrCat(names, " over each row, then ", parts.epilogue.size(),
                   " fused nodes over the row again"),
      [&](ArgLayout& layout) { add_row_fields(layout, static_cast<int>(step.outputs.size())); },
      cuda_row_threads(spec));
  std::string& s = source.source;
  const std::vector<std::string> loads = cuda_emit::strided_loads(spec);
  // `lanes` threads share a row: a warp, combining through shuffles, or a block of warps
  // (one row a block), combining the warps' results through shared memory after that.
  const int lanes = 32 * spec.row_warps;
  if (spec.row_warps == 1) {
    s += "  const long long row = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;\n"
         "  const int lane = threadIdx.x % 32;\n"
         "  if (row >= args.rows) return;\n";
  } else {
    s += "  const long long row = blockIdx.x;\n  const int lane = threadIdx.x;\n";
  }
  // With the row in registers, lane element t is column lane + lanes * t, every pass unrolled
  // so that the registers are named statically. Vectorized, the lanes take the row in groups of
  // lanes * V columns, V consecutive ones each (V = vector_width, 16 bytes of the narrowest
  // operand): element t is column lanes * V (t / V) + V lane + t % V, so each lane reads (and
  // writes) its V with one access. Every row is then whole groups.
  const bool vector_rows = spec.row_in_registers && spec.vectorized;
  const int width = vector_rows ? spec.vector_width : 1;
  const int group = lanes * width;
  const int registers = spec.row_registers;
  const std::string column =
      vector_rows ? absl::StrCat(group, " * (t / ", width, ") + ", width, " * lane + t % ", width)
                  : absl::StrCat("lane + ", lanes, " * t");
  // Unrolled, this folds away in all but one element of each group.
  const std::string past_row = vector_rows ? absl::StrCat("t % ", width, " == 0 && ", group,
                                                          " * (t / ", width, ") >= args.columns")
                                           : absl::StrCat("lane + ", lanes, " * t >= args.columns");
  std::vector<std::string> pass_loads = loads;
  if (spec.row_in_registers) {
    absl::StrAppend(&s, "  // The lane's elements of each operand, read once.\n");
    for (size_t k = 0; k < step.inputs.size(); ++k) {
      absl::StrAppend(&s, "  ", type_name(graph.nodes[step.inputs[k]].dtype), " row", k, "[",
                      registers, "];\n");
      pass_loads[k] = absl::StrCat("row", k, "[t]");
    }
    if (vector_rows) {
      absl::StrAppend(&s, "#pragma unroll\n  for (int t = 0; t < ", registers, "; t += ", width,
                      ") {\n    if (", group, " * (t / ", width,
                      ") >= args.columns) break;\n    const IDX i = (IDX)(row * args.columns + ",
                      group, " * (t / ", width, ") + ", width, " * lane);\n");
      for (size_t k = 0; k < step.inputs.size(); ++k) {
        const char* type = type_name(graph.nodes[step.inputs[k]].dtype);
        if (spec.inputs[k] == OperandAccess::Broadcast) {
          absl::StrAppend(&s, "#pragma unroll\n    for (int l = 0; l < ", width, "; ++l) row", k,
                          "[t + l] = in", k, "[0];\n");
          continue;
        }
        const std::string at =
            spec.inputs[k] != OperandAccess::Repeated ? std::string("i")
            : spec.periods_are_rows
                ? absl::StrCat("(IDX)(", group, " * (t / ", width, ") + ", width, " * lane)")
                : absl::StrCat("i % (IDX)args.stride[", k, "][0]");
        const std::string vec = absl::StrCat("lf_vec<", type, ", ", width, ">");
        absl::StrAppend(&s, "    const ", vec, " x", k, " = *(const ", vec, "*)(in", k, " + ", at,
                        ");\n#pragma unroll\n    for (int l = 0; l < ", width, "; ++l) row", k,
                        "[t + l] = x", k, ".v[l];\n");
      }
      s += "  }\n";
    } else {
      absl::StrAppend(&s, "#pragma unroll\n  for (int t = 0; t < ", registers, "; ++t) {\n    if (",
                      past_row, ") break;\n", "    const IDX i = (IDX)(row * args.columns + ",
                      column, ");\n");
      s += cuda_emit::emit_coordinates(spec.rank, "    ");
      for (size_t k = 0; k < step.inputs.size(); ++k)
        absl::StrAppend(&s, "    row", k, "[t] = ",
                        spec.periods_are_rows && spec.inputs[k] == OperandAccess::Repeated
                            ? absl::StrCat("in", k, "[", column, "]")
                            : loads[k],
                        ";\n");
      s += "  }\n";
    }
  }
  // A pass over the row computing `members`.
  auto pass_head = [&](const std::vector<ValueId>& members, const std::vector<ValueId>& inputs,
                       const cuda_emit::Reciprocals& reciprocals = {}) {
    std::string p;
    if (spec.row_in_registers) {
      absl::StrAppend(&p, "#pragma unroll\n  for (int t = 0; t < ", registers, "; ++t) {\n    if (",
                      past_row, ") break;\n", "    const IDX i = (IDX)(row * args.columns + ",
                      column, ");\n");
    } else {
      absl::StrAppend(&p,
                      "#pragma unroll 4\n  for (long long j = lane; j < args.columns; j += ", lanes,
                      ") {\n    const IDX i = (IDX)(row * args.columns + j);\n");
    }
    p += cuda_emit::emit_coordinates(spec.rank, "    ");
    p += cuda_emit::emit_members(graph, inputs, members, pass_loads, "    ", step.round_each_op,
                                 reciprocals);
    return p;
  };
  std::vector<ValueId> elementwise = parts.prologue;
  elementwise.insert(elementwise.end(), parts.epilogue.begin(), parts.epilogue.end());
  std::sort(elementwise.begin(), elementwise.end());
  // With the row in registers, the values the last pass reads from the last reduction's pass
  // (softmax's exponentials) are kept there too rather than computed again, while the operands
  // and kept values together fit the register budget.
  // Stored over the row (in the last pass), rather than once per row.
  std::vector<bool> stored_over_row(step.outputs.size(), false);
  bool stores = false;
  for (size_t o = 0; o < step.outputs.size(); ++o) {
    const ValueId v = step.outputs[o];
    stored_over_row[o] = !is_reduction(graph.nodes[v].op) && step.role_of(v) != Role::RowValue;
    stores |= stored_over_row[o];
  }
  const ValueId last_reduction = parts.reductions.back();
  std::vector<ValueId> carried;
  if (spec.row_in_registers && stores) {
    std::vector<bool> read_after(graph.nodes.size(), false);
    for (ValueId m : elementwise)
      if (m > last_reduction)
        for (ValueId in : graph.nodes[m].inputs) read_after[in] = true;
    for (ValueId v : step.outputs) read_after[v] = true;
    for (ValueId m : elementwise)
      if (m < last_reduction && read_after[m] && graph.nodes[m].op != Op::Const)
        carried.push_back(m);
    if (step.inputs.size() + carried.size() > static_cast<size_t>(kCudaRowRegisterInputs))
      carried.clear();
    for (ValueId m : carried)
      absl::StrAppend(&s, "  ", type_name(compute_dtype(graph.nodes[m].dtype)), " kept", m, "[",
                      registers, "];\n");
  }
  // Row values, once per row, as soon as the reductions they read are known (with the scalar
  // constants they read, each declared once); a stored one is stored by lane 0.
  std::vector<bool> known(graph.nodes.size(), false);
  size_t next_row_value = 0;
  auto emit_ready_row_values = [&] {
    std::vector<ValueId> ready;
    for (; next_row_value < parts.row_values.size(); ++next_row_value) {
      const ValueId v = parts.row_values[next_row_value];
      bool operands_known = true;
      for (ValueId in : graph.nodes[v].inputs)
        operands_known &= known[in] || is_scalar_constant(graph.nodes[in]);
      if (!operands_known) break;  // topological order: the rest read later reductions
      for (ValueId in : graph.nodes[v].inputs)
        if (is_scalar_constant(graph.nodes[in]) && !known[in]) {
          ready.push_back(in);
          known[in] = true;
        }
      ready.push_back(v);
      known[v] = true;
    }
    s += cuda_emit::emit_members(graph, {}, ready, {}, "  ", step.round_each_op);
    for (size_t o = 0; o < step.outputs.size(); ++o) {
      const ValueId v = step.outputs[o];
      if (step.role_of(v) != Role::RowValue ||
          std::find(ready.begin(), ready.end(), v) == ready.end())
        continue;
      const char* type = type_name(graph.nodes[v].dtype);
      absl::StrAppend(&s, "  if (lane == 0) ((", type, "*)args.out[", o, "])[row] = lf_store<",
                      type, ">(v", v, ");\n");
    }
  };
  emit_ready_row_values();
  for (size_t k = 0; k < parts.reductions.size(); ++k) {
    const ValueId r = parts.reductions[k];
    const Node& node = graph.nodes[r];
    const ValueId operand = node.inputs[0];
    const DType acc = step_accumulator(graph, step, node);
    const char* a = type_name(acc);
    const std::string combine = absl::StrCat("lf_combine", k);
    // The members before the reduction that it (and on the last pass, the kept values) needs:
    // a pass emits nothing it does not use, which keeps big row kernels quick to compile.
    std::vector<ValueId> earlier, roots = {operand};
    for (ValueId m : elementwise)
      if (m < r) earlier.push_back(m);
    if (r == last_reduction) roots.insert(roots.end(), carried.begin(), carried.end());
    const std::vector<ValueId> before = needed_members(graph, earlier, roots);
    // A lane's elements of a row in registers go to parts_per_lane independent accumulators by
    // position, combined in order after the pass: chains of additions short enough for their
    // latency to hide, in the same order on every run (as the fused reduction's).
    const std::string identity = absl::StrCat("(", a, ")(", combiner(node.op, acc).identity, ")");
    const int parts_per_lane = spec.row_in_registers ? std::min(registers, 4) : 1;
    const std::string into = parts_per_lane > 1
                                 ? absl::StrCat("acc", k, "_part[t % ", parts_per_lane, "]")
                                 : absl::StrCat("acc", k);
    absl::StrAppend(&s, "  ", a, " acc", k, " = ", identity, ";\n");
    if (parts_per_lane > 1)
      absl::StrAppend(&s, "  ", a, " acc", k, "_part[", parts_per_lane,
                      "];\n#pragma unroll\n  for (int p = 0; p < ", parts_per_lane, "; ++p) acc", k,
                      "_part[p] = ", identity, ";\n");
    absl::StrAppend(&s, pass_head(before, step.inputs), "    ", into, " = ", combine, "(", into,
                    ", (", a, ")v", operand, ");\n");
    if (r == last_reduction)
      for (ValueId m : carried) absl::StrAppend(&s, "    kept", m, "[t] = v", m, ";\n");
    s += "  }\n";
    if (parts_per_lane > 1)
      absl::StrAppend(&s, "#pragma unroll\n  for (int p = 0; p < ", parts_per_lane, "; ++p) acc", k,
                      " = ", combine, "(acc", k, ", acc", k, "_part[p]);\n");
    // The row's result, rounded to the reduction's dtype exactly as a stored one would be; read
    // in the kernel as that, or, a half value rounding only at stores, in float32 (a LayerNorm's
    // mean rounded to bfloat16 would cost its outputs several units in their last place).
    const char* result_type = type_name(node.dtype);
    const bool kept_unrounded = !step.round_each_op && is_half(node.dtype);
    absl::StrAppend(&s, "  for (int offset = 16; offset > 0; offset /= 2) acc", k, " = ", combine,
                    "(acc", k, ", __shfl_xor_sync(0xffffffffu, acc", k, ", offset));\n");
    if (spec.row_warps > 1) {
      // Every warp's result through shared memory (an array per reduction, so none is
      // overwritten while another warp still reads it), combined in warp order by every lane.
      absl::StrAppend(&s, "  __shared__ ", a, " warp_acc", k, "[", spec.row_warps,
                      "];\n  if (lane % 32 == 0) warp_acc", k, "[lane / 32] = acc", k,
                      ";\n  __syncthreads();\n  acc", k, " = warp_acc", k,
                      "[0];\n  for (int w = 1; w < ", spec.row_warps, "; ++w) acc", k, " = ",
                      combine, "(acc", k, ", warp_acc", k, "[w]);\n");
    }
    if (divides_by_count(node.op))
      // In the accumulator's type: a float32 one divided by the double divisor would divide in
      // float64 (two dozen instructions, once a warp, for a warp's 512 elements of a row).
      absl::StrAppend(&s, "  acc", k, " = acc", k, " / (", a, ")args.divisor;\n");
    const char* compute_type = type_name(compute_dtype(node.dtype));
    const bool stored =
        std::find(step.outputs.begin(), step.outputs.end(), r) != step.outputs.end();
    if (stored || !kept_unrounded)
      absl::StrAppend(&s, "  const ", result_type, " total", k, " = lf_store<", result_type,
                      ">(acc", k, ");\n");
    absl::StrAppend(&s, "  const ", compute_type, " v", r, " = ",
                    kept_unrounded ? absl::StrCat("(", compute_type, ")acc", k)
                                   : absl::StrCat("lf_load(total", k, ")"),
                    ";\n");
    for (size_t o = 0; o < step.outputs.size(); ++o)
      if (step.outputs[o] == r)
        absl::StrAppend(&s, "  if (lane == 0) ((", result_type, "*)args.out[", o, "])[row] = total",
                        k, ";\n");
    known[r] = true;
    emit_ready_row_values();
  }
  if (next_row_value < parts.row_values.size())
    throw VerifierError(absl::StrCat("row value %", parts.row_values[next_row_value],
                                     " reads a value the row kernel has per element only"));
  // The last pass stores what is stored besides the reductions, reading the kept values.
  if (stores) {
    std::vector<ValueId> inputs = step.inputs, members;
    for (ValueId m : carried) {
      inputs.push_back(m);
      pass_loads.push_back(absl::StrCat("kept", m, "[t]"));
    }
    std::vector<ValueId> stored;
    for (size_t o = 0; o < step.outputs.size(); ++o)
      if (stored_over_row[o]) stored.push_back(step.outputs[o]);
    for (ValueId m : elementwise)
      if (std::find(carried.begin(), carried.end(), m) == carried.end()) members.push_back(m);
    members = needed_members(graph, members, stored);
    // Vectorized, each output's elements of a group are stored at once.
    for (size_t k = 0; vector_rows && k < step.outputs.size(); ++k)
      if (stored_over_row[k])
        absl::StrAppend(&s, "  lf_vec<", type_name(graph.nodes[step.outputs[k]].dtype), ", ", width,
                        "> y", k, ";\n");
    // A half value divided by a value of its row (softmax's sum), rounding at stores, is
    // multiplied by the row's reciprocal: one multiplication an element instead of a division.
    cuda_emit::Reciprocals reciprocals;
    std::vector<bool> has_reciprocal(graph.nodes.size(), false);
    for (ValueId m : members) {
      const Node& node = graph.nodes[m];
      if (step.round_each_op || node.op != Op::Div || !is_half(node.dtype)) continue;
      const ValueId divisor = node.inputs[1];
      const Node& d = graph.nodes[divisor];
      if (!known[divisor] || is_scalar_constant(d) || d.dtype != node.dtype) continue;
      const std::string name = absl::StrCat("reciprocal", divisor);
      if (!has_reciprocal[divisor])
        absl::StrAppend(&s, "  const float ", name, " = __frcp_rn(v", divisor, ");\n");
      has_reciprocal[divisor] = true;
      reciprocals.emplace_back(m, name);
    }
    s += pass_head(members, inputs, reciprocals);
    for (size_t k = 0; k < step.outputs.size(); ++k) {
      if (!stored_over_row[k]) continue;
      const char* type = type_name(graph.nodes[step.outputs[k]].dtype);
      if (vector_rows) {
        absl::StrAppend(&s, "    y", k, ".v[t % ", width, "] = lf_store<", type, ">(v",
                        step.outputs[k], ");\n    if (t % ", width, " == ", width - 1,
                        ") *(lf_vec<", type, ", ", width, ">*)((", type, "*)args.out[", k,
                        "] + i - ", width - 1, ") = y", k, ";\n");
      } else {
        absl::StrAppend(&s, "    ((", type, "*)args.out[", k, "])[i] = lf_store<", type, ">(v",
                        step.outputs[k], ");\n");
      }
    }
    s += "  }\n";
  }
  s += "}\n";
  return source;
}

CudaSource generate_cuda_step(const Graph& graph, const Step& step, const CudaElementwiseSpec& spec,
                              bool fast_math) {
  if (step.kind == StepKind::Elementwise)
    return generate_cuda_elementwise(graph, step, spec, fast_math);
  if (!is_reduction_kind(step.kind))
    throw VerifierError("only elementwise and reduction steps have generated kernels");
  if (step.kind == StepKind::Row) return generate_cuda_row_kernel(graph, step, spec, fast_math);
  const ReductionParts parts = reduction_parts(step);
  if (!parts.prologue.empty() || cuda_reduces_stored_half_in_vectors(graph, step))
    return generate_cuda_fused_reduction(graph, step, spec, fast_math);
  const Node& node = graph.nodes[parts.reduction];
  return generate_cuda_reduction(node.op, graph.nodes[node.inputs[0]].dtype, node.dtype,
                                 step_accumulator(graph, step, node));
}

}  // namespace lazyfuse
