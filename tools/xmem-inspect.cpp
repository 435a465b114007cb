// xmem-inspect.cpp - shows what is in a pool: lists the pools of the default directory,
// or attaches to one as an inspector and prints its control segment as text or JSON.
#include "layout.hpp"

#include <xmem/xmem.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>

namespace {

using namespace xmem::layout;

constexpr int kExitError = 1;
constexpr int kExitUsage = 2;

void usage(std::FILE *out)
{
	std::fprintf(out,
		     "usage: xmem-inspect [--json] [NAME]\n"
		     "\n"
		     "Without NAME, lists the pools in %s and whether a live owner answers.\n"
		     "With NAME (a pool name, or a socket path containing '/'), attaches as an\n"
		     "inspector and prints the pool's header, slots, consumers and counters.\n"
		     "\n"
		     "  --json      print one JSON object instead of text\n"
		     "  -h, --help  print this help\n"
		     "\n"
		     "Exit status: 0 on success, 1 when the pool cannot be inspected, 2 on bad usage.\n",
		     xmem::default_directory().c_str());
}

int fail(const std::string &message)
{
	std::fprintf(stderr, "xmem-inspect: %s\n", message.c_str());
	return kExitError;
}

// Length of the valid UTF-8 sequence at S[I], or 0 when it is not one. Strings come
// from other processes, so JSON output must not pass on bytes that make it invalid.
size_t utf8_length(std::string_view s, size_t i)
{
	auto at = [&](size_t k) -> uint8_t {
		return k < s.size() ? uint8_t(s[k]) : 0;
	};
	auto cont = [&](size_t k) {
		return (at(k) & 0xc0) == 0x80;
	};
	uint8_t c = at(i);
	if (c < 0x80)
		return 1;
	if (c >= 0xc2 && c <= 0xdf)
		return cont(i + 1) ? 2 : 0;
	if (c >= 0xe0 && c <= 0xef) {
		uint8_t c1 = at(i + 1);
		if ((c == 0xe0 && c1 < 0xa0) || (c == 0xed && c1 > 0x9f))
			return 0;
		return cont(i + 1) && cont(i + 2) ? 3 : 0;
	}
	if (c >= 0xf0 && c <= 0xf4) {
		uint8_t c1 = at(i + 1);
		if ((c == 0xf0 && c1 < 0x90) || (c == 0xf4 && c1 > 0x8f))
			return 0;
		return cont(i + 1) && cont(i + 2) && cont(i + 3) ? 4 : 0;
	}
	return 0;
}

// S quoted and escaped, for JSON or for a terminal. Names and formats are written by
// other processes: control characters must not reach the terminal or break the JSON.
std::string quoted(std::string_view s, bool json)
{
	std::string out = "\"";
	char buf[8];
	for (size_t i = 0; i < s.size();) {
		unsigned char c = uint8_t(s[i]);
		switch (c) {
		case '"':
			out += "\\\"";
			break;
		case '\\':
			out += "\\\\";
			break;
		case '\n':
			out += "\\n";
			break;
		case '\r':
			out += "\\r";
			break;
		case '\t':
			out += "\\t";
			break;
		case '\b':
			out += "\\b";
			break;
		case '\f':
			out += "\\f";
			break;
		default:
			if (c < 0x20 || c == 0x7f) {
				std::snprintf(buf, sizeof(buf), "\\u%04x", c);
				out += buf;
			} else if (size_t n = utf8_length(s, i); n > 0) {
				out.append(s.substr(i, n));
				i += n;
				continue;
			} else if (json) {
				out += "\\ufffd";
			} else {
				std::snprintf(buf, sizeof(buf), "\\x%02x", c);
				out += buf;
			}
		}
		i++;
	}
	return out + "\"";
}

// A compact JSON writer: tracks where commas go, nothing else.
class JsonWriter
{
public:
	JsonWriter &begin_object() { return open('{'); }
	JsonWriter &end_object() { return close('}'); }
	JsonWriter &begin_array() { return open('['); }
	JsonWriter &end_array() { return close(']'); }

	JsonWriter &key(std::string_view k)
	{
		separate();
		out_ += quoted(k, true) + ":";
		after_key_ = true;
		return *this;
	}
	JsonWriter &number(uint64_t v) { return raw(std::to_string(v)); }
	JsonWriter &boolean(bool v) { return raw(v ? "true" : "false"); }
	JsonWriter &string(std::string_view v) { return raw(quoted(v, true)); }
	JsonWriter &null() { return raw("null"); }

	const std::string &str() const { return out_; }

private:
	void separate()
	{
		if (after_key_) {
			after_key_ = false;
			return;
		}
		if (first_.empty())
			return;
		if (!first_.back())
			out_ += ',';
		first_.back() = false;
	}
	JsonWriter &raw(std::string_view v)
	{
		separate();
		out_ += v;
		return *this;
	}
	JsonWriter &open(char c)
	{
		separate();
		out_ += c;
		first_.push_back(true);
		return *this;
	}
	JsonWriter &close(char c)
	{
		first_.pop_back();
		out_ += c;
		return *this;
	}

	std::string out_;
	std::vector<bool> first_;
	bool after_key_ = false;
};

// A fixed-size char field of the segment as a string: never past the field, even
// when the writer left out the NUL.
template<size_t N>
std::string field_string(const char (&field)[N])
{
	char copy[N];
	std::memcpy(copy, field, N);
	return std::string(copy, strnlen(copy, N));
}

const char *slot_state_name(uint32_t s)
{
	switch (s) {
	case kSlotFree:
		return "free";
	case kSlotWriting:
		return "writing";
	case kSlotPublished:
		return "published";
	case kSlotExclusive:
		return "exclusive";
	case kSlotReclaiming:
		return "reclaiming";
	}
	return "invalid";
}

const char *consumer_state_name(uint32_t s)
{
	switch (s) {
	case kConsumerFree:
		return "free";
	case kConsumerActive:
		return "active";
	case kConsumerDead:
		return "dead";
	}
	return "invalid";
}

const char *pool_state_name(uint32_t s)
{
	switch (s) {
	case kPoolOpen:
		return "open";
	case kPoolClosed:
		return "closed";
	}
	return "invalid";
}

const char *policy_name(uint32_t p)
{
	switch (p) {
	case XMEM_POLICY_BLOCK:
		return "block";
	case XMEM_POLICY_DROP_OLDEST:
		return "drop-oldest";
	case XMEM_POLICY_DROP_NEW:
		return "drop-new";
	}
	return "invalid";
}

std::string octal(uint32_t mode)
{
	char buf[16];
	std::snprintf(buf, sizeof(buf), "0%03o", mode);
	return buf;
}

// PID alive as far as kill(2) can tell; EPERM means it exists under another user.
// pid 0 and "negative" pids would address process groups, so they are never alive.
bool process_alive(uint32_t pid)
{
	if (pid == 0 || pid > uint32_t(INT_MAX))
		return false;
	return ::kill(pid_t(pid), 0) == 0 || errno == EPERM;
}

uint64_t monotonic_ns()
{
	timespec ts;
	::clock_gettime(CLOCK_MONOTONIC, &ts);
	return uint64_t(ts.tv_sec) * 1'000'000'000 + uint64_t(ts.tv_nsec);
}

struct Format {
	std::string text;
	uint64_t seq;
};

// The format string and its sequence number through the seqlock: retried while the
// owner is rewriting them (odd) or rewrote them during the copy. Nothing when it never
// settles: an owner that died or stopped mid-write leaves the lock odd forever.
std::optional<Format> read_format(const ControlHeader &h)
{
	char copy[XMEM_FORMAT_MAX];
	uint64_t deadline = monotonic_ns() + 200'000'000;
	do {
		uint64_t before = h.format_lock.load(std::memory_order_acquire);
		if (before % 2 == 0) {
			// Racy by design: the sequence check below throws away a torn copy.
			std::memcpy(copy, h.format, sizeof(copy));
			uint64_t seq = h.format_seq.load(std::memory_order_relaxed);
			std::atomic_thread_fence(std::memory_order_acquire);
			if (h.format_lock.load(std::memory_order_relaxed) == before)
				return Format{ std::string(copy, strnlen(copy, sizeof(copy))), seq };
		}
		std::this_thread::yield();
	} while (monotonic_ns() < deadline);
	return std::nullopt;
}

// What the header holds, read once: it is written at create and constant afterwards,
// and reading it once means every bound below uses the same numbers.
struct HeaderView {
	uint32_t magic;
	uint32_t abi_version;
	uint32_t header_size;
	uint32_t slot_record_size;
	uint32_t consumer_record_size;
	uint32_t slot_count;
	uint32_t max_consumers;
	uint32_t ring_capacity;
	uint64_t control_size;
	uint64_t slot_size;
	uint64_t slot_stride;
	uint64_t data_size;
	uint32_t storage_type;
	uint32_t policy;
	uint32_t mode;
	uint32_t owner_pid;
	uint32_t owner_uid;
	uint64_t block_timeout_ns;
	uint64_t created_ns;
	std::string producer;
};

struct Holder {
	uint32_t bit;
	std::optional<uint32_t> pid; // unknown for a bit past the consumer records
};

struct SlotView {
	uint32_t index;
	uint32_t state;
	std::vector<Holder> holders;
	uint64_t seq;
	bool free;
};

struct QueueEntry {
	uint32_t slot; // kEosEntry for end of stream
	uint32_t seq; // low 32 bits of the frame's sequence number
};

struct ConsumerView {
	uint32_t index;
	uint32_t state;
	uint32_t pid;
	uint32_t uid;
	std::string client;
	bool alive;
	uint64_t head;
	uint64_t tail;
	std::optional<uint64_t> queued; // none when head and tail make no sense
	std::vector<QueueEntry> queue;
	uint64_t received;
	uint64_t dropped;
	uint64_t queued_total;
	uint32_t queue_size;
};

struct PoolView {
	std::string name;
	std::string path;
	HeaderView header;
	uint32_t state;
	std::optional<Format> format;
	uint64_t published;
	uint64_t dropped;
	uint64_t reaped;
	std::vector<SlotView> slots;
	uint32_t slots_free = 0;
	std::vector<ConsumerView> consumers; // the records that are not free
	uint32_t consumers_attached = 0;
	std::vector<std::string> warnings;
};

// Reads the control segment of an inspector handle into a PoolView. Everything it
// indexes with is bounded by the mapping, whatever the owner wrote.
xmem::Result<PoolView> read_pool(const xmem::BufferPool &pool)
{
	std::span<const std::byte> segment = pool.control_segment();
	if (segment.size() < slots_offset())
		return xmem::Error{ xmem::Errc::bad_segment, "pool '" + pool.name() + "': control segment too small" };
	const auto &h = *reinterpret_cast<const ControlHeader *>(segment.data());

	PoolView v;
	v.name = pool.name();
	v.path = pool.path();
	v.header = HeaderView{
		h.magic,       h.abi_version,	h.header_size,	    h.slot_record_size, h.consumer_record_size,
		h.slot_count,  h.max_consumers, h.ring_capacity,    h.control_size,	h.slot_size,
		h.slot_stride, h.data_size,	h.storage_type,	    h.policy,		h.mode,
		h.owner_pid,   h.owner_uid,	h.block_timeout_ns, h.created_ns,	field_string(h.producer)
	};
	const HeaderView &hv = v.header;

	// The layout follows the slot count validated at attach, not a re-read of the
	// header, exactly as the library's own handle does.
	uint32_t slot_count = pool.slot_count();
	if (hv.slot_count != slot_count)
		v.warnings.push_back("header slot count " + std::to_string(hv.slot_count) + " differs from " +
				     std::to_string(slot_count) + " at attach");
	uint64_t slots_fit = (segment.size() - slots_offset()) / sizeof(SlotRecord);
	uint32_t slots_shown = uint32_t(std::min<uint64_t>(slot_count, slots_fit));

	uint32_t max_consumers = std::min<uint32_t>(hv.max_consumers, XMEM_MAX_CONSUMERS);
	uint32_t ring_capacity = hv.ring_capacity;
	uint64_t record_size = hv.consumer_record_size;
	uint64_t base = consumers_offset(slot_count);
	if (ring_capacity > XMEM_MAX_SLOTS + 1 || record_size % 64 != 0 ||
	    record_size < consumer_record_size(ring_capacity)) {
		v.warnings.push_back("consumer record size " + std::to_string(record_size) +
				     " does not fit a ring of " + std::to_string(ring_capacity) +
				     " entries: consumers not shown");
		max_consumers = 0;
	} else {
		uint64_t fit = base < segment.size() ? (segment.size() - base) / record_size : 0;
		if (fit < max_consumers) {
			v.warnings.push_back("only " + std::to_string(fit) + " of " + std::to_string(max_consumers) +
					     " consumer records fit in the mapping");
			max_consumers = uint32_t(fit);
		}
	}
	// Computed as PoolImpl::consumer() does.
	auto consumer = [&](uint32_t i) {
		return reinterpret_cast<const ConsumerRecord *>(segment.data() + base + uint64_t{ i } * record_size);
	};

	v.state = h.state.load(std::memory_order_acquire);
	v.format = read_format(h);
	v.published = h.published.load(std::memory_order_relaxed);
	v.dropped = h.dropped.load(std::memory_order_relaxed);
	v.reaped = h.reaped.load(std::memory_order_relaxed);

	std::vector<uint32_t> consumer_pids(max_consumers);
	for (uint32_t i = 0; i < max_consumers; i++)
		consumer_pids[i] = consumer(i)->pid;

	const auto *slots = reinterpret_cast<const SlotRecord *>(segment.data() + slots_offset());
	for (uint32_t i = 0; i < slots_shown; i++) {
		const SlotRecord &slot = slots[i];
		SlotView s{};
		s.index = i;
		s.state = slot.state.load(std::memory_order_acquire);
		uint64_t any = 0;
		for (uint32_t w = 0; w < kHolderWords; w++) {
			uint64_t bits = slot.holders[w].load(std::memory_order_seq_cst);
			any |= bits;
			for (uint32_t b = 0; b < 64; b++) {
				if (!(bits & (uint64_t{ 1 } << b)))
					continue;
				uint32_t bit = w * 64 + b;
				Holder holder{ bit, std::nullopt };
				if (bit == kOwnerBit)
					holder.pid = hv.owner_pid;
				else if (bit - 1 < max_consumers)
					holder.pid = consumer_pids[bit - 1];
				s.holders.push_back(holder);
			}
		}
		s.seq = slot.meta.seq;
		// The same rule as BufferPool::stats() and the owner's acquire().
		s.free = s.state == kSlotFree || ((s.state == kSlotPublished || s.state == kSlotExclusive) && any == 0);
		if (s.free)
			v.slots_free++;
		v.slots.push_back(std::move(s));
	}

	for (uint32_t i = 0; i < max_consumers; i++) {
		const ConsumerRecord *rec = consumer(i);
		uint32_t state = rec->state.load(std::memory_order_acquire);
		if (state == kConsumerFree)
			continue;
		ConsumerView c{};
		c.index = i;
		c.state = state;
		c.pid = rec->pid;
		c.uid = rec->uid;
		c.client = field_string(rec->client);
		c.alive = state == kConsumerActive && process_alive(c.pid);
		// Head first: it never passes tail, so tail read after it is not behind it.
		c.head = rec->head.load(std::memory_order_acquire);
		c.tail = rec->tail.load(std::memory_order_acquire);
		if (c.tail - c.head <= ring_capacity) {
			c.queued = c.tail - c.head;
			// ring_of() takes a mutable record; the entries are only loaded here.
			const std::atomic<uint64_t> *ring = ring_of(const_cast<ConsumerRecord *>(rec));
			for (uint64_t k = c.head; k != c.tail; k++) {
				uint64_t e = ring[k % ring_capacity].load(std::memory_order_acquire);
				c.queue.push_back(QueueEntry{ uint32_t(e), uint32_t(e >> 32) });
			}
		}
		c.received = rec->received.load(std::memory_order_relaxed);
		c.dropped = rec->dropped.load(std::memory_order_relaxed);
		c.queued_total = rec->queued_total.load(std::memory_order_relaxed);
		c.queue_size = rec->queue_size;
		if (state == kConsumerActive)
			v.consumers_attached++;
		v.consumers.push_back(std::move(c));
	}
	return v;
}

void print_json(const PoolView &v)
{
	const HeaderView &h = v.header;
	JsonWriter j;
	j.begin_object();
	j.key("name").string(v.name);
	j.key("path").string(v.path);
	j.key("magic").number(h.magic);
	j.key("abi_version").number(h.abi_version);
	j.key("header_size").number(h.header_size);
	j.key("slot_record_size").number(h.slot_record_size);
	j.key("consumer_record_size").number(h.consumer_record_size);
	j.key("control_size").number(h.control_size);
	j.key("data_size").number(h.data_size);
	j.key("slots_total").number(v.slots.size());
	j.key("slots_free").number(v.slots_free);
	j.key("slot_size").number(h.slot_size);
	j.key("slot_stride").number(h.slot_stride);
	j.key("max_consumers").number(h.max_consumers);
	j.key("ring_capacity").number(h.ring_capacity);
	j.key("storage_type").number(h.storage_type);
	j.key("policy").string(policy_name(h.policy));
	j.key("mode").string(octal(h.mode));
	j.key("owner_pid").number(h.owner_pid);
	j.key("owner_uid").number(h.owner_uid);
	j.key("block_timeout_ns").number(h.block_timeout_ns);
	j.key("created_ns").number(h.created_ns);
	j.key("producer").string(h.producer);
	j.key("state").string(pool_state_name(v.state));
	j.key("format");
	if (v.format)
		j.string(v.format->text);
	else
		j.null();
	j.key("format_seq");
	if (v.format)
		j.number(v.format->seq);
	else
		j.null();
	j.key("published").number(v.published);
	j.key("dropped").number(v.dropped);
	j.key("reaped").number(v.reaped);
	j.key("consumers_attached").number(v.consumers_attached);

	j.key("slots").begin_array();
	for (const SlotView &s : v.slots) {
		j.begin_object();
		j.key("index").number(s.index);
		j.key("state").string(slot_state_name(s.state));
		j.key("free").boolean(s.free);
		j.key("holders").begin_array();
		for (const Holder &holder : s.holders) {
			if (holder.pid)
				j.number(*holder.pid);
			else
				j.null();
		}
		j.end_array();
		j.key("holder_bits").begin_array();
		for (const Holder &holder : s.holders)
			j.number(holder.bit);
		j.end_array();
		j.key("seq").number(s.seq);
		j.end_object();
	}
	j.end_array();

	j.key("consumers").begin_array();
	for (const ConsumerView &c : v.consumers) {
		j.begin_object();
		j.key("index").number(c.index);
		j.key("pid").number(c.pid);
		j.key("uid").number(c.uid);
		j.key("client").string(c.client);
		j.key("state").string(consumer_state_name(c.state));
		j.key("alive").boolean(c.alive);
		j.key("queued");
		if (c.queued)
			j.number(*c.queued);
		else
			j.null();
		j.key("queue").begin_array();
		for (const QueueEntry &e : c.queue) {
			j.begin_object();
			if (e.slot == kEosEntry)
				j.key("eos").boolean(true);
			else
				j.key("slot").number(e.slot);
			j.key("seq").number(e.seq);
			j.end_object();
		}
		j.end_array();
		j.key("head").number(c.head);
		j.key("tail").number(c.tail);
		j.key("received").number(c.received);
		j.key("dropped").number(c.dropped);
		j.key("queued_total").number(c.queued_total);
		j.key("queue_size").number(c.queue_size);
		j.end_object();
	}
	j.end_array();

	j.key("warnings").begin_array();
	for (const std::string &w : v.warnings)
		j.string(w);
	j.end_array();
	j.end_object();
	std::printf("%s\n", j.str().c_str());
}

void print_text(const PoolView &v)
{
	const HeaderView &h = v.header;
	std::printf("pool %s at %s\n", quoted(v.name, false).c_str(), quoted(v.path, false).c_str());
	std::printf("  magic            0x%08x%s\n", h.magic, h.magic == kMagic ? "" : " (wrong)");
	std::printf("  abi version      %u\n", h.abi_version);
	std::printf("  record sizes     header %u, slot %u, consumer %u bytes\n", h.header_size, h.slot_record_size,
		    h.consumer_record_size);
	std::printf("  segments         control %llu, data %llu bytes\n", (unsigned long long)h.control_size,
		    (unsigned long long)h.data_size);
	std::printf("  slots            %u of %llu bytes, stride %llu\n", h.slot_count, (unsigned long long)h.slot_size,
		    (unsigned long long)h.slot_stride);
	std::printf("  consumers        up to %u, rings of %u entries\n", h.max_consumers, h.ring_capacity);
	std::printf("  policy           %s", policy_name(h.policy));
	if (h.policy == XMEM_POLICY_BLOCK)
		std::printf(" (timeout %llu ms)", (unsigned long long)(h.block_timeout_ns / 1'000'000));
	std::printf("\n");
	std::printf("  mode             %s\n", octal(h.mode).c_str());
	std::printf("  owner            pid %u, uid %u\n", h.owner_pid, h.owner_uid);
	std::printf("  producer         %s\n", quoted(h.producer, false).c_str());
	std::printf("  state            %s\n", pool_state_name(v.state));
	if (v.format)
		std::printf("  format           %s (seq %llu)\n", quoted(v.format->text, false).c_str(),
			    (unsigned long long)v.format->seq);
	else
		std::printf("  format           (being rewritten by the owner)\n");

	std::printf("\nslots: %u of %zu free\n", v.slots_free, v.slots.size());
	std::printf("  %5s  %-10s  %10s  %s\n", "index", "state", "seq", "holders");
	for (const SlotView &s : v.slots) {
		std::string holders;
		for (const Holder &holder : s.holders) {
			if (!holders.empty())
				holders += ", ";
			if (holder.bit == kOwnerBit)
				holders += "owner ";
			else
				holders += "consumer " + std::to_string(holder.bit - 1) + " ";
			holders += holder.pid ? "pid " + std::to_string(*holder.pid) : "pid ?";
		}
		if (holders.empty())
			holders = "-";
		std::printf("  %5u  %-10s  %10llu  %s\n", s.index, slot_state_name(s.state), (unsigned long long)s.seq,
			    holders.c_str());
	}

	std::printf("\nconsumers: %u attached\n", v.consumers_attached);
	if (!v.consumers.empty()) {
		std::printf("  %5s  %8s  %-20s  %-6s  %-5s  %6s  %10s  %10s  %5s\n", "index", "pid", "client", "state",
			    "alive", "queued", "received", "dropped", "queue");
		for (const ConsumerView &c : v.consumers) {
			std::string queued = c.queued ? std::to_string(*c.queued) : "?";
			std::printf("  %5u  %8u  %-20s  %-6s  %-5s  %6s  %10llu  %10llu  %5u\n", c.index, c.pid,
				    quoted(c.client, false).c_str(), consumer_state_name(c.state),
				    c.alive ? "yes" : "no", queued.c_str(), (unsigned long long)c.received,
				    (unsigned long long)c.dropped, c.queue_size);
		}
	}

	std::printf("\ncounters: published %llu, dropped %llu, reaped %llu\n", (unsigned long long)v.published,
		    (unsigned long long)v.dropped, (unsigned long long)v.reaped);
	for (const std::string &w : v.warnings)
		std::printf("warning: %s\n", w.c_str());
}

int inspect(const std::string &name, bool json)
{
	xmem::OpenOptions options;
	options.client = "xmem-inspect";
	options.inspect = true;
	auto pool = xmem::BufferPool::open(name, options);
	if (!pool)
		return fail(pool.error().message);
	auto view = read_pool(**pool);
	if (!view)
		return fail(view.error().message);
	if (json)
		print_json(*view);
	else
		print_text(*view);
	return 0;
}

struct Listed {
	std::string name;
	std::string path;
	std::optional<xmem::PoolStats> stats; // set when a live owner answered
	uint32_t owner_pid = 0;
	uint64_t slot_size = 0;
	std::string error;
};

int list(bool json)
{
	std::string dir = xmem::default_directory();
	std::vector<std::string> names;
	// A missing directory only means no pool was ever created here.
	if (DIR *d = ::opendir(dir.c_str())) {
		while (dirent *e = ::readdir(d)) {
			std::string_view n = e->d_name;
			if (n.starts_with('.') || n.ends_with(".lock") || n.ends_with(".tmp"))
				continue;
			struct stat st;
			std::string path = dir + "/" + std::string(n);
			if (::lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode))
				names.emplace_back(n);
		}
		::closedir(d);
	} else if (int err = errno; err != ENOENT) {
		return fail("cannot read pool directory " + dir + ": " + std::system_category().message(err));
	}
	std::sort(names.begin(), names.end());

	std::vector<Listed> pools;
	for (const std::string &n : names) {
		Listed l;
		l.name = n;
		// By path: a file name the name rules reject is still worth listing.
		l.path = dir;
		l.path += '/';
		l.path += n;
		xmem::OpenOptions options{ .timeout = std::chrono::nanoseconds(0),
					   .client = "xmem-inspect",
					   .inspect = true };
		auto pool = xmem::BufferPool::open(l.path, options);
		if (pool) {
			l.stats = (*pool)->stats();
			l.slot_size = (*pool)->slot_size();
			std::span<const std::byte> segment = (*pool)->control_segment();
			if (segment.size() >= sizeof(ControlHeader))
				l.owner_pid = reinterpret_cast<const ControlHeader *>(segment.data())->owner_pid;
		} else {
			l.error = pool.error().message;
		}
		pools.push_back(std::move(l));
	}

	if (json) {
		JsonWriter j;
		j.begin_object();
		j.key("directory").string(dir);
		j.key("pools").begin_array();
		for (const Listed &l : pools) {
			j.begin_object();
			j.key("name").string(l.name);
			j.key("path").string(l.path);
			j.key("live").boolean(l.stats.has_value());
			if (l.stats) {
				j.key("owner_pid").number(l.owner_pid);
				j.key("slots_total").number(l.stats->slots_total);
				j.key("slots_free").number(l.stats->slots_free);
				j.key("slot_size").number(l.slot_size);
				j.key("consumers").number(l.stats->consumers);
				j.key("published").number(l.stats->published);
				j.key("closed").boolean(l.stats->closed != 0);
			} else {
				j.key("error").string(l.error);
			}
			j.end_object();
		}
		j.end_array();
		j.end_object();
		std::printf("%s\n", j.str().c_str());
		return 0;
	}

	if (pools.empty()) {
		std::printf("no pools in %s\n", quoted(dir, false).c_str());
		return 0;
	}
	std::printf("pools in %s:\n", quoted(dir, false).c_str());
	for (const Listed &l : pools) {
		if (l.stats)
			std::printf("  %-24s live (owner pid %u): %u slots of %llu bytes, %u free, %u consumers, "
				    "%llu published\n",
				    quoted(l.name, false).c_str(), l.owner_pid, l.stats->slots_total,
				    (unsigned long long)l.slot_size, l.stats->slots_free, l.stats->consumers,
				    (unsigned long long)l.stats->published);
		else
			std::printf("  %-24s no live owner: %s\n", quoted(l.name, false).c_str(), l.error.c_str());
	}
	return 0;
}

} // namespace

int main(int argc, char **argv)
{
	bool json = false;
	std::optional<std::string> name;
	bool options_done = false;
	for (int i = 1; i < argc; i++) {
		std::string_view a = argv[i];
		if (!options_done && a == "--") {
			options_done = true;
		} else if (!options_done && (a == "-h" || a == "--help")) {
			usage(stdout);
			return 0;
		} else if (!options_done && a == "--json") {
			json = true;
		} else if (!options_done && a.size() > 1 && a[0] == '-') {
			std::fprintf(stderr, "xmem-inspect: unknown option '%s'\n", argv[i]);
			usage(stderr);
			return kExitUsage;
		} else if (name) {
			std::fprintf(stderr, "xmem-inspect: more than one pool name ('%s', '%s')\n", name->c_str(),
				     argv[i]);
			usage(stderr);
			return kExitUsage;
		} else {
			name = std::string(a);
		}
	}
	return name ? inspect(*name, json) : list(json);
}
