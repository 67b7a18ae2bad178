// SPDX-License-Identifier: BSD-3-Clause
#include "tools/mpi/stress.h"

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include "tools/mpi/fabric.h"
#include "tools/mpi/key_ledger.h"
#include "tools/mpi/paths.h"
#include "tools/mpi/world.h"

namespace mrc_mpi {

namespace {

constexpr size_t kPage = 4096;
constexpr size_t kMaxPages = 64;  // 256 KiB: the emulated wire moves a few MB/s
constexpr unsigned kMaxProbes = 8;
constexpr unsigned kProbeStatuses = 24;  // ibv_wc_status values counted one by one
constexpr int kDataQp = 0;  // queue pair 0 carries the reads and writes, 1.. the probes

// What changes under a slot's buffer before it is exposed again.
enum Mutation : unsigned {
  kReplace,   // free (munmap) and allocate again: often the same address, new pages
  kMapFixed,  // mmap MAP_FIXED over the buffer: same address, new pages
  kMadvise,   // madvise(MADV_DONTNEED) of some pages: same mapping, new pages on next touch
  kRemap,     // mremap to a larger size, moving when it must
  kShrink,    // mremap to half its size in place: the tail is unmapped
  kFork,      // fork; the child writes over the buffer and exits: the parent's pages stay
  kMutations
};
constexpr const char *kMutationNames[kMutations] = {"replace", "map-fixed", "madvise",
                                                    "remap",   "shrink",    "fork"};

// Counters summed over the ranks at the end (MPI_UINT64_T, in this order).
struct Counters {
  uint64_t rounds = 0, gets = 0, remote_reads = 0, remote_writes = 0, remote_bytes = 0;
  uint64_t stale_reads = 0, stale_writes = 0, errors = 0;
  uint64_t probes = 0, valid_after_dereg = 0, leaks = 0;
  uint64_t probe_statuses[kProbeStatuses] = {};  // how the probes failed, by ibv_wc_status
  uint64_t registrations = 0;
  uint64_t mutations[kMutations] = {};
};
constexpr int kCounterWords = sizeof(Counters) / sizeof(uint64_t);

// A buffer exposed to the peers, as its owner sends it (MPI_BYTE).
struct Exposed {
  uint64_t addr = 0;
  uint32_t length = 0;
  uint32_t rkey = 0;
  uint32_t generation = 0;
  uint32_t slot = 0;
};

// What a reader tells the owner after its reads and writes (MPI_BYTE).
struct Verdict {
  uint32_t data_qp_failed = 0;  // both ends renew queue pair 0
  uint32_t probes = 0;          // both ends renew probe queue pairs 1..probes
};

struct ProbeList {
  uint32_t count = 0;
  KeyLedger::DeadKey keys[kMaxProbes];
};

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
// The words at the start and the end of page `page` of a buffer: the owner's before the read,
// the reader's after the write.
uint64_t owner_stamp(int owner, const Exposed &e, size_t page) {
  return mix((uint64_t{1} << 63) | uint64_t(owner) << 48 | uint64_t(e.slot) << 40 |
             uint64_t(e.generation) << 16 | page);
}
uint64_t reader_stamp(int reader, const Exposed &e, size_t page) {
  return mix(uint64_t(reader) << 48 | uint64_t(e.slot) << 40 | uint64_t(e.generation) << 16 | page);
}
void stamp(uint8_t *base, size_t length, uint64_t (*f)(int, const Exposed &, size_t), int who,
           const Exposed &e) {
  for (size_t page = 0; page * kPage < length; ++page) {
    const uint64_t word = f(who, e, page);
    uint8_t *p = base + page * kPage;
    const size_t end = std::min(length, (page + 1) * kPage);
    memcpy(p, &word, sizeof word);
    memcpy(base + end - sizeof word, &word, sizeof word);
  }
}
// The first page whose stamps are wrong, or -1.
long first_wrong_page(const uint8_t *base, size_t length,
                      uint64_t (*f)(int, const Exposed &, size_t), int who, const Exposed &e) {
  for (size_t page = 0; page * kPage < length; ++page) {
    const uint64_t want = f(who, e, page);
    uint64_t head, tail;
    const size_t end = std::min(length, (page + 1) * kPage);
    memcpy(&head, base + page * kPage, sizeof head);
    memcpy(&tail, base + end - sizeof tail, sizeof tail);
    if (head != want || tail != want) return static_cast<long>(page);
  }
  return -1;
}

void *map_anonymous(void *at, size_t length, int extra_flags) {
  void *p =
      mmap(at, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | extra_flags, -1, 0);
  if (p == MAP_FAILED) throw std::runtime_error(std::string("mmap: ") + strerror(errno));
  return p;
}

// One buffer of the owner's. heap: from aligned_alloc (glibc decides heap or mapping).
struct Slot {
  uint8_t *addr = nullptr;
  size_t length = 0;
  bool heap = false;
  uint32_t generation = 0;
};

class Owner {
 public:
  Owner(unsigned slots, uint64_t seed, unsigned mutations)
      : slots_(slots), rng_(seed), mutations_(mutations) {
    for (Slot &s : slots_) allocate(s);
  }
  ~Owner() {
    for (Slot &s : slots_) release(s);
  }
  std::vector<Slot> &slots() { return slots_; }

  // Changes the memory under some slots; counts what it did.
  void mutate(double probability, Counters *counters) {
    std::uniform_real_distribution<double> coin(0, 1);
    for (Slot &s : slots_) {
      if (coin(rng_) >= probability) continue;
      if ((mutations_ & ((1U << kMutations) - 1)) == 0) return;
      auto m = static_cast<Mutation>(rng_() % kMutations);
      while ((mutations_ & (1U << m)) == 0) m = static_cast<Mutation>((m + 1) % kMutations);
      if (s.heap && m != kFork) m = kReplace;  // the allocator owns the mapping
      apply(s, m);
      ++counters->mutations[m];
    }
  }

 private:
  void allocate(Slot &s) {
    const size_t pages = rng_() % 10 == 0 ? 8 + rng_() % (kMaxPages - 7) : 1 + rng_() % 4;
    s.length = pages * kPage;
    s.heap = rng_() % 3 == 0;
    s.addr = static_cast<uint8_t *>(s.heap ? aligned_alloc(kPage, s.length)
                                           : map_anonymous(nullptr, s.length, 0));
    if (s.addr == nullptr) throw std::runtime_error("aligned_alloc failed");
  }
  void release(Slot &s) {
    if (s.heap) {
      free(s.addr);
    } else {
      munmap(s.addr, s.length);
    }
    s.addr = nullptr;
  }
  void apply(Slot &s, Mutation m) {
    switch (m) {
      case kReplace:
        release(s);
        allocate(s);
        break;
      case kMapFixed: map_anonymous(s.addr, s.length, MAP_FIXED); break;
      case kMadvise: {
        const size_t pages = s.length / kPage, first = rng_() % pages;
        const size_t count = 1 + rng_() % (pages - first);
        if (madvise(s.addr + first * kPage, count * kPage, MADV_DONTNEED) != 0) {
          throw std::runtime_error(std::string("madvise: ") + strerror(errno));
        }
        break;
      }
      case kRemap: {
        const size_t grown = std::min(kMaxPages * kPage, s.length + (1 + rng_() % 4) * kPage);
        void *p = mremap(s.addr, s.length, grown, MREMAP_MAYMOVE);
        if (p == MAP_FAILED) throw std::runtime_error(std::string("mremap: ") + strerror(errno));
        s.addr = static_cast<uint8_t *>(p);
        s.length = grown;
        break;
      }
      case kShrink:
        if (s.length > kPage) {
          const size_t half = (s.length / kPage / 2) * kPage;
          if (mremap(s.addr, s.length, half, 0) == MAP_FAILED) {
            throw std::runtime_error(std::string("mremap (shrink): ") + strerror(errno));
          }
          s.length = half;
        }
        break;
      case kFork: {
        const pid_t child = ::fork();
        if (child < 0) throw std::runtime_error(std::string("fork: ") + strerror(errno));
        if (child == 0) {
          memset(s.addr, 0xEE, s.length);
          _exit(0);
        }
        int status = 0;
        waitpid(child, &status, 0);
        break;
      }
      case kMutations: break;
    }
  }

  std::vector<Slot> slots_;
  std::mt19937_64 rng_;
  unsigned mutations_;
};

// The landing buffer a reader reads into and writes from: one kMaxPages area per slot,
// registered once, outside any cache.
class Landing {
 public:
  Landing(ibv_pd *pd, unsigned slots) : length_(size_t{slots} * kMaxPages * kPage) {
    base_ = static_cast<uint8_t *>(map_anonymous(nullptr, length_, 0));
    mr_ = ibv_reg_mr(pd, base_, length_, IBV_ACCESS_LOCAL_WRITE);
    if (mr_ == nullptr) throw std::runtime_error(std::string("ibv_reg_mr: ") + strerror(errno));
  }
  ~Landing() {
    ibv_dereg_mr(mr_);
    munmap(base_, length_);
  }
  uint8_t *area(unsigned slot) const { return base_ + size_t{slot} * kMaxPages * kPage; }
  uint32_t lkey() const { return mr_->lkey; }

 private:
  size_t length_;
  uint8_t *base_ = nullptr;
  ibv_mr *mr_ = nullptr;
};

class StressRun {
 public:
  StressRun(const StressOptions &o, MPI_Comm comm)
      : o_(o),
        comm_(comm),
        fabric_(comm, o.device, o.gid_index, 1 + 2 * static_cast<int>(o.probes)),
        ledger_(fabric_.pd()),
        path_(make_path(o.path, &ledger_)),
        owner_(o.slots, o.seed * 7919 + static_cast<uint64_t>(fabric_.rank()), o.mutations),
        landing_(fabric_.pd(), o.slots),
        exposed_(o.slots),
        incoming_(o.slots),
        registrations_(o.slots) {}

  void round(int offset, bool probe) {
    const int n = fabric_.size(), me = fabric_.rank();
    const int owner = (me + offset) % n, reader = (me - offset + n) % n;
    owner_.mutate(o_.mutate, &c_);
    expose();
    MPI_Sendrecv(exposed_.data(), bytes(exposed_), MPI_BYTE, reader, 1, incoming_.data(),
                 bytes(incoming_), MPI_BYTE, owner, 1, comm_, MPI_STATUS_IGNORE);
    Verdict mine = read_and_write(owner);
    ProbeList sent, received;
    if (probe) {
      sent = take_probes();
      MPI_Sendrecv(&sent, sizeof sent, MPI_BYTE, reader, 2, &received, sizeof received, MPI_BYTE,
                   owner, 2, comm_, MPI_STATUS_IGNORE);
      mine.probes = try_dead_keys(owner, received);
    }
    Verdict theirs;
    MPI_Sendrecv(&mine, sizeof mine, MPI_BYTE, owner, 3, &theirs, sizeof theirs, MPI_BYTE, reader,
                 3, comm_, MPI_STATUS_IGNORE);
    if (theirs.data_qp_failed == 0) check_own_memory(reader);
    for (Registration &r : registrations_) path_->put(r);
    renew(owner, mine, reader, theirs);
    ++c_.rounds;
  }

  // After the last round: the path releases everything, every key is tried once more.
  void finish() {
    path_.reset();
    c_.registrations = ledger_.registrations();
    c_.leaks = ledger_.live();
    const int n = fabric_.size(), me = fabric_.rank();
    for (int offset = 1; offset < n; ++offset) {
      const int owner = (me + offset) % n, reader = (me - offset + n) % n;
      ProbeList sent = take_probes(), received;
      MPI_Sendrecv(&sent, sizeof sent, MPI_BYTE, reader, 4, &received, sizeof received, MPI_BYTE,
                   owner, 4, comm_, MPI_STATUS_IGNORE);
      Verdict mine, theirs;
      mine.probes = try_dead_keys(owner, received);
      MPI_Sendrecv(&mine, sizeof mine, MPI_BYTE, owner, 5, &theirs, sizeof theirs, MPI_BYTE, reader,
                   5, comm_, MPI_STATUS_IGNORE);
      renew(owner, mine, reader, theirs);
    }
  }

  const Counters &counters() const { return c_; }
  const std::string &first_problem() const { return first_problem_; }

 private:
  template <typename T>
  static int bytes(const std::vector<T> &v) {
    return static_cast<int>(v.size() * sizeof(T));
  }

  // Every queue pair that saw an error, at both its ends, before its next use.
  void renew(int owner, const Verdict &mine, int reader, const Verdict &theirs) {
    auto failed = [this](const Verdict &v, int reader_rank, int owner_rank) {
      std::vector<int> indexes;
      if (v.data_qp_failed != 0) indexes.push_back(kDataQp);
      for (uint32_t i = 0; i < v.probes; ++i)
        indexes.push_back(probe_qp(reader_rank, owner_rank, i));
      return indexes;
    };
    const int me = fabric_.rank();
    fabric_.renew(comm_, owner, failed(mine, me, owner), reader, failed(theirs, reader, me));
  }

  void problem(const std::string &what) {
    if (first_problem_.empty())
      first_problem_ = "rank " + std::to_string(fabric_.rank()) + ": " + what;
  }

  void expose() {
    auto &slots = owner_.slots();
    for (unsigned i = 0; i < slots.size(); ++i) {
      Slot &s = slots[i];
      Exposed &e = exposed_[i];
      e = {reinterpret_cast<uint64_t>(s.addr), static_cast<uint32_t>(s.length), 0, ++s.generation,
           i};
      stamp(s.addr, s.length, owner_stamp, fabric_.rank(), e);
      registrations_[i] = path_->get(s.addr, s.length);
      e.rkey = registrations_[i].rkey;
      ++c_.gets;
    }
  }

  Verdict read_and_write(int owner) {
    Verdict verdict;
    std::vector<RdmaOp> ops;
    for (unsigned i = 0; i < incoming_.size(); ++i) {
      const Exposed &e = incoming_[i];
      ops.push_back(
          {IBV_WR_RDMA_READ, landing_.area(i), landing_.lkey(), e.addr, e.rkey, e.length});
    }
    if (!completed(fabric_.run(owner, kDataQp, ops), "read", owner)) {
      verdict.data_qp_failed = 1;
      return verdict;
    }
    for (unsigned i = 0; i < incoming_.size(); ++i) {
      const Exposed &e = incoming_[i];
      ++c_.remote_reads;
      c_.remote_bytes += e.length;
      if (long page = first_wrong_page(landing_.area(i), e.length, owner_stamp, owner, e);
          page >= 0) {
        ++c_.stale_reads;
        problem("stale READ of rank " + std::to_string(owner) + "'s slot " +
                std::to_string(e.slot) + " (generation " + std::to_string(e.generation) +
                "), page " + std::to_string(page) + " of " + std::to_string(e.length / kPage));
      }
      stamp(landing_.area(i), e.length, reader_stamp, fabric_.rank(), e);
      ops[i].opcode = IBV_WR_RDMA_WRITE;
    }
    if (!completed(fabric_.run(owner, kDataQp, ops), "write", owner)) {
      verdict.data_qp_failed = 1;
      return verdict;
    }
    c_.remote_writes += incoming_.size();
    for (const Exposed &e : incoming_) c_.remote_bytes += e.length;
    return verdict;
  }

  bool completed(const std::vector<ibv_wc_status> &statuses, const char *what, int peer) {
    for (ibv_wc_status s : statuses) {
      if (s == IBV_WC_SUCCESS) continue;
      ++c_.errors;
      problem(std::string("RDMA ") + what + " of rank " + std::to_string(peer) +
              "'s memory failed: " + ibv_wc_status_str(s));
      return false;
    }
    return true;
  }

  void check_own_memory(int reader) {
    auto &slots = owner_.slots();
    for (unsigned i = 0; i < slots.size(); ++i) {
      if (long page =
              first_wrong_page(slots[i].addr, slots[i].length, reader_stamp, reader, exposed_[i]);
          page >= 0) {
        ++c_.stale_writes;
        problem("rank " + std::to_string(reader) + "'s RDMA WRITE into slot " + std::to_string(i) +
                " (generation " + std::to_string(exposed_[i].generation) +
                ") is not in memory, page " + std::to_string(page) + " of " +
                std::to_string(slots[i].length / kPage));
      }
    }
  }

  ProbeList take_probes() {
    ProbeList list;
    const auto keys = ledger_.take_dead(std::min(o_.probes, kMaxProbes));
    list.count = static_cast<uint32_t>(keys.size());
    std::copy(keys.begin(), keys.end(), list.keys);
    return list;
  }

  // The queue pair of probe i from reader to owner. The two directions between two ranks use
  // different ones: a probe's error ends its queue pair at both ends, and would flush a probe
  // the other way that shared it.
  int probe_qp(int reader, int owner, uint32_t i) const {
    return 1 + (reader < owner ? 0 : static_cast<int>(o_.probes)) + static_cast<int>(i);
  }

  // Each key on a queue pair of its own: the first error puts a queue pair in the error state.
  uint32_t try_dead_keys(int owner, const ProbeList &list) {
    for (uint32_t i = 0; i < list.count; ++i) {
      const KeyLedger::DeadKey &key = list.keys[i];
      const std::vector<RdmaOp> op = {
          {IBV_WR_RDMA_READ, landing_.area(0), landing_.lkey(), key.addr, key.rkey, 8}};
      const ibv_wc_status status = fabric_.run(owner, probe_qp(fabric_.rank(), owner, i), op)[0];
      ++c_.probes;
      if (status == IBV_WC_SUCCESS) {
        ++c_.valid_after_dereg;
        problem("rank " + std::to_string(owner) + "'s key " + std::to_string(key.rkey) +
                " still reads after its deregistration");
      } else {
        ++c_.probe_statuses[std::min<unsigned>(status, kProbeStatuses - 1)];
      }
    }
    return list.count;
  }

  const StressOptions &o_;
  MPI_Comm comm_;
  Fabric fabric_;
  KeyLedger ledger_;
  std::unique_ptr<RegPath> path_;
  Owner owner_;
  Landing landing_;
  std::vector<Exposed> exposed_, incoming_;
  std::vector<Registration> registrations_;
  Counters c_;
  std::string first_problem_;
};

}  // namespace

bool parse_mutations(const std::string &list, unsigned *mask) {
  if (list == "all") {
    *mask = (1U << kMutations) - 1;
    return true;
  }
  *mask = 0;
  for (size_t start = 0; start <= list.size();) {
    const size_t end = std::min(list.find(',', start), list.size());
    const std::string name = list.substr(start, end - start);
    unsigned m = 0;
    while (m < kMutations && name != kMutationNames[m]) ++m;
    if (m == kMutations) return false;
    *mask |= 1U << m;
    start = end + 1;
  }
  return true;
}

int run_stress(const StressOptions &o, MPI_Comm comm) {
  const World world(comm);
  if (world.size < 2) {
    if (world.rank == 0) fprintf(stderr, "mrcache-mpi stress: needs at least 2 ranks\n");
    return 2;
  }
  StressRun run(o, comm);
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  double next_report = 10;
  for (uint64_t round = 0;; ++round) {
    int go = o.rounds != 0 ? round < o.rounds : elapsed() < o.seconds;
    MPI_Bcast(&go, 1, MPI_INT, 0, comm);
    if (go == 0) break;
    // Each round every rank reads the buffers of the rank `offset` ahead: over the rounds,
    // every other rank, on its own node and on the others.
    const int offset = 1 + static_cast<int>(round % static_cast<uint64_t>(world.size - 1));
    const bool probe = o.probe_every != 0 && round % o.probe_every == o.probe_every - 1;
    run.round(offset, probe);
    if (world.rank == 0 && elapsed() >= next_report) {
      const Counters &c = run.counters();
      printf(
          "mrcache-mpi stress: %.0f s, rank 0: %lu rounds, %lu remote reads, %lu writes, %lu "
          "stale\n",
          elapsed(), static_cast<unsigned long>(c.rounds),
          static_cast<unsigned long>(c.remote_reads), static_cast<unsigned long>(c.remote_writes),
          static_cast<unsigned long>(c.stale_reads + c.stale_writes));
      fflush(stdout);
      next_report += 10;
    }
  }
  run.finish();
  const double seconds = elapsed();

  Counters sum;
  MPI_Reduce(&run.counters(), &sum, kCounterWords, MPI_UINT64_T, MPI_SUM, 0, comm);
  // The first problem any rank saw, for the report.
  std::array<char, 512> problem{}, first{};
  snprintf(problem.data(), problem.size(), "%s", run.first_problem().c_str());
  std::vector<char> all(world.rank == 0 ? problem.size() * static_cast<size_t>(world.size) : 0);
  MPI_Gather(problem.data(), static_cast<int>(problem.size()), MPI_CHAR, all.data(),
             static_cast<int>(problem.size()), MPI_CHAR, 0, comm);
  int failed = 0;
  if (world.rank == 0) {
    for (int r = 0; r < world.size && first[0] == '\0'; ++r) {
      memcpy(first.data(), &all[static_cast<size_t>(r) * problem.size()], first.size());
    }
    const uint64_t bad =
        sum.stale_reads + sum.stale_writes + sum.errors + sum.valid_after_dereg + sum.leaks;
    failed = bad != 0;
    printf("mrcache-mpi stress: path %s, %d ranks on %d nodes, %lu rounds in %.1f s\n",
           o.path.c_str(), world.size, world.nodes,
           static_cast<unsigned long>(sum.rounds / static_cast<uint64_t>(world.size)), seconds);
    printf(
        "  remote operations %lu (reads %lu, writes %lu, %.1f MiB), gets %lu, registrations %lu\n",
        static_cast<unsigned long>(sum.remote_reads + sum.remote_writes),
        static_cast<unsigned long>(sum.remote_reads), static_cast<unsigned long>(sum.remote_writes),
        static_cast<double>(sum.remote_bytes) / (1 << 20), static_cast<unsigned long>(sum.gets),
        static_cast<unsigned long>(sum.registrations));
    printf("  mutations:");
    for (unsigned m = 0; m < kMutations; ++m) {
      printf(" %s %lu", kMutationNames[m], static_cast<unsigned long>(sum.mutations[m]));
    }
    printf("\n  stale reads %lu, stale writes %lu, errors %lu, leaks %lu\n",
           static_cast<unsigned long>(sum.stale_reads),
           static_cast<unsigned long>(sum.stale_writes), static_cast<unsigned long>(sum.errors),
           static_cast<unsigned long>(sum.leaks));
    if (sum.probes == 0) {
      printf("  deregistered keys: none tried (--probes 0)\n");
    } else {
      printf("  deregistered keys: %lu tried, %lu still worked; the others failed with",
             static_cast<unsigned long>(sum.probes),
             static_cast<unsigned long>(sum.valid_after_dereg));
      for (unsigned st = 0; st < kProbeStatuses; ++st) {
        if (sum.probe_statuses[st] == 0) continue;
        printf(" %s %lu", ibv_wc_status_str(static_cast<ibv_wc_status>(st)),
               static_cast<unsigned long>(sum.probe_statuses[st]));
      }
      printf("\n");
    }
    if (first[0] != '\0') printf("  first problem: %s\n", first.data());
    printf("mrcache-mpi stress: %s\n", failed ? "FAILED" : "PASSED");
    fflush(stdout);
  }
  MPI_Bcast(&failed, 1, MPI_INT, 0, comm);
  return failed ? 1 : 0;
}

}  // namespace mrc_mpi
