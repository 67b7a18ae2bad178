// SPDX-License-Identifier: BSD-3-Clause
// The threads of a run: workers, churn threads, hot threads and mutators. Each runs until
// Run::stop; guarded() (run.h) starts them. `index` counts each kind from 0.
#pragma once

#include "tools/stress/run.h"

namespace stress {

// Gets, checks and puts random ranges (now and then several at once, a hot range again and
// again, or with an mrc_invalidate) of random slots of the pool, each under the slot's lock.
void worker(Run &run, unsigned index);
// Remaps its private slot (munmap, then mmap of the same length) and gets, checks and puts the
// whole new mapping, over and over. The kernel gives a freed range to the next mmap that fits,
// so with two or more of these one often maps the range another is still unmapping (that
// thread waits in munmap until the monitor has read the event) and gets it at once: inside the
// unmap window, with the old region still in the table. Its own unmaps returned before its
// gets: those are the ordered case that both modes promise.
void churner(Run &run, unsigned index);
// Cycles through the pool's first kHotSlots slots, getting and putting each slot's first page
// kHotRun times in a row and checking the last get. With two or more hot threads every hot page
// parks in several threads' lines at once (core/cache/cache.h, "Parked references"), and with
// more hot slots than a line holds every switch to the next slot replaces a parked reference.
// The mutators' changes of those slots (every kind) take the references back, from lines whose
// owners are parking at that moment.
void hot_thread(Run &run, unsigned index);
// Changes a random slot of the pool under its exclusive lock, or purges the cache, as --mix
// weighs the kinds; forks as often as --fork-rate says.
void mutator(Run &run, unsigned index);

}  // namespace stress
