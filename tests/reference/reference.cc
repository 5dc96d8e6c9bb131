// The float64 reference declared in tests/reference/reference.h: what each op should give,
// computed on host doubles without calling lazyfuse (the header says where lazyfuse appears).
#include "tests/reference/reference.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>
#include <utility>

namespace lazyfuse::reference {

std::string name_of(DType dtype) { return std::string(dtype_torch_name(dtype)); }

std::string shape_text(std::span<const int64_t> shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

// ---------------------------------------------------------------------------------------------
// The host reference: contiguous row-major doubles and the index math over them.

int64_t count(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

std::vector<int64_t> unravel(int64_t flat, const Shape& shape) {
  std::vector<int64_t> index(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    index[d] = flat % shape[d];
    flat /= shape[d];
  }
  return index;
}

int64_t ravel(const std::vector<int64_t>& index, const Shape& shape) {
  int64_t flat = 0;
  for (size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + index[d];
  return flat;
}

Shape broadcast_of(const Shape& a, const Shape& b) {
  size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (size_t i = 0; i < rank; ++i) {
    int64_t da = i + a.size() < rank ? 1 : a[i + a.size() - rank];
    int64_t db = i + b.size() < rank ? 1 : b[i + b.size() - rank];
    out[i] = da == 1 ? db : da;
  }
  return out;
}

// An odometer walks the output so large shapes stay cheap.
Host ref_map(const std::vector<const Host*>& inputs, const Fn3& f, Shape shape) {
  for (const Host* h : inputs) shape = broadcast_of(shape, h->shape);
  const size_t rank = shape.size();
  // Per input, how far its flat position moves when an output dim advances (0 if broadcast).
  std::vector<std::vector<int64_t>> steps;
  for (const Host* h : inputs) {
    std::vector<int64_t> step(rank, 0);
    int64_t stride = 1;
    for (size_t k = h->shape.size(); k-- > 0;) {
      step[k + rank - h->shape.size()] = h->shape[k] == 1 ? 0 : stride;
      stride *= h->shape[k];
    }
    steps.push_back(step);
  }
  Host out{shape, std::vector<double>(count(shape))};
  std::vector<int64_t> index(rank, 0), pos(inputs.size(), 0);
  for (int64_t i = 0; i < count(shape); ++i) {
    double x[3] = {0, 0, 0};
    for (size_t k = 0; k < inputs.size(); ++k) x[k] = inputs[k]->v[pos[k]];
    out.v[i] = f(x[0], x[1], x[2]);
    for (size_t d = rank; d-- > 0;) {
      ++index[d];
      for (size_t k = 0; k < inputs.size(); ++k) pos[k] += steps[k][d];
      if (index[d] < shape[d]) break;
      for (size_t k = 0; k < inputs.size(); ++k) pos[k] -= steps[k][d] * shape[d];
      index[d] = 0;
    }
  }
  return out;
}

Host ref_unary(const Host& a, double (*f)(double)) {
  return ref_map({&a}, [f](double x, double, double) { return f(x); });
}

Host host_permute(const Host& h, const std::vector<int64_t>& dims) {
  Shape shape;
  for (int64_t d : dims) shape.push_back(h.shape[d]);
  Host out{shape, std::vector<double>(h.v.size())};
  for (int64_t i = 0; i < count(shape); ++i) {
    std::vector<int64_t> o = unravel(i, shape), in(dims.size());
    for (size_t k = 0; k < dims.size(); ++k) in[dims[k]] = o[k];
    out.v[i] = h.v[ravel(in, h.shape)];
  }
  return out;
}

Host host_transpose(const Host& h, int64_t d0, int64_t d1) {
  std::vector<int64_t> dims(h.shape.size());
  std::iota(dims.begin(), dims.end(), 0);
  std::swap(dims[d0], dims[d1]);
  return host_permute(h, dims);
}

Host host_narrow(const Host& h, int64_t dim, int64_t start, int64_t length) {
  Shape shape = h.shape;
  shape[dim] = length;
  Host out{shape, std::vector<double>(count(shape))};
  for (int64_t i = 0; i < count(shape); ++i) {
    std::vector<int64_t> index = unravel(i, shape);
    index[dim] += start;
    out.v[i] = h.v[ravel(index, h.shape)];
  }
  return out;
}

Host host_expand(const Host& h, const Shape& shape) {
  return ref_map(
      {&h}, [](double x, double, double) { return x; }, shape);
}

Host host_reshape(const Host& h, const Shape& shape) { return Host{shape, h.v}; }

Host ref_binary(const Host& a, const Host& b, double (*f)(double, double)) {
  return ref_map({&a, &b}, [f](double x, double y, double) { return f(x, y); });
}

// ---------------------------------------------------------------------------------------------
// Rounding to each dtype, as a store to that dtype does.

double round_significand(double x, int bits, int min_exp, double max_finite) {
  if (x == 0 || !std::isfinite(x)) return x;
  int e = std::max(std::ilogb(x), min_exp);
  double ulp = std::ldexp(1.0, e - (bits - 1));
  double r = std::nearbyint(x / ulp) * ulp;
  return std::fabs(r) > max_finite ? std::copysign(kInf, x) : r;
}

double quantize(double x, DType dtype) {
  switch (dtype) {
    case DType::Bool:
      return x != 0 ? 1 : 0;
    case DType::Int32:
    case DType::Int64:
      return std::trunc(x);  // C++ and PyTorch float-to-int casts truncate toward zero
    case DType::Float16:
      return round_significand(static_cast<float>(x), 11, -14, 65504.0);
    case DType::BFloat16:
      return round_significand(static_cast<float>(x), 8, -126, 3.3895313892515355e38);
    case DType::Float32:
      return static_cast<float>(x);
    case DType::Float64:
      break;
  }
  return x;
}

double f32(double x) { return static_cast<float>(x); }
double f16(double x) { return quantize(x, DType::Float16); }

Host as_result(Host h, DType dtype) {
  if (dtype == DType::Bool)
    for (double& x : h.v) x = quantize(x, dtype);
  return h;
}

// ---------------------------------------------------------------------------------------------
// Inputs.

Host random_host(std::mt19937& rng, const Shape& shape, DType dtype, const Domain& domain) {
  Host h{shape, std::vector<double>(count(shape))};
  std::uniform_real_distribution<double> real(domain.lo, domain.hi);
  std::uniform_int_distribution<int64_t> integer(domain.ilo, domain.ihi);
  std::bernoulli_distribution coin(0.5);
  for (double& x : h.v) {
    if (dtype == DType::Bool) {
      x = coin(rng) ? 1 : 0;
    } else if (!is_floating(dtype)) {
      x = static_cast<double>(integer(rng));
      if (domain.nonzero && x == 0) x = 1;
    } else {
      x = real(rng);
      if (domain.discrete) x = std::round(x * 2) / 2;
      if (domain.nonzero && std::fabs(x) < 0.5) x = std::copysign(0.5 + std::fabs(x), x);
      x = quantize(x, dtype);
    }
  }
  return h;
}

Tensor to_tensor(const Host& h, DType dtype) { return from_vector(h.v, h.shape, dtype); }

// ---------------------------------------------------------------------------------------------
// Comparison.

Tol tol_for(DType dtype) {
  switch (dtype) {
    case DType::Float64:
      return {1e-12, 1e-13};
    case DType::Float32:
      return {1e-5, 1e-6};
    case DType::Float16:
      return {1e-3, 1e-3};
    case DType::BFloat16:
      return {1e-2, 1e-2};
    default:
      return {0, 0};
  }
}

void expect_matches(const Tensor& got, const Host& want, DType dtype, Tol tol,
                    const std::string& what, const std::vector<double>& slack) {
  SCOPED_TRACE(what);
  ASSERT_EQ(got.dtype(), dtype) << "got " << name_of(got.dtype()) << ", want " << name_of(dtype);
  ASSERT_EQ(got.sizes(), want.shape)
      << "got " << shape_text(got.sizes()) << ", want " << shape_text(want.shape);
  std::vector<double> values = got.to_vector<double>();
  ASSERT_EQ(values.size(), want.v.size());
  int64_t bad = 0;
  std::ostringstream first;
  first.precision(17);
  for (size_t i = 0; i < values.size(); ++i) {
    double g = values[i], w = want.v[i];
    bool ok;
    if (std::isnan(w)) {
      ok = std::isnan(g);
    } else if (std::isinf(w)) {
      ok = g == w;
    } else {
      double allowed = tol.atol + tol.rtol * (std::fabs(w) + (slack.empty() ? 0 : slack[i]));
      ok = std::fabs(g - w) <= allowed;
    }
    if (!ok && bad++ < 5) first << "\n  [" << i << "] got " << g << ", want " << w;
  }
  EXPECT_EQ(bad, 0) << bad << " of " << values.size() << " elements differ:" << first.str();
}

// ---------------------------------------------------------------------------------------------
// PyTorch's promotion, restated here rather than taken from ir/dtype.h.

int category(DType dtype) {
  return dtype == DType::Bool ? 0 : (dtype == DType::Int32 || dtype == DType::Int64) ? 1 : 2;
}

DType expect_promote(DType a, DType b) {
  if (a == b) return a;
  if (category(a) != category(b)) return category(a) > category(b) ? a : b;
  if (category(a) == 1) return DType::Int64;
  if (a == DType::Float64 || b == DType::Float64) return DType::Float64;
  return DType::Float32;  // f32 with a half type, or float16 with bfloat16
}

DType expect_with_scalar(DType tensor, ScalarKind kind) {
  int scalar = kind == ScalarKind::Bool ? 0 : kind == ScalarKind::Integral ? 1 : 2;
  if (scalar <= category(tensor)) return tensor;
  return scalar == 1 ? DType::Int64 : DType::Float32;
}

DType apply_rule(Rule rule, DType promoted) {
  switch (rule) {
    case Rule::Compare:
      return DType::Bool;
    case Rule::FloatPromote:
      return is_floating(promoted) ? promoted : DType::Float32;
    case Rule::Promote:
      break;
  }
  return promoted;
}

// ---------------------------------------------------------------------------------------------
// Input layouts: a contiguous base, and the view applied to it on both sides. Sizes cover
// scalars, odd sizes, several blocks and several tasks, and strided or broadcast reads.

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      {"scalar", {}, nullptr, nullptr},
      {"1d7", {7}, nullptr, nullptr},
      {"2d3x5", {3, 5}, nullptr, nullptr},
      {"3d2x3x4", {2, 3, 4}, nullptr, nullptr},
      {"1d40000", {40000}, nullptr, nullptr},
      {"transpose29x37",
       {29, 37},
       [](const Tensor& t) { return t.t(); },
       [](const Host& h) { return host_transpose(h, 0, 1); }},
      {"permute3x4x5",
       {3, 4, 5},
       [](const Tensor& t) {
         return t.permute({2, 0, 1});
       },
       [](const Host& h) {
         return host_permute(h, {2, 0, 1});
       }},
      {"narrow6x50",
       {6, 50},
       [](const Tensor& t) { return t.narrow(1, 3, 40).narrow(0, -5, 4); },
       [](const Host& h) { return host_narrow(host_narrow(h, 1, 3, 40), 0, 1, 4); }},
      {"expand3x1",
       {3, 1},
       [](const Tensor& t) {
         return t.expand({3, 1100});
       },
       [](const Host& h) {
         return host_expand(h, {3, 1100});
       }},
      {"transpose300x70",
       {300, 70},
       [](const Tensor& t) { return t.transpose(0, -1); },
       [](const Host& h) { return host_transpose(h, 0, 1); }},
  };
  return all;
}

Input make_input(std::mt19937& rng, const Layout& layout, DType dtype, const Domain& domain) {
  Host base = random_host(rng, layout.base, dtype, domain);
  Tensor t = to_tensor(base, dtype);
  if (!layout.view) return {t, base};
  return {layout.view(t), layout.host_view(base)};
}

// ---------------------------------------------------------------------------------------------
// Reductions.

Reduced host_reduce(const Host& h, const std::vector<int64_t>& dims, bool keepdim, Reduce kind) {
  const int64_t rank = static_cast<int64_t>(h.shape.size());
  std::vector<bool> reduced(rank, dims.empty());
  for (int64_t d : dims) reduced[d < 0 ? d + rank : d] = true;
  Shape out_shape;
  std::vector<int64_t> out_step(rank, 0);
  int64_t stride = 1;
  for (int64_t d = rank - 1; d >= 0; --d) {
    if (!reduced[d]) {
      out_step[d] = stride;
      stride *= h.shape[d];
    }
  }
  for (int64_t d = 0; d < rank; ++d) {
    if (!reduced[d])
      out_shape.push_back(h.shape[d]);
    else if (keepdim)
      out_shape.push_back(1);
  }
  const int64_t n_out = count(out_shape);
  const int64_t per_out = n_out ? count(h.shape) / n_out : 0;
  std::vector<long double> acc(n_out, kind == Reduce::Max ? -kInf : kind == Reduce::Min ? kInf : 0);
  std::vector<long double> magnitude(n_out, 0);
  std::vector<int64_t> index(rank, 0);
  int64_t o = 0;
  for (int64_t i = 0; i < count(h.shape); ++i) {
    long double x = h.v[i];
    magnitude[o] += std::fabs(x);
    if (kind == Reduce::Sum || kind == Reduce::Mean) {
      acc[o] += x;
    } else if (std::isnan(x) || std::isnan(acc[o])) {
      acc[o] = kNan;
    } else {
      acc[o] = kind == Reduce::Max ? std::max(acc[o], x) : std::min(acc[o], x);
    }
    for (int64_t d = rank - 1; d >= 0; --d) {
      ++index[d];
      o += out_step[d];
      if (index[d] < h.shape[d]) break;
      o -= out_step[d] * h.shape[d];
      index[d] = 0;
    }
  }
  Reduced r{{out_shape, std::vector<double>(n_out)}, std::vector<double>(n_out)};
  for (int64_t k = 0; k < n_out; ++k) {
    long double scale = kind == Reduce::Mean ? per_out : 1;
    r.value.v[k] = static_cast<double>(acc[k] / scale);
    r.magnitude[k] = static_cast<double>(magnitude[k] / scale);
  }
  return r;
}

std::vector<double> sum_slack(const Reduced& r) {
  std::vector<double> slack = r.magnitude;
  for (double& s : slack) s *= 1e-2;
  return slack;
}

// ---------------------------------------------------------------------------------------------
// Matmul.

std::vector<double> host_layer_norm_rows(const std::vector<double>& x, int64_t columns,
                                         const std::vector<double>& weight,
                                         const std::vector<double>& bias, double eps) {
  std::vector<double> out(x.size());
  for (size_t start = 0; start < x.size(); start += static_cast<size_t>(columns)) {
    const double* row = &x[start];
    double mean = 0, variance = 0;
    for (int64_t c = 0; c < columns; ++c) mean += row[c] / columns;
    for (int64_t c = 0; c < columns; ++c) variance += (row[c] - mean) * (row[c] - mean) / columns;
    for (int64_t c = 0; c < columns; ++c)
      out[start + c] = (row[c] - mean) / std::sqrt(variance + eps) * weight[c] + bias[c];
  }
  return out;
}

std::vector<double> host_softmax_rows(const std::vector<double>& x, int64_t columns) {
  std::vector<double> out(x.size());
  for (size_t start = 0; start < x.size(); start += static_cast<size_t>(columns)) {
    const double* row = &x[start];
    double top = -INFINITY, total = 0;
    for (int64_t c = 0; c < columns; ++c) top = std::max(top, row[c]);
    for (int64_t c = 0; c < columns; ++c) total += std::exp(row[c] - top);
    for (int64_t c = 0; c < columns; ++c) out[start + c] = std::exp(row[c] - top) / total;
  }
  return out;
}

double bfloat16_unit(double x) {
  return std::ldexp(1.0, std::max(-126, std::ilogb(std::fabs(x))) - 7);
}

std::pair<double, double> bfloat16_ulp_errors(const std::vector<double>& got,
                                              const std::vector<double>& want) {
  double largest = 0, sum = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double error = std::fabs(got[i] - want[i]) / bfloat16_unit(want[i]);
    largest = std::max(largest, error);
    sum += error;
  }
  return {largest, got.empty() ? 0 : sum / static_cast<double>(got.size())};
}

Host host_matmul(const Host& a, const Host& b, std::vector<double>* magnitude) {
  Shape as = a.shape, bs = b.shape;
  if (as.size() == 1) as.insert(as.begin(), 1);
  if (bs.size() == 1) bs.push_back(1);
  const int64_t n = as[as.size() - 2], k = as.back(), m = bs.back();
  const Shape batch_a(as.begin(), as.end() - 2), batch_b(bs.begin(), bs.end() - 2);
  const Shape batch = broadcast_of(batch_a, batch_b);
  Shape out_shape = batch;
  if (a.shape.size() >= 2) out_shape.push_back(n);
  if (b.shape.size() >= 2) out_shape.push_back(m);
  // The matrix of an operand that a batch index reads (size-1 batch dims repeat).
  auto matrix_of = [&](const Shape& own, const std::vector<int64_t>& index) {
    int64_t flat = 0;
    for (size_t d = 0; d < own.size(); ++d)
      flat = flat * own[d] + (own[d] == 1 ? 0 : index[d + batch.size() - own.size()]);
    return flat;
  };
  Host out{out_shape, std::vector<double>(count(batch) * n * m)};
  magnitude->assign(out.v.size(), 0);
  for (int64_t bi = 0; bi < count(batch); ++bi) {
    std::vector<int64_t> index = unravel(bi, batch);
    const double* pa = a.v.data() + matrix_of(batch_a, index) * n * k;
    const double* pb = b.v.data() + matrix_of(batch_b, index) * k * m;
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < m; ++j) {
        long double acc = 0, mag = 0;
        for (int64_t kk = 0; kk < k; ++kk) {
          long double p = static_cast<long double>(pa[i * k + kk]) * pb[kk * m + j];
          acc += p;
          mag += std::fabs(p);
        }
        out.v[(bi * n + i) * m + j] = static_cast<double>(acc);
        (*magnitude)[(bi * n + i) * m + j] = static_cast<double>(mag);
      }
    }
  }
  return out;
}

}  // namespace lazyfuse::reference
