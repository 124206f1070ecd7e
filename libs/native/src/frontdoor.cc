// mcp_native._frontdoor: a gRPC server in C++ (grpc++'s callback API) whose calls are answered by Python.
//
// Why: grpc.aio's own per-call cost (about 0.3 ms of CPU) was most of the router's CPU per request. Here
// the HTTP/2 transport, TLS and the calls' state machines run on grpc's C++ threads, which never take the
// GIL; Python sees a batch of events per wake-up and answers with a few calls into this module.
//
// Model: every method is taken by one CallbackGenericService. A call of a method Python named "unary"
// (one request message) is handed over with its request once the request has arrived; any other call is
// handed over at once, and Python asks for each request message with read(). Python answers with write()
// (streamed replies, queued here so that only one write is in flight) and exactly one finish() (a unary
// call's kept until wake(), which sends a loop iteration's answers together). Events
// reach Python through a queue and an eventfd that becomes readable when the queue stops being empty.
//
// Invariants:
// - No grpc thread touches a Python object; the GIL is held only by the Python-facing functions below.
// - A call is in `calls_` from its creation until Python finishes it; a call Python never saw (its
//   unary request never arrived) is finished here. OnDone comes only after Finish, so a call found in
//   `calls_` is alive, and only the Python thread finishes a call Python has seen.
// - No lock is held while a grpc operation starts (a reaction may run inline).
// - Calls over `max_calls` are refused RESOURCE_EXHAUSTED before Python sees them.

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <thread>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/security/server_credentials.h>

namespace {

enum Kind : int { kStart = 0, kMessage = 1, kHalfClose = 2, kCancel = 3, kWritten = 4, kRelease = 5 };

// A read-only reply part this large is sent from the Python object's own memory (held until grpc lets
// go of it; the release happens on the Python thread, through the event queue); a smaller one, or one
// its owner may still write to, is copied.
constexpr Py_ssize_t kZeroCopyFrom = 64 << 10;

class Door;

class Call final : public grpc::ServerGenericBidiReactor {
 public:
  Call(Door* door, grpc::GenericCallbackServerContext* ctx, uint64_t id, bool unary)
      : door_(door), ctx_(ctx), id_(id), unary_(unary) {}

  void Begin();
  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

  // Python's side (GIL held; never after End).
  void Read() { StartRead(&in_); }
  void Write(grpc::ByteBuffer buffer);
  void End(grpc::Status status, grpc::ByteBuffer* last);

  grpc::GenericCallbackServerContext* ctx() const { return ctx_; }
  uint64_t id() const { return id_; }
  grpc::ByteBuffer TakeMessage() { return std::move(in_); }

 private:
  Door* door_;
  grpc::GenericCallbackServerContext* ctx_;
  uint64_t id_;
  bool unary_;
  grpc::ByteBuffer in_;
  std::mutex mu_;  // the writes below
  std::deque<grpc::ByteBuffer> queued_;
  grpc::ByteBuffer writing_;
  bool busy_ = false;
  bool broken_ = false;
  bool ended_ = false;  // End was called: no write may start after it
  std::atomic<bool> cancelled_{false};
  bool finish_pending_ = false;
  grpc::Status status_;
  grpc::ByteBuffer last_;
};

struct Held {
  Door* door;
  Py_buffer view;
};

struct Event {
  int kind;
  uint64_t id;
  Call* call;  // kStart only
  grpc::ByteBuffer message;  // kStart of a unary call, kMessage
  bool has_message;
  Held* held = nullptr;  // kRelease only
};

class Door final : public grpc::CallbackGenericService {
 public:
  Door(std::unordered_set<std::string> unary, long max_calls)
      : unary_(std::move(unary)), max_calls_(max_calls) {
    efd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  }
  ~Door() override {
    if (efd_ >= 0) close(efd_);
  }

  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override {
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
      refused_.fetch_add(1);
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

  void Post(Event event) {
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

  std::vector<Event> Take() {
    uint64_t count;
    ssize_t n = read(efd_, &count, sizeof count);
    (void)n;
    std::vector<Event> out;
    std::lock_guard<std::mutex> lock(mu_);
    out.swap(events_);
    return out;
  }

  // A call Python may still act on, or null.
  Call* Find(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = calls_.find(id);
    return it == calls_.end() ? nullptr : it->second;
  }

  // Removes the call (Python will not see it again) and returns it, or null.
  Call* Remove(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = calls_.find(id);
    if (it == calls_.end()) return nullptr;
    Call* call = it->second;
    calls_.erase(it);
    return call;
  }

  void Done() { active_.fetch_sub(1); }

  // Python takes no more calls: new ones are refused, and a unary call whose request arrives now is
  // finished here (AbandonAll ends the ones Python was handed but did not finish).
  void SetStopping() { stopping_.store(true); }
  bool stopping() const { return stopping_.load(); }

  // Ends every call Python still holds (CANCELLED): when Python will answer none of them any more.
  void AbandonAll() {
    std::vector<Call*> open;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [id, call] : calls_) open.push_back(call);
      calls_.clear();
    }
    for (Call* call : open) call->End(grpc::Status(grpc::StatusCode::CANCELLED, "the server stopped"), nullptr);
  }

  // A stream's writes and finish run here, in order, on one thread of their own: a grpc operation
  // started on the Python thread runs the transport's work there (framing, the send), with the GIL held.
  // A unary call has nothing to keep in order: its finish waits in `later_` for wake(), which carries out
  // a loop iteration's finishes on the Python thread with the GIL released (no thread to wake).
  struct Op {
    Call* call;
    bool finish;
    grpc::ByteBuffer data;
    bool has_data;
    grpc::Status status;
    std::vector<std::pair<std::string, std::string>> trailers;
  };

  void Submit(Op op) {
    {
      std::lock_guard<std::mutex> lock(ops_mu_);
      ops_.push_back(std::move(op));
    }
    ops_cv_.notify_one();
  }

  // A unary call's finish, kept until wake() (only the thread holding the GIL touches `later_`).
  void Later(Op op) { later_.push_back(std::move(op)); }

  // The finishes kept since the last call (with the GIL held).
  std::vector<Op> TakeLater() {
    std::vector<Op> batch;
    batch.swap(later_);
    return batch;
  }

  void Run(Op& op) {
    if (!op.finish) {
      op.call->Write(std::move(op.data));
      return;
    }
    for (auto& [k, v] : op.trailers) op.call->ctx()->AddTrailingMetadata(k, v);
    op.call->End(std::move(op.status), op.has_data ? &op.data : nullptr);
  }

  void RunOps() {
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

  void StartOps() { ops_thread_ = std::thread([this] { RunOps(); }); }

  void StopOps() {
    {
      std::lock_guard<std::mutex> lock(ops_mu_);
      ops_stop_ = true;
    }
    ops_cv_.notify_one();
    if (ops_thread_.joinable()) ops_thread_.join();
  }

  int fd() const { return efd_; }
  long active() const { return active_.load(); }
  long refused() const { return refused_.load(); }

  std::unique_ptr<grpc::Server> server;

 private:
  std::unordered_set<std::string> unary_;
  long max_calls_;
  int efd_ = -1;
  std::atomic<long> active_{0};
  std::atomic<long> refused_{0};
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> next_id_{0};
  std::mutex mu_;
  std::vector<Event> events_;
  std::unordered_map<uint64_t, Call*> calls_;
  std::mutex ops_mu_;
  std::condition_variable ops_cv_;
  std::vector<Op> ops_;
  bool ops_stop_ = false;
  std::vector<Op> later_;
  std::thread ops_thread_;
};

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

// ---- Python ----------------------------------------------------------------------------------------

struct DoorObject {
  PyObject_HEAD
  Door* door;
  int port;
};

PyObject* Bytes(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Valid()) return PyBytes_FromStringAndSize("", 0);
  grpc::Status st = buffer.Dump(&slices);
  if (!st.ok()) {
    PyErr_SetString(PyExc_RuntimeError, st.error_message().c_str());
    return nullptr;
  }
  Py_ssize_t size = 0;
  for (auto& s : slices) size += static_cast<Py_ssize_t>(s.size());
  if (slices.size() == 1) {
    return PyBytes_FromStringAndSize(reinterpret_cast<const char*>(slices[0].begin()), size);
  }
  PyObject* out = PyBytes_FromStringAndSize(nullptr, size);
  if (out == nullptr) return nullptr;
  char* at = PyBytes_AS_STRING(out);
  for (auto& s : slices) {
    std::memcpy(at, s.begin(), s.size());
    at += s.size();
  }
  return out;
}

void ReleaseHeld(void* p) {
  auto* held = static_cast<Held*>(p);
  held->door->Post(Event{kRelease, 0, nullptr, grpc::ByteBuffer(), false, held});
}

// One reply: a bytes-like object, or a list or tuple of them sent one after another.
bool Buffer(Door* door, PyObject* data, grpc::ByteBuffer* out) {
  std::vector<grpc::Slice> slices;
  std::string small;  // adjacent small parts, copied into one slice
  auto flush = [&] {
    if (!small.empty()) {
      slices.emplace_back(small.data(), small.size());
      small.clear();
    }
  };
  auto add = [&](PyObject* part) {
    Py_buffer view;
    if (PyObject_GetBuffer(part, &view, PyBUF_SIMPLE) != 0) return false;
    if (view.len < kZeroCopyFrom || !view.readonly) {  // a writable buffer may change before it is sent
      small.append(static_cast<const char*>(view.buf), static_cast<size_t>(view.len));
      PyBuffer_Release(&view);
      return true;
    }
    flush();
    auto* held = new Held{door, view};
    slices.emplace_back(view.buf, static_cast<size_t>(view.len), &ReleaseHeld, held);
    return true;
  };
  if (PyList_Check(data) || PyTuple_Check(data)) {
    PyObject* seq = PySequence_Fast(data, "a reply is a bytes-like object or a sequence of them");
    if (seq == nullptr) return false;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); ++i) {
      if (!add(PySequence_Fast_GET_ITEM(seq, i))) {
        Py_DECREF(seq);
        return false;  // the slices made so far release what they hold
      }
    }
    Py_DECREF(seq);
  } else if (!add(data)) {
    return false;
  }
  flush();
  grpc::ByteBuffer buffer(slices.data(), slices.size());
  out->Swap(&buffer);
  return true;
}

// "" when every (key, value) is one grpc accepts, else what is wrong with the first that is not.
std::string BadMetadata(const std::vector<std::pair<std::string, std::string>>& pairs) {
  for (const auto& [key, value] : pairs) {
    if (key.empty() || key.rfind("grpc-", 0) == 0 || key[0] == ':') return "key \"" + key + "\" is reserved or empty";
    for (unsigned char c : key) {
      if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.')) {
        return "key \"" + key + "\" has a character other than a-z 0-9 - _ .";
      }
    }
    bool binary = key.size() > 4 && key.compare(key.size() - 4, 4, "-bin") == 0;
    if (binary) continue;
    for (unsigned char c : value) {
      if (c < 0x20 || c > 0x7e) return "the value of \"" + key + "\" is not printable ASCII";
    }
  }
  return "";
}

double Remaining(grpc::GenericCallbackServerContext* ctx) {
  auto deadline = ctx->deadline();
  if (deadline >= std::chrono::system_clock::time_point::max() - std::chrono::hours(24 * 365)) return -1.0;
  std::chrono::duration<double> left = deadline - std::chrono::system_clock::now();
  return left.count() > 0 ? left.count() : 0.0;
}

void Door_dealloc(DoorObject* self) {
  if (self->door != nullptr) {
    Door* door = self->door;
    self->door = nullptr;
    std::vector<Door::Op> later = door->TakeLater();
    Py_BEGIN_ALLOW_THREADS;
    for (Door::Op& op : later) door->Run(op);  // the finishes kept for later, and
    door->StopOps();  // what Python asked for first: no operation waits there for a call ended below
    door->SetStopping();
    if (door->server) {
      door->AbandonAll();
      door->server->Shutdown(std::chrono::system_clock::now());
      door->server->Wait();
    }
    Py_END_ALLOW_THREADS;
    door->server.reset();
    for (Event& e : door->Take()) {  // the reply parts grpc let go of last
      if (e.kind == kRelease) {
        PyBuffer_Release(&e.held->view);
        delete e.held;
      }
    }
    delete door;
  }
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

// Door(address, unary_methods, *, max_calls=0, max_receive=4 MiB, max_send=4 MiB, reuse_port=False,
//      cert_chain=None, private_key=None, root_certs=None, require_client_cert=False)
int Door_init(DoorObject* self, PyObject* args, PyObject* kwargs) {
  static const char* names[] = {"address",     "unary",       "max_calls",  "max_receive",
                                "max_send",    "reuse_port",  "cert_chain", "private_key",
                                "root_certs",  "require_client_cert", nullptr};
  const char* address;
  PyObject* unary;
  long max_calls = 0, max_receive = 4 << 20, max_send = 4 << 20;
  int reuse_port = 0, require_client = 0;
  const char *cert = nullptr, *key = nullptr, *roots = nullptr;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "sO|lllpzzzp", const_cast<char**>(names), &address, &unary,
                                   &max_calls, &max_receive, &max_send, &reuse_port, &cert, &key, &roots,
                                   &require_client)) {
    return -1;
  }
  std::unordered_set<std::string> methods;
  PyObject* it = PyObject_GetIter(unary);
  if (it == nullptr) return -1;
  for (PyObject* item; (item = PyIter_Next(it)) != nullptr;) {
    const char* s = PyUnicode_AsUTF8(item);
    if (s == nullptr) {
      Py_DECREF(item);
      Py_DECREF(it);
      return -1;
    }
    methods.emplace(s);
    Py_DECREF(item);
  }
  Py_DECREF(it);
  if (PyErr_Occurred()) return -1;

  std::shared_ptr<grpc::ServerCredentials> creds;
  if (cert != nullptr && key != nullptr) {
    grpc::SslServerCredentialsOptions options(
        roots == nullptr ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
        : require_client ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                         : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
    if (roots != nullptr) options.pem_root_certs = roots;
    options.pem_key_cert_pairs.push_back({key, cert});
    creds = grpc::SslServerCredentials(options);
  } else {
    creds = grpc::InsecureServerCredentials();
  }
  auto door = std::make_unique<Door>(std::move(methods), max_calls);
  if (door->fd() < 0) {
    PyErr_SetFromErrno(PyExc_OSError);
    return -1;
  }
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(address, creds, &port);
  builder.SetMaxReceiveMessageSize(static_cast<int>(max_receive));
  builder.SetMaxSendMessageSize(static_cast<int>(max_send));
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, reuse_port ? 1 : 0);
  builder.RegisterCallbackGenericService(door.get());
  std::unique_ptr<grpc::Server> server;
  Py_BEGIN_ALLOW_THREADS;
  server = builder.BuildAndStart();
  Py_END_ALLOW_THREADS;
  if (!server || port == 0) {
    if (server) server->Shutdown();
    PyErr_Format(PyExc_OSError, "Failed to bind gRPC port %s: in use by another process, or not an address of this host", address);
    return -1;
  }
  door->server = std::move(server);
  door->StartOps();
  self->door = door.release();
  self->port = port;
  return 0;
}

Door* Open(DoorObject* self) {
  if (self->door == nullptr) PyErr_SetString(PyExc_RuntimeError, "the front door is closed");
  return self->door;
}

// take() -> list of events:
//   (0, id, method, message or None, seconds left or None, peer)  a call began
//   (1, id, message)  (2, id) end of requests  (3, id) cancelled  (4, id) a write went out
PyObject* Door_take(DoorObject* self, PyObject*) {
  Door* door = Open(self);
  if (door == nullptr) return nullptr;
  std::vector<Event> events = door->Take();
  PyObject* out = PyList_New(0);
  if (out == nullptr) return nullptr;
  for (size_t i = 0; i < events.size(); ++i) {
    Event& e = events[i];
    PyObject* item = nullptr;
    if (e.kind == kRelease) {
      PyBuffer_Release(&e.held->view);
      delete e.held;
      continue;
    }
    if (e.kind == kStart) {
      auto* ctx = e.call->ctx();
      PyObject* message = e.has_message ? Bytes(e.message) : (Py_INCREF(Py_None), Py_None);
      if (message == nullptr) {
        Py_DECREF(out);
        return nullptr;
      }
      double left = Remaining(ctx);
      PyObject* remaining = left < 0 ? (Py_INCREF(Py_None), Py_None) : PyFloat_FromDouble(left);
      const std::string peer = ctx->peer();
      // any bytes decode (a method that is not UTF-8 matches no handler: UNIMPLEMENTED)
      PyObject* method = PyUnicode_DecodeUTF8(ctx->method().data(), static_cast<Py_ssize_t>(ctx->method().size()),
                                              "surrogateescape");
      PyObject* who = PyUnicode_DecodeUTF8(peer.data(), static_cast<Py_ssize_t>(peer.size()), "surrogateescape");
      if (method == nullptr || who == nullptr) {
        Py_XDECREF(method);
        Py_XDECREF(who);
        Py_DECREF(message);
        Py_DECREF(remaining);
        Py_DECREF(out);
        return nullptr;
      }
      item = Py_BuildValue("(iKNNNN)", e.kind, static_cast<unsigned long long>(e.id), method, message, remaining,
                           who);
    } else if (e.kind == kMessage) {
      PyObject* message = Bytes(e.message);
      if (message == nullptr) {
        Py_DECREF(out);
        return nullptr;
      }
      item = Py_BuildValue("(iKN)", e.kind, static_cast<unsigned long long>(e.id), message);
    } else {
      item = Py_BuildValue("(iK)", e.kind, static_cast<unsigned long long>(e.id));
    }
    if (item == nullptr || PyList_Append(out, item) != 0) {
      Py_XDECREF(item);
      Py_DECREF(out);
      return nullptr;  // the events after this one are lost: their calls end at the deadline or shutdown
    }
    Py_DECREF(item);
  }
  return out;
}

// The call with id `arg` (null when it is gone); false with a Python error set when the Door is closed or
// `arg` is not an id.
bool Lookup(DoorObject* self, PyObject* arg, Call** call) {
  Door* door = Open(self);
  if (door == nullptr) return false;
  *call = door->Find(PyLong_AsUnsignedLongLong(arg));
  return !PyErr_Occurred();
}

// metadata(id) -> tuple of (key, value) (value: bytes for a "-bin" key, else str); () for a gone call
PyObject* Door_metadata(DoorObject* self, PyObject* arg) {
  Call* call = nullptr;
  if (!Lookup(self, arg, &call)) return nullptr;
  if (call == nullptr) return PyTuple_New(0);
  const auto& md = call->ctx()->client_metadata();
  PyObject* out = PyTuple_New(static_cast<Py_ssize_t>(md.size()));
  if (out == nullptr) return nullptr;
  Py_ssize_t i = 0;
  for (const auto& [key, value] : md) {
    bool binary = key.size() > 4 && std::memcmp(key.data() + key.size() - 4, "-bin", 4) == 0;
    PyObject* k = PyUnicode_DecodeUTF8(key.data(), static_cast<Py_ssize_t>(key.size()), "surrogateescape");
    PyObject* v = binary ? nullptr : PyUnicode_DecodeUTF8(value.data(), static_cast<Py_ssize_t>(value.size()), "strict");
    if (v == nullptr) {
      PyErr_Clear();  // binary, or a value that is not UTF-8: as bytes
      v = PyBytes_FromStringAndSize(value.data(), static_cast<Py_ssize_t>(value.size()));
    }
    PyObject* item = (k != nullptr && v != nullptr) ? PyTuple_Pack(2, k, v) : nullptr;
    Py_XDECREF(k);
    Py_XDECREF(v);
    if (item == nullptr) {
      Py_DECREF(out);
      return nullptr;
    }
    PyTuple_SET_ITEM(out, i++, item);
  }
  return out;
}

// auth(id) -> {property name: [bytes, ...]} of the call's TLS session ({} without TLS or for a gone call)
PyObject* Door_auth(DoorObject* self, PyObject* arg) {
  Call* call = nullptr;
  if (!Lookup(self, arg, &call)) return nullptr;
  PyObject* out = PyDict_New();
  if (out == nullptr || call == nullptr) return out;
  auto auth = call->ctx()->auth_context();
  if (!auth) return out;
  for (auto it = auth->begin(); it != auth->end(); ++it) {
    const auto& prop = *it;
    PyObject* key = PyUnicode_FromStringAndSize(prop.first.data(), static_cast<Py_ssize_t>(prop.first.size()));
    PyObject* value = PyBytes_FromStringAndSize(prop.second.data(), static_cast<Py_ssize_t>(prop.second.size()));
    if (key == nullptr || value == nullptr) {
      Py_XDECREF(key);
      Py_XDECREF(value);
      Py_DECREF(out);
      return nullptr;
    }
    PyObject* list = PyDict_GetItemWithError(out, key);
    if (list == nullptr) {
      if (PyErr_Occurred() || (list = PyList_New(0)) == nullptr || PyDict_SetItem(out, key, list) != 0) {
        Py_XDECREF(list);
        Py_DECREF(key);
        Py_DECREF(value);
        Py_DECREF(out);
        return nullptr;
      }
      Py_DECREF(list);  // the dict holds it
    }
    int rc = PyList_Append(list, value);
    Py_DECREF(key);
    Py_DECREF(value);
    if (rc != 0) {
      Py_DECREF(out);
      return nullptr;
    }
  }
  return out;
}

// read(id): ask for the call's next request message (a streaming call); a later (1, id, message) or (2, id)
PyObject* Door_read(DoorObject* self, PyObject* arg) {
  Call* call = nullptr;
  if (!Lookup(self, arg, &call)) return nullptr;
  if (call != nullptr) call->Read();
  Py_RETURN_NONE;
}

// write(id, data): send one reply message (streaming); a later (4, id) says it went out
PyObject* Door_write(DoorObject* self, PyObject* args) {
  unsigned long long id;
  PyObject* data;
  if (!PyArg_ParseTuple(args, "KO", &id, &data)) return nullptr;
  Door* door = Open(self);
  if (door == nullptr) return nullptr;
  grpc::ByteBuffer buffer;
  if (!Buffer(door, data, &buffer)) return nullptr;
  Call* call = door->Find(id);
  if (call == nullptr) Py_RETURN_FALSE;
  door->Submit(Door::Op{call, false, std::move(buffer), true, grpc::Status(), {}});
  Py_RETURN_TRUE;
}

// finish(id, code, details, reply=None, trailers=(), later=False): the call's status, after its last reply
// (if any); `later` (a unary call only: a stream's writes may still wait on the sending thread): it goes
// out at the next wake() rather than now. Returns False when the call is already gone.
PyObject* Door_finish(DoorObject* self, PyObject* args) {
  unsigned long long id;
  int code;
  const char* details;
  Py_ssize_t details_len;
  PyObject* reply = Py_None;
  PyObject* trailers = nullptr;
  int later = 0;
  if (!PyArg_ParseTuple(args, "Kis#|OOp", &id, &code, &details, &details_len, &reply, &trailers, &later)) {
    return nullptr;
  }
  Door* door = Open(self);
  if (door == nullptr) return nullptr;
  grpc::ByteBuffer buffer;
  bool has_reply = reply != Py_None;
  if (has_reply && !Buffer(door, reply, &buffer)) return nullptr;
  std::vector<std::pair<std::string, std::string>> pairs;
  if (trailers != nullptr && trailers != Py_None) {
    PyObject* seq = PySequence_Fast(trailers, "trailers must be a sequence of (key, value)");
    if (seq == nullptr) return nullptr;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); ++i) {
      PyObject* pair = PySequence_Fast_GET_ITEM(seq, i);
      const char *k, *v;
      Py_ssize_t kl, vl;
      if (!PyArg_ParseTuple(pair, "s#s#", &k, &kl, &v, &vl)) {
        PyErr_Clear();
        if (!PyArg_ParseTuple(pair, "s#y#", &k, &kl, &v, &vl)) {
          Py_DECREF(seq);
          return nullptr;
        }
      }
      pairs.emplace_back(std::string(k, kl), std::string(v, vl));
    }
    Py_DECREF(seq);
  }
  std::string bad = BadMetadata(pairs);
  if (!bad.empty()) {  // grpc aborts the process on one; grpc.aio answers INTERNAL
    std::string why = "Invalid trailing metadata: " + bad;
    Call* call = door->Remove(id);
    if (call == nullptr) Py_RETURN_FALSE;
    door->Submit(Door::Op{call, true, grpc::ByteBuffer(), false, grpc::Status(grpc::StatusCode::INTERNAL, why), {}});
    Py_RETURN_TRUE;
  }
  Call* call = door->Remove(id);
  if (call == nullptr) Py_RETURN_FALSE;
  grpc::Status status(static_cast<grpc::StatusCode>(code), std::string(details, details_len));
  Door::Op op{call, true, std::move(buffer), has_reply, std::move(status), std::move(pairs)};
  if (later) {
    door->Later(std::move(op));
  } else {
    door->Submit(std::move(op));
  }
  Py_RETURN_TRUE;
}

// wake(): carry out what finish(..., later=True) kept, on this thread with the GIL released (a unary
// call's, so nothing else waits to go before it)
PyObject* Door_wake(DoorObject* self, PyObject*) {
  Door* door = Open(self);
  if (door == nullptr) return nullptr;
  std::vector<Door::Op> batch = door->TakeLater();
  if (batch.empty()) Py_RETURN_NONE;
  Py_BEGIN_ALLOW_THREADS;
  for (Door::Op& op : batch) door->Run(op);
  Py_END_ALLOW_THREADS;
  Py_RETURN_NONE;
}

// shutdown(grace_s): refuse new calls, give open ones grace_s, then cancel them; blocks (run it off the loop)
PyObject* Door_shutdown(DoorObject* self, PyObject* arg) {
  double grace = PyFloat_AsDouble(arg);
  if (PyErr_Occurred()) return nullptr;
  Door* door = Open(self);
  if (door == nullptr) return nullptr;
  Py_BEGIN_ALLOW_THREADS;
  auto deadline = std::chrono::system_clock::now() +
                  std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::duration<double>(grace));
  door->server->Shutdown(deadline);
  door->server->Wait();
  Py_END_ALLOW_THREADS;
  Py_RETURN_NONE;
}

PyObject* Door_fileno(DoorObject* self, PyObject*) {
  Door* door = Open(self);
  if (door == nullptr) return nullptr;
  return PyLong_FromLong(door->fd());
}

PyObject* Door_stats(DoorObject* self, PyObject*) {
  Door* door = Open(self);
  if (door == nullptr) return nullptr;
  return Py_BuildValue("{s:l,s:l}", "active", door->active(), "refused", door->refused());
}

PyMethodDef Door_methods[] = {
    {"take", reinterpret_cast<PyCFunction>(Door_take), METH_NOARGS, "the events since the last take()"},
    {"metadata", reinterpret_cast<PyCFunction>(Door_metadata), METH_O, "a call's request metadata"},
    {"auth", reinterpret_cast<PyCFunction>(Door_auth), METH_O, "a call's TLS auth context"},
    {"read", reinterpret_cast<PyCFunction>(Door_read), METH_O, "ask for a call's next request"},
    {"write", reinterpret_cast<PyCFunction>(Door_write), METH_VARARGS, "send one reply message"},
    {"finish", reinterpret_cast<PyCFunction>(Door_finish), METH_VARARGS, "end a call"},
    {"wake", reinterpret_cast<PyCFunction>(Door_wake), METH_NOARGS, "send the finishes queued for later"},
    {"shutdown", reinterpret_cast<PyCFunction>(Door_shutdown), METH_O, "stop, giving calls a grace period"},
    {"fileno", reinterpret_cast<PyCFunction>(Door_fileno), METH_NOARGS, "readable when events wait"},
    {"stats", reinterpret_cast<PyCFunction>(Door_stats), METH_NOARGS, "open and refused calls"},
    {nullptr, nullptr, 0, nullptr},
};

PyMemberDef Door_members[] = {
    {"port", T_INT, offsetof(DoorObject, port), READONLY, "the bound port"},
    {nullptr, 0, 0, 0, nullptr},
};

PyTypeObject DoorType = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_frontdoor", "grpc++ server answered from Python", -1};

}  // namespace

PyMODINIT_FUNC PyInit__frontdoor(void) {
  DoorType.tp_name = "mcp_native._frontdoor.Door";
  DoorType.tp_basicsize = sizeof(DoorObject);
  DoorType.tp_flags = Py_TPFLAGS_DEFAULT;
  DoorType.tp_new = PyType_GenericNew;
  DoorType.tp_init = reinterpret_cast<initproc>(Door_init);
  DoorType.tp_dealloc = reinterpret_cast<destructor>(Door_dealloc);
  DoorType.tp_methods = Door_methods;
  DoorType.tp_members = Door_members;
  if (PyType_Ready(&DoorType) < 0) return nullptr;
  PyObject* m = PyModule_Create(&module);
  if (m == nullptr) return nullptr;
  Py_INCREF(&DoorType);
  if (PyModule_AddObject(m, "Door", reinterpret_cast<PyObject*>(&DoorType)) < 0) {
    Py_DECREF(&DoorType);
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
