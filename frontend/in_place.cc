// In-place ops: add_, sub_, mul_, div_, copy_, fill_, zero_.
#include "absl/strings/str_cat.h"
#include "lazyfuse/frontend/autograd.h"
#include "lazyfuse/frontend/op_builder.h"
#include "lazyfuse/frontend/tensor.h"
#include "lazyfuse/ir/errors.h"

namespace lazyfuse {

// Note [In-place updates]
// Values are immutable: a pending value means one computation for as long as it lives, which is
// what lets every graph be built, cached and fused without tracking writes. An in-place op on a
// tensor therefore computes its result out of place and rebinds the tensor's handle
// (TensorImpl::value, shared by every copy of the handle: the module's and the optimizer's) to
// it, and bumps the version counter. Everything made from the old value — a pending loss, a
// gradient, a view — keeps meaning what it meant, so there are no write-after-read hazards for
// the scheduler to find. The version counter gives PyTorch's error when backward() would read a
// value the user has since changed in place. The old buffer is freed when nothing reads it;
// where nothing can read it after the evaluation that computes the new value, that evaluation
// writes the new value into it (Note [Writing an update into its own buffer] in
// runtime/lazy.cc), which is safe exactly because nothing can tell.
namespace {

std::string at(const Loc& where) {
  return absl::StrCat(" (at ", SourceLoc::from(where).str(), ")");
}

// Runs `compute` (which builds the result from the tensor's current value) and rebinds `self`
// to its result; on any error nothing changes.
template <typename Compute>
Tensor& update_in_place(Tensor& self, const char* what, bool cast_any, const Loc& where,
                        Compute compute) {
  TensorImpl& impl = *self.impl();
  const bool recording = GradMode::is_enabled();
  if (recording && self.requires_grad() && self.is_leaf())
    throw GradError(
        absl::StrCat("a leaf Variable that requires grad is being used in an in-place operation (",
                     what, ")", at(where)));
  // The ops recorded for the result save the current value at the version it will be replaced
  // at: it is the value they need, and the rebinding below must not make it look stale.
  const uint32_t version = impl.version;
  ++impl.version;
  try {
    Tensor result = compute();
    if (result.sizes() != self.sizes())
      throw ShapeError(absl::StrCat(what, ": output with shape ", shape_str(self.sizes()),
                                    " doesn't match the broadcast shape ",
                                    shape_str(result.sizes()), at(where)));
    if (result.dtype() != self.dtype()) {
      const bool narrowing = (is_floating(result.dtype()) && !is_floating(self.dtype())) ||
                             (self.dtype() == DType::Bool && result.dtype() != DType::Bool);
      if (narrowing && !cast_any)
        throw DTypeError(absl::StrCat(what, ": result type ", dtype_torch_name(result.dtype()),
                                      " can't be cast to the desired output type ",
                                      dtype_torch_name(self.dtype()), at(where)));
      result = result.to(self.dtype(), where);
    }
    note_replaced(result.value(), impl.value);
    impl.value = result.value();
    // Under no_grad a leaf keeps its grad() and stays a leaf (an optimizer's step); otherwise
    // the tensor's history is now the result's.
    if (recording) impl.autograd = result.impl()->autograd;
  } catch (...) {
    impl.version = version;
    throw;
  }
  return self;
}

// add_'s and sub_'s `other * alpha`, with no multiply for the usual alpha of 1.
Tensor times_alpha(const Tensor& other, const Scalar& alpha, const Loc& where) {
  const bool unit =
      alpha.kind() != ScalarKind::Floating ? alpha.to_int() == 1 : alpha.to_double() == 1.0;
  return unit ? other : operator*({other, where}, alpha);
}

}  // namespace

uint32_t Tensor::_version() const { return impl()->version; }

void Tensor::set_data(const Tensor& new_data) {
  TensorImpl& impl = *this->impl();
  impl.value = new_data.value();
  ++impl.version;
}

Tensor& Tensor::add_(const Tensor& other, Scalar alpha, Loc where) {
  return update_in_place(*this, "add_", false, where, [&] {
    return operator+({*this, where}, times_alpha(other, alpha, where));
  });
}
Tensor& Tensor::add_(Scalar other, Loc where) {
  return update_in_place(*this, "add_", false, where, [&] {
    return operator+({*this, where}, other);
  });
}
Tensor& Tensor::sub_(const Tensor& other, Scalar alpha, Loc where) {
  return update_in_place(*this, "sub_", false, where, [&] {
    return operator-({*this, where}, times_alpha(other, alpha, where));
  });
}
Tensor& Tensor::sub_(Scalar other, Loc where) {
  return update_in_place(*this, "sub_", false, where, [&] {
    return operator-({*this, where}, other);
  });
}
Tensor& Tensor::mul_(const Tensor& other, Loc where) {
  return update_in_place(*this, "mul_", false, where, [&] {
    return operator*({*this, where}, other);
  });
}
Tensor& Tensor::mul_(Scalar other, Loc where) {
  return update_in_place(*this, "mul_", false, where, [&] {
    return operator*({*this, where}, other);
  });
}
Tensor& Tensor::div_(const Tensor& other, Loc where) {
  return update_in_place(*this, "div_", false, where, [&] {
    return operator/({*this, where}, other);
  });
}
Tensor& Tensor::div_(Scalar other, Loc where) {
  return update_in_place(*this, "div_", false, where, [&] {
    return operator/({*this, where}, other);
  });
}

Tensor& Tensor::copy_(const Tensor& source, Loc where) {
  return update_in_place(*this, "copy_", true, where, [&] {
    Tensor moved = source.to(device(), where).to(dtype(), where);
    if (moved.sizes() != sizes()) moved = moved.expand(sizes(), where);
    // Always a node of its own, so that this tensor never shares autograd state with `source`.
    return detail::make_op(Op::Copy, {moved}, {}, where);
  });
}

Tensor& Tensor::fill_(Scalar value, Loc where) {
  return update_in_place(*this, "fill_", true, where, [&] {
    return full(sizes(), value, TensorOptions(dtype()).device(device()), where);
  });
}

Tensor& Tensor::zero_(Loc where) { return fill_(0, where); }

}  // namespace lazyfuse
