"""test_seed.py - the seed design's Python usage block (../shared/seeds/xmem-design.zh.md,
section 8) run as written: its producer part here, its consumer part in two consumer
processes that connect first and get meta_index over a pipe. The test supplies only
decode_to() and process() (and `size`, which the block uses without defining). Then 24
more frames through the 8 slots, each to one consumer by index. Device memory is the CUDA
driver simulator's (tests/cudasim, as the suite runs it): xmem's logic, not a GPU's."""

import ctypes
import os
import subprocess
import sys
import textwrap
import time

import pytest

import xmem

pytestmark = pytest.mark.skipif(not os.environ.get("XMEM_CUDA_DRIVER"),
                                reason="no CUDA driver (simulated or real) configured")

# Section 8's "Python 使用" block, verbatim.
SEED_BLOCK = '''\
from xmem import BufferPool

pool = BufferPool("my_pool")

# 预分配
pool.preallocate_cuda(size=1920*1080*3, count=8, device_id=0)

# 生产者
buf = pool.acquire_cuda(1920*1080*3, device_id=0)
decode_to(buf.cuda_ptr_mut)
pool.set_ref_count(buf.meta_index, 2)
meta_index = buf.meta_index
buf.forget()

# 消费者
buf = pool.get(meta_index)
process(buf.cuda_ptr)

# CPU/CUDA 互操作
cpu_buf = pool.acquire_cpu(size)
cuda_buf = cpu_buf.copy_to_cuda(device_id=0)
'''


def part(title):
    """The block's lines under the comment TITLE (up to the next comment), or its head
    (import and pool) for None."""
    text = SEED_BLOCK.split("\n# ")
    if title is None:
        return text[0]
    return next(p for p in text if p.startswith(title)).split("\n", 1)[1]


# The stand-ins the test supplies: a decoder that writes VALUE into the device buffer, and
# a process() that reads it back, through the driver the suite runs on.
DRIVER = '''\
import ctypes, os
_cu = ctypes.CDLL(os.environ["XMEM_CUDA_DRIVER"])
assert _cu.cuInit(0) == 0
_ctx = ctypes.c_void_p()
assert _cu.cuDevicePrimaryCtxRetain(ctypes.byref(_ctx), 0) == 0
assert _cu.cuCtxSetCurrent(_ctx) == 0
SIZE = 1920 * 1080 * 3

def fill(address, value):
    assert _cu.cuMemsetD8Async(ctypes.c_uint64(address), ctypes.c_ubyte(value), ctypes.c_size_t(SIZE), None) == 0
    assert _cu.cuCtxSynchronize() == 0

def read(address):
    out = ctypes.create_string_buffer(SIZE)
    assert _cu.cuMemcpyDtoH_v2(out, ctypes.c_uint64(address), ctypes.c_size_t(SIZE)) == 0
    return out.raw
'''

CONSUMER = DRIVER + '''
import sys
{head}
print("connected", pool.role, flush=True)
for line in sys.stdin:
    meta_index, value = map(int, line.split())

    def process(address):
        data = read(address)
        assert data == bytes([value]) * SIZE, "frame %d: wrong bytes" % meta_index

{consume}
    del buf  # the hold goes: the slot comes back once every holder let go
    print("got", meta_index, flush=True)
'''


def start_consumer():
    code = CONSUMER.format(head=part(None), consume=textwrap.indent(part("消费者"), "    "))
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=os.environ.copy())


def expect(consumer, line):
    got = consumer.stdout.readline().strip()
    assert got == line, "consumer said %r, not %r" % (got, line)


def test_the_seed_block_runs_as_written_with_two_consumer_processes():
    # The consumers connect first: the pool does not exist yet.
    consumers = [start_consumer(), start_consumer()]
    for c in consumers:
        expect(c, "connected None")
    driver = {}
    exec(DRIVER, driver)
    value = 0x5A
    scope = {"decode_to": lambda address: driver["fill"](address, value), "size": 1920 * 1080 * 3}
    try:
        exec(part(None) + part("预分配") + part("生产者"), scope)
        pool, meta_index = scope["pool"], scope["meta_index"]
        assert pool.role == "owner"
        with pytest.raises(ValueError, match="forgotten"):
            scope["buf"].meta_index  # forget() ended it
        for c in consumers:
            c.stdin.write("%d %d\n" % (meta_index, value))
            c.stdin.flush()
        for c in consumers:
            expect(c, "got %d" % meta_index)
        with pytest.raises(xmem.NotHeld, match="holds"):
            pool.get(meta_index)  # both holds taken

        # CPU/CUDA 互操作: the pool has no class of system memory; acquire_cpu makes one.
        exec(part("CPU/CUDA 互操作"), scope)
        cpu_buf, cuda_buf = scope["cpu_buf"], scope["cuda_buf"]
        assert cpu_buf.storage == "system" and cuda_buf.storage == "cuda"
        assert cuda_buf.meta_index != cpu_buf.meta_index  # a buffer of the pool
        assert pool.growth_stats()["grown"] >= 1

        # 24 more frames through the 8 slots, each to one consumer by index: the slots
        # come back as holders let go, not at the holds' 10 s lifetime.
        start = time.monotonic()
        for n in range(24):
            value = 1 + n
            buf = pool.acquire_cuda(1920 * 1080 * 3, device_id=0, timeout=5)
            driver["fill"](buf.cuda_ptr_mut, value)
            pool.set_ref_count(buf.meta_index, 1)
            index = buf.meta_index
            buf.forget()
            c = consumers[n % 2]
            c.stdin.write("%d %d\n" % (index, value))
            c.stdin.flush()
            expect(c, "got %d" % index)
        elapsed = time.monotonic() - start
        assert elapsed < 5, "24 frames took %.1f s" % elapsed
        assert pool.ticket_stats()["expired"] == 0
    finally:
        for c in consumers:
            c.stdin.close()
            assert c.wait(timeout=30) == 0
    pool.close()


def test_guards_are_the_seeds():
    """Every frame is an xmem.BufferGuard with the seed's members: a received frame's
    cuda_ptr_mut is refused (read-only), its copies are buffers of the pool, and forget()
    keeps its reference for release(meta_index)."""
    pool = xmem.BufferPool("guards")
    assert pool.role is None
    pool.preallocate_cuda(4096, 2, device_id=0)
    consumer = xmem.BufferPool("guards", timeout=5)
    assert consumer.role == "consumer"
    buf = pool.acquire_cuda(4096, device_id=0)
    assert isinstance(buf, xmem.BufferGuard)
    address = buf.cuda_ptr_mut
    assert address == buf.cuda_ptr
    with pytest.raises(TypeError):
        buf.cpu_ptr
    pool.set_ref_count(buf.meta_index, 1)
    got = consumer.get(buf.meta_index)
    assert isinstance(got, xmem.BufferGuard) and isinstance(got, xmem.Frame)
    assert got.meta_index == buf.meta_index
    with pytest.raises(xmem.Error, match="read-only") as e:
        got.cuda_ptr_mut
    assert e.value.status == xmem._capi.EREADONLY
    # Copies into the pool: a consumer's are slots the owner leases it.
    host = got.copy_to_cpu()
    assert isinstance(host, xmem.WritableFrame) and host.storage == "system"
    assert host.meta_index != got.meta_index and host.cpu_ptr != 0
    device = got.copy_to_device(0)
    assert device.storage == "cuda" and device.meta_index != got.meta_index
    also = got.copy_to_cuda(device_id=0)
    assert also.storage == "cuda"
    for frame in (host, device, also):
        frame.release()
    # forget(): the frame goes, its reference stays until release(meta_index).
    index = got.meta_index
    got.forget()
    assert consumer.ref_count(index) == 1
    consumer.release(index)
    assert consumer.ref_count(index) == 0
    buf.forget()
    # What is refused, with the reason.
    unpublished = pool.acquire_cuda(4096, device_id=0)
    with pytest.raises(xmem.Error, match="not published"):
        unpublished.forget()
    with pytest.raises(xmem.Error, match="another process's|only the owner"):
        consumer.preallocate_cpu(4096, 1)
    with pytest.raises(xmem.NotHeld):
        pool.set_ref_count(1 << 10 | 1, 1)  # no frame of that index is being written here
    for count in (0, -1, 65):
        with pytest.raises(xmem.Error) as e:
            pool.set_ref_count(unpublished.meta_index, count)
        assert e.value.status == xmem._capi.EINVAL
    unpublished.release()
    for handle in (consumer, pool):
        handle.close()


def test_a_seed_pool_allocates_on_demand_within_its_cap():
    """The seed's allocation on demand: acquire_cpu() of a size nothing preallocated fits
    makes a slot (memory_cap_mib), reused for the next frame of that size, and refused past
    the cap, naming it."""
    size = 1920 * 1080 * 3
    pool = xmem.BufferPool("grow", memory_cap_mib=16)
    pool.preallocate_cpu(4096, 2)
    consumer = xmem.BufferPool("grow", timeout=5)
    slots = set()
    for value in (0x21, 0x22, 0x23):
        buf = pool.acquire_cpu(size)
        slots.add(buf.meta_index & 1023)
        assert buf.meta_index & 1023 >= 2  # not a preallocated slot
        ctypes.memset(buf.cpu_ptr, value, size)
        pool.set_ref_count(buf.meta_index, 1)
        got = consumer.get(buf.meta_index)
        assert bytes(got.data[:size]) == bytes([value]) * size
        got.release()
        buf.forget()
    assert len(slots) == 1  # the freed slot was taken again
    g = pool.growth_stats()
    assert g["grown"] == 1 and g["dynamic_slots"] == 1 and g["memory_cap"] == 16 << 20
    with pytest.raises(xmem.Error, match="memory cap") as e:
        pool.acquire_cpu(32 << 20)
    assert e.value.status == xmem._capi.EFULL
    for handle in (consumer, pool):
        handle.close()
