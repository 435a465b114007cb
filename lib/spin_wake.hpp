// spin_wake.hpp - a consumer's wake=spin-before: the stream's frame period learned from
// the frames it takes, and the window near the next expected arrival in which receive()
// polls the queue instead of sleeping (docs/design.md, "Waking: spin-before").
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>

namespace xmem {

class SpinWake
{
public:
	explicit SpinWake(uint64_t budget_ns) : budget_(budget_ns) {}

	// Frame SEQ, published at TIMESTAMP_NS (the producer's CLOCK_MONOTONIC), was taken at
	// NOW_NS; WAITED: the queue was empty at the look before, so NOW_NS is when it
	// arrived (to within a wake-up, or a spin's few ns).
	void observe(uint64_t seq, uint64_t timestamp_ns, uint64_t now_ns, bool waited)
	{
		if (last_seq_ && seq == last_seq_ + 1 && timestamp_ns > last_ts_) {
			uint64_t d = timestamp_ns - last_ts_;
			if (period_ == 0) {
				period_ = d;
			} else {
				uint64_t off = d > period_ ? d - period_ : period_ - d;
				jitter_ = (7 * jitter_ + off) / 8;
				period_ = (7 * period_ + d) / 8;
			}
			learned_++;
		} else if (last_seq_ && seq != last_seq_ + 1) {
			learned_ = learned_ > 2 ? learned_ - 2 : 0; // a gap: trust the period a little less
		}
		last_seq_ = seq;
		last_ts_ = timestamp_ns;
		if (waited) {
			arrival_ = now_ns;
			arrival_seq_ = seq;
			// Published after the window opened, yet taken without a spin: the sleep
			// toward the window ended only now (this consumer's wake-up was that late).
			if (sleep_target_ && timestamp_ns >= sleep_target_)
				woke(now_ns);
		}
		sleep_target_ = 0;
	}

	// The consumer sleeps until TARGET_NS, a window's start.
	void sleeping_until(uint64_t target_ns) { sleep_target_ = target_ns; }

	// The consumer looks again at NOW_NS, the queue empty: if it slept toward a window
	// and that window has opened, how late its wake-up was is learned. Wake-ups are
	// late by the scheduler's latency (tens of µs on bare metal, hundreds in a VM or
	// on a busy machine): the spin must start that much earlier to be spinning when
	// the frame comes. The estimate rises quickly and falls slowly, so it follows the
	// late wake-ups rather than the typical one.
	void woke(uint64_t now_ns)
	{
		if (!sleep_target_ || now_ns < sleep_target_)
			return;
		// Past the budget it makes no difference (the lead is at most half of it): an
		// outlier (a stalled application) is not remembered for longer than that.
		uint64_t late = std::min(now_ns - sleep_target_, budget_);
		late_ = late > late_ ? (late_ + late) / 2 : (7 * late_ + late) / 8;
		sleep_target_ = 0;
	}

	// [start, start + budget) to spin in for the next frame, as of NOW_NS; none while the period is
	// unknown or the stream irregular (its jitter over half the budget or a quarter of
	// the period), when the next arrival is not within four periods of the last one
	// seen, or when this window was spun already.
	std::optional<std::pair<uint64_t, uint64_t>> window(uint64_t now_ns) const
	{
		if (learned_ < 4 || period_ == 0 || arrival_ == 0 || jitter_ > budget_ / 2 || jitter_ > period_ / 4)
			return std::nullopt;
		uint64_t predicted = arrival_ + period_ * (last_seq_ + 1 - arrival_seq_);
		for (int k = 0; predicted + budget_ / 2 <= now_ns; k++) {
			if (k == 4)
				return std::nullopt;
			predicted += period_;
		}
		// The spin starts as early as the stream's jitter asks (four times it, at least
		// 20 µs), and earlier by the consumer's learned wake-up lateness, at most half
		// the budget ahead; it may last the whole budget.
		uint64_t floor = std::min<uint64_t>(20'000, budget_ / 2);
		uint64_t lead = std::min(std::max(4 * jitter_, floor) + late_, budget_ / 2);
		uint64_t start = predicted > lead ? predicted - lead : 0;
		uint64_t end = start + budget_;
		if (end <= spun_until_)
			return std::nullopt;
		return std::pair{ start, end };
	}

	// A spin ended in the window that ends at END: not again in this one.
	void spun(uint64_t end) { spun_until_ = end; }

	// The learned wake-up lateness.
	uint64_t wake_late() const { return late_; }

private:
	uint64_t budget_;
	uint64_t period_ = 0; // EWMA of the publish interval
	uint64_t jitter_ = 0; // EWMA of its deviation
	uint64_t learned_ = 0; // intervals learned since the last gap
	uint64_t last_seq_ = 0;
	uint64_t last_ts_ = 0;
	uint64_t arrival_ = 0; // when a frame waited for arrived here
	uint64_t arrival_seq_ = 0;
	uint64_t spun_until_ = 0;
	uint64_t sleep_target_ = 0; // the window start slept toward (0: none)
	uint64_t late_ = 0; // how late wake-ups toward a window start come (see woke())
};

} // namespace xmem
