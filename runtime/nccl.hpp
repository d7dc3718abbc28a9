// NCCL loaded at run time (dlopen, never linked), like libcuda in runtime/driver.hpp: communicators
// of one rank per GPU and the few operations context-parallel attention needs (point-to-point in
// groups, all-gather, reduce-scatter, all-reduce, broadcast). libtilejit still loads where there is
// no NCCL: available() is then false and every operation throws NcclError saying why.
#pragma once
// <cuda.h> for CUstream only (NCCL's cudaStream_t is the same CUstream_st*); no <nccl.h> here: the
// entry points are declared in nccl.cpp, checked against the real header where it exists.
#include <cuda.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "runtime/driver.hpp"

namespace tilejit::runtime::nccl {

// ncclResult_t's values.
enum class Result : unsigned {
  success = 0,
  unhandled_cuda_error = 1,
  system_error = 2,
  internal_error = 3,
  invalid_argument = 4,
  invalid_usage = 5,
  remote_error = 6,
  in_progress = 7,
};

// Every NCCL failure: a call that returned an error (call() names it, nccl_result() is its result),
// or an operation attempted without a loadable libnccl (call() empty, nccl_result() success). A
// DeviceError, so that code catching the GPU path's failures catches these too. what() is one line:
// "tilejit: ncclSend of 1048576 bf16 to peer 1 failed: unhandled cuda error (...); NCCL: <last error>".
class NcclError : public DeviceError {
 public:
  explicit NcclError(const std::string& message, std::string call = {}, Result result = Result::success)
      : DeviceError(message, std::move(call)), nccl_result_(result) {}
  Result nccl_result() const { return nccl_result_; }

 private:
  Result nccl_result_;
};

// ncclDataType_t's values, named like ir::DType.
enum class DataType { i8, u8, i32, u32, i64, u64, f16, f32, f64, bf16 };
// ncclRedOp_t's built-in operations.
enum class ReduceOp { sum, prod, max, min, avg };

size_t size_of(DataType t);       // bytes per element; std::invalid_argument for a value outside the enum
std::string_view name(DataType t);  // "bf16" (error messages)
std::string_view name(ReduceOp op);  // "sum"

// ncclUniqueId: rank 0 makes it, every rank of the communicator gets the same bytes.
struct UniqueId {
  std::array<char, 128> bytes{};  // NCCL_UNIQUE_ID_BYTES
};

// libnccl is "libnccl.so.2" from the loader's search path, or the file the environment variable
// TILEJIT_LIBNCCL names; it is loaded once, on first use, from any thread, and never unloaded.
bool available();
const std::string& unavailable_reason();  // one sentence naming the file and dlerror(); empty when available()
const std::string& library();              // what was (or would have been) dlopen'ed
int version();                             // ncclGetVersion: 22809 for 2.28.9
// ncclGetUniqueId (creates the bootstrap's listening socket): rank 0 calls it and shares the bytes.
UniqueId make_unique_id();

// One rank's communicator (one per thread or process); move-only. Operations are asynchronous on
// the given stream; buffers are device pointers (CUdeviceptr values) on the communicator's device.
// Arguments are checked before NCCL is called (std::invalid_argument naming the function, the
// argument, its value and what is valid): a peer outside [0, world), a null buffer with count > 0.
// A count of 0 is a no-op, as in NCCL.
class Communicator {
 public:
  // ncclCommInitRank for `rank` of `world` on CUDA device `device`. Collective: every rank calls it
  // with the same id and blocks until all have joined. Makes the device's primary context current
  // on the calling thread first, because NCCL takes the device from the current context. Sets
  // NCCL_NVLS_ENABLE=0 when it is unset (before the first init): NVLink SHARP needs multicast
  // objects, which the lent machines do not allow.
  static Communicator create(const UniqueId& id, int rank, int world, int device);
  // A communicator the caller owns (an ncclComm_t as void*): used, never destroyed. Rank, size and
  // device are asked from NCCL. A null handle is std::invalid_argument. It must be a blocking
  // communicator (the default): ncclInProgress from a non-blocking one is reported as a failure.
  static Communicator wrap(void* nccl_comm);
  // The same when the caller knows rank, size and device (PyTorch's process group does): no NCCL
  // call, so a handle NCCL never made is only found out at the first operation.
  static Communicator wrap(void* nccl_comm, int rank, int world, int device);

  Communicator(Communicator&& other) noexcept;
  Communicator& operator=(Communicator&& other) noexcept;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  ~Communicator();  // ncclCommDestroy when owned and not aborted (errors ignored: nothing to recover)

  int rank() const { return rank_; }
  int world() const { return world_; }
  int device() const { return device_; }
  void* handle() const { return comm_.load(); }  // null after abort() or a move
  bool owned() const { return owned_; }

  // Point to point: a matching recv on `peer`. Inside one Group, any order of sends and receives
  // across ranks completes; outside a group each call may block until its peer posts the match.
  void send(uint64_t buf, size_t count, DataType type, int peer, CUstream stream);
  void recv(uint64_t buf, size_t count, DataType type, int peer, CUstream stream);
  // `recv` holds world() * send_count elements: rank r's block at r * send_count.
  void all_gather(uint64_t send, uint64_t recv, size_t send_count, DataType type, CUstream stream);
  // `send` holds world() * recv_count elements; rank r gets block r reduced over the ranks.
  void reduce_scatter(uint64_t send, uint64_t recv, size_t recv_count, DataType type, ReduceOp op, CUstream stream);
  void all_reduce(uint64_t send, uint64_t recv, size_t count, DataType type, ReduceOp op, CUstream stream);
  // `root`'s `send` into every rank's `recv` (`send` is read on the root only).
  void broadcast(uint64_t send, uint64_t recv, size_t count, DataType type, int root, CUstream stream);

  // ncclCommGetAsyncError: throws NcclError if a previous operation failed asynchronously (a
  // peer died, a network error) — what a rank waiting on its stream polls to stop waiting.
  void check_async_error() const;
  // ncclCommAbort (owned or not; the handle is dead afterwards): kernels of pending operations
  // stop, so a rank blocked on its stream returns. May be called from another thread while the
  // owner waits on a stream (a hang guard), not while another thread is inside a call on it.
  void abort() noexcept;

 private:
  Communicator(void* comm, bool owned, int rank, int world, int device)
      : comm_(comm), owned_(owned), rank_(rank), world_(world), device_(device) {}
  // The live handle with the device's context current; std::logic_error after abort or a move.
  void* prepare(std::string_view op) const;
  void reset() noexcept;

  std::atomic<void*> comm_{nullptr};  // atomic: abort() may run on a watchdog thread
  bool owned_ = false;
  int rank_ = 0, world_ = 0, device_ = 0;
};

// ncclGroupStart on construction, ncclGroupEnd at end(): the sends and receives in between are
// issued together, so a ring exchange (every rank sends, then receives) never deadlocks. Call
// end() to see the group's errors (NCCL reports some only there); a destructor reached without
// end() (an exception unwinding) still ends the group, ignoring errors, so that later NCCL calls
// on this thread are not silently deferred. Per thread; not movable.
class Group {
 public:
  Group();
  ~Group();
  void end();  // ncclGroupEnd; NcclError on failure; std::logic_error when already ended

  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

 private:
  bool open_ = true;
};

}  // namespace tilejit::runtime::nccl
