// The registry of backends, one per device type.
#include "lazyfuse/runtime/backend.h"

#include <array>
#include <atomic>

namespace lazyfuse {
namespace {

constexpr size_t kDeviceTypes = 2;

// Made on first use and never destroyed: storage freed at exit still finds its backend.
std::array<std::atomic<Backend*>, kDeviceTypes>& registry() {
  static auto* backends =
      new std::array<std::atomic<Backend*>, kDeviceTypes>{{&cpu_backend(), &cuda_backend()}};
  return *backends;
}

std::atomic<Backend*>& slot(DeviceType type) { return registry()[static_cast<size_t>(type)]; }

std::atomic<int64_t> launches{0};

}  // namespace

void count_launch(int64_t n) { launches.fetch_add(n, std::memory_order_relaxed); }
int64_t launches_started() { return launches.load(std::memory_order_relaxed); }

Backend& backend_for(const Device& device) { return *slot(device.type()).load(); }

ScopedBackend::ScopedBackend(DeviceType type, Backend& backend)
    : type_(type), previous_(slot(type).exchange(&backend)) {}

ScopedBackend::~ScopedBackend() { slot(type_).store(previous_); }

}  // namespace lazyfuse
