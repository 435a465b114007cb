/* tickets.pml - frame tickets (lib/ticket.cpp; Publisher::publish_ticket, end_tickets,
 * try_reclaim) against expiry and reaping: one slot the owner reuses for FRAMES
 * ticketed frames, REDEEMERS consumer processes redeeming tickets of any of those frames
 * (stale ones included) and forged ones, one of which may be SIGKILLed at any step and
 * reaped. tests/model/check.sh runs it (runs "tickets", "tickets-2"; mutants below).
 * With -DBY_INDEX the redeemers hold by meta index instead (PoolImpl::get_named): the
 * frames are published by set_ref_count (a ticket's words, and the slot's counted word),
 * and a get names a frame by the slot's generation (frame_gen), which claim() writes
 * when it hands the slot out (runs "meta-index", "meta-index-2").
 *
 * Properties (safety, exhaustive):
 * - a redemption that succeeds holds the ticket's own frame, and the frame does not
 *   change while it is held;
 * - a ticket gives at most its redemptions, none after the owner ended it, and a
 *   forged ticket none;
 * - a redemption taken (the CAS of ticket_left) is never refused afterwards: nothing is
 *   counted that the redeemer does not get;
 * - the owner never takes back a slot whose ticket is live (WRITING with no check word);
 * - at the end (redeemers done or killed and reaped, every ticket ended) no holder bit
 *   is left and no check word: nothing leaks.
 *
 * Each step names its C++ function. Steps are sequentially consistent, as the code's
 * atomics on these words are (seq_cst). The TTL is not timed: the owner may end a live
 * ticket at any moment (end_tickets runs in acquire and on the I/O thread's timer).
 */

#ifndef FRAMES
#define FRAMES 2
#endif
#ifndef REDEEMERS
#define REDEEMERS 2
#endif
#ifndef REDEMPTIONS
#define REDEMPTIONS 1
#endif
#ifndef TRIES
#define TRIES 2
#endif

/* Seeded bugs (check.sh --mutants), each must give a counterexample:
 * M_NO_SEQ_CHECK  redeem() does not compare the slot's seq and check word once it holds it
 * M_CAS_FIRST     redeem() takes its redemption before it holds the slot
 * M_NO_OWNER_HOLD publish_ticket() lets the owner's reference go, as publish() does
 * M_NO_ZERO       end_tickets() releases the owner's hold without zeroing ticket_left and
 *                 ticket_check
 * M_NO_RELEASE    end_tickets() forgets the owner's hold
 * With BY_INDEX:
 * M_NO_GEN_CHECK  get_named() does not compare the slot's frame_gen once it holds it
 * M_COUNTED_LATE  put_out() writes the counted word after PUBLISHED, so a get may see a
 *                 counted frame as one published to queues and hold it without a hold */

#define FREE 0
#define WRITING 1
#define PUBLISHED 2
#define RECLAIMING 4

#define OWNER 1
#define BIT(r) (1 << (1 + (r)))

byte state = FREE;
byte holders = 0; /* SlotRecord::holders: bit 0 the owner, bit 1 + r redeemer r */
byte seq = 0; /* meta.seq of the frame in the slot */
byte check = 0; /* ticket_check: 0 none, else frame seq + 100 (never 0) */
byte left = 0; /* ticket_left */
byte gen = 0; /* frame_gen: the frame's generation, here its number k */
bool counted = false; /* counted: published for a number of holders */
byte redeemed[FRAMES + 1]; /* ghost: successful redemptions of frame k's ticket */
bool over[FRAMES + 1]; /* ghost: the owner ended frame k's ticket */
bool dead[REDEEMERS];
bool done[REDEEMERS];

proctype Owner()
{
	byte k = 1; /* the next frame */
	byte live = 0; /* the frame whose ticket is live (Publisher::tickets), 0 none */
	do
	:: k > FRAMES && live == 0 -> break
	:: k <= FRAMES ->
		/* acquire -> try_reclaim(slot, WRITING): FREE, or PUBLISHED with no holder,
		 * through RECLAIMING and a second look (the Dekker half against get()). */
		if
		:: atomic { state == FREE -> state = WRITING; holders = holders | OWNER }
		:: atomic { state == PUBLISHED && holders == 0 -> state = RECLAIMING };
			if
			:: holders != 0 -> state = PUBLISHED; goto next /* a get() probe: back off */
			:: else -> atomic { state = WRITING; holders = holders | OWNER }
			fi
		:: live != 0 -> goto next /* no free slot: acquire's wait, in which tickets end */
		fi;
		/* The slot is the owner's (a get() probe's bit may come and go: it finds the
		 * slot WRITING and backs off); no live ticket may be on it. */
		assert(check == 0);
		gen = k; /* claim(): frame_gen, and counted cleared, before the guard exists */
		counted = false;
		seq = k; /* acquire's meta reset, the payload, publish's meta */
		/* put_out: the ticket words, then PUBLISHED. */
		left = REDEMPTIONS;
		check = k + 100;
#ifndef M_COUNTED_LATE
		counted = true;
		state = PUBLISHED;
#else
		state = PUBLISHED;
		counted = true;
#endif
#ifdef M_NO_OWNER_HOLD
		holders = holders & ~OWNER;
#endif
		live = k; /* the ticket goes out over the application's channel */
		k++;
next:
		skip
	:: live != 0 ->
		/* end_tickets: used up, or its TTL ran out (any moment). */
		if
		:: left == 0
		:: true
		fi;
#ifndef M_NO_ZERO
		atomic { over[live] = true; left = 0 }; /* ticket_left.exchange(0) */
		check = 0;
#else
		over[live] = true;
#endif
#if !defined(M_NO_OWNER_HOLD) && !defined(M_NO_RELEASE)
		holders = holders & ~OWNER; /* pool_.release(slot): the owner's reference */
#endif
		live = 0
	od
}

/* Redeemer r: TRIES calls of get(ticket) (PoolImpl::redeem), each with a ticket of
 * some frame t, or a forged one (t == 0). Killed at any step (unless): the reaper then
 * clears its bit. */
proctype Redeemer(byte r)
{
	byte t, c, tries = 0;
	bool took = false;
	{
		do
		:: tries == TRIES -> break
		:: else ->
			tries++;
			took = false;
			if
			:: t = 1
			:: t = FRAMES
			:: t = 0
			fi;
			c = (t == 0 -> 99 : t + 100);
#ifndef BY_INDEX
			/* A stale ticket is refused before the holder bits are touched. */
			if
			:: check != c -> goto refused
			:: else
			fi;
#else
			/* A meta index of frame t (t == 0: one no frame had): an earlier frame's is
			 * refused before the holder bits are touched. */
			if
			:: gen != (t == 0 -> 99 : t) -> goto refused
			:: else
			fi;
#endif
#ifdef M_CAS_FIRST
			if
			:: atomic { left > 0 -> left--; took = true; redeemed[t]++ }
			:: atomic { left == 0 -> skip }; goto refused
			fi;
#endif
			/* hold_published: our bit, then the state (Dekker with try_reclaim). */
			holders = holders | BIT(r);
			(state != RECLAIMING); /* spin while the owner looks */
			if
			:: state != PUBLISHED -> holders = holders & ~BIT(r); goto refused
			:: else
			fi;
#ifndef BY_INDEX
#ifndef M_NO_SEQ_CHECK
			/* Holding it: still the ticket's frame, and its ticket still live? */
			if
			:: seq != t || check != c -> holders = holders & ~BIT(r); goto refused
			:: else
			fi;
#endif
#else
#ifndef M_NO_GEN_CHECK
			/* Holding it: still the named frame? */
			if
			:: gen != t -> holders = holders & ~BIT(r); goto refused
			:: else
			fi;
#endif
			/* A frame published to queues is held as it is: none is, here, so a get
			 * that takes this branch held a counted frame without one of its holds. */
			if
			:: !counted ->
				redeemed[t]++;
				assert(t != 0 && !over[t] && redeemed[t] <= REDEMPTIONS);
				assert(false); /* every frame here is counted */
			:: else
			fi;
#endif
#ifndef M_CAS_FIRST
			/* One redemption: CAS of ticket_left from l > 0 to l - 1 (each try atomic):
			 * the ticket's, within its count and before its end. */
			if
			:: atomic {
				left > 0 -> left--; took = true; redeemed[t]++;
				assert(t != 0 && !over[t] && redeemed[t] <= REDEMPTIONS)
			}
			:: atomic { left == 0 -> skip }; holders = holders & ~BIT(r); goto refused
			fi;
#endif
			/* Redeemed: the ticket's own frame, held, and still so after the owner had
			 * its turns. */
			assert(seq == t);
			assert(seq == t);
			holders = holders & ~BIT(r);
			goto next;
refused:
			assert(!took); /* a redemption taken and then refused: lost */
next:
			skip
		od
	} unless { dead[r] };
	if
	:: atomic { !dead[r] -> done[r] = true }
	:: dead[r]
	fi
}

/* One redeemer may be SIGKILLed at any step; the owner's reaper then clears its bit
 * (Publisher::reap). */
proctype Killer()
{
	byte r;
	if
	:: r = REDEEMERS /* nobody dies */
	:: r = 0
	:: r = REDEEMERS - 1
	fi;
	if
	:: r < REDEEMERS ->
		if
		:: atomic { !done[r] -> dead[r] = true };
			holders = holders & ~BIT(r) /* the reaper */
		:: done[r] /* it finished first */
		fi
	:: else
	fi
}

init
{
	byte r;
	atomic {
		run Owner();
		for (r : 0 .. REDEEMERS - 1) {
			run Redeemer(r)
		}
		run Killer()
	};
	/* Everyone finished (a killed redeemer's process ends at its death). */
	(_nr_pr == 1);
	assert(holders == 0 && check == 0 && left == 0)
}
