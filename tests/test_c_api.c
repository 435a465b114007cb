/* test_c_api.c - the C API end to end from a C11 program: an owner and consumers in
 * one process, every call once, and the error paths with their messages. Exits 0 or 1. */
#define _POSIX_C_SOURCE 200809L

#include <xmem/xmem.h>

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int failures;

#define CHECK(cond)                                                                                                    \
	do {                                                                                                           \
		if (!(cond)) {                                                                                         \
			fprintf(stderr, "%s:%d: CHECK(%s) failed (last error: '%s')\n", __FILE__, __LINE__, #cond,     \
				xmem_last_error());                                                                    \
			failures++;                                                                                    \
		}                                                                                                      \
	} while (0)

/* A call that must return STATUS; an error must also leave a message. */
#define CHECK_STATUS(call, status)                                                                                     \
	do {                                                                                                           \
		int got_ = (call);                                                                                     \
		if (got_ != (status)) {                                                                                \
			fprintf(stderr, "%s:%d: %s returned %s, expected %s (last error: '%s')\n", __FILE__, __LINE__, \
				#call, xmem_status_name(got_), xmem_status_name(status), xmem_last_error());           \
			failures++;                                                                                    \
		} else if (got_ != XMEM_OK && xmem_last_error()[0] == '\0') {                                          \
			fprintf(stderr, "%s:%d: %s failed without a message\n", __FILE__, __LINE__, #call);            \
			failures++;                                                                                    \
		}                                                                                                      \
	} while (0)

/* Gives up on the rest: what follows needs this to have worked. */
#define REQUIRE(cond)                                                                                                  \
	do {                                                                                                           \
		if (!(cond)) {                                                                                         \
			fprintf(stderr, "%s:%d: REQUIRE(%s) failed (last error: '%s')\n", __FILE__, __LINE__, #cond,   \
				xmem_last_error());                                                                    \
			return 1;                                                                                      \
		}                                                                                                      \
	} while (0)

static unsigned char pattern(uint64_t tag, uint64_t i)
{
	return (unsigned char)((tag * 131 + i * 7) & 0xff);
}

static void fill(void *data, uint64_t size, uint64_t tag)
{
	unsigned char *p = data;
	for (uint64_t i = 0; i < size; i++)
		p[i] = pattern(tag, i);
}

static int intact(const void *data, uint64_t size, uint64_t tag)
{
	const unsigned char *p = data;
	for (uint64_t i = 0; i < size; i++)
		if (p[i] != pattern(tag, i))
			return 0;
	return 1;
}

static int readable(int fd, int timeout_ms)
{
	struct pollfd p = { fd, POLLIN, 0 };
	return poll(&p, 1, timeout_ms) == 1 && (p.revents & POLLIN);
}

/* Publishes a frame of SIZE bytes with payload and pts TAG; its slot index. */
static uint32_t publish(xmem_pool *owner, uint64_t tag, uint64_t size)
{
	xmem_buffer *b = NULL;
	CHECK_STATUS(xmem_pool_acquire(owner, 1000000000, &b), XMEM_OK);
	if (!b)
		return UINT32_MAX;
	fill(xmem_buffer_data_mut(b), size, tag);
	xmem_frame_meta *m = xmem_buffer_meta_mut(b);
	m->size = size;
	m->pts = tag;
	uint32_t index = xmem_buffer_meta(b)->index;
	CHECK_STATUS(xmem_pool_publish(owner, b), XMEM_OK);
	return index;
}

static int run(const char *runtime)
{
	char sock_path[512];
	snprintf(sock_path, sizeof(sock_path), "%s/xmem/c-pool", runtime);

	/* Defaults. */
	xmem_pool_config config;
	memset(&config, 0xff, sizeof(config));
	xmem_pool_config_init(&config);
	CHECK(config.slot_count == 8);
	CHECK(config.slot_size == 0);
	CHECK(config.max_consumers == 64);
	CHECK(config.policy == XMEM_POLICY_DROP_OLDEST);
	CHECK(config.block_timeout_ns == 1000000000u);
	CHECK(config.mode == 0600);
	CHECK(config.format == NULL);
	CHECK(config.producer == NULL);
	xmem_open_options options;
	memset(&options, 0xff, sizeof(options));
	xmem_open_options_init(&options);
	CHECK(options.timeout_ns == 0);
	CHECK(options.queue_size == 0 && !options.has_policy);
	CHECK(options.client == NULL);
	CHECK(config.storage == XMEM_STORAGE_SYSTEM && config.device == 0);
	CHECK(config.memory_cap_mib == 0 && config.trim_idle_ms == 0);
	for (size_t i = 0; i < sizeof(options.reserved) / sizeof(options.reserved[0]); i++)
		CHECK(options.reserved[i] == 0);
	{
		/* Reserved words set: a caller built for a later ABI is refused, not misread. */
		xmem_pool *refused = NULL;
		xmem_open_options later_options = options;
		later_options.reserved[0] = 7;
		CHECK_STATUS(xmem_pool_open("reserved", &later_options, &refused), XMEM_EINVAL);
		CHECK(strstr(xmem_last_error(), "reserved") != NULL);
	}

	/* Status names. */
	CHECK(strcmp(xmem_status_name(XMEM_OK), "XMEM_OK") == 0);
	CHECK(strcmp(xmem_status_name(XMEM_EEOS), "XMEM_EEOS") == 0);
	CHECK(strcmp(xmem_status_name(XMEM_ENOMEM), "XMEM_ENOMEM") == 0);
	CHECK(strcmp(xmem_status_name(-999), "XMEM_UNKNOWN") == 0);
	CHECK(strcmp(xmem_status_name(1), "XMEM_UNKNOWN") == 0);

	/* Video planes: the library's format table, plane by plane. */
	{
		uint32_t bytes = 0, xd = 0, yd = 0;
		CHECK(xmem_video_plane("NV12", 1, &bytes, &xd, &yd) == 2 && bytes == 2 && xd == 2 && yd == 2);
		CHECK(xmem_video_plane("I420", 2, &bytes, &xd, &yd) == 3 && bytes == 1 && xd == 2 && yd == 2);
		CHECK(xmem_video_plane("P010_10LE", 0, &bytes, NULL, NULL) == 2 && bytes == 2);
		CHECK(xmem_video_plane("RGBA", 0, &bytes, &xd, &yd) == 1 && bytes == 4 && xd == 1 && yd == 1);
		CHECK_STATUS(xmem_video_plane("RGBA", 1, &bytes, &xd, &yd), XMEM_EINVAL);
		CHECK(strstr(xmem_last_error(), "RGBA has 1 planes") != NULL);
		CHECK_STATUS(xmem_video_plane("MJPG", 0, NULL, NULL, NULL), XMEM_EINVAL);
		CHECK(strstr(xmem_last_error(), "unknown format 'MJPG'") != NULL);
		CHECK_STATUS(xmem_video_plane(NULL, 0, NULL, NULL, NULL), XMEM_EINVAL);
	}

	/* Policy and storage names: the library's tables, both ways. */
	{
		static const char *const own[] = { "fifo", "drop-oldest", "drop-new", "latest", "fifo-spill" };
		static const char *const accepted[] = { "block",    "fifo",   "drop-oldest",
							"drop-new", "latest", "fifo-spill" };
		static const int values[] = { XMEM_POLICY_FIFO,	    XMEM_POLICY_FIFO,	XMEM_POLICY_DROP_OLDEST,
					      XMEM_POLICY_DROP_NEW, XMEM_POLICY_LATEST, XMEM_POLICY_FIFO_SPILL };
		for (int p = 0; p < 5; p++)
			CHECK(xmem_policy_name(p) && strcmp(xmem_policy_name(p), own[p]) == 0);
		CHECK(strcmp(xmem_policy_name(XMEM_POLICY_BLOCK), "fifo") == 0);
		CHECK(xmem_policy_name(5) == NULL);
		CHECK(xmem_policy_name(-1) == NULL);
		for (uint32_t i = 0; i < 6; i++) {
			CHECK(xmem_policy_name_at(i) && strcmp(xmem_policy_name_at(i), accepted[i]) == 0);
			CHECK(xmem_policy_from_name(accepted[i]) == values[i]);
		}
		CHECK(xmem_policy_name_at(6) == NULL);
		CHECK_STATUS(xmem_policy_from_name("Block"), XMEM_EINVAL);
		CHECK(strstr(xmem_last_error(), "unknown policy 'Block'") != NULL);
		CHECK_STATUS(xmem_policy_from_name(""), XMEM_EINVAL);
		CHECK_STATUS(xmem_policy_from_name(NULL), XMEM_EINVAL);

		CHECK(strcmp(xmem_storage_name(XMEM_STORAGE_SYSTEM), "system") == 0);
		CHECK(strcmp(xmem_storage_name(XMEM_STORAGE_CUDA), "cuda") == 0);
		CHECK(xmem_storage_name(2) == NULL);
		CHECK(xmem_storage_from_name("system") == XMEM_STORAGE_SYSTEM);
		CHECK(xmem_storage_from_name("cuda") == XMEM_STORAGE_CUDA);
		CHECK_STATUS(xmem_storage_from_name("gpu"), XMEM_EINVAL);
		CHECK(strstr(xmem_last_error(), "unknown storage 'gpu'") != NULL);
		CHECK_STATUS(xmem_storage_from_name(NULL), XMEM_EINVAL);
	}

	/* create() errors. */
	xmem_pool *owner = NULL;
	CHECK_STATUS(xmem_pool_create("c-pool", &config, &owner), XMEM_EINVAL); /* slot_size 0 */
	CHECK(owner == NULL);
	CHECK(strstr(xmem_last_error(), "slot size") != NULL);
	config.slot_size = 4096;
	config.slot_count = XMEM_MAX_SLOTS + 1;
	CHECK_STATUS(xmem_pool_create("c-pool", &config, &owner), XMEM_EINVAL);
	config.slot_count = 4;
	config.mode = 0400;
	CHECK_STATUS(xmem_pool_create("c-pool", &config, &owner), XMEM_EINVAL);
	config.mode = 0; /* 0 means 0600 */
	config.max_consumers = XMEM_MAX_CONSUMERS + 1;
	CHECK_STATUS(xmem_pool_create("c-pool", &config, &owner), XMEM_EINVAL);
	config.max_consumers = 0; /* 0 means 64 */
	CHECK_STATUS(xmem_pool_create("bad name", &config, &owner), XMEM_ENAME);
	CHECK_STATUS(xmem_pool_create("", &config, &owner), XMEM_ENAME);
	CHECK_STATUS(xmem_pool_create(NULL, &config, &owner), XMEM_EINVAL);
	CHECK_STATUS(xmem_pool_create("c-pool", NULL, &owner), XMEM_EINVAL);
	CHECK_STATUS(xmem_pool_create("c-pool", &config, NULL), XMEM_EINVAL);
	CHECK(owner == NULL);

	/* open() errors. */
	xmem_pool *consumer = NULL;
	CHECK_STATUS(xmem_pool_open("c-pool", NULL, &consumer), XMEM_ENOENT);
	CHECK(strstr(xmem_last_error(), "c-pool") != NULL);
	CHECK_STATUS(xmem_pool_open("a*b", &options, &consumer), XMEM_ENAME);
	CHECK_STATUS(xmem_pool_open(NULL, &options, &consumer), XMEM_EINVAL);
	CHECK_STATUS(xmem_pool_open("c-pool", &options, NULL), XMEM_EINVAL);
	CHECK(consumer == NULL);

	/* The owner. */
	config.format = "video/x-raw,format=RGB";
	config.producer = "c-producer";
	config.block_timeout_ns = 0; /* 0 means 1 s */
	CHECK_STATUS(xmem_pool_create("c-pool", &config, &owner), XMEM_OK);
	REQUIRE(owner != NULL);
	struct stat st;
	CHECK(stat(sock_path, &st) == 0 && S_ISSOCK(st.st_mode));
	CHECK(xmem_pool_slot_size(owner) == 4096);
	CHECK(xmem_pool_slot_count(owner) == 4);
	CHECK(strcmp(xmem_pool_format(owner), "video/x-raw,format=RGB") == 0);
	CHECK(xmem_pool_fd(owner) == -1);
	xmem_pool *second = NULL;
	CHECK_STATUS(xmem_pool_create("c-pool", &config, &second), XMEM_EBUSY);
	CHECK(second == NULL);

	/* A consumer. */
	options.client = "c-consumer";
	options.queue_size = 4;
	CHECK_STATUS(xmem_pool_open("c-pool", &options, &consumer), XMEM_OK);
	REQUIRE(consumer != NULL);
	CHECK(xmem_pool_slot_size(consumer) == 4096);
	CHECK(xmem_pool_slot_count(consumer) == 4);
	CHECK(strcmp(xmem_pool_format(consumer), "video/x-raw,format=RGB") == 0);
	int fd = xmem_pool_fd(consumer);
	CHECK(fd >= 0);

	xmem_pool_stats stats;
	CHECK_STATUS(xmem_pool_stats_get(owner, &stats), XMEM_OK);
	CHECK(stats.published == 0);
	CHECK(stats.consumers == 1);
	CHECK(stats.slots_total == 4);
	CHECK(stats.slots_free == 4);
	CHECK(stats.closed == 0);
	CHECK_STATUS(xmem_pool_stats_get(owner, NULL), XMEM_EINVAL);
	CHECK_STATUS(xmem_pool_stats_get(NULL, &stats), XMEM_EINVAL);

	/* Wrong roles. */
	xmem_buffer *b = NULL;
	/* A consumer acquires as a guest producer (the owner leases it a slot). */
	CHECK_STATUS(xmem_pool_acquire(consumer, 0, &b), XMEM_OK);
	REQUIRE(b != NULL);
	xmem_buffer_release(b);
	b = NULL;
	CHECK_STATUS(xmem_pool_set_format(consumer, "x"), XMEM_EROLE);
	CHECK_STATUS(xmem_pool_end_of_stream(consumer), XMEM_EROLE);
	CHECK_STATUS(xmem_pool_receive(owner, 0, &b), XMEM_EROLE);
	CHECK(b == NULL);

	/* Nothing yet: receive times out and the fd is quiet. */
	CHECK_STATUS(xmem_pool_receive(consumer, 0, &b), XMEM_ETIMEDOUT);
	CHECK(strcmp(xmem_status_name(XMEM_ETIMEDOUT), "XMEM_ETIMEDOUT") == 0);
	CHECK(!readable(fd, 0));

	/* acquire, meta_mut, data_mut, publish. */
	CHECK_STATUS(xmem_pool_acquire(owner, 1000000000, &b), XMEM_OK);
	REQUIRE(b != NULL);
	CHECK(xmem_buffer_is_writable(b) == 1);
	CHECK(xmem_buffer_is_copy(b) == 0);
	CHECK(xmem_buffer_capacity(b) == 4096);
	CHECK(strcmp(xmem_buffer_format(b), "video/x-raw,format=RGB") == 0);
	xmem_frame_meta *m = xmem_buffer_meta_mut(b);
	REQUIRE(m != NULL);
	void *data = xmem_buffer_data_mut(b);
	REQUIRE(data != NULL);
	CHECK(m->pts == XMEM_NONE);
	fill(data, 1500, 77);
	m->size = 1500;
	m->pts = 1000;
	m->dts = 900;
	m->duration = 40;
	m->flags = 3;
	m->dtype = XMEM_DTYPE_U8;
	m->ndim = 3;
	m->shape[0] = 10;
	m->shape[1] = 50;
	m->shape[2] = 3;
	strcpy(m->content_type, "video/raw");
	m->n_planes = 2;
	m->plane_stride[0] = 30;
	m->plane_stride[1] = 15;
	m->plane_offset[1] = 1000;
	uint32_t index = xmem_buffer_meta(b)->index;
	CHECK(index < 4);
	CHECK_STATUS(xmem_pool_stats_get(owner, &stats), XMEM_OK);
	CHECK(stats.slots_free == 3);
	CHECK_STATUS(xmem_pool_publish(owner, b), XMEM_OK);
	b = NULL;
	CHECK(readable(fd, 5000));

	/* receive, meta, data. */
	xmem_buffer *r = NULL;
	CHECK_STATUS(xmem_pool_receive(consumer, 5000000000, &r), XMEM_OK);
	REQUIRE(r != NULL);
	const xmem_frame_meta *rm = xmem_buffer_meta(r);
	REQUIRE(rm != NULL);
	CHECK(rm->index == index);
	CHECK(rm->seq == 1);
	CHECK(rm->size == 1500);
	CHECK(rm->pts == 1000);
	CHECK(rm->dts == 900);
	CHECK(rm->duration == 40);
	CHECK(rm->flags == 3);
	CHECK(rm->ndim == 3 && rm->shape[0] == 10 && rm->shape[1] == 50 && rm->shape[2] == 3);
	CHECK(strcmp(rm->content_type, "video/raw") == 0);
	CHECK(rm->n_planes == 2 && rm->plane_stride[0] == 30 && rm->plane_stride[1] == 15 &&
	      rm->plane_offset[1] == 1000);
	CHECK(strcmp(rm->producer, "c-producer") == 0);
	CHECK(rm->producer_pid == (uint32_t)getpid());
	CHECK(rm->timestamp != 0);
	CHECK(xmem_buffer_is_writable(r) == 0);
	CHECK(xmem_buffer_meta_mut(r) == NULL);
	CHECK(xmem_buffer_data_mut(r) == NULL);
	CHECK(xmem_buffer_data(r) != NULL && intact(xmem_buffer_data(r), 1500, 77));
	CHECK(strcmp(xmem_buffer_format(r), "video/x-raw,format=RGB") == 0);

	/* References on the received slot. */
	CHECK(xmem_pool_ref_count(consumer, index) == 1);
	xmem_buffer *clone = NULL;
	CHECK_STATUS(xmem_buffer_clone(r, &clone), XMEM_OK);
	REQUIRE(clone != NULL);
	CHECK(xmem_buffer_data(clone) == xmem_buffer_data(r));
	CHECK(xmem_pool_ref_count(consumer, index) == 2);
	xmem_buffer_release(clone);
	CHECK(xmem_pool_ref_count(consumer, index) == 1);
	CHECK_STATUS(xmem_pool_add_ref(consumer, index), XMEM_OK);
	CHECK(xmem_pool_ref_count(consumer, index) == 2);
	CHECK_STATUS(xmem_pool_release(consumer, index), XMEM_OK);
	CHECK(xmem_pool_ref_count(consumer, index) == 1);
	CHECK_STATUS(xmem_pool_set_local_refs(consumer, index, 3), XMEM_OK);
	CHECK(xmem_pool_ref_count(consumer, index) == 3);
	CHECK_STATUS(xmem_pool_set_local_refs(consumer, index, 1), XMEM_OK); /* back to the buffer's own */
	CHECK(xmem_pool_ref_count(consumer, index) == 1);
	uint32_t other = (index + 1) % 4;
	CHECK_STATUS(xmem_pool_release(consumer, other), XMEM_ENOTHELD);
	CHECK_STATUS(xmem_pool_add_ref(consumer, other), XMEM_ENOTHELD);
	CHECK_STATUS(xmem_pool_set_local_refs(consumer, other, 0), XMEM_ENOTHELD);
	CHECK(xmem_pool_ref_count(consumer, other) == 0);
	CHECK_STATUS(xmem_pool_release(consumer, 4), XMEM_ERANGE);
	CHECK(xmem_pool_ref_count(consumer, 4) == 0);
	CHECK_STATUS(xmem_pool_add_ref(NULL, 0), XMEM_EINVAL);
	CHECK_STATUS(xmem_buffer_clone(NULL, &clone), XMEM_EINVAL);

	/* get and get_mut from a consumer that attached after the publish. */
	xmem_pool *late = NULL;
	CHECK_STATUS(xmem_pool_open("c-pool", NULL, &late), XMEM_OK);
	REQUIRE(late != NULL);
	xmem_buffer *g = NULL;
	CHECK_STATUS(xmem_pool_get(late, index, &g), XMEM_OK);
	REQUIRE(g != NULL);
	CHECK(xmem_buffer_is_writable(g) == 0);
	CHECK(intact(xmem_buffer_data(g), 1500, 77));
	CHECK(xmem_buffer_meta(g)->seq == 1);
	CHECK(xmem_pool_ref_count(late, index) == 1);
	xmem_buffer_release(g);
	CHECK(xmem_pool_ref_count(late, index) == 0);
	CHECK_STATUS(xmem_pool_get(late, other, &g), XMEM_ENOTHELD); /* free */
	CHECK_STATUS(xmem_pool_get(late, 4, &g), XMEM_ERANGE);
	CHECK_STATUS(xmem_pool_get_mut(late, 4, &g), XMEM_ERANGE);
	CHECK_STATUS(xmem_pool_get(late, index, NULL), XMEM_EINVAL);
	/* consumer still holds it: copy-on-write. */
	xmem_buffer *w = NULL;
	CHECK_STATUS(xmem_pool_get_mut(late, index, &w), XMEM_OK);
	REQUIRE(w != NULL);
	CHECK(xmem_buffer_is_writable(w) == 1);
	CHECK(xmem_buffer_is_copy(w) == 1);
	CHECK(xmem_buffer_meta_mut(w) != NULL);
	void *wd = xmem_buffer_data_mut(w);
	REQUIRE(wd != NULL);
	CHECK(intact(wd, 1500, 77));
	fill(wd, 1500, 78);
	CHECK(intact(xmem_buffer_data(r), 1500, 77)); /* the shared frame is untouched */
	xmem_buffer_release(w);

	/* Publishing a read-only buffer is refused and consumes it. */
	xmem_buffer *ro = NULL;
	CHECK_STATUS(xmem_pool_get(owner, index, &ro), XMEM_OK);
	REQUIRE(ro != NULL);
	CHECK_STATUS(xmem_pool_publish(owner, ro), XMEM_EREADONLY);
	CHECK(xmem_pool_ref_count(owner, index) == 0);
	CHECK_STATUS(xmem_pool_publish(owner, NULL), XMEM_EINVAL);
	CHECK_STATUS(xmem_pool_acquire(owner, 0, NULL), XMEM_EINVAL);

	xmem_buffer_release(r);
	xmem_buffer_release(NULL);
	CHECK(xmem_pool_ref_count(consumer, index) == 0);

	/* Format change: the next frame carries it. */
	CHECK_STATUS(xmem_pool_set_format(owner, "video/x-raw,format=GRAY8"), XMEM_OK);
	CHECK(strcmp(xmem_pool_format(owner), "video/x-raw,format=GRAY8") == 0);
	CHECK_STATUS(xmem_pool_set_format(owner, NULL), XMEM_EINVAL);
	CHECK(strcmp(xmem_pool_format(consumer), "video/x-raw,format=RGB") == 0);
	publish(owner, 2, 100);
	CHECK_STATUS(xmem_pool_receive(consumer, 5000000000, &r), XMEM_OK);
	REQUIRE(r != NULL);
	CHECK(xmem_buffer_meta(r)->seq == 2);
	CHECK(xmem_buffer_meta(r)->pts == 2);
	CHECK(intact(xmem_buffer_data(r), 100, 2));
	CHECK(strcmp(xmem_buffer_format(r), "video/x-raw,format=GRAY8") == 0);
	CHECK(strcmp(xmem_pool_format(consumer), "video/x-raw,format=GRAY8") == 0);
	xmem_buffer_release(r);

	/* End of stream after the queued frames. */
	publish(owner, 3, 10);
	CHECK_STATUS(xmem_pool_end_of_stream(owner), XMEM_OK);
	CHECK_STATUS(xmem_pool_receive(consumer, 5000000000, &r), XMEM_OK);
	REQUIRE(r != NULL);
	CHECK(xmem_buffer_meta(r)->pts == 3);
	xmem_buffer_release(r);
	r = NULL;
	CHECK_STATUS(xmem_pool_receive(consumer, 5000000000, &r), XMEM_EEOS);
	CHECK(r == NULL);
	CHECK(strcmp(xmem_status_name(XMEM_EEOS), "XMEM_EEOS") == 0);

	CHECK_STATUS(xmem_pool_stats_get(consumer, &stats), XMEM_OK);
	CHECK(stats.published == 3);
	CHECK(stats.consumers == 2);
	CHECK(stats.dropped == 0);

	/* The late consumer saw frames 2 and 3 and EOS. */
	CHECK_STATUS(xmem_pool_receive(late, 5000000000, &r), XMEM_OK);
	CHECK(r && xmem_buffer_meta(r)->pts == 2);
	xmem_buffer_release(r);
	CHECK_STATUS(xmem_pool_receive(late, 5000000000, &r), XMEM_OK);
	CHECK(r && xmem_buffer_meta(r)->pts == 3);
	xmem_buffer_release(r);
	CHECK_STATUS(xmem_pool_receive(late, 5000000000, &r), XMEM_EEOS);
	xmem_pool_close(late);

	/* Closing the owner: a queued frame first, then XMEM_ECLOSED. */
	publish(owner, 4, 10);
	CHECK_STATUS(xmem_pool_receive(consumer, 5000000000, &r), XMEM_OK);
	CHECK(r && xmem_buffer_meta(r)->pts == 4);
	xmem_buffer_release(r);
	publish(owner, 5, 10);
	xmem_pool_close(owner);
	CHECK(stat(sock_path, &st) != 0); /* the socket went with the owner */
	CHECK_STATUS(xmem_pool_receive(consumer, 5000000000, &r), XMEM_OK);
	CHECK(r && xmem_buffer_meta(r)->pts == 5 && intact(xmem_buffer_data(r), 10, 5));
	xmem_buffer_release(r);
	CHECK_STATUS(xmem_pool_receive(consumer, 5000000000, &r), XMEM_ECLOSED);
	CHECK_STATUS(xmem_pool_stats_get(consumer, &stats), XMEM_OK);
	CHECK(stats.closed == 1);
	xmem_pool_close(consumer);
	xmem_pool_close(NULL);
	return failures ? 1 : 0;
}

/* Pool NAME of SLOTS 256-byte slots, and two consumers of it: 0, or 1 when one failed. */
static int owner_and_two_consumers(const char *name, uint32_t slots, xmem_pool **owner, xmem_pool **a, xmem_pool **b)
{
	xmem_pool_config config;
	xmem_pool_config_init(&config);
	config.slot_size = 256;
	config.slot_count = slots;
	CHECK_STATUS(xmem_pool_create(name, &config, owner), XMEM_OK);
	REQUIRE(*owner != NULL);
	xmem_open_options options;
	xmem_open_options_init(&options);
	options.timeout_ns = 5000000000;
	CHECK_STATUS(xmem_pool_open(name, &options, a), XMEM_OK);
	CHECK_STATUS(xmem_pool_open(name, &options, b), XMEM_OK);
	REQUIRE(*a != NULL && *b != NULL);
	return 0;
}

/* xmem_buffer_set_tensor, and xmem_buffer_try_make_writable for a frame's holders, on
 * a pool of their own. */
static int tensors_and_sole_holders(void)
{
	xmem_pool *owner = NULL, *a = NULL, *b = NULL;
	REQUIRE(owner_and_two_consumers("c-tensor", 2, &owner, &a, &b) == 0);

	xmem_buffer *w = NULL;
	CHECK_STATUS(xmem_pool_acquire(owner, 1000000000, &w), XMEM_OK);
	REQUIRE(w != NULL);
	const xmem_frame_meta *m = xmem_buffer_meta(w);
	const uint64_t shape[2] = { 2, 3 };
	/* C-contiguous without strides; the size becomes what the tensor spans. */
	CHECK_STATUS(xmem_buffer_set_tensor(w, XMEM_DTYPE_F32, 2, shape, NULL), XMEM_OK);
	CHECK(m->dtype == XMEM_DTYPE_F32 && m->ndim == 2 && m->shape[0] == 2 && m->shape[1] == 3);
	CHECK(m->strides[0] == 12 && m->strides[1] == 4 && m->size == 24);
	/* NDIM 0: plain bytes, the size left alone. */
	CHECK_STATUS(xmem_buffer_set_tensor(w, XMEM_DTYPE_U8, 0, NULL, NULL), XMEM_OK);
	CHECK(m->ndim == 0 && m->shape[0] == 0 && m->strides[0] == 0 && m->size == 24);
	/* Rows padded to 16 bytes: the last element ends at byte 4 + 16 + 2 * 4. */
	const uint64_t padded[2] = { 16, 4 };
	CHECK_STATUS(xmem_buffer_set_tensor(w, XMEM_DTYPE_F32, 2, shape, padded), XMEM_OK);
	CHECK(m->strides[0] == 16 && m->strides[1] == 4 && m->size == 28);

	/* Refused, each leaving the layout as it was. */
	const uint64_t odd[2] = { 13, 4 };
	CHECK_STATUS(xmem_buffer_set_tensor(w, XMEM_DTYPE_F32, 2, shape, odd), XMEM_EINVAL);
	CHECK(strstr(xmem_last_error(), "multiple of the element size") != NULL);
	const uint64_t overlapping[2] = { 4, 4 };
	CHECK_STATUS(xmem_buffer_set_tensor(w, XMEM_DTYPE_F32, 2, shape, overlapping), XMEM_EINVAL);
	CHECK(strstr(xmem_last_error(), "overlap") != NULL);
	CHECK_STATUS(xmem_buffer_set_tensor(w, XMEM_DTYPE_F64 + 1, 2, shape, NULL), XMEM_EINVAL);
	CHECK(strstr(xmem_last_error(), "not an xmem_dtype") != NULL);
	uint64_t nine[XMEM_MAX_DIMS + 1];
	for (size_t i = 0; i < XMEM_MAX_DIMS + 1; i++)
		nine[i] = 1;
	CHECK_STATUS(xmem_buffer_set_tensor(w, XMEM_DTYPE_U8, XMEM_MAX_DIMS + 1, nine, NULL), XMEM_EINVAL);
	const uint64_t larger[2] = { 10, 10 }; /* 400 bytes in a 256-byte slot */
	CHECK_STATUS(xmem_buffer_set_tensor(w, XMEM_DTYPE_F32, 2, larger, NULL), XMEM_ERANGE);
	CHECK(strstr(xmem_last_error(), "spans 400 bytes") != NULL);
	const uint64_t huge[2] = { UINT64_MAX / 2, 3 };
	CHECK_STATUS(xmem_buffer_set_tensor(w, XMEM_DTYPE_F32, 2, huge, NULL), XMEM_ERANGE);
	CHECK_STATUS(xmem_buffer_set_tensor(w, XMEM_DTYPE_F32, 2, NULL, NULL), XMEM_EINVAL);
	CHECK_STATUS(xmem_buffer_set_tensor(NULL, XMEM_DTYPE_F32, 2, shape, NULL), XMEM_EINVAL);
	CHECK(m->dtype == XMEM_DTYPE_F32 && m->ndim == 2 && m->shape[0] == 2 && m->shape[1] == 3);
	CHECK(m->strides[0] == 16 && m->strides[1] == 4 && m->size == 28);
	uint32_t index = m->index;
	CHECK_STATUS(xmem_pool_publish(owner, w), XMEM_OK);

	/* Both consumers hold the frame: neither may write it in place. */
	xmem_buffer *ra = NULL, *rb = NULL;
	CHECK_STATUS(xmem_pool_receive(a, 5000000000, &ra), XMEM_OK);
	CHECK_STATUS(xmem_pool_receive(b, 5000000000, &rb), XMEM_OK);
	REQUIRE(ra != NULL && rb != NULL);
	CHECK(xmem_buffer_meta(ra)->size == 28 && xmem_buffer_meta(ra)->strides[0] == 16);
	CHECK_STATUS(xmem_buffer_set_tensor(ra, XMEM_DTYPE_F32, 2, shape, NULL), XMEM_EREADONLY);
	CHECK(xmem_buffer_try_make_writable(ra) == 0);
	CHECK(xmem_buffer_is_writable(ra) == 0);
	xmem_buffer_release(rb);
	/* The only holder now: writable in place once asked, and other processes' get()
	 * refused until it lets go. */
	CHECK(xmem_buffer_is_writable(ra) == 0);
	CHECK(xmem_buffer_try_make_writable(ra) == 1);
	CHECK(xmem_buffer_is_writable(ra) == 1);
	CHECK(xmem_buffer_try_make_writable(ra) == 1); /* already */
	CHECK(xmem_buffer_data_mut(ra) != NULL && xmem_buffer_data_mut(ra) == xmem_buffer_data(ra));
	CHECK(xmem_buffer_is_copy(ra) == 0);
	xmem_buffer *g = NULL;
	CHECK_STATUS(xmem_pool_get(b, index, &g), XMEM_ENOTHELD);
	xmem_buffer_release(ra);
	CHECK_STATUS(xmem_pool_get(b, index, &g), XMEM_OK);
	xmem_buffer_release(g);
	CHECK(xmem_buffer_try_make_writable(NULL) == 0);

	xmem_pool_close(a);
	xmem_pool_close(b);
	xmem_pool_close(owner);
	return failures ? 1 : 0;
}

/* Frame tickets: published to no queue, redeemed from text by two consumers, a third
 * get refused with XMEM_EBADTICKET, garbage and a forged check word refused, the slot
 * back once both let go. */
static int tickets(void)
{
	xmem_pool *owner = NULL, *a = NULL, *b = NULL;
	REQUIRE(owner_and_two_consumers("c-ticket", 1, &owner, &a, &b) == 0);

	xmem_buffer *w = NULL;
	CHECK_STATUS(xmem_pool_acquire(owner, 1000000000, &w), XMEM_OK);
	REQUIRE(w != NULL);
	fill(xmem_buffer_data_mut(w), 256, 7);
	xmem_buffer_meta_mut(w)->size = 256;
	xmem_ticket t;
	CHECK_STATUS(xmem_pool_publish_ticket(owner, NULL, 1, 1000, NULL, &t), XMEM_EINVAL);
	/* A TTL past INT64_MAX ns is refused; the buffer is consumed (released) either way. */
	CHECK_STATUS(xmem_pool_publish_ticket(owner, w, 1, UINT64_MAX, NULL, &t), XMEM_EINVAL);
	CHECK_STATUS(xmem_pool_acquire(owner, 1000000000, &w), XMEM_OK);
	REQUIRE(w != NULL);
	fill(xmem_buffer_data_mut(w), 256, 7);
	xmem_buffer_meta_mut(w)->size = 256;
	CHECK_STATUS(xmem_pool_publish_ticket(owner, w, 2, 10000000000ull, NULL, &t), XMEM_OK);
	char text[XMEM_TICKET_TEXT_MAX];
	CHECK_STATUS(xmem_ticket_format(&t, text, 8), XMEM_ERANGE);
	CHECK_STATUS(xmem_ticket_format(&t, text, sizeof(text)), XMEM_OK);
	xmem_ticket parsed;
	CHECK_STATUS(xmem_ticket_parse(text, &parsed), XMEM_OK);
	CHECK(parsed.slot == t.slot && parsed.seq == t.seq && parsed.check == t.check);
	CHECK_STATUS(xmem_ticket_parse("xmem-ticket:0:1:zz", &parsed), XMEM_EBADTICKET);
	CHECK(strcmp(xmem_status_name(XMEM_EBADTICKET), "XMEM_EBADTICKET") == 0);

	xmem_buffer *fa = NULL, *fb = NULL, *fc = NULL;
	xmem_ticket forged = t;
	forged.check ^= 0x100;
	CHECK_STATUS(xmem_pool_get_ticket(a, &forged, &fc), XMEM_EBADTICKET);
	CHECK_STATUS(xmem_pool_get_ticket(a, &parsed, &fa), XMEM_OK);
	CHECK_STATUS(xmem_pool_get_ticket(b, &parsed, &fb), XMEM_OK);
	CHECK_STATUS(xmem_pool_get_ticket(b, &parsed, &fc), XMEM_EBADTICKET);
	REQUIRE(fa != NULL && fb != NULL);
	CHECK(intact(xmem_buffer_data(fa), 256, 7));
	CHECK(xmem_buffer_meta(fb)->seq == t.seq);
	xmem_ticket_stats ts;
	CHECK_STATUS(xmem_pool_ticket_stats(owner, &ts), XMEM_OK);
	CHECK(ts.issued == 1 && ts.redeemed == 2 && ts.expired == 0);
	xmem_buffer_release(fa);
	xmem_buffer_release(fb);
	CHECK_STATUS(xmem_pool_acquire(owner, 5000000000, &w), XMEM_OK); /* the only slot, back */
	xmem_buffer_release(w);
	xmem_pool_close(a);
	xmem_pool_close(b);
	xmem_pool_close(owner);
	return failures ? 1 : 0;
}

/* The seed's flow in C: connect in any order, set_ref_count for two holders, get by meta
 * index in two handles, forget; and what is refused. */
static int seed_flow(void)
{
	xmem_connect_options o;
	xmem_connect_options_init(&o);
	CHECK(o.timeout_ns == 10000000000ll && o.memory_cap_mib == 1024 && o.device_memory_cap_mib == 4096);
	o.timeout_ns = 2000000000ll;
	xmem_pool *consumer = NULL, *owner = NULL;
	CHECK_STATUS(xmem_pool_connect("c-seed", &o, &consumer), XMEM_OK);
	REQUIRE(consumer != NULL);
	CHECK(xmem_pool_role(consumer) == XMEM_ROLE_NONE);
	CHECK(xmem_pool_role(NULL) == XMEM_ROLE_NONE);
	o.reserved[0] = 1;
	CHECK_STATUS(xmem_pool_connect("c-seed", &o, &owner), XMEM_EINVAL);
	o.reserved[0] = 0;
	CHECK_STATUS(xmem_pool_connect("c-seed", &o, &owner), XMEM_OK);
	REQUIRE(owner != NULL);
	xmem_buffer *w = NULL;
	CHECK_STATUS(xmem_pool_acquire_memory(owner, 256, XMEM_STORAGE_SYSTEM, 0, 1000000000, NULL, &w), XMEM_OK);
	REQUIRE(w != NULL);
	CHECK(xmem_pool_role(owner) == XMEM_ROLE_OWNER);
	fill(xmem_buffer_data_mut(w), 256, 9);
	uint32_t mi = xmem_buffer_meta_index(w);
	CHECK(mi != XMEM_NO_META_INDEX && (mi & ((1u << XMEM_META_SLOT_BITS) - 1)) == 0);
	CHECK_STATUS(xmem_buffer_forget(w), XMEM_EINVAL); /* acquired, not published */
	CHECK_STATUS(xmem_pool_set_ref_count(owner, mi, 0, 0), XMEM_EINVAL);
	CHECK_STATUS(xmem_pool_set_ref_count(owner, mi, -3, 0), XMEM_EINVAL);
	CHECK_STATUS(xmem_pool_set_ref_count(owner, mi, 2, 0), XMEM_OK);
	CHECK(xmem_buffer_meta_index(w) == mi); /* readable after set_ref_count */
	CHECK_STATUS(xmem_buffer_forget(w), XMEM_OK);
	xmem_pool *other = NULL;
	CHECK_STATUS(xmem_pool_connect("c-seed", &o, &other), XMEM_OK);
	REQUIRE(other != NULL);
	CHECK(xmem_pool_role(other) == XMEM_ROLE_CONSUMER);
	xmem_buffer *a = NULL, *b = NULL, *c = NULL;
	CHECK_STATUS(xmem_pool_get(consumer, mi, &a), XMEM_OK);
	CHECK_STATUS(xmem_pool_get(other, mi, &b), XMEM_OK);
	CHECK_STATUS(xmem_pool_get(other, mi, &c), XMEM_ENOTHELD); /* both holds taken */
	REQUIRE(a != NULL && b != NULL);
	CHECK(intact(xmem_buffer_data(a), 256, 9) && intact(xmem_buffer_data(b), 256, 9));
	CHECK(xmem_buffer_meta_index(a) == mi);
	CHECK(xmem_buffer_meta_index(NULL) == XMEM_NO_META_INDEX);
	CHECK_STATUS(xmem_buffer_forget(NULL), XMEM_EINVAL);
	/* forget keeps the reference: released by meta index. */
	CHECK_STATUS(xmem_buffer_forget(a), XMEM_OK);
	CHECK(xmem_pool_ref_count(consumer, mi) == 1);
	CHECK_STATUS(xmem_pool_release(consumer, mi), XMEM_OK);
	xmem_buffer_release(b);
	CHECK_STATUS(xmem_pool_get(consumer, 0xFFFFFFFFu, &c), XMEM_ERANGE);
	xmem_pool_close(other);
	xmem_pool_close(consumer);
	xmem_pool_close(owner);
	return failures ? 1 : 0;
}

/* Growth on demand: a pool with a memory cap makes a slot of a size no class holds,
 * counts it, reuses it once free, and refuses a size past the cap with XMEM_EFULL. */
static int growth(void)
{
	xmem_pool_config config;
	xmem_pool_config_init(&config);
	config.slot_count = 1;
	config.slot_size = 4096;
	config.memory_cap_mib = 1;
	config.trim_idle_ms = 60000;
	xmem_pool *owner = NULL;
	config.reserved_config[1] = 1;
	CHECK_STATUS(xmem_pool_create("c-growth", &config, &owner), XMEM_EINVAL);
	CHECK(strstr(xmem_last_error(), "reserved") != NULL);
	config.reserved_config[1] = 0;
	REQUIRE(xmem_pool_create("c-growth", &config, &owner) == XMEM_OK);
	xmem_growth_stats g;
	CHECK_STATUS(xmem_pool_growth_stats(owner, &g), XMEM_OK);
	CHECK(g.memory_cap == (1 << 20) && g.trim_idle_ns == 60000000000ull && g.system_bytes == 4096);
	xmem_buffer *w = NULL;
	for (int round = 0; round < 2; round++) {
		CHECK_STATUS(xmem_pool_acquire_size(owner, 100000, 0, NULL, &w), XMEM_OK);
		REQUIRE(w != NULL);
		CHECK(xmem_buffer_meta(w)->index == 1 && xmem_buffer_capacity(w) == 112 * 1024);
		xmem_buffer_release(w);
	}
	CHECK_STATUS(xmem_pool_growth_stats(owner, &g), XMEM_OK);
	CHECK(g.grown == 1 && g.dynamic_slots == 1 && g.dynamic_bytes == 112 * 1024 && g.dynamic_classes == 2);
	CHECK_STATUS(xmem_pool_acquire_size(owner, 2 << 20, 0, NULL, &w), XMEM_EFULL);
	CHECK(strstr(xmem_last_error(), "memory cap") != NULL);
	CHECK_STATUS(xmem_pool_growth_stats(NULL, &g), XMEM_EINVAL);
	xmem_pool_close(owner);
	return failures ? 1 : 0;
}

/* Size classes: a class added with a consumer attached, acquire by size taking the
 * smallest class that fits, the class table seen by both, a frame of the new class
 * received byte for byte, and the refusals. */
static int size_classes(void)
{
	xmem_pool *owner = NULL, *a = NULL, *b = NULL;
	REQUIRE(owner_and_two_consumers("c-classes", 1, &owner, &a, &b) == 0);
	uint32_t index = 0;
	CHECK_STATUS(xmem_pool_preallocate(owner, 1 << 20, 2, XMEM_STORAGE_SYSTEM, 0, &index), XMEM_OK);
	CHECK(index == 1);
	CHECK_STATUS(xmem_pool_preallocate(owner, 4096, 1, XMEM_STORAGE_SYSTEM, 1, NULL), XMEM_EINVAL);
	CHECK_STATUS(xmem_pool_preallocate(a, 4096, 1, XMEM_STORAGE_SYSTEM, 0, NULL), XMEM_EROLE);
	CHECK_STATUS(xmem_pool_preallocate(NULL, 4096, 1, XMEM_STORAGE_SYSTEM, 0, NULL), XMEM_EINVAL);
	CHECK(xmem_pool_class_count(owner) == 2 && xmem_pool_class_count(a) == 2);
	xmem_size_class c;
	CHECK_STATUS(xmem_pool_class_info(a, 1, &c), XMEM_OK);
	CHECK(c.index == 1 && c.slot_size == (1 << 20) && c.count == 2 && c.first_slot == 1 &&
	      c.storage == XMEM_STORAGE_SYSTEM && c.sync_mode == 0);
	CHECK_STATUS(xmem_pool_class_info(a, 2, &c), XMEM_ERANGE);
	CHECK(xmem_pool_slot_count(owner) == 3);

	xmem_buffer *w = NULL, *big = NULL;
	CHECK_STATUS(xmem_pool_acquire_size(owner, (1 << 20) + 1, 0, NULL, &w), XMEM_ERANGE);
	CHECK_STATUS(xmem_pool_acquire_size(owner, 100, 0, NULL, &w), XMEM_OK);
	REQUIRE(w != NULL);
	CHECK(xmem_buffer_meta(w)->index == 0);
	CHECK_STATUS(xmem_pool_acquire_size(owner, 100, 0, NULL, &big), XMEM_OK);
	REQUIRE(big != NULL);
	CHECK(xmem_buffer_meta(big)->index == 1 && xmem_buffer_capacity(big) == (1 << 20));
	xmem_buffer_release(w);
	/* A memory named: system memory is this pool's; it has no class of CUDA memory. */
	CHECK_STATUS(xmem_pool_acquire_memory(owner, 100, XMEM_STORAGE_SYSTEM, 0, 0, NULL, &w), XMEM_OK);
	REQUIRE(w != NULL);
	CHECK(xmem_buffer_meta(w)->index == 0);
	xmem_buffer_release(w);
	CHECK_STATUS(xmem_pool_acquire_memory(owner, 100, XMEM_STORAGE_CUDA, 0, 0, NULL, &w), XMEM_ERANGE);
	CHECK_STATUS(xmem_pool_acquire_memory(owner, 100, XMEM_STORAGE_SYSTEM, 1, 0, NULL, &w), XMEM_EINVAL);
	CHECK_STATUS(xmem_pool_acquire_memory(a, 100, XMEM_STORAGE_SYSTEM, 0, 0, NULL, &w), XMEM_OK);
	REQUIRE(w != NULL);
	CHECK(xmem_buffer_meta(w)->index == 0);
	xmem_buffer_release(w); /* given back unpublished */
	fill(xmem_buffer_data_mut(big), 1 << 20, 9);
	xmem_buffer_meta_mut(big)->size = 1 << 20;
	CHECK_STATUS(xmem_pool_publish(owner, big), XMEM_OK);
	xmem_buffer *r = NULL;
	CHECK_STATUS(xmem_pool_receive(b, 1000000000, &r), XMEM_OK);
	REQUIRE(r != NULL);
	CHECK(xmem_buffer_meta(r)->size == (1 << 20) && intact(xmem_buffer_data(r), 1 << 20, 9));
	/* By index with its frame's seq: that frame, never another. */
	uint64_t seq = xmem_buffer_meta(r)->seq;
	xmem_buffer *again = NULL;
	CHECK_STATUS(xmem_pool_get_seq(b, 1, seq, &again), XMEM_OK);
	REQUIRE(again != NULL);
	CHECK(xmem_buffer_meta(again)->seq == seq);
	xmem_buffer_release(again);
	CHECK_STATUS(xmem_pool_get_seq(b, 1, seq + 1, &again), XMEM_ENOTHELD);
	CHECK_STATUS(xmem_pool_get_seq(NULL, 1, seq, &again), XMEM_EINVAL);
	/* A copy that is a buffer of the pool: another slot of a class that holds it. */
	xmem_buffer *copy = NULL;
	CHECK_STATUS(xmem_pool_copy(owner, r, XMEM_STORAGE_SYSTEM, 0, 1000000000, NULL, &copy), XMEM_OK);
	REQUIRE(copy != NULL);
	CHECK(xmem_buffer_meta(copy)->index == 2 && xmem_buffer_meta(copy)->size == (1 << 20) &&
	      intact(xmem_buffer_data(copy), 1 << 20, 9) && xmem_buffer_data_mut(copy) != NULL);
	xmem_buffer_release(copy);
	CHECK_STATUS(xmem_pool_copy(owner, r, XMEM_STORAGE_CUDA, 0, 0, NULL, &copy), XMEM_ERANGE);
	/* A consumer's copy is a slot leased to it (a guest producer's), published by the owner. */
	CHECK_STATUS(xmem_pool_copy(b, r, XMEM_STORAGE_SYSTEM, 0, 1000000000, NULL, &copy), XMEM_OK);
	REQUIRE(copy != NULL);
	CHECK(xmem_buffer_meta(copy)->index == 2 && intact(xmem_buffer_data(copy), 1 << 20, 9));
	xmem_buffer_release(copy);
	CHECK_STATUS(xmem_pool_copy(owner, NULL, XMEM_STORAGE_SYSTEM, 0, 0, NULL, &copy), XMEM_EINVAL);
	xmem_buffer_release(r);
	xmem_pool_close(a);
	xmem_pool_close(b);
	xmem_pool_close(owner);
	return failures ? 1 : 0;
}

/* A consumer's cap on slots held and a late joiner's history, through the C API: the
 * options, the stats, and what the owner delivers. */
static int held_and_history(void)
{
	int before = failures;
	xmem_pool_config config;
	xmem_pool_config_init(&config);
	config.slot_size = 256;
	config.slot_count = 8;
	xmem_pool *owner = NULL, *keeper = NULL, *late = NULL;
	REQUIRE(xmem_pool_create("c-held", &config, &owner) == XMEM_OK);
	xmem_open_options options;
	xmem_open_options_init(&options);
	CHECK(options.max_held == 0 && options.history == 0);
	options.max_held = 2;
	REQUIRE(xmem_pool_open("c-held", &options, &keeper) == XMEM_OK);
	xmem_buffer *kept[8] = { NULL };
	uint32_t n = 0;
	for (uint64_t tag = 1; tag <= 6; tag++) {
		publish(owner, tag, 256);
		xmem_buffer *b = NULL;
		while (n < 8 && xmem_pool_receive(keeper, 0, &b) == XMEM_OK)
			kept[n++] = b;
	}
	CHECK(n == 2);
	xmem_consumer_stats cs;
	CHECK_STATUS(xmem_pool_consumer_stats(keeper, &cs), XMEM_OK);
	CHECK(cs.held == 2 && cs.max_held == 2 && cs.dropped == 4);
	xmem_buffer *none = NULL;
	CHECK_STATUS(xmem_pool_receive(keeper, 10000000, &none), XMEM_ETIMEDOUT);
	CHECK(strstr(xmem_last_error(), "max_held 2") != NULL);

	/* Frames 3..6 are still in the pool (no holder): a late joiner asks for two. */
	xmem_open_options_init(&options);
	options.history = 2;
	options.has_policy = 1;
	options.policy = XMEM_POLICY_FIFO;
	REQUIRE(xmem_pool_open("c-held", &options, &late) == XMEM_OK);
	for (uint64_t tag = 5; tag <= 6; tag++) {
		xmem_buffer *b = NULL;
		CHECK_STATUS(xmem_pool_receive(late, 0, &b), XMEM_OK);
		if (b) {
			CHECK(xmem_buffer_meta(b)->seq == tag);
			CHECK(intact(xmem_buffer_data(b), 256, tag));
			xmem_buffer_release(b);
		}
	}
	CHECK_STATUS(xmem_pool_receive(late, 0, &none), XMEM_ETIMEDOUT);
	for (uint32_t i = 0; i < n; i++)
		xmem_buffer_release(kept[i]);
	xmem_pool_close(late);
	xmem_pool_close(keeper);
	xmem_pool_close(owner);
	return failures == before ? 0 : 1;
}

int main(void)
{
	char tmpl[] = "/tmp/xmem-c-api-XXXXXX";
	char *dir = mkdtemp(tmpl);
	if (!dir) {
		perror("mkdtemp");
		return 1;
	}
	setenv("XDG_RUNTIME_DIR", dir, 1);
	int rc = run(dir);
	if (tensors_and_sole_holders() != 0)
		rc = 1;
	if (tickets() != 0)
		rc = 1;
	if (growth() != 0)
		rc = 1;
	if (seed_flow() != 0)
		rc = 1;
	if (size_classes() != 0)
		rc = 1;
	if (held_and_history() != 0)
		rc = 1;
	char pool_dir[512];
	snprintf(pool_dir, sizeof(pool_dir), "%s/xmem", dir);
	rmdir(pool_dir); /* empty if every pool cleaned up */
	if (rmdir(dir) != 0) {
		fprintf(stderr, "%s not empty after the test: a socket or lock file was left behind\n", dir);
		rc = 1;
	}
	if (rc == 0)
		printf("c-api: all checks passed\n");
	return rc;
}
