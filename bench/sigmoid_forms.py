"""Why chain16 stays below the copy roof: forms of float32 sigmoid, timed in chain16's kernel.

chain16 (bench/workloads.cc) is four stages of abs(sigmoid(x * 1.0001 + 0.001) - 0.5). Each
form below is one sigmoid written by hand in the same float4 kernel (NVRTC, --fmad=false as
lazyfuse compiles) and timed at 2^28 elements against a float4 copy of the same bytes, with
CUDA events (median of 15); its error is measured on one sigmoid against float64 over 2^23
inputs plus edge cases: the largest error in ulps where the true result is a normal float32,
and the largest absolute error where it is subnormal.

Runs on the GPU machine (needs CuPy):  python3 bench/sigmoid_forms.py
"""
import cupy as cp
import numpy as np

FORMS = {
    "__frcp_rn(1 + expf(-x))": "return __frcp_rn(__fadd_rn(1.0f, expf(-a)));",
    "fast math: __frcp_rn(1 + __expf(-x))": "return __frcp_rn(1.0f + __expf(-a));",
    "lazyfuse: expf, reciprocal by MUFU.RCP + Newton": """float e = expf(-fabsf(a)); float d = 1.0f + e; float r;
        asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));
        r = fmaf(r, fmaf(-d, r, 1.0f), r);
        return a >= 0.0f ? r : r * e;""",
    "expf, reciprocal by 3 Newton steps (FMA only)": """float e = expf(-fabsf(a)); float d = 1.0f + e;
        float r = fmaf(d, -8.0f / 17.0f, 24.0f / 17.0f);
        r = fmaf(r, fmaf(-d, r, 1.0f), r); r = fmaf(r, fmaf(-d, r, 1.0f), r);
        r = fmaf(r, fmaf(-d, r, 1.0f), r);
        return a >= 0.0f ? r : r * e;""",
    "0.5 + 0.5 tanh.approx(x / 2)": """float t;
        asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(0.5f * a));
        return fmaf(0.5f, t, 0.5f);""",
}

KERNEL = r"""
__device__ __forceinline__ float sig(float a) { %s }
extern "C" __global__ void k(const float4* __restrict__ in, float4* __restrict__ out, long long n4) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4;
       i += (long long)gridDim.x * blockDim.x) {
    float4 v = in[i];
    float r[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float x = r[j];
      %s
      r[j] = x;
    }
    out[i] = make_float4(r[0], r[1], r[2], r[3]);
  }
}"""
CHAIN = "for (int s = 0; s < 4; ++s) x = fabsf(__fadd_rn(sig(__fadd_rn(__fmul_rn(x, 1.0001f), 0.001f)), -0.5f));"


def module(body, stage):
    return cp.RawModule(code=KERNEL % (body, stage), options=("--fmad=false", "-std=c++17")).get_function("k")


def time_us(kernel, x, out):
    grid = (cp.cuda.Device().attributes["MultiProcessorCount"] * 16,)
    args = (x, out, cp.int64(x.size // 4))
    kernel(grid, (256,), args)
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for _ in range(15):
        start.record()
        kernel(grid, (256,), args)
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop) * 1000)
    return float(np.median(times))


def errors(kernel):
    rng = np.random.default_rng(0)
    edges = [0, -0.0, 1e-30, -1e-30, 0.5, -0.5, 2, 88, -88, 89, -89, 103, -103, 104, -104, 200, -200,
             np.inf, -np.inf, np.nan]
    xs = np.concatenate([rng.uniform(-100, 100, 1 << 22), rng.uniform(-5, 5, 1 << 22), edges])
    xs = xs.astype(np.float32)
    xs = np.concatenate([xs, np.zeros(-xs.size % 4, np.float32)])
    got = cp.empty(xs.size, cp.float32)
    kernel((64,), (256,), (cp.asarray(xs), got, cp.int64(xs.size // 4)))
    got = cp.asnumpy(got).astype(np.float64)
    ref = 1.0 / (1.0 + np.exp(-xs.astype(np.float64)))
    nan_mismatch = int(np.sum(np.isnan(ref) != np.isnan(got)))
    tiny = np.float64(np.finfo(np.float32).tiny)
    normal = ~np.isnan(ref) & (ref >= tiny)
    ulp = np.spacing(ref[normal].astype(np.float32)).astype(np.float64)
    max_ulp = float(np.max(np.abs(got[normal] - ref[normal]) / ulp))
    sub = ~np.isnan(ref) & (ref < tiny)
    max_abs_sub = float(np.max(np.abs(got[sub] - ref[sub]))) if sub.any() else 0.0
    return max_ulp, max_abs_sub, nan_mismatch


def main():
    n = 1 << 28
    x = cp.random.uniform(-4, 4, n, dtype=cp.float32)
    out = cp.empty_like(x)
    copy_us = time_us(module("return a;", ""), x, out)
    print(f"{cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}, chain16 at 2^28 float32")
    print(f"{'form':48s} {'us':>8s} {'% copy':>7s} {'max ulp':>9s} {'subnormal abs':>14s} NaN")
    print(f"{'copy of the same bytes (the roof)':48s} {copy_us:8.1f} {100.0:6.1f}%")
    for name, body in FORMS.items():
        t = time_us(module(body, CHAIN), x, out)
        max_ulp, sub_abs, nan_bad = errors(module(body, "x = sig(x);"))
        print(f"{name:48s} {t:8.1f} {copy_us / t * 100:6.1f}% {max_ulp:9.2f} {sub_abs:14.2e} {nan_bad}")


if __name__ == "__main__":
    main()
