// SPDX-License-Identifier: BSD-3-Clause
// Test utilities for shared segments: unique prefixes, /dev/shm clean-up, and real helper
// processes (fork + exec of seg_helper) talking over pipes.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "mrcache/mrcache.h"

namespace segtest {

// A prefix no other test (or parallel test program) uses.
inline std::string unique_prefix(const char *tag) {
  static std::atomic<int> counter{0};
  return std::string("t") + tag + "-" + std::to_string(getpid()) + "-" +
         std::to_string(counter.fetch_add(1));
}

// Files in /dev/shm that belong to `prefix` ("<prefix>:...").
inline std::vector<std::string> shm_files(const std::string &prefix) {
  std::vector<std::string> out;
  DIR *dir = opendir("/dev/shm");
  if (dir == nullptr) return out;
  while (dirent *e = readdir(dir)) {
    std::string n = e->d_name;
    if (n.size() > prefix.size() && n.compare(0, prefix.size(), prefix) == 0 &&
        n[prefix.size()] == ':') {
      out.push_back(n);
    }
  }
  closedir(dir);
  return out;
}

inline void remove_shm(const std::string &prefix) {
  for (const auto &n : shm_files(prefix)) shm_unlink(("/" + n).c_str());
}

inline std::string join(const std::vector<std::string> &v) {
  std::string s;
  for (const auto &x : v) s += x + " ";
  return s;
}

// A helper process. Its stdin is a pipe we hold (closing it tells the helper to finish), its
// stdout a pipe we read lines from.
class Child {
 public:
  Child() = default;
  Child(const Child &) = delete;
  Child &operator=(const Child &) = delete;
  Child(Child &&o) noexcept { *this = std::move(o); }
  Child &operator=(Child &&o) noexcept {
    std::swap(pid_, o.pid_);
    std::swap(in_, o.in_);
    std::swap(out_, o.out_);
    std::swap(buffer_, o.buffer_);
    return *this;
  }
  ~Child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      int st;
      waitpid(pid_, &st, 0);
    }
    if (in_ >= 0) close(in_);
    if (out_ >= 0) close(out_);
  }

  // args[0] is the helper command. keep_fd (if >= 0) is passed to the helper as fd 3.
  // as_uid/as_gid (if >= 0): the helper drops to them before exec; then run a HelperCopy's
  // path (`helper`), which that user can reach, not the build tree's.
  static Child spawn(const std::vector<std::string> &args, int keep_fd = -1, int barrier_fd = -1,
                     int as_uid = -1, int as_gid = -1, const std::string &helper = MRC_SEG_HELPER) {
    int to_child[2], from_child[2];
    if (pipe2(to_child, O_CLOEXEC) != 0 || pipe2(from_child, O_CLOEXEC) != 0) {
      throw std::runtime_error("pipe");
    }
    std::vector<std::string> full{helper};
    full.insert(full.end(), args.begin(), args.end());
    if (barrier_fd >= 0) full.push_back("barrier=4");
    std::vector<char *> argv;
    for (auto &a : full) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t pid = fork();
    if (pid < 0) throw std::runtime_error("fork");
    if (pid == 0) {
      dup2(to_child[0], 0);
      dup2(from_child[1], 1);
      // dup2 clears FD_CLOEXEC on the copy (and does nothing when the numbers match).
      if (keep_fd >= 0 && keep_fd != 3) dup2(keep_fd, 3);
      if (keep_fd == 3) fcntl(3, F_SETFD, 0);
      if (barrier_fd >= 0 && barrier_fd != 4) dup2(barrier_fd, 4);
      if (barrier_fd == 4) fcntl(4, F_SETFD, 0);
      if (as_gid >= 0 && setgid(static_cast<gid_t>(as_gid)) != 0) _exit(126);
      if (as_uid >= 0 && setuid(static_cast<uid_t>(as_uid)) != 0) _exit(126);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(to_child[0]);
    close(from_child[1]);
    Child c;
    c.pid_ = pid;
    c.in_ = to_child[1];
    c.out_ = from_child[0];
    return c;
  }

  pid_t pid() const { return pid_; }

  // The next line of output, or "" after timeout_ms or at end of output.
  std::string line(int timeout_ms = 20000) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      const auto nl = buffer_.find('\n');
      if (nl != std::string::npos) {
        std::string l = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        return l;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                            deadline - std::chrono::steady_clock::now())
                            .count();
      if (left <= 0) return "";
      pollfd p{out_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left)) <= 0) continue;
      char buf[4096];
      const ssize_t n = read(out_, buf, sizeof buf);
      if (n <= 0) return "";
      buffer_.append(buf, static_cast<size_t>(n));
    }
  }

  // Output lines until one starts with `word`; throws with everything seen otherwise.
  std::string expect(const std::string &word, int timeout_ms = 20000) {
    std::string seen;
    for (;;) {
      std::string l = line(timeout_ms);
      if (l.empty()) throw std::runtime_error("helper said: " + seen + " (no '" + word + "')");
      if (l.compare(0, word.size(), word) == 0) return l;
      seen += l + " | ";
    }
  }

  void send(const std::string &s) {
    if (write(in_, s.data(), s.size()) != static_cast<ssize_t>(s.size())) {
      throw std::runtime_error("write to helper");
    }
  }
  void finish_input() {
    if (in_ >= 0) close(in_);
    in_ = -1;
  }
  // Exit status (as from waitpid).
  int wait() {
    int st = 0;
    if (pid_ > 0) waitpid(pid_, &st, 0);
    pid_ = -1;
    return st;
  }
  int kill9() {
    ::kill(pid_, SIGKILL);
    return wait();
  }

 private:
  pid_t pid_ = -1;
  int in_ = -1;
  int out_ = -1;
  std::string buffer_;
};

// seg_helper copied where another user can run it: a fresh directory under /tmp, mode 0755.
// The build tree may not be reachable by that user (a clone under /root, mode 0700). seg_helper
// links the library statically (mrcache_static), so the copy needs nothing else from the build
// tree. ok() is false, with why(), when the copy fails or `uid` still cannot execute it (a
// noexec /tmp).
class HelperCopy {
 public:
  explicit HelperCopy(uid_t uid) {
    char dir[] = "/tmp/mrc-seg-helper-XXXXXX";
    if (mkdtemp(dir) == nullptr || chmod(dir, 0755) != 0) {
      why_ = std::string("mkdtemp under /tmp: ") + std::strerror(errno);
      return;
    }
    dir_ = dir;
    path_ = dir_ + "/seg_helper";
    const int in = open(MRC_SEG_HELPER, O_RDONLY | O_CLOEXEC);
    const int out = open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0755);
    bool copied = in >= 0 && out >= 0;
    char buf[1 << 16];
    for (ssize_t n = 0; copied && (n = read(in, buf, sizeof buf)) != 0;) {
      copied = n > 0 && write(out, buf, static_cast<size_t>(n)) == n;
    }
    if (in >= 0) close(in);
    if (out >= 0) close(out);
    if (!copied || chmod(path_.c_str(), 0755) != 0) {
      why_ = "copying " + std::string(MRC_SEG_HELPER) + " to " + path_ + " failed";
      return;
    }
    // Can `uid` execute it? Asked as that user (access() with the real uid).
    const pid_t pid = fork();
    if (pid == 0) _exit(setuid(uid) == 0 && access(path_.c_str(), X_OK) == 0 ? 0 : 1);
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      why_ = "uid " + std::to_string(uid) + " cannot execute " + path_ + " (is /tmp noexec?)";
      return;
    }
    ok_ = true;
  }
  ~HelperCopy() {
    if (!path_.empty()) unlink(path_.c_str());
    if (!dir_.empty()) rmdir(dir_.c_str());
  }
  HelperCopy(const HelperCopy &) = delete;
  HelperCopy &operator=(const HelperCopy &) = delete;
  bool ok() const { return ok_; }
  const std::string &why() const { return why_; }
  const std::string &path() const { return path_; }

 private:
  bool ok_ = false;
  std::string dir_, path_, why_;
};

// Descriptors open in this process: the entries of /proc/self/fd, less the one that lists them.
inline int open_fds() {
  DIR *dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int n = 0;
  while (dirent *e = readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(dir);
  return n - 1;
}

// What mrc_seg_send puts in the data of its message (core/segment/memfd.cc).
struct MemfdMessage {
  uint64_t magic = 0x3144464d43524dULL;  // "MRCMFD1"
  uint64_t base = 0;
  uint64_t map_size = 0;
};

// A raw peer of mrc_seg_recv: `data` with one SCM_RIGHTS record per element of `records`, each
// carrying those descriptors (shapes mrc_seg_send never sends). sendmsg's result.
inline ssize_t send_with_fds(int sock, const void *data, size_t len,
                             const std::vector<std::vector<int>> &records) {
  size_t space = 0;
  for (const auto &r : records) space += CMSG_SPACE(r.size() * sizeof(int));
  std::vector<cmsghdr> control(space / sizeof(cmsghdr) + 1);  // aligned for cmsghdr
  iovec iov{const_cast<void *>(data), len};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  if (space != 0) {
    mh.msg_control = control.data();
    mh.msg_controllen = space;
  }
  cmsghdr *c = space != 0 ? CMSG_FIRSTHDR(&mh) : nullptr;
  for (const auto &r : records) {
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(r.size() * sizeof(int));
    std::memcpy(CMSG_DATA(c), r.data(), r.size() * sizeof(int));
    c = CMSG_NXTHDR(&mh, c);
  }
  return sendmsg(sock, &mh, MSG_NOSIGNAL);
}

inline std::vector<std::string> words(const std::string &line) {
  std::istringstream in(line);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

inline uint64_t hex(const std::string &s) { return std::stoull(s, nullptr, 16); }

}  // namespace segtest
