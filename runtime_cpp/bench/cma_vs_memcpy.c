// What a session's first stage pays to take a frame: the frame lies in shared memory (a memfd)
// that another process has just written on the other core. Open MPI's single copy reads it with
// process_vm_readv (CMA: the pages of the other process pinned, then copied); a process that
// mapped the memfd itself could memcpy it. Times both, in turns, on the same bytes.
//   cma_vs_memcpy [BYTES [ROUNDS]]   (default: a SqueezeNet frame, 602112 bytes; 300 rounds)
// Prints {"bytes": N, "cma_us": median, "memcpy_us": median}.
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void pin(int core) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(core, &s);
  sched_setaffinity(0, sizeof s, &s);
}

static int by_value(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char** argv) {
  const size_t n = argc > 1 ? strtoul(argv[1], NULL, 10) : 602112;
  const int rounds = argc > 2 ? atoi(argv[2]) : 300;
  const int fd = memfd_create("frames", 0);
  if (fd < 0 || ftruncate(fd, (off_t)n) != 0) return 1;
  float* shared = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  char* mine = malloc(n);
  double* cma = malloc(rounds * sizeof(double));
  double* copy = malloc(rounds * sizeof(double));
  int go[2], written[2];
  if (shared == MAP_FAILED || !mine || !cma || !copy || pipe(go) || pipe(written)) return 1;
  memset(mine, 1, n);
  const pid_t writer = fork();
  if (writer == 0) {  // the feed: a new frame into the slot on core 1 whenever asked
    pin(1);
    char c;
    for (int i = 0; i < 2 * rounds; ++i) {
      if (read(go[0], &c, 1) != 1) return 1;
      for (size_t k = 0; k < n / 4; ++k) shared[k] = (float)(i + k);
      if (write(written[1], &c, 1) != 1) return 1;
    }
    return 0;
  }
  pin(0);  // the first stage
  char c = 0;
  for (int i = 0; i < rounds; ++i)
    for (int way = 0; way < 2; ++way) {
      if (write(go[1], &c, 1) != 1 || read(written[0], &c, 1) != 1) return 1;
      const double t0 = now();
      if (way == 0) {
        struct iovec to = {mine, n}, from = {shared, n};  // the same address in the writer
        if (process_vm_readv(writer, &to, 1, &from, 1, 0) != (ssize_t)n) return 1;
      } else {
        memcpy(mine, shared, n);
      }
      (way == 0 ? cma : copy)[i] = now() - t0;
    }
  qsort(cma, rounds, sizeof(double), by_value);
  qsort(copy, rounds, sizeof(double), by_value);
  printf("{\"bytes\": %zu, \"cma_us\": %.1f, \"memcpy_us\": %.1f, \"check\": %d}\n", n,
         cma[rounds / 2] * 1e6, copy[rounds / 2] * 1e6, mine[n - 1]);
  return 0;
}
