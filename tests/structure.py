#!/usr/bin/env python3
"""tests/structure.py - the code's structure as docs/design.md ("Where the code is") draws it:
lib/'s include graph goes down the layers only, no role includes another role's header, no
header cycle, and no source file outgrows its limit (lib/ 800 lines, gst/ 900).

usage: structure.py SOURCE_ROOT     exits 0 when all holds, 1 with each breach listed.
A file of lib/ that no layer below names is a breach too: a new file says where it belongs.
"""
import fnmatch
import os
import re
import sys

# Layers, lowest first: a file may include headers of its own layer or lower ones. Within
# the roles layer each role is a group of its own: one role never includes another's.
LAYERS = [
    ("base", None, ["system.hpp", "layout.hpp", "identity.hpp", "identity.cpp", "memfd.cpp",
                    "frame_check.hpp", "frame_check.cpp", "video.cpp", "spin_wake.hpp", "names.cpp"]),
    ("shared state and storage", None, ["segment.*", "protocol.*", "rendezvous.*", "spill.*", "arena.hpp",
                                        "arena.cpp", "arena_memfd.cpp", "device_sync.hpp", "device_uuid.cpp",
                                        "cuda/*", "cuda_none.cpp", "snapshot.cpp"]),
    ("references", None, ["pool_impl.hpp", "pool.cpp", "holder.hpp", "ticket.cpp"]),
    ("roles", "owner", ["publisher.*", "owner/*"]),
    ("roles", "consumer", ["subscriber.*", "subscriber_*.cpp"]),
    ("roles", "guest", ["guest.*"]),
    ("facade", None, ["buffer_pool.cpp", "connect.*", "c_api.*", "c_api_*.cpp"]),
]
LIMITS = {"lib": 800, "gst": 900}
SOURCES = (".cpp", ".hpp", ".c", ".h")


def place(rel):
    """The layer index and role group of lib/ file REL; None where no layer names it."""
    rank = -1
    last = None
    for name, group, patterns in LAYERS:
        if name != last:
            rank += 1
            last = name
        if any(fnmatch.fnmatch(rel, p) for p in patterns):
            return rank, name, group
    return None


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    lib = os.path.join(root, "lib")
    breaches = []
    files = []
    for dirpath, _, names in os.walk(lib):
        for n in names:
            rel = os.path.relpath(os.path.join(dirpath, n), lib)
            if n.endswith(SOURCES) and not rel.startswith("include" + os.sep):
                files.append(rel)
    includes = {}
    for rel in sorted(files):
        where = place(rel)
        if where is None:
            breaches.append(f"lib/{rel}: in no layer (tests/structure.py, LAYERS; docs/design.md)")
            continue
        text = open(os.path.join(lib, rel), encoding="utf-8").read()
        targets = []
        for m in re.finditer(r'^#include "([^"]+)"', text, re.M):
            target = os.path.normpath(os.path.join(os.path.dirname(rel), m.group(1)))
            targets.append(target)
            to = place(target)
            if to is None:
                continue  # reported as its own file
            if to[0] > where[0]:
                breaches.append(f"lib/{rel} ({where[1]}) includes lib/{target} ({to[1]}): a higher layer")
            elif to[0] == where[0] and where[2] and to[2] and to[2] != where[2]:
                breaches.append(f"lib/{rel} (the {where[2]} role) includes lib/{target} (the {to[2]} role)")
        includes[rel] = targets
    # No cycle among the includes (depth-first, three colours).
    state = {}

    def visit(node, path):
        state[node] = 1
        for t in includes.get(node, []):
            if state.get(t) == 1:
                cycle = path[path.index(t):] + [t] if t in path else [node, t]
                breaches.append("an include cycle: " + " -> ".join("lib/" + c for c in cycle))
            elif state.get(t) is None:
                visit(t, path + [t])
        state[node] = 2

    for rel in sorted(includes):
        if state.get(rel) is None:
            visit(rel, [rel])
    # Sizes: sources of lib/ (public headers aside) and gst/.
    for top, limit in LIMITS.items():
        for dirpath, _, names in os.walk(os.path.join(root, top)):
            for n in names:
                path = os.path.join(dirpath, n)
                rel = os.path.relpath(path, root)
                if not n.endswith(SOURCES) or rel.startswith(os.path.join("lib", "include")):
                    continue
                lines = sum(1 for _ in open(path, encoding="utf-8"))
                if lines > limit:
                    breaches.append(f"{rel}: {lines} lines, over {top}/'s limit of {limit}")
    for b in breaches:
        print(b)
    print(f"{len(files)} files of lib/ in {len({p[0] for p in map(place, files) if p})} layers; "
          f"{sum(len(v) for v in includes.values())} includes; {len(breaches)} breaches")
    return 1 if breaches else 0


if __name__ == "__main__":
    sys.exit(main())
