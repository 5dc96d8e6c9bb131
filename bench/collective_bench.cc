// What a collective costs between a job's processes: the time per evaluation of an all_reduce
// of n floats (the median of 7 batches after a warm-up), and per data-parallel training step of
// a small MLP against the same step alone. Run it as a job:
//
//   build/bin/lazyfuse launch --nproc=2 build/bin/lazyfuse_collective_bench [DEVICE]
//
// Rank 0 prints a table; DEVICE is cpu (default) or cuda:N.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "lazyfuse/lazyfuse.h"

using namespace lazyfuse;
namespace dist = lazyfuse::distributed;

namespace {

// Microseconds per call of `body`, the median of 7 batches of `per_batch` calls. Every process
// runs the same batches, so that they meet in each collective.
template <typename F>
double median_us(int per_batch, F&& body) {
  for (int i = 0; i < per_batch / 4 + 1; ++i) body();
  std::vector<double> batches;
  for (int b = 0; b < 7; ++b) {
    dist::barrier();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < per_batch; ++i) body();
    batches.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
            .count() /
        per_batch);
  }
  std::sort(batches.begin(), batches.end());
  return batches[3];
}

}  // namespace

int main(int argc, char** argv) {
  dist::init();
  const Device device = argc > 1 ? Device(argv[1]) : Device::cpu();
  const bool report = dist::rank() == 0;
  if (report)
    std::printf("%d processes, tensors on %s\n\n| what | us per evaluation |\n|---|---|\n",
                dist::world_size(), device.str().c_str());
  for (int64_t n : {int64_t{1000}, int64_t{1} << 20}) {
    Tensor x = ones({n}, TensorOptions().device(device));
    const double us = median_us(n > 1000 ? 20 : 200, [&] { eval(dist::all_reduce(x)); });
    if (report)
      std::printf("| all_reduce of %lld floats | %.1f |\n", static_cast<long long>(n), us);
  }
  // A training step of an MLP (64 inputs, two hidden layers of 256, batch 64 per process):
  // alone, then data-parallel (DistributedDataParallel averaging its gradients).
  for (bool data_parallel : {false, true}) {
    manual_seed(0);
    auto net = std::make_shared<nn::Sequential>(
        nn::Linear(64, 256), nn::ReLU(), nn::Linear(256, 256), nn::ReLU(), nn::Linear(256, 10));
    net->to(device);
    std::optional<nn::parallel::DistributedDataParallel> ddp;
    if (data_parallel) ddp.emplace(net);
    optim::SGD optimizer(net->parameters(), optim::SGDOptions(0.01));
    Tensor input = randn({64, 64}, TensorOptions().device(device));
    Tensor target = randn({64, 10}, TensorOptions().device(device));
    nn::MSELoss loss_fn;
    const double us = median_us(50, [&] {
      optimizer.zero_grad();
      loss_fn((*net)(input), target).backward();
      optimizer.step();
    });
    if (report)
      std::printf("| MLP training step, %s | %.1f |\n",
                  data_parallel ? "DistributedDataParallel" : "alone", us);
  }
  dist::destroy_process_group();
}
