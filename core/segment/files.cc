// SPDX-License-Identifier: BSD-3-Clause
// The domain's files and its window in this process: whether a /dev/shm name still names an
// open file, reserving the window (and re-reserving a segment's range when it closes), and
// unlinking a segment's file when it belongs to the domain.
//
// SYNCHRONIZATION: see domain.h. unlink_segment_file runs under the shared domain lock (its
// callers are *_locked, and it counts files_unlinked); the rest keeps no shared state.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "core/segment/internal/domain_calls.h"
#include "core/segment/internal/sys.h"

namespace mrc::seg {

bool same_file(int fd, const char *name) {
  const int other = shm_open(name, O_RDONLY, 0);
  if (other < 0) return false;
  struct stat a {
  }, b{};
  const bool same =
      fstat(fd, &a) == 0 && fstat(other, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
  close(other);
  return same;
}

mrc_status_t reserve_window(uint64_t base, uint64_t size) {
  void *want = reinterpret_cast<void *>(base);
  void *got = mmap(want, size, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
  if (got == MAP_FAILED) {
    if (errno == EEXIST) {
      return fail(MRC_ERR_EXISTS,
                  "something is already mapped in [{:#x}, {:#x}) in this process: the domain "
                  "window cannot go there (nothing was replaced)",
                  base, base + size);
    }
    return fail(MRC_ERR_NO_MEMORY, "reserving the window [{:#x}, {:#x}): {}", base, base + size,
                errno_text(errno));
  }
  if (got != want) {  // a kernel older than 4.17 treats the flag as a hint
    munmap(got, size);
    return fail(MRC_ERR_EXISTS, "the window [{:#x}, {:#x}) is not free in this process", base,
                base + size);
  }
  return MRC_OK;
}

// The segment file of `e`, unlinked when it is ours (owned by the domain's uid).
void unlink_segment_file(mrc_seg_domain *d, const SegEntry &e) {
  char name[160];
  if (!entry_file_name(d, e, name)) return;  // a scribbled name names no file of ours
  const int fd = shm_open(name, O_RDONLY, 0);
  if (fd < 0) return;  // never created, or already gone
  struct stat st {};
  if (fstat(fd, &st) == 0 && owned_by_domain(st.st_uid, st.st_gid, d->uid, d->gid, d->mode)) {
    if (shm_unlink(name) == 0) d->files_unlinked++;
  } else {
    set_error("{} does not belong to the domain: left alone", name);
  }
  close(fd);
}

bool reserve_again(void *start, size_t len) noexcept {
  return mmap(start, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1,
              0) == start;
}

}  // namespace mrc::seg
