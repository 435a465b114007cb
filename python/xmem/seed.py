"""seed.py - the seed design's Python names (../shared/seeds/xmem-design.zh.md, section 8)
over xmem's pools, for code written against that design:

    pool = xmem.BufferPool("my_pool")        # attaches, or owns the pool once it preallocates
    pool.preallocate_cuda(size, 8, device_id=0)
    buf = pool.acquire_cuda(size, device_id=0)
    decode_to(buf.cuda_ptr_mut)
    pool.set_ref_count(buf.meta_index, 2)    # published as a ticket for 2 redemptions
    ticket = buf.ticket                      # the seed sent meta_index: see below
    buf.forget()

    buf = pool.get(ticket)                   # in a consumer process
    process(buf.cuda_ptr)

Where the design changed, and why (docs/design.md, "Frame tickets"):
- The seed's shared count (set_ref_count) and forget() leaked a frame for good when a
  consumer died before its get(meta_index), and an index sent late named whatever the
  slot held by then. set_ref_count(meta_index, n) here publishes the acquired frame as
  a ticket for n redemptions within ttl seconds: a consumer that dies leaks nothing, and
  a stale or forged ticket is refused. Consumers get(buf.ticket) (its str or bytes over
  any channel); get(meta_index, seq) takes a frame by index only while the slot still
  holds it.
- Slots are preallocated unless the pool has a memory cap: BufferPool(name,
  memory_cap_mib=N) makes acquire_cpu() of a size no free slot fits allocate a slot
  (the seed's allocation on demand), kept for reuse and trimmed least recently used
  first at the cap, or after 10 s idle (docs/design.md, "Growth on demand"). Without a
  cap, and for CUDA memory, acquire_* of a size no class of that memory holds is an
  Error (ERANGE).
- One pool holds system memory and CUDA devices; copy_to_cuda/copy_to_cpu return
  slots of the pool, as the seed's guards did.
- Any attached process acquires, as in the seed: the owner (the process that made the
  pool with its first preallocate_*) stays its manager and leases a slot to another
  process that acquires, then publishes it on that process's behalf (docs/design.md,
  "Producers besides the owner"). Only the owner preallocates.
"""

from . import Consumer, Error, NotHeld, Producer, _capi

# How long a frame handed over with set_ref_count waits for its redemptions.
DEFAULT_TTL = 10.0


class BufferPool:
    """The seed's pool: BufferPool(name) attaches to pool NAME as a consumer when its
    owner is there, and otherwise becomes its owner with the first preallocate_cpu() or
    preallocate_cuda() (the class it makes is the pool's first)."""

    def __init__(self, name, timeout=0, memory_cap_mib=0):
        self.name = name
        self._memory_cap_mib = memory_cap_mib
        self._handle = None
        try:
            self._handle = Consumer(name, timeout=timeout, client="seed")
        except Error as e:
            if e.status != _capi.ENOENT:
                raise

    @property
    def role(self):
        """'owner', 'consumer', or None until the first preallocate_*()."""
        if self._handle is None:
            return None
        return "owner" if isinstance(self._handle, Producer) else "consumer"

    def _owner(self, what):
        if not isinstance(self._handle, Producer):
            raise Error("%s: pool '%s' is another process's (this handle attached as a consumer)"
                        % (what, self.name) if self._handle else
                        "%s: pool '%s' has no slots yet: preallocate_cpu() or preallocate_cuda() first"
                        % (what, self.name), _capi.EROLE)
        return self._handle

    def _preallocate(self, size, count, storage, device):
        if self._handle is None:
            self._handle = Producer(self.name, int(size), slots=int(count), storage=storage, device=int(device),
                                    format="", policy="drop-oldest", memory_cap_mib=self._memory_cap_mib)
            first = 0
        else:
            index = self._owner("preallocate").preallocate(size, count, storage=storage, device=device)
            first = self._handle.classes()[index]["first_slot"]
        return list(range(first, first + int(count)))

    def preallocate_cpu(self, size, count):
        """COUNT slots of SIZE bytes of system memory; their indices (meta_index)."""
        return self._preallocate(size, count, "system", 0)

    def preallocate_cuda(self, size, count, device_id=0):
        """COUNT slots of SIZE bytes on CUDA device DEVICE_ID; their indices."""
        return self._preallocate(size, count, "cuda", device_id)

    def acquire_cpu(self, size, timeout=None):
        """A writable slot of system memory of SIZE bytes or more (any attached process)."""
        return self._attached("acquire_cpu").acquire(timeout=timeout, size=size, storage="system")

    def acquire_cuda(self, size, device_id=0, timeout=None, stream=None):
        """A writable slot on CUDA device DEVICE_ID of SIZE bytes or more (any attached
        process; DEVICE_ID as this process numbers it)."""
        return self._attached("acquire_cuda").acquire(timeout=timeout, stream=stream, size=size, storage="cuda",
                                                      device=device_id)

    def get(self, what, seq=None):
        """A frame, read-only: by ticket (what set_ref_count made), or by slot index
        (with SEQ: only while the slot holds that frame). See Consumer.get."""
        if self._handle is None:
            raise Error("get: pool '%s' is not attached" % self.name, _capi.ENOENT)
        return self._handle.get(what, seq)

    def get_mut(self, meta_index):
        """The frame in slot META_INDEX, writable: in place for a sole holder, else a copy."""
        if self._handle is None:
            raise Error("get_mut: pool '%s' is not attached" % self.name, _capi.ENOENT)
        return self._handle.get_mut(meta_index)

    def set_ref_count(self, meta_index, count, ttl=DEFAULT_TTL):
        """Publishes the frame this process acquired in slot META_INDEX (not yet
        published) as a ticket for COUNT redemptions within TTL seconds; the frame's
        .ticket is what consumers pass to get(). The seed's shared count, made safe
        (module docstring)."""
        owner = self._attached("set_ref_count")
        frame = owner._acquired_frames().get(int(meta_index))
        if frame is None or frame._raw is None:
            raise NotHeld("set_ref_count: slot %d holds no frame this producer acquired and has not published"
                          % meta_index, _capi.ENOTHELD)
        frame.ticket = owner.publish_ticket(frame, redemptions=int(count), ttl=ttl)
        return frame.ticket

    def _attached(self, what):
        if self._handle is None:
            raise Error("%s: pool '%s' is not attached" % (what, self.name), _capi.ENOENT)
        return self._handle

    def add_ref(self, meta_index):
        """One more reference of this process's on slot META_INDEX, which it holds: kept
        until release(META_INDEX). See Consumer.add_ref."""
        self._attached("add_ref").add_ref(meta_index)

    def release(self, meta_index):
        """Gives back a reference add_ref(META_INDEX) made. See Consumer.release."""
        self._attached("release").release(meta_index)

    def ref_count(self, meta_index):
        """This process's references on slot META_INDEX."""
        return self._attached("ref_count").ref_count(meta_index)

    def stats(self):
        if self._handle is None:
            raise Error("stats: pool '%s' is not attached" % self.name, _capi.ENOENT)
        return self._handle.stats()

    def close(self):
        if self._handle is not None:
            self._handle.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
