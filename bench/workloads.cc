// The workloads of docs/benchmarks.md, written with primitive ops.
#include "bench/workloads.h"

namespace lazyfuse::bench {
namespace {

Tensor gelu(const Tensor& x) {
  return x * 0.5 * (1 + (0.7978845608 * (x + 0.044715 * x * x * x)).tanh());
}

// A normalization over rows of `width`, affine where `bias` says (LayerNorm) or scaled only
// (RMSNorm): x, weight and bias in; one output.
Workload row_norm(std::string name, int64_t width, bool layer) {
  return {
      std::move(name),
      [width, layer](int64_t n) {
        std::vector<Shape> shapes = {{n / width, width}, {width}};
        if (layer) shapes.push_back({width});
        return shapes;
      },
      [width, layer](const std::vector<Tensor>& in) {
        namespace F = nn::functional;
        return std::vector<Tensor>{layer ? F::layer_norm(in[0], {width}, in[1], in[2], 1e-5)
                                         : F::rms_norm(in[0], {width}, in[1], 1e-6)};
      },
      [width, layer](int64_t n, int64_t s) { return (2.0 * n + (layer ? 2.0 : 1.0) * width) * s; }};
}

Tensor chain16(Tensor x) {
  // Sixteen elementwise ops, cheap and expensive alternating, as deep model code produces.
  for (int i = 0; i < 4; ++i) x = ((x * 1.0001 + 0.001).sigmoid() - 0.5).abs();
  return x;
}

}  // namespace

const std::vector<Workload>& workloads() {
  static const std::vector<Workload> all = {
      {"exp_mul",  // (z + 2).exp() * y: the seed's expression
       [](int64_t n) {
         return std::vector<Shape>{{n}, {n}};
       },
       [](const std::vector<Tensor>& in) { return std::vector<Tensor>{(in[0] + 2).exp() * in[1]}; },
       [](int64_t n, int64_t s) { return 3.0 * n * s; }},
      {"gelu", [](int64_t n) { return std::vector<Shape>{{n}}; },
       [](const std::vector<Tensor>& in) { return std::vector<Tensor>{gelu(in[0])}; },
       [](int64_t n, int64_t s) { return 2.0 * n * s; }},
      {"bias_relu",  // relu(x + b) * 0.5, b broadcast over rows of 1024
       [](int64_t n) {
         return std::vector<Shape>{{n / 1024, 1024}, {1024}};
       },
       [](const std::vector<Tensor>& in) {
         return std::vector<Tensor>{(in[0] + in[1]).relu() * 0.5};
       },
       [](int64_t n, int64_t s) { return (2.0 * n + 1024) * s; }},
      {"softmax",  // over rows of 1024
       [](int64_t n) {
         return std::vector<Shape>{{n / 1024, 1024}};
       },
       [](const std::vector<Tensor>& in) {
         Tensor e = (in[0] - in[0].max(1, true)).exp();
         return std::vector<Tensor>{e / e.sum({1}, true)};
       },
       [](int64_t n, int64_t s) { return 2.0 * n * s; }},
      {"sum_squares", [](int64_t n) { return std::vector<Shape>{{n}}; },
       [](const std::vector<Tensor>& in) { return std::vector<Tensor>{(in[0] * in[0]).sum()}; },
       [](int64_t n, int64_t s) { return 1.0 * n * s; }},
      {"chain16", [](int64_t n) { return std::vector<Shape>{{n}}; },
       [](const std::vector<Tensor>& in) { return std::vector<Tensor>{chain16(in[0])}; },
       [](int64_t n, int64_t s) { return 2.0 * n * s; }},
      {"adam",  // parameter, gradient, two moments in; parameter and moments out
       [](int64_t n) {
         return std::vector<Shape>{{n}, {n}, {n}, {n}};
       },
       [](const std::vector<Tensor>& in) {
         const Tensor &p = in[0], &g = in[1], &m = in[2], &v = in[3];
         Tensor m2 = m * 0.9 + g * 0.1;
         Tensor v2 = v * 0.999 + g * g * 0.001;
         Tensor p2 = p - m2 * 1e-3 / (v2.sqrt() + 1e-8);
         return std::vector<Tensor>{p2, m2, v2};
       },
       [](int64_t n, int64_t s) { return 7.0 * n * s; }},
      row_norm("layernorm", 1024, true),
      row_norm("layernorm4k", 4096, true),
      row_norm("rmsnorm", 1024, false),
      row_norm("rmsnorm4k", 4096, false),
      {"softmax_fn",  // softmax() over rows of 1024, as torch.softmax: times the sum's reciprocal
       [](int64_t n) {
         return std::vector<Shape>{{n / 1024, 1024}};
       },
       [](const std::vector<Tensor>& in) {
         return std::vector<Tensor>{nn::functional::softmax(in[0], 1)};
       },
       [](int64_t n, int64_t s) { return 2.0 * n * s; }},
      {"softmax_cols",  // softmax() over dim 0 of [1024, n / 1024]: columns of 1024, a column step
       [](int64_t n) {
         return std::vector<Shape>{{1024, n / 1024}};
       },
       [](const std::vector<Tensor>& in) {
         return std::vector<Tensor>{nn::functional::softmax(in[0], 0)};
       },
       [](int64_t n, int64_t s) { return 2.0 * n * s; }},
      {"log_softmax",  // over rows of 1024
       [](int64_t n) {
         return std::vector<Shape>{{n / 1024, 1024}};
       },
       [](const std::vector<Tensor>& in) {
         return std::vector<Tensor>{nn::functional::log_softmax(in[0], 1)};
       },
       [](int64_t n, int64_t s) { return 2.0 * n * s; }},
  };
  return all;
}

}  // namespace lazyfuse::bench
