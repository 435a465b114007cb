#!/usr/bin/env python3
"""tests/bridge/consumer.py [--capture-time] POOL COLOR... - takes the frames of the xmem pool
POOL (as I420) and prints one line per frame: "frame REALTIME_NS MATCH EXACT AGE_NS", AGE_NS
the frame's age by its timestamp/x-ntp reference timestamp (its capture time, which
bridge-send.sh carries to the far pool) on this host's realtime clock, or -1 when it has
none; --capture-time has xmemsrc add it from the pool's own timestamps (the near pool,
whose producer sets none). MATCH the index of the first
COLOR (videotestsrc pattern=solid-color foreground-color, 0xAARRGGBB) whose frame it resembles
(plane means within a tolerance that H.264 at its bitrate meets) or -1, EXACT 1 when the
frame is byte for byte videotestsrc's (what raw RTP must deliver). The references are made
here by videotestsrc and the same conversions (NV12, then I420): no value typed by hand.
Ends on SIGTERM or EOS."""
import signal
import sys
import time

import gi
import numpy

gi.require_version("Gst", "1.0")
from gi.repository import GLib, Gst  # noqa: E402

# Mean difference per plane that still counts as the color: H.264's error on a flat field
# is a few levels; two test colors differ by far more.
TOLERANCE = 12.0
SIZE = "width=1280,height=720"
# NTP's epoch (1900) to Unix's (1970): 70 years, 17 of them leap.
NTP_TO_UNIX_NS = (70 * 365 + 17) * 86400 * 10**9


def frame_array(sample):
	buffer = sample.get_buffer()
	ok, info = buffer.map(Gst.MapFlags.READ)
	assert ok
	try:
		return numpy.frombuffer(info.data, dtype=numpy.uint8).copy()
	finally:
		buffer.unmap(info)


def planes(frame):
	luma = 1280 * 720
	chroma = luma // 4
	return (frame[:luma], frame[luma:luma + chroma], frame[luma + chroma:luma + 2 * chroma])


def reference(color):
	pipeline = Gst.parse_launch(
		f"videotestsrc num-buffers=1 pattern=solid-color foreground-color={color} "
		f"! video/x-raw,format=NV12,{SIZE} ! videoconvert ! video/x-raw,format=I420 "
		"! appsink name=sink sync=false")
	pipeline.set_state(Gst.State.PLAYING)
	sample = pipeline.get_by_name("sink").emit("pull-sample")
	pipeline.set_state(Gst.State.NULL)
	frame = frame_array(sample)
	return frame, [float(p.mean()) for p in planes(frame)]


def main():
	Gst.init(None)
	args = sys.argv[1:]
	capture_time = args[0] == "--capture-time"
	if capture_time:
		args = args[1:]
	pool = args[0]
	references = [reference(c) for c in args[1:]]
	ntp = Gst.Caps.from_string("timestamp/x-ntp")
	pipeline = Gst.parse_launch(
		f"xmemsrc name=src pool-name={pool} add-reference-timestamp-meta={str(capture_time).lower()} ! videoconvert ! video/x-raw,format=I420,{SIZE} "
		"! appsink name=sink sync=false emit-signals=true max-buffers=4 drop=false")
	loop = GLib.MainLoop()

	def on_sample(sink):
		sample = sink.emit("pull-sample")
		now = time.clock_gettime_ns(time.CLOCK_REALTIME)
		captured = sample.get_buffer().get_reference_timestamp_meta(ntp)
		age = now - (captured.timestamp - NTP_TO_UNIX_NS) if captured else -1
		frame = frame_array(sample)
		means = [float(p.mean()) for p in planes(frame)]
		match, exact = -1, 0
		for index, (ref_frame, ref_means) in enumerate(references):
			if all(abs(a - b) <= TOLERANCE for a, b in zip(means, ref_means)):
				match = index
				exact = int(numpy.array_equal(frame, ref_frame))
				break
		print(f"frame {now} {match} {exact} {age}", flush=True)
		return Gst.FlowReturn.OK

	pipeline.get_by_name("sink").connect("new-sample", on_sample)
	bus = pipeline.get_bus()
	bus.add_signal_watch()
	bus.connect("message::eos", lambda *_: (print("consumer.py: EOS", file=sys.stderr), loop.quit()))
	bus.connect("message::error", lambda _b, m: (print(m.parse_error(), file=sys.stderr), loop.quit()))
	GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, signal.SIGTERM, loop.quit)
	pipeline.set_state(Gst.State.PLAYING)
	loop.run()
	# What the pool's policy dropped for this consumer when it fell behind (in all).
	stats = pipeline.get_by_name("src").get_property("stats")
	print("consumer.py: dropped %d" % stats.get_value("dropped"), file=sys.stderr, flush=True)
	pipeline.set_state(Gst.State.NULL)


if __name__ == "__main__":
	main()
