// Generated from tests/golden/seed.ir by tests/golden_test.cc; regenerate with UPDATE_GOLDEN=1.
// The common prologue (cuda_prologue()) is left out.

// ----- step 0: elementwise -----
// kernel k_2caa01c5_r1v4_cc

// 4 fused nodes
struct Args_k_2caa01c5_r1v4_cc {
  long long n;
  long long size[1];
  const void* in[2];
  long long stride[2][1];
  void* out[1];
};

extern "C" __global__ void __launch_bounds__(256) k_2caa01c5_r1v4_cc(const Args_k_2caa01c5_r1v4_cc args) {
  typedef unsigned int IDX;
  const float* __restrict__ in0 = (const float*)args.in[0];
  const float* __restrict__ in1 = (const float*)args.in[1];
  float* __restrict__ out0 = (float*)args.out[0];
  const IDX n = (IDX)args.n;
  const IDX tid = (IDX)blockIdx.x * blockDim.x + threadIdx.x;
  const IDX step = (IDX)gridDim.x * blockDim.x;
  const IDX nv = n / 4;
  for (IDX v = tid; v < nv; v += step) {
    const IDX i0 = v * 4;
    const lf_vec<float, 4> x0 = *(const lf_vec<float, 4>*)(in0 + i0);
    const lf_vec<float, 4> x1 = *(const lf_vec<float, 4>*)(in1 + i0);
    lf_vec<float, 4> y0;
#pragma unroll
    for (int l = 0; l < 4; ++l) {
      const IDX i = i0 + l;
      (void)i;
      const float v0 = lf_load(x0.v[l]);
      const float v1 = lf_load(x1.v[l]);
      float v2 = 0x1p+1f;
      float v3;
      {
        const float a = (float)v0;
        const float b = (float)v2;
        v3 = (float)(a + b);  // add
      }
      float v4;
      {
        const float a = (float)v3;
        v4 = (float)(lf_exp(a));  // exp
      }
      float v5;
      {
        const float a = (float)v4;
        const float b = (float)v1;
        v5 = (float)(a * b);  // mul
      }
      y0.v[l] = lf_store<float>(v5);
    }
    *(lf_vec<float, 4>*)(out0 + i0) = y0;
  }
  for (IDX i = nv * 4 + tid; i < n; i += step) {
    const IDX c0 = i;
    (void)c0;
    const float v0 = lf_load(in0[i]);
    const float v1 = lf_load(in1[i]);
    float v2 = 0x1p+1f;
    float v3;
    {
      const float a = (float)v0;
      const float b = (float)v2;
      v3 = (float)(a + b);  // add
    }
    float v4;
    {
      const float a = (float)v3;
      v4 = (float)(lf_exp(a));  // exp
    }
    float v5;
    {
      const float a = (float)v4;
      const float b = (float)v1;
      v5 = (float)(a * b);  // mul
    }
    out0[i] = lf_store<float>(v5);
  }
}
