// lazyfuse::stats(): the evaluations' counters and each registered backend's gathered.
#include "lazyfuse/runtime/stats.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lazyfuse/runtime/backend.h"
#include "lazyfuse/runtime/devices.h"
#include "lazyfuse/runtime/lazy.h"

namespace lazyfuse {

Stats stats() {
  Stats out;
  const EvalStats eval = eval_stats();
  out.evaluations = eval.evaluations;
  out.nodes = eval.nodes;
  out.kernels = eval.kernels;
  out.launches = eval.launches;
  out.schedule_cache_hits = eval.schedule_cache_hits;
  out.schedule_cache_bypasses = eval.schedule_cache_bypasses;
  for (DeviceType type : registered_device_types()) {
    Backend& backend = backend_for(Device(type));
    backend.add_counters(out);
    for (int i = 0; i < backend.device_count(); ++i) {
      const AllocatorStats allocator = backend.memory_stats(i);
      out.memory.push_back({Device(type, i), allocator.allocated_bytes, allocator.cached_bytes,
                            allocator.peak_bytes});
    }
  }
  return out;
}

void reset_stats() {
  reset_eval_stats();
  for (DeviceType type : registered_device_types()) backend_for(Device(type)).reset_counters();
  reset_peak_memory_stats();
}

void reset_peak_memory_stats() {
  for (DeviceType type : registered_device_types()) {
    Backend& backend = backend_for(Device(type));
    for (int i = 0; i < backend.device_count(); ++i) {
      backend.reset_peak_memory_stats(i);
      reset_storage_peak(Device(type, type == DeviceType::CPU ? -1 : i));
    }
  }
}

void reset_peak_memory_stats(Device device) {
  device = resolve_device(device);  // a DeviceIndexError for a device that is not there
  backend_for(device).reset_peak_memory_stats(std::max(device.index(), 0));
  reset_storage_peak(device);
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
