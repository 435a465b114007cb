/* gstxmemsrcprivate.h - xmemsrc's C++ state, shared by the element's three files:
 * gstxmemsrc.cpp (the element), gstxmemsrccaps.cpp (negotiation), gstxmemsrcbuffer.cpp. */
#pragma once

#include "gstxmemcuda.h"
#include "gstxmemelement.h"
#include "gstxmemmeta.h"
#include "gstxmemsrc.h"
#include "gstxmemuniquefd.h"

#include <xmem/xmem.hpp>

#include <gst/video/video.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include <sys/eventfd.h>
#include <unistd.h>

GST_DEBUG_CATEGORY_EXTERN(gst_xmem_src_debug);

#define DEFAULT_IS_LIVE TRUE
#define DEFAULT_TIMEOUT 0
#define DEFAULT_RECONNECT TRUE
#define DEFAULT_QUEUE_SIZE 0

/* This consumer's policy: the pool's, or its own (xmem_policy + 1). */
enum GstXmemSrcPolicy {
	GST_XMEM_SRC_POLICY_POOL = 0,
	GST_XMEM_SRC_POLICY_FIFO = 1 + XMEM_POLICY_FIFO,
	GST_XMEM_SRC_POLICY_DROP_OLDEST = 1 + XMEM_POLICY_DROP_OLDEST,
	GST_XMEM_SRC_POLICY_DROP_NEW = 1 + XMEM_POLICY_DROP_NEW,
	GST_XMEM_SRC_POLICY_LATEST = 1 + XMEM_POLICY_LATEST,
	GST_XMEM_SRC_POLICY_FIFO_SPILL = 1 + XMEM_POLICY_FIFO_SPILL,
};

/* The eventfd that unlock() writes to cut a wait short, and the waits poll. */
class WakeFd
{
public:
	/* Opens a fresh eventfd (closing any previous one); false with errno set. */
	bool open()
	{
		fd_ = GstXmemUniqueFd(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
		return fd_.valid();
	}
	/* Closes it. */
	void reset() { fd_.reset(); }
	/* -1 when closed: poll() then ignores it. */
	int get() const { return fd_.get(); }
	/* Makes the fd readable, until drain(). */
	void signal() const
	{
		uint64_t one = 1;
		if (fd_.valid()) [[maybe_unused]]
			ssize_t n = ::write(fd_.get(), &one, sizeof(one));
	}
	void drain() const
	{
		uint64_t count;
		if (fd_.valid()) [[maybe_unused]]
			ssize_t n = ::read(fd_.get(), &count, sizeof(count));
	}

private:
	GstXmemUniqueFd fd_;
};

/* Deactivates and lets go of a buffer pool the element made. */
struct BufferPoolRelease {
	void operator()(GstBufferPool *pool) const
	{
		gst_buffer_pool_set_active(pool, FALSE);
		gst_object_unref(pool);
	}
};

/* Locks, in the order they are taken: the src pad's stream lock (held around
 * create and negotiate, in the streaming thread), basesrc's live lock, then `lock`
 * below, then the element's object lock (GstXmemCuda's context) and the core's own
 * locks. None is held while posting a message (a bus sync handler may call back
 * into the element), while waiting for the pool or a frame, or while calling
 * another element (caps queries and negotiation run without `lock`). */
struct SrcState {
	explicit SrcState(GstElement *element) : cuda(element, true) {}
	~SrcState() { gst_caps_replace(&caps, nullptr); }
	SrcState(const SrcState &) = delete;
	SrcState &operator=(const SrcState &) = delete;

	/* Guards the properties and `caps`: set_property and get_property (any thread),
	 * the caps and latency queries (any thread), start/stop and the streaming
	 * thread. */
	std::mutex lock;
	std::string pool_name = GST_XMEM_DEFAULT_POOL_NAME;
	bool is_live = DEFAULT_IS_LIVE;
	guint64 timeout = DEFAULT_TIMEOUT;
	bool reconnect = DEFAULT_RECONNECT;
	guint queue_size = DEFAULT_QUEUE_SIZE;
	GstXmemSrcPolicy policy = GST_XMEM_SRC_POLICY_POOL;
	xmem_policy fallback = XMEM_POLICY_DROP_OLDEST;
	guint64 block_timeout = 0;
	xmem_wake wake_mode = XMEM_WAKE_SLEEP;
	guint spin_budget = 200; /* µs */
	guint64 max_age = 0; /* ns; 0: no limit */
	guint max_held = 0; /* 0: the owner's default */
	guint history = 0;
	bool add_reference_timestamp_meta = false;
	/* How the owner serves this consumer, as of the last attach or frame (written by
	 * the streaming thread, read by the stats property). */
	std::atomic<guint> served_policy{ G_MAXUINT };
	std::atomic<guint> served_queue{ 0 };
	std::atomic<guint64> lost{ 0 };
	std::atomic<guint64> spilled{ 0 };
	std::atomic<guint64> spin_ns{ 0 };
	std::atomic<guint64> spins_caught{ 0 };
	std::atomic<guint64> expired{ 0 };
	std::atomic<guint> held{ 0 };
	std::atomic<guint> served_max_held{ 0 };
	/* Frames copied out of their slot because it held near its cap (max-held). */
	std::atomic<guint64> copied_held{ 0 };
	GstCaps *caps = nullptr;

	/* Streaming thread only. */
	std::shared_ptr<xmem::BufferPool> pool;
	std::string format;
	GstVideoInfo info{};
	bool is_video = false;
	/* Frames of a device pool go downstream as CUDA memory (one device-to-device
	 * copy into out_pool's buffers) or as system memory (one download). */
	bool out_cuda = false;
	/* The pool's storage and device the offer was made for. */
	xmem::Storage storage = xmem::Storage::system;
	guint device = 0;
	std::unique_ptr<GstBufferPool, BufferPoolRelease> out_pool;
	GstXmemCuda cuda;
	guint64 zero_copy = 0;
	guint64 copied = 0;
	bool said_cap = false; /* the copies near the cap were logged */
	bool discont = true;
	guint64 last_seq = 0;
	guint64 received = 0;
	guint64 gaps = 0;
	guint64 reconnects = 0;
	/* Frames dropped because their layout did not fit their slot or their caps. */
	guint64 refused = 0;
	/* The frames' GstMetas added, skipped and refused (gstxmemmeta.h). */
	GstXmemMetaCounts metas;

	/* Opened in start() and closed in stop() (state changes); unlock() and
	 * unlock_stop() (any thread, between the two) signal and drain it. */
	WakeFd wake;
	std::atomic<bool> flushing{ false };
};

struct _GstXmemSrc {
	GstPushSrc parent;
	SrcState *state;
};

/* gstxmemsrc.cpp: notes how the owner serves this consumer (SERVED: its stats now), for
 * the stats property. */
void note_served(SrcState *s, const xmem::Result<xmem::ConsumerStats> &served);

/* gstxmemsrccaps.cpp: the producer's format downstream. */

/* Sets caps from a format string; false (with an error posted) when unusable. */
bool apply_format(GstXmemSrc *self, const std::string &format);
/* Chooses the output caps from the offer (again after a reconfigure), and the CUDA
 * buffer pool for CUDA output. Streaming thread. */
bool negotiate_output(GstXmemSrc *self);

/* gstxmemsrcbuffer.cpp: received frames as buffers. */

/* Whether frame M's planes, read as INFO (its caps) describes them, stay within its
 * payload; WHY says what does not fit. */
bool planes_fit(const GstVideoInfo &info, const xmem::FrameMeta &m, std::string *why);
/* FRAME as the buffer that goes downstream (the slot itself or a copy), with its
 * layout, flags and timestamps; nullptr with ERROR set when a copy failed. */
GstBuffer *wrap_frame(GstXmemSrc *self, xmem::BufferGuard &&frame, xmem::Error *error);
