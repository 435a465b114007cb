/* xmem.h - the C API of libxmem: named pools of shared, reference-counted frames.
 * Mirrors xmem.hpp for C callers, the GStreamer elements and language bindings. */
#ifndef XMEM_H
#define XMEM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define XMEM_MAX_DIMS 8
#define XMEM_MAX_PLANES 4
#define XMEM_CONTENT_TYPE_MAX 32
#define XMEM_PRODUCER_MAX 32
/* Longest format string (GStreamer caps), terminating NUL included. */
#define XMEM_FORMAT_MAX 2048
/* Most bytes of side data one frame carries (xmem_buffer_set_side_data): the slot
 * record holds them, in the control segment, whatever memory the slots are in. */
#define XMEM_SIDE_DATA_MAX 4096
/* Holder bit 0 is the owner; consumers use bits 1..127. */
#define XMEM_MAX_CONSUMERS 127
#define XMEM_MAX_SLOTS 1024
/* A frame's meta index (the seed's meta_index; xmem_buffer_meta_index): its slot in the
 * low XMEM_META_SLOT_BITS bits, the frame's generation (1 .. 2^22 - 2) above them, so an
 * index names one frame of a slot, never a later one. XMEM_NO_META_INDEX: a buffer in no
 * slot (a private copy, a spilled frame). */
#define XMEM_META_SLOT_BITS 10
#define XMEM_NO_META_INDEX UINT32_MAX
/* How long the holds set_ref_count publishes wait for their holders by default:
 * a holder whose process dies before its get() costs the slot this long at most. */
#define XMEM_HOLD_LIFETIME_NS 10000000000ull
/* "No value" for pts, dts and duration. */
#define XMEM_NONE UINT64_MAX
/* Timeout meaning "wait forever". */
#define XMEM_FOREVER INT64_MAX

/* Every call returns XMEM_OK (0) or one of these negative codes; xmem_last_error()
 * then holds a message naming the pool and the cause, for the calling thread. */
typedef enum xmem_status {
	XMEM_OK = 0,
	XMEM_EINVAL = -1, /* bad argument: null pointer, size 0, count out of range */
	XMEM_ENAME = -2, /* pool name too long or with illegal characters */
	XMEM_ENOENT = -3, /* no pool of that name (no socket, or nobody listening) */
	XMEM_EACCES = -4, /* permission denied (file mode or peer credentials) */
	XMEM_EBUSY = -5, /* a live owner already holds the name */
	XMEM_ENOTPOOL = -6, /* the peer is not an xmem pool, or spoke garbage */
	XMEM_EVERSION = -7, /* protocol or ABI version mismatch */
	XMEM_EBADSEG = -8, /* control segment with a wrong magic, version or size */
	XMEM_ERANGE = -9, /* slot index or size out of range */
	XMEM_ETIMEDOUT = -10, /* the wait ran out */
	XMEM_ECLOSED = -11, /* the pool's owner went away (closed or died) */
	XMEM_EEOS = -12, /* the producer ended the stream (not an error) */
	XMEM_EFULL = -13, /* no room: max-consumers already attached, no room for a size class,
			   * or none for a slot under the memory cap */
	XMEM_ENOTHELD = -14, /* this process holds no reference to that slot */
	XMEM_EREADONLY = -15, /* write access through a read-only guard */
	XMEM_EROLE = -16, /* call not allowed for this role (owner vs consumer) */
	XMEM_ESYSTEM = -17, /* a system call failed; the message names it */
	XMEM_ENOMEM = -18, /* out of memory */
	XMEM_EBADFRAME = -19, /* a received frame's layout (size, shape, strides, planes) does not
			       * fit its slot: refused and counted (xmem_pool_frames_refused); the
			       * next receive goes on */
	XMEM_EBADTICKET = -20, /* a frame ticket that names no live ticket of this pool: expired,
				* used up, forged, garbled or of another pool (never another frame) */
} xmem_status;

/* How a consumer waits for its next frame. */
typedef enum xmem_wake {
	XMEM_WAKE_SLEEP = 0, /* sleep until the producer's eventfd write wakes it */
	XMEM_WAKE_SPIN_BEFORE = 1, /* learn the frame period; near the expected arrival poll
				    * the queue instead of sleeping, at most spin_budget_us per
				    * frame; sleep when the stream is irregular. The pool's fd
				    * polls readable when the spin should start. */
} xmem_wake;

/* How a fifo-spill consumer of a CUDA pool receives the frames the spill tier holds
 * (a system pool's are host memory either way). xmem_buffer_spilled tells them. */
typedef enum xmem_spill_delivery {
	XMEM_SPILL_DELIVERY_DEVICE = 0, /* copied back into device memory of this consumer's
					 * own (a private copy, xmem_buffer_is_copy), on the
					 * stream it received on: device frames, whatever happened */
	XMEM_SPILL_DELIVERY_HOST = 1, /* as the tier holds them: host memory, read-only */
} xmem_spill_delivery;

/* How a consumer is served: the pool's default (xmem_pool_config) or each consumer's
 * own (xmem_open_options). One consumer's policy never changes what another receives. */
typedef enum xmem_policy {
	XMEM_POLICY_BLOCK = 0, /* every frame: with a full queue the publisher waits for
				* this consumer (up to its block timeout), then applies
				* its fallback (drop-oldest unless it chose drop-new) */
	XMEM_POLICY_FIFO = XMEM_POLICY_BLOCK,
	XMEM_POLICY_DROP_OLDEST = 1, /* the consumer's oldest queued frame is dropped */
	XMEM_POLICY_DROP_NEW = 2, /* the new frame is not queued for that consumer */
	XMEM_POLICY_LATEST = 3, /* a mailbox of one: a newer frame replaces the queued one */
	XMEM_POLICY_FIFO_SPILL = 4, /* every frame, never waited for: when the producer needs
				     * a slot held only by frames queued for such consumers,
				     * the frame used last is copied into the pool's spill tier
				     * (host memory, xmem_pool_config.spill_bytes) and its slot
				     * reused; past the tier's cap, the fallback applies */
} xmem_policy;

typedef enum xmem_storage {
	XMEM_STORAGE_SYSTEM = 0, /* memfd-backed system memory */
	XMEM_STORAGE_CUDA = 1, /* CUDA device memory, shared as VMM allocations */
} xmem_storage;

/* The element type of a frame's tensor (xmem_frame_meta.dtype): shape counts these.
 * BF16 is bfloat16. */
typedef enum xmem_dtype {
	XMEM_DTYPE_U8 = 0,
	XMEM_DTYPE_I8,
	XMEM_DTYPE_U16,
	XMEM_DTYPE_I16,
	XMEM_DTYPE_U32,
	XMEM_DTYPE_I32,
	XMEM_DTYPE_U64,
	XMEM_DTYPE_I64,
	XMEM_DTYPE_F16,
	XMEM_DTYPE_BF16,
	XMEM_DTYPE_F32,
	XMEM_DTYPE_F64,
} xmem_dtype;

/* Per-frame metadata, as the seed's BufferMeta plus what a video pipeline needs.
 * The producer fills it through a writable guard; publish() stamps the fields
 * marked (set by publish). Consumers read a copy taken when they received it. */
typedef struct xmem_frame_meta {
	uint32_t index; /* slot index (set by the pool) */
	uint8_t storage_type; /* xmem_storage (set by the pool) */
	uint8_t device_id; /* CUDA device, 0 for system memory (set by the pool) */
	uint8_t dtype; /* xmem_dtype */
	uint8_t ndim; /* dimensions used in shape/strides, <= XMEM_MAX_DIMS */
	uint64_t shape[XMEM_MAX_DIMS]; /* in elements of dtype */
	uint64_t strides[XMEM_MAX_DIMS]; /* in bytes */
	uint64_t size; /* payload bytes, <= slot size */
	uint64_t timestamp; /* CLOCK_MONOTONIC ns (set by publish when 0) */
	uint64_t seq; /* publish sequence number from 1 (set by publish) */
	uint64_t pts; /* ns or XMEM_NONE */
	uint64_t dts; /* ns or XMEM_NONE */
	uint64_t duration; /* ns or XMEM_NONE */
	uint32_t flags; /* free for the application (GstBufferFlags in the elements) */
	uint32_t producer_pid; /* (set by publish) */
	uint64_t format_seq; /* which format (xmem_buffer_format) this frame is in (set by publish) */
	/* Video layout (GstVideoMeta): planes, each at an offset with a row stride. */
	uint32_t n_planes; /* 0 when the payload is not planar video */
	uint32_t plane_stride[XMEM_MAX_PLANES];
	uint32_t reserved0;
	uint64_t plane_offset[XMEM_MAX_PLANES];
	char content_type[XMEM_CONTENT_TYPE_MAX]; /* e.g. "video/raw", "tensor" */
	char producer[XMEM_PRODUCER_MAX]; /* producer's name (set by publish) */
	/* When the frame was captured, in CLOCK_REALTIME ns since 1970, or 0 when unknown: a
	 * time other hosts' clocks can be compared with (NTP, PTP), unlike timestamp. The
	 * producer's to set: xmemsink takes it from a buffer's timestamp/x-ntp or
	 * timestamp/x-unix GstReferenceTimestampMeta (a camera's, or one a bridge from
	 * another host carried). Older producers leave it 0. */
	uint64_t capture_time;
	uint64_t reserved[7]; /* zero; room for later fields without an ABI break */
} xmem_frame_meta;

typedef struct xmem_pool_config {
	uint32_t slot_count; /* slots to preallocate, 1..XMEM_MAX_SLOTS */
	uint64_t slot_size; /* bytes per slot, > 0 */
	uint32_t max_consumers; /* 1..XMEM_MAX_CONSUMERS; 0 means 64 */
	xmem_policy policy; /* what a full consumer queue does */
	uint64_t block_timeout_ns; /* with XMEM_POLICY_BLOCK; 0 means 1 s */
	uint32_t mode; /* who may attach, as file permission bits (0660: the group too);
			* 0 means 0600. The owner checks every peer against it. */
	const char *format; /* initial format string (may be NULL) */
	const char *producer; /* producer's name for metadata (may be NULL) */
	uint32_t storage; /* xmem_storage of the slots; XMEM_STORAGE_SYSTEM by default */
	uint32_t device; /* CUDA device ordinal for XMEM_STORAGE_CUDA, else 0 */
	uint32_t has_group; /* nonzero: GROUP is the group mode's group bits let in */
	uint32_t group; /* a gid the owner is a member of; the socket's group */
	/* The spill tier for XMEM_POLICY_FIFO_SPILL consumers: at most SPILL_BYTES of
	 * frames (rounded up to pages each) in at most SPILL_FRAMES host buffers (0: one
	 * per slot's worth of bytes, at least one). 0 bytes: no spill tier. A CUDA pool's
	 * tier is page-locked at its whole size for as long as the pool lives. */
	uint64_t spill_bytes;
	uint32_t spill_frames;
	/* Slots of every size class together: SLOT_COUNT and room for classes
	 * xmem_pool_preallocate adds later (each a 6.5 KiB record in the control segment).
	 * 0: SLOT_COUNT + 64, at most XMEM_MAX_SLOTS. */
	uint32_t max_slots;
	/* Growth on demand: with MEMORY_CAP_MIB, acquiring system memory that no free slot
	 * fits makes a slot (in a dynamic size class of a quarter-power-of-two size) while
	 * the system memory of every class's slots stays within the cap; a free dynamic
	 * slot not acquired for TRIM_IDLE_MS (0: 10 s), or the least recently used one
	 * when a new slot would pass the cap, gives its memory back. 0 MiB: no growth. */
	uint32_t memory_cap_mib;
	uint32_t trim_idle_ms;
	/* Growth of CUDA device memory: as MEMORY_CAP_MIB, for the device memory of the
	 * pool's slots on each CUDA device (acquiring device memory that no free slot fits
	 * makes a slot). 0: device memory does not grow. */
	uint32_t device_memory_cap_mib;
	uint32_t reserved_config[3]; /* must be zero (xmem_pool_config_init does it) */
} xmem_pool_config;

/* A size class of a pool: COUNT slots of SLOT_SIZE bytes of one memory, slots
 * [first_slot, first_slot + count). Class 0 is the one the pool was created with. */
typedef struct xmem_size_class {
	uint32_t index;
	uint32_t storage; /* xmem_storage */
	uint32_t device; /* the owner's CUDA ordinal, 0 for system memory */
	uint32_t first_slot;
	uint32_t count;
	uint32_t sync_mode; /* how GPU work on its slots is ordered: 1 stream memory operations,
			     * 2 the CPU; 0 for system memory */
	uint64_t slot_size;
} xmem_size_class;

/* Fills a config with the defaults: 8 slots, no size (must be set), 64 consumers,
 * drop-oldest, 1 s block timeout, mode 0600, no spill tier. */
void xmem_pool_config_init(xmem_pool_config *config);

typedef struct xmem_open_options {
	int64_t timeout_ns; /* wait this long for the pool to appear; 0 = try once */
	uint32_t queue_size; /* frames this consumer may have queued; 0: its policy's default
			      * (4; 1 for latest; as many as the pool's ring holds for
			      * fifo-spill) */
	const char *client; /* this consumer's name, shown by xmem-inspect (may be NULL) */
	uint32_t has_policy; /* nonzero: POLICY is this consumer's; else the pool's applies */
	uint32_t policy; /* xmem_policy */
	uint32_t fallback; /* fifo and fifo-spill: XMEM_POLICY_DROP_OLDEST (0 means it too)
			    * or XMEM_POLICY_DROP_NEW, once the wait or the spill tier ends */
	uint32_t wake; /* xmem_wake: how receive() waits for the next frame */
	uint64_t block_timeout_ns; /* fifo: how long the publisher waits; 0: the pool's */
	uint32_t spin_budget_us; /* XMEM_WAKE_SPIN_BEFORE: most µs spun per frame; 0: 200 */
	uint32_t spill_delivery; /* xmem_spill_delivery: fifo-spill on a CUDA pool */
	uint32_t max_age_us; /* a frame older than this (its timestamp) when receive would hand
			      * it out is given back unread and counted (expired); 0: no limit */
	uint32_t max_held; /* the most slots it holds at once, queued or taken (OpenOptions::
			    * max_held); 0: half the pool's slots, at least its queue and one */
	uint32_t history; /* frames published before it attached, still in the pool, that it
			   * is given first (oldest first); 0: the live stream only */
	uint32_t reserved[4]; /* must be zero (xmem_open_options_init does it) */
} xmem_open_options;

void xmem_open_options_init(xmem_open_options *options);

/* xmem_pool_connect's options: the seed's new(name). */
typedef struct xmem_connect_options {
	int64_t timeout_ns; /* how long get() and receive() wait for another process to make
			     * the pool (acquire and preallocate make it) */
	uint64_t memory_cap_mib; /* the pool this handle makes grows on demand within these
				  * caps (system memory, each CUDA device's); 0: no growth */
	uint64_t device_memory_cap_mib;
	uint32_t mode; /* who may attach to the pool this handle makes (permission bits) */
	const char *client; /* this handle's name in the owner's consumer table (may be NULL) */
	uint32_t reserved[4]; /* must be zero (xmem_connect_options_init does it) */
} xmem_connect_options;
/* Defaults: a 10 s timeout, caps of 1024 MiB of system memory and 4096 MiB of each
 * CUDA device's, mode 0600. */
void xmem_connect_options_init(xmem_connect_options *options);

/* What a handle is to its pool (xmem_pool_role). */
typedef enum xmem_role {
	XMEM_ROLE_OWNER = 0,
	XMEM_ROLE_CONSUMER = 1,
	XMEM_ROLE_INSPECTOR = 2,
	XMEM_ROLE_NONE = 3, /* from xmem_pool_connect, before its pool was made or found */
} xmem_role;

typedef struct xmem_pool_stats {
	uint64_t published; /* frames published since the pool was created */
	uint64_t dropped; /* frames dropped for all consumers together */
	uint64_t reaped; /* consumers whose death was cleaned up */
	uint32_t consumers; /* consumers attached now */
	uint32_t slots_total;
	uint32_t slots_free; /* free, or published with no holder left */
	uint32_t closed; /* 1 once the owner closed the pool */
} xmem_pool_stats;

/* How one consumer is served, and what it lost: xmem_pool_consumer_stats. */
typedef struct xmem_consumer_stats {
	uint32_t policy; /* xmem_policy it is served with (its own or the pool's) */
	uint32_t fallback; /* fifo and fifo-spill: drop-oldest or drop-new */
	uint32_t queue_size; /* frames it may have queued */
	uint32_t queued; /* frames queued for it now, spilled ones included */
	uint64_t block_timeout_ns; /* fifo: how long the publisher waits for it */
	uint64_t received; /* frames it took off its queue */
	uint64_t dropped; /* frames it lost: its policy's drops and its fallback's */
	uint64_t spilled; /* its frames moved into the spill tier (fifo-spill) */
	uint64_t spin_ns; /* XMEM_WAKE_SPIN_BEFORE: time this handle spent polling the queue */
	uint64_t spins; /* spins started near an expected frame */
	uint64_t spins_caught; /* spins that found the frame (the others slept after) */
	uint64_t expired; /* frames given back unread for their age (xmem_open_options.max_age_us) */
	uint32_t held; /* slots this handle holds now: frames taken and not let go */
	uint32_t max_held; /* its cap, as the owner applies it (queued frames count too); 0: none */
	uint64_t reserved[4]; /* zero; room for later fields */
} xmem_consumer_stats;

/* The pool's spill tier (xmem_pool_config.spill_bytes): xmem_pool_spill_stats. */
typedef struct xmem_spill_stats {
	uint64_t cap_bytes; /* 0: the pool has no spill tier */
	uint32_t cap_frames;
	uint32_t frames; /* spilled frames held now */
	uint64_t bytes; /* host memory they take now (whole pages) */
	uint64_t peak_bytes; /* the most they took at once */
	uint64_t spilled; /* frames copied into the tier since the pool was created */
	uint64_t full; /* times a frame could not be spilled for an acquire: the tier was
			* full, and the consumers' fallbacks applied (the spill thread,
			* spilling ahead, stops at a full tier and counts nothing) */
	uint64_t resident_bytes; /* memory the tier holds: freed buffers' pages are kept for
				  * the next spill until the tier has been idle for 5 s */
	uint64_t reserved[3];
} xmem_spill_stats;

/* Growth on demand (xmem_pool_config.memory_cap_mib): xmem_pool_growth_stats. */
typedef struct xmem_growth_stats {
	uint64_t memory_cap; /* bytes; 0: the pool does not grow */
	uint64_t trim_idle_ns; /* how long a free dynamic slot keeps its memory */
	uint64_t system_bytes; /* system memory of every class's committed slots now */
	uint32_t dynamic_classes; /* bit c: size class c was made on demand */
	uint32_t dynamic_slots; /* dynamic slots whose memory is committed now */
	uint64_t dynamic_bytes; /* their memory */
	uint64_t grown; /* dynamic slots committed since the pool was created */
	uint64_t trimmed; /* dynamic slots whose memory went back */
	uint64_t refused; /* acquires that found no room under the cap */
	uint64_t device_memory_cap; /* bytes of each CUDA device; 0: device memory does not grow */
	uint64_t device_bytes; /* device memory of every class's committed slots now, all devices */
} xmem_growth_stats;

/* A frame ticket (xmem_pool_publish_ticket): one published frame of one pool, for a
 * number of redemptions (xmem_pool_get_ticket, in any process attached to the pool)
 * until it expires. Plain data: send it over any channel, as bytes or as the text of
 * xmem_ticket_format. The check word tells live tickets from stale or made-up ones;
 * it is no secret from processes attached to the pool, which may take any published
 * slot by index anyway. */
typedef struct xmem_ticket {
	uint32_t slot;
	uint32_t reserved; /* zero */
	uint64_t seq; /* the frame's publish sequence number */
	uint64_t check; /* random, never 0 */
} xmem_ticket;

/* "xmem-ticket:SLOT:SEQ:CHECK" (CHECK as 16 hex digits) fits in this many bytes. */
#define XMEM_TICKET_TEXT_MAX 64

/* A pool's tickets: xmem_pool_ticket_stats. */
typedef struct xmem_ticket_stats {
	uint64_t issued;
	uint64_t redeemed;
	uint64_t expired; /* ended with redemptions unused (their references given back) */
	uint32_t live; /* tickets whose slots the owner still holds */
	uint32_t reserved0;
	uint64_t reserved[2];
} xmem_ticket_stats;

typedef struct xmem_pool xmem_pool;
typedef struct xmem_buffer xmem_buffer;

/* Message for the last failed call on this thread ("" if none). */
const char *xmem_last_error(void);
/* Short fixed name of a status code ("XMEM_ETIMEDOUT"). */
const char *xmem_status_name(int status);

/* Policies and storages by name, from the library's one table of each (the C++ API's
 * policy_names and storage_name): static strings, no syscall. */
/* The name of POLICY: "fifo" (XMEM_POLICY_BLOCK is XMEM_POLICY_FIFO), "drop-oldest",
 * "drop-new", "latest", "fifo-spill"; NULL for another value. */
const char *xmem_policy_name(int policy);
/* The INDEX-th name xmem_policy_from_name accepts: "block" (XMEM_POLICY_FIFO) first, then
 * xmem_policy_name's by value; NULL from the last on. For listing the choices. */
const char *xmem_policy_name_at(uint32_t index);
/* The xmem_policy named NAME (one of xmem_policy_name_at's). Errors: XMEM_EINVAL for
 * another name or NULL. */
int xmem_policy_from_name(const char *name);
/* The name of STORAGE: "system", "cuda"; NULL for another value. Storages are numbered
 * from 0 without a gap: the first NULL ends them. */
const char *xmem_storage_name(uint32_t storage);
/* The xmem_storage named NAME. Errors: XMEM_EINVAL for another name or NULL. */
int xmem_storage_from_name(const char *name);

/* Creates pool NAME and becomes its owner (producer). All slots are allocated here.
 * Errors: XMEM_ENAME, XMEM_EINVAL, XMEM_EBUSY (live owner), XMEM_EACCES, XMEM_ESYSTEM. */
int xmem_pool_create(const char *name, const xmem_pool_config *config, xmem_pool **out);
/* Attaches to pool NAME as a consumer (options may be NULL).
 * Errors: XMEM_ENAME, XMEM_ENOENT, XMEM_EACCES, XMEM_ENOTPOOL, XMEM_EVERSION, XMEM_EBADSEG,
 * XMEM_EFULL, XMEM_ETIMEDOUT. */
int xmem_pool_open(const char *name, const xmem_open_options *options, xmem_pool **out);
/* The seed's new(NAME): a handle attached to pool NAME as a consumer when its owner is
 * there, else one whose first call that needs the pool settles it: preallocate and
 * acquire make it (this process its owner, a pool that grows within OPTIONS' caps),
 * get and receive wait OPTIONS' timeout for another process to make it. Two processes
 * making it at once: one owns it, the other attaches. The pool closes with its owner.
 * OPTIONS may be NULL (the defaults). Errors: XMEM_EINVAL, XMEM_ENAME, XMEM_EACCES,
 * XMEM_EVERSION (a pool there that this process cannot attach to). */
int xmem_pool_connect(const char *name, const xmem_connect_options *options, xmem_pool **out);
/* xmem_role of POOL (XMEM_ROLE_NONE for NULL). */
uint32_t xmem_pool_role(const xmem_pool *pool);
/* Drops the caller's handle. Buffers still alive keep the mapping; an owner's pool
 * closes now (consumers see XMEM_ECLOSED after their queue) and never waits for them. */
void xmem_pool_close(xmem_pool *pool);

/* A free slot for writing, waiting up to timeout_ns. No syscall unless it waits. A
 * consumer acquires too, as a producer besides the owner (a guest): the owner leases it
 * the slot over a connection of the guest's own, and publishes it on its behalf; its
 * leased slots go back when it dies (xmem.hpp, BufferPool::acquire). */
int xmem_pool_acquire(xmem_pool *pool, int64_t timeout_ns, xmem_buffer **out);
/* Publishes a writable buffer (from an acquire) to every consumer and drops the caller's
 * reference (buffer is consumed even on error). No syscall unless a consumer sleeps; a
 * guest's publish is a round trip to the owner, which does not queue it back to it. */
int xmem_pool_publish(xmem_pool *pool, xmem_buffer *buffer);
/* Owner: frames published after this carry the new format. */
int xmem_pool_set_format(xmem_pool *pool, const char *format);
/* Owner: queues an end-of-stream marker after the frames published so far. */
int xmem_pool_end_of_stream(xmem_pool *pool);
/* Consumer: the next frame, waiting up to timeout_ns (0: don't wait). XMEM_EEOS at
 * end of stream, XMEM_ECLOSED once the owner is gone and the queue is empty. For a
 * device pool a frame whose producer's GPU writes are not done within the timeout
 * stays this consumer's (XMEM_ETIMEDOUT): the next receive returns it first. A frame
 * whose layout does not fit its slot (another process wrote its metadata) is given
 * back unread and refused with XMEM_EBADFRAME; the next receive goes on. */
int xmem_pool_receive(xmem_pool *pool, int64_t timeout_ns, xmem_buffer **out);

/* CUDA streams. cuda_stream is a CUstream, passed opaquely so this header needs no
 * cuda.h; it belongs to the caller, who keeps it alive across the call. NULL means no
 * stream: the call then behaves as the one without _on_stream (the CPU waits where it
 * must). For a system-memory pool the stream is ignored. A CUDA call that fails
 * returns XMEM_ESYSTEM naming it. */

/* As xmem_pool_acquire, but for a device pool CUDA_STREAM is made to wait (on the GPU,
 * no CPU wait) until every consumer's GPU reads of the slot's last frame are done: write
 * the slot on that stream, or after it. Cost: a stream wait queued; the CPU waits only
 * for a free slot (a guest's lease: the owner's CPU waited for those reads). Errors:
 * XMEM_EINVAL, XMEM_EROLE (an inspector), XMEM_ETIMEDOUT, XMEM_ECLOSED, XMEM_ESYSTEM. */
int xmem_pool_acquire_on_stream(xmem_pool *pool, int64_t timeout_ns, void *cuda_stream, xmem_buffer **out);
/* As xmem_pool_acquire_on_stream (CUDA_STREAM may be NULL), a slot of SIZE bytes
 * or more in the first class's memory, from the smallest size class with one free;
 * SIZE 0: of the first class. XMEM_ERANGE when no class of that memory is that large. */
int xmem_pool_acquire_size(xmem_pool *pool, uint64_t size, int64_t timeout_ns, void *cuda_stream, xmem_buffer **out);
/* The same in STORAGE (for XMEM_STORAGE_CUDA, device DEVICE; 0 for system memory):
 * a pool may hold classes of system memory and of a CUDA device side by side. SIZE 0:
 * that memory's first class. */
int xmem_pool_acquire_memory(xmem_pool *pool, uint64_t size, uint32_t storage, uint32_t device, int64_t timeout_ns,
			     void *cuda_stream, xmem_buffer **out);
/* A copy of FRAME (any buffer this process holds) that is a buffer of this pool:
 * a free slot of STORAGE (DEVICE) that holds its payload, taken as
 * xmem_pool_acquire_memory takes one, with its bytes and metadata; publish it or make a
 * ticket of it. Into device memory the copy is queued on CUDA_STREAM; into system memory
 * it is complete on return. XMEM_ERANGE when no class of that memory is large enough. */
int xmem_pool_copy(xmem_pool *pool, const xmem_buffer *frame, uint32_t storage, uint32_t device, int64_t timeout_ns,
		   void *cuda_stream, xmem_buffer **out);
/* Owner: adds a size class of COUNT slots of SLOT_SIZE bytes, allocated now, and its
 * index in *CLASS_INDEX (may be NULL). STORAGE and DEVICE may differ from the first
 * class's: system memory and CUDA devices side by side (another memory in a pool with a
 * spill tier, or a device for system memory: XMEM_EINVAL).
 * Attached consumers take its frames like any other.
 * Errors: XMEM_EINVAL, XMEM_EROLE, XMEM_EFULL (max_slots or 32 classes reached),
 * XMEM_ENOMEM, XMEM_ESYSTEM, XMEM_ECLOSED, XMEM_ENOENT (no such CUDA device). */
int xmem_pool_preallocate(xmem_pool *pool, uint64_t slot_size, uint32_t count, uint32_t storage, uint32_t device,
			  uint32_t *class_index);
/* Any role: the size classes the owner has added so far (class 0 included), and one
 * of them (XMEM_ERANGE past the last). */
uint32_t xmem_pool_class_count(const xmem_pool *pool);
int xmem_pool_class_info(const xmem_pool *pool, uint32_t index, xmem_size_class *out);
/* As xmem_pool_publish (buffer is consumed even on error), but for a device pool
 * the frame is ready once the work queued on CUDA_STREAM so far is done: it is published
 * at once (a stream write queued) and consumers' streams wait on the GPU, with no CPU
 * synchronization (a guest's CPU waits for CUDA_STREAM before the owner publishes its
 * frame). Errors: XMEM_EINVAL (NULL, another pool's buffer, bad metadata),
 * XMEM_EREADONLY (not from acquire), XMEM_ERANGE (size), XMEM_EROLE, XMEM_ECLOSED,
 * XMEM_ESYSTEM. */
int xmem_pool_publish_on_stream(xmem_pool *pool, xmem_buffer *buffer, void *cuda_stream);
/* Consumer: as xmem_pool_receive, but for a device pool work queued on CUDA_STREAM
 * after this call sees the producer's writes (the stream waits on the GPU; the CPU
 * does not). Errors: as xmem_pool_receive, and XMEM_ESYSTEM. */
int xmem_pool_receive_on_stream(xmem_pool *pool, int64_t timeout_ns, void *cuda_stream, xmem_buffer **out);
/* Consumer: a file descriptor that polls readable when receive() may have something
 * to return (a frame, EOS or closure; for a frame kept back for its GPU writes,
 * readable again within 1 ms so a poller retries). Owned by the pool. */
int xmem_pool_fd(const xmem_pool *pool);
/* Current format string of the pool (owner: last set; consumer: as of attach or the
 * last frame received). Valid until the next call on this pool. */
const char *xmem_pool_format(const xmem_pool *pool);
int xmem_pool_stats_get(const xmem_pool *pool, xmem_pool_stats *stats);
/* Frames this handle took without their side data because its size in the slot
 * record was out of range (0 for a NULL pool). */
uint64_t xmem_pool_side_data_refused(const xmem_pool *pool);
/* Frames this handle refused (XMEM_EBADFRAME) because their layout did not fit their
 * slot: a size, shape, stride or plane another process wrote (0 for a NULL pool). */
uint64_t xmem_pool_frames_refused(const xmem_pool *pool);
/* Consumer: its policy, queue and losses, as the owner serves it. */
int xmem_pool_consumer_stats(const xmem_pool *pool, xmem_consumer_stats *stats);
/* Any role: the pool's spill tier (all zero without one). */
int xmem_pool_spill_stats(const xmem_pool *pool, xmem_spill_stats *stats);
/* Any role: growth on demand (all zero for a pool that does not grow). */
int xmem_pool_growth_stats(const xmem_pool *pool, xmem_growth_stats *stats);
uint64_t xmem_pool_slot_size(const xmem_pool *pool);
uint32_t xmem_pool_slot_count(const xmem_pool *pool);
/* xmem_storage of the pool's slots (XMEM_STORAGE_SYSTEM for a NULL pool). */
uint32_t xmem_pool_storage(const xmem_pool *pool);
/* CUDA device ordinal of a device pool in this process (0 for system memory or a NULL
 * pool). A consumer finds the producer's device by its UUID, so its ordinal may differ
 * from the producer's where CUDA_VISIBLE_DEVICES differs. */
uint32_t xmem_pool_device(const xmem_pool *pool);
/* How GPU work on device slots is ordered in this process: "stream-memops" (streams
 * wait on the GPU), "cpu" (the fallback: a CPU synchronization per publish and
 * release) or "none" (system memory, or a NULL pool). A static string. */
const char *xmem_pool_gpu_ordering(const xmem_pool *pool);
/* Row and plane alignment frames of this pool want: for device memory the device's
 * texture pitch alignment, at least 256 (NVENC's); 1 for system memory or a NULL pool. */
uint32_t xmem_pool_pitch_alignment(const xmem_pool *pool);
/* Fills META's video plane layout and size for a WIDTH x HEIGHT frame of FORMAT
 * ("NV12", "NV21", "I420", "YV12", "P010_10LE", "Y444", "GRAY8", "RGB", "BGR", "RGBA",
 * "BGRA", "RGBx", "BGRx"), rows and planes on multiples of ALIGNMENT (a power of two).
 * Errors: XMEM_EINVAL (NULL argument, unknown format, empty frame, bad alignment),
 * XMEM_ERANGE. */
int xmem_set_video_layout(xmem_frame_meta *meta, const char *format, uint32_t width, uint32_t height,
			  uint32_t alignment);
/* Plane PLANE of raw video FORMAT as xmem_set_video_layout() lays it out: *BYTES per
 * sample, ceil(width / *X_DIVISOR) samples a row, ceil(height / *Y_DIVISOR) rows (each
 * pointer may be NULL). Returns the format's plane count; XMEM_EINVAL for a NULL format,
 * an unknown one or a plane past its count. */
int xmem_video_plane(const char *format, uint32_t plane, uint32_t *bytes, uint32_t *x_divisor, uint32_t *y_divisor);

/* Seed API: the frame META_INDEX names (xmem_buffer_meta_index, sent by its producer),
 * read-only, with a reference of this process's own. A frame set_ref_count published
 * for N holders: one of its N holds (XMEM_ENOTHELD once all are taken or its lifetime
 * ended); any other published frame: while the slot still holds it. XMEM_ENOTHELD for a
 * slot reused since (never the later frame) or not published; XMEM_ERANGE for an index
 * of no slot. A plain slot index (below the pool's slot records) takes whatever frame the
 * slot holds, unless it was published for a number of holders. A device frame is ready
 * for any stream (the CPU waited for its writes). xmem_pool_get_mut: writable, in place
 * for a sole holder, else a private copy (copy-on-write). */
int xmem_pool_get(xmem_pool *pool, uint32_t index, xmem_buffer **out);
/* As xmem_pool_get, only while slot INDEX still holds frame SEQ (its meta's seq, sent
 * with the index): XMEM_ENOTHELD once the slot's frame changed, never the newer frame. */
int xmem_pool_get_seq(xmem_pool *pool, uint32_t index, uint64_t seq, xmem_buffer **out);
int xmem_pool_get_mut(xmem_pool *pool, uint32_t index, xmem_buffer **out);

/* Frame tickets (owner): publishes BUFFER (consumed, as xmem_pool_publish_on_stream) to
 * no queue and fills *TICKET, which REDEMPTIONS xmem_pool_get_ticket calls, in any
 * processes attached to the pool, may redeem within TTL_NS. The slot stays held until
 * every redemption is made or the TTL runs out; then its references left go back.
 * Errors: XMEM_EINVAL (NULL argument, 0 redemptions, TTL 0), XMEM_EROLE (an
 * inspector), and publish's. A guest's ticket is made by the owner as its own. */
int xmem_pool_publish_ticket(xmem_pool *pool, xmem_buffer *buffer, uint32_t redemptions, uint64_t ttl_ns,
			     void *cuda_stream, xmem_ticket *ticket);
/* Frame tickets (consumer): the frame TICKET names, read-only, with a reference of this
 * process's own; one of its redemptions. A device frame is ready for any stream (the CPU
 * waited for its writes). XMEM_EBADTICKET when the ticket is expired, used up, forged or
 * of another pool (never another frame); XMEM_ECLOSED once the owner closed the pool. */
int xmem_pool_get_ticket(xmem_pool *pool, const xmem_ticket *ticket, xmem_buffer **out);
/* TICKET as text, "xmem-ticket:SLOT:SEQ:CHECK", NUL-terminated in TEXT (SIZE bytes,
 * XMEM_TICKET_TEXT_MAX is enough). XMEM_ERANGE when SIZE is too small. */
int xmem_ticket_format(const xmem_ticket *ticket, char *text, size_t size);
/* The ticket TEXT names (what xmem_ticket_format wrote); XMEM_EBADTICKET otherwise. */
int xmem_ticket_parse(const char *text, xmem_ticket *ticket);
/* The pool's tickets: issued, redeemed, expired, live. */
int xmem_pool_ticket_stats(const xmem_pool *pool, xmem_ticket_stats *stats);
/* Seed API: publishes the frame META_INDEX names, which this process acquired, wrote and
 * has not published, for exactly COUNT holders in any processes: each xmem_pool_get of
 * META_INDEX takes one of them, and the slot comes back once those holders let go. Holds
 * nobody took within LIFETIME_NS (0: XMEM_HOLD_LIFETIME_NS) go back then (a holder whose
 * process died before its get). The acquired buffer is then empty but keeps its meta
 * index (xmem_buffer_meta_index); release or forget it. A counted publication is a frame
 * ticket (xmem_pool_ticket_stats counts it). Errors: XMEM_EINVAL (COUNT < 1 or over the
 * pool's consumer limit; META_INDEX of a frame this process did not acquire or published
 * already), XMEM_ENOTHELD (no frame of that index is being written here), publish's. */
int xmem_pool_set_ref_count(xmem_pool *pool, uint32_t meta_index, int32_t count, uint64_t lifetime_ns);
/* Non-RAII references of this process on a slot it holds (INDEX: a meta index or a slot
 * index). */
int xmem_pool_add_ref(xmem_pool *pool, uint32_t index);
int xmem_pool_release(xmem_pool *pool, uint32_t index);
/* Sets this process's own reference count on a slot it holds; 0 releases them all. */
int xmem_pool_set_local_refs(xmem_pool *pool, uint32_t index, uint32_t count);
/* This process's references on a slot (0 when not held). */
uint32_t xmem_pool_ref_count(const xmem_pool *pool, uint32_t index);

/* A buffer is one reference to a slot (or a private copy after copy-on-write). */
const xmem_frame_meta *xmem_buffer_meta(const xmem_buffer *buffer);
/* The frame's meta index (XMEM_META_SLOT_BITS): what xmem_pool_get takes in any
 * process and xmem_pool_set_ref_count publishes. XMEM_NO_META_INDEX for a buffer in no
 * slot, a forgotten one or NULL. Readable after xmem_pool_set_ref_count emptied BUFFER. */
uint32_t xmem_buffer_meta_index(const xmem_buffer *buffer);
/* Frees BUFFER without releasing its reference (the seed's forget): a frame
 * xmem_pool_set_ref_count published (nothing is left to release), or a reference this
 * process keeps until xmem_pool_release(meta index) or its exit. BUFFER is freed unless
 * the call fails: XMEM_EINVAL for a frame acquired and not published (its slot would be
 * lost): publish it, set_ref_count it or release it. */
int xmem_buffer_forget(xmem_buffer *buffer);
/* Writable metadata, NULL for a read-only buffer. */
xmem_frame_meta *xmem_buffer_meta_mut(xmem_buffer *buffer);
const void *xmem_buffer_data(const xmem_buffer *buffer);
/* NULL for a read-only buffer. */
void *xmem_buffer_data_mut(xmem_buffer *buffer);
/* Fills the tensor layout of a writable BUFFER's metadata: DTYPE (an xmem_dtype), NDIM
 * dimensions (0..XMEM_MAX_DIMS) of SHAPE[i] elements, STRIDES[i] bytes apart, each a
 * multiple of the element's size (DLPack counts strides in elements); NULL STRIDES:
 * C-contiguous, the last dimension fastest. Sets meta->size to the bytes the tensor
 * spans (raise it, up to the capacity, for a larger payload). NDIM 0 clears the shape:
 * the payload is plain bytes, and the size is left alone. Nothing changes on error.
 * No syscall. Errors: XMEM_EINVAL (NULL buffer, NULL shape with NDIM > 0, a DTYPE that
 * is none, NDIM over XMEM_MAX_DIMS, a stride not a multiple of the element size, a
 * broadcast or overlapping layout), XMEM_EREADONLY (a read-only buffer), XMEM_ERANGE
 * (the tensor spans more than the capacity, or more bytes than int64 counts). */
int xmem_buffer_set_tensor(xmem_buffer *buffer, uint32_t dtype, uint32_t ndim, const uint64_t *shape,
			   const uint64_t *strides);
/* Capacity: the slot size. */
uint64_t xmem_buffer_capacity(const xmem_buffer *buffer);
/* Format string of this frame. */
const char *xmem_buffer_format(const xmem_buffer *buffer);
/* Side data: up to XMEM_SIDE_DATA_MAX bytes of the application's own that travel with
 * a frame (the GStreamer elements put the buffer's GstMetas there), kept in the slot's
 * record in the control segment, so device frames carry it in system memory too.
 * Owner or guest: sets the side data of a buffer from xmem_pool_acquire, sent with it by
 * publish (a copy of SIZE bytes at DATA is taken now; SIZE 0 clears it). No syscall.
 * Errors: XMEM_EINVAL (NULL buffer, or NULL data with SIZE > 0), XMEM_EREADONLY (not a
 * buffer from acquire), XMEM_ERANGE (SIZE > XMEM_SIDE_DATA_MAX: nothing is truncated). */
int xmem_buffer_set_side_data(xmem_buffer *buffer, const void *data, size_t size);
/* The frame's side data, *SIZE bytes (0 and NULL when it has none): a copy taken when
 * it was received, valid while the buffer is. A consumer refuses side data whose size
 * in the slot record is over XMEM_SIDE_DATA_MAX (a hostile peer wrote it): the frame
 * then comes with none, and xmem_pool_side_data_refused counts it. SIZE may be NULL. */
const void *xmem_buffer_side_data(const xmem_buffer *buffer, size_t *size);
/* 1 when BUFFER may be written now (xmem_buffer_data_mut, xmem_buffer_meta_mut): a
 * buffer from acquire or get_mut, or one xmem_buffer_try_make_writable made writable.
 * A received frame is 0 until then, also when this process is its only holder. */
int xmem_buffer_is_writable(const xmem_buffer *buffer);
/* Makes a read-only BUFFER writable in place when this process is the frame's only
 * holder and holds it once (this buffer is its one reference here): the slot is then
 * this process's alone, and other processes' xmem_pool_get refuses it, until BUFFER is
 * released. Never copies (xmem_pool_get_mut copies a shared frame). Returns 1 when
 * BUFFER is writable (it was, or is now), 0 when it is not: other processes or other
 * references hold the frame, it came from the spill tier, it is a private read-only
 * copy, or BUFFER is NULL. No syscall. */
int xmem_buffer_try_make_writable(xmem_buffer *buffer);
/* 1 when copy-on-write gave this buffer a private copy. */
int xmem_buffer_is_copy(const xmem_buffer *buffer);
/* 1 when the frame came out of the pool's spill tier (XMEM_POLICY_FIFO_SPILL): host
 * memory, or on a CUDA pool the consumer's device copy of it (xmem_spill_delivery). */
int xmem_buffer_spilled(const xmem_buffer *buffer);
/* A new read-only reference to the same frame. */
int xmem_buffer_clone(const xmem_buffer *buffer, xmem_buffer **out);
/* Drops the reference (NULL is fine). For a device frame the slot is reused only
 * after this process's work on it is done, waited for on the CPU: the primary and
 * the current context's streams, and the stream the frame was acquired or received
 * on (which must live until then). See xmem_buffer_release_on_stream. */
void xmem_buffer_release(xmem_buffer *buffer);
/* Drops the reference once the work queued on CUDA_STREAM so far is done, without a
 * CPU wait: the producer's GPU waits for it before rewriting the slot. The buffer is
 * freed in all cases, error included, and must not be used again. NULL stream: as
 * xmem_buffer_release. Errors: XMEM_EINVAL (NULL buffer), XMEM_ENOTHELD, XMEM_ESYSTEM. */
int xmem_buffer_release_on_stream(xmem_buffer *buffer, void *cuda_stream);

/* Device frames. Their bytes are not CPU memory: xmem_buffer_data() and
 * xmem_buffer_data_mut() return NULL; use the device pointer, or a copy. */

/* xmem_storage of the frame's bytes (XMEM_STORAGE_SYSTEM for a NULL buffer). */
uint32_t xmem_buffer_storage(const xmem_buffer *buffer);
/* CUDA device ordinal of a device frame in this process (0 for system memory or a NULL
 * buffer). */
uint32_t xmem_buffer_device(const xmem_buffer *buffer);
/* Device address (a CUdeviceptr) of a device frame's bytes; 0 for system memory or a
 * NULL buffer. Plane i is at meta->plane_offset[i] from it, meta->plane_stride[i]
 * bytes a row. Valid while the buffer is; never dereference it on the CPU. */
uint64_t xmem_buffer_device_ptr(const xmem_buffer *buffer);
/* 1 for a device frame whose producer died before its GPU writes to it completed:
 * streams waiting for it were let go, but its bytes are whatever those writes left.
 * Check it after the wait (receive, or the stream's) has passed. */
int xmem_buffer_is_incomplete(const xmem_buffer *buffer);
/* Seed API: a copy of BUFFER (any frame this process holds) in a buffer of BUFFER's pool:
 * a free slot of system memory (copy_to_cpu) or of CUDA device DEVICE, taken as
 * xmem_pool_acquire_memory takes one (waiting up to 1 s; a pool made by
 * xmem_pool_connect grows a class for it), with its bytes and metadata. *out is
 * writable, as an acquired buffer: publish it, set_ref_count it or release it; it has
 * its own meta index. Into device memory the copy is queued on CUDA_STREAM (complete on
 * return without one); into system memory complete on return. xmem_buffer_copy_to_device
 * is the seed's name for a copy between devices. Errors: XMEM_ERANGE (the pool has no
 * class of that memory large enough: the message names the class to preallocate),
 * XMEM_ETIMEDOUT, XMEM_EINVAL, XMEM_ENOENT (no CUDA driver or device), XMEM_ESYSTEM. */
int xmem_buffer_copy_to_cpu(const xmem_buffer *buffer, void *cuda_stream, xmem_buffer **out);
int xmem_buffer_copy_to_cuda(const xmem_buffer *buffer, uint32_t device, void *cuda_stream, xmem_buffer **out);
int xmem_buffer_copy_to_device(const xmem_buffer *buffer, uint32_t device, void *cuda_stream, xmem_buffer **out);
/* A private, read-only copy of BUFFER outside the pool, in memory STORAGE (for CUDA,
 * on device DEVICE): host memory complete on return (the CPU waits for CUDA_STREAM);
 * device memory queued on CUDA_STREAM (use it on that stream or after it; complete on
 * return with a NULL stream). *out is the caller's and holds no slot; its memory is freed
 * with the last reference to it; its capacity is meta->size. Cost: an allocation and a
 * copy of meta->size bytes. Errors: XMEM_EINVAL (also a device out of range or an
 * unknown storage), XMEM_ENOENT (no CUDA driver or device), XMEM_ENOMEM, XMEM_ESYSTEM. */
int xmem_buffer_private_copy(const xmem_buffer *buffer, uint32_t storage, uint32_t device, void *cuda_stream,
			     xmem_buffer **out);

/* Copies a WIDTH_BYTES x HEIGHT rectangle between host memory and CUDA device memory
 * (at least one side on the device) through the CUDA driver xmem loaded: DST and SRC
 * are host pointers, or CUdeviceptr values where DST_DEVICE / SRC_DEVICE is nonzero,
 * each with its pitch (bytes from one row to the next). Queued on CUDA_STREAM in the
 * stream's own context; with a NULL stream on DEVICE's primary context, complete on
 * return. Errors: XMEM_EINVAL (null address, rows wider than a pitch, both sides
 * host, device out of range), XMEM_ENOENT (no CUDA driver or device), XMEM_ESYSTEM. */
int xmem_cuda_copy_2d(uint64_t dst, uint64_t dst_pitch, int dst_device, uint64_t src, uint64_t src_pitch,
		      int src_device, uint64_t width_bytes, uint64_t height, uint32_t device, void *cuda_stream);
/* 1 when the work queued on CUDA_STREAM so far is done, 0 when not (never waits),
 * or a negative error. */
int xmem_cuda_stream_done(uint32_t device, void *cuda_stream);
/* Waits on the CPU for CUDA_STREAM (NULL: the streams of DEVICE's primary context and
 * of the calling thread's current context). */
int xmem_cuda_synchronize(uint32_t device, void *cuda_stream);

#ifdef __cplusplus
}
#endif

#endif /* XMEM_H */
