"""test_classes.py - size classes from Python (issue 19): a class added with a consumer
attached, acquire(size=...) taking the smallest class that fits, frames of every class
received byte for byte with their dtype, the class table seen by both sides, and the
refusals (another memory, past max_slots, a size no class holds)."""

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
                                  "first_slot": 2, "count": 2}
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
        with pytest.raises(xmem.Error, match="system memory"):
            p.preallocate(4096, 1, storage="cuda")
        with pytest.raises(ValueError):
            p.preallocate(4096, 1, storage="disk")
