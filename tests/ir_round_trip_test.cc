// The IR text round-trips at every stage of the pass pipeline: what `lazyfuse opt` prints after
// no pass, after placement, after sink-views, and so on to fusion (each pass in order, on top of
// the ones before) parses, verifies, and prints the same text when the same pass runs on it
// again. Fused IR parses back to the very graph that fusion cut into steps. The IR files of
// examples/ir/ and tests/filecheck/ are checked, and so are the fuzzers' corpora; then the
// kernel region's syntax and its parse errors.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/ir/graph.h"
#include "lazyfuse/ir/passes/passes.h"
#include "lazyfuse/ir/verifier.h"

#ifndef LAZYFUSE_SOURCE_DIR
#error "tests/CMakeLists.txt defines LAZYFUSE_SOURCE_DIR, where the IR files are"
#endif

namespace lazyfuse {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Whether `text` holds anything but comments and space: tests/filecheck/ has files that only
// drive FileCheck over an example's graph.
bool has_ir(const std::string& text) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const size_t first = line.find_first_not_of(" \t\r");
    if (first != std::string::npos && line.compare(first, 2, "//") != 0) return true;
  }
  return false;
}

// What `lazyfuse opt --passes=<passes>` prints: the schedule once fusion ran, else the graph.
std::string run_and_print(Graph graph, const std::vector<std::string>& passes,
                          const PrintOptions& print = {}) {
  PipelineOptions options;
  options.only = passes;
  Schedule schedule = run_pipeline(std::move(graph), options);
  return runs_fusion(options) ? print_schedule(schedule, print)
                              : print_graph(schedule.graph, print);
}

// A file that is meant to fail, where it fails (the name of the pass, or "parse") and how.
struct ExpectedFailure {
  std::string_view file;
  std::string_view stage;
  std::function<bool(const std::exception&)> is_expected;
};

template <typename E>
bool is(const std::exception& e) {
  return dynamic_cast<const E*>(&e) != nullptr;
}

const ExpectedFailure kExpectedFailures[] = {
    {"parse-error.ir", "parse", is<ParseError>},
    {"placement-mismatch.ir", "placement", is<DeviceMismatchError>},
    {"mixed-devices.ir", "placement", is<DeviceMismatchError>},
};

const ExpectedFailure* expected_failure(const fs::path& file) {
  for (const ExpectedFailure& failure : kExpectedFailures)
    if (file.filename() == failure.file) return &failure;
  return nullptr;
}

// Whether a failure at `stage` is allowed: for a file, only the one it is meant to have; for a
// fuzzer's input (`any_typed_error`), any lazyfuse::Error, as the fuzzers themselves allow.
bool allowed_failure(const ExpectedFailure* expected, bool any_typed_error, std::string_view stage,
                     const std::exception& e) {
  if (any_typed_error) return is<Error>(e);
  return expected != nullptr && expected->stage == stage && expected->is_expected(e);
}

// Checks every stage of `text`; returns what went wrong ("" when nothing did). A stage that
// fails as allowed is skipped, and the stages after it run without its pass.
std::string check_stages(const std::string& text, const ExpectedFailure* expected,
                         bool any_typed_error, int* stages_checked, bool* failed_as_expected) {
  Graph graph;
  try {
    graph = parse_graph(text);
    verify(graph);
  } catch (const std::exception& e) {
    if (allowed_failure(expected, any_typed_error, "parse", e)) {
      *failed_as_expected = true;
      return "";
    }
    return std::string("the file does not parse and verify: ") + e.what();
  }
  std::vector<std::string> passes;  // the passes that ran so far
  std::vector<std::string> stages = {""};
  for (std::string_view name : pass_name_list()) stages.emplace_back(name);
  for (const std::string& pass : stages) {
    std::vector<std::string> with_pass = passes;
    if (!pass.empty()) with_pass.push_back(pass);
    const std::string stage = pass.empty() ? "no passes" : "after " + pass;
    std::string printed;
    try {
      printed = run_and_print(graph, with_pass);
    } catch (const std::exception& e) {
      if (allowed_failure(expected, any_typed_error, pass, e)) {
        *failed_as_expected = true;
        continue;
      }
      return stage + ": the pipeline failed: " + e.what();
    }
    passes = with_pass;
    Graph again;
    try {
      again = parse_graph(printed);
      verify(again,
             {.placed = std::find(passes.begin(), passes.end(), "placement") != passes.end()});
    } catch (const std::exception& e) {
      return stage + ": the printed IR does not parse and verify: " + e.what() + "\n" + printed;
    }
    std::string reprinted;
    try {
      reprinted = run_and_print(
          again, pass.empty() ? std::vector<std::string>{} : std::vector<std::string>{pass});
    } catch (const std::exception& e) {
      return stage + ": the pass failed on its own output: " + e.what() + "\n" + printed;
    }
    if (reprinted != printed)
      return stage + ": the same pass again printed other text:\n" + printed + "-----\n" +
             reprinted;
    // Fused IR is the graph that fusion cut into steps, locations and all: fusion changes no node.
    if (pass == "fusion" || pass == "horizontal-fusion") {
      PipelineOptions options;
      options.only = passes;
      Schedule fused = run_pipeline(graph, options);
      const PrintOptions locations{.locations = true};
      const std::string with_locations = print_schedule(fused, locations);
      std::string graph_back;
      try {
        graph_back = print_graph(parse_graph(with_locations), locations);
      } catch (const std::exception& e) {
        return stage + ": the fused IR with locations does not parse: " + e.what() + "\n" +
               with_locations;
      }
      if (graph_back != print_graph(fused.graph, locations))
        return stage + ": the fused IR parses to another graph:\n" + with_locations;
    }
    ++*stages_checked;
  }
  return "";
}

std::vector<fs::path> files_in(const fs::path& dir, std::string_view extension) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.is_regular_file() && (extension.empty() || entry.path().extension() == extension))
      files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  return files;
}

TEST(RoundTrip, EveryIrFileAtEveryStage) {
  const fs::path source(LAZYFUSE_SOURCE_DIR);
  std::vector<fs::path> files = files_in(source / "examples/ir", ".ir");
  const std::vector<fs::path> filecheck = files_in(source / "tests/filecheck", ".ir");
  files.insert(files.end(), filecheck.begin(), filecheck.end());
  ASSERT_GE(files.size(), 15u) << "the IR files went missing";
  int checked_files = 0;
  for (const fs::path& file : files) {
    const std::string text = read_file(file);
    if (!has_ir(text)) continue;
    const ExpectedFailure* expected = expected_failure(file);
    int stages = 0;
    bool failed = false;
    EXPECT_EQ(check_stages(text, expected, /*any_typed_error=*/false, &stages, &failed), "")
        << file;
    // A file meant to fail that no longer does would leave this test checking nothing there.
    if (expected != nullptr)
      EXPECT_TRUE(failed) << file << " no longer fails at " << expected->stage;
    else
      EXPECT_EQ(stages, 7) << file;
    ++checked_files;
  }
  EXPECT_GE(checked_files, 12);
}

// The inputs the fuzzers kept: graphs of every op, shape and wiring the generators reached.
TEST(RoundTrip, FuzzerCorporaAtEveryStage) {
  const fs::path corpora = fs::path(LAZYFUSE_SOURCE_DIR) / "tests/fuzz/corpus";
  int checked = 0;
  for (const char* name : {"ir_parser", "ir_pipeline", "ir_eval"}) {
    for (const fs::path& file : files_in(corpora / name, "")) {
      int stages = 0;
      bool failed = false;
      EXPECT_EQ(check_stages(read_file(file), nullptr, /*any_typed_error=*/true, &stages, &failed),
                "")
          << file;
      checked += stages == 7;
    }
  }
  // Most inputs are valid graphs; far fewer means the corpora went missing.
  EXPECT_GE(checked, 500);
}

// Fusion orders steps, not values: here the kernel of exp and sin comes before the sum of exp
// that sin's number follows, and the constant is recomputed by two kernels.
constexpr char kInterleaved[] = R"(graph @main(%0: f32[4,8] @cpu, %1: f32[8,4] @cpu) {
  %2 = const {value = 2.0} : f32[] @cpu
  %3 = mul %0, %2 : f32[4,8] @cpu
  %4 = sum %3 {dims = [0], keepdim = false} : f32[8] @cpu
  %5 = exp %3 : f32[4,8] @cpu
  %6 = matmul %5, %1 : f32[4,4] @cpu
  %7 = add %6, %2 : f32[4,4] @cpu
  return %4, %7
}
)";

// Fusion's regions, before horizontal fusion shares launches among them.
std::string fused(const std::string& text) {
  PipelineOptions options;
  options.only = std::vector<std::string>{"placement", "sink-views", "cse", "dce", "fusion"};
  return print_schedule(run_pipeline(parse_graph(text), options));
}

// Kernel names are hashes; the tests compare the rest.
std::string without_kernel_names(std::string text) {
  for (size_t at = text.find("@k_"); at != std::string::npos; at = text.find("@k_", at + 1))
    text.replace(at, 11, "@k_X");
  return text;
}

// A kernel's header names its kind, and each member of a non-elementwise kernel says its role:
// what fusion decided, which the backends read. Read back, the same schedule prints.
TEST(RoundTrip, KernelsShowTheirKindAndTheirMembersRoles) {
  const std::string norm_and_linear =
      R"(graph @main(%0: f32[8,16] @cpu, %1: f32[16,4] @cpu, %2: f32[4] @cpu) {
  %3 = mean %0 {dims = [1], keepdim = true} : f32[8,1] @cpu
  %4 = sub %0, %3 : f32[8,16] @cpu
  %5 = mul %4, %4 : f32[8,16] @cpu
  %6 = mean %5 {dims = [1], keepdim = true} : f32[8,1] @cpu
  %7 = const {value = 1e-05} : f32[] @cpu
  %8 = add %6, %7 : f32[8,1] @cpu
  %9 = rsqrt %8 : f32[8,1] @cpu
  %10 = mul %4, %9 : f32[8,16] @cpu
  %11 = matmul %10, %1 : f32[8,4] @cpu
  %12 = add %11, %2 : f32[8,4] @cpu
  %13 = relu %12 : f32[8,4] @cpu
  %14 = sum %13 {dims = [0], keepdim = false} : f32[4] @cpu
  return %13, %14
}
)";
  const std::string text = fused(norm_and_linear);
  EXPECT_EQ(without_kernel_names(text),
            R"(graph @main(%0: f32[8,16] @cpu, %1: f32[16,4] @cpu, %2: f32[4] @cpu) {
  kernel row @k_X(%0) -> (%10) {
    %3 = mean %0 {dims = [1], keepdim = true} : f32[8,1] @cpu  // reduction
    %4 = sub %0, %3 : f32[8,16] @cpu  // prologue
    %5 = mul %4, %4 : f32[8,16] @cpu  // prologue
    %6 = mean %5 {dims = [1], keepdim = true} : f32[8,1] @cpu  // reduction
    %7 = const {value = 1e-05} : f32[] @cpu  // epilogue
    %8 = add %6, %7 : f32[8,1] @cpu  // row value
    %9 = rsqrt %8 : f32[8,1] @cpu  // row value
    %10 = mul %4, %9 : f32[8,16] @cpu  // epilogue
  }
  kernel matmul @k_X(%10, %1, %2) -> (%13) {
    %11 = matmul %10, %1 : f32[8,4] @cpu  // product
    %12 = add %11, %2 : f32[8,4] @cpu  // bias
    %13 = relu %12 : f32[8,4] @cpu  // activation
  }
  %14 = sum %13 {dims = [0], keepdim = false} : f32[4] @cpu
  return %13, %14
}
)");
  EXPECT_EQ(fused(text), text);
  PipelineOptions options;
  options.only = std::vector<std::string>{"fusion"};
  const Schedule schedule = run_pipeline(parse_graph(text), options);
  ASSERT_EQ(schedule.steps.size(), 3u);
  EXPECT_EQ(schedule.steps[0].kind, StepKind::Row);
  EXPECT_EQ(schedule.steps[1].kind, StepKind::Matmul);
  EXPECT_EQ(schedule.steps[2].kind, StepKind::Column);
}

TEST(RoundTrip, KernelsAreRegionsThatDefineNoValues) {
  EXPECT_EQ(without_kernel_names(fused(kInterleaved)),
            R"(graph @main(%0: f32[4,8] @cpu, %1: f32[8,4] @cpu) {
  %2 = const {value = 2.0} : f32[] @cpu
  kernel elementwise @k_X(%0) -> (%3, %5) {
    %3 = mul %0, %2 : f32[4,8] @cpu
    %5 = exp %3 : f32[4,8] @cpu
  }
  %4 = sum %3 {dims = [0], keepdim = false} : f32[8] @cpu
  %6 = matmul %5, %1 : f32[4,4] @cpu
  kernel elementwise @k_X(%6) -> (%7) {
    %7 = add %6, %2 : f32[4,4] @cpu
  }
  return %4, %7
}
)");
  const Graph original = parse_graph(kInterleaved);
  const Graph back = parse_graph(fused(kInterleaved));
  EXPECT_EQ(print_graph(back), print_graph(original));
  EXPECT_EQ(fused(print_graph(back)), fused(kInterleaved));
}

TEST(RoundTrip, AConstantInOneKernelPrintsInsideIt) {
  const std::string text = fused(R"(graph @main(%0: f32[3] @cpu, %1: f32[3] @cpu) {
  %2 = const {value = 2.0} : f32[] @cpu
  %3 = add %0, %2 : f32[3] @cpu
  %4 = exp %3 : f32[3] @cpu
  %5 = mul %4, %1 : f32[3] @cpu
  return %5
})");
  EXPECT_EQ(without_kernel_names(text), R"(graph @main(%0: f32[3] @cpu, %1: f32[3] @cpu) {
  kernel elementwise @k_X(%0, %1) -> (%5) {
    %2 = const {value = 2.0} : f32[] @cpu
    %3 = add %0, %2 : f32[3] @cpu
    %4 = exp %3 : f32[3] @cpu
    %5 = mul %4, %1 : f32[3] @cpu
  }
  return %5
}
)");
}

// A returned scalar constant is a step of its own, and the kernel that multiplies by it
// recomputes it too: the constant prints once, before the first of the two, and its own
// kernel's region is left empty.
TEST(RoundTrip, AReturnedConstantThatAKernelAlsoUses) {
  constexpr char kText[] = R"(graph @main(%0: f32[3] @cpu) {
  %1 = const {value = 3.0} : f32[] @cpu
  %2 = mul %0, %1 : f32[3] @cpu
  return %2, %1
})";
  const std::string text = fused(kText);
  EXPECT_EQ(print_graph(parse_graph(text)), print_graph(parse_graph(kText)));
  EXPECT_EQ(fused(text), text);
  EXPECT_THAT(text, HasSubstr("-> (%1) {"));
}

// With dce left out, a scalar constant that nothing uses belongs to no step; it still prints.
TEST(RoundTrip, AnUnusedConstantWithoutDce) {
  constexpr char kText[] = R"(graph @main(%0: f32[3] @cpu) {
  %1 = const {value = 3.0} : f32[] @cpu
  %2 = exp %0 : f32[3] @cpu
  return %2
})";
  const std::string text = run_and_print(parse_graph(kText), {"fusion"});
  EXPECT_EQ(print_graph(parse_graph(text)), print_graph(parse_graph(kText)));
  EXPECT_EQ(run_and_print(parse_graph(text), {"fusion"}), text);
}

TEST(RoundTrip, LocationsAndQuotedNamesSurviveTheFusedForm) {
  constexpr char kText[] = R"(graph @"my graph"(%0: f32[3] @cpu loc("a.cc":1:2)) {
  %1 = exp %0 : f32[3] @cpu loc("a.cc":3:4)
  %2 = sin %1 : f32[3] @cpu loc("b.cc":5:6)
  return %2
})";
  const PrintOptions locations{.locations = true};
  const std::string text = print_schedule(run_pipeline(parse_graph(kText), {}), locations);
  EXPECT_THAT(text, HasSubstr("graph @\"my graph\"(%0: f32[3] @cpu loc(\"a.cc\":1:2)) {"));
  EXPECT_EQ(print_graph(parse_graph(text), locations), print_graph(parse_graph(kText), locations));
}

TEST(RoundTrip, NoPassesPrintsTheGraphAsItWas) {
  // Not even the scalar constant's placement: nothing ran.
  constexpr char kText[] = R"(graph @main(%0: f32[3] @cuda:0) {
  %1 = const {value = 2.0} : f32[] @cpu
  %2 = add %0, %1 : f32[3] @cuda:0
  return %2
}
)";
  EXPECT_EQ(run_and_print(parse_graph(kText), {}), kText);
  // Without `only`, every pass runs.
  Schedule all = run_pipeline(parse_graph(kText), {});
  EXPECT_EQ(all.graph.nodes[1].device, Device("cuda:0"));
  EXPECT_EQ(all.num_kernels(), 1);
}

TEST(RoundTrip, NoPassesStillVerifies) {
  PipelineOptions options;
  options.only.emplace();
  EXPECT_THROW(run_pipeline(parse_graph("graph @main(%0: f32[3] @cpu) {\n"
                                        "  %1 = add %0, %0 : f32[4] @cpu\n  return %1\n}\n"),
                            options),
               VerifierError);
}

// Hand-written fused IR: definitions in schedule order parse to the graph in number order.
TEST(RoundTrip, ParsesDefinitionsOutOfNumberOrder) {
  const Graph g = parse_graph(R"(graph @main(%0: f32[3] @cpu) {
  kernel @k_1(%0) -> (%1, %3) {
    %1 = exp %0 : f32[3] @cpu
    %3 = sin %1 : f32[3] @cpu
  }
  %2 = sum %1 {dims = [0], keepdim = false} : f32[] @cpu
  return %2, %3
})");
  ASSERT_EQ(g.nodes.size(), 4u);
  EXPECT_EQ(g.nodes[1].op, Op::Exp);
  EXPECT_EQ(g.nodes[2].op, Op::Sum);
  EXPECT_EQ(g.nodes[3].op, Op::Sin);
  EXPECT_EQ(g.nodes[3].inputs, std::vector<ValueId>{1});
  EXPECT_NO_THROW(verify(g));
}

struct KernelErrorCase {
  const char* text;
  const char* message;  // the whole what()
};

class RoundTripKernelParseErrorTest : public ::testing::TestWithParam<KernelErrorCase> {};

TEST_P(RoundTripKernelParseErrorTest, ReportsMessageAndPosition) {
  const KernelErrorCase& c = GetParam();
  try {
    parse_graph(c.text);
    FAIL() << "parsed without error:\n" << c.text;
  } catch (const ParseError& e) {
    EXPECT_EQ(std::string(e.what()), c.message) << "in:\n" << c.text;
    const std::string prefix =
        std::to_string(e.line()) + ":" + std::to_string(e.column()) + ": error: ";
    EXPECT_THAT(e.what(), ::testing::StartsWith(prefix));
  }
}

#define HEADER "graph @main(%0: f32[3] @cpu, %1: f32[3] @cpu) {\n"
#define EXP "    %2 = exp %0 : f32[3] @cpu\n"
#define END "  }\n  return %2\n}\n"

INSTANTIATE_TEST_SUITE_P(
    Errors, RoundTripKernelParseErrorTest,
    ::testing::Values(
        KernelErrorCase{HEADER "  kernel @k_1(%0, %5) -> (%2) {\n" EXP END,
                        "2:19: error: kernel operand %5 is not defined before the kernel"},
        KernelErrorCase{HEADER "  kernel @k_1(%0, %0) -> (%2) {\n" EXP END,
                        "2:19: error: kernel operand %0 is listed twice"},
        KernelErrorCase{HEADER "  kernel @k_1(%0) -> (%3) {\n" EXP END,
                        "2:23: error: kernel result %3 is not computed in the kernel"},
        KernelErrorCase{HEADER "  kernel @k_1(%0) -> (%2, %1) {\n" EXP END,
                        "2:27: error: kernel result %1 is not computed in the kernel"},
        KernelErrorCase{HEADER "  kernel @k_1(%0) -> (%2, %2) {\n" EXP END,
                        "2:27: error: kernel result %2 is listed twice"},
        KernelErrorCase{HEADER
                        "  kernel @k_1(%0) -> (%2) {\n    %2 = add %0, %1 : f32[3] @cpu\n" END,
                        "3:18: error: kernel @k_1 reads %1, which is neither one of its operands "
                        "nor computed in it"},
        KernelErrorCase{HEADER "  kernel @k_1(%0) (%2) {\n" EXP END,
                        "2:19: error: expected '->' and the kernel's results"},
        KernelErrorCase{HEADER "  kernel k_1(%0) -> (%2) {\n" EXP END,
                        "2:10: error: expected a kernel kind (elementwise, reduction, row, ...) "
                        "or '@' and the kernel's name, not 'k_1'"},
        KernelErrorCase{HEADER "  kernel elementwise k_1(%0) -> (%2) {\n" EXP END,
                        "2:22: error: expected '@' and the kernel's name"},
        KernelErrorCase{HEADER "  kernel @(%0) -> (%2) {\n" EXP END,
                        "2:10: error: expected the kernel's name after '@'"},
        KernelErrorCase{HEADER "  kernel @k_1(%0) -> (%2) {\n" EXP "    return %2\n}\n",
                        "4:5: error: expected a value definition '%N = ...' or '}' to end the "
                        "kernel"},
        KernelErrorCase{HEADER "  kernel @k_1(%0) -> (%2) {\n" EXP
                               "    %2 = sin %0 : f32[3] @cpu\n" END,
                        "4:5: error: redefinition of value %2"},
        // The numbering runs without gaps, whatever the order of the text.
        KernelErrorCase{HEADER "  kernel @k_1(%0) -> (%3) {\n    %3 = exp %0 : f32[3] @cpu\n"
                               "  }\n  return %3\n}\n",
                        "3:5: error: value %3 defined out of order (expected %2)"},
        KernelErrorCase{HEADER "  %4 = neg %0 : f32[3] @cpu\n  %2 = neg %0 : f32[3] @cpu\n"
                               "  return %2\n}\n",
                        "2:3: error: value %4 defined out of order (expected %3)"},
        // Operands are numbered below their users, so the graph is in SSA order.
        KernelErrorCase{HEADER "  %3 = neg %0 : f32[3] @cpu\n  %2 = neg %3 : f32[3] @cpu\n"
                               "  return %2\n}\n",
                        "3:12: error: operand %3 of %2 has a larger number than its user "
                        "(operands are numbered below their users)"}));

#undef HEADER
#undef EXP
#undef END

}  // namespace
}  // namespace lazyfuse
