// The safetensors fuzzer's check: refusals are typed, and what loads survives a save.
#include "tests/fuzz/safetensors_check.h"

#include <cstring>
#include <sstream>
#include <vector>

#include "lazyfuse/frontend/serialize.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/runtime/executor.h"

namespace lazyfuse::fuzz {
namespace {

// The tensor's elements as bytes, row-major, read through the runtime rather than the loader.
std::string bytes_of(const Tensor& t) {
  eval(t);
  const BufferView host = copy_to_device(*t.value()->buffer, Device::cpu());
  const size_t n = static_cast<size_t>(t.numel() * dtype_size(t.dtype()));
  return n == 0 ? std::string() : std::string(static_cast<const char*>(host.data()), n);
}

// "" when both hold the same names in the same order with the same dtypes, shapes and bytes.
std::string difference(const NamedTensors& a, const NamedTensors& b) {
  if (a.size() != b.size()) {
    std::ostringstream out;
    out << a.size() << " tensors became " << b.size();
    return out.str();
  }
  for (size_t i = 0; i < a.size(); ++i) {
    const auto& [name_a, ta] = a[i];
    const auto& [name_b, tb] = b[i];
    const std::string what = "tensor '" + name_a + "' ";
    if (name_a != name_b) return what + "came back as '" + name_b + "'";
    if (ta.dtype() != tb.dtype()) return what + "changed its dtype";
    if (ta.sizes() != tb.sizes()) return what + "changed its shape";
    if (bytes_of(ta) != bytes_of(tb)) return what + "changed its bytes";
  }
  return "";
}

}  // namespace

std::string check_safetensors(std::string_view bytes) {
  NamedTensors loaded;
  try {
    loaded = load_safetensors_from_memory(bytes, Device::cpu(), "input");
  } catch (const SerializationError&) {
    return "";
  }
  // Loaded tensors come in the order of their data; the writer orders by dtype, then name, so
  // compare after saving twice: the first save may reorder, every later one must not.
  const std::string saved = save_safetensors_to_memory(loaded);
  const NamedTensors reloaded = load_safetensors_from_memory(saved, Device::cpu(), "saved");
  const std::string saved_again = save_safetensors_to_memory(reloaded);
  if (saved_again != saved) return "saving what a save loaded gave different bytes";
  if (std::string d = difference(
          load_safetensors_from_memory(saved_again, Device::cpu(), "saved again"), reloaded);
      !d.empty())
    return "after a save and a load, " + d;
  // Every tensor of the input is in the saved file with the same bytes.
  if (loaded.size() != reloaded.size()) return "a save lost tensors";
  for (const auto& [name, t] : loaded) {
    bool found = false;
    for (const auto& [other_name, other] : reloaded)
      if (other_name == name) {
        found = true;
        if (std::string d = difference({{name, t}}, {{other_name, other}}); !d.empty())
          return "after a save, " + d;
      }
    if (!found) return "a save lost tensor '" + name + "'";
  }
  return "";
}

}  // namespace lazyfuse::fuzz
