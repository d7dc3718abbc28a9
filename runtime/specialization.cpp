#include "runtime/specialization.hpp"

#include <fmt/format.h>

#include <vector>

namespace tilejit::runtime {
namespace {

constexpr size_t kMaxParams = 21;  // 3 bits each in 64
enum Bit : int { kAligned = 0, kContiguous = 1, kDivisible = 2 };
uint64_t bit(size_t param, Bit b) { return uint64_t{1} << (3 * param + static_cast<size_t>(b)); }

}  // namespace

uint64_t specialization_key(const ir::Function& signature, std::span<const DeviceArg> args) {
  uint64_t key = 0;
  const size_t n = std::min({signature.params.size(), args.size(), kMaxParams});
  for (size_t i = 0; i < n; ++i) {
    const ir::Param& p = signature.params[i];
    const DeviceArg& a = args[i];
    if (p.kind == ir::ParamKind::Scalar) {
      if (!ir::is_int(p.type.dtype) || p.type.dtype == ir::DType::i1 || p.spec.divisible_by >= kSpecialisedDivisor) continue;
      const bool multiple = (a.kind() == DeviceArg::Kind::Int && a.as_int() % kSpecialisedDivisor == 0) ||
                            (a.kind() == DeviceArg::Kind::UInt && a.as_uint() % kSpecialisedDivisor == 0);
      if (multiple) key |= bit(i, kDivisible);
      continue;
    }
    const TensorView* t = a.tensor();
    if (!t || t->strides.size() != t->sizes.size()) continue;
    const int64_t es = ir::byte_size(p.type.dtype);
    if (p.spec.align_bytes < kSpecialisedAlignBytes && t->address % kSpecialisedAlignBytes == 0) {
      bool aligned = true;
      if (p.kind == ir::ParamKind::Tensor)
        for (size_t d = 0; d + 1 < t->strides.size(); ++d) aligned = aligned && (t->strides[d] * es) % kSpecialisedAlignBytes == 0;
      if (aligned) key |= bit(i, kAligned);
    }
    if (p.kind == ir::ParamKind::Tensor && !p.spec.contiguous_last && !t->strides.empty() && t->strides.back() == 1)
      key |= bit(i, kContiguous);
  }
  return key;
}

ir::Function specialize(const ir::Function& f, uint64_t key) {
  ir::Function out = f;
  for (size_t i = 0; i < std::min(out.params.size(), kMaxParams); ++i) {
    ir::ParamSpec& s = out.params[i].spec;
    if (key & bit(i, kAligned)) s.align_bytes = kSpecialisedAlignBytes;
    if (key & bit(i, kContiguous)) s.contiguous_last = true;
    if (key & bit(i, kDivisible)) s.divisible_by = kSpecialisedDivisor;
  }
  return out;
}

std::string describe_specialization(const ir::Function& f, uint64_t key) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < std::min(f.params.size(), kMaxParams); ++i) {
    std::vector<std::string> what;
    if (key & bit(i, kAligned)) what.push_back(fmt::format("align {}", kSpecialisedAlignBytes));
    if (key & bit(i, kContiguous)) what.push_back("contiguous");
    if (key & bit(i, kDivisible)) what.push_back(fmt::format("divisible by {}", kSpecialisedDivisor));
    if (!what.empty()) parts.push_back(fmt::format("{}: {}", f.params[i].name, fmt::join(what, ", ")));
  }
  return fmt::format("{}", fmt::join(parts, "; "));
}

}  // namespace tilejit::runtime
