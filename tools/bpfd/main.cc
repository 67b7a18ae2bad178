// SPDX-License-Identifier: BSD-3-Clause
// mrcache-bpfd: the eBPF monitor's daemon. Loads the programs once (hooks chosen from the
// kernel's BTF), proves every kind of change with the self-test, then hands each process that
// connects to its socket a ring of its own address space's changes, forgotten when the
// connection closes (docs/DESIGN.md, "The eBPF monitor's daemon"). Runs until SIGTERM or SIGINT.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "bpf/protocol.h"
#include "bpf/server.h"

namespace {

std::atomic<bool> g_stop{false};

void on_signal(int) { g_stop.store(true, std::memory_order_release); }

}  // namespace

int main(int argc, char **argv) {
  CLI::App app{"mrcache-bpfd: rings of address-space changes for mrcache's eBPF monitor"};
  std::string socket_path = mrc::bpf::kDefaultSocket;
  mrc::bpf::ServerLimits limits;
  app.add_option("--socket", socket_path, "where processes ask for their ring")
      ->capture_default_str();
  app.add_option("--ring-bytes", limits.default_ring_bytes,
                 "a ring's size when the process asks for none (a power of two)")
      ->capture_default_str();
  app.add_option("--max-ring-bytes", limits.max_ring_bytes,
                 "the largest ring a process may ask for")
      ->capture_default_str();
  app.add_option("--rings-per-user", limits.rings_per_user, "rings one user's processes may hold")
      ->capture_default_str()
      ->check(CLI::Range(1U, 64U));
  CLI11_PARSE(app, argc, argv);

  // The socket's directory, when it is missing (systemd's RuntimeDirectory makes it otherwise).
  char directory[108];
  std::snprintf(directory, sizeof directory, "%s", socket_path.c_str());
  if (char *slash = std::strrchr(directory, '/'); slash != nullptr && slash != directory) {
    *slash = '\0';
    if (mkdir(directory, 0755) != 0 && errno != EEXIST) {
      std::fprintf(stderr, "mrcache-bpfd: mkdir %s: %s\n", directory, strerror(errno));
      return 1;
    }
  }
  mrc::bpf::Server *server = nullptr;
  if (mrc::bpf::Server::start(socket_path.c_str(), limits, &server) != MRC_OK) {
    std::fprintf(stderr, "mrcache-bpfd: %s\n", mrc_last_error());
    return 1;
  }
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  const mrc::bpf::Hooks hooks = server->hooks();
  std::fprintf(stderr, "mrcache-bpfd: serving at %s (hooks: %s, %s, %s)\n", socket_path.c_str(),
               hooks.unmap, hooks.remap, hooks.madvise);
  server->serve(g_stop);
  server->close();
  std::fprintf(stderr, "mrcache-bpfd: stopped\n");
  return 0;
}
