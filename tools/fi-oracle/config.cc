#include "tools/fi-oracle/config.h"

namespace fi_oracle {

std::vector<Step> plan(const Config &config) {
  std::vector<Step> steps;
  uint64_t msg = 0;
  for (Op op : config.ops) {
    for (Scenario scenario : config.scenarios) {
      for (uint64_t i = 0; i <= config.messages; ++i) {
        steps.push_back(Step{++msg, op, scenario, i == 0});
      }
    }
  }
  return steps;
}

}  // namespace fi_oracle
