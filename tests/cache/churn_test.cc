// SPDX-License-Identifier: BSD-3-Clause
// Learning which ranges churn (docs/DESIGN.md, "Churn"): a buffer that is a new mapping for every
// message gains nothing from the cache, and watching it made every munmap of it wait for the
// monitor. After two such registrations in a row the cache registers that range uncached, so the
// monitor sees no event of it. The same holds for a buffer used again while its reuses saved
// less than the watch and the munmap's round trip cost (a registration cheaper than a watch); a
// range whose reuses pay stays cached; a sample that pays turns caching back on;
// MRC_FLAG_CACHE_CHURN keeps every registration cached.
#include <sys/mman.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "base/ticks.h"
#include "cache_fixture.h"
#include "mrcache/mrcache.h"
#include "uffd/testing.h"

namespace {

using mrc::test::CacheFixture;
using mrc::test::kPage;
using mrc::test::monitor_caches;

constexpr size_t kPages = 16;

class CacheChurn : public CacheFixture, public ::testing::WithParamInterface<bool> {
 protected:
  void SetUp() override {
    if (!monitor_caches())
      GTEST_SKIP() << "userfaultfd is unavailable here: the cache runs uncached";
  }
  void TearDown() override {
    CacheFixture::TearDown();
    mrc::uffd::testing::set_round_trip_ticks(0);
  }
  void create_cache(unsigned flags) {
    mrc_cache_params_t params = backend.params("churn");
    params.flags &= ~static_cast<unsigned>(MRC_FLAG_ORDERED_UNMAPS | MRC_FLAG_CACHE_CHURN);
    params.flags |= flags | (GetParam() ? unsigned{MRC_FLAG_ORDERED_UNMAPS} : 0u);
    ASSERT_EQ(create(params), MRC_OK);
    // The address every message's mapping takes: the same buffer freed and allocated again, as
    // glibc does above its mmap threshold. Taken with MAP_FIXED_NOREPLACE, so nothing else may
    // be mapped there meanwhile: it is the lowest page of a free area far larger than the buffer.
    // The kernel places new mappings at the top of the highest free area that fits, so a
    // runtime's own (a sanitizer's, the monitor's) land tens of megabytes above it.
    constexpr size_t kRoom = size_t{64} << 20;
    void *room =
        mmap(nullptr, kRoom, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    ASSERT_NE(room, MAP_FAILED);
    address_ = static_cast<char *>(room);
    ASSERT_EQ(munmap(room, kRoom), 0);
  }
  // The back-off's tests: the counting backend registers in well under a microsecond, far less
  // than a sample (a watch and a round trip) costs, so the gaps' cost bound (four samples' worth
  // of registrations) lies past the back-off's longest gap. Under a sanitizer a registration
  // measures tens of microseconds, as much as a loaded host's round trip: the round trip is set
  // to a second (the model's price only; nothing waits for it).
  void price_samples_far_above_registrations() {
    mrc::uffd::testing::set_round_trip_ticks(1000 * ticks_in_a_millisecond());
  }
  // os::ticks() across a sleep of one millisecond: at least a millisecond's worth.
  static uint64_t ticks_in_a_millisecond() {
    const uint64_t began = mrc::os::ticks();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return mrc::os::ticks() - began;
  }
  // One message: a new mapping, `gets` get/put pairs of all of it, munmap.
  void messages(unsigned count, unsigned gets) {
    for (unsigned m = 0; m < count; ++m) {
      void *p = mmap(address_, kPages * kPage, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
      ASSERT_EQ(p, address_) << "something else was mapped at the buffer's address";
      for (unsigned g = 0; g < gets; ++g) {
        mrc_region_t *region = nullptr;
        ASSERT_EQ(mrc_get(cache, p, kPages * kPage, MRC_PROT_READ | MRC_PROT_WRITE, &region),
                  MRC_OK);
        mrc_put(cache, region);
      }
      ASSERT_EQ(munmap(p, kPages * kPage), 0);
    }
  }
  uint64_t json_counter(const std::string &name) {
    char json[4096];
    EXPECT_GT(mrc_cache_stats_json(cache, json, sizeof json), 0);
    const std::string key = "\"" + name + "\":";
    const char *field = std::strstr(json, key.c_str());
    EXPECT_NE(field, nullptr) << json;
    return field == nullptr ? 0 : std::strtoull(field + key.size(), nullptr, 10);
  }
  // A buffer that stays: mapped at the churned address, got and put until a get hits. Returns the
  // gets before that hit (each registered: uncached, or the sample that the hit then finds).
  uint64_t gets_until_cached() {
    void *p = mmap(address_, kPages * kPage, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    EXPECT_EQ(p, address_);
    if (p != address_) return 0;
    uint64_t gets = 0;
    for (mrc_stats_t before = stats(); gets < 10000; ++gets) {
      mrc_region_t *region = nullptr;
      EXPECT_EQ(mrc_get(cache, p, kPages * kPage, MRC_PROT_READ | MRC_PROT_WRITE, &region), MRC_OK);
      if (region == nullptr) break;
      mrc_put(cache, region);
      const mrc_stats_t now = stats();
      if (now.hits_fast + now.hits_slow != before.hits_fast + before.hits_slow) break;
    }
    munmap(p, kPages * kPage);
    return gets;
  }
  uint64_t churn_skips() { return json_counter("churn_skips"); }
  // Skips taken at the get's start: no probe, no lookup.
  uint64_t churn_unprobed() { return json_counter("churn_unprobed"); }

  char *address_ = nullptr;
};

TEST_P(CacheChurn, AMappingThatChurnsIsRegisteredUncachedAndItsMunmapSendsNoEvent) {
  create_cache(0);
  price_samples_far_above_registrations();
  messages(40, 1);
  // Two registrations teach; of the 38 misses after them at most two are cached samples (gaps
  // of at least 8, then 16 misses).
  EXPECT_GE(churn_skips(), 35u);
  const mrc_stats_t s = stats();
  EXPECT_LE(s.invalidations, 4u) << "munmaps of uncached mappings must reach no monitor";
  EXPECT_EQ(s.gets, 40u);
  EXPECT_EQ(s.registrations, 40u);
  EXPECT_EQ(s.registrations, s.deregistrations) << "every uncached one ended at its put";
}

// An uncached registration is in no table, so a get that knows at once that its range churns
// needs neither a lookup nor, in exact mode, the probe that makes a lookup exact. Only the miss
// after each sample's munmap learns it late (the event is applied by that miss's slow path).
TEST_P(CacheChurn, AChurningRangesGetsTakeNoProbeAndNoLookup) {
  create_cache(0);
  price_samples_far_above_registrations();
  messages(40, 1);
  // At most two samples among the 38 misses after the two that taught, each followed by one
  // skip decided in the slow path.
  EXPECT_GE(churn_unprobed(), 34u);
  EXPECT_LE(churn_unprobed(), churn_skips());
  EXPECT_EQ(stats().hits_fast + stats().hits_slow, 0u);
}

// Threads share a churning range's tickets: each is taken by one get, so no more gets skip than
// were granted, and once they run out the sample is cached and every later get hits it.
TEST_P(CacheChurn, ThreadsTakeEachTicketOnceAndThenHitTheSample) {
  create_cache(0);
  price_samples_far_above_registrations();
  // Two teach; the first gap's tickets (at most 22) are taken here or below. When the tenth
  // message was the sample, its munmap is applied by the first get below and grants at most
  // 3 * 32 / 2 - 1 tickets.
  messages(10, 1);
  const uint64_t skips_before = churn_skips();
  void *p = mmap(address_, kPages * kPage, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  ASSERT_EQ(p, address_);
  constexpr unsigned kThreads = 4;
  constexpr unsigned kGets = 200;
  std::vector<std::thread> threads;
  std::atomic<unsigned> failures{0};
  for (unsigned t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (unsigned g = 0; g < kGets; ++g) {
        mrc_region_t *region = nullptr;
        if (mrc_get(cache, p, kPages * kPage, MRC_PROT_READ | MRC_PROT_WRITE, &region) != MRC_OK) {
          failures.fetch_add(1);
          continue;
        }
        mrc_put(cache, region);
      }
    });
  }
  for (std::thread &thread : threads) thread.join();
  ASSERT_EQ(failures.load(), 0u);
  const uint64_t skipped = churn_skips() - skips_before;
  EXPECT_LE(skipped, 47u) << "more gets skipped than tickets were granted";
  const mrc_stats_t s = stats();
  EXPECT_GE(s.hits_fast + s.hits_slow, kThreads * kGets - skipped - 1) << "the sample is hit";
  ASSERT_EQ(munmap(p, kPages * kPage), 0);
}

TEST_P(CacheChurn, SamplesGetRarerWhileTheyKeepChurning) {
  create_cache(0);
  price_samples_far_above_registrations();
  messages(2000, 1);
  // Without the back-off one miss in 16 would be cached: 125 of them. With it the gaps between
  // samples are at least 8, 16, 32, ... 512 misses: at most 8 samples in 1,998 misses, plus the
  // two that taught. (Counted as invalidations: the monitor's events also report memory of the
  // process that merged into a watched buffer's VMA.)
  const mrc_stats_t s = stats();
  EXPECT_LE(s.invalidations, 10u) << "cached registrations ended by their munmap";
  EXPECT_GE(churn_skips(), 1980u);
}

// Milliseconds per registration, as a NIC's of a large buffer: one reuse saves far more than any
// watch and round trip to the monitor cost (tens of microseconds at worst on a loaded machine).
constexpr uint32_t kCostlyRegistrationUs = 2000;

TEST_P(CacheChurn, ARangeWhoseReuseSavesMoreThanItCostsStaysCached) {
  backend.reg_delay_us = kCostlyRegistrationUs;
  create_cache(0);
  messages(20, 2);
  EXPECT_EQ(churn_skips(), 0u);
  const mrc_stats_t s = stats();
  EXPECT_EQ(s.hits_fast + s.hits_slow, 20u) << "each message's second get hits";
}

TEST_P(CacheChurn, ARangeUsedAgainButCheaperToRegisterThanToWatchIsRegisteredUncached) {
  // The counting backend registers in well under a microsecond; a watch is three system calls
  // and the munmap's round trip to the monitor two context switches at least. One reuse saves
  // one registration and one deregistration: less than caching cost.
  create_cache(0);
  price_samples_far_above_registrations();
  messages(40, 2);
  const mrc_stats_t s = stats();
  // Two messages teach; of the 76 misses of the 38 after them at most four are cached samples
  // (gaps of at least 8, then 16 misses), and their second gets hit.
  EXPECT_GE(churn_skips(), 68u);
  EXPECT_LE(s.invalidations, 6u) << "munmaps of uncached mappings must reach no monitor";
  EXPECT_EQ(s.registrations, s.deregistrations) << "every uncached one ended at its put";
}

// A registration that absorbs another by merging carries on its uses: the range's costly
// registrations were used again, so caching paid, although the merged region saw no get itself.
TEST_P(CacheChurn, AMergedRegionCarriesOnTheUsesOfWhatItAbsorbed) {
  backend.reg_delay_us = kCostlyRegistrationUs;
  create_cache(0);
  for (int m = 0; m < 4; ++m) {
    char *p = static_cast<char *>(mmap(address_, kPages * kPage, PROT_READ | PROT_WRITE,
                                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0));
    ASSERT_EQ(p, address_);
    mrc_region_t *region = nullptr;
    for (int g = 0; g < 3; ++g) {  // the first half: registered, then used twice
      ASSERT_EQ(mrc_get(cache, p, kPages / 2 * kPage, MRC_PROT_READ | MRC_PROT_WRITE, &region),
                MRC_OK);
      mrc_put(cache, region);
    }
    // The second half and the first half's last page: merged with the first into one new
    // registration of the whole buffer.
    ASSERT_EQ(mrc_get(cache, p + (kPages / 2 - 1) * kPage, (kPages / 2 + 1) * kPage,
                      MRC_PROT_READ | MRC_PROT_WRITE, &region),
              MRC_OK);
    EXPECT_EQ(mrc_region_length(region), kPages * kPage);
    mrc_put(cache, region);
    ASSERT_EQ(munmap(p, kPages * kPage), 0);
  }
  EXPECT_EQ(churn_skips(), 0u);
  EXPECT_GE(stats().merges, 4u);
}

// Each registration merged into a region was a watch and may have been a mapping of its own,
// whose unmap waits for the monitor: a region of eight merged registrations is priced at eight
// round trips. Here each message's gets grow from its buffer's start, so that each merges the
// one before, then the whole buffer is used eight times again (each use saves a registration
// and a deregistration, weighed as two registrations). Made to cost a twelfth of a round trip
// each (a busy wait), the registrations saved are worth 1.33 round trips: more than one round
// trip and a watch, less than eight. The round trip is set, not measured, and long (12 ms):
// a registration measured six times its cost (a preempted busy wait on a loaded host, a
// sanitizer) still does not pay. A run in which some busy wait took three times its length is
// run again (twice at most): the host, not the cache, decided it.
TEST_P(CacheChurn, AMergedRegionIsPricedARoundTripPerRegistrationItAbsorbed) {
  const uint64_t registration = ticks_in_a_millisecond();
  constexpr size_t kGrowths = 8;
  const size_t step = kPages / kGrowths * kPage;
  for (int attempt = 1;; ++attempt) {
    create_cache(0);
    mrc::uffd::testing::set_round_trip_ticks(12 * registration);
    backend.reg_spin_ticks = registration;
    backend.longest_wait_ticks = 0;
    for (int m = 0; m < 10; ++m) {
      char *p = static_cast<char *>(mmap(address_, kPages * kPage, PROT_READ | PROT_WRITE,
                                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0));
      ASSERT_EQ(p, address_);
      for (int round = 0; round < 2; ++round) {
        for (size_t g = 1; g <= kGrowths; ++g) {
          mrc_region_t *region = nullptr;
          ASSERT_EQ(mrc_get(cache, p, g * step, MRC_PROT_READ, &region), MRC_OK);
          mrc_put(cache, region);
        }
      }
      ASSERT_EQ(munmap(p, kPages * kPage), 0);
    }
    if (attempt < 3 && backend.longest_wait_ticks > 3 * registration) continue;
    // Priced at one round trip the merged region would pay and nothing would ever be skipped.
    // At eight, two messages teach and later messages register uncached, until a sample (at
    // most one per 8 misses at first) registers a range alone: used again, that one pays and
    // caching is back for two messages. Each of the eight messages after the teaching ones
    // skips some.
    EXPECT_GE(churn_skips(), 2u * kGrowths);
    break;
  }
}

// A gap between samples holds no more registrations than four samples cost (docs/DESIGN.md,
// "Churn"): a buffer that stops churning is cached again within a few gets when its registration
// costs as much as a sample (the round trip is set, not measured), however long its address
// churned. Before, the gaps grew to 512..1536 misses whatever a registration cost.
TEST_P(CacheChurn, ASteadyBufferIsCachedAgainWithinAFewGetsWhateverTheAddressChurned) {
  // Long (4 ms at least): a watch stretched by a loaded host stays far shorter.
  const uint64_t began = mrc::os::ticks();
  std::this_thread::sleep_for(std::chrono::milliseconds(4));
  const uint64_t round_trip = mrc::os::ticks() - began;
  for (const unsigned churns : {2U, 20U, 100U}) {
    SCOPED_TRACE(churns);
    create_cache(0);
    mrc::uffd::testing::set_round_trip_ticks(round_trip);
    backend.reg_spin_ticks = round_trip;  // a NIC's registration of a large buffer
    messages(churns, 1);
    // Gaps of at most 2 (four samples' worth of registrations and deregistrations): two
    // uncached gets, the sample, then the hit. A registration measured longer than it is (a
    // loaded host) makes the gap shorter, a watch as long as a round trip makes it 4.
    EXPECT_LE(gets_until_cached(), 5u);
  }
}

// A cheap registration may wait longer, and loses as little: what the steady buffer's uncached
// registrations cost stays within four samples' (watch and round trip), here 128 registrations
// of a 64th of a round trip, after 3000 messages that taught the gaps to grow to 512..1536.
TEST_P(CacheChurn, ASteadyBuffersUncachedRegistrationsCostAFewSamplesWhateverTheyCost) {
  const uint64_t began = mrc::os::ticks();
  std::this_thread::sleep_for(std::chrono::milliseconds(4));
  const uint64_t round_trip = mrc::os::ticks() - began;
  create_cache(0);
  mrc::uffd::testing::set_round_trip_ticks(round_trip);
  backend.reg_spin_ticks = round_trip / 64;
  messages(3000, 1);
  // 128 skips at most, then the sample; the slack covers a watch measured longer than its cost
  // (up to half a round trip) on a loaded host.
  EXPECT_LE(gets_until_cached(), 200u);
}

TEST_P(CacheChurn, ASampleThatPaysTurnsCachingBackOn) {
  create_cache(0);
  // Learnt with samples priced far above registrations: a cheap registration that a loaded host
  // stretched would otherwise shorten the gaps, and the samples taken meanwhile (none pays: one
  // get each) would double the next gap past the messages below.
  price_samples_far_above_registrations();
  messages(10, 1);
  const uint64_t learned = churn_skips();
  ASSERT_GE(learned, 7u) << "the churn was learned";
  // Registrations now cost 10 ms and the buffer is used twice per message: the first cached
  // sample (within 24 misses) is hit, and its unmap ends the churn. The round trip is now a
  // tenth of a millisecond, so that only a watch stretched past 20 ms keeps the sample from
  // paying (the model's price only: nothing waits for it).
  mrc::uffd::testing::set_round_trip_ticks(ticks_in_a_millisecond() / 10);
  backend.reg_delay_us = 5 * kCostlyRegistrationUs;
  messages(20, 2);
  const uint64_t skips = churn_skips();
  const mrc_stats_t before = stats();
  messages(10, 2);
  EXPECT_EQ(churn_skips(), skips) << "caching is back";
  const mrc_stats_t after = stats();
  EXPECT_EQ(after.hits_fast + after.hits_slow - before.hits_fast - before.hits_slow, 10u);
}

TEST_P(CacheChurn, TheCacheChurnFlagCachesEveryRegistration) {
  create_cache(MRC_FLAG_CACHE_CHURN);
  messages(40, 1);
  EXPECT_EQ(churn_skips(), 0u);
  const mrc_stats_t s = stats();
  EXPECT_EQ(s.invalidations, 40u) << "every munmap of a watched mapping sends its event";
  EXPECT_EQ(s.uncacheable, 0u);
}

INSTANTIATE_TEST_SUITE_P(Modes, CacheChurn, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool> &param) {
                           return param.param ? std::string("fast") : std::string("exact");
                         });

}  // namespace
