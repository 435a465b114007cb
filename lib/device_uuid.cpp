// device_uuid.cpp - what this process knows of CUDA device UUIDs beyond their bytes: which
// name MIG devices, so that messages and xmem-inspect write them as nvidia-smi does.
#include "device_sync.hpp"

#include <algorithm>
#include <mutex>
#include <vector>

namespace xmem {

namespace {

// Guards `migs`; a leaf lock.
std::mutex migs_lock;
// Never destroyed: a message may be formatted during static destruction.
auto *const migs = new std::vector<DeviceUuid>;

} // namespace

void note_mig_device(const DeviceUuid &uuid)
{
	std::lock_guard guard(migs_lock);
	if (std::find(migs->begin(), migs->end(), uuid) == migs->end())
		migs->push_back(uuid);
}

bool is_mig_device(const DeviceUuid &uuid)
{
	std::lock_guard guard(migs_lock);
	return std::find(migs->begin(), migs->end(), uuid) != migs->end();
}

} // namespace xmem
