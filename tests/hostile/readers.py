#!/usr/bin/env python3
# readers.py - consumers that read every pixel of every frame (videoconvert behind xmemsrc,
# numpy over Python's planes(), arrays and DLPack) beside a peer scribbling the frames'
# layout in the control segment: none may crash, and all must carry on (issue 17).
#
# Environment: XMEM_READERS_SEED (printed at the start; it fixes the scribbler's values
# and spells, not when they land on which frame),
# XMEM_READERS_SECONDS (scribbling per pool, default 12), and what meson sets:
# GST_PLUGIN_PATH, XMEM_GST_LAUNCH, XMEM_HOSTILE_PEER, PYTHONPATH and XMEM_LIBRARY (the
# module under python/), XMEM_CUDA_DRIVER (the simulator, for the device pool),
# XMEM_READERS_GST_CUDA (1: the plugin has memory:CUDAMemory), XMEM_GST_PRELOAD
# (AddressSanitizer: preloaded into gst-launch-1.0 and the Python consumers).
#
# Two pools, one after the other: system memory (videotestsrc ! xmemsink) and device
# memory on the CUDA driver simulator (videotestsrc ! cudaupload ! xmemsink; skipped, with
# the reason, where the build has no CUDA or no GStreamer CUDA). Beside each, consumers
# that read every pixel (this file's `gst` and `py` modes below) and, once they have
# frames, `xmem-hostile-peer scribble --targets layout` in three spells of different rates.
#
# Checked: no process dies of a signal the test did not send (SIGSEGV in videoconvert was
# the bug); no log has a sanitizer report; no consumer goes STALL_BOUND without a frame
# received or refused while the scribbler runs, and each receives new frames after it is
# killed (the producer is restarted once if they do not); every process ends with status
# 0 when asked. A consumer may exit with an error on its own only where the library said
# the control segment is broken (XMEM_EBADSEG): the library's word that it cannot go on,
# not a reader's failure; it is restarted. Every other exit is a failure. The Python
# consumer also fails the run for an array or device range outside its slot, for more
# bytes of elements than the slot has (zero strides under a huge shape: the sum would
# take ages), for an exception other than xmem.FrameRefused from receive() or
# ValueError from a reader, and for a library error other than XMEM_EBADSEG: a frame the
# library hands out must fit its slot, or be refused.
#
# The consumers, run by the test as processes of their own:
#   readers.py gst PIPELINE  a gst-launch line with `xmemsrc name=src` and `appsink
#                            name=sink`: sums every byte of every buffer
#   readers.py py POOL       the xmem module: sums every plane, array and DLPack export
# Both print `tick frames=N refused=N ...` at most every 200 ms and `done ...` on SIGTERM.
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

WIDTH, HEIGHT = 320, 240
CAPS = f"video/x-raw,format=NV12,width={WIDTH},height={HEIGHT},framerate=60/1"
# Bounds for a sanitizer build on two busy cores.
WARMUP_BOUND = 60.0  # every consumer has frames within this of starting
STALL_BOUND = 8.0  # a consumer receives or refuses a frame at least this often
RESTART_AFTER = 10.0  # the producer is restarted once if a consumer is still without frames
RECOVER_BOUND = 40.0  # every consumer has new frames within this of the scribbler's end
END_BOUND = 30.0  # a process ends within this once asked
# The scribbler's spells, (writes per burst, pause in microseconds): a few layouts
# broken among good frames, and most frames broken.
SPELLS = [(1, 5000), (4, 1000), (64, 100)]

SANITIZER = re.compile(r"Sanitizer|runtime error:")
BROKEN_SEGMENT = re.compile(r"XMEM_EBADSEG|bad control segment")
COUNTS = re.compile(r"^(?:tick|done) (.*)$", re.M)


def log(msg):
    print(msg, flush=True)


def tail(path, n=20):
    """The end of a log, without its heartbeats but the last."""
    try:
        lines = open(path, errors="replace").read().splitlines()
    except FileNotFoundError:
        return "(no log)"
    beats = [i for i, line in enumerate(lines) if line.startswith(("tick ", "writes "))]
    drop = set(beats[:-1])  # the last one stays
    lines = [line for i, line in enumerate(lines) if i not in drop]
    return "\n".join("    " + line for line in lines[-n:])


def counts_in(path):
    """The last heartbeat's counters in a consumer's log, as a dict of ints."""
    try:
        text = open(path, errors="replace").read()
    except FileNotFoundError:
        return {}
    found = COUNTS.findall(text)
    if not found:
        return {}
    return {k: int(v) for k, v in re.findall(r"([a-z-]+)=(-?\d+)", found[-1])}


class Proc:
    """One role (producer, consumer, scribbler) and the processes that played it."""

    def __init__(self, name, kind, argv, env, logdir):
        self.name = name
        self.kind = kind  # "producer", "consumer", "scribbler"
        self.argv = argv
        self.env = env
        self.logdir = logdir
        self.popen = None
        self.generation = 0
        self.sent = set()
        self.ended = []  # (generation, returncode, signals sent) of each past process
        self.totals = {}  # counters of past generations
        self.failed_at = None  # when a process of this role last ended in a failure

    def log_of(self, generation):
        return os.path.join(self.logdir, f"{self.name}.{generation}.log")

    @property
    def log_path(self):
        return self.log_of(self.generation)

    def start(self):
        self.generation += 1
        self.sent = set()
        with open(self.log_path, "wb") as out:
            self.popen = subprocess.Popen(
                self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def alive(self):
        return self.popen is not None and self.popen.poll() is None

    def signal(self, sig):
        if not self.alive():
            return
        self.sent.add(sig)
        try:
            os.killpg(self.popen.pid, sig)  # gst-launch-1.0 may have a gst-plugin-scanner
        except ProcessLookupError:
            pass

    def reap(self):
        """Records the exit of the current process, if it ended: (returncode, signals sent)."""
        if self.popen is None or self.popen.poll() is None:
            return None
        for k, v in counts_in(self.log_path).items():
            self.totals[k] = self.totals.get(k, 0) + v
        self.ended.append((self.generation, self.popen.returncode, set(self.sent)))
        self.popen = None
        return self.ended[-1][1:]

    def counts(self):
        """Counters over every generation."""
        now = counts_in(self.log_path) if self.popen is not None else {}
        return {k: self.totals.get(k, 0) + now.get(k, 0) for k in set(self.totals) | set(now)}

    def frames(self):
        return self.counts().get("frames", 0)

    def activity(self):
        """Frames received or refused: what a consumer that is not stuck does."""
        c = self.counts()
        return c.get("frames", 0) + c.get("refused", 0)

    def stop(self, sig, failures):
        """Asks the process to end; it must, with status 0, within END_BOUND."""
        if not self.alive():
            self.reap()
            return
        self.signal(sig)
        try:
            self.popen.wait(timeout=END_BOUND)
        except subprocess.TimeoutExpired:
            failures.append(f"{self.name}.{self.generation} did not end within {END_BOUND:g} s of being "
                            f"asked\n" + tail(self.log_path))
            self.signal(signal.SIGKILL)
            self.popen.wait()
        rc, _ = self.reap()
        if rc != 0 and rc != -signal.SIGKILL:
            failures.append(f"{self.name}.{self.generation} ended with {rc} when asked\n" + tail(self.log_path))


def gst_inspect(launch, env, element):
    r = subprocess.run([launch.replace("gst-launch-1.0", "gst-inspect-1.0"), element], env=env,
                       capture_output=True, text=True, timeout=120)
    return r.returncode == 0, (r.stdout + r.stderr).strip()


def run_pool(storage, seed, seconds, work, base_env, gst_env, failures):
    """One pool and its readers beside the scribbler. Returns the consumers, or None
    when this half is skipped."""
    launch = os.environ["XMEM_GST_LAUNCH"]
    pool = f"readers-{storage}"
    logdir = os.path.join(work, "logs")
    # A registry of its own: nvcodec registers cudaupload only when a driver loads.
    registry = os.path.join(work, f"registry-{storage}.bin")
    env = dict(base_env, GST_REGISTRY=registry)
    # The Python consumers load the instrumented plugin and libxmem: preloaded as gst-launch-1.0.
    gst_env = dict(gst_env, GST_REGISTRY=registry)
    py_env = gst_env
    upload = []
    if storage == "cuda":
        driver = os.environ.get("XMEM_CUDA_DRIVER", "")
        if not driver:
            log("device pool skipped: this build has no CUDA (no driver simulator)")
            return None
        if os.environ.get("XMEM_READERS_GST_CUDA") != "1":
            log("device pool skipped: the plugin was built without GStreamer's CUDA library")
            return None
        # GStreamer's CUDA library opens libcuda.so.1 by name: the simulator's folder first.
        for e in (env, gst_env):
            e["XMEM_CUDA_DRIVER"] = driver
            e["LD_LIBRARY_PATH"] = os.path.dirname(driver) + (
                ":" + e["LD_LIBRARY_PATH"] if e.get("LD_LIBRARY_PATH") else "")
        ok, out = gst_inspect(launch, gst_env, "cudaupload")
        if not ok:
            log(f"device pool skipped: no cudaupload on the simulator ({out.splitlines()[-1:]})")
            return None
        upload = ["!", "cudaupload", "!", "video/x-raw(memory:CUDAMemory)"]
    ok, out = gst_inspect(launch, gst_env, "xmemsink")
    if not ok:
        failures.append(f"gst-inspect-1.0 xmemsink: {out}")
        return []

    me = [sys.executable, os.path.abspath(__file__)]
    sink = "appsink name=sink sync=false"
    rgba = "videoconvert ! video/x-raw,format=RGBA"
    producer = Proc(f"{storage}-producer", "producer",
                    [launch, "-e", "videotestsrc", "is-live=true", "pattern=ball", "!", CAPS] + upload
                    + ["!", "xmemsink", f"pool-name={pool}"], gst_env, logdir)
    consumers = [Proc(f"{storage}-videoconvert", "consumer",
                      me + ["gst", f"xmemsrc name=src pool-name={pool} ! {rgba} ! {sink}"], py_env, logdir)]
    if storage == "cuda":
        consumers += [
            Proc(f"{storage}-download", "consumer",
                 me + ["gst", f"xmemsrc name=src pool-name={pool} ! video/x-raw ! {rgba} ! {sink}"],
                 py_env, logdir),
            Proc(f"{storage}-cudadownload", "consumer",
                 me + ["gst", f"xmemsrc name=src pool-name={pool} ! video/x-raw(memory:CUDAMemory) ! "
                       f"cudadownload ! {rgba} ! {sink}"],
                 py_env, logdir),
        ]
    consumers.append(Proc(f"{storage}-python", "consumer", me + ["py", pool], py_env, logdir))
    procs = [producer] + consumers
    rng = random.Random(seed)
    spells = rng.sample(SPELLS, len(SPELLS))
    scribbler = Proc(f"{storage}-scribbler", "scribbler", None, env, logdir)
    try:
        for p in procs:
            p.start()

        def watch():
            """Restarts what ended by itself, noting whether it was allowed to."""
            for p in procs + [scribbler]:
                if p.popen is None:
                    continue
                ended = p.reap()
                if ended is None:
                    continue
                rc, sent = ended
                if rc < 0 and -rc in sent:
                    continue
                path = p.log_of(p.generation)
                text = open(path, errors="replace").read()
                if rc < 0:
                    failures.append(f"{p.name}.{p.generation} died of signal {-rc}, not sent by the test\n"
                                    + tail(path))
                    p.failed_at = time.monotonic()
                elif p.kind == "consumer" and rc != 0 and BROKEN_SEGMENT.search(text):
                    log(f"{p.name}.{p.generation} exited with {rc}: the library found the segment broken")
                else:
                    failures.append(f"{p.name}.{p.generation} exited by itself with {rc}\n" + tail(path))
                    p.failed_at = time.monotonic()
                p.start()

        def wait_until(cond, bound):
            deadline = time.monotonic() + bound
            while time.monotonic() < deadline:
                watch()
                if cond():
                    return True
                time.sleep(0.25)
            return cond()

        if not wait_until(lambda: all(c.frames() >= 3 for c in consumers), WARMUP_BOUND):
            for c in consumers:
                if c.frames() < 3:
                    failures.append(f"{c.name}: {c.frames()} frames within {WARMUP_BOUND:g} s of starting, "
                                    f"before any scribbling\n" + tail(c.log_path))
            return consumers
        log(f"{storage}: every consumer has frames; scribbling {seconds:g} s in spells of "
            + ", ".join(f"{b} writes every {u} us" for b, u in spells))

        # Scribbling: every consumer receives or refuses frames all along.
        last = {c.name: (c.activity(), time.monotonic()) for c in consumers}
        stalled = set()
        for burst, pause in spells:
            scribbler.argv = [os.environ["XMEM_HOSTILE_PEER"], "scribble", pool, "--targets", "layout",
                              "--seed", str(rng.randrange(1 << 62)), "--burst", str(burst),
                              "--pause-us", str(pause)]
            scribbler.start()
            end = time.monotonic() + seconds / len(spells)
            while time.monotonic() < end:
                watch()
                now = time.monotonic()
                for c in consumers:
                    seen, when = last[c.name]
                    if c.activity() != seen:
                        last[c.name] = (c.activity(), now)
                    elif c.failed_at is not None and c.failed_at > when:
                        pass  # its own failed exits explain it, and are reported
                    elif now - when > STALL_BOUND and c.name not in stalled:
                        stalled.add(c.name)
                        failures.append(f"{c.name}: no frame received or refused for {STALL_BOUND:g} s while "
                                        f"the scribbler ran ({burst} writes every {pause} us)\n"
                                        + tail(c.log_path))
                time.sleep(0.25)
            scribbler.signal(signal.SIGKILL)
            scribbler.popen.wait()
            scribbler.reap()
        log(f"{storage}: scribbler gone; "
            + "; ".join(f"{c.name} {c.frames()} frames, {c.counts().get('refused', 0)} refused" for c in consumers))

        # After it: new frames for everyone (the producer restarted once if need be).
        mark = {c.name: c.frames() for c in consumers}
        fresh = lambda c: c.frames() > mark[c.name] + 2  # noqa: E731
        if not wait_until(lambda: all(fresh(c) for c in consumers), RESTART_AFTER):
            log(f"{storage}: restarting the producer for "
                + ", ".join(c.name for c in consumers if not fresh(c)))
            producer.signal(signal.SIGKILL)
            producer.popen.wait()
            producer.reap()
            producer.start()
            wait_until(lambda: all(fresh(c) for c in consumers), RECOVER_BOUND - RESTART_AFTER)
        for c in consumers:
            if not fresh(c):
                failures.append(f"{c.name}: no new frames within {RECOVER_BOUND:g} s of the scribbler's end "
                                f"({c.frames() - mark[c.name]} since)\n" + tail(c.log_path))

        for c in consumers:
            c.stop(signal.SIGTERM, failures)
        producer.stop(signal.SIGINT, failures)
    finally:
        for p in procs + [scribbler]:
            if p.alive():
                p.signal(signal.SIGKILL)
                p.popen.wait()
            p.reap()

    for p in procs + [scribbler]:
        for gen, rc, sent in p.ended:
            path = p.log_of(gen)
            if rc < 0 and -rc not in sent and not any(f.startswith(f"{p.name}.{gen} ") for f in failures):
                failures.append(f"{p.name}.{gen} died of signal {-rc}, not sent by the test\n" + tail(path))
            text = open(path, errors="replace").read()
            if SANITIZER.search(text):
                failures.append(f"{p.name}.{gen}: sanitizer report\n" + tail(path, 40))
    for c in consumers:
        v = c.counts()  # the Python consumer's: a gst one says what is wrong by exiting
        wrong = {key: v[key] for key in ("outside", "overlapping", "unexpected", "errors") if v.get(key)}
        if wrong:
            failures.append(f"{c.name}: " + ", ".join(f"{n} {key}" for key, n in wrong.items())
                            + "; the first of each:\n"
                            + "\n".join("    " + line for g in range(1, c.generation + 1)
                                        for line in first_notes(c.log_of(g), wrong)))
    return consumers


def first_notes(path, kinds, n=3):
    """The first N notes of each of KINDS in a Python consumer's log."""
    try:
        lines = open(path, errors="replace").read().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for kind in kinds:
        out += [line for line in lines if line.startswith(f"note {kind}:")][:n]
    return out


def main():
    try:
        import gi  # noqa: F401
        import numpy  # noqa: F401
    except ImportError as e:
        log(f"skipped: {e} (Debian's python3 with python3-numpy and python3-gi)")
        return 77
    seed = int(os.environ.get("XMEM_READERS_SEED") or random.SystemRandom().randrange(1 << 32))
    seconds = float(os.environ.get("XMEM_READERS_SECONDS") or 12)
    log(f"seed={seed} seconds={seconds:g} (XMEM_READERS_SEED, XMEM_READERS_SECONDS reproduce it)")
    rng = random.Random(seed)

    work = tempfile.mkdtemp(prefix="xmem-readers-")
    runtime = os.path.join(work, "run")
    os.mkdir(runtime, 0o700)
    os.mkdir(os.path.join(work, "logs"))
    env = dict(os.environ, XDG_RUNTIME_DIR=runtime, PYTHONDONTWRITEBYTECODE="1")
    env.pop("XMEM_CUDA_DRIVER", None)
    gst_env = dict(env)
    if os.environ.get("XMEM_GST_PRELOAD"):
        gst_env["LD_PRELOAD"] = os.environ["XMEM_GST_PRELOAD"]
    failures = []
    results = []
    try:
        for storage in ("system", "cuda"):
            consumers = run_pool(storage, rng.randrange(1 << 62), seconds, work, env, gst_env, failures)
            results += consumers or []
    finally:
        log(f"{'consumer':<22} {'frames':>7} {'refused':>7} {'errors':>7}  other")
        for c in results:
            v = c.counts()
            exits = sum(1 for _, rc, sent in c.ended if rc != 0 and -rc not in sent)
            errors = v.get("errors", 0) + v.get("unexpected", 0) + exits
            other = " ".join(f"{k}={v[k]}" for k in sorted(v)
                             if k not in ("frames", "refused", "errors") and v[k])
            log(f"{c.name:<22} {v.get('frames', 0):>7} {v.get('refused', 0):>7} {errors:>7}  "
                f"generations={c.generation} {other}")
        if failures:
            log(f"logs kept in {os.path.join(work, 'logs')}")
            shutil.rmtree(runtime, ignore_errors=True)
        else:
            shutil.rmtree(work, ignore_errors=True)
    for f in failures:
        log("FAIL: " + f)
    if failures:
        log(f"FAILED with seed={seed}")
        return 1
    log("ok")
    return 0


# The consumers.

class Heartbeat:
    """`tick k=v ...` at most every 200 ms: the test reads it as a sign of life."""

    def __init__(self, counts):
        self.counts = counts
        self.last = 0.0

    def tick(self, word="tick", force=False):
        now = time.monotonic()
        if force or now - self.last >= 0.2:
            self.last = now
            print(word + " " + " ".join(f"{k}={v}" for k, v in self.counts.items()), flush=True)


class Notes:
    """The first few problems of each kind, in the log for the test to show."""

    def __init__(self, limit=10):
        self.limit = limit
        self.seen = {}

    def __call__(self, kind, text):
        n = self.seen[kind] = self.seen.get(kind, 0) + 1
        if n <= self.limit:
            print(f"note {kind}: {text}", flush=True)


def gst_consumer(description):
    """A pipeline ending in `appsink name=sink` after `xmemsrc name=src`: every byte of
    every buffer mapped and summed. Exits 1 on an error message, 0 on SIGTERM."""
    import gi

    gi.require_version("Gst", "1.0")
    import numpy
    from gi.repository import GLib, Gst

    Gst.init(None)
    pipeline = Gst.parse_launch(description)
    src, sink = pipeline.get_by_name("src"), pipeline.get_by_name("sink")
    counts = {"frames": 0, "refused": 0, "received": 0, "reconnects": 0, "warnings": 0, "sum": 0}
    beat = Heartbeat(counts)
    note = Notes()
    loop = GLib.MainLoop()
    status = [0]

    def on_sample(appsink):
        sample = appsink.emit("pull-sample")
        buf = sample.get_buffer()
        ok, info = buf.map(Gst.MapFlags.READ)
        if ok:
            counts["sum"] = (counts["sum"] + int(numpy.frombuffer(info.data, numpy.uint8).sum(dtype=numpy.uint64))) \
                % (1 << 62)
            buf.unmap(info)
        counts["frames"] += 1
        return Gst.FlowReturn.OK

    def stats():
        s = src.get_property("stats")
        if s is not None:
            for field, key in (("received", "received"), ("reconnects", "reconnects"),
                               ("frames-refused", "refused")):
                if s.has_field(field):
                    counts[key] = s.get_value(field)
        beat.tick()
        return True

    def on_message(bus, message):
        if message.type == Gst.MessageType.ERROR:
            err, debug = message.parse_error()
            print(f"error from {message.src.get_name()}: {err.message} ({debug})", flush=True)
            status[0] = 1
            loop.quit()
        elif message.type == Gst.MessageType.WARNING:
            err, debug = message.parse_warning()
            counts["warnings"] += 1
            note("warning", f"{message.src.get_name()}: {err.message} ({debug})")
        elif message.type == Gst.MessageType.EOS:
            # The producer ended its stream: wait for the next one, as an application would.
            print("eos", flush=True)
            pipeline.set_state(Gst.State.NULL)
            pipeline.set_state(Gst.State.PLAYING)

    sink.set_property("emit-signals", True)
    sink.connect("new-sample", on_sample)
    bus = pipeline.get_bus()
    bus.add_signal_watch()
    bus.connect("message", on_message)
    for sig in (signal.SIGTERM, signal.SIGINT):
        GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, sig, loop.quit)
    GLib.timeout_add(100, stats)
    pipeline.set_state(Gst.State.PLAYING)
    loop.run()
    stats()
    pipeline.set_state(Gst.State.NULL)
    beat.tick("done", force=True)
    return status[0]


def py_consumer(pool):
    """The xmem module: for each frame, every plane of planes(), numpy.asarray(frame) and
    numpy.from_dlpack(frame) summed (system memory), or the range that
    __cuda_array_interface__ describes copied out and summed (device memory). Each array
    is checked to lie in the slot before it is read."""
    import ctypes

    import numpy

    import xmem

    lib = xmem.lib
    refused_error = getattr(xmem, "FrameRefused", ())  # () catches nothing, before the fix
    try:
        byte_bounds = numpy.byte_bounds
    except AttributeError:  # numpy 2
        from numpy.lib.array_utils import byte_bounds
    counts = {"frames": 0, "refused": 0, "rejected": 0, "outside": 0, "overlapping": 0, "errors": 0,
              "broken": 0, "unexpected": 0, "attaches": 0, "lib-refused": 0, "sum": 0}
    beat = Heartbeat(counts)
    note = Notes()
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(1))

    def fits(what, seq, lo, hi, elements, base, capacity, itemsize=1):
        if elements == 0:
            return False
        if lo < base or hi > base + capacity:
            counts["outside"] += 1
            note("outside", f"frame {seq} {what}: bytes [{lo - base}, {hi - base}) of a slot of {capacity}")
            return False
        if elements * itemsize > capacity:
            # Zero strides under a huge shape, or overlapping dimensions: in the slot, but
            # no frame, and the sum could take ages. The library refuses a tensor with more
            # bytes of elements than its payload (lib/frame_check.cpp).
            counts["overlapping"] += 1
            note("overlapping", f"frame {seq} {what}: {elements} elements in a slot of {capacity} bytes")
            return False
        return True

    def add(total):
        counts["sum"] = (counts["sum"] + int(total)) % (1 << 62)

    def read_system(frame, buffer):
        base, capacity = lib.xmem_buffer_data(buffer) or 0, lib.xmem_buffer_capacity(buffer)
        readers = (("planes", frame.planes), ("asarray", lambda: [numpy.asarray(frame)]),
                   ("dlpack", lambda: [numpy.from_dlpack(frame)]))
        for what, make in readers:
            try:
                arrays = make()
            except ValueError as e:
                counts["rejected"] += 1
                note("rejected", f"frame {frame.meta.seq} {what}: {e}")
                continue
            except Exception as e:
                if what == "dlpack" and frame.meta.dtype == "bfloat16":
                    # A valid capsule numpy cannot take: it has no bfloat16 (numpy 1.24
                    # fails with a SystemError, later ones with a BufferError or TypeError).
                    counts["rejected"] += 1
                    note("rejected", f"frame {frame.meta.seq} {what}: numpy has no bfloat16: {type(e).__name__}")
                    continue
                counts["unexpected"] += 1
                m = frame.meta
                note("unexpected", f"frame {m.seq} {what}: {type(e).__name__}: {e} (size {m.size}, shape "
                     f"{m.shape}, strides {m.strides}, planes {m.plane_offsets} {m.plane_strides})")
                continue
            for i, a in enumerate(arrays):
                lo, hi = byte_bounds(a)
                if fits(f"{what}[{i}] shape {a.shape} strides {a.strides}", frame.meta.seq, lo, hi, a.size,
                        base, capacity):
                    add(a.sum(dtype=numpy.uint64))
            del arrays

    def read_device(frame, buffer):
        base, capacity = lib.xmem_buffer_device_ptr(buffer), lib.xmem_buffer_capacity(buffer)
        try:
            cai = frame.__cuda_array_interface__
        except ValueError as e:
            counts["rejected"] += 1
            note("rejected", f"frame {frame.meta.seq} __cuda_array_interface__: {e}")
            return
        shape, strides, address = cai["shape"], cai["strides"], cai["data"][0]
        if strides is None:  # C order, one byte an element
            strides = tuple(int(numpy.prod(shape[i + 1:], dtype=object)) for i in range(len(shape)))
        elements = int(numpy.prod(shape, dtype=object)) if shape else 1
        lo = address + sum(min(0, (n - 1) * s) for n, s in zip(shape, strides))
        hi = address + sum(max(0, (n - 1) * s) for n, s in zip(shape, strides)) + 1
        if not fits(f"__cuda_array_interface__ shape {shape} strides {strides}", frame.meta.seq, lo, hi,
                    elements, base, capacity):
            return
        # What a GPU reader of that range reads: every byte of it, copied out.
        host = (ctypes.c_uint8 * (hi - lo))()
        r = lib.xmem_cuda_copy_2d(ctypes.addressof(host), hi - lo, 0, lo, hi - lo, 1, hi - lo, 1, frame.meta.device,
                                  None)
        if r != 0:
            counts["unexpected"] += 1
            note("unexpected", f"frame {frame.meta.seq}: copying [{lo - base}, {hi - base}) out of the slot: "
                 f"{xmem._capi.last_error()}")
            return
        add(numpy.frombuffer(host, numpy.uint8).sum(dtype=numpy.uint64))

    while not stop:
        beat.tick()
        try:
            consumer = xmem.open(pool, timeout=0.5, queue_size=2)
        except xmem.Error:  # not there yet, or its producer is being replaced
            time.sleep(0.05)
            continue
        counts["attaches"] += 1
        refused_before = counts["lib-refused"]
        with consumer:
            while not stop:
                beat.tick()
                if hasattr(consumer, "frames_refused"):
                    counts["lib-refused"] = refused_before + consumer.frames_refused()
                try:
                    frame = consumer.receive(timeout=0.2)
                except (xmem.Timeout, xmem.EndOfStream):
                    continue
                except refused_error as e:
                    counts["refused"] += 1
                    note("refused", str(e))
                    continue
                except xmem.Closed:
                    break
                except xmem.Error as e:
                    kind = "broken" if BROKEN_SEGMENT.search(str(e)) else "errors"
                    counts[kind] += 1
                    note(kind, f"receive: {e}")
                    break  # a fresh handle, as an application would
                counts["frames"] += 1
                with frame:
                    buffer = frame._hold.buffer  # for the slot's bounds
                    if frame.meta.storage == "cuda":
                        read_device(frame, buffer)
                    else:
                        read_system(frame, buffer)
    beat.tick("done", force=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] in ("gst", "py"):
        import faulthandler

        faulthandler.enable()  # a crash names the Python line it came from, in the log
    if len(sys.argv) == 3 and sys.argv[1] == "gst":
        sys.exit(gst_consumer(sys.argv[2]))
    if len(sys.argv) == 3 and sys.argv[1] == "py":
        sys.exit(py_consumer(sys.argv[2]))
    sys.exit(main())
