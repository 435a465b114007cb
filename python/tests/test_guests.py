"""test_guests.py - producers besides the owner from Python (issue 19): a consumer that
acquires, writes and publishes (a guest; the owner leases it the slot and publishes it on
its behalf), its dtype and shape as published, its tickets, a guest in another process,
one SIGKILLed while it holds leased slots, which come back, and
examples/python/pipeline.py's three stages in one pool, as the README shows them."""

import os
import signal
import subprocess
import sys
import textwrap
import uuid

import numpy
import pytest

import xmem
from test_xmem import eventually


EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python", "pipeline.py")


def name():
    return "py-" + uuid.uuid4().hex[:8]


def test_a_consumer_publishes_a_tensor_to_the_others():
    pool = name()
    with xmem.create(pool, 4096, slots=4) as owner, xmem.open(pool, timeout=5) as guest, \
            xmem.open(pool, timeout=5) as reader:
        frame = guest.acquire(timeout=5)
        data = numpy.arange(6, dtype=numpy.float32).reshape(2, 3)
        frame.buffer[:data.nbytes] = data.tobytes()
        assert owner.stats()["slots_free"] == 3  # the owner holds the lease
        guest.publish(frame, pts=5000, content_type="tensor/py", dtype="float32", shape=(2, 3))
        got = reader.receive(timeout=5)
        assert got.meta.pts == 5000 and got.meta.content_type == "tensor/py"
        assert numpy.asarray(got).dtype == numpy.float32
        assert numpy.asarray(got).tolist() == data.tolist()
        assert got.meta.producer_pid == os.getpid()
        with pytest.raises(xmem.Timeout):
            guest.receive(timeout=0)  # a guest's own frames are not queued for it
        unpublished = guest.acquire(timeout=5)
        unpublished.release()  # back to the owner, unpublished
        assert eventually(lambda: owner.stats()["slots_free"] == 3)  # `got` holds one


def test_a_guests_ticket_crosses_a_pipe_and_a_killed_guest_leaks_nothing():
    pool = name()
    child = textwrap.dedent("""
        import sys, time, numpy, xmem
        with xmem.open(sys.argv[1], timeout=5) as guest:
            frame = guest.acquire(timeout=5)
            frame.buffer[:24] = numpy.full((2, 3), 2.5, numpy.float32).tobytes()
            print(guest.publish_ticket(frame, redemptions=1, ttl=10, dtype="float32", shape=(2, 3)), flush=True)
            held = [guest.acquire(timeout=5) for _ in range(2)]
            print("leased", flush=True)
            time.sleep(60)
    """)
    with xmem.create(pool, 4096, slots=4) as owner, xmem.open(pool, timeout=5) as reader:
        proc = subprocess.Popen([sys.executable, "-c", child, pool], stdout=subprocess.PIPE, text=True)
        try:
            ticket = proc.stdout.readline().strip()
            frame = reader.get(ticket)
            assert numpy.asarray(frame).tolist() == [[2.5] * 3] * 2
            assert proc.stdout.readline().strip() == "leased"
            assert owner.stats()["slots_free"] == 1  # the ticket's frame (held here) and two leases
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
            assert eventually(lambda: owner.stats()["slots_free"] == 3)
            frame.release()
            del frame  # numpy.asarray(frame) made it the array's base: the slot goes with it
            # Every slot is the owner's again (the used-up ticket's once it acquires).
            slots = [owner.acquire(timeout=1) for _ in range(4)]
            assert len({f.meta_index for f in slots}) == 4
        finally:
            proc.kill()
            proc.wait()


def test_the_pipeline_example_runs_three_stages_in_one_pool():
    pool = name()
    stage = "%s %s %%s %s" % (sys.executable, EXAMPLE, pool)
    command = "%s --frames 6 | %s | %s" % (stage % "decode", stage % "preprocess", stage % "infer")
    run = subprocess.run(["bash", "-o", "pipefail", "-c", command], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines == ["tensor float32 (16, 16) mean %.4f" % (i / 255.0) for i in range(6)], run.stdout
