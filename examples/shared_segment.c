// SPDX-License-Identifier: BSD-3-Clause
// Two processes share a segment mapped at one address in both, so pointers into it mean the same
// everywhere. The first process creates the domain and a segment with a heap, registers the
// segment through a cache, allocates a registered block and writes a message into it; then it
// runs a second process (this program again, with the block's address) that joins, reads the
// message at that very address, answers in place and frees the block. The last process out
// removes the segment and the domain's files.
#define _GNU_SOURCE
#include <inttypes.h>
#include <mrcache/mrcache.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static mrc_seg_domain_t *join_domain(const char *prefix) {
  mrc_seg_domain_params_t params;
  mrc_seg_domain_params_init(&params);
  params.prefix = prefix;  // a name space of its own: two runs never meet
  mrc_seg_domain_t *domain = NULL;
  if (mrc_seg_domain_open(&params, &domain) != MRC_OK) {
    fprintf(stderr, "mrc_seg_domain_open: %s\n", mrc_last_error());
  }
  return domain;
}

// The second process: join, read the message at the address the first one gave, answer.
static int peer(const char *prefix, const char *message_at, const char *spare_at) {
  char *message = (char *)(uintptr_t)strtoull(message_at, NULL, 16);
  char *spare = (char *)(uintptr_t)strtoull(spare_at, NULL, 16);
  mrc_seg_domain_t *domain = join_domain(prefix);
  if (domain == NULL) return 1;
  mrc_seg_t *seg = NULL;
  int understood = 0;
  if (mrc_seg_open(domain, "messages", 0, MRC_SEG_HEAP | MRC_SEG_NOCREATE, &seg) != MRC_OK) {
    fprintf(stderr, "peer: %s\n", mrc_last_error());
  } else {
    printf("peer %d: the segment is at %p too; it says \"%s\"\n", (int)getpid(), mrc_seg_base(seg),
           message);
    understood = strcmp(message, "hello from the first process") == 0;
    strcpy(message, "hello back");
    mrc_seg_free(seg, spare);  // a block the other process allocated
    mrc_seg_close(seg);
  }
  mrc_seg_domain_close(domain);
  return understood ? 0 : 1;
}

// Runs the peer on the block's address and waits for it; true when it answered in place.
static int ask_peer(char *argv0, const char *prefix, char *message, char *spare) {
  char message_at[32], spare_at[32];
  snprintf(message_at, sizeof message_at, "%" PRIxPTR, (uintptr_t)message);
  snprintf(spare_at, sizeof spare_at, "%" PRIxPTR, (uintptr_t)spare);
  fflush(stdout);  // before the fork: the child execs and would drop a copy of the buffer
  const pid_t child = fork();
  if (child < 0) {
    perror("fork");
    return 0;
  }
  if (child == 0) {
    execl("/proc/self/exe", argv0, "peer", prefix, message_at, spare_at, (char *)NULL);
    _exit(127);
  }
  int status = 0;
  waitpid(child, &status, 0);
  printf("first: the peer exited %d and answered \"%s\"\n", WEXITSTATUS(status), message);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 && strcmp(message, "hello back") == 0;
}

// Registers the segment through a cache, writes the message into a registered block and asks
// the peer; true when it answered. Frees, puts and closes what it made on every path.
static int share(mrc_seg_t *seg, mrc_cache_t *cache, char *argv0, const char *prefix) {
  mrc_region_t *region = NULL;
  if (mrc_seg_register(seg, cache, &region) != MRC_OK) {
    fprintf(stderr, "mrc_seg_register: %s\n", mrc_last_error());
    return 0;
  }
  int answered = 0;
  uint64_t key = 0;
  char *message = mrc_seg_alloc_registered(seg, 64, 0, &key);  // comes registered: its key
  char *spare = mrc_seg_alloc(seg, 64, 0);                     // the peer frees this one
  if (message == NULL || spare == NULL) {
    fprintf(stderr, "mrc_seg_alloc: %s\n", mrc_last_error());
    if (spare != NULL) mrc_seg_free(seg, spare);
  } else {
    strcpy(message, "hello from the first process");
    printf("first %d: segment at %p, message at %p with key %#" PRIx64 "\n", (int)getpid(),
           mrc_seg_base(seg), (void *)message, key);
    answered = ask_peer(argv0, prefix, message, spare);
  }
  if (message != NULL) mrc_seg_free(seg, message);
  mrc_put(cache, region);
  return answered;
}

int main(int argc, char **argv) {
  if (argc == 5 && strcmp(argv[1], "peer") == 0) return peer(argv[2], argv[3], argv[4]);
  char prefix[32];
  snprintf(prefix, sizeof prefix, "mrcache-example-%d", (int)getpid());
  mrc_seg_domain_t *domain = join_domain(prefix);
  if (domain == NULL) return 1;
  mrc_cache_params_t params;
  mrc_cache_params_init(&params);
  params.backend = mrc_backend_null();
  mrc_cache_t *cache = NULL;
  mrc_seg_t *seg = NULL;
  int ok = 0;
  if (mrc_cache_create(&params, &cache) != MRC_OK) {
    fprintf(stderr, "mrc_cache_create: %s\n", mrc_last_error());
  } else {
    if (mrc_seg_open(domain, "messages", 1 << 20, MRC_SEG_HEAP, &seg) != MRC_OK) {
      fprintf(stderr, "mrc_seg_open: %s\n", mrc_last_error());
    } else {
      ok = share(seg, cache, argv[0], prefix);
      mrc_seg_close(seg);  // unmapping it ends the registration, through the cache's monitor
    }
    ok = mrc_cache_destroy(cache) == MRC_OK && ok;
  }
  mrc_seg_domain_close(domain);  // the last one out: the files go, on every path
  return ok ? 0 : 1;
}
