// protocol.cpp - fuzzes the pool socket's messages in both directions, through the
// library's real code on both ends:
//   owner:    what a peer sends (Hello bytes and 0-3 fds) to a real owner's I/O thread,
//             whose answer must agree with parse_hello()'s verdict;
//   consumer: what a fake owner sends a real consumer (BufferPool::open): the reply
//             bytes, how many fds come with it, and the ArenaFds messages after it.
// Input: a selector byte, then per direction what read_owner_case/read_consumer_case
// take.
#include "fuzz.hpp"

#include "arena.hpp"
#include "layout.hpp"
#include "protocol.hpp"
#include "segment.hpp"

#include <map>
#include <memory>

#include <sys/eventfd.h>

using namespace std::chrono_literals;
using xmem::fuzz::Input;
using xmem::fuzz::Message;
namespace protocol = xmem::protocol;

namespace {

std::span<const std::byte> bytes_of(const void *p, size_t n)
{
	return { static_cast<const std::byte *>(p), n };
}

// --- the owner's side ---------------------------------------------------------------

xmem::BufferPool &owner_pool()
{
	static std::shared_ptr<xmem::BufferPool> pool = [] {
		xmem::PoolConfig config;
		config.slot_count = 2;
		config.slot_size = 64;
		config.max_consumers = XMEM_MAX_CONSUMERS;
		config.format = "fuzz";
		auto p = xmem::BufferPool::create(xmem::fuzz::scratch_dir() + "/owner", config);
		if (!p)
			xmem::fuzz::fail("creating the pool", p.error().message);
		return std::move(p.value());
	}();
	return *pool;
}

// Sends PAYLOAD with NFDS fds of KIND (0: eventfds, 1: memfds) to the real owner, and
// checks its answer against what parse_hello() says of the same bytes.
void fuzz_owner(std::span<const uint8_t> payload, uint32_t nfds, uint32_t kind)
{
	auto parsed = protocol::parse_hello(xmem::fuzz::as_bytes(payload));
	if (parsed) {
		// What a parsed Hello says survives make_hello() and parse_hello() unchanged
		// (reserved bytes and bytes after the client's NUL are not part of it).
		auto built = protocol::make_hello(parsed->role, parsed->queue_size, parsed->client);
		auto again = protocol::parse_hello(bytes_of(&built, sizeof(built)));
		XMEM_FUZZ_CHECK(again.ok() && again->role == parsed->role && again->queue_size == parsed->queue_size &&
					std::strcmp(again->client, parsed->client) == 0,
				"hello does not round-trip");
	}

	xmem::BufferPool &pool = owner_pool();
	auto conn = xmem::rendezvous::connect(pool.path(), xmem::monotonic_ns() + 10'000'000'000ull);
	XMEM_FUZZ_CHECK(conn.ok(), conn.ok() ? "" : conn.error().message);
	std::vector<xmem::UniqueFd> owned;
	std::vector<int> fds;
	for (uint32_t i = 0; i < nfds; i++) {
		owned.emplace_back(kind == 0 ? ::eventfd(0, EFD_CLOEXEC) : ::memfd_create("fuzz", MFD_CLOEXEC));
		fds.push_back(owned.back().get());
	}
	auto sent = xmem::rendezvous::send_message(conn->get(), payload.data(), payload.size(), fds.data(), fds.size());
	if (!sent)
		return; // the owner may hang up first on an empty message
	auto reply = xmem::rendezvous::receive_message(conn->get(), xmem::monotonic_ns() + 30'000'000'000ull, "owner",
						       protocol::kMaxFds);
	XMEM_FUZZ_CHECK(reply.ok() || reply.code() == xmem::Errc::closed,
			"the owner did not answer: " + reply.error().message);
	if (!reply)
		return;
	auto answer = protocol::parse_reply(reply->data, "owner");
	bool full = answer.code() == xmem::Errc::full;
	if (!parsed) {
		// Refused with the parser's code, and nothing admitted.
		XMEM_FUZZ_CHECK(!answer && answer.code() == parsed.code(),
				"owner accepted a hello parse_hello() refuses: " + parsed.error().message);
		XMEM_FUZZ_CHECK(reply->fds.empty(), "fds with a Reject");
		return;
	}
	bool inspector = parsed->role == protocol::PeerRole::inspector;
	// A size class's import: this pool has only its first class (which comes with the
	// attach), so every one is refused, and with no fds.
	// A dynamic device slot's import: this pool has none, so every one is refused, with no
	// fds.
	if (parsed->role == protocol::PeerRole::slot) {
		XMEM_FUZZ_CHECK(!answer && reply->fds.empty(),
				"an import of a slot of no dynamic device class: " +
					(answer.ok() ? std::string("welcome") : answer.error().message));
		return;
	}
	if (parsed->role == protocol::PeerRole::classes) {
		XMEM_FUZZ_CHECK(!answer && reply->fds.empty(),
				"an import of a class the owner lacks: " +
					(answer.ok() ? std::string("welcome") : answer.error().message));
		return;
	}
	// A producer besides the owner names an attached consumer of its own process: a
	// Welcome with no fds, or refused as an invalid argument (it names none, or sent more
	// than a pidfd's worth of fds).
	if (parsed->role == protocol::PeerRole::producer) {
		XMEM_FUZZ_CHECK(
			answer.ok() ? answer->consumer_index == protocol::kNoConsumer && reply->fds.empty() && nfds <= 1
				    : answer.code() == xmem::Errc::invalid_argument && reply->fds.empty(),
			"a producer's hello: " + (answer.ok() ? std::string("welcome") : answer.error().message));
		return;
	}
	// A consumer's request of how it is served must be one the owner can serve: this
	// pool has no spill tier, so no fifo-spill consumer.
	auto serve = protocol::serve_of(*parsed);
	bool serve_ok = inspector || (serve.ok() && serve->policy != xmem::Policy::fifo_spill);
	bool fds_ok = (inspector ? nfds == 0 : nfds == 1 && kind == 0) && serve_ok;
	XMEM_FUZZ_CHECK(answer.ok() == fds_ok || (full && !inspector),
			"owner's answer " + (answer.ok() ? std::string("welcome") : answer.error().message) + " with " +
				std::to_string(nfds) + " fds of kind " + std::to_string(kind));
	if (!answer)
		return;
	XMEM_FUZZ_CHECK(inspector ? answer->consumer_index == protocol::kNoConsumer
				  : answer->consumer_index < XMEM_MAX_CONSUMERS,
			std::to_string(answer->consumer_index));
	XMEM_FUZZ_CHECK(std::string(answer->format) == "fuzz", answer->format);
	// The control memfd, and the data memfd for a consumer.
	XMEM_FUZZ_CHECK(reply->fds.size() == (inspector ? 1u : 2u), std::to_string(reply->fds.size()));
	// Closing the connection now makes the owner reap the consumer.
}

// --- the consumer's side ------------------------------------------------------------

// Real control segments and data arenas an owner would send, made once per shape.
struct Segment {
	xmem::ControlSegment seg;
	xmem::UniqueFd data;
};

const Segment &segment(uint32_t shape)
{
	static std::map<uint32_t, std::unique_ptr<Segment>> made;
	auto &slot = made[shape];
	if (slot)
		return *slot;
	// Shapes: system memory with 1, 3 or 8 slots; CUDA storage with 2 or 300 slots
	// (more fds than fit in one message: the ArenaFds continuation).
	static constexpr struct {
		uint32_t slots;
		xmem::Storage storage;
	} shapes[] = { { 1, xmem::Storage::system },
		       { 3, xmem::Storage::system },
		       { 8, xmem::Storage::system },
		       { 2, xmem::Storage::cuda },
		       { 300, xmem::Storage::cuda } };
	const auto &s = shapes[shape];
	xmem::SegmentParams params;
	params.slot_count = s.slots;
	params.first_class_slots = s.slots;
	params.max_consumers = 2;
	params.slot_size = 4096;
	params.slot_stride = 4096;
	params.storage = s.storage;
	params.sync_mode = s.storage == xmem::Storage::cuda ? xmem::layout::kSyncCpu : xmem::layout::kSyncNone;
	params.producer = "fuzz";
	auto seg = xmem::ControlSegment::create("fuzz", params);
	if (!seg)
		xmem::fuzz::fail("creating a control segment", seg.error().message);
	slot = std::make_unique<Segment>();
	slot->seg = std::move(seg.value());
	std::vector<uint8_t> none;
	slot->data = xmem::fuzz::sealed_memfd(none, uint64_t{ s.slots } * params.slot_stride);
	return *slot;
}

constexpr uint32_t kShapes = 5;

xmem::fuzz::FakeOwner &fake_owner()
{
	static xmem::fuzz::FakeOwner owner("consumer");
	return owner;
}

// Input: flags (bit 0: attach as an inspector), a segment shape, then messages: a
// count of fds (the first message's first fd is the control segment, the others
// data memfds), a length and the bytes.
void fuzz_consumer(Input &in)
{
	uint8_t flags = in.take<uint8_t>();
	const Segment &s = segment(in.take<uint8_t>() % kShapes);
	std::vector<Message> messages;
	for (int i = 0; i < 4 && !in.empty(); i++) {
		Message m;
		uint32_t nfds = std::min<uint32_t>(in.take<uint8_t>(), protocol::kMaxFds);
		auto payload = in.bytes(in.take<uint16_t>() % (protocol::kMaxMessage + 8));
		m.bytes.assign(xmem::fuzz::as_bytes(payload).begin(), xmem::fuzz::as_bytes(payload).end());
		for (uint32_t f = 0; f < nfds; f++)
			m.fds.push_back(i == 0 && f == 0 ? s.seg.fd() : s.data.get());
		if (i == 0) {
			auto parsed = protocol::parse_reply(m.bytes, "fuzz");
			if (parsed)
				XMEM_FUZZ_CHECK(parsed->format[XMEM_FORMAT_MAX - 1] == '\0', "format not terminated");
		}
		messages.push_back(std::move(m));
	}
	// The fake owner hangs up after its messages: a consumer waiting for more fds
	// sees it at once instead of waiting out its timeout.
	xmem::fuzz::FakeOwner &owner = fake_owner();
	owner.serve(std::move(messages), true);
	xmem::OpenOptions options;
	options.inspect = flags & 1;
	options.client = "fuzz";
	auto pool = xmem::BufferPool::open(owner.path(), options);
	owner.done();
	// What the consumer sent is a Hello the owner's parser takes.
	auto hello = protocol::parse_hello(owner.hello());
	XMEM_FUZZ_CHECK(hello.ok(), hello.ok() ? "" : hello.error().message);
	if (!pool)
		return;
	// Attached: the segment's own constants and the Welcome's index are in bounds.
	XMEM_FUZZ_CHECK(pool.value()->slot_count() == s.seg.slot_count, "");
	if (!options.inspect) {
		auto stats = pool.value()->stats();
		XMEM_FUZZ_CHECK(stats.slots_total == s.seg.slot_count, "");
		// Nothing queued; or the record the Welcome names is not an active one (this
		// fake owner admitted nobody there), which receive() reports as a damaged
		// segment rather than wait for frames that would never be queued.
		auto got = pool.value()->receive(0s);
		XMEM_FUZZ_CHECK(got.code() == xmem::Errc::timed_out || got.code() == xmem::Errc::closed ||
					got.code() == xmem::Errc::bad_segment,
				got.ok() ? "a frame from an empty queue" : got.error().message);
	}
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	Input in(data, size);
	uint8_t select = in.take<uint8_t>();
	if (select & 1) {
		fuzz_consumer(in);
	} else {
		uint8_t fds = in.take<uint8_t>();
		fuzz_owner(in.rest(), fds % 4, (fds >> 2) & 1);
	}
	return 0;
}

std::vector<std::vector<uint8_t>> fuzz_seeds()
{
	std::vector<std::vector<uint8_t>> seeds;
	// Owner's side: Hellos make_hello() builds, with the fds each role sends.
	auto hello_seed = [&](protocol::PeerRole role, uint32_t queue, const char *client, uint8_t fds) {
		protocol::Hello h = protocol::make_hello(role, queue, client);
		xmem::fuzz::Output out;
		out.put(uint8_t(0)).put(fds).put_bytes(bytes_of(&h, sizeof(h)));
		seeds.push_back(out.take());
	};
	hello_seed(protocol::PeerRole::consumer, 4, "xmemsrc0", 1);
	hello_seed(protocol::PeerRole::consumer, 0, "", 1);
	hello_seed(protocol::PeerRole::inspector, 0, "xmem-inspect", 0);
	hello_seed(protocol::PeerRole::producer, 0, "producer", 0);
	// Consumer's side: the Welcome and fds an owner sends for each shape, as
	// rendezvous::send_welcome() splits them, and a Reject.
	for (uint32_t shape = 0; shape < kShapes; shape++) {
		for (bool inspect : { false, true }) {
			const Segment &s = segment(shape);
			const auto &k = s.seg.constants();
			protocol::Welcome w =
				protocol::make_welcome(inspect ? protocol::kNoConsumer : 1, k.control_size, k.data_size,
						       3, "video/x-raw, format=(string)NV12");
			size_t arena = inspect ? 0 : xmem::arena_fd_count(xmem::Storage(k.storage_type), k.slot_count);
			size_t first = std::min(arena, protocol::kMaxFds - 1);
			xmem::fuzz::Output out;
			out.put(uint8_t(inspect)).put(uint8_t(shape));
			out.put(uint8_t(1 + first)).put(uint16_t(sizeof(w))).put_bytes(bytes_of(&w, sizeof(w)));
			for (size_t next = first; next < arena;) {
				size_t n = std::min(arena - next, protocol::kMaxFds);
				protocol::MessageHeader h =
					protocol::make_header(protocol::MessageType::arena_fds, sizeof(h));
				out.put(uint8_t(n)).put(uint16_t(sizeof(h))).put_bytes(bytes_of(&h, sizeof(h)));
				next += n;
			}
			seeds.push_back(out.take());
		}
	}
	protocol::Reject r = protocol::make_reject(XMEM_EFULL, "pool has its maximum of 2 consumers attached");
	xmem::fuzz::Output out;
	out.put(uint8_t(1)).put(uint8_t(0)).put(uint8_t(0)).put(uint16_t(sizeof(r))).put_bytes(bytes_of(&r, sizeof(r)));
	seeds.push_back(out.take());
	return seeds;
}
