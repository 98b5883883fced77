"""A bare Python feed: the session's bytes from one Python loop, nothing of autodice in it.

    python bench/python_feed.py PLAIN_FEED FRAME RESULT RATE SECONDS CORE

Frames of FRAME bytes (60 distinct ones in turn, float32) go at RATE frames/s for SECONDS into
shared slots, each announced by a 16-byte header through a Unix socket, and RESULT bytes come back
for each, as a session's frames and results do. The reading end is ``plain_feed --reader``
(runtime_cpp/bench/plain_feed.c), pinned to CORE where a session's gateway sits; it copies each
frame out of its slot, as rank 0's receive does. One thread, one frame in flight, no checks of
the frames: the least a Python caller does to feed a program through shared memory. Run beside
the program's own repeat, it measures what Python feeding at all costs ranks on the same cores
(bench/session_bench.py). Prints {"frames": N, "seconds": S, "cpu_s": C}.
"""

from __future__ import annotations

import json
import mmap
import os
import socket
import struct
import subprocess
import sys
import time

import numpy as np

SLOTS = 6  # a 2-rank session's window


def main() -> int:
    exe, frame, result, rate, seconds, core = sys.argv[1:7]
    frame, result, rate, seconds = int(frame), int(result), float(rate), float(seconds)
    ours, theirs = socket.socketpair()
    fd = os.memfd_create("python-feed")
    os.ftruncate(fd, SLOTS * frame)
    shared = mmap.mmap(fd, SLOTS * frame)
    reader = subprocess.Popen([exe, "--reader", str(theirs.fileno()), str(fd), str(SLOTS),
                               str(frame), str(result), core], pass_fds=(theirs.fileno(), fd))
    theirs.close()
    rng = np.random.default_rng(0)
    frames = [rng.standard_normal(frame // 4).astype(np.float32) for _ in range(60)]
    slots = [np.frombuffer(shared, np.float32, frame // 4, k * frame) for k in range(SLOTS)]
    header, back = struct.Struct("<IIq"), bytearray(result)
    count, step = int(rate * seconds), 1.0 / rate
    start = time.perf_counter()
    cpu = time.process_time()
    for i in range(count):
        wait = start + i * step - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        np.copyto(slots[i % SLOTS], frames[i % 60])
        ours.sendall(header.pack(1, i % SLOTS + 1, i))
        ours.recv_into(back, result, socket.MSG_WAITALL)
    cpu = time.process_time() - cpu
    elapsed = time.perf_counter() - start
    ours.close()
    reader.wait()
    print(json.dumps({"frames": count, "seconds": round(elapsed, 3), "cpu_s": round(cpu, 4)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
