"""xmem - take frames from an xmem pool in Python without copying them.

    import xmem, numpy
    with xmem.open("cam0") as consumer:
        for frame in consumer:                 # until end of stream
            pixels = numpy.asarray(frame)      # the shared slot itself, read-only
            print(frame.meta.seq, pixels.shape, pixels.dtype)

numpy, DLPack (torch.from_dlpack) and __cuda_array_interface__ see a frame's tensor
as its producer published it: dtype, shape in elements, strides in bytes
(Producer.publish(..., dtype=, shape=, strides=)); a frame without a shape is its bytes.

A Frame holds one reference to a slot. The slot goes back to the pool when the frame
and every array made from it are gone (frame.release() or ``with frame:`` drops the
frame's own hold early; arrays keep theirs). Bound to libxmem's C API with ctypes: the
same files work with every CPython from 3.9 on.
"""

import asyncio
import functools
import ctypes
import grp
import operator
import re
import sys
import weakref

from . import _capi, _dlpack
from ._capi import lib

__all__ = [
    "Error",
    "Timeout",
    "EndOfStream",
    "Closed",
    "Consumer",
    "Producer",
    "Frame",
    "FrameMeta",
    "FrameRefused",
    "LayoutError",
    "BadTicket",
    "NotHeld",
    "BufferPool",
    "Ticket",
    "open",
    "create",
]


class Error(Exception):
    """A libxmem call failed; the message names the pool and the cause."""

    def __init__(self, message, status=_capi.ESYSTEM):
        super().__init__(message)
        self.status = status


class Timeout(Error):
    """Nothing arrived (or no slot was free) within the timeout."""


class EndOfStream(Error):
    """The producer ended the stream."""


class Closed(Error):
    """The pool's producer went away (closed or died), or this handle was closed."""


class FrameRefused(Error):
    """A frame's layout (size, shape and strides, planes) did not fit its slot: another
    process wrote its metadata. It went back unread and was counted
    (Consumer.frames_refused()); the next receive() goes on."""


class BadTicket(Error):
    """A frame ticket that names no live ticket of the pool: expired, used up, forged,
    garbled or of another pool. No frame was taken."""


class NotHeld(Error):
    """get(index, seq): the slot holds no published frame, or no longer the one SEQ
    names (the producer reused it). No frame was taken."""


class LayoutError(ValueError, BufferError):
    """A frame's tensor cannot be handed out as asked: its metadata names no dtype or
    spans more than its payload (another process wrote it), or the interface cannot
    express it (bfloat16 in numpy's interfaces; a byte stride DLPack, which counts
    strides in elements, cannot count). A ValueError, and the BufferError DLPack asks
    of an export that cannot be made. Nothing was read."""


def _raise(status, what):
    message = _capi.last_error() or what
    name = lib.xmem_status_name(status).decode()
    kind = {_capi.ETIMEDOUT: Timeout, _capi.EEOS: EndOfStream, _capi.ECLOSED: Closed,
            _capi.EBADFRAME: FrameRefused, _capi.EBADTICKET: BadTicket, _capi.ENOTHELD: NotHeld}.get(status, Error)
    raise kind("%s (%s)" % (message, name), status)


def _check(status, what):
    if status != _capi.OK:
        _raise(status, what)


def _policy_code(policy):
    """POLICY's xmem_policy value, by any name the library accepts."""
    if policy not in _capi.POLICIES:
        raise ValueError("policy must be one of %s" % ", ".join(_capi.POLICIES))
    return _capi.POLICIES[policy]


def _storage_code(storage):
    """STORAGE's xmem_storage value, by the library's name ('system' or 'cuda')."""
    if storage not in _capi.STORAGES:
        raise ValueError("storage must be %s" % " or ".join("'%s'" % n for n in _capi.STORAGES))
    return _capi.STORAGES[storage]


def _timeout_ns(timeout):
    """None waits forever; seconds otherwise."""
    if timeout is None:
        return _capi.FOREVER
    if timeout < 0:
        raise ValueError("timeout must be None or >= 0 seconds")
    return min(int(timeout * 1e9), _capi.FOREVER)


def _name(name):
    if not isinstance(name, str) or not name:
        raise TypeError("a pool name is a non-empty str")
    return name.encode()


def _dtype_code(dtype):
    """The xmem_dtype of DTYPE: a name ("float32", "bfloat16"), a numpy dtype or scalar
    type, or a torch dtype."""
    name = dtype if isinstance(dtype, str) else None
    if name is None and str(dtype).startswith("torch."):
        name = str(dtype)[len("torch."):]
    if name not in _capi.DTYPE_CODES:
        try:
            import numpy

            described = numpy.dtype(dtype)
            if described.isnative:
                name = described.name
        except (ImportError, TypeError):
            pass
    if name not in _capi.DTYPE_CODES:
        raise ValueError("dtype %r is none of xmem's (%s, in this machine's byte order)"
                         % (dtype, ", ".join(_capi.DTYPE_CODES)))
    return _capi.DTYPE_CODES[name]


def _dims(values, what):
    """SHAPE or STRIDES as a tuple of ints that a frame's metadata holds."""
    try:
        dims = tuple(operator.index(v) for v in values)
    except TypeError:
        raise TypeError("%s must be a sequence of ints, not %r" % (what, values)) from None
    if len(dims) > _capi.MAX_DIMS:
        raise ValueError("%s %s has %d dimensions; a frame has at most %d (XMEM_MAX_DIMS)"
                         % (what, dims, len(dims), _capi.MAX_DIMS))
    if not all(0 <= v < 1 << 63 for v in dims):
        raise ValueError("%s %s: each must be 0 to 2**63 - 1" % (what, dims))
    return dims


def _nanoseconds(value, what):
    value = int(value)
    if not 0 <= value < _capi.NONE:
        raise ValueError("%s must be None or 0 to 2**64 - 2 nanoseconds, not %d" % (what, value))
    return value


class FrameMeta:
    """A frame's metadata, copied when it was received (times in nanoseconds). A tensor's
    shape counts elements of its dtype ("uint8", "float32", "bfloat16"; None for a value
    that names no xmem_dtype), its strides bytes; a frame without a shape is bytes."""

    __slots__ = (
        "seq", "pts", "dts", "duration", "timestamp", "capture_time", "flags", "size", "index", "storage", "device",
        "content_type", "producer", "producer_pid", "format", "n_planes", "plane_offsets", "plane_strides",
        "dtype", "shape", "strides", "width", "height", "_dtype_code",
    )

    def __init__(self, m, fmt):
        none = lambda v: None if v == _capi.NONE else v  # noqa: E731
        self.seq = m.seq
        self.pts = none(m.pts)
        self.dts = none(m.dts)
        self.duration = none(m.duration)
        self.timestamp = m.timestamp
        # CLOCK_REALTIME ns since 1970 (time.time_ns()'s clock), None when the producer set none.
        self.capture_time = m.capture_time or None
        self.flags = m.flags
        self.size = m.size
        self.index = m.index
        self.storage = _capi.storage_name(m.storage_type)
        self.device = m.device_id
        self.content_type = m.content_type.decode(errors="replace")
        self.producer = m.producer.decode(errors="replace")
        self.producer_pid = m.producer_pid
        self.format = fmt
        self.n_planes = m.n_planes
        self.plane_offsets = tuple(m.plane_offset[i] for i in range(min(m.n_planes, _capi.MAX_PLANES)))
        self.plane_strides = tuple(m.plane_stride[i] for i in range(min(m.n_planes, _capi.MAX_PLANES)))
        self._dtype_code = m.dtype
        self.dtype = _capi.DTYPES[m.dtype][0] if m.dtype < len(_capi.DTYPES) else None
        ndim = min(m.ndim, _capi.MAX_DIMS)
        self.shape = tuple(m.shape[i] for i in range(ndim))
        self.strides = tuple(m.strides[i] for i in range(ndim))
        self.height, self.width = (self.shape[0], self.shape[1]) if ndim >= 2 else (None, None)

    def __repr__(self):
        return "FrameMeta(seq=%d, pts=%s, size=%d, storage=%s, dtype=%s, shape=%s, format=%r)" % (
            self.seq, self.pts, self.size, self.storage, self.dtype, self.shape, self.format)


class _Hold:
    """One xmem_buffer: released when the last Frame, array or view using it goes. A
    frame received on a stream is released on it: the producer's GPU waits for the
    work queued there so far, and the CPU does not."""

    __slots__ = ("buffer", "stream", "__weakref__")

    def __init__(self, buffer, stream=None):
        self.buffer = buffer
        self.stream = stream

    def __del__(self):
        if self.buffer:
            if self.stream:
                lib.xmem_buffer_release_on_stream(self.buffer, self.stream)
            else:
                lib.xmem_buffer_release(self.buffer)
            self.buffer = None


_byte_types = {}


def _bytes_at(address, size, hold):
    """A ctypes byte array over ADDRESS that keeps HOLD alive."""
    cls = _byte_types.get(size)
    if cls is None:
        cls = _byte_types[size] = type("XmemBytes%d" % size, (ctypes.c_ubyte * size,), {})
    array = cls.from_address(address)
    array.hold = hold
    return array


def _stream_handle(stream):
    """A CUstream from an int, a torch.cuda.Stream (.cuda_stream) or a CuPy stream (.ptr)."""
    if stream is None:
        return None
    for attribute in ("cuda_stream", "ptr"):
        if hasattr(stream, attribute):
            stream = getattr(stream, attribute)
            break
    if not isinstance(stream, int) or stream < 0:
        raise TypeError("stream must be a CUstream (int), a torch.cuda.Stream or a CuPy stream")
    return stream or None


def _exported(frame, address):
    frame._exported = True
    return address


# numpy's typestr byte order for elements of more than one byte: this machine's, which
# every process sharing a pool has.
_BYTE_ORDER = "<" if sys.byteorder == "little" else ">"


def _typestr(seq, dtype):
    """numpy's typestr of DTYPE (a _capi.DTYPES entry) in frame SEQ."""
    name, size, kind = dtype
    if kind == "bf":
        raise LayoutError("frame %d is %s, which numpy has no type for: take it through DLPack "
                          "(torch.from_dlpack(frame)), or its bytes through frame.data" % (seq, name))
    return ("|" if size == 1 else _BYTE_ORDER) + kind + str(size)


def _element_strides(seq, dtype, strides):
    """DLPack's strides, in elements, of byte STRIDES (None: C-contiguous) of DTYPE."""
    if strides is None:
        return None
    name, size, _ = dtype
    for d, stride in enumerate(strides):
        if stride % size:
            raise LayoutError("frame %d: stride %d of dimension %d is not a multiple of its %s elements' %d "
                              "bytes: DLPack counts strides in elements (numpy.asarray(frame) takes byte strides)"
                              % (seq, stride, d, name, size))
    return tuple(stride // size for stride in strides)


class BufferGuard:
    """What every frame is (the seed's BufferGuard): a received or gotten Frame, and a
    WritableFrame acquired to be written. Its meta_index, for get(meta_index) in any
    process; the raw addresses of its bytes, for code that takes a pointer (ONNX
    Runtime's bind_input(buffer_ptr=...), a decoder writing a device slot); copies into
    buffers of its pool; forget(). Reading an address does not keep the slot as arrays
    and capsules do: the address is valid while the frame is (until release(), the end
    of its ``with`` block, publish() for an acquired frame, or its garbage collection),
    so keep the frame while anything uses it."""

    def _live_buffer(self):
        raise NotImplementedError

    @property
    def ptr(self):
        """The address of the frame's bytes: host memory (cpu_ptr) for a system frame, a
        CUdeviceptr (cuda_ptr) for a device one. Read it, do not write through it unless
        the frame is writable (an acquired frame, or writable() said so)."""
        buffer = self._live_buffer()
        if lib.xmem_buffer_storage(buffer) == _capi.STORAGE_CUDA:
            return lib.xmem_buffer_device_ptr(buffer)
        return lib.xmem_buffer_data(buffer) or 0

    @property
    def cpu_ptr(self):
        """The host address of a system-memory frame's bytes (TypeError for a device frame)."""
        if lib.xmem_buffer_storage(self._live_buffer()) == _capi.STORAGE_CUDA:
            raise TypeError("cpu_ptr: the frame is in CUDA device memory: use cuda_ptr")
        return self.ptr

    @property
    def cuda_ptr(self):
        """The CUdeviceptr of a device frame's bytes (TypeError for system memory). A
        received frame's is ready on the stream it was received on (any stream without
        one); read it, do not write through it (cuda_ptr_mut)."""
        if lib.xmem_buffer_storage(self._live_buffer()) != _capi.STORAGE_CUDA:
            raise TypeError("cuda_ptr: the frame is in system memory: use cpu_ptr")
        return self.ptr

    @property
    def cuda_ptr_mut(self):
        """cuda_ptr, to write through: a writable frame's (acquired, from get_mut(), or one
        writable() made this process's alone). Error (EREADONLY) for a read-only frame,
        as the seed's read-only guard refuses it."""
        address = self.cuda_ptr
        if not lib.xmem_buffer_is_writable(self._live_buffer()):
            raise Error("cuda_ptr_mut: a read-only frame (received, or taken with get()): get_mut() or "
                        "writable() gives a writable one", _capi.EREADONLY)
        return address

    @property
    def meta_index(self):
        """The frame's meta index (the seed's meta_index): what get(meta_index) takes in
        any process attached to the pool, and set_ref_count(meta_index, n) publishes. Its
        slot in the low bits (meta_index & 1023), the frame's generation above: it names
        this frame, never a later one of the slot. Error (ENOTHELD) for a frame in no
        slot (a private copy, a spilled frame)."""
        index = lib.xmem_buffer_meta_index(self._live_buffer())
        if index == _capi.NO_META_INDEX:
            raise Error("meta_index: this frame is in no slot of the pool (a private copy or a spilled frame)",
                        _capi.ENOTHELD)
        return index

    def copy_to_cuda(self, device_id=0, timeout=1.0, stream=None):
        """The seed's copy: a buffer of the pool on CUDA device DEVICE_ID with this frame's
        bytes and metadata, writable, with its own meta_index: publish it or
        set_ref_count() it (a consumer's is a slot the owner leases it). Queued on STREAM
        (complete on return without one). Waits up to TIMEOUT seconds for a free slot.
        Error (ERANGE) when the pool has no class of that memory large enough: the
        message names the class to preallocate."""
        return self._copy("cuda", device_id, timeout, stream)

    def copy_to_cpu(self, timeout=1.0, stream=None):
        """The same into a buffer of system memory (complete on return)."""
        return self._copy("system", 0, timeout, stream)

    def copy_to_device(self, device_id, timeout=1.0, stream=None):
        """The seed's name for a copy between devices: copy_to_cuda(DEVICE_ID)."""
        return self._copy("cuda", device_id, timeout, stream)

    def _copy(self, storage, device, timeout, stream):
        buffer = ctypes.c_void_p()
        if self._pool.handle is None:
            raise Closed("copy: the pool's handle is closed", _capi.ECLOSED)
        _check(lib.xmem_pool_copy(self._pool.handle, self._live_buffer(), _storage_code(storage), int(device),
                                  _timeout_ns(timeout), _stream_handle(stream), ctypes.byref(buffer)),
               "copy_to_" + ("cpu" if storage == "system" else "cuda"))
        return self._pool.writable(buffer)


class Frame(BufferGuard):
    """One frame of a pool: its metadata, and its bytes without a copy."""

    def __init__(self, buffer, pool, stream=None):
        self._hold = _Hold(buffer, stream)
        # The stream the frame is ready on (it waited for the producer's writes), or
        # None: ready for any stream.
        self._stream = stream
        self._pool = pool  # keeps the pool handle alive while frames are
        # numpy keeps the object it read __array_interface__ from (this frame) as
        # its array's base: once an array was made, the frame holds the slot until
        # it is garbage, which is after every such array.
        self._exported = False
        self._released = False
        meta = lib.xmem_buffer_meta(buffer).contents
        fmt = lib.xmem_buffer_format(buffer)
        self.meta = FrameMeta(meta, fmt.decode(errors="replace") if fmt else "")

    def _buffer(self):
        if self._released:
            raise ValueError("frame %d was released" % self.meta.seq)
        return self._hold.buffer

    _live_buffer = _buffer

    def writable(self):
        """Whether the frame may be written in place: True when this process is its only
        holder and holds it once (this Frame is its one reference here). The frame is
        then this process's alone until it is released (other processes' get() refuse
        it), and arrays and capsules made from it after this call are writable. False
        while others hold it (copy-on-write: write a copy). Never copies; no syscall."""
        return bool(lib.xmem_buffer_try_make_writable(self._buffer()))

    def _read_only(self):
        """Whether arrays of the frame must be read-only: as writable() last left it."""
        return not lib.xmem_buffer_is_writable(self._buffer())

    @property
    def spilled(self):
        """Whether the frame came out of the pool's spill tier (a fifo-spill consumer's):
        host memory, or on a CUDA pool this consumer's device copy of it."""
        return bool(lib.xmem_buffer_spilled(self._buffer()))

    @property
    def data(self):
        """The payload's bytes as a read-only memoryview of the shared slot (system memory)."""
        buffer = self._buffer()
        if self.meta.storage != "system":
            raise TypeError("frame %d is in CUDA device memory: use __cuda_array_interface__ or DLPack"
                            % self.meta.seq)
        size = self.meta.size
        if size == 0:
            return memoryview(b"")
        view = memoryview(_bytes_at(lib.xmem_buffer_data(buffer), size, self._hold)).cast("B")
        return view.toreadonly()

    def _tensor(self):
        """The frame as arrays see it: its dtype (a _capi.DTYPES entry), shape and byte
        strides (None: C-contiguous). Its tensor when it has a shape and is not planar
        video, checked against its payload (another process wrote the metadata); its
        bytes as one dimension otherwise. A dtype that is none refuses both, as the
        library does."""
        m = self.meta
        if m._dtype_code >= len(_capi.DTYPES):
            raise LayoutError("frame %d: dtype %d is not an xmem_dtype: its metadata is garbage, refused rather "
                              "than read as bytes" % (m.seq, m._dtype_code))
        if not m.shape or m.n_planes > 1:
            return _capi.DTYPES[0], (m.size,), None
        dtype = _capi.DTYPES[m._dtype_code]
        end = elements = dtype[1]
        for n, stride in zip(m.shape, m.strides):
            end += (n - 1) * stride
            elements *= n
        if 0 not in m.shape and max(end, elements) > m.size:
            raise LayoutError("frame %d: its %s tensor of shape %s and byte strides %s spans %d bytes, %d of them "
                              "elements, in a %d-byte payload" % (m.seq, dtype[0], m.shape, m.strides, end,
                                                                  elements, m.size))
        return dtype, m.shape, m.strides

    @property
    def __array_interface__(self):
        """numpy's view of the slot: the frame's tensor (dtype, shape, strides) when it
        has one, its bytes otherwise; read-only unless writable() said otherwise. The
        frame then holds its slot until it is garbage (numpy keeps the frame as the
        array's base): for an address alone, ptr does not."""
        buffer = self._buffer()
        if self.meta.storage != "system":
            raise AttributeError("__array_interface__: frame %d is in CUDA device memory" % self.meta.seq)
        dtype, shape, strides = self._tensor()
        return {
            "version": 3,
            "shape": shape,
            "typestr": _typestr(self.meta.seq, dtype),
            "data": (_exported(self, lib.xmem_buffer_data(buffer) or 0), self._read_only()),
            "strides": strides,
        }

    def _address(self):
        buffer = self._buffer()
        if self.meta.storage == "cuda":
            return lib.xmem_buffer_device_ptr(buffer)
        return lib.xmem_buffer_data(buffer) or 0

    @property
    def __cuda_array_interface__(self):
        """The device slot for CuPy, Numba or torch (version 3), its tensor as for
        __array_interface__. Ready on any stream: receive() waited for the producer's
        writes."""
        if self.meta.storage != "cuda":
            raise AttributeError("__cuda_array_interface__: frame %d is in system memory" % self.meta.seq)
        dtype, shape, strides = self._tensor()
        return {
            "version": 3,
            "shape": shape,
            "typestr": _typestr(self.meta.seq, dtype),
            "data": (_exported(self, self._address()), self._read_only()),
            "strides": strides,
            "stream": self._stream,
        }

    def __dlpack_device__(self):
        if self.meta.storage == "cuda":
            return (_dlpack.CUDA, self.meta.device)
        return (_dlpack.CPU, 0)

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        """A DLPack capsule of the slot, its tensor as for __array_interface__ (any dtype,
        bfloat16 too; strides in elements): versioned (DLPack 1.0, read-only flag set
        unless writable() said otherwise) when MAX_VERSION allows it, legacy otherwise.
        The capsule keeps the slot until its consumer's deleter runs. Without COPY, or
        with copy=False, it is the slot itself (numpy.from_dlpack(frame) is read-only and
        shares it); with copy=True (numpy.from_dlpack(frame, copy=True)) it is a copy of a
        system-memory frame that its consumer owns (IS_COPIED, not read-only), which
        keeps no slot; a device frame is not copied here (take it, then copy with the
        framework). Another DL_DEVICE is refused. STREAM is where the consumer will use
        it: a frame received on another stream is waited for on the CPU first (one
        received without a stream is ready for any)."""
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError("frame %d is on %s, not %s" % (self.meta.seq, self.__dlpack_device__(), dl_device))
        versioned = max_version is not None and tuple(max_version)[0] >= 1
        dtype, shape, strides = self._tensor()
        elements = _element_strides(self.meta.seq, dtype, strides)
        kind = (dtype[2], dtype[1])
        if copy:
            if self.meta.storage != "system":
                raise BufferError("frame %d is in CUDA device memory: copy=True is not made here (export it "
                                  "without a copy, then copy it with the framework)" % self.meta.seq)
            size = self.meta.size
            owned = (ctypes.c_uint8 * max(size, 1))()
            if size:
                ctypes.memmove(owned, self._address(), size)
            return _dlpack.capsule(ctypes.addressof(owned), shape, elements, kind, (_dlpack.CPU, 0), owned,
                                   versioned, read_only=False, copied=True)
        address = self._address()
        wanted = _stream_handle(stream) if isinstance(stream, int) and stream > 2 else None
        if self._stream is not None and wanted != self._stream:
            _check(_capi.lib.xmem_cuda_synchronize(self.meta.device, self._stream), "synchronize")
            self._stream = None
        return _dlpack.capsule(address, shape, elements, kind, self.__dlpack_device__(), self._hold, versioned,
                               read_only=self._read_only())

    def planes(self):
        """The video planes as read-only numpy arrays with their real strides: NV12 Y
        (h, w) and UV (h/2, w/2, 2); I420/YV12/Y444 Y, U, V; packed RGB formats (h, w, c);
        GRAY8 (h, w); P010_10LE Y (h, w, 2) and UV (h/2, w/2, 4), as bytes. The formats and
        their planes are the library's (xmem_video_plane), as the producer laid them out."""
        import numpy

        if self.meta.storage != "system":
            raise TypeError("planes(): frame %d is in CUDA device memory" % self.meta.seq)
        fmt, width, height = _video_format(self.meta.format)
        layout = _plane_layout(fmt)
        if layout is None:
            raise ValueError("planes(): no plane layout for format %r" % fmt)
        if self.meta.n_planes != len(layout):
            raise ValueError("planes(): frame %d has %d planes, %s has %d"
                             % (self.meta.seq, self.meta.n_planes, fmt, len(layout)))
        whole = _bytes_at(self._address(), self.meta.size, self._hold)
        arrays = []
        for p, (sub_w, sub_h, channels) in enumerate(layout):
            w, h = -(-width // sub_w), -(-height // sub_h)
            # The library checked that each plane starts within the payload; where it
            # ends depends on the format, known here: another process wrote the layout.
            end = self.meta.plane_offsets[p] + self.meta.plane_strides[p] * (h - 1) + w * channels
            if self.meta.plane_strides[p] < w * channels:
                raise ValueError("planes(): frame %d's plane %d has rows of %d bytes with a stride of %d: they "
                                 "overlap" % (self.meta.seq, p, w * channels, self.meta.plane_strides[p]))
            if h > 0 and w > 0 and end > self.meta.size:
                raise ValueError("planes(): frame %d's plane %d (%dx%d, stride %d, at byte %d) ends at byte %d "
                                 "of a %d-byte payload: its layout does not fit"
                                 % (self.meta.seq, p, w, h, self.meta.plane_strides[p],
                                    self.meta.plane_offsets[p], end, self.meta.size))
            shape = (h, w, channels) if channels > 1 else (h, w)
            strides = (self.meta.plane_strides[p], channels, 1) if channels > 1 else (self.meta.plane_strides[p], 1)
            a = numpy.ndarray(shape, numpy.uint8, buffer=whole, offset=self.meta.plane_offsets[p], strides=strides)
            a.flags.writeable = False
            arrays.append(a)
        return arrays

    def release(self):
        """Done with the frame: the slot goes back now, or, if arrays were made from
        it, once they are gone too. The frame cannot be used after."""
        self._released = True
        if not self._exported:
            self._hold = None

    def forget(self):
        """The seed's forget(): the frame goes without giving its reference back, which
        stays this process's until the pool's release(meta_index) or its exit (arrays
        made from it stay valid as long). The frame cannot be used after."""
        buffer = self._buffer()
        _check(lib.xmem_buffer_forget(buffer), "forget")
        self._hold.buffer = None  # freed, its reference kept
        self._released = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __repr__(self):
        return "<xmem.Frame seq=%d %s>" % (self.meta.seq, "released" if self._released else self.meta.storage)


# xmem_size_class.sync_mode, as xmem::gpu_ordering_name() names it.
_GPU_ORDERING = {0: "none", 1: "stream-memops", 2: "cpu"}

@functools.lru_cache(maxsize=None)
def _plane_layout(fmt):
    """FORMAT's planes as the library lays them out (xmem_video_plane): one (horizontal
    subsampling, vertical subsampling, bytes per sample) per plane; None for a format it
    does not know."""
    out = []
    planes = 1
    while len(out) < planes:
        nbytes, x_div, y_div = ctypes.c_uint32(), ctypes.c_uint32(), ctypes.c_uint32()
        planes = _capi.lib.xmem_video_plane(fmt.encode(), len(out), ctypes.byref(nbytes), ctypes.byref(x_div),
                                            ctypes.byref(y_div))
        if planes < 0:
            return None
        out.append((x_div.value, y_div.value, nbytes.value))
    return tuple(out)


def _video_format(caps):
    """(format, width, height) from GStreamer caps, typed or not."""
    fields = {}
    for key in ("format", "width", "height"):
        m = re.search(r"\b%s=(?:\([a-z]+\))?\s*\"?([A-Za-z0-9_]+)" % key, caps)
        if not m:
            raise ValueError("planes(): no %s in format %r" % (key, caps))
        fields[key] = m.group(1)
    return fields["format"], int(fields["width"]), int(fields["height"])


class Ticket:
    """A frame ticket (Producer.publish_ticket): one published frame of one pool, for a
    number of redemptions (Consumer.get) until it expires. Plain data for any channel:
    str(ticket) is "xmem-ticket:SLOT:SEQ:CHECK", bytes(ticket) its 24 bytes (the C
    struct); Ticket.parse() takes either back."""

    __slots__ = ("slot", "seq", "check")

    def __init__(self, slot, seq, check):
        self.slot, self.seq, self.check = int(slot), int(seq), int(check)

    @classmethod
    def parse(cls, value):
        """The ticket VALUE names: a Ticket, its str, or its bytes. BadTicket otherwise."""
        if isinstance(value, Ticket):
            return value
        t = _capi.Ticket()
        if isinstance(value, (bytes, bytearray, memoryview)) and len(value) == ctypes.sizeof(_capi.Ticket):
            ctypes.memmove(ctypes.addressof(t), bytes(value), ctypes.sizeof(t))
            if t.check == 0 or t.reserved != 0:
                raise BadTicket("not a frame ticket: %d bytes with a zero check word or reserved bits set"
                                % len(value), _capi.EBADTICKET)
            return cls(t.slot, t.seq, t.check)
        if isinstance(value, (bytes, bytearray)):
            value = bytes(value).decode(errors="replace")
        if not isinstance(value, str):
            raise TypeError("a ticket is a Ticket, its str or its bytes, not %s" % type(value).__name__)
        _check(lib.xmem_ticket_parse(value.encode(), ctypes.byref(t)), "ticket")
        return cls(t.slot, t.seq, t.check)

    def _c(self):
        t = _capi.Ticket()
        t.slot, t.seq, t.check = self.slot, self.seq, self.check
        return t

    def __str__(self):
        text = ctypes.create_string_buffer(_capi.TICKET_TEXT_MAX)
        _check(lib.xmem_ticket_format(ctypes.byref(self._c()), text, len(text)), "ticket")
        return text.value.decode()

    def __bytes__(self):
        return bytes(self._c())

    def __eq__(self, other):
        return isinstance(other, Ticket) and (self.slot, self.seq, self.check) == (other.slot, other.seq, other.check)

    def __hash__(self):
        return hash((self.slot, self.seq, self.check))

    def __repr__(self):
        return "Ticket(%r)" % str(self)


class _Pool:
    """An xmem_pool handle, closed once its Consumer or Producer and frames are gone."""

    def __init__(self, handle):
        self.handle = handle
        # Frames acquired and not yet published, by meta index (set_ref_count revokes
        # their views when it publishes one).
        self.acquired = weakref.WeakValueDictionary()

    def writable(self, buffer):
        """BUFFER (acquired, or a copy into a slot) as a WritableFrame."""
        frame = WritableFrame(buffer, self)
        self.acquired[lib.xmem_buffer_meta_index(buffer)] = frame
        return frame

    def close(self):
        if self.handle:
            lib.xmem_pool_close(self.handle)
            self.handle = None

    def __del__(self):
        self.close()


def _slot_index(index, what):
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < 2**32:
        raise ValueError("%s: a slot index, 0 to 2**32 - 1" % what)
    return index


class _Handle:
    def _get(self):
        if self._pool.handle is None:
            raise Closed("pool '%s' is closed" % self.name, _capi.ECLOSED)
        return self._pool.handle

    @property
    def format(self):
        """The pool's format (GStreamer caps for video)."""
        fmt = lib.xmem_pool_format(self._get())
        return fmt.decode(errors="replace") if fmt else ""

    def stats(self):
        s = _capi.PoolStats()
        _check(lib.xmem_pool_stats_get(self._get(), ctypes.byref(s)), "stats")
        return {name: getattr(s, name) for name, _ in _capi.PoolStats._fields_}

    def spill_stats(self):
        """The pool's spill tier: its cap, the frames and bytes it holds, its peak, frames
        spilled, and times it was full (all zero without one)."""
        s = _capi.SpillStats()
        _check(lib.xmem_pool_spill_stats(self._get(), ctypes.byref(s)), "spill_stats")
        return {name: getattr(s, name) for name, _ in _capi.SpillStats._fields_ if name != "reserved"}

    def growth_stats(self):
        """Growth on demand (create(memory_cap_mib=..., device_memory_cap_mib=...)): the
        caps and idle time, the system and the device memory of every class's committed
        slots, the dynamic slots and bytes committed now, slots committed and trimmed so
        far, and acquires refused at a cap (all zero for a pool that does not grow)."""
        s = _capi.GrowthStats()
        _check(lib.xmem_pool_growth_stats(self._get(), ctypes.byref(s)), "growth_stats")
        return {name: getattr(s, name) for name, _ in _capi.GrowthStats._fields_ if name != "reserved"}

    def ticket_stats(self):
        """The pool's frame tickets: issued, redeemed, expired (with redemptions unused),
        live (their slots still held for them)."""
        s = _capi.TicketStats()
        _check(lib.xmem_pool_ticket_stats(self._get(), ctypes.byref(s)), "ticket_stats")
        return {name: getattr(s, name) for name, _ in _capi.TicketStats._fields_ if not name.startswith("reserved")}

    @property
    def storage(self):
        return _capi.storage_name(lib.xmem_pool_storage(self._get()))

    def classes(self):
        """The pool's size classes, class 0 (the one it was created with) first: dicts of
        index, storage ('system' or 'cuda'), device, slot_size, first_slot, count,
        gpu_ordering ('stream-memops', 'cpu'; 'none' for system memory), and dynamic
        (made by acquire under the pool's memory cap)."""
        out = []
        dynamic = self.growth_stats()["dynamic_classes"]
        for i in range(lib.xmem_pool_class_count(self._get())):
            c = _capi.SizeClass()
            _check(lib.xmem_pool_class_info(self._get(), i, ctypes.byref(c)), "classes")
            out.append({"index": c.index, "storage": _capi.storage_name(c.storage),
                        "device": c.device, "slot_size": c.slot_size, "first_slot": c.first_slot,
                        "count": c.count, "gpu_ordering": _GPU_ORDERING.get(c.sync_mode, "invalid"),
                        "dynamic": bool(dynamic >> i & 1)})
        return out

    def get(self, what, seq=None):
        """A frame of the pool, with a reference of this process's own, read-only:
        - WHAT a ticket (a Ticket, its str or its bytes): one of its redemptions. Raises
          BadTicket when it is expired, used up, forged or of another pool.
        - WHAT a meta index (frame.meta_index, the seed's): that frame, while the slot
          holds it; one of its holds when set_ref_count published it for a number of
          holders (NotHeld once all are taken, or their lifetime ended). NotHeld once
          the producer reused the slot (never the newer frame), or for a frame not
          published; Error (ERANGE) for an index of no slot.
        - WHAT a plain slot index (meta_index & 1023): the frame published in that slot
          now, unless its holders are counted. With SEQ (the frame's meta.seq, sent with
          the index) only while the slot still holds that frame.
        Closed once the owner closed the pool. A device frame is ready for any stream
        (the CPU waited for its writes)."""
        buffer = ctypes.c_void_p()
        if isinstance(what, int) and not isinstance(what, bool):
            _slot_index(what, "get")
            if seq is None:
                _check(lib.xmem_pool_get(self._get(), what, ctypes.byref(buffer)), "get")
            else:
                _check(lib.xmem_pool_get_seq(self._get(), what, int(seq), ctypes.byref(buffer)), "get")
            return Frame(buffer, self._pool)
        if seq is not None:
            raise TypeError("get: seq goes with a slot index; a ticket names its frame already")
        t = Ticket.parse(what)._c()
        _check(lib.xmem_pool_get_ticket(self._get(), ctypes.byref(t), ctypes.byref(buffer)), "get")
        return Frame(buffer, self._pool)

    def get_mut(self, index):
        """The frame INDEX names (a meta index, or a slot index as for get()), writable:
        in place when this process now holds it alone (the slot is then its own until the
        frame is released, and other processes' get() refuse it), else a private copy of
        its payload (meta.size bytes) that is not a pool buffer. Frame.writable() says which arrays may
        write. Errors as get(index)."""
        buffer = ctypes.c_void_p()
        _check(lib.xmem_pool_get_mut(self._get(), _slot_index(index, "get_mut"), ctypes.byref(buffer)), "get_mut")
        return Frame(buffer, self._pool)

    def add_ref(self, index):
        """One more reference of this process's on slot INDEX, which it holds already (a
        Frame of it is alive, or an earlier add_ref()): kept with no object until
        release(INDEX), so the slot outlives the Frame (the seed's add_ref(meta_index)).
        Like every reference it is this process's own: given back when it dies. NotHeld
        when this process holds no reference on the slot; Error (ERANGE) for an index out
        of range."""
        _check(lib.xmem_pool_add_ref(self._get(), _slot_index(index, "add_ref")), "add_ref")

    def release(self, index):
        """Gives back one reference add_ref(INDEX) made; the slot goes back to the pool
        with this process's last reference. A Frame's own reference goes with the Frame
        (Frame.release()), never through this call. NotHeld when this process holds no
        reference on the slot."""
        _check(lib.xmem_pool_release(self._get(), _slot_index(index, "release")), "release")

    def ref_count(self, index):
        """This process's references on slot INDEX: its Frames' and add_ref()'s (0 when
        it holds none)."""
        return lib.xmem_pool_ref_count(self._get(), _slot_index(index, "ref_count"))

    def close(self):
        """Closes the handle; frames still held stay valid until they go."""
        self._pool.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _Producing(_Handle):
    """What every handle that writes frames can do: the owner's (Producer), and a
    consumer's as a producer besides the owner (a guest: the owner leases it the slot and
    publishes it on its behalf; docs/design.md, "Producers besides the owner")."""


    def acquire(self, timeout=None, stream=None, size=None, storage=None, device=0):
        """A free slot, writable: fill frame.buffer (system memory) or write the device
        slot through frame.__cuda_array_interface__ / DLPack, then publish it. For a
        device slot, STREAM (as for Consumer.receive) waits on the GPU until every
        consumer's reads of the slot's last frame are done: write on it, or after it.
        SIZE: a slot of SIZE bytes or more, from the smallest size class with one free
        (Error with code ERANGE when no class is that large); None: of class 0.
        STORAGE ('system' or 'cuda', on DEVICE): a slot of that memory, in a pool that
        holds classes of both (preallocate); None: the first class's memory."""
        buffer = ctypes.c_void_p()
        handle = _stream_handle(stream)
        if storage is None:
            _check(lib.xmem_pool_acquire_size(self._get(), int(size or 0), _timeout_ns(timeout), handle,
                                              ctypes.byref(buffer)), "acquire")
        else:
            storage_code = _storage_code(storage)
            _check(lib.xmem_pool_acquire_memory(self._get(), int(size or 0), storage_code, int(device),
                                                _timeout_ns(timeout), handle, ctypes.byref(buffer)), "acquire")
        return self._writable(buffer)

    def _writable(self, buffer):
        return self._pool.writable(buffer)

    def set_ref_count(self, meta_index, count, lifetime=_capi.HOLD_LIFETIME):
        """The seed's set_ref_count: publishes the frame META_INDEX names, which this
        process acquired, wrote and has not published, for exactly COUNT holders in any
        processes: each get(META_INDEX) takes one of them, and the slot comes back as soon
        as those holders let go. Holds nobody took within LIFETIME seconds go back then (a
        holder whose process died before its get). The frame's meta_index stays readable;
        forget() it (or let it go). A payload size not set is the whole slot. Error
        (EINVAL) for COUNT < 1 or over the pool's consumer limit, NotHeld when no frame of
        that index is being written here."""
        if isinstance(count, bool) or not isinstance(count, int) or not -2**31 <= count < 2**31:
            raise ValueError("set_ref_count: count must be an int of 32 bits, not %r" % (count,))
        if not lifetime > 0:
            raise ValueError("set_ref_count: lifetime must be a positive number of seconds, not %r" % (lifetime,))
        index = _slot_index(meta_index, "set_ref_count")
        frame = self._pool.acquired.get(index)
        status = lib.xmem_pool_set_ref_count(self._get(), index, count, min(int(lifetime * 1e9), _capi.FOREVER))
        if frame is not None and frame._raw is not None and lib.xmem_buffer_capacity(frame._raw) == 0:
            frame._published(index)  # its guard was taken, published or refused
        _check(status, "set_ref_count")

    def copy(self, frame, storage, device=0, timeout=None, stream=None):
        """A copy of FRAME (a received or acquired frame) that is a slot of this pool, of
        STORAGE ('system' or 'cuda', on DEVICE), with its bytes and metadata: publish it
        or make a ticket of it like an acquired frame. Into device memory the copy is
        queued on STREAM (publish on the same stream); into system memory it is complete
        on return. Error (ERANGE) when no class of that memory holds the payload."""
        storage_code = _storage_code(storage)
        buffer = ctypes.c_void_p()
        _check(lib.xmem_pool_copy(self._get(), frame._live_buffer(), storage_code, int(device),
                                  _timeout_ns(timeout), _stream_handle(stream), ctypes.byref(buffer)), "copy")
        return self._writable(buffer)

    def publish(self, frame, size=None, pts=None, stream=None, *, dts=None, duration=None, flags=None,
                content_type=None, dtype=None, shape=None, strides=None, capture_time=None):
        """Publishes an acquired frame: SIZE bytes of it, by default all of it, or the
        bytes its tensor spans. For a device pool the frame is ready once the work
        queued on STREAM so far is done: consumers' streams wait for it on the GPU, and
        nobody waits on the CPU (without a stream, the CPU waits for this process's work
        on the device first).

        Metadata, each left as acquire() made it (or as written through the C metadata)
        when not given: PTS, DTS and DURATION in nanoseconds; FLAGS, 32 bits of the
        application's; CONTENT_TYPE, a str of at most 31 bytes in UTF-8 ("tensor");
        CAPTURE_TIME, when the frame was captured as time.time_ns() counts (realtime
        nanoseconds since 1970), which consumers on other hosts can compare with.

        A tensor, as consumers' numpy.asarray(frame) and torch.from_dlpack(frame) will
        see it: DTYPE, a name ("float32", "bfloat16"), a numpy dtype or a torch dtype;
        SHAPE in elements, at most 8 dimensions; STRIDES in bytes, each a multiple of the
        element's size, C-contiguous by default. SIZE may not be less than the bytes the
        tensor spans. DTYPE without SHAPE: one dimension, as many elements as SIZE (or
        the slot) holds.

        A bad argument raises ValueError or TypeError (or Error, from the library) and
        leaves the frame acquired, to publish again."""
        handle = self._prepare(frame, size, pts, stream, dts=dts, duration=duration, flags=flags,
                               content_type=content_type, dtype=dtype, shape=shape, strides=strides,
                               capture_time=capture_time)
        _check(lib.xmem_pool_publish_on_stream(self._get(), frame._take(), handle), "publish")

    def publish_ticket(self, frame, redemptions=1, ttl=1.0, size=None, pts=None, stream=None, **metadata):
        """Publishes an acquired frame to no queue and returns a Ticket for it, which
        REDEMPTIONS Consumer.get() calls (any processes attached to the pool) may redeem
        within TTL seconds: send str(ticket) or bytes(ticket) over any channel. The slot
        stays held until every redemption is made or the TTL runs out; then its
        references left go back, so a consumer that dies before redeeming leaks nothing.
        SIZE, PTS, STREAM and the keyword METADATA as for publish()."""
        if isinstance(redemptions, bool) or operator.index(redemptions) < 1 or redemptions >= 1 << 32:
            raise ValueError("redemptions must be 1 to 2**32 - 1, not %r" % (redemptions,))
        if not ttl > 0:
            raise ValueError("ttl must be a positive number of seconds, not %r" % (ttl,))
        handle = self._prepare(frame, size, pts, stream, **metadata)
        t = _capi.Ticket()
        _check(lib.xmem_pool_publish_ticket(self._get(), frame._take(), int(redemptions),
                                            min(int(ttl * 1e9), _capi.FOREVER), handle, ctypes.byref(t)),
               "publish_ticket")
        return Ticket(t.slot, t.seq, t.check)

    def _prepare(self, frame, size, pts, stream, *, dts=None, duration=None, flags=None, content_type=None,
                 dtype=None, shape=None, strides=None, capture_time=None):
        """Checks publish()'s arguments and writes them into FRAME's metadata; the
        stream's handle. Nothing is written when an argument is bad."""
        if not isinstance(frame, WritableFrame):
            raise TypeError("publish() takes a frame from acquire()")
        self._get()
        buffer = frame._live_buffer()
        handle = _stream_handle(stream)
        times = {key: _nanoseconds(value, key) for key, value in (("pts", pts), ("dts", dts), ("duration", duration))
                 if value is not None}
        if flags is not None and not 0 <= operator.index(flags) < 1 << 32:
            raise ValueError("flags must be 0 to 2**32 - 1, not %d" % flags)
        if capture_time is not None and (isinstance(capture_time, bool)
                                         or not 0 < operator.index(capture_time) < 1 << 64):
            raise ValueError("capture_time must be realtime nanoseconds since 1970 (time.time_ns()), "
                             "1 to 2**64 - 1, not %r" % (capture_time,))
        if content_type is not None:
            if not isinstance(content_type, str):
                raise TypeError("content_type must be a str")
            encoded = content_type.encode()
            if len(encoded) >= _capi.CONTENT_TYPE_MAX or b"\0" in encoded:
                raise ValueError("content_type %r is %d bytes in UTF-8: at most %d fit, without a NUL "
                                 "(XMEM_CONTENT_TYPE_MAX)" % (content_type, len(encoded), _capi.CONTENT_TYPE_MAX - 1))
        if size is not None:
            size = int(size)
            if not 0 <= size <= frame.capacity:
                raise ValueError("size %d: the slot holds %d bytes" % (size, frame.capacity))
        if strides is not None and shape is None:
            raise ValueError("strides without a shape")
        meta = lib.xmem_buffer_meta_mut(buffer).contents
        if dtype is not None or shape is not None:
            size = self._set_tensor(frame, size, dtype, shape, strides)
        # Without a size: a copy's own (Producer.copy), else the whole slot.
        meta.size = (meta.size or frame.capacity) if size is None else size
        for key, value in times.items():
            setattr(meta, key, value)
        if flags is not None:
            meta.flags = flags
        if capture_time is not None:
            meta.capture_time = capture_time
        if content_type is not None:
            meta.content_type = encoded
        return handle

    @staticmethod
    def _set_tensor(frame, size, dtype, shape, strides):
        """Writes publish()'s tensor into FRAME's metadata; the size to publish."""
        code = _capi.DTYPE_CODES["uint8"] if dtype is None else _dtype_code(dtype)
        name, item, _ = _capi.DTYPES[code]
        if shape is None:
            if size is not None and size % item:
                raise ValueError("size %d is not a whole number of %s elements (%d bytes each)" % (size, name, item))
            shape = ((frame.capacity if size is None else size) // item,)
        shape = _dims(shape, "shape")
        if not shape:
            raise ValueError("shape (): a frame without a shape is bytes; give a tensor one dimension at least")
        c_strides = None
        if strides is not None:
            strides = _dims(strides, "strides")
            if len(strides) != len(shape):
                raise ValueError("strides %s for shape %s: one stride a dimension" % (strides, shape))
            c_strides = (ctypes.c_uint64 * len(strides))(*strides)
        buffer = frame._live_buffer()
        _check(lib.xmem_buffer_set_tensor(buffer, code, len(shape), (ctypes.c_uint64 * len(shape))(*shape), c_strides),
               "publish: a %s tensor of shape %s" % (name, shape))
        spans = lib.xmem_buffer_meta(buffer).contents.size
        if size is not None and size < spans:
            raise ValueError("size %d is less than the %d bytes the %s tensor of shape %s spans"
                             % (size, spans, name, shape))
        return spans if size is None else size


class Consumer(_Producing):
    """A consumer of a pool: receive() frames, or iterate until end of stream. It may
    produce too: acquire(), publish() and publish_ticket() as a guest of the owner."""

    def __init__(self, name, timeout=None, queue_size=0, policy=None, fallback="drop-oldest", block_timeout=None,
                 client="python", wake="sleep", spin_budget=200e-6, spill_delivery="device", max_age=None,
                 max_held=0, history=0):
        options = _capi.OpenOptions()
        lib.xmem_open_options_init(ctypes.byref(options))
        options.timeout_ns = 0 if timeout == 0 else _timeout_ns(timeout)
        options.queue_size = int(queue_size)
        self._client = client.encode()
        options.client = self._client
        if policy is not None:
            options.policy = _policy_code(policy)
            options.has_policy = 1
        if fallback not in ("drop-oldest", "drop-new"):
            raise ValueError("fallback must be 'drop-oldest' or 'drop-new'")
        options.fallback = _capi.POLICIES[fallback]
        if block_timeout is not None:
            if block_timeout <= 0:
                raise ValueError("block_timeout must be positive (seconds)")
            options.block_timeout_ns = int(block_timeout * 1e9)
        if wake not in ("sleep", "spin-before"):
            raise ValueError("wake must be 'sleep' or 'spin-before'")
        options.wake = 1 if wake == "spin-before" else 0
        if not 1e-6 <= spin_budget <= 1.0:
            raise ValueError("spin_budget must be 1 µs to 1 s (seconds)")
        options.spin_budget_us = int(round(spin_budget * 1e6))
        if spill_delivery not in ("device", "host"):
            raise ValueError("spill_delivery must be 'device' or 'host'")
        options.spill_delivery = 1 if spill_delivery == "host" else 0
        if max_age is not None:
            if not 1e-6 <= max_age <= (2**32 - 1) / 1e6:
                raise ValueError("max_age must be 1 µs to 4294 s (seconds), or None for no limit")
            options.max_age_us = int(round(max_age * 1e6))
        for what, value in (("max_held", max_held), ("history", history)):
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**32:
                raise ValueError("%s must be a whole number of frames, 0 to 2**32 - 1" % what)
        options.max_held = max_held
        options.history = history
        handle = ctypes.c_void_p()
        self.name = name
        _check(lib.xmem_pool_open(_name(name), ctypes.byref(options), ctypes.byref(handle)), "open " + name)
        self._pool = _Pool(handle)

    def receive(self, timeout=None, stream=None):
        """The next frame; raises Timeout, EndOfStream or Closed, and FrameRefused for a
        frame whose layout did not fit its slot (receive again). For a device pool,
        STREAM (a CUstream as an int, or a torch.cuda.Stream or CuPy stream) is made to
        wait on the GPU for the producer's writes, and the CPU does not wait; without
        one the CPU waits, and the frame is ready for any stream."""
        buffer = ctypes.c_void_p()
        handle = _stream_handle(stream)
        _check(lib.xmem_pool_receive_on_stream(self._get(), _timeout_ns(timeout), handle, ctypes.byref(buffer)),
               "receive")
        return Frame(buffer, self._pool, handle)

    def fileno(self):
        """Polls readable when receive() may return without waiting."""
        return lib.xmem_pool_fd(self._get())

    def frames_refused(self):
        """Frames this handle refused (FrameRefused): their layout did not fit their slot."""
        return lib.xmem_pool_frames_refused(self._get())

    def consumer_stats(self):
        """How the owner serves this consumer: its policy (and fallback, block timeout),
        queue size, frames queued now, received, dropped and spilled."""
        s = _capi.ConsumerStats()
        _check(lib.xmem_pool_consumer_stats(self._get(), ctypes.byref(s)), "consumer_stats")
        out = {name: getattr(s, name) for name, _ in _capi.ConsumerStats._fields_ if name != "reserved"}
        out["policy"] = _capi.POLICY_NAMES.get(s.policy, "invalid")
        out["fallback"] = _capi.POLICY_NAMES.get(s.fallback, "invalid")
        return out

    def __iter__(self):
        """Frames until end of stream; refused frames are skipped (and counted)."""
        while True:
            try:
                yield self.receive()
            except FrameRefused:
                continue
            except EndOfStream:
                return

    async def frames(self):
        """Frames for ``async for``, until end of stream: the event loop watches the
        pool's fd (no thread, no busy wait); refused frames are skipped (and counted).
        Raises Closed when the producer goes."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                yield self.receive(timeout=0)
                continue
            except FrameRefused:
                continue
            except Timeout:
                pass
            except EndOfStream:
                return
            ready = loop.create_future()
            fd = self.fileno()
            loop.add_reader(fd, lambda: ready.done() or ready.set_result(None))
            try:
                await ready
            finally:
                loop.remove_reader(fd)


class Producer(_Producing):
    """The owner of a pool: acquire() a slot, fill it, publish() it."""

    def __init__(self, name, slot_size, slots=8, format="", policy="drop-oldest", storage="system", device=0,
                 mode=0o600, group=None, spill_bytes=0, spill_frames=0, max_slots=0, memory_cap_mib=0,
                 trim_idle_ms=0, device_memory_cap_mib=0):
        policy_code, storage_code = _policy_code(policy), _storage_code(storage)
        config = _capi.PoolConfig()
        lib.xmem_pool_config_init(ctypes.byref(config))
        config.slot_count = int(slots)
        config.slot_size = int(slot_size)
        config.policy = policy_code
        config.format = format.encode()
        config.producer = b"python"
        config.storage = storage_code
        config.device = int(device)
        config.mode = int(mode)
        config.spill_bytes = int(spill_bytes)
        config.spill_frames = int(spill_frames)
        config.max_slots = int(max_slots)
        config.memory_cap_mib = int(memory_cap_mib)
        config.trim_idle_ms = int(trim_idle_ms)
        config.device_memory_cap_mib = int(device_memory_cap_mib)
        if group is not None:
            config.has_group = 1
            config.group = group if isinstance(group, int) else grp.getgrnam(group).gr_gid
        handle = ctypes.c_void_p()
        self.name = name
        _check(lib.xmem_pool_create(_name(name), ctypes.byref(config), ctypes.byref(handle)), "create " + name)
        self._pool = _Pool(handle)

    def preallocate(self, slot_size, count, storage=None, device=0):
        """Adds a size class of COUNT slots of SLOT_SIZE bytes, allocated now, and returns
        its index. STORAGE ('system' or 'cuda', by default the pool's) and DEVICE may
        differ from the first class's: system memory and CUDA devices side by side
        (acquire(storage=...) takes their slots). Consumers attached or to come take its
        frames like any other."""
        storage = storage or self.storage
        storage_code = _storage_code(storage)
        index = ctypes.c_uint32()
        _check(lib.xmem_pool_preallocate(self._get(), int(slot_size), int(count), storage_code,
                                         int(device), ctypes.byref(index)), "preallocate")
        return index.value

    def set_format(self, caps):
        _check(lib.xmem_pool_set_format(self._get(), caps.encode()), "set_format")

    def end_of_stream(self):
        _check(lib.xmem_pool_end_of_stream(self._get()), "end_of_stream")


class WritableFrame(BufferGuard):
    """A slot acquired for writing: ``buffer`` is a writable memoryview of it."""

    def __init__(self, buffer, pool):
        self._raw = buffer
        self._pool = pool
        self.capacity = lib.xmem_buffer_capacity(buffer)
        self.storage = _capi.storage_name(lib.xmem_buffer_storage(buffer))
        self._views = []
        # The meta index set_ref_count published it under (None before; kept until
        # forget()), and whether it was forgotten.
        self._published_index = None
        self._forgotten = False

    def _live_buffer(self):
        if self._raw is None:
            raise ValueError("this frame was already published or released")
        return self._raw

    def _revoke_views(self):
        # Views handed out stop working: the slot is the consumers' now. One that
        # something else still exports from (a numpy array) cannot be revoked.
        for view in self._views:
            try:
                view.release()
            except BufferError:
                pass
        self._views = []

    def _take(self):
        self._live_buffer()
        self._revoke_views()
        raw, self._raw = self._raw, None
        return raw

    def _published(self, meta_index):
        """set_ref_count took the frame's guard (published it, or refused it and gave the
        slot back): the husk goes, the meta index stays readable."""
        lib.xmem_buffer_release(self._take())  # an empty guard: nothing to release
        self._published_index = meta_index

    @property
    def meta_index(self):
        if self._forgotten:
            raise ValueError("meta_index: this frame was forgotten")
        if self._raw is None and self._published_index is not None:
            return self._published_index
        return BufferGuard.meta_index.fget(self)

    @property
    def buffer(self):
        raw = self._live_buffer()
        if self.storage != "system":
            raise TypeError("a device slot has no CPU buffer")
        view = memoryview(_bytes_at(lib.xmem_buffer_data_mut(raw), self.capacity, self)).cast("B")
        self._views.append(view)
        return view

    @property
    def __cuda_array_interface__(self):
        """The device slot, writable, for CuPy, Numba or torch (version 3)."""
        raw = self._live_buffer()
        if self.storage != "cuda":
            raise AttributeError("__cuda_array_interface__: this slot is in system memory")
        address = lib.xmem_buffer_device_ptr(raw)
        return {"version": 3, "shape": (self.capacity,), "typestr": "|u1", "data": (address, False),
                "strides": None, "stream": None}

    def __dlpack_device__(self):
        if self.storage == "cuda":
            return (_dlpack.CUDA, lib.xmem_buffer_device(self._raw) if self._raw else 0)
        return (_dlpack.CPU, 0)

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        """The slot, writable, as a DLPack capsule: for writing a frame with a framework
        (a tensor's copy_() on a stream). Publish only once that work is queued, and
        pass its stream to publish()."""
        raw = self._live_buffer()
        if copy:
            raise BufferError("xmem slots are exported without copying (copy=True refused)")
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError("this slot is on %s, not %s" % (self.__dlpack_device__(), dl_device))
        if self.storage == "cuda":
            address = lib.xmem_buffer_device_ptr(raw)
        else:
            address = lib.xmem_buffer_data_mut(raw) or 0
        versioned = max_version is not None and tuple(max_version)[0] >= 1
        # The capsule keeps this object; publishing it while a tensor still writes
        # is the caller's ordering to get right (the stream passed to publish()).
        return _dlpack.capsule(address, (self.capacity,), None, ("u", 1), self.__dlpack_device__(), self, versioned,
                               read_only=False)

    def forget(self):
        """The seed's forget(): once the frame is published (set_ref_count, publish_ticket,
        publish), nothing is left to give back; its meta_index goes. Error before: a slot
        forgotten unpublished would stay taken until the pool closes."""
        if self._raw is not None:
            raise Error("forget: the frame is not published: set_ref_count() or publish() it first, "
                        "or release() it", _capi.EINVAL)
        self._forgotten = True

    def release(self):
        """Gives the slot back unpublished."""
        if self._raw is not None:
            lib.xmem_buffer_release(self._take())

    def __del__(self):
        self.release()


def open(name, timeout=None, queue_size=0, policy=None, fallback="drop-oldest", block_timeout=None,  # noqa: A001
         client="python", wake="sleep", spin_budget=200e-6, spill_delivery="device", max_age=None,
         max_held=0, history=0):
    """Attaches to pool NAME, waiting up to TIMEOUT seconds for it (None: forever).
    POLICY is how this consumer is served ("fifo", "latest", "drop-oldest", "drop-new",
    "fifo-spill"; None: the pool's); FALLBACK what fifo and fifo-spill do once the wait
    (BLOCK_TIMEOUT seconds, None: the pool's) or the spill tier runs out; QUEUE_SIZE
    its queue depth (0: the policy's default). WAKE "spin-before" polls the queue near
    each expected frame instead of sleeping, at most SPIN_BUDGET seconds a frame.
    SPILL_DELIVERY, for fifo-spill on a CUDA pool: "device" (spilled frames come back
    as device frames, this consumer's copies) or "host" (the tier's host memory).
    MAX_AGE (seconds; None: no limit): a frame older than that (by its monotonic timestamp)
    when receive() would hand it out is given back unread and counted
    (consumer_stats()["expired"]), whatever the policy.
    MAX_HELD: the most slots it holds at once, queued or kept (frames it has not let
    go); at its cap it is given no more frames until it lets one go (consumer_stats()
    "held", "max_held"). 0: half the pool's slots. A frame copied (copy_to_cpu()) and
    released keeps its pixels without its slot.
    HISTORY: it is first given up to that many of the newest frames published before it
    attached that are still in the pool, oldest first, then the live stream."""
    return Consumer(name, timeout=timeout, queue_size=queue_size, policy=policy, fallback=fallback,
                    block_timeout=block_timeout, client=client, wake=wake, spin_budget=spin_budget,
                    spill_delivery=spill_delivery, max_age=max_age, max_held=max_held, history=history)


def create(name, slot_size, slots=8, format="", policy="drop-oldest", storage="system", device=0, mode=0o600,
           group=None, spill_bytes=0, spill_frames=0, max_slots=0, memory_cap_mib=0, trim_idle_ms=0,
           device_memory_cap_mib=0):
    """Creates pool NAME and becomes its producer. MODE says who may attach, as file
    permission bits (0o660: GROUP's members too); GROUP is a gid or a group name the
    caller is a member of (None: the caller's group). NAME "@name" is an abstract socket.
    SPILL_BYTES (and SPILL_FRAMES) give the pool a spill tier for fifo-spill consumers.
    MAX_SLOTS bounds the slots of every size class (Producer.preallocate) together; 0:
    SLOTS + 64. MEMORY_CAP_MIB lets acquire() make system-memory slots on demand while
    every class's slots hold at most that much; a free one made so gives its memory
    back once not acquired for TRIM_IDLE_MS (0: 10 s). DEVICE_MEMORY_CAP_MIB does the
    same for CUDA device memory, each device's within that cap."""
    return Producer(name, slot_size, slots=slots, format=format, policy=policy, storage=storage, device=device,
                    mode=mode, group=group, spill_bytes=spill_bytes, spill_frames=spill_frames, max_slots=max_slots,
                    memory_cap_mib=memory_cap_mib, trim_idle_ms=trim_idle_ms,
                    device_memory_cap_mib=device_memory_cap_mib)


from .seed import BufferPool  # noqa: E402 (it builds on the classes above)
