// The Python type mcp_native._frontdoor.Door: a grpc++ server whose calls Python answers
// (mcp_native.grpc_server drives it). Every function here runs on the Python thread with the GIL held,
// and releases it around anything that may wait on grpc.

#include "frontdoor.h"  // first: Python.h comes before any system header

#include <structmember.h>

#include <chrono>

namespace mcp_frontdoor {
namespace {

// The version of take()'s events and the methods below; mcp_native.grpc_server names the one it speaks.
constexpr long kInterface = 2;

struct DoorObject {
  PyObject_HEAD
  Door* door;
  int port;
};

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
    std::vector<Op> later = door->TakeLater();
    Py_BEGIN_ALLOW_THREADS;
    for (Op& op : later) door->Run(op);  // the finishes kept for later, and
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
      if (e.kind == kRelease) Release(e.held);
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

  auto door = std::make_unique<Door>(std::move(methods), max_calls);
  if (door->fd() < 0) {
    PyErr_SetFromErrno(PyExc_OSError);
    return -1;
  }
  ServerSettings settings{address, max_receive, max_send, reuse_port != 0, cert, key, roots, require_client != 0};
  int port = 0;
  std::unique_ptr<grpc::Server> server;
  Py_BEGIN_ALLOW_THREADS;
  server = Serve(door.get(), settings, &port);
  Py_END_ALLOW_THREADS;
  if (!server) {
    PyErr_Format(PyExc_OSError,
                 "Failed to bind gRPC port %s: in use by another process, or not an address of this host", address);
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
//   (0, id, method, message or None, seconds left or None)  a call began
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
      Release(e.held);
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
      // any bytes decode (a method that is not UTF-8 matches no handler: UNIMPLEMENTED)
      PyObject* method = PyUnicode_DecodeUTF8(ctx->method().data(), static_cast<Py_ssize_t>(ctx->method().size()),
                                              "surrogateescape");
      if (method == nullptr || remaining == nullptr) {
        Py_XDECREF(method);
        Py_DECREF(message);
        Py_XDECREF(remaining);
        Py_DECREF(out);
        return nullptr;
      }
      item = Py_BuildValue("(iKNNN)", e.kind, static_cast<unsigned long long>(e.id), method, message, remaining);
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
  return Metadata(call->ctx()->client_metadata());
}

// auth(id) -> {property name: [bytes, ...]} of the call's TLS session ({} without TLS or for a gone call)
PyObject* Door_auth(DoorObject* self, PyObject* arg) {
  Call* call = nullptr;
  if (!Lookup(self, arg, &call)) return nullptr;
  if (call == nullptr) return PyDict_New();
  return Auth(call->ctx()->auth_context().get());
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
  door->Submit(Op{call, false, std::move(buffer), true, grpc::Status(), {}});
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
  if (!bad.empty()) {  // grpc aborts the process on one; grpc.aio answers INTERNAL "Invalid metadata"
    std::string why = "Invalid metadata: " + bad;
    Call* call = door->Remove(id);
    if (call == nullptr) Py_RETURN_FALSE;
    door->Submit(Op{call, true, grpc::ByteBuffer(), false, grpc::Status(grpc::StatusCode::INTERNAL, why), {}});
    Py_RETURN_TRUE;
  }
  Call* call = door->Remove(id);
  if (call == nullptr) Py_RETURN_FALSE;
  grpc::Status status(static_cast<grpc::StatusCode>(code), std::string(details, details_len));
  Op op{call, true, std::move(buffer), has_reply, std::move(status), std::move(pairs)};
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
  std::vector<Op> batch = door->TakeLater();
  if (batch.empty()) Py_RETURN_NONE;
  Py_BEGIN_ALLOW_THREADS;
  for (Op& op : batch) door->Run(op);
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
    {nullptr, nullptr, 0, nullptr},
};

PyMemberDef Door_members[] = {
    {"port", T_INT, offsetof(DoorObject, port), READONLY, "the bound port"},
    {nullptr, 0, 0, 0, nullptr},
};

PyTypeObject DoorType = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_frontdoor", "grpc++ server answered from Python", -1};

PyObject* MakeModule() {
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
  // mcp_native.grpc_server checks it: a module built from older sources is refused, not misread
  if (PyModule_AddIntConstant(m, "INTERFACE", kInterface) < 0) {
    Py_DECREF(m);
    return nullptr;
  }
  Py_INCREF(&DoorType);
  if (PyModule_AddObject(m, "Door", reinterpret_cast<PyObject*>(&DoorType)) < 0) {
    Py_DECREF(&DoorType);
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}

}  // namespace
}  // namespace mcp_frontdoor

PyMODINIT_FUNC PyInit__frontdoor(void) { return mcp_frontdoor::MakeModule(); }
