// Golden files of generated code: each tests/golden/<name>.ir is lowered with run_pipeline, and
// the CUDA source of every kernel step and the CPU program listing of every step that has one
// are compared with tests/golden/<name>.cu and tests/golden/<name>.cpu.txt. A change to codegen
// then shows up as a reviewable diff of those files instead of passing unnoticed.
//
// To regenerate the golden files after an intended change, run
//   UPDATE_GOLDEN=1 build/bin/lazyfuse_tests --gtest_filter='Golden*'
// and review `git diff tests/golden`. Without UPDATE_GOLDEN a mismatch fails, names the first
// differing line and writes the generated text next to the test's temporary files for `diff -u`.
//
// The .cu files leave out the prologue every kernel starts with (cuda_prologue(): helpers and
// Philox), so that they hold only what each kernel adds; the prologue is checked to be there.
// Operand addresses are fixed (inputs at 4096, outputs at 8192, as in cuda_codegen_test.cc), so
// the vectorized variant is chosen wherever the layout allows it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "lazyfuse/codegen/cpu/cpu_program.h"
#include "lazyfuse/codegen/cuda/cuda_codegen.h"
#include "lazyfuse/ir/passes/passes.h"

#ifndef LAZYFUSE_SOURCE_DIR
#error "tests/CMakeLists.txt defines LAZYFUSE_SOURCE_DIR, where the golden files are"
#endif

namespace lazyfuse {
namespace {

namespace fs = std::filesystem;

fs::path golden_dir() { return fs::path(LAZYFUSE_SOURCE_DIR) / "tests" / "golden"; }

bool update_golden() {
  const char* update = std::getenv("UPDATE_GOLDEN");
  return update != nullptr && std::string_view(update) == "1";
}

std::string read_file(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

// One golden case: the .ir file's name, and the params laid out with reversed strides (a
// transposed read), since the IR text says nothing about how a param lies in memory.
struct GoldenCase {
  std::string name;
  std::set<ValueId> transposed_params;
};

// gtest names a failing parameter by this instead of its bytes.
void PrintTo(const GoldenCase& c, std::ostream* os) { *os << c.name; }

const std::vector<GoldenCase>& golden_cases() {
  static const std::vector<GoldenCase> cases = {
      {"seed", {}},    {"bias_relu_strided", {0}}, {"half_chain", {}}, {"sum_squares", {}},
      {"softmax", {}},
  };
  return cases;
}

// The source without the common prologue. Fast math puts a #define before it, which stays.
std::string strip_prologue(const CudaSource& source) {
  const std::string& prologue = cuda_prologue();
  const size_t at = source.source.find(prologue);
  EXPECT_NE(at, std::string::npos) << source.kernel_name << " does not contain the prologue";
  if (at == std::string::npos) return source.source;
  return source.source.substr(0, at) + source.source.substr(at + prologue.size());
}

// What the CUDA executor generates for `step`, with operands at fixed addresses.
std::optional<CudaSource> generate_cuda(const Schedule& schedule, const Step& step,
                                        const std::set<ValueId>& transposed) {
  const Graph& graph = schedule.graph;
  if (step.kind != StepKind::Elementwise && !is_reduction_kind(step.kind)) return std::nullopt;
  std::vector<OperandLayout> layouts;
  for (ValueId v : step.inputs) {
    const Node& node = graph.nodes[v];
    Strides strides = contiguous_strides(node.shape);
    if (transposed.contains(v)) std::reverse(strides.begin(), strides.end());
    layouts.push_back({4096, dtype_size(node.dtype), node.shape, strides});
  }
  if (step.kind == StepKind::Elementwise) {
    std::vector<uint64_t> outputs(step.outputs.size(), 8192);
    std::vector<int64_t> sizes;
    for (ValueId v : step.outputs) sizes.push_back(dtype_size(graph.nodes[v].dtype));
    CudaElementwiseLaunch plan = plan_cuda_elementwise(step, layouts, outputs, sizes);
    return generate_cuda_elementwise(graph, step, plan.spec);
  }
  // A reduction reads its operands element by element: never the vector variant.
  CudaElementwiseLaunch plan = plan_cuda_elementwise(step, layouts, {}, {});
  plan.spec.vectorized = false;
  return generate_cuda_step(graph, step, plan.spec);
}

struct Generated {
  std::string cuda;
  std::string cpu;
};

Generated generate(const GoldenCase& c) {
  const std::string ir = read_file(golden_dir() / (c.name + ".ir"));
  Schedule schedule = run_pipeline(parse_graph(ir), {});
  const std::string header =
      absl::StrCat("// Generated from tests/golden/", c.name,
                   ".ir by tests/golden_test.cc; regenerate with UPDATE_GOLDEN=1.\n");
  Generated out{absl::StrCat(header, "// The common prologue (cuda_prologue()) is left out.\n"),
                header};
  for (size_t i = 0; i < schedule.steps.size(); ++i) {
    const Step& step = schedule.steps[i];
    const std::string title =
        absl::StrCat("// ----- step ", i, ": ", step_kind_name(step.kind), " -----\n");
    if (std::optional<CudaSource> source = generate_cuda(schedule, step, c.transposed_params)) {
      absl::StrAppend(&out.cuda, "\n", title, "// kernel ", source->kernel_name, "\n",
                      strip_prologue(*source));
    }
    absl::StrAppend(&out.cpu, "\n", title, cpu_step_listing(schedule.graph, step));
  }
  return out;
}

// Compares `actual` with the golden file, or rewrites the file under UPDATE_GOLDEN=1.
void check_golden(const std::string& file_name, const std::string& actual) {
  const fs::path path = golden_dir() / file_name;
  if (update_golden()) {
    std::ofstream(path, std::ios::binary) << actual;
    std::cout << "[ UPDATED  ] " << path.string() << "\n";
    return;
  }
  ASSERT_TRUE(fs::exists(path)) << path << " is missing; run with UPDATE_GOLDEN=1 to create it";
  const std::string expected = read_file(path);
  if (expected == actual) return;
  // Where they first differ, and the whole generated text as a file to diff against.
  std::vector<std::string> want = absl::StrSplit(expected, '\n');
  std::vector<std::string> got = absl::StrSplit(actual, '\n');
  size_t line = 0;
  while (line < want.size() && line < got.size() && want[line] == got[line]) ++line;
  const fs::path actual_path = fs::path(::testing::TempDir()) / (file_name + ".actual");
  std::ofstream(actual_path, std::ios::binary) << actual;
  ADD_FAILURE() << path.string() << " differs from the generated text at line " << line + 1
                << ":\n  golden:    " << (line < want.size() ? want[line] : "<end of file>")
                << "\n  generated: " << (line < got.size() ? got[line] : "<end of file>")
                << "\nSee: diff -u " << path.string() << " " << actual_path.string()
                << "\nIf the change is intended, rerun with UPDATE_GOLDEN=1 and review git diff.";
}

TEST(Golden, EveryIrFileHasACase) {
  std::set<std::string> names;
  for (const GoldenCase& c : golden_cases()) names.insert(c.name);
  int files = 0;
  for (const fs::directory_entry& entry : fs::directory_iterator(golden_dir())) {
    if (entry.path().extension() != ".ir") continue;
    ++files;
    EXPECT_TRUE(names.contains(entry.path().stem().string()))
        << entry.path() << " has no entry in golden_cases()";
  }
  EXPECT_EQ(files, static_cast<int>(names.size()));
}

class GoldenFiles : public ::testing::TestWithParam<GoldenCase> {};

TEST_P(GoldenFiles, CudaSourceAndCpuListingMatch) {
  const GoldenCase& c = GetParam();
  Generated generated = generate(c);
  // Generation is deterministic: a second run gives the same text (else no golden could hold).
  Generated again = generate(c);
  EXPECT_EQ(generated.cuda, again.cuda);
  EXPECT_EQ(generated.cpu, again.cpu);
  check_golden(c.name + ".cu", generated.cuda);
  check_golden(c.name + ".cpu.txt", generated.cpu);
}

INSTANTIATE_TEST_SUITE_P(Golden, GoldenFiles, ::testing::ValuesIn(golden_cases()),
                         [](const ::testing::TestParamInfo<GoldenCase>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace lazyfuse
