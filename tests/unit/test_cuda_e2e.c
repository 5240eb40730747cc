/*
 * test_cuda_e2e — end to end with device pools and device items, checked
 * bit for bit (every byte copied back to the host and compared). One
 * program, two registrations:
 *   test_cuda_e2e  the stand-in driver (tests/fakecuda; host memory, NOT a
 *                  GPU), on every run of the suite;
 *   gpu_e2e        the real driver (label `gpu`, `make test-gpu`); exits
 *                  77 (skipped) without one, or fails when ECT_REQUIRE_GPU=1.
 *
 * Covered: tcp into a device region (bounce ring; slice boundaries,
 * striping, refusals) from host and device sources and from a device
 * source into host memory; shm into a device region through CUDA IPC from
 * another process (host-to-device, device-to-device, device-to-host memfd,
 * fast path, refusal after unregister) and within one process; push with a
 * GPU consumer pool over tcp (same process) and shm/IPC (the consumer in
 * another process), device items borrowed and copied; pull into a GPU pool
 * from a producer that saved device items.
 *
 * The other process is forked first thing in main, before this process
 * touches CUDA (a forked child may not use a CUDA context of its parent's);
 * it serves a few commands over a pipe (verify a range, verify a pushed
 * item, unregister) so its device memory is checked where it lives.
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

#include "util/util.h"

#define MiB (1024u * 1024u)
#define KiB 1024u

/* ------------------------------------------------------------ helpers */

static void *dev_alloc(size_t n) {
    void *p = NULL;
    int rc = ect_mem_alloc(ECT_MEM_CUDA, 0, n, &p);
    if (rc) fail_msg("device alloc of %zu: %s", n, ect_last_error());
    return p;
}

/* A device buffer of n bytes holding the test pattern of seed. */
static void *dev_pattern(size_t n, uint64_t seed) {
    void *d = dev_alloc(n);
    uint8_t *h = malloc(n);
    assert_non_null(h);
    test_fill_pattern(h, n, seed);
    assert_int_equal(ect_mem_copy(d, h, n), 0);
    free(h);
    return d;
}

/* True if the n bytes at p (any kind) are the pattern of seed. */
static int mem_has_pattern(const void *p, size_t n, uint64_t seed) {
    uint8_t *h = malloc(n ? n : 1);
    if (!h || ect_mem_copy(h, p, n) != 0) {
        free(h);
        return 0;
    }
    int ok = test_check_pattern(h, n, seed);
    free(h);
    return ok;
}

/* --------------------------------------------- the other process (child) */

enum { C_VERIFY = 1, C_VERIFY_PUSH, C_UNREGISTER, C_QUIT };

typedef struct cmd {
    int op;
    int which; /* C_VERIFY: 0 the device region, 1 the host memfd region */
    uint64_t off, len, seed;
    char tid[64];
} cmd;

typedef struct hello {
    char session[300];
    char dkey[ECT_XPORT_KEY_MAX];
    uint64_t daddr, dlen;
    char hkey[ECT_XPORT_KEY_MAX];
    uint64_t haddr, hlen;
    int consumer_port;
    int ok;
    char why[256];
} hello;

typedef struct reply {
    int rc;
    char why[256];
} reply;

static pid_t child_pid = -1;
static int to_child = -1, from_child = -1;
static hello child;

static int read_full(int fd, void *b, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t k = read(fd, (char *)b + got, n - got);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        got += (size_t)k;
    }
    return 0;
}

static int write_full(int fd, const void *b, size_t n) {
    size_t put = 0;
    while (put < n) {
        ssize_t k = write(fd, (const char *)b + put, n - put);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        put += (size_t)k;
    }
    return 0;
}

#define CHILD_DEV (16 * MiB)
#define CHILD_HOST (4 * MiB)

static void child_main(int in, int out) {
    hello h;
    memset(&h, 0, sizeof h);
    ect_xport *x = NULL;
    ect_push_consumer *c = NULL;
    void *dev = NULL;
    uint8_t *host = MAP_FAILED;
    int hfd = memfd_create("test_cuda_e2e", MFD_CLOEXEC);
    int rc = ect_xport_open("shm", NULL, &x);
    if (!rc) rc = ect_mem_alloc(ECT_MEM_CUDA, 0, CHILD_DEV, &dev);
    if (!rc) rc = ect_xport_register_mem(x, dev, CHILD_DEV, ECT_MEM_CUDA, -1, 0, h.dkey);
    if (!rc &&
        (hfd < 0 || ftruncate(hfd, CHILD_HOST) != 0 ||
         (host = mmap(NULL, CHILD_HOST, PROT_READ | PROT_WRITE, MAP_SHARED, hfd, 0)) == MAP_FAILED))
        rc = ect_set_error(ECT_EIO, "child: memfd");
    if (!rc) rc = ect_xport_register(x, host, CHILD_HOST, hfd, 0, h.hkey);
    if (!rc) {
        ect_push_consumer_opts o;
        ect_push_consumer_opts_init(&o);
        o.ec_port = 0;
        o.pool_size = 32 * MiB;
        o.transport = "shm";
        o.pool_device = "cuda";
        rc = ect_push_consumer_open(&o, &c);
    }
    h.ok = rc == 0;
    snprintf(h.why, sizeof h.why, "%s", rc ? ect_last_error() : "");
    if (!rc) {
        snprintf(h.session, sizeof h.session, "%s", ect_xport_session(x));
        h.daddr = (uint64_t)(uintptr_t)dev;
        h.dlen = CHILD_DEV;
        h.haddr = (uint64_t)(uintptr_t)host;
        h.hlen = CHILD_HOST;
        h.consumer_port = ect_push_consumer_port(c);
    }
    if (write_full(out, &h, sizeof h) != 0 || !h.ok) _exit(1);
    cmd m;
    while (read_full(in, &m, sizeof m) == 0 && m.op != C_QUIT) {
        reply r = {0};
        if (m.op == C_VERIFY) {
            const uint8_t *base = m.which ? host : dev;
            uint64_t lim = m.which ? CHILD_HOST : CHILD_DEV;
            if (m.off + m.len > lim || !mem_has_pattern(base + m.off, m.len, m.seed)) {
                r.rc = ECT_EPROTO;
                snprintf(r.why, sizeof r.why, "bytes [%" PRIu64 ", +%" PRIu64 ") differ", m.off,
                         m.len);
            }
        } else if (m.op == C_VERIFY_PUSH) {
            ect_push_view v;
            r.rc = ect_push_consumer_take(c, m.tid, &v);
            if (r.rc) {
                snprintf(r.why, sizeof r.why, "take %s: %s", m.tid, ect_last_error());
            } else {
                if (v.nbytes != m.len || v.mem_kind != ECT_MEM_CUDA ||
                    !mem_has_pattern(v.data, v.nbytes, m.seed)) {
                    r.rc = ECT_EPROTO;
                    snprintf(r.why, sizeof r.why, "%s: %" PRIu64 " bytes of kind %d differ", m.tid,
                             v.nbytes, v.mem_kind);
                }
                ect_push_consumer_release(c, &v);
            }
        } else if (m.op == C_UNREGISTER) {
            r.rc = ect_xport_unregister(x, h.dkey);
            if (r.rc) snprintf(r.why, sizeof r.why, "%s", ect_last_error());
        }
        if (write_full(out, &r, sizeof r) != 0) break;
    }
    ect_push_consumer_close(c);
    ect_xport_close(x);
    ect_mem_free(ECT_MEM_CUDA, dev);
    _exit(0);
}

static void child_start(void) {
    int a[2], b[2];
    if (pipe(a) != 0 || pipe(b) != 0) abort();
    fflush(NULL);
    child_pid = fork();
    if (child_pid < 0) abort();
    if (child_pid == 0) {
        close(a[1]);
        close(b[0]);
        child_main(a[0], b[1]);
    }
    close(a[0]);
    close(b[1]);
    to_child = a[1];
    from_child = b[0];
}

static void child_stop(void) {
    if (child_pid <= 0) return;
    cmd m = {.op = C_QUIT};
    write_full(to_child, &m, sizeof m);
    close(to_child);
    close(from_child);
    int st;
    waitpid(child_pid, &st, 0);
    child_pid = -1;
}

static void child_ask(const cmd *m) {
    reply r;
    if (write_full(to_child, m, sizeof *m) != 0 || read_full(from_child, &r, sizeof r) != 0)
        fail_msg("the target process died");
    if (r.rc) fail_msg("target process: %s", r.why);
}

static void child_verify(int which, uint64_t off, uint64_t len, uint64_t seed) {
    cmd m = {.op = C_VERIFY, .which = which, .off = off, .len = len, .seed = seed};
    child_ask(&m);
}

/* ------------------------------------------------------------ tcp */

typedef struct tcp_pair {
    ect_xport *t, *i;
    ect_pool *pool; /* device pool registered on t */
    char key[ECT_XPORT_KEY_MAX];
    uint8_t *base;
} tcp_pair;

static void tcp_pair_open(tcp_pair *tp, uint64_t pool_bytes) {
    memset(tp, 0, sizeof *tp);
    ect_xport_opts xo;
    ect_xport_opts_init(&xo);
    xo.conns_per_peer = 2;
    xo.stripe_min = 1 * MiB; /* a 9 MiB write is striped over both connections */
    assert_int_equal(ect_xport_open("tcp", &xo, &tp->t), 0);
    assert_int_equal(ect_xport_open("tcp", &xo, &tp->i), 0);
    ect_pool_opts po;
    ect_pool_opts_init(&po);
    po.capacity = pool_bytes;
    po.mem_kind = ECT_MEM_CUDA;
    int rc = ect_pool_open(&po, &tp->pool);
    if (rc) fail_msg("device pool: %s", ect_last_error());
    tp->base = ect_pool_base(tp->pool);
    assert_int_equal(ect_xport_register_mem(tp->t, tp->base, ect_pool_capacity(tp->pool),
                                            ECT_MEM_CUDA, -1, 0, tp->key),
                     0);
}

static void tcp_pair_close(tcp_pair *tp) {
    ect_xport_close(tp->i);
    ect_xport_close(tp->t);
    ect_pool_close(tp->pool);
}

/* Host sources of awkward sizes around the bounce slot (2 MiB), one batch,
 * every write checked where it landed. */
static void test_tcp_host_to_device(void **state) {
    (void)state;
    tcp_pair tp;
    tcp_pair_open(&tp, 64 * MiB);
    const size_t sizes[] = {1, 4095, 2 * MiB, 2 * MiB + 1, 4608 * KiB, 9 * MiB + 7};
    enum { N = sizeof sizes / sizeof sizes[0] };
    uint8_t *src[N];
    ect_write w[N];
    uint64_t off = 100;
    for (int i = 0; i < N; i++) {
        src[i] = malloc(sizes[i]);
        test_fill_pattern(src[i], sizes[i], 1000 + (uint64_t)i);
        w[i] = (ect_write){.src = src[i],
                           .dst_addr = (uint64_t)(uintptr_t)(tp.base + off),
                           .len = sizes[i],
                           .dst_key = tp.key};
        off += sizes[i] + 4096 + 3;
    }
    int st[N];
    int rc = ect_xport_write_batch(tp.i, ect_xport_session(tp.t), w, N, st);
    if (rc) fail_msg("batch: %s", ect_last_error());
    for (int i = 0; i < N; i++) {
        assert_int_equal(st[i], 0);
        assert_true(
            mem_has_pattern((void *)(uintptr_t)w[i].dst_addr, sizes[i], 1000 + (uint64_t)i));
        free(src[i]);
    }
    /* refusals: wrong key, beyond the region; the connection survives */
    uint8_t b[64] = {0};
    ect_write bad = {.src = b,
                     .dst_addr = (uint64_t)(uintptr_t)(tp.base + ect_pool_capacity(tp.pool) - 10),
                     .len = 64,
                     .dst_key = tp.key};
    assert_err(ect_xport_write_batch(tp.i, ect_xport_session(tp.t), &bad, 1, NULL), ECT_ERANGE,
               NULL);
    ect_write ok = {
        .src = b, .dst_addr = (uint64_t)(uintptr_t)tp.base, .len = 64, .dst_key = tp.key};
    assert_int_equal(ect_xport_write_batch(tp.i, ect_xport_session(tp.t), &ok, 1, NULL), 0);
    tcp_pair_close(&tp);
}

/* A device source crosses tcp (staged once to pinned host memory) into a
 * device region and into a host region. */
static void test_tcp_device_sources(void **state) {
    (void)state;
    tcp_pair tp;
    tcp_pair_open(&tp, 32 * MiB);
    const size_t n = 4608 * KiB;
    void *d = dev_pattern(n, 77);
    ect_write w = {
        .src = d, .dst_addr = (uint64_t)(uintptr_t)(tp.base + 8192), .len = n, .dst_key = tp.key};
    int rc = ect_xport_write_batch(tp.i, ect_xport_session(tp.t), &w, 1, NULL);
    if (rc) fail_msg("device -> device over tcp: %s", ect_last_error());
    assert_true(mem_has_pattern(tp.base + 8192, n, 77));
    /* into host memory */
    uint8_t *host = calloc(1, n);
    char hkey[ECT_XPORT_KEY_MAX];
    assert_int_equal(ect_xport_register(tp.t, host, n, -1, 0, hkey), 0);
    w = (ect_write){.src = (uint8_t *)d + 1,
                    .dst_addr = (uint64_t)(uintptr_t)host,
                    .len = n - 1,
                    .dst_key = hkey};
    assert_int_equal(ect_xport_write_batch(tp.i, ect_xport_session(tp.t), &w, 1, NULL), 0);
    uint8_t *ref = malloc(n);
    test_fill_pattern(ref, n, 77);
    assert_memory_equal(host, ref + 1, n - 1);
    assert_int_equal(ect_xport_unregister(tp.t, hkey), 0);
    free(ref);
    free(host);
    ect_mem_free(ECT_MEM_CUDA, d);
    tcp_pair_close(&tp);
}

/* ------------------------------------------------------------ shm / IPC */

/* The child's device region through CUDA IPC: host-to-device,
 * device-to-device, the fast path, device-to-host memfd, refusals. */
static void test_shm_ipc_cross_process(void **state) {
    (void)state;
    ect_xport *i = NULL;
    assert_int_equal(ect_xport_open("shm", NULL, &i), 0);
    const size_t n = 4608 * KiB;
    uint8_t *h = malloc(n);
    test_fill_pattern(h, n, 5);
    void *d = dev_pattern(n, 6);
    ect_write w[2] = {
        {.src = h, .dst_addr = child.daddr + 256, .len = n, .dst_key = child.dkey},
        {.src = d, .dst_addr = child.daddr + 256 + n, .len = n, .dst_key = child.dkey}};
    int st[2];
    int rc = ect_xport_write_batch(i, child.session, w, 2, st);
    if (rc) fail_msg("shm into the child's device region: %s", ect_last_error());
    child_verify(0, 256, n, 5);
    child_verify(0, 256 + n, n, 6);
    /* again: the region is mapped now, so this takes the fast path */
    void *d2 = dev_pattern(MiB, 9);
    ect_write f = {.src = d2, .dst_addr = child.daddr + 3, .len = MiB, .dst_key = child.dkey};
    assert_int_equal(ect_xport_write_batch(i, child.session, &f, 1, NULL), 0);
    child_verify(0, 3, MiB, 9);
    /* device source into the child's host (memfd) region: one copy */
    ect_write hw = {.src = d, .dst_addr = child.haddr + 10, .len = MiB, .dst_key = child.hkey};
    assert_int_equal(ect_xport_write_batch(i, child.session, &hw, 1, NULL), 0);
    child_verify(1, 10, MiB, 6);
    /* bounded by the region */
    ect_write over = {
        .src = d, .dst_addr = child.daddr + CHILD_DEV - 100, .len = 4096, .dst_key = child.dkey};
    assert_err(ect_xport_write_batch(i, child.session, &over, 1, NULL), ECT_ERANGE, NULL);
    /* after the target unregisters it, the region refuses writes */
    cmd m = {.op = C_UNREGISTER};
    child_ask(&m);
    assert_err(ect_xport_write_batch(i, child.session, &f, 1, NULL), ECT_ENOTFOUND, NULL);
    /* and the host region still works */
    assert_int_equal(ect_xport_write_batch(i, child.session, &hw, 1, NULL), 0);
    ect_xport_close(i);
    ect_mem_free(ECT_MEM_CUDA, d);
    ect_mem_free(ECT_MEM_CUDA, d2);
    free(h);
}

/* Target and initiator in one process: the region's device address is used
 * as is (the driver does not open a handle in its own process). */
static void test_shm_same_process(void **state) {
    (void)state;
    ect_xport *t = NULL, *i = NULL;
    assert_int_equal(ect_xport_open("shm", NULL, &t), 0);
    assert_int_equal(ect_xport_open("shm", NULL, &i), 0);
    void *region = dev_alloc(8 * MiB);
    char key[ECT_XPORT_KEY_MAX];
    assert_int_equal(ect_xport_register_mem(t, region, 8 * MiB, ECT_MEM_CUDA, -1, 0, key), 0);
    void *d = dev_pattern(3 * MiB, 31);
    uint8_t *h = malloc(MiB);
    test_fill_pattern(h, MiB, 32);
    ect_write w[2] = {
        {.src = d, .dst_addr = (uint64_t)(uintptr_t)region, .len = 3 * MiB, .dst_key = key},
        {.src = h, .dst_addr = (uint64_t)(uintptr_t)region + 4 * MiB, .len = MiB, .dst_key = key}};
    assert_int_equal(ect_xport_write_batch(i, ect_xport_session(t), w, 2, NULL), 0);
    assert_true(mem_has_pattern(region, 3 * MiB, 31));
    assert_true(mem_has_pattern((uint8_t *)region + 4 * MiB, MiB, 32));
    ect_xport_close(i);
    ect_xport_close(t);
    ect_mem_free(ECT_MEM_CUDA, region);
    ect_mem_free(ECT_MEM_CUDA, d);
    free(h);
}

/* ------------------------------------------------------------ push */

static ect_push_producer *producer_open(void) {
    ect_push_producer_opts o;
    ect_push_producer_opts_init(&o);
    o.staging_size = 64 * MiB;
    o.control_timeout_ms = 20000;
    ect_push_producer *p = NULL;
    int rc = ect_push_producer_open(&o, &p);
    if (rc) fail_msg("producer: %s", ect_last_error());
    return p;
}

static void nop_release(void *user, const void *data, uint64_t nbytes) {
    (void)data;
    (void)nbytes;
    (*(int *)user)++;
}

typedef struct pitem {
    char tid[64], hash[64];
    uint64_t n, seed, shape[1];
    void *data;
    bool device, borrowed;
} pitem;

/* Pushes items to the consumer at `addr` in one step and waits for all. */
static void push_all(ect_push_producer *p, const char *addr, pitem *it, int k, int *released) {
    for (int j = 0; j < k; j++) {
        ect_push_item x = {.transfer_id = it[j].tid,
                           .consumer = addr,
                           .mm_hash = it[j].hash,
                           .shape = it[j].shape,
                           .ndim = 1,
                           .dtype = "uint8",
                           .nbytes = it[j].n,
                           .data = it[j].data,
                           .release = it[j].borrowed ? nop_release : NULL,
                           .release_user = released};
        int rc = ect_push_producer_reserve(p, &x);
        if (rc) fail_msg("reserve %s: %s", it[j].tid, ect_last_error());
    }
    assert_int_equal(ect_push_producer_flush(p), k);
    int got = 0;
    uint64_t end = ect_now_ms() + 60000;
    while (got < k && ect_now_ms() < end) {
        ect_push_result r;
        if (ect_push_producer_poll(p, &r, 1, 200) == 1) {
            if (r.status) fail_msg("push %s: %s", r.transfer_id, r.error);
            got++;
        }
    }
    assert_int_equal(got, k);
}

static void make_items(pitem *it, int k, const char *tag) {
    static const size_t sizes[] = {4608 * KiB, 64 * KiB, 2 * MiB + 5, 1};
    for (int j = 0; j < k; j++) {
        pitem *x = &it[j];
        memset(x, 0, sizeof *x);
        x->n = sizes[j % 4];
        x->seed = 500 + (uint64_t)j;
        x->shape[0] = x->n;
        snprintf(x->tid, sizeof x->tid, "%s-%d-%d", tag, (int)getpid(), j);
        snprintf(x->hash, sizeof x->hash, "%s-h%d", tag, j);
        x->device = j % 2 == 0 || j == 3; /* device: 0, 2, 3; host: 1 */
        x->borrowed = j % 3 != 1;         /* copied: 1 (host), 4.. */
        if (j == 2) x->borrowed = false;  /* a copied device item: one D2H into staging */
        if (x->device) {
            x->data = dev_pattern(x->n, x->seed);
        } else {
            x->data = malloc(x->n);
            test_fill_pattern(x->data, x->n, x->seed);
        }
    }
}

static void free_items(pitem *it, int k) {
    for (int j = 0; j < k; j++)
        ect_mem_free(it[j].device ? ECT_MEM_CUDA : ECT_MEM_HOST, it[j].data);
}

static void test_push_gpu_pool_tcp(void **state) {
    (void)state;
    ect_push_consumer_opts o;
    ect_push_consumer_opts_init(&o);
    o.ec_port = 0;
    o.pool_size = 64 * MiB;
    o.pool_device = "cuda";
    ect_push_consumer *c = NULL;
    int rc = ect_push_consumer_open(&o, &c);
    if (rc) fail_msg("consumer: %s", ect_last_error());
    assert_int_equal(ect_pool_mem_kind(ect_push_consumer_pool(c)), ECT_MEM_CUDA);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", ect_push_consumer_port(c));
    ect_push_producer *p = producer_open();
    enum { K = 4 };
    pitem it[K];
    make_items(it, K, "tcp");
    int released = 0;
    push_all(p, addr, it, K, &released);
    for (int j = 0; j < K; j++) {
        ect_push_view v;
        assert_int_equal(ect_push_consumer_take(c, it[j].tid, &v), 0);
        assert_int_equal(v.mem_kind, ECT_MEM_CUDA);
        assert_int_equal(v.nbytes, it[j].n);
        int k;
        ect_mem_kind_of(v.data, &k, NULL);
        assert_int_equal(k, ECT_MEM_CUDA);
        assert_true(mem_has_pattern(v.data, v.nbytes, it[j].seed));
        assert_int_equal(ect_push_consumer_release(c, &v), 0);
    }
    ect_push_producer_close(p);
    int borrowed = 0;
    for (int j = 0; j < K; j++) borrowed += it[j].borrowed;
    assert_int_equal(released, borrowed);
    ect_push_consumer_close(c);
    free_items(it, K);
}

/* Device items straight into the other process's GPU pool (CUDA IPC). */
static void test_push_gpu_pool_shm_ipc(void **state) {
    (void)state;
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", child.consumer_port);
    ect_push_producer *p = producer_open();
    enum { K = 4 };
    pitem it[K];
    make_items(it, K, "shm");
    int released = 0;
    push_all(p, addr, it, K, &released);
    for (int j = 0; j < K; j++) {
        cmd m = {.op = C_VERIFY_PUSH, .len = it[j].n, .seed = it[j].seed};
        memcpy(m.tid, it[j].tid, sizeof m.tid); /* both 64 bytes, NUL-terminated */
        child_ask(&m);
    }
    ect_push_producer_close(p);
    free_items(it, K);
}

/* ------------------------------------------------------------ pull */

static void pull_release(void *user, const void *data) {
    (void)data;
    (*(int *)user)++;
}

static void test_pull_gpu_pool(void **state) {
    (void)state;
    ect_pull_producer_opts po;
    ect_pull_producer_opts_init(&po);
    po.port = 0;
    po.pool_size = 32 * MiB;
    ect_pull_producer *p = NULL;
    assert_int_equal(ect_pull_producer_open(&po, &p), 0);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", ect_pull_producer_port(p));
    const size_t n = 4608 * KiB;
    void *d = dev_pattern(n, 61), *d2 = dev_pattern(MiB, 62);
    uint64_t shape[1] = {n}, shape2[1] = {MiB};
    int released = 0;
    assert_int_equal(
        ect_pull_producer_save(p, "pd1", d, n, shape, 1, "uint8", pull_release, &released), 0);
    assert_int_equal(ect_pull_producer_save(p, "pd2", d2, MiB, shape2, 1, "uint8", NULL, NULL), 0);
    assert_int_equal(ect_pull_producer_flush(p, 20000), 0);
    assert_int_equal(released, 1);
    ect_pull_consumer_opts co;
    ect_pull_consumer_opts_init(&co);
    co.producer = addr;
    co.pool_size = 32 * MiB;
    co.pool_device = "cuda";
    ect_pull_consumer *c = NULL;
    int rc = ect_pull_consumer_open(&co, &c);
    if (rc) fail_msg("pull consumer: %s", ect_last_error());
    ect_pull_meta m = {.nbytes = n, .ndim = 1, .shape = {n}, .dtype = "uint8"};
    ect_pull_view v;
    rc = ect_pull_consumer_load(c, "pd1", &m, &v);
    if (rc) fail_msg("load: %s", ect_last_error());
    assert_int_equal(v.mem_kind, ECT_MEM_CUDA);
    assert_true(mem_has_pattern(v.data, n, 61));
    assert_int_equal(ect_pull_consumer_release(c, "pd1"), 0);
    ect_pull_meta m2 = {.nbytes = MiB, .ndim = 1, .shape = {MiB}, .dtype = "uint8"};
    assert_int_equal(ect_pull_consumer_load(c, "pd2", &m2, &v), 0);
    assert_true(mem_has_pattern(v.data, MiB, 62));
    assert_int_equal(ect_pull_consumer_release(c, "pd2"), 0);
    ect_pull_consumer_close(c);
    ect_pull_producer_close(p);
    ect_mem_free(ECT_MEM_CUDA, d);
    ect_mem_free(ECT_MEM_CUDA, d2);
}

/* ------------------------------------------------------------ main */

static int setup(void **state) {
    (void)state;
    if (read_full(from_child, &child, sizeof child) != 0 || !child.ok) {
        fprintf(stderr, "test_cuda_e2e: target process failed: %s\n", child.why);
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    child_stop();
    return 0;
}

int main(void) {
    bool real = getenv("ECT_TEST_REAL_GPU") != NULL;
    if (real) {
        unsetenv("ECT_CUDA_LIBRARY"); /* the machine's libcuda.so.1 */
    } else if (!getenv("ECT_CUDA_LIBRARY")) {
        fprintf(stderr, "test_cuda_e2e: ECT_CUDA_LIBRARY must name the stand-in driver\n");
        return 1;
    }
    /* Whether CUDA is there is asked in a child, so this process forks its
     * target before it loads the driver. */
    pid_t probe = fork();
    if (probe == 0) {
        ect_cuda_info ci;
        int rc = ect_cuda_get_info(&ci);
        if (rc)
            fprintf(stderr, "test_cuda_e2e: %s\n", ci.why);
        else
            fprintf(stderr, "test_cuda_e2e: %s, driver %d, %d device(s), device 0: %s\n",
                    ci.library, ci.driver_version, ci.devices, ci.device0);
        _exit(rc ? 3 : 0);
    }
    int st = 0;
    waitpid(probe, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        if (real && !getenv("ECT_REQUIRE_GPU")) {
            fprintf(stderr, "test_cuda_e2e: no CUDA here: skipped\n");
            return 77;
        }
        fprintf(stderr, "test_cuda_e2e: CUDA is required and unavailable\n");
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    child_start();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tcp_host_to_device),    cmocka_unit_test(test_tcp_device_sources),
        cmocka_unit_test(test_shm_ipc_cross_process), cmocka_unit_test(test_shm_same_process),
        cmocka_unit_test(test_push_gpu_pool_tcp),     cmocka_unit_test(test_push_gpu_pool_shm_ipc),
        cmocka_unit_test(test_pull_gpu_pool),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
