// Integer arithmetic wraps modulo 2^width on every device, as PyTorch's does: in fused kernels,
// where a compiler that assumes signed overflow never happens could drop a relu of x^4 or fold
// a comparison (Note [Integer wrap-around] in codegen/cuda/cuda_codegen.cc). Expected values come
// from unsigned arithmetic in the test.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <vector>

#include <lazyfuse/lazyfuse.h>

#include "lazyfuse/runtime/cuda/cuda_memory.h"

namespace lazyfuse {
namespace {

template <typename T, typename U>
void check_wraps(const Device& device, DType dtype) {
  SCOPED_TRACE(::testing::Message() << dtype_torch_name(dtype) << " on " << device.str());
  const T lowest = std::numeric_limits<T>::min();
  // Values whose squares and fourth powers overflow, the extremes, and small ones.
  const std::vector<T> xs = {T(46341),
                             T(-46341),
                             T(1) << (sizeof(T) * 4 + 3),
                             lowest,
                             std::numeric_limits<T>::max(),
                             T(-3),
                             T(0),
                             T(7)};
  std::vector<double> as_double;
  for (T x : xs) as_double.push_back(static_cast<double>(x));
  const Tensor x = from_vector(as_double, {static_cast<int64_t>(xs.size())},
                               TensorOptions().dtype(dtype).device(device));
  auto wrap = [](U u) { return static_cast<T>(u); };
  auto mul = [&](T a, T b) { return wrap(static_cast<U>(a) * static_cast<U>(b)); };

  // One fused kernel each.
  const std::vector<T> fourth_relu = ((x * x) * (x * x)).relu().template to_vector<T>();
  const std::vector<T> shifted = (x + x + std::numeric_limits<T>::max()).template to_vector<T>();
  const std::vector<T> negated_abs = (-x).abs().template to_vector<T>();
  const std::vector<T> cubed = x.pow(3).template to_vector<T>();
  const std::vector<T> difference = (x - x * 3).template to_vector<T>();
  for (size_t i = 0; i < xs.size(); ++i) {
    const T a = xs[i];
    const T square = mul(a, a), fourth = mul(square, square);
    EXPECT_EQ(fourth_relu[i], fourth < 0 ? T(0) : fourth) << "x = " << a;
    const T twice = wrap(static_cast<U>(a) + static_cast<U>(a));
    EXPECT_EQ(shifted[i],
              wrap(static_cast<U>(twice) + static_cast<U>(std::numeric_limits<T>::max())))
        << "x = " << a;
    const T negated = wrap(U(0) - static_cast<U>(a));
    EXPECT_EQ(negated_abs[i], negated < 0 ? wrap(U(0) - static_cast<U>(negated)) : negated)
        << "x = " << a;
    EXPECT_EQ(cubed[i], mul(mul(a, a), a)) << "x = " << a;
    EXPECT_EQ(difference[i], wrap(static_cast<U>(a) - static_cast<U>(mul(a, T(3))))) << "x = " << a;
  }
}

TEST(IntegerWrap, ArithmeticWrapsOnTheCpu) {
  check_wraps<int32_t, uint32_t>(Device::cpu(), DType::Int32);
  check_wraps<int64_t, uint64_t>(Device::cpu(), DType::Int64);
}

TEST(CudaIntegerWrap, ArithmeticWrapsOnTheGpu) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA GPU";
  check_wraps<int32_t, uint32_t>(Device("cuda:0"), DType::Int32);
  check_wraps<int64_t, uint64_t>(Device("cuda:0"), DType::Int64);
}

}  // namespace
}  // namespace lazyfuse
