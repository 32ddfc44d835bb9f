#include "journal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <boost/crc.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <vector>

#include "cxlpool/common/log.h"
#include "cxlpool/common/strings.h"

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

std::string JournalDamage::Describe() const {
  std::vector<std::string> parts;
  if (journal_missing) parts.push_back("the journal is missing");
  if (journal_empty) parts.push_back("the journal is empty");
  if (bad_header) parts.push_back("its header is damaged");
  if (skipped_regions > 0) {
    parts.push_back(std::to_string(skipped_regions) + " damaged stretch(es) (" +
                    std::to_string(skipped_bytes) + " bytes) skipped");
  }
  if (bad_tail_bytes > 0) {
    parts.push_back("an unreadable tail of " + std::to_string(bad_tail_bytes) + " bytes dropped");
  }
  if (torn_tail_bytes > 0) {
    parts.push_back("a torn last record (" + std::to_string(torn_tail_bytes) + " bytes) dropped");
  }
  if (id_mark_missing) parts.push_back("the id mark (lease-ids) is missing");
  if (id_mark_damaged) parts.push_back("the id mark (lease-ids) is damaged");
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : "; ") + p;
  if (!saved_copy.empty()) out += " (damaged file copied to " + saved_copy + ")";
  return out;
}

namespace {

constexpr char kIdMarkHeader[] = "cxlpool lease ids v1\n";

std::string IdMarkPath(const std::string& dir) { return dir + "/lease-ids"; }

std::string Hex32(uint32_t v) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

// The record at `off`, if one is intact there: a plausible length, the
// payload inside the data, its CRC, and an Entry with a known op.
bool RecordAt(const std::string& data, size_t off, journal::Entry* e, uint32_t* len_out) {
  if (data.size() - off < 8) return false;
  const uint32_t len = GetU32(data.data() + off);
  const uint32_t crc = GetU32(data.data() + off + 4);
  if (len == 0 || len > kMaxRecord || data.size() - off - 8 < len) return false;
  const char* payload = data.data() + off + 8;
  if (static_cast<unsigned char>(payload[0]) != 0x08) return false;  // field 1 (op) first
  if (Crc32(payload, len) != crc) return false;
  e->Clear();
  if (!e->ParseFromArray(payload, static_cast<int>(len))) return false;
  if (e->op() == journal::Entry::OP_UNSPECIFIED || !journal::Entry::Op_IsValid(e->op())) {
    return false;
  }
  *len_out = len;
  return true;
}

// A tail at `off` that is only the beginning of a record: its header is cut,
// or it announces a payload that runs past the end of the file.
bool TornTail(const std::string& data, size_t off) {
  if (data.size() - off < 8) return true;
  const uint32_t len = GetU32(data.data() + off);
  return len > 0 && len <= kMaxRecord && data.size() - off - 8 < len;
}

// Microseconds since the epoch: the floor for ids when both the journal and
// the id mark are lost (ids then keep growing across such a loss as long as
// fewer than a million are granted per second on average).
uint64_t WallClockMicros() {
  struct timespec ts {};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000u + static_cast<uint64_t>(ts.tv_nsec) / 1000u;
}

}  // namespace

IdMark ReadIdMark(const std::string& dir) {
  IdMark m;
  UniqueFd fd(::open(IdMarkPath(dir).c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) {
    m.state = errno == ENOENT ? IdMark::State::kAbsent : IdMark::State::kDamaged;
    return m;
  }
  std::string text;
  char buf[512];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > 4096) break;
  }
  m.state = IdMark::State::kDamaged;
  // header, "next_id N\n", "boot_id B\n", "crc32 XXXXXXXX\n" (of what precedes).
  const size_t crc_at = text.rfind("crc32 ");
  if (crc_at == std::string::npos ||
      text.compare(0, sizeof kIdMarkHeader - 1, kIdMarkHeader) != 0) {
    return m;
  }
  auto crc = ParseU64(std::string_view(text).substr(crc_at + 6), 16);
  if (!crc || *crc != Crc32(text.data(), crc_at)) return m;
  uint64_t next_id = 0;
  bool have_id = false;
  for (const auto& line : Split(std::string_view(text).substr(0, crc_at), '\n')) {
    if (StartsWith(line, "next_id ")) {
      auto v = ParseU64(std::string_view(line).substr(8));
      if (!v || *v == 0) return m;
      next_id = *v;
      have_id = true;
    } else if (StartsWith(line, "boot_id ")) {
      m.boot_id = std::string(std::string_view(line).substr(8));
    }
  }
  if (!have_id) return m;
  m.next_id = next_id;
  m.state = IdMark::State::kOk;
  return m;
}

Status WriteIdMark(const std::string& dir, uint64_t next_id, const std::string& boot_id) {
  std::string text = kIdMarkHeader;
  text += "next_id " + std::to_string(next_id) + "\n";
  text += "boot_id " + boot_id + "\n";
  text += "crc32 " + Hex32(Crc32(text.data(), text.size())) + "\n";
  const std::string path = IdMarkPath(dir);
  const std::string tmp = path + ".tmp";
  {
    UniqueFd t(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    if (!t) return Status::FromErrno(errno, "open " + tmp);
    CXLPOOL_RETURN_IF_ERROR(WriteAll(t.get(), text, tmp));
  }
  // Not fsynced, like the journal: it only has to outlive the daemon.
  if (::rename(tmp.c_str(), path.c_str()) != 0) return Status::FromErrno(errno, "rename " + tmp);
  return Status::Ok();
}

Result<LeaseJournal> LeaseJournal::Open(const std::string& dir) {
  return Open(dir, CurrentBootId());
}

bool LeaseJournal::Replay(const std::string& data) {
  JournalDamage& dmg = state_.damage;
  const bool magic_ok = data.size() >= 8 && std::memcmp(data.data(), kMagic, 8) == 0;
  size_t off = magic_ok ? 8 : 0;
  bool found_any = false;
  journal::Entry e;
  while (off < data.size()) {
    uint32_t len = 0;
    if (RecordAt(data, off, &e, &len)) {
      Apply(e);
      found_any = true;
      ++state_.records_replayed;
      ++file_records_;
      off += 8 + len;
      continue;
    }
    // Damage at `off`: go on at the next intact record, if there is one.
    size_t next = off + 1;
    for (; next < data.size(); ++next) {
      if (RecordAt(data, next, &e, &len)) break;
    }
    if (next >= data.size()) {
      const uint64_t tail = data.size() - off;
      state_.torn_bytes_dropped = tail;
      if (TornTail(data, off)) {
        dmg.torn_tail_bytes = tail;
      } else if (off > 0 || magic_ok) {
        dmg.bad_tail_bytes = tail;
      }
      break;
    }
    if (off == 0 && !magic_ok) {
      dmg.bad_header = true;  // the stretch before the first record is the header
    } else {
      ++dmg.skipped_regions;
      dmg.skipped_bytes += next - off;
    }
    off = next;
  }
  return magic_ok || found_any;
}

namespace {

// The whole file from `fd`'s offset on.
Result<std::string> ReadToEnd(int fd, const std::string& path) {
  std::string data;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(errno, "read " + path);
    }
    if (n == 0) break;
    data.append(buf, static_cast<size_t>(n));
  }
  return data;
}

// What the id mark adds to the replayed state: the boot and the high-water
// mark when the journal lost them, its own damage, and whether this boot's
// leases may be among what was lost.
void ReconcileWithMark(const IdMark& mark, const std::string& boot_id, JournalState* state) {
  JournalState& st = *state;
  JournalDamage& dmg = st.damage;
  if (st.boot_id.empty() && mark.state == IdMark::State::kOk) {
    st.boot_id = mark.boot_id;  // the boot record was lost; the mark knows the boot
  }
  if (mark.state == IdMark::State::kDamaged) dmg.id_mark_damaged = true;
  if (mark.state == IdMark::State::kAbsent && st.next_id > 1) dmg.id_mark_missing = true;
  if (mark.state == IdMark::State::kOk) st.next_id = std::max(st.next_id, mark.next_id);
  if (dmg.journal_damaged()) {
    dmg.boot_id = !st.boot_id.empty()                ? st.boot_id
                  : mark.state == IdMark::State::kOk ? mark.boot_id
                                                     : std::string();
    // This boot's leases may be among what was lost: unless the damaged
    // state provably belongs to an earlier boot.
    st.may_have_lost_leases = boot_id.empty() || dmg.boot_id.empty() || dmg.boot_id == boot_id;
    if (mark.state != IdMark::State::kOk) {
      // Neither the journal nor the mark knows the high-water mark.
      st.next_id = std::max(st.next_id, WallClockMicros());
    }
  } else if (dmg.torn_tail_bytes > 0) {
    st.may_have_lost_leases = st.boot_id.empty() || st.boot_id == boot_id;
  }
}

// One line for what Open found wrong: an error when records were lost.
void LogDamage(const std::string& path, const JournalState& st) {
  std::string msg =
      path + ": " + st.damage.Describe() + "; " + std::to_string(st.leases.size()) +
      " leases recovered from it, ids continue at " + std::to_string(st.next_id) +
      (st.may_have_lost_leases
           ? "; leases of this boot may be missing: their holders' RECLAIM accounts them again"
           : "");
  if (st.damage.journal_damaged()) {
    CXLPOOL_LOG(kError) << msg;
  } else {
    CXLPOOL_LOG(kWarning) << msg;
  }
}

}  // namespace

Result<LeaseJournal> LeaseJournal::Open(const std::string& dir, const std::string& boot_id,
                                        bool dir_had_state) {
  LeaseJournal j;
  j.dir_ = dir;
  j.path_ = dir + "/leases.journal";
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return Status::FromErrno(errno, "mkdir " + dir);
  }
  const IdMark mark = ReadIdMark(dir);
  struct stat before {};
  const bool existed = ::stat(j.path_.c_str(), &before) == 0;
  j.fd_.Reset(::open(j.path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!j.fd_) return Status::FromErrno(errno, "open " + j.path_);

  Result<std::string> read = ReadToEnd(j.fd_.get(), j.path_);
  if (!read.ok()) return read.status();
  const std::string& data = *read;

  JournalDamage& dmg = j.state_.damage;
  const bool had_state = dir_had_state || mark.state != IdMark::State::kAbsent;
  if (!existed) {
    dmg.journal_missing = had_state;
  } else if (data.size() <= 8) {
    // 0 bytes, a cut header or the header alone. Without any sign of use (no
    // id mark, no earlier start) it is a first start that died while creating
    // the journal: no id was ever granted from it.
    dmg.journal_empty = had_state;
  }
  if (data.size() > 8 && std::memcmp(data.data(), kMagic, 8) != 0) {
    if (!j.Replay(data)) {
      return Status(Code::kInvalidArgument,
                    j.path_ +
                        " is not a cxlpool lease journal (bad magic, and no record in it); move "
                        "it away to start without lease history");
    }
  } else if (data.size() > 8) {
    j.Replay(data);
  }
  ReconcileWithMark(mark, boot_id, &j.state_);

  if (data.size() <= 8 && !dmg.journal_damaged()) {
    // A new journal: header and boot record.
    if (::ftruncate(j.fd_.get(), 0) != 0 || ::lseek(j.fd_.get(), 0, SEEK_SET) != 0) {
      return Status::FromErrno(errno, "reset " + j.path_);
    }
    CXLPOOL_RETURN_IF_ERROR(WriteAll(j.fd_.get(), std::string(kMagic, 8), j.path_));
    if (::fdatasync(j.fd_.get()) != 0) return Status::FromErrno(errno, "fdatasync " + j.path_);
    CXLPOOL_RETURN_IF_ERROR(FsyncDir(dir));
    if (!boot_id.empty()) CXLPOOL_RETURN_IF_ERROR(j.RecordBoot(boot_id));
  } else if (dmg.journal_damaged() || dmg.torn_tail_bytes > 0) {
    if (!boot_id.empty() && j.state_.boot_id.empty()) j.state_.boot_id = boot_id;
    CXLPOOL_RETURN_IF_ERROR(j.SaveAndRewrite(data));
  } else if (::lseek(j.fd_.get(), 0, SEEK_END) < 0) {
    return Status::FromErrno(errno, "lseek " + j.path_);
  }
  if (dmg.any()) LogDamage(j.path_, j.state_);
  if (!boot_id.empty() && j.state_.boot_id != boot_id) {
    if (j.state_.boot_id.empty()) {
      // A journal written before boot ids were recorded: keep its leases (the
      // grace period and the owners' liveness checks still apply).
      CXLPOOL_RETURN_IF_ERROR(j.RecordBoot(boot_id));
    } else {
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
    }
  }
  if (mark.state != IdMark::State::kOk || mark.next_id != j.state_.next_id ||
      mark.boot_id != j.state_.boot_id) {
    CXLPOOL_RETURN_IF_ERROR(WriteIdMark(dir, j.state_.next_id, j.state_.boot_id));
  }
  return j;
}

Status LeaseJournal::SaveAndRewrite(const std::string& data) {
  JournalDamage& dmg = state_.damage;
  if (!data.empty() && dmg.journal_damaged()) {
    const std::string copy = path_ + ".damaged";
    const std::string tmp = copy + ".tmp";
    UniqueFd t(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    Status st = t ? WriteAll(t.get(), data, tmp) : Status::FromErrno(errno, "open " + tmp);
    if (st.ok() && ::rename(tmp.c_str(), copy.c_str()) != 0) {
      st = Status::FromErrno(errno, "rename " + tmp);
    }
    if (st.ok()) {
      dmg.saved_copy = copy;
    } else {
      CXLPOOL_LOG(kWarning) << "keeping a copy of the damaged journal: " << st.ToString();
    }
  }
  return Compact();
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
  CXLPOOL_RETURN_IF_ERROR(Append(e));
  return WriteIdMark(dir_, state_.next_id, state_.boot_id);
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
