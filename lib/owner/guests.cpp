// owner/guests.cpp - guests as the owner serves them on the I/O thread: admission, their
// requests (lease, give back, publish), and their leases' return when they go.
#include "guests.hpp"

#include "../pool_impl.hpp"

#include "../rendezvous.hpp"

#include <algorithm>

namespace xmem::owner {

Guests::Guests(PoolImpl &pool, FramePath &frames, IoPoll &poll) : pool_(pool), frames(frames), poll(poll)
{
}

void Guests::admit(UniqueFd conn, uint32_t c, const PeerCredentials &cred, UniqueFd pidfd)
{
	Guest guest;
	guest.consumer = c;
	guest.pid = uint32_t(std::max(cred.pid, pid_t(0)));
	guest.pidfd = std::move(pidfd);
	protocol::Welcome w = protocol::make_welcome(protocol::kNoConsumer, pool_.seg.bytes().size(), 0, 0, "");
	int fd = conn.get();
	if (!rendezvous::send_welcome(fd, w, -1, {}) || !poll.watch(fd, IoTag::guest, 0, EPOLLIN | EPOLLRDHUP))
		return;
	guest.conn = std::move(conn);
	guests[fd] = std::move(guest);
}

void Guests::serve(int fd)
{
	auto it = guests.find(fd);
	if (it == guests.end()) {
		poll.forget(fd);
		return;
	}
	// A hang-up, fds or a malformed request: the guest is gone (or broke the protocol).
	auto msg = rendezvous::receive_message(fd, monotonic_ns(), "producer", 0);
	if (!msg)
		return gone(fd);
	auto request = protocol::parse_request(msg->data);
	if (!request)
		return gone(fd);
	protocol::Answer a = answer(it->second, *request);
	if (!rendezvous::send_message(fd, &a, sizeof(a), nullptr, 0))
		gone(fd);
}

protocol::Answer Guests::answer(Guest &guest, const protocol::Request &r)
{
	auto refuse = [](const Error &e) {
		return protocol::make_answer(&e);
	};
	auto lease = std::find(guest.leases.begin(), guest.leases.end(), r.slot);
	switch (r.op) {
	case protocol::RequestOp::lease: {
		if (auto known = check_memory(pool_.where(), Storage(r.storage), r.device); !known)
			return refuse(known.error());
		auto slot = frames.lease(r.size, Memory{ Storage(r.storage), r.device });
		if (!slot)
			return refuse(slot.error());
		protocol::Answer a = protocol::make_answer(nullptr);
		a.slot = *slot;
		guest.leases.push_back(a.slot);
		return a;
	}
	case protocol::RequestOp::give_back:
		if (lease == guest.leases.end())
			return refuse(make_error(Errc::not_held, pool_.where() + ": slot " + std::to_string(r.slot) +
									 " is not leased to this producer"));
		guest.leases.erase(lease);
		drop_lease(r.slot); // back to free, unpublished
		return protocol::make_answer(nullptr);
	case protocol::RequestOp::publish:
		break;
	}
	if (lease == guest.leases.end())
		return refuse(make_error(Errc::not_held, pool_.where() + ": slot " + std::to_string(r.slot) +
								 " is not leased to this producer"));
	guest.leases.erase(lease);
	// What the guest wrote, checked by the owner's publish as its own frame is.
	std::span<const std::byte> side(r.side_data, r.side_data_size);
	Origin origin{ guest.consumer, true, guest.pid };
	auto published = frames.publish_lease(r.slot, r.meta, side, r.redemptions, r.ttl_ns, origin);
	if (!published)
		return refuse(published.error());
	protocol::Answer a = protocol::make_answer(nullptr);
	a.slot = r.slot;
	if (*published) {
		a.seq = (*published)->seq;
		a.check = (*published)->check;
	}
	return a;
}

void Guests::gone(int fd)
{
	auto node = guests.extract(fd);
	if (node.empty())
		return;
	poll.forget(fd);
	Guest &guest = node.mapped();
	// Its system slots go back now: its CPU writes ended with its threads. GPU writes it
	// queued into device slots may land until its process has exited (its device files
	// closed): those stay held until then, as a quarantined consumer's (reap()).
	Remains left;
	for (uint32_t i : guest.leases) {
		if (pool_.sync_of(i))
			left.leases.push_back(i);
		else
			drop_lease(i);
	}
	if (left.leases.empty())
		return;
	left.watch = guest.pidfd.valid() ? std::move(guest.pidfd) : grace_timer();
	int watch = left.watch.get();
	if (watch >= 0 && poll.watch(watch, IoTag::guest_exit)) {
		remains[watch] = std::move(left);
		return;
	}
	for (uint32_t i : left.leases) // nothing to wait on: the slots go back now
		drop_lease(i);
}

void Guests::exited(int fd)
{
	if (auto node = remains.extract(fd); !node.empty()) {
		poll.forget(fd);
		// Its process has exited (or its grace ran out): the slots go back.
		for (uint32_t lease : node.mapped().leases)
			drop_lease(lease);
	}
}

void Guests::consumer_reaped(uint32_t c)
{
	for (auto &[fd, guest] : guests)
		if (guest.consumer == c)
			guest.consumer = protocol::kNoConsumer;
}

void Guests::close()
{
	for (auto &[fd, guest] : guests)
		for (uint32_t lease : guest.leases)
			drop_lease(lease);
	for (auto &[fd, left] : remains)
		for (uint32_t lease : left.leases)
			drop_lease(lease);
	guests.clear();
	remains.clear();
}

void Guests::drop_lease(uint32_t index)
{
	(void)pool_.release(index, nullptr, false);
}

} // namespace xmem::owner
