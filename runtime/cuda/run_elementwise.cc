// Elementwise steps on a GPU: one generated kernel each, and the copies and casts built on it.
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

}  // namespace lazyfuse::cuda_steps
