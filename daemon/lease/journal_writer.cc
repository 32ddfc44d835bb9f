#include "lease/journal_writer.h"

#include <algorithm>
#include <string>

#include "cxlpool/common/log.h"

namespace cxlpool {

void JournalWriter::Enable(LeaseStore* store, uint64_t next_id) {
  store_ = store;
  next_id_ = std::max(next_id_, next_id);
  ids_reserved_ = next_id_;
}

uint64_t JournalWriter::NextId() {
  uint64_t id = next_id_++;
  if (store_ != nullptr && id >= ids_reserved_) ReserveFrom(id);
  return id;
}

void JournalWriter::TakeJournalledId(uint64_t id) {
  next_id_ = std::max(next_id_, id + 1);
  ids_reserved_ = std::max(ids_reserved_, next_id_);
}

void JournalWriter::TakeStoredId(uint64_t id) { next_id_ = std::max(next_id_, id + 1); }

void JournalWriter::ReserveTaken() {
  if (store_ != nullptr && next_id_ > ids_reserved_) ReserveFrom(next_id_);
}

void JournalWriter::ReserveFrom(uint64_t id) {
  if (Status st = store_->ReserveIds(id + kIdBatch); st.ok()) {
    ids_reserved_ = id + kIdBatch;
  } else {
    CXLPOOL_LOG(kError) << "reserving lease ids: " << st.ToString();
  }
}

Status JournalWriter::Put(const DurableLease& lease, std::span<const int> fds) {
  if (!writing()) return Status::Ok();
  Status st = store_->Put(lease, fds);
  if (!st.ok()) {
    CXLPOOL_LOG(kError) << "journal lease " << lease.id << ": " << st.ToString();
  }
  return st;
}

void JournalWriter::Delete(uint64_t id) {
  if (!writing()) return;
  Status st = store_->Delete(id);
  if (!st.ok()) {
    CXLPOOL_LOG(kError) << "journal end of lease " << id << ": " << st.ToString();
  }
}

void JournalWriter::ForgetStoredFd(uint64_t id, size_t extents) {
  if (store_ != nullptr) store_->ForgetStoredFd(id, extents);
}

}  // namespace cxlpool
