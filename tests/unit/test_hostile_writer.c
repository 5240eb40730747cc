/*
 * test_hostile_writer — writes bound to one live reservation (issue 15,
 * docs/PROTOCOL.md "Write windows"). A push consumer over tcp and over shm
 * holds live writers, a completed item, a cancelled reservation and (on a
 * second consumer with a short TTL) an expired one; a hostile initiator then
 * makes over 100,000 write attempts in batches over one connection: random
 * keys, other reservations' keys, stale keys after complete / cancel /
 * expiry, offsets outside the reservation, overflowing ranges. Every attempt
 * must be refused, the target must count every one, and every byte of both
 * pools must be unchanged. Then a legitimate write with the live key still
 * lands (the refusals are not a broken data plane), and a later push of the
 * completed item's content is served with the original bytes, not with
 * anything the hostile writer sent. Pull consumers (generation 1) get the
 * same binding; test_pull covers their pulls end to end.
 *
 * With data-plane keys (test_*_keys): a target with keys holds a pool region
 * that takes writes only through its windows (the consumer's reservations:
 * two live, two closed = completed/cancelled); an attacker WITH an accepted
 * key makes 50,000 attempts per transport with random keys, the other
 * windows' keys, stale keys and out-of-range offsets: 0 accepted, every one
 * counted; an attacker without an accepted key makes 10,000 attempts and
 * gets not even a session (every batch ECT_EACCES, refusals counted by the
 * handshake, none reaching the region check). Not a byte of the pool
 * changes; a legitimate keyed writer still lands its window.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "testutil.h"
#include "push/control_client.h"
#include "ctl_req.h"
#include "util/util.h"
#include "xport/xport.h"

#define ROWS 8                        /* 8 x 256 bf16 = 4096 bytes per item */
#define NB ((uint64_t)ROWS * 256 * 2) /* bytes per item */
#define POOL (1u << 20)               /* 1 MiB per consumer */
#define BATCH 1000                    /* writes per write_batch */
#define ATTEMPTS_MAIN 45000           /* per transport, on the long-TTL consumer */
#define ATTEMPTS_EXPIRED 5000         /* per transport, on the short-TTL one */
#define ATTEMPTS_KEYED 50000          /* per transport, attacker with an accepted key */
#define ATTEMPTS_KEYLESS 10000        /* per transport, attacker without one */

static void nap(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static ect_push_consumer *consumer(const char *transport, uint64_t ttl_ms) {
    ect_push_consumer_opts o;
    ect_push_consumer_opts_init(&o);
    o.ec_port = 0;
    o.pool_size = POOL;
    o.transport = transport;
    if (ttl_ms) {
        o.ttl_ms = ttl_ms;
        o.pending_grace_ms = ttl_ms;
        o.reap_interval_ms = 20;
    }
    ect_push_consumer *c = NULL;
    int rc = ect_push_consumer_open(&o, &c);
    if (rc) fail_msg("consumer open: %s", ect_last_error());
    return c;
}

typedef struct rsv {
    char tid[64], rid[257], key[64], session[300];
    uint64_t dst;
} rsv;

static void reserve(ctl_client *cli, int port, const char *tid, const char *hash, rsv *out,
                    bool want_write) {
    wire_ctl_request q = test_reserve_req(tid, hash, ROWS, 256, "torch.bfloat16");
    wire_ctl_reply r;
    assert_int_equal(ctl_call_ok(cli, "127.0.0.1", port, &q, &r), 0);
    assert_int_equal(r.u.reserve.write, want_write);
    memset(out, 0, sizeof *out);
    snprintf(out->tid, sizeof out->tid, "%s", tid);
    snprintf(out->rid, sizeof out->rid, "%s", r.u.reserve.reservation_id);
    snprintf(out->session, sizeof out->session, "%s", r.u.reserve.dst_session);
    if (want_write) {
        assert_non_null(r.u.reserve.dst_key);
        snprintf(out->key, sizeof out->key, "%s", r.u.reserve.dst_key);
    }
    out->dst = r.u.reserve.dst_ptr;
    wire_ctl_reply_clear(&r);
}

static void complete(ctl_client *cli, int port, const rsv *v) {
    wire_ctl_request c = {.op = WIRE_OP_COMPLETE};
    snprintf(c.u.complete.transfer_id, sizeof c.u.complete.transfer_id, "%s", v->tid);
    snprintf(c.u.complete.reservation_id, sizeof c.u.complete.reservation_id, "%s", v->rid);
    wire_ctl_reply r;
    assert_int_equal(ctl_call_ok(cli, "127.0.0.1", port, &c, &r), 0);
    assert_true(r.u.complete.became_ready);
    wire_ctl_reply_clear(&r);
}

static void cancel(ctl_client *cli, int port, const rsv *v) {
    wire_ctl_request c = {.op = WIRE_OP_CANCEL};
    snprintf(c.u.cancel.transfer_id, sizeof c.u.cancel.transfer_id, "%s", v->tid);
    snprintf(c.u.cancel.reservation_id, sizeof c.u.cancel.reservation_id, "%s", v->rid);
    c.u.cancel.abandon = true;
    wire_ctl_reply r;
    assert_int_equal(ctl_call_ok(cli, "127.0.0.1", port, &c, &r), 0);
    assert_true(r.u.cancelled);
    wire_ctl_reply_clear(&r);
}

static void write_ok(ect_xport *xp, const rsv *v, const void *src, uint64_t len) {
    ect_write w = {src, v->dst, len, v->key};
    int rc = ect_xport_write_batch(xp, v->session, &w, 1, NULL);
    if (rc) fail_msg("legitimate write refused: %s", ect_last_error());
}

/* The hostile attempts: n writes, each refused or the test fails. `pick`
 * chooses key and range of attempt i. */
typedef struct hostile {
    const rsv *live[2];  /* live writers: their keys are used only outside their range */
    const rsv *stale[3]; /* completed, cancelled, expired (NULL: none here) */
    uint64_t base, cap;  /* the pool */
    uint64_t seed;
} hostile;

static void pick(hostile *h, uint64_t i, char *key, uint64_t *addr, uint64_t *len) {
    uint64_t r = test_rand(&h->seed);
    *len = 1 + r % 64;
    uint64_t in_pool = h->base + (test_rand(&h->seed) % (h->cap - 64));
    const rsv *l0 = h->live[0], *l1 = h->live[1];
    switch (i % 8) {
    case 0: /* a random key, anywhere in the pool */
        snprintf(key, 64, "%016llx", (unsigned long long)test_rand(&h->seed));
        *addr = in_pool;
        break;
    case 1: /* a random key inside a live reservation */
        snprintf(key, 64, "%016llx", (unsigned long long)test_rand(&h->seed));
        *addr = (l0 ? l0->dst : h->base) + r % (NB - 64);
        break;
    case 2: /* another live reservation's key inside this one */
        if (l0 && l1) {
            snprintf(key, 64, "%s", l1->key);
            *addr = l0->dst + r % (NB - 64);
        } else {
            snprintf(key, 64, "%016llx", (unsigned long long)test_rand(&h->seed));
            *addr = in_pool;
        }
        break;
    case 3: /* a live key just before its range, or straddling its end */
    case 4:
        if (l0) {
            snprintf(key, 64, "%s", l0->key);
            *addr = (i % 8 == 3) ? l0->dst - *len : l0->dst + NB - *len / 2;
            if (i % 8 == 4 && *len < 2) *len = 2;
        } else {
            snprintf(key, 64, "%016llx", (unsigned long long)test_rand(&h->seed));
            *addr = in_pool;
        }
        break;
    case 5: /* a live key anywhere else in the pool, or at an overflowing address */
        if (l0) {
            snprintf(key, 64, "%s", l0->key);
            *addr = (r & 1) ? UINT64_MAX - 8 : in_pool;
            if (*addr >= l0->dst && *addr < l0->dst + NB) *addr = l0->dst + NB;
        } else {
            snprintf(key, 64, "%016llx", (unsigned long long)test_rand(&h->seed));
            *addr = UINT64_MAX - 8;
        }
        break;
    default: { /* a stale key (complete, cancel, expiry) inside its old range */
        const rsv *s = NULL;
        for (int k = 0; k < 3 && !s; k++) s = h->stale[(i + (uint64_t)k) % 3];
        snprintf(key, 64, "%s", s->key);
        *addr = s->dst + r % (NB - 64);
        break;
    }
    }
}

/* shm: how this process maps the consumers' pool files. The two consumers
 * map their whole pools; an initiator that was granted a window maps only
 * the pages that cover it. Counts mappings of at least `whole` bytes and
 * of at most `window` bytes. */
static void pool_maps(uint64_t whole, uint64_t window, int *n_whole, int *n_small) {
    *n_whole = *n_small = 0;
    FILE *f = fopen("/proc/self/maps", "r");
    assert_non_null(f);
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (!strstr(line, "memfd:ectransfer-pool")) continue;
        unsigned long long a, b;
        if (sscanf(line, "%llx-%llx", &a, &b) != 2) continue;
        if (b - a >= whole)
            (*n_whole)++;
        else if (b - a <= window)
            (*n_small)++;
    }
    fclose(f);
}

static uint64_t attack(ect_xport *xp, const char *session, hostile *h, uint64_t n) {
    static uint8_t junk[64];
    memset(junk, 0xEE, sizeof junk);
    ect_write *w = calloc(BATCH, sizeof *w);
    char(*keys)[64] = calloc(BATCH, 64);
    int *st = calloc(BATCH, sizeof *st);
    assert_non_null(w);
    assert_non_null(keys);
    assert_non_null(st);
    uint64_t done = 0, accepted = 0;
    while (done < n) {
        size_t k = n - done < BATCH ? (size_t)(n - done) : BATCH;
        for (size_t j = 0; j < k; j++) {
            uint64_t addr, len;
            pick(h, done + j, keys[j], &addr, &len);
            w[j] = (ect_write){junk, addr, len, keys[j]};
        }
        int rc = ect_xport_write_batch(xp, session, w, k, st);
        assert_int_not_equal(rc, 0); /* every batch has refusals */
        for (size_t j = 0; j < k; j++) {
            if (st[j] == 0) {
                accepted++;
                print_error("accepted: key %s addr 0x%llx len %llu (attempt %llu)\n", keys[j],
                            (unsigned long long)w[j].dst_addr, (unsigned long long)w[j].len,
                            (unsigned long long)(done + j));
            }
        }
        done += k;
    }
    free(w);
    free(keys);
    free(st);
    return accepted;
}

static void run(const char *transport) {
    ect_push_consumer *a = consumer(transport, 0);
    ect_push_consumer *b = consumer(transport, 150); /* for an expired reservation */
    int pa = ect_push_consumer_port(a), pb = ect_push_consumer_port(b);
    void *zctx = zmq_ctx_new();
    ctl_client *cli;
    assert_int_equal(ctl_client_open(zctx, 10000, &cli), 0);
    ect_xport *good, *bad;
    assert_int_equal(ect_xport_open(transport, NULL, &good), 0);
    assert_int_equal(ect_xport_open(transport, NULL, &bad), 0);

    uint8_t *src = malloc(NB);
    test_fill_pattern(src, NB, 42);
    /* C: written, completed (READY); X: cancelled; L0, L1: live writers. */
    rsv C, X, L0, L1, E;
    reserve(cli, pa, "t-c", "h-c", &C, true);
    write_ok(good, &C, src, NB);
    complete(cli, pa, &C);
    reserve(cli, pa, "t-x", "h-x", &X, true);
    cancel(cli, pa, &X);
    reserve(cli, pa, "t-l0", "h-l0", &L0, true);
    reserve(cli, pa, "t-l1", "h-l1", &L1, true);
    assert_string_not_equal(L0.key, L1.key);
    assert_string_not_equal(L0.key, C.key);
    /* E on b: reserved, never written, expired by the reaper. */
    reserve(cli, pb, "t-e", "h-e", &E, true);
    for (;;) {
        ect_push_consumer_stat st;
        ect_push_consumer_stats(b, &st);
        if (st.expired >= 1) break;
        nap(10);
    }

    ect_pool *poola = ect_push_consumer_pool(a), *poolb = ect_push_consumer_pool(b);
    uint64_t capa = ect_pool_capacity(poola), capb = ect_pool_capacity(poolb);
    uint8_t *snapa = malloc(capa), *snapb = malloc(capb);
    memcpy(snapa, ect_pool_base(poola), capa);
    memcpy(snapb, ect_pool_base(poolb), capb);
    ect_push_consumer_stat sa0, sb0;
    ect_push_consumer_stats(a, &sa0);
    ect_push_consumer_stats(b, &sb0);

    hostile h = {.live = {&L0, &L1},
                 .stale = {&C, &X, NULL},
                 .base = (uint64_t)(uintptr_t)ect_pool_base(poola),
                 .cap = capa,
                 .seed = 0x5eed};
    uint64_t acc = attack(bad, L0.session, &h, ATTEMPTS_MAIN);
    hostile hb = {.live = {NULL, NULL},
                  .stale = {&E, NULL, NULL},
                  .base = (uint64_t)(uintptr_t)ect_pool_base(poolb),
                  .cap = capb,
                  .seed = 0xbad};
    acc += attack(bad, E.session, &hb, ATTEMPTS_EXPIRED);
    assert_int_equal(acc, 0);

    /* Counted by the targets: every attempt. */
    ect_push_consumer_stat sa1, sb1;
    ect_push_consumer_stats(a, &sa1);
    ect_push_consumer_stats(b, &sb1);
    assert_int_equal(sa1.writes_refused - sa0.writes_refused, ATTEMPTS_MAIN);
    assert_int_equal(sb1.writes_refused - sb0.writes_refused, ATTEMPTS_EXPIRED);
    /* Not one byte of either pool changed. */
    assert_memory_equal(snapa, ect_pool_base(poola), capa);
    assert_memory_equal(snapb, ect_pool_base(poolb), capb);

    /* The live key still writes its own range (the refusals were the keys,
     * not a dead data plane), and the item is served as written. */
    uint8_t *src2 = malloc(NB);
    test_fill_pattern(src2, NB, 7);
    write_ok(good, &L0, src2, NB);
    complete(cli, pa, &L0);
    /* A second complete is fine, but its key is stale now. */
    int st1 = 0;
    ect_write w1 = {src, L0.dst, 16, L0.key};
    assert_int_not_equal(ect_xport_write_batch(bad, L0.session, &w1, 1, &st1), 0);
    assert_int_not_equal(st1, 0);

    /* A later push of C's content is answered from the resident copy with
     * C's bytes: nothing the hostile writer sent reached it. */
    ect_push_view v;
    assert_int_equal(ect_push_consumer_take(a, "t-c", &v), 0);
    assert_true(test_check_pattern(v.data, NB, 42));
    assert_int_equal(ect_push_consumer_release(a, &v), 0);
    rsv C2;
    reserve(cli, pa, "t-c2", "h-c", &C2, false);
    assert_int_equal(ect_push_consumer_take(a, "t-c2", &v), 0);
    assert_true(test_check_pattern(v.data, NB, 42));
    assert_int_equal(ect_push_consumer_release(a, &v), 0);
    assert_int_equal(ect_push_consumer_take(a, "t-l0", &v), 0);
    assert_true(test_check_pattern(v.data, NB, 7));
    assert_int_equal(ect_push_consumer_release(a, &v), 0);

    if (strcmp(transport, "shm") == 0) {
        /* The producer's side mapped the windows it wrote (C, L0), each
         * within two pages of its size, and never a whole pool file. */
        long pg = sysconf(_SC_PAGESIZE);
        int whole, small;
        pool_maps(POOL, NB + 2 * (uint64_t)pg, &whole, &small);
        assert_int_equal(whole, 2); /* the two consumers' own pools */
        assert_true(small >= 1);
    }
    cancel(cli, pa, &L1);
    free(src);
    free(src2);
    free(snapa);
    free(snapb);
    ctl_client_close(cli);
    ect_xport_close(good);
    ect_xport_close(bad);
    zmq_ctx_term(zctx);
    ect_push_consumer_close(a);
    ect_push_consumer_close(b);
}

/* ---- with data-plane keys */

static char keyroot[] = "/tmp/ect-hostile-keys-XXXXXX";
static char kd_t[80], kd_good[80], kd_bad[80];

/* Key directories: the target accepts "good" only; "bad" accepts the target
 * (so it would talk), but the target does not accept it. */
static void make_keys(void) {
    if (kd_t[0]) return;
    assert_non_null(mkdtemp(keyroot));
    snprintf(kd_t, sizeof kd_t, "%s/target", keyroot);
    snprintf(kd_good, sizeof kd_good, "%s/good", keyroot);
    snprintf(kd_bad, sizeof kd_bad, "%s/bad", keyroot);
    assert_int_equal(ect_keygen(kd_t, NULL), 0);
    assert_int_equal(ect_keygen(kd_good, NULL), 0);
    assert_int_equal(ect_keygen(kd_bad, NULL), 0);
    test_accept_key(kd_t, "good", kd_good);
    test_accept_key(kd_good, "target", kd_t);
    test_accept_key(kd_bad, "target", kd_t);
}

static ect_xport *open_keyed(const char *transport, const char *dir) {
    ect_xport_opts o;
    ect_xport_opts_init(&o);
    o.curve_keys = dir;
    ect_xport *x = NULL;
    if (ect_xport_open(transport, &o, &x) != 0) fail_msg("open: %s", ect_last_error());
    return x;
}

/* A window of the pool at offset off, as a reservation the test holds. */
static void window(ect_xport *t, const char *pool_key, uint8_t *base, uint64_t off, rsv *v) {
    memset(v, 0, sizeof *v);
    char key[ECT_XPORT_KEY_MAX];
    assert_int_equal(xp_window_open(t, pool_key, off, NB, key), 0);
    assert_true(strlen(key) < sizeof v->key);
    memcpy(v->key, key, strlen(key) + 1);
    snprintf(v->session, sizeof v->session, "%s", ect_xport_session(t));
    v->dst = (uint64_t)(uintptr_t)(base + off);
}

static void run_keyed(const char *transport) {
    make_keys();
    ect_xport *t = open_keyed(transport, kd_t);
    int fd = memfd_create("hostile-keyed-pool", MFD_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, POOL), 0);
    uint8_t *base = mmap(NULL, POOL, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(base != MAP_FAILED);
    test_fill_pattern(base, POOL, 99);
    char pool_key[ECT_XPORT_KEY_MAX];
    assert_int_equal(ect_xport_register(t, base, POOL, fd, 0, pool_key), 0);
    assert_int_equal(xp_region_set_private(t, pool_key), 0);
    rsv L0, L1, C, X;
    window(t, pool_key, base, 0, &L0);
    window(t, pool_key, base, 2 * NB, &L1);
    window(t, pool_key, base, 4 * NB, &C);
    window(t, pool_key, base, 6 * NB, &X);
    ect_xport *good = open_keyed(transport, kd_good);
    uint8_t *src = malloc(NB);
    test_fill_pattern(src, NB, 5);
    write_ok(good, &C, src, NB); /* C: written, then closed (completed) */
    assert_int_equal(xp_window_close(t, C.key), 0);
    assert_int_equal(xp_window_close(t, X.key), 0); /* X: cancelled */
    uint8_t *snap = malloc(POOL);
    memcpy(snap, base, POOL);

    /* An attacker holding an accepted key: sessions, but no write lands. */
    ect_xport *insider = open_keyed(transport, kd_good);
    uint64_t ref0 = xp_refused(t);
    hostile h = {.live = {&L0, &L1},
                 .stale = {&C, &X, NULL},
                 .base = (uint64_t)(uintptr_t)base,
                 .cap = POOL,
                 .seed = 0x6eed};
    assert_int_equal(attack(insider, L0.session, &h, ATTEMPTS_KEYED), 0);
    assert_int_equal(xp_refused(t) - ref0, ATTEMPTS_KEYED);
    assert_memory_equal(snap, base, POOL);

    /* An attacker without an accepted key: not even a session. Its batches
     * fail at the handshake, never reaching the region check. */
    ect_xport *outsider = open_keyed(transport, kd_bad);
    uint64_t auth0 = xp_auth_refused(t), ref1 = xp_refused(t);
    hostile ho = h;
    ho.seed = 0xbadbad;
    assert_int_equal(attack(outsider, L0.session, &ho, ATTEMPTS_KEYLESS), 0);
    int st = 0;
    ect_write w = {src, L0.dst, NB, L0.key}; /* even the right key and range */
    assert_err(ect_xport_write_batch(outsider, L0.session, &w, 1, &st), ECT_EACCES,
               "does not accept our key");
    assert_int_equal(xp_refused(t), ref1);
    for (int k = 0; k < 60000 && xp_auth_refused(t) - auth0 < ATTEMPTS_KEYLESS / BATCH + 1; k++)
        nap(1);
    assert_true(xp_auth_refused(t) - auth0 >= ATTEMPTS_KEYLESS / BATCH + 1);
    /* ... and one without keys at all gets no session either. */
    ect_xport *plain = NULL;
    assert_int_equal(ect_xport_open(transport, NULL, &plain), 0);
    assert_err(ect_xport_write_batch(plain, L0.session, &w, 1, &st), ECT_EACCES,
               "requires data-plane keys");
    assert_memory_equal(snap, base, POOL);

    /* The legitimate writer still lands its own window. */
    write_ok(good, &L0, src, NB);
    assert_true(test_check_pattern(base, NB, 5));
    ect_xport_close(plain);
    ect_xport_close(outsider);
    ect_xport_close(insider);
    ect_xport_close(good);
    xp_window_close(t, L0.key);
    xp_window_close(t, L1.key);
    assert_int_equal(ect_xport_unregister(t, pool_key), 0);
    ect_xport_close(t);
    munmap(base, POOL);
    close(fd);
    free(src);
    free(snap);
}

static void test_hostile_tcp_keys(void **state) {
    (void)state;
    run_keyed("tcp");
}

static void test_hostile_shm_keys(void **state) {
    (void)state;
    run_keyed("shm");
}

static int cleanup_keys(void **state) {
    (void)state;
    if (!kd_t[0]) return 0;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", keyroot);
    return system(cmd) == 0 ? 0 : -1;
}

static void test_hostile_tcp(void **state) {
    (void)state;
    run("tcp");
}

static void test_hostile_shm(void **state) {
    (void)state;
    run("shm");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hostile_tcp),
        cmocka_unit_test(test_hostile_shm),
        cmocka_unit_test(test_hostile_tcp_keys),
        cmocka_unit_test(test_hostile_shm_keys),
    };
    return cmocka_run_group_tests(tests, NULL, cleanup_keys);
}
