// xmem-inspect.cpp - shows what is in a pool: lists the pools of the default directory,
// or attaches to one as an inspector and prints its control segment as text or JSON.
#include <xmem/snapshot.hpp>
#include <xmem/xmem.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>

namespace {

constexpr int kExitError = 1;
constexpr int kExitUsage = 2;

// Usage text and error messages are best effort: nothing to do if the stream fails.
void usage(std::FILE *out)
{
	(void)std::fprintf(out,
			   "usage: xmem-inspect [--json] [NAME]\n"
			   "\n"
			   "Without NAME, lists the pools in %s and whether a live owner answers.\n"
			   "With NAME (a pool name, a socket path containing '/', or @NAME for an\n"
			   "abstract socket), attaches as an inspector and prints the pool's header,\n"
			   "slots, consumers and counters. Pids are as this process numbers them:\n"
			   "a process in a PID namespace it cannot see is \"in another PID namespace\".\n"
			   "\n"
			   "  --json      print one JSON object instead of text\n"
			   "  -h, --help  print this help\n"
			   "\n"
			   "Exit status: 0 on success, 1 when the pool cannot be inspected, 2 on bad usage.\n",
			   xmem::default_directory().c_str());
}

int fail(const std::string &message)
{
	(void)std::fprintf(stderr, "xmem-inspect: %s\n", message.c_str());
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
				// BUF holds the longest escape: snprintf cannot truncate or fail.
				(void)std::snprintf(buf, sizeof(buf), "\\u%04x", c);
				out += buf;
			} else if (size_t n = utf8_length(s, i); n > 0) {
				out.append(s.substr(i, n));
				i += n;
				continue;
			} else if (json) {
				out += "\\ufffd";
			} else {
				(void)std::snprintf(buf, sizeof(buf), "\\x%02x", c);
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

// A pool's policy by its first name in the library's table ("block" for fifo).
const char *policy_name(uint32_t p)
{
	for (const auto &n : xmem::policy_names())
		if (uint32_t(n.policy) == p)
			return n.name;
	return "invalid";
}

// A consumer's policy by its own name ("fifo" for the pool's "block").
const char *consumer_policy_name(uint32_t p)
{
	const char *name = xmem::policy_name(xmem::Policy(p));
	return name ? name : "invalid";
}

// A class's storage by the library's name; "invalid" for a value no library writes.
const char *class_storage_name(xmem::Storage s)
{
	const char *name = xmem::storage_name(s);
	return name ? name : "invalid";
}

std::string octal(uint32_t mode)
{
	char buf[16];
	(void)std::snprintf(buf, sizeof(buf), "0%03o", mode); // at most 12 characters
	return buf;
}

// Whether consumer C is attached: its owner holds its connection and reaps it when the
// connection ends, so an active record is a live process, in whatever PID namespace. A
// pid is never asked (kill(2)): from another namespace it can name another process.
bool consumer_alive(const xmem::ConsumerSnapshot &c)
{
	return c.state == xmem::ConsumerState::active;
}

// How a PID namespace relates to this process's: "same", "other" or "unknown".
const char *namespace_relation(uint64_t pid_ns, uint64_t here)
{
	if (!pid_ns || !here)
		return "unknown";
	return pid_ns == here ? "same" : "other";
}

// "1234", or what is known of a process this one cannot number.
std::string pid_text(std::optional<uint32_t> pid_here, uint32_t own_pid)
{
	if (pid_here)
		return std::to_string(*pid_here);
	if (own_pid)
		return "pid " + std::to_string(own_pid) + " in another PID namespace";
	return "in another PID namespace";
}

void print_json(const xmem::PoolSnapshot &v)
{
	const xmem::HeaderSnapshot &h = v.header;
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
	j.key("device_id").number(h.device_id);
	j.key("device_uuid").string(h.device_uuid);
	j.key("gpu_ordering").string(xmem::gpu_ordering_name(h.sync_mode));
	j.key("policy").string(policy_name(h.policy));
	j.key("mode").string(octal(h.mode));
	// The owner's pid as this process numbers it (null: another PID namespace), and as
	// it numbers itself.
	j.key("owner_pid");
	if (v.owner_pid_here)
		j.number(*v.owner_pid_here);
	else
		j.null();
	j.key("owner_own_pid").number(h.owner_pid);
	j.key("owner_pid_namespace")
		.string(v.owner_pid_here && h.owner_pid_ns != v.pid_ns_here
				? "visible"
				: namespace_relation(h.owner_pid_ns, v.pid_ns_here));
	j.key("owner_uid").number(h.owner_uid);
	j.key("block_timeout_ns").number(h.block_timeout_ns);
	j.key("created_ns").number(h.created_ns);
	j.key("producer").string(h.producer);
	j.key("state").string(xmem::state_name(v.state));
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
	j.key("spill").begin_object();
	j.key("cap_bytes").number(v.spill.cap_bytes);
	j.key("cap_frames").number(v.spill.cap_frames);
	j.key("frames").number(v.spill.frames);
	j.key("bytes").number(v.spill.bytes);
	j.key("peak_bytes").number(v.spill.peak_bytes);
	j.key("spilled").number(v.spill.spilled);
	j.key("full").number(v.spill.full);
	j.end_object();
	j.key("tickets").begin_object();
	j.key("issued").number(v.tickets.issued);
	j.key("redeemed").number(v.tickets.redeemed);
	j.key("expired").number(v.tickets.expired);
	j.key("live").number(v.tickets.live);
	j.end_object();
	j.key("growth").begin_object();
	j.key("memory_cap").number(v.growth.memory_cap);
	j.key("trim_idle_ns").number(v.growth.trim_idle_ns);
	j.key("system_bytes").number(v.growth.system_bytes);
	j.key("dynamic_slots").number(v.growth.dynamic_slots);
	j.key("dynamic_bytes").number(v.growth.dynamic_bytes);
	j.key("grown").number(v.growth.grown);
	j.key("trimmed").number(v.growth.trimmed);
	j.key("refused").number(v.growth.refused);
	j.key("device_memory_cap").number(v.growth.device_memory_cap);
	j.key("device_bytes").number(v.growth.device_bytes);
	j.end_object();

	j.key("slot_records").number(h.slot_count);
	j.key("classes").begin_array();
	for (const xmem::SizeClass &c : v.classes) {
		j.begin_object();
		j.key("index").number(c.index);
		j.key("storage").string(class_storage_name(c.storage));
		j.key("device_id").number(c.device);
		j.key("slot_size").number(c.slot_size);
		j.key("first_slot").number(c.first_slot);
		j.key("count").number(c.count);
		j.key("gpu_ordering").string(xmem::gpu_ordering_name(c.sync_mode));
		j.key("dynamic").boolean(c.dynamic);
		j.key("committed").number(c.committed);
		j.end_object();
	}
	j.end_array();
	j.key("slots").begin_array();
	for (const xmem::SlotSnapshot &s : v.slots) {
		j.begin_object();
		j.key("index").number(s.index);
		j.key("class").number(s.size_class);
		j.key("state").string(xmem::state_name(s.state));
		j.key("free").boolean(s.free);
		j.key("holders").begin_array();
		for (const xmem::HolderSnapshot &holder : s.holders) {
			if (holder.pid)
				j.number(*holder.pid);
			else
				j.null();
		}
		j.end_array();
		j.key("holder_bits").begin_array();
		for (const xmem::HolderSnapshot &holder : s.holders)
			j.number(holder.bit);
		j.end_array();
		j.key("seq").number(s.seq);
		j.key("side_data_size").number(s.side_data_size);
		j.key("ticket_left").number(s.ticket_left);
		j.end_object();
	}
	j.end_array();

	j.key("consumers").begin_array();
	for (const xmem::ConsumerSnapshot &c : v.consumers) {
		j.begin_object();
		j.key("index").number(c.index);
		// Its pid as this process numbers it (null: a PID namespace not visible here),
		// as the consumer numbers itself, and as its owner saw it (0: not visible there).
		j.key("pid");
		if (c.pid_here)
			j.number(*c.pid_here);
		else
			j.null();
		j.key("own_pid").number(c.own_pid);
		j.key("owner_seen_pid").number(c.pid);
		j.key("pid_namespace")
			.string(c.pid_here && c.pid_ns != v.pid_ns_here ? "visible"
									: namespace_relation(c.pid_ns, v.pid_ns_here));
		j.key("uid").number(c.uid);
		j.key("gid").number(c.gid);
		j.key("client").string(c.client);
		j.key("state").string(xmem::state_name(c.state));
		j.key("alive").boolean(consumer_alive(c));
		j.key("queued");
		if (c.queued)
			j.number(*c.queued);
		else
			j.null();
		j.key("queue").begin_array();
		for (const xmem::QueueEntrySnapshot &e : c.queue) {
			j.begin_object();
			if (e.end_of_stream)
				j.key("eos").boolean(true);
			else if (e.taken)
				j.key("taken").boolean(true);
			else if (e.spilled)
				j.key("spill_buffer").number(e.slot);
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
		j.key("policy").string(consumer_policy_name(c.policy));
		if (c.policy == XMEM_POLICY_FIFO || c.policy == XMEM_POLICY_FIFO_SPILL)
			j.key("fallback").string(consumer_policy_name(c.fallback));
		if (c.policy == XMEM_POLICY_FIFO)
			j.key("block_timeout_ns").number(c.block_timeout_ns);
		j.key("spilled").number(c.spilled);
		j.key("held").number(c.held);
		if (c.max_held)
			j.key("max_held").number(c.max_held);
		else
			j.key("max_held").null();
		j.key("history").number(c.history);
		j.key("gpu_ordering").string(xmem::gpu_ordering_name(c.sync_mode));
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

void print_text(const xmem::PoolSnapshot &v)
{
	const xmem::HeaderSnapshot &h = v.header;
	std::printf("pool %s at %s\n", quoted(v.name, false).c_str(), quoted(v.path, false).c_str());
	std::printf("  magic            0x%08x%s\n", h.magic, h.magic_valid ? "" : " (wrong)");
	std::printf("  abi version      %u\n", h.abi_version);
	std::printf("  record sizes     header %u, slot %u, consumer %u bytes\n", h.header_size, h.slot_record_size,
		    h.consumer_record_size);
	std::printf("  segments         control %llu, data %llu bytes\n", (unsigned long long)h.control_size,
		    (unsigned long long)h.data_size);
	uint32_t in_classes = 0;
	for (const xmem::SizeClass &c : v.classes)
		in_classes += c.dynamic ? c.committed : c.count;
	std::printf("  slots            %u in %zu size class%s, records for %u\n", in_classes, v.classes.size(),
		    v.classes.size() == 1 ? "" : "es", h.slot_count);
	for (const xmem::SizeClass &c : v.classes) {
		std::string memory = c.storage == xmem::Storage::cuda
					     ? "CUDA device " + std::to_string(c.device) + ", GPU ordering " +
						       xmem::gpu_ordering_name(c.sync_mode)
					     : "system memory";
		// A dynamic class: its slots whose memory is committed, of the records it reserved.
		std::string count = c.dynamic ? std::to_string(c.committed) + " made on demand (room for " +
							std::to_string(c.count) + ")"
					      : std::to_string(c.count);
		std::printf("  class %-10u %s of %llu bytes (slots %u..%u)%s, %s\n", c.index, count.c_str(),
			    (unsigned long long)c.slot_size, c.first_slot, c.first_slot + c.count - 1,
			    c.index == 0 ? (", stride " + std::to_string(h.slot_stride)).c_str() : "", memory.c_str());
	}
	if (v.growth.memory_cap || v.growth.device_memory_cap) {
		std::string caps;
		if (v.growth.memory_cap)
			caps = std::to_string(v.growth.system_bytes) + " of " + std::to_string(v.growth.memory_cap) +
			       " bytes of system memory in slots";
		if (v.growth.device_memory_cap)
			caps += (caps.empty() ? "" : ", ") + std::to_string(v.growth.device_bytes) +
				" bytes of device memory in slots (cap " + std::to_string(v.growth.device_memory_cap) +
				" per device)";
		std::printf("  growth           %s; %u made on demand (%llu bytes), %llu made, %llu trimmed "
			    "(idle %llu ms), %llu refused at the cap\n",
			    caps.c_str(), v.growth.dynamic_slots, (unsigned long long)v.growth.dynamic_bytes,
			    (unsigned long long)v.growth.grown, (unsigned long long)v.growth.trimmed,
			    (unsigned long long)(v.growth.trim_idle_ns / 1'000'000),
			    (unsigned long long)v.growth.refused);
	}
	std::printf("  consumers        up to %u, rings of %u entries\n", h.max_consumers, h.ring_capacity);
	if (h.storage_type == XMEM_STORAGE_CUDA)
		std::printf("  storage          CUDA device %u (%s) in its producer, GPU ordering %s\n", h.device_id,
			    h.device_uuid.empty() ? "UUID not recorded" : h.device_uuid.c_str(),
			    xmem::gpu_ordering_name(h.sync_mode));
	std::printf("  policy           %s", policy_name(h.policy));
	if (h.policy == XMEM_POLICY_BLOCK)
		std::printf(" (timeout %llu ms)", (unsigned long long)(h.block_timeout_ns / 1'000'000));
	std::printf("\n");
	if (h.spill_frames)
		std::printf("  spill tier       %llu of %llu bytes, %u of %u buffers held (peak %llu bytes); "
			    "%llu frames spilled, %llu times full\n",
			    (unsigned long long)v.spill.bytes, (unsigned long long)h.spill_bytes, v.spill.frames,
			    h.spill_frames, (unsigned long long)v.spill.peak_bytes, (unsigned long long)v.spill.spilled,
			    (unsigned long long)v.spill.full);
	if (v.tickets.issued)
		std::printf("  tickets          %u live; %llu issued, %llu redeemed, %llu expired unused\n",
			    v.tickets.live, (unsigned long long)v.tickets.issued,
			    (unsigned long long)v.tickets.redeemed, (unsigned long long)v.tickets.expired);
	std::printf("  mode             %s\n", octal(h.mode).c_str());
	std::printf("  owner            %s%s, uid %u\n", v.owner_pid_here ? "pid " : "",
		    pid_text(v.owner_pid_here, h.owner_pid).c_str(), h.owner_uid);
	std::printf("  producer         %s\n", quoted(h.producer, false).c_str());
	std::printf("  state            %s\n", xmem::state_name(v.state));
	if (v.format)
		std::printf("  format           %s (seq %llu)\n", quoted(v.format->text, false).c_str(),
			    (unsigned long long)v.format->seq);
	else
		std::printf("  format           (being rewritten by the owner)\n");

	std::printf("\nslots: %u of %zu free\n", v.slots_free, v.slots.size());
	std::printf("  %5s  %-10s  %10s  %9s  %s\n", "index", "state", "seq", "side data", "holders");
	for (const xmem::SlotSnapshot &s : v.slots) {
		std::string holders;
		for (const xmem::HolderSnapshot &holder : s.holders) {
			if (!holders.empty())
				holders += ", ";
			if (holder.is_owner())
				holders += "owner ";
			else
				holders += "consumer " + std::to_string(holder.consumer_index()) + " ";
			holders += holder.pid ? "pid " + std::to_string(*holder.pid) : "(other PID namespace)";
		}
		if (holders.empty())
			holders = "-";
		if (s.ticket_left)
			holders += " (ticket: " + std::to_string(s.ticket_left) + " redemption" +
				   (s.ticket_left == 1 ? "" : "s") + " left)";
		std::printf("  %5u  %-10s  %10llu  %9u  %s\n", s.index, xmem::state_name(s.state),
			    (unsigned long long)s.seq, s.side_data_size, holders.c_str());
	}

	std::printf("\nconsumers: %u attached\n", v.consumers_attached);
	if (!v.consumers.empty()) {
		std::printf("  %5s  %8s  %-20s  %-6s  %-5s  %6s  %7s  %10s  %10s  %5s  %s\n", "index", "pid", "client",
			    "state", "alive", "queued", "held", "received", "dropped", "queue", "policy");
		for (const xmem::ConsumerSnapshot &c : v.consumers) {
			std::string queued = c.queued ? std::to_string(*c.queued) : "?";
			std::string pid = c.pid_here ? std::to_string(*c.pid_here) : "other-ns";
			std::string policy = consumer_policy_name(c.policy);
			if (c.policy == XMEM_POLICY_FIFO)
				policy += " (" + std::to_string(c.block_timeout_ns / 1'000'000) + " ms, then " +
					  consumer_policy_name(c.fallback) + ")";
			if (c.policy == XMEM_POLICY_FIFO_SPILL)
				policy += " (" + std::to_string(c.spilled) + " spilled; when full " +
					  consumer_policy_name(c.fallback) + ")";
			// Slots held (queued ones too) against its cap; "-": no cap.
			std::string held = std::to_string(c.held) + "/" +
					   (c.max_held ? std::to_string(c.max_held) : std::string("-"));
			std::printf("  %5u  %8s  %-20s  %-6s  %-5s  %6s  %7s  %10llu  %10llu  %5u  %s\n", c.index,
				    pid.c_str(), quoted(c.client, false).c_str(), xmem::state_name(c.state),
				    consumer_alive(c) ? "yes" : "no", queued.c_str(), held.c_str(),
				    (unsigned long long)c.received, (unsigned long long)c.dropped, c.queue_size,
				    policy.c_str());
			if (!c.pid_here)
				std::printf("         %s, not visible from this process's\n",
					    pid_text(c.pid_here, c.own_pid).c_str());
			if (c.sync_mode != 0)
				std::printf("         GPU ordering %s\n", xmem::gpu_ordering_name(c.sync_mode));
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
	auto snapshot = xmem::snapshot(**pool);
	if (!snapshot)
		return fail(snapshot.error().message);
	if (json)
		print_json(*snapshot);
	else
		print_text(*snapshot);
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
		// readdir() is only unsafe on a DIR shared between threads; this one is not.
		while (dirent *e = ::readdir(d)) { // NOLINT(concurrency-mt-unsafe)
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
			l.owner_pid = (*pool)->owner_pid(); // 0: in a PID namespace not visible here
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
				j.key("owner_pid");
				if (l.owner_pid)
					j.number(l.owner_pid);
				else
					j.null();
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
			std::printf("  %-24s live (owner %s): %u slots of %llu bytes, %u free, %u consumers, "
				    "%llu published\n",
				    quoted(l.name, false).c_str(),
				    l.owner_pid ? ("pid " + std::to_string(l.owner_pid)).c_str()
						: "in another PID namespace",
				    l.stats->slots_total, (unsigned long long)l.slot_size, l.stats->slots_free,
				    l.stats->consumers, (unsigned long long)l.stats->published);
		else
			std::printf("  %-24s no live owner: %s\n", quoted(l.name, false).c_str(), l.error.c_str());
	}
	return 0;
}

int run(int argc, char **argv)
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
			(void)std::fprintf(stderr, "xmem-inspect: unknown option '%s'\n", argv[i]);
			usage(stderr);
			return kExitUsage;
		} else if (name) {
			(void)std::fprintf(stderr, "xmem-inspect: more than one pool name ('%s', '%s')\n",
					   name->c_str(), argv[i]);
			usage(stderr);
			return kExitUsage;
		} else {
			name = std::string(a);
		}
	}
	return name ? inspect(*name, json) : list(json);
}

} // namespace

// Out of memory while building the report is the only exception expected: a message and
// status 1 rather than std::terminate().
int main(int argc, char **argv)
{
	try {
		return run(argc, argv);
	} catch (const std::exception &e) {
		(void)std::fprintf(stderr, "xmem-inspect: %s\n", e.what());
		return kExitError;
	}
}
