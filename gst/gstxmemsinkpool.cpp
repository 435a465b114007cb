/* gstxmemsinkpool.cpp - the pool behind xmemsink: made for the negotiated caps,
 * grown by a size class for larger frames, recreated for another memory. */
#include "gstxmemsinkprivate.h"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <vector>

#include <grp.h>

#define GST_CAT_DEFAULT gst_xmem_sink_debug

/* As xmemsrc's: the message says what failed, then the library's words (the pool, the
 * cause, the fix); the debug string repeats them. */
void post_pool_error(GstXmemSink *self, const xmem::Error &error)
{
	const char *why = error.message.c_str();
	if (error.code == xmem::Errc::permission_denied)
		GST_ELEMENT_ERROR(self, RESOURCE, OPEN_WRITE, ("Cannot create the xmem pool: %s", why), ("%s", why));
	else if (error.code == xmem::Errc::owner_alive || error.code == xmem::Errc::bad_name)
		GST_ELEMENT_ERROR(self, RESOURCE, SETTINGS, ("Cannot create the xmem pool: %s", why), ("%s", why));
	else
		GST_ELEMENT_ERROR(self, RESOURCE, FAILED, ("xmem pool failure: %s", why), ("%s", why));
}

/* The gid the group property names: a number, or a group's name. */
static xmem::Result<guint32> resolve_group(const std::string &group)
{
	char *end = nullptr;
	guint64 gid = g_ascii_strtoull(group.c_str(), &end, 10);
	if (end && *end == '\0' && end != group.c_str() && gid < G_MAXUINT32)
		return guint32(gid);
	std::vector<char> buf(16384);
	struct group entry {
	};
	struct group *found = nullptr;
	if (getgrnam_r(group.c_str(), &entry, buf.data(), buf.size(), &found) != 0 || !found)
		return xmem::Error{ xmem::Errc::bad_name, "group '" + group + "': no such group" };
	return guint32(found->gr_gid);
}

/* Makes sure a pool with slots of at least FRAME_SIZE bytes publishes CAPS_STRING.
 * A larger frame than the slots hold gets a size class of its own in the same pool
 * (`buffers` slots of its size): consumers stay attached and import the class with
 * its first frame. Frames in another memory, or a pool with no room left for a class
 * (32 classes, or PoolConfig::max_slots records), mean a new pool under the same name:
 * consumers see the old one close and reattach (xmemsrc does so by itself). */
std::shared_ptr<xmem::BufferPool> ensure_pool(GstXmemSink *self, gsize frame_size)
{
	SinkState *s = self->state;
	std::unique_lock lock(s->lock);
	bool same_memory = s->pool && s->pool->storage() == s->storage && s->pool->device() == s->device;
	xmem::GrowthStats growth = s->pool ? s->pool->growth_stats() : xmem::GrowthStats{};
	guint64 cap = s->storage == xmem::Storage::system ? growth.memory_cap : growth.device_memory_cap;
	if (same_memory && frame_size > s->slot_limit && cap >= frame_size) {
		/* A pool that grows makes slots of the new size as frames need them, within its
		 * cap; those of the old size go back once unused. */
		GST_INFO_OBJECT(self, "frames of %" G_GSIZE_FORMAT " bytes: slots made on demand in pool '%s'",
				frame_size, s->pool_name.c_str());
		s->slot_limit = frame_size;
	} else if (same_memory && frame_size > s->slot_limit) {
		auto added = s->pool->preallocate(frame_size, s->buffers, s->storage, s->device);
		if (added) {
			GST_INFO_OBJECT(self,
					"frames of %" G_GSIZE_FORMAT " bytes: size class %u of pool '%s', %u slots",
					frame_size, *added, s->pool_name.c_str(), s->buffers);
			auto classes = s->pool->classes();
			s->slot_limit = std::max<guint64>(frame_size, classes.at(*added).slot_size);
		} else if (added.code() == xmem::Errc::full) {
			GST_INFO_OBJECT(self, "no room for a size class of %" G_GSIZE_FORMAT " bytes: %s", frame_size,
					added.error().message.c_str());
			same_memory = false;
		} else {
			lock.unlock();
			post_pool_error(self, added.error());
			return nullptr;
		}
	}
	if (same_memory) {
		if (s->pool->format() != s->caps_string) {
			auto r = s->pool->set_format(s->caps_string);
			if (!r) {
				lock.unlock();
				post_pool_error(self, r.error());
				return nullptr;
			}
		}
		return s->pool;
	}
	if (s->pool) {
		GST_INFO_OBJECT(
			self, "frames of %" G_GSIZE_FORMAT " bytes in %s memory need new slots: recreating pool '%s'",
			frame_size, s->storage == xmem::Storage::cuda ? "CUDA" : "system", s->pool_name.c_str());
		/* Consumers of the old pool reattach to the new one: wait for them (a
		 * little) before publishing into it, or its first frames go to nobody. */
		s->rejoin = s->pool->stats().consumers;
		s->waited = false;
		s->recreated++;
		s->pool->close();
		s->pool.reset();
	}
	xmem::PoolConfig config;
	config.slot_count = s->buffers;
	config.slot_size = std::max<gsize>(frame_size, 1);
	config.max_consumers = s->max_consumers;
	config.policy = xmem::Policy(s->policy);
	config.block_timeout = std::chrono::nanoseconds(s->block_timeout);
	config.spill_bytes = s->spill_size;
	/* The cap is on the pool's memory: system memory, or its CUDA device's. */
	if (s->storage == xmem::Storage::cuda)
		config.device_memory_cap = s->memory_cap;
	else
		config.memory_cap = s->memory_cap;
	config.mode = s->perms;
	if (!s->group.empty()) {
		auto gid = resolve_group(s->group);
		if (!gid) {
			lock.unlock();
			post_pool_error(self, gid.error());
			return nullptr;
		}
		config.group = *gid;
	}
	config.format = s->caps_string;
	config.producer = "xmemsink";
	config.storage = s->storage;
	config.device = s->device;
	auto pool = xmem::BufferPool::create(s->pool_name, config);
	if (!pool) {
		lock.unlock();
		post_pool_error(self, pool.error());
		return nullptr;
	}
	GST_INFO_OBJECT(self, "created pool '%s' at %s: %u slots of %" G_GUINT64_FORMAT " bytes in %s memory",
			s->pool_name.c_str(), (*pool)->path().c_str(), config.slot_count, config.slot_size,
			config.storage == xmem::Storage::cuda ? "CUDA" : "system");
	s->pool = pool.value();
	s->slot_limit = s->pool->slot_size();
	return s->pool;
}
