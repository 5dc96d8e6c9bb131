// The attention forward on tensor cores, for float16 and bfloat16 (Note [Attention on tensor
// cores]); the other kernels of an attention step are codegen/cuda/cuda_attention.cc's.
//
// Note [Attention on tensor cores]
// FlashAttention-2's forward (Dao, 2023), written with the warp-level mma.sync of sm_80 and
// later: a block of four warps takes 64 query rows of one head, a warp 16 of them, and walks the
// keys in tiles of 64 staged in shared memory (cp.async, each tile's values loading while its
// scores are computed, the next tile's keys while its values are summed).
//  - A warp's scores for a tile, S = Q Kᵀ (16 x 64), are m16n8k16 products from its queries'
//    fragments (loaded once, from global memory, into registers) and the keys' (ldmatrix), in
//    float32; scale, soft-cap, bias, masks and the causal mask are applied to them there.
//  - The online softmax works on S where it lies: a thread holds two rows' values, a row's four
//    threads combine their maxima with two shuffles, and the output accumulator (16 x value
//    dim, float32, in registers) is rescaled by the change.
//  - The probabilities, rounded to the input type, are the A fragments of P V as they lie (an
//    m16n8 accumulator pair is an m16n8k16 operand); V's fragments come transposed by ldmatrix.
//  - The logsumexp is written in float32 for the backward, as the SIMT forward writes it.
//  - Dropout multiplies each probability after its row's sum has it (Note [Attention]).
// Every thread adds in a fixed order, so results do not depend on scheduling. Rows and tiles past
// the ends are zeros (keys) or masked (scores). Head dims are multiples of 16 up to
// kCudaAttentionMmaMaxHeadDim (registers: the output accumulator is value dim / 2 floats a
// thread); shared memory holds one key and one value tile, padded by 16 bytes a row so that
// ldmatrix's eight rows fall in different banks.
#include <string>

#include "absl/strings/str_cat.h"
#include "lazyfuse/codegen/cuda/cuda_codegen.h"
#include "lazyfuse/codegen/cuda/cuda_emit.h"
#include "lazyfuse/codegen/gpu_dialect.h"

namespace lazyfuse {

bool cuda_attention_fits_tensor_cores(DType dtype, int64_t head_dim, int64_t value_dim) {
  auto fits = [](int64_t dim) {
    return dim > 0 && dim % 16 == 0 && dim <= kCudaAttentionMmaMaxHeadDim;
  };
  return (dtype == DType::Float16 || dtype == DType::BFloat16) && fits(head_dim) && fits(value_dim);
}

std::string cuda_emit::attention_mma_forward(const CudaAttentionSpec& spec,
                                             const std::string& common) {
  const std::string name = cuda_attention_kernel_name(spec, CudaAttentionKernel::Forward);
  const char* type = spec.dtype == DType::BFloat16 ? "bf16" : "f16";
  return absl::StrCat(
      common, "\n#define LF_MMA_TYPE \"", type, R"("
#define LF_ROWS 64
#define LF_KEYS 64
#define LF_KPAD (LF_E + 8)
#define LF_VPAD (LF_EV + 8)
typedef unsigned int lf_u32;

__device__ __forceinline__ lf_u32 lf_shared_address(const void* p) {
  lf_u32 a;
  asm("{ .reg .u64 s; cvta.to.shared.u64 s, %1; cvt.u32.u64 %0, s; }" : "=r"(a) : "l"(p));
  return a;
}
// 16 bytes from global memory to shared, zeros where `valid` is false.
__device__ __forceinline__ void lf_copy16(void* shared, const void* global, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(lf_shared_address(shared)),
               "l"(global), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void lf_copies_commit() { asm volatile("cp.async.commit_group;\n"); }
__device__ __forceinline__ void lf_copies_wait() { asm volatile("cp.async.wait_group 0;\n"); }
__device__ __forceinline__ void lf_ldmatrix(lf_u32* r, const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(lf_shared_address(row)));
}
__device__ __forceinline__ void lf_ldmatrix_trans(lf_u32* r, const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(lf_shared_address(row)));
}
// c += a b for a 16 x 16 A (row-major fragments) and a 16 x 8 B (column-major), in float32.
__device__ __forceinline__ void lf_mma(float* c, const lf_u32* a, const lf_u32* b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." LF_MMA_TYPE "." LF_MMA_TYPE
               ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ lf_u32 lf_pack(float lo, float hi) {
  return (lf_u32)lf_store<T>(lo).bits | ((lf_u32)lf_store<T>(hi).bits << 16);
}

// The score of query i and key j modified, from the product `s`: -infinity where not seen.
__device__ __forceinline__ float lf_modify(const AttentionArgs& a, long long head, long long i,
                                          long long j, float s) {
  if (j >= a.keys || (LF_CAUSAL && j > i)) return LF_MINUS_INF;
#if LF_MASK
  const unsigned char* mask = (const unsigned char*)a.mask + lf_head_start(a, a.mask_lead, head, 1);
  if (i < a.queries && !mask[i * a.mask_row + j * a.mask_column]) return LF_MINUS_INF;
#endif
  s *= (float)a.scale;
#if LF_SOFTCAP
  s = (float)a.softcap * lf_tanh(s / (float)a.softcap);
#endif
#if LF_BIAS
  const T* bias = (const T*)a.bias + lf_head_start(a, a.bias_lead, head, 1);
  if (i < a.queries) s += lf_load(bias[i * a.bias_row + j * a.bias_column]);
#endif
  return s;
}

// Stages rows [k0, k0 + LF_KEYS) of `rows` (`width` elements each, `stride` apart) into `tile`
// (rows `pad` apart), zeros past `count`.
__device__ __forceinline__ void lf_stage(T* tile, const T* rows, long long k0, long long count,
                                         long long stride, int width, int pad) {
  const int chunks = width / 8;
  for (int x = threadIdx.x; x < LF_KEYS * chunks; x += blockDim.x) {
    const int r = x / chunks, c = x % chunks * 8;
    const bool valid = k0 + r < count;
    lf_copy16(tile + r * pad + c, valid ? rows + (k0 + r) * stride + c : rows, valid);
  }
  lf_copies_commit();
}

)",
      gpu_dialect().kernel(name, cuda_attention_threads(CudaAttentionKernel::Forward)),
      R"((const AttentionArgs a) {
  __shared__ __align__(16) T ks[LF_KEYS * LF_KPAD];
  __shared__ __align__(16) T vs[LF_KEYS * LF_VPAD];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const long long row_blocks = (a.queries + LF_ROWS - 1) / LF_ROWS;
  // The last row blocks first: under a causal mask they have the most keys.
  const long long head = blockIdx.x / row_blocks;
  const long long q_block = (row_blocks - 1 - blockIdx.x % row_blocks) * LF_ROWS;
  const long long q0 = q_block + warp * 16, group = a.heads / a.key_heads;
  const long long rows[2] = {q0 + g, q0 + g + 8};
  const T* k = (const T*)a.k + lf_head_start(a, a.k_lead, head, group);
  const T* v = (const T*)a.v + lf_head_start(a, a.v_lead, head, group);
  const long long last = LF_CAUSAL ? min(a.keys, q_block + LF_ROWS) : a.keys;
  if (last > 0) lf_stage(ks, k, 0, a.keys, a.k_row, LF_E, LF_KPAD);

  // The warp's 16 query rows as A fragments, E / 16 of them.
  lf_u32 qf[LF_E / 16][4];
  {
    const T* q = (const T*)a.q + lf_head_start(a, a.q_lead, head, 1);
#pragma unroll
    for (int s = 0; s < LF_E / 16; ++s)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const long long i = rows[r % 2];
        const int c = s * 16 + 2 * t + (r / 2) * 8;
        qf[s][r] = i < a.queries ? *(const lf_u32*)(q + i * a.q_row + c) : 0u;
      }
  }
  float o[LF_EV / 8][4];
#pragma unroll
  for (int n = 0; n < LF_EV / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float top[2] = {LF_MINUS_INF, LF_MINUS_INF}, total[2] = {0.f, 0.f};

  for (long long k0 = 0; k0 < last; k0 += LF_KEYS) {
    lf_copies_wait();
    __syncthreads();
    lf_stage(vs, v, k0, a.keys, a.v_row, LF_EV, LF_VPAD);
    // A warp whose rows all precede the tile (causal) or lie past the end skips its products.
    const bool busy = q0 < a.queries && (!LF_CAUSAL || k0 <= q0 + 15);
    float s[LF_KEYS / 8][4];
    if (busy) {
#pragma unroll
      for (int n = 0; n < LF_KEYS / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
      for (int e = 0; e < LF_E / 16; ++e)
#pragma unroll
        for (int n = 0; n < LF_KEYS / 8; n += 2) {
          // Keys n*8.. and (n+1)*8.., dims e*16.. and e*16+8..: B fragments of two products.
          lf_u32 b[4];
          const int m = lane / 8;
          lf_ldmatrix(b, ks + (n * 8 + (m / 2) * 8 + lane % 8) * LF_KPAD + e * 16 + (m % 2) * 8);
          lf_mma(s[n], qf[e], b);
          lf_mma(s[n + 1], qf[e], b + 2);
        }
      // Modified scores, the rows' new maxima, and the probabilities.
      float rescale[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float next = top[h];
#pragma unroll
        for (int n = 0; n < LF_KEYS / 8; ++n)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            float& x = s[n][2 * h + c];
            x = lf_modify(a, head, rows[h], k0 + n * 8 + 2 * t + c, x);
            next = fmaxf(next, x);
          }
        next = fmaxf(next, __shfl_xor_sync(0xffffffffu, next, 1));
        next = fmaxf(next, __shfl_xor_sync(0xffffffffu, next, 2));
        rescale[h] = top[h] == LF_MINUS_INF ? 0.f : lf_exp(top[h] - next);
        float sum = 0.f;
#pragma unroll
        for (int n = 0; n < LF_KEYS / 8; ++n)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            float& x = s[n][2 * h + c];
            x = x == LF_MINUS_INF ? 0.f : lf_exp(x - next);
            sum += x;
#if LF_DROPOUT
            x *= lf_dropout(a, head, rows[h], k0 + n * 8 + 2 * t + c);
#endif
          }
        total[h] = total[h] * rescale[h] + sum;
        top[h] = next;
      }
#pragma unroll
      for (int n = 0; n < LF_EV / 8; ++n) {
        o[n][0] *= rescale[0];
        o[n][1] *= rescale[0];
        o[n][2] *= rescale[1];
        o[n][3] *= rescale[1];
      }
    }
    lf_copies_wait();
    __syncthreads();
    if (k0 + LF_KEYS < last) lf_stage(ks, k, k0 + LF_KEYS, a.keys, a.k_row, LF_E, LF_KPAD);
    if (!busy) continue;
#pragma unroll
    for (int j = 0; j < LF_KEYS / 16; ++j) {
      // The probabilities of keys j*16.. as an A fragment, in the input type.
      const lf_u32 p[4] = {lf_pack(s[2 * j][0], s[2 * j][1]), lf_pack(s[2 * j][2], s[2 * j][3]),
                           lf_pack(s[2 * j + 1][0], s[2 * j + 1][1]),
                           lf_pack(s[2 * j + 1][2], s[2 * j + 1][3])};
#pragma unroll
      for (int n = 0; n < LF_EV / 8; n += 2) {
        lf_u32 b[4];
        const int m = lane / 8;
        lf_ldmatrix_trans(b, vs + (j * 16 + (m % 2) * 8 + lane % 8) * LF_VPAD + n * 8 + (m / 2) * 8);
        lf_mma(o[n], p, b);
        lf_mma(o[n + 1], p, b + 2);
      }
    }
  }
  // A row's sum over its four threads; the result and the logsumexp.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    total[h] += __shfl_xor_sync(0xffffffffu, total[h], 1);
    total[h] += __shfl_xor_sync(0xffffffffu, total[h], 2);
    const long long i = rows[h];
    if (i >= a.queries) continue;
    const float inverse = total[h] > 0.f ? 1.f / total[h] : 0.f;
    T* out = (T*)a.result + (head * a.queries + i) * LF_EV;
#pragma unroll
    for (int n = 0; n < LF_EV / 8; ++n)
      *(lf_u32*)(out + n * 8 + 2 * t) = lf_pack(o[n][2 * h] * inverse, o[n][2 * h + 1] * inverse);
    if (t == 0 && a.lse)
      ((float*)a.lse)[head * a.queries + i] = total[h] > 0.f ? top[h] + lf_log(total[h]) : LF_MINUS_INF;
  }
}
)");
}

}  // namespace lazyfuse
