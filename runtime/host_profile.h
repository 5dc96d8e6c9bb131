// Where an evaluation's host time goes, for benchmarks (bench/host_cost.cc): each phase's time
// and count, summed over evaluations while profiling is on. Off by default, when a phase costs
// one relaxed load. Timings never go in tests.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string_view>

namespace lazyfuse {

enum class HostPhase {
  Walk,    // walking the pending values behind the outputs
  Lookup,  // hashing the walk and confirming a cached schedule
  Passes,  // on a miss: building the graph and running the pass pipeline
  Run,     // running the schedule's steps (contains most of the four below)
  // The next four are counted wherever they happen, also outside an evaluation (a factory's
  // buffer, a value read back to the host).
  Allocate,  // buffers, from the caching allocator on a GPU, from the heap on the CPU
  Library,   // library calls: cuBLAS, cuBLASLt
  Launch,    // cuLaunchKernel
  // CUDA graph replay (Note [CUDA graph replay] in cuda_graphs.cc), inside Run:
  DryRun,       // a run that records its work rather than launching it (contains its Allocate)
  Capture,      // a run captured into a graph and the graph instantiated
  GraphLaunch,  // cuGraphLaunch of a recorded run
  Transfer,     // copies between host and device, waiting for the device's work before them
  Finish,       // handing the results to the evaluated values, which frees the graph behind them
  kCount,
};
constexpr int kHostPhases = static_cast<int>(HostPhase::kCount);
std::string_view host_phase_name(HostPhase phase);

struct HostProfile {
  std::array<int64_t, kHostPhases> nanoseconds{};
  std::array<int64_t, kHostPhases> count{};
};

void set_host_profiling(bool on);
HostProfile host_profile();
void reset_host_profile();

namespace internal {
extern std::atomic<bool> host_profiling;
void add_host_phase(HostPhase phase, int64_t nanoseconds);
}  // namespace internal

// Times its scope as `phase` while profiling is on.
class ScopedHostPhase {
 public:
  explicit ScopedHostPhase(HostPhase phase)
      : phase_(phase), on_(internal::host_profiling.load(std::memory_order_relaxed)) {
    if (on_) start_ = std::chrono::steady_clock::now();
  }
  ~ScopedHostPhase() {
    if (on_)
      internal::add_host_phase(phase_, std::chrono::duration_cast<std::chrono::nanoseconds>(
                                           std::chrono::steady_clock::now() - start_)
                                           .count());
  }
  ScopedHostPhase(const ScopedHostPhase&) = delete;
  ScopedHostPhase& operator=(const ScopedHostPhase&) = delete;

 private:
  HostPhase phase_;
  bool on_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace lazyfuse
