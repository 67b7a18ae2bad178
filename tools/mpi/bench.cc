// SPDX-License-Identifier: BSD-3-Clause
#include "tools/mpi/bench.h"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "tools/mpi/fabric.h"
#include "tools/mpi/key_ledger.h"
#include "tools/mpi/paths.h"
#include "tools/mpi/world.h"

namespace mrc_mpi {

namespace {

constexpr uint64_t kWarmup = 2;

struct Rts {  // ready to send: where the receiver reads from (MPI_BYTE)
  uint64_t addr = 0;
  uint64_t length = 0;
  uint32_t rkey = 0;
  uint32_t sequence = 0;
};

// Per sender and configuration; summed over the senders (MPI_DOUBLE).
struct Timing {
  double registration_ns = 0;
  double transfer_ns = 0;
  double messages = 0;
  double bad = 0;  // messages whose data did not arrive intact
};

uint64_t pattern(uint32_t sequence, uint64_t word) {
  return (uint64_t{sequence} << 40) ^ (word * 0x9e3779b97f4a7c15ULL);
}

double now_ns() {
  return std::chrono::duration<double, std::nano>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

uint64_t message_count(const BenchOptions &o, uint64_t size) {
  return std::clamp<uint64_t>(o.max_bytes / size, 8, std::max<uint64_t>(o.messages, 8));
}

Timing send(const BenchOptions &o, RegPath &path, int peer, uint64_t size, uint64_t k,
            MPI_Comm comm) {
  Timing t;
  uint8_t *buffer = nullptr;
  const uint64_t count = kWarmup + message_count(o, size);
  for (uint64_t i = 0; i < count; ++i) {
    if (buffer == nullptr || (k != 0 && i % k == 0)) {
      free(buffer);  // the application's allocator, with glibc's defaults
      buffer = static_cast<uint8_t *>(malloc(size));
      if (buffer == nullptr) throw std::runtime_error("malloc failed");
    }
    const auto sequence = static_cast<uint32_t>(i);
    for (uint64_t w = 0; w < size / 8; ++w) {
      const uint64_t v = pattern(sequence, w);
      memcpy(buffer + w * 8, &v, 8);
    }
    const double t0 = now_ns();
    const Registration r = path.get(buffer, size);
    const double t1 = now_ns();
    Rts rts{reinterpret_cast<uint64_t>(buffer), size, r.rkey, sequence};
    int ok = 0;
    MPI_Send(&rts, sizeof rts, MPI_BYTE, peer, 10, comm);
    MPI_Recv(&ok, 1, MPI_INT, peer, 11, comm, MPI_STATUS_IGNORE);
    const double t2 = now_ns();
    path.put(r);
    const double t3 = now_ns();
    if (i < kWarmup) continue;
    t.registration_ns += (t1 - t0) + (t3 - t2);
    t.transfer_ns += t2 - t1;
    t.messages += 1;
    t.bad += ok ? 0 : 1;
  }
  free(buffer);
  return t;
}

void receive(const BenchOptions &o, Fabric &fabric, uint8_t *landing, uint32_t lkey, int peer,
             uint64_t size, MPI_Comm comm) {
  const uint64_t count = kWarmup + message_count(o, size);
  for (uint64_t i = 0; i < count; ++i) {
    Rts rts;
    MPI_Recv(&rts, sizeof rts, MPI_BYTE, peer, 10, comm, MPI_STATUS_IGNORE);
    const std::vector<RdmaOp> op = {
        {IBV_WR_RDMA_READ, landing, lkey, rts.addr, rts.rkey, static_cast<uint32_t>(rts.length)}};
    const ibv_wc_status status = fabric.run(peer, 0, op)[0];
    if (status != IBV_WC_SUCCESS) {
      throw std::runtime_error(std::string("RDMA READ of the message: ") +
                               ibv_wc_status_str(status));
    }
    int ok = 1;
    for (uint64_t w : {uint64_t{0}, rts.length / 16, rts.length / 8 - 1}) {
      uint64_t v;
      memcpy(&v, landing + w * 8, 8);
      if (v != pattern(rts.sequence, w)) ok = 0;
    }
    MPI_Send(&ok, 1, MPI_INT, peer, 11, comm);
  }
}

std::string k_name(uint64_t k) { return k == 0 ? "inf" : std::to_string(k); }

}  // namespace

int run_bench(const BenchOptions &o, MPI_Comm comm) {
  const World world(comm);
  if (world.size < 2 || world.size % 2 != 0) {
    if (world.rank == 0) fprintf(stderr, "mrcache-mpi bench: needs an even number of ranks\n");
    return 2;
  }
  Fabric fabric(comm, o.device, o.gid_index, 1);
  const bool sender = world.rank % 2 == 0;
  const int peer = sender ? world.rank + 1 : world.rank - 1;
  KeyLedger ledger(fabric.pd());
  std::unique_ptr<RegPath> path;
  uint8_t *landing = nullptr;
  ibv_mr *landing_mr = nullptr;
  const uint64_t largest = *std::max_element(o.sizes.begin(), o.sizes.end());
  if (sender) {
    path = make_path(o.path, &ledger);
  } else {
    landing = static_cast<uint8_t *>(
        mmap(nullptr, largest, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    landing_mr = landing == MAP_FAILED
                     ? nullptr
                     : ibv_reg_mr(fabric.pd(), landing, largest, IBV_ACCESS_LOCAL_WRITE);
    if (landing_mr == nullptr)
      throw std::runtime_error("the landing buffer: mmap or ibv_reg_mr failed");
  }
  std::ofstream json;
  if (world.rank == 0 && !o.json.empty()) json.open(o.json, std::ios::app);
  int failed = 0;
  if (world.rank == 0) {
    printf("mrcache-mpi bench: path %s, %d ranks on %d nodes (%d pairs), device %s\n",
           o.path.c_str(), world.size, world.nodes, world.size / 2, fabric.device_name().c_str());
    printf("  %8s %4s %6s %12s %12s %12s\n", "size", "k", "msgs", "us/msg", "reg us", "xfer us");
  }
  for (uint64_t size : o.sizes) {
    for (uint64_t k : o.reallocate_every) {
      MPI_Barrier(comm);
      Timing mine;
      if (sender) {
        mine = send(o, *path, peer, size, k, comm);
      } else {
        receive(o, fabric, landing, landing_mr->lkey, peer, size, comm);
      }
      Timing sum;
      MPI_Reduce(&mine, &sum, 4, MPI_DOUBLE, MPI_SUM, 0, comm);
      if (world.rank != 0) continue;
      const double per = sum.messages > 0 ? 1e-3 / sum.messages : 0;
      const double reg_us = sum.registration_ns * per, xfer_us = sum.transfer_ns * per;
      failed |= sum.bad > 0;
      printf("  %8lu %4s %6.0f %12.1f %12.1f %12.1f%s\n", static_cast<unsigned long>(size),
             k_name(k).c_str(), sum.messages, reg_us + xfer_us, reg_us, xfer_us,
             sum.bad > 0 ? "  DATA CHECK FAILED" : "");
      const nlohmann::json line = {{"path", o.path},
                                   {"size", size},
                                   {"k", k_name(k)},
                                   {"messages", sum.messages},
                                   {"us_per_msg", reg_us + xfer_us},
                                   {"reg_us", reg_us},
                                   {"xfer_us", xfer_us},
                                   {"ranks", world.size},
                                   {"nodes", world.nodes},
                                   {"rep", o.repetition},
                                   {"bad", sum.bad}};
      printf("MRCMPI-BENCH %s\n", line.dump().c_str());
      if (json.is_open()) json << line.dump() << "\n";
      fflush(stdout);
    }
  }
  if (sender && o.path != "none") {
    printf("  rank %d %s counters: %s\n", world.rank, o.path.c_str(),
           path->counters_json().c_str());
  }
  path.reset();
  if (landing_mr != nullptr) ibv_dereg_mr(landing_mr);
  if (landing != nullptr) munmap(landing, largest);
  MPI_Bcast(&failed, 1, MPI_INT, 0, comm);
  return failed;
}

int run_report(const std::vector<std::string> &files) {
  // (ranks, size, k) -> path -> figures per repetition
  using Key = std::tuple<int, uint64_t, std::string>;
  std::map<Key, std::map<std::string, std::vector<double>>> totals, regs;
  for (const std::string &file : files) {
    std::ifstream in(file);
    if (!in) {
      fprintf(stderr, "mrcache-mpi report: cannot read %s\n", file.c_str());
      return 2;
    }
    std::string text;
    while (std::getline(in, text)) {
      const size_t at = text.find('{');
      if (at == std::string::npos || (text.rfind("MRCMPI-BENCH", 0) != 0 && at != 0)) continue;
      const auto line = nlohmann::json::parse(text.substr(at), nullptr, false);
      if (line.is_discarded() || !line.contains("us_per_msg")) continue;
      const Key key{line["ranks"].get<int>(), line["size"].get<uint64_t>(),
                    line["k"].get<std::string>()};
      totals[key][line["path"]].push_back(line["us_per_msg"].get<double>());
      regs[key][line["path"]].push_back(line["reg_us"].get<double>());
    }
  }
  if (totals.empty()) {
    fprintf(stderr, "mrcache-mpi report: no MRCMPI-BENCH lines in the input\n");
    return 1;
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  };
  const char *paths[] = {"exact", "fast", "ucx", "none"};
  // One table per figure: the medians over the repetitions, per path, and their ratios.
  auto table = [&](const char *title, auto &figures) {
    printf(
        "%s\n\n| ranks | size | k | exact | fast | ucx | none | exact/none | exact/ucx | "
        "fast/none | fast/ucx |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        title);
    for (auto &[key, by_path] : figures) {
      std::map<std::string, double> m;
      for (const char *p : paths) {
        if (auto it = by_path.find(p); it != by_path.end()) m[p] = median(it->second);
      }
      printf("| %d | %lu | %s |", std::get<0>(key), static_cast<unsigned long>(std::get<1>(key)),
             std::get<2>(key).c_str());
      for (const char *p : paths) {
        if (m.count(p)) {
          printf(" %.1f |", m[p]);
        } else {
          printf(" - |");
        }
      }
      for (const auto &[x, y] : {std::pair{"exact", "none"}, std::pair{"exact", "ucx"},
                                 std::pair{"fast", "none"}, std::pair{"fast", "ucx"}}) {
        if (m.count(x) && m.count(y) && m.at(y) > 0) {
          printf(" %.2f |", m.at(x) / m.at(y));
        } else {
          printf(" - |");
        }
      }
      printf("\n");
    }
    printf("\n");
  };
  table("Time per message, us (median over the repetitions)", totals);
  table("Registration per message (get + put), us", regs);
  return 0;
}

}  // namespace mrc_mpi
