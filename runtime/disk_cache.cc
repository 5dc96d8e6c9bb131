// The disk cache's entries and the checks that decide whether they are trusted.
#include "lazyfuse/runtime/disk_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <mutex>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lazyfuse/ir/stable_hash.h"

namespace lazyfuse {
namespace {

// An entry: magic, image size, checksum of the image, the image.
constexpr char kMagic[8] = {'L', 'F', 'C', 'U', 'B', 'I', 'N', '1'};

uint64_t checksum(const std::vector<char>& image) {
  StableHash h;
  h.add(std::string_view(image.data(), image.size()));
  return h.value();
}

// Once per path and process: a cache refused on every kernel would say so on every kernel.
void warn_once(const std::string& path, const std::string& why) {
  static std::mutex mutex;
  static std::set<std::string>* warned = new std::set<std::string>();
  std::lock_guard lock(mutex);
  if (!warned->insert(path).second) return;
  std::cerr << "lazyfuse: warning: not using the kernel cache at " << path << ": " << why
            << "; compiling instead\n";
}

// Creates `dir` and its missing parents; the last one private to the user.
void create_private(const std::filesystem::path& dir) {
  std::error_code ec;
  if (dir.has_parent_path()) std::filesystem::create_directories(dir.parent_path(), ec);
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return;
}

}  // namespace

std::string untrusted_reason(const std::filesystem::path& path, bool directory, bool* exists) {
  struct stat info;
  *exists = ::lstat(path.c_str(), &info) == 0;
  if (!*exists) return "";
  if (directory ? !S_ISDIR(info.st_mode) : !S_ISREG(info.st_mode))
    return directory ? "it is not a directory" : "it is not a regular file";
  if (info.st_uid != ::geteuid())
    return absl::StrCat("it is owned by user ", info.st_uid, ", not by this one (", ::geteuid(),
                        ")");
  if (info.st_mode & (S_IWGRP | S_IWOTH))
    return absl::StrFormat("it is writable by %s (mode %04o)",
                           info.st_mode & S_IWOTH ? "others" : "its group", info.st_mode & 07777);
  return "";
}

DiskCache::DiskCache(std::filesystem::path dir) : dir_(std::move(dir)) {
  if (dir_.empty()) return;
  create_private(dir_);
  bool exists = false;
  refusal_ = untrusted_reason(dir_, /*directory=*/true, &exists);
  if (refusal_.empty() && !exists) refusal_ = "it could not be created";
  if (!refusal_.empty()) warn_once(dir_.string(), refusal_);
}

std::vector<char> DiskCache::load(const std::string& name, bool* damaged) const {
  *damaged = false;
  if (dir_.empty() || !refusal_.empty()) return {};
  const std::filesystem::path path = dir_ / name;
  bool exists = false;
  const std::string why = untrusted_reason(path, /*directory=*/false, &exists);
  if (!exists) return {};
  if (!why.empty()) {
    warn_once(path.string(), why);
    return {};
  }
  std::ifstream file(path, std::ios::binary);
  if (!file) return {};
  char magic[8];
  uint64_t size = 0, sum = 0;
  file.read(magic, 8);
  file.read(reinterpret_cast<char*>(&size), 8);
  file.read(reinterpret_cast<char*>(&sum), 8);
  if (!file || std::memcmp(magic, kMagic, 8) != 0 || size > (uint64_t{1} << 30)) {
    *damaged = true;
    return {};
  }
  std::vector<char> image(size);
  file.read(image.data(), static_cast<std::streamsize>(size));
  if (!file || file.peek() != EOF || checksum(image) != sum) {
    *damaged = true;
    return {};
  }
  return image;
}

void DiskCache::store(const std::string& name, const std::vector<char>& image) const {
  if (dir_.empty() || !refusal_.empty()) return;
  const std::filesystem::path path = dir_ / name;
  std::filesystem::path temporary = path;
  temporary += absl::StrCat(".tmp.", getpid(), ".",
                            std::hash<std::thread::id>()(std::this_thread::get_id()));
  // Created private and new: an existing file of that name (another's link) is not written.
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return;
  const uint64_t size = image.size(), sum = checksum(image);
  std::string bytes(kMagic, 8);
  bytes.append(reinterpret_cast<const char*>(&size), 8);
  bytes.append(reinterpret_cast<const char*>(&sum), 8);
  bytes.append(image.data(), image.size());
  bool written = true;
  for (size_t at = 0; at < bytes.size() && written;) {
    const ssize_t n = ::write(fd, bytes.data() + at, bytes.size() - at);
    written = n > 0;
    at += written ? static_cast<size_t>(n) : 0;
  }
  written = ::close(fd) == 0 && written;
  std::error_code ec;
  if (written) std::filesystem::rename(temporary, path, ec);
  if (!written || ec) std::filesystem::remove(temporary, ec);
}

}  // namespace lazyfuse
