// The CPU's own float32 vector exp, tanh and sigmoid (Note [Float exp and tanh] in
// codegen/cpu/cpu_math.h) against libm's float64 results, through every kernel table the machine
// can run. By default a spread of every 251st float32 bit pattern, both signs, and the inputs
// where the methods change; LAZYFUSE_EXHAUSTIVE=1 checks all 2^32 (about eight minutes on one
// core).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "lazyfuse/codegen/cpu/cpu_kernels.h"

namespace lazyfuse {
namespace {

float from_bits(uint32_t bits) {
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

// |got - want| in units in the last place of float32 at `want`. Where want lies beyond
// float32's range, only the rounded result (infinity, or the largest float) is right.
double ulps_off(float got, double want) {
  if (std::isnan(want)) return std::isnan(got) ? 0 : INFINITY;
  if (std::isnan(got)) return INFINITY;
  // tanh(-0) is -0: a zero's sign counts.
  if (want == 0 && got == 0) return std::signbit(want) == std::signbit(got) ? 0 : INFINITY;
  const double largest = std::numeric_limits<float>::max();
  if (std::fabs(want) > largest) return got == static_cast<float>(want) ? 0 : INFINITY;
  const double magnitude = std::fabs(want);
  // The spacing of float32 at `want`: 2^(e - 23) for want in [2^e, 2^(e+1)), never below the
  // subnormals'.
  const int exponent = std::max(std::ilogb(magnitude), -126);
  const double ulp = magnitude == 0 ? std::ldexp(1.0, -149) : std::ldexp(1.0, exponent - 23);
  return std::fabs(static_cast<double>(got) - want) / ulp;
}

struct Function {
  const char* name;
  Op op;
  std::function<double(double)> reference;
  double max_ulps;
};

struct Worst {
  double ulps = 0;
  float at = 0;
};

// Applies `table`'s float32 kernel of `function.op` to `inputs` and returns the worst error.
Worst worst_error(const CpuKernelTable& table, const Function& function,
                  const std::vector<float>& inputs) {
  const int64_t n = static_cast<int64_t>(inputs.size()) - kCpuVectorPad;
  std::vector<float> out(inputs.size());
  const void* args[3] = {inputs.data(), inputs.data(), inputs.data()};
  table.apply[static_cast<int>(function.op)][3](args, out.data(), n);
  Worst worst;
  for (int64_t i = 0; i < n; ++i) {
    const double error = ulps_off(out[i], function.reference(inputs[i]));
    if (error > worst.ulps || std::isnan(error)) worst = {error, inputs[i]};
  }
  return worst;
}

TEST(CpuMath, FloatExpTanhAndSigmoidAreWithinTheirUlpsOfLibm) {
  const std::vector<const CpuKernelTable*> tables = cpu_vector_kernel_tables();
  if (tables.empty()) GTEST_SKIP() << "no vector instruction set on this CPU";
  const char* exhaustive = std::getenv("LAZYFUSE_EXHAUSTIVE");
  const uint64_t stride = exhaustive != nullptr && std::string(exhaustive) == "1" ? 1 : 251;

  // Where the methods change or saturate, and what every function must get right.
  const std::vector<float> edges = {0.0f,
                                    -0.0f,
                                    1.0f,
                                    -1.0f,
                                    std::nextafter(1.0f, 0.0f),
                                    9.0f,
                                    9.5f,
                                    9.02f,
                                    88.72f,
                                    88.73f,
                                    89.0f,
                                    -87.33f,
                                    -103.97f,
                                    -104.0f,
                                    -150.0f,
                                    1e-30f,
                                    -1e-30f,
                                    std::numeric_limits<float>::denorm_min(),
                                    std::numeric_limits<float>::infinity(),
                                    -std::numeric_limits<float>::infinity(),
                                    std::numeric_limits<float>::quiet_NaN(),
                                    std::numeric_limits<float>::max(),
                                    -std::numeric_limits<float>::max()};

  const std::vector<Function> functions = {
      {"exp", Op::Exp, [](double x) { return std::exp(x); }, 1.0},
      {"tanh", Op::Tanh, [](double x) { return std::tanh(x); }, 1.0},
      // 1 / (1 + exp(-x)): exp's error, then a rounded add and a rounded division (2.26 ulp at
      // worst, as with SLEEF's exp in its place). Below
      // -88.72, exp(-x) is past float32's range and the result 0, as in the scalar form and
      // PyTorch's: the true value there is subnormal.
      {"sigmoid", Op::Sigmoid,
       [](double x) {
         const double e = std::exp(-x);
         return e > std::numeric_limits<float>::max() ? 0.0 : 1 / (1 + e);
       },
       2.5},
  };
  for (const CpuKernelTable* table : tables) {
    SCOPED_TRACE(table->isa);
    for (const Function& function : functions) {
      SCOPED_TRACE(function.name);
      Worst worst;
      constexpr uint64_t kChunk = 1 << 20;
      std::vector<float> inputs;
      inputs.reserve(kChunk + kCpuVectorPad);
      auto flush = [&] {
        inputs.resize(inputs.size() + kCpuVectorPad, 0.0f);
        Worst chunk = worst_error(*table, function, inputs);
        if (chunk.ulps > worst.ulps || std::isnan(chunk.ulps)) worst = chunk;
        inputs.clear();
      };
      inputs.insert(inputs.end(), edges.begin(), edges.end());
      for (uint64_t bits = 0; bits < (uint64_t{1} << 32); bits += stride) {
        inputs.push_back(from_bits(static_cast<uint32_t>(bits)));
        if (inputs.size() == kChunk) flush();
      }
      flush();
      EXPECT_LE(worst.ulps, function.max_ulps)
          << "at " << worst.at << " (" << std::hexfloat << worst.at << ")";
      std::cout << "[ CPUMATH  ] " << table->isa << " " << function.name << ": max " << worst.ulps
                << " ulp" << std::endl;
    }
  }
}

}  // namespace
}  // namespace lazyfuse
