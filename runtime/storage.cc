// Storage through each device's backend, and per-device accounting.
#include "lazyfuse/runtime/storage.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <new>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/runtime/backend.h"
#include "lazyfuse/runtime/host_profile.h"
#include "lazyfuse/runtime/pool_allocator.h"

namespace lazyfuse {
namespace {

std::mutex stats_mutex;
std::map<std::pair<int, int>, MemoryStats>& all_stats() {
  static auto* stats = new std::map<std::pair<int, int>, MemoryStats>();
  return *stats;
}
std::pair<int, int> key(const Device& d) { return {static_cast<int>(d.type()), d.index()}; }

}  // namespace

std::shared_ptr<Storage> Storage::allocate(const Device& device, int64_t nbytes) {
  void* data = backend_for(device).allocate(device, std::max<int64_t>(nbytes, 1));
  {
    std::lock_guard lock(stats_mutex);
    MemoryStats& stats = all_stats()[key(device)];
    stats.allocated_bytes += nbytes;
    stats.peak_bytes = std::max(stats.peak_bytes, stats.allocated_bytes);
    ++stats.allocations;
  }
  // One block for the storage and its count, from the pools (runtime/pool_allocator.h).
  return make_pooled<Storage>(Private{}, device, data, nbytes);
}

std::shared_ptr<Storage> Storage::wrap(const Device& device, void* data, int64_t nbytes,
                                       std::function<void(void*)> deleter) {
  auto storage = make_pooled<Storage>(Private{}, device, data, nbytes);
  storage->external_ = true;
  storage->deleter_ = std::move(deleter);
  return storage;
}

Storage::~Storage() {
  if (external_) {
    if (deleter_) deleter_(data_);
    return;
  }
  backend_for(device_).release(device_, data_, std::max<int64_t>(nbytes_, 1));
  std::lock_guard lock(stats_mutex);
  all_stats()[key(device_)].allocated_bytes -= nbytes_;
}

MemoryStats memory_stats(const Device& device) {
  std::lock_guard lock(stats_mutex);
  return all_stats()[key(device)];
}

void reset_storage_peak(const Device& device) {
  std::lock_guard lock(stats_mutex);
  MemoryStats& stats = all_stats()[key(device)];
  stats.peak_bytes = stats.allocated_bytes;
}

bool BufferView::is_contiguous() const {
  // No elements: nothing is out of place, whatever the strides (as PyTorch's is_contiguous).
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return true;
  int64_t expected = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] != 1 && strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

BufferView allocate_buffer(const Device& device, DType dtype, const Shape& shape) {
  ScopedHostPhase phase(HostPhase::Allocate);
  BufferView view;
  view.storage = Storage::allocate(device, numel(shape) * dtype_size(dtype));
  view.shape = shape;
  view.strides = contiguous_strides(shape);
  view.dtype = dtype;
  return view;
}

}  // namespace lazyfuse
