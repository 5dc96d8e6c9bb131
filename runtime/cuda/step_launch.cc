// What every CUDA step runner shares: the launch of a generated kernel, its operands and outputs,
// and the memo of its plan.
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

}  // namespace lazyfuse::cuda_steps
