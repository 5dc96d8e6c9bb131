// Generated from tests/golden/sum_squares.ir by tests/golden_test.cc; regenerate with UPDATE_GOLDEN=1.
// The common prologue (cuda_prologue()) is left out.

// ----- step 0: reduction -----
// kernel k_a10e2090_r1_c

// sum of 1 fused nodes
struct Args_k_a10e2090_r1_c {
  long long size[1];
  const void* in[1];
  long long stride[1][1];
  void* out;
  long long rows;
  long long columns;
  long long chunk;
  long long chunks;
  double divisor;
  void* partial;
  unsigned int* counters;
};

__device__ __forceinline__ double lf_combine(double x, double y) { return x + y; }

extern "C" __global__ void __launch_bounds__(256) k_a10e2090_r1_c(const Args_k_a10e2090_r1_c args) {
  typedef unsigned int IDX;
  const float* __restrict__ in0 = (const float*)args.in[0];
  const long long row = blockIdx.x / args.chunks, chunk = blockIdx.x % args.chunks;
  const long long begin = chunk * args.chunk;
  const long long end = min(args.columns, begin + args.chunk);
  double acc = (double)(0);
  for (long long j = begin + threadIdx.x; j < end; j += blockDim.x) {
    const IDX i = (IDX)(row * args.columns + j);
    const IDX c0 = i;
    (void)c0;
    const float v0 = lf_load(in0[i]);
    float v1;
    {
      const float a = (float)v0;
      const float b = (float)v0;
      v1 = (float)(a * b);  // mul
    }
    acc = lf_combine(acc, (double)v1);
  }
  __shared__ double warp_results[32];
  __shared__ bool last_block;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (args.chunks == 1) {
  for (int offset = 16; offset > 0; offset /= 2) acc = lf_combine(acc, __shfl_down_sync(0xffffffffu, acc, offset));
  if (lane == 0) warp_results[warp] = acc;
  __syncthreads();
  if (warp != 0) return;
  acc = lane < (int)(blockDim.x / 32) ? warp_results[lane] : (double)(0);
  for (int offset = 16; offset > 0; offset /= 2) acc = lf_combine(acc, __shfl_down_sync(0xffffffffu, acc, offset));
  if (lane != 0) return;
  ((float*)args.out)[row] = lf_store<float>(acc);
    return;
  }
  {
    // As block_combine, but every thread stays for the combination of the partials.
    double own = acc;
    for (int offset = 16; offset > 0; offset /= 2) own = lf_combine(own, __shfl_down_sync(0xffffffffu, own, offset));
    if (lane == 0) warp_results[warp] = own;
    __syncthreads();
    if (warp == 0) {
      own = lane < (int)(blockDim.x / 32) ? warp_results[lane] : (double)(0);
      for (int offset = 16; offset > 0; offset /= 2) own = lf_combine(own, __shfl_down_sync(0xffffffffu, own, offset));
      if (lane == 0) {
        ((double*)args.partial)[row * args.chunks + chunk] = own;
        __threadfence();
        last_block = atomicAdd(&args.counters[row], 1u) == (unsigned)(args.chunks - 1);
      }
    }
    __syncthreads();
  }
  if (!last_block) return;
  __threadfence();
  acc = (double)(0);
  for (long long j = threadIdx.x; j < args.chunks; j += blockDim.x)
    acc = lf_combine(acc, __ldcg((double*)args.partial + row * args.chunks + j));
  for (int offset = 16; offset > 0; offset /= 2) acc = lf_combine(acc, __shfl_down_sync(0xffffffffu, acc, offset));
  if (lane == 0) warp_results[warp] = acc;
  __syncthreads();
  if (warp != 0) return;
  acc = lane < (int)(blockDim.x / 32) ? warp_results[lane] : (double)(0);
  for (int offset = 16; offset > 0; offset /= 2) acc = lf_combine(acc, __shfl_down_sync(0xffffffffu, acc, offset));
  if (lane != 0) return;
  ((float*)args.out)[row] = lf_store<float>(acc);
  args.counters[row] = 0;
}
