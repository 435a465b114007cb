// peer.cpp - the separate process the multi-process tests spawn: a producer, a
// verifying consumer, a consumer that drops privileges, and servers that are not pools.
#include <xmem/xmem.hpp>

#include "frames.hpp"
#include "options.hpp"
#include "protocol.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <string>
#include <thread>

#include <grp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

using namespace std::chrono_literals;

namespace {

using xmem::test::check;

using xmem::test::number_option;

// produce NAME --frames N --size BYTES --slots K --fps F --policy block|drop-oldest|drop-new
//         --wait-consumers C --consumers-gone --block-timeout-ms T --format F
//         --mode OCTAL --group GID
int produce(const std::string &name, const xmem::test::Options &o)
{
	xmem::PoolConfig config;
	config.slot_count = uint32_t(number_option(o, "slots", 8));
	config.slot_size = number_option(o, "size", 4096);
	config.max_consumers = uint32_t(number_option(o, "max-consumers", 64));
	config.block_timeout = std::chrono::milliseconds(number_option(o, "block-timeout-ms", 1000));
	config.producer = "xmem-test-peer";
	if (o.count("mode"))
		config.mode = uint32_t(std::strtoul(o.at("mode").c_str(), nullptr, 8));
	if (o.count("group"))
		config.group = uint32_t(number_option(o, "group", 0));
	if (o.count("format"))
		config.format = o.at("format");
	std::string policy = o.count("policy") ? o.at("policy") : "drop-oldest";
	config.policy = policy == "block"      ? xmem::Policy::block
			: policy == "drop-new" ? xmem::Policy::drop_new
					       : xmem::Policy::drop_oldest;
	auto pool = xmem::BufferPool::create(name, config);
	if (!pool) {
		std::fprintf(stderr, "produce: %s\n", pool.error().message.c_str());
		return 1;
	}
	uint64_t frames = number_option(o, "frames", 100);
	uint64_t fps = number_option(o, "fps", 0);
	uint32_t wait = uint32_t(number_option(o, "wait-consumers", 0));
	while ((*pool)->stats().consumers < wait)
		std::this_thread::sleep_for(1ms);
	std::printf("ready\n");
	std::fflush(stdout);
	auto next = std::chrono::steady_clock::now();
	uint64_t published = 0, timeouts = 0;
	for (uint64_t n = 0; n < frames; n++) {
		auto r = xmem::test::publish_test_frame(**pool, 5s);
		if (!r && r.code() == xmem::Errc::timed_out) {
			timeouts++;
			std::fprintf(stderr, "produce: %s\n", r.error().message.c_str());
			continue;
		}
		if (!r) {
			std::fprintf(stderr, "produce: %s\n", r.error().message.c_str());
			return 1;
		}
		published++;
		if (fps) {
			next += std::chrono::nanoseconds(1000000000 / fps);
			std::this_thread::sleep_until(next);
		}
	}
	if (!o.count("no-eos"))
		(void)(*pool)->end_of_stream();
	if (o.count("linger-ms"))
		std::this_thread::sleep_for(std::chrono::milliseconds(number_option(o, "linger-ms", 0)));
	// Wait until every consumer took its frames (or detached), so a test can count.
	if (o.count("drain")) {
		auto deadline = std::chrono::steady_clock::now() + 20s;
		while ((*pool)->stats().slots_free != config.slot_count && std::chrono::steady_clock::now() < deadline)
			std::this_thread::sleep_for(1ms);
	}
	auto s = (*pool)->stats();
	std::printf("published=%llu dropped=%llu timeouts=%llu free=%u\n", (unsigned long long)published,
		    (unsigned long long)s.dropped, (unsigned long long)timeouts, s.slots_free);
	return 0;
}

// consume NAME --frames N (stop after N; 0 = until EOS/closed) --hold K --work-us U
//         --queue Q --timeout-ms T --reconnect --expect-size S
//         --hold-forever (after N frames, keep the K held and sleep until killed)
//         --policy P (fifo, latest, drop-oldest, drop-new, fifo-spill)
int consume(const std::string &name, const xmem::test::Options &o)
{
	xmem::OpenOptions options;
	options.timeout = std::chrono::milliseconds(number_option(o, "open-timeout-ms", 10000));
	options.queue_size = uint32_t(number_option(o, "queue", 0));
	options.client = "xmem-test-peer";
	if (o.count("policy")) {
		options.policy = xmem::policy_from_name(o.at("policy"));
		if (!options.policy) {
			std::fprintf(stderr, "consume: unknown policy %s\n", o.at("policy").c_str());
			return 2;
		}
	}
	uint64_t limit = number_option(o, "frames", 0);
	size_t hold = size_t(number_option(o, "hold", 0));
	uint64_t work_us = number_option(o, "work-us", 0);
	auto timeout = std::chrono::milliseconds(number_option(o, "timeout-ms", 10000));
	bool reconnect = o.count("reconnect");
	uint64_t reconnects = 0, received = 0, corrupt = 0, gaps = 0, last = 0;
	bool eos = false, closed = false;

	for (;;) {
		auto pool = xmem::BufferPool::open(name, options);
		if (!pool) {
			std::fprintf(stderr, "consume: %s\n", pool.error().message.c_str());
			std::printf("error=%s\n", xmem_status_name(int(pool.code())));
			return 4;
		}
		std::printf("attached format=%s\n", (*pool)->format().c_str());
		std::fflush(stdout);
		std::deque<std::pair<xmem::BufferGuard, uint64_t>> held;
		closed = false;
		last = 0;
		while (!limit || received < limit) {
			auto frame = (*pool)->receive(timeout);
			if (!frame) {
				if (frame.code() == xmem::Errc::end_of_stream)
					eos = true;
				else if (frame.code() == xmem::Errc::closed)
					closed = true;
				else
					std::fprintf(stderr, "consume: %s\n", frame.error().message.c_str());
				break;
			}
			const auto &m = frame->meta();
			if (!check(frame->data(), m.seq) || m.pts != m.seq * 1000 || m.flags != uint32_t(m.seq))
				corrupt++;
			if (last && m.seq > last + 1)
				gaps += m.seq - last - 1;
			if (last && m.seq <= last)
				corrupt++; // out of order or repeated
			last = m.seq;
			received++;
			held.emplace_back(std::move(*frame), m.seq);
			// Re-check a frame when letting it go: its slot must not have been reused
			// while we held it.
			while (held.size() > hold) {
				if (!check(held.front().first.data(), held.front().second))
					corrupt++;
				held.pop_front();
			}
			if (work_us)
				std::this_thread::sleep_for(std::chrono::microseconds(work_us));
		}
		if (o.count("hold-forever")) {
			std::printf("holding=%zu\n", held.size());
			std::fflush(stdout);
			for (;;)
				std::this_thread::sleep_for(1s);
		}
		for (auto &[g, seq] : held)
			if (!check(g.data(), seq))
				corrupt++;
		held.clear();
		if (!(reconnect && closed) || (limit && received >= limit))
			break;
		reconnects++;
	}
	std::printf("received=%llu gaps=%llu corrupt=%llu eos=%d closed=%d reconnects=%llu\n",
		    (unsigned long long)received, (unsigned long long)gaps, (unsigned long long)corrupt, int(eos),
		    int(closed), (unsigned long long)reconnects);
	return corrupt ? 3 : 0;
}

// open-as NAME --uid U --gid G: drops privileges, then tries to attach.
int open_as(const std::string &name, const xmem::test::Options &o)
{
	gid_t gid = gid_t(number_option(o, "gid", 65534));
	uid_t uid = uid_t(number_option(o, "uid", 65534));
	if (::setgroups(0, nullptr) < 0 || ::setgid(gid) < 0 || ::setuid(uid) < 0) {
		std::perror("open-as: cannot drop privileges");
		return 77;
	}
	xmem::OpenOptions options;
	options.timeout = 0ms;
	auto pool = xmem::BufferPool::open(name, options);
	std::printf("%s\n", pool ? "XMEM_OK" : xmem_status_name(int(pool.code())));
	if (!pool)
		std::printf("%s\n", pool.error().message.c_str());
	return 0;
}

// connect-as PATH --uid U --gid G --wait-ms W: drops privileges, connects, sends an
// inspector's Hello by hand and prints the answer: "reject CODE MESSAGE", "welcome",
// "hangup" or "silent" (nothing within W ms), or "connect ERROR".
int connect_as(const std::string &path, const xmem::test::Options &o)
{
	gid_t gid = gid_t(number_option(o, "gid", 65534));
	uid_t uid = uid_t(number_option(o, "uid", 65534));
	if (::setgroups(0, nullptr) < 0 || ::setgid(gid) < 0 || ::setuid(uid) < 0) {
		std::perror("connect-as: cannot drop privileges");
		return 77;
	}
	int s = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	sockaddr_un addr{};
	addr.sun_family = AF_UNIX;
	std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
	if (::connect(s, reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) < 0) {
		std::printf("connect %s\n", std::strerror(errno));
		return 0;
	}
	xmem::protocol::Hello hello{};
	hello.header = xmem::protocol::make_header(xmem::protocol::MessageType::hello, sizeof(hello));
	hello.role = xmem::protocol::PeerRole::inspector;
	if (::send(s, &hello, sizeof(hello), MSG_NOSIGNAL) != ssize_t(sizeof(hello))) {
		std::printf("hangup\n");
		return 0;
	}
	pollfd p{ s, POLLIN, 0 };
	if (::poll(&p, 1, int(number_option(o, "wait-ms", 5000))) != 1) {
		std::printf("silent\n");
		return 0;
	}
	static xmem::protocol::Welcome buf;
	ssize_t n = ::recv(s, &buf, sizeof(buf), 0);
	xmem::protocol::Reject r{};
	std::memcpy(&r, &buf, std::min(sizeof(r), size_t(std::max<ssize_t>(n, 0))));
	if (n <= 0)
		std::printf("hangup\n");
	else if (size_t(n) == sizeof(buf) && buf.header.type == xmem::protocol::MessageType::welcome)
		std::printf("welcome\n");
	else if (size_t(n) == sizeof(r) && r.header.magic == xmem::protocol::kWireMagic &&
		 r.header.type == xmem::protocol::MessageType::reject) {
		r.message[sizeof(r.message) - 1] = '\0';
		std::printf("reject %s %s\n", xmem_status_name(r.code), r.message);
	} else
		std::printf("other %zd bytes\n", n);
	return 0;
}

// serve PATH --kind stream|silent|garbage|version|hangup: a socket that is not a
// pool, or a pool server speaking the wrong protocol. Serves until killed.
int serve(const std::string &path, const xmem::test::Options &o)
{
	std::string kind = o.count("kind") ? o.at("kind") : "garbage";
	int type = kind == "stream" ? SOCK_STREAM : SOCK_SEQPACKET;
	int s = ::socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
	sockaddr_un addr{};
	addr.sun_family = AF_UNIX;
	std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
	::unlink(path.c_str());
	if (::bind(s, reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) < 0 || ::listen(s, 16) < 0) {
		std::perror("serve: bind");
		return 1;
	}
	std::printf("ready\n");
	std::fflush(stdout);
	for (;;) {
		int c = ::accept(s, nullptr, nullptr);
		if (c < 0)
			continue;
		char buf[8192];
		if (kind == "silent") {
			std::thread([c] {
				std::this_thread::sleep_for(60s);
				::close(c);
			}).detach();
			continue;
		}
		if (type == SOCK_SEQPACKET) [[maybe_unused]]
			ssize_t n = ::recv(c, buf, sizeof(buf), 0);
		if (kind == "garbage") {
			std::memset(buf, 0x5a, 300);
			[[maybe_unused]] ssize_t n = ::send(c, buf, 300, MSG_NOSIGNAL);
		} else if (kind == "version") {
			xmem::protocol::Reject r{};
			r.header = xmem::protocol::make_header(xmem::protocol::MessageType::reject, sizeof(r));
			r.header.version = 99;
			[[maybe_unused]] ssize_t n = ::send(c, &r, sizeof(r), MSG_NOSIGNAL);
		} else if (kind == "short") {
			[[maybe_unused]] ssize_t n = ::send(c, "xm", 2, MSG_NOSIGNAL);
		}
		// "hangup" and the rest: close without a word.
		::close(c);
	}
}

// redeem NAME: attaches, then reads frame tickets or meta indices from stdin, one a line
// (a pipe from the test: any channel will do), and gets each, printing "redeemed seq=N ok=0|1" or
// "refused code=C". The frames stay held until stdin ends ("hold" then, and it sleeps
// until killed, with --hold) or the line "drop" lets them go ("dropped").
int redeem(const std::string &name, const xmem::test::Options &o)
{
	xmem::OpenOptions options;
	options.client = "redeemer";
	options.timeout = std::chrono::seconds(10);
	auto pool = xmem::BufferPool::open(name, options);
	if (!pool) {
		std::fprintf(stderr, "redeem: %s\n", pool.error().message.c_str());
		return 1;
	}
	std::printf("attached\n");
	std::deque<xmem::BufferGuard> held;
	char line[256];
	while (std::fgets(line, sizeof(line), stdin)) {
		std::string text(line);
		while (!text.empty() && (text.back() == '\n' || text.back() == '\r'))
			text.pop_back();
		if (text == "drop") {
			held.clear();
			std::printf("dropped\n");
			continue;
		}
		// A line of digits is a meta index (BufferPool::get(meta_index)), the rest tickets.
		bool number = !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
		auto ticket = number ? xmem::Result<xmem::Ticket>(xmem::Ticket{}) : xmem::Ticket::parse(text);
		auto frame = number   ? (*pool)->get(uint32_t(std::strtoul(text.c_str(), nullptr, 10)))
			     : ticket ? (*pool)->get(*ticket)
				      : xmem::Result<xmem::BufferGuard>(ticket.error());
		if (!frame) {
			std::printf("refused code=%d\n", -int(frame.code()));
			continue;
		}
		std::printf("redeemed seq=%llu ok=%d\n", (unsigned long long)frame->meta().seq,
			    check(frame->data(), frame->meta().seq) ? 1 : 0);
		held.push_back(std::move(frame.value()));
	}
	if (o.count("hold")) {
		std::printf("hold\n");
		for (;;)
			std::this_thread::sleep_for(1s);
	}
	return 0;
}

// guest NAME --frames N --tickets R --hold K: attaches and produces as a guest (a producer
// besides the owner): N frames of 4096 bytes whose bytes follow their pts (1000 + n),
// published ("published=n") or, with R, made tickets of R redemptions for 10 s, one
// "ticket=TEXT" line each; then, with K, leases K slots more, says "leased=K" and waits
// to be killed.
int guest(const std::string &name, const xmem::test::Options &o)
{
	xmem::OpenOptions options;
	options.client = "guest";
	options.timeout = std::chrono::seconds(10);
	auto pool = xmem::BufferPool::open(name, options);
	if (!pool) {
		std::fprintf(stderr, "guest: %s\n", pool.error().message.c_str());
		return 1;
	}
	uint64_t frames = number_option(o, "frames", 0);
	uint32_t redemptions = uint32_t(number_option(o, "tickets", 0));
	for (uint64_t n = 0; n < frames; n++) {
		auto frame = (*pool)->acquire(5s);
		if (!frame) {
			std::fprintf(stderr, "guest: acquire: %s\n", frame.error().message.c_str());
			return 1;
		}
		uint64_t pts = 1000 + n;
		xmem::test::fill(frame->data_mut().value(), 4096, pts);
		xmem::FrameMeta *m = frame->meta_mut().value();
		m->size = 4096;
		m->pts = pts;
		if (redemptions) {
			auto t = (*pool)->publish_ticket(std::move(*frame), redemptions, 10s);
			if (!t) {
				std::fprintf(stderr, "guest: publish_ticket: %s\n", t.error().message.c_str());
				return 1;
			}
			std::printf("ticket=%s\n", t->to_string().c_str());
			continue;
		}
		if (auto p = (*pool)->publish(std::move(*frame)); !p) {
			std::fprintf(stderr, "guest: publish: %s\n", p.error().message.c_str());
			return 1;
		}
		std::printf("published=%llu\n", (unsigned long long)(n + 1));
	}
	uint64_t hold = number_option(o, "hold", 0);
	if (hold == 0)
		return 0;
	std::deque<xmem::BufferGuard> leased;
	for (uint64_t k = 0; k < hold; k++) {
		auto frame = (*pool)->acquire(5s);
		if (!frame) {
			std::fprintf(stderr, "guest: acquire: %s\n", frame.error().message.c_str());
			return 1;
		}
		frame->data_mut().value()[0] = std::byte{ 1 }; // being written
		leased.push_back(std::move(*frame));
	}
	std::printf("leased=%llu\n", (unsigned long long)hold);
	for (;;)
		std::this_thread::sleep_for(1s);
}

} // namespace

int main(int argc, char **argv)
{
	if (argc < 3) {
		std::fprintf(
			stderr,
			"usage: xmem-test-peer produce|consume|open-as|connect-as|serve|redeem|guest NAME [options]\n");
		return 2;
	}
	std::string mode = argv[1], name = argv[2];
	auto o = xmem::test::parse_options(argc, argv, 3);
	std::setvbuf(stdout, nullptr, _IOLBF, 0);
	if (mode == "produce")
		return produce(name, o);
	if (mode == "consume")
		return consume(name, o);
	if (mode == "open-as")
		return open_as(name, o);
	if (mode == "connect-as")
		return connect_as(name, o);
	if (mode == "serve")
		return serve(name, o);
	if (mode == "redeem")
		return redeem(name, o);
	if (mode == "guest")
		return guest(name, o);
	std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
	return 2;
}
