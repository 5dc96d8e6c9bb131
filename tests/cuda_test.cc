// The CUDA path, on a machine with a GPU (every test skips without one): each result is
// compared with the CPU path and with a float64 reference computed here.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>

#include <bit>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include <lazyfuse/lazyfuse.h>

#include "lazyfuse/runtime/cuda/cublas.h"
#include "lazyfuse/runtime/cuda/cuda_memory.h"
#include "lazyfuse/runtime/devices.h"
#include "lazyfuse/runtime/kernel_cache.h"
#include "tests/reference/reference.h"

namespace lazyfuse {
namespace {

class Cuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::is_available()) GTEST_SKIP() << "no CUDA GPU";
  }
};

std::vector<double> random_values(int64_t n, double lo, double hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(n);
  for (double& x : v) x = dist(rng);
  return v;
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, double rtol,
                  double atol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << "at " << i;
      continue;
    }
    ASSERT_NEAR(got[i], want[i], atol + rtol * std::fabs(want[i])) << "at " << i;
  }
}

TEST_F(Cuda, SeedExpressionIsOneKernelOnTheGpu) {
  Tensor x = tensor({1, 2, 3});
  Tensor y = x.to("cuda"), z = x.to("cuda");
  EXPECT_TRUE(y.to("cuda").is_same(y));
  reset_eval_stats();
  Tensor r = (z + 2).exp() * y;
  EXPECT_EQ(r.device(), Device("cuda:0"));
  eval(r);
  EXPECT_EQ(eval_stats().kernels, 1);
  EXPECT_EQ(r.str(), "tensor([ 20.0855, 109.1963, 445.2395], device='cuda:0')");
}

TEST_F(Cuda, ElementwiseOpsMatchTheReferenceAndTheCpu) {
  const int64_t n = 100003;  // not a multiple of 4: vector body and scalar tail
  std::vector<double> a = random_values(n, 0.1, 3.0, 1), b = random_values(n, -2.0, 2.0, 2);
  for (DType dtype : {kFloat32, kFloat64, kFloat16, kBFloat16}) {
    Tensor ca = from_vector(a, {n}, dtype), cb = from_vector(b, {n}, dtype);
    Tensor ga = ca.to("cuda"), gb = cb.to("cuda");
    auto expr = [](const Tensor& x, const Tensor& y) {
      return (x.log() + y.tanh() * x.sqrt() - maximum(x, y).sigmoid() / (x + 1)).relu() +
             y.abs().pow(1.5) + (x > y).to(x.dtype()) +
             where(y < 0, x.exp(), y.sin() * y.cos()).clamp(-3, 3) + x.rsqrt();
    };
    std::vector<double> gpu = expr(ga, gb).to_vector<double>();
    std::vector<double> cpu = expr(ca, cb).to_vector<double>();
    // The float64 reference, from the values as stored in `dtype`.
    std::vector<double> sa = ca.to_vector<double>(), sb = cb.to_vector<double>(), want(n);
    for (int64_t i = 0; i < n; ++i) {
      double x = sa[i], y = sb[i];
      double m = std::max(x, y);
      double first = std::max(
          0.0, std::log(x) + std::tanh(y) * std::sqrt(x) - (1 / (1 + std::exp(-m))) / (x + 1));
      double w = y < 0 ? std::exp(x) : std::sin(y) * std::cos(y);
      want[i] = first + std::pow(std::fabs(y), 1.5) + (x > y ? 1 : 0) + std::clamp(w, -3.0, 3.0) +
                1 / std::sqrt(x);
    }
    double rtol = dtype == kFloat64   ? 1e-12
                  : dtype == kFloat32 ? 2e-5
                  : dtype == kFloat16 ? 2e-2
                                      : 1e-1;
    SCOPED_TRACE(dtype_torch_name(dtype));
    expect_close(gpu, want, rtol, rtol);
    expect_close(gpu, cpu, rtol, rtol);
  }
}

TEST_F(Cuda, IntegerAndBoolOpsAreExact) {
  Tensor a = arange(-50, 50, 1, Device("cuda"));
  Tensor b = (a * 3 + 7).to(kInt32);
  std::vector<int64_t> products = (b * b - a).to_vector<int64_t>();
  for (int64_t i = 0; i < 100; ++i) {
    int64_t x = i - 50, y = 3 * x + 7;
    EXPECT_EQ(products[i], y * y - x);
  }
  std::vector<bool> flags = ((a > 0) == (b > 10)).to_vector<bool>();
  for (int64_t i = 0; i < 100; ++i) {
    int64_t x = i - 50;
    EXPECT_EQ(flags[i], (x > 0) == (3 * x + 7 > 10)) << i;
  }
}

TEST_F(Cuda, BroadcastAndStridedInputs) {
  std::vector<double> m = random_values(64 * 33, -1, 1, 3), row = random_values(33, -1, 1, 4);
  Tensor cm = from_vector(m, {64, 33}), crow = from_vector(row, {33});
  Tensor gm = cm.to("cuda"), grow = crow.to("cuda");
  // Transposed, narrowed and broadcast reads in one kernel.
  auto expr = [](const Tensor& x, const Tensor& r) {
    return (x.t().narrow(0, 5, 20) * 2).t() + r.narrow(0, 0, 20).unsqueeze(0).t().t();
  };
  expect_close(expr(gm, grow).to_vector<double>(), expr(cm, crow).to_vector<double>(), 1e-6, 1e-6);
  // relu(x + b) * 0.5 with b broadcast over rows.
  Tensor out = ((gm + grow).relu() * 0.5);
  std::vector<double> got = out.to_vector<double>();
  for (int64_t i = 0; i < 64; ++i)
    for (int64_t j = 0; j < 33; ++j)
      ASSERT_NEAR(got[i * 33 + j],
                  std::max(0.0, static_cast<double>(static_cast<float>(m[i * 33 + j])) +
                                    static_cast<float>(row[j])) *
                      0.5,
                  1e-6);
}

// Rows of 64 and 66 (four at a time and one at a time), and a bias over the last two dims of a
// 3-D tensor: each read by period on the GPU, checked element by element against float64.
TEST_F(Cuda, RowBroadcastMatchesTheReference) {
  for (Shape shape : {Shape{50, 64}, Shape{50, 66}, Shape{7, 6, 12}}) {
    SCOPED_TRACE(shape_str(shape));
    const int64_t n = numel(shape);
    Shape tail(shape.begin() + 1, shape.end());
    const int64_t period = numel(tail);
    std::vector<double> x = random_values(n, -1, 1, 5), b = random_values(period, -1, 1, 6);
    Tensor gx = from_vector(x, shape).to("cuda"), gb = from_vector(b, tail).to("cuda");
    std::vector<double> got = ((gx + gb).relu() * 0.5).to_vector<double>();
    for (int64_t i = 0; i < n; ++i) {
      const double sum =
          static_cast<float>(static_cast<float>(x[i]) + static_cast<float>(b[i % period]));
      ASSERT_EQ(got[i], std::max(0.0, sum) * 0.5) << "element " << i;
    }
  }
}

TEST_F(Cuda, RandomNumbersMatchTheCpu) {
  manual_seed(7);
  Tensor g = rand({1000}, Device("cuda"));
  manual_seed(7);
  Tensor c = rand({1000});
  EXPECT_EQ(g.to_vector<float>(), c.to_vector<float>());
  manual_seed(8);
  Tensor gn = randn({1000}, Device("cuda"));
  manual_seed(8);
  Tensor cn = randn({1000});
  expect_close(gn.to_vector<double>(), cn.to_vector<double>(), 1e-6, 1e-6);
}

TEST_F(Cuda, TransfersRoundTripEveryDtype) {
  for (DType dtype : kAllDTypes) {
    Tensor c = (arange(0, 1000, 1) - 500).to(dtype);
    Tensor back = c.to("cuda").to("cpu");
    EXPECT_EQ(back.to_vector<double>(), c.to_vector<double>()) << dtype_torch_name(dtype);
  }
}

TEST_F(Cuda, MixingDevicesIsAnError) {
  Tensor on_cpu = tensor({1, 2, 3});
  Tensor on_gpu = on_cpu.to("cuda");
  Tensor mixed = on_cpu + on_gpu;
  try {
    eval(mixed);
    FAIL() << "expected DeviceMismatchError";
  } catch (const DeviceMismatchError& e) {
    EXPECT_NE(std::string(e.what()).find("found at least two devices, cpu and cuda:0!"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("cuda_test.cc:"), std::string::npos) << e.what();
  }
  // Nothing was lost: both operands still evaluate, and fixed code runs.
  EXPECT_EQ((on_cpu.to("cuda") + on_gpu).to_vector<float>(), (std::vector<float>{2, 4, 6}));
}

TEST_F(Cuda, DeviceBeyondTheCountIsAnError) {
  const int count = cuda::device_count();
  const std::string name = "cuda:" + std::to_string(count);
  try {
    ones({2}, Device(name));
    FAIL() << "expected DeviceIndexError";
  } catch (const DeviceIndexError& e) {
    EXPECT_NE(
        std::string(e.what()).find("this machine has " + std::to_string(count) + " CUDA device"),
        std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("cuda_test.cc:"), std::string::npos) << e.what();
  }
}

TEST_F(Cuda, ModelRunsWhereItsParametersAre) {
  manual_seed(0);
  nn::Sequential net(nn::Linear(3, 1));
  net.to(Device("cuda"));
  auto linear = net.at<nn::Linear>(0);
  EXPECT_EQ(linear->weight().device(), Device("cuda:0"));
  EXPECT_EQ(linear->bias().device(), Device("cuda:0"));
}

TEST_F(Cuda, NewSizeReusesTheKernel) {
  Tensor a = rand({1000}, Device("cuda"));
  eval(a);
  eval((a * 3 + 1).exp());
  cuda::KernelCacheStats before = cuda::kernel_cache_stats();
  Tensor b = rand({5000}, Device("cuda"));
  eval(b);
  cuda::KernelCacheStats middle = cuda::kernel_cache_stats();
  eval((b * 3 + 1).exp());
  cuda::KernelCacheStats after = cuda::kernel_cache_stats();
  EXPECT_EQ(after.compiles + after.disk_hits, middle.compiles + middle.disk_hits);
  EXPECT_GT(after.memory_hits, middle.memory_hits);
  (void)before;
}

// Note [Horizontal fusion]: a hundred independent updates of parameters of every kind of
// layout (vectorized float32 and bfloat16, a transposed view read by strides, a scalar, an
// empty one) are one Group step, launched as few kernels as the parameter space allows, and
// each matches a float64 reference; a second evaluation with new gradients reuses the plans.
TEST_F(Cuda, GroupOfManyUpdatesMatchesTheReference) {
  struct Parameter {
    Shape shape;
    DType dtype;
    bool transposed;
  };
  std::vector<Parameter> parameters;
  for (int i = 0; i < 100; ++i) {
    switch (i % 5) {
      case 0:
        parameters.push_back({{1000 + i}, kFloat32, false});
        break;
      case 1:
        parameters.push_back({{33, 17 + i % 3}, kFloat32, true});
        break;
      case 2:
        parameters.push_back({{64, 8}, kBFloat16, false});
        break;
      case 3:
        parameters.push_back({Shape(), kFloat32, false});
        break;
      default:
        parameters.push_back({i == 4 ? Shape{0, 3} : Shape{7}, kFloat32, false});
    }
  }
  std::vector<Tensor> weights, weights_on_gpu;
  for (size_t i = 0; i < parameters.size(); ++i) {
    const Parameter& p = parameters[i];
    const int64_t n = numel(p.shape);
    Tensor w = from_vector(random_values(n, -2, 2, 17 + i), p.shape, p.dtype);
    weights.push_back(w);
    weights_on_gpu.push_back(w.to("cuda"));
  }
  for (int round = 0; round < 2; ++round) {
    std::vector<Tensor> grads, updates;
    for (size_t i = 0; i < parameters.size(); ++i) {
      const Parameter& p = parameters[i];
      Shape stored = p.shape;
      if (p.transposed) std::swap(stored[0], stored[1]);
      Tensor g =
          from_vector(random_values(numel(p.shape), -1, 1, 1000 * round + i), stored, p.dtype)
              .to("cuda");
      if (p.transposed) g = g.t();
      grads.push_back(g);
      updates.push_back(weights_on_gpu[i] * 0.5 - g * 0.25);
    }
    reset_eval_stats();
    eval(updates);
    EXPECT_EQ(eval_stats().kernels, 1);
    for (size_t i = 0; i < parameters.size(); ++i) {
      SCOPED_TRACE(testing::Message() << "parameter " << i << " round " << round);
      const std::vector<double> w = weights[i].to_vector<double>();
      const std::vector<double> g = grads[i].to_vector<double>();
      std::vector<double> want(w.size());
      for (size_t k = 0; k < w.size(); ++k) want[k] = w[k] * 0.5 - g[k] * 0.25;
      const double rtol = parameters[i].dtype == kBFloat16 ? 1e-2 : 1e-6;
      expect_close(updates[i].to_vector<double>(), want, rtol, rtol);
    }
  }
}

// Evaluates the results `make` returns, three times: each time one schedule step run in
// `launches` launches, every result within float32 rounding of `want` (the CPU's) and with the
// bits of the first time (a group's counters are back at zero after every launch).
void expect_one_group_each_round(const std::function<std::vector<Tensor>()>& make,
                                 const std::vector<Tensor>& want, int64_t launches) {
  std::vector<std::vector<double>> first;
  for (int round = 0; round < 3; ++round) {
    const std::vector<Tensor> got = make();
    reset_eval_stats();
    eval(got);
    EXPECT_EQ(eval_stats().kernels, 1);
    EXPECT_EQ(eval_stats().launches, launches);
    for (size_t k = 0; k < got.size(); ++k) {
      SCOPED_TRACE(testing::Message() << "result " << k << " round " << round);
      const std::vector<double> values = got[k].to_vector<double>();
      expect_close(values, want[k].to_vector<double>(), 1e-5, 1e-4);
      if (round == 0)
        first.push_back(values);
      else
        EXPECT_EQ(values, first[k]);
    }
  }
}

// Reductions of stored values share a group's launch with elementwise kernels: by columns with
// many chunks (the counters of several such reductions in one launch must not collide), by rows,
// a max, and one whose operand needs a dense copy first (it runs on its own). Every launch gives
// the same bits, and each value matches the CPU.
TEST_F(Cuda, GroupOfReductionsAndUpdatesMatchesTheCpu) {
  Tensor a = from_vector(random_values(70001 * 40, -1, 1, 41), {70001, 40});
  Tensor b = from_vector(random_values(37 * 70001, -1, 1, 42), {37, 70001});
  Tensor c = from_vector(random_values(4 * 5 * 6, -1, 1, 43), {4, 5, 6});
  Tensor d = from_vector(random_values(3000 * 100, -1, 1, 44), {3000, 100});
  Tensor e = from_vector(random_values(1000, -1, 1, 45), {1000});
  Tensor ga = a.to("cuda"), gb = b.to("cuda"), gc = c.to("cuda"), gd = d.to("cuda"),
         ge = e.to("cuda");
  eval({ga, gb, gc, gd, ge});
  auto outputs = [](const Tensor& a, const Tensor& b, const Tensor& c, const Tensor& d,
                    const Tensor& e) {
    return std::vector<Tensor>{a.sum({0}),  b.sum({1}),  c.sum({1}),
                               d.amax({0}), e * 0.5 + 1, d.sum({0})};
  };
  const std::vector<Tensor> want = outputs(a, b, c, d, e);
  // The group's launch, and the copy and reduction of the one that reads a dense copy.
  expect_one_group_each_round([&] { return outputs(ga, gb, gc, gd, ge); }, want, 3);
}

// The preferred BLAS library for one scope.
class BlasBackendGuard {
 public:
  explicit BlasBackendGuard(cuda::BlasBackend backend) : saved_(cuda::preferred_blas_library()) {
    cuda::set_preferred_blas_library(backend);
  }
  ~BlasBackendGuard() { cuda::set_preferred_blas_library(saved_); }

 private:
  cuda::BlasBackend saved_;
};

// A matmul's bias and relu (fusion's epilogue) are one cuBLASLt call in bfloat16 and float16,
// whatever the weight's layout (nn::Linear's transposed view, or a plain matrix), and in float32
// with the bare product's bits (cublasGemmEx's or cuBLASLt's, by the preferred library; with
// cuBLASLt's, the product's own algorithm takes the epilogue); a float64 product, or a bias that
// is not 16-byte aligned, takes the product and one elementwise kernel. Every result against the
// CPU.
TEST_F(Cuda, MatmulBiasAndReluAreOneLaunch) {
  for (cuda::BlasBackend backend : {cuda::BlasBackend::Cublas, cuda::BlasBackend::Cublaslt})
    for (DType dtype : {kFloat32, kBFloat16, kFloat16, kFloat64}) {
      BlasBackendGuard blas(backend);
      for (bool transposed : {true, false}) {
        for (bool relu : {true, false}) {
          for (bool aligned : {true, false}) {
            SCOPED_TRACE(testing::Message()
                         << dtype_torch_name(dtype) << " transposed " << transposed << " relu "
                         << relu << " aligned " << aligned << " cuBLASLt "
                         << (backend == cuda::BlasBackend::Cublaslt));
            const int64_t n = 33, k = 70, m = 129;
            Tensor x = from_vector(random_values(n * k, -1, 1, 61), {n, k}, dtype);
            // nn::Linear's weight is [m, k], read as its transposed view.
            Tensor weight = transposed
                                ? from_vector(random_values(m * k, -1, 1, 62), {m, k}, dtype)
                                : from_vector(random_values(k * m, -1, 1, 62), {k, m}, dtype);
            Tensor w = transposed ? weight.t() : weight;
            // The bias as a view one element into a buffer, on the GPU: not 16-byte aligned.
            Tensor bias_buffer = from_vector(random_values(m + 1, -1, 1, 63), {m + 1}, dtype);
            const int64_t start = aligned ? 0 : 1;
            Tensor b = bias_buffer.narrow(0, start, m);
            auto layer = [&](const Tensor& x, const Tensor& w, const Tensor& b) {
              Tensor y = x.matmul(w) + b;
              return relu ? y.relu() : y;
            };
            Tensor gx = x.to("cuda"), gweight = weight.to("cuda");
            Tensor gw = transposed ? gweight.t() : gweight;
            Tensor gb = bias_buffer.to("cuda").narrow(0, start, m);
            eval({gx, gweight, gb});
            reset_eval_stats();
            Tensor got = layer(gx, gw, gb);
            eval(got);
            const bool half = dtype == kBFloat16 || dtype == kFloat16;
            const bool lt_float32 = dtype == kFloat32 && backend == cuda::BlasBackend::Cublaslt;
            if (half || lt_float32 || !aligned || dtype == kFloat64) {
              EXPECT_EQ(eval_stats().launches, (half || lt_float32) && aligned ? 1 : 2);
            }
            if (dtype == kFloat32) {
              // One call where a cuBLASLt algorithm gives the bare product's bits, two where none
              // does: the same bits either way, those of the product and the epilogue apart.
              Tensor apart = layer(gx, gw, gb);
              eval({apart}, EvalOptions{.fusion = false});
              EXPECT_EQ(got.to_vector<float>(), apart.to_vector<float>());
            }
            const double tolerance = dtype == kFloat32 || dtype == kFloat64 ? 1e-5 : 3e-2;
            expect_close(got.to_vector<double>(), layer(x, w, b).to_vector<double>(), tolerance,
                         tolerance);
          }
        }
      }
    }
}

// Products of 1 to 64 rows with the weight read transposed, as nn::Linear reads it, run
// lazyfuse's own kernel (Note [Products of few rows] in codegen/cuda/cuda_matmul.cc): one launch
// with or without the bias and relu, each result within its dtype's rounding of the float64 product
// of the same values, and the same bits as the product and its epilogue launched apart.
// Whether products of few rows run lazyfuse's own kernel, for one scope.
class SkinnyMatmulGuard {
 public:
  explicit SkinnyMatmulGuard(bool enabled) : saved_(cuda::skinny_matmul_enabled()) {
    cuda::set_skinny_matmul_enabled(enabled);
  }
  ~SkinnyMatmulGuard() { cuda::set_skinny_matmul_enabled(saved_); }

 private:
  bool saved_;
};

TEST_F(Cuda, ProductsOfFewRowsMatchFloat64) {
  SkinnyMatmulGuard own_kernel(true);
  // Each case compiles its own kernel (rows and epilogue are in it): float32 over the shapes'
  // edges (one row, one column, a ragged second block of rows, an inner dim past four warps'
  // chunks), the half types over fewer.
  struct Case {
    DType dtype;
    int64_t rows, inner, cols;
    int epilogue;  // 0: none, 1: bias, 2: bias and relu
  };
  const std::vector<Case> cases = {
      {kFloat32, 1, 8, 1, 0},         {kFloat32, 3, 256, 10, 1},    {kFloat32, 32, 1024, 1024, 2},
      {kFloat32, 64, 520, 33, 2},     {kFloat32, 17, 2048, 129, 0}, {kFloat32, 63, 64, 9, 1},
      {kBFloat16, 32, 1024, 1024, 2}, {kBFloat16, 64, 520, 33, 0},  {kBFloat16, 5, 256, 40, 1},
      {kFloat16, 32, 1024, 1024, 1},  {kFloat16, 3, 256, 10, 2}};
  for (const Case& test : cases) {
    const DType dtype = test.dtype;
    const int epilogue = test.epilogue;
    SCOPED_TRACE(testing::Message() << dtype_torch_name(dtype) << " " << test.rows << "x"
                                    << test.inner << "x" << test.cols << " epilogue " << epilogue);
    const int64_t rows = test.rows, inner = test.inner, cols = test.cols;
    const auto seed = static_cast<uint32_t>(rows * 7 + inner + cols);
    Tensor x = from_vector(random_values(rows * inner, -1, 1, seed), {rows, inner}, dtype);
    Tensor weight = from_vector(random_values(cols * inner, -1, 1, seed + 1), {cols, inner}, dtype);
    Tensor bias = from_vector(random_values(cols, -1, 1, seed + 2), {cols}, dtype);
    auto layer = [&](const Tensor& x, const Tensor& weight, const Tensor& bias) {
      Tensor y = x.matmul(weight.t());
      if (epilogue >= 1) y = y + bias;
      return epilogue == 2 ? y.relu() : y;
    };
    Tensor gx = x.to("cuda"), gweight = weight.to("cuda"), gbias = bias.to("cuda");
    eval({gx, gweight, gbias});
    reset_eval_stats();
    const int64_t before = cuda::skinny_matmul_count();
    Tensor got = layer(gx, gweight, gbias);
    eval(got);
    EXPECT_EQ(eval_stats().launches, 1);
    EXPECT_EQ(cuda::skinny_matmul_count() - before, 1) << "the product was the library's";
    Tensor apart = layer(gx, gweight, gbias);
    eval({apart}, EvalOptions{.fusion = false});
    EXPECT_EQ(cuda::skinny_matmul_count() - before, 2);
    EXPECT_EQ(got.to(kFloat32).to_vector<float>(), apart.to(kFloat32).to_vector<float>());
    // The reference: float64 over the values as the dtype holds them.
    const Tensor x64 = x.to(kFloat64), weight64 = weight.to(kFloat64);
    const Tensor bias64 = bias.to(kFloat64);
    // A sum of `inner` products of values within 1 is about sqrt(inner) at most; each
    // dtype's rounding is relative to that.
    const double rounding = dtype == kFloat32 ? 2e-6 : 8e-3;
    expect_close(got.to_vector<double>(), layer(x64, weight64, bias64).to_vector<double>(),
                 rounding, rounding * std::sqrt(static_cast<double>(inner)));
  }
  // Switched off, the same kind of product is the library's.
  SkinnyMatmulGuard library(false);
  Tensor x = from_vector(random_values(32 * 64, -1, 1, 90), {32, 64}, kFloat32).to("cuda");
  Tensor weight = from_vector(random_values(16 * 64, -1, 1, 91), {16, 64}, kFloat32).to("cuda");
  eval({x, weight});
  const int64_t before = cuda::skinny_matmul_count();
  eval(x.matmul(weight.t()));
  EXPECT_EQ(cuda::skinny_matmul_count(), before);
}

// A NaN in a matmul's bias stays NaN through the relu, fused or not, under either BLAS library
// and in every floating dtype cuBLASLt takes (relu propagates NaN, as PyTorch's does; an
// epilogue whose relu is max(x, 0) would turn it into 0 and is not used); the other columns
// against the CPU.
TEST_F(Cuda, MatmulBiasAndReluKeepANaNOfTheBias) {
  for (cuda::BlasBackend backend : {cuda::BlasBackend::Cublas, cuda::BlasBackend::Cublaslt})
    for (DType dtype : {kFloat32, kBFloat16, kFloat16}) {
      BlasBackendGuard blas(backend);
      SCOPED_TRACE(testing::Message() << dtype_torch_name(dtype) << " cuBLASLt "
                                      << (backend == cuda::BlasBackend::Cublaslt));
      const int64_t n = 33, k = 70, m = 129;
      Tensor x = from_vector(random_values(n * k, -1, 1, 64), {n, k}, dtype);
      Tensor weight = from_vector(random_values(m * k, -1, 1, 65), {m, k}, dtype);
      std::vector<double> bias_values = random_values(m, -1, 1, 66);
      bias_values[0] = NAN;
      Tensor b = from_vector(bias_values, {m}, dtype);
      Tensor gx = x.to("cuda"), gweight = weight.to("cuda"), gb = b.to("cuda");
      eval({gx, gweight, gb});
      const std::vector<double> got = (gx.matmul(gweight.t()) + gb).relu().to_vector<double>();
      const std::vector<double> want = (x.matmul(weight.t()) + b).relu().to_vector<double>();
      const double tolerance = dtype == kFloat32 ? 1e-5 : 3e-2;
      for (int64_t row = 0; row < n; ++row)
        for (int64_t col = 0; col < m; ++col) {
          const double g = got[row * m + col], w = want[row * m + col];
          if (col == 0) {
            EXPECT_TRUE(std::isnan(g)) << "row " << row << ": " << g;
          } else {
            EXPECT_NEAR(g, w, tolerance * (1 + std::abs(w))) << "row " << row << " col " << col;
          }
        }
    }
}

// Reductions with fused work in one launch: norms of tensors of every size, one of several
// chunks per row (its counters must not collide with the others'), against the CPU, the same
// bits every launch.
TEST_F(Cuda, GroupOfFusedReductionsMatchesTheCpu) {
  const std::vector<Shape> shapes = {{3000, 1000}, {1024}, {37, 70001}, {7}};
  std::vector<Tensor> cpu, gpu;
  for (size_t k = 0; k < shapes.size(); ++k) {
    Tensor t = from_vector(random_values(numel(shapes[k]), -1, 1, 71 + k), shapes[k]);
    cpu.push_back(t);
    gpu.push_back(t.to("cuda"));
  }
  eval(gpu);
  auto norms = [](const std::vector<Tensor>& ts) {
    std::vector<Tensor> out;
    for (size_t k = 0; k < ts.size(); ++k)
      out.push_back(k == 2 ? (ts[k] * ts[k]).sum({1}) : (ts[k] * ts[k]).sum());
    return out;
  };
  const std::vector<Tensor> want = norms(cpu);
  expect_one_group_each_round([&] { return norms(gpu); }, want, 1);
}

TEST_F(Cuda, OutOfMemoryIsTypedAndRecoverable) {
  Tensor kept = ones({1000}, Device("cuda"));
  eval(kept);
  EXPECT_THROW(eval(zeros({int64_t{1} << 40}, Device("cuda"))), OutOfMemoryError);
  EXPECT_EQ(kept.to_vector<float>(), std::vector<float>(1000, 1.0f));
}

}  // namespace
}  // namespace lazyfuse

namespace lazyfuse {
namespace {

// Float32 sums accumulate in float64 on the GPU: each is its float64 sum rounded once, within
// half an ulp of float32 (2^-24 relative) of the float64 reference. (The CPU adds stretches of
// 16 in float32 first, so the two devices need not agree to that.)
TEST_F(Cuda, ReductionsMatchTheReference) {
  const int64_t rows = 37, columns = 70001;  // several chunks per row
  std::vector<double> v = random_values(rows * columns, -1, 1, 9);
  Tensor c = from_vector(v, {rows, columns});
  Tensor g = c.to("cuda");
  std::vector<double> row_sums(rows, 0.0), column_sums(columns, 0.0);
  double total = 0, total_of_squares = 0;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < columns; ++j) {
      const float x = static_cast<float>(v[i * columns + j]);  // what the tensor holds
      row_sums[i] += x;
      column_sums[j] += x;
      total += x;
      total_of_squares += x * x;  // float32's product, as g * g computes it
    }
  // (The float64 accumulation's own error, far below that, is what 1e-12 allows for.)
  constexpr double kHalfUlp = 0x1p-24 + 1e-12, kTiny = 1e-30;
  expect_close(g.sum({1}).to_vector<double>(), row_sums, kHalfUlp, kTiny);
  expect_close(g.sum({0}).to_vector<double>(), column_sums, kHalfUlp, kTiny);
  expect_close(g.mean().to_vector<double>(), {total / (rows * columns)}, 2 * kHalfUlp, kTiny);
  expect_close(g.max(1).to_vector<double>(), c.max(1).to_vector<double>(), 0, 0);
  expect_close(g.min(0, true).to_vector<double>(), c.min(0, true).to_vector<double>(), 0, 0);
  expect_close((g * g).sum().to_vector<double>(), {total_of_squares}, kHalfUlp, kTiny);
  // Softmax over rows of 1024.
  Tensor x = from_vector(random_values(64 * 1024, -5, 5, 10), {64, 1024}).to("cuda");
  Tensor e = (x - x.max(1, true)).exp();
  Tensor softmax = e / e.sum({1}, true);
  std::vector<double> rows_sum = softmax.sum({1}).to_vector<double>();
  for (double s : rows_sum) EXPECT_NEAR(s, 1.0, 1e-5);
  // Integer sums are exact, and the same bits come back every time.
  Tensor ints = arange(0, 100000, 1, Device("cuda"));
  EXPECT_EQ(ints.sum().item<int64_t>(), int64_t{99999} * 100000 / 2);
  EXPECT_EQ(g.sum().to_vector<double>(), g.sum().to_vector<double>());
  // Each row's last block combines its partials and zeroes the row's counter for the next
  // launch: launch after launch gives the same bits, fused (x * x in the reduction) or not.
  const std::vector<double> first = (g * g).sum({1}).to_vector<double>();
  for (int k = 0; k < 10; ++k) EXPECT_EQ((g * g).sum({1}).to_vector<double>(), first);
  Tensor unfused = (g * g).sum({1});
  eval({unfused}, EvalOptions{.fusion = false});
  EXPECT_EQ(unfused.to_vector<double>(), first);
}

// Softmax is one row kernel: rows short enough to stay in registers (1, 33 and 1024 columns)
// and longer ones reread from cache (1500, 5000), each element against float64.
// A reduction over leading dims of an operand whose kept dims lie contiguous (a bias gradient's
// sum over the batch) reads the operand where it lies: one launch, no transposing copy. Every
// op, several dtypes, tiles with a partial last one, one chunk and many, and an empty
// reduction, against the CPU.
TEST_F(Cuda, ReductionsOverLeadingDimsAreOneLaunch) {
  struct Case {
    Shape shape;
    std::vector<int64_t> dims;
  };
  const std::vector<Case> cases = {{{32, 1024}, {0}},   {{1024, 1024}, {0}},  {{3, 5}, {0}},
                                   {{70001, 33}, {0}},  {{4, 6, 40}, {0, 1}}, {{0, 7}, {0}},
                                   {{9, 1, 70}, {0, 1}}};
  for (const Case& c : cases) {
    for (DType dtype : {kFloat32, kFloat64, kBFloat16, kInt32}) {
      SCOPED_TRACE(testing::Message() << shape_str(c.shape) << " " << dtype_torch_name(dtype));
      const int64_t n = numel(c.shape);
      Tensor cpu = from_vector(random_values(n, -4, 4, 31 + n), c.shape, dtype);
      Tensor gpu = cpu.to("cuda");
      eval(gpu);
      const double tolerance = dtype == kBFloat16 ? 2e-2 : dtype == kFloat32 ? 1e-5 : 1e-12;
      reset_eval_stats();
      Tensor sum = gpu.sum(c.dims);
      eval(sum);
      EXPECT_EQ(eval_stats().launches, 1);
      expect_close(sum.to_vector<double>(), cpu.sum(c.dims).to_vector<double>(),
                   dtype == kInt32 ? 0 : tolerance, dtype == kInt32 ? 0 : tolerance * 100);
      if (n > 0) {  // max and min of nothing are errors, as in PyTorch
        expect_close(gpu.amax(c.dims).to_vector<double>(), cpu.amax(c.dims).to_vector<double>(), 0,
                     0);
        expect_close(gpu.amin(c.dims).to_vector<double>(), cpu.amin(c.dims).to_vector<double>(), 0,
                     0);
      }
      if (is_floating(dtype))
        expect_close(gpu.mean(c.dims).to_vector<double>(), cpu.mean(c.dims).to_vector<double>(),
                     tolerance, tolerance);
      // The tile's last block combines the chunks in order: the same bits every time.
      EXPECT_EQ(gpu.sum(c.dims).to_vector<double>(), sum.to_vector<double>());
    }
  }
}

TEST_F(Cuda, SoftmaxRowKernelMatchesTheReference) {
  // Rows in registers read four columns at a time per lane where rows are whole groups of 128
  // (128, 384, 1024), one at a time otherwise (1, 33), and rows past 1024 are read per pass.
  for (int64_t columns : {1, 33, 128, 384, 1024, 1500, 5000}) {
    SCOPED_TRACE(columns);
    const int64_t rows = 45;
    std::vector<double> v = random_values(rows * columns, -5, 5, 13);
    Tensor x = from_vector(v, {rows, columns}).to("cuda");
    reset_eval_stats();
    Tensor e = (x - x.max(1, true)).exp();
    Tensor softmax = e / e.sum({1}, true);
    std::vector<double> got = softmax.to_vector<double>();
    EXPECT_EQ(eval_stats().kernels, 1);
    for (int64_t r = 0; r < rows; ++r) {
      double m = -INFINITY, total = 0;
      for (int64_t c = 0; c < columns; ++c)
        m = std::max(m, static_cast<double>(static_cast<float>(v[r * columns + c])));
      for (int64_t c = 0; c < columns; ++c)
        total += std::exp(static_cast<float>(v[r * columns + c]) - m);
      for (int64_t c = 0; c < columns; ++c) {
        const double want = std::exp(static_cast<float>(v[r * columns + c]) - m) / total;
        ASSERT_NEAR(got[r * columns + c], want, 1e-6 * want + 1e-12) << r << ", " << c;
      }
    }
  }
}

// A softmax of exponentials weighted per column (the weights read by period) over rows that
// are whole groups of 128: its four-at-a-time row kernel agrees bit for bit with one kernel
// per op, in float32 and bfloat16.
TEST_F(Cuda, VectorizedRowKernelGivesTheUnfusedBits) {
  HalfRoundingGuard each_op(HalfRounding::EachOp);  // bfloat16 rounded as the unfused kernels do
  for (DType dtype : {kFloat32, kBFloat16}) {
    SCOPED_TRACE(dtype_ir_name(dtype));
    for (int64_t columns : {256, 1024}) {
      const int64_t rows = 37;
      Tensor x =
          from_vector(random_values(rows * columns, -4, 4, 21), {rows, columns}, dtype).to("cuda");
      Tensor weight = from_vector(random_values(columns, 0.5, 2, 22), {columns}, dtype).to("cuda");
      auto softmax = [&] {
        Tensor e = (x - x.max(1, true)).exp() * weight;
        return e / e.sum({1}, true);
      };
      Tensor fused = softmax(), unfused = softmax();
      reset_eval_stats();
      eval({fused});
      EXPECT_EQ(eval_stats().kernels, 1);
      eval({unfused}, EvalOptions{.fusion = false});
      EXPECT_EQ(fused.to_vector<double>(), unfused.to_vector<double>());
    }
  }
}

// Fusion never changes a result on the GPU either: GELU and an Adam step, fused and one kernel
// per op, agree bit for bit (NVRTC must not contract a multiply and an add into an FMA; the
// benchmark once found GELU's differing in the last bit).
TEST_F(Cuda, FusedAndUnfusedGiveIdenticalBits) {
  std::vector<double> v = random_values(100000, -3, 3, 14), w = random_values(100000, 0, 1, 15);
  Tensor x = from_vector(v, {100000}).to("cuda"), g = from_vector(w, {100000}).to("cuda");
  auto gelu = [](const Tensor& t) {
    return t * 0.5 * (((t * t * t) * 0.044715 + t) * 0.7978845608).tanh() + t * 0.5;
  };
  auto adam = [](const Tensor& p, const Tensor& grad) {
    Tensor m = p * 0.9 + grad * 0.1, v2 = p * p * 0.999 + grad * grad * 0.001;
    return p - m * 1e-3 / (v2.sqrt() + 1e-8);
  };
  for (auto [fused, unfused] : {std::pair{gelu(x), gelu(x)}, std::pair{adam(x, g), adam(x, g)}}) {
    eval({fused});
    eval({unfused}, EvalOptions{.fusion = false});
    EXPECT_EQ(fused.to_vector<float>(), unfused.to_vector<float>());
  }
}

// Integer max and min start from their type's extremes: found by `lazyfuse fuzz` on the H200,
// where the int32 min of positive values was -1 (the int64 identity converted to int32).
TEST_F(Cuda, IntegerMaxAndMinOfEveryWidth) {
  std::vector<double> v = {5, 7, 3, 9, 4, 6};
  for (DType dtype : {kInt32, kInt64}) {
    for (double sign : {1.0, -1.0}) {
      std::vector<double> values = v;
      for (double& x : values) x *= sign;
      Tensor c = from_vector(values, {2, 3}, dtype), g = c.to("cuda");
      EXPECT_EQ(g.min(1, true).to_vector<double>(), c.min(1, true).to_vector<double>());
      EXPECT_EQ(g.max(1).to_vector<double>(), c.max(1).to_vector<double>());
      EXPECT_EQ(g.min().item<double>(), c.min().item<double>());
      EXPECT_EQ(g.max().item<double>(), c.max().item<double>());
    }
  }
}

// One expression evaluated again and again (its schedule and launch plan remembered) over
// operands whose layout changes between evaluations: contiguous, transposed, misaligned by one
// element, and back; each result is the CPU's.
TEST_F(Cuda, RepeatedExpressionFollowsItsOperandsLayouts) {
  std::vector<double> v = random_values(64 * 65, -1, 1, 16), w = random_values(64 * 64, -1, 1, 17);
  Tensor base_cpu = from_vector(v, {64, 65}), y_cpu = from_vector(w, {64, 64});
  Tensor base = base_cpu.to("cuda"), y = y_cpu.to("cuda");
  std::vector<std::pair<Tensor, Tensor>> operands = {
      {base.narrow(1, 0, 64).contiguous(), base_cpu.narrow(1, 0, 64).contiguous()},
      {base.narrow(1, 0, 64).contiguous().t(), base_cpu.narrow(1, 0, 64).contiguous().t()},
      {base.narrow(1, 1, 64), base_cpu.narrow(1, 1, 64)},
      {base.narrow(1, 0, 64), base_cpu.narrow(1, 0, 64)},
      {base.narrow(1, 0, 64).contiguous(), base_cpu.narrow(1, 0, 64).contiguous()}};
  for (auto& [x, x_cpu] : operands) eval({x, x_cpu});
  for (int round = 0; round < 2; ++round) {
    for (const auto& [x, x_cpu] : operands) {
      expect_close(((x + 2).exp() * y).to_vector<double>(),
                   ((x_cpu + 2).exp() * y_cpu).to_vector<double>(), 1e-6, 1e-6);
    }
    cuda::clear_memory_kernel_cache();  // remembered kernels are found again
  }
}

// 1 / x is emitted as a correctly rounded reciprocal: the division's bits, edge cases included.
TEST_F(Cuda, ReciprocalGivesTheDivisionsBits) {
  std::vector<double> v = {1.0, -3.0,  0.1,       7e-39,    -1e-45,    3e38, -0.0,
                           0.0, 1e-30, 12345.678, INFINITY, -INFINITY, 0.75, 2.5e-38};
  for (double x : random_values(1000, -100, 100, 18)) v.push_back(x);
  for (DType dtype : {kFloat32, kFloat64, kFloat16}) {
    SCOPED_TRACE(dtype_ir_name(dtype));
    Tensor c = from_vector(v, {static_cast<int64_t>(v.size())}, dtype);
    Tensor g = c.to("cuda");
    EXPECT_EQ((1 / g).to_vector<double>(), (1 / c).to_vector<double>());
    EXPECT_EQ((1.0 / (g * 2 + 1)).to_vector<double>(), (1.0 / (c * 2 + 1)).to_vector<double>());
  }
}

// Floats past an integer type's range to its extremes, NaN to 0, as on the CPU. (The GPU's own
// conversions disagree on NaN: 0 from float32 to int32, the minimum for the other widths.)
TEST_F(Cuda, FloatToIntegerCastsSaturate) {
  const std::vector<double> v = {NAN, INFINITY, -INFINITY, 3e9, -3e9, 1e19, -1e19, 2.5, -2.5};
  const std::vector<int64_t> int32_want = {0,         INT32_MAX, INT32_MIN, INT32_MAX, INT32_MIN,
                                           INT32_MAX, INT32_MIN, 2,         -2};
  const std::vector<int64_t> int64_want = {0,         INT64_MAX, INT64_MIN, 3000000000, -3000000000,
                                           INT64_MAX, INT64_MIN, 2,         -2};
  for (DType dtype : {kFloat32, kFloat64}) {
    SCOPED_TRACE(dtype_ir_name(dtype));
    Tensor g = from_vector(v, {static_cast<int64_t>(v.size())}, dtype).to("cuda");
    EXPECT_EQ(g.to(kInt32).to_vector<int64_t>(), int32_want);
    EXPECT_EQ((g * 1).to(kInt64).to_vector<int64_t>(), int64_want);
  }
}

// Rounding float32 to float16 and bfloat16 on the GPU gives the CPU's bits (codegen/half.h),
// NaN aside (a NaN need only stay a NaN): float32 values spread over every exponent, every
// float32 in [1, 1.0156) (each tie of both types there), the float16 subnormal range, and the
// infinities and the largest finite values.
// Half-type chains kept in float32 until stored (rounding at stores) on the GPU: the CPU's
// values within a rounding of the dtype (the sine's last float32 bits differ), and 2048 + 1 -
// 2048 is 1.
TEST_F(Cuda, HalfChainsKeepFloat32UntilStoredAsOnTheCpu) {
  HalfRoundingGuard at_stores(HalfRounding::AtStores);
  std::vector<double> v = random_values(40000, -4, 4, 30);
  v[0] = 2048;
  for (DType half : {kFloat16, kBFloat16}) {
    SCOPED_TRACE(dtype_torch_name(half));
    Tensor cpu = from_vector(v, {40000}, half);
    Tensor gpu = cpu.to("cuda");
    auto chain = [](const Tensor& t) {
      return ((t + 1) - t) + ((t + 0.5) * t).sin() + t.relu().sqrt();
    };
    const std::vector<double> want = chain(cpu).to_vector<double>();
    const std::vector<double> got = chain(gpu).to_vector<double>();
    // At 2048 the sum is 1 + sin(4195328) + 45.25..., not the 0 + ... of rounding each op.
    EXPECT_NEAR(got[0], 1 + std::sin(2048.5 * 2048) + std::sqrt(2048.0), 0.25);
    expect_close(got, want, half == kFloat16 ? 2e-3 : 1.6e-2, 2e-3);
    // A comparison reads a half value as stored, and an argmax (a row kernel keeping the
    // products) finds the stored maximum's first position.
    Tensor tripled = gpu * 3;
    const std::vector<double> equal = (tripled == tripled.to(kFloat32)).to_vector<double>();
    EXPECT_EQ(std::count(equal.begin(), equal.end(), 1.0), static_cast<int64_t>(equal.size()));
    Tensor rows = gpu.reshape({100, 400});
    Tensor products = rows * (rows + 0.25);
    const std::vector<int64_t> positions = argmax(products, 1).to_vector<int64_t>();
    const std::vector<double> stored = products.to_vector<double>();
    for (int64_t r = 0; r < 100; ++r)
      EXPECT_EQ(positions[static_cast<size_t>(r)],
                std::max_element(stored.begin() + r * 400, stored.begin() + (r + 1) * 400) -
                    (stored.begin() + r * 400))
          << "row " << r;
  }
}

TEST_F(Cuda, HalfRoundingMatchesTheCpuBitForBit) {
  std::vector<double> v;
  auto add_bits = [&v](uint32_t bits) { v.push_back(std::bit_cast<float>(bits)); };
  for (uint64_t bits = 0; bits < (uint64_t{1} << 32); bits += 65521) add_bits(bits);
  for (uint32_t bits = 0x3f800000u; bits < 0x3f820000u; ++bits) add_bits(bits);
  for (uint32_t bits = 0x33000000u; bits < 0x38800000u; bits += 4099) add_bits(bits);
  for (double x : {65504.0, 65519.0, 65520.0, 3.3895313892515355e38, 3.4028234663852886e38,
                   double(INFINITY), -double(INFINITY), double(NAN), 0.0, -0.0})
    v.push_back(x);
  const auto n = static_cast<int64_t>(v.size());
  Tensor cpu = from_vector(v, {n}, kFloat32);
  Tensor gpu = cpu.to("cuda");
  for (DType half : {kFloat16, kBFloat16}) {
    SCOPED_TRACE(dtype_torch_name(half));
    const std::vector<double> want = cpu.to(half).to_vector<double>();
    const std::vector<double> got = gpu.to(half).to_vector<double>();
    ASSERT_EQ(got.size(), want.size());
    int64_t mismatches = 0;
    for (int64_t i = 0; i < n; ++i) {
      const bool same = std::isnan(want[i])
                            ? std::isnan(got[i])
                            : got[i] == want[i] && std::signbit(got[i]) == std::signbit(want[i]);
      if (!same && ++mismatches <= 5)
        ADD_FAILURE() << "float32 " << v[i] << ": GPU " << got[i] << ", CPU " << want[i];
    }
    EXPECT_EQ(mismatches, 0);
  }
}

// Several threads evaluating their own graphs on the GPUs at once (spread over every GPU
// there is), each with kernels of its own; every result exact.
TEST_F(Cuda, ThreadsEvaluatingTheirOwnGraphsAtOnce) {
  constexpr int kThreads = 4;
  const int gpus = cuda::device_count();
  std::vector<std::vector<float>> results(kThreads);
  std::vector<std::thread> threads;
  for (int k = 0; k < kThreads; ++k) {
    threads.emplace_back([k, gpus, &results] {
      const Device gpu(DeviceType::CUDA, k % gpus);
      Tensor x = arange(0, 1000, 1, gpu).to(kFloat32);
      Tensor acc = x;
      for (int round = 0; round < 20; ++round) {
        for (int i = 0; i < 10; ++i) acc = acc + (x * 0 + (k + 1));
        eval(acc);
      }
      results[k] = acc.to_vector<float>();
    });
  }
  for (std::thread& t : threads) t.join();
  for (int k = 0; k < kThreads; ++k) {
    ASSERT_EQ(results[k].size(), 1000u);
    for (int i = 0; i < 1000; ++i)
      ASSERT_EQ(results[k][i], static_cast<float>(i + 200 * (k + 1)))
          << "thread " << k << " [" << i << "]";
  }
}

// cuBLAS reads operands where they lie when it can (row-major or transposed matrices, batches
// one stride apart or broadcast) and stages the rest: every layout against the CPU, in `dtypes`.
// Before each product a buffer of the result's size is filled with NaN and freed, so that the
// caching allocator hands that memory to the product: an element the gemm failed to write
// would show.
void expect_matmul_layouts_match_the_cpu(std::initializer_list<DType> dtypes) {
  const std::vector<double> values = random_values(2 * 3 * 24 * 24, -1, 1, 21);
  // Operands as [rows, cols] (or batched) views of one [2, 3, 24, 24] base, each a layout.
  using View = std::function<Tensor(const Tensor&)>;
  auto matrix = [](const Tensor& t, int64_t i) {
    return t.reshape({6, 24, 24}).narrow(0, i, 1).squeeze(0);
  };
  const std::vector<std::pair<std::string, View>> layouts = {
      {"contiguous", [&](const Tensor& t) { return matrix(t, 0); }},
      {"transposed", [&](const Tensor& t) { return matrix(t, 1).t(); }},
      {"a window of rows and cols (ld > cols)",
       [&](const Tensor& t) { return matrix(t, 2).narrow(0, 2, 20).narrow(1, 3, 20); }},
      {"a transposed window",
       [&](const Tensor& t) { return matrix(t, 3).narrow(0, 1, 20).narrow(1, 4, 20).t(); }},
      {"batched",
       [](const Tensor& t) {
         return t.reshape({6, 24, 24});
       }},
      {"batched transposed",
       [](const Tensor& t) {
         return t.reshape({6, 24, 24}).transpose(1, 2);
       }},
      {"batch dims permuted (staged)",
       [](const Tensor& t) {
         return t.permute({1, 0, 2, 3});
       }},
      {"rows broadcast (staged)",
       [](const Tensor& t) {
         return t.reshape({-1}).narrow(0, 5, 24).unsqueeze(0).expand({24, 24});
       }},
  };
  for (DType dtype : dtypes) {
    Tensor base = from_vector(values, {2, 3, 24, 24}, kFloat64);
    if (dtype == kInt64) base = base * 10;
    base = base.to(dtype);
    eval(base);
    Tensor gpu_base = base.to("cuda");
    const double tolerance = dtype == kBFloat16 || dtype == kFloat16 ? 2e-2 : 1e-4;
    for (const auto& [a_name, a_view] : layouts)
      for (const auto& [b_name, b_view] : layouts) {
        Tensor ca = a_view(base), cb = b_view(base);
        const Shape batch_a(ca.sizes().begin(), ca.sizes().end() - 2),
            batch_b(cb.sizes().begin(), cb.sizes().end() - 2);
        if (!batch_a.empty() && !batch_b.empty() && batch_a != batch_b) continue;
        if (ca.size(-1) != cb.size(-2)) continue;
        SCOPED_TRACE(std::string(dtype_torch_name(dtype)) + ": " + a_name + " x " + b_name);
        Tensor want = matmul(ca, cb);
        eval(full(want.sizes(), NAN,
                  TensorOptions(is_integral(dtype) ? kFloat64 : dtype).device("cuda")));
        expect_close(matmul(a_view(gpu_base), b_view(gpu_base)).to(kFloat64).to_vector<double>(),
                     want.to(kFloat64).to_vector<double>(), tolerance, tolerance);
      }
  }
}

TEST_F(Cuda, MatmulReadsEveryOperandLayout) {
  expect_matmul_layouts_match_the_cpu({kFloat32, kFloat64, kInt64});
  BlasBackendGuard blas(cuda::BlasBackend::Cublaslt);
  expect_matmul_layouts_match_the_cpu({kFloat32});
}

// Apart from the others for compute-sanitizer's initcheck, which reports the reads that follow
// cuBLAS's half-precision gemms on an H200 as uninitialized although the values are checked
// here, NaN-filled memory underneath (scripts/gpu-check.sh leaves this test out of initcheck
// only; docs/gpu-results.md).
TEST_F(Cuda, HalfMatmulReadsEveryOperandLayout) {
  expect_matmul_layouts_match_the_cpu({kBFloat16, kFloat16});
  BlasBackendGuard blas(cuda::BlasBackend::Cublaslt);
  expect_matmul_layouts_match_the_cpu({kBFloat16, kFloat16});
}

TEST_F(Cuda, MatmulMatchesTheCpu) {
  std::vector<double> a = random_values(3 * 40 * 50, -1, 1, 11),
                      b = random_values(50 * 30, -1, 1, 12);
  for (DType dtype : {kFloat32, kFloat64, kInt64}) {
    Tensor ca = from_vector(a, {3, 40, 50}, dtype), cb = from_vector(b, {50, 30}, dtype);
    if (dtype == kInt64) {
      ca = (ca * 10).to(kInt64);
      cb = (cb * 10).to(kInt64);
    }
    Tensor ga = ca.to("cuda"), gb = cb.to("cuda");
    expect_close(matmul(ga, gb).to_vector<double>(), matmul(ca, cb).to_vector<double>(), 1e-4,
                 1e-4);
    expect_close(matmul(ga.narrow(0, 1, 1).squeeze(0).t(), ga.narrow(0, 0, 1).squeeze(0))
                     .to_vector<double>(),
                 matmul(ca.narrow(0, 1, 1).squeeze(0).t(), ca.narrow(0, 0, 1).squeeze(0))
                     .to_vector<double>(),
                 1e-4, 1e-4);
  }
  manual_seed(0);
  nn::Sequential net(nn::Linear(3, 1));
  Tensor x = tensor({1.0, 2.0, 3.0});
  std::vector<double> on_cpu = net(x).to_vector<double>();
  net.to(Device("cuda"));
  Tensor y = net(x.to("cuda"));
  EXPECT_EQ(y.device(), Device("cuda:0"));
  expect_close(y.to_vector<double>(), on_cpu, 1e-6, 1e-6);
}

TEST_F(Cuda, MoreThanTwoToTheThirtyOneElements) {
  // 17 GB of int64 in memory: loads, stores and index math past 2^31 take the 64-bit path, and
  // integers make every expected value exact.
  const int64_t n = (int64_t{1} << 31) + 5;
  Tensor x = arange(0, n, 1, Device("cuda"));
  eval(x);
  EXPECT_EQ((x + 1).narrow(0, n - 3, 3).to_vector<int64_t>(),
            (std::vector<int64_t>{n - 2, n - 1, n}));
  // A fused reduction over all of it.
  EXPECT_EQ((x * 0 + 2).sum().item<int64_t>(), 2 * n);
  EXPECT_EQ((x - x + 1).sum().item<int64_t>(), n);
}

}  // namespace
}  // namespace lazyfuse

namespace lazyfuse {
namespace {

// Row steps with row values (LayerNorm's and RMSNorm's rsqrt, log-softmax's log of the sum,
// cross-entropy with its gradient: one row kernel each) and a sum over the batch with the work
// before it (a ReLU's mask of a gradient, stored, of several chunks per column), against the
// CPU; rows of 1024 take the row kernel's vectorized path, rows of 1000 the plain one.
TEST_F(Cuda, RowAndColumnStepsWithFusedWorkMatchTheCpu) {
  std::vector<double> classes = random_values(64, 0, 9.99, 84);
  for (double& c : classes) c = std::floor(c);
  const Tensor labels_values = from_vector(classes, {64});
  for (int64_t columns : {1000, 1024}) {
    SCOPED_TRACE(columns);
    Tensor x = from_vector(random_values(37 * columns, -2, 2, 81), {37, columns});
    Tensor w = from_vector(random_values(columns, -1, 1, 82), {columns});
    Tensor b = from_vector(random_values(columns, -1, 1, 85), {columns});
    Tensor logits = from_vector(random_values(64 * 10, -3, 3, 83), {64, 10});
    Tensor labels = labels_values.to(kInt64);
    Tensor h = from_vector(random_values(3000 * 100, -1, 1, 86), {3000, 100});
    Tensor g = from_vector(random_values(3000 * 100, -1, 1, 87), {3000, 100});
    auto outputs = [&](Tensor x, Tensor w, Tensor b, Tensor logits, Tensor labels, Tensor h,
                       Tensor g) {
      logits = logits.detach().requires_grad_();
      Tensor loss = nn::functional::cross_entropy(logits, labels);
      Tensor masked = where(h > 0, g, 0.0);
      return std::vector<Tensor>{nn::functional::layer_norm(x, {columns}, w, b, 1e-5),
                                 x * ((x * x).mean({1}, true) + 1e-6).rsqrt() * w,
                                 log_softmax(x, 1),
                                 loss,
                                 grad({loss}, {logits})[0],
                                 masked,
                                 masked.sum({0})};
    };
    const std::vector<Tensor> want = outputs(x, w, b, logits, labels, h, g);
    const std::vector<Tensor> got =
        outputs(x.to("cuda"), w.to("cuda"), b.to("cuda"), logits.to("cuda"), labels.to("cuda"),
                h.to("cuda"), g.to("cuda"));
    eval(got);
    for (size_t k = 0; k < got.size(); ++k) {
      SCOPED_TRACE(k);
      expect_close(got[k].to_vector<double>(), want[k].to_vector<double>(), 1e-5, 1e-4);
    }
    // A norm alone is one kernel on the GPU too.
    Tensor gx = x.to("cuda"), gw = w.to("cuda"), gb = b.to("cuda");
    eval({gx, gw, gb});
    Tensor norm = nn::functional::layer_norm(gx, {columns}, gw, gb, 1e-5);
    reset_eval_stats();
    eval({norm});
    EXPECT_EQ(eval_stats().kernels, 1);
  }
}

// Rounding half values only at stores (the default), a bfloat16 LayerNorm and softmax keep their
// mean, centred values and sums in float32 inside the row kernel, as the CPU keeps them between
// its parts (OpsReduction.HalfNormsRoundOnlyWhereStored): every result within about half a unit
// in the last place of float64's (a LayerNorm's near zero within float32's error in the terms
// that cancel there), on rows a warp takes and rows a block takes.
TEST_F(Cuda, HalfNormsRoundOnlyWhereStoredAsOnTheCpu) {
  HalfRoundingGuard at_stores(HalfRounding::AtStores);
  for (int64_t columns : {1000, 4096}) {
    SCOPED_TRACE(columns);
    const int64_t rows = 29;
    const Tensor x =
        from_vector(random_values(rows * columns, -2, 3, 95), {rows, columns}).to(kBFloat16);
    const Tensor w = from_vector(random_values(columns, 0.5, 1.5, 96), {columns}).to(kBFloat16);
    const Tensor b = from_vector(random_values(columns, -1, 1, 97), {columns}).to(kBFloat16);
    const std::vector<double> norm = reference::host_layer_norm_rows(x.to_vector<double>(), columns,
                                                                     w.to_vector<double>(),
                                                                     b.to_vector<double>(), 1e-5),
                              soft = reference::host_softmax_rows(x.to_vector<double>(), columns);
    auto units = [](const Tensor& t, const std::vector<double>& want) {
      return reference::bfloat16_ulp_errors(t.to_vector<double>(), want);
    };
    const Tensor gx = x.to("cuda"), gw = w.to("cuda"), gb = b.to("cuda");
    const Tensor got_norm = nn::functional::layer_norm(gx, {columns}, gw, gb, 1e-5);
    const auto [norm_largest, norm_mean] = units(got_norm, norm);
    EXPECT_LE(norm_mean, 0.3);
    // Each result within a unit of its own, or, where the bias cancels the normalized value to
    // near zero, within what float32 statistics leave in the terms before they cancel (the GPU
    // sums half values in float32, as PyTorch does): 16 float32 units of |x̂ w| + |b|.
    const std::vector<double> xs = x.to_vector<double>(), ws = w.to_vector<double>(),
                              bs = b.to_vector<double>(), got = got_norm.to_vector<double>();
    int64_t outside = 0;
    for (int64_t r = 0; r < rows; ++r) {
      double mean = 0, var = 0;
      for (int64_t c = 0; c < columns; ++c) mean += xs[r * columns + c] / columns;
      for (int64_t c = 0; c < columns; ++c)
        var += (xs[r * columns + c] - mean) * (xs[r * columns + c] - mean) / columns;
      for (int64_t c = 0; c < columns; ++c) {
        const int64_t i = r * columns + c;
        const double terms =
            std::fabs((xs[i] - mean) / std::sqrt(var + 1e-5) * ws[c]) + std::fabs(bs[c]);
        outside += std::fabs(got[i] - norm[i]) >
                   reference::bfloat16_unit(norm[i]) + 16 * std::ldexp(terms, -24);
      }
    }
    EXPECT_EQ(outside, 0) << "largest error " << norm_largest << " units";
    const auto [soft_largest, soft_mean] = units(softmax(gx, 1), soft);
    EXPECT_LE(soft_largest, 1.0);
    EXPECT_LE(soft_mean, 0.3);
  }
}

// Rows a block shares (float32 rows longer than 512: 3000 unvectorized, 4096 in registers,
// 20000 reread from memory by 32 warps) and half-precision rows read 16 bytes a lane (bfloat16
// rows of 1024; rows of 128 four elements a lane): LayerNorm, RMSNorm, softmax, log-softmax,
// and sums and means of squares (read in vectors), one kernel each, against the CPU computing
// the same in float32 from the same rounded inputs.
TEST_F(Cuda, LongAndHalfPrecisionRowsMatchTheCpu) {
  struct Case {
    DType dtype;
    int64_t columns;
  };
  for (const Case& c :
       {Case{kFloat32, 3000}, Case{kFloat32, 4096}, Case{kFloat32, 20000}, Case{kBFloat16, 128},
        Case{kBFloat16, 1024}, Case{kBFloat16, 4096}, Case{kFloat16, 4096}}) {
    SCOPED_TRACE(std::string(dtype_ir_name(c.dtype)) + " rows of " + std::to_string(c.columns));
    const int64_t rows = 19;
    Tensor x =
        from_vector(random_values(rows * c.columns, -2, 2, 91), {rows, c.columns}).to(c.dtype);
    Tensor w = from_vector(random_values(c.columns, -1, 1, 92), {c.columns}).to(c.dtype);
    Tensor b = from_vector(random_values(c.columns, -1, 1, 93), {c.columns}).to(c.dtype);
    auto norms = [&](Tensor x, Tensor w, Tensor b) {
      return std::vector<Tensor>{nn::functional::layer_norm(x, {c.columns}, w, b, 1e-5),
                                 x * ((x * x).mean({1}, true) + 1e-6).rsqrt() * w,
                                 softmax(x, 1),
                                 log_softmax(x, 1),
                                 (x * x).sum({1}),
                                 (x * x).mean()};
    };
    const std::vector<Tensor> want = norms(x.to(kFloat32), w.to(kFloat32), b.to(kFloat32));
    Tensor gx = x.to("cuda"), gw = w.to("cuda"), gb = b.to("cuda");
    eval({gx, gw, gb});
    const std::vector<Tensor> got = norms(gx, gw, gb);
    for (size_t k = 0; k < got.size(); ++k) {
      SCOPED_TRACE(k);
      reset_eval_stats();
      eval({got[k]});
      EXPECT_EQ(eval_stats().kernels, 1);
      const double tolerance = c.dtype == kFloat32 ? 1e-4 : 3e-2;
      expect_close(got[k].to_vector<double>(), want[k].to_vector<double>(), tolerance, tolerance);
    }
  }
}

}  // namespace
}  // namespace lazyfuse
