"""test_tickets.py - frame tickets from Python (issue 19): examples/python/tickets.py's
pipe between two processes as the README shows it, the ticket's text and bytes, the
refusals (used up, expired, forged, garbled), and a redeemer SIGKILLed after redeeming."""

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import numpy
import pytest

import xmem
from test_xmem import eventually

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python", "tickets.py")


def name():
    return "py-" + uuid.uuid4().hex[:8]


def ticketed(producer, value, redemptions=1, ttl=5.0):
    frame = producer.acquire(timeout=5)
    data = numpy.full((2, 3), value, numpy.float32)
    frame.buffer[:data.nbytes] = data.tobytes()
    return producer.publish_ticket(frame, redemptions=redemptions, ttl=ttl, dtype="float32", shape=(2, 3))


def test_the_example_passes_tickets_over_a_plain_pipe():
    pool = name()
    command = "%s %s produce %s --frames 6 | %s %s redeem %s" % (sys.executable, EXAMPLE, pool, sys.executable,
                                                                 EXAMPLE, pool)
    run = subprocess.run(["bash", "-o", "pipefail", "-c", command], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert len(lines) == 6, run.stdout
    for i, line in enumerate(lines):
        values = [[i + 0.0, i + 0.5, i + 1.0], [i + 1.5, i + 2.0, i + 2.5]]
        assert line == "frame %d: float32 %s" % (i + 1, values)


def test_a_ticket_is_text_or_bytes_and_redeems_as_often_as_issued():
    pool = name()
    with xmem.create(pool, 256, slots=2) as p, xmem.open(pool, timeout=5) as a, xmem.open(pool, timeout=5) as b:
        t = ticketed(p, 7.5, redemptions=2)
        text, raw = str(t), bytes(t)
        assert text.startswith("xmem-ticket:") and len(raw) == 24
        assert xmem.Ticket.parse(text) == t == xmem.Ticket.parse(raw)
        with pytest.raises(xmem.Timeout):
            a.receive(timeout=0)  # a ticketed frame goes to no queue
        fa, fb = a.get(text), b.get(raw)
        for f in (fa, fb):
            assert f.meta.seq == t.seq
            assert numpy.asarray(f).tolist() == [[7.5] * 3] * 2
        with pytest.raises(xmem.BadTicket, match="no redemption left"):
            a.get(t)
        assert p.ticket_stats() == {"issued": 1, "redeemed": 2, "expired": 0, "live": 1}
        del f, fa, fb  # numpy's arrays kept the frames: they go with them
        held = [p.acquire(timeout=5), p.acquire(timeout=5)]  # the ticket's slot came back
        assert p.ticket_stats()["live"] == 0
        for w in held:
            w.release()


def test_forged_garbled_and_expired_tickets_are_refused():
    pool = name()
    with xmem.create(pool, 256, slots=2) as p, xmem.open(pool, timeout=5) as c:
        t = ticketed(p, 1.0, ttl=0.1)
        for bad in (xmem.Ticket(t.slot, t.seq, t.check ^ 1), xmem.Ticket(t.slot, t.seq + 1, t.check),
                    xmem.Ticket(99, t.seq, t.check)):
            with pytest.raises(xmem.BadTicket):
                c.get(bad)
        for garbled in ("", "xmem-ticket:0:1", "ticket", b"\0" * 24, b"xmem"):
            with pytest.raises(xmem.BadTicket):
                c.get(garbled)
        with pytest.raises(TypeError):
            c.get(12.0)
        with pytest.raises(xmem.Error, match="out of range"):
            c.get(12)  # an int is a slot index (get(index)), not a ticket
        spare = p.acquire(timeout=5)
        for wrong in (dict(redemptions=0), dict(ttl=0), dict(redemptions=True)):
            with pytest.raises(ValueError):
                p.publish_ticket(spare, **wrong)
        spare.release()  # a refused call left it acquired
        # Nobody redeems it: after its TTL the slot is written again, the ticket refused.
        assert eventually(lambda: p.ticket_stats()["live"] == 0, timeout=5)
        assert p.ticket_stats()["expired"] == 1
        held = [p.acquire(timeout=5), p.acquire(timeout=5)]  # the ticket's slot among them
        with pytest.raises(xmem.BadTicket):
            c.get(t)
        for w in held:
            w.release()


def test_a_redeemer_killed_after_redeeming_leaks_nothing():
    pool = name()
    # The child reads tickets until "hold", then holds them and waits to be killed.
    child = textwrap.dedent("""
        import sys, time, xmem
        c = xmem.open(sys.argv[1], timeout=10)
        held = []
        for line in sys.stdin:
            if line.strip() == "hold":
                print("held %d" % len(held), flush=True)
                time.sleep(60)
            held.append(c.get(line.strip()))
        """)
    with xmem.create(pool, 256, slots=2) as p:
        proc = subprocess.Popen([sys.executable, "-c", child, pool], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True)
        try:
            assert eventually(lambda: p.stats()["consumers"] == 1), "the child never attached"
            tickets = [ticketed(p, float(i)) for i in range(2)]
            proc.stdin.write("".join("%s\n" % t for t in tickets) + "hold\n")
            proc.stdin.flush()
            assert proc.stdout.readline().strip() == "held 2"
            assert p.ticket_stats()["redeemed"] == 2
            os.kill(proc.pid, signal.SIGKILL)
            assert proc.wait(timeout=10) == -signal.SIGKILL
            # Both slots come back: the reaper takes the dead redeemer's holds.
            held = [p.acquire(timeout=5), p.acquire(timeout=5)]
            assert eventually(lambda: p.stats()["reaped"] == 1)  # counted after its holds went
            for w in held:
                w.release()
        finally:
            proc.kill()
            proc.wait()
