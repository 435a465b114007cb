// frames.hpp - the test frame the peer process and the multi-process tests agree on:
// every payload byte depends on the frame's seq, and so does its metadata.
#pragma once

#include <xmem/xmem.hpp>

#include <chrono>
#include <cstdint>
#include <span>

namespace xmem::test {

// Byte I of frame SEQ: a slot reused (or scribbled on) while a consumer holds it
// no longer matches.
inline uint8_t pattern(uint64_t seq, uint64_t i)
{
	return uint8_t((seq * 131 + i * 7 + (i >> 8)) & 0xff);
}

inline void fill(std::span<std::byte> bytes, uint64_t size, uint64_t seq)
{
	for (uint64_t i = 0; i < size; i++)
		bytes[i] = std::byte(pattern(seq, i));
}

inline bool check(std::span<const std::byte> bytes, uint64_t seq)
{
	for (uint64_t i = 0; i < bytes.size(); i++)
		if (bytes[i] != std::byte(pattern(seq, i)))
			return false;
	return true;
}

// Acquires a slot, fills it as frame published + 1 (one publishing thread), sets
// pts/dts = seq * 1000, duration 1000, flags = seq, and publishes it.
inline Result<void> publish_test_frame(BufferPool &pool, std::chrono::nanoseconds timeout)
{
	auto frame = pool.acquire(timeout);
	if (!frame)
		return frame.error();
	uint64_t seq = pool.stats().published + 1;
	fill(frame->data_mut().value(), pool.slot_size(), seq);
	auto *m = frame->meta_mut().value();
	m->size = pool.slot_size();
	m->pts = seq * 1000;
	m->dts = seq * 1000;
	m->duration = 1000;
	m->flags = uint32_t(seq);
	return pool.publish(std::move(*frame));
}

// The same, a frame of SIZE bytes from a slot of SIZE bytes or more (the smallest size
// class with one free, or one made on demand): its slot index.
inline Result<uint32_t> publish_sized(BufferPool &pool, uint64_t size, std::chrono::nanoseconds timeout)
{
	auto frame = pool.acquire(size, timeout);
	if (!frame)
		return frame.error();
	uint64_t seq = pool.stats().published + 1;
	fill(frame->data_mut().value(), size, seq);
	auto *m = frame->meta_mut().value();
	m->size = size;
	m->pts = m->dts = int64_t(seq * 1000);
	m->duration = 1000;
	m->flags = uint32_t(seq);
	uint32_t index = frame->index();
	if (auto r = pool.publish(std::move(*frame)); !r)
		return r.error();
	return index;
}

} // namespace xmem::test
