/*
 * xmem.pml - a Promela model of xmem's cross-process reference counting (lib/):
 * slot states, holder bits, the per-consumer rings and their claim protocol, each
 * consumer's own policy, the spill tier, get/get_mut/try_make_writable, release,
 * reaping a consumer that dies between any two steps, the owner closing or dying,
 * and the CUDA ready/pending/done words.
 * Run by tests/model/check.sh; tests/model/README.md says what is modelled, the
 * bounds, and what is not.
 *
 * Granularity: every access of lib/ to shared memory (atomic load, store, CAS,
 * fetch_or, fetch_and, exchange), every eventfd/socket/futex event and every
 * stream operation is one Promela step, sequentially consistent. Purely local
 * work (a process's local_refs, the owner's active list, policies, spill
 * allocator and counters, ghost bookkeeping) is folded into the neighbouring step.
 * Comments name the C++ function each step mirrors ("fn: what").
 *
 * Configuration (spin -D...): NS (slots: 3, or 2), NSP (spill buffers, 0..2), QS
 * (queue_size of every consumer that is not fifo-spill), QSP (a fifo-spill
 * consumer's: RC - 1 unless given), RC (ring_capacity; unless given, QS + 1, or
 * NS + NSP + 1 as in the code with a spill tier), POLICY (0 drop-oldest, 1
 * drop-new, 2 fifo, 3 fifo-spill: both consumers), P0/P1 (consumer 0's/1's own
 * policy, POLICY unless given), FB0/FB1 (their fallback, for fifo and fifo-spill:
 * 0 drop-oldest or 1 drop-new), GPU
 * (ready/pending/done words and streams), OWNER_CLOSES, OWNER_DIES, KILL (mask of
 * consumers that may be SIGKILLed), NF (frames published), and masks over the
 * consumers: PROBES (one get() probe), EXCL (try_make_writable / get_mut in place),
 * EARLY (handle closed before the end of stream, with or without a guard live);
 * PASSIVE1 (consumer 1 takes nothing, and is killed at the end).
 * UNPATCHED_EXCLUSIVE models take_exclusive/clear_holder_bit as lib/pool.cpp had
 * them before Finding 1's fix; by default the model has the fix (README.md).
 * NO_WAKEUP (the spill runs): a consumer with an empty queue waits for an entry or
 * the owner's hang-up directly, without the armed/eventfd handshake (checked by the
 * other runs, and untouched by the spill tier).
 * Seeded bugs: MUTATION_REAP_SKIPS_WORD, MUTATION_NO_PENDING_CHECK,
 * MUTATION_HEAD_STORE, MUTATION_HEAD_FIRST (take_entry moves the head, then claims
 * the cell), MUTATION_NO_CLAIM (take_entry by the head CAS alone, as before the
 * claims), MUTATION_SPILL_KEEPS_BIT (spill_one keeps a consumer's bit on the buffer
 * when its CAS fails), MUTATION_REAP_SKIPS_SPILL (reap leaves the spill buffers' bits).
 * SPIN_WAKE (a count): wake=spin-before's spin, up to that many windows for each
 * consumer in the mask SPINNERS (default: both)
 * (seeded bugs: MUTATION_SPIN_FORGETS_WRITE, the disarm forgets that the owner took
 * the arm; MUTATION_SPIN_SKIPS_ARM, a missed window sleeps unarmed).
 * MUTATION_ARM_BY_STORE: receive arms with a store, as before Finding 6's fix.
 * SYNC_AT_CLOSE (GPU) models Finding 2's fix: a consumer's streams are synchronized
 * before its socket closes (README.md, "Finding 2").
 * GPU with NSP > 0 (and NS 2): the spill tier of a device pool, the copy out of the
 * slot queued on the owner's spill stream (SpillCopier::spill), spill_ready, the
 * owner's done word. Seeded bugs: MUTATION_COLLECT_IGNORES_COPY (collect_spill frees
 * a buffer whose copy has not landed, as before 4fc2d35), MUTATION_SPILL_SKIPS_READY
 * (the copy does not wait for the slot's ready word), MUTATION_SPILL_SKIPS_DONE (no
 * mark_done of the owner: acquire does not wait for the copy),
 * MUTATION_NO_SPILL_WAIT (a consumer reads a spilled frame without waiting for
 * spill_ready). GPU_SETTLED: the 2-slot start state with no GPU work queued.
 * CLOSE_DRAINS_STREAMS and GONE_RECHECKS_SPILL model the two halves of a proposed
 * fix of Finding 7: shutdown() lets its streams' ready and spill_ready writes land
 * before it hangs up on the consumers, and wait_spilled loads spill_ready once more
 * when it finds the owner gone.
 * ACQUIRE_RETRIES_ON_PROGRESS and SPILL_TAKES_EXCLUSIVE model the fixes of Findings 3
 * and 4 (README.md; lib/ has them since 162b2f2): acquire() announces its wait before
 * spill_one() and looks again after any progress; spill_one() takes an EXCLUSIVE slot
 * too.
 * The spill tier as of 958ac71 and 316b65c: spill_one() holds the slot by the owner's
 * bit and, for system memory, copies without publish_lock (the consumers' generations
 * tell who was reaped meanwhile); a full tier calls spill_refused() (the hog's frame it
 * alone holds, by drop_in_place, else each consumer's fallback). SPILL_AHEAD (system
 * memory, NSP 1): the spill thread (Publisher::spill_loop) as a process of its own,
 * woken by a publish that left no slot free; acquire's look at spills_in_flight, with
 * an assertion of what acquire(0) would do there. Proposed fixes of what the model
 * found there (README.md, Findings 8 to 10): ACQUIRE_LOADS_IN_FLIGHT_FIRST (acquire
 * loads spills_in_flight before it looks for a free slot), FALLBACK_DROPS_FRAMES
 * (spill_refused's drop-oldest fallback drops the oldest queued frame in place, never
 * the end of stream), SPILL_RECHECKS_STATE (spill_one looks at the slot's state after
 * setting the owner's bit). The spill thread's full tier moves nothing (Finding 11);
 * AHEAD_REFUSES: the code before that fix, spill_refused there too. Seeded bugs: MUTATION_SPILL_SKIPS_GENERATION (the moves
 * after the unlocked copy ignore the generations), MUTATION_SPILL_NO_OWNER_BIT (the
 * slot is not held during the copy), MUTATION_SPILL_NO_NOTIFY (let_go_spilled_slot
 * wakes no acquire), MUTATION_ACQUIRE_IGNORES_SPILL (acquire(0) gives up with a spill
 * in flight, as before 2c34312), MUTATION_DROP_BY_STORE (drop_in_place stores its SKIP
 * without the CAS), MUTATION_REFUSED_DROPS_SHARED (spill_refused drops a frame of the
 * hog's that another consumer holds too: no property fails, README.md says why).
 */

#define NC 2 /* consumers (the model unrolls loops over them) */
#ifndef SPINNERS
#define SPINNERS 3
#endif
#ifndef NS
#define NS 3 /* slots (the model unrolls loops over them): 3, or 2 */
#endif
#ifndef NSP
#define NSP 0 /* spill buffers (spill_frames): 0, 1 or 2 */
#endif
#define NI (NS + NSP) /* PoolImpl::index_count(): slots, then spill buffers */
#ifndef QS
#define QS 1 /* queue_size of the consumers that are not fifo-spill */
#endif
#ifndef RC
#if NSP > 0
#define RC (NS + NSP + 1) /* ring_capacity as the code has it: slots + spill buffers + 1 */
#else
#define RC (QS + 1) /* ring_capacity: QS frames and the end-of-stream entry */
#endif
#endif
#ifndef NF
#define NF 1 /* frames the producer publishes (after those of init) */
#endif
#ifndef POLICY
#define POLICY 0
#endif
#ifndef P0
#define P0 POLICY
#endif
#ifndef P1
#define P1 POLICY
#endif
#ifndef FB0
#define FB0 0
#endif
#ifndef FB1
#define FB1 0
#endif
#ifndef KILL
#define KILL 3
#endif
/* Bit masks over the consumers: which may probe with get() once, write in place
 * (try_make_writable, get_mut), close their handle before the end of stream. */
#ifndef PROBES
#define PROBES 3
#endif
#ifndef EXCL
#define EXCL 3
#endif
#ifndef EARLY
#define EARLY 3
#endif

#if NS != 2 && NS != 3
#error NS is 2 or 3
#endif
#if defined(GPU) && !((NS == 3 && NSP == 0) || (NS == 2 && NSP > 0))
#error GPU runs have 3 slots and no spill tier, or 2 slots and a spill tier (the start states)
#endif
#if defined(SPILL_AHEAD) && \
	(defined(GPU) || NSP != 1 || NS != 2 || defined(OWNER_CLOSES) || defined(OWNER_DIES))
#error SPILL_AHEAD: system memory, 2 slots, 1 spill buffer, no close or death of the owner
#endif

/* xmem::Policy (latest is drop-oldest with a queue of one: QS 1 here) */
#define DROP_OLDEST 0
#define DROP_NEW 1
#define FIFO 2 /* "block" */
#define FIFO_SPILL 3
/* Publisher::served[c], the owner's own copy (constants here) */
/* (arithmetic, not (a -> b : c): spin refuses those inside inline arguments; c is 0 or 1) */
#define POL(c) (P0 * (1 - (c)) + P1 * (c))
#define FB(c) (FB0 * (1 - (c)) + FB1 * (c))
/* choose_targets: what a full queue does after fifo's wait (fifo-spill: at once) */
#define ACT(c) ((POL(c) >= FIFO) * FB(c) + (POL(c) < FIFO) * POL(c))
/* admit: the queue size; fifo-spill's is ring_capacity - 1 unless asked (QSP) */
#ifndef QSP
#define QSP (RC - 1)
#endif
#define QSZ(c) (QS + (POL(c) == FIFO_SPILL) * (QSP - QS))

/* layout::SlotState */
#define S_FREE 0
#define S_WRITING 1
#define S_PUBLISHED 2
#define S_EXCLUSIVE 3
#define S_RECLAIMING 4

/* layout::ConsumerState */
#define C_FREE 0
#define C_ACTIVE 1
#define C_DEAD 2

/*
 * Ring entry: (position << 32) | what in the code, (position << 4) | what here.
 * WHAT: a slot index (0..NS-1), kSpillEntry | r (W_SPILL + r), or a marker.
 */
#define W_SPILL 4
#define W_SKIP 13 /* kSkipEntry */
#define W_TAKEN 14 /* kTakenEntry */
#define W_EOS 15 /* kEosEntry */
#define W_NONE 255 /* take_head: nothing (empty queue) */
#define ENTRY(p, w) (((p) << 4) | (w))
#define E_POS(e) ((e) >> 4)
#define E_WHAT(e) ((e) & 15)
#define IS_FRAME(w) ((w) < W_SKIP) /* a slot or a spill buffer */
/* the index of a frame's record: slots, then spill buffers (PoolImpl::record) */
#define W_INDEX(w) ((w) + ((w) >= W_SPILL) * (NS - W_SPILL))
#define NONE 255

#define OWNER_BIT 1
#define CBIT(c) (1 << (1 + (c)))
#define LIVE(c) (!killed[c] && !exited[c])

/* ---- shared memory: ControlHeader, SlotRecord, ConsumerRecord; the spill tier's
 * SlotRecords follow the slots (index NS + r) ---- */
byte state[NI]; /* SlotRecord::state */
byte holders[NI]; /* SlotRecord::holders (bits 0..NC, all in word 0) */
byte mseq[NI]; /* SlotRecord::meta.seq */
byte head[NC]; /* ConsumerRecord::head */
byte tail[NC]; /* ConsumerRecord::tail */
byte ring[NC * RC]; /* ring_of(rec) */
byte cstate[NC]; /* ConsumerRecord::state */
bit armed[NC]; /* ConsumerRecord::armed */
bit detached[NC]; /* ConsumerRecord::detached */
bit pool_closed; /* ControlHeader::state == kPoolClosed */
bit bumped; /* ControlHeader::progress (futex word) changed since the owner read it */
byte owner_waiting; /* ControlHeader::owner_waiting */
/* progress.fetch_add(1) and FUTEX_WAKE. The producer thread is the only thread that
 * waits on the futex, so "changed since its load" is all a value could tell. */
#define BUMP bumped = 1
/* PoolImpl::notify_owner: owner_waiting.load; if set, progress.fetch_add + wake */
#define NOTIFY_OWNER \
	if \
	:: owner_waiting != 0 -> BUMP \
	:: else -> skip \
	fi

/* ---- kernel objects ---- */
byte evfd[NC]; /* consumer c's eventfd counter: each write adds one, a read takes them all */
bit chup[NC]; /* consumer c's socket hung up (exit, crash) */
bit ohup; /* the owner's sockets hung up (close or crash) */

/* ---- owner-private ---- */
byte plock; /* publish_lock: 0 free, else 1 (producer), 2 (I/O thread) or 3 (spill thread) */
bit cactive[NC]; /* Publisher::active */
byte pcount; /* Publisher::published_count */
bit shut; /* Publisher::shut */
bit io_stop; /* the io_stop eventfd */
#if NSP > 0
byte sp_used; /* bit r: buffer r is allocated (SpillTier::taken_) */
byte sp_list; /* bit r: buffer r is in Publisher::spilled_buffers (what collect_spill frees) */
byte cgen; /* bit c: Publisher::consumer_generation[c], bumped at reap (one reap each) */
#endif
#ifdef SPILL_AHEAD
bit spill_wanted; /* Publisher::spill_wanted (under publish_lock) */
byte sif; /* Publisher::spills_in_flight */
#endif

/* ---- ghosts: what the properties talk about; the protocol never reads them ---- */
byte lref[NC * NI]; /* PoolImpl::local_refs of consumer c (slots, then spill buffers) */
byte qcount[NC * NI]; /* entries of index x queued (unclaimed) in ring c */
byte gq[NC * RC]; /* the frame (seq) of the entry pushed into each ring cell */
byte tk[NC]; /* bit p: ring position p of consumer c was claimed */
byte fate[NC]; /* bit q: frame q was delivered to consumer c, or dropped for it by a policy */
byte lastseq[NC]; /* the last frame delivered to consumer c */
byte inplace[NI]; /* 1 + c while consumer c may write slot s in place */
bit killed[NC];
bit exited[NC];
bit reaped[NC];
bit odead; /* the owner process died */
bit pdone; /* the producer thread finished */
bit rdone; /* the I/O thread finished */
#ifdef SPILL_AHEAD
bit sidle; /* the spill thread waits on spill_cv */
#endif
#if NSP > 0
byte cpy; /* 1 + the slot whose payload the owner is copying into the tier */
bit wip; /* an in-place write of that slot began while the copy ran */
byte torn; /* bit r: spill buffer r's copy overlapped an in-place write of its slot */
#endif

#ifdef GPU
/* SyncRecord words: ready, pending (word 0), done[holder] */
byte ready[NS];
byte pending[NS];
byte done[NS * (NC + 1)];
#define DONE(s, h) done[(s) * (NC + 1) + (h)]
#define UNREADY 64 /* kDiedUnready: beyond any seq of the model */
/* Stream operations, run in order by a stream process. */
#define OP_WAIT_DONE 1 /* cuStreamWaitValue64(done[h] >= seq) */
#define OP_WRITE 2 /* the producer's kernels writing the slot */
#define OP_READY 3 /* cuStreamWriteValue64(ready = seq) */
#define OP_WAIT_READY 4 /* cuStreamWaitValue64(ready >= seq) */
#define OP_READ 5 /* the consumer's kernels reading the slot */
#define OP_DONE 6 /* cuStreamWriteValue64(done[h] = seq) */
chan oq = [4] of { byte, byte, byte, byte }; /* op, slot, holder, seq */
chan cq[NC] = [3] of { byte, byte, byte, byte };
bit reading[NC * NS]; /* ghost: consumer c's stream is inside OP_READ of slot s */
byte gwritten[NS]; /* ghost: the frame whose GPU writes completed in slot s */
bit obusy; /* ghost: a stream is inside an operation */
bit cbusy[NC];
#if NSP > 0
/* The spill tier of a device pool: a spill buffer's SlotRecord words, and the owner's
 * spill stream (SpillCopier::stream_). */
#define OP_COPY 7 /* cuMemcpyDtoHAsync: slot -> spill buffer */
#define OP_SPILL_READY 8 /* cuStreamWriteValue64(spill_ready = spill_seq) */
byte sseq[NSP]; /* SlotRecord::spill_seq, and the owner's copy Publisher::spill_seqs */
byte sready[NSP]; /* SlotRecord::spill_ready */
byte scount; /* Publisher::spill_count (owner-private) */
chan spq = [4 * NSP + 1] of { byte, byte, byte, byte }; /* op, slot, buffer or holder, seq */
bit sbusy; /* ghost: the spill stream is inside an operation */
byte bufseq[NSP]; /* ghost: the frame whose bytes buffer r holds (0: none whole) */
byte scopy; /* ghost: bit r, a copy into buffer r is queued and has not run */
byte cpend[NS]; /* ghost: the frame a queued spill copy of slot s is to read (0: none) */
byte srd[NSP]; /* ghost: CBIT(c), consumer c is reading buffer r */
#endif
#endif

/* ------------------------------------------------------------------------ */
/* Owner-side helpers                                                       */
/* ------------------------------------------------------------------------ */

inline lock(id)
{
	atomic { plock == 0 -> plock = id }
}

#define SLOT_IS_FREE(i) \
	(state[i] == S_FREE || ((state[i] == S_PUBLISHED || state[i] == S_EXCLUSIVE) && holders[i] == 0))
#if NS == 3
#define ANY_FREE (SLOT_IS_FREE(0) || SLOT_IS_FREE(1) || SLOT_IS_FREE(2))
#else
#define ANY_FREE (SLOT_IS_FREE(0) || SLOT_IS_FREE(1))
#endif

/* Publisher::try_reclaim(i, to). Sets ok. */
inline try_reclaim(i, to, ok, s0)
{
	s0 = state[i]; /* try_reclaim: state.load */
	if
	:: s0 == S_FREE ->
		d_step { /* try_reclaim: CAS FREE -> to */
			if
			:: state[i] == S_FREE -> state[i] = to; ok = 1
			:: else -> ok = 0
			fi;
			s0 = 0
		}
	:: s0 == S_PUBLISHED || s0 == S_EXCLUSIVE ->
		if
		:: holders[i] != 0 -> ok = 0; s0 = 0 /* try_reclaim: holders_of */
		:: else ->
			d_step { /* try_reclaim: CAS s -> RECLAIMING */
				if
				:: state[i] == s0 -> state[i] = S_RECLAIMING; ok = 1
				:: else -> ok = 0; s0 = 0
				fi
			}
			if
			:: ok ->
				if
				:: holders[i] == 0 -> /* try_reclaim: holders_of, second look */
					state[i] = to; s0 = 0 /* try_reclaim: state.store(to) */
				:: else ->
					state[i] = s0; ok = 0; s0 = 0 /* try_reclaim: state.store(s) */
				fi
			:: else -> skip
			fi
		fi
	:: else -> ok = 0; s0 = 0
	fi
}

/* The cell of ring position P of consumer C */
#define CELL(c, p) ((c) * RC + (p) % RC)

/* Ghost, in the step of a claim (cell CAS -> TAKEN) of entry E at position H of
 * ring C, by its consumer or the owner: one claimer per entry. */
#define CLAIM_GHOST(c, h, e) \
	assert(!(tk[c] & (1 << (h)))); /* one taker per entry */ \
	tk[c] = tk[c] | (1 << (h)); \
	if \
	:: IS_FRAME(E_WHAT(e)) -> \
		assert(qcount[(c) * NI + W_INDEX(E_WHAT(e))] > 0); \
		qcount[(c) * NI + W_INDEX(E_WHAT(e))]-- \
	:: else -> skip \
	fi

/* Publisher::let_go(c, what): consumer c's bit on the frame's slot or spill buffer */
inline let_go(c, x)
{
	d_step { /* let_go: holders.fetch_and(~bit) */
		assert(holders[x] & CBIT(c)); /* released once */
		holders[x] = holders[x] & ~CBIT(c)
	}
}

/*
 * Publisher::take_head(c): claims the entry at c's head as the consumer's
 * take_entry() does (cell CAS, then head CAS). Sets w: what it claimed, or W_NONE
 * (empty queue). The claim is a drop: the frame's fate for c is settled.
 */
inline take_head(c)
{
	do
	:: h = head[c]; /* take_head: head.load */
		if
		:: tail[c] == h -> w = W_NONE; h = 0; break /* take_head: tail.load */
		:: else -> skip
		fi;
		e = ring[CELL(c, h)]; /* take_head: cell.load */
		if
		:: E_POS(e) != h ->
			/* take_head: head.load: the consumer moved on. The same head would mean
			 * the consumer wrote its ring (hang-up): never, with the model's consumers. */
			assert(head[c] != h);
			d_step { h = 0; e = 0 }
		:: else ->
			if
			:: E_WHAT(e) == W_TAKEN -> ok = 1 /* claimed by the consumer: help it on */
			:: else ->
				d_step { /* take_head: cell CAS e -> (h, TAKEN) */
					if
					:: ring[CELL(c, h)] == e ->
						ring[CELL(c, h)] = ENTRY(h, W_TAKEN);
						ok = 1;
						CLAIM_GHOST(c, h, e);
						if
						:: IS_FRAME(E_WHAT(e)) -> fate[c] = fate[c] | (1 << gq[CELL(c, h)])
						:: else -> skip
						fi
					:: else -> ok = 0
					fi
				}
			fi;
			if
			:: ok ->
				d_step { /* take_head: head CAS h -> h + 1 */
					if
					:: head[c] == h -> head[c] = h + 1
					:: else -> skip
					fi;
					ok = 0;
					h = 0
				}
				if
				:: E_WHAT(e) != W_TAKEN -> w = E_WHAT(e); e = 0; break
				:: else -> e = 0
				fi
			:: else -> d_step { h = 0; e = 0 }
			fi
		fi
	od
}

/* Publisher::drop_oldest(c). Sets dr: something was taken off c's queue. */
inline drop_oldest(c)
{
	take_head(c);
	if
	:: w == W_NONE -> dr = 0; w = 0
	:: IS_FRAME(w) -> x = W_INDEX(w); w = 0; let_go(c, x); d_step { x = 0; dr = 1 }
	:: else -> dr = 1; w = 0 /* EOS or SKIP: no frame */
	fi
}

/* Publisher::push(c, what): ghost: the frame sq in the cell */
inline push(c, what, sq, a)
{
	d_step { /* push: ring[tail].store((tail << 32) | what), tail.store (the entry is read after the tail) */
		ring[CELL(c, tail[c])] = ENTRY(tail[c], what);
		gq[CELL(c, tail[c])] = sq;
		tail[c] = tail[c] + 1;
		if
		:: IS_FRAME(what) -> qcount[c * NI + W_INDEX(what)]++
		:: else -> skip
		fi
	}
#ifndef NO_WAKEUP
	d_step { a = armed[c]; armed[c] = 0 } /* push: armed.load() && armed.exchange(0) */
	if
	:: a -> evfd[c]++; a = 0 /* push: write(eventfd) */
	:: else -> skip
	fi
#endif
}

/*
 * wait_for_progress(header, COND, deadline) in the owner. TMO: whether the deadline
 * may pass (fifo's block timeout). acquire() waits without one here, so that a lost
 * wake-up shows as a deadlock instead of a timeout. Sets res.
 */
inline wait_progress(COND, TMO, res, seen)
{
	do
	:: COND -> res = 1; break /* wait_for_progress: done() */
	:: else ->
		if
		:: TMO -> res = 0; break /* deadline passed */
		:: else -> skip
		fi;
		owner_waiting++; /* wait_for_progress: owner_waiting.fetch_add */
		bumped = 0; /* wait_for_progress: seen = progress.load */
		if
		:: COND -> owner_waiting--; res = 1; break /* done() again */
		:: else ->
			if
			:: bumped -> skip /* futex_wait(progress, seen) returns: progress != seen */
			:: TMO -> skip
			fi;
			owner_waiting-- /* wait_for_progress: owner_waiting.fetch_sub */
		fi
	od
}

/* publish: choose_targets, for consumer c (its own policy, Publisher::served[c]) */
inline choose_target(c)
{
	if
	:: cactive[c] ->
		take = !detached[c]; /* choose_targets: detached.load */
		do
		:: !take -> break
		:: else ->
			h = head[c]; /* choose_targets: head.load */
			if
			:: tail[c] - h < QSZ(c) -> h = 0; break /* choose_targets: tail.load */
			:: else -> h = 0
			fi;
			if
			:: POL(c) == FIFO ->
				wait_progress((shut || cstate[c] != C_ACTIVE || detached[c] || tail[c] - head[c] < QSZ(c)),
					      true, res, seen);
				if
				:: shut || cstate[c] != C_ACTIVE || detached[c] -> take = 0; res = 0
				:: else -> skip
				fi
			:: else -> skip
			fi;
			if
			:: !take -> break
			:: take && res -> res = 0 /* moved: look again */
			:: take && !res && ACT(c) == DROP_NEW -> /* drop-new, or the fallback: this frame */
				d_step { fate[c] = fate[c] | (1 << seq); take = 0 };
				break
			:: take && !res && ACT(c) == DROP_OLDEST -> /* drop-oldest, or the fallback */
				drop_oldest(c);
				dr = 0
			fi
		od;
		if
		:: take -> masks = masks | CBIT(c); take = 0
		:: else -> skip
		fi
	:: else -> skip
	fi
}

/* publish: the push to target c, and the detached re-check */
inline push_target(c)
{
	if
	:: (masks & CBIT(c)) && !(taken & CBIT(c)) ->
		push(c, i, seq, a);
		if
		:: detached[c] -> /* publish: detached.load after the push */
			do
			:: drop_oldest(c);
				if
				:: dr -> dr = 0
				:: else -> break
				fi
			od
		:: else -> skip
		fi
	:: (masks & CBIT(c)) && (taken & CBIT(c)) -> /* its get() probe holds it: counted dropped */
		fate[c] = fate[c] | (1 << seq)
	:: else -> skip
	fi
}

/* end_of_stream(), for consumer c */
inline eos_target(c)
{
	if
	:: cactive[c] ->
		do
		:: tail[c] - head[c] >= RC -> drop_oldest(c); dr = 0
		:: else -> break
		od;
		push(c, W_EOS, 0, a)
	:: else -> skip
	fi
}

#if NSP > 0
/* ------------------------------------------------------------------------ */
/* The spill tier (Publisher::spill_one, collect_spill), publish_lock held.  */
/* ------------------------------------------------------------------------ */

/* collect_spill, buffer r (in spilled_buffers: not one whose copy runs without the
 * lock): holders_of(rec) == 0 -> state.store(FREE), tier.free(r).
 * One step: only the owner sets a bit on a buffer, and nobody else reads its state.
 * A device pool's buffer also needs its copy landed: spill_ready.load() has reached
 * spill_seqs[r] (both words only move one way, so loading them in one step with the
 * holders hides nothing). */
#if defined(GPU) && !defined(MUTATION_COLLECT_IGNORES_COPY)
#define COPY_LANDED(r) (sready[r] >= sseq[r])
#else
#define COPY_LANDED(r) true /* system memory, or the mutant (the code before 4fc2d35) */
#endif
inline collect_one(r)
{
	d_step {
		if
		:: (sp_list & (1 << r)) && holders[NS + r] == 0 && COPY_LANDED(r) ->
#if defined(GPU)
			/* never freed (its pages may go to another buffer) under a queued copy */
			assert(!(scopy & (1 << r)));
#endif
			state[NS + r] = S_FREE;
			sp_used = sp_used & ~(1 << r);
			sp_list = sp_list & ~(1 << r)
		:: else -> skip
		fi
	}
}
#if NSP > 1
#define COLLECT_SPILL collect_one(0); collect_one(1)
#else
#define COLLECT_SPILL collect_one(0)
#endif

/* spill_one, slot i, holder c: a fifo-spill consumer, active, with slot i queued at
 * some position k in [head, tail) (sets tq = k), or cand = 0. One step: served[c]
 * (owner-private), state.load, head.load, tail.load and the ring loads. */
inline spill_scan_consumer(c, i, tq)
{
	if
	:: cand && (hw & CBIT(c)) ->
		d_step {
			cand = 0;
			if
			:: POL(c) == FIFO_SPILL && cstate[c] == C_ACTIVE ->
				tq = head[c];
				do
				:: tq == tail[c] -> tq = 0; break
				:: tq != tail[c] && ring[CELL(c, tq)] == ENTRY(tq, i) -> cand = 1; break
				:: tq != tail[c] && ring[CELL(c, tq)] != ENTRY(tq, i) -> tq++
				od
			:: else -> skip
			fi
		}
	:: else -> skip
	fi
}

/* spill_one's look at slot i: a candidate when it is PUBLISHED and every holder is
 * a fifo-spill consumer that has the frame queued. The code keeps the candidate used
 * last (Belady); the model may keep any candidate (a superset), but keeps one. */
inline spill_scan(i)
{
	d_step { /* spill_one: state.load, holders[w].load */
		if
		:: state[i] == S_PUBLISHED -> hw = holders[i]
#ifdef SPILL_TAKES_EXCLUSIVE
		/* proposed fix (README.md, "Finding 4"): an EXCLUSIVE slot qualifies too (a
		 * holder writing in place holds it by a reference, not a queue entry) */
		:: state[i] == S_EXCLUSIVE -> hw = holders[i]
#endif
		:: else -> hw = 0
		fi
	}
	if
	:: hw != 0 && !(hw & OWNER_BIT) ->
		cand = 1;
		spill_scan_consumer(0, i, tq0);
		spill_scan_consumer(1, i, tq1);
		if
		:: cand -> d_step { best = i; qm = hw; q0 = tq0; q1 = tq1; cand = 0; tq0 = 0; tq1 = 0; hw = 0 }
		:: cand && best != NONE -> d_step { cand = 0; tq0 = 0; tq1 = 0; hw = 0 } /* the earlier one */
		:: !cand -> d_step { tq0 = 0; tq1 = 0; hw = 0 }
		fi
	:: else -> hw = 0
	fi
}

/* Publisher::drop_in_place(c, q, what): consumer c's entry at position q, naming WH,
 * becomes SKIP by a CAS (the consumer may claim it first), then its bit goes; counted
 * dropped. Sets dr: dropped. */
inline drop_in_place(c, q, wh)
{
#ifdef MUTATION_DROP_BY_STORE
	d_step { /* the mutant stores SKIP whatever the cell holds by then */
		if
		:: ring[CELL(c, q)] == ENTRY(q, wh) ->
			qcount[(c) * NI + W_INDEX(wh)]--;
			fate[c] = fate[c] | (1 << gq[CELL(c, q)])
		:: else -> skip
		fi;
		ring[CELL(c, q)] = ENTRY(q, W_SKIP);
		dr = 1
	}
#else
	d_step { /* drop_in_place: cell CAS (q, what) -> (q, SKIP) */
		if
		:: ring[CELL(c, q)] == ENTRY(q, wh) ->
			ring[CELL(c, q)] = ENTRY(q, W_SKIP);
			qcount[(c) * NI + W_INDEX(wh)]--;
			fate[c] = fate[c] | (1 << gq[CELL(c, q)]);
			dr = 1
		:: else -> dr = 0 /* the consumer took it meanwhile */
		fi
	}
#endif
	if
	:: dr -> x = W_INDEX(wh); let_go(c, x); x = 0 /* drop_in_place: let_go(c, what) */
	:: else -> skip
	fi
}

/* spill_refused: consumer C loses a queued frame by drop_in_place, oldest first or, for
 * the hog whose fallback is drop-new, newest first; with SOLE, only a frame it alone
 * holds (the hog's rule). The first drop ends it; sets dr. head.load and tail.load in
 * one step (publish_lock is held: the tail stays). Per position, the cell load and
 * sole_holder(record(index), 1 + c) in one step: a cell the consumer claims between the
 * two fails drop_in_place's CAS in the code and shows TAKEN here, and the loop goes on
 * either way. */
inline refused_drop(c, sole)
{
	d_step { h = head[c]; tl = tail[c]; n = 0 }
	do
	:: dr || n == tl - h -> break
	:: else ->
		d_step {
			if
			:: sole && FB(c) == DROP_NEW -> k = tl - 1 - n
			:: else -> k = h + n
			fi;
			e = ring[CELL(c, k)];
			if
#ifdef MUTATION_REFUSED_DROPS_SHARED
			:: E_POS(e) == k && IS_FRAME(E_WHAT(e)) -> ok = 1 /* the mutant: held by others too */
#else
			:: E_POS(e) == k && IS_FRAME(E_WHAT(e)) && (!sole || holders[W_INDEX(E_WHAT(e))] == CBIT(c)) -> ok = 1
#endif
			:: else -> ok = 0
			fi
		}
		if
		:: ok -> ok = 0; drop_in_place(c, k, E_WHAT(e))
		:: else -> skip
		fi;
		d_step { n++; k = 0; e = 0 }
	od;
	atomic { h = 0; tl = 0; n = 0 } /* (atomic: a break may not jump into a d_step) */
}

/* spill_refused, when the hog's rule moved nothing: consumer c's fallback for frame
 * `best` queued at q: drop-oldest: drop_oldest(c), which takes whatever entry is at
 * its head, an end of stream too (README.md, "Finding 9"; FALLBACK_DROPS_FRAMES, the
 * proposed fix: its oldest queued frame by drop_in_place, never a marker); drop-new:
 * drop_in_place, this frame. */
inline spill_fallback(c, q)
{
	if
	:: qm & CBIT(c) ->
		if
		:: FB(c) == DROP_OLDEST ->
#ifdef FALLBACK_DROPS_FRAMES
			refused_drop(c, 0)
#else
			drop_oldest(c)
#endif
		:: else -> drop_in_place(c, q, best)
		fi;
		mv = mv | dr;
		dr = 0
	:: else -> skip
	fi
}

/* spill_refused's look at consumer c's queue for last_reader: whether it holds a
 * spill entry, unclaimed, in [head, tail) (head.load, tail.load, the cell loads). */
inline refused_look(c)
{
	if
	:: cactive[c] && POL(c) == FIFO_SPILL ->
		k = head[c];
		do
		:: k == tail[c] -> k = 0; break
		:: k != tail[c] && E_POS(ring[CELL(c, k)]) == k && E_WHAT(ring[CELL(c, k)]) >= W_SPILL &&
		   E_WHAT(ring[CELL(c, k)]) < W_SKIP -> hs = hs | (1 << (c)); k = 0; break
		:: else -> k++
		od
	:: else -> skip
	fi
}

/* Publisher::spill_refused(best, best_queued), the tier full. The code counts each
 * buffer for its last reader (the fifo-spill consumer that has it queued furthest from
 * its head) and picks the consumer counted the most bytes (the hog); the model's hog is
 * any consumer whose look found a spill entry queued, a superset (the code's has the
 * entries it counted). The hog loses a frame it alone holds (collect_spill then frees
 * its buffer); if it loses none, frame `best`'s consumers lose it, each by its fallback.
 * Sets res: something moved. */
inline spill_refused()
{
	/* The looks at both queues in one step: publish_lock is held, so no spill entry
	 * appears meanwhile (only spill_one's moves, under the lock, make them), and one
	 * seen by a later look was there at the first; a snapshot at the first look sees
	 * every entry the code's looks see, one at the last sees none that they missed. */
	d_step {
		refused_look(0);
		refused_look(1)
	}
	if
	:: hs & 1 -> hog = 0
	:: hs & 2 -> hog = 1
	:: hs == 0 -> hog = NONE
	fi;
	if
	:: hog != NONE ->
		refused_drop(hog, 1);
		d_step { mv = dr; dr = 0 }
		COLLECT_SPILL /* spill_refused: collect_spill */
	:: else -> skip
	fi;
	if
	:: !mv ->
		spill_fallback(0, q0);
		spill_fallback(1, q1)
	:: else -> skip
	fi;
	d_step { res = mv; mv = 0; hs = 0; hog = 0 }
}

/* spill_one: consumer c's entry at q moves from slot `best` to buffer r by a CAS;
 * if the consumer claimed it first it keeps the slot, and the buffer loses its bit. */
inline spill_move(c, q)
{
	if
	:: qm & CBIT(c) ->
		d_step { /* spill_one: cell CAS (q, best) -> (q, kSpillEntry | r) */
			if
			:: ring[CELL(c, q)] == ENTRY(q, best) ->
				ring[CELL(c, q)] = ENTRY(q, W_SPILL + r);
				qcount[c * NI + best]--;
				qcount[c * NI + NS + r]++;
				ok = 1
			:: else -> ok = 0
			fi
		}
		if
		:: ok -> ok = 0; let_go(c, best) /* spill_one: let_go(c, best) */
		:: else ->
#ifndef MUTATION_SPILL_KEEPS_BIT
			d_step { /* spill_one: to.holders.fetch_and(~bit) */
				assert(holders[NS + r] & CBIT(c));
				holders[NS + r] = holders[NS + r] & ~CBIT(c)
			}
#else
			skip /* the mutant leaves the buffer's bit */
#endif
		fi
	:: else -> skip
	fi
}

#ifdef SPILL_AHEAD
#define SIF_INC sif = sif + 1 /* spills_in_flight.fetch_add */
#define SIF_DEC sif = sif - 1 /* spills_in_flight.fetch_sub */
#else
#define SIF_INC skip /* read by acquire's wait only with a spill thread */
#define SIF_DEC skip
#endif

/* The spill's copy of slot `best` reads the frame whose meta it copied under the lock:
 * the slot is not freed, reclaimed or rewritten meanwhile (RECLAIMING: a reclaim that
 * sees the owner's bit and backs off). */
#define COPY_OK \
	assert((state[best] == S_PUBLISHED || state[best] == S_EXCLUSIVE || state[best] == S_RECLAIMING) && \
	       mseq[best] == mseq[NS + r])

/* spill_one, after the buffer's record is written: each consumer still the same (its
 * generation unchanged) holds the buffer; its entry moves by a CAS (spill_move); the
 * owner lets go of the slot (let_go_spilled_slot); collect_spill. */
inline spill_moves()
{
	d_step { /* spill_one: to.state.store(PUBLISHED), spilled_buffers.push_back */
		state[NS + r] = S_PUBLISHED;
		sp_list = sp_list | (1 << r)
	}
	spill_move(0, q0);
	spill_move(1, q1);
#ifdef GPU
	/* let_go_spilled_slot: holders[0].fetch_and(~owner bit), notify_owner, folded into
	 * collect_spill: in the GPU runs only publish_lock's holders read this slot's holder
	 * word, and the only waiter is the thread that called */
	d_step {
		assert(holders[best] & OWNER_BIT);
		holders[best] = holders[best] & ~OWNER_BIT;
		if
		:: owner_waiting != 0 -> BUMP
		:: else -> skip
		fi;
		COLLECT_SPILL /* spill_one: collect_spill */
	}
#else
	d_step { /* let_go_spilled_slot: holders[0].fetch_and(~owner bit), spills_in_flight.fetch_sub */
#ifndef MUTATION_SPILL_NO_OWNER_BIT
		assert(holders[best] & OWNER_BIT);
		holders[best] = holders[best] & ~OWNER_BIT;
#endif
		SIF_DEC
#ifndef SPILL_AHEAD
		;
		/* notify_owner: the only waiter is the thread that called (folded) */
		if
		:: owner_waiting != 0 -> BUMP
		:: else -> skip
		fi
#endif
	}
#if defined(SPILL_AHEAD) && !defined(MUTATION_SPILL_NO_NOTIFY)
	NOTIFY_OWNER; /* let_go_spilled_slot: notify_owner (an acquire may wait for the slot) */
#endif
	COLLECT_SPILL /* spill_one: collect_spill */
#endif
}

#ifndef GPU
/* spill_one, system memory, from the owner's bit on (set by the caller): generations
 * and the record under the lock, the payload memcpy without it, then the moves. */
inline spill_copy(me)
{
	d_step { /* spill_one: generations = consumer_generation (owner-private), to.meta = slot.meta */
		gs = cgen;
		mseq[NS + r] = mseq[best]
	}
	plock = 0; /* spill_one: lock.unlock(): the payload memcpy without publish_lock */
#if EXCL
	d_step { /* the memcpy begins */
		COPY_OK;
		cpy = 1 + best;
		wip = (inplace[best] != 0)
	}
	d_step { /* the memcpy ends */
		COPY_OK;
		if
		:: wip || inplace[best] != 0 -> torn = torn | (1 << r)
		:: else -> torn = torn & ~(1 << r)
		fi;
		cpy = 0;
		wip = 0
	}
#else
	d_step { /* the memcpy (no in-place writer in these runs: one step) */
		COPY_OK;
		torn = torn & ~(1 << r)
	}
#endif
	/* spill_one: lock.lock(); spill_ready.store (read by device-pool consumers only) */
	lock(me);
	d_step { /* spill_one: the mask of the consumers whose generation is unchanged (not
		  * reaped while the lock was let go); to.holders.store(mask) */
#ifndef MUTATION_SPILL_SKIPS_GENERATION
		qm = qm & ~((gs ^ cgen) << 1);
#endif
		holders[NS + r] = qm;
		gs = 0
	}
	spill_moves();
	res = 1
}
#endif

/* Publisher::spill_one(lock, deadline), publish_lock held by ME (1: the producer's
 * acquire, 3: the spill thread, which spills ahead: a full tier moves nothing there).
 * Sets res: true when a frame was spilled or spill_refused moved one. */
inline spill_one(me)
{
	COLLECT_SPILL;
	best = NONE;
	spill_scan(0);
	spill_scan(1);
#if NS > 2
	spill_scan(2);
#endif
	if
	:: best == NONE -> res = 0
	:: else ->
		/* SpillTier::allocate (owner-private): a free record, or none: no record
		 * free, or (any time) no run of pages / fallocate failed */
		if
		:: !(sp_used & 1) -> r = 0
#if NSP > 1
		:: !(sp_used & 2) -> r = 1
#endif
		:: r = NONE
		fi;
		if
#ifndef AHEAD_REFUSES
		:: r == NONE && me == 3 -> /* spill_one(ahead): the tier is full: nothing moves */
			res = 0
		:: r == NONE && me != 3 -> /* spill_one: the tier is full: spill_refused(best, best_queued) */
			spill_refused()
#else
		:: r == NONE -> /* before Finding 11's fix: spill_refused on the spill thread too */
			spill_refused()
#endif
		:: else ->
#ifdef GPU
			d_step { /* spill_one: spills_in_flight.fetch_add, slot.holders[0].fetch_or(owner
				  * bit) (in these runs only publish_lock's holders read this slot's
				  * holder word: folded), to.meta = slot.meta, to.spill_seq =
				  * spill_seqs[r] = ++spill_count */
				assert(holders[NS + r] == 0 && state[NS + r] == S_FREE); /* nobody holds it */
				/* never re-allocated while a copy into it is queued or a holder reads it */
				assert(!(scopy & (1 << r)) && srd[r] == 0);
				sp_used = sp_used | (1 << r);
				holders[best] = holders[best] | OWNER_BIT;
				mseq[NS + r] = mseq[best];
				scount++;
				sseq[r] = scount
			}
			/* SpillCopier::spill on the spill stream: wait_ready(best, seq, stream)
			 * (ready.load; cuStreamWaitValue64 unless reached), cuMemcpyDtoHAsync,
			 * cuStreamWriteValue64(spill_ready = spill_seq): the enqueues are local,
			 * folded into the load */
			atomic {
#ifndef MUTATION_SPILL_SKIPS_READY
				if
				:: ready[best] < mseq[best] -> spq ! OP_WAIT_READY, best, 0, mseq[best]
				:: else -> skip
				fi;
#endif
				spq ! OP_COPY, best, r, mseq[best];
				scopy = scopy | (1 << r);
				cpend[best] = mseq[best];
				spq ! OP_SPILL_READY, 0, r, sseq[r]
			}
#ifndef MUTATION_SPILL_SKIPS_DONE
			atomic { /* spill: mark_done(best, owner bit, seq, spill stream): pending.fetch_or,
				  * then cuStreamWriteValue64(done[0] = seq) (local) */
				pending[best] = pending[best] | OWNER_BIT;
				spq ! OP_DONE, best, 0, mseq[best]
			}
#endif
			holders[NS + r] = qm; /* spill_one: to.holders.store(mask) */
			spill_moves();
			res = 1
#else
			d_step { /* spill_one: allocate (owner-private), spills_in_flight.fetch_add,
				  * slot.holders[0].fetch_or(owner bit) */
				assert(holders[NS + r] == 0 && state[NS + r] == S_FREE); /* nobody holds it */
				sp_used = sp_used | (1 << r);
				SIF_INC;
#ifndef MUTATION_SPILL_NO_OWNER_BIT
				holders[best] = holders[best] | OWNER_BIT
#else
				skip
#endif
			}
#ifdef SPILL_RECHECKS_STATE
			/* proposed fix (README.md, "Finding 10"): state.load after the owner's bit,
			 * get()'s handshake with try_reclaim (RECLAIMING: look again until the
			 * reclaim went on or backed off). WRITING (or FREE): the producer took the
			 * slot since the look; the bit is its reference now (one bit cannot stand
			 * for two): left set; spills_in_flight.fetch_sub, tier.free(r),
			 * notify_owner, and no spill */
			if
			:: state[best] == S_PUBLISHED || state[best] == S_EXCLUSIVE -> spill_copy(me)
			:: state[best] == S_WRITING || state[best] == S_FREE ->
				d_step { SIF_DEC; sp_used = sp_used & ~(1 << r) }
				NOTIFY_OWNER;
				res = 0
			fi
#else
			spill_copy(me)
#endif
#endif
		fi;
		d_step { best = 0; qm = 0; q0 = 0; q1 = 0; r = 0 }
	fi
}
#endif

/* ------------------------------------------------------------------------ */
/* The owner's producer thread: acquire / publish NF frames, EOS, close.     */
/* ------------------------------------------------------------------------ */

/* acquire: drop_globally_oldest(), consumer c: any consumer whose policy lets its
 * queued frames go (drop-oldest; latest is drop-oldest with QS 1) and whose head
 * entry names a slot (the hint) may be the victim: a superset of the code's choice
 * (the oldest, preferring one whose drop frees its slot). */
#define DGO_VICTIM(c) \
	(POL(c) == DROP_OLDEST && cactive[c] && head[c] != tail[c] && E_WHAT(ring[CELL(c, head[c])]) < NS)

#ifdef ACQUIRE_RETRIES_ON_PROGRESS
#define UNWAIT owner_waiting-- /* owner_waiting.fetch_sub */
#else
#define UNWAIT skip
#endif

proctype Producer()
{
	byte f, i, s0, h, e, w, x, seen, masks, taken, a, seq;
	byte cursor = 2; /* acquire_cursor: the last frame of init went to slot 1 */
	bit ok, take, res, dr, fr;
#if NSP > 0
	byte best, qm, q0, q1, tq0, tq1, hw, r, gs, hs, hog, tl, n, k;
	bit cand, mv;
#endif
#ifdef SPILL_AHEAD
	bit inf, gif;
#endif
	{
		do
		:: f < NF ->
retry: /* Publisher::acquire */
			i = cursor % NS;
			try_reclaim(i, S_WRITING, ok, s0);
			if
			:: !ok ->
				i = (cursor + 1) % NS;
				try_reclaim(i, S_WRITING, ok, s0)
			:: else -> skip
			fi;
#if NS > 2
			if
			:: !ok ->
				i = (cursor + 2) % NS;
				try_reclaim(i, S_WRITING, ok, s0)
			:: else -> skip
			fi;
#endif
			if
			:: !ok ->
				/* acquire: no free slot: spill_one() || drop_globally_oldest(), under
				 * publish_lock */
#ifdef ACQUIRE_RETRIES_ON_PROGRESS
				/* Finding 3's fix (README.md): owner_waiting.fetch_add and seen =
				 * progress.load before spill_one(), so that a release or reap after
				 * the look wakes the wait below */
				owner_waiting++;
				bumped = 0;
#endif
				lock(1);
#if NSP > 0
				spill_one(1);
				if
				:: res -> res = 0; UNWAIT; plock = 0; goto retry
				:: else -> skip
				fi;
#endif
				if
				:: DGO_VICTIM(0) -> drop_oldest(0); dr = 0; UNWAIT; plock = 0; goto retry
				:: DGO_VICTIM(1) -> drop_oldest(1); dr = 0; UNWAIT; plock = 0; goto retry
				:: else -> plock = 0
				fi;
#ifdef ACQUIRE_RETRIES_ON_PROGRESS
#ifdef SPILL_AHEAD
				/* acquire: free = slot_is_free of each slot (one step), in_flight =
				 * spills_in_flight.load(); ghost gif: a spill in flight as it looks.
				 * acquire(0) gives up here (its deadline has passed) when neither:
				 * never while a spill that was in flight as it looked frees a slot
				 * (2c34312: "acquire(0) still finds the slot a spill makes free") */
#ifdef ACQUIRE_LOADS_IN_FLIGHT_FIRST
				d_step { inf = (sif != 0); gif = inf } /* proposed fix: in_flight first */
				d_step {
					fr = ANY_FREE;
#else
				d_step { fr = ANY_FREE; gif = (sif != 0) }
				d_step {
					inf = (sif != 0);
#endif
#ifdef MUTATION_ACQUIRE_IGNORES_SPILL
					inf = 0; /* the mutant: the code before 2c34312 */
#endif
					assert(fr || inf || !gif);
					inf = 0;
					gif = 0
				}
#else
				fr = ANY_FREE; /* acquire: free = slot_is_free of each slot (one step) */
#endif
				/* futex_wait(progress, seen) unless a slot was free: until progress
				 * moved; then owner_waiting.fetch_sub and spill_one() again */
				if
				:: fr -> fr = 0
				:: else -> bumped
				fi;
				owner_waiting--;
#else
				wait_progress(ANY_FREE, false, res, seen);
				res = 0;
#endif
				goto retry
			:: else -> cursor = i + 1
			fi;
#ifdef GPU
#ifndef MUTATION_NO_PENDING_CHECK
			/* acquire: sync->wait_done(i, meta.seq, stream) */
			skip;
			d_step { a = pending[i]; pending[i] = 0 } /* wait_done: pending.exchange(0) */
			/* enqueueing on the process's own stream is local: folded into the load */
#if NSP > 0
			atomic { /* bit 0: the owner's spill copy of the slot's last frame */
				if
				:: (a & OWNER_BIT) && DONE(i, 0) < mseq[i] -> /* wait_done: done[0].load */
					oq ! OP_WAIT_DONE, i, 0, mseq[i] /* cuStreamWaitValue64 */
				:: else -> skip
				fi
			}
#endif
			atomic {
				if
				:: (a & CBIT(0)) && DONE(i, 1) < mseq[i] -> /* wait_done: done[h].load */
					oq ! OP_WAIT_DONE, i, 1, mseq[i] /* cuStreamWaitValue64 */
				:: else -> skip
				fi
			}
			atomic {
				if
				:: (a & CBIT(1)) && DONE(i, 2) < mseq[i] -> /* wait_done: done[h].load */
					oq ! OP_WAIT_DONE, i, 2, mseq[i] /* cuStreamWaitValue64 */
				:: else -> skip
				fi
			}
			a = 0;
#endif
#endif
			holders[i] = holders[i] | OWNER_BIT; /* acquire: holders[0].fetch_or */
#ifdef GPU
			atomic { /* acquire: meta = FrameMeta{}; the producer's kernels write the frame */
				mseq[i] = 0;
				oq ! OP_WRITE, i, 0, 0
			}
#else
			mseq[i] = 0; /* acquire: meta = FrameMeta{} */
#endif
			/* Publisher::publish(frame, stream) */
			lock(1);
			skip;
			d_step { /* publish: slot.meta = m, seq = ++published_count */
				pcount++;
				seq = pcount;
				mseq[i] = seq
			}
#ifdef GPU
			atomic { /* publish: mark_ready (enqueue, local), state.store(PUBLISHED) */
				oq ! OP_READY, i, 0, seq;
				state[i] = S_PUBLISHED
			}
#else
			state[i] = S_PUBLISHED; /* publish: state.store(PUBLISHED) */
#endif
			masks = 0;
			choose_target(0);
			choose_target(1);
#if NSP > 0
			COLLECT_SPILL; /* publish: collect_spill() */
#endif
			skip;
			d_step { /* publish: holders.fetch_or(masks) */
				taken = holders[i] & masks;
				holders[i] = holders[i] | masks
			}
			/* publish: pool_.release(index) -> clear_holder_bit(index, owner bit) */
#ifdef UNPATCHED_EXCLUSIVE
			d_step { /* clear_holder_bit: CAS EXCLUSIVE -> PUBLISHED */
				if
				:: state[i] == S_EXCLUSIVE -> state[i] = S_PUBLISHED
				:: else -> skip
				fi
			}
#endif
			d_step { /* clear_holder_bit: holders.fetch_and(~owner bit) */
				assert(holders[i] & OWNER_BIT);
				holders[i] = holders[i] & ~OWNER_BIT
			}
			push_target(0);
			push_target(1);
			skip;
#ifdef SPILL_AHEAD
			d_step { /* publish: fewer than kSpillReserve slots free (slot_is_free of each)
				  * with a fifo-spill consumer active: spill_wanted, spill_cv.notify_one;
				  * then unlock */
				if
				:: !spill_wanted && !ANY_FREE &&
				   ((cactive[0] && POL(0) == FIFO_SPILL) || (cactive[1] && POL(1) == FIFO_SPILL)) ->
					spill_wanted = 1
				:: else -> skip
				fi;
				plock = 0; f++; masks = 0; taken = 0; seq = 0
			}
#else
			d_step { plock = 0; f++; masks = 0; taken = 0; seq = 0 } /* publish: unlock */
#endif
		:: else -> break
		od;
		/* Publisher::end_of_stream() */
		lock(1);
		eos_target(0);
		eos_target(1);
		plock = 0;
#ifdef OWNER_CLOSES
		/* Publisher::shutdown() */
		shut = 1; /* shutdown: shut.exchange(true) */
		BUMP; /* shutdown: progress.fetch_add, futex_wake_all */
		io_stop = 1; /* shutdown: write(io_stop) */
		rdone; /* shutdown: io_thread.join() */
		lock(1);
		pool_closed = 1; /* shutdown: header->state.store(CLOSED) */
		BUMP;
		if
		:: cactive[0] -> armed[0] = 0; evfd[0]++ /* shutdown: armed.store(0), write(eventfd) */
		:: else -> skip
		fi;
		if
		:: cactive[1] -> armed[1] = 0; evfd[1]++
		:: else -> skip
		fi;
#if defined(GPU) && defined(CLOSE_DRAINS_STREAMS)
		/* proposed fix (README.md, "Finding 7"): the owner's queued word writes land
		 * before the hang-up (the teardown waits of Ordering and SpillCopier, moved
		 * before it): the ready writes (the last operation on the producer's
		 * stream) */
		len(oq) == 0 && !obusy;
#if NSP > 0
		/* and the spill_ready writes */
		sready[0] >= sseq[0];
#if NSP > 1
		sready[1] >= sseq[1];
#endif
#endif
#endif
		ohup = 1; /* shutdown: consumer_conn.clear(): the consumers see a hang-up */
		plock = 0;
#endif
		pdone = 1
	} unless { odead }
}

/* ------------------------------------------------------------------------ */
/* The owner's I/O thread: reap every consumer whose socket hangs up.        */
/* ------------------------------------------------------------------------ */

/* reap: clear consumer c's bit in slot i, reclaim the slot if it was set */
inline reap_slot(c, i)
{
#ifdef MUTATION_REAP_SKIPS_WORD
	if
	:: i == 0 -> ok = 0 /* the mutant leaves slot 0's holder word alone */
	:: else ->
#endif
	d_step { /* reap: holders[bit / 64].fetch_and(~bit) */
		ok = (holders[i] & CBIT(c)) != 0;
		assert(killed[c] || !ok); /* a consumer that exited released all it held: none leaked */
		holders[i] = holders[i] & ~CBIT(c)
	}
#ifdef MUTATION_REAP_SKIPS_WORD
	fi;
#endif
	if
	:: ok -> try_reclaim(i, S_FREE, ok, s0); ok = 0
	:: else -> skip
	fi
}

/* reap: clear consumer c's bit on spill buffer r */
inline reap_spill(c, r)
{
#ifdef MUTATION_REAP_SKIPS_SPILL
	skip /* the mutant leaves the spill buffers' bits */
#else
	d_step { /* reap: the spill record's holders.fetch_and(~bit) */
		assert(killed[c] || !(holders[NS + r] & CBIT(c))); /* none leaked */
		holders[NS + r] = holders[NS + r] & ~CBIT(c)
	}
#endif
}

proctype Reaper()
{
	byte c, s0, k;
	bit ok;
	{
end_idle:
		do
		:: io_stop -> break /* Publisher::shutdown stops the I/O thread */
		:: reaped[0] && reaped[1] -> break /* model: nothing left to reap */
		:: chup[0] && !reaped[0] -> c = 0; goto reap /* epoll: hang-up on connection 0 */
		:: chup[1] && !reaped[1] -> c = 1; goto reap
		od;
		goto out;
reap: /* Publisher::reap(c) */
		skip;
		d_step { cstate[c] = C_DEAD; BUMP } /* reap: state.store(DEAD), progress.fetch_add, wake */
		lock(2);
#if NSP > 0
		d_step { cactive[c] = 0; cgen = cgen ^ (1 << c) } /* reap: consumer_generation[c]++ */
#else
		cactive[c] = 0;
#endif
#ifdef GPU
		/* reap: sync->release_dead_holder(1 + c, published_count) */
		DONE(0, 1 + c) = pcount;
		DONE(1, 1 + c) = pcount;
#if NS > 2
		DONE(2, 1 + c) = pcount;
#endif
#endif
		reap_slot(c, 0);
		reap_slot(c, 1);
#if NS > 2
		reap_slot(c, 2);
#endif
#if NSP > 0
		/* reap: its spilled frames */
		reap_spill(c, 0);
#if NSP > 1
		reap_spill(c, 1);
#endif
		COLLECT_SPILL; /* reap: collect_spill() */
#endif
		skip;
		d_step { /* reap: head.store(0), tail.store(0): the ring is discarded */
			head[c] = 0;
			tail[c] = 0;
			k = 0;
			do
			:: k < NI -> qcount[c * NI + k] = 0; k++
			:: else -> k = 0; break
			od
		}
		d_step { /* reap: state.store(FREE), unlock, progress.fetch_add, wake */
			cstate[c] = C_FREE;
			reaped[c] = 1;
			plock = 0;
			BUMP;
			c = 0
		}
		goto end_idle;
out:
		rdone = 1
	} unless { odead }
}

#ifdef SPILL_AHEAD
/* ------------------------------------------------------------------------ */
/* The owner's spill thread (Publisher::spill_loop): while fewer than        */
/* kSpillReserve (1) slots are free, spill_one(); woken by publish.          */
/* ------------------------------------------------------------------------ */

proctype SpillThread()
{
	byte h, e, w, x, best, qm, q0, q1, tq0, tq1, hw, r, gs, hs, hog, tl, n, k;
	bit ok, res, dr, cand, mv;
	{
end_wait:
		do
		:: atomic { /* spill_cv.wait(lock, spill_wanted || shut) returns: publish_lock held */
			plock == 0 && spill_wanted -> plock = 3; spill_wanted = 0; sidle = 0
		}
			do
			:: ANY_FREE -> break /* spill_loop: free >= kSpillReserve (slot_is_free of each: one step) */
			:: else ->
				spill_one(3);
				if
				:: res -> res = 0
				:: else -> break
				fi
			od;
			atomic { plock = 0; sidle = 1 } /* spill_cv.wait: publish_lock let go */
		od
	} unless { odead }
}
#endif

/* ------------------------------------------------------------------------ */
/* A consumer process (one thread; a second, the owner watch, for GPU).      */
/* ------------------------------------------------------------------------ */

#if NSP > 0
#define NOT_TORN(s) ((s) < NS || !(torn & (1 << ((s) - NS))))
#else
#define NOT_TORN(s) true
#endif

/* Ghost: consumer c starts to use frame SQ in slot or spill buffer S, which it now
 * holds. */
#define USE_FRAME(c, s, sq) \
	assert(mseq[s] == (sq)); /* not reused since it was queued or probed */ \
	assert(state[s] == S_PUBLISHED || state[s] == S_EXCLUSIVE || state[s] == S_RECLAIMING); \
	assert(inplace[s] == 0); /* nobody writes it in place */ \
	assert(NOT_TORN(s)); /* a spilled copy is whole */ \
	lref[c * NI + s]++

/* Ghost, in the step of a consumer's claim in receive(): what it gets */
#define DELIVER_GHOST(c, h, e, sq) \
	if \
	:: IS_FRAME(E_WHAT(e)) -> \
		assert(!(fate[c] & (1 << (sq)))); /* never twice (nor after a drop) */ \
		assert((sq) > lastseq[c]); /* in publish order */ \
		fate[c] = fate[c] | (1 << (sq)); \
		lastseq[c] = sq \
	:: E_WHAT(e) == W_EOS -> \
		assert(tk[c] == (1 << ((h) + 1)) - 1); /* every earlier entry was taken */ \
		assert(fate[c] == (1 << (pcount + 1)) - 2) /* every frame delivered or dropped by a policy */ \
	:: else -> skip \
	fi

/*
 * Subscriber::take_entry(h), consumer c: claim the entry at position h by a CAS on
 * its cell, then move the head. Sets ok: claimed, with the entry in e (and the
 * frame's seq in sq, ghost); else look again. DELIVER: receive() (1) or
 * detach_queue() (0).
 */
inline take_entry(c, deliver)
{
	e = ring[CELL(c, h)]; /* take_entry: cell.load */
	if
	:: E_POS(e) != h ->
		/* take_entry: head.load: another taker moved the head on. The same head is
		 * the "belongs to position" segment error: never, with an honest owner. */
		assert(head[c] != h);
		ok = 0
	:: else ->
#ifdef MUTATION_HEAD_FIRST
		/* the mutant moves the head first, then claims */
		d_step {
			if
			:: head[c] == h -> head[c] = h + 1; ok = 1
			:: else -> ok = 0
			fi
		}
		if
		:: ok && E_WHAT(e) != W_TAKEN ->
			d_step {
				if
				:: ring[CELL(c, h)] == e ->
					ring[CELL(c, h)] = ENTRY(h, W_TAKEN);
					CLAIM_GHOST(c, h, e);
					sq = gq[CELL(c, h)];
					if
					:: deliver -> DELIVER_GHOST(c, h, e, sq)
					:: else -> skip
					fi
				:: else -> ok = 0
				fi
			}
		:: else -> ok = 0
		fi
#else
#ifdef MUTATION_NO_CLAIM
		/* the mutant takes by the head CAS alone, as before the claim (300a84d) */
		d_step {
			if
			:: head[c] == h && E_WHAT(e) != W_TAKEN ->
				head[c] = h + 1;
				ok = 1;
				CLAIM_GHOST(c, h, e);
				sq = gq[CELL(c, h)];
				if
				:: deliver -> DELIVER_GHOST(c, h, e, sq)
				:: else -> skip
				fi
			:: head[c] == h && E_WHAT(e) == W_TAKEN -> head[c] = h + 1; ok = 0
			:: else -> ok = 0
			fi
		}
#else
		if
		:: E_WHAT(e) != W_TAKEN ->
			d_step { /* take_entry: cell CAS e -> (h, TAKEN) */
				if
				:: ring[CELL(c, h)] == e ->
					ring[CELL(c, h)] = ENTRY(h, W_TAKEN);
					ok = 1;
					CLAIM_GHOST(c, h, e);
					sq = gq[CELL(c, h)];
					if
					:: deliver -> DELIVER_GHOST(c, h, e, sq)
					:: else -> skip
					fi
				:: else -> ok = 0 /* the owner took it, or moved it */
				fi
			}
		:: else -> ok = 0 /* claimed by the owner: help it move the head */
		fi;
		if
		:: ok || E_WHAT(e) == W_TAKEN ->
			d_step { /* take_entry: head CAS h -> h + 1 */
#ifdef MUTATION_HEAD_STORE
				head[c] = h + 1 /* the mutant stores instead */
#else
				if
				:: head[c] == h -> head[c] = h + 1
				:: else -> skip
				fi
#endif
			}
		:: else -> skip
		fi
#endif
#endif
	fi
}

/*
 * PoolImpl::clear_holder_bit(s, bit) for consumer c, with the ghost check that the
 * bit stood for a reference (released once).
 */
inline clear_holder_bit(c, s)
{
#ifdef UNPATCHED_EXCLUSIVE
	d_step { /* clear_holder_bit: CAS EXCLUSIVE -> PUBLISHED, whoever took it */
		if
		:: state[s] == S_EXCLUSIVE -> state[s] = S_PUBLISHED
		:: else -> skip
		fi
	}
#else
	if
	:: excl & (1 << s) -> /* patched: only the process that took it EXCLUSIVE gives it back */
		d_step {
			if
			:: state[s] == S_EXCLUSIVE -> state[s] = S_PUBLISHED
			:: else -> skip
			fi;
			excl = excl & ~(1 << s)
		}
	:: else -> skip
	fi;
#endif
	skip;
	d_step { /* clear_holder_bit: holders.fetch_and(~bit) */
		assert(holders[s] & CBIT(c)); /* released once */
		holders[s] = holders[s] & ~CBIT(c)
	}
	NOTIFY_OWNER /* clear_holder_bit: notify_owner */
}

/* PoolImpl::release(s, stream): the last local reference goes. */
inline release(c, s)
{
#ifdef GPU
#if NSP > 0
	if
	:: s >= NS -> d_step { lref[c * NI + s]-- } /* a spill buffer: host memory, no done word */
	:: else ->
#endif
	atomic { /* mark_done: pending.fetch_or(bit), then cuStreamWriteValue64(done) (local) */
		lref[c * NI + s]--;
		pending[s] = pending[s] | CBIT(c);
		cq[c] ! OP_DONE, s, 1 + c, mseq[s]
	}
#if NSP > 0
	fi;
#endif
#else
	d_step {
		lref[c * NI + s]--;
		if
		:: inplace[s] == c + 1 -> inplace[s] = 0
		:: else -> skip
		fi
	}
#endif
	clear_holder_bit(c, s)
}

/*
 * PoolImpl::take_exclusive(s) with local_refs == 1 (try_make_writable of a received
 * frame, or get_mut of a probed one); s is a slot (a spilled frame is never written
 * in place). Sets ok: writable in place.
 */
inline take_exclusive(c, s)
{
	d_step { /* take_exclusive: CAS PUBLISHED -> EXCLUSIVE */
		if
		:: state[s] == S_PUBLISHED -> state[s] = S_EXCLUSIVE; x = S_PUBLISHED
		:: else -> x = state[s]
		fi
	}
	if
	:: x != S_PUBLISHED ->
#ifdef UNPATCHED_EXCLUSIVE
		ok = (x == S_EXCLUSIVE && holders[s] == CBIT(c)) /* take_exclusive: sole_holder */
#else
		ok = 0 /* patched: an EXCLUSIVE this process did not take is not its own */
#endif
	:: else ->
		if
		:: holders[s] == CBIT(c) -> ok = 1 /* take_exclusive: sole_holder */
		:: else -> state[s] = S_PUBLISHED; ok = 0 /* take_exclusive: state.store */
		fi
	fi;
	if
	:: ok ->
		d_step { /* ghost: writing in place needs the only reference */
			assert(inplace[s] == 0);
			assert(c == 1 || !LIVE(1) || (lref[NI + s] == 0 && qcount[NI + s] == 0));
			assert(c == 0 || !LIVE(0) || (lref[s] == 0 && qcount[s] == 0));
			inplace[s] = c + 1;
#if NSP > 0
			if
			:: cpy == s + 1 -> wip = 1 /* while the owner copies it into the tier */
			:: else -> skip
			fi;
#endif
			excl = excl | (1 << s);
			x = 0;
			ok = 0
		}
	:: else -> x = 0
	fi
}

proctype Consumer(byte c)
{
	byte h, e, s, x, sq, probes;
	bit ok, arm_set, gone, holding;
	byte owed; /* eventfd writes the owner owes this consumer (Subscriber::owed_writes) */
	byte excl; /* patched PoolImpl: bit s, this process took slot s EXCLUSIVE */
#if defined(GPU) && NSP > 0
	byte psq; /* Subscriber::parked_seq of a spilled frame: its spill_seq */
#endif
#ifdef SPIN_WAKE
	byte spun; /* windows spun so far (at most SPIN_WAKE) */
#endif
	arm_set = 1; /* start_consumer: the owner armed us at attach */
	holding = 1; /* each consumer holds a frame it received (init) */
#if NS == 3
	s = 2 * c; /* consumer 0 holds frame 2 in slot 0, consumer 1 frame 1 in slot 2 */
#else
	s = 0; /* both hold frame 1 in slot 0 */
#endif
	{
		do
		:: !holding ->
			/* Subscriber::receive(no timeout, stream) */
recv:
#ifndef NO_WAKEUP
			skip;
			d_step { /* receive: note_arm_taken (armed.load: the owner took our arm, its
				  * write is owed), then read(eventfd) while writes are owed: one step
				  * (local bookkeeping) */
				if
				:: arm_set && armed[c] == 0 -> arm_set = 0; owed++
				:: else -> skip
				fi;
				if
				:: owed > 0 && evfd[c] > 0 ->
					if
					:: evfd[c] >= owed -> owed = 0
					:: else -> owed = owed - evfd[c]
					fi;
					evfd[c] = 0
				:: else -> skip
				fi
			}
#endif
			h = head[c]; /* receive: head.load */
			if
			:: tail[c] != h -> /* receive: tail.load */
				take_entry(c, 1);
				if
				:: !ok -> d_step { h = 0; e = 0; sq = 0 }; goto recv /* look again */
				:: else -> d_step { ok = 0; h = 0 }
				fi;
				NOTIFY_OWNER; /* receive: notify_owner */
				if
				:: E_WHAT(e) == W_EOS -> break /* end of stream */
				:: E_WHAT(e) == W_SKIP -> d_step { e = 0; sq = 0 }; goto recv /* dropped in place */
				:: else -> skip
				fi;
				skip;
				d_step { /* receive: local_refs[index]++ (index: the slot, or slot_count + r) */
					s = W_INDEX(E_WHAT(e));
					assert(holders[s] & CBIT(c)); /* queued implies held */
					USE_FRAME(c, s, sq);
#if defined(GPU) && NSP > 0
					/* parked_seq: a spilled frame's spill_seq, read once */
					if
					:: s >= NS -> psq = sseq[s - NS]
					:: else -> skip
					fi;
#endif
					holding = 1
				}
#ifdef GPU
#if NSP > 0
				if
				:: s >= NS -> /* a spilled frame: deliver_parked, spilled_frame */
#ifndef MUTATION_NO_SPILL_WAIT
spill_wait: /* Subscriber::wait_spilled */
					if
					:: sready[s - NS] >= psq -> skip /* spill_ready.load: reached */
					:: else -> /* not yet */
						if
						:: !ohup -> goto spill_wait /* owner_gone_.load: no; sleep, look again */
						:: ohup -> /* owner_gone_ (set at any hang-up) */
							if
#ifdef GONE_RECHECKS_SPILL
							/* proposed fix, the consumer's half: spill_ready.load again */
							:: sready[s - NS] >= psq -> skip
#endif
							:: else -> /* the frame is lost */
								/* only when the owner died: its copy never lands */
								assert(odead);
								d_step { lref[c * NI + s]-- } /* deliver_parked: release(index) */
								clear_holder_bit(c, s);
								d_step { holding = 0; s = 0; e = 0; sq = 0; psq = 0 };
								goto recv
							fi
						fi
					fi;
#endif
					/* frame_guard: the consumer reads the buffer (host delivery), or
					 * private_copy copies it to device memory of its own (device
					 * delivery: from pageable memory, read when the call returns) */
					d_step {
						assert(bufseq[s - NS] == sq); /* the copy landed: the frame's bytes */
						srd[s - NS] = srd[s - NS] | CBIT(c)
					}
					d_step {
						assert(bufseq[s - NS] == sq); /* not copied into meanwhile */
						srd[s - NS] = srd[s - NS] & ~CBIT(c);
						psq = 0
					}
				:: else ->
#endif
				atomic { /* wait_ready: ready.load; the enqueues are local */
					if
					:: ready[s] < sq ->
						cq[c] ! OP_WAIT_READY, s, 0, sq /* cuStreamWaitValue64 */
					:: else -> skip
					fi;
					cq[c] ! OP_READ, s, 0, sq /* the consumer's kernels read it */
				}
#if NSP > 0
				fi;
#endif
#endif
				d_step { e = 0; sq = 0 }
			:: else ->
				if
				:: gone || pool_closed -> break /* receive: state.load: closed */
				:: else -> skip
				fi;
#ifdef NO_WAKEUP
				/* abstracted: the wait ends when the queue is not empty or the owner
				 * hung up (the armed/eventfd handshake is checked by the other runs) */
				h = 0;
				if
				:: head[c] != tail[c] -> skip
				:: ohup -> gone = 1
				fi;
				goto recv
#endif
#ifdef SPIN_WAKE
				/* spin_for_frame: a window is open (when is the consumer's own clock: any
				 * empty look, up to SPIN_WAKE of them). Disarmed first, so the owner
				 * writes no eventfd for a consumer that looks anyway: armed.exchange(0);
				 * if it gives 0 with our arm set, the owner took the arm and its write is
				 * owed. Then tail loads until the tail moves (caught) or the window
				 * closes. */
				if
				:: (SPINNERS & (1 << c)) && spun < SPIN_WAKE ->
					d_step {
						spun++;
#ifndef MUTATION_SPIN_FORGETS_WRITE
						if /* armed.exchange(0): 0 with our arm set, the owner took it */
						:: arm_set && armed[c] == 0 -> owed++
						:: else -> skip
						fi;
#endif
						armed[c] = 0;
						arm_set = 0
					}
					if
					:: tail[c] != h -> h = 0; goto recv /* caught */
					:: skip /* the window closed */
#ifdef MUTATION_SPIN_SKIPS_ARM
						; goto sleep /* a miss sleeps without arming and looking again */
#endif
					fi
				:: skip
				fi;
#endif
				skip;
#ifdef MUTATION_ARM_BY_STORE
				d_step { armed[c] = 1; arm_set = 1 } /* the code before: armed.store(1) */
#else
				d_step { /* receive: armed.exchange(1): 0 with our arm set, the owner took it */
					if
					:: arm_set && armed[c] == 0 -> owed++
					:: else -> skip
					fi;
					armed[c] = 1;
					arm_set = 1
				}
#endif
				if
				:: tail[c] != h -> h = 0; goto recv /* receive: tail.load again */
				:: else -> h = 0
				fi;
#ifdef SPIN_WAKE
sleep:
#endif
				/* No eventfd write the consumer does not know of: a readable eventfd at
				 * the sleep is drained at the next look (a stale one would wake a poller
				 * for nothing, again and again, until the next frame). */
				assert(evfd[c] == 0 || owed > 0 || (arm_set && armed[c] == 0));
				if /* poll(socket, eventfd), no timeout */
				:: ohup -> gone = 1
				:: evfd[c] -> skip
				fi;
				goto recv
			fi
		:: holding ->
			if
			:: release(c, s); d_step { holding = 0; s = 0 }
#if EXCL
			:: (EXCL & (1 << c)) && s < NS && inplace[s] != c + 1 -> /* BufferGuard::try_make_writable */
				take_exclusive(c, s)
#endif
#if EARLY
			:: EARLY & (1 << c) -> break /* handle closed with a guard live */
#endif
			fi
#if PROBES
		:: !holding && (PROBES & (1 << c)) && probes < 1 ->
			/* PoolImpl::get(s, writable), holding none of s */
			if
			:: s = 0
			:: s = 1
			fi;
			skip;
			d_step { /* get: holders.fetch_or(bit) */
				ok = (holders[s] & CBIT(c)) != 0;
				holders[s] = holders[s] | CBIT(c);
				probes++
			}
			if
			:: ok -> ok = 0; s = 0 /* queued for us: take it with receive() */
			:: else ->
				do
				:: x = state[s]; /* get: state.load */
					if
					:: x != S_RECLAIMING -> break
					:: else -> skip /* sched_yield, look again */
					fi
				:: x == S_RECLAIMING -> break /* gave up after 1000 spins */
				od;
				if
				:: x != S_PUBLISHED ->
					d_step { holders[s] = holders[s] & ~CBIT(c); x = 0; s = 0 } /* get: fetch_and */
					NOTIFY_OWNER /* get: notify_owner */
				:: else ->
					/* get_mut's take_exclusive is the try_make_writable branch above,
					 * taken next or later */
					d_step { USE_FRAME(c, s, mseq[s]); holding = 1; x = 0 }
				fi
			fi
#endif
#if EARLY
		:: !holding && (EARLY & (1 << c)) -> break /* handle closed */
#endif
		od;
		/* ~BufferPool: Subscriber::detach_queue() */
		detached[c] = 1; /* detach_queue: detached.store(1) */
		NOTIFY_OWNER; /* detach_queue: notify_owner */
		do
		:: h = head[c]; /* detach_queue: head.load */
			if
			:: tail[c] == h -> h = 0; break /* detach_queue: tail.load */
			:: else -> skip
			fi;
			take_entry(c, 0);
			if
			:: ok && IS_FRAME(E_WHAT(e)) && lref[c * NI + W_INDEX(E_WHAT(e))] == 0 ->
				x = s; /* keep the held index */
				s = W_INDEX(E_WHAT(e));
				clear_holder_bit(c, s);
				s = x;
				x = 0
			:: else -> skip
			fi;
			skip;
			d_step { ok = 0; e = 0; h = 0; sq = 0 }
		od;
		/* then the guards go, then the socket */
		if
		:: holding -> release(c, s); d_step { holding = 0; s = 0 }
		:: else -> skip
		fi;
#if defined(GPU) && defined(SYNC_AT_CLOSE)
		/* Finding 2's fix: the consumer's streams are synchronized before its socket
		 * closes (DeviceSync::drain_done from ~Subscriber) */
		len(cq[c]) == 0 && !cbusy[c];
#endif
		skip;
		d_step { exited[c] = 1; chup[c] = 1 }
	} unless { killed[c] }
}

/* Ghost: a dead process's local references are gone */
#define DROP_LREFS(c) \
	k = 0; \
	do \
	:: k < NI -> lref[(c) * NI + k] = 0; k++ \
	:: else -> k = 0; break \
	od

/* A consumer that takes nothing (a stalled one) and is killed once the producer is
 * done, if not before. */
proctype Passive(byte c)
{
	byte k;
	(pdone || odead || killed[c]);
	d_step {
		if
		:: !killed[c] ->
			killed[c] = 1;
			chup[c] = 1;
			DROP_LREFS(c)
		:: else -> skip
		fi
	}
}

/* SIGKILL of consumer c at any moment, or never. */
proctype Killer(byte c)
{
	byte k;
	if
	:: !exited[c] ->
		d_step {
			killed[c] = 1;
			chup[c] = 1; /* the kernel closes its socket */
			DROP_LREFS(c);
			do
			:: k < NS ->
				if
				:: inplace[k] == c + 1 -> inplace[k] = 0
				:: else -> skip
				fi;
				k++
			:: else -> k = 0; break
			od;
#ifdef GPU
			/* the driver drops a dead process's queued GPU work */
			reading[c * NS] = 0;
			reading[c * NS + 1] = 0;
#if NS > 2
			reading[c * NS + 2] = 0;
#endif
#if NSP > 0
			srd[0] = srd[0] & ~CBIT(c); /* and its reads of the tier stop */
#if NSP > 1
			srd[1] = srd[1] & ~CBIT(c);
#endif
#endif
			cbusy[c] = 0
#else
			skip
#endif
		}
	:: skip
	fi
}

#ifdef OWNER_DIES
/* SIGKILL of the owner (both threads, its stream) at any moment, or never. */
proctype OwnerKiller()
{
	if
	:: !pdone ->
		d_step {
			odead = 1;
			ohup = 1
#ifdef GPU
			;
			obusy = 0
#if NSP > 0
			;
			sbusy = 0
#endif
#endif
		}
	:: skip
	fi
}
#endif

#ifdef GPU
/* The owner's stream. Coarsened: dequeue and operation are one step (a wait blocks
 * between them); the stream's busy flag is a ghost. */
proctype OwnerStream()
{
	byte op, s, h, sq;
	{
end_idle:
		do
		:: atomic {
			oq ? op, s, h, sq;
			obusy = 1;
			if
			:: op == OP_WAIT_DONE -> DONE(s, h) >= sq
			:: op == OP_WRITE ->
				/* no live holder's GPU reads of the slot are in flight */
				assert(!reading[s] && !reading[NS + s]);
#if NSP > 0
				/* and no spill copy is still to read the frame this write replaces
				 * (the write of that frame itself comes before the copy) */
				assert(cpend[s] == 0 || gwritten[s] != cpend[s]);
#endif
				gwritten[s] = 0
			:: op == OP_READY -> gwritten[s] = sq; ready[s] = sq
			fi;
			obusy = 0;
			op = 0;
			s = 0;
			h = 0;
			sq = 0
		}
		od
	} unless { odead }
}

/* Consumer c's stream. Coarsened like the owner's, except that a read spans two
 * steps (the window in which the owner's write must not run). */
proctype ConsumerStream(byte c)
{
	byte op, s, h, sq;
	{
end_idle:
		do
		:: atomic {
			cq[c] ? op, s, h, sq;
			cbusy[c] = 1;
			if
			:: op == OP_WAIT_READY -> ready[s] >= sq
			:: op == OP_READ ->
				/* the producer's GPU writes of this frame are complete, or it died */
				assert(gwritten[s] == sq || odead);
				reading[c * NS + s] = 1
			:: op == OP_DONE -> DONE(s, h) = sq
			fi
		};
		d_step { reading[c * NS + s] = 0; cbusy[c] = 0; op = 0; s = 0; h = 0; sq = 0 }
		od
	} unless { killed[c] }
}

#if NSP > 0
/* The owner's spill stream (SpillCopier::stream_), coarsened like the others: the
 * copy reads the slot and writes the buffer in one step (the producer's next write of
 * the slot must come after all of it, so a write inside it is a write before it). */
proctype SpillStream()
{
	byte op, s, x, sq;
	{
end_idle:
		do
		:: atomic {
			spq ? op, s, x, sq;
			sbusy = 1;
			if
			:: op == OP_WAIT_READY -> ready[s] >= sq
			:: op == OP_COPY ->
				/* cuMemcpyDtoHAsync: the frame's GPU writes are complete and the slot
				 * not rewritten since, or the buffer gets another frame's bytes */
				assert(gwritten[s] == sq);
				bufseq[x] = sq;
				scopy = scopy & ~(1 << x);
				cpend[s] = 0
			:: op == OP_SPILL_READY -> sready[x] = sq
			:: op == OP_DONE -> DONE(s, x) = sq /* the owner's done word (x = 0) */
			fi;
			sbusy = 0;
			op = 0;
			s = 0;
			x = 0;
			sq = 0
		}
		od
	} unless { odead }
}
#endif

/* Subscriber::watch_owner: at the owner's hang-up, release_dead_owner(). */
inline dead_owner_slot(i)
{
	x = state[i]; /* release_dead_owner: state.load */
	if
	:: x == S_PUBLISHED || x == S_EXCLUSIVE ->
		d_step { x = 0; v = ready[i] } /* release_dead_owner: ready.load */
		if
		:: v < mseq[i] ->
			d_step { /* release_dead_owner: CAS ready -> seq + kDiedUnready */
				if
				:: ready[i] == v -> ready[i] = mseq[i] + UNREADY
				:: else -> skip
				fi;
				v = 0
			}
		:: else -> v = 0
		fi
	:: else -> x = 0
	fi
}

proctype OwnerWatch(byte c)
{
	byte x, v;
end_wait:
	{
		ohup || exited[c]; /* poll(socket, watch_stop): any hang-up, a close too */
		if
		:: exited[c] -> skip /* ~Subscriber stops the watch */
		:: else ->
			dead_owner_slot(0);
			dead_owner_slot(1)
#if NS > 2
			;
			dead_owner_slot(2)
#endif
		fi
	} unless { killed[c] }
}
#endif

/* ------------------------------------------------------------------------ */
/* Properties                                                                */
/* ------------------------------------------------------------------------ */

/* No slot is FREE or being rewritten, and no spill buffer FREE, while a live consumer
 * holds it or has it queued. */
#define NOT_HELD(c, s) (!LIVE(c) || (lref[(c) * NI + (s)] == 0 && qcount[(c) * NI + (s)] == 0))
#define REUSE_OK(s) ((state[s] != S_WRITING && state[s] != S_FREE) || (NOT_HELD(0, s) && NOT_HELD(1, s)))
/* Queued implies held. */
#define QUEUED_HELD(c, s) (!LIVE(c) || qcount[(c) * NI + (s)] == 0 || (holders[s] & CBIT(c)))
/* Whoever writes in place holds the slot EXCLUSIVE (or a reclaim that will back off
 * has it RECLAIMING for a moment). */
#define INPLACE_OK(s) (inplace[s] == 0 || state[s] == S_EXCLUSIVE || state[s] == S_RECLAIMING)
#define INDEX_OK(s) (REUSE_OK(s) && QUEUED_HELD(0, s) && QUEUED_HELD(1, s))
#if NS == 3
#define SLOTS_OK \
	(INDEX_OK(0) && INDEX_OK(1) && INDEX_OK(2) && INPLACE_OK(0) && INPLACE_OK(1) && INPLACE_OK(2))
#else
#define SLOTS_OK (INDEX_OK(0) && INDEX_OK(1) && INPLACE_OK(0) && INPLACE_OK(1))
#endif
#if NSP == 0
#define SPILL_OK true
#elif NSP == 1
#define SPILL_OK INDEX_OK(NS)
#else
#define SPILL_OK (INDEX_OK(NS) && INDEX_OK(NS + 1))
#endif
#define INV (SLOTS_OK && SPILL_OK)

active proctype Monitor()
{
end_watch:
	atomic { !INV -> assert(INV) }
}

#ifdef GPU
#if NSP > 0
#define SPILL_IDLE (len(spq) == 0 && !sbusy)
#else
#define SPILL_IDLE true
#endif
#define STREAMS_IDLE \
	(len(oq) == 0 && !obusy && (killed[0] || (len(cq[0]) == 0 && !cbusy[0])) && \
	 (killed[1] || (len(cq[1]) == 0 && !cbusy[1])) && SPILL_IDLE)
#else
#define STREAMS_IDLE true
#endif

#ifdef SPILL_AHEAD
#define SPILLER_IDLE (sidle && !spill_wanted)
#else
#define SPILLER_IDLE true
#endif

/* When everything has stopped, the slots and spill buffers are free again. A run
 * that cannot get here ends in an invalid end state (a deadlock, or a stream
 * waiting forever). */
active proctype Final()
{
	byte k, any;
	(pdone || odead) && (rdone || odead) && (exited[0] || killed[0]) && (exited[1] || killed[1]) &&
		(odead || shut || (reaped[0] && reaped[1])) && (odead || STREAMS_IDLE) && SPILLER_IDLE;
	skip;
	d_step {
		if
		:: !odead && !shut -> /* the owner lives: every slot is free */
			assert(holders[0] == 0 && SLOT_IS_FREE(0));
			assert(holders[1] == 0 && SLOT_IS_FREE(1));
#if NS > 2
			assert(holders[2] == 0 && SLOT_IS_FREE(2));
#endif
#if NSP > 0
			/* and every spill buffer: no bit, freed (none leaked) */
			assert(holders[NS] == 0 && state[NS] == S_FREE && !(sp_used & 1));
#if NSP > 1
			assert(holders[NS + 1] == 0 && state[NS + 1] == S_FREE && !(sp_used & 2));
#endif
#endif
			skip
		:: else -> /* no reaper: the exited consumers let go of what they held */
			k = 0;
			any = 0;
			do
			:: k < NI ->
				any = any | (exited[0] && lref[k] != 0) | (exited[1] && lref[NI + k] != 0);
				k++
			:: else -> break
			od;
			assert(!any);
			if
			:: !odead -> /* the owner closed: their bits are gone too */
				k = 0;
				do
				:: k < NI -> any = any | holders[k]; k++
				:: else -> break
				od;
				assert(!exited[0] || !(any & CBIT(0)));
				assert(!exited[1] || !(any & CBIT(1)))
			:: else -> skip /* the owner died: a bit it set for a queue it never
					 * reached stays, harmlessly: a dead owner's slots are
					 * never reused (a new owner makes a new pool) */
			fi
		fi
	}
}

/*
 * The run starts mid-stream, so that one or two more frames meet every case.
 * 3 slots: frame 1 in slot 2 is held by consumer 1, frame 2 in slot 0 by consumer
 * 0 (both received them), and frame 3 in slot 1 is queued to both, whose queues
 * (queue_size 1) are therefore full.
 * 2 slots (the spill runs): frame 1 in slot 0 is held by both consumers, frame 2
 * in slot 1 is queued to both.
 * The producer then publishes NF frames: acquire finds every slot held and must
 * wait for a release, reclaim against get() probes, spill a frame or drop a queued
 * one; publish meets full queues.
 */
init
{
	atomic {
		cstate[0] = C_ACTIVE; /* admit: state.store(ACTIVE) */
		cstate[1] = C_ACTIVE;
		cactive[0] = 1;
		cactive[1] = 1;
#if NS == 3
		state[0] = S_PUBLISHED;
		mseq[0] = 2;
		holders[0] = CBIT(0);
		lref[0] = 1;
		state[2] = S_PUBLISHED;
		mseq[2] = 1;
		holders[2] = CBIT(1);
		lref[NI + 2] = 1;
		state[1] = S_PUBLISHED;
		mseq[1] = 3;
		holders[1] = CBIT(0) | CBIT(1);
		ring[0] = ENTRY(0, 1);
		ring[RC] = ENTRY(0, 1);
		gq[0] = 3;
		gq[RC] = 3;
		tail[0] = 1;
		tail[1] = 1;
		qcount[1] = 1;
		qcount[NI + 1] = 1;
		pcount = 3;
		fate[0] = 6; /* frames 1 and 2: received, or dropped */
		fate[1] = 6;
		lastseq[0] = 2;
		lastseq[1] = 1;
#else
		state[0] = S_PUBLISHED;
		mseq[0] = 1;
		holders[0] = CBIT(0) | CBIT(1);
		lref[0] = 1;
		lref[NI] = 1;
		state[1] = S_PUBLISHED;
		mseq[1] = 2;
		holders[1] = CBIT(0) | CBIT(1);
		ring[0] = ENTRY(0, 1);
		ring[RC] = ENTRY(0, 1);
		gq[0] = 2;
		gq[RC] = 2;
		tail[0] = 1;
		tail[1] = 1;
		qcount[1] = 1;
		qcount[NI + 1] = 1;
		pcount = 2;
		fate[0] = 2; /* frame 1 received */
		fate[1] = 2;
		lastseq[0] = 1;
		lastseq[1] = 1;
#endif
		evfd[0] = 1; /* the last push took armed and wrote the eventfds */
		evfd[1] = 1;
#if defined(GPU) && NS == 3
		ready[0] = 2;
		ready[1] = 3;
		ready[2] = 1;
		gwritten[0] = 2;
		gwritten[1] = 3;
		gwritten[2] = 1;
		cq[0] ! OP_READ, 0, 0, 2; /* the consumers' kernels still read what they hold */
		cq[1] ! OP_READ, 2, 0, 1;
#endif
#if defined(GPU) && NS == 2
		/* frame 1 is written, consumer 0's kernels still read it (a passive consumer
		 * 1's are done); frame 2's writes and its ready write are still queued on the
		 * producer's stream (slot 1 was never written before): a spill of frame 2
		 * must wait for them */
		ready[0] = 1;
		gwritten[0] = 1;
#ifdef GPU_SETTLED
		/* GPU_SETTLED: all of that is done already */
		ready[1] = 2;
		gwritten[1] = 2;
#else
		oq ! OP_WRITE, 1, 0, 0;
		oq ! OP_READY, 1, 0, 2;
		cq[0] ! OP_READ, 0, 0, 1;
#ifndef PASSIVE1
		cq[1] ! OP_READ, 0, 0, 1;
#endif
#endif
#endif
#ifdef SPILL_AHEAD
		spill_wanted = 1; /* the publish of frame 2 left no slot free: the spill thread is woken */
		sidle = 1;
		run SpillThread();
#endif
		run Producer();
		run Reaper();
		run Consumer(0);
#ifdef PASSIVE1
		run Passive(1);
#else
		run Consumer(1);
#endif
		if
		:: KILL & 1 -> run Killer(0)
		:: else -> skip
		fi;
		if
		:: KILL & 2 -> run Killer(1)
		:: else -> skip
		fi;
#ifdef OWNER_DIES
		run OwnerKiller();
#endif
#ifdef GPU
		run OwnerStream();
		run ConsumerStream(0);
		run ConsumerStream(1);
		run OwnerWatch(0);
		run OwnerWatch(1);
#if NSP > 0
		run SpillStream();
#endif
#endif
	}
}
