// connect.hpp - what a BufferPool handle from connect() keeps until its pool is settled
// (connect.cpp), and the two ways a handle gets its pool, which connect() shares with
// create() and open() (buffer_pool.cpp).
#pragma once

#include "pool_impl.hpp"

#include <xmem/xmem.hpp>

#include <memory>
#include <mutex>
#include <string>

namespace xmem {

struct BufferPool::Connecting {
	std::string name;
	std::string path; // socket_path(name), checked at connect()
	ConnectOptions options;
	// Serialises settling: one call makes or finds the pool, the others see it made.
	std::mutex lock;
};

// BufferPool::create()'s and open()'s pools, without a handle around them (a handle's
// destruction closes an owner's pool).
Result<std::shared_ptr<PoolImpl>> create_pool(std::string_view name, const PoolConfig &config);
Result<std::shared_ptr<PoolImpl>> open_pool(std::string_view name, const OpenOptions &options);

} // namespace xmem
