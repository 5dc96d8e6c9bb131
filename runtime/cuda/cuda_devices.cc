// Device discovery through the CUDA driver API, loaded at run time: the GPUs the CUDA backend
// resolves devices against and the report `lazyfuse devices` prints.
#include "lazyfuse/runtime/devices.h"

#include <unistd.h>

#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/runtime/cuda/cuda_driver.h"

namespace lazyfuse {

namespace cuda {
int device_count() {
  static const int count = [] {
    int n = 0;
    if (driver() != nullptr && driver()->cuDeviceGetCount(&n) != 0) n = 0;
    return n;
  }();
  return count;
}
bool is_available() { return device_count() > 0; }
}  // namespace cuda

DeviceReport device_report() {
  const cuda::DriverApi* d = cuda::driver();
  DeviceReport report;
  int version = cuda::driver_version();
  if (version > 0) report.driver_version = absl::StrCat(version / 1000, ".", version % 1000 / 10);
  report.why_none = d == nullptr ? cuda::why_unavailable()
                                 : "the CUDA driver sees no GPU (check CUDA_VISIBLE_DEVICES)";
  for (int i = 0; i < cuda::device_count(); ++i) {
    CudaDeviceInfo info;
    info.index = i;
    cuda::CUdevice dev = 0;
    d->cuDeviceGet(&dev, i);
    char name[256] = {};
    d->cuDeviceGetName(name, sizeof(name), dev);
    info.name = name;
    d->cuDeviceGetAttribute(&info.major, cuda::kAttrComputeCapabilityMajor, dev);
    d->cuDeviceGetAttribute(&info.minor, cuda::kAttrComputeCapabilityMinor, dev);
    size_t total = 0;
    d->cuDeviceTotalMem(&total, dev);
    info.total_bytes = static_cast<int64_t>(total);
    try {
      cuda::activate(i);
      size_t free_bytes = 0, total_bytes = 0;
      if (d->cuMemGetInfo(&free_bytes, &total_bytes) == 0)
        info.free_bytes = static_cast<int64_t>(free_bytes);
    } catch (const Error&) {
      // Memory in use is left unknown; the rest of the report stands.
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

namespace cuda {
Device resolve(const Device& device) {
  int count = cuda::device_count();
  if (count == 0)
    throw DeviceIndexError(absl::StrCat("Device ", device.str(),
                                        " requested, but no CUDA GPUs are available (",
                                        cuda::why_unavailable(), ")"));
  int index = device.has_index() ? device.index() : 0;
  if (index >= count)
    throw DeviceIndexError(absl::StrCat("Device ", device.str(),
                                        " requested, but this machine has ", count, " CUDA device",
                                        count == 1 ? "" : "s", " (cuda:0",
                                        count > 1 ? absl::StrCat("..cuda:", count - 1) : "", ")"));
  return Device(DeviceType::CUDA, index);
}
}  // namespace cuda

}  // namespace lazyfuse
