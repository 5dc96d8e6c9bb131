// libFuzzer target for the safetensors loader: arbitrary bytes loaded as a file, which must be
// refused with a SerializationError or survive a save (safetensors_check.h). Built with clang
// by `make fuzz-safetensors`.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>

#include "tests/fuzz/safetensors_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string finding;
  try {
    finding = lazyfuse::fuzz::check_safetensors(
        std::string_view(reinterpret_cast<const char*>(data), size));
  } catch (const std::exception& e) {
    // Only SerializationError may leave the loader; check_safetensors catches that one.
    finding = std::string("an exception that is not a SerializationError: ") + e.what();
  }
  if (!finding.empty()) {
    std::fprintf(stderr, "safetensors_fuzzer: %s\n", finding.c_str());
    std::abort();
  }
  return 0;
}
