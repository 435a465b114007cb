// protocol.cpp - building and parsing the rendezvous messages, with every check on
// what the peer sent in one place.
#include "protocol.hpp"
#include "system.hpp"

#include <xmem/snapshot.hpp>

#include <algorithm>
#include <cstring>

#include <unistd.h>

namespace xmem::protocol {

namespace {

Error refusal(xmem_status code, std::string message)
{
	return Error{ Errc(code), std::move(message) };
}

} // namespace

Hello make_hello(PeerRole role, uint32_t queue_size, std::string_view client, const Serve &serve)
{
	Hello h{};
	h.header = make_header(MessageType::hello, sizeof(h));
	h.role = role;
	h.queue_size = queue_size;
	h.policy = serve.policy ? 1 + uint32_t(*serve.policy) : 0;
	h.fallback = uint32_t(serve.fallback);
	h.block_timeout_ns = serve.block_timeout_ns;
	h.max_held = serve.max_held;
	h.history = serve.history;
	copy_string(h.client, sizeof(h.client), client);
	h.pid = uint32_t(::getpid());
	h.pid_ns = pid_namespace_here();
	return h;
}

Result<Hello> parse_hello(std::span<const std::byte> bytes)
{
	if (bytes.size() < sizeof(MessageHeader))
		return refusal(XMEM_ENOTPOOL, "message too short for an xmem hello");
	MessageHeader mh;
	std::memcpy(&mh, bytes.data(), sizeof(mh));
	if (mh.magic != kWireMagic)
		return refusal(XMEM_ENOTPOOL, "not an xmem hello (bad magic)");
	if (mh.version != kVersion)
		return refusal(XMEM_EVERSION, "protocol version " + std::to_string(mh.version) +
						      " is not supported (owner speaks " + std::to_string(kVersion) +
						      ")");
	if (mh.type != MessageType::hello ||
	    (bytes.size() != sizeof(Hello) && bytes.size() != kHelloServeSize && bytes.size() != kHelloPidSize &&
	     bytes.size() != kHelloV1Size) ||
	    mh.size != bytes.size())
		return refusal(XMEM_ENOTPOOL, "malformed hello");
	Hello hello{};
	std::memcpy(&hello, bytes.data(), bytes.size());
	hello.client[sizeof(hello.client) - 1] = '\0';
	if (hello.role != PeerRole::consumer && hello.role != PeerRole::inspector && hello.role != PeerRole::classes &&
	    hello.role != PeerRole::producer && hello.role != PeerRole::slot)
		return refusal(XMEM_ENOTPOOL, "unknown peer role");
	return hello;
}

Result<Serve> serve_of(const Hello &hello)
{
	Serve serve;
	// The policies are those names.cpp names: a new one needs no change here.
	if (hello.policy != 0 && !policy_name(Policy(hello.policy - 1)))
		return refusal(XMEM_EINVAL, "unknown policy " + std::to_string(hello.policy - 1));
	if (hello.policy)
		serve.policy = Policy(hello.policy - 1);
	if (hello.fallback != uint32_t(Policy::drop_oldest) && hello.fallback != uint32_t(Policy::drop_new) &&
	    hello.fallback != 0)
		return refusal(XMEM_EINVAL,
			       "fallback " + std::to_string(hello.fallback) + " is neither drop-oldest nor drop-new");
	serve.fallback = hello.fallback == uint32_t(Policy::drop_new) ? Policy::drop_new : Policy::drop_oldest;
	serve.block_timeout_ns = hello.block_timeout_ns;
	serve.max_held = hello.max_held;
	serve.history = hello.history;
	return serve;
}

Welcome make_welcome(uint32_t consumer_index, uint64_t control_size, uint64_t data_size, uint64_t format_seq,
		     std::string_view format)
{
	Welcome w{};
	w.header = make_header(MessageType::welcome, sizeof(w));
	w.consumer_index = consumer_index;
	w.control_size = control_size;
	w.data_size = data_size;
	w.format_seq = format_seq;
	copy_string(w.format, sizeof(w.format), format);
	return w;
}

Reject make_reject(xmem_status code, std::string_view message)
{
	Reject r{};
	r.header = make_header(MessageType::reject, sizeof(r));
	r.code = code;
	copy_string(r.message, sizeof(r.message), message);
	return r;
}

Result<Welcome> parse_reply(std::span<const std::byte> bytes, const std::string &where)
{
	MessageHeader mh{};
	if (bytes.size() < sizeof(mh))
		return make_error(Errc::not_a_pool,
				  where + ": reply too short for an xmem message (not an xmem pool?)");
	std::memcpy(&mh, bytes.data(), sizeof(mh));
	if (mh.magic != kWireMagic)
		return make_error(Errc::not_a_pool, where + ": reply has a bad magic (not an xmem pool)");
	if (mh.version != kVersion)
		return make_error(Errc::version_mismatch, where + ": owner speaks protocol version " +
								  std::to_string(mh.version) + ", this library " +
								  std::to_string(kVersion));
	if (mh.type == MessageType::reject && bytes.size() == sizeof(Reject)) {
		Reject r;
		std::memcpy(&r, bytes.data(), sizeof(r));
		r.message[sizeof(r.message) - 1] = '\0';
		Errc code = r.code < 0 && r.code >= XMEM_ENOMEM ? Errc(r.code) : Errc::not_a_pool;
		return make_error(code, where + ": refused by the owner: " + r.message);
	}
	if (mh.type != MessageType::welcome || bytes.size() != sizeof(Welcome) || mh.size != bytes.size())
		return make_error(Errc::not_a_pool, where + ": malformed reply from the owner");
	Welcome w;
	std::memcpy(&w, bytes.data(), sizeof(w));
	w.format[sizeof(w.format) - 1] = '\0';
	return w;
}

Request make_request(RequestOp op)
{
	Request r{};
	r.header = make_header(MessageType::request, sizeof(r));
	r.op = op;
	return r;
}

Result<Request> parse_request(std::span<const std::byte> bytes)
{
	MessageHeader mh{};
	if (bytes.size() != sizeof(Request))
		return refusal(XMEM_EINVAL, "malformed request (" + std::to_string(bytes.size()) + " bytes)");
	std::memcpy(&mh, bytes.data(), sizeof(mh));
	if (mh.magic != kWireMagic || mh.version != kVersion || mh.type != MessageType::request ||
	    mh.size != sizeof(Request))
		return refusal(XMEM_EINVAL, "malformed request header");
	Request r;
	std::memcpy(&r, bytes.data(), sizeof(r));
	if (r.op != RequestOp::lease && r.op != RequestOp::publish && r.op != RequestOp::give_back)
		return refusal(XMEM_EINVAL, "unknown request " + std::to_string(uint32_t(r.op)));
	if (r.side_data_size > sizeof(r.side_data))
		return refusal(XMEM_ERANGE,
			       "side data of " + std::to_string(r.side_data_size) + " bytes exceeds the budget");
	r.meta.content_type[sizeof(r.meta.content_type) - 1] = '\0';
	r.meta.producer[sizeof(r.meta.producer) - 1] = '\0';
	return r;
}

Answer make_answer(const Error *error)
{
	Answer a{};
	a.header = make_header(MessageType::answer, sizeof(a));
	if (error) {
		a.code = int32_t(error->code);
		copy_string(a.message, sizeof(a.message), error->message);
	}
	return a;
}

Result<Answer> parse_answer(std::span<const std::byte> bytes, const std::string &where)
{
	MessageHeader mh{};
	if (bytes.size() != sizeof(Answer))
		return make_error(Errc::not_a_pool, where + ": malformed answer from the owner");
	std::memcpy(&mh, bytes.data(), sizeof(mh));
	if (mh.magic != kWireMagic || mh.version != kVersion || mh.type != MessageType::answer ||
	    mh.size != sizeof(Answer))
		return make_error(Errc::not_a_pool, where + ": malformed answer from the owner");
	Answer a;
	std::memcpy(&a, bytes.data(), sizeof(a));
	a.message[sizeof(a.message) - 1] = '\0';
	if (a.code != 0) {
		Errc code = a.code < 0 && a.code >= XMEM_EBADTICKET ? Errc(a.code) : Errc::not_a_pool;
		return make_error(code, std::string(a.message));
	}
	return a;
}

} // namespace xmem::protocol
