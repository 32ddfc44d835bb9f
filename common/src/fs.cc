#include "cxlpool/common/fs.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "cxlpool/common/strings.h"

namespace cxlpool {
namespace {

// Splits "/a/b/../c" into components; ignores empty and ".".
std::vector<std::string> Components(std::string_view path) {
  std::vector<std::string> out;
  for (auto& part : Split(path, '/')) {
    if (part.empty() || part == ".") continue;
    out.push_back(std::move(part));
  }
  return out;
}

std::string Normalize(std::string_view path) {
  std::vector<std::string> stack;
  for (auto& c : Components(path)) {
    if (c == "..") {
      if (!stack.empty()) stack.pop_back();
    } else {
      stack.push_back(c);
    }
  }
  std::string out;
  for (auto& c : stack) out += "/" + c;
  return out.empty() ? "/" : out;
}

class RootedFileSystem final : public FileSystem {
 public:
  explicit RootedFileSystem(std::string root) : root_(std::move(root)) {
    while (root_.size() > 1 && root_.back() == '/') root_.pop_back();
    if (root_.empty()) root_ = "/";
  }

  Result<std::string> ReadFile(std::string_view path) const override {
    std::string host = Host(path);
    int fd = ::open(host.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Status::FromErrno(errno, "open " + std::string(path));
    std::string out;
    char buf[8192];
    for (;;) {
      ssize_t n = ::read(fd, buf, sizeof buf);
      if (n < 0) {
        if (errno == EINTR) continue;
        int err = errno;
        ::close(fd);
        return Status::FromErrno(err, "read " + std::string(path));
      }
      if (n == 0) break;
      out.append(buf, static_cast<size_t>(n));
      if (out.size() > (64u << 20)) {
        ::close(fd);
        return Status(Code::kInvalidArgument, "file too large: " + std::string(path));
      }
    }
    ::close(fd);
    return out;
  }

  Result<std::vector<std::string>> ListDir(std::string_view path) const override {
    std::string host = Host(path);
    DIR* d = ::opendir(host.c_str());
    if (!d) return Status::FromErrno(errno, "opendir " + std::string(path));
    std::vector<std::string> names;
    while (dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n == "." || n == "..") continue;
      names.push_back(std::move(n));
    }
    ::closedir(d);
    std::sort(names.begin(), names.end());
    return names;
  }

  Result<std::string> ReadLink(std::string_view path) const override {
    // Canonical() calls this with an already-resolved parent, so no
    // resolution here (which would recurse).
    std::string host = root_ == "/" ? std::string(path) : root_ + Normalize(path);
    char buf[4096];
    ssize_t n = ::readlink(host.c_str(), buf, sizeof buf - 1);
    if (n < 0) return Status::FromErrno(errno, "readlink " + std::string(path));
    return std::string(buf, static_cast<size_t>(n));
  }

  bool Exists(std::string_view path) const override {
    struct stat st;
    return ::lstat(Host(path).c_str(), &st) == 0;
  }

  bool IsDir(std::string_view path) const override {
    struct stat st;
    return ::stat(Host(path).c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  }

  const std::string& root() const override { return root_; }

 private:
  // Host path for a machine path. Symlinks in intermediate components are
  // resolved inside the root, so an absolute link in a captured tree stays
  // inside it.
  std::string Host(std::string_view path) const {
    if (root_ == "/") return std::string(path);
    auto canon = Canonical(path);
    std::string p = canon.ok() ? canon.value() : Normalize(path);
    return root_ + p;
  }
  std::string root_;
};

}  // namespace

Result<std::string> FileSystem::Canonical(std::string_view path) const {
  std::vector<std::string> pending = Components(path);
  std::reverse(pending.begin(), pending.end());
  std::vector<std::string> done;
  int links = 0;
  while (!pending.empty()) {
    std::string c = std::move(pending.back());
    pending.pop_back();
    if (c == "..") {
      if (!done.empty()) done.pop_back();
      continue;
    }
    done.push_back(c);
    std::string cur;
    for (auto& d : done) cur += "/" + d;
    auto link = ReadLink(cur);
    if (!link.ok()) continue;  // not a link (or missing): keep as is
    if (++links > 40) return Status(Code::kInvalidArgument, "symlink loop at " + cur);
    done.pop_back();
    const std::string& target = link.value();
    if (!target.empty() && target[0] == '/') done.clear();
    auto parts = Components(target);
    for (auto it = parts.rbegin(); it != parts.rend(); ++it) pending.push_back(*it);
  }
  std::string out;
  for (auto& d : done) out += "/" + d;
  return out.empty() ? std::string("/") : out;
}

Result<std::string> FileSystem::ReadTrimmed(std::string_view path) const {
  auto r = ReadFile(path);
  if (!r.ok()) return r.status();
  return std::string(TrimSysfsValue(r.value()));
}

std::unique_ptr<FileSystem> MakeRootedFileSystem(std::string root) {
  return std::make_unique<RootedFileSystem>(std::move(root));
}

std::string FsRootFromEnv(const std::string& fallback) {
  const char* e = std::getenv("CXLPOOL_FSROOT");
  if (e && *e) return e;
  return fallback;
}

std::string JoinPath(std::string_view a, std::string_view b) {
  std::string out(a);
  if (out.empty() || out.back() != '/') out += '/';
  while (!b.empty() && b.front() == '/') b.remove_prefix(1);
  out += b;
  return out;
}

std::string BaseName(std::string_view path) {
  while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  auto pos = path.rfind('/');
  return std::string(pos == std::string_view::npos ? path : path.substr(pos + 1));
}

// ---- FakeFileSystem --------------------------------------------------------

FakeFileSystem::FakeFileSystem() { dirs_["/"] = true; }

void FakeFileSystem::AddParents(const std::string& path) {
  std::string p = Normalize(path);
  while (p != "/") {
    auto pos = p.rfind('/');
    p = pos == 0 ? "/" : p.substr(0, pos);
    dirs_[p] = true;
  }
}

void FakeFileSystem::AddFile(const std::string& path, std::string contents) {
  AddParents(path);
  files_[Normalize(path)] = std::move(contents);
}

void FakeFileSystem::AddSymlink(const std::string& path, std::string target) {
  AddParents(path);
  links_[Normalize(path)] = std::move(target);
}

void FakeFileSystem::AddDir(const std::string& path) {
  AddParents(path);
  dirs_[Normalize(path)] = true;
}

void FakeFileSystem::FailPath(const std::string& path, Status status) {
  failures_[Normalize(path)] = std::move(status);
}

Result<std::string> FakeFileSystem::ReadFile(std::string_view path) const {
  auto canon = Canonical(path);
  if (!canon.ok()) return canon.status();
  if (auto f = failures_.find(*canon); f != failures_.end()) return f->second;
  auto it = files_.find(*canon);
  if (it == files_.end()) {
    return Status(Code::kNotFound, "fake fs: no file " + std::string(path));
  }
  return it->second;
}

Result<std::vector<std::string>> FakeFileSystem::ListDir(std::string_view path) const {
  auto canon = Canonical(path);
  if (!canon.ok()) return canon.status();
  if (auto f = failures_.find(*canon); f != failures_.end()) return f->second;
  if (!dirs_.count(*canon)) {
    return Status(Code::kNotFound, "fake fs: no directory " + std::string(path));
  }
  std::string prefix = *canon == "/" ? "/" : *canon + "/";
  std::vector<std::string> names;
  auto collect = [&](const auto& m) {
    for (auto it = m.lower_bound(prefix); it != m.end(); ++it) {
      if (it->first.compare(0, prefix.size(), prefix) != 0) break;
      std::string rest = it->first.substr(prefix.size());
      if (rest.empty() || rest.find('/') != std::string::npos) continue;
      names.push_back(rest);
    }
  };
  collect(files_);
  collect(links_);
  collect(dirs_);
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

Result<std::string> FakeFileSystem::ReadLink(std::string_view path) const {
  auto it = links_.find(Normalize(path));
  if (it == links_.end()) {
    return Status(Code::kInvalidArgument, "fake fs: not a symlink " + std::string(path));
  }
  return it->second;
}

bool FakeFileSystem::Exists(std::string_view path) const {
  std::string n = Normalize(path);
  if (links_.count(n)) return true;
  auto canon = Canonical(path);
  if (!canon.ok()) return false;
  return files_.count(*canon) || dirs_.count(*canon);
}

bool FakeFileSystem::IsDir(std::string_view path) const {
  auto canon = Canonical(path);
  return canon.ok() && dirs_.count(*canon);
}

}  // namespace cxlpool
