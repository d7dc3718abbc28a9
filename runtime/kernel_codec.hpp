// The binary form of a jit::CompiledKernel, shared by the compile cache's entry files and by
// bundles, so the two containers can never disagree on what a stored kernel is.
#pragma once
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include "jit/compile.hpp"

namespace tilejit::runtime::codec {

// Keep in step with project(VERSION) in the top-level CMakeLists.txt. A constant here rather than
// a compile definition so that cache and bundle keys do not depend on how a file was built; a
// release that changes code generation must change it, which invalidates every cache entry and
// every bundle entry (their keys include it).
inline constexpr std::string_view kTilejitVersion = "0.1.16";

// A stored kernel that cannot be decoded: short, overlong, or holding a value no tilejit writes.
// what() names the field and the problem ("ptx: needs 812 bytes at offset 96 but only 40 are
// left"); the containers prefix the file.
struct DecodeError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Explicit little-endian fields: str is u64 length + bytes; counts are u32.
class Writer {
 public:
  void bytes(const void* p, size_t n) { out_.append(static_cast<const char*>(p), n); }
  void u8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) u8(static_cast<uint8_t>(v >> (8 * i)));
  }
  void u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) u8(static_cast<uint8_t>(v >> (8 * i)));
  }
  void i32(int32_t v) { u32(static_cast<uint32_t>(v)); }
  void i64(int64_t v) { u64(static_cast<uint64_t>(v)); }
  void str(std::string_view s) {
    u64(s.size());
    bytes(s.data(), s.size());
  }
  void count(size_t n);  // throws std::length_error above 2^32 - 1
  std::string& out() { return out_; }
  size_t size() const { return out_.size(); }

 private:
  std::string out_;
};

// Reads [pos, end) of `data`; every read is bounds-checked and throws DecodeError naming `field`.
class Reader {
 public:
  Reader(std::string_view data, size_t pos, size_t end) : data_(data), pos_(pos), end_(end) {}
  uint8_t u8(const char* field) {
    need(1, field);
    return static_cast<uint8_t>(data_[pos_++]);
  }
  uint32_t u32(const char* field) {
    need(4, field);
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<uint8_t>(data_[pos_++])} << (8 * i);
    return v;
  }
  uint64_t u64(const char* field) {
    need(8, field);
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t{static_cast<uint8_t>(data_[pos_++])} << (8 * i);
    return v;
  }
  int32_t i32(const char* field) { return static_cast<int32_t>(u32(field)); }
  int64_t i64(const char* field) { return static_cast<int64_t>(u64(field)); }
  std::string str(const char* field) { return std::string(view(field)); }
  // A str field without copying it (valid while `data` is).
  std::string_view view(const char* field) {
    uint64_t n = u64(field);
    need(n, field);
    std::string_view s = data_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  // An element count, checked against the bytes left so a bad count cannot cause a huge allocation.
  size_t count(const char* field, size_t min_element_bytes);
  size_t left() const { return end_ - pos_; }
  size_t pos() const { return pos_; }

 private:
  void need(uint64_t n, const char* field) const {
    if (n > end_ - pos_) fail_need(n, field);
  }
  [[noreturn]] void fail_need(uint64_t n, const char* field) const;
  std::string_view data_;
  size_t pos_, end_;
};

// The kernel's fields, in this order (the compile cache's entry format v1 documents them):
//   str kernel name | str arch | u8 backend | i32 num_threads | i64 smem_bytes
//   | u32 n, n x (str name | u8 dtype | u8 is_pointer)                       ABI parameters
//   | u32 n, n x (i32 abi_slot | i32 param_index | u32 m, m x i64 box | i32 swizzle)   tensor maps
//   | KernelInfo: str name | str arch | i32 registers, shared, spill stores, spill loads, stack
//     frame, constant bytes
//   | str ptx_tool | str ptx | str cubin | str tile_ir
// Kept: what a launch and `tilejit inspect` need. Not kept: backend_source, dump, timings.
// Changing this layout changes both containers' format versions.
void write_kernel(Writer& w, const jit::CompiledKernel& k);
// Reads exactly the fields above (the caller checks what follows them). Throws DecodeError.
jit::CompiledKernel read_kernel(Reader& r);

}  // namespace tilejit::runtime::codec
