// Tests of the index ops: gather, scatter_add and cat (ir/ops.def), and what is composed from
// them: index_select, stack, max and min with indices, amax and amin, embedding. Forward values
// against a host reference written here (row-major vectors of doubles and plain loops over
// coordinates, nothing of lazyfuse's), across dims, dtypes, strided views (transposed,
// narrowed, expanded), empty and 0-d tensors; the IndexError of an index outside its dim and
// what a failed evaluation leaves; scatter_add's order of additions, bit for bit; gradients by
// gradcheck; and, in suites named Cuda*, the same on a GPU, the kernels through NVRTC and their
// calling convention.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "lazyfuse/codegen/cuda/cuda_codegen.h"
#include "lazyfuse/codegen/cuda/cuda_kernel_args.h"
#include "lazyfuse/codegen/cuda/nvrtc.h"
#include "lazyfuse/ir/passes/passes.h"
#include "lazyfuse/ir/verifier.h"
#include "lazyfuse/lazyfuse.h"
#include "tests/gradcheck.h"

namespace lazyfuse {
namespace {

// ---- The host reference ----

// A row-major array of doubles.
struct Ref {
  Shape shape;
  std::vector<double> v;
};

int64_t count_of(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}
// As PyTorch's index ops see shapes: a 0-d array is [1].
Shape nonempty(const Shape& shape) { return shape.empty() ? Shape{1} : shape; }
std::vector<int64_t> coords_of(int64_t flat, const Shape& shape) {
  std::vector<int64_t> c(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    c[d] = flat % shape[d];
    flat /= shape[d];
  }
  return c;
}
int64_t flat_of(const std::vector<int64_t>& c, const Shape& shape) {
  int64_t flat = 0;
  for (size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + c[d];
  return flat;
}

Ref ref_gather(const Ref& x, int64_t dim, const Ref& index) {
  Ref out{index.shape, std::vector<double>(index.v.size())};
  for (size_t p = 0; p < index.v.size(); ++p) {
    std::vector<int64_t> c = coords_of(static_cast<int64_t>(p), nonempty(index.shape));
    c[dim] = static_cast<int64_t>(index.v[p]);
    out.v[p] = x.v[flat_of(c, nonempty(x.shape))];
  }
  return out;
}

// `add` combines the element and src's value (a sum, or `or` for bool).
template <typename Add>
Ref ref_scatter(const Ref& self, int64_t dim, const Ref& index, const Ref& src, Add add) {
  Ref out = self;
  for (size_t p = 0; p < index.v.size(); ++p) {
    std::vector<int64_t> c = coords_of(static_cast<int64_t>(p), nonempty(index.shape));
    const double value = src.v[flat_of(c, nonempty(src.shape))];
    c[dim] = static_cast<int64_t>(index.v[p]);
    double& target = out.v[flat_of(c, nonempty(self.shape))];
    target = add(target, value);
  }
  return out;
}
Ref ref_scatter_add(const Ref& self, int64_t dim, const Ref& index, const Ref& src, DType dtype) {
  if (dtype == kBool)
    return ref_scatter(self, dim, index, src, [](double a, double b) { return a != 0 || b != 0; });
  return ref_scatter(self, dim, index, src, [](double a, double b) { return a + b; });
}

Ref ref_cat(const std::vector<Ref>& parts, int64_t dim) {
  Ref out{parts[0].shape, {}};
  out.shape[dim] = 0;
  for (const Ref& part : parts) out.shape[dim] += part.shape[dim];
  out.v.resize(count_of(out.shape));
  int64_t at = 0;
  for (const Ref& part : parts) {
    for (size_t p = 0; p < part.v.size(); ++p) {
      std::vector<int64_t> c = coords_of(static_cast<int64_t>(p), part.shape);
      c[dim] += at;
      out.v[flat_of(c, out.shape)] = part.v[p];
    }
    at += part.shape[dim];
  }
  return out;
}

Ref ref_index_select(const Ref& x, int64_t dim, const std::vector<int64_t>& index) {
  Ref out{x.shape, {}};
  out.shape[dim] = static_cast<int64_t>(index.size());
  out.v.resize(count_of(out.shape));
  for (size_t p = 0; p < out.v.size(); ++p) {
    std::vector<int64_t> c = coords_of(static_cast<int64_t>(p), out.shape);
    c[dim] = index[c[dim]];
    out.v[p] = x.v[flat_of(c, x.shape)];
  }
  return out;
}

// The first extreme along dim (NaN counting as the extreme), and where it is.
std::pair<Ref, Ref> ref_extreme(const Ref& x, int64_t dim, bool largest) {
  Shape shape = x.shape;
  shape[dim] = 1;
  Ref values{shape, std::vector<double>(count_of(shape))}, indices = values;
  for (size_t p = 0; p < values.v.size(); ++p) {
    std::vector<int64_t> c = coords_of(static_cast<int64_t>(p), shape);
    int64_t best = 0;
    for (int64_t k = 0; k < x.shape[dim]; ++k) {
      c[dim] = k;
      const double value = x.v[flat_of(c, x.shape)];
      c[dim] = best;
      const double held = x.v[flat_of(c, x.shape)];
      if (std::isnan(held)) break;
      if (std::isnan(value) || (largest ? value > held : value < held)) best = k;
    }
    c[dim] = best;
    values.v[p] = x.v[flat_of(c, x.shape)];
    indices.v[p] = static_cast<double>(best);
  }
  return {values, indices};
}

Ref ref_swap_dims(const Ref& r, int64_t d0, int64_t d1) {
  Ref out{r.shape, std::vector<double>(r.v.size())};
  std::swap(out.shape[d0], out.shape[d1]);
  for (size_t p = 0; p < r.v.size(); ++p) {
    std::vector<int64_t> c = coords_of(static_cast<int64_t>(p), r.shape);
    std::swap(c[d0], c[d1]);
    out.v[flat_of(c, out.shape)] = r.v[p];
  }
  return out;
}

// Small integers: exact in every dtype, and in sums of a few of them.
Ref random_values(const Shape& shape, DType dtype, std::mt19937& rng) {
  std::uniform_int_distribution<int> values(dtype == kBool ? 0 : -8, dtype == kBool ? 1 : 8);
  Ref r{shape, std::vector<double>(count_of(shape))};
  for (double& x : r.v) x = values(rng);
  return r;
}
Ref random_index(const Shape& shape, int64_t bound, std::mt19937& rng) {
  std::uniform_int_distribution<int64_t> values(0, bound - 1);
  Ref r{shape, std::vector<double>(count_of(shape))};
  for (double& x : r.v) x = static_cast<double>(values(rng));
  return r;
}

// ---- The tensor side: the same values, in a layout ----

enum class Layout { Contiguous, Transposed, Narrowed };
constexpr Layout kLayouts[] = {Layout::Contiguous, Layout::Transposed, Layout::Narrowed};
const char* layout_name(Layout layout) {
  switch (layout) {
    case Layout::Contiguous:
      return "contiguous";
    case Layout::Transposed:
      return "transposed";
    case Layout::Narrowed:
      return "narrowed";
  }
  return "?";
}

// A tensor holding r's values as `layout` lays them out: a transposed view of r's transpose, or
// rows 1.. of r with a row of `padding` before and after (an index's padding is out of range, so
// that reading it would be an error).
Tensor make(const Ref& r, DType dtype, Layout layout, Device device = Device::cpu(),
            double padding = 1000) {
  const TensorOptions options = TensorOptions(dtype).device(device);
  const int64_t rank = static_cast<int64_t>(r.shape.size());
  if (layout == Layout::Transposed && rank >= 2) {
    const Ref t = ref_swap_dims(r, 0, rank - 1);
    return from_vector(t.v, t.shape, options).transpose(0, rank - 1);
  }
  if (layout == Layout::Narrowed && rank >= 1) {
    Shape padded = r.shape;
    padded[0] += 2;
    const int64_t row = count_of(r.shape) / std::max<int64_t>(r.shape[0], 1);
    std::vector<double> v(count_of(padded), dtype == kBool ? 1 : padding);
    std::copy(r.v.begin(), r.v.end(), v.begin() + row);
    return from_vector(v, padded, options).narrow(0, 1, r.shape[0]);
  }
  return from_vector(r.v, r.shape, options);
}

// got against want: shape, dtype and every value, within `tolerance` (exact by default).
void expect_values(const Tensor& got, const Ref& want, DType dtype, double tolerance = 0) {
  ASSERT_EQ(got.sizes(), want.shape);
  ASSERT_EQ(got.dtype(), dtype);
  const std::vector<double> values = got.to_vector<double>();
  for (size_t i = 0; i < want.v.size(); ++i) {
    if (std::isnan(want.v[i]) && std::isnan(values[i])) continue;
    if (std::abs(values[i] - want.v[i]) <= tolerance) continue;
    ADD_FAILURE() << "element " << i << ": got " << values[i] << ", want " << want.v[i];
    return;  // one mismatch says enough
  }
}

constexpr DType kAllDTypes[] = {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kBool};

// ---- gather ----

// x [4, 5, 6]; for each dim an index no larger than x but along dim, where it may be longer.
struct GatherShapes {
  int64_t dim;
  Shape index;
};
const GatherShapes kGathers[] = {{0, {7, 5, 6}}, {1, {4, 2, 3}}, {2, {3, 5, 9}}, {-1, {1, 1, 1}}};
const Shape kX = {4, 5, 6};

void check_gathers(Device device) {
  std::mt19937 rng(7);
  for (DType dtype : kAllDTypes) {
    for (const GatherShapes& g : kGathers) {
      for (Layout x_layout : kLayouts) {
        for (Layout index_layout : kLayouts) {
          SCOPED_TRACE(testing::Message()
                       << dtype_torch_name(dtype) << " dim " << g.dim << ", x "
                       << layout_name(x_layout) << ", index " << layout_name(index_layout));
          const int64_t dim = g.dim < 0 ? g.dim + 3 : g.dim;
          const Ref x = random_values(kX, dtype, rng);
          const Ref index = random_index(g.index, kX[dim], rng);
          const Tensor got = gather(make(x, dtype, x_layout, device), g.dim,
                                    make(index, kInt64, index_layout, device));
          EXPECT_EQ(got.device(), device);
          expect_values(got, ref_gather(x, dim, index), dtype);
        }
      }
    }
  }
}

TEST(OpsIndex, GatherMatchesTheReference) { check_gathers(Device::cpu()); }

TEST(OpsIndex, GatherOfLowRanks) {
  const Ref x{{5}, {10, 11, 12, 13, 14}};
  const Ref index{{7}, {4, 0, 0, 3, 1, 2, 4}};
  expect_values(
      gather(make(x, kFloat32, Layout::Contiguous), 0, make(index, kInt64, Layout::Contiguous)),
      ref_gather(x, 0, index), kFloat32);
  // A 0-d tensor counts as [1]: a 0-d index, or a [1] one.
  const Tensor scalar = scalar_tensor(3.5);
  expect_values(gather(scalar, 0, zeros({}, kInt64)), Ref{{}, {3.5}}, kFloat32);
  expect_values(gather(scalar, -1, zeros({1}, kInt64)), Ref{{1}, {3.5}}, kFloat32);
  expect_values(scalar.gather(0, zeros({}, kInt64)), Ref{{}, {3.5}}, kFloat32);
}

// A large gather runs in parallel tasks; the result does not depend on how many.
TEST(OpsIndex, GatherInParallelTasks) {
  std::mt19937 rng(3);
  const Ref x = random_values({300, 120}, kFloat32, rng);
  const Ref index = random_index({300, 200}, 120, rng);
  expect_values(
      gather(make(x, kFloat32, Layout::Transposed), 1, make(index, kInt64, Layout::Narrowed)),
      ref_gather(x, 1, index), kFloat32);
}

// ---- scatter_add ----

// self [4, 5, 6]; index no larger than src, nor than self but along dim.
struct ScatterShapes {
  int64_t dim;
  Shape index, src;
};
const ScatterShapes kScatters[] = {{0, {9, 5, 6}, {9, 5, 6}},
                                   {1, {4, 3, 6}, {4, 7, 6}},
                                   {2, {2, 3, 11}, {3, 5, 12}},
                                   {-2, {4, 1, 6}, {4, 1, 6}}};

void check_scatters(Device device) {
  std::mt19937 rng(11);
  for (DType dtype : kAllDTypes) {
    for (const ScatterShapes& s : kScatters) {
      for (Layout self_layout : kLayouts) {
        for (Layout index_layout : kLayouts) {
          const Layout src_layout = kLayouts[(static_cast<int>(self_layout) + 1) % 3];
          SCOPED_TRACE(testing::Message()
                       << dtype_torch_name(dtype) << " dim " << s.dim << ", self "
                       << layout_name(self_layout) << ", index " << layout_name(index_layout)
                       << ", src " << layout_name(src_layout));
          const int64_t dim = s.dim < 0 ? s.dim + 3 : s.dim;
          const Ref self = random_values(kX, dtype, rng);
          const Ref index = random_index(s.index, kX[dim], rng);
          const Ref src = random_values(s.src, dtype, rng);
          const Tensor got = scatter_add(make(self, dtype, self_layout, device), s.dim,
                                         make(index, kInt64, index_layout, device),
                                         make(src, dtype, src_layout, device));
          EXPECT_EQ(got.device(), device);
          expect_values(got, ref_scatter_add(self, dim, index, src, dtype), dtype);
        }
      }
    }
  }
}

TEST(OpsIndex, ScatterAddMatchesTheReference) { check_scatters(Device::cpu()); }

TEST(OpsIndex, ScatterAddOfLowRanksAndTheMethod) {
  const Ref self{{4}, {1, 2, 3, 4}};
  const Ref index{{6}, {3, 3, 0, 1, 3, 0}};
  const Ref src{{6}, {10, 20, 30, 40, 50, 60}};
  const Tensor t = make(self, kInt64, Layout::Contiguous);
  expect_values(t.scatter_add(0, make(index, kInt64, Layout::Contiguous),
                              make(src, kInt64, Layout::Contiguous)),
                ref_scatter_add(self, 0, index, src, kInt64), kInt64);
  expect_values(scatter_add(scalar_tensor(1.5), 0, zeros({}, kInt64), scalar_tensor(2.0)),
                Ref{{}, {3.5}}, kFloat32);
  // Integers wrap, as PyTorch's do.
  const Tensor big = full({1}, std::numeric_limits<int32_t>::max(), kInt32);
  EXPECT_EQ(scatter_add(big, 0, zeros({1}, kInt64), ones({1}, kInt32)).item<int32_t>(),
            std::numeric_limits<int32_t>::min());
}

// Note [Deterministic scatter_add] (runtime/cpu/cpu_index.cc): each element's additions happen in
// index order, each rounded to the dtype. A sequential loop over the index in row-major order
// in the dtype's own arithmetic makes the same roundings in the same order, so the results are
// equal bit for bit, whatever the thread count.
template <typename T>
std::vector<T> in_index_order(const Ref& self, int64_t dim, const Ref& index, const Ref& src) {
  std::vector<T> out(self.v.begin(), self.v.end());
  for (size_t p = 0; p < index.v.size(); ++p) {
    std::vector<int64_t> c = coords_of(static_cast<int64_t>(p), index.shape);
    const T value = static_cast<T>(src.v[flat_of(c, src.shape)]);
    c[dim] = static_cast<int64_t>(index.v[p]);
    T& target = out[flat_of(c, self.shape)];
    target = target + value;
  }
  return out;
}

template <typename T>
void check_scatter_order(DType dtype, Device device) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> reals(-1, 1);
  struct Case {
    int64_t dim;
    Shape self, index;
  };
  // Few long lines, many short ones; both past one parallel task (16384 additions).
  for (const Case& c : {Case{1, {3, 7}, {3, 20000}}, Case{0, {5, 96}, {600, 96}}}) {
    Ref self{c.self, std::vector<double>(count_of(c.self))};
    Ref src{c.index, std::vector<double>(count_of(c.index))};
    for (double& x : self.v) x = static_cast<T>(reals(rng));
    for (double& x : src.v) x = static_cast<T>(reals(rng));
    const Ref index = random_index(c.index, c.self[c.dim], rng);
    const std::vector<T> want = in_index_order<T>(self, c.dim, index, src);
    for (int threads : {1, 3}) {
      SCOPED_TRACE(testing::Message()
                   << dtype_torch_name(dtype) << " dim " << c.dim << ", " << threads << " threads");
      omp_set_num_threads(threads);
      const Tensor got = scatter_add(make(self, dtype, Layout::Contiguous, device), c.dim,
                                     make(index, kInt64, Layout::Contiguous, device),
                                     make(src, dtype, Layout::Contiguous, device));
      EXPECT_EQ(got.to_vector<T>(), want);
    }
  }
  omp_set_num_threads(omp_get_num_procs());
}

TEST(OpsIndex, ScatterAddAddsInIndexOrderBitForBit) {
  check_scatter_order<float>(kFloat32, Device::cpu());
  check_scatter_order<double>(kFloat64, Device::cpu());
}

// ---- cat, stack, index_select ----

void check_cats(Device device) {
  std::mt19937 rng(13);
  // Operands of [2, 3, 4] but along dim, where their sizes are these (one of them empty).
  const std::vector<int64_t> sizes = {2, 0, 3, 1, 4};
  for (int64_t dim : {0, 1, 2, -1}) {
    for (size_t n : {size_t{1}, size_t{2}, size_t{5}}) {
      for (Layout layout : kLayouts) {
        SCOPED_TRACE(testing::Message()
                     << "dim " << dim << ", " << n << " operands, " << layout_name(layout));
        const int64_t d = dim < 0 ? dim + 3 : dim;
        std::vector<Ref> parts;
        std::vector<Tensor> tensors;
        for (size_t k = 0; k < n; ++k) {
          Shape shape = {2, 3, 4};
          shape[d] = sizes[k];
          parts.push_back(random_values(shape, kFloat32, rng));
          tensors.push_back(make(parts.back(), kFloat32, layout, device));
        }
        const Tensor got = cat(tensors, dim);
        EXPECT_EQ(got.device(), device);
        expect_values(got, ref_cat(parts, d), kFloat32);
      }
    }
  }
  // Promotion, as torch.cat's.
  struct Promotion {
    DType a, b, result;
  };
  for (const Promotion& p :
       {Promotion{kInt32, kFloat32, kFloat32}, Promotion{kBool, kInt64, kInt64},
        Promotion{kFloat16, kBFloat16, kFloat32}, Promotion{kInt64, kFloat16, kFloat16},
        Promotion{kFloat32, kFloat64, kFloat64}, Promotion{kBool, kBool, kBool},
        Promotion{kInt32, kInt64, kInt64}}) {
    SCOPED_TRACE(testing::Message() << dtype_torch_name(p.a) << " and " << dtype_torch_name(p.b));
    const Ref a = random_values({2, 3}, p.a, rng), b = random_values({2, 2}, p.b, rng);
    const Tensor got = cat(
        {make(a, p.a, Layout::Transposed, device).t().t(), make(b, p.b, Layout::Narrowed, device)},
        1);
    expect_values(got, ref_cat({a, b}, 1), p.result);
  }
}

TEST(OpsIndex, CatMatchesTheReference) { check_cats(Device::cpu()); }

TEST(OpsIndex, CatOfEmptyAndLongOperands) {
  // All empty along dim; empty in another dim.
  expect_values(cat({zeros({0, 3}), zeros({0, 3})}), Ref{{0, 3}, {}}, kFloat32);
  expect_values(cat({zeros({2, 0}), ones({3, 0})}), Ref{{5, 0}, {}}, kFloat32);
  // More operands than a node keeps inline; one used twice.
  std::vector<Tensor> many;
  std::vector<Ref> parts;
  for (int k = 0; k < 12; ++k) {
    parts.push_back(Ref{{1, 2}, {static_cast<double>(k), static_cast<double>(-k)}});
    many.push_back(make(parts.back(), kInt64, Layout::Contiguous));
  }
  many.push_back(many[3]);
  parts.push_back(parts[3]);
  expect_values(cat(many, 0), ref_cat(parts, 0), kInt64);
}

TEST(OpsIndex, Stack) {
  std::mt19937 rng(17);
  const Ref a = random_values({2, 3}, kFloat32, rng), b = random_values({2, 3}, kFloat32, rng);
  for (int64_t dim : {0, 1, 2, -1, -3}) {
    SCOPED_TRACE(testing::Message() << "dim " << dim);
    const int64_t d = dim < 0 ? dim + 3 : dim;
    Shape shape = a.shape;
    shape.insert(shape.begin() + d, 1);
    const Ref a1{shape, a.v}, b1{shape, b.v};
    expect_values(
        stack({make(a, kFloat32, Layout::Transposed), make(b, kFloat32, Layout::Narrowed)}, dim),
        ref_cat({a1, b1}, d), kFloat32);
  }
  expect_values(stack({scalar_tensor(1.0), scalar_tensor(2.0)}), Ref{{2}, {1, 2}}, kFloat32);
}

void check_index_selects(Device device) {
  std::mt19937 rng(19);
  const Ref x = random_values({4, 5, 3}, kFloat64, rng);
  const std::vector<std::vector<int64_t>> indices = {{2, 0, 2, 1}, {0}, {}, {1, 1, 1, 1, 1, 1}};
  for (int64_t dim : {0, 1, 2, -2}) {
    for (const std::vector<int64_t>& list : indices) {
      for (DType index_dtype : {kInt64, kInt32}) {
        for (Layout layout : kLayouts) {
          SCOPED_TRACE(testing::Message()
                       << "dim " << dim << ", " << list.size() << " indices, "
                       << dtype_torch_name(index_dtype) << ", " << layout_name(layout));
          const int64_t d = dim < 0 ? dim + 3 : dim;
          const std::vector<double> values(list.begin(), list.end());
          const Tensor index = from_vector(values, {static_cast<int64_t>(list.size())},
                                           TensorOptions(index_dtype).device(device));
          expect_values(index_select(make(x, kFloat64, layout, device), dim, index),
                        ref_index_select(x, d, list), kFloat64);
        }
      }
    }
  }
}

TEST(OpsIndex, IndexSelectMatchesTheReference) {
  check_index_selects(Device::cpu());
  const Tensor x = tensor({1., 2., 3.});
  expect_values(x.index_select(0, tensor({2}, kInt64)), Ref{{1}, {3}}, kFloat32);
  expect_values(index_select(scalar_tensor(4.0), 0, tensor({0}, kInt64)), Ref{{}, {4}}, kFloat32);
}

// ---- max and min with indices, amax and amin ----

TEST(OpsIndex, MaxAndMinWithIndices) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // Ties (the first wins), a NaN (which is the extreme), a row of one value.
  const Ref x{{3, 4}, {1, 5, 5, 2, 7, nan, 9, nan, -3, -3, -3, -3}};
  for (int64_t dim : {0, 1, -1}) {
    for (bool keepdim : {false, true}) {
      for (bool largest : {true, false}) {
        SCOPED_TRACE(testing::Message() << (largest ? "max" : "min") << " dim " << dim
                                        << (keepdim ? ", keepdim" : ""));
        const int64_t d = dim < 0 ? dim + 2 : dim;
        auto [values, indices] = ref_extreme(x, d, largest);
        if (!keepdim) {
          values.shape.erase(values.shape.begin() + d);
          indices.shape = values.shape;
        }
        const Tensor t = make(x, kFloat32, Layout::Transposed);
        auto [got_values, got_indices] = largest ? max(t, dim, keepdim) : min(t, dim, keepdim);
        expect_values(got_values, values, kFloat32);
        expect_values(got_indices, indices, kInt64);
      }
    }
  }
  auto [v, i] = max(scalar_tensor(2.5), 0);
  expect_values(v, Ref{{}, {2.5}}, kFloat32);
  expect_values(i, Ref{{}, {0}}, kInt64);
}

TEST(OpsIndex, AmaxAndAmin) {
  const Tensor x = tensor({{1., 7., 3.}, {4., 2., 6.}});
  expect_values(x.amax(), Ref{{}, {7}}, kFloat32);
  expect_values(x.amax({1}), Ref{{2}, {7, 6}}, kFloat32);
  expect_values(x.amin({0}, true), Ref{{1, 3}, {1, 2, 3}}, kFloat32);
  expect_values(amin(x, {0, 1}), Ref{{}, {1}}, kFloat32);
  expect_values(amax(x.to(kInt64), {-1}, true), Ref{{2, 1}, {7, 6}}, kInt64);
}

// ---- Empty tensors ----

TEST(OpsIndex, EmptyTensors) {
  const Tensor x = tensor({{1., 2., 3.}, {4., 5., 6.}});
  expect_values(gather(x, 1, zeros({2, 0}, kInt64)), Ref{{2, 0}, {}}, kFloat32);
  expect_values(gather(zeros({2, 0}), 1, zeros({2, 0}, kInt64)), Ref{{2, 0}, {}}, kFloat32);
  expect_values(gather(zeros({0, 3}), 1, zeros({0, 5}, kInt64)), Ref{{0, 5}, {}}, kFloat32);
  // Nothing to add: self comes back.
  expect_values(scatter_add(x, 0, zeros({0, 3}, kInt64), zeros({0, 3})),
                Ref{{2, 3}, {1, 2, 3, 4, 5, 6}}, kFloat32);
  expect_values(scatter_add(zeros({0, 3}), 1, zeros({0, 2}, kInt64), zeros({0, 2})),
                Ref{{0, 3}, {}}, kFloat32);
  expect_values(index_select(x, 0, zeros({0}, kInt64)), Ref{{0, 3}, {}}, kFloat32);
  expect_values(index_select(zeros({0, 3}), 1, tensor({2, 0}, kInt64)), Ref{{0, 2}, {}}, kFloat32);
}

// ---- Errors ----

// An index outside its dim is known only when the value is computed: an IndexError naming the
// op, the index, the dim and its size, and where the op was made.
void check_index_errors(Device device) {
  const TensorOptions f32 = TensorOptions(kFloat32).device(device);
  const TensorOptions i64 = TensorOptions(kInt64).device(device);
  const Tensor x = tensor({{1, 2, 3}, {4, 5, 6}}, f32);
  auto message = [](const Tensor& t) -> std::string {
    try {
      eval(t);
    } catch (const IndexError& e) {
      return e.what();
    }
    return "no IndexError";
  };
  EXPECT_THAT(message(gather(x, 1, tensor({{0, 3}, {1, 1}}, i64))),
              testing::HasSubstr("gather(): index 3 is out of bounds for dimension 1 with size 3 "
                                 "(gather at index_test.cc:"));
  EXPECT_THAT(message(gather(x, 0, tensor({{0, 1, -1}}, i64))),
              testing::HasSubstr("index -1 is out of bounds for dimension 0 with size 2"));
  EXPECT_THAT(
      message(scatter_add(x, 1, tensor({5, 0}, i64).reshape({2, 1}), ones({2, 1}, f32))),
      testing::HasSubstr("scatter_add(): index 5 is out of bounds for dimension 1 with size 3"));
  EXPECT_THAT(message(index_select(x, 1, tensor({0, 7}, i64))),
              testing::HasSubstr("index 7 is out of bounds for dimension 1 with size 3"));
  EXPECT_THAT(message(nn::functional::embedding(tensor({{1, 4}}, i64), ones({4, 2}, f32))),
              testing::HasSubstr("index 4 is out of bounds for dimension 0 with size 4"));
  // Of several bad indices, the first in the index's row-major order, however the work is
  // split: past one parallel task, in a line of scatter_add that is not the first.
  std::vector<double> many(300 * 200, 1.0);
  many[150 * 200 + 7] = -5;
  many[250 * 200 + 1] = 99;
  many[299 * 200 + 199] = 12;
  const Tensor index = from_vector(many, {300, 200}, i64);
  EXPECT_THAT(message(gather(ones({300, 2}, f32), 1, index)), testing::HasSubstr("index -5 is"));
  EXPECT_THAT(message(scatter_add(ones({300, 3}, f32), 1, index, ones({300, 200}, f32))),
              testing::HasSubstr("index -5 is"));
  EXPECT_THAT(message(scatter_add(ones({3, 200}, f32), 0, index, ones({300, 200}, f32))),
              testing::HasSubstr("index -5 is"));

  // A failed evaluation changes nothing: every tensor it touched is still usable, pending
  // values stay pending, and the next evaluation works.
  const Tensor pending = x.exp() + 1;
  const Tensor bad = gather(pending, 1, tensor({9, 0}, i64).reshape({2, 1}));
  const Tensor also = pending * 2;
  EXPECT_THROW(eval({bad, also}), IndexError);
  EXPECT_FALSE(also.is_computed());
  EXPECT_NEAR(also.to_vector<float>()[0], 2 * (std::exp(1.0f) + 1), 1e-5);
  EXPECT_THROW(eval(bad), IndexError);
  EXPECT_EQ(gather(x, 1, tensor({2, 0}, i64).reshape({2, 1})).to_vector<float>(),
            (std::vector<float>{3, 4}));
}

TEST(OpsIndex, OutOfRangeIndexIsAnIndexError) { check_index_errors(Device::cpu()); }

TEST(OpsIndex, ShapeAndDTypeErrors) {
  const Tensor x = tensor({{1., 2., 3.}, {4., 5., 6.}});
  const Tensor i = zeros({2, 2}, kInt64);
  auto shape_error = [](auto make_it, const std::string& text) {
    try {
      make_it();
      ADD_FAILURE() << "no ShapeError for " << text;
    } catch (const ShapeError& e) {
      EXPECT_THAT(e.what(), testing::HasSubstr(text));
    }
  };
  shape_error([&] { gather(x, 1, zeros({2}, kInt64)); },
              "Index tensor must have the same number of dimensions as input tensor");
  shape_error(
      [&] {
        gather(x, 1, zeros({3, 1}, kInt64));
      },
      "Size does not match at dimension 0 expected index [3, 1] to be smaller than self "
      "[2, 3] apart from dimension 1");
  shape_error([&] { gather(x, 2, i); }, "Dimension out of range");
  shape_error(
      [&] {
        scatter_add(x, 0, i, ones({2, 1}));
      },
      "Expected index [2, 2] to be smaller than self [2, 3] apart from dimension 0 and to "
      "be smaller size than src [2, 1]");
  shape_error([&] { scatter_add(x, 0, i, ones({2})); },
              "Index tensor must have the same number of dimensions as src tensor");
  shape_error(
      [&] {
        cat({x, ones({2, 2})}, 0);
      },
      "Sizes of tensors must match except in dimension 0. Expected size 3 but got size 2 "
      "for tensor number 1 in the list.");
  shape_error([&] { cat({x, ones({3})}, 0); }, "Tensors must have same number of dimensions");
  shape_error([&] { cat({scalar_tensor(1.0)}); }, "zero-dimensional tensor (at position 0)");
  shape_error([&] { cat({}); }, "expected a non-empty list of Tensors");
  shape_error(
      [&] {
        stack({x, ones({3, 2})});
      },
      "stack expects each tensor to be equal size, but got [2, 3] at entry 0 and [3, 2] at "
      "entry 1");
  shape_error(
      [&] {
        index_select(x, 0, zeros({1, 1}, kInt64));
      },
      "Index is supposed to be a vector");
  shape_error([&] { nn::functional::embedding(zeros({2}, kInt64), ones({3})); }, "must be 2-D");
  EXPECT_THROW(gather(x, 1, zeros({2, 2}, kInt32)), DTypeError);
  EXPECT_THROW(gather(x, 1, zeros({2, 2})), DTypeError);
  EXPECT_THROW(scatter_add(x, 1, i, ones({2, 2}, kFloat64)), DTypeError);
  EXPECT_THROW(index_select(x, 0, zeros({1})), DTypeError);
}

// ---- The IR and the schedule ----

TEST(OpsIndex, StepsOfTheirOwnThatElementwiseWorkFusesAround) {
  const Tensor x = tensor({{1, 2, 3}, {4, 5, 6}});
  const Tensor index = tensor({{2, 0}, {1, 1}}, kInt64);
  const Tensor y = (cat({gather(x.exp(), 1, index) * 2, x.narrow(1, 0, 1)}, 1) + 1).sin();
  const std::string text = y.ir();
  EXPECT_THAT(text, testing::HasSubstr("= gather %"));
  EXPECT_THAT(text, testing::HasSubstr("{dim = 1}"));
  EXPECT_THAT(text, testing::HasSubstr("= cat %"));
  // The text parses back to a graph that verifies and prints the same.
  const Graph parsed = parse_graph(text);
  verify(parsed);
  EXPECT_EQ(print_graph(parsed), text);
  const Schedule schedule = run_pipeline(parsed, {});
  int index_steps = 0;
  for (const Step& step : schedule.steps) index_steps += step.kind == StepKind::Index;
  EXPECT_EQ(index_steps, 2);
  // exp, then gather, then *2, then cat, then +1 and sin: three elementwise kernels.
  int elementwise = 0;
  for (const Step& step : schedule.steps) elementwise += step.kind == StepKind::Elementwise;
  EXPECT_EQ(elementwise, 3);
  // The fused text parses back too.
  EXPECT_EQ(print_graph(parse_graph(print_schedule(schedule))), print_graph(schedule.graph));
  const std::vector<float> got = y.to_vector<float>();
  EXPECT_NEAR(got[0], std::sin(2 * std::exp(3.0f) + 1), 1e-4);
  EXPECT_NEAR(got[2], std::sin(1.0f + 1), 1e-5);
}

TEST(OpsIndex, VerifierChecksArityAndAttributes) {
  EXPECT_THROW(verify(parse_graph("graph @g(%0: f32[2] @cpu) {\n  %1 = cat {dim = 0} : f32[0] "
                                  "@cpu\n  return %1\n}\n")),
               VerifierError);
  EXPECT_THROW(verify(parse_graph("graph @g(%0: f32[2] @cpu) {\n  %1 = cat %0, %0 : f32[4] "
                                  "@cpu\n  return %1\n}\n")),
               VerifierError);
  verify(
      parse_graph("graph @g(%0: f32[2] @cpu) {\n  %1 = cat %0, %0, %0, %0 {dim = -1} : f32[8] "
                  "@cpu\n  return %1\n}\n"));
}

// ---- Gradients ----

using testing_gradcheck::Fn;
using testing_gradcheck::gradcheck;

struct GradCase {
  std::string name;
  Fn f;
  std::vector<Shape> shapes;
};

Tensor int64_on(std::initializer_list<std::initializer_list<double>> values, const Tensor& like) {
  return tensor(values, TensorOptions(kInt64).device(like.device()));
}
Tensor int64_on(std::initializer_list<double> values, const Tensor& like) {
  return tensor(values, TensorOptions(kInt64).device(like.device()));
}

std::vector<GradCase> grad_cases() {
  return {
      {"gather dim 1 repeats",
       [](auto& x) {
         return gather(x[0], 1, int64_on({{0, 2, 2, 0, 1}, {1, 1, 1, 0, 3}}, x[0]));
       },
       {{3, 4}}},
      {"gather dim 0",
       [](auto& x) {
         return gather(x[0], 0, int64_on({{2, 0, 2, 1}}, x[0]));
       },
       {{3, 4}}},
      {"gather transposed 3-d",
       [](auto& x) {
         return gather(x[0].transpose(0, 2), 1,
                       int64_on({{1, 0}}, x[0]).reshape({1, 2, 1}).expand({2, 2, 3}));
       },
       {{3, 2, 2}}},
      {"gather 0-d", [](auto& x) { return gather(x[0], 0, int64_on({0}, x[0])) * 3; }, {{}}},
      {"scatter_add",
       [](auto& x) {
         return scatter_add(x[0], 1, int64_on({{0, 0, 3}, {2, 1, 2}}, x[0]), x[1]);
       },
       {{2, 4}, {2, 3}}},
      {"scatter_add src larger than index",
       [](auto& x) {
         return scatter_add(x[0], 0, int64_on({{1, 0}, {1, 1}}, x[0]), x[1]).sin();
       },
       {{2, 3}, {3, 4}}},
      {"cat",
       [](auto& x) {
         return cat({x[0], x[1]}, 1);
       },
       {{2, 3}, {2, 1}}},
      {"cat of five with one twice",
       [](auto& x) {
         return cat({x[0], x[1].exp(), x[2], x[0], x[3] * x[4]}, 0);
       },
       {{1, 2}, {2, 2}, {3, 2}, {1, 2}, {1, 2}}},
      {"cat promoted",
       [](auto& x) {
         return cat({x[0], int64_on({1, 2}, x[0]), x[1]}, -1);
       },
       {{2}, {3}}},
      {"stack",
       [](auto& x) {
         return stack({x[0], x[1].tanh()}, 1);
       },
       {{2, 3}, {2, 3}}},
      {"index_select",
       [](auto& x) {
         return index_select(x[0], 1, int64_on({2, 0, 2, 2}, x[0]));
       },
       {{3, 4}}},
      {"max with indices", [](auto& x) { return std::get<0>(max(x[0], 1)); }, {{3, 4}}},
      {"min with indices keepdim",
       [](auto& x) { return std::get<0>(min(x[0], 0, true)); },
       {{3, 4}}},
      {"amax",
       [](auto& x) {
         return x[0].amax({0, 1});
       },
       {{3, 4}}},
      {"narrow middle", [](auto& x) { return x[0].narrow(0, 1, 2).exp(); }, {{4, 3}}},
      {"narrow start", [](auto& x) { return x[0].narrow(1, 0, 2) * 2; }, {{2, 3}}},
      {"narrow end", [](auto& x) { return x[0].narrow(-1, -2, 2); }, {{2, 3}}},
      {"narrow whole", [](auto& x) { return x[0].narrow(0, 0, 3); }, {{3}}},
      {"narrow of narrow",
       [](auto& x) { return x[0].narrow(1, 1, 3).narrow(0, 1, 1).sin(); },
       {{3, 5}}},
      {"embedding",
       [](auto& x) {
         return nn::functional::embedding(int64_on({{3, 0, 3}, {1, 1, 2}}, x[0]), x[0]);
       },
       {{4, 2}}},
  };
}

class IndexGradcheck : public testing::TestWithParam<GradCase> {};
TEST_P(IndexGradcheck, MatchesCentralDifferencesOnTheCpu) {
  gradcheck(GetParam().name, GetParam().f, GetParam().shapes, Device::cpu());
}
class CudaIndexGradcheck : public IndexGradcheck {};
TEST_P(CudaIndexGradcheck, MatchesCentralDifferencesOnTheGpu) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA GPU";
  gradcheck(GetParam().name, GetParam().f, GetParam().shapes, Device("cuda:0"));
}
std::string grad_case_name(const testing::TestParamInfo<GradCase>& info) {
  std::string name;
  for (char c : info.param.name) name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return name;
}
INSTANTIATE_TEST_SUITE_P(Ops, IndexGradcheck, testing::ValuesIn(grad_cases()), grad_case_name);
INSTANTIATE_TEST_SUITE_P(Ops, CudaIndexGradcheck, testing::ValuesIn(grad_cases()), grad_case_name);

TEST(OpsIndex, MaxWithIndicesGivesTheGradientToTheChosenElementAlone) {
  const Tensor x = tensor({{3.0, 1.0, 3.0}}).requires_grad_();
  const Tensor values = std::get<0>(max(x, 1));
  EXPECT_EQ(grad({values.sum()}, {x})[0].to_vector<float>(), (std::vector<float>{1, 0, 0}));
  // The method is amax's: ties share.
  EXPECT_EQ(grad({x.max(1).sum()}, {x})[0].to_vector<float>(), (std::vector<float>{0.5, 0, 0.5}));
}

TEST(OpsIndex, EmbeddingModule) {
  manual_seed(0);
  nn::Embedding embedding(10, 3);
  EXPECT_EQ(embedding.repr(), "Embedding(10, 3)");
  EXPECT_EQ(embedding.weight().sizes(), (Shape{10, 3}));
  EXPECT_TRUE(embedding.weight().requires_grad());
  EXPECT_EQ(embedding.parameters().size(), 1u);
  EXPECT_EQ(embedding.named_parameters()[0].first, "weight");
  // N(0, 1): 30 draws with a mean near 0 and a spread near 1.
  const std::vector<float> w = embedding.weight().to_vector<float>();
  double mean = 0, square = 0;
  for (float v : w) mean += v / 30.0, square += v * v / 30.0;
  EXPECT_LT(std::abs(mean), 0.6);
  EXPECT_GT(square, 0.3);
  EXPECT_LT(square, 3.0);
  const Tensor idx = tensor({{1, 9, 1}, {0, 0, 4}}, kInt64);
  const Tensor out = embedding(idx);
  EXPECT_EQ(out.sizes(), (Shape{2, 3, 3}));
  const std::vector<float> got = out.to_vector<float>();
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(got[0 * 3 + k], w[1 * 3 + k]);
    EXPECT_EQ(got[1 * 3 + k], w[9 * 3 + k]);
    EXPECT_EQ(got[5 * 3 + k], w[4 * 3 + k]);
  }
  // The gradient of a row sums its lookups; rows never looked up get zero.
  out.sum().backward();
  const std::vector<float> g = embedding.weight().grad().to_vector<float>();
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(g[0 * 3 + k], 2);
    EXPECT_EQ(g[1 * 3 + k], 2);
    EXPECT_EQ(g[4 * 3 + k], 1);
    EXPECT_EQ(g[9 * 3 + k], 1);
    EXPECT_EQ(g[5 * 3 + k], 0);
  }
  std::ostringstream printed;
  printed << nn::Sequential(nn::Embedding(4, 2));
  EXPECT_EQ(printed.str(), "Sequential(\n  (0): Embedding(4, 2)\n)");
}

// ---- On a GPU ----

TEST(CudaIndex, ForwardMatchesTheReference) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA GPU";
  const Device gpu("cuda:0");
  check_gathers(gpu);
  check_scatters(gpu);
  check_cats(gpu);
  check_index_selects(gpu);
}

// The GPU adds in the CPU's order with the CPU's arithmetic: the same bits.
TEST(CudaIndex, ScatterAddGivesTheCpusBits) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA GPU";
  check_scatter_order<float>(kFloat32, Device("cuda:0"));
  check_scatter_order<double>(kFloat64, Device("cuda:0"));
  std::mt19937 rng(23);
  std::uniform_real_distribution<double> reals(-1, 1);
  for (DType dtype : {kFloat16, kBFloat16}) {
    std::vector<double> src(64 * 500);
    for (double& x : src) x = reals(rng);
    const Ref index = random_index({64, 500}, 7, rng);
    auto run = [&](Device device) {
      const Tensor s = from_vector(src, {64, 500}, TensorOptions(dtype).device(device));
      return scatter_add(zeros({64, 7}, TensorOptions(dtype).device(device)), 1,
                         make(index, kInt64, Layout::Contiguous, device), s)
          .to(kFloat32)
          .to_vector<float>();
    };
    EXPECT_EQ(run(Device("cuda:0")), run(Device::cpu())) << dtype_torch_name(dtype);
  }
}

TEST(CudaIndex, OutOfRangeIndexIsAnIndexError) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA GPU";
  check_index_errors(Device("cuda:0"));
}

TEST(CudaIndex, EmptyAndLowRankTensors) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA GPU";
  const TensorOptions gpu = TensorOptions(kFloat32).device("cuda:0");
  const TensorOptions i64 = TensorOptions(kInt64).device("cuda:0");
  expect_values(gather(scalar_tensor(3.5, gpu), 0, zeros({}, i64)), Ref{{}, {3.5}}, kFloat32);
  expect_values(gather(ones({2, 3}, gpu), 1, zeros({2, 0}, i64)), Ref{{2, 0}, {}}, kFloat32);
  expect_values(scatter_add(ones({2}, gpu), 0, zeros({0}, i64), ones({0}, gpu)), Ref{{2}, {1, 1}},
                kFloat32);
  expect_values(cat({zeros({0, 3}, gpu), ones({1, 3}, gpu)}), Ref{{1, 3}, {1, 1, 1}}, kFloat32);
  auto [v, i] = max(tensor({{1, 4, 4}}, gpu), 1);
  expect_values(v, Ref{{1}, {4}}, kFloat32);
  expect_values(i, Ref{{1}, {1}}, kInt64);
}

// Every kernel the index steps generate compiles with NVRTC for sm_90 (no GPU needed).
TEST(CudaIndexCodegen, EveryKernelCompilesWithNvrtc) {
  if (!nvrtc_available()) GTEST_SKIP() << nvrtc_unavailable_reason();
  std::vector<CudaSource> sources;
  for (int rank : {1, 3})
    for (int bytes : {1, 2, 4, 8}) sources.push_back(generate_cuda_gather(bytes, rank));
  for (int rank : {1, 2})
    for (DType dtype : kAllDTypes) sources.push_back(generate_cuda_scatter_add(dtype, rank));
  // Every conversion cat's promotion can ask for, and one copy of a higher rank.
  std::vector<std::pair<DType, DType>> conversions;
  for (DType from : kAllDTypes)
    for (DType other : kAllDTypes) {
      const std::pair<DType, DType> conversion = {from, promote_types(from, other)};
      if (std::find(conversions.begin(), conversions.end(), conversion) == conversions.end())
        conversions.push_back(conversion);
    }
  for (const auto& [from, to] : conversions)
    sources.push_back(generate_cuda_strided_copy(from, to, 1));
  sources.push_back(generate_cuda_strided_copy(kFloat16, kFloat32, 3));
  for (const CudaSource& source : sources) {
    SCOPED_TRACE(source.kernel_name);
    EXPECT_NE(source.source.find(source.kernel_name), std::string::npos);
    const CompiledKernel kernel = nvrtc_compile(source.source, source.kernel_name, 9, 0);
    EXPECT_TRUE(kernel.is_cubin);
    EXPECT_GT(kernel.image.size(), 0u);
  }
}

TEST(CudaIndexCodegen, KernelsAreNamedByWhatTheyAreSpecialisedOn) {
  EXPECT_EQ(cuda_gather_kernel_name(4, 2), "i_gather_b4_r2");
  EXPECT_EQ(cuda_scatter_add_kernel_name(kBFloat16, 3), "i_scatter_add_bf16_r3");
  EXPECT_EQ(cuda_strided_copy_kernel_name(kInt32, kFloat32, 1), "i_copy_i32_f32_r1");
  EXPECT_EQ(generate_cuda_gather(2, 3).source, generate_cuda_gather(2, 3).source);
}

// The index kernels' words, read back at the offsets their layouts declare.
TEST(CudaIndexKernelArgs, PackedWordsMatchTheDeclaredLayouts) {
  for (int rank : {1, 4}) {
    SCOPED_TRACE(testing::Message() << "rank " << rank);
    Shape sizes;
    Strides a, b, c;
    for (int d = 0; d < rank; ++d) {
      sizes.push_back(10 + d);
      a.push_back(100 + d);
      b.push_back(200 + d);
      c.push_back(300 + d);
    }
    auto expect_array = [&](const KernelArgs& words, const ArgLayout& layout, const char* field,
                            const Strides& values) {
      for (int d = 0; d < rank; ++d)
        EXPECT_EQ(words[layout.offset(field) + d], static_cast<uint64_t>(values[d])) << field;
    };

    GatherWords g{7, 1, 5, 0x10, 0x20, 0x30, 0x40, sizes, a, b};
    const ArgLayout gather_layout = gather_arg_layout(rank);
    const KernelArgs gather_words = pack_gather_args(g);
    ASSERT_EQ(static_cast<int>(gather_words.size()), gather_layout.words());
    EXPECT_EQ(gather_words[gather_layout.offset("n")], 7u);
    EXPECT_EQ(gather_words[gather_layout.offset("dim")], 1u);
    EXPECT_EQ(gather_words[gather_layout.offset("bound")], 5u);
    EXPECT_EQ(gather_words[gather_layout.offset("x")], 0x10u);
    EXPECT_EQ(gather_words[gather_layout.offset("index")], 0x20u);
    EXPECT_EQ(gather_words[gather_layout.offset("out")], 0x30u);
    EXPECT_EQ(gather_words[gather_layout.offset("error")], 0x40u);
    expect_array(gather_words, gather_layout, "size", sizes);
    expect_array(gather_words, gather_layout, "x_stride", a);
    expect_array(gather_words, gather_layout, "index_stride", b);

    ScatterAddWords s{3, 4, 0, 6, 0x11, 0x21, 0x31, 0x41, sizes, a, b, c};
    const ArgLayout scatter_layout = scatter_add_arg_layout(rank);
    const KernelArgs scatter_words = pack_scatter_add_args(s);
    ASSERT_EQ(static_cast<int>(scatter_words.size()), scatter_layout.words());
    EXPECT_EQ(scatter_words[scatter_layout.offset("lines")], 3u);
    EXPECT_EQ(scatter_words[scatter_layout.offset("length")], 4u);
    EXPECT_EQ(scatter_words[scatter_layout.offset("dim")], 0u);
    EXPECT_EQ(scatter_words[scatter_layout.offset("bound")], 6u);
    EXPECT_EQ(scatter_words[scatter_layout.offset("index")], 0x11u);
    EXPECT_EQ(scatter_words[scatter_layout.offset("src")], 0x21u);
    EXPECT_EQ(scatter_words[scatter_layout.offset("out")], 0x31u);
    EXPECT_EQ(scatter_words[scatter_layout.offset("error")], 0x41u);
    expect_array(scatter_words, scatter_layout, "size", sizes);
    expect_array(scatter_words, scatter_layout, "index_stride", a);
    expect_array(scatter_words, scatter_layout, "src_stride", b);
    expect_array(scatter_words, scatter_layout, "out_stride", c);

    StridedCopyWords copy{9, 0x12, 0x22, sizes, a, b};
    const ArgLayout copy_layout = strided_copy_arg_layout(rank);
    const KernelArgs copy_words = pack_strided_copy_args(copy);
    ASSERT_EQ(static_cast<int>(copy_words.size()), copy_layout.words());
    EXPECT_EQ(copy_words[copy_layout.offset("n")], 9u);
    EXPECT_EQ(copy_words[copy_layout.offset("in")], 0x12u);
    EXPECT_EQ(copy_words[copy_layout.offset("out")], 0x22u);
    expect_array(copy_words, copy_layout, "size", sizes);
    expect_array(copy_words, copy_layout, "in_stride", a);
    expect_array(copy_words, copy_layout, "out_stride", b);
  }
  EXPECT_EQ(gather_arg_layout(1).declare("IndexArgs"),
            "struct IndexArgs {\n  long long n;\n  long long dim;\n  long long bound;\n"
            "  const void* x;\n  const void* index;\n  void* out;\n  unsigned long long* error;\n"
            "  long long size[1];\n  long long x_stride[1];\n  long long index_stride[1];\n};\n");
}

}  // namespace
}  // namespace lazyfuse
