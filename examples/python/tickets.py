#!/usr/bin/env python3
"""tickets.py produce|redeem POOL [--frames N] - frame tickets over a plain Unix pipe.

An application that already carries frame references over its own channel (ZeroMQ,
gRPC, a database row, here a pipe) sends tickets instead of frames: the producer
publishes each frame to no queue and writes its ticket as a line of text; the other
process attaches to the pool, reads the lines and redeems each ticket for the frame
itself, without a copy.

    python3 examples/python/tickets.py produce demo --frames 5 | \\
        python3 examples/python/tickets.py redeem demo

The producer makes float32 tensors of shape (2, 3), frame i holding i, i + 0.5, ...;
the redeemer prints each frame's seq and values. A ticket not redeemed within a second
gives its slot back (the redeemer may start late, or die: nothing leaks).
"""

import argparse
import sys
import time

import numpy

import xmem


def produce(pool, frames):
    with xmem.create(pool, 4096, slots=4) as producer:
        for i in range(frames):
            frame = producer.acquire(timeout=5)
            values = numpy.arange(6, dtype=numpy.float32).reshape(2, 3) * 0.5 + i
            frame.buffer[:values.nbytes] = values.tobytes()
            ticket = producer.publish_ticket(frame, redemptions=1, ttl=1.0, dtype="float32", shape=(2, 3))
            print(ticket, flush=True)  # the ticket's text: any channel will do
        # Wait for the redeemer before closing the pool (closing ends its tickets).
        for _ in range(500):
            stats = producer.ticket_stats()
            if stats["redeemed"] + stats["expired"] >= frames:
                break
            time.sleep(0.01)


def redeem(pool):
    with xmem.open(pool, timeout=10) as consumer:
        for line in sys.stdin:
            with consumer.get(line.strip()) as frame:
                values = numpy.asarray(frame)
                print("frame %d: %s %s" % (frame.meta.seq, values.dtype, values.tolist()), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", choices=("produce", "redeem"))
    parser.add_argument("pool")
    parser.add_argument("--frames", type=int, default=5)
    args = parser.parse_args()
    if args.role == "produce":
        produce(args.pool, args.frames)
    else:
        redeem(args.pool)


if __name__ == "__main__":
    main()
