// Replays the IR text fuzzer's committed corpus (tests/fuzz/corpus/ir_parser) through the same
// checks as the libFuzzer target, with the normal toolchain: every input the fuzzer kept, and
// every input that once broke the parser, is run again by every build of the suite.
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/fuzz/ir_text_check.h"

namespace lazyfuse::fuzz {
namespace {

TEST(IrCorpus, EveryInputPassesTheFuzzersChecks) {
  const std::filesystem::path dir =
      std::filesystem::path(LAZYFUSE_SOURCE_DIR) / "tests/fuzz/corpus/ir_parser";
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    if (entry.is_regular_file()) files.push_back(entry.path());
  // The hand-written seeds alone are a few dozen; far fewer means the corpus went missing.
  ASSERT_GE(files.size(), 20u) << dir;
  for (const std::filesystem::path& file : files) {
    std::ifstream in(file, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    std::string finding;
    try {
      finding = check_ir_text(text.str());
    } catch (const std::exception& e) {
      finding = std::string("an exception that is not a lazyfuse::Error: ") + e.what();
    }
    EXPECT_EQ(finding, "") << file;
  }
}

}  // namespace
}  // namespace lazyfuse::fuzz
