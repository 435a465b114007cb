// fuzz.hpp - what the libFuzzer harnesses share: reading structured values from the
// fuzzer's bytes, sealed memfds made from them, and a fake owner that answers a real
// consumer's connect with whatever messages and file descriptors the input says.
#pragma once

#include "rendezvous.hpp"
#include "system.hpp"

#include <xmem/xmem.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>

// Every harness defines these two: the libFuzzer entry point, and the seed inputs it
// makes with the library's own builders (replay.cpp writes them with --write-seeds).
extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
std::vector<std::vector<uint8_t>> fuzz_seeds();

namespace xmem::fuzz {

// A failed property: prints it and aborts, which libFuzzer reports as a crash with
// the input that caused it.
[[noreturn]] inline void fail(const char *what, const std::string &detail = {})
{
	std::fprintf(stderr, "xmem fuzz: property violated: %s %s\n", what, detail.c_str());
	std::abort();
}

#define XMEM_FUZZ_CHECK(cond, detail)                                                                                  \
	do {                                                                                                           \
		if (!(cond))                                                                                           \
			::xmem::fuzz::fail(#cond, (detail));                                                           \
	} while (0)

// Reads little-endian values off the front of the input; past its end, zeros.
class Input
{
public:
	Input(const uint8_t *data, size_t size) : data_(data), size_(size) {}

	size_t left() const { return size_ - pos_; }
	bool empty() const { return pos_ >= size_; }
	template<typename T>
	T take()
	{
		T v{};
		size_t n = std::min(sizeof(T), left());
		std::memcpy(&v, data_ + pos_, n);
		pos_ += n;
		return v;
	}
	std::span<const uint8_t> bytes(size_t n)
	{
		n = std::min(n, left());
		std::span<const uint8_t> s(data_ + pos_, n);
		pos_ += n;
		return s;
	}
	std::span<const uint8_t> rest() { return bytes(left()); }

private:
	const uint8_t *data_;
	size_t size_;
	size_t pos_ = 0;
};

// Writes values in the order Input reads them (for the seed generators).
class Output
{
public:
	template<typename T>
	Output &put(T v)
	{
		const auto *p = reinterpret_cast<const uint8_t *>(&v);
		bytes_.insert(bytes_.end(), p, p + sizeof(T));
		return *this;
	}
	Output &put_bytes(std::span<const std::byte> b)
	{
		const auto *p = reinterpret_cast<const uint8_t *>(b.data());
		bytes_.insert(bytes_.end(), p, p + b.size());
		return *this;
	}
	std::vector<uint8_t> take() { return std::move(bytes_); }

private:
	std::vector<uint8_t> bytes_;
};

inline std::span<const std::byte> as_bytes(std::span<const uint8_t> s)
{
	return { reinterpret_cast<const std::byte *>(s.data()), s.size() };
}

// A memfd of SIZE bytes starting with CONTENT (zeros after it), sealed as an owner
// seals its segments, so a consumer's checks of it pass or fail on the bytes alone.
inline UniqueFd sealed_memfd(std::span<const uint8_t> content, uint64_t size)
{
	UniqueFd fd(::memfd_create("xmem-fuzz", MFD_CLOEXEC | MFD_ALLOW_SEALING));
	if (!fd.valid() || ::ftruncate(fd.get(), off_t(size)) < 0)
		fail("memfd_create/ftruncate", std::strerror(errno));
	size_t n = size_t(std::min<uint64_t>(content.size(), size));
	for (size_t done = 0; done < n;) {
		ssize_t w = ::pwrite(fd.get(), content.data() + done, n - done, off_t(done));
		if (w <= 0)
			fail("pwrite to memfd", std::strerror(errno));
		done += size_t(w);
	}
	if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0)
		fail("sealing memfd", std::strerror(errno));
	return fd;
}

// A control segment image as the harnesses encode it: the mapping's size, then its
// first bytes (the rest is zeros), so a seed need not hold a segment's zero tail.
struct SegmentImage {
	uint32_t size = 0;
	std::span<const uint8_t> prefix;

	static constexpr uint32_t kMaxSize = 1u << 20;

	static SegmentImage read(Input &in)
	{
		SegmentImage img;
		img.size = in.take<uint32_t>() % (kMaxSize + 1);
		img.prefix = in.bytes(std::min<uint32_t>(in.take<uint32_t>(), img.size));
		return img;
	}
	// BYTES without their trailing zeros.
	static void write(Output &out, std::span<const std::byte> bytes)
	{
		size_t n = bytes.size();
		while (n > 0 && bytes[n - 1] == std::byte{ 0 })
			n--;
		out.put(uint32_t(bytes.size())).put(uint32_t(n)).put_bytes(bytes.first(n));
	}
};

// A private directory for sockets, removed with everything in it at exit.
inline const std::string &scratch_dir()
{
	static const std::string dir = [] {
		char tmpl[] = "/tmp/xmem-fuzz-XXXXXX";
		if (!::mkdtemp(tmpl))
			fail("mkdtemp", std::strerror(errno));
		std::string d = tmpl;
		static std::string to_remove = d;
		std::atexit([] { std::filesystem::remove_all(to_remove); });
		return d;
	}();
	return dir;
}

// One message the fake owner sends: bytes and file descriptors (borrowed).
struct Message {
	std::vector<std::byte> bytes;
	std::vector<int> fds;
};

// A listening socket where a real consumer (BufferPool::open) connects, and a thread
// per connection that plays the owner's side of the handshake from a script: receive
// the Hello, send MESSAGES, then hang up at once or keep the connection until done().
class FakeOwner
{
public:
	explicit FakeOwner(const std::string &name) : path_(scratch_dir() + "/" + name)
	{
		listener_ = UniqueFd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
		sockaddr_un addr{};
		addr.sun_family = AF_UNIX;
		std::strncpy(addr.sun_path, path_.c_str(), sizeof(addr.sun_path) - 1);
		::unlink(path_.c_str());
		if (!listener_.valid() ||
		    ::bind(listener_.get(), reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) < 0 ||
		    ::listen(listener_.get(), 16) < 0)
			fail("fake owner socket", std::strerror(errno));
	}
	~FakeOwner() { done(); }

	// The socket path: a name with '/', as BufferPool::open takes it.
	const std::string &path() const { return path_; }

	// Serves the next connection in a thread; the caller then connects (open()).
	void serve(std::vector<Message> messages, bool hang_up)
	{
		done();
		hello_.clear();
		thread_ = std::thread([this, messages = std::move(messages), hang_up] {
			pollfd p{ listener_.get(), POLLIN, 0 };
			if (::poll(&p, 1, 30000) != 1)
				fail("fake owner: nobody connected");
			UniqueFd conn(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
			if (!conn.valid())
				fail("fake owner: accept", std::strerror(errno));
			auto hello = rendezvous::receive_message(conn.get(), monotonic_ns() + 30'000'000'000ull,
								 "fake owner", protocol::kMaxFds);
			if (hello)
				hello_ = std::move(hello->data);
			// Never blocks: a consumer that stopped reading leaves the rest unsent.
			::fcntl(conn.get(), F_SETFL, ::fcntl(conn.get(), F_GETFL) | O_NONBLOCK);
			for (const Message &m : messages) {
				auto sent = rendezvous::send_message(conn.get(), m.bytes.data(), m.bytes.size(),
								     m.fds.data(),
								     std::min(m.fds.size(), protocol::kMaxFds));
				if (!sent)
					break;
			}
			if (!hang_up)
				conn_ = std::move(conn);
		});
	}

	// Waits for the script to be sent (it is, once open() returned), then hangs up.
	void done()
	{
		if (thread_.joinable())
			thread_.join();
		conn_.reset();
	}
	// Joins the thread but keeps the connection (the consumer's owner stays alive).
	void sent()
	{
		if (thread_.joinable())
			thread_.join();
	}
	const std::vector<std::byte> &hello() const { return hello_; }

private:
	std::string path_;
	UniqueFd listener_;
	std::thread thread_;
	UniqueFd conn_;
	std::vector<std::byte> hello_;
};

} // namespace xmem::fuzz

namespace xmem::fuzz {

// Control segments as real pools leave them, for seeds: an owner and a consumer in
// this process, frames published, some of them received and still held.
struct PoolImage {
	uint32_t slot_count;
	uint32_t max_consumers;
	uint32_t queued; // frames queued for consumer 0
	std::vector<std::byte> bytes;
};

inline std::vector<PoolImage> real_pool_images()
{
	using namespace std::chrono_literals;
	struct Shape {
		uint32_t slots, consumers, published, received;
		Policy policy;
		bool eos;
	};
	const Shape shapes[] = {
		{ 1, 1, 1, 0, Policy::drop_oldest, false }, { 4, 2, 3, 1, Policy::drop_oldest, false },
		{ 3, 1, 5, 0, Policy::drop_oldest, true },  { 4, 3, 6, 2, Policy::drop_new, false },
		{ 2, 1, 0, 0, Policy::block, true },
	};
	std::vector<PoolImage> images;
	int n = 0;
	for (const Shape &s : shapes) {
		std::string name = scratch_dir() + "/seed" + std::to_string(n++);
		PoolConfig config;
		config.slot_count = s.slots;
		config.max_consumers = s.consumers;
		config.slot_size = 64 * 48;
		config.policy = s.policy;
		config.block_timeout = 10ms;
		config.format = "video/x-raw, format=(string)NV12, width=(int)64, height=(int)32";
		config.producer = "seed";
		auto owner = BufferPool::create(name, config);
		if (!owner)
			fail("seed pool", owner.error().message);
		OpenOptions options;
		options.queue_size = s.slots;
		options.client = "seed-consumer";
		auto consumer = BufferPool::open(name, options);
		if (!consumer)
			fail("seed consumer", consumer.error().message);
		std::vector<BufferGuard> held;
		for (uint32_t f = 0; f < s.published; f++) {
			auto frame = owner.value()->acquire(10ms);
			if (!frame)
				break;
			FrameMeta *meta = frame->meta_mut().value();
			meta->seq = f;
			meta->pts = int64_t(f) * 33'333'333;
			if (!set_video_layout(*meta, "NV12", 64, 32, 1))
				fail("seed layout");
			std::memset(frame->data_mut()->data(), int(f), size_t(meta->size));
			// Side data on odd frames, so the seeds hold records with and without it.
			std::vector<std::byte> side(f % 2 ? 13 * f : 0, std::byte(0x40 + f));
			if (!frame->set_side_data(side))
				fail("seed side data");
			if (!owner.value()->publish(std::move(frame.value())))
				fail("seed publish");
		}
		if (s.eos && !owner.value()->end_of_stream())
			fail("seed end of stream");
		for (uint32_t r = 0; r < s.received; r++) {
			auto got = consumer.value()->receive(1s);
			if (got)
				held.push_back(std::move(got.value()));
		}
		auto seg = consumer.value()->control_segment();
		PoolImage img{ s.slots, s.consumers, 0, { seg.begin(), seg.end() } };
		auto stats = owner.value()->stats();
		img.queued = uint32_t(stats.published) - s.received;
		images.push_back(std::move(img));
	}
	return images;
}

} // namespace xmem::fuzz

namespace xmem::fuzz {

// An inaccessible page right after a mapping the library made, where one is free, so
// a read past its end faults at once instead of landing in a neighbouring mapping
// (AddressSanitizer does not watch mmap()ed memory).
class GuardPage
{
public:
	explicit GuardPage(std::span<const std::byte> mapping)
	{
		if (mapping.empty())
			return;
		uintptr_t end = reinterpret_cast<uintptr_t>(mapping.data()) + mapping.size();
		uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
		end = (end + page - 1) / page * page;
		void *p = ::mmap(reinterpret_cast<void *>(end), page, PROT_NONE,
				 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
		if (p == MAP_FAILED)
			return;
		if (p != reinterpret_cast<void *>(end)) { // a kernel without MAP_FIXED_NOREPLACE
			::munmap(p, page);
			return;
		}
		addr_ = p;
		size_ = page;
	}
	~GuardPage()
	{
		if (addr_)
			::munmap(addr_, size_);
	}
	GuardPage(const GuardPage &) = delete;
	GuardPage &operator=(const GuardPage &) = delete;

private:
	void *addr_ = nullptr;
	size_t size_ = 0;
};

} // namespace xmem::fuzz
