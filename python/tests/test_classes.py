"""test_classes.py - size classes from Python (issue 19): a class added with a consumer
attached, acquire(size=...) taking the smallest class that fits, frames of every class
received byte for byte with their dtype, the class table seen by both sides, and the
refusals (a device for system memory, past max_slots, a size no class holds); a pool of
system memory taking a class of CUDA memory (on the driver simulator, as the suite runs)."""

import os
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
                                  "first_slot": 2, "count": 2, "gpu_ordering": "none"}
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
