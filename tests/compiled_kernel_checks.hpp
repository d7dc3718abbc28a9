// Test helper shared by the compile-cache and bundle suites: two CompiledKernels agree on every
// field a launch or `tilejit inspect` reads (backend_source, dump and timings are not stored).
#pragma once
#include <doctest/doctest.h>

#include "jit/compile.hpp"

namespace tilejit::testing {

inline void check_same(const jit::CompiledKernel& a, const jit::CompiledKernel& b) {
  CHECK(a.name == b.name);
  CHECK(a.arch == b.arch);
  CHECK(a.backend == b.backend);
  CHECK(a.num_threads == b.num_threads);
  CHECK(a.smem_bytes == b.smem_bytes);
  REQUIRE(a.abi.size() == b.abi.size());
  for (size_t i = 0; i < a.abi.size(); ++i) {
    CHECK(a.abi[i].name == b.abi[i].name);
    CHECK(a.abi[i].ty == b.abi[i].ty);
  }
  REQUIRE(a.tensor_maps.size() == b.tensor_maps.size());
  for (size_t i = 0; i < a.tensor_maps.size(); ++i) {
    CHECK(a.tensor_maps[i].abi_slot == b.tensor_maps[i].abi_slot);
    CHECK(a.tensor_maps[i].param_index == b.tensor_maps[i].param_index);
    CHECK(a.tensor_maps[i].box == b.tensor_maps[i].box);
    CHECK(a.tensor_maps[i].swizzle_bytes == b.tensor_maps[i].swizzle_bytes);
  }
  CHECK(a.tile_ir == b.tile_ir);
  CHECK(a.ptx == b.ptx);
  CHECK(a.cubin == b.cubin);
  CHECK(a.ptx_tool == b.ptx_tool);
  CHECK(a.info.name == b.info.name);
  CHECK(a.info.arch == b.info.arch);
  CHECK(a.info.registers == b.info.registers);
  CHECK(a.info.shared_bytes == b.info.shared_bytes);
  CHECK(a.info.spill_store_bytes == b.info.spill_store_bytes);
  CHECK(a.info.spill_load_bytes == b.info.spill_load_bytes);
  CHECK(a.info.stack_frame_bytes == b.info.stack_frame_bytes);
  CHECK(a.info.constant_bytes == b.info.constant_bytes);
}

}  // namespace tilejit::testing
