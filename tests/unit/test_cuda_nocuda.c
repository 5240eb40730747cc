/*
 * test_cuda_nocuda — a process without a CUDA driver (ECT_CUDA_LIBRARY
 * names a file that does not exist, as on every CI machine): every GPU
 * request fails with ECT_ENOTSUP saying why, the info says why, pointers
 * are host memory, and host paths work as before. Also the driver that
 * loads but finds no device (the stand-in with FAKECUDA_DEVICES=0, in a
 * child process since the driver is loaded once per process), and a driver
 * an engine loaded itself being picked up for the pointers it hands over.
 */
#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

#define MiB (1024u * 1024u)

static void test_info_says_why(void **state) {
    (void)state;
    ect_cuda_info ci;
    assert_err(ect_cuda_get_info(&ci), ECT_ENOTSUP, "CUDA is unavailable");
    assert_int_equal(ci.available, 0);
    assert_int_equal(ci.devices, 0);
    assert_non_null(strstr(ci.why, "cannot load the CUDA driver"));
    assert_non_null(strstr(ci.why, "no-such-libcuda.so.1"));
    assert_string_equal(ci.library, getenv("ECT_CUDA_LIBRARY"));
}

static void test_gpu_requests_fail_clearly(void **state) {
    (void)state;
    void *p = (void *)1;
    assert_err(ect_mem_alloc(ECT_MEM_CUDA, 0, 4096, &p), ECT_ENOTSUP, "CUDA is unavailable");
    assert_null(p);
    assert_err(ect_mem_alloc(ECT_MEM_PINNED, 0, 4096, &p), ECT_ENOTSUP, "cannot load");
    ect_pool_opts o;
    ect_pool_opts_init(&o);
    o.capacity = MiB;
    o.mem_kind = ECT_MEM_CUDA;
    ect_pool *pool = NULL;
    assert_err(ect_pool_open(&o, &pool), ECT_ENOTSUP, "cuda pool: CUDA is unavailable");
    o.mem_kind = ECT_MEM_PINNED;
    assert_err(ect_pool_open(&o, &pool), ECT_ENOTSUP, "pinned pool: CUDA is unavailable");
    assert_null(pool);

    ect_xport *x = NULL;
    assert_int_equal(ect_xport_open("tcp", NULL, &x), 0);
    uint8_t *host = malloc(MiB);
    char key[ECT_XPORT_KEY_MAX];
    assert_err(ect_xport_register_mem(x, host, MiB, ECT_MEM_CUDA, -1, 0, key), ECT_ENOTSUP,
               "needs the CUDA driver");
    assert_err(ect_xport_register_mem(x, host, MiB, ECT_MEM_PINNED, -1, 0, key), ECT_ENOTSUP,
               "needs the CUDA driver");
    /* host memory registers as before, with either call */
    assert_int_equal(ect_xport_register_mem(x, host, MiB, ECT_MEM_AUTO, -1, 0, key), 0);
    assert_int_equal(ect_xport_unregister(x, key), 0);
    assert_int_equal(ect_xport_register(x, host, MiB, -1, 0, key), 0);
    ect_xport_close(x);

    ect_push_consumer_opts co;
    ect_push_consumer_opts_init(&co);
    co.ec_port = 0;
    co.pool_size = MiB;
    co.pool_device = "cuda";
    ect_push_consumer *c = NULL;
    assert_err(ect_push_consumer_open(&co, &c), ECT_ENOTSUP, "CUDA is unavailable");
    assert_null(c);
    co.pool_device = "tpu";
    assert_err(ect_push_consumer_open(&co, &c), ECT_EINVAL, "pool_device");
    co.pool_device = NULL;
    assert_int_equal(ect_push_consumer_open(&co, &c), 0);
    assert_int_equal(ect_pool_mem_kind(ect_push_consumer_pool(c)), ECT_MEM_HOST);
    ect_push_consumer_close(c);

    ect_pull_consumer_opts lo;
    ect_pull_consumer_opts_init(&lo);
    lo.producer = "127.0.0.1:1";
    lo.pool_size = MiB;
    lo.pool_device = "cuda:0";
    ect_pull_consumer *lc = NULL;
    assert_err(ect_pull_consumer_open(&lo, &lc), ECT_ENOTSUP, "CUDA is unavailable");
    assert_null(lc);
    free(host);
}

static void test_host_paths_unchanged(void **state) {
    (void)state;
    uint8_t a[100], b[100];
    test_fill_pattern(a, sizeof a, 1);
    assert_int_equal(ect_mem_copy(b, a, sizeof a), 0);
    assert_memory_equal(a, b, sizeof a);
    int k = -1, d = -1;
    ect_mem_kind_of(a, &k, &d);
    assert_int_equal(k, ECT_MEM_HOST);
    assert_int_equal(d, 0);
    void *p = NULL;
    assert_int_equal(ect_mem_alloc(ECT_MEM_HOST, 0, 64, &p), 0);
    ect_mem_free(ECT_MEM_HOST, p);
}

/* A driver that loads but has no device: the reason says so. */
static void test_no_device(void **state) {
    (void)state;
    const char *fake = getenv("ECT_FAKECUDA");
    if (!fake) fail_msg("ECT_FAKECUDA must name the stand-in driver");
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setenv("ECT_CUDA_LIBRARY", fake, 1);
        setenv("FAKECUDA_DEVICES", "0", 1);
        ect_cuda_info ci;
        int rc = ect_cuda_get_info(&ci);
        _exit(rc == ECT_ENOTSUP && strstr(ci.why, "no CUDA device") ? 0 : 1);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

/* An engine (torch) loaded the driver itself and hands over a device
 * pointer: the library, which loads no driver on its own when it only asks
 * what a pointer is, finds the mapped driver and treats the pointer as
 * device memory. Runs in a child (the driver is loaded once per process). */
typedef int (*fn_init)(unsigned);
typedef int (*fn_retain)(void **, int);
typedef int (*fn_set)(void *);
typedef int (*fn_alloc)(unsigned long long *, size_t);

static int engine_child(const char *fake, bool by_soname) {
    char link[256] = "";
    if (by_soname) { /* the engine loads "libcuda.so.1" and ECT_CUDA_LIBRARY is unset */
        char dir[] = "/tmp/ect-engine-XXXXXX";
        if (!mkdtemp(dir)) return 10;
        snprintf(link, sizeof link, "%s/libcuda.so.1", dir);
        if (symlink(fake, link) != 0) return 11;
        unsetenv("ECT_CUDA_LIBRARY");
        fake = link;
    } else {
        setenv("ECT_CUDA_LIBRARY", fake, 1);
    }
    uint8_t host[64];
    int k = -1;
    ect_mem_kind_of(host, &k, NULL);
    if (k != ECT_MEM_HOST || dlopen(fake, RTLD_NOW | RTLD_NOLOAD)) return 1; /* nothing loaded */
    void *h = dlopen(fake, RTLD_NOW | RTLD_LOCAL); /* what the engine does */
    if (link[0]) {
        unlink(link);
        *strrchr(link, '/') = '\0';
        rmdir(link);
    }
    if (!h) return 2;
    fn_init init = (fn_init)dlsym(h, "cuInit");
    fn_retain retain = (fn_retain)dlsym(h, "cuDevicePrimaryCtxRetain");
    fn_set set = (fn_set)dlsym(h, "cuCtxSetCurrent");
    fn_alloc alloc = (fn_alloc)dlsym(h, "cuMemAlloc_v2");
    void *ctx = NULL;
    unsigned long long d = 0;
    if (!init || !retain || !set || !alloc || init(0) || retain(&ctx, 0) || set(ctx) ||
        alloc(&d, 4096))
        return 3;
    int dev = -1;
    ect_mem_kind_of((void *)(uintptr_t)d, &k, &dev);
    if (k != ECT_MEM_CUDA || dev != 0) return 4;
    uint8_t back[64];
    test_fill_pattern(host, sizeof host, 4);
    if (ect_mem_copy((void *)(uintptr_t)d, host, sizeof host) ||
        ect_mem_copy(back, (void *)(uintptr_t)d, sizeof back) || memcmp(host, back, sizeof host))
        return 5;
    return 0;
}

static void test_engine_loaded_driver(void **state) {
    (void)state;
    const char *fake = getenv("ECT_FAKECUDA");
    if (!fake) fail_msg("ECT_FAKECUDA must name the stand-in driver");
    for (int by_soname = 0; by_soname < 2; by_soname++) {
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) _exit(engine_child(fake, by_soname));
        int st = 0;
        assert_int_equal(waitpid(pid, &st, 0), pid);
        assert_true(WIFEXITED(st));
        if (WEXITSTATUS(st) != 0)
            fail_msg("engine child (by soname %d): step %d", by_soname, WEXITSTATUS(st));
    }
}

int main(void) {
    const char *lib = getenv("ECT_CUDA_LIBRARY");
    if (!lib || !strstr(lib, "no-such-libcuda.so.1")) {
        fprintf(stderr, "test_cuda_nocuda: ECT_CUDA_LIBRARY must name a missing library\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_device), /* first: they fork before anything is loaded */
        cmocka_unit_test(test_engine_loaded_driver),
        cmocka_unit_test(test_info_says_why),
        cmocka_unit_test(test_gpu_requests_fail_clearly),
        cmocka_unit_test(test_host_paths_unchanged),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
