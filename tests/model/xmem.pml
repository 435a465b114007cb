/*
 * xmem.pml - a Promela model of xmem's cross-process reference counting (lib/):
 * slot states, holder bits, the per-consumer rings, the queue policies,
 * get/get_mut/try_make_writable, release, reaping a consumer that dies between any
 * two steps, the owner closing or dying, and the CUDA ready/pending/done words.
 * Run by tests/model/check.sh; tests/model/README.md says what is modelled, the
 * bounds, and what is not.
 *
 * Granularity: every access of lib/ to shared memory (atomic load, store, CAS,
 * fetch_or, fetch_and, exchange), every eventfd/socket/futex event and every
 * stream operation is one Promela step, sequentially consistent. Purely local
 * work (a process's local_refs, the owner's active list and counters, ghost
 * bookkeeping) is folded into the neighbouring step. Comments name the C++
 * function each step mirrors ("fn: what").
 *
 * Configuration (spin -D...): POLICY (0 drop-oldest, 1 drop-new, 2 block), GPU
 * (ready/pending/done words and streams), OWNER_CLOSES, OWNER_DIES, KILL (mask of
 * consumers that may be SIGKILLed), NF (frames published), and masks over the
 * consumers: PROBES (one get() probe), EXCL (try_make_writable / get_mut in place),
 * EARLY (handle closed before the end of stream, with or without a guard live);
 * PASSIVE1 (consumer 1 takes nothing, and is killed at the end).
 * UNPATCHED_EXCLUSIVE models take_exclusive/clear_holder_bit as lib/pool.cpp has
 * them; by default the model has the proposed fix (README.md, "Finding").
 * Seeded bugs: MUTATION_REAP_SKIPS_WORD, MUTATION_NO_PENDING_CHECK,
 * MUTATION_HEAD_STORE.
 * SYNC_AT_CLOSE (GPU) models a proposed fix: a consumer's streams are synchronized
 * before its socket closes (README.md, "Finding 2").
 */

#define NC 2 /* consumers (the model unrolls loops over them) */
#define NS 3 /* slots (the model unrolls loops over them) */
#ifndef QS
#define QS 1 /* queue_size */
#endif
#define RC (QS + 1) /* ring_capacity: QS frames and the end-of-stream entry */
#ifndef NF
#define NF 1 /* frames the producer publishes (after the three of init) */
#endif
#ifndef POLICY
#define POLICY 0
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

#define DROP_OLDEST 0
#define DROP_NEW 1
#define BLOCK 2

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

/* Ring entry: (seq << 2) | slot, as (seq << 32) | slot in the code; EOS = kEosEntry. */
#define EOSE 255
#define LOST 254 /* drop_oldest lost the head CAS */
#define ENTRY(sq, sl) (((sq) << 2) | (sl))
#define E_SLOT(e) ((e) & 3)
#define E_SEQ(e) ((e) >> 2)

#define OWNER_BIT 1
#define CBIT(c) (1 << (1 + (c)))
#define LIVE(c) (!killed[c] && !exited[c])

/* ---- shared memory: ControlHeader, SlotRecord, ConsumerRecord ---- */
byte state[NS]; /* SlotRecord::state */
byte holders[NS]; /* SlotRecord::holders (bits 0..NC, all in word 0) */
byte mseq[NS]; /* SlotRecord::meta.seq */
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

/* ---- kernel objects ---- */
bit evfd[NC]; /* consumer c's eventfd is readable */
bit chup[NC]; /* consumer c's socket hung up (exit, crash) */
bit ohup; /* the owner's sockets hung up (close or crash) */

/* ---- owner-private ---- */
byte plock; /* publish_lock: 0 free, else 1 (producer) or 2 (I/O thread) */
bit cactive[NC]; /* Publisher::active */
byte pcount; /* Publisher::published_count */
bit shut; /* Publisher::shut */
bit io_stop; /* the io_stop eventfd */

/* ---- ghosts: what the properties talk about; the protocol never reads them ---- */
byte lref[NC * NS]; /* PoolImpl::local_refs of consumer c */
byte qcount[NC * NS]; /* entries of slot s queued in ring c */
byte tk[NC]; /* bit p: ring position p of consumer c was taken */
byte inplace[NS]; /* 1 + c while consumer c may write slot s in place */
bit killed[NC];
bit exited[NC];
bit reaped[NC];
bit odead; /* the owner process died */
bit pdone; /* the producer thread finished */
bit rdone; /* the I/O thread finished */

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
#define ANY_FREE (SLOT_IS_FREE(0) || SLOT_IS_FREE(1) || SLOT_IS_FREE(2))

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

/*
 * Publisher::drop_oldest(c): the owner's side of the head CAS. Ghosts: one taker per
 * entry, and the consumer's bit released once.
 */
inline drop_oldest(c, h, e)
{
	h = head[c]; /* drop_oldest: head.load */
	if
	:: tail[c] != h -> /* drop_oldest: tail.load */
		e = ring[c * RC + h % RC]; /* drop_oldest: ring[h].load */
		d_step { /* drop_oldest: head CAS h -> h + 1 */
			if
			:: head[c] == h ->
				head[c] = h + 1;
				assert(!(tk[c] & (1 << h))); /* one taker per entry */
				tk[c] = tk[c] | (1 << h);
				if
				:: e != EOSE -> qcount[c * NS + E_SLOT(e)]--
				:: else -> skip
				fi
			:: else -> e = LOST
			fi;
			h = 0
		}
		if
		:: e < LOST ->
			d_step { /* drop_oldest: holders.fetch_and(~bit) */
				assert(holders[E_SLOT(e)] & CBIT(c)); /* released once */
				holders[E_SLOT(e)] = holders[E_SLOT(e)] & ~CBIT(c);
				e = 0
			}
		:: else -> e = 0
		fi
	:: else -> h = 0
	fi
}

/* Publisher::push(c, entry) */
inline push(c, entry, a)
{
	d_step { /* push: ring[tail].store, tail.store (a consumer reads the entry after the tail) */
		ring[c * RC + tail[c] % RC] = entry;
		tail[c] = tail[c] + 1;
		if
		:: entry != EOSE -> qcount[c * NS + E_SLOT(entry)]++
		:: else -> skip
		fi
	}
	d_step { a = armed[c]; armed[c] = 0 } /* push: armed.load() && armed.exchange(0) */
	if
	:: a -> evfd[c] = 1; a = 0 /* push: write(eventfd) */
	:: else -> skip
	fi
}

/*
 * wait_for_progress(header, COND, deadline) in the owner. TMO: whether the deadline
 * may pass (block policy). acquire() waits without one here, so that a lost
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

/* publish: choose_targets, for consumer c */
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
			:: tail[c] - h < QS -> h = 0; break /* choose_targets: tail.load */
			:: else -> h = 0
			fi;
#if POLICY == DROP_NEW
			take = 0;
			break;
#endif
#if POLICY == BLOCK
			wait_progress((shut || cstate[c] != C_ACTIVE || tail[c] - head[c] < QS), true, res, seen);
			if
			:: shut || cstate[c] != C_ACTIVE -> take = 0; break
			:: else -> skip
			fi;
			if
			:: res -> res = 0 /* moved: look again */
			:: else -> drop_oldest(c, h, e) /* timed out: drop the oldest */
			fi
#else
			drop_oldest(c, h, e) /* drop-oldest */
#endif
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
		push(c, ENTRY(seq, i), a);
		if
		:: detached[c] -> /* publish: detached.load after the push */
			do
			:: head[c] != tail[c] -> drop_oldest(c, h, e)
			:: else -> break
			od
		:: else -> skip
		fi
	:: else -> skip
	fi
}

/* end_of_stream(), for consumer c */
inline eos_target(c)
{
	if
	:: cactive[c] ->
		do
		:: tail[c] - head[c] >= RC -> drop_oldest(c, h, e)
		:: else -> break
		od;
		push(c, EOSE, a)
	:: else -> skip
	fi
}

/* ------------------------------------------------------------------------ */
/* The owner's producer thread: acquire / publish NF frames, EOS, close.     */
/* ------------------------------------------------------------------------ */
proctype Producer()
{
	byte f, i, s0, h, e, seen, masks, taken, a, seq;
	byte cursor = 2; /* acquire_cursor: frame 3 went to slot 1 */
	bit ok, take, res;
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
			if
			:: !ok ->
				i = (cursor + 2) % NS;
				try_reclaim(i, S_WRITING, ok, s0)
			:: else -> skip
			fi;
			if
			:: !ok ->
#if POLICY == DROP_OLDEST
				/* acquire: drop_globally_oldest() under publish_lock. The victim is
				 * any consumer with a frame at its head, a superset of the code's
				 * choice (the oldest, preferring one whose drop frees its slot). */
				lock(1);
				if
				:: cactive[0] && head[0] != tail[0] && ring[head[0] % RC] != EOSE ->
					drop_oldest(0, h, e); plock = 0; goto retry
				:: cactive[1] && head[1] != tail[1] && ring[RC + head[1] % RC] != EOSE ->
					drop_oldest(1, h, e); plock = 0; goto retry
				:: else -> plock = 0
				fi;
#endif
				wait_progress(ANY_FREE, false, res, seen);
				res = 0;
				goto retry
			:: else -> cursor = i + 1
			fi;
#ifdef GPU
#ifndef MUTATION_NO_PENDING_CHECK
			/* acquire: sync->wait_done(i, meta.seq, stream) */
			skip;
			d_step { a = pending[i]; pending[i] = 0 } /* wait_done: pending.exchange(0) */
			/* enqueueing on the process's own stream is local: folded into the load */
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
			d_step { plock = 0; f++; masks = 0; taken = 0; seq = 0 } /* publish: unlock */
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
		:: cactive[0] -> armed[0] = 0; evfd[0] = 1 /* shutdown: armed.store(0), write(eventfd) */
		:: else -> skip
		fi;
		if
		:: cactive[1] -> armed[1] = 0; evfd[1] = 1
		:: else -> skip
		fi;
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

proctype Reaper()
{
	byte c, s0;
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
		cactive[c] = 0;
#ifdef GPU
		/* reap: sync->release_dead_holder(1 + c, published_count) */
		DONE(0, 1 + c) = pcount;
		DONE(1, 1 + c) = pcount;
		DONE(2, 1 + c) = pcount;
#endif
		reap_slot(c, 0);
		reap_slot(c, 1);
		reap_slot(c, 2);
		skip;
		d_step { /* reap: head.store(0), tail.store(0): the ring is discarded */
			head[c] = 0;
			tail[c] = 0;
			qcount[c * NS] = 0;
			qcount[c * NS + 1] = 0;
			qcount[c * NS + 2] = 0
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

/* ------------------------------------------------------------------------ */
/* A consumer process (one thread; a second, the owner watch, for GPU).      */
/* ------------------------------------------------------------------------ */

/* PoolImpl::notify_owner: owner_waiting.load; if set, progress.fetch_add + wake */
#define NOTIFY_OWNER \
	if \
	:: owner_waiting != 0 -> BUMP \
	:: else -> skip \
	fi

/* Ghost: consumer c starts to use frame SQ in slot S, which it now holds. */
#define USE_FRAME(c, s, sq) \
	assert(mseq[s] == (sq)); /* not reused since it was queued or probed */ \
	assert(state[s] == S_PUBLISHED || state[s] == S_EXCLUSIVE || state[s] == S_RECLAIMING); \
	assert(inplace[s] == 0); /* nobody writes it in place */ \
	lref[c * NS + s]++

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
	atomic { /* mark_done: pending.fetch_or(bit), then cuStreamWriteValue64(done) (local) */
		lref[c * NS + s]--;
		pending[s] = pending[s] | CBIT(c);
		cq[c] ! OP_DONE, s, 1 + c, mseq[s]
	}
#else
	d_step {
		lref[c * NS + s]--;
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
 * frame, or get_mut of a probed one). Sets ok: writable in place.
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
			assert(c == 1 || !LIVE(1) || (lref[NS + s] == 0 && qcount[NS + s] == 0));
			assert(c == 0 || !LIVE(0) || (lref[s] == 0 && qcount[s] == 0));
			inplace[s] = c + 1;
			excl = excl | (1 << s);
			x = 0;
			ok = 0
		}
	:: else -> x = 0
	fi
}

proctype Consumer(byte c)
{
	byte h, e, s, x, probes;
	bit ok, drain_pending, armed_once, gone, holding;
	byte excl; /* patched PoolImpl: bit s, this process took slot s EXCLUSIVE */
	armed_once = 1; /* start_consumer: the owner armed us at attach */
	holding = 1; /* consumer 0 holds frame 2 in slot 0, consumer 1 frame 1 in slot 2 (init) */
	s = 2 * c;
	{
		do
		:: !holding ->
			/* Subscriber::receive(no timeout, stream) */
recv:
			skip;
			d_step { /* receive: armed.load, read(eventfd), armed.load: one step (local wake-up
				  * bookkeeping: a late eventfd write is what drain_pending covers) */
				if
				:: drain_pending || (armed_once && armed[c] == 0) ->
					if
					:: evfd[c] -> evfd[c] = 0; drain_pending = 0; armed_once = 0
					:: else -> drain_pending = (armed[c] == 0)
					fi
				:: else -> skip
				fi
			}
			h = head[c]; /* receive: head.load */
			if
			:: tail[c] != h -> /* receive: tail.load */
				e = ring[c * RC + h % RC]; /* receive: ring[h].load */
				d_step { /* receive: head CAS h -> h + 1 */
#ifdef MUTATION_HEAD_STORE
					head[c] = h + 1; /* the mutant stores instead */
					ok = 1;
#else
					if
					:: head[c] == h -> head[c] = h + 1; ok = 1
					:: else -> ok = 0; h = 0; e = 0
					fi;
#endif
					if
					:: ok -> /* ghost: this taker owns position h */
						assert(!(tk[c] & (1 << h)));
						tk[c] = tk[c] | (1 << h);
						if
						:: e != EOSE -> assert(qcount[c * NS + E_SLOT(e)] > 0);
							qcount[c * NS + E_SLOT(e)]--
						:: else -> assert(tk[c] == (1 << (h + 1)) - 1) /* EOS: nothing was lost */
						fi
					:: else -> skip
					fi
				}
				if
				:: !ok -> goto recv
				:: else -> ok = 0
				fi;
				NOTIFY_OWNER; /* receive: notify_owner */
				if
				:: e == EOSE -> break /* end of stream */
				:: else -> skip
				fi;
				skip;
				d_step { /* receive: local_refs[index]++ */
					s = E_SLOT(e);
					assert(holders[s] & CBIT(c)); /* queued implies held */
					USE_FRAME(c, s, E_SEQ(e));
					holding = 1;
					h = 0
				}
#ifdef GPU
				atomic { /* wait_ready: ready.load; the enqueues are local */
					if
					:: ready[s] < E_SEQ(e) ->
						cq[c] ! OP_WAIT_READY, s, 0, E_SEQ(e) /* cuStreamWaitValue64 */
					:: else -> skip
					fi;
					cq[c] ! OP_READ, s, 0, E_SEQ(e) /* the consumer's kernels read it */
				}
#endif
				e = 0
			:: else ->
				if
				:: gone || pool_closed -> break /* receive: state.load: closed */
				:: else -> skip
				fi;
				skip;
				d_step { armed[c] = 1; armed_once = 1 } /* receive: armed.store(1) */
				if
				:: tail[c] != h -> h = 0; goto recv /* receive: tail.load again */
				:: else -> h = 0
				fi;
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
			:: (EXCL & (1 << c)) && inplace[s] != c + 1 -> /* BufferGuard::try_make_writable */
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
		do
		:: h = head[c]; /* detach_queue: head.load */
			if
			:: tail[c] == h -> h = 0; break /* detach_queue: tail.load */
			:: else -> skip
			fi;
			e = ring[c * RC + h % RC]; /* detach_queue: ring[h].load */
			d_step { /* detach_queue: head CAS h -> h + 1 */
				if
				:: head[c] == h ->
					head[c] = h + 1;
					ok = 1;
					assert(!(tk[c] & (1 << h)));
					tk[c] = tk[c] | (1 << h);
					if
					:: e != EOSE -> qcount[c * NS + E_SLOT(e)]--
					:: else -> skip
					fi
				:: else -> ok = 0
				fi;
				h = 0
			}
			if
			:: ok && e != EOSE && lref[c * NS + E_SLOT(e)] == 0 ->
				x = s; /* keep the held slot */
				s = E_SLOT(e);
				clear_holder_bit(c, s);
				s = x;
				x = 0
			:: else -> skip
			fi;
			skip;
			d_step { ok = 0; e = 0 }
		od;
		/* then the guards go, then the socket */
		if
		:: holding -> release(c, s); d_step { holding = 0; s = 0 }
		:: else -> skip
		fi;
#if defined(GPU) && defined(SYNC_AT_CLOSE)
		/* proposed fix (README.md, "Finding 2"): ~PoolImpl synchronizes the
		 * consumer's streams before its socket closes */
		len(cq[c]) == 0 && !cbusy[c];
#endif
		skip;
		d_step { exited[c] = 1; chup[c] = 1 }
	} unless { killed[c] }
}

/* A consumer that takes nothing (a stalled one) and is killed once the producer is
 * done, if not before. */
proctype Passive(byte c)
{
	(pdone || odead || killed[c]);
	d_step {
		if
		:: !killed[c] ->
			killed[c] = 1;
			chup[c] = 1;
			lref[c * NS] = 0;
			lref[c * NS + 1] = 0;
			lref[c * NS + 2] = 0
		:: else -> skip
		fi
	}
}

/* SIGKILL of consumer c at any moment, or never. */
proctype Killer(byte c)
{
	if
	:: !exited[c] ->
		d_step {
			killed[c] = 1;
			chup[c] = 1; /* the kernel closes its socket */
			lref[c * NS] = 0;
			lref[c * NS + 1] = 0;
			lref[c * NS + 2] = 0;
			if
			:: inplace[0] == c + 1 -> inplace[0] = 0
			:: else -> skip
			fi;
			if
			:: inplace[1] == c + 1 -> inplace[1] = 0
			:: else -> skip
			fi;
			if
			:: inplace[2] == c + 1 -> inplace[2] = 0
			:: else -> skip
			fi;
#ifdef GPU
			/* the driver drops a dead process's queued GPU work */
			reading[c * NS] = 0;
			reading[c * NS + 1] = 0;
			reading[c * NS + 2] = 0;
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
		(ohup && odead) || exited[c]; /* poll(socket, watch_stop) */
		if
		:: exited[c] -> skip /* ~Subscriber stops the watch */
		:: else ->
			dead_owner_slot(0);
			dead_owner_slot(1);
			dead_owner_slot(2)
		fi
	} unless { killed[c] }
}
#endif

/* ------------------------------------------------------------------------ */
/* Properties                                                                */
/* ------------------------------------------------------------------------ */

/* No slot is FREE or being rewritten while a live consumer holds or has queued it. */
#define NOT_HELD(c, s) (!LIVE(c) || (lref[(c) * NS + (s)] == 0 && qcount[(c) * NS + (s)] == 0))
#define REUSE_OK(s) ((state[s] != S_WRITING && state[s] != S_FREE) || (NOT_HELD(0, s) && NOT_HELD(1, s)))
/* Queued implies held. */
#define QUEUED_HELD(c, s) (!LIVE(c) || qcount[(c) * NS + (s)] == 0 || (holders[s] & CBIT(c)))
/* Whoever writes in place holds the slot EXCLUSIVE (or a reclaim that will back off
 * has it RECLAIMING for a moment). */
#define INPLACE_OK(s) (inplace[s] == 0 || state[s] == S_EXCLUSIVE || state[s] == S_RECLAIMING)
#define INV \
	(REUSE_OK(0) && REUSE_OK(1) && REUSE_OK(2) && QUEUED_HELD(0, 0) && QUEUED_HELD(0, 1) && \
	 QUEUED_HELD(0, 2) && QUEUED_HELD(1, 0) && QUEUED_HELD(1, 1) && QUEUED_HELD(1, 2) && INPLACE_OK(0) && \
	 INPLACE_OK(1) && INPLACE_OK(2))

active proctype Monitor()
{
end_watch:
	atomic { !INV -> assert(INV) }
}

#ifdef GPU
#define STREAMS_IDLE \
	(len(oq) == 0 && !obusy && (killed[0] || (len(cq[0]) == 0 && !cbusy[0])) && \
	 (killed[1] || (len(cq[1]) == 0 && !cbusy[1])))
#else
#define STREAMS_IDLE true
#endif

/* When everything has stopped, the slots are free again. A run that cannot get
 * here ends in an invalid end state (a deadlock, or a stream waiting forever). */
active proctype Final()
{
	(pdone || odead) && (rdone || odead) && (exited[0] || killed[0]) && (exited[1] || killed[1]) &&
		(odead || shut || (reaped[0] && reaped[1])) && (odead || STREAMS_IDLE);
	skip;
	d_step {
		if
		:: !odead && !shut -> /* the owner lives: every slot is free */
			assert(holders[0] == 0 && SLOT_IS_FREE(0));
			assert(holders[1] == 0 && SLOT_IS_FREE(1));
			assert(holders[2] == 0 && SLOT_IS_FREE(2))
		:: else -> /* no reaper: the exited consumers let go of what they held */
			assert(!exited[0] || (lref[0] == 0 && lref[1] == 0 && lref[2] == 0));
			assert(!exited[1] || (lref[NS] == 0 && lref[NS + 1] == 0 && lref[NS + 2] == 0));
			if
			:: !odead -> /* the owner closed: their bits are gone too */
				assert(!exited[0] || !((holders[0] | holders[1] | holders[2]) & CBIT(0)));
				assert(!exited[1] || !((holders[0] | holders[1] | holders[2]) & CBIT(1)))
			:: else -> skip /* the owner died: a bit it set for a queue it never
					 * reached stays, harmlessly: a dead owner's slots are
					 * never reused (a new owner makes a new pool) */
			fi
		fi
	}
}

/*
 * The run starts mid-stream, so that one or two more frames meet every case:
 * frame 1 in slot 2 is held by consumer 1, frame 2 in slot 0 by consumer 0 (both
 * received them), and frame 3 in slot 1 is queued to both, whose queues
 * (queue_size 1) are therefore full. The producer then publishes NF frames
 * (4, ...): acquire finds every slot held and must wait for a release, reclaim
 * against get() probes, or drop a queued frame; publish meets full queues.
 */
init
{
	atomic {
		cstate[0] = C_ACTIVE; /* admit: state.store(ACTIVE) */
		cstate[1] = C_ACTIVE;
		cactive[0] = 1;
		cactive[1] = 1;
		state[0] = S_PUBLISHED;
		mseq[0] = 2;
		holders[0] = CBIT(0);
		lref[0] = 1;
		state[2] = S_PUBLISHED;
		mseq[2] = 1;
		holders[2] = CBIT(1);
		lref[NS + 2] = 1;
		state[1] = S_PUBLISHED;
		mseq[1] = 3;
		holders[1] = CBIT(0) | CBIT(1);
		ring[0] = ENTRY(3, 1);
		ring[RC] = ENTRY(3, 1);
		tail[0] = 1;
		tail[1] = 1;
		qcount[1] = 1;
		qcount[NS + 1] = 1;
		pcount = 3;
		evfd[0] = 1; /* frame 3's push took armed and wrote the eventfds */
		evfd[1] = 1;
#ifdef GPU
		ready[0] = 2;
		ready[1] = 3;
		ready[2] = 1;
		gwritten[0] = 2;
		gwritten[1] = 3;
		gwritten[2] = 1;
		cq[0] ! OP_READ, 0, 0, 2; /* the consumers' kernels still read what they hold */
		cq[1] ! OP_READ, 2, 0, 1;
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
#endif
	}
}
