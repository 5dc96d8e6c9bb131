// Generating the CUDA kernel for products of few rows.
//
// Note [Products of few rows]
// A layer applied to a small batch, x (rows x inner) times a weight read transposed, is a
// product with 1 to 64 rows whose time is reading the weight once. cuBLAS tiles such a product
// as it tiles a large one, its kernel taking far longer than reading the weight once, and
// split-K adds a second kernel (docs/benchmarks.md, "Products of few rows on the H200"). This
// kernel reads the weight once, 16 bytes a load, and keeps every row's sums in registers:
//
// - A block computes `cols_per_block` columns for a block of up to 32 rows (64 rows are two
//   blocks of 32: each block reads its rows of x from L2), with `warps` warps splitting the
//   inner dim: warp w's lane l reads the chunks of 16 bytes at (c * warps + w) * 32 + l for
//   c = 0, 1, ..., each weight row (a column of the product) coalesced across the warp, and for
//   each chunk multiplies the same 16 bytes of every row of x (from L1 or L2: every block reads
//   all of x) into rows x cols_per_block float sums (fmaf, whatever --fmad says).
// - The warp's lanes then add their sums with a butterfly that halves what each lane holds at
//   each of its five steps (a reduce-scatter: 31 exchanges per 32 sums, against 160 for a
//   shuffle reduction of each), so lane l ends with sums l * (P / 32) ... of the block's P
//   (rows x cols_per_block, rounded up to a power of two, at least 32).
// - The warps' sums are added in warp order through shared memory.
// - Each result then gets the bias and relu where the kernel has an epilogue and is stored in
//   the dtype.
//
// With its bias and relu it measured faster than cuBLAS's product alone (docs/benchmarks.md,
// "Products of few rows on the H200"). A variant that copied x's slice into shared memory once
// per block and summed slices across blocks (x read from L2 a quarter as often) was slower: at
// 176 registers a lane, two warps a scheduler could not hide the shared-memory and barrier
// latency it added.
//
// Every sum is added in an order fixed by the shapes alone (the plan depends on nothing else),
// so a product has the same bits every run, graphed or not, with its epilogue or followed by
// the elementwise kernel that would otherwise add the bias: the epilogue rounds the product to
// the dtype before adding, as that kernel reads it, and adds and applies relu as it does.
// The bits differ from cuBLAS's, whose order is its own; both are within float32's rounding
// of the float64 product.
#include <algorithm>
#include <bit>
#include <string>

#include "absl/strings/str_cat.h"
#include "lazyfuse/codegen/cuda/cuda_codegen.h"
#include "lazyfuse/codegen/cuda/cuda_emit.h"
#include "lazyfuse/codegen/cuda/cuda_kernel_args.h"
#include "lazyfuse/codegen/gpu_dialect.h"

namespace lazyfuse {

std::optional<SkinnyMatmulPlan> plan_skinny_matmul(DType dtype, int64_t rows, int64_t inner,
                                                   int64_t cols, SkinnyEpilogue epilogue) {
  if (dtype != DType::Float32 && dtype != DType::Float16 && dtype != DType::BFloat16)
    return std::nullopt;
  if (rows < 1 || rows > kMaxSkinnyMatmulRows || inner < 1 || cols < 1) return std::nullopt;
  // Its reduce-scatter is written for warps of 32 lanes; other dialects take the library's.
  if (gpu_dialect().warp_size() != 32) return std::nullopt;
  SkinnyMatmulPlan plan;
  plan.dtype = dtype;
  plan.rows = static_cast<int>(rows);
  plan.epilogue = epilogue;
  plan.vector = static_cast<int>(16 / dtype_size(dtype));
  if (inner % plan.vector != 0) return std::nullopt;
  // Blocks of at most 32 rows: past that, x's traffic from L2 (every block reads its rows of
  // all of x) outweighs reading the weight once per block of rows.
  const int row_blocks = static_cast<int>((rows + 31) / 32);
  plan.rows_per_block = static_cast<int>((rows + row_blocks - 1) / row_blocks);
  // About 128 sums a lane: registers for the sums, the weight's chunks and a row's chunk.
  const int rows_pow2 = static_cast<int>(std::bit_ceil(static_cast<unsigned>(plan.rows_per_block)));
  plan.cols_per_block = std::clamp(128 / rows_pow2, 1, 8);
  // Enough warps that each lane reads a chunk or two of each column: more parallel loads in
  // flight where the inner dim allows, with at most four warps to add at the end.
  const int64_t chunks = (inner + 32 * plan.vector - 1) / (32 * plan.vector);
  plan.warps = static_cast<int>(std::clamp<int64_t>(chunks, 1, 4));
  return plan;
}

int64_t SkinnyMatmulPlan::blocks(int64_t cols) const {
  const int64_t row_blocks = (rows + rows_per_block - 1) / rows_per_block;
  return (cols + cols_per_block - 1) / cols_per_block * row_blocks;
}

std::string cuda_skinny_matmul_kernel_name(const SkinnyMatmulPlan& plan) {
  const char* epilogue = plan.epilogue == SkinnyEpilogue::None   ? ""
                         : plan.epilogue == SkinnyEpilogue::Bias ? "_bias"
                                                                 : "_bias_relu";
  return absl::StrCat("m_skinny_", dtype_ir_name(plan.dtype), "_r", plan.rows, "_c",
                      plan.cols_per_block, "_w", plan.warps, epilogue);
}

CudaSource generate_cuda_skinny_matmul(const SkinnyMatmulPlan& plan) {
  CudaSource source;
  source.kernel_name = cuda_skinny_matmul_kernel_name(plan);
  const char* t = cuda_emit::storage_type_name(plan.dtype);
  const int sums = plan.rows_per_block * plan.cols_per_block;
  const int padded = std::max(32, static_cast<int>(std::bit_ceil(static_cast<unsigned>(sums))));
  const bool bias = plan.epilogue != SkinnyEpilogue::None;
  const bool relu = plan.epilogue == SkinnyEpilogue::BiasRelu;
  const GpuDialect& dialect = gpu_dialect();
  source.source = absl::StrCat(
      dialect.prologue(),
      "\n// A product of few rows (Note [Products of few rows] in codegen/cuda/cuda_matmul.cc).\n",
      skinny_matmul_arg_layout().declare("SkinnyArgs"), "typedef ", t, " T;\n",
      "// ROWS rows in blocks of R (the last may have fewer).\n",
      "constexpr int ROWS = ", plan.rows, ", R = ", plan.rows_per_block,
      ", C = ", plan.cols_per_block, ", W = ", plan.warps, ", V = ", plan.vector, ", P = ", padded,
      ";\n",
      R"(// A step of the reduce-scatter: a lane keeps one half of its first 2 * Half sums (the
// upper where its Mask bit is set) and adds its partner's sums of that half.
template <int Half, int Mask>
)",
      dialect.device_function(), R"( void lf_keep_half(float* sum, int lane) {
  const bool upper = (lane & Mask) != 0;
#pragma unroll
  for (int i = 0; i < Half; ++i) {
    const float give = upper ? sum[i] : sum[i + Half];
    const float keep = upper ? sum[i + Half] : sum[i];
    sum[i] = keep + )",
      dialect.shuffle_xor("give", "Mask"), R"(;
  }
}
// Row r's result in column col, with the epilogue.
)",
      dialect.device_function(),
      R"( void lf_store_result(const SkinnyArgs& args, int r, long long col,
                                                float total) {
)",
      bias ? R"(  // As the elementwise kernel would: the product as stored, plus the bias, rounded.
  total = lf_load(lf_store<T>(lf_load(lf_store<T>(total)) + lf_load(((const T*)args.bias)[col])));
)"
           : "",
      relu ? "  total = lf_relu(total);\n" : "",
      "  ((T*)args.c)[(long long)r * args.cols + col] = lf_store<T>(total);\n}\n",
      dialect.kernel(source.kernel_name, 32 * plan.warps), "(const SkinnyArgs args) {\n",
      R"(  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const long long col_blocks = (args.cols + C - 1) / C;
  const long long col0 = (long long)(blockIdx.x % col_blocks) * C;
  const int row0 = (int)(blockIdx.x / col_blocks) * R;
  const T* a = (const T*)args.a + row0 * args.lda;
  // The block's columns of b; one past the last column reads the last (its sums are dropped).
  const T* b[C];
#pragma unroll
  for (int j = 0; j < C; ++j)
    b[j] = (const T*)args.b + min(col0 + j, args.cols - 1) * args.ldb;
  float sum[P];
#pragma unroll
  for (int i = 0; i < P; ++i) sum[i] = 0.0f;
  for (long long k = ((long long)warp * 32 + lane) * V; k < args.inner; k += W * 32 * V) {
    float bv[C][V];
#pragma unroll
    for (int j = 0; j < C; ++j) {
      const lf_vec<T, V> w = *(const lf_vec<T, V>*)(b[j] + k);
#pragma unroll
      for (int v = 0; v < V; ++v) bv[j][v] = lf_load(w.v[v]);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (ROWS % R != 0 && row0 + r >= ROWS) break;
      const lf_vec<T, V> x = *(const lf_vec<T, V>*)(a + r * args.lda + k);
#pragma unroll
      for (int v = 0; v < V; ++v) {
        const float xv = lf_load(x.v[v]);
#pragma unroll
        for (int j = 0; j < C; ++j) sum[r * C + j] = fmaf(xv, bv[j][v], sum[r * C + j]);
      }
    }
  }
  // Reduce-scatter across the warp (each step's sizes constants, so the sums stay registers).
  lf_keep_half<P / 2, 16>(sum, lane);
  lf_keep_half<P / 4, 8>(sum, lane);
  lf_keep_half<P / 8, 4>(sum, lane);
  lf_keep_half<P / 16, 2>(sum, lane);
  lf_keep_half<P / 32, 1>(sum, lane);
  // Lane l holds the warp's sums l * (P / 32) + i; the warps' sums are added in warp order.
  __shared__ float partial[W][P];
#pragma unroll
  for (int i = 0; i < P / 32; ++i) partial[warp][lane * (P / 32) + i] = sum[i];
  __syncthreads();
  for (int i = threadIdx.x; i < R * C; i += W * 32) {
    const long long col = col0 + i % C;
    if (col >= args.cols || row0 + i / C >= ROWS) continue;
    float total = partial[0][i];
#pragma unroll
    for (int w = 1; w < W; ++w) total += partial[w][i];
    lf_store_result(args, row0 + i / C, col, total);
  }
}
)");
  return source;
}

}  // namespace lazyfuse
