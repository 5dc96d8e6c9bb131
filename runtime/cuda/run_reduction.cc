// Reduction, row and column steps on a GPU: the generated kernels of reductions with what is fused
// around them, and the library-like kernels of a stored operand.
#include "lazyfuse/runtime/cuda/cuda_steps.h"

#include <algorithm>
#include <bit>
#include <limits>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/ir/infer.h"
#include "lazyfuse/ir/passes/passes.h"
#include "lazyfuse/runtime/cuda/cublas.h"
#include "lazyfuse/runtime/cuda/cuda_graphs.h"
#include "lazyfuse/runtime/cuda/cuda_memory.h"
#include "lazyfuse/runtime/host_profile.h"

namespace lazyfuse::cuda_steps {

namespace {

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
        choose_cuda_fused_reduction_layout(plan, over_columns,
                                           cuda_reduction_order_shows(graph, step), columns,
                                           row_chunk(rows, columns));
        return plan;
      },
      [&](const CudaElementwiseSpec& spec, bool fast_math) {
        return generate_cuda_fused_reduction(graph, step, spec, fast_math);
      });
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

// The kernel a plan launches: the row or the column reduction of the node's dtypes.
std::string plain_reduction_kernel(const Node& node, const PlainReduction& plan) {
  return plan.columns
             ? cuda_column_reduction_kernel_name(node.op, plan.view.dtype, node.dtype, plan.acc)
             : cuda_reduction_kernel_name(node.op, plan.view.dtype, node.dtype, plan.acc);
}

}  // namespace

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
  // A column step's row kernel (is_column_row_step) takes a column as a row kernel a row.
  const bool over_columns = step.kind == StepKind::Column;
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
        if (over_columns)
          choose_cuda_column_layout(plan);
        else
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
         over_columns ? cuda_column_step_blocks(rows) : cuda_row_blocks(kernel.plan.spec, rows),
         cuda_row_threads(kernel.plan.spec), args, kernel.name);
}

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

}  // namespace lazyfuse::cuda_steps
