// libFuzzer target for the IR text: arbitrary bytes through the parser, then the verifier and
// the printer's round trip (ir_text_check.h). Built with clang by `make fuzz-parser`.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "tests/fuzz/ir_text_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string finding =
      lazyfuse::fuzz::check_ir_text(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!finding.empty()) {
    std::fprintf(stderr, "ir_parser_fuzzer: %s\n", finding.c_str());
    std::abort();
  }
  return 0;
}
