// holder.hpp - what this process's references ask of the roles above them, as interfaces
// those roles implement: the reference code (pool.cpp) never includes a role's header.
#pragma once

#include <xmem/xmem.hpp>

#include <cstdint>

namespace xmem {

// A consumer's link to the pool's owner (Subscriber): memory the owner made after this
// consumer attached, imported when one of its references first meets it.
class OwnerLink
{
public:
	OwnerLink(const OwnerLink &) = delete;
	OwnerLink &operator=(const OwnerLink &) = delete;

	// Imports the memory of every size class the owner has added since this consumer
	// last looked, each over a connection of its own (protocol.hpp, PeerRole::classes).
	virtual Result<void> import_classes() = 0;
	// A dynamic class's device slot INDEX (docs/design.md, "Growth on demand"), held here:
	// its memory mapped, of the generation the owner committed last, asked of the owner
	// (PeerRole::slot) when the slot's record names another than the one mapped here.
	virtual Result<void> map_slot(uint32_t index) = 0;
	// After the owner trimmed slots: the dynamic device slots this process does not hold
	// whose memory went back, unmapped here too (their memory is freed once no process
	// maps it). One load when nothing was trimmed.
	virtual void unmap_trimmed() = 0;
	// The owner hung up: every request to it is closed.
	virtual bool owner_gone() const = 0;

protected:
	OwnerLink() = default;
	~OwnerLink() = default; // owned as the role, never through this interface
};

// A guest's leases (GuestProducer): slots the owner leased to this process to write.
class GuestLeases
{
public:
	GuestLeases(const GuestLeases &) = delete;
	GuestLeases &operator=(const GuestLeases &) = delete;

	// Leased slot INDEX goes back unpublished: its last reference here went (refs_lock
	// not held). A device slot's writes queued on STREAM (or ALSO) are waited for first.
	virtual void give_back(uint32_t index, void *stream, void *also) = 0;

protected:
	GuestLeases() = default;
	~GuestLeases() = default; // owned as the role, never through this interface
};

} // namespace xmem
