// peer_frames.hpp - what the CUDA tests and their peer (cuda_peer.cpp) agree on: where the
// peer is, and the words a producer writes into frame SEQ, so either side checks the other.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>

namespace xmem::test {

// The peer program: XMEM_CUDA_PEER (meson sets it), else its place in the build tree.
inline std::string cuda_peer_path()
{
	const char *p = std::getenv("XMEM_CUDA_PEER"); // NOLINT(concurrency-mt-unsafe): read-only
	return p ? p : "tests/cuda/xmem-cuda-peer";
}

// The 32-bit word every 4 bytes of frame SEQ hold; the last kFrameTail bytes hold
// frame_tail_word(SEQ), so a frame read half-written shows up as well as a stale one.
inline uint32_t frame_word(uint64_t seq)
{
	return uint32_t(seq * 2654435761u) | 1u;
}
inline uint32_t frame_tail_word(uint64_t seq)
{
	return ~frame_word(seq);
}
inline constexpr uint64_t kFrameTail = 4096;

} // namespace xmem::test
