// ThreadSanitizer and gRPC's reactors. gRPC hands a reactor between threads through libgrpc's
// completion queues: the thread that returns it from a method handler or calls Finish /
// StartWrite on it, and the thread that then runs its OnCancel / OnWriteDone / OnDone, are
// synchronized inside libgrpc, which Debian builds without TSan instrumentation. TSan would see
// the reactor's fields written on one and read or freed on the other with nothing between. These
// mark that hand-off where it happens, a release when our code hands the reactor to gRPC and an
// acquire when gRPC calls it back, so that TSan still checks everything else the reactor does.
// Without TSan they compile to nothing.
#pragma once

#if defined(__SANITIZE_THREAD__)
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
extern "C" void __tsan_ignore_thread_begin();
extern "C" void __tsan_ignore_thread_end();
#endif

namespace fpa::server {

// Before a call that lets gRPC run the reactor's callbacks on another thread.
inline void handed_to_grpc([[maybe_unused]] void* reactor) {
#if defined(__SANITIZE_THREAD__)
  __tsan_release(reactor);
#endif
}

// First thing in each of the reactor's callbacks.
inline void called_by_grpc([[maybe_unused]] void* reactor) {
#if defined(__SANITIZE_THREAD__)
  __tsan_acquire(reactor);
#endif
}

// For a callback after which gRPC may run the reactor's next one on another thread (OnCancel,
// OnWriteDone; gRPC orders them, OnDone last, inside libgrpc): marks both ends, so that OnDone's
// delete is seen to follow what the callback did. Not for OnDone, which frees the reactor.
class InGrpcCallback {
 public:
  explicit InGrpcCallback(void* reactor) : reactor_(reactor) { called_by_grpc(reactor); }
  ~InGrpcCallback() { handed_to_grpc(reactor_); }
  InGrpcCallback(const InGrpcCallback&) = delete;
  InGrpcCallback& operator=(const InGrpcCallback&) = delete;

 private:
  void* reactor_;
};

// Around a call that starts an operation (Finish, StartWrite, StartWriteAndFinish): hands the
// reactor over, as handed_to_grpc, and TSan records none of the accesses made inside the call.
// gRPC's header code there reads the call's objects (its context, its operation set), which
// libgrpc++ frees in CallOnDone on another thread once the operation completes, ordered inside
// uninstrumented libgrpc. tsan.supp matches those reports by their gRPC frames, but only where
// TSan can restore the reading thread's stack, and now and then it cannot: server_preemption_tsan
// once stopped on the scheduler thread's read in Finish, "[failed to restore the stack]". No code
// of ours runs inside these calls: gRPC runs OnWriteDone and OnDone from its executor (our
// reactors are not inlineable).
class IntoGrpc {
 public:
  explicit IntoGrpc([[maybe_unused]] void* reactor) {
    handed_to_grpc(reactor);
#if defined(__SANITIZE_THREAD__)
    __tsan_ignore_thread_begin();
#endif
  }
  ~IntoGrpc() {
#if defined(__SANITIZE_THREAD__)
    __tsan_ignore_thread_end();
#endif
  }
  IntoGrpc(const IntoGrpc&) = delete;
  IntoGrpc& operator=(const IntoGrpc&) = delete;
};

}  // namespace fpa::server
