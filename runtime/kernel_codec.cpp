// The CompiledKernel codec (see kernel_codec.hpp for the layout).
#include "runtime/kernel_codec.hpp"

#include <fmt/format.h>

#include <limits>

namespace tilejit::runtime::codec {

void Writer::count(size_t n) {
  if (n > std::numeric_limits<uint32_t>::max())
    throw std::length_error(fmt::format("tilejit: {} elements do not fit a stored count", n));
  u32(static_cast<uint32_t>(n));
}

size_t Reader::count(const char* field, size_t min_element_bytes) {
  uint32_t n = u32(field);
  if (uint64_t{n} * min_element_bytes > end_ - pos_)
    throw DecodeError(fmt::format("{}: {} elements cannot fit in the {} bytes left", field, n, end_ - pos_));
  return n;
}

void Reader::fail_need(uint64_t n, const char* field) const {
  throw DecodeError(fmt::format("{}: needs {} bytes at offset {} but only {} are left", field, n, pos_, end_ - pos_));
}

void write_kernel(Writer& w, const jit::CompiledKernel& k) {
  w.str(k.name);
  w.str(k.arch);
  w.u8(static_cast<uint8_t>(k.backend));
  w.i32(k.num_threads);
  w.i64(k.smem_bytes);
  w.count(k.abi.size());
  for (const auto& p : k.abi) {
    w.str(p.name);
    w.u8(static_cast<uint8_t>(p.ty.dtype));
    w.u8(p.ty.ptr ? 1 : 0);
  }
  w.count(k.tensor_maps.size());
  for (const auto& t : k.tensor_maps) {
    w.i32(t.abi_slot);
    w.i32(t.param_index);
    w.count(t.box.size());
    for (int64_t b : t.box) w.i64(b);
    w.i32(t.swizzle_bytes);
  }
  w.str(k.info.name);
  w.str(k.info.arch);
  for (int v : {k.info.registers, k.info.shared_bytes, k.info.spill_store_bytes, k.info.spill_load_bytes,
                k.info.stack_frame_bytes, k.info.constant_bytes})
    w.i32(v);
  w.str(k.ptx_tool);
  w.str(k.ptx);
  w.str(std::string_view(reinterpret_cast<const char*>(k.cubin.data()), k.cubin.size()));
  w.str(k.tile_ir);
}

jit::CompiledKernel read_kernel(Reader& r) {
  jit::CompiledKernel k;
  k.name = r.str("kernel name");
  k.arch = r.str("arch");
  uint8_t backend = r.u8("backend");
  if (backend > static_cast<uint8_t>(jit::Backend::Nvrtc)) throw DecodeError(fmt::format("backend {} is unknown", backend));
  k.backend = static_cast<jit::Backend>(backend);
  k.num_threads = r.i32("num_threads");
  k.smem_bytes = r.i64("smem_bytes");
  size_t n = r.count("ABI parameters", 10);
  k.abi.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    jit::pir::Param p;
    p.name = r.str("ABI parameter name");
    uint8_t dtype = r.u8("ABI parameter dtype");
    if (dtype > static_cast<uint8_t>(ir::DType::f8e5m2))
      throw DecodeError(fmt::format("ABI parameter '{}': dtype {} is unknown", p.name, dtype));
    p.ty = {static_cast<ir::DType>(dtype), r.u8("ABI parameter pointer flag") != 0};
    k.abi.push_back(std::move(p));
  }
  n = r.count("tensor maps", 16);
  k.tensor_maps.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    jit::pir::TensorMapSpec t;
    t.abi_slot = r.i32("tensor map abi_slot");
    t.param_index = r.i32("tensor map param_index");
    size_t m = r.count("tensor map box", 8);
    for (size_t j = 0; j < m; ++j) t.box.push_back(r.i64("tensor map box"));
    t.swizzle_bytes = r.i32("tensor map swizzle");
    k.tensor_maps.push_back(std::move(t));
  }
  k.info.name = r.str("info name");
  k.info.arch = r.str("info arch");
  for (int* v : {&k.info.registers, &k.info.shared_bytes, &k.info.spill_store_bytes, &k.info.spill_load_bytes,
                 &k.info.stack_frame_bytes, &k.info.constant_bytes})
    *v = r.i32("kernel info");
  k.ptx_tool = r.str("ptx_tool");
  k.ptx = r.str("ptx");
  std::string_view cubin = r.view("cubin");
  k.cubin.assign(cubin.begin(), cubin.end());
  k.tile_ir = r.str("tile_ir");
  return k;
}

}  // namespace tilejit::runtime::codec
