// ticket.cpp - holds of a named frame (docs/design.md, "Frame tickets", "Meta indices"): a
// ticket's text, and a consumer's redemption of a ticket or get of a meta index for a
// reference of its own; the owner issues and ends counted publications (publisher.cpp).
#include "pool_impl.hpp"

#include <charconv>
#include <cinttypes>
#include <cstdio>

namespace xmem {

using namespace layout;

namespace {

constexpr std::string_view kTicketPrefix = "xmem-ticket:";

// The unsigned number at the front of TEXT, in BASE, up to SEPARATOR (or the end when
// it is '\0'); TEXT moves past both. False for anything else.
template<typename T>
bool take_number(std::string_view &text, T *out, int base, char separator)
{
	size_t end = separator == '\0' ? std::string_view::npos : text.find(separator);
	if (separator != '\0' && end == std::string_view::npos)
		return false;
	std::string_view digits = text.substr(0, end);
	if (digits.empty() || digits.size() > 20)
		return false;
	auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), *out, base);
	if (ec != std::errc() || p != digits.data() + digits.size())
		return false;
	text.remove_prefix(end == std::string_view::npos ? text.size() : end + 1);
	return true;
}

// One of a counted frame's holds (a ticket's redemptions, set_ref_count's holds), by CAS:
// the owner's end of the publication sets ticket_left to 0 first. Counted; the last one
// wakes the owner, whose hold can go. False when none was left.
bool take_hold(PoolImpl &pool, SlotRecord &slot)
{
	uint32_t left = slot.ticket_left.load(std::memory_order_seq_cst);
	do {
		if (left == 0)
			return false;
	} while (!slot.ticket_left.compare_exchange_weak(left, left - 1, std::memory_order_seq_cst));
	pool.seg.header->tickets_redeemed.fetch_add(1, std::memory_order_relaxed);
	if (left == 1)
		pool.notify_owner();
	return true;
}

} // namespace

std::string Ticket::to_string() const
{
	char text[XMEM_TICKET_TEXT_MAX];
	(void)std::snprintf(text, sizeof(text), "xmem-ticket:%" PRIu32 ":%" PRIu64 ":%016" PRIx64, slot, seq, check);
	return text;
}

Result<Ticket> Ticket::parse(std::string_view text)
{
	std::string_view rest = text;
	Ticket t;
	bool ok = rest.substr(0, kTicketPrefix.size()) == kTicketPrefix;
	if (ok) {
		rest.remove_prefix(kTicketPrefix.size());
		ok = take_number(rest, &t.slot, 10, ':') && take_number(rest, &t.seq, 10, ':') && rest.size() == 16 &&
		     take_number(rest, &t.check, 16, '\0') && t.check != 0;
	}
	if (!ok) {
		std::string shown(text.substr(0, 80));
		return make_error(Errc::bad_ticket, "not a frame ticket: '" + shown +
							    "' (expected xmem-ticket:SLOT:SEQ:CHECK, "
							    "CHECK as 16 hex digits)");
	}
	return t;
}

Result<BufferGuard> PoolImpl::redeem(const Ticket &t)
{
	if (role != Role::consumer)
		return make_error(Errc::wrong_role, where() + ": tickets are redeemed by consumers");
	auto refused = [&](const char *why) {
		return make_error(Errc::bad_ticket, where() + ": ticket " + t.to_string() + " " + why);
	};
	if (t.check == 0 || t.slot >= seg.slot_count)
		return refused("names no slot of this pool");
	if (seg.header->state.load(std::memory_order_acquire) == kPoolClosed)
		return make_error(Errc::closed, where() + ": the owner closed the pool (its tickets ended with it)");
	SlotRecord &slot = seg.slots[t.slot];
	constexpr const char *kNotLive = "is not live: expired, used up, forged or of another pool";
	// A stale ticket is refused before this process touches the slot's holder bits.
	if (slot.ticket_check.load(std::memory_order_seq_cst) != t.check)
		return refused(kNotLive);
	// Hold the slot, then check that it still is the ticket's frame: while redemptions
	// are left the owner's hold keeps it so; once the ticket ended, the check word is
	// gone (or the frame is another) and the hold goes back.
	if (auto held = hold_published(t.slot); !held)
		return held.code() == Errc::not_held ? refused(kNotLive) : held.error();
	auto undo = [&] {
		(void)release(t.slot, nullptr, false);
	};
	uint64_t seq = *static_cast<const volatile uint64_t *>(&slot.meta.seq);
	if (seq != t.seq || slot.ticket_check.load(std::memory_order_seq_cst) != t.check) {
		undo();
		return refused(kNotLive);
	}
	if (!take_hold(*this, slot)) {
		undo();
		return refused("has no redemption left (used up or expired)");
	}
	// Ready for any stream, as get()'s frames are (the CPU waits for the producer's writes).
	return finish_get(t.slot, false);
}

Result<BufferGuard> PoolImpl::get_named(uint32_t meta_index, bool writable)
{
	if (role == Role::inspector)
		return make_error(Errc::wrong_role, where() + ": an inspector holds no frames");
	auto m = decode_meta(meta_index);
	if (!m)
		return m.error();
	if (m->gen == 0)
		return get(m->slot, writable);
	if (seg.header->state.load(std::memory_order_acquire) == kPoolClosed ||
	    (owner_link && owner_link->owner_gone()))
		return make_error(Errc::closed,
				  where() + ": the owner closed the pool (its frames' holds ended with it)");
	SlotRecord &slot = seg.slots[m->slot];
	auto refused = [&](const std::string &why) {
		return make_error(Errc::not_held, where() + ": meta index " + std::to_string(meta_index) + " (slot " +
							  std::to_string(m->slot) + ", frame generation " +
							  std::to_string(m->gen) + "): " + why);
	};
	constexpr const char *kGone = "the slot holds another frame now (it was reused since, or never held that one)";
	// An index of an earlier frame is refused before this process touches the holder bits.
	if (slot.frame_gen.load(std::memory_order_seq_cst) != m->gen)
		return refused(kGone);
	if (auto held = hold_published(m->slot); !held)
		return refused(held.error().message);
	auto undo = [&] {
		(void)release(m->slot, nullptr, false);
	};
	// Held, the slot keeps its frame: the generation says whether it is the one named.
	if (slot.frame_gen.load(std::memory_order_seq_cst) != m->gen) {
		undo();
		return refused(kGone);
	}
	// Written before PUBLISHED, with the generation: this frame's.
	if (slot.counted.load(std::memory_order_seq_cst) != 0 && !take_hold(*this, slot)) {
		undo();
		return refused("all the holds set_ref_count published it for were taken, or their lifetime ended");
	}
	return finish_get(m->slot, writable);
}

} // namespace xmem
