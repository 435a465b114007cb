// policy.cpp - the names of the consumer policies, as the C API, the elements' properties
// and the command-line tools spell them (xmem.hpp: policy_name, policy_from_name).
#include <xmem/xmem.hpp>

namespace xmem {

const char *policy_name(Policy policy)
{
	switch (policy) {
	case Policy::fifo:
		return "fifo";
	case Policy::drop_oldest:
		return "drop-oldest";
	case Policy::drop_new:
		return "drop-new";
	case Policy::latest:
		return "latest";
	case Policy::fifo_spill:
		return "fifo-spill";
	}
	return nullptr;
}

std::optional<Policy> policy_from_name(std::string_view name)
{
	if (name == "block")
		return Policy::fifo;
	for (Policy p : { Policy::fifo, Policy::drop_oldest, Policy::drop_new, Policy::latest, Policy::fifo_spill })
		if (name == policy_name(p))
			return p;
	return std::nullopt;
}

} // namespace xmem
