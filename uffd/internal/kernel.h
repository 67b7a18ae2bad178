// SPDX-License-Identifier: BSD-3-Clause
// Kernel interface definitions that are newer than the build machine's headers.
//
// Debian 12 ships the 6.1 UAPI headers while the machines run 6.18: UFFD_FEATURE_WP_ASYNC (6.7)
// and UFFD_FEATURE_WP_UNPOPULATED (6.4) are missing there. Everything here is the kernel's stable
// ABI, restated so that the code compiles against either header set and asks the running kernel
// at run time.
#pragma once

#include <linux/userfaultfd.h>
#include <sys/ioctl.h>

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
