// One process of a distributed test job, started by `lazyfuse launch --nproc=N` (the
// distributed.* tests of tests/CMakeLists.txt). Each scenario checks its results against a
// reference every process computes alone, in float64 from every process's inputs (which are a
// function of the rank), and exits non-zero with a message on the first mismatch.
//
//   lazyfuse_distributed_worker collectives|gradcheck|ddp|kill|late [cpu|cuda:N [gloo|nccl]]
//
// The device holds every tensor of the scenario (the CPU by default); the backend is
// InitOptions::backend (by default NCCL for CUDA tensors where it loads).
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "lazyfuse/lazyfuse.h"

using namespace lazyfuse;
namespace dist = lazyfuse::distributed;

namespace {

int checks = 0;
Device device = Device::cpu();

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "rank %d: FAIL: %s\n", dist::rank(), what.c_str());
  std::exit(1);
}

std::vector<double> values_of(const Tensor& t) { return t.to(kFloat64).to_vector<double>(); }

// Process q's input element i: small integers (exact in every dtype and in their sums).
double input_value(int q, int64_t i, DType dtype) {
  if (dtype == kBool) return (q + i) % 3 == 0 ? 1 : 0;
  return static_cast<double>((q * 7 + i * 3) % 11) - 5;
}

std::vector<double> input_values(int q, int64_t n, DType dtype) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = input_value(q, i, dtype);
  return v;
}

Tensor input(int q, Shape shape, DType dtype) {
  return from_vector(input_values(q, numel(shape), dtype), shape,
                     TensorOptions(dtype).device(device));
}

double tolerance(DType dtype) {
  switch (dtype) {
    case DType::Float16:
    case DType::BFloat16:
      return 1e-2;
    case DType::Float32:
      return 1e-6;
    default:
      return 1e-12;
  }
}

void expect_values(const Tensor& got, const Shape& shape, const std::vector<double>& want,
                   DType dtype, const std::string& what) {
  if (got.sizes() != shape)
    fail(absl::StrCat(what, ": shape ", shape_str(got.sizes()), ", expected ", shape_str(shape)));
  if (got.dtype() != dtype) fail(absl::StrCat(what, ": dtype ", dtype_torch_name(got.dtype())));
  if (got.device() != device) fail(absl::StrCat(what, ": on ", got.device().str()));
  const std::vector<double> v = values_of(got);
  for (size_t i = 0; i < want.size(); ++i)
    if (std::abs(v[i] - want[i]) > tolerance(dtype) * (1 + std::abs(want[i])))
      fail(absl::StrCat(what, ": element ", i, " is ", v[i], ", expected ", want[i]));
  ++checks;
}

template <typename F>
void expect_distributed_error(F&& body, const std::string& needle, const std::string& what) {
  try {
    body();
  } catch (const DistributedError& e) {
    if (std::string(e.what()).find(needle) == std::string::npos)
      fail(absl::StrCat(what, ": the error does not say '", needle, "': ", e.what()));
    ++checks;
    return;
  }
  fail(absl::StrCat(what, ": no DistributedError"));
}

double combine(ReduceOp op, DType dtype, double x, double y) {
  if (dtype == kBool) return op == ReduceOp::MIN ? (x && y) : (x || y);
  switch (op) {
    case ReduceOp::MAX:
      return std::max(x, y);
    case ReduceOp::MIN:
      return std::min(x, y);
    default:
      return x + y;
  }
}

// Element-wise `op` over the processes' inputs of n elements.
std::vector<double> reduced(ReduceOp op, DType dtype, int64_t n, int world) {
  std::vector<double> out = input_values(0, n, dtype);
  for (int q = 1; q < world; ++q) {
    const std::vector<double> v = input_values(q, n, dtype);
    for (int64_t i = 0; i < n; ++i) out[i] = combine(op, dtype, out[i], v[i]);
  }
  if (op == ReduceOp::AVG)
    for (double& x : out) x /= world;
  return out;
}

void collectives() {
  const int r = dist::rank(), w = dist::world_size();
  const DType dtypes[] = {kBool, DType::Int32, kInt64, kFloat16, kBFloat16, kFloat32, kFloat64};
  for (DType dtype : dtypes) {
    const std::string name = dtype_torch_name(dtype);
    for (ReduceOp op : {ReduceOp::SUM, ReduceOp::AVG, ReduceOp::MAX, ReduceOp::MIN}) {
      if (op == ReduceOp::AVG && !is_floating(dtype)) continue;
      // Fused with what comes before and after: the collective is a step of its own between.
      Tensor x = input(r, {2, 3}, dtype);
      Tensor y = dist::all_reduce(x, op);
      expect_values(y, {2, 3}, reduced(op, dtype, 6, w), dtype,
                    absl::StrCat("all_reduce(", reduce_op_name(op), ") of ", name));
    }
    for (int64_t dim : {0, 1}) {
      Tensor x = input(r, {2, 3}, dtype);
      Shape shape = {2, 3};
      shape[dim] *= w;
      std::vector<double> want(static_cast<size_t>(6 * w));
      for (int q = 0; q < w; ++q) {
        const std::vector<double> v = input_values(q, 6, dtype);
        for (int64_t i = 0; i < 2; ++i)
          for (int64_t j = 0; j < 3; ++j) {
            const int64_t row = dim == 0 ? q * 2 + i : i, col = dim == 1 ? q * 3 + j : j;
            want[row * shape[1] + col] = v[i * 3 + j];
          }
      }
      expect_values(dist::all_gather(x, dim), shape, want, dtype,
                    absl::StrCat("all_gather(dim ", dim, ") of ", name));
    }
    for (ReduceOp op : {ReduceOp::SUM, ReduceOp::AVG, ReduceOp::MAX, ReduceOp::MIN}) {
      if (op == ReduceOp::AVG && !is_floating(dtype)) continue;
      for (int64_t dim : {0, 1}) {
        // Each process's input is w parts of 2 x 3 along dim.
        Shape shape = {2, 3};
        shape[dim] *= w;
        const std::vector<double> all = reduced(op, dtype, 6 * w, w);
        std::vector<double> want;
        for (int64_t i = 0; i < 2; ++i)
          for (int64_t j = 0; j < 3; ++j) {
            const int64_t row = dim == 0 ? r * 2 + i : i, col = dim == 1 ? r * 3 + j : j;
            want.push_back(all[row * shape[1] + col]);
          }
        expect_values(
            dist::reduce_scatter(input(r, shape, dtype), op, dim), {2, 3}, want, dtype,
            absl::StrCat("reduce_scatter(", reduce_op_name(op), ", dim ", dim, ") of ", name));
      }
    }
    expect_values(dist::broadcast(input(r, {5}, dtype), w - 1), {5}, input_values(w - 1, 5, dtype),
                  dtype, absl::StrCat("broadcast of ", name));
  }

  // Collectives inside a fused graph, evaluated together: (all_reduce(2x) + 1) * all_gather(x)'s
  // first part.
  {
    Tensor x = input(r, {4}, kFloat32);
    Tensor y = (dist::all_reduce(x * 2) + 1) * dist::all_gather(x).narrow(0, 0, 4);
    const std::vector<double> sum = reduced(ReduceOp::SUM, kFloat32, 4, w);
    const std::vector<double> first = input_values(0, 4, kFloat32);
    std::vector<double> want;
    for (int i = 0; i < 4; ++i) want.push_back((2 * sum[i] + 1) * first[i]);
    expect_values(y, {4}, want, kFloat32, "collectives inside a fused graph");
  }

  // Point to point around a ring (of two processes or more): even ranks send first, odd ranks
  // receive first.
  if (w > 1) {
    const int next = (r + 1) % w, previous = (r + w - 1) % w;
    Tensor mine = input(r, {3, 2}, kFloat64);
    Tensor got;
    if (r % 2 == 0) {
      dist::send(mine, next);
      got = dist::recv({3, 2}, TensorOptions(kFloat64).device(device), previous);
    } else {
      got = dist::recv({3, 2}, TensorOptions(kFloat64).device(device), previous);
      dist::send(mine, next);
    }
    expect_values(got, {3, 2}, input_values(previous, 6, kFloat64), kFloat64, "send and recv");
    // LibTorch's form, into an existing tensor.
    Tensor into = zeros({2}, TensorOptions(kInt64).device(device));
    if (r == 0) dist::send(input(0, {2}, kInt64), 1);
    if (r == 1) {
      dist::recv(into, 0);
      expect_values(into, {2}, input_values(0, 2, kInt64), kInt64, "recv into a tensor");
    }
    // A receiver that expects another shape gets a typed error; the pair stays usable.
    if (r == 0) dist::send(input(0, {3}, kFloat32), 1);
    if (r == 1)
      expect_distributed_error([&] { dist::recv({4}, TensorOptions(kFloat32).device(device), 0); },
                               "rank 0 sent f32[3], the receiver expects f32[4]",
                               "recv of another shape");
    if (r == 0) dist::send(input(0, {4}, kFloat32), 1);
    if (r == 1)
      expect_values(dist::recv({4}, TensorOptions(kFloat32).device(device), 0), {4},
                    input_values(0, 4, kFloat32), kFloat32, "recv after a mismatch");
  }

  // Processes that disagree on a collective's shape all get a typed error naming both sides, and
  // the group still runs the next collective.
  if (w > 1) {
    expect_distributed_error([&] { eval(dist::all_reduce(input(r, {r + 1}, kFloat32))); },
                             absl::StrCat("rank 1 runs all_reduce(sum) of f32[2]"),
                             "mismatched shapes");
    expect_distributed_error(
        [&] { eval(dist::all_reduce(input(r, {2}, r == 0 ? kFloat32 : kFloat64))); },
        "the processes disagree", "mismatched dtypes");
  }
  expect_values(dist::all_reduce(input(r, {3}, kInt64)), {3}, reduced(ReduceOp::SUM, kInt64, 3, w),
                kInt64, "all_reduce after the mismatches");

  // Bad arguments are typed errors where the op is made.
  try {
    dist::all_reduce(input(r, {3}, kInt64), ReduceOp::AVG);
    fail("AVG of an integer tensor made a node");
  } catch (const DTypeError&) {
    ++checks;
  }
  if (w > 1) {
    try {
      dist::reduce_scatter(input(r, {w + 1}, kFloat32));
      fail("reduce_scatter of a size that does not divide made a node");
    } catch (const ShapeError&) {
      ++checks;
    }
  }
  dist::barrier();
}

// The gradient of L = sum over processes of sum(w_r * C(x_r)) for each collective C, on each
// process, against central differences of L (every process perturbs in step).
void gradcheck() {
  const int r = dist::rank(), w = dist::world_size();
  struct Case {
    std::string name;
    Shape shape;
    std::function<Tensor(const Tensor&)> apply;
  };
  std::vector<Case> cases = {
      {"all_reduce(sum)", {2, 3}, [](const Tensor& x) { return dist::all_reduce(x); }},
      {"all_reduce(avg)",
       {2, 3},
       [](const Tensor& x) { return dist::all_reduce(x, ReduceOp::AVG); }},
      {"all_reduce(max)",
       {2, 3},
       [](const Tensor& x) { return dist::all_reduce(x, ReduceOp::MAX); }},
      {"all_reduce(min)",
       {2, 3},
       [](const Tensor& x) { return dist::all_reduce(x, ReduceOp::MIN); }},
      {"all_gather(dim 0)", {2, 3}, [](const Tensor& x) { return dist::all_gather(x, 0); }},
      {"all_gather(dim 1)", {2, 3}, [](const Tensor& x) { return dist::all_gather(x, 1); }},
      {"reduce_scatter(sum, dim 0)",
       {2 * w, 3},
       [](const Tensor& x) { return dist::reduce_scatter(x, ReduceOp::SUM, 0); }},
      {"reduce_scatter(avg, dim 1)",
       {2, 3 * w},
       [](const Tensor& x) { return dist::reduce_scatter(x, ReduceOp::AVG, 1); }},
      {"reduce_scatter(max, dim 1)",
       {2, 3 * w},
       [](const Tensor& x) { return dist::reduce_scatter(x, ReduceOp::MAX, 1); }},
      {"broadcast(root last)", {2, 3}, [w](const Tensor& x) { return dist::broadcast(x, w - 1); }},
  };
  for (const Case& c : cases) {
    const int64_t n = numel(c.shape);
    // Distinct values on every process (no ties for max), weights per process.
    auto x_values = [&](int q) {
      std::vector<double> v(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) v[i] = std::sin(1.3 * i + 2.1 * q) + 0.01 * q;
      return v;
    };
    auto loss_of = [&](const Tensor& x) {
      const Tensor y = c.apply(x);
      std::vector<double> weights(static_cast<size_t>(y.numel()));
      for (size_t i = 0; i < weights.size(); ++i) weights[i] = std::cos(0.7 * i + r);
      return (y * from_vector(weights, y.sizes(), TensorOptions(kFloat64).device(device))).sum();
    };
    Tensor x = from_vector(x_values(r), c.shape,
                           TensorOptions(kFloat64).device(device).requires_grad(true));
    loss_of(x).backward();
    const std::vector<double> analytic = values_of(x.grad());
    const double h = 1e-6;
    for (int p = 0; p < w; ++p) {
      for (int64_t i = 0; i < n; ++i) {
        double total[2];
        for (int side = 0; side < 2; ++side) {
          NoGradGuard no_grad;
          std::vector<double> v = x_values(r);
          if (r == p) v[i] += side == 0 ? h : -h;
          total[side] = dist::all_reduce(loss_of(from_vector(
                                             v, c.shape, TensorOptions(kFloat64).device(device))))
                            .item<double>();
        }
        const double numeric = (total[0] - total[1]) / (2 * h);
        if (r == p && std::abs(numeric - analytic[i]) > 1e-6 * (1 + std::abs(numeric)))
          fail(absl::StrCat(c.name, ": d/dx[", i, "] on rank ", p, " is ", analytic[i],
                            ", central differences give ", numeric));
      }
    }
    ++checks;
  }
}

// Training on 2+ processes with DistributedDataParallel, each on its share of the batch in two
// micro-batches (the first under no_sync()), ends with the parameters of one process trained on
// the whole batch.
void ddp() {
  const int w = dist::world_size();
  const int64_t samples = 48, features = 4;
  std::vector<double> xs, ys;
  for (int64_t i = 0; i < samples; ++i) {
    double target = 0.3;
    for (int64_t f = 0; f < features; ++f) {
      const double v = std::sin(0.37 * i + 1.1 * f);
      xs.push_back(v);
      target += (f + 1) * 0.25 * v;
    }
    ys.push_back(std::tanh(target));
  }
  auto make_net = [&] {
    return nn::Sequential(nn::Linear(features, 8), nn::Tanh(), nn::Linear(8, 1));
  };
  const int steps = 6;
  // With `ddp`, each step accumulates two micro-batches (halves of the rows), the first under
  // no_sync(): its gradients must stay this process's own.
  auto train = [&](nn::Module& net, const std::vector<int64_t>& rows,
                   nn::parallel::DistributedDataParallel* ddp = nullptr) {
    const int micro = ddp != nullptr ? 2 : 1;
    const int64_t count = static_cast<int64_t>(rows.size()) / micro;
    std::vector<Tensor> x, y;
    for (int m = 0; m < micro; ++m) {
      std::vector<double> bx, by;
      for (int64_t k = m * count; k < (m + 1) * count; ++k) {
        const int64_t row = rows[k];
        bx.insert(bx.end(), xs.begin() + row * features, xs.begin() + (row + 1) * features);
        by.push_back(ys[row]);
      }
      x.push_back(from_vector(bx, {count, features}, TensorOptions().device(device)));
      y.push_back(from_vector(by, {count, 1}, TensorOptions().device(device)));
    }
    optim::SGD optimizer(net.parameters(), optim::SGDOptions(0.2).momentum(0.9));
    nn::MSELoss loss_fn;
    for (int step = 0; step < steps; ++step) {
      optimizer.zero_grad();
      for (int m = 0; m < micro; ++m) {
        if (m + 1 < micro) {
          auto unsynced = ddp->no_sync();
          (loss_fn(net.forward(x[m]), y[m]) / micro).backward();
          // Each process's own: the processes' first gradients differ.
          const Tensor g = net.parameters()[0].grad().reshape({-1});
          const Tensor spread =
              dist::all_reduce(g, ReduceOp::MAX) - dist::all_reduce(g, ReduceOp::MIN);
          if (spread.abs().max().item<double>() == 0)
            fail("a gradient under no_sync() was the same on every process");
          continue;
        }
        (loss_fn(net.forward(x[m]), y[m]) / micro).backward();
      }
      optimizer.step();
    }
  };
  // One process, the whole batch, from rank 0's initial parameters.
  manual_seed(0);
  nn::Sequential single = make_net();
  single.to(device);
  std::vector<int64_t> everything(static_cast<size_t>(samples));
  for (int64_t i = 0; i < samples; ++i) everything[i] = i;
  train(single, everything);
  // Every process, its share; each starts from its own parameters, which DDP replaces with
  // rank 0's.
  manual_seed(static_cast<uint64_t>(dist::rank()));
  nn::Sequential local = make_net();
  local.to(device);
  nn::parallel::DistributedDataParallel model(std::move(local));
  dist::DistributedSampler sampler(samples, std::nullopt, std::nullopt, /*shuffle=*/false);
  if (sampler.num_samples() * w != samples) fail("the batch does not split evenly");
  train(model, sampler.indices(), &model);
  const std::vector<Tensor> got = model.parameters(), want = single.parameters();
  for (size_t k = 0; k < want.size(); ++k) {
    const std::vector<double> a = values_of(got[k]), b = values_of(want[k]);
    for (size_t i = 0; i < a.size(); ++i)
      if (std::abs(a[i] - b[i]) > 1e-5 * (1 + std::abs(b[i])))
        fail(absl::StrCat("parameter ", k, " element ", i, ": data-parallel ", a[i],
                          ", one process ", b[i]));
    ++checks;
  }
  // The sampler: with shuffling, the processes' shares are disjoint and cover the data.
  std::vector<int64_t> mine =
      dist::DistributedSampler(samples, std::nullopt, std::nullopt, true, 7).indices();
  Tensor all = dist::all_gather(from_vector(std::vector<double>(mine.begin(), mine.end()),
                                            {static_cast<int64_t>(mine.size())}));
  std::vector<double> seen = values_of(all);
  std::sort(seen.begin(), seen.end());
  for (int64_t i = 0; i < samples; ++i)
    if (seen[i] != i) fail("the shuffled shares do not cover the data once each");
  ++checks;
}

// The last process dies; the others get a DistributedError naming it within the timeout.
void kill_last() {
  const int r = dist::rank(), w = dist::world_size();
  dist::barrier();
  if (r == w - 1) ::raise(SIGKILL);
  const auto start = std::chrono::steady_clock::now();
  try {
    eval(dist::all_reduce(ones({4})));
  } catch (const DistributedError& e) {
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("rank %d caught DistributedError after %.1f s: %s\n", r, seconds, e.what());
    std::fflush(stdout);
    // The group is broken now: the next collective says so at once.
    expect_distributed_error([] { eval(dist::all_reduce(ones({1}))); }, "failed earlier",
                             "a collective after the failure");
    std::exit(0);
  }
  fail("all_reduce with a dead process returned");
}

}  // namespace

int main(int argc, char** argv) {
  const std::string scenario = argc > 1 ? argv[1] : "";
  dist::InitOptions options;
  options.timeout = std::chrono::seconds(scenario == "late" ? 3 : 20);
  if (argc > 2) device = Device(argv[2]);
  if (argc > 3) options.backend = argv[3];
  if (scenario == "late" && std::getenv("RANK") != nullptr && std::atoi(std::getenv("RANK")) == 1)
    std::this_thread::sleep_for(std::chrono::seconds(6));
  try {
    dist::init(options);
  } catch (const DistributedError& e) {
    std::printf("rank %s caught DistributedError at init: %s\n", std::getenv("RANK"), e.what());
    return scenario == "late" ? 0 : 1;
  }
  if (scenario == "collectives") {
    collectives();
  } else if (scenario == "gradcheck") {
    gradcheck();
  } else if (scenario == "ddp") {
    ddp();
  } else if (scenario == "kill") {
    kill_last();
  } else if (scenario != "late") {
    fail(absl::StrCat("unknown scenario '", scenario, "'"));
  }
  std::printf("rank %d of %d: %s: %d checks passed\n", dist::rank(), dist::world_size(),
              scenario.c_str(), checks);
  dist::destroy_process_group();
  return 0;
}
