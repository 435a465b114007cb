"""test_xmem.py - the Python module on system-memory pools: zero copy, lifetimes,
errors, iteration and polling, a gst-launch-1.0 producer in another process, and a
Python consumer SIGKILLed while it holds arrays."""

import ctypes
import gc
import os
import re
import select
import shutil
import signal
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


def eventually(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def slot_address(frame):
    return xmem.lib.xmem_buffer_data(frame._hold.buffer)


def test_every_library_call_has_its_c_signature():
    """ctypes passes an undeclared call's Python ints as 32-bit C ints: a 64-bit timeout
    or a CUstream (a pointer on a real driver) arrives truncated. Found on an H200, where
    acquire_on_stream and publish_on_stream had no signature."""
    import re
    source = "".join(open(os.path.join(os.path.dirname(xmem.__file__), f)).read()
                     for f in ("__init__.py", "_dlpack.py", "_capi.py"))
    used = set(re.findall(r"lib\.(xmem_\w+)", source))
    assert used, "no library call found in the module's source"
    missing = sorted(used - set(xmem._capi._SIGNATURES))
    assert not missing, "called without argtypes/restype: %s" % missing


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


def test_policy_and_storage_names_are_the_librarys():
    """The tables are read from the library at import (xmem.h's xmem_policy_name_at,
    xmem_policy_name, xmem_storage_name), not typed again: the same names, in the same
    order, as when they were."""
    capi = xmem._capi
    assert list(capi.POLICIES.items()) == [("block", 0), ("fifo", 0), ("drop-oldest", 1), ("drop-new", 2),
                                           ("latest", 3), ("fifo-spill", 4)]
    assert capi.POLICY_NAMES == {0: "fifo", 1: "drop-oldest", 2: "drop-new", 3: "latest", 4: "fifo-spill"}
    assert list(capi.STORAGES.items()) == [("system", capi.STORAGE_SYSTEM), ("cuda", capi.STORAGE_CUDA)]
    assert xmem.lib.xmem_policy_from_name(b"sometimes") == capi.EINVAL
    assert "unknown policy 'sometimes'" in capi.last_error()
    assert xmem.lib.xmem_storage_from_name(b"disk") == capi.EINVAL
    assert xmem.lib.xmem_policy_name(5) is None
    with pytest.raises(ValueError, match=r"^policy must be one of block, fifo, drop-oldest, drop-new, latest, "
                                         r"fifo-spill$"):
        xmem.create(name(), 64, policy="sometimes")
    with pytest.raises(ValueError, match=r"^storage must be 'system' or 'cuda'$"):
        xmem.create(name(), 64, storage="disk")


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
        view = w.buffer
        view[0] = 1
        p.publish(w)
        with pytest.raises(ValueError, match="already published"):
            p.publish(w)
        with pytest.raises(ValueError, match="released"):
            view[0] = 2  # the slot is the consumers' now
        with pytest.raises(ValueError, match="already published"):
            w.buffer
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
            c = xmem.open(sys.argv[1], timeout=10, queue_size=4)
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


def publish_pattern(producer, fmt, width, height):
    """Publishes one frame of FMT laid out by the library, every byte i % 251."""
    w = producer.acquire(timeout=5)
    meta = xmem.lib.xmem_buffer_meta_mut(w._raw)
    assert xmem.lib.xmem_set_video_layout(meta, fmt.encode(), width, height, 1) == 0
    size = meta.contents.size
    w.buffer[:size] = bytes(i % 251 for i in range(size))
    producer.publish(w, size=size)
    return size


@pytest.mark.parametrize("fmt,shapes", [
    ("NV12", [(74, 100), (37, 50, 2)]),
    ("I420", [(74, 100), (37, 50), (37, 50)]),
    ("RGBA", [(74, 100, 4)]),
    ("Y444", [(74, 100), (74, 100), (74, 100)]),
    ("P010_10LE", [(74, 100, 2), (37, 50, 4)]),
])
def test_planes_have_their_real_strides(fmt, shapes):
    pool = name()
    caps = "video/x-raw,format=%s,width=100,height=74" % fmt
    with xmem.create(pool, 100 * 74 * 4, slots=2, format=caps) as p, xmem.open(pool, timeout=5) as c:
        publish_pattern(p, fmt, 100, 74)
        frame = c.receive(timeout=5)
        planes = frame.planes()
        assert [a.shape for a in planes] == shapes
        slot = numpy.frombuffer(frame.data, numpy.uint8)
        for a, offset, stride in zip(planes, frame.meta.plane_offsets, frame.meta.plane_strides):
            assert not a.flags.writeable
            assert a.ctypes.data == slot.ctypes.data + offset, "a plane is not in the slot"
            assert a.strides[0] == stride
            assert a[1].ravel()[0] == (offset + stride) % 251


_META_FIELDS = {"size": ctypes.c_uint64, "ndim": ctypes.c_uint8, "dtype": ctypes.c_uint8, "shape": ctypes.c_uint64,
                "strides": ctypes.c_uint64, "n_planes": ctypes.c_uint32, "plane_stride": ctypes.c_uint32,
                "plane_offset": ctypes.c_uint64}


def scribble_meta(pool, index, field, value, element=0):
    """Writes FIELD[ELEMENT] of the frame metadata in slot INDEX's record, in the pool's
    control segment as this process maps it: what any peer that maps it can do."""
    for line in open("/proc/self/maps"):
        if "/memfd:xmem-control:%s (deleted)" % pool in line and line.split()[1].startswith("rw"):
            base = int(line.split("-")[0], 16)
            break
    else:
        raise AssertionError("no writable mapping of pool %s's control segment" % pool)
    # ControlConstants: header_size and slot_record_size; the slot records follow the
    # header, 64-byte aligned, and the class table (32 records of 64 bytes), each with
    # the metadata at byte 40.
    header_size = ctypes.c_uint32.from_address(base + 8).value
    record_size = ctypes.c_uint32.from_address(base + 12).value
    meta = base + (header_size + 63) // 64 * 64 + 32 * 64 + index * record_size + 40
    kind = _META_FIELDS[field]
    address = meta + getattr(xmem._capi.FrameMeta, field).offset + element * ctypes.sizeof(kind)
    kind.from_address(address).value = value


def publish_nv12(producer, width=64, height=48):
    """Publishes an NV12 frame laid out by the library; its slot index and size."""
    w = producer.acquire(timeout=5)
    meta = xmem.lib.xmem_buffer_meta_mut(w._raw)
    assert xmem.lib.xmem_set_video_layout(meta, b"NV12", width, height, 1) == 0
    size, index = meta.contents.size, meta.contents.index
    producer.publish(w, size=size)
    return index, size


def test_a_frame_whose_layout_does_not_fit_is_refused_and_the_stream_goes_on():
    pool = name()
    caps = "video/x-raw,format=NV12,width=64,height=48"
    with xmem.create(pool, 8192, slots=4, format=caps) as p, xmem.open(pool, timeout=5, queue_size=4) as c:
        for field, value, element in [("plane_offset", 1 << 40, 1), ("size", 1 << 20, 0),
                                      ("plane_stride", 0xFFFFFFF0, 0), ("ndim", 99, 0)]:
            index, _ = publish_nv12(p)
            scribble_meta(pool, index, field, value, element)
            with pytest.raises(xmem.FrameRefused, match="does not fit the slot"):
                c.receive(timeout=5)
            publish_nv12(p)
            frame = c.receive(timeout=5)
            assert [a.shape for a in frame.planes()] == [(48, 64), (24, 32, 2)]
            frame.release()
        assert c.frames_refused() == 4
        assert eventually(lambda: p.stats()["slots_free"] == 4), "a refused frame kept its slot"
        # Iterating skips a refused frame and goes on.
        index, _ = publish_nv12(p)
        scribble_meta(pool, index, "plane_offset", 1 << 40, 1)
        publish_nv12(p)
        p.end_of_stream()
        assert len([f.meta.seq for f in c]) == 1
        assert c.frames_refused() == 5


def test_planes_that_run_past_the_frame_raise():
    """The library checks that planes start within the frame; where they end depends on
    the format, which planes() knows: a stride that runs the chroma rows past the frame
    is refused with the numbers, never read."""
    pool = name()
    caps = "video/x-raw,format=NV12,width=64,height=48"
    with xmem.create(pool, 8192, slots=2, format=caps) as p, xmem.open(pool, timeout=5) as c:
        w = p.acquire(timeout=5)
        meta = xmem.lib.xmem_buffer_meta_mut(w._raw)
        assert xmem.lib.xmem_set_video_layout(meta, b"NV12", 64, 48, 1) == 0
        meta.contents.plane_stride[1] = 1 << 20
        p.publish(w, size=meta.contents.size)
        frame = c.receive(timeout=5)
        with pytest.raises(ValueError, match="plane 1 .* ends at byte .* of a 4608-byte payload"):
            frame.planes()


def test_dlpack_capsules_zero_copy_and_lifetime():
    pool = name()
    with xmem.create(pool, 4096, slots=2) as p, xmem.open(pool, timeout=5) as c:
        p.publish(p.acquire(timeout=5), size=4096)
        frame = c.receive(timeout=5)
        assert frame.__dlpack_device__() == (1, 0)
        array = numpy.from_dlpack(frame)
        assert array.ctypes.data == slot_address(frame) and array.shape == (4096,)
        assert not array.flags.writeable, "numpy wrote into a shared frame"
        frame.release()
        gc.collect()
        assert p.stats()["slots_free"] == 1, "the slot went back under a DLPack array"
        del array
        gc.collect()
        assert eventually(lambda: p.stats()["slots_free"] == 2)
        assert xmem._dlpack.live_count() == 0

        p.publish(p.acquire(timeout=5), size=16)
        frame = c.receive(timeout=5)
        legacy = frame.__dlpack__()
        versioned = frame.__dlpack__(max_version=(1, 0))
        assert "dltensor" in repr(legacy) and "dltensor_versioned" not in repr(legacy)
        assert "dltensor_versioned" in repr(versioned)
        copied = frame.__dlpack__(copy=True, max_version=(1, 0))  # a copy: the slot is not in it
        assert "dltensor_versioned" in repr(copied)
        with pytest.raises(BufferError):
            frame.__dlpack__(dl_device=(2, 0))
        frame.release()
        del legacy, versioned, copied  # never consumed: their deleters run with them
        gc.collect()
        assert xmem._dlpack.live_count() == 0
        assert eventually(lambda: p.stats()["slots_free"] == 2)


def test_numpy_from_dlpack_copy_semantics():
    """numpy.from_dlpack(frame, copy=...): None and False give the slot itself,
    read-only (numpy 2 asks for a versioned capsule and reads its READ_ONLY flag);
    True gives a copy the caller owns, and the slot goes back at once."""
    if numpy.lib.NumpyVersion(numpy.__version__) < "2.1.0":
        pytest.skip("numpy %s's from_dlpack has no copy= (numpy 2.1 and later, Debian 13)" % numpy.__version__)
    pool = name()
    with xmem.create(pool, 64 * 48 * 4, slots=2, format="video/x-raw,format=RGBA,width=64,height=48") as p, \
            xmem.open(pool, timeout=5) as c:
        w = p.acquire(timeout=5)
        numpy.frombuffer(w.buffer, numpy.uint8)[:] = numpy.arange(64 * 48 * 4) % 251
        p.publish(w)
        frame = c.receive(timeout=5)
        for copy in (None, False):
            shared = numpy.from_dlpack(frame, copy=copy)
            assert shared.ctypes.data == slot_address(frame), copy
            assert not shared.flags.writeable, "numpy may write into a frame other processes read"
            del shared
        # numpy 2.2 marks every array it takes through DLPack read-only, copies too.
        owned = numpy.from_dlpack(frame, copy=True)
        assert owned.ctypes.data != slot_address(frame)
        assert (owned == numpy.arange(64 * 48 * 4) % 251).all()
        frame.release()
        gc.collect()
        assert eventually(lambda: p.stats()["slots_free"] == 2), "the copy kept the slot"
        assert (owned == numpy.arange(64 * 48 * 4) % 251).all(), "the copy changed with the slot"
        del owned
        gc.collect()
        assert xmem._dlpack.live_count() == 0


@pytest.mark.filterwarnings("ignore:The given NumPy array is not writable")
def test_torch_tensors_are_the_slot():
    torch = pytest.importorskip("torch")
    from torch.utils import dlpack as torch_dlpack

    pool = name()
    with xmem.create(pool, 64 * 48 * 4, slots=2, format="video/x-raw,format=RGBA,width=64,height=48") as p:
        with xmem.open(pool, timeout=5) as c:
            w = p.acquire(timeout=5)
            w.buffer[:] = bytes(range(256)) * 48
            p.publish(w)
            frame = c.receive(timeout=5)
            tensor = torch_dlpack.from_dlpack(frame)  # torch 1.13 takes the legacy capsule
            assert tensor.data_ptr() == slot_address(frame)
            assert tuple(tensor.shape) == (64 * 48 * 4,) and tensor.dtype == torch.uint8
            assert tensor[4:8].tolist() == [4, 5, 6, 7]
            cpu = torch.as_tensor(numpy.asarray(frame))  # torch warns: it has no read-only tensors
            assert cpu.data_ptr() == slot_address(frame)
            frame.release()
            gc.collect()
            assert p.stats()["slots_free"] == 1
            del tensor, cpu, frame
            gc.collect()
            assert eventually(lambda: p.stats()["slots_free"] == 2)


def test_asyncio_two_pools_timeout_and_end_of_stream():
    import asyncio

    a_name, b_name = name(), name()
    with xmem.create(a_name, 64, slots=8) as a, xmem.create(b_name, 64, slots=8) as b:
        ca, cb = xmem.open(a_name, timeout=5, queue_size=8), xmem.open(b_name, timeout=5, queue_size=8)

        async def collect(consumer):
            return [f.meta.seq async for f in consumer.frames()]

        async def produce():
            for i in range(4):
                await asyncio.sleep(0.01)
                for p in (a, b):
                    p.publish(p.acquire(timeout=5), size=1)
            a.end_of_stream()
            b.end_of_stream()

        async def main():
            # Nothing published yet: a timeout, with the loop still responsive.
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(ca.frames().__anext__(), 0.05)
            return await asyncio.gather(collect(ca), collect(cb), produce())

        got_a, got_b, _ = asyncio.run(main())
        assert got_a == [1, 2, 3, 4] and got_b == [1, 2, 3, 4]
        ca.close()
        cb.close()


def test_device_frames_on_the_cuda_simulator():
    if "cudasim" not in os.environ.get("XMEM_CUDA_DRIVER", ""):
        pytest.skip("runs against tests/cudasim (XMEM_CUDA_DRIVER)")
    pool = name()
    with xmem.create(pool, 4096, slots=2, storage="cuda") as p, xmem.open(pool, timeout=5) as c:
        assert p.storage == "cuda" and c.storage == "cuda"
        w = p.acquire(timeout=5)
        device = xmem.lib.xmem_buffer_device_ptr(w._raw)
        source = bytes(i % 199 for i in range(4096))
        host = ctypes.create_string_buffer(source, 4096)
        assert xmem.lib.xmem_cuda_copy_2d(device, 4096, 1, ctypes.addressof(host), 4096, 0, 4096, 1, 0, None) == 0
        p.publish(w, size=4096)
        frame = c.receive(timeout=5)
        assert frame.meta.storage == "cuda"
        cai = frame.__cuda_array_interface__
        assert cai["version"] == 3 and cai["shape"] == (4096,) and cai["data"][1] is True
        assert frame.__dlpack_device__() == (2, 0)
        capsule = frame.__dlpack__(stream=None)
        assert "dltensor" in repr(capsule)
        with pytest.raises(TypeError, match="CUDA"):
            frame.data
        with pytest.raises(AttributeError):
            frame.__array_interface__
        back = ctypes.create_string_buffer(4096)
        assert xmem.lib.xmem_cuda_copy_2d(ctypes.addressof(back), 4096, 0, cai["data"][0], 4096, 1, 4096, 1, 0,
                                          None) == 0
        assert back.raw == source, "the device slot does not hold what the producer wrote"
        del capsule, cai
        frame.release()  # an interface was read: the slot goes with the frame object
        gc.collect()
        assert p.stats()["slots_free"] == 1
        del frame
        gc.collect()
        assert eventually(lambda: p.stats()["slots_free"] == 2)


def load_infer():
    import importlib.util

    path = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python", "infer.py")
    spec = importlib.util.spec_from_file_location("infer", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("color", ["0xff336699", "0xffe01010", "0xff10e080", "0xffffffff", "0xff000000"])
def test_infer_example_converts_nv12_back_to_the_source_colour(color):
    """examples/python/infer.py's NV12 to RGB, on views of the slot's own planes, gives
    back the solid colour videotestsrc encoded (within BT.601 rounding)."""
    torch = pytest.importorskip("torch")
    from torch.utils import dlpack as torch_dlpack

    launch = gst_launch()
    infer = load_infer()
    value = int(color, 16)
    expected = numpy.array([(value >> 16) & 255, (value >> 8) & 255, value & 255], float)
    pool = name()
    producer = subprocess.Popen([launch, "-q", "videotestsrc", "num-buffers=1", "pattern=solid-color",
                                 "foreground-color=" + color, "!",
                                 "video/x-raw,format=NV12,width=64,height=48,colorimetry=bt601", "!", "xmemsink",
                                 "pool-name=" + pool, "wait-for-consumers=1"])
    try:
        with xmem.open(pool, timeout=30) as c:
            with c.receive(timeout=30) as frame:
                tensor = torch_dlpack.from_dlpack(frame)
                y, uv = infer.planes(frame, tensor, 64, 48)
                assert y.data_ptr() == slot_address(frame), "the planes are not views of the slot"
                rgb = infer.nv12_to_rgb(y, uv).permute(1, 2, 0).numpy() * 255.0
                del tensor, y, uv
        assert producer.wait(timeout=30) == 0
    finally:
        producer.kill()
    assert abs(rgb - expected).max() <= 3.0, (rgb[0, 0], expected)


def test_device_frames_received_on_a_stream_on_the_cuda_simulator():
    """receive(stream=...): the stream waits for the producer's writes on the GPU (the
    simulator runs streams late, on their own threads), the interface names it, work
    queued on it sees the frame, and the slot is released on it."""
    if "cudasim" not in os.environ.get("XMEM_CUDA_DRIVER", ""):
        pytest.skip("runs against tests/cudasim (XMEM_CUDA_DRIVER)")
    cuda, (handle,) = sim_streams(1)
    stream = ctypes.c_void_p(handle)
    pool = name()
    with xmem.create(pool, 4096, slots=2, storage="cuda") as p, xmem.open(pool, timeout=5) as c:
        for n in range(1, 6):
            w = p.acquire(timeout=5)
            device = xmem.lib.xmem_buffer_device_ptr(w._raw)
            source = bytes((i * n) % 251 for i in range(4096))
            host = ctypes.create_string_buffer(source, 4096)
            assert xmem.lib.xmem_cuda_copy_2d(device, 4096, 1, ctypes.addressof(host), 4096, 0, 4096, 1, 0,
                                              None) == 0
            p.publish(w, size=4096)
            frame = c.receive(timeout=5, stream=stream.value)
            assert frame.__cuda_array_interface__["stream"] == stream.value
            back = ctypes.create_string_buffer(4096)
            address = frame.__cuda_array_interface__["data"][0]
            assert xmem.lib.xmem_cuda_copy_2d(ctypes.addressof(back), 4096, 0, address, 4096, 1, 4096, 1, 0,
                                              stream) == 0
            assert xmem.lib.xmem_cuda_synchronize(0, stream) == 0
            assert xmem.lib.xmem_cuda_stream_done(0, stream) == 1, "work left on a synchronized stream"
            assert back.raw == source, "frame %d: the stream did not see the producer's writes" % n
            capsule = frame.__dlpack__(stream=None)  # another stream: waited for on the CPU
            del capsule, frame
            gc.collect()
        assert xmem.lib.xmem_cuda_synchronize(0, stream) == 0
        assert eventually(lambda: p.stats()["slots_free"] == 2)
    with pytest.raises(TypeError, match="stream"):
        c.receive(timeout=0, stream="default")
    assert cuda.cuStreamDestroy_v2(stream) == 0


def sim_streams(n):
    """N streams on the simulator's primary context (the driver libxmem loaded)."""
    cuda = ctypes.CDLL(os.environ["XMEM_CUDA_DRIVER"])
    assert cuda.cuInit(0) == 0
    ctx = ctypes.c_void_p()
    assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
    assert cuda.cuCtxPushCurrent_v2(ctx) == 0
    streams = []
    for _ in range(n):
        s = ctypes.c_void_p()
        assert cuda.cuStreamCreate(ctypes.byref(s), 1) == 0
        streams.append(s.value)
    return cuda, streams


def test_producer_and_consumer_on_streams_on_the_cuda_simulator():
    """A Python producer writing each device frame on its stream and publishing on it
    (no CPU wait), a consumer receiving and reading on its own: every frame arrives
    whole, through two slots reused under late streams (the simulator runs each stream
    on its own thread after random delays)."""
    if "cudasim" not in os.environ.get("XMEM_CUDA_DRIVER", ""):
        pytest.skip("runs against tests/cudasim (XMEM_CUDA_DRIVER)")
    cuda, (ps, cs) = sim_streams(2)
    pool = name()
    size = 8192
    sources = []  # host bytes of queued copies stay alive until the end
    with xmem.create(pool, size, slots=2, storage="cuda", policy="block") as p, \
            xmem.open(pool, timeout=5, queue_size=2) as c:
        for n in range(1, 21):
            w = p.acquire(timeout=5, stream=ps)
            cai = w.__cuda_array_interface__
            assert cai["data"][1] is False, "an acquired slot is writable"
            sources.append(ctypes.create_string_buffer(bytes((i + n) % 256 for i in range(size)), size))
            assert xmem.lib.xmem_cuda_copy_2d(cai["data"][0], size, 1, ctypes.addressof(sources[-1]), size, 0, size,
                                              1, 0, ps) == 0
            p.publish(w, size=size, stream=ps)
            with pytest.raises(ValueError, match="already published"):
                w.__cuda_array_interface__
            frame = c.receive(timeout=5, stream=cs)
            back = ctypes.create_string_buffer(size)
            address = frame.__cuda_array_interface__["data"][0]
            assert xmem.lib.xmem_cuda_copy_2d(ctypes.addressof(back), size, 0, address, size, 1, size, 1, 0, cs) == 0
            assert xmem.lib.xmem_cuda_synchronize(0, cs) == 0
            assert back.raw == sources[-1].raw, "frame %d: read before the producer's stream wrote it" % n
            del frame
            gc.collect()
        assert xmem.lib.xmem_cuda_synchronize(0, ps) == 0
        assert xmem.lib.xmem_cuda_synchronize(0, cs) == 0
    for s in (ps, cs):
        assert cuda.cuStreamDestroy_v2(ctypes.c_void_p(s)) == 0


def async_device_frames(count, size):
    """A producer thread writing each frame on a stream and publishing it on that
    stream, and ``async for frame in consumer.frames()`` reading every frame back:
    [(seq, first byte, last byte)] of what arrived, and the producer's failures."""
    import asyncio
    import threading

    cuda, (ps,) = sim_streams(1)
    pool = name()
    sources = []  # host bytes of queued copies stay alive until the end
    failures = []
    with xmem.create(pool, size, slots=4, storage="cuda", policy="block") as p, \
            xmem.open(pool, timeout=5, queue_size=4) as c:

        def produce():
            try:
                for n in range(1, count + 1):
                    w = p.acquire(timeout=10, stream=ps)
                    sources.append(ctypes.create_string_buffer(bytes([n % 256]) * size, size))
                    address = w.__cuda_array_interface__["data"][0]
                    assert xmem.lib.xmem_cuda_copy_2d(address, size, 1, ctypes.addressof(sources[-1]), size, 0, size,
                                                      1, 0, ps) == 0
                    p.publish(w, size=size, stream=ps)
                assert xmem.lib.xmem_cuda_synchronize(0, ps) == 0
            except Exception as e:  # reported with the frames
                failures.append(repr(e))
            p.end_of_stream()

        async def collect():
            got = []
            async for frame in c.frames():
                back = ctypes.create_string_buffer(size)
                address = frame.__cuda_array_interface__["data"][0]
                assert xmem.lib.xmem_cuda_copy_2d(ctypes.addressof(back), size, 0, address, size, 1, size, 1, 0,
                                                  None) == 0
                got.append((frame.meta.seq, back.raw[0], back.raw[-1]))
                del frame
            return got

        producer = threading.Thread(target=produce)
        producer.start()
        got = asyncio.run(collect())
        producer.join()
    assert cuda.cuStreamDestroy_v2(ctypes.c_void_p(ps)) == 0
    return got, failures


def test_async_frames_from_a_device_pool_on_the_cuda_simulator():
    """``async for frame in consumer.frames()`` (receive(timeout=0), then the event loop
    watching the fd) gets every frame of a producer that writes and publishes each one
    on a stream, with the simulator running each stream operation up to 3 ms late (in
    a process of its own: the delay is read when the driver starts). Issue 15: a frame
    taken off the queue before the producer's GPU writes were done was released and
    lost."""
    if "cudasim" not in os.environ.get("XMEM_CUDA_DRIVER", ""):
        pytest.skip("runs against tests/cudasim (XMEM_CUDA_DRIVER)")
    count = 200
    script = ("import sys; sys.path.insert(0, %r); import test_xmem; "
              "print(repr(test_xmem.async_device_frames(%d, 4096)))" % (os.path.dirname(__file__), count))
    child = subprocess.run([sys.executable, "-c", script], env=dict(os.environ, XMEM_CUDASIM_DELAY_US="3000"),
                           capture_output=True, text=True, timeout=60)
    assert child.returncode == 0, child.stderr
    got, failures = eval(child.stdout.strip().splitlines()[-1])
    assert not failures, failures
    assert len(got) == count, "%d of %d frames arrived" % (len(got), count)
    assert got == [(n, n % 256, n % 256) for n in range(1, count + 1)]


def cuda_torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device here")
    return torch


def test_torch_cuda_tensors_are_the_slot_and_wait_for_the_producer():
    """On a GPU: the producer fills the slot with a torch kernel after a slow one, on its
    stream, and publishes without waiting; the consumer's tensor is the slot itself and
    its stream sees every value."""
    torch = cuda_torch()
    from torch.utils import dlpack as torch_dlpack

    pool = name()
    size = 1 << 20
    with xmem.create(pool, size, slots=2, storage="cuda", policy="block") as p, \
            xmem.open(pool, timeout=5, queue_size=2) as c:
        ps, cs = torch.cuda.Stream(), torch.cuda.Stream()
        for n in range(1, 21):
            w = p.acquire(timeout=5, stream=ps)
            with torch.cuda.stream(ps):
                slot = torch_dlpack.from_dlpack(w)
                torch.cuda._sleep(2000000)  # the write comes late: publish must not run ahead of it
                slot.fill_(n)
            del slot
            p.publish(w, size=size, stream=ps)
            frame = c.receive(timeout=5, stream=cs)
            with torch.cuda.stream(cs):
                tensor = torch_dlpack.from_dlpack(frame)
                assert tensor.data_ptr() == frame.__cuda_array_interface__["data"][0]
                total = int(tensor.to(torch.int64).sum())
            assert total == n * size, "frame %d: the consumer read before the producer's write" % n
            del tensor, frame
            gc.collect()


def test_cupy_reads_device_frames():
    cupy = pytest.importorskip("cupy")
    try:
        cupy.cuda.runtime.getDeviceCount()
    except Exception:
        pytest.skip("CuPy has no CUDA device here")
    pool = name()
    with xmem.create(pool, 4096, slots=2, storage="cuda") as p, xmem.open(pool, timeout=5) as c:
        w = p.acquire(timeout=5)
        slot = cupy.asarray(w)  # __cuda_array_interface__, writable
        slot[:] = 7
        cupy.cuda.runtime.deviceSynchronize()
        del slot
        p.publish(w, size=4096)
        frame = c.receive(timeout=5)
        array = cupy.asarray(frame)
        assert array.data.ptr == frame.__cuda_array_interface__["data"][0]
        assert int(array.sum()) == 7 * 4096
        assert int(cupy.from_dlpack(frame).sum()) == 7 * 4096


def test_onnx_example_binds_the_slot_itself():
    """examples/python/onnx_infer.py: ONNX Runtime's I/O binding takes each frame's own
    slot as the model's input (the bound address is the slot's, nothing copied), and
    the model's per-channel means are the colour videotestsrc painted."""
    pytest.importorskip("onnxruntime", reason="python3-onnxruntime (Debian 13) is not installed")
    pytest.importorskip("onnx", reason="python3-onnx (Debian 13) is not installed")
    launch = gst_launch()
    pool = name()
    frames = 3
    producer = subprocess.Popen([launch, "-q", "videotestsrc", "num-buffers=%d" % frames, "pattern=solid-color",
                                 "foreground-color=0xff336699", "!", "video/x-raw,format=RGBA,width=64,height=48",
                                 "!", "xmemsink", "pool-name=" + pool, "wait-for-consumers=1", "policy=block"])
    example = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python", "onnx_infer.py")
    try:
        run = subprocess.run([sys.executable, example, pool, "--frames", str(frames), "--timeout", "30"],
                             capture_output=True, text=True, timeout=120)
        assert producer.wait(timeout=30) == 0
    finally:
        producer.kill()
    assert run.returncode == 0, run.stderr
    lines = [line.split() for line in run.stdout.splitlines() if line.startswith("onnx: frame ")]
    assert len(lines) == frames, run.stdout
    for words in lines:
        # onnx: frame SEQ means R G B A input 0x.. slot 0x.. zero-copy
        means = [float(v) for v in words[4:8]]
        assert means == [0x33, 0x66, 0x99, 0xff], words
        assert words[9] == words[11] and words[12] == "zero-copy", words
    assert "onnx_infer: %d frames, 0 copied" % frames in run.stdout


def test_each_consumer_chooses_its_policy_and_a_stalled_recorder_spills():
    """A recorder (fifo-spill) that reads nothing while a detector (latest) reads each
    frame: the producer never waits, the detector has the newest frame, and the recorder
    later reads every frame in order from the spill tier."""
    pool = name()
    with xmem.create(pool, 4096, slots=3, spill_bytes=64 * 4096) as p:
        with xmem.open(pool, timeout=5, policy="fifo-spill") as recorder, \
                xmem.open(pool, timeout=5, policy="latest") as detector:
            for i in range(1, 31):
                w = p.acquire(timeout=0)
                w.buffer[:4] = i.to_bytes(4, "little")
                p.publish(w)
                f = detector.receive(timeout=0)
                assert f.meta.seq == i and bytes(f.data[:4]) == i.to_bytes(4, "little")
                del f
            assert detector.consumer_stats()["policy"] == "latest"
            stats = recorder.consumer_stats()
            assert stats["policy"] == "fifo-spill" and stats["queued"] == 30 and stats["spilled"] >= 27
            assert p.spill_stats()["frames"] >= 27
            spilled = 0
            for i in range(1, 31):
                f = recorder.receive(timeout=0)
                assert f.meta.seq == i and bytes(numpy.asarray(f)[:4]) == i.to_bytes(4, "little")
                spilled += f.spilled
                del f
            # The spill thread may spill more after the look above: compare with the
            # count once the queue is empty.
            assert spilled == recorder.consumer_stats()["spilled"] >= stats["spilled"]
            assert recorder.consumer_stats()["dropped"] == 0
        with pytest.raises(ValueError):
            xmem.open(pool, policy="fifo-spill", spill_delivery="gpu")
        with pytest.raises(ValueError):
            xmem.open(pool, policy="sometimes")
        with pytest.raises(ValueError):
            xmem.open(pool, policy="fifo", fallback="latest")


def test_spin_before_wake_receives_every_frame_and_counts_its_spins():
    """wake="spin-before": every frame of a steady stream, in order; its spin counters
    add up (whether a spin caught a frame depends on this machine's load)."""
    pool = name()
    with xmem.create(pool, 4096, slots=4) as p:
        with xmem.open(pool, timeout=5, wake="spin-before", spin_budget=0.002) as c:
            for i in range(1, 41):
                w = p.acquire(timeout=5)
                p.publish(w)
                f = c.receive(timeout=5)
                assert f.meta.seq == i
                del f
                time.sleep(0.005)
            s = c.consumer_stats()
            assert s["spins_caught"] <= s["spins"] and s["spin_ns"] <= s["spins"] * 2_100_000
        with pytest.raises(ValueError):
            xmem.open(pool, wake="busy")
        with pytest.raises(ValueError):
            xmem.open(pool, wake="spin-before", spin_budget=2.0)


def test_max_age_gives_stale_frames_back_unread():
    """open(max_age=...): a frame older than the limit (by its timestamp) when receive()
    would hand it out is given back unread and counted; younger ones come in order."""
    pool = name()
    with xmem.create(pool, 256, slots=4) as p, xmem.open(pool, timeout=5, policy="fifo", max_age=0.5) as c:
        for age in (2.0, 0.0):
            f = p.acquire(timeout=5)
            f.buffer[:4] = b"abcd"
            lib_meta = xmem.lib.xmem_buffer_meta_mut(f._live_buffer()).contents
            lib_meta.timestamp = time.monotonic_ns() - int(age * 1e9)
            p.publish(f, size=4)
        got = c.receive(timeout=5)
        assert got.meta.seq == 2, "the frame stamped 2 s ago expired"
        got.release()
        assert c.consumer_stats()["expired"] == 1
        assert p.stats()["slots_free"] == 4
    with pytest.raises(ValueError, match="max_age"):
        xmem.open(pool, timeout=0, max_age=-1)


def test_a_slow_consumer_with_max_age_gets_only_young_frames_and_keeps_receiving():
    """Issue 35's case, live: a producer at 30 fps, a fifo consumer opened with
    max_age=0.05 that spends 100 ms on each frame. Each frame it gets was at most 50 ms
    old when handed out (the library's check) and is young when Python sees it; older
    ones are given back unread and counted; it keeps receiving. Without max_age the same
    consumer's backlog ages frames by several of its 100 ms steps."""
    import threading

    def run(max_age):
        pool = name()
        with xmem.create(pool, 256, slots=8) as p:
            stop = threading.Event()

            def produce():
                next_at = time.monotonic()
                while not stop.is_set():
                    try:
                        f = p.acquire(timeout=0.5)
                    except xmem.Timeout:
                        continue
                    p.publish(f, size=1)
                    next_at += 1 / 30
                    time.sleep(max(0.0, next_at - time.monotonic()))

            options = {"max_age": max_age} if max_age else {}
            with xmem.open(pool, timeout=5, policy="fifo", queue_size=4, **options) as c:
                producer = threading.Thread(target=produce)
                producer.start()
                ages = []
                try:
                    end = time.monotonic() + 2.0
                    while time.monotonic() < end:
                        try:
                            f = c.receive(timeout=1)
                        except xmem.Timeout:
                            continue
                        ages.append(time.monotonic_ns() - f.meta.timestamp)
                        f.release()
                        time.sleep(0.1)
                finally:
                    stop.set()
                    producer.join()
                return ages, c.consumer_stats()["expired"]

    ages, expired = run(0.05)
    assert len(ages) >= 8, "it stopped receiving"
    assert expired > 0
    # 50 ms at the library's check, and the time to hand the frame to Python after it on a
    # busy machine: well under the backlog's ages below.
    print("max_age 0.05: ages (ms)", [a // 1000000 for a in ages], "expired", expired)
    assert max(ages) < 0.2e9, ages
    backlog, _ = run(None)
    print("no max_age: ages (ms)", [a // 1000000 for a in backlog])
    assert sorted(backlog)[len(backlog) // 2] > 0.25e9, "without max_age the backlog should age frames"


def test_capture_time_travels_with_the_frame():
    """publish(capture_time=...): when the frame was captured, on the realtime clock
    (time.time_ns()), reaches consumers as meta.capture_time; None when not set. Bad
    values are refused and leave the frame acquired."""
    pool = name()
    with xmem.create(pool, 256, slots=4) as p, xmem.open(pool, timeout=5, policy="fifo") as c:
        now = time.time_ns()
        f = p.acquire(timeout=5)
        for bad in (-1, 0, 2**64, True, 1.5):
            with pytest.raises((ValueError, TypeError), match="capture_time|integer"):
                p.publish(f, size=1, capture_time=bad)
        p.publish(f, size=1, capture_time=now)
        p.publish(p.acquire(timeout=5), size=1)
        assert c.receive(timeout=5).meta.capture_time == now
        assert c.receive(timeout=5).meta.capture_time is None


def test_max_held_caps_what_a_consumer_that_keeps_every_frame_holds():
    """open(max_held=2) and a consumer that keeps every frame object: it holds at most 2
    slots; the producer, acquiring with a short timeout, never runs short; its receive
    says why nothing more comes, and a frame let go lets the next one in."""
    pool = name()
    with xmem.create(pool, 256, slots=8) as p, xmem.open(pool, timeout=5, max_held=2) as c:
        kept = []
        for i in range(30):
            f = p.acquire(timeout=0.2)  # never short of a slot
            f.buffer[:8] = i.to_bytes(8, "little")
            p.publish(f, size=8)
            while True:
                try:
                    kept.append(c.receive(timeout=0))
                except xmem.Timeout:
                    break
            assert c.consumer_stats()["held"] <= 2
        assert len(kept) == 2
        assert [int.from_bytes(bytes(k.data[:8]), "little") for k in kept] == [0, 1]
        stats = c.consumer_stats()
        assert (stats["held"], stats["max_held"], stats["dropped"]) == (2, 2, 28)
        with pytest.raises(xmem.Timeout, match="max_held 2"):
            c.receive(timeout=0.05)
        kept.pop(0).release()
        f = p.acquire(timeout=0.2)
        p.publish(f, size=8)
        assert c.receive(timeout=5).meta.seq == 31
    for bad in (-1, 2**32, 1.5, True):
        with pytest.raises(ValueError, match="max_held"):
            xmem.open(pool, timeout=0, max_held=bad)


def test_history_gives_a_late_joiner_the_newest_frames_still_in_the_pool():
    """open(history=N): the newest N frames published before it attached, still in the
    pool, oldest first, then the live stream."""
    pool = name()
    with xmem.create(pool, 256, slots=8) as p:
        for i in range(5):
            f = p.acquire(timeout=5)
            f.buffer[:1] = bytes([i])
            p.publish(f, size=1)
        with xmem.open(pool, timeout=5, policy="fifo", history=3) as c, xmem.open(pool, timeout=5) as live:
            assert [c.receive(timeout=0).meta.seq for _ in range(3)] == [3, 4, 5]
            with pytest.raises(xmem.Timeout):
                live.receive(timeout=0)
            f = p.acquire(timeout=5)
            p.publish(f, size=1)
            assert c.receive(timeout=5).meta.seq == 6
            assert live.receive(timeout=5).meta.seq == 6


def test_opencv_reads_a_pool_by_its_uri():
    """cv2.VideoCapture("xmem://NAME", cv2.CAP_GSTREAMER), as an OpenCV user writes it,
    reads frames a gst-launch-1.0 producer publishes (python3-opencv; skipped without)."""
    cv2 = pytest.importorskip("cv2")
    if not re.search(r"GStreamer:\s+YES", cv2.getBuildInformation()):
        pytest.skip("this OpenCV has no GStreamer backend")
    launch = gst_launch()
    pool = name()
    producer = subprocess.Popen([launch, "-q", "videotestsrc", "is-live=true", "num-buffers=150", "!",
                                 "video/x-raw,format=BGR,width=64,height=48,framerate=30/1", "!", "xmemsink",
                                 "pool-name=" + pool])
    try:
        capture = cv2.VideoCapture("xmem://%s?policy=fifo" % pool, cv2.CAP_GSTREAMER)
        assert capture.isOpened()
        frames = 0
        for _ in range(10):
            ok, image = capture.read()
            assert ok
            assert image.shape == (48, 64, 3)
            frames += 1
        assert frames == 10
        capture.release()
    finally:
        producer.kill()
        producer.wait()
