// lib/names.cpp - the names of policies and storages, one table each: the C API (and
// through it Python), xmem-inspect and the elements read them here.
#include <xmem/xmem.hpp>

#include <iterator>

namespace xmem {

namespace {

// "block" first: a pool's configuration and xmem-inspect name fifo so. The blurbs read
// for a pool (xmemsink policy) and for one consumer (xmemsrc policy) alike.
constexpr PolicyName kPolicyNames[] = {
	{ "block", Policy::fifo,
	  "Every frame: wait for the consumer, up to block-timeout, then drop its oldest frame" },
	{ "fifo", Policy::fifo,
	  "Every frame: the producer waits for the consumer up to block-timeout, then the fallback applies (a "
	  "pool's: drop-oldest)" },
	{ "drop-oldest", Policy::drop_oldest, "A full queue drops its oldest frame" },
	{ "drop-new", Policy::drop_new, "A full queue does not take the new frame" },
	{ "latest", Policy::latest, "A mailbox of one: a newer frame replaces the queued one" },
	{ "fifo-spill", Policy::fifo_spill,
	  "Every frame, never waited for: queued frames move to the pool's spill tier (host memory, xmemsink "
	  "spill-size) when the producer needs their slots; past its cap, the fallback applies" },
};

struct StorageName {
	const char *name;
	Storage storage;
};

// By value, from 0 without a gap (xmem_storage_name's promise).
constexpr StorageName kStorageNames[] = { { "system", Storage::system }, { "cuda", Storage::cuda } };
static_assert(uint32_t(kStorageNames[0].storage) == 0 && uint32_t(kStorageNames[1].storage) == 1);

} // namespace

const char *policy_name(Policy policy)
{
	// The first name of each policy but fifo's, which is "fifo" (not "block") here.
	for (const PolicyName &p : kPolicyNames)
		if (p.policy == policy && std::string_view(p.name) != "block")
			return p.name;
	return nullptr;
}

std::optional<Policy> policy_from_name(std::string_view name)
{
	for (const PolicyName &p : kPolicyNames)
		if (name == p.name)
			return p.policy;
	return std::nullopt;
}

std::span<const PolicyName> policy_names()
{
	return kPolicyNames;
}

const char *storage_name(Storage storage)
{
	auto i = uint32_t(storage);
	return i < std::size(kStorageNames) ? kStorageNames[i].name : nullptr;
}

std::optional<Storage> storage_from_name(std::string_view name)
{
	for (const auto &s : kStorageNames)
		if (name == s.name)
			return s.storage;
	return std::nullopt;
}

} // namespace xmem
