// Generating CUDA source for attention steps (Note [Attention] in ir/attention.cc): the forward
// with its logsumexp, dq, and dk with dv, each a kernel specialised on the dtype, the head dims,
// the rank of the dims before the rows and the score modifiers present (sizes, strides, scale
// and cap are words: attention_arg_layout).
//
// Note [Attention on the GPU]
// Every kernel walks keys in tiles of `key_tile` keys staged in shared memory in the compute
// type, a lane per key of the tile for the scores (reading its key's row, padded by one element
// so that the lanes' rows fall in different banks) and a lane per column of the head for the
// sums over keys (the tile's probabilities shared through shared memory). So a score is one
// lane's dot product in a fixed order, the online softmax's maximum and sum are warp
// reductions, and nothing is added by two threads: the results do not depend on scheduling.
//  - Forward and dq: a warp per query row, kCudaAttentionWarps rows of one head a block sharing
//    the staged keys; under a causal mask the block stops at the tile past its last row.
//  - dk and dv: a block of one warp per tile of keys of one key head, walking every query of
//    the heads that read it (from the tile's first key on, under a causal mask), its sums kept
//    in shared memory.
// The tile is the warp's width where the kernel's shared arrays fit in kCudaAttentionSharedBytes
// (what a block may declare statically), else the largest power of two that fits (a head dim
// of 256 in float32 takes 16 keys a tile). This is
// the SIMT form: correct for every dtype and head dim up to kCudaAttentionMaxHeadDim, with float32
// arithmetic for float32 (no TF32) and float64 for float64. float16 and bfloat16 run on tensor
// cores where they can (Note [Attention on tensor cores] in cuda_attention_mma.cc).
#include <algorithm>
#include <bit>
#include <string>

#include "absl/strings/str_cat.h"
#include "lazyfuse/codegen/cuda/cuda_codegen.h"
#include "lazyfuse/codegen/cuda/cuda_emit.h"
#include "lazyfuse/codegen/cuda/cuda_kernel_args.h"
#include "lazyfuse/codegen/dtype_dispatch.h"
#include "lazyfuse/codegen/gpu_dialect.h"
#include "lazyfuse/ir/attention.h"

namespace lazyfuse {

ArgLayout attention_arg_layout(int lead) {
  ArgLayout layout;
  layout.add("heads", ArgType::Int64)
      .add("key_heads", ArgType::Int64)
      .add("queries", ArgType::Int64)
      .add("keys", ArgType::Int64)
      .add("scale", ArgType::Double)
      .add("softcap", ArgType::Double)
      .add("keep_threshold", ArgType::Double)
      .add("keep_scale", ArgType::Double)
      .add("seed", ArgType::Int64)
      .add("offset", ArgType::Int64)
      .add("q", ArgType::ConstPointer)
      .add("k", ArgType::ConstPointer)
      .add("v", ArgType::ConstPointer)
      .add("mask", ArgType::ConstPointer)
      .add("bias", ArgType::ConstPointer)
      .add("out", ArgType::ConstPointer)
      .add("grad", ArgType::ConstPointer)
      .add("lse", ArgType::Pointer)
      .add("result", ArgType::Pointer)
      .add("result2", ArgType::Pointer)
      .add("delta", ArgType::Pointer)
      .add("q_row", ArgType::Int64)
      .add("k_row", ArgType::Int64)
      .add("v_row", ArgType::Int64)
      .add("out_row", ArgType::Int64)
      .add("grad_row", ArgType::Int64)
      .add("mask_row", ArgType::Int64)
      .add("mask_column", ArgType::Int64)
      .add("bias_row", ArgType::Int64)
      .add("bias_column", ArgType::Int64)
      .add_array("lead", ArgType::Int64, lead)
      .add_array("q_lead", ArgType::Int64, lead)
      .add_array("k_lead", ArgType::Int64, lead)
      .add_array("v_lead", ArgType::Int64, lead)
      .add_array("out_lead", ArgType::Int64, lead)
      .add_array("grad_lead", ArgType::Int64, lead)
      .add_array("mask_lead", ArgType::Int64, lead)
      .add_array("bias_lead", ArgType::Int64, lead);
  return layout;
}

KernelArgs pack_attention_args(const AttentionWords& w) {
  KernelArgs words;
  for (int64_t x : {w.heads, w.key_heads, w.queries, w.keys})
    words.push_back(static_cast<uint64_t>(x));
  for (double x : {w.scale, w.softcap, w.keep_threshold, w.keep_scale})
    words.push_back(std::bit_cast<uint64_t>(x));
  for (uint64_t x : {w.seed, w.offset}) words.push_back(x);
  for (uint64_t a :
       {w.q, w.k, w.v, w.mask, w.bias, w.out, w.grad, w.lse, w.result, w.result2, w.delta})
    words.push_back(a);
  for (int64_t x : {w.q_row, w.k_row, w.v_row, w.out_row, w.grad_row, w.mask_row, w.mask_column,
                    w.bias_row, w.bias_column})
    words.push_back(static_cast<uint64_t>(x));
  for (const Strides* s : {&w.lead, &w.q_lead, &w.k_lead, &w.v_lead, &w.out_lead, &w.grad_lead,
                           &w.mask_lead, &w.bias_lead})
    for (int64_t x : *s) words.push_back(static_cast<uint64_t>(x));
  return words;
}

int cuda_attention_key_tile(const CudaAttentionSpec& spec, CudaAttentionKernel kernel) {
  // On tensor cores, dq's scores and their gradients for a tile sit in registers beside its sum:
  // past head dims of 64, half a tile (measured by ptxas: 255 registers and spills at 64 keys).
  if (spec.tensor_cores)
    return kernel == CudaAttentionKernel::QueryGradient &&
                   std::max(spec.head_dim, spec.value_dim) > 64
               ? 32
               : 64;
  const int64_t bytes = spec.dtype == DType::Float64 ? 8 : 4;  // the compute type's
  const int64_t e = spec.head_dim, ev = spec.value_dim;
  // The kernels' shared arrays, as they declare them: what a tile's key takes, and the rest.
  const bool keys = kernel == CudaAttentionKernel::KeyGradients;
  const int64_t per_key = (keys ? 2 * (e + 1 + ev + 1) + 2 : e + 1 + ev + 1 + kCudaAttentionWarps);
  const int64_t fixed = keys ? e + ev : kCudaAttentionWarps * (e + ev);
  int tile = gpu_dialect().warp_size();
  while (tile > 1 && (tile * per_key + fixed) * bytes > kCudaAttentionSharedBytes) tile /= 2;
  return tile;
}

int cuda_attention_threads(const CudaAttentionSpec& spec, CudaAttentionKernel kernel) {
  const int warp = gpu_dialect().warp_size();
  return kernel == CudaAttentionKernel::KeyGradients && !spec.tensor_cores
             ? warp
             : kCudaAttentionWarps * warp;
}

int cuda_attention_mma_query_tile(const CudaAttentionSpec& spec) {
  return std::max(spec.head_dim, spec.value_dim) <= 64 ? 64 : 16;
}

std::string cuda_attention_kernel_name(const CudaAttentionSpec& spec, CudaAttentionKernel kernel) {
  if (kernel == CudaAttentionKernel::Delta)  // reads only the result and its gradient
    return absl::StrCat("a_delta_", dtype_ir_name(spec.dtype), "_v", spec.value_dim, "_r",
                        spec.lead);
  const char* which = kernel == CudaAttentionKernel::Forward         ? "forward"
                      : kernel == CudaAttentionKernel::QueryGradient ? "dq"
                                                                     : "dkdv";
  return absl::StrCat("a_", which, "_", dtype_ir_name(spec.dtype), "_e", spec.head_dim, "_v",
                      spec.value_dim, "_r", spec.lead, spec.causal ? "_causal" : "",
                      spec.mask ? "_mask" : "", spec.bias ? "_bias" : "",
                      spec.softcap ? "_softcap" : "", spec.dropout ? "_dropout" : "",
                      spec.tensor_cores ? "_mma" : "");
}

int cuda_attention_rows_per_block(const CudaAttentionSpec& spec, CudaAttentionKernel kernel) {
  return spec.tensor_cores && kernel != CudaAttentionKernel::Delta ? 64 : kCudaAttentionWarps;
}

namespace {

// What every attention kernel shares: its constants, the words, the offsets of a head's rows,
// the warp's reductions and the modified score of query i and key j.
std::string common(const CudaAttentionSpec& spec, CudaAttentionKernel kernel) {
  const GpuDialect& d = gpu_dialect();
  const bool f64 = spec.dtype == DType::Float64;
  return absl::StrCat(
      d.prologue(), "\n", attention_arg_layout(spec.lead).declare("AttentionArgs"), "typedef ",
      cuda_emit::storage_type_name(spec.dtype), " T;\n", "typedef ", f64 ? "double" : "float",
      " A;\n", "#define LF_E ", spec.head_dim, "\n#define LF_EV ", spec.value_dim,
      "\n#define LF_LEAD ", spec.lead, "\n#define LF_WARP ", d.warp_size(), "\n#define LF_WARPS ",
      kCudaAttentionWarps, "\n#define LF_TILE ", cuda_attention_key_tile(spec, kernel),
      "\n#define LF_CAUSAL ", spec.causal ? 1 : 0, "\n#define LF_MASK ", spec.mask ? 1 : 0,
      "\n#define LF_BIAS ", spec.bias ? 1 : 0, "\n#define LF_SOFTCAP ", spec.softcap ? 1 : 0,
      "\n#define LF_DROPOUT ", spec.dropout ? 1 : 0, "\n#define LF_DROPOUT_BITS ",
      uniform_bits(spec.dtype), "\n#define LF_PER_LANE(n) (((n) + LF_WARP - 1) / LF_WARP)\n",
      f64 ? "#define LF_MINUS_INF __longlong_as_double(0xfff0000000000000ULL)\n"
          : "#define LF_MINUS_INF __int_as_float(0xff800000)\n",
      R"(
// Where head `head` (over the dims before the rows) starts in an operand with strides
// `stride`; a key or value head is the query head's over `group`.
)",
      d.device_function(), R"( long long lf_head_start(const AttentionArgs& a,
    const long long* stride, long long head, long long group) {
  long long at = 0, rest = head;
#pragma unroll
  for (int d = LF_LEAD - 1; d >= 0; --d) {
    long long c = rest % a.lead[d];
    rest /= a.lead[d];
    if (d == LF_LEAD - 1) c /= group;
    at += c * stride[d];
  }
  return at;
}
)",
      d.device_function(), " A lf_warp_max(A x) {\n#pragma unroll\n",
      "  for (int m = LF_WARP / 2; m > 0; m /= 2) x = fmax(x, ", d.shuffle_xor("x", "m"),
      ");\n  return x;\n}\n", d.device_function(), " A lf_warp_sum(A x) {\n#pragma unroll\n",
      "  for (int m = LF_WARP / 2; m > 0; m /= 2) x += ", d.shuffle_xor("x", "m"),
      ";\n  return x;\n}\n",
      R"(
// What dropout multiplies the probability of query i and key j of `head` by: 0 where dropped,
// the words' keep_scale where kept (Note [Attention], the CPU's draw).
)",
      d.device_function(), R"( A lf_dropout(const AttentionArgs& a, long long head, long long i,
    long long j) {
  return lazyfuse::attention_keeps(a.seed, a.offset, head, a.queries, a.keys, i, j,
                                   LF_DROPOUT_BITS, a.keep_threshold) ? (A)a.keep_scale : (A)0;
}

// The score of query row i (its q staged in `q`) and key row j (staged in `key`), modified;
// -infinity where the key is not seen. `capped` gets c * tanh(s / c) / c, the softcap's
// tanh, for the gradient.
)",
      d.device_function(), R"( A lf_score(const AttentionArgs& a, long long head, long long i,
    long long j, const A* q, const A* key, A* capped) {
  if (j >= a.keys || (LF_CAUSAL && j > i)) return LF_MINUS_INF;
#if LF_MASK
  const unsigned char* mask = (const unsigned char*)a.mask + lf_head_start(a, a.mask_lead, head, 1);
  if (!mask[i * a.mask_row + j * a.mask_column]) return LF_MINUS_INF;
#endif
  A s = 0;
#pragma unroll 8
  for (int c = 0; c < LF_E; ++c) s += q[c] * key[c];
  s *= (A)a.scale;
#if LF_SOFTCAP
  const A t = lf_tanh(s / (A)a.softcap);
  *capped = t;
  s = (A)a.softcap * t;
#endif
#if LF_BIAS
  const T* bias = (const T*)a.bias + lf_head_start(a, a.bias_lead, head, 1);
  s += lf_load(bias[i * a.bias_row + j * a.bias_column]);
#endif
  return s;
}

// Stages keys [k0, k0 + LF_TILE) of a key head's k and v rows, zeros past the last key.
)",
      d.device_function(), R"( void lf_stage_keys(const AttentionArgs& a, const T* k,
    const T* v, long long k0, A (*ks)[LF_E + 1], A (*vs)[LF_EV + 1], int thread, int threads) {
  for (int x = thread; x < LF_TILE * LF_E; x += threads) {
    const int j = x / LF_E, c = x % LF_E;
    ks[j][c] = k0 + j < a.keys ? lf_load(k[(k0 + j) * a.k_row + c]) : (A)0;
  }
  for (int x = thread; x < LF_TILE * LF_EV; x += threads) {
    const int j = x / LF_EV, c = x % LF_EV;
    vs[j][c] = k0 + j < a.keys ? lf_load(v[(k0 + j) * a.v_row + c]) : (A)0;
  }
}
)");
}

// A warp per query row; the forward keeps the row's running maximum, sum and result, dq its
// sum over keys.
std::string query_rows_kernel(const CudaAttentionSpec& spec, CudaAttentionKernel kernel) {
  const bool forward = kernel == CudaAttentionKernel::Forward;
  const std::string name = cuda_attention_kernel_name(spec, kernel);
  return absl::StrCat(common(spec, kernel), "\n",
                      gpu_dialect().kernel(name, cuda_attention_threads(spec, kernel)),
                      R"((const AttentionArgs a) {
  __shared__ A ks[LF_TILE][LF_E + 1];
  __shared__ A vs[LF_TILE][LF_EV + 1];
  __shared__ A qs[LF_WARPS][LF_E];
  __shared__ A gs[LF_WARPS][LF_EV];
  __shared__ A ps[LF_WARPS][LF_TILE];
  const int warp = threadIdx.x / LF_WARP, lane = threadIdx.x % LF_WARP;
  const long long row_blocks = (a.queries + LF_WARPS - 1) / LF_WARPS;
  const long long head = blockIdx.x / row_blocks, q0 = blockIdx.x % row_blocks * LF_WARPS;
  const long long i = q0 + warp, group = a.heads / a.key_heads;
  const bool active = i < a.queries;
  const T* k = (const T*)a.k + lf_head_start(a, a.k_lead, head, group);
  const T* v = (const T*)a.v + lf_head_start(a, a.v_lead, head, group);
  if (active) {
    const T* q = (const T*)a.q + lf_head_start(a, a.q_lead, head, 1) + i * a.q_row;
    for (int c = lane; c < LF_E; c += LF_WARP) qs[warp][c] = lf_load(q[c]);
  }
  A acc[LF_PER_LANE()",
                      forward ? "LF_EV" : "LF_E", R"()];
#pragma unroll
  for (int m = 0; m < LF_PER_LANE()",
                      forward ? "LF_EV" : "LF_E", R"(); ++m) acc[m] = 0;
)",
                      forward ? R"(  A top = LF_MINUS_INF, total = 0;
)"
                              : R"(  // do_i staged, D_i = do_i . o_i and the forward's logsumexp.
  A d_i = 0, lse = LF_MINUS_INF;
  if (active) {
    const T* g = (const T*)a.grad + lf_head_start(a, a.grad_lead, head, 1) + i * a.grad_row;
    const T* o = (const T*)a.out + lf_head_start(a, a.out_lead, head, 1) + i * a.out_row;
    for (int c = lane; c < LF_EV; c += LF_WARP) {
      gs[warp][c] = lf_load(g[c]);
      d_i += gs[warp][c] * lf_load(o[c]);
    }
    d_i = lf_warp_sum(d_i);
    lse = ((const A*)a.lse)[head * a.queries + i];
  }
)",
                      R"(  const long long last = LF_CAUSAL ? min(a.keys, q0 + LF_WARPS) : a.keys;
  for (long long k0 = 0; k0 < last; k0 += LF_TILE) {
    __syncthreads();
    lf_stage_keys(a, k, v, k0, ks, vs, threadIdx.x, blockDim.x);
    __syncthreads();
    if (!active) continue;
    A capped = 0, s = LF_MINUS_INF;
    if (lane < LF_TILE) s = lf_score(a, head, i, k0 + lane, qs[warp], ks[lane], &capped);
)",
                      forward ? R"(    const A next = fmax(top, lf_warp_max(s));
    const A p = s == LF_MINUS_INF ? (A)0 : lf_exp(s - next);
    const A rescale = top == LF_MINUS_INF ? (A)0 : lf_exp(top - next);
    total = total * rescale + lf_warp_sum(p);
    top = next;
#if LF_DROPOUT
    if (lane < LF_TILE) ps[warp][lane] = p * lf_dropout(a, head, i, k0 + lane);
#else
    if (lane < LF_TILE) ps[warp][lane] = p;
#endif
    __syncwarp();
#pragma unroll
    for (int m = 0; m < LF_PER_LANE(LF_EV); ++m) {
      const int c = lane + m * LF_WARP;
      if (c >= LF_EV) break;
      A sum = acc[m] * rescale;
      for (int j = 0; j < LF_TILE; ++j) sum += ps[warp][j] * vs[j][c];
      acc[m] = sum;
    }
    __syncwarp();
  }
  if (!active) return;
  const A inverse = total > 0 ? (A)1 / total : (A)0;
  T* out = (T*)a.result + (head * a.queries + i) * LF_EV;
#pragma unroll
  for (int m = 0; m < LF_PER_LANE(LF_EV); ++m) {
    const int c = lane + m * LF_WARP;
    if (c < LF_EV) out[c] = lf_store<T>(acc[m] * inverse);
  }
  if (lane == 0 && a.lse)
    ((A*)a.lse)[head * a.queries + i] = total > 0 ? top + lf_log(total) : LF_MINUS_INF;
}
)"
                              : R"(    A ds = 0;
    if (s != LF_MINUS_INF && lse != LF_MINUS_INF) {
      const A p = lf_exp(s - lse);
      A dp = 0;
      for (int c = 0; c < LF_EV; ++c) dp += gs[warp][c] * vs[lane][c];
#if LF_DROPOUT
      dp *= lf_dropout(a, head, i, k0 + lane);
#endif
      ds = p * (dp - d_i) * (A)a.scale;
#if LF_SOFTCAP
      ds *= (A)1 - capped * capped;
#endif
    }
    if (lane < LF_TILE) ps[warp][lane] = ds;
    __syncwarp();
#pragma unroll
    for (int m = 0; m < LF_PER_LANE(LF_E); ++m) {
      const int c = lane + m * LF_WARP;
      if (c >= LF_E) break;
      A sum = acc[m];
      for (int j = 0; j < LF_TILE; ++j) sum += ps[warp][j] * ks[j][c];
      acc[m] = sum;
    }
    __syncwarp();
  }
  if (!active) return;
  T* dq = (T*)a.result + (head * a.queries + i) * LF_E;
#pragma unroll
  for (int m = 0; m < LF_PER_LANE(LF_E); ++m) {
    const int c = lane + m * LF_WARP;
    if (c < LF_E) dq[c] = lf_store<T>(acc[m]);
  }
}
)");
}

// A block of one warp per tile of keys of one key head: dk and dv summed over the queries of
// its group of heads, in shared memory.
std::string key_tile_kernel(const CudaAttentionSpec& spec) {
  const std::string name = cuda_attention_kernel_name(spec, CudaAttentionKernel::KeyGradients);
  return absl::StrCat(
      common(spec, CudaAttentionKernel::KeyGradients), "\n",
      gpu_dialect().kernel(name, cuda_attention_threads(spec, CudaAttentionKernel::KeyGradients)),
      R"((const AttentionArgs a) {
  __shared__ A ks[LF_TILE][LF_E + 1];
  __shared__ A vs[LF_TILE][LF_EV + 1];
  __shared__ A dk[LF_TILE][LF_E + 1];
  __shared__ A dv[LF_TILE][LF_EV + 1];
  __shared__ A qs[LF_E];
  __shared__ A gs[LF_EV];
  __shared__ A ps[LF_TILE];
  __shared__ A dss[LF_TILE];
  const int lane = threadIdx.x;
  const long long tiles = (a.keys + LF_TILE - 1) / LF_TILE;
  const long long key_head = blockIdx.x / tiles, k0 = blockIdx.x % tiles * LF_TILE;
  const long long group = a.heads / a.key_heads;
  // The first query head of the group, over the dims before the rows.
  const long long first_head = key_head * group;
  const T* k = (const T*)a.k + lf_head_start(a, a.k_lead, first_head, group);
  const T* v = (const T*)a.v + lf_head_start(a, a.v_lead, first_head, group);
  lf_stage_keys(a, k, v, k0, ks, vs, lane, LF_WARP);
  for (int x = lane; x < LF_TILE * (LF_E + 1); x += LF_WARP) (&dk[0][0])[x] = 0;
  for (int x = lane; x < LF_TILE * (LF_EV + 1); x += LF_WARP) (&dv[0][0])[x] = 0;
  __syncwarp();
  for (long long head = first_head; head < first_head + group; ++head) {
    const T* q = (const T*)a.q + lf_head_start(a, a.q_lead, head, 1);
    const T* g = (const T*)a.grad + lf_head_start(a, a.grad_lead, head, 1);
    const T* o = (const T*)a.out + lf_head_start(a, a.out_lead, head, 1);
    for (long long i = LF_CAUSAL ? k0 : 0; i < a.queries; ++i) {
      A d_i = 0;
      for (int c = lane; c < LF_E; c += LF_WARP) qs[c] = lf_load(q[i * a.q_row + c]);
      for (int c = lane; c < LF_EV; c += LF_WARP) {
        gs[c] = lf_load(g[i * a.grad_row + c]);
        d_i += gs[c] * lf_load(o[i * a.out_row + c]);
      }
      d_i = lf_warp_sum(d_i);
      const A lse = ((const A*)a.lse)[head * a.queries + i];
      __syncwarp();
      A capped = 0, s = LF_MINUS_INF, p = 0, ds = 0;
      if (lane < LF_TILE) s = lf_score(a, head, i, k0 + lane, qs, ks[lane], &capped);
      if (s != LF_MINUS_INF && lse != LF_MINUS_INF) {
        p = lf_exp(s - lse);
        A dp = 0;
        for (int c = 0; c < LF_EV; ++c) dp += gs[c] * vs[lane][c];
#if LF_DROPOUT
        const A keep = lf_dropout(a, head, i, k0 + lane);
        dp *= keep;
#endif
        ds = p * (dp - d_i) * (A)a.scale;
#if LF_SOFTCAP
        ds *= (A)1 - capped * capped;
#endif
#if LF_DROPOUT
        p *= keep;
#endif
      }
      if (lane < LF_TILE) {
        ps[lane] = p;
        dss[lane] = ds;
      }
      __syncwarp();
      for (int c = lane; c < LF_E; c += LF_WARP)
        for (int j = 0; j < LF_TILE; ++j) dk[j][c] += dss[j] * qs[c];
      for (int c = lane; c < LF_EV; c += LF_WARP)
        for (int j = 0; j < LF_TILE; ++j) dv[j][c] += ps[j] * gs[c];
      __syncwarp();
    }
  }
  T* dk_out = (T*)a.result;
  T* dv_out = (T*)a.result2;
  for (int j = 0; j < LF_TILE && k0 + j < a.keys; ++j) {
    const long long row = key_head * a.keys + k0 + j;
    if (dk_out)
      for (int c = lane; c < LF_E; c += LF_WARP) dk_out[row * LF_E + c] = lf_store<T>(dk[j][c]);
    if (dv_out)
      for (int c = lane; c < LF_EV; c += LF_WARP) dv_out[row * LF_EV + c] = lf_store<T>(dv[j][c]);
  }
}
)");
}

// A warp per query row of every head: D_i = do_i . o_i in the compute type, its lanes' sums
// added in a fixed order. It reads the result and its gradient alone, so its source is made from
// what its name holds (dtype, value dim, lead dims): one name, one text, whatever the score
// modifiers, the head dim or the tensor cores of the kernels beside it.
std::string delta_kernel(const CudaAttentionSpec& spec) {
  CudaAttentionSpec named;
  named.dtype = spec.dtype;
  named.head_dim = named.value_dim = spec.value_dim;
  named.lead = spec.lead;
  const std::string name = cuda_attention_kernel_name(named, CudaAttentionKernel::Delta);
  return absl::StrCat(
      common(named, CudaAttentionKernel::Delta), "\n",
      gpu_dialect().kernel(name, cuda_attention_threads(named, CudaAttentionKernel::Delta)),
      R"((const AttentionArgs a) {
  const int warp = threadIdx.x / LF_WARP, lane = threadIdx.x % LF_WARP;
  long long heads = 1;
#pragma unroll
  for (int d = 0; d < LF_LEAD; ++d) heads *= a.lead[d];
  const long long row = (long long)blockIdx.x * LF_WARPS + warp;
  if (row >= heads * a.queries) return;
  const long long head = row / a.queries, i = row % a.queries;
  const T* g = (const T*)a.grad + lf_head_start(a, a.grad_lead, head, 1) + i * a.grad_row;
  const T* o = (const T*)a.out + lf_head_start(a, a.out_lead, head, 1) + i * a.out_row;
  A sum = 0;
  for (int c = lane; c < LF_EV; c += LF_WARP) sum += lf_load(g[c]) * lf_load(o[c]);
  sum = lf_warp_sum(sum);
  if (lane == 0) ((A*)a.delta)[row] = sum;
}
)");
}

}  // namespace

CudaAttentionSpec cuda_attention_spec(const Graph& graph, const Step& step) {
  const Node& first = graph.nodes[step.nodes.front()];
  const AttentionOperands at = attention_operands(first.op, first.attrs);
  const Shape& q = graph.nodes[first.inputs[at.q]].shape;
  const AttentionSizes sizes = attention_sizes(q, graph.nodes[first.inputs[at.k]].shape,
                                               graph.nodes[first.inputs[at.v]].shape);
  const ScoreModifiers modifiers = score_modifiers(first.attrs);
  CudaAttentionSpec spec;
  spec.dtype = graph.nodes[first.inputs[at.q]].dtype;
  spec.head_dim = sizes.head_dim;
  spec.value_dim = sizes.value_dim;
  spec.lead = q.size() == 2 ? 1 : static_cast<int>(q.size()) - 2;
  spec.causal = modifiers.causal;
  spec.mask = at.mask >= 0;
  spec.bias = at.bias >= 0;
  spec.softcap = modifiers.softcap > 0;
  spec.dropout = modifiers.dropout > 0;
  return spec;
}

std::vector<CudaAttentionKernel> cuda_attention_kernels(const Graph& graph, const Step& step) {
  bool dq = false, dkdv = false;
  for (ValueId m : step.nodes) {
    dq |= graph.nodes[m].op == Op::AttentionGradQ;
    dkdv |= graph.nodes[m].op == Op::AttentionGradK || graph.nodes[m].op == Op::AttentionGradV;
  }
  if (!dq && !dkdv) return {CudaAttentionKernel::Forward};
  std::vector<CudaAttentionKernel> kernels;
  if (dq) kernels.push_back(CudaAttentionKernel::QueryGradient);
  if (dkdv) kernels.push_back(CudaAttentionKernel::KeyGradients);
  return kernels;
}

CudaSource generate_cuda_attention(const CudaAttentionSpec& spec, CudaAttentionKernel kernel) {
  CudaSource source;
  source.kernel_name = cuda_attention_kernel_name(spec, kernel);
  if (kernel == CudaAttentionKernel::Delta)
    source.source = delta_kernel(spec);
  else if (spec.tensor_cores)
    source.source = cuda_emit::attention_mma_kernel(spec, kernel, common(spec, kernel));
  else
    source.source = kernel == CudaAttentionKernel::KeyGradients ? key_tile_kernel(spec)
                                                                : query_rows_kernel(spec, kernel);
  return source;
}

}  // namespace lazyfuse
