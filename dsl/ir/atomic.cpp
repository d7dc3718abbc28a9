#include "dsl/ir/atomic.hpp"

#include <array>
#include <string>

namespace tilejit::ir {

namespace {
constexpr std::array<std::string_view, 7> kRmw{"add", "max", "min", "and", "or", "xor", "xchg"};
constexpr std::array<std::string_view, 4> kSem{"relaxed", "acquire", "release", "acq_rel"};
constexpr std::array<std::string_view, 3> kScope{"cta", "gpu", "sys"};

template <class E, size_t N>
std::optional<E> parse(const std::array<std::string_view, N>& names, std::string_view s) {
  for (size_t i = 0; i < N; ++i)
    if (names[i] == s) return static_cast<E>(i);
  return std::nullopt;
}
}  // namespace

std::string_view name(AtomicRmw k) { return kRmw[static_cast<size_t>(k)]; }
std::string_view name(MemSem s) { return kSem[static_cast<size_t>(s)]; }
std::string_view name(MemScope s) { return kScope[static_cast<size_t>(s)]; }
std::optional<AtomicRmw> parse_atomic_rmw(std::string_view s) { return parse<AtomicRmw>(kRmw, s); }
std::optional<MemSem> parse_mem_sem(std::string_view s) { return parse<MemSem>(kSem, s); }
std::optional<MemScope> parse_mem_scope(std::string_view s) { return parse<MemScope>(kScope, s); }

std::string atomic_dtype_error(std::optional<AtomicRmw> rmw, DType d) {
  const bool int32_64 = d == DType::i32 || d == DType::u32 || d == DType::i64 || d == DType::u64;
  const bool float32_64 = d == DType::f32 || d == DType::f64;
  // Bitwise ops and compare-and-swap on integers; the arithmetic ones and exchange on floats too
  // (float max / min through a compare-and-swap loop).
  const bool bitwise = rmw && (*rmw == AtomicRmw::and_ || *rmw == AtomicRmw::or_ || *rmw == AtomicRmw::xor_);
  if (!rmw || bitwise) return int32_64 ? "" : "i32 u32 i64 u64";
  return int32_64 || float32_64 ? "" : "i32 u32 i64 u64 f32 f64";
}

}  // namespace tilejit::ir
