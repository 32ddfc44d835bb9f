// LeaseJournal: the write-ahead record of which leases exist, kept in the
// daemon's state directory so a restarted daemon (upgrade, crash, SIGKILL)
// knows every lease it had granted and never grants an id twice.
//
// File format (little-endian), one file "leases.journal":
//   header:  "CXLPJRN1" (8 bytes)
//   records: u32 payload length | u32 CRC-32 of payload | payload (Entry)
//
// Durability: a record survives a crash of the daemon once Append returns
// (one write(2); the data is in the kernel's page cache). It is deliberately
// not fsynced: the leases it describes are memory, which a host crash or
// reboot loses anyway, so the journal only has to outlive the process. The
// journal records the kernel's boot id (OP_BOOT), and Open drops every lease
// of an earlier boot (the memory is gone; nobody can hand it back), keeping
// only the id high-water mark. Replay stops at the first torn or corrupt
// record (a host crash mid-append) and truncates the file there; everything
// before it is intact. Compact() writes the live set to a temp file, fsyncs
// it, renames it over the journal and fsyncs the directory, so a crash at any
// point leaves either the old or the new file.
//
// Thread safety: not thread-safe; the daemon's event-loop thread owns it.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "cxlpool/common/status.h"
#include "cxlpool/common/unique_fd.h"
#include "journal.pb.h"

namespace cxlpool {

struct JournalState {
  std::map<uint64_t, journal::LeaseRecord> leases;  // live leases by id
  uint64_t next_id = 1;                             // first id never granted
  uint64_t records_replayed = 0;
  uint64_t torn_bytes_dropped = 0;  // tail discarded at open
  std::string boot_id;              // the boot the live records belong to
  // Leases journalled during an earlier boot, dropped at open.
  uint64_t leases_from_earlier_boot = 0;
  std::string earlier_boot_id;  // that boot's id, "" if none was dropped
};

// The running kernel's boot id (/proc/sys/kernel/random/boot_id, trimmed),
// or "" when it cannot be read (then no journal is ever dropped as stale).
std::string CurrentBootId();

class LeaseJournal {
 public:
  // Opens (creating if needed) `dir`/leases.journal and replays it. Leases
  // recorded under another boot id than `boot_id` are dropped (and the file
  // compacted); an empty `boot_id` disables that check.
  static Result<LeaseJournal> Open(const std::string& dir);
  static Result<LeaseJournal> Open(const std::string& dir, const std::string& boot_id);

  LeaseJournal(LeaseJournal&&) = default;
  LeaseJournal& operator=(LeaseJournal&&) = default;

  // The state as replayed at Open, then kept current by every append.
  const JournalState& state() const { return state_; }

  Status Put(journal::LeaseRecord lease);
  Status Delete(uint64_t lease_id);
  // Records that ids below `next_id` are taken. Call before granting them.
  Status ReserveIds(uint64_t next_id);

  // Rewrites the journal with only the live state.
  Status Compact();
  // Compact when the file holds more than `factor` times the live records and
  // at least `min_records` (about 1 MiB by default: a daemon with few live
  // leases and many short ones must not rewrite and fsync the file every few
  // dozen grants, on its event loop).
  Status MaybeCompact(double factor = 4.0, uint64_t min_records = 8192);

  uint64_t file_records() const { return file_records_; }
  const std::string& path() const { return path_; }

 private:
  LeaseJournal() = default;
  // Writes `e`, then applies it to the state (moving its lease record).
  Status Append(journal::Entry& e);
  Status RecordBoot(const std::string& boot_id);
  void Apply(journal::Entry& e);

  std::string dir_;
  std::string path_;
  UniqueFd fd_;
  JournalState state_;
  uint64_t file_records_ = 0;
};

}  // namespace cxlpool
