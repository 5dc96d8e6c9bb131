// Fast math (LAZYFUSE_FAST_MATH=1): opt-in hardware approximations for float32 exp, log, sin,
// cos and tanh on the GPU. Without a GPU: the generated source differs only by
// `#define LF_FAST_MATH 1`, which switches the prologue to the intrinsics, and both variants
// compile with NVRTC. With a GPU: the error of each function, fast and accurate, against a
// float64 reference computed here stays within the documented bounds below.
//
// Bounds (also in docs/design.md, "Fast math"). ulp(r) is the spacing of float32 numbers at the
// reference r; documented ulp bounds are against the correctly rounded result, so each gets half
// an ulp more against the exact reference.
//   CUDA C++ Programming Guide, Mathematical Functions appendix, "Intrinsic Functions" table
//   (Single-Precision Floating-Point Intrinsic Functions):
//     __expf(x): max ulp error 2 + floor(abs(1.173 * x)).
//     __logf(x): for x in [0.5, 2] max absolute error 2^-21.41, otherwise max ulp error 3.
//     __sinf(x): for x in [-pi, pi] max absolute error 2^-21.41 (larger otherwise).
//     __cosf(x): for x in [-pi, pi] max absolute error 2^-21.19 (larger otherwise).
//   PTX ISA, "Floating Point Instructions: tanh": tanh.approx.f32 max relative error 2^-10.987
//     (measured far lower, about 1.1e-5 ~ 2^-16.5: NVIDIA developer forums, "Hardware-accelerated
//     tanh() on Turing").
//   The accurate functions, from the Programming Guide's "Single-Precision Mathematical Standard
//   Library Functions with Maximum ULP Error" table: expf 2, logf 1, sinf 2, cosf 2, tanhf 2.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <lazyfuse/lazyfuse.h>

#include "lazyfuse/codegen/cuda/cuda_codegen.h"
#include "lazyfuse/codegen/cuda/nvrtc.h"
#include "lazyfuse/ir/passes/passes.h"
#include "lazyfuse/runtime/env.h"

namespace lazyfuse {
namespace {

constexpr std::string_view kFastDefine = "#define LF_FAST_MATH 1\n";

// One kernel with every function fast math changes, and a reduction that fuses two of them.
const char* kTranscendentals = R"(graph @transcendentals(%0: f32[1000] @cuda:0) {
  %1 = exp %0 : f32[1000] @cuda:0
  %2 = log %1 : f32[1000] @cuda:0
  %3 = sin %2 : f32[1000] @cuda:0
  %4 = cos %3 : f32[1000] @cuda:0
  %5 = tanh %4 : f32[1000] @cuda:0
  return %5
})";
const char* kFusedReduction = R"(graph @sum_of_tanh_exp(%0: f32[1000] @cuda:0) {
  %1 = exp %0 : f32[1000] @cuda:0
  %2 = tanh %1 : f32[1000] @cuda:0
  %3 = sum %2 {dims = [0], keepdim = false} : f32[] @cuda:0
  return %3
})";

CudaElementwiseSpec contiguous_spec(const Step& step) {
  CudaElementwiseSpec spec;
  spec.inputs.assign(step.inputs.size(), OperandAccess::Contiguous);
  return spec;
}

TEST(FastMath, IsOffUnlessTheEnvironmentSaysOne) {
  const char* fast = std::getenv("LAZYFUSE_FAST_MATH");
  EXPECT_EQ(env_config().fast_math, fast != nullptr && std::string_view(fast) == "1");
}

TEST(FastMath, PrologueMapsTheFunctionsToIntrinsics) {
  const std::string& prologue = cuda_prologue();
  const size_t begin = prologue.find("#ifdef LF_FAST_MATH");
  ASSERT_NE(begin, std::string::npos);
  const size_t end = prologue.find("#else", begin);
  ASSERT_NE(end, std::string::npos);
  const std::string fast_block = prologue.substr(begin, end - begin);
  for (const char* intrinsic : {"__expf", "__logf", "__sinf", "__cosf", "tanh.approx.f32"})
    EXPECT_NE(fast_block.find(intrinsic), std::string::npos) << intrinsic;
}

TEST(FastMath, SourceDiffersOnlyByTheDefineAndCompiles) {
  std::vector<std::pair<CudaSource, CudaSource>> variants;  // (accurate, fast)
  int elementwise = 0, fused_reductions = 0;
  for (const char* text : {kTranscendentals, kFusedReduction}) {
    Schedule schedule = run_pipeline(parse_graph(text), {});
    for (const Step& step : schedule.steps) {
      const CudaElementwiseSpec spec = contiguous_spec(step);
      if (step.kind == StepKind::Elementwise) {
        ++elementwise;
        variants.emplace_back(generate_cuda_elementwise(schedule.graph, step, spec, false),
                              generate_cuda_elementwise(schedule.graph, step, spec, true));
      } else if ((step.kind == StepKind::Reduction || step.kind == StepKind::Column) &&
                 step.nodes.size() > 1) {
        ++fused_reductions;
        variants.emplace_back(generate_cuda_fused_reduction(schedule.graph, step, spec, false),
                              generate_cuda_fused_reduction(schedule.graph, step, spec, true));
      }
    }
  }
  EXPECT_EQ(elementwise, 1);
  EXPECT_EQ(fused_reductions, 1);
  for (const auto& [accurate, fast] : variants) {
    SCOPED_TRACE(fast.kernel_name);
    EXPECT_EQ(fast.kernel_name, accurate.kernel_name);
    EXPECT_EQ(accurate.source.find("#define LF_FAST_MATH"), std::string::npos);
    EXPECT_TRUE(fast.source.starts_with(kFastDefine));
    // Nothing else changes, so the cache key (the source's hash) is all that tells them apart.
    EXPECT_EQ(fast.source, std::string(kFastDefine) + accurate.source);
    if (!nvrtc_available()) continue;
    CompiledKernel fast_kernel = nvrtc_compile(fast.source, fast.kernel_name, 9, 0);
    CompiledKernel accurate_kernel = nvrtc_compile(accurate.source, accurate.kernel_name, 9, 0);
    EXPECT_TRUE(fast_kernel.is_cubin);
    EXPECT_NE(fast_kernel.image, accurate_kernel.image) << "the define changed no code";
  }
  if (!nvrtc_available()) GTEST_SKIP() << "sources checked; " << nvrtc_unavailable_reason();
}

// ---- On the GPU ----

class FastMathGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::is_available()) GTEST_SKIP() << "no CUDA GPU";
  }
  // Whatever the environment said comes back after each test.
  void TearDown() override { set_fast_math_for_testing(saved_); }
  bool saved_ = env_config().fast_math;
};

// The spacing of float32 numbers at `r` (subnormal spacing below FLT_MIN).
double ulp32(double r) {
  const double a = std::fabs(r);
  if (a < FLT_MIN) return std::ldexp(1.0, -149);
  return std::ldexp(1.0, std::ilogb(a) - 23);
}

struct Function {
  const char* name;
  Tensor (*apply)(const Tensor&);
  double (*reference)(double);
  double lo, hi;
  bool log_uniform;
  // The largest error allowed at input x for result `got` against reference `want`.
  double (*fast_bound)(double x, double want);
  double accurate_ulps;
};

double fast_exp_bound(double x, double want) {
  return (2 + std::floor(std::fabs(1.173 * x)) + 0.5) * ulp32(want);
}
double fast_log_bound(double x, double want) {
  if (x >= 0.5 && x <= 2) return std::exp2(-21.41) + 0.5 * ulp32(want);
  return 3.5 * ulp32(want);
}
double fast_sin_bound(double, double want) { return std::exp2(-21.41) + 0.5 * ulp32(want); }
double fast_cos_bound(double, double want) { return std::exp2(-21.19) + 0.5 * ulp32(want); }
double fast_tanh_bound(double, double want) {
  return std::exp2(-10.987) * std::fabs(want) + 0.5 * ulp32(want);
}

// Just below pi as a float32, so that every input lies in [-pi, pi], where the bounds hold.
constexpr double kPiBelow = 3.1415925;

const Function kFunctions[] = {
    {"exp", [](const Tensor& t) { return t.exp(); }, [](double x) { return std::exp(x); }, -10, 10,
     false, fast_exp_bound, 2},
    {"log", [](const Tensor& t) { return t.log(); }, [](double x) { return std::log(x); }, 1e-3,
     1e3, true, fast_log_bound, 1},
    {"sin", [](const Tensor& t) { return t.sin(); }, [](double x) { return std::sin(x); },
     -kPiBelow, kPiBelow, false, fast_sin_bound, 2},
    {"cos", [](const Tensor& t) { return t.cos(); }, [](double x) { return std::cos(x); },
     -kPiBelow, kPiBelow, false, fast_cos_bound, 2},
    {"tanh", [](const Tensor& t) { return t.tanh(); }, [](double x) { return std::tanh(x); }, -5, 5,
     false, fast_tanh_bound, 2},
};

TEST_F(FastMathGpu, ErrorsStayWithinTheDocumentedBounds) {
  const int64_t n = int64_t{1} << 20;
  for (const Function& f : kFunctions) {
    SCOPED_TRACE(f.name);
    std::mt19937 rng(1234);
    std::uniform_real_distribution<double> dist(f.log_uniform ? std::log(f.lo) : f.lo,
                                                f.log_uniform ? std::log(f.hi) : f.hi);
    std::vector<double> values(n);
    for (double& v : values) v = f.log_uniform ? std::exp(dist(rng)) : dist(rng);
    values[0] = f.lo;
    values[1] = f.hi;
    Tensor host = from_vector(values, {n}, kFloat32);
    const std::vector<double> xs = host.to_vector<double>();  // as stored in float32
    Tensor device = host.to("cuda");

    set_fast_math_for_testing(false);
    const std::vector<double> accurate = f.apply(device).to_vector<double>();
    set_fast_math_for_testing(true);
    const std::vector<double> fast = f.apply(device).to_vector<double>();

    double worst_accurate_ulps = 0, worst_fast_ratio = 0, worst_fast_abs = 0;
    int64_t differ = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double want = f.reference(xs[i]);
      const double accurate_error = std::fabs(accurate[i] - want);
      const double fast_error = std::fabs(fast[i] - want);
      worst_accurate_ulps = std::max(worst_accurate_ulps, accurate_error / ulp32(want));
      worst_fast_ratio = std::max(worst_fast_ratio, fast_error / f.fast_bound(xs[i], want));
      worst_fast_abs = std::max(worst_fast_abs, fast_error);
      differ += fast[i] != accurate[i];
      ASSERT_LE(accurate_error, (f.accurate_ulps + 0.5) * ulp32(want))
          << "accurate " << f.name << "(" << xs[i] << ") = " << accurate[i] << ", want " << want;
      ASSERT_LE(fast_error, f.fast_bound(xs[i], want))
          << "fast " << f.name << "(" << xs[i] << ") = " << fast[i] << ", want " << want;
    }
    // The knob reached the kernel: the approximations give other bits somewhere.
    EXPECT_GT(differ, 0) << "fast and accurate " << f.name << " agree everywhere";
    std::cout << "[ FASTMATH ] " << f.name << ": accurate max " << worst_accurate_ulps
              << " ulp; fast max abs error " << worst_fast_abs << ", " << worst_fast_ratio
              << " of its bound; " << differ << " of " << n << " results differ\n";
  }
}

}  // namespace
}  // namespace lazyfuse
