// The allocator bridge: what tch does not expose of libtorch's caching device allocator
// (empty the cache, device statistics, reset peak marks, free/total memory, the per-process
// memory fraction) and the autocast dtype; and a counting CPU allocator, so host tensors have
// "allocated" and "peak" figures as cheap to read as the CUDA allocator's. Every function is noexcept at the C boundary:
// a C++ exception is caught here and returned as a message, never unwound into Rust.

#include <ATen/DeviceAccelerator.h>
#include <ATen/autocast_mode.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#ifdef GPUCTL_SHIM_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <atomic>
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

// Bytes of CPU tensor storage alive now, and the most alive at once since the last reset.
std::atomic<int64_t> host_current{0};
std::atomic<int64_t> host_peak{0};

// The allocation's size sits in a header before the data; 64 bytes keep c10's alignment.
// The data pointer is also the deleter's context, as raw_allocate() requires.
constexpr size_t kHeader = 64;

void counted_free(void* data) {
  if (data == nullptr) {
    return;
  }
  void* base = static_cast<char*>(data) - kHeader;
  const auto size = static_cast<int64_t>(*static_cast<size_t*>(base));
  host_current.fetch_sub(size, std::memory_order_relaxed);
  c10::free_cpu(base);
}

// libtorch's default CPU allocation (c10::alloc_cpu), counted. Installed with a priority
// above the default's, before the first tensor exists.
struct CountingCPUAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    void* base = c10::alloc_cpu(n + kHeader);
    *static_cast<size_t*>(base) = n;
    const auto now =
        host_current.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed) +
        static_cast<int64_t>(n);
    auto peak = host_peak.load(std::memory_order_relaxed);
    while (now > peak &&
           !host_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
    void* data = static_cast<char*>(base) + kHeader;
    return {data, data, &counted_free, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &counted_free; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

CountingCPUAllocator counting_cpu_allocator;

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

int gpuctl_count_host_allocations(char* error, size_t error_size) noexcept {
  return guarded(error, error_size,
                 [] { c10::SetCPUAllocator(&counting_cpu_allocator, /*priority=*/100); });
}

void gpuctl_host_stats(int64_t* current, int64_t* peak) noexcept {
  *current = host_current.load(std::memory_order_relaxed);
  *peak = host_peak.load(std::memory_order_relaxed);
}

void gpuctl_host_reset_peak() noexcept {
  host_peak.store(host_current.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

int gpuctl_autocast_dtype_bf16(char* error, size_t error_size) noexcept {
  return guarded(error, error_size,
                 [] { at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16); });
}

}  // extern "C"
