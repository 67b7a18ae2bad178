// SPDX-License-Identifier: BSD-3-Clause
#include "tools/stress/pool.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace stress {

std::string describe(const Mutation &m) {
  char buf[256];
  const double ms = static_cast<double>(m.time_ns) / 1e6;
  int n = std::snprintf(buf, sizeof buf, "t=%.3fms slot %d %-10s [%#lx, +%s) -> [%#lx, +%s)", ms,
                        m.slot, mutation_name(m.kind), static_cast<unsigned long>(m.old_start),
                        format_size(m.old_len).c_str(), static_cast<unsigned long>(m.new_start),
                        format_size(m.new_len).c_str());
  if (m.range_len != 0 && n > 0 && static_cast<size_t>(n) < sizeof buf) {
    n += std::snprintf(buf + n, sizeof buf - static_cast<size_t>(n), " part [%#lx, +%s)",
                       static_cast<unsigned long>(m.range_start), format_size(m.range_len).c_str());
  }
  if (m.error != 0 && n > 0 && static_cast<size_t>(n) < sizeof buf) {
    std::snprintf(buf + n, sizeof buf - static_cast<size_t>(n), " refused: %s",
                  strerrordesc_np(m.error));
  }
  return buf;
}

Pool::Pool(const PoolConfig &config, uint64_t seed, uint64_t start_ns)
    : config_(config),
      count_(config.slots),
      private_count_(config.private_slots),
      slots_(new Slot[config.slots + config.private_slots]),
      start_ns_(start_ns),
      log_(kLogSize) {
  Rng rng(seed);
  for (size_t i = 0; i < count_ + private_count_; ++i) {
    Slot &slot = slots_[i];
    slot.index = static_cast<int>(i);
    slot.shared = rng.chance(config_.shared_fraction);
    if (i >= count_) slot.fixed_len = page_up(config_.private_len);
    slot.len = slot.fixed_len != 0 ? slot.fixed_len : random_len(rng);
    slot.start = map(slot.len, slot.shared, 0);
    if (slot.start == 0) {
      if (setup_error_.empty()) {
        setup_error_ = "mmap of " + format_size(slot.len) + (slot.shared ? " shared" : "") + ": " +
                       strerrordesc_np(errno);
      }
      slot.len = 0;
    }
  }
}

Pool::~Pool() {
  for (size_t i = 0; i < count_ + private_count_; ++i) {
    if (slots_[i].start != 0) munmap(reinterpret_cast<void *>(slots_[i].start), slots_[i].len);
  }
}

size_t Pool::random_len(Rng &rng) const {
  return page_up(rng.log_uniform(config_.min_size, config_.max_size));
}

void Pool::prepare(uintptr_t start, size_t len) {
  if (!config_.stable_frames) return;
  (void)madvise(reinterpret_cast<void *>(start), len, MADV_NOHUGEPAGE);
  (void)madvise(reinterpret_cast<void *>(start), len, MADV_DONTFORK);
}

uintptr_t Pool::map(size_t len, bool shared, uintptr_t fixed) {
  int flags = MAP_ANONYMOUS | (shared ? MAP_SHARED : MAP_PRIVATE);
  if (fixed != 0) flags |= MAP_FIXED;
  void *p = mmap(reinterpret_cast<void *>(fixed), len, PROT_READ | PROT_WRITE, flags, -1, 0);
  if (p == MAP_FAILED) return 0;
  const auto start = reinterpret_cast<uintptr_t>(p);
  prepare(start, len);
  return start;
}

void Pool::record(Slot &slot, const Mutation &mutation) {
  slot.history[slot.history_total % Slot::kHistory] = mutation;
  ++slot.history_total;
  slot.generation.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard lock(log_mutex_);
  log_[log_total_ % kLogSize] = mutation;
  ++log_total_;
  for (auto it = running_.begin(); it != running_.end(); ++it) {
    if (it->slot == mutation.slot) {
      running_.erase(it);
      break;
    }
  }
}

std::string Pool::in_flight(uintptr_t start, size_t len, uint64_t since_ns) const {
  auto touches = [&](uintptr_t s, uintptr_t l) {
    return l != 0 && s < start + len && start < s + l;
  };
  std::lock_guard lock(log_mutex_);
  for (const Mutation &m : running_) {
    if (touches(m.old_start, m.old_len)) {
      char buf[200];
      std::snprintf(buf, sizeof buf,
                    "slot %d's %s of [%#lx, +%s), begun at t=%.3fms, still running", m.slot,
                    mutation_name(m.kind), static_cast<unsigned long>(m.old_start),
                    format_size(m.old_len).c_str(), static_cast<double>(m.start_ns) / 1e6);
      return buf;
    }
  }
  // Every entry the log still holds (appended in about the order they finished): a get and its
  // check may take milliseconds on a busy machine while thousands of mutations finish, and an
  // unmap that finished after the get began is missed once it falls out of the ring.
  const uint64_t first = log_total_ > kLogSize ? log_total_ - kLogSize : 0;
  for (uint64_t i = log_total_; i > first; --i) {
    const Mutation &m = log_[(i - 1) % kLogSize];
    if (m.time_ns < since_ns) continue;
    if (touches(m.old_start, m.old_len) || touches(m.range_start, m.range_len)) {
      return describe(m) + " (begun t=" + std::to_string(static_cast<double>(m.start_ns) / 1e6) +
             "ms, finished after the get began)";
    }
  }
  return "";
}

namespace {

// Whether [start, start+len) is one VMA. mremap moves and resizes a range within one VMA only:
// across several, kernels before 6.17 refuse it (EFAULT), 6.17+ move VMA by VMA and may stop
// part-way, leaving a prefix at the target and free address space behind it that another
// thread may map at once, so that no cleanup is safe. A slot is split by the harness's own
// MAP_FIXED mutations (and by anything that watches part of it). Unknown (maps unreadable, or
// the line lost to a torn read): false, which only turns the mutation into a remap.
bool one_vma(uintptr_t start, size_t len) {
  std::FILE *maps = std::fopen("/proc/self/maps", "r");
  if (maps == nullptr) return false;
  bool whole = false;
  char line[512];
  while (std::fgets(line, sizeof line, maps) != nullptr) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line, "%lx-%lx", &lo, &hi) != 2) continue;
    if (lo <= start && start < hi) {
      whole = hi >= start + len;
      break;
    }
  }
  std::fclose(maps);
  return whole;
}

}  // namespace

Mutation Pool::mutate(Slot &slot, MutationKind kind, Rng &rng) {
  Mutation m;
  m.slot = slot.index;
  m.old_start = slot.start;
  m.old_len = slot.len;
  m.start_ns = now_ns() - start_ns_;
  const size_t page = page_size();
  const size_t pages = slot.len / page;

  // Kinds that do not apply to this mapping become the nearest one that does.
  if (slot.start == 0) kind = MutationKind::kRemap;
  if (kind == MutationKind::kGrow && (slot.shared || slot.len >= config_.max_size)) {
    // Growing a MAP_SHARED anonymous mapping would reach past its shmem object (SIGBUS).
    kind = slot.len >= config_.max_size ? MutationKind::kShrink : MutationKind::kRemap;
  }
  if ((kind == MutationKind::kShrink || kind == MutationKind::kUnmapTail) && pages < 2) {
    kind = MutationKind::kRemap;
  }
  if ((kind == MutationKind::kMove || kind == MutationKind::kGrow) &&
      !one_vma(slot.start, slot.len)) {
    kind = MutationKind::kRemap;  // see one_vma: a refused mremap could leave nothing to undo
  }
  m.kind = kind;
  {
    std::lock_guard lock(log_mutex_);
    running_.push_back(m);
  }

  auto random_part = [&] {
    const size_t first = rng.below(pages);
    const size_t count = rng.log_uniform(1, pages - first);
    m.range_start = slot.start + first * page;
    m.range_len = count * page;
  };

  void *const old_addr = reinterpret_cast<void *>(slot.start);
  // A fresh mapping in place of the old one (remap; and after a failed grow or shrink, which
  // leave the mapping as it was, so that a slot the kernel refuses to resize does not stay
  // stuck).
  auto replace = [&] {
    const int saved = errno;
    if (slot.start != 0) munmap(old_addr, slot.len);
    const bool shared = rng.chance(config_.shared_fraction);
    const size_t len = slot.fixed_len != 0 ? slot.fixed_len : random_len(rng);
    const uintptr_t start = map(len, shared, 0);
    slot.start = start;
    slot.len = start != 0 ? len : 0;
    slot.shared = shared;
    errno = start != 0 ? saved : errno;
    return start != 0;
  };
  switch (kind) {
    case MutationKind::kRemap:
      if (!replace()) m.error = errno;
      break;
    case MutationKind::kMove: {
      // A reservation elsewhere, then MREMAP_FIXED onto it: the move is certain.
      void *target =
          mmap(nullptr, slot.len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (target == MAP_FAILED) {
        m.error = errno;
        break;
      }
      void *moved = mremap(old_addr, slot.len, slot.len, MREMAP_MAYMOVE | MREMAP_FIXED, target);
      if (moved == MAP_FAILED) {
        m.error = errno;
        // One VMA does not move part-way: the slot is intact. The kernel may already have
        // unmapped the reservation (mremap_to clears the target before it checks the source),
        // and another thread may have mapped there since: leave it alone (address space only,
        // PROT_NONE and MAP_NORESERVE; counted among the refused moves) rather than risk
        // unmapping someone else's memory.
        replace();
        break;
      }
      slot.start = reinterpret_cast<uintptr_t>(moved);
      break;
    }
    case MutationKind::kShrink: {
      const size_t len = (1 + rng.below(pages - 1)) * page;
      if (mremap(old_addr, slot.len, len, 0) == MAP_FAILED) {
        m.error = errno;
        replace();
        break;
      }
      m.range_start = slot.start + len;
      m.range_len = slot.len - len;
      slot.len = len;
      break;
    }
    case MutationKind::kGrow: {
      const size_t len =
          std::min<size_t>(page_up(config_.max_size), slot.len + page * (1 + rng.below(pages)));
      void *grown = mremap(old_addr, slot.len, len, MREMAP_MAYMOVE);
      if (grown == MAP_FAILED) {
        m.error = errno;
        replace();
        break;
      }
      slot.start = reinterpret_cast<uintptr_t>(grown);
      prepare(slot.start, len);
      slot.len = len;
      break;
    }
    case MutationKind::kUnmapTail: {
      const size_t len = (1 + rng.below(pages - 1)) * page;
      m.range_start = slot.start + len;
      m.range_len = slot.len - len;
      if (munmap(reinterpret_cast<void *>(m.range_start), m.range_len) != 0) {
        m.error = errno;
        break;
      }
      slot.len = len;
      break;
    }
    case MutationKind::kDontneed:
    case MutationKind::kFree: {
      random_part();
      int advice = MADV_DONTNEED;
      // MADV_FREE applies to private anonymous memory only; on shmem, MADV_REMOVE frees the
      // pages for real (a later fault brings a new page).
      if (kind == MutationKind::kFree) advice = slot.shared ? MADV_REMOVE : MADV_FREE;
      if (madvise(reinterpret_cast<void *>(m.range_start), m.range_len, advice) != 0) {
        m.error = errno;
      }
      break;
    }
    case MutationKind::kFixed: {
      random_part();
      if (map(m.range_len, slot.shared, m.range_start) == 0) {
        // A failed MAP_FIXED may leave a hole: the slot loses its mapping.
        m.error = errno;
        munmap(old_addr, slot.len);
        slot.start = 0;
        slot.len = 0;
      }
      break;
    }
    case MutationKind::kPurge:
    case MutationKind::kFork:
    case MutationKind::kCount: break;  // not mutations of a mapping: the caller does them
  }
  m.new_start = slot.start;
  m.new_len = slot.len;
  m.time_ns = now_ns() - start_ns_;
  record(slot, m);
  return m;
}

std::string Pool::check_mapped(const Slot &slot) {
  if (slot.start == 0) return "";
  const uintptr_t end = slot.start + slot.len;
  std::string wrong;
  // /proc/self/maps is read in pieces while other threads change their mappings, so one read
  // can be torn: only a range found wrong three times in a row is reported.
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::FILE *maps = std::fopen("/proc/self/maps", "r");
    if (maps == nullptr) return "";
    uintptr_t covered = slot.start;
    bool ok = false;
    std::string lines;
    char line[512];
    while (std::fgets(line, sizeof line, maps) != nullptr) {
      unsigned long lo = 0, hi = 0;
      char perms[8] = {};
      if (std::sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3) continue;
      if (hi <= slot.start || lo >= end) continue;
      lines += std::string("\n      ") + line;
      if (lines.back() == '\n') lines.pop_back();
      if (lo <= covered && hi > covered && perms[0] == 'r' && perms[1] == 'w') covered = hi;
    }
    std::fclose(maps);
    ok = covered >= end;
    if (ok) return "";
    char buf[160];
    std::snprintf(buf, sizeof buf, "slot %d: [%#lx, +%s) is not mapped read-write from %#lx",
                  slot.index, static_cast<unsigned long>(slot.start), format_size(slot.len).c_str(),
                  static_cast<unsigned long>(covered));
    wrong = buf + std::string("; /proc/self/maps there:") + (lines.empty() ? " nothing" : lines);
  }
  return wrong;
}

std::vector<Mutation> Pool::history(const Slot &slot) const {
  std::vector<Mutation> out;
  const uint64_t first =
      slot.history_total > Slot::kHistory ? slot.history_total - Slot::kHistory : 0;
  for (uint64_t i = first; i < slot.history_total; ++i) {
    out.push_back(slot.history[i % Slot::kHistory]);
  }
  return out;
}

std::vector<Mutation> Pool::overlapping(uintptr_t start, size_t len, size_t max) const {
  auto touches = [&](uintptr_t s, uintptr_t l) {
    return l != 0 && s < start + len && start < s + l;
  };
  std::vector<Mutation> out;
  std::lock_guard lock(log_mutex_);
  const uint64_t first = log_total_ > kLogSize ? log_total_ - kLogSize : 0;
  for (uint64_t i = log_total_; i > first && out.size() < max; --i) {
    const Mutation &m = log_[(i - 1) % kLogSize];
    if (touches(m.old_start, m.old_len) || touches(m.new_start, m.new_len) ||
        touches(m.range_start, m.range_len)) {
      out.push_back(m);
    }
  }
  std::reverse(out.begin(), out.end());
  return out;
}

}  // namespace stress
