// producer.cpp - a demo producer: publishes NV12-sized test frames into a pool at a
// fixed rate; every frame carries its sequence number so consumers can verify it.
#include <xmem/xmem.hpp>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <thread>

namespace {

volatile std::sig_atomic_t stop = 0;

int usage()
{
	(void)std::fprintf(stderr, "usage: xmem-demo-producer NAME [--width W] [--height H] [--fps F] [--frames N]\n"
				   "                          [--slots S] [--wait-consumers C]\n");
	return 2;
}

int run(int argc, char **argv)
{
	if (argc < 2)
		return usage();
	std::string name = argv[1];
	uint32_t width = 640, height = 480, fps = 30, slots = 8, wait_consumers = 0;
	uint64_t frames = 300;
	for (int i = 2; i < argc; i++) {
		std::string a = argv[i];
		if (i + 1 >= argc)
			return usage();
		unsigned long v = std::strtoul(argv[++i], nullptr, 10);
		if (a == "--width")
			width = uint32_t(v);
		else if (a == "--height")
			height = uint32_t(v);
		else if (a == "--fps")
			fps = uint32_t(v);
		else if (a == "--frames")
			frames = v;
		else if (a == "--slots")
			slots = uint32_t(v);
		else if (a == "--wait-consumers")
			wait_consumers = uint32_t(v);
		else
			return usage();
	}
	// signal() fails only for an invalid signal number.
	(void)std::signal(SIGINT, [](int) { stop = 1; });
	(void)std::signal(SIGTERM, [](int) { stop = 1; });

	xmem::PoolConfig config;
	config.slot_count = slots;
	config.slot_size = uint64_t(width) * height * 3 / 2;
	config.producer = "xmem-demo-producer";
	config.format = "video/x-raw,format=NV12,width=" + std::to_string(width) + ",height=" + std::to_string(height) +
			",framerate=" + std::to_string(fps) + "/1";
	auto pool = xmem::BufferPool::create(name, config);
	if (!pool) {
		(void)std::fprintf(stderr, "producer: %s\n", pool.error().message.c_str());
		return 1;
	}
	std::printf("producer: pool '%s' at %s, %u slots of %llu bytes\n", name.c_str(), (*pool)->path().c_str(), slots,
		    (unsigned long long)config.slot_size);
	(void)std::fflush(stdout); // progress output is best effort
	while (!stop && (*pool)->stats().consumers < wait_consumers)
		std::this_thread::sleep_for(std::chrono::milliseconds(5));

	auto period = std::chrono::nanoseconds(1000000000 / (fps ? fps : 1));
	auto next = std::chrono::steady_clock::now();
	for (uint64_t n = 0; n < frames && !stop; n++) {
		auto frame = (*pool)->acquire(std::chrono::seconds(1));
		if (!frame) {
			(void)std::fprintf(stderr, "producer: %s\n", frame.error().message.c_str());
			continue;
		}
		auto bytes = frame->data_mut().value();
		// A cheap pattern: the frame number in the first 8 bytes and the last row.
		std::memcpy(bytes.data(), &n, sizeof(n));
		std::memset(bytes.data() + config.slot_size - width, int(n & 0xff), width);
		xmem::FrameMeta *m = frame->meta_mut().value();
		m->size = config.slot_size;
		m->pts = n * uint64_t(period.count());
		m->duration = uint64_t(period.count());
		m->ndim = 2;
		m->shape[0] = height * 3 / 2;
		m->shape[1] = width;
		m->strides[0] = width;
		m->strides[1] = 1;
		std::strcpy(m->content_type, "video/raw");
		auto r = (*pool)->publish(std::move(*frame));
		if (!r)
			(void)std::fprintf(stderr, "producer: %s\n", r.error().message.c_str());
		next += period;
		std::this_thread::sleep_until(next);
	}
	(void)(*pool)->end_of_stream();
	auto s = (*pool)->stats();
	std::printf("producer: published %llu frames, %llu drops across consumers\n", (unsigned long long)s.published,
		    (unsigned long long)s.dropped);
	// Give consumers a moment to take the EOS marker before the pool closes.
	std::this_thread::sleep_for(std::chrono::milliseconds(200));
	return 0;
}

} // namespace

int main(int argc, char **argv)
{
	try {
		return run(argc, argv);
	} catch (const std::exception &e) {
		(void)std::fprintf(stderr, "producer: %s\n", e.what());
		return 1;
	}
}
