// Runs a schedule: each step on its device (cpu_executor.cc, cuda_executor.cc), transfers
// between devices, and the release of intermediate buffers once no later step reads them.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "codegen/cpu_program.h"
#include "codegen/cuda_codegen.h"
#include "ir/schedule.h"
#include "runtime/storage.h"

namespace lazyfuse {

// What a GPU launch of an elementwise step can reuse while its operands keep their layout: the
// plan (variant, collapsed sizes and strides), the kernel and the grid; and what a CPU
// elementwise step can reuse always: its compiled program. Kept per step of a cached schedule
// (Note [Schedule cache] in lazy.cc) and used under the evaluation lock.
struct LaunchMemo {
  bool valid = false;
  uint64_t kernel_generation = 0;  // cuda::kernel_cache_generation() when it was made
  bool fast_math = false;
  std::vector<Shape> shapes;
  std::vector<Strides> strides;
  std::vector<bool> aligned;  // each operand's address, to four elements
  CudaElementwiseLaunch plan;
  void* function = nullptr;  // the CUfunction
  std::string name;          // its cache key, for errors
  int64_t blocks = 0;
  // A CPU elementwise step's compiled program (runtime/cpu_executor.h).
  std::shared_ptr<const CpuProgram> cpu_program;
};

// `values` holds a buffer for every param (by value id) on entry; on return it also holds the
// buffer of every graph output. `memos`, when given, has one entry per step, kept between runs
// of the same schedule.
void run_schedule(const Schedule& schedule, ValueBuffers& values,
                  std::vector<LaunchMemo>* memos = nullptr);

// A contiguous copy of `source` on `device` (host to GPU, GPU to host, GPU to GPU through
// peer copies where the driver can, host to host). Returns `source` itself when it is already
// contiguous there.
BufferView copy_to_device(const BufferView& source, const Device& device);
// A view step on any device: the operand's storage with the view's sizes, strides and offset.
BufferView apply_view(const Node& node, const BufferView& input);
// A contiguous copy on the same device, or `source` when it is contiguous.
BufferView contiguous(const BufferView& source);

}  // namespace lazyfuse
