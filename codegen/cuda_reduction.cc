// Generating CUDA source for row reductions: a strided loop per thread, warp shuffles, then a
// tree over the block's warps in shared memory.
#include "absl/strings/str_cat.h"
#include "codegen/cuda_codegen.h"
#include "ir/errors.h"

namespace lazyfuse {
namespace {

const char* type_name(DType dtype) {
  switch (dtype) {
    case DType::Bool:
      return "bool";
    case DType::Int32:
      return "int32_t";
    case DType::Int64:
      return "int64_t";
    case DType::Float16:
      return "lf_f16";
    case DType::BFloat16:
      return "lf_bf16";
    case DType::Float32:
      return "float";
    case DType::Float64:
      return "double";
  }
  return "?";
}

}  // namespace

DType cuda_reduction_accumulator(Op op, DType in) {
  if (op == Op::Sum || op == Op::Mean) return is_floating(in) ? DType::Float64 : DType::Int64;
  return in == DType::Bool ? DType::Int64 : compute_dtype(in);
}

CudaSource generate_cuda_reduction(Op op, DType in, DType out) {
  if (!is_reduction(op)) throw VerifierError(absl::StrCat(op_name(op), " is not a reduction"));
  const DType acc = cuda_reduction_accumulator(op, in);
  const char* acc_type = type_name(acc);
  std::string identity, combine;
  switch (op) {
    case Op::Sum:
    case Op::Mean:
      identity = "0";
      combine = "x + y";
      break;
    case Op::Max:
      identity = is_floating(acc) ? "-__longlong_as_double(0x7ff0000000000000LL)"
                                  : "(-9223372036854775807LL - 1)";
      combine = "lf_max(x, y)";
      break;
    default:
      identity =
          is_floating(acc) ? "__longlong_as_double(0x7ff0000000000000LL)" : "9223372036854775807LL";
      combine = "lf_min(x, y)";
  }
  CudaSource source;
  source.kernel_name =
      absl::StrCat("r_", op_name(op), "_", dtype_ir_name(in), "_", dtype_ir_name(out));
  std::string& s = source.source;
  s = cuda_prologue();
  absl::StrAppend(&s, R"(
struct ReduceArgs {
  const void* in;
  void* out;
  long long rows, columns, chunk, chunks;
  double divisor;
};

__device__ __forceinline__ )",
                  acc_type, R"( lf_combine()", acc_type, " x, ", acc_type, " y) { return ", combine,
                  R"(; }

extern "C" __global__ void __launch_bounds__()",
                  kCudaReduceThreads, ") ", source.kernel_name, R"((const ReduceArgs args) {
  const )",
                  type_name(in), R"(* __restrict__ in = (const )", type_name(in), R"(*)args.in;
  const long long row = blockIdx.x / args.chunks, chunk = blockIdx.x % args.chunks;
  const long long begin = chunk * args.chunk;
  const long long end = min(args.columns, begin + args.chunk);
  const )",
                  type_name(in), R"(* __restrict__ base = in + row * args.columns;
  )",
                  acc_type, " acc = (", acc_type, ")(", identity, R"();
  for (long long j = begin + threadIdx.x; j < end; j += blockDim.x)
    acc = lf_combine(acc, ()",
                  acc_type, R"()lf_load(base[j]));
  // Within each warp, then across the block's warps.
  for (int offset = 16; offset > 0; offset /= 2) acc = lf_combine(acc, __shfl_down_sync(0xffffffffu, acc, offset));
  __shared__ )",
                  acc_type, R"( warp_results[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_results[warp] = acc;
  __syncthreads();
  if (warp != 0) return;
  acc = lane < (int)(blockDim.x / 32) ? warp_results[lane] : ()",
                  acc_type, ")(", identity, R"();
  for (int offset = 16; offset > 0; offset /= 2) acc = lf_combine(acc, __shfl_down_sync(0xffffffffu, acc, offset));
  if (lane != 0) return;
  if (args.chunks == 1) {
)",
                  op == Op::Mean ? "    acc = acc / args.divisor;\n" : "", "    ((", type_name(out),
                  "*)args.out)[row] = lf_store<", type_name(out), R"(>(acc);
  } else {
    (()",
                  acc_type, R"(*)args.out)[row * args.chunks + chunk] = acc;
  }
}
)");
  return source;
}

}  // namespace lazyfuse
