// pool_impl.hpp - the state behind a BufferPool handle: mappings, this process's
// references, and for the owner the thread that attaches and reaps consumers.
#pragma once

#include "layout.hpp"
#include "rendezvous.hpp"
#include "system.hpp"

#include <xmem/xmem.hpp>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace xmem {

struct PoolImpl : std::enable_shared_from_this<PoolImpl> {
	~PoolImpl();

	Role role = Role::consumer;
	std::string name;
	std::string path;

	UniqueFd control_fd;
	UniqueFd data_fd;
	Mapping control;
	Mapping data;
	layout::ControlHeader *header = nullptr;

	// Copies of the validated header constants: never re-read from shared memory,
	// which another process can scribble on.
	uint32_t slot_count = 0;
	uint32_t max_consumers = 0;
	uint32_t ring_capacity = 0;
	uint32_t consumer_record_size = 0;
	uint64_t slot_size = 0;
	uint64_t slot_stride = 0;
	layout::SlotRecord *slots = nullptr;
	std::byte *consumers_base = nullptr;

	// Holder bit of this process: 0 for the owner, 1 + index for a consumer.
	uint32_t holder_bit = layout::kOwnerBit;

	// This process's references per slot. The 0 <-> 1 transitions set and clear the
	// holder bit, so they are serialised here. Lock order: receive_lock or
	// publish_lock, then refs_lock; never held while waiting (a futex wake of the
	// owner may happen under it).
	mutable std::mutex refs_lock;
	std::vector<uint32_t> local_refs;

	// Format: the owner's current one, or the newest a consumer has seen.
	mutable std::mutex format_lock;
	uint64_t format_seq = 0;
	std::shared_ptr<const std::string> format;

	// Consumer.
	uint32_t consumer_index = 0;
	layout::ConsumerRecord *self = nullptr;
	UniqueFd sock;
	UniqueFd event;
	UniqueFd epoll; // event + sock, the pollable fd handed to applications
	// Eventfd bookkeeping of receive(): armed since the last drain; a drain found
	// the owner between clearing `armed` and writing the eventfd.
	std::atomic<bool> armed_once{ false };
	std::atomic<bool> drain_pending{ false };
	std::atomic<bool> owner_gone{ false };
	std::mutex receive_lock;

	// Owner.
	rendezvous::OwnerSocket owner_socket;
	std::thread io_thread;
	UniqueFd io_epoll;
	UniqueFd io_stop;
	std::atomic<bool> shut{ false };
	// Guards the consumer set (active, connections, eventfds) against publish and
	// the drop/EOS paths. Held during a block-policy wait, which is bounded by
	// block_timeout and cut short when the awaited consumer dies.
	std::mutex publish_lock;
	std::vector<uint32_t> active;
	std::vector<UniqueFd> consumer_conn;
	std::vector<UniqueFd> consumer_event;
	struct Pending {
		UniqueFd conn;
		uint64_t deadline_ns;
	};
	std::map<int, Pending> pending; // I/O thread only
	std::atomic<uint32_t> acquire_cursor{ 0 };
	// Configuration as the owner created it; the shared header copy is for peers.
	Policy config_policy = Policy::drop_oldest;
	uint64_t config_block_timeout_ns = 0;
	uint32_t config_mode = 0600;
	char config_producer[XMEM_PRODUCER_MAX] = {};
	std::vector<uint32_t> consumer_queue_size; // under publish_lock
	uint64_t published_count = 0; // under publish_lock
	uint32_t owner_pid = 0; // getpid() at create, not a syscall per frame

	layout::ConsumerRecord *consumer(uint32_t i) const
	{
		return reinterpret_cast<layout::ConsumerRecord *>(consumers_base +
								  uint64_t{ i } * consumer_record_size);
	}
	std::byte *slot_data(uint32_t i) const { return data.data() + uint64_t{ i } * slot_stride; }
	std::string where() const { return "pool '" + name + "'"; }

	// References (all roles).
	Result<BufferGuard> get(uint32_t index, bool writable);
	Result<void> add_ref(uint32_t index);
	Result<void> release(uint32_t index);
	Result<void> set_ref_count(uint32_t index, uint32_t count);
	BufferGuard make_guard(uint32_t index, bool writable);
	bool take_exclusive(uint32_t index); // refs_lock held
	void clear_holder_bit(uint32_t index, uint32_t bit);
	void notify_owner();

	// Owner.
	Result<void> create_segments(const PoolConfig &config);
	Result<BufferGuard> acquire(int64_t timeout_ns);
	Result<void> publish(BufferGuard &&frame);
	Result<void> end_of_stream();
	Result<void> set_format(std::string_view format);
	bool try_reclaim(uint32_t index, layout::SlotState to);
	bool drop_oldest(uint32_t consumer_index);
	bool drop_globally_oldest();
	void push(uint32_t consumer_index, uint64_t entry);
	void wait_progress(uint32_t seen, uint64_t deadline_ns);
	void shutdown();
	void io_loop();
	void accept_peers();
	void handle_hello(int fd);
	void reap(uint32_t consumer_index);

	// Consumer.
	Result<void> attach(const OpenOptions &options, uint64_t deadline_ns);
	Result<BufferGuard> receive(int64_t timeout_ns);
	void detach_queue();
	std::shared_ptr<const std::string> format_of(const layout::SlotRecord &slot);
};

} // namespace xmem
