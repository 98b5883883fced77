// The copy ceiling for a transfer between two cores: core A writes a buffer, core B copies it
// into a buffer of its own (what any same-host transfer must at least do, once). Prints one JSON
// line per size: median and best microseconds of B's memcpy over `reps` rounds.
//   cross_core_copy CORE_A CORE_B REPS BYTES...
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static char *src, *dst;
static size_t n;
static int reps;
static atomic_int turn;  // 2i+1: round i written by A; 2i+2: copied by B
static double* t;

static void pin(int core) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(core, &s);
  pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}
static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}
static void* reader(void* core) {
  pin(*(int*)core);
  for (int i = 0; i < reps + 3; ++i) {
    while (atomic_load(&turn) != 2 * i + 1) {}
    double t0 = now_us();
    memcpy(dst, src, n);
    if (i >= 3) t[i - 3] = now_us() - t0;
    atomic_store(&turn, 2 * i + 2);
  }
  return NULL;
}
static int by_value(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

int main(int argc, char** argv) {
  int a = atoi(argv[1]), b = atoi(argv[2]);
  reps = atoi(argv[3]);
  t = malloc(sizeof(double) * reps);
  pin(a);
  for (int k = 4; k < argc; ++k) {
    n = strtoull(argv[k], NULL, 10);
    src = malloc(n), dst = malloc(n);
    memset(dst, 0, n);
    atomic_store(&turn, 0);
    pthread_t th;
    pthread_create(&th, NULL, reader, &b);
    for (int i = 0; i < reps + 3; ++i) {
      memset(src, i, n);  // the buffer last written on core A
      atomic_store(&turn, 2 * i + 1);
      while (atomic_load(&turn) != 2 * i + 2) {}
    }
    pthread_join(th, NULL);
    qsort(t, reps, sizeof(double), by_value);
    printf("{\"bytes\": %zu, \"median_us\": %.2f, \"best_us\": %.2f}\n", n, t[reps / 2], t[0]);
    free(src), free(dst);
  }
  return 0;
}
