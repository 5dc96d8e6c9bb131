// Runs a schedule: each compute step by the backend of its device (runtime/backend.h), views
// and transfers here, and the release of intermediate buffers once no later step reads them.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lazyfuse/ir/schedule.h"
#include "lazyfuse/runtime/backend.h"
#include "lazyfuse/runtime/storage.h"

namespace lazyfuse {

// `values` holds a buffer for every param (by value id) on entry; on return it also holds the
// buffer of every graph output. `caches`, when given, has one entry per step, kept between runs
// of the same schedule, for the backends to fill.
void run_schedule(const Schedule& schedule, ValueBuffers& values,
                  std::vector<std::unique_ptr<StepCache>>* caches = nullptr);

// A contiguous copy of `source` on `device` (host to GPU, GPU to host, GPU to GPU through
// peer copies where the driver can, host to host). Returns `source` itself when it is already
// contiguous there.
BufferView copy_to_device(const BufferView& source, const Device& device);
// Copies `source`'s elements into `target`'s buffer where it lies (any devices; the same dtype
// and element count, `target` contiguous): a value that kernels, schedules and CUDA graphs read
// at one address, changed between evaluations.
void copy_into(const BufferView& source, const BufferView& target);
// A view step on any device: the operand's storage with the view's sizes, strides and offset;
// a reshape that no strides of the operand express reads a contiguous copy of it (Note [Reshape
// of any layout] in executor.cc).
BufferView apply_view(const Node& node, const BufferView& input);
// A contiguous copy on the same device, or `source` when it is contiguous.
BufferView contiguous(const BufferView& source);

// Host values in and out, converted between dtypes: how the frontend reads a value back
// (printing, to_vector, item) and makes one from C++ numbers.
// `source`'s elements (any device, any layout) as contiguous elements of `as` at `out`.
void read_to_host(const BufferView& source, DType as, void* out);
// A new host buffer of `dtype` and `shape` holding numel(shape) contiguous elements of `from`
// at `data`, converted.
BufferView host_buffer_from(const void* data, DType from, DType dtype, const Shape& shape);

}  // namespace lazyfuse
