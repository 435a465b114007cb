#!/usr/bin/env python3
"""python.py [--json] [--frames N] [--fps F] [--width W --height H] [--pairs P,...] - what a
Python inference process pays to get another process's frames as torch tensors.

Pairs (each one measurement record; --pairs picks some, default all):
  xmem-gst     unthrottled: a gst-launch-1.0 producer (videotestsrc ! xmemsink) in another
               process; here receive() + torch.utils.dlpack.from_dlpack(frame) + release
  appsink      unthrottled: the same videotestsrc in this process through gi, appsink, then
               map + numpy copy + torch.from_numpy: what a Python app does without xmem
  xmem         paced at --fps: a Python producer process writes each frame into a slot
               (tensor.copy_ through DLPack) and publishes it; a Python consumer process
               receives it as a tensor (from_dlpack) and reads it
  torch-mp     paced at --fps, the same frames: the producer clones its source tensor
               and puts it on a torch.multiprocessing queue (shared memory for CPU
               tensors, CUDA IPC for device ones); the consumer gets the tensor and reads it
The paced pairs run on the CPU and, where torch sees a GPU, on the GPU (device cuda:
xmem's pool is a CUDA pool); without one the GPU records say unavailable.

Figures: receive_p50_us/p99: the consumer's own time from the frame (or sample) in hand to
the tensor ready and read and the frame let go (waiting for the producer is not in it);
p50_us/p99_us/max_us (paced pairs): latency from the producer's stamp, taken right before
the hand-off (publish(), queue.put()), to the tensor read in the consumer; CPU µs per frame
of each process (getrusage; torch-mp's producer includes its queue's feeder thread); fps.
With --json one JSON object per line per measurement (bench/run.sh's python suite),
otherwise one object with all of them. Run from the repository root after a build
(bench/python.sh sets the environment up)."""

import argparse
import json
import multiprocessing
import os
import queue
import resource
import statistics
import subprocess
import sys
import tempfile
import time

PAIRS = ("xmem-gst", "appsink", "xmem", "torch-mp")
WARMUP = 30


def cpu_us():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return (r.ru_utime + r.ru_stime) * 1e6


def percentile(sorted_samples, q):
    return sorted_samples[min(len(sorted_samples) - 1, int(len(sorted_samples) * q))]


def figures(prefix, samples_ns):
    """p50/p99/max in µs of SAMPLES_NS, keys prefixed with PREFIX."""
    s = sorted(samples_ns)
    if not s:
        return {}
    return {prefix + "p50_us": round(statistics.median(s) / 1000, 1),
            prefix + "p99_us": round(percentile(s, 0.99) / 1000, 1),
            prefix + "max_us": round(s[-1] / 1000, 1)}


def caps(args, rate="1000/1"):
    return "video/x-raw,format=NV12,width=%d,height=%d,framerate=%s" % (args.width, args.height, rate)


def frame_bytes(args):
    return args.width * args.height * 3 // 2


def record(args, pair, mode, device="cpu", **fields):
    r = {"pair": pair, "mode": mode, "device": device, "size": "%dx%d" % (args.width, args.height),
         "format": "NV12", "consumers": 1, "frame_bytes": frame_bytes(args), "available": True, "ok": True}
    r.update(fields)
    return r


# --- unthrottled, CPU: xmem-gst and appsink ---------------------------------------------

def run_xmem_gst(args):
    import torch  # noqa: F401 - loaded before the clock starts
    from torch.utils import dlpack

    import xmem

    pool = "bench-python-%d" % os.getpid()
    command = ["gst-launch-1.0", "-q", "videotestsrc", "num-buffers=%d" % (args.frames + WARMUP),
               "pattern=solid-color", "!", caps(args), "!", "xmemsink", "pool-name=" + pool,
               "wait-for-consumers=1", "policy=block", "block-timeout=10000000000"]
    producer = subprocess.Popen(command)
    samples, start, frames = [], None, 0
    before = None
    with xmem.open(pool, timeout=30, queue_size=4) as consumer:
        while True:
            try:
                frame = consumer.receive(timeout=30)
            except xmem.EndOfStream:
                break
            t0 = time.perf_counter_ns()
            tensor = dlpack.from_dlpack(frame)
            int(tensor[0])  # read it, as a consumer would
            del tensor
            frame.release()
            frames += 1
            if frames == WARMUP:
                start, before = time.monotonic(), cpu_us()
            elif frames > WARMUP:
                samples.append(time.perf_counter_ns() - t0)
    seconds = time.monotonic() - start
    used = cpu_us() - before
    status = producer.wait(timeout=60)
    return record(args, "xmem-gst", "unthrottled", frames=len(samples), fps=round(len(samples) / seconds, 1),
                  consumer_cpu_us_per_frame=round(used / len(samples), 1), ok=status == 0 and len(samples) > 0,
                  command=" ".join(command) + " | bench/python.py", **figures("receive_", samples))


def run_appsink(args):
    import gi
    import numpy
    import torch

    gi.require_version("Gst", "1.0")
    gi.require_version("GstApp", "1.0")
    from gi.repository import Gst, GstApp  # noqa: F401

    Gst.init(None)
    launch = ("videotestsrc num-buffers=%d pattern=solid-color ! %s ! appsink name=sink sync=false max-buffers=4"
              % (args.frames + WARMUP, caps(args)))
    pipeline = Gst.parse_launch(launch)
    sink = pipeline.get_by_name("sink")
    pipeline.set_state(Gst.State.PLAYING)
    samples, start, frames, before = [], None, 0, None
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
        int(tensor[0])
        del tensor, array, sample, buffer
        frames += 1
        if frames == WARMUP:
            start, before = time.monotonic(), cpu_us()
        elif frames > WARMUP:
            samples.append(time.perf_counter_ns() - t0)
    seconds = time.monotonic() - start
    used = cpu_us() - before
    pipeline.set_state(Gst.State.NULL)
    # One process: its CPU is the producer's and the consumer's together.
    return record(args, "appsink", "unthrottled", frames=len(samples), fps=round(len(samples) / seconds, 1),
                  consumer_cpu_us_per_frame=round(used / len(samples), 1), ok=len(samples) > 0,
                  command="gst-launch-1.0 " + launch + " (in process, through gi)", **figures("receive_", samples))


# --- paced, CPU or GPU: xmem and torch-mp ------------------------------------------------
# Each side is a spawned process (CUDA cannot be used across fork()). The producer fills
# every frame from one source tensor with the frame number in its first byte, so that the
# consumer checks that it got each frame, in order, with its own content.

def _source(n, device):
    import torch

    return (torch.arange(n, dtype=torch.int64) % 251).to(torch.uint8).to(device)


def _pace(start, i, fps):
    delay = start + i / fps - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def _sync(device):
    if device != "cpu":
        import torch

        torch.cuda.current_stream().synchronize()


def xmem_producer(name, n, frames, fps, device, ready, result):
    import torch

    import xmem

    storage = "system" if device == "cpu" else "cuda"
    src = _source(n, device)
    stream = torch.cuda.current_stream() if device != "cpu" else None
    with xmem.create(name, n, slots=8, policy="block", storage=storage) as producer:
        ready.set()
        while producer.stats()["consumers"] == 0:
            time.sleep(0.01)
        start, before = time.monotonic(), None
        for i in range(frames):
            if i == WARMUP:
                before = cpu_us()
            _pace(start, i, fps)
            slot = producer.acquire(timeout=10, stream=stream)
            dst = torch.from_dlpack(slot)
            dst.copy_(src)
            dst[0] = i % 256
            del dst
            producer.publish(slot, size=n, pts=time.monotonic_ns(), stream=stream)
        used = cpu_us() - before
        producer.end_of_stream()
        # The consumer detaches at end of stream; the pool is closed after it.
        deadline = time.monotonic() + 30
        while producer.stats()["consumers"] and time.monotonic() < deadline:
            time.sleep(0.01)
    result.put({"producer_cpu_us_per_frame": round(used / (frames - WARMUP), 1)})


def xmem_consumer(name, device, ready, result):
    import torch

    import xmem

    ready.wait(60)
    latency, receive, bad, frames, before, first_ns, last_ns = [], [], 0, 0, None, 0, 1
    with xmem.open(name, timeout=30) as consumer:
        while True:
            try:
                frame = consumer.receive(timeout=30)
            except xmem.EndOfStream:
                break
            t0 = time.perf_counter_ns()
            tensor = torch.from_dlpack(frame)
            first = int(tensor[0])  # a read: on a GPU, a kernel and a wait for it
            done = time.monotonic_ns()
            del tensor
            stamp = frame.meta.pts
            frame.release()
            bad += first != frames % 256
            frames += 1
            if frames == WARMUP:
                before, first_ns = cpu_us(), done
            elif frames > WARMUP:
                receive.append(time.perf_counter_ns() - t0)
                latency.append(done - stamp)
                last_ns = done
    result.put({"consumer_cpu_us_per_frame": round((cpu_us() - before) / max(1, len(receive)), 1),
                "fps": round(len(receive) * 1e9 / (last_ns - first_ns), 1),
                "latency": latency, "receive": receive, "bad": bad, "received": frames})


def _sharing():
    # file_system: CPU tensors travel as names of shared-memory files. The default,
    # file_descriptor, passes each fd through the producer's resource_sharer thread,
    # which lost frames here once the producer had put its last one.
    import torch.multiprocessing as tmp

    tmp.set_sharing_strategy("file_system")


def torch_producer(n, frames, fps, device, channel, started, ready, result):
    _sharing()
    src = _source(n, device)
    started.wait(60)  # the consumer is ready to take frames, as xmem's producer waits for one
    start, before = time.monotonic(), None
    for i in range(frames):
        if i == WARMUP:
            before = cpu_us()
        _pace(start, i, fps)
        frame = src.clone()
        frame[0] = i % 256
        _sync(device)  # the frame is written before it is announced, as publish() has it
        channel.put((i, time.monotonic_ns(), frame))
        del frame
    channel.put(None)
    used = cpu_us() - before
    result.put({"producer_cpu_us_per_frame": round(used / (frames - WARMUP), 1)})
    # CUDA IPC: the producer must outlive the consumer's use of its tensors.
    ready.wait(60)


def torch_consumer(device, channel, started, ready, result):
    import torch  # noqa: F401 - before the producer starts

    _sharing()
    started.set()
    latency, receive, bad, frames, before, first_ns, last_ns = [], [], 0, 0, None, 0, 1
    while True:
        item = channel.get(timeout=60)
        if item is None:
            break
        i, stamp, tensor = item
        # The tensor was made inside get(); from the item in hand, the read.
        t0 = time.perf_counter_ns()
        first = int(tensor[0])
        done = time.monotonic_ns()
        del tensor, item
        bad += first != i % 256 or i != frames
        frames += 1
        if frames == WARMUP:
            before, first_ns = cpu_us(), done
        elif frames > WARMUP:
            receive.append(time.perf_counter_ns() - t0)
            latency.append(done - stamp)
            last_ns = done
    result.put({"consumer_cpu_us_per_frame": round((cpu_us() - before) / max(1, len(receive)), 1),
                "fps": round(len(receive) * 1e9 / (last_ns - first_ns), 1),
                "latency": latency, "receive": receive, "bad": bad, "received": frames})
    ready.set()


def run_paced(args, pair, device):
    ctx = multiprocessing.get_context("spawn")
    n, total = frame_bytes(args), args.frames + WARMUP
    produced, consumed = ctx.Queue(), ctx.Queue()
    if pair == "xmem":
        name = "bench-python-%s-%d" % (device, os.getpid())
        ready = ctx.Event()
        producer = ctx.Process(target=xmem_producer, args=(name, n, total, args.fps, device, ready, produced))
        consumer = ctx.Process(target=xmem_consumer, args=(name, device, ready, consumed))
        command = "bench/python.py --pairs xmem (xmem.create(storage=%s) → xmem.open)" % (
            "system" if device == "cpu" else "cuda")
    else:
        import torch.multiprocessing as tmp

        tctx = tmp.get_context("spawn")
        _sharing()
        channel, started, ready = tctx.Queue(maxsize=4), tctx.Event(), tctx.Event()
        producer = tctx.Process(target=torch_producer,
                                args=(n, total, args.fps, device, channel, started, ready, produced))
        consumer = tctx.Process(target=torch_consumer, args=(device, channel, started, ready, consumed))
        command = "bench/python.py --pairs torch-mp (torch.multiprocessing queue, %s tensors, sharing %s)" % (
            device, tmp.get_sharing_strategy())
    consumer.start()
    producer.start()
    limit = total / args.fps + 120
    try:
        got = consumed.get(timeout=limit)
        made = produced.get(timeout=60)
    except queue.Empty:
        for p in (producer, consumer):
            p.kill()
        return record(args, pair, "paced", device, ok=False, command=command,
                      error="no result within %d s (producer exit %s, consumer exit %s)"
                      % (limit, producer.exitcode, consumer.exitcode))
    for p in (consumer, producer):
        p.join(60)
    ok = producer.exitcode == 0 and consumer.exitcode == 0 and got["bad"] == 0 and got["received"] == total
    r = record(args, pair, "paced", device, frames=len(got["latency"]), fps_target=args.fps,
               fps=got["fps"], consumer_cpu_us_per_frame=got["consumer_cpu_us_per_frame"],
               producer_cpu_us_per_frame=made["producer_cpu_us_per_frame"], ok=ok, command=command,
               **figures("", got["latency"]), **figures("receive_", got["receive"]))
    r["cpu_us_per_frame"] = round(r["consumer_cpu_us_per_frame"] + r["producer_cpu_us_per_frame"], 1)
    if not ok:
        r["error"] = "%d of %d frames wrong or missing (exit %s, %s)" % (
            got["bad"] + total - got["received"], total, producer.exitcode, consumer.exitcode)
    return r


def devices():
    import torch

    if torch.cuda.is_available():
        return ["cpu", "cuda"], None
    return ["cpu"], "no CUDA device for torch (torch %s, torch.cuda.is_available() is false)" % torch.__version__


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=600)
    parser.add_argument("--fps", type=float, default=60)
    parser.add_argument("--width", type=int, default=1920)
    parser.add_argument("--height", type=int, default=1080)
    parser.add_argument("--pairs", default=",".join(PAIRS))
    parser.add_argument("--json", action="store_true", help="one JSON object per line per measurement")
    args = parser.parse_args()
    pairs = args.pairs.split(",")
    for p in pairs:
        if p not in PAIRS:
            parser.error("unknown pair %r (pairs: %s)" % (p, ", ".join(PAIRS)))
    if not os.environ.get("XDG_RUNTIME_DIR"):
        os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="xmem-bench-")
    records = []

    def emit(r):
        records.append(r)
        if args.json:
            print(json.dumps(r, ensure_ascii=False), flush=True)

    if "xmem-gst" in pairs:
        emit(run_xmem_gst(args))
    if "appsink" in pairs:
        emit(run_appsink(args))
    have, why = devices()
    for device in ("cpu", "cuda"):
        for pair in ("xmem", "torch-mp"):
            if pair not in pairs:
                continue
            if device in have:
                emit(run_paced(args, pair, device))
            else:
                emit(record(args, pair, "paced", device, available=False, ok=True, error=why))
    if not args.json:
        print(json.dumps(records, indent=1, ensure_ascii=False))
    return 0 if all(r["ok"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
