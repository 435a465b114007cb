#!/usr/bin/env python3
"""python.py [--frames N] [--width W --height H] - what a Python inference process pays
per frame to get a frame as a torch tensor (CPU), two ways, on the same frames:

  xmem     a gst-launch-1.0 producer (videotestsrc ! xmemsink) in another process;
           here receive() + torch.utils.dlpack.from_dlpack(frame) + release: no copy
  appsink  the same videotestsrc in this process (GStreamer through gi), appsink,
           then map + numpy copy + torch.from_numpy: what a Python app does without xmem

Per-frame figures are the consumer's own time from the frame (or sample) in hand to
the tensor ready and the frame let go (median and p99, in microseconds: waiting for the
producer is not in them), and the whole run's frames per second; one JSON object at the end, with
the ratios. GPU comparisons (torch.multiprocessing CUDA tensors) need a GPU and are not
here. Run from the repository root after a build (bench/python.sh sets it up)."""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy
import torch
from torch.utils import dlpack

import xmem


def summary(samples_ns, frames, seconds):
    samples = sorted(samples_ns)
    return {
        "frames": frames,
        "fps": round(frames / seconds, 1),
        "median_us": round(statistics.median(samples) / 1000, 1),
        "p99_us": round(samples[min(len(samples) - 1, int(len(samples) * 0.99))] / 1000, 1),
    }


def caps(args):
    return "video/x-raw,format=NV12,width=%d,height=%d,framerate=1000/1" % (args.width, args.height)


def run_xmem(args):
    pool = "bench-python-%d" % os.getpid()
    producer = subprocess.Popen(["gst-launch-1.0", "-q", "videotestsrc", "num-buffers=%d" % args.frames,
                                 "pattern=solid-color", "!", caps(args), "!", "xmemsink", "pool-name=" + pool,
                                 "wait-for-consumers=1", "policy=block", "block-timeout=10000000000"])
    samples = []
    with xmem.open(pool, timeout=30, queue_size=4) as consumer:
        start = None
        while True:
            try:
                frame = consumer.receive(timeout=30)
            except xmem.EndOfStream:
                break
            t0 = time.perf_counter_ns()
            tensor = dlpack.from_dlpack(frame)
            frame.release()
            checksum = int(tensor[0])  # touch it, as a consumer would
            del tensor
            samples.append(time.perf_counter_ns() - t0)
            start = start or time.monotonic()
    seconds = time.monotonic() - start
    if producer.wait(timeout=60) != 0:
        sys.exit("python.py: the gst-launch-1.0 producer failed")
    del checksum
    return summary(samples[1:], len(samples), seconds)


def run_appsink(args):
    import gi

    gi.require_version("Gst", "1.0")
    gi.require_version("GstApp", "1.0")
    from gi.repository import Gst, GstApp  # noqa: F401

    Gst.init(None)
    pipeline = Gst.parse_launch("videotestsrc num-buffers=%d pattern=solid-color ! %s ! appsink name=sink "
                                "sync=false max-buffers=4" % (args.frames, caps(args)))
    sink = pipeline.get_by_name("sink")
    pipeline.set_state(Gst.State.PLAYING)
    samples = []
    start = None
    while True:
        sample = sink.emit("try-pull-sample", 10 * Gst.SECOND)
        if sample is None:
            break
        t0 = time.perf_counter_ns()
        buffer = sample.get_buffer()
        ok, info = buffer.map(Gst.MapFlags.READ)
        array = numpy.frombuffer(info.data, numpy.uint8).copy()
        buffer.unmap(info)
        tensor = torch.from_numpy(array)
        checksum = int(tensor[0])
        del tensor, sample, buffer
        samples.append(time.perf_counter_ns() - t0)
        start = start or time.monotonic()
    seconds = time.monotonic() - start
    pipeline.set_state(Gst.State.NULL)
    del checksum
    return summary(samples[1:], len(samples), seconds)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=600)
    parser.add_argument("--width", type=int, default=1920)
    parser.add_argument("--height", type=int, default=1080)
    args = parser.parse_args()
    os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.mkdtemp(prefix="xmem-bench-"))
    result = {
        "machine": os.uname().nodename,
        "cpus": os.cpu_count(),
        "frame": "%dx%d NV12" % (args.width, args.height),
        "xmem": run_xmem(args),
        "appsink": run_appsink(args),
    }
    result["ratio_median_us"] = round(result["xmem"]["median_us"] / result["appsink"]["median_us"], 3)
    result["ratio_fps"] = round(result["xmem"]["fps"] / result["appsink"]["fps"], 3)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
