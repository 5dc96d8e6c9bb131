// The CUDA backend (runtime/backend.h): generated kernels (elementwise, reductions with what
// is fused around them, row kernels, index steps) compiled by NVRTC on first use, cuBLAS
// matmul, device memory through the caching allocator, and copies between the host and GPUs.
// Its only entry point is cuda_backend(), which the backend registry calls.
#include <algorithm>
#include <bit>
#include <limits>
#include <mutex>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "lazyfuse/codegen/cuda/cuda_codegen.h"
#include "lazyfuse/codegen/cuda/cuda_kernel_args.h"
#include "lazyfuse/codegen/kernel_plan.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/ir/infer.h"
#include "lazyfuse/ir/passes/passes.h"
#include "lazyfuse/runtime/backend.h"
#include "lazyfuse/runtime/cpu/cpu_backend.h"
#include "lazyfuse/runtime/cuda/cublas.h"
#include "lazyfuse/runtime/cuda/cuda_driver.h"
#include "lazyfuse/runtime/cuda/cuda_graphs.h"
#include "lazyfuse/runtime/cuda/cuda_memory.h"
#include "lazyfuse/runtime/env.h"
#include "lazyfuse/runtime/host_profile.h"
#include "lazyfuse/runtime/kernel_cache.h"

namespace lazyfuse {
namespace {

constexpr unsigned kThreadsPerBlock = 256;
// A group kernel runs elementwise and reduction members in blocks of one size.
static_assert(kThreadsPerBlock == kCudaReduceThreads);

// What a launch of a generated kernel can reuse while its operands keep their layout: the plan
// (variant, merged sizes and strides), the kernel and the grid. Kept per step of a cached
// schedule; used under the evaluation lock.
struct LaunchMemo : StepCache {
  bool valid = false;
  uint64_t kernel_generation = 0;  // cuda::kernel_cache_generation() when it was made
  bool fast_math = false;
  std::vector<Shape> shapes;
  std::vector<Strides> strides;
  std::vector<bool> aligned;  // each operand's address, to the plan's vector width
  CudaElementwiseLaunch plan;
  void* function = nullptr;  // the CUfunction
  std::string name;          // its cache key, for errors
};

uint64_t address(const BufferView& view) { return reinterpret_cast<uint64_t>(view.data()); }

// Counts a launch or library call the GPU will run: not in a dry run, whose work runs, if at
// all, as a graph that counts its own (Note [CUDA graph replay]).
void count_gpu_launch() {
  if (cuda::recording() != cuda::Recording::Dry) count_launch();
}

// Launches `function` with its one struct parameter `args`; under LAZYFUSE_SYNC=1 waits, so
// an error names the kernel.
void launch(int device, cuda::CUfunction function, int64_t blocks, unsigned threads,
            KernelArgs& args, const std::string& name) {
  if (blocks == 0) return;
  count_gpu_launch();
  if (cuda::recording() != cuda::Recording::Off) {
    const uint64_t head[] = {reinterpret_cast<uint64_t>(function), static_cast<uint64_t>(blocks),
                             threads, args.size()};
    cuda::record_words(head);
    cuda::record_words(args);
    if (cuda::recording() == cuda::Recording::Dry) return;
  }
  void* params[] = {args.data()};
  ScopedHostPhase phase(HostPhase::Launch);
  cuda::check(cuda::driver()->cuLaunchKernel(function, static_cast<unsigned>(blocks), 1, 1, threads,
                                             1, 1, 0, cuda::device_stream(device), params, nullptr),
              "cuLaunchKernel");
  if (env_config().sync)
    cuda::check(cuda::driver()->cuCtxSynchronize(), absl::StrCat("kernel ", name).c_str());
}

// A step's operands as codegen sees them, with their addresses.
struct Operands {
  std::vector<OperandLayout> layouts;
  std::vector<uint64_t> addresses;
};
Operands operands_of(const Step& step, const ValueBuffers& values) {
  Operands operands;
  for (ValueId v : step.inputs) {
    const BufferView& in = *values[v];
    operands.layouts.push_back({address(in), dtype_size(in.dtype), in.shape, in.strides});
    operands.addresses.push_back(address(in));
  }
  return operands;
}

// Buffers for the step's results (fresh, or the one the evaluator bound); their addresses, in step
// order.
absl::InlinedVector<uint64_t, 4> allocate_outputs(const Graph& graph, const Step& step,
                                                  ValueBuffers& values) {
  absl::InlinedVector<uint64_t, 4> addresses;
  for (ValueId v : step.outputs) {
    const Node& node = graph.nodes[v];
    // An output the evaluator bound already is written where it lies (Note [Writing an update
    // into its own buffer] in runtime/lazy.cc).
    if (!values[v]) values[v] = allocate_buffer(node.device, node.dtype, node.shape);
    addresses.push_back(address(*values[v]));
  }
  return addresses;
}

// Outputs as aligned as the widest vector access (8 elements) suit any plan.
constexpr int64_t kVectorAlignment = 8;

// Whether `memo` was made for operands laid out as `values`' inputs of `step` are now: each
// keeps its shape, strides, and alignment to the plan's vector width (the plan depends on
// nothing else about the operands).
bool memo_fits(const LaunchMemo& memo, const Step& step, const ValueBuffers& values,
               bool fast_math) {
  if (!memo.valid || memo.kernel_generation != cuda::kernel_cache_generation() ||
      memo.fast_math != fast_math || memo.shapes.size() != step.inputs.size())
    return false;
  for (size_t k = 0; k < step.inputs.size(); ++k) {
    const BufferView& in = *values[step.inputs[k]];
    if (in.shape != memo.shapes[k] || in.strides != memo.strides[k] ||
        (address(in) % (memo.plan.spec.vector_width * dtype_size(in.dtype)) == 0) !=
            memo.aligned[k])
      return false;
  }
  return true;
}

// Keeps a launch's plan and kernel in `memo` for the next evaluation whose operands keep
// these layouts (memo_fits).
void remember_launch(LaunchMemo& memo, const std::vector<OperandLayout>& layouts,
                     CudaElementwiseLaunch plan, cuda::CUfunction function, const std::string& key,
                     bool fast_math) {
  memo.valid = true;
  memo.kernel_generation = cuda::kernel_cache_generation();
  memo.fast_math = fast_math;
  memo.shapes.clear();
  memo.strides.clear();
  memo.aligned.clear();
  for (const OperandLayout& layout : layouts) {
    memo.shapes.push_back(layout.shape);
    memo.strides.push_back(layout.strides);
    memo.aligned.push_back(layout.address % (plan.spec.vector_width * layout.element_size) == 0);
  }
  memo.plan = std::move(plan);
  memo.function = function;
  memo.name = key;
}

// The step's operand addresses, in step order.
absl::InlinedVector<uint64_t, 8> input_addresses(const Step& step, const ValueBuffers& values) {
  absl::InlinedVector<uint64_t, 8> inputs;
  for (ValueId v : step.inputs) inputs.push_back(address(*values[v]));
  return inputs;
}

// A step's plan and kernel for its operands as they are now: the memo's when it fits them
// (counted as a memory hit, as a lookup would be), else `make_plan` over their layouts and the
// kernel of `generate`, remembered in the memo (or in `scratch` without one). Every kind of
// generated kernel (elementwise, fused reduction, row) finds its kernel here and packs its own
// arguments (codegen/cuda/cuda_kernel_args.h).
template <typename MakePlan, typename Generate>
const LaunchMemo& planned_kernel(const Step& step, const ValueBuffers& values, LaunchMemo* memo,
                                 LaunchMemo& scratch, MakePlan make_plan, Generate generate) {
  const bool fast_math = env_config().fast_math;
  if (memo != nullptr && memo_fits(*memo, step, values, fast_math)) {
    cuda::count_memory_hit();
    return *memo;
  }
  const Operands operands = operands_of(step, values);
  CudaElementwiseLaunch plan = make_plan(operands.layouts);
  const std::string key = cuda_kernel_cache_key(step, plan.spec, fast_math);
  cuda::CUfunction function =
      cuda::get_kernel(step.device.index(), key, [&] { return generate(plan.spec, fast_math); });
  LaunchMemo& kept = memo != nullptr ? *memo : scratch;
  remember_launch(kept, operands.layouts, std::move(plan), function, key, fast_math);
  return kept;
}

// An elementwise launch's grid: a thread per element (or per vector), which measured fastest;
// under LAZYFUSE_BLOCKS_PER_SM a capped grid whose threads loop over the rest.
int64_t elementwise_blocks(const CudaElementwiseLaunch& plan, int device) {
  const int64_t width = plan.spec.vectorized ? plan.spec.vector_width : 1;
  const int64_t units = (plan.numel + width - 1) / width;
  const int64_t per_sm = env_config().blocks_per_sm;
  const int64_t cap = per_sm > 0 ? cuda::device_properties(device).multiprocessors * per_sm
                                 : std::numeric_limits<int32_t>::max();
  return std::clamp<int64_t>((units + kThreadsPerBlock - 1) / kThreadsPerBlock, 1, cap);
}

void run_elementwise(const Graph& graph, const Step& step, ValueBuffers& values, LaunchMemo* memo) {
  const int device = step.device.index();
  cuda::activate(device);
  const absl::InlinedVector<uint64_t, 4> outputs = allocate_outputs(graph, step, values);
  if (numel(step.shape) == 0) return;
  // Buffers of the caching allocator are aligned far beyond 16 bytes: when the inputs keep
  // their layout the plan and the kernel are the memo's. A memo is kept only for aligned
  // outputs, which any plan suits.
  bool outputs_aligned = true;
  for (size_t k = 0; k < step.outputs.size(); ++k)
    outputs_aligned &=
        outputs[k] % (kVectorAlignment * dtype_size(graph.nodes[step.outputs[k]].dtype)) == 0;
  LaunchMemo scratch;
  const LaunchMemo& kernel = planned_kernel(
      step, values, outputs_aligned ? memo : nullptr, scratch,
      [&](const std::vector<OperandLayout>& layouts) {
        std::vector<int64_t> output_sizes;
        for (ValueId v : step.outputs) output_sizes.push_back(dtype_size(graph.nodes[v].dtype));
        return plan_cuda_elementwise(step, layouts, outputs, output_sizes);
      },
      [&](const CudaElementwiseSpec& spec, bool fast_math) {
        return generate_cuda_elementwise(graph, step, spec, fast_math);
      });
  KernelArgs args = pack_elementwise_args(kernel.plan, input_addresses(step, values), outputs);
  launch(device, static_cast<cuda::CUfunction>(kernel.function),
         elementwise_blocks(kernel.plan, device), kThreadsPerBlock, args, kernel.name);
}

// A contiguous copy of `source` (any strides, broadcast included) converted to `dtype`: one
// generated elementwise kernel (a copy or a cast).
BufferView cuda_convert(const BufferView& source, DType dtype) {
  Graph graph;
  Node param;
  param.op = Op::Param;
  param.dtype = source.dtype;
  param.shape = source.shape;
  param.device = source.storage->device();
  graph.add(param);
  Node convert = param;
  convert.op = source.dtype == dtype ? Op::Copy : Op::Cast;
  convert.dtype = dtype;
  convert.inputs = {0};
  graph.outputs = {graph.add(convert)};
  Schedule schedule = run_fusion(std::move(graph), {});
  ValueBuffers values = {source, std::nullopt};
  run_elementwise(schedule.graph, schedule.steps.at(0), values, nullptr);
  return *values[1];
}

BufferView cuda_contiguous(const BufferView& source) {
  return source.is_contiguous() ? source : cuda_convert(source, source.dtype);
}

// Zeroed counters, one per row, for reductions whose rows span several chunks: a row's last
// block to finish combines its partials and sets the row's counter back to zero (codegen's
// reduction_tail). A device's kernels run in order on its one stream, so one buffer of
// counters serves every launch there; it only grows.
uint64_t reduction_counters(const Device& device, int64_t rows) {
  static std::mutex mutex;
  // Never destroyed: the buffers go with the process, after the allocator they came from.
  static auto& counters = *new std::vector<std::optional<BufferView>>();
  std::lock_guard lock(mutex);
  const size_t index = static_cast<size_t>(device.index());
  if (counters.size() <= index) counters.resize(index + 1);
  std::optional<BufferView>& slot = counters[index];
  if (!slot || numel(slot->shape) < rows) {
    cuda::check_replayable("the reduction counters grow", false);
    const int64_t count = std::max<int64_t>(rows, 1024);
    BufferView fresh = allocate_buffer(device, DType::Int32, {count});
    const std::vector<int32_t> zeros(static_cast<size_t>(count), 0);
    cuda::check(cuda::driver()->cuMemcpyHtoD(address(fresh), zeros.data(), zeros.size() * 4),
                "cuMemcpyHtoD");
    slot = std::move(fresh);
  }
  return address(*slot);
}

// The columns one block of a reduction over rows takes: LAZYFUSE_REDUCE_CHUNK's, or codegen's
// by size.
int64_t row_chunk(int64_t rows, int64_t columns) {
  return env_config().reduce_chunk > 0 ? env_config().reduce_chunk
                                       : cuda_reduce_chunk(rows, columns);
}

// A reduction's words after its operands (codegen/cuda/cuda_kernel_args.h), with the partials and
// counters a row of several chunks needs. Returns the chunks per row.
int64_t append_reduction_launch(const Device& device, DType acc, uint64_t out, int64_t rows,
                                int64_t columns, KernelArgs& args,
                                std::optional<BufferView>& partial) {
  const int64_t chunk = row_chunk(rows, columns);
  const int64_t chunks = std::max<int64_t>(1, (columns + chunk - 1) / chunk);
  if (chunks > 1) partial = allocate_buffer(device, acc, {rows, chunks});
  ReductionWords words;
  words.out = out;
  words.rows = rows;
  words.columns = columns;
  words.chunk = chunks == 1 ? std::max<int64_t>(columns, 1) : chunk;
  words.chunks = chunks;
  words.divisor = static_cast<double>(columns);
  words.partial = partial ? address(*partial) : 0;
  words.counters = chunks > 1 ? reduction_counters(device, rows) : 0;
  append_reduction_args(words, args);
  return chunks;
}

// The kernel of a reduction with fused work (over rows or columns), planned for the operands'
// layouts, reading them in vectors where choose_cuda_fused_reduction_layout allows.
const LaunchMemo& fused_reduction_kernel(const Graph& graph, const Step& step,
                                         const ValueBuffers& values, LaunchMemo* memo,
                                         LaunchMemo& scratch, int64_t rows) {
  const bool over_columns = step.kind == StepKind::Column;
  return planned_kernel(
      step, values, memo, scratch,
      [&](const std::vector<OperandLayout>& layouts) {
        CudaElementwiseLaunch plan = plan_cuda_elementwise(step, layouts, {}, {});
        const int64_t columns = rows == 0 ? 0 : plan.numel / rows;
        choose_cuda_fused_reduction_layout(plan, over_columns, columns, row_chunk(rows, columns));
        return plan;
      },
      [&](const CudaElementwiseSpec& spec, bool fast_math) {
        return generate_cuda_fused_reduction(graph, step, spec, fast_math);
      });
}

// A reduction with a fused prologue: one kernel computes the prologue's elements and reduces
// them, its last block per row combining the chunks' partials.
BufferView run_fused_reduction(const Graph& graph, const Step& step, const Node& node,
                               const ValueBuffers& values, LaunchMemo* memo) {
  cuda::activate(node.device.index());
  BufferView out = allocate_buffer(node.device, node.dtype, node.shape);
  const int64_t rows = numel(node.shape);
  if (rows == 0) return out;
  LaunchMemo scratch;
  const LaunchMemo& kernel = fused_reduction_kernel(graph, step, values, memo, scratch, rows);
  KernelArgs args;
  append_space_args(kernel.plan, input_addresses(step, values), args);
  const int64_t columns = kernel.plan.numel / rows;
  const DType acc = step_accumulator(graph, step, node);
  std::optional<BufferView> partial;
  const int64_t chunks =
      append_reduction_launch(node.device, acc, address(out), rows, columns, args, partial);
  launch(node.device.index(), static_cast<cuda::CUfunction>(kernel.function), rows * chunks,
         kCudaReduceThreads, args, kernel.name);
  return out;
}

// A reduction over leading dims with fused work (codegen's generate_cuda_fused_reduction):
// its kept columns, reduced length and chunking, from the sizes alone.
ReductionWords fused_column_words(int64_t kept, int64_t reduced) {
  ReductionWords words;
  words.rows = kept;
  words.columns = reduced;
  words.chunk = cuda_column_chunk(kept, reduced);
  words.chunks = std::max<int64_t>(1, (reduced + words.chunk - 1) / words.chunk);
  words.divisor = static_cast<double>(reduced);
  return words;
}
int64_t column_tiles(const ReductionWords& words) {
  return (words.rows + kCudaColumnTile - 1) / kCudaColumnTile;
}

// One kernel computes the work over the space column by column, stores what the step stores
// and reduces the columns, the last block of each tile combining the chunks' partials.
void run_fused_column_reduction(const Graph& graph, const Step& step, const Node& node,
                                ValueBuffers& values, LaunchMemo* memo) {
  cuda::activate(node.device.index());
  const absl::InlinedVector<uint64_t, 4> outputs = allocate_outputs(graph, step, values);
  const int64_t kept = numel(node.shape);
  if (kept == 0) return;
  LaunchMemo scratch;
  const LaunchMemo& kernel = fused_reduction_kernel(graph, step, values, memo, scratch, kept);
  ReductionWords words = fused_column_words(kept, kernel.plan.numel / kept);
  std::optional<BufferView> partial;
  if (words.chunks > 1) {
    partial =
        allocate_buffer(node.device, step_accumulator(graph, step, node), {kept, words.chunks});
    words.partial = address(*partial);
    words.counters = reduction_counters(node.device, column_tiles(words));
  }
  KernelArgs args;
  append_space_args(kernel.plan, input_addresses(step, values), args);
  append_column_step_args(outputs, words, args);
  launch(node.device.index(), static_cast<cuda::CUfunction>(kernel.function),
         column_tiles(words) * words.chunks, kCudaReduceThreads, args, kernel.name);
}

// A row step (reductions of the same rows, an epilogue): one warp per row.
void run_row_kernel(const Graph& graph, const Step& step, const Node& node, ValueBuffers& values,
                    LaunchMemo* memo) {
  cuda::activate(node.device.index());
  const absl::InlinedVector<uint64_t, 4> outputs = allocate_outputs(graph, step, values);
  const int64_t rows = numel(node.shape);
  if (rows == 0) return;
  // Lanes read and write 16 bytes at once (choose_cuda_row_layout) where the row is in
  // registers, is whole groups of such accesses, and every operand and stored output is aligned
  // for it (the plan checks the operands). Fresh outputs always are; a memo is kept only for
  // them.
  bool outputs_aligned = true;
  for (size_t k = 0; k < step.outputs.size(); ++k) {
    const Node& output = graph.nodes[step.outputs[k]];
    outputs_aligned &=
        is_reduction(output.op) || outputs[k] % (kVectorAlignment * dtype_size(output.dtype)) == 0;
  }
  LaunchMemo scratch;
  const LaunchMemo& kernel = planned_kernel(
      step, values, outputs_aligned ? memo : nullptr, scratch,
      [&](const std::vector<OperandLayout>& layouts) {
        CudaElementwiseLaunch plan = plan_cuda_elementwise(step, layouts, {}, {});
        choose_cuda_row_layout(plan, plan.numel / rows, step.inputs.size(), outputs_aligned);
        return plan;
      },
      [&](const CudaElementwiseSpec& spec, bool fast_math) {
        return generate_cuda_row_kernel(graph, step, spec, fast_math);
      });
  const int64_t columns = kernel.plan.numel / rows;
  KernelArgs args;
  append_space_args(kernel.plan, input_addresses(step, values), args);
  append_row_args(outputs, rows, columns, args);
  launch(node.device.index(), static_cast<cuda::CUfunction>(kernel.function),
         cuda_row_blocks(kernel.plan.spec, rows), cuda_row_threads(kernel.plan.spec), args,
         kernel.name);
}

// When the kept dims of `view` ([kept..., reduced...], `reduced` dims last) lie contiguous in
// order and the reduced dims walk memory as one dim: the elements between one reduced element
// and the next (a bias gradient's sum over the batch of a row-major [batch, features]).
std::optional<int64_t> column_stride(const BufferView& view, int64_t reduced) {
  const int64_t rank = static_cast<int64_t>(view.shape.size());
  int64_t expected = 1;  // the kept dims: dense, the innermost with stride 1
  for (int64_t d = rank - reduced; d-- > 0;) {
    if (view.shape[d] == 1) continue;
    if (view.strides[d] != expected) return std::nullopt;
    expected *= view.shape[d];
  }
  std::optional<int64_t> stride;  // the reduced dims: one walk, the innermost's stride
  for (int64_t d = rank; d-- > rank - reduced;) {
    if (view.shape[d] == 1) continue;
    if (!stride) {
      stride = view.strides[d];
      expected = view.strides[d];
    } else if (view.strides[d] != expected) {
      return std::nullopt;
    }
    expected *= view.shape[d];
  }
  return stride.value_or(1);
}

// A reduction of a stored operand as one kernel reads it: the operand as [kept..., reduced...]
// (`view`), read by rows where that view is dense, by columns where column_stride allows, and
// otherwise by rows of a dense copy, which the caller makes (needs_copy). The chunking comes
// from the sizes alone.
struct PlainReduction {
  BufferView view;
  int64_t kept = 1, reduced = 1;
  bool columns = false;
  bool needs_copy = false;
  int64_t stride = 1;  // columns: between one reduced element and the next
  int64_t chunk = 1, chunks = 1;
  DType acc = DType::Float64;  // cuda_reduction_accumulator's

  int64_t groups() const {  // rows, or tiles of columns
    return columns ? (kept + kCudaColumnTile - 1) / kCudaColumnTile : kept;
  }
  int64_t blocks() const { return groups() * chunks; }
  // Counters a launch needs (a zero each): one per row or tile of several chunks.
  int64_t counters() const { return chunks > 1 ? groups() : 0; }
};

PlainReduction plan_plain_reduction(const Node& node, const BufferView& input, DType acc) {
  PlainReduction plan;
  plan.acc = acc;
  const int64_t rank = static_cast<int64_t>(input.shape.size());
  const std::vector<int64_t> dims = reduction_dims(node.attrs, rank);
  plan.view = input;
  plan.view.shape.clear();
  plan.view.strides.clear();
  for (int pass = 0; pass < 2; ++pass) {
    for (int64_t d = 0; d < rank; ++d) {
      const bool reduced = std::binary_search(dims.begin(), dims.end(), d);
      if (reduced != (pass == 1)) continue;
      plan.view.shape.push_back(input.shape[d]);
      plan.view.strides.push_back(input.strides[d]);
      (reduced ? plan.reduced : plan.kept) *= input.shape[d];
    }
  }
  if (!plan.view.is_contiguous()) {
    const std::optional<int64_t> stride =
        column_stride(plan.view, static_cast<int64_t>(dims.size()));
    plan.columns = stride.has_value();
    plan.needs_copy = !plan.columns;
    plan.stride = stride.value_or(1);
  }
  if (plan.columns) {
    plan.chunk = cuda_column_chunk(plan.kept, plan.reduced);
  } else {
    plan.chunk = row_chunk(plan.kept, plan.reduced);
  }
  plan.chunks = std::max<int64_t>(1, (plan.reduced + plan.chunk - 1) / plan.chunk);
  if (plan.chunks == 1 && !plan.columns) plan.chunk = std::max<int64_t>(plan.reduced, 1);
  return plan;
}

// The kernel a plan launches: the row or the column reduction of the node's dtypes.
std::string plain_reduction_kernel(const Node& node, const PlainReduction& plan) {
  return plan.columns
             ? cuda_column_reduction_kernel_name(node.op, plan.view.dtype, node.dtype, plan.acc)
             : cuda_reduction_kernel_name(node.op, plan.view.dtype, node.dtype, plan.acc);
}

// The plan's words (plain_reduction_arg_layout or column_reduction_arg_layout), with a buffer
// of partials in `partial` when there are several chunks, and `counters` the address of its
// counters() zeros.
KernelArgs plain_reduction_args(const Node& node, const PlainReduction& plan, uint64_t out,
                                uint64_t counters, std::optional<BufferView>& partial) {
  if (plan.chunks > 1) partial = allocate_buffer(node.device, plan.acc, {plan.kept, plan.chunks});
  ReductionWords words;
  words.out = out;
  words.rows = plan.kept;
  words.columns = plan.reduced;
  words.chunk = plan.chunk;
  words.chunks = plan.chunks;
  words.divisor = static_cast<double>(plan.reduced);
  words.partial = partial ? address(*partial) : 0;
  words.counters = plan.chunks > 1 ? counters : 0;
  if (plan.columns) return pack_column_reduction_args(address(plan.view), plan.stride, words);
  KernelArgs args = {address(plan.view)};
  append_reduction_args(words, args);
  return args;
}

BufferView run_reduction(const Node& node, const BufferView& input, DType acc) {
  const int device = node.device.index();
  cuda::activate(device);
  PlainReduction plan = plan_plain_reduction(node, input, acc);
  if (plan.needs_copy) {
    plan.view = cuda_contiguous(plan.view);
    plan.needs_copy = false;
  }
  BufferView out = allocate_buffer(node.device, node.dtype, node.shape);
  if (plan.kept == 0) return out;
  const std::string name = plain_reduction_kernel(node, plan);
  cuda::CUfunction function = cuda::get_kernel(device, name, [&] {
    return plan.columns
               ? generate_cuda_column_reduction(node.op, plan.view.dtype, node.dtype, plan.acc)
               : generate_cuda_reduction(node.op, plan.view.dtype, node.dtype, plan.acc);
  });
  std::optional<BufferView> partial;
  const uint64_t counters =
      plan.counters() > 0 ? reduction_counters(node.device, plan.counters()) : 0;
  KernelArgs args = plain_reduction_args(node, plan, address(out), counters, partial);
  launch(device, function, plan.blocks(), kCudaReduceThreads, args, name);
  return out;
}

// What a Group step keeps between runs: each member's plan, and the launches made of them,
// valid while every member's plan fits its operands.
struct GroupMemo : StepCache {
  struct Member {
    LaunchMemo elementwise;  // an elementwise member's plan (its function stays null)
    // A reduction member's operand layout and how the plan reads it.
    Shape shape;
    Strides strides;
    bool columns = false, needs_copy = false, valid = false;
  };
  std::vector<Member> members;
  struct Launch {
    std::vector<size_t> members;  // member indices, in order
    void* function = nullptr;     // the CUfunction: a group kernel, or a member's own kernel
    std::string name;
  };
  std::vector<Launch> launches;
  bool valid = false;
};

// The parameter space every GPU since Volta takes in one launch (4 KiB; newer drivers take more,
// which a launch need not rely on), in 8-byte words.
constexpr int kMaxParameterWords = 4096 / 8;

// A Group step (Note [Horizontal fusion]): its members' kernels as few launches, each a group
// kernel whose blocks are split among its members (or a member's own kernel where it is alone
// in a launch), cut where the arguments would outgrow the parameter space. A reduction whose
// operand must first be copied dense runs on its own, before the rest.
void run_group(const Graph& graph, const Step& step, ValueBuffers& values, GroupMemo* memo) {
  const int device = step.device.index();
  cuda::activate(device);
  const size_t count = step.members.size();
  const bool fast_math = env_config().fast_math;
  std::vector<absl::InlinedVector<uint64_t, 4>> outputs(count);
  std::vector<std::optional<PlainReduction>> reductions(count);
  bool outputs_aligned = true;
  for (size_t m = 0; m < count; ++m) {
    const Step& member = step.members[m];
    outputs[m] = allocate_outputs(graph, member, values);
    if (member.kind == StepKind::Elementwise) {
      for (size_t k = 0; k < member.outputs.size(); ++k)
        outputs_aligned &=
            outputs[m][k] % (kVectorAlignment * dtype_size(graph.nodes[member.outputs[k]].dtype)) ==
            0;
    } else if (member.nodes.size() == 1) {
      const Node& node = graph.nodes[member.nodes[0]];
      reductions[m] = plan_plain_reduction(node, *values[node.inputs[0]],
                                           step_accumulator(graph, member, node));
    }
  }
  // A memo is kept only for aligned outputs, which any plan suits (as run_elementwise keeps it).
  GroupMemo scratch;
  GroupMemo& kept = outputs_aligned && memo != nullptr ? *memo : scratch;
  kept.members.resize(count);
  bool replanned = !kept.valid;
  for (size_t m = 0; m < count; ++m) {
    const Step& member = step.members[m];
    GroupMemo::Member& plan = kept.members[m];
    if (reductions[m]) {
      const BufferView& in = *values[graph.nodes[member.nodes[0]].inputs[0]];
      if (plan.valid && plan.shape == in.shape && plan.strides == in.strides &&
          plan.columns == reductions[m]->columns && plan.needs_copy == reductions[m]->needs_copy)
        continue;
      plan.shape = in.shape;
      plan.strides = in.strides;
      plan.columns = reductions[m]->columns;
      plan.needs_copy = reductions[m]->needs_copy;
      plan.valid = true;
      replanned = true;
      continue;
    }
    if (memo_fits(plan.elementwise, member, values, fast_math)) continue;
    const Operands operands = operands_of(member, values);
    std::vector<int64_t> output_sizes;
    for (ValueId v : member.outputs) output_sizes.push_back(dtype_size(graph.nodes[v].dtype));
    // A reduction with fused work reads its space element by element: never the vector variant.
    const bool fused = is_reduction_kind(member.kind);
    CudaElementwiseLaunch launch_plan =
        fused ? plan_cuda_elementwise(member, operands.layouts, {}, {})
              : plan_cuda_elementwise(member, operands.layouts, outputs[m], output_sizes);
    if (fused) launch_plan.spec.vectorized = false;
    const std::string key = cuda_kernel_cache_key(member, launch_plan.spec, fast_math);
    remember_launch(plan.elementwise, operands.layouts, std::move(launch_plan), nullptr, key,
                    fast_math);
    replanned = true;
  }
  // Each reduction with fused work: its rows (or tiles of kept columns, over leading dims), and
  // the chunks of each (from the sizes alone).
  std::vector<std::optional<ReductionWords>> fused(count);
  std::vector<bool> over_columns(count, false);
  for (size_t m = 0; m < count; ++m) {
    const Step& member = step.members[m];
    if (!is_reduction_kind(member.kind) || reductions[m]) continue;
    const int64_t rows = numel(graph.nodes[member.first_with_role(Role::Reduction)].shape);
    const int64_t columns = rows == 0 ? 0 : kept.members[m].elementwise.plan.numel / rows;
    if (member.kind == StepKind::Column) {
      over_columns[m] = true;
      fused[m] = fused_column_words(rows, columns);
      continue;
    }
    const int64_t chunk = row_chunk(rows, columns);
    ReductionWords& words = fused[m].emplace();
    words.rows = rows;
    words.columns = columns;
    words.chunks = std::max<int64_t>(1, (columns + chunk - 1) / chunk);
    words.chunk = words.chunks == 1 ? std::max<int64_t>(columns, 1) : chunk;
    words.divisor = static_cast<double>(columns);
  }
  auto member_blocks = [&](size_t m) -> int64_t {
    if (reductions[m]) return reductions[m]->kept == 0 ? 0 : reductions[m]->blocks();
    if (fused[m])
      return (over_columns[m] ? column_tiles(*fused[m]) : fused[m]->rows) * fused[m]->chunks;
    return kept.members[m].elementwise.plan.numel == 0
               ? 0
               : elementwise_blocks(kept.members[m].elementwise.plan, device);
  };
  if (replanned) {
    kept.launches.clear();
    int words = 0;
    for (size_t m = 0; m < count; ++m) {
      if (member_blocks(m) == 0 || (reductions[m] && reductions[m]->needs_copy)) continue;
      const Step& member = step.members[m];
      int member_words = 0;
      if (reductions[m]) {
        member_words =
            (reductions[m]->columns ? column_reduction_arg_layout() : plain_reduction_arg_layout())
                .words();
      } else if (fused[m]) {
        ArgLayout layout;
        add_space_fields(layout, kept.members[m].elementwise.plan.spec,
                         static_cast<int>(member.inputs.size()));
        if (over_columns[m])
          add_column_step_fields(layout, static_cast<int>(member.outputs.size()));
        else
          add_reduction_fields(layout);
        member_words = layout.words();
      } else {
        member_words = elementwise_arg_layout(kept.members[m].elementwise.plan.spec,
                                              static_cast<int>(member.inputs.size()),
                                              static_cast<int>(member.outputs.size()))
                           .words();
      }
      // Each launch's words: its members', and one start per member and one more.
      if (kept.launches.empty() ||
          words + member_words + static_cast<int>(kept.launches.back().members.size()) + 2 >
              kMaxParameterWords) {
        kept.launches.emplace_back();
        words = 0;
      }
      kept.launches.back().members.push_back(m);
      words += member_words;
    }
    for (GroupMemo::Launch& call : kept.launches) {
      std::vector<CudaGroupMember> members;
      for (size_t m : call.members) {
        CudaGroupMember member{&step.members[m], kept.members[m].elementwise.plan.spec, false};
        if (reductions[m]) member.columns = reductions[m]->columns;
        members.push_back(member);
      }
      if (members.size() == 1) {
        const CudaGroupMember& only = members[0];
        const Step& alone = *only.step;
        call.name = cuda_group_member_key(graph, only, fast_math);
        call.function = cuda::get_kernel(device, call.name, [&] {
          if (alone.kind == StepKind::Elementwise)
            return generate_cuda_elementwise(graph, alone, only.spec, fast_math);
          if (alone.nodes.size() > 1) return generate_cuda_step(graph, alone, only.spec, fast_math);
          const Node& node = graph.nodes[alone.nodes[0]];
          const DType in = graph.nodes[node.inputs[0]].dtype;
          const DType acc = step_accumulator(graph, alone, node);
          return only.columns ? generate_cuda_column_reduction(node.op, in, node.dtype, acc)
                              : generate_cuda_reduction(node.op, in, node.dtype, acc);
        });
        continue;
      }
      std::vector<std::string> keys;
      for (const CudaGroupMember& member : members)
        keys.push_back(cuda_group_member_key(graph, member, fast_math));
      call.name = cuda_group_kernel_name(keys);
      call.function = cuda::get_kernel(
          device, call.name, [&] { return generate_cuda_group(graph, members, fast_math); });
    }
    kept.valid = true;
  } else {
    cuda::count_memory_hit();
  }
  // Reductions that need a dense copy of their operand run on their own.
  for (size_t m = 0; m < count; ++m) {
    if (!reductions[m] || !reductions[m]->needs_copy) continue;
    const Node& node = graph.nodes[step.members[m].nodes[0]];
    values[step.members[m].nodes[0]] = run_reduction(
        node, *values[node.inputs[0]], step_accumulator(graph, step.members[m], node));
  }
  // One buffer of counters for the device: each reduction of several chunks takes its own part.
  int64_t counters_needed = 0;
  for (size_t m = 0; m < count; ++m) {
    if (reductions[m] && !reductions[m]->needs_copy) counters_needed += reductions[m]->counters();
    if (fused[m] && fused[m]->chunks > 1)
      counters_needed += over_columns[m] ? column_tiles(*fused[m]) : fused[m]->rows;
  }
  const uint64_t counters =
      counters_needed > 0 ? reduction_counters(step.device, counters_needed) : 0;
  int64_t counters_used = 0;
  std::vector<std::optional<BufferView>> partials(count);
  // Every launch's arguments (and buffers) first, then the launches: once a member's kernel is
  // queued nothing here can fail (Note [Writing an update into its own buffer] in
  // runtime/lazy.cc).
  std::vector<KernelArgs> call_args;
  std::vector<int64_t> call_blocks;
  call_args.reserve(kept.launches.size());
  for (const GroupMemo::Launch& call : kept.launches) {
    KernelArgs& args = call_args.emplace_back();
    absl::InlinedVector<int64_t, 16> starts = {0};
    for (size_t m : call.members) {
      const Step& member = step.members[m];
      KernelArgs words;
      if (reductions[m]) {
        const Node& node = graph.nodes[member.nodes[0]];
        words =
            plain_reduction_args(node, *reductions[m], outputs[m][0],
                                 counters + static_cast<uint64_t>(counters_used) * 4, partials[m]);
        counters_used += reductions[m]->counters();
      } else if (fused[m]) {
        const Node& node = graph.nodes[member.first_with_role(Role::Reduction)];
        ReductionWords reduction = *fused[m];
        if (reduction.chunks > 1) {
          partials[m] = allocate_buffer(node.device, step_accumulator(graph, member, node),
                                        {reduction.rows, reduction.chunks});
          reduction.partial = address(*partials[m]);
          reduction.counters = counters + static_cast<uint64_t>(counters_used) * 4;
          counters_used += over_columns[m] ? column_tiles(reduction) : reduction.rows;
        }
        append_space_args(kept.members[m].elementwise.plan, input_addresses(member, values), words);
        if (over_columns[m]) {
          append_column_step_args(outputs[m], reduction, words);
        } else {
          reduction.out = outputs[m][0];
          append_reduction_args(reduction, words);
        }
      } else {
        words = pack_elementwise_args(kept.members[m].elementwise.plan,
                                      input_addresses(member, values), outputs[m]);
      }
      args.insert(args.end(), words.begin(), words.end());
      starts.push_back(starts.back() + member_blocks(m));
    }
    if (call.members.size() > 1)
      for (int64_t start : starts) args.push_back(static_cast<uint64_t>(start));
    call_blocks.push_back(starts.back());
  }
  for (size_t c = 0; c < kept.launches.size(); ++c)
    launch(device, static_cast<cuda::CUfunction>(kept.launches[c].function), call_blocks[c],
           kThreadsPerBlock, call_args[c], kept.launches[c].name);
}

// A [batch..., rows, cols] view as cuBLAS can read it in place, when its layout allows: each
// matrix row-major or stored transposed (one inner stride 1, the other at least the inner
// size; a size-1 dim's stride does not matter), and the batch one stride apart or broadcast.
std::optional<cuda::GemmOperand> gemm_operand(const BufferView& view) {
  const Shape& shape = view.shape;
  const Strides& strides = view.strides;
  const size_t rank = shape.size();
  const std::optional<MatrixLayout> layout =
      matrix_layout(shape[rank - 2], shape[rank - 1], strides[rank - 2], strides[rank - 1]);
  if (!layout || layout->ld > std::numeric_limits<int>::max()) return std::nullopt;
  cuda::GemmOperand operand;
  operand.data = view.data();
  operand.transposed = layout->transposed;
  operand.ld = layout->ld;
  bool first = true;
  int64_t expected = 0;
  for (size_t d = rank - 2; d-- > 0;) {  // the innermost batch dim first
    if (shape[d] == 1) continue;
    if (first) {
      operand.batch_stride = strides[d];
      first = false;
    } else if (strides[d] != expected) {
      return std::nullopt;
    }
    expected = strides[d] * shape[d];
  }
  return operand;
}

BufferView run_matmul(const Node& node, const BufferView& a, const BufferView& b) {
  const int device = node.device.index();
  const MatmulShapes shapes = matmul_shapes(a, b);
  // Floating operands are read where they lie (transposed views included) and multiplied in
  // their own dtype; integers in float64, exact below 2^53, as on the CPU.
  const DType work = is_integral(node.dtype) ? DType::Float64 : node.dtype;
  // An operand cuBLAS cannot read in place is staged dense in the work dtype; the copy lives
  // until the gemm is enqueued behind it on the device's one stream.
  auto operand = [&](const BufferView& x, const Shape& full, const Strides& strides,
                     std::optional<BufferView>& staged) {
    BufferView view = x;
    view.shape = full;
    view.strides = strides;
    if (x.dtype == work)
      if (std::optional<cuda::GemmOperand> in_place = gemm_operand(view)) return *in_place;
    staged = cuda_convert(view, work);
    std::optional<cuda::GemmOperand> dense = gemm_operand(*staged);
    if (!dense)
      throw UnsupportedError(absl::StrCat("matmul: a row of ", full.back(),
                                          " elements is more than cuBLAS can address"));
    return *dense;
  };
  std::optional<BufferView> a_staged, b_staged;
  const cuda::GemmOperand a_operand = operand(a, shapes.a_full, shapes.a_strides, a_staged);
  const cuda::GemmOperand b_operand = operand(b, shapes.b_full, shapes.b_strides, b_staged);
  BufferView c = allocate_buffer(node.device, work, node.shape);
  count_gpu_launch();
  {
    ScopedHostPhase phase(HostPhase::Library);
    cuda::gemm_strided_batched(device, work, a_operand, b_operand, c.data(), shapes.n, shapes.k,
                               shapes.m, shapes.batches);
  }
  return work == node.dtype ? c : cuda_convert(c, node.dtype);
}

// The device's error slot for index kernels (Note [Index errors on the GPU] in
// codegen/cuda/cuda_index.cc): one word, all ones when clear. A device's kernels run in order on its
// one stream and a set slot is cleared before the error is raised, so one slot serves every
// launch there.
constexpr uint64_t kNoIndexError = ~uint64_t{0};
uint64_t index_error_slot(const Device& device) {
  static std::mutex mutex;
  // Never destroyed: the buffers go with the process, after the allocator they came from.
  static auto& slots = *new std::vector<std::optional<BufferView>>();
  std::lock_guard lock(mutex);
  const size_t index = static_cast<size_t>(device.index());
  if (slots.size() <= index) slots.resize(index + 1);
  std::optional<BufferView>& slot = slots[index];
  if (!slot) {
    cuda::check_replayable("the index error slot is made", false);
    BufferView fresh = allocate_buffer(device, DType::Int64, {1});
    cuda::check(cuda::driver()->cuMemcpyHtoD(address(fresh), &kNoIndexError, 8), "cuMemcpyHtoD");
    slot = std::move(fresh);
  }
  return address(*slot);
}

// Sizes and strides as the index kernels take them: a 0-d operand as [1].
Shape nonempty_shape(const Shape& shape) { return shape.empty() ? Shape{1} : shape; }
Strides nonempty_strides(const BufferView& view) {
  return view.shape.empty() ? Strides{1} : view.strides;
}

// Blocks for `n` threads' work; the index kernels loop over what the grid does not cover.
int64_t index_blocks(int64_t n) {
  return std::min<int64_t>((n + kCudaIndexThreads - 1) / kCudaIndexThreads, int64_t{1} << 16);
}

// After an index kernel: when it found a bad index, reads that index from `index` (on the
// device) at the row-major position the slot holds, clears the slot and raises the IndexError
// the CPU raises. Reading the slot waits for the kernel.
void check_index_error(const Node& node, uint64_t slot, const BufferView& index, int64_t dim,
                       int64_t bound) {
  cuda::check_replayable("an index op reads its error slot on the host", true);
  const cuda::DriverApi* api = cuda::driver();
  uint64_t position = kNoIndexError;
  cuda::check(api->cuMemcpyDtoH(&position, slot, 8),
              absl::StrCat(op_name(node.op), " kernel").c_str());
  if (position == kNoIndexError) return;
  cuda::check(api->cuMemcpyHtoD(slot, &kNoIndexError, 8), "cuMemcpyHtoD");
  const Shape shape = nonempty_shape(index.shape);
  const Strides strides = nonempty_strides(index);
  int64_t offset = 0, rest = static_cast<int64_t>(position);
  for (size_t d = shape.size(); d-- > 0;) {
    offset += rest % shape[d] * strides[d];
    rest /= shape[d];
  }
  int64_t value = 0;
  cuda::check(api->cuMemcpyDtoH(&value, address(index) + offset * 8, 8), "cuMemcpyDtoH");
  throw index_error(node, value, dim, bound);
}

BufferView run_gather(const Node& node, const BufferView& x, const BufferView& index) {
  const int device = node.device.index();
  cuda::activate(device);
  BufferView out = allocate_buffer(node.device, node.dtype, node.shape);
  GatherWords words;
  words.n = numel(index.shape);
  if (words.n == 0) return out;
  words.dim = normalize_dim(node.attrs.get_int("dim"), x.shape.size(), "gather");
  words.bound = nonempty_shape(x.shape)[words.dim];
  words.x = address(x);
  words.index = address(index);
  words.out = address(out);
  words.error = index_error_slot(node.device);
  words.sizes = nonempty_shape(index.shape);
  words.x_strides = nonempty_strides(x);
  words.index_strides = nonempty_strides(index);
  const int rank = static_cast<int>(words.sizes.size());
  const int bytes = static_cast<int>(dtype_size(node.dtype));
  const std::string name = cuda_gather_kernel_name(bytes, rank);
  cuda::CUfunction function =
      cuda::get_kernel(device, name, [&] { return generate_cuda_gather(bytes, rank); });
  KernelArgs args = pack_gather_args(words);
  launch(device, function, index_blocks(words.n), kCudaIndexThreads, args, name);
  check_index_error(node, words.error, index, words.dim, words.bound);
  return out;
}

// Self copied, then src's lines added in index order (Note [scatter_add on the GPU]).
BufferView run_scatter_add(const Node& node, const BufferView& self, const BufferView& index,
                           const BufferView& src) {
  const int device = node.device.index();
  cuda::activate(device);
  BufferView out = cuda_convert(self, node.dtype);  // always a fresh dense buffer
  const int64_t n = numel(index.shape);
  if (n == 0) return out;
  ScatterAddWords words;
  words.dim = normalize_dim(node.attrs.get_int("dim"), self.shape.size(), "scatter_add");
  words.sizes = nonempty_shape(index.shape);
  words.length = words.sizes[words.dim];
  words.lines = n / words.length;
  const Shape self_shape = nonempty_shape(self.shape);
  words.bound = self_shape[words.dim];
  words.index = address(index);
  words.src = address(src);
  words.out = address(out);
  words.error = index_error_slot(node.device);
  words.index_strides = nonempty_strides(index);
  words.src_strides = nonempty_strides(src);
  words.out_strides = contiguous_strides(self_shape);
  const int rank = static_cast<int>(words.sizes.size());
  const std::string name = cuda_scatter_add_kernel_name(node.dtype, rank);
  cuda::CUfunction function =
      cuda::get_kernel(device, name, [&] { return generate_cuda_scatter_add(node.dtype, rank); });
  KernelArgs args = pack_scatter_add_args(words);
  launch(device, function, index_blocks(words.lines), kCudaIndexThreads, args, name);
  check_index_error(node, words.error, index, words.dim, words.bound);
  return out;
}

// Each operand copied, converted, into its place along dim.
BufferView run_cat(const Node& node, std::span<const BufferView* const> inputs) {
  const int device = node.device.index();
  cuda::activate(device);
  BufferView out = allocate_buffer(node.device, node.dtype, node.shape);
  const int64_t dim =
      normalize_dim(node.attrs.get_int("dim"), static_cast<int64_t>(node.shape.size()), "cat");
  const Strides out_strides = contiguous_strides(node.shape);
  int64_t at = 0;
  for (const BufferView* in : inputs) {
    const int64_t start = at;
    at += in->shape[dim];
    StridedCopyWords words;
    words.n = numel(in->shape);
    if (words.n == 0) continue;
    // Dims that both walk in order are one: most pieces copy runs of rank 1 or 2.
    IterationSpace space = merge_dims(in->shape, {in->strides, out_strides});
    words.sizes = space.sizes;
    words.in_strides = space.strides[0];
    words.out_strides = space.strides[1];
    words.in = address(*in);
    words.out =
        address(out) + static_cast<uint64_t>(start * out_strides[dim] * dtype_size(node.dtype));
    const int rank = static_cast<int>(words.sizes.size());
    const std::string name = cuda_strided_copy_kernel_name(in->dtype, node.dtype, rank);
    cuda::CUfunction function = cuda::get_kernel(
        device, name, [&] { return generate_cuda_strided_copy(in->dtype, node.dtype, rank); });
    KernelArgs args = pack_strided_copy_args(words);
    launch(device, function, index_blocks(words.n), kCudaIndexThreads, args, name);
  }
  return out;
}

BufferView run_index(const Node& node, const ValueBuffers& values) {
  absl::InlinedVector<const BufferView*, 4> inputs;
  for (ValueId v : node.inputs) inputs.push_back(&*values[v]);
  switch (node.op) {
    case Op::Gather:
      return run_gather(node, *inputs[0], *inputs[1]);
    case Op::ScatterAdd:
      return run_scatter_add(node, *inputs[0], *inputs[1], *inputs[2]);
    case Op::Cat:
      return run_cat(node, inputs);
    default:
      break;
  }
  throw VerifierError(absl::StrCat(op_name(node.op), " is not an index op"));
}

// A product of few rows by lazyfuse's own kernel (Note [Products of few rows] in
// codegen/cuda/cuda_matmul.cc), with its step's bias and relu where it has them: sets the step's
// output and returns true; false where the kernel does not take the operands (the library
// computes it then).
bool run_skinny_matmul(const Graph& graph, ValueId matmul_id, const MatmulEpilogue* epilogue,
                       ValueBuffers& values) {
  if (!cuda::skinny_matmul_enabled()) return false;
  const Node& matmul = graph.nodes[matmul_id];
  const BufferView& a = *values[matmul.inputs[0]];
  const BufferView& b = *values[matmul.inputs[1]];
  if (a.dtype != matmul.dtype || b.dtype != matmul.dtype || a.shape.size() != 2 ||
      b.shape.size() != 2)
    return false;
  const int64_t rows = a.shape[0], inner = a.shape[1], cols = b.shape[1];
  SkinnyEpilogue kind = SkinnyEpilogue::None;
  const BufferView* bias = nullptr;
  if (epilogue != nullptr) {
    bias = &*values[epilogue->bias];
    if (bias->dtype != matmul.dtype || numel(bias->shape) != cols || bias->strides.back() != 1)
      return false;
    kind = epilogue->relu ? SkinnyEpilogue::BiasRelu : SkinnyEpilogue::Bias;
  }
  const std::optional<SkinnyMatmulPlan> plan =
      plan_skinny_matmul(matmul.dtype, rows, inner, cols, kind);
  if (!plan) return false;
  // Rows of a and b's columns (b read transposed, an nn::Linear's weight) in 16-byte loads.
  const int64_t vector = plan->vector;
  if (a.strides[1] != 1 || a.strides[0] % vector != 0 || address(a) % 16 != 0 ||
      b.strides[0] != 1 || b.strides[1] % vector != 0 || address(b) % 16 != 0)
    return false;
  const int device = matmul.device.index();
  cuda::activate(device);
  BufferView c = allocate_buffer(matmul.device, matmul.dtype, matmul.shape);
  SkinnyMatmulWords words;
  words.a = address(a);
  words.b = address(b);
  words.bias = bias != nullptr ? address(*bias) : 0;
  words.c = address(c);
  words.lda = a.strides[0];
  words.ldb = b.strides[1];
  words.inner = inner;
  words.cols = cols;
  const std::string name = cuda_skinny_matmul_kernel_name(*plan);
  cuda::CUfunction function =
      cuda::get_kernel(device, name, [&] { return generate_cuda_skinny_matmul(*plan); });
  KernelArgs args = pack_skinny_matmul_args(words);
  launch(device, function, plan->blocks(cols), static_cast<unsigned>(32 * plan->warps), args, name);
  cuda::count_skinny_matmul();
  values[epilogue != nullptr ? epilogue->elementwise.outputs.at(0) : matmul_id] = std::move(c);
  return true;
}

// A matmul with its bias (and relu) as one cuBLASLt call with an epilogue, where cuBLASLt takes
// the operands' dtype and layout: sets the step's output and returns true; false otherwise.
bool run_matmul_with_epilogue(const Graph& graph, const MatmulEpilogue& epilogue,
                              ValueBuffers& values) {
  const Node& matmul = graph.nodes[epilogue.matmul];
  const BufferView& a = *values[matmul.inputs[0]];
  const BufferView& b = *values[matmul.inputs[1]];
  const BufferView& bias = *values[epilogue.bias];
  if (a.dtype != matmul.dtype || b.dtype != matmul.dtype || bias.dtype != matmul.dtype ||
      a.shape.size() != 2 || b.shape.size() != 2 || bias.strides.back() != 1)
    return false;
  const std::optional<cuda::GemmOperand> a_operand = gemm_operand(a);
  const std::optional<cuda::GemmOperand> b_operand = gemm_operand(b);
  if (!a_operand || !b_operand) return false;
  const ValueId result = epilogue.elementwise.outputs.at(0);
  BufferView d = allocate_buffer(matmul.device, matmul.dtype, matmul.shape);
  ScopedHostPhase phase(HostPhase::Library);
  if (!cuda::gemm_bias_epilogue(matmul.device.index(), matmul.dtype, *a_operand, *b_operand,
                                bias.data(), epilogue.relu, d.data(), a.shape[0], a.shape[1],
                                b.shape[1]))
    return false;
  count_gpu_launch();
  values[result] = std::move(d);
  return true;
}

void run_cuda_step(const Graph& graph, const Step& step, ValueBuffers& values, StepCache* cache) {
  const Node& node = graph.nodes[step.nodes.back()];
  LaunchMemo* memo = step.kind == StepKind::Group ? nullptr : static_cast<LaunchMemo*>(cache);
  switch (step.kind) {
    case StepKind::Group:
      run_group(graph, step, values, static_cast<GroupMemo*>(cache));
      return;
    case StepKind::Elementwise:
      run_elementwise(graph, step, values, memo);
      return;
    case StepKind::Row: {
      const Node& reduction = graph.nodes[reduction_parts(step).reduction];
      run_row_kernel(graph, step, reduction, values, memo);
      return;
    }
    case StepKind::Reduction:
    case StepKind::Column: {
      const ReductionParts parts = reduction_parts(step);
      const Node& reduction = graph.nodes[parts.reduction];
      if (step.kind == StepKind::Column && !parts.prologue.empty()) {
        run_fused_column_reduction(graph, step, reduction, values, memo);
      } else {
        values[parts.reduction] =
            parts.prologue.empty() && !cuda_reduces_stored_half_in_vectors(graph, step)
                ? run_reduction(reduction, *values[reduction.inputs[0]],
                                step_accumulator(graph, step, reduction))
                : run_fused_reduction(graph, step, reduction, values, memo);
      }
      return;
    }
    case StepKind::Matmul: {
      const ValueId product = step.first_with_role(Role::Product);
      const Node& matmul = graph.nodes[product];
      const std::optional<MatmulEpilogue> epilogue = matmul_epilogue(graph, step);
      if (run_skinny_matmul(graph, product, epilogue ? &*epilogue : nullptr, values)) return;
      if (epilogue && run_matmul_with_epilogue(graph, *epilogue, values)) return;
      values[product] = run_matmul(matmul, *values[matmul.inputs[0]], *values[matmul.inputs[1]]);
      // An epilogue cuBLASLt does not take: one elementwise kernel over the product.
      if (epilogue) {
        run_elementwise(graph, epilogue->elementwise, values, memo);
        values[epilogue->matmul].reset();
      }
      return;
    }
    case StepKind::Index:
      values[step.nodes[0]] = run_index(node, values);
      return;
    case StepKind::View:
    case StepKind::Transfer:
    case StepKind::Collective:
      break;
  }
  throw VerifierError(
      "views, transfers and collectives are the executor's, not the CUDA backend's");
}

cuda::CUdeviceptr device_pointer(const void* data) {
  return reinterpret_cast<cuda::CUdeviceptr>(data);
}

class CudaBackend final : public Backend {
 public:
  void run_step(const Graph& graph, const Step& step, ValueBuffers& values,
                std::unique_ptr<StepCache>* cache) override {
    if (cache != nullptr && *cache == nullptr) {
      if (step.kind == StepKind::Group)
        *cache = std::make_unique<GroupMemo>();
      else
        *cache = std::make_unique<LaunchMemo>();
    }
    run_cuda_step(graph, step, values, cache != nullptr ? cache->get() : nullptr);
  }

  void* allocate(const Device& device, int64_t nbytes) override {
    return cuda::allocate(device.index(), nbytes);
  }
  void release(const Device& device, void* data, int64_t nbytes) override {
    cuda::release(device.index(), data, nbytes);
  }

  BufferView contiguous(const BufferView& source) override { return cuda_contiguous(source); }

  // Host to GPU, GPU to host, and between GPUs.
  bool can_copy(const Device& from, const Device& to) const override {
    return (from.is_cuda() || from.is_cpu()) && (to.is_cuda() || to.is_cpu()) &&
           (from.is_cuda() || to.is_cuda());
  }
  void copy(const void* source, const Device& from, void* target, const Device& to,
            size_t bytes) override {
    cuda::check_replayable("a copy between devices", true);
    ScopedHostPhase phase(HostPhase::Transfer);
    const cuda::DriverApi* api = cuda::driver();
    if (from.is_cpu()) {
      cuda::activate(to.index());
      cuda::check(api->cuMemcpyHtoD(device_pointer(target), source, bytes), "cuMemcpyHtoD");
    } else if (to.is_cpu()) {
      cuda::activate(from.index());
      cuda::check(api->cuMemcpyDtoH(target, device_pointer(source), bytes), "cuMemcpyDtoH");
    } else {
      // Between GPUs: the driver copies peer to peer where the GPUs allow it, through the host
      // otherwise.
      cuda::CUcontext source_context = cuda::activate(from.index());
      cuda::CUcontext target_context = cuda::activate(to.index());
      cuda::check(api->cuMemcpyPeer(device_pointer(target), target_context, device_pointer(source),
                                    source_context, bytes),
                  "cuMemcpyPeer");
    }
  }

  void run_replayable(const Device& device, std::unique_ptr<ReplayCache>* cache,
                      std::span<const BufferView* const> params,
                      std::span<const bool> substitutable, ReplayRun run) override {
    cuda::run_replayable(device.index(), cache, params, substitutable, run);
  }

  void synchronize(const Device& device) override {
    cuda::check_replayable("a wait for the device", true);
    cuda::activate(device.index());
    cuda::check(cuda::driver()->cuCtxSynchronize(), "cuCtxSynchronize");
  }
};

}  // namespace

Backend& cuda_backend() {
  static CudaBackend* backend = new CudaBackend();
  return *backend;
}

}  // namespace lazyfuse
