// SPDX-License-Identifier: BSD-3-Clause
// Vma facts: PROCMAP_QUERY on an open /proc/self/maps (Linux 6.11+), else a parse of it.
//
// SYNCHRONIZATION
//   g_maps[i].mutex guards g_maps[i].fd. A few descriptors are kept so that concurrent callers
//   rarely wait for each other; one ioctl at a time per descriptor, because some kernels between
//   6.16 and 6.18 kept PROCMAP_QUERY's locking state in the open file. Callers take the first
//   free slot with try_lock, else wait on one chosen round-robin. The fork handlers (below)
//   take every slot mutex before fork and, in the child, close the descriptors: an inherited
//   /proc/self/maps still describes the parent's address space. close_maps_descriptors() (the
//   uffd monitor's stop, under its registry mutex) closes them one slot mutex at a time: a query
//   running then finishes first, a later one opens a descriptor again. g_procmap_unsupported and
//   g_force_fallback are relaxed flags: a stale read only costs one more failed ioctl or one more
//   parse.
#include "base/proc_maps.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "base/testing.h"

namespace mrc::os {
namespace {

// struct procmap_query from <linux/fs.h> (Linux 6.11; Debian 12's headers are 6.1). Declared
// under our own name so that a newer header's definition cannot collide with it; the layout is
// the ABI.
struct ProcmapQuery {
  uint64_t size;
  uint64_t query_flags;
  uint64_t query_addr;
  uint64_t vma_start;
  uint64_t vma_end;
  uint64_t vma_flags;
  uint64_t vma_page_size;
  uint64_t vma_offset;
  uint64_t inode;
  uint32_t dev_major;
  uint32_t dev_minor;
  uint32_t vma_name_size;
  uint32_t build_id_size;
  uint64_t vma_name_addr;
  uint64_t build_id_addr;
};
static_assert(sizeof(ProcmapQuery) == 104, "struct procmap_query is 104 bytes in the ABI");

constexpr unsigned long kProcmapQuery = _IOWR('f', 17, ProcmapQuery);

// Bits of ProcmapQuery::query_flags (filters) and of ::vma_flags (the answer).
constexpr uint64_t kProcmapVmaReadable = 0x01;
constexpr uint64_t kProcmapVmaWritable = 0x02;
constexpr uint64_t kProcmapVmaExecutable = 0x04;
constexpr uint64_t kProcmapVmaShared = 0x08;
constexpr uint64_t kProcmapCoveringOrNextVma = 0x10;

struct MapsSlot {
  std::mutex mutex;
  int fd = -1;
};
constexpr unsigned kMapsSlots = 4;
MapsSlot g_maps[kMapsSlots];
std::atomic<unsigned> g_maps_next{0};
std::atomic<bool> g_procmap_unsupported{false};
std::atomic<bool> g_force_fallback{false};

// Room for any path (PATH_MAX) plus " (deleted)".
constexpr size_t kNameBytes = 4096 + 64;

size_t base_page_size() noexcept {
  static const size_t size = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return size;
}

bool is_sysv_name(const char *name, size_t length) noexcept {
  return length >= 5 && memcmp(name, "/SYSV", 5) == 0;
}

// Private anonymous memory: what MISSING mode can resolve faults on (zero pages).
bool is_private_anonymous(bool shared, uint64_t inode, const char *name, size_t length) noexcept {
  if (shared || inode != 0) return false;
  // [vdso], [vvar], [vsyscall] are special mappings; [heap], [stack] and unnamed ones are not.
  if (length > 0 && name[0] == '[') {
    return (length == 6 && memcmp(name, "[heap]", 6) == 0) ||
           (length >= 6 && memcmp(name, "[stack", 6) == 0) ||
           (length >= 6 && memcmp(name, "[anon:", 6) == 0);
  }
  return length == 0;
}

enum class QueryStatus { Found, NotFound, Unsupported, Failed };

QueryStatus procmap_query(int fd, uintptr_t address, bool or_next, Vma *out) noexcept {
  char name[kNameBytes];
  ProcmapQuery query{};
  query.size = sizeof(query);
  query.query_flags = or_next ? kProcmapCoveringOrNextVma : 0;
  query.query_addr = address;
  query.vma_name_size = sizeof(name);
  query.vma_name_addr = reinterpret_cast<uintptr_t>(name);
  int rc;
  do {
    rc = ioctl(fd, kProcmapQuery, &query);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    if (errno == ENOENT) return QueryStatus::NotFound;
    if (errno == ENOTTY || errno == EINVAL || errno == EOPNOTSUPP) return QueryStatus::Unsupported;
    return QueryStatus::Failed;
  }
  // vma_name_size counts the terminating NUL when a name was returned.
  const size_t name_length = query.vma_name_size > 0 ? query.vma_name_size - 1 : 0;
  out->start = query.vma_start;
  out->end = query.vma_end;
  out->prot = ((query.vma_flags & kProcmapVmaReadable) ? PROT_READ : 0u) |
              ((query.vma_flags & kProcmapVmaWritable) ? PROT_WRITE : 0u) |
              ((query.vma_flags & kProcmapVmaExecutable) ? PROT_EXEC : 0u);
  out->shared = (query.vma_flags & kProcmapVmaShared) != 0;
  out->inode = query.inode;
  out->sysv_shm = out->shared && is_sysv_name(name, name_length);
  out->page_size = query.vma_page_size != 0 ? query.vma_page_size : base_page_size();
  out->anonymous = is_private_anonymous(out->shared, out->inode, name, name_length);
  return QueryStatus::Found;
}

// ---- /proc/self/maps parsing (kernels before 6.11) ----

bool parse_hex(const char **cursor, const char *end, uint64_t *value) noexcept {
  const char *p = *cursor;
  uint64_t v = 0;
  const char *first = p;
  for (; p < end; ++p) {
    const char c = *p;
    unsigned digit;
    if (c >= '0' && c <= '9') {
      digit = static_cast<unsigned>(c - '0');
    } else if (c >= 'a' && c <= 'f') {
      digit = static_cast<unsigned>(c - 'a' + 10);
    } else {
      break;
    }
    v = (v << 4) | digit;
  }
  if (p == first) return false;
  *cursor = p;
  *value = v;
  return true;
}

bool parse_dec(const char **cursor, const char *end, uint64_t *value) noexcept {
  const char *p = *cursor;
  uint64_t v = 0;
  const char *first = p;
  for (; p < end && *p >= '0' && *p <= '9'; ++p) v = v * 10 + static_cast<uint64_t>(*p - '0');
  if (p == first) return false;
  *cursor = p;
  *value = v;
  return true;
}

bool expect(const char **cursor, const char *end, char c) noexcept {
  if (*cursor >= end || **cursor != c) return false;
  ++*cursor;
  return true;
}

void skip_spaces(const char **cursor, const char *end) noexcept {
  while (*cursor < end && **cursor == ' ') ++*cursor;
}

// "start-end perms offset major:minor inode   name"
bool parse_maps_line(const char *line, size_t length, Vma *out) noexcept {
  const char *p = line;
  const char *end = line + length;
  uint64_t start, stop, offset, major, minor, inode;
  if (!parse_hex(&p, end, &start) || !expect(&p, end, '-') || !parse_hex(&p, end, &stop) ||
      !expect(&p, end, ' ') || end - p < 4) {
    return false;
  }
  const char *perms = p;
  p += 4;
  if (!expect(&p, end, ' ') || !parse_hex(&p, end, &offset) || !expect(&p, end, ' ') ||
      !parse_hex(&p, end, &major) || !expect(&p, end, ':') || !parse_hex(&p, end, &minor) ||
      !expect(&p, end, ' ') || !parse_dec(&p, end, &inode)) {
    return false;
  }
  skip_spaces(&p, end);
  const size_t name_length = static_cast<size_t>(end - p);
  out->start = start;
  out->end = stop;
  out->prot = (perms[0] == 'r' ? PROT_READ : 0u) | (perms[1] == 'w' ? PROT_WRITE : 0u) |
              (perms[2] == 'x' ? PROT_EXEC : 0u);
  out->shared = perms[3] == 's';
  out->inode = inode;
  out->sysv_shm = out->shared && is_sysv_name(p, name_length);
  out->page_size = base_page_size();
  out->anonymous = is_private_anonymous(out->shared, inode, p, name_length);
  return true;
}

QueryStatus parse_proc_maps(uintptr_t address, bool or_next, Vma *out) noexcept {
  const int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return QueryStatus::Failed;
  char buffer[8192];
  size_t have = 0;
  bool eof = false;
  bool skipping = false;  // discarding the tail of a line longer than the buffer
  QueryStatus status = QueryStatus::NotFound;
  for (;;) {
    char *newline = static_cast<char *>(memchr(buffer, '\n', have));
    while (newline == nullptr && !eof && have < sizeof(buffer)) {
      const ssize_t n = read(fd, buffer + have, sizeof(buffer) - have);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        close(fd);
        return QueryStatus::Failed;
      }
      if (n == 0) {
        eof = true;
      } else {
        newline = static_cast<char *>(memchr(buffer + have, '\n', static_cast<size_t>(n)));
        have += static_cast<size_t>(n);
      }
    }
    if (have == 0) break;
    const size_t line_length = newline != nullptr ? static_cast<size_t>(newline - buffer) : have;
    if (!skipping) {
      Vma line;
      if (parse_maps_line(buffer, line_length, &line) && line.end > address) {
        // Lines come in address order: the first one ending above `address` decides.
        if (line.start <= address || or_next) {
          *out = line;
          status = QueryStatus::Found;
        }
        break;
      }
    }
    skipping = newline == nullptr;
    const size_t consumed = newline != nullptr ? line_length + 1 : have;
    memmove(buffer, buffer + consumed, have - consumed);
    have -= consumed;
    if (eof && have == 0) break;
  }
  close(fd);
  return status;
}

mrc_status_t query(uintptr_t address, bool or_next, Vma *out) noexcept {
  if (out == nullptr) return MRC_ERR_INVALID;
  if (!g_procmap_unsupported.load(std::memory_order_relaxed) &&
      !g_force_fallback.load(std::memory_order_relaxed)) {
    // The first free slot: a single-threaded process keeps using (and opening) one descriptor.
    MapsSlot *slot = nullptr;
    for (unsigned i = 0; i < kMapsSlots && slot == nullptr; ++i) {
      if (g_maps[i].mutex.try_lock()) slot = &g_maps[i];
    }
    if (slot == nullptr) {
      slot = &g_maps[g_maps_next.fetch_add(1, std::memory_order_relaxed) % kMapsSlots];
      slot->mutex.lock();
    }
    std::unique_lock<std::mutex> hold(slot->mutex, std::adopt_lock);
    if (slot->fd < 0) {
      register_maps_fork_handlers();  // a forked child must not query through this descriptor
      slot->fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    }
    if (slot->fd >= 0) {
      switch (procmap_query(slot->fd, address, or_next, out)) {
        case QueryStatus::Found: return MRC_OK;
        case QueryStatus::NotFound: return MRC_ERR_NOT_FOUND;
        case QueryStatus::Failed: return MRC_ERR_IO;
        case QueryStatus::Unsupported:
          g_procmap_unsupported.store(true, std::memory_order_relaxed);
          break;
      }
    }
  }
  switch (parse_proc_maps(address, or_next, out)) {
    case QueryStatus::Found: return MRC_OK;
    case QueryStatus::NotFound: return MRC_ERR_NOT_FOUND;
    default: return MRC_ERR_IO;
  }
}

// REQUIRES: slot->mutex.
void close_slot(MapsSlot *slot) noexcept {
  if (slot->fd >= 0) close(slot->fd);
  slot->fd = -1;
}

void prepare_fork() noexcept {
  for (MapsSlot &slot : g_maps) slot.mutex.lock();
}

void parent_after_fork() noexcept {
  for (unsigned i = kMapsSlots; i-- > 0;) g_maps[i].mutex.unlock();
}

void child_after_fork() noexcept {
  for (unsigned i = kMapsSlots; i-- > 0;) {
    close_slot(&g_maps[i]);
    g_maps[i].mutex.unlock();
  }
}

void install_fork_handlers() noexcept {
  pthread_atfork(prepare_fork, parent_after_fork, child_after_fork);
}

}  // namespace

mrc_status_t query_vma(uintptr_t address, Vma *out) noexcept { return query(address, false, out); }

mrc_status_t query_vma_from(uintptr_t address, Vma *out) noexcept {
  return query(address, true, out);
}

uintptr_t brk_heap_start() noexcept {
  // A stack buffer: this runs under the uffd registry mutex, where allocating is allowed but
  // not needed. The line is "pid (comm) state ppid ...": fields counted after the last ')',
  // which comm itself may contain; start_brk is field 47 (Linux 3.3+).
  char line[2048];
  const int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  const ssize_t n = read(fd, line, sizeof line - 1);
  close(fd);
  if (n <= 0) return 0;
  line[n] = '\0';
  const char *at = std::strrchr(line, ')');
  if (at == nullptr) return 0;
  ++at;  // the space before field 3 (state); each step moves to the space before the next
  for (int field = 3; field < 47; ++field) {
    at = std::strchr(at + 1, ' ');
    if (at == nullptr) return 0;
  }
  char *end = nullptr;
  const unsigned long long value = std::strtoull(at + 1, &end, 10);
  return end != at + 1 ? static_cast<uintptr_t>(value) : 0;
}

void close_maps_descriptors() noexcept {
  for (MapsSlot &slot : g_maps) {
    std::lock_guard<std::mutex> hold(slot.mutex);
    close_slot(&slot);
  }
}

void register_maps_fork_handlers() noexcept {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, install_fork_handlers);
}

namespace testing {
void force_maps_fallback(bool on) { g_force_fallback.store(on, std::memory_order_relaxed); }
}  // namespace testing

}  // namespace mrc::os
