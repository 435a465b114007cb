// protocol.hpp - the rendezvous protocol spoken once per attach over the pool's
// SOCK_SEQPACKET unix socket. After it, frames move through shared memory only.
//
//   consumer                                   owner (I/O thread)
//   --------                                   ------------------
//   connect($dir/NAME)  ---------------------> accept, SO_PEERCRED check
//   Hello{role, queue_size, pid, pid ns,
//         policy, max_held, history}
//     + [eventfd, pidfd] --------------------> validate, take a ConsumerRecord
//            <--------------------------------- Welcome{index, sizes, format}
//                                               + [control memfd, data memfd]
//                                               + [arena fds...] (one per CUDA slot)
//            <--------------------------------- ArenaFds header + [fds...] while
//                                               more than kMaxFds fds are due
//            (or Reject{code, message}, then close)
//   a size class added later, first met:
//   connect, Hello{role classes, class_index} -> Welcome + [the class's arena fds...]
//   ... frames: rings and holder bits in the control segment, eventfd wakeups ...
//   exit / crash: socket hang-up ------------> reap: clear the consumer's holder bits
//
//   a producer besides the owner (an attached consumer that acquires), on a connection
//   of its own:
//   connect, Hello{role producer, consumer_index = its consumer record} + [pidfd]
//            <--------------------------------- Welcome (no fds)
//   Request{lease, size, memory}  -----------> the owner acquires for it: its slot is
//            <--------------------------------- Answer{slot} (or the error's code)
//   ... writes the slot through its own mapping ...
//   Request{publish, slot, meta, side data} -> the owner publishes it (or makes a ticket)
//            <--------------------------------- Answer{seq, ticket check}
//   Request{give_back, slot}  ----------------> the slot goes back unpublished: Answer
//   exit / crash: hang-up --------------------> its leased slots go back (device slots
//                                               once its process has exited)
#pragma once

#include <xmem/xmem.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace xmem::protocol {

inline constexpr uint32_t kWireMagic = 0x584d4d50; // "PMMX"
inline constexpr uint16_t kVersion = 2; // 2: a Hello asks for its policy

enum class MessageType : uint16_t {
	hello = 1,
	welcome = 2,
	reject = 3,
	arena_fds = 4, // a bare header carrying more arena fds than fit with the Welcome
	request = 5, // a producer besides the owner asks (PeerRole::producer)
	answer = 6, // the owner's answer to a Request
};

enum class PeerRole : uint32_t {
	consumer = 1,
	inspector = 2,
	// An attached consumer asking for the memory of a size class the owner added after
	// its attach (Hello::class_index), on a connection of its own: the owner answers
	// with a Welcome (consumer index kNoConsumer, the class's data size) carrying the
	// class's arena fds and no control memfd, continued in ArenaFds, then hangs up.
	classes = 3,
	// An attached consumer that produces too (docs/design.md, "Producers besides the
	// owner"), on a connection of its own: Hello::consumer_index is its consumer record (the
	// frames it publishes are not queued for itself), its fds at most a pidfd of itself.
	// The owner answers with a bare Welcome, then serves Requests until it hangs up.
	producer = 4,
	// An attached consumer asking for the memory of a dynamic class's device slot
	// (Hello::slot_index), on a connection of its own: the owner answers with a Welcome
	// (consumer index kNoConsumer, data_size the slot's stride, memory_gen the memory's
	// generation) carrying the slot's one fd, or a Reject, then hangs up.
	slot = 5,
};

struct MessageHeader {
	uint32_t magic;
	uint16_t version;
	MessageType type;
	uint32_t size; // whole message, header included
	uint32_t reserved;
};

struct Hello {
	MessageHeader header;
	PeerRole role;
	uint32_t queue_size;
	char client[32];
	// The sender as it sees itself: getpid() and its PID namespace (the inode of
	// /proc/self/ns/pid, 0 when unknown). The owner's SO_PEERCRED pid is 0 for a peer in a
	// PID namespace it cannot see; these say who the peer is to whoever shares its
	// namespace. Informative only: nothing is decided by them. Absent (a 56-byte Hello)
	// from consumers older than the fields.
	uint32_t pid;
	// What the Hello is about, by role (the same four bytes): the size class asked for
	// (classes), the dynamic device slot (slot), the sender's own consumer record
	// (producer); 0 for a consumer or an inspector.
	union {
		uint32_t class_index;
		uint32_t slot_index;
		uint32_t consumer_index;
	};
	uint64_t pid_ns;
	// How the consumer asks to be served (Serve): 0 the pool's policy, else 1 + an
	// xmem_policy; the fallback of fifo and fifo-spill (an xmem_policy, 0: drop-oldest);
	// fifo's wait in ns (0: the pool's). Zero in a shorter Hello.
	uint32_t policy;
	uint32_t fallback;
	uint64_t block_timeout_ns;
	// The most slots it holds at once (0: the owner's default), and the frames published
	// before it attached it asks for first (OpenOptions::max_held, history). Zero in a
	// shorter Hello.
	uint32_t max_held;
	uint32_t history;
	// fds: a consumer sends its eventfd, then, where it could make one, a pidfd of
	// itself (which tells the owner when it has exited, in any PID namespace); an
	// inspector sends none.
};

struct Welcome {
	MessageHeader header;
	uint32_t consumer_index; // UINT32_MAX for an inspector
	uint32_t reserved;
	uint64_t control_size;
	uint64_t data_size;
	// By role (the same eight bytes): the format's sequence number (a consumer's or an
	// inspector's Welcome); the generation of the slot's memory (PeerRole::slot).
	union {
		uint64_t format_seq;
		uint64_t memory_gen;
	};
	char format[XMEM_FORMAT_MAX];
	// fds: the control memfd, then the arena's fds (the count follows from the
	// control segment's storage type), continued in ArenaFds messages.
};

struct Reject {
	MessageHeader header;
	int32_t code; // xmem_status
	char message[256];
};

// What a producer besides the owner asks for (Request::op).
enum class RequestOp : uint32_t {
	// A free slot of SIZE bytes or more of MEMORY (STORAGE; DEVICE, the owner's ordinal),
	// taken as the owner's acquire() takes one, without waiting: Errc::timed_out when
	// none is free now. The slot is the producer's to write until it publishes it or
	// gives it back.
	lease = 1,
	// Publishes leased SLOT with META and SIDE_DATA: to the queues (REDEMPTIONS 0) or
	// as a ticket of REDEMPTIONS within TTL_NS. Its writes are complete (a device
	// slot's: the producer synchronized its stream before asking).
	publish = 2,
	// Leased SLOT goes back unpublished.
	give_back = 3,
};

struct Request {
	MessageHeader header;
	RequestOp op;
	uint32_t slot;
	uint64_t size;
	uint32_t storage; // xmem_storage
	uint32_t device;
	uint32_t redemptions;
	uint32_t side_data_size;
	int64_t ttl_ns;
	xmem_frame_meta meta;
	std::byte side_data[XMEM_SIDE_DATA_MAX];
};

struct Answer {
	MessageHeader header;
	int32_t code; // 0, or the xmem_status of the error
	uint32_t slot; // lease: the slot
	uint64_t seq; // publish: the frame's sequence number
	uint64_t check; // publish as a ticket: the ticket's check word
	char message[256]; // the error's
};

inline constexpr uint32_t kNoConsumer = 0xffffffffu;
// File descriptors in one message: the kernel's SCM_MAX_FD.
inline constexpr size_t kMaxFds = 253;
inline constexpr size_t kMaxMessage = std::max(sizeof(Welcome), sizeof(Request));
static_assert(sizeof(MessageHeader) == 16);
static_assert(sizeof(Hello) == 96);
// The role-named fields share their bytes: the wire format is what it was before them.
static_assert(offsetof(Hello, class_index) == 60 && offsetof(Hello, slot_index) == 60 &&
	      offsetof(Hello, consumer_index) == 60);
static_assert(offsetof(Welcome, format_seq) == 40 && offsetof(Welcome, memory_gen) == 40);
inline constexpr size_t kHelloV1Size = 56; // a Hello without pid and pid_ns
inline constexpr size_t kHelloPidSize = 72; // a Hello without the policy
inline constexpr size_t kHelloServeSize = 88; // a Hello without max_held and history
static_assert(sizeof(Reject) == 276);
static_assert(sizeof(Request) == 4536);
static_assert(sizeof(Answer) == 296);

inline MessageHeader make_header(MessageType type, uint32_t size)
{
	return MessageHeader{ kWireMagic, kVersion, type, size, 0 };
}

// One builder and one parser per message. A parser checks everything another process
// controls (magic, version, type, sizes) and says what is wrong in an Error whose code
// is the xmem_status to report: an owner sends it back in a Reject.
// A Hello from this process: its pid and PID namespace filled in.
// What a consumer asks of the owner's policy, as a Hello carries it.
struct Serve {
	std::optional<Policy> policy; // none: the pool's
	Policy fallback = Policy::drop_oldest;
	uint64_t block_timeout_ns = 0; // 0: the pool's
	uint32_t max_held = 0; // 0: the owner's default
	uint32_t history = 0;
};
Hello make_hello(PeerRole role, uint32_t queue_size, std::string_view client, const Serve &serve = {});
// A parsed Hello's request; Errc::invalid_argument for values no policy has.
Result<Serve> serve_of(const Hello &hello);
Result<Hello> parse_hello(std::span<const std::byte> bytes);

Welcome make_welcome(uint32_t consumer_index, uint64_t control_size, uint64_t data_size, uint64_t format_seq,
		     std::string_view format);
Reject make_reject(xmem_status code, std::string_view message);
Request make_request(RequestOp op);
// A Request as the owner reads it: magic, version, type, size and op checked; the
// side data's size within its array, META's strings terminated.
Result<Request> parse_request(std::span<const std::byte> bytes);
Answer make_answer(const Error *error);
// The owner's Answer, or its error's code and message as an Error (WHERE names the pool).
Result<Answer> parse_answer(std::span<const std::byte> bytes, const std::string &where);
// A consumer's view of the owner's answer: the Welcome, or the Reject's code and
// message as an Error. WHERE names the pool.
Result<Welcome> parse_reply(std::span<const std::byte> bytes, const std::string &where);

} // namespace xmem::protocol
