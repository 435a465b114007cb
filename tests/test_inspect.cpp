// test_inspect.cpp - xmem-inspect run as a separate process against pools owned and
// consumed in this one: what it reports (text and JSON), its listing, and its errors.
#include "common.hpp"

#include <xmem/snapshot.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string_view>
#include <utility>

#include <sys/socket.h>
#include <sys/un.h>

using namespace std::chrono_literals;
using xmem::test::eventually;
using xmem::test::RuntimeDir;

namespace {

// Just enough JSON to read the tool's output back: objects, arrays, strings with
// every escape, numbers kept as text. Its strictness checks the output is JSON.
struct Json {
	enum class Type { null, boolean, number, string, array, object };
	Type type = Type::null;
	bool flag = false;
	std::string text; // a number's characters, or a string's decoded bytes
	// An array's items, or an object's values with their keys in the same order.
	// (Not pairs: a vector may hold the incomplete Json, a pair may not.)
	std::vector<Json> items;
	std::vector<std::string> keys;

	const Json &operator[](std::string_view key) const
	{
		for (size_t i = 0; i < keys.size(); i++)
			if (keys[i] == key)
				return items[i];
		return missing();
	}
	const Json &operator[](size_t i) const { return i < items.size() ? items[i] : missing(); }
	size_t size() const { return items.size(); }
	uint64_t num() const { return type == Type::number ? std::strtoull(text.c_str(), nullptr, 10) : UINT64_MAX; }
	const std::string &str() const { return text; }

	static const Json &missing()
	{
		static const Json none;
		return none;
	}
};

class JsonParser
{
public:
	explicit JsonParser(std::string_view s) : s_(s) {}

	// The one value S holds, or nothing when S is not exactly one JSON value.
	std::optional<Json> parse()
	{
		Json v;
		if (!value(v))
			return std::nullopt;
		space();
		if (i_ != s_.size())
			return std::nullopt;
		return v;
	}

private:
	void space()
	{
		while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\t' || s_[i_] == '\r'))
			i_++;
	}
	bool eat(char c)
	{
		space();
		if (i_ < s_.size() && s_[i_] == c) {
			i_++;
			return true;
		}
		return false;
	}
	bool literal(std::string_view word)
	{
		if (s_.substr(i_, word.size()) != word)
			return false;
		i_ += word.size();
		return true;
	}
	bool hex4(uint32_t &out)
	{
		if (i_ + 4 > s_.size())
			return false;
		out = 0;
		for (int k = 0; k < 4; k++) {
			char c = s_[i_++];
			const char *digits = "0123456789abcdef";
			const char *d = c ? std::strchr(digits, c >= 'A' && c <= 'F' ? c - 'A' + 'a' : c) : nullptr;
			if (!d)
				return false;
			out = out * 16 + uint32_t(d - digits);
		}
		return true;
	}
	static void utf8(std::string &out, uint32_t cp)
	{
		if (cp < 0x80) {
			out += char(cp);
		} else if (cp < 0x800) {
			out += char(0xc0 | cp >> 6);
			out += char(0x80 | (cp & 0x3f));
		} else if (cp < 0x10000) {
			out += char(0xe0 | cp >> 12);
			out += char(0x80 | ((cp >> 6) & 0x3f));
			out += char(0x80 | (cp & 0x3f));
		} else {
			out += char(0xf0 | cp >> 18);
			out += char(0x80 | ((cp >> 12) & 0x3f));
			out += char(0x80 | ((cp >> 6) & 0x3f));
			out += char(0x80 | (cp & 0x3f));
		}
	}
	bool string(std::string &out)
	{
		if (!eat('"'))
			return false;
		while (i_ < s_.size()) {
			unsigned char c = uint8_t(s_[i_++]);
			if (c == '"')
				return true;
			if (c < 0x20)
				return false; // raw control characters are not allowed in JSON strings
			if (c != '\\') {
				out += char(c);
				continue;
			}
			if (i_ >= s_.size())
				return false;
			char e = s_[i_++];
			switch (e) {
			case '"':
			case '\\':
			case '/':
				out += e;
				break;
			case 'b':
				out += '\b';
				break;
			case 'f':
				out += '\f';
				break;
			case 'n':
				out += '\n';
				break;
			case 'r':
				out += '\r';
				break;
			case 't':
				out += '\t';
				break;
			case 'u': {
				uint32_t cp;
				if (!hex4(cp))
					return false;
				if (cp >= 0xd800 && cp < 0xdc00) {
					uint32_t low;
					if (!literal("\\u") || !hex4(low) || low < 0xdc00 || low > 0xdfff)
						return false;
					cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
				}
				utf8(out, cp);
				break;
			}
			default:
				return false;
			}
		}
		return false;
	}
	bool value(Json &v)
	{
		space();
		if (i_ >= s_.size())
			return false;
		char c = s_[i_];
		if (c == '{') {
			i_++;
			v.type = Json::Type::object;
			if (eat('}'))
				return true;
			do {
				std::string key;
				Json member;
				if (!string(key) || !eat(':') || !value(member))
					return false;
				v.keys.push_back(std::move(key));
				v.items.push_back(std::move(member));
			} while (eat(','));
			return eat('}');
		}
		if (c == '[') {
			i_++;
			v.type = Json::Type::array;
			if (eat(']'))
				return true;
			do {
				Json item;
				if (!value(item))
					return false;
				v.items.push_back(std::move(item));
			} while (eat(','));
			return eat(']');
		}
		if (c == '"') {
			v.type = Json::Type::string;
			return string(v.text);
		}
		if (literal("true") || literal("false")) {
			v.type = Json::Type::boolean;
			v.flag = c == 't';
			return true;
		}
		if (literal("null"))
			return true;
		size_t start = i_;
		if (i_ < s_.size() && s_[i_] == '-')
			i_++;
		while (i_ < s_.size() && ((s_[i_] >= '0' && s_[i_] <= '9') || s_[i_] == '.' || s_[i_] == 'e' ||
					  s_[i_] == 'E' || s_[i_] == '+' || s_[i_] == '-'))
			i_++;
		if (i_ == start)
			return false;
		v.type = Json::Type::number;
		v.text = std::string(s_.substr(start, i_ - start));
		return true;
	}

	std::string_view s_;
	size_t i_ = 0;
};

std::string inspect_path()
{
	const char *p = std::getenv("XMEM_INSPECT");
	return p ? p : "tools/xmem-inspect";
}

std::string shell_quoted(const std::string &s)
{
	std::string out = "'";
	for (char c : s)
		out += c == '\'' ? std::string("'\\''") : std::string(1, c);
	return out + "'";
}

struct ToolRun {
	int status = -1; // exit code, or 128 + signal
	std::string out;
	std::string err;
};

// Runs xmem-inspect ARGS in the test's runtime directory (it inherits XDG_RUNTIME_DIR).
ToolRun run_inspect(const std::vector<std::string> &args)
{
	ToolRun run;
	char tmpl[] = "/tmp/xmem-inspect-err-XXXXXX";
	int fd = ::mkstemp(tmpl);
	EXPECT_GE(fd, 0);
	if (fd < 0)
		return run;
	::close(fd);
	std::string cmd = shell_quoted(inspect_path());
	for (const std::string &a : args)
		cmd += " " + shell_quoted(a);
	cmd += " 2>" + shell_quoted(tmpl);
	std::FILE *pipe = ::popen(cmd.c_str(), "r");
	EXPECT_NE(pipe, nullptr) << cmd;
	if (pipe) {
		char buf[4096];
		size_t n;
		while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0)
			run.out.append(buf, n);
		int st = ::pclose(pipe);
		run.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
	}
	std::ifstream in(tmpl);
	run.err.assign(std::istreambuf_iterator<char>(in), {});
	::unlink(tmpl);
	return run;
}

// Runs xmem-inspect ARGS expecting success and one JSON value on stdout.
Json inspect_json(const std::vector<std::string> &args)
{
	ToolRun run = run_inspect(args);
	EXPECT_EQ(run.status, 0) << run.err;
	auto json = JsonParser(run.out).parse();
	EXPECT_TRUE(json.has_value()) << "not one JSON value: " << run.out;
	EXPECT_TRUE(json && json->type == Json::Type::object) << run.out;
	return json.value_or(Json{});
}

std::shared_ptr<xmem::BufferPool> make_owner(const std::string &name, uint32_t slots,
					     const std::string &format = "video/x-raw",
					     const std::string &producer = "inspect-test")
{
	xmem::PoolConfig config;
	config.slot_count = slots;
	config.slot_size = 4096;
	config.max_consumers = 8;
	config.policy = xmem::Policy::drop_oldest;
	config.format = format;
	config.producer = producer;
	auto pool = xmem::BufferPool::create(name, config);
	EXPECT_TRUE(pool.ok()) << (pool ? "" : pool.error().message);
	return pool ? pool.value() : nullptr;
}

std::shared_ptr<xmem::BufferPool> make_consumer(const std::string &name, const std::string &client, uint32_t queue)
{
	xmem::OpenOptions options;
	options.timeout = 2s;
	options.client = client;
	options.queue_size = queue;
	auto pool = xmem::BufferPool::open(name, options);
	EXPECT_TRUE(pool.ok()) << (pool ? "" : pool.error().message);
	return pool ? pool.value() : nullptr;
}

bool publish_one(xmem::BufferPool &owner)
{
	auto frame = owner.acquire(1s);
	if (!frame)
		return false;
	frame->meta_mut().value()->size = 16;
	return owner.publish(std::move(*frame)).ok();
}

const Json &consumer_named(const Json &pool, const char *client)
{
	for (const Json &c : pool["consumers"].items)
		if (c["client"].str() == client)
			return c;
	ADD_FAILURE() << "no consumer '" << client << "' in the output";
	return Json::missing();
}

const Json &slot_with_seq(const Json &pool, uint64_t seq)
{
	for (const Json &s : pool["slots"].items)
		if (s["seq"].num() == seq)
			return s;
	ADD_FAILURE() << "no slot holds frame " << seq;
	return Json::missing();
}

std::vector<uint64_t> numbers(const Json &array)
{
	std::vector<uint64_t> out;
	for (const Json &item : array.items)
		out.push_back(item.num());
	std::sort(out.begin(), out.end());
	return out;
}

// A unix socket at PATH that nobody listens on, as a dead owner leaves it.
void make_dead_socket(const std::string &path)
{
	int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	ASSERT_GE(fd, 0);
	sockaddr_un addr{};
	addr.sun_family = AF_UNIX;
	ASSERT_LT(path.size(), sizeof(addr.sun_path));
	std::memcpy(addr.sun_path, path.c_str(), path.size());
	EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr *>(&addr), sizeof(addr)), 0) << path;
	::close(fd);
}

void make_file(const std::string &path)
{
	std::ofstream out(path);
	out << "not a pool\n";
}

} // namespace

TEST(Inspect, JsonShowsSlotsConsumersHoldersAndCounters)
{
	RuntimeDir dir;
	auto owner = make_owner("insp", 4);
	ASSERT_TRUE(owner);
	auto first = make_consumer("insp", "first", 4);
	auto second = make_consumer("insp", "second", 2);
	ASSERT_TRUE(first && second);

	// Three frames: FIRST takes two and holds them; SECOND takes none, and its queue
	// of two loses the oldest frame (drop-oldest).
	for (int i = 0; i < 3; i++)
		ASSERT_TRUE(publish_one(*owner));
	std::vector<xmem::BufferGuard> held;
	for (int i = 0; i < 2; i++) {
		auto frame = first->receive(1s);
		ASSERT_TRUE(frame.ok()) << frame.error().message;
		held.push_back(std::move(*frame));
	}
	xmem::PoolStats expected = owner->stats();

	Json pool = inspect_json({ "insp", "--json" });
	EXPECT_EQ(pool["name"].str(), "insp");
	EXPECT_EQ(pool["path"].str(), dir.pool_dir() + "/insp");
	EXPECT_EQ(pool["slots_total"].num(), 4u);
	EXPECT_EQ(pool["slots_free"].num(), 1u);
	EXPECT_EQ(pool["slots_free"].num(), expected.slots_free);
	EXPECT_EQ(pool["slot_size"].num(), 4096u);
	EXPECT_EQ(pool["published"].num(), 3u);
	EXPECT_EQ(pool["dropped"].num(), 1u);
	EXPECT_EQ(pool["reaped"].num(), 0u);
	EXPECT_EQ(pool["owner_pid"].num(), uint64_t(::getpid()));
	EXPECT_EQ(pool["format"].str(), "video/x-raw");
	EXPECT_EQ(pool["producer"].str(), "inspect-test");
	EXPECT_EQ(pool["state"].str(), "open");
	EXPECT_EQ(pool["policy"].str(), "drop-oldest");
	EXPECT_EQ(pool["mode"].str(), "0600");
	EXPECT_EQ(pool["slots"].size(), 4u);

	ASSERT_EQ(pool["consumers"].size(), 2u);
	const Json &a = consumer_named(pool, "first");
	const Json &b = consumer_named(pool, "second");
	EXPECT_EQ(a["pid"].num(), uint64_t(::getpid()));
	EXPECT_TRUE(a["alive"].flag);
	EXPECT_EQ(a["received"].num(), 2u);
	EXPECT_EQ(a["dropped"].num(), 0u);
	EXPECT_EQ(a["queued"].num(), 1u);
	EXPECT_EQ(a["queue_size"].num(), 4u);
	EXPECT_EQ(b["received"].num(), 0u);
	EXPECT_EQ(b["dropped"].num(), 1u);
	EXPECT_EQ(b["queued"].num(), 2u);
	EXPECT_EQ(b["queue_size"].num(), 2u);
	EXPECT_TRUE(b["alive"].flag);
	// Slots held, queued ones too, against each one's cap: FIRST's default (its queue of
	// 4 and one) is the whole pool, so none; SECOND's is its queue of 2 and one.
	EXPECT_EQ(a["held"].num(), 3u);
	EXPECT_EQ(a["max_held"].type, Json::Type::null);
	EXPECT_EQ(b["held"].num(), 2u);
	EXPECT_EQ(b["max_held"].num(), 3u);
	std::string text = run_inspect({ "insp" }).out;
	EXPECT_NE(text.find(" 2/3 "), std::string::npos) << text;
	EXPECT_NE(text.find(" 3/- "), std::string::npos) << text;
	// SECOND's queue holds frames 2 and 3, in order.
	ASSERT_EQ(b["queue"].size(), 2u);
	EXPECT_EQ(b["queue"][0]["seq"].num(), 2u);
	EXPECT_EQ(b["queue"][1]["seq"].num(), 3u);

	// Holder bits name the consumer record (bit 1 + index); pids are all ours.
	uint64_t bit_a = 1 + a["index"].num(), bit_b = 1 + b["index"].num();
	const Json &s1 = slot_with_seq(pool, 1);
	EXPECT_EQ(s1["state"].str(), "published");
	EXPECT_FALSE(s1["free"].flag);
	EXPECT_EQ(numbers(s1["holder_bits"]), (std::vector<uint64_t>{ bit_a }));
	EXPECT_EQ(numbers(s1["holders"]), (std::vector<uint64_t>{ uint64_t(::getpid()) }));
	for (uint64_t seq : { 2u, 3u }) {
		const Json &s = slot_with_seq(pool, seq);
		EXPECT_EQ(numbers(s["holder_bits"]), (std::vector<uint64_t>{ bit_a, bit_b })) << "frame " << seq;
		EXPECT_EQ(numbers(s["holders"]), (std::vector<uint64_t>(2, uint64_t(::getpid())))) << "frame " << seq;
	}
	size_t unheld = 0;
	for (const Json &s : pool["slots"].items)
		unheld += s["holders"].size() == 0;
	EXPECT_EQ(unheld, 1u);

	// Releasing one frame shows at once; dropping the consumers is seen once the
	// owner's I/O thread has reaped them on hang-up.
	held.erase(held.begin());
	EXPECT_TRUE(slot_with_seq(inspect_json({ "--json", "insp" }), 1)["free"].flag);
	held.clear();
	first.reset();
	second.reset();
	Json after;
	EXPECT_TRUE(eventually(
		[&] {
			after = inspect_json({ "insp", "--json" });
			return after["slots_free"].num() == after["slots_total"].num() &&
			       after["consumers"].size() == 0;
		},
		10s))
		<< "slots_free " << after["slots_free"].num() << ", consumers " << after["consumers"].size();
	EXPECT_EQ(after["slots_free"].num(), 4u);
	EXPECT_EQ(after["reaped"].num(), 2u);
	for (const Json &s : after["slots"].items)
		EXPECT_EQ(s["holders"].size(), 0u);
}

// The library call xmem-inspect prints, through every kind of handle: the owner's, a
// consumer's and an inspector's all map the same control segment.
TEST(Inspect, SnapshotNamesTheHolderOfAFrameUntilItIsReleased)
{
	RuntimeDir dir;
	auto owner = make_owner("snap", 3);
	ASSERT_TRUE(owner);
	auto consumer = make_consumer("snap", "holder", 2);
	ASSERT_TRUE(consumer);
	xmem::OpenOptions options;
	options.inspect = true;
	auto inspector = xmem::BufferPool::open("snap", options);
	ASSERT_TRUE(inspector.ok()) << inspector.error().message;
	ASSERT_TRUE(publish_one(*owner));
	auto frame = consumer->receive(1s);
	ASSERT_TRUE(frame.ok()) << frame.error().message;
	uint32_t held = frame->index();

	for (const xmem::BufferPool *pool : { owner.get(), consumer.get(), inspector->get() }) {
		auto snap = xmem::snapshot(*pool);
		ASSERT_TRUE(snap.ok()) << snap.error().message;
		EXPECT_EQ(snap->name, "snap");
		EXPECT_EQ(snap->header.owner_pid, uint32_t(::getpid()));
		EXPECT_TRUE(snap->header.magic_valid);
		EXPECT_EQ(snap->state, xmem::PoolState::open);
		EXPECT_EQ(snap->published, 1u);
		EXPECT_TRUE(snap->warnings.empty());
		ASSERT_EQ(snap->slots.size(), 3u);
		EXPECT_EQ(snap->slots_free, 2u);

		ASSERT_EQ(snap->consumers.size(), 1u);
		const xmem::ConsumerSnapshot &c = snap->consumers[0];
		EXPECT_EQ(c.client, "holder");
		EXPECT_EQ(c.state, xmem::ConsumerState::active);
		EXPECT_EQ(c.pid, uint32_t(::getpid()));
		EXPECT_EQ(c.received, 1u);
		EXPECT_EQ(c.queued, std::optional<uint64_t>(0));
		EXPECT_EQ(snap->consumers_attached, 1u);

		const xmem::SlotSnapshot &slot = snap->slots[held];
		EXPECT_EQ(slot.index, held);
		EXPECT_EQ(slot.state, xmem::SlotState::published);
		EXPECT_FALSE(slot.free);
		EXPECT_EQ(slot.seq, 1u);
		ASSERT_EQ(slot.holders.size(), 1u);
		EXPECT_FALSE(slot.holders[0].is_owner());
		EXPECT_EQ(slot.holders[0].consumer_index(), c.index);
		EXPECT_EQ(slot.holders[0].pid, std::optional<uint32_t>(uint32_t(::getpid())));
	}

	frame->reset();
	auto snap = xmem::snapshot(**inspector);
	ASSERT_TRUE(snap.ok()) << snap.error().message;
	EXPECT_EQ(snap->slots_free, 3u);
	EXPECT_EQ(snap->slots_free, owner->stats().slots_free);
	EXPECT_TRUE(snap->slots[held].free);
	EXPECT_TRUE(snap->slots[held].holders.empty());
}

TEST(Inspect, TextShowsHeaderSlotsConsumersAndCounters)
{
	RuntimeDir dir;
	auto owner = make_owner("text", 2, "audio/x-raw,rate=48000");
	ASSERT_TRUE(owner);
	auto consumer = make_consumer("text", "listener", 2);
	ASSERT_TRUE(consumer);
	ASSERT_TRUE(publish_one(*owner));
	auto frame = consumer->receive(1s);
	ASSERT_TRUE(frame.ok());

	ToolRun run = run_inspect({ "text" });
	EXPECT_EQ(run.status, 0) << run.err;
	EXPECT_EQ(run.err, "");
	const std::string &out = run.out;
	EXPECT_NE(out.find("0x4d454d58"), std::string::npos) << out;
	EXPECT_NE(out.find("\"audio/x-raw,rate=48000\""), std::string::npos) << out;
	EXPECT_NE(out.find("\"inspect-test\""), std::string::npos) << out;
	EXPECT_NE(out.find("drop-oldest"), std::string::npos) << out;
	EXPECT_NE(out.find("0600"), std::string::npos) << out;
	EXPECT_NE(out.find("pid " + std::to_string(::getpid())), std::string::npos) << out;
	EXPECT_NE(out.find("open"), std::string::npos) << out;
	EXPECT_NE(out.find("slots: 1 of 2 free"), std::string::npos) << out;
	EXPECT_NE(out.find("consumer 0 pid " + std::to_string(::getpid())), std::string::npos) << out;
	EXPECT_NE(out.find("\"listener\""), std::string::npos) << out;
	EXPECT_NE(out.find("consumers: 1 attached"), std::string::npos) << out;
	EXPECT_NE(out.find("published 1, dropped 0, reaped 0"), std::string::npos) << out;
}

// A frame ticket: the pool's counters and the slot's redemptions left, in JSON and text.
TEST(Inspect, ShowsLiveTicketsAndTheirRedemptionsLeft)
{
	RuntimeDir dir;
	auto owner = make_owner("tick", 2);
	ASSERT_TRUE(owner);
	auto consumer = make_consumer("tick", "redeemer", 2);
	ASSERT_TRUE(consumer);
	auto frame = owner->acquire(1s);
	ASSERT_TRUE(frame.ok());
	uint32_t slot = frame->index();
	auto ticket = owner->publish_ticket(std::move(*frame), 3, 10s);
	ASSERT_TRUE(ticket.ok()) << ticket.error().message;
	auto redeemed = consumer->get(*ticket);
	ASSERT_TRUE(redeemed.ok()) << redeemed.error().message;

	Json pool = inspect_json({ "--json", "tick" });
	EXPECT_EQ(pool["tickets"]["issued"].num(), 1u);
	EXPECT_EQ(pool["tickets"]["redeemed"].num(), 1u);
	EXPECT_EQ(pool["tickets"]["expired"].num(), 0u);
	EXPECT_EQ(pool["tickets"]["live"].num(), 1u);
	bool found = false;
	for (const Json &s : pool["slots"].items) {
		if (s["index"].num() == slot) {
			found = true;
			EXPECT_EQ(s["ticket_left"].num(), 2u);
			EXPECT_EQ(s["holder_bits"].items.size(), 2u)
				<< "the owner's hold for the ticket, and the redeemer's";
		}
	}
	EXPECT_TRUE(found);
	ToolRun run = run_inspect({ "tick" });
	EXPECT_EQ(run.status, 0) << run.err;
	EXPECT_NE(run.out.find("tickets          1 live; 1 issued, 1 redeemed, 0 expired unused"), std::string::npos)
		<< run.out;
	EXPECT_NE(run.out.find("(ticket: 2 redemptions left)"), std::string::npos) << run.out;
}

TEST(Inspect, EscapesStringsWrittenByOtherProcesses)
{
	RuntimeDir dir;
	// Quotes, backslashes, control characters and a byte that is not UTF-8.
	std::string format = "caps \"q\" back\\slash\nline\ttab\x01 bell\x7f end\xff";
	auto owner = make_owner("esc", 2, format, "prod\"uc\\er");
	ASSERT_TRUE(owner);
	auto consumer = make_consumer("esc", "cli\"ent\x1b[2J", 2);
	ASSERT_TRUE(consumer);

	Json pool = inspect_json({ "--json", "esc" });
	EXPECT_EQ(pool["format"].str(), "caps \"q\" back\\slash\nline\ttab\x01 bell\x7f end\xef\xbf\xbd");
	EXPECT_EQ(pool["producer"].str(), "prod\"uc\\er");
	ASSERT_EQ(pool["consumers"].size(), 1u);
	EXPECT_EQ(pool["consumers"][0]["client"].str(), "cli\"ent\x1b[2J");

	// Text output must not hand raw control characters to a terminal either.
	ToolRun run = run_inspect({ "esc" });
	EXPECT_EQ(run.status, 0) << run.err;
	for (char c : run.out)
		EXPECT_TRUE(c == '\n' || uint8_t(c) >= 0x20) << "raw control character " << int(c);
	EXPECT_NE(run.out.find("caps \\\"q\\\" back\\\\slash\\nline\\ttab"), std::string::npos) << run.out;
}

TEST(Inspect, ListsPoolsAndWhetherTheirOwnerIsAlive)
{
	RuntimeDir dir;
	auto owner = make_owner("alive", 3);
	ASSERT_TRUE(owner);
	auto consumer = make_consumer("alive", "c", 2);
	ASSERT_TRUE(consumer);
	ASSERT_TRUE(publish_one(*owner));
	make_dead_socket(dir.pool_dir() + "/dead");
	make_dead_socket(dir.pool_dir() + "/half.42.tmp"); // an owner's socket before its rename
	make_file(dir.pool_dir() + "/dead.lock");
	make_file(dir.pool_dir() + "/plainfile");

	Json list = inspect_json({ "--json" });
	EXPECT_EQ(list["directory"].str(), dir.pool_dir());
	ASSERT_EQ(list["pools"].size(), 2u) << "only sockets, without .lock and .tmp";
	const Json &live = list["pools"][0];
	EXPECT_EQ(live["name"].str(), "alive");
	EXPECT_TRUE(live["live"].flag);
	EXPECT_EQ(live["owner_pid"].num(), uint64_t(::getpid()));
	EXPECT_EQ(live["slots_total"].num(), 3u);
	EXPECT_EQ(live["slot_size"].num(), 4096u);
	EXPECT_EQ(live["consumers"].num(), 1u);
	EXPECT_EQ(live["published"].num(), 1u);
	const Json &dead = list["pools"][1];
	EXPECT_EQ(dead["name"].str(), "dead");
	EXPECT_FALSE(dead["live"].flag);
	EXPECT_NE(dead["error"].str().find("not found"), std::string::npos) << dead["error"].str();

	ToolRun run = run_inspect({});
	EXPECT_EQ(run.status, 0) << run.err;
	EXPECT_NE(run.out.find("\"alive\""), std::string::npos) << run.out;
	EXPECT_NE(run.out.find("live (owner pid " + std::to_string(::getpid()) + "): 3 slots of 4096 bytes"),
		  std::string::npos)
		<< run.out;
	EXPECT_NE(run.out.find("1 consumers, 1 published"), std::string::npos) << run.out;
	EXPECT_NE(run.out.find("\"dead\""), std::string::npos) << run.out;
	EXPECT_NE(run.out.find("no live owner"), std::string::npos) << run.out;
	EXPECT_EQ(run.out.find(".lock"), std::string::npos) << run.out;
	EXPECT_EQ(run.out.find(".tmp"), std::string::npos) << run.out;
	EXPECT_EQ(run.out.find("plainfile"), std::string::npos) << run.out;
}

TEST(Inspect, ListsNothingWithoutPools)
{
	RuntimeDir dir;
	Json list = inspect_json({ "--json" });
	ASSERT_EQ(list["pools"].type, Json::Type::array);
	EXPECT_EQ(list["pools"].size(), 0u);
	ToolRun run = run_inspect({});
	EXPECT_EQ(run.status, 0) << run.err;
	EXPECT_NE(run.out.find("no pools"), std::string::npos) << run.out;
}

TEST(Inspect, ErrorsExitOneWithTheLibraryMessage)
{
	RuntimeDir dir;
	ASSERT_EQ(::mkdir(dir.pool_dir().c_str(), 0700), 0);
	make_file(dir.pool_dir() + "/plainfile");
	make_dead_socket(dir.pool_dir() + "/dead");

	struct Case {
		std::vector<std::string> args;
		std::string message;
	};
	const Case cases[] = {
		{ { "nosuchpool" }, "not found" },	  { { "--json", "nosuchpool" }, "not found" },
		{ { "dead" }, "owner is gone" },	  { { "plainfile" }, "not a socket" },
		{ { "bad name!" }, "illegal character" }, { { std::string(100, 'x') }, "longer than" },
	};
	for (const Case &c : cases) {
		ToolRun run = run_inspect(c.args);
		EXPECT_EQ(run.status, 1) << c.args.back() << ": " << run.err;
		EXPECT_EQ(run.out, "") << c.args.back();
		EXPECT_EQ(run.err.rfind("xmem-inspect: ", 0), 0u) << run.err;
		EXPECT_NE(run.err.find(c.message), std::string::npos) << run.err;
		EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1) << "one line: " << run.err;
	}
}

TEST(Inspect, BadUsageExitsTwoAndHelpExitsZero)
{
	RuntimeDir dir;
	ToolRun run = run_inspect({ "--bogus" });
	EXPECT_EQ(run.status, 2);
	EXPECT_NE(run.err.find("unknown option"), std::string::npos) << run.err;
	EXPECT_NE(run.err.find("usage:"), std::string::npos) << run.err;

	run = run_inspect({ "one", "two" });
	EXPECT_EQ(run.status, 2);
	EXPECT_NE(run.err.find("more than one"), std::string::npos) << run.err;

	run = run_inspect({ "--help" });
	EXPECT_EQ(run.status, 0);
	EXPECT_NE(run.out.find("usage: xmem-inspect"), std::string::npos) << run.out;
	EXPECT_NE(run.out.find("--json"), std::string::npos) << run.out;
	EXPECT_EQ(run.err, "");
}
