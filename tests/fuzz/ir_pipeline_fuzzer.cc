// libFuzzer target past the IR text: graphs that parse and verify, through the pass pipeline
// and both code generators (ir_pipeline_check.h). Built with clang by `make fuzz-pipeline`.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "tests/fuzz/ir_pipeline_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string finding = lazyfuse::fuzz::check_ir_pipeline(
      std::string_view(reinterpret_cast<const char*>(data), size));
  if (!finding.empty()) {
    std::fprintf(stderr, "ir_pipeline_fuzzer: %s\n", finding.c_str());
    std::abort();
  }
  return 0;
}
