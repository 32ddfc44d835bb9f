// The watch thread: one bidirectional Watch stream at a time, reopened on
// the next endpoint from the revision after the last one delivered.
#include <thread>
#include <utility>

#include "cxlpool/common/log.h"
#include "cxlpool/common/thread_annotations.h"
#include "impl.h"

namespace cxlpool::etcd {

namespace {

class PrefixWatch final : public Watch {
 public:
  PrefixWatch(Client::Impl* client, std::string prefix, int64_t start_revision,
              Client::EventHandler on_events, Client::ResyncHandler on_resync)
      : client_(client),
        prefix_(std::move(prefix)),
        next_revision_(start_revision),
        on_events_(std::move(on_events)),
        on_resync_(std::move(on_resync)) {
    thread_ = std::thread([this] { Loop(); });
  }
  ~PrefixWatch() override { Stop(); }

  void Stop() override {
    {
      MutexLock lock(mu_);
      stopping_ = true;
      if (context_ != nullptr) context_->TryCancel();
      wake_.notify_all();
    }
    if (thread_.joinable()) thread_.join();
  }

  int64_t revision() const override { return delivered_.load(); }

 private:
  void Loop() {
    size_t endpoint = client_->current.load();
    while (true) {
      client_->WaitConnected(client_->endpoints[endpoint]);
      grpc::ClientContext context;
      client_->Prepare(context, false);
      {
        MutexLock lock(mu_);
        if (stopping_) return;
        context_ = &context;
      }
      const bool progressed = RunStream(client_->endpoints[endpoint], context);
      MutexLock lock(mu_);
      context_ = nullptr;
      if (stopping_) return;
      endpoint = (endpoint + 1) % client_->endpoints.size();
      // Straight on to the next endpoint after a stream that delivered;
      // a pause after one that could not even start.
      if (!progressed) lock.WaitFor(wake_, std::chrono::milliseconds(200));
    }
  }

  // One stream until it breaks; whether it was created and ended by a
  // broken connection (not a cancel or a compaction, which pause first).
  bool RunStream(Endpoint& ep, grpc::ClientContext& context) {
    auto stream = ep.watch->Watch(&context);
    etcdserverpb::WatchRequest req;
    auto* create = req.mutable_create_request();
    create->set_key(prefix_);
    create->set_range_end(PrefixEnd(prefix_));
    create->set_start_revision(next_revision_);
    if (!stream->Write(req)) return false;
    bool created = false;
    etcdserverpb::WatchResponse resp;
    while (stream->Read(&resp)) {
      if (resp.created()) {
        created = true;
        if (next_revision_ == 0) next_revision_ = resp.header().revision() + 1;
      }
      if (resp.compact_revision() > 0) {
        CXLPOOL_LOG(kWarning) << "etcd watch " << prefix_ << ": compacted past revision "
                              << next_revision_ << ", rereading";
        // After the revision the caller reread at; from now when it says 0.
        const int64_t reread = on_resync_ ? on_resync_() : 0;
        next_revision_ = reread > 0 ? reread + 1 : 0;
        created = false;  // pause before the next stream
        break;
      }
      if (resp.canceled()) {
        created = false;
        break;
      }
      Deliver(resp);
    }
    context.TryCancel();
    grpc::Status s = stream->Finish();
    if (!s.ok() && !stopping()) {
      CXLPOOL_LOG(kDebug) << "etcd watch " << prefix_ << " on " << ep.address << ": "
                          << s.error_message();
    }
    return created;
  }

  void Deliver(const etcdserverpb::WatchResponse& resp) {
    if (resp.events_size() == 0) return;
    std::vector<WatchEvent> events;
    events.reserve(resp.events_size());
    int64_t last = 0;
    for (const auto& e : resp.events()) {
      WatchEvent out;
      out.type =
          e.type() == mvccpb::Event::DELETE ? WatchEvent::Type::kDelete : WatchEvent::Type::kPut;
      out.kv = FromProto(e.kv());
      last = std::max(last, out.kv.mod_revision);
      events.push_back(std::move(out));
    }
    next_revision_ = last + 1;
    delivered_.store(last);
    if (on_events_) on_events_(events, last);
  }

  bool stopping() {
    MutexLock lock(mu_);
    return stopping_;
  }

  Client::Impl* client_;
  const std::string prefix_;
  int64_t next_revision_;  // watch thread only
  std::atomic<int64_t> delivered_{0};
  Client::EventHandler on_events_;
  Client::ResyncHandler on_resync_;
  Mutex mu_;
  std::condition_variable wake_;
  bool stopping_ GUARDED_BY(mu_) = false;
  grpc::ClientContext* context_ GUARDED_BY(mu_) = nullptr;
  std::thread thread_;
};

}  // namespace

std::unique_ptr<Watch> Client::WatchPrefix(const std::string& prefix, int64_t start_revision,
                                           EventHandler on_events, ResyncHandler on_resync) {
  return std::make_unique<PrefixWatch>(impl_.get(), prefix, start_revision, std::move(on_events),
                                       std::move(on_resync));
}

}  // namespace cxlpool::etcd
