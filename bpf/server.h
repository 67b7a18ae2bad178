// SPDX-License-Identifier: BSD-3-Clause
// The core of mrcache-bpfd: the programs loaded once and proven, a unix socket, and one ring per
// process that asks, each forgotten when its connection closes (docs/DESIGN.md, "The eBPF
// monitor's daemon"; the words on the wire: protocol.h).
//
// 1. start() and close() by the owner; serve() by one thread, until `stop` is set.
// 2. Limits: a ring's size is bounded; so are the rings of one user (uid) and the connections
//    that have not asked yet. A refusal is a Welcome with a status and a reason.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "bpf/abi.h"
#include "bpf/loader.h"
#include "mrcache/mrcache.h"

namespace mrc::bpf {

struct ServerLimits {
  size_t default_ring_bytes = size_t{1} << 20;
  size_t max_ring_bytes = size_t{16} << 20;
  unsigned rings_per_user = 16;
};

class Server {
 public:
  // Loads the programs, proves every kind of change on a ring of its own (the self-test), and
  // listens at `socket_path` (mode 0666: any user may ask; the limits bound what it gets).
  // MRC_ERR_UNSUPPORTED (the programs), MRC_ERR_IO (the socket), MRC_ERR_NO_MEMORY, with the
  // reason in mrc_last_error().
  [[nodiscard]] static mrc_status_t start(const char *socket_path, const ServerLimits &limits,
                                          Server **out) noexcept;
  // Accepts, answers and forgets connections until `stop` is set (checked every 100 ms).
  void serve(const std::atomic<bool> &stop) noexcept;
  // Forgets every client, unloads the programs, removes the socket.
  void close() noexcept;

  size_t clients() const noexcept;
  Hooks hooks() const noexcept { return programs_->hooks(); }

 private:
  // Every client slot, and a few connections that have not said Hello yet.
  static constexpr size_t kMaxConnections = MRC_BPF_MAX_CLIENTS + 16;

  struct Connection {
    int fd = -1;
    bool registered = false;
    pid_t tgid = 0;
    uid_t uid = 0;
    Programs::Client client{};
  };

  Server() = default;
  ~Server() = default;
  void accept_one() noexcept;
  void answer(Connection &connection) noexcept;
  void refuse(Connection &connection, mrc_status_t status, const char *reason) noexcept;
  void drop(Connection &connection) noexcept;
  unsigned rings_of(uid_t uid) const noexcept;

  Programs *programs_ = nullptr;
  ServerLimits limits_{};
  int listener_ = -1;
  char path_[108] = {};
  Connection connections_[kMaxConnections];
};

}  // namespace mrc::bpf
