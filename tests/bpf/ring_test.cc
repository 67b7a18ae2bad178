// SPDX-License-Identifier: BSD-3-Clause
// The consumer of a BPF ring of address-space changes (bpf/ring.h), against a producer that
// writes the kernel's layout (a reserved record's header carries the busy bit until it is
// committed; the data area is mapped twice back to back), and against a real BPF ring buffer
// map where this process may create one.
#include <linux/bpf.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "bpf/ring.h"

namespace mrc::bpf {
namespace {

constexpr size_t kPage = 4096;
using Drained = RingConsumer::Drained;

// A ring laid out as the kernel lays it out, written as a BPF program's reserve and submit do.
class FakeRing {
 public:
  explicit FakeRing(size_t size) : size_(size) {
    positions_ = static_cast<uint8_t *>(
        mmap(nullptr, 2 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    const int fd = memfd_create("fake-ring", 0);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(size)), 0);
    data_ = static_cast<uint8_t *>(
        mmap(nullptr, 2 * size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    for (size_t half = 0; half < 2; ++half) {
      EXPECT_NE(
          mmap(data_ + half * size, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0),
          MAP_FAILED);
    }
    close(fd);
  }
  ~FakeRing() {
    munmap(positions_, 2 * kPage);
    munmap(data_, 2 * size_);
  }
  RingLayout layout(bool with_lost = true) {
    return RingLayout{consumer(), producer(), data_, size_, with_lost ? &lost : nullptr};
  }
  // Reserves room for `length` bytes: false when the consumer has not freed enough.
  bool reserve(uint32_t length, uint64_t *at) {
    const uint64_t position = producer()->load(std::memory_order_relaxed);
    const uint64_t bytes = (length + RingConsumer::kHeaderBytes + 7) & ~uint64_t{7};
    if (position + bytes - consumer()->load(std::memory_order_acquire) > size_) return false;
    header(position)->store(length | RingConsumer::kBusyBit, std::memory_order_relaxed);
    producer()->store(position + bytes, std::memory_order_release);
    *at = position;
    return true;
  }
  void commit(uint64_t at, const void *body, uint32_t length, bool discard = false) {
    std::memcpy(data_ + (at & (size_ - 1)) + RingConsumer::kHeaderBytes, body, length);
    header(at)->store(length | (discard ? RingConsumer::kDiscardBit : 0),
                      std::memory_order_release);
  }
  bool write(const ChangeRecord &record) {
    uint64_t at = 0;
    if (!reserve(sizeof record, &at)) return false;
    commit(at, &record, sizeof record);
    return true;
  }
  std::atomic<uint64_t> *consumer() {
    return reinterpret_cast<std::atomic<uint64_t> *>(positions_);
  }
  std::atomic<uint64_t> *producer() {
    return reinterpret_cast<std::atomic<uint64_t> *>(positions_ + kPage);
  }
  std::atomic<uint64_t> lost{0};

 private:
  std::atomic<uint32_t> *header(uint64_t at) {
    return reinterpret_cast<std::atomic<uint32_t> *>(data_ + (at & (size_ - 1)));
  }
  size_t size_;
  uint8_t *positions_ = nullptr;
  uint8_t *data_ = nullptr;
};

ChangeRecord unmap_of(uint64_t start, uint64_t end) {
  return ChangeRecord{static_cast<uint32_t>(ChangeKind::Unmap), 0, start, end};
}

std::vector<ChangeRecord> drain_all(RingConsumer &consumer, Drained *result = nullptr) {
  std::vector<ChangeRecord> records;
  const Drained drained =
      consumer.drain([&records](const ChangeRecord &record) { records.push_back(record); });
  if (result != nullptr) *result = drained;
  return records;
}

TEST(RingConsumer, AnEmptyRingIsQuiet) {
  FakeRing ring(kPage);
  RingConsumer consumer(ring.layout());
  EXPECT_TRUE(consumer.quiet());
  Drained drained{};
  EXPECT_TRUE(drain_all(consumer, &drained).empty());
  EXPECT_EQ(drained, Drained::Ok);
}

TEST(RingConsumer, ARecordIsUnquietUntilDrainedThenFreesItsRoom) {
  FakeRing ring(kPage);
  RingConsumer consumer(ring.layout());
  ASSERT_TRUE(ring.write(unmap_of(0x1000, 0x3000)));
  EXPECT_FALSE(consumer.quiet());
  Drained drained{};
  const std::vector<ChangeRecord> records = drain_all(consumer, &drained);
  EXPECT_EQ(drained, Drained::Ok);
  ASSERT_EQ(records.size(), 1U);
  EXPECT_EQ(records[0].kind, static_cast<uint32_t>(ChangeKind::Unmap));
  EXPECT_EQ(records[0].start, 0x1000U);
  EXPECT_EQ(records[0].end, 0x3000U);
  EXPECT_TRUE(consumer.quiet());
  // The kernel's consumer position moved too: the producer may reuse the room.
  EXPECT_EQ(ring.consumer()->load(), ring.producer()->load());
}

TEST(RingConsumer, ADiscardedRecordIsSkipped) {
  FakeRing ring(kPage);
  RingConsumer consumer(ring.layout());
  uint64_t at = 0;
  const ChangeRecord ignored = unmap_of(1, 2);
  ASSERT_TRUE(ring.reserve(sizeof ignored, &at));
  ring.commit(at, &ignored, sizeof ignored, /*discard=*/true);
  ASSERT_TRUE(ring.write(unmap_of(3, 4)));
  const std::vector<ChangeRecord> records = drain_all(consumer);
  ASSERT_EQ(records.size(), 1U);
  EXPECT_EQ(records[0].start, 3U);
  EXPECT_TRUE(consumer.quiet());
}

// Rule 3: a record reserved but not committed is a change in flight. Nothing after it is
// applied (records are applied in order), and the ring is not quiet until it is committed.
TEST(RingConsumer, AReservedRecordStopsTheDrainUntilCommitted) {
  FakeRing ring(kPage);
  RingConsumer consumer(ring.layout());
  uint64_t first = 0;
  ASSERT_TRUE(ring.reserve(sizeof(ChangeRecord), &first));
  ASSERT_TRUE(ring.write(unmap_of(5, 6)));
  Drained drained{};
  EXPECT_TRUE(drain_all(consumer, &drained).empty());
  EXPECT_EQ(drained, Drained::Busy);
  EXPECT_FALSE(consumer.quiet());
  const ChangeRecord record = unmap_of(1, 2);
  ring.commit(first, &record, sizeof record);
  const std::vector<ChangeRecord> records = drain_all(consumer, &drained);
  EXPECT_EQ(drained, Drained::Ok);
  ASSERT_EQ(records.size(), 2U);
  EXPECT_EQ(records[0].start, 1U);
  EXPECT_EQ(records[1].start, 5U);
  EXPECT_TRUE(consumer.quiet());
}

TEST(RingConsumer, RecordsThatWrapAroundTheDataAreaReadWhole) {
  FakeRing ring(kPage);  // 128 records of 32 bytes: 24-byte records wrap at uneven places
  RingConsumer consumer(ring.layout());
  uint64_t next = 0;
  for (int round = 0; round < 50; ++round) {
    for (int i = 0; i < 37; ++i, ++next) ASSERT_TRUE(ring.write(unmap_of(next, ~next)));
    uint64_t expected = next - 37;
    for (const ChangeRecord &record : drain_all(consumer)) {
      EXPECT_EQ(record.start, expected);
      EXPECT_EQ(record.end, ~expected);
      ++expected;
    }
    EXPECT_EQ(expected, next);
  }
  EXPECT_GT(ring.producer()->load(), 10 * kPage);  // went round the ring many times
}

// Rule 4: a dropped record is a change no one will hear of.
TEST(RingConsumer, AMovedLostCounterAsksForAPurgeAndStaysUnquietUntilIt) {
  FakeRing ring(kPage);
  RingConsumer consumer(ring.layout());
  ring.lost.fetch_add(1);
  EXPECT_FALSE(consumer.quiet());
  Drained drained{};
  drain_all(consumer, &drained);
  EXPECT_EQ(drained, Drained::Lost);
  EXPECT_FALSE(consumer.quiet()) << "quiet before the caller purged";
  consumer.purged();
  EXPECT_TRUE(consumer.quiet());
  drain_all(consumer, &drained);
  EXPECT_EQ(drained, Drained::Ok);
}

TEST(RingConsumer, ARecordNoProgramOfOursWritesAsksForAPurge) {
  FakeRing ring(kPage);
  RingConsumer consumer(ring.layout(/*with_lost=*/false));
  uint64_t at = 0;
  const uint64_t foreign[2] = {1, 2};
  ASSERT_TRUE(ring.reserve(sizeof foreign, &at));
  ring.commit(at, foreign, sizeof foreign);
  Drained drained{};
  EXPECT_TRUE(drain_all(consumer, &drained).empty());
  EXPECT_EQ(drained, Drained::Lost);
}

// Rules 1 and 2 under concurrency: a producer fills the ring while one thread drains under a
// lock and another checks quiet(); every record arrives once, in order (TSan checks the orders).
TEST(RingConsumer, AConcurrentProducerLosesNothingAndReordersNothing) {
  FakeRing ring(4 * kPage);
  RingConsumer consumer(ring.layout());
  constexpr uint64_t kRecords = 200000;
  std::atomic<bool> produced{false};
  std::thread producer([&] {
    for (uint64_t i = 0; i < kRecords;) {
      if (ring.write(unmap_of(i, i + 1))) ++i;
    }
    produced.store(true, std::memory_order_release);
  });
  std::thread checker([&] {
    while (!produced.load(std::memory_order_acquire)) (void)consumer.quiet();
  });
  std::mutex drain_mutex;  // rule 2: the caller's lock
  uint64_t expected = 0;
  bool in_order = true;
  while (expected < kRecords) {
    const std::lock_guard<std::mutex> lock(drain_mutex);
    consumer.drain([&](const ChangeRecord &record) {
      in_order = in_order && record.start == expected && record.end == expected + 1;
      ++expected;
    });
  }
  producer.join();
  checker.join();
  EXPECT_TRUE(in_order);
  EXPECT_EQ(expected, kRecords);
  EXPECT_TRUE(consumer.quiet());
}

TEST(MappedRing, RefusesASizeTheKernelWouldNot) {
  MappedRing ring;
  EXPECT_EQ(ring.map(-1, 3 * kPage), MRC_ERR_INVALID);
  EXPECT_EQ(ring.map(-1, 100), MRC_ERR_INVALID);
  EXPECT_EQ(ring.map(-1, kPage), MRC_ERR_IO);  // no such descriptor
}

int create_ring_map(uint32_t data_bytes) {
  union bpf_attr attr;
  std::memset(&attr, 0, sizeof attr);
  attr.map_type = BPF_MAP_TYPE_RINGBUF;
  attr.max_entries = data_bytes;
  return static_cast<int>(syscall(SYS_bpf, BPF_MAP_CREATE, &attr, sizeof attr));
}

// The kernel's ring: mapped as the layout says, empty and quiet; and the kernel refuses a
// writable mapping of the producer's side, which is what lets a process be handed its ring.
TEST(MappedRing, MapsAKernelRingBufferEmptyAndQuiet) {
  constexpr uint32_t kBytes = 16 * kPage;
  const int fd = create_ring_map(kBytes);
  if (fd < 0) {
    GTEST_SKIP() << "creating a BPF ring buffer map needs CAP_BPF (or root) and a kernel with "
                    "BPF_MAP_TYPE_RINGBUF: "
                 << std::strerror(errno);
  }
  MappedRing ring;
  ASSERT_EQ(ring.map(fd, kBytes), MRC_OK) << mrc_last_error();
  RingConsumer consumer(ring.layout());
  EXPECT_TRUE(consumer.quiet());
  Drained drained{};
  EXPECT_TRUE(drain_all(consumer, &drained).empty());
  EXPECT_EQ(drained, Drained::Ok);
  void *writable = mmap(nullptr, kPage, PROT_READ | PROT_WRITE, MAP_SHARED, fd, kPage);
  EXPECT_EQ(writable, MAP_FAILED) << "the producer's page mapped writable";
  if (writable != MAP_FAILED) munmap(writable, kPage);
  ring.unmap();
  close(fd);
}

}  // namespace
}  // namespace mrc::bpf
