// Attention's kernels on tensor cores, for float16 and bfloat16 (Note [Attention on tensor
// cores]); the SIMT kernels for every dtype are codegen/cuda/cuda_attention.cc's.
//
// Note [Attention on tensor cores]
// FlashAttention-2's kernels (Dao, 2023), written with the warp-level mma.sync of sm_80 and
// later, four warps a block, each warp's operands of a product as m16n8k16 fragments in float32
// accumulators:
//  - Forward: a block takes 64 query rows of one head, a warp 16, and walks the keys in tiles of
//    64 staged in shared memory (cp.async: each tile's values load while its scores are
//    computed, the next tile's keys while its values are summed). The warp's scores S = Q K^T
//    come from its queries' fragments (loaded once into registers) and the keys' (ldmatrix);
//    scale, soft-cap, bias, masks and the causal mask apply there; the online softmax works on S
//    where it lies (a row's four threads combine maxima with two shuffles) and rescales the
//    output accumulator; the probabilities, rounded to the input type, are the A fragments of
//    P V as they lie (an m16n8 accumulator pair is an m16n8k16 operand), V's fragments coming
//    transposed from ldmatrix. The logsumexp is written in float32, as the SIMT forward's.
//  - Scores are taken in base 2 (times log2 e, folded into the scale) so that a probability is
//    one ex2.approx (2 ulp, without LAZYFUSE_FAST_MATH too: the probabilities round to the
//    input's half type before they are used, and the logsumexp keeps float32's 2 ulp), and a tile
//    that no mask, bias, cap, causal diagonal or end reaches (lf_plain_tile) takes the scores as
//    the products times the scale, without lf_modify's per-score tests.
//  - dq: the same walk, the next tile's keys and values loading while a tile's products run,
//    each warp's rows of q and of the result's gradient held as fragments and each row's
//    D_i = do_i . o_i read from the delta kernel's buffer; per tile S, dP = dO V^T, then
//    dS = P (dP - D) scale and dQ += dS K (K's fragments transposed).
//  - dk and dv: a block takes 64 keys of a key head, a warp 16 as fragments of K and V, and
//    walks tiles of queries of every head of the key head's group (from the block's first key
//    on, under a causal mask), staging the next tile's q and result gradient, with their
//    logsumexps and D_i, while a tile's products run; per tile S^T = K Q^T and dP^T = V dO^T,
//    then dV += P^T dO and dK += dS^T Q.
// Dropout multiplies each probability after its row's sum has it (Note [Attention]). Every
// thread adds in a fixed order and no two threads add into one value, so results do not depend
// on scheduling. Rows and tiles past the ends are zeros (staged rows) or masked (scores). Head
// dims are multiples of 16 up to kCudaAttentionMmaMaxHeadDim; past 64, dq takes tiles of 32 keys
// and dk/dv tiles of 16 queries, to keep their accumulators in registers. Shared memory holds
// the tiles, padded by 16 bytes a row so that ldmatrix's eight rows fall in different banks.
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

namespace {

// The kernels' bodies after their signatures (Note [Attention on tensor cores]).
constexpr const char* kForward = R"cuda((const AttentionArgs a) {
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
  if (last > 0) lf_stage(ks, k, 0, LF_KEYS, a.keys, a.k_row, LF_E, LF_KPAD);

  // The warp's 16 query rows as A fragments, E / 16 of them.
  lf_u32 qf[LF_E / 16][4];
  lf_fragments<LF_E>(qf, (const T*)a.q + lf_head_start(a, a.q_lead, head, 1), a.q_row, rows,
                     a.queries, t);
  float o[LF_EV / 8][4];
#pragma unroll
  for (int n = 0; n < LF_EV / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  // The rows' running maxima in base 2 (scores times log2 e) and sums of probabilities.
  float top[2] = {LF_MINUS_INF, LF_MINUS_INF}, total[2] = {0.f, 0.f};
  const float scale2 = (float)a.scale * LF_LOG2E;

  for (long long k0 = 0; k0 < last; k0 += LF_KEYS) {
    lf_copies_wait();
    __syncthreads();
    lf_stage(vs, v, k0, LF_KEYS, a.keys, a.v_row, LF_EV, LF_VPAD);
    // A warp whose rows all precede the tile (causal) or lie past the end skips its products.
    const bool busy = q0 < a.queries && (!LF_CAUSAL || k0 <= q0 + 15);
    const bool plain = lf_plain_tile(a, k0, LF_KEYS, q0);
    float s[LF_KEYS / 8][4];
    if (busy) {
#pragma unroll
      for (int n = 0; n < LF_KEYS / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
      lf_products<LF_E, LF_KEYS, LF_KPAD>(s, qf, ks, lane);
      // Modified scores in base 2, the rows' new maxima, and the probabilities.
      if (plain)
#pragma unroll
        for (int n = 0; n < LF_KEYS / 8; ++n)
#pragma unroll
          for (int x = 0; x < 4; ++x) s[n][x] *= scale2;
      else
#pragma unroll
        for (int n = 0; n < LF_KEYS / 8; ++n)
#pragma unroll
          for (int x = 0; x < 4; ++x) {
            float capped = 0.f;
            s[n][x] = lf_modify(a, head, rows[x / 2], k0 + n * 8 + 2 * t + x % 2, s[n][x], &capped) *
                      LF_LOG2E;
          }
      float rescale[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float next = top[h];
#pragma unroll
        for (int n = 0; n < LF_KEYS / 8; ++n) next = fmaxf(next, fmaxf(s[n][2 * h], s[n][2 * h + 1]));
        next = fmaxf(next, __shfl_xor_sync(0xffffffffu, next, 1));
        next = fmaxf(next, __shfl_xor_sync(0xffffffffu, next, 2));
        // A row that sees no key yet subtracts 0: its scores' ex2(-inf) is 0.
        const float base = next == LF_MINUS_INF ? 0.f : next;
        rescale[h] = lf_exp2(top[h] - base);
        float sum = 0.f;
#pragma unroll
        for (int n = 0; n < LF_KEYS / 8; ++n)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            float& x = s[n][2 * h + c];
            x = lf_exp2(x - base);
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
    if (k0 + LF_KEYS < last) lf_stage(ks, k, k0 + LF_KEYS, LF_KEYS, a.keys, a.k_row, LF_E, LF_KPAD);
    if (!busy) continue;
#pragma unroll
    for (int j = 0; j < LF_KEYS / 16; ++j) {
      // The probabilities of keys j*16.. as an A fragment, in the input type.
      lf_u32 p[4];
      lf_as_fragment(p, s + 2 * j);
      lf_products_t<LF_EV, LF_VPAD>(o, p, vs + j * 16 * LF_VPAD, lane);
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
      ((float*)a.lse)[head * a.queries + i] =
          total[h] > 0.f ? top[h] * LF_LN2 + lf_log(total[h]) : LF_MINUS_INF;
  }
}
)cuda";

// dq: a warp per 16 query rows, as the forward, walking the key tiles it sees, the next tile's
// keys and values loading while a tile's products run.
constexpr const char* kQueryGradient = R"cuda((const AttentionArgs a) {
  __shared__ __align__(16) T ks[2][LF_KEYS * LF_KPAD];
  __shared__ __align__(16) T vs[2][LF_KEYS * LF_VPAD];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const long long row_blocks = (a.queries + LF_ROWS - 1) / LF_ROWS;
  const long long head = blockIdx.x / row_blocks;
  const long long q_block = (row_blocks - 1 - blockIdx.x % row_blocks) * LF_ROWS;
  const long long q0 = q_block + warp * 16, group = a.heads / a.key_heads;
  const long long rows[2] = {q0 + g, q0 + g + 8};
  const T* k = (const T*)a.k + lf_head_start(a, a.k_lead, head, group);
  const T* v = (const T*)a.v + lf_head_start(a, a.v_lead, head, group);
  const long long last = LF_CAUSAL ? min(a.keys, q_block + LF_ROWS) : a.keys;
  if (last > 0) {
    lf_stage(ks[0], k, 0, LF_KEYS, a.keys, a.k_row, LF_E, LF_KPAD);
    lf_stage(vs[0], v, 0, LF_KEYS, a.keys, a.v_row, LF_EV, LF_VPAD);
  }
  // The warp's rows of q and of the result's gradient as A fragments; each row's logsumexp in
  // base 2 (+infinity past the last row, so that its probabilities are 0) and D_i = do_i . o_i
  // (the attention's delta kernel's).
  lf_u32 qf[LF_E / 16][4], gf[LF_EV / 16][4];
  lf_fragments<LF_E>(qf, (const T*)a.q + lf_head_start(a, a.q_lead, head, 1), a.q_row, rows,
                     a.queries, t);
  lf_fragments<LF_EV>(gf, (const T*)a.grad + lf_head_start(a, a.grad_lead, head, 1), a.grad_row,
                      rows, a.queries, t);
  float lse[2], d[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const long long i = rows[h];
    d[h] = i < a.queries ? ((const float*)a.delta)[head * a.queries + i] : 0.f;
    lse[h] = i < a.queries ? ((const float*)a.lse)[head * a.queries + i] * LF_LOG2E : LF_INF;
  }
  const float scale2 = (float)a.scale * LF_LOG2E;
  float dq[LF_E / 8][4];
#pragma unroll
  for (int n = 0; n < LF_E / 8; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.f;

  for (long long k0 = 0, buf = 0; k0 < last; k0 += LF_KEYS, buf ^= 1) {
    lf_copies_wait();
    __syncthreads();
    if (k0 + LF_KEYS < last) {
      lf_stage(ks[buf ^ 1], k, k0 + LF_KEYS, LF_KEYS, a.keys, a.k_row, LF_E, LF_KPAD);
      lf_stage(vs[buf ^ 1], v, k0 + LF_KEYS, LF_KEYS, a.keys, a.v_row, LF_EV, LF_VPAD);
    }
    if (q0 >= a.queries || (LF_CAUSAL && k0 > q0 + 15)) continue;
    const T* kt = ks[buf];
    const T* vt = vs[buf];
    // Scores S = Q K^T and dP = dO V^T of the warp's rows against the tile.
    float s[LF_KEYS / 8][4], dp[LF_KEYS / 8][4];
#pragma unroll
    for (int n = 0; n < LF_KEYS / 8; ++n)
#pragma unroll
      for (int c = 0; c < 4; ++c) s[n][c] = dp[n][c] = 0.f;
    lf_products<LF_E, LF_KEYS, LF_KPAD>(s, qf, kt, lane);
    lf_products<LF_EV, LF_KEYS, LF_VPAD>(dp, gf, vt, lane);
    // dS = P (dP - D) scale (dP dropped as the forward's P, through the softcap's tanh), into s.
    const bool plain = lf_plain_tile(a, k0, LF_KEYS, q0);
#pragma unroll
    for (int n = 0; n < LF_KEYS / 8; ++n)
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        const int h = x / 2;
        const long long i = rows[h], j = k0 + n * 8 + 2 * t + x % 2;
        float capped = 0.f, p;
        if (plain) {  // every row here sees a key: its logsumexp is finite, or +inf past the end
          p = lf_exp2(s[n][x] * scale2 - lse[h]);
        } else {
          const float score = lf_modify(a, head, i, j, s[n][x], &capped);
          p = score == LF_MINUS_INF || lse[h] == LF_MINUS_INF ? 0.f
                                                              : lf_exp2(score * LF_LOG2E - lse[h]);
        }
        float g_p = dp[n][x];
#if LF_DROPOUT
        g_p *= lf_dropout(a, head, i, j);
#endif
        float ds = p * (g_p - d[h]) * (float)a.scale;
#if LF_SOFTCAP
        ds *= 1.f - capped * capped;
#endif
        s[n][x] = ds;
      }
    // dQ += dS K.
#pragma unroll
    for (int j = 0; j < LF_KEYS / 16; ++j) {
      lf_u32 f[4];
      lf_as_fragment(f, s + 2 * j);
      lf_products_t<LF_E, LF_KPAD>(dq, f, kt + j * 16 * LF_KPAD, lane);
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const long long i = rows[h];
    if (i >= a.queries) continue;
    T* out = (T*)a.result + (head * a.queries + i) * LF_E;
#pragma unroll
    for (int n = 0; n < LF_E / 8; ++n)
      *(lf_u32*)(out + n * 8 + 2 * t) = lf_pack(dq[n][2 * h], dq[n][2 * h + 1]);
  }
}
)cuda";

// dk and dv: a block per 64 keys of a key head, a warp per 16 of them, walking tiles of
// LF_QUERIES queries of every head of its group, the next tile loading while a tile's products
// run.
constexpr const char* kKeyGradients = R"cuda((const AttentionArgs a) {
  __shared__ __align__(16) T qs[2][LF_QUERIES * LF_KPAD];
  __shared__ __align__(16) T gs[2][LF_QUERIES * LF_VPAD];
  // Each staged query's logsumexp in base 2 (+infinity past the last, so that its probabilities
  // are 0) and D_i = do_i . o_i (the attention's delta kernel's).
  __shared__ float ls[2][LF_QUERIES], ds_sum[2][LF_QUERIES];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const long long tiles = (a.keys + LF_KEYS - 1) / LF_KEYS;
  const long long key_head = blockIdx.x / tiles, k_block = blockIdx.x % tiles * LF_KEYS;
  const long long k_w = k_block + warp * 16;
  const long long keys_of[2] = {k_w + g, k_w + g + 8};
  const long long group = a.heads / a.key_heads, first_head = key_head * group;
  // The query tiles a head's walk takes: under a causal mask, from the block's first key on.
  const long long q_first = LF_CAUSAL ? k_block / LF_QUERIES * LF_QUERIES : 0;
  const long long per_head = a.queries > q_first ? (a.queries - q_first + LF_QUERIES - 1) / LF_QUERIES : 0;
  const long long walk = group * per_head;
  // Stages tile n of the walk (its head's q and result gradient rows, logsumexps and deltas)
  // into buffer `to`.
  auto stage = [&](long long tile, int to) {
    const long long head = first_head + tile / per_head;
    const long long q0 = q_first + tile % per_head * LF_QUERIES;
    lf_stage(qs[to], (const T*)a.q + lf_head_start(a, a.q_lead, head, 1), q0, LF_QUERIES,
             a.queries, a.q_row, LF_E, LF_KPAD);
    lf_stage(gs[to], (const T*)a.grad + lf_head_start(a, a.grad_lead, head, 1), q0, LF_QUERIES,
             a.queries, a.grad_row, LF_EV, LF_VPAD);
    for (int r = threadIdx.x; r < LF_QUERIES; r += LF_THREADS) {
      const long long i = q0 + r, at = head * a.queries + i;
      ls[to][r] = i < a.queries ? ((const float*)a.lse)[at] * LF_LOG2E : LF_INF;
      ds_sum[to][r] = i < a.queries ? ((const float*)a.delta)[at] : 0.f;
    }
  };
  if (walk > 0) stage(0, 0);
  // The warp's 16 keys and values as A fragments, and its sums of dK and dV.
  lf_u32 kf[LF_E / 16][4], vf[LF_EV / 16][4];
  lf_fragments<LF_E>(kf, (const T*)a.k + lf_head_start(a, a.k_lead, first_head, group), a.k_row,
                     keys_of, a.keys, t);
  lf_fragments<LF_EV>(vf, (const T*)a.v + lf_head_start(a, a.v_lead, first_head, group),
                      a.v_row, keys_of, a.keys, t);
  float dk[LF_E / 8][4], dv[LF_EV / 8][4];
#pragma unroll
  for (int n = 0; n < LF_E / 8; ++n) dk[n][0] = dk[n][1] = dk[n][2] = dk[n][3] = 0.f;
#pragma unroll
  for (int n = 0; n < LF_EV / 8; ++n) dv[n][0] = dv[n][1] = dv[n][2] = dv[n][3] = 0.f;
  const float scale2 = (float)a.scale * LF_LOG2E;

  for (long long tile = 0; tile < walk; ++tile) {
    const int buf = tile % 2;
    lf_copies_wait();
    __syncthreads();
    if (tile + 1 < walk) stage(tile + 1, buf ^ 1);
    const long long head = first_head + tile / per_head;
    const long long q0 = q_first + tile % per_head * LF_QUERIES;
    if (k_w >= a.keys || (LF_CAUSAL && q0 + LF_QUERIES - 1 < k_w)) continue;
    const T* qt = qs[buf];
    const T* gt = gs[buf];
    // S^T = K Q^T and dP^T = V dO^T: the warp's keys against the tile's queries.
    float st[LF_QUERIES / 8][4], dpt[LF_QUERIES / 8][4];
#pragma unroll
    for (int n = 0; n < LF_QUERIES / 8; ++n)
#pragma unroll
      for (int c = 0; c < 4; ++c) st[n][c] = dpt[n][c] = 0.f;
    lf_products<LF_E, LF_QUERIES, LF_KPAD>(st, kf, qt, lane);
    lf_products<LF_EV, LF_QUERIES, LF_VPAD>(dpt, vf, gt, lane);
    // P^T (dropped) into st, dS^T into dpt.
    const bool plain = lf_plain_tile(a, k_w, 16, q0);
#pragma unroll
    for (int n = 0; n < LF_QUERIES / 8; ++n)
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        const int r = n * 8 + 2 * t + x % 2;
        const long long j = keys_of[x / 2], i = q0 + r;
        const float lse = ls[buf][r];
        float capped = 0.f, p;
        if (plain) {  // as dq's: a finite logsumexp, or +inf past the end
          p = lf_exp2(st[n][x] * scale2 - lse);
        } else {
          const float score = lf_modify(a, head, i, j, st[n][x], &capped);
          p = score == LF_MINUS_INF || lse == LF_MINUS_INF ? 0.f : lf_exp2(score * LF_LOG2E - lse);
        }
        float g_p = dpt[n][x];
#if LF_DROPOUT
        const float keep = lf_dropout(a, head, i, j);
        g_p *= keep;
#endif
        float ds = p * (g_p - ds_sum[buf][r]) * (float)a.scale;
#if LF_SOFTCAP
        ds *= 1.f - capped * capped;
#endif
#if LF_DROPOUT
        p *= keep;
#endif
        st[n][x] = p;
        dpt[n][x] = ds;
      }
    // dV += P^T dO and dK += dS^T Q.
#pragma unroll
    for (int j = 0; j < LF_QUERIES / 16; ++j) {
      lf_u32 fp[4], fs[4];
      lf_as_fragment(fp, st + 2 * j);
      lf_as_fragment(fs, dpt + 2 * j);
      lf_products_t<LF_EV, LF_VPAD>(dv, fp, gt + j * 16 * LF_VPAD, lane);
      lf_products_t<LF_E, LF_KPAD>(dk, fs, qt + j * 16 * LF_KPAD, lane);
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const long long j = keys_of[h];
    if (j >= a.keys) continue;
    const long long row = key_head * a.keys + j;
    if (a.result) {
      T* out = (T*)a.result + row * LF_E;
#pragma unroll
      for (int n = 0; n < LF_E / 8; ++n)
        *(lf_u32*)(out + n * 8 + 2 * t) = lf_pack(dk[n][2 * h], dk[n][2 * h + 1]);
    }
    if (a.result2) {
      T* out = (T*)a.result2 + row * LF_EV;
#pragma unroll
      for (int n = 0; n < LF_EV / 8; ++n)
        *(lf_u32*)(out + n * 8 + 2 * t) = lf_pack(dv[n][2 * h], dv[n][2 * h + 1]);
    }
  }
}
)cuda";

// What the three kernels share after the attention prologue: shared addresses, asynchronous
// copies, ldmatrix, the product, packing, the modified score and the staging of rows.
std::string mma_helpers(const CudaAttentionSpec& spec, CudaAttentionKernel kernel,
                        const std::string& common) {
  return absl::StrCat(common, "\n#define LF_MMA_TYPE \"",
                      spec.dtype == DType::BFloat16 ? "bf16" : "f16", "\"\n#define LF_ROWS ",
                      cuda_attention_rows_per_block(spec, kernel), "\n#define LF_KEYS ",
                      cuda_attention_key_tile(spec, kernel), "\n#define LF_QUERIES ",
                      cuda_attention_mma_query_tile(spec), "\n#define LF_THREADS ",
                      cuda_attention_threads(spec, kernel), R"(
#define LF_KPAD (LF_E + 8)
#define LF_VPAD (LF_EV + 8)
#define LF_LOG2E 1.4426950408889634f
#define LF_LN2 0.6931471805599453f
#define LF_INF __int_as_float(0x7f800000)
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
__device__ __forceinline__ void lf_copies_wait() {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}
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
// 2^x on the special function unit (2 ulp; results below float's normal range flush to 0): a
// probability is one ex2 of a score in base 2, as in FlashAttention.
__device__ __forceinline__ float lf_exp2(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ lf_u32 lf_pack(float lo, float hi) {
  return (lf_u32)lf_store<T>(lo).bits | ((lf_u32)lf_store<T>(hi).bits << 16);
}

// acc[n] += the warp's A fragments `af` (16 rows by D: D / 16 of them) times rows n*8.. of
// `tile` (D wide, PAD apart) transposed, for the N / 8 products of 8 columns: S = Q K^T and its
// kind. Each ldmatrix gives the B fragments of two products (rows n*8.. and (n+1)*8.., dims
// e*16.. and e*16+8..).
template <int D, int N, int PAD>
__device__ __forceinline__ void lf_products(float (*acc)[4], const lf_u32 (*af)[4], const T* tile,
                                            int lane) {
  const int m = lane / 8;
#pragma unroll
  for (int e = 0; e < D / 16; ++e)
#pragma unroll
    for (int n = 0; n < N / 8; n += 2) {
      lf_u32 b[4];
      lf_ldmatrix(b, tile + (n * 8 + (m / 2) * 8 + lane % 8) * PAD + e * 16 + (m % 2) * 8);
      lf_mma(acc[n], af[e], b);
      lf_mma(acc[n + 1], af[e], b + 2);
    }
}

// acc[n] += the A fragment `f` (16 x 16) times the 16 rows of `rows` (W wide, PAD apart), for the
// W / 8 products of 8 columns: P V and its kind, ldmatrix transposing the rows.
template <int W, int PAD>
__device__ __forceinline__ void lf_products_t(float (*acc)[4], const lf_u32* f, const T* rows,
                                              int lane) {
  const int m = lane / 8;
#pragma unroll
  for (int n = 0; n < W / 8; n += 2) {
    lf_u32 b[4];
    lf_ldmatrix_trans(b, rows + ((m % 2) * 8 + lane % 8) * PAD + n * 8 + (m / 2) * 8);
    lf_mma(acc[n], f, b);
    lf_mma(acc[n + 1], f, b + 2);
  }
}

// Accumulators acc[0] and acc[1] (an m16n8 pair: 16 rows by 16 columns) as an A fragment in the
// input type: an m16n8 accumulator pair is an m16n8k16 operand as it lies.
__device__ __forceinline__ void lf_as_fragment(lf_u32* f, const float (*acc)[4]) {
  f[0] = lf_pack(acc[0][0], acc[0][1]);
  f[1] = lf_pack(acc[0][2], acc[0][3]);
  f[2] = lf_pack(acc[1][0], acc[1][1]);
  f[3] = lf_pack(acc[1][2], acc[1][3]);
}

// The score of query i and key j modified, from the product `s`: -infinity where not seen.
// `capped` gets the softcap's tanh, for the gradient.
__device__ __forceinline__ float lf_modify(const AttentionArgs& a, long long head, long long i,
                                          long long j, float s, float* capped) {
  if (j >= a.keys || (LF_CAUSAL && j > i)) return LF_MINUS_INF;
#if LF_MASK
  const unsigned char* mask = (const unsigned char*)a.mask + lf_head_start(a, a.mask_lead, head, 1);
  if (i < a.queries && !mask[i * a.mask_row + j * a.mask_column]) return LF_MINUS_INF;
#endif
  s *= (float)a.scale;
#if LF_SOFTCAP
  *capped = lf_tanh(s / (float)a.softcap);
  s = (float)a.softcap * *capped;
#endif
#if LF_BIAS
  const T* bias = (const T*)a.bias + lf_head_start(a, a.bias_lead, head, 1);
  if (i < a.queries) s += lf_load(bias[i * a.bias_row + j * a.bias_column]);
#endif
  return s;
}

// Whether every score of keys [first_key, first_key + keys) and queries from `first_query` on is
// the product times the scale: no mask, bias or cap, every key present and, under a causal
// mask, seen by the first query. Such tiles skip lf_modify's tests (most tiles of a long row).
__device__ __forceinline__ bool lf_plain_tile(const AttentionArgs& a, long long first_key,
                                              int keys, long long first_query) {
  return !LF_MASK && !LF_BIAS && !LF_SOFTCAP && first_key + keys <= a.keys &&
         (!LF_CAUSAL || first_key + keys - 1 <= first_query);
}

// The A fragments of 16 rows (`rows[0]` and `rows[1]`: this thread's two, zeros past `count`)
// of `base` (`stride` apart), W columns: W / 16 fragments of four registers.
template <int W>
__device__ __forceinline__ void lf_fragments(lf_u32 (*f)[4], const T* base, long long stride,
                                             const long long* rows, long long count, int t) {
#pragma unroll
  for (int s = 0; s < W / 16; ++s)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const long long i = rows[r % 2];
      const int c = s * 16 + 2 * t + (r / 2) * 8;
      f[s][r] = i < count ? *(const lf_u32*)(base + i * stride + c) : 0u;
    }
}

// Stages rows [k0, k0 + n) of `rows` (`width` elements each, `stride` apart) into `tile` (rows
// `pad` apart), zeros past `count`.
__device__ __forceinline__ void lf_stage(T* tile, const T* rows, long long k0, int n,
                                         long long count, long long stride, int width, int pad) {
  const int chunks = width / 8;
  for (int x = threadIdx.x; x < n * chunks; x += blockDim.x) {
    const int r = x / chunks, c = x % chunks * 8;
    const bool valid = k0 + r < count;
    lf_copy16(tile + r * pad + c, valid ? rows + (k0 + r) * stride + c : rows, valid);
  }
  lf_copies_commit();
}

)");
}

}  // namespace

std::string cuda_emit::attention_mma_kernel(const CudaAttentionSpec& spec,
                                            CudaAttentionKernel kernel, const std::string& common) {
  const std::string name = cuda_attention_kernel_name(spec, kernel);
  const char* body = kernel == CudaAttentionKernel::Forward         ? kForward
                     : kernel == CudaAttentionKernel::QueryGradient ? kQueryGradient
                                                                    : kKeyGradients;
  return absl::StrCat(mma_helpers(spec, kernel, common), "\n",
                      gpu_dialect().kernel(name, cuda_attention_threads(spec, kernel)), body);
}

}  // namespace lazyfuse
