// SPDX-License-Identifier: BSD-3-Clause
// The report of a run: a Markdown table per engine and binding (medians and per-repetition
// ratios), the raw figures as JSON, and the data files of the plot (scripts/appbench.gp).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tools/appbench/driver.h"

namespace appbench {

// The median of the finite values; nullopt when there is none.
std::optional<double> median(const std::vector<double> &values);

struct Ratio {
  double median = 0, min = 0, max = 0;
};
// a[i] / b[i] over the repetitions where both ran: its median and range.
std::optional<Ratio> ratio(const std::vector<double> &a, const std::vector<double> &b);

// The Markdown report (tables, then the goals' verdicts).
std::string markdown(const DriverConfig &config, const Results &results);
// Writes app.md, app.json and app-<engine>-<binding>.dat into dir; throws std::runtime_error.
void write_report(const DriverConfig &config, const Results &results, const std::string &dir);

}  // namespace appbench
