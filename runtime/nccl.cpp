#include "runtime/nccl.hpp"

#include <dlfcn.h>
#include <fmt/format.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <type_traits>

// The real header, where the build machine has one, only to check our declarations against it
// (below): nothing of it is used. It pulls cuda_runtime.h, which must stay out of nccl.hpp.
#if __has_include(<nccl.h>)
#include <nccl.h>
#define TILEJIT_HAVE_NCCL_H 1
#endif

// ncclComm_t is `struct ncclComm*`: declaring the same incomplete struct makes our handle type
// identical to NCCL's (not merely compatible).
struct ncclComm;

namespace tilejit::runtime::nccl {

namespace {

// ---------------------------------------------------------------------------------------------
// The ABI: the entry points tilejit calls, declared here with types laid out like nccl.h's.

using Comm = ::ncclComm*;
// ncclDataType_t and ncclRedOp_t: C enums, whose underlying type GCC and Clang make unsigned int.
enum class RawType : unsigned {};
enum class RawOp : unsigned {};
// ncclUniqueId, passed by value to ncclCommInitRank.
struct RawId {
  char internal[128];
};

using GetVersionFn = Result (*)(int*);
using GetUniqueIdFn = Result (*)(RawId*);
using CommInitRankFn = Result (*)(Comm*, int, RawId, int);
using CommFn = Result (*)(Comm);                // ncclCommDestroy, ncclCommAbort
using CommIntFn = Result (*)(Comm, int*);       // ncclCommCount, ncclCommUserRank, ncclCommCuDevice
using GetErrorStringFn = const char* (*)(Result);
using GetLastErrorFn = const char* (*)(Comm);
using CommGetAsyncErrorFn = Result (*)(Comm, Result*);
using GroupFn = Result (*)();                   // ncclGroupStart, ncclGroupEnd
using SendFn = Result (*)(const void*, size_t, RawType, int, Comm, CUstream);
using RecvFn = Result (*)(void*, size_t, RawType, int, Comm, CUstream);
using AllGatherFn = Result (*)(const void*, void*, size_t, RawType, Comm, CUstream);
using ReduceFn = Result (*)(const void*, void*, size_t, RawType, RawOp, Comm, CUstream);  // reduce-scatter, all-reduce
using BroadcastFn = Result (*)(const void*, void*, size_t, RawType, int, Comm, CUstream);

// ncclGetLastError is the newest (NCCL 2.13); ncclBfloat16 and ncclAvg need 2.10.
#define TILEJIT_NCCL_ENTRY_POINTS(X)                        \
  X(GetVersion, ncclGetVersion, GetVersionFn)               \
  X(GetErrorString, ncclGetErrorString, GetErrorStringFn)   \
  X(GetLastError, ncclGetLastError, GetLastErrorFn)         \
  X(GetUniqueId, ncclGetUniqueId, GetUniqueIdFn)            \
  X(CommInitRank, ncclCommInitRank, CommInitRankFn)         \
  X(CommDestroy, ncclCommDestroy, CommFn)                   \
  X(CommAbort, ncclCommAbort, CommFn)                       \
  X(CommCount, ncclCommCount, CommIntFn)                    \
  X(CommUserRank, ncclCommUserRank, CommIntFn)              \
  X(CommCuDevice, ncclCommCuDevice, CommIntFn)              \
  X(CommGetAsyncError, ncclCommGetAsyncError, CommGetAsyncErrorFn) \
  X(GroupStart, ncclGroupStart, GroupFn)                    \
  X(GroupEnd, ncclGroupEnd, GroupFn)                        \
  X(Send, ncclSend, SendFn)                                 \
  X(Recv, ncclRecv, RecvFn)                                 \
  X(AllGather, ncclAllGather, AllGatherFn)                  \
  X(ReduceScatter, ncclReduceScatter, ReduceFn)             \
  X(AllReduce, ncclAllReduce, ReduceFn)                     \
  X(Broadcast, ncclBroadcast, BroadcastFn)

struct Api {
#define TILEJIT_DECLARE_NCCL_ENTRY_POINT(member, symbol, type) type member = nullptr;
  TILEJIT_NCCL_ENTRY_POINTS(TILEJIT_DECLARE_NCCL_ENTRY_POINT)
#undef TILEJIT_DECLARE_NCCL_ENTRY_POINT
};

#ifdef TILEJIT_HAVE_NCCL_H
// Whether A and B are passed and returned identically: the same type; enums of one underlying
// type; pointers to such (same cv); trivially copyable structs of one size and alignment; functions
// whose results and parameters all are.
template <class A, class B>
constexpr bool abi_same();

template <class A, class B>
struct FunctionAbi : std::false_type {};
template <class R, class... P, class S, class... Q>
  requires(sizeof...(P) == sizeof...(Q))
struct FunctionAbi<R(P...), S(Q...)> : std::bool_constant<abi_same<R, S>() && (abi_same<P, Q>() && ...)> {};

template <class A, class B>
constexpr bool abi_same() {
  using PA = std::remove_pointer_t<A>;
  using PB = std::remove_pointer_t<B>;
  if constexpr (std::is_same_v<A, B>)
    return true;
  else if constexpr (std::is_enum_v<A> && std::is_enum_v<B>)
    return std::is_same_v<std::underlying_type_t<A>, std::underlying_type_t<B>>;
  else if constexpr (std::is_pointer_v<A> && std::is_pointer_v<B>)
    return std::is_const_v<PA> == std::is_const_v<PB> && abi_same<std::remove_cv_t<PA>, std::remove_cv_t<PB>>();
  else if constexpr (std::is_class_v<A> && std::is_class_v<B>)
    return sizeof(A) == sizeof(B) && alignof(A) == alignof(B) && std::is_trivially_copyable_v<A> &&
           std::is_trivially_copyable_v<B>;
  else if constexpr (std::is_function_v<A> && std::is_function_v<B>)
    return FunctionAbi<A, B>::value;
  else
    return false;
}

#define TILEJIT_CHECK_NCCL_ENTRY_POINT(member, symbol, type) \
  static_assert(abi_same<decltype(&::symbol), type>(), #symbol " is not declared like nccl.h's");
TILEJIT_NCCL_ENTRY_POINTS(TILEJIT_CHECK_NCCL_ENTRY_POINT)
#undef TILEJIT_CHECK_NCCL_ENTRY_POINT

static_assert(std::is_same_v<::ncclComm_t, Comm> && std::is_same_v<cudaStream_t, CUstream>);
static_assert(sizeof(RawId) == NCCL_UNIQUE_ID_BYTES && sizeof(UniqueId{}.bytes) == NCCL_UNIQUE_ID_BYTES);
static_assert(static_cast<unsigned>(Result::success) == ncclSuccess &&
              static_cast<unsigned>(Result::unhandled_cuda_error) == ncclUnhandledCudaError &&
              static_cast<unsigned>(Result::system_error) == ncclSystemError &&
              static_cast<unsigned>(Result::internal_error) == ncclInternalError &&
              static_cast<unsigned>(Result::invalid_argument) == ncclInvalidArgument &&
              static_cast<unsigned>(Result::invalid_usage) == ncclInvalidUsage &&
              static_cast<unsigned>(Result::remote_error) == ncclRemoteError &&
              static_cast<unsigned>(Result::in_progress) == ncclInProgress);
static_assert(static_cast<unsigned>(DataType::i8) == ncclInt8 && static_cast<unsigned>(DataType::u8) == ncclUint8 &&
              static_cast<unsigned>(DataType::i32) == ncclInt32 && static_cast<unsigned>(DataType::u32) == ncclUint32 &&
              static_cast<unsigned>(DataType::i64) == ncclInt64 && static_cast<unsigned>(DataType::u64) == ncclUint64 &&
              static_cast<unsigned>(DataType::f16) == ncclFloat16 && static_cast<unsigned>(DataType::f32) == ncclFloat32 &&
              static_cast<unsigned>(DataType::f64) == ncclFloat64 && static_cast<unsigned>(DataType::bf16) == ncclBfloat16);
static_assert(static_cast<unsigned>(ReduceOp::sum) == ncclSum && static_cast<unsigned>(ReduceOp::prod) == ncclProd &&
              static_cast<unsigned>(ReduceOp::max) == ncclMax && static_cast<unsigned>(ReduceOp::min) == ncclMin &&
              static_cast<unsigned>(ReduceOp::avg) == ncclAvg);
#endif

// Our enumerators are NCCL's values in order (checked above where nccl.h exists).
RawType raw(DataType t) { return static_cast<RawType>(static_cast<unsigned>(t)); }
RawOp raw(ReduceOp op) { return static_cast<RawOp>(static_cast<unsigned>(op)); }
Comm as_comm(void* c) { return static_cast<Comm>(c); }
const void* as_ptr(uint64_t p) { return reinterpret_cast<const void*>(static_cast<uintptr_t>(p)); }
void* as_mut_ptr(uint64_t p) { return reinterpret_cast<void*>(static_cast<uintptr_t>(p)); }

// ---------------------------------------------------------------------------------------------
// Loading

// The process-wide libnccl: loaded on first use (C++ static initialisation is thread-safe), never
// destroyed or unloaded, like the Driver (communicators destroyed during static destruction still
// find it). Loading never throws: a failure is remembered as reason(), thrown by require().
class Library {
 public:
  static const Library& get() {
    static const Library* const instance = new Library();
    return *instance;
  }
  bool available() const { return available_; }
  const std::string& reason() const { return reason_; }
  const std::string& path() const { return path_; }
  int version() const { return version_; }
  // The entry points; NcclError("tilejit: <what> needs NCCL: <reason>") when unavailable.
  const Api& require(std::string_view what) const {
    if (!available_) [[unlikely]]
      throw NcclError(fmt::format("tilejit: {} needs NCCL: {}", what, reason_));
    return api_;
  }
  // The entry points without the check: only for what runs after require() succeeded once.
  const Api& api() const { return api_; }

 private:
  Library() { load(); }
  void load();

  Api api_;
  void* handle_ = nullptr;  // never closed
  std::string path_;
  std::string reason_;
  int version_ = 0;
  bool available_ = false;
};

void Library::load() {
  const char* override_path = std::getenv("TILEJIT_LIBNCCL");
  path_ = (override_path && *override_path) ? override_path : "libnccl.so.2";
  dlerror();
  handle_ = dlopen(path_.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle_) {
    const char* err = dlerror();
    reason_ = fmt::format("libnccl could not be loaded from '{}' ({}); install NCCL 2 or point TILEJIT_LIBNCCL at libnccl.so.2",
                          path_, err ? err : "dlopen failed");
    return;
  }
#define TILEJIT_RESOLVE_NCCL_ENTRY_POINT(member, symbol, type)                                              \
  api_.member = reinterpret_cast<type>(dlsym(handle_, #symbol));                                            \
  if (!api_.member) {                                                                                       \
    reason_ = fmt::format("'{}' has no {} (tilejit needs NCCL 2.13 or newer)", path_, #symbol);             \
    return;                                                                                                 \
  }
  TILEJIT_NCCL_ENTRY_POINTS(TILEJIT_RESOLVE_NCCL_ENTRY_POINT)
#undef TILEJIT_RESOLVE_NCCL_ENTRY_POINT
  if (Result r = api_.GetVersion(&version_); r != Result::success) {
    reason_ = fmt::format("ncclGetVersion in '{}' failed (ncclResult_t {})", path_, static_cast<unsigned>(r));
    return;
  }
  available_ = true;
}

// NVLink SHARP (NVLS) needs CUDA multicast objects, which the lent machines do not allow: with it
// on, init fails or hangs there. Off unless the user chose; once, before NCCL first reads its
// environment (setenv races with a concurrent getenv, so never while a communicator is made).
void disable_nvls_unless_set() {
  static std::once_flag once;
  std::call_once(once, [] { ::setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0); });
}

// ---------------------------------------------------------------------------------------------
// Errors

// "tilejit: <call> <subject> failed: <ncclGetErrorString>; NCCL: <ncclGetLastError>".
[[noreturn]] void throw_nccl(Result r, std::string_view call, std::string_view subject, void* comm) {
  const Api& api = Library::get().api();
  const char* text = api.GetErrorString ? api.GetErrorString(r) : nullptr;
  const char* last = api.GetLastError ? api.GetLastError(as_comm(comm)) : nullptr;
  std::string msg = fmt::format("tilejit: {}{}{} failed: {}", call, subject.empty() ? "" : " ", subject,
                                text ? std::string(text) : fmt::format("ncclResult_t {}", static_cast<unsigned>(r)));
  if (last && *last) msg += fmt::format("; NCCL: {}", last);
  throw NcclError(msg, std::string(call), r);
}

// The subject is formatted only on failure: the success path stays a compare and a branch.
template <class Describe>
void check(Result r, std::string_view call, void* comm, Describe&& describe) {
  if (r != Result::success) [[unlikely]]
    throw_nccl(r, call, describe(), comm);
}

template <class... A>
[[noreturn]] void invalid(std::string_view fn, fmt::format_string<A...> f, A&&... args) {
  throw std::invalid_argument(fmt::format("tilejit: nccl::{}: {}", fn, fmt::format(f, std::forward<A>(args)...)));
}

void check_rank(std::string_view fn, const char* arg, int value, int world) {
  if (value < 0 || value >= world)
    invalid(fn, "{} = {} is not a rank of this communicator (valid: 0 to {})", arg, value, world - 1);
}

void check_buffer(std::string_view fn, const char* arg, uint64_t ptr, size_t count) {
  if (ptr == 0 && count > 0)
    invalid(fn, "{} is a null device pointer with {} elements (a buffer is needed when the count is above 0)", arg, count);
}

// `count` blocks of `world` ranks must be addressable.
void check_blocks(std::string_view fn, const char* arg, size_t count, int world) {
  if (count > std::numeric_limits<size_t>::max() / static_cast<size_t>(world))
    invalid(fn, "{} = {} times {} ranks overflows size_t", arg, count, world);
}

void check_op(std::string_view fn, ReduceOp op) {
  if (static_cast<unsigned>(op) > static_cast<unsigned>(ReduceOp::avg))
    invalid(fn, "ReduceOp {} is not one of sum, prod, max, min, avg", static_cast<int>(op));
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Free functions

size_t size_of(DataType t) {
  switch (t) {
    case DataType::i8: case DataType::u8: return 1;
    case DataType::f16: case DataType::bf16: return 2;
    case DataType::i32: case DataType::u32: case DataType::f32: return 4;
    case DataType::i64: case DataType::u64: case DataType::f64: return 8;
  }
  throw std::invalid_argument(fmt::format(
      "tilejit: nccl: DataType {} is not one of i8, u8, i32, u32, i64, u64, f16, f32, f64, bf16", static_cast<int>(t)));
}

std::string_view name(DataType t) {
  static constexpr std::string_view kNames[] = {"i8", "u8", "i32", "u32", "i64", "u64", "f16", "f32", "f64", "bf16"};
  size_of(t);  // throws for a value outside the enum
  return kNames[static_cast<size_t>(t)];
}

std::string_view name(ReduceOp op) {
  static constexpr std::string_view kNames[] = {"sum", "prod", "max", "min", "avg"};
  check_op("name", op);
  return kNames[static_cast<size_t>(op)];
}

bool available() { return Library::get().available(); }
const std::string& unavailable_reason() { return Library::get().reason(); }
const std::string& library() { return Library::get().path(); }

int version() {
  Library::get().require("nccl::version");
  return Library::get().version();
}

UniqueId make_unique_id() {
  const Api& api = Library::get().require("nccl::make_unique_id");
  disable_nvls_unless_set();
  RawId raw_id{};
  check(api.GetUniqueId(&raw_id), "ncclGetUniqueId", nullptr, [] { return std::string(); });
  UniqueId id;
  std::memcpy(id.bytes.data(), raw_id.internal, sizeof raw_id.internal);
  return id;
}

// ---------------------------------------------------------------------------------------------
// Communicator

Communicator Communicator::create(const UniqueId& id, int rank, int world, int device) {
  constexpr std::string_view fn = "Communicator::create";
  if (world < 1) invalid(fn, "world = {} (valid: 1 or more ranks)", world);
  check_rank(fn, "rank", rank, world);
  if (device < 0) invalid(fn, "device = {} (valid: a CUDA device ordinal, 0 or more)", device);
  const Api& api = Library::get().require("nccl::Communicator::create");
  Driver& d = Driver::get();
  d.require("creating an NCCL communicator");
  if (device >= d.device_count())
    invalid(fn, "device = {} (valid: 0 to {}, the CUDA devices visible)", device, d.device_count() - 1);
  d.context(device).make_current();  // NCCL takes its device from the current context
  disable_nvls_unless_set();
  RawId raw_id{};
  std::memcpy(raw_id.internal, id.bytes.data(), sizeof raw_id.internal);
  Comm comm = nullptr;
  check(api.CommInitRank(&comm, world, raw_id, rank), "ncclCommInitRank", nullptr,
        [&] { return fmt::format("for rank {} of {} on device {}", rank, world, device); });
  return Communicator(comm, true, rank, world, device);
}

Communicator Communicator::wrap(void* nccl_comm) {
  if (!nccl_comm) invalid("Communicator::wrap", "nccl_comm is null (valid: an initialised ncclComm_t)");
  const Api& api = Library::get().require("nccl::Communicator::wrap");
  int world = 0, rank = 0, device = 0;
  auto none = [] { return std::string(); };
  check(api.CommCount(as_comm(nccl_comm), &world), "ncclCommCount", nccl_comm, none);
  check(api.CommUserRank(as_comm(nccl_comm), &rank), "ncclCommUserRank", nccl_comm, none);
  check(api.CommCuDevice(as_comm(nccl_comm), &device), "ncclCommCuDevice", nccl_comm, none);
  return Communicator(nccl_comm, false, rank, world, device);
}

Communicator Communicator::wrap(void* nccl_comm, int rank, int world, int device) {
  constexpr std::string_view fn = "Communicator::wrap";
  if (!nccl_comm) invalid(fn, "nccl_comm is null (valid: an initialised ncclComm_t)");
  if (world < 1) invalid(fn, "world = {} (valid: 1 or more ranks)", world);
  check_rank(fn, "rank", rank, world);
  if (device < 0) invalid(fn, "device = {} (valid: a CUDA device ordinal, 0 or more)", device);
  return Communicator(nccl_comm, false, rank, world, device);
}

Communicator::Communicator(Communicator&& other) noexcept
    : comm_(other.comm_.exchange(nullptr)),
      owned_(other.owned_),
      rank_(other.rank_),
      world_(other.world_),
      device_(other.device_) {}

Communicator& Communicator::operator=(Communicator&& other) noexcept {
  if (this != &other) {
    reset();
    comm_ = other.comm_.exchange(nullptr);
    owned_ = other.owned_;
    rank_ = other.rank_;
    world_ = other.world_;
    device_ = other.device_;
  }
  return *this;
}

Communicator::~Communicator() { reset(); }

void Communicator::reset() noexcept {
  void* c = comm_.exchange(nullptr);
  if (!c || !owned_) return;
  try {
    Driver::get().context(device_).make_current();
  } catch (...) {
    // no context to make current (exit): ncclCommDestroy still frees the host side
  }
  (void)Library::get().api().CommDestroy(as_comm(c));
}

void Communicator::abort() noexcept {
  void* c = comm_.exchange(nullptr);
  if (!c || !Library::get().available()) return;  // a handle wrapped without NCCL was never live
  try {
    Driver::get().context(device_).make_current();
  } catch (...) {
  }
  (void)Library::get().api().CommAbort(as_comm(c));
}

void* Communicator::prepare(std::string_view op) const {
  void* c = comm_.load();
  if (!c) throw std::logic_error(fmt::format("tilejit: nccl::Communicator::{} on an aborted or moved-from communicator", op));
  Library::get().require(fmt::format("nccl::Communicator::{}", op));
  Driver::get().context(device_).make_current();
  return c;
}

// ---------------------------------------------------------------------------------------------
// Operations: arguments first (no NCCL needed to reject them), then the call.

void Communicator::send(uint64_t buf, size_t count, DataType type, int peer, CUstream stream) {
  size_of(type);
  check_rank("Communicator::send", "peer", peer, world_);
  check_buffer("Communicator::send", "buf", buf, count);
  void* c = prepare("send");
  check(Library::get().api().Send(as_ptr(buf), count, raw(type), peer, as_comm(c), stream), "ncclSend", c,
        [&] { return fmt::format("of {} {} to peer {} (rank {} of {})", count, name(type), peer, rank_, world_); });
}

void Communicator::recv(uint64_t buf, size_t count, DataType type, int peer, CUstream stream) {
  size_of(type);
  check_rank("Communicator::recv", "peer", peer, world_);
  check_buffer("Communicator::recv", "buf", buf, count);
  void* c = prepare("recv");
  check(Library::get().api().Recv(as_mut_ptr(buf), count, raw(type), peer, as_comm(c), stream), "ncclRecv", c,
        [&] { return fmt::format("of {} {} from peer {} (rank {} of {})", count, name(type), peer, rank_, world_); });
}

void Communicator::all_gather(uint64_t send, uint64_t recv, size_t send_count, DataType type, CUstream stream) {
  constexpr std::string_view fn = "Communicator::all_gather";
  size_of(type);
  check_blocks(fn, "send_count", send_count, world_);
  check_buffer(fn, "send", send, send_count);
  check_buffer(fn, "recv", recv, send_count);
  void* c = prepare("all_gather");
  check(Library::get().api().AllGather(as_ptr(send), as_mut_ptr(recv), send_count, raw(type), as_comm(c), stream),
        "ncclAllGather", c,
        [&] { return fmt::format("of {} {} per rank (rank {} of {})", send_count, name(type), rank_, world_); });
}

void Communicator::reduce_scatter(uint64_t send, uint64_t recv, size_t recv_count, DataType type, ReduceOp op,
                                  CUstream stream) {
  constexpr std::string_view fn = "Communicator::reduce_scatter";
  size_of(type);
  check_op(fn, op);
  check_blocks(fn, "recv_count", recv_count, world_);
  check_buffer(fn, "send", send, recv_count);
  check_buffer(fn, "recv", recv, recv_count);
  void* c = prepare("reduce_scatter");
  check(Library::get().api().ReduceScatter(as_ptr(send), as_mut_ptr(recv), recv_count, raw(type), raw(op), as_comm(c),
                                           stream),
        "ncclReduceScatter", c, [&] {
          return fmt::format("({}) of {} {} per rank (rank {} of {})", name(op), recv_count, name(type), rank_, world_);
        });
}

void Communicator::all_reduce(uint64_t send, uint64_t recv, size_t count, DataType type, ReduceOp op, CUstream stream) {
  constexpr std::string_view fn = "Communicator::all_reduce";
  size_of(type);
  check_op(fn, op);
  check_buffer(fn, "send", send, count);
  check_buffer(fn, "recv", recv, count);
  void* c = prepare("all_reduce");
  check(Library::get().api().AllReduce(as_ptr(send), as_mut_ptr(recv), count, raw(type), raw(op), as_comm(c), stream),
        "ncclAllReduce", c,
        [&] { return fmt::format("({}) of {} {} (rank {} of {})", name(op), count, name(type), rank_, world_); });
}

void Communicator::broadcast(uint64_t send, uint64_t recv, size_t count, DataType type, int root, CUstream stream) {
  constexpr std::string_view fn = "Communicator::broadcast";
  size_of(type);
  check_rank(fn, "root", root, world_);
  if (rank_ == root) check_buffer(fn, "send", send, count);  // read on the root only
  check_buffer(fn, "recv", recv, count);
  void* c = prepare("broadcast");
  check(Library::get().api().Broadcast(as_ptr(send), as_mut_ptr(recv), count, raw(type), root, as_comm(c), stream),
        "ncclBroadcast", c,
        [&] { return fmt::format("of {} {} from root {} (rank {} of {})", count, name(type), root, rank_, world_); });
}

void Communicator::check_async_error() const {
  void* c = prepare("check_async_error");
  Result async = Result::success;
  check(Library::get().api().CommGetAsyncError(as_comm(c), &async), "ncclCommGetAsyncError", c,
        [] { return std::string(); });
  if (async != Result::success && async != Result::in_progress)
    throw_nccl(async, "an earlier NCCL operation", fmt::format("on rank {} of {}", rank_, world_), c);
}

// ---------------------------------------------------------------------------------------------
// Group

Group::Group() {
  const Api& api = Library::get().require("nccl::Group");
  check(api.GroupStart(), "ncclGroupStart", nullptr, [] { return std::string(); });
}

void Group::end() {
  if (!open_) throw std::logic_error("tilejit: nccl::Group::end() called twice");
  open_ = false;
  check(Library::get().api().GroupEnd(), "ncclGroupEnd", nullptr,
        [] { return std::string("(the group's sends, receives and collectives)"); });
}

Group::~Group() {
  if (open_) (void)Library::get().api().GroupEnd();  // unwinding: close the group, errors are lost anyway
}

}  // namespace tilejit::runtime::nccl
