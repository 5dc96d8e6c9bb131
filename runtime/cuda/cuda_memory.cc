// The caching allocator.
#include "lazyfuse/runtime/cuda/cuda_memory.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/runtime/cuda/cuda_driver.h"

namespace lazyfuse::cuda {

// Note [A graph's own memory pool]
// A CUDA graph replays the addresses it was recorded with, so a schedule's run replays only when
// its buffers land where the graph's did (Note [CUDA graph replay]). From the device's shared
// cache they would land wherever the rest of the program left free blocks: a tensor the user
// made between two steps, an input's copy kept by a graph, a buffer freed a step later than
// usual, each moves every block after it, and a training loop recorded graph after graph and
// replayed none. So a schedule's replayable runs allocate from a pool of their own: its blocks
// return to it when freed, and it hands out the lowest-addressed free block of a size as the
// cache does, so which blocks a run gets depends only on which of the pool's blocks are still
// held from earlier runs (a step's outputs the user keeps, a step count read while its
// successor is written). That state is small and is fingerprinted; a graph is tried only by a
// run that starts from the fingerprint it was recorded from, or, where its run grew the pool,
// from that state with the blocks the run added free: the state the next run finds once the
// step's temporaries and dropped outputs are back (its dry run then checks that it takes the
// same blocks). A pool grows to what its runs hold at once and is given back when its schedule
// stops recording graphs or is dropped.

namespace {

// Free blocks by rounded size, each size's by address: an allocation takes the lowest, so which
// blocks a run gets depends on which are free, never on the order they were freed in.
using FreeBlocks = std::map<int64_t, std::set<CUdeviceptr>>;

struct Pool {
  FreeBlocks free_blocks;
  // Every block it has taken from the cache or the driver, free or in use, in the order taken,
  // with its rounded size.
  std::vector<std::pair<int64_t, CUdeviceptr>> blocks;
};

struct DeviceCache {
  std::mutex mutex;
  FreeBlocks free_blocks;
  std::map<int64_t, Pool> pools;
  absl::flat_hash_map<CUdeviceptr, int64_t> pool_of;  // a live pool's blocks in use
  AllocatorStats stats;
};

std::atomic<int64_t> next_pool{1};
thread_local int active_device = -1;
thread_local int64_t active_pool = 0;

DeviceCache& cache(int device) {
  // Read on every allocation: the caches made so far are read without a lock (each slot is set
  // once); a slot past them, or a first use, takes it.
  constexpr int kFastSlots = 64;
  static std::atomic<DeviceCache*> fast[kFastSlots] = {};
  if (device >= 0 && device < kFastSlots)
    if (DeviceCache* c = fast[device].load(std::memory_order_acquire)) return *c;
  static std::mutex mutex;
  static std::map<int, DeviceCache>* caches = new std::map<int, DeviceCache>();
  std::lock_guard lock(mutex);
  DeviceCache& c = (*caches)[device];  // std::map: never moves once made
  if (device >= 0 && device < kFastSlots) fast[device].store(&c, std::memory_order_release);
  return c;
}

// Small blocks round to 512 bytes, large ones to 2 MiB, so that freed blocks fit later
// requests of similar size.
int64_t round_size(int64_t nbytes) {
  const int64_t unit = nbytes < (int64_t{1} << 20) ? 512 : (int64_t{2} << 20);
  return std::max<int64_t>(unit, (nbytes + unit - 1) / unit * unit);
}

void free_blocks(DeviceCache& c, FreeBlocks& blocks_by_size) {
  for (auto& [size, blocks] : blocks_by_size) {
    for (CUdeviceptr block : blocks) driver()->cuMemFree(block);
    c.stats.cached_bytes -= size * static_cast<int64_t>(blocks.size());
  }
  blocks_by_size.clear();
}

// A graph that recorded a freed block is never replayed again: no later run of its schedule
// gets that block (or gets it new from cuMemAlloc and is then checked like any other).
void free_cached(DeviceCache& c) {
  free_blocks(c, c.free_blocks);
  for (auto& [id, pool] : c.pools) {
    std::erase_if(pool.blocks, [&](const auto& taken) {
      auto it = pool.free_blocks.find(taken.first);
      return it != pool.free_blocks.end() && it->second.contains(taken.second);
    });
    free_blocks(c, pool.free_blocks);
  }
}

// Takes the lowest-addressed free block of `size` from `blocks`, or returns 0.
CUdeviceptr take(FreeBlocks& blocks, int64_t size) {
  auto it = blocks.find(size);
  if (it == blocks.end() || it->second.empty()) return 0;
  const CUdeviceptr block = *it->second.begin();
  it->second.erase(it->second.begin());
  return block;
}

}  // namespace

void* allocate(int device, int64_t nbytes) {
  const int64_t size = round_size(nbytes);
  DeviceCache& c = cache(device);
  std::lock_guard lock(c.mutex);
  const int64_t pool_id = active_device == device ? active_pool : 0;
  Pool* pool = pool_id != 0 ? &c.pools[pool_id] : nullptr;
  // Hands `block` out; one from outside the active pool joins it.
  auto record = [&](CUdeviceptr block, bool from_pool) {
    c.stats.allocated_bytes += size;
    c.stats.peak_bytes = std::max(c.stats.peak_bytes, c.stats.allocated_bytes);
    if (pool != nullptr) {
      c.pool_of[block] = pool_id;
      if (!from_pool) pool->blocks.emplace_back(size, block);
    }
    return reinterpret_cast<void*>(block);
  };
  // A pool's own free blocks first, then the cache's.
  if (pool != nullptr) {
    if (const CUdeviceptr block = take(pool->free_blocks, size)) {
      c.stats.cached_bytes -= size;
      ++c.stats.cache_hits;
      return record(block, true);
    }
  }
  if (const CUdeviceptr block = take(c.free_blocks, size)) {
    c.stats.cached_bytes -= size;
    ++c.stats.cache_hits;
    return record(block, false);
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
  ++c.stats.system_allocations;
  return record(block, false);
}

void release(int device, void* pointer, int64_t nbytes) {
  const int64_t size = round_size(nbytes);
  DeviceCache& c = cache(device);
  std::lock_guard lock(c.mutex);
  const auto block = reinterpret_cast<CUdeviceptr>(pointer);
  FreeBlocks* home = &c.free_blocks;
  if (!c.pool_of.empty()) {
    if (auto owner = c.pool_of.find(block); owner != c.pool_of.end()) {
      home = &c.pools[owner->second].free_blocks;
      c.pool_of.erase(owner);
    }
  }
  (*home)[size].insert(block);
  c.stats.allocated_bytes -= size;
  c.stats.cached_bytes += size;
}

AllocatorStats allocator_stats(int device) {
  DeviceCache& c = cache(device);
  std::lock_guard lock(c.mutex);
  return c.stats;
}

void reset_peak_memory_stats(int device) {
  DeviceCache& c = cache(device);
  std::lock_guard lock(c.mutex);
  c.stats.peak_bytes = c.stats.allocated_bytes;
}

int64_t create_pool(int device) {
  DeviceCache& c = cache(device);
  std::lock_guard lock(c.mutex);
  const int64_t pool = next_pool++;
  c.pools[pool];
  return pool;
}

void destroy_pool(int device, int64_t pool) {
  DeviceCache& c = cache(device);
  std::lock_guard lock(c.mutex);
  auto it = c.pools.find(pool);
  if (it == c.pools.end()) return;
  for (auto& [size, blocks] : it->second.free_blocks) c.free_blocks[size].merge(blocks);
  c.pools.erase(it);
  // Its blocks in use go back to the cache when freed.
  absl::erase_if(c.pool_of, [&](const auto& entry) { return entry.second == pool; });
}

namespace {

uint64_t fingerprint_of(const FreeBlocks& free) {
  uint64_t hash = 0;
  for (const auto& [size, blocks] : free)
    for (CUdeviceptr block : blocks) hash = absl::HashOf(hash, size, block);
  return hash;
}

}  // namespace

uint64_t pool_fingerprint(int device, int64_t pool) {
  DeviceCache& c = cache(device);
  std::lock_guard lock(c.mutex);
  auto it = c.pools.find(pool);
  return it == c.pools.end() ? 0 : fingerprint_of(it->second.free_blocks);
}

uint64_t grown_pool_fingerprint(int device, int64_t pool, int64_t blocks_before) {
  DeviceCache& c = cache(device);
  std::lock_guard lock(c.mutex);
  auto it = c.pools.find(pool);
  if (it == c.pools.end()) return 0;
  FreeBlocks free = it->second.free_blocks;
  const auto& blocks = it->second.blocks;
  for (size_t i = static_cast<size_t>(std::max<int64_t>(blocks_before, 0)); i < blocks.size(); ++i)
    free[blocks[i].first].insert(blocks[i].second);
  return fingerprint_of(free);
}

int64_t pool_blocks(int device, int64_t pool) {
  DeviceCache& c = cache(device);
  std::lock_guard lock(c.mutex);
  auto it = c.pools.find(pool);
  return it == c.pools.end() ? 0 : static_cast<int64_t>(it->second.blocks.size());
}

PoolScope::PoolScope(int device, int64_t pool)
    : previous_device_(active_device), previous_pool_(active_pool) {
  active_device = device;
  active_pool = pool;
}

PoolScope::~PoolScope() {
  active_device = previous_device_;
  active_pool = previous_pool_;
}

void empty_cache(int device) {
  DeviceCache& c = cache(device);
  std::lock_guard lock(c.mutex);
  if (driver() == nullptr) return;
  activate(device);
  free_cached(c);
}

}  // namespace lazyfuse::cuda
