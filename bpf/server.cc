// SPDX-License-Identifier: BSD-3-Clause
// mrcache-bpfd's core (server.h): the socket, the connections, one ring each.
#include "bpf/server.h"

#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>

#include "base/error.h"
#include "bpf/process_ring.h"
#include "bpf/protocol.h"
#include "bpf/ring.h"

namespace mrc::bpf {
namespace {

// The daemon proves the programs on a ring of its own before it serves anyone.
mrc_status_t prove(Programs *programs) noexcept {
  Programs::Client client;
  mrc_status_t status = programs->add_client(getpid(), size_t{64} << 10, &client);
  if (status != MRC_OK) return status;
  MappedRing ring;
  status = ring.map(client.ring_fd, client.ring_bytes);
  if (status == MRC_OK) {
    RingConsumer consumer(ring.layout());
    status = self_test(consumer);
  }
  ring.unmap();
  programs->remove_client(client, getpid());
  close(client.ring_fd);
  return status;
}

}  // namespace

mrc_status_t Server::start(const char *socket_path, const ServerLimits &limits,
                           Server **out) noexcept {
  *out = nullptr;
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (strlen(socket_path) >= sizeof address.sun_path) {
    set_last_error("mrcache-bpfd: the socket path is too long: %s", socket_path);
    return MRC_ERR_INVALID;
  }
  auto *server = new (std::nothrow) Server();
  if (server == nullptr) {
    set_last_error("mrcache-bpfd: out of memory");
    return MRC_ERR_NO_MEMORY;
  }
  server->limits_ = limits;
  mrc_status_t status = Programs::load(&server->programs_);
  if (status == MRC_OK) status = prove(server->programs_);
  if (status != MRC_OK) {
    server->close();
    return status;
  }
  memcpy(address.sun_path, socket_path, strlen(socket_path) + 1);
  server->listener_ = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  unlink(socket_path);  // a socket a previous daemon left
  if (server->listener_ < 0 ||
      bind(server->listener_, reinterpret_cast<const sockaddr *>(&address), sizeof address) != 0 ||
      chmod(socket_path, 0666) != 0 || listen(server->listener_, 16) != 0) {
    set_last_error("mrcache-bpfd: listening at %s: %s", socket_path, strerrorname_np(errno));
    server->close();
    return MRC_ERR_IO;
  }
  memcpy(server->path_, socket_path, strlen(socket_path) + 1);
  *out = server;
  return MRC_OK;
}

void Server::close() noexcept {
  for (Connection &connection : connections_) drop(connection);
  if (listener_ >= 0) {
    ::close(listener_);
    unlink(path_);
  }
  if (programs_ != nullptr) programs_->close();
  delete this;
}

size_t Server::clients() const noexcept {
  size_t count = 0;
  for (const Connection &connection : connections_) count += connection.registered ? 1 : 0;
  return count;
}

unsigned Server::rings_of(uid_t uid) const noexcept {
  unsigned count = 0;
  for (const Connection &connection : connections_) {
    count += connection.registered && connection.uid == uid ? 1 : 0;
  }
  return count;
}

void Server::serve(const std::atomic<bool> &stop) noexcept {
  pollfd polled[kMaxConnections + 1];
  while (!stop.load(std::memory_order_acquire)) {
    polled[0] = {listener_, POLLIN, 0};
    for (size_t i = 0; i < kMaxConnections; ++i) {
      polled[i + 1] = {connections_[i].fd, POLLIN, 0};  // fd -1: ignored by poll
    }
    if (poll(polled, kMaxConnections + 1, 100) <= 0) continue;
    for (size_t i = 0; i < kMaxConnections; ++i) {
      if (polled[i + 1].revents == 0) continue;
      Connection &connection = connections_[i];
      if (connection.registered) {
        drop(connection);  // a client says nothing after Hello: readable means closed
      } else {
        answer(connection);
      }
    }
    if ((polled[0].revents & POLLIN) != 0) accept_one();
  }
}

void Server::accept_one() noexcept {
  const int fd = accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (fd < 0) return;
  for (Connection &connection : connections_) {
    if (connection.fd < 0) {
      connection = Connection{.fd = fd};
      return;
    }
  }
  ::close(fd);  // full: the process falls back (its Hello finds the connection closed)
}

void Server::refuse(Connection &connection, mrc_status_t status, const char *reason) noexcept {
  Welcome welcome;
  welcome.status = status;
  snprintf(welcome.reason, sizeof welcome.reason, "%s", reason);
  (void)send(connection.fd, &welcome, sizeof welcome, MSG_NOSIGNAL | MSG_DONTWAIT);
  drop(connection);
}

void Server::answer(Connection &connection) noexcept {
  Hello hello;
  const ssize_t got = recv(connection.fd, &hello, sizeof hello, MSG_DONTWAIT);
  if (got < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (got != static_cast<ssize_t>(sizeof hello) || hello.magic != kProtocolMagic ||
      hello.version != kProtocolVersion) {
    refuse(connection, MRC_ERR_INVALID, "not a Hello of this protocol's version");
    return;
  }
  ucred peer{};
  socklen_t peer_length = sizeof peer;
  if (getsockopt(connection.fd, SOL_SOCKET, SO_PEERCRED, &peer, &peer_length) != 0) {
    refuse(connection, MRC_ERR_IO, "SO_PEERCRED failed");
    return;
  }
  const size_t ring_bytes = hello.ring_bytes != 0 ? hello.ring_bytes : limits_.default_ring_bytes;
  char reason[160];
  if (ring_bytes > limits_.max_ring_bytes) {
    snprintf(reason, sizeof reason, "a ring of %zu bytes is over this daemon's limit (%zu)",
             ring_bytes, limits_.max_ring_bytes);
    refuse(connection, MRC_ERR_INVALID, reason);
    return;
  }
  if (rings_of(peer.uid) >= limits_.rings_per_user) {
    snprintf(reason, sizeof reason, "user %u has %u rings already (this daemon's limit)",
             static_cast<unsigned>(peer.uid), limits_.rings_per_user);
    refuse(connection, MRC_ERR_BUSY, reason);
    return;
  }
  const mrc_status_t status = programs_->add_client(peer.pid, ring_bytes, &connection.client);
  if (status != MRC_OK) {
    refuse(connection, status, mrc_last_error());
    return;
  }
  Welcome welcome;
  welcome.slot = connection.client.slot;
  welcome.ring_bytes = connection.client.ring_bytes;
  const Hooks hooks = programs_->hooks();
  snprintf(welcome.hooks[0], sizeof welcome.hooks[0], "%s", hooks.unmap);
  snprintf(welcome.hooks[1], sizeof welcome.hooks[1], "%s", hooks.remap);
  snprintf(welcome.hooks[2], sizeof welcome.hooks[2], "%s", hooks.madvise);
  const int fds[2] = {connection.client.ring_fd, programs_->lost_fd()};
  iovec io{&welcome, sizeof welcome};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof fds)] = {};
  msghdr message{};
  message.msg_iov = &io;
  message.msg_iovlen = 1;
  message.msg_control = control;
  message.msg_controllen = sizeof control;
  cmsghdr *rights = CMSG_FIRSTHDR(&message);
  rights->cmsg_level = SOL_SOCKET;
  rights->cmsg_type = SCM_RIGHTS;
  rights->cmsg_len = CMSG_LEN(sizeof fds);
  memcpy(CMSG_DATA(rights), fds, sizeof fds);
  connection.registered = true;
  connection.tgid = peer.pid;
  connection.uid = peer.uid;
  // The ring lives on in the programs' map and in the client's descriptor; not in ours.
  const bool sent = sendmsg(connection.fd, &message, MSG_NOSIGNAL | MSG_DONTWAIT) == sizeof welcome;
  ::close(connection.client.ring_fd);
  connection.client.ring_fd = -1;
  if (!sent) drop(connection);
}

void Server::drop(Connection &connection) noexcept {
  if (connection.registered) programs_->remove_client(connection.client, connection.tgid);
  if (connection.client.ring_fd >= 0) ::close(connection.client.ring_fd);
  if (connection.fd >= 0) ::close(connection.fd);
  connection = Connection{};
}

}  // namespace mrc::bpf
