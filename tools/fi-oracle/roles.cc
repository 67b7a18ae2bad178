// SPDX-License-Identifier: BSD-3-Clause
#include "tools/fi-oracle/roles.h"

#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "tools/fi-oracle/fabric.h"
#include "tools/fi-oracle/memory.h"
#include "tools/fi-oracle/regcount.h"
#include "tools/fi-oracle/stamp.h"

namespace fi_oracle {
namespace {

// Tags of the small messages next to the data (the data message's tag is its number).
constexpr uint64_t kNoteTag = uint64_t{1} << 62;  // sender: "message n was written / read"
constexpr uint64_t kAckTag = uint64_t{1} << 61;   // receiver: "message n was checked"
constexpr int kMaxStaleLogs = 3;

void report(int fd, const std::string &line) {
  std::string text = line + "\n";
  const char *p = text.data();
  size_t left = text.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the driver is gone: nothing left to tell
    p += n;
    left -= static_cast<size_t>(n);
  }
}

// Out-of-band exchange, bounded by the run's operation timeout.
class Oob {
 public:
  Oob(int fd, double timeout) : fd_(fd), timeout_(timeout) {}

  void put(const void *data, size_t len) {
    const auto *p = static_cast<const char *>(data);
    while (len > 0) {
      ssize_t n = ::write(fd_, p, len);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) throw RunError{std::string("out-of-band write: ") + std::strerror(errno)};
      p += n;
      len -= static_cast<size_t>(n);
    }
  }
  void get(void *data, size_t len) {
    auto *p = static_cast<char *>(data);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_);
    while (len > 0) {
      pollfd pfd{fd_, POLLIN, 0};
      int r = poll(&pfd, 1, 100);
      if (r < 0 && errno != EINTR) throw RunError{"out-of-band poll failed"};
      if (r <= 0) {
        if (std::chrono::steady_clock::now() > deadline) {
          throw RunError{"no word from the other process within the timeout", true};
        }
        continue;
      }
      ssize_t n = ::read(fd_, p, len);
      if (n < 0 && errno == EINTR) continue;
      if (n == 0) throw RunError{"the other process closed the out-of-band socket"};
      if (n < 0) throw RunError{std::string("out-of-band read: ") + std::strerror(errno)};
      p += n;
      len -= static_cast<size_t>(n);
    }
  }
  void put_blob(const std::vector<uint8_t> &blob) {
    uint32_t len = static_cast<uint32_t>(blob.size());
    put(&len, sizeof len);
    put(blob.data(), blob.size());
  }
  std::vector<uint8_t> get_blob() {
    uint32_t len = 0;
    get(&len, sizeof len);
    if (len > 4096) throw RunError{"out-of-band: address too long"};
    std::vector<uint8_t> blob(len);
    get(blob.data(), len);
    return blob;
  }

 private:
  int fd_;
  double timeout_;
};

uint8_t kind_of(const Step &step) {
  return static_cast<uint8_t>(static_cast<unsigned>(step.op) << 4 |
                              static_cast<unsigned>(step.scenario));
}

std::string label(const Step &step) {
  return std::string(kOpNames[static_cast<size_t>(step.op)]) + "/" +
         kScenarioNames[static_cast<size_t>(step.scenario)];
}

bool needs_rma(const Config &config) {
  for (Op op : config.ops) {
    if (op != Op::kSend) return true;
  }
  return false;
}

const char *verdict_of(const Check &c) {
  return c.corrupt_words > 0 ? "corrupt" : c.stale_words > 0 ? "stale" : "ok";
}

void log_bad(const Config &config, const char *who, const Step &step, const Check &c, int &logs) {
  if (c.corrupt_words + c.stale_words == 0 || (!config.verbose && logs >= kMaxStaleLogs)) return;
  ++logs;
  std::fprintf(stderr,
               "[%s] %s message %llu: %s: %zu stale words (messages %llu..%llu), %zu corrupt "
               "words of %zu, first at byte %zu\n",
               who, label(step).c_str(), static_cast<unsigned long long>(step.msg), verdict_of(c),
               c.stale_words, static_cast<unsigned long long>(c.oldest_stale_msg),
               static_cast<unsigned long long>(c.newest_stale_msg), c.corrupt_words,
               config.size / 8, c.first_bad_offset);
}

struct Target {
  uint64_t addr = 0;
  uint64_t key = 0;
};

void run_sender(const Config &config, Oob &oob, int out) {
  set_malloc_mmap_threshold(config.size);
  Endpoint ep(config.send_domain, needs_rma(config), config.op_timeout);
  report(out, "I sender: " + ep.describe());
  oob.put_blob(ep.name());
  fi_addr_t peer = ep.insert_peer(oob.get_blob());
  Target target;
  oob.get(&target, sizeof target);
  char ready = 1;
  oob.put(&ready, 1);

  SendBuffer buf(config.size);
  int logs = 0;
  for (const Step &step : plan(config)) {
    if (step.warmup) buf.reset(step.scenario);
    uint64_t registered = registrations();
    bool same = step.warmup || buf.change(step.scenario);
    std::string verdict;
    if (step.op == Op::kSend) {
      stamp(buf.data(), config.size, step.msg, kind_of(step), config.nonce);
      ep.send(buf.data(), config.size, peer, step.msg);
    } else if (step.op == Op::kWrite) {
      stamp(buf.data(), config.size, step.msg, kind_of(step), config.nonce);
      ep.write(buf.data(), config.size, peer, target.addr, target.key);
      uint64_t note = step.msg;
      ep.send(&note, sizeof note, peer, step.msg | kNoteTag);
    } else {
      // The new memory holds the previous message's bytes; a read through a registration of
      // the old pages leaves them there (stale).
      stamp(buf.data(), config.size, step.msg - 1, kind_of(step), config.nonce);
      ep.read(buf.data(), config.size, peer, target.addr, target.key);
      uint64_t note = step.msg;  // the receiver may change its buffer now
      ep.send(&note, sizeof note, peer, step.msg | kNoteTag);
      Check c = check(buf.data(), config.size, step.msg, kind_of(step), config.nonce);
      log_bad(config, "send", step, c, logs);
      verdict = std::string(" ") + verdict_of(c);
    }
    buf.finish();
    uint64_t ack = 0;
    ep.recv(&ack, sizeof ack, peer, step.msg | kAckTag);
    report(out, "S " + std::to_string(step.msg) + (same ? " 1 " : " 0 ") +
                    std::to_string(registrations() - registered) + verdict);
  }
}

void run_receiver(const Config &config, Oob &oob, int out) {
  Endpoint ep(config.recv_domain, needs_rma(config), config.op_timeout);
  report(out, "I receiver: " + ep.describe());
  // Two buffers that never change: one receives the messages, one is the RMA target.
  void *mem =
      mmap(nullptr, 2 * config.size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) throw RunError{"mmap of the receive buffers failed"};
  char *rbuf = static_cast<char *>(mem);
  char *target_buf = rbuf + config.size;
  Target target;
  if (needs_rma(config)) {
    target.addr = reinterpret_cast<uintptr_t>(target_buf);
    target.key = ep.register_target(target_buf, config.size);
  }
  oob.put_blob(ep.name());
  fi_addr_t peer = ep.insert_peer(oob.get_blob());
  // Before the sender may touch it: poisoned for a write, the message's stamp for a read.
  auto prepare = [&](const Step &next) {
    if (next.op == Op::kRead) {
      stamp(target_buf, config.size, next.msg, kind_of(next), config.nonce);
    } else {
      poison(target_buf, config.size);
    }
  };
  std::vector<Step> steps = plan(config);
  if (!steps.empty()) prepare(steps[0]);
  oob.put(&target, sizeof target);
  char ready = 0;
  oob.get(&ready, 1);

  int logs = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step &step = steps[i];
    const char *data = nullptr;
    if (step.op == Op::kSend) {
      poison(rbuf, config.size);
      ep.recv(rbuf, config.size, peer, step.msg);
      data = rbuf;
    } else {
      uint64_t note = 0;
      ep.recv(&note, sizeof note, peer, step.msg | kNoteTag);
      if (step.op == Op::kWrite) data = target_buf;
    }
    if (data != nullptr) {
      Check c = check(data, config.size, step.msg, kind_of(step), config.nonce);
      log_bad(config, "recv", step, c, logs);
      report(out, "R " + std::to_string(step.msg) + " " + verdict_of(c) + " " +
                      std::to_string(c.stale_words) + " " + std::to_string(c.corrupt_words) + " " +
                      std::to_string(c.newest_stale_msg) + " " +
                      std::to_string(c.first_bad_offset));
    } else {
      report(out, "R " + std::to_string(step.msg) + " -");  // the sender checks a read
    }
    if (i + 1 < steps.size()) prepare(steps[i + 1]);
    uint64_t ack = step.msg;
    ep.send(&ack, sizeof ack, peer, step.msg | kAckTag);
  }
  // The sender's last acknowledgement must be out before the endpoint closes.
  char done = 0;
  oob.get(&done, 1);
}

}  // namespace

int run_role(Role role, const Config &config, int oob_fd, int out) {
  Oob oob(oob_fd, config.op_timeout);
  try {
    if (role == Role::kSend) {
      run_sender(config, oob, out);
      char done = 1;
      oob.put(&done, 1);
    } else {
      run_receiver(config, oob, out);
    }
    report(out, "D");
    return 0;
  } catch (const RunError &e) {
    report(out, std::string("E ") + (e.timeout ? "1 " : "0 ") + e.what);
    return 1;
  } catch (const std::exception &e) {
    report(out, std::string("E 0 ") + e.what());
    return 1;
  }
}

}  // namespace fi_oracle
