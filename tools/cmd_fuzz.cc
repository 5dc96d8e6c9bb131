// lazyfuse fuzz: random graphs over the ops, dtypes, broadcasts, views and reductions, each
// checked by check_graph (tools/replay.h): against itself evaluated unfused on its own devices,
// bit for bit (these two round every half value to its dtype after each op, so fusion may not
// change a result); for a GPU graph, against the CPU unfused, within a per-dtype tolerance; then
// against float64 under the process's half rounding, within the tolerance of the least precise
// float the value went through (rounding half values at stores, the default, those too; rounding
// after each op, values computed through float16 or bfloat16 are left to the bit-for-bit
// comparison, since a half value overflowing mid-chain parts them from float64). The tolerances
// widen with each result's conditioning (Note [Conditioning] in tools/replay.cc). A failing
// graph is shrunk (tools/shrink.h) to a small one that still fails the same way, then printed
// as IR text with the command that replays it: `lazyfuse run FILE --seed=S --check-unfused`
// (or `--check-cpu`, `--check`).
#include <cmath>
#include <functional>
#include <iostream>
#include <random>
#include <typeinfo>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lazyfuse/codegen/cpu/cpu_jit.h"
#include "lazyfuse/frontend/autograd.h"
#include "lazyfuse/frontend/functional.h"
#include "lazyfuse/frontend/tensor.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/runtime/devices.h"
#include "lazyfuse/runtime/lazy.h"
#include "tools/commands.h"
#include "tools/replay.h"
#include "tools/shrink.h"

namespace lazyfuse::tools {
namespace {

constexpr DType kDTypes[] = {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kBool};

// A random view of `t`: a transpose, a permute, a reshape that splits a dim or merges two, a
// narrow, or a contiguous copy. Chains of these under products are what attention's heads are
// made of (split by a reshape, transposed, the key transposed again, merged back).
Tensor random_view(const Tensor& t, const std::function<int(int)>& pick) {
  const int64_t rank = t.dim();
  if (rank == 0) return t;
  const int64_t d = pick(static_cast<int>(rank));
  switch (pick(6)) {
    case 0:
      return t.transpose(d, pick(static_cast<int>(rank)));
    case 1: {
      std::vector<int64_t> dims(static_cast<size_t>(rank));
      for (int64_t i = 0; i < rank; ++i) dims[i] = i;
      for (int64_t i = rank - 1; i > 0; --i)
        std::swap(dims[i], dims[pick(static_cast<int>(i + 1))]);
      return t.permute(dims);
    }
    case 2: {  // split dim d where a factor divides it
      Shape shape = t.sizes();
      for (int64_t factor : {2, 3, 4})
        if (shape[d] % factor == 0 && shape[d] > factor) {
          shape[d] /= factor;
          shape.insert(shape.begin() + d, factor);
          return t.reshape(shape);
        }
      return t.unsqueeze(d);
    }
    case 3: {  // merge dims d and d + 1
      if (d + 1 >= rank) return t.reshape({-1});
      Shape shape = t.sizes();
      shape[d] *= shape[d + 1];
      shape.erase(shape.begin() + d + 1);
      return t.reshape(shape);
    }
    case 4:
      return t.size(d) > 1 ? t.narrow(d, pick(2), t.size(d) - 1) : t;
    default:
      return t.contiguous();
  }
}

// One random graph, built through the public API and taken as IR; the same seed builds the same
// graph. The params' values are drawn only to keep each seed's graph what it has always been:
// check_graph draws its own inputs. `rows`: the innermost size is a row length the CPU's row
// programs take (Note [Row programs] in codegen/cpu/cpu_row_program.cc), drawn after the rest. One
// graph in three is a backward: its floating params require grad, and its outputs are their
// gradients of the sum of the chosen results times a random cotangent each.
Graph build(uint64_t seed, const Device& device, bool rows) {
  std::mt19937_64 rng(seed);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); };
  const bool backward = pick(3) == 0;
  std::vector<Tensor> leaves;  // those that require grad
  const int64_t sizes[] = {1, 2, 3, 5, 8, 17};
  Shape base;
  for (int d = 0, rank = 1 + pick(3); d < rank; ++d) base.push_back(sizes[pick(6)]);
  if (rows) {
    const int64_t lengths[] = {16, 64, 256};
    base.back() = lengths[pick(3)];
  }
  std::vector<Tensor> pool;
  for (int i = 0, inputs = 1 + pick(3); i < inputs; ++i) {
    Shape shape = base;
    for (int64_t& s : shape)
      if (pick(4) == 0) s = 1;  // broadcast along this dim
    if (shape.size() > 1 && pick(4) == 0) shape.erase(shape.begin());
    DType dtype = kDTypes[pick(7)];
    std::vector<double> values(numel(shape));
    for (double& v : values)
      v = dtype == kBool       ? pick(2)
          : is_integral(dtype) ? pick(10)
                               : 0.5 + static_cast<double>(rng() % 1000) / 1000;
    pool.push_back(from_vector(values, shape, TensorOptions().dtype(dtype).device(device)));
    if (backward && is_floating(dtype)) leaves.push_back(pool.back().requires_grad_());
  }
  auto any = [&]() -> Tensor& {
    return pool[pool.size() - 1 - pick(std::min<int>(4, pool.size()))];
  };
  for (int step = 0, steps = 3 + pick(10); step < steps; ++step) {
    try {
      Tensor& a = any();
      Tensor& b = any();
      Tensor out;
      switch (pick(15)) {
        case 0:
          out = a + b;
          break;
        case 1:
          out = a * b;
          break;
        case 2:
          out = a - b;
          break;
        case 3:
          out = a / (b.abs() + 1);
          break;
        case 4: {
          const int which = pick(9);
          Tensor positive = a.abs() + 0.5;
          out = which == 0   ? positive.log()
                : which == 1 ? positive.sqrt()
                : which == 2 ? a.tanh()
                : which == 3 ? a.sigmoid()
                : which == 4 ? a.sin()
                : which == 5 ? positive.log1p()
                : which == 6 ? a.tanh().expm1()
                : which == 7 ? a.erf()
                             : a.relu();
          break;
        }
        case 5:
          out = maximum(a, b);
          break;
        case 6:
          out = where(a > b, a, b);
          break;
        case 7:
          out = a.to(kDTypes[pick(7)]);
          break;
        case 8: {
          if (a.dim() == 0) continue;
          const int which = pick(4);
          const bool keepdim = pick(2);
          std::vector<int64_t> dims = {-1 - pick(static_cast<int>(a.dim()))};
          if (which == 0)
            out = a.sum(dims, keepdim);
          else if (which == 1)
            out = a.to(kFloat32).mean(dims, keepdim);
          else
            out = which == 2 ? a.max(dims[0], keepdim) : a.min(dims[0], keepdim);
          break;
        }
        case 9: {
          if (a.dim() < 2) continue;
          out = a.transpose(0, a.dim() - 1) * 1;
          break;
        }
        case 10: {
          if (a.dim() == 0 || a.size(0) < 2) continue;
          out = a.narrow(0, 1, a.size(0) - 1).exp();
          break;
        }
        case 11: {
          // a @ b where their shapes allow it, else a by its own transpose.
          if (a.dim() == 0) continue;
          const Tensor& right = pick(2)        ? b
                                : a.dim() >= 2 ? a.transpose(a.dim() - 2, a.dim() - 1)
                                               : a;
          out = a.matmul(right);
          break;
        }
        case 12: {
          // Attention's products as a model writes them: heads split off the last dim by a
          // reshape and moved before the sequence by a transpose, the key transposed again
          // (one of four spellings), scores, optionally a softmax (with score modifiers or
          // without: one attention step), a product with the values, and the heads merged
          // back by a transpose and a reshape; or scaled_dot_product_attention.
          // One in four past a block of keys of the CPU's attention step (128) and a tile of
          // the GPU's (32), at head dims up to 64.
          const bool long_rows = pick(4) == 0;
          const int64_t batch = 1 + pick(2), heads = 2 + pick(2),
                        seq = long_rows ? 33 + pick(110) : 2 + pick(3),
                        head_dim = long_rows ? 8 << pick(4) : 1 + pick(3);
          const DType dtype = kDTypes[pick(4)];  // the floating ones
          std::vector<double> values(static_cast<size_t>(batch * seq * heads * head_dim), 0.5);
          Tensor x = from_vector(values, {batch, seq, heads * head_dim},
                                 TensorOptions().dtype(dtype).device(device));
          if (backward) leaves.push_back(x.requires_grad_());
          pool.push_back(x);
          auto split = [&](const Tensor& t) {
            return t.reshape({batch, seq, heads, head_dim}).transpose(1, 2);
          };
          const Tensor q = split(pick(2) ? x : x * 2), k = split(x.sin()), v = split(x);
          const int spelling = pick(4);
          const Tensor k_t = spelling == 0   ? k.transpose(2, 3)
                             : spelling == 1 ? k.transpose(-2, -1)
                             : spelling == 2 ? k.permute({0, 1, 3, 2})
                                             : k.contiguous().transpose(2, 3);
          Tensor scores = q.matmul(k_t);
          const int form = pick(4);
          if (form == 1) {
            Tensor e = (scores - scores.max(-1, true)).exp();
            scores = e / e.sum({-1}, true);
          } else if (form == 2) {
            // Score modifiers as models write them, in the order the attention step takes
            // (Note [Attention written by hand]): a scale, a soft-cap, a bias, a mask.
            const TensorOptions positions = TensorOptions(kInt64).device(device);
            const Tensor rows = arange(seq, positions).unsqueeze(1),
                         columns = arange(seq, positions).unsqueeze(0);
            if (pick(2)) scores = scores * (1.0 / std::sqrt(static_cast<double>(head_dim)));
            if (pick(3) == 0) scores = (scores / 2.0).tanh() * 2.0;
            if (pick(3) == 0) scores = scores + (rows - columns).to(dtype).abs() * -0.25;
            const int mask = pick(3);
            if (mask == 1) scores = scores.masked_fill(columns > rows, -INFINITY);
            if (mask == 2) scores = where(rows >= columns, scores, -INFINITY);
            scores = softmax(scores, -1);
          } else if (form == 3) {
            // The API, causal or not.
            out = nn::functional::scaled_dot_product_attention(q, k, v, {}, 0.0, pick(2) == 1)
                      .transpose(1, 2)
                      .reshape({batch, seq, heads * head_dim});
            break;
          }
          out = scores.matmul(v).transpose(1, 2).reshape({batch, seq, heads * head_dim});
          break;
        }
        case 13: {
          // A chain of views, then a product of it with its own transpose (attention's
          // q @ k^T, the key through views of its own), then views of the product.
          if (a.dim() < 2) continue;
          Tensor v = a;
          for (int k = 0, n = 1 + pick(3); k < n; ++k) v = random_view(v, pick);
          if (v.dim() < 2) continue;
          Tensor w = v;
          for (int k = 0, n = pick(3); k < n; ++k) w = random_view(w, pick);
          if (w.sizes() != v.sizes()) w = v;
          out = v.matmul(w.transpose(-2, -1));
          for (int k = 0, n = pick(3); k < n; ++k) out = random_view(out, pick);
          break;
        }
        default: {
          // A softmax over the last dim (a row step) or the first (a column step), or a batch
          // norm's normalization over the first.
          if (a.dim() == 0) continue;
          const int64_t dim = a.dim() > 1 && pick(2) ? 0 : -1;
          const Tensor f = a.to(kFloat32);
          if (dim == 0 && pick(2)) {
            const Tensor centred = f - f.mean({0}, true);
            out = centred * ((centred * centred).mean({0}, true) + 1e-5).rsqrt();
          } else {
            Tensor e = (f - f.max(dim, true)).exp();
            out = e / e.sum({dim}, true);
          }
        }
      }
      pool.push_back(out);
    } catch (const Error&) {
      // An op the operands do not allow (bool negation, shapes that do not broadcast): skip.
    }
  }
  std::vector<Tensor> results;
  for (int i = 0, n = 1 + pick(2); i < n && i < static_cast<int>(pool.size()); ++i)
    results.push_back(pool[pool.size() - 1 - i]);
  std::vector<LazyRef> outputs;
  if (backward) {
    std::vector<Tensor> roots;
    for (const Tensor& r : results) {
      if (!r.requires_grad()) continue;
      std::vector<double> cotangent(static_cast<size_t>(r.numel()), 1.0);
      roots.push_back(
          (r * from_vector(cotangent, r.sizes(), TensorOptions(r.dtype()).device(device))).sum());
    }
    if (!roots.empty()) {
      for (const Tensor& g : grad(roots, leaves, {}, std::nullopt, false, /*allow_unused=*/true))
        if (g.defined()) outputs.push_back(g.value());
    }
  }
  if (outputs.empty())
    for (const Tensor& r : results) outputs.push_back(r.value());
  return build_graph(outputs).graph;
}

// How a graph fails; the shrinker keeps a step only if the graph still fails the same way.
struct Failure {
  enum class Kind { None, Mismatch, Error };
  Kind kind = Kind::None;
  std::string
      error_type;      // the exception's type (Kind::Error), or the replay flag (Kind::Mismatch)
  std::string detail;  // what to print

  bool same_as(const Failure& other) const {
    return kind == other.kind && error_type == other.error_type;
  }
};

// Whether `value` is computed through a float16 or bfloat16 value. Against float64 such a value
// is often far off without a bug: a half value overflows to infinity at 65504 (an exp of 12),
// and what follows (sin, a difference) turns that into NaN where float64 stays finite. The
// unfused comparison, bit for bit, covers those; the float64 one the rest, allowing for each
// result's conditioning (Note [Conditioning] in tools/replay.cc).
bool computed_through_half(const Graph& graph, ValueId value) {
  std::vector<bool> needed(graph.nodes.size(), false);
  needed[value] = true;
  for (size_t i = graph.nodes.size(); i-- > 0;) {
    if (!needed[i]) continue;
    const DType dtype = graph.nodes[i].dtype;
    if (is_half(dtype)) return true;
    for (ValueId in : graph.nodes[i].inputs) needed[in] = true;
  }
  return false;
}

// The flag of `lazyfuse run` that replays a check against `reference`.
const char* replay_flag(Reference reference) {
  switch (reference) {
    case Reference::Float64:
      return "--check";
    case Reference::Unfused:
      return "--check-unfused";
    case Reference::Cpu:
      return "--check-cpu";
  }
  return "";
}

// Each graph against itself unfused, bit for bit; a GPU graph against the CPU; then against
// float64.
Failure test(const Graph& graph, uint64_t seed) {
  bool on_gpu = false;
  for (const Node& node : graph.nodes) on_gpu = on_gpu || node.device.is_cuda();
  std::vector<Reference> references = {Reference::Unfused, Reference::Float64};
  if (on_gpu) references.insert(references.begin() + 1, Reference::Cpu);
  Failure failure;
  try {
    for (Reference reference : references) {
      CheckResult result = check_graph(graph, seed, reference);
      for (const OutputCheck& check : result.checks) {
        if (check.bad == 0) continue;
        if (reference == Reference::Float64 && half_rounding() == HalfRounding::EachOp &&
            computed_through_half(graph, check.value))
          continue;
        failure.kind = Failure::Kind::Mismatch;
        failure.error_type = replay_flag(reference);
        failure.detail += check.line() + "\n";
      }
      if (failure.kind != Failure::Kind::None) break;
    }
  } catch (const Error& e) {
    // An evaluation that throws on a graph the frontend accepted is a bug too.
    failure.kind = Failure::Kind::Error;
    failure.error_type = typeid(e).name();
    failure.detail = std::string(e.what()) + "\n";
  }
  return failure;
}

void report(int64_t index, uint64_t seed, const Graph& graph, const Failure& failure, bool shrink) {
  std::cout << absl::StrFormat("%s: graph %d (seed %d), %d nodes\n",
                               failure.kind == Failure::Kind::Error ? "ERROR" : "MISMATCH", index,
                               seed, graph.nodes.size())
            << failure.detail;
  Graph shown = graph;
  if (shrink) {
    ShrinkResult shrunk = shrink_graph(
        graph, [&](const Graph& candidate) { return test(candidate, seed).same_as(failure); });
    shown = shrunk.graph;
    std::cout << absl::StrFormat("shrunk from %d nodes to %d (%d steps kept of %d tried%s):\n",
                                 graph.nodes.size(), shown.nodes.size(), shrunk.accepted,
                                 shrunk.attempts,
                                 shrunk.exhausted ? "; stopped at the limit of steps" : "")
              << test(shown, seed).detail;
  }
  const std::string fault = test_fault();
  std::cout << print_graph(shown)
            << absl::StrFormat(
                   "replay: %slazyfuse run FILE --seed=%d %s  (FILE: the graph above)\n\n",
                   fault.empty() ? "" : "LAZYFUSE_TEST_FAULT=" + fault + " ", seed,
                   failure.kind == Failure::Kind::Mismatch ? failure.error_type
                                                           : "--check-unfused");
}

}  // namespace

int fuzz(uint64_t seed, int64_t graphs, const std::string& device_name, bool shrink, bool rows) {
  const Device device = resolve_device(Device(device_name));
  warn_about_test_fault();
  int64_t failures = 0, tested = 0;
  for (int64_t g = 0; g < graphs; ++g) {
    const uint64_t graph_seed = seed * 1000003 + static_cast<uint64_t>(g);
    Graph graph = build(graph_seed, device, rows);
    if (graph.outputs.empty()) continue;
    ++tested;
    Failure failure = test(graph, graph_seed);
    if (failure.kind == Failure::Kind::None) continue;
    ++failures;
    report(g, graph_seed, graph, failure, shrink);
  }
  std::cout << absl::StrFormat(
      "%d graphs evaluated on %s, fused against unfused (bit for bit)%s and float64 (half "
      "values rounded %s): %d failures\n",
      tested, device.str(), device.is_cpu() ? "" : ", the CPU",
      half_rounding() == HalfRounding::AtStores ? "at stores" : "after each op", failures);
  // What of it ran as compiled code (LAZYFUSE_CPU_JIT=always compiles every program it can).
  const CpuJitStats jit = cpu_jit_stats();
  if (jit.compiled > 0 || jit.failures > 0)
    std::cout << absl::StrFormat(
        "the CPU JIT compiled %d programs (%d of them row steps') and ran %d ranges of them%s\n",
        jit.compiled, jit.row_programs, jit.runs,
        jit.failures > 0 ? absl::StrCat("; ", jit.failures, " compiles failed: ", jit.last_failure)
                         : "");
  return failures ? 1 : 0;
}

}  // namespace lazyfuse::tools
