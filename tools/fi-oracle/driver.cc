// SPDX-License-Identifier: BSD-3-Clause
#include "tools/fi-oracle/driver.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "tools/fi-oracle/roles.h"

namespace fi_oracle {
namespace {

using Clock = std::chrono::steady_clock;
// After one process reported an error, the other gets this long to report its own.
constexpr double kGraceSeconds = 3;

struct Record {
  bool sent = false, reused = false, checked = false;
  uint64_t registrations = 0;
  std::string verdict;
};

struct Child {
  const char *name = "";
  pid_t pid = -1;
  int fd = -1;  // its report pipe; -1 at end of file
  std::string pending;
  bool done = false;  // reported D
  bool exited = false;
  int wait_status = 0;
  std::string error;
  bool timed_out = false;
};

[[noreturn]] void die(const char *what) {
  std::fprintf(stderr, "mrcache-fi-oracle: %s: %s\n", what, std::strerror(errno));
  std::exit(3);
}

// "main:handle_userfault fi_oracle_x:ep_poll ..." for every thread of `pid`.
std::string blocked_in(pid_t pid) {
  std::string out;
  std::string dir = "/proc/" + std::to_string(pid) + "/task";
  DIR *d = opendir(dir.c_str());
  if (d == nullptr) return "(gone)";
  while (dirent *e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::string comm, wchan;
    std::ifstream(dir + "/" + e->d_name + "/comm") >> comm;
    std::ifstream(dir + "/" + e->d_name + "/wchan") >> wchan;
    if (!out.empty()) out += ' ';
    out += e->d_name + std::string(":") + comm + ":" + (wchan.empty() ? "running" : wchan);
  }
  closedir(d);
  return out;
}

pid_t start(Role role, const Config &config, int oob, int close_fd, int report_fd,
            int other_read_fd) {
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) die("fork");
  if (pid == 0) {
    signal(SIGPIPE, SIG_IGN);
    close(close_fd);
    if (other_read_fd >= 0) close(other_read_fd);
    int status = run_role(role, config, oob, report_fd);
    std::fflush(stderr);
    _exit(status);
  }
  return pid;
}

void handle_line(Child &child, const std::string &line, std::map<uint64_t, Record> &records,
                 Outcome &out) {
  std::istringstream in(line);
  std::string kind;
  in >> kind;
  if (kind == "S") {
    uint64_t msg = 0, registrations = 0;
    int reused = 0;
    std::string verdict;
    in >> msg >> reused >> registrations >> verdict;
    records[msg].sent = true;
    records[msg].reused = reused != 0;
    records[msg].registrations = registrations;
    if (!verdict.empty()) records[msg].verdict = verdict;  // a read's, checked by the sender
  } else if (kind == "R") {
    uint64_t msg = 0;
    std::string verdict;
    in >> msg >> verdict;
    records[msg].checked = true;
    if (verdict != "-") records[msg].verdict = verdict;
  } else if (kind == "I") {
    out.info.push_back(line.substr(2));
  } else if (kind == "E") {
    int timeout = 0;
    in >> timeout;
    std::string text;
    std::getline(in, text);
    if (!text.empty() && text[0] == ' ') text.erase(0, 1);
    child.error = text;
    child.timed_out = timeout != 0;
  } else if (kind == "D") {
    child.done = true;
  }
}

// Reads what is there; false at end of file.
bool pump(Child &child, std::map<uint64_t, Record> &records, Outcome &out) {
  char buf[4096];
  ssize_t n = read(child.fd, buf, sizeof buf);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
  if (n <= 0) {
    close(child.fd);
    child.fd = -1;
    return false;
  }
  child.pending.append(buf, static_cast<size_t>(n));
  size_t pos;
  while ((pos = child.pending.find('\n')) != std::string::npos) {
    handle_line(child, child.pending.substr(0, pos), records, out);
    child.pending.erase(0, pos + 1);
  }
  return true;
}

void tally(const Config &config, const std::map<uint64_t, Record> &records, Outcome &out) {
  std::map<std::string, size_t> index;
  bool stopped = false;
  for (const Step &step : plan(config)) {
    std::string op = kOpNames[static_cast<size_t>(step.op)];
    std::string scenario =
        step.warmup ? "warm-up" : kScenarioNames[static_cast<size_t>(step.scenario)];
    auto [it, added] = index.emplace(op + "/" + scenario, out.rows.size());
    if (added) out.rows.push_back(Row{op, scenario});
    Row &row = out.rows[it->second];
    auto rec = records.find(step.msg);
    if (rec == records.end() || !rec->second.sent || !rec->second.checked) {
      // The message the run stopped in counts as the error; the ones after it never started.
      if (!stopped && out.status != Status::kOk) {
        ++row.errors;
        out.stopped = true;
        out.stopped_at = step.scenario;
      }
      stopped = true;
      continue;
    }
    const Record &r = rec->second;
    if (r.reused) {
      ++row.messages;
      row.registrations += r.registrations;
    } else {
      ++row.not_reused;
    }
    if (r.verdict == "stale") ++row.stale;
    if (r.verdict == "corrupt") ++row.corrupt;
  }
  if (!stopped && out.status != Status::kOk && !out.rows.empty()) ++out.rows.back().errors;
}

void add(Row &to, const Row &row) {
  to.messages += row.messages;
  to.stale += row.stale;
  to.corrupt += row.corrupt;
  to.errors += row.errors;
  to.not_reused += row.not_reused;
  to.registrations += row.registrations;
}

size_t rank(const std::string &name, const char *const *names, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    if (name == names[i]) return i + 1;
  }
  return 0;  // warm-up: first
}

// Rows in the plan's order: by op, the warm-up row first, then the scenarios.
Outcome finish(Outcome &out, Clock::time_point t0) {
  std::stable_sort(out.rows.begin(), out.rows.end(), [](const Row &a, const Row &b) {
    size_t op_a = rank(a.op, kOpNames, kOpCount), op_b = rank(b.op, kOpNames, kOpCount);
    if (op_a != op_b) return op_a < op_b;
    return rank(a.scenario, kScenarioNames, kScenarioCount) <
           rank(b.scenario, kScenarioNames, kScenarioCount);
  });
  out.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return out;
}

// One block: a fresh receiver and sender for `config` (one op, one scenario).
Outcome drive_block(const Config &config, double timeout, double stall) {
  Outcome out;
  auto t0 = Clock::now();
  int oob[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, oob) != 0) die("socketpair");
  int recv_pipe[2], send_pipe[2];
  if (pipe2(recv_pipe, O_CLOEXEC) != 0 || pipe2(send_pipe, O_CLOEXEC) != 0) die("pipe");

  Child children[2];
  children[0].name = "receiver";
  children[1].name = "sender";
  children[0].pid = start(Role::kRecv, config, oob[0], oob[1], recv_pipe[1], recv_pipe[0]);
  close(recv_pipe[1]);
  children[0].fd = recv_pipe[0];
  children[1].pid = start(Role::kSend, config, oob[1], oob[0], send_pipe[1], send_pipe[0]);
  close(send_pipe[1]);
  children[1].fd = send_pipe[0];
  close(oob[0]);
  close(oob[1]);

  std::map<uint64_t, Record> records;
  auto last_progress = Clock::now();
  Clock::time_point grace_end{};
  bool grace = false;
  std::string kill_reason;
  for (;;) {
    pollfd pfds[2];
    nfds_t n = 0;
    Child *polled[2];
    for (Child &c : children) {
      if (c.fd >= 0) {
        pfds[n] = pollfd{c.fd, POLLIN, 0};
        polled[n++] = &c;
      }
    }
    if (n > 0) {
      int r = poll(pfds, n, 100);
      if (r < 0 && errno != EINTR) die("poll");
      for (nfds_t i = 0; r > 0 && i < n; ++i) {
        if (pfds[i].revents != 0) {
          size_t before = records.size();
          pump(*polled[i], records, out);
          if (records.size() != before) last_progress = Clock::now();
        }
      }
    } else {
      usleep(20000);
    }
    for (Child &c : children) {
      if (c.exited) continue;
      pid_t w = waitpid(c.pid, &c.wait_status, WNOHANG);
      if (w == c.pid) c.exited = true;
    }
    bool all_exited = children[0].exited && children[1].exited;
    if (all_exited && children[0].fd < 0 && children[1].fd < 0) break;
    auto now = Clock::now();
    bool any_error = !children[0].error.empty() || !children[1].error.empty() ||
                     (children[0].exited && !children[0].done) ||
                     (children[1].exited && !children[1].done);
    if (any_error && !grace) {
      grace = true;
      grace_end = now + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(kGraceSeconds));
    }
    std::chrono::duration<double> since_progress = now - last_progress, elapsed = now - t0;
    if (grace && now > grace_end && !all_exited) {
      kill_reason = "after the other process's error";
    } else if (since_progress.count() > stall) {
      kill_reason = "no message completed for " + std::to_string(static_cast<int>(stall)) + " s";
    } else if (elapsed.count() > timeout) {
      kill_reason = "the run exceeded its " + std::to_string(static_cast<int>(timeout)) + " s";
    }
    if (!kill_reason.empty()) {
      std::string where;
      for (Child &c : children) {
        if (c.exited) continue;
        where += std::string(where.empty() ? "" : "; ") + c.name + " blocked in [" +
                 blocked_in(c.pid) + "]";
        kill(c.pid, SIGKILL);
      }
      for (Child &c : children) {
        if (!c.exited) waitpid(c.pid, &c.wait_status, 0);
        c.exited = true;
        while (c.fd >= 0 && pump(c, records, out)) {
        }
      }
      if (!where.empty()) {
        // A process still running after the other's error is stuck, not hung on its own.
        if (!grace) out.status = Status::kHang;
        out.detail = "killed " + kill_reason + ": " + where;
      }
      break;
    }
  }

  for (Child &c : children) {
    std::string why;
    if (!c.error.empty()) {
      why = c.error;
      if (c.timed_out && out.status == Status::kOk) out.status = Status::kHang;
    } else if (!c.done && WIFSIGNALED(c.wait_status)) {
      why = "killed by signal " + std::to_string(WTERMSIG(c.wait_status));
    } else if (!c.done) {
      why = "exited " + std::to_string(WEXITSTATUS(c.wait_status)) + " without finishing";
    }
    if (why.empty() || (why.starts_with("killed by signal") && !out.detail.empty())) continue;
    if (out.status == Status::kOk) out.status = Status::kError;
    out.detail += std::string(out.detail.empty() ? "" : "; ") + c.name + ": " + why;
  }
  tally(config, records, out);
  out.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return out;
}

}  // namespace

const char *status_name(Status status) {
  switch (status) {
    case Status::kOk: return "ok";
    case Status::kError: return "error";
    case Status::kHang: return "hang";
  }
  return "?";
}

Outcome drive(const Config &config, double timeout, double stall) {
  Outcome out;
  out.total = Row{"all", "all"};
  auto t0 = Clock::now();
  std::map<std::string, size_t> index;
  std::vector<Scenario> remaining = config.scenarios;
  while (!remaining.empty()) {
    Config block = config;
    block.scenarios = remaining;
    if (config.isolate) block.scenarios.resize(1);
    std::string name;
    for (Scenario s : block.scenarios) {
      name += std::string(name.empty() ? "" : ",") + kScenarioNames[static_cast<size_t>(s)];
    }
    double left = timeout - std::chrono::duration<double>(Clock::now() - t0).count();
    if (left <= 0) {
      out.status = Status::kHang;
      out.detail +=
          std::string(out.detail.empty() ? "" : "; ") + name + ": not run, the run's time is up";
      break;
    }
    Outcome part = drive_block(block, left, stall);
    std::fprintf(stderr, "mrcache-fi-oracle: %s: %s%s%s (%.1f s)\n", name.c_str(),
                 status_name(part.status), part.detail.empty() ? "" : ": ", part.detail.c_str(),
                 part.seconds);
    for (const Row &row : part.rows) {
      auto [it, added] = index.emplace(row.op + "/" + row.scenario, out.rows.size());
      if (added) out.rows.push_back(Row{row.op, row.scenario});
      add(out.rows[it->second], row);
      add(out.total, row);
    }
    if (out.info.empty()) out.info = part.info;
    // Done with the block's scenarios, or up to the one it failed in; the rest run in a fresh
    // pair of processes.
    size_t done_count = block.scenarios.size();
    if (part.status != Status::kOk && part.stopped) {
      done_count = 1;
      while (block.scenarios[done_count - 1] != part.stopped_at) ++done_count;
    }
    remaining.erase(remaining.begin(), remaining.begin() + static_cast<ptrdiff_t>(done_count));
    if (part.status == Status::kOk) continue;
    if (part.status == Status::kHang || out.status == Status::kOk) out.status = part.status;
    std::string failed = part.stopped ? kScenarioNames[static_cast<size_t>(part.stopped_at)] : name;
    out.detail += std::string(out.detail.empty() ? "" : "; ") + failed + ": " + part.detail;
    // A block that failed before its first message failed to set up: the others would too.
    uint64_t completed = 0;
    for (const Row &row : part.rows) completed += row.messages + row.not_reused;
    if (part.status == Status::kError && completed == 0) break;
  }
  return finish(out, t0);
}

}  // namespace fi_oracle
