// The graph shrinker (tools/shrink.h) with synthetic predicates: no bug is needed to show that a
// large graph shrinks to the few nodes a failure depends on, that every graph the predicate
// sees is well-typed, and that the result prints and parses back.
#include "tools/shrink.h"

#include <algorithm>
#include <random>

#include "gtest/gtest.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/ir/infer.h"
#include "lazyfuse/ir/verifier.h"

namespace lazyfuse::tools {
namespace {

// A random well-typed graph: a few params of mixed dtypes and broadcastable shapes, then
// `steps` attempts at an op over recent values (elementwise ops of every arity, casts,
// reductions, transposes, narrows), typed by the ops' own rules; attempts the rules reject are
// skipped. Every value nothing uses is an output, so no node is dead.
Graph random_graph(uint64_t seed, int steps) {
  std::mt19937_64 rng(seed);
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  const DType dtypes[] = {DType::Float32, DType::Float16, DType::BFloat16,
                          DType::Float64, DType::Int32,   DType::Bool};
  const Shape base = {6, 5, 7};
  Graph g;
  for (int i = 0; i < 4; ++i) {
    Node param;
    param.dtype = dtypes[i % std::size(dtypes)];
    param.shape = base;
    if (i % 2 == 1) param.shape[pick(3)] = 1;
    g.add(param);
  }
  const Op unary[] = {Op::Exp, Op::Log, Op::Tanh, Op::Sigmoid, Op::Sin, Op::Neg, Op::Abs};
  const Op binary[] = {Op::Add, Op::Mul, Op::Sub, Op::Div, Op::Maximum, Op::Lt};
  for (int step = 0; step < steps; ++step) {
    auto operand = [&] {
      return static_cast<ValueId>(g.nodes.size() - 1 - pick(std::min<size_t>(6, g.nodes.size())));
    };
    Node node;
    switch (pick(6)) {
      case 0:
        node.op = unary[pick(std::size(unary))];
        node.inputs = {operand()};
        break;
      case 1:
      case 2:
        node.op = binary[pick(std::size(binary))];
        node.inputs = {operand(), operand()};
        break;
      case 3:
        node.op = Op::Cast;
        node.dtype = dtypes[pick(std::size(dtypes))];
        node.inputs = {operand()};
        break;
      case 4:
        node.op = pick(2) ? Op::Sum : Op::Max;
        node.inputs = {operand()};
        node.attrs.set("dims", std::vector<int64_t>{-1});
        node.attrs.set("keepdim", pick(2) == 0);
        break;
      default: {
        node.inputs = {operand()};
        const Shape& in = g.nodes[node.inputs[0]].shape;
        if (in.size() >= 2 && pick(2)) {
          node.op = Op::Permute;
          std::vector<int64_t> dims;
          for (int64_t d = static_cast<int64_t>(in.size()); d-- > 0;) dims.push_back(d);
          node.attrs.set("dims", dims);
        } else {
          if (in.empty() || in[0] < 2) continue;
          node.op = Op::Narrow;
          node.attrs.set("dim", int64_t{0});
          node.attrs.set("start", int64_t{1});
          node.shape = in;
          node.shape[0] -= 1;
        }
      }
    }
    std::vector<DType> input_dtypes;
    std::vector<const Shape*> input_shapes;
    for (ValueId input : node.inputs) {
      input_dtypes.push_back(g.nodes[input].dtype);
      input_shapes.push_back(&g.nodes[input].shape);
    }
    try {
      node.dtype = infer_result_dtype(node.op, input_dtypes, node.dtype);
      node.shape = infer_shape(node.op, input_shapes, node.attrs, node.shape);
    } catch (const Error&) {
      continue;
    }
    g.add(node);
  }
  std::vector<std::vector<ValueId>> users = users_of(g);
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (users[i].empty()) g.outputs.push_back(static_cast<ValueId>(i));
  verify(g);
  return g;
}

bool has_exp_over_f16(const Graph& g) {
  for (const Node& node : g.nodes)
    if (node.op == Op::Exp && g.nodes[node.inputs[0]].dtype == DType::Float16) return true;
  return false;
}

int64_t computed_nodes(const Graph& g) {
  return std::count_if(g.nodes.begin(), g.nodes.end(),
                       [](const Node& node) { return node.op != Op::Param; });
}

TEST(Shrink, LargeGraphShrinksToTheNodesThePredicateNeeds) {
  Graph original = random_graph(7, 400);
  ASSERT_GE(original.nodes.size(), 150u);
  ASSERT_TRUE(has_exp_over_f16(original));

  ShrinkResult result = shrink_graph(original, has_exp_over_f16);
  const Graph& g = result.graph;
  EXPECT_FALSE(result.exhausted);
  EXPECT_TRUE(has_exp_over_f16(g));
  // All that is left: an f16 param and its exp, of one element.
  EXPECT_EQ(g.nodes.size(), 2u) << print_graph(g);
  EXPECT_EQ(computed_nodes(g), 1) << print_graph(g);
  for (const Node& node : g.nodes) EXPECT_EQ(numel(node.shape), 1) << print_graph(g);
  EXPECT_NO_THROW(verify(g));

  // The printed reproducer reads back as the same graph, and still fails.
  const std::string text = print_graph(g);
  Graph parsed = parse_graph(text);
  EXPECT_EQ(print_graph(parsed), text);
  EXPECT_NO_THROW(verify(parsed));
  EXPECT_TRUE(has_exp_over_f16(parsed));
}

TEST(Shrink, ThePredicateSeesOnlyVerifiedSmallerGraphs) {
  Graph original = random_graph(7, 400);
  ASSERT_TRUE(has_exp_over_f16(original));
  int calls = 0;
  // Every candidate is a step from the last graph kept, which it must not outgrow.
  int64_t kept_computed_nodes = computed_nodes(original);
  ShrinkResult result = shrink_graph(original, [&](const Graph& g) {
    ++calls;
    EXPECT_NO_THROW(verify(g)) << print_graph(g);
    EXPECT_LE(computed_nodes(g), kept_computed_nodes) << print_graph(g);
    const bool fails = has_exp_over_f16(g);
    if (fails) kept_computed_nodes = computed_nodes(g);
    return fails;
  });
  EXPECT_EQ(calls, result.attempts);
  EXPECT_GT(result.accepted, 0);
  EXPECT_LE(result.graph.nodes.size(), 3u) << print_graph(result.graph);
}

// A failure that needs a sum over a dim of at least 3 elements keeps that dim at exactly 3:
// sizes shrink as far as the failure allows, and no further.
TEST(Shrink, SizesShrinkAsFarAsTheFailureAllows) {
  auto big_sum = [](const Graph& g) {
    for (const Node& node : g.nodes) {
      if (node.op != Op::Sum) continue;
      const Shape& in = g.nodes[node.inputs[0]].shape;
      for (int64_t d : reduction_dims(node.attrs, static_cast<int64_t>(in.size())))
        if (in[d] >= 3) return true;
    }
    return false;
  };
  Graph original = random_graph(3, 300);
  ASSERT_TRUE(big_sum(original));
  Graph g = shrink_graph(original, big_sum).graph;
  EXPECT_TRUE(big_sum(g));
  ASSERT_EQ(g.nodes.size(), 2u) << print_graph(g);
  EXPECT_EQ(g.nodes[1].op, Op::Sum);
  EXPECT_EQ(numel(g.nodes[0].shape), 3) << print_graph(g);
}

TEST(Shrink, OutputsThatTheFailureDoesNotNeedAreDropped) {
  Graph original = random_graph(5, 300);
  ASSERT_GT(original.outputs.size(), 2u);
  Graph g = shrink_graph(original, [](const Graph& g) { return g.outputs.size() >= 2; }).graph;
  EXPECT_EQ(g.outputs.size(), 2u);
  // Two outputs need no computed node at all: two params will do (or one, returned twice).
  EXPECT_EQ(computed_nodes(g), 0) << print_graph(g);
}

TEST(Shrink, StopsAtTheLimitOfAttempts) {
  Graph original = random_graph(7, 400);
  int calls = 0;
  ShrinkResult result = shrink_graph(original,
                                     [&](const Graph& g) {
                                       ++calls;
                                       return has_exp_over_f16(g);
                                     },
                                     {.max_attempts = 5});
  EXPECT_TRUE(result.exhausted);
  EXPECT_EQ(calls, 5);
  EXPECT_EQ(result.attempts, 5);
  EXPECT_TRUE(has_exp_over_f16(result.graph));
  EXPECT_LE(result.graph.nodes.size(), original.nodes.size());
}

}  // namespace
}  // namespace lazyfuse::tools
