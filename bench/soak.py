"""soak.py - the soak benchmark behind bench/soak.sh: a 1080p60 xmemsink producer runs
for DURATION seconds while consumers come, go, stall and get killed on a seeded random
schedule; the producer's resources and the pool are sampled, written to a CSV, drawn
as a PNG, and judged flat or growing.

usage: soak.py [--duration S] [--out DIR] [--seed N] [--interval S] [--build-dir DIR]
       soak.py --self-test

Run through bench/soak.sh, which builds the plugin and xmem-inspect and sets
GST_PLUGIN_PATH, PYTHONPATH and XMEM_LIBRARY. Exit status 0 when every metric is
flat and every check passed, 1 otherwise, 2 on bad usage or when nothing could run.

The verdict (see verdict() and quiet_checks()):
  trend     after the warm-up, the median of the last third of the samples minus the
            median of the first third must not exceed the metric's tolerance (RSS:
            4 MiB or 5 %, whichever is larger; fds: 2 per possible consumer; threads: 1
            per possible consumer; slots held for dead consumers and consumer records
            of dead processes: 0, their medians must stay where they were);
  quiet     at each quiet point (every consumer stopped or killed, then 3 s of rest)
            no consumer is registered, no slot carries a consumer's holder bit, and
            the producer's fds and threads are at most those of the first quiet
            point (+2 fds, +1 thread);
  final     after the last quiet point every slot is free or held by the producer
            alone, no consumer record is in use, and the producer ends on SIGINT
            (EOS) with status 0 and removes its socket;
  progress  frames were published between consecutive quiet points, every graceful
            consumer exit had status 0 and xmem-inspect never failed more than twice
            in a row.
"""

import argparse
import csv
import datetime
import json
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

WIDTH, HEIGHT, FPS = 1920, 1080, 60
# solid-color fills each frame with one value: the cheapest of videotestsrc's patterns
# that still writes every frame, so that two busy cores keep 60 frames/s.
PATTERN = "solid-color"
MAX_CONSUMERS = 4

COLUMNS = [
    "t_s", "quiet", "producer_rss_kib", "producer_fds", "producer_threads", "published", "fps", "dropped",
    "reaped", "slots_total", "slots_free", "slots_consumer_held", "slots_orphaned", "consumers_attached",
    "consumers_stale", "consumers_running", "consumers_stalled",
]

# metric -> (what it is, tolerance as a function of the first third's median). A metric
# grows when median(last third) - median(first third) > tolerance.
TRENDS = {
    "producer_rss_kib": ("producer RSS (KiB)", lambda first: max(4096.0, 0.05 * first)),
    "producer_fds": ("producer open fds", lambda first: 2.0 * MAX_CONSUMERS),
    "producer_threads": ("producer threads", lambda first: 1.0 * MAX_CONSUMERS),
    "slots_orphaned": ("slots held for dead consumers", lambda first: 0.0),
    "consumers_stale": ("consumer records of dead processes", lambda first: 0.0),
}


def log(msg):
    print("soak: " + msg, flush=True)


# ---------------------------------------------------------------- the verdict


def median_thirds(values):
    """(median of the first third, median of the last third) of VALUES (NaNs left out)."""
    values = [v for v in values if v is not None and not math.isnan(v)]
    if len(values) < 6:
        return None
    n = len(values) // 3
    return statistics.median(values[:n]), statistics.median(values[-n:])


def verdict(samples, warmup_s):
    """{metric: (flat, first, last, tolerance)} by the trend rule over SAMPLES (dicts
    with t_s and the metrics) taken after WARMUP_S."""
    after = [s for s in samples if s["t_s"] >= warmup_s]
    out = {}
    for metric, (_, tol) in TRENDS.items():
        thirds = median_thirds([float(s[metric]) for s in after])
        if thirds is None:
            out[metric] = (False, None, None, None)
            continue
        first, last = thirds
        tolerance = tol(first)
        out[metric] = (last - first <= tolerance, first, last, tolerance)
    return out


def quiet_checks(quiet):
    """Failures (strings) among the quiet-point samples QUIET, in time order."""
    failures = []
    if not quiet:
        return ["no quiet point was reached"]
    base = quiet[0]
    for q in quiet:
        t = q["t_s"]
        if q["consumers_attached"] != 0:
            failures.append("t=%.0fs: %d consumer(s) still registered at a quiet point" % (t, q["consumers_attached"]))
        if q["slots_consumer_held"] != 0:
            failures.append("t=%.0fs: %d slot(s) still held by consumers at a quiet point" %
                            (t, q["slots_consumer_held"]))
        if q["producer_fds"] > base["producer_fds"] + 2:
            failures.append("t=%.0fs: producer fds %d at a quiet point, %d at the first" %
                            (t, q["producer_fds"], base["producer_fds"]))
        if q["producer_threads"] > base["producer_threads"] + 1:
            failures.append("t=%.0fs: producer threads %d at a quiet point, %d at the first" %
                            (t, q["producer_threads"], base["producer_threads"]))
    for a, b in zip(quiet, quiet[1:]):
        if b["published"] <= a["published"]:
            failures.append("t=%.0fs..%.0fs: no frame published" % (a["t_s"], b["t_s"]))
    return failures


def self_test():
    """The verdict on synthetic series: flat noisy ones pass, growing ones fail."""
    rng = random.Random(1)
    problems = []

    def series(n, **overrides):
        out = []
        for i in range(n):
            s = {"t_s": float(i), "producer_rss_kib": 40000 + rng.uniform(-800, 800),
                 "producer_fds": 17 + 2 * rng.randint(0, MAX_CONSUMERS), "producer_threads": 5,
                 "slots_orphaned": 1 if rng.random() < 0.05 else 0, "consumers_stale": 0}
            for k, f in overrides.items():
                s[k] = f(i, s[k])
            out.append(s)
        return out

    cases = [
        ("flat", series(180), set()),
        ("rss +100 KiB/s", series(180, producer_rss_kib=lambda i, v: v + 100 * i), {"producer_rss_kib"}),
        ("rss +1 KiB/s", series(3600, producer_rss_kib=lambda i, v: v + 1 * i), set()),
        ("rss +4 KiB/s over an hour", series(3600, producer_rss_kib=lambda i, v: v + 4 * i), {"producer_rss_kib"}),
        ("an fd per 10 s", series(180, producer_fds=lambda i, v: v + i // 10), {"producer_fds"}),
        ("a thread per 20 s", series(180, producer_threads=lambda i, v: v + i // 20), {"producer_threads"}),
        ("a slot lost at 60 s", series(180, slots_orphaned=lambda i, v: v + (i >= 60)), {"slots_orphaned"}),
        ("a stale consumer at 100 s", series(180, consumers_stale=lambda i, v: v + (i >= 100)), {"consumers_stale"}),
    ]
    for name, samples, growing in cases:
        got = {m for m, (flat, *_) in verdict(samples, 0).items() if not flat}
        if got != growing:
            problems.append("%s: growing %s, expected %s" % (name, sorted(got), sorted(growing)))
        log("self-test %-28s growing: %s" % (name, ", ".join(sorted(got)) or "none"))

    q = {"t_s": 0, "consumers_attached": 0, "slots_consumer_held": 0, "producer_fds": 17, "producer_threads": 5,
         "published": 10}
    good = [dict(q), dict(q, t_s=60, published=20, producer_fds=18)]
    bad = [dict(q), dict(q, t_s=60, published=20, consumers_attached=1, slots_consumer_held=2, producer_fds=25),
           dict(q, t_s=120, published=20, producer_threads=7)]
    if quiet_checks(good):
        problems.append("quiet checks failed on good points: %s" % quiet_checks(good))
    if len(quiet_checks(bad)) != 5:
        problems.append("quiet checks on bad points found %s" % quiet_checks(bad))
    for p in problems:
        log("SELF-TEST FAILED: " + p)
    log("self-test %s" % ("failed" if problems else "passed"))
    return 1 if problems else 0


# ---------------------------------------------------------------- processes


class Consumer:
    def __init__(self, ident, kind, proc, t):
        self.ident, self.kind, self.proc, self.started = ident, kind, proc, t
        self.stalled_until = None  # resume time while SIGSTOPped; math.inf: never
        self.leak = False  # --inject-leak's: left alone by the schedule and the quiet points
        self.ending = None  # "stop" or "kill" once told to end

    @property
    def pid(self):
        return self.proc.pid


class Soak:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.pool = "soak-%d" % os.getpid()
        self.inspect = os.path.join(args.build_dir, "tools", "xmem-inspect")
        self.out = args.out
        self.consumers = []
        self.next_id = 1
        self.failures = []
        self.samples = []
        self.quiet = []
        self.inspect_failures = 0
        self.inspect_failures_in_row = 0
        self.counts = {"started": 0, "stopped": 0, "killed": 0, "stalled": 0, "exited": 0, "errors": 0}
        self.last_pub = None
        self.events_file = open(os.path.join(self.out, "events.csv"), "w", newline="")
        self.events = csv.writer(self.events_file)
        self.events.writerow(["t_s", "event", "consumer", "kind", "pid", "detail"])
        self.consumer_log = open(os.path.join(self.out, "consumers.log"), "ab")
        self.env = dict(os.environ)
        # A registry of its own: other users of the machine may rescan theirs.
        self.scratch = tempfile.mkdtemp(prefix="xmem-soak-")
        self.env["GST_REGISTRY"] = os.path.join(self.scratch, "gst-registry.bin")
        self.env.pop("DISPLAY", None)

    def now(self):
        return time.monotonic() - self.t0

    def event(self, what, c=None, detail=""):
        self.events.writerow(["%.2f" % self.now(), what, c.ident if c else "", c.kind if c else "",
                              c.pid if c else "", detail])

    # -- producer

    def start_producer(self):
        subprocess.run(["gst-inspect-1.0", "xmemsink"], env=self.env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=120, check=False)
        cmd = ["gst-launch-1.0", "-e", "videotestsrc", "is-live=true", "pattern=" + PATTERN, "!",
               "video/x-raw,format=NV12,width=%d,height=%d,framerate=%d/1" % (WIDTH, HEIGHT, FPS), "!",
               "xmemsink", "pool-name=" + self.pool, "max-consumers=%d" % 64]
        log("producer: " + " ".join(cmd))
        self.producer_log = open(os.path.join(self.out, "producer.log"), "wb")
        self.producer = subprocess.Popen(cmd, env=self.env, stdout=self.producer_log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.producer.poll() is not None:
                raise RuntimeError("the producer exited with status %d; see %s/producer.log" %
                                   (self.producer.returncode, self.out))
            snap = self.snapshot()
            if snap and snap["published"] > 0:
                return
            time.sleep(0.2)
        raise RuntimeError("the pool %s did not appear within 60 s" % self.pool)

    def snapshot(self):
        try:
            r = subprocess.run([self.inspect, "--json", self.pool], capture_output=True, timeout=15, check=False)
        except subprocess.TimeoutExpired:
            return None
        if r.returncode != 0:
            return None
        try:
            return json.loads(r.stdout)
        except ValueError:
            return None

    # -- consumers

    def start_consumer(self, kind=None):
        kind = kind or self.rng.choice(["gst", "gst-queue", "lib"])
        if kind == "gst":
            cmd = ["gst-launch-1.0", "-e", "xmemsrc", "pool-name=" + self.pool, "!", "fakesink"]
        elif kind == "gst-queue":
            # A queue downstream holds up to three frames more, as a slow pipeline does.
            cmd = ["gst-launch-1.0", "-e", "xmemsrc", "pool-name=" + self.pool, "!", "queue",
                   "max-size-buffers=3", "!", "fakesink"]
        else:
            cmd = [sys.executable, os.path.join(HERE, "soak_consumer.py"), self.pool,
                   "--seed", str(self.rng.randrange(1 << 30)), "--hold-max", "2"]
        proc = subprocess.Popen(cmd, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=self.consumer_log)
        c = Consumer(self.next_id, kind, proc, self.now())
        self.next_id += 1
        self.consumers.append(c)
        self.counts["started"] += 1
        self.event("start", c)
        return c

    def stall(self, c, seconds):
        os.kill(c.pid, signal.SIGSTOP)
        c.stalled_until = self.now() + seconds
        self.counts["stalled"] += 1
        self.event("stall", c, "%.1fs" % seconds if seconds != math.inf else "forever")

    def resume(self, c):
        if c.stalled_until is not None and c.proc.poll() is None:
            os.kill(c.pid, signal.SIGCONT)
            self.event("resume", c)
        c.stalled_until = None

    def end(self, c, how):
        if c.proc.poll() is not None or c.ending:
            return
        if how == "kill":
            os.kill(c.pid, signal.SIGKILL)
            self.counts["killed"] += 1
        else:
            if c.stalled_until is not None:
                self.resume(c)
            # gst-launch -e turns SIGINT into EOS; the Python consumer ends on SIGTERM.
            os.kill(c.pid, signal.SIGINT if c.kind.startswith("gst") else signal.SIGTERM)
            self.counts["stopped"] += 1
        c.ending = how
        c.end_sent = self.now()
        self.event(how, c)

    def reap(self):
        for c in list(self.consumers):
            rc = c.proc.poll()
            if rc is None:
                if c.ending == "stop" and self.now() - c.end_sent > 20:
                    self.fail("consumer %d (%s, pid %d) did not end within 20 s of being stopped; killed" %
                              (c.ident, c.kind, c.pid))
                    os.kill(c.pid, signal.SIGKILL)
                    c.ending = "kill"
                continue
            self.consumers.remove(c)
            self.event("exit", c, "status %d" % rc)
            self.counts["exited"] += 1
            if c.ending != "kill" and rc != 0:
                self.counts["errors"] += 1
                self.fail("consumer %d (%s, pid %d) %s with status %d" %
                          (c.ident, c.kind, c.pid, "ended" if c.ending else "exited on its own", rc))

    def live(self):
        """The consumers the schedule may act on."""
        return [c for c in self.consumers if c.proc.poll() is None and not c.ending and not c.leak]

    def fail(self, msg):
        self.failures.append(msg)
        log("FAIL: " + msg)

    def random_event(self):
        """One step of the schedule: start, stop, stall or kill a consumer."""
        live = self.live()
        # Only consumers older than 1.5 s are stopped or stalled: gst-launch handles
        # SIGINT only once its pipeline runs.
        grown = [c for c in live if self.now() - c.started > 1.5 and c.stalled_until is None]
        if len(live) < 1:
            action = "start"
        elif len(live) >= MAX_CONSUMERS:
            action = self.rng.choice(["stop", "stall", "kill", "kill"])
        else:
            action = self.rng.choices(["start", "stop", "stall", "kill"], [4, 2, 2, 2])[0]
        if action == "start":
            self.start_consumer()
            return
        if action == "kill":
            # Any consumer may be killed: starting, running or stalled.
            self.end(self.rng.choice(live), "kill")
            return
        if not grown:
            return
        c = self.rng.choice(grown)
        if action == "stop":
            self.end(c, "stop")
        else:
            self.stall(c, self.rng.uniform(0.2, 6.0))

    # -- sampling

    def sample(self, quiet=False):
        t = self.now()
        pid = self.producer.pid
        rss = threads = None
        try:
            with open("/proc/%d/status" % pid) as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        rss = int(line.split()[1])
                    elif line.startswith("Threads:"):
                        threads = int(line.split()[1])
            fds = len(os.listdir("/proc/%d/fd" % pid))
        except OSError:
            self.fail("t=%.0fs: the producer is gone" % t)
            return None
        snap = self.snapshot()
        if snap is None:
            self.inspect_failures += 1
            self.inspect_failures_in_row += 1
            if self.inspect_failures_in_row > 2:
                self.fail("t=%.0fs: xmem-inspect failed %d times in a row" % (t, self.inspect_failures_in_row))
            return None
        self.inspect_failures_in_row = 0
        alive = {c["index"] for c in snap["consumers"] if c["state"] == "active" and c["alive"]}
        held = orphaned = 0
        for s in snap["slots"]:
            bits = [b for b in s["holder_bits"] if b != 0]
            if bits:
                held += 1
                if any(b - 1 not in alive for b in bits):
                    orphaned += 1
        fps = None
        if self.last_pub is not None and t > self.last_pub[0]:
            fps = (snap["published"] - self.last_pub[1]) / (t - self.last_pub[0])
        self.last_pub = (t, snap["published"])
        row = {
            "t_s": round(t, 2), "quiet": int(quiet), "producer_rss_kib": rss, "producer_fds": fds,
            "producer_threads": threads, "published": snap["published"],
            "fps": round(fps, 2) if fps is not None else float("nan"), "dropped": snap["dropped"],
            "reaped": snap["reaped"], "slots_total": snap["slots_total"], "slots_free": snap["slots_free"],
            "slots_consumer_held": held, "slots_orphaned": orphaned,
            "consumers_attached": snap["consumers_attached"],
            "consumers_stale": sum(1 for c in snap["consumers"] if not c["alive"]),
            "consumers_running": sum(1 for c in self.consumers if c.proc.poll() is None),
            "consumers_stalled": sum(1 for c in self.consumers
                                     if c.stalled_until is not None and c.proc.poll() is None),
            "_snap": snap,
        }
        self.samples.append(row)
        self.csv.writerow({k: row[k] for k in COLUMNS})
        self.csv_file.flush()
        return row

    def quiet_point(self, final=False):
        """Ends every consumer (stopped or killed, as the schedule draws), waits until
        the pool has none, rests 3 s and takes a quiet sample."""
        self.event("quiet", detail="final" if final else "")
        for c in self.consumers:
            if not c.leak:
                self.end(c, self.rng.choice(["stop", "kill"]))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            self.reap()
            if all(c.leak for c in self.consumers):
                snap = self.snapshot()
                if snap and snap["consumers_attached"] <= len(self.consumers):
                    break
            time.sleep(0.1)
        time.sleep(3)
        self.reap()
        row = self.sample(quiet=True)
        if row is None:
            self.fail("t=%.0fs: no sample at the quiet point" % self.now())
            return None
        self.quiet.append(row)
        log("quiet point t=%.0fs: rss %d KiB, fds %d, threads %d, %d/%d slots free, %d held by consumers, "
            "%d consumers registered, %d published" %
            (row["t_s"], row["producer_rss_kib"], row["producer_fds"], row["producer_threads"], row["slots_free"],
             row["slots_total"], row["slots_consumer_held"], row["consumers_attached"], row["published"]))
        return row

    # -- the run

    def run(self):
        args = self.args
        duration = args.duration
        warmup = args.warmup if args.warmup is not None else float(round(min(60.0, max(10.0, duration / 9))))
        quiet_every = args.quiet_every or (60.0 if duration <= 900 else 300.0)
        quiet_times = [warmup]
        t = warmup + quiet_every
        while t < duration - quiet_every / 3:
            quiet_times.append(t)
            t += quiet_every
        log("seed %d; %d s at %dx%d@%d (%s); samples every %g s; warm-up %g s; quiet points at %s s and the end" %
            (args.seed, duration, WIDTH, HEIGHT, FPS, PATTERN, args.interval, warmup,
             ", ".join("%.0f" % q for q in quiet_times)))
        log("output in %s" % self.out)
        self.csv_file = open(os.path.join(self.out, "samples.csv"), "w", newline="")
        self.csv = csv.DictWriter(self.csv_file, COLUMNS)
        self.csv.writeheader()

        self.t0 = time.monotonic()
        self.start_producer()
        log("producer pid %d, pool %s" % (self.producer.pid, self.pool))
        self.t0 = time.monotonic()  # time 0: the pool publishes
        next_sample = 0.0
        next_event = 0.0
        next_leak = warmup + 5 if args.inject_leak else math.inf
        while True:
            t = self.now()
            if t >= duration:
                break
            if self.producer.poll() is not None:
                self.fail("t=%.0fs: the producer exited with status %d" % (t, self.producer.returncode))
                break
            self.reap()
            for c in self.consumers:
                if c.stalled_until is not None and c.stalled_until <= t:
                    self.resume(c)
            if quiet_times and t >= quiet_times[0]:
                quiet_times.pop(0)
                self.quiet_point()
                next_sample = self.now() + args.interval
                continue
            if t >= next_leak:
                # The injected leak: a consumer that attaches, then stalls forever.
                c = self.start_consumer("lib")
                c.leak = True
                time.sleep(2)
                self.stall(c, math.inf)
                next_leak = self.now() + 15
            if t >= next_event:
                self.random_event()
                next_event = t + self.rng.uniform(0.3, 2.5)
            if t >= next_sample:
                self.sample()
                next_sample += args.interval
                if next_sample < self.now():
                    next_sample = self.now() + args.interval
            time.sleep(0.05)

        if self.producer.poll() is None:
            self.final_checks()
        self.cleanup()
        return self.report(warmup)

    def final_checks(self):
        row = self.quiet_point(final=True)
        if row is not None:
            snap = row["_snap"]
            bad = [s["index"] for s in snap["slots"] if not s["free"] and any(b != 0 for b in s["holder_bits"])]
            owner = [s["index"] for s in snap["slots"] if not s["free"] and s["holder_bits"] == [0]]
            if bad:
                self.fail("final: slots %s are neither free nor the producer's alone" % bad)
            if snap["consumers"]:
                self.fail("final: %d consumer record(s) still in use: %s" %
                          (len(snap["consumers"]), [(c["index"], c["pid"], c["state"]) for c in snap["consumers"]]))
            log("final: %d/%d slots free, %d held by the producer alone (its frame in flight), %d consumer records "
                "in use" % (snap["slots_free"], snap["slots_total"], len(owner), len(snap["consumers"])))
            self.final_path = snap["path"]
        self.producer.send_signal(signal.SIGINT)
        try:
            rc = self.producer.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.producer.kill()
            rc = self.producer.wait()
            self.fail("final: the producer did not end within 30 s of SIGINT; killed")
        log("final: the producer exited with status %d" % rc)
        if rc != 0:
            self.fail("final: the producer exited with status %d" % rc)
        path = getattr(self, "final_path", None)
        if path and (os.path.exists(path) or os.path.exists(path + ".lock")):
            self.fail("final: the producer left %s behind" % path)

    def cleanup(self):
        for c in self.consumers:
            if c.proc.poll() is None:
                os.kill(c.pid, signal.SIGKILL)
            c.proc.wait()
        if self.producer.poll() is None:
            self.producer.kill()
            self.producer.wait()
        shutil.rmtree(self.scratch, ignore_errors=True)
        self.events_file.close()
        self.csv_file.close()

    def report(self, warmup):
        samples = [s for s in self.samples if s is not None]
        fps = [s["fps"] for s in samples if not math.isnan(s["fps"]) and not s["quiet"]]
        log("%d samples, %d quiet points; consumers: %d started, %d stopped, %d stalled, %d killed; "
            "xmem-inspect failed %d times" %
            (len(samples), len(self.quiet), self.counts["started"], self.counts["stopped"],
             self.counts["stalled"], self.counts["killed"], self.inspect_failures))
        if samples:
            last = samples[-1]
            log("published %d frames (median %.1f fps), dropped %d, consumers reaped %d" %
                (last["published"], statistics.median(fps) if fps else 0.0, last["dropped"], last["reaped"]))
        results = verdict(samples, warmup)
        log("verdict: median of the last third minus that of the first third, after %g s of warm-up:" % warmup)
        for metric, (flat, first, last, tolerance) in results.items():
            name = TRENDS[metric][0]
            if first is None:
                log("  %-36s too few samples: GROWING (cannot tell)" % name)
                self.fail("%s: too few samples to judge" % name)
                continue
            log("  %-36s %10.1f -> %10.1f (tolerance %.1f): %s" %
                (name, first, last, tolerance, "flat" if flat else "GROWING"))
            if not flat:
                self.fail("%s grows: %.1f -> %.1f, tolerance %.1f" % (name, first, last, tolerance))
        for f in quiet_checks(self.quiet):
            self.fail(f)
        plot(os.path.join(self.out, "samples.csv"), os.path.join(self.out, "soak.png"), warmup,
             [q["t_s"] for q in self.quiet])
        summary = {
            "seed": self.args.seed, "duration_s": self.args.duration, "interval_s": self.args.interval,
            "warmup_s": warmup, "pattern": PATTERN, "samples": len(samples), "quiet_points": len(self.quiet),
            "consumers": self.counts, "inspect_failures": self.inspect_failures,
            "trend": {m: {"flat": r[0], "first": r[1], "last": r[2], "tolerance": r[3]} for m, r in results.items()},
            "failures": self.failures, "ok": not self.failures,
        }
        with open(os.path.join(self.out, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
        log("wrote %s/{samples.csv,events.csv,soak.png,summary.json}" % self.out)
        if self.failures:
            log("RESULT: FAIL (%d problem(s))" % len(self.failures))
            for f in self.failures:
                log("  - " + f)
            return 1
        log("RESULT: PASS (seed %d)" % self.args.seed)
        return 0


def plot(csv_path, png_path, warmup, quiet_times):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))

    def col(name, scale=1.0):
        return [float(r[name]) * scale if r[name] not in ("", "nan") else float("nan") for r in rows]

    t = col("t_s")
    panels = [
        ("producer RSS (MiB)", [("VmRSS", col("producer_rss_kib", 1 / 1024))]),
        ("producer open fds", [("fds", col("producer_fds"))]),
        ("producer threads", [("threads", col("producer_threads"))]),
        ("frames published / s", [("fps", col("fps"))]),
        ("slots", [("free", col("slots_free")), ("held by consumers", col("slots_consumer_held")),
                   ("held for dead consumers", col("slots_orphaned"))]),
        ("consumers", [("registered", col("consumers_attached")), ("running", col("consumers_running")),
                       ("stalled", col("consumers_stalled")), ("records of dead processes", col("consumers_stale"))]),
    ]
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 2.2 * len(panels)), sharex=True)
    for ax, (title, lines) in zip(axes, panels):
        for label, values in lines:
            ax.plot(t, values, label=label, linewidth=0.8, drawstyle="steps-post")
        ax.set_ylabel(title, fontsize=8)
        ax.axvspan(0, warmup, color="0.9", zorder=0)
        for q in quiet_times:
            ax.axvline(q, color="0.6", linestyle=":", linewidth=0.8)
        if len(lines) > 1:
            ax.legend(fontsize=7, loc="upper right")
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("time (s); shaded: warm-up; dotted: quiet points")
    fig.suptitle("xmem soak: xmemsink %dx%d@%d, churning consumers" % (WIDTH, HEIGHT, FPS))
    fig.tight_layout()
    fig.savefig(png_path, dpi=90)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=3600)
    parser.add_argument("--out", default=None)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--interval", type=float, default=None, help="seconds between samples")
    parser.add_argument("--warmup", type=float, default=None)
    parser.add_argument("--quiet-every", type=float, default=None)
    parser.add_argument("--build-dir", default=os.environ.get("XMEM_BUILD_DIR", "build"))
    parser.add_argument("--inject-leak", action="store_true",
                        help="from the warm-up on, attach a consumer that stalls forever every 15 s")
    parser.add_argument("--self-test", action="store_true", help="check the verdict on synthetic series")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    if args.duration < 60:
        parser.error("--duration must be at least 60 s")
    if args.seed is None:
        args.seed = int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF
    if args.interval is None:
        args.interval = 1.0 if args.duration <= 900 else 2.0
    if args.out is None:
        args.out = os.path.join(ROOT, "bench", "results",
                                "soak-" + datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
    args.build_dir = os.path.abspath(args.build_dir)
    os.makedirs(args.out, exist_ok=True)
    soak = Soak(args)
    try:
        return soak.run()
    except (RuntimeError, OSError) as e:
        log("error: %s" % e)
        try:
            soak.cleanup()
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass
        return 2


if __name__ == "__main__":
    sys.exit(main())
