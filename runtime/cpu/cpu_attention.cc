// The CPU's attention steps (Note [Attention] in ir/attention.cc): a forward with its
// logsumexp, or the gradients of q, k and v, as blocked loops on all cores that never hold more
// of the scores than one block of queries against one block of keys.
//
// Forward: a task per block of queries of one head walks the keys in blocks (skipping, under a
// causal mask, the blocks past its last query) with the online softmax. Backward: a first pass
// takes D_i = do_i . o_i for every query; then a task per block of keys of one key head walks
// every query of its group of heads for dk and dv, and a task per block of queries walks the
// keys for dq. Each task owns what it writes and adds in a fixed order, so the result's bits do
// not depend on the thread count; the probabilities are recomputed in each pass rather than
// shared through memory. Values compute in float (double for float64). Within a task, the
// products of a block of queries with a block of keys are BLAS calls (OpenBLAS, one thread
// inside the task's) and the exponentials one vector call of the CPU's kernel table over the
// block: the loops between them touch each score once.
#include <cblas.h>
#include <omp.h>

#include <cmath>
#include <limits>
#include <vector>

#include "lazyfuse/codegen/cpu/cpu_kernels.h"
#include "lazyfuse/codegen/dtype_dispatch.h"
#include "lazyfuse/codegen/philox.h"
#include "lazyfuse/ir/attention.h"
#include "lazyfuse/runtime/cpu/cpu_backend.h"
#include "lazyfuse/runtime/cpu/openmp.h"

namespace lazyfuse {
namespace {

// Queries and keys per block: large enough that a block's BLAS calls amortise their cost, small
// enough that a block's scores (32 KB in float32) stay in the L2 cache (docs/benchmarks.md,
// "Attention on the CPU").
constexpr int64_t kQueryBlock = 64;
constexpr int64_t kKeyBlock = 128;

// An operand [..., H, L, D] walked by (batch, head), row and column: where each head starts,
// and the steps between rows and columns, in elements.
struct Walk {
  const std::byte* data = nullptr;
  int64_t element = 0;  // bytes
  std::vector<int64_t> head_start;
  int64_t row = 0, column = 0;

  template <typename T>
  const T* at(int64_t head, int64_t r) const {
    return reinterpret_cast<const T*>(data) + head_start[head] + r * row;
  }
};
Walk walk(const BufferView& view) {
  Walk w;
  w.data = static_cast<const std::byte*>(view.data());
  w.element = dtype_size(view.dtype);
  const size_t rank = view.shape.size();
  w.row = view.strides[rank - 2];
  w.column = view.strides[rank - 1];
  // Every head's start, over the dims before the rows in row-major order.
  w.head_start = {0};
  for (size_t d = 0; d + 2 < rank; ++d) {
    std::vector<int64_t> next;
    next.reserve(w.head_start.size() * view.shape[d]);
    for (int64_t start : w.head_start)
      for (int64_t i = 0; i < view.shape[d]; ++i) next.push_back(start + i * view.strides[d]);
    w.head_start = std::move(next);
  }
  return w;
}

template <typename A, typename T>
A load(T x) {
  return static_cast<A>(convert_value<ComputeOf<T>>(x));
}

// What every pass reads: the sizes, the score modifiers, and the operands' walks.
struct Problem {
  AttentionSizes sizes;
  ScoreModifiers modifiers;
  Walk q, k, v, mask, bias;
  bool has_mask = false, has_bias = false;
  int64_t group = 1;  // query heads per key head
  // Dropout's draws: bits a draw, the probability as the scores' dtype holds it, and what a
  // kept probability is multiplied by.
  int dropout_bits = 24;
  double dropout_threshold = 0, keep_scale = 1;

  int64_t heads() const { return sizes.batch * sizes.heads; }
  // What dropout multiplies the probability of query i and key j of `head` by: 0 where dropped,
  // 1 / (1 - dropout) where kept (Note [Attention]).
  template <typename A>
  A dropout_factor(int64_t head, int64_t i, int64_t j) const {
    const auto u = [](int64_t x) { return static_cast<uint64_t>(x); };
    return attention_keeps(modifiers.seed, modifiers.offset, u(head), u(sizes.queries),
                           u(sizes.keys), u(i), u(j), dropout_bits, dropout_threshold)
               ? static_cast<A>(keep_scale)
               : A(0);
  }
  // Multiplies a block's values x[(i - q0) * kKeyBlock + (j - k0)] by their dropout factors.
  template <typename A>
  void drop(A* x, int64_t head, int64_t q0, int64_t q1, int64_t k0, int64_t k1) const {
    if (modifiers.dropout <= 0) return;
    for (int64_t i = q0; i < q1; ++i)
      for (int64_t j = k0; j < k1; ++j)
        x[(i - q0) * kKeyBlock + (j - k0)] *= dropout_factor<A>(head, i, j);
  }
  // The key head that query head `head` (over batch and heads) reads.
  int64_t key_head(int64_t head) const {
    const int64_t b = head / sizes.heads, h = head % sizes.heads;
    return b * sizes.key_heads + h / group;
  }
};

// c = alpha a b^T (+ c where accumulate) for row-major a [m, k], b [n, k]; with `transpose_a`,
// a is [k, m] and a^T is taken; with `plain_b`, b is [k, n] and taken as it is.
template <typename A>
void gemm(bool transpose_a, bool plain_b, int64_t m, int64_t n, int64_t k, A alpha, const A* a,
          int64_t lda, const A* b, int64_t ldb, bool accumulate, A* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  const CBLAS_TRANSPOSE ta = transpose_a ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE tb = plain_b ? CblasNoTrans : CblasTrans;
  if (k == 0) {
    if (!accumulate)
      for (int64_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, A(0));
    return;
  }
  if constexpr (std::is_same_v<A, float>)
    cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, accumulate ? 1.0f : 0.0f, c,
                ldc);
  else
    cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, accumulate ? 1.0 : 0.0, c,
                ldc);
}

// exp of n values in place, by the CPU's vector kernels (`x` padded to kCpuVectorPad).
template <typename A>
void exp_in_place(A* x, int64_t n) {
  const CpuApplyFn exp = cpu_kernel_table().apply[static_cast<int>(Op::Exp)][compute_slot(
      std::is_same_v<A, float> ? DType::Float32 : DType::Float64)];
  const void* in[] = {x};
  exp(in, x, n);
}

// Scratch of n values and the padding the vector kernels run into.
template <typename A>
std::vector<A> scratch(int64_t n) {
  return std::vector<A>(static_cast<size_t>(n + kCpuVectorPad), A(0));
}

// The scores of queries [q0, q1) of `head` against keys [k0, k1) into
// s[(i - q0) * kKeyBlock + (j - k0)]: the product of the loaded query rows `qs` and key rows
// `ks` (E values each), then the modifiers; -infinity where a key is not seen. `capped` (where
// given) gets each score's tanh for the softcap's gradient. Returns whether any score is seen.
template <typename A, typename T>
bool block_scores(const Problem& p, int64_t head, int64_t q0, int64_t q1, int64_t k0, int64_t k1,
                  const A* qs, const A* ks, A* s, A* capped = nullptr) {
  const int64_t e = p.sizes.head_dim;
  const A scale = static_cast<A>(p.modifiers.scale), cap = static_cast<A>(p.modifiers.softcap);
  gemm<A>(false, false, q1 - q0, k1 - k0, e, scale, qs, e, ks, e, false, s, kKeyBlock);
  const A minus_infinity = -std::numeric_limits<A>::infinity();
  bool any = false;
  for (int64_t i = q0; i < q1; ++i) {
    A* si = s + (i - q0) * kKeyBlock;
    for (int64_t j = k0; j < k1; ++j) {
      A score = si[j - k0];
      if (cap > 0) {
        const A t = std::tanh(score / cap);
        if (capped != nullptr) capped[(i - q0) * kKeyBlock + (j - k0)] = t;
        score = cap * t;
      }
      if (p.has_bias) score += load<A>(p.bias.at<T>(head, i)[j * p.bias.column]);
      const bool seen = (!p.modifiers.causal || j <= i) &&
                        (!p.has_mask || p.mask.at<bool>(head, i)[j * p.mask.column]);
      si[j - k0] = seen ? score : minus_infinity;
      any |= seen;
    }
  }
  return any;
}

// Loads rows [r0, r1) of `head` of an operand into `out`, `width` values each.
template <typename A, typename T>
void load_rows(const Walk& w, int64_t head, int64_t r0, int64_t r1, int64_t width, A* out) {
  for (int64_t r = r0; r < r1; ++r) {
    const T* row = w.at<T>(head, r);
    for (int64_t c = 0; c < width; ++c) out[(r - r0) * width + c] = load<A>(row[c * w.column]);
  }
}

// The keys a query block [q0, q1) may see: all, or under a causal mask those up to q1 - 1.
int64_t keys_seen(const Problem& p, int64_t q1) {
  return p.modifiers.causal ? std::min(p.sizes.keys, q1) : p.sizes.keys;
}

template <typename T>
struct Outputs {
  T* out = nullptr;             // [heads, T, Ev], contiguous
  ComputeOf<T>* lse = nullptr;  // [heads, T], contiguous
};

template <typename A, typename T>
void forward_block(const Problem& p, int64_t head, int64_t q0, int64_t q1, Outputs<T> outputs) {
  const int64_t e = p.sizes.head_dim, ev = p.sizes.value_dim, rows = q1 - q0;
  std::vector<A> qs = scratch<A>(rows * e), ks = scratch<A>(kKeyBlock * e),
                 vs = scratch<A>(kKeyBlock * ev), s = scratch<A>(rows * kKeyBlock),
                 o = scratch<A>(rows * ev);
  std::vector<A> m(rows, -std::numeric_limits<A>::infinity()), l(rows, A(0));
  load_rows<A, T>(p.q, head, q0, q1, e, qs.data());
  const int64_t key_head = p.key_head(head), last = keys_seen(p, q1);
  for (int64_t k0 = 0; k0 < last; k0 += kKeyBlock) {
    const int64_t k1 = std::min(k0 + kKeyBlock, last), keys = k1 - k0;
    load_rows<A, T>(p.k, key_head, k0, k1, e, ks.data());
    if (!block_scores<A, T>(p, head, q0, q1, k0, k1, qs.data(), ks.data(), s.data())) continue;
    load_rows<A, T>(p.v, key_head, k0, k1, ev, vs.data());
    // Each row's new maximum, its scores shifted by it (-infinity, and so 0 after exp, where
    // nothing is seen yet), and its result rescaled.
    for (int64_t i = 0; i < rows; ++i) {
      A* si = s.data() + i * kKeyBlock;
      A top = m[i];
      for (int64_t j = 0; j < keys; ++j) top = std::max(top, si[j]);
      const bool none = top == -std::numeric_limits<A>::infinity();
      for (int64_t j = 0; j < kKeyBlock; ++j)
        si[j] = none || j >= keys ? -std::numeric_limits<A>::infinity() : si[j] - top;
      const A rescale = none ? A(1) : std::exp(m[i] - top);
      for (int64_t c = 0; c < ev; ++c) o[i * ev + c] *= rescale;
      l[i] *= rescale;
      if (!none) m[i] = top;
    }
    exp_in_place(s.data(), rows * kKeyBlock);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < keys; ++j) l[i] += s[i * kKeyBlock + j];
    p.drop(s.data(), head, q0, q1, k0, k1);
    gemm<A>(false, true, rows, ev, keys, A(1), s.data(), kKeyBlock, vs.data(), ev, true, o.data(),
            ev);
  }
  for (int64_t i = 0; i < rows; ++i) {
    const A inverse = l[i] > 0 ? A(1) / l[i] : A(0);
    if (outputs.out != nullptr) {
      T* row = outputs.out + (head * p.sizes.queries + q0 + i) * ev;
      for (int64_t c = 0; c < ev; ++c) row[c] = convert_value<T>(o[i * ev + c] * inverse);
    }
    if (outputs.lse != nullptr)
      outputs.lse[head * p.sizes.queries + q0 + i] = static_cast<ComputeOf<T>>(
          l[i] > 0 ? m[i] + std::log(l[i]) : -std::numeric_limits<A>::infinity());
  }
}

template <typename T>
void run_forward(const Problem& p, Outputs<T> outputs) {
  using A = ComputeOf<T>;
  const int64_t blocks = (p.sizes.queries + kQueryBlock - 1) / kQueryBlock;
  const int64_t tasks = p.heads() * blocks;
  ParallelFailure failure;
#pragma omp parallel for schedule(dynamic) if (tasks > 1)
  for (int64_t task = 0; task < tasks; ++task) {
    if (failure.stopped()) continue;
    try {
      const int64_t head = task / blocks, q0 = (task % blocks) * kQueryBlock;
      forward_block<A, T>(p, head, q0, std::min(q0 + kQueryBlock, p.sizes.queries), outputs);
    } catch (...) {
      failure.capture();
    }
  }
  failure.rethrow_if_any();
}

// What the backward passes read besides the problem: the result's gradient and the forward's
// logsumexp, and D_i = do_i . o_i.
template <typename T>
struct Backward {
  Walk grad, out;
  const ComputeOf<T>* lse = nullptr;  // [heads, T], contiguous
  std::vector<ComputeOf<T>> d;        // [heads, T]
};

// p_ij (dropped) into s and scale * ds_ij (through the softcap) into ds for queries [q0, q1) and
// keys [k0, k1), from the loaded query rows, gradient rows (do) and the block's keys and values
// (`capped` is scratch of a block's size); false when every score is masked.
template <typename A, typename T>
bool block_gradients(const Problem& p, const Backward<T>& b, int64_t head, int64_t q0, int64_t q1,
                     int64_t k0, int64_t k1, const A* qs, const A* dos, const A* ks, const A* vs,
                     A* s, A* ds, A* capped) {
  if (!block_scores<A, T>(p, head, q0, q1, k0, k1, qs, ks, s, capped)) return false;
  const int64_t ev = p.sizes.value_dim, rows = q1 - q0, keys = k1 - k0;
  const A minus_infinity = -std::numeric_limits<A>::infinity();
  // p = exp(s - lse); a row that sees no key has lse = -infinity and p = 0.
  for (int64_t i = 0; i < rows; ++i) {
    const A lse = b.lse[head * p.sizes.queries + q0 + i];
    for (int64_t j = 0; j < kKeyBlock; ++j) {
      A& x = s[i * kKeyBlock + j];
      x = lse == minus_infinity || j >= keys ? minus_infinity : x - lse;
    }
  }
  exp_in_place(s, rows * kKeyBlock);
  // dp = do v^T (dropped as the forward's probabilities are), then ds = p (dp - D) scale, times
  // 1 - tanh^2 through a softcap; then p dropped, for dv.
  gemm<A>(false, false, rows, keys, ev, A(1), dos, ev, vs, ev, false, ds, kKeyBlock);
  p.drop(ds, head, q0, q1, k0, k1);
  const A scale = static_cast<A>(p.modifiers.scale);
  for (int64_t i = 0; i < rows; ++i) {
    const A di = b.d[head * p.sizes.queries + q0 + i];
    for (int64_t j = 0; j < keys; ++j) {
      const int64_t at = i * kKeyBlock + j;
      A g = s[at] * (ds[at] - di) * scale;
      if (p.modifiers.softcap > 0) g *= A(1) - capped[at] * capped[at];
      ds[at] = g;
    }
  }
  p.drop(s, head, q0, q1, k0, k1);
  return true;
}

// dk and dv of keys [k0, k1) of key head `key_head`, over every query of its heads.
template <typename A, typename T>
void key_block_gradients(const Problem& p, const Backward<T>& b, int64_t key_head, int64_t k0,
                         int64_t k1, T* dk, T* dv) {
  const int64_t e = p.sizes.head_dim, ev = p.sizes.value_dim, keys = k1 - k0;
  std::vector<A> qs = scratch<A>(kQueryBlock * e), dos = scratch<A>(kQueryBlock * ev),
                 ks = scratch<A>(kKeyBlock * e), vs = scratch<A>(kKeyBlock * ev),
                 s = scratch<A>(kQueryBlock * kKeyBlock), ds = scratch<A>(kQueryBlock * kKeyBlock),
                 capped = scratch<A>(kQueryBlock * kKeyBlock), dk_acc = scratch<A>(keys * e),
                 dv_acc = scratch<A>(keys * ev);
  load_rows<A, T>(p.k, key_head, k0, k1, e, ks.data());
  load_rows<A, T>(p.v, key_head, k0, k1, ev, vs.data());
  const int64_t batch = key_head / p.sizes.key_heads, kh = key_head % p.sizes.key_heads;
  for (int64_t h = kh * p.group; h < (kh + 1) * p.group; ++h) {
    const int64_t head = batch * p.sizes.heads + h;
    // Under a causal mask, queries before k0 see none of these keys.
    const int64_t first = p.modifiers.causal ? k0 / kQueryBlock * kQueryBlock : 0;
    for (int64_t q0 = first; q0 < p.sizes.queries; q0 += kQueryBlock) {
      const int64_t q1 = std::min(q0 + kQueryBlock, p.sizes.queries), rows = q1 - q0;
      load_rows<A, T>(p.q, head, q0, q1, e, qs.data());
      load_rows<A, T>(b.grad, head, q0, q1, ev, dos.data());
      if (!block_gradients<A, T>(p, b, head, q0, q1, k0, k1, qs.data(), dos.data(), ks.data(),
                                 vs.data(), s.data(), ds.data(), capped.data()))
        continue;
      // dv += p^T do, dk += ds^T q.
      gemm<A>(true, true, keys, ev, rows, A(1), s.data(), kKeyBlock, dos.data(), ev, true,
              dv_acc.data(), ev);
      gemm<A>(true, true, keys, e, rows, A(1), ds.data(), kKeyBlock, qs.data(), e, true,
              dk_acc.data(), e);
    }
  }
  for (int64_t j = 0; j < keys; ++j) {
    const int64_t row = key_head * p.sizes.keys + k0 + j;
    if (dk != nullptr)
      for (int64_t c = 0; c < e; ++c) dk[row * e + c] = convert_value<T>(dk_acc[j * e + c]);
    if (dv != nullptr)
      for (int64_t c = 0; c < ev; ++c) dv[row * ev + c] = convert_value<T>(dv_acc[j * ev + c]);
  }
}

// dq of queries [q0, q1) of `head`, over the keys they see.
template <typename A, typename T>
void query_block_gradients(const Problem& p, const Backward<T>& b, int64_t head, int64_t q0,
                           int64_t q1, T* dq) {
  const int64_t e = p.sizes.head_dim, ev = p.sizes.value_dim, rows = q1 - q0;
  std::vector<A> qs = scratch<A>(rows * e), dos = scratch<A>(rows * ev),
                 ks = scratch<A>(kKeyBlock * e), vs = scratch<A>(kKeyBlock * ev),
                 s = scratch<A>(rows * kKeyBlock), ds = scratch<A>(rows * kKeyBlock),
                 capped = scratch<A>(rows * kKeyBlock), dq_acc = scratch<A>(rows * e);
  load_rows<A, T>(p.q, head, q0, q1, e, qs.data());
  load_rows<A, T>(b.grad, head, q0, q1, ev, dos.data());
  const int64_t key_head = p.key_head(head), last = keys_seen(p, q1);
  for (int64_t k0 = 0; k0 < last; k0 += kKeyBlock) {
    const int64_t k1 = std::min(k0 + kKeyBlock, last);
    load_rows<A, T>(p.k, key_head, k0, k1, e, ks.data());
    load_rows<A, T>(p.v, key_head, k0, k1, ev, vs.data());
    if (!block_gradients<A, T>(p, b, head, q0, q1, k0, k1, qs.data(), dos.data(), ks.data(),
                               vs.data(), s.data(), ds.data(), capped.data()))
      continue;
    // dq += ds k.
    gemm<A>(false, true, rows, e, k1 - k0, A(1), ds.data(), kKeyBlock, ks.data(), e, true,
            dq_acc.data(), e);
  }
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t c = 0; c < e; ++c)
      dq[(head * p.sizes.queries + q0 + i) * e + c] = convert_value<T>(dq_acc[i * e + c]);
}

template <typename T>
void run_backward(const Problem& p, Backward<T>& b, T* dq, T* dk, T* dv) {
  using A = ComputeOf<T>;
  const int64_t ev = p.sizes.value_dim, queries = p.sizes.queries;
  b.d.assign(p.heads() * queries, A(0));
  ParallelFailure failure;
#pragma omp parallel for if (p.heads() * queries > 1024)
  for (int64_t row = 0; row < p.heads() * queries; ++row) {
    const T* o = b.out.template at<T>(row / queries, row % queries);
    const T* g = b.grad.template at<T>(row / queries, row % queries);
    A d = 0;
    for (int64_t c = 0; c < ev; ++c)
      d += load<A>(o[c * b.out.column]) * load<A>(g[c * b.grad.column]);
    b.d[row] = d;
  }
  if (dk != nullptr || dv != nullptr) {
    const int64_t blocks = (p.sizes.keys + kKeyBlock - 1) / kKeyBlock;
    const int64_t tasks = p.sizes.batch * p.sizes.key_heads * blocks;
#pragma omp parallel for schedule(dynamic) if (tasks > 1)
    for (int64_t task = 0; task < tasks; ++task) {
      if (failure.stopped()) continue;
      try {
        const int64_t key_head = task / blocks, k0 = (task % blocks) * kKeyBlock;
        key_block_gradients<A, T>(p, b, key_head, k0, std::min(k0 + kKeyBlock, p.sizes.keys), dk,
                                  dv);
      } catch (...) {
        failure.capture();
      }
    }
    failure.rethrow_if_any();
  }
  if (dq != nullptr) {
    const int64_t blocks = (queries + kQueryBlock - 1) / kQueryBlock;
    const int64_t tasks = p.heads() * blocks;
#pragma omp parallel for schedule(dynamic) if (tasks > 1)
    for (int64_t task = 0; task < tasks; ++task) {
      if (failure.stopped()) continue;
      try {
        const int64_t head = task / blocks, q0 = (task % blocks) * kQueryBlock;
        query_block_gradients<A, T>(p, b, head, q0, std::min(q0 + kQueryBlock, queries), dq);
      } catch (...) {
        failure.capture();
      }
    }
    failure.rethrow_if_any();
  }
}

// A view whose last dim is not contiguous is read through a contiguous copy: the kernels load
// whole rows.
BufferView rows_contiguous(const BufferView& view) {
  return view.strides.back() == 1 || view.shape.back() <= 1 ? view : cpu_contiguous(view);
}

}  // namespace

void cpu_attention(const Graph& graph, const Step& step, ValueBuffers& values) {
  const Node& first = graph.nodes[step.nodes.front()];
  const AttentionOperands at = attention_operands(first.op, first.attrs);
  auto operand = [&](int slot) { return rows_contiguous(*values[first.inputs[slot]]); };
  const BufferView q = operand(at.q), k = operand(at.k), v = operand(at.v);
  Problem p;
  p.sizes = attention_sizes(q.shape, k.shape, v.shape);
  p.modifiers = score_modifiers(first.attrs);
  p.group = p.sizes.heads / p.sizes.key_heads;
  p.dropout_bits = uniform_bits(q.dtype);
  p.dropout_threshold = held_as(q.dtype, p.modifiers.dropout);
  p.keep_scale = 1 / (1 - p.modifiers.dropout);
  p.q = walk(q);
  p.k = walk(k);
  p.v = walk(v);
  // A mask or bias is read one element at a time: any strides do.
  if (at.mask >= 0) p.mask = walk(*values[first.inputs[at.mask]]), p.has_mask = true;
  if (at.bias >= 0) p.bias = walk(*values[first.inputs[at.bias]]), p.has_bias = true;
  auto output = [&](Op op) { return allocate_members(graph, step, op, values); };
  dispatch_storage(q.dtype, [&]<typename T>() {
    if constexpr (std::is_floating_point_v<ComputeOf<T>>) {
      auto data = [](const std::optional<BufferView>& b) {
        return b ? static_cast<T*>(b->data()) : nullptr;
      };
      if (!is_attention_gradient(first.op)) {
        const std::optional<BufferView> out = output(Op::Attention), lse = output(Op::AttentionLse);
        run_forward<T>(p, {data(out), lse ? static_cast<ComputeOf<T>*>(lse->data()) : nullptr});
        return;
      }
      const BufferView lse = values[first.inputs[at.lse]]->is_contiguous()
                                 ? *values[first.inputs[at.lse]]
                                 : cpu_contiguous(*values[first.inputs[at.lse]]);
      Backward<T> b{walk(operand(at.grad)),
                    walk(operand(at.out)),
                    static_cast<const ComputeOf<T>*>(lse.data()),
                    {}};
      const std::optional<BufferView> dq = output(Op::AttentionGradQ),
                                      dk = output(Op::AttentionGradK),
                                      dv = output(Op::AttentionGradV);
      run_backward<T>(p, b, data(dq), data(dk), data(dv));
    }
  });
}

}  // namespace lazyfuse
