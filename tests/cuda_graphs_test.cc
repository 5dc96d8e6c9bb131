// CUDA graph replay (Note [CUDA graph replay] in runtime/cuda/cuda_graphs.cc), on a machine with a
// GPU (every test skips without one): repeated evaluations recorded and replayed give the bits the
// same evaluations give launched one by one, in the cases that break a naive capture.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <thread>
#include <vector>

#include <lazyfuse/lazyfuse.h>

#include "lazyfuse/runtime/cuda/cuda_graphs.h"
#include "lazyfuse/runtime/cuda/cuda_memory.h"

namespace lazyfuse {
namespace {

class CudaGraphs : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::is_available()) GTEST_SKIP() << "no CUDA GPU";
    saved_ = cuda::graph_mode();
  }
  void TearDown() override {
    if (cuda::is_available()) cuda::set_graph_mode(saved_);
  }

 private:
  cuda::GraphMode saved_ = cuda::GraphMode::On;
};

// Values that float32 holds exactly.
std::vector<double> random_floats(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = dist(rng);
  return v;
}

// A layer and two reductions of it: products through cuBLAS, a row kernel and a reduction.
std::vector<Tensor> layer(const Tensor& x, const Tensor& w, const Tensor& b) {
  Tensor y = (x.matmul(w) + b).relu();
  Tensor rows = (y * y).sum({1}) + y.mean();
  return {y, rows};
}

std::vector<std::vector<float>> host_values(const std::vector<Tensor>& tensors) {
  std::vector<std::vector<float>> out;
  for (const Tensor& t : tensors) out.push_back(t.to_vector<float>());
  return out;
}

// The same evaluation over the same inputs, again and again: recorded once, then replayed, with
// every result's bits those of the evaluation launched kernel by kernel.
TEST_F(CudaGraphs, ARepeatedEvaluationReplaysWithTheLaunchedBits) {
  const TensorOptions gpu = TensorOptions(kFloat32).device("cuda");
  Tensor x = from_vector(random_floats(64 * 96, 1), {64, 96}, gpu);
  Tensor w = from_vector(random_floats(96 * 128, 2), {96, 128}, gpu);
  Tensor b = from_vector(random_floats(128, 3), {128}, gpu);
  eval({x, w, b});
  cuda::set_graph_mode(cuda::GraphMode::Off);
  const std::vector<std::vector<float>> launched = host_values(layer(x, w, b));

  cuda::set_graph_mode(cuda::GraphMode::Always);
  cuda::reset_graph_stats();
  for (int repeat = 0; repeat < 6; ++repeat) {
    SCOPED_TRACE(repeat);
    std::vector<Tensor> results = layer(x, w, b);
    eval(results);
    EXPECT_EQ(host_values(results), launched);
  }
  const cuda::GraphStats stats = cuda::graph_stats();
  EXPECT_GE(stats.captures, 1);
  EXPECT_GE(stats.replays, 3);
}

// A state fed back into the next evaluation (as a parameter's update is), read twice in one
// expression and through a transposed view: against float64 on the host, step by step. Its
// buffers alternate, so the graphs kept are replayed in turn.
TEST_F(CudaGraphs, OutputsFedBackAndAliasedInputsMatchFloat64) {
  cuda::set_graph_mode(cuda::GraphMode::Always);
  cuda::reset_graph_stats();
  const int64_t n = 48;
  const std::vector<double> start = random_floats(n * n, 4), drive = random_floats(n * n, 5);
  Tensor state = from_vector(start, {n, n}, TensorOptions(kFloat32).device("cuda"));
  Tensor input = from_vector(drive, {n, n}, TensorOptions(kFloat32).device("cuda"));
  eval({state, input});
  std::vector<double> want(start.begin(), start.end());
  for (int step = 0; step < 8; ++step) {
    SCOPED_TRACE(step);
    Tensor next = (state + state.t()) * 0.25f + (input * state).tanh();
    Tensor total = next.sum();
    eval({next, total});
    std::vector<double> updated(want.size());
    double sum = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j) {
        const size_t at = static_cast<size_t>(i * n + j);
        updated[at] = (want[at] + want[static_cast<size_t>(j * n + i)]) * 0.25 +
                      std::tanh(drive[at] * want[at]);
        sum += updated[at];
      }
    want = updated;
    const std::vector<float> got = next.to_vector<float>();
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-5 * (1 + std::fabs(want[i]))) << "at " << i;
    EXPECT_NEAR(total.item<double>(), sum, 1e-3 * (1 + std::fabs(sum)));
    state = next;
  }
  EXPECT_GE(cuda::graph_stats().replays, 2);
}

// A loop over batches, as a training loop reads them: the input is at a new address each run
// while the weights stay put. The graph copies the input into a buffer of its own and replays;
// every result has the launched bits.
TEST_F(CudaGraphs, AnInputAtANewAddressEachRunIsCopiedIn) {
  const TensorOptions gpu = TensorOptions(kFloat32).device("cuda");
  std::vector<Tensor> batches;
  for (uint32_t k = 0; k < 5; ++k)
    batches.push_back(from_vector(random_floats(16 * 40, 20 + k), {16, 40}, gpu));
  Tensor w = from_vector(random_floats(40 * 24, 30), {40, 24}, gpu);
  Tensor b = from_vector(random_floats(24, 31), {24}, gpu);
  eval(batches);
  eval({w, b});
  cuda::set_graph_mode(cuda::GraphMode::Off);
  std::vector<std::vector<std::vector<float>>> launched;
  for (const Tensor& x : batches) launched.push_back(host_values(layer(x, w, b)));

  cuda::set_graph_mode(cuda::GraphMode::On);
  cuda::reset_graph_stats();
  for (int run = 0; run < 15; ++run) {
    SCOPED_TRACE(run);
    EXPECT_EQ(host_values(layer(batches[run % 5], w, b)), launched[run % 5]);
  }
  EXPECT_GE(cuda::graph_stats().replays, 8);
}

// A second model of the same shapes: its first runs find its weights where no graph reads them
// and record a graph that copies them in; once they have stayed put for two runs that graph is
// passed over for one that reads them in place, so the loop's replays copy nothing.
TEST_F(CudaGraphs, ASecondModelsWeightsAreReadInPlaceOnceSettled) {
  const TensorOptions gpu = TensorOptions(kFloat32).device("cuda");
  Tensor x = from_vector(random_floats(16 * 40, 40), {16, 40}, gpu);
  Tensor w1 = from_vector(random_floats(40 * 24, 41), {40, 24}, gpu);
  Tensor b1 = from_vector(random_floats(24, 42), {24}, gpu);
  Tensor w2 = from_vector(random_floats(40 * 24, 43), {40, 24}, gpu);
  Tensor b2 = from_vector(random_floats(24, 44), {24}, gpu);
  eval({x, w1, b1, w2, b2});
  cuda::set_graph_mode(cuda::GraphMode::Off);
  const auto first = host_values(layer(x, w1, b1)), second = host_values(layer(x, w2, b2));

  // One evaluation a run.
  auto run_layer = [&](const Tensor& w, const Tensor& b) {
    std::vector<Tensor> outputs = layer(x, w, b);
    eval(outputs);
    return host_values(outputs);
  };
  cuda::set_graph_mode(cuda::GraphMode::On);
  for (int run = 0; run < 6; ++run) EXPECT_EQ(run_layer(w1, b1), first) << run;
  cuda::reset_graph_stats();
  for (int run = 0; run < 6; ++run) EXPECT_EQ(run_layer(w2, b2), second) << run;
  // The second model's first runs copied its weights in; then a graph read them in place.
  EXPECT_GT(cuda::graph_stats().input_copies, 0);
  EXPECT_GE(cuda::graph_stats().captures, 2);
  cuda::reset_graph_stats();
  for (int run = 0; run < 5; ++run) EXPECT_EQ(run_layer(w2, b2), second) << run;
  EXPECT_EQ(cuda::graph_stats().replays, 5);
  EXPECT_EQ(cuda::graph_stats().input_copies, 0);
}

// An index op reads its error slot on the host after its kernel, so its schedule is never
// recorded; a bad index is the CPU's IndexError, and the next evaluation works.
TEST_F(CudaGraphs, AnIndexOpIsNeverRecordedAndItsErrorStaysTyped) {
  cuda::set_graph_mode(cuda::GraphMode::Always);
  Tensor x = from_vector(random_floats(40, 6), {8, 5}, TensorOptions(kFloat32).device("cuda"));
  Tensor good = tensor({4, 0, 2}, TensorOptions(kInt64)).to("cuda");
  Tensor bad = tensor({4, 9, 2}, TensorOptions(kInt64)).to("cuda");
  eval({x, good, bad});
  const std::vector<float> rows = x.to_vector<float>();
  cuda::reset_graph_stats();
  for (int repeat = 0; repeat < 3; ++repeat) {
    Tensor picked = (x.index_select(0, good) * 2).sum({1});
    const std::vector<float> got = picked.to_vector<float>();
    for (int r = 0; r < 3; ++r) {
      const int64_t row = r == 0 ? 4 : r == 1 ? 0 : 2;
      float want = 0;
      for (int c = 0; c < 5; ++c) want += rows[static_cast<size_t>(row * 5 + c)] * 2;
      EXPECT_NEAR(got[static_cast<size_t>(r)], want, 1e-5);
    }
  }
  EXPECT_EQ(cuda::graph_stats().captures, 0);
  EXPECT_GE(cuda::graph_stats().fallbacks, 1);
  Tensor wrong = (x.index_select(0, bad) * 2).sum({1});
  EXPECT_THROW(wrong.to_vector<float>(), IndexError);
  Tensor again = (x.index_select(0, good) * 2).sum({1});
  EXPECT_EQ(again.to_vector<float>().size(), 3u);
}

// Two threads, each evaluating its own schedule in a loop, share the evaluation lock and the
// graph cache: each replays its own graphs and gets its own results.
TEST_F(CudaGraphs, TwoThreadsReplayTheirOwnGraphs) {
  cuda::set_graph_mode(cuda::GraphMode::Always);
  cuda::reset_graph_stats();
  auto worker = [](int64_t rows, uint32_t seed, bool* ok) {
    const TensorOptions gpu = TensorOptions(kFloat32).device("cuda");
    Tensor x = from_vector(random_floats(rows * 32, seed), {rows, 32}, gpu);
    Tensor w = from_vector(random_floats(32 * 16, seed + 1), {32, 16}, gpu);
    Tensor b = from_vector(random_floats(16, seed + 2), {16}, gpu);
    const std::vector<std::vector<float>> first = host_values(layer(x, w, b));
    *ok = true;
    for (int repeat = 0; repeat < 20; ++repeat) *ok &= host_values(layer(x, w, b)) == first;
  };
  bool ok_a = false, ok_b = false;
  std::thread a(worker, 24, 7, &ok_a), b(worker, 40, 11, &ok_b);
  a.join();
  b.join();
  EXPECT_TRUE(ok_a);
  EXPECT_TRUE(ok_b);
  EXPECT_GE(cuda::graph_stats().replays, 2);
}

// Emptying the allocator's cache between evaluations frees the blocks a kept graph was recorded
// with: the next run's buffers differ, so it records anew rather than replaying stale addresses.
TEST_F(CudaGraphs, AnEmptiedAllocatorCacheRecordsAnew) {
  cuda::set_graph_mode(cuda::GraphMode::Always);
  const TensorOptions gpu = TensorOptions(kFloat32).device("cuda");
  Tensor x = from_vector(random_floats(32 * 64, 8), {32, 64}, gpu);
  Tensor w = from_vector(random_floats(64 * 64, 9), {64, 64}, gpu);
  Tensor b = from_vector(random_floats(64, 10), {64}, gpu);
  const std::vector<std::vector<float>> first = host_values(layer(x, w, b));
  for (int repeat = 0; repeat < 3; ++repeat) EXPECT_EQ(host_values(layer(x, w, b)), first);
  // A block the graphs' runs used is held while the cache is emptied, so the next run's
  // buffers cannot all be the same.
  Tensor held = (x * 1.0f).sum({0});
  eval(held);
  cuda::empty_cache(0);
  for (int repeat = 0; repeat < 3; ++repeat) EXPECT_EQ(host_values(layer(x, w, b)), first);
  EXPECT_EQ(held.size(0), 64);
}

// A learning rate that changes every step (a cosine schedule) is a value the step's kernels
// read (Note [Scalars that change between steps] in frontend/optim.cc): from the third step on,
// every AdamW step is the same schedule and one CUDA graph (recorded in the third, replayed from
// the fourth), and the parameters have the
// bits of the same steps launched kernel by kernel.
TEST_F(CudaGraphs, ACosineScheduledStepReplaysOneGraphFromTheThirdStep) {
  auto train = [](cuda::GraphMode mode, int steps) {
    cuda::set_graph_mode(mode);
    manual_seed(4);
    nn::Sequential net(nn::Linear(24, 32), nn::ReLU(), nn::Linear(32, 5));
    net.to(Device("cuda"));
    optim::AdamW optimizer(net.parameters(), optim::AdamWOptions(0.01).weight_decay(0.1));
    optim::CosineAnnealingLR schedule(optimizer, steps);
    const TensorOptions gpu = TensorOptions(kFloat32).device("cuda");
    Tensor x = from_vector(random_floats(16 * 24, 41), {16, 24}, gpu);
    std::vector<double> classes(16);
    for (size_t i = 0; i < classes.size(); ++i) classes[i] = static_cast<double>(i * 3 % 5);
    Tensor y = from_vector(classes, {16}, TensorOptions(kInt64).device("cuda"));
    eval({x, y});
    for (int step = 0; step < steps; ++step) {
      optimizer.zero_grad();
      Tensor loss = nn::functional::cross_entropy(net(x), y);
      loss.backward();
      cuda::reset_graph_stats();
      reset_eval_stats();
      optimizer.step();
      schedule.step();
      if (mode == cuda::GraphMode::On && step >= 2) {
        // The schedule's first run was step 1's; its second (step 2) records the graph, and
        // every later step replays it.
        EXPECT_EQ(eval_stats().evaluations, 1) << "step " << step;
        EXPECT_EQ(eval_stats().schedule_cache_hits, 1) << "step " << step;
        EXPECT_EQ(cuda::graph_stats().captures, step == 2 ? 1 : 0) << "step " << step;
        EXPECT_EQ(cuda::graph_stats().replays, step == 2 ? 0 : 1) << "step " << step;
      }
    }
    return host_values(net.parameters());
  };
  const std::vector<std::vector<float>> launched = train(cuda::GraphMode::Off, 12);
  EXPECT_EQ(train(cuda::GraphMode::On, 12), launched);
}

// A training loop as users write it: batches read in turn (each a view of one tensor of all of
// them, at its own offset, sliced before the loop or in the step), Adam (whose step count
// alternates between two buffers), the loss read back, and between steps tensors the program makes
// and keeps. A recorded step allocates from its schedule's own pool (Note [A graph's own memory
// pool]), so what the program allocates between steps moves nothing: once the pool has grown to
// what a step holds, every step replays, and the parameters have the bits of the same loop launched
// kernel by kernel.
TEST_F(CudaGraphs, ATrainingLoopReplaysWhateverItAllocatesBetweenSteps) {
  auto train = [](cuda::GraphMode mode, int steps, bool slice_in_the_step) {
    cuda::set_graph_mode(mode);
    manual_seed(3);
    nn::Sequential net(nn::Linear(24, 32), nn::ReLU(), nn::Linear(32, 5));
    net.to(Device("cuda"));
    optim::Adam optimizer(net.parameters(), optim::AdamOptions(0.01));
    const TensorOptions gpu = TensorOptions(kFloat32).device("cuda");
    Tensor inputs = from_vector(random_floats(4 * 16 * 24, 40), {4, 16, 24}, gpu);
    std::vector<double> classes(64);
    for (size_t i = 0; i < classes.size(); ++i) classes[i] = static_cast<double>(i * 7 % 5);
    Tensor labels = from_vector(classes, {4, 16}, TensorOptions(kInt64).device("cuda"));
    eval({inputs, labels});  // on the GPU now, not a copy from the host pending in every step
    std::vector<std::pair<Tensor, Tensor>> batches;
    for (int64_t k = 0; k < 4; ++k)
      batches.emplace_back(inputs.narrow(0, k, 1).squeeze(0), labels.narrow(0, k, 1).squeeze(0));
    for (auto& [x, y] : batches) eval({x, y});
    std::vector<Tensor> kept;
    cuda::reset_graph_stats();
    for (int step = 0; step < steps; ++step) {
      optimizer.zero_grad();
      auto [batch, batch_labels] = batches[static_cast<size_t>(step % 4)];
      if (slice_in_the_step) {
        // Sliced here, as a loop over one tensor of all batches does (Note [Views of computed
        // values] in runtime/lazy.cc): one schedule still, the batch read where it is.
        batch = inputs.narrow(0, step % 4, 1).squeeze(0);
        batch_labels = labels.narrow(0, step % 4, 1).squeeze(0);
      }
      Tensor loss = nn::functional::cross_entropy(net(batch), batch_labels);
      loss.backward();
      optimizer.step();
      loss.item<double>();
      // Something else on the device, made between steps and kept.
      kept.push_back((batch * static_cast<float>(step)).sum({1}));
      eval(kept.back());
    }
    return host_values(net.parameters());
  };
  const int steps = 24;
  for (bool slice_in_the_step : {false, true}) {
    SCOPED_TRACE(slice_in_the_step ? "sliced in the step" : "sliced before");
    const std::vector<std::vector<float>> launched =
        train(cuda::GraphMode::Off, steps, slice_in_the_step);
    EXPECT_EQ(train(cuda::GraphMode::On, steps, slice_in_the_step), launched);
    const cuda::GraphStats stats = cuda::graph_stats();
    EXPECT_LE(stats.captures, 8);
    EXPECT_GE(stats.replays, steps - 8);
  }
}

}  // namespace
}  // namespace lazyfuse
