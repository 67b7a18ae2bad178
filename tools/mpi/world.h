// SPDX-License-Identifier: BSD-3-Clause
// Where a rank is: its number, the number of ranks, and the number of nodes they run on.
#pragma once

#include <mpi.h>

namespace mrc_mpi {

struct World {
  explicit World(MPI_Comm comm) {
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    // One node per shared-memory communicator; count their first ranks.
    MPI_Comm node;
    MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
    int node_rank = 0;
    MPI_Comm_rank(node, &node_rank);
    MPI_Comm_free(&node);
    int leader = node_rank == 0 ? 1 : 0;
    MPI_Allreduce(&leader, &nodes, 1, MPI_INT, MPI_SUM, comm);
  }
  int rank = 0;
  int size = 0;
  int nodes = 0;
};

}  // namespace mrc_mpi
