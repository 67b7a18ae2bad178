// SPDX-License-Identifier: BSD-3-Clause
#include "tools/fi-oracle/config.h"

namespace fi_oracle {

std::vector<Step> plan(const Config &config) {
  std::vector<Step> steps;
  uint64_t msg = 0;
  for (Scenario scenario : config.scenarios) {
    uint64_t n = scenario == Scenario::kRace ? config.race_messages : config.messages;
    for (Op op : config.ops) {
      for (uint64_t i = 0; i <= n; ++i) steps.push_back(Step{++msg, op, scenario, i == 0});
    }
  }
  return steps;
}

}  // namespace fi_oracle
