// from_blob and DLPack: tensors over memory lazyfuse did not allocate, and lazyfuse's memory
// lent to others, both without a copy.
#include "lazyfuse/frontend/interop.h"

#include <dlpack/dlpack.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/runtime/backend.h"
#include "lazyfuse/runtime/devices.h"
#include "lazyfuse/runtime/lazy.h"
#include "lazyfuse/runtime/storage.h"

namespace lazyfuse {
namespace {

std::string at(Loc where) { return absl::StrCat(" (at ", SourceLoc::from(where).str(), ")"); }

// Elements from the first to one past the last that `sizes` and `strides` reach: 0 when empty.
int64_t extent(const Shape& sizes, const Strides& strides) {
  if (numel(sizes) == 0) return 0;
  int64_t last = 0;
  for (size_t d = 0; d < sizes.size(); ++d) last += (sizes[d] - 1) * strides[d];
  return last + 1;
}

// Hands `data` to a deleter when it goes out of scope still armed: memory given to lazyfuse
// goes back to its owner on every path, the errors below included.
struct Owned {
  void* data;
  std::function<void(void*)> deleter;
  bool armed = true;
  ~Owned() {
    if (armed && deleter) deleter(data);
  }
};

// A tensor over `data` as laid out, whose storage hands `data` to `deleter` when it goes; if the
// arguments are rejected, `deleter` runs before the error propagates.
Tensor wrap(void* data, const Shape& sizes, const Strides& strides, DType dtype,
            const Device& requested, std::function<void(void*)> deleter, const char* what,
            Loc where) {
  Owned owned{data, std::move(deleter)};
  if (strides.size() != sizes.size())
    throw ShapeError(absl::StrCat(what, ": ", strides.size(), " strides for ", sizes.size(),
                                  " dims of shape ", shape_str(sizes), at(where)));
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] < 0)
      throw ShapeError(
          absl::StrCat(what, ": negative size in shape ", shape_str(sizes), at(where)));
    if (strides[d] < 0)
      throw ShapeError(absl::StrCat(what, ": negative stride ", strides[d], " at dim ", d,
                                    " (lazyfuse's strides are non-negative)", at(where)));
  }
  numel(sizes);  // throws a ShapeError where the sizes multiply past int64
  if (data == nullptr && numel(sizes) > 0)
    throw Error(absl::StrCat(what, ": null data for ", numel(sizes), " elements", at(where)));
  const Device device = resolve_device(requested);
  const int64_t nbytes = extent(sizes, strides) * dtype_size(dtype);
  BufferView buffer;
  buffer.storage = Storage::wrap(device, data, nbytes, std::move(owned.deleter));
  owned.armed = false;
  buffer.shape = sizes;
  buffer.strides = strides;
  buffer.dtype = dtype;
  return Tensor(make_leaf(std::move(buffer), SourceLoc::from(where)));
}

Tensor from_blob_with(void* data, Shape sizes, Strides strides, std::function<void(void*)> deleter,
                      const TensorOptions& options, Loc where) {
  Tensor t = wrap(data, sizes, strides, options.dtype(), options.device(), std::move(deleter),
                  "from_blob", where);
  if (options.requires_grad()) t.requires_grad_(true);
  return t;
}

// DLPack's type of each dtype, and back.
DLDataType dlpack_type(DType dtype, Loc where) {
  switch (dtype) {
    case DType::Int32:
      return {kDLInt, 32, 1};
    case DType::Int64:
      return {kDLInt, 64, 1};
    case DType::Float16:
      return {kDLFloat, 16, 1};
    case DType::BFloat16:
      return {kDLBfloat, 16, 1};
    case DType::Float32:
      return {kDLFloat, 32, 1};
    case DType::Float64:
      return {kDLFloat, 64, 1};
    default:
      break;
  }
  throw DTypeError(absl::StrCat("to_dlpack: DLPack ", DLPACK_VERSION / 100, ".",
                                DLPACK_VERSION % 100 / 10, " has no type for ",
                                dtype_torch_name(dtype), at(where)));
}

DType dtype_of(const DLDataType& type, Loc where) {
  if (type.lanes == 1) {
    if (type.code == kDLInt && type.bits == 32) return DType::Int32;
    if (type.code == kDLInt && type.bits == 64) return DType::Int64;
    if (type.code == kDLFloat && type.bits == 16) return DType::Float16;
    if (type.code == kDLBfloat && type.bits == 16) return DType::BFloat16;
    if (type.code == kDLFloat && type.bits == 32) return DType::Float32;
    if (type.code == kDLFloat && type.bits == 64) return DType::Float64;
  }
  throw DTypeError(absl::StrCat("from_dlpack: no lazyfuse dtype for DLPack type code ",
                                static_cast<int>(type.code), " of ", static_cast<int>(type.bits),
                                " bits and ", type.lanes, " lanes", at(where)));
}

// What a DLPack tensor made by to_dlpack keeps alive: the storage, and the arrays the DLTensor
// points at.
struct Lent {
  DLManagedTensor managed{};
  std::shared_ptr<Storage> storage;
  std::vector<int64_t> shape, strides;
};

}  // namespace

Tensor from_blob(void* data, Shape sizes, TensorOptions options, Loc where) {
  Strides strides = contiguous_strides(sizes);
  return from_blob_with(data, std::move(sizes), std::move(strides), nullptr, options, where);
}
Tensor from_blob(void* data, Shape sizes, Strides strides, TensorOptions options, Loc where) {
  return from_blob_with(data, std::move(sizes), std::move(strides), nullptr, options, where);
}
Tensor from_blob(void* data, Shape sizes, std::function<void(void*)> deleter, TensorOptions options,
                 Loc where) {
  Strides strides = contiguous_strides(sizes);
  return from_blob_with(data, std::move(sizes), std::move(strides), std::move(deleter), options,
                        where);
}
Tensor from_blob(void* data, Shape sizes, Strides strides, std::function<void(void*)> deleter,
                 TensorOptions options, Loc where) {
  return from_blob_with(data, std::move(sizes), std::move(strides), std::move(deleter), options,
                        where);
}

DLManagedTensor* to_dlpack(const Tensor& tensor, Loc where) {
  const DLDataType type = dlpack_type(tensor.dtype(), where);
  eval(tensor);
  const BufferView& buffer = *tensor.value()->buffer;
  auto lent = std::make_unique<Lent>();
  lent->storage = buffer.storage;
  lent->shape.assign(buffer.shape.begin(), buffer.shape.end());
  lent->strides.assign(buffer.strides.begin(), buffer.strides.end());
  DLTensor& dl = lent->managed.dl_tensor;
  const Device device = buffer.storage->device();
  dl.device = DLDevice{static_cast<DLDeviceType>(backend_for(device).dlpack_device_type()),
                       std::max(device.index(), 0)};
  // The view's first element itself, as PyTorch hands it: consumers that ignore byte_offset
  // read the right memory too.
  dl.data = buffer.data();
  dl.byte_offset = 0;
  dl.ndim = static_cast<int32_t>(lent->shape.size());
  dl.dtype = type;
  dl.shape = lent->shape.data();
  dl.strides = lent->strides.data();
  lent->managed.manager_ctx = lent.get();
  lent->managed.deleter = [](DLManagedTensor* self) {
    delete static_cast<Lent*>(self->manager_ctx);
  };
  return &lent.release()->managed;
}

Tensor from_dlpack(DLManagedTensor* managed, Loc where) {
  if (managed == nullptr) throw Error(absl::StrCat("from_dlpack: null tensor", at(where)));
  // The producer's deleter, once, whatever happens below.
  auto give_back = [managed](void*) {
    if (managed->deleter != nullptr) managed->deleter(managed);
  };
  Owned owned{nullptr, give_back};
  const DLTensor& dl = managed->dl_tensor;
  const DType dtype = dtype_of(dl.dtype, where);
  std::optional<Device> device;
  std::string known;
  for (DeviceType type : registered_device_types()) {
    const int code = backend_for(Device(type)).dlpack_device_type();
    if (code == dl.device.device_type) device = Device(type, dl.device.device_id);
    absl::StrAppend(&known, known.empty() ? "" : ", ", device_type_name(type), " (", code, ")");
  }
  if (!device)
    throw DeviceStringError(
        absl::StrCat("from_dlpack: DLPack device type ", static_cast<int>(dl.device.device_type),
                     " has no backend here; the backends take ", known, at(where)));
  if (dl.ndim < 0)
    throw ShapeError(absl::StrCat("from_dlpack: negative ndim ", dl.ndim, at(where)));
  Shape sizes(dl.shape, dl.shape + dl.ndim);
  // No strides: compact and row-major.
  Strides strides =
      dl.strides != nullptr ? Strides(dl.strides, dl.strides + dl.ndim) : contiguous_strides(sizes);
  void* data = static_cast<std::byte*>(dl.data) + dl.byte_offset;
  owned.armed = false;
  return wrap(data, sizes, strides, dtype, *device, give_back, "from_dlpack", where);
}

}  // namespace lazyfuse
