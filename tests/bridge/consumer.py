#!/usr/bin/env python3
"""tests/bridge/consumer.py POOL COLOR... - takes the frames of the xmem pool POOL (as I420)
and prints one line per frame: "frame REALTIME_NS MATCH EXACT", MATCH the index of the first
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
	pool = sys.argv[1]
	references = [reference(c) for c in sys.argv[2:]]
	pipeline = Gst.parse_launch(
		f"xmemsrc pool-name={pool} ! videoconvert ! video/x-raw,format=I420,{SIZE} "
		"! appsink name=sink sync=false emit-signals=true max-buffers=4 drop=false")
	loop = GLib.MainLoop()

	def on_sample(sink):
		sample = sink.emit("pull-sample")
		now = time.clock_gettime_ns(time.CLOCK_REALTIME)
		frame = frame_array(sample)
		means = [float(p.mean()) for p in planes(frame)]
		match, exact = -1, 0
		for index, (ref_frame, ref_means) in enumerate(references):
			if all(abs(a - b) <= TOLERANCE for a, b in zip(means, ref_means)):
				match = index
				exact = int(numpy.array_equal(frame, ref_frame))
				break
		print(f"frame {now} {match} {exact}", flush=True)
		return Gst.FlowReturn.OK

	pipeline.get_by_name("sink").connect("new-sample", on_sample)
	bus = pipeline.get_bus()
	bus.add_signal_watch()
	bus.connect("message::eos", lambda *_: (print("consumer.py: EOS", file=sys.stderr), loop.quit()))
	bus.connect("message::error", lambda _b, m: (print(m.parse_error(), file=sys.stderr), loop.quit()))
	GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, signal.SIGTERM, loop.quit)
	pipeline.set_state(Gst.State.PLAYING)
	loop.run()
	pipeline.set_state(Gst.State.NULL)


if __name__ == "__main__":
	main()
