// hostile_peer.cpp - the processes of the scribbler test: a producer and consumers that
// stay responsive and report what happens to them, and a peer scribbling on the segment.
#include <xmem/xmem.hpp>

#include "layout.hpp"
#include "options.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using xmem::test::number_option;

namespace {

std::atomic<bool> stop{ false };

void on_stop(int)
{
	stop.store(true);
}

void catch_stop_signals()
{
	struct sigaction sa {
	};
	sa.sa_handler = on_stop;
	sigemptyset(&sa.sa_mask);
	::sigaction(SIGTERM, &sa, nullptr);
	::sigaction(SIGINT, &sa, nullptr);
}

std::string status(xmem::Errc code)
{
	return xmem_status_name(int(code));
}

// Prints the line at most every 200 ms (and when FORCE): the test reads it as a sign
// of life, so a process that stops printing is hung.
class Heartbeat
{
public:
	template<typename... Args>
	void tick(bool force, const char *fmt, Args... args)
	{
		auto now = std::chrono::steady_clock::now();
		if (!force && now - last_ < 200ms)
			return;
		last_ = now;
		std::printf(fmt, args...);
		std::fflush(stdout);
	}

private:
	std::chrono::steady_clock::time_point last_{};
};

// Error messages are printed up to a limit: a scribbled pool can fail every call.
class ErrorLog
{
public:
	void note(const char *what, const xmem::Error &e)
	{
		count++;
		if (count <= 20)
			std::printf("error %s %s: %s\n", what, status(e.code).c_str(), e.message.c_str());
	}
	unsigned long long count = 0;
};

// produce NAME --slots K --size BYTES --fps F [--memory-cap-mb MB]: publishes until
// SIGTERM, riding out every error; then end of stream and close, which must come back.
// With a memory cap the pool grows: frames cycle through sizes no preallocated slot
// holds (1, 3, 10 and 40 times BYTES), so slots are made, reused and trimmed (idle 50 ms).
int produce(const std::string &name, const xmem::test::Options &o)
{
	catch_stop_signals();
	xmem::PoolConfig config;
	config.slot_count = uint32_t(number_option(o, "slots", 8));
	config.slot_size = number_option(o, "size", 4096);
	config.max_consumers = uint32_t(number_option(o, "max-consumers", 16));
	config.producer = "xmem-hostile-peer";
	config.format = o.count("format") ? o.at("format") : "";
	config.memory_cap = number_option(o, "memory-cap-mb", 0) << 20;
	if (config.memory_cap)
		config.trim_idle = 50ms;
	const uint64_t sizes[] = { 1, 3, 10, 40 };
	auto created = xmem::BufferPool::create(name, config);
	if (!created) {
		std::printf("error create %s: %s\n", status(created.code()).c_str(), created.error().message.c_str());
		return 1;
	}
	std::shared_ptr<xmem::BufferPool> pool = created.value();
	std::printf("ready\n");
	std::fflush(stdout);
	uint64_t fps = number_option(o, "fps", 200);
	unsigned long long published = 0, timeouts = 0;
	ErrorLog errors;
	Heartbeat beat;
	auto next = std::chrono::steady_clock::now();
	while (!stop.load()) {
		beat.tick(false, "tick published=%llu timeouts=%llu errors=%llu\n", published, timeouts, errors.count);
		uint64_t size = config.memory_cap ? config.slot_size * sizes[(published / 7) % 4] : 0;
		auto frame = pool->acquire(size, 100ms);
		if (!frame) {
			if (frame.code() == xmem::Errc::timed_out || frame.code() == xmem::Errc::full)
				timeouts++;
			else
				errors.note("acquire", frame.error());
			continue;
		}
		auto bytes = frame->data_mut();
		if (bytes)
			std::memset(bytes->data(), int(published & 0xff), bytes->size());
		if (auto meta = frame->meta_mut(); meta) {
			(*meta)->size = size ? size : pool->slot_size();
			(*meta)->pts = published * 1000;
		}
		// Side data of a varying size, for consumers to copy out of the slot record.
		std::vector<std::byte> side(published % 97, std::byte(published & 0xff));
		if (auto r = frame->set_side_data(side); !r)
			errors.note("set_side_data", r.error());
		if (auto r = pool->publish(std::move(*frame)); r)
			published++;
		else
			errors.note("publish", r.error());
		if (fps) {
			next += std::chrono::nanoseconds(1'000'000'000 / fps);
			if (next < std::chrono::steady_clock::now())
				next = std::chrono::steady_clock::now();
			std::this_thread::sleep_until(next);
		}
	}
	auto start = std::chrono::steady_clock::now();
	if (auto r = pool->end_of_stream(); !r)
		errors.note("end_of_stream", r.error());
	pool->close();
	pool.reset();
	auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
	std::printf("closed published=%llu timeouts=%llu errors=%llu close_ms=%lld\n", published, timeouts,
		    errors.count, (long long)ms.count());
	return 0;
}

// consume NAME --queue Q --hold K: receives until SIGTERM, touching every byte and
// string the API hands out; reattaches after an error. Never waits more than 200 ms.
int consume(const std::string &name, const xmem::test::Options &o)
{
	catch_stop_signals();
	xmem::OpenOptions options;
	options.timeout = 200ms;
	options.queue_size = uint32_t(number_option(o, "queue", 4));
	options.client = "xmem-hostile-peer";
	size_t hold = size_t(number_option(o, "hold", 0));
	unsigned long long received = 0, refused = 0, timeouts = 0, attaches = 0, eos = 0, checksum = 0;
	ErrorLog errors;
	Heartbeat beat;
	while (!stop.load()) {
		beat.tick(false, "tick received=%llu timeouts=%llu errors=%llu attaches=%llu\n", received, timeouts,
			  errors.count, attaches);
		auto opened = xmem::BufferPool::open(name, options);
		if (!opened) {
			if (opened.code() != xmem::Errc::timed_out && opened.code() != xmem::Errc::not_found)
				errors.note("open", opened.error());
			std::this_thread::sleep_for(50ms);
			continue;
		}
		std::shared_ptr<xmem::BufferPool> pool = opened.value();
		if (attaches++ == 0) {
			std::printf("attached\n");
			std::fflush(stdout);
		}
		std::deque<xmem::BufferGuard> held;
		while (!stop.load()) {
			beat.tick(false, "tick received=%llu timeouts=%llu errors=%llu attaches=%llu\n", received,
				  timeouts, errors.count, attaches);
			auto frame = pool->receive(200ms);
			if (!frame) {
				if (frame.code() == xmem::Errc::timed_out) {
					timeouts++;
					continue;
				}
				if (frame.code() == xmem::Errc::bad_frame) {
					refused++; // its layout was scribbled: the stream goes on
					continue;
				}
				if (frame.code() == xmem::Errc::end_of_stream)
					eos++;
				else
					errors.note("receive", frame.error());
				if (frame.code() == xmem::Errc::end_of_stream)
					continue;
				break; // reattach: a fresh handle, as an application would
			}
			received++;
			// Everything the guard shows must be readable: the bytes within data(),
			// the format, the side data, the metadata strings within their arrays.
			for (std::byte b : frame->data())
				checksum += uint8_t(b);
			checksum += frame->format().size();
			// The side data too: a copy within the budget, whatever the record says.
			for (std::byte b : frame->side_data())
				checksum += uint8_t(b);
			const auto &m = frame->meta();
			checksum += strnlen(m.producer, sizeof(m.producer)) +
				    strnlen(m.content_type, sizeof(m.content_type));
			for (uint32_t d = 0; d < m.ndim && d < XMEM_MAX_DIMS; d++)
				checksum += m.shape[d];
			(void)pool->stats();
			held.push_back(std::move(*frame));
			while (held.size() > hold)
				held.pop_front();
		}
	}
	beat.tick(true,
		  "done received=%llu refused=%llu timeouts=%llu errors=%llu attaches=%llu eos=%llu checksum=%llu\n",
		  received, refused, timeouts, errors.count, attaches, eos, checksum);
	return 0;
}

// The targets of the scribbler, each a part of the control segment.
const char *const kTargets[] = {
	"random", // random bytes anywhere in the segment
	"constants", // magic, counts, sizes, offsets: ControlConstants
	"header", // pool state, progress, owner_waiting, counters, format_seq, growth line
	"format", // the format seqlock and the format string
	"slot-state", // SlotRecord::state
	"holders", // holder words
	"slot-meta", // frame metadata, slot format string and its seq, side data and its size
	"ring-index", // ring heads and tails
	"ring-entry", // ring entries
	"consumer", // consumer records: state, pid, queue size, armed, detached, client
	"layout", // what a frame's readers trust: planes, size, shape and strides, dtype
};

class Scribbler
{
public:
	Scribbler(std::span<std::byte> seg, const xmem::layout::ControlConstants &k, uint64_t seed)
		: seg_(seg), k_(k), rng_(seed)
	{
	}

	// One write to TARGET.
	void scribble(const std::string &target)
	{
		using namespace xmem::layout;
		if (target == "random") {
			uint64_t at = pick(seg_.size() - 8);
			uint64_t v = value64();
			std::memcpy(seg_.data() + at, &v, 1 + pick(8 - 1));
		} else if (target == "constants") {
			// A field-aligned word or dword among the constants.
			uint64_t at = pick(sizeof(ControlConstants) / 4) * 4;
			if (rng_() % 2 && at % 8 == 0 && at + 8 <= sizeof(ControlConstants))
				store<uint64_t>(at, value64());
			else
				store<uint32_t>(at, uint32_t(value64()));
		} else if (target == "header") {
			auto *h = header();
			switch (pick(10)) {
			case 0:
				h->state.store(uint32_t(small_or_random()));
				break;
			case 1:
				h->progress.store(uint32_t(value64()));
				break;
			case 2:
				h->owner_waiting.store(uint32_t(small_or_random()));
				break;
			case 3:
				h->published.store(value64());
				break;
			case 4:
				h->dropped.store(value64());
				break;
			case 5:
				h->reaped.store(value64());
				break;
			case 6:
				h->format_seq.store(value64());
				break;
			case 7:
				// Growth on demand: the owner keeps its own account of these.
				h->dynamic_classes.store(uint32_t(value64()));
				break;
			case 8:
				h->dynamic_slots.store(uint32_t(small_or_random()));
				h->system_bytes.store(value64());
				break;
			default:
				h->classes.store(uint32_t(small_or_random()));
				break;
			}
		} else if (target == "format") {
			auto *h = header();
			if (rng_() % 2)
				h->format_lock.store(rng_() % 2 ? value64() | 1 : value64());
			else
				fill(h->format, sizeof(h->format));
		} else if (target == "slot-state") {
			slot()->state.store(uint32_t(small_or_random()));
		} else if (target == "holders") {
			auto &w = slot()->holders[pick(kHolderWords)];
			switch (pick(4)) {
			case 0:
				w.fetch_or(uint64_t{ 1 } << pick(64));
				break;
			case 1:
				w.fetch_and(~(uint64_t{ 1 } << pick(64)));
				break;
			case 2:
				w.store(0);
				break;
			default:
				w.store(value64());
				break;
			}
		} else if (target == "slot-meta") {
			SlotRecord *s = slot();
			switch (pick(6)) {
			case 0:
				fill(reinterpret_cast<char *>(&s->meta), sizeof(s->meta));
				break;
			case 4: // the side data's size: in range, or not
				s->side_data_size = uint32_t(rng_() % 2 ? pick(2 * XMEM_SIDE_DATA_MAX) : value64());
				break;
			case 5:
				fill(reinterpret_cast<char *>(s->side_data), sizeof(s->side_data));
				break;
			case 1:
				fill(s->format, sizeof(s->format));
				break;
			case 2:
				s->format_seq = value64();
				break;
			default: {
				// One field of the metadata: size, ndim, n_planes and friends.
				uint64_t at = pick(sizeof(s->meta) / 4) * 4;
				uint32_t v = uint32_t(small_or_random());
				std::memcpy(reinterpret_cast<std::byte *>(&s->meta) + at, &v, 4);
			}
			}
		} else if (target == "ring-index") {
			ConsumerRecord *c = consumer();
			uint64_t h = c->head.load(), t = c->tail.load();
			uint64_t v;
			switch (pick(5)) {
			case 0:
				v = value64();
				break;
			case 1:
				v = t + 1 + pick(4);
				break; // head past tail
			case 2:
				v = h + k_.ring_capacity + 1 + pick(4);
				break; // too many queued
			case 3:
				v = h + pick(k_.ring_capacity + 1);
				break; // plausible
			default:
				v = rng_() % 2 ? 0 : ~uint64_t{ 0 };
				break;
			}
			(rng_() % 2 ? c->head : c->tail).store(v);
		} else if (target == "ring-entry") {
			ConsumerRecord *c = consumer();
			uint64_t e;
			// Mostly at a position the ring could hold now: past the position check.
			uint64_t at = c->head.load() + pick(k_.ring_capacity);
			switch (pick(6)) {
			case 0:
				e = ring_entry(at, pick(k_.slot_count));
				break; // a real slot
			case 4:
				e = ring_entry(at, rng_() % 2 ? kTakenEntry : kSkipEntry);
				break;
			case 5:
				e = ring_entry(at, kSpillEntry | pick(8));
				break;
			case 1:
				e = uint64_t(rng_()) << 32 | kEosEntry;
				break;
			case 2:
				e = uint64_t(rng_()) << 32 | (k_.slot_count + pick(1000));
				break;
			default:
				e = value64();
				break;
			}
			ring_of(c)[pick(k_.ring_capacity)].store(e);
		} else if (target == "layout") {
			scribble_layout(slot()->meta);
		} else if (target == "consumer") {
			ConsumerRecord *c = consumer();
			switch (pick(8)) {
			case 0:
				c->state.store(uint32_t(small_or_random()));
				break;
			case 1:
				c->pid = uint32_t(value64());
				break;
			case 2:
				c->queue_size = uint32_t(small_or_random());
				break;
			case 3:
				c->armed.store(uint32_t(small_or_random()));
				break;
			case 4:
				c->detached.store(uint32_t(small_or_random()));
				break;
			case 5:
				fill(c->client, sizeof(c->client));
				break;
			case 6:
				c->received.store(value64());
				break;
			default:
				c->sync_mode = uint32_t(small_or_random());
				break;
			}
		}
	}

private:
	// One field of the layout a reader of the frame's pixels follows (xmemsrc's video
	// meta, Python's planes(), arrays and DLPack): edge values mostly, plausible but
	// wrong ones often, so that a reader that trusts it goes past the slot.
	void scribble_layout(xmem_frame_meta &m)
	{
		switch (pick(10)) {
		case 0:
		case 1: {
			uint64_t p = pick(XMEM_MAX_PLANES);
			m.plane_offset[p] = plane_offset(m.plane_offset[p]);
			break;
		}
		case 2:
		case 3: {
			uint64_t p = pick(XMEM_MAX_PLANES);
			m.plane_stride[p] = plane_stride(m.plane_stride[p]);
			break;
		}
		case 4: // 0 (not planar), 1..4, past XMEM_MAX_PLANES, or anything
			m.n_planes = uint32_t(rng_() % 4 ? pick(7) : value64());
			break;
		case 5:
			m.size = payload_size(m.size);
			break;
		case 6: // 0..XMEM_MAX_DIMS + 1, or anything
			m.ndim = uint8_t(rng_() % 4 ? pick(XMEM_MAX_DIMS + 2) : value64());
			break;
		case 7: {
			uint64_t d = pick(XMEM_MAX_DIMS);
			m.shape[d] = extent(m.shape[d]);
			break;
		}
		case 8: {
			uint64_t d = pick(XMEM_MAX_DIMS);
			m.strides[d] = extent(m.strides[d]);
			break;
		}
		default: // another element size, or none at all
			m.dtype = uint8_t(rng_() % 2 ? pick(XMEM_DTYPE_F64 + 1)
						     : XMEM_DTYPE_F64 + 1 + pick(255 - XMEM_DTYPE_F64));
			break;
		}
	}
	uint64_t plane_offset(uint64_t now)
	{
		uint64_t slot = k_.slot_size;
		switch (pick(10)) {
		case 0:
			return slot - 1; // one byte left for a whole plane
		case 1:
			return slot;
		case 2:
			return slot + 1 + pick(4096);
		case 3:
			return now + 1 + pick(64); // the plane's last rows a little past the end
		case 4:
			return now * 2 + 1;
		case 5:
			return slot - pick(std::min<uint64_t>(slot, 4096));
		case 6:
			return pick(slot); // in the slot, but not where the plane is
		case 7:
			return uint64_t{ 1 } << (32 + pick(32));
		default:
			return value64();
		}
	}
	uint32_t plane_stride(uint32_t now)
	{
		switch (pick(10)) {
		case 0:
			return 0;
		case 1:
			return 0xffffffffu; // -1 as a gint
		case 2:
			return 0x80000000u + uint32_t(pick(0x80000000u)); // over INT32_MAX: negative as a gint
		case 3:
			return 0x7fffffffu;
		case 4:
			return now * 2; // doubled: the plane's rows run past the slot
		case 5:
			return now + 1 + uint32_t(pick(64));
		case 6:
			return uint32_t(std::min<uint64_t>(k_.slot_size, 0xffffffffu));
		case 7:
			return uint32_t(k_.slot_size / 2);
		default:
			return uint32_t(value64());
		}
	}
	uint64_t payload_size(uint64_t now)
	{
		uint64_t slot = k_.slot_size;
		switch (pick(8)) {
		case 0:
			return 0;
		case 1:
			return ~uint64_t{ 0 };
		case 2:
			return slot + 1 + pick(64); // slightly over the slot
		case 3:
			return slot;
		case 4:
			return now / 2; // short: the planes end past the payload
		case 5:
			return slot - 1 - pick(std::min<uint64_t>(slot, 4096));
		default:
			return value64();
		}
	}
	// A shape or a stride (bytes): huge, products that overflow 64 bits, plausible.
	uint64_t extent(uint64_t now)
	{
		switch (pick(12)) {
		case 0:
			return 0;
		case 1:
			return 1;
		case 2:
			return ~uint64_t{ 0 }; // -1 as a signed stride
		case 3:
			return uint64_t{ 1 } << 63;
		case 4:
			return uint64_t{ 1 } << 32; // two of them multiply to 0
		case 5:
			return 0x5555555555555556ull; // times 3 is 2
		case 6:
			return now * 2;
		case 7:
			return now + 1;
		case 8:
			return k_.slot_size;
		case 9:
			return pick(4096);
		default:
			return value64();
		}
	}

	uint64_t pick(uint64_t n) { return n ? rng_() % n : 0; }
	// Values that tend to hit edges: 0, 1, small, all ones, sign bits, or random.
	uint64_t value64()
	{
		switch (pick(6)) {
		case 0:
			return 0;
		case 1:
			return ~uint64_t{ 0 };
		case 2:
			return pick(16);
		case 3:
			return uint64_t{ 1 } << pick(64);
		case 4:
			return uint64_t(uint32_t(rng_()));
		default:
			return rng_();
		}
	}
	uint64_t small_or_random() { return rng_() % 4 ? pick(6) : value64(); }
	// Non-zero bytes, no terminator.
	void fill(char *p, size_t n)
	{
		for (size_t i = 0; i < n; i++)
			p[i] = char(1 + pick(255));
	}
	template<typename T>
	void store(uint64_t at, T v)
	{
		std::memcpy(seg_.data() + at, &v, sizeof(v));
	}
	xmem::layout::ControlHeader *header() { return reinterpret_cast<xmem::layout::ControlHeader *>(seg_.data()); }
	xmem::layout::SlotRecord *slot()
	{
		return reinterpret_cast<xmem::layout::SlotRecord *>(seg_.data() + xmem::layout::slots_offset()) +
		       pick(k_.slot_count);
	}
	xmem::layout::ConsumerRecord *consumer()
	{
		uint64_t at = xmem::layout::consumers_offset(k_.slot_count) +
			      pick(k_.max_consumers) * uint64_t{ k_.consumer_record_size };
		return reinterpret_cast<xmem::layout::ConsumerRecord *>(seg_.data() + at);
	}

	std::span<std::byte> seg_;
	xmem::layout::ControlConstants k_;
	std::mt19937_64 rng_;
};

// scribble NAME --seed S --targets a,b,c --burst N --pause-us U: attaches as a consumer
// (the segment is mapped read-write, as for every consumer) and scribbles until killed.
int scribble(const std::string &name, const xmem::test::Options &o)
{
	xmem::OpenOptions options;
	options.timeout = 10s;
	options.client = "scribbler";
	auto opened = xmem::BufferPool::open(name, options);
	if (!opened) {
		std::printf("error open %s\n", opened.error().message.c_str());
		return 1;
	}
	std::shared_ptr<xmem::BufferPool> pool = opened.value();
	std::span<const std::byte> view = pool->control_segment();
	// The consumer's mapping is writable (MAP_SHARED, PROT_WRITE): a hostile peer
	// needs nothing more than what every consumer already has.
	std::span<std::byte> seg(const_cast<std::byte *>(view.data()), view.size());
	xmem::layout::ControlConstants k;
	std::memcpy(&k, seg.data(), sizeof(k)); // before anyone scribbles on it

	std::vector<std::string> targets;
	std::string list = o.count("targets") ? o.at("targets") : "all";
	for (const char *t : kTargets)
		if (list == "all" || ("," + list + ",").find(std::string(",") + t + ",") != std::string::npos)
			targets.push_back(t);
	if (targets.empty()) {
		std::printf("error no known target in '%s'\n", list.c_str());
		return 2;
	}
	uint64_t seed = number_option(o, "seed", 1);
	uint64_t burst = number_option(o, "burst", 64);
	uint64_t pause_us = number_option(o, "pause-us", 100);
	Scribbler s(seg, k, seed);
	std::mt19937_64 choose(seed ^ 0x9e3779b97f4a7c15ull);
	std::map<std::string, unsigned long long> counts;
	Heartbeat beat;
	std::printf("scribbling\n");
	std::fflush(stdout);
	for (;;) {
		for (uint64_t n = 0; n < burst; n++) {
			const std::string &t = targets[choose() % targets.size()];
			s.scribble(t);
			counts[t]++;
		}
		std::string line;
		for (auto &[t, n] : counts)
			line += " " + t + "=" + std::to_string(n);
		beat.tick(false, "writes%s\n", line.c_str());
		std::this_thread::sleep_for(std::chrono::microseconds(pause_us));
	}
}

} // namespace

int main(int argc, char **argv)
{
	if (argc < 3) {
		std::fprintf(stderr, "usage: xmem-hostile-peer produce|consume|scribble NAME [options]\n");
		return 2;
	}
	std::string mode = argv[1], name = argv[2];
	auto o = xmem::test::parse_options(argc, argv, 3);
	std::setvbuf(stdout, nullptr, _IOLBF, 0);
	if (mode == "produce")
		return produce(name, o);
	if (mode == "consume")
		return consume(name, o);
	if (mode == "scribble")
		return scribble(name, o);
	std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
	return 2;
}
