// SPDX-License-Identifier: BSD-3-Clause
// A ring from mrcache-bpfd (process_ring.h, protocol.h): connect, say Hello, take the Welcome
// and its descriptors, map them, run the self-test.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>

#include "base/error.h"
#include "bpf/abi.h"
#include "bpf/process_ring.h"
#include "bpf/protocol.h"

namespace mrc::bpf {
namespace {

// The Welcome, and the descriptors that came with it (-1 each when none did).
bool receive_welcome(int socket, Welcome *welcome, int fds[2]) noexcept {
  fds[0] = fds[1] = -1;
  iovec io{welcome, sizeof *welcome};
  alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))] = {};
  msghdr message{};
  message.msg_iov = &io;
  message.msg_iovlen = 1;
  message.msg_control = control;
  message.msg_controllen = sizeof control;
  ssize_t got;
  do {
    got = recvmsg(socket, &message, MSG_CMSG_CLOEXEC);
  } while (got < 0 && errno == EINTR);
  for (cmsghdr *c = CMSG_FIRSTHDR(&message); c != nullptr; c = CMSG_NXTHDR(&message, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS &&
        c->cmsg_len == CMSG_LEN(2 * sizeof(int))) {
      memcpy(fds, CMSG_DATA(c), 2 * sizeof(int));
    }
  }
  return got == static_cast<ssize_t>(sizeof *welcome) && welcome->magic == kProtocolMagic;
}

}  // namespace

mrc_status_t ProcessRing::open_from_daemon(const char *socket_path, size_t ring_bytes,
                                           ProcessRing **out) noexcept {
  *out = nullptr;
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (strlen(socket_path) >= sizeof address.sun_path) {
    set_last_error("bpf monitor: the daemon's socket path is too long: %s", socket_path);
    return MRC_ERR_INVALID;
  }
  memcpy(address.sun_path, socket_path, strlen(socket_path) + 1);
  auto *ring = new (std::nothrow) ProcessRing();
  if (ring == nullptr) {
    set_last_error("bpf monitor: out of memory");
    return MRC_ERR_NO_MEMORY;
  }
  ring->owner_ = getpid();
  ring->socket_ = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (ring->socket_ < 0 ||
      connect(ring->socket_, reinterpret_cast<const sockaddr *>(&address), sizeof address) != 0) {
    set_last_error("bpf monitor: no daemon at %s (%s)", socket_path, strerrorname_np(errno));
    ring->close();
    return MRC_ERR_UNSUPPORTED;
  }
  const Hello hello{.ring_bytes = ring_bytes};
  Welcome welcome;
  int fds[2];
  if (send(ring->socket_, &hello, sizeof hello, MSG_NOSIGNAL) != sizeof hello ||
      !receive_welcome(ring->socket_, &welcome, fds)) {
    set_last_error("bpf monitor: the daemon at %s did not answer (%s)", socket_path,
                   strerrorname_np(errno));
    ring->close();
    return MRC_ERR_UNSUPPORTED;
  }
  ring->client_.ring_fd = fds[0];
  ring->lost_fd_ = fds[1];
  if (welcome.status != MRC_OK || fds[0] < 0 || fds[1] < 0) {
    welcome.reason[sizeof welcome.reason - 1] = '\0';
    set_last_error("bpf monitor: the daemon at %s refused: %s", socket_path, welcome.reason);
    ring->close();
    return welcome.status != MRC_OK ? static_cast<mrc_status_t>(welcome.status) : MRC_ERR_IO;
  }
  if (welcome.slot >= MRC_BPF_MAX_CLIENTS) {
    set_last_error("bpf monitor: the daemon at %s gave slot %u (at most %d)", socket_path,
                   welcome.slot, MRC_BPF_MAX_CLIENTS - 1);
    ring->close();
    return MRC_ERR_IO;
  }
  ring->client_.slot = welcome.slot;
  ring->client_.ring_bytes = welcome.ring_bytes;
  for (size_t i = 0; i < 3; ++i) {
    snprintf(ring->hooks_[i], sizeof ring->hooks_[i], "%.*s",
             static_cast<int>(sizeof welcome.hooks[i] - 1), welcome.hooks[i]);
  }
  const mrc_status_t status = ring->map_and_test(ring->lost_fd_);
  if (status != MRC_OK) {
    ring->close();
    return status;
  }
  *out = ring;
  return MRC_OK;
}

}  // namespace mrc::bpf
