// SPDX-License-Identifier: BSD-3-Clause
// mrcache-bpfd's core (bpf/server.h) and a process that asks it for a ring
// (ProcessRing::open_from_daemon): an unprivileged client gets a ring of its own changes and
// cannot write the producer's side; the limits refuse with a reason; a closed connection is
// forgotten; a stranger's bytes are refused. The server runs in a thread of the test process.
//
// The server needs a kernel that runs the programs (the soft-RoCE guests; MRC_BPF_REQUIRED=1
// there makes a refusal a failure); elsewhere these tests check the refusal and skip.
#include <grp.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "bpf/process_ring.h"
#include "bpf/protocol.h"
#include "bpf/server.h"

namespace mrc::bpf {
namespace {

const size_t kPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));

bool required() {
  const char *value = getenv("MRC_BPF_REQUIRED");
  return value != nullptr && strcmp(value, "1") == 0;
}

// Asks the daemon at `path` for a ring over a raw connection; the ring's descriptor, or -1.
int raw_ring(const std::string &path, int *connection) {
  *connection = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  memcpy(address.sun_path, path.c_str(), path.size() + 1);
  if (connect(*connection, reinterpret_cast<const sockaddr *>(&address), sizeof address) != 0) {
    return -1;
  }
  const Hello hello;
  if (send(*connection, &hello, sizeof hello, 0) != static_cast<ssize_t>(sizeof hello)) return -1;
  Welcome welcome;
  iovec io{&welcome, sizeof welcome};
  alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))] = {};
  msghdr message{};
  message.msg_iov = &io;
  message.msg_iovlen = 1;
  message.msg_control = control;
  message.msg_controllen = sizeof control;
  if (recvmsg(*connection, &message, MSG_CMSG_CLOEXEC) != static_cast<ssize_t>(sizeof welcome)) {
    return -1;
  }
  cmsghdr *rights = CMSG_FIRSTHDR(&message);
  if (welcome.status != MRC_OK || rights == nullptr) return -1;
  int fds[2];
  memcpy(fds, CMSG_DATA(rights), sizeof fds);
  close(fds[1]);
  return fds[0];
}

TEST(Daemon, AProcessWithoutADaemonSaysWhereItLooked) {
  ProcessRing *ring = nullptr;
  EXPECT_EQ(ProcessRing::open_from_daemon("/nonexistent/mrcache/bpfd.sock", 0, &ring),
            MRC_ERR_UNSUPPORTED);
  EXPECT_EQ(ring, nullptr);
  EXPECT_NE(std::string(mrc_last_error()).find("no daemon at /nonexistent/mrcache/bpfd.sock"),
            std::string::npos)
      << mrc_last_error();
}

// A server on a socket of its own, serving from a thread.
class DaemonRuns : public ::testing::Test {
 protected:
  void SetUp() override { start(ServerLimits{}); }
  void start(const ServerLimits &limits) {
    char directory[] = "/tmp/mrc-bpfd-test-XXXXXX";
    ASSERT_NE(mkdtemp(directory), nullptr);
    directory_ = directory;
    chmod(directory, 0755);  // an unprivileged client must reach the socket
    socket_ = directory_ + "/bpfd.sock";
    if (Server::start(socket_.c_str(), limits, &server_) != MRC_OK) {
      const std::string why = mrc_last_error();
      EXPECT_EQ(why.rfind("bpf monitor", 0), 0U) << why;
      if (required()) FAIL() << "MRC_BPF_REQUIRED=1 but the daemon could not start: " << why;
      GTEST_SKIP() << "the daemon cannot run here: " << why;
    }
    thread_ = std::thread([this] { server_->serve(stop_); });
  }
  void TearDown() override {
    if (server_ != nullptr) {
      stop_.store(true);
      thread_.join();
      server_->close();
      EXPECT_NE(access(socket_.c_str(), F_OK), 0) << "close() leaves no socket behind";
    }
    if (!directory_.empty()) rmdir(directory_.c_str());
  }
  // Polls the server's count of clients (its thread changes it) for up to 5 s.
  bool clients_become(size_t expected) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (server_->clients() != expected) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return true;
  }

  std::string directory_;
  std::string socket_;
  Server *server_ = nullptr;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

TEST_F(DaemonRuns, ServesAProcessItsRingAndForgetsItWhenItCloses) {
  ProcessRing *ring = nullptr;
  ASSERT_EQ(ProcessRing::open_from_daemon(socket_.c_str(), 0, &ring), MRC_OK) << mrc_last_error();
  EXPECT_TRUE(ring->from_daemon());
  EXPECT_STREQ(ring->hooks().unmap, server_->hooks().unmap);
  EXPECT_TRUE(clients_become(1));
  void *p = mmap(nullptr, kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  munmap(p, kPage);
  bool seen = false;
  EXPECT_EQ(ring->consumer().drain([&](const ChangeRecord &record) {
    seen = seen || (record.start <= reinterpret_cast<uint64_t>(p) &&
                    record.end >= reinterpret_cast<uint64_t>(p) + kPage);
  }),
            RingConsumer::Drained::Ok);
  EXPECT_TRUE(seen);
  ring->close();
  EXPECT_TRUE(clients_become(0)) << "the server forgets a closed connection";
}

TEST_F(DaemonRuns, AnUnprivilegedProcessGetsItsOwnChangesAndCannotWriteTheProducer) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root, to run the client as nobody";
  const pid_t child = fork();
  if (child == 0) {
    // nobody: no capability, no BPF of its own.
    if (setgroups(0, nullptr) != 0 || setresgid(65534, 65534, 65534) != 0 ||
        setresuid(65534, 65534, 65534) != 0) {
      _exit(2);
    }
    ProcessRing *ring = nullptr;
    if (ProcessRing::open_own(ProcessRing::kDefaultRingBytes, &ring) == MRC_OK) _exit(3);
    // The consumer page is the client's to write; the producer's page and the data are not.
    int connection = -1;
    const int ring_fd = raw_ring(socket_, &connection);
    if (ring_fd < 0) _exit(6);
    void *consumer = mmap(nullptr, kPage, PROT_READ | PROT_WRITE, MAP_SHARED, ring_fd, 0);
    void *producer = mmap(nullptr, kPage, PROT_READ | PROT_WRITE, MAP_SHARED, ring_fd,
                          static_cast<off_t>(kPage));
    if (consumer == MAP_FAILED || producer != MAP_FAILED || errno != EPERM) _exit(7);
    munmap(consumer, kPage);
    close(ring_fd);
    close(connection);
    if (ProcessRing::open_from_daemon(socket_.c_str(), 0, &ring) != MRC_OK) {
      fprintf(stderr, "child: %s\n", mrc_last_error());
      _exit(4);
    }
    void *p = mmap(nullptr, kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    munmap(p, kPage);
    bool seen = false;
    ring->consumer().drain([&](const ChangeRecord &record) {
      seen = seen || record.start == reinterpret_cast<uint64_t>(p);
    });
    if (!seen) _exit(5);
    ring->close();
    _exit(0);
  }
  ASSERT_GT(child, 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  // 2: could not become nobody, 3: nobody loaded programs, 4: no ring, 5: its munmap unseen,
  // 6: no raw ring, 7: the consumer page unmappable or the producer's page writable.
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "the child exited with " << WEXITSTATUS(status);
  EXPECT_TRUE(clients_become(0)) << "an exited client is forgotten";
}

TEST_F(DaemonRuns, ARingOverTheLimitIsRefusedWithTheLimit) {
  ProcessRing *ring = nullptr;
  EXPECT_EQ(ProcessRing::open_from_daemon(socket_.c_str(), size_t{1} << 30, &ring),
            MRC_ERR_INVALID);
  EXPECT_NE(std::string(mrc_last_error()).find("over this daemon's limit"), std::string::npos)
      << mrc_last_error();
  EXPECT_TRUE(clients_become(0));
}

TEST_F(DaemonRuns, AUsersRingsAreLimited) {
  stop_.store(true);
  thread_.join();
  server_->close();
  server_ = nullptr;
  stop_.store(false);
  rmdir(directory_.c_str());
  start(ServerLimits{.rings_per_user = 1});
  ProcessRing *first = nullptr;
  ProcessRing *second = nullptr;
  ASSERT_EQ(ProcessRing::open_from_daemon(socket_.c_str(), 0, &first), MRC_OK) << mrc_last_error();
  EXPECT_EQ(ProcessRing::open_from_daemon(socket_.c_str(), 0, &second), MRC_ERR_BUSY);
  EXPECT_NE(std::string(mrc_last_error()).find("rings already"), std::string::npos)
      << mrc_last_error();
  first->close();
  EXPECT_TRUE(clients_become(0));
  ASSERT_EQ(ProcessRing::open_from_daemon(socket_.c_str(), 0, &second), MRC_OK) << mrc_last_error();
  second->close();
}

TEST_F(DaemonRuns, AStrangersBytesAreRefused) {
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  memcpy(address.sun_path, socket_.c_str(), socket_.size() + 1);
  ASSERT_EQ(connect(fd, reinterpret_cast<const sockaddr *>(&address), sizeof address), 0);
  const char junk[] = "GET / HTTP/1.0\r\n\r\n";
  ASSERT_EQ(send(fd, junk, sizeof junk, 0), static_cast<ssize_t>(sizeof junk));
  Welcome welcome;
  ASSERT_EQ(recv(fd, &welcome, sizeof welcome, 0), static_cast<ssize_t>(sizeof welcome));
  EXPECT_EQ(welcome.status, MRC_ERR_INVALID);
  EXPECT_EQ(recv(fd, &welcome, sizeof welcome, 0), 0) << "and the connection is closed";
  close(fd);
  EXPECT_EQ(server_->clients(), 0U);
}

}  // namespace
}  // namespace mrc::bpf
