// Compiled kernels: in memory per device, and on disk as cubins under $LAZYFUSE_CACHE_DIR
// (default ~/.cache/lazyfuse), keyed by the source's hash, the architecture, the NVRTC version
// and the options. Files are written atomically (temporary file, rename) and carry a checksum,
// so a damaged or truncated entry is detected, recompiled and replaced.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "lazyfuse/codegen/cuda/cuda_codegen.h"
#include "lazyfuse/runtime/cuda/cuda_driver.h"

namespace lazyfuse::cuda {

struct KernelCacheStats {
  int64_t memory_hits = 0;
  int64_t disk_hits = 0;
  int64_t compiles = 0;
  int64_t damaged_entries = 0;  // disk entries found bad and replaced
  double compile_ms = 0;        // NVRTC time, summed
  double load_ms = 0;           // disk read and cuModuleLoadData, summed
};

// The kernel on GPU `device` that `key` names (a step's kernel_key with its variant: cheap to
// build, so a hit costs no source generation); `generate` makes the source on a miss. Each
// kernel is compiled at most once per process and architecture, and once per machine while the
// disk cache keeps it.
CUfunction get_kernel(int device, const std::string& key,
                      const std::function<CudaSource()>& generate);
KernelCacheStats kernel_cache_stats();
void reset_kernel_cache_stats();
// Forgets the in-memory kernels (the disk cache stays): tests measure cold and warm paths.
void clear_memory_kernel_cache();
// Counts clear_memory_kernel_cache() calls: a kernel remembered elsewhere (a step cache) is
// valid only under the generation it was found in.
uint64_t kernel_cache_generation();
// Counts a kernel found in memory without get_kernel (a step cache's) as the memory hit it is.
void count_memory_hit();

// Compute capability and multiprocessor count of GPU `device`.
struct DeviceProperties {
  int major = 0, minor = 0;
  int multiprocessors = 1;
};
const DeviceProperties& device_properties(int device);

}  // namespace lazyfuse::cuda
