/*
 * test_cuda_mem — memory kinds against the STAND-IN CUDA driver
 * (tests/fakecuda, host memory behind the driver API; ECT_CUDA_LIBRARY
 * points at it): loading and info, device specs, allocation and copies
 * between every pair of kinds, pools of each kind and over caller memory,
 * what ect_xport_register_mem accepts, the bounce ring, and a device copy
 * that fails (the stand-in fails every copy of FAIL_BYTES bytes) turning
 * into ECT_EIO for that write only. Real CUDA is exercised by gpu_e2e
 * (`make test-gpu`).
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "testutil.h"

#include "ect_config.h"
#include "mem/memkind.h"
#include "util/util.h"

#define MiB (1024u * 1024u)
#define FAIL_BYTES 777

static void test_info(void **state) {
    (void)state;
    ect_cuda_info ci;
    int rc = ect_cuda_get_info(&ci);
    if (rc) fail_msg("CUDA stand-in not loaded: %s", ci.why);
    assert_int_equal(ci.available, 1);
    assert_int_equal(ci.devices, 1);
    assert_true(ci.driver_version >= 12000);
    assert_non_null(strstr(ci.device0, "fakecuda"));
    assert_string_equal(ci.library, getenv("ECT_CUDA_LIBRARY"));
    assert_string_equal(ci.why, "");
}

static void test_parse_device(void **state) {
    (void)state;
    int k = -5, d = -5;
    assert_int_equal(ect_mem_parse_device(NULL, &k, &d), 0);
    assert_int_equal(k, ECT_MEM_HOST);
    assert_int_equal(ect_mem_parse_device("cpu", &k, &d), 0);
    assert_int_equal(k, ECT_MEM_HOST);
    assert_int_equal(ect_mem_parse_device("pinned", &k, &d), 0);
    assert_int_equal(k, ECT_MEM_PINNED);
    assert_int_equal(ect_mem_parse_device("cuda", &k, &d), 0);
    assert_int_equal(k, ECT_MEM_CUDA);
    assert_int_equal(d, 0);
    assert_int_equal(ect_mem_parse_device("cuda:3", &k, &d), 0);
    assert_int_equal(k, ECT_MEM_CUDA);
    assert_int_equal(d, 3);
    const char *bad[] = {"gpu", "cuda:", "cuda:x", "cuda:-1", "cuda:3x", "CUDA", "cuda:99999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_err(ect_mem_parse_device(bad[i], &k, &d), ECT_EINVAL, "device");
    assert_string_equal(ect_mem_kind_name(ECT_MEM_CUDA), "cuda");
    assert_string_equal(ect_mem_kind_name(ECT_MEM_PINNED), "pinned");
    assert_string_equal(ect_mem_kind_name(9), "?");
}

/* Host -> device -> pinned -> device -> host, every hop checked at the end. */
static void test_alloc_copy_kinds(void **state) {
    (void)state;
    const size_t n = 3 * MiB + 123;
    uint8_t *h = malloc(n), *back = calloc(1, n);
    void *d1, *d2, *pin;
    assert_non_null(h);
    test_fill_pattern(h, n, 42);
    assert_int_equal(ect_mem_alloc(ECT_MEM_CUDA, 0, n, &d1), 0);
    assert_int_equal(ect_mem_alloc(ECT_MEM_CUDA, 0, n, &d2), 0);
    assert_int_equal(ect_mem_alloc(ECT_MEM_PINNED, 0, n, &pin), 0);
    int k, d = -1;
    ect_mem_kind_of(d1, &k, &d);
    assert_int_equal(k, ECT_MEM_CUDA);
    assert_int_equal(d, 0);
    ect_mem_kind_of((uint8_t *)d1 + n - 1, &k, NULL);
    assert_int_equal(k, ECT_MEM_CUDA);
    ect_mem_kind_of(pin, &k, NULL);
    assert_int_equal(k, ECT_MEM_PINNED);
    ect_mem_kind_of(h, &k, NULL);
    assert_int_equal(k, ECT_MEM_HOST);
    assert_true(mem_is_device(d2, NULL));
    assert_false(mem_is_device(h, NULL));
    assert_int_equal(ect_mem_copy(d1, h, n), 0);
    assert_int_equal(ect_mem_copy(pin, d1, n), 0);
    memset(h, 0, n);
    assert_int_equal(ect_mem_copy(d2, pin, n), 0);
    assert_int_equal(ect_mem_copy(back, d2, n), 0);
    assert_true(test_check_pattern(back, n, 42));
    assert_true(test_check_pattern(pin, n, 42));
    /* device to device, at an offset */
    assert_int_equal(ect_mem_copy((uint8_t *)d1 + 5, (uint8_t *)d2 + 7, 1000), 0);
    memset(back, 0, n);
    assert_int_equal(ect_mem_copy(back, d1, 2000), 0);
    uint8_t ref[2000];
    test_fill_pattern(ref, sizeof ref, 42);
    assert_memory_equal(back, ref, 5);
    assert_memory_equal(back + 5, ref + 7, 1000);
    /* bad calls */
    void *x = (void *)1;
    assert_err(ect_mem_alloc(ECT_MEM_CUDA, 0, 0, &x), ECT_EINVAL, "nbytes");
    assert_null(x);
    assert_err(ect_mem_alloc(ECT_MEM_CUDA, 4, 10, &x), ECT_EINVAL, "device 4 does not exist");
    assert_err(ect_mem_alloc(7, 0, 10, &x), ECT_EINVAL, "kind");
    assert_err(ect_mem_copy(NULL, h, 1), ECT_EINVAL, "NULL");
    assert_int_equal(ect_mem_copy(NULL, NULL, 0), 0);
    ect_mem_free(ECT_MEM_CUDA, d1);
    ect_mem_free(ECT_MEM_CUDA, d2);
    ect_mem_free(ECT_MEM_PINNED, pin);
    ect_mem_free(ECT_MEM_CUDA, NULL);
    free(h);
    free(back);
}

static void test_pool_cuda(void **state) {
    (void)state;
    ect_pool_opts o;
    ect_pool_opts_init(&o);
    assert_int_equal(o.mem_kind, ECT_MEM_HOST);
    assert_null(o.external);
    o.capacity = 8 * MiB;
    o.mem_kind = ECT_MEM_CUDA;
    ect_pool *p = NULL;
    assert_int_equal(ect_pool_open(&o, &p), 0);
    assert_int_equal(ect_pool_mem_kind(p), ECT_MEM_CUDA);
    assert_int_equal(ect_pool_device(p), 0);
    assert_int_equal(ect_pool_fd(p), -1);
    int k;
    ect_mem_kind_of(ect_pool_base(p), &k, NULL);
    assert_int_equal(k, ECT_MEM_CUDA);
    ect_pool_stat st;
    ect_pool_stats(p, &st);
    assert_int_equal(st.mem_kind, ECT_MEM_CUDA);
    assert_int_equal(st.capacity, 8 * MiB);
    uint64_t off;
    assert_int_equal(ect_pool_alloc(p, 4096, &off), 0);
    uint8_t buf[4096], back[4096];
    test_fill_pattern(buf, sizeof buf, 7);
    assert_int_equal(ect_mem_copy((uint8_t *)ect_pool_base(p) + off, buf, sizeof buf), 0);
    uint64_t shape[1] = {2048};
    assert_int_equal(ect_pool_put(p, "h1", off, 4096, shape, 1, "bfloat16", 0), 0);
    ect_resident_info ri;
    assert_int_equal(ect_pool_acquire(p, "h1", &ri), 0);
    assert_int_equal(ect_mem_copy(back, (uint8_t *)ect_pool_base(p) + ri.offset, 4096), 0);
    assert_memory_equal(back, buf, 4096);
    assert_int_equal(ect_pool_release(p, "h1"), 0);
    ect_pool_close(p);

    o.use_memfd = 1;
    assert_err(ect_pool_open(&o, &p), ECT_EINVAL, "use_memfd");
    assert_null(p);
    o.use_memfd = 0;
    o.device = 3;
    assert_err(ect_pool_open(&o, &p), ECT_EINVAL, "device 3 does not exist");
    o.device = 0;
    o.mem_kind = 9;
    assert_err(ect_pool_open(&o, &p), ECT_EINVAL, "mem_kind");
}

static void test_pool_pinned(void **state) {
    (void)state;
    ect_pool_opts o;
    ect_pool_opts_init(&o);
    o.capacity = 4 * MiB;
    o.mem_kind = ECT_MEM_PINNED;
    o.use_memfd = 1;
    ect_pool *p = NULL;
    assert_int_equal(ect_pool_open(&o, &p), 0);
    assert_true(ect_pool_fd(p) >= 0);
    int k;
    ect_mem_kind_of((uint8_t *)ect_pool_base(p) + 100, &k, NULL);
    assert_int_equal(k, ECT_MEM_PINNED);
    memset(ect_pool_base(p), 0xab, 4096); /* host memory: the host may touch it */
    ect_pool_close(p);
}

/* A pool over caller memory: carved, never freed by the pool. */
static void test_pool_external(void **state) {
    (void)state;
    void *dev;
    assert_int_equal(ect_mem_alloc(ECT_MEM_CUDA, 0, 4 * MiB, &dev), 0);
    ect_pool_opts o;
    ect_pool_opts_init(&o);
    o.capacity = 4 * MiB;
    o.mem_kind = ECT_MEM_CUDA;
    o.external = dev;
    ect_pool *p = NULL;
    assert_int_equal(ect_pool_open(&o, &p), 0);
    assert_ptr_equal(ect_pool_base(p), dev);
    assert_int_equal(ect_pool_capacity(p), 4 * MiB);
    ect_pool_close(p);
    uint8_t b[64] = {1, 2, 3};
    assert_int_equal(ect_mem_copy(dev, b, sizeof b), 0); /* still allocated */
    /* the kind must match what the memory is */
    o.mem_kind = ECT_MEM_HOST;
    assert_err(ect_pool_open(&o, &p), ECT_EINVAL, "CUDA device memory");
    uint8_t *host = aligned_alloc(4096, 4 * MiB);
    o.external = host;
    o.mem_kind = ECT_MEM_CUDA;
    assert_err(ect_pool_open(&o, &p), ECT_EINVAL, "is host memory");
    o.mem_kind = ECT_MEM_PINNED; /* the pool registers it, and undoes that at close */
    assert_int_equal(ect_pool_open(&o, &p), 0);
    int k;
    ect_mem_kind_of(host, &k, NULL);
    assert_int_equal(k, ECT_MEM_PINNED);
    ect_pool_close(p);
    ect_mem_kind_of(host, &k, NULL);
    assert_int_equal(k, ECT_MEM_HOST);
    o.external = host + 8;
    assert_err(ect_pool_open(&o, &p), ECT_EINVAL, "aligned");
    o.external = host;
    o.use_memfd = 1;
    assert_err(ect_pool_open(&o, &p), ECT_EINVAL, "external");
    free(host);
    ect_mem_free(ECT_MEM_CUDA, dev);
}

static void test_register_kinds(void **state) {
    (void)state;
    ect_xport *x = NULL;
    assert_int_equal(ect_xport_open("tcp", NULL, &x), 0);
    void *dev;
    assert_int_equal(ect_mem_alloc(ECT_MEM_CUDA, 0, MiB, &dev), 0);
    uint8_t *host = malloc(MiB);
    char key[ECT_XPORT_KEY_MAX];
    assert_err(ect_xport_register_mem(x, dev, MiB, ECT_MEM_HOST, -1, 0, key), ECT_EINVAL,
               "register it as ECT_MEM_CUDA");
    assert_err(ect_xport_register(x, dev, MiB, -1, 0, key), ECT_EINVAL, "CUDA device memory");
    assert_err(ect_xport_register_mem(x, host, MiB, ECT_MEM_CUDA, -1, 0, key), ECT_EINVAL,
               "not CUDA device memory");
    assert_err(ect_xport_register_mem(x, host, MiB, ECT_MEM_PINNED, -1, 0, key), ECT_EINVAL,
               "not pinned");
    assert_err(ect_xport_register_mem(x, host, MiB, 5, -1, 0, key), ECT_EINVAL, "mem_kind");
    assert_err(ect_xport_register_mem(x, dev, MiB, ECT_MEM_CUDA, 3, 0, key), ECT_EINVAL, "no fd");
    assert_int_equal(ect_xport_register_mem(x, dev, MiB, ECT_MEM_AUTO, -1, 0, key), 0);
    assert_int_equal(ect_xport_unregister(x, key), 0);
    assert_int_equal(ect_xport_register_mem(x, host, MiB, ECT_MEM_AUTO, -1, 0, key), 0);
    assert_int_equal(ect_xport_unregister(x, key), 0);
    ect_xport_close(x);
#if ECT_HAVE_UCX
    assert_int_equal(ect_xport_open("ucx", NULL, &x), 0);
    assert_err(ect_xport_register_mem(x, dev, MiB, ECT_MEM_CUDA, -1, 0, key), ECT_ENOTSUP,
               "ucx transport cannot receive into CUDA");
    ect_xport_close(x);
#endif
    /* a shm region needs an fd, unless it is device memory */
    assert_int_equal(ect_xport_open("shm", NULL, &x), 0);
    assert_err(ect_xport_register_mem(x, host, MiB, ECT_MEM_HOST, -1, 0, key), ECT_ENOTSUP, "fd");
    assert_int_equal(ect_xport_register_mem(x, dev, MiB, ECT_MEM_CUDA, -1, 0, key), 0);
    ect_xport_close(x);
    free(host);
    ect_mem_free(ECT_MEM_CUDA, dev);
}

/* The bounce ring: more slices than slots, each landing where it was sent. */
static void test_bounce_ring(void **state) {
    (void)state;
    mem_bounce *b = NULL;
    assert_err(bounce_open(0, 4096, 1, &b), ECT_EINVAL, "slots");
    assert_int_equal(bounce_open(0, 4096, 3, &b), 0);
    assert_int_equal(bounce_device(b), 0);
    const size_t n = 10 * 4096 + 100;
    uint8_t *src = malloc(n), *back = calloc(1, n);
    test_fill_pattern(src, n, 9);
    void *dev;
    assert_int_equal(ect_mem_alloc(ECT_MEM_CUDA, 0, n, &dev), 0);
    for (size_t off = 0; off < n;) {
        uint8_t *slot;
        size_t cap;
        assert_int_equal(bounce_slot(b, &slot, &cap), 0);
        assert_int_equal(cap, 4096);
        size_t k = n - off < cap ? n - off : cap;
        memcpy(slot, src + off, k);
        assert_int_equal(bounce_submit(b, (uint8_t *)dev + off, k), 0);
        off += k;
    }
    assert_int_equal(bounce_drain(b), 0);
    assert_int_equal(ect_mem_copy(back, dev, n), 0);
    assert_memory_equal(back, src, n);
    /* a failing copy is reported by the drain, once */
    uint8_t *slot;
    size_t cap;
    assert_int_equal(bounce_slot(b, &slot, &cap), 0);
    assert_int_not_equal(bounce_submit(b, dev, FAIL_BYTES), 0);
    assert_err(bounce_drain(b), ECT_EIO, "CUDA_ERROR_LAUNCH_FAILED");
    assert_int_equal(bounce_drain(b), 0);
    bounce_close(b);
    bounce_close(NULL);
    ect_mem_free(ECT_MEM_CUDA, dev);
    free(src);
    free(back);
}

/* A tcp write whose device copy fails is answered ECT_EIO; the connection
 * and the next write are fine. */
static void test_tcp_device_copy_fails(void **state) {
    (void)state;
    ect_xport *t = NULL, *i = NULL;
    assert_int_equal(ect_xport_open("tcp", NULL, &t), 0);
    assert_int_equal(ect_xport_open("tcp", NULL, &i), 0);
    void *dev;
    assert_int_equal(ect_mem_alloc(ECT_MEM_CUDA, 0, MiB, &dev), 0);
    char key[ECT_XPORT_KEY_MAX];
    assert_int_equal(ect_xport_register_mem(t, dev, MiB, ECT_MEM_CUDA, -1, 0, key), 0);
    uint8_t src[2000];
    test_fill_pattern(src, sizeof src, 3);
    ect_write w[2] = {
        {.src = src, .dst_addr = (uint64_t)(uintptr_t)dev, .len = FAIL_BYTES, .dst_key = key},
        {.src = src, .dst_addr = (uint64_t)(uintptr_t)dev + 4096, .len = 2000, .dst_key = key}};
    int st[2];
    assert_err(ect_xport_write_batch(i, ect_xport_session(t), w, 2, st), ECT_EIO, "writes[0]");
    assert_int_equal(st[0], ECT_EIO);
    assert_int_equal(st[1], 0);
    uint8_t back[2000];
    assert_int_equal(ect_mem_copy(back, (uint8_t *)dev + 4096, 2000), 0);
    assert_memory_equal(back, src, 2000);
    assert_int_equal(ect_xport_write_batch(i, ect_xport_session(t), &w[1], 1, NULL), 0);
    ect_xport_close(i);
    ect_xport_close(t);
    ect_mem_free(ECT_MEM_CUDA, dev);
}

int main(void) {
    setenv("FAKECUDA_FAIL_COPY_BYTES", "777", 1);
    if (!getenv("ECT_CUDA_LIBRARY")) {
        fprintf(stderr, "test_cuda_mem: ECT_CUDA_LIBRARY must name the stand-in driver\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_info),
        cmocka_unit_test(test_parse_device),
        cmocka_unit_test(test_alloc_copy_kinds),
        cmocka_unit_test(test_pool_cuda),
        cmocka_unit_test(test_pool_pinned),
        cmocka_unit_test(test_pool_external),
        cmocka_unit_test(test_register_kinds),
        cmocka_unit_test(test_bounce_ring),
        cmocka_unit_test(test_tcp_device_copy_fails),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
