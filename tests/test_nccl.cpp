// The NCCL layer without a GPU (runtime/nccl.hpp): element sizes and names, argument errors (raised
// before NCCL is called, so they are checked against a handle NCCL never made), the errors of every
// operation when libnccl cannot be loaded (TILEJIT_LIBNCCL at a missing file, in a child process:
// the library is loaded once per process), and, where this machine has libnccl, its version, unique
// ids and NCCL_NVLS_ENABLE. The collectives themselves are in test_nccl_gpu (label multi_gpu).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "child_process.hpp"
#include "runtime/nccl.hpp"

namespace nccl = tilejit::runtime::nccl;
using nccl::Communicator;
using nccl::DataType;
using nccl::NcclError;
using nccl::ReduceOp;

namespace {

constexpr const char* kMissing = "/nonexistent/tilejit-test/libnccl.so.2";
constexpr uint64_t kBuf = 0x7f0000000000;  // a device pointer value nobody dereferences here

// A communicator NCCL never made: every call below must fail in the argument checks, before NCCL
// would be handed the handle.
Communicator fake(int rank, int world) { return Communicator::wrap(reinterpret_cast<void*>(0x10), rank, world, 0); }

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
// doctest::Contains of a built message (it takes a doctest::String, which copies).
doctest::Contains has(const std::string& part) { return doctest::Contains(part.c_str()); }

}  // namespace

TEST_CASE("nccl: element sizes and names") {
  const std::vector<std::pair<DataType, size_t>> sizes{{DataType::i8, 1},  {DataType::u8, 1},  {DataType::i32, 4},
                                                       {DataType::u32, 4}, {DataType::i64, 8}, {DataType::u64, 8},
                                                       {DataType::f16, 2}, {DataType::f32, 4}, {DataType::f64, 8},
                                                       {DataType::bf16, 2}};
  for (auto [t, bytes] : sizes) CHECK(nccl::size_of(t) == bytes);
  CHECK(nccl::name(DataType::bf16) == "bf16");
  CHECK(nccl::name(DataType::u64) == "u64");
  CHECK(nccl::name(ReduceOp::avg) == "avg");
  CHECK_THROWS_WITH_AS(nccl::size_of(static_cast<DataType>(42)),
                       doctest::Contains("DataType 42 is not one of i8, u8, i32, u32, i64, u64, f16, f32, f64, bf16"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(nccl::name(static_cast<ReduceOp>(7)), doctest::Contains("ReduceOp 7 is not one of sum"),
                       std::invalid_argument);
}

TEST_CASE("nccl: the library loads once, from any thread, without throwing") {
  bool first = false;
  CHECK_NOTHROW(first = nccl::available());
  std::vector<int> seen(8, -1);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < seen.size(); ++i) threads.emplace_back([&seen, i] { seen[i] = nccl::available() ? 1 : 0; });
  for (auto& t : threads) t.join();
  for (int s : seen) CHECK(s == (first ? 1 : 0));
  CHECK(nccl::unavailable_reason().empty() == first);
  MESSAGE("libnccl '" << nccl::library() << "': " << (first ? "available" : nccl::unavailable_reason()));
}

TEST_CASE("nccl: communicator arguments are checked before NCCL is called") {
  const nccl::UniqueId id;
  CHECK_THROWS_WITH_AS(Communicator::create(id, 2, 2, 0),
                       doctest::Contains("nccl::Communicator::create: rank = 2 is not a rank of this communicator (valid: 0 to 1)"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(Communicator::create(id, 0, 0, 0), doctest::Contains("create: world = 0 (valid: 1 or more ranks)"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(Communicator::create(id, 0, 2, -1), doctest::Contains("create: device = -1"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(Communicator::wrap(nullptr), doctest::Contains("nccl::Communicator::wrap: nccl_comm is null"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(Communicator::wrap(nullptr, 0, 2, 0), doctest::Contains("wrap: nccl_comm is null"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(fake(-1, 2), doctest::Contains("wrap: rank = -1 is not a rank of this communicator (valid: 0 to 1)"),
                       std::invalid_argument);

  Communicator c = fake(1, 4);
  CHECK(c.rank() == 1);
  CHECK(c.world() == 4);
  CHECK(c.device() == 0);
  CHECK_FALSE(c.owned());
}

TEST_CASE("nccl: operation arguments: peers, null buffers, types, operations, overflow") {
  Communicator c = fake(1, 4);
  CHECK_THROWS_WITH_AS(c.send(kBuf, 8, DataType::f32, 4, nullptr),
                       doctest::Contains("tilejit: nccl::Communicator::send: peer = 4 is not a rank of this communicator (valid: 0 to 3)"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(c.recv(kBuf, 8, DataType::f32, -1, nullptr), doctest::Contains("recv: peer = -1 is not a rank"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(c.send(0, 8, DataType::bf16, 0, nullptr),
                       doctest::Contains("send: buf is a null device pointer with 8 elements"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(c.recv(0, 1, DataType::i8, 2, nullptr), doctest::Contains("recv: buf is a null device pointer"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(c.send(kBuf, 8, static_cast<DataType>(10), 0, nullptr), doctest::Contains("DataType 10 is not one of"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(c.all_gather(kBuf, 0, 16, DataType::i32, nullptr),
                       doctest::Contains("all_gather: recv is a null device pointer with 16 elements"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(c.all_gather(kBuf, kBuf, std::numeric_limits<size_t>::max() / 2, DataType::u8, nullptr),
                       doctest::Contains("all_gather: send_count = 9223372036854775807 times 4 ranks overflows size_t"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(c.reduce_scatter(0, kBuf, 3, DataType::f32, ReduceOp::sum, nullptr),
                       doctest::Contains("reduce_scatter: send is a null device pointer"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(c.reduce_scatter(kBuf, kBuf, 3, DataType::f32, static_cast<ReduceOp>(5), nullptr),
                       doctest::Contains("ReduceOp 5 is not one of sum, prod, max, min, avg"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(c.all_reduce(kBuf, 0, 3, DataType::f64, ReduceOp::max, nullptr),
                       doctest::Contains("all_reduce: recv is a null device pointer with 3 elements"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(c.broadcast(kBuf, kBuf, 3, DataType::f32, 7, nullptr),
                       doctest::Contains("broadcast: root = 7 is not a rank of this communicator (valid: 0 to 3)"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(c.broadcast(0, kBuf, 3, DataType::f32, 1, nullptr), doctest::Contains("broadcast: send is a null"),
                       std::invalid_argument);
}

TEST_CASE("nccl: a moved-from communicator refuses operations") {
  Communicator a = fake(0, 2);
  Communicator b = std::move(a);
  CHECK(b.handle() == reinterpret_cast<void*>(0x10));
  CHECK(a.handle() == nullptr);  // NOLINT(bugprone-use-after-move): the state after a move is the point
  CHECK_THROWS_WITH_AS(a.send(kBuf, 8, DataType::f32, 1, nullptr),
                       doctest::Contains("nccl::Communicator::send on an aborted or moved-from communicator"), std::logic_error);
}

// Runs in the child that the next test starts with TILEJIT_LIBNCCL at a missing file (skipped in
// an ordinary run: the library of this process is already loaded).
TEST_CASE("nccl child: without libnccl every operation throws a clear NcclError" * doctest::skip()) {
  REQUIRE(contains(nccl::library(), kMissing));
  CHECK_FALSE(nccl::available());
  CHECK(contains(nccl::unavailable_reason(), std::string("libnccl could not be loaded from '") + kMissing + "'"));
  CHECK(contains(nccl::unavailable_reason(), "No such file or directory"));  // dlerror()'s words
  const std::string needs = std::string("needs NCCL: libnccl could not be loaded from '") + kMissing;
  CHECK_THROWS_WITH_AS(nccl::make_unique_id(), has("tilejit: nccl::make_unique_id " + needs), NcclError);
  CHECK_THROWS_WITH_AS(nccl::version(), has(needs), NcclError);
  CHECK_THROWS_WITH_AS(Communicator::create(nccl::UniqueId{}, 0, 2, 0),
                       has("nccl::Communicator::create " + needs), NcclError);
  CHECK_THROWS_WITH_AS(Communicator::wrap(reinterpret_cast<void*>(0x10)), has(needs), NcclError);
  CHECK_THROWS_WITH_AS(nccl::Group(), has("nccl::Group " + needs), NcclError);
  // valid arguments pass the checks and reach the library; count 0 with a null buffer is valid
  Communicator c = fake(0, 2);
  CHECK_THROWS_WITH_AS(c.send(kBuf, 8, DataType::f32, 1, nullptr), has("nccl::Communicator::send " + needs),
                       NcclError);
  CHECK_THROWS_AS(c.recv(0, 0, DataType::f32, 1, nullptr), NcclError);
  CHECK_THROWS_AS(c.broadcast(0, kBuf, 4, DataType::f32, 1, nullptr), NcclError);  // send is read on the root only
  CHECK_THROWS_AS(c.check_async_error(), NcclError);
  CHECK_THROWS_AS(c.all_reduce(kBuf, kBuf, 4, DataType::f32, ReduceOp::sum, nullptr), tilejit::runtime::DeviceError);
  c.abort();  // nothing to abort without NCCL; the communicator is dead afterwards
  CHECK(c.handle() == nullptr);
  std::printf("nccl child: checked\n");
  std::fflush(stdout);
}

TEST_CASE("nccl: TILEJIT_LIBNCCL at a missing file gives unavailable() and clear errors (child process)") {
  using tilejit::testing::run_program;
  const tilejit::testing::ChildResult r =
      run_program({"/proc/self/exe", "--test-case=nccl child: *", "--no-skip"}, {{"TILEJIT_LIBNCCL", kMissing}}, 60);
  INFO(r.output);
  CHECK(r.finished);
  CHECK(r.exit_code == 0);
  CHECK(contains(r.output, "nccl child: checked"));
}

TEST_CASE("nccl: with libnccl on this machine: version, unique ids, NCCL_NVLS_ENABLE") {
  if (!nccl::available()) {
    MESSAGE("SKIPPED: NCCL: " << nccl::unavailable_reason());
    return;
  }
  const int v = nccl::version();
  MESSAGE("NCCL version " << v << " from '" << nccl::library() << "'");
  CHECK(v >= 21300);  // 2.13: ncclGetLastError
  CHECK(v < 30000);   // libnccl.so.2

  const char* before = std::getenv("NCCL_NVLS_ENABLE");
  const std::string preset = before ? before : "";
  nccl::UniqueId a, b;
  try {
    a = nccl::make_unique_id();
    b = nccl::make_unique_id();
  } catch (const NcclError& e) {  // no network interface NCCL accepts (a sandbox): not our defect
    MESSAGE("SKIPPED: ncclGetUniqueId: " << e.what());
    return;
  }
  CHECK(std::any_of(a.bytes.begin(), a.bytes.end(), [](char c) { return c != 0; }));
  CHECK(a.bytes != b.bytes);  // each id names its own bootstrap
  const char* after = std::getenv("NCCL_NVLS_ENABLE");
  REQUIRE(after != nullptr);
  CHECK(std::string(after) == (before ? preset : "0"));  // set to 0 when unset, a user's choice kept
}

TEST_CASE("nccl: Group::end twice is a logic error") {
  if (!nccl::available()) {
    MESSAGE("SKIPPED: NCCL: " << nccl::unavailable_reason());
    return;
  }
  nccl::Group g;
  g.end();  // an empty group: nothing reaches a device
  CHECK_THROWS_WITH_AS(g.end(), doctest::Contains("nccl::Group::end() called twice"), std::logic_error);
}
