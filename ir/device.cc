// Parsing and printing of devices.
#include "lazyfuse/ir/device.h"

#include <charconv>

#include "absl/strings/str_cat.h"
#include "lazyfuse/ir/errors.h"

namespace lazyfuse {
namespace {

// Each device type's name in device strings, as c10's. The host alone takes no index.
struct DeviceTypeName {
  DeviceType type;
  const char* name;
};
constexpr DeviceTypeName kDeviceTypeNames[] = {{DeviceType::CPU, "cpu"},
                                               {DeviceType::CUDA, "cuda"}};

}  // namespace

const char* device_type_name(DeviceType type) {
  for (const DeviceTypeName& known : kDeviceTypeNames)
    if (known.type == type) return known.name;
  return "unknown";
}

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
  const DeviceTypeName* named = nullptr;
  for (const DeviceTypeName& known : kDeviceTypeNames)
    if (type == known.name) named = &known;
  if (named == nullptr) throw fail("unknown device type");
  type_ = named->type;
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
  const char* name = device_type_name(type_);
  return index_ >= 0 ? absl::StrCat(name, ":", index_) : std::string(name);
}

std::ostream& operator<<(std::ostream& os, const Device& device) { return os << device.str(); }

}  // namespace lazyfuse
