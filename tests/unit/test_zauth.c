/*
 * Tests for authenticated control and events (util/zauth, docs/SECURITY.md):
 * with keys on, a client with no key (plain ZMQ), with an unknown key, gets
 * nothing on any socket of either generation, while accepted clients work;
 * the server-key probe finds the right key among several; in plain mode the
 * push event port serves our scheduler and no stray PULL, and with
 * event_auth_off an upstream-style plain PULL gets events again; a producer
 * with keys closes at once while a shard holds its request unanswered.
 *
 * "Gets nothing" is checked by event, never by waiting: a stray socket's
 * monitor reports its handshake failed (or the peer closed it) before the
 * events are sent, and after the accepted receiver has every event, the
 * stray's queue is empty.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "pull/pull_internal.h"
#include "push/control_client.h"
#include "testutil.h"
#include "ctl_req.h"
#include "util/keys.h"
#include "util/util.h"
#include "util/zauth.h"

#define DEADLINE_MS 60000

typedef struct keydirs {
    char root[128];
    char srv[160], cli[160], unk[160], multi[160], other[160];
} keydirs;

/* srv accepts cli (and multi); cli, unk and multi accept srv; unk is accepted
 * by nobody; multi also accepts `other` (two accepted keys: the probe). */
static keydirs *make_keys(void) {
    keydirs *k = calloc(1, sizeof *k);
    snprintf(k->root, sizeof k->root, "/tmp/ect-test-zauth-XXXXXX");
    assert_non_null(mkdtemp(k->root));
    snprintf(k->srv, sizeof k->srv, "%s/srv", k->root);
    snprintf(k->cli, sizeof k->cli, "%s/cli", k->root);
    snprintf(k->unk, sizeof k->unk, "%s/unk", k->root);
    snprintf(k->multi, sizeof k->multi, "%s/multi", k->root);
    snprintf(k->other, sizeof k->other, "%s/other", k->root);
    const char *all[] = {k->srv, k->cli, k->unk, k->multi, k->other};
    for (size_t i = 0; i < 5; i++) assert_int_equal(ect_keygen(all[i], NULL), 0);
    test_accept_key(k->srv, "cli", k->cli);
    test_accept_key(k->srv, "multi", k->multi);
    test_accept_key(k->cli, "srv", k->srv);
    test_accept_key(k->unk, "srv", k->srv);
    test_accept_key(k->multi, "a-other", k->other); /* sorted first: the probe must skip it */
    test_accept_key(k->multi, "b-srv", k->srv);
    test_accept_key(k->other, "multi", k->multi);
    return k;
}

static void free_keys(keydirs *k) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", k->root);
    assert_int_equal(system(cmd), 0);
    free(k);
}

static ect_keyset *load(const char *dir) {
    ect_keyset *ks = NULL;
    if (ect_keys_load(dir, &ks)) fail_msg("load %s: %s", dir, ect_last_error());
    return ks;
}

/* ------------------------------------------------------------ strays */

/* A raw socket of `type` to port; curve: NULL (plain ZMQ) or a key set that
 * names srvkey as the server. With a monitor to see the handshake end. */
typedef struct stray {
    void *s, *mon;
} stray;

static void stray_open(stray *t, void *z, int type, int port, const ect_keyset *curve,
                       const char *srvkey, const char *plain_secret) {
    static int seq;
    char mep[64], ep[64];
    snprintf(mep, sizeof mep, "inproc://stray-%d", seq++);
    t->s = zmq_socket(z, type);
    assert_non_null(t->s);
    int zero = 0;
    zmq_setsockopt(t->s, ZMQ_LINGER, &zero, sizeof zero);
    if (type == ZMQ_SUB) zmq_setsockopt(t->s, ZMQ_SUBSCRIBE, "", 0);
    if (curve) assert_int_equal(zauth_curve_client(t->s, curve, srvkey), 0);
    if (plain_secret) assert_int_equal(zauth_plain_client(t->s, plain_secret), 0);
    assert_int_equal(zmq_socket_monitor(t->s, mep, ZMQ_EVENT_ALL), 0);
    t->mon = zmq_socket(z, ZMQ_PAIR);
    zmq_setsockopt(t->mon, ZMQ_LINGER, &zero, sizeof zero);
    assert_int_equal(zmq_connect(t->mon, mep), 0);
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
    assert_int_equal(zmq_connect(t->s, ep), 0);
}

/* Waits for the handshake's end: returns the event (HANDSHAKE_SUCCEEDED,
 * HANDSHAKE_FAILED_*, or DISCONNECTED when the server just closed). */
static int stray_verdict(stray *t) {
    uint64_t end = ect_now_ms() + DEADLINE_MS;
    while (ect_now_ms() < end) {
        zmq_pollitem_t it = {.socket = t->mon, .events = ZMQ_POLLIN};
        if (zmq_poll(&it, 1, 1000) <= 0) continue;
        zmq_msg_t m;
        zmq_msg_init(&m);
        assert_true(zmq_msg_recv(&m, t->mon, 0) >= 0);
        uint16_t ev = 0;
        memcpy(&ev, zmq_msg_data(&m), 2);
        zmq_msg_close(&m);
        zmq_msg_init(&m);
        zmq_msg_recv(&m, t->mon, 0); /* the endpoint frame */
        zmq_msg_close(&m);
        if (ev == ZMQ_EVENT_HANDSHAKE_SUCCEEDED || ev == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH ||
            ev == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL ||
            ev == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL || ev == ZMQ_EVENT_DISCONNECTED)
            return ev;
    }
    fail_msg("no handshake verdict within %d ms", DEADLINE_MS);
    return 0;
}

static void stray_refused(stray *t) {
    int ev = stray_verdict(t);
    if (ev == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) fail_msg("a stray client passed the handshake");
}

/* Nothing is queued on the stray (after the rightful receiver got all). */
static void stray_empty(stray *t) {
    char buf[64];
    assert_int_equal(zmq_recv(t->s, buf, sizeof buf, ZMQ_DONTWAIT), -1);
    assert_int_equal(zmq_errno(), EAGAIN);
}

static void stray_close(stray *t) {
    zmq_socket_monitor(t->s, NULL, 0);
    zmq_close(t->s);
    zmq_close(t->mon);
}

/* ------------------------------------------------------------- push */

static ect_push_consumer *open_consumer(const char *keys, int event_auth_off) {
    ect_push_consumer_opts o;
    ect_push_consumer_opts_init(&o);
    o.ec_port = 0;
    o.pool_size = 1 << 20;
    o.curve_keys = keys;
    o.event_auth_off = event_auth_off;
    ect_push_consumer *c = NULL;
    if (ect_push_consumer_open(&o, &c)) fail_msg("consumer open: %s", ect_last_error());
    return c;
}

static ect_push_scheduler *open_scheduler(int port, const char *keys) {
    ect_push_scheduler_opts o;
    ect_push_scheduler_opts_init(&o);
    o.consumer_host = "127.0.0.1";
    o.consumer_port = port;
    o.curve_keys = keys;
    o.accept_any = 1;
    o.min_drain_interval_ms = 0;
    ect_push_scheduler *s = NULL;
    if (ect_push_scheduler_open(&o, &s)) fail_msg("scheduler open: %s", ect_last_error());
    return s;
}

/* Reserves and completes transfer tid through cli: one readiness event. */
static void make_ready(ctl_client *cli, int port, const char *tid) {
    wire_ctl_request q = test_reserve_req(tid, tid, 4, 4, "bfloat16");
    wire_ctl_reply r;
    if (ctl_call_ok(cli, "127.0.0.1", port, &q, &r)) fail_msg("reserve: %s", ect_last_error());
    wire_ctl_request c = {.op = WIRE_OP_COMPLETE};
    snprintf(c.u.complete.transfer_id, sizeof c.u.complete.transfer_id, "%s", tid);
    snprintf(c.u.complete.reservation_id, sizeof c.u.complete.reservation_id, "%s",
             r.u.reserve.reservation_id);
    wire_ctl_reply_clear(&r);
    if (ctl_call_ok(cli, "127.0.0.1", port, &c, &r)) fail_msg("complete: %s", ect_last_error());
    assert_true(r.u.complete.became_ready);
    wire_ctl_reply_clear(&r);
}

/* Polls the scheduler until it has n items ready (accept_any). */
static void sched_gets(ect_push_scheduler *s, int n) {
    uint64_t end = ect_now_ms() + DEADLINE_MS;
    int got = 0;
    while (got < n && ect_now_ms() < end) {
        ect_push_scheduler_poll(s);
        ect_push_sched_item it;
        while (ect_push_scheduler_next(s, &it) == 0) got++;
        if (got < n) usleep(2000);
    }
    assert_int_equal(got, n);
}

/* Waits until the scheduler discovered its shard and connected its PULL. */
static void sched_connected(ect_push_scheduler *s) {
    uint64_t end = ect_now_ms() + DEADLINE_MS;
    ect_push_scheduler_stat st;
    do {
        ect_push_scheduler_poll(s);
        ect_push_scheduler_stats(s, &st);
        if (st.shards == 1) return;
        usleep(2000);
    } while (ect_now_ms() < end);
    fail_msg("scheduler never reached the shard");
}

static ctl_client *client(void *z, const ect_keyset *ks, int timeout_ms) {
    ctl_client *c = NULL;
    assert_int_equal(ctl_client_open(z, timeout_ms, &c), 0);
    ctl_client_fail_fast(c, true);
    ctl_client_set_keys(c, ks);
    return c;
}

static void test_push_keys_on(void **state) {
    (void)state;
    keydirs *k = make_keys();
    ect_push_consumer *c = open_consumer(k->srv, 0);
    int port = ect_push_consumer_port(c), evport = ect_push_consumer_event_port(c);
    void *z = zmq_ctx_new();
    ect_keyset *cli = load(k->cli), *unk = load(k->unk), *srv = load(k->srv);

    /* the control REP: accepted key answered, the others refused at once */
    ctl_client *good = client(z, cli, 30000);
    wire_ctl_request q = {.op = WIRE_OP_EVENT_PORT};
    wire_ctl_reply r;
    assert_int_equal(ctl_call_ok(good, "127.0.0.1", port, &q, &r), 0);
    assert_int_equal(r.u.event_port, evport);
    assert_string_equal(r.event_secret, ""); /* keys on: CURVE, no secret on the wire */
    wire_ctl_reply_clear(&r);
    ctl_client *bad = client(z, unk, 30000);
    assert_err(ctl_call(bad, "127.0.0.1", port, &q, &r), ECT_EACCES, "refused our CurveZMQ key");
    ctl_client *plain = client(z, NULL, 30000);
    int rc = ctl_call(plain, "127.0.0.1", port, &q, &r);
    assert_true(rc == ECT_ECONNREFUSED || rc == ECT_ETIMEDOUT);
    ctl_client_close(bad);
    ctl_client_close(plain);
    char *json = NULL;
    assert_err(ect_push_status_keyed("127.0.0.1", port, 30000, k->unk, &json), ECT_EACCES,
               "refused");
    assert_null(json);
    assert_int_equal(ect_push_status_keyed("127.0.0.1", port, 30000, k->cli, &json), 0);
    assert_non_null(strstr(json, "\"shard\""));
    free(json);
    assert_err(ect_push_status_keyed("127.0.0.1", port, 30000, "/nonexistent-keys", &json),
               ECT_EINVAL, "/nonexistent-keys");

    /* the event PUSH: strays (no key, unknown key, a REQ-less raw PULL) fail
     * the handshake; the accepted scheduler gets every event */
    stray s_plain, s_unk;
    stray_open(&s_plain, z, ZMQ_PULL, evport, NULL, NULL, NULL);
    stray_open(&s_unk, z, ZMQ_PULL, evport, unk, srv->pub_z85, NULL);
    stray_refused(&s_plain);
    assert_int_equal(stray_verdict(&s_unk), ZMQ_EVENT_HANDSHAKE_FAILED_AUTH);
    ect_push_scheduler *s = open_scheduler(port, k->cli);
    sched_connected(s);
    for (int i = 0; i < 8; i++) {
        char tid[32];
        snprintf(tid, sizeof tid, "t-keys-%d", i);
        make_ready(good, port, tid);
    }
    sched_gets(s, 8);
    stray_empty(&s_plain);
    stray_empty(&s_unk);
    stray_close(&s_plain);
    stray_close(&s_unk);

    /* several accepted keys: the probe finds the one the server holds */
    ect_keyset *multi = load(k->multi);
    char ep[64], found[ECT_KEY_Z85_LEN + 1];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
    zauth_local_server_gone(port); /* as a client in another process would see it */
    assert_int_equal(zauth_server_key(z, multi, ZMQ_REQ, ep, 30000, found), 0);
    assert_string_equal(found, srv->pub_z85);
    ctl_client *m = client(z, multi, 30000);
    assert_int_equal(ctl_call_ok(m, "127.0.0.1", port, &q, &r), 0);
    wire_ctl_reply_clear(&r);
    ctl_client_close(m);
    ect_keys_free(multi);

    ctl_client_close(good);
    ect_push_scheduler_close(s);
    ect_push_consumer_close(c);
    ect_keys_free(cli);
    ect_keys_free(unk);
    ect_keys_free(srv);
    zmq_ctx_term(z);
    free_keys(k);
}

/* Plain mode: the event port asks the secret from the event_port reply. */
static void test_push_plain_event_port(void **state) {
    (void)state;
    ect_push_consumer *c = open_consumer(NULL, 0);
    int port = ect_push_consumer_port(c), evport = ect_push_consumer_event_port(c);
    void *z = zmq_ctx_new();
    ctl_client *cli = client(z, NULL, 30000);
    int got_port = 0;
    char secret[WIRE_SECRET_MAX + 1];
    assert_int_equal(ctl_event_port_secret(cli, "127.0.0.1", port, &got_port, secret), 0);
    assert_int_equal(got_port, evport);
    assert_int_equal(strlen(secret), ZAUTH_SECRET_LEN);

    stray s_plain, s_wrong;
    stray_open(&s_plain, z, ZMQ_PULL, evport, NULL, NULL, NULL);
    stray_open(&s_wrong, z, ZMQ_PULL, evport, NULL, NULL, "0123456789abcdef0123456789abcdef");
    stray_refused(&s_plain);
    assert_int_equal(stray_verdict(&s_wrong), ZMQ_EVENT_HANDSHAKE_FAILED_AUTH);
    ect_push_scheduler *s = open_scheduler(port, NULL);
    sched_connected(s);
    for (int i = 0; i < 20; i++) {
        char tid[32];
        snprintf(tid, sizeof tid, "t-plain-%d", i);
        make_ready(cli, port, tid);
    }
    sched_gets(s, 20); /* every event: none went to a stray */
    stray_empty(&s_plain);
    stray_empty(&s_wrong);
    stray_close(&s_plain);
    stray_close(&s_wrong);
    ect_push_scheduler_close(s);
    ctl_client_close(cli);
    ect_push_consumer_close(c);
    zmq_ctx_term(z);
}

/* event_auth_off: what upstream's scheduler does (a plain PULL) works. */
static void test_push_event_auth_off_serves_upstream(void **state) {
    (void)state;
    ect_push_consumer *c = open_consumer(NULL, 1);
    int port = ect_push_consumer_port(c), evport = ect_push_consumer_event_port(c);
    void *z = zmq_ctx_new();
    ctl_client *cli = client(z, NULL, 30000);
    int got_port = 0;
    char secret[WIRE_SECRET_MAX + 1];
    assert_int_equal(ctl_event_port_secret(cli, "127.0.0.1", port, &got_port, secret), 0);
    assert_string_equal(secret, ""); /* nothing asked: the reply is upstream's */
    stray up;
    stray_open(&up, z, ZMQ_PULL, evport, NULL, NULL, NULL);
    assert_int_equal(stray_verdict(&up), ZMQ_EVENT_HANDSHAKE_SUCCEEDED);
    make_ready(cli, port, "t-upstream");
    char buf[2048];
    int timeout = DEADLINE_MS;
    zmq_setsockopt(up.s, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
    int n = zmq_recv(up.s, buf, sizeof buf - 1, 0);
    assert_true(n > 0);
    buf[n] = '\0';
    assert_non_null(strstr(buf, "t-upstream"));
    stray_close(&up);
    ctl_client_close(cli);
    ect_push_consumer_close(c);
    zmq_ctx_term(z);
}

/* A key directory that does not load fails every role's open, naming it. */
static void test_bad_key_dir_fails_open(void **state) {
    (void)state;
    ect_push_consumer_opts o;
    ect_push_consumer_opts_init(&o);
    o.ec_port = 0;
    o.pool_size = 1 << 20;
    o.curve_keys = "/nonexistent-ect-dir";
    ect_push_consumer *c = NULL;
    assert_err(ect_push_consumer_open(&o, &c), ECT_EINVAL, "/nonexistent-ect-dir");
    assert_null(c);
    ect_push_scheduler_opts so;
    ect_push_scheduler_opts_init(&so);
    so.consumer_host = "127.0.0.1";
    so.consumer_port = 1;
    so.curve_keys = "/nonexistent-ect-dir";
    ect_push_scheduler *s = NULL;
    assert_err(ect_push_scheduler_open(&so, &s), ECT_EINVAL, "/nonexistent-ect-dir");
    ect_push_producer_opts po;
    ect_push_producer_opts_init(&po);
    po.curve_keys = "/nonexistent-ect-dir";
    ect_push_producer *p = NULL;
    assert_err(ect_push_producer_open(&po, &p), ECT_EINVAL, "/nonexistent-ect-dir");
    ect_pull_producer_opts qo;
    ect_pull_producer_opts_init(&qo);
    qo.curve_keys = "/nonexistent-ect-dir";
    qo.port = 0;
    ect_pull_producer *q = NULL;
    assert_err(ect_pull_producer_open(&qo, &q), ECT_EINVAL, "/nonexistent-ect-dir");
    ect_pull_scheduler_opts ro;
    ect_pull_scheduler_opts_init(&ro);
    ro.producer = "127.0.0.1:1";
    ro.curve_keys = "/nonexistent-ect-dir";
    ect_pull_scheduler *r = NULL;
    assert_err(ect_pull_scheduler_open(&ro, &r), ECT_EINVAL, "/nonexistent-ect-dir");
    ect_pull_consumer_opts co;
    ect_pull_consumer_opts_init(&co);
    co.producer = "127.0.0.1:1";
    co.pool_size = 1 << 20;
    co.curve_keys = "/nonexistent-ect-dir";
    ect_pull_consumer *pc = NULL;
    assert_err(ect_pull_consumer_open(&co, &pc), ECT_EINVAL, "/nonexistent-ect-dir");
}

/* Keys on, a shard that takes a request and never answers (a raw CURVE
 * REP holding the shard's keys): the producer's close, with a ten-minute
 * control timeout, cuts its libzmq REQ exchange short as it does the
 * plain one (test_push_producer test_close_during_a_hung_exchange): close
 * returns and the borrowed source is released exactly once. Nothing is
 * timed: a close that waited the exchange out runs into the test's
 * timeout. */
static atomic_int hung_released;
static void on_hung_release(void *user, const void *data, uint64_t nbytes) {
    (void)nbytes;
    assert_ptr_equal(user, data);
    atomic_fetch_add(&hung_released, 1);
}

static void test_push_close_keyed_hung_shard(void **state) {
    (void)state;
    keydirs *k = make_keys();
    ect_keyset *srv = load(k->srv);
    void *z = zmq_ctx_new();
    zauth *za = NULL;
    assert_int_equal(zauth_open(z, srv, "hung shard", &za), 0);
    void *rep = zmq_socket(z, ZMQ_REP);
    int zero = 0;
    zmq_setsockopt(rep, ZMQ_LINGER, &zero, sizeof zero);
    assert_int_equal(zauth_curve_server(rep, srv), 0);
    assert_int_equal(zmq_bind(rep, "tcp://127.0.0.1:*"), 0);
    char ep[64], consumer[64];
    size_t eplen = sizeof ep;
    assert_int_equal(zmq_getsockopt(rep, ZMQ_LAST_ENDPOINT, ep, &eplen), 0);
    snprintf(consumer, sizeof consumer, "127.0.0.1:%s", strrchr(ep, ':') + 1);

    ect_push_producer_opts o;
    ect_push_producer_opts_init(&o);
    o.curve_keys = k->cli;
    o.control_timeout_ms = 600000;
    ect_push_producer *p = NULL;
    assert_int_equal(ect_push_producer_open(&o, &p), 0);
    uint64_t shape[1] = {2048};
    void *data = malloc(4096);
    memset(data, 7, 4096);
    ect_push_item it = {0};
    it.transfer_id = "hung-keyed-0";
    it.consumer = consumer;
    it.mm_hash = "h-hung-keyed-0";
    it.shape = shape;
    it.ndim = 1;
    it.dtype = "bfloat16";
    it.nbytes = 4096;
    it.data = data;
    it.release = on_hung_release;
    it.release_user = data;
    atomic_store(&hung_released, 0);
    assert_int_equal(ect_push_producer_reserve(p, &it), 0);
    assert_int_equal(ect_push_producer_flush(p), 1);
    /* the producer's first request arrives (the handshake passed); no answer */
    zmq_pollitem_t pi = {.socket = rep, .events = ZMQ_POLLIN};
    assert_int_equal(zmq_poll(&pi, 1, DEADLINE_MS), 1);
    char req[4096];
    assert_true(zmq_recv(rep, req, sizeof req, 0) > 0);
    ect_push_producer_close(p);
    assert_int_equal(atomic_load(&hung_released), 1);
    free(data);
    zmq_close(rep);
    zauth_close(za);
    zmq_ctx_term(z);
    ect_keys_free(srv);
    free_keys(k);
}

/* -------------------------------------------------------------- pull */

static void on_release(void *user, const void *data) {
    (void)user;
    free((void *)data);
}

static void test_pull_keys_on(void **state) {
    (void)state;
    keydirs *k = make_keys();
    ect_pull_producer_opts po;
    ect_pull_producer_opts_init(&po);
    po.port = 0;
    po.pool_size = 4 << 20;
    po.curve_keys = k->srv;
    ect_pull_producer *p = NULL;
    if (ect_pull_producer_open(&po, &p)) fail_msg("producer: %s", ect_last_error());
    int port = ect_pull_producer_port(p);
    zauth_local_server_gone(port); /* clients here must find the key as remote ones do */
    void *z = zmq_ctx_new();
    ect_keyset *unk = load(k->unk), *srv = load(k->srv);
    /* strays on the ROUTER and the PUB, before anything is announced */
    stray r_plain, r_unk, p_plain, p_unk;
    stray_open(&r_plain, z, ZMQ_DEALER, port, NULL, NULL, NULL);
    stray_open(&r_unk, z, ZMQ_DEALER, port, unk, srv->pub_z85, NULL);
    stray_open(&p_plain, z, ZMQ_SUB, port + 1, NULL, NULL, NULL);
    stray_open(&p_unk, z, ZMQ_SUB, port + 1, unk, srv->pub_z85, NULL);
    stray_refused(&r_plain);
    stray_refused(&p_plain);
    assert_int_equal(stray_verdict(&r_unk), ZMQ_EVENT_HANDSHAKE_FAILED_AUTH);
    assert_int_equal(stray_verdict(&p_unk), ZMQ_EVENT_HANDSHAKE_FAILED_AUTH);

    size_t n = 4096;
    void *d = malloc(n);
    test_fill_pattern(d, n, 7);
    uint64_t shape[1] = {n};
    assert_int_equal(ect_pull_producer_save(p, "h-keys", d, n, shape, 1, "uint8", on_release, NULL),
                     0);
    char addr[32];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    /* accepted: the scheduler learns it, the consumer loads it */
    ect_pull_scheduler_opts so;
    ect_pull_scheduler_opts_init(&so);
    so.producer = addr;
    so.curve_keys = k->multi; /* two accepted keys: probes the ROUTER */
    ect_pull_scheduler *s = NULL;
    if (ect_pull_scheduler_open(&so, &s)) fail_msg("scheduler: %s", ect_last_error());
    ect_pull_meta meta;
    uint64_t end = ect_now_ms() + DEADLINE_MS;
    int has;
    while ((has = ect_pull_scheduler_has(s, "h-keys", &meta)) == 0 && ect_now_ms() < end)
        usleep(2000);
    assert_int_equal(has, 1);
    ect_pull_consumer_opts co;
    ect_pull_consumer_opts_init(&co);
    co.producer = addr;
    co.pool_size = 1 << 20;
    co.curve_keys = k->cli;
    ect_pull_consumer *c = NULL;
    if (ect_pull_consumer_open(&co, &c)) fail_msg("consumer: %s", ect_last_error());
    ect_pull_view v;
    if (ect_pull_consumer_load(c, "h-keys", &meta, &v)) fail_msg("load: %s", ect_last_error());
    assert_true(test_check_pattern(v.data, n, 7));
    assert_int_equal(ect_pull_consumer_release(c, "h-keys"), 0);
    /* a set of two after that first completion (it offered ect_batch): one
     * ECTransferPullBatch and its ECTransferDone over libzmq's DEALER and ROUTER */
    void *d2 = malloc(n);
    test_fill_pattern(d2, n, 8);
    assert_int_equal(
        ect_pull_producer_save(p, "h-keys-2", d2, n, shape, 1, "uint8", on_release, NULL), 0);
    assert_int_equal(ect_pull_producer_flush(p, DEADLINE_MS), 0);
    assert_int_equal(ect_pool_remove(ect_pull_consumer_pool(c), "h-keys"), 0);
    const char *hs[2] = {"h-keys", "h-keys-2"};
    ect_pull_meta ms[2] = {meta, meta};
    ect_pull_view vs[2];
    int sts[2];
    if (ect_pull_consumer_load_many(c, 2, hs, ms, vs, sts))
        fail_msg("load_many: %s", ect_last_error());
    assert_true(test_check_pattern(vs[0].data, n, 7) && test_check_pattern(vs[1].data, n, 8));
    assert_int_equal(ect_pull_consumer_release(c, "h-keys"), 0);
    assert_int_equal(ect_pull_consumer_release(c, "h-keys-2"), 0);
    uint64_t batches, dones;
    pull_producer_batches(p, &batches, &dones);
    assert_int_equal(batches, 1);
    assert_true(dones >= 1);
    ect_pull_consumer_close(c);
    /* an unknown key: the load fails, nothing is written */
    co.curve_keys = k->unk;
    co.timeout_ms = 2000; /* only how long the refused load waits; no timing asserted */
    if (ect_pull_consumer_open(&co, &c)) fail_msg("consumer: %s", ect_last_error());
    assert_int_not_equal(ect_pull_consumer_load(c, "h-keys", &meta, &v), 0);
    ect_pull_consumer_close(c);
    /* the strays got nothing: no announcement, no reply */
    stray_empty(&r_plain);
    stray_empty(&r_unk);
    stray_empty(&p_plain);
    stray_empty(&p_unk);
    stray_close(&r_plain);
    stray_close(&r_unk);
    stray_close(&p_plain);
    stray_close(&p_unk);
    ect_pull_scheduler_close(s);
    ect_pull_producer_close(p);
    ect_keys_free(unk);
    ect_keys_free(srv);
    zmq_ctx_term(z);
    free_keys(k);
}

/* The ZAP decision alone (a detached handler): the two ways in, every other
 * request refused and counted. */
static void test_decide(void **state) {
    (void)state;
    keydirs *k = make_keys();
    ect_keyset *srv = load(k->srv), *cli = load(k->cli), *unk = load(k->unk);
    zauth *a = NULL;
    assert_int_equal(zauth_open(NULL, srv, "t", &a), 0);
    zauth_set_secret(a, "s3cret");
    char user[64];
#define F(s) {s, sizeof s - 1}
    zauth_frame curve_ok[] = {F("1.0"), F("1"),     F("ect"),      F("127.0.0.1"),
                              F(""),    F("CURVE"), {cli->pub, 32}};
    assert_true(zauth_decide(a, curve_ok, 7, user, sizeof user));
    assert_string_equal(user, "cli");
    zauth_frame curve_self[] = {F("1.0"), F("1"),     F("ect"),      F("127.0.0.1"),
                                F(""),    F("CURVE"), {srv->pub, 32}};
    assert_true(zauth_decide(a, curve_self, 7, user, sizeof user));
    zauth_frame curve_unk[] = {F("1.0"), F("1"),     F("ect"),      F("127.0.0.1"),
                               F(""),    F("CURVE"), {unk->pub, 32}};
    assert_false(zauth_decide(a, curve_unk, 7, user, sizeof user));
    zauth_frame plain_ok[] = {F("1.0"), F("1"),     F("ect"), F("x"),
                              F(""),    F("PLAIN"), F("ect"), F("s3cret")};
    assert_true(zauth_decide(a, plain_ok, 8, user, sizeof user));
    zauth_frame plain_bad[] = {F("1.0"), F("1"),     F("ect"), F("x"),
                               F(""),    F("PLAIN"), F("ect"), F("s3creT")};
    assert_false(zauth_decide(a, plain_bad, 8, user, sizeof user));
    assert_false(zauth_decide(a, plain_ok, 7, user, sizeof user)); /* no password frame */
    zauth_frame null_mech[] = {F("1.0"), F("1"), F("ect"), F("x"), F(""), F("NULL")};
    assert_false(zauth_decide(a, null_mech, 6, user, sizeof user));
    zauth_frame bad_version[] = {F("2.0"), F("1"),     F("ect"), F("x"),
                                 F(""),    F("PLAIN"), F("ect"), F("s3cret")};
    assert_false(zauth_decide(a, bad_version, 8, user, sizeof user));
    assert_false(zauth_decide(a, curve_ok, 0, user, sizeof user));
#undef F
    assert_int_equal(zauth_refusals(a), 6);
    zauth_close(a);
    ect_keys_free(srv);
    ect_keys_free(cli);
    ect_keys_free(unk);
    free_keys(k);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decide),
        cmocka_unit_test(test_push_keys_on),
        cmocka_unit_test(test_push_plain_event_port),
        cmocka_unit_test(test_push_event_auth_off_serves_upstream),
        cmocka_unit_test(test_bad_key_dir_fails_open),
        cmocka_unit_test(test_push_close_keyed_hung_shard),
        cmocka_unit_test(test_pull_keys_on),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
