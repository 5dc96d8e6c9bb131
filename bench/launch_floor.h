// The floor under a GPU evaluation's host cost: cuLaunchKernel of a kernel equivalent to the
// seed's fused one, `out = exp(z + 2) * y` (one struct parameter: the addresses and the size),
// with nothing around it. The host-cost figures are read against it, measured in the same
// process: the machine's CPU speed varies between runs far more than lazyfuse's own share.
#pragma once

#include <cstdint>

#include "lazyfuse/runtime/cuda/cuda_driver.h"

namespace lazyfuse::bench {

class LaunchFloor {
 public:
  // Compiles (or finds in the kernel cache) the kernel for GPU `device`; `y`, `z` and `out`
  // are device addresses of `n` floats.
  LaunchFloor(int device, uint64_t y, uint64_t z, uint64_t out, int64_t n);
  // One launch on the device's own stream, the one lazyfuse launches on
  // (cuda::device_stream).
  void launch();
  // One launch on `stream` (null: the legacy default stream).
  void launch_on(cuda::CUstream stream);

 private:
  int device_;
  cuda::CUfunction function_ = nullptr;
  uint64_t args_[4];
  unsigned blocks_;
};

}  // namespace lazyfuse::bench
