// Users' streams and events (runtime/cuda/cuda_stream.h) over the driver API.
#include "lazyfuse/runtime/cuda/cuda_stream.h"

#include "absl/strings/str_cat.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/runtime/cuda/cuda_driver.h"
#include "lazyfuse/runtime/devices.h"

namespace lazyfuse::cuda {
namespace {

// The driver's handle of the legacy default stream (CU_STREAM_LEGACY), which a null handle means.
const CUstream kLegacyStream = reinterpret_cast<CUstream>(0x1);
constexpr unsigned kStreamNonBlocking = 1;   // CU_STREAM_NON_BLOCKING
constexpr unsigned kEventDisableTiming = 2;  // CU_EVENT_DISABLE_TIMING
constexpr CUresult kErrorNotReady = 600;     // CUDA_ERROR_NOT_READY

CUstream handle(const CUDAStream& stream) { return static_cast<CUstream>(stream.stream()); }

int device_or_current(int device) {
  return resolve_device(Device(DeviceType::CUDA, device < 0 ? -1 : device)).index();
}

// `waiting` runs what is queued on it after what is queued on `before` now.
void order_after(CUstream waiting, CUstream before) {
  if (waiting == before) return;
  const DriverApi& api = *driver();
  CUevent event = nullptr;
  check(api.cuEventCreate(&event, kEventDisableTiming), "cuEventCreate");
  CUresult result = api.cuEventRecord(event, before);
  if (result == 0) result = api.cuStreamWaitEvent(waiting, event, 0);
  api.cuEventDestroy(event);  // released once the wait no longer needs it
  check(result, "ordering two streams (cuEventRecord, cuStreamWaitEvent)");
}

}  // namespace

void CUDAStream::synchronize() const {
  activate(device_);
  check(driver()->cuStreamSynchronize(handle(*this)), "cuStreamSynchronize");
}

bool CUDAStream::query() const {
  activate(device_);
  const CUresult result = driver()->cuStreamQuery(handle(*this));
  if (result == kErrorNotReady) return false;
  check(result, "cuStreamQuery");
  return true;
}

CUDAStream getStreamFromExternal(void* stream, int device) {
  device = device_or_current(device);
  return CUDAStream(stream != nullptr ? stream : kLegacyStream, device);
}

CUDAStream getCurrentCUDAStream(int device) {
  device = device_or_current(device);
  activate(device);
  return CUDAStream(device_stream(device), device);
}

CUDAStreamGuard::CUDAStreamGuard(const CUDAStream& stream)
    : device_(stream.device_index()), stream_(stream.stream()) {
  activate(device_);
  const CUstream user = static_cast<CUstream>(stream_);
  if (user != kLegacyStream) {
    unsigned flags = 0;
    check(driver()->cuStreamGetFlags(user, &flags), "cuStreamGetFlags");
    if (flags & kStreamNonBlocking)
      throw UnsupportedError(absl::StrCat(
          "CUDAStreamGuard: the stream of cuda:", device_,
          " is non-blocking (CU_STREAM_NON_BLOCKING); lazyfuse reads values to the host on the "
          "legacy default stream, which orders itself with blocking streams only: make it with "
          "flags 0 (cudaStreamDefault)"));
  }
  order_after(user, device_stream(device_));
  previous_ = set_stream_override(device_, user);
}

CUDAStreamGuard::~CUDAStreamGuard() {
  const CUstream user = static_cast<CUstream>(stream_);
  set_stream_override(device_, static_cast<CUstream>(previous_));
  // A destructor does not throw: an error here is the driver's and shows again on the next call.
  try {
    activate(device_);
    order_after(device_stream(device_), user);
  } catch (const Error&) {
  }
}

void synchronize(int device) {
  activate(device_or_current(device));
  check(driver()->cuCtxSynchronize(), "cuCtxSynchronize");
}

Event::Event(bool enable_timing) : timing_(enable_timing) {}

Event::~Event() {
  if (event_ != nullptr && driver() != nullptr)
    driver()->cuEventDestroy(static_cast<CUevent>(event_));
}

void Event::record() { record(getCurrentCUDAStream()); }

void Event::record(const CUDAStream& stream) {
  activate(stream.device_index());
  if (event_ != nullptr && device_ != stream.device_index())
    throw DeviceMismatchError(
        absl::StrCat("Event::record: the event was recorded on cuda:", device_,
                     " and cannot be recorded on cuda:", stream.device_index()));
  if (event_ == nullptr) {
    CUevent made = nullptr;
    check(driver()->cuEventCreate(&made, timing_ ? 0 : kEventDisableTiming), "cuEventCreate");
    event_ = made;
    device_ = stream.device_index();
  }
  check(driver()->cuEventRecord(static_cast<CUevent>(event_), handle(stream)), "cuEventRecord");
}

void Event::synchronize() const {
  if (event_ == nullptr) return;  // never recorded: nothing to wait for, as in PyTorch
  activate(device_);
  check(driver()->cuEventSynchronize(static_cast<CUevent>(event_)), "cuEventSynchronize");
}

bool Event::query() const {
  if (event_ == nullptr) return true;
  activate(device_);
  const CUresult result = driver()->cuEventQuery(static_cast<CUevent>(event_));
  if (result == kErrorNotReady) return false;
  check(result, "cuEventQuery");
  return true;
}

float Event::elapsed_time(const Event& end) const {
  if (!timing_ || !end.timing_)
    throw UnsupportedError("Event::elapsed_time: both events must be made with enable_timing");
  if (event_ == nullptr || end.event_ == nullptr)
    throw UnsupportedError("Event::elapsed_time: both events must be recorded first");
  activate(device_);
  float ms = 0;
  check(driver()->cuEventElapsedTime(&ms, static_cast<CUevent>(event_),
                                     static_cast<CUevent>(end.event_)),
        "cuEventElapsedTime");
  return ms;
}

}  // namespace lazyfuse::cuda
