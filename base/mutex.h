// SPDX-License-Identifier: BSD-3-Clause
// mrc::Mutex, a std::mutex that clang's thread-safety analysis (-Wthread-safety) sees as a
// capability, mrc::MutexLock to hold one for a scope, and the MRC_* annotations. Under clang they
// are checked contracts; under GCC the macros expand to nothing. docs/DESIGN.md, "Contracts the
// compiler checks", says which mutexes are capabilities, what they guard and what is exempt.
#pragma once

#include <mutex>

#if defined(__clang__)
#define MRC_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define MRC_THREAD_ANNOTATION(x)
#endif

#define MRC_CAPABILITY(x) MRC_THREAD_ANNOTATION(capability(x))
#define MRC_SCOPED_CAPABILITY MRC_THREAD_ANNOTATION(scoped_lockable)
#define MRC_GUARDED_BY(x) MRC_THREAD_ANNOTATION(guarded_by(x))
#define MRC_PT_GUARDED_BY(x) MRC_THREAD_ANNOTATION(pt_guarded_by(x))
#define MRC_REQUIRES(...) MRC_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define MRC_ACQUIRE(...) MRC_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define MRC_RELEASE(...) MRC_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define MRC_TRY_ACQUIRE(...) MRC_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define MRC_EXCLUDES(...) MRC_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define MRC_ASSERT_CAPABILITY(x) MRC_THREAD_ANNOTATION(assert_capability(x))
#define MRC_NO_THREAD_SAFETY_ANALYSIS MRC_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace mrc {

// A std::mutex (BasicLockable and Lockable: std::lock_guard and std::unique_lock take it, but
// only MutexLock is seen by the analysis). Constant-initialised, like std::mutex.
class MRC_CAPABILITY("mutex") Mutex {
 public:
  constexpr Mutex() noexcept = default;
  Mutex(const Mutex &) = delete;
  Mutex &operator=(const Mutex &) = delete;

  void lock() MRC_ACQUIRE() { mutex_.lock(); }
  void unlock() MRC_RELEASE() { mutex_.unlock(); }
  [[nodiscard]] bool try_lock() MRC_TRY_ACQUIRE(true) { return mutex_.try_lock(); }

 private:
  std::mutex mutex_;
};

// Holds a Mutex from construction to the end of the scope.
class MRC_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex &mutex) MRC_ACQUIRE(mutex) : mutex_(mutex) { mutex_.lock(); }
  ~MutexLock() MRC_RELEASE() { mutex_.unlock(); }
  MutexLock(const MutexLock &) = delete;
  MutexLock &operator=(const MutexLock &) = delete;

 private:
  Mutex &mutex_;
};

}  // namespace mrc
