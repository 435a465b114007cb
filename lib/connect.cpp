// connect.cpp - BufferPool::connect(), the seed's new(name): a handle that attaches to its
// pool, or makes it, whichever its first use needs, in any order with the other processes
// (docs/design.md, "Connect or create").
#include "connect.hpp"

namespace xmem {

namespace {

// How a handle from connect() attaches: as a consumer that holds at most one queued frame
// (it takes frames by meta index; a frame published to queues costs it one slot).
OpenOptions attach_options(const ConnectOptions &options, std::chrono::nanoseconds timeout)
{
	OpenOptions o;
	o.timeout = timeout;
	o.client = options.client;
	o.policy = Policy::latest;
	return o;
}

std::string seconds_text(std::chrono::nanoseconds t)
{
	return std::to_string(double(t.count()) / 1e9) + " s";
}

} // namespace

Result<std::shared_ptr<BufferPool>> BufferPool::connect(std::string_view name, const ConnectOptions &options)
{
	auto path = socket_path(name);
	if (!path)
		return path.error();
	if (options.timeout.count() < 0)
		return make_error(Errc::invalid_argument, "pool '" + std::string(name) + "': a negative timeout");
	auto handle = std::make_shared<BufferPool>(nullptr);
	handle->connecting_ = std::make_unique<Connecting>();
	handle->connecting_->name = std::string(name);
	handle->connecting_->path = std::move(path.value());
	handle->connecting_->options = options;
	// Attached at once when the pool is there; its errors (permission, version) now.
	if (auto settled = handle->settle(Settle::look); !settled)
		return settled.error();
	return handle;
}

PoolImpl *BufferPool::settled() const
{
	auto p = settle(Settle::look);
	return p ? *p : nullptr;
}

Result<PoolImpl *> BufferPool::attached(const char *call) const
{
	auto p = settle(Settle::look);
	if (!p || *p)
		return p;
	return make_error(Errc::not_found, "pool '" + connecting_->name + "': " + call +
						   " before this handle made or found the pool (acquire_*() and "
						   "preallocate_*() make it; get() and receive() wait for it)");
}

Result<PoolImpl *> BufferPool::settle(Settle wants, const FirstClass *first, bool *made) const
{
	if (attached_.load(std::memory_order_acquire))
		return impl_.get();
	Connecting &c = *connecting_;
	std::lock_guard lock(c.lock);
	if (attached_.load(std::memory_order_relaxed))
		return impl_.get();
	auto attach = [&](std::shared_ptr<PoolImpl> pool) -> Result<PoolImpl *> {
		impl_ = std::move(pool);
		attached_.store(true, std::memory_order_release);
		return impl_.get();
	};
	auto opened = open_pool(c.name, attach_options(c.options, std::chrono::nanoseconds(0)));
	if (opened)
		return attach(std::move(opened.value()));
	if (opened.code() != Errc::not_found || wants == Settle::look)
		return opened.code() == Errc::not_found ? Result<PoolImpl *>(nullptr) : opened.error();
	if (wants == Settle::wait) {
		opened = open_pool(c.name, attach_options(c.options, c.options.timeout));
		if (opened)
			return attach(std::move(opened.value()));
		if (opened.code() != Errc::not_found)
			return opened.error();
		return make_error(Errc::not_found, "pool '" + c.name + "': no process made it within " +
							   seconds_text(c.options.timeout) +
							   " (ConnectOptions::timeout): " + opened.error().message);
	}
	// Make it, with the first class the call asks for, growing within the caps.
	PoolConfig config;
	config.slot_size = first->size;
	config.slot_count = first->count;
	config.storage = first->storage;
	config.device = first->device;
	config.memory_cap = c.options.memory_cap;
	config.device_memory_cap = c.options.device_memory_cap;
	config.mode = c.options.mode;
	config.producer = c.options.client;
	auto created = create_pool(c.name, config);
	if (created) {
		if (made)
			*made = true;
		return attach(std::move(created.value()));
	}
	if (created.code() != Errc::owner_alive)
		return created.error();
	// Another process made it meanwhile: this one attaches (its acquires are leased).
	opened = open_pool(c.name, attach_options(c.options, c.options.timeout));
	if (!opened)
		return opened.error();
	return attach(std::move(opened.value()));
}

} // namespace xmem
