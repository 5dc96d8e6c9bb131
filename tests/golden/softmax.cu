// Generated from tests/golden/softmax.ir by tests/golden_test.cc; regenerate with UPDATE_GOLDEN=1.
// The common prologue (cuda_prologue()) is left out.

// ----- step 0: row -----
// kernel k_7985f5f7_r1_c

// max, then sum over each row, then 1 fused nodes over the row again
struct Args_k_7985f5f7_r1_c {
  long long size[1];
  const void* in[1];
  long long stride[1][1];
  void* out[1];
  long long rows;
  long long columns;
  double divisor;
};

__device__ __forceinline__ float lf_combine0(float x, float y) { return lf_max(x, y); }

__device__ __forceinline__ double lf_combine1(double x, double y) { return x + y; }

extern "C" __global__ void __launch_bounds__(256) k_7985f5f7_r1_c(const Args_k_7985f5f7_r1_c args) {
  typedef unsigned int IDX;
  const float* __restrict__ in0 = (const float*)args.in[0];
  const long long row = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= args.rows) return;
  float acc0 = (float)(-__longlong_as_double(0x7ff0000000000000LL));
#pragma unroll 4
  for (long long j = lane; j < args.columns; j += 32) {
    const IDX i = (IDX)(row * args.columns + j);
    const IDX c0 = i;
    (void)c0;
    const float v0 = lf_load(in0[i]);
    acc0 = lf_combine0(acc0, (float)v0);
  }
  for (int offset = 16; offset > 0; offset /= 2) acc0 = lf_combine0(acc0, __shfl_xor_sync(0xffffffffu, acc0, offset));
  const float total0 = lf_store<float>(acc0);
  const float v1 = lf_load(total0);
  double acc1 = (double)(0);
#pragma unroll 4
  for (long long j = lane; j < args.columns; j += 32) {
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
    acc1 = lf_combine1(acc1, (double)v3);
  }
  for (int offset = 16; offset > 0; offset /= 2) acc1 = lf_combine1(acc1, __shfl_xor_sync(0xffffffffu, acc1, offset));
  const float total1 = lf_store<float>(acc1);
  const float v4 = lf_load(total1);
#pragma unroll 4
  for (long long j = lane; j < args.columns; j += 32) {
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
    float v5;
    {
      const float a = (float)v3;
      const float b = (float)v4;
      v5 = (float)(a / b);  // div
    }
    ((float*)args.out[0])[i] = lf_store<float>(v5);
  }
}
