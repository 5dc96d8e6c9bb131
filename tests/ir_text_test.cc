// IR text: print -> parse -> print round trips, the exact printed format, tolerant parsing of
// hand-written text, and the parser's error messages with their positions.
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/ir/graph.h"
#include "lazyfuse/ir/verifier.h"

namespace lazyfuse {
namespace {

using ::testing::HasSubstr;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNan = std::numeric_limits<double>::quiet_NaN();

Node make_node(Op op, DType dtype, Shape shape, Device device, std::vector<ValueId> inputs = {},
               Attrs attrs = {}) {
  Node node;
  node.op = op;
  node.dtype = dtype;
  node.shape = std::move(shape);
  node.device = device;
  node.inputs = std::move(inputs);
  node.attrs = std::move(attrs);
  return node;
}

Attrs attrs_of(std::initializer_list<std::pair<std::string_view, AttrValue>> entries) {
  Attrs attrs;
  for (const auto& [key, value] : entries) attrs.set(key, value);
  return attrs;
}

// Attrs' operator== says nan != nan, and 0.0 == -0.0; the text must keep both apart exactly.
bool same_attr_value(const AttrValue& a, const AttrValue& b) {
  const double* da = std::get_if<double>(&a);
  const double* db = std::get_if<double>(&b);
  if (da == nullptr || db == nullptr) return a == b;
  if (std::signbit(*da) != std::signbit(*db)) return false;
  if (std::isnan(*da) || std::isnan(*db)) return std::isnan(*da) && std::isnan(*db);
  return *da == *db;
}

void expect_same_attrs(const Attrs& a, const Attrs& b, size_t node) {
  ASSERT_EQ(a.entries().size(), b.entries().size()) << "node %" << node;
  for (size_t k = 0; k < a.entries().size(); ++k) {
    EXPECT_EQ(a.entries()[k].first, b.entries()[k].first) << "node %" << node;
    EXPECT_TRUE(same_attr_value(a.entries()[k].second, b.entries()[k].second))
        << "node %" << node << " attribute " << a.entries()[k].first;
  }
}

void expect_same_graph(const Graph& original, const Graph& parsed, bool with_locations) {
  EXPECT_EQ(original.name, parsed.name);
  EXPECT_EQ(original.outputs, parsed.outputs);
  ASSERT_EQ(original.nodes.size(), parsed.nodes.size());
  for (size_t i = 0; i < original.nodes.size(); ++i) {
    const Node& a = original.nodes[i];
    const Node& b = parsed.nodes[i];
    EXPECT_EQ(a.op, b.op) << "node %" << i;
    EXPECT_EQ(a.dtype, b.dtype) << "node %" << i;
    EXPECT_EQ(a.shape, b.shape) << "node %" << i;
    EXPECT_EQ(a.device, b.device) << "node %" << i;
    EXPECT_EQ(a.inputs, b.inputs) << "node %" << i;
    expect_same_attrs(a.attrs, b.attrs, i);
    if (with_locations && a.where.known()) {
      ASSERT_TRUE(b.where.known()) << "node %" << i;
      EXPECT_STREQ(a.where.file, b.where.file) << "node %" << i;
      EXPECT_EQ(a.where.line, b.where.line) << "node %" << i;
      EXPECT_EQ(a.where.column, b.where.column) << "node %" << i;
    } else {
      EXPECT_FALSE(b.where.known()) << "node %" << i;
    }
  }
}

// print -> parse -> print is the identity on the text, and parse recovers every field.
void expect_round_trip(const Graph& graph, const PrintOptions& options = {}) {
  std::string text = print_graph(graph, options);
  Graph parsed;
  try {
    parsed = parse_graph(text);
  } catch (const ParseError& e) {
    FAIL() << e.what() << "\nin:\n" << text;
  }
  EXPECT_EQ(print_graph(parsed, options), text);
  expect_same_graph(graph, parsed, options.locations);
}

// The graph of the documented example.
Graph example_graph() {
  Graph g;
  g.add(make_node(Op::Param, DType::Float32, {3}, Device::cpu()));
  g.add(make_node(Op::Param, DType::Float32, {3}, Device("cuda:0")));
  g.add(make_node(Op::Const, DType::Float32, {}, Device::cpu(), {}, attrs_of({{"value", 2.0}})));
  g.add(make_node(Op::Add, DType::Float32, {3}, Device::cpu(), {0, 2}));
  g.add(make_node(Op::Sum, DType::Float32, {}, Device::cpu(), {3},
                  attrs_of({{"keepdim", false}, {"dims", std::vector<int64_t>{0}}})));
  g.add(make_node(Op::Permute, DType::Float32, {3}, Device("cuda:0"), {1},
                  attrs_of({{"dims", std::vector<int64_t>{1, 0}}})));
  g.outputs = {3, 4};
  return g;
}

constexpr char kExampleText[] =
    "graph @main(%0: f32[3] @cpu, %1: f32[3] @cuda:0) {\n"
    "  %2 = const {value = 2.0} : f32[] @cpu\n"
    "  %3 = add %0, %2 : f32[3] @cpu\n"
    "  %4 = sum %3 {dims = [0], keepdim = false} : f32[] @cpu\n"
    "  %5 = permute %1 {dims = [1, 0]} : f32[3] @cuda:0\n"
    "  return %3, %4\n"
    "}\n";

TEST(IrTextTest, PrintsTheDocumentedFormat) {
  EXPECT_EQ(print_graph(example_graph()), kExampleText);
  expect_round_trip(example_graph());
}

TEST(IrTextTest, ParsesTheDocumentedFormat) {
  expect_same_graph(example_graph(), parse_graph(kExampleText), false);
}

TEST(IrTextTest, EmptyGraph) {
  Graph g;
  EXPECT_EQ(print_graph(g), "graph @main() {\n  return\n}\n");
  expect_round_trip(g);
}

TEST(IrTextTest, GraphWithoutParamsOrOutputs) {
  Graph g;
  g.name = "gen";
  g.add(make_node(Op::Arange, DType::Int64, {5}, Device("cuda:1"), {},
                  attrs_of({{"start", int64_t{0}}, {"step", int64_t{1}}})));
  EXPECT_EQ(print_graph(g),
            "graph @gen() {\n"
            "  %0 = arange {start = 0, step = 1} : i64[5] @cuda:1\n"
            "  return\n"
            "}\n");
  expect_round_trip(g);
}

TEST(IrTextTest, RoundTripsEveryOpDTypeAndDevice) {
  const Device devices[] = {Device::cpu(), Device("cuda"), Device("cuda:0"), Device("cuda:1"),
                            Device("cuda:12")};
  const Shape shapes[] = {{}, {0}, {1}, {2, 3}, {4, 1, 5}, {1024, 1024}};
  Graph g;
  g.name = "every_op";
  g.add(make_node(Op::Param, DType::Float32, {2, 3}, Device("cuda:1")));
  g.add(make_node(Op::Param, DType::Bool, {}, Device::cpu()));
  g.add(make_node(Op::Param, DType::BFloat16, {7}, Device("cuda")));
  int k = 0;
  for (int i = 0; i < kNumOps; ++i) {
    Op op = static_cast<Op>(i);
    if (op == Op::Param) continue;
    std::vector<ValueId> inputs;
    // A variadic op (cat) with three operands.
    for (int a = 0; a < (op_arity(op) == kVariadic ? 3 : op_arity(op)); ++a)
      inputs.push_back(static_cast<ValueId>((k + a * 2) % g.nodes.size()));
    Attrs attrs;
    if (is_reduction(op))
      attrs = attrs_of({{"dims", std::vector<int64_t>{-1, 0}}, {"keepdim", k % 2 == 0}});
    if (op == Op::Narrow) attrs = attrs_of({{"dim", int64_t{-2}}, {"start", int64_t{3}}});
    if (is_index(op)) attrs = attrs_of({{"dim", int64_t{-1}}});
    if (op == Op::Rand || op == Op::Randn)
      attrs = attrs_of({{"seed", int64_t{1234567890123}}, {"offset", int64_t{0}}});
    if (op == Op::Expand || op == Op::Reshape) attrs = attrs_of({{"dims", std::vector<int64_t>{}}});
    g.add(make_node(op, kAllDTypes[k % std::size(kAllDTypes)], shapes[k % std::size(shapes)],
                    devices[k % std::size(devices)], std::move(inputs), std::move(attrs)));
    ++k;
  }
  g.outputs = {0, static_cast<ValueId>(g.nodes.size() - 1), 5, 5};
  expect_round_trip(g);
  // Every op's mnemonic appears in the text.
  std::string text = print_graph(g);
  for (int i = 1; i < kNumOps; ++i)
    EXPECT_THAT(text, HasSubstr(std::string(op_name(static_cast<Op>(i)))));
}

TEST(IrTextTest, RoundTripsAttributeValues) {
  const double doubles[] = {2.0,
                            -0.5,
                            0.1,
                            1.0 / 3.0,
                            100.0,
                            1e20,
                            1e-7,
                            123456789.125,
                            0.0,
                            -0.0,
                            kInf,
                            -kInf,
                            kNan,
                            -kNan,
                            std::numeric_limits<double>::min(),
                            std::numeric_limits<double>::denorm_min(),
                            -std::numeric_limits<double>::denorm_min(),
                            std::numeric_limits<double>::max(),
                            std::numeric_limits<double>::lowest(),
                            std::numeric_limits<double>::epsilon()};
  const int64_t ints[] = {
      0, 1, -1, 42, std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min()};
  Graph g;
  for (double d : doubles)
    g.add(make_node(Op::Const, DType::Float64, {}, Device::cpu(), {}, attrs_of({{"value", d}})));
  for (int64_t i : ints)
    g.add(make_node(Op::Const, DType::Int64, {}, Device::cpu(), {}, attrs_of({{"value", i}})));
  g.add(make_node(Op::Const, DType::Bool, {}, Device::cpu(), {}, attrs_of({{"value", true}})));
  g.add(make_node(
      Op::Sum, DType::Int64, {}, Device::cpu(), {0},
      attrs_of({{"dims", std::vector<int64_t>{std::numeric_limits<int64_t>::min(), -3, 0, 7}},
                {"keepdim", true}})));
  g.add(make_node(Op::Arange, DType::Float32, {4}, Device("cuda:1"), {},
                  attrs_of({{"start", -2.5}, {"step", 0.25}})));
  g.outputs = {static_cast<ValueId>(g.nodes.size() - 1)};
  expect_round_trip(g);
}

// Doubles print in their shortest round-tripping form, always readable as a float.
TEST(IrTextTest, PrintsDoublesShortestAndAsFloats) {
  auto printed = [](AttrValue value) {
    Graph g;
    g.add(
        make_node(Op::Const, DType::Float32, {}, Device::cpu(), {}, attrs_of({{"value", value}})));
    std::string text = print_graph(g);
    size_t begin = text.find("value = ") + 8;
    return text.substr(begin, text.find('}', begin) - begin);
  };
  EXPECT_EQ(printed(2.0), "2.0");
  EXPECT_EQ(printed(100.0), "100.0");
  EXPECT_EQ(printed(-0.0), "-0.0");
  EXPECT_EQ(printed(0.1), "0.1");
  EXPECT_EQ(printed(-1.5), "-1.5");
  EXPECT_EQ(printed(1e20), "1e+20");
  EXPECT_EQ(printed(1e-7), "1e-07");
  EXPECT_EQ(printed(std::numeric_limits<double>::denorm_min()), "5e-324");
  EXPECT_EQ(printed(kInf), "inf");
  EXPECT_EQ(printed(-kInf), "-inf");
  EXPECT_EQ(printed(kNan), "nan");
  EXPECT_EQ(printed(int64_t{2}), "2");
  EXPECT_EQ(printed(false), "false");
  EXPECT_EQ(printed(std::vector<int64_t>{}), "[]");
  EXPECT_EQ(printed(std::vector<int64_t>{1, -2}), "[1, -2]");
}

TEST(IrTextTest, IntegerAndFloatAttributesStayDistinct) {
  Graph g = parse_graph(
      "graph @main() {\n"
      "  %0 = const {value = 2} : i64[] @cpu\n"
      "  %1 = const {value = 2.0} : f32[] @cpu\n"
      "  %2 = const {value = 2e0} : f32[] @cpu\n"
      "  %3 = const {value = -infinity} : f32[] @cpu\n"
      "  return\n"
      "}\n");
  EXPECT_TRUE(std::holds_alternative<int64_t>(g.nodes[0].attrs.get("value")));
  EXPECT_EQ(g.nodes[0].attrs.get_int("value"), 2);
  EXPECT_TRUE(std::holds_alternative<double>(g.nodes[1].attrs.get("value")));
  EXPECT_EQ(g.nodes[1].attrs.get_float("value"), 2.0);
  EXPECT_TRUE(std::holds_alternative<double>(g.nodes[2].attrs.get("value")));
  EXPECT_EQ(g.nodes[3].attrs.get_float("value"), -kInf);
}

TEST(IrTextTest, QuotesGraphNamesThatAreNotIdentifiers) {
  for (std::string name : {"main", "f.x$1", "_x", "two words", "9lives", "", "a\"b\\c\n"}) {
    Graph g;
    g.name = name;
    expect_round_trip(g);
  }
  Graph g;
  g.name = "two words";
  EXPECT_EQ(print_graph(g), "graph @\"two words\"() {\n  return\n}\n");
}

Graph located_graph() {
  Graph g = example_graph();
  g.nodes[0].where = {"model.py", 3, 5};
  g.nodes[2].where = {"walkthrough.cc", 42, 0};
  g.nodes[3].where = {"/home/u//src/walkthrough.cc", 43, 17};
  g.nodes[4].where = {"C:\\src\\odd \"name\".cc", 4000000000u, 1};
  // Origins that are not known print nothing: a line of 0 (node 1) or no file (node 5).
  g.nodes[1].where = {"ignored.cc", 0, 3};
  return g;
}

TEST(IrTextTest, PrintsLocationsOnlyWhenAskedAndKnown) {
  Graph g = located_graph();
  EXPECT_EQ(print_graph(g), kExampleText);
  EXPECT_EQ(print_graph(g, {.locations = true}),
            "graph @main(%0: f32[3] @cpu loc(\"model.py\":3:5), %1: f32[3] @cuda:0) {\n"
            "  %2 = const {value = 2.0} : f32[] @cpu loc(\"walkthrough.cc\":42:0)\n"
            "  %3 = add %0, %2 : f32[3] @cpu loc(\"/home/u//src/walkthrough.cc\":43:17)\n"
            "  %4 = sum %3 {dims = [0], keepdim = false} : f32[] @cpu "
            "loc(\"C:\\\\src\\\\odd \\\"name\\\".cc\":4000000000:1)\n"
            "  %5 = permute %1 {dims = [1, 0]} : f32[3] @cuda:0\n"
            "  return %3, %4\n"
            "}\n");
}

TEST(IrTextTest, RoundTripsLocations) {
  expect_round_trip(located_graph(), {.locations = true});
  // Without locations in the text, the parsed graph has none.
  expect_round_trip(located_graph(), {.locations = false});
}

TEST(IrTextTest, InternsFileNamesForTheProcess) {
  const char* text =
      "graph @main(%0: f32[] @cpu loc(\"interned.cc\":1:2)) {\n"
      "  %1 = neg %0 : f32[] @cpu loc(\"interned.cc\":7:9)\n"
      "  return %1\n"
      "}\n";
  SourceLoc first;
  {
    Graph g = parse_graph(std::string(text));  // the text itself dies with the temporary
    first = g.nodes[1].where;
    EXPECT_EQ(g.nodes[0].where.file, g.nodes[1].where.file);
  }
  // The graph and the text are gone; the name is still there, and shared by later parses.
  EXPECT_STREQ(first.file, "interned.cc");
  EXPECT_EQ(first.line, 7u);
  EXPECT_EQ(first.column, 9u);
  EXPECT_EQ(first.str(), "interned.cc:7");
  EXPECT_EQ(parse_graph(text).nodes[0].where.file, first.file);
}

TEST(IrTextTest, InternsFileNamesAcrossThreads) {
  // Many parsers intern at once; each name is stored once and every graph sees that copy.
  constexpr int kThreads = 4;
  std::vector<const char*> seen(kThreads * 50);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &seen] {
      for (int k = 0; k < 50; ++k) {
        std::string text = "graph @main(%0: f32[] @cpu loc(\"thread_" + std::to_string(k % 5) +
                           ".cc\":1:1)) {\n  return\n}\n";
        seen[t * 50 + k] = parse_graph(text).nodes[0].where.file;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (size_t i = 0; i < seen.size(); ++i) {
    EXPECT_EQ(seen[i], seen[i % 5]) << i;
    EXPECT_EQ(std::string(seen[i]), "thread_" + std::to_string(i % 50 % 5) + ".cc");
  }
}

TEST(IrTextTest, ParsesHandWrittenTextWithCommentsAndOddSpacing) {
  const char* text =
      "// A hand-written graph.\n"
      "\n"
      "   graph   @main ( %0 :f32[ 3 ]@cpu ,\n"
      "\t%1:f32[3] @cuda:0 loc ( \"x.cc\" : 1 : 2 ) )// params done\n"
      "{\r\n"
      "\n"
      "  %2=const{value=2.0}:f32[]@cpu   // a constant\n"
      "  // a comment line, with %9 = frob inside\n"
      "  %3 = add %0 ,%2 : f32[3] @cpu\n"
      "  %4 = sum %3 { dims = [ 0 ] , keepdim = false } : f32[ ] @cpu\n"
      "  %5 = permute\n"
      "        %1 {dims = [1,0]}\n"
      "        : f32[3] @cuda:0\n"
      "  return %3 ,\n"
      "         %4\n"
      "}   // end\n"
      "\n";
  Graph g = parse_graph(text);
  EXPECT_EQ(print_graph(g), kExampleText);
  EXPECT_STREQ(g.nodes[1].where.file, "x.cc");
  EXPECT_EQ(g.nodes[1].where.line, 1u);
  EXPECT_EQ(g.nodes[1].where.column, 2u);
}

TEST(IrTextTest, ParsesEmptyAttributeBracesAndCpuZero) {
  Graph g = parse_graph("graph @main(%0: f32[] @cpu:0) { %1 = neg %0 {} : f32[] @cuda return %1 }");
  EXPECT_TRUE(g.nodes[1].attrs.empty());
  EXPECT_EQ(g.nodes[0].device, Device::cpu());
  EXPECT_EQ(g.nodes[1].device, Device("cuda"));
  EXPECT_FALSE(g.nodes[1].device.has_index());
}

TEST(IrTextTest, DoesNotCheckTypesOrArity) {
  // The verifier rejects these; the parser only builds them.
  Graph g = parse_graph(
      "graph @main(%0: bool[2] @cpu) {\n"
      "  %1 = add %0 : f16[9, 9] @cuda:3\n"
      "  %2 = exp %0, %1, %0 {seed = 1} : i32[] @cpu\n"
      "  return %2, %2\n"
      "}\n");
  EXPECT_EQ(g.nodes[1].inputs, std::vector<ValueId>{0});
  EXPECT_EQ(g.nodes[2].inputs, (std::vector<ValueId>{0, 1, 0}));
  EXPECT_EQ(g.outputs, (std::vector<ValueId>{2, 2}));
}

struct ErrorCase {
  const char* text;
  const char* message;  // the whole what()
};

class IrParseErrorTest : public ::testing::TestWithParam<ErrorCase> {};

TEST_P(IrParseErrorTest, ReportsMessageAndPosition) {
  const ErrorCase& c = GetParam();
  try {
    parse_graph(c.text);
    FAIL() << "parsed without error:\n" << c.text;
  } catch (const ParseError& e) {
    EXPECT_EQ(std::string(e.what()), c.message) << "in:\n" << c.text;
    // line() and column() agree with the message's prefix.
    std::string prefix = std::to_string(e.line()) + ":" + std::to_string(e.column()) + ": error: ";
    EXPECT_THAT(e.what(), ::testing::StartsWith(prefix));
  }
}

// Line 1 of most cases; line 2 is where the interesting part goes.
#define HEADER "graph @main(%0: f32[3] @cpu) {\n"

INSTANTIATE_TEST_SUITE_P(
    Errors, IrParseErrorTest,
    ::testing::Values(
        ErrorCase{HEADER
                  "  %1 = neg %0 : f32[3] @cpu\n  %2 = add %1, %7 : f32[3] @cpu\n  return %2\n}\n",
                  "3:16: error: use of undefined value %7"},
        ErrorCase{HEADER "  %1 = neg %1 : f32[3] @cpu\n  return %1\n}\n",
                  "2:12: error: use of undefined value %1"},
        ErrorCase{HEADER "  return %1\n}\n", "2:10: error: use of undefined value %1"},
        ErrorCase{HEADER "  %1 = neg %99999999999999999999999 : f32[3] @cpu\n  return\n}\n",
                  "2:12: error: use of undefined value %99999999999999999999999"},
        ErrorCase{HEADER "  %1 = frob %0 : f32[3] @cpu\n  return\n}\n",
                  "2:8: error: unknown op 'frob'"},
        ErrorCase{HEADER "  %1 = %0 : f32[3] @cpu\n  return\n}\n",
                  "2:8: error: expected an op name"},
        ErrorCase{HEADER "  %1 = neg %0 f32[3] @cpu\n  return\n}\n", "2:15: error: expected ':'"},
        ErrorCase{HEADER "  %1 neg %0 : f32[3] @cpu\n  return\n}\n", "2:6: error: expected '='"},
        ErrorCase{
            HEADER "  %1 = neg %0 : f33[3] @cpu\n  return\n}\n",
            "2:17: error: unknown dtype 'f33' (expected bool, i32, i64, f16, bf16, f32 or f64)"},
        ErrorCase{HEADER "  %1 = neg %0 : [3] @cpu\n  return\n}\n",
                  "2:17: error: expected a dtype"},
        ErrorCase{HEADER "  %1 = neg %0 : f32 @cpu\n  return\n}\n", "2:21: error: expected '['"},
        ErrorCase{HEADER "  %1 = neg %0 : f32[3 @cpu\n  return\n}\n", "2:23: error: expected ']'"},
        ErrorCase{HEADER "  %1 = neg %0 : f32[3.5] @cpu\n  return\n}\n",
                  "2:21: error: expected an integer"},
        ErrorCase{HEADER "  %1 = neg %0 : f32[3] cpu\n  return\n}\n",
                  "2:24: error: expected '@' and a device"},
        ErrorCase{HEADER "  %1 = neg %0 : f32[3] @ cpu\n  return\n}\n",
                  "2:25: error: expected a device after '@'"},
        ErrorCase{
            HEADER "  %1 = neg %0 : f32[3] @tpu\n  return\n}\n",
            "2:24: error: Invalid device string: 'tpu' (unknown device type; expected \"cpu\", "
            "\"cuda\" or \"cuda:N\")"},
        ErrorCase{"graph @main(%0: f32[3] @cuda:x) {\n  return\n}\n",
                  "1:24: error: Invalid device string: 'cuda:x' (the index is not a non-negative "
                  "integer; expected \"cpu\", \"cuda\" or \"cuda:N\")"},
        ErrorCase{HEADER "  return %0\n}\n%1",
                  "4:1: error: unexpected text after the end of the graph"},
        ErrorCase{HEADER "  return %0\n} }",
                  "3:3: error: unexpected text after the end of the graph"},
        ErrorCase{HEADER "  return %0\n", "3:1: error: expected '}'"},
        ErrorCase{HEADER "  %1 = neg %0 : f32[3] @cpu\n",
                  "3:1: error: expected a value definition '%N = ...' or 'return'"},
        ErrorCase{HEADER "  %1 = neg %0 : f32[3] @cpu frob\n  return\n}\n",
                  "2:29: error: expected a value definition '%N = ...' or 'return'"},
        ErrorCase{HEADER "  return %0 %0\n}\n", "2:13: error: expected '}'"},
        ErrorCase{HEADER "  %2 = neg %0 : f32[3] @cpu\n  return\n}\n",
                  "2:3: error: value %2 defined out of order (expected %1)"},
        ErrorCase{HEADER "  %0 = neg %0 : f32[3] @cpu\n  return\n}\n",
                  "2:3: error: redefinition of value %0"},
        ErrorCase{"graph @main(%0: f32[3] @cpu, %2: f32[3] @cpu) {\n  return\n}\n",
                  "1:30: error: value %2 defined out of order (expected %1)"},
        ErrorCase{"graph @main(%0: f32[3] @cpu %1: f32[3] @cpu) {\n  return\n}\n",
                  "1:29: error: expected ')'"},
        ErrorCase{"graph @main(x: f32[3] @cpu) {\n  return\n}\n",
                  "1:13: error: expected a value name (%N)"},
        ErrorCase{"graph @main(%x: f32[3] @cpu) {\n  return\n}\n",
                  "1:13: error: expected a value name (%N)"},
        ErrorCase{"graph @main(%0 f32[3] @cpu) {\n  return\n}\n", "1:16: error: expected ':'"},
        ErrorCase{"func @main() {\n  return\n}\n", "1:1: error: expected 'graph'"},
        ErrorCase{"", "1:1: error: expected 'graph'"},
        ErrorCase{"// nothing\n  \n", "3:1: error: expected 'graph'"},
        ErrorCase{"graph main() {\n  return\n}\n", "1:7: error: expected '@' and the graph's name"},
        ErrorCase{"graph @() {\n  return\n}\n", "1:7: error: expected the graph's name after '@'"},
        ErrorCase{"graph @main {\n  return\n}\n", "1:13: error: expected '('"},
        ErrorCase{"graph @main()\n  return\n}\n", "2:3: error: expected '{'"},
        ErrorCase{HEADER "  %1 = sum %0 {dimz = [0]} : f32[] @cpu\n  return\n}\n",
                  "2:16: error: unknown attribute 'dimz'"},
        ErrorCase{HEADER "  %1 = sum %0 {dims = [0], dims = [1]} : f32[] @cpu\n  return\n}\n",
                  "2:28: error: duplicate attribute 'dims'"},
        ErrorCase{HEADER "  %1 = sum %0 {dims [0]} : f32[] @cpu\n  return\n}\n",
                  "2:21: error: expected '='"},
        ErrorCase{HEADER "  %1 = sum %0 {dims = [0] keepdim = true} : f32[] @cpu\n  return\n}\n",
                  "2:27: error: expected '}'"},
        ErrorCase{HEADER "  %1 = sum %0 {dims = } : f32[] @cpu\n  return\n}\n",
                  "2:23: error: expected an attribute value"},
        ErrorCase{HEADER "  %1 = sum %0 {dims = [0.5]} : f32[] @cpu\n  return\n}\n",
                  "2:24: error: expected an integer"},
        ErrorCase{HEADER "  %1 = sum %0 {dims = [0, ]} : f32[] @cpu\n  return\n}\n",
                  "2:27: error: expected an integer"},
        ErrorCase{HEADER "  %1 = const {value = 1.2.3} : f32[] @cpu\n  return\n}\n",
                  "2:23: error: invalid attribute value '1.2.3'"},
        ErrorCase{HEADER "  %1 = const {value = yes} : f32[] @cpu\n  return\n}\n",
                  "2:23: error: invalid attribute value 'yes'"},
        ErrorCase{HEADER "  %1 = const {value = 99999999999999999999} : i64[] @cpu\n  return\n}\n",
                  "2:23: error: integer out of range: 99999999999999999999"},
        ErrorCase{HEADER "  %1 = const {value = 1e999} : f64[] @cpu\n  return\n}\n",
                  "2:23: error: float out of range: 1e999"},
        ErrorCase{HEADER "  %1 = neg %0 : f32[3] @cpu loc(\"a.cc:3:4)\n  return\n}\n",
                  "2:33: error: unterminated string"},
        ErrorCase{HEADER "  %1 = neg %0 : f32[3] @cpu loc(a.cc:3:4)\n  return\n}\n",
                  "2:33: error: expected a file name string"},
        ErrorCase{HEADER "  %1 = neg %0 : f32[3] @cpu loc(\"a.cc\":3)\n  return\n}\n",
                  "2:41: error: expected ':'"},
        ErrorCase{HEADER "  %1 = neg %0 : f32[3] @cpu loc(\"a.cc\":x:4)\n  return\n}\n",
                  "2:40: error: expected a line number"},
        ErrorCase{HEADER "  %1 = neg %0 : f32[3] @cpu loc(\"a.cc\":-3:4)\n  return\n}\n",
                  "2:40: error: line number out of range"},
        ErrorCase{HEADER "  %1 = neg %0 : f32[3] @cpu loc(\"a.cc\":3:4294967296)\n  return\n}\n",
                  "2:42: error: column number out of range"},
        ErrorCase{HEADER "  %1 = neg %0 : f32[3] @cpu loc(\"a\\q.cc\":3:4)\n  return\n}\n",
                  "2:35: error: invalid escape in string"},
        ErrorCase{HEADER "  %1 = neg %0 : f32[3] @cpu loc(\"a.cc\":3:4\n  return\n}\n",
                  "3:3: error: expected ')'"},
        // from_chars reads a sign, so "\x-1" was once the byte 0xff.
        ErrorCase{"graph @\"\\x-1\"() {\n  return\n}\n",
                  "1:9: error: invalid escape in string (expected \\xHH)"},
        ErrorCase{"graph @\"\\x4g\"() {\n  return\n}\n",
                  "1:9: error: invalid escape in string (expected \\xHH)"},
        ErrorCase{"graph @\"\\x4", "1:9: error: invalid escape in string (expected \\xHH)"}));

#undef HEADER

TEST(IrParseErrorTest, SetsLineAndColumn) {
  try {
    parse_graph("graph @main() {\n\n   %0 = frob : f32[] @cpu\n  return\n}\n");
    FAIL() << "parsed without error";
  } catch (const ParseError& e) {
    EXPECT_EQ(e.line(), 3);
    EXPECT_EQ(e.column(), 9);
    EXPECT_THAT(e.what(), HasSubstr("unknown op 'frob'"));
  }
}

TEST(IrParseErrorTest, IsALazyfuseError) { EXPECT_THROW(parse_graph("graph"), Error); }

// Text that parses but breaks a shape rule where the rule itself once read out of bounds or
// overflowed: the verifier must say so with a VerifierError (and the sanitizer builds see no
// undefined behaviour on the way). The corpus of the IR text fuzzer holds these inputs too.
void expect_verifier_error(const std::string& text, const std::string& message) {
  Graph graph = parse_graph(text);
  try {
    verify(graph);
    FAIL() << "verified:\n" << text;
  } catch (const VerifierError& e) {
    EXPECT_EQ(std::string(e.what()), message);
  }
}

TEST(IrVerifierTest, NarrowOfAScalarIsAnError) {
  expect_verifier_error(
      "graph @main(%0: f32[] @cpu) {\n"
      "  %1 = narrow %0 {dim = 0, start = 0} : f32[] @cpu\n"
      "  return %1\n"
      "}\n",
      "%1 = narrow (made at <unknown>): narrow() cannot be applied to a 0-dim tensor.");
}

TEST(IrVerifierTest, NarrowWithAStartNearInt64MaxIsAnError) {
  expect_verifier_error(
      "graph @main(%0: f32[4] @cpu) {\n"
      "  %1 = narrow %0 {dim = 0, start = 9223372036854775807} : f32[1] @cpu\n"
      "  return %1\n"
      "}\n",
      "%1 = narrow (made at <unknown>): start (9223372036854775807) + length (1) exceeds "
      "dimension size (4).");
}

TEST(IrVerifierTest, ShapesWhoseSizesMultiplyPastInt64AreErrors) {
  // A reshape compares element counts: the count of its shape must not overflow.
  expect_verifier_error(
      "graph @main(%0: f32[4] @cpu) {\n"
      "  %1 = reshape %0 : f32[4294967296,4294967296] @cpu\n"
      "  return %1\n"
      "}\n",
      "%1 = reshape (made at <unknown>): the sizes of shape [4294967296, 4294967296] multiply "
      "past what an int64 holds");
  // Nor may a broadcast's, though each operand's count fits.
  expect_verifier_error(
      "graph @main(%0: f32[4294967296,1] @cpu, %1: f32[1,4294967296] @cpu) {\n"
      "  %2 = add %0, %1 : f32[4294967296,4294967296] @cpu\n"
      "  return %2\n"
      "}\n",
      "%2 = add (made at <unknown>): the sizes of shape [4294967296, 4294967296] multiply past "
      "what an int64 holds");
  // Nor the strides of a shape with no elements (the evaluation fuzzer's finding).
  expect_verifier_error(
      "graph @main() {\n"
      "  %0 = const {value = 1.0} : f32[4294967296,0,4294967296] @cpu\n"
      "  return %0\n"
      "}\n",
      "%0 = const (made at <unknown>): the sizes of shape [4294967296, 0, 4294967296] multiply "
      "past what an int64 holds (zeros counted as one, as strides count them)");
  // 2^62 elements fit.
  EXPECT_NO_THROW(
      verify(parse_graph("graph @main(%0: f32[2147483648,2147483648] @cpu) {\n"
                         "  %1 = reshape %0 : f32[4611686018427387904] @cpu\n"
                         "  return %1\n"
                         "}\n")));
}

// An attention node's operands have their slots' dtypes, which the op's dtype rule (dtypes
// alone) cannot tell apart: a mask is bool, a bias q's dtype.
TEST(IrTextTest, AttentionOperandsHaveTheirSlotsDtypes) {
  const std::string head =
      "graph @main(%0: f32[1,2,3,4] @cpu, %1: f32[1,2,5,4] @cpu, %2: f32[1,2,5,4] @cpu, "
      "%3: ";
  const std::string body =
      "[1,2,3,5] @cpu) {\n"
      "  %4 = attention %0, %1, %2, %3 {mask = true, scale = 0.5} : f32[1,2,3,4] @cpu\n"
      "  return %4\n"
      "}\n";
  EXPECT_NO_THROW(verify(parse_graph(head + "bool" + body)));
  expect_verifier_error(head + "f32" + body,
                        "%4 = attention (made at <unknown>): attention: its mask must be bool, "
                        "is f32");
  const std::string biased =
      "[1,2,3,5] @cpu) {\n"
      "  %4 = attention %0, %1, %2, %3 {bias = true, scale = 0.5} : f32[1,2,3,4] @cpu\n"
      "  return %4\n"
      "}\n";
  EXPECT_NO_THROW(verify(parse_graph(head + "f32" + biased)));
  expect_verifier_error(head + "bool" + biased,
                        "%4 = attention (made at <unknown>): attention: its bias must be f32, "
                        "is bool");
}

}  // namespace
}  // namespace lazyfuse
