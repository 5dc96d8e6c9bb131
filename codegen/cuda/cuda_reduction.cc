// Generating CUDA source for row reductions: a strided loop per thread, warp shuffles, then a
// tree over the block's warps in shared memory.
#include <algorithm>
#include <bit>
#include <functional>
#include <string>

#include "absl/strings/str_cat.h"
#include "lazyfuse/codegen/cuda/cuda_codegen.h"
#include "lazyfuse/codegen/cuda/cuda_emit.h"
#include "lazyfuse/codegen/gpu_dialect.h"
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

std::string cuda_emit::reduction_identity(Op op, DType acc) { return combiner(op, acc).identity; }

// Before the kernel: the combining function.
std::string cuda_emit::reduction_preamble(Op op, DType acc, const std::string& name) {
  const char* a = type_name(acc);
  return absl::StrCat("\n", gpu_dialect().device_function(), " ", a, " ", name, "(", a, " x, ", a,
                      " y) { return ", combiner(op, acc).combine, "; }\n");
}

namespace {

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
  return absl::StrCat(indent, "for (int offset = ", gpu_dialect().warp_size() / 2,
                      "; offset > 0; offset /= 2) ", var, " = lf_combine(", var, ", ",
                      gpu_dialect().shuffle_down(var, "offset"), ");\n");
}

// Warp 0's lanes take the warps' results (stored in warp_results) and combine them.
std::string combine_warp_results(Op op, DType acc, const std::string& indent,
                                 const std::string& var) {
  return absl::StrCat(indent, var, " = lane < (int)(blockDim.x / ", gpu_dialect().warp_size(),
                      ") ? warp_results[lane] : (", type_name(acc), ")(",
                      combiner(op, acc).identity, ");\n", warp_combine(indent, var));
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
  const int warp = gpu_dialect().warp_size();
  return absl::StrCat(
      "  __shared__ ", a, " warp_results[", warp, "];\n  __shared__ bool last_block;\n",
      "  const int lane = threadIdx.x % ", warp, ", warp = threadIdx.x / ", warp, ";\n",
      "  if (args.chunks == 1) {\n", block_combine(op, acc), row_result, R"(    return;
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
    acc = lf_combine(acc, )",
      gpu_dialect().load_bypassing_l1(
          absl::StrCat("(", a, "*)args.partial + row * args.chunks + j")),
      ");\n", block_combine(op, acc), row_result, "  args.counters[row] = 0;\n}\n");
}

}  // namespace

CudaSource cuda_emit::begin_row_kernel(const Graph& graph, const Step& step,
                                       const CudaElementwiseSpec& spec, bool fast_math,
                                       const std::string& preamble, const std::string& comment,
                                       const std::function<void(ArgLayout&)>& add_fields,
                                       int threads) {
  const size_t num_inputs = step.inputs.size();
  CudaSource source;
  source.kernel_name = absl::StrCat(step.kernel_name(), "_", spec.code());
  for (char& c : source.kernel_name)
    if (c == '.') c = '_';
  std::string& s = source.source;
  if (fast_math) s += "#define LF_FAST_MATH 1\n";
  s += gpu_dialect().prologue();
  ArgLayout layout;
  add_space_fields(layout, spec, static_cast<int>(num_inputs));
  add_fields(layout);
  absl::StrAppend(&s, "\n// ", comment, "\n",
                  layout.declare(absl::StrCat("Args_", source.kernel_name)), preamble, "\n",
                  gpu_dialect().kernel(source.kernel_name, threads), "(const Args_",
                  source.kernel_name, " args) {\n", "  typedef ",
                  spec.index64 ? "long long" : "unsigned int", " IDX;\n");
  s += cuda_emit::emit_input_pointers(graph, step.inputs);
  return source;
}

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
  s = gpu_dialect().prologue();
  absl::StrAppend(&s, "\n", plain_reduction_arg_layout().declare("ReduceArgs"),
                  cuda_emit::reduction_preamble(op, acc), "\n",
                  gpu_dialect().kernel(source.kernel_name, kCudaReduceThreads),
                  "(const ReduceArgs args) {\n",
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
  const int lane = threadIdx.x % )",
                  kCudaColumnTile, ", slice = threadIdx.x / ", kCudaColumnTile,
                  ";\n  const long long column = tile * ", kCudaColumnTile, R"( + lane;
  const long long begin = chunk * args.chunk;
  const long long end = min(args.columns, begin + args.chunk);
  )",
                  a, " acc = ", identity, ";\n", "  if (column < args.rows) {\n", walk, R"(  }
  // The slices of each column combined in slice order by the first warp.
  __shared__ )",
                  a, " slices[kSlices][", kCudaColumnTile, R"(];
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
      acc = lf_combine(acc, )",
                  gpu_dialect().load_bypassing_l1(
                      absl::StrCat("(", a, "*)args.partial + column * args.chunks + c")),
                  ");\n      ", store, R"(  }
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
      gpu_dialect().prologue(), "\n", column_reduction_arg_layout().declare("ColumnReduceArgs"),
      cuda_emit::reduction_preamble(op, acc), "\n",
      gpu_dialect().kernel(source.kernel_name, kCudaReduceThreads),
      "(const ColumnReduceArgs args) {\n", column_reduction_body(op, in, out, acc, "blockIdx.x"));
  return source;
}

std::string cuda_emit::reduction_member_function(Op op, DType in, DType out, DType acc,
                                                 bool columns, const std::string& name) {
  const char* a = type_name(acc);
  // The combination as a local lambda: members of other ops define their own.
  return absl::StrCat("static ", gpu_dialect().device_function(), " void ", name, "(const ",
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
    // (one float32 chain a thread held a bfloat16 sum of squares below the float64 one's share
    // of the roof: docs/benchmarks.md, "GPU reductions"), in the same order on every run.
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
  CudaSource source = cuda_emit::begin_row_kernel(
      graph, step, spec, fast_math,
      cuda_emit::reduction_preamble(node.op, fused_reduction_accumulator(graph, step)),
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
                      "static ", gpu_dialect().device_function(), " void ", name, "(const Args_",
                      name, "& args, unsigned int block, unsigned int blocks) {\n  (void)blocks;\n",
                      "  const auto lf_combine = [](", a, " x, ", a, " y) -> ", a, " { return ",
                      combiner(node.op, acc).combine, "; };\n", "  typedef ",
                      spec.index64 ? "long long" : "unsigned int", " IDX;\n",
                      cuda_emit::emit_input_pointers(graph, step.inputs),
                      kind.body(graph, step, spec, "block"));
}

void choose_cuda_fused_reduction_layout(CudaElementwiseLaunch& plan, bool over_columns,
                                        bool order_shows, int64_t columns, int64_t chunk) {
  CudaElementwiseSpec& spec = plan.spec;
  spec.vectorized = spec.vectorized && !over_columns && !order_shows && spec.rank == 1 &&
                    columns % spec.vector_width == 0 && chunk % spec.vector_width == 0;
}

bool cuda_reduction_order_shows(const Graph& graph, const Step& step) {
  const Node& node = graph.nodes[reduction_parts(step).reduction];
  return reduction_order_shows(node.op, graph.nodes[node.inputs[0]].dtype,
                               step_accumulator(graph, step, node));
}

CudaSource generate_cuda_step(const Graph& graph, const Step& step, const CudaElementwiseSpec& spec,
                              bool fast_math) {
  if (step.kind == StepKind::Elementwise)
    return generate_cuda_elementwise(graph, step, spec, fast_math);
  if (!is_reduction_kind(step.kind))
    throw VerifierError("only elementwise and reduction steps have generated kernels");
  if (step.kind == StepKind::Row || is_column_row_step(step))
    return generate_cuda_row_kernel(graph, step, spec, fast_math);
  const ReductionParts parts = reduction_parts(step);
  if (!parts.prologue.empty() || cuda_reduces_stored_half_in_vectors(graph, step))
    return generate_cuda_fused_reduction(graph, step, spec, fast_math);
  const Node& node = graph.nodes[parts.reduction];
  return generate_cuda_reduction(node.op, graph.nodes[node.inputs[0]].dtype, node.dtype,
                                 step_accumulator(graph, step, node));
}

}  // namespace lazyfuse
