// consumer.cpp - a demo consumer: attaches to a pool, checks every frame's payload
// against its sequence number, and prints frames per second and drops.
#include <xmem/xmem.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <thread>

namespace {

int run(int argc, char **argv)
{
	if (argc < 2) {
		(void)std::fprintf(stderr,
				   "usage: xmem-demo-consumer NAME [--label L] [--work-us U] [--timeout-s T]\n");
		return 2;
	}
	std::string name = argv[1], label = "consumer";
	unsigned work_us = 0, timeout_s = 10;
	for (int i = 2; i + 1 < argc; i += 2) {
		std::string a = argv[i];
		if (a == "--label")
			label = argv[i + 1];
		else if (a == "--work-us")
			work_us = unsigned(std::atoi(argv[i + 1]));
		else if (a == "--timeout-s")
			timeout_s = unsigned(std::atoi(argv[i + 1]));
	}
	xmem::OpenOptions options;
	options.timeout = std::chrono::seconds(timeout_s);
	options.client = label;
	auto pool = xmem::BufferPool::open(name, options);
	if (!pool) {
		(void)std::fprintf(stderr, "%s: %s\n", label.c_str(), pool.error().message.c_str());
		return 1;
	}
	std::printf("%s: attached to '%s': %s\n", label.c_str(), name.c_str(), (*pool)->format().c_str());
	(void)std::fflush(stdout); // progress output is best effort

	uint64_t received = 0, window = 0, last_seq = 0, gaps = 0, bad = 0;
	auto t0 = std::chrono::steady_clock::now(), tw = t0;
	for (;;) {
		auto frame = (*pool)->receive(std::chrono::seconds(timeout_s));
		if (!frame) {
			if (frame.code() != xmem::Errc::end_of_stream)
				(void)std::fprintf(stderr, "%s: %s\n", label.c_str(), frame.error().message.c_str());
			break;
		}
		const xmem::FrameMeta &m = frame->meta();
		uint64_t n;
		std::memcpy(&n, frame->data().data(), sizeof(n));
		if (n + 1 != m.seq)
			bad++;
		if (last_seq && m.seq != last_seq + 1)
			gaps += m.seq - last_seq - 1;
		last_seq = m.seq;
		received++;
		window++;
		if (work_us)
			std::this_thread::sleep_for(std::chrono::microseconds(work_us));
		auto now = std::chrono::steady_clock::now();
		if (now - tw >= std::chrono::seconds(1)) {
			double s = std::chrono::duration<double>(now - tw).count();
			std::printf("%s: %.1f fps, %llu dropped so far\n", label.c_str(), double(window) / s,
				    (unsigned long long)gaps);
			(void)std::fflush(stdout);
			window = 0;
			tw = now;
		}
	}
	double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
	std::printf("%s: received %llu frames in %.1f s (%.1f fps), %llu dropped, %llu corrupt\n", label.c_str(),
		    (unsigned long long)received, s, s > 0 ? double(received) / s : 0.0, (unsigned long long)gaps,
		    (unsigned long long)bad);
	return bad ? 1 : 0;
}

} // namespace

int main(int argc, char **argv)
{
	try {
		return run(argc, argv);
	} catch (const std::exception &e) {
		(void)std::fprintf(stderr, "consumer: %s\n", e.what());
		return 1;
	}
}
