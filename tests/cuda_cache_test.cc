// The on-disk kernel cache (runtime/kernel_cache.cc), on a machine with a GPU (every test skips
// without one): a kernel compiled once is loaded from disk in a later process (simulated by
// forgetting the in-memory kernels); damaged entries are detected, recompiled and replaced; a
// cache directory that cannot be written costs recompiles but never a wrong result; and two
// processes filling one directory at once leave only valid entries.
//
// Each test points the cache at a fresh directory with set_cache_dir, since
// LAZYFUSE_CACHE_DIR is read once per process and other tests of this binary read it first.
// Kernels come from evaluating arange(...) * c + 0.25 on the GPU: the constant is part of the
// kernel's key and source, so each distinct c is a distinct kernel (and cache file).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <lazyfuse/lazyfuse.h>

#include "lazyfuse/ir/stable_hash.h"
#include "lazyfuse/runtime/env.h"
#include "lazyfuse/runtime/kernel_cache.h"

extern char** environ;

namespace lazyfuse {
namespace {

namespace fs = std::filesystem;

// Set in the environment of the child processes of TwoProcessesFillOneDirectoryAtOnce.
constexpr const char* kChildMarker = "LAZYFUSE_CACHE_TEST_CHILD";
// The kernels both children compile, and the parent then loads.
const std::vector<double> kChildConstants = {1.5, 2.5, 3.5, 4.5, 5.5, 6.5};

constexpr int64_t kElements = 4096;

// Evaluates one kernel (arange * c + 0.25, fused) on the GPU and checks every element.
void evaluate_kernel(double c) {
  Tensor r = arange(0.0, static_cast<double>(kElements), 1.0, Device("cuda")) * c + 0.25;
  std::vector<double> got = r.to_vector<double>();
  ASSERT_EQ(static_cast<int64_t>(got.size()), kElements);
  for (int64_t i = 0; i < kElements; ++i) {
    const double want = static_cast<double>(i) * c + 0.25;
    ASSERT_NEAR(got[i], want, 1e-6 * std::fabs(want) + 1e-6) << "c = " << c << " at " << i;
  }
}

// Every cache entry (finished file) in `dir`, sorted.
std::vector<fs::path> entries(const fs::path& dir) {
  std::vector<fs::path> found;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec))
    if (e.is_regular_file() && e.path().extension() == ".cubin") found.push_back(e.path());
  std::sort(found.begin(), found.end());
  return found;
}

// Everything in `dir`, temporary files included.
std::vector<fs::path> all_files(const fs::path& dir) {
  std::vector<fs::path> found;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) found.push_back(e.path());
  return found;
}

// Checks an entry against the format kernel_cache.cc documents: "LFCUBIN1", the image size and
// the StableHash of the image (each 8 bytes, little-endian as written), then the image.
::testing::AssertionResult is_valid_entry(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (bytes.size() < 24) return ::testing::AssertionFailure() << path << ": shorter than a header";
  if (bytes.compare(0, 8, "LFCUBIN1") != 0)
    return ::testing::AssertionFailure() << path << ": bad magic";
  uint64_t size = 0, sum = 0;
  std::memcpy(&size, bytes.data() + 8, 8);
  std::memcpy(&sum, bytes.data() + 16, 8);
  if (bytes.size() != 24 + size)
    return ::testing::AssertionFailure()
           << path << ": " << bytes.size() - 24 << " image bytes, header says " << size;
  StableHash h;
  h.add(std::string_view(bytes.data() + 24, size));
  if (h.value() != sum) return ::testing::AssertionFailure() << path << ": checksum mismatch";
  return ::testing::AssertionSuccess();
}

class CudaCache : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::is_available()) GTEST_SKIP() << "no CUDA GPU";
    saved_cache_dir_ = env_config().cache_dir;
    std::string pattern = (fs::path(::testing::TempDir()) / "lazyfuse-cache-XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr) << std::strerror(errno);
    root_ = pattern;
    cache_dir_ = root_ / "cache";
    fs::create_directories(cache_dir_);
    set_cache_dir(cache_dir_.string());
    // Kernels other tests loaded stay out of the counts.
    cuda::clear_memory_kernel_cache();
    restored_ = true;
  }
  void TearDown() override {
    if (!restored_) return;
    set_cache_dir(saved_cache_dir_);
    std::error_code ec;
    // Writable again, so that the directory can be removed.
    for (const fs::directory_entry& e : fs::recursive_directory_iterator(root_, ec))
      if (e.is_directory()) fs::permissions(e.path(), fs::perms::owner_all, ec);
    fs::permissions(root_, fs::perms::owner_all, ec);
    fs::remove_all(root_, ec);
  }

  std::string saved_cache_dir_;
  fs::path root_, cache_dir_;
  bool restored_ = false;
};

TEST_F(CudaCache, KernelIsLoadedFromDiskOnceMemoryIsCleared) {
  const cuda::KernelCacheStats start = cuda::kernel_cache_stats();
  evaluate_kernel(7.25);
  const cuda::KernelCacheStats compiled = cuda::kernel_cache_stats();
  EXPECT_EQ(compiled.compiles, start.compiles + 1);
  EXPECT_EQ(compiled.disk_hits, start.disk_hits);
  ASSERT_EQ(entries(cache_dir_).size(), 1u);
  EXPECT_TRUE(is_valid_entry(entries(cache_dir_)[0]));
  // The file name says what the entry was built for.
  const std::string name = entries(cache_dir_)[0].filename().string();
  EXPECT_NE(name.find("-sm_"), std::string::npos) << name;
  EXPECT_NE(name.find("-nvrtc"), std::string::npos) << name;

  // Still in memory: neither disk nor NVRTC.
  evaluate_kernel(7.25);
  const cuda::KernelCacheStats warm = cuda::kernel_cache_stats();
  EXPECT_GT(warm.memory_hits, compiled.memory_hits);
  EXPECT_EQ(warm.compiles, compiled.compiles);
  EXPECT_EQ(warm.disk_hits, compiled.disk_hits);

  // As a new process would: from disk, no compile.
  cuda::clear_memory_kernel_cache();
  evaluate_kernel(7.25);
  const cuda::KernelCacheStats loaded = cuda::kernel_cache_stats();
  EXPECT_EQ(loaded.disk_hits, warm.disk_hits + 1);
  EXPECT_EQ(loaded.compiles, warm.compiles);
  EXPECT_EQ(loaded.damaged_entries, start.damaged_entries);
  EXPECT_EQ(entries(cache_dir_).size(), 1u);
}

// Ways an entry gets damaged: a bit flip in the image, a write cut short, an empty file.
enum class Damage { FlipMiddle, Truncate, Empty };

void damage(const fs::path& path, Damage how) {
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  ASSERT_GT(bytes.size(), 64u);
  switch (how) {
    case Damage::FlipMiddle:
      for (size_t i = bytes.size() / 2; i < bytes.size() / 2 + 8; ++i) bytes[i] ^= 0x5A;
      break;
    case Damage::Truncate:
      bytes.resize(bytes.size() / 2);
      break;
    case Damage::Empty:
      bytes.clear();
      break;
  }
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  ASSERT_FALSE(is_valid_entry(path));
}

TEST_F(CudaCache, DamagedEntriesAreDetectedRecompiledAndReplaced) {
  double c = 11.25;
  for (Damage how : {Damage::FlipMiddle, Damage::Truncate, Damage::Empty}) {
    SCOPED_TRACE(static_cast<int>(how));
    c += 1;
    const std::vector<fs::path> before = entries(cache_dir_);
    evaluate_kernel(c);
    std::vector<fs::path> after = entries(cache_dir_);
    ASSERT_EQ(after.size(), before.size() + 1);
    fs::path entry;
    for (const fs::path& p : after)
      if (std::find(before.begin(), before.end(), p) == before.end()) entry = p;
    damage(entry, how);

    const cuda::KernelCacheStats start = cuda::kernel_cache_stats();
    cuda::clear_memory_kernel_cache();
    evaluate_kernel(c);  // a damaged entry never reaches cuModuleLoadData
    const cuda::KernelCacheStats recompiled = cuda::kernel_cache_stats();
    EXPECT_EQ(recompiled.damaged_entries, start.damaged_entries + 1);
    EXPECT_EQ(recompiled.compiles, start.compiles + 1);
    EXPECT_EQ(recompiled.disk_hits, start.disk_hits);
    EXPECT_TRUE(is_valid_entry(entry)) << "the entry was not replaced";

    // The replacement is a plain disk hit.
    cuda::clear_memory_kernel_cache();
    evaluate_kernel(c);
    const cuda::KernelCacheStats reloaded = cuda::kernel_cache_stats();
    EXPECT_EQ(reloaded.disk_hits, recompiled.disk_hits + 1);
    EXPECT_EQ(reloaded.compiles, recompiled.compiles);
    EXPECT_EQ(reloaded.damaged_entries, recompiled.damaged_entries);
  }
  EXPECT_EQ(all_files(cache_dir_).size(), 3u) << "temporary files left behind";
}

TEST_F(CudaCache, UnwritableCacheDirectoryStillEvaluates) {
  // Root ignores permission bits, so a directory root cannot write is one that cannot exist: a
  // path through a regular file. Without root, also a directory without write permission.
  std::vector<fs::path> unwritable;
  const fs::path blocker = root_ / "blocker";
  std::ofstream(blocker) << "a file, not a directory\n";
  unwritable.push_back(blocker / "cache");
  if (geteuid() != 0) {
    const fs::path read_only = root_ / "read-only";
    fs::create_directories(read_only);
    ASSERT_EQ(chmod(read_only.c_str(), 0500), 0) << std::strerror(errno);
    unwritable.push_back(read_only);
  }
  double c = 21.25;
  for (const fs::path& dir : unwritable) {
    SCOPED_TRACE(dir.string());
    set_cache_dir(dir.string());
    c += 1;
    const cuda::KernelCacheStats start = cuda::kernel_cache_stats();
    evaluate_kernel(c);
    cuda::clear_memory_kernel_cache();
    evaluate_kernel(c);  // nothing was kept: compiled again, and still right
    const cuda::KernelCacheStats end = cuda::kernel_cache_stats();
    EXPECT_EQ(end.compiles, start.compiles + 2);
    EXPECT_EQ(end.disk_hits, start.disk_hits);
    EXPECT_EQ(end.damaged_entries, start.damaged_entries);
    EXPECT_TRUE(all_files(dir).empty());
  }
}

// The body of each child process of TwoProcessesFillOneDirectoryAtOnce (which runs this binary
// again with a filter for this test and kChildMarker set); in a normal run it skips.
TEST_F(CudaCache, FillsCacheAsChildProcess) {
  if (std::getenv(kChildMarker) == nullptr)
    GTEST_SKIP() << "runs only as a child process of TwoProcessesFillOneDirectoryAtOnce";
  // A fresh process: LAZYFUSE_CACHE_DIR came from the parent, through the environment.
  set_cache_dir(std::getenv("LAZYFUSE_CACHE_DIR"));
  for (double c : kChildConstants) evaluate_kernel(c);
}

TEST_F(CudaCache, TwoProcessesFillOneDirectoryAtOnce) {
  // Everything the children need is built before fork: between fork and exec only
  // async-signal-safe calls are allowed (the parent has threads: OpenMP, the CUDA driver).
  // CUDA cannot be used in a forked child of a process that initialised it, hence the exec.
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view entry(*e);
    // Sharding or an output file of the parent would make a child skip its test or overwrite
    // the parent's report.
    if (entry.starts_with("GTEST_") || entry.starts_with("LAZYFUSE_CACHE_DIR=") ||
        entry.starts_with(kChildMarker))
      continue;
    env_strings.emplace_back(entry);
  }
  env_strings.push_back("LAZYFUSE_CACHE_DIR=" + cache_dir_.string());
  env_strings.push_back(std::string(kChildMarker) + "=1");
  std::vector<char*> envp;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string exe = fs::read_symlink("/proc/self/exe").string();
  std::string filter = "--gtest_filter=CudaCache.FillsCacheAsChildProcess";
  char* argv[] = {exe.data(), filter.data(), nullptr};
  const std::vector<fs::path> logs = {root_ / "child0.log", root_ / "child1.log"};

  std::vector<pid_t> children;
  for (const fs::path& log : logs) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0) << std::strerror(errno);
    if (pid == 0) {
      const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
      }
      execve(argv[0], argv, envp.data());
      _exit(127);
    }
    children.push_back(pid);
  }
  for (size_t k = 0; k < children.size(); ++k) {
    int status = 0;
    ASSERT_EQ(waitpid(children[k], &status, 0), children[k]);
    std::ifstream log(logs[k]);
    std::stringstream text;
    text << log.rdbuf();
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "child " << k << " failed (status " << status << "):\n"
        << text.str();
    EXPECT_NE(text.str().find("[  PASSED  ] 1 test"), std::string::npos)
        << "child " << k << " did not run its test:\n"
        << text.str();
  }

  // One valid entry per kernel, and no temporary file left behind.
  EXPECT_EQ(all_files(cache_dir_).size(), kChildConstants.size());
  ASSERT_EQ(entries(cache_dir_).size(), kChildConstants.size());
  for (const fs::path& entry : entries(cache_dir_)) EXPECT_TRUE(is_valid_entry(entry));

  // And the parent loads every one of them from disk.
  const cuda::KernelCacheStats start = cuda::kernel_cache_stats();
  for (double c : kChildConstants) evaluate_kernel(c);
  const cuda::KernelCacheStats end = cuda::kernel_cache_stats();
  EXPECT_EQ(end.disk_hits, start.disk_hits + static_cast<int64_t>(kChildConstants.size()));
  EXPECT_EQ(end.compiles, start.compiles);
  EXPECT_EQ(end.damaged_entries, start.damaged_entries);
}

}  // namespace
}  // namespace lazyfuse
