/*
 * Tests for push/control_server and push/control_client over real sockets on
 * loopback (ephemeral ports): every op of the spec, malformed, unknown,
 * multi-part and oversized frames, the event backlog bound, bind errors,
 * client timeouts with discard-and-reconnect, the peers cache, and the
 * pool's used bytes back at zero after every scenario.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <zmq.h>

#include "testutil.h"
#include "push/control_client.h"
#include "ctl_req.h"
#include "push/control_server.h"
#include "util/util.h"
#include "wire/control_msg.h"

#define CAP (8u << 20)

typedef struct fx {
    void *zctx;
    ect_pool *pool;
    ctl_server *srv;
    ctl_client *cli;
    int port;
} fx;

/* Opens the shard on port. zmq_close hands a listener to the context's
 * I/O thread, which closes its descriptor later: reopening the port of a
 * shard just closed in this process can meet "address in use" for a moment,
 * so a fixed port is retried (60 s, generous) while that is the answer. */
static void fx_open_srv(fx *f, int port, size_t max_events) {
    ctl_server_opts o;
    ctl_server_opts_init(&o);
    o.port = port;
    o.rsv.mem = &rsv_pool_ops;
    o.rsv.mem_ctx = f->pool;
    if (max_events) o.rsv.max_events = max_events;
    o.dst_session = "127.0.0.1:9";
    o.transport = "tcp";
    o.dst_key = "00112233aabbccdd";
    o.pool_base = (uint64_t)(uintptr_t)ect_pool_base(f->pool);
    int rc;
    uint64_t until = ect_now_ms() + 60000;
    while ((rc = ctl_server_open(f->zctx, &o, &f->srv)) == ECT_EEXIST && port != 0 &&
           ect_now_ms() < until)
        usleep(10000);
    assert_int_equal(rc, 0);
    f->port = ctl_server_port(f->srv);
    assert_true(f->port > 0);
}

static void fx_open(fx *f, size_t max_events, int timeout_ms) {
    memset(f, 0, sizeof *f);
    f->zctx = zmq_ctx_new();
    ect_pool_opts po;
    ect_pool_opts_init(&po);
    po.capacity = CAP;
    assert_int_equal(ect_pool_open(&po, &f->pool), 0);
    fx_open_srv(f, 0, max_events);
    assert_int_equal(ctl_client_open(f->zctx, timeout_ms, &f->cli), 0);
}

static uint64_t pool_used(ect_pool *p) {
    ect_pool_stat st;
    ect_pool_stats(p, &st);
    return st.used;
}

static void fx_close(fx *f) {
    ctl_client_close(f->cli);
    if (f->srv) assert_int_equal(ctl_server_check(f->srv), 0);
    ctl_server_close(f->srv);
    assert_int_equal(pool_used(f->pool), 0); /* the table gave every buffer back */
    ect_pool_close(f->pool);
    zmq_ctx_term(f->zctx);
}

static wire_ctl_request reserve_req(const char *tid, const char *hash, uint64_t rows) {
    return test_reserve_req(tid, hash, rows, 64, "bfloat16");
}

/* Raw request over a fresh REQ socket; returns the reply text (caller frees). */
static char *raw_call(fx *f, const void *buf, size_t len) {
    void *s = zmq_socket(f->zctx, ZMQ_REQ);
    int zero = 0, to = 60000; /* a deadline, generous under load */
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_RCVTIMEO, &to, sizeof to);
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", f->port);
    assert_int_equal(zmq_connect(s, ep), 0);
    assert_true(zmq_send(s, buf, len, 0) >= 0);
    char *out = calloc(1, 8192);
    int n = zmq_recv(s, out, 8191, 0);
    assert_true(n > 0);
    zmq_close(s);
    return out;
}

static void *pull_connect(fx *f) {
    void *p = zmq_socket(f->zctx, ZMQ_PULL);
    int zero = 0, to = 3000;
    zmq_setsockopt(p, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(p, ZMQ_RCVTIMEO, &to, sizeof to);
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", ctl_server_event_port(f->srv));
    assert_int_equal(zmq_connect(p, ep), 0);
    return p;
}

static void recv_event(void *pull, wire_event *ev) {
    char buf[4096];
    int n = zmq_recv(pull, buf, sizeof buf, 0);
    assert_true(n > 0);
    assert_int_equal(wire_ctl_decode_event(buf, (size_t)n, ev), 0);
}

/* reserve -> status -> complete -> event -> take/release -> cached reserve. */
static void test_reserve_complete_event(void **state) {
    (void)state;
    fx f;
    fx_open(&f, 0, 5000);
    int ep = 0;
    assert_int_equal(ctl_event_port(f.cli, "127.0.0.1", f.port, &ep), 0);
    assert_int_equal(ep, ctl_server_event_port(f.srv));
    void *pull = pull_connect(&f);

    wire_ctl_request q = reserve_req("t1", "h1", 100);
    wire_ctl_reply r;
    assert_int_equal(ctl_call_ok(f.cli, "127.0.0.1", f.port, &q, &r), 0);
    assert_true(r.u.reserve.write);
    assert_false(r.u.reserve.ready);
    assert_string_equal(r.u.reserve.dst_session, "127.0.0.1:9");
    assert_string_equal(r.u.reserve.transport, "tcp");
    assert_string_equal(r.u.reserve.dst_key, "00112233aabbccdd");
    uint64_t base = (uint64_t)(uintptr_t)ect_pool_base(f.pool);
    assert_true(r.u.reserve.dst_ptr >= base && r.u.reserve.dst_ptr < base + CAP);
    char rid[WIRE_ID_MAX + 1];
    snprintf(rid, sizeof rid, "%s", r.u.reserve.reservation_id);
    memset((void *)(uintptr_t)r.u.reserve.dst_ptr, 0x5a, 100 * 64 * 2); /* "remote write" */
    wire_ctl_reply_clear(&r);
    assert_true(pool_used(f.pool) >= 100 * 64 * 2);

    wire_ctl_request st = {.op = WIRE_OP_STATUS};
    snprintf(st.u.status.transfer_id, sizeof st.u.status.transfer_id, "t1");
    assert_int_equal(ctl_call_ok(f.cli, "127.0.0.1", f.port, &st, &r), 0);
    assert_true(r.u.status.found);
    assert_false(r.u.status.ready);
    assert_string_equal(r.u.status.reservation_id, rid);
    wire_ctl_reply_clear(&r);

    wire_ctl_request c = {.op = WIRE_OP_COMPLETE};
    snprintf(c.u.complete.transfer_id, sizeof c.u.complete.transfer_id, "t1");
    snprintf(c.u.complete.reservation_id, sizeof c.u.complete.reservation_id, "wrong");
    assert_int_equal(ctl_call_ok(f.cli, "127.0.0.1", f.port, &c, &r), 0);
    assert_false(r.u.complete.completed);
    wire_ctl_reply_clear(&r);
    snprintf(c.u.complete.reservation_id, sizeof c.u.complete.reservation_id, "%s", rid);
    assert_int_equal(ctl_call_ok(f.cli, "127.0.0.1", f.port, &c, &r), 0);
    assert_true(r.u.complete.completed);
    assert_true(r.u.complete.became_ready);
    wire_ctl_reply_clear(&r);
    assert_int_equal(ctl_call_ok(f.cli, "127.0.0.1", f.port, &c, &r), 0); /* idempotent */
    assert_true(r.u.complete.completed);
    assert_false(r.u.complete.became_ready);
    wire_ctl_reply_clear(&r);

    wire_event ev;
    recv_event(pull, &ev);
    assert_true(ev.ready);
    assert_string_equal(ev.transfer_id, "t1");
    assert_string_equal(ev.mm_hash, "h1");
    assert_string_equal(ev.reservation_id, rid);
    assert_int_equal(ev.shard, f.port);
    assert_int_equal(ev.tensor.nbytes, 100 * 64 * 2);
    wire_event_clear(&ev);

    rsv_status rs;
    assert_int_equal(ctl_server_take(f.srv, "t1", &rs), 0);
    assert_int_equal(((uint8_t *)ect_pool_base(f.pool))[rs.offset], 0x5a);
    assert_int_equal(ctl_server_release(f.srv, "h1", NULL), 0);

    /* A second transfer of the same hash is answered from the resident copy. */
    q = reserve_req("t2", "h1", 100);
    assert_int_equal(ctl_call_ok(f.cli, "127.0.0.1", f.port, &q, &r), 0);
    assert_true(r.u.reserve.cached);
    assert_true(r.u.reserve.ready);
    assert_false(r.u.reserve.write);
    wire_ctl_reply_clear(&r);
    recv_event(pull, &ev); /* cached reserve publishes at once */
    assert_string_equal(ev.transfer_id, "t2");
    wire_event_clear(&ev);

    /* Cancel both (READY -> CANCELLED), then status answers null. */
    for (int i = 1; i <= 2; i++) {
        wire_ctl_request k = {.op = WIRE_OP_CANCEL};
        snprintf(k.u.cancel.transfer_id, sizeof k.u.cancel.transfer_id, "t%d", i);
        assert_int_equal(ctl_call_ok(f.cli, "127.0.0.1", f.port, &k, &r), 0);
        assert_true(r.u.cancelled);
        wire_ctl_reply_clear(&r);
    }
    assert_int_equal(ctl_call_ok(f.cli, "127.0.0.1", f.port, &st, &r), 0);
    assert_false(r.u.status.found);
    wire_ctl_reply_clear(&r);
    zmq_close(pull);
    fx_close(&f); /* rsv_close frees the resident buffer */
}

static void test_batches_precancel_errors(void **state) {
    (void)state;
    fx f;
    fx_open(&f, 0, 5000);
    /* pre-cancel, then reserve gets the cancelled form */
    wire_ctl_request k = {.op = WIRE_OP_CANCEL};
    snprintf(k.u.cancel.transfer_id, sizeof k.u.cancel.transfer_id, "pc");
    wire_ctl_reply r;
    assert_int_equal(ctl_call_ok(f.cli, "127.0.0.1", f.port, &k, &r), 0);
    wire_ctl_reply_clear(&r);
    /* refresh without abandon is refused with a reply, not silence */
    k.u.cancel.refresh = true;
    assert_int_equal(ctl_call(f.cli, "127.0.0.1", f.port, &k, &r), 0);
    assert_false(r.ok);
    assert_non_null(r.error);
    wire_ctl_reply_clear(&r);

    wire_reserve_item items[3];
    memset(items, 0, sizeof items);
    wire_ctl_request a = reserve_req("pc", "hx", 10);
    wire_ctl_request b = reserve_req("b1", "hb", 10);
    wire_ctl_request c = reserve_req("b2", "hc", 100000); /* 12.8 MB > the 8 MiB pool */
    items[0].req = a.u.reserve;
    items[1].req = b.u.reserve;
    items[2].req = c.u.reserve;
    wire_ctl_request q = {.op = WIRE_OP_RESERVE_BATCH};
    q.u.reserve_batch.n = 3;
    q.u.reserve_batch.items = items;
    assert_int_equal(ctl_call_ok(f.cli, "127.0.0.1", f.port, &q, &r), 0);
    assert_int_equal(r.u.reserve_batch.n, 3);
    assert_true(r.u.reserve_batch.items[0].ok);
    assert_true(r.u.reserve_batch.items[0].result.cancelled);
    assert_true(r.u.reserve_batch.items[1].ok);
    assert_true(r.u.reserve_batch.items[1].result.write);
    assert_false(r.u.reserve_batch.items[2].ok); /* one failure does not fail the others */
    assert_non_null(strstr(r.u.reserve_batch.items[2].error, "EC consumer buffer pool is full"));
    char rid[WIRE_ID_MAX + 1];
    snprintf(rid, sizeof rid, "%s", r.u.reserve_batch.items[1].result.reservation_id);
    wire_ctl_reply_clear(&r);

    /* conflicting reservation for the same transfer_id with another hash */
    wire_ctl_request bad = reserve_req("b1", "other", 10);
    assert_int_equal(ctl_call(f.cli, "127.0.0.1", f.port, &bad, &r), 0);
    assert_false(r.ok);
    assert_non_null(strstr(r.error, "conflicting"));
    wire_ctl_reply_clear(&r);

    /* complete_batch: one good, one unknown */
    wire_complete_req cr[2];
    memset(cr, 0, sizeof cr);
    snprintf(cr[0].transfer_id, sizeof cr[0].transfer_id, "b1");
    snprintf(cr[0].reservation_id, sizeof cr[0].reservation_id, "%s", rid);
    snprintf(cr[1].transfer_id, sizeof cr[1].transfer_id, "nope");
    snprintf(cr[1].reservation_id, sizeof cr[1].reservation_id, "x");
    wire_ctl_request cb = {.op = WIRE_OP_COMPLETE_BATCH};
    cb.u.complete_batch.n = 2;
    cb.u.complete_batch.items = cr;
    assert_int_equal(ctl_call_ok(f.cli, "127.0.0.1", f.port, &cb, &r), 0);
    assert_true(r.u.complete_batch.items[0].completed);
    assert_true(r.u.complete_batch.items[0].became_ready);
    assert_false(r.u.complete_batch.items[1].completed);
    wire_ctl_reply_clear(&r);

    /* peers of a single ephemeral shard: itself */
    int ports[4];
    size_t n = 0;
    assert_int_equal(ctl_peers(f.cli, "127.0.0.1", f.port, ports, 4, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(ports[0], f.port);

    k.u.cancel.refresh = false;
    snprintf(k.u.cancel.transfer_id, sizeof k.u.cancel.transfer_id, "b1");
    assert_int_equal(ctl_call_ok(f.cli, "127.0.0.1", f.port, &k, &r), 0);
    assert_true(r.u.cancelled);
    wire_ctl_reply_clear(&r);
    fx_close(&f);
}

static void test_bad_frames(void **state) {
    (void)state;
    fx f;
    fx_open(&f, 0, 5000);
    char *rep = raw_call(&f, "{not json", 9);
    assert_string_equal(rep, "{\"ok\":false,\"error\":\"malformed control request\"}");
    free(rep);
    rep = raw_call(&f, "{\"op\":\"frobnicate\"}", 19);
    assert_non_null(strstr(rep, "unknown control op: 'frobnicate'"));
    free(rep);
    const char *badf = "{\"op\":\"reserve\",\"transfer_id\":\"t\",\"mm_hash\":\"h\",\"nbytes\":3,"
                       "\"shape\":[2],\"dtype\":\"bfloat16\"}";
    rep = raw_call(&f, badf, strlen(badf));
    assert_non_null(strstr(rep, "shape and dtype do not match nbytes"));
    free(rep);
    const char *baddt = "{\"op\":\"reserve\",\"transfer_id\":\"t\",\"mm_hash\":\"h\",\"nbytes\":2,"
                        "\"shape\":[2],\"dtype\":\"complex999\"}";
    rep = raw_call(&f, baddt, strlen(baddt));
    assert_non_null(strstr(rep, "\"ok\":false"));
    free(rep);
    /* oversized: over the codec's frame bound, under the socket cut-off */
    size_t big = WIRE_CTL_MAX_FRAME + 10;
    char *buf = malloc(big);
    memset(buf, ' ', big);
    buf[0] = '{';
    buf[big - 1] = '}';
    rep = raw_call(&f, buf, big);
    assert_string_equal(rep, "{\"ok\":false,\"error\":\"malformed control request\"}");
    free(rep);
    free(buf);
    /* beyond the cut-off: ZMQ drops that peer; the server keeps serving */
    {
        size_t huge = (size_t)CTL_MAX_RECV_BYTES + 100;
        char *h = calloc(1, huge);
        void *s = zmq_socket(f.zctx, ZMQ_REQ);
        int zero = 0, to = 500;
        zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
        zmq_setsockopt(s, ZMQ_RCVTIMEO, &to, sizeof to);
        char ep[64];
        snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", f.port);
        zmq_connect(s, ep);
        zmq_send(s, h, huge, 0);
        char tmp[16];
        assert_true(zmq_recv(s, tmp, sizeof tmp, 0) < 0); /* no reply */
        zmq_close(s);
        free(h);
    }
    /* multi-part frame from a DEALER: answered once, malformed */
    {
        void *d = zmq_socket(f.zctx, ZMQ_DEALER);
        int zero = 0, to = 3000;
        zmq_setsockopt(d, ZMQ_LINGER, &zero, sizeof zero);
        zmq_setsockopt(d, ZMQ_RCVTIMEO, &to, sizeof to);
        char ep[64];
        snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", f.port);
        zmq_connect(d, ep);
        zmq_send(d, "", 0, ZMQ_SNDMORE); /* REQ envelope delimiter */
        zmq_send(d, "{\"op\":\"peers\"}", 14, ZMQ_SNDMORE);
        zmq_send(d, "x", 1, 0);
        char tmp[256];
        int n = zmq_recv(d, tmp, sizeof tmp, 0); /* delimiter */
        assert_int_equal(n, 0);
        n = zmq_recv(d, tmp, sizeof tmp - 1, 0);
        assert_true(n > 0);
        tmp[n] = 0;
        assert_non_null(strstr(tmp, "malformed control request"));
        zmq_close(d);
    }
    /* still serving */
    wire_ctl_request q = {.op = WIRE_OP_PEERS};
    wire_ctl_reply r;
    assert_int_equal(ctl_call_ok(f.cli, "127.0.0.1", f.port, &q, &r), 0);
    wire_ctl_reply_clear(&r);
    assert_true(ctl_server_bad_requests(f.srv) >= 3);
    fx_close(&f);
}

/* Backlog capped at 8 with no scheduler connected: the oldest are dropped,
 * the newest 8 arrive once a PULL connects. */
static void test_event_backlog(void **state) {
    (void)state;
    fx f;
    fx_open(&f, 8, 5000);
    for (int i = 0; i < 20; i++) {
        char tid[16];
        snprintf(tid, sizeof tid, "e%d", i);
        wire_ctl_request q = reserve_req(tid, tid, 1);
        wire_ctl_reply r;
        assert_int_equal(ctl_call_ok(f.cli, "127.0.0.1", f.port, &q, &r), 0);
        wire_ctl_request c = {.op = WIRE_OP_COMPLETE};
        snprintf(c.u.complete.transfer_id, sizeof c.u.complete.transfer_id, "%s", tid);
        snprintf(c.u.complete.reservation_id, sizeof c.u.complete.reservation_id, "%s",
                 r.u.reserve.reservation_id);
        wire_ctl_reply_clear(&r);
        assert_int_equal(ctl_call_ok(f.cli, "127.0.0.1", f.port, &c, &r), 0);
        assert_true(r.u.complete.became_ready);
        wire_ctl_reply_clear(&r);
    }
    rsv_stats st;
    ctl_server_stats(f.srv, &st);
    assert_int_equal(st.events, 8);
    assert_int_equal(st.events_dropped, 12);
    void *pull = pull_connect(&f);
    for (int i = 12; i < 20; i++) {
        wire_event ev;
        recv_event(pull, &ev);
        char tid[16];
        snprintf(tid, sizeof tid, "e%d", i);
        assert_string_equal(ev.transfer_id, tid);
        wire_event_clear(&ev);
    }
    char tmp[16];
    int to = 300;
    zmq_setsockopt(pull, ZMQ_RCVTIMEO, &to, sizeof to);
    assert_true(zmq_recv(pull, tmp, sizeof tmp, 0) < 0);
    zmq_close(pull);
    for (int i = 0; i < 20; i++) {
        wire_ctl_request k = {.op = WIRE_OP_CANCEL};
        snprintf(k.u.cancel.transfer_id, sizeof k.u.cancel.transfer_id, "e%d", i);
        wire_ctl_reply r;
        assert_int_equal(ctl_call_ok(f.cli, "127.0.0.1", f.port, &k, &r), 0);
        assert_true(r.u.cancelled);
        wire_ctl_reply_clear(&r);
    }
    fx_close(&f);
}

/* Bind conflict reported at open; client timeout, discard and reconnect;
 * peers cached only on success. The timeout is short only for the call that
 * must time out: the calls that must succeed get one no loaded machine
 * reaches (at 300 ms, a server or test thread off its CPU that long failed
 * the reconnect). */
static void test_bind_timeout_reconnect(void **state) {
    (void)state;
    fx f;
    fx_open(&f, 0, 300);
    ctl_server *dup = NULL;
    ctl_server_opts o;
    ctl_server_opts_init(&o);
    o.port = f.port;
    o.rsv.mem = &rsv_pool_ops;
    o.rsv.mem_ctx = f.pool;
    o.dst_session = "x:1";
    assert_err(ctl_server_open(f.zctx, &o, &dup), ECT_EEXIST, "address in use");
    assert_null(dup);
    o.tp_rank = 3;
    assert_err(ctl_server_open(f.zctx, &o, &dup), ECT_EINVAL, "tp_rank");

    int port = f.port;
    ctl_server_close(f.srv); /* shard gone */
    f.srv = NULL;
    int ports[4];
    size_t n = 9;
    uint64_t t0 = ect_now_ms();
    assert_err(ctl_peers(f.cli, "127.0.0.1", port, ports, 4, &n), ECT_ETIMEDOUT, "peers");
    assert_true(ect_now_ms() - t0 < 60000); /* its timeout, not a hang */
    assert_int_equal(n, 0);
    ctl_client_set_timeout(f.cli, 60000);
    fx_open_srv(&f, port, 0); /* back on the same port */
    assert_int_equal(ctl_peers(f.cli, "127.0.0.1", port, ports, 4, &n), 0); /* reconnected */
    assert_int_equal(n, 1);
    assert_int_equal(ports[0], port);
    assert_err(ctl_peers(f.cli, "127.0.0.1", port, ports, 0, &n), ECT_ERANGE, "shards");
    ctl_server_close(f.srv);
    f.srv = NULL;
    n = 0;
    assert_int_equal(ctl_peers(f.cli, "127.0.0.1", port, ports, 4, &n), 0); /* cached */
    assert_int_equal(n, 1);
    ctl_forget_peers(f.cli, "127.0.0.1", port);
    ctl_client_set_timeout(f.cli, 300); /* this call must time out */
    assert_err(ctl_peers(f.cli, "127.0.0.1", port, ports, 4, &n), ECT_ETIMEDOUT, NULL);
    assert_err(
        ctl_call(f.cli, "", port, &(wire_ctl_request){.op = WIRE_OP_PEERS}, &(wire_ctl_reply){0}),
        ECT_EINVAL, "host");
    assert_int_equal(ctl_timeout_ms(30), 30000);
    assert_int_equal(ctl_timeout_ms(0.0001), 1);
    assert_int_equal(ctl_timeout_ms(1.0005), 1001);
    fx_close(&f);
}

/* peers for a TP=4 instance lists every rank's control port. */
static void test_peers_tp(void **state) {
    (void)state;
    fx f;
    fx_open(&f, 0, 5000);
    ctl_server_close(f.srv);
    ctl_server_opts o;
    ctl_server_opts_init(&o);
    o.tp_size = 4;
    o.tp_rank = 2;
    o.base_port = 40000;
    o.rsv.mem = &rsv_pool_ops;
    o.rsv.mem_ctx = f.pool;
    o.dst_session = "x:1";
    o.transport = "tcp";
    o.rsv.capacity = 1048576;
    o.detached = true;
    assert_int_equal(ctl_server_open(NULL, &o, &f.srv), 0);
    char *rep = NULL;
    assert_int_equal(ctl_server_handle(f.srv, "{\"op\":\"peers\"}", 14, 0, &rep), 0);
    assert_string_equal(
        rep,
        "{\"ok\":true,\"result\":{\"ports\":[40000,40001,40002,40003],\"transport\":\"tcp\"}}");
    free(rep);
    /* ect_status (extension): the documented answer, byte for byte (a detached
     * shard has no port of its own: 0; docs/PROTOCOL.md shows rank 2's 40002) */
#define STATUS_FMT                                                                                 \
    "{\"ok\":true,\"result\":{\"shard\":2,\"tp_size\":4,\"port\":%d,\"transport\":\"tcp\","        \
    "\"pool\":{\"capacity\":1048576,\"used\":0,\"resident\":0,\"spares\":0,\"spare_bytes\":0},"    \
    "\"reservations\":{"                                                                           \
    "\"WRITING\":0,\"READY\":0,\"CANCEL_PENDING\":0,\"EXPIRE_PENDING\":0,\"CANCELLED\":0,"         \
    "\"EXPIRED\":0},\"peers\":[40000,40001,40002,40003],\"events\":{\"queued\":0,\"sent\":0,"      \
    "\"dropped\":0},\"refused\":{\"full\":0,\"cancelled\":0,\"conflict\":0,\"busy\":0,"            \
    "\"invalid\":0,\"other\":0},\"errors\":[],\"peer_refused\":{\"complete\":0,"                   \
    "\"cancel\":0,\"status\":0,\"reserve\":0,\"ready\":0}}}"
    char want[1024];
    snprintf(want, sizeof want, STATUS_FMT, 0);
    assert_int_equal(ctl_server_handle(f.srv, "{\"op\":\"ect_status\"}", 19, 0, &rep), 0);
    assert_string_equal(rep, want);
    free(rep);
    char doc_line[1100];
    snprintf(want, sizeof want, STATUS_FMT, 40002);
    snprintf(doc_line, sizeof doc_line, "\n%s\n", want);
    if (!strstr(test_protocol_md(), doc_line))
        fail_msg("docs/PROTOCOL.md lacks the ect_status example %s", want);
    if (!strstr(test_protocol_md(), "\n{\"op\":\"ect_status\"}\n"))
        fail_msg("docs/PROTOCOL.md lacks the ect_status request");
    assert_int_equal(ctl_server_handle(f.srv, "{\"op\":\"event_port\"}", 19, 0, &rep), 0);
    assert_non_null(strstr(rep, "\"ok\":false"));
    free(rep);
    fx_close(&f);
}

/* The shard counts what it refuses, by class; a reused (finished)
 * transfer_id is answered `cancelled` with the reason; `peers` names the
 * transport; a reserve that does not fit reclaims the resident items first
 * and only then is refused with upstream's text. */
static void test_refusals_reasons_and_transport(void **state) {
    (void)state;
    fx f;
    fx_open(&f, 0, 5000);
    wire_ctl_reply r;
    wire_ctl_request q = {.op = WIRE_OP_PEERS};
    assert_int_equal(ctl_call_ok(f.cli, "127.0.0.1", f.port, &q, &r), 0);
    assert_string_equal(r.u.peers.transport, "tcp");
    wire_ctl_reply_clear(&r);
    /* delivered, then reserved again */
    q = reserve_req("t1", "h1", 4);
    assert_int_equal(ctl_call_ok(f.cli, "127.0.0.1", f.port, &q, &r), 0);
    wire_ctl_request c = {.op = WIRE_OP_COMPLETE};
    snprintf(c.u.complete.transfer_id, sizeof c.u.complete.transfer_id, "t1");
    snprintf(c.u.complete.reservation_id, sizeof c.u.complete.reservation_id, "%s",
             r.u.reserve.reservation_id);
    wire_ctl_reply_clear(&r);
    assert_int_equal(ctl_call_ok(f.cli, "127.0.0.1", f.port, &c, &r), 0);
    wire_ctl_reply_clear(&r);
    rsv_status st;
    assert_int_equal(ctl_server_take(f.srv, "t1", &st), 0);
    assert_int_equal(ctl_server_release(f.srv, "h1", "t1"), 0); /* finishes it */
    assert_int_equal(ctl_call_ok(f.cli, "127.0.0.1", f.port, &q, &r), 0);
    assert_true(r.u.reserve.cancelled);
    assert_non_null(strstr(r.u.reserve.reason, "transfer_id 't1' was already delivered"));
    wire_ctl_reply_clear(&r);
    /* too big for the whole pool; a bad dtype; a conflict */
    q = reserve_req("x", "h1", 8); /* h1 is resident with 4 rows */
    assert_int_equal(ctl_call(f.cli, "127.0.0.1", f.port, &q, &r), 0);
    assert_false(r.ok);
    assert_non_null(strstr(r.error, "conflicting cached tensor"));
    wire_ctl_reply_clear(&r);
    q = reserve_req("big", "hb", CAP); /* reclaims h1, still does not fit */
    assert_int_equal(ctl_call(f.cli, "127.0.0.1", f.port, &q, &r), 0);
    assert_false(r.ok);
    assert_non_null(strstr(r.error, "EC consumer buffer pool is full"));
    wire_ctl_reply_clear(&r);
    ctl_refusals rf;
    ctl_server_refusals(f.srv, &rf);
    assert_int_equal(rf.tomb, 1);
    assert_int_equal(rf.full, 1);
    assert_int_equal(rf.conflict, 1);
    assert_int_equal(rf.busy + rf.invalid + rf.other, 0);
    ctl_server_evict(f.srv, SIZE_MAX);
    fx_close(&f);
}

/* ctl_server_handle is thread-safe with the kept batch memory: two threads
 * handling reserve_batch and complete_batch of 32 items at once on one
 * detached shard each get their own items back (every reserve granted with
 * its own reservation id, every complete completing it), whichever of them
 * holds the kept arrays. */
#define CONC_N 32
#define CONC_ROUNDS 8
typedef struct conc_arg {
    ctl_server *s;
    int who, bad;
} conc_arg;

static void conc_round(conc_arg *a, int round) {
    static __thread char frame[16384];
    char rid[CONC_N][WIRE_ID_MAX + 1];
    size_t at = (size_t)snprintf(frame, sizeof frame, "{\"op\":\"reserve_batch\",\"items\":[");
    for (int i = 0; i < CONC_N; i++)
        at += (size_t)snprintf(frame + at, sizeof frame - at,
                               "%s{\"transfer_id\":\"c%d-%d-%d\",\"mm_hash\":\"m%d-%d-%d\","
                               "\"nbytes\":8,\"shape\":[4],\"dtype\":\"bfloat16\"}",
                               i ? "," : "", a->who, round, i, a->who, round, i);
    snprintf(frame + at, sizeof frame - at, "]}");
    char *text = NULL;
    wire_ctl_reply rep;
    if (ctl_server_handle(a->s, frame, strlen(frame), 0, &text) ||
        wire_ctl_decode_reply(WIRE_OP_RESERVE_BATCH, CONC_N, text, strlen(text), &rep)) {
        a->bad++;
        free(text);
        return;
    }
    free(text);
    for (int i = 0; i < CONC_N; i++) {
        const wire_reserve_outcome *o = &rep.u.reserve_batch.items[i];
        if (!rep.ok || rep.u.reserve_batch.n != CONC_N || !o->ok || !o->result.write) a->bad++;
        snprintf(rid[i], sizeof rid[i], "%s", o->ok ? o->result.reservation_id : "");
    }
    wire_ctl_reply_clear(&rep);
    at = (size_t)snprintf(frame, sizeof frame, "{\"op\":\"complete_batch\",\"items\":[");
    for (int i = 0; i < CONC_N; i++)
        at += (size_t)snprintf(frame + at, sizeof frame - at,
                               "%s{\"transfer_id\":\"c%d-%d-%d\",\"reservation_id\":\"%s\"}",
                               i ? "," : "", a->who, round, i, rid[i]);
    snprintf(frame + at, sizeof frame - at, "]}");
    if (ctl_server_handle(a->s, frame, strlen(frame), 0, &text) ||
        wire_ctl_decode_reply(WIRE_OP_COMPLETE_BATCH, CONC_N, text, strlen(text), &rep)) {
        a->bad++;
        free(text);
        return;
    }
    free(text);
    for (int i = 0; i < CONC_N; i++)
        if (!rep.ok || !rep.u.complete_batch.items[i].completed ||
            !rep.u.complete_batch.items[i].became_ready)
            a->bad++;
    wire_ctl_reply_clear(&rep);
}

static void *conc_main(void *arg) {
    conc_arg *a = arg;
    for (int r = 0; r < CONC_ROUNDS; r++) conc_round(a, r);
    return NULL;
}

static void test_handle_concurrent_batches(void **state) {
    (void)state;
    fx f;
    fx_open(&f, 0, 5000);
    ctl_server_close(f.srv);
    ctl_server_opts o;
    ctl_server_opts_init(&o);
    o.rsv.mem = &rsv_pool_ops;
    o.rsv.mem_ctx = f.pool;
    o.dst_session = "x:1";
    o.transport = "tcp";
    o.detached = true;
    assert_int_equal(ctl_server_open(NULL, &o, &f.srv), 0);
    conc_arg a[2] = {{f.srv, 0, 0}, {f.srv, 1, 0}};
    pthread_t t[2];
    for (int k = 0; k < 2; k++) assert_int_equal(pthread_create(&t[k], NULL, conc_main, &a[k]), 0);
    for (int k = 0; k < 2; k++) pthread_join(t[k], NULL);
    assert_int_equal(a[0].bad, 0);
    assert_int_equal(a[1].bad, 0);
    assert_int_equal(ctl_server_check(f.srv), 0);
    rsv_stats st;
    ctl_server_stats(f.srv, &st);
    assert_int_equal(st.live, 2 * CONC_N * CONC_ROUNDS); /* all READY */
    fx_close(&f);
}

/* ctl_server_handle of text; the reply (caller frees). */
static char *handle(fx *f, const char *text) {
    char *rep = NULL;
    assert_int_equal(ctl_server_handle(f->srv, text, strlen(text), ect_now_ms(), &rep), 0);
    return rep;
}

/* The spare's id in a reply with "ect_spare" (docs/PROTOCOL.md), into id. */
static void spare_of(wire_ctl_op op, const char *rep, char id[WIRE_ID_MAX + 1]) {
    wire_ctl_reply r;
    assert_int_equal(wire_ctl_decode_reply(op, 1, rep, strlen(rep), &r), 0);
    assert_true(r.ok && r.has_spare && r.spare.nbytes == 64 && r.spare.dst_key);
    assert_string_equal(r.spare.dst_session, "127.0.0.1:9");
    snprintf(id, WIRE_ID_MAX + 1, "%s", r.spare.reservation_id);
    wire_ctl_reply_clear(&r);
}

/* The spare extension on the wire of our shard: a lone reserve asking for
 * one gets it beside its result, ect_put binds and completes it (READY:
 * taken) and brings the next, the documented refusals change nothing, ect_status counts the spare,
 * and closing frees it. */
static void test_spare_put(void **state) {
    (void)state;
    fx f;
    fx_open(&f, 0, 5000);
    char id[WIRE_ID_MAX + 1], next[WIRE_ID_MAX + 1], req[512];
    char *rep = handle(&f, "{\"op\":\"reserve_batch\",\"items\":[{\"transfer_id\":\"s-a\","
                           "\"mm_hash\":\"h-a\",\"nbytes\":64,\"shape\":[32],\"dtype\":"
                           "\"bfloat16\"}],\"ect_spare\":64}");
    spare_of(WIRE_OP_RESERVE_BATCH, rep, id);
    free(rep);
    rep = handle(&f, "{\"op\":\"ect_put\",\"transfer_id\":\"s-b\",\"mm_hash\":\"h-b\","
                     "\"nbytes\":64,\"shape\":[32],\"dtype\":\"bfloat16\",\"reservation_id\":"
                     "\"nope\"}");
    assert_string_equal(
        rep,
        "{\"ok\":false,\"error\":\"ect_put: no spare 'nope' (expired, freed or never granted)\"}");
    free(rep);
    snprintf(req, sizeof req,
             "{\"op\":\"ect_put\",\"transfer_id\":\"s-b\",\"mm_hash\":\"h-a\",\"nbytes\":64,"
             "\"shape\":[32],\"dtype\":\"bfloat16\",\"reservation_id\":\"%s\"}",
             id);
    rep = handle(&f, req); /* h-a is in flight (s-a's): not the plain case */
    assert_string_equal(rep, "{\"ok\":false,\"error\":\"ect_put: mm_hash 'h-a' is cached or in "
                             "flight: reserve it\"}");
    free(rep);
    snprintf(req, sizeof req,
             "{\"op\":\"ect_put\",\"transfer_id\":\"s-b\",\"mm_hash\":\"h-b\",\"nbytes\":64,"
             "\"shape\":[32],\"dtype\":\"bfloat16\",\"reservation_id\":\"%s\",\"ect_spare\":64}",
             id);
    rep = handle(&f, req);
    assert_non_null(strstr(rep,
                           "{\"ok\":true,\"result\":{\"completed\":true,\"became_ready\":true},"
                           "\"ect_spare\":{"));
    spare_of(WIRE_OP_ECT_PUT, rep, next);
    assert_string_not_equal(next, id);
    free(rep);
    rep = handle(&f, req); /* the same spare again: bound already */
    assert_non_null(strstr(rep, "no spare"));
    free(rep);
    rsv_status st;
    assert_int_equal(ctl_server_take(f.srv, "s-b", &st), 0);
    assert_true(st.ready && st.nbytes == 64);
    assert_string_equal(st.reservation_id, id);
    assert_int_equal(ctl_server_release(f.srv, "h-b", "s-b"), 0);
    rep = handle(&f, "{\"op\":\"ect_status\"}");
    assert_non_null(strstr(rep, "\"spares\":1,\"spare_bytes\":64}"));
    free(rep);
    rsv_stats rs;
    ctl_server_stats(f.srv, &rs);
    assert_int_equal(rs.spares_bound, 1);
    fx_close(&f); /* closing frees the spare: the pool reads 0 */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spare_put),
        cmocka_unit_test(test_reserve_complete_event),
        cmocka_unit_test(test_refusals_reasons_and_transport),
        cmocka_unit_test(test_batches_precancel_errors),
        cmocka_unit_test(test_bad_frames),
        cmocka_unit_test(test_event_backlog),
        cmocka_unit_test(test_bind_timeout_reconnect),
        cmocka_unit_test(test_peers_tp),
        cmocka_unit_test(test_handle_concurrent_batches),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
