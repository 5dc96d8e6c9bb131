// The API's edges as a LibTorch user meets them: printing dtypes, shapes and options; type
// promotion with 0-d tensors; nested initializer lists; dims given as one or many.
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "lazyfuse/lazyfuse.h"

// Printed from outside namespace lazyfuse, as a user's code prints them: each operator is found
// by argument-dependent lookup.
namespace {
std::string printed_outside(const lazyfuse::Tensor& t, const lazyfuse::TensorOptions& options) {
  std::ostringstream out;
  out << t.dtype() << " " << t.sizes() << " " << t.strides() << " " << options;
  return out.str();
}
}  // namespace

TEST(Printing, DtypeShapeAndOptionsPrintAsPyTorchDoes) {
  namespace lf = lazyfuse;
  EXPECT_EQ(printed_outside(lf::zeros({2, 3}, lf::kFloat64), lf::TensorOptions(lf::kInt32)),
            "torch.float64 torch.Size([2, 3]) torch.Size([3, 1]) TensorOptions(dtype=torch.int32, "
            "device=cpu (default), requires_grad=false (default))");
  EXPECT_EQ(printed_outside(lf::scalar_tensor(1.5),
                            lf::TensorOptions().device(lf::Device("cuda:1")).requires_grad(true)),
            "torch.float32 torch.Size([]) torch.Size([]) TensorOptions(dtype=torch.float32 "
            "(default), device=cuda:1, requires_grad=true)");
  std::ostringstream bfloat;
  bfloat << lf::kBFloat16 << " " << lf::kBool << " " << lf::kInt64;
  EXPECT_EQ(bfloat.str(), "torch.bfloat16 torch.bool torch.int64");
}
