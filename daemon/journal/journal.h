// LeaseJournal: the write-ahead record of which leases exist, kept in the
// daemon's state directory so a restarted daemon (upgrade, crash, SIGKILL)
// knows every lease it had granted and never grants an id twice.
//
// File format (little-endian), one file "leases.journal":
//   header:  "CXLPJRN1" (8 bytes)
//   records: u32 payload length | u32 CRC-32 of payload | payload (Entry)
// A payload always starts with the byte 0x08 (field 1, the op, is always set
// and serialised first), which replay uses to find record starts again.
//
// The id mark, a second small file "lease-ids" (text: next_id, boot id,
// CRC-32), holds the id high-water mark apart from the journal, so damage to
// the journal cannot make an id be granted twice. It is rewritten (temp file
// + rename) at every id reservation (one per 1024 grants) and at Open.
//
// Durability: a record survives a crash of the daemon once Append returns
// (one write(2); the data is in the kernel's page cache). It is deliberately
// not fsynced: the leases it describes are memory, which a host crash or
// reboot loses anyway, so the journal only has to outlive the process. The
// journal records the kernel's boot id (OP_BOOT), and Open drops every lease
// of an earlier boot (the memory is gone; nobody can hand it back), keeping
// only the id high-water mark. Compact() writes the live set to a temp file,
// fsyncs it, renames it over the journal and fsyncs the directory, so a crash
// at any point leaves either the old or the new file.
//
// Damage (docs/daemon.md, "Journal damage"): replay goes past a record whose
// length, CRC or payload is bad to the next record that is intact, and
// counts what it skipped. A tail that is only the start of a record (a crash
// mid-append: never acknowledged) is a torn tail; any other unreadable tail
// is damage. A journal that is missing or empty next to an id mark (or
// where the daemon's lock file already was) has been lost. Whatever Open
// found is in JournalState::damage; a damaged journal is copied to
// "leases.journal.damaged" for inspection and rewritten clean.
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

// What Open found wrong with the journal and the id mark.
struct JournalDamage {
  bool journal_missing = false;  // no journal, but the directory held daemon state
  bool journal_empty = false;    // 0 bytes, or the header alone
  bool bad_header = false;       // the magic was damaged; records followed it
  uint64_t skipped_regions = 0;  // damaged stretches replay went past
  uint64_t skipped_bytes = 0;    // their bytes
  uint64_t torn_tail_bytes = 0;  // an unfinished last record, dropped
  uint64_t bad_tail_bytes = 0;   // an unreadable tail (garbage, a damaged last record), dropped
  bool id_mark_missing = false;  // no id mark next to a journal that had granted ids
  bool id_mark_damaged = false;  // the id mark did not parse or its CRC failed
  // The boot the damaged state belonged to ("" unknown).
  std::string boot_id;
  // Where the damaged journal was copied ("" when none was needed).
  std::string saved_copy;

  // The journal lost or may have lost records (anything but a torn tail).
  bool journal_damaged() const {
    return journal_missing || journal_empty || bad_header || skipped_regions > 0 ||
           bad_tail_bytes > 0;
  }
  bool any() const {
    return journal_damaged() || torn_tail_bytes > 0 || id_mark_missing || id_mark_damaged;
  }
  // One line for the log and `cxlpoolctl doctor`; "" when nothing was found.
  std::string Describe() const;
};

struct JournalState {
  std::map<uint64_t, journal::LeaseRecord> leases;  // live leases by id
  uint64_t next_id = 1;                             // first id never granted
  uint64_t records_replayed = 0;
  uint64_t torn_bytes_dropped = 0;  // tail discarded at open (torn or unreadable)
  std::string boot_id;              // the boot the live records belong to
  // Leases journalled during an earlier boot, dropped at open.
  uint64_t leases_from_earlier_boot = 0;
  std::string earlier_boot_id;  // that boot's id, "" if none was dropped
  JournalDamage damage;
  // Leases of the running boot may be missing from `leases` (the journal
  // was damaged or lost while its boot is this one, or unknown): the daemon
  // must expect reclaims of leases it does not know (docs/daemon.md).
  bool may_have_lost_leases = false;
};

// The id mark file: the id high-water mark kept apart from the journal.
struct IdMark {
  enum class State { kAbsent, kOk, kDamaged };
  State state = State::kAbsent;
  uint64_t next_id = 1;
  std::string boot_id;
};
// Reads `dir`/lease-ids. IO errors other than ENOENT read as kDamaged.
IdMark ReadIdMark(const std::string& dir);
// Writes it atomically (temp file + rename; not fsynced, like the journal).
Status WriteIdMark(const std::string& dir, uint64_t next_id, const std::string& boot_id);

// The running kernel's boot id (/proc/sys/kernel/random/boot_id, trimmed),
// or "" when it cannot be read (then no journal is ever dropped as stale).
std::string CurrentBootId();

class LeaseJournal {
 public:
  // Opens (creating if needed) `dir`/leases.journal and replays it. Leases
  // recorded under another boot id than `boot_id` are dropped (and the file
  // compacted); an empty `boot_id` disables that check.
  // `dir_had_state`: the directory already held daemon state before this
  // start (its lock file existed), so a missing journal has been lost.
  // Errors: IO errors with the path; INVALID_ARGUMENT when the file is not
  // a journal at all (bad magic and no record anywhere in it).
  static Result<LeaseJournal> Open(const std::string& dir);
  static Result<LeaseJournal> Open(const std::string& dir, const std::string& boot_id,
                                   bool dir_had_state = false);

  LeaseJournal(LeaseJournal&&) = default;
  LeaseJournal& operator=(LeaseJournal&&) = default;

  // The state as replayed at Open, then kept current by every append.
  const JournalState& state() const { return state_; }

  Status Put(journal::LeaseRecord lease);
  Status Delete(uint64_t lease_id);
  // Records that ids below `next_id` are taken (journal and id mark). Call
  // before granting them.
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
  // Replays `data` into the state, past damaged stretches; fills damage.
  // False when no record at all was found in a file with a bad magic.
  bool Replay(const std::string& data);
  // Copies the damaged file aside (logged), then rewrites the journal.
  Status SaveAndRewrite(const std::string& data);

  std::string dir_;
  std::string path_;
  UniqueFd fd_;
  JournalState state_;
  uint64_t file_records_ = 0;
};

}  // namespace cxlpool
