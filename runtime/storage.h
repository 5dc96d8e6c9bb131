// Storage: one allocation on one device, shared by every tensor that views it. Memory in use is
// accounted per device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "absl/container/inlined_vector.h"
#include "lazyfuse/ir/device.h"
#include "lazyfuse/ir/dtype.h"
#include "lazyfuse/ir/shape.h"

namespace lazyfuse {

class Storage {
 public:
  // Allocates `nbytes` on `device` (64-byte aligned on the host).
  static std::shared_ptr<Storage> allocate(const Device& device, int64_t nbytes);
  // Memory someone else allocated (from_blob, DLPack), used in place: when the last view of it
  // goes, `deleter` (if any) gets `data` back, once; lazyfuse never frees it itself, nor counts
  // it among the bytes it holds.
  static std::shared_ptr<Storage> wrap(const Device& device, void* data, int64_t nbytes,
                                       std::function<void(void*)> deleter);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  // For make_pooled in allocate() only.
  struct Private {
    explicit Private() = default;
  };
  Storage(Private, const Device& device, void* data, int64_t nbytes)
      : device_(device), data_(data), nbytes_(nbytes) {}

  void* data() const { return data_; }
  int64_t nbytes() const { return nbytes_; }
  const Device& device() const { return device_; }
  // Whether the memory came from outside (wrap()).
  bool is_external() const { return external_; }

 private:
  Device device_;
  void* data_;
  int64_t nbytes_;
  bool external_ = false;
  std::function<void(void*)> deleter_;  // external memory's, or empty
};

// What a backend's caching allocator did (cuda::allocator_stats, cpu::allocator_stats).
struct AllocatorStats {
  int64_t allocated_bytes = 0;  // handed out and not yet freed
  int64_t cached_bytes = 0;     // freed, held for reuse
  int64_t peak_bytes = 0;
  int64_t system_allocations = 0;  // blocks taken from the system (cuMemAlloc, aligned_alloc)
  int64_t cache_hits = 0;
};

struct MemoryStats {
  int64_t allocated_bytes = 0;  // in use now
  int64_t peak_bytes = 0;
  int64_t allocations = 0;  // count, ever
};
// Statistics of the memory lazyfuse holds on `device`.
MemoryStats memory_stats(const Device& device);
// Sets `device`'s peak_bytes to what it holds now (reset_peak_memory_stats in stats.h calls it
// with the allocator's).
void reset_storage_peak(const Device& device);

// A tensor's value: a view into storage with its own sizes, strides (in elements) and offset.
struct BufferView {
  std::shared_ptr<Storage> storage;
  int64_t offset = 0;
  Shape shape;
  Strides strides;
  DType dtype = DType::Float32;

  void* data() const {
    return static_cast<std::byte*>(storage->data()) + offset * dtype_size(dtype);
  }
  bool is_contiguous() const;
};

// The buffers of a schedule's values during one run, by ValueId (unset until computed): inline
// for the small graphs that are evaluated in loops.
using ValueBuffers = absl::InlinedVector<std::optional<BufferView>, 8>;

// A fresh contiguous buffer.
BufferView allocate_buffer(const Device& device, DType dtype, const Shape& shape);

}  // namespace lazyfuse
