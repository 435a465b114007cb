// c_api.cpp - xmem.h on top of the C++ API: opaque handles, status codes, and a
// per-thread message. No exception crosses this boundary.
#include "c_api.hpp"

#include "frame_check.hpp"

#include <algorithm>
#include <cstring>
#include <memory>
#include <new>
#include <string>

namespace xmem::capi {

namespace {

thread_local std::string last_error;

} // namespace

int fail(const Error &e)
{
	last_error = e.message;
	return int(e.code);
}

int fail(int code, const char *message)
{
	last_error = message;
	return code;
}

int put_buffer(Result<BufferGuard> &&r, xmem_buffer **out)
{
	if (!r)
		return fail(r.error());
	auto *b = new (std::nothrow) xmem_buffer{ std::move(r).value() };
	if (!b)
		return fail(XMEM_ENOMEM, "out of memory");
	*out = b;
	return XMEM_OK;
}

} // namespace xmem::capi

using namespace xmem::capi;

extern "C" {

const char *xmem_last_error(void)
{
	return xmem::capi::last_error.c_str();
}

const char *xmem_status_name(int s)
{
	switch (s) {
	case XMEM_OK:
		return "XMEM_OK";
	case XMEM_EINVAL:
		return "XMEM_EINVAL";
	case XMEM_ENAME:
		return "XMEM_ENAME";
	case XMEM_ENOENT:
		return "XMEM_ENOENT";
	case XMEM_EACCES:
		return "XMEM_EACCES";
	case XMEM_EBUSY:
		return "XMEM_EBUSY";
	case XMEM_ENOTPOOL:
		return "XMEM_ENOTPOOL";
	case XMEM_EVERSION:
		return "XMEM_EVERSION";
	case XMEM_EBADSEG:
		return "XMEM_EBADSEG";
	case XMEM_ERANGE:
		return "XMEM_ERANGE";
	case XMEM_ETIMEDOUT:
		return "XMEM_ETIMEDOUT";
	case XMEM_ECLOSED:
		return "XMEM_ECLOSED";
	case XMEM_EEOS:
		return "XMEM_EEOS";
	case XMEM_EFULL:
		return "XMEM_EFULL";
	case XMEM_ENOTHELD:
		return "XMEM_ENOTHELD";
	case XMEM_EREADONLY:
		return "XMEM_EREADONLY";
	case XMEM_EROLE:
		return "XMEM_EROLE";
	case XMEM_ESYSTEM:
		return "XMEM_ESYSTEM";
	case XMEM_ENOMEM:
		return "XMEM_ENOMEM";
	case XMEM_EBADFRAME:
		return "XMEM_EBADFRAME";
	case XMEM_EBADTICKET:
		return "XMEM_EBADTICKET";
	}
	return "XMEM_UNKNOWN";
}

const char *xmem_policy_name(int policy)
{
	return xmem::policy_name(xmem::Policy(policy));
}

const char *xmem_policy_name_at(uint32_t index)
{
	auto names = xmem::policy_names();
	return index < names.size() ? names[index].name : nullptr;
}

int xmem_policy_from_name(const char *name)
{
	auto policy = name ? xmem::policy_from_name(name) : std::nullopt;
	if (!policy)
		return fail(XMEM_EINVAL, (std::string("unknown policy '") + (name ? name : "(null)") + "'").c_str());
	return int(*policy);
}

const char *xmem_storage_name(uint32_t storage)
{
	return xmem::storage_name(xmem::Storage(storage));
}

int xmem_storage_from_name(const char *name)
{
	auto storage = name ? xmem::storage_from_name(name) : std::nullopt;
	if (!storage)
		return fail(XMEM_EINVAL, (std::string("unknown storage '") + (name ? name : "(null)") + "'").c_str());
	return int(*storage);
}

void xmem_pool_config_init(xmem_pool_config *c)
{
	if (!c)
		return;
	*c = xmem_pool_config{};
	c->slot_count = 8;
	c->max_consumers = 64;
	c->policy = XMEM_POLICY_DROP_OLDEST;
	c->block_timeout_ns = 1000000000;
	c->mode = 0600;
}

void xmem_open_options_init(xmem_open_options *o)
{
	if (o)
		*o = xmem_open_options{ 0,
					0,
					nullptr,
					0,
					XMEM_POLICY_DROP_OLDEST,
					XMEM_POLICY_DROP_OLDEST,
					XMEM_WAKE_SLEEP,
					0,
					200,
					XMEM_SPILL_DELIVERY_DEVICE,
					0,
					0,
					0,
					{} };
}

int xmem_pool_create(const char *name, const xmem_pool_config *c, xmem_pool **out)
{
	if (!name || !c || !out)
		return fail(XMEM_EINVAL, "xmem_pool_create: null argument");
	return guarded([&] {
		if (!all_zero(c->reserved_config))
			return fail(XMEM_EINVAL, (std::string("pool '") + name +
						  "': xmem_pool_config has reserved fields set "
						  "(initialise it with xmem_pool_config_init)")
							 .c_str());
		xmem::PoolConfig config;
		config.slot_count = c->slot_count;
		config.slot_size = c->slot_size;
		config.max_consumers = c->max_consumers ? c->max_consumers : 64;
		config.policy = xmem::Policy(c->policy);
		config.block_timeout = ns(c->block_timeout_ns ? int64_t(c->block_timeout_ns) : 1000000000);
		config.mode = c->mode ? c->mode : 0600;
		config.format = c->format ? c->format : "";
		config.producer = c->producer ? c->producer : "";
		config.storage = xmem::Storage(c->storage);
		config.device = c->device;
		if (c->has_group)
			config.group = c->group;
		config.spill_bytes = c->spill_bytes;
		config.spill_frames = c->spill_frames;
		config.max_slots = c->max_slots;
		config.memory_cap = uint64_t{ c->memory_cap_mib } << 20;
		config.trim_idle = std::chrono::milliseconds(c->trim_idle_ms);
		config.device_memory_cap = uint64_t{ c->device_memory_cap_mib } << 20;
		auto r = xmem::BufferPool::create(name, config);
		if (!r)
			return fail(r.error());
		*out = new xmem_pool{ std::move(r).value(), {} };
		return int(XMEM_OK);
	});
}

int xmem_pool_open(const char *name, const xmem_open_options *o, xmem_pool **out)
{
	if (!name || !out)
		return fail(XMEM_EINVAL, "xmem_pool_open: null argument");
	return guarded([&] {
		xmem::OpenOptions options;
		if (o) {
			options.timeout = ns(o->timeout_ns);
			options.queue_size = o->queue_size;
			options.client = o->client ? o->client : "";
			if (o->has_policy)
				options.policy = xmem::Policy(o->policy);
			options.fallback = o->fallback ? xmem::Policy(o->fallback) : xmem::Policy::drop_oldest;
			options.block_timeout = ns(int64_t(std::min<uint64_t>(o->block_timeout_ns, INT64_MAX)));
			options.wake = xmem::Wake(o->wake);
			options.spin_budget = std::chrono::microseconds(o->spin_budget_us ? o->spin_budget_us : 200);
			options.spill_delivery = xmem::SpillDelivery(o->spill_delivery);
			options.max_age = std::chrono::microseconds(o->max_age_us);
			options.max_held = o->max_held;
			options.history = o->history;
			if (!all_zero(o->reserved))
				return fail(XMEM_EINVAL, (std::string("pool '") + name +
							  "': xmem_open_options has reserved fields set "
							  "(initialise it with xmem_open_options_init)")
								 .c_str());
		}
		auto r = xmem::BufferPool::open(name, options);
		if (!r)
			return fail(r.error());
		*out = new xmem_pool{ std::move(r).value(), {} };
		return int(XMEM_OK);
	});
}

void xmem_connect_options_init(xmem_connect_options *o)
{
	if (o)
		*o = xmem_connect_options{ std::chrono::nanoseconds(xmem::ConnectOptions{}.timeout).count(),
					   xmem::kConnectMemoryCap >> 20,
					   xmem::kConnectDeviceMemoryCap >> 20,
					   0600,
					   nullptr,
					   {} };
}

int xmem_pool_connect(const char *name, const xmem_connect_options *o, xmem_pool **out)
{
	if (!name || !out)
		return fail(XMEM_EINVAL, "xmem_pool_connect: null argument");
	return guarded([&] {
		xmem::ConnectOptions options;
		if (o) {
			if (!all_zero(o->reserved))
				return fail(XMEM_EINVAL, (std::string("pool '") + name +
							  "': xmem_connect_options has reserved fields set "
							  "(initialise it with xmem_connect_options_init)")
								 .c_str());
			if (o->memory_cap_mib > (UINT64_MAX >> 20) || o->device_memory_cap_mib > (UINT64_MAX >> 20))
				return fail(XMEM_EINVAL,
					    (std::string("pool '") + name + "': a memory cap over 2^44 MiB").c_str());
			options.timeout = ns(o->timeout_ns);
			options.memory_cap = o->memory_cap_mib << 20;
			options.device_memory_cap = o->device_memory_cap_mib << 20;
			options.mode = o->mode;
			options.client = o->client ? o->client : "connect";
		}
		auto r = xmem::BufferPool::connect(name, options);
		if (!r)
			return fail(r.error());
		*out = new xmem_pool{ std::move(r).value(), {} };
		return int(XMEM_OK);
	});
}

static_assert(uint32_t(xmem::Role::owner) == XMEM_ROLE_OWNER && uint32_t(xmem::Role::consumer) == XMEM_ROLE_CONSUMER &&
	      uint32_t(xmem::Role::inspector) == XMEM_ROLE_INSPECTOR && uint32_t(xmem::Role::none) == XMEM_ROLE_NONE);

uint32_t xmem_pool_role(const xmem_pool *pool)
{
	return pool ? uint32_t(pool->pool->role()) : uint32_t(XMEM_ROLE_NONE);
}

void xmem_pool_close(xmem_pool *pool)
{
	delete pool;
}

int xmem_pool_acquire(xmem_pool *pool, int64_t timeout_ns, xmem_buffer **out)
{
	if (!pool || !out)
		return fail(XMEM_EINVAL, "xmem_pool_acquire: null argument");
	return guarded([&] { return put_buffer(pool->pool->acquire(ns(timeout_ns)), out); });
}

int xmem_pool_publish(xmem_pool *pool, xmem_buffer *buffer)
{
	if (!pool || !buffer) {
		delete buffer;
		return fail(XMEM_EINVAL, "xmem_pool_publish: null argument");
	}
	return guarded([&] {
		auto r = pool->pool->publish(std::move(buffer->guard));
		delete buffer;
		return status(r);
	});
}

int xmem_pool_acquire_on_stream(xmem_pool *pool, int64_t timeout_ns, void *cuda_stream, xmem_buffer **out)
{
	if (!pool || !out)
		return fail(XMEM_EINVAL, "xmem_pool_acquire_on_stream: null argument");
	return guarded([&] { return put_buffer(pool->pool->acquire(ns(timeout_ns), cuda_stream), out); });
}

int xmem_pool_acquire_size(xmem_pool *pool, uint64_t size, int64_t timeout_ns, void *cuda_stream, xmem_buffer **out)
{
	if (!pool || !out)
		return fail(XMEM_EINVAL, "xmem_pool_acquire_size: null argument");
	return guarded([&] { return put_buffer(pool->pool->acquire(size, ns(timeout_ns), cuda_stream), out); });
}

int xmem_pool_acquire_memory(xmem_pool *pool, uint64_t size, uint32_t storage, uint32_t device, int64_t timeout_ns,
			     void *cuda_stream, xmem_buffer **out)
{
	if (!pool || !out)
		return fail(XMEM_EINVAL, "xmem_pool_acquire_memory: null argument");
	return guarded([&] {
		return put_buffer(
			pool->pool->acquire(size, xmem::Storage(storage), device, ns(timeout_ns), cuda_stream), out);
	});
}

int xmem_pool_copy(xmem_pool *pool, const xmem_buffer *frame, uint32_t storage, uint32_t device, int64_t timeout_ns,
		   void *cuda_stream, xmem_buffer **out)
{
	if (!pool || !frame || !out)
		return fail(XMEM_EINVAL, "xmem_pool_copy: null argument");
	return guarded([&] {
		return put_buffer(
			pool->pool->copy(frame->guard, xmem::Storage(storage), device, ns(timeout_ns), cuda_stream),
			out);
	});
}

int xmem_pool_preallocate(xmem_pool *pool, uint64_t slot_size, uint32_t count, uint32_t storage, uint32_t device,
			  uint32_t *class_index)
{
	if (!pool)
		return fail(XMEM_EINVAL, "xmem_pool_preallocate: null pool");
	return guarded([&] {
		auto r = pool->pool->preallocate(slot_size, count, xmem::Storage(storage), device);
		if (!r)
			return fail(r.error());
		if (class_index)
			*class_index = *r;
		return int(XMEM_OK);
	});
}

uint32_t xmem_pool_class_count(const xmem_pool *pool)
{
	return pool ? uint32_t(pool->pool->classes().size()) : 0;
}

int xmem_pool_class_info(const xmem_pool *pool, uint32_t index, xmem_size_class *out)
{
	if (!pool || !out)
		return fail(XMEM_EINVAL, "xmem_pool_class_info: null argument");
	auto classes = pool->pool->classes();
	if (index >= classes.size())
		return fail(XMEM_ERANGE, "xmem_pool_class_info: no size class of that index");
	const xmem::SizeClass &c = classes[index];
	*out = xmem_size_class{
		c.index, uint32_t(c.storage), c.device, c.first_slot, c.count, c.sync_mode, c.slot_size
	};
	return XMEM_OK;
}

int xmem_pool_publish_on_stream(xmem_pool *pool, xmem_buffer *buffer, void *cuda_stream)
{
	if (!pool || !buffer) {
		delete buffer;
		return fail(XMEM_EINVAL, "xmem_pool_publish_on_stream: null argument");
	}
	return guarded([&] {
		auto r = pool->pool->publish(std::move(buffer->guard), cuda_stream);
		delete buffer;
		return status(r);
	});
}

int xmem_pool_set_format(xmem_pool *pool, const char *format)
{
	if (!pool || !format)
		return fail(XMEM_EINVAL, "xmem_pool_set_format: null argument");
	return guarded([&] { return status(pool->pool->set_format(format)); });
}

int xmem_pool_end_of_stream(xmem_pool *pool)
{
	if (!pool)
		return fail(XMEM_EINVAL, "xmem_pool_end_of_stream: null argument");
	return guarded([&] { return status(pool->pool->end_of_stream()); });
}

int xmem_pool_receive(xmem_pool *pool, int64_t timeout_ns, xmem_buffer **out)
{
	if (!pool || !out)
		return fail(XMEM_EINVAL, "xmem_pool_receive: null argument");
	return guarded([&] { return put_buffer(pool->pool->receive(ns(timeout_ns)), out); });
}

int xmem_pool_receive_on_stream(xmem_pool *pool, int64_t timeout_ns, void *cuda_stream, xmem_buffer **out)
{
	if (!pool || !out)
		return fail(XMEM_EINVAL, "xmem_pool_receive_on_stream: null argument");
	return guarded([&] { return put_buffer(pool->pool->receive(ns(timeout_ns), cuda_stream), out); });
}

int xmem_pool_fd(const xmem_pool *pool)
{
	return pool ? pool->pool->fd() : -1;
}

const char *xmem_pool_format(const xmem_pool *pool)
{
	if (!pool)
		return "";
	auto *p = const_cast<xmem_pool *>(pool);
	p->format = pool->pool->format();
	return p->format.c_str();
}

int xmem_pool_stats_get(const xmem_pool *pool, xmem_pool_stats *stats)
{
	if (!pool || !stats)
		return fail(XMEM_EINVAL, "xmem_pool_stats_get: null argument");
	*stats = pool->pool->stats();
	return XMEM_OK;
}

uint64_t xmem_pool_side_data_refused(const xmem_pool *pool)
{
	return pool ? pool->pool->side_data_refused() : 0;
}

uint64_t xmem_pool_frames_refused(const xmem_pool *pool)
{
	return pool ? pool->pool->frames_refused() : 0;
}

int xmem_pool_consumer_stats(const xmem_pool *pool, xmem_consumer_stats *stats)
{
	if (!pool || !stats)
		return fail(XMEM_EINVAL, "xmem_pool_consumer_stats: null argument");
	return guarded([&] {
		auto r = pool->pool->consumer_stats();
		if (!r)
			return fail(r.error());
		*stats = *r;
		return int(XMEM_OK);
	});
}

int xmem_pool_spill_stats(const xmem_pool *pool, xmem_spill_stats *stats)
{
	if (!pool || !stats)
		return fail(XMEM_EINVAL, "xmem_pool_spill_stats: null argument");
	*stats = pool->pool->spill_stats();
	return int(XMEM_OK);
}

int xmem_pool_growth_stats(const xmem_pool *pool, xmem_growth_stats *stats)
{
	if (!pool || !stats)
		return fail(XMEM_EINVAL, "xmem_pool_growth_stats: null argument");
	*stats = pool->pool->growth_stats();
	return int(XMEM_OK);
}

uint64_t xmem_pool_slot_size(const xmem_pool *pool)
{
	return pool ? pool->pool->slot_size() : 0;
}
uint32_t xmem_pool_slot_count(const xmem_pool *pool)
{
	return pool ? pool->pool->slot_count() : 0;
}
uint32_t xmem_pool_storage(const xmem_pool *pool)
{
	return pool ? uint32_t(pool->pool->storage()) : uint32_t(XMEM_STORAGE_SYSTEM);
}
uint32_t xmem_pool_device(const xmem_pool *pool)
{
	return pool ? pool->pool->device() : 0;
}
const char *xmem_pool_gpu_ordering(const xmem_pool *pool)
{
	return pool ? pool->pool->gpu_ordering() : "none";
}
uint32_t xmem_pool_pitch_alignment(const xmem_pool *pool)
{
	return pool ? pool->pool->pitch_alignment() : 1;
}

int xmem_set_video_layout(xmem_frame_meta *meta, const char *format, uint32_t width, uint32_t height,
			  uint32_t alignment)
{
	if (!meta || !format)
		return fail(XMEM_EINVAL, "xmem_set_video_layout: null argument");
	return guarded([&] { return status(xmem::set_video_layout(*meta, format, width, height, alignment)); });
}

int xmem_video_plane(const char *format, uint32_t plane, uint32_t *bytes, uint32_t *x_divisor, uint32_t *y_divisor)
{
	if (!format)
		return fail(XMEM_EINVAL, "xmem_video_plane: null format");
	return guarded([&] {
		auto shape = xmem::video_plane(format, plane);
		if (!shape)
			return fail(shape.error());
		if (bytes)
			*bytes = shape->bytes;
		if (x_divisor)
			*x_divisor = shape->x_divisor;
		if (y_divisor)
			*y_divisor = shape->y_divisor;
		return int(shape->planes);
	});
}

int xmem_pool_get(xmem_pool *pool, uint32_t index, xmem_buffer **out)
{
	if (!pool || !out)
		return fail(XMEM_EINVAL, "xmem_pool_get: null argument");
	return guarded([&] { return put_buffer(pool->pool->get(index), out); });
}

int xmem_pool_get_seq(xmem_pool *pool, uint32_t index, uint64_t seq, xmem_buffer **out)
{
	if (!pool || !out)
		return fail(XMEM_EINVAL, "xmem_pool_get_seq: null argument");
	return guarded([&] { return put_buffer(pool->pool->get(index, seq), out); });
}

int xmem_pool_get_mut(xmem_pool *pool, uint32_t index, xmem_buffer **out)
{
	if (!pool || !out)
		return fail(XMEM_EINVAL, "xmem_pool_get_mut: null argument");
	return guarded([&] { return put_buffer(pool->pool->get_mut(index), out); });
}

namespace {

xmem_ticket c_ticket(const xmem::Ticket &t)
{
	xmem_ticket c{};
	c.slot = t.slot;
	c.seq = t.seq;
	c.check = t.check;
	return c;
}

} // namespace

int xmem_pool_publish_ticket(xmem_pool *pool, xmem_buffer *buffer, uint32_t redemptions, uint64_t ttl_ns,
			     void *cuda_stream, xmem_ticket *ticket)
{
	if (!pool || !buffer || !ticket) {
		delete buffer;
		return fail(XMEM_EINVAL, "xmem_pool_publish_ticket: null argument");
	}
	if (ttl_ns > uint64_t(INT64_MAX)) {
		delete buffer;
		return fail(XMEM_EINVAL, "xmem_pool_publish_ticket: a TTL over INT64_MAX ns");
	}
	return guarded([&] {
		auto t = pool->pool->publish_ticket(std::move(buffer->guard), redemptions, ns(int64_t(ttl_ns)),
						    cuda_stream);
		delete buffer;
		if (t)
			*ticket = c_ticket(*t);
		return status(t);
	});
}

int xmem_pool_get_ticket(xmem_pool *pool, const xmem_ticket *ticket, xmem_buffer **out)
{
	if (!pool || !ticket || !out)
		return fail(XMEM_EINVAL, "xmem_pool_get_ticket: null argument");
	return guarded([&] {
		return put_buffer(pool->pool->get(xmem::Ticket{ ticket->slot, ticket->seq, ticket->check }), out);
	});
}

int xmem_ticket_format(const xmem_ticket *ticket, char *text, size_t size)
{
	if (!ticket || !text)
		return fail(XMEM_EINVAL, "xmem_ticket_format: null argument");
	return guarded([&] {
		std::string s = xmem::Ticket{ ticket->slot, ticket->seq, ticket->check }.to_string();
		if (s.size() >= size)
			return fail(xmem::Error{ xmem::Errc::out_of_range,
						 "xmem_ticket_format: " + std::to_string(s.size() + 1) +
							 " bytes needed, " + std::to_string(size) + " given" });
		std::memcpy(text, s.c_str(), s.size() + 1);
		return int(XMEM_OK);
	});
}

int xmem_ticket_parse(const char *text, xmem_ticket *ticket)
{
	if (!text || !ticket)
		return fail(XMEM_EINVAL, "xmem_ticket_parse: null argument");
	return guarded([&] {
		auto t = xmem::Ticket::parse(text);
		if (t)
			*ticket = c_ticket(*t);
		return status(t);
	});
}

int xmem_pool_ticket_stats(const xmem_pool *pool, xmem_ticket_stats *stats)
{
	if (!pool || !stats)
		return fail(XMEM_EINVAL, "xmem_pool_ticket_stats: null argument");
	*stats = pool->pool->ticket_stats();
	return int(XMEM_OK);
}

int xmem_pool_add_ref(xmem_pool *pool, uint32_t index)
{
	if (!pool)
		return fail(XMEM_EINVAL, "xmem_pool_add_ref: null argument");
	return guarded([&] { return status(pool->pool->add_ref(index)); });
}

int xmem_pool_release(xmem_pool *pool, uint32_t index)
{
	if (!pool)
		return fail(XMEM_EINVAL, "xmem_pool_release: null argument");
	return guarded([&] { return status(pool->pool->release(index)); });
}

int xmem_pool_set_ref_count(xmem_pool *pool, uint32_t meta_index, int32_t count, uint64_t lifetime_ns)
{
	if (!pool)
		return fail(XMEM_EINVAL, "xmem_pool_set_ref_count: null argument");
	if (lifetime_ns > uint64_t(INT64_MAX))
		return fail(XMEM_EINVAL, "xmem_pool_set_ref_count: a lifetime over INT64_MAX ns");
	auto lifetime = lifetime_ns ? std::chrono::nanoseconds(int64_t(lifetime_ns)) : xmem::kHoldLifetime;
	return guarded([&] { return status(pool->pool->set_ref_count(meta_index, count, lifetime)); });
}

int xmem_pool_set_local_refs(xmem_pool *pool, uint32_t index, uint32_t count)
{
	if (!pool)
		return fail(XMEM_EINVAL, "xmem_pool_set_local_refs: null argument");
	return guarded([&] { return status(pool->pool->set_local_refs(index, count)); });
}

uint32_t xmem_pool_ref_count(const xmem_pool *pool, uint32_t index)
{
	return pool ? pool->pool->ref_count(index) : 0;
}

} // extern "C"
