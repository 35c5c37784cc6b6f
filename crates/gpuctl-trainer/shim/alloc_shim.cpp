// The allocator bridge: what tch does not expose of libtorch's caching device allocator
// (empty the cache, device statistics, reset peak marks, free/total memory, the per-process
// memory fraction) and the autocast dtype. Every function is noexcept at the C boundary:
// a C++ exception is caught here and returned as a message, never unwound into Rust.

#include <ATen/DeviceAccelerator.h>
#include <ATen/autocast_mode.h>
#include <c10/core/CachingDeviceAllocator.h>

#ifdef GPUCTL_SHIM_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>

extern "C" {

// Mirrors `AllocatorStats` in src/alloc.rs.
struct gpuctl_allocator_stats {
  int64_t allocated_bytes;
  int64_t allocated_peak_bytes;
  int64_t reserved_bytes;
  int64_t reserved_peak_bytes;
  int64_t active_bytes;
  int64_t num_alloc_retries;
  int64_t num_ooms;
};

}  // extern "C"

namespace {

void put_error(char* buffer, size_t size, const char* message) {
  if (buffer == nullptr || size == 0) {
    return;
  }
  std::snprintf(buffer, size, "%s", message);
}

// Runs `body`; a C++ exception becomes -1 and its message (the first line: libtorch appends
// a C++ backtrace that says nothing to the person reading a log).
template <typename F>
int guarded(char* error, size_t error_size, F body) noexcept {
  try {
    body();
    return 0;
  } catch (const c10::Error& e) {
    put_error(error, error_size, e.what_without_backtrace());
  } catch (const std::exception& e) {
    put_error(error, error_size, e.what());
  } catch (...) {
    put_error(error, error_size, "unknown C++ exception");
  }
  return -1;
}

c10::DeviceAllocator* accelerator_allocator() {
  const auto device_type = at::accelerator::getAccelerator(true).value();
  return at::getDeviceAllocator(device_type);
}

}  // namespace

extern "C" {

int gpuctl_shim_has_cuda() noexcept {
#ifdef GPUCTL_SHIM_CUDA
  return 1;
#else
  return 0;
#endif
}

int gpuctl_empty_cache(char* error, size_t error_size) noexcept {
  return guarded(error, error_size, [] { accelerator_allocator()->emptyCache(); });
}

int gpuctl_device_stats(int device, gpuctl_allocator_stats* out, char* error,
                        size_t error_size) noexcept {
  return guarded(error, error_size, [&] {
    const auto stats =
        accelerator_allocator()->getDeviceStats(static_cast<c10::DeviceIndex>(device));
    const auto aggregate =
        static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    out->allocated_bytes = stats.allocated_bytes[aggregate].current;
    out->allocated_peak_bytes = stats.allocated_bytes[aggregate].peak;
    out->reserved_bytes = stats.reserved_bytes[aggregate].current;
    out->reserved_peak_bytes = stats.reserved_bytes[aggregate].peak;
    out->active_bytes = stats.active_bytes[aggregate].current;
    out->num_alloc_retries = stats.num_alloc_retries;
    out->num_ooms = stats.num_ooms;
  });
}

int gpuctl_reset_peak_stats(int device, char* error, size_t error_size) noexcept {
  return guarded(error, error_size, [&] {
    accelerator_allocator()->resetPeakStats(static_cast<c10::DeviceIndex>(device));
  });
}

int gpuctl_memory_info(int device, uint64_t* free_bytes, uint64_t* total_bytes, char* error,
                       size_t error_size) noexcept {
  return guarded(error, error_size, [&] {
    const auto info =
        accelerator_allocator()->getMemoryInfo(static_cast<c10::DeviceIndex>(device));
    *free_bytes = info.first;
    *total_bytes = info.second;
  });
}

int gpuctl_set_memory_fraction(double fraction, int device, char* error,
                               size_t error_size) noexcept {
#ifdef GPUCTL_SHIM_CUDA
  return guarded(error, error_size, [&] {
    c10::cuda::CUDACachingAllocator::setMemoryFraction(
        fraction, static_cast<c10::DeviceIndex>(device));
  });
#else
  (void)fraction;
  (void)device;
  put_error(error, error_size,
            "gpuctl-trainer was built against a libtorch without CUDA");
  return -1;
#endif
}

int gpuctl_autocast_dtype_bf16(char* error, size_t error_size) noexcept {
  return guarded(error, error_size,
                 [] { at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16); });
}

}  // extern "C"
