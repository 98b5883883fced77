// The P5 ceiling: Open MPI alone, nothing of autodice linked in. Ranks 0 and 1 ping-pong
// `bytes` with MPI_Send/MPI_Recv between malloc'd, written buffers laid out as a pipeline's:
// rank 0 sends one buffer and receives into another, rank 1 receives into one and sends it
// back (through one buffer per rank, a 4 MiB ping-pong stays in cache). Rank 0 prints one JSON
// line per size: median and best one-way microseconds over `reps` round trips.
//   mpirun -n 2 --bind-to core mpi_pingpong REPS BYTES...
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int by_value(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, reps = argc > 1 ? atoi(argv[1]) : 15;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  double* t = malloc(sizeof(double) * reps);
  for (int a = 2; a < argc; ++a) {
    size_t n = strtoull(argv[a], NULL, 10);
    char *buf = malloc(n), *out = malloc(n);
    memset(buf, rank + 1, n);
    memset(out, rank + 1, n);
    for (int i = -3; i < reps; ++i) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      if (rank == 0) {
        MPI_Send(out, (int)n, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
        MPI_Recv(buf, (int)n, MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      } else {
        MPI_Recv(buf, (int)n, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Send(buf, (int)n, MPI_BYTE, 0, 0, MPI_COMM_WORLD);
      }
      if (i >= 0) t[i] = (MPI_Wtime() - t0) * 1e6 / 2;
    }
    qsort(t, reps, sizeof(double), by_value);
    if (rank == 0)
      printf("{\"bytes\": %zu, \"median_us\": %.2f, \"best_us\": %.2f}\n", n, t[reps / 2], t[0]);
    free(buf);
    free(out);
  }
  free(t);
  MPI_Finalize();
  return 0;
}
