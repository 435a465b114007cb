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
        return "unknown"


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
        "machine": machine(),
        "measurements": measurements,
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1, ensure_ascii=False)
        f.write("\n")


def cell(record, key, fmt):
    value = record.get(key)
    if value is None:
        return "-"
    return fmt.format(value)


def rows(result):
    return [[cell(m, key, fmt) for key, _, fmt in COLUMNS] for m in result["measurements"]]


def table(args):
    for path in args.files:
        with open(path) as f:
            result = json.load(f)
        headers = [header for _, header, _ in COLUMNS]
        body = rows(result)
        widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(headers)]
        print(f"{result['suite']}: {result['date']}, {describe_machine(result)}")
        print("  ".join(h.rjust(w) for h, w in zip(headers, widths)))
        for r in body:
            print("  ".join(c.rjust(w) for c, w in zip(r, widths)))
        bad = [m for m in result["measurements"] if not m.get("ok", True)]
        if bad:
            print(f"{len(bad)} measurement(s) failed (dropped or corrupt frames, or a consumer error)")


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


SUMMARIES = {"core": summary_core}

INTRO = """\
# Benchmarks

<!-- Generated by bench/run.sh --update-docs from bench/results/*.json by
     bench/report.py. Do not edit: rerun the script (STYLE.md, rule 12). -->

Every number on this page comes from `bench/run.sh`, which anyone can rerun from a
fresh clone: it builds what it needs into `./build`, writes one JSON object per
measurement to `bench/results/<suite>.json`, and with `--update-docs` rewrites this
page from those files. Each section says the command, the machine and the date.
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


def docs(args):
    results = []
    for path in args.files:
        with open(path) as f:
            results.append(json.load(f))
    order = {name: i for i, name in enumerate(SUMMARIES)}
    results.sort(key=lambda r: (order.get(r["suite"], len(order)), r["suite"]))

    out = [INTRO]
    for result in results:
        m = result["machine"]
        out.append(f"## {result['suite']}\n")
        if result["suite"] == "core" and result["measurements"]:
            out.append(CORE_TEXT.format(touched=result["measurements"][0].get("touched_bytes", "?")))
        out.append(f"- Command: `{result['command']}` (revision {result['revision']}, "
                   f"{result['buildtype']} build)")
        out.append(f"- Machine: {m['nproc']} CPUs ({m['cpu_model']}), "
                   f"{'virtual machine, ' if m.get('virtualized') else ''}"
                   f"{m['memory_gib']} GiB, Linux {m['kernel']} {m['arch']}")
        out.append(f"- Date: {result['date']}")
        if result.get("quick"):
            out.append("- **Quick run** (`--quick`): too few frames to be worth quoting.")
        out.append("")
        headers = [header for _, header, _ in COLUMNS]
        out.append("| " + " | ".join(headers) + " |")
        out.append("|" + "|".join("---" if i < 3 else "---:" for i in range(len(headers))) + "|")
        for r in rows(result):
            out.append("| " + " | ".join(r) + " |")
        out.append("")
        out.append("Each row's exact command is in `bench/results/" + result["suite"] + ".json` "
                   "(`command`), with the fields left out of the table.")
        out.append("")
        summary = SUMMARIES.get(result["suite"])
        if summary and result["measurements"]:
            out.extend(summary(result))
            out.append("")
        bad = [x for x in result["measurements"] if not x.get("ok", True)]
        if bad:
            out.append(f"**{len(bad)} measurement(s) failed** (dropped or corrupt frames, or a consumer error).")
            out.append("")
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
