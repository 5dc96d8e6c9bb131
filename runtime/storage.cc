// Host allocation and per-device accounting. (Device memory arrives with the CUDA runtime.)
#include "runtime/storage.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <new>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ir/errors.h"
#include "runtime/cuda_memory.h"

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
  void* data = nullptr;
  if (device.is_cuda()) {
    data = cuda::allocate(device.index(), std::max<int64_t>(nbytes, 1));
  } else {
    size_t size = static_cast<size_t>((std::max<int64_t>(nbytes, 1) + 63) / 64 * 64);
    data = std::aligned_alloc(64, size);
    if (data == nullptr)
      throw OutOfMemoryError(absl::StrFormat(
          "out of host memory: tried to allocate %.2f MiB; lazyfuse holds %.2f MiB on the CPU",
          static_cast<double>(size) / (1 << 20),
          static_cast<double>(memory_stats(device).allocated_bytes) / (1 << 20)));
  }
  {
    std::lock_guard lock(stats_mutex);
    MemoryStats& stats = all_stats()[key(device)];
    stats.allocated_bytes += nbytes;
    stats.peak_bytes = std::max(stats.peak_bytes, stats.allocated_bytes);
    ++stats.allocations;
  }
  return std::shared_ptr<Storage>(new Storage(device, data, nbytes));
}

Storage::~Storage() {
  if (device_.is_cuda()) {
    cuda::release(device_.index(), data_, std::max<int64_t>(nbytes_, 1));
  } else {
    std::free(data_);
  }
  std::lock_guard lock(stats_mutex);
  all_stats()[key(device_)].allocated_bytes -= nbytes_;
}

MemoryStats memory_stats(const Device& device) {
  std::lock_guard lock(stats_mutex);
  return all_stats()[key(device)];
}

bool BufferView::is_contiguous() const {
  int64_t expected = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] != 1 && strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

BufferView allocate_buffer(const Device& device, DType dtype, const Shape& shape) {
  BufferView view;
  view.storage = Storage::allocate(device, numel(shape) * dtype_size(dtype));
  view.shape = shape;
  view.strides = contiguous_strides(shape);
  view.dtype = dtype;
  return view;
}

}  // namespace lazyfuse
