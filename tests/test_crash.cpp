// test_crash.cpp - SIGKILL at random moments: consumers killed hundreds of times
// while frames flow, and producers killed under a reconnecting consumer.
#include "common.hpp"
#include "frames.hpp"

#include <atomic>
#include <cstdio>
#include <random>
#include <set>

using namespace std::chrono_literals;
using xmem::test::eventually;
using xmem::test::Process;
using xmem::test::RuntimeDir;

namespace {

std::string peer()
{
	return xmem::test::peer_path();
}

int kills_wanted()
{
	const char *e = std::getenv("XMEM_CRASH_KILLS");
	return e ? std::atoi(e) : 250;
}

std::string run(const std::string &cmd)
{
	std::string out;
	if (FILE *p = ::popen(cmd.c_str(), "r")) {
		char buf[4096];
		size_t n;
		while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0)
			out.append(buf, n);
		::pclose(p);
	}
	return out;
}

long long json_number(const std::string &json, const std::string &key)
{
	size_t at = json.find("\"" + key + "\"");
	if (at == std::string::npos)
		return -1;
	at = json.find(':', at);
	return at == std::string::npos ? -1 : std::atoll(json.c_str() + at + 1);
}

} // namespace

// The crash test: consumers are SIGKILLed at random moments (during attach,
// while receiving, while holding frames) over thousands of frames. Every slot must
// come back, and long-lived verifying consumers must never see a frame change under
// them — which is what a reference released twice, or a slot reused while still
// held, would cause.
TEST(Crash, ConsumersKilledAtRandomMoments)
{
	RuntimeDir dir;
	constexpr uint32_t kSlots = 16;
	xmem::PoolConfig config;
	config.slot_count = kSlots;
	config.slot_size = 8192;
	config.policy = xmem::Policy::drop_oldest;
	auto created = xmem::BufferPool::create("crash", config);
	ASSERT_TRUE(created.ok()) << created.error().message;
	auto owner = created.value();

	std::atomic<bool> stop{ false };
	std::atomic<uint64_t> acquire_failures{ 0 };
	std::thread producer([&] {
		while (!stop.load()) {
			auto r = xmem::test::publish_test_frame(*owner, 2s);
			if (!r) {
				ASSERT_EQ(r.code(), xmem::Errc::timed_out) << r.error().message;
				acquire_failures++;
				continue;
			}
			std::this_thread::sleep_for(200us);
		}
	});

	// Two survivors verify every frame they hold, the whole time.
	Process survivor1({ peer(), "consume", "crash", "--hold", "3", "--timeout-ms", "30000" });
	Process survivor2({ peer(), "consume", "crash", "--hold", "1", "--work-us", "500", "--queue", "2",
			    "--timeout-ms", "30000" });

	std::mt19937 rng(12345);
	const int kills = kills_wanted();
	int killed = 0, killed_attached = 0;
	std::vector<Process> victims(4);
	while (killed < kills) {
		for (auto &v : victims) {
			if (!v.running()) {
				std::uniform_int_distribution<int> hold(0, 6);
				v.start({ peer(), "consume", "crash", "--hold", std::to_string(hold(rng)), "--frames",
					  "1000000000", "--timeout-ms", "30000" });
			}
		}
		std::uniform_int_distribution<size_t> pick(0, victims.size() - 1);
		std::uniform_int_distribution<int> delay_us(0, 15000);
		std::this_thread::sleep_for(std::chrono::microseconds(delay_us(rng)));
		Process &v = victims[pick(rng)];
		// Half the kills wait until the victim has attached, so a slow machine (a
		// sanitizer build on two busy cores) still kills plenty of attached
		// consumers in every phase: receiving, holding, releasing.
		if (rng() % 2 == 0 && v.wait_output("attached", 5s)) {
			std::uniform_int_distribution<int> after_us(0, 3000);
			std::this_thread::sleep_for(std::chrono::microseconds(after_us(rng)));
		}
		v.kill_wait();
		if (v.output().find("attached") != std::string::npos)
			killed_attached++;
		killed++;
	}
	// The last victims die too: they count like the others.
	for (auto &v : victims) {
		if (!v.running())
			continue; // killed at the end of the loop, counted there
		v.kill_wait();
		if (v.output().find("attached") != std::string::npos)
			killed_attached++;
		killed++;
	}
	uint64_t published = owner->stats().published;
	std::printf("killed %d consumers (%d surely attached) over %llu frames\n", killed, killed_attached,
		    (unsigned long long)published);
	EXPECT_GT(published, 1000u) << "the producer must keep going while consumers die";

	// Survivors: end them with EOS, and they must have seen nothing corrupt.
	stop.store(true);
	producer.join();
	ASSERT_TRUE(owner->end_of_stream().ok());
	EXPECT_EQ(survivor1.wait(60s), 0) << survivor1.output();
	EXPECT_EQ(survivor2.wait(60s), 0) << survivor2.output();
	EXPECT_EQ(survivor1.field("corrupt"), 0);
	EXPECT_EQ(survivor2.field("corrupt"), 0);
	EXPECT_EQ(survivor1.field("eos"), 1);
	EXPECT_GT(survivor1.field("received"), 100);

	// Every consumer is reaped and every slot is free again.
	ASSERT_TRUE(eventually(
		[&] {
			auto s = owner->stats();
			return s.consumers == 0 && s.slots_free == kSlots;
		},
		20s))
		<< "free " << owner->stats().slots_free << " consumers " << owner->stats().consumers;
	// Some victims died before they attached; those that said so must be reaped.
	EXPECT_GE(owner->stats().reaped, uint64_t(killed_attached) + 2);
	EXPECT_LE(owner->stats().reaped, uint64_t(killed) + 2);
	EXPECT_GT(killed_attached, kills / 4) << "too few kills hit attached consumers";

	// xmem-inspect agrees, from another process.
	const char *inspect = std::getenv("XMEM_INSPECT");
	ASSERT_TRUE(inspect && ::access(inspect, X_OK) == 0) << "XMEM_INSPECT must name the built xmem-inspect";
	std::string json = run(std::string(inspect) + " crash --json");
	EXPECT_EQ(json_number(json, "slots_total"), kSlots) << json;
	EXPECT_EQ(json_number(json, "slots_free"), kSlots) << json;

	// No slot leaked and none is handed out twice: all of them at once, distinct.
	std::vector<xmem::BufferGuard> all;
	std::set<uint32_t> seen;
	for (uint32_t i = 0; i < kSlots; i++) {
		auto g = owner->acquire(100ms);
		ASSERT_TRUE(g.ok()) << g.error().message;
		EXPECT_TRUE(seen.insert(g->index()).second) << "slot " << g->index() << " handed out twice";
		all.push_back(std::move(g.value()));
	}
	EXPECT_FALSE(owner->acquire(0ms).ok());
}

// Producer deaths at random moments under a consumer that reconnects each time and
// verifies every frame it holds, including across the death.
TEST(Crash, ProducerKilledAtRandomMoments)
{
	RuntimeDir dir;
	Process consumer({ peer(), "consume", "owner-crash", "--hold", "2", "--reconnect", "--timeout-ms", "20000",
			   "--open-timeout-ms", "20000" });
	std::mt19937 rng(777);
	const int rounds = 20;
	for (int r = 0; r < rounds; r++) {
		Process producer({ peer(), "produce", "owner-crash", "--frames", "100000000", "--fps", "2000",
				   "--wait-consumers", "1", "--no-eos" });
		ASSERT_TRUE(producer.wait_output("ready", 20s)) << "round " << r << ": " << consumer.output();
		// The consumer attached to this producer before it dies (under a sanitizer on a
		// loaded machine it once had not, and saw one death fewer).
		auto attaches = [&] {
			std::string out = consumer.output();
			int n = 0;
			for (size_t at = out.find("attached"); at != std::string::npos;
			     at = out.find("attached", at + 1))
				n++;
			return n;
		};
		ASSERT_TRUE(eventually([&] { return attaches() > r; }, 20s))
			<< "round " << r << ": " << consumer.output();
		std::uniform_int_distribution<int> delay_us(0, 30000);
		std::this_thread::sleep_for(std::chrono::microseconds(delay_us(rng)));
		producer.kill_wait();
	}
	Process last(
		{ peer(), "produce", "owner-crash", "--frames", "20", "--wait-consumers", "1", "--linger-ms", "200" });
	EXPECT_EQ(last.wait(30s), 0) << last.output();
	EXPECT_EQ(consumer.wait(30s), 0) << consumer.output();
	EXPECT_EQ(consumer.field("corrupt"), 0) << consumer.output();
	EXPECT_EQ(consumer.field("reconnects"), rounds) << consumer.output();
	EXPECT_EQ(consumer.field("eos"), 1);
	EXPECT_TRUE(eventually([&] { return dir.entries().empty(); })) << "socket or lock file left behind";
}
