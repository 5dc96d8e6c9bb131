// Fusion: how many kernels a computation becomes, stated both through the frontend (what
// evaluation launched, from eval_stats()) and through hand-written IR run through the pass
// pipeline. Every schedule is also checked for validity: steps in an order where each step
// reads only params and outputs of earlier steps, and every node computed exactly once.
#include <omp.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "gmock/gmock.h"
#include "gtest/gtest-spi.h"
#include "gtest/gtest.h"
#include "lazyfuse/codegen/cpu/cpu_program.h"
#include "lazyfuse/ir/infer.h"
#include "lazyfuse/ir/passes/passes.h"
#include "lazyfuse/ir/verifier.h"
#include "lazyfuse/lazyfuse.h"
#include "lazyfuse/runtime/env.h"

namespace lazyfuse {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The invariants fusion.cc's note promises, so that a count that happens to be right cannot
// hide a schedule that reads a value before it exists or computes one twice.
void expect_valid_schedule(const Schedule& schedule) {
  const Graph& graph = schedule.graph;
  const int num_params = graph.num_params();
  absl::flat_hash_set<ValueId> stored;  // values readable from storage so far
  for (ValueId p = 0; p < num_params; ++p) stored.insert(p);
  absl::flat_hash_map<ValueId, int> times_computed;
  // One kernel's invariants; a group's members each are one, and read only what was stored
  // before the group (none reads another's results).
  auto check_kernel = [&](const Step& step, size_t s) {
    ASSERT_FALSE(step.nodes.empty()) << "step " << s;
    absl::flat_hash_set<ValueId> members(step.nodes.begin(), step.nodes.end());
    for (ValueId in : step.inputs) {
      EXPECT_TRUE(stored.contains(in))
          << "step " << s << " reads %" << in << " before any earlier step stored it";
      EXPECT_FALSE(members.contains(in)) << "step " << s << " reads its own member %" << in;
    }
    // Members only read members, inputs, or scalar constants computed in place.
    absl::flat_hash_set<ValueId> inputs(step.inputs.begin(), step.inputs.end());
    for (ValueId m : step.nodes) {
      ASSERT_NE(graph.nodes[m].op, Op::Param) << "step " << s << " has param %" << m;
      ++times_computed[m];
      for (ValueId in : graph.nodes[m].inputs) {
        EXPECT_TRUE(members.contains(in) || inputs.contains(in))
            << "step " << s << ": %" << m << " reads %" << in << ", which the step lacks";
      }
    }
    ASSERT_EQ(step.roles.size(), step.nodes.size()) << "step " << s;
    auto role = [&](ValueId m) {
      return step.roles[absl::c_find(step.nodes, m) - step.nodes.begin()];
    };
    // A reduction kind is one reduction with elementwise work fused around it, or several
    // keepdim reductions of the same rows; each member's role is what it does there.
    if (is_reduction_kind(step.kind)) {
      std::vector<ValueId> reductions;
      for (ValueId m : step.nodes) {
        const Node& node = graph.nodes[m];
        if (is_reduction(node.op)) reductions.push_back(m);
        EXPECT_TRUE(is_reduction(node.op) || is_fusable_elementwise(node.op))
            << "step " << s << " %" << m;
        EXPECT_EQ(role(m) == Role::Reduction, is_reduction(node.op)) << "step " << s << " %" << m;
        const bool per_row =
            !is_reduction(node.op) && !is_scalar_constant(node) && node.shape != step.shape;
        EXPECT_EQ(role(m) == Role::RowValue, per_row && step.kind == StepKind::Row)
            << "step " << s << " %" << m;
        if (step.kind != StepKind::Row) {
          EXPECT_TRUE(role(m) == Role::Prologue || role(m) == Role::Reduction)
              << "step " << s << " %" << m;
        }
      }
      ASSERT_GE(reductions.size(), 1u) << "step " << s;
      if (step.kind != StepKind::Row) {
        EXPECT_EQ(reductions.size(), 1u) << "step " << s;
      }
      const Node& first = graph.nodes[reductions[0]];
      const int64_t rank = static_cast<int64_t>(graph.nodes[first.inputs[0]].shape.size());
      EXPECT_EQ(
          step.kind == StepKind::Column,
          reductions.size() == 1 && reduces_leading_dims(reduction_dims(first.attrs, rank), rank))
          << "step " << s;
      // What a reduction reads, through the members it reads, is prologue, never epilogue.
      absl::flat_hash_set<ValueId> read_by_reductions;
      std::vector<ValueId> frontier(reductions.begin(), reductions.end());
      while (!frontier.empty()) {
        const ValueId v = frontier.back();
        frontier.pop_back();
        for (ValueId in : graph.nodes[v].inputs)
          if (members.contains(in) && !is_reduction(graph.nodes[in].op) &&
              read_by_reductions.insert(in).second)
            frontier.push_back(in);
      }
      for (ValueId m : read_by_reductions)
        EXPECT_TRUE(role(m) == Role::Prologue || role(m) == Role::RowValue)
            << "step " << s << " %" << m;
      // Several reductions reduce the same rows (with keepdim or without).
      for (ValueId r : reductions) {
        if (reductions.size() == 1) break;
        const Node& node = graph.nodes[r];
        EXPECT_EQ(numel(node.shape), numel(first.shape)) << "step " << s << " %" << r;
        EXPECT_EQ(graph.nodes[node.inputs[0]].shape, graph.nodes[first.inputs[0]].shape);
      }
    } else if (step.kind == StepKind::Matmul) {
      // A matmul, perhaps with its epilogue: the bias add, then perhaps a relu.
      ASSERT_LE(step.nodes.size(), 3u) << "step " << s;
      for (ValueId m : step.nodes) {
        const Node& node = graph.nodes[m];
        const Role expected = node.op == Op::Matmul ? Role::Product
                              : node.op == Op::Add  ? Role::Bias
                                                    : Role::Activation;
        EXPECT_EQ(role(m), expected) << "step " << s << " %" << m;
        EXPECT_TRUE(node.op == Op::Matmul || node.op == Op::Add || node.op == Op::Relu);
      }
      EXPECT_EQ(step.outputs.size(), 1u) << "step " << s;
    } else {
      for (Role r : step.roles) EXPECT_EQ(r, Role::Work) << "step " << s;
      if (step.kind != StepKind::Elementwise) {
        EXPECT_EQ(step.nodes.size(), 1u) << "step " << s;
      }
    }
  };
  for (size_t s = 0; s < schedule.steps.size(); ++s) {
    const Step& step = schedule.steps[s];
    if (step.kind == StepKind::Group) {
      EXPECT_GE(step.members.size(), 2u) << "step " << s;
      for (const Step& member : step.members) {
        EXPECT_TRUE(member.kind == StepKind::Elementwise ||
                    ((member.kind == StepKind::Reduction || member.kind == StepKind::Column) &&
                     is_reduction(graph.nodes[member.nodes.back()].op)))
            << "step " << s;
        check_kernel(member, s);
      }
    } else {
      check_kernel(step, s);
    }
    for (ValueId out : step.outputs) {
      EXPECT_TRUE(absl::c_linear_search(step.nodes, out))
          << "step " << s << " stores non-member %" << out;
      stored.insert(out);
    }
  }
  for (ValueId out : graph.outputs) EXPECT_TRUE(stored.contains(out)) << "output %" << out;
  for (size_t i = num_params; i < graph.nodes.size(); ++i) {
    ValueId v = static_cast<ValueId>(i);
    // Scalar constants are recomputed in every step that uses them; the rest exactly once.
    if (is_scalar_constant(graph.nodes[i])) {
      EXPECT_GE(times_computed[v], 1) << "%" << v << " never computed";
    } else {
      EXPECT_EQ(times_computed[v], 1) << "%" << v;
    }
  }
}

// The schedule the runtime would run for `outputs` (same graph building, default pipeline).
Schedule schedule_of(const std::vector<Tensor>& outputs, FusionOptions fusion = {}) {
  std::vector<LazyRef> values;
  for (const Tensor& t : outputs) values.push_back(t.value());
  BuiltGraph built = build_graph(values);
  PipelineOptions options;
  options.fusion = fusion;
  Schedule schedule = run_pipeline(std::move(built.graph), options);
  expect_valid_schedule(schedule);
  return schedule;
}

Schedule schedule_of_text(std::string_view text, FusionOptions fusion = {}) {
  PipelineOptions options;
  options.fusion = fusion;
  Schedule schedule = run_pipeline(parse_graph(text), options);
  expect_valid_schedule(schedule);
  return schedule;
}

int count_steps(const Schedule& schedule, StepKind kind) {
  int count = 0;
  for (const Step& step : schedule.steps) count += step.kind == kind;
  return count;
}

int count_ops(const Graph& graph, Op op) {
  int count = 0;
  for (const Node& node : graph.nodes) count += node.op == op;
  return count;
}

// LAZYFUSE_FUSION=0 turns fusion off for the whole process, whatever EvalOptions say; the
// counts below are those of fused evaluation.
#define SKIP_IF_FUSION_OFF_BY_ENV() \
  if (!env_config().fusion) GTEST_SKIP() << "LAZYFUSE_FUSION=0 is set"

// Kernels the evaluation of `outputs` launched, measured where the runtime counts them.
int64_t kernels_to_eval(const std::vector<Tensor>& outputs, EvalOptions options = {}) {
  reset_eval_stats();
  eval(outputs, options);
  EXPECT_EQ(eval_stats().evaluations, 1);
  return eval_stats().kernels;
}

void expect_near_all(const std::vector<float>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], 1e-5 * std::max(1.0, std::abs(want[i]))) << "element " << i;
}

TEST(Fusion, ExpOfShiftTimesIsOneKernel) {
  SKIP_IF_FUSION_OFF_BY_ENV();
  Tensor y = tensor({1, 2, 3});
  Tensor z = tensor({1, 2, 3});
  Tensor result = (z + 2).exp() * y;
  EXPECT_EQ(kernels_to_eval({result}), 1);
  EXPECT_EQ(eval_stats().elementwise_kernels, 1);
  expect_near_all(result.to_vector<float>(), {std::exp(3.0), 2 * std::exp(4.0), 3 * std::exp(5.0)});

  Schedule schedule = schedule_of_text(
      "graph @main(%0: f32[3] @cpu, %1: f32[3] @cpu) {\n"
      "  %2 = const {value = 2.0} : f32[] @cpu\n"
      "  %3 = add %0, %2 : f32[3] @cpu\n"
      "  %4 = exp %3 : f32[3] @cpu\n"
      "  %5 = mul %4, %1 : f32[3] @cpu\n"
      "  return %5\n"
      "}\n");
  ASSERT_EQ(schedule.steps.size(), 1u);
  EXPECT_EQ(count_steps(schedule, StepKind::Elementwise), 1);
  // The constant is computed in the kernel, so only the two tensors are read.
  EXPECT_THAT(schedule.steps[0].inputs, ElementsAre(0, 1));
  EXPECT_EQ(schedule.steps[0].outputs.size(), 1u);
}

TEST(Fusion, GeluTanhFromPrimitiveOpsIsOneKernel) {
  SKIP_IF_FUSION_OFF_BY_ENV();
  Tensor x = tensor({-2, -0.5, 0, 0.5, 2});
  Tensor gelu = 0.5 * x * (1 + tanh(0.7978845608 * (x + 0.044715 * x * x * x)));
  Schedule schedule = schedule_of({gelu});
  EXPECT_EQ(schedule.num_kernels(), 1);
  EXPECT_EQ(count_steps(schedule, StepKind::Elementwise), 1);
  EXPECT_EQ(kernels_to_eval({gelu}), 1);
  std::vector<double> want;
  for (double v : {-2.0, -0.5, 0.0, 0.5, 2.0})
    want.push_back(0.5 * v * (1 + std::tanh(0.7978845608 * (v + 0.044715 * v * v * v))));
  expect_near_all(gelu.to_vector<float>(), want);
}

TEST(Fusion, DiamondIsOneKernel) {
  SKIP_IF_FUSION_OFF_BY_ENV();
  Tensor x = tensor({0.5, 1, 2});
  Tensor a = x.exp();
  Tensor b = x.sin();
  Tensor sum = a + b;
  EXPECT_EQ(kernels_to_eval({sum}), 1);
  expect_near_all(sum.to_vector<float>(),
                  {std::exp(0.5) + std::sin(0.5), std::exp(1.0) + std::sin(1.0),
                   std::exp(2.0) + std::sin(2.0)});

  Schedule schedule = schedule_of_text(
      "graph @main(%0: f32[3] @cpu) {\n"
      "  %1 = exp %0 : f32[3] @cpu\n"
      "  %2 = sin %0 : f32[3] @cpu\n"
      "  %3 = add %1, %2 : f32[3] @cpu\n"
      "  return %3\n"
      "}\n");
  ASSERT_EQ(schedule.steps.size(), 1u);
  EXPECT_THAT(schedule.steps[0].nodes, ElementsAre(1, 2, 3));
  EXPECT_THAT(schedule.steps[0].inputs, ElementsAre(0));
  EXPECT_THAT(schedule.steps[0].outputs, ElementsAre(3));
}

TEST(Fusion, ValueWithTwoConsumersIsComputedOnce) {
  SKIP_IF_FUSION_OFF_BY_ENV();
  Tensor x = tensor({0.25, 0.5, 1});
  Tensor shared = x.exp();
  Tensor result = shared.sin() + shared.cos();
  Schedule schedule = schedule_of({result});
  ASSERT_EQ(schedule.steps.size(), 1u);
  // One exp node in the graph, one in the kernel: its two readers share the value in registers.
  EXPECT_EQ(count_ops(schedule.graph, Op::Exp), 1);
  int exps_in_kernel = 0;
  for (ValueId v : schedule.steps[0].nodes) exps_in_kernel += schedule.graph.nodes[v].op == Op::Exp;
  EXPECT_EQ(exps_in_kernel, 1);
  // Not stored either: nothing outside the kernel reads it.
  EXPECT_EQ(schedule.steps[0].outputs.size(), 1u);
  EXPECT_EQ(kernels_to_eval({result}), 1);
}

TEST(Fusion, TwoOutputsSharingAnIntermediateAreOneMultiOutputKernel) {
  SKIP_IF_FUSION_OFF_BY_ENV();
  Tensor x = tensor({1, 2, 3});
  Tensor shared = (x * 3).exp();
  Tensor a = shared + 1;
  Tensor b = shared * 2;
  Schedule schedule = schedule_of({a, b});
  ASSERT_EQ(schedule.steps.size(), 1u);
  EXPECT_EQ(schedule.steps[0].outputs.size(), 2u);
  EXPECT_EQ(count_ops(schedule.graph, Op::Exp), 1);
  EXPECT_THAT(a.fused_ir(), HasSubstr("kernel elementwise @k_"));

  EXPECT_EQ(kernels_to_eval({a, b}), 1);
  EXPECT_TRUE(a.is_computed());
  EXPECT_TRUE(b.is_computed());
  expect_near_all(a.to_vector<float>(), {std::exp(3.0) + 1, std::exp(6.0) + 1, std::exp(9.0) + 1});
  expect_near_all(b.to_vector<float>(), {2 * std::exp(3.0), 2 * std::exp(6.0), 2 * std::exp(9.0)});
}

TEST(Fusion, ReluOfBiasBroadcastOverRowsIsOneKernel) {
  SKIP_IF_FUSION_OFF_BY_ENV();
  Tensor x = tensor({{-1, 2, -3}, {4, -5, 6}});
  Tensor b = tensor({0.5, 0.5, 10});
  Tensor result = relu(x + b);
  Schedule schedule = schedule_of({result});
  ASSERT_EQ(schedule.steps.size(), 1u);
  EXPECT_EQ(schedule.steps[0].kind, StepKind::Elementwise);
  EXPECT_EQ(schedule.steps[0].shape, Shape({2, 3}));
  // The bias is read with broadcasting, never materialised at [2, 3].
  EXPECT_EQ(schedule.steps[0].inputs.size(), 2u);
  EXPECT_EQ(kernels_to_eval({result}), 1);
  expect_near_all(result.to_vector<float>(), {0, 2.5, 7, 4.5, 0, 16});
}

TEST(Fusion, ReductionAbsorbsItsPrivateElementwiseProducer) {
  SKIP_IF_FUSION_OFF_BY_ENV();
  Tensor x = tensor({1, 2, 3});
  Tensor squares = (x * x).sum();
  Schedule schedule = schedule_of({squares});
  // The squares are read only by the sum: they are computed inside the reduction, never stored.
  ASSERT_EQ(schedule.steps.size(), 1u);
  EXPECT_EQ(schedule.steps[0].kind, StepKind::Reduction);
  EXPECT_EQ(schedule.steps[0].shape, Shape({3}));  // a reduction iterates over its operand
  EXPECT_THAT(schedule.steps[0].inputs, ElementsAre(0));
  EXPECT_EQ(kernels_to_eval({squares}), 1);
  EXPECT_EQ(eval_stats().elementwise_kernels, 0);
  EXPECT_FLOAT_EQ(squares.item<float>(), 14);

  // Rows of a matrix: the reduced dim is the trailing one, so it fuses too.
  Tensor m = tensor({{1, 2, 3}, {4, 5, 6}});
  Tensor row_sums = (m * 2 + 1).sum({1});
  EXPECT_EQ(schedule_of({row_sums}).steps.size(), 1u);
  EXPECT_EQ(row_sums.to_vector<float>(), std::vector<float>({15, 33}));
}

TEST(Fusion, ReductionSplitsFromAProducerItCannotAbsorb) {
  SKIP_IF_FUSION_OFF_BY_ENV();
  // The producer is also returned: it must be stored, so it stays a kernel of its own.
  Schedule shared = schedule_of_text(
      "graph @main(%0: f32[3] @cpu) {\n"
      "  %1 = mul %0, %0 : f32[3] @cpu\n"
      "  %2 = sum %1 {dims = [], keepdim = false} : f32[] @cpu\n"
      "  return %1, %2\n"
      "}\n");
  ASSERT_EQ(shared.steps.size(), 2u);
  EXPECT_EQ(shared.steps[0].kind, StepKind::Elementwise);
  EXPECT_EQ(shared.steps[1].kind, StepKind::Reduction);
  EXPECT_THAT(shared.steps[1].nodes, ElementsAre(2));

  // A leading reduced dim: output elements do not reduce contiguous ranges of the producer.
  Schedule columns = schedule_of_text(
      "graph @main(%0: f32[2,3] @cpu) {\n"
      "  %1 = exp %0 : f32[2,3] @cpu\n"
      "  %2 = sum %1 {dims = [0], keepdim = false} : f32[3] @cpu\n"
      "  return %2\n"
      "}\n");
  EXPECT_EQ(count_steps(columns, StepKind::Elementwise), 1);
  EXPECT_EQ(count_steps(columns, StepKind::Column), 1);

  // The same through the frontend, with the values checked.
  Tensor x = tensor({1, 2, 3});
  Tensor squares = x * x;
  Tensor total = squares.sum();
  EXPECT_EQ(kernels_to_eval({squares, total}), 2);
  EXPECT_EQ(eval_stats().elementwise_kernels, 1);
  EXPECT_FLOAT_EQ(total.item<float>(), 14);
  EXPECT_EQ(squares.to_vector<float>(), std::vector<float>({1, 4, 9}));
}

TEST(Fusion, MatmulIsItsOwnStepAndItsConsumersFuse) {
  SKIP_IF_FUSION_OFF_BY_ENV();
  Tensor m = tensor({{1., -2.}, {3., 4.}});
  Tensor w = tensor({{1., 0.}, {0., -1.}});
  Tensor result = relu(matmul(m.exp(), w) + 1) * 2;
  Schedule schedule = schedule_of({result});
  // exp kernel, then the library call, then one kernel for add, relu and mul.
  ASSERT_EQ(schedule.steps.size(), 3u);
  EXPECT_EQ(schedule.steps[0].kind, StepKind::Elementwise);
  EXPECT_EQ(schedule.steps[1].kind, StepKind::Matmul);
  EXPECT_EQ(schedule.steps[2].kind, StepKind::Elementwise);
  EXPECT_EQ(count_steps(schedule, StepKind::Elementwise), 2);
  EXPECT_EQ(kernels_to_eval({result}), 3);
  const double e1 = std::exp(1.0), em2 = std::exp(-2.0), e3 = std::exp(3.0), e4 = std::exp(4.0);
  auto f = [](double v) { return 2 * std::max(0.0, v + 1); };
  expect_near_all(result.to_vector<float>(), {f(e1), f(-em2), f(e3), f(-e4)});

  Schedule parsed = schedule_of_text(
      "graph @main(%0: f32[2,3] @cpu, %1: f32[3,4] @cpu) {\n"
      "  %2 = matmul %0, %1 : f32[2,4] @cpu\n"
      "  %3 = tanh %2 : f32[2,4] @cpu\n"
      "  %4 = neg %3 : f32[2,4] @cpu\n"
      "  return %4\n"
      "}\n");
  ASSERT_EQ(parsed.steps.size(), 2u);
  EXPECT_EQ(parsed.steps[0].kind, StepKind::Matmul);
  EXPECT_EQ(parsed.steps[1].kind, StepKind::Elementwise);
  EXPECT_EQ(parsed.steps[1].nodes.size(), 2u);
}

TEST(Fusion, FusionOffRunsOneKernelPerOp) {
  SKIP_IF_FUSION_OFF_BY_ENV();
  Tensor y = tensor({1, 2, 3});
  Tensor z = tensor({1, 2, 3});
  Tensor fused = (z + 2).exp() * y;
  Tensor unfused = (z + 2).exp() * y;
  EXPECT_EQ(kernels_to_eval({unfused}, EvalOptions{.fusion = false}), 3);  // add, exp, mul
  EXPECT_EQ(eval_stats().elementwise_kernels, 3);
  EXPECT_EQ(kernels_to_eval({fused}), 1);
  // Same values either way: fusion changes how, not what.
  EXPECT_EQ(fused.to_vector<float>(), unfused.to_vector<float>());

  FusionOptions off;
  off.enabled = false;
  Schedule schedule = schedule_of({(z + 2).exp() * y}, off);
  EXPECT_EQ(schedule.num_kernels(), 3);
}

// A chain of four elementwise ops over four params, for the caps.
constexpr char kAddChain[] =
    "graph @main(%0: f32[4] @cpu, %1: f32[4] @cpu, %2: f32[4] @cpu, %3: f32[4] @cpu) {\n"
    "  %4 = add %0, %1 : f32[4] @cpu\n"
    "  %5 = add %4, %2 : f32[4] @cpu\n"
    "  %6 = add %5, %3 : f32[4] @cpu\n"
    "  %7 = exp %6 : f32[4] @cpu\n"
    "  return %7\n"
    "}\n";

Schedule fuse_only(std::string_view text, FusionOptions options) {
  Schedule schedule = run_fusion(parse_graph(text), options);
  expect_valid_schedule(schedule);
  return schedule;
}

TEST(Fusion, MaxNodesCapCutsGroups) {
  EXPECT_EQ(fuse_only(kAddChain, {}).steps.size(), 1u);
  FusionOptions options;
  options.max_nodes = 2;
  Schedule schedule = fuse_only(kAddChain, options);
  ASSERT_EQ(schedule.steps.size(), 2u);
  for (const Step& step : schedule.steps) EXPECT_LE(step.nodes.size(), 2u);
  options.max_nodes = 1;
  EXPECT_EQ(fuse_only(kAddChain, options).steps.size(), 4u);
}

TEST(Fusion, MaxInputsCapCutsGroups) {
  FusionOptions options;
  options.max_inputs = 3;
  Schedule three = fuse_only(kAddChain, options);
  // {%4, %5} reads %0..%2; %6 would make four inputs, so it starts a kernel with exp.
  ASSERT_EQ(three.steps.size(), 2u);
  for (const Step& step : three.steps) EXPECT_LE(step.inputs.size(), 3u);
  EXPECT_THAT(three.steps[0].nodes, ElementsAre(4, 5));
  EXPECT_THAT(three.steps[1].nodes, ElementsAre(6, 7));

  options.max_inputs = 2;
  Schedule two = fuse_only(kAddChain, options);
  ASSERT_EQ(two.steps.size(), 3u);
  for (const Step& step : two.steps) EXPECT_LE(step.inputs.size(), 2u);
}

TEST(Fusion, ScalarConstantsDoNotCountAsInputs) {
  // Five constants: were they inputs, the cap of 1 would cut this chain at every node.
  FusionOptions options;
  options.max_inputs = 1;
  Schedule schedule = fuse_only(
      "graph @main(%0: f32[4] @cpu) {\n"
      "  %1 = const {value = 1.0} : f32[] @cpu\n"
      "  %2 = add %0, %1 : f32[4] @cpu\n"
      "  %3 = const {value = 2.0} : f32[] @cpu\n"
      "  %4 = mul %2, %3 : f32[4] @cpu\n"
      "  %5 = const {value = 3.0} : f32[] @cpu\n"
      "  %6 = sub %4, %5 : f32[4] @cpu\n"
      "  return %6\n"
      "}\n",
      options);
  ASSERT_EQ(schedule.steps.size(), 1u);
  EXPECT_THAT(schedule.steps[0].inputs, ElementsAre(0));
}

TEST(Fusion, NoCycleThroughAReductionBetweenCandidates) {
  SKIP_IF_FUSION_OFF_BY_ENV();
  // c = exp(a); d = sum(c) broadcast back; e = c + d. e may not join c's kernel: d needs that
  // kernel's result first, so the merged kernel would read its own output.
  // Fusion alone: the pipeline's sink-views would drop the expand, which the case needs.
  Schedule schedule = fuse_only(
      "graph @main(%0: f32[3] @cpu) {\n"
      "  %1 = exp %0 : f32[3] @cpu\n"
      "  %2 = sum %1 {dims = [], keepdim = false} : f32[] @cpu\n"
      "  %3 = expand %2 : f32[3] @cpu\n"
      "  %4 = add %1, %3 : f32[3] @cpu\n"
      "  return %4\n"
      "}\n",
      {});
  ASSERT_EQ(schedule.steps.size(), 4u);
  EXPECT_EQ(schedule.steps[0].kind, StepKind::Elementwise);
  EXPECT_EQ(schedule.steps[1].kind, StepKind::Reduction);
  EXPECT_EQ(schedule.steps[2].kind, StepKind::View);
  EXPECT_EQ(schedule.steps[3].kind, StepKind::Elementwise);
  EXPECT_THAT(schedule.steps[0].outputs, ElementsAre(1));
  EXPECT_THAT(schedule.steps[3].nodes, ElementsAre(4));

  // The same through the frontend, with the numbers checked.
  Tensor a = tensor({0, 1, 2});
  Tensor c = a.exp();
  Tensor d = c.sum().expand({3});
  Tensor e = c + d;
  schedule_of({e});
  EXPECT_EQ(kernels_to_eval({e}), 3);  // the expand is a view and launches nothing
  const double total = std::exp(0.0) + std::exp(1.0) + std::exp(2.0);
  expect_near_all(e.to_vector<float>(),
                  {std::exp(0.0) + total, std::exp(1.0) + total, std::exp(2.0) + total});
}

TEST(Fusion, NoCycleWhenTwoCandidateGroupsDependThroughAnOutsideNode) {
  // %6 has two candidate kernels, {%1} and {%2, %5}; the second reads the first through the
  // sum, so merging them would cycle. %6 joins one of them and the order stays valid.
  // Fusion alone: the pipeline's sink-views would drop the expand, which the case needs.
  Schedule schedule = fuse_only(
      "graph @main(%0: f32[3] @cpu) {\n"
      "  %1 = exp %0 : f32[3] @cpu\n"
      "  %2 = sin %0 : f32[3] @cpu\n"
      "  %3 = sum %1 {dims = [], keepdim = false} : f32[] @cpu\n"
      "  %4 = expand %3 : f32[3] @cpu\n"
      "  %5 = add %2, %4 : f32[3] @cpu\n"
      "  %6 = mul %1, %5 : f32[3] @cpu\n"
      "  return %6\n"
      "}\n",
      {});
  EXPECT_EQ(count_steps(schedule, StepKind::Elementwise), 2);
  // The first candidate alone would cycle too (%5 depends on it); the second is taken.
  EXPECT_THAT(schedule.steps.back().nodes, ElementsAre(2, 5, 6));
  for (const Step& step : schedule.steps) {
    absl::flat_hash_set<ValueId> members(step.nodes.begin(), step.nodes.end());
    EXPECT_FALSE(members.contains(1) && members.contains(5)) << "a kernel both feeds and reads %3";
  }
}

TEST(Fusion, NoCycleWhenAGroupGrowsADependenceAfterItWasRead) {
  SKIP_IF_FUSION_OFF_BY_ENV();
  // {%5} is a kernel when %7 looks at it: nothing in it depends on {%2}. Then %6 joins it and
  // reads the sum of %2, so the kernel now depends on {%2}. %7 reads %2 and %5: joining {%2}
  // would make {%2} read %5, which needs %6's input, which needs %2. A cycle.
  // Fusion alone: the pipeline's sink-views would drop the expand, which the case needs.
  Schedule schedule = fuse_only(
      "graph @main(%0: f32[3] @cpu, %1: f32[3] @cpu) {\n"
      "  %2 = exp %0 : f32[3] @cpu\n"
      "  %3 = sum %2 {dims = [], keepdim = false} : f32[] @cpu\n"
      "  %4 = expand %3 : f32[3] @cpu\n"
      "  %5 = sin %1 : f32[3] @cpu\n"
      "  %6 = add %5, %4 : f32[3] @cpu\n"
      "  %7 = mul %2, %5 : f32[3] @cpu\n"
      "  return %6, %7\n"
      "}\n",
      {});
  // Every step scheduled (a cycle would leave some out of the order), and %7 joined the
  // kernel of %5, the one it can join.
  ASSERT_EQ(schedule.steps.size(), 4u);
  EXPECT_THAT(schedule.steps[0].nodes, ElementsAre(2));
  EXPECT_THAT(schedule.steps[3].nodes, ElementsAre(5, 6, 7));

  // Through the frontend, where the cycle left values uncomputed.
  Tensor x0 = tensor({0, 1, 2});
  Tensor x1 = tensor({3, 4, 5});
  Tensor a = x0.exp();
  Tensor p = x1.sin();
  Tensor q = p + a.sum().expand({3});
  Tensor r = a * p;
  EXPECT_EQ(kernels_to_eval({q, r}), 3);
  const double total = std::exp(0.0) + std::exp(1.0) + std::exp(2.0);
  expect_near_all(q.to_vector<float>(),
                  {std::sin(3.0) + total, std::sin(4.0) + total, std::sin(5.0) + total});
  expect_near_all(r.to_vector<float>(),
                  {std::exp(0.0) * std::sin(3.0), std::exp(1.0) * std::sin(4.0),
                   std::exp(2.0) * std::sin(5.0)});
}

TEST(Fusion, ScheduleCheckerCatchesStepsOutOfOrder) {
  // The checker above is what the other cases rely on: it must reject a schedule whose
  // consumer runs before its producer.
  Schedule schedule = schedule_of_text(
      "graph @main(%0: f32[2,2] @cpu) {\n"
      "  %1 = exp %0 : f32[2,2] @cpu\n"
      "  %2 = matmul %1, %1 : f32[2,2] @cpu\n"
      "  return %2\n"
      "}\n");
  ASSERT_EQ(schedule.steps.size(), 2u);
  std::swap(schedule.steps[0], schedule.steps[1]);
  EXPECT_NONFATAL_FAILURE(expect_valid_schedule(schedule), "before any earlier step stored it");
}

TEST(Fusion, KernelNamesAreDeterministic) {
  constexpr char kText[] =
      "graph @main(%0: f32[3] @cpu, %1: f32[3] @cpu) {\n"
      "  %2 = const {value = 2.0} : f32[] @cpu\n"
      "  %3 = add %0, %2 : f32[3] @cpu\n"
      "  %4 = exp %3 : f32[3] @cpu\n"
      "  %5 = mul %4, %1 : f32[3] @cpu\n"
      "  return %5\n"
      "}\n";
  Schedule first = schedule_of_text(kText);
  Schedule second = schedule_of_text(kText);
  ASSERT_EQ(first.steps.size(), 1u);
  EXPECT_EQ(first.steps[0].kernel_key, second.steps[0].kernel_key);
  EXPECT_EQ(first.steps[0].kernel_name(), second.steps[0].kernel_name());
  EXPECT_THAT(first.steps[0].kernel_name(), ::testing::MatchesRegex("k_[0-9a-f]{8}"));

  // The frontend's graph of the same computation is the same kernel.
  Tensor y = tensor({1., 2., 3.});
  Tensor z = tensor({1., 2., 3.});
  Schedule built = schedule_of({(z + 2).exp() * y});
  EXPECT_EQ(built.steps[0].kernel_key, first.steps[0].kernel_key);
  EXPECT_THAT(((z + 2).exp() * y).fused_ir(), HasSubstr(first.steps[0].kernel_name()));
}

TEST(Fusion, KernelKeysDependOnStructureNotSizes) {
  auto key_of = [](const Tensor& t) {
    Schedule schedule = schedule_of({t});
    EXPECT_EQ(schedule.steps.size(), 1u);
    return schedule.steps.empty() ? 0 : schedule.steps[0].kernel_key;
  };
  Tensor small = ones({3});
  Tensor large = ones({1000});
  eval({small, large});
  uint64_t key_small = key_of((small + 2).exp() * small);
  EXPECT_EQ(key_small, key_of((large + 2).exp() * large));
  // Other ops, another constant or another dtype are another kernel.
  EXPECT_NE(key_small, key_of((small + 2).sin() * small));
  EXPECT_NE(key_small, key_of((small + 3).exp() * small));
  EXPECT_NE(key_small, key_of((small.to(kFloat64) + 2).exp() * small));
}

TEST(Fusion, CseMergesIdenticalSubexpressions) {
  Tensor x = tensor({1, 2, 3});
  // Built twice as separate pending nodes; one computation after the passes.
  Tensor result = (x + 1).exp() + (x + 1).exp();
  EXPECT_EQ(count_ops(build_graph(std::vector<LazyRef>{result.value()}).graph, Op::Exp), 2);
  Schedule schedule = schedule_of({result});
  EXPECT_EQ(count_ops(schedule.graph, Op::Exp), 1);
  EXPECT_EQ(count_ops(schedule.graph, Op::Add), 2);
  expect_near_all(result.to_vector<float>(),
                  {2 * std::exp(2.0), 2 * std::exp(3.0), 2 * std::exp(4.0)});

  Graph graph = parse_graph(
      "graph @main(%0: f32[3] @cpu) {\n"
      "  %1 = exp %0 : f32[3] @cpu\n"
      "  %2 = exp %0 : f32[3] @cpu\n"
      "  %3 = add %1, %2 : f32[3] @cpu\n"
      "  return %3\n"
      "}\n");
  run_cse(graph);
  EXPECT_THAT(graph.nodes[3].inputs, ElementsAre(1, 1));
  run_dce(graph);
  EXPECT_EQ(graph.nodes.size(), 3u);
  EXPECT_EQ(count_ops(graph, Op::Exp), 1);
}

TEST(Fusion, CseKeepsDistinctRandomDraws) {
  // Two rand calls draw different numbers (other Philox offsets): they must not merge.
  Tensor a = rand({4});
  Tensor b = rand({4});
  Schedule schedule = schedule_of({a + b});
  EXPECT_EQ(count_ops(schedule.graph, Op::Rand), 2);
}

}  // namespace
}  // namespace lazyfuse

namespace lazyfuse {
namespace {

// Where values round after each op, a float64 sum on a GPU joins no row step, so that it adds as
// the unfused graph's plain reduction does (the GPU's row kernels order a row by its length):
// x - sum(x) stays a reduction and an elementwise step there, and is one row step in float32,
// int64 (exact in any order), on the CPU, and rounding at stores.
TEST(Fusion, AFloat64SumOnAGpuKeepsTheUnfusedOrderWhereValuesRoundAfterEachOp) {
  auto kinds = [](const std::string& dtype, const std::string& device, HalfRounding rounding) {
    const std::string t = dtype + "[4,60] @" + device, r = dtype + "[4,1] @" + device;
    const Schedule schedule = schedule_of_text(
        "graph @main(%0: " + t + ") {\n  %1 = sum %0 {dims = [1], keepdim = true} : " + r +
            "\n  %2 = sub %0, %1 : " + t + "\n  return %2\n}",
        {.half_rounding = rounding});
    return std::pair{count_steps(schedule, StepKind::Row), static_cast<int>(schedule.steps.size())};
  };
  EXPECT_EQ(kinds("f64", "cuda:0", HalfRounding::EachOp), std::pair(0, 2));
  EXPECT_EQ(kinds("f32", "cuda:0", HalfRounding::EachOp), std::pair(1, 1));
  EXPECT_EQ(kinds("i64", "cuda:0", HalfRounding::EachOp), std::pair(1, 1));
  EXPECT_EQ(kinds("f64", "cpu", HalfRounding::EachOp), std::pair(1, 1));
  EXPECT_EQ(kinds("f64", "cuda:0", HalfRounding::AtStores), std::pair(1, 1));
}

TEST(Fusion, SoftmaxIsOneKernelAndMatchesTheReference) {
  SKIP_IF_FUSION_OFF_BY_ENV();
  std::vector<double> values(6 * 700);
  for (size_t i = 0; i < values.size(); ++i)
    values[i] = std::sin(0.37 * static_cast<double>(i)) * 4;
  Tensor x = from_vector(values, {6, 700});
  auto softmax = [](const Tensor& t) {
    Tensor e = (t - t.max(1, true)).exp();
    return e / e.sum({1}, true);
  };
  EXPECT_EQ(kernels_to_eval({softmax(x)}), 1);
  std::vector<float> got = softmax(x).to_vector<float>();
  std::vector<double> want(values.size());
  for (int r = 0; r < 6; ++r) {
    double m = -INFINITY, total = 0;
    for (int c = 0; c < 700; ++c)
      m = std::max(m, static_cast<double>(static_cast<float>(values[r * 700 + c])));
    for (int c = 0; c < 700; ++c) total += std::exp(static_cast<float>(values[r * 700 + c]) - m);
    for (int c = 0; c < 700; ++c)
      want[r * 700 + c] = std::exp(static_cast<float>(values[r * 700 + c]) - m) / total;
  }
  expect_near_all(got, want);
  // Fused and unfused give the same bits: the rows are reduced the same way.
  Tensor unfused = softmax(x);
  eval({unfused}, EvalOptions{.fusion = false});
  EXPECT_EQ(unfused.to_vector<float>(), got);
}

// Enough rows for the CPU to run the row step a block of rows at a time (Note [Row blocks] in
// runtime/cpu/cpu_backend.cc), the last block short, with the exponentials between the parts held a
// block at a time: the float64 values, and the same bits unfused and on one or two threads. A
// second softmax also returns its exponentials, which are then stored whole.
TEST(Fusion, RowStepsInBlocksOfRowsMatchFloat64AndUnfused) {
  SKIP_IF_FUSION_OFF_BY_ENV();
  // A prime number of rows: whatever rows a block takes, the last block is short.
  const int rows = 701, columns = 96;
  std::vector<double> values(rows * columns);
  for (size_t i = 0; i < values.size(); ++i)
    values[i] =
        std::sin(0.37 * static_cast<double>(i)) * 4 + std::cos(0.011 * static_cast<double>(i));
  Tensor x = from_vector(values, {rows, columns});
  auto softmax = [](const Tensor& t) {
    Tensor e = (t - t.max(1, true)).exp();
    return std::pair{e / e.sum({1}, true), e};
  };
  std::vector<double> want(values.size()), want_exp(values.size()), want_log(values.size());
  for (int r = 0; r < rows; ++r) {
    double m = -INFINITY, total = 0;
    for (int c = 0; c < columns; ++c)
      m = std::max(m, static_cast<double>(static_cast<float>(values[r * columns + c])));
    for (int c = 0; c < columns; ++c)
      total += std::exp(static_cast<float>(values[r * columns + c]) - m);
    for (int c = 0; c < columns; ++c) {
      const double shifted = static_cast<float>(values[r * columns + c]) - m;
      want_exp[r * columns + c] = std::exp(shifted);
      want[r * columns + c] = std::exp(shifted) / total;
      want_log[r * columns + c] = shifted - std::log(total);
    }
  }
  const int threads = omp_get_max_threads();
  std::vector<std::vector<float>> runs;
  for (int t : {1, 2}) {
    omp_set_num_threads(t);
    Tensor alone = softmax(x).first;
    Tensor logs = nn::functional::log_softmax(x, 1);
    eval({alone, logs});
    auto [probabilities, exps] = softmax(x);
    eval({probabilities, exps});
    expect_near_all(alone.to_vector<float>(), want);
    expect_near_all(probabilities.to_vector<float>(), want);
    expect_near_all(exps.to_vector<float>(), want_exp);
    expect_near_all(logs.to_vector<float>(), want_log);
    for (const Tensor& result : {alone, probabilities, logs})
      runs.push_back(result.to_vector<float>());
    Tensor unfused = softmax(x).first, unfused_logs = nn::functional::log_softmax(x, 1);
    eval({unfused, unfused_logs}, EvalOptions{.fusion = false});
    EXPECT_EQ(unfused.to_vector<float>(), runs[runs.size() - 3]) << t << " threads";
    EXPECT_EQ(unfused_logs.to_vector<float>(), runs.back()) << t << " threads";
  }
  omp_set_num_threads(threads);
  for (size_t k = 0; k < 3; ++k) EXPECT_EQ(runs[k], runs[k + 3]) << "one thread against two";
}

TEST(Fusion, AReductionsEpilogueNeverTakesAnotherReduction) {
  // Before a fix, the normalisation's group, already holding the sum after it (without keepdim),
  // was merged into the first sum's step as a purely elementwise epilogue would be. Now that
  // sum reduces the same rows as the others and joins their row step whole: one pass each.
  Schedule schedule = schedule_of_text(R"(graph @main(%0: f32[8,1024] @cpu) {
  %1 = max %0 {dims = [1], keepdim = true} : f32[8,1] @cpu
  %2 = sub %0, %1 : f32[8,1024] @cpu
  %3 = exp %2 : f32[8,1024] @cpu
  %4 = sum %3 {dims = [1], keepdim = true} : f32[8,1] @cpu
  %5 = div %3, %4 : f32[8,1024] @cpu
  %6 = sum %5 {dims = [1]} : f32[8] @cpu
  return %6
})");
  ASSERT_EQ(schedule.steps.size(), 1u);
  EXPECT_EQ(schedule.steps[0].outputs, std::vector<ValueId>{6});
}

}  // namespace
}  // namespace lazyfuse

namespace lazyfuse {
namespace {

// An expand reaching an op of scalar constants stays there: moved, the op would keep its
// operands' scalar shape under the view's (the verifier caught it in a Debug build's fuzz run,
// on a graph from the float64 check's conditioning probe).
TEST(Fusion, ViewsStopAtOpsOfScalarConstants) {
  Graph graph = parse_graph(R"(graph @main(%0: f64[1,1] @cpu) {
  %1 = const {value = 1.0} : f64[] @cpu
  %2 = const {value = 1.00048828125} : f64[] @cpu
  %3 = mul %1, %2 : f64[] @cpu
  %4 = mul %0, %3 : f64[1,1] @cpu
  %5 = permute %4 {dims = [1, 0]} : f64[1,1] @cpu
  return %5
})");
  run_placement(graph);
  run_sink_views(graph);
  EXPECT_NO_THROW(verify(graph)) << print_graph(graph);
  bool scalar_mul = false;
  for (const Node& node : graph.nodes) scalar_mul |= node.op == Op::Mul && node.shape.empty();
  EXPECT_TRUE(scalar_mul) << print_graph(graph);
}

TEST(Fusion, ViewsOfElementwiseResultsMoveOntoTheirOperands) {
  SKIP_IF_FUSION_OFF_BY_ENV();
  std::vector<double> av(12), bv(12), cv(12);
  for (int i = 0; i < 12; ++i) {
    av[i] = 0.1 * i;
    bv[i] = 1.0 - 0.05 * i;
    cv[i] = 0.3 * (i % 5);
  }
  Tensor a = from_vector(av, {4, 3}), b = from_vector(bv, {4, 3}), c = from_vector(cv, {3, 4});
  Tensor r = (a + b).exp().t().narrow(1, 1, 2) * c.narrow(1, 1, 2);
  EXPECT_EQ(kernels_to_eval({r}), 1);
  std::vector<float> got = r.to_vector<float>();
  std::vector<double> want;
  for (int i = 0; i < 3; ++i)
    for (int j = 1; j < 3; ++j)
      want.push_back(
          std::exp(static_cast<float>(av[j * 3 + i]) + static_cast<float>(bv[j * 3 + i])) *
          static_cast<float>(cv[i * 4 + j]));
  expect_near_all(got, want);
  // A value that is also used elsewhere is not recomputed under the view: it stays stored.
  Tensor shared = (a * 2).exp();
  EXPECT_EQ(kernels_to_eval({shared.t() + 1, shared}), 2);
}

}  // namespace
}  // namespace lazyfuse

namespace lazyfuse {
namespace {

TEST(Fusion, AbsorbedPrologueKeepsItsDependencesVisible) {
  // Found by lazyfuse fuzz: the mean absorbed its prologue (the cast) but not the cast's outside
  // operand, so the sum's epilogue search could not see that the mean depends on the sum, and
  // merged the group reading the mean into the sum's step: a cycle between steps.
  Schedule schedule = schedule_of_text(R"(graph @main(%0: i32[1] @cpu) {
  %1 = sum %0 {dims = [-1], keepdim = true} : i64[1] @cpu
  %2 = cast %1 : f32[1] @cpu
  %3 = mean %2 {dims = [-1], keepdim = true} : f32[1] @cpu
  %4 = cast %1 : i32[1] @cpu
  %5 = add %3, %4 : f32[1] @cpu
  %6 = add %1, %4 : i64[1] @cpu
  %7 = add %6, %4 : i64[1] @cpu
  return %5, %7
})");
  EXPECT_EQ(count_steps(schedule, StepKind::Reduction) + count_steps(schedule, StepKind::Row), 2)
      << print_schedule(schedule);
}

}  // namespace
}  // namespace lazyfuse

// Note [Horizontal fusion]: what does not depend on each other shares kernels and launches.
namespace lazyfuse {
namespace {

std::vector<double> sines(size_t n, double scale) {
  std::vector<double> values(n);
  for (size_t i = 0; i < n; ++i) values[i] = std::sin(scale * static_cast<double>(i + 1));
  return values;
}

TEST(HorizontalFusion, SiblingsReadingOneInputAreOneKernelReadingItOnce) {
  SKIP_IF_FUSION_OFF_BY_ENV();
  const std::vector<double> a_values = sines(12, 0.7), b_values = sines(12, 1.3);
  Tensor a = from_vector(a_values, {4, 3});
  Tensor b = from_vector(b_values, {4, 3});
  Tensor e = a.exp(), s = a.sin() * b;
  Schedule schedule = schedule_of({e, s});
  ASSERT_EQ(schedule.steps.size(), 1u);
  EXPECT_EQ(schedule.steps[0].kind, StepKind::Elementwise);
  EXPECT_EQ(schedule.steps[0].inputs.size(), 2u) << "a is read once, by both";
  EXPECT_EQ(schedule.steps[0].outputs.size(), 2u);
  EXPECT_EQ(kernels_to_eval({e, s}), 1);
  std::vector<double> want_e, want_s;
  for (size_t i = 0; i < a_values.size(); ++i) {
    const double x = static_cast<float>(a_values[i]);
    want_e.push_back(std::exp(x));
    want_s.push_back(std::sin(x) * static_cast<float>(b_values[i]));
  }
  expect_near_all(e.to_vector<float>(), want_e);
  expect_near_all(s.to_vector<float>(), want_s);
}

TEST(HorizontalFusion, IndependentKernelsOfDifferentSpacesShareOneLaunch) {
  SKIP_IF_FUSION_OFF_BY_ENV();
  const std::vector<double> a_values = sines(12, 0.3), b_values = sines(5, 0.9),
                            c_values = sines(8, 1.7);
  Tensor a = from_vector(a_values, {4, 3});
  Tensor b = from_vector(b_values, {5});
  Tensor c = from_vector(c_values, {2, 2, 2});
  Tensor x = a.exp(), y = b.abs().sqrt() + 1, z = c * 3 - 1;
  Schedule schedule = schedule_of({x, y, z});
  ASSERT_EQ(schedule.steps.size(), 1u);
  const Step& group = schedule.steps[0];
  ASSERT_EQ(group.kind, StepKind::Group);
  ASSERT_EQ(group.members.size(), 3u);
  EXPECT_EQ(schedule.num_kernels(), 1);
  EXPECT_EQ(group.outputs.size(), 3u);
  EXPECT_THAT(print_schedule(schedule), HasSubstr("// one launch, @g_"));
  EXPECT_EQ(kernels_to_eval({x, y, z}), 1);
  std::vector<double> want_x, want_y, want_z;
  for (double v : a_values) want_x.push_back(std::exp(static_cast<double>(static_cast<float>(v))));
  for (double v : b_values)
    want_y.push_back(std::sqrt(std::abs(static_cast<double>(static_cast<float>(v)))) + 1);
  for (double v : c_values) want_z.push_back(static_cast<double>(static_cast<float>(v)) * 3 - 1);
  expect_near_all(x.to_vector<float>(), want_x);
  expect_near_all(y.to_vector<float>(), want_y);
  expect_near_all(z.to_vector<float>(), want_z);
}

TEST(HorizontalFusion, KernelsOnAPathThroughAnotherStepNeverShareALaunch) {
  SKIP_IF_FUSION_OFF_BY_ENV();
  // relu(exp(x) @ w) depends on exp(x) through the matmul; sin(x), which nothing reads, waits
  // for the last level and shares relu's launch.
  Schedule schedule = schedule_of_text(R"(graph @main(%0: f32[4,4] @cpu, %1: f32[4,4] @cpu) {
  %2 = exp %0 : f32[4,4] @cpu
  %3 = matmul %2, %1 : f32[4,4] @cpu
  %4 = relu %3 : f32[4,4] @cpu
  %5 = sin %0 : f32[4,4] @cpu
  return %4, %5
})");
  ASSERT_EQ(schedule.steps.size(), 3u);
  EXPECT_EQ(schedule.steps[0].kind, StepKind::Elementwise);
  EXPECT_THAT(schedule.steps[0].outputs, ElementsAre(2));
  EXPECT_EQ(schedule.steps[1].kind, StepKind::Matmul);
  EXPECT_EQ(schedule.steps[2].kind, StepKind::Group);
  EXPECT_THAT(schedule.steps[2].outputs, ElementsAre(4, 5));
}

// An optimizer's shape: per parameter, a scalar correction read only by that parameter's
// update, which also reads a gradient from a chain of matmuls. The corrections wait until just
// before the updates and share one launch; the updates share the last one.
TEST(HorizontalFusion, WorkReadLastRunsLateAndTogether) {
  SKIP_IF_FUSION_OFF_BY_ENV();
  Schedule schedule = schedule_of_text(
      R"(graph @main(%0: f32[8,8] @cpu, %1: f32[8,8] @cpu, %2: f32[8] @cpu, %3: f64[] @cpu, %4: f64[] @cpu) {
  %5 = matmul %0, %0 : f32[8,8] @cpu
  %6 = matmul %5, %0 : f32[8,8] @cpu
  %7 = sum %6 {dims = [0], keepdim = false} : f32[8] @cpu
  %8 = const {value = 0.9} : f64[] @cpu
  %9 = pow %8, %3 : f64[] @cpu
  %10 = cast %9 : f32[] @cpu
  %11 = pow %8, %4 : f64[] @cpu
  %12 = cast %11 : f32[] @cpu
  %13 = mul %6, %10 : f32[8,8] @cpu
  %14 = sub %1, %13 : f32[8,8] @cpu
  %15 = mul %7, %12 : f32[8] @cpu
  %16 = sub %2, %15 : f32[8] @cpu
  return %14, %16
})");
  std::vector<StepKind> kinds;
  for (const Step& step : schedule.steps) kinds.push_back(step.kind);
  // The corrections run after the matmuls (as late as their readers allow), in one launch with
  // the reduction that shares their level, and before the updates.
  EXPECT_THAT(kinds,
              ElementsAre(StepKind::Matmul, StepKind::Matmul, StepKind::Group, StepKind::Group));
  ASSERT_EQ(schedule.steps[2].members.size(), 3u);
  EXPECT_EQ(schedule.steps[2].members[2].kind, StepKind::Column);
  EXPECT_THAT(schedule.steps[2].outputs, ElementsAre(10, 12, 7));
  EXPECT_EQ(schedule.steps[3].members.size(), 2u);
  EXPECT_THAT(schedule.steps[3].outputs, ElementsAre(14, 16));
}

TEST(HorizontalFusion, SiblingsStayApartWhereTheUnionWouldPassTheCaps) {
  constexpr char kSiblings[] = R"(graph @main(%0: f32[4] @cpu, %1: f32[4] @cpu, %2: f32[4] @cpu) {
  %3 = add %0, %1 : f32[4] @cpu
  %4 = mul %0, %2 : f32[4] @cpu
  return %3, %4
})";
  EXPECT_EQ(schedule_of_text(kSiblings).steps.size(), 1u);
  FusionOptions options;
  options.max_inputs = 2;
  Schedule apart = schedule_of_text(kSiblings, options);
  ASSERT_EQ(apart.steps.size(), 1u);
  EXPECT_EQ(apart.steps[0].kind, StepKind::Group) << "three inputs are over the cap of two";
}

TEST(HorizontalFusion, FusionOffLeavesEveryKernelAlone) {
  FusionOptions off;
  off.enabled = false;
  Schedule schedule = schedule_of_text(R"(graph @main(%0: f32[4] @cpu, %1: f32[3] @cpu) {
  %2 = exp %0 : f32[4] @cpu
  %3 = exp %1 : f32[3] @cpu
  return %2, %3
})",
                                       off);
  EXPECT_EQ(count_steps(schedule, StepKind::Elementwise), 2);
}

}  // namespace
}  // namespace lazyfuse

namespace lazyfuse {
namespace {

// The gradient of a keepdim sum spreads it with an expand; an elementwise op broadcasts it
// anyway, so sink-views drops the expand, and the row reduction takes the op into its kernel
// (log-softmax's backward: one kernel for the row sum and what reads it).
TEST(Fusion, ExpandOfARowSumReadByABroadcastingOpJoinsTheRowKernel) {
  SKIP_IF_FUSION_OFF_BY_ENV();
  constexpr char kGrad[] = R"(graph @main(%0: f32[4,10] @cpu, %1: f32[4,10] @cpu) {
  %2 = sum %0 {dims = [1], keepdim = true} : f32[4,1] @cpu
  %3 = expand %2 : f32[4,10] @cpu
  %4 = mul %3, %1 : f32[4,10] @cpu
  %5 = sub %0, %4 : f32[4,10] @cpu
  return %5
})";
  Graph graph = parse_graph(kGrad);
  run_sink_views(graph);
  EXPECT_EQ(count_ops(graph, Op::Expand), 0);
  Schedule schedule = schedule_of_text(kGrad);
  ASSERT_EQ(schedule.steps.size(), 1u);
  EXPECT_EQ(schedule.steps[0].kind, StepKind::Row);
  // A unary op cannot broadcast: its expand stays.
  Graph unary = parse_graph(R"(graph @main(%0: f32[4,10] @cpu) {
  %1 = sum %0 {dims = [1], keepdim = true} : f32[4,1] @cpu
  %2 = expand %1 : f32[4,10] @cpu
  %3 = neg %2 : f32[4,10] @cpu
  return %3
})");
  run_sink_views(unary);
  EXPECT_EQ(count_ops(unary, Op::Expand), 1);

  const std::vector<double> x = sines(40, 0.4), y = sines(40, 1.1);
  Tensor tx = from_vector(x, {4, 10}), ty = from_vector(y, {4, 10});
  Tensor r = tx - tx.sum({1}, true).expand({4, 10}) * ty;
  EXPECT_EQ(kernels_to_eval({r}), 1);
  std::vector<double> want(40);
  for (int row = 0; row < 4; ++row) {
    double total = 0;
    for (int c = 0; c < 10; ++c) total += static_cast<float>(x[row * 10 + c]);
    for (int c = 0; c < 10; ++c)
      want[row * 10 + c] =
          static_cast<float>(x[row * 10 + c]) - total * static_cast<float>(y[row * 10 + c]);
  }
  expect_near_all(r.to_vector<float>(), want);
}

}  // namespace
}  // namespace lazyfuse

namespace lazyfuse {
namespace {

// Fusion's phase 0: a matmul's bias add and relu are its step's epilogue (one cuBLASLt call on a
// GPU, one pass over the product on the CPU); the relu's mask, which its gradient reads, is a
// kernel of its own that the backward's kernel joins.
TEST(Fusion, BiasAndReluAfterAMatmulAreItsEpilogue) {
  SKIP_IF_FUSION_OFF_BY_ENV();
  Schedule schedule = schedule_of_text(
      R"(graph @main(%0: f32[4,3] @cpu, %1: f32[5,3] @cpu, %2: f32[5] @cpu, %3: f32[4,5] @cpu) {
  %4 = permute %1 {dims = [1, 0]} : f32[3,5] @cpu
  %5 = matmul %0, %4 : f32[4,5] @cpu
  %6 = add %5, %2 : f32[4,5] @cpu
  %7 = relu %6 : f32[4,5] @cpu
  %8 = const {value = 0.0} : f32[] @cpu
  %9 = gt %7, %8 : bool[4,5] @cpu
  %10 = where %9, %3, %8 : f32[4,5] @cpu
  return %7, %10
})");
  ASSERT_EQ(count_steps(schedule, StepKind::Matmul), 1);
  for (const Step& step : schedule.steps) {
    if (step.kind != StepKind::Matmul) continue;
    EXPECT_THAT(step.nodes, ElementsAre(5, 6, 7));
    EXPECT_THAT(step.inputs, ElementsAre(0, 4, 2));
    EXPECT_THAT(step.outputs, ElementsAre(7));
  }
  EXPECT_EQ(schedule.num_kernels(), 2);  // the matmul with its epilogue; the mask and the where

  // The matmul stays alone where its product is read twice, returned, or added to something that
  // is not a vector over its columns; the relu stays out where the sum is read elsewhere.
  auto epilogue_nodes = [](const std::string& body) {
    Schedule s = schedule_of_text(
        "graph @main(%0: f32[4,3] @cpu, %1: f32[3,5] @cpu, %2: f32[5] @cpu, %3: f32[4,1] @cpu) "
        "{\n  %4 = matmul %0, %1 : f32[4,5] @cpu\n" +
        body + "}\n");
    for (const Step& step : s.steps)
      if (step.kind == StepKind::Matmul) return step.nodes.size();
    return size_t{0};
  };
  EXPECT_EQ(epilogue_nodes("  %5 = add %4, %2 : f32[4,5] @cpu\n  return %5\n"), 2u);
  EXPECT_EQ(epilogue_nodes("  %5 = add %2, %4 : f32[4,5] @cpu\n  %6 = relu %5 : f32[4,5] @cpu\n"
                           "  return %6\n"),
            3u);
  EXPECT_EQ(epilogue_nodes("  %5 = add %4, %2 : f32[4,5] @cpu\n  %6 = relu %5 : f32[4,5] @cpu\n"
                           "  return %5, %6\n"),
            2u);
  EXPECT_EQ(epilogue_nodes("  %5 = add %4, %2 : f32[4,5] @cpu\n  return %4, %5\n"), 1u);
  EXPECT_EQ(epilogue_nodes("  %5 = add %4, %3 : f32[4,5] @cpu\n  return %5\n"), 1u);
  EXPECT_EQ(epilogue_nodes("  %5 = add %4, %2 : f32[4,5] @cpu\n  %6 = exp %4 : f32[4,5] @cpu\n"
                           "  return %5, %6\n"),
            1u);

  // Through the frontend, against float64.
  const std::vector<double> x = sines(12, 0.5), w = sines(15, 0.8), b = sines(5, 1.9);
  Tensor tx = from_vector(x, {4, 3}), tw = from_vector(w, {5, 3}), tb = from_vector(b, {5});
  Tensor y = (tx.matmul(tw.t()) + tb).relu();
  EXPECT_EQ(kernels_to_eval({y}), 1);
  std::vector<double> want(20);
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 5; ++j) {
      double acc = static_cast<float>(b[j]);
      for (int c = 0; c < 3; ++c)
        acc += static_cast<double>(static_cast<float>(x[i * 3 + c])) *
               static_cast<float>(w[j * 3 + c]);
      want[i * 5 + j] = std::max(acc, 0.0);
    }
  expect_near_all(y.to_vector<float>(), want);
}

}  // namespace
}  // namespace lazyfuse

namespace lazyfuse {
namespace {

// Twelve results of the same two tensors evaluated together: the ten elementwise ones are one
// kernel reading each tensor once (siblings), and the two reductions share its launch.
TEST(HorizontalFusion, TwelveResultsOfTwoTensorsAreOneLaunch) {
  SKIP_IF_FUSION_OFF_BY_ENV();
  const std::vector<double> a_values = sines(64 * 32, 0.37), b_values = sines(64 * 32, 0.91);
  Tensor a = from_vector(a_values, {64, 32}), b = from_vector(b_values, {64, 32});
  const std::vector<Tensor> results = {a + b,     a - b,    a * b,          a / b,
                                       a.exp(),   b.sin(),  (a * b).relu(), a.abs().sqrt(),
                                       b * 2 + 1, a.tanh(), a.sum({1}),     b.amax({0})};
  Schedule schedule = schedule_of(results);
  ASSERT_EQ(schedule.steps.size(), 1u);
  ASSERT_EQ(schedule.steps[0].kind, StepKind::Group);
  ASSERT_EQ(schedule.steps[0].members.size(), 3u);
  const Step& elementwise = schedule.steps[0].members[0];
  EXPECT_EQ(elementwise.kind, StepKind::Elementwise);
  EXPECT_EQ(elementwise.inputs.size(), 2u);
  EXPECT_EQ(elementwise.outputs.size(), 10u);
  EXPECT_EQ(kernels_to_eval(results), 1);
  // Each against float64 (the float32 inputs as float64).
  std::vector<std::function<double(double, double)>> element = {
      [](double x, double y) { return x + y; },
      [](double x, double y) { return x - y; },
      [](double x, double y) { return x * y; },
      [](double x, double y) { return x / y; },
      [](double x, double) { return std::exp(x); },
      [](double, double y) { return std::sin(y); },
      [](double x, double y) { return std::max(x * y, 0.0); },
      [](double x, double) { return std::sqrt(std::abs(x)); },
      [](double, double y) { return y * 2 + 1; },
      [](double x, double) { return std::tanh(x); }};
  for (size_t r = 0; r < element.size(); ++r) {
    std::vector<double> want;
    for (size_t i = 0; i < a_values.size(); ++i)
      want.push_back(element[r](static_cast<float>(a_values[i]), static_cast<float>(b_values[i])));
    SCOPED_TRACE(r);
    expect_near_all(results[r].to_vector<float>(), want);
  }
  std::vector<double> row_sums(64, 0), column_max(32, -INFINITY);
  for (int i = 0; i < 64; ++i)
    for (int j = 0; j < 32; ++j) {
      row_sums[i] += static_cast<float>(a_values[i * 32 + j]);
      column_max[j] =
          std::max(column_max[j], static_cast<double>(static_cast<float>(b_values[i * 32 + j])));
    }
  expect_near_all(results[10].to_vector<float>(), row_sums);
  expect_near_all(results[11].to_vector<float>(), column_max);
}

}  // namespace
}  // namespace lazyfuse

namespace lazyfuse {
namespace {

// What `lazyfuse codegen --target cpu` prints for a group: each member's listing, a
// reduction's as for a reduction step of its own.
TEST(HorizontalFusion, CpuListingOfAGroupListsEveryMember) {
  Schedule schedule = schedule_of_text(R"(graph @main(%0: f32[32,64] @cpu, %1: f32[7] @cpu) {
  %2 = sum %0 {dims = [0], keepdim = false} : f32[64] @cpu
  %3 = exp %1 : f32[7] @cpu
  return %2, %3
})");
  ASSERT_EQ(schedule.steps.size(), 1u);
  ASSERT_EQ(schedule.steps[0].kind, StepKind::Group);
  const std::string listing = cpu_step_listing(schedule.graph, schedule.steps[0]);
  EXPECT_THAT(listing, HasSubstr("exp f32"));
  EXPECT_THAT(listing, HasSubstr("// reduce: %2 = sum %0"));
}

}  // namespace
}  // namespace lazyfuse

namespace lazyfuse {
namespace {

// A norm of every gradient (what clipping by the global norm starts from): each a reduction with
// its square fused in, all independent, so one launch (PyTorch's foreach norm).
TEST(HorizontalFusion, ReductionsWithFusedWorkShareALaunch) {
  SKIP_IF_FUSION_OFF_BY_ENV();
  const std::vector<Shape> shapes = {{64, 32}, {32}, {10, 64}, {7}};
  std::vector<std::vector<double>> values;
  std::vector<Tensor> squares;
  for (size_t k = 0; k < shapes.size(); ++k) {
    values.push_back(sines(static_cast<size_t>(numel(shapes[k])), 0.3 + 0.2 * k));
    Tensor g = from_vector(values.back(), shapes[k]);
    squares.push_back((g * g).sum());
  }
  Schedule schedule = schedule_of(squares);
  ASSERT_EQ(schedule.steps.size(), 1u);
  ASSERT_EQ(schedule.steps[0].kind, StepKind::Group);
  ASSERT_EQ(schedule.steps[0].members.size(), 4u);
  for (const Step& member : schedule.steps[0].members) {
    EXPECT_EQ(member.kind, StepKind::Reduction);
    EXPECT_EQ(member.nodes.size(), 2u);  // the square, then its sum
  }
  EXPECT_EQ(kernels_to_eval(squares), 1);
  for (size_t k = 0; k < shapes.size(); ++k) {
    double want = 0;
    for (double v : values[k])
      want += static_cast<double>(static_cast<float>(v)) * static_cast<float>(v);
    expect_near_all(squares[k].to_vector<float>(), {want});
  }
}

}  // namespace
}  // namespace lazyfuse

// Note [The fusion algorithm], phase 6: a row step takes its row values (one per row, between the
// passes), the full-size work around it and the reductions of the same rows.
namespace lazyfuse {
namespace {

// A float32-rounded copy, as the tensors hold their inputs.
std::vector<double> as_float(std::vector<double> values) {
  for (double& v : values) v = static_cast<float>(v);
  return values;
}

TEST(Fusion, NormalizationsAreOneKernelEach) {
  SKIP_IF_FUSION_OFF_BY_ENV();
  constexpr int64_t kRows = 6, kColumns = 40;
  const std::vector<double> x = as_float(sines(kRows * kColumns, 0.37)),
                            residual = as_float(sines(kRows * kColumns, 2.3)),
                            w = as_float(sines(kColumns, 1.7)), b = as_float(sines(kColumns, 0.9));
  Tensor tx = from_vector(x, {kRows, kColumns}), tr = from_vector(residual, {kRows, kColumns}),
         tw = from_vector(w, {kColumns}), tb = from_vector(b, {kColumns});
  Tensor mask = tr > -0.5;
  // Each row of the float64 reference through `row`, given the row's values.
  auto reference = [&](const std::vector<double>& in,
                       const std::function<void(const double*, double*)>& row) {
    std::vector<double> out(in.size());
    for (int64_t r = 0; r < kRows; ++r) row(&in[r * kColumns], &out[r * kColumns]);
    return out;
  };
  auto layer_norm = [&](const double* v, double* out) {
    double mean = 0, variance = 0;
    for (int64_t c = 0; c < kColumns; ++c) mean += v[c] / kColumns;
    for (int64_t c = 0; c < kColumns; ++c) variance += (v[c] - mean) * (v[c] - mean) / kColumns;
    for (int64_t c = 0; c < kColumns; ++c)
      out[c] = (v[c] - mean) / std::sqrt(variance + 1e-5) * w[c] + b[c];
  };
  std::vector<double> summed(x.size());
  for (size_t i = 0; i < x.size(); ++i) summed[i] = x[i] + residual[i];
  struct Case {
    const char* name;
    std::function<Tensor()> make;
    std::vector<double> want;
  };
  const std::vector<Case> cases = {
      {"layer_norm", [&] { return nn::functional::layer_norm(tx, {kColumns}, tw, tb, 1e-5); },
       reference(x, layer_norm)},
      {"layer_norm of a residual sum",
       [&] { return nn::functional::layer_norm(tx + tr, {kColumns}, tw, tb, 1e-5); },
       reference(summed, layer_norm)},
      {"rms_norm", [&] { return tx * ((tx * tx).mean({1}, true) + 1e-6).rsqrt() * tw; },
       reference(x,
                 [&](const double* v, double* out) {
                   double mean_square = 0;
                   for (int64_t c = 0; c < kColumns; ++c) mean_square += v[c] * v[c] / kColumns;
                   for (int64_t c = 0; c < kColumns; ++c)
                     out[c] = v[c] / std::sqrt(mean_square + 1e-6) * w[c];
                 })},
      {"log_softmax", [&] { return log_softmax(tx, 1); },
       reference(x,
                 [&](const double* v, double* out) {
                   double m = -INFINITY, total = 0;
                   for (int64_t c = 0; c < kColumns; ++c) m = std::max(m, v[c]);
                   for (int64_t c = 0; c < kColumns; ++c) total += std::exp(v[c] - m);
                   for (int64_t c = 0; c < kColumns; ++c) out[c] = v[c] - m - std::log(total);
                 })},
      {"scaled softmax with a mask", [&] { return softmax(where(mask, tx * 0.125, -INFINITY), 1); },
       reference(x,
                 [&](const double* v, double* out) {
                   const int64_t row = (v - x.data()) / kColumns;
                   const double* r = &residual[row * kColumns];
                   double m = -INFINITY, total = 0;
                   for (int64_t c = 0; c < kColumns; ++c)
                     if (r[c] > -0.5) m = std::max(m, v[c] * 0.125);
                   for (int64_t c = 0; c < kColumns; ++c)
                     total += r[c] > -0.5 ? std::exp(v[c] * 0.125 - m) : 0;
                   for (int64_t c = 0; c < kColumns; ++c)
                     out[c] = r[c] > -0.5 ? std::exp(v[c] * 0.125 - m) / total : 0;
                 })},
      {"nn::functional::rms_norm",
       [&] { return nn::functional::rms_norm(tx, {kColumns}, tw, 1e-6); },
       reference(x,
                 [&](const double* v, double* out) {
                   double mean_square = 0;
                   for (int64_t c = 0; c < kColumns; ++c) mean_square += v[c] * v[c] / kColumns;
                   for (int64_t c = 0; c < kColumns; ++c)
                     out[c] = v[c] / std::sqrt(mean_square + 1e-6) * w[c];
                 })},
      {"nn::functional::normalize", [&] { return nn::functional::normalize(tx); },
       reference(x,
                 [&](const double* v, double* out) {
                   double squares = 0;
                   for (int64_t c = 0; c < kColumns; ++c) squares += v[c] * v[c];
                   for (int64_t c = 0; c < kColumns; ++c) out[c] = v[c] / std::sqrt(squares);
                 })},
      {"rows over their L2 norm", [&] { return tx / (tx * tx).sum({1}, true).sqrt(); },
       reference(x, [&](const double* v, double* out) {
         double squares = 0;
         for (int64_t c = 0; c < kColumns; ++c) squares += v[c] * v[c];
         for (int64_t c = 0; c < kColumns; ++c) out[c] = v[c] / std::sqrt(squares);
       })}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Tensor fused = c.make();
    EXPECT_EQ(kernels_to_eval({fused}), 1);
    const std::vector<float> got = fused.to_vector<float>();
    ASSERT_EQ(got.size(), c.want.size());
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_NEAR(got[i], c.want[i], 2e-5 * std::max(1.0, std::abs(c.want[i]))) << "element " << i;
    // The row values are the unfused program's, bit for bit.
    Tensor unfused = c.make();
    eval({unfused}, EvalOptions{.fusion = false});
    EXPECT_EQ(unfused.to_vector<float>(), got);
  }
}

// Cross-entropy and its gradient: the row's max, its sum of exponentials, the sum of the
// gradient reaching the log-sum and the loss's sum over the row in one kernel, with the log of
// the sum, the one-hot of the labels and the gradient's constants inside it; the mean over the
// batch is the one kernel besides.
TEST(Fusion, CrossEntropyAndItsGradientAreOneRowKernel) {
  SKIP_IF_FUSION_OFF_BY_ENV();
  constexpr int64_t kBatch = 8, kClasses = 10;
  const std::vector<double> logits = as_float(sines(kBatch * kClasses, 0.83));
  const std::vector<int64_t> labels = {3, 0, 9, 4, 4, 7, 1, 2};
  Tensor x = from_vector(logits, {kBatch, kClasses}).requires_grad_();
  Tensor y = tensor({3, 0, 9, 4, 4, 7, 1, 2}, kInt64);
  auto loss_and_gradient = [&] {
    Tensor loss = nn::functional::cross_entropy(x, y);
    return std::vector<Tensor>{loss, grad({loss}, {x})[0]};
  };
  std::vector<Tensor> fused = loss_and_gradient();
  const Schedule schedule = schedule_of(fused);
  EXPECT_EQ(schedule.num_kernels(), 2) << print_schedule(schedule);
  EXPECT_EQ(kernels_to_eval(fused), 2);
  double want_loss = 0;
  std::vector<double> want_gradient(logits.size());
  for (int64_t r = 0; r < kBatch; ++r) {
    const double* v = &logits[r * kClasses];
    double m = -INFINITY, total = 0;
    for (int64_t c = 0; c < kClasses; ++c) m = std::max(m, v[c]);
    for (int64_t c = 0; c < kClasses; ++c) total += std::exp(v[c] - m);
    want_loss -= (v[labels[r]] - m - std::log(total)) / kBatch;
    for (int64_t c = 0; c < kClasses; ++c)
      want_gradient[r * kClasses + c] =
          (std::exp(v[c] - m) / total - (c == labels[r] ? 1.0 : 0.0)) / kBatch;
  }
  EXPECT_NEAR(fused[0].item<double>(), want_loss, 1e-6);
  const std::vector<float> gradient = fused[1].to_vector<float>();
  for (size_t i = 0; i < gradient.size(); ++i)
    EXPECT_NEAR(gradient[i], want_gradient[i], 1e-6) << "element " << i;
  std::vector<Tensor> unfused = loss_and_gradient();
  eval(unfused, EvalOptions{.fusion = false});
  EXPECT_EQ(unfused[0].item<float>(), fused[0].item<float>());
  EXPECT_EQ(unfused[1].to_vector<float>(), gradient);
}

// The classifier under bfloat16 autocast, as llm.c's fused classifier: the product writes the
// logits in bfloat16, and one row kernel reads them once for the loss and writes their gradient
// in bfloat16; no float32 value of the logits' size is stored.
TEST(Fusion, TheClassifierUnderAutocastStoresNoFloat32Logits) {
  SKIP_IF_FUSION_OFF_BY_ENV();
  constexpr int64_t kRows = 12, kWidth = 16, kVocab = 50;
  manual_seed(3);
  Tensor hidden = randn({kRows, kWidth}).requires_grad_();
  Tensor weight = randn({kVocab, kWidth}).requires_grad_();
  const Tensor labels = tensor({3, 49, 0, 17, 17, 8, 22, 41, 5, 30, 12, 1}, kInt64);
  std::vector<Tensor> outputs;
  {
    AutocastGuard autocast(kCPU, kBFloat16);
    const Tensor loss =
        nn::functional::cross_entropy(nn::functional::linear(hidden, weight), labels);
    outputs = grad({loss}, {hidden, weight});
    outputs.push_back(loss);
  }
  const Schedule schedule = schedule_of(outputs);
  const Shape logits_shape = {kRows, kVocab};
  int rows_reading_logits = 0;
  for (const Step& step : schedule.steps) {
    for (ValueId out : step.outputs) {
      const Node& node = schedule.graph.nodes[out];
      if (node.shape == logits_shape) {
        EXPECT_EQ(node.dtype, DType::BFloat16) << "stored " << node.type_str() << "\n"
                                               << print_schedule(schedule);
      }
    }
    if (step.kind != StepKind::Row) continue;
    for (ValueId in : step.inputs)
      rows_reading_logits += schedule.graph.nodes[in].shape == logits_shape &&
                             schedule.graph.nodes[in].dtype == DType::BFloat16;
  }
  EXPECT_EQ(rows_reading_logits, 1) << print_schedule(schedule);
}

// sink-views: an arange its one reader broadcasts over trailing dims takes the reader's shape
// (counting modulo its length), and a reshape of an op of constants folds into the constants.
TEST(Fusion, OneHotClassesAndGradientSeedsTakeTheirReadersShape) {
  Graph graph = parse_graph(R"(graph @main(%0: i64[4,1] @cpu) {
  %1 = arange {start = 0.0, step = 1.0} : i64[3] @cpu
  %2 = eq %0, %1 : bool[4,3] @cpu
  %3 = const {value = 1.0} : f32[4] @cpu
  %4 = const {value = 4.0} : f32[] @cpu
  %5 = div %3, %4 : f32[4] @cpu
  %6 = reshape %5 : f32[4,1] @cpu
  %7 = const {value = 0.0} : f32[] @cpu
  %8 = where %2, %6, %7 : f32[4,3] @cpu
  return %8
})");
  run_sink_views(graph);
  EXPECT_EQ(count_ops(graph, Op::Reshape), 0) << print_graph(graph);
  for (const Node& node : graph.nodes) {
    if (node.op != Op::Arange) continue;
    EXPECT_EQ(node.shape, (Shape{4, 3}));
    EXPECT_EQ(node.attrs.get_int("period"), 3);
  }
  // The one-hot's comparison and its classes are one kernel (the constants' quotient, one per
  // row, is a kernel of its own here, and a row value where a row step reads it).
  Tensor labels = tensor({2, 0, 1, 2}, kInt64).reshape({4, 1});
  Tensor one_hot = (labels == arange(3)).to(kFloat32) * 0.25;
  EXPECT_EQ(kernels_to_eval({one_hot}), 1);
  EXPECT_THAT(one_hot.to_vector<float>(),
              ElementsAre(0, 0, 0.25, 0.25, 0, 0, 0, 0.25, 0, 0, 0, 0.25));
  Tensor one_hot_rows = where(labels == arange(3), full({4, 1}, 1.0) / 4.0, 0.0);
  EXPECT_THAT(one_hot_rows.to_vector<float>(),
              ElementsAre(0, 0, 0.25, 0.25, 0, 0, 0, 0.25, 0, 0, 0, 0.25));
}

}  // namespace
}  // namespace lazyfuse

// Note [The fusion algorithm], phase 7: a sum over the batch takes the work computing its
// operand, stored or not (a ReLU's mask of a gradient and its bias's gradient).
namespace lazyfuse {
namespace {

TEST(Fusion, ColumnSumTakesTheWorkComputingItsOperand) {
  SKIP_IF_FUSION_OFF_BY_ENV();
  constexpr int64_t kRows = 5, kColumns = 40;
  const std::vector<double> h = as_float(sines(kRows * kColumns, 0.61)),
                            g = as_float(sines(kRows * kColumns, 1.9));
  Tensor th = from_vector(h, {kRows, kColumns}), tg = from_vector(g, {kRows, kColumns});
  auto masked_and_sum = [&] {
    Tensor masked = where(th > 0, tg, 0.0);
    return std::vector<Tensor>{masked, masked.sum({0}), (th * tg).sum({0}, true)};
  };
  std::vector<Tensor> fused = masked_and_sum();
  // The stored mask with its sum, and the private product's sum: one kernel each, independent,
  // so one launch.
  const Schedule schedule = schedule_of(fused);
  ASSERT_EQ(schedule.steps.size(), 1u) << print_schedule(schedule);
  ASSERT_EQ(schedule.steps[0].members.size(), 2u) << print_schedule(schedule);
  for (const Step& member : schedule.steps[0].members)
    EXPECT_EQ(member.kind, StepKind::Column) << print_schedule(schedule);
  EXPECT_EQ(kernels_to_eval(fused), 1);
  std::vector<double> want_masked(h.size()), want_sum(kColumns, 0), want_products(kColumns, 0);
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t c = 0; c < kColumns; ++c) {
      const size_t i = static_cast<size_t>(r * kColumns + c);
      want_masked[i] = h[i] > 0 ? g[i] : 0;
      want_sum[c] += want_masked[i];
      want_products[c] += h[i] * g[i];
    }
  EXPECT_EQ(fused[0].to_vector<double>(), want_masked);
  const std::vector<float> sums = fused[1].to_vector<float>(),
                           products = fused[2].to_vector<float>();
  for (int64_t c = 0; c < kColumns; ++c) {
    EXPECT_NEAR(sums[c], want_sum[c], 1e-5) << "column " << c;
    EXPECT_NEAR(products[c], want_products[c], 1e-5) << "column " << c;
  }
  std::vector<Tensor> unfused = masked_and_sum();
  eval(unfused, EvalOptions{.fusion = false});
  for (size_t k = 0; k < fused.size(); ++k)
    EXPECT_EQ(unfused[k].to_vector<float>(), fused[k].to_vector<float>()) << "result " << k;
  // Fewer kept columns than a warp has lanes: the work stays a kernel of its own.
  Tensor narrow = from_vector(g, {kRows * 5, 8});
  EXPECT_EQ(schedule_of({(narrow * 2).sum({0})}).num_kernels(), 2);
}

// A bias that is a constant of one element (a fresh zeros({1}), never evaluated) is computed in
// place by the kernel after the matmul: no epilogue, which would need it stored (linear
// regression's first step crashed on it).
TEST(Fusion, AConstantBiasOfOneElementIsNoEpilogue) {
  SKIP_IF_FUSION_OFF_BY_ENV();
  Tensor x = from_vector({1, 2, 3, 4, 5, 6}, {3, 2});
  Tensor w = from_vector({0.5, -1}, {2, 1});
  Tensor y = x.matmul(w) + zeros({1});
  const Schedule schedule = schedule_of({y});
  for (const Step& step : schedule.steps) {
    if (step.kind == StepKind::Matmul) {
      EXPECT_EQ(step.nodes.size(), 1u) << print_schedule(schedule);
    }
  }
  EXPECT_EQ(y.to_vector<float>(), std::vector<float>({-1.5, -2.5, -3.5}));
}

// Note [Horizontal fusion]: a level whose only launch would be work that can run earlier (a
// scalar computed from params alone) moves it into an earlier level's launch.
TEST(HorizontalFusion, WorkThatCanRunEarlierJoinsAnEarlierLaunch) {
  SKIP_IF_FUSION_OFF_BY_ENV();
  constexpr char kText[] = R"(graph @main(%0: f32[40,40] @cpu, %1: f32[] @cpu) {
  %2 = exp %0 : f32[40,40] @cpu
  %3 = matmul %2, %0 : f32[40,40] @cpu
  %4 = mul %1, %1 : f32[] @cpu
  %5 = matmul %3, %0 : f32[40,40] @cpu
  %6 = mul %5, %4 : f32[40,40] @cpu
  return %6
})";
  Schedule schedule = schedule_of_text(kText);
  ASSERT_EQ(schedule.steps.size(), 4u) << print_schedule(schedule);
  EXPECT_EQ(schedule.steps[0].kind, StepKind::Group) << print_schedule(schedule);
  EXPECT_EQ(schedule.steps[0].members.size(), 2u);
  // The same through the frontend: the values are those of the unfused program.
  Tensor x = from_vector(as_float(sines(1600, 0.013)), {40, 40});
  Tensor count = from_vector({1.5}, {});
  auto make = [&] { return x.exp().matmul(x).matmul(x) * (count * count); };
  Tensor fused = make();
  const Schedule frontend = schedule_of({fused});
  EXPECT_EQ(frontend.steps.size(), 4u) << print_schedule(frontend);
  Tensor unfused = make();
  eval({unfused}, EvalOptions{.fusion = false});
  EXPECT_EQ(fused.to_vector<float>(), unfused.to_vector<float>());
}

}  // namespace
}  // namespace lazyfuse
