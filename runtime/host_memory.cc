// The host's caching allocator.
#include "lazyfuse/runtime/host_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
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

// Note [Coloured huge blocks]: a large block lies in huge pages (madvise(MADV_HUGEPAGE)), which
// spares the TLB and faults a block in 2 MiB at a time; but then equal offsets in two blocks are
// equal physical address bits up to bit 21, where 4 KiB pages would have scattered bits 12-20,
// and arrays read and written side by side (Adam's seven, each its own block) meet in the same
// memory banks. So each large block starts at a colour of its own past its huge page's start:
// one of 32 offsets a 4 KiB page apart (bits 12-16), handed out in turn; the block keeps it
// while cached. Adam ran markedly faster with these colours than without, and no faster with
// 16 colours 8 KiB apart; bias_relu and LayerNorm did not change. Colours that also moved a
// block by cache lines (4 KiB + 64 B or 64 B apart) slowed loops of two streams, bias_relu and
// the copy (docs/benchmarks.md, "CPU host memory"). The colour is below 2 MiB, so the huge
// page's start is the pointer rounded down; its at most 124 KiB are not counted in the
// statistics.
constexpr int64_t kColourStep = 4096, kColours = 32;

void* system_allocate(int64_t size, int64_t& next_colour) {
  if (size < kHugePage) return std::aligned_alloc(64, static_cast<size_t>(size));
  const int64_t colour = next_colour++ % kColours * kColourStep;
  void* base = nullptr;
  if (posix_memalign(&base, static_cast<size_t>(kHugePage), static_cast<size_t>(size + colour)))
    return nullptr;
  // Advice only: without transparent huge pages the block is as good as any.
  (void)madvise(base, static_cast<size_t>(size + colour), MADV_HUGEPAGE);
  return static_cast<std::byte*>(base) + colour;
}

void system_free(void* block, int64_t size) {
  if (size < kHugePage) return std::free(block);
  std::free(reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(block) &
                                    ~static_cast<uintptr_t>(kHugePage - 1)));
}

struct HostCache {
  std::mutex mutex;
  std::map<int64_t, std::vector<void*>> free_blocks;  // by rounded size, the last freed last
  AllocatorStats stats;
  int64_t max_cached_bytes = 0;
  int64_t next_colour = 0;  // Note [Coloured huge blocks]
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
      system_free(block, size);
    }
    c.stats.cached_bytes -= size * static_cast<int64_t>(blocks.size());
  }
  c.free_blocks.clear();
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
  void* block = system_allocate(size, c.next_colour);
  if (block == nullptr) {
    free_cached(c);
    block = system_allocate(size, c.next_colour);
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
    system_free(pointer, size);
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
