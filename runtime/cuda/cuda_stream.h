// Streams and events for code beside lazyfuse that has its own CUDA work, as LibTorch's c10::cuda
// offers them: a user's stream that lazyfuse queues its GPU work on (so that the user's kernels
// and lazyfuse's are ordered without a device-wide synchronization), device synchronization, and
// events that time GPU work.
//
//   CUstream mine = ...;  // the user's: cuStreamCreate(&mine, 0)
//   {
//     lazyfuse::cuda::CUDAStreamGuard guard(lazyfuse::cuda::getStreamFromExternal(mine, 0));
//     y = (x * 2).exp();
//     lazyfuse::eval(y);  // queued on `mine`, after what the user queued there
//   }                     // lazyfuse's later work waits for everything queued on `mine` so far
//
// A guard's stream must be a blocking one (cuStreamCreate's flags 0, cudaStreamDefault, or the
// legacy default stream): lazyfuse's synchronous copies (reading a value to the host) run on the
// legacy default stream, which orders itself with blocking streams only. While a guard holds a
// stream, evaluations on its device are launched as queued, never recorded into a CUDA graph.
#pragma once

#include <cstdint>

namespace lazyfuse::cuda {

// A CUDA stream of one GPU: the driver's CUstream (a cudaStream_t is the same handle), as
// c10::cuda::CUDAStream.
class CUDAStream {
 public:
  CUDAStream(void* stream, int device) : stream_(stream), device_(device) {}
  void* stream() const { return stream_; }
  int device_index() const { return device_; }
  // Waits until everything queued on the stream has run.
  void synchronize() const;
  // Whether everything queued on the stream has run.
  bool query() const;
  friend bool operator==(const CUDAStream&, const CUDAStream&) = default;

 private:
  void* stream_;
  int device_;
};

// A stream someone else made, by its handle (null: the legacy default stream), as
// c10::cuda::getStreamFromExternal. lazyfuse never destroys it.
CUDAStream getStreamFromExternal(void* stream, int device);
// The stream lazyfuse queues GPU `device`'s work on from this thread (-1: the current device,
// 0): a guard's, or lazyfuse's own. c10::cuda::getCurrentCUDAStream.
CUDAStream getCurrentCUDAStream(int device = -1);
inline CUDAStream current_stream(int device = -1) { return getCurrentCUDAStream(device); }

// While alive, lazyfuse queues this thread's work on the stream's GPU on `stream`; work queued
// on it waits for lazyfuse's earlier work on that GPU, and when the guard goes, lazyfuse's later
// work waits for everything queued on `stream` until then. Guards nest. c10::cuda::CUDAStreamGuard.
class CUDAStreamGuard {
 public:
  explicit CUDAStreamGuard(const CUDAStream& stream);
  ~CUDAStreamGuard();
  CUDAStreamGuard(const CUDAStreamGuard&) = delete;
  CUDAStreamGuard& operator=(const CUDAStreamGuard&) = delete;

 private:
  int device_;
  void* stream_;
  void* previous_;  // the stream that was current before, null for lazyfuse's own
};

// Waits until all work on GPU `device` (-1: the current device, 0) has run, on every stream, as
// torch.cuda.synchronize.
void synchronize(int device = -1);

// A CUDA event, as torch.cuda.Event / at::cuda::CUDAEvent: recorded on a stream, it completes
// when the work queued before it has run; two timed events give the milliseconds between them.
class Event {
 public:
  explicit Event(bool enable_timing = true);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  // Records the event on `stream` (the current stream of the current device when not given).
  void record();
  void record(const CUDAStream& stream);
  // Waits until the event has completed; whether it has.
  void synchronize() const;
  bool query() const;
  // Milliseconds from this event to `end`, both recorded and completed, both timed.
  float elapsed_time(const Event& end) const;

 private:
  void* event_ = nullptr;  // made on first record, on the device it is recorded on
  int device_ = -1;
  bool timing_;
};

}  // namespace lazyfuse::cuda
