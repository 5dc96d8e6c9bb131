// Generated from tests/golden/softmax.ir by tests/golden_test.cc; regenerate with UPDATE_GOLDEN=1.
// The common prologue (cuda_prologue()) is left out.

// ----- step 0: reduction -----
// kernel k_bd71351f_r1_c

// max over each row, then 2 fused nodes over the row again
struct Args_k_bd71351f_r1_c {
  long long size[1];
  const void* in[1];
  long long stride[1][1];
  void* out[1];
  long long rows, columns;
  double divisor;
};

__device__ __forceinline__ float lf_combine(float x, float y) { return lf_max(x, y); }

extern "C" __global__ void __launch_bounds__(256) k_bd71351f_r1_c(const Args_k_bd71351f_r1_c args) {
  typedef unsigned int IDX;
  const float* __restrict__ in0 = (const float*)args.in[0];
  const long long row = blockIdx.x;
  float acc = (float)(-__longlong_as_double(0x7ff0000000000000LL));
  for (long long j = threadIdx.x; j < args.columns; j += blockDim.x) {
    const IDX i = (IDX)(row * args.columns + j);
    const IDX c0 = i;
    (void)c0;
    const float v0 = lf_load(in0[i]);
    acc = lf_combine(acc, (float)v0);
  }
  for (int offset = 16; offset > 0; offset /= 2) acc = lf_combine(acc, __shfl_down_sync(0xffffffffu, acc, offset));
  __shared__ float warp_results[32];
  __shared__ float total;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_results[warp] = acc;
  __syncthreads();
  if (warp == 0) {
    acc = lane < (int)(blockDim.x / 32) ? warp_results[lane] : (float)(-__longlong_as_double(0x7ff0000000000000LL));
    for (int offset = 16; offset > 0; offset /= 2) acc = lf_combine(acc, __shfl_down_sync(0xffffffffu, acc, offset));
    if (lane == 0) total = lf_store<float>(acc);
  }
  __syncthreads();
  const float v1 = lf_load(total);
  for (long long j = threadIdx.x; j < args.columns; j += blockDim.x) {
    const IDX i = (IDX)(row * args.columns + j);
    const IDX c0 = i;
    (void)c0;
    const float v0 = lf_load(in0[i]);
    float v2;
    {
      const float a = (float)v0;
      const float b = (float)v1;
      v2 = (float)(a - b);  // sub
    }
    float v3;
    {
      const float a = (float)v2;
      v3 = (float)(lf_exp(a));  // exp
    }
    ((float*)args.out[0])[i] = lf_store<float>(v3);
  }
}

// ----- step 1: reduction -----
// kernel k_8e9ea830_r1_c

// sum over each row, then 1 fused nodes over the row again
struct Args_k_8e9ea830_r1_c {
  long long size[1];
  const void* in[1];
  long long stride[1][1];
  void* out[1];
  long long rows, columns;
  double divisor;
};

__device__ __forceinline__ double lf_combine(double x, double y) { return x + y; }

extern "C" __global__ void __launch_bounds__(256) k_8e9ea830_r1_c(const Args_k_8e9ea830_r1_c args) {
  typedef unsigned int IDX;
  const float* __restrict__ in0 = (const float*)args.in[0];
  const long long row = blockIdx.x;
  double acc = (double)(0);
  for (long long j = threadIdx.x; j < args.columns; j += blockDim.x) {
    const IDX i = (IDX)(row * args.columns + j);
    const IDX c0 = i;
    (void)c0;
    const float v3 = lf_load(in0[i]);
    acc = lf_combine(acc, (double)v3);
  }
  for (int offset = 16; offset > 0; offset /= 2) acc = lf_combine(acc, __shfl_down_sync(0xffffffffu, acc, offset));
  __shared__ double warp_results[32];
  __shared__ float total;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_results[warp] = acc;
  __syncthreads();
  if (warp == 0) {
    acc = lane < (int)(blockDim.x / 32) ? warp_results[lane] : (double)(0);
    for (int offset = 16; offset > 0; offset /= 2) acc = lf_combine(acc, __shfl_down_sync(0xffffffffu, acc, offset));
    if (lane == 0) total = lf_store<float>(acc);
  }
  __syncthreads();
  const float v4 = lf_load(total);
  for (long long j = threadIdx.x; j < args.columns; j += blockDim.x) {
    const IDX i = (IDX)(row * args.columns + j);
    const IDX c0 = i;
    (void)c0;
    const float v3 = lf_load(in0[i]);
    float v5;
    {
      const float a = (float)v3;
      const float b = (float)v4;
      v5 = (float)(a / b);  // div
    }
    ((float*)args.out[0])[i] = lf_store<float>(v5);
  }
}
