// The boundary between the executor and the devices. The executor (executor.cc) runs a
// schedule's steps in order and hands each compute step to the backend of its device; it never
// asks what kind of device that is. One backend is registered per DeviceType (backend.cc):
// the CPU's (cpu_backend.cc) and CUDA's (cuda_backend.cc); tests put one of their own in place
// with ScopedBackend.
//
// A backend owns, for its devices: finding or compiling a compute step's code and running it
// (with whatever it keeps between runs in its StepCache), memory, dense copies, and waiting for
// queued work. Codegen's kernel plan (codegen/kernel_plan.h) is shared; each backend's emitter
// and calling convention are its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>

#include "absl/functional/function_ref.h"
#include "lazyfuse/ir/schedule.h"
#include "lazyfuse/runtime/storage.h"

namespace lazyfuse {

// What a backend keeps for one step of a cached schedule between evaluations (Note [Schedule
// cache] in lazy.cc): its compiled program, its launch plan and kernel. Each backend derives
// its own and is the only one to read it.
struct StepCache {
  virtual ~StepCache() = default;
};

// What a backend keeps for one cached schedule between evaluations to replay its work as a
// whole (the CUDA backend's graphs, Note [CUDA graph replay] in cuda_graphs.cc).
struct ReplayCache {
  virtual ~ReplayCache() = default;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // Runs a compute step (Elementwise, Reduction, Matmul) whose device is this backend's: reads
  // its inputs from `values` by value id and sets each of its outputs there. `cache` is the
  // step's entry kept between runs of the same schedule (empty on the first), or null when
  // nothing is kept. Views and transfers are the executor's.
  virtual void run_step(const Graph& graph, const Step& step, ValueBuffers& values,
                        std::unique_ptr<StepCache>* cache) = 0;

  // `nbytes` (at least 1) on `device`, aligned to at least 64 bytes; throws OutOfMemoryError.
  virtual void* allocate(const Device& device, int64_t nbytes) = 0;
  // Gives back what allocate() returned.
  virtual void release(const Device& device, void* data, int64_t nbytes) = 0;

  // A contiguous copy of `source`, which lives on one of this backend's devices.
  virtual BufferView contiguous(const BufferView& source) = 0;
  // Whether copy() moves bytes from `from` to `to` (one of them a device of this backend's).
  virtual bool can_copy(const Device& from, const Device& to) const = 0;
  // Copies `bytes` dense bytes; returns once `target` holds them.
  virtual void copy(const void* source, const Device& from, void* target, const Device& to,
                    size_t bytes) = 0;

  // Returns once the work queued on `device` is done.
  virtual void synchronize(const Device& device) = 0;

  // Runs a cached schedule whose every compute step is on `device` (one of this backend's) and
  // which moves nothing between devices, by calling `run`: one whole run of it, from the params
  // to every output, which may be called again after a run that threw or was not kept (each
  // call starts afresh). `params` are the buffers its params are bound to; `run` may be given a
  // buffer to read in place of param i (the same values, elsewhere: a backend's own copy) where
  // `substitutable[i]`, that is where no output is the param or a view of it. A backend that can
  // record a run's work and replay it for a later run that would do the same does so; `cache`
  // is the schedule's entry kept between evaluations (empty on the first). The default just
  // runs.
  // A reference to the caller's callable, not a copy: nothing is allocated per evaluation.
  using ReplayRun = absl::FunctionRef<void(std::span<const std::optional<BufferView>>)>;
  virtual void run_replayable(const Device& device, std::unique_ptr<ReplayCache>* cache,
                              std::span<const BufferView* const> params,
                              std::span<const bool> substitutable, ReplayRun run) {
    (void)device;
    (void)cache;
    (void)params;
    (void)substitutable;
    run({});
  }
};

// The backend of `device`'s type.
Backend& backend_for(const Device& device);

// What the backends started, counted where they start it: a GPU kernel launch or library call
// (a group of kernels is one launch, a copy that stages an operand another); on the CPU a
// compute step's run (a group's members each). Evaluation reports the count (EvalStats).
void count_launch(int64_t launches = 1);
int64_t launches_started();

// Puts `backend` in place of the registered one for devices of `type` while it lives (tests).
// Not for use while another thread evaluates.
class ScopedBackend {
 public:
  ScopedBackend(DeviceType type, Backend& backend);
  ~ScopedBackend();
  ScopedBackend(const ScopedBackend&) = delete;
  ScopedBackend& operator=(const ScopedBackend&) = delete;

 private:
  DeviceType type_;
  Backend* previous_;
};

// The backends registered by default (cpu_backend.cc, cuda_backend.cc).
Backend& cpu_backend();
Backend& cuda_backend();

}  // namespace lazyfuse
