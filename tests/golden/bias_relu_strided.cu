// Generated from tests/golden/bias_relu_strided.ir by tests/golden_test.cc; regenerate with UPDATE_GOLDEN=1.
// The common prologue (cuda_prologue()) is left out.

// ----- step 0: elementwise -----
// kernel k_9f2ad459_r2_ssb

// 3 fused nodes
struct Args_k_9f2ad459_r2_ssb {
  long long n;
  long long size[2];
  const void* in[3];
  long long stride[3][2];
  void* out[1];
};

extern "C" __global__ void __launch_bounds__(256) k_9f2ad459_r2_ssb(const Args_k_9f2ad459_r2_ssb args) {
  typedef unsigned int IDX;
  const float* __restrict__ in0 = (const float*)args.in[0];
  const float* __restrict__ in1 = (const float*)args.in[1];
  const float* __restrict__ in2 = (const float*)args.in[2];
  float* __restrict__ out0 = (float*)args.out[0];
  const IDX n = (IDX)args.n;
  const IDX tid = (IDX)blockIdx.x * blockDim.x + threadIdx.x;
  const IDX step = (IDX)gridDim.x * blockDim.x;
  for (IDX i = tid; i < n; i += step) {
    IDX rest = i;
    const IDX c1 = rest % (IDX)args.size[1];
    rest /= (IDX)args.size[1];
    const IDX c0 = rest;
    const float v0 = lf_load(in0[c0 * (IDX)args.stride[0][0] + c1 * (IDX)args.stride[0][1]]);
    const float v1 = lf_load(in1[c0 * (IDX)args.stride[1][0] + c1 * (IDX)args.stride[1][1]]);
    const float v2 = lf_load(in2[0]);
    float v3;
    {
      const float a = (float)v0;
      const float b = (float)v1;
      v3 = (float)(a + b);  // add
    }
    float v4;
    {
      const float a = (float)v3;
      v4 = (float)(lf_relu(a));  // relu
    }
    float v5;
    {
      const float a = (float)v4;
      const float b = (float)v2;
      v5 = (float)(a * b);  // mul
    }
    out0[i] = lf_store<float>(v5);
  }
}
