// Launching fused elementwise kernels.
#include "runtime/cuda_executor.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "codegen/cuda_codegen.h"
#include "ir/errors.h"
#include "ir/passes/passes.h"
#include "runtime/cpu_executor.h"
#include "runtime/cuda_driver.h"
#include "runtime/env.h"
#include "runtime/kernel_cache.h"

namespace lazyfuse {
namespace {

constexpr unsigned kThreadsPerBlock = 256;

uint64_t address(const BufferView& view) { return reinterpret_cast<uint64_t>(view.data()); }

void launch(int device, cuda::CUfunction function, const std::string& name, int64_t units,
            std::vector<uint64_t>& args) {
  const cuda::DeviceProperties& props = cuda::device_properties(device);
  // A grid-stride loop: enough blocks to fill every multiprocessor many times over, no more.
  int64_t blocks = std::clamp<int64_t>((units + kThreadsPerBlock - 1) / kThreadsPerBlock, 1,
                                       static_cast<int64_t>(props.multiprocessors) * 32);
  void* params[] = {args.data()};
  cuda::check(cuda::driver()->cuLaunchKernel(function, static_cast<unsigned>(blocks), 1, 1,
                                             kThreadsPerBlock, 1, 1, 0, nullptr, params, nullptr),
              "cuLaunchKernel");
  if (env_config().sync) {
    cuda::CUresult result = cuda::driver()->cuCtxSynchronize();
    cuda::check(result, absl::StrCat("kernel ", name).c_str());
  }
}

void run_elementwise(const Graph& graph, const Step& step,
                     std::vector<std::optional<BufferView>>& values) {
  const int device = step.device.index();
  cuda::activate(device);
  std::vector<OperandLayout> layouts;
  std::vector<uint64_t> inputs, outputs;
  std::vector<int64_t> output_sizes;
  for (ValueId v : step.inputs) {
    const BufferView& in = *values[v];
    layouts.push_back({address(in), dtype_size(in.dtype), in.shape, in.strides});
    inputs.push_back(address(in));
  }
  for (ValueId v : step.outputs) {
    const Node& node = graph.nodes[v];
    values[v] = allocate_buffer(node.device, node.dtype, node.shape);
    outputs.push_back(address(*values[v]));
    output_sizes.push_back(dtype_size(node.dtype));
  }
  CudaElementwiseLaunch plan = plan_cuda_elementwise(step, layouts, outputs, output_sizes);
  if (plan.numel == 0) return;
  const bool fast_math = env_config().fast_math;
  std::string key =
      absl::StrFormat("%016x.%s%s", step.kernel_key, plan.spec.code(), fast_math ? ".fast" : "");
  std::string name;
  cuda::CUfunction function = cuda::get_kernel(device, key, [&] {
    CudaSource source = generate_cuda_elementwise(graph, step, plan.spec, fast_math);
    name = source.kernel_name;
    return source;
  });
  std::vector<uint64_t> args = pack_elementwise_args(plan, inputs, outputs);
  launch(device, function, name.empty() ? key : name,
         plan.spec.vectorized ? (plan.numel + 3) / 4 : plan.numel, args);
}

}  // namespace

BufferView cuda_contiguous(const BufferView& source) {
  if (source.is_contiguous()) return source;
  Graph graph;
  Node param;
  param.op = Op::Param;
  param.dtype = source.dtype;
  param.shape = source.shape;
  param.device = source.storage->device();
  graph.add(param);
  Node copy = param;
  copy.op = Op::Copy;
  copy.inputs = {0};
  graph.outputs = {graph.add(copy)};
  Schedule schedule = run_fusion(std::move(graph), {});
  std::vector<std::optional<BufferView>> values = {source, std::nullopt};
  run_elementwise(schedule.graph, schedule.steps.at(0), values);
  return *values[1];
}

void run_cuda_step(const Graph& graph, const Step& step,
                   std::vector<std::optional<BufferView>>& values) {
  const Node& node = graph.nodes[step.nodes.back()];
  switch (step.kind) {
    case StepKind::Elementwise:
      run_elementwise(graph, step, values);
      return;
    case StepKind::View:
      values[step.nodes[0]] = cpu_view(node, *values[node.inputs[0]]);
      return;
    default:
      throw UnsupportedError(
          absl::StrCat(op_name(node.op), " at ", node.where.str(), " on ", node.device.str(),
                       ": this op does not run on CUDA devices yet; move its operand "
                       "to the CPU with .cpu()"));
  }
}

}  // namespace lazyfuse
