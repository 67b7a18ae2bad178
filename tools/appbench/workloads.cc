// SPDX-License-Identifier: BSD-3-Clause
// The application workloads (workloads.h).
#include "tools/appbench/workloads.h"

#include <malloc.h>
#include <sys/mman.h>
#include <time.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>

namespace appbench {

namespace {

constexpr size_t kKiB = 1024;
constexpr size_t kMiB = 1024 * kKiB;
constexpr size_t kPage = 4096;  // the stride at which a buffer is touched; any page size works

// Reads of registered memory go here, so that the compiler keeps the buffers and their use.
volatile unsigned char g_sink;

double now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

uint64_t next_random(uint64_t &state) {  // xorshift64*: cheap next to what it times
  state ^= state >> 12;
  state ^= state << 25;
  state ^= state >> 27;
  return state * 0x2545f4914f6cdd1dULL;
}

// Buffers as the workload's Allocation gives them.
class Buffers {
 public:
  explicit Buffers(Allocation allocation) : mappings_(allocation == Allocation::kMappings) {}
  unsigned char *allocate(size_t size) const {
    void *p = mappings_
                  ? mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
                  : malloc(size);
    if (p == nullptr || p == MAP_FAILED) throw std::bad_alloc();
    return static_cast<unsigned char *>(p);
  }
  void release(unsigned char *p, size_t size) const {
    if (mappings_) {
      if (p != nullptr) munmap(p, size);
    } else {
      free(p);
    }
  }

 private:
  bool mappings_;
};

// A warm-up of a tenth of the time, then `op(step)` until both minimums are met; the clock is
// read every `batch` ops (ops far cheaper than the clock read use a batch).
template <class Op>
Timing time_ops(const TimingConfig &config, unsigned batch, Op &&op) {
  uint64_t step = 0;
  const double warm_until = now() + config.min_seconds / 10;
  do op(step++);
  while (now() < warm_until || step < 2);
  Timing timing;
  const double start = now();
  double elapsed = 0;
  do {
    for (unsigned i = 0; i < batch; ++i) op(step++);
    timing.ops += batch;
    elapsed = now() - start;
  } while (elapsed < config.min_seconds || timing.ops < config.min_ops);
  timing.seconds = elapsed;
  return timing;
}

// A fresh buffer per message: allocate, fill, register, send (a read here), release, free.
Timing run_fresh(const Workload &w, Path &path, const TimingConfig &config) {
  const Buffers buffers(w.allocation);
  return time_ops(config, 1, [&](uint64_t step) {
    unsigned char *buffer = buffers.allocate(w.size);
    memset(buffer, static_cast<int>(step), w.size);
    void *token = path.get(buffer, w.size);
    g_sink = buffer[w.size / 2];
    path.put(token);
    buffers.release(buffer, w.size);
  });
}

// A large message sent in fragments, as a rendezvous pipeline sends it: allocate and fill the
// buffer, then register, send and release each fragment in turn, then free the buffer.
Timing run_pipeline(const Workload &w, Path &path, const TimingConfig &config) {
  const Buffers buffers(w.allocation);
  const size_t fragment = w.size / w.count;
  return time_ops(config, 1, [&](uint64_t step) {
    unsigned char *buffer = buffers.allocate(w.size);
    memset(buffer, static_cast<int>(step), w.size);
    for (size_t f = 0; f < w.count; ++f) {
      unsigned char *piece = buffer + f * fragment;
      void *token = path.get(piece, fragment);
      g_sink = piece[fragment / 2];
      path.put(token);
    }
    buffers.release(buffer, w.size);
  });
}

// A pool of buffers allocated once; each message takes a random one, writes a byte per page,
// registers it and sends.
class Pool {
 public:
  Pool(size_t count, size_t size) : size_(size) {
    for (size_t i = 0; i < count; ++i) {
      buffers_.push_back(static_cast<unsigned char *>(malloc(size)));
      if (buffers_.back() == nullptr) throw std::bad_alloc();
      memset(buffers_.back(), 0, size);
    }
  }
  ~Pool() {
    for (unsigned char *buffer : buffers_) free(buffer);
  }
  Pool(const Pool &) = delete;
  Pool &operator=(const Pool &) = delete;
  void message(Path &path, uint64_t &random) {
    unsigned char *buffer = buffers_[next_random(random) % buffers_.size()];
    for (size_t offset = 0; offset < size_; offset += kPage) buffer[offset] = 1;
    void *token = path.get(buffer, size_);
    g_sink = buffer[size_ - 1];
    path.put(token);
  }

 private:
  size_t size_;
  std::vector<unsigned char *> buffers_;
};

Timing run_pool(const Workload &w, Path &path, const TimingConfig &config) {
  Pool pool(w.count, w.size);
  uint64_t random = config.seed | 1;
  return time_ops(config, 64, [&](uint64_t) { pool.message(path, random); });
}

// Pool messages on this thread while another thread allocates and frees unrelated memory
// (4 KiB .. 512 KiB, eight live at a time): in an arena of its own by default, in the pool's
// arena under Allocation::kMallocOneArena. Its frees trim heaps and unmap mappings the pool's
// registrations never covered.
Timing run_pool_churn(const Workload &w, Path &path, const TimingConfig &config) {
  Pool pool(w.count, w.size);
  std::atomic<bool> stop{false};
  std::thread churn([&stop, seed = config.seed] {
    uint64_t random = (seed * 0x9e3779b97f4a7c15ULL) | 1;
    unsigned char *live[8] = {};
    for (size_t i = 0; !stop.load(std::memory_order_relaxed); i = (i + 1) % 8) {
      free(live[i]);
      const size_t size = 4 * kKiB << (next_random(random) % 8);
      live[i] = static_cast<unsigned char *>(malloc(size));
      if (live[i] != nullptr) live[i][0] = live[i][size - 1] = 1;
    }
    for (unsigned char *p : live) free(p);
  });
  uint64_t random = config.seed | 1;
  Timing timing;
  try {
    timing = time_ops(config, 64, [&](uint64_t) { pool.message(path, random); });
  } catch (...) {
    stop = true;
    churn.join();
    throw;
  }
  stop = true;
  churn.join();
  return timing;
}

// One step of a halo exchange: compute into a temporary (allocated and freed every step, never
// registered), pack each face from it, register the face and send it. Every `every` steps the
// faces are freed and allocated again (a new decomposition, an adaptive mesh).
Timing run_halo(const Workload &w, Path &path, const TimingConfig &config) {
  const Buffers buffers(w.allocation);
  std::vector<unsigned char *> faces(w.count);
  struct ReleaseFaces {
    const Buffers &buffers;
    std::vector<unsigned char *> &faces;
    size_t size;
    ~ReleaseFaces() {
      for (unsigned char *face : faces) buffers.release(face, size);
    }
  } release_faces{buffers, faces, w.size};
  for (unsigned char *&face : faces) face = buffers.allocate(w.size);
  const size_t temporary_size = 2 * w.size;
  return time_ops(config, 1, [&](uint64_t step) {
    if (step != 0 && step % w.every == 0) {
      for (unsigned char *&face : faces) {
        buffers.release(face, w.size);
        face = nullptr;
      }
      for (unsigned char *&face : faces) face = buffers.allocate(w.size);
    }
    unsigned char *temporary = buffers.allocate(temporary_size);
    memset(temporary, static_cast<int>(step), temporary_size);
    for (size_t f = 0; f < faces.size(); ++f) {
      memcpy(faces[f], temporary + (f % 2) * w.size, w.size);
      void *token = path.get(faces[f], w.size);
      g_sink = faces[f][0];
      path.put(token);
    }
    buffers.release(temporary, temporary_size);
  });
}

std::vector<Workload> make_workloads() {
  std::vector<Workload> list;
  const std::pair<const char *, size_t> sizes[] = {
      {"64K", 64 * kKiB}, {"1M", kMiB}, {"16M", 16 * kMiB}};
  for (auto [label, size] : sizes) {
    list.push_back({std::string("fresh/") + label,
                    "a fresh buffer per message, glibc's malloc (heap after the first free)",
                    Allocation::kMalloc, &run_fresh, size});
  }
  for (auto [label, size] : sizes) {
    list.push_back({std::string("fresh-mmap/") + label,
                    "a fresh buffer per message, each a new mapping", Allocation::kMappings,
                    &run_fresh, size});
  }
  for (Allocation allocation : {Allocation::kMalloc, Allocation::kMappings}) {
    const bool mappings = allocation == Allocation::kMappings;
    list.push_back({mappings ? "pipeline-mmap/16Mx1M" : "pipeline/16Mx1M",
                    std::string("a fresh 16 MiB buffer per message, sent in 16 fragments of 1 MiB, "
                                "each registered in turn") +
                        (mappings ? ", each buffer a new mapping" : ", glibc's malloc"),
                    allocation, &run_pipeline, 16 * kMiB, 16});
  }
  list.push_back({"pool/64x64K", "64 buffers of 64 KiB, random get/use/put", Allocation::kMalloc,
                  &run_pool, 64 * kKiB, 64});
  list.push_back({"pool-churn/other-arena",
                  "pool messages beside a thread that mallocs/frees in an arena of its own",
                  Allocation::kMalloc, &run_pool_churn, 64 * kKiB, 64});
  list.push_back({"pool-churn/same-arena",
                  "pool messages beside a thread that mallocs/frees in the pool's arena",
                  Allocation::kMallocOneArena, &run_pool_churn, 64 * kKiB, 64});
  for (Allocation allocation : {Allocation::kMalloc, Allocation::kMappings}) {
    for (unsigned every : {1u, 10u, 100u}) {
      const bool mappings = allocation == Allocation::kMappings;
      list.push_back({std::string(mappings ? "halo-mmap/k" : "halo/k") + std::to_string(every),
                      std::string("halo step: 6 faces of 128 KiB packed from a 256 KiB "
                                  "temporary, re-allocated every ") +
                          std::to_string(every) + " steps" +
                          (mappings ? ", each a new mapping" : ", glibc's malloc"),
                      allocation, &run_halo, 128 * kKiB, 6, every});
    }
  }
  return list;
}

}  // namespace

const std::vector<Workload> &workloads() {
  static const std::vector<Workload> list = make_workloads();
  return list;
}

const Workload *find_workload(const std::string &name) {
  for (const Workload &w : workloads()) {
    if (w.name == name) return &w;
  }
  return nullptr;
}

void configure_allocator(Allocation allocation) {
  if (allocation == Allocation::kMallocOneArena) mallopt(M_ARENA_MAX, 1);
}

}  // namespace appbench
