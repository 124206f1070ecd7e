// mcp_native._frontdoor's internal header: a gRPC server in C++ (grpc++'s callback API) whose calls are
// answered by Python. Not installed; only the files of this directory include it.
//
// Why: grpc.aio's own per-call cost (about 0.3 ms of CPU) was most of the router's CPU per request. Here
// the HTTP/2 transport, TLS and the calls' state machines run on grpc's C++ threads, which never take the
// GIL; Python sees a batch of events per wake-up and answers with a few calls into this module.
//
// Model: every method is taken by one CallbackGenericService (Door). A call of a method Python named
// "unary" (one request message) is handed over with its request once the request has arrived; any other
// call is handed over at once, and Python asks for each request message with read(). Python answers with
// write() (streamed replies, queued here so that only one write is in flight) and exactly one finish() (a
// unary call's kept until wake(), which sends a loop iteration's answers together). Events reach Python
// through a queue and an eventfd that becomes readable when the queue stops being empty.
//
// The files, one job each:
//   reactor.cc  Call (one call's reactor) and Door (the service: calls, events, the sending thread)
//   convert.cc  Python objects <-> grpc's byte buffers and metadata
//   server.cc   the grpc++ server a Door serves on: address, limits, TLS credentials
//   pytype.cc   the Python type mcp_native._frontdoor.Door and the module
//
// Invariants:
// - No grpc thread touches a Python object; the GIL is held only by the Python-facing functions
//   (pytype.cc, convert.cc).
// - A call is in `calls_` from its creation until Python finishes it; a call Python never saw (its
//   unary request never arrived) is finished here. OnDone comes only after Finish, so a call found in
//   `calls_` is alive, and only the Python thread finishes a call Python has seen.
// - No lock is held while a grpc operation starts (a reaction may run inline).
// - Calls over `max_calls` are refused RESOURCE_EXHAUSTED before Python sees them.
// - Everything here is hidden (build.sh, frontdoor.map): the module exports PyInit__frontdoor alone, so
//   this grpc++ and the grpcio wheel's grpc core in the same process never bind to each other.

#ifndef MCP_FRONTDOOR_H_
#define MCP_FRONTDOOR_H_

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>

namespace mcp_frontdoor {

enum Kind : int { kStart = 0, kMessage = 1, kHalfClose = 2, kCancel = 3, kWritten = 4, kRelease = 5 };

class Door;

// One call: grpc's reactor for it, and the writes Python asked for, in order.
class Call final : public grpc::ServerGenericBidiReactor {
 public:
  Call(Door* door, grpc::GenericCallbackServerContext* ctx, uint64_t id, bool unary)
      : door_(door), ctx_(ctx), id_(id), unary_(unary) {}

  void Begin();
  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

  // Python's side (never after End).
  void Read() { StartRead(&in_); }
  void Write(grpc::ByteBuffer buffer);
  void End(grpc::Status status, grpc::ByteBuffer* last);

  grpc::GenericCallbackServerContext* ctx() const { return ctx_; }
  uint64_t id() const { return id_; }

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

// A reply part sent from a Python object's memory: the buffer export grpc holds until it lets go.
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

// A write or a finish Python asked for, carried out off the Python thread (or at wake()).
struct Op {
  Call* call;
  bool finish;
  grpc::ByteBuffer data;
  bool has_data;
  grpc::Status status;
  std::vector<std::pair<std::string, std::string>> trailers;
};

class Door final : public grpc::CallbackGenericService {
 public:
  Door(std::unordered_set<std::string> unary, long max_calls);
  ~Door() override;

  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override;

  // Events for Python; Post from any thread, Take on the Python thread.
  void Post(Event event);
  std::vector<Event> Take();

  // A call Python may still act on, or null.
  Call* Find(uint64_t id);
  // Removes the call (Python will not see it again) and returns it, or null.
  Call* Remove(uint64_t id);

  void Done() { active_.fetch_sub(1); }

  // Python takes no more calls: new ones are refused, and a unary call whose request arrives now is
  // finished here (AbandonAll ends the ones Python was handed but did not finish).
  void SetStopping() { stopping_.store(true); }
  bool stopping() const { return stopping_.load(); }

  // Ends every call Python still holds (CANCELLED): when Python will answer none of them any more.
  void AbandonAll();

  // A stream's writes and finish run on one thread of their own, in order (Submit): a grpc operation
  // started on the Python thread runs the transport's work there (framing, the send), with the GIL held.
  // A unary call has nothing to keep in order: its finish waits in `later_` (Later) for wake(), which
  // carries out a loop iteration's finishes on the Python thread with the GIL released (no thread to
  // wake). Only the thread holding the GIL touches `later_`.
  void Submit(Op op);
  void Later(Op op) { later_.push_back(std::move(op)); }
  std::vector<Op> TakeLater() {
    std::vector<Op> batch;
    batch.swap(later_);
    return batch;
  }
  void Run(Op& op);
  void StartOps();
  void StopOps();

  int fd() const { return efd_; }

  std::unique_ptr<grpc::Server> server;

 private:
  void RunOps();

  std::unordered_set<std::string> unary_;
  long max_calls_;
  int efd_ = -1;
  std::atomic<long> active_{0};
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

// ---- convert.cc (GIL held) ----

// A message as bytes; null with a Python error set.
PyObject* Bytes(const grpc::ByteBuffer& buffer);
// One reply: a bytes-like object, or a list or tuple of them sent one after another; false with a
// Python error set. Large read-only parts are sent from their own memory (held: Release).
bool Buffer(Door* door, PyObject* data, grpc::ByteBuffer* out);
// Lets go of a reply part grpc no longer holds.
void Release(Held* held);
// "" when every (key, value) is one grpc accepts, else what is wrong with the first that is not.
std::string BadMetadata(const std::vector<std::pair<std::string, std::string>>& pairs);
// A call's request metadata as grpc.aio gives it: ((key, value), ...), a "-bin" value as bytes.
PyObject* Metadata(const std::multimap<grpc::string_ref, grpc::string_ref>& md);
// A TLS session's properties: {name: [bytes, ...]}.
PyObject* Auth(const grpc::AuthContext* auth);

// ---- server.cc ----

struct ServerSettings {
  const char* address;
  long max_receive;
  long max_send;
  bool reuse_port;
  const char* cert_chain;  // null: no TLS
  const char* private_key;
  const char* root_certs;  // null: clients are not asked for a certificate
  bool require_client_cert;
};

// Builds and starts the server `door` serves on (call with the GIL released); null when the address
// could not be bound. `port` is the bound port.
std::unique_ptr<grpc::Server> Serve(Door* door, const ServerSettings& settings, int* port);

}  // namespace mcp_frontdoor

#endif  // MCP_FRONTDOOR_H_
