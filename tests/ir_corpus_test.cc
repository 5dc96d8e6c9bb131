// Replays the fuzzers' committed corpora (tests/fuzz/corpus/ir_parser, ir_pipeline and ir_eval)
// through the same checks as the libFuzzer targets, with the normal toolchain: every input a
// fuzzer kept, and every input that once broke the parser, the passes or evaluation, is run
// again by every build of the suite (under ASan and UBSan in `make test-asan`).
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "gtest/gtest.h"
#include "tests/fuzz/ir_eval_check.h"
#include "tests/fuzz/ir_pipeline_check.h"
#include "tests/fuzz/ir_text_check.h"

namespace lazyfuse::fuzz {
namespace {

// The files of a committed corpus, by name.
std::vector<std::filesystem::path> corpus(const std::string& name) {
  const std::filesystem::path dir =
      std::filesystem::path(LAZYFUSE_SOURCE_DIR) / "tests/fuzz/corpus" / name;
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    if (entry.is_regular_file()) files.push_back(entry.path());
  return files;
}

// What `check` finds in `file`; an exception that is not a lazyfuse::Error is a finding too.
std::string finding_in(const std::filesystem::path& file, std::string (*check)(std::string_view)) {
  std::ifstream in(file, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  try {
    return check(text.str());
  } catch (const std::exception& e) {
    return std::string("an exception that is not a lazyfuse::Error: ") + e.what();
  }
}

TEST(IrCorpus, EveryInputPassesTheFuzzersChecks) {
  const std::vector<std::filesystem::path> files = corpus("ir_parser");
  // The hand-written seeds alone are a few dozen; far fewer means the corpus went missing.
  ASSERT_GE(files.size(), 20u);
  for (const std::filesystem::path& file : files)
    EXPECT_EQ(finding_in(file, check_ir_text), "") << file;
}

TEST(IrCorpus, EveryInputPassesThePipelineFuzzersChecks) {
  const std::vector<std::filesystem::path> files = corpus("ir_pipeline");
  ASSERT_GE(files.size(), 20u);
  for (const std::filesystem::path& file : files)
    EXPECT_EQ(finding_in(file, check_ir_pipeline), "") << file;
}

TEST(IrCorpus, EveryInputPassesTheEvaluationFuzzersChecks) {
  const std::vector<std::filesystem::path> files = corpus("ir_eval");
  ASSERT_GE(files.size(), 20u);
  for (const std::filesystem::path& file : files)
    EXPECT_EQ(finding_in(file, check_ir_evaluation), "") << file;
}

}  // namespace
}  // namespace lazyfuse::fuzz
