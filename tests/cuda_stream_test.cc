// Users' streams and events (runtime/cuda/cuda_stream.h): a kernel the user launches through the
// driver API on their own stream and lazyfuse's evaluations, ordered by a CUDAStreamGuard
// without a device-wide synchronization; events timing GPU work. Without a GPU, the calls are
// typed errors.
#include <vector>

#include "gtest/gtest.h"
#include "lazyfuse/codegen/cuda/nvrtc.h"
#include "lazyfuse/lazyfuse.h"
#include "lazyfuse/runtime/cuda/cuda_driver.h"
#include "lazyfuse/runtime/kernel_cache.h"

namespace lazyfuse {
namespace {

TEST(CudaStreamApi, WithoutAGpuEachCallIsATypedError) {
  if (cuda::is_available()) GTEST_SKIP() << "a GPU is here: the GPU tests below run instead";
  EXPECT_THROW(cuda::getCurrentCUDAStream(), DeviceIndexError);
  EXPECT_THROW(cuda::synchronize(), DeviceIndexError);
  EXPECT_THROW(cuda::getStreamFromExternal(nullptr, 0), DeviceIndexError);
  cuda::Event start, end;
  EXPECT_THROW(start.elapsed_time(end), UnsupportedError) << "never recorded";
  EXPECT_TRUE(start.query()) << "an event never recorded has nothing to wait for";
}

// A kernel of the user's, compiled and launched through the driver API: it spins for about
// `cycles` clock ticks, then writes value[i] = base + i. What lazyfuse reads after it is right
// only if it runs after it.
class CudaStreams : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::is_available()) GTEST_SKIP() << "no CUDA GPU";
    api_ = cuda::driver();
    cuda::activate(0);
    const cuda::DeviceProperties& props = cuda::device_properties(0);
    const CompiledKernel compiled = nvrtc_compile(R"(
extern "C" __global__ void slow_fill(float* out, int n, float base, long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = base + i;
})",
                                                  "slow_fill", props.major, props.minor);
    cuda::check(api_->cuModuleLoadData(&module_, compiled.image.data()), "cuModuleLoadData");
    cuda::check(api_->cuModuleGetFunction(&slow_fill_, module_, "slow_fill"),
                "cuModuleGetFunction");
    cuda::check(api_->cuStreamCreate(&stream_, 0), "cuStreamCreate");
    cuda::check(api_->cuMemAlloc(&memory_, kN * sizeof(float)), "cuMemAlloc");
  }
  void TearDown() override {
    if (api_ == nullptr) return;
    api_->cuStreamSynchronize(stream_);
    api_->cuMemFree(memory_);
    api_->cuModuleUnload(module_);
  }
  // About 20 ms of spinning at the H200's clock, then the fill, on the user's stream.
  void launch_slow_fill(float base) {
    float* out = reinterpret_cast<float*>(memory_);
    int n = kN;
    long long cycles = 40'000'000;
    void* args[] = {&out, &n, &base, &cycles};
    cuda::check(api_->cuLaunchKernel(slow_fill_, 1, 1, 1, kN, 1, 1, 0, stream_, args, nullptr),
                "cuLaunchKernel");
  }
  Tensor user_tensor() {
    return from_blob(reinterpret_cast<void*>(memory_), {kN}, TensorOptions().device("cuda:0"));
  }
  static constexpr int kN = 256;
  const cuda::DriverApi* api_ = nullptr;
  cuda::CUmodule module_ = nullptr;
  cuda::CUfunction slow_fill_ = nullptr;
  cuda::CUstream stream_ = nullptr;
  cuda::CUdeviceptr memory_ = 0;
};

std::vector<float> filled(float base, float scale) {
  std::vector<float> values;
  for (int i = 0; i < 256; ++i) values.push_back((base + i) * scale);
  return values;
}

TEST_F(CudaStreams, AGuardOrdersTheUsersKernelAndLazyfusesBothWays) {
  const cuda::CUDAStream user = cuda::getStreamFromExternal(stream_, 0);
  const int64_t captures = stats().graph_captures;
  {
    cuda::CUDAStreamGuard guard(user);
    EXPECT_EQ(cuda::getCurrentCUDAStream(0), user);
    launch_slow_fill(1);
    Tensor doubled = user_tensor() * 2;
    eval(doubled);  // queued on the user's stream, after the fill
    EXPECT_EQ(doubled.to_vector<float>(), filled(1, 2));
    // Queued last inside the guard: lazyfuse's work after the guard waits for it.
    launch_slow_fill(100);
  }
  EXPECT_NE(cuda::getCurrentCUDAStream(0), user);
  Tensor tripled = user_tensor() * 3;  // on lazyfuse's own stream
  eval(tripled);
  EXPECT_EQ(tripled.to_vector<float>(), filled(100, 3));
  EXPECT_EQ(stats().graph_captures, captures) << "nothing recorded on a user's stream";
}

TEST_F(CudaStreams, EventsTimeTheWorkBetweenThem) {
  const cuda::CUDAStream user = cuda::getStreamFromExternal(stream_, 0);
  cuda::Event start, end;
  start.record(user);
  launch_slow_fill(0);
  end.record(user);
  end.synchronize();
  EXPECT_TRUE(end.query());
  EXPECT_GT(start.elapsed_time(end), 1.0f) << "the fill spins for milliseconds";
  cuda::synchronize(0);
  EXPECT_TRUE(user.query());
  cuda::Event untimed(false);
  untimed.record(user);
  EXPECT_THROW(start.elapsed_time(untimed), UnsupportedError);
}

TEST_F(CudaStreams, ANonBlockingStreamIsRefused) {
  cuda::CUstream non_blocking = nullptr;
  cuda::check(api_->cuStreamCreate(&non_blocking, 1), "cuStreamCreate");
  EXPECT_THROW(cuda::CUDAStreamGuard(cuda::getStreamFromExternal(non_blocking, 0)),
               UnsupportedError);
  EXPECT_NE(cuda::getCurrentCUDAStream(0).stream(), static_cast<void*>(non_blocking));
}

}  // namespace
}  // namespace lazyfuse
