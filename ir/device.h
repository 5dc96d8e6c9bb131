// Where a value lives: the host ("cpu") or one CUDA device ("cuda:N"), as c10::Device.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>

namespace lazyfuse {

// A new backend's devices get a type here and a name in device.cc.
enum class DeviceType : uint8_t { CPU, CUDA };
// "cpu", "cuda".
const char* device_type_name(DeviceType type);

class Device {
 public:
  // "cpu", "cuda", "cuda:1". Plain "cuda" means the current CUDA device: its index is left
  // unset here and resolved by the runtime when a tensor is placed on it.
  Device(std::string_view text);  // NOLINT: implicit, so that t.to("cuda") reads as in PyTorch.
  Device(const char* text) : Device(std::string_view(text)) {}  // NOLINT
  Device(DeviceType type, int index = -1);

  static Device cpu() { return Device(DeviceType::CPU); }

  DeviceType type() const { return type_; }
  // -1 for "cpu" and for a "cuda" whose index is not yet resolved.
  int index() const { return index_; }
  bool has_index() const { return index_ >= 0; }
  bool is_cpu() const { return type_ == DeviceType::CPU; }
  bool is_cuda() const { return type_ == DeviceType::CUDA; }

  std::string str() const;  // "cpu", "cuda:0", "cuda"

  friend bool operator==(const Device&, const Device&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const Device& d) {
    return H::combine(std::move(h), d.type_, d.index_);
  }

 private:
  DeviceType type_;
  int index_;
};

std::ostream& operator<<(std::ostream& os, const Device& device);

}  // namespace lazyfuse
