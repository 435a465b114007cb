"""seed.py - the seed design's Python API (../shared/seeds/xmem-design.zh.md, section 8)
over xmem's pools, for code written against that design; its usage block runs as
written:

    pool = xmem.BufferPool("my_pool")        # connects, in any order with the others
    pool.preallocate_cuda(size, 8, device_id=0)
    buf = pool.acquire_cuda(size, device_id=0)
    decode_to(buf.cuda_ptr_mut)
    pool.set_ref_count(buf.meta_index, 2)    # published for exactly 2 holders
    meta_index = buf.meta_index
    buf.forget()

    buf = pool.get(meta_index)               # in a consumer process: one of the 2 holds
    process(buf.cuda_ptr)

What each call means here (README, "Where xmem departs from its seeds"):
- BufferPool(name) is the C library's xmem_pool_connect: attached as a consumer when the
  pool's owner is there; otherwise the first call that needs the pool settles it:
  preallocate_*() and acquire_*() make it (this process its owner), get() waits up to
  TIMEOUT seconds for another process to make it. The pool closes with its owner.
- The pool this handle makes allocates on demand: acquire_cpu() and acquire_cuda() of a
  size no class holds make a slot, kept for reuse and trimmed least recently used first,
  while the slots' memory stays within MEMORY_CAP_MIB (system) and
  DEVICE_MEMORY_CAP_MIB (each CUDA device): by default 1024 MiB and 4096 MiB
  (docs/design.md, "Growth on demand").
- meta_index names one frame: its slot in the low 10 bits, the frame's generation
  above, so an index sent late is refused rather than naming a later frame of the slot.
- set_ref_count(meta_index, n) publishes the acquired frame for exactly n holders: each
  get(meta_index) in any process takes one, the slot comes back once they let go, and
  holds nobody took go back after LIFETIME seconds (10 by default), so a holder that
  died before its get costs that long at most.
- Any attached process acquires: the owner leases the slot to a process that is not the
  owner and publishes it on its behalf (docs/design.md, "Producers besides the owner").
  Only the owner preallocates.
- Frames (xmem.BufferGuard) export DLPack and __cuda_array_interface__: the seed's
  torch.from_blob(buf.cuda_ptr, ...) is torch.from_dlpack(buf) here.
"""

import ctypes

from . import _capi, _check, _Pool, _Producing, _name, _storage_code, _timeout_ns, lib

_ROLES = {_capi.ROLE_OWNER: "owner", _capi.ROLE_CONSUMER: "consumer", _capi.ROLE_INSPECTOR: "inspector"}


class BufferPool(_Producing):
    """The seed's pool: BufferPool(name) connects to pool NAME (see the module's text)."""

    def __init__(self, name, timeout=10.0, memory_cap_mib=1024, device_memory_cap_mib=4096, client="seed"):
        options = _capi.ConnectOptions()
        lib.xmem_connect_options_init(ctypes.byref(options))
        options.timeout_ns = _timeout_ns(timeout)
        if memory_cap_mib < 0 or device_memory_cap_mib < 0:
            raise ValueError("memory caps are MiB, 0 or more (0: no growth)")
        options.memory_cap_mib = int(memory_cap_mib)
        options.device_memory_cap_mib = int(device_memory_cap_mib)
        self._client = client.encode()
        options.client = self._client
        handle = ctypes.c_void_p()
        self.name = name
        _check(lib.xmem_pool_connect(_name(name), ctypes.byref(options), ctypes.byref(handle)), "connect " + name)
        self._pool = _Pool(handle)

    @property
    def role(self):
        """'owner', 'consumer', or None until the pool is made or found."""
        return _ROLES.get(lib.xmem_pool_role(self._get()))

    def _preallocate(self, size, count, storage, device):
        index = ctypes.c_uint32()
        _check(lib.xmem_pool_preallocate(self._get(), int(size), int(count), _storage_code(storage), int(device),
                                         ctypes.byref(index)), "preallocate")
        first = self.classes()[index.value]["first_slot"]
        return list(range(first, first + int(count)))

    def preallocate_cpu(self, size, count):
        """COUNT slots of SIZE bytes of system memory (the pool's first class when this
        call makes the pool); their slot indices."""
        return self._preallocate(size, count, "system", 0)

    def preallocate_cuda(self, size, count, device_id=0):
        """COUNT slots of SIZE bytes on CUDA device DEVICE_ID; their slot indices."""
        return self._preallocate(size, count, "cuda", device_id)

    def acquire_cpu(self, size, timeout=1.0):
        """A writable buffer of system memory of SIZE bytes or more (any attached process;
        made on demand within the memory cap), waiting up to TIMEOUT seconds for one."""
        return self._sized(self.acquire(timeout=timeout, size=size, storage="system"), size)

    def acquire_cuda(self, size, device_id=0, timeout=1.0, stream=None):
        """A writable buffer on CUDA device DEVICE_ID (as this process numbers it) of SIZE
        bytes or more; STREAM as for acquire()."""
        return self._sized(self.acquire(timeout=timeout, stream=stream, size=size, storage="cuda", device=device_id),
                           size)

    @staticmethod
    def _sized(frame, size):
        """FRAME, its payload SIZE bytes (the seed's buffer is that size) until publish()
        or its metadata says otherwise."""
        lib.xmem_buffer_meta_mut(frame._live_buffer()).contents.size = int(size)
        return frame

    def receive(self, timeout=None, stream=None):
        """The next frame published to queues (see Consumer.receive): a handle of a
        process that is not the pool's owner keeps the latest one."""
        from . import Consumer
        return Consumer.receive(self, timeout, stream)
