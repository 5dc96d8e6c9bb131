// The registry of backends, one per device type. It is a list rather than static registrars in
// each backend's file: lazyfuse is linked as static archives, where an object file that nothing
// names is left out, registrar and all.
#include "lazyfuse/runtime/backend.h"

#include <atomic>
#include <deque>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/runtime/devices.h"

namespace lazyfuse {
namespace {

struct Slot {
  Slot(DeviceType t, Backend* b) : type(t), backend(b) {}
  DeviceType type;
  std::atomic<Backend*> backend;
};

// Made on first use and never destroyed: storage freed at exit still finds its backend. A deque,
// so that a registration leaves the slots handed out where they are.
std::deque<Slot>& registry() {
  static auto* slots = [] {
    auto* built_in = new std::deque<Slot>;
    built_in->emplace_back(DeviceType::CPU, &cpu_backend());
    built_in->emplace_back(DeviceType::CUDA, &cuda_backend());
    return built_in;
  }();
  return *slots;
}

std::mutex registration;

Slot* find_slot(DeviceType type) {
  for (Slot& slot : registry())
    if (slot.type == type) return &slot;
  return nullptr;
}

std::atomic<Backend*>& slot(DeviceType type) {
  if (Slot* found = find_slot(type)) return found->backend;
  throw DeviceIndexError(
      absl::StrCat("no backend is registered for devices of type ", Device(type).str()));
}

std::atomic<int64_t> launches{0};

}  // namespace

void count_launch(int64_t n) { launches.fetch_add(n, std::memory_order_relaxed); }
int64_t launches_started() { return launches.load(std::memory_order_relaxed); }

Backend& backend_for(const Device& device) { return *slot(device.type()).load(); }

Device resolve_device(const Device& device) { return backend_for(device).resolve(device); }

void register_backend(DeviceType type, Backend& backend) {
  std::lock_guard lock(registration);
  if (Slot* found = find_slot(type)) {
    found->backend.store(&backend);
  } else {
    registry().emplace_back(type, &backend);
  }
}

std::vector<DeviceType> registered_device_types() {
  std::vector<DeviceType> types;
  for (const Slot& slot : registry()) types.push_back(slot.type);
  return types;
}

ScopedBackend::ScopedBackend(DeviceType type, Backend& backend)
    : type_(type), previous_(slot(type).exchange(&backend)) {}

ScopedBackend::~ScopedBackend() { slot(type_).store(previous_); }

}  // namespace lazyfuse
