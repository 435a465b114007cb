/* test_c_api_cuda.c - the C API's CUDA calls from a C11 program, against the CUDA driver
 * simulator: a device pool's owner and consumer in one process, frames written and read
 * on streams, copies, stream releases, getters and every NULL-argument error. Exits 0, or
 * 1 at the first failed check (77, skipped, when XMEM_CUDA_DRIVER is not set). */
#define _POSIX_C_SOURCE 200809L

#include <xmem/xmem.h>

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The few driver types this test needs, as cuda.h declares them on 64-bit Linux: the
 * test calls the driver xmem loaded (the same dlopen() handle) and needs no toolkit. */
typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUstream;
typedef unsigned long long CUdeviceptr;
#define CUDA_SUCCESS 0
#define CU_STREAM_NON_BLOCKING 0x1

/* Entry points by their ABI names (cuda.h maps cuCtxPushCurrent to cuCtxPushCurrent_v2). */
struct driver {
	CUresult (*cuInit)(unsigned int flags);
	CUresult (*cuDeviceGet)(CUdevice *device, int ordinal);
	CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *ctx, CUdevice device);
	CUresult (*cuDevicePrimaryCtxRelease)(CUdevice device);
	CUresult (*cuCtxPushCurrent)(CUcontext ctx);
	CUresult (*cuCtxPopCurrent)(CUcontext *ctx);
	CUresult (*cuStreamCreate)(CUstream *stream, unsigned int flags);
	CUresult (*cuStreamDestroy)(CUstream stream);
	CUresult (*cuStreamSynchronize)(CUstream stream);
	CUresult (*cuMemsetD32Async)(CUdeviceptr dst, unsigned int value, size_t count, CUstream stream);
};

/* What teardown() gives back whether or not the checks passed. */
static struct {
	struct driver cu;
	CUdevice device;
	CUcontext ctx;
	int pushed;
	CUstream writer; /* the producer's stream */
	CUstream reader; /* the consumer's stream */
	xmem_pool *owner;
	xmem_pool *consumer;
	xmem_pool *system; /* a system-memory pool */
	xmem_pool *spill; /* a device pool with a spill tier, and its two recorders */
	xmem_pool *recorders[2];
	xmem_pool *growing; /* a device pool that grows (device_memory_cap_mib) */
} t;

#define SLOT_SIZE (64u * 1024)
#define CHUNK 4096u /* one cuMemsetD32Async per chunk, each with its own word */
#define FRAMES 8u /* more than the slots: slots come back through stream releases */
#define TIMEOUT 5000000000 /* 5 s */

#define CHECK(cond)                                                                                                    \
	do {                                                                                                           \
		if (!(cond)) {                                                                                         \
			fprintf(stderr, "%s:%d: CHECK(%s) failed (last error: '%s')\n", __FILE__, __LINE__, #cond,     \
				xmem_last_error());                                                                    \
			return 1;                                                                                      \
		}                                                                                                      \
	} while (0)

/* A call that must return STATUS; an error must also leave a message. */
#define CHECK_STATUS(call, status)                                                                                     \
	do {                                                                                                           \
		int got_ = (call);                                                                                     \
		if (got_ != (status)) {                                                                                \
			fprintf(stderr, "%s:%d: %s returned %s, expected %s (last error: '%s')\n", __FILE__, __LINE__, \
				#call, xmem_status_name(got_), xmem_status_name(status), xmem_last_error());           \
			return 1;                                                                                      \
		}                                                                                                      \
		if (got_ != XMEM_OK && xmem_last_error()[0] == '\0') {                                                 \
			fprintf(stderr, "%s:%d: %s failed without a message\n", __FILE__, __LINE__, #call);            \
			return 1;                                                                                      \
		}                                                                                                      \
	} while (0)

/* A NULL-argument call: XMEM_EINVAL, and a message naming the call. */
#define CHECK_EINVAL(call, name)                                                                                       \
	do {                                                                                                           \
		CHECK_STATUS(call, XMEM_EINVAL);                                                                       \
		CHECK(strstr(xmem_last_error(), name) != NULL);                                                        \
	} while (0)

#define CHECK_CU(call)                                                                                                 \
	do {                                                                                                           \
		CUresult r_ = (call);                                                                                  \
		if (r_ != CUDA_SUCCESS) {                                                                              \
			fprintf(stderr, "%s:%d: %s returned CUresult %d\n", __FILE__, __LINE__, #call, r_);            \
			return 1;                                                                                      \
		}                                                                                                      \
	} while (0)

/* dlsym() returns an object pointer; ISO C has no cast to a function pointer, so copy it. */
static int load(void *lib, const char *name, void *fn, size_t size)
{
	void *sym = dlsym(lib, name);
	if (!sym) {
		fprintf(stderr, "the CUDA driver lacks %s\n", name);
		return 0;
	}
	memcpy(fn, &sym, size);
	return 1;
}

#define LOAD(lib, field, name) load(lib, name, (void *)&t.cu.field, sizeof(t.cu.field))

static int load_driver(const char *path)
{
	void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		fprintf(stderr, "cannot load the CUDA driver %s: %s\n", path, dlerror());
		return 0;
	}
	/* Never closed: the driver's threads live as long as the process (as in xmem). */
	return LOAD(lib, cuInit, "cuInit") && LOAD(lib, cuDeviceGet, "cuDeviceGet") &&
	       LOAD(lib, cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain") &&
	       LOAD(lib, cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2") &&
	       LOAD(lib, cuCtxPushCurrent, "cuCtxPushCurrent_v2") && LOAD(lib, cuCtxPopCurrent, "cuCtxPopCurrent_v2") &&
	       LOAD(lib, cuStreamCreate, "cuStreamCreate") && LOAD(lib, cuStreamDestroy, "cuStreamDestroy_v2") &&
	       LOAD(lib, cuStreamSynchronize, "cuStreamSynchronize") && LOAD(lib, cuMemsetD32Async, "cuMemsetD32Async");
}

/* The 32-bit word chunk K of frame TAG is filled with. */
static uint32_t word(uint32_t tag, uint32_t k)
{
	return 0x9e3779b1u * (tag * 64 + k + 1);
}

/* Fills a device frame on STREAM: the CPU never touches a device address. */
static int write_frame(CUdeviceptr dst, uint32_t tag, CUstream stream)
{
	for (uint32_t k = 0; k < SLOT_SIZE / CHUNK; k++)
		CHECK_CU(t.cu.cuMemsetD32Async(dst + k * CHUNK, word(tag, k), CHUNK / 4, stream));
	return 0;
}

/* 1 when every byte of a host copy of frame TAG is what write_frame() wrote. */
static int intact(const void *data, uint64_t size, uint32_t tag)
{
	const unsigned char *p = data;
	if (!p || size != SLOT_SIZE)
		return 0;
	for (uint64_t i = 0; i < size; i++) {
		uint32_t w = word(tag, (uint32_t)(i / CHUNK));
		unsigned char expected = (unsigned char)(w >> (8 * (i % 4))); /* little-endian */
		if (p[i] != expected) {
			fprintf(stderr, "frame %u byte %llu: 0x%02x, expected 0x%02x\n", tag, (unsigned long long)i,
				p[i], expected);
			return 0;
		}
	}
	return 1;
}

/* Every new call with a NULL where a pointer is needed; BUFFER is a live device frame. */
static int null_arguments(const xmem_buffer *buffer)
{
	xmem_buffer *out = NULL;
	CHECK_EINVAL(xmem_pool_acquire_on_stream(NULL, 0, t.writer, &out), "xmem_pool_acquire_on_stream");
	CHECK_EINVAL(xmem_pool_acquire_on_stream(t.owner, 0, t.writer, NULL), "xmem_pool_acquire_on_stream");
	CHECK_EINVAL(xmem_pool_receive_on_stream(NULL, 0, t.reader, &out), "xmem_pool_receive_on_stream");
	CHECK_EINVAL(xmem_pool_receive_on_stream(t.consumer, 0, t.reader, NULL), "xmem_pool_receive_on_stream");
	CHECK_EINVAL(xmem_pool_publish_on_stream(t.owner, NULL, t.writer), "xmem_pool_publish_on_stream");
	CHECK_EINVAL(xmem_buffer_release_on_stream(NULL, t.reader), "xmem_buffer_release_on_stream");
	CHECK_EINVAL(xmem_buffer_copy_to_cpu(NULL, t.reader, &out), "xmem_buffer_copy_to_cpu");
	CHECK_EINVAL(xmem_buffer_copy_to_cpu(buffer, t.reader, NULL), "xmem_buffer_copy_to_cpu");
	CHECK_EINVAL(xmem_buffer_copy_to_cuda(NULL, 0, t.reader, &out), "xmem_buffer_copy_to_cuda");
	CHECK_EINVAL(xmem_buffer_copy_to_cuda(buffer, 0, t.reader, NULL), "xmem_buffer_copy_to_cuda");
	CHECK_EINVAL(xmem_buffer_copy_to_device(NULL, 0, t.reader, &out), "xmem_buffer_copy_to_device");
	CHECK_EINVAL(xmem_buffer_copy_to_device(buffer, 0, t.reader, NULL), "xmem_buffer_copy_to_device");
	CHECK_EINVAL(xmem_buffer_private_copy(NULL, XMEM_STORAGE_SYSTEM, 0, t.reader, &out),
		     "xmem_buffer_private_copy");
	CHECK_EINVAL(xmem_buffer_private_copy(buffer, XMEM_STORAGE_CUDA, 0, t.reader, NULL),
		     "xmem_buffer_private_copy");
	CHECK_EINVAL(xmem_buffer_private_copy(buffer, 9, 0, t.reader, &out), "unknown storage");
	CHECK(out == NULL);

	/* A NULL pool consumes the buffer all the same: its slot comes back to the owner. */
	xmem_buffer *b = NULL;
	CHECK_STATUS(xmem_pool_acquire_on_stream(t.owner, TIMEOUT, t.writer, &b), XMEM_OK);
	CHECK(b != NULL);
	uint32_t index = xmem_buffer_meta(b)->index;
	CHECK(xmem_pool_ref_count(t.owner, index) == 1);
	CHECK_EINVAL(xmem_pool_publish_on_stream(NULL, b, t.writer), "xmem_pool_publish_on_stream");
	CHECK(xmem_pool_ref_count(t.owner, index) == 0);

	/* Getters: the neutral value. */
	CHECK(xmem_pool_storage(NULL) == XMEM_STORAGE_SYSTEM);
	CHECK(xmem_pool_device(NULL) == 0);
	CHECK(strcmp(xmem_pool_gpu_ordering(NULL), "none") == 0);
	CHECK(xmem_buffer_storage(NULL) == XMEM_STORAGE_SYSTEM);
	CHECK(xmem_buffer_device(NULL) == 0);
	CHECK(xmem_buffer_device_ptr(NULL) == 0);
	return 0;
}

/* Round trips through device copies: HOST (a host copy of frame TAG) to the device and
 * back on the reader's stream, and RECEIVED (the device frame) device to device. */
static int copies(const xmem_buffer *received, const xmem_buffer *host, uint32_t tag)
{
	xmem_buffer *dev = NULL;
	/* A failed copy of a frame still held leaves the reference to its slot alone. */
	CHECK_STATUS(xmem_buffer_private_copy(received, XMEM_STORAGE_CUDA, 7, t.reader, &dev), XMEM_EINVAL);
	CHECK(xmem_pool_ref_count(t.consumer, xmem_buffer_meta(received)->index) == 1);
	CHECK(!xmem_buffer_is_incomplete(received));
	CHECK(xmem_pool_pitch_alignment(t.consumer) >= 256);
	CHECK(xmem_pool_pitch_alignment(NULL) == 1);
	xmem_frame_meta layout;
	memset(&layout, 0, sizeof(layout));
	CHECK_STATUS(xmem_set_video_layout(&layout, "NV12", 1920, 1080, 256), XMEM_OK);
	CHECK(layout.n_planes == 2 && layout.plane_stride[1] == 2048 && layout.size == 2048u * 1620);
	CHECK_STATUS(xmem_set_video_layout(&layout, "MJPG", 64, 64, 256), XMEM_EINVAL);
	CHECK_STATUS(xmem_set_video_layout(NULL, "NV12", 64, 64, 256), XMEM_EINVAL);
	CHECK_STATUS(xmem_buffer_private_copy(host, XMEM_STORAGE_CUDA, 0, t.reader, &dev), XMEM_OK);
	CHECK(xmem_buffer_storage(dev) == XMEM_STORAGE_CUDA);
	CHECK(xmem_buffer_device(dev) == 0);
	CHECK(xmem_buffer_device_ptr(dev) != 0);
	CHECK(xmem_buffer_device_ptr(dev) != xmem_buffer_device_ptr(received));
	CHECK(xmem_buffer_is_copy(dev));
	CHECK(!xmem_buffer_is_writable(dev));
	CHECK(xmem_buffer_data(dev) == NULL);
	xmem_buffer *back = NULL;
	CHECK_STATUS(xmem_buffer_private_copy(dev, XMEM_STORAGE_SYSTEM, 0, t.reader, &back), XMEM_OK);
	CHECK(xmem_buffer_storage(back) == XMEM_STORAGE_SYSTEM);
	CHECK(xmem_buffer_device_ptr(back) == 0);
	CHECK(intact(xmem_buffer_data(back), xmem_buffer_capacity(back), tag));
	xmem_buffer_release(back);
	xmem_buffer_release(dev);

	/* Device to device without a stream (complete on return), under the seed's name. */
	dev = NULL;
	CHECK_STATUS(xmem_buffer_private_copy(received, XMEM_STORAGE_CUDA, 0, NULL, &dev), XMEM_OK);
	CHECK(xmem_buffer_storage(dev) == XMEM_STORAGE_CUDA);
	CHECK(xmem_buffer_device_ptr(dev) != 0);
	CHECK(xmem_buffer_device_ptr(dev) != xmem_buffer_device_ptr(received));
	CHECK(xmem_buffer_meta(dev)->seq == xmem_buffer_meta(received)->seq);
	back = NULL;
	CHECK_STATUS(xmem_buffer_private_copy(dev, XMEM_STORAGE_SYSTEM, 0, NULL, &back), XMEM_OK);
	CHECK(intact(xmem_buffer_data(back), xmem_buffer_capacity(back), tag));
	xmem_buffer_release(back);
	xmem_buffer_release(dev);

	return 0;
}

/* A system-memory pool: the stream calls take a stream and ignore it. */
static int system_pool(void)
{
	xmem_pool_config config;
	xmem_pool_config_init(&config);
	config.slot_count = 2;
	config.slot_size = SLOT_SIZE;
	CHECK_STATUS(xmem_pool_create("c-cuda-system", &config, &t.system), XMEM_OK);
	CHECK(xmem_pool_storage(t.system) == XMEM_STORAGE_SYSTEM);
	CHECK(xmem_pool_device(t.system) == 0);
	CHECK(strcmp(xmem_pool_gpu_ordering(t.system), "none") == 0);

	xmem_buffer *b = NULL;
	CHECK_STATUS(xmem_pool_acquire_on_stream(t.system, TIMEOUT, t.writer, &b), XMEM_OK);
	CHECK(xmem_buffer_storage(b) == XMEM_STORAGE_SYSTEM);
	CHECK(xmem_buffer_device_ptr(b) == 0);
	CHECK(xmem_buffer_data_mut(b) != NULL);
	memset(xmem_buffer_data_mut(b), 0x5a, SLOT_SIZE);
	xmem_buffer_meta_mut(b)->size = SLOT_SIZE;

	/* Through the device and back. */
	xmem_buffer *dev = NULL;
	CHECK_STATUS(xmem_buffer_private_copy(b, XMEM_STORAGE_CUDA, 0, t.writer, &dev), XMEM_OK);
	CHECK(xmem_buffer_storage(dev) == XMEM_STORAGE_CUDA);
	CHECK(xmem_buffer_device_ptr(dev) != 0);
	xmem_buffer *back = NULL;
	CHECK_STATUS(xmem_buffer_private_copy(dev, XMEM_STORAGE_SYSTEM, 0, t.writer, &back), XMEM_OK);
	const unsigned char *p = xmem_buffer_data(back);
	CHECK(p != NULL && xmem_buffer_capacity(back) == SLOT_SIZE);
	for (uint32_t i = 0; i < SLOT_SIZE; i++)
		CHECK(p[i] == 0x5a);
	xmem_buffer_release(back);
	xmem_buffer_release(dev);
	CHECK_STATUS(xmem_pool_publish_on_stream(t.system, b, t.writer), XMEM_OK);
	return 0;
}

/* A device pool with a spill tier: two fifo-spill recorders read nothing while 12
 * frames go through 2 slots; then one gets each as a device frame (spilled ones its own
 * copies), the other spilled ones as host memory, every byte as written. */
static int spill_tier(void)
{
	xmem_pool_config config;
	xmem_pool_config_init(&config);
	config.slot_count = 2;
	config.slot_size = SLOT_SIZE;
	config.storage = XMEM_STORAGE_CUDA;
	config.spill_bytes = 16 * SLOT_SIZE;
	CHECK_STATUS(xmem_pool_create("c-cuda-spill", &config, &t.spill), XMEM_OK);
	for (int i = 0; i < 2; i++) {
		xmem_open_options o;
		xmem_open_options_init(&o);
		CHECK(o.spill_delivery == XMEM_SPILL_DELIVERY_DEVICE);
		o.has_policy = 1;
		o.policy = XMEM_POLICY_FIFO_SPILL;
		o.spill_delivery = i == 0 ? XMEM_SPILL_DELIVERY_DEVICE : XMEM_SPILL_DELIVERY_HOST;
		CHECK_STATUS(xmem_pool_open("c-cuda-spill", &o, &t.recorders[i]), XMEM_OK);
	}
	for (uint32_t tag = 1; tag <= 12; tag++) {
		xmem_buffer *b = NULL;
		CHECK_STATUS(xmem_pool_acquire_on_stream(t.spill, TIMEOUT, t.writer, &b), XMEM_OK);
		if (write_frame(xmem_buffer_device_ptr(b), tag, t.writer))
			return 1;
		xmem_buffer_meta_mut(b)->size = SLOT_SIZE;
		CHECK_STATUS(xmem_pool_publish_on_stream(t.spill, b, t.writer), XMEM_OK);
	}
	xmem_spill_stats spill;
	CHECK_STATUS(xmem_pool_spill_stats(t.spill, &spill), XMEM_OK);
	CHECK(spill.spilled >= 10);
	for (int i = 0; i < 2; i++) {
		uint32_t spilled = 0;
		for (uint32_t tag = 1; tag <= 12; tag++) {
			xmem_buffer *f = NULL;
			CHECK_STATUS(xmem_pool_receive_on_stream(t.recorders[i], TIMEOUT, t.reader, &f), XMEM_OK);
			CHECK(xmem_buffer_meta(f)->seq == tag);
			int in_host = xmem_buffer_storage(f) == XMEM_STORAGE_SYSTEM;
			CHECK(in_host == (i == 1 && xmem_buffer_spilled(f)));
			spilled += (uint32_t)xmem_buffer_spilled(f);
			if (in_host) {
				CHECK(intact(xmem_buffer_data(f), SLOT_SIZE, tag));
			} else {
				xmem_buffer *back = NULL;
				CHECK_STATUS(xmem_buffer_private_copy(f, XMEM_STORAGE_SYSTEM, 0, t.reader, &back),
					     XMEM_OK);
				CHECK(intact(xmem_buffer_data(back), xmem_buffer_capacity(back), tag));
				xmem_buffer_release(back);
			}
			CHECK_STATUS(xmem_buffer_release_on_stream(f, t.reader), XMEM_OK);
		}
		CHECK(spilled >= 10);
		xmem_consumer_stats stats;
		CHECK_STATUS(xmem_pool_consumer_stats(t.recorders[i], &stats), XMEM_OK);
		CHECK(stats.dropped == 0 && stats.spilled == spilled);
	}
	xmem_open_options bad;
	xmem_open_options_init(&bad);
	bad.spill_delivery = 7;
	xmem_pool *none = NULL;
	CHECK_STATUS(xmem_pool_open("c-cuda-spill", &bad, &none), XMEM_EINVAL);
	return 0;
}

/* Growth of device memory: a size no class holds makes a device slot within the device
 * cap, counted in xmem_pool_growth_stats; past the cap, XMEM_EFULL. */
static int device_growth(void)
{
	xmem_pool_config config;
	xmem_pool_config_init(&config);
	config.slot_count = 1;
	config.slot_size = SLOT_SIZE;
	config.storage = XMEM_STORAGE_CUDA;
	config.device_memory_cap_mib = 6; /* class 0's 2 MiB and one slot of 4 MiB */
	CHECK_STATUS(xmem_pool_create("c-cuda-grow", &config, &t.growing), XMEM_OK);
	xmem_growth_stats g;
	CHECK_STATUS(xmem_pool_growth_stats(t.growing, &g), XMEM_OK);
	CHECK(g.memory_cap == 0 && g.device_memory_cap == 6u << 20 && g.device_bytes == 2u << 20);
	xmem_buffer *b = NULL;
	CHECK_STATUS(xmem_pool_acquire_memory(t.growing, 3u << 20, XMEM_STORAGE_CUDA, 0, TIMEOUT, t.writer, &b),
		     XMEM_OK);
	CHECK(xmem_buffer_device_ptr(b) != 0);
	CHECK_STATUS(xmem_pool_growth_stats(t.growing, &g), XMEM_OK);
	CHECK(g.grown == 1 && g.dynamic_slots == 1 && g.device_bytes == 6u << 20 && g.system_bytes == 0);
	xmem_buffer *past = NULL;
	CHECK_STATUS(xmem_pool_acquire_memory(t.growing, 5u << 20, XMEM_STORAGE_CUDA, 0, 0, t.writer, &past),
		     XMEM_EFULL);
	CHECK(strstr(xmem_last_error(), "memory cap") != NULL);
	xmem_buffer_release(b);
	return 0;
}

static int run(void)
{
	const char *path = getenv("XMEM_CUDA_DRIVER");
	if (!path || !*path) {
		printf("skipped: XMEM_CUDA_DRIVER does not name the CUDA driver simulator\n");
		return 77;
	}
	if (!load_driver(path))
		return 1;

	/* A current context for the test's own driver calls: device 0's primary one. */
	CHECK_CU(t.cu.cuInit(0));
	CHECK_CU(t.cu.cuDeviceGet(&t.device, 0));
	CHECK_CU(t.cu.cuDevicePrimaryCtxRetain(&t.ctx, t.device));
	CHECK_CU(t.cu.cuCtxPushCurrent(t.ctx));
	t.pushed = 1;
	CHECK_CU(t.cu.cuStreamCreate(&t.writer, CU_STREAM_NON_BLOCKING));
	CHECK_CU(t.cu.cuStreamCreate(&t.reader, CU_STREAM_NON_BLOCKING));

	xmem_pool_config config;
	xmem_pool_config_init(&config);
	config.slot_count = 2;
	config.slot_size = SLOT_SIZE;
	config.storage = XMEM_STORAGE_CUDA;
	config.device = 0;
	CHECK_STATUS(xmem_pool_create("c-cuda", &config, &t.owner), XMEM_OK);
	xmem_open_options options;
	xmem_open_options_init(&options);
	options.client = "c-api-cuda";
	CHECK_STATUS(xmem_pool_open("c-cuda", &options, &t.consumer), XMEM_OK);

	/* Pool getters, from both sides. */
	CHECK(xmem_pool_storage(t.owner) == XMEM_STORAGE_CUDA);
	CHECK(xmem_pool_storage(t.consumer) == XMEM_STORAGE_CUDA);
	CHECK(xmem_pool_device(t.owner) == 0);
	CHECK(xmem_pool_device(t.consumer) == 0);
	CHECK(strcmp(xmem_pool_gpu_ordering(t.owner), "stream-memops") == 0);
	CHECK(strcmp(xmem_pool_gpu_ordering(t.consumer), "stream-memops") == 0);

	/* Each role's stream calls on the other role. */
	xmem_buffer *b = NULL;
	/* A consumer acquires as a guest producer (the owner leases it the slot). */
	CHECK_STATUS(xmem_pool_acquire_on_stream(t.consumer, 0, t.reader, &b), XMEM_OK);
	CHECK(b != NULL);
	xmem_buffer_release(b);
	b = NULL;
	CHECK_STATUS(xmem_pool_receive_on_stream(t.owner, 0, t.writer, &b), XMEM_EROLE);
	CHECK(b == NULL);

	/* Frames written on one stream and read on another, never waiting on the CPU
	 * except for copy_to_cpu; more frames than slots, so every slot is reused after a
	 * release on the reader's stream. */
	for (uint32_t tag = 1; tag <= FRAMES; tag++) {
		b = NULL;
		CHECK_STATUS(xmem_pool_acquire_on_stream(t.owner, TIMEOUT, t.writer, &b), XMEM_OK);
		CHECK(xmem_buffer_is_writable(b));
		CHECK(xmem_buffer_storage(b) == XMEM_STORAGE_CUDA);
		CHECK(xmem_buffer_device(b) == 0);
		CHECK(xmem_buffer_device_ptr(b) != 0);
		CHECK(xmem_buffer_capacity(b) == SLOT_SIZE);
		CHECK(xmem_buffer_data(b) == NULL); /* device bytes are not CPU memory */
		CHECK(xmem_buffer_data_mut(b) == NULL);
		if (write_frame(xmem_buffer_device_ptr(b), tag, t.writer))
			return 1;
		xmem_frame_meta *m = xmem_buffer_meta_mut(b);
		CHECK(m != NULL);
		m->size = SLOT_SIZE;
		m->pts = tag;
		CHECK_STATUS(xmem_pool_publish_on_stream(t.owner, b, t.writer), XMEM_OK);

		xmem_buffer *r = NULL;
		CHECK_STATUS(xmem_pool_receive_on_stream(t.consumer, TIMEOUT, t.reader, &r), XMEM_OK);
		const xmem_frame_meta *rm = xmem_buffer_meta(r);
		CHECK(rm->seq == tag && rm->pts == tag && rm->size == SLOT_SIZE);
		CHECK(rm->storage_type == XMEM_STORAGE_CUDA);
		CHECK(xmem_buffer_storage(r) == XMEM_STORAGE_CUDA);
		CHECK(xmem_buffer_device(r) == 0);
		CHECK(xmem_buffer_device_ptr(r) != 0);
		CHECK(!xmem_buffer_is_writable(r));
		CHECK(xmem_pool_ref_count(t.consumer, rm->index) == 1);

		xmem_buffer *host = NULL;
		CHECK_STATUS(xmem_buffer_private_copy(r, XMEM_STORAGE_SYSTEM, 0, t.reader, &host), XMEM_OK);
		CHECK(xmem_buffer_storage(host) == XMEM_STORAGE_SYSTEM);
		CHECK(xmem_buffer_device(host) == 0);
		CHECK(xmem_buffer_device_ptr(host) == 0);
		CHECK(xmem_buffer_is_copy(host));
		CHECK(xmem_buffer_meta(host)->pts == tag);
		CHECK(intact(xmem_buffer_data(host), xmem_buffer_capacity(host), tag));

		if (tag == 1 && (copies(r, host, tag) || null_arguments(r)))
			return 1;
		xmem_buffer_release(host);

		uint32_t index = rm->index;
		CHECK_STATUS(xmem_buffer_release_on_stream(r, t.reader), XMEM_OK);
		CHECK(xmem_pool_ref_count(t.consumer, index) == 0);
	}

	/* A release on no stream waits on the CPU, like xmem_buffer_release. */
	b = NULL;
	CHECK_STATUS(xmem_pool_acquire_on_stream(t.owner, TIMEOUT, t.writer, &b), XMEM_OK);
	if (write_frame(xmem_buffer_device_ptr(b), FRAMES + 1, t.writer))
		return 1;
	xmem_buffer_meta_mut(b)->size = SLOT_SIZE;
	CHECK_STATUS(xmem_pool_publish_on_stream(t.owner, b, t.writer), XMEM_OK);
	xmem_buffer *r = NULL;
	CHECK_STATUS(xmem_pool_receive_on_stream(t.consumer, TIMEOUT, NULL, &r), XMEM_OK);
	xmem_buffer *host = NULL;
	CHECK_STATUS(xmem_buffer_private_copy(r, XMEM_STORAGE_SYSTEM, 0, NULL, &host), XMEM_OK);
	CHECK(intact(xmem_buffer_data(host), xmem_buffer_capacity(host), FRAMES + 1));
	uint32_t index = xmem_buffer_meta(r)->index;
	CHECK_STATUS(xmem_buffer_release_on_stream(r, NULL), XMEM_OK);
	CHECK(xmem_pool_ref_count(t.consumer, index) == 0);

	/* A device that does not exist: an error that says so, and no buffer. */
	xmem_buffer *dev = NULL;
	CHECK_STATUS(xmem_buffer_private_copy(host, XMEM_STORAGE_CUDA, 7, t.reader, &dev), XMEM_EINVAL);
	CHECK(strstr(xmem_last_error(), "out of range") != NULL);
	CHECK(dev == NULL);
	xmem_buffer_release(host);

	xmem_pool_stats stats;
	CHECK_STATUS(xmem_pool_stats_get(t.owner, &stats), XMEM_OK);
	CHECK(stats.published == FRAMES + 1);
	CHECK(stats.dropped == 0);

	if (system_pool())
		return 1;
	if (device_growth())
		return 1;
	return spill_tier();
}

/* Gives back what run() left, whether it passed or not: streams done before the pools
 * their queued waits and writes refer to go away. */
static void teardown(void)
{
	if (t.reader)
		t.cu.cuStreamSynchronize(t.reader);
	if (t.writer)
		t.cu.cuStreamSynchronize(t.writer);
	xmem_pool_close(t.recorders[0]);
	xmem_pool_close(t.recorders[1]);
	xmem_pool_close(t.spill);
	xmem_pool_close(t.growing);
	xmem_pool_close(t.system);
	xmem_pool_close(t.consumer);
	xmem_pool_close(t.owner);
	if (t.reader)
		t.cu.cuStreamDestroy(t.reader);
	if (t.writer)
		t.cu.cuStreamDestroy(t.writer);
	if (t.pushed) {
		CUcontext popped;
		t.cu.cuCtxPopCurrent(&popped);
	}
	if (t.ctx)
		t.cu.cuDevicePrimaryCtxRelease(t.device);
}

int main(void)
{
	char tmpl[] = "/tmp/xmem-c-api-cuda-XXXXXX";
	char *dir = mkdtemp(tmpl);
	if (!dir) {
		perror("mkdtemp");
		return 1;
	}
	setenv("XDG_RUNTIME_DIR", dir, 1);
	int rc = run();
	teardown();
	char pool_dir[512];
	snprintf(pool_dir, sizeof(pool_dir), "%s/xmem", dir);
	rmdir(pool_dir); /* empty if every pool cleaned up */
	if (rmdir(dir) != 0) {
		fprintf(stderr, "%s not empty after the test: a socket or lock file was left behind\n", dir);
		if (rc == 0)
			rc = 1;
	}
	if (rc == 0)
		printf("c-api-cuda: all checks passed\n");
	return rc;
}
