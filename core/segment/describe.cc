// SPDX-License-Identifier: BSD-3-Clause
// The printable description of a domain (text or JSON), used by mrcache-seg show.
//
// SYNCHRONIZATION: reads a copy of the root header taken without the domain lock, so that
// `show` works (and changes nothing) even when the lock's owner died or hangs. The copy may be
// torn; it is labelled a snapshot and only printed. Liveness comes from the OFD presence locks
// (F_OFD_GETLK, no side effect); heap counters are read from the segments' header pages
// without their locks, with the same caveat.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <iterator>
#include <new>

#include <dirent.h>
#include <sys/stat.h>

#include <string>
#include <vector>

#include "core/segment/internal/domain_calls.h"
#include "core/segment/internal/sys.h"

namespace mrc::seg {
namespace {

using Buffer = fmt::memory_buffer;

// A name field of the snapshot, never read past its end (it may lack its NUL).
std::string_view field(const char *s, size_t max) { return {s, strnlen(s, max)}; }

// Files in the prefix's name space that are not the domain's (another user's): check, repair and
// remove skip them; here they are listed, once per description. Read without the domain lock
// (like the rest of the snapshot).
std::vector<std::string> foreign_files(const mrc_seg_domain *d) {
  std::vector<std::string> out;
  DIR *dir = opendir("/dev/shm");
  if (dir == nullptr) return out;
  while (dirent *ent = readdir(dir)) {  // NOLINT(concurrency-mt-unsafe): our own stream
    if (classify_shm_file_locked(d, ent->d_name) != ShmFile::Foreign) continue;
    struct stat st {};
    const std::string path = std::string("/dev/shm/") + ent->d_name;
    if (lstat(path.c_str(), &st) != 0) continue;
    out.push_back(fmt::format("{} (uid {})", path, st.st_uid));
  }
  closedir(dir);
  return out;
}

void json_string(Buffer &out, const char *s, size_t max) {
  out.push_back('"');
  for (size_t i = 0; i < max && s[i] != '\0'; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c < 0x20 || c >= 0x7f) {
      fmt::format_to(std::back_inserter(out), "\\u{:04x}", c);
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  out.push_back('"');
}

const char *size_unit(uint64_t bytes, double *value) {
  static const char *const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  unsigned u = 0;
  double v = static_cast<double>(bytes);
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  *value = v;
  return kUnits[u];
}

std::string_view state_name(uint32_t state) {
  switch (state) {
    case kEntryCreating: return "creating";
    case kEntryReady: return "ready";
    case kEntryDeleting: return "deleting";
    default: return "free";
  }
}

void flag_names(Buffer &out, unsigned flags, bool json) {
  const char *names[3] = {};
  unsigned n = 0;
  if ((flags & MRC_SEG_HEAP) != 0) names[n++] = "heap";
  if ((flags & MRC_SEG_NODATA) != 0) names[n++] = "nodata";
  if ((flags & MRC_SEG_FILE) != 0) names[n++] = "file";
  if (json) out.push_back('[');
  for (unsigned i = 0; i < n; ++i) {
    if (i != 0) out.push_back(json ? ',' : '|');
    if (json) {
      fmt::format_to(std::back_inserter(out), "\"{}\"", names[i]);
    } else {
      fmt::format_to(std::back_inserter(out), "{}", names[i]);
    }
  }
  if (json) {
    out.push_back(']');
  } else if (n == 0) {
    fmt::format_to(std::back_inserter(out), "-");
  }
}

// The heap counters of a segment, read from its header page. false when unreadable.
bool heap_counters(const mrc_seg_domain *d, const SegEntry &e, HeapHeader *out) {
  // Only an entry that passes internal/validate.h's checks names a file worth mapping.
  if (check_entry(e, 0, WindowLimits{d->va_pages, 0}) != MRC_OK) {
    clear_error();
    return false;
  }
  for (const MappedSegment *m = d->maps; m != nullptr; m = m->next) {
    if (m->generation == e.generation && m->header != nullptr) {
      std::memcpy(static_cast<void *>(out), &m->header->heap, sizeof *out);
      return true;
    }
  }
  char name[160];
  if (!entry_file_name(d, e, name)) return false;
  const int fd = shm_open(name, O_RDONLY, 0);
  if (fd < 0) return false;
  void *page = MAP_FAILED;
  if (check_file(fd, name, d->uid, d->gid, d->mode, e.map_size) == MRC_OK) {
    page = mmap(nullptr, kSegHeaderSize, PROT_READ, MAP_SHARED, fd, 0);
  }
  clear_error();
  close(fd);
  if (page == MAP_FAILED) return false;
  const auto *h = static_cast<const SegHeader *>(page);
  const bool ok = h->magic == kSegMagic && h->generation == e.generation;
  if (ok) std::memcpy(static_cast<void *>(out), &h->heap, sizeof *out);
  munmap(page, kSegHeaderSize);
  return ok;
}

// What both forms say first about the snapshot as a whole.
struct Overview {
  uint64_t pages_used = 0;
  MutexState lock{};
  unsigned clients = 0;
  unsigned segments = 0;
};

Overview take_overview(const mrc_seg_domain *d, const RootHeader &root) {
  Overview overview;
  for (uint64_t i = 0; i < d->va_pages; ++i) {
    overview.pages_used += (root.va_bitmap[i / 64] >> (i % 64)) & 1U;
  }
  overview.lock = mutex_state(&d->root->lock);
  for (const ClientSlot &c : root.clients) overview.clients += c.state == kSlotActive ? 1U : 0U;
  for (const SegEntry &e : root.segments) overview.segments += e.state != kEntryFree ? 1U : 0U;
  return overview;
}

// Whether the client in slot `s` lives: ours does; another holds its presence lock.
bool client_alive(const mrc_seg_domain *d, unsigned s) {
  if (static_cast<int>(s) == d->slot) return true;
  return ofd_held(d->fd, kPresenceLockOffset + static_cast<off_t>(s)) == 1;
}

bool uses_segment(const SegEntry &e, unsigned slot) {
  return ((e.clients[slot / 64] >> (slot % 64)) & 1U) != 0;
}

unsigned segments_of_client(const RootHeader &root, unsigned slot) {
  unsigned segs = 0;
  for (const SegEntry &e : root.segments) {
    segs += e.state != kEntryFree && uses_segment(e, slot) ? 1U : 0U;
  }
  return segs;
}

// The /dev/shm file name of an entry's data; "" for MRC_SEG_NODATA or a name that cannot be made.
void data_file(const mrc_seg_domain *d, const SegEntry &e, char (&file)[160]) {
  if ((e.flags & MRC_SEG_NODATA) != 0 || !entry_file_name(d, e, file)) file[0] = '\0';
}

// ---- JSON ----------------------------------------------------------------------------------

void json_domain(const mrc_seg_domain *d, const RootHeader &root, const Overview &overview,
                 Buffer &out) {
  auto o = std::back_inserter(out);
  fmt::format_to(o, "{{\"prefix\":");
  json_string(out, d->prefix, sizeof d->prefix);
  fmt::format_to(o,
                 ",\"root\":\"/dev/shm{}\",\"snapshot\":true,\"base\":{},\"size\":{},"
                 "\"va_page_size\":{},\"pages_total\":{},\"pages_used\":{},\"uid\":{},"
                 "\"gid\":{},\"mode\":\"{:04o}\",\"domain_id\":\"{:#018x}\",\"created_ns\":{},"
                 "\"next_generation\":{},\"repairs\":{},\"clients_reaped\":{},"
                 "\"segments_reaped\":{},\"state\":\"{}\",",
                 d->root_name, root.base, root.size, kVaPageSize, root.va_pages,
                 overview.pages_used, root.uid, root.gid, root.mode, root.domain_id,
                 root.created_ns, root.next_generation, root.repairs, root.clients_reaped,
                 root.segments_reaped, root.state == kDomainLive ? "live" : "dead");
  fmt::format_to(o, "\"lock\":{{\"locked\":{},\"owner_tid\":{},\"owner_died\":{}}},",
                 overview.lock.locked, overview.lock.owner_tid, overview.lock.owner_died);
}

void json_clients(const mrc_seg_domain *d, const RootHeader &root, Buffer &out) {
  auto o = std::back_inserter(out);
  fmt::format_to(o, "\"clients\":[");
  bool first = true;
  for (unsigned s = 0; s < kMaxClients; ++s) {
    const ClientSlot &c = root.clients[s];
    if (c.state != kSlotActive) continue;
    fmt::format_to(o, "{}{{\"slot\":{},\"pid\":{},\"uid\":{},\"comm\":", first ? "" : ",", s, c.pid,
                   c.uid);
    json_string(out, c.comm, sizeof c.comm);
    fmt::format_to(o,
                   ",\"alive\":{},\"self\":{},\"serial\":{},\"attach_time_ns\":{},"
                   "\"segments\":{}}}",
                   client_alive(d, s), static_cast<int>(s) == d->slot, c.serial, c.attach_time_ns,
                   segments_of_client(root, s));
    first = false;
  }
  fmt::format_to(o, "],");
}

void json_segment(const mrc_seg_domain *d, const RootHeader &root, const SegEntry &e, bool verbose,
                  Buffer &out) {
  auto o = std::back_inserter(out);
  char file[160] = "";
  data_file(d, e, file);
  fmt::format_to(o, "{{\"name\":");
  json_string(out, e.name, sizeof e.name);
  fmt::format_to(o,
                 ",\"state\":\"{}\",\"generation\":{},\"base\":{},\"size\":{},"
                 "\"map_base\":{},\"map_size\":{},\"pages\":{},\"numa_node\":{},"
                 "\"file\":\"{}{}\",\"flags\":",
                 state_name(e.state), e.generation, root.base + e.va_offset + e.data_offset,
                 e.data_size, root.base + e.va_offset, e.va_pages << kVaPageShift, e.va_pages,
                 e.numa_node, file[0] != '\0' ? "/dev/shm" : "", file);
  flag_names(out, e.flags, true);
  fmt::format_to(o, ",\"backing_file\":");
  json_string(out, e.backing_path, sizeof e.backing_path);
  fmt::format_to(o, ",\"clients\":[");
  bool first = true;
  for (unsigned s = 0; s < kMaxClients; ++s) {
    if (!uses_segment(e, s)) continue;
    fmt::format_to(o, "{}{}", first ? "" : ",", s);
    first = false;
  }
  out.push_back(']');
  HeapHeader heap{};
  if (verbose && (e.flags & MRC_SEG_HEAP) != 0 && heap_counters(d, e, &heap)) {
    fmt::format_to(o,
                   ",\"heap\":{{\"heap_size\":{},\"bytes_used\":{},\"used_blocks\":{},"
                   "\"free_blocks\":{},\"allocs\":{},\"frees\":{},\"repairs\":{},"
                   "\"corrupt\":{}}}",
                   heap.heap_size, heap.bytes_used, heap.used_blocks, heap.free_blocks, heap.allocs,
                   heap.frees, heap.repairs, heap.state != kHeapOk);
  }
  out.push_back('}');
}

void json_segments(const mrc_seg_domain *d, const RootHeader &root, bool verbose, Buffer &out) {
  fmt::format_to(std::back_inserter(out), "\"segments\":[");
  bool first = true;
  for (const SegEntry &e : root.segments) {
    if (e.state == kEntryFree) continue;
    if (!first) out.push_back(',');
    json_segment(d, root, e, verbose, out);
    first = false;
  }
  fmt::format_to(std::back_inserter(out), "],");
}

void json_foreign_files(const mrc_seg_domain *d, Buffer &out) {
  fmt::format_to(std::back_inserter(out), "\"foreign_files\":[");
  bool first = true;
  for (const std::string &f : foreign_files(d)) {
    if (!first) out.push_back(',');
    json_string(out, f.c_str(), f.size());
    first = false;
  }
  out.push_back(']');
}

// ---- text ----------------------------------------------------------------------------------

void text_domain(const mrc_seg_domain *d, const RootHeader &root, const Overview &overview,
                 Buffer &out) {
  auto o = std::back_inserter(out);
  double v = 0;
  const char *unit = size_unit(root.size, &v);
  fmt::format_to(o, "domain {} (/dev/shm{}), a snapshot:\n", d->prefix, d->root_name);
  fmt::format_to(o,
                 "  window [{:#x}, {:#x}) {:.1f} {}, {} pages of 2 MiB, {} in use\n"
                 "  uid {} gid {} mode {:04o}  id {:#018x}  state {}\n"
                 "  repairs {}  clients reaped {}  segments reaped {}  next generation {}\n",
                 root.base, root.base + root.size, v, unit, root.va_pages, overview.pages_used,
                 root.uid, root.gid, root.mode, root.domain_id,
                 root.state == kDomainLive ? "live" : "dead", root.repairs, root.clients_reaped,
                 root.segments_reaped, root.next_generation);
  if (!overview.lock.locked) {
    fmt::format_to(o, "  lock: free\n");
  } else if (overview.lock.owner_died) {
    fmt::format_to(o, "  lock: its owner died holding it; the next locker repairs\n");
  } else {
    fmt::format_to(o, "  lock: held by thread {}\n", overview.lock.owner_tid);
  }
}

void text_clients(const mrc_seg_domain *d, const RootHeader &root, unsigned count, Buffer &out) {
  auto o = std::back_inserter(out);
  fmt::format_to(o, "  clients: {}\n", count);
  if (count != 0) {
    fmt::format_to(o, "    {:<5} {:>8} {:>6}  {:<6} {:<16} {}\n", "slot", "pid", "uid", "state",
                   "comm", "segments");
  }
  for (unsigned s = 0; s < kMaxClients; ++s) {
    const ClientSlot &c = root.clients[s];
    if (c.state != kSlotActive) continue;
    char comm[17] = {};
    std::memcpy(comm, c.comm, sizeof c.comm);
    fmt::format_to(o, "    {:<5} {:>8} {:>6}  {:<6} {:<16} {}{}\n", s, c.pid, c.uid,
                   client_alive(d, s) ? "alive" : "dead", comm, segments_of_client(root, s),
                   static_cast<int>(s) == d->slot ? "  (this process)" : "");
  }
}

// --verbose: the lines under a segment's row.
void text_segment_details(const mrc_seg_domain *d, const RootHeader &root, const SegEntry &e,
                          Buffer &out) {
  auto o = std::back_inserter(out);
  char file[160] = "";
  data_file(d, e, file);
  fmt::format_to(o, "      generation {}  file {}{}  range [{:#x}, {:#x})", e.generation,
                 file[0] != '\0' ? "/dev/shm" : "-", file, root.base + e.va_offset,
                 root.base + e.va_offset + (e.va_pages << kVaPageShift));
  if (e.numa_node >= 0) fmt::format_to(o, "  numa node {}", e.numa_node);
  out.push_back('\n');
  if ((e.flags & MRC_SEG_FILE) != 0) {
    fmt::format_to(o, "      backing file {}\n",
                   std::string_view(e.backing_path, strnlen(e.backing_path, kPathMax)));
  }
  fmt::format_to(o, "      client slots:");
  for (unsigned s = 0; s < kMaxClients; ++s) {
    if (uses_segment(e, s)) fmt::format_to(o, " {}", s);
  }
  out.push_back('\n');
  HeapHeader heap{};
  if ((e.flags & MRC_SEG_HEAP) != 0 && heap_counters(d, e, &heap)) {
    fmt::format_to(o,
                   "      heap: {} of {} bytes used in {} blocks, {} free blocks, {} allocs, "
                   "{} frees, {} repairs{}\n",
                   heap.bytes_used, heap.heap_size, heap.used_blocks, heap.free_blocks, heap.allocs,
                   heap.frees, heap.repairs, heap.state != kHeapOk ? ", CORRUPT" : "");
  }
}

void text_segments(const mrc_seg_domain *d, const RootHeader &root, unsigned count, bool verbose,
                   Buffer &out) {
  auto o = std::back_inserter(out);
  fmt::format_to(o, "  segments: {}\n", count);
  if (count != 0) {
    fmt::format_to(o, "    {:<24} {:<16} {:>12} {:>6} {:>8}  {}\n", "name", "base", "size", "pages",
                   "clients", "flags");
  }
  for (const SegEntry &e : root.segments) {
    if (e.state == kEntryFree) continue;
    unsigned clients = 0;
    for (uint64_t w : e.clients) clients += static_cast<unsigned>(__builtin_popcountll(w));
    fmt::format_to(o, "    {:<24} {:<#16x} {:>12} {:>6} {:>8}  ", field(e.name, sizeof e.name),
                   root.base + e.va_offset + e.data_offset, e.data_size, e.va_pages, clients);
    flag_names(out, e.flags, false);
    if (e.state != kEntryReady) fmt::format_to(o, " ({})", state_name(e.state));
    out.push_back('\n');
    if (verbose) text_segment_details(d, root, e, out);
  }
}

void text_foreign_files(const mrc_seg_domain *d, Buffer &out) {
  const std::vector<std::string> foreign = foreign_files(d);
  if (foreign.empty()) return;
  auto o = std::back_inserter(out);
  fmt::format_to(o, "  foreign files (not the domain's; check, repair and remove skip them):\n");
  for (const std::string &f : foreign) fmt::format_to(o, "    {}\n", f);
}

void describe(const mrc_seg_domain *d, const RootHeader &root, unsigned flags, Buffer &out) {
  const bool verbose = (flags & MRC_SEG_DESCRIBE_VERBOSE) != 0;
  const Overview overview = take_overview(d, root);
  if ((flags & MRC_SEG_DESCRIBE_JSON) != 0) {
    json_domain(d, root, overview, out);
    json_clients(d, root, out);
    json_segments(d, root, verbose, out);
    json_foreign_files(d, out);
    out.push_back('}');
    return;
  }
  text_domain(d, root, overview, out);
  text_clients(d, root, overview.clients, out);
  text_segments(d, root, overview.segments, verbose, out);
  text_foreign_files(d, out);
}

}  // namespace
}  // namespace mrc::seg

extern "C" int mrc_seg_domain_describe(mrc_seg_domain_t *d, unsigned flags, char *buf, size_t len) {
  using namespace mrc::seg;
  clear_error();
  if ((flags & ~static_cast<unsigned>(MRC_SEG_DESCRIBE_VERBOSE | MRC_SEG_DESCRIBE_JSON)) != 0 ||
      (buf == nullptr && len != 0)) {
    return fail(MRC_ERR_INVALID, "bad flags or buffer");
  }
  if (!usable_here(d)) return MRC_ERR_INVALID;
  auto *snapshot = new (std::nothrow) RootHeader;
  if (snapshot == nullptr) return fail(MRC_ERR_NO_MEMORY, "out of memory");
  std::memcpy(static_cast<void *>(snapshot), d->root, sizeof(RootHeader));
  fmt::memory_buffer out;
  pthread_mutex_lock(&d->mu);  // the mappings list (for heap counters)
  describe(d, *snapshot, flags, out);
  pthread_mutex_unlock(&d->mu);
  delete snapshot;
  if (len != 0) {
    const size_t n = out.size() < len - 1 ? out.size() : len - 1;
    std::memcpy(buf, out.data(), n);
    buf[n] = '\0';
  }
  return static_cast<int>(out.size());
}
