// Canonical serialisation and structural hash. The printed text already renumbers values in
// definition order and sorts attributes, so it is the serialisation; a version line guards
// against silently reusing hashes across changes of the text format.
#include "dsl/ir/function.hpp"
#include "dsl/ir/sha256.hpp"

namespace tilejit::ir {

namespace {
constexpr std::string_view kFormatVersion = "tilejit-ir v1\n";
}

std::string serialize(const Function& f) { return std::string(kFormatVersion) + print(f, {.locations = false}); }

std::string structural_hash(const Function& f) { return sha256_hex(serialize(f)); }

}  // namespace tilejit::ir
