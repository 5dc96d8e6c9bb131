// The parts of lazyfuse::distributed a single process can check: collectives in the IR (shapes,
// text, errors), init() and its settings, a job of one process, the sampler's split. Jobs of
// several processes run as the distributed.* tests (tests/distributed_worker.cc).
#include <cstdlib>
#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lazyfuse/ir/infer.h"
#include "lazyfuse/ir/passes/passes.h"
#include "lazyfuse/lazyfuse.h"

namespace lazyfuse {
namespace {

namespace dist = distributed;
using ::testing::HasSubstr;

Attrs attrs_of(std::initializer_list<std::pair<const char*, int64_t>> entries) {
  Attrs attrs;
  for (const auto& [key, value] : entries) attrs.set(key, value);
  return attrs;
}

TEST(DistributedIr, CollectiveShapes) {
  const Shape in = {2, 6};
  const Shape* inputs[] = {&in};
  EXPECT_EQ(infer_shape(Op::AllReduce, inputs, attrs_of({{"reduce_op", 0}}), {}), in);
  EXPECT_EQ(infer_shape(Op::Broadcast, inputs, attrs_of({{"root", 1}}), {}), in);
  EXPECT_EQ(infer_shape(Op::AllGather, inputs, attrs_of({{"dim", 0}, {"world", 3}}), {}),
            Shape({6, 6}));
  EXPECT_EQ(infer_shape(Op::AllGather, inputs, attrs_of({{"dim", -1}, {"world", 3}}), {}),
            Shape({2, 18}));
  EXPECT_EQ(infer_shape(Op::ReduceScatter, inputs,
                        attrs_of({{"reduce_op", 0}, {"dim", 1}, {"world", 3}}), {}),
            Shape({2, 2}));
  try {
    infer_shape(Op::ReduceScatter, inputs, attrs_of({{"reduce_op", 0}, {"dim", 0}, {"world", 4}}),
                {});
    FAIL() << "no ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_THAT(e.what(), HasSubstr("size 2 of dim 0 of [2, 6] does not divide among 4"));
  }
  const Shape scalar = {};
  const Shape* scalars[] = {&scalar};
  EXPECT_THROW(infer_shape(Op::AllGather, scalars, attrs_of({{"dim", 0}, {"world", 2}}), {}),
               ShapeError);
}

TEST(DistributedIr, CollectivesPrintParseAndFuseWithNothing) {
  const char* text = R"(graph @main(%0: f32[4] @cpu) {
  %1 = exp %0 : f32[4] @cpu
  %2 = all_reduce %1 {reduce_op = 1} : f32[4] @cpu
  %3 = mul %2, %2 : f32[4] @cpu
  %4 = all_gather %3 {dim = 0, world = 2} : f32[8] @cpu
  return %4
}
)";
  Graph graph = parse_graph(text);
  EXPECT_EQ(print_graph(graph), text);
  const Schedule schedule = run_pipeline(graph, PipelineOptions{});
  std::vector<StepKind> kinds;
  for (const Step& step : schedule.steps) kinds.push_back(step.kind);
  EXPECT_EQ(kinds, (std::vector<StepKind>{StepKind::Elementwise, StepKind::Collective,
                                          StepKind::Elementwise, StepKind::Collective}));
  EXPECT_EQ(schedule.num_kernels(), 2);
}

TEST(Distributed, CollectivesBeforeInitSayWhereTheyWereMade) {
  ASSERT_FALSE(dist::is_initialized());
  EXPECT_EQ(dist::rank(), 0);
  EXPECT_EQ(dist::world_size(), 1);
  try {
    dist::all_reduce(ones({3}));
    FAIL() << "no DistributedError";
  } catch (const DistributedError& e) {
    EXPECT_THAT(e.what(), HasSubstr("not initialized"));
    EXPECT_THAT(e.what(), HasSubstr("distributed_test.cc:"));
  }
}

TEST(Distributed, InitRejectsVariablesThatAreNotNumbers) {
  ::setenv("RANK", "first", 1);
  try {
    dist::init();
    FAIL() << "no DistributedError";
  } catch (const DistributedError& e) {
    EXPECT_THAT(e.what(), HasSubstr("RANK='first' is not an integer"));
  }
  ::unsetenv("RANK");
  EXPECT_FALSE(dist::is_initialized());
  dist::InitOptions options;
  options.rank = 2;
  options.world_size = 2;
  EXPECT_THROW(dist::init(options), DistributedError);
  options.rank = 0;
  options.world_size = 1;
  options.backend = "mpi";
  EXPECT_THROW(dist::init(options), UnsupportedError);
  EXPECT_FALSE(dist::is_initialized());
}

// A job of one process: every collective is its operand (a sum over one process), gradients
// flow through them, DistributedDataParallel changes nothing.
TEST(Distributed, AJobOfOneProcess) {
  dist::InitOptions options;
  options.world_size = 1;
  options.rank = 0;
  dist::init(options);
  EXPECT_TRUE(dist::is_initialized());
  EXPECT_THROW(dist::init(options), DistributedError);
  EXPECT_EQ(dist::world_size(), 1);
  const std::vector<double> values = {1.5, -2, 3, 0.25};
  Tensor x = from_vector(values, {2, 2}, TensorOptions(kFloat64).requires_grad(true));
  for (ReduceOp op : {ReduceOp::SUM, ReduceOp::AVG, ReduceOp::MAX, ReduceOp::MIN})
    EXPECT_EQ(dist::all_reduce(x, op).to_vector<double>(), values);
  EXPECT_EQ(dist::all_gather(x, 1).sizes(), Shape({2, 2}));
  EXPECT_EQ(dist::reduce_scatter(x, ReduceOp::SUM, 0).to_vector<double>(), values);
  EXPECT_EQ(dist::broadcast(x, 0).to_vector<double>(), values);
  EXPECT_THROW(dist::broadcast(x, 1), DistributedError);
  EXPECT_THROW(dist::send(x, 0), DistributedError);  // not another rank
  // d/dx of sum(3 * all_gather(all_reduce(x))) is 3.
  (dist::all_gather(dist::all_reduce(x)) * 3).sum().backward();
  EXPECT_EQ(x.grad().to_vector<double>(), std::vector<double>(4, 3.0));
  // DistributedDataParallel over one process: the gradient of one process's loss, unchanged, and
  // averaged through the same all_reduce as with many.
  manual_seed(3);
  auto linear = std::make_shared<nn::Linear>(2, 1);
  nn::parallel::DistributedDataParallel ddp(linear);
  Tensor input = from_vector({1.0, 2.0, -1.0, 0.5}, {2, 2});
  ddp.forward(input).sum().backward();
  EXPECT_EQ(linear->weight().grad().to_vector<double>(), std::vector<double>({0.0, 2.5}));
  EXPECT_EQ(linear->bias().grad().to_vector<double>(), std::vector<double>({2.0}));
  EXPECT_EQ(ddp.parameters().size(), 2u);
  // Another backward() that does not reach the module leaves its averaged gradients alone.
  const std::shared_ptr<TensorImpl> averaged = linear->weight().grad().impl();
  Tensor other = ones({2}, TensorOptions(kFloat64).requires_grad(true));
  (other * 2).sum().backward();
  EXPECT_EQ(linear->weight().grad().impl(), averaged);
  dist::barrier();
  dist::destroy_process_group();
  EXPECT_FALSE(dist::is_initialized());
}

TEST(Distributed, SamplerSplitsAsPyTorchsDoes) {
  // Ten samples, three processes: padded to twelve with the first two, every third from r.
  using V = std::vector<int64_t>;
  EXPECT_EQ(dist::DistributedSampler(10, 3, 0, false).indices(), V({0, 3, 6, 9}));
  EXPECT_EQ(dist::DistributedSampler(10, 3, 1, false).indices(), V({1, 4, 7, 0}));
  EXPECT_EQ(dist::DistributedSampler(10, 3, 2, false).indices(), V({2, 5, 8, 1}));
  EXPECT_EQ(dist::DistributedSampler(10, 3, 2, false, 0, /*drop_last=*/true).indices(),
            V({2, 5, 8}));
  // Shuffled: the processes' shares cover every sample, the same on every call, another
  // permutation in another epoch.
  std::multiset<int64_t> seen;
  for (int r = 0; r < 4; ++r)
    for (int64_t i : dist::DistributedSampler(100, 4, r, true, 5).indices()) seen.insert(i);
  EXPECT_EQ(seen.size(), 100u);
  EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), 100u);
  dist::DistributedSampler sampler(100, 4, 1, true, 5);
  const V first = sampler.indices();
  EXPECT_EQ(sampler.indices(), first);
  sampler.set_epoch(1);
  EXPECT_NE(sampler.indices(), first);
  EXPECT_THROW(dist::DistributedSampler(10, 3, 3), Error);
}

}  // namespace
}  // namespace lazyfuse
