// SPDX-License-Identifier: BSD-3-Clause
// Mapping a BPF ring buffer's pages (ring.h).
#include "bpf/ring.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/error.h"

namespace mrc::bpf {

void RingConsumer::attach(const RingLayout &ring) noexcept {
  ring_ = ring;
  const uint64_t at = ring.consumer->load(std::memory_order_acquire);
  position_.store(at, std::memory_order_relaxed);
  const uint64_t lost = ring.lost != nullptr ? ring.lost->load(std::memory_order_acquire) : 0;
  lost_seen_.store(lost, std::memory_order_relaxed);
  lost_pending_ = lost;
}

mrc_status_t MappedRing::map(int ring_fd, size_t data_bytes) noexcept {
  const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  if (data_bytes == 0 || (data_bytes & (data_bytes - 1)) != 0 || data_bytes % page != 0) {
    set_last_error("bpf ring: %zu data bytes: not a power of two multiple of the page size",
                   data_bytes);
    return MRC_ERR_INVALID;
  }
  unmap();
  void *consumer = mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_SHARED, ring_fd, 0);
  if (consumer == MAP_FAILED) {
    set_last_error("bpf ring: mmap of the consumer page: %s", strerror(errno));
    return MRC_ERR_IO;
  }
  // The producer page and the data area twice (the kernel maps it so): read-only, as the kernel
  // insists for everything but the consumer page.
  const size_t rest_bytes = page + 2 * data_bytes;
  void *rest = mmap(nullptr, rest_bytes, PROT_READ, MAP_SHARED, ring_fd, static_cast<off_t>(page));
  if (rest == MAP_FAILED) {
    const int error = errno;
    munmap(consumer, page);
    set_last_error("bpf ring: mmap of the producer page and data: %s", strerror(error));
    return MRC_ERR_IO;
  }
  consumer_page_ = consumer;
  rest_ = rest;
  rest_bytes_ = rest_bytes;
  layout_.consumer = static_cast<std::atomic<uint64_t> *>(consumer);
  layout_.producer = static_cast<const std::atomic<uint64_t> *>(rest);
  layout_.data = static_cast<const uint8_t *>(rest) + page;
  layout_.size = data_bytes;
  return MRC_OK;
}

void MappedRing::unmap() noexcept {
  if (consumer_page_ != nullptr) munmap(consumer_page_, static_cast<size_t>(sysconf(_SC_PAGESIZE)));
  if (rest_ != nullptr) munmap(rest_, rest_bytes_);
  consumer_page_ = rest_ = nullptr;
  rest_bytes_ = 0;
  layout_ = RingLayout{};
}

}  // namespace mrc::bpf
