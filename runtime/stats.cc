// lazyfuse::stats(): each layer's counters gathered.
#include "lazyfuse/runtime/stats.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lazyfuse/codegen/cpu/cpu_jit.h"
#include "lazyfuse/runtime/cuda/cuda_graphs.h"
#include "lazyfuse/runtime/cuda/cuda_memory.h"
#include "lazyfuse/runtime/devices.h"
#include "lazyfuse/runtime/host_memory.h"
#include "lazyfuse/runtime/kernel_cache.h"
#include "lazyfuse/runtime/lazy.h"

namespace lazyfuse {
namespace {

DeviceMemoryStats memory_of(const Device& device, const AllocatorStats& allocator) {
  return {device, allocator.allocated_bytes, allocator.cached_bytes, allocator.peak_bytes};
}

}  // namespace

Stats stats() {
  Stats out;
  const EvalStats eval = eval_stats();
  out.evaluations = eval.evaluations;
  out.nodes = eval.nodes;
  out.kernels = eval.kernels;
  out.launches = eval.launches;
  out.schedule_cache_hits = eval.schedule_cache_hits;
  out.schedule_cache_bypasses = eval.schedule_cache_bypasses;
  const cuda::KernelCacheStats kernels = cuda::kernel_cache_stats();
  out.kernels_compiled = kernels.compiles;
  out.kernels_loaded_from_disk = kernels.disk_hits;
  out.kernels_found_in_memory = kernels.memory_hits;
  out.compile_ms = kernels.compile_ms;
  const CpuJitStats jit = cpu_jit_stats();
  out.cpu_programs_compiled = jit.compiled;
  out.cpu_jit_runs = jit.runs;
  const cuda::GraphStats graphs = cuda::graph_stats();
  out.graph_captures = graphs.captures;
  out.graph_replays = graphs.replays;
  out.memory.push_back(memory_of(Device::cpu(), cpu::allocator_stats()));
  for (int i = 0; i < cuda::device_count(); ++i)
    out.memory.push_back(memory_of(Device(DeviceType::CUDA, i), cuda::allocator_stats(i)));
  return out;
}

void reset_stats() {
  reset_eval_stats();
  cuda::reset_kernel_cache_stats();
  reset_cpu_jit_stats();
  cuda::reset_graph_stats();
  reset_peak_memory_stats();
}

void reset_peak_memory_stats() {
  cpu::reset_peak_memory_stats();
  for (int i = 0; i < cuda::device_count(); ++i) cuda::reset_peak_memory_stats(i);
}

void reset_peak_memory_stats(Device device) {
  device = resolve_device(device);  // a DeviceIndexError for a GPU that is not there
  if (device.is_cpu()) {
    cpu::reset_peak_memory_stats();
  } else {
    cuda::reset_peak_memory_stats(device.index());
  }
}

std::string format_stats(const Stats& s) {
  std::string out = absl::StrFormat(
      "evaluations: %d\nnodes: %d\nkernels: %d\nlaunches: %d\nschedule_cache_hits: %d\n"
      "schedule_cache_bypasses: %d\nkernels_compiled: %d\nkernels_loaded_from_disk: %d\n"
      "kernels_found_in_memory: %d\ncompile_ms: %.1f\ncpu_programs_compiled: %d\n"
      "cpu_jit_runs: %d\ngraph_captures: %d\ngraph_replays: %d\n",
      s.evaluations, s.nodes, s.kernels, s.launches, s.schedule_cache_hits,
      s.schedule_cache_bypasses, s.kernels_compiled, s.kernels_loaded_from_disk,
      s.kernels_found_in_memory, s.compile_ms, s.cpu_programs_compiled, s.cpu_jit_runs,
      s.graph_captures, s.graph_replays);
  for (const DeviceMemoryStats& m : s.memory)
    absl::StrAppend(&out, m.device.str(), ": allocated_bytes ", m.allocated_bytes,
                    ", cached_bytes ", m.cached_bytes, ", peak_bytes ", m.peak_bytes, "\n");
  return out;
}

}  // namespace lazyfuse
