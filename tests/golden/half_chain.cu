// Generated from tests/golden/half_chain.ir by tests/golden_test.cc; regenerate with UPDATE_GOLDEN=1.
// The common prologue (cuda_prologue()) is left out.

// ----- step 0: elementwise -----
// kernel k_e1070e86_r1v8_c

// 5 fused nodes
struct Args_k_e1070e86_r1v8_c {
  long long n;
  long long size[1];
  const void* in[1];
  long long stride[1][1];
  void* out[2];
};

extern "C" __global__ void __launch_bounds__(256) k_e1070e86_r1v8_c(const Args_k_e1070e86_r1v8_c args) {
  typedef unsigned int IDX;
  const lf_f16* __restrict__ in0 = (const lf_f16*)args.in[0];
  lf_f16* __restrict__ out0 = (lf_f16*)args.out[0];
  float* __restrict__ out1 = (float*)args.out[1];
  const IDX n = (IDX)args.n;
  const IDX tid = (IDX)blockIdx.x * blockDim.x + threadIdx.x;
  const IDX step = (IDX)gridDim.x * blockDim.x;
  const IDX nv = n / 8;
  for (IDX v = tid; v < nv; v += step) {
    const IDX i0 = v * 8;
    const lf_vec<lf_f16, 8> x0 = *(const lf_vec<lf_f16, 8>*)(in0 + i0);
    lf_vec<lf_f16, 8> y0;
    lf_vec<float, 8> y1;
#pragma unroll
    for (int l = 0; l < 8; ++l) {
      const IDX i = i0 + l;
      (void)i;
      const float v0 = lf_load(x0.v[l]);
      float v1;
      {
        const float a = (float)v0;
        const float b = (float)v0;
        v1 = (float)(a * b);  // mul
      }
      float v2;
      {
        const float a = (float)v1;
        v2 = (float)(lf_tanh(a));  // tanh
      }
      float v3 = (float)lf_round_f16(v2);
      float v4 = 0x1p-1f;
      float v5;
      {
        const float a = (float)v3;
        const float b = (float)v4;
        v5 = (float)(a * b);  // mul
      }
      y0.v[l] = lf_store<lf_f16>(v2);
      y1.v[l] = lf_store<float>(v5);
    }
    *(lf_vec<lf_f16, 8>*)(out0 + i0) = y0;
    *(lf_vec<float, 8>*)(out1 + i0) = y1;
  }
  for (IDX i = nv * 8 + tid; i < n; i += step) {
    const IDX c0 = i;
    (void)c0;
    const float v0 = lf_load(in0[i]);
    float v1;
    {
      const float a = (float)v0;
      const float b = (float)v0;
      v1 = (float)(a * b);  // mul
    }
    float v2;
    {
      const float a = (float)v1;
      v2 = (float)(lf_tanh(a));  // tanh
    }
    float v3 = (float)lf_round_f16(v2);
    float v4 = 0x1p-1f;
    float v5;
    {
      const float a = (float)v3;
      const float b = (float)v4;
      v5 = (float)(a * b);  // mul
    }
    out0[i] = lf_store<lf_f16>(v2);
    out1[i] = lf_store<float>(v5);
  }
}
