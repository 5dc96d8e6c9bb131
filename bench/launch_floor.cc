#include "bench/launch_floor.h"

#include "lazyfuse/runtime/kernel_cache.h"

namespace lazyfuse::bench {

LaunchFloor::LaunchFloor(int device, uint64_t y, uint64_t z, uint64_t out, int64_t n)
    : device_(device),
      args_{y, z, out, static_cast<uint64_t>(n)},
      blocks_(static_cast<unsigned>((n + 255) / 256)) {
  function_ = cuda::get_kernel(device, "bench-launch-floor", [] {
    return CudaSource{"lf_launch_floor", R"(
struct Args { const float* y; const float* z; float* out; long long n; };
extern "C" __global__ void lf_launch_floor(Args a) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < a.n) a.out[i] = expf(a.z[i] + 2.0f) * a.y[i];
})"};
  });
}

void LaunchFloor::launch() { launch_on(cuda::device_stream(device_)); }

void LaunchFloor::launch_on(cuda::CUstream stream) {
  void* params[] = {args_};
  cuda::check(cuda::driver()->cuLaunchKernel(function_, blocks_, 1, 1, 256, 1, 1, 0, stream, params,
                                             nullptr),
              "cuLaunchKernel");
}

}  // namespace lazyfuse::bench
