// Memory in and out without a copy: tensors over memory the caller owns (LibTorch's from_blob),
// and DLPack's tensors handed to and taken from other libraries (to_dlpack, from_dlpack).
#pragma once

#include <functional>

#include "lazyfuse/frontend/tensor.h"

// DLPack's managed tensor (<dlpack/dlpack.h>, Debian's libdlpack-dev): declared here so that
// only code that calls to_dlpack or from_dlpack needs the header.
struct DLManagedTensor;

namespace lazyfuse {

// A tensor over `data`, `sizes` elements of options.dtype() laid out by `strides` (contiguous
// when not given), on options.device(): CPU memory, or CUDA memory of that device. No copy: the
// tensor reads the memory where it lies, and so does every view of it. Without a deleter the
// caller keeps the memory alive as long as any tensor uses it; with one, `deleter(data)` runs
// once, when the last tensor using the memory goes (it must not throw). In-place updates of the
// tensor compute new values into memory of lazyfuse's own: `data` is read, never written.
Tensor from_blob(void* data, Shape sizes, TensorOptions options = {}, Loc where = Loc::current());
Tensor from_blob(void* data, Shape sizes, Strides strides, TensorOptions options = {},
                 Loc where = Loc::current());
Tensor from_blob(void* data, Shape sizes, std::function<void(void*)> deleter,
                 TensorOptions options = {}, Loc where = Loc::current());
Tensor from_blob(void* data, Shape sizes, Strides strides, std::function<void(void*)> deleter,
                 TensorOptions options = {}, Loc where = Loc::current());

// The tensor's value (computed first) as a DLPack tensor that shares its memory. The consumer
// owns the result and calls its deleter once when done; the memory stays valid until then, even
// after every lazyfuse tensor using it is gone. bool has no DLPack type before DLPack 0.8: a
// DTypeError.
DLManagedTensor* to_dlpack(const Tensor& tensor, Loc where = Loc::current());
// A tensor over a DLPack tensor's memory, taking ownership of `managed`: its deleter runs once,
// when the last tensor using the memory goes (also when this throws, having rejected a device or
// a type lazyfuse has no dtype for).
Tensor from_dlpack(DLManagedTensor* managed, Loc where = Loc::current());

}  // namespace lazyfuse
