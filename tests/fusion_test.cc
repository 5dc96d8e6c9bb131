#include <gtest/gtest.h>
#include <iostream>
#include <lazyfuse/lazyfuse.h>
#include "ir/passes/passes.h"
namespace lazyfuse {
TEST(Explore, A) {
  Tensor y = tensor({1, 2, 3});
  Tensor z = tensor({1, 2, 3});
  Tensor r = (z + 2).exp() * y;
  std::cout << r.ir() << r.fused_ir();
  std::cout << r << "\n";
  std::cout << arange(5) << "\n" << tensor({1.5, 2}, kFloat64) << "\n" << tensor({{1, 2, 3}, {4, 5, 6}}) << "\n";
  std::cout << tensor({{1.5, -2, 3}, {4, 50, 6}}) << "\n";
  Tensor x = tensor({1, 2, 3});
  Tensor g = 0.5 * x * (1 + tanh(0.7978845608 * (x + 0.044715 * x * x * x)));
  std::cout << g.ir() << g.fused_ir();
  Tensor s = (x * x).sum();
  std::cout << s.fused_ir();
  Tensor m = tensor({{1, 2}, {3, 4}});
  Tensor mm = relu(matmul(m, m) + 1) * 2;
  std::cout << mm.fused_ir();
  Tensor e = x.exp();
  Tensor d = (e + 1) ;
  Tensor c = e.sum().expand({3});
  std::cout << (d + c).fused_ir();
  std::cout << x.t().ir();
}
}
