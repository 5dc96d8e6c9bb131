// The CPU JIT (codegen/cpu/cpu_jit.cc, Note [The CPU JIT] in codegen/cpu/cpu_program.cc): every op
// it compiles gives the interpreter's bits, over every operand layout it compiles for and the
// elements past the last whole vector; fused chains also match the independent float64
// reference; and it compiles only what the mode asks for.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lazyfuse/codegen/cpu/cpu_jit.h"
#include "lazyfuse/codegen/cpu/cpu_kernels.h"
#include "lazyfuse/codegen/cpu/cpu_program.h"
#include "lazyfuse/lazyfuse.h"
#include "tests/reference/reference.h"

namespace lazyfuse {
namespace {

using namespace reference;

// Sets the JIT's mode for a scope.
class JitModeGuard {
 public:
  explicit JitModeGuard(CpuJitMode mode) : saved_(cpu_jit_mode()) { set_cpu_jit_mode(mode); }
  ~JitModeGuard() { set_cpu_jit_mode(saved_); }

 private:
  CpuJitMode saved_;
};

// Why no program can be compiled here, or "" where one can. A JIT that was built but does not
// load fails the test.
std::string why_no_jit() {
#ifdef LAZYFUSE_CPU_JIT_BUILT
  EXPECT_TRUE(cpu_jit_available()) << cpu_jit_unavailable_reason();
  if (!cpu_jit_available()) return "the CPU JIT did not load";
#else
  return "built without the CPU JIT (LLVM 14 and clang 14)";
#endif
  // LAZYFUSE_CPU_ISA=baseline leaves the JIT no instruction set to compile for.
  if (cpu_jit_lanes(false) == 0) return absl::StrCat("no JIT code for ", cpu_jit_isa());
  return "";
}

// Skips the rest of the test where no program can be compiled. (A helper's GTEST_SKIP would
// return from the helper only.)
#define REQUIRE_JIT() \
  if (const std::string why = why_no_jit(); !why.empty()) GTEST_SKIP() << why

// Evaluates `build()` in the interpreter and then compiled, and expects the same bits (a NaN
// matches any NaN: LLVM may swap a commutative op's operands, and x86 then passes on the other
// operand's NaN, as the fuzzer and the GPU comparisons allow too); returns the compiled result.
// Fails if the JIT did not run where `compiled_expected`, or ran where not.
Tensor expect_jit_matches_interpreter(const std::function<Tensor()>& build, const std::string& what,
                                      bool compiled_expected = true) {
  SCOPED_TRACE(what);
  Tensor interpreted = build();
  {
    JitModeGuard off(CpuJitMode::Off);
    eval(interpreted);
  }
  Tensor compiled = build();
  {
    JitModeGuard always(CpuJitMode::Always);
    reset_cpu_jit_stats();
    eval(compiled);
    const CpuJitStats stats = cpu_jit_stats();
    EXPECT_EQ(stats.failures, 0) << stats.last_failure;
    EXPECT_EQ(stats.runs > 0, compiled_expected) << "runs of compiled code: " << stats.runs;
  }
  std::vector<double> a = interpreted.to_vector<double>(), b = compiled.to_vector<double>();
  EXPECT_EQ(a.size(), b.size());
  int64_t differ = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(double)) != 0 && !(std::isnan(a[i]) && std::isnan(b[i])) &&
        differ++ < 3)
      ADD_FAILURE() << "element " << i << ": interpreted " << a[i] << ", compiled " << b[i];
  EXPECT_EQ(differ, 0) << "elements that differ";
  return compiled;
}

// Values that reach the ops' edges: NaN, infinities, signed zeros, tiny and huge magnitudes,
// mixed with values drawn from [-4, 4].
std::vector<double> edgy_values(std::mt19937& rng, int64_t n) {
  const double special[] = {kNan, kInf, -kInf, 0.0, -0.0, 1e-40, -1e-30, 1e30, 88.5, -104.0};
  std::uniform_real_distribution<double> uniform(-4, 4);
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[static_cast<size_t>(i)] = i % 7 == 3 ? special[(i / 7) % 10] : uniform(rng);
  return v;
}

struct NamedOp {
  const char* name;
  Op op;
  std::function<Tensor(const Tensor&, const Tensor&, const Tensor&)> apply;
};

std::vector<NamedOp> float_ops() {
  using T = const Tensor&;
  return {
      {"add", Op::Add, [](T a, T b, T) { return a + b; }},
      {"sub", Op::Sub, [](T a, T b, T) { return a - b; }},
      {"mul", Op::Mul, [](T a, T b, T) { return a * b; }},
      {"div", Op::Div, [](T a, T b, T) { return a / b; }},
      {"neg", Op::Neg, [](T a, T, T) { return -a; }},
      {"abs", Op::Abs, [](T a, T, T) { return a.abs(); }},
      {"exp", Op::Exp, [](T a, T, T) { return a.exp(); }},
      {"log", Op::Log, [](T a, T, T) { return a.log(); }},
      {"sqrt", Op::Sqrt, [](T a, T, T) { return a.sqrt(); }},
      {"rsqrt", Op::Rsqrt, [](T a, T, T) { return a.rsqrt(); }},
      {"log1p", Op::Log1p, [](T a, T, T) { return a.log1p(); }},
      {"expm1", Op::Expm1, [](T a, T, T) { return a.expm1(); }},
      {"erf", Op::Erf, [](T a, T, T) { return a.erf(); }},
      {"tanh", Op::Tanh, [](T a, T, T) { return a.tanh(); }},
      {"sigmoid", Op::Sigmoid, [](T a, T, T) { return a.sigmoid(); }},
      {"relu", Op::Relu, [](T a, T, T) { return a.relu(); }},
      {"pow", Op::Pow, [](T a, T b, T) { return a.pow(b); }},
      {"maximum", Op::Maximum, [](T a, T b, T) { return maximum(a, b); }},
      {"minimum", Op::Minimum, [](T a, T b, T) { return minimum(a, b); }},
      {"clamp", Op::Clamp, [](T a, T b, T c) { return a.clamp(b, c); }},
  };
}

// Each op, alone and after an op that keeps its result in a register, over operands that are
// dense, a run of a row read by every row (a bias), one value a row (a row's mean) and one value
// for all, in both float types. The elements form whole vectors, and a dense operand of an odd
// length ends in a part vector that the interpreter computes.
TEST(CpuJit, EveryOpGivesTheInterpretersBitsOverEveryLayout) {
  REQUIRE_JIT();
  std::mt19937 rng(7);
  constexpr int64_t kRows = 6, kColumns = 128;
  for (DType dtype : {kFloat32, kFloat64}) {
    const Tensor x = from_vector(edgy_values(rng, kRows * kColumns), {kRows, kColumns}, dtype);
    const Tensor bias = from_vector(edgy_values(rng, kColumns), {kColumns}, dtype);
    const Tensor per_row = from_vector(edgy_values(rng, kRows), {kRows, 1}, dtype);
    const Tensor scalar = from_vector({0.75}, {}, dtype);
    const Tensor odd = from_vector(edgy_values(rng, 1000 + 7), {1000 + 7}, dtype);
    const Tensor odd2 = from_vector(edgy_values(rng, 1000 + 7), {1000 + 7}, dtype);
    eval({x, bias, per_row, scalar, odd, odd2});
    for (const NamedOp& op : float_ops()) {
      const std::string what = std::string(op.name) + " " + dtype_torch_name(dtype);
      // Compiled where the op has a vector form (the interpreter's stream kernel exists exactly
      // then); a program with any other op runs in the interpreter alone.
      const bool vector_form =
          cpu_kernel_table().apply_stream[static_cast<int>(op.op)][compute_slot(dtype)] != nullptr;
      expect_jit_matches_interpreter([&] { return op.apply(x, bias, per_row); },
                                     what + " (x, bias, row)", vector_form);
      expect_jit_matches_interpreter([&] { return op.apply(per_row + x, x, scalar); },
                                     what + " (row, x, scalar)", vector_form);
      expect_jit_matches_interpreter([&] { return op.apply(x.exp() - 1.5, scalar, bias) * x; },
                                     what + " in a chain", vector_form);
      expect_jit_matches_interpreter([&] { return op.apply(odd, odd2, odd2.abs()); },
                                     what + " (odd length)", vector_form);
    }
  }
}

// Float32 programs over bfloat16 and float16 operands and results (converted as loaded, rounded
// to nearest even as stored), with half values rounded where stored or after each op, casts to
// and from float32 in the middle of a chain, and a float32 operand beside a half one: the
// interpreter's bits over every layout, and compiled wherever the ops have vector forms.
TEST(CpuJit, HalfTypesGiveTheInterpretersBits) {
  REQUIRE_JIT();
  std::mt19937 rng(13);
  constexpr int64_t kRows = 6, kColumns = 128;
  for (DType dtype : {DType::BFloat16, DType::Float16}) {
    const Tensor x = from_vector(edgy_values(rng, kRows * kColumns), {kRows, kColumns}, dtype);
    const Tensor bias = from_vector(edgy_values(rng, kColumns), {kColumns}, dtype);
    const Tensor per_row = from_vector(edgy_values(rng, kRows), {kRows, 1}, dtype);
    const Tensor scalar = from_vector({0.75}, {}, dtype);
    const Tensor odd = from_vector(edgy_values(rng, 1000 + 7), {1000 + 7}, dtype);
    const Tensor wide =
        from_vector(edgy_values(rng, kRows * kColumns), {kRows, kColumns}, DType::Float32);
    eval({x, bias, per_row, scalar, odd, wide});
    for (HalfRounding rounding : {HalfRounding::AtStores, HalfRounding::EachOp}) {
      HalfRoundingGuard guard(rounding);
      const std::string mode = rounding == HalfRounding::AtStores ? " at stores" : " each op";
      for (const NamedOp& op : float_ops()) {
        const std::string what = std::string(op.name) + " " + dtype_torch_name(dtype) + mode;
        const bool vector_form =
            cpu_kernel_table().apply_stream[static_cast<int>(op.op)][compute_slot(kFloat32)] !=
            nullptr;
        expect_jit_matches_interpreter([&] { return op.apply(x, bias, per_row); },
                                       what + " (x, bias, row)", vector_form);
        expect_jit_matches_interpreter([&] { return op.apply(per_row + x, x, scalar) * 3; },
                                       what + " (row, x, scalar) in a chain", vector_form);
        expect_jit_matches_interpreter(
            [&] { return op.apply(odd, odd.abs(), odd * 0.5).exp() - odd; }, what + " (odd length)",
            vector_form);
      }
      // A cast to float32 and back, with the float32 value read on; a float32 operand promoting
      // a half one.
      expect_jit_matches_interpreter(
          [&] {
            Tensor f = (x * 1.25).to(kFloat32);
            return ((f.exp() + f).to(dtype) * bias).to(kFloat32) * f;
          },
          std::string("casts ") + dtype_torch_name(dtype) + mode);
      expect_jit_matches_interpreter([&] { return (x + wide).sigmoid() * x; },
                                     std::string("promoted ") + dtype_torch_name(dtype) + mode);
    }
  }
}

// A reduction's fused operand (a sum of squares, a variance's centred squares, a row's max of
// a chain) computed by compiled code in chunks and reduced from there: the interpreter's bits,
// over rows whose length leaves a part vector, and over the whole tensor.
TEST(CpuJit, FusedReductionOperandsGiveTheInterpretersBits) {
  REQUIRE_JIT();
  std::mt19937 rng(5);
  constexpr int64_t kRows = 9, kColumns = 3000 + 5;
  // Half types too: a float32 program over them computes the chunks (its loads converting).
  for (DType dtype : {kFloat32, kFloat64, DType::BFloat16, DType::Float16}) {
    const Tensor x = from_vector(edgy_values(rng, kRows * kColumns), {kRows, kColumns}, dtype);
    const Tensor finite = x.clamp(-50, 50);
    // A row value is compiled for where rows are whole vectors: 2048 columns.
    const Tensor wide = x.narrow(1, 0, 2048).contiguous().clamp(-50, 50);
    const Tensor mean = from_vector(edgy_values(rng, kRows), {kRows, 1}, dtype).clamp(-5, 5);
    eval({x, finite, wide, mean});
    const std::string name = dtype_torch_name(dtype);
    expect_jit_matches_interpreter([&] { return (finite * finite).sum({1}, true); },
                                   "sum of squares over rows " + name);
    expect_jit_matches_interpreter([&] { return ((wide - mean) * (wide - mean)).mean(); },
                                   "centred squares over everything " + name);
    expect_jit_matches_interpreter([&] { return (x.exp() * 0.5 + x).amax({1}, true); },
                                   "max of a chain " + name);
  }
}

// The fused chains of the benchmark's class against the float64 reference: `(z + 2).exp() * y`,
// a LayerNorm's elementwise part over rows (its row values and affine weights), and an Adam
// update with its 0-d bias corrections, each with results the JIT stores.
TEST(CpuJit, FusedChainsMatchTheFloat64Reference) {
  REQUIRE_JIT();
  std::mt19937 rng(11);
  constexpr int64_t kRows = 4, kColumns = 256;
  const Shape shape{kRows, kColumns};
  JitModeGuard always(CpuJitMode::Always);
  for (DType dtype : {kFloat32, kFloat64}) {
    const Tol tol = tol_for(dtype);
    const Host z = random_host(rng, shape, dtype, kWide), y = random_host(rng, shape, dtype, kWide);
    reset_cpu_jit_stats();
    expect_matches(
        (to_tensor(z, dtype) + 2).exp() * to_tensor(y, dtype),
        ref_map({&z, &y}, [](double a, double b, double) { return std::exp(a + 2) * b; }), dtype,
        tol, "exp_mul");
    EXPECT_GT(cpu_jit_stats().runs, 0);

    const Host mean = random_host(rng, {kRows, 1}, dtype, kWide);
    const Host rstd = random_host(rng, {kRows, 1}, dtype, {0.5, 2, 1, 2});
    const Host weight = random_host(rng, {kColumns}, dtype, kWide);
    const Host bias = random_host(rng, {kColumns}, dtype, kWide);
    Host expected{shape, {}};
    for (int64_t r = 0; r < kRows; ++r)
      for (int64_t c = 0; c < kColumns; ++c) {
        const double centred = z.v[r * kColumns + c] - mean.v[r];
        expected.v.push_back(centred * rstd.v[r] * weight.v[c] + bias.v[c]);
      }
    expect_matches((to_tensor(z, dtype) - to_tensor(mean, dtype)) * to_tensor(rstd, dtype) *
                           to_tensor(weight, dtype) +
                       to_tensor(bias, dtype),
                   expected, dtype, {tol.rtol * 4, tol.atol}, "layer norm's elementwise part");

    // Adam's step: m and v updated, the parameter moved by the corrected ratio.
    const Host p = random_host(rng, shape, dtype, kWide), g = random_host(rng, shape, dtype, kWide);
    const Host m = random_host(rng, shape, dtype, kWide);
    const Host v = random_host(rng, shape, dtype, {0, 2, 0, 2});
    const double b1 = 0.9, b2 = 0.999, lr = 1e-3, eps = 1e-8, c1 = 1 - 0.9 * 0.9,
                 c2 = 1 - 0.999 * 0.999;
    Tensor tm = to_tensor(m, dtype) * b1 + to_tensor(g, dtype) * (1 - b1);
    Tensor tv = to_tensor(v, dtype) * b2 + to_tensor(g, dtype) * to_tensor(g, dtype) * (1 - b2);
    Tensor c1t = from_vector({c1}, {}, dtype), c2t = from_vector({c2}, {}, dtype);
    Tensor tp = to_tensor(p, dtype) - (tm / c1t) / ((tv / c2t).sqrt() + eps) * lr;
    eval({tm, tv, tp});
    Host want_p{shape, {}};
    for (size_t i = 0; i < p.v.size(); ++i) {
      const double mi = m.v[i] * b1 + g.v[i] * (1 - b1);
      const double vi = v.v[i] * b2 + g.v[i] * g.v[i] * (1 - b2);
      want_p.v.push_back(p.v[i] - (mi / c1) / (std::sqrt(vi / c2) + eps) * lr);
    }
    expect_matches(tp, want_p, dtype, {tol.rtol * 8, tol.atol + 1e-6}, "adam");
  }
}

// By default a program is compiled once it has computed one evaluation's elements and
// kCpuJitWorkElements in all: a large one on its second evaluation, a small one after as many
// evaluations as make that work; one under kCpuJitMinElements never. Each layout once. Programs
// of equal code share their work and their loops (Note [Programs that share their compiled
// loops]): the same code over another shape is hot at once.
TEST(CpuJit, HotModeCompilesProgramsOnceTheyHaveDoneACompilesWorth) {
  REQUIRE_JIT();
  JitModeGuard hot(CpuJitMode::Hot);
  constexpr int64_t kSmall = 4096;
  const Tensor big = rand({kCpuJitWorkElements}), small = rand({kSmall}),
               tiny = rand({kCpuJitMinElements - 24});
  eval({big, small, tiny});
  // Structures of their own (constants no other test uses), so their programs are new.
  auto run = [](const Tensor& t) { eval((t * 1.8125f + 0.4375f).tanh()); };
  auto run_other = [](const Tensor& t) { eval((t * 1.6875f + 0.3125f).tanh()); };
  reset_cpu_jit_stats();
  run(big);
  EXPECT_EQ(cpu_jit_stats().compiled, 0);
  EXPECT_EQ(cpu_jit_stats().runs, 0);
  run(big);
  EXPECT_EQ(cpu_jit_stats().compiled, 1);
  EXPECT_GT(cpu_jit_stats().runs, 0);
  run(big);
  EXPECT_EQ(cpu_jit_stats().compiled, 1);
  // The same code over a small shape is hot from its first evaluation: it compiles the loop of
  // its own layout (its result kept in the caches, where the big one's streamed past them)
  // rather than interpreting a compile's work first.
  reset_cpu_jit_stats();
  run(small);
  EXPECT_EQ(cpu_jit_stats().compiled, 1);
  EXPECT_GT(cpu_jit_stats().runs, 0);
  run(small);
  EXPECT_EQ(cpu_jit_stats().compiled, 1);

  // Other code: compiled on the evaluation whose elements pass the work.
  reset_cpu_jit_stats();
  const int64_t interpreted = kCpuJitWorkElements / kSmall;
  for (int64_t i = 0; i < interpreted; ++i) run_other(small);
  EXPECT_EQ(cpu_jit_stats().compiled, 0) << "compiled before the interpreter did a compile's work";
  EXPECT_EQ(cpu_jit_stats().runs, 0);
  run_other(small);
  EXPECT_EQ(cpu_jit_stats().compiled, 1);
  EXPECT_GT(cpu_jit_stats().runs, 0);
  const std::vector<float> got = (small * 1.6875f + 0.3125f).tanh().to_vector<float>();
  const std::vector<float> inputs = small.to_vector<float>();
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], std::tanh(1.6875 * inputs[i] + 0.3125), 2e-7) << "at " << i;

  reset_cpu_jit_stats();
  auto run_tiny = [](const Tensor& t) { eval((t * 1.5625f + 0.1875f).tanh()); };
  for (int64_t i = 0; i <= kCpuJitWorkElements / (kCpuJitMinElements - 24); ++i) run_tiny(tiny);
  EXPECT_EQ(cpu_jit_stats().compiled, 0);
  EXPECT_EQ(cpu_jit_stats().runs, 0);
}

// A fused reduction of an operand read from memory measures which of the compiled loop and the
// interpreter runs it faster (Note [Compiled or interpreted from memory]): its first evaluations
// take both paths, and every evaluation gives the same bits, the float64 sum's within float32
// rounding.
TEST(CpuJit, AReductionFromMemoryTriesBothPathsWithTheSameBits) {
  REQUIRE_JIT();
  JitModeGuard hot(CpuJitMode::Hot);
  const int64_t n = int64_t{1} << 22;  // 16 MiB of float32: read from memory
  ASSERT_TRUE(worth_streaming(n * 4));
  const Tensor x = rand({n}) - 0.25f;
  eval(x);
  const std::vector<float> inputs = x.to_vector<float>();
  double want = 0;
  for (float v : inputs) want += (1.0625 * v) * (1.0625 * v);
  reset_cpu_jit_stats();
  std::vector<uint32_t> bits;
  for (int i = 0; i < 8; ++i) {
    // A constant of its own, so that the program is new to this test.
    const float sum = ((x * 1.0625f) * (x * 1.0625f)).sum().item<float>();
    uint32_t b;
    std::memcpy(&b, &sum, 4);
    bits.push_back(b);
    EXPECT_NEAR(sum, want, 1e-6 * want) << "evaluation " << i;
  }
  EXPECT_GT(cpu_jit_stats().runs, 0) << "the compiled loop never ran";
  for (int i = 1; i < 8; ++i) EXPECT_EQ(bits[i], bits[0]) << "evaluation " << i;
}

// Every layer of a model runs its own copy of the same row step: the copies share one row
// program (CpuRowProgram::shared), so they compile one loop between them and earn it together,
// and each still gives the float64 reference's values within float32 rounding.
TEST(CpuJit, EqualRowStepsShareOneRowProgram) {
  REQUIRE_JIT();
  JitModeGuard always(CpuJitMode::Always);
  std::mt19937 rng(31);
  std::uniform_real_distribution<double> uniform(-4, 4);
  constexpr int64_t kRows = 512, kLength = 128, kLayers = 3;
  std::vector<std::vector<double>> inputs(kLayers);
  std::vector<Tensor> xs, outs;
  for (auto& values : inputs) {
    for (int64_t i = 0; i < kRows * kLength; ++i) values.push_back(uniform(rng));
    xs.push_back(from_vector(values, {kRows, kLength}));
  }
  eval(xs);
  // A scale no other test uses, so that the row program is new here.
  for (const Tensor& x : xs) outs.push_back(nn::functional::softmax(x * 1.4375f, 1));
  reset_cpu_jit_stats();
  eval(outs);
  EXPECT_EQ(cpu_jit_stats().row_programs, 1);
  EXPECT_GT(cpu_jit_stats().runs, 0);
  for (int64_t layer = 0; layer < kLayers; ++layer) {
    const std::vector<float> got = outs[layer].to_vector<float>();
    for (int64_t r = 0; r < kRows; ++r) {
      double max = -INFINITY, sum = 0;
      for (int64_t j = 0; j < kLength; ++j)
        max = std::max(
            max, static_cast<double>(static_cast<float>(inputs[layer][r * kLength + j])) * 1.4375);
      for (int64_t j = 0; j < kLength; ++j)
        sum += std::exp(
            static_cast<double>(static_cast<float>(inputs[layer][r * kLength + j])) * 1.4375 - max);
      for (int64_t j = 0; j < kLength; ++j) {
        const double want =
            std::exp(static_cast<double>(static_cast<float>(inputs[layer][r * kLength + j])) *
                         1.4375 -
                     max) /
            sum;
        ASSERT_NEAR(got[r * kLength + j], want, 1e-6 + 1e-5 * want)
            << "layer " << layer << " row " << r << " element " << j;
      }
    }
  }
}

// A row step's parts compiled into one loop over rows (Note [Row programs] in
// codegen/cpu/cpu_row_program.cc) give the bits of the parts run one at a time in the interpreter:
// softmax, log-softmax, LayerNorm and RMSNorm, a max and a min over rows, in both float types,
// over values with NaN, infinities and signed zeros, at row lengths the row program takes (a
// multiple of 16, of 64 for a max or a min) and one it leaves to the parts (48 for a softmax,
// whose max keeps four sets of 16 accumulators).
// The steps have rows enough for blocks of rows (Note [Row blocks] in runtime/cpu/cpu_backend.cc).
TEST(CpuJit, RowProgramsGiveTheInterpretersBits) {
  REQUIRE_JIT();
  namespace F = nn::functional;
  std::mt19937 rng(23);
  for (DType dtype : {kFloat32, kFloat64}) {
    for (int64_t length : {48, 64, 320, 512, 1024}) {
      const int64_t rows = std::max<int64_t>(40, 65536 / length);
      const std::string name = absl::StrCat(dtype_torch_name(dtype), " rows of ", length);
      const Tensor x = from_vector(edgy_values(rng, rows * length), {rows, length}, dtype);
      // Finite values, so that a norm's statistics are not all NaN.
      const Tensor finite = x.clamp(-50, 50);
      const Tensor weight = from_vector(edgy_values(rng, length), {length}, dtype).clamp(-3, 3);
      const Tensor bias = from_vector(edgy_values(rng, length), {length}, dtype).clamp(-3, 3);
      eval({x, finite, weight, bias});
      const bool max_fits = length % 64 == 0;
      reset_cpu_jit_stats();
      expect_jit_matches_interpreter([&] { return F::softmax(x, 1); }, "softmax " + name);
      expect_jit_matches_interpreter([&] { return F::log_softmax(finite, 1); },
                                     "log_softmax " + name);
      EXPECT_EQ(cpu_jit_stats().row_programs > 0, max_fits) << name;
      reset_cpu_jit_stats();
      expect_jit_matches_interpreter(
          [&] { return F::layer_norm(finite, {length}, weight, bias, 1e-5); },
          "layer_norm " + name);
      expect_jit_matches_interpreter([&] { return F::rms_norm(x, {length}, weight, 1e-6); },
                                     "rms_norm " + name);
      EXPECT_GT(cpu_jit_stats().row_programs, 0) << name;
      expect_jit_matches_interpreter(
          [&] { return (x - x.amax({1}, true)) * (x.amin({1}, true) + 1); }, "max and min " + name);
    }
  }
}

// Values whose exponents straddle the range where a compiled loop divides by the divisor's
// reciprocal (Note [Division by a reciprocal] in codegen/cpu/cpu_jit_ops.cc): random significands
// and signs, exponents from a little below to a little above the range, significands of all
// ones and of none (the hardest and the exact reciprocals), and zeros, subnormals, infinities
// and NaN.
std::vector<double> quotient_edges(std::mt19937& rng, int64_t n, DType dtype) {
  const bool single = dtype == kFloat32;
  const int reach = single ? 60 : 500, beyond = single ? 8 : 30;
  std::uniform_int_distribution<int> exponent(-reach - beyond, reach + beyond);
  std::uniform_real_distribution<double> significand(1, 2);
  const double special[] = {0.0, -0.0, kInf, -kInf, kNan, single ? 1e-40 : 1e-310};
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    double m = significand(rng);
    if (i % 5 == 1) m = single ? 2 - 0x1p-23 : 2 - 0x1p-52;
    if (i % 5 == 2) m = 1;
    const double x = std::ldexp(rng() % 2 ? -m : m, exponent(rng));
    v[static_cast<size_t>(i)] = i % 11 == 4 ? special[(i / 11) % 6] : x;
  }
  return v;
}

// A division by a value the loop does not change (a row's value, a 0-d operand, a constant,
// a row program's reduction) is computed from its reciprocal: the interpreter's division's bits
// wherever the dividend and divisor lie, edges of the range and special values included.
TEST(CpuJit, DivisionByAFixedDivisorGivesTheInterpretersBits) {
  REQUIRE_JIT();
  std::mt19937 rng(31);
  constexpr int64_t kRows = 64, kColumns = 256;
  for (DType dtype : {kFloat32, kFloat64}) {
    const std::string name = dtype_torch_name(dtype);
    const Tensor x =
        from_vector(quotient_edges(rng, kRows * kColumns, dtype), {kRows, kColumns}, dtype);
    const Tensor per_row = from_vector(quotient_edges(rng, kRows, dtype), {kRows, 1}, dtype);
    std::vector<Tensor> scalars;
    for (double d : quotient_edges(rng, 12, dtype)) scalars.push_back(from_vector({d}, {}, dtype));
    const Tensor finite = x.clamp(-1e30, 1e30);
    eval({x, per_row, finite});
    for (const Tensor& scalar : scalars) eval(scalar);
    expect_jit_matches_interpreter([&] { return x / per_row; }, name + " by a row's value");
    expect_jit_matches_interpreter([&] { return (x.exp() - 1) / per_row; },
                                   name + " of a chain by a row's value");
    for (const Tensor& scalar : scalars)
      expect_jit_matches_interpreter([&] { return x / scalar; },
                                     name + " by " + std::to_string(scalar.item<double>()));
    for (double constant : {3.0, -0.1, 0x1p-61, 0x1p60, 1e-30})
      expect_jit_matches_interpreter([&] { return x / constant; },
                                     name + " by the constant " + std::to_string(constant));
    // A row program: each row by its own maximum magnitude and by its sum.
    reset_cpu_jit_stats();
    expect_jit_matches_interpreter([&] { return x / x.abs().amax({1}, true); },
                                   name + " by a row's max");
    expect_jit_matches_interpreter([&] { return finite / finite.sum({1}, true); },
                                   name + " by a row's sum");
    EXPECT_GT(cpu_jit_stats().row_programs, 0) << name;
  }
}

// A compiled loop's code lives as long as its program: once the schedule cache drops the
// schedules (it holds 256, then starts again), their loops are freed, and what runs next
// compiles anew and computes the same.
TEST(CpuJit, CodeOfDroppedProgramsIsFreed) {
  REQUIRE_JIT();
  JitModeGuard always(CpuJitMode::Always);
  const Tensor x = rand({256});
  eval(x);
  reset_cpu_jit_stats();
  // Distinct constants make distinct schedules, each with a program of its own.
  for (int k = 0; k < 300; ++k) eval((x * (1.0f + static_cast<float>(k) / 512)).exp());
  const CpuJitStats stats = cpu_jit_stats();
  EXPECT_GE(stats.compiled, 300);
  EXPECT_GT(stats.released, 0) << "no compiled code was freed";
  const std::vector<float> values = (x * 1.5f).exp().to_vector<float>();
  const std::vector<float> inputs = x.to_vector<float>();
  for (size_t i = 0; i < values.size(); ++i)
    EXPECT_NEAR(values[i], std::exp(1.5 * inputs[i]), 1e-6 * std::exp(1.5 * inputs[i]));
}

}  // namespace
}  // namespace lazyfuse
