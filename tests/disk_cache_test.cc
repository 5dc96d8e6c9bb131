// The kernel disk cache's trust (runtime/disk_cache.h): a private directory, and nothing loaded
// from a directory or an entry another user could have written.
#include "lazyfuse/runtime/disk_cache.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace lazyfuse {
namespace {

namespace fs = std::filesystem;

// A fresh directory under the system's temporary one, removed afterwards.
class DiskCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("lazyfuse-disk-cache-" + std::to_string(::getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  fs::path root_;
};

mode_t mode_of(const fs::path& path) {
  struct stat info;
  EXPECT_EQ(::lstat(path.c_str(), &info), 0) << path;
  return info.st_mode & 07777;
}

const std::vector<char> kImage = {'c', 'u', 'b', 'i', 'n'};

TEST_F(DiskCacheTest, CreatesAPrivateDirectoryAndPrivateEntries) {
  const fs::path dir = root_ / "nested" / "cache";
  DiskCache cache(dir);
  EXPECT_EQ(cache.refusal(), "");
  EXPECT_EQ(mode_of(dir), 0700u);
  cache.store("k.cubin", kImage);
  EXPECT_EQ(mode_of(dir / "k.cubin"), 0600u);
  bool damaged = true;
  EXPECT_EQ(cache.load("k.cubin", &damaged), kImage);
  EXPECT_FALSE(damaged);
  EXPECT_TRUE(cache.load("missing.cubin", &damaged).empty());
  EXPECT_FALSE(damaged);
  // A damaged entry is reported, and a store replaces it.
  std::ofstream(dir / "k.cubin", std::ios::binary | std::ios::trunc) << "LFCUBIN1 short";
  EXPECT_TRUE(cache.load("k.cubin", &damaged).empty());
  EXPECT_TRUE(damaged);
  cache.store("k.cubin", kImage);
  EXPECT_EQ(cache.load("k.cubin", &damaged), kImage);
}

TEST_F(DiskCacheTest, ADirectoryOthersCanWriteIsNotUsedWithOneWarning) {
  const fs::path dir = root_ / "shared";
  DiskCache(dir).store("k.cubin", kImage);
  ASSERT_EQ(::chmod(dir.c_str(), 0777), 0);
  ::testing::internal::CaptureStderr();
  DiskCache cache(dir);
  DiskCache again(dir);
  bool damaged = false;
  EXPECT_TRUE(cache.load("k.cubin", &damaged).empty()) << "a valid entry, in a directory refused";
  const std::string warning = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(cache.refusal().find("writable by others (mode 0777)"), std::string::npos)
      << cache.refusal();
  EXPECT_NE(warning.find("not using the kernel cache at " + dir.string()), std::string::npos)
      << warning;
  EXPECT_EQ(warning.find("warning", warning.find("warning") + 1), std::string::npos)
      << "one warning per path:\n"
      << warning;
  cache.store("new.cubin", kImage);
  EXPECT_FALSE(fs::exists(dir / "new.cubin")) << "nothing written there either";
  // Group-writable is refused too.
  ASSERT_EQ(::chmod(dir.c_str(), 0770), 0);
  bool exists = false;
  EXPECT_NE(untrusted_reason(dir, true, &exists).find("writable by its group"), std::string::npos);
}

TEST_F(DiskCacheTest, AnEntryOthersCouldHaveWrittenIsNotLoaded) {
  const fs::path dir = root_ / "cache";
  DiskCache cache(dir);
  cache.store("k.cubin", kImage);
  ASSERT_EQ(::chmod((dir / "k.cubin").c_str(), 0666), 0);
  ::testing::internal::CaptureStderr();
  bool damaged = false;
  EXPECT_TRUE(cache.load("k.cubin", &damaged).empty());
  const std::string warning = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(warning.find((dir / "k.cubin").string() + ": it is writable by others"),
            std::string::npos)
      << warning;
  // A link is not an entry, whatever it points at.
  fs::create_symlink(dir / "k.cubin", dir / "link.cubin");
  ::testing::internal::CaptureStderr();
  EXPECT_TRUE(cache.load("link.cubin", &damaged).empty());
  EXPECT_NE(::testing::internal::GetCapturedStderr().find("not a regular file"), std::string::npos);
  // Once private again, it loads.
  ASSERT_EQ(::chmod((dir / "k.cubin").c_str(), 0600), 0);
  EXPECT_EQ(cache.load("k.cubin", &damaged), kImage);
}

// Ownership by another user can be set up only as root (CI's containers run as root).
TEST_F(DiskCacheTest, ADirectoryOrEntryOfAnotherUserIsNotUsed) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a file to another user";
  const uid_t nobody = 65534;
  const fs::path dir = root_ / "theirs";
  DiskCache(dir).store("k.cubin", kImage);
  ASSERT_EQ(::chown((dir / "k.cubin").c_str(), nobody, nobody), 0);
  ::testing::internal::CaptureStderr();
  bool damaged = false;
  EXPECT_TRUE(DiskCache(dir).load("k.cubin", &damaged).empty()) << "their entry";
  EXPECT_NE(::testing::internal::GetCapturedStderr().find("owned by user 65534"),
            std::string::npos);
  ASSERT_EQ(::chown((dir / "k.cubin").c_str(), 0, 0), 0);
  ASSERT_EQ(::chown(dir.c_str(), nobody, nobody), 0);
  ::testing::internal::CaptureStderr();
  DiskCache cache(dir);
  ::testing::internal::GetCapturedStderr();
  EXPECT_NE(cache.refusal().find("owned by user 65534"), std::string::npos) << cache.refusal();
  EXPECT_TRUE(cache.load("k.cubin", &damaged).empty()) << "our entry, in their directory";
}

}  // namespace
}  // namespace lazyfuse
