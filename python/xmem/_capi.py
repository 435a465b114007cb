"""_capi.py - libxmem's C API (xmem.h) through ctypes: one build for every CPython.

The library is found, in order: at XMEM_LIBRARY (a path), beside this module (a
wheel carries its own libxmem.so), by the dynamic loader (an install, or
LD_LIBRARY_PATH), then in a build tree beside this package (build/lib/libxmem.so.0
under the repository root).
"""

import ctypes
import os

MAX_DIMS = 8
MAX_PLANES = 4
FOREVER = (1 << 63) - 1
NO_META_INDEX = (1 << 32) - 1
HOLD_LIFETIME = 10.0  # seconds: XMEM_HOLD_LIFETIME_NS
NONE = (1 << 64) - 1

OK = 0
EINVAL, ENAME, ENOENT, EACCES, EBUSY, ENOTPOOL, EVERSION, EBADSEG = -1, -2, -3, -4, -5, -6, -7, -8
ERANGE, ETIMEDOUT, ECLOSED, EEOS, EFULL, ENOTHELD, EREADONLY, EROLE = -9, -10, -11, -12, -13, -14, -15, -16
ESYSTEM, ENOMEM, EBADFRAME, EBADTICKET = -17, -18, -19, -20

STORAGE_SYSTEM, STORAGE_CUDA = 0, 1
CONTENT_TYPE_MAX = 32  # bytes, the terminating NUL included

# xmem_dtype, by value: (name, bytes an element, kind). The kind is numpy's typestr
# letter ("u", "i", "f"), or "bf" for bfloat16, which numpy has no type for.
DTYPES = (
    ("uint8", 1, "u"), ("int8", 1, "i"), ("uint16", 2, "u"), ("int16", 2, "i"),
    ("uint32", 4, "u"), ("int32", 4, "i"), ("uint64", 8, "u"), ("int64", 8, "i"),
    ("float16", 2, "f"), ("bfloat16", 2, "bf"), ("float32", 4, "f"), ("float64", 8, "f"),
)
DTYPE_CODES = {name: code for code, (name, _, _) in enumerate(DTYPES)}


class FrameMeta(ctypes.Structure):
    _fields_ = [
        ("index", ctypes.c_uint32),
        ("storage_type", ctypes.c_uint8),
        ("device_id", ctypes.c_uint8),
        ("dtype", ctypes.c_uint8),
        ("ndim", ctypes.c_uint8),
        ("shape", ctypes.c_uint64 * MAX_DIMS),
        ("strides", ctypes.c_uint64 * MAX_DIMS),
        ("size", ctypes.c_uint64),
        ("timestamp", ctypes.c_uint64),
        ("seq", ctypes.c_uint64),
        ("pts", ctypes.c_uint64),
        ("dts", ctypes.c_uint64),
        ("duration", ctypes.c_uint64),
        ("flags", ctypes.c_uint32),
        ("producer_pid", ctypes.c_uint32),
        ("format_seq", ctypes.c_uint64),
        ("n_planes", ctypes.c_uint32),
        ("plane_stride", ctypes.c_uint32 * MAX_PLANES),
        ("reserved0", ctypes.c_uint32),
        ("plane_offset", ctypes.c_uint64 * MAX_PLANES),
        ("content_type", ctypes.c_char * 32),
        ("producer", ctypes.c_char * 32),
        ("capture_time", ctypes.c_uint64),
        ("reserved", ctypes.c_uint64 * 7),
    ]


class PoolConfig(ctypes.Structure):
    _fields_ = [
        ("slot_count", ctypes.c_uint32),
        ("slot_size", ctypes.c_uint64),
        ("max_consumers", ctypes.c_uint32),
        ("policy", ctypes.c_int),
        ("block_timeout_ns", ctypes.c_uint64),
        ("mode", ctypes.c_uint32),
        ("format", ctypes.c_char_p),
        ("producer", ctypes.c_char_p),
        ("storage", ctypes.c_uint32),
        ("device", ctypes.c_uint32),
        ("has_group", ctypes.c_uint32),
        ("group", ctypes.c_uint32),
        ("spill_bytes", ctypes.c_uint64),
        ("spill_frames", ctypes.c_uint32),
        ("max_slots", ctypes.c_uint32),
        ("memory_cap_mib", ctypes.c_uint32),
        ("trim_idle_ms", ctypes.c_uint32),
        ("device_memory_cap_mib", ctypes.c_uint32),
        ("reserved_config", ctypes.c_uint32 * 3),
    ]


class SizeClass(ctypes.Structure):
    _fields_ = [
        ("index", ctypes.c_uint32),
        ("storage", ctypes.c_uint32),
        ("device", ctypes.c_uint32),
        ("first_slot", ctypes.c_uint32),
        ("count", ctypes.c_uint32),
        ("sync_mode", ctypes.c_uint32),
        ("slot_size", ctypes.c_uint64),
    ]


class OpenOptions(ctypes.Structure):
    _fields_ = [
        ("timeout_ns", ctypes.c_int64),
        ("queue_size", ctypes.c_uint32),
        ("client", ctypes.c_char_p),
        ("has_policy", ctypes.c_uint32),
        ("policy", ctypes.c_uint32),
        ("fallback", ctypes.c_uint32),
        ("wake", ctypes.c_uint32),
        ("block_timeout_ns", ctypes.c_uint64),
        ("spin_budget_us", ctypes.c_uint32),
        ("spill_delivery", ctypes.c_uint32),
        ("max_age_us", ctypes.c_uint32),
        ("max_held", ctypes.c_uint32),
        ("history", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32 * 4),
    ]


class ConnectOptions(ctypes.Structure):
    _fields_ = [
        ("timeout_ns", ctypes.c_int64),
        ("memory_cap_mib", ctypes.c_uint64),
        ("device_memory_cap_mib", ctypes.c_uint64),
        ("mode", ctypes.c_uint32),
        ("client", ctypes.c_char_p),
        ("reserved", ctypes.c_uint32 * 4),
    ]


ROLE_OWNER, ROLE_CONSUMER, ROLE_INSPECTOR, ROLE_NONE = 0, 1, 2, 3


class PoolStats(ctypes.Structure):
    _fields_ = [
        ("published", ctypes.c_uint64),
        ("dropped", ctypes.c_uint64),
        ("reaped", ctypes.c_uint64),
        ("consumers", ctypes.c_uint32),
        ("slots_total", ctypes.c_uint32),
        ("slots_free", ctypes.c_uint32),
        ("closed", ctypes.c_uint32),
    ]


class ConsumerStats(ctypes.Structure):
    _fields_ = [
        ("policy", ctypes.c_uint32),
        ("fallback", ctypes.c_uint32),
        ("queue_size", ctypes.c_uint32),
        ("queued", ctypes.c_uint32),
        ("block_timeout_ns", ctypes.c_uint64),
        ("received", ctypes.c_uint64),
        ("dropped", ctypes.c_uint64),
        ("spilled", ctypes.c_uint64),
        ("spin_ns", ctypes.c_uint64),
        ("spins", ctypes.c_uint64),
        ("spins_caught", ctypes.c_uint64),
        ("expired", ctypes.c_uint64),
        ("held", ctypes.c_uint32),
        ("max_held", ctypes.c_uint32),
        ("reserved", ctypes.c_uint64 * 4),
    ]


class SpillStats(ctypes.Structure):
    _fields_ = [
        ("cap_bytes", ctypes.c_uint64),
        ("cap_frames", ctypes.c_uint32),
        ("frames", ctypes.c_uint32),
        ("bytes", ctypes.c_uint64),
        ("peak_bytes", ctypes.c_uint64),
        ("spilled", ctypes.c_uint64),
        ("full", ctypes.c_uint64),
        ("resident_bytes", ctypes.c_uint64),
        ("reserved", ctypes.c_uint64 * 3),
    ]


class GrowthStats(ctypes.Structure):
    _fields_ = [
        ("memory_cap", ctypes.c_uint64),
        ("trim_idle_ns", ctypes.c_uint64),
        ("system_bytes", ctypes.c_uint64),
        ("dynamic_classes", ctypes.c_uint32),
        ("dynamic_slots", ctypes.c_uint32),
        ("dynamic_bytes", ctypes.c_uint64),
        ("grown", ctypes.c_uint64),
        ("trimmed", ctypes.c_uint64),
        ("refused", ctypes.c_uint64),
        ("device_memory_cap", ctypes.c_uint64),
        ("device_bytes", ctypes.c_uint64),
    ]


class Ticket(ctypes.Structure):
    _fields_ = [
        ("slot", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
        ("seq", ctypes.c_uint64),
        ("check", ctypes.c_uint64),
    ]


class TicketStats(ctypes.Structure):
    _fields_ = [
        ("issued", ctypes.c_uint64),
        ("redeemed", ctypes.c_uint64),
        ("expired", ctypes.c_uint64),
        ("live", ctypes.c_uint32),
        ("reserved0", ctypes.c_uint32),
        ("reserved", ctypes.c_uint64 * 2),
    ]


TICKET_TEXT_MAX = 64


def _candidates():
    path = os.environ.get("XMEM_LIBRARY")
    if path:
        yield path
        return
    beside = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libxmem.so")
    if os.path.exists(beside):
        yield beside
    yield "libxmem.so.0"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    yield os.path.join(root, "build", "lib", "libxmem.so.0")


def _load():
    errors = []
    for candidate in _candidates():
        try:
            return ctypes.CDLL(candidate)
        except OSError as e:
            errors.append(str(e))
    raise ImportError("xmem: cannot load libxmem (set XMEM_LIBRARY to its path): " + "; ".join(errors))


lib = _load()

_P = ctypes.c_void_p
_SIGNATURES = {
    "xmem_last_error": (ctypes.c_char_p, []),
    "xmem_status_name": (ctypes.c_char_p, [ctypes.c_int]),
    "xmem_policy_name": (ctypes.c_char_p, [ctypes.c_int]),
    "xmem_policy_name_at": (ctypes.c_char_p, [ctypes.c_uint32]),
    "xmem_policy_from_name": (ctypes.c_int, [ctypes.c_char_p]),
    "xmem_storage_name": (ctypes.c_char_p, [ctypes.c_uint32]),
    "xmem_storage_from_name": (ctypes.c_int, [ctypes.c_char_p]),
    "xmem_pool_config_init": (None, [ctypes.POINTER(PoolConfig)]),
    "xmem_open_options_init": (None, [ctypes.POINTER(OpenOptions)]),
    "xmem_pool_create": (ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(PoolConfig), ctypes.POINTER(_P)]),
    "xmem_pool_open": (ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(OpenOptions), ctypes.POINTER(_P)]),
    "xmem_connect_options_init": (None, [ctypes.POINTER(ConnectOptions)]),
    "xmem_pool_connect": (ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(ConnectOptions), ctypes.POINTER(_P)]),
    "xmem_pool_role": (ctypes.c_uint32, [_P]),
    "xmem_pool_close": (None, [_P]),
    "xmem_pool_acquire": (ctypes.c_int, [_P, ctypes.c_int64, ctypes.POINTER(_P)]),
    "xmem_pool_acquire_on_stream": (ctypes.c_int, [_P, ctypes.c_int64, _P, ctypes.POINTER(_P)]),
    "xmem_pool_acquire_size": (ctypes.c_int, [_P, ctypes.c_uint64, ctypes.c_int64, _P, ctypes.POINTER(_P)]),
    "xmem_pool_preallocate": (ctypes.c_int, [_P, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint32,
                                             ctypes.POINTER(ctypes.c_uint32)]),
    "xmem_pool_class_count": (ctypes.c_uint32, [_P]),
    "xmem_pool_class_info": (ctypes.c_int, [_P, ctypes.c_uint32, ctypes.POINTER(SizeClass)]),
    "xmem_pool_publish": (ctypes.c_int, [_P, _P]),
    "xmem_pool_publish_on_stream": (ctypes.c_int, [_P, _P, _P]),
    "xmem_pool_set_format": (ctypes.c_int, [_P, ctypes.c_char_p]),
    "xmem_pool_end_of_stream": (ctypes.c_int, [_P]),
    "xmem_pool_receive": (ctypes.c_int, [_P, ctypes.c_int64, ctypes.POINTER(_P)]),
    "xmem_pool_receive_on_stream": (ctypes.c_int, [_P, ctypes.c_int64, _P, ctypes.POINTER(_P)]),
    "xmem_pool_fd": (ctypes.c_int, [_P]),
    "xmem_pool_format": (ctypes.c_char_p, [_P]),
    "xmem_pool_stats_get": (ctypes.c_int, [_P, ctypes.POINTER(PoolStats)]),
    "xmem_pool_frames_refused": (ctypes.c_uint64, [_P]),
    "xmem_pool_consumer_stats": (ctypes.c_int, [_P, ctypes.POINTER(ConsumerStats)]),
    "xmem_pool_spill_stats": (ctypes.c_int, [_P, ctypes.POINTER(SpillStats)]),
    "xmem_pool_growth_stats": (ctypes.c_int, [_P, ctypes.POINTER(GrowthStats)]),
    "xmem_pool_publish_ticket": (
        ctypes.c_int, [_P, _P, ctypes.c_uint32, ctypes.c_uint64, _P, ctypes.POINTER(Ticket)],
    ),
    "xmem_pool_get_ticket": (ctypes.c_int, [_P, ctypes.POINTER(Ticket), ctypes.POINTER(_P)]),
    "xmem_pool_get": (ctypes.c_int, [_P, ctypes.c_uint32, ctypes.POINTER(_P)]),
    "xmem_pool_copy": (
        ctypes.c_int, [_P, _P, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_int64, _P, ctypes.POINTER(_P)],
    ),
    "xmem_pool_acquire_memory": (
        ctypes.c_int, [_P, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_int64, _P, ctypes.POINTER(_P)],
    ),
    "xmem_pool_get_seq": (ctypes.c_int, [_P, ctypes.c_uint32, ctypes.c_uint64, ctypes.POINTER(_P)]),
    "xmem_pool_get_mut": (ctypes.c_int, [_P, ctypes.c_uint32, ctypes.POINTER(_P)]),
    "xmem_pool_add_ref": (ctypes.c_int, [_P, ctypes.c_uint32]),
    "xmem_pool_release": (ctypes.c_int, [_P, ctypes.c_uint32]),
    "xmem_pool_ref_count": (ctypes.c_uint32, [_P, ctypes.c_uint32]),
    "xmem_pool_set_ref_count": (ctypes.c_int, [_P, ctypes.c_uint32, ctypes.c_int32, ctypes.c_uint64]),
    "xmem_pool_set_local_refs": (ctypes.c_int, [_P, ctypes.c_uint32, ctypes.c_uint32]),
    "xmem_ticket_format": (ctypes.c_int, [ctypes.POINTER(Ticket), ctypes.c_char_p, ctypes.c_size_t]),
    "xmem_ticket_parse": (ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(Ticket)]),
    "xmem_pool_ticket_stats": (ctypes.c_int, [_P, ctypes.POINTER(TicketStats)]),
    "xmem_pool_slot_size": (ctypes.c_uint64, [_P]),
    "xmem_pool_slot_count": (ctypes.c_uint32, [_P]),
    "xmem_pool_storage": (ctypes.c_uint32, [_P]),
    "xmem_pool_device": (ctypes.c_uint32, [_P]),
    "xmem_pool_pitch_alignment": (ctypes.c_uint32, [_P]),
    "xmem_set_video_layout": (
        ctypes.c_int,
        [ctypes.POINTER(FrameMeta), ctypes.c_char_p, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint32],
    ),
    "xmem_video_plane": (
        ctypes.c_int,
        [ctypes.c_char_p, ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32),
         ctypes.POINTER(ctypes.c_uint32)],
    ),
    "xmem_buffer_meta": (ctypes.POINTER(FrameMeta), [_P]),
    "xmem_buffer_meta_index": (ctypes.c_uint32, [_P]),
    "xmem_buffer_forget": (ctypes.c_int, [_P]),
    "xmem_buffer_is_copy": (ctypes.c_int, [_P]),
    "xmem_buffer_meta_mut": (ctypes.POINTER(FrameMeta), [_P]),
    "xmem_buffer_data": (_P, [_P]),
    "xmem_buffer_data_mut": (_P, [_P]),
    "xmem_buffer_capacity": (ctypes.c_uint64, [_P]),
    "xmem_buffer_format": (ctypes.c_char_p, [_P]),
    "xmem_buffer_is_writable": (ctypes.c_int, [_P]),
    "xmem_buffer_try_make_writable": (ctypes.c_int, [_P]),
    "xmem_buffer_set_tensor": (
        ctypes.c_int,
        [_P, ctypes.c_uint32, ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64)],
    ),
    "xmem_buffer_spilled": (ctypes.c_int, [_P]),
    "xmem_buffer_release": (None, [_P]),
    "xmem_buffer_release_on_stream": (ctypes.c_int, [_P, _P]),
    "xmem_buffer_storage": (ctypes.c_uint32, [_P]),
    "xmem_buffer_device": (ctypes.c_uint32, [_P]),
    "xmem_buffer_device_ptr": (ctypes.c_uint64, [_P]),
    "xmem_buffer_private_copy": (ctypes.c_int, [_P, ctypes.c_uint32, ctypes.c_uint32, _P, ctypes.POINTER(_P)]),
    "xmem_cuda_synchronize": (ctypes.c_int, [ctypes.c_uint32, _P]),
    "xmem_cuda_stream_done": (ctypes.c_int, [ctypes.c_uint32, _P]),
    "xmem_cuda_copy_2d": (
        ctypes.c_int,
        [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int,
         ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint32, _P],
    ),
}

for _name, (_restype, _argtypes) in _SIGNATURES.items():
    _fn = getattr(lib, _name)
    _fn.restype = _restype
    _fn.argtypes = _argtypes


def _policies():
    """Every name the library accepts for a policy ("block" first), with its value."""
    names = {}
    while (name := lib.xmem_policy_name_at(len(names))) is not None:
        names[name.decode()] = lib.xmem_policy_from_name(name)
    return names


def _storages():
    """Every storage's name, with its value (numbered from 0 without a gap)."""
    names = {}
    while (name := lib.xmem_storage_name(len(names))) is not None:
        names[name.decode()] = len(names)
    return names


# The library's tables (xmem.h's xmem_policy_name_at, xmem_storage_name), read once:
# POLICIES by every accepted name, POLICY_NAMES each policy's own name by value,
# STORAGES by name.
POLICIES = _policies()
POLICY_NAMES = {code: lib.xmem_policy_name(code).decode() for code in sorted(set(POLICIES.values()))}
STORAGES = _storages()
assert STORAGES["system"] == STORAGE_SYSTEM and STORAGES["cuda"] == STORAGE_CUDA, "xmem.h's storage values"


def storage_name(value):
    """The library's name of storage VALUE; "invalid" for a value it does not have (read
    from another process's memory, say)."""
    name = lib.xmem_storage_name(value)
    return name.decode() if name is not None else "invalid"


def last_error():
    message = lib.xmem_last_error()
    return message.decode("utf-8", "replace") if message else ""
