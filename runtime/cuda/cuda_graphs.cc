// CUDA graph replay of cached schedules.
#include "lazyfuse/runtime/cuda/cuda_graphs.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <list>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lazyfuse/runtime/cuda/cuda_driver.h"
#include "lazyfuse/runtime/cuda/cuda_memory.h"
#include "lazyfuse/runtime/env.h"
#include "lazyfuse/runtime/host_profile.h"

namespace lazyfuse::cuda {

// Note [CUDA graph replay]
// A training step or a model's forward evaluated in a loop runs the same cached schedule again
// and again, and on a GPU its time is the host's: a launch costs ~3 us and a cuBLAS call 10-15,
// where the kernels themselves take a few. A CUDA graph records that work once and launches all
// of it with one call. What a graph cannot do is notice that its work changed: it replays the
// addresses it was recorded with. So a run is replayed only when it would do exactly what the
// graph does, and that is checked rather than assumed:
//
// - A later run of the schedule first runs dry: everything on the host happens as in a real run
//   (buffers allocated from the caching allocator, plans found, arguments packed), except that
//   each kernel launch and library call is not made but written to a record: the kernel or the
//   library's plan, the grid, and every argument word, every address among them. If a graph was
//   recorded from a run with the same record, launching it does the same work on the same
//   memory: the graph is launched (one cuGraphLaunch on the device's stream). So nothing about
//   addresses needs to be stable for correctness; where the caching allocator hands out the same
//   blocks (a loop in its steady state) the run replays, and elsewhere it records a new graph.
// - A run with no graph of its record runs again, captured: its work is queued on the device's
//   stream under stream capture, instantiated as a graph, launched and kept with its record (a
//   few per schedule, the least recently used dropped past LAZYFUSE_CUDA_GRAPH_CACHE in all).
// - Work that cannot be in a graph throws NotReplayable from where it happens, and the run is
//   made again the ordinary way: host reads of device memory (an index op's error check) for
//   good, first uses (a kernel loaded, a cuBLASLt plan chosen by running candidates, a buffer
//   of counters grown) for that run only. A capture the driver refuses ends graphs for the
//   schedule. Each retry starts from the params (Backend::run_replayable), so a failed try
//   leaves nothing behind; a real error (out of memory) propagates as from any run.
// - The first run of a schedule launches its own work (its kernels are compiled and its plans
//   made then, which no graph can record) and counts its launches: a schedule of one launch is
//   not worth a graph (a graph launch costs what a kernel launch does) and never records one.
// - A recorded run (dry or captured) allocates from its schedule's own memory pool, which hands
//   out the lowest-addressed free block of a size (Note [A graph's own memory pool] in
//   cuda_memory.cc). So a dry run and the capture after it get the same buffers, and a loop whose
//   runs leave the pool alike (a forward over the same weights; a step whose outputs are dropped
//   before the next, or whose step count alternates between two buffers) finds its records
//   repeat, whatever else the program allocates between runs. A graph is tried only from the
//   pool state it was recorded from, or, where its capture grew the pool (a schedule's first
//   capture), from that state with the blocks the capture added free: so the run after the
//   first capture can replay it, where it would otherwise record a second graph. A schedule whose
//   captures outrun its replays by twice the graphs it keeps (its runs never repeat) stops trying:
//   a dry run and a capture cost more than its launches.
// - A param at an address neither of the last two runs had it at (a new batch each step) is
//   read by the graph from a copy of its own, made before each launch. One the last two runs
//   had where this one has it has settled: it is read in place, and a graph that copies it is
//   passed over. So a second model of the same shapes records a graph that copies its weights
//   in for its first runs only, and then one that reads them where they are.
//
// Evaluations are serialized by the evaluation lock, which covers everything here.

namespace {

struct GraphInstance;

// Graphs kept, most recently used first, across schedules.
std::list<GraphInstance*>& least_recently_used() {
  static auto* list = new std::list<GraphInstance*>;  // never destroyed: see GraphReplay
  return *list;
}

class GraphReplay;

struct GraphInstance {
  std::vector<uint64_t> record;
  uint64_t pool_fingerprint = 0;  // of its schedule's pool when its run started
  // Where its run grew the pool: that state with the added blocks free, which the loop's next
  // run starts from (Note [A graph's own memory pool]); else pool_fingerprint.
  uint64_t grown_pool_fingerprint = 0;
  CUgraphExec exec = nullptr;
  int device = 0;
  int64_t launches = 0;  // the kernel launches and library calls it runs
  // Per param: the graph's own copy, which the param is copied into before each launch (an
  // input at a new address every run), or none and the address the graph reads it at.
  std::vector<std::optional<BufferView>> copies;
  std::vector<uint64_t> addresses;
  GraphReplay* owner = nullptr;
  std::list<GraphInstance>::iterator self;       // in its owner's instances
  std::list<GraphInstance*>::iterator position;  // in least_recently_used()
};

GraphStats& stats() {
  static GraphStats s;
  return s;
}

// A schedule's graphs. Its instances are destroyed with it; the schedule cache that owns it is
// never destroyed, so no graph is destroyed after the driver at exit.
class GraphReplay final : public ReplayCache {
 public:
  ~GraphReplay() override { stop(); }
  // No more graphs for this schedule: its graphs are destroyed and its pool given back.
  void stop() {
    never = true;
    while (!instances.empty()) drop(instances.begin());
    if (pool != 0) destroy_pool(pool_device, pool);
    pool = 0;
  }
  void drop(std::list<GraphInstance>::iterator instance) {
    least_recently_used().erase(instance->position);
    activate(instance->device);
    driver()->cuGraphExecDestroy(instance->exec);
    instances.erase(instance);
    --stats().kept;
  }

  bool ran = false;  // a run launched its own work (compiling its kernels) before graphs were tried
  // The params' addresses in the last two runs, the latest first.
  std::vector<uint64_t> last_addresses[2];
  // Captures not yet paid for by replays: one more for each capture, one less (down to 0) for
  // each replay.
  int64_t capture_debt = 0;
  bool worth_it = false;  // the first run made 2 or more launches
  bool never = false;     // a lasting NotReplayable, or a capture the driver refused
  std::list<GraphInstance> instances;
  // The memory its recorded runs allocate from (Note [A graph's own memory pool]).
  int pool_device = 0;
  int64_t pool = 0;
};

std::atomic<GraphMode>& mode_setting() {
  static std::atomic<GraphMode> mode = [] {
    const EnvConfig& env = env_config();
    if (env.sync || env.cuda_graphs == 0) return GraphMode::Off;
    return env.cuda_graphs == 2 ? GraphMode::Always : GraphMode::On;
  }();
  return mode;
}

thread_local Recording current_recording = Recording::Off;
thread_local std::vector<uint64_t>* current_record = nullptr;

// Records the calling thread's work in `record` while it lives.
class RecordingScope {
 public:
  RecordingScope(Recording how, std::vector<uint64_t>& record) {
    record.clear();
    current_recording = how;
    current_record = &record;
  }
  ~RecordingScope() {
    current_recording = Recording::Off;
    current_record = nullptr;
  }
  RecordingScope(const RecordingScope&) = delete;
  RecordingScope& operator=(const RecordingScope&) = delete;
};

constexpr size_t kGraphsPerSchedule = 4;
// A capture and its instantiation cost more than the run's launches: a schedule whose captures
// outrun its replays by this many stops recording.
constexpr int64_t kMaxCaptureDebt = 2 * kGraphsPerSchedule;

void debug_line(const std::string& line) {
  if (env_config().debug >= 1) std::fprintf(stderr, "[lazyfuse] CUDA graph: %s\n", line.c_str());
}

// Ends a capture that is being abandoned, dropping what it captured.
void abandon_capture(CUstream stream) {
  CUgraph graph = nullptr;
  driver()->cuStreamEndCapture(stream, &graph);
  if (graph != nullptr) driver()->cuGraphDestroy(graph);
}

void launch_graph(GraphInstance& instance, CUstream stream) {
  ScopedHostPhase phase(HostPhase::GraphLaunch);
  check(driver()->cuGraphLaunch(instance.exec, stream), "cuGraphLaunch");
}

// Keeps `exec` as `replay`'s most recent graph, dropping the least recently used past the
// bounds: kGraphsPerSchedule for the schedule, LAZYFUSE_CUDA_GRAPH_CACHE in all.
GraphInstance& keep(GraphReplay& replay, int device, std::vector<uint64_t> record,
                    uint64_t fingerprint, uint64_t grown_fingerprint, CUgraphExec exec,
                    int64_t launches, std::vector<std::optional<BufferView>> copies,
                    std::vector<uint64_t> addresses) {
  replay.instances.push_front(GraphInstance{std::move(record),
                                            fingerprint,
                                            grown_fingerprint,
                                            exec,
                                            device,
                                            launches,
                                            std::move(copies),
                                            std::move(addresses),
                                            &replay,
                                            {},
                                            {}});
  const auto self = replay.instances.begin();
  self->self = self;
  least_recently_used().push_front(&*self);
  self->position = least_recently_used().begin();
  ++stats().kept;
  if (replay.instances.size() > kGraphsPerSchedule) {
    replay.drop(std::prev(replay.instances.end()));
    ++stats().evictions;
  }
  const int64_t bound = std::max<int64_t>(env_config().cuda_graph_cache, 1);
  while (stats().kept > bound) {
    GraphInstance* oldest = least_recently_used().back();
    oldest->owner->drop(oldest->self);
    ++stats().evictions;
  }
  return *self;
}

}  // namespace

GraphMode graph_mode() { return mode_setting().load(); }
void set_graph_mode(GraphMode mode) { mode_setting().store(mode); }

GraphStats graph_stats() { return stats(); }
void reset_graph_stats() {
  const int64_t kept = stats().kept;
  stats() = GraphStats();
  stats().kept = kept;
}

Recording recording() { return current_recording; }

void record_words(std::span<const uint64_t> words) {
  current_record->insert(current_record->end(), words.begin(), words.end());
}

void check_replayable(const char* why, bool lasting) {
  if (current_recording != Recording::Off) throw NotReplayable{why, lasting};
}

uint64_t address_of(const BufferView& view) { return reinterpret_cast<uint64_t>(view.data()); }

// Copies each param that `copies` holds a buffer for into it, on the device's stream.
void copy_inputs(std::span<const BufferView* const> params,
                 std::span<const std::optional<BufferView>> copies, CUstream stream) {
  for (size_t i = 0; i < copies.size(); ++i) {
    if (!copies[i]) continue;
    const size_t bytes =
        static_cast<size_t>(numel(params[i]->shape) * dtype_size(params[i]->dtype));
    ++stats().input_copies;
    if (bytes > 0)
      check(driver()->cuMemcpyDtoDAsync(address_of(*copies[i]), address_of(*params[i]), bytes,
                                        stream),
            "cuMemcpyDtoDAsync");
  }
}

namespace {

// One run of a schedule that graphs may replay: where its params are, and the last two runs'.
struct ReplayTry {
  GraphReplay& replay;
  int device;
  CUstream stream;
  std::span<const BufferView* const> params;
  std::span<const bool> substitutable;
  Backend::ReplayRun run;
  const std::vector<uint64_t>& addresses;
  uint64_t fingerprint;

  // Param i was where it is in both of the last two runs: it has stopped moving (a model's
  // weights after a second model of the same shapes ran), and a graph that copies it in would
  // copy it every run.
  bool settled(size_t i) const {
    const std::vector<uint64_t>& before = replay.last_addresses[0];
    const std::vector<uint64_t>& earlier = replay.last_addresses[1];
    return earlier.size() == params.size() && before.size() == params.size() &&
           before[i] == addresses[i] && earlier[i] == addresses[i];
  }
  // Param i is at an address neither of the last two runs had it at: an input that moves (a
  // new batch each step). One that alternates between two buffers (a parameter updated out of
  // place) or stays put is read where it is.
  bool moves(size_t i) const {
    const std::vector<uint64_t>& before = replay.last_addresses[0];
    const std::vector<uint64_t>& earlier = replay.last_addresses[1];
    return earlier.size() == params.size() && before.size() == params.size() &&
           before[i] != addresses[i] && earlier[i] != addresses[i];
  }

  // Runs again the ordinary way after a try that could not be recorded.
  void fall_back(const NotReplayable& why) {
    if (why.lasting) replay.stop();
    ++stats().fallbacks;
    debug_line(absl::StrCat("not recorded: ", why.why, why.lasting ? " (for good)" : ""));
    run({});
  }

  // The most recently used graph recorded from the pool as it is now that reads every param it
  // does not copy where it is now, and copies none that has settled.
  std::list<GraphInstance>::iterator candidate() {
    return std::find_if(
        replay.instances.begin(), replay.instances.end(), [&](const GraphInstance& instance) {
          if (instance.pool_fingerprint != fingerprint &&
              instance.grown_pool_fingerprint != fingerprint)
            return false;
          for (size_t i = 0; i < params.size(); ++i) {
            if (instance.copies[i] ? settled(i) : instance.addresses[i] != addresses[i])
              return false;
          }
          return true;
        });
  }

  // Why no graph is a candidate, for LAZYFUSE_DEBUG's line.
  std::string why_no_candidate() const {
    if (replay.instances.empty()) return "no graph yet";
    const GraphInstance& latest = replay.instances.front();
    for (size_t i = 0; i < params.size(); ++i) {
      if (latest.copies[i] ? !settled(i) : latest.addresses[i] == addresses[i]) continue;
      return absl::StrCat("param ", i, " of ", params.size(), " (", shape_str(params[i]->shape),
                          latest.copies[i] ? ") has settled where the latest graph copies it from"
                                           : ") is not where the latest graph reads it");
    }
    return "its memory pool is not as any graph's was";
  }

  // Why `candidate`'s record is not this run's, for LAZYFUSE_DEBUG's line.
  std::string why_not_replayed(const GraphInstance& candidate,
                               const std::vector<uint64_t>& record) const {
    const auto [graphs, runs] = std::mismatch(candidate.record.begin(), candidate.record.end(),
                                              record.begin(), record.end());
    std::string why = absl::StrCat(
        "its work differs from the graph's at word ", graphs - candidate.record.begin(), " of ",
        record.size(), " (",
        graphs != candidate.record.end() ? absl::StrCat(absl::Hex(*graphs)) : "end", " against ",
        runs != record.end() ? absl::StrCat(absl::Hex(*runs)) : "end", ")");
    if (runs != record.end())
      for (size_t i = 0; i < params.size(); ++i)
        if (addresses[i] == *runs) absl::StrAppend(&why, ", this run's being param ", i);
    return why;
  }

  // Runs dry against `candidate` and launches it where the run would do what it does; false
  // where it would not (`record` then holds the run's work). Throws NotReplayable.
  bool replay_if_same(std::list<GraphInstance>::iterator candidate, std::vector<uint64_t>& record) {
    {
      ScopedHostPhase dry_run(HostPhase::DryRun);
      RecordingScope scope(Recording::Dry, record);
      PoolScope pool(device, replay.pool);
      run(candidate->copies);
    }
    if (candidate->record != record) return false;
    copy_inputs(params, candidate->copies, stream);
    launch_graph(*candidate, stream);
    count_launch(candidate->launches);
    replay.instances.splice(replay.instances.begin(), replay.instances, candidate);
    least_recently_used().splice(least_recently_used().begin(), least_recently_used(),
                                 candidate->position);
    ++stats().replays;
    replay.capture_debt = std::max<int64_t>(replay.capture_debt - 1, 0);
    debug_line("replayed");
    return true;
  }

  // Runs under stream capture, reading the params that move from copies of its own, and keeps
  // and launches the graph; falls back to an ordinary run where that cannot be.
  void capture(std::vector<uint64_t>& record, const std::string& why_captured) {
    std::vector<std::optional<BufferView>> copies(params.size());
    std::vector<uint64_t> read_at = addresses;
    for (size_t i = 0; i < params.size(); ++i) {
      if (moves(i) && substitutable[i] && params[i]->is_contiguous()) {
        copies[i] =
            allocate_buffer(params[i]->storage->device(), params[i]->dtype, params[i]->shape);
        read_at[i] = 0;
      }
    }
    copy_inputs(params, copies, stream);
    const int64_t pool_blocks_before = pool_blocks(device, replay.pool);
    const DriverApi& api = *driver();
    std::optional<ScopedHostPhase> capturing(std::in_place, HostPhase::Capture);
    check(api.cuStreamBeginCapture(stream, kStreamCaptureModeRelaxed), "cuStreamBeginCapture");
    const int64_t launches_before = launches_started();
    try {
      RecordingScope scope(Recording::Capture, record);
      PoolScope pool(device, replay.pool);
      run(copies);
    } catch (const NotReplayable& why) {
      capturing.reset();  // the run made again below is not a capture
      abandon_capture(stream);
      count_launch(launches_before - launches_started());  // they were captured, never run
      return fall_back(why);
    } catch (...) {
      capturing.reset();
      abandon_capture(stream);
      count_launch(launches_before - launches_started());
      throw;
    }
    CUgraph graph = nullptr;
    CUgraphExec exec = nullptr;
    CUresult result = api.cuStreamEndCapture(stream, &graph);
    if (result == 0) result = api.cuGraphInstantiate(&exec, graph, 0);
    if (graph != nullptr) api.cuGraphDestroy(graph);
    capturing.reset();
    if (result != 0) {
      // The captured work was queued nowhere: run it as ordinary launches.
      count_launch(launches_before - launches_started());
      const char* message = nullptr;
      api.cuGetErrorString(result, &message);
      return fall_back(NotReplayable{
          absl::StrCat("the driver refused the capture (", message ? message : "", ")"), true});
    }
    const int64_t copied = std::count_if(copies.begin(), copies.end(),
                                         [](const auto& copy) { return copy.has_value(); });
    const uint64_t grown_fingerprint =
        pool_blocks(device, replay.pool) > pool_blocks_before
            ? grown_pool_fingerprint(device, replay.pool, pool_blocks_before)
            : fingerprint;
    GraphInstance& kept =
        keep(replay, device, std::move(record), fingerprint, grown_fingerprint, exec,
             launches_started() - launches_before, std::move(copies), std::move(read_at));
    launch_graph(kept, stream);
    ++stats().captures;
    debug_line(absl::StrCat("captured (", replay.instances.size(), " kept for this schedule, ",
                            copied, " input(s) copied in, a pool of ",
                            pool_blocks(device, replay.pool), " blocks): ", why_captured));
    count_capture(pool_blocks_before);
  }

  // A schedule whose runs keep doing other work pays a dry run and a capture for nothing: once
  // its captures outrun its replays by kMaxCaptureDebt it runs the ordinary way for good. A loop
  // that starts again over new buffers (another model of the same shapes) records a few graphs
  // and replays again; one whose runs never repeat stops after kMaxCaptureDebt. A run whose
  // pool had to grow is not counted: the pool was not yet what the loop's runs need, and the
  // state that repeats comes after it.
  void count_capture(int64_t pool_blocks_before) {
    if (pool_blocks(device, replay.pool) == pool_blocks_before) ++replay.capture_debt;
    if (replay.capture_debt > kMaxCaptureDebt) {
      // The graph just launched goes with the others: a launched graph runs to its end.
      replay.stop();
      debug_line("its runs differ each time; no more graphs for this schedule");
    }
  }
};

}  // namespace

void run_replayable(int device, std::unique_ptr<ReplayCache>* cache,
                    std::span<const BufferView* const> params, std::span<const bool> substitutable,
                    Backend::ReplayRun run) {
  const GraphMode mode = graph_mode();
  // On a user's stream (CUDAStreamGuard), launched as queued: a graph would be recorded on a
  // stream that other work shares.
  if (mode == GraphMode::Off || stream_override(device) != nullptr) return run({});
  if (*cache == nullptr) *cache = std::make_unique<GraphReplay>();
  GraphReplay& replay = static_cast<GraphReplay&>(**cache);
  // Most evaluations of one launch end here, before anything is allocated.
  if (replay.never || (mode == GraphMode::On && replay.ran && !replay.worth_it)) return run({});
  std::vector<uint64_t> addresses(params.size());
  for (size_t i = 0; i < params.size(); ++i) addresses[i] = address_of(*params[i]);
  // Where each param is in this run, remembered for the next two whatever this one does (moved
  // from `addresses` as the function returns, after its last use).
  struct RememberAddresses {
    GraphReplay& replay;
    std::vector<uint64_t>& addresses;
    ~RememberAddresses() {
      replay.last_addresses[1] = std::move(replay.last_addresses[0]);
      replay.last_addresses[0] = std::move(addresses);
    }
  } remember{replay, addresses};
  if (mode == GraphMode::On && !replay.ran) {
    const int64_t before = launches_started();
    run({});
    replay.worth_it = launches_started() - before >= 2;
    replay.ran = true;
    return;
  }
  activate(device);
  if (replay.pool == 0) {
    replay.pool_device = device;
    replay.pool = create_pool(device);
  }
  ReplayTry attempt{replay,
                    device,
                    device_stream(device),
                    params,
                    substitutable,
                    run,
                    addresses,
                    pool_fingerprint(device, replay.pool)};
  // Why this run is captured rather than replayed, worked out only when LAZYFUSE_DEBUG prints
  // it.
  const bool explain = env_config().debug >= 1;
  std::string why_captured;
  std::vector<uint64_t> record;
  const auto candidate = attempt.candidate();
  if (candidate == replay.instances.end()) {
    if (explain) why_captured = attempt.why_no_candidate();
  } else {
    try {
      if (attempt.replay_if_same(candidate, record)) return;
    } catch (const NotReplayable& why) {
      return attempt.fall_back(why);
    }
    if (explain) why_captured = attempt.why_not_replayed(*candidate, record);
  }
  attempt.capture(record, why_captured);
}

}  // namespace lazyfuse::cuda
