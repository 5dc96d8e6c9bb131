// A hash that is the same in every process and on every machine, for kernel names and cache
// keys (absl::Hash is seeded per process, so it cannot name anything that outlives one).
#pragma once

#include <cstdint>
#include <string_view>
#include <type_traits>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "lazyfuse/ir/device.h"

namespace lazyfuse {

class StableHash {
 public:
  StableHash& add(uint64_t x) {
    // splitmix64's finaliser over the running state: cheap, and every input bit reaches
    // every output bit.
    state_ ^= x + 0x9E3779B97F4A7C15ull + (state_ << 6) + (state_ >> 2);
    uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    state_ = z ^ (z >> 31);
    return *this;
  }
  template <typename T>
  requires std::is_enum_v<T> || std::is_integral_v<T> StableHash& add(T x) {
    return add(static_cast<uint64_t>(static_cast<int64_t>(x)));
  }
  StableHash& add(double x);
  StableHash& add(std::string_view text);
  StableHash& add(const Device& device) { return add(device.type()).add(device.index()); }
  template <typename T>
  StableHash& add(const std::vector<T>& items) {
    return add_items(items);
  }
  template <typename T, size_t N>
  StableHash& add(const absl::InlinedVector<T, N>& items) {
    return add_items(items);
  }
  uint64_t value() const { return state_; }

 private:
  // The count, then each item: the same words whichever container holds them.
  template <typename Items>
  StableHash& add_items(const Items& items) {
    add(items.size());
    for (const auto& item : items) add(item);
    return *this;
  }
  uint64_t state_ = 0x6C617A7966757365ull;  // "lazyfuse"
};

}  // namespace lazyfuse
