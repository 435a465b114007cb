"""test_seed.py - the seed design's Python usage example (../shared/seeds/xmem-design.zh.md,
section 8) as written, adapted only where xmem's design changed for a reason its docs
give (xmem/seed.py): the frame handed to two consumers goes as a ticket, and the CPU
slot the interop part acquires is preallocated. Device memory is the CUDA driver
simulator's here (tests/cudasim, as the suite runs): xmem's logic, not a GPU's."""

import ctypes
import os
import uuid

import pytest

import xmem

pytestmark = pytest.mark.skipif(not os.environ.get("XMEM_CUDA_DRIVER"),
                                reason="no CUDA driver (simulated or real) configured")

SIZE = 1920 * 1080 * 3


class Driver:
    """The few driver calls the example's decode_to() and process() stand-ins make."""

    def __init__(self):
        self.cu = ctypes.CDLL(os.environ["XMEM_CUDA_DRIVER"])
        assert self.cu.cuInit(0) == 0
        ctx = ctypes.c_void_p()
        assert self.cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
        assert self.cu.cuCtxSetCurrent(ctx) == 0

    def fill(self, address, value, size):
        assert self.cu.cuMemsetD8Async(ctypes.c_uint64(address), ctypes.c_ubyte(value), ctypes.c_size_t(size),
                                       None) == 0
        assert self.cu.cuCtxSynchronize() == 0

    def read(self, address, size):
        out = ctypes.create_string_buffer(size)
        assert self.cu.cuMemcpyDtoH_v2(out, ctypes.c_uint64(address), ctypes.c_size_t(size)) == 0
        return out.raw


def test_the_seed_example_runs_as_written():
    name = "seed-" + uuid.uuid4().hex[:8]
    gpu = Driver()

    def decode_to(address):
        gpu.fill(address, 0x5A, SIZE)

    seen = []

    def process(address):
        seen.append(gpu.read(address, 4096))

    pool = xmem.BufferPool(name)
    assert pool.role is None  # nobody owns the name yet

    # 预分配
    assert pool.preallocate_cuda(size=1920 * 1080 * 3, count=8, device_id=0) == list(range(8))
    assert pool.role == "owner"

    # Two consumers (processes of their own in a real deployment).
    consumers = [xmem.BufferPool(name, timeout=5) for _ in range(2)]
    assert [c.role for c in consumers] == ["consumer", "consumer"]

    # 生产者
    buf = pool.acquire_cuda(1920 * 1080 * 3, device_id=0)
    decode_to(buf.cuda_ptr_mut)
    pool.set_ref_count(buf.meta_index, 2)
    ticket = buf.ticket  # the seed sent buf.meta_index: a ticket is that, made safe
    buf.forget()

    # 消费者
    for consumer in consumers:
        buf = consumer.get(str(ticket))
        process(buf.cuda_ptr)
        buf.release()
    assert seen == [b"\x5a" * 4096] * 2
    with pytest.raises(xmem.BadTicket):
        consumers[0].get(ticket)  # both redemptions made
    assert pool.stats()["published"] == 1

    # CPU/CUDA 互操作 (the CPU class preallocated: xmem allocates no slot on demand)
    size = 4096
    pool.preallocate_cpu(size, 2)
    cpu_buf = pool.acquire_cpu(size)
    cpu_buf.buffer[:size] = b"\x33" * size
    cuda_buf = cpu_buf.copy_to_cuda(device_id=0)
    assert cuda_buf.storage == "cuda" and cuda_buf.meta_index < 8  # a slot of the pool
    assert gpu.read(cuda_buf.cuda_ptr, size) == b"\x33" * size
    cpu_buf.release()
    back = cuda_buf.copy_to_cpu()
    assert back.storage == "system" and bytes(back.buffer[:size]) == b"\x33" * size
    for frame in (cuda_buf, back):
        frame.release()

    # What the design refuses, with the reason.
    unpublished = pool.acquire_cpu(size)
    with pytest.raises(xmem.Error, match="not published"):
        unpublished.forget()
    unpublished.release()
    with pytest.raises(xmem.Error, match="another process's"):
        consumers[0].preallocate_cpu(size, 1)  # the owner manages the classes

    # Any attached process acquires (the seed's BufferPool::new connects and acquires):
    # the owner leases it the slot and publishes it on its behalf.
    guest_buf = consumers[0].acquire_cpu(size)
    guest_buf.buffer[:size] = b"\x44" * size
    guest_ticket = consumers[0].set_ref_count(guest_buf.meta_index, 1)
    guest_buf.forget()
    got = consumers[1].get(str(guest_ticket))
    assert bytes(got.data[:size]) == b"\x44" * size
    got.release()
    guest_cuda = consumers[1].acquire_cuda(4096, device_id=0)
    gpu.fill(guest_cuda.cuda_ptr_mut, 0x66, 4096)
    cuda_ticket = consumers[1].set_ref_count(guest_cuda.meta_index, 1)
    got = consumers[0].get(str(cuda_ticket))
    assert gpu.read(got.cuda_ptr, 4096) == b"\x66" * 4096
    got.release()
    with pytest.raises(xmem.NotHeld):
        pool.set_ref_count(5, 2)  # no frame acquired in slot 5
    with pytest.raises(xmem.Error) as e:
        pool.acquire_cpu(size + 1)  # no class that large: no allocation on demand
    assert e.value.status == xmem._capi.ERANGE
    for handle in consumers + [pool]:
        handle.close()


def test_a_seed_pool_with_a_memory_cap_allocates_on_demand():
    """The seed's allocation on demand: acquire_cpu() of a size nothing preallocated fits
    makes a slot (memory_cap_mib), which a consumer redeems by ticket and which is reused,
    not made again, for the next frame of that size."""
    name = "seed-" + uuid.uuid4().hex[:8]
    pool = xmem.BufferPool(name, memory_cap_mib=32)
    pool.preallocate_cpu(4096, 2)
    consumer = xmem.BufferPool(name, timeout=5)
    slots = set()
    for value in (0x21, 0x22, 0x23):
        buf = pool.acquire_cpu(SIZE)
        slots.add(buf.meta_index)
        assert buf.meta_index >= 2  # not a preallocated slot
        buf.buffer[:SIZE] = bytes([value]) * SIZE
        ticket = pool.set_ref_count(buf.meta_index, 1)
        buf.forget()
        got = consumer.get(str(ticket))
        assert bytes(got.data[:SIZE]) == bytes([value]) * SIZE
        got.release()
    assert len(slots) == 1  # the freed slot was taken again
    g = pool._handle.growth_stats()
    assert g["grown"] == 1 and g["dynamic_slots"] == 1 and g["system_bytes"] <= 32 << 20
    with pytest.raises(xmem.Error, match="memory cap"):
        pool.acquire_cpu(64 << 20)
    for handle in (consumer, pool):
        handle.close()
