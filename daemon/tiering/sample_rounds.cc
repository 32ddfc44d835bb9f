#include "tiering/sample_rounds.h"

#include <boost/asio/post.hpp>
#include <utility>

namespace cxlpool::tiering {

SampleRounds::SampleRounds(LeaseTable* table, LeaseBook* book, MigrationLog* log,
                           const Clock* clock, Executor loop, Executor mover, int64_t interval_ns)
    : table_(table),
      book_(book),
      log_(log),
      clock_(clock),
      loop_(std::move(loop)),
      mover_(std::move(mover)),
      interval_ns_(interval_ns) {}

SampleRounds::~SampleRounds() { *alive_ = false; }

void SampleRounds::SetSampler(std::unique_ptr<AccessSampler> sampler) {
  sampler_ = std::shared_ptr<AccessSampler>(std::move(sampler));
}

void SampleRounds::Forget(uint64_t id) {
  if (!sampler_) return;
  auto sampler = sampler_;
  boost::asio::post(mover_, [sampler, id] { sampler->Forget(id); });
}

void SampleRounds::MaybeSample(const std::vector<LeaseFacts>& leases) {
  const int64_t now = clock_->MonotonicNs();
  if (!sampler_ || sampling_ || (last_sample_ns_ != 0 && now - last_sample_ns_ < interval_ns_)) {
    return;
  }
  struct Job {
    std::vector<SampleTarget> targets;
    std::vector<UniqueFd> fds;
  };
  auto job = std::make_shared<Job>();
  for (const LeaseFacts& f : leases) {
    if (!f.not_movable.empty()) continue;
    for (uint32_t i = 0; i < f.units.size(); ++i) {
      auto mem = table_->OpenUnit(f.id, i);
      if (!mem.ok()) continue;
      SampleTarget t;
      t.lease_id = f.id;
      t.unit = i;
      t.fd = mem->fd.get();
      t.offset = mem->file_offset;
      t.length = f.units[i].length;
      t.page_size = f.units[i].page_size;
      job->targets.push_back(t);
      job->fds.push_back(std::move(mem->fd));
    }
  }
  if (job->targets.empty()) return;
  sampling_ = true;
  last_sample_ns_ = now;
  std::weak_ptr<bool> alive = alive_;
  auto sampler = sampler_;
  boost::asio::post(mover_, [this, alive, sampler, job, loop = loop_]() mutable {
    auto results = std::make_shared<std::vector<SampleResult>>(sampler->Sample(job->targets));
    job->fds.clear();
    boost::asio::post(loop, [this, alive, results] {
      if (alive.expired() || !*alive.lock()) return;
      sampling_ = false;
      if (std::optional<uint64_t> pages = book_->Sampled(*results)) {
        log_->Count("sampled_pages", *pages);
      }
    });
  });
}

}  // namespace cxlpool::tiering
