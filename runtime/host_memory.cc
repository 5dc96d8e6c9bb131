// The host's caching allocator.
#include "lazyfuse/runtime/host_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

#include "absl/strings/str_format.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/runtime/env.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

namespace lazyfuse::cpu {
namespace {

constexpr int64_t kHugePage = int64_t{2} << 20;

// Small blocks round to 512 bytes, large ones to whole huge pages, so that freed blocks fit
// later requests of similar size.
int64_t round_size(int64_t nbytes) {
  const int64_t unit = nbytes < (int64_t{1} << 20) ? 512 : kHugePage;
  return std::max<int64_t>(unit, (nbytes + unit - 1) / unit * unit);
}

// A cached block is off limits until it is handed out again: under AddressSanitizer a read
// through a tensor freed before it is reported as a use after poisoning.
void poison(void* block, int64_t size) {
#if defined(__SANITIZE_ADDRESS__)
  ASAN_POISON_MEMORY_REGION(block, static_cast<size_t>(size));
#else
  (void)block, (void)size;
#endif
}
void unpoison(void* block, int64_t size) {
#if defined(__SANITIZE_ADDRESS__)
  ASAN_UNPOISON_MEMORY_REGION(block, static_cast<size_t>(size));
#else
  (void)block, (void)size;
#endif
}

struct HostCache {
  std::mutex mutex;
  std::map<int64_t, std::vector<void*>> free_blocks;  // by rounded size, the last freed last
  AllocatorStats stats;
  int64_t max_cached_bytes = 0;
};

HostCache& cache() {
  static HostCache* c = [] {
    auto* made = new HostCache();  // never destroyed: tensors may be freed at exit
    const int64_t mb = env_config().host_cache_mb;
    made->max_cached_bytes =
        mb >= 0 ? mb << 20 : sysconf(_SC_PHYS_PAGES) * sysconf(_SC_PAGESIZE) / 4;
    return made;
  }();
  return *c;
}

void free_cached(HostCache& c) {
  for (auto& [size, blocks] : c.free_blocks) {
    for (void* block : blocks) {
      unpoison(block, size);
      std::free(block);
    }
    c.stats.cached_bytes -= size * static_cast<int64_t>(blocks.size());
  }
  c.free_blocks.clear();
}

void* system_allocate(int64_t size) {
  if (size < kHugePage) return std::aligned_alloc(64, static_cast<size_t>(size));
  void* block = std::aligned_alloc(static_cast<size_t>(kHugePage), static_cast<size_t>(size));
  // Advice only: without transparent huge pages the block is as good as any.
  if (block != nullptr) (void)madvise(block, static_cast<size_t>(size), MADV_HUGEPAGE);
  return block;
}

}  // namespace

void* allocate(int64_t nbytes) {
  const int64_t size = round_size(std::max<int64_t>(nbytes, 1));
  HostCache& c = cache();
  std::lock_guard lock(c.mutex);
  auto hand_out = [&](void* block) {
    c.stats.allocated_bytes += size;
    c.stats.peak_bytes = std::max(c.stats.peak_bytes, c.stats.allocated_bytes);
    unpoison(block, size);
    return block;
  };
  if (auto it = c.free_blocks.find(size); it != c.free_blocks.end() && !it->second.empty()) {
    void* block = it->second.back();
    it->second.pop_back();
    c.stats.cached_bytes -= size;
    ++c.stats.cache_hits;
    return hand_out(block);
  }
  void* block = system_allocate(size);
  if (block == nullptr) {
    free_cached(c);
    block = system_allocate(size);
  }
  if (block == nullptr)
    throw OutOfMemoryError(absl::StrFormat(
        "out of host memory: tried to allocate %.2f MiB; lazyfuse holds %.2f MiB on the CPU",
        static_cast<double>(size) / (1 << 20),
        static_cast<double>(c.stats.allocated_bytes) / (1 << 20)));
  ++c.stats.system_allocations;
  return hand_out(block);
}

void release(void* pointer, int64_t nbytes) {
  const int64_t size = round_size(std::max<int64_t>(nbytes, 1));
  HostCache& c = cache();
  std::lock_guard lock(c.mutex);
  c.stats.allocated_bytes -= size;
  if (c.stats.cached_bytes + size > c.max_cached_bytes) {
    std::free(pointer);
    return;
  }
  poison(pointer, size);
  c.free_blocks[size].push_back(pointer);
  c.stats.cached_bytes += size;
}

AllocatorStats allocator_stats() {
  HostCache& c = cache();
  std::lock_guard lock(c.mutex);
  return c.stats;
}

void reset_peak_memory_stats() {
  HostCache& c = cache();
  std::lock_guard lock(c.mutex);
  c.stats.peak_bytes = c.stats.allocated_bytes;
}

void empty_cache() {
  HostCache& c = cache();
  std::lock_guard lock(c.mutex);
  free_cached(c);
}

}  // namespace lazyfuse::cpu
