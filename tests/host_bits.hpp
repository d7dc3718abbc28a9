// Test helpers shared by the suites: a host tensor's raw element bits, and a substring check for
// compiler output (PTX, ptxas logs).
#pragma once
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/host_tensor.hpp"

namespace testing {

// The tensor's elements as T (T must have the element's size): its bits, no conversion.
template <class T>
std::vector<T> raw(const tilejit::runtime::HostTensor& t) {
  REQUIRE(sizeof(T) == static_cast<size_t>(tilejit::ir::byte_size(t.dtype())));
  std::vector<T> v(static_cast<size_t>(t.numel()));
  std::memcpy(v.data(), t.data(), v.size() * sizeof(T));
  return v;
}

inline bool contains(const std::string& s, std::string_view what) { return s.find(what) != std::string::npos; }

}  // namespace testing
