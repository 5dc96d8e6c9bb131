// Tests of lazyfuse's views: reshape, view, transpose, permute, (un)squeeze, expand, narrow and
// t give the right shapes and values; reshape copies where no view exists and view refuses to;
// chains of views and views of pending values; and every dtype survives them.
//
// Expected values come from the independent float64 reference in tests/reference/, whose views
// are index maps rather than strides and never call lazyfuse to compute anything.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "lazyfuse/lazyfuse.h"
#include "tests/reference/reference.h"

namespace lazyfuse {
namespace {

// The expected values and their vocabulary (Host, ref_map, random_host, expect_matches, ...)
// come from the independent float64 reference.
using namespace reference;

// Distinct values 0.5, 1.5, ... so that any misplaced element shows.
Host iota_host(const Shape& shape) {
  Host h{shape, std::vector<double>(count(shape))};
  for (size_t i = 0; i < h.v.size(); ++i) h.v[i] = static_cast<double>(i) + 0.5;
  return h;
}

TEST(OpsViews, ShapesAndValues) {
  const Host h = iota_host({2, 3, 4});
  const Tensor x = to_tensor(h, kFloat32);
  struct ViewCase {
    const char* name;
    Tensor got;
    Host want;
  };
  const Host col = iota_host({3, 1});
  const Tensor tcol = to_tensor(col, kFloat32);
  const std::vector<ViewCase> cases = {
      {"reshape 4,-1", x.reshape({4, -1}), host_reshape(h, {4, 6})},
      {"reshape -1", x.reshape({-1}), host_reshape(h, {24})},
      {"reshape -1,2,3", x.reshape({-1, 2, 3}), host_reshape(h, {4, 2, 3})},
      {"view 6,4", x.view({6, 4}), host_reshape(h, {6, 4})},
      {"view 2,-1", x.view({2, -1}), host_reshape(h, {2, 12})},
      {"transpose 0,2", x.transpose(0, 2), host_transpose(h, 0, 2)},
      {"transpose -1,-2", x.transpose(-1, -2), host_transpose(h, 1, 2)},
      {"permute 1,2,0", x.permute({1, 2, 0}), host_permute(h, {1, 2, 0})},
      {"permute -1,0,1", x.permute({-1, 0, 1}), host_permute(h, {2, 0, 1})},
      {"unsqueeze 0", x.unsqueeze(0), host_reshape(h, {1, 2, 3, 4})},
      {"unsqueeze -1", x.unsqueeze(-1), host_reshape(h, {2, 3, 4, 1})},
      {"unsqueeze 2", x.unsqueeze(2), host_reshape(h, {2, 3, 1, 4})},
      {"squeeze", x.unsqueeze(0).unsqueeze(2).squeeze(), h},
      {"squeeze 2", x.unsqueeze(2).squeeze(2), h},
      {"squeeze non-1 dim", x.squeeze(1), h},
      {"expand new dims", tcol.expand({2, 3, 4}), host_expand(col, {2, 3, 4})},
      {"expand -1", tcol.expand({-1, 5}), host_expand(col, {3, 5})},
      {"narrow 1,1,2", x.narrow(1, 1, 2), host_narrow(h, 1, 1, 2)},
      {"narrow 2,-3,2", x.narrow(2, -3, 2), host_narrow(h, 2, 1, 2)},
      {"narrow 0,1,1", x.narrow(0, 1, 1), host_narrow(h, 0, 1, 1)},
      {"t 2-D", x.reshape({6, 4}).t(), host_transpose(host_reshape(h, {6, 4}), 0, 1)},
      {"t 1-D", x.reshape({-1}).t(), host_reshape(h, {24})},
      {"expand scalar", scalar_tensor(3.5).expand({2, 3}),
       Host{{2, 3}, std::vector<double>(6, 3.5)}},
  };
  for (const ViewCase& c : cases) expect_matches(c.got, c.want, kFloat32, {}, c.name);
}

TEST(OpsViews, CopiesWhenNoViewExists) {
  const Host h = iota_host({2, 3, 4});
  const Tensor x = to_tensor(h, kFloat32);
  const Tensor xt = x.transpose(0, 2);  // [4, 3, 2], strides [1, 4, 12]
  EXPECT_FALSE(xt.is_contiguous());
  EXPECT_TRUE(x.is_contiguous());
  // reshape of a transposed tensor must copy, and read it in the transposed order.
  expect_matches(xt.reshape({-1}), host_reshape(host_transpose(h, 0, 2), {24}), kFloat32, {},
                 "reshape of transposed");
  expect_matches(xt.reshape({6, 4}), host_reshape(host_transpose(h, 0, 2), {6, 4}), kFloat32, {},
                 "reshape of transposed to 2-D");
  EXPECT_FALSE(xt.reshape({-1}).shares_storage_with(x));
  EXPECT_TRUE(x.reshape({-1}).shares_storage_with(x));
  EXPECT_TRUE(xt.shares_storage_with(x));
  // view cannot copy: PyTorch raises, and so must lazyfuse.
  EXPECT_THROW(xt.view({24}), ShapeError);
  EXPECT_THROW(x.reshape({6, 4}).t().view({24}), ShapeError);
  EXPECT_THROW(x.transpose(0, 1).view({3, 8}), ShapeError);
  EXPECT_THROW(x.narrow(2, 0, 3).view({18}), ShapeError);
  // Views of a non-contiguous tensor that do exist: splitting its contiguous last dim, and
  // keeping the shape.
  expect_matches(x.transpose(0, 1).view({3, 2, 2, 2}),
                 host_reshape(host_transpose(h, 0, 1), {3, 2, 2, 2}), kFloat32, {},
                 "view splitting a dim of a transposed tensor");
  expect_matches(xt.view({4, 3, 2}), host_transpose(h, 0, 2), kFloat32, {}, "view same shape");
  expect_matches(xt.unsqueeze(1).squeeze(1), host_transpose(h, 0, 2), kFloat32, {},
                 "unsqueeze/squeeze of transposed");
  // Whole rows of a narrowed tensor stay contiguous, so this view exists.
  expect_matches(x.narrow(0, 1, 1).view({12}), host_reshape(host_narrow(h, 0, 1, 1), {12}),
                 kFloat32, {}, "view of narrowed rows");
  // Reshape of an expanded tensor copies the repeated values.
  const Host col = iota_host({3, 1});
  expect_matches(to_tensor(col, kFloat32).expand({3, 4}).reshape({12}),
                 host_reshape(host_expand(col, {3, 4}), {12}), kFloat32, {}, "reshape of expand");
  // Chains of views, and views of pending values.
  Host chain = host_expand(
      host_reshape(host_narrow(host_transpose(h, 0, 1), 2, 1, 2), {3, 1, 2, 2}), {3, 5, 2, 2});
  expect_matches(x.transpose(0, 1).narrow(2, 1, 2).unsqueeze(1).expand({3, 5, 2, 2}), chain,
                 kFloat32, {}, "chain of views");
  Host pending =
      host_narrow(host_transpose(ref_unary(h, [](double v) { return v + 1; }), 0, 2), 1, 1, 2);
  expect_matches((x + 1).transpose(0, 2).narrow(1, 1, 2), pending, kFloat32, {},
                 "views of a pending value");
  // Bad views are ShapeErrors.
  EXPECT_THROW(x.reshape({5, -1}), ShapeError);
  EXPECT_THROW(x.narrow(1, 2, 5), ShapeError);
  EXPECT_THROW(x.expand({2, 5, 4}), ShapeError);
  EXPECT_THROW(x.permute({0, 0, 1}), ShapeError);
  EXPECT_THROW(x.transpose(0, 3), ShapeError);
}

// A reshape that is a view of the layout the frontend foresaw, where a rewrite lays the operand
// out otherwise: sink_views computes (x + 1).t() as x.t() + 1, contiguous in [6, 4], where the
// frontend foresaw the transposed strides of x + 1. The split reshape and the permute after it
// then leave the final reshape no view of [2, 2, 6]; it must copy (Note [Reshape of any
// layout]), not fail.
TEST(OpsViews, AReshapeStaysValidWhereARewriteChangesItsOperandsLayout) {
  const Host h = iota_host({4, 6});
  const Tensor x = to_tensor(h, kFloat32);
  const Tensor split = (x + 1).t().reshape({6, 2, 2}).permute({1, 2, 0});
  EXPECT_TRUE(split.is_contiguous());  // as foreseen: the reshape below is a view
  const Host want = host_reshape(
      host_permute(host_reshape(host_transpose(ref_unary(h, [](double v) { return v + 1; }), 0, 1),
                                {6, 2, 2}),
                   {1, 2, 0}),
      {24});
  expect_matches(split.reshape({24}), want, kFloat32, {}, "reshape after a sunk transpose");
  expect_matches(split.view({24}), want, kFloat32, {}, "view after a sunk transpose");
}

TEST(OpsViews, ViewsKeepTheirDTypeOnEveryDType) {
  std::mt19937 rng(13);
  for (DType dtype : kAllDTypes) {
    Host h = random_host(rng, {4, 5, 6}, dtype, kWide);
    Tensor x = to_tensor(h, dtype);
    std::string what = name_of(dtype);
    expect_matches(x.permute({2, 0, 1}).reshape({6, -1}),
                   host_reshape(host_permute(h, {2, 0, 1}), {6, 20}), dtype, {}, what + " permute");
    expect_matches(x.narrow(1, 2, 3).unsqueeze(0).expand({2, 4, 3, 6}),
                   host_expand(host_reshape(host_narrow(h, 1, 2, 3), {1, 4, 3, 6}), {2, 4, 3, 6}),
                   dtype, {}, what + " narrow/expand");
  }
}

}  // namespace
}  // namespace lazyfuse
