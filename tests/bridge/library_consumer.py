#!/usr/bin/env python3
"""tests/bridge/library_consumer.py POOL N - takes N frames of the xmem pool POOL through the
Python library alone (no GStreamer) and prints one line per frame: "age AGE_NS", its age by
its capture_time (which xmemsink set from the capture time the bridge carried) on this
host's realtime clock, or "age -1" for a frame without one."""
import sys
import time

import xmem


def main():
	pool, count = sys.argv[1], int(sys.argv[2])
	with xmem.open(pool, timeout=30) as consumer:
		for _ in range(count):
			frame = consumer.receive(timeout=30)
			captured = frame.meta.capture_time
			print("age", time.time_ns() - captured if captured else -1, flush=True)
			frame.release()


if __name__ == "__main__":
	main()
