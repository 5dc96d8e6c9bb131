// Parsing and printing of devices.
#include "lazyfuse/ir/device.h"

#include <charconv>

#include "absl/strings/str_cat.h"
#include "lazyfuse/ir/errors.h"

namespace lazyfuse {

Device::Device(DeviceType type, int index) : type_(type), index_(index) {
  if (type == DeviceType::CPU && index > 0)
    throw DeviceStringError(absl::StrCat("Invalid device: cpu has no index ", index,
                                         "; it is all CPUs and host memory"));
  if (type == DeviceType::CPU) index_ = -1;
}

Device::Device(std::string_view text) : type_(DeviceType::CPU), index_(-1) {
  auto fail = [&](std::string_view why) {
    return DeviceStringError(absl::StrCat("Invalid device string: '", std::string(text), "' (",
                                          std::string(why),
                                          "; expected \"cpu\", \"cuda\" or \"cuda:N\")"));
  };
  std::string_view type = text.substr(0, text.find(':'));
  if (type == "cpu") {
    type_ = DeviceType::CPU;
  } else if (type == "cuda") {
    type_ = DeviceType::CUDA;
  } else {
    throw fail("unknown device type");
  }
  if (type.size() == text.size()) return;
  std::string_view digits = text.substr(type.size() + 1);
  int index = -1;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
  if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size() || index < 0)
    throw fail("the index is not a non-negative integer");
  if (type_ == DeviceType::CPU && index != 0) throw fail("cpu takes no index but 0");
  index_ = type_ == DeviceType::CPU ? -1 : index;
}

std::string Device::str() const {
  if (type_ == DeviceType::CPU) return "cpu";
  return index_ >= 0 ? absl::StrCat("cuda:", index_) : "cuda";
}

std::ostream& operator<<(std::ostream& os, const Device& device) { return os << device.str(); }

}  // namespace lazyfuse
