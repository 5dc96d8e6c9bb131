// The caching allocator.
#include "runtime/cuda_memory.h"

#include <map>
#include <mutex>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ir/errors.h"
#include "runtime/cuda_driver.h"

namespace lazyfuse::cuda {
namespace {

struct DeviceCache {
  std::mutex mutex;
  // By rounded size, each size's blocks by address: an allocation takes the lowest, so which
  // blocks a run gets depends on which are free, never on the order they were freed in. A run
  // made twice from the same free blocks (a dry run and its capture, Note [CUDA graph replay])
  // gets the same ones.
  std::map<int64_t, std::set<CUdeviceptr>> free_blocks;
  AllocatorStats stats;
};

DeviceCache& cache(int device) {
  static std::mutex mutex;
  static std::map<int, DeviceCache>* caches = new std::map<int, DeviceCache>();
  std::lock_guard lock(mutex);
  return (*caches)[device];
}

// Small blocks round to 512 bytes, large ones to 2 MiB, so that freed blocks fit later
// requests of similar size.
int64_t round_size(int64_t nbytes) {
  const int64_t unit = nbytes < (int64_t{1} << 20) ? 512 : (int64_t{2} << 20);
  return std::max<int64_t>(unit, (nbytes + unit - 1) / unit * unit);
}

void free_cached(DeviceCache& c) {
  for (auto& [size, blocks] : c.free_blocks) {
    for (CUdeviceptr block : blocks) driver()->cuMemFree(block);
    c.stats.cached_bytes -= size * static_cast<int64_t>(blocks.size());
  }
  c.free_blocks.clear();
}

}  // namespace

void* allocate(int device, int64_t nbytes) {
  const int64_t size = round_size(nbytes);
  DeviceCache& c = cache(device);
  std::lock_guard lock(c.mutex);
  auto record = [&](CUdeviceptr block) {
    c.stats.allocated_bytes += size;
    c.stats.peak_bytes = std::max(c.stats.peak_bytes, c.stats.allocated_bytes);
    return reinterpret_cast<void*>(block);
  };
  auto it = c.free_blocks.find(size);
  if (it != c.free_blocks.end() && !it->second.empty()) {
    CUdeviceptr block = *it->second.begin();
    it->second.erase(it->second.begin());
    c.stats.cached_bytes -= size;
    ++c.stats.cache_hits;
    return record(block);
  }
  activate(device);
  CUdeviceptr block = 0;
  CUresult result = driver()->cuMemAlloc(&block, static_cast<size_t>(size));
  if (result == kErrorOutOfMemory) {
    int64_t cached = c.stats.cached_bytes;
    free_cached(c);
    result = driver()->cuMemAlloc(&block, static_cast<size_t>(size));
    if (result == kErrorOutOfMemory) {
      size_t free_bytes = 0, total_bytes = 0;
      driver()->cuMemGetInfo(&free_bytes, &total_bytes);
      constexpr double kMiB = 1024.0 * 1024.0;
      throw OutOfMemoryError(absl::StrFormat(
          "CUDA out of memory on cuda:%d: tried to allocate %.2f MiB; %.2f MiB free of %.2f MiB; "
          "lazyfuse holds %.2f MiB in tensors and had %.2f MiB cached (now released)",
          device, size / kMiB, free_bytes / kMiB, total_bytes / kMiB,
          c.stats.allocated_bytes / kMiB, cached / kMiB));
    }
  }
  check(result, "cuMemAlloc");
  ++c.stats.device_allocations;
  return record(block);
}

void release(int device, void* pointer, int64_t nbytes) {
  const int64_t size = round_size(nbytes);
  DeviceCache& c = cache(device);
  std::lock_guard lock(c.mutex);
  c.free_blocks[size].insert(reinterpret_cast<CUdeviceptr>(pointer));
  c.stats.allocated_bytes -= size;
  c.stats.cached_bytes += size;
}

AllocatorStats allocator_stats(int device) {
  DeviceCache& c = cache(device);
  std::lock_guard lock(c.mutex);
  return c.stats;
}

void empty_cache(int device) {
  DeviceCache& c = cache(device);
  std::lock_guard lock(c.mutex);
  if (driver() == nullptr) return;
  activate(device);
  free_cached(c);
}

}  // namespace lazyfuse::cuda
