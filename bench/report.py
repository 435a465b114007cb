#!/usr/bin/env python3
# report.py - turns the benchmarks' JSON records into bench/results/<suite>.json, a
# table on stdout, and docs/benchmarks.md. Run by bench/run.sh; no number is typed here.
"""Usage:
  report.py collect --suite NAME --command CMD [--quick 0|1] [--build-dir DIR] --out FILE < records
  report.py table FILE...
  report.py docs --out docs/benchmarks.md FILE...
"""

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys

COLUMNS = [
    # key, header, format
    ("pair", "pair", "{}"),
    ("mode", "mode", "{}"),
    ("size", "size", "{}"),
    ("consumers", "consumers", "{}"),
    ("fps", "frames/s", "{:.1f}"),
    ("p50_us", "p50 µs", "{:.1f}"),
    ("p99_us", "p99 µs", "{:.1f}"),
    ("max_us", "max µs", "{:.1f}"),
    ("producer_cpu_us_per_frame", "producer CPU µs/frame", "{:.2f}"),
    ("consumers_cpu_us_per_frame", "consumers CPU µs/frame", "{:.2f}"),
    ("cpu_us_per_frame", "total CPU µs/frame", "{:.2f}"),
    ("dropped", "dropped", "{}"),
]

# The GStreamer suite: the same, plus where the producer's memory came from and
# whether the run worked (a pair can be unavailable, a run can fail).
GST_COLUMNS = COLUMNS + [
    ("memory", "producer's memory", "{}"),
    ("status", "status", "{}"),
]

# The Python suite: per pair and device, latency from the producer's stamp (paced
# pairs), the consumer's cost from frame in hand to tensor, and each side's CPU.
PYTHON_COLUMNS = [
    ("pair", "pair", "{}"),
    ("device", "device", "{}"),
    ("mode", "mode", "{}"),
    ("size", "size", "{}"),
    ("fps", "frames/s", "{:.1f}"),
    ("p50_us", "p50 µs", "{:.1f}"),
    ("p99_us", "p99 µs", "{:.1f}"),
    ("receive_p50_us", "to tensor p50 µs", "{:.1f}"),
    ("receive_p99_us", "to tensor p99 µs", "{:.1f}"),
    ("producer_cpu_us_per_frame", "producer CPU µs/frame", "{:.1f}"),
    ("consumer_cpu_us_per_frame", "consumer CPU µs/frame", "{:.1f}"),
    ("status", "status", "{}"),
]

# The policies suite: one consumer's figures and the producer's, and where a stalled
# fifo-spill consumer ran beside them, its frames and the spill tier's use.
POLICIES_COLUMNS = [
    ("mode", "mode", "{}"),
    ("consumer_policy", "consumer policy", "{}"),
    ("consumer_wait", "wait", "{}"),
    ("size", "size", "{}"),
    ("fps", "frames/s", "{:.1f}"),
    ("p50_us", "p50 µs", "{:.1f}"),
    ("p99_us", "p99 µs", "{:.1f}"),
    ("max_us", "max µs", "{:.1f}"),
    ("producer_cpu_us_per_frame", "producer CPU µs/frame", "{:.2f}"),
    ("consumers_cpu_us_per_frame", "consumer CPU µs/frame", "{:.2f}"),
    ("cpu_us_per_frame", "total CPU µs/frame", "{:.2f}"),
    ("dropped", "dropped", "{}"),
    ("stall", "fifo-spill consumer stalls", "{}"),
    ("stalled_received", "its frames", "{}"),
    ("stalled_lost", "its lost", "{}"),
    ("spill_peak_mib", "spill tier peak MiB", "{:.1f}"),
    ("spilled", "spilled", "{}"),
    ("spill_full", "tier full", "{}"),
    ("status", "status", "{}"),
]

# The classes suite: the core's latency measurement with a pool of one size class or
# of several, and the producer's acquire + stamp + publish, one call's wall time.
CLASSES_COLUMNS = [
    ("mode", "mode", "{}"),
    ("classes", "size classes", "{}"),
    ("size", "size", "{}"),
    ("consumers", "consumers", "{}"),
    ("fps", "frames/s", "{:.1f}"),
    ("p50_us", "publish→receive p50 µs", "{:.1f}"),
    ("p99_us", "publish→receive p99 µs", "{:.1f}"),
    ("max_us", "max µs", "{:.1f}"),
    ("producer_call_p50_us", "acquire+publish p50 µs", "{:.1f}"),
    ("producer_call_p99_us", "acquire+publish p99 µs", "{:.1f}"),
    ("producer_cpu_us_per_frame", "producer CPU µs/frame", "{:.2f}"),
    ("consumers_cpu_us_per_frame", "consumers CPU µs/frame", "{:.2f}"),
    ("cpu_us_per_frame", "total CPU µs/frame", "{:.2f}"),
    ("dropped", "dropped", "{}"),
    ("status", "status", "{}"),
]

SUITE_COLUMNS = {"gst": GST_COLUMNS, "python": PYTHON_COLUMNS, "policies": POLICIES_COLUMNS,
                 "classes": CLASSES_COLUMNS}

# What the producer's buffers came from, by the allocation record of xmem-bench-gst.
MEMORY = {"pool": "sink's pool", "allocator": "sink's allocator", "own": "own pool, sink's allocator", "none": "malloc"}


def derived(record):
    """The table's computed cells: memory and status."""
    r = dict(record)
    kind = r.get("allocation")
    if kind is not None:
        r["memory"] = MEMORY.get(kind.split(" ")[0], kind)
        if r.get("foreign_frames"):
            r["memory"] += f", {r['foreign_frames']} copied"
    if r.get("stall_ms") is not None:
        r["stall"] = f"{r['stall_ms']} ms every {r['stall_every_ms']} ms"
        r["spill_peak_mib"] = r["spill_peak_bytes"] / 2**20
    if not r.get("available", True):
        r["status"] = "unavailable"
        r["size"] = "-"
    else:
        r["status"] = "ok" if r.get("ok", True) else "FAILED"
    return r


def machine():
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    model, hypervisor = None, False
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "Hardware", "Model") and model is None:
                    model = value.strip()
                if key == "flags" and "hypervisor" in value.split():
                    hypervisor = True
    except OSError:
        pass
    memory = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    memory = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return {
        "nproc": cpus,
        "cpu_model": model or platform.processor() or "unknown",
        "virtualized": hypervisor,
        "memory_gib": memory,
        "kernel": platform.release(),
        "arch": platform.machine(),
    }


def git_revision():
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, check=True)
        return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        pass
    # No git (a bare root): HEAD's commit read from .git, whether the tree was clean unknown.
    try:
        with open(".git/HEAD") as f:
            head = f.read().strip()
        if head.startswith("ref: "):
            with open(os.path.join(".git", head[5:])) as f:
                head = f.read().strip()
        return head[:7] + "-unchecked"
    except OSError:
        return "unknown"


def os_release():
    """PRETTY_NAME of /etc/os-release, e.g. Debian GNU/Linux 13 (trixie)."""
    try:
        with open("/etc/os-release") as f:
            for line in f:
                key, _, value = line.strip().partition("=")
                if key == "PRETTY_NAME":
                    return value.strip('"')
    except OSError:
        pass
    return None


def build_type(build_dir):
    try:
        with open(os.path.join(build_dir, "meson-info", "intro-buildoptions.json")) as f:
            for option in json.load(f):
                if option["name"] == "buildtype":
                    return option["value"]
    except (OSError, ValueError, KeyError):
        pass
    return "unknown"


def collect(args):
    measurements = []
    for line in sys.stdin:
        line = line.strip()
        if line:
            measurements.append(json.loads(line))
    result = {
        "suite": args.suite,
        "command": args.command,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "quick": bool(int(args.quick)),
        "revision": git_revision(),
        "buildtype": build_type(args.build_dir),
        "platform": args.platform,
        "os": os_release(),
        "python": platform.python_version(),
        "machine": machine(),
        "measurements": measurements,
    }
    if args.suite == "python":
        for module in ("torch", "numpy"):
            try:
                result[module] = __import__(module).__version__
            except ImportError:
                pass
    if args.load:
        # /proc/loadavg's 1, 5 and 15 minute figures before and after the suite ran:
        # how much other work shared the machine.
        result["load_average"] = dict(zip(("start", "end"), args.load))
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1, ensure_ascii=False)
        f.write("\n")


def cell(record, key, fmt):
    value = record.get(key)
    if value is None:
        return "-"
    return fmt.format(value)


def columns(result):
    return SUITE_COLUMNS.get(result["suite"], COLUMNS)


def rows(result):
    return [[cell(derived(m), key, fmt) for key, _, fmt in columns(result)] for m in result["measurements"]]


def text_table(headers, body):
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(headers, widths))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in body]
    return lines


def markdown_table(headers, body, left=3):
    lines = ["| " + " | ".join(headers) + " |",
             "|" + "|".join("---" if i < left else "---:" for i in range(len(headers))) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return lines


def table(args):
    for path in args.files:
        with open(path) as f:
            result = json.load(f)
        headers = [header for _, header, _ in columns(result)]
        print(f"{result['suite']}: {result['date']}, {describe_machine(result)}")
        print("\n".join(text_table(headers, rows(result))))
        for note in notes(result):
            print(note)
        extra = EXTRA_TABLES.get(result["suite"])
        if extra:
            for title, (headers, body) in extra(result):
                print(f"\n{title}")
                print("\n".join(text_table(headers, body)))
        bad = [m for m in result["measurements"] if not m.get("ok", True)]
        if bad:
            print(f"{len(bad)} measurement(s) failed (dropped or corrupt frames, or a consumer error)")
        print()


def notes(result):
    """One line per failed or unavailable measurement: why."""
    out = []
    for m in result["measurements"]:
        if not m.get("available", True):
            out.append(f"- {m['pair']}: unavailable: {m.get('error', '?')}")
        elif not m.get("ok", True) and m.get("error"):
            out.append(f"- {m['pair']} {m['mode']} {m['size']}: FAILED: {m['error']}")
    return out


def describe_machine(result):
    m = result["machine"]
    virtual = ", virtualized" if m.get("virtualized") else ""
    return f"{m['nproc']} CPUs {m['cpu_model']}{virtual}, Linux {m['kernel']}"


def find(result, **want):
    for m in result["measurements"]:
        if all(m.get(k) == v for k, v in want.items()):
            return m
    return None


def summary_core(result):
    """Sentences computed from the records, for the core suite."""
    lines = []
    latency = [m for m in result["measurements"] if m["pair"] == "xmem-core" and m["mode"] == "latency"]
    if len(latency) >= 2:
        small = min(latency, key=lambda m: m["frame_bytes"])
        large = max(latency, key=lambda m: m["frame_bytes"])
        lines.append(
            f"- Frame size: at {small['fps_target']} frames/s the p50 latency is {small['p50_us']:.1f} µs at "
            f"{small['size']} and {large['p50_us']:.1f} µs at {large['size']}, whose frames are "
            f"{large['frame_bytes'] / small['frame_bytes']:.0f} times larger; CPU per frame is "
            f"{small['cpu_us_per_frame']:.1f} and {large['cpu_us_per_frame']:.1f} µs.")
    core = find(result, pair="xmem-core", mode="latency", size=latency[0]["size"]) if latency else None
    floor = find(result, pair="eventfd-memfd", mode="latency")
    if core and floor:
        lines.append(
            f"- Against the floor (eventfd-memfd, same pacing, same sleep and wake-up): the core adds "
            f"{core['p50_us'] - floor['p50_us']:.1f} µs to the p50 latency, "
            f"{core['producer_cpu_us_per_frame'] - floor['producer_cpu_us_per_frame']:.1f} µs of producer CPU "
            f"and {core['consumers_cpu_us_per_frame'] - floor['consumers_cpu_us_per_frame']:.1f} µs of consumer "
            f"CPU per frame ({core['size']}).")
    if core:
        fan = find(result, pair="xmem-core", mode="fanout", size=core["size"])
        if fan:
            lines.append(
                f"- Fan-out: with {fan['consumers']} consumers the producer spends "
                f"{fan['producer_cpu_us_per_frame']:.1f} µs of CPU per frame against "
                f"{core['producer_cpu_us_per_frame']:.1f} µs with {core['consumers']}; p50 latency over all "
                f"consumers is {fan['p50_us']:.1f} µs.")
    through = [m for m in result["measurements"] if m["pair"] == "xmem-core" and m["mode"] == "throughput"]
    if through:
        lines.append(
            "- Unthrottled: " + ", ".join(f"{m['fps']:.0f} frames/s at {m['size']}" for m in through) +
            f" ({through[0]['policy']} policy, queue of {through[0]['queue_size']}, "
            f"{through[0]['slots']} slots, nothing dropped: "
            f"{'yes' if all(m['dropped'] == 0 for m in through) else 'NO'}).")
    dropped = sum(m["dropped"] for m in result["measurements"] if m.get("fps_target"))
    lines.append(f"- Frames dropped at a fixed rate, all measurements together: {dropped}.")
    return lines


def gst_find(result, pair, mode, size):
    m = find(result, pair=pair, mode=mode, size=size)
    return m if m and m.get("ok", True) and m.get("available", True) and "p50_us" in m else None


def ratio(a, b, key, fmt="{:.2f}×"):
    if not a or not b or a.get(key) is None or not b.get(key):
        return "-"
    return fmt.format(a[key] / b[key])


def difference(a, b, key):
    if not a or not b or a.get(key) is None or b.get(key) is None:
        return "-"
    return f"{a[key] - b[key]:+.1f}"


def gst_sizes(result):
    seen = []
    for m in result["measurements"]:
        if m.get("available", True) and m.get("size") not in seen:
            seen.append(m["size"])
    return seen


def gst_ratios(result):
    """Each pair against shm and against the floor, at every mode and size."""
    headers = ["mode", "size", "pair", "p50 ×shm", "p50 ×floor", "p50 − floor µs", "p99 ×shm",
               "frames/s ×shm", "total CPU ×shm", "total CPU ×floor", "producer CPU ×shm"]
    body = []
    pairs = [p for p in ("xmem", "unixfd", "shm") if any(m["pair"] == p and m.get("available", True)
                                                         for m in result["measurements"])]
    for mode in ("latency", "throughput", "fanout"):
        for size in gst_sizes(result):
            shm, floor = gst_find(result, "shm", mode, size), gst_find(result, "floor", mode, size)
            for pair in pairs:
                m = gst_find(result, pair, mode, size)
                if not m:
                    if find(result, pair=pair, mode=mode, size=size):
                        body.append([mode, size, pair] + ["failed"] + ["-"] * (len(headers) - 4))
                    continue
                body.append([mode, size, pair,
                             ratio(m, shm, "p50_us"), ratio(m, floor, "p50_us"), difference(m, floor, "p50_us"),
                             ratio(m, shm, "p99_us"), ratio(m, shm, "fps"),
                             ratio(m, shm, "cpu_us_per_frame"), ratio(m, floor, "cpu_us_per_frame"),
                             ratio(m, shm, "producer_cpu_us_per_frame")])
    return headers, body


HD, FOUR_K, VGA = "1920x1080", "3840x2160", "640x480"


def gst_targets(result):
    """The issue's targets for xmem, each with what was measured and whether it is met."""
    x = {(m, s): gst_find(result, "xmem", m, s) for m in ("latency", "throughput", "fanout") for s in (VGA, HD, FOUR_K)}
    shm = {(m, s): gst_find(result, "shm", m, s) for m in ("latency", "throughput") for s in (HD,)}
    floor = gst_find(result, "floor", "latency", HD)
    out = []

    def target(text, a, b, measured, met):
        if a is None or b is None:
            out.append([text, "not measured", "-"])
        else:
            out.append([text, measured(a, b), "met" if met(a, b) else "MISSED"])

    target("1080p60 p50 ≤ ½ × shm's", x["latency", HD], shm["latency", HD],
           lambda a, b: f"{a['p50_us']:.1f} µs against {b['p50_us']:.1f} µs: {a['p50_us'] / b['p50_us']:.2f}×",
           lambda a, b: a["p50_us"] <= 0.5 * b["p50_us"])
    target("1080p60 p50 ≤ floor's + 25 µs", x["latency", HD], floor,
           lambda a, b: f"{a['p50_us']:.1f} µs against {b['p50_us']:.1f} µs: {a['p50_us'] - b['p50_us']:+.1f} µs",
           lambda a, b: a["p50_us"] - b["p50_us"] <= 25)
    target("1080p unthrottled frames/s ≥ shm's", x["throughput", HD], shm["throughput", HD],
           lambda a, b: f"{a['fps']:.0f} against {b['fps']:.0f}: {a['fps'] / b['fps']:.2f}×",
           lambda a, b: a["fps"] >= b["fps"])
    target("1080p60 CPU per frame ≤ shm's", x["latency", HD], shm["latency", HD],
           lambda a, b: f"{a['cpu_us_per_frame']:.1f} µs against {b['cpu_us_per_frame']:.1f} µs: "
                        f"{a['cpu_us_per_frame'] / b['cpu_us_per_frame']:.2f}×",
           lambda a, b: a["cpu_us_per_frame"] <= b["cpu_us_per_frame"])
    target("4K p50 ≤ 1.3 × 480p p50 (60 fps)", x["latency", FOUR_K], x["latency", VGA],
           lambda a, b: f"{a['p50_us']:.1f} µs against {b['p50_us']:.1f} µs: {a['p50_us'] / b['p50_us']:.2f}×",
           lambda a, b: a["p50_us"] <= 1.3 * b["p50_us"])
    target("1080p60 producer CPU, 4 consumers < 2 × 1 consumer's", x["fanout", HD], x["latency", HD],
           lambda a, b: f"{a['producer_cpu_us_per_frame']:.1f} µs against {b['producer_cpu_us_per_frame']:.1f} µs: "
                        f"{a['producer_cpu_us_per_frame'] / b['producer_cpu_us_per_frame']:.2f}×",
           lambda a, b: a["producer_cpu_us_per_frame"] < 2 * b["producer_cpu_us_per_frame"])
    return ["target (xmem)", "measured", "verdict"], out


def gst_against_unixfd(result):
    """xmem and shm against unixfdsink/unixfdsrc, where the run has them."""
    headers = ["mode", "size", "pair", "p50 ×unixfd", "p99 ×unixfd", "frames/s ×unixfd", "total CPU ×unixfd",
               "producer CPU ×unixfd", "consumers CPU ×unixfd"]
    body = []
    for mode in ("latency", "throughput", "fanout"):
        for size in gst_sizes(result):
            ref = gst_find(result, "unixfd", mode, size)
            if not ref:
                continue
            for pair in ("xmem", "shm"):
                m = gst_find(result, pair, mode, size)
                if m:
                    body.append([mode, size, pair] + [ratio(m, ref, key) for key in (
                        "p50_us", "p99_us", "fps", "cpu_us_per_frame", "producer_cpu_us_per_frame",
                        "consumers_cpu_us_per_frame")])
    return headers, body


def gst_tables(result):
    tables = [("Ratios: each pair against shmsink/shmsrc and against the in-process floor", gst_ratios(result))]
    headers, body = gst_against_unixfd(result)
    if body:
        tables.append(("Ratios: xmem and shm against unixfdsink/unixfdsrc (below 1× is better, except frames/s)",
                       (headers, body)))
    tables.append(("Targets", gst_targets(result)))
    return tables


# The platforms side by side: each pair against another within one platform's run, at 1080p.
CROSS_COMPARISONS = [("xmem", "shm"), ("xmem", "unixfd"), ("shm", "unixfd")]


def cross_platform(platforms):
    """Ratios within each platform's gst run, one row per platform and comparison."""
    headers = ["platform", "GStreamer", "comparison", "p50 (1080p60)", "p99 (1080p60)", "total CPU (1080p60)",
               "frames/s (1080p, unthrottled)", "p50 (1080p60, 4 consumers)", "producer CPU (4 consumers)"]
    body = []
    for name, title, suites in platforms:
        result = suites.get("gst")
        if not result:
            continue
        gstreamer = next((x["gstreamer"] for x in result["measurements"] if x.get("gstreamer")), "-")
        for a, b in CROSS_COMPARISONS:
            la, lb = gst_find(result, a, "latency", HD), gst_find(result, b, "latency", HD)
            if not la or not lb:
                continue
            ta, tb = gst_find(result, a, "throughput", HD), gst_find(result, b, "throughput", HD)
            fa, fb = gst_find(result, a, "fanout", HD), gst_find(result, b, "fanout", HD)
            body.append([title, gstreamer.replace("GStreamer ", ""), f"{a} ÷ {b}",
                         ratio(la, lb, "p50_us"), ratio(la, lb, "p99_us"), ratio(la, lb, "cpu_us_per_frame"),
                         ratio(ta, tb, "fps"), ratio(fa, fb, "p50_us"), ratio(fa, fb, "producer_cpu_us_per_frame")])
    return headers, body


def python_find(result, pair, device):
    for m in result["measurements"]:
        if m["pair"] == pair and m.get("device") == device and m.get("available", True) and m.get("ok", True):
            return m
    return None


def python_ratios(result):
    """xmem against what a Python process does without it, on the same frames."""
    headers = ["comparison", "device", "p50 latency", "p99 latency", "to tensor p50", "frames/s",
               "producer CPU", "consumer CPU"]
    body = []
    x, a = python_find(result, "xmem-gst", "cpu"), python_find(result, "appsink", "cpu")
    if x and a:
        body.append(["xmem-gst ÷ appsink", "cpu", "-", "-", ratio(x, a, "receive_p50_us", "{:.3g}×"), ratio(x, a, "fps", "{:.3g}×"), "-",
                     ratio(x, a, "consumer_cpu_us_per_frame", "{:.3g}×")])
    for device in ("cpu", "cuda"):
        x, t = python_find(result, "xmem", device), python_find(result, "torch-mp", device)
        if x and t:
            body.append(["xmem ÷ torch-mp", device, ratio(x, t, "p50_us", "{:.3g}×"), ratio(x, t, "p99_us", "{:.3g}×"),
                         ratio(x, t, "receive_p50_us", "{:.3g}×"), ratio(x, t, "fps", "{:.3g}×"), ratio(x, t, "producer_cpu_us_per_frame", "{:.3g}×"),
                         ratio(x, t, "consumer_cpu_us_per_frame", "{:.3g}×")])
    return headers, body


def python_tables(result):
    return [("Ratios (below 1× is better for xmem, except frames/s)", python_ratios(result))]


def policies_rounds(result, baseline, other):
    """(baseline, other) records of the same round: the suite runs its pairs in rounds, in order."""
    a = [m for m in result["measurements"] if m["mode"] == baseline]
    b = [m for m in result["measurements"] if m["mode"] == other]
    return list(zip(a, b))


def usable(m):
    return m.get("ok", True) and "p50_us" in m


def policies_stall(result):
    """The latest consumer and the producer beside the stalled fifo-spill consumer, against without it."""
    headers = ["round", "size", "comparison", "latest p50 ×", "latest p99 ×", "producer frames/s ×",
               "producer CPU µs/frame −", "fifo-spill frames", "fifo-spill lost", "tier peak MiB",
               "tier cap MiB", "spilled", "tier full"]
    body = []
    for i, (off, on) in enumerate(policies_rounds(result, "stall-off", "stall-on"), 1):
        # The stalled consumer's own figures count even in a failed run: they say why it failed.
        figures = [f"{on['stalled_received']} of {on['frames']}", str(on["stalled_lost"]),
                   f"{on['spill_peak_bytes'] / 2**20:.1f}", f"{on['spill_cap_bytes'] / 2**20:.0f}",
                   str(on["spilled"]), str(on["spill_full"])] if "stalled_lost" in on else ["-"] * 6
        if not usable(off) or "p50_us" not in on:
            body.append([str(i), on["size"], "stall-on ÷ stall-off", "failed", "-", "-", "-"] + figures)
            continue
        body.append([str(i), on["size"], "stall-on ÷ stall-off", ratio(on, off, "p50_us"), ratio(on, off, "p99_us"),
                     ratio(on, off, "fps", "{:.3f}×"), difference(on, off, "producer_cpu_us_per_frame")] + figures)
    return headers, body


def policies_wake(result):
    """wake=spin-before against sleeping, the same round."""
    headers = ["round", "size", "comparison", "p50 ×", "p99 ×", "p50 − sleep µs", "consumer CPU µs/frame −",
               "producer CPU µs/frame −", "total CPU µs/frame −"]
    body = []
    for i, (sleep, spin) in enumerate(policies_rounds(result, "wake-sleep", "wake-spin-before"), 1):
        if not usable(sleep) or not usable(spin):
            body.append([str(i), spin["size"], "spin-before ÷ sleep", "failed"] + ["-"] * (len(headers) - 4))
            continue
        body.append([str(i), spin["size"], "spin-before ÷ sleep", ratio(spin, sleep, "p50_us"),
                     ratio(spin, sleep, "p99_us"), difference(spin, sleep, "p50_us"),
                     difference(spin, sleep, "consumers_cpu_us_per_frame"),
                     difference(spin, sleep, "producer_cpu_us_per_frame"),
                     difference(spin, sleep, "cpu_us_per_frame")])
    return headers, body


def policies_tables(result):
    tables = []
    headers, body = policies_stall(result)
    if body:
        tables.append(("Ratios: beside a stalled fifo-spill consumer ÷ without it (the latest consumer and the "
                       "producer; the CPU column is the difference, in µs)", (headers, body)))
    headers, body = policies_wake(result)
    if body:
        tables.append(("Ratios: wake=spin-before ÷ sleeping (the CPU columns are differences, in µs; "
                       "above 0 costs more)", (headers, body)))
    return tables


def class_counts(result):
    """The fewest and the most size classes the suite's pools had."""
    counts = sorted({m["classes"] for m in result["measurements"] if "classes" in m})
    return (counts[0], counts[-1]) if len(counts) > 1 else None


def classes_rounds(result):
    """(fewest, most) records of the same round, both usable: the suite runs one of each per round, in order."""
    counts = class_counts(result)
    if not counts:
        return []
    a = [m for m in result["measurements"] if m.get("classes") == counts[0]]
    b = [m for m in result["measurements"] if m.get("classes") == counts[1]]
    return [(x, y) for x, y in zip(a, b) if usable(x) and usable(y)]


def classes_name(k):
    return f"{k} class" if k == 1 else f"{k} classes"


# The figures the classes table compares: record key, header, format.
CLASSES_FIGURES = [
    ("p50_us", "publish→receive p50 µs", "{:.1f}"),
    ("p99_us", "publish→receive p99 µs", "{:.1f}"),
    ("producer_call_p50_us", "acquire+publish p50 µs", "{:.1f}"),
    ("producer_call_p99_us", "acquire+publish p99 µs", "{:.1f}"),
    ("producer_cpu_us_per_frame", "producer CPU µs/frame", "{:.2f}"),
    ("consumers_cpu_us_per_frame", "consumers CPU µs/frame", "{:.2f}"),
]


def classes_table(result):
    """Each pool's figures over the rounds, lowest–highest, and the most classes ÷ the fewest, round by round."""
    headers = ["pool", "size", "rounds"] + [header for _, header, _ in CLASSES_FIGURES]
    pairs = classes_rounds(result)
    if not pairs:
        return headers, []
    fewest, most = pairs[0][0]["classes"], pairs[0][1]["classes"]
    size, n = pairs[0][0]["size"], str(len(pairs))
    body = []
    for k, runs in ((fewest, [a for a, _ in pairs]), (most, [b for _, b in pairs])):
        body.append([classes_name(k), size, n] +
                    [spread([m[key] for m in runs], fmt) for key, _, fmt in CLASSES_FIGURES])
    ratios = []
    for key, _, _ in CLASSES_FIGURES:
        values = [b[key] / a[key] for a, b in pairs if a[key]]
        ratios.append(spread(values, "{:.2f}") + "×" if values else "-")
    body.append([f"{classes_name(most)} ÷ {classes_name(fewest)}", size, n] + ratios)
    return headers, body


def classes_tables(result):
    counts = class_counts(result)
    headers, body = classes_table(result)
    if not body:
        return []
    return [(f"{classes_name(counts[1])} ÷ {classes_name(counts[0])}: each figure over the rounds, lowest–highest; "
             "the ratio row compares the two runs of each round (below 1× is better with more classes)",
             (headers, body))]


EXTRA_TABLES = {"gst": gst_tables, "python": python_tables, "policies": policies_tables,
                "classes": classes_tables}


# The IPC pairs, in the order the sentences name them.
IPC_PAIRS = ("xmem", "shm", "unixfd")

# Where each pair's producer gets its buffers, for the sentences.
SOURCE_OF_BUFFERS = {"xmem": "xmemsink's pool", "shm": "shmsink's allocator",
                     "unixfd": "its own pool over unixfdsink's allocator", "floor": "malloc (floor)"}


def present(result):
    """The IPC pairs measured in RESULT (unixfd is missing before GStreamer 1.24)."""
    return [p for p in IPC_PAIRS if gst_find(result, p, "latency", HD)]


def listing(values, last="and"):
    values = list(values)
    return values[0] if len(values) == 1 else ", ".join(values[:-1]) + f" {last} " + values[-1]


def summary_gst(result):
    """Sentences computed from the records, for the GStreamer suite."""
    lines = []
    pairs = present(result)
    latency = {p: gst_find(result, p, "latency", HD) for p in pairs + ["floor"]}
    floor = latency["floor"]
    broken = [(p, gst_find(result, p, "breakdown", HD)) for p in pairs]
    broken = [(p, b) for p, b in broken if b]
    bf = gst_find(result, "floor", "breakdown", HD)
    if broken and bf:
        lines.append(
            "- Where the time goes (*breakdown* rows, 1080p60, p50 from the stamp): the frame reaches the sink " +
            ", ".join(f"{b['stage_sink_p50_us']:.1f} µs ({p})" for p, b in broken) +
            f" and {bf['stage_sink_p50_us']:.1f} µs (floor: the appsink) after the stamp, which is appsrc's queue "
            "and thread, the same in every pair; it leaves the source in the consumer after " +
            listing(f"{b['stage_source_p50_us']:.1f} µs ({p})" for p, b in broken) + ", so " +
            listing(f"{b['stage_source_p50_us'] - b['stage_sink_p50_us']:.1f}" for _, b in broken) +
            " µs go from the sink's pad to the source's: the sink, the wake-up of the consumer's thread and "
            "the source.")
        lines.append(
            "- The producer app's thread spends " +
            listing(f"{b['app_acquire_cpu_us_per_frame']:.1f} µs from {SOURCE_OF_BUFFERS[p]}"
                    for p, b in broken + [("floor", bf)]) +
            " getting a buffer (CPU per frame); stamping and pushing it costs " +
            listing(f"{b['app_push_cpu_us_per_frame']:.1f}" for _, b in broken + [("floor", bf)]) + " µs.")

    def threads(m, key):
        return ", ".join(f"{name} {us:.1f}" for name, us in m.get(key, {}).items() if us >= 0.05) or "-"

    with_threads = [latency[p] for p in pairs if latency[p].get("producer_threads_us_per_frame") is not None]
    if with_threads:
        lines.append(
            "- CPU µs per frame by thread at 1080p60 (*producer-app+*: threads started by the app's thread, "
            "such as shmsink's poll thread, which takes the consumers' acknowledgements, and xmem's I/O thread): "
            + "; ".join(f"{m['pair']} producer {threads(m, 'producer_threads_us_per_frame')}, consumer "
                        f"{threads(m, 'consumers_threads_us_per_frame')}" for m in with_threads) + ".")
    if pairs and floor:
        lines.append(
            f"- The floor takes {floor['p50_us']:.1f} µs at 1080p60; " +
            listing(f"{p} adds {latency[p]['p50_us'] - floor['p50_us']:.1f} µs" for p in pairs) + " to it.")
    if pairs:
        by_size = {p: [gst_find(result, p, "latency", s) for s in (VGA, HD, FOUR_K)] for p in pairs}
        if all(by_size[pairs[0]]):
            lines.append("- Frame size, at 60 frames/s (640x480, 1920x1080, 3840x2160): p50 " + "; ".join(
                f"{p} " + ", ".join(f"{m['p50_us']:.1f}" if m else "-" for m in by_size[p]) + " µs"
                for p in pairs) + ".")
        through = {p: [gst_find(result, p, "throughput", s) for s in (VGA, HD, FOUR_K)] for p in pairs}
        if any(through[pairs[0]]):
            lines.append("- Unthrottled frames/s (640x480, 1920x1080, 3840x2160): " + "; ".join(
                f"{p} " + ", ".join(f"{m['fps']:.0f}" if m else "-" for m in through[p]) for p in pairs) + ".")
        fan = [(gst_find(result, p, "fanout", HD), latency[p]) for p in pairs]
        fan = [(a, b) for a, b in fan if a and b]
        if fan:
            lines.append("- Fan-out at 1080p60, the producer's CPU per frame with 4 consumers against 1: " + ", ".join(
                f"{a['pair']} {a['producer_cpu_us_per_frame']:.1f} against {b['producer_cpu_us_per_frame']:.1f} µs "
                f"({a['producer_cpu_us_per_frame'] / b['producer_cpu_us_per_frame']:.2f}×)" for a, b in fan) + ".")
    foreign = [m for m in result["measurements"] if m.get("foreign_frames")]
    if foreign:
        lines.append("- Frames the producer got from system memory although the sink proposed an allocator "
                     "(shmsink's area was full; shmsink copies those in): " +
                     ", ".join(f"{m['pair']} {m['mode']} {m['size']}: {m['foreign_frames']} of {m['frames']}"
                               for m in foreign) + ".")
    counted = [m for m in result["measurements"] if m.get("sink_copied") is not None and m["mode"] == "latency"]
    if counted:
        lines.append("- xmemsink's own counters (latency runs): " + ", ".join(
            f"{m['size']}: {m['sink_zero_copy']} frames published in place, {m['sink_copied']} copied"
            for m in counted) + "; the copied ones are the start-up frames, sent before the sink had caps "
                                "and so a pool to propose.")
    dropped = sum(m.get("dropped", 0) for m in result["measurements"])
    lines.append(f"- Frames lost, all measurements together: {dropped}.")
    return lines


def summary_python(result):
    """Sentences computed from the records, for the Python suite."""
    lines = []
    x, a = python_find(result, "xmem-gst", "cpu"), python_find(result, "appsink", "cpu")
    if x and a:
        lines.append(
            f"- From a gst-launch-1.0 pipeline, unthrottled at {x['size']}: a frame becomes a tensor in "
            f"{x['receive_p50_us']:.1f} µs (p50) through xmem, against {a['receive_p50_us']:.1f} µs for appsink's "
            f"map and copy ({x['receive_p50_us'] / a['receive_p50_us']:.3f}×); {x['fps']:.0f} against "
            f"{a['fps']:.0f} frames/s.")
    for device in ("cpu", "cuda"):
        x, t = python_find(result, "xmem", device), python_find(result, "torch-mp", device)
        if x and t:
            lines.append(
                f"- Python to Python at {x['fps_target']:g} frames/s on the {device.upper()}: the frame is a tensor "
                f"in the consumer {x['p50_us']:.1f} µs (p50) after the producer hands it over with xmem, "
                f"{t['p50_us']:.1f} µs with torch.multiprocessing ({x['p50_us'] / t['p50_us']:.3f}×); producer "
                f"CPU {x['producer_cpu_us_per_frame']:.0f} against {t['producer_cpu_us_per_frame']:.0f} µs per frame, "
                f"frames/s {x['fps']:.1f} against {t['fps']:.1f}.")
    missing = [m for m in result["measurements"] if not m.get("available", True)]
    if missing:
        lines.append("- Not measured here: " + "; ".join(
            f"{m['pair']} on {m.get('device', '?')} ({m.get('error', '?')})" for m in missing) + ".")
    return lines


def spread(values, fmt="{:.1f}"):
    """A figure over the rounds: the one value, or lowest–highest."""
    values = sorted(values)
    if not values:
        return "-"
    if len(values) == 1 or fmt.format(values[0]) == fmt.format(values[-1]):
        return fmt.format(values[0])
    # A range of signed figures reads "-15.9 to -4.5", not "-15.9–-4.5".
    return f"{fmt.format(values[0])}{' to ' if fmt.startswith('{:+') else '–'}{fmt.format(values[-1])}"


def summary_policies(result):
    """Sentences computed from the records, for the policies suite."""
    lines = []
    stall = [(a, b) for a, b in policies_rounds(result, "stall-off", "stall-on") if usable(a) and "p50_us" in b]
    if stall:
        off, on = [a for a, _ in stall], [b for _, b in stall]
        n = len(stall)
        rounds = f"over {n} rounds, lowest–highest" if n > 1 else "one round"
        lines.append(
            f"- A fifo-spill consumer stalled for {on[0]['stall_ms']} ms every {on[0]['stall_every_ms']} ms "
            f"beside a latest consumer ({on[0]['size']}, {on[0]['fps_target']} frames/s, {on[0]['frames']} frames; "
            f"{rounds}): the producer kept {spread([m['fps'] for m in on])} frames/s against "
            f"{spread([m['fps'] for m in off])} without it; the latest consumer's p50 was "
            f"{spread([m['p50_us'] for m in on])} µs against {spread([m['p50_us'] for m in off])} µs, its p99 "
            f"{spread([m['p99_us'] for m in on])} µs against {spread([m['p99_us'] for m in off])} µs (ratios "
            f"{spread([b['p50_us'] / a['p50_us'] for a, b in stall], '{:.2f}')}× and "
            f"{spread([b['p99_us'] / a['p99_us'] for a, b in stall], '{:.2f}')}×).")
        if n > 1:
            p50, p99 = [m["p50_us"] for m in off], [m["p99_us"] for m in off]
            lines.append(
                f"- The noise to read those against, the run without the stalled consumer from round to round: "
                f"p50 highest ÷ lowest {max(p50) / min(p50):.2f}×, p99 {max(p99) / min(p99):.2f}×.")
    spilled = [b for _, b in policies_rounds(result, "stall-off", "stall-on") if "stalled_lost" in b]
    if spilled:
        lost = sum(m["stalled_lost"] for m in spilled)
        peak = max(spilled, key=lambda m: m["spill_peak_bytes"])
        lines.append(
            "- The stalled consumer received " +
            ", ".join(f"{m['stalled_received']} of {m['frames']}" for m in spilled) +
            f" frames, lost {lost} in all; the spill tier (host memory, cap {peak['spill_cap_bytes'] / 2**20:.0f} MiB) "
            f"peaked at {spread([m['spill_peak_bytes'] / 2**20 for m in spilled])} MiB (about "
            f"{peak['spill_peak_bytes'] / peak['frame_bytes']:.0f} frames of {peak['frame_bytes'] / 2**20:.2f} MiB), "
            f"{spread([m['spilled'] for m in spilled], '{}')} frames spilled per run, full "
            f"{sum(m['spill_full'] for m in spilled)} times.")
        if stall:
            lines.append(
                f"- Spilling is the producer process's work, on its spill thread: the process's CPU per frame "
                f"(every thread, averaged over the run) was "
                f"{spread([b['producer_process_cpu_us_per_frame'] for _, b in stall])} µs with the stalled consumer, "
                f"{spread([a['producer_process_cpu_us_per_frame'] for a, _ in stall])} µs without; the producing "
                f"thread's own calls (acquire, stamp, publish) {spread([b['producer_cpu_us_per_frame'] for _, b in stall])} "
                f"against {spread([a['producer_cpu_us_per_frame'] for a, _ in stall])} µs per frame, one call's p99 "
                f"{spread([b['producer_call_p99_us'] for _, b in stall])} µs against "
                f"{spread([a['producer_call_p99_us'] for a, _ in stall])} µs.")
    wake = [(a, b) for a, b in policies_rounds(result, "wake-sleep", "wake-spin-before") if usable(a) and usable(b)]
    if wake:
        spin = wake[0][1]
        consumer = [b["consumers_cpu_us_per_frame"] - a["consumers_cpu_us_per_frame"] for a, b in wake]
        producer = [b["producer_cpu_us_per_frame"] - a["producer_cpu_us_per_frame"] for a, b in wake]
        lines.append(
            f"- wake=spin-before ({spin['spin_budget_us']} µs budget) at {spin['size']}, {spin['fps_target']} "
            f"frames/s: p50 {spread([b['p50_us'] for _, b in wake])} µs against "
            f"{spread([a['p50_us'] for a, _ in wake])} µs sleeping "
            f"({spread([b['p50_us'] / a['p50_us'] for a, b in wake], '{:.2f}')}×), for "
            f"{spread(consumer, '{:+.1f}')} µs of consumer CPU per frame and {spread(producer, '{:+.1f}')} µs of "
            f"producer CPU.")
    return lines


def summary_classes(result):
    """Sentences computed from the records, for the classes suite."""
    lines = []
    pairs = classes_rounds(result)
    if len(pairs) > 1:
        fewest = pairs[0][0]

        def noise(key):
            values = [a[key] for a, _ in pairs]
            return f"{max(values) / min(values):.2f}×" if min(values) else "-"

        lines.append(
            f"- The noise to read the ratios against, the runs with {classes_name(fewest['classes'])} from round "
            f"to round: p50 highest ÷ lowest {noise('p50_us')}, p99 {noise('p99_us')}, acquire+publish p50 "
            f"{noise('producer_call_p50_us')}, producer CPU {noise('producer_cpu_us_per_frame')}.")
    dropped = sum(m.get("dropped", 0) for m in result["measurements"])
    lines.append(f"- Frames dropped, all measurements together: {dropped}.")
    return lines


SUMMARIES = {"core": summary_core, "gst": summary_gst, "python": summary_python, "policies": summary_policies,
             "classes": summary_classes}

INTRO = """\
# Benchmarks

<!-- Generated by bench/run.sh --update-docs from bench/results/*/*.json by
     bench/report.py. Do not edit: rerun the script (STYLE.md, rule 12). -->

Every number on this page comes from `bench/run.sh`, which anyone can rerun from a
fresh clone: it builds what it needs into `./build`, writes one JSON object per
measurement to `bench/results/<platform>/<suite>.json` (the platform from
`/etc/os-release`, e.g. `debian12`, or `--platform`), and with `--update-docs`
rewrites this page from the files of every platform (`--docs-only` rewrites it
without measuring). Each platform has a section; each suite in it says the command,
the machine, the load on it and the date.

The machines these ran on are shared, small virtual machines whose other work (builds,
test suites) runs at the same time: the absolute figures move from run to run and
from one platform's run to the other's, so compare pairs as ratios within one run
(the *Ratios* tables), and platforms only by those ratios.
"""

CORE_TEXT = """\
What is measured: `bench/xmem-bench-core` (source in `bench/xmem-bench-core.cpp`)
creates a pool of NV12 frames (width × height × 3/2 bytes per slot), spawns its
consumers as separate processes (`posix_spawn` of itself) and publishes frames to
them. The producer writes a stamp into the first {touched} bytes of each frame
and the consumers read only those {touched} bytes: what is measured is the
zero-copy handoff (acquire, publish, the wake-up, receive, release), not a copy of
the frame, so the numbers should not depend on the frame size.

- **p50/p99/max µs**: publish-to-receive latency, `CLOCK_MONOTONIC` when the
  consumer's `receive()` returns minus the frame's timestamp, taken by the
  producer right before `publish()`. With several consumers, all of their samples
  together. The warmup frames (first touch of every slot) are left out.
- **producer CPU µs/frame**: at a fixed rate, the producer thread's CPU time
  inside acquire, stamp and publish (`CLOCK_THREAD_CPUTIME_ID`, its own overhead
  taken off); the records also hold `producer_process_cpu_us_per_frame`,
  `getrusage()` of the whole process, which adds the benchmark's pacing (a
  `clock_nanosleep` per frame). Unthrottled, `getrusage()` of the whole process.
- **consumers CPU µs/frame**: `getrusage(RUSAGE_SELF)` user + system time of each
  consumer process over the measured frames, summed over the consumers: receive
  (sleeping in `poll()` and waking up), reading the stamp, release.
- **modes**: *latency*, one consumer at a fixed rate; *fanout*, the same with
  several consumers; *throughput*, unthrottled with the block policy, so the
  producer waits for room instead of dropping (its latency is queueing time).
- **eventfd-memfd**: the floor under the core. No pool: the producer stores a
  timestamp in a shared memfd page and writes one eventfd per consumer; each
  consumer sleeps in `poll()`, reads its eventfd and the page. A sleeping xmem
  consumer is woken the same way, so the difference between the two pairs is what
  the pool itself costs.

What limits the numbers: at a fixed rate a consumer sleeps between frames, so
every frame costs one `write()` to its eventfd in the producer and a `poll()` and
a `read()` in the consumer, and the latency is mostly the time the kernel takes
to wake a sleeping process on another CPU, which the eventfd-memfd rows measure
alone. On a virtual machine that wake-up goes through the hypervisor, and after a
frame period of idleness the caches and TLBs are cold, which the core's own
work (a few thousand instructions per frame) pays for too. With several
consumers the producer writes one eventfd per consumer, one after the other, so
its CPU grows with the number of consumers and the last one woken waits longest.
Unthrottled, how often the consumer falls asleep (and must be woken) depends on
the scheduler, so frames/s varies from run to run; p99 and max show scheduling
noise, not the pool.
"""


GST_TEXT = """\
What is measured: `bench/xmem-bench-gst` (source in `bench/xmem-bench-gst.cpp`)
hands NV12 frames from a producer process to consumer processes through a
GStreamer sink/src pair. Every pair runs the same producer and consumer code; only
the two elements in the middle change.

- **producer**: an app, `appsrc ! SINK`. Like an upstream element, it sends an
  ALLOCATION query with the caps once the sink has them and takes its buffers from
  the pool (or else the allocator) in the answer, so that a zero-copy sink gets to
  be zero-copy; where the answer has neither, `gst_buffer_new_allocate()`. It
  writes a 64-byte stamp (a sequence number and `CLOCK_MONOTONIC`, read right
  before `gst_app_src_push_buffer()`) into the first bytes of each frame and fills
  nothing else. appsrc is live and queues at most two frames (`block=true
  max-buffers=2`), so that an unthrottled producer waits for the sink.
- **consumer**: an app, `SRC ! appsink sync=false async=false
  enable-last-sample=false`, that reads the stamp in appsink's new-sample
  callback. The producer spawns its consumers (`posix_spawn` of itself), feeds
  frames until each consumer has one, then 60 frames from the sink's memory as a
  warmup (every slot or block touched once), then the measured frames.
- **xmem**: `xmemsink policy=block sync=false` and `xmemsrc` (caps come from the
  producer). The producer writes into xmemsink's slots; xmemsink publishes them in
  place.
- **shm**: `shmsink wait-for-connection=true sync=false shm-size=`(10 frames + 1
  MiB) and `shmsrc is-live=true` followed by a capsfilter (shm carries no caps).
  shmsink proposes its own allocator, so its frames are zero-copy too, as long as
  the area has room: an allocation that finds the area full gets system memory,
  which shmsink copies in (the *producer's memory* column counts those frames).
- **floor**: `appsrc ! appsink` in one process (a tee before four appsinks for
  fan-out). No second process, no IPC: one hop from the app's thread to appsrc's
  streaming thread, which every other pair makes too. What no pair can beat.
- **unixfd**: `unixfdsink sync=false` and `unixfdsrc` (file descriptors over a
  socket), in GStreamer 1.24 and later; listed as unavailable where the installed
  GStreamer lacks them. Where unixfdsink has `wait-for-connection` (1.26; the
  benchmark asks the element's class, not the version), it is set, so that frames
  wait for the first consumer instead of being dropped. unixfdsink proposes an
  allocator (GStreamer's memfd allocator) and no pool, and nothing else bounds the
  frames in flight: unthrottled, the consumer fell behind until the socket to it
  was full, and then unixfdsink (1.26.2 sends while holding its object lock, which
  its thread needs to read the consumer's releases) and unixfdsrc (which sends
  each release from its streaming thread) waited on each other for good (the first
  Debian 13 run's unthrottled 1080p runs all hung so). So the producer does what a `GstBaseSrc` does with such an answer:
  a pool of its own over that allocator, 8 buffers (xmemsink's default), which
  bounds the frames in flight and reuses the memfds. unixfdsink sends each frame's
  fd to each consumer; unixfdsrc maps it and sends a release message back once
  appsink lets it go. Before 1.28 unixfdsink refuses memory without a file
  descriptor (it does not copy), so the start-up frames come from that pool too.
- **p50/p99/max µs**: from the stamp to the consumer's new-sample callback, all
  consumers' samples together. **frames/s**: the measured frames over the time
  from the first one's push to the last one's arrival. **CPU µs/frame**:
  `getrusage(RUSAGE_SELF)` of the producer process from its first measured push
  until every consumer has reported, and of each consumer from its first measured
  frame to its last, summed over the consumers, per frame. The producer's figure
  includes appsrc's thread and the app's pacing sleep, the same for every pair;
  the floor is one process, so its figure is everything. The records also split
  each process's CPU time by thread (`producer_threads_us_per_frame`,
  `consumers_threads_us_per_frame`).
- **modes**: *latency*, one consumer at 60 frames/s; *throughput*, one consumer,
  unthrottled for a fixed time, the median of a few runs by frames/s (`fps_runs`
  has each run's); *fanout*, four consumers at 60 frames/s; *breakdown*, the
  latency run again at 1080p with pad probes that read the stamp where the frame
  enters the sink (`stage_sink_p50_us`) and where it leaves the source
  (`stage_source_p50_us`).

What limits the numbers: at 60 frames/s every thread on the way sleeps between
frames, so each frame wakes, one after the other, appsrc's streaming thread in the
producer (the floor is little more than that) and the source's streaming thread in
each consumer, and then runs GStreamer's per-buffer code on cold caches. On a
virtual machine with two CPUs those wake-ups, not the handoff itself, are most of
the latency and most of the CPU time; a run at a higher frame rate, where nothing
gets cold, shows the same code taking a fraction of the time. xmem and shm both
hand over a reference to shared memory with one small message per consumer
(xmem: an eventfd write, shm: a socket message), so at a fixed rate they differ
little; shm also sends every frame back (an acknowledgement per consumer, which
wakes shmsink's poll thread). Unthrottled, shm's area fills up and frames are
copied, while xmem's producer waits for a free slot; with several consumers, shm's
producer handles one acknowledgement per consumer per frame.

Device frames (`--memory cuda`; not in `bench/run.sh`'s suites, so no figures here yet):
the same producer and consumer, with caps
`video/x-raw(memory:CUDAMemory),format=NV12,width=W,height=H,framerate=F/1`, frames 64
pixels wide or more.

- **producer**: makes one GStreamer CUDA context (device 0) and shares it with every
  CUDA element of its pipeline, so that no frame goes from one context to another.
  Its frames come from the pool the sink proposes when that is a `GstCudaBufferPool`,
  else from a `GstCudaBufferPool` of its own (8 buffers). It writes the stamp with a
  64-byte host-to-device copy and nothing else: `cuMemcpy2DAsync` (through GStreamer's
  CUDA library, which exports no `cuMemcpyHtoD` before 1.24) on the memory's own
  stream where it has one (1.24 and later) or the context's legacy stream, then
  `cuStreamSynchronize`. The time is read right before that copy.
- **consumer**: maps the frame `GST_MAP_READ | GST_MAP_CUDA` and copies the 64 bytes
  back to the host the same way, on the memory's stream, so that the copy comes after
  whatever the source queued on the frame. The latency includes both copies.
  Frames that reach a consumer in system memory are counted
  (`consumers_host_memory_frames`) and fail the run.
- **xmem**: `xmemsink memory=cuda` (a device pool) and `xmemsrc ! video/x-raw(memory:CUDAMemory)`.
  xmemsink proposes no pool for device slots (they are not GStreamer memory), so the
  producer's frames come from its own pool and xmemsink copies each one into a slot,
  device to device, on its own stream (`sink_device_copied`). xmemsrc wraps the slot
  as CUDA memory on GStreamer 1.24 and later (`consumers_source_zero_copy`) and copies
  it into CUDA memory of its own on 1.22 (`consumers_source_copied`).
- **cudaipc-legacy**: `cudaipcsink ipc-mode=legacy` and `cudaipcsrc io-mode=import`
  (nvcodec, GStreamer 1.24 and later). The sink proposes a `GstCudaBufferPool` of
  `cuMemAlloc` memory, which the producer uses; each frame goes out as a
  `cuIpcGetMemHandle` handle, and the source opens it and hands the memory on
  without a copy (`io-mode=import`; the default copies).
- **cudaipc-mmap**: `cudaipcsink ipc-mode=mmap` and `cudaipcsrc`. The sink proposes a pool
  of VMM memory, whose frames go out as file descriptors; cudaipcsrc (1.24 to 1.26)
  imports and maps each one, copies it into memory of its own and unmaps it, whatever
  its `io-mode`. Where the device lacks VMM or file-descriptor export, cudaipcsink
  would fall back to legacy IPC: the pair is listed as unavailable instead.
  Neither cudaipc pair holds the producer back: cudaipcsrc keeps its newest
  `buffer-size` (3) samples and drops older ones, so unthrottled, or behind a
  decoder faster than its consumers, frames are lost; they are counted as dropped,
  and the run as failed.
- **floor**: `appsrc ! appsink` (a tee before N appsinks) in one process, the frames from
  the producer's own pool.
- **gpu_mem_delta_mib**: device memory in use (`cuMemGetInfo`: total minus free) when the
  last measured frame is stamped, less the same before the producer's pipeline starts
  (its CUDA context made already), in MiB. It is **device-wide**: the consumer
  processes' CUDA contexts and pools count, and so does anything else running on that
  GPU. GStreamer's CUDA library exports no `cuMemGetInfo`; the call is looked up in the
  `libcuda.so.1` that library loaded. Where the driver has none (the simulator), the
  figure is null and `gpu_mem_error` says why.
- **unavailable** (`"available": false`, exit status 77, so that a script can skip the
  run): the cudaipc elements are missing (GStreamer before 1.24, or nvcodec found no
  CUDA driver and registered nothing), there is no CUDA driver or device, the benchmark
  was built without `gstreamer-cuda-1.0`, the driver makes no legacy IPC handle (asked
  once before the run), or an element of `--source h264` is missing.
- **`--source h264=FILE`**: the producer is `filesrc location=FILE ! h264parse ! DECODER !
  video/x-raw(memory:CUDAMemory),format=NV12 ! SINK` instead of appsrc, DECODER being
  `nvh264dec` unless `--decoder` names others (where there is no NVDEC, e.g.
  `openh264dec ! videoconvert ! cudaupload`). A pad probe on the sink's sink pad (the
  tee's, for the floor's fan-out) stamps each decoded frame as above, so the latency
  runs from the decoder's output to the consumer. Nothing paces it: frames/s is the
  decode rate (`fps_target` 0; `--fps` other than 0 is refused), and the frame size is
  the file's. The file loops: its end of stream stops at the probe, and the producer
  seeks back to the start (a flushing seek; `source_loops` counts them) until the
  measured frames are done. The producer's CPU time includes parsing and decoding.
  The record adds `source_file`, `decoder` and `source_loops`.

Against the CUDA driver simulator (`tests/cudasim`, loaded through
`LD_LIBRARY_PATH=BUILD/tests/cudasim XMEM_CUDA_DRIVER=BUILD/tests/cudasim/libcuda.so.1`,
with `GST_PLUGIN_PATH=BUILD/gst`), every pair runs end to end and the counts (frames,
drops, copies, stamps read back) are checked; **its figures mean nothing about a GPU**:
its streams are CPU threads that start each operation after a random delay, and its
device memory is memfds. nvh264dec does not exist there (the simulator's
`libnvcuvid.so.1` decodes nothing): `--source h264` needs a GPU, or `--decoder` with a
software decoder.
"""


PYTHON_TEXT = """\
What is measured: `bench/python.py` (run by `bench/python.sh` with Debian's
`/usr/bin/python3`, its torch and GStreamer through gi) times what a Python
inference process pays to get another process's NV12 frames as torch tensors.

- **xmem-gst**: a `gst-launch-1.0 videotestsrc ! xmemsink policy=block` process,
  unthrottled; the Python consumer's `receive()`, `torch.utils.dlpack.from_dlpack()`,
  a read of the first byte and `release()`. No copy.
- **appsink**: the same pipeline inside the Python process through gi, with
  `appsink`; each sample mapped, copied into a numpy array and wrapped with
  `torch.from_numpy()`: what a Python app does without xmem.
- **xmem** and **torch-mp**: two Python processes, paced at 60 frames/s, the same
  frames. The producer writes each frame from one source tensor (xmem: `copy_()`
  into the acquired slot through DLPack, then `publish()`; torch-mp: `clone()`,
  then `put()` on a `torch.multiprocessing` queue of 4, which moves CPU tensors into
  shared-memory files (`file_system` sharing) and sends CUDA tensors as CUDA IPC
  handles). The consumer checks every frame's first byte against its number.
  Device *cuda* runs only where torch sees a GPU; xmem's pool is then a CUDA pool.
- **p50/p99 µs** (paced pairs): from the producer's stamp, taken right before the
  hand-off (`publish()`, `put()`), to the first byte read from the tensor in the
  consumer. **to tensor**: the consumer's own time from the frame or sample in hand
  to the tensor read and the frame let go; for torch-mp the tensor is made inside
  `get()`, so its figure is the read alone, and the latency says the rest.
  **CPU µs/frame**: `getrusage()` of each process over the measured frames (the
  torch-mp producer's queue feeder thread included; appsink's single process under
  consumer). **frames/s**: measured in the consumer.
"""


POLICIES_TEXT = """\
What is measured: `bench/xmem-bench-core`, as in *core* (a stamp in the first
{touched} bytes of each frame, one process per consumer), at {size} and {fps}
frames/s, with a consumer's policy or its way of waiting changed. The pairs run in
rounds, one after the other within each, and each ratio compares two runs of the
same round.

- **stall-off** and **stall-on**: the consumer has the `latest` policy (it takes
  the newest frame and skips those it was too slow for, so its *dropped* frames
  are by design) and the pool a spill tier of {spill_mb} MiB of host memory
  (`--spill-mb`). In *stall-on* a second consumer, `fifo-spill`, stops reading for
  {stall_ms} ms every {stall_every_ms} ms: it must get every frame, and the
  producer never waits for it; when the producer needs a slot that holds only
  frames the stalled consumer has not taken, it copies them into the tier first
  (inside `acquire`, so its CPU column includes the copies). *its frames* and *its
  lost*: what the stalled consumer received and lost; *spill tier peak MiB*: the
  most of the tier in use at once; *spilled*: frames copied into it; *tier full*:
  times a spill found no room. The latency and consumer CPU columns are the latest
  consumer's alone.
- **wake-sleep** and **wake-spin-before**: one consumer with the pool's policy,
  sleeping in `poll()` until its eventfd is written (as in *core*), against
  `wake=spin-before` with a {spin_budget} µs budget: the consumer learns the
  stream's period and spins on its queue in a window around the next frame's
  expected arrival instead of sleeping (`docs/design.md`, *Waking: spin-before*).
  It trades consumer CPU for latency; a consumer spinning has disarmed its
  wake-up, so the producer writes no eventfd for the frame it catches.
"""


def policies_text(result):
    on = next((m for m in result["measurements"] if m["mode"] == "stall-on"), {})
    spin = next((m for m in result["measurements"] if m["mode"] == "wake-spin-before"), {})
    first = result["measurements"][0]
    return POLICIES_TEXT.format(touched=first.get("touched_bytes", "?"), size=first.get("size", "?"),
                                fps=first.get("fps_target", "?"),
                                spill_mb=on.get("spill_cap_bytes", 0) >> 20 if on else "?",
                                stall_ms=on.get("stall_ms", "?"), stall_every_ms=on.get("stall_every_ms", "?"),
                                spin_budget=spin.get("spin_budget_us", "?"))


CLASSES_TEXT = """\
What is measured: `bench/xmem-bench-core`, as in *core* (a stamp in the first
{touched} bytes of each frame, one process per consumer, each sleeping in
`poll()`), at {size}, {fps} frames/s and {consumers} consumers, in a pool of
{fewest} and in a pool of {most}. With K classes the frames'
class is the last of K: the pool is created with a class of two slots of the
frame's size ÷ 2^(K-1), and `preallocate()` adds K-1 classes, each of slots twice
the size of the one before, two slots each but the last, the frames' class, which
has {slots} slots. So every `acquire(size)` walks past the K-1 smaller classes, which
cannot hold a frame, and every lookup of a slot's class (in publish, receive and
release) passes them too. A consumer imports the memory of each class it does
not have yet once, when the first frame of an unknown class reaches it: here in
the warmup, which is left out. The two pools run in rounds, one after the other
within each, and each ratio compares two runs of the same round.

- **acquire+publish p50/p99 µs**: one frame's `acquire(size)`, stamp and
  `publish()` in the producer, wall time (`producer_call_p50_us` and
  `producer_call_p99_us` in the records); publish includes an eventfd write to
  each sleeping consumer. The other columns are *core*'s.
"""


def classes_text(result):
    first = result["measurements"][0]
    counts = class_counts(result) or (first.get("classes", 1),) * 2
    return CLASSES_TEXT.format(touched=first.get("touched_bytes", "?"), size=first.get("size", "?"),
                               fps=first.get("fps_target", "?"), consumers=first.get("consumers", "?"),
                               fewest="one size class" if counts[0] == 1 else f"{counts[0]} size classes",
                               most=f"{counts[1]} size classes", slots=first.get("slots", "?"))


SECTION_TEXT = {
    "core": lambda r: CORE_TEXT.format(touched=r["measurements"][0].get("touched_bytes", "?")),
    "gst": lambda r: GST_TEXT,
    "python": lambda r: PYTHON_TEXT,
    "policies": policies_text,
    "classes": classes_text,
}


def platform_title(name, suites):
    """debian12 -> Debian 12 (each suite's Software line has /etc/os-release's name)."""
    head = name.rstrip("0123456789.")
    return f"{head.capitalize()} {name[len(head):]}".strip() if head else name


def load_line(result):
    load = result.get("load_average")
    if not load:
        return None
    nproc = result["machine"]["nproc"]
    start = float(load.get("start", "0").split()[0] or 0)
    end = float(load.get("end", "0").split()[0] or 0)
    busy = max(start, end) >= 0.5 * nproc
    return (f"- Load average (1, 5, 15 min) {load.get('start', '?')} before and {load.get('end', '?')} after, "
            f"on {nproc} CPUs" + (": other work shared the machine during the run; compare its pairs as ratios "
                                   "within this run." if busy else "."))


def suite_section(out, result, path, level):
    m = result["machine"]
    suite = result["suite"]
    out.append(f"{'#' * level} {suite}\n")
    out.append(f"- Command: `{result['command']}` (revision {result['revision']}, {result['buildtype']} build)")
    out.append(f"- Machine: {m['nproc']} CPUs ({m['cpu_model']}), "
               f"{'virtual machine, ' if m.get('virtualized') else ''}"
               f"{m['memory_gib']} GiB, Linux {m['kernel']} {m['arch']}")
    software = []
    if result.get("os"):
        software.append(result["os"])
    gstreamer = next((x["gstreamer"] for x in result["measurements"] if x.get("gstreamer")), None)
    if gstreamer:
        software.append(gstreamer)
    if suite == "python":
        software += [f"Python {result['python']}"] if result.get("python") else []
        software += [f"{k} {result[k]}" for k in ("torch", "numpy") if result.get(k)]
    if software:
        out.append("- Software: " + ", ".join(software))
    out.append(f"- Date: {result['date']}")
    load = load_line(result)
    if load:
        out.append(load)
    if result.get("quick"):
        out.append("- **Quick run** (`--quick`): too few frames to be worth quoting.")
    out.append("")
    out.extend(markdown_table([header for _, header, _ in columns(result)], rows(result)))
    out.append("")
    out.append(f"Each row's exact command is in `{path}` (`command`), with the fields left out of the table.")
    out.append("")
    if notes(result):
        out.extend(notes(result))
        out.append("")
    extra = EXTRA_TABLES.get(suite)
    if extra and result["measurements"]:
        for title, (headers, body) in extra(result):
            out.append(f"**{title}**")
            out.append("")
            out.extend(markdown_table(headers, body, left=1 if title == "Targets" else 3))
            out.append("")
    summary = SUMMARIES.get(suite)
    if summary and result["measurements"]:
        out.extend(summary(result))
        out.append("")
    bad = [x for x in result["measurements"] if not x.get("ok", True)]
    if bad:
        out.append(f"**{len(bad)} measurement(s) failed** (dropped or corrupt frames, or a consumer error).")
        out.append("")


def docs(args):
    # platform name -> suite -> (result, path as the page names it)
    by_platform = {}
    for path in args.files:
        with open(path) as f:
            result = json.load(f)
        name = result.get("platform") or os.path.basename(os.path.dirname(os.path.abspath(path)))
        shown = os.path.relpath(os.path.abspath(path), os.getcwd())
        by_platform.setdefault(name, {})[result["suite"]] = (result, shown)
    order = {name: i for i, name in enumerate(SUMMARIES)}

    def suite_order(suites):
        return sorted(suites, key=lambda s: (order.get(s, len(order)), s))

    platforms = [(name, platform_title(name, {s: r for s, (r, _) in suites.items()}),
                  {s: r for s, (r, _) in suites.items()}) for name, suites in sorted(by_platform.items())]

    out = [INTRO]
    headers, body = cross_platform(platforms)
    if body:
        out.append("## The platforms side by side\n")
        out.append("Each pair against another in the same platform's gst run, at 1080p (below 1× is better "
                   "for the first, except frames/s); each platform's section below has every figure and "
                   "every size.\n")
        out.extend(markdown_table(headers, body))
        out.append("")
    out.append("## What is measured\n")
    for suite in suite_order({s for _, _, suites in platforms for s in suites}):
        text = SECTION_TEXT.get(suite)
        sample = next((suites[suite] for _, _, suites in platforms if suite in suites and
                       suites[suite]["measurements"]), None)
        if text and sample:
            out.append(f"### {suite}\n")
            out.append(text(sample))
    for name, title, suites in platforms:
        out.append(f"## {title}\n")
        out.append(f"Results in `bench/results/{name}/`.\n")
        for suite in suite_order(suites):
            result, shown = by_platform[name][suite]
            suite_section(out, result, shown, 3)
    text = "\n".join(out).rstrip() + "\n"
    with open(args.out, "w") as f:
        f.write(text)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="action", required=True)
    p = sub.add_parser("collect")
    p.add_argument("--suite", required=True)
    p.add_argument("--command", required=True)
    p.add_argument("--quick", default="0")
    p.add_argument("--build-dir", default="build")
    p.add_argument("--platform", default=None)
    p.add_argument("--load", action="append", default=[])
    p.add_argument("--out", required=True)
    p.set_defaults(run=collect)
    p = sub.add_parser("table")
    p.add_argument("files", nargs="+")
    p.set_defaults(run=table)
    p = sub.add_parser("docs")
    p.add_argument("--out", required=True)
    p.add_argument("files", nargs="+")
    p.set_defaults(run=docs)
    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
