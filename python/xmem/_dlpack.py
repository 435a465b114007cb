"""_dlpack.py - DLPack capsules over a frame's tensor, legacy ("dltensor") and versioned
("dltensor_versioned", DLPack 1.0), with the spec's ownership rules: the consumer that
takes a capsule renames it "used_..." and calls the tensor's deleter when done; a
capsule nobody took calls it when it is collected. The deleter drops the frame's hold,
so the slot goes back once the tensor is gone."""

import ctypes
import threading

CPU, CUDA = 1, 2  # kDLCPU, kDLCUDA
# DLDataTypeCode of each xmem dtype kind (_capi.DTYPES): kDLInt, kDLUInt, kDLFloat, kDLBfloat.
TYPE_CODES = {"i": 0, "u": 1, "f": 2, "bf": 4}
FLAG_READ_ONLY = 1 << 0
FLAG_IS_COPIED = 1 << 1


class Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", Device),
        ("ndim", ctypes.c_int32),
        ("dtype", DataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class ManagedTensor(ctypes.Structure):
    pass


_Deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
ManagedTensor._fields_ = [("dl_tensor", Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _Deleter)]


class Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class ManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("version", Version),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", _Deleter),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", Tensor),
    ]


_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]

# Every tensor handed out, by address: what keeps its structs and the slot alive.
_live = {}
_live_lock = threading.Lock()


def _delete(address):
    with _live_lock:
        _live.pop(address, None)  # drops the structs and the frame's hold


_deleter = _Deleter(_delete)


@ctypes.CFUNCTYPE(None, ctypes.c_void_p)
def _capsule_destructor(capsule):
    # Taken capsules were renamed "used_..." and their taker calls the deleter.
    for name in (b"dltensor", b"dltensor_versioned"):
        if _api.PyCapsule_IsValid(capsule, name):
            _delete(_api.PyCapsule_GetPointer(capsule, name))


def capsule(address, shape, strides, dtype, device, hold, versioned, read_only, copied=False):
    """A capsule of a tensor at ADDRESS: SHAPE, STRIDES in elements (None: C-contiguous),
    DTYPE (kind, bytes an element) as in _capi.DTYPES, on DEVICE ((type, id)), keeping
    HOLD until its deleter runs; COPIED: the bytes are a copy the capsule's consumer
    owns (DLPack 1.0's IS_COPIED flag)."""
    ndim = len(shape)
    shape_array = (ctypes.c_int64 * ndim)(*shape)
    strides_array = (ctypes.c_int64 * ndim)(*strides) if strides else None
    managed = ManagedTensorVersioned() if versioned else ManagedTensor()
    t = managed.dl_tensor
    t.data = address
    t.device = Device(*device)
    t.ndim = ndim
    kind, itemsize = dtype
    t.dtype = DataType(TYPE_CODES[kind], itemsize * 8, 1)
    t.shape = ctypes.cast(shape_array, ctypes.POINTER(ctypes.c_int64))
    t.strides = ctypes.cast(strides_array, ctypes.POINTER(ctypes.c_int64)) if strides_array else None
    t.byte_offset = 0
    managed.deleter = _deleter
    if versioned:
        managed.version = Version(1, 0)
        managed.flags = (FLAG_READ_ONLY if read_only else 0) | (FLAG_IS_COPIED if copied else 0)
    key = ctypes.addressof(managed)
    with _live_lock:
        _live[key] = (managed, shape_array, strides_array, hold)
    name = b"dltensor_versioned" if versioned else b"dltensor"
    return _api.PyCapsule_New(key, name, ctypes.cast(_capsule_destructor, ctypes.c_void_p))


def live_count():
    """Tensors handed out whose deleter has not run (for tests)."""
    with _live_lock:
        return len(_live)
