// Evaluates the seed's expression through the installed package.
#include <iostream>

#include <lazyfuse/lazyfuse.h>

int main() {
  lazyfuse::Tensor x = lazyfuse::tensor({1, 2, 3});
  lazyfuse::Tensor y = x.to("cpu"), z = x.to("cpu");
  std::cout << (z + 2).exp() * y << "\n";
  return 0;
}
