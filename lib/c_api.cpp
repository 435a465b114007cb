// c_api.cpp - xmem.h on top of the C++ API: opaque handles, status codes, and a
// per-thread message. No exception crosses this boundary.
#include <xmem/xmem.h>
#include <xmem/xmem.hpp>

#include "frame_check.hpp"

#include <algorithm>
#include <cstring>
#include <memory>
#include <new>
#include <string>

struct xmem_pool {
	std::shared_ptr<xmem::BufferPool> pool;
	std::string format; // backs xmem_pool_format()
};

struct xmem_buffer {
	xmem::BufferGuard guard;
};

namespace {

thread_local std::string last_error;

int fail(const xmem::Error &e)
{
	last_error = e.message;
	return int(e.code);
}

int fail(int code, const char *message)
{
	last_error = message;
	return code;
}

template<size_t N>
bool all_zero(const uint32_t (&words)[N])
{
	for (uint32_t w : words)
		if (w != 0)
			return false;
	return true;
}

template<typename T>
int status(const xmem::Result<T> &r)
{
	return r ? XMEM_OK : fail(r.error());
}

int put_buffer(xmem::Result<xmem::BufferGuard> &&r, xmem_buffer **out)
{
	if (!r)
		return fail(r.error());
	auto *b = new (std::nothrow) xmem_buffer{ std::move(r).value() };
	if (!b)
		return fail(XMEM_ENOMEM, "out of memory");
	*out = b;
	return XMEM_OK;
}

template<typename F>
int guarded(F f)
{
	try {
		return f();
	} catch (const std::bad_alloc &) {
		return fail(XMEM_ENOMEM, "out of memory");
	} catch (const std::exception &e) {
		return fail(XMEM_ESYSTEM, e.what());
	}
}

std::chrono::nanoseconds ns(int64_t v)
{
	return std::chrono::nanoseconds(v);
}

// The tensor layout xmem_buffer_set_tensor() writes into META, all checked before any
// of it is: a layout the consumers' check (check_frame_layout) would refuse never
// leaves here, and neither does a stride DLPack cannot count in elements.
xmem::Result<void> set_tensor(xmem_frame_meta &meta, uint64_t capacity, uint32_t dtype, uint32_t ndim,
			      const uint64_t *shape, const uint64_t *strides)
{
	auto error = [](xmem::Errc code, const std::string &what) {
		return xmem::Error{ code, "xmem_buffer_set_tensor: " + what };
	};
	uint64_t item = xmem::dtype_size(dtype);
	if (item == 0)
		return error(xmem::Errc::invalid_argument, "dtype " + std::to_string(dtype) + " is not an xmem_dtype");
	if (ndim > XMEM_MAX_DIMS)
		return error(xmem::Errc::invalid_argument,
			     "ndim " + std::to_string(ndim) + " > " + std::to_string(XMEM_MAX_DIMS));
	xmem_frame_meta m = meta;
	m.dtype = uint8_t(dtype);
	m.ndim = uint8_t(ndim);
	std::fill(std::begin(m.shape), std::end(m.shape), 0);
	std::fill(std::begin(m.strides), std::end(m.strides), 0);
	uint64_t contiguous = item; // the next dimension out's stride, C order
	bool overflow = false;
	for (uint32_t d = ndim; d-- > 0;) {
		m.shape[d] = shape[d];
		if (strides && strides[d] % item != 0)
			return error(xmem::Errc::invalid_argument, "stride " + std::to_string(strides[d]) +
									   " of dimension " + std::to_string(d) +
									   " is not a multiple of the element size (" +
									   std::to_string(item) + " bytes)");
		m.strides[d] = strides ? strides[d] : contiguous;
		overflow |= __builtin_mul_overflow(contiguous, shape[d], &contiguous);
	}
	if (ndim == 0) {
		meta = m;
		return {};
	}
	// Where the last element ends; 0 for a tensor without elements.
	uint64_t end = item;
	for (uint32_t d = 0; d < ndim && end != 0; d++) {
		uint64_t step = 0;
		if (m.shape[d] == 0)
			end = 0;
		else
			overflow |= __builtin_mul_overflow(m.shape[d] - 1, m.strides[d], &step) ||
				    __builtin_add_overflow(end, step, &end);
	}
	if (overflow || end > uint64_t(INT64_MAX))
		return error(xmem::Errc::out_of_range, "the tensor spans more bytes than int64 counts");
	if (end > capacity)
		return error(xmem::Errc::out_of_range, "the tensor spans " + std::to_string(end) +
							       " bytes; the buffer holds " + std::to_string(capacity));
	m.size = end;
	if (auto fits = xmem::check_frame_layout(m, capacity); !fits)
		return error(xmem::Errc::invalid_argument, fits.error().message);
	meta = m;
	return {};
}

} // namespace

extern "C" {

const char *xmem_last_error(void)
{
	return last_error.c_str();
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

int xmem_pool_set_ref_count(xmem_pool *pool, uint32_t index, uint32_t count)
{
	if (!pool)
		return fail(XMEM_EINVAL, "xmem_pool_set_ref_count: null argument");
	return guarded([&] { return status(pool->pool->set_ref_count(index, count)); });
}

uint32_t xmem_pool_ref_count(const xmem_pool *pool, uint32_t index)
{
	return pool ? pool->pool->ref_count(index) : 0;
}

const xmem_frame_meta *xmem_buffer_meta(const xmem_buffer *b)
{
	return b ? &b->guard.meta() : nullptr;
}

xmem_frame_meta *xmem_buffer_meta_mut(xmem_buffer *b)
{
	if (!b)
		return nullptr;
	auto r = b->guard.meta_mut();
	return r ? r.value() : nullptr;
}

const void *xmem_buffer_data(const xmem_buffer *b)
{
	return b ? b->guard.data().data() : nullptr;
}

void *xmem_buffer_data_mut(xmem_buffer *b)
{
	if (!b)
		return nullptr;
	auto r = b->guard.data_mut();
	return r ? r.value().data() : nullptr;
}

int xmem_buffer_set_tensor(xmem_buffer *b, uint32_t dtype, uint32_t ndim, const uint64_t *shape,
			   const uint64_t *strides)
{
	if (!b || (ndim > 0 && !shape))
		return fail(XMEM_EINVAL, "xmem_buffer_set_tensor: NULL buffer, or NULL shape with dimensions");
	return guarded([&] {
		auto meta = b->guard.meta_mut();
		if (!meta)
			return fail(meta.error());
		return status(set_tensor(**meta, b->guard.capacity(), dtype, ndim, shape, strides));
	});
}

uint64_t xmem_buffer_capacity(const xmem_buffer *b)
{
	return b ? b->guard.capacity() : 0;
}
const char *xmem_buffer_format(const xmem_buffer *b)
{
	return b ? b->guard.format().c_str() : "";
}
int xmem_buffer_set_side_data(xmem_buffer *b, const void *data, size_t size)
{
	if (!b || (!data && size > 0))
		return fail(XMEM_EINVAL, "xmem_buffer_set_side_data: NULL buffer, or NULL data with a size");
	return guarded([&] { return status(b->guard.set_side_data({ static_cast<const std::byte *>(data), size })); });
}

const void *xmem_buffer_side_data(const xmem_buffer *b, size_t *size)
{
	std::span<const std::byte> side;
	if (b)
		side = b->guard.side_data();
	if (size)
		*size = side.size();
	return side.empty() ? nullptr : side.data();
}

int xmem_buffer_is_writable(const xmem_buffer *b)
{
	return b && b->guard.writable();
}
int xmem_buffer_try_make_writable(xmem_buffer *b)
{
	if (!b)
		return 0;
	// A lock that fails to take (never, in practice) leaves the buffer read-only.
	return guarded([&] { return int(b->guard.try_make_writable()); }) == 1 ? 1 : 0;
}
int xmem_buffer_is_copy(const xmem_buffer *b)
{
	return b && b->guard.is_copy();
}
int xmem_buffer_spilled(const xmem_buffer *b)
{
	return b && b->guard.spilled();
}

int xmem_buffer_clone(const xmem_buffer *b, xmem_buffer **out)
{
	if (!b || !out)
		return fail(XMEM_EINVAL, "xmem_buffer_clone: null argument");
	return guarded([&] { return put_buffer(b->guard.clone_ref(), out); });
}

void xmem_buffer_release(xmem_buffer *b)
{
	delete b;
}

int xmem_buffer_release_on_stream(xmem_buffer *b, void *cuda_stream)
{
	if (!b)
		return fail(XMEM_EINVAL, "xmem_buffer_release_on_stream: null argument");
	// The handle goes in all cases: on error the guard is already empty.
	std::unique_ptr<xmem_buffer> owned(b);
	return guarded([&] { return status(owned->guard.release(cuda_stream)); });
}

uint32_t xmem_buffer_storage(const xmem_buffer *b)
{
	return b ? uint32_t(b->guard.storage()) : uint32_t(XMEM_STORAGE_SYSTEM);
}
uint32_t xmem_buffer_device(const xmem_buffer *b)
{
	return b ? b->guard.device() : 0;
}
uint64_t xmem_buffer_device_ptr(const xmem_buffer *b)
{
	return b ? b->guard.device_ptr() : 0;
}
int xmem_buffer_is_incomplete(const xmem_buffer *b)
{
	return b && b->guard.incomplete() ? 1 : 0;
}

int xmem_buffer_copy_to_cpu(const xmem_buffer *b, void *cuda_stream, xmem_buffer **out)
{
	if (!b || !out)
		return fail(XMEM_EINVAL, "xmem_buffer_copy_to_cpu: null argument");
	return guarded([&] { return put_buffer(b->guard.copy_to_cpu(cuda_stream), out); });
}

int xmem_buffer_copy_to_cuda(const xmem_buffer *b, uint32_t device, void *cuda_stream, xmem_buffer **out)
{
	if (!b || !out)
		return fail(XMEM_EINVAL, "xmem_buffer_copy_to_cuda: null argument");
	return guarded([&] { return put_buffer(b->guard.copy_to_cuda(device, cuda_stream), out); });
}

int xmem_buffer_copy_to_device(const xmem_buffer *b, uint32_t device, void *cuda_stream, xmem_buffer **out)
{
	if (!b || !out)
		return fail(XMEM_EINVAL, "xmem_buffer_copy_to_device: null argument");
	return guarded([&] { return put_buffer(b->guard.copy_to_device(device, cuda_stream), out); });
}

int xmem_cuda_copy_2d(uint64_t dst, uint64_t dst_pitch, int dst_device, uint64_t src, uint64_t src_pitch,
		      int src_device, uint64_t width_bytes, uint64_t height, uint32_t device, void *cuda_stream)
{
	return guarded([&] {
		return status(xmem::cuda_copy_2d({ dst, dst_pitch, dst_device != 0 },
						 { src, src_pitch, src_device != 0 }, width_bytes, height, device,
						 cuda_stream));
	});
}

int xmem_cuda_stream_done(uint32_t device, void *cuda_stream)
{
	return guarded([&] {
		auto done = xmem::cuda_stream_done(device, cuda_stream);
		return done ? int(*done) : fail(done.error());
	});
}

int xmem_cuda_synchronize(uint32_t device, void *cuda_stream)
{
	return guarded([&] { return status(xmem::cuda_synchronize(device, cuda_stream)); });
}

} // extern "C"
