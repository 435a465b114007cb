#!/usr/bin/env python3
"""infer.py POOL [--frames N] - an inference consumer of an xmem pool.

Attaches to POOL (NV12 frames, in system or CUDA memory), takes each frame as a torch
tensor without copying it (DLPack), turns it into a normalized RGB tensor on the
frame's own device, runs a small convolutional network built here (random weights,
nothing downloaded), and prints frames per second and the latency from the
producer's publish time to the end of inference, once a second and at the end.

    python3 examples/python/infer.py cam0 --frames 300
"""

import argparse
import statistics
import sys
import time

import torch
from torch.utils import dlpack

import xmem


def planes(frame, tensor, width, height):
    """Y (h, w) and UV (h/2, w/2, 2) of an NV12 frame, as views of TENSOR (the whole
    slot, from DLPack) with the frame's own offsets and strides: no copy."""
    (y_offset, uv_offset), (y_stride, uv_stride) = frame.meta.plane_offsets, frame.meta.plane_strides
    storage = tensor.reshape(-1) if tensor.is_contiguous() else tensor
    y = torch.as_strided(storage, (height, width), (y_stride, 1), y_offset)
    uv = torch.as_strided(storage, ((height + 1) // 2, (width + 1) // 2, 2), (uv_stride, 2, 1), uv_offset)
    return y, uv


def nv12_to_rgb(y, uv):
    """BT.601 limited range NV12 to RGB in [0, 1], shape (3, h, w), on Y's device."""
    h, w = y.shape
    yf = (y.float() - 16.0) * (255.0 / 219.0)
    chroma = uv.float() - 128.0
    chroma = chroma.repeat_interleave(2, 0).repeat_interleave(2, 1)[:h, :w]
    u, v = chroma[..., 0] * (255.0 / 224.0), chroma[..., 1] * (255.0 / 224.0)
    rgb = torch.stack((yf + 1.402 * v, yf - 0.344136 * u - 0.714136 * v, yf + 1.772 * u))
    return (rgb / 255.0).clamp_(0.0, 1.0)


def network(device):
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(8, 16, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 10),
    ).to(device).eval()


def video_size(caps):
    fmt, width, height = xmem._video_format(caps)
    if fmt != "NV12":
        sys.exit("infer.py: pool publishes %s, not NV12 (caps %s)" % (fmt, caps))
    return width, height


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pool")
    parser.add_argument("--frames", type=int, default=0, help="stop after this many frames (0: until EOS)")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the pool and each frame")
    args = parser.parse_args()

    consumer = xmem.open(args.pool, timeout=args.timeout)
    models = {}
    latencies, classes = [], []
    started = last_report = time.monotonic()
    count = reported = 0
    mean = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
    with torch.no_grad():
        while not args.frames or count < args.frames:
            try:
                frame = consumer.receive(timeout=args.timeout)
            except xmem.EndOfStream:
                break
            with frame:
                width, height = video_size(frame.meta.format)
                tensor = dlpack.from_dlpack(frame)  # the slot itself, on its device
                device = tensor.device
                if device not in models:
                    models[device] = network(device)
                y, uv = planes(frame, tensor, width, height)
                rgb = (nv12_to_rgb(y, uv) - mean.to(device)) / std.to(device)
                scores = models[device](rgb.unsqueeze(0))
                classes.append(int(scores.argmax()))
                del tensor, y, uv
            latencies.append((time.monotonic_ns() - frame.meta.timestamp) / 1e6)
            count += 1
            now = time.monotonic()
            if now - last_report >= 1.0:
                print("%6d frames  %6.1f fps  latency %.2f ms" % (
                    count, (count - reported) / (now - last_report), statistics.median(latencies[reported:])),
                    flush=True)
                last_report, reported = now, count
    elapsed = time.monotonic() - started
    if not count:
        sys.exit("infer.py: no frame received")
    latencies.sort()
    print("infer: %d frames of %dx%d on %s, %.1f fps, latency median %.2f ms, p99 %.2f ms, last class %d" % (
        count, width, height, ", ".join(str(d) for d in models), count / elapsed, statistics.median(latencies),
        latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))], classes[-1]))
    consumer.close()


if __name__ == "__main__":
    main()
