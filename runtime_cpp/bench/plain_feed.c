// A feed with nothing of autodice or Python in it: frames of FRAME bytes through a Unix socket at
// RATE frames/s for SECONDS, each answered with RESULT bytes. The reading end is pinned to CORE,
// where a session's gateway sits; the writing end runs free, as the session's Python does, and
// sends 60 distinct frames in turn, as the session bench does. Run beside the program's own
// repeat, it measures what moving the frames costs ranks on the same cores: the ceiling for any
// feed on this machine (bench/session_bench.py).
//   plain_feed FRAME RESULT RATE SECONDS CORE   prints {"frames": N, "seconds": S}
//
// With --reader it is only the reading end, for bench/python_feed.py's writer: frames arrive in
// SLOTS shared slots of FRAME bytes (the memfd SHMFD), each announced by a 16-byte header on the
// socket SOCKFD as a session's are, and each is copied out of its slot (what rank 0's receive
// does with a session's frame) before RESULT bytes go back.
//   plain_feed --reader SOCKFD SHMFD SLOTS FRAME RESULT CORE
#define _GNU_SOURCE
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { kFrames = 60 };

static void move(int fd, char* p, size_t n, int out) {
  while (n > 0) {
    const ssize_t k = out ? write(fd, p, n) : read(fd, p, n);
    if (k <= 0) exit(1);
    p += k;
    n -= (size_t)k;
  }
}

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

static int reader(char** argv) {
  const int sock = atoi(argv[2]), shm = atoi(argv[3]);
  const size_t slots = strtoul(argv[4], NULL, 10), frame = strtoul(argv[5], NULL, 10);
  const size_t result = strtoul(argv[6], NULL, 10);
  pin(atoi(argv[7]));
  const char* shared = mmap(NULL, slots * frame, PROT_READ, MAP_SHARED, shm, 0);
  if (shared == MAP_FAILED) return 1;
  char* in = malloc(frame);
  char* out = calloc(result, 1);
  struct { unsigned kind, slot; long long id; } header;
  for (;;) {
    move(sock, (char*)&header, sizeof header, 0);
    if (header.slot < 1 || header.slot > slots) return 1;
    memcpy(in, shared + (header.slot - 1) * frame, frame);
    out[0] = in[frame - 1];  // the copy is used: the compiler keeps it
    move(sock, out, result, 1);
  }
}

int main(int argc, char** argv) {
  if (argc == 8 && strcmp(argv[1], "--reader") == 0) return reader(argv);
  if (argc != 6) {
    fprintf(stderr, "usage: %s FRAME RESULT RATE SECONDS CORE\n", argv[0]);
    return 2;
  }
  const size_t frame = strtoul(argv[1], NULL, 10), result = strtoul(argv[2], NULL, 10);
  const double rate = atof(argv[3]), seconds = atof(argv[4]);
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return 1;
  char* in = malloc(frame);
  char* out = calloc(result, 1);
  const pid_t reader = fork();
  if (reader == 0) {  // the gateway's part: read each frame, answer its result, until EOF
    close(sv[0]);
    pin(atoi(argv[5]));
    for (;;) {
      move(sv[1], in, frame, 0);
      move(sv[1], out, result, 1);
    }
  }
  close(sv[1]);
  char* frames = malloc(frame * kFrames);  // the session's part
  for (size_t i = 0; i < frame * kFrames; ++i) frames[i] = (char)(i * 7 + i / 4096);
  const long count = (long)(rate * seconds), step = (long)(1e9 / rate);
  struct timespec tick;
  clock_gettime(CLOCK_MONOTONIC, &tick);
  const double start = now();
  for (long i = 0; i < count; ++i) {
    tick.tv_nsec += step;
    while (tick.tv_nsec >= 1000000000L) {
      tick.tv_nsec -= 1000000000L;
      ++tick.tv_sec;
    }
    clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &tick, NULL);
    move(sv[0], frames + (size_t)(i % kFrames) * frame, frame, 1);
    move(sv[0], out, result, 0);
  }
  printf("{\"frames\": %ld, \"seconds\": %.3f}\n", count, now() - start);
  kill(reader, SIGTERM);
  waitpid(reader, NULL, 0);
  return 0;
}
