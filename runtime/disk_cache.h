// The disk cache of compiled kernels: a directory of entries, each a checked image. What it holds
// runs in the user's GPU context, so, as pip and ccache do, lazyfuse trusts only what the user
// alone could have written: the directory is created private (0700); a directory or an entry
// owned by another user, or writable by its group or others, is not used (the kernel is compiled
// instead), with one warning that names the path.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace lazyfuse {

class DiskCache {
 public:
  // The cache in `dir`, created (0700, with its missing parents) where missing; checked once
  // here. An empty `dir` is no cache.
  explicit DiskCache(std::filesystem::path dir);

  // The image stored under `name`, or empty: none, not to be trusted, or damaged (*damaged set,
  // and the entry is rewritten by the next store).
  std::vector<char> load(const std::string& name, bool* damaged) const;
  // Stores `image` under `name` (0600, written whole under another name and renamed over it);
  // best effort: a cache that cannot be written costs a compile next time.
  void store(const std::string& name, const std::vector<char>& image) const;

  // Why the directory is not used, or "" when it is.
  const std::string& refusal() const { return refusal_; }

 private:
  std::filesystem::path dir_;
  std::string refusal_;
};

// Why `path` is not to be trusted (owned by another user, writable by its group or others, not
// the kind of file expected), or "" when it is; "" too when it does not exist (`exists` false).
std::string untrusted_reason(const std::filesystem::path& path, bool directory, bool* exists);

}  // namespace lazyfuse
