// Call, one call's reactor, and Door, the generic service that takes every call and queues its events
// for Python (frontdoor.h says how the two sides meet). Nothing here touches a Python object.

#include "frontdoor.h"  // first: Python.h comes before any system header

#include <sys/eventfd.h>
#include <unistd.h>

namespace mcp_frontdoor {

Door::Door(std::unordered_set<std::string> unary, long max_calls) : unary_(std::move(unary)), max_calls_(max_calls) {
  efd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
}

Door::~Door() {
  if (efd_ >= 0) close(efd_);
}

grpc::ServerGenericBidiReactor* Door::CreateReactor(grpc::GenericCallbackServerContext* ctx) {
  class Refuse final : public grpc::ServerGenericBidiReactor {
   public:
    explicit Refuse(grpc::Status status) { Finish(status); }
    void OnDone() override { delete this; }
  };
  if (stopping_.load()) {
    return new Refuse(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is stopping"));
  }
  long active = active_.fetch_add(1) + 1;
  if (max_calls_ > 0 && active > max_calls_) {
    active_.fetch_sub(1);  // a refusal holds no place: refusals in a burst do not refuse others
    return new Refuse(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "Concurrent RPC limit exceeded!"));
  }
  uint64_t id = next_id_.fetch_add(1) + 1;
  auto* call = new Call(this, ctx, id, unary_.count(ctx->method()) > 0);
  {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.emplace(id, call);
  }
  call->Begin();
  return call;
}

void Door::Post(Event event) {
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    wake = events_.empty();
    events_.push_back(std::move(event));
  }
  if (wake) {
    uint64_t one = 1;
    ssize_t n = write(efd_, &one, sizeof one);
    (void)n;  // EAGAIN only when the counter is full: the reader is already woken
  }
}

std::vector<Event> Door::Take() {
  uint64_t count;
  ssize_t n = read(efd_, &count, sizeof count);
  (void)n;
  std::vector<Event> out;
  std::lock_guard<std::mutex> lock(mu_);
  out.swap(events_);
  return out;
}

Call* Door::Find(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = calls_.find(id);
  return it == calls_.end() ? nullptr : it->second;
}

Call* Door::Remove(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = calls_.find(id);
  if (it == calls_.end()) return nullptr;
  Call* call = it->second;
  calls_.erase(it);
  return call;
}

void Door::AbandonAll() {
  std::vector<Call*> open;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, call] : calls_) open.push_back(call);
    calls_.clear();
  }
  for (Call* call : open) call->End(grpc::Status(grpc::StatusCode::CANCELLED, "the server stopped"), nullptr);
}

void Door::Submit(Op op) {
  {
    std::lock_guard<std::mutex> lock(ops_mu_);
    ops_.push_back(std::move(op));
  }
  ops_cv_.notify_one();
}

void Door::Run(Op& op) {
  if (!op.finish) {
    op.call->Write(std::move(op.data));
    return;
  }
  for (auto& [k, v] : op.trailers) op.call->ctx()->AddTrailingMetadata(k, v);
  op.call->End(std::move(op.status), op.has_data ? &op.data : nullptr);
}

void Door::RunOps() {
  std::vector<Op> batch;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(ops_mu_);
      ops_cv_.wait(lock, [this] { return !ops_.empty() || ops_stop_; });
      if (ops_.empty() && ops_stop_) return;
      batch.swap(ops_);
    }
    for (Op& op : batch) Run(op);
    batch.clear();
  }
}

void Door::StartOps() {
  ops_thread_ = std::thread([this] { RunOps(); });
}

void Door::StopOps() {
  {
    std::lock_guard<std::mutex> lock(ops_mu_);
    ops_stop_ = true;
  }
  ops_cv_.notify_one();
  if (ops_thread_.joinable()) ops_thread_.join();
}

void Call::Begin() {
  if (unary_) {
    StartRead(&in_);
  } else {
    door_->Post(Event{kStart, id_, this, grpc::ByteBuffer(), false});
  }
}

void Call::OnReadDone(bool ok) {
  if (unary_) {
    if (ok && door_->stopping()) {
      if (door_->Remove(id_) != nullptr) Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is stopping"));
    } else if (ok) {
      door_->Post(Event{kStart, id_, this, std::move(in_), true});
      // a cancellation that came before the request: Python ignored it (it did not know the call yet)
      if (cancelled_.load()) door_->Post(Event{kCancel, id_, nullptr, grpc::ByteBuffer(), false});
    } else if (door_->Remove(id_) != nullptr) {  // the client went away before its request arrived
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the call ended before its request arrived"));
    }
    return;
  }
  if (ok) {
    door_->Post(Event{kMessage, id_, nullptr, std::move(in_), true});
  } else {
    door_->Post(Event{kHalfClose, id_, nullptr, grpc::ByteBuffer(), false});
  }
}

void Call::Write(grpc::ByteBuffer buffer) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (broken_ || ended_) return;
    if (busy_) {
      queued_.push_back(std::move(buffer));
      return;
    }
    busy_ = true;
    writing_ = std::move(buffer);
  }
  StartWrite(&writing_);
}

void Call::OnWriteDone(bool ok) {
  bool finish = false, more = false;
  Door* door = door_;
  uint64_t id = id_;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!ok) {
      broken_ = true;
      queued_.clear();
    }
    if (!queued_.empty()) {
      writing_ = std::move(queued_.front());
      queued_.pop_front();
      more = true;
    } else {
      busy_ = false;
      finish = finish_pending_;
    }
  }
  if (ok && !finish) door->Post(Event{kWritten, id, nullptr, grpc::ByteBuffer(), false});
  if (more) {
    StartWrite(&writing_);
  } else if (finish) {
    Finish(status_);  // `this` may be gone after this line
  }
}

void Call::End(grpc::Status status, grpc::ByteBuffer* last) {
  bool write_and_finish = false, finish_now = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (ended_) return;
    ended_ = true;
    status_ = std::move(status);
    if (last != nullptr && status_.ok() && !broken_) {
      if (busy_) {  // after the writes before it; OnWriteDone finishes
        queued_.push_back(std::move(*last));
        finish_pending_ = true;
      } else {  // the common case (a unary answer): one operation for the reply and the status
        last_ = std::move(*last);
        busy_ = true;
        write_and_finish = true;
      }
    } else if (busy_) {
      finish_pending_ = true;
    } else {
      finish_now = true;
    }
  }
  if (write_and_finish) {
    StartWriteAndFinish(&last_, grpc::WriteOptions(), status_);
  } else if (finish_now) {
    Finish(status_);
  }
}

void Call::OnCancel() {
  cancelled_.store(true);
  door_->Post(Event{kCancel, id_, nullptr, grpc::ByteBuffer(), false});
}

void Call::OnDone() {
  door_->Done();
  delete this;
}

}  // namespace mcp_frontdoor
