// SPDX-License-Identifier: BSD-3-Clause
// Named segments: opening (creating one, or mapping an existing one at its window address) and
// closing the segments listed in a domain's directory, with their optional backing file, heap
// and NUMA node. (Memfd segments are in memfd.cc.)
//
// SYNCHRONIZATION: see domain.h (mrc_seg_domain::mu, then the shared domain lock) and layout.h
// (the directory entry's states; the segment header).
// CRASH CONSISTENCY: see internal/domain_calls.h (segment files).
#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>

#include "core/segment/heap.h"
#include "core/segment/internal/domain_calls.h"
#include "core/segment/internal/sys.h"

namespace mrc::seg {

namespace {

constexpr uint64_t kPage = 4096;

inline uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

struct SegLayout {
  uint64_t map_size;     // bytes of the /dev/shm file
  uint64_t data_offset;  // from the segment start
  uint64_t data_size;
  uint64_t va_pages;
};

mrc_status_t validate_params(const mrc_seg_params_t *p) {
  if (p == nullptr || !valid_name(p->name)) {
    return fail(MRC_ERR_INVALID, "segment name must be 1..{} characters of [A-Za-z0-9._-]",
                kNameMax);
  }
  constexpr unsigned kKnown = MRC_SEG_HEAP | MRC_SEG_NODATA | MRC_SEG_FILE | MRC_SEG_HUGETLB |
                              MRC_SEG_EXCL | MRC_SEG_NOCREATE;
  if ((p->flags & ~kKnown) != 0) return fail(MRC_ERR_INVALID, "unknown flags {:#x}", p->flags);
  if ((p->flags & MRC_SEG_EXCL) != 0 && (p->flags & MRC_SEG_NOCREATE) != 0) {
    return fail(MRC_ERR_INVALID, "MRC_SEG_EXCL and MRC_SEG_NOCREATE exclude each other");
  }
  if ((p->flags & MRC_SEG_NODATA) != 0 && (p->flags & (MRC_SEG_HEAP | MRC_SEG_FILE)) != 0) {
    return fail(MRC_ERR_INVALID, "MRC_SEG_NODATA has neither heap nor file");
  }
  if ((p->flags & MRC_SEG_FILE) != 0) {
    if (p->backing_file == nullptr || p->backing_file[0] != '/' ||
        std::strlen(p->backing_file) > kPathMax) {
      return fail(MRC_ERR_INVALID,
                  "MRC_SEG_FILE needs an absolute backing_file of at most {} "
                  "characters",
                  kPathMax);
    }
  }
  if (p->numa_node < -1) return fail(MRC_ERR_INVALID, "numa_node: -1 or a node");
  if (p->size > (kMaxVaPages * kVaPageSize)) {
    return fail(MRC_ERR_INVALID, "size {} exceeds any window", p->size);
  }
  return MRC_OK;
}

// The backing file of a MRC_SEG_FILE segment: created 0600/mode with O_EXCL, or opened and
// checked. *hugepage: its page size when it lives on hugetlbfs, else 0.
mrc_status_t open_backing(mrc_seg_domain *d, const char *path, uint64_t *size_inout, bool creating,
                          int *fd_out, uint64_t *hugepage) {
  *hugepage = 0;
  int fd = -1;
  bool created = false;
  if (creating) {
    fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, d->mode);
    created = fd >= 0;
  }
  if (fd < 0 && (!creating || errno == EEXIST)) {
    fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  }
  if (fd < 0) return fail(MRC_ERR_IO, "backing file {}: {}", path, errno_text(errno));
  struct statfs fs {};
  if (fstatfs(fd, &fs) == 0 && static_cast<uint64_t>(fs.f_type) == HUGETLBFS_MAGIC) {
    *hugepage = static_cast<uint64_t>(fs.f_bsize);
  }
  if (created) {
    const mrc_status_t given = give_to_domain(fd, path, d->uid, d->gid, d->mode);
    if (given != MRC_OK) {
      close(fd);
      return given;
    }
  }
  mrc_status_t st = check_file(fd, path, d->uid, d->gid, d->mode, 0);
  if (st != MRC_OK) {
    close(fd);
    return st;
  }
  const uint64_t page = *hugepage != 0 ? *hugepage : kPage;
  const uint64_t want = round_up(*size_inout, page);
  struct stat sb {};
  fstat(fd, &sb);
  if (created || (creating && static_cast<uint64_t>(sb.st_size) < want && sb.st_size == 0)) {
    if (ftruncate(fd, static_cast<off_t>(want)) != 0) {
      close(fd);
      return fail(MRC_ERR_IO, "sizing {}: {}", path, errno_text(errno));
    }
  } else if (static_cast<uint64_t>(sb.st_size) < want) {
    close(fd);
    return fail(MRC_ERR_INVALID, "{} has {} bytes, the segment needs {}: refused", path, sb.st_size,
                want);
  }
  *size_inout = want;
  *fd_out = fd;
  return MRC_OK;
}

mrc_seg *new_handle(mrc_seg_domain *d, MappedSegment *m, bool created) {
  auto *seg = new (std::nothrow) mrc_seg;
  if (seg == nullptr) return nullptr;
  seg->domain = d;
  seg->map = m;
  seg->created = created;
  return seg;
}

// Validates the header of a segment mapped at `start` against its directory entry: a file that
// fails the header checks is MRC_ERR_INVALID (segment.h), the field named.
mrc_status_t validate_segment(const mrc_seg_domain *d, const SegEntry &e, const char *start) {
  const auto *h = reinterpret_cast<const SegHeader *>(start);
  if (check_segment_header(*h, e, d->domain_id, reinterpret_cast<uint64_t>(start)) != MRC_OK) {
    return MRC_ERR_INVALID;
  }
  return MRC_OK;
}

// Maps a ready segment at its window address. REQUIRES: domain lock held; `e` is a copy of the
// entry that passed check_entry (internal/validate.h): its range lies inside this process's window,
// so the MAP_FIXED below replaces only our own reservation.
mrc_status_t map_existing_locked(mrc_seg_domain *d, const SegEntry &e, MappedSegment *m) {
  char *start = reinterpret_cast<char *>(d->base + e.va_offset);
  m->start = start;
  m->va_len = e.va_pages * kVaPageSize;
  m->map_size = e.map_size;
  m->data = start + e.data_offset;
  m->data_size = e.data_size;
  if ((e.flags & MRC_SEG_NODATA) != 0) return MRC_OK;
  char name[160];
  if (!entry_file_name(d, e, name)) return fail(MRC_ERR_IO, "segment entry: bad name");
  const int fd = shm_open(name, O_RDWR, 0);
  if (fd < 0) return fail(MRC_ERR_IO, "segment file /dev/shm{}: {}", name, errno_text(errno));
  char what[200];
  auto res = fmt::format_to_n(what, sizeof what - 1, "/dev/shm{}", name);
  *res.out = '\0';
  mrc_status_t st = check_file(fd, what, d->uid, d->gid, d->mode, e.map_size);
  if (st == MRC_OK &&
      mmap(start, e.map_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) != start) {
    st = fail(MRC_ERR_NO_MEMORY, "mapping {}: {}", what, errno_text(errno));
  }
  close(fd);
  if (st != MRC_OK) return st;
  if ((e.flags & MRC_SEG_FILE) != 0) {
    const int bfd = open(e.backing_path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    struct stat sb {};
    if (bfd < 0 || fstat(bfd, &sb) != 0 || sb.st_dev != e.backing_dev ||
        sb.st_ino != e.backing_ino) {
      st = fail(MRC_ERR_INVALID, "backing file {} is not the file the segment was created on",
                e.backing_path);
    } else {
      st = check_file(bfd, e.backing_path, d->uid, d->gid, d->mode, 0);
      if (st == MRC_OK && static_cast<uint64_t>(sb.st_size) < e.data_size) {
        st = fail(MRC_ERR_INVALID, "backing file {} shrank: refused", e.backing_path);
      }
      if (st == MRC_OK && mmap(m->data, e.data_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
                               bfd, 0) != m->data) {
        st = fail(MRC_ERR_NO_MEMORY, "mapping {}: {}", e.backing_path, errno_text(errno));
      }
    }
    if (bfd >= 0) close(bfd);
  }
  if (st == MRC_OK) st = validate_segment(d, e, start);
  if (st != MRC_OK) {
    (void)reserve_again(start, m->va_len);
    return st;
  }
  m->header = reinterpret_cast<SegHeader *>(start);
  return MRC_OK;
}

// The backing file of a new MRC_SEG_FILE segment, open while the segment is created.
struct Backing {
  int fd = -1;
  uint64_t hugepage = 0;  // its page size on hugetlbfs, else 0
};

void close_backing(Backing *backing) {
  if (backing->fd >= 0) close(backing->fd);
  backing->fd = -1;
}

// Where a new segment's bytes go: a backing file (MRC_SEG_FILE, opened here and sized to the
// request: it decides the data size, and on hugetlbfs the data offset), no file (MRC_SEG_NODATA),
// or the /dev/shm file after the header. On failure nothing is left open.
mrc_status_t plan_layout(mrc_seg_domain *d, const mrc_seg_params_t *p, SegLayout *lay,
                         Backing *backing) {
  if (p->size == 0) return fail(MRC_ERR_INVALID, "segment {} does not exist; size 0", p->name);
  if ((p->flags & MRC_SEG_FILE) != 0) {
    uint64_t size = p->size;
    mrc_status_t st =
        open_backing(d, p->backing_file, &size, true, &backing->fd, &backing->hugepage);
    if (st != MRC_OK) return st;
    if (backing->hugepage > kVaPageSize) {
      close_backing(backing);
      return fail(MRC_ERR_UNSUPPORTED, "huge pages of {} bytes exceed the window's 2 MiB granule",
                  backing->hugepage);
    }
    lay->map_size = kSegHeaderSize;
    lay->data_offset = backing->hugepage != 0 ? kVaPageSize : kSegHeaderSize;
    lay->data_size = size;
  } else if ((p->flags & MRC_SEG_NODATA) != 0) {
    lay->map_size = 0;
    lay->data_offset = 0;
    lay->data_size = round_up(p->size, kPage);
  } else {
    lay->data_offset = kSegHeaderSize;
    lay->data_size = round_up(p->size, kPage);
    lay->map_size = kSegHeaderSize + lay->data_size;
  }
  lay->va_pages = round_up(lay->data_offset + lay->data_size, kVaPageSize) / kVaPageSize;
  if ((p->flags & MRC_SEG_HEAP) != 0 && lay->data_size > SharedHeap::kMaxHeapSize) {
    close_backing(backing);
    return fail(MRC_ERR_INVALID, "a heap segment holds at most {} bytes", SharedHeap::kMaxHeapSize);
  }
  return MRC_OK;
}

// A free directory entry (*index) and `va_pages` free window pages from *first. REQUIRES: domain
// lock held.
mrc_status_t find_room_locked(mrc_seg_domain *d, uint64_t va_pages, unsigned *index,
                              uint64_t *first) {
  RootHeader *root = d->root;
  *index = kMaxSegments;
  for (unsigned i = 0; i < kMaxSegments; ++i) {
    if (root->segments[i].state == kEntryFree) {
      *index = i;
      break;
    }
  }
  *first = find_pages(d, root, va_pages);
  if (*index == kMaxSegments) {
    return fail(MRC_ERR_NO_MEMORY, "the directory holds {} segments already", kMaxSegments);
  }
  if (*first == ~uint64_t{0}) {
    return fail(MRC_ERR_NO_MEMORY, "no room for {} pages of 2 MiB in the window", va_pages);
  }
  return MRC_OK;
}

// Fills directory entry `index` and marks it creating, its window pages taken: from here on a
// crash is rolled back by repair_locked(). REQUIRES: domain lock held.
SegEntry &record_intent_locked(mrc_seg_domain *d, const mrc_seg_params_t *p, const SegLayout &lay,
                               const Backing &backing, unsigned index, uint64_t first) {
  RootHeader *root = d->root;
  SegEntry &e = root->segments[index];
  std::memset(&e, 0, sizeof e);
  e.flags = p->flags & (MRC_SEG_HEAP | MRC_SEG_NODATA | MRC_SEG_FILE);
  e.generation = root->next_generation++;
  e.file_tag = random_u64();
  e.va_offset = first * kVaPageSize;
  e.va_pages = lay.va_pages;
  e.map_size = lay.map_size;
  e.data_offset = lay.data_offset;
  e.data_size = lay.data_size;
  e.numa_node = p->numa_node;
  e.creator_slot = static_cast<uint32_t>(d->slot);
  e.created_ns = realtime_ns();
  std::strcpy(e.name, p->name);  // NOLINT: bounded by valid_name
  if (backing.fd >= 0) {
    struct stat sb {};
    fstat(backing.fd, &sb);
    e.backing_dev = sb.st_dev;
    e.backing_ino = sb.st_ino;
    std::strcpy(e.backing_path, p->backing_file);  // NOLINT: bounded by validate_params
  }
  commit();
  e.state = kEntryCreating;
  commit();
  mark_pages(root, d->va_pages, first, lay.va_pages, true);
  return e;
}

// Creates the segment's /dev/shm file (a fresh tag when its name is taken) and maps it at
// `start`. May change e->file_tag.
mrc_status_t create_segment_file(mrc_seg_domain *d, const char *segment_name, SegEntry *e,
                                 uint64_t map_size, char *start) {
  char name[160];
  segment_shm_name(d->prefix, e->generation, e->file_tag, segment_name, name);
  int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, d->mode);
  // Taken: by a file that someone guessed (or a crash left) under this very name. A new tag
  // gives a new name; the other file costs us nothing (check and repair skip foreign files).
  for (int attempt = 0; fd < 0 && errno == EEXIST && attempt < 8; ++attempt) {
    e->file_tag = random_u64();
    segment_shm_name(d->prefix, e->generation, e->file_tag, segment_name, name);
    fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, d->mode);
  }
  if (fd < 0) return fail(MRC_ERR_IO, "creating /dev/shm{}: {}", name, errno_text(errno));
  mrc_status_t st = give_to_domain(fd, name, d->uid, d->gid, d->mode);
  if (st == MRC_OK && ftruncate(fd, static_cast<off_t>(map_size)) != 0) {
    st = fail(MRC_ERR_IO, "sizing /dev/shm{}: {}", name, errno_text(errno));
  } else if (st == MRC_OK && mmap(start, map_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
                                  fd, 0) != start) {
    st = fail(MRC_ERR_NO_MEMORY, "mapping /dev/shm{}: {}", name, errno_text(errno));
  }
  close(fd);
  return st;
}

// Maps the backing file over the segment's data.
mrc_status_t map_backing(const mrc_seg_params_t *p, const Backing &backing, char *data,
                         uint64_t data_size) {
  if (mmap(data, data_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, backing.fd, 0) ==
      data) {
    return MRC_OK;
  }
  return fail(backing.hugepage != 0 && errno == ENOMEM ? MRC_ERR_NO_MEMORY : MRC_ERR_IO,
              "mapping {}: {}{}", p->backing_file, errno_text(errno),
              backing.hugepage != 0 ? " (not enough free huge pages?)" : "");
}

// Writes the segment header that check_segment_header (internal/validate.h) will hold later
// mappings to, and sets up the heap of a MRC_SEG_HEAP segment.
mrc_status_t init_header(const mrc_seg_domain *d, const mrc_seg_params_t *p, const SegEntry &e,
                         const SegLayout &lay, MappedSegment *m) {
  auto *h = reinterpret_cast<SegHeader *>(m->start);
  h->magic = kSegMagic;
  h->layout_version = kLayoutVersion;
  h->flags = e.flags;
  h->domain_id = d->domain_id;
  h->generation = e.generation;
  h->base = reinterpret_cast<uint64_t>(m->start);
  h->map_size = lay.map_size;
  h->data_offset = lay.data_offset;
  h->data_size = lay.data_size;
  h->numa_node = p->numa_node;
  std::strcpy(h->name, p->name);  // NOLINT: bounded
  mrc_status_t st = MRC_OK;
  if ((p->flags & MRC_SEG_HEAP) != 0) st = SharedHeap::init(&h->heap, m->data, lay.data_size);
  m->header = h;
  return st;
}

// Gives the segment its bytes at its window range, which *m describes: the /dev/shm file (and
// the backing file), bound to the NUMA node, with its header written. Nothing for
// MRC_SEG_NODATA.
mrc_status_t map_segment(mrc_seg_domain *d, const mrc_seg_params_t *p, SegEntry *e,
                         const SegLayout &lay, const Backing &backing, MappedSegment *m) {
  if ((p->flags & MRC_SEG_NODATA) != 0) return MRC_OK;
  mrc_status_t st = create_segment_file(d, p->name, e, lay.map_size, m->start);
  if (st == MRC_OK && backing.fd >= 0) st = map_backing(p, backing, m->data, lay.data_size);
  // NUMA: the policy goes on before anything touches the pages.
  if (st == MRC_OK && p->numa_node >= 0) {
    st = numa_bind(m->start, lay.map_size, p->numa_node);
    if (st == MRC_OK && backing.fd >= 0) st = numa_bind(m->data, lay.data_size, p->numa_node);
  }
  if (st == MRC_OK) st = init_header(d, p, *e, lay, m);
  return st;
}

// Creates a segment. REQUIRES: domain lock held, no ready entry of that name. On failure the
// directory entry is torn down and the range is reserved again.
mrc_status_t create_locked(mrc_seg_domain *d, const mrc_seg_params_t *p, MappedSegment *m) {
  SegLayout lay{};
  Backing backing;
  mrc_status_t st = plan_layout(d, p, &lay, &backing);
  if (st != MRC_OK) return st;
  unsigned index = kMaxSegments;
  uint64_t first = 0;
  st = find_room_locked(d, lay.va_pages, &index, &first);
  if (st != MRC_OK) {
    close_backing(&backing);
    return st;
  }
  SegEntry &e = record_intent_locked(d, p, lay, backing, index, first);

  char *start = reinterpret_cast<char *>(d->base + e.va_offset);
  m->start = start;
  m->va_len = lay.va_pages * kVaPageSize;
  m->map_size = lay.map_size;
  m->data = start + lay.data_offset;
  m->data_size = lay.data_size;
  st = map_segment(d, p, &e, lay, backing, m);
  close_backing(&backing);
  if (st != MRC_OK) {
    (void)reserve_again(start, m->va_len);
    m->header = nullptr;
    teardown_entry_locked(d, index);
    return st;
  }

  // Publish: the creator is the first client, and the entry is ready for others to map.
  set_client_bit(e, static_cast<unsigned>(d->slot), true);
  commit();
  e.state = kEntryReady;
  m->entry = index;
  m->generation = e.generation;
  return MRC_OK;
}

}  // namespace

mrc_status_t segment_open(mrc_seg_domain *d, const mrc_seg_params_t *p, mrc_seg **out) noexcept {
  clear_error();
  if (out == nullptr) return fail(MRC_ERR_INVALID, "out is NULL");
  if (!usable_here(d)) return MRC_ERR_INVALID;
  if (d->observer) return fail(MRC_ERR_INVALID, "an observer handle cannot open segments");
  mrc_status_t st = validate_params(p);
  if (st != MRC_OK) return st;
  if ((p->flags & MRC_SEG_HUGETLB) != 0) {
    return fail(MRC_ERR_UNSUPPORTED,
                "named segments live in /dev/shm (tmpfs, no huge pages): use MRC_SEG_FILE with a "
                "backing_file on hugetlbfs, or a memfd segment");
  }
  if (p->numa_node >= 0) {
    st = numa_check_node(p->numa_node);
    if (st != MRC_OK) return st;
  }
  auto *m = new (std::nothrow) MappedSegment;
  if (m == nullptr) return fail(MRC_ERR_NO_MEMORY, "out of memory");

  pthread_mutex_lock(&d->mu);
  st = lock_domain(d, nullptr);
  if (st != MRC_OK) {
    pthread_mutex_unlock(&d->mu);
    delete m;
    return st;
  }
  RootHeader *root = d->root;
  int found = -1;
  for (unsigned i = 0; i < kMaxSegments; ++i) {
    if (root->segments[i].state == kEntryReady &&
        std::strncmp(root->segments[i].name, p->name, sizeof root->segments[i].name) == 0) {
      found = static_cast<int>(i);
      break;
    }
  }
  bool created = false;
  MappedSegment *result = nullptr;
  // The entry as used: a copy, checked (internal/validate.h) before anything of it is used, so a
  // value scribbled into the directory is MRC_ERR_IO and never an address.
  SegEntry e{};
  if (found >= 0) {
    e = root->segments[found];
    const unsigned kinds = MRC_SEG_HEAP | MRC_SEG_NODATA | MRC_SEG_FILE;
    st = check_entry(e, static_cast<unsigned>(found), window_limits(d));
    if (st != MRC_OK) {
      // MRC_ERR_IO with the field named.
    } else if ((p->flags & MRC_SEG_EXCL) != 0) {
      st = fail(MRC_ERR_EXISTS, "segment {} exists", p->name);
    } else if ((p->flags & kinds) != e.flags) {
      st = fail(MRC_ERR_INVALID, "segment {} exists with flags {:#x}, asked {:#x}", p->name,
                e.flags, p->flags & kinds);
    } else if (p->size > e.data_size) {
      st = fail(MRC_ERR_INVALID, "segment {} exists with {} bytes, asked {}", p->name, e.data_size,
                p->size);
    } else {
      for (MappedSegment *x = d->maps; x != nullptr; x = x->next) {
        if (x->entry == static_cast<uint32_t>(found) && x->generation == e.generation) result = x;
      }
      if (result == nullptr) {
        st = map_existing_locked(d, e, m);
        if (st == MRC_OK) {
          m->entry = static_cast<uint32_t>(found);
          m->generation = e.generation;
          set_client_bit(root->segments[found], static_cast<unsigned>(d->slot), true);
          result = m;
        }
      }
    }
  } else if ((p->flags & MRC_SEG_NOCREATE) != 0) {
    st = fail(MRC_ERR_NOT_FOUND, "no segment {}", p->name);
  } else {
    st = create_locked(d, p, m);
    if (st == MRC_OK) {
      e = root->segments[m->entry];
      result = m;
      created = true;
    }
  }
  unlock_domain(d);
  if (st == MRC_OK) {
    if (result == m) {
      m->flags = e.flags;
      m->numa_node = e.numa_node;
      std::memcpy(m->name, e.name, sizeof m->name);  // checked, or ours
      m->name[kNameMax] = '\0';
      m->next = d->maps;
      d->maps = m;
    } else {
      delete m;
    }
    mrc_seg *seg = new_handle(d, result, created);
    if (seg == nullptr) {
      pthread_mutex_unlock(&d->mu);
      mrc_seg tmp;
      tmp.domain = d;
      tmp.map = result;
      result->refs++;
      d->open_segments++;
      (void)segment_close(&tmp);  // undo the open (takes mu itself)
      return fail(MRC_ERR_NO_MEMORY, "out of memory");
    }
    result->refs++;
    d->open_segments++;
    *out = seg;
  } else {
    delete m;
  }
  pthread_mutex_unlock(&d->mu);
  return st;
}

mrc_status_t segment_close(mrc_seg *seg) noexcept {
  mrc_seg_domain *d = seg->domain;
  MappedSegment *m = seg->map;
  if (!usable_here(d)) return MRC_ERR_INVALID;
  pthread_mutex_lock(&d->mu);
  if (--m->refs == 0) {
    // Leave the directory first, then give the range back to the reservation while still
    // holding mu: no thread of ours can map the pages' next owner before.
    if (lock_domain(d, nullptr) == MRC_OK) {
      SegEntry &e = d->root->segments[m->entry];
      if (e.state == kEntryReady && e.generation == m->generation) {
        set_client_bit(e, static_cast<unsigned>(d->slot), false);
        if (!has_clients(e)) teardown_entry_locked(d, m->entry);
      }
      unlock_domain(d);
    }
    unmap_segment_locked(d, m);
  }
  d->open_segments--;
  pthread_mutex_unlock(&d->mu);
  return MRC_OK;
}

}  // namespace mrc::seg
