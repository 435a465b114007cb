"""test_published.py - a frame comes out as its producer published it (issue 19): every
dtype through numpy, torch and DLPack, strided layouts, and the metadata a Python
producer sets, read in another process; layouts and dtypes that do not fit refused,
never read as bytes; raw pointers that do not keep the slot; writable() for a frame's
only holder."""

import ctypes
import gc
import json
import os
import subprocess
import sys
import textwrap
import uuid

import numpy
import pytest

import xmem
from test_xmem import eventually, scribble_meta

DTYPES = [name for name, _, _ in xmem._capi.DTYPES]


def name():
    return "py-" + uuid.uuid4().hex[:8]


def torch_or_none():
    try:
        import torch
    except ImportError:
        return None
    return torch


def reference(dtype):
    """The (2, 3) tensor the tests publish as DTYPE: its bytes and its values. No element
    is zero; a signed dtype has negatives, a float one fractions, and an integer one of
    several bytes a value in each byte."""
    _, size, kind = xmem._capi.DTYPES[xmem._capi.DTYPE_CODES[dtype]]
    values = [[1, 2, 3], [4, 5, 6]]
    if kind in ("f", "bf"):
        values = [[v + 0.5 for v in row] for row in values]
    else:
        values = [[v * ((1 << 8 * (size - 1)) + 1) for v in row] for row in values]
    if kind != "u":
        values = [[-v if i % 2 else v for i, v in enumerate(row)] for row in values]
    if kind == "bf":
        torch = torch_or_none()
        if torch is None:
            pytest.skip("bfloat16 bytes are made with torch, which is missing")
        data = torch.tensor(values, dtype=torch.bfloat16).view(torch.int16).numpy().tobytes()
    else:
        data = numpy.array(values, dtype=dtype).tobytes()
    return data, values


def dl_tensor(capsule):
    """The DLTensor in a legacy DLPack capsule nobody took (CPython: id() is the address)."""
    address = xmem._dlpack._api.PyCapsule_GetPointer(id(capsule), b"dltensor")
    return xmem._dlpack.ManagedTensor.from_address(address).dl_tensor


def publish_bytes(producer, data, **meta):
    w = producer.acquire(timeout=5)
    w.buffer[:len(data)] = data
    producer.publish(w, **meta)


def raw_frame(consumer, **poison):
    """The next frame, with its metadata (this process's checked copy) overwritten with
    POISON before xmem.Frame reads it: what a frame whose metadata went bad on the way
    would look like to the module."""
    buffer = ctypes.c_void_p()
    assert xmem.lib.xmem_pool_receive(consumer._get(), 5_000_000_000, ctypes.byref(buffer)) == 0
    meta = xmem.lib.xmem_buffer_meta(buffer).contents
    for field, value in poison.items():
        if isinstance(value, tuple):
            for i, v in enumerate(value):
                getattr(meta, field)[i] = v
        else:
            setattr(meta, field, value)
    return xmem.Frame(buffer, consumer._pool)


@pytest.mark.filterwarnings("ignore:The given NumPy array is not writable")
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_dtype_comes_out_as_published(dtype):
    """Issue 19: a float32 (2, 3) frame came out of numpy and torch as uint8 zeros."""
    data, values = reference(dtype)
    code = xmem._capi.DTYPE_CODES[dtype]
    _, size, kind = xmem._capi.DTYPES[code]
    pool = name()
    with xmem.create(pool, 256, slots=2) as p, xmem.open(pool, timeout=5) as c:
        publish_bytes(p, data, dtype=dtype, shape=(2, 3))
        frame = c.receive(timeout=5)
        m = frame.meta
        assert (m.dtype, m.shape, m.strides, m.size) == (dtype, (2, 3), (3 * size, size), 6 * size)

        capsule = frame.__dlpack__()
        t = dl_tensor(capsule)
        assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (xmem._dlpack.TYPE_CODES[kind], size * 8, 1)
        assert (t.ndim, t.shape[0], t.shape[1]) == (2, 2, 3)
        assert not t.strides or (t.strides[0], t.strides[1]) == (3, 1), "DLPack strides count elements"
        assert t.data == frame.ptr
        del capsule, t

        if kind == "bf":
            with pytest.raises(xmem.LayoutError, match="numpy has no type for.*DLPack"):
                numpy.asarray(frame)
        else:
            array = numpy.asarray(frame)
            assert array.dtype == numpy.dtype(dtype) and array.shape == (2, 3)
            assert array.tolist() == values
            assert array.ctypes.data == frame.cpu_ptr, "the array is not the slot"
            assert not array.flags.writeable
            taken = numpy.from_dlpack(frame)
            assert taken.dtype == numpy.dtype(dtype) and taken.tolist() == values
            del array, taken

        torch = torch_or_none()
        if torch is not None and hasattr(torch, dtype):
            from torch.utils import dlpack as torch_dlpack

            tensor = torch_dlpack.from_dlpack(frame)
            assert tensor.dtype == getattr(torch, dtype) and tuple(tensor.shape) == (2, 3)
            assert tensor.tolist() == values
            assert tensor.data_ptr() == frame.ptr
            del tensor
        frame.release()
        del frame
        gc.collect()
        assert eventually(lambda: p.stats()["slots_free"] == 2)
        assert xmem._dlpack.live_count() == 0


@pytest.mark.filterwarnings("ignore:The given NumPy array is not writable")
def test_strided_layouts_in_numpy_torch_and_dlpack():
    """Rows padded apart, and a transposed view: numpy takes the byte strides, DLPack
    and torch the same strides in elements."""
    torch = torch_or_none()
    pool = name()
    block = numpy.arange(1, 25, dtype=numpy.float32).reshape(3, 8)
    with xmem.create(pool, 256, slots=2) as p, xmem.open(pool, timeout=5, queue_size=2) as c:
        # Rows of 4 floats, 32 bytes apart: the last element ends at 4 + 2 * 32 + 3 * 4.
        publish_bytes(p, block.tobytes(), dtype=numpy.float32, shape=(3, 4), strides=(32, 4))
        # The first 3 x 4 floats, column by column.
        publish_bytes(p, block.tobytes(), dtype="float32", shape=(4, 3), strides=(4, 16))
        for expected, strides in ((block[:, :4], (8, 1)), (block.ravel()[:12].reshape(3, 4).T, (1, 4))):
            frame = c.receive(timeout=5)
            assert frame.meta.size == 4 + sum((n - 1) * s for n, s in zip(frame.meta.shape, frame.meta.strides))
            array = numpy.asarray(frame)
            assert array.strides == frame.meta.strides and (array == expected).all()
            assert (numpy.from_dlpack(frame) == expected).all()
            capsule = frame.__dlpack__()
            t = dl_tensor(capsule)
            assert (t.strides[0], t.strides[1]) == strides
            del capsule, t
            if torch is not None:
                from torch.utils import dlpack as torch_dlpack

                tensor = torch_dlpack.from_dlpack(frame)
                assert tensor.stride() == strides and (tensor.numpy() == expected).all()
                del tensor
            del array, frame
        gc.collect()
        assert eventually(lambda: p.stats()["slots_free"] == 2)


def test_a_byte_stride_dlpack_cannot_count_is_refused_there_and_read_by_numpy():
    """A C producer may give a float32 tensor a 13-byte row stride (the library takes
    it): numpy reads it, DLPack (strides in elements) refuses it instead of rounding."""
    pool = name()
    with xmem.create(pool, 256, slots=2) as p, xmem.open(pool, timeout=5) as c:
        w = p.acquire(timeout=5)
        values = numpy.array([1.5, -2.5, 3.5], numpy.float32).tobytes()
        w.buffer[0:12] = values
        w.buffer[13:25] = values[::-1]
        with pytest.raises(xmem.Error, match="multiple of the element size .4 bytes. .XMEM_EINVAL"):
            p.publish(w, dtype="float32", shape=(2, 3), strides=(13, 4))
        meta = xmem.lib.xmem_buffer_meta_mut(w._raw).contents
        meta.dtype, meta.ndim = xmem._capi.DTYPE_CODES["float32"], 2
        meta.shape[0], meta.shape[1], meta.strides[0], meta.strides[1] = 2, 3, 13, 4
        p.publish(w, size=25)  # the frame was still acquired
        frame = c.receive(timeout=5)
        array = numpy.asarray(frame)
        assert array.strides == (13, 4) and array[0].tolist() == [1.5, -2.5, 3.5]
        with pytest.raises(xmem.LayoutError, match="stride 13 of dimension 0 is not a multiple .* elements"):
            frame.__dlpack__()
        with pytest.raises(BufferError):
            numpy.from_dlpack(frame)


def test_a_tensor_larger_than_its_frame_is_refused_everywhere():
    torch = torch_or_none()
    pool = name()
    with xmem.create(pool, 256, slots=2) as p, xmem.open(pool, timeout=5) as c:
        w = p.acquire(timeout=5)
        with pytest.raises(ValueError, match="size 16 is less than the 24 bytes"):
            p.publish(w, size=16, dtype="float32", shape=(2, 3))
        with pytest.raises(xmem.Error, match="spans 80000 bytes.*XMEM_ERANGE"):
            p.publish(w, dtype="float64", shape=(100, 100))
        # Through the C metadata: the library refuses it at publish.
        meta = xmem.lib.xmem_buffer_meta_mut(w._raw).contents
        meta.dtype, meta.ndim, meta.shape[0], meta.strides[0] = xmem._capi.DTYPE_CODES["float32"], 1, 7, 4
        with pytest.raises(xmem.Error, match="reach byte 28 of a 24-byte payload.*XMEM_EINVAL"):
            p.publish(w, size=24)

        # A frame whose metadata claims more than its payload by the time the module
        # reads it: no array, capsule or tensor reads past the payload.
        publish_bytes(p, bytes(24), dtype="float32", shape=(2, 3))
        frame = raw_frame(c, shape=(2, 300))
        for make in (numpy.asarray, lambda f: f.__dlpack__(), lambda f: f.__array_interface__):
            with pytest.raises(xmem.LayoutError, match="shape \\(2, 300\\) .* spans 1212 bytes.* 24-byte payload"):
                make(frame)
        if torch is not None:
            from torch.utils import dlpack as torch_dlpack

            with pytest.raises(ValueError, match="24-byte payload"):
                torch_dlpack.from_dlpack(frame)
        frame.release()
        assert eventually(lambda: p.stats()["slots_free"] == 2), "a refused export kept the slot"


def test_a_dtype_that_is_none_is_an_error_not_bytes():
    pool = name()
    with xmem.create(pool, 256, slots=2) as p, xmem.open(pool, timeout=5, queue_size=2) as c:
        # Written through the C metadata by the producer: refused at publish.
        w = p.acquire(timeout=5)
        meta = xmem.lib.xmem_buffer_meta_mut(w._raw).contents
        meta.dtype, meta.ndim, meta.shape[0], meta.strides[0] = 200, 1, 8, 1
        with pytest.raises(xmem.Error, match="dtype 200 is not an xmem_dtype"):
            p.publish(w, size=8)

        # By a peer, in the control segment after publish: the frame is refused.
        w = p.acquire(timeout=5)
        index = xmem.lib.xmem_buffer_meta(w._raw).contents.index
        p.publish(w, dtype="int16", shape=(4,))
        scribble_meta(pool, index, "dtype", 77)
        with pytest.raises(xmem.FrameRefused, match="dtype 77 is not an xmem_dtype"):
            c.receive(timeout=5)

        # In the metadata the module reads: no export, shape or not.
        for shape in ((4,), ()):
            publish_bytes(p, b"\x01" * 8, dtype="int16", shape=(4,))
            frame = raw_frame(c, dtype=200, ndim=len(shape))
            assert frame.meta.dtype is None
            for make in (numpy.asarray, lambda f: f.__dlpack__()):
                with pytest.raises(xmem.LayoutError, match="dtype 200 is not an xmem_dtype"):
                    make(frame)
            frame.release()
        assert eventually(lambda: p.stats()["slots_free"] == 2)


def test_frames_without_a_shape_stay_bytes():
    pool = name()
    with xmem.create(pool, 64, slots=2) as p, xmem.open(pool, timeout=5) as c:
        publish_bytes(p, bytes(range(10)), size=10)
        frame = c.receive(timeout=5)
        assert (frame.meta.dtype, frame.meta.shape) == ("uint8", ())
        array = numpy.asarray(frame)
        assert array.dtype == numpy.uint8 and array.tolist() == list(range(10))
        capsule = frame.__dlpack__()
        t = dl_tensor(capsule)
        assert (t.dtype.code, t.dtype.bits, t.ndim, t.shape[0]) == (1, 8, 1, 10)


def test_producer_metadata_reaches_a_consumer_in_another_process():
    pool = name()
    child = textwrap.dedent("""
        import json, sys, numpy, xmem
        with xmem.open(sys.argv[1], timeout=10) as c:
            f = c.receive(timeout=10)
            m = f.meta
            fields = ("pts", "dts", "duration", "flags", "content_type", "dtype", "shape", "strides", "size",
                      "producer_pid")
            out = {key: getattr(m, key) for key in fields}
            out["values"] = numpy.asarray(f).tolist()
            print(json.dumps(out), flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", child, pool], stdout=subprocess.PIPE, text=True)
    try:
        with xmem.create(pool, 256, slots=2) as p:
            assert eventually(lambda: p.stats()["consumers"] == 1), "the child never attached"
            rows = numpy.zeros((2, 4), numpy.float32)
            rows[:, :3] = [[0.5, -1.0, 2.0], [3.25, -4.5, 5.0]]
            publish_bytes(p, rows.tobytes(), pts=1_000_000_000, dts=900_000_000, duration=40_000_000,
                          flags=0x80000001, content_type="tensor/x-features", dtype="float32", shape=(2, 3),
                          strides=(16, 4), size=32)
            got = json.loads(proc.stdout.readline())
        assert got == {"pts": 1_000_000_000, "dts": 900_000_000, "duration": 40_000_000, "flags": 0x80000001,
                       "content_type": "tensor/x-features", "dtype": "float32", "shape": [2, 3], "strides": [16, 4],
                       "size": 32, "producer_pid": os.getpid(),
                       "values": [[0.5, -1.0, 2.0], [3.25, -4.5, 5.0]]}
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()


def test_publish_checks_its_metadata_and_keeps_the_frame_on_a_mistake():
    torch = torch_or_none()
    pool = name()
    with xmem.create(pool, 64, slots=2) as p, xmem.open(pool, timeout=5, queue_size=2) as c:
        w = p.acquire(timeout=5)
        mistakes = [
            (ValueError, "at most 31 fit", dict(content_type="x" * 32)),
            (ValueError, "at most 31 fit", dict(content_type="é" * 16)),  # 32 bytes in UTF-8
            (TypeError, "content_type", dict(content_type=b"tensor")),
            (ValueError, "flags", dict(flags=1 << 32)),
            (ValueError, "pts", dict(pts=-1)),
            (ValueError, "duration", dict(duration=xmem._capi.NONE)),
            (ValueError, "the slot holds 64 bytes", dict(size=65)),
            (ValueError, "at most 8 .XMEM_MAX_DIMS", dict(shape=(1,) * 9)),
            (ValueError, "one stride a dimension", dict(shape=(2, 3), strides=(3,))),
            (ValueError, "strides without a shape", dict(strides=(1,))),
            (TypeError, "sequence of ints", dict(shape=6)),
            (ValueError, "each must be 0 to", dict(shape=(-1,))),
            (ValueError, "none of xmem's", dict(dtype="complex64")),
            (ValueError, "none of xmem's", dict(dtype=numpy.bool_)),
            (ValueError, "none of xmem's", dict(dtype=">f4" if sys.byteorder == "little" else "<f4")),
            (ValueError, "not a whole number of int32", dict(dtype="int32", size=10)),
            (ValueError, "give a tensor one dimension", dict(dtype="int32", shape=())),
        ]
        for error, message, kwargs in mistakes:
            with pytest.raises(error, match=message):
                p.publish(w, **kwargs)
        # Still acquired: published now. A dtype without a shape is one dimension.
        p.publish(w, dtype=numpy.dtype("int16"), size=10, content_type="é" * 15)
        frame = c.receive(timeout=5)
        assert (frame.meta.dtype, frame.meta.shape, frame.meta.size) == ("int16", (5,), 10)
        assert frame.meta.content_type == "é" * 15
        assert frame.meta.pts is None and frame.meta.dts is None and frame.meta.flags == 0
        frame.release()
        # Names, numpy types and torch dtypes all name xmem's dtypes; SIZE defaults to
        # what the tensor spans, and may be more.
        kinds = [("float16", numpy.float16), ("uint32", numpy.uint32)]
        if torch is not None:
            kinds.append(("bfloat16", torch.bfloat16))
        for expected, dtype in kinds:
            publish_bytes(p, bytes(8), dtype=dtype, shape=(2, 1))
            publish_bytes(p, bytes(8), dtype=dtype, shape=(2,), size=40)
            for size in (2 * numpy.dtype(expected if expected != "bfloat16" else "int16").itemsize, 40):
                frame = c.receive(timeout=5)
                assert (frame.meta.dtype, frame.meta.size) == (expected, size)
                frame.release()


def test_raw_pointers_do_not_keep_the_slot():
    """Issue 19: reading __array_interface__ for an address (what ONNX Runtime's
    bind_input(buffer_ptr=...) wants) keeps the slot until the frame is garbage
    (test_xmem's device test shows it); ptr and cpu_ptr do not: after release() the
    producer has the slot back at once."""
    pool = name()
    with xmem.create(pool, 4096, slots=1) as p, xmem.open(pool, timeout=5) as c:
        w = p.acquire(timeout=5)
        w.buffer[:4] = b"abcd"
        slot = w.ptr
        assert slot == w.cpu_ptr != 0
        with pytest.raises(TypeError, match="system memory"):
            w.cuda_ptr
        p.publish(w, size=4)
        with pytest.raises(ValueError, match="already published"):
            w.ptr
        frame = c.receive(timeout=5)
        address = frame.cpu_ptr
        assert address == frame.ptr and ctypes.string_at(address, 4) == b"abcd"
        with pytest.raises(TypeError, match="system memory"):
            frame.cuda_ptr_mut
        frame.release()
        assert p.stats()["slots_free"] == 1, "reading the pointer kept the slot"
        w = p.acquire(timeout=0)
        assert w.cpu_ptr == slot
        with pytest.raises(ValueError, match="released"):
            frame.ptr
        w.release()


def test_device_pointers_on_the_cuda_simulator():
    if "cudasim" not in os.environ.get("XMEM_CUDA_DRIVER", ""):
        pytest.skip("runs against tests/cudasim (XMEM_CUDA_DRIVER)")
    pool = name()
    size = 4096
    source = ctypes.create_string_buffer(bytes(i % 251 for i in range(size)), size)
    with xmem.create(pool, size, slots=1, storage="cuda") as p, \
            xmem.open(pool, timeout=5, queue_size=1) as a, xmem.open(pool, timeout=5, queue_size=1) as b:
        w = p.acquire(timeout=5)
        device = w.cuda_ptr_mut
        assert device == w.cuda_ptr == w.ptr != 0
        with pytest.raises(TypeError, match="CUDA device memory"):
            w.cpu_ptr
        assert xmem.lib.xmem_cuda_copy_2d(device, size, 1, ctypes.addressof(source), size, 0, size, 1, 0, None) == 0
        p.publish(w, size=size)
        fa, fb = a.receive(timeout=5), b.receive(timeout=5)
        back = ctypes.create_string_buffer(size)
        assert xmem.lib.xmem_cuda_copy_2d(ctypes.addressof(back), size, 0, fa.cuda_ptr, size, 1, size, 1, 0,
                                          None) == 0
        assert back.raw == source.raw
        with pytest.raises(xmem.Error, match="read-only frame") as refused:
            fa.cuda_ptr_mut  # the seed's read-only guard refuses it
        assert refused.value.status == xmem._capi.EREADONLY
        assert not fa.writable(), "b holds it too"
        fb.release()
        assert fa.writable(), "now the only holder"
        assert fa.cuda_ptr_mut == fa.cuda_ptr, "the only holder writes in place"
        fa.release()
        assert p.stats()["slots_free"] == 1, "reading the pointers kept the slot"
        p.acquire(timeout=0).release()


def test_writable_tells_the_only_holder_so():
    """Issue 19: writable() said False to a consumer that was a frame's only holder.
    True now, and then the frame is written in place: arrays made after are writable,
    and another process's get() is refused until the frame goes."""
    pool = name()
    with xmem.create(pool, 64, slots=2) as p, \
            xmem.open(pool, timeout=5, queue_size=2) as a, xmem.open(pool, timeout=5, queue_size=2) as b:
        publish_bytes(p, b"1234", size=4)
        fa, fb = a.receive(timeout=5), b.receive(timeout=5)
        assert not fa.writable() and not fb.writable(), "two holders"
        assert not numpy.asarray(fb).flags.writeable
        del fb
        gc.collect()
        assert not numpy.asarray(fa).flags.writeable, "read-only until writable() is asked"
        assert fa.writable(), "the only holder"
        index = fa.meta.index
        array = numpy.asarray(fa)
        assert array.flags.writeable and array.ctypes.data == fa.cpu_ptr
        array[0] = ord("9")
        out = ctypes.c_void_p()
        assert xmem.lib.xmem_pool_get(b._get(), index, ctypes.byref(out)) == xmem._capi.ENOTHELD
        del array, fa
        gc.collect()
        assert xmem.lib.xmem_pool_get(b._get(), index, ctypes.byref(out)) == xmem._capi.OK
        assert ctypes.string_at(xmem.lib.xmem_buffer_data(out), 4) == b"9234"
        xmem.lib.xmem_buffer_release(out)

        # A sole consumer is the only holder from the start (publish lets go of the
        # producer's reference).
        b.close()
        publish_bytes(p, b"5678", size=4)
        with a.receive(timeout=5) as frame:
            assert frame.writable()
        with pytest.raises(ValueError, match="released"):
            frame.writable()
