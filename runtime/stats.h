// What lazyfuse did in this process, in one place: evaluations, the schedule cache, kernels
// compiled and found, the CPU JIT, CUDA graphs, and the memory held on each device. The counters
// of each layer (eval_stats, cuda::kernel_cache_stats, cpu_jit_stats, cuda::graph_stats, the
// allocators') gathered for users, as torch.cuda.memory_stats gathers PyTorch's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lazyfuse/ir/device.h"

namespace lazyfuse {

struct DeviceMemoryStats {
  Device device;
  int64_t allocated_bytes = 0;  // held by tensors now
  int64_t cached_bytes = 0;     // freed by tensors, kept by the allocator for reuse
  int64_t peak_bytes = 0;       // the most allocated_bytes has been
};

struct Stats {
  // Evaluations, the nodes of their graphs (params included), and the kernels they ran (views
  // and transfers not counted) and launched (library calls and staging copies included).
  int64_t evaluations = 0;
  int64_t nodes = 0;
  int64_t kernels = 0;
  int64_t launches = 0;
  // Evaluations that reused the schedule of an earlier one of the same graph, and those too
  // large or dumped to be cached; the rest ran the passes.
  int64_t schedule_cache_hits = 0;
  int64_t schedule_cache_bypasses = 0;
  // GPU kernels: compiled by NVRTC, loaded from the disk cache, found in memory.
  int64_t kernels_compiled = 0;
  int64_t kernels_loaded_from_disk = 0;
  int64_t kernels_found_in_memory = 0;
  double compile_ms = 0;  // NVRTC's time, summed
  // The CPU JIT: programs compiled (LLVM), and ranges of elements their code computed.
  int64_t cpu_programs_compiled = 0;
  int64_t cpu_jit_runs = 0;
  // CUDA graphs: evaluations recorded into a new graph, and replays of one.
  int64_t graph_captures = 0;
  int64_t graph_replays = 0;
  // The CPU, then each GPU.
  std::vector<DeviceMemoryStats> memory;
};

Stats stats();
// Zeroes the counters and sets each device's peak to what it holds now; memory held and cached
// stays what it is.
void reset_stats();
// Sets each device's peak_bytes to what it holds now and leaves every counter as it is, as
// torch.cuda.reset_peak_memory_stats: to measure one phase's peak without losing the run's counts.
void reset_peak_memory_stats();
// The same for one device ("cpu", "cuda:1"; "cuda" is the current GPU).
void reset_peak_memory_stats(Device device);
// The statistics as text, one "name: value" a line.
std::string format_stats(const Stats& stats);

}  // namespace lazyfuse
