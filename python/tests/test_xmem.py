"""test_xmem.py - the Python module on system-memory pools: zero copy, lifetimes,
errors, iteration and polling, a gst-launch-1.0 producer in another process, and a
Python consumer SIGKILLed while it holds arrays."""

import gc
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid

import numpy
import pytest

import xmem


@pytest.fixture(autouse=True)
def runtime_dir(monkeypatch):
    """Pools of each test in a private directory (children inherit it)."""
    with tempfile.TemporaryDirectory(prefix="xmem-py-") as path:
        os.chmod(path, 0o700)
        monkeypatch.setenv("XDG_RUNTIME_DIR", path)
        yield path


def name():
    return "py-" + uuid.uuid4().hex[:8]


def eventually(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def slot_address(frame):
    return xmem.lib.xmem_buffer_data(frame._hold.buffer)


def test_numpy_array_is_the_slot_itself():
    pool = name()
    with xmem.create(pool, 64 * 48 * 4, slots=4, format="video/x-raw,format=RGBA,width=64,height=48") as p:
        with xmem.open(pool, timeout=5) as c:
            w = p.acquire(timeout=5)
            w.buffer[:] = bytes(range(256)) * 48
            p.publish(w)
            frame = c.receive(timeout=5)
            assert frame.meta.seq == 1 and frame.meta.size == 64 * 48 * 4
            assert frame.meta.format == "video/x-raw,format=RGBA,width=64,height=48"
            array = numpy.asarray(frame)
            assert array.ctypes.data == slot_address(frame), "the array is not the slot"
            assert not array.flags.writeable, "a shared frame must be read-only"
            assert bytes(array[:256]) == bytes(range(256))
            view = frame.data
            assert view.readonly and bytes(view[:4]) == b"\x00\x01\x02\x03"


def test_slot_returns_after_frame_and_arrays_are_gone():
    pool = name()
    with xmem.create(pool, 1024, slots=4) as p, xmem.open(pool, timeout=5) as c:
        p.publish(p.acquire(timeout=5), size=16)
        frame = c.receive(timeout=5)
        array = numpy.asarray(frame)
        frame.release()
        assert p.stats()["slots_free"] == 3, "released under a live array"
        del frame
        gc.collect()
        assert p.stats()["slots_free"] == 3, "released under a live array"
        del array
        gc.collect()
        assert eventually(lambda: p.stats()["slots_free"] == 4), "the slot never came back"

        p.publish(p.acquire(timeout=5), size=16)
        with c.receive(timeout=5) as frame:
            pass
        assert p.stats()["slots_free"] == 4, "with frame: did not give the slot back"
        with pytest.raises(ValueError, match="released"):
            frame.data
        with pytest.raises(ValueError, match="released"):
            numpy.asarray(frame)


def test_timeout_end_of_stream_and_closed():
    pool = name()
    p = xmem.create(pool, 256, slots=2)
    c = xmem.open(pool, timeout=5)
    started = time.monotonic()
    with pytest.raises(xmem.Timeout, match="XMEM_ETIMEDOUT"):
        c.receive(timeout=0.05)
    assert time.monotonic() - started >= 0.04
    p.publish(p.acquire(timeout=5), size=1)
    p.end_of_stream()
    assert c.receive(timeout=5).meta.seq == 1
    with pytest.raises(xmem.EndOfStream):
        c.receive(timeout=5)
    p.close()
    with pytest.raises(xmem.Closed):
        c.receive(timeout=5)
    c.close()
    with pytest.raises(xmem.Closed, match="closed"):
        c.receive(timeout=0)


def test_iteration_ends_at_end_of_stream_and_fileno_polls():
    pool = name()
    with xmem.create(pool, 64, slots=8) as p, xmem.open(pool, timeout=5, queue_size=8) as c:
        assert select.select([c.fileno()], [], [], 0.05)[0] == [], "readable with nothing queued"
        for i in range(5):
            w = p.acquire(timeout=5)
            w.buffer[0] = i
            p.publish(w, size=1, pts=i * 1000)
        assert select.select([c.fileno()], [], [], 5)[0] == [c.fileno()]
        p.end_of_stream()
        got = [(f.meta.seq, f.data[0], f.meta.pts) for f in c]
        assert got == [(i + 1, i, i * 1000) for i in range(5)]


def test_bad_input_raises_with_the_cause():
    with pytest.raises(xmem.Error, match="XMEM_ENOENT"):
        xmem.open(name(), timeout=0)
    with pytest.raises(xmem.Error, match="XMEM_ENAME"):
        xmem.open("bad\nname", timeout=0)
    with pytest.raises(TypeError):
        xmem.open(None)
    with pytest.raises(ValueError, match="policy"):
        xmem.create(name(), 64, policy="sometimes")
    with pytest.raises(ValueError, match="storage"):
        xmem.create(name(), 64, storage="disk")
    with pytest.raises(xmem.Error, match="XMEM_EINVAL"):
        xmem.create(name(), 0)
    with pytest.raises(ValueError, match="timeout"):
        xmem.open(name(), timeout=-1)
    pool = name()
    with xmem.create(pool, 64) as p:
        with pytest.raises(xmem.Error, match="XMEM_EBUSY"):
            xmem.create(pool, 64)
        with pytest.raises(TypeError, match="acquire"):
            p.publish(object())
        w = p.acquire(timeout=5)
        p.publish(w)
        with pytest.raises(ValueError, match="already published"):
            p.publish(w)
        with pytest.raises(xmem.Error, match="XMEM_EROLE"):
            xmem.Consumer.receive(p)


def gst_launch():
    path = shutil.which("gst-launch-1.0")
    if not path or not os.environ.get("GST_PLUGIN_PATH"):
        pytest.skip("gst-launch-1.0 or the plugin (GST_PLUGIN_PATH) is missing")
    return path


def test_frames_from_a_gst_launch_producer_are_bit_exact(tmp_path):
    launch = gst_launch()
    caps = "video/x-raw,format=RGBA,width=64,height=48,framerate=30/1"
    reference = tmp_path / "reference.raw"
    subprocess.run([launch, "-q", "videotestsrc", "num-buffers=10", "pattern=ball", "!", caps, "!", "filesink",
                    "location=" + str(reference)], check=True, timeout=60)
    expected = reference.read_bytes()
    size = 64 * 48 * 4
    assert len(expected) == 10 * size
    pool = name()
    producer = subprocess.Popen([launch, "-q", "videotestsrc", "num-buffers=10", "pattern=ball", "!", caps, "!",
                                 "xmemsink", "pool-name=" + pool, "wait-for-consumers=1", "policy=block",
                                 "block-timeout=30000000000"])
    try:
        seqs = []
        with xmem.open(pool, timeout=30) as c:
            # Checked as they come: holding them all would hold every slot.
            for i, f in enumerate(c):
                seqs.append(f.meta.seq)
                assert f.meta.format.startswith("video/x-raw, format=(string)RGBA, width=(int)64, height=(int)48")
                assert f.meta.pts == i * 1000000000 // 30
                pixels = numpy.asarray(f)
                assert pixels.shape == (48, 64, 4), pixels.shape
                assert pixels.tobytes() == expected[i * size:(i + 1) * size], "frame %d differs" % i
        assert seqs == list(range(1, 11))
        assert producer.wait(timeout=60) == 0
    finally:
        producer.kill()


def test_consumer_killed_holding_arrays_gives_every_slot_back():
    pool = name()
    with xmem.create(pool, 4096, slots=6, policy="drop-oldest") as p:
        child = textwrap.dedent("""
            import sys, time, numpy, xmem
            c = xmem.open(sys.argv[1], timeout=10, queue_size=2)
            held = [numpy.asarray(c.receive(timeout=10)) for _ in range(3)]
            print("holding", len(held), flush=True)
            time.sleep(60)
        """)
        proc = subprocess.Popen([sys.executable, "-c", child, pool], stdout=subprocess.PIPE, text=True)
        try:
            assert eventually(lambda: p.stats()["consumers"] == 1), "the child never attached"
            for _ in range(3):
                p.publish(p.acquire(timeout=5), size=8)
            assert proc.stdout.readline().strip() == "holding 3"
            assert p.stats()["slots_free"] == 3
            proc.send_signal(signal.SIGKILL)
            assert proc.wait(timeout=10) == -signal.SIGKILL
            assert eventually(lambda: p.stats()["consumers"] == 0), "the dead consumer stays"
            assert eventually(lambda: p.stats()["slots_free"] == 6), "slots held by the dead consumer"
            assert p.stats()["reaped"] == 1
        finally:
            proc.kill()
