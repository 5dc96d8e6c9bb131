// How the frontend turns a call into a pending node: operand checks, the dtype and shape rules
// of ir/, the layout of views, and the bound on pending work. Shared by tensor.cc, factories.cc
// and nn.cc.
#pragma once

#include <initializer_list>
#include <span>

#include "lazyfuse/frontend/tensor.h"
#include "lazyfuse/ir/graph.h"

namespace lazyfuse::detail {

// A node of `op` over `operands`. The device is the first operand's; dtype and shape follow
// the op's rules (`given` supplies what the attributes do not: generator and view shapes).
// Errors carry the file:line of `where`.
Tensor make_op(Op op, std::span<const Tensor> operands, Attrs attrs, const Loc& where,
               Shape given = {}, DType explicit_dtype = DType::Float32,
               Device device = Device::cpu());
inline Tensor make_op(Op op, std::initializer_list<Tensor> operands, Attrs attrs, const Loc& where,
                      Shape given = {}, DType explicit_dtype = DType::Float32,
                      Device device = Device::cpu()) {
  return make_op(op, std::span(operands.begin(), operands.size()), std::move(attrs), where,
                 std::move(given), explicit_dtype, device);
}

// A scalar operand for `like`: a constant of the dtype PyTorch gives the scalar next to it.
Tensor scalar_operand(const Scalar& value, const Tensor& like, const Loc& where);
Tensor constant(const Scalar& value, DType dtype, Shape shape, Device device, const Loc& where);

// The global generator's seed and the Philox offset of `count` draws taken from it now, as a
// random tensor of `count` elements made now would take them (frontend/factories.cc).
struct RandomDraws {
  uint64_t seed = 0, offset = 0;
};
RandomDraws take_random_draws(int64_t count);

// Rethrows the current lazyfuse error with " (at FILE:LINE)" appended, keeping its type.
[[noreturn]] void rethrow_at(const Loc& where);

}  // namespace lazyfuse::detail
