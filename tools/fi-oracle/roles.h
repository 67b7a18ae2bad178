// SPDX-License-Identifier: BSD-3-Clause
// The two processes of a run. Each opens its endpoint, trades addresses with the other over
// `oob` (one end of a socketpair the driver made), then walks the plan (config.h) in lockstep:
// the sender changes its buffer, stamps it, sends or writes it (or reads into it), and waits for
// the receiver's acknowledgement; the receiver checks every byte (the sender does, for a read),
// then acknowledges. Both write one line per message to `report` (a pipe to the driver):
//   S <msg> <reused 0|1> <registrations> [<verdict>]  sender, after the acknowledgement; the
//                                                      verdict of a read
//   R <msg> <verdict> <stale words> <corrupt words> <newest stale msg> <first bad byte>
//   R <msg> -                                          receiver, for a read (nothing to check)
//   I <text>                                           information (the endpoint it opened)
//   E <timeout 0|1> <text>                             the process's run ended with an error
//   D                                                  the process's run is complete
// A verdict is ok, stale or corrupt.
#pragma once

#include "tools/fi-oracle/config.h"

namespace fi_oracle {

enum class Role { kSend, kRecv };

// The exit status of the process: 0 when it completed its plan.
int run_role(Role role, const Config &config, int oob, int report);

}  // namespace fi_oracle
