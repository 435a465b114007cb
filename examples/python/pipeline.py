#!/usr/bin/env python3
"""pipeline.py decode|preprocess|infer POOL [--frames N] - a three-stage pipeline in one pool.

Decode (the pool's owner) writes frames; preprocess, a process attached to the same pool,
turns each into a float32 tensor in another slot of that pool (it produces as a guest:
the owner leases it the slot and publishes it on its behalf); infer reads the tensors.
Each stage hands the next a ticket as a line of text on a plain pipe, as an app with its
own bus would, and no byte of a frame or a tensor is copied between processes:

    python3 examples/python/pipeline.py decode demo --frames 5 | \\
        python3 examples/python/pipeline.py preprocess demo | \\
        python3 examples/python/pipeline.py infer demo

Frame i is a 16 x 16 gray image of value i; its tensor holds i / 255 as float32; infer
prints each tensor's shape and mean. A stage that dies leaks nothing: its tickets expire,
its references are reaped, and the slots it was writing go back.
"""

import argparse
import sys
import time

import numpy

import xmem

SIDE = 16


def decode(pool, frames):
    # Class 0: the frames; class 1: the tensors preprocess writes (4 bytes a pixel).
    with xmem.create(pool, SIDE * SIDE, slots=4) as producer:
        producer.preallocate(SIDE * SIDE * 4, 4)
        for i in range(frames):
            frame = producer.acquire(timeout=5)
            frame.buffer[:SIDE * SIDE] = bytes([i % 256]) * (SIDE * SIDE)
            ticket = producer.publish_ticket(frame, redemptions=1, ttl=10.0, dtype="uint8", shape=(SIDE, SIDE),
                                             content_type="gray8")
            print(ticket, flush=True)
        # The pool lives until both hand-overs of every frame are made (or expire).
        for _ in range(1000):
            stats = producer.ticket_stats()
            if stats["redeemed"] + stats["expired"] >= 2 * frames:
                break
            time.sleep(0.01)


def preprocess(pool):
    with xmem.open(pool, timeout=10) as stage:
        for line in sys.stdin:
            with stage.get(line.strip()) as frame:
                gray = numpy.asarray(frame)
                tensor = stage.acquire(timeout=5, size=gray.size * 4)  # a slot of the tensors' class
                values = gray.astype(numpy.float32) / 255.0
                tensor.buffer[:values.nbytes] = values.tobytes()
                del gray
            ticket = stage.publish_ticket(tensor, redemptions=1, ttl=10.0, dtype="float32", shape=values.shape,
                                          content_type="tensor")
            print(ticket, flush=True)


def infer(pool):
    with xmem.open(pool, timeout=10) as stage:
        for line in sys.stdin:
            with stage.get(line.strip()) as frame:
                values = numpy.asarray(frame)
                print("tensor %s %s mean %.4f" % (values.dtype, values.shape, float(values.mean())), flush=True)
                del values


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stage", choices=("decode", "preprocess", "infer"))
    parser.add_argument("pool")
    parser.add_argument("--frames", type=int, default=5)
    args = parser.parse_args()
    if args.stage == "decode":
        decode(args.pool, args.frames)
    elif args.stage == "preprocess":
        preprocess(args.pool)
    else:
        infer(args.pool)


if __name__ == "__main__":
    main()
