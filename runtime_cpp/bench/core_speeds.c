// Do the two cores a 2-stage pipeline runs on compute equally fast? One thread pinned to each
// core times the same float loop over its own 1 MiB buffer, both at once for SECONDS, nothing of
// ncnn or MPI in it: a second method for the spread between cores that bench/backend_bench.py
// sees in two ncnn processes run at once.
//
//   core_speeds CORE_A CORE_B SECONDS   prints {"passes_per_s": [A, B]}
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { kFloats = 1 << 18 };
static float buffers[2][kFloats];
static double seconds, rates[2];
static int cores[2];

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void* work(void* arg) {
  const int k = (int)(long)arg;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cores[k], &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);
  float* b = buffers[k];
  long passes = 0;
  const double start = now();
  while (now() - start < seconds) {
    for (int i = 0; i < kFloats; ++i) b[i] = b[i] * 0.999f + 1.0f;
    ++passes;
  }
  rates[k] = passes / (now() - start);
  return NULL;
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s CORE_A CORE_B SECONDS\n", argv[0]);
    return 2;
  }
  cores[0] = atoi(argv[1]);
  cores[1] = atoi(argv[2]);
  seconds = atof(argv[3]);
  pthread_t threads[2];
  for (long k = 0; k < 2; ++k) pthread_create(&threads[k], NULL, work, (void*)k);
  for (int k = 0; k < 2; ++k) pthread_join(threads[k], NULL);
  printf("{\"passes_per_s\": [%.1f, %.1f]}\n", rates[0], rates[1]);
  return 0;
}
