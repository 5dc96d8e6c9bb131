// Device discovery through the CUDA driver API, loaded at run time.
#include "runtime/devices.h"

#include <dlfcn.h>
#include <unistd.h>

#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ir/errors.h"

namespace lazyfuse {
namespace {

// The few driver entry points device discovery needs, declared here so that the build needs
// no CUDA headers.
using CUresult = int;
using CUdevice = int;
using CUcontext = void*;
constexpr int kAttrComputeCapabilityMajor = 75;
constexpr int kAttrComputeCapabilityMinor = 76;

struct Driver {
  bool loaded = false;
  std::string why_not;
  int device_count = 0;
  int version = 0;
  CUresult (*cuInit)(unsigned) = nullptr;
  CUresult (*cuDriverGetVersion)(int*) = nullptr;
  CUresult (*cuDeviceGetCount)(int*) = nullptr;
  CUresult (*cuDeviceGet)(CUdevice*, int) = nullptr;
  CUresult (*cuDeviceGetName)(char*, int, CUdevice) = nullptr;
  CUresult (*cuDeviceTotalMem)(size_t*, CUdevice) = nullptr;
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice) = nullptr;
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice) = nullptr;
  CUresult (*cuCtxSetCurrent)(CUcontext) = nullptr;
  CUresult (*cuMemGetInfo)(size_t*, size_t*) = nullptr;
};

const Driver& driver() {
  static const Driver d = [] {
    Driver d;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      d.why_not = "no CUDA driver (libcuda.so.1 not found)";
      return d;
    }
    auto load = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      return fn != nullptr;
    };
    bool ok = load(d.cuInit, "cuInit") && load(d.cuDriverGetVersion, "cuDriverGetVersion") &&
              load(d.cuDeviceGetCount, "cuDeviceGetCount") && load(d.cuDeviceGet, "cuDeviceGet") &&
              load(d.cuDeviceGetName, "cuDeviceGetName") &&
              load(d.cuDeviceTotalMem, "cuDeviceTotalMem_v2") &&
              load(d.cuDeviceGetAttribute, "cuDeviceGetAttribute") &&
              load(d.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain") &&
              load(d.cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2") &&
              load(d.cuCtxSetCurrent, "cuCtxSetCurrent") && load(d.cuMemGetInfo, "cuMemGetInfo_v2");
    if (!ok) {
      d.why_not = "the CUDA driver lacks an entry point lazyfuse needs";
      return d;
    }
    d.cuDriverGetVersion(&d.version);
    if (CUresult r = d.cuInit(0); r != 0) {
      d.why_not = absl::StrCat("cuInit failed (CUresult ", r, "): no usable GPU");
      return d;
    }
    d.loaded = true;
    d.cuDeviceGetCount(&d.device_count);
    if (d.device_count == 0) d.why_not = "the CUDA driver sees no GPU (check CUDA_VISIBLE_DEVICES)";
    return d;
  }();
  return d;
}

}  // namespace

namespace cuda {
int device_count() { return driver().loaded ? driver().device_count : 0; }
bool is_available() { return device_count() > 0; }
}  // namespace cuda

DeviceReport device_report() {
  const Driver& d = driver();
  DeviceReport report;
  if (d.version > 0)
    report.driver_version = absl::StrCat(d.version / 1000, ".", d.version % 1000 / 10);
  report.why_none = d.why_not;
  for (int i = 0; i < cuda::device_count(); ++i) {
    CudaDeviceInfo info;
    info.index = i;
    CUdevice dev = 0;
    d.cuDeviceGet(&dev, i);
    char name[256] = {};
    d.cuDeviceGetName(name, sizeof(name), dev);
    info.name = name;
    d.cuDeviceGetAttribute(&info.major, kAttrComputeCapabilityMajor, dev);
    d.cuDeviceGetAttribute(&info.minor, kAttrComputeCapabilityMinor, dev);
    size_t total = 0;
    d.cuDeviceTotalMem(&total, dev);
    info.total_bytes = static_cast<int64_t>(total);
    CUcontext context = nullptr;
    if (d.cuDevicePrimaryCtxRetain(&context, dev) == 0) {
      size_t free_bytes = 0, total_bytes = 0;
      if (d.cuCtxSetCurrent(context) == 0 && d.cuMemGetInfo(&free_bytes, &total_bytes) == 0)
        info.free_bytes = static_cast<int64_t>(free_bytes);
      d.cuCtxSetCurrent(nullptr);
      d.cuDevicePrimaryCtxRelease(dev);
    }
    report.gpus.push_back(info);
  }
  report.cpu_cores = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  report.host_memory_bytes = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
  return report;
}

std::string format_device_report(const DeviceReport& report) {
  constexpr double kMiB = 1024.0 * 1024.0;
  std::string out;
  absl::StrAppend(
      &out, "Driver Version: ", report.driver_version.empty() ? "none" : report.driver_version,
      "    CUDA devices: ", report.gpus.size(), "\n");
  if (report.gpus.empty()) {
    absl::StrAppend(&out, "No CUDA GPU: ", report.why_none, ".\n");
  } else {
    absl::StrAppend(&out,
                    absl::StrFormat("%-4s %-28s %-6s %s\n", "GPU", "Name", "CC", "Memory-Usage"));
    for (const CudaDeviceInfo& gpu : report.gpus) {
      std::string memory =
          gpu.free_bytes >= 0
              ? absl::StrFormat("%.0fMiB / %.0fMiB", (gpu.total_bytes - gpu.free_bytes) / kMiB,
                                gpu.total_bytes / kMiB)
              : absl::StrFormat("? / %.0fMiB", gpu.total_bytes / kMiB);
      absl::StrAppend(&out, absl::StrFormat("%-4d %-28s %d.%-4d %s\n", gpu.index, gpu.name,
                                            gpu.major, gpu.minor, memory));
    }
  }
  absl::StrAppend(&out, absl::StrFormat("cpu: %d cores, %.0fMiB host memory\n", report.cpu_cores,
                                        report.host_memory_bytes / kMiB));
  return out;
}

Device resolve_device(const Device& device) {
  if (device.is_cpu()) return device;
  int count = cuda::device_count();
  if (count == 0)
    throw DeviceIndexError(absl::StrCat("Device ", device.str(),
                                        " requested, but no CUDA GPUs are available (",
                                        driver().why_not, ")"));
  int index = device.has_index() ? device.index() : 0;
  if (index >= count)
    throw DeviceIndexError(absl::StrCat("Device ", device.str(),
                                        " requested, but this machine has ", count, " CUDA device",
                                        count == 1 ? "" : "s", " (cuda:0",
                                        count > 1 ? absl::StrCat("..cuda:", count - 1) : "", ")"));
  return Device(DeviceType::CUDA, index);
}

}  // namespace lazyfuse
