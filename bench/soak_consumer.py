"""soak_consumer.py - the library consumer bench/soak.py starts, stalls and kills: the
xmem Python module (libxmem's C API through ctypes) taking frames from a pool.

usage: soak_consumer.py NAME [--seed S] [--hold-max K]

Receives frames, reads a byte at each end of every one, and keeps the last 0..K of
them (a number redrawn about once a second), so that it holds slots as a real
consumer would. SIGTERM (or SIGINT) ends it cleanly: it lets its frames go, closes
its handle and prints what it received. Exit status 0, or 1 on an error from libxmem.
"""

import argparse
import collections
import random
import signal
import sys
import time

import xmem


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("name")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hold-max", type=int, default=2)
    args = parser.parse_args()

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    rng = random.Random(args.seed)
    held = collections.deque()
    received = 0
    checksum = 0
    hold = rng.randint(0, args.hold_max)
    redraw = time.monotonic() + 1.0
    status = 0
    consumer = None
    try:
        consumer = xmem.open(args.name, timeout=10.0, queue_size=4)
        while not stop:
            try:
                frame = consumer.receive(timeout=0.25)
            except xmem.Timeout:
                continue
            except (xmem.EndOfStream, xmem.Closed):
                break
            data = frame.data
            checksum = (checksum + data[0] + data[len(data) - 1]) & 0xFFFFFFFF
            del data
            received += 1
            held.append(frame)
            now = time.monotonic()
            if now >= redraw:
                hold = rng.randint(0, args.hold_max)
                redraw = now + 1.0
            while len(held) > hold:
                held.popleft().release()
    except xmem.Error as e:
        print("soak_consumer: %s" % e, file=sys.stderr)
        status = 1
    finally:
        while held:
            held.popleft().release()
        if consumer is not None:
            consumer.close()
    print("soak_consumer: received %d frames (checksum %08x)" % (received, checksum))
    return status


if __name__ == "__main__":
    sys.exit(main())
