/*
 * test_pull — generation 1 end to end in one process over loopback: a
 * producer, schedulers and consumers on ephemeral ports, plus raw ZMQ
 * sockets playing a misbehaving peer (garbage frames, a ROUTER that answers
 * late, a consumer whose data plane is unreachable).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "testutil.h"

#include "pull/pull_internal.h"
#include "util/util.h"
#include "xport/shm.h"

#define KiB 1024u
#define MiB (1024u * 1024u)

static atomic_int released;
static void on_release(void *user, const void *data) {
    (void)user;
    free((void *)data);
    atomic_fetch_add(&released, 1);
}

/* Saves item `name` of n bytes (uint8, shape [n]) filled from seed. */
static void save_item(ect_pull_producer *p, const char *name, size_t n, uint64_t seed) {
    void *d = malloc(n);
    assert_non_null(d);
    test_fill_pattern(d, n, seed);
    uint64_t shape[1] = {n};
    int rc = ect_pull_producer_save(p, name, d, n, shape, 1, "uint8", on_release, NULL);
    if (rc) fail_msg("save %s: %s", name, ect_last_error());
}

static ect_pull_producer *open_producer(const char *transport, uint64_t pool, int port) {
    ect_pull_producer_opts o;
    ect_pull_producer_opts_init(&o);
    o.port = port;
    o.pool_size = pool;
    o.transport = transport;
    ect_pull_producer *p = NULL;
    int rc = ect_pull_producer_open(&o, &p);
    if (rc) fail_msg("producer open: %s", ect_last_error());
    return p;
}

static void addr_of(int port, char *buf, size_t cap) { snprintf(buf, cap, "127.0.0.1:%d", port); }

static ect_pull_consumer *open_consumer(const char *transport, int port, uint64_t pool,
                                        int timeout_ms) {
    char a[64];
    addr_of(port, a, sizeof a);
    ect_pull_consumer_opts o;
    ect_pull_consumer_opts_init(&o);
    o.producer = a;
    o.transport = transport;
    o.pool_size = pool;
    o.timeout_ms = timeout_ms;
    ect_pull_consumer *c = NULL;
    int rc = ect_pull_consumer_open(&o, &c);
    if (rc) fail_msg("consumer open: %s", ect_last_error());
    return c;
}

static ect_pull_scheduler *open_scheduler_retry(int port, int retry_ms) {
    char a[64];
    addr_of(port, a, sizeof a);
    ect_pull_scheduler_opts o;
    ect_pull_scheduler_opts_init(&o);
    o.producer = a;
    o.request_retry_ms = retry_ms;
    ect_pull_scheduler *s = NULL;
    int rc = ect_pull_scheduler_open(&o, &s);
    if (rc) fail_msg("scheduler open: %s", ect_last_error());
    return s;
}

static ect_pull_scheduler *open_scheduler(int port) { return open_scheduler_retry(port, 200); }

/* Polls has() for up to ms; returns its last answer. */
static int wait_has(ect_pull_scheduler *s, const char *h, ect_pull_meta *m, int ms) {
    uint64_t end = ect_now_ms() + (uint64_t)ms;
    int r;
    while ((r = ect_pull_scheduler_has(s, h, m)) == 0 && ect_now_ms() < end) usleep(2000);
    return r;
}

static uint64_t used(ect_pool *p) {
    ect_pool_stat st;
    ect_pool_stats(p, &st);
    return st.used;
}

static void load_check(ect_pull_consumer *c, const char *h, const ect_pull_meta *m, size_t n,
                       uint64_t seed) {
    ect_pull_view v;
    int rc = ect_pull_consumer_load(c, h, m, &v);
    if (rc) fail_msg("load %s: %s", h, ect_last_error());
    assert_int_equal(v.nbytes, n);
    assert_true(test_check_pattern(v.data, n, seed));
    assert_int_equal(ect_pull_consumer_release(c, h), 0);
}

/* ---- the happy path, cache tier, borrowing */

static void run_basic(const char *transport) {
    atomic_store(&released, 0);
    ect_pull_producer *p = open_producer(transport, 64 * MiB, 0);
    int port = ect_pull_producer_port(p);
    ect_pull_scheduler *s = open_scheduler(port);
    ect_pull_consumer *c = open_consumer(transport, port, 64 * MiB, 10000);
    size_t sizes[3] = {64 * KiB, 4608 * KiB, 1};
    const char *names[3] = {"h-small", "h-llava", "h-one"};
    for (int i = 0; i < 3; i++) save_item(p, names[i], sizes[i], 100 + (uint64_t)i);
    assert_int_equal(ect_pull_producer_flush(p, 10000), 0);
    assert_int_equal(atomic_load(&released), 3);
    for (int i = 0; i < 3; i++) {
        ect_pull_meta m;
        assert_int_equal(wait_has(s, names[i], &m, 10000), 1);
        assert_int_equal(m.nbytes, sizes[i]);
        assert_int_equal(m.ndim, 1);
        assert_int_equal(m.shape[0], sizes[i]);
        assert_string_equal(m.dtype, "uint8");
        assert_string_equal(m.producer_session_id, ect_pull_producer_session_id(p));
        load_check(c, names[i], &m, sizes[i], 100 + (uint64_t)i);
        /* second load: the consumer's resident cache, no transfer */
        ect_pull_view v;
        assert_int_equal(ect_pull_consumer_load(c, names[i], NULL, &v), 0);
        assert_int_equal(v.cached, 1);
        assert_true(test_check_pattern(v.data, sizes[i], 100 + (uint64_t)i));
        assert_int_equal(ect_pull_consumer_release(c, names[i]), 0);
    }
    assert_int_equal(ect_pull_scheduler_has(s, "h-none", NULL), 0);
    ect_pull_consumer_stat cs;
    ect_pull_consumer_stats(c, &cs);
    assert_int_equal(cs.remote, 3);
    assert_int_equal(cs.local, 3);
    ect_pull_producer_stat ps;
    ect_pull_producer_stats(p, &ps);
    assert_int_equal(ps.saved, 3);
    assert_int_equal(ps.pulls_ok, 3);
    assert_int_equal(ps.pulls_failed, 0);
    ect_pull_consumer_close(c);
    ect_pull_scheduler_close(s);
    ect_pull_producer_close(p);
}

static void test_basic_tcp(void **st) {
    (void)st;
    run_basic("tcp");
}
static void test_basic_shm(void **st) {
    (void)st;
    run_basic("shm");
}

/* ---- several consumers at once, same and different items */

typedef struct worker_arg {
    int port, idx, ok;
} worker_arg;

#define N_ITEMS 6
#define ITEM_SIZE (256 * KiB)

static void *consumer_thread(void *arg) {
    worker_arg *w = arg;
    char a[64];
    addr_of(w->port, a, sizeof a);
    ect_pull_consumer_opts o;
    ect_pull_consumer_opts_init(&o);
    o.producer = a;
    o.pool_size = 8 * MiB;
    o.timeout_ms = 20000;
    ect_pull_consumer *c = NULL;
    if (ect_pull_consumer_open(&o, &c) != 0) return NULL;
    int good = 0;
    for (int k = 0; k < N_ITEMS; k++) {
        int i = (k + w->idx) % N_ITEMS; /* every consumer pulls every item, in its own order */
        char h[16];
        snprintf(h, sizeof h, "item-%d", i);
        ect_pull_meta m = {.nbytes = ITEM_SIZE, .ndim = 1, .shape = {ITEM_SIZE}};
        snprintf(m.dtype, sizeof m.dtype, "uint8");
        ect_pull_view v;
        if (ect_pull_consumer_load(c, h, &m, &v) != 0) continue;
        if (v.nbytes == ITEM_SIZE && test_check_pattern(v.data, ITEM_SIZE, 7000 + (uint64_t)i))
            good++;
        ect_pull_consumer_release(c, h);
    }
    w->ok = good;
    ect_pull_consumer_close(c);
    return NULL;
}

static void test_many_consumers(void **st) {
    (void)st;
    ect_pull_producer *p = open_producer("tcp", 16 * MiB, 0);
    for (int i = 0; i < N_ITEMS; i++) {
        char h[16];
        snprintf(h, sizeof h, "item-%d", i);
        save_item(p, h, ITEM_SIZE, 7000 + (uint64_t)i);
    }
    assert_int_equal(ect_pull_producer_flush(p, 10000), 0);
    enum { NC = 4 };
    pthread_t th[NC];
    worker_arg w[NC];
    for (int i = 0; i < NC; i++) {
        w[i] = (worker_arg){.port = ect_pull_producer_port(p), .idx = i};
        assert_int_equal(pthread_create(&th[i], NULL, consumer_thread, &w[i]), 0);
    }
    for (int i = 0; i < NC; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(w[i].ok, N_ITEMS);
    }
    ect_pull_producer_stat ps;
    ect_pull_producer_stats(p, &ps);
    assert_int_equal(ps.pulls_ok, NC * N_ITEMS);
    ect_pull_producer_close(p);
}

/* ---- items ready together share one notification */

static atomic_int gate_open, in_gate;
static void gated_release(void *user, const void *data) {
    (void)user;
    atomic_store(&in_gate, 1);
    while (!atomic_load(&gate_open)) usleep(1000); /* holds the save thread */
    free((void *)data);
}

static void test_notification_batching(void **st) {
    (void)st;
    atomic_store(&gate_open, 0);
    atomic_store(&in_gate, 0);
    ect_pull_producer *p = open_producer("tcp", 4 * MiB, 0);
    void *d = malloc(64);
    assert_non_null(d);
    uint64_t shape[1] = {64};
    assert_int_equal(
        ect_pull_producer_save(p, "first", d, 64, shape, 1, "uint8", gated_release, NULL), 0);
    /* while the save thread sits in the first item's release, five more queue up */
    uint64_t end = ect_now_ms() + 10000;
    while (!atomic_load(&in_gate) && ect_now_ms() < end) usleep(1000);
    assert_int_equal(atomic_load(&in_gate), 1);
    for (int i = 0; i < 5; i++) {
        char h[16];
        snprintf(h, sizeof h, "batch-%d", i);
        save_item(p, h, 64, (uint64_t)i);
    }
    atomic_store(&gate_open, 1);
    assert_int_equal(ect_pull_producer_flush(p, 10000), 0);
    ect_pull_producer_stat ps;
    ect_pull_producer_stats(p, &ps);
    assert_int_equal(ps.saved, 6);
    assert_int_equal(ps.notifications, 2);
    ect_pull_producer_close(p);
}

/* ---- a scheduler that joins after everything was published */

static void test_late_joiner_paged(void **st) {
    (void)st;
    ect_pull_producer_opts o;
    ect_pull_producer_opts_init(&o);
    o.port = 0;
    o.pool_size = 8 * MiB;
    o.page_items = 2; /* 5 items -> 3 ECTransferReady pages */
    ect_pull_producer *p = NULL;
    assert_int_equal(ect_pull_producer_open(&o, &p), 0);
    for (int i = 0; i < 5; i++) {
        char h[16];
        snprintf(h, sizeof h, "late-%d", i);
        save_item(p, h, 1000 + (size_t)i, 50 + (uint64_t)i);
    }
    assert_int_equal(ect_pull_producer_flush(p, 10000), 0);
    usleep(50000); /* the notifications went out before anyone subscribed */
    ect_pull_scheduler *s = open_scheduler(ect_pull_producer_port(p));
    ect_pull_meta m;
    assert_int_equal(wait_has(s, "late-4", &m, 10000), 1);
    ect_pull_scheduler_stat ss;
    uint64_t end = ect_now_ms() + 10000;
    do {
        ect_pull_scheduler_poll(s);
        ect_pull_scheduler_stats(s, &ss);
    } while (!ss.synced && ect_now_ms() < end);
    assert_int_equal(ss.synced, 1);
    assert_int_equal(ss.available, 5);
    assert_true(ss.ready_pages >= 3);
    assert_int_equal(ss.notifications, 0);
    for (int i = 0; i < 5; i++) {
        char h[16];
        snprintf(h, sizeof h, "late-%d", i);
        assert_int_equal(ect_pull_scheduler_has(s, h, &m), 1);
        assert_int_equal(m.nbytes, 1000 + (uint64_t)i);
    }
    ect_pull_producer_stat ps;
    ect_pull_producer_stats(p, &ps);
    assert_true(ps.requests >= 1);
    ect_pull_scheduler_close(s);
    ect_pull_producer_close(p);
}

/* ---- a producer restarting on the same port */

static void test_producer_restart(void **st) {
    (void)st;
    ect_pull_producer *p = open_producer("tcp", 4 * MiB, 0);
    int port = ect_pull_producer_port(p);
    char sess1[64];
    snprintf(sess1, sizeof sess1, "%s", ect_pull_producer_session_id(p));
    ect_pull_scheduler *s = open_scheduler(port);
    save_item(p, "before", 4096, 1);
    assert_int_equal(ect_pull_producer_flush(p, 10000), 0);
    assert_int_equal(wait_has(s, "before", NULL, 10000), 1);
    ect_pull_producer_close(p);
    p = open_producer("tcp", 4 * MiB, port);
    assert_string_not_equal(sess1, ect_pull_producer_session_id(p));
    save_item(p, "after", 4096, 2);
    assert_int_equal(ect_pull_producer_flush(p, 10000), 0);
    ect_pull_meta m;
    assert_int_equal(wait_has(s, "after", &m, 15000), 1);
    assert_string_equal(m.producer_session_id, ect_pull_producer_session_id(p));
    assert_int_equal(ect_pull_scheduler_has(s, "before", NULL), 0);
    ect_pull_scheduler_stat ss;
    ect_pull_scheduler_stats(s, &ss);
    assert_int_equal(ss.session_changes, 1);
    ect_pull_consumer *c = open_consumer("tcp", port, 1 * MiB, 10000);
    load_check(c, "after", &m, 4096, 2);
    ect_pull_consumer_close(c);
    ect_pull_scheduler_close(s);
    ect_pull_producer_close(p);
}

/* ---- unknown and evicted hashes; pool full on either side */

static void test_unknown_evicted_full(void **st) {
    (void)st;
    ect_pull_producer *p = open_producer("tcp", 1 * MiB, 0);
    int port = ect_pull_producer_port(p);
    ect_pull_consumer *c = open_consumer("tcp", port, 1 * MiB, 10000);
    ect_pull_meta m = {.nbytes = 400 * KiB, .ndim = 1, .shape = {400 * KiB}};
    snprintf(m.dtype, sizeof m.dtype, "uint8");
    ect_pull_view v;
    assert_err(ect_pull_consumer_load(c, "never-saved", &m, &v), ECT_ENOTFOUND,
               "unknown or evicted");
    assert_int_equal(used(ect_pull_consumer_pool(c)), 0);
    /* three 400 KiB items in a 1 MiB pool: the first one is evicted */
    save_item(p, "e0", 400 * KiB, 10);
    assert_int_equal(ect_pull_producer_flush(p, 10000), 0);
    save_item(p, "e1", 400 * KiB, 11);
    save_item(p, "e2", 400 * KiB, 12);
    assert_int_equal(ect_pull_producer_flush(p, 10000), 0);
    ect_pull_producer_stat ps;
    ect_pull_producer_stats(p, &ps);
    assert_int_equal(ps.evicted, 1);
    assert_err(ect_pull_consumer_load(c, "e0", &m, &v), ECT_ENOTFOUND, "e0");
    assert_int_equal(used(ect_pull_consumer_pool(c)), 0);
    load_check(c, "e2", &m, 400 * KiB, 12);
    /* producer pool full: an item larger than the pool is dropped, not published */
    save_item(p, "huge", 2 * MiB, 13);
    assert_int_equal(ect_pull_producer_flush(p, 10000), 0);
    ect_pull_producer_stats(p, &ps);
    assert_int_equal(ps.save_failed, 1);
    /* consumer pool full: nothing is sent, nothing stays allocated */
    ect_pull_meta big = {.nbytes = 2 * MiB, .ndim = 1, .shape = {2 * MiB}};
    snprintf(big.dtype, sizeof big.dtype, "uint8");
    uint64_t before = used(ect_pull_consumer_pool(c));
    assert_err(ect_pull_consumer_load(c, "e1", &big, &v), ECT_EFULL, "pool");
    assert_int_equal(used(ect_pull_consumer_pool(c)), before);
    /* a meta that does not add up is refused before anything is sent */
    ect_pull_meta bad = m;
    bad.nbytes = 3;
    assert_err(ect_pull_consumer_load(c, "e1", &bad, &v), ECT_EINVAL, "nbytes");
    ect_pull_consumer_close(c);
    ect_pull_producer_close(p);
    assert_true(atomic_load(&released) > 0);
}

/* ---- raw peers: garbage on ROUTER, refused writes, unreachable consumer */

static void *zsock(void *ctx, int type) {
    void *s = zmq_socket(ctx, type);
    assert_non_null(s);
    int zero = 0, to = 60000; /* a deadline for a reply, generous under load */
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_RCVTIMEO, &to, sizeof to);
    return s;
}

/* A socket of ctx (zsock) connected to p's ROUTER. */
static void *producer_sock(void *ctx, int type, ect_pull_producer *p) {
    void *s = zsock(ctx, type);
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", ect_pull_producer_port(p));
    assert_int_equal(zmq_connect(s, ep), 0);
    return s;
}

static void send_pull(void *dealer, const char *h, uint64_t ptr, uint64_t off, const char *sess,
                      const char *key, uint64_t token) {
    wire_transfer_pull m = {.mm_hash = (char *)h,
                            .dst_ptr = ptr,
                            .dst_offset = off,
                            .consumer_session_id = (char *)sess,
                            .dst_key = (char *)key,
                            .has_token = true,
                            .token = token};
    void *buf;
    size_t len;
    assert_int_equal(wire_transfer_pull_encode(&m, &buf, &len), 0);
    assert_true(zmq_send(dealer, buf, len, 0) >= 0);
    free(buf);
}

/* Item i of a test set: its name "<prefix>-<i>" into name (32 bytes) and a
 * flat uint8 meta of base + i * step bytes. */
static void item_meta(char name[32], const char *prefix, int i, uint64_t base, uint64_t step,
                      ect_pull_meta *m) {
    snprintf(name, 32, "%s-%d", prefix, i);
    *m = (ect_pull_meta){.nbytes = base + step * (uint64_t)i, .ndim = 1};
    m->shape[0] = m->nbytes;
    snprintf(m->dtype, sizeof m->dtype, "uint8");
}

/* Receives one ECTransferComplete; returns its status, checks the token;
 * its error text into err (cap > 0), the producer's offer id into *shm_id
 * (non-NULL). */
static int recv_complete_ex(void *dealer, const char *h, uint64_t token, char *err, size_t cap,
                            uint64_t *shm_id) {
    char buf[4096];
    int n = zmq_recv(dealer, buf, sizeof buf, 0);
    assert_true(n > 0);
    wire_transfer_complete c;
    assert_int_equal(wire_transfer_complete_decode(buf, (size_t)n, &c), 0);
    assert_null(c.ext_error);
    assert_string_equal(c.mm_hash, h);
    assert_true(c.has_token);
    assert_int_equal(c.token, token);
    if (cap) snprintf(err, cap, "%s", c.error ? c.error : "");
    if (shm_id) *shm_id = c.shm_id;
    int st = c.status;
    wire_transfer_complete_free(&c);
    return st;
}

static int recv_complete(void *dealer, const char *h, uint64_t token, char *err, size_t cap) {
    return recv_complete_ex(dealer, h, token, err, cap, NULL);
}

static void test_raw_router(void **st) {
    (void)st;
    ect_pull_producer *p = open_producer("tcp", 4 * MiB, 0);
    save_item(p, "raw", 8192, 77);
    assert_int_equal(ect_pull_producer_flush(p, 10000), 0);
    void *ctx = zmq_ctx_new();
    void *d = producer_sock(ctx, ZMQ_DEALER, p);
    /* garbage: not msgpack, a reply type, two payload frames */
    assert_true(zmq_send(d, "\xc1", 1, 0) == 1);
    wire_transfer_complete wc = {.mm_hash = "raw", .status = 0};
    void *buf;
    size_t len;
    assert_int_equal(wire_transfer_complete_encode(&wc, &buf, &len), 0);
    assert_true(zmq_send(d, buf, len, 0) >= 0);
    free(buf);
    assert_true(zmq_send(d, "a", 1, ZMQ_SNDMORE) == 1);
    assert_true(zmq_send(d, "b", 1, 0) == 1);
    /* a target to write into */
    ect_xport *x = NULL;
    assert_int_equal(ect_xport_open("tcp", NULL, &x), 0);
    size_t rl = 64 * KiB;
    uint8_t *r = mmap(NULL, rl, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(r != MAP_FAILED);
    char key[ECT_XPORT_KEY_MAX];
    assert_int_equal(ect_xport_register(x, r, rl, -1, 0, key), 0);
    char err[300];
    /* the loop is alive after the garbage: a good pull lands at dst_ptr + dst_offset */
    send_pull(d, "raw", (uint64_t)(uintptr_t)r, 4096, ect_xport_session(x), key, 11);
    assert_int_equal(recv_complete(d, "raw", 11, err, sizeof err), 0);
    assert_true(test_check_pattern(r + 4096, 8192, 77));
    /* write refused: wrong key; out of the region */
    send_pull(d, "raw", (uint64_t)(uintptr_t)r, 0, ect_xport_session(x), "0000000000000000", 12);
    assert_int_not_equal(recv_complete(d, "raw", 12, err, sizeof err), 0);
    assert_non_null(strstr(err, "write to"));
    send_pull(d, "raw", (uint64_t)(uintptr_t)r, rl - 100, ect_xport_session(x), key, 13);
    assert_int_not_equal(recv_complete(d, "raw", 13, err, sizeof err), 0);
    /* unknown hash; missing key; unreachable consumer */
    send_pull(d, "nope", (uint64_t)(uintptr_t)r, 0, ect_xport_session(x), key, 14);
    assert_int_equal(recv_complete(d, "nope", 14, err, sizeof err), ECT_ENOTFOUND);
    send_pull(d, "raw", (uint64_t)(uintptr_t)r, 0, ect_xport_session(x), NULL, 15);
    assert_int_equal(recv_complete(d, "raw", 15, err, sizeof err), ECT_EINVAL);
    assert_non_null(strstr(err, "dst_key"));
    send_pull(d, "raw", 4096, 0, "127.0.0.1:1", key, 16);
    assert_int_equal(recv_complete(d, "raw", 16, err, sizeof err), ECT_ECONNREFUSED);
    /* overflow of dst_ptr + dst_offset */
    send_pull(d, "raw", UINT64_MAX, 1, ect_xport_session(x), key, 17);
    assert_int_equal(recv_complete(d, "raw", 17, err, sizeof err), ECT_EOVERFLOW);
    /* a malformed extension key (dst_key: 5): answered -5 naming it, without a token */
    wire_transfer_pull up = {.mm_hash = "raw",
                             .dst_ptr = (uint64_t)(uintptr_t)r,
                             .consumer_session_id = (char *)ect_xport_session(x)};
    assert_int_equal(wire_transfer_pull_encode(&up, &buf, &len), 0);
    uint8_t bad[512];
    assert_true(len + 9 <= sizeof bad && ((uint8_t *)buf)[0] == 0x84);
    memcpy(bad, buf, len);
    free(buf);
    bad[0] = 0x85;
    memcpy(bad + len,
           "\xa7"
           "dst_key"
           "\x05",
           9);
    assert_true(zmq_send(d, bad, len + 9, 0) >= 0);
    char reply[4096];
    int rn = zmq_recv(d, reply, sizeof reply, 0);
    assert_true(rn > 0);
    wire_transfer_complete bc;
    assert_int_equal(wire_transfer_complete_decode(reply, (size_t)rn, &bc), 0);
    assert_int_equal(bc.status, ECT_EPROTO);
    assert_false(bc.has_token);
    assert_non_null(bc.error);
    assert_non_null(strstr(bc.error, "ECTransferPull.dst_key"));
    wire_transfer_complete_free(&bc);
    /* six pulls in flight at once (the lane may write them in one batch): each
     * answered in order with its own status, the refused ones failing alone */
    memset(r, 0, rl);
    const uint64_t offs[6] = {0, 0, 16384, rl - 100, 32768, 49152};
    for (int i = 0; i < 6; i++)
        send_pull(d, "raw", (uint64_t)(uintptr_t)r, offs[i], ect_xport_session(x),
                  i == 1 ? "0000000000000000" : key, 20 + (uint64_t)i);
    for (int i = 0; i < 6; i++) {
        int rs = recv_complete(d, "raw", 20 + (uint64_t)i, err, sizeof err);
        if (i == 1 || i == 3) {
            assert_int_not_equal(rs, 0);
            assert_non_null(strstr(err, "write to"));
        } else {
            assert_int_equal(rs, 0);
            assert_true(test_check_pattern(r + offs[i], 8192, 77));
        }
    }
    ect_pull_producer_stat ps;
    ect_pull_producer_stats(p, &ps);
    assert_int_equal(ps.malformed, 3);
    assert_int_equal(ps.pulls_ok, 5);
    assert_int_equal(ps.pulls_failed, 9);
    /* leases were all given back: the item can be removed */
    assert_int_equal(ect_pool_remove(ect_pull_producer_pool(p), "raw"), 0);
    assert_int_equal(used(ect_pull_producer_pool(p)), 0);
    zmq_close(d);
    zmq_ctx_term(ctx);
    ect_pull_producer_close(p);
    ect_xport_close(x);
    munmap(r, rl);
}

/* A consumer whose data plane swallows the connection (a listener that never
 * accepts) stalls only its own lane: another consumer's pull goes through
 * meanwhile, and the stalled one gets a non-zero status in the end. */
static void test_no_head_of_line(void **st) {
    (void)st;
    ect_pull_producer_opts o;
    ect_pull_producer_opts_init(&o);
    o.port = 0;
    o.pool_size = 8 * MiB;
    o.connect_timeout_ms = 600000; /* the stalled lane ends when its listener closes, */
    o.io_timeout_ms = 600000;      /* not at a timeout the other load must beat */
    ect_pull_producer *p = NULL;
    assert_int_equal(ect_pull_producer_open(&o, &p), 0);
    int port = ect_pull_producer_port(p);
    save_item(p, "hol", 1 * MiB, 31);
    assert_int_equal(ect_pull_producer_flush(p, 10000), 0);
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(lfd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(lfd, 8), 0);
    socklen_t sl = sizeof sa;
    getsockname(lfd, (struct sockaddr *)&sa, &sl);
    char black_hole[64];
    snprintf(black_hole, sizeof black_hole, "127.0.0.1:%d", ntohs(sa.sin_port));
    void *ctx = zmq_ctx_new();
    void *d = zsock(ctx, ZMQ_DEALER);
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
    assert_int_equal(zmq_connect(d, ep), 0);
    send_pull(d, "hol", 4096, 0, black_hole, "0000000000000001", 99);
    ect_pull_producer_stat ps;
    uint64_t end = ect_now_ms() + 60000; /* a generous deadline: a bug fails, not hangs */
    do { /* the stalled write is under way: its lane is taken */
        assert_true(ect_now_ms() < end);
        usleep(1000);
        ect_pull_producer_stats(p, &ps);
    } while (ps.lanes == 0);
    ect_pull_consumer *c = open_consumer("tcp", port, 4 * MiB, 10000);
    ect_pull_meta m = {.nbytes = 1 * MiB, .ndim = 1, .shape = {1 * MiB}};
    snprintf(m.dtype, sizeof m.dtype, "uint8");
    load_check(c, "hol", &m, 1 * MiB, 31);
    char buf[64];
    /* the other consumer's load finished while the stalled pull still has no
     * answer: it did not wait behind it (an order, not a time) */
    assert_int_equal(zmq_recv(d, buf, sizeof buf, ZMQ_DONTWAIT), -1);
    close(lfd); /* the black hole closes: the stalled write fails, answered non-zero */
    char err[300];
    assert_int_not_equal(recv_complete(d, "hol", 99, err, sizeof err), 0);
    assert_non_null(strstr(err, black_hole));
    ect_pull_consumer_close(c);
    zmq_close(d);
    zmq_ctx_term(ctx);
    ect_pull_producer_close(p);
}

/* A REQ peer (empty delimiter frame) asking the inventory gets its answer. */
static void test_req_envelope(void **st) {
    (void)st;
    ect_pull_producer *p = open_producer("tcp", 1 * MiB, 0);
    save_item(p, "inv-a", 100, 1);
    save_item(p, "inv-b", 200, 2);
    assert_int_equal(ect_pull_producer_flush(p, 10000), 0);
    void *ctx = zmq_ctx_new();
    void *q = producer_sock(ctx, ZMQ_REQ, p);
    char *filter[2] = {"inv-b", "not-there"};
    wire_transfer_request r = {
        .request_id = "req-1", .consumer_session_id = "c", .mm_hashes = filter, .n_mm_hashes = 2};
    void *buf;
    size_t len;
    assert_int_equal(wire_transfer_request_encode(&r, &buf, &len), 0);
    assert_true(zmq_send(q, buf, len, 0) >= 0);
    free(buf);
    char in[4096];
    int n = zmq_recv(q, in, sizeof in, 0);
    assert_true(n > 0);
    wire_transfer_ready rd;
    assert_int_equal(wire_transfer_ready_decode(in, (size_t)n, &rd), 0);
    assert_string_equal(rd.request_id, "req-1");
    assert_string_equal(rd.producer_session_id, ect_pull_producer_session_id(p));
    assert_int_equal(rd.n_items, 1);
    assert_string_equal(rd.items[0].mm_hash, "inv-b");
    assert_int_equal(rd.items[0].num_bytes, 200);
    assert_false(rd.more);
    wire_transfer_ready_free(&rd);
    zmq_close(q);
    zmq_ctx_term(ctx);
    ect_pull_producer_close(p);
}

/* A DEALER that sends a pull and goes away before its completion: the
 * completion is dropped (as libzmq's ROUTER drops one for a gone peer) and
 * the ROUTER thread serves the next peer. The pulls share one lane (same
 * session), so once the gone peer's pull is counted, the next round trip's
 * completion comes after its dropped one. */
static void test_peer_gone_before_completion(void **st) {
    (void)st;
    ect_pull_producer *p = open_producer("tcp", 1 * MiB, 0);
    save_item(p, "gone", 4096, 5);
    assert_int_equal(ect_pull_producer_flush(p, 10000), 0);
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", ect_pull_producer_port(p));
    void *ctx1 = zmq_ctx_new();
    void *d1 = zmq_socket(ctx1, ZMQ_DEALER); /* default linger: the pull leaves before the close */
    assert_int_equal(zmq_connect(d1, ep), 0);
    send_pull(d1, "gone", 4096, 0, "127.0.0.1:1", "0000000000000001", 1);
    zmq_close(d1);
    zmq_ctx_term(ctx1); /* returns once the pull is on the wire */
    void *ctx = zmq_ctx_new();
    void *d = zsock(ctx, ZMQ_DEALER);
    assert_int_equal(zmq_connect(d, ep), 0);
    char err[300];
    uint64_t answered = 0;
    ect_pull_producer_stat ps;
    do {
        ect_pull_producer_stats(p, &ps);
        bool counted = ps.pulls_failed > answered;
        send_pull(d, "gone", 4096, 0, "127.0.0.1:1", "0000000000000001", 100 + answered);
        assert_int_equal(recv_complete(d, "gone", 100 + answered, err, sizeof err),
                         ECT_ECONNREFUSED);
        answered++;
        if (counted) break;
    } while (answered < 100000);
    assert_true(ps.pulls_failed >= 1);
    zmq_close(d);
    zmq_ctx_term(ctx);
    ect_pull_producer_close(p);
}

/* A ROUTER port in use is ECT_EIO, as the API says (libzmq's bind failed
 * so; our own listener keeps it). */
static void test_bind_errors(void **st) {
    (void)st;
    ect_pull_producer *p = open_producer("tcp", 1 * MiB, 0);
    ect_pull_producer_opts o;
    ect_pull_producer_opts_init(&o);
    o.pool_size = 1 * MiB;
    o.port = ect_pull_producer_port(p);
    ect_pull_producer *q = NULL;
    assert_err(ect_pull_producer_open(&o, &q), ECT_EIO, "address in use");
    assert_null(q);
    ect_pull_producer_close(p);
}

/* ---- a consumer whose producer answers late (or never) */

typedef struct slow_router {
    void *ctx, *sock;
    int port;
    pthread_t th;
} slow_router;

/* Binds a ROUTER on an ephemeral loopback port and starts serve(sr) on it in
 * a thread. */
static void router_start(slow_router *sr, void *(*serve)(void *)) {
    sr->ctx = zmq_ctx_new();
    sr->sock = zsock(sr->ctx, ZMQ_ROUTER);
    assert_int_equal(zmq_bind(sr->sock, "tcp://127.0.0.1:*"), 0);
    char last[128];
    size_t ll = sizeof last;
    zmq_getsockopt(sr->sock, ZMQ_LAST_ENDPOINT, last, &ll);
    sr->port = atoi(strrchr(last, ':') + 1);
    assert_int_equal(pthread_create(&sr->th, NULL, serve, sr), 0);
}

/* Waits for the serving thread, then closes the ROUTER and its context. */
static void router_stop(slow_router *sr) {
    pthread_join(sr->th, NULL);
    zmq_close(sr->sock);
    zmq_ctx_term(sr->ctx);
}

/* Serves two pulls: ignores the first; on the second, first answers the
 * first (too late, status 0) and then the second with ECT_ENOTFOUND. */
static void *slow_main(void *arg) {
    slow_router *sr = arg;
    char id[2][256], msg[2][4096];
    int idl[2], ml[2];
    for (int i = 0; i < 2; i++) {
        idl[i] = zmq_recv(sr->sock, id[i], sizeof id[i], 0);
        ml[i] = zmq_recv(sr->sock, msg[i], sizeof msg[i], 0);
        if (idl[i] <= 0 || ml[i] <= 0) return NULL;
    }
    for (int i = 0; i < 2; i++) {
        wire_transfer_pull pl;
        if (wire_transfer_pull_decode(msg[i], (size_t)ml[i], &pl) != 0) return NULL;
        wire_transfer_complete c = {.mm_hash = pl.mm_hash,
                                    .status = i == 0 ? 0 : ECT_ENOTFOUND,
                                    .has_token = pl.has_token,
                                    .token = pl.token};
        void *buf;
        size_t len;
        if (wire_transfer_complete_encode(&c, &buf, &len) == 0) {
            zmq_send(sr->sock, id[i], (size_t)idl[i], ZMQ_SNDMORE);
            zmq_send(sr->sock, buf, len, 0);
            free(buf);
        }
        wire_transfer_pull_free(&pl);
    }
    return NULL;
}

static void test_consumer_timeout(void **st) {
    (void)st;
    slow_router sr;
    router_start(&sr, slow_main);
    ect_pull_consumer *c = open_consumer("tcp", sr.port, 1 * MiB, 300);
    ect_pull_meta m = {.nbytes = 1000, .ndim = 1, .shape = {1000}};
    snprintf(m.dtype, sizeof m.dtype, "uint8");
    ect_pull_view v;
    uint64_t t0 = ect_now_ms();
    assert_err(ect_pull_consumer_load(c, "slow", &m, &v), ECT_ETIMEDOUT, "within 300 ms");
    assert_true(ect_now_ms() - t0 < 60000); /* its timeout, not a hang */
    ect_pull_consumer_stat cs;
    ect_pull_consumer_stats(c, &cs);
    assert_int_equal(cs.quarantined, 1);
    assert_true(used(ect_pull_consumer_pool(c)) > 0); /* a late write could still land */
    /* The next load of the same hash gets the late "0" of the first request
     * first: it must not be taken for this one's, whose answer is ENOTFOUND. */
    assert_err(ect_pull_consumer_load(c, "slow", &m, &v), ECT_ENOTFOUND, "status");
    ect_pull_consumer_stats(c, &cs);
    assert_int_equal(cs.stale, 1);
    assert_int_equal(cs.quarantined, 0);
    assert_int_equal(used(ect_pull_consumer_pool(c)), 0);
    ect_pull_consumer_close(c);
    router_stop(&sr); /* its thread has sent every answer by now */
}

/* What an upstream producer does with one ROUTER message: decodes it as an
 * ECTransferPull and answers an ECTransferComplete with the two upstream
 * fields only (no token echo, no offer). Returns 0 answered, 1 not a plain
 * pull (nothing answered), -1 the socket closed. */
static int upstream_answer(slow_router *sr) {
    char id[256], msg[4096];
    int idl = zmq_recv(sr->sock, id, sizeof id, 0);
    int ml = zmq_recv(sr->sock, msg, sizeof msg, 0);
    if (idl <= 0 || ml <= 0) return -1;
    wire_transfer_pull pl;
    if (wire_transfer_pull_decode(msg, (size_t)ml, &pl) != 0) return 1;
    wire_transfer_complete c = {.mm_hash = pl.mm_hash, .status = 0};
    void *buf;
    size_t len;
    if (wire_transfer_complete_encode(&c, &buf, &len) == 0) {
        zmq_send(sr->sock, id, (size_t)idl, ZMQ_SNDMORE);
        zmq_send(sr->sock, buf, len, 0);
        free(buf);
    }
    wire_transfer_pull_free(&pl);
    return 0;
}

/* An upstream-style producer: answers with the two upstream fields only (no
 * token echo); the consumer matches by mm_hash. */
static void *plain_main(void *arg) {
    upstream_answer(arg);
    return NULL;
}

static void test_upstream_complete(void **st) {
    (void)st;
    slow_router sr;
    router_start(&sr, plain_main);
    ect_pull_consumer *c = open_consumer("tcp", sr.port, 1 * MiB, 5000);
    ect_pull_meta m = {.nbytes = 256, .ndim = 2, .shape = {8, 16}};
    snprintf(m.dtype, sizeof m.dtype, "torch.bfloat16");
    ect_pull_view v;
    assert_int_equal(ect_pull_consumer_load(c, "upstream", &m, &v), 0);
    assert_int_equal(v.nbytes, 256);
    assert_int_equal(v.cached, 0);
    assert_int_equal(v.shape[1], 16);
    assert_int_equal(ect_pull_consumer_release(c, "upstream"), 0);
    ect_pull_consumer_close(c);
    router_stop(&sr); /* its thread has sent every answer by now */
}

/* An upstream-style producer that answers three pulls only once all three
 * are in (they were in flight together), in reverse order, without token
 * echo: load_many matches each completion by mm_hash. */
static void *reverse_main(void *arg) {
    slow_router *sr = arg;
    char id[256], msg[4096], hashes[3][64];
    int idl = 0;
    for (int i = 0; i < 3; i++) {
        idl = zmq_recv(sr->sock, id, sizeof id, 0);
        int ml = zmq_recv(sr->sock, msg, sizeof msg, 0);
        if (idl <= 0 || ml <= 0) return NULL;
        wire_transfer_pull pl;
        if (wire_transfer_pull_decode(msg, (size_t)ml, &pl) != 0) return NULL;
        snprintf(hashes[i], sizeof hashes[i], "%s", pl.mm_hash);
        wire_transfer_pull_free(&pl);
    }
    for (int i = 2; i >= 0; i--) {
        wire_transfer_complete c = {.mm_hash = hashes[i], .status = i == 1 ? ECT_ENOTFOUND : 0};
        void *buf;
        size_t len;
        if (wire_transfer_complete_encode(&c, &buf, &len) == 0) {
            zmq_send(sr->sock, id, (size_t)idl, ZMQ_SNDMORE);
            zmq_send(sr->sock, buf, len, 0);
            free(buf);
        }
    }
    return NULL;
}

static void test_load_many_upstream_reverse(void **st) {
    (void)st;
    slow_router sr;
    router_start(&sr, reverse_main);
    ect_pull_consumer *c = open_consumer("tcp", sr.port, 1 * MiB, 30000);
    const char *h[3] = {"r0", "r1", "r2"};
    ect_pull_meta m[3];
    for (int i = 0; i < 3; i++) {
        m[i] = (ect_pull_meta){.nbytes = 256 * (uint64_t)(i + 1), .ndim = 1};
        m[i].shape[0] = m[i].nbytes;
        snprintf(m[i].dtype, sizeof m[i].dtype, "uint8");
    }
    ect_pull_view v[3];
    int sts[3];
    assert_err(ect_pull_consumer_load_many(c, 3, h, m, v, sts), ECT_ENOTFOUND, "r1");
    assert_int_equal(sts[0], 0);
    assert_int_equal(sts[1], ECT_ENOTFOUND);
    assert_int_equal(sts[2], 0);
    assert_int_equal(v[0].nbytes, 256);
    assert_int_equal(v[2].nbytes, 768);
    /* the refused one's region is freed; the two loaded stay */
    assert_int_equal(used(ect_pull_consumer_pool(c)), 256 + 768);
    assert_int_equal(ect_pull_consumer_release(c, "r0"), 0);
    assert_int_equal(ect_pull_consumer_release(c, "r2"), 0);
    ect_pull_consumer_close(c);
    router_stop(&sr); /* its thread has sent every answer by now */
}

/* An upstream-style producer for two sets of four: takes 8 frames, each of
 * which must be a plain ECTransferPull (counted in upstream_bad otherwise),
 * and answers each with the upstream fields only (no ect_batch offer). */
static atomic_int upstream_bad;
static void *upstream_sets_main(void *arg) {
    slow_router *sr = arg;
    for (int i = 0; i < 8; i++) {
        int rc = upstream_answer(sr);
        if (rc < 0) return NULL;
        if (rc > 0) atomic_fetch_add(&upstream_bad, 1);
    }
    return NULL;
}

/* An upstream producer never offers ect_batch: our consumer's second set
 * goes pull by pull as its first did (no ECTransferPullBatch reaches it). */
static void test_upstream_never_gets_batches(void **st) {
    (void)st;
    atomic_store(&upstream_bad, 0);
    slow_router sr;
    router_start(&sr, upstream_sets_main);
    ect_pull_consumer *c = open_consumer("tcp", sr.port, 1 * MiB, 30000);
    for (int set = 0; set < 2; set++) {
        char names[4][32];
        const char *h[4];
        ect_pull_meta m[4];
        ect_pull_view v[4];
        int sts[4];
        for (int i = 0; i < 4; i++) {
            item_meta(names[i], set ? "us1" : "us0", i, 256, 0, &m[i]);
            h[i] = names[i];
        }
        assert_int_equal(ect_pull_consumer_load_many(c, 4, h, m, v, sts), 0);
        for (int i = 0; i < 4; i++) assert_int_equal(ect_pull_consumer_release(c, h[i]), 0);
    }
    ect_pull_consumer_close(c);
    router_stop(&sr);
    assert_int_equal(atomic_load(&upstream_bad), 0);
}

/* A producer that takes the n pulls of one load_many, writes each pull's
 * bytes (pattern 700 + i) with the key its ECTransferPull carries, tries
 * one more write with the first pull's key at probe_addr (0: the byte just
 * past the highest pull's range), then answers each with its token. */
typedef struct window_probe {
    slow_router sr; /* first: the serving thread gets &sr */
    const char *transport;
    int n;
    uint64_t nbytes[4], probe_addr;
    char keys[4][ECT_XPORT_KEY_MAX], session[320];
    int write_rc[4], probe_rc;
    bool ok;
} window_probe;

static int write_one(ect_xport *x, const char *session, uint64_t addr, const void *src,
                     uint64_t len, const char *key) {
    ect_write w = {.src = src, .dst_addr = addr, .len = len, .dst_key = key};
    int st = 0, rc = ect_xport_write_batch(x, session, &w, 1, &st);
    return rc ? rc : st;
}

static void *window_main(void *arg) {
    window_probe *wp = arg;
    char id[256], msg[4096], hashes[4][64];
    uint64_t dst[4], tokens[4], top = 0;
    int idl = 0;
    for (int i = 0; i < wp->n; i++) {
        idl = zmq_recv(wp->sr.sock, id, sizeof id, 0);
        int ml = zmq_recv(wp->sr.sock, msg, sizeof msg, 0);
        wire_transfer_pull pl;
        if (idl <= 0 || ml <= 0 || wire_transfer_pull_decode(msg, (size_t)ml, &pl) != 0 ||
            !pl.dst_key || !pl.has_token)
            return NULL;
        snprintf(hashes[i], sizeof hashes[i], "%s", pl.mm_hash);
        snprintf(wp->keys[i], sizeof wp->keys[i], "%s", pl.dst_key);
        snprintf(wp->session, sizeof wp->session, "%s", pl.consumer_session_id);
        dst[i] = pl.dst_ptr + pl.dst_offset;
        tokens[i] = pl.token;
        if (dst[i] + wp->nbytes[i] > top) top = dst[i] + wp->nbytes[i];
        wire_transfer_pull_free(&pl);
    }
    ect_xport *x = NULL;
    if (ect_xport_open(wp->transport, NULL, &x) != 0) return NULL;
    uint8_t buf[4096];
    for (int i = 0; i < wp->n; i++) {
        test_fill_pattern(buf, (size_t)wp->nbytes[i], 700 + (uint64_t)i);
        wp->write_rc[i] = write_one(x, wp->session, dst[i], buf, wp->nbytes[i], wp->keys[i]);
    }
    wp->probe_rc =
        write_one(x, wp->session, wp->probe_addr ? wp->probe_addr : top, buf, 1, wp->keys[0]);
    ect_xport_close(x);
    for (int i = 0; i < wp->n; i++) {
        wire_transfer_complete c = {
            .mm_hash = hashes[i], .status = 0, .has_token = true, .token = tokens[i]};
        void *out;
        size_t len;
        if (wire_transfer_complete_encode(&c, &out, &len) != 0) return NULL;
        zmq_send(wp->sr.sock, id, (size_t)idl, ZMQ_SNDMORE);
        zmq_send(wp->sr.sock, out, len, 0);
        free(out);
    }
    wp->ok = true;
    return NULL;
}

/* Starts window_main and a consumer of a fresh 1 MiB pool that pulls from it. */
static ect_pull_consumer *window_start(window_probe *wp) {
    router_start(&wp->sr, window_main);
    return open_consumer(wp->transport, wp->sr.port, 1 * MiB, 30000);
}

/* One load_many of wp->n items (h) against window_main: every pull was
 * written with its key and its bytes landed. */
static void window_load(window_probe *wp, ect_pull_consumer *c, const char *const *h) {
    ect_pull_meta m[4];
    for (int i = 0; i < wp->n; i++) {
        m[i] = (ect_pull_meta){.nbytes = wp->nbytes[i], .ndim = 1, .shape = {wp->nbytes[i]}};
        snprintf(m[i].dtype, sizeof m[i].dtype, "uint8");
    }
    ect_pull_view v[4];
    int sts[4];
    assert_int_equal(ect_pull_consumer_load_many(c, (size_t)wp->n, h, m, v, sts), 0);
    router_stop(&wp->sr);
    assert_true(wp->ok);
    for (int i = 0; i < wp->n; i++) {
        assert_int_equal(sts[i], 0);
        assert_int_equal(wp->write_rc[i], 0);
        assert_true(test_check_pattern(v[i].data, (size_t)wp->nbytes[i], 700 + (uint64_t)i));
        assert_int_equal(ect_pull_consumer_release(c, h[i]), 0);
    }
}

/* load_many's regions end to end (a fresh pool; sizes that leave rounding
 * between them): one window for the set, its key on every pull; it admits
 * no byte past the set, and nothing once load_many returned. Then regions
 * with another allocation between them: a window each, and the first
 * pull's key does not reach the allocation between. */
static void run_shared_window(const char *transport) {
    window_probe wp = {.transport = transport, .n = 3, .nbytes = {1000, 3000, 100}};
    const char *h[3] = {"w0", "w1", "w2"};
    ect_pull_consumer *c = window_start(&wp);
    window_load(&wp, c, h);
    assert_string_equal(wp.keys[0], wp.keys[1]);
    assert_string_equal(wp.keys[0], wp.keys[2]);
    assert_int_equal(wp.probe_rc, ECT_EACCES); /* one byte past the set */
    ect_pool *pool = ect_pull_consumer_pool(c);
    uint64_t base = (uint64_t)(uintptr_t)ect_pool_base(pool);
    ect_resident_info info;
    assert_int_equal(ect_pool_lookup(pool, "w1", &info), 0);
    ect_xport *x = NULL;
    assert_int_equal(ect_xport_open(transport, NULL, &x), 0);
    uint8_t one = 1; /* the set's window is closed: its key writes nothing */
    assert_int_not_equal(write_one(x, wp.session, base + info.offset, &one, 1, wp.keys[0]), 0);
    ect_xport_close(x);
    ect_pull_consumer_close(c);

    window_probe w2 = {.transport = transport, .n = 2, .nbytes = {1024, 1024}};
    const char *h2[2] = {"x0", "x1"};
    c = window_start(&w2);
    pool = ect_pull_consumer_pool(c);
    /* a, b, d back to back, a and d freed: the two pulls get their ranges */
    uint64_t a, b, d;
    assert_int_equal(ect_pool_alloc(pool, 1024, &a), 0);
    assert_int_equal(ect_pool_alloc(pool, 1024, &b), 0);
    assert_int_equal(ect_pool_alloc(pool, 1024, &d), 0);
    assert_int_equal(ect_pool_free(pool, a), 0);
    assert_int_equal(ect_pool_free(pool, d), 0);
    w2.probe_addr = (uint64_t)(uintptr_t)ect_pool_base(pool) + b;
    window_load(&w2, c, h2);
    assert_string_not_equal(w2.keys[0], w2.keys[1]);
    assert_int_equal(w2.probe_rc, ECT_EACCES); /* the allocation between */
    assert_int_equal(ect_pool_free(pool, b), 0);
    ect_pull_consumer_close(c);
}

static void test_shared_window_tcp(void **st) {
    (void)st;
    run_shared_window("tcp");
}
static void test_shared_window_shm(void **st) {
    (void)st;
    run_shared_window("shm");
}

/* Over shm the producer names its offer id in each completion and the
 * consumer offers a pull's windows before sending it: the first pull (no id
 * known yet) asks with a BEGIN, the later ones, single and in a load_many
 * set, are offered. Offers never wait (one may meet the consumer's
 * connection thread mid-GRANT and ask after all): most must be offered. */
static void test_shm_pulls_offered(void **st) {
    (void)st;
    ect_pull_producer *p = open_producer("shm", 64 * MiB, 0);
    ect_pull_consumer *c = open_consumer("shm", ect_pull_producer_port(p), 64 * MiB, 30000);
    enum { N = 24, SINGLE = 12 };
    char names[N][32];
    const char *h[N];
    ect_pull_meta m[N];
    for (int i = 0; i < N; i++) {
        item_meta(names[i], "of", i, 64 * KiB, 0, &m[i]);
        h[i] = names[i];
        save_item(p, names[i], (size_t)m[i].nbytes, 900 + (uint64_t)i);
    }
    assert_int_equal(ect_pull_producer_flush(p, 10000), 0);
    uint64_t begins, offers, skips0 = shm_offer_skips();
    load_check(c, h[0], &m[0], (size_t)m[0].nbytes, 900);
    shm_counts(pull_producer_xport(p), &begins, &offers);
    assert_int_equal(begins, 1);
    assert_int_equal(offers, 0);
    for (int i = 1; i < SINGLE; i++)
        load_check(c, h[i], &m[i], (size_t)m[i].nbytes, 900 + (uint64_t)i);
    shm_counts(pull_producer_xport(p), &begins, &offers);
    /* a pull asks only when its offer was skipped (counted) */
    uint64_t skips = shm_offer_skips() - skips0;
    assert_true(begins <= 1 + skips);
    assert_true(offers + skips >= SINGLE - 4);
    uint64_t begins_before_set = begins, offers_before_set = offers;
    ect_pull_view v[N - SINGLE];
    int sts[N - SINGLE];
    assert_int_equal(ect_pull_consumer_load_many(c, N - SINGLE, h + SINGLE, m + SINGLE, v, sts), 0);
    for (int i = 0; i < N - SINGLE; i++) {
        assert_int_equal(sts[i], 0);
        assert_true(test_check_pattern(v[i].data, (size_t)m[SINGLE + i].nbytes,
                                       900 + (uint64_t)(SINGLE + i)));
        assert_int_equal(ect_pull_consumer_release(c, h[SINGLE + i]), 0);
    }
    shm_counts(pull_producer_xport(p), &begins, &offers);
    /* the set's offer was applied, or skipped (the target's connection busy: counted) */
    assert_true(offers > offers_before_set || shm_offer_skips() - skips0 > skips);
    assert_true(begins <= begins_before_set + 1);
    ect_pull_consumer_close(c);
    ect_pull_producer_close(p);
}

/* Over shm with offers, a set's pulls are written by the producer's ROUTER
 * thread itself (copies into the offered windows) and answered at once: no
 * lane job, so no hand-off to a lane and back. A set that still needed a
 * BEGIN (an offer that met the target busy) goes to the lane as before.
 * Every byte checked. Over tcp every pull goes to a lane. */
static void pull_sets_handoffs(const char *transport, int sets, int *all_ready) {
    ect_pull_producer *p = open_producer(transport, 64 * MiB, 0);
    ect_pull_consumer *c = open_consumer(transport, ect_pull_producer_port(p), 64 * MiB, 30000);
    enum { SET = 16 };
    char names[SET][32];
    const char *h[SET];
    ect_pull_meta m[SET];
    for (int i = 0; i < SET; i++) {
        item_meta(names[i], "hs", i, 64 * KiB, 64, &m[i]);
        h[i] = names[i];
        save_item(p, names[i], (size_t)m[i].nbytes, 1300 + (uint64_t)i);
    }
    assert_int_equal(ect_pull_producer_flush(p, 10000), 0);
    load_check(c, h[0], &m[0], (size_t)m[0].nbytes, 1300); /* learns the offer id (shm) */
    assert_int_equal(ect_pool_remove(ect_pull_consumer_pool(c), h[0]), 0);
    *all_ready = 0;
    for (int s = 0; s < sets; s++) {
        uint64_t lanes0, ready0, lanes1, ready1, begins0 = 0, begins1 = 0, offers;
        uint64_t batches0, dones0, batches1, dones1;
        pull_producer_handoffs(p, &lanes0, &ready0);
        pull_producer_batches(p, &batches0, &dones0);
        if (!strcmp(transport, "shm")) shm_counts(pull_producer_xport(p), &begins0, &offers);
        ect_pull_view v[SET];
        int sts[SET];
        assert_int_equal(ect_pull_consumer_load_many(c, SET, h, m, v, sts), 0);
        for (int i = 0; i < SET; i++) {
            assert_int_equal(sts[i], 0);
            assert_int_equal(v[i].cached, 0);
            assert_true(test_check_pattern(v[i].data, (size_t)m[i].nbytes, 1300 + (uint64_t)i));
            assert_int_equal(ect_pull_consumer_release(c, h[i]), 0);
            assert_int_equal(ect_pool_remove(ect_pull_consumer_pool(c), h[i]), 0);
        }
        pull_producer_handoffs(p, &lanes1, &ready1);
        pull_producer_batches(p, &batches1, &dones1);
        /* the first completion said ect_batch: each set goes as one ECTransferPullBatch,
         * its 16 answers in one ECTransferDone or a few */
        assert_int_equal(batches1 - batches0, 1);
        assert_true(dones1 > dones0 && dones1 - dones0 <= SET);
        if (!strcmp(transport, "shm")) shm_counts(pull_producer_xport(p), &begins1, &offers);
        if (strcmp(transport, "shm") != 0) {
            assert_int_equal(ready1, ready0);
            assert_true(lanes1 > lanes0);
        } else if (begins1 == begins0) { /* every write took an offered window */
            assert_int_equal(ready1 - ready0, SET);
            assert_int_equal(lanes1, lanes0);
            ++*all_ready;
        } else { /* some asked with a BEGIN: those went to the lane */
            assert_true(ready1 - ready0 < SET);
            assert_true(lanes1 > lanes0);
        }
    }
    ect_pull_consumer_close(c);
    ect_pull_producer_close(p);
}

static void test_shm_set_written_by_router(void **st) {
    (void)st;
    int all_ready;
    pull_sets_handoffs("shm", 6, &all_ready);
    assert_true(all_ready >= 1); /* offers take: the sixth pass's test allows one BEGIN a set */
}

static void test_tcp_set_on_lane(void **st) {
    (void)st;
    int all_ready;
    pull_sets_handoffs("tcp", 2, &all_ready);
}

/* ---- ECTransferPullBatch / ECTransferDone (docs/PROTOCOL.md "Batched pulls") */

static void send_raw(void *dealer, const wire_pull_msg *m) {
    void *buf;
    size_t len;
    assert_int_equal(wire_pull_msg_encode(m, &buf, &len), 0);
    assert_true(zmq_send(dealer, buf, len, 0) >= 0);
    free(buf);
}

/* Receives messages until every token of want[0..n) is answered: a Done
 * settles status 0, a Complete its status into sts[] (matched by token). */
static void recv_answers(void *dealer, const uint64_t *want, int *sts, size_t n) {
    size_t left = n;
    for (size_t i = 0; i < n; i++) sts[i] = 1;
    while (left) {
        char buf[8192];
        int len = zmq_recv(dealer, buf, sizeof buf, 0);
        assert_true(len > 0);
        wire_pull_msg m;
        assert_int_equal(wire_pull_decode_any(buf, (size_t)len, &m), 0);
        const uint64_t *toks = m.type == WIRE_PULL_DONE ? m.u.done.tokens : &m.u.complete.token;
        size_t k = m.type == WIRE_PULL_DONE ? m.u.done.n : 1;
        assert_true(m.type == WIRE_PULL_DONE || m.type == WIRE_PULL_COMPLETE);
        if (m.type == WIRE_PULL_COMPLETE) assert_true(m.u.complete.has_token);
        for (size_t j = 0; j < k; j++) {
            size_t i = 0;
            while (i < n && want[i] != toks[j]) i++;
            assert_true(i < n && sts[i] == 1); /* ours, and answered once */
            sts[i] = m.type == WIRE_PULL_DONE ? 0 : m.u.complete.status;
            left--;
        }
        wire_pull_msg_free(&m);
    }
}

/* A raw DEALER against our producer: ect_batch is told only to a pull with
 * a token (an upstream consumer's completions stay as they were); a batch's
 * pulls are answered each (written ones in ECTransferDone, refused ones in
 * their own ECTransferComplete); malformed batches are dropped and counted,
 * and the producer goes on serving; every lease is given back. */
static void test_raw_batch(void **st) {
    (void)st;
    ect_pull_producer *p = open_producer("tcp", 4 * MiB, 0);
    save_item(p, "b0", 4096, 90);
    save_item(p, "b1", 4096, 91);
    assert_int_equal(ect_pull_producer_flush(p, 10000), 0);
    void *ctx = zmq_ctx_new();
    void *d = producer_sock(ctx, ZMQ_DEALER, p);
    ect_xport *x = NULL;
    assert_int_equal(ect_xport_open("tcp", NULL, &x), 0);
    size_t rl = 64 * KiB;
    uint8_t *r = mmap(NULL, rl, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(r != MAP_FAILED);
    char key[ECT_XPORT_KEY_MAX];
    assert_int_equal(ect_xport_register(x, r, rl, -1, 0, key), 0);
    const char *sess = ect_xport_session(x);
    uint64_t base = (uint64_t)(uintptr_t)r;
    /* an upstream-style pull (no token): its completion is the upstream one */
    wire_pull_msg up = {
        .type = WIRE_PULL_PULL,
        .u.pull = {
            .mm_hash = "b0", .dst_ptr = base, .consumer_session_id = (char *)sess, .dst_key = key}};
    send_raw(d, &up);
    char buf[4096];
    int n = zmq_recv(d, buf, sizeof buf, 0);
    assert_true(n > 0);
    wire_transfer_complete c;
    assert_int_equal(wire_transfer_complete_decode(buf, (size_t)n, &c), 0);
    assert_int_equal(c.status, 0);
    assert_false(c.has_token);
    assert_int_equal(c.batch_max, 0);
    assert_null(memmem(buf, (size_t)n, "ect_batch", 9));
    wire_transfer_complete_free(&c);
    /* with a token: ect_batch told */
    up.u.pull.has_token = true;
    up.u.pull.token = 1;
    send_raw(d, &up);
    n = zmq_recv(d, buf, sizeof buf, 0);
    assert_true(n > 0);
    assert_int_equal(wire_transfer_complete_decode(buf, (size_t)n, &c), 0);
    assert_int_equal(c.status, 0);
    assert_int_equal(c.batch_max, WIRE_PULL_MAX_ITEMS);
    wire_transfer_complete_free(&c);
    /* a batch of five: two written, an unknown item, a wrong key, one out of the region */
    memset(r, 0, rl);
    wire_transfer_pull ps[5];
    const char *hs[5] = {"b0", "b1", "nope", "b1", "b0"};
    const uint64_t offs[5] = {0, 8192, 16384, 24576, rl - 100};
    for (int i = 0; i < 5; i++)
        ps[i] = (wire_transfer_pull){.mm_hash = (char *)hs[i],
                                     .dst_ptr = base,
                                     .dst_offset = offs[i],
                                     .consumer_session_id = (char *)sess,
                                     .dst_key = i == 3 ? "0000000000000000" : key,
                                     .has_token = true,
                                     .token = 10 + (uint64_t)i};
    wire_pull_msg bm = {.type = WIRE_PULL_PULL_BATCH, .u.batch = {ps, 5}};
    send_raw(d, &bm);
    const uint64_t want[5] = {10, 11, 12, 13, 14};
    int sts[5];
    recv_answers(d, want, sts, 5);
    assert_int_equal(sts[0], 0);
    assert_int_equal(sts[1], 0);
    assert_int_equal(sts[2], ECT_ENOTFOUND);
    assert_int_not_equal(sts[3], 0);
    assert_int_not_equal(sts[4], 0);
    assert_true(test_check_pattern(r, 4096, 90));
    assert_true(test_check_pattern(r + 8192, 4096, 91));
    uint64_t batches, dones;
    pull_producer_batches(p, &batches, &dones);
    assert_int_equal(batches, 1);
    assert_true(dones >= 1 && dones <= 2);
    /* malformed batches: an empty list, an entry of three, a token that is a str; dropped */
    static const struct {
        const char *b;
        size_t n;
    } bad[] = {{"\x83\xa9"
                "ect_pulls"
                "\x90\xab"
                "ect_dst_ptr"
                "\x00\xb3"
                "consumer_session_id"
                "\xa1"
                "s",
                47},
               {"\x83\xa9"
                "ect_pulls"
                "\x91\x93\xa2"
                "b0"
                "\x00\x01\xab"
                "ect_dst_ptr"
                "\x00\xb3"
                "consumer_session_id"
                "\xa1"
                "s",
                53},
               {"\x83\xa9"
                "ect_pulls"
                "\x91\x94\xa2"
                "b0"
                "\x00\xa1"
                "t"
                "\xa1"
                "k"
                "\xab"
                "ect_dst_ptr"
                "\x00\xb3"
                "consumer_session_id"
                "\xa1"
                "s",
                56}};
    for (size_t i = 0; i < ECT_ARRAY_LEN(bad); i++) {
        wire_pull_msg m;
        assert_int_equal(wire_pull_decode_any(bad[i].b, bad[i].n, &m), ECT_EPROTO);
        assert_true(zmq_send(d, bad[i].b, bad[i].n, 0) >= 0);
    }
    /* still serving: a batch of one after them */
    wire_pull_msg one = {.type = WIRE_PULL_PULL_BATCH, .u.batch = {ps, 1}};
    ps[0].token = 20;
    send_raw(d, &one);
    recv_answers(d, &ps[0].token, sts, 1);
    assert_int_equal(sts[0], 0);
    ect_pull_producer_stat pst;
    ect_pull_producer_stats(p, &pst);
    assert_int_equal(pst.malformed, 3);
    pull_producer_batches(p, &batches, &dones);
    assert_int_equal(batches, 2);
    /* leases were all given back */
    assert_int_equal(ect_pool_remove(ect_pull_producer_pool(p), "b0"), 0);
    assert_int_equal(ect_pool_remove(ect_pull_producer_pool(p), "b1"), 0);
    zmq_close(d);
    zmq_ctx_term(ctx);
    ect_pull_producer_close(p);
    ect_xport_close(x);
    munmap(r, rl);
}

/* Receives one ECTransferComplete on a raw DEALER: its status; *shm_id gets
 * the producer's offer id. */
static int recv_complete_id(void *dealer, const char *h, uint64_t token, uint64_t *shm_id) {
    return recv_complete_ex(dealer, h, token, NULL, 0, shm_id);
}

/* The ROUTER thread's own writes admit only what the offered window
 * admits: a pull inside it is written there (no lane job); one running past
 * it, one with another key, and one after the window closed are refused
 * (through the lane's BEGIN, which the target refuses), and no byte outside
 * the window or after its close lands. */
static void test_shm_ready_write_refusals(void **st) {
    (void)st;
    ect_pull_producer *p = open_producer("shm", 4 * MiB, 0);
    enum { ITEM = 8192 };
    save_item(p, "rw", ITEM, 41);
    assert_int_equal(ect_pull_producer_flush(p, 10000), 0);
    void *ctx = zmq_ctx_new();
    void *d = producer_sock(ctx, ZMQ_DEALER, p);
    ect_xport *x = NULL;
    assert_int_equal(ect_xport_open("shm", NULL, &x), 0);
    size_t rl = 64 * KiB;
    int fd = memfd_create("test_pull_ready", MFD_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)rl), 0);
    uint8_t *r = mmap(NULL, rl, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(r != MAP_FAILED);
    char key[ECT_XPORT_KEY_MAX], wkey[ECT_XPORT_KEY_MAX];
    assert_int_equal(ect_xport_register(x, r, rl, fd, 0, key), 0);
    const char *sess = ect_xport_session(x);
    uint64_t ptr = (uint64_t)(uintptr_t)r, shm_id = 0, lanes0, ready0, lanes1, ready1;
    /* the first pull asks (BEGIN) and tells us the producer's offer id */
    send_pull(d, "rw", ptr, 0, sess, key, 1);
    assert_int_equal(recv_complete_id(d, "rw", 1, &shm_id), 0);
    assert_true(shm_id != 0);
    memset(r, 0, rl);
    assert_int_equal(xp_window_open(x, key, 16 * KiB, 16 * KiB, wkey), 0);
    const char *keys[1] = {wkey};
    /* the target's connection thread may still be busy with the first pull
     * (an offer never waits: ECT_EBUSY); it is idle soon, offer again */
    int orc;
    for (int tries = 0; (orc = xp_window_offer(x, shm_id, keys, 1)) == ECT_EBUSY && tries < 30000;
         tries++)
        test_nap_ms(1);
    assert_int_equal(orc, 0);
    /* inside the window: written by the ROUTER thread */
    pull_producer_handoffs(p, &lanes0, &ready0);
    send_pull(d, "rw", ptr, 16 * KiB, sess, wkey, 2);
    assert_int_equal(recv_complete_id(d, "rw", 2, &shm_id), 0);
    pull_producer_handoffs(p, &lanes1, &ready1);
    assert_int_equal(ready1, ready0 + 1);
    assert_int_equal(lanes1, lanes0);
    assert_true(test_check_pattern(r + 16 * KiB, ITEM, 41));
    memset(r, 0, rl);
    /* past the window's end, another key: refused, nothing lands */
    send_pull(d, "rw", ptr, 32 * KiB - ITEM / 2, sess, wkey, 3);
    assert_int_not_equal(recv_complete_id(d, "rw", 3, &shm_id), 0);
    send_pull(d, "rw", ptr, 16 * KiB, sess, "0000000000000000", 4);
    assert_int_not_equal(recv_complete_id(d, "rw", 4, &shm_id), 0);
    /* the window closed: its key writes nothing more */
    assert_int_equal(xp_window_close(x, wkey), 0);
    send_pull(d, "rw", ptr, 16 * KiB, sess, wkey, 5);
    assert_int_not_equal(recv_complete_id(d, "rw", 5, &shm_id), 0);
    pull_producer_handoffs(p, &lanes1, &ready1);
    assert_int_equal(ready1, ready0 + 1);
    for (size_t i = 0; i < rl; i++)
        if (r[i]) fail_msg("byte %zu written by a refused pull", i);
    ect_pull_producer_stat ps;
    ect_pull_producer_stats(p, &ps);
    assert_int_equal(ps.pulls_ok, 2);
    assert_int_equal(ps.pulls_failed, 3);
    assert_int_equal(ect_pool_remove(ect_pull_producer_pool(p), "rw"), 0); /* leases given back */
    zmq_close(d);
    zmq_ctx_term(ctx);
    ect_pull_producer_close(p);
    ect_xport_close(x);
    munmap(r, rl);
    close(fd);
}

/* load_many against our producer: 24 items in flight at once, one already
 * resident, one unknown; every byte checked; bad arguments refused. */
static void run_load_many(const char *transport) {
    ect_pull_producer *p = open_producer(transport, 64 * MiB, 0);
    int port = ect_pull_producer_port(p);
    ect_pull_consumer *c = open_consumer(transport, port, 64 * MiB, 30000);
    enum { N = 26 };
    char names[N][32];
    const char *h[N];
    ect_pull_meta m[N];
    for (int i = 0; i < N; i++) {
        item_meta(names[i], "lm", i, 64 * KiB, 1, &m[i]);
        h[i] = names[i];
        if (i < N - 1) save_item(p, names[i], (size_t)m[i].nbytes, 500 + (uint64_t)i);
    }
    assert_int_equal(ect_pull_producer_flush(p, 10000), 0);
    load_check(c, h[0], &m[0], (size_t)m[0].nbytes, 500); /* lm-0 is resident from now on */
    ect_pull_view v[N];
    int sts[N];
    assert_err(ect_pull_consumer_load_many(c, N, h, m, v, sts), ECT_ENOTFOUND, "lm-25");
    for (int i = 0; i < N - 1; i++) {
        assert_int_equal(sts[i], 0);
        assert_int_equal(v[i].cached, i == 0);
        assert_int_equal(v[i].nbytes, m[i].nbytes);
        assert_true(test_check_pattern(v[i].data, (size_t)m[i].nbytes, 500 + (uint64_t)i));
        assert_int_equal(ect_pull_consumer_release(c, h[i]), 0);
    }
    assert_int_equal(sts[N - 1], ECT_ENOTFOUND);
    ect_pull_consumer_stat cs;
    ect_pull_consumer_stats(c, &cs);
    assert_int_equal(cs.remote, N - 1);
    assert_int_equal(cs.local, 1);
    assert_int_equal(cs.failed, 1);
    uint64_t batches, dones;
    pull_producer_batches(p, &batches, &dones);
    assert_int_equal(batches, 1); /* the set went in one batch; lm-25 was refused alone */
    assert_true(dones >= 1);
    /* all resident now: no meta needed */
    assert_int_equal(ect_pull_consumer_load_many(c, N - 1, h, NULL, v, sts), 0);
    for (int i = 0; i < N - 1; i++) {
        assert_int_equal(v[i].cached, 1);
        assert_int_equal(ect_pull_consumer_release(c, h[i]), 0);
    }
    /* bad arguments */
    assert_err(ect_pull_consumer_load_many(c, 2, NULL, m, v, sts), ECT_EINVAL, "NULL");
    assert_err(ect_pull_consumer_load_many(c, 2, h, m, v, NULL), ECT_EINVAL, "NULL");
    assert_int_equal(ect_pull_consumer_load_many(c, 0, NULL, NULL, NULL, NULL), 0);
    const char *with_null[2] = {h[1], NULL};
    assert_err(ect_pull_consumer_load_many(c, 2, with_null, m, v, sts), ECT_EINVAL, "[1]");
    assert_int_equal(sts[0], 0);
    assert_int_equal(ect_pull_consumer_release(c, h[1]), 0);
    ect_pull_consumer_close(c);
    ect_pull_producer_close(p);
}

static void test_load_many_tcp(void **st) {
    (void)st;
    run_load_many("tcp");
}
static void test_load_many_shm(void **st) {
    (void)st;
    run_load_many("shm");
}

/* load_many checks the meta of each pull: one that says what an earlier
 * pull's (checked) said is taken as checked, one that differs in dtype or
 * shape is checked and refused on its own, and a refused meta is never
 * taken as checked for the next. */
static void test_load_many_checks_each_meta(void **st) {
    (void)st;
    ect_pull_producer *p = open_producer("tcp", 16 * MiB, 0);
    ect_pull_consumer *c = open_consumer("tcp", ect_pull_producer_port(p), 16 * MiB, 30000);
    enum { N = 6 };
    char names[N][32];
    const char *h[N];
    ect_pull_meta m[N];
    for (int i = 0; i < N; i++) {
        item_meta(names[i], "mc", i, 64 * KiB, 0, &m[i]);
        h[i] = names[i];
        save_item(p, names[i], (size_t)m[i].nbytes, 1700 + (uint64_t)i);
    }
    assert_int_equal(ect_pull_producer_flush(p, 10000), 0);
    snprintf(m[2].dtype, sizeof m[2].dtype, "float32"); /* 4 x the bytes */
    m[3].shape[0] = 64 * KiB - 1;                        /* one byte short */
    m[4] = m[3];                                         /* the same bad meta again */
    m[5].ndim = 2;                                       /* the same bytes, another shape */
    m[5].shape[0] = 256;
    m[5].shape[1] = 256;
    ect_pull_view v[N];
    int sts[N];
    assert_err(ect_pull_consumer_load_many(c, N, h, m, v, sts), ECT_EINVAL, "nbytes");
    int want[N] = {0, 0, ECT_EINVAL, ECT_EINVAL, ECT_EINVAL, 0};
    for (int i = 0; i < N; i++) {
        assert_int_equal(sts[i], want[i]);
        if (want[i]) continue;
        assert_true(test_check_pattern(v[i].data, 64 * KiB, 1700 + (uint64_t)i));
        assert_int_equal(v[i].ndim, m[i].ndim);
        assert_int_equal(ect_pull_consumer_release(c, h[i]), 0);
    }
    ect_pull_producer_stat ps; /* the refused ones never left the consumer */
    ect_pull_producer_stats(p, &ps);
    assert_int_equal(ps.pulls_ok, 3);
    assert_int_equal(ps.pulls_failed, 0);
    ect_pull_consumer_close(c);
    ect_pull_producer_close(p);
}

/* A consumer and a scheduler whose producer is gone: no hang anywhere. */
static void test_peer_gone(void **st) {
    (void)st;
    ect_pull_producer *p = open_producer("tcp", 1 * MiB, 0);
    int port = ect_pull_producer_port(p);
    ect_pull_producer_close(p);
    ect_pull_scheduler *s = open_scheduler(port);
    assert_int_equal(ect_pull_scheduler_has(s, "x", NULL), 0);
    ect_pull_consumer_opts o;
    ect_pull_consumer_opts_init(&o);
    char a[64];
    addr_of(port, a, sizeof a);
    o.producer = a;
    o.pool_size = 1 * MiB;
    o.timeout_ms = 200;
    o.quarantine_ms = 0;
    ect_pull_consumer *c = NULL;
    assert_int_equal(ect_pull_consumer_open(&o, &c), 0);
    ect_pull_meta m = {.nbytes = 10, .ndim = 1, .shape = {10}};
    snprintf(m.dtype, sizeof m.dtype, "uint8");
    ect_pull_view v;
    assert_err(ect_pull_consumer_load(c, "x", &m, &v), ECT_ETIMEDOUT, NULL);
    /* quarantine_ms 0: the next call sweeps it */
    assert_err(ect_pull_consumer_load(c, "y", NULL, &v), ECT_EINVAL, "meta");
    assert_int_equal(used(ect_pull_consumer_pool(c)), 0);
    uint64_t t0 = ect_now_ms();
    ect_pull_consumer_close(c);
    ect_pull_scheduler_close(s);
    assert_true(ect_now_ms() - t0 < 60000); /* never waits for the producer forever */
}

/* ---- death detection: kill -9 of the producer fails the remaining loads
 * at once with that cause. The consumer's timeout is 10 minutes, so a
 * consumer that waited for it would hang the test past its ctest limit
 * instead of passing; no timing bound is asserted. */

static void test_producer_killed(void **st) {
    (void)st;
    enum { N = 31, SZ = 4096 };
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) { /* the producer: save N items, say the port, wait to be killed */
        close(pfd[0]);
        ect_pull_producer *p = open_producer("tcp", 4 * MiB, 0);
        char name[32];
        for (int i = 0; i < N; i++) {
            snprintf(name, sizeof name, "k%d", i);
            save_item(p, name, SZ, (uint64_t)i + 100);
        }
        if (ect_pull_producer_flush(p, 60000) != 0) _exit(2);
        int port = ect_pull_producer_port(p);
        if (write(pfd[1], &port, sizeof port) != (ssize_t)sizeof port) _exit(3);
        for (;;) pause();
    }
    close(pfd[1]);
    int port = 0;
    assert_int_equal(read(pfd[0], &port, sizeof port), (ssize_t)sizeof port);
    close(pfd[0]);
    ect_pull_consumer *c = open_consumer("tcp", port, 1 * MiB, 600000);
    ect_pull_meta m = {.nbytes = SZ, .ndim = 1, .shape = {SZ}};
    snprintf(m.dtype, sizeof m.dtype, "uint8");
    load_check(c, "k0", &m, SZ, 100); /* connected and serving */
    assert_int_equal(kill(pid, SIGKILL), 0);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    ect_pull_view v;
    char name[32];
    for (int i = 1; i < N; i++) {
        snprintf(name, sizeof name, "k%d", i);
        assert_err(ect_pull_consumer_load(c, name, &m, &v), ECT_ECLOSED, "gone");
    }
    ect_pull_consumer_stat cs;
    ect_pull_consumer_stats(c, &cs);
    assert_int_equal(cs.producer_lost, 1);
    assert_int_equal(cs.remote, 1);
    assert_int_equal(cs.timeouts, 0);
    ect_pull_consumer_close(c);
}

/* Reconnection: a producer closed (its connection ends: gone, at once) and
 * opened again on its port is reached again without reopening the
 * consumer; loads in between fail with ECT_ECLOSED, never wait. */
static void test_producer_back_on_its_port(void **st) {
    (void)st;
    enum { SZ = 4096 };
    ect_pull_producer *p = open_producer("tcp", 1 * MiB, 0);
    int port = ect_pull_producer_port(p);
    save_item(p, "a", SZ, 5);
    assert_int_equal(ect_pull_producer_flush(p, 60000), 0);
    ect_pull_consumer *c = open_consumer("tcp", port, 1 * MiB, 600000);
    ect_pull_meta m = {.nbytes = SZ, .ndim = 1, .shape = {SZ}};
    snprintf(m.dtype, sizeof m.dtype, "uint8");
    load_check(c, "a", &m, SZ, 5);
    ect_pull_producer_close(p);
    ect_pull_view v;
    assert_err(ect_pull_consumer_load(c, "b", &m, &v), ECT_ECLOSED, "gone");
    p = open_producer("tcp", 1 * MiB, port);
    save_item(p, "b", SZ, 6);
    assert_int_equal(ect_pull_producer_flush(p, 60000), 0);
    int rc, tries = 0;
    while ((rc = ect_pull_consumer_load(c, "b", &m, &v)) == ECT_ECLOSED) tries++;
    if (rc) fail_msg("load b after %d tries: %s", tries, ect_last_error());
    assert_true(test_check_pattern(v.data, SZ, 6));
    ect_pull_consumer_stat cs;
    ect_pull_consumer_stats(c, &cs);
    assert_int_equal(cs.producer_lost, 1);
    assert_int_equal(cs.timeouts, 0);
    ect_pull_consumer_close(c);
    ect_pull_producer_close(p);
}

/* The connect policy: by default a pull may name only a session on the
 * address it came from (a DEALER on 127.0.0.1 naming 127.0.0.3 is refused
 * ECT_EACCES before any connect); connect_allow widens it. */
static void test_connect_policy(void **st) {
    (void)st;
    for (int widen = 0; widen < 2; widen++) {
        ect_pull_producer_opts o;
        ect_pull_producer_opts_init(&o);
        o.port = 0;
        o.pool_size = 4 * MiB;
        o.transport = "tcp";
        o.connect_allow = widen ? "127.0.0.3" : NULL;
        ect_pull_producer *p = NULL;
        assert_int_equal(ect_pull_producer_open(&o, &p), 0);
        save_item(p, "pol", 4096, 5);
        assert_int_equal(ect_pull_producer_flush(p, 10000), 0);
        void *ctx = zmq_ctx_new();
        void *d = zsock(ctx, ZMQ_DEALER);
        char ep[64], err[512];
        snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", ect_pull_producer_port(p));
        assert_int_equal(zmq_connect(d, ep), 0);
        /* 127.0.0.3:1 has no listener: allowed, the write fails to connect */
        send_pull(d, "pol", 4096, 0, "127.0.0.3:1", "0123456789abcdef", 1);
        int rc = recv_complete(d, "pol", 1, err, sizeof err);
        if (widen) {
            assert_int_not_equal(rc, ECT_EACCES);
            assert_int_not_equal(rc, 0);
        } else {
            assert_int_equal(rc, ECT_EACCES);
            assert_non_null(strstr(err, "connect_allow"));
        }
        /* the pull's own address is always fine by default */
        send_pull(d, "pol", 4096, 0, "127.0.0.1:1", "0123456789abcdef", 2);
        rc = recv_complete(d, "pol", 2, err, sizeof err);
        if (!widen) assert_int_not_equal(rc, ECT_EACCES);
        /* A batch names one session for all its entries; the policy holds for
         * each of them (the router decides it once a batch): refused, every
         * entry is refused before its item is looked up; allowed, each goes
         * on (an unknown item is ECT_ENOTFOUND, a write to no listener fails).
         * By default the pull's own address is allowed; connect_allow lists
         * the hosts allowed instead (127.0.0.3, not the pull's own). */
        for (int own = 0; own < 2; own++) {
            wire_transfer_pull ps[3];
            uint64_t want[3];
            int sts[3];
            for (int i = 0; i < 3; i++) {
                want[i] = 10 + 10 * (uint64_t)own + (uint64_t)i;
                ps[i] =
                    (wire_transfer_pull){.mm_hash = i == 1 ? "nope" : "pol",
                                         .dst_ptr = 4096,
                                         .consumer_session_id = own ? "127.0.0.1:1" : "127.0.0.3:1",
                                         .dst_key = "0123456789abcdef",
                                         .has_token = true,
                                         .token = want[i]};
            }
            wire_pull_msg bm = {.type = WIRE_PULL_PULL_BATCH, .u.batch = {ps, 3}};
            send_raw(d, &bm);
            recv_answers(d, want, sts, 3);
            bool refused = own == widen;
            for (int i = 0; i < 3; i++) {
                if (refused)
                    assert_int_equal(sts[i], ECT_EACCES);
                else
                    assert_int_equal(sts[i] == ECT_ENOTFOUND, i == 1);
                assert_int_not_equal(sts[i], 0);
            }
        }
        zmq_close(d);
        zmq_ctx_term(ctx);
        ect_pull_producer_close(p);
    }
}

/* A listener on ip (backlog only: the kernel completes connections, nothing
 * is ever read or answered: a tarpit); its port in *port. */
static int tarpit_listener(const char *ip, int *port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    inet_pton(AF_INET, ip, &sa.sin_addr);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(fd, 16), 0);
    socklen_t sl = sizeof sa;
    getsockname(fd, (struct sockaddr *)&sa, &sl);
    *port = ntohs(sa.sin_port);
    return fd;
}

/* A tarpit pull holds one lane only: a peer naming many sessions that accept
 * and never answer gets max_lanes_per_peer lanes, its other pulls are refused
 * at once with ECT_EBUSY naming the cap, and a pull from another peer
 * (127.0.0.2) is served while every tarpit pull is still outstanding. With
 * one cap for all lanes (before), the tarpits took all max_lanes and the
 * legitimate pull got ECT_EBUSY. */
static void test_tarpit_holds_one_lane(void **st) {
    (void)st;
    enum { N = 12, MAX_LANES = 8, PER_PEER = 3 };
    ect_pull_producer_opts o;
    ect_pull_producer_opts_init(&o);
    o.port = 0;
    o.pool_size = 4 * MiB;
    o.max_lanes = MAX_LANES;
    o.max_lanes_per_peer = PER_PEER;
    o.io_timeout_ms = 600000; /* the tarpits hold their lanes until their listeners close */
    o.connect_timeout_ms = 600000;
    ect_pull_producer *p = NULL;
    assert_int_equal(ect_pull_producer_open(&o, &p), 0);
    save_item(p, "tp", 64 * KiB, 9);
    assert_int_equal(ect_pull_producer_flush(p, 10000), 0);
    int lfd[N], lport[N];
    for (int i = 0; i < N; i++) lfd[i] = tarpit_listener("127.0.0.1", &lport[i]);
    void *ctx = zmq_ctx_new();
    void *tar = zsock(ctx, ZMQ_DEALER);
    char ep[128], sess[64], err[512];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", ect_pull_producer_port(p));
    assert_int_equal(zmq_connect(tar, ep), 0);
    for (int i = 0; i < N; i++) {
        snprintf(sess, sizeof sess, "127.0.0.1:%d", lport[i]);
        send_pull(tar, "tp", 4096, 0, sess, "0000000000000001", (uint64_t)i + 1);
    }
    /* N - PER_PEER refusals come back at once, in order (one ROUTER thread) */
    for (int i = PER_PEER; i < N; i++) {
        assert_int_equal(recv_complete(tar, "tp", (uint64_t)i + 1, err, sizeof err), ECT_EBUSY);
        assert_non_null(strstr(err, "max_lanes_per_peer"));
    }
    ect_pull_producer_stat ps;
    ect_pull_producer_stats(p, &ps);
    assert_int_equal(ps.lanes, PER_PEER);

    /* the legitimate peer: a DEALER from 127.0.0.2 and a target there */
    ect_xport_opts xo;
    ect_xport_opts_init(&xo);
    xo.listen = "127.0.0.2:0";
    ect_xport *x = NULL;
    assert_int_equal(ect_xport_open("tcp", &xo, &x), 0);
    size_t rl = 256 * KiB;
    uint8_t *r = mmap(NULL, rl, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(r != MAP_FAILED);
    char key[ECT_XPORT_KEY_MAX];
    assert_int_equal(ect_xport_register(x, r, rl, -1, 0, key), 0);
    void *good = zsock(ctx, ZMQ_DEALER);
    snprintf(ep, sizeof ep, "tcp://127.0.0.2:0;127.0.0.1:%d", ect_pull_producer_port(p));
    assert_int_equal(zmq_connect(good, ep), 0);
    send_pull(good, "tp", (uint64_t)(uintptr_t)r, 0, ect_xport_session(x), key, 100);
    assert_int_equal(recv_complete(good, "tp", 100, err, sizeof err), 0);
    assert_true(test_check_pattern(r, 64 * KiB, 9));
    /* served while no tarpit pull has its answer (an order, not a time) */
    char buf[64];
    assert_int_equal(zmq_recv(tar, buf, sizeof buf, ZMQ_DONTWAIT), -1);

    /* the tarpits close: their writes fail, each answered non-zero (the
     * lanes run in parallel: in any order) */
    for (int i = 0; i < N; i++) close(lfd[i]);
    bool answered[PER_PEER] = {false};
    for (int i = 0; i < PER_PEER; i++) {
        char reply[4096];
        int rn = zmq_recv(tar, reply, sizeof reply, 0);
        assert_true(rn > 0);
        wire_transfer_complete wc;
        assert_int_equal(wire_transfer_complete_decode(reply, (size_t)rn, &wc), 0);
        assert_true(wc.has_token && wc.token >= 1 && wc.token <= PER_PEER);
        assert_false(answered[wc.token - 1]);
        answered[wc.token - 1] = true;
        assert_int_not_equal(wc.status, 0);
        assert_int_not_equal(wc.status, ECT_EBUSY);
        wire_transfer_complete_free(&wc);
    }
    zmq_close(good);
    zmq_close(tar);
    zmq_ctx_term(ctx);
    ect_pull_producer_close(p);
    ect_xport_close(x);
    munmap(r, rl);
}

/* ---- lanes answer on our own listener (issue 13, tenth pass) */

enum { LA_PEERS = 3, LA_BATCHES = 8, LA_PER = 8, LA_ITEM = 4096 };

typedef struct lane_peer {
    void *ctx;
    int port;
    int answered, in_order, once, written; /* results, checked by the test's thread */
} lane_peer;

/* One consumer connection of its own, its own data-plane session: sends
 * LA_BATCHES batches of LA_PER pulls back to back (tokens 1, 2, ...), then
 * reads every answer: each token must come exactly once, written, and in
 * the order sent (one session: one lane, written and answered in order). */
static void *lane_peer_main(void *arg) {
    lane_peer *lp = arg;
    enum { N = LA_BATCHES * LA_PER };
    void *d = zsock(lp->ctx, ZMQ_DEALER);
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", lp->port);
    ect_xport *x = NULL;
    size_t rl = (size_t)N * LA_ITEM;
    uint8_t *r = mmap(NULL, rl, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char key[ECT_XPORT_KEY_MAX];
    if (zmq_connect(d, ep) != 0 || r == MAP_FAILED || ect_xport_open("tcp", NULL, &x) != 0 ||
        ect_xport_register(x, r, rl, -1, 0, key) != 0)
        goto out;
    for (int b = 0; b < LA_BATCHES; b++) {
        wire_transfer_pull ps[LA_PER];
        for (int i = 0; i < LA_PER; i++) {
            int k = b * LA_PER + i;
            ps[i] = (wire_transfer_pull){.mm_hash = k % 2 ? "la1" : "la0",
                                         .dst_ptr = (uint64_t)(uintptr_t)r,
                                         .dst_offset = (uint64_t)k * LA_ITEM,
                                         .consumer_session_id = (char *)ect_xport_session(x),
                                         .dst_key = key,
                                         .has_token = true,
                                         .token = (uint64_t)k + 1};
        }
        wire_pull_msg bm = {.type = WIRE_PULL_PULL_BATCH, .u.batch = {ps, LA_PER}};
        void *buf;
        size_t len;
        if (wire_pull_msg_encode(&bm, &buf, &len) != 0) goto out;
        int sn = zmq_send(d, buf, len, 0);
        free(buf);
        if (sn < 0) goto out;
    }
    bool seen[N + 1] = {false};
    uint64_t last = 0;
    lp->in_order = lp->once = 1;
    while (lp->answered < N) {
        char buf[8192];
        int len = zmq_recv(d, buf, sizeof buf, 0);
        wire_pull_msg m;
        if (len <= 0 || wire_pull_decode_any(buf, (size_t)len, &m) != 0) break;
        bool done = m.type == WIRE_PULL_DONE;
        const uint64_t *toks = done ? m.u.done.tokens : &m.u.complete.token;
        size_t k = done ? m.u.done.n : 1;
        for (size_t j = 0; j < k; j++) {
            uint64_t t = toks[j];
            if (t < 1 || t > N || seen[t]) lp->once = 0;
            if (t <= last) lp->in_order = 0;
            if (t >= 1 && t <= N) seen[t] = true;
            last = t;
            lp->answered++;
            if (done) lp->written++;
        }
        wire_pull_msg_free(&m);
    }
    for (int k = 0; k < N && lp->written == N; k++)
        if (!test_check_pattern(r + (size_t)k * LA_ITEM, LA_ITEM, k % 2 ? 81 : 80))
            lp->written = -1;
out:
    zmq_close(d);
    ect_xport_close(x);
    if (r != MAP_FAILED) munmap(r, rl);
    return NULL;
}

/* Several consumer connections at once, each pipelining batches over tcp,
 * with a stalled one beside them (its session a tarpit): every reply comes
 * exactly once and in order on each connection, the stalled pull holds up
 * none of them (they are all answered while it has no answer: an order,
 * not a time), and it is answered (failed) once its target goes. */
static void test_lanes_answer_each_once(void **st) {
    (void)st;
    ect_pull_producer *p = open_producer("tcp", 4 * MiB, 0);
    save_item(p, "la0", LA_ITEM, 80);
    save_item(p, "la1", LA_ITEM, 81);
    assert_int_equal(ect_pull_producer_flush(p, 10000), 0);
    void *ctx = zmq_ctx_new();
    int tport, tfd = tarpit_listener("127.0.0.1", &tport);
    char tsess[64], err[512];
    snprintf(tsess, sizeof tsess, "127.0.0.1:%d", tport);
    void *stalled = producer_sock(ctx, ZMQ_DEALER, p);
    send_pull(stalled, "la0", 4096, 0, tsess, "0000000000000001", 7);
    pthread_t th[LA_PEERS];
    lane_peer lp[LA_PEERS];
    for (int i = 0; i < LA_PEERS; i++) {
        lp[i] = (lane_peer){.ctx = ctx, .port = ect_pull_producer_port(p)};
        assert_int_equal(pthread_create(&th[i], NULL, lane_peer_main, &lp[i]), 0);
    }
    for (int i = 0; i < LA_PEERS; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(lp[i].answered, LA_BATCHES * LA_PER);
        assert_int_equal(lp[i].written, LA_BATCHES * LA_PER);
        assert_true(lp[i].once);
        assert_true(lp[i].in_order);
    }
    char buf[64];
    assert_int_equal(zmq_recv(stalled, buf, sizeof buf, ZMQ_DONTWAIT), -1);
    close(tfd);
    assert_int_not_equal(recv_complete(stalled, "la0", 7, err, sizeof err), 0);
    assert_int_equal(zmq_recv(stalled, buf, sizeof buf, ZMQ_DONTWAIT), -1); /* once */
    ect_pull_producer_stat ps;
    ect_pull_producer_stats(p, &ps);
    assert_int_equal(ps.pulls_ok, LA_PEERS * LA_BATCHES * LA_PER);
    assert_int_equal(ps.pulls_failed, 1);
    zmq_close(stalled);
    zmq_ctx_term(ctx);
    ect_pull_producer_close(p);
}

/* ---- garbage on SUB */

static void test_sub_malformed(void **st) {
    (void)st;
    void *ctx = zmq_ctx_new();
    void *pub = zsock(ctx, ZMQ_PUB);
    int pport = 0;
    for (int i = 0; i < 50 && !pport; i++) { /* a PUB at P+1 with P free enough */
        assert_int_equal(zmq_bind(pub, "tcp://127.0.0.1:*"), 0);
        char last[128];
        size_t ll = sizeof last;
        zmq_getsockopt(pub, ZMQ_LAST_ENDPOINT, last, &ll);
        pport = atoi(strrchr(last, ':') + 1);
    }
    ect_pull_scheduler *s = open_scheduler(pport - 1);
    wire_pull_item it = {.mm_hash = "subbed", .ndim = 1, .shape = {16}, .num_bytes = 16};
    snprintf(it.dtype, sizeof it.dtype, "uint8");
    wire_hash_notification n = {.items = &it, .n_items = 1, .producer_session_id = "sess-A"};
    void *buf;
    size_t len;
    assert_int_equal(wire_hash_notification_encode(&n, &buf, &len), 0);
    uint64_t end = ect_now_ms() + 10000;
    int r = 0;
    while (r == 0 && ect_now_ms() < end) {
        zmq_send(pub, "\x92\x01", 2, 0);      /* truncated array */
        zmq_send(pub, "\x81\xa1x\x01", 4, 0); /* unknown message type */
        zmq_send(pub, "x", 1, ZMQ_SNDMORE);   /* two frames */
        zmq_send(pub, "y", 1, 0);
        zmq_send(pub, buf, len, 0);
        usleep(5000);
        r = ect_pull_scheduler_has(s, "subbed", NULL);
    }
    free(buf);
    assert_int_equal(r, 1);
    ect_pull_scheduler_stat ss;
    ect_pull_scheduler_stats(s, &ss);
    assert_true(ss.malformed >= 3);
    assert_true(ss.notifications >= 1);
    ect_pull_scheduler_close(s);
    zmq_close(pub);
    zmq_ctx_term(ctx);
}

/* ---- the slow joiner's last gap: published after the answer, before the subscription */

typedef struct fake_pub {
    void *ctx, *xpub, *router;
    int port;                 /* the ROUTER's; the XPUB is on port + 1 */
    wire_pull_item items[2];  /* the inventory: what was "published" so far */
    size_t n_items;
    int requests;             /* ECTransferRequests answered */
} fake_pub;

/* An XPUB (manual: a subscription counts only once applied here) at P + 1
 * and a ROUTER at P, as a producer's PUB and ROUTER. */
static void fake_pub_open(fake_pub *f) {
    memset(f, 0, sizeof *f);
    f->ctx = zmq_ctx_new();
    for (int i = 0; i < 50 && !f->port; i++) {
        f->xpub = zsock(f->ctx, ZMQ_XPUB);
        int one = 1;
        zmq_setsockopt(f->xpub, ZMQ_XPUB_MANUAL, &one, sizeof one);
        assert_int_equal(zmq_bind(f->xpub, "tcp://127.0.0.1:*"), 0);
        char last[128], ep[64];
        size_t ll = sizeof last;
        zmq_getsockopt(f->xpub, ZMQ_LAST_ENDPOINT, last, &ll);
        int p = atoi(strrchr(last, ':') + 1) - 1;
        f->router = zsock(f->ctx, ZMQ_ROUTER);
        snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", p);
        if (zmq_bind(f->router, ep) == 0) {
            f->port = p;
        } else {
            zmq_close(f->router);
            zmq_close(f->xpub);
        }
    }
    assert_true(f->port > 0);
}

static void fake_pub_close(fake_pub *f) {
    zmq_close(f->router);
    zmq_close(f->xpub);
    zmq_ctx_term(f->ctx);
}

/* Answers every ECTransferRequest queued on the ROUTER with the inventory. */
static void fake_pub_answer(fake_pub *f) {
    for (;;) {
        char id[256], buf[4096];
        int il = zmq_recv(f->router, id, sizeof id, ZMQ_DONTWAIT);
        if (il < 0) return;
        int len = zmq_recv(f->router, buf, sizeof buf, 0);
        assert_true(len > 0 && len < (int)sizeof buf);
        wire_pull_msg m;
        assert_int_equal(wire_pull_decode_any(buf, (size_t)len, &m), 0);
        assert_int_equal(m.type, WIRE_PULL_REQUEST);
        wire_transfer_ready r = {.request_id = m.u.request.request_id,
                                 .items = f->items,
                                 .n_items = f->n_items,
                                 .producer_session_id = "sess-gap"};
        void *out;
        size_t ol;
        assert_int_equal(wire_transfer_ready_encode(&r, &out, &ol), 0);
        zmq_send(f->router, id, (size_t)il, ZMQ_SNDMORE);
        zmq_send(f->router, out, ol, 0);
        free(out);
        wire_pull_msg_free(&m);
        f->requests++;
    }
}

/* Adds name to the inventory and publishes it on the XPUB. */
static void fake_pub_publish(fake_pub *f, const char *name) {
    wire_pull_item *it = &f->items[f->n_items++];
    *it = (wire_pull_item){.mm_hash = (char *)name, .ndim = 1, .shape = {16}, .num_bytes = 16};
    snprintf(it->dtype, sizeof it->dtype, "uint8");
    wire_hash_notification n = {.items = it, .n_items = 1, .producer_session_id = "sess-gap"};
    void *buf;
    size_t len;
    assert_int_equal(wire_hash_notification_encode(&n, &buf, &len), 0);
    assert_int_equal(zmq_send(f->xpub, buf, len, 0), (int)len);
    free(buf);
}

/* The scheduler's inventory requests (at open, at the SUB's handshake) are
 * answered before the PUB applies the subscription; "gap" is published
 * right then: the SUB cannot get it and no answer holds it. Once the
 * subscription is in, "after" is published: its arrival must make the
 * scheduler ask again, and learn "gap". Without that it never knows "gap"
 * (this fails at the deadline). */
/* Opens a scheduler on f (retry_ms), answers its two inventory requests (at
 * open, at the SUB's handshake) while the subscription is not applied, then
 * publishes "gap" (dropped: nobody subscribed yet) and applies it. */
static ect_pull_scheduler *gap_open(fake_pub *f, int retry_ms, uint64_t end) {
    fake_pub_open(f);
    ect_pull_scheduler *s = open_scheduler_retry(f->port, retry_ms);
    char sub[64];
    int sl = zmq_recv(f->xpub, sub, sizeof sub, 0); /* the subscription, not applied yet */
    assert_int_equal(sl, 1);
    assert_int_equal(sub[0], 1);
    while (f->requests < 2 && ect_now_ms() < end) {
        ect_pull_scheduler_poll(s);
        fake_pub_answer(f);
        usleep(1000);
    }
    /* at least 2: with a short retry_ms a test thread off its CPU that long
     * meets a timed re-ask too (answered before "gap": it cannot hold it) */
    assert_true(f->requests >= 2);
    fake_pub_publish(f, "gap");
    assert_int_equal(zmq_setsockopt(f->xpub, ZMQ_SUBSCRIBE, "", 0), 0);
    return s;
}

static void test_sub_joiner_gap(void **st) {
    (void)st;
    fake_pub f;
    uint64_t end = ect_now_ms() + 60000;
    /* a long retry: no timed re-ask may come before "gap" is published */
    ect_pull_scheduler *s = gap_open(&f, 600000, end);
    fake_pub_publish(&f, "after");
    int r = 0;
    while (!(r = ect_pull_scheduler_has(s, "gap", NULL)) && ect_now_ms() < end) {
        fake_pub_answer(&f);
        usleep(1000);
    }
    assert_int_equal(r, 1);
    assert_int_equal(ect_pull_scheduler_has(s, "after", NULL), 1);
    assert_int_equal(f.requests, 3);
    ect_pull_scheduler_stat ss;
    ect_pull_scheduler_stats(s, &ss);
    assert_int_equal(ss.notifications, 1); /* "gap" never came on the SUB */
    ect_pull_scheduler_close(s);
    fake_pub_close(&f);
}

/* The same gap with nothing published after it: request_retry_ms after the
 * handshake the scheduler asks once more on its own and learns "gap". */
static void test_sub_joiner_gap_quiet(void **st) {
    (void)st;
    fake_pub f;
    uint64_t end = ect_now_ms() + 60000;
    ect_pull_scheduler *s = gap_open(&f, 200, end);
    int r = 0;
    while (!(r = ect_pull_scheduler_has(s, "gap", NULL)) && ect_now_ms() < end) {
        fake_pub_answer(&f);
        usleep(1000);
    }
    assert_int_equal(r, 1);
    ect_pull_scheduler_stat ss;
    ect_pull_scheduler_stats(s, &ss);
    assert_int_equal(ss.notifications, 0);
    ect_pull_scheduler_close(s);
    fake_pub_close(&f);
}

/* ---- bad options and arguments */

static void test_bad_args(void **st) {
    (void)st;
    ect_pull_producer_opts o;
    ect_pull_producer_opts_init(&o);
    ect_pull_producer *p = (void *)1;
    o.port = 70000;
    assert_err(ect_pull_producer_open(&o, &p), ECT_EINVAL, "port");
    assert_null(p);
    o.port = 0;
    o.transport = "carrier-pigeon";
    assert_true(ect_pull_producer_open(&o, &p) != 0);
    ect_pull_scheduler_opts so;
    ect_pull_scheduler_opts_init(&so);
    ect_pull_scheduler *s = NULL;
    so.producer = "nohost";
    assert_err(ect_pull_scheduler_open(&so, &s), ECT_EINVAL, "HOST:PORT");
    ect_pull_consumer_opts co;
    ect_pull_consumer_opts_init(&co);
    ect_pull_consumer *c = NULL;
    assert_err(ect_pull_consumer_open(&co, &c), ECT_EINVAL, "producer");
    p = open_producer("tcp", 1 * MiB, 0);
    uint64_t shape[2] = {3, 4};
    char d[24] = {0};
    assert_err(ect_pull_producer_save(p, "", d, 24, shape, 2, "float16", NULL, NULL), ECT_EINVAL,
               "mm_hash");
    assert_err(ect_pull_producer_save(p, "h", d, 23, shape, 2, "float16", NULL, NULL), ECT_EINVAL,
               "nbytes");
    assert_err(ect_pull_producer_save(p, "h", d, 24, shape, 2, "float5", NULL, NULL), ECT_EINVAL,
               "dtype");
    assert_int_equal(ect_pull_producer_save(p, "h", d, 24, shape, 2, "torch.float16", NULL, NULL),
                     0);
    ect_pull_producer_close(p); /* closes with the item maybe still queued */
    ect_pull_producer_close(NULL);
    ect_pull_consumer_close(NULL);
    ect_pull_scheduler_close(NULL);
}

/* The save queue is bounded: while the save thread is busy with one item, a
 * save that would pass max_queued_bytes is refused with ECT_EBUSY (and its
 * release callback never fires); once the thread catches up it is accepted. */
static void test_save_queue_bound(void **st) {
    (void)st;
    ect_pull_producer_opts o;
    ect_pull_producer_opts_init(&o);
    o.port = 0;
    o.pool_size = 4 * MiB;
    ect_pull_producer *p = NULL;
    o.max_queued_bytes = 0;
    assert_err(ect_pull_producer_open(&o, &p), ECT_EINVAL, "max_queued_bytes");
    o.max_queued_bytes = 96 * KiB;
    assert_int_equal(ect_pull_producer_open(&o, &p), 0);
    uint64_t shape[1] = {64 * KiB};
    /* A: held inside its release callback, so it still counts as queued. */
    atomic_store(&gate_open, 0);
    atomic_store(&in_gate, 0);
    void *a = calloc(1, 64 * KiB);
    assert_int_equal(
        ect_pull_producer_save(p, "a", a, 64 * KiB, shape, 1, "uint8", gated_release, NULL), 0);
    uint64_t end = ect_now_ms() + 10000;
    while (!atomic_load(&in_gate) && ect_now_ms() < end) usleep(1000);
    assert_int_equal(atomic_load(&in_gate), 1);
    atomic_store(&released, 0);
    void *b = calloc(1, 64 * KiB);
    assert_err(ect_pull_producer_save(p, "b", b, 64 * KiB, shape, 1, "uint8", on_release, NULL),
               ECT_EBUSY, "max_queued_bytes");
    assert_int_equal(atomic_load(&released), 0); /* refused: b is still ours */
    atomic_store(&gate_open, 1);
    assert_int_equal(ect_pull_producer_flush(p, 10000), 0);
    assert_int_equal(
        ect_pull_producer_save(p, "b", b, 64 * KiB, shape, 1, "uint8", on_release, NULL), 0);
    assert_int_equal(ect_pull_producer_flush(p, 10000), 0);
    assert_int_equal(atomic_load(&released), 1);
    ect_pull_producer_close(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_args),
        cmocka_unit_test(test_save_queue_bound),
        cmocka_unit_test(test_basic_tcp),
        cmocka_unit_test(test_basic_shm),
        cmocka_unit_test(test_many_consumers),
        cmocka_unit_test(test_notification_batching),
        cmocka_unit_test(test_late_joiner_paged),
        cmocka_unit_test(test_producer_restart),
        cmocka_unit_test(test_unknown_evicted_full),
        cmocka_unit_test(test_raw_router),
        cmocka_unit_test(test_peer_gone_before_completion),
        cmocka_unit_test(test_bind_errors),
        cmocka_unit_test(test_no_head_of_line),
        cmocka_unit_test(test_req_envelope),
        cmocka_unit_test(test_consumer_timeout),
        cmocka_unit_test(test_upstream_complete),
        cmocka_unit_test(test_load_many_upstream_reverse),
        cmocka_unit_test(test_load_many_tcp),
        cmocka_unit_test(test_load_many_shm),
        cmocka_unit_test(test_shm_pulls_offered),
        cmocka_unit_test(test_shm_set_written_by_router),
        cmocka_unit_test(test_tcp_set_on_lane),
        cmocka_unit_test(test_load_many_checks_each_meta),
        cmocka_unit_test(test_shm_ready_write_refusals),
        cmocka_unit_test(test_raw_batch),
        cmocka_unit_test(test_upstream_never_gets_batches),
        cmocka_unit_test(test_shared_window_tcp),
        cmocka_unit_test(test_shared_window_shm),
        cmocka_unit_test(test_peer_gone),
        cmocka_unit_test(test_producer_back_on_its_port),
        cmocka_unit_test(test_producer_killed),
        cmocka_unit_test(test_connect_policy),
        cmocka_unit_test(test_tarpit_holds_one_lane),
        cmocka_unit_test(test_lanes_answer_each_once),
        cmocka_unit_test(test_sub_malformed),
        cmocka_unit_test(test_sub_joiner_gap),
        cmocka_unit_test(test_sub_joiner_gap_quiet),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
