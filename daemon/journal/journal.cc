#include "journal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/crc.hpp>
#include <cerrno>
#include <cstring>
#include <vector>

#include "cxlpool/common/log.h"

namespace cxlpool {
namespace {

constexpr char kMagic[8] = {'C', 'X', 'L', 'P', 'J', 'R', 'N', '1'};
constexpr uint32_t kMaxRecord = 1u << 20;

uint32_t Crc32(const char* data, size_t size) {
  boost::crc_32_type crc;
  crc.process_bytes(data, size);
  return crc.checksum();
}

void PutU32(char* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i)
    v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

Status WriteAll(int fd, const std::string& data, const std::string& what) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(errno, "write " + what);
    }
    off += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status FsyncDir(const std::string& dir) {
  UniqueFd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!d) return Status::FromErrno(errno, "open " + dir);
  if (::fsync(d.get()) != 0) return Status::FromErrno(errno, "fsync " + dir);
  return Status::Ok();
}

// Appends one record (length, CRC-32, payload) to `out`, serialising in
// place: a grant's record is built without an intermediate copy.
void AppendFrame(const journal::Entry& e, std::string* out) {
  const size_t size = e.ByteSizeLong();
  const size_t start = out->size();
  out->resize(start + 8 + size);
  char* rec = out->data() + start;
  e.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(rec + 8));
  PutU32(rec, static_cast<uint32_t>(size));
  PutU32(rec + 4, Crc32(rec + 8, size));
}

}  // namespace

std::string CurrentBootId() {
  UniqueFd fd(::open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC));
  if (!fd) return "";
  char buf[64];
  ssize_t n = ::read(fd.get(), buf, sizeof buf);
  if (n <= 0) return "";
  std::string id(buf, static_cast<size_t>(n));
  while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
  return id;
}

Result<LeaseJournal> LeaseJournal::Open(const std::string& dir) {
  return Open(dir, CurrentBootId());
}

Result<LeaseJournal> LeaseJournal::Open(const std::string& dir, const std::string& boot_id) {
  LeaseJournal j;
  j.dir_ = dir;
  j.path_ = dir + "/leases.journal";
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return Status::FromErrno(errno, "mkdir " + dir);
  }
  j.fd_.Reset(::open(j.path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!j.fd_) return Status::FromErrno(errno, "open " + j.path_);

  std::string data;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(j.fd_.get(), buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(errno, "read " + j.path_);
    }
    if (n == 0) break;
    data.append(buf, static_cast<size_t>(n));
  }

  if (data.empty()) {
    CXLPOOL_RETURN_IF_ERROR(WriteAll(j.fd_.get(), std::string(kMagic, 8), j.path_));
    if (::fdatasync(j.fd_.get()) != 0) return Status::FromErrno(errno, "fdatasync " + j.path_);
    CXLPOOL_RETURN_IF_ERROR(FsyncDir(dir));
    if (!boot_id.empty()) CXLPOOL_RETURN_IF_ERROR(j.RecordBoot(boot_id));
    return j;
  }
  if (data.size() < 8 || std::memcmp(data.data(), kMagic, 8) != 0) {
    return Status(Code::kInvalidArgument,
                  j.path_ +
                      " is not a cxlpool lease journal (bad magic); move it away to start "
                      "without lease history");
  }
  size_t off = 8;
  while (off < data.size()) {
    if (data.size() - off < 8) break;
    uint32_t len = GetU32(data.data() + off);
    uint32_t crc = GetU32(data.data() + off + 4);
    if (len > kMaxRecord || data.size() - off - 8 < len) break;
    const char* payload = data.data() + off + 8;
    if (Crc32(payload, len) != crc) break;
    journal::Entry e;
    if (!e.ParseFromArray(payload, static_cast<int>(len))) break;
    j.Apply(e);
    ++j.state_.records_replayed;
    ++j.file_records_;
    off += 8 + len;
  }
  if (off < data.size()) {
    j.state_.torn_bytes_dropped = data.size() - off;
    CXLPOOL_LOG(kWarning) << j.path_ << ": dropping " << j.state_.torn_bytes_dropped
                          << " bytes of torn or corrupt tail after " << j.file_records_
                          << " records";
    if (::ftruncate(j.fd_.get(), static_cast<off_t>(off)) != 0) {
      return Status::FromErrno(errno, "ftruncate " + j.path_);
    }
    if (::fdatasync(j.fd_.get()) != 0) return Status::FromErrno(errno, "fdatasync " + j.path_);
  }
  if (::lseek(j.fd_.get(), 0, SEEK_END) < 0) return Status::FromErrno(errno, "lseek " + j.path_);
  if (boot_id.empty() || j.state_.boot_id == boot_id) return j;
  if (j.state_.boot_id.empty()) {
    // A journal written before boot ids were recorded: keep its leases (the
    // grace period and the owners' liveness checks still apply).
    CXLPOOL_RETURN_IF_ERROR(j.RecordBoot(boot_id));
    return j;
  }
  j.state_.leases_from_earlier_boot = j.state_.leases.size();
  j.state_.earlier_boot_id = j.state_.boot_id;
  if (!j.state_.leases.empty()) {
    CXLPOOL_LOG(kWarning) << j.path_ << ": dropping " << j.state_.leases.size()
                          << " leases journalled during boot " << j.state_.boot_id
                          << " (this is boot " << boot_id
                          << "): their memory did not survive the reboot";
  }
  j.state_.leases.clear();
  j.state_.boot_id = boot_id;
  CXLPOOL_RETURN_IF_ERROR(j.Compact());
  return j;
}

Status LeaseJournal::RecordBoot(const std::string& boot_id) {
  journal::Entry e;
  e.set_op(journal::Entry::OP_BOOT);
  e.set_boot_id(boot_id);
  return Append(e);
}

void LeaseJournal::Apply(journal::Entry& e) {
  switch (e.op()) {
    case journal::Entry::OP_PUT: {
      const uint64_t id = e.lease().id();
      if (id >= state_.next_id) state_.next_id = id + 1;
      state_.leases[id].Swap(e.mutable_lease());  // the record is moved, not copied
      break;
    }
    case journal::Entry::OP_DELETE:
      state_.leases.erase(e.lease_id());
      break;
    case journal::Entry::OP_NEXT_ID:
      if (e.next_id() > state_.next_id) state_.next_id = e.next_id();
      break;
    case journal::Entry::OP_BOOT:
      state_.boot_id = e.boot_id();
      break;
    default:
      break;
  }
}

Status LeaseJournal::Append(journal::Entry& e) {
  std::string rec;
  AppendFrame(e, &rec);
  // No fdatasync: see the header (the journal only has to outlive the
  // process; a host crash takes the leases' memory with it).
  CXLPOOL_RETURN_IF_ERROR(WriteAll(fd_.get(), rec, path_));
  Apply(e);
  ++file_records_;
  return Status::Ok();
}

Status LeaseJournal::Put(journal::LeaseRecord lease) {
  if (lease.id() == 0) return Status(Code::kInvalidArgument, "journal: lease id 0");
  journal::Entry e;
  e.set_op(journal::Entry::OP_PUT);
  e.mutable_lease()->Swap(&lease);
  return Append(e);
}

Status LeaseJournal::Delete(uint64_t lease_id) {
  journal::Entry e;
  e.set_op(journal::Entry::OP_DELETE);
  e.set_lease_id(lease_id);
  return Append(e);
}

Status LeaseJournal::ReserveIds(uint64_t next_id) {
  if (next_id <= state_.next_id) return Status::Ok();
  journal::Entry e;
  e.set_op(journal::Entry::OP_NEXT_ID);
  e.set_next_id(next_id);
  return Append(e);
}

Status LeaseJournal::Compact() {
  std::string tmp = path_ + ".tmp";
  UniqueFd t(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  if (!t) return Status::FromErrno(errno, "open " + tmp);
  std::string out(kMagic, 8);
  uint64_t records = 0;
  if (!state_.boot_id.empty()) {
    journal::Entry boot;
    boot.set_op(journal::Entry::OP_BOOT);
    boot.set_boot_id(state_.boot_id);
    AppendFrame(boot, &out);
    ++records;
  }
  journal::Entry id;
  id.set_op(journal::Entry::OP_NEXT_ID);
  id.set_next_id(state_.next_id);
  AppendFrame(id, &out);
  ++records;
  for (const auto& [lease_id, rec] : state_.leases) {
    journal::Entry e;
    e.set_op(journal::Entry::OP_PUT);
    *e.mutable_lease() = rec;
    AppendFrame(e, &out);
    ++records;
  }
  CXLPOOL_RETURN_IF_ERROR(WriteAll(t.get(), out, tmp));
  if (::fsync(t.get()) != 0) return Status::FromErrno(errno, "fsync " + tmp);
  if (::rename(tmp.c_str(), path_.c_str()) != 0) return Status::FromErrno(errno, "rename " + tmp);
  CXLPOOL_RETURN_IF_ERROR(FsyncDir(dir_));
  UniqueFd fresh(::open(path_.c_str(), O_RDWR | O_APPEND | O_CLOEXEC));
  if (!fresh) return Status::FromErrno(errno, "reopen " + path_);
  if (::lseek(fresh.get(), 0, SEEK_END) < 0) return Status::FromErrno(errno, "lseek " + path_);
  fd_ = std::move(fresh);
  file_records_ = records;
  return Status::Ok();
}

Status LeaseJournal::MaybeCompact(double factor, uint64_t min_records) {
  double live = static_cast<double>(state_.leases.size() + 1);
  if (static_cast<double>(file_records_) > factor * live && file_records_ >= min_records) {
    return Compact();
  }
  return Status::Ok();
}

}  // namespace cxlpool
