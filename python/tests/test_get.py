"""test_get.py - the seed's get(meta_index) and get_mut from Python (issue 19): a frame
taken by its slot index (and seq) in a process that did not receive it, refused once
the slot holds another frame; get_mut in place for a sole holder, a private copy
otherwise; the refusals for bad indices."""

import gc
import uuid

import numpy
import pytest

import xmem


def name():
    return "py-" + uuid.uuid4().hex[:8]


def publish(producer, value):
    frame = producer.acquire(timeout=5)
    index = frame.meta_index
    data = numpy.full((2, 3), value, numpy.float32)
    frame.buffer[:data.nbytes] = data.tobytes()
    producer.publish(frame, dtype="float32", shape=(2, 3))
    return index


def test_a_frame_is_taken_by_index_and_seq_until_its_slot_is_reused():
    pool = name()
    with xmem.create(pool, 256, slots=2) as p, xmem.open(pool, timeout=5) as a, xmem.open(pool, timeout=5) as b:
        acquired_index = publish(p, 1.5)
        sent = a.receive(timeout=5)
        assert sent.meta_index == acquired_index and sent.meta_index & 1023 == sent.meta.index
        # What a's process would send over its own channel: the index and the seq. A
        # frame still queued for b is b's to receive (get refuses it), so b takes its
        # queue first, as a process that gets frames by index would have done.
        index, seq = sent.meta_index, sent.meta.seq
        with pytest.raises(xmem.NotHeld, match="queued for this consumer"):
            b.get(index)
        b.receive(timeout=5).release()
        got = b.get(index & 1023, seq)
        assert got.meta.seq == seq and got.meta_index == index
        assert numpy.asarray(got).tolist() == [[1.5] * 3] * 2
        assert not got.writable()  # a holds it too
        # Arrays were made of both: the frames hold their slot until they are garbage.
        got.release()
        sent.release()
        del got, sent
        gc.collect()

        # Two more frames in a pool of two slots: slot INDEX now holds a newer one.
        for value in (2.5, 3.5):
            publish(p, value)
            a.receive(timeout=5).release()
            b.receive(timeout=5).release()
        with pytest.raises(xmem.NotHeld, match="not_held|ENOTHELD|no longer"):
            b.get(index & 1023, seq)
        with pytest.raises(xmem.NotHeld, match="another frame now"):
            b.get(index)  # a meta index names one frame, never a later one of its slot
        newer = b.get(index & 1023)  # a plain slot index: whatever the slot holds now
        assert newer.meta.seq > seq
        assert numpy.asarray(newer).tolist()[0][0] in (2.5, 3.5)


def test_get_mut_writes_in_place_for_a_sole_holder_and_copies_a_shared_frame():
    pool = name()
    with xmem.create(pool, 256, slots=2) as p, xmem.open(pool, timeout=5) as a, xmem.open(pool, timeout=5) as b:
        publish(p, 4.0)
        held = a.receive(timeout=5)
        index = held.meta_index
        b.receive(timeout=5).release()

        # a still holds it: b's writable frame is a private copy, in no slot.
        copy = b.get_mut(index)
        assert copy.writable()
        array = numpy.asarray(copy)
        array[0, 0] = -1.0
        with pytest.raises(xmem.Error, match="private copy"):
            copy.meta_index
        copy.release()
        assert numpy.asarray(held).tolist() == [[4.0] * 3] * 2, "a copy's write reached the slot"
        held.release()
        del held
        gc.collect()

        # Nobody holds it now: b's frame is the slot itself, b's alone until released.
        own = b.get_mut(index)
        assert own.meta_index == index
        array = numpy.asarray(own)
        assert array.flags.writeable
        array[1, 2] = 9.0
        with pytest.raises(xmem.NotHeld):
            a.get(index)  # the slot is b's while b writes it
        own.release()
        del array, own  # its array held the slot until now
        gc.collect()
        seen = a.get(index)
        assert numpy.asarray(seen).tolist() == [[4.0] * 3, [4.0, 4.0, 9.0]]


def test_bad_indices_are_refused():
    pool = name()
    with xmem.create(pool, 256, slots=2) as p, xmem.open(pool, timeout=5) as a:
        with pytest.raises(xmem.NotHeld):
            a.get(0)  # nothing published in it yet
        with pytest.raises(xmem.Error, match="ERANGE|out_of_range|range"):
            a.get(10**6)
        for bad in (-1, 2**32, True):
            with pytest.raises(ValueError):
                a.get_mut(bad)
        with pytest.raises(ValueError):
            a.get(-1)
        with pytest.raises(TypeError):
            a.get("xmem-ticket:0:1:1", seq=1)
        publish(p, 0.5)
        assert p.get(0).meta.seq == 1  # the owner takes its own frames by index too


def test_add_ref_keeps_a_slot_past_its_frame_until_release():
    """The seed's add_ref/release by index: a reference with no object keeps the slot
    from the producer after the Frame is gone, and release gives it back."""
    pool = name()
    with xmem.create(pool, 256, slots=1, policy="drop-oldest") as p, xmem.open(pool, timeout=5) as c:
        publish(p, 2.5)
        frame = c.receive(timeout=5)
        index = frame.meta_index
        assert c.ref_count(index) == 1
        c.add_ref(index)
        assert c.ref_count(index) == 2
        frame.release()
        del frame
        gc.collect()
        assert c.ref_count(index) == 1
        with pytest.raises(xmem.Timeout):
            p.acquire(timeout=0.2)  # the pool's one slot is still the consumer's
        again = c.get(index)
        assert numpy.asarray(again).tolist() == [[2.5] * 3] * 2
        again.release()
        del again  # numpy's array above kept the frame (its base) until both went
        gc.collect()
        assert c.ref_count(index) == 1
        c.release(index)
        assert c.ref_count(index) == 0
        p.acquire(timeout=5).release()  # back in the pool
        with pytest.raises(xmem.NotHeld):
            c.release(index)
        with pytest.raises(xmem.NotHeld):
            c.add_ref(index)
        with pytest.raises(ValueError):
            c.add_ref(-1)
        with pytest.raises(xmem.Error) as e:
            c.add_ref(7)
        assert e.value.status == xmem._capi.ERANGE


def test_the_seed_pool_has_add_ref_and_release():
    pool = name()
    with xmem.create(pool, 256, slots=2) as p:
        seed = xmem.BufferPool(pool)
        assert seed.role == "consumer"
        publish(p, 3.5)
        frame = seed.receive(timeout=5)
        seed.add_ref(frame.meta_index)
        assert seed.ref_count(frame.meta_index) == 2
        seed.release(frame.meta_index)
        assert seed.ref_count(frame.meta_index) == 1
        frame.release()
        seed.close()
        with pytest.raises(xmem.Error):
            xmem.BufferPool(name()).add_ref(0)
