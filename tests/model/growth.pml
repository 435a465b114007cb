/* growth.pml - growth on demand of device memory (Publisher::grow, trim_one, claim;
 * Subscriber::map_slot, unmap_trimmed; docs/design.md, "Growth on demand"): one dynamic
 * device slot whose memory the owner commits, trims and commits again as new memory (a
 * generation), FRAMES frames published to two consumers that take them from their queues
 * or by index (get()), map the slot's memory by its generation and read it on the GPU;
 * one of them may be SIGKILLed at any step and reaped. tests/model/check.sh runs it
 * (runs "growth", "growth-kill"; mutants below).
 *
 * Properties (safety, exhaustive):
 * - a consumer reads a frame it holds through a mapping of the memory the frame was
 *   written into, and that memory is still the slot's (a held slot is never trimmed);
 * - the owner writes a frame only into committed memory, and never into memory a
 *   consumer's GPU read of an earlier frame may still be reading;
 * - the owner answers a consumer's request for a held slot's memory with memory, never
 *   "none";
 * - a consumer unmaps only after its own GPU reads are over;
 * - at the end (consumers done or killed and reaped) the only holder bits left are those
 *   of frames still queued: nothing leaks.
 *
 * Each step names its C++ function. Steps are sequentially consistent, as the code's
 * atomics on these words are (seq_cst). A trim may come at any moment (the I/O thread's
 * timer, or an acquire at the cap). The slot record's memory generation is a hint the
 * owner wrote (peers are honest here; tests/cuda/test_cuda_growth.cpp scribbles it).
 */

#ifndef FRAMES
#define FRAMES 3
#endif
#ifndef TRIES
#define TRIES 3
#endif
#ifndef KILL
#define KILL 0 /* 1: consumer 0 may be SIGKILLed at any step */
#endif

/* Seeded bugs (check.sh --mutants), each must give a counterexample:
 * M_NO_REMAP      map_slot() maps a slot once and never again (no generation compared)
 * M_TRIM_BY_STATE trim_one() takes a free-looking slot by its state alone, without
 *                 try_reclaim's handshake with get()
 * M_NO_CLAIM_WAIT claim() does not wait for the done words of the slot's earlier frame
 * M_UNMAP_NO_SYNC and M_TRIM_IGNORES_READS together: a consumer unmaps with its GPU
 *                 reads still queued, and the owner trims a slot whose reads are. Either
 *                 protection alone is enough (each mutant alone verifies): the owner trims
 *                 only memory no read is queued on, so a consumer's remap or unmap comes
 *                 after its reads; and a consumer synchronizes before it unmaps. */

#define FREE 0
#define WRITING 1
#define PUBLISHED 2
#define RECLAIMING 4
#define UNUSED 6

#define OWNER 1
#define BIT(r) (1 << (1 + (r)))

byte state = UNUSED; /* a dynamic class's record starts UNUSED */
byte holders = 0; /* bit 0 the owner, bit 1 + r consumer r */
byte seq = 0; /* meta.seq of the frame in the slot */
byte gens = 0; /* the owner's count of commits (memory_gens) */
byte own_gen = 0; /* the owner's memory_gen[i]: the memory committed now, 0 none */
byte rec_gen = 0; /* SlotRecord::memory_gen, the hint consumers compare */
byte frame_gen = 0; /* ghost: the memory the frame in the slot was written into */
byte entry[2]; /* each consumer's queue, one frame deep: its seq, 0 empty */
byte mapped[2]; /* consumer r's mapped_gen[i]: the memory it maps at the slot, 0 none */
byte reading[2]; /* ghost: the memory a GPU read of consumer r still queued reads, 0 none */
bool dead[2];
bool finished[2];

proctype Owner()
{
	byte k = 1;
	do
	:: k > FRAMES -> break
	:: k <= FRAMES ->
		/* acquire(): a free committed slot (try_reclaim: FREE, or PUBLISHED with no
		 * holder through RECLAIMING and a second look, the Dekker half against get()),
		 * or grow(): an UNUSED record's memory committed (cuMemCreate, export, map), its
		 * generation written, then WRITING; claim() holds it. */
		if
		:: atomic { state == UNUSED -> gens++; own_gen = gens; rec_gen = gens; state = WRITING };
			holders = holders | OWNER
		:: atomic { state == FREE -> state = WRITING; holders = holders | OWNER }
		:: atomic { state == PUBLISHED && holders == 0 -> state = RECLAIMING };
			if
			:: holders != 0 -> state = PUBLISHED; goto next /* a get() probe: back off */
			:: else -> atomic { state = WRITING; holders = holders | OWNER }
			fi
		:: else -> goto next /* no free slot now: acquire's wait */
		fi;
		/* claim(): wait_done, the consumers' GPU reads of the slot's earlier frame in this
		 * memory are over (their done words). */
#ifndef M_NO_CLAIM_WAIT
		(reading[0] != own_gen && reading[1] != own_gen);
#endif
		assert(own_gen != 0);
		assert(reading[0] != own_gen && reading[1] != own_gen);
		/* The frame's writes, then publish: queued for each consumer with room (its
		 * holder bit; a consumer whose get() set its bit first is not queued the frame,
		 * its get() holds it), then PUBLISHED, the owner's reference gone. */
		seq = k;
		frame_gen = own_gen;
		if
		:: atomic { !dead[0] && entry[0] == 0 && (holders & BIT(0)) == 0 -> entry[0] = k; holders = holders | BIT(0) }
		:: else
		fi;
		if
		:: atomic { !dead[1] && entry[1] == 0 && (holders & BIT(1)) == 0 -> entry[1] = k; holders = holders | BIT(1) }
		:: else
		fi;
		state = PUBLISHED;
		holders = holders & ~OWNER;
		k++;
next:
		skip
	/* drop-oldest (take_head): a queued frame taken back. */
	:: atomic { entry[0] != 0 -> entry[0] = 0; holders = holders & ~BIT(0) }
	:: atomic { entry[1] != 0 -> entry[1] = 0; holders = holders & ~BIT(1) }
	/* trim_one: a free committed slot taken as an acquire takes one, its GPU work over
	 * (ready and done words, looked at without waiting), its memory decommitted
	 * (unmapped and released here; the driver frees it once no consumer maps it), the
	 * record's generation 0, UNUSED. */
	:: own_gen != 0 ->
		if
		:: atomic { state == FREE -> state = WRITING }
#ifndef M_TRIM_BY_STATE
		:: atomic { state == PUBLISHED && holders == 0 -> state = RECLAIMING };
			if
			:: holders != 0 -> state = PUBLISHED; goto trimmed
			:: else -> state = WRITING
			fi
#else
		:: state == PUBLISHED && holders == 0 -> state = WRITING
#endif
		:: else -> goto trimmed
		fi;
#ifndef M_TRIM_IGNORES_READS
		if
		:: reading[0] == own_gen || reading[1] == own_gen -> state = FREE; goto trimmed
		:: else
		fi;
#endif
		atomic { own_gen = 0; rec_gen = 0 };
		state = UNUSED;
trimmed:
		skip
	od
}

/* Consumer r: TRIES steps, each a receive, a get(index) of the slot, or its GPU
 * finishing a read it queued. A frame held is mapped (map_slot) and read on the GPU
 * (a read queued), then released on the stream. Between frames it lets go of memory the
 * owner trimmed (unmap_trimmed). Killed at any step (unless): the reaper then clears its
 * bit and queue, and its GPU work and mappings end with its process. */
proctype Consumer(byte r)
{
	byte tries = 0, s, answer;
	bool held;
	{
		do
		:: tries == TRIES -> break
		:: else ->
			tries++;
			held = false;
			if
			/* receive(): the queue's holder bit becomes this reference. */
			:: atomic { entry[r] != 0 -> s = entry[r]; entry[r] = 0 }; held = true
			/* get(index): our bit (fetch_or), then the state (Dekker with try_reclaim).
			 * A bit already set is a frame queued for us: receive() takes it. */
			:: atomic { answer = holders & BIT(r); holders = holders | BIT(r) };
				if
				:: answer != 0 -> answer = 0
				:: else ->
					(state != RECLAIMING);
					if
					:: state != PUBLISHED -> holders = holders & ~BIT(r)
					:: else -> s = seq; held = true
					fi
				fi
			/* The GPU finishes a read it queued (its done word). */
			:: reading[r] != 0 -> reading[r] = 0
			fi;
			if
			:: held ->
				/* map_slot: the record's generation names the memory mapped here, or
				 * the owner is asked (PeerRole::slot, under growth_lock). */
				if
#ifndef M_NO_REMAP
				:: rec_gen != 0 && rec_gen == mapped[r] -> skip
#else
				:: mapped[r] != 0 -> skip
#endif
				:: else ->
					answer = own_gen;
					assert(answer != 0); /* held: never trimmed */
					if
					:: answer != mapped[r] ->
						/* unmap_one: this process's streams first (cuCtxSynchronize). */
#ifndef M_UNMAP_NO_SYNC
						reading[r] = 0;
#endif
						assert(reading[r] == 0);
						mapped[r] = answer
					:: else
					fi
				fi;
				/* Reading the frame it holds, in the memory it was written into. */
				assert(seq == s && mapped[r] == frame_gen && own_gen == frame_gen);
				reading[r] = mapped[r];
				holders = holders & ~BIT(r)
			:: else ->
				/* unmap_trimmed: a slot not held whose record names other memory (or
				 * none) is unmapped, after this process's streams. */
				if
				:: mapped[r] != 0 && rec_gen != mapped[r] ->
#ifndef M_UNMAP_NO_SYNC
					reading[r] = 0;
#endif
					assert(reading[r] == 0);
					mapped[r] = 0
				:: else
				fi
			fi
		od
	} unless { dead[r] };
	/* close: its GPU reads drained (drain_done), then gone. */
	if
	:: atomic { !dead[r] -> reading[r] = 0; finished[r] = true }
	:: dead[r]
	fi
}

/* Consumer 0 may be SIGKILLed at any step (KILL); the owner's reaper (Publisher::reap,
 * once the process has exited) clears its bit and its queue; its GPU work and its
 * mappings end with the process. */
proctype Killer()
{
	if
	:: KILL ->
		if
		:: atomic { !finished[0] -> dead[0] = true };
			atomic { entry[0] = 0; holders = holders & ~BIT(0); reading[0] = 0; mapped[0] = 0 }
		:: finished[0]
		fi
	:: else
	fi
}

init
{
	atomic {
		run Owner();
		run Consumer(0);
		run Consumer(1);
		run Killer()
	};
	(_nr_pr == 1);
	/* Only frames still queued hold the slot. */
	assert(holders == ((entry[0] != 0 -> BIT(0) : 0) | (entry[1] != 0 -> BIT(1) : 0)))
}
