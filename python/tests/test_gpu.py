"""test_gpu.py - device pools with the real CUDA driver and the frameworks users bring:
a PyTorch producer in another process writing each frame on its own stream, and CuPy
and PyTorch consumers reading the slots in place on theirs; a consumer holding device
frames killed with SIGKILL. Skipped where there is no GPU (or where the CUDA
simulator is loaded: it proves xmem's logic, these prove the driver's)."""

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

import xmem

FRAMES = 240
SIZE = 1920 * 1080 * 3 // 2  # one 1080p NV12 frame


def real_gpu():
    if "cudasim" in os.environ.get("XMEM_CUDA_DRIVER", ""):
        pytest.skip("the CUDA simulator is loaded: these tests are for the real driver")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return torch


# The producer: frame n is (i + n) % 256 over its bytes, written by a kernel on the
# producer's own stream and published on it, so nobody waits on the CPU.
PRODUCER = textwrap.dedent("""
    import sys, time, torch, xmem
    pool, frames, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    stream = torch.cuda.Stream()
    ramp = torch.arange(size, device="cuda", dtype=torch.int64)
    with xmem.create(pool, size, slots=4, storage="cuda", policy="block") as p:
        print("ready", flush=True)
        sys.stdin.readline()  # the consumer is attached
        started = time.monotonic()
        for n in range(1, frames + 1):
            try:
                w = p.acquire(timeout=60, stream=stream)
            except xmem.Error as e:
                print("producer: frame %d, %.1f s after the start: %s; %s" % (n, time.monotonic() - started, e,
                      p.stats()), file=sys.stderr, flush=True)
                raise
            with torch.cuda.stream(stream):
                slot = torch.from_dlpack(w)
                slot.copy_((ramp + n) % 256)
            p.publish(w, size=size, stream=stream)
            del slot, w
        p.end_of_stream()
        torch.cuda.synchronize()
        print("done", flush=True)
""")


def with_progress(iterable, got, consumer):
    """ITERABLE; when it raises, how far the consumer got is printed first (pytest shows
    it with the failure)."""
    iterator = iter(iterable)
    while True:
        try:
            item = next(iterator)
        except StopIteration:
            return
        except BaseException:
            print("consumer: %d frames, %s" % (len(got), consumer.consumer_stats()))
            raise
        yield item


def start_producer(pool, frames=FRAMES, size=SIZE):
    producer = subprocess.Popen([sys.executable, "-c", PRODUCER, pool, str(frames), str(size)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert producer.stdout.readline().strip() == "ready"
    return producer


def test_a_torch_producer_reaches_cupy_and_torch_consumers_in_place_on_a_gpu():
    torch = real_gpu()
    cupy = pytest.importorskip("cupy")
    pool = "gpu-" + uuid.uuid4().hex[:8]
    producer = start_producer(pool)
    try:
        with xmem.open(pool, timeout=30, queue_size=4, policy="fifo") as c:
            assert c.storage == "cuda"
            cupy_stream = cupy.cuda.Stream(non_blocking=True)
            ramp = torch.arange(SIZE, device="cuda", dtype=torch.int64)
            # CuPy compiles each kernel on first use (seconds on a fresh machine): once
            # here, before the producer starts, so the stream of frames never waits on it.
            with cupy_stream:
                cupy.array_equal(cupy.zeros(SIZE, cupy.uint8),
                                 ((cupy.arange(SIZE, dtype=cupy.int64) + 1) % 256).astype(cupy.uint8))
            torch.equal(ramp.to(torch.uint8), ((ramp + 1) % 256).to(torch.uint8))
            torch.cuda.synchronize()
            producer.stdin.write("go\n")
            producer.stdin.flush()
            seqs, wrong = [], []
            for n, frame in with_progress(enumerate(c, start=1), seqs, c):
                seqs.append(frame.meta.seq)
                address = frame.__cuda_array_interface__["data"][0]
                if n % 2:
                    # CuPy on its own stream: the stream waited for the producer's kernel.
                    with cupy_stream:
                        array = cupy.asarray(frame)
                        assert array.data.ptr == address, "CuPy's array is not the slot"
                        expected = (cupy.arange(SIZE, dtype=cupy.int64) + n) % 256
                        ok = bool(cupy.array_equal(array, expected.astype(cupy.uint8)))
                    del array
                else:
                    tensor = torch.from_dlpack(frame)
                    assert tensor.data_ptr() == address, "the tensor is not the slot"
                    ok = bool(torch.equal(tensor, ((ramp + n) % 256).to(torch.uint8)))
                    del tensor
                if not ok:
                    wrong.append(n)
                del frame
            assert producer.wait(timeout=60) == 0
            assert producer.stdout.read().strip() == "done"
        assert not wrong, "frames read before the producer's writes landed: %s" % wrong[:10]
        assert len(seqs) == FRAMES and seqs == list(range(seqs[0], seqs[0] + FRAMES)), seqs[:10]
    finally:
        producer.kill()


def test_received_on_a_torch_stream_the_reads_are_ordered_without_a_cpu_wait_on_a_gpu():
    """receive(stream=s): s waits on the GPU for the producer's writes; work queued on s
    reads the whole frame, and the slot goes back on s (the producer's next write to it
    waits for that work)."""
    torch = real_gpu()
    pool = "gpu-" + uuid.uuid4().hex[:8]
    producer = start_producer(pool)
    try:
        with xmem.open(pool, timeout=30, queue_size=4, policy="fifo") as c:
            producer.stdin.write("go\n")
            producer.stdin.flush()
            stream = torch.cuda.Stream()
            ramp = torch.arange(SIZE, device="cuda", dtype=torch.int64)
            results = []
            received = (c.receive(timeout=30, stream=stream) for _ in range(FRAMES))
            for n, frame in with_progress(enumerate(received, start=1), results, c):
                assert frame.__cuda_array_interface__["stream"] == stream.cuda_stream
                with torch.cuda.stream(stream):
                    tensor = torch.from_dlpack(frame.__dlpack__(stream=stream.cuda_stream))
                    results.append(torch.equal(tensor, ((ramp + n) % 256).to(torch.uint8)))
                del tensor, frame
            stream.synchronize()
            assert producer.wait(timeout=60) == 0
        assert all(results), [n for n, r in enumerate(results, 1) if not r][:10]
    finally:
        producer.kill()


CONSUMER = textwrap.dedent("""
    import sys, time, torch, xmem
    with xmem.open(sys.argv[1], timeout=30, queue_size=4) as c:
        held = [torch.from_dlpack(c.receive(timeout=30)) for _ in range(3)]
        torch.cuda.synchronize()
        print("holding", flush=True)
        time.sleep(60)
""")


def test_a_consumer_killed_holding_device_frames_gives_its_slots_back_on_a_gpu():
    torch = real_gpu()
    pool = "gpu-" + uuid.uuid4().hex[:8]
    with xmem.create(pool, SIZE, slots=4, storage="cuda", policy="block") as p:
        consumer = subprocess.Popen([sys.executable, "-c", CONSUMER, pool], stdout=subprocess.PIPE, text=True)
        try:
            stream = torch.cuda.Stream()
            # Wait until it is attached, then give it three frames to hold.
            deadline = time.monotonic() + 30
            while p.stats()["consumers"] == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert p.stats()["consumers"] == 1
            for n in range(3):
                w = p.acquire(timeout=10, stream=stream)
                with torch.cuda.stream(stream):
                    torch.from_dlpack(w).fill_(n)
                p.publish(w, stream=stream)
            assert consumer.stdout.readline().strip() == "holding"
            consumer.send_signal(signal.SIGKILL)
            consumer.wait(timeout=10)
            # Every slot comes back: four acquired at once.
            frames = [p.acquire(timeout=10) for _ in range(4)]
            assert len(frames) == 4
            for w in frames:
                w.release()
        finally:
            consumer.kill()


def test_stalled_recorders_of_a_device_pool_get_every_frame_from_the_spill_tier_on_a_gpu():
    """Two fifo-spill recorders that read nothing while 24 frames go through 4 device
    slots: the producer never waits; the frames queued only for them move into the
    page-locked spill tier on the owner's stream; later one recorder gets each as a
    device frame (its own copy, read with torch), the other as host memory."""
    torch = real_gpu()
    pool = "gpu-" + uuid.uuid4().hex[:8]
    size, frames = 1 << 16, 24
    with xmem.create(pool, size, slots=4, storage="cuda", spill_bytes=frames * size) as p:
        with xmem.open(pool, timeout=5, policy="fifo-spill") as device, \
                xmem.open(pool, timeout=5, policy="fifo-spill", spill_delivery="host") as host:
            stream = torch.cuda.Stream()
            for n in range(1, frames + 1):
                w = p.acquire(timeout=2, stream=stream)
                with torch.cuda.stream(stream):
                    torch.from_dlpack(w).fill_(n)
                p.publish(w, size=size, stream=stream)
            assert p.spill_stats()["spilled"] >= frames - 4
            for recorder, where in ((device, "cuda"), (host, "system")):
                spilled = 0
                for n in range(1, frames + 1):
                    f = recorder.receive(timeout=10)
                    assert f.meta.seq == n
                    if f.spilled:
                        spilled += 1
                        assert f.meta.storage == where
                    if f.meta.storage == "cuda":
                        values = torch.from_dlpack(f).cpu()
                    else:
                        values = torch.frombuffer(bytearray(f.data), dtype=torch.uint8)
                    assert int(values.min()) == n and int(values.max()) == n, (n, f.spilled)
                    del f, values
                assert spilled >= frames - 4
                assert recorder.consumer_stats()["dropped"] == 0
