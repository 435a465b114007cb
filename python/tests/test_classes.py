"""test_classes.py - size classes from Python (issue 19): a class added with a consumer
attached, acquire(size=...) taking the smallest class that fits, frames of every class
received byte for byte with their dtype, the class table seen by both sides, and the
refusals (a device for system memory, past max_slots, a size no class holds); a pool of
system memory taking a class of CUDA memory (on the driver simulator, as the suite runs),
and a consumer process without CUDA attached to such a pool."""

import os
import subprocess
import sys
import textwrap
import time
import uuid

import numpy
import pytest

import xmem


def name():
    return "py-" + uuid.uuid4().hex[:8]


def test_a_class_added_while_attached_carries_larger_frames():
    pool = name()
    with xmem.create(pool, 4096, slots=2, max_slots=6) as p, xmem.open(pool, timeout=5) as c:
        assert [k["slot_size"] for k in c.classes()] == [4096]
        assert p.preallocate(1 << 20, 2) == 1
        assert p.classes() == c.classes()
        assert p.classes()[1] == {"index": 1, "storage": "system", "device": 0, "slot_size": 1 << 20,
                                  "first_slot": 2, "count": 2, "gpu_ordering": "none", "dynamic": False}
        for value, shape in ((1.5, (4, 8)), (2.5, (512, 256)), (3.5, (8, 8))):
            data = numpy.full(shape, value, numpy.float32)
            frame = p.acquire(timeout=5, size=data.nbytes)
            index = xmem.lib.xmem_buffer_meta(frame._raw).contents.index
            assert (index >= 2) == (data.nbytes > 4096)
            frame.buffer[:data.nbytes] = data.tobytes()
            p.publish(frame, dtype="float32", shape=shape)
            got = c.receive(timeout=5)
            assert numpy.array_equal(numpy.asarray(got), data)
            got.release()
        with pytest.raises(xmem.Error) as e:
            p.acquire(timeout=0, size=(1 << 20) + 1)
        assert e.value.status == xmem._capi.ERANGE
        with pytest.raises(xmem.Error, match="room for 2 more slots"):
            p.preallocate(4096, 3)
        with pytest.raises(xmem.Error, match="only for CUDA storage"):
            p.preallocate(4096, 1, storage="system", device=1)
        with pytest.raises(ValueError):
            p.preallocate(4096, 1, storage="disk")


@pytest.mark.skipif(not os.environ.get("XMEM_CUDA_DRIVER"), reason="no CUDA driver (simulated or real) configured")
def test_a_system_pool_takes_a_class_of_cuda_memory():
    pool = name()
    with xmem.create(pool, 4096, slots=2) as p, xmem.open(pool, timeout=5) as c:
        assert p.preallocate(1 << 16, 2, storage="cuda", device=0) == 1
        assert [k["storage"] for k in c.classes()] == ["system", "cuda"]
        assert c.classes()[1]["gpu_ordering"] == "stream-memops"
        with pytest.raises(xmem.Error) as e:
            p.acquire(timeout=0, size=1 << 16)  # the first class's memory: no such slot
        assert e.value.status == xmem._capi.ERANGE
        with pytest.raises(ValueError):
            p.acquire(timeout=0, size=16, storage="disk")
        for storage in ("cuda", "system", "cuda"):
            frame = p.acquire(timeout=5, size=256, storage=storage)
            assert frame.storage == storage
            if storage == "system":
                frame.buffer[:4] = b"host"
            p.publish(frame, size=256)
            got = c.receive(timeout=5)
            assert got.meta.storage == storage
            if storage == "cuda":
                assert got.cuda_ptr != 0
                with pytest.raises(TypeError):
                    got.cpu_ptr
            else:
                assert bytes(got.data[:4]) == b"host"
            got.release()


@pytest.mark.skipif(not os.environ.get("XMEM_CUDA_DRIVER"), reason="no CUDA driver (simulated or real) configured")
def test_copies_across_memories_are_buffers_of_the_pool():
    pool = name()
    with xmem.create(pool, 4096, slots=2) as p, xmem.open(pool, timeout=5) as c:
        p.preallocate(4096, 2, storage="cuda")
        frame = p.acquire(timeout=5, size=64)
        data = numpy.arange(16, dtype=numpy.float32)
        frame.buffer[:data.nbytes] = data.tobytes()
        device = p.copy(frame, "cuda")  # the source's whole slot: its size is not set yet
        assert device.storage == "cuda" and device.meta_index >= 2
        frame.release()
        p.publish(device, size=data.nbytes, dtype="float32", shape=(16,))
        got = c.receive(timeout=5)
        assert got.meta.storage == "cuda" and got.meta.shape == (16,)
        # Back into host memory, from the consumer's frame: a slot again, ticketed.
        host = p.copy(got, "system")
        got.release()
        assert host.storage == "system"
        ticket = p.publish_ticket(host, redemptions=1, ttl=5.0)
        back = c.get(ticket)
        assert back.meta.storage == "system"
        assert numpy.array_equal(numpy.asarray(back), data)
        with pytest.raises(xmem.Error) as e:
            p.copy(back, "cuda", device=3)
        assert e.value.status == xmem._capi.ERANGE


@pytest.mark.skipif(not os.environ.get("XMEM_CUDA_DRIVER"), reason="no CUDA driver (simulated or real) configured")
def test_a_consumer_without_cuda_is_refused_device_frames_and_keeps_the_rest():
    """A recorder process with no CUDA driver, attached to a system pool before the owner
    added a class of device memory: each device frame is refused with the reason and
    given back; frames of the classes before it still come; a class added after it is
    refused too (classes are imported in order), and the slots all come back."""
    pool = name()
    child = textwrap.dedent("""
        import sys
        import xmem
        with xmem.open(sys.argv[1], timeout=5, policy="fifo", block_timeout=10) as c:
            print("attached", flush=True)
            for _ in range(5):
                try:
                    f = c.receive(timeout=10)
                    print("ok", int(f.data[0]), f.meta.storage, flush=True)
                    f.release()
                except xmem.Error as e:
                    print("refused", str(e).replace("\\n", " "), flush=True)
            print("frames_refused", c.frames_refused(), flush=True)
        """)
    env = dict(os.environ, XMEM_CUDA_DRIVER="/nonexistent/libcuda.so.1")
    with xmem.create(pool, 4096, slots=2) as p:
        proc = subprocess.Popen([sys.executable, "-c", child, pool], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env)
        try:
            assert proc.stdout.readline().strip() == "attached", proc.stderr.read()

            def host_frame(value, size=4096):
                f = p.acquire(timeout=5, size=size, storage="system")
                f.buffer[0] = value
                p.publish(f, size=16)

            host_frame(1)
            assert p.preallocate(1 << 16, 1, storage="cuda", device=0) == 1
            f = p.acquire(timeout=5, size=1 << 16, storage="cuda")
            p.publish(f, size=16)
            host_frame(3)
            assert p.preallocate(1 << 20, 1) == 2  # system memory, after the device class
            host_frame(4, size=1 << 20)
            host_frame(5)
            out, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
        lines = out.splitlines()
        assert proc.returncode == 0, (lines, err)
        assert lines[0] == "ok 1 system" and lines[2] == "ok 3 system" and lines[4] == "ok 5 system", lines
        assert lines[1].startswith("refused") and "no CUDA driver" in lines[1], lines[1]
        assert lines[3].startswith("refused") and "no CUDA driver" in lines[3], lines[3]
        assert lines[5] == "frames_refused 2", lines
        # Every slot is free again: the refused frames went back unread.
        deadline = time.monotonic() + 10
        while p.stats()["slots_free"] != 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert p.stats()["slots_free"] == 4


def test_a_pool_that_grows_makes_slots_on_demand_and_gives_them_back():
    """Growth on demand (memory_cap_mib): a size no class holds gets a slot of a dynamic
    class, a consumer attached before reads its float32 frame as published, the cap is
    kept, and the slot's memory goes back once idle (trim_idle_ms)."""
    pool = name()
    with xmem.create(pool, 4096, slots=2, memory_cap_mib=2, trim_idle_ms=100) as p, xmem.open(pool, timeout=5) as c:
        g = p.growth_stats()
        assert g["memory_cap"] == 2 << 20 and g["trim_idle_ns"] == 100_000_000
        assert g["system_bytes"] == 8192 and g["dynamic_slots"] == 0
        data = numpy.arange(256 * 256, dtype=numpy.float32).reshape(256, 256)
        frame = p.acquire(size=data.nbytes, timeout=1)
        frame.buffer[:data.nbytes] = data.tobytes()
        p.publish(frame, dtype="float32", shape=data.shape)
        got = c.receive(timeout=5)
        assert numpy.array_equal(numpy.asarray(got), data)
        classes = p.classes()
        assert [k["dynamic"] for k in classes] == [False, True]
        assert classes[1]["slot_size"] == 256 << 10
        assert c.classes() == classes
        assert p.growth_stats()["dynamic_slots"] == 1
        # An array of it holds the frame until the frame object goes (numpy's base).
        got.release()
        del got
        deadline = time.monotonic() + 10
        while p.growth_stats()["dynamic_slots"] and time.monotonic() < deadline:
            time.sleep(0.02)
        g = p.growth_stats()
        assert g["dynamic_slots"] == 0 and g["trimmed"] == 1 and g["system_bytes"] == 8192
        # Past the cap: refused at once with the reason.
        with pytest.raises(xmem.Error, match="memory cap"):
            p.acquire(size=3 << 20, timeout=0.05)
        assert p.growth_stats()["refused"] == 1


def test_cuda_memory_grows_on_demand_and_the_consumer_maps_each_slot():
    """Growth of device memory (device_memory_cap_mib), on the CUDA simulator: a copy to
    the GPU makes a device slot on demand, a consumer reads it back word for word, and
    the slot's memory goes back once idle."""
    pool = name()
    size = 1 << 18
    with xmem.create(pool, size, slots=2, device_memory_cap_mib=8, trim_idle_ms=100) as p, \
            xmem.open(pool, timeout=5) as c:
        g = p.growth_stats()
        assert g["device_memory_cap"] == 8 << 20 and g["memory_cap"] == 0 and g["device_bytes"] == 0
        data = numpy.arange(size // 4, dtype=numpy.float32)
        host = p.acquire(size=size, timeout=1)
        host.buffer[:size] = data.tobytes()
        device = p.copy(host, "cuda")  # into a slot of device memory made on demand
        host.release()
        assert device.storage == "cuda"
        g = p.growth_stats()
        assert g["dynamic_slots"] == 1 and g["device_bytes"] == 2 << 20 and g["system_bytes"] == 2 * size
        assert [(k["storage"], k["dynamic"]) for k in p.classes()] == [("system", False), ("cuda", True)]
        p.publish(device, size=size, dtype="float32", shape=data.shape)
        got = c.receive(timeout=5)
        assert got.meta.storage == "cuda"
        back = p.copy(got, "system")
        got.release()
        del got
        assert numpy.array_equal(numpy.frombuffer(bytes(back.buffer[:size]), dtype=numpy.float32), data)
        back.release()
        deadline = time.monotonic() + 10
        while p.growth_stats()["dynamic_slots"] and time.monotonic() < deadline:
            time.sleep(0.02)
        g = p.growth_stats()
        assert g["dynamic_slots"] == 0 and g["trimmed"] == 1 and g["device_bytes"] == 0
