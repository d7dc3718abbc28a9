// Device memory for tests and examples: an owning DeviceBuffer (cuMemAlloc) and DeviceTensor, which
// pairs a buffer with HostTensor's layout so GPU results compare directly with the interpreter's.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "runtime/driver.hpp"
#include "runtime/host_tensor.hpp"

namespace tilejit::runtime {

// Owning, move-only device allocation in a device's primary context.
//
// Every transfer here is synchronous with respect to the host and to all streams of the device:
// it first waits for the work already queued on the device (cuCtxSynchronize, so a download sees
// what kernels on any stream, blocking or not, wrote), then copies, and returns only when the
// bytes are in place (so a kernel launched next on a non-blocking stream reads them). That is the
// right trade for tests and examples; hot paths will want asynchronous copies on a Stream.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;  // empty: ptr() 0, bytes() 0
  // Uninitialised device memory (see fill_bytes). Zero bytes allocates nothing but still needs a GPU.
  explicit DeviceBuffer(size_t bytes, int device = 0);
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  CUdeviceptr ptr() const { return ptr_; }  // 256-byte aligned (cuMemAlloc guarantees it)
  size_t bytes() const { return bytes_; }
  int device() const { return device_; }

  // Host <-> device copies of `bytes` bytes at byte `offset` of the buffer; std::out_of_range
  // past the end.
  void upload(const void* host, size_t bytes, size_t offset = 0);
  void download(void* host, size_t bytes, size_t offset = 0) const;
  // Every byte set to `value` (cuMemsetD8): 0xFF poisons outputs (NaN for floats, -1 for ints).
  void fill_bytes(uint8_t value);

 private:
  void check_range(const char* op, size_t bytes, size_t offset) const;
  void reset() noexcept;

  CUdeviceptr ptr_ = 0;
  size_t bytes_ = 0;
  int device_ = 0;
};

// A device copy of a HostTensor: the same dtype, sizes, strides (in elements) and allocation size
// (for a strided tensor that includes the elements between rows), so that kernels see the
// layout the interpreter saw and to_host() fills a HostTensor that compares element by element.
class DeviceTensor {
 public:
  DeviceTensor() = default;
  // Contiguous row-major, every byte 0xFF (like a new HostTensor: unwritten outputs show up).
  DeviceTensor(ir::DType dtype, ir::Shape sizes, int device = 0);

  // The whole allocation of `host` copied to the device.
  static DeviceTensor from_host(const HostTensor& host, int device = 0);
  // The layout of `host`, every byte 0xFF: an output to compare with `host` later.
  static DeviceTensor empty_like(const HostTensor& host, int device = 0);

  // Downloads into `out`, which must have this tensor's dtype, sizes and strides
  // (std::invalid_argument otherwise).
  void to_host(HostTensor& out) const;
  HostTensor to_host() const;  // a new HostTensor of the same layout
  void poison() { buffer_.fill_bytes(0xFF); }

  ir::DType dtype() const { return dtype_; }
  const ir::Shape& sizes() const { return sizes_; }
  const ir::Shape& strides() const { return strides_; }
  int rank() const { return static_cast<int>(sizes_.size()); }
  int64_t numel() const;
  CUdeviceptr ptr() const { return buffer_.ptr(); }
  size_t bytes() const { return buffer_.bytes(); }
  const DeviceBuffer& buffer() const { return buffer_; }
  DeviceBuffer& buffer() { return buffer_; }
  std::string describe() const;  // "f32[4,8] on device 0" (plus strides when not contiguous)

 private:
  ir::DType dtype_ = ir::DType::f32;
  ir::Shape sizes_;
  ir::Shape strides_;
  DeviceBuffer buffer_;
};

}  // namespace tilejit::runtime
