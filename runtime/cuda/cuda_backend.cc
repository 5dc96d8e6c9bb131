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
#include "lazyfuse/runtime/cuda/cublas.h"
#include "lazyfuse/runtime/cuda/cuda_driver.h"
#include "lazyfuse/runtime/cuda/cuda_graphs.h"
#include "lazyfuse/runtime/cuda/cuda_memory.h"
#include "lazyfuse/runtime/cuda/cuda_steps.h"
#include "lazyfuse/runtime/devices.h"
#include "lazyfuse/runtime/env.h"
#include "lazyfuse/runtime/host_profile.h"
#include "lazyfuse/runtime/kernel_cache.h"
#include "lazyfuse/runtime/stats.h"

namespace lazyfuse {
namespace {

using cuda_steps::cuda_contiguous;
using cuda_steps::GroupMemo;
using cuda_steps::LaunchMemo;
using cuda_steps::run_elementwise;
using cuda_steps::run_fused_column_reduction;
using cuda_steps::run_fused_reduction;
using cuda_steps::run_group;
using cuda_steps::run_index;
using cuda_steps::run_matmul;
using cuda_steps::run_matmul_with_epilogue;
using cuda_steps::run_reduction;
using cuda_steps::run_row_kernel;
using cuda_steps::run_skinny_matmul;

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
      if (is_column_row_step(step)) {
        run_row_kernel(graph, step, graph.nodes[parts.reduction], values, memo);
        return;
      }
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
      // cuBLASLt's bias epilogue adds the bias to the product before rounding it: where half
      // values round after each op, the product is rounded first, as the unfused add finds it,
      // by the elementwise kernel below (the fuzz found the two half an ulp apart).
      const bool rounds_product = step.round_each_op && is_half(matmul.dtype);
      if (epilogue && !rounds_product && run_matmul_with_epilogue(graph, *epilogue, values)) return;
      // The product alone, by the kernel the unfused product takes.
      if (!epilogue || !run_skinny_matmul(graph, product, nullptr, values))
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
    case StepKind::Attention:
      cuda_steps::run_attention(graph, step, values);
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
  bool runs_attention(DType dtype, int64_t head_dim, int64_t value_dim) const override {
    return cuda_steps::cuda_runs_attention(dtype, head_dim, value_dim);
  }
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

  Device resolve(const Device& requested) override { return cuda::resolve(requested); }
  int device_count() override { return cuda::device_count(); }
  AllocatorStats memory_stats(int index) override { return cuda::allocator_stats(index); }
  void reset_peak_memory_stats(int index) override { cuda::reset_peak_memory_stats(index); }
  void add_counters(Stats& stats) override {
    const cuda::KernelCacheStats kernels = cuda::kernel_cache_stats();
    stats.kernels_compiled = kernels.compiles;
    stats.kernels_loaded_from_disk = kernels.disk_hits;
    stats.kernels_found_in_memory = kernels.memory_hits;
    stats.compile_ms = kernels.compile_ms;
    const cuda::GraphStats graphs = cuda::graph_stats();
    stats.graph_captures = graphs.captures;
    stats.graph_replays = graphs.replays;
  }
  void reset_counters() override {
    cuda::reset_kernel_cache_stats();
    cuda::reset_graph_stats();
  }
  int dlpack_device_type() const override { return 2; }  // kDLCUDA
};

}  // namespace

Backend& cuda_backend() {
  static CudaBackend* backend = new CudaBackend();
  return *backend;
}

}  // namespace lazyfuse
