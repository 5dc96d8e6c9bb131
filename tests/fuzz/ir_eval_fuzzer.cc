// libFuzzer target through evaluation: small CPU graphs that parse and verify, evaluated fused
// and unfused (ir_eval_check.h). Built with clang by `make fuzz-eval`.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "tests/fuzz/ir_eval_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string finding = lazyfuse::fuzz::check_ir_evaluation(
      std::string_view(reinterpret_cast<const char*>(data), size));
  if (!finding.empty()) {
    std::fprintf(stderr, "ir_eval_fuzzer: %s\n", finding.c_str());
    std::abort();
  }
  return 0;
}
