#include "lazyfuse/runtime/host_profile.h"

#include <mutex>

namespace lazyfuse {
namespace {
std::mutex profile_mutex;
HostProfile profile;
}  // namespace

namespace internal {
std::atomic<bool> host_profiling{false};

void add_host_phase(HostPhase phase, int64_t nanoseconds) {
  std::lock_guard lock(profile_mutex);
  profile.nanoseconds[static_cast<int>(phase)] += nanoseconds;
  ++profile.count[static_cast<int>(phase)];
}
}  // namespace internal

std::string_view host_phase_name(HostPhase phase) {
  switch (phase) {
    case HostPhase::Walk:
      return "walk";
    case HostPhase::Lookup:
      return "lookup";
    case HostPhase::Passes:
      return "passes";
    case HostPhase::Run:
      return "run";
    case HostPhase::Allocate:
      return "allocate";
    case HostPhase::Library:
      return "library";
    case HostPhase::Launch:
      return "launch";
    case HostPhase::DryRun:
      return "dry_run";
    case HostPhase::Capture:
      return "capture";
    case HostPhase::GraphLaunch:
      return "graph_launch";
    case HostPhase::Transfer:
      return "transfer";
    case HostPhase::Finish:
      return "finish";
    case HostPhase::kCount:
      break;
  }
  return "?";
}

void set_host_profiling(bool on) { internal::host_profiling.store(on); }

HostProfile host_profile() {
  std::lock_guard lock(profile_mutex);
  return profile;
}

void reset_host_profile() {
  std::lock_guard lock(profile_mutex);
  profile = HostProfile();
}

}  // namespace lazyfuse
