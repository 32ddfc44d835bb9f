// Translation of the tiering messages (docs/protocol.md, "Tiering") between
// the wire's protobuf messages and the tiering engine's types. Decode*
// answer PROTOCOL like translate.h's.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "server/handler.h"
#include "tiering/engine.h"

namespace cxlpool {

// TIERING_SIGNALS: the entries the engine is to judge, and those refused
// here (an unknown hint), by their index in the frame.
struct SignalBatch {
  size_t total = 0;
  std::vector<tiering::TieringEngine::Signal> good;
  std::vector<size_t> index;  // good[i] is entry index[i]
  std::vector<std::pair<size_t, Status>> bad;
};
// INVALID_ARGUMENT when the frame carries more than `max_signals`.
Status DecodeSignals(const Request& req, int max_signals, SignalBatch* out);
// The batch's answer: accepted = total - rejected, each rejection with its
// index, code and message.
Reply EncodeSignalsReply(const SignalBatch& batch);

struct TieringLeaseAsk {
  uint64_t lease_id = 0;
  std::optional<bool> pin_tier;
  std::optional<bool> cooperative_pin;
};
Status DecodeTieringLease(const Request& req, TieringLeaseAsk* out);
Reply EncodeTieringLeaseReply();

struct MigrationReadyAsk {
  uint64_t migration_id = 0;
  bool ready = false;
  std::string reason;
};
Status DecodeMigrationReady(const Request& req, MigrationReadyAsk* out);
Reply EncodeMigrationReadyReply(const tiering::MigrationOutcome& o);

// TIERING_REPORT: whether every tenant's leases are asked for.
Status DecodeReportAll(const Request& req, bool* all);
Reply EncodeReportReply(const tiering::TieringReport& r);

// MIGRATION_EVENTs: "prepare" for an ask, the notice's phase for a notice.
Reply EncodeMigrationEvent(const tiering::MigrationAsk& ask);
Reply EncodeMigrationEvent(const tiering::MigrationNotice& notice);

}  // namespace cxlpool
