// SHA-256 (FIPS 180-4), used for the structural hash of kernels and, later, cache checksums.
// Self-contained so that nothing in the IR layer needs a crypto library.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace tilejit::ir {

std::array<uint8_t, 32> sha256(std::string_view data);
std::string sha256_hex(std::string_view data);

}  // namespace tilejit::ir
