#!/usr/bin/env python3
"""torch_stream.py POOL [--frames N] - PyTorch reading each frame of a CUDA device pool
in place, on a stream of its own, with no CPU wait for the GPU while frames flow.

Attaches to POOL (CUDA device memory, frames published as (height, width, channels)
uint8 tensors, e.g. by a torch producer's ``publish(w, dtype="uint8", shape=(h, w, c))``)
and, for each frame, on one torch.cuda.Stream S:
- ``receive(stream=S)``: S waits on the GPU for the producer's writes; the CPU does not;
- ``torch.from_dlpack``: the tensor is the slot itself (its data_ptr() is frame.cuda_ptr);
- the mean of each channel is computed on S and copied on S into pinned host memory,
  and an event is recorded on S after it;
- the tensor and the frame go at once: the slot is released on S, so the producer's
  next write into it waits on the GPU for the work queued on S so far, never the CPU;
- a frame's line is printed once its event has passed (event.query(), which never
  waits); the last frames' after waiting for their events at the end: the only waits
  are on S's events, never a synchronization of the whole device.

    torch_stream: frame SEQ means M0 M1 .. tensor 0xADDRESS slot 0xADDRESS zero-copy

    python3 examples/python/torch_stream.py cam0 --frames 100
"""

import argparse
import collections
import sys

try:
    import torch
except ImportError as e:
    sys.exit("torch_stream.py: needs PyTorch with CUDA: %s" % e)

import xmem

# A frame whose means are queued on the stream: its line is printed once DONE passed.
Pending = collections.namedtuple("Pending", "seq means done tensor slot")


def report(pending):
    print("torch_stream: frame %d means %s tensor 0x%x slot 0x%x %s" % (
        pending.seq, " ".join("%.3f" % m for m in pending.means.tolist()), pending.tensor, pending.slot,
        "zero-copy" if pending.tensor == pending.slot else "COPIED"), flush=True)


def check_layout(frame, device):
    m = frame.meta
    if m.dtype != "uint8" or len(m.shape) != 3:
        sys.exit("torch_stream.py: frame %d is a %s tensor of shape %s, not (height, width, channels) uint8"
                 % (m.seq, m.dtype, m.shape))
    if m.device != device.index:
        sys.exit("torch_stream.py: frame %d is on CUDA device %d, the stream on %s" % (m.seq, m.device, device))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pool")
    parser.add_argument("--frames", type=int, default=0, help="stop after this many frames (0: until EOS)")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the pool and each frame")
    args = parser.parse_args()

    if not torch.cuda.is_available():
        sys.exit("torch_stream.py: this PyTorch %s sees no CUDA device" % torch.__version__)
    consumer = xmem.open(args.pool, timeout=args.timeout)
    if consumer.storage != "cuda":
        sys.exit("torch_stream.py: pool %s is in %s memory, not CUDA device memory (infer.py reads both)"
                 % (args.pool, consumer.storage))
    device = torch.device("cuda", consumer.classes()[0]["device"])
    # Lives until every frame received on it is released (xmem_buffer_release_on_stream).
    stream = torch.cuda.Stream(device=device)
    pending = collections.deque()
    count = 0
    with torch.no_grad():
        while not args.frames or count < args.frames:
            try:
                frame = consumer.receive(timeout=args.timeout, stream=stream)
            except xmem.EndOfStream:
                break
            check_layout(frame, device)
            with torch.cuda.stream(stream):
                # Passing S says where the tensor is used: the frame is ready there, so
                # nothing waits on the CPU.
                pixels = torch.from_dlpack(frame.__dlpack__(stream=stream.cuda_stream))
                height, width, channels = pixels.shape
                sums = pixels.sum(dim=(0, 1), dtype=torch.float64)  # reads the slot in place
                means = torch.empty(channels, dtype=torch.float64, pin_memory=True)
                means.copy_(sums / (height * width), non_blocking=True)
                done = torch.cuda.Event()
                done.record(stream)
            pending.append(Pending(frame.meta.seq, means, done, pixels.data_ptr(), frame.cuda_ptr))
            # The capsule's hold goes with the tensor and the frame's with release(): the
            # slot is then released on S, after the sum that reads it.
            del pixels, sums
            frame.release()
            count += 1
            while pending and pending[0].done.query():
                report(pending.popleft())
    while pending:
        pending[0].done.synchronize()
        report(pending.popleft())
    consumer.close()
    if not count:
        sys.exit("torch_stream.py: no frame received")
    print("torch_stream: %d frames on %s, read on stream 0x%x and released on it, torch %s" % (
        count, device, stream.cuda_stream, torch.__version__))


if __name__ == "__main__":
    main()
