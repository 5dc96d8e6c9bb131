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
// shared through memory. Values compute in float (double for float64).
#include <omp.h>

#include <cmath>
#include <limits>
#include <vector>

#include "lazyfuse/codegen/dtype_dispatch.h"
#include "lazyfuse/ir/attention.h"
#include "lazyfuse/runtime/cpu/cpu_backend.h"
#include "lazyfuse/runtime/cpu/openmp.h"

namespace lazyfuse {
namespace {

// Queries and keys per block: a block of scores (and its probabilities) stays in the L1 cache.
constexpr int64_t kQueryBlock = 32;
constexpr int64_t kKeyBlock = 64;

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

  int64_t heads() const { return sizes.batch * sizes.heads; }
  // The key head that query head `head` (over batch and heads) reads.
  int64_t key_head(int64_t head) const {
    const int64_t b = head / sizes.heads, h = head % sizes.heads;
    return b * sizes.key_heads + h / group;
  }
};

// The scores of queries [q0, q1) of `head` against keys [k0, k1), modified, into
// s[(i - q0) * kKeyBlock + (j - k0)], from the queries' rows `qs` (already loaded, E each).
// Returns whether any score is not masked.
template <typename A, typename T>
bool block_scores(const Problem& p, int64_t head, int64_t q0, int64_t q1, int64_t k0, int64_t k1,
                  const A* qs, A* ks, A* s) {
  const int64_t e = p.sizes.head_dim, key_head = p.key_head(head);
  for (int64_t j = k0; j < k1; ++j) {
    const T* row = p.k.at<T>(key_head, j);
    for (int64_t c = 0; c < e; ++c) ks[(j - k0) * e + c] = load<A>(row[c * p.k.column]);
  }
  const A scale = static_cast<A>(p.modifiers.scale), cap = static_cast<A>(p.modifiers.softcap);
  const A minus_infinity = -std::numeric_limits<A>::infinity();
  bool any = false;
  for (int64_t i = q0; i < q1; ++i) {
    const A* qi = qs + (i - q0) * e;
    A* si = s + (i - q0) * kKeyBlock;
    for (int64_t j = k0; j < k1; ++j) {
      const A* kj = ks + (j - k0) * e;
      A dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int64_t c = 0; c < e; ++c) dot += qi[c] * kj[c];
      A score = dot * scale;
      if (cap > 0) score = cap * std::tanh(score / cap);
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
  std::vector<A> qs(rows * e), ks(kKeyBlock * e), vs(kKeyBlock * ev), s(rows * kKeyBlock);
  std::vector<A> o(rows * ev, A(0)), m(rows, -std::numeric_limits<A>::infinity()), l(rows, A(0));
  load_rows<A, T>(p.q, head, q0, q1, e, qs.data());
  const int64_t key_head = p.key_head(head), last = keys_seen(p, q1);
  for (int64_t k0 = 0; k0 < last; k0 += kKeyBlock) {
    const int64_t k1 = std::min(k0 + kKeyBlock, last);
    if (!block_scores<A, T>(p, head, q0, q1, k0, k1, qs.data(), ks.data(), s.data())) continue;
    load_rows<A, T>(p.v, key_head, k0, k1, ev, vs.data());
    for (int64_t i = 0; i < rows; ++i) {
      A* si = s.data() + i * kKeyBlock;
      A top = m[i];
      for (int64_t j = 0; j < k1 - k0; ++j) top = std::max(top, si[j]);
      if (top == -std::numeric_limits<A>::infinity()) continue;  // nothing seen yet
      const A rescale = std::exp(m[i] - top);
      A* oi = o.data() + i * ev;
      for (int64_t c = 0; c < ev; ++c) oi[c] *= rescale;
      A total = 0;
      for (int64_t j = 0; j < k1 - k0; ++j) {
        const A pj = std::exp(si[j] - top);
        total += pj;
        const A* vj = vs.data() + j * ev;
#pragma omp simd
        for (int64_t c = 0; c < ev; ++c) oi[c] += pj * vj[c];
      }
      l[i] = l[i] * rescale + total;
      m[i] = top;
    }
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

// p_ij and ds_ij (through the softcap) of queries [q0, q1) and keys [k0, k1) into s and ds,
// from the loaded query rows, gradient rows (do) and the block's keys and values; false when
// every score is masked.
template <typename A, typename T>
bool block_gradients(const Problem& p, const Backward<T>& b, int64_t head, int64_t q0, int64_t q1,
                     int64_t k0, int64_t k1, const A* qs, const A* dos, A* ks, const A* vs, A* s,
                     A* ds) {
  if (!block_scores<A, T>(p, head, q0, q1, k0, k1, qs, ks, s)) return false;
  const int64_t ev = p.sizes.value_dim;
  const A cap = static_cast<A>(p.modifiers.softcap);
  for (int64_t i = q0; i < q1; ++i) {
    const A lse = b.lse[head * p.sizes.queries + i];
    const A di = b.d[head * p.sizes.queries + i];
    const A* doi = dos + (i - q0) * ev;
    for (int64_t j = k0; j < k1; ++j) {
      A& sij = s[(i - q0) * kKeyBlock + (j - k0)];
      A& dsij = ds[(i - q0) * kKeyBlock + (j - k0)];
      const A pij = lse == -std::numeric_limits<A>::infinity() ? A(0) : std::exp(sij - lse);
      const A* vj = vs + (j - k0) * ev;
      A dp = 0;
#pragma omp simd reduction(+ : dp)
      for (int64_t c = 0; c < ev; ++c) dp += doi[c] * vj[c];
      A g = pij * (dp - di);
      if (cap > 0 && pij != 0) {
        // The capped score c tanh(x / c) is s minus the bias; its derivative is 1 - tanh^2.
        const A bias = p.has_bias ? load<A>(p.bias.at<T>(head, i)[j * p.bias.column]) : A(0);
        const A t = (sij - bias) / cap;
        g *= A(1) - t * t;
      }
      sij = pij;
      dsij = g;
    }
  }
  return true;
}

// dk and dv of keys [k0, k1) of key head `key_head`, over every query of its heads.
template <typename A, typename T>
void key_block_gradients(const Problem& p, const Backward<T>& b, int64_t key_head, int64_t k0,
                         int64_t k1, T* dk, T* dv) {
  const int64_t e = p.sizes.head_dim, ev = p.sizes.value_dim, keys = k1 - k0;
  std::vector<A> qs(kQueryBlock * e), dos(kQueryBlock * ev), ks(kKeyBlock * e), vs(keys * ev);
  std::vector<A> s(kQueryBlock * kKeyBlock), ds(kQueryBlock * kKeyBlock);
  std::vector<A> dk_acc(keys * e, A(0)), dv_acc(keys * ev, A(0));
  load_rows<A, T>(p.v, key_head, k0, k1, ev, vs.data());
  const int64_t batch = key_head / p.sizes.key_heads, kh = key_head % p.sizes.key_heads;
  const A scale = static_cast<A>(p.modifiers.scale);
  for (int64_t h = kh * p.group; h < (kh + 1) * p.group; ++h) {
    const int64_t head = batch * p.sizes.heads + h;
    // Under a causal mask, queries before k0 see none of these keys.
    const int64_t first = p.modifiers.causal ? k0 / kQueryBlock * kQueryBlock : 0;
    for (int64_t q0 = first; q0 < p.sizes.queries; q0 += kQueryBlock) {
      const int64_t q1 = std::min(q0 + kQueryBlock, p.sizes.queries);
      load_rows<A, T>(p.q, head, q0, q1, e, qs.data());
      load_rows<A, T>(b.grad, head, q0, q1, ev, dos.data());
      if (!block_gradients<A, T>(p, b, head, q0, q1, k0, k1, qs.data(), dos.data(), ks.data(),
                                 vs.data(), s.data(), ds.data()))
        continue;
      for (int64_t i = 0; i < q1 - q0; ++i)
        for (int64_t j = 0; j < keys; ++j) {
          const A pij = s[i * kKeyBlock + j], g = ds[i * kKeyBlock + j] * scale;
          A* dvj = dv_acc.data() + j * ev;
          A* dkj = dk_acc.data() + j * e;
          const A* doi = dos.data() + i * ev;
          const A* qi = qs.data() + i * e;
#pragma omp simd
          for (int64_t c = 0; c < ev; ++c) dvj[c] += pij * doi[c];
#pragma omp simd
          for (int64_t c = 0; c < e; ++c) dkj[c] += g * qi[c];
        }
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
  std::vector<A> qs(rows * e), dos(rows * ev), ks(kKeyBlock * e), vs(kKeyBlock * ev);
  std::vector<A> s(rows * kKeyBlock), ds(rows * kKeyBlock), dq_acc(rows * e, A(0));
  load_rows<A, T>(p.q, head, q0, q1, e, qs.data());
  load_rows<A, T>(b.grad, head, q0, q1, ev, dos.data());
  const A scale = static_cast<A>(p.modifiers.scale);
  const int64_t key_head = p.key_head(head), last = keys_seen(p, q1);
  for (int64_t k0 = 0; k0 < last; k0 += kKeyBlock) {
    const int64_t k1 = std::min(k0 + kKeyBlock, last);
    load_rows<A, T>(p.v, key_head, k0, k1, ev, vs.data());
    if (!block_gradients<A, T>(p, b, head, q0, q1, k0, k1, qs.data(), dos.data(), ks.data(),
                               vs.data(), s.data(), ds.data()))
      continue;
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < k1 - k0; ++j) {
        const A g = ds[i * kKeyBlock + j] * scale;
        const A* kj = ks.data() + j * e;
        A* dqi = dq_acc.data() + i * e;
#pragma omp simd
        for (int64_t c = 0; c < e; ++c) dqi[c] += g * kj[c];
      }
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
  p.q = walk(q);
  p.k = walk(k);
  p.v = walk(v);
  // A mask or bias is read one element at a time: any strides do.
  if (at.mask >= 0) p.mask = walk(*values[first.inputs[at.mask]]), p.has_mask = true;
  if (at.bias >= 0) p.bias = walk(*values[first.inputs[at.bias]]), p.has_bias = true;
  auto output = [&](Op op) -> std::optional<BufferView> {
    for (ValueId m : step.nodes)
      if (graph.nodes[m].op == op)
        return values[m] = allocate_buffer(step.device, graph.nodes[m].dtype, graph.nodes[m].shape);
    return std::nullopt;
  };
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
