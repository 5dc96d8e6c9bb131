// How accurate each half-precision rounding policy is (Note [Half precision in fused kernels] in
// ir/half_rounding.h), measured on the fusion benchmark's workloads: each runs in float16 and
// bfloat16 under both policies and is compared with the same workload computed in float64 from
// the same (rounded) inputs. The error of each result element is counted in units in the last
// place of the result's dtype at the float64 value (a result rounded once from the exact value
// is within half a unit); the table gives the largest and the mean over every output element,
// fused as the runtime fuses by default.
//
//   build/bin/lazyfuse_half_accuracy [--device=cpu|cuda:N] [--log2=16]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "bench/workloads.h"
#include "lazyfuse/runtime/lazy.h"

namespace {

using namespace lazyfuse;

// The unit in the last place of `dtype` at `value` (float16's subnormals have a fixed unit).
double ulp(double value, DType dtype) {
  const int mantissa_bits = dtype == kFloat16 ? 10 : 7;
  const int min_exponent = dtype == kFloat16 ? -14 : -126;
  const double magnitude = std::fabs(value);
  const int exponent =
      magnitude == 0 ? min_exponent : std::max(min_exponent, std::ilogb(magnitude));
  return std::ldexp(1.0, exponent - mantissa_bits);
}

struct Errors {
  double largest = 0, sum = 0;
  int64_t count = 0, nonfinite = 0;
};

Errors compare(const std::vector<Tensor>& got, const std::vector<Tensor>& want, DType dtype) {
  Errors errors;
  for (size_t k = 0; k < got.size(); ++k) {
    const std::vector<double> g = got[k].to_vector<double>(), w = want[k].to_vector<double>();
    for (size_t i = 0; i < g.size(); ++i) {
      // A float64 value past the half type's range, and what it became there, are not errors of
      // rounding: counted apart.
      if (!std::isfinite(g[i]) || !std::isfinite(w[i])) {
        errors.nonfinite +=
            !(std::isinf(g[i]) && std::isinf(w[i]) && std::signbit(g[i]) == std::signbit(w[i]));
        continue;
      }
      const double units = std::fabs(g[i] - w[i]) / ulp(w[i], dtype);
      errors.largest = std::max(errors.largest, units);
      errors.sum += units;
      ++errors.count;
    }
  }
  return errors;
}

}  // namespace

int main(int argc, char** argv) {
  std::string device_name = "cpu";
  int log2 = 16;
  for (int a = 1; a < argc; ++a) {
    const std::string_view arg = argv[a];
    if (arg.starts_with("--device=")) {
      device_name = std::string(arg.substr(9));
    } else if (arg.starts_with("--log2=")) {
      log2 = std::atoi(std::string(arg.substr(7)).c_str());
    } else {
      std::fprintf(stderr, "usage: %s [--device=cpu|cuda:N] [--log2=16]\n", argv[0]);
      return 2;
    }
  }
  const Device device(device_name);
  const int64_t n = int64_t{1} << log2;
  std::printf(
      "Error against float64 in units in the last place of the result's dtype, 2^%d elements "
      "on %s: largest / mean over every output element; elements whose float64 value or result is\n"
      "not finite, unless both are the same infinity, are counted apart (past the range).\n\n"
      "| workload | dtype | rounded after each op | rounded at stores | past the range |\n"
      "|---|---|---|---|---|\n",
      log2, device.str().c_str());
  for (const bench::Workload& workload : bench::workloads()) {
    for (DType dtype : {kBFloat16, kFloat16}) {
      manual_seed(7);
      std::vector<Tensor> inputs, wide;
      for (const Shape& shape : workload.shapes(n)) {
        inputs.push_back(rand(shape, TensorOptions().dtype(dtype).device(device)) + 0.5);
        wide.push_back(inputs.back().to(kFloat64).cpu());
      }
      eval(inputs);
      const std::vector<Tensor> want = workload.build(wide);
      eval(want);
      std::string cells;
      int64_t nonfinite = 0;
      for (HalfRounding rounding : {HalfRounding::EachOp, HalfRounding::AtStores}) {
        HalfRoundingGuard guard(rounding);
        const std::vector<Tensor> got = workload.build(inputs);
        eval(got);
        const Errors errors = compare(got, want, dtype);
        nonfinite += errors.nonfinite;
        char cell[64];
        std::snprintf(cell, sizeof cell, " %.2f / %.3f |", errors.largest,
                      errors.count ? errors.sum / static_cast<double>(errors.count) : 0.0);
        cells += cell;
      }
      std::printf("| %s | %s |%s %lld |\n", workload.name.c_str(), dtype_ir_name(dtype),
                  cells.c_str(), static_cast<long long>(nonfinite));
    }
  }
  return 0;
}
