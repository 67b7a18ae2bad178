// Kernel interface definitions that are newer than the build machine's headers.
//
// Debian 12 ships the 6.1 UAPI headers while the machines run 6.18: UFFD_FEATURE_WP_ASYNC (6.7),
// UFFD_FEATURE_WP_UNPOPULATED (6.4) and PROCMAP_QUERY (6.11) are missing there. Everything here
// is the kernel's stable ABI, restated so that the code compiles against either header set and
// asks the running kernel at run time.
#pragma once

#include <linux/userfaultfd.h>
#include <sys/ioctl.h>

#include <cstddef>
#include <cstdint>

#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1
#endif
#ifndef UFFD_FEATURE_WP_HUGETLBFS_SHMEM
#define UFFD_FEATURE_WP_HUGETLBFS_SHMEM (1 << 12)
#endif
#ifndef UFFD_FEATURE_WP_UNPOPULATED
#define UFFD_FEATURE_WP_UNPOPULATED (1 << 13)
#endif
#ifndef UFFD_FEATURE_WP_ASYNC
#define UFFD_FEATURE_WP_ASYNC (1 << 15)
#endif
#ifndef USERFAULTFD_IOC
#define USERFAULTFD_IOC 0xAA
#endif
#ifndef USERFAULTFD_IOC_NEW
#define USERFAULTFD_IOC_NEW _IO(USERFAULTFD_IOC, 0x00)
#endif

namespace mrc::uffd::kernel {

// struct procmap_query from <linux/fs.h> (Linux 6.11). Declared under our own name so that a
// newer header's definition cannot collide with it; the layout is the ABI.
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

inline constexpr unsigned long kProcmapQuery = _IOWR('f', 17, ProcmapQuery);

// Bits of ProcmapQuery::query_flags (filters) and of ::vma_flags (the answer).
inline constexpr uint64_t kProcmapVmaReadable = 0x01;
inline constexpr uint64_t kProcmapVmaWritable = 0x02;
inline constexpr uint64_t kProcmapVmaExecutable = 0x04;
inline constexpr uint64_t kProcmapVmaShared = 0x08;
inline constexpr uint64_t kProcmapCoveringOrNextVma = 0x10;

}  // namespace mrc::uffd::kernel
