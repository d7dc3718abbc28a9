#include "runtime/device_buffer.hpp"

#include <fmt/format.h>

#include <stdexcept>
#include <utility>

#include "dsl/ir/dtype.hpp"
#include "dsl/ir/type.hpp"

namespace tilejit::runtime {

namespace {

// The driver and API for `device`, with its context current on this thread.
Driver& bind(int device, std::string_view what) {
  Driver& d = Driver::get();
  d.require(what);
  d.context(device).make_current();
  return d;
}

// Waits for everything queued on the current context; `why` says which transfer it guards, since
// an error here usually comes from an earlier kernel, not from the transfer.
void sync_context(const Driver& d, const char* why) {
  CUresult r = d.api().CtxSynchronize();
  if (r != CUDA_SUCCESS)
    throw_cu_error(r, "cuCtxSynchronize", {}, fmt::format("{} (an earlier kernel may have failed)", why));
}

ir::Shape row_major_strides(const ir::Shape& sizes) {
  ir::Shape strides(sizes.size());
  int64_t s = 1;
  for (size_t d = sizes.size(); d-- > 0;) {
    strides[d] = s;
    s *= sizes[d];
  }
  return strides;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// DeviceBuffer

DeviceBuffer::DeviceBuffer(size_t bytes, int device) : device_(device) {
  Driver& d = bind(device, "allocating a DeviceBuffer");
  if (bytes == 0) return;  // cuMemAlloc rejects 0
  CUresult r = d.api().MemAlloc(&ptr_, bytes);
  if (r != CUDA_SUCCESS) {
    ptr_ = 0;
    throw_cu_error(r, "cuMemAlloc", {}, fmt::format("{} bytes on device {}", bytes, device));
  }
  bytes_ = bytes;
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, 0)), bytes_(std::exchange(other.bytes_, 0)), device_(other.device_) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    ptr_ = std::exchange(other.ptr_, 0);
    bytes_ = std::exchange(other.bytes_, 0);
    device_ = other.device_;
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() { reset(); }

void DeviceBuffer::reset() noexcept {
  if (ptr_ == 0) return;
  try {
    Driver& d = Driver::get();
    d.context(device_).make_current();
    // cuMemFree waits for the kernels still using the memory; an error (a context torn down at
    // exit, a sticky kernel fault) leaves nothing to recover here.
    (void)d.api().MemFree(ptr_);
  } catch (...) {
  }
  ptr_ = 0;
  bytes_ = 0;
}

void DeviceBuffer::check_range(const char* op, size_t bytes, size_t offset) const {
  if (offset > bytes_ || bytes > bytes_ - offset)
    throw std::out_of_range(fmt::format("tilejit: DeviceBuffer::{} of {} bytes at offset {} is past the end of {} bytes",
                                        op, bytes, offset, bytes_));
}

void DeviceBuffer::upload(const void* host, size_t bytes, size_t offset) {
  Driver& d = bind(device_, "DeviceBuffer::upload");
  check_range("upload", bytes, offset);
  if (bytes == 0) return;
  sync_context(d, "before DeviceBuffer::upload");
  CUresult r = d.api().MemcpyHtoD(ptr_ + offset, host, bytes);
  if (r != CUDA_SUCCESS) throw_cu_error(r, "cuMemcpyHtoD", {}, fmt::format("{} bytes at offset {}", bytes, offset));
  // From pageable memory the call may return before the DMA to the device has finished.
  sync_context(d, "after DeviceBuffer::upload");
}

void DeviceBuffer::download(void* host, size_t bytes, size_t offset) const {
  Driver& d = bind(device_, "DeviceBuffer::download");
  check_range("download", bytes, offset);
  if (bytes == 0) return;
  sync_context(d, "before DeviceBuffer::download");
  CUresult r = d.api().MemcpyDtoH(host, ptr_ + offset, bytes);
  if (r != CUDA_SUCCESS) throw_cu_error(r, "cuMemcpyDtoH", {}, fmt::format("{} bytes at offset {}", bytes, offset));
}

void DeviceBuffer::fill_bytes(uint8_t value) {
  Driver& d = bind(device_, "DeviceBuffer::fill_bytes");
  if (bytes_ == 0) return;
  sync_context(d, "before DeviceBuffer::fill_bytes");
  CUresult r = d.api().MemsetD8(ptr_, value, bytes_);
  if (r != CUDA_SUCCESS) throw_cu_error(r, "cuMemsetD8", {}, fmt::format("{} bytes", bytes_));
  // cuMemsetD8 is asynchronous for device memory.
  sync_context(d, "after DeviceBuffer::fill_bytes");
}

// ---------------------------------------------------------------------------------------------
// DeviceTensor

DeviceTensor::DeviceTensor(ir::DType dtype, ir::Shape sizes, int device)
    : dtype_(dtype), sizes_(std::move(sizes)), strides_(row_major_strides(sizes_)) {
  int64_t n = 1;
  for (int64_t s : sizes_) {
    if (s < 0) throw std::invalid_argument(fmt::format("tilejit: DeviceTensor sizes must be non-negative, got {}",
                                                       ir::shape_string(sizes_)));
    n *= s;
  }
  buffer_ = DeviceBuffer(static_cast<size_t>(n) * static_cast<size_t>(ir::byte_size(dtype_)), device);
  poison();
}

DeviceTensor DeviceTensor::empty_like(const HostTensor& host, int device) {
  DeviceTensor t;
  t.dtype_ = host.dtype();
  t.sizes_ = host.sizes();
  t.strides_ = host.strides();
  t.buffer_ = DeviceBuffer(host.bytes(), device);
  t.poison();
  return t;
}

DeviceTensor DeviceTensor::from_host(const HostTensor& host, int device) {
  DeviceTensor t;
  t.dtype_ = host.dtype();
  t.sizes_ = host.sizes();
  t.strides_ = host.strides();
  t.buffer_ = DeviceBuffer(host.bytes(), device);
  t.buffer_.upload(host.data(), host.bytes());
  return t;
}

void DeviceTensor::to_host(HostTensor& out) const {
  if (out.dtype() != dtype_ || out.sizes() != sizes_ || out.strides() != strides_ || out.bytes() != bytes())
    throw std::invalid_argument(fmt::format("tilejit: DeviceTensor::to_host: {} cannot receive {}", out.describe(),
                                            describe()));
  buffer_.download(out.data(), bytes());
}

HostTensor DeviceTensor::to_host() const {
  HostTensor out(dtype_, sizes_, strides_);
  to_host(out);
  return out;
}

int64_t DeviceTensor::numel() const {
  int64_t n = 1;
  for (int64_t s : sizes_) n *= s;
  return n;
}

std::string DeviceTensor::describe() const {
  std::string s = fmt::format("{}{}", ir::name(dtype_), ir::shape_string(sizes_));
  if (strides_ != row_major_strides(sizes_)) s += fmt::format(" strides {}", ir::shape_string(strides_));
  return s + fmt::format(" on device {}", buffer_.device());
}

}  // namespace tilejit::runtime
