// SPDX-License-Identifier: BSD-3-Clause
/* A program built against the 0.1 headers (tests/abi/v0.1, never edited) and linked against the
 * 0.1 symbol versions, run on today's libmrcache.so.0: the 0.1 layouts of mrc_cache_params_t,
 * mrc_stats_t, mrc_monitor_info_t, mrc_seg_domain_params_t, mrc_seg_params_t and the plugin ops
 * table mrc_backend_t (its own plugin's, the built-in ones, mrc_backend_complete's) must keep
 * meaning what they meant. Each struct sits before
 * a canary, because a library that writes its own (larger) layout into a 0.1 caller's struct
 * corrupts the caller's next variable without crashing. Returns 0 when every check holds. */
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "mrcache/mrcache.h"

#if MRC_VERSION_MINOR != 1
#error "built against the wrong headers: this consumer stands for a program built against 0.1"
#endif

static int failures;
#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                              \
    }                                                                          \
  } while (0)

#define CANARY 0xa5
static int canary_intact(const unsigned char *canary, size_t len) {
  for (size_t i = 0; i < len; ++i) {
    if (canary[i] != CANARY) return 0;
  }
  return 1;
}

struct plugin_state {
  unsigned regs, deregs;
};

static mrc_status_t plugin_reg(void *ctx, void *addr, size_t len, unsigned prot, void **handle,
                               uint64_t *key) {
  struct plugin_state *state = ctx;
  (void)len;
  (void)prot;
  *handle = addr;
  *key = 7000u + state->regs++;
  return MRC_OK;
}

static void plugin_dereg(void *ctx, void *handle) {
  struct plugin_state *state = ctx;
  (void)handle;
  state->deregs++;
}

static const mrc_backend_t plugin = {"abi-plugin", plugin_reg, plugin_dereg, NULL};

int main(void) {
  const char *version = mrc_version();
  CHECK(version != NULL);
  printf("library %s, headers %d.%d.%d\n", version ? version : "(null)", MRC_VERSION_MAJOR,
         MRC_VERSION_MINOR, MRC_VERSION_PATCH);
  CHECK(version != NULL && strncmp(version, "0.", 2) == 0);

  struct {
    mrc_cache_params_t params;
    unsigned char canary[64];
  } p;
  memset(&p, CANARY, sizeof p);
  mrc_cache_params_init(&p.params);
  CHECK(canary_intact(p.canary, sizeof p.canary));
  CHECK(p.params.name != NULL && strcmp(p.params.name, "mrcache") == 0);
  CHECK(p.params.backend == mrc_backend_null());
  CHECK(p.params.backend_ctx == NULL);
  CHECK(p.params.max_regions == 0 && p.params.alignment == 0);
  CHECK(p.params.env_status == MRC_OK);

  memset(&p, CANARY, sizeof p);
  char err[128];
  CHECK(mrc_cache_params_init_checked(&p.params, err, sizeof err) == MRC_OK);
  CHECK(canary_intact(p.canary, sizeof p.canary));
  CHECK(p.params.backend == mrc_backend_null());

  struct plugin_state state = {0, 0};
  p.params.name = "abi-v0.1";
  p.params.backend = &plugin;
  p.params.backend_ctx = &state;
  p.params.max_regions = 64;
  mrc_cache_t *cache = NULL;
  CHECK(mrc_cache_create(NULL, &cache) == MRC_ERR_INVALID);
  CHECK(mrc_cache_create(&p.params, &cache) == MRC_OK);
  if (cache == NULL) {
    fprintf(stderr, "no cache: %d checks failed\n", failures);
    return 1;
  }

  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  enum { kPages = 8, kRounds = 3 };
  char *mem = mmap(NULL, kPages * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  CHECK(mem != MAP_FAILED);
  memset(mem, 1, kPages * page);
  unsigned gets = 0;
  for (int round = 0; round < kRounds; ++round) {
    for (size_t i = 0; i < kPages; ++i) {
      mrc_region_t *region = NULL;
      CHECK(mrc_get(cache, mem + i * page, page, MRC_PROT_READ, &region) == MRC_OK);
      if (region == NULL) continue;
      ++gets;
      /* The key comes from the plugin: backend and backend_ctx arrived where 0.1 put them. */
      CHECK(mrc_region_key(region) >= 7000u && mrc_region_key(region) < 7000u + state.regs);
      CHECK(mrc_region_length(region) >= page);
      mrc_put(cache, region);
    }
  }

  struct {
    mrc_stats_t stats;
    unsigned char canary[64];
  } s;
  memset(&s, CANARY, sizeof s);
  CHECK(mrc_cache_stats(cache, &s.stats) == MRC_OK);
  CHECK(canary_intact(s.canary, sizeof s.canary));
  printf("stats: gets %llu puts %llu hits %llu misses %llu registrations %llu regions %llu\n",
         (unsigned long long)s.stats.gets, (unsigned long long)s.stats.puts,
         (unsigned long long)(s.stats.hits_fast + s.stats.hits_slow),
         (unsigned long long)s.stats.misses, (unsigned long long)s.stats.registrations,
         (unsigned long long)s.stats.regions);
  CHECK(s.stats.gets == gets && s.stats.puts == gets);
  CHECK(s.stats.hits_fast + s.stats.hits_slow + s.stats.misses == s.stats.gets);
  CHECK(s.stats.registrations == state.regs && s.stats.registrations >= 1);
  CHECK(s.stats.regions <= 64);
  CHECK(s.stats.unreleased_bytes == 0); /* the last field of the 0.1 layout */

  char json[4096];
  int n = mrc_cache_stats_json(cache, json, sizeof json);
  CHECK(n > 0 && (size_t)n < sizeof json);
  /* The name arrived where 0.1 put it. */
  CHECK(n > 0 && strstr(json, "\"name\":\"abi-v0.1\"") != NULL);

  struct {
    mrc_monitor_info_t info;
    unsigned char canary[64];
  } m;
  memset(&m, CANARY, sizeof m);
  CHECK(mrc_monitor_info(&m.info) == MRC_OK);
  CHECK(canary_intact(m.canary, sizeof m.canary));
  CHECK(m.info.mode_name != NULL && m.info.mode_name[0] != '\0');
  CHECK(m.info.mode >= MRC_MONITOR_WP_ASYNC && m.info.mode <= MRC_MONITOR_UNCACHED);
  CHECK(memchr(m.info.reason, '\0', sizeof m.info.reason) != NULL);
  CHECK(m.info.vmas_added <= m.info.vma_budget || m.info.vma_budget == 0);
  printf("monitor: mode %s (%d), running %d, events %llu\n",
         m.info.mode_name ? m.info.mode_name : "(null)", (int)m.info.mode, m.info.running,
         (unsigned long long)m.info.events);

  /* Shared segments: mrc_seg_domain_params_t and mrc_seg_params_t of 0.1 have no struct_size. */
  struct {
    mrc_seg_params_t params;
    unsigned char canary[64];
  } sp;
  memset(&sp, CANARY, sizeof sp);
  mrc_seg_params_init(&sp.params);
  CHECK(canary_intact(sp.canary, sizeof sp.canary));
  CHECK(sp.params.name == NULL && sp.params.size == 0 && sp.params.flags == 0 &&
        sp.params.numa_node == -1 && sp.params.backing_file == NULL);

  struct {
    mrc_seg_domain_params_t params;
    unsigned char canary[64];
  } d;
  memset(&d, CANARY, sizeof d);
  mrc_seg_domain_params_init(&d.params);
  CHECK(canary_intact(d.canary, sizeof d.canary));
  CHECK(d.params.prefix == NULL && d.params.base == 0 && d.params.uid == -1 && d.params.gid == -1 &&
        d.params.join_timeout_ms == 0);
  char prefix[64];
  snprintf(prefix, sizeof prefix, "mrc-abi-v01-%d", (int)getpid());
  d.params.prefix = prefix;
  d.params.size = 1ull << 30;
  mrc_seg_domain_t *domain = NULL;
  CHECK(mrc_seg_domain_open(&d.params, &domain) == MRC_OK);
  if (domain != NULL) {
    mrc_seg_domain_info_t dinfo;
    CHECK(mrc_seg_domain_info(domain, &dinfo) == MRC_OK);
    /* The size arrived where 0.1 put it. */
    CHECK(dinfo.size == 1ull << 30 && dinfo.created == 1);
    mrc_seg_t *seg = NULL;
    CHECK(mrc_seg_open(domain, "abi", 1 << 20, MRC_SEG_HEAP, &seg) == MRC_OK);
    if (seg != NULL) {
      void *block = mrc_seg_alloc(seg, 4096, 0);
      CHECK(block != NULL);
      mrc_seg_free(seg, block);
      CHECK(mrc_seg_close(seg) == MRC_OK);
    }
    /* The size and flags of mrc_seg_open_ex arrive where 0.1 put them. */
    sp.params.name = "abi-ex";
    sp.params.size = 2u << 20;
    sp.params.flags = MRC_SEG_HEAP;
    mrc_seg_t *ex = NULL;
    CHECK(mrc_seg_open_ex(domain, &sp.params, &ex) == MRC_OK);
    if (ex != NULL) {
      mrc_seg_info_t sinfo;
      CHECK(mrc_seg_info(ex, &sinfo) == MRC_OK);
      CHECK(sinfo.size == 2u << 20 && sinfo.flags == MRC_SEG_HEAP && sinfo.numa_node == -1);
      CHECK(mrc_seg_alloc(ex, 4096, 0) != NULL);
      CHECK(mrc_seg_close(ex) == MRC_OK);
    }
    printf("segments: domain of %llu bytes at 0x%llx, prefix %s\n", (unsigned long long)dinfo.size,
           (unsigned long long)dinfo.base, prefix);
    CHECK(mrc_seg_domain_close(domain) == MRC_OK);
  }
  unsigned removed = 0;
  CHECK(mrc_seg_domain_remove(&d.params, &removed) == MRC_OK);

  /* A memfd segment from the 0.1 layout. */
  sp.params.name = "abi-memfd";
  sp.params.size = 1u << 20;
  sp.params.flags = MRC_SEG_HEAP;
  mrc_seg_t *memfd = NULL;
  CHECK(mrc_seg_memfd_create(&sp.params, &memfd) == MRC_OK);
  if (memfd != NULL) {
    mrc_seg_info_t minfo;
    CHECK(mrc_seg_info(memfd, &minfo) == MRC_OK);
    CHECK(minfo.size == 1u << 20 && minfo.flags == MRC_SEG_HEAP && minfo.numa_node == -1);
    CHECK(mrc_seg_alloc(memfd, 4096, 0) != NULL);
    CHECK(mrc_seg_close(memfd) == MRC_OK);
  }
  CHECK(canary_intact(sp.canary, sizeof sp.canary));

  /* Ops tables of 0.1, without struct_size. mrc_backend_complete reads and writes 0.1's layout:
   * the plugin's operations and the defaults arrive where 0.1 put them. */
  struct {
    mrc_backend_t ops;
    unsigned char canary[64];
  } c;
  memset(&c, CANARY, sizeof c);
  CHECK(mrc_backend_complete(&plugin, &c.ops) == MRC_OK);
  CHECK(canary_intact(c.canary, sizeof c.canary));
  CHECK(c.ops.name != NULL && strcmp(c.ops.name, "abi-plugin") == 0);
  CHECK(c.ops.reg == plugin_reg && c.ops.dereg == plugin_dereg && c.ops.describe != NULL);
  char text[64] = "";
  CHECK(c.ops.describe != NULL && c.ops.describe(&state, mem, text, sizeof text) > 0 &&
        strncmp(text, "handle ", 7) == 0);
  CHECK(mrc_backend_complete(NULL, &c.ops) == MRC_ERR_INVALID);
  CHECK(canary_intact(c.canary, sizeof c.canary));
  const mrc_backend_t empty = {0};
  memset(&c, CANARY, sizeof c);
  CHECK(mrc_backend_complete(&empty, &c.ops) == MRC_OK);
  CHECK(canary_intact(c.canary, sizeof c.canary));
  CHECK(c.ops.name != NULL && strcmp(c.ops.name, "plugin") == 0);
  void *handle = NULL;
  uint64_t key = 0;
  CHECK(c.ops.reg != NULL &&
        c.ops.reg(NULL, mem, page, MRC_PROT_READ, &handle, &key) == MRC_ERR_UNSUPPORTED);

  /* The built-in tables in 0.1's layout: the null engine registers through it. */
  const mrc_backend_t *null_ops = mrc_backend_null();
  CHECK(null_ops != NULL && null_ops->name != NULL && strcmp(null_ops->name, "null") == 0);
  if (null_ops != NULL) {
    CHECK(null_ops->reg(NULL, mem, page, MRC_PROT_READ, &handle, &key) == MRC_OK && key >= 1);
    CHECK(null_ops->describe != NULL && null_ops->describe(NULL, handle, text, sizeof text) > 0);
    null_ops->dereg(NULL, handle);
    memset(&c, CANARY, sizeof c);
    CHECK(mrc_backend_complete(null_ops, &c.ops) == MRC_OK); /* complete already */
    CHECK(canary_intact(c.canary, sizeof c.canary));
    CHECK(c.ops.reg == null_ops->reg && c.ops.dereg == null_ops->dereg &&
          c.ops.describe == null_ops->describe);
  }
  const mrc_backend_t *iouring_ops = mrc_backend_iouring();
  CHECK(iouring_ops != NULL && iouring_ops->name != NULL &&
        strcmp(iouring_ops->name, "iouring") == 0 && iouring_ops->reg != NULL);
  const mrc_backend_t *verbs_ops = mrc_backend_verbs();
  CHECK(verbs_ops != NULL && verbs_ops->name != NULL && strcmp(verbs_ops->name, "verbs") == 0 &&
        verbs_ops->reg != NULL);

  /* A cache on 0.1's null table, named explicitly, and one on the completed plugin table. */
  memset(&c, CANARY, sizeof c);
  CHECK(mrc_backend_complete(&plugin, &c.ops) == MRC_OK);
  const mrc_backend_t *tables[2] = {null_ops, &c.ops};
  for (int t = 0; t < 2; ++t) {
    mrc_cache_params_init(&p.params);
    p.params.backend = tables[t];
    p.params.backend_ctx = t == 0 ? NULL : &state;
    mrc_cache_t *other = NULL;
    CHECK(mrc_cache_create(&p.params, &other) == MRC_OK);
    if (other == NULL) continue;
    const unsigned regs_before = state.regs;
    mrc_region_t *region = NULL;
    CHECK(mrc_get(other, mem, 2 * page, MRC_PROT_READ, &region) == MRC_OK);
    if (region != NULL) {
      CHECK(mrc_region_length(region) >= 2 * page);
      /* null: a serial number; the plugin: its own key. */
      CHECK(t == 0 ? state.regs == regs_before : mrc_region_key(region) >= 7000u);
      mrc_put(other, region);
    }
    mrc_cache_destroy(other);
  }
  CHECK(canary_intact(p.canary, sizeof p.canary));

  /* 0.1's mrc_cache_destroy destroys a cache whose region is still held (0.2's refuses): the
   * registration ends with it. */
  {
    mrc_cache_params_init(&p.params);
    p.params.backend = &c.ops;
    p.params.backend_ctx = &state;
    mrc_cache_t *held_cache = NULL;
    CHECK(mrc_cache_create(&p.params, &held_cache) == MRC_OK);
    mrc_region_t *held = NULL;
    if (held_cache != NULL) {
      CHECK(mrc_get(held_cache, mem + 4 * page, page, MRC_PROT_READ, &held) == MRC_OK);
      const unsigned deregs_before = state.deregs;
      mrc_cache_destroy(held_cache);
      CHECK(state.deregs == deregs_before + 1);
    }
  }

  mrc_cache_destroy(cache);
  CHECK(state.deregs == state.regs);

  /* A mixed build: a table laid out by 0.2 headers (struct_size first) handed to this program's
   * 0.1 symbols. Its first word is no name pointer but a size; read by that size, it works. */
  struct sized_table {
    size_t struct_size;
    const char *name;
    mrc_status_t (*reg)(void *, void *, size_t, unsigned, void **, uint64_t *);
    void (*dereg)(void *, void *);
    int (*describe)(void *, void *, char *, size_t);
  };
  const struct sized_table sized = {sizeof sized, "abi-sized", plugin_reg, plugin_dereg, NULL};
  struct plugin_state sized_state = {0, 0};
  p.params.name = "abi-sized-table";
  p.params.backend = (const mrc_backend_t *)(const void *)&sized;
  p.params.backend_ctx = &sized_state;
  cache = NULL;
  CHECK(mrc_cache_create(&p.params, &cache) == MRC_OK);
  if (cache != NULL) {
    mrc_region_t *region = NULL;
    CHECK(mrc_get(cache, mem, page, MRC_PROT_READ, &region) == MRC_OK);
    CHECK(region != NULL && mrc_region_key(region) == 7000u && sized_state.regs == 1);
    if (region != NULL) mrc_put(cache, region);
    mrc_cache_destroy(cache);
    CHECK(sized_state.deregs == sized_state.regs);
  }
  struct {
    struct sized_table ops;
    unsigned char canary[64];
  } sc;
  memset(&sc, CANARY, sizeof sc);
  sc.ops = sized;
  sc.ops.dereg = NULL;
  CHECK(mrc_backend_complete((const mrc_backend_t *)(const void *)&sc.ops,
                             (mrc_backend_t *)(void *)&sc.ops) == MRC_OK);
  CHECK(canary_intact(sc.canary, sizeof sc.canary));
  CHECK(sc.ops.struct_size == sizeof sized && sc.ops.reg == plugin_reg && sc.ops.dereg != NULL);
  CHECK(strcmp(sc.ops.name, "abi-sized") == 0);
  munmap(mem, kPages * page);

  if (failures != 0) {
    fprintf(stderr, "%d checks failed\n", failures);
    return 1;
  }
  printf("ok: a 0.1 program on libmrcache %s\n", version);
  return 0;
}
