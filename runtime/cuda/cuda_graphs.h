// CUDA graph replay (Note [CUDA graph replay] in cuda_graphs.cc): a cached schedule's GPU work
// recorded once as a graph and replayed with one cuGraphLaunch by every later run that would do
// exactly the same work.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "lazyfuse/runtime/backend.h"

namespace lazyfuse::cuda {

// How evaluations use CUDA graphs. LAZYFUSE_CUDA_GRAPHS sets it for the process ("0": Off,
// "always": Always, otherwise On, the default: a training step and an MLP's forward measure
// faster with graphs, docs/bench/2026-12-04-1635-h200-graph-pools.md); LAZYFUSE_SYNC=1 turns it
// off.
enum class GraphMode {
  Off,     // every run launches its own work
  On,      // a schedule that launched 2 or more kernels or library calls, from its second run
  Always,  // every schedule, from its first run that can be (the test suite's switch)
};
GraphMode graph_mode();
void set_graph_mode(GraphMode mode);

// What graph replay did in this process.
struct GraphStats {
  int64_t captures = 0;      // runs recorded into a new graph (and launched as it)
  int64_t replays = 0;       // runs that were one cuGraphLaunch of a graph recorded before
  int64_t fallbacks = 0;     // runs that tried and launched their own work instead
  int64_t input_copies = 0;  // params copied into a graph's own buffers before its launch
  int64_t evictions = 0;     // graphs destroyed to keep LAZYFUSE_CUDA_GRAPH_CACHE's bound
  int64_t kept = 0;          // graphs kept now
};
GraphStats graph_stats();
void reset_graph_stats();  // the counters; `kept` stays what it is

// How the running evaluation's GPU work is recorded: not at all, dry (everything but the work
// itself runs on the host, which is recorded), or captured into a graph as it is queued.
enum class Recording { Off, Dry, Capture };
Recording recording();

// Appends what one kernel launch or library call does to the running record: the kernel or
// the library's plan, the grid, and every argument, addresses included. Only while recording.
void record_words(std::span<const uint64_t> words);

// Thrown out of a recorded run whose work cannot go into a graph: `lasting` where no later run
// of the schedule can either (it waits on the GPU from the host), otherwise only this run (a
// first use: a kernel loaded, a library plan made, a buffer grown).
struct NotReplayable {
  std::string why;
  bool lasting = false;
};
// Throws NotReplayable while recording; nothing otherwise.
void check_replayable(const char* why, bool lasting);

// The CUDA backend's Backend::run_replayable.
void run_replayable(int device, std::unique_ptr<ReplayCache>* cache,
                    std::span<const BufferView* const> params, std::span<const bool> substitutable,
                    Backend::ReplayRun run);

}  // namespace lazyfuse::cuda
