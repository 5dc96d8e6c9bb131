// Laziness: what runs when. Building ops computes nothing; reading a value (printing, item,
// to_vector) or eval() computes it, once, and it becomes a leaf that later graphs start from.
// Also the bound on pending work, the IR text a tensor shows, devices, PyTorch's print format,
// memory accounting and concurrent evaluation from several threads.
#include <cmath>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lazyfuse/lazyfuse.h"
#include "lazyfuse/runtime/env.h"
#include "lazyfuse/runtime/host_profile.h"

namespace lazyfuse {
namespace {

using ::testing::HasSubstr;

int64_t evaluations() { return eval_stats().evaluations; }

// Non-overlapping occurrences of `needle` in `text`.
int count_substr(const std::string& text, const std::string& needle) {
  int count = 0;
  for (size_t at = text.find(needle); at != std::string::npos;
       at = text.find(needle, at + needle.size()))
    ++count;
  return count;
}

TEST(Lazy, BuildingOpsComputesNothing) {
  Tensor x = tensor({1, 2, 3});  // data: computed at once
  EXPECT_TRUE(x.is_computed());
  const int64_t before = evaluations();
  Tensor y = (x + 2).exp() * x;
  Tensor z = y.sum();
  Tensor r = rand({4});
  Tensor w = arange(10).to(kFloat32) / 3;
  EXPECT_EQ(evaluations(), before);
  EXPECT_FALSE(y.is_computed());
  EXPECT_FALSE(z.is_computed());
  EXPECT_FALSE(r.is_computed());
  EXPECT_FALSE(w.is_computed());
  // Metadata needs no evaluation either.
  EXPECT_EQ(y.sizes(), Shape({3}));
  EXPECT_EQ(z.dim(), 0);
  EXPECT_EQ(w.dtype(), kFloat32);
  EXPECT_EQ(evaluations(), before);
}

TEST(Lazy, PrintingTriggersEvaluation) {
  Tensor y = tensor({1., 2., 3.}) * 2;
  const int64_t before = evaluations();
  std::ostringstream os;
  os << y;
  EXPECT_EQ(os.str(), "tensor([2., 4., 6.])");
  EXPECT_EQ(evaluations(), before + 1);
  EXPECT_TRUE(y.is_computed());
  // Printing again reads the stored value: nothing is recomputed.
  EXPECT_EQ(y.str(), "tensor([2., 4., 6.])");
  EXPECT_EQ(evaluations(), before + 1);
}

TEST(Lazy, ItemAndToVectorTriggerEvaluation) {
  Tensor x = tensor({1, 2, 3});
  Tensor total = (x * x).sum();
  int64_t before = evaluations();
  EXPECT_FLOAT_EQ(total.item<float>(), 14);
  EXPECT_EQ(evaluations(), before + 1);
  EXPECT_TRUE(total.is_computed());
  EXPECT_DOUBLE_EQ(total.item<double>(), 14);
  EXPECT_EQ(evaluations(), before + 1);

  Tensor doubled = x * 2;
  before = evaluations();
  EXPECT_EQ(doubled.to_vector<float>(), std::vector<float>({2, 4, 6}));
  EXPECT_EQ(evaluations(), before + 1);
  EXPECT_TRUE(doubled.is_computed());
}

TEST(Lazy, EvalOfSeveralTensorsIsOneEvaluationThatSharesWork) {
  Tensor x = tensor({0, 1, 2});
  Tensor shared = (x + 1).exp();
  Tensor a = shared * 2;
  Tensor b = shared - 1;
  if (!env_config().fusion) GTEST_SKIP() << "LAZYFUSE_FUSION=0 changes the kernel count";
  reset_eval_stats();
  eval({a, b});
  EXPECT_EQ(eval_stats().evaluations, 1);
  // One kernel computes the shared exp once and stores both results.
  EXPECT_EQ(eval_stats().kernels, 1);
  EXPECT_TRUE(a.is_computed());
  EXPECT_TRUE(b.is_computed());
  // The intermediate was not asked for: it stays pending (and is never stored).
  EXPECT_FALSE(shared.is_computed());
  std::vector<float> av = a.to_vector<float>(), bv = b.to_vector<float>();
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(av[i], 2 * std::exp(i + 1.0), 1e-4);
    EXPECT_NEAR(bv[i], std::exp(i + 1.0) - 1, 1e-4);
  }
  // Evaluating computed tensors again does nothing.
  eval({a, b});
  EXPECT_EQ(eval_stats().evaluations, 1);
}

// Note [Schedule cache]: the same expression over new data reuses its schedule; a new
// constant, shape, dtype or fusion setting is a new schedule; every result is the reference's.
// The host profile (bench/host_cost.cc's phases) counts each phase of an evaluation once
// while it is on, the passes only on a schedule cache miss, and nothing while it is off.
// Counts only: timings never go in tests.
TEST(Lazy, HostProfileCountsTheEvaluationsPhases) {
  Tensor z = from_vector({0.5, 1.5, 2.5}, {3}), y = from_vector({1.0, 2.0, 3.0}, {3});
  eval({z, y});
  auto count = [](const HostProfile& profile, HostPhase phase) {
    return profile.count[static_cast<int>(phase)];
  };
  // One source location, so that every evaluation is the same graph.
  auto expression = [&] { return (z + 2).exp() * y; };
  reset_host_profile();
  eval(expression());  // profiling off
  EXPECT_EQ(count(host_profile(), HostPhase::Walk), 0);
  set_host_profiling(true);
  for (int repeat = 0; repeat < 2; ++repeat) eval(expression());
  set_host_profiling(false);
  const HostProfile profile = host_profile();
  for (HostPhase phase : {HostPhase::Walk, HostPhase::Lookup, HostPhase::Run, HostPhase::Finish})
    EXPECT_EQ(count(profile, phase), 2) << host_phase_name(phase);
  // The first evaluation (off) made the schedule; both profiled ones found it.
  EXPECT_EQ(count(profile, HostPhase::Passes), 0);
  // One output buffer each (the fused kernel's result).
  EXPECT_EQ(count(profile, HostPhase::Allocate), 2);
}

TEST(Lazy, RepeatedExpressionReusesItsSchedule) {
  auto expression = [](const Tensor& z, const Tensor& y, double c) { return (z + c).exp() * y; };
  auto check = [&](int64_t n, DType dtype, double c, bool fusion) {
    std::vector<double> zs(n), ys(n);
    for (int64_t i = 0; i < n; ++i) zs[i] = 0.01 * i - 1, ys[i] = 1.5 - 0.02 * i;
    Tensor z = from_vector(zs, {n}, dtype), y = from_vector(ys, {n}, dtype);
    Tensor out = expression(z, y, c);
    EvalOptions options;
    options.fusion = fusion;
    eval({out}, options);
    std::vector<double> got = out.to_vector<double>();
    for (int64_t i = 0; i < n; ++i)
      ASSERT_NEAR(got[i], std::exp(zs[i] + c) * ys[i], 1e-5 * std::exp(zs[i] + c) + 1e-6);
  };
  check(100, DType::Float32, 2, true);
  reset_eval_stats();
  for (int repeat = 0; repeat < 3; ++repeat) check(100, DType::Float32, 2, true);
  EXPECT_EQ(eval_stats().schedule_cache_hits, 3);
  check(101, DType::Float32, 2, true);   // another shape
  check(100, DType::Float64, 2, true);   // another dtype
  check(100, DType::Float32, 3, true);   // another constant
  check(100, DType::Float32, 2, false);  // fusion off
  EXPECT_EQ(eval_stats().schedule_cache_hits, 3);
  EXPECT_EQ(eval_stats().evaluations, 7);
}

TEST(Lazy, ComputedTensorIsALeafThatLaterGraphsStartFrom) {
  Tensor x = tensor({1, 2, 3});
  Tensor r = (x + 1).exp();
  eval(r);
  ASSERT_TRUE(r.is_computed());
  EXPECT_TRUE(r.value()->inputs.empty());  // the graph behind it is released
  EXPECT_EQ(r.ir(),
            "graph @main(%0: f32[3] @cpu) {\n"
            "  return %0\n"
            "}\n");
  Tensor next = r * 2;
  // The new graph reads r's buffer; x, the add and the exp are not redone.
  EXPECT_EQ(next.ir(),
            "graph @main(%0: f32[3] @cpu) {\n"
            "  %1 = const {value = 2.0} : f32[] @cpu\n"
            "  %2 = mul %0, %1 : f32[3] @cpu\n"
            "  return %2\n"
            "}\n");
  std::vector<float> got = next.to_vector<float>();
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(got[i], 2 * std::exp(i + 2.0), 1e-4);
}

TEST(Lazy, ToTheSameDeviceOrDTypeIsTheSameTensor) {
  Tensor t = tensor({1., 2., 3.});
  EXPECT_TRUE(t.to(t.device()).is_same(t));
  EXPECT_TRUE(t.to(t.dtype()).is_same(t));
  EXPECT_TRUE(t.to("cpu").is_same(t));
  EXPECT_TRUE(t.cpu().is_same(t));
  // Also for a pending tensor: no node is added.
  Tensor pending = t + 1;
  EXPECT_TRUE(pending.to(pending.device()).is_same(pending));
  EXPECT_TRUE(pending.to(kFloat32).is_same(pending));
  EXPECT_FALSE(pending.is_computed());
  // Another dtype is another tensor.
  Tensor wide = t.to(kFloat64);
  EXPECT_FALSE(wide.is_same(t));
  EXPECT_EQ(wide.dtype(), kFloat64);
  EXPECT_EQ(wide.to_vector<double>(), std::vector<double>({1, 2, 3}));
}

TEST(Lazy, ViewsShareStorageWithTheirBase) {
  Tensor base = tensor({{1, 2, 3}, {4, 5, 6}});
  Tensor reshaped = base.view({3, 2});
  Tensor row = base.narrow(0, 1, 1);
  Tensor column = base.unsqueeze(0);
  EXPECT_TRUE(reshaped.shares_storage_with(base));
  EXPECT_TRUE(row.shares_storage_with(base));
  EXPECT_TRUE(column.shares_storage_with(base));
  EXPECT_EQ(row.to_vector<float>(), std::vector<float>({4, 5, 6}));
  // A fresh computation has storage of its own.
  EXPECT_FALSE((base + 0).shares_storage_with(base));
}

// Note [Schedule cache]: a loop's expression keeps its schedule while more one-off graphs than
// the cache holds (256) pass through between its evaluations.
TEST(Lazy, AFullScheduleCacheKeepsTheScheduleALoopUses) {
  const std::vector<double> xs = {-1.5, 0.25, 2, 7};
  const Tensor x = from_vector(xs, {4}, DType::Float32);
  reset_eval_stats();
  constexpr int kOneOffs = 300;
  for (int i = 0; i < kOneOffs; ++i) {
    Tensor one_off = full({i + 5}, 0.5, TensorOptions().dtype(DType::Float32)) * 3;  // a new shape
    ASSERT_EQ(one_off.to_vector<double>()[0], 1.5);
    Tensor hot = (x + 1).relu() * 2;
    const std::vector<double> got = hot.to_vector<double>();
    for (size_t k = 0; k < xs.size(); ++k) ASSERT_EQ(got[k], std::max(xs[k] + 1, 0.0) * 2);
  }
  // Every evaluation of the loop's expression but its first found the schedule.
  EXPECT_EQ(eval_stats().schedule_cache_hits, kOneOffs - 1);
}

// Note [Views of computed values]: a loop that slices each step's batch out of one tensor runs
// one cached schedule for every offset, the batch read in place as a param, and every step's
// result is its own slice's (against float64 on the host).
TEST(Lazy, BatchesSlicedInsideTheLoopShareOneSchedule) {
  const int64_t batches = 6, rows = 4, columns = 5;
  std::vector<double> data(batches * rows * columns);
  for (size_t i = 0; i < data.size(); ++i) data[i] = 0.25 * static_cast<double>(i % 17) - 1.5;
  Tensor all = from_vector(data, {batches * rows, columns}, DType::Float32);
  Tensor weights = from_vector({1, -2, 0.5, 3, -1}, {columns}, DType::Float32);
  reset_eval_stats();
  for (int64_t b = 0; b < batches; ++b) {
    SCOPED_TRACE(b);
    Tensor batch = all.narrow(0, b * rows, rows).unsqueeze(0).squeeze(0);
    Tensor scores = ((batch * weights).sum({1}) + 1).relu();
    const std::vector<double> got = scores.to_vector<double>();
    for (int64_t r = 0; r < rows; ++r) {
      double want = 1;
      for (int64_t c = 0; c < columns; ++c)
        want += data[static_cast<size_t>((b * rows + r) * columns + c)] *
                std::vector<double>{1, -2, 0.5, 3, -1}[static_cast<size_t>(c)];
      EXPECT_NEAR(got[static_cast<size_t>(r)], std::max(want, 0.0), 1e-5);
    }
    EXPECT_TRUE(batch.shares_storage_with(all));
  }
  EXPECT_EQ(eval_stats().evaluations, batches);
  EXPECT_EQ(eval_stats().schedule_cache_hits, batches - 1);
}

TEST(Lazy, TransposeOfAComputedTensorIsNotACopy) {
  Tensor base = tensor({{1, 2, 3}, {4, 5, 6}});
  Tensor transposed = base.t();
  EXPECT_EQ(transposed.sizes(), Shape({3, 2}));
  EXPECT_FALSE(transposed.is_contiguous());
  reset_eval_stats();
  eval(transposed);
  EXPECT_EQ(eval_stats().kernels, 0);  // a view launches nothing
  EXPECT_TRUE(transposed.shares_storage_with(base));
  EXPECT_EQ(transposed.to_vector<float>(), std::vector<float>({1, 4, 2, 5, 3, 6}));
  // contiguous() is the copy.
  Tensor dense = transposed.contiguous();
  EXPECT_TRUE(dense.is_contiguous());
  EXPECT_FALSE(dense.shares_storage_with(base));
  EXPECT_EQ(dense.to_vector<float>(), std::vector<float>({1, 4, 2, 5, 3, 6}));
}

// Run by ctest under LAZYFUSE_MAX_PENDING=300 (tests/CMakeLists.txt, lazy_small_bound): at the
// default bound the chain would take 98,000 adds.
TEST(Lazy, LongChainIsEvaluatedInBoundedPieces) {
  const int64_t bound = env_config().max_pending;
  if (bound > 5000) GTEST_SKIP() << "LAZYFUSE_MAX_PENDING above 5000";
  Tensor x = zeros({3});
  eval(x);
  const int64_t before = evaluations(), held = pending_values();
  // Each add brings a constant: two values an add, evaluated about every `bound` of them.
  const int64_t adds = bound + bound / 2;
  for (int64_t i = 0; i < adds; ++i) {
    x = x + 1;
    // The bound is checked as each node is made, so pending work never exceeds it.
    ASSERT_LE(pending_values() - held, bound) << "after " << i + 1 << " adds";
  }
  EXPECT_GE(evaluations() - before, 2 * adds / (bound + 2));
  EXPECT_EQ(x.to_vector<float>(), std::vector<float>(3, static_cast<float>(adds)));
}

// A pending chain as long as the default bound allows is destroyed without recursing through
// it (which overflowed the stack under AddressSanitizer), and leaves the census.
TEST(Lazy, ALongPendingChainIsDestroyedWithoutRecursion) {
  const int64_t length = 60000;
  if (env_config().max_pending < length) GTEST_SKIP() << "LAZYFUSE_MAX_PENDING below 60000";
  const int64_t held = pending_values();
  {
    Tensor x = tensor({1.0f, 2.0f});
    for (int64_t i = 0; i < length; ++i) x = -x;
    EXPECT_FALSE(x.is_computed());
    EXPECT_EQ(pending_values() - held, length);
  }
  EXPECT_EQ(pending_values(), held);
}

// The pending census counts each value once: a value read by many others (a residual stream)
// is one value, not one per path to it; computed or destroyed, it leaves the census.
TEST(Lazy, PendingValuesCountEachValueOnce) {
  const int64_t held = pending_values();
  Tensor x = tensor({1.0f, 2.0f}) * 2;  // a constant and a mul
  EXPECT_EQ(pending_values() - held, 2);
  for (int i = 0; i < 40; ++i) x = x + x.exp();  // 2^40 paths to the first mul
  EXPECT_EQ(pending_values() - held, 2 + 80);
  {
    Tensor dropped = x.sin();
    EXPECT_EQ(pending_values() - held, 83);
  }
  EXPECT_EQ(pending_values() - held, 82);
  eval(x);
  EXPECT_EQ(pending_values() - held, 0);
}

// A training step too large for the pending bound is cut into several evaluations, at the same
// ops every step (Note [Bounding pending work] in runtime/lazy.cc): from the third step on,
// every piece is a schedule seen before. Run by ctest under LAZYFUSE_MAX_PENDING=300
// (tests/CMakeLists.txt, lazy_small_bound); skipped where the bound is too large to cut the step.
TEST(Lazy, ACutStepIsCutAtTheSameOpsEveryStep) {
  if (env_config().max_pending > 1000) GTEST_SKIP() << "LAZYFUSE_MAX_PENDING above 1000";
  manual_seed(6);
  std::vector<nn::Linear> layers;
  std::vector<Tensor> parameters;
  for (int i = 0; i < 10; ++i) {
    layers.emplace_back(8, 8);
    for (const Tensor& p : layers.back().parameters()) parameters.push_back(p);
  }
  optim::AdamW optimizer(parameters, optim::AdamWOptions(1e-2));
  optim::CosineAnnealingLR schedule(optimizer, 10);
  Tensor x = randn({4, 8});
  eval(x);
  std::vector<int64_t> evaluations;
  for (int step = 0; step < 5; ++step) {
    optimizer.zero_grad();
    Tensor loss = [&] {
      Tensor h = x;
      for (nn::Linear& layer : layers) h = h + layer(h).tanh();
      return (h * h).mean();
    }();
    loss.backward();
    reset_eval_stats();
    optimizer.step();
    schedule.step();
    evaluations.push_back(eval_stats().evaluations);
    if (step >= 2) {
      EXPECT_GT(eval_stats().evaluations, 1) << "step " << step;  // cut
      EXPECT_EQ(eval_stats().evaluations, evaluations[step - 1]) << "step " << step;
      EXPECT_EQ(eval_stats().schedule_cache_hits, eval_stats().evaluations) << "step " << step;
    }
  }
}

TEST(Lazy, DeepChainIrText) {
  Tensor x = tensor({1., -2.});
  Tensor y = x;
  const int depth = 3000;  // below the pending bound: one graph
  if (env_config().max_pending < depth) GTEST_SKIP() << "LAZYFUSE_MAX_PENDING is below " << depth;
  for (int i = 0; i < depth; ++i) y = -y;
  EXPECT_FALSE(y.is_computed());
  const std::string ir = y.ir();
  EXPECT_EQ(count_substr(ir, " = neg "), depth);
  EXPECT_THAT(
      ir, ::testing::StartsWith("graph @main(%0: f32[2] @cpu) {\n  %1 = neg %0 : f32[2] @cpu\n"));
  EXPECT_THAT(ir, ::testing::EndsWith("  %3000 = neg %2999 : f32[2] @cpu\n  return %3000\n}\n"));
  // The kernel cap (128 nodes by default) splits the chain, in order.
  const std::string fused = y.fused_ir();
  EXPECT_EQ(count_substr(fused, "kernel elementwise @k_"), (depth + 127) / 128);
  EXPECT_EQ(y.to_vector<float>(), std::vector<float>({1, -2}));  // an even number of negations
}

TEST(Lazy, IrTextOfExpOfShiftTimes) {
  Tensor y = tensor({1., 2., 3.});
  Tensor z = tensor({1., 2., 3.});
  Tensor result = (z + 2).exp() * y;
  // Params in order of first use: z is read first, then y.
  EXPECT_EQ(result.ir(),
            "graph @main(%0: f32[3] @cpu, %1: f32[3] @cpu) {\n"
            "  %2 = const {value = 2.0} : f32[] @cpu\n"
            "  %3 = add %0, %2 : f32[3] @cpu\n"
            "  %4 = exp %3 : f32[3] @cpu\n"
            "  %5 = mul %4, %1 : f32[3] @cpu\n"
            "  return %5\n"
            "}\n");
  const std::string fused = result.fused_ir();
  EXPECT_EQ(count_substr(fused, "kernel elementwise @k_"), 1);
  EXPECT_THAT(fused, HasSubstr("  kernel elementwise @k_"));
  EXPECT_THAT(fused, HasSubstr("(%0, %1) -> (%5) {\n"));
  // Showing the IR computes nothing.
  EXPECT_FALSE(result.is_computed());
}

TEST(Lazy, DeviceParsingAndPrinting) {
  EXPECT_EQ(Device("cuda:1").index(), 1);
  EXPECT_TRUE(Device("cuda:1").is_cuda());
  EXPECT_EQ(Device("cuda:1").str(), "cuda:1");
  EXPECT_EQ(Device("cuda:12").str(), "cuda:12");
  // Plain "cuda" is the current device, resolved later: no index yet.
  EXPECT_FALSE(Device("cuda").has_index());
  EXPECT_EQ(Device("cuda").index(), -1);
  EXPECT_EQ(Device("cuda").str(), "cuda");
  EXPECT_TRUE(Device("cpu").is_cpu());
  EXPECT_EQ(Device("cpu").str(), "cpu");
  EXPECT_EQ(Device("cpu:0"), Device::cpu());
  EXPECT_EQ(Device("cuda:0"), Device(DeviceType::CUDA, 0));
  EXPECT_NE(Device("cuda:0"), Device("cuda:1"));
  EXPECT_NE(Device("cuda"), Device("cuda:0"));

  testing::internal::CaptureStdout();
  std::cout << Device("cuda:0");
  EXPECT_EQ(testing::internal::GetCapturedStdout(), "cuda:0");
}

// As torch.tensor infers it: int64 from integers, bool from bools, float32 from floating
// numbers, the highest kind where a list mixes them; the options' dtype where they give one.
TEST(Lazy, TensorLiteralsTakeTheirDTypeFromTheirNumbers) {
  EXPECT_EQ(tensor({1, 2, 3}).dtype(), kInt64);
  EXPECT_EQ(tensor({1.0, 2.0}).dtype(), kFloat32);
  EXPECT_EQ(tensor({true, false}).dtype(), kBool);
  EXPECT_EQ(tensor({1, 2.5}).dtype(), kFloat32);
  EXPECT_EQ(tensor({true, 2}).dtype(), kInt64);
  EXPECT_EQ(tensor({{1}, {2}}, kFloat64).dtype(), kFloat64);
  EXPECT_EQ(tensor(3).dtype(), kInt64);
  EXPECT_EQ(tensor(3).dim(), 0);
  EXPECT_EQ(tensor(3.5).dtype(), kFloat32);
  EXPECT_EQ(tensor(std::vector<double>{}).dtype(), kFloat32);
  EXPECT_EQ(tensor({1, 2, 3}).str(), "tensor([1, 2, 3])");
  EXPECT_EQ(tensor({true, false}).str(), "tensor([ True, False])");
  // Integers past 2^53 arrive exactly, which a double could not hold.
  const int64_t big = (int64_t{1} << 53) + 1;
  EXPECT_EQ(tensor({big, -big}).to_vector<int64_t>(), (std::vector<int64_t>{big, -big}));
  EXPECT_EQ(tensor({1, 2}, kFloat32).to_vector<float>(), (std::vector<float>{1, 2}));
}

TEST(Lazy, PrintsInPyTorchFormat) {
  EXPECT_EQ(tensor({1., 2., 3.}).str(), "tensor([1., 2., 3.])");
  Tensor y = tensor({1, 2, 3});
  Tensor z = tensor({1, 2, 3});
  EXPECT_EQ(((z + 2).exp() * y).str(), "tensor([ 20.0855, 109.1963, 445.2395])");
  EXPECT_EQ(arange(5).str(), "tensor([0, 1, 2, 3, 4])");
  EXPECT_EQ(arange(5).dtype(), kInt64);
  EXPECT_EQ(tensor({1.5, 2}, kFloat64).str(), "tensor([1.5000, 2.0000], dtype=torch.float64)");
  EXPECT_EQ(tensor({1, 2}, kInt32).str(), "tensor([1, 2], dtype=torch.int32)");
  EXPECT_EQ((tensor({1, 2, 3}) > 1.5).str(), "tensor([False,  True,  True])");
  EXPECT_EQ(tensor({{1.5, -2, 3}, {4, 50, 6}}).str(),
            "tensor([[ 1.5000, -2.0000,  3.0000],\n"
            "        [ 4.0000, 50.0000,  6.0000]])");
  EXPECT_EQ(tensor({{1., 2., 3.}, {4., 5., 6.}}).str(),
            "tensor([[1., 2., 3.],\n"
            "        [4., 5., 6.]])");
  EXPECT_EQ(scalar_tensor(3.5).str(), "tensor(3.5000)");
}

TEST(Lazy, MemoryStatsFollowTensorLifetimes) {
  const Device cpu("cpu");
  const int64_t before = memory_stats(cpu).allocated_bytes;
  {
    Tensor t = zeros({1024});
    // Pending: nothing allocated yet.
    EXPECT_EQ(memory_stats(cpu).allocated_bytes, before);
    eval(t);
    EXPECT_EQ(memory_stats(cpu).allocated_bytes, before + 1024 * 4);
    EXPECT_GE(memory_stats(cpu).peak_bytes, before + 1024 * 4);
    // A view adds no storage.
    Tensor view = t.view({32, 32});
    eval(view);
    EXPECT_EQ(memory_stats(cpu).allocated_bytes, before + 1024 * 4);
  }
  EXPECT_EQ(memory_stats(cpu).allocated_bytes, before);
}

TEST(Lazy, ThreadsEvaluatingTheirOwnGraphsConcurrently) {
  constexpr int kThreads = 4;
  std::vector<std::vector<float>> results(kThreads);
  std::vector<std::thread> threads;
  for (int k = 0; k < kThreads; ++k) {
    threads.emplace_back([k, &results] {
      Tensor x = arange(1000).to(kFloat32);
      Tensor acc = x;
      // Several evaluations per thread, so that they interleave with the other threads'.
      for (int round = 0; round < 20; ++round) {
        for (int i = 0; i < 10; ++i) acc = acc + (x * 0 + k);
        eval(acc);
      }
      results[k] = acc.to_vector<float>();
    });
  }
  for (std::thread& t : threads) t.join();
  for (int k = 0; k < kThreads; ++k) {
    ASSERT_EQ(results[k].size(), 1000u);
    for (int i = 0; i < 1000; ++i)
      ASSERT_EQ(results[k][i], static_cast<float>(i + 200 * k))
          << "thread " << k << " [" << i << "]";
  }
}

TEST(Lazy, ThreadsEvaluatingGraphsThatShareALeaf) {
  // One computed tensor read by every thread's graph: evaluations must not disturb it.
  Tensor shared = tensor({1, 2, 3, 4});
  constexpr int kThreads = 4;
  std::vector<std::vector<float>> results(kThreads);
  std::vector<std::thread> threads;
  for (int k = 0; k < kThreads; ++k) {
    threads.emplace_back([k, &shared, &results] {
      Tensor t = shared;
      for (int i = 0; i < 50; ++i) t = t * 1 + k;
      results[k] = t.to_vector<float>();
    });
  }
  for (std::thread& t : threads) t.join();
  for (int k = 0; k < kThreads; ++k)
    EXPECT_EQ(results[k],
              std::vector<float>({1.0f + 50 * k, 2.0f + 50 * k, 3.0f + 50 * k, 4.0f + 50 * k}));
  EXPECT_EQ(shared.to_vector<float>(), std::vector<float>({1, 2, 3, 4}));
}

}  // namespace
}  // namespace lazyfuse
