// FileSystem: the one seam through which cxlpool reads sysfs and procfs.
//
// Every path handed to a FileSystem is the path as it appears on the machine
// ("/sys/devices/system/node/online"). A rooted FileSystem prefixes its root
// (hwloc's HWLOC_FSROOT idea), so a captured tree reads exactly like the real
// machine. Symlinks inside the tree are resolved against the root, never
// against the real '/'. A FileSystem whose root is not '/' is "foreign":
// callers must not act on the real machine (no mbind, no NVML) when it is.
//
// FakeFileSystem holds files in memory and fails closed: a path the test did
// not configure is NOT_FOUND, never a read of the real /sys.
//
// Thread safety: const methods are safe to call concurrently; mutating a
// FakeFileSystem while another thread reads it is not.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cxlpool/common/status.h"

namespace cxlpool {

class FileSystem {
 public:
  virtual ~FileSystem() = default;

  // Whole file contents. NOT_FOUND, PERMISSION_DENIED or IO.
  virtual Result<std::string> ReadFile(std::string_view path) const = 0;
  // Entry names (no "." / ".."), sorted. NOT_FOUND if not a directory.
  virtual Result<std::vector<std::string>> ListDir(std::string_view path) const = 0;
  // The link text, as stored. INVALID_ARGUMENT if not a symlink.
  virtual Result<std::string> ReadLink(std::string_view path) const = 0;
  virtual bool Exists(std::string_view path) const = 0;
  virtual bool IsDir(std::string_view path) const = 0;

  // The machine path with every symlink resolved inside the root
  // ("/sys/bus/cxl/devices/mem0" -> "/sys/devices/platform/.../mem0").
  Result<std::string> Canonical(std::string_view path) const;

  // Convenience: ReadFile trimmed as a sysfs value (TrimSysfsValue:
  // surrounding whitespace and trailing NUL padding removed).
  Result<std::string> ReadTrimmed(std::string_view path) const;

  // "/" for the real machine, else the directory prefixed to every path.
  virtual const std::string& root() const = 0;
  bool IsThisSystem() const { return root() == "/"; }
};

// Reads the real file system under `root` ("/" = this machine).
std::unique_ptr<FileSystem> MakeRootedFileSystem(std::string root);

// The root named by $CXLPOOL_FSROOT, else `fallback`.
std::string FsRootFromEnv(const std::string& fallback = "/");

// In-memory tree for unit tests. Fails closed.
class FakeFileSystem final : public FileSystem {
 public:
  FakeFileSystem();
  void AddFile(const std::string& path, std::string contents);
  void AddSymlink(const std::string& path, std::string target);
  void AddDir(const std::string& path);
  // Reads of `path` fail with `status` (fault injection).
  void FailPath(const std::string& path, Status status);

  Result<std::string> ReadFile(std::string_view path) const override;
  Result<std::vector<std::string>> ListDir(std::string_view path) const override;
  Result<std::string> ReadLink(std::string_view path) const override;
  bool Exists(std::string_view path) const override;
  bool IsDir(std::string_view path) const override;
  const std::string& root() const override { return root_; }

 private:
  void AddParents(const std::string& path);
  std::string root_ = "<fake>";
  std::map<std::string, std::string> files_;
  std::map<std::string, std::string> links_;
  std::map<std::string, bool> dirs_;
  std::map<std::string, Status> failures_;
};

// Joins machine paths: JoinPath("/sys/a", "b") == "/sys/a/b".
std::string JoinPath(std::string_view a, std::string_view b);
// Last component of a path.
std::string BaseName(std::string_view path);

}  // namespace cxlpool
