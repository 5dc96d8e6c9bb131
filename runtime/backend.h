// The boundary between the layers above and the devices. The executor (executor.cc) runs a
// schedule's steps in order and hands each compute step to the backend of its device; stats,
// device resolution and DLPack ask the backend what they need to know of a device. None of them
// asks what kind of device it is. One backend is registered per DeviceType (register_backend;
// the built-in ones, the CPU's (cpu/cpu_backend.cc) and CUDA's (cuda/cuda_backend.cc), on first
// use in backend.cc); tests put one of their own in place with ScopedBackend.
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
#include <vector>

#include "absl/functional/function_ref.h"
#include "lazyfuse/ir/schedule.h"
#include "lazyfuse/runtime/storage.h"

namespace lazyfuse {

struct Stats;

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

  // Whether run_step takes an Attention step of `dtype` with these head dims (q's and k's, v's).
  // Where it does not, the frontend writes attention as its composite graph
  // (frontend/attention.cc).
  virtual bool runs_attention(DType dtype, int64_t head_dim, int64_t value_dim) const {
    (void)dtype;
    (void)head_dim;
    (void)value_dim;
    return false;
  }

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

  // What the layers above ask of a device of this type.
  // The device `requested` names with its index resolved ("cuda" is the current GPU); throws
  // DeviceIndexError, saying what the machine has, where there is no such device.
  virtual Device resolve(const Device& requested) = 0;
  // How many devices of this type the process can use (0 where none; the host is one).
  virtual int device_count() = 0;
  // The allocator's figures for device `index` (0 for the host), and its peak reset to what it
  // holds now, as torch.cuda.reset_peak_memory_stats.
  virtual AllocatorStats memory_stats(int index) = 0;
  virtual void reset_peak_memory_stats(int index) = 0;
  // Adds what the backend counts (kernels compiled, programs JIT-compiled, graphs replayed) to
  // `stats`; reset_counters() zeroes them.
  virtual void add_counters(Stats& stats) = 0;
  virtual void reset_counters() = 0;
  // DLPack's DLDeviceType of these devices (kDLCPU 1, kDLCUDA 2): how to_dlpack names them and
  // from_dlpack finds their backend.
  virtual int dlpack_device_type() const = 0;
};

// The backend of `device`'s type; throws DeviceIndexError where none is registered.
Backend& backend_for(const Device& device);

// Makes `backend` the one for devices of `type` (in place of one registered before). The
// built-in backends register on the registry's first use; another registers before the first
// evaluation that uses it, and outlives every tensor on its devices. Not for use while another
// thread evaluates.
void register_backend(DeviceType type, Backend& backend);
// The device types with a backend, in the order they registered (the host's first).
std::vector<DeviceType> registered_device_types();

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

// The built-in backends (cpu/cpu_backend.cc, cuda/cuda_backend.cc).
Backend& cpu_backend();
Backend& cuda_backend();

}  // namespace lazyfuse
