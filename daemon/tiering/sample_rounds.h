// SampleRounds: CPU-side access samples of the leases, when the kernel offers
// a sampler. At most one sampling round at a time and one per `interval_ns`;
// it runs on the `mover` executor (the sampler's state lives there) and its
// results are added to the LeaseBook on the loop.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cxlpool/common/clock.h"
#include "tiering/lease_book.h"
#include "tiering/lease_table.h"
#include "tiering/migration_log.h"
#include "tiering/sampler.h"

namespace cxlpool::tiering {

class SampleRounds {
 public:
  using Executor = boost::asio::any_io_executor;

  SampleRounds(LeaseTable* table, LeaseBook* book, MigrationLog* log, const Clock* clock,
               Executor loop, Executor mover, int64_t interval_ns);
  ~SampleRounds();
  SampleRounds(const SampleRounds&) = delete;
  SampleRounds& operator=(const SampleRounds&) = delete;

  void SetSampler(std::unique_ptr<AccessSampler> sampler);
  // The sampler's name, "none" without one.
  std::string name() const { return sampler_ ? sampler_->name() : "none"; }
  // Samples the movable units of `leases` when one is due.
  void MaybeSample(const std::vector<LeaseFacts>& leases);
  // The sampler forgets lease `id` (it is gone).
  void Forget(uint64_t id);

 private:
  LeaseTable* table_;
  LeaseBook* book_;
  MigrationLog* log_;
  const Clock* clock_;
  Executor loop_;
  Executor mover_;
  int64_t interval_ns_;
  std::shared_ptr<AccessSampler> sampler_;
  bool sampling_ = false;
  int64_t last_sample_ns_ = 0;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace cxlpool::tiering
