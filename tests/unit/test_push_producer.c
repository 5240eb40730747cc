/*
 * Tests for the push producer (ect_push_producer_*) against a consumer faked
 * in this process: per TP rank a REP socket served by its own thread over a
 * real reservation table (rsv_) on a memfd buffer pool, registered with a
 * real transport target (tcp or shm). The fake counts the requests it gets
 * per op and can refuse reserves, answer slowly, or die after a given op, so
 * the tests check what crosses the wire, not only what the producer says:
 * the bytes in every shard's buffer, round trips per step, abandoned
 * reservations on the healthy shards, and that every pool drains. The last
 * tests run the same pushes into the real ect_push_consumer (TP 2 and 4).
 */
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <zmq.h>

#include "testutil.h"
#include "push/producer.h"
#include "push/reservations.h"
#include "util/util.h"
#include "wire/control_msg.h"
#include "xport/shm.h"

#define MAX_TP 4
#define POOL (64u << 20)

typedef struct shard {
    struct fake *f;
    int rank;
    void *rep;
    int port;
    pthread_t th;
    atomic_bool stop;
    ect_pool *pool;
    ect_xport *x;
    char key[ECT_XPORT_KEY_MAX];
    rsv_table *t;
    pthread_mutex_t mu;
    /* fault injection */
    atomic_bool fail_reserve;
    atomic_int die_after_op; /* close the socket after answering this op (0: never) */
    atomic_int delay_ms;     /* before answering reserve_batch */
    atomic_bool hold;        /* a reserve_batch waits while set */
    /* counters */
    atomic_int n_op[WIRE_OP_LAST + 1];
    atomic_int n_items_cancel_refresh;
} shard;

typedef struct fake {
    void *zctx;
    int tp;
    shard sh[MAX_TP];
    char kind[8];
    bool peers_transport; /* answer `peers` with the transport extension */
    char addr[64];        /* the consumer's address: rank 0's control port */
} fake;

/* Shards inside a delayed reserve_batch answer right now, and the most seen
 * at once (test_shards_in_parallel). */
static atomic_int delaying_now, delaying_max;

static void answer(shard *s, const void *buf, size_t len, char **out) {
    wire_ctl_request req;
    int rc = wire_ctl_decode_request(buf, len, &req);
    if (rc) {
        assert_int_equal(wire_ctl_encode_decode_failure(rc, out), 0);
        return;
    }
    atomic_fetch_add(&s->n_op[req.op], 1);
    wire_ctl_reply rep;
    memset(&rep, 0, sizeof rep);
    rep.op = req.op;
    rep.ok = true;
    uint64_t now = ect_now_ms();
    uint16_t ports[MAX_TP];
    pthread_mutex_lock(&s->mu);
    switch (req.op) {
    case WIRE_OP_PEERS:
        for (int i = 0; i < s->f->tp; i++) ports[i] = (uint16_t)s->f->sh[i].port;
        rep.u.peers.n = (size_t)s->f->tp;
        rep.u.peers.ports = ports;
        if (s->f->peers_transport)
            snprintf(rep.u.peers.transport, sizeof rep.u.peers.transport, "%s", s->f->kind);
        break;
    case WIRE_OP_RESERVE_BATCH: {
        while (atomic_load(&s->hold)) test_nap_ms(1);
        if (atomic_load(&s->delay_ms)) {
            int in = atomic_fetch_add(&delaying_now, 1) + 1, max = atomic_load(&delaying_max);
            while (in > max && !atomic_compare_exchange_weak(&delaying_max, &max, in)) {
            }
            usleep((useconds_t)atomic_load(&s->delay_ms) * 1000);
            atomic_fetch_sub(&delaying_now, 1);
        }
        if (atomic_load(&s->fail_reserve)) {
            rep.ok = false;
            rep.error = "injected reserve failure";
            break;
        }
        size_t n = req.u.reserve_batch.n;
        rep.u.reserve_batch.n = n;
        rep.u.reserve_batch.items = calloc(n, sizeof(wire_reserve_outcome));
        for (size_t i = 0; i < n; i++) {
            wire_reserve_outcome *o = &rep.u.reserve_batch.items[i];
            const wire_reserve_req *r = &req.u.reserve_batch.items[i].req;
            rsv_request rr = {
                r->transfer_id,  r->mm_hash, r->tensor.nbytes, r->tensor.shape, r->tensor.ndim,
                r->tensor.dtype, NULL};
            rsv_reply ry;
            if (req.u.reserve_batch.items[i].rc || rsv_reserve(s->t, &rr, now, &ry)) {
                o->ok = false;
                o->error = strdup(ect_last_error());
                continue;
            }
            o->ok = true;
            wire_reserve_result *res = &o->result;
            res->cancelled = ry.cancelled;
            snprintf(res->reservation_id, sizeof res->reservation_id, "%s", ry.reservation_id);
            if (!ry.cancelled) {
                snprintf(res->dst_session, sizeof res->dst_session, "%s", ect_xport_session(s->x));
                res->dst_ptr = (uint64_t)(uintptr_t)ect_pool_base(s->pool) + ry.offset;
                res->nbytes = ry.nbytes;
                res->write = ry.write;
                res->ready = ry.ready;
                res->cached = ry.cached;
                snprintf(res->transport, sizeof res->transport, "%s", s->f->kind);
                res->dst_key = s->key;
            }
        }
        break;
    }
    case WIRE_OP_COMPLETE_BATCH: {
        size_t n = req.u.complete_batch.n;
        rep.u.complete_batch.n = n;
        rep.u.complete_batch.items = calloc(n, sizeof(wire_complete_result));
        for (size_t i = 0; i < n; i++)
            rsv_complete(s->t, req.u.complete_batch.items[i].transfer_id,
                         req.u.complete_batch.items[i].reservation_id, now,
                         &rep.u.complete_batch.items[i].completed,
                         &rep.u.complete_batch.items[i].became_ready);
        break;
    }
    case WIRE_OP_CANCEL:
        if (req.u.cancel.refresh) atomic_fetch_add(&s->n_items_cancel_refresh, 1);
        if (rsv_cancel(s->t, req.u.cancel.transfer_id, req.u.cancel.reservation_id,
                       req.u.cancel.abandon, req.u.cancel.refresh, now, &rep.u.cancelled)) {
            rep.ok = false;
            rep.error = (char *)ect_last_error();
        }
        break;
    default: rep.ok = false; rep.error = "not served by the fake";
    }
    while (rsv_event_peek(s->t)) rsv_event_pop(s->t);
    pthread_mutex_unlock(&s->mu);
    assert_int_equal(wire_ctl_encode_reply(&rep, out), 0);
    if (req.op == WIRE_OP_RESERVE_BATCH && rep.ok) {
        for (size_t i = 0; i < rep.u.reserve_batch.n; i++) {
            free(rep.u.reserve_batch.items[i].error);
        }
        free(rep.u.reserve_batch.items);
    }
    if (req.op == WIRE_OP_COMPLETE_BATCH) free(rep.u.complete_batch.items);
    if (atomic_load(&s->die_after_op) == (int)req.op) atomic_store(&s->stop, true);
    wire_ctl_request_clear(&req);
}

static void *serve(void *arg) {
    shard *s = arg;
    while (!atomic_load(&s->stop)) {
        zmq_pollitem_t pi = {s->rep, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&pi, 1, 20) <= 0) continue;
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, s->rep, 0) < 0) {
            zmq_msg_close(&m);
            continue;
        }
        char *out = NULL;
        answer(s, zmq_msg_data(&m), zmq_msg_size(&m), &out);
        zmq_msg_close(&m);
        zmq_send(s->rep, out, strlen(out), 0);
        free(out);
    }
    /* dying: the socket goes with the thread, so peers see silence */
    zmq_close(s->rep);
    s->rep = NULL;
    return NULL;
}

static fake *fake_open(int tp, const char *kind) {
    fake *f = calloc(1, sizeof *f);
    f->zctx = zmq_ctx_new();
    f->tp = tp;
    snprintf(f->kind, sizeof f->kind, "%s", kind);
    for (int i = 0; i < tp; i++) {
        shard *s = &f->sh[i];
        s->f = f;
        s->rank = i;
        pthread_mutex_init(&s->mu, NULL);
        ect_pool_opts po;
        ect_pool_opts_init(&po);
        po.capacity = POOL;
        po.use_memfd = 1;
        assert_int_equal(ect_pool_open(&po, &s->pool), 0);
        assert_int_equal(ect_xport_open(kind, NULL, &s->x), 0);
        assert_int_equal(ect_xport_register(s->x, ect_pool_base(s->pool),
                                            ect_pool_capacity(s->pool), ect_pool_fd(s->pool), 0,
                                            s->key),
                         0);
        rsv_opts ro;
        rsv_opts_init(&ro);
        ro.mem = &rsv_pool_ops;
        ro.mem_ctx = s->pool;
        assert_int_equal(rsv_open(&ro, &s->t), 0);
        s->rep = zmq_socket(f->zctx, ZMQ_REP);
        int zero = 0;
        zmq_setsockopt(s->rep, ZMQ_LINGER, &zero, sizeof zero);
        assert_int_equal(zmq_bind(s->rep, "tcp://127.0.0.1:*"), 0);
        char ep[128];
        size_t len = sizeof ep;
        zmq_getsockopt(s->rep, ZMQ_LAST_ENDPOINT, ep, &len);
        s->port = atoi(strrchr(ep, ':') + 1);
    }
    for (int i = 0; i < tp; i++) pthread_create(&f->sh[i].th, NULL, serve, &f->sh[i]);
    snprintf(f->addr, sizeof f->addr, "127.0.0.1:%d", f->sh[0].port);
    return f;
}

static void fake_kill(shard *s) {
    atomic_store(&s->stop, true);
    pthread_join(s->th, NULL);
    s->th = 0;
}

static void fake_close(fake *f) {
    for (int i = 0; i < f->tp; i++) {
        shard *s = &f->sh[i];
        if (s->th) fake_kill(s);
        ect_xport_close(s->x);
        rsv_close(s->t);
        ect_pool_close(s->pool);
        pthread_mutex_destroy(&s->mu);
    }
    zmq_ctx_term(f->zctx);
    free(f);
}

static rsv_stats shard_stats(shard *s) {
    rsv_stats st;
    pthread_mutex_lock(&s->mu);
    rsv_get_stats(s->t, &st);
    pthread_mutex_unlock(&s->mu);
    return st;
}

/* Reads the READY item back from the shard's buffer and checks its bytes. */
static void expect_bytes(shard *s, const char *tid, uint64_t seed, uint64_t nbytes) {
    rsv_status st;
    pthread_mutex_lock(&s->mu);
    assert_int_equal(rsv_take(s->t, tid, ect_now_ms(), &st), 0);
    pthread_mutex_unlock(&s->mu);
    assert_int_equal(st.nbytes, nbytes);
    assert_true(test_check_pattern((char *)ect_pool_base(s->pool) + st.offset, nbytes, seed));
    pthread_mutex_lock(&s->mu);
    assert_int_equal(rsv_release(s->t, st.mm_hash, ect_now_ms()), 0);
    pthread_mutex_unlock(&s->mu);
}

/* ------------------------------------------------------------- producer */

static ect_push_producer *prod_open(int control_timeout_ms, uint64_t refresh_ms) {
    ect_push_producer_opts o;
    ect_push_producer_opts_init(&o);
    o.staging_size = 32u << 20;
    o.control_timeout_ms = control_timeout_ms;
    o.refresh_after_ms = refresh_ms;
    o.connect_timeout_ms = 1000;
    o.io_timeout_ms = 2000;
    ect_push_producer *p = NULL;
    assert_int_equal(ect_push_producer_open(&o, &p), 0);
    return p;
}

typedef struct item_buf {
    char tid[64], hash[64];
    uint64_t shape[1];
    void *data;
    uint64_t nbytes, seed;
} item_buf;

static void item_make(item_buf *b, const char *prefix, int i, uint64_t nbytes) {
    snprintf(b->tid, sizeof b->tid, "%s-%d", prefix, i);
    snprintf(b->hash, sizeof b->hash, "h-%s-%d", prefix, i);
    b->nbytes = nbytes;
    b->shape[0] = nbytes / 2;
    b->seed = (uint64_t)i * 7919u + nbytes;
    b->data = malloc(nbytes);
    test_fill_pattern(b->data, nbytes, b->seed);
}

static ect_push_item item_of(const item_buf *b, const char *consumer) {
    ect_push_item it = {0};
    it.transfer_id = b->tid;
    it.consumer = consumer;
    it.mm_hash = b->hash;
    it.shape = b->shape;
    it.ndim = 1;
    it.dtype = "bfloat16";
    it.nbytes = b->nbytes;
    it.data = b->data;
    return it;
}

/* Polls until n results arrived (fails after `secs`). */
/* Waits for n results. `secs` is what the case needs on a quiet machine;
 * the deadline is ten times that (a hang still fails the test, a loaded
 * machine does not). */
static void wait_results(ect_push_producer *p, ect_push_result *r, size_t n, double secs) {
    size_t got = 0;
    uint64_t end = ect_now_ms() + (uint64_t)(secs * 10000);
    while (got < n) {
        assert_true(ect_now_ms() < end);
        got += ect_push_producer_poll(p, r + got, n - got, 100);
    }
}

/* The end of a test with one fake consumer and one item. */
static void close_all(fake *f, ect_push_producer *p, item_buf *b) {
    ect_push_producer_close(p);
    fake_close(f);
    free(b->data);
}

/* Reserves one item, ends the step and waits for its result. */
static void push_one(ect_push_producer *p, const ect_push_item *it, ect_push_result *r,
                     double secs) {
    assert_int_equal(ect_push_producer_reserve(p, it), 0);
    assert_int_equal(ect_push_producer_flush(p), 1);
    wait_results(p, r, 1, secs);
}

/* Nothing left on the producer side; every shard table passes its
 * invariant check. */
static void expect_drained(fake *f, ect_push_producer *p) {
    for (int i = 0; i < f->tp; i++) {
        pthread_mutex_lock(&f->sh[i].mu);
        assert_int_equal(rsv_check(f->sh[i].t), 0);
        pthread_mutex_unlock(&f->sh[i].mu);
    }
    ect_push_producer_stat ps;
    ect_push_producer_stats(p, &ps);
    assert_int_equal(ps.staged_bytes_in_use, 0);
    assert_int_equal(ect_push_producer_pending(p), 0);
}

static void happy(int tp, const char *kind, int k) {
    fake *f = fake_open(tp, kind);
    ect_push_producer *p = prod_open(5000, 150000);
    const char *addr = f->addr;
    item_buf *b = calloc((size_t)k, sizeof *b);
    for (int i = 0; i < k; i++) {
        item_make(&b[i], kind, i, 4096u + 512u * (unsigned)i);
        ect_push_item it = item_of(&b[i], addr);
        assert_int_equal(ect_push_producer_reserve(p, &it), 0);
    }
    assert_int_equal(ect_push_producer_flush(p), k);
    ect_push_result *r = calloc((size_t)k, sizeof *r);
    wait_results(p, r, (size_t)k, 20);
    for (int i = 0; i < k; i++) {
        assert_int_equal(r[i].status, 0);
        assert_string_equal(r[i].error, "");
        assert_int_equal(r[i].shards, (uint32_t)tp);
        assert_string_equal(r[i].transport, kind);
    }
    for (int s = 0; s < tp; s++) {
        for (int i = 0; i < k; i++) expect_bytes(&f->sh[s], b[i].tid, b[i].seed, b[i].nbytes);
        /* one step: one reserve_batch and one complete_batch per shard */
        assert_int_equal(atomic_load(&f->sh[s].n_op[WIRE_OP_RESERVE_BATCH]), 1);
        assert_int_equal(atomic_load(&f->sh[s].n_op[WIRE_OP_COMPLETE_BATCH]), 1);
        assert_int_equal(atomic_load(&f->sh[s].n_op[WIRE_OP_RESERVE]), 0);
        assert_int_equal(atomic_load(&f->sh[s].n_op[WIRE_OP_PEERS]), s == 0 ? 1 : 0);
    }
    ect_push_producer_stat ps;
    ect_push_producer_stats(p, &ps);
    assert_int_equal(ps.done, (uint64_t)k);
    assert_int_equal(ps.write_batches, (uint64_t)tp); /* one per destination session */
    expect_drained(f, p);
    ect_push_producer_close(p);
    fake_close(f);
    for (int i = 0; i < k; i++) free(b[i].data);
    free(b);
    free(r);
}

/* One step of k items into tp shards: every byte lands, one reserve_batch
 * and one complete_batch per shard, one write batch per session. */
static void test_happy(void **st) {
    (void)st;
    static const struct {
        int tp;
        const char *kind;
        int k;
    } cases[] = {{1, "tcp", 8}, {2, "tcp", 8}, {4, "tcp", 5}, {2, "shm", 8}};
    for (size_t i = 0; i < ECT_ARRAY_LEN(cases); i++) happy(cases[i].tp, cases[i].kind, cases[i].k);
}

/* A step of 32 items costs the shards what a step of 1 costs. */
static void test_round_trips_constant(void **st) {
    (void)st;
    fake *f = fake_open(2, "tcp");
    ect_push_producer *p = prod_open(5000, 150000);
    const char *addr = f->addr;
    item_buf b[33];
    ect_push_result r[33];
    int per_step[2][2];
    for (int step = 0, base = 0; step < 2; step++) {
        int k = step == 0 ? 1 : 32;
        int before[2] = {atomic_load(&f->sh[0].n_op[WIRE_OP_RESERVE_BATCH]) +
                             atomic_load(&f->sh[0].n_op[WIRE_OP_COMPLETE_BATCH]),
                         atomic_load(&f->sh[1].n_op[WIRE_OP_RESERVE_BATCH]) +
                             atomic_load(&f->sh[1].n_op[WIRE_OP_COMPLETE_BATCH])};
        for (int i = 0; i < k; i++) {
            item_make(&b[base + i], "rt", base + i, 8192);
            ect_push_item it = item_of(&b[base + i], addr);
            assert_int_equal(ect_push_producer_reserve(p, &it), 0);
        }
        assert_int_equal(ect_push_producer_flush(p), k);
        wait_results(p, r, (size_t)k, 20);
        for (int i = 0; i < k; i++) assert_int_equal(r[i].status, 0);
        for (int s = 0; s < 2; s++)
            per_step[step][s] = atomic_load(&f->sh[s].n_op[WIRE_OP_RESERVE_BATCH]) +
                                atomic_load(&f->sh[s].n_op[WIRE_OP_COMPLETE_BATCH]) - before[s];
        base += k;
    }
    for (int s = 0; s < 2; s++) {
        assert_int_equal(per_step[0][s], 2);
        assert_int_equal(per_step[1][s], per_step[0][s]);
    }
    for (int i = 0; i < 33; i++) expect_bytes(&f->sh[1], b[i].tid, b[i].seed, b[i].nbytes);
    expect_drained(f, p);
    ect_push_producer_close(p);
    fake_close(f);
    for (int i = 0; i < 33; i++) free(b[i].data);
}

static atomic_int released;
static void on_release(void *user, const void *data, uint64_t nbytes) {
    (void)nbytes;
    assert_ptr_equal(user, data);
    atomic_fetch_add(&released, 1);
}

/* An item whose source is borrowed (released through on_release, counted
 * from 0). */
static ect_push_item borrowed(item_buf *b, const char *addr) {
    ect_push_item it = item_of(b, addr);
    it.release = on_release;
    it.release_user = b->data;
    atomic_store(&released, 0);
    return it;
}

/* Sources are given back on the producer's own threads or inside a poll that
 * lends the caller's thread (pp_lend), never inside the caller's flush (a flush that finds no thread running the rounds runs them
 * itself, but hands writes and release callbacks to the dispatcher), each
 * exactly once and before its result: twelve steps of four borrowed items
 * flushed back to back, so flushes meet finished work of earlier steps. */
static pthread_t caller_thread;
static atomic_int released_on_caller, released_where;
static atomic_bool in_flush; /* the caller is inside _flush (flush_counted) */
static void on_release_where(void *user, const void *data, uint64_t nbytes) {
    (void)nbytes;
    assert_ptr_equal(user, data);
    if (pthread_equal(pthread_self(), caller_thread) && atomic_load(&in_flush))
        atomic_fetch_add(&released_on_caller, 1);
    atomic_fetch_add(&released_where, 1);
}

/* ect_push_producer_flush with in_flush set around it. */
static int flush_counted(ect_push_producer *p) {
    atomic_store(&in_flush, true);
    int n = ect_push_producer_flush(p);
    atomic_store(&in_flush, false);
    return n;
}

static void test_release_off_the_caller(void **st) {
    (void)st;
    enum { STEPS = 12, K = 4, N = STEPS * K };
    fake *f = fake_open(2, "tcp");
    ect_push_producer *p = prod_open(5000, 150000);
    caller_thread = pthread_self();
    atomic_store(&released_on_caller, 0);
    atomic_store(&released_where, 0);
    static item_buf b[N];
    static ect_push_result r[N];
    for (int s = 0; s < STEPS; s++) {
        for (int i = s * K; i < (s + 1) * K; i++) {
            item_make(&b[i], "rel", i, 16384);
            ect_push_item it = item_of(&b[i], f->addr);
            it.release = on_release_where;
            it.release_user = b[i].data;
            assert_int_equal(ect_push_producer_reserve(p, &it), 0);
        }
        assert_int_equal(flush_counted(p), K);
    }
    for (size_t got = 0; got < N;) {
        wait_results(p, r + got, 1, 20);
        assert_int_equal(r[got].status, 0);
        got++;
        assert_true((size_t)atomic_load(&released_where) >= got); /* released before reported */
    }
    assert_int_equal(atomic_load(&released_where), N);
    assert_int_equal(atomic_load(&released_on_caller), 0);
    for (int i = 0; i < N; i++) expect_bytes(&f->sh[1], b[i].tid, b[i].seed, b[i].nbytes);
    expect_drained(f, p);
    ect_push_producer_close(p);
    fake_close(f);
    for (int i = 0; i < N; i++) free(b[i].data);
}

/* A flush that finds a lane running the rounds leaves the new step to that
 * lane: it queues the reserve on itself and lets go of the baton, and
 * nothing is handed to the dispatcher (which would take the step's write
 * and send its complete on the other lane: two thread hand-offs more). The
 * flush is made from the first item's release callback, which runs on the
 * lane while it holds the baton, so the flush meets the running lane every
 * time. */
typedef struct reflush {
    ect_push_producer *p;
    ect_push_item next; /* pushed from the first release */
    atomic_int calls, flushed;
} reflush;
static reflush rf;
static void on_release_flush(void *user, const void *data, uint64_t nbytes) {
    (void)user;
    (void)data;
    (void)nbytes;
    if (atomic_fetch_add(&rf.calls, 1) != 0) return;
    if (ect_push_producer_reserve(rf.p, &rf.next) == 0)
        atomic_store(&rf.flushed, ect_push_producer_flush(rf.p));
}

static void test_flush_on_a_running_lane(void **st) {
    (void)st;
    fake *f = fake_open(1, "tcp");
    ect_push_producer *p = prod_open(5000, 150000);
    item_buf b[2];
    for (int i = 0; i < 2; i++) item_make(&b[i], "rf", i, 16384);
    rf.p = p;
    rf.next = item_of(&b[1], f->addr);
    rf.next.release = on_release_flush;
    atomic_store(&rf.calls, 0);
    atomic_store(&rf.flushed, 0);
    ect_push_item it = item_of(&b[0], f->addr);
    it.release = on_release_flush;
    uint64_t h0 = pp_handoffs(p);
    assert_int_equal(ect_push_producer_reserve(p, &it), 0);
    assert_int_equal(ect_push_producer_flush(p), 1);
    ect_push_result r[2];
    wait_results(p, r, 2, 10);
    assert_int_equal(r[0].status, 0);
    assert_int_equal(r[1].status, 0);
    assert_int_equal(atomic_load(&rf.calls), 2);
    assert_int_equal(atomic_load(&rf.flushed), 1);
    assert_int_equal(pp_handoffs(p) - h0, 0);
    for (int i = 0; i < 2; i++) expect_bytes(&f->sh[0], b[i].tid, b[i].seed, b[i].nbytes);
    expect_drained(f, p);
    ect_push_producer_close(p);
    fake_close(f);
    for (int i = 0; i < 2; i++) free(b[i].data);
}

/* One step in flight: each step's reserve, write, complete and result run
 * on the address's lane, whoever holds the baton when a reply comes back; in
 * particular a reply that returns while the caller's flush is still in its
 * round (the lane's wake-up often preempts the caller right after it queued
 * the reserve) is settled by the lane after that round, never handed to the
 * dispatcher. Before, 40-55 % of the steps of `ect bench push --steps 1`
 * took that detour; here any one of the steps doing so fails. */
static void lone_steps(const char *kind) {
    enum { STEPS = 100 };
    fake *f = fake_open(1, kind);
    ect_push_producer *p = prod_open(5000, 150000);
    uint64_t h0 = pp_handoffs(p);
    for (int i = 0; i < STEPS; i++) {
        item_buf b;
        item_make(&b, "lone", i, 65536);
        ect_push_item it = item_of(&b, f->addr);
        ect_push_result r;
        push_one(p, &it, &r, 10);
        assert_int_equal(r.status, 0);
        expect_bytes(&f->sh[0], b.tid, b.seed, b.nbytes);
        free(b.data);
    }
    assert_int_equal(pp_handoffs(p) - h0, 0);
    assert_int_equal(pp_lent(p), 0); /* a plain flush wakes its lane: nothing waits for a poll */
    expect_drained(f, p);
    ect_push_producer_close(p);
    fake_close(f);
}

static void test_lone_steps_stay_on_the_lane(void **st) {
    (void)st;
    lone_steps("tcp");
    lone_steps("shm");
}

/* flush_poll of one item: its result in *r (waits up to secs). */
static void push_one_lent(ect_push_producer *p, const ect_push_item *it, ect_push_result *r,
                          double secs) {
    assert_int_equal(ect_push_producer_reserve(p, it), 0);
    size_t m = 0;
    assert_int_equal(ect_push_producer_flush_poll(p, r, 1, (int)(secs * 1000), &m), 1);
    if (!m) wait_results(p, r, 1, secs);
}

/* flush_poll lends the calling thread: each lone step's reserve and
 * complete (and the settle, write and result between them) run on the
 * caller's thread in its wait, not on the address's lane thread (pp_lent
 * counts the exchanges so run). The flush leaves the idle lane asleep for
 * the wait that follows in the same call; a flush that meets the rounds
 * held by another thread (the dispatcher's timer, a lane) leaves its step to
 * it all the same (kick_lender). The first step connects on the lane (a
 * connect is never lent). Without lending none of the exchanges counts. */
static void lone_steps_lent(const char *kind) {
    enum { STEPS = 100 };
    fake *f = fake_open(1, kind);
    ect_push_producer *p = prod_open(5000, 150000);
    ect_push_result r0;
    size_t m = 7;
    assert_int_equal(ect_push_producer_flush_poll(p, &r0, 1, 10, NULL), ECT_EINVAL);
    assert_int_equal(ect_push_producer_flush_poll(p, NULL, 1, 10, &m), ECT_EINVAL);
    assert_int_equal(m, 0);
    assert_int_equal(ect_push_producer_flush_poll(p, NULL, 0, 0, &m), 0); /* nothing queued */
    for (int i = 0; i <= STEPS; i++) {
        if (i == 1) assert_int_equal(pp_lent(p), 0); /* the first step connects on the lane */
        item_buf b;
        item_make(&b, "lent", i, 65536);
        ect_push_item it = item_of(&b, f->addr);
        ect_push_result r;
        push_one_lent(p, &it, &r, 10);
        assert_int_equal(r.status, 0);
        expect_bytes(&f->sh[0], b.tid, b.seed, b.nbytes);
        free(b.data);
    }
    assert_int_equal(pp_lent(p), 2 * STEPS);
    assert_int_equal(pp_lend_yields(p), 0);
    assert_int_equal(pp_handoffs(p), 0);
    expect_drained(f, p);
    ect_push_producer_close(p);
    fake_close(f);
}

static void test_lone_steps_on_the_caller(void **st) {
    (void)st;
    lone_steps_lent("tcp");
    lone_steps_lent("shm");
}

/* A lent poll whose timeout runs out mid-exchange hands the exchange to the
 * lane's thread and returns with no result; the exchange keeps its own
 * control timeout and outcome. The shard holds the reserve (a consumer
 * that does not answer, `hold`) until the poll came back: with `answer`
 * it then answers and the item lands; without, the item fails with the
 * control timeout (no reply), as it would had the lane sent it. */
static void poll_gives_up(bool answer) {
    fake *f = fake_open(1, "tcp");
    shard *s = &f->sh[0];
    ect_push_producer *p = prod_open(answer ? 30000 : 1000, 150000);
    item_buf w, b;
    item_make(&w, "warm", 0, 4096);
    ect_push_item wi = item_of(&w, f->addr);
    ect_push_result r;
    push_one(p, &wi, &r, 10); /* connected */
    assert_int_equal(r.status, 0);
    expect_bytes(s, w.tid, w.seed, w.nbytes);
    atomic_store(&s->hold, true);
    item_make(&b, "late", 0, 65536);
    ect_push_item it = item_of(&b, f->addr);
    assert_int_equal(ect_push_producer_reserve(p, &it), 0);
    uint64_t l0 = pp_lent(p);
    size_t m = 1;
    assert_int_equal(ect_push_producer_flush_poll(p, &r, 1, 20, &m), 1);
    assert_int_equal(m, 0);                                    /* nothing, and it came back */
    assert_int_equal(pp_lend_yields(p), 1);                    /* it began the exchange */
    assert_int_equal(pp_lent(p) - l0, 1);
    if (answer) atomic_store(&s->hold, false);
    wait_results(p, &r, 1, 10);
    atomic_store(&s->hold, false);
    assert_string_equal(r.transfer_id, b.tid);
    if (answer) {
        assert_int_equal(r.status, 0);
        expect_bytes(s, b.tid, b.seed, b.nbytes);
        expect_drained(f, p);
    } else {
        assert_int_not_equal(r.status, 0); /* the control timeout ran its course */
        assert_non_null(strstr(r.error, "no reply to reserve_batch within 1000 ms"));
    }
    ect_push_producer_close(p);
    fake_close(f);
    free(w.data);
    free(b.data);
}

static void test_poll_gives_up_a_hung_exchange(void **st) {
    (void)st;
    poll_gives_up(false);
}

static void test_poll_gives_up_a_late_answer(void **st) {
    (void)st;
    poll_gives_up(true);
}

/* Waits until no thread runs the producer's rounds and no flush waits for
 * one: every flushed item's reserve is on its lane. */
static void wait_rounds_idle(ect_push_producer *p) {
    for (;;) {
        pthread_mutex_lock(&p->mu);
        bool idle = !p->running && !p->kick && !p->ho.set;
        pthread_mutex_unlock(&p->mu);
        if (idle) return;
        test_nap_ms(1);
    }
}

/* Steps in flight ride together: while the shard holds step 0's
 * reserve_batch, steps 1-3 are flushed (each its own reserve_batch) and
 * queue on the address's lane; once it answers, the lane sends the three
 * in one write, pipelined on its connection (a libzmq REP answers them in
 * turn), and every complete rides that lane too: no second lane (thread,
 * socket) per address. Every item lands, every byte checked. */
static void test_steps_in_flight_pipelined(void **st) {
    (void)st;
    enum { STEPS = 4, K = 3 };
    fake *f = fake_open(1, "tcp");
    shard *s = &f->sh[0];
    ect_push_producer *p = prod_open(30000, 150000);
    atomic_store(&s->hold, true);
    item_buf b[STEPS * K];
    for (int step = 0; step < STEPS; step++) {
        for (int j = 0; j < K; j++) {
            item_make(&b[step * K + j], "fl", step * K + j, 65536);
            ect_push_item it = item_of(&b[step * K + j], f->addr);
            assert_int_equal(ect_push_producer_reserve(p, &it), 0);
        }
        assert_int_equal(ect_push_producer_flush(p), K);
        if (step == 0) /* the shard holds it: the lane waits for its reply */
            while (atomic_load(&s->n_op[WIRE_OP_RESERVE_BATCH]) < 1) test_nap_ms(1);
        wait_rounds_idle(p);
    }
    assert_int_equal(lanes_queued(p->lanes, f->addr), STEPS - 1);
    atomic_store(&s->hold, false);
    ect_push_result r[STEPS * K];
    wait_results(p, r, STEPS * K, 10);
    for (int i = 0; i < STEPS * K; i++) assert_int_equal(r[i].status, 0);
    for (int i = 0; i < STEPS * K; i++) expect_bytes(s, b[i].tid, b[i].seed, b[i].nbytes);
    assert_true(pp_pipelined(p) >= STEPS - 2); /* steps 2 and 3 rode behind step 1 */
    assert_int_equal(atomic_load(&s->n_op[WIRE_OP_RESERVE_BATCH]), STEPS);
    assert_int_equal(lanes_count(p->lanes), 1); /* no completes lane */
    expect_drained(f, p);
    ect_push_producer_close(p);
    fake_close(f);
    for (int i = 0; i < STEPS * K; i++) free(b[i].data);
}

/* A borrowed source whose release scribbles over it: a write that read
 * the source after its release would land other bytes. */
static void on_release_scribble(void *user, const void *data, uint64_t nbytes) {
    assert_ptr_equal(user, data);
    memset(user, 0xa5, nbytes);
    atomic_fetch_add(&released, 1);
}

/* Writes in flight (producer_run.c): step A's write goes out while item B
 * waits unflushed (a live item beyond A's write), so no round waits for it:
 * it runs on the session's write lane and comes back on its own; A still
 * lands intact and completes after it. B, flushed alone once A is done, is
 * a lone step: written by the thread that runs its round, waited for. Small
 * items (under ASYNC_MIN_ITEM) keep the round's write either way: `unwaited`
 * is how many of A's writes went out unwaited (1 or 0). */
#define WU_SIZE (3u << 19) /* 1.5 MiB: a large item (producer_run.c, ASYNC_MIN_ITEM) */
static void write_unwaited(const char *kind, uint64_t size, uint64_t unwaited) {
    fake *f = fake_open(1, kind);
    ect_push_producer *p = prod_open(5000, 150000);
    item_buf b[2];
    ect_push_item it[2];
    for (int i = 0; i < 2; i++) {
        item_make(&b[i], "wu", i, size);
        it[i] = borrowed(&b[i], f->addr);
        it[i].release = on_release_scribble;
    }
    uint64_t a0 = pp_async_writes(p);
    ect_push_result r;
    push_one(p, &it[0], &r, 10); /* a lone step first: waited */
    assert_int_equal(r.status, 0);
    expect_bytes(&f->sh[0], b[0].tid, b[0].seed, b[0].nbytes);
    assert_int_equal(pp_async_writes(p) - a0, 0);
    free(b[0].data);
    item_make(&b[0], "wu", 2, size); /* A */
    it[0] = item_of(&b[0], f->addr);
    it[0].release = on_release_scribble;
    it[0].release_user = b[0].data;
    atomic_store(&f->sh[0].hold, true); /* A's reserve reply waits until B is live */
    assert_int_equal(ect_push_producer_reserve(p, &it[0]), 0);
    assert_int_equal(ect_push_producer_flush(p), 1);
    assert_int_equal(ect_push_producer_reserve(p, &it[1]), 0); /* B: live, unflushed */
    atomic_store(&f->sh[0].hold, false);
    wait_results(p, &r, 1, 10);
    assert_int_equal(r.status, 0);
    assert_string_equal(r.transfer_id, b[0].tid);
    assert_int_equal(pp_async_writes(p) - a0, unwaited);
    expect_bytes(&f->sh[0], b[0].tid, b[0].seed, b[0].nbytes);
    assert_int_equal(ect_push_producer_flush(p), 1);
    wait_results(p, &r, 1, 10);
    assert_int_equal(r.status, 0);
    assert_int_equal(pp_async_writes(p) - a0, unwaited); /* B alone: waited */
    expect_bytes(&f->sh[0], b[1].tid, b[1].seed, b[1].nbytes);
    assert_int_equal(atomic_load(&released), 3);
    expect_drained(f, p);
    ect_push_producer_close(p);
    fake_close(f);
    for (int i = 0; i < 2; i++) free(b[i].data);
}

static void test_write_unwaited_with_steps_in_flight(void **st) {
    (void)st;
    write_unwaited("tcp", WU_SIZE, 1);
    write_unwaited("shm", WU_SIZE, 1);
    write_unwaited("shm", 65536, 0);
}

/* Closing while a step's write may be out unwaited (its reply let go just
 * before): close waits for it before it gives the sources back and closes
 * the transports (ASan sees any use after), every source released once. */
static void close_with_write_out(const char *kind) {
    fake *f = fake_open(1, kind);
    ect_push_producer *p = prod_open(5000, 150000);
    item_buf b[2];
    ect_push_item it[2];
    for (int i = 0; i < 2; i++) {
        item_make(&b[i], "cw", i, WU_SIZE);
        it[i] = borrowed(&b[i], f->addr);
    }
    atomic_store(&f->sh[0].hold, true);
    assert_int_equal(ect_push_producer_reserve(p, &it[0]), 0);
    assert_int_equal(ect_push_producer_flush(p), 1);
    assert_int_equal(ect_push_producer_reserve(p, &it[1]), 0); /* live: A's write is unwaited */
    while (atomic_load(&f->sh[0].n_op[WIRE_OP_RESERVE_BATCH]) < 1) test_nap_ms(1);
    atomic_store(&f->sh[0].hold, false);
    while (pp_async_writes(p) < 1) test_nap_ms(1); /* A's write is queued on its lane */
    ect_push_producer_close(p);
    assert_int_equal(atomic_load(&released), 2);
    fake_close(f);
    for (int i = 0; i < 2; i++) free(b[i].data);
}

static void test_close_with_write_out(void **st) {
    (void)st;
    close_with_write_out("tcp");
    close_with_write_out("shm");
}

/* Steps kept in flight (a new one flushed as each result comes, as `ect
 * bench push --inflight` does) with borrowed sources scribbled over on
 * release: every item lands intact and is READY on the shard (its complete
 * went after its write), sources released once each; closing with the last
 * writes just settled leaves nothing behind. */
static void steps_in_flight_intact(const char *kind) {
    enum { STEPS = 16, FLIGHT = 4, SIZE = 5u << 18 }; /* 1.25 MiB: large (producer_run.c) */
    fake *f = fake_open(1, kind);
    ect_push_producer *p = prod_open(5000, 150000);
    item_buf b[STEPS];
    int started = 0, done = 0;
    atomic_store(&released, 0);
    while (done < STEPS) {
        for (; started < STEPS && started - done < FLIGHT; started++) {
            item_make(&b[started], "sf", started, SIZE);
            ect_push_item it = item_of(&b[started], f->addr);
            it.release = on_release_scribble;
            it.release_user = b[started].data;
            assert_int_equal(ect_push_producer_reserve(p, &it), 0);
            assert_int_equal(ect_push_producer_flush(p), 1);
        }
        ect_push_result r;
        wait_results(p, &r, 1, 10);
        assert_int_equal(r.status, 0);
        done++;
    }
    for (int i = 0; i < STEPS; i++) expect_bytes(&f->sh[0], b[i].tid, b[i].seed, b[i].nbytes);
    assert_int_equal(atomic_load(&released), STEPS);
    expect_drained(f, p);
    ect_push_producer_close(p);
    fake_close(f);
    for (int i = 0; i < STEPS; i++) free(b[i].data);
}

static void test_steps_in_flight_land_intact(void **st) {
    (void)st;
    steps_in_flight_intact("tcp");
    steps_in_flight_intact("shm");
}

/* Shard 1 of 3 refuses: the item fails naming the cause, the reservations
 * made on shards 0 and 2 are abandoned (their pools drain), and the
 * borrowed source is released exactly once. */
static void test_failed_shard_abandons_others(void **st) {
    (void)st;
    fake *f = fake_open(3, "tcp");
    atomic_store(&f->sh[1].fail_reserve, true);
    ect_push_producer *p = prod_open(5000, 150000);
    const char *addr = f->addr;
    item_buf b;
    item_make(&b, "fs", 0, 65536);
    ect_push_item it = borrowed(&b, addr);
    ect_push_result r;
    push_one(p, &it, &r, 20);
    assert_int_equal(r.status, ECT_EIO);
    assert_non_null(strstr(r.error, "injected reserve failure"));
    assert_string_equal(r.transfer_id, "fs-0");
    assert_int_equal(atomic_load(&released), 1);
    for (int s = 0; s < 3; s += 2) {
        assert_int_equal(atomic_load(&f->sh[s].n_op[WIRE_OP_CANCEL]), 1);
        rsv_stats rs = shard_stats(&f->sh[s]);
        assert_int_equal(rs.live, 0);
        assert_int_equal(rs.bytes_held, 0);
    }
    assert_int_equal(atomic_load(&f->sh[1].n_op[WIRE_OP_CANCEL]), 0);
    assert_int_equal(atomic_load(&f->sh[0].n_op[WIRE_OP_COMPLETE_BATCH]), 0);
    expect_drained(f, p);
    close_all(f, p, &b);
}

/* Shard 1 dies right after answering the reserves: the complete to it
 * fails (the peer is gone), the item is reported failed within a bounded
 * time, no hang, and the healthy shard's reservation is abandoned. The
 * control timeout is long: the healthy shard's answers must never meet it
 * (at 300 ms a test thread off its CPU that long failed the discovery, and
 * every item named the consumer, not shard 1). */
static void test_consumer_killed_mid_push(void **st) {
    (void)st;
    fake *f = fake_open(2, "tcp");
    atomic_store(&f->sh[1].die_after_op, WIRE_OP_RESERVE_BATCH);
    ect_push_producer *p = prod_open(30000, 150000);
    const char *addr = f->addr;
    item_buf b[3];
    for (int i = 0; i < 3; i++) {
        item_make(&b[i], "kill", i, 16384);
        ect_push_item it = item_of(&b[i], addr);
        assert_int_equal(ect_push_producer_reserve(p, &it), 0);
    }
    uint64_t t0 = ect_now_ms();
    assert_int_equal(ect_push_producer_flush(p), 3);
    ect_push_result r[3];
    wait_results(p, r, 3, 15);
    assert_true(ect_now_ms() - t0 < 120000); /* bounded: no hang */
    for (int i = 0; i < 3; i++) {
        assert_int_not_equal(r[i].status, 0);
        assert_non_null(strstr(r[i].error, "shard 1"));
    }
    rsv_stats rs = shard_stats(&f->sh[0]);
    assert_int_equal(rs.live, 0); /* abandoned on the healthy shard */
    assert_int_equal(rs.bytes_held, 0);
    ect_push_producer_stat ps;
    ect_push_producer_stats(p, &ps);
    assert_int_equal(ps.failed, 3);
    assert_int_equal(ps.staged_bytes_in_use, 0);
    ect_push_producer_close(p);
    /* The dead shard never heard the abandon; its reservations still wait
     * for a writer. End them here as its TTL would, and check they were
     * (its thread joined first: it ended itself, and its table is ours now). */
    fake_kill(&f->sh[1]);
    for (int i = 0; i < 3; i++) {
        bool cancelled = false;
        assert_int_equal(
            rsv_cancel(f->sh[1].t, b[i].tid, NULL, true, false, ect_now_ms(), &cancelled), 0);
        assert_true(cancelled);
    }
    fake_close(f);
    for (int i = 0; i < 3; i++) free(b[i].data);
}

/* Nothing listens at the consumer address: discovery fails, reported as a
 * failed transfer with the address in the text. And the caller never waits
 * on the network: against a consumer that accepts the connection but never
 * answers (3 s control timeout), reserve and flush return while the
 * exchange is still outstanding (no result yet, the item pending) — an
 * order, not a time. */
static void test_unreachable_consumer(void **st) {
    (void)st;
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    assert_int_equal(bind(lfd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(lfd, 16), 0);
    assert_int_equal(getsockname(lfd, (struct sockaddr *)&a, &alen), 0);
    char silent[64];
    snprintf(silent, sizeof silent, "127.0.0.1:%d", ntohs(a.sin_port));
    ect_push_producer *q = prod_open(3000, 150000);
    item_buf s;
    item_make(&s, "silent", 0, 1024);
    ect_push_item si = item_of(&s, silent);
    assert_int_equal(ect_push_producer_reserve(q, &si), 0);
    assert_int_equal(ect_push_producer_flush(q), 1);
    ect_push_result sr;
    assert_int_equal(ect_push_producer_poll(q, &sr, 1, 0), 0);
    assert_int_equal(ect_push_producer_pending(q), 1);
    ect_push_producer_close(q); /* does not wait the timeout out either: no result needed */
    close(lfd);
    free(s.data);

    ect_push_producer *p = prod_open(200, 150000);
    item_buf b;
    item_make(&b, "nobody", 0, 1024);
    ect_push_item it = item_of(&b, "127.0.0.1:1");
    ect_push_result r;
    push_one(p, &it, &r, 10);
    assert_int_not_equal(r.status, 0);
    assert_non_null(strstr(r.error, "127.0.0.1:1"));
    ect_push_producer_close(p);
    free(b.data);
}

/* A transfer_id is pushed once; repeated content under a new id is answered
 * `cached` by the consumer and costs no write. */
static void test_dedup(void **st) {
    (void)st;
    fake *f = fake_open(1, "tcp");
    ect_push_producer *p = prod_open(5000, 150000);
    const char *addr = f->addr;
    item_buf b;
    item_make(&b, "dd", 0, 32768);
    ect_push_item it = item_of(&b, addr);
    assert_int_equal(ect_push_producer_reserve(p, &it), 0);
    assert_err(ect_push_producer_reserve(p, &it), ECT_EEXIST, "already pushed");
    assert_int_equal(ect_push_producer_flush(p), 1);
    ect_push_result r;
    wait_results(p, &r, 1, 20);
    assert_int_equal(r.status, 0);
    assert_err(ect_push_producer_reserve(p, &it), ECT_EEXIST, "dd-0"); /* finished: still refused */
    expect_bytes(&f->sh[0], "dd-0", b.seed, b.nbytes);                 /* now resident */
    ect_push_producer_stat before, after;
    ect_push_producer_stats(p, &before);
    it.transfer_id = "dd-1"; /* same mm_hash */
    push_one(p, &it, &r, 20);
    assert_int_equal(r.status, 0);
    assert_string_equal(r.transfer_id, "dd-1");
    assert_string_equal(r.transport, ""); /* cached: nothing written */
    ect_push_producer_stats(p, &after);
    assert_int_equal(after.write_batches, before.write_batches);
    assert_int_equal(after.staged_bytes_in_use, 0);
    close_all(f, p, &b);
}

/* Cancel: an unflushed item ends at once; a reserved one is abandoned on
 * its shards and reported cancelled. */
static void test_cancel(void **st) {
    (void)st;
    fake *f = fake_open(2, "tcp");
    ect_push_producer *p = prod_open(5000, 150000);
    const char *addr = f->addr;
    assert_err(ect_push_producer_cancel(p, "nope"), ECT_ENOTFOUND, "nope");
    item_buf b[2];
    item_make(&b[0], "cx", 0, 4096);
    item_make(&b[1], "cx", 1, 4096);
    ect_push_item it = item_of(&b[0], addr);
    assert_int_equal(ect_push_producer_reserve(p, &it), 0);
    assert_int_equal(ect_push_producer_cancel(p, "cx-0"), 0);
    ect_push_result r;
    assert_int_equal(ect_push_producer_poll(p, &r, 1, 0), 1);
    assert_int_equal(r.status, ECT_ECANCELED);
    assert_int_equal(ect_push_producer_flush(p), 0);
    assert_int_equal(atomic_load(&f->sh[0].n_op[WIRE_OP_PEERS]), 0);
    /* reserved, source not staged yet */
    it = item_of(&b[1], addr);
    it.data = NULL;
    assert_int_equal(ect_push_producer_reserve(p, &it), 0);
    assert_int_equal(ect_push_producer_flush(p), 1);
    uint64_t end = ect_now_ms() + 10000;
    while (shard_stats(&f->sh[0]).live + shard_stats(&f->sh[1]).live < 2) {
        assert_true(ect_now_ms() < end);
        usleep(5000);
    }
    assert_int_equal(ect_push_producer_cancel(p, "cx-1"), 0);
    wait_results(p, &r, 1, 20);
    assert_int_equal(r.status, ECT_ECANCELED);
    assert_string_equal(r.transfer_id, "cx-1");
    for (int s = 0; s < 2; s++) {
        assert_int_equal(shard_stats(&f->sh[s]).live, 0);
        assert_int_equal(shard_stats(&f->sh[s]).bytes_held, 0);
    }
    assert_err(ect_push_producer_stage(p, "cx-1", b[1].data, b[1].nbytes, NULL, NULL), ECT_ESTATE,
               "finished");
    expect_drained(f, p);
    ect_push_producer_close(p);
    fake_close(f);
    free(b[0].data);
    free(b[1].data);
}

/* Waits until the producer applied the reserve replies of n shards of tid. */
static void wait_reserved(ect_push_producer *p, const char *tid, size_t n) {
    uint64_t end = ect_now_ms() + 10000;
    for (;;) {
        push_info in;
        pthread_mutex_lock(&p->mu);
        int rc = push_get(p->table, tid, &in);
        pthread_mutex_unlock(&p->mu);
        assert_int_equal(rc, 0);
        if (in.reserved == n) return;
        assert_true(ect_now_ms() < end);
        test_nap_ms(1);
    }
}

/* A reservation older than refresh_after_ms is refreshed (cancel with
 * refresh, then reserve anew) before the write, once; the bytes still land.
 * The producer runs on the test's clock (pp_set_clock), moved to the
 * refresh age once both replies are applied, so the new reservations are
 * written at age 0. On the real clock a thread off its CPU made either
 * count wrong: a reply applied late was still too young at the write, or a
 * new reservation aged past the 100 ms (its other shard's reply late) and
 * was refreshed again. */
static void test_refresh(void **st) {
    (void)st;
    fake *f = fake_open(2, "tcp");
    ect_push_producer *p = prod_open(5000, 100);
    uint64_t clock = ect_now_ms() + 60000; /* past any time the table was told yet */
    pp_set_clock(p, clock);
    const char *addr = f->addr;
    item_buf b;
    item_make(&b, "rf", 0, 8192);
    ect_push_item it = item_of(&b, addr);
    it.data = NULL;
    assert_int_equal(ect_push_producer_reserve(p, &it), 0);
    assert_int_equal(ect_push_producer_flush(p), 1);
    wait_reserved(p, "rf-0", 2);
    pp_set_clock(p, clock + 100);
    assert_err(ect_push_producer_stage(p, "rf-0", b.data, 1, NULL, NULL), ECT_EINVAL, "nbytes");
    assert_int_equal(ect_push_producer_stage(p, "rf-0", b.data, b.nbytes, NULL, NULL), 0);
    assert_err(ect_push_producer_stage(p, "rf-0", b.data, b.nbytes, NULL, NULL), ECT_ESTATE,
               "staged");
    assert_int_equal(ect_push_producer_flush(p), 0);
    ect_push_result r;
    wait_results(p, &r, 1, 20);
    assert_int_equal(r.status, 0);
    for (int s = 0; s < 2; s++) {
        assert_int_equal(atomic_load(&f->sh[s].n_items_cancel_refresh), 1);
        assert_int_equal(atomic_load(&f->sh[s].n_op[WIRE_OP_RESERVE_BATCH]), 2);
        expect_bytes(&f->sh[s], "rf-0", b.seed, b.nbytes);
    }
    ect_push_producer_stat ps;
    ect_push_producer_stats(p, &ps);
    assert_int_equal(ps.refreshes, 2);
    expect_drained(f, p);
    close_all(f, p, &b);
}

/* Closing with a push in flight (the shard answers slowly) returns without
 * waiting for the exchange in progress, fires the borrowed source's release
 * exactly once, and frees everything (ASan checks the rest). */
static void test_close_in_flight(void **st) {
    (void)st;
    fake *f = fake_open(1, "tcp");
    atomic_store(&f->sh[0].delay_ms, 300);
    ect_push_producer *p = prod_open(2000, 150000);
    const char *addr = f->addr;
    item_buf b;
    item_make(&b, "cl", 0, 4096);
    ect_push_item it = borrowed(&b, addr);
    assert_int_equal(ect_push_producer_reserve(p, &it), 0);
    assert_int_equal(ect_push_producer_flush(p), 1);
    uint64_t end = ect_now_ms() + 5000;
    while (atomic_load(&f->sh[0].n_op[WIRE_OP_RESERVE_BATCH]) == 0) {
        assert_true(ect_now_ms() < end);
        usleep(2000);
    }
    uint64_t t0 = ect_now_ms();
    ect_push_producer_close(p);
    assert_true(ect_now_ms() - t0 < 60000); /* no hang */
    assert_int_equal(atomic_load(&released), 1);
    /* the shard's reservation was never completed; end it as its TTL would */
    bool cancelled = false;
    pthread_mutex_lock(&f->sh[0].mu);
    assert_int_equal(rsv_cancel(f->sh[0].t, "cl-0", NULL, true, false, ect_now_ms(), &cancelled),
                     0);
    pthread_mutex_unlock(&f->sh[0].mu);
    fake_close(f);
    free(b.data);
}

/* Closing while the shard never answers (it holds the reserve; the control
 * timeout is ten minutes) cuts the exchange short: close returns, the item
 * ends (its borrowed source released exactly once, its result ECT_ECLOSED,
 * freed with the producer), the lane and its socket go (ASan checks that
 * nothing is left). Nothing is timed: a close that waited the exchange out,
 * as it did, runs into the test's timeout. */
static void test_close_during_a_hung_exchange(void **st) {
    (void)st;
    fake *f = fake_open(1, "tcp");
    shard *s = &f->sh[0];
    atomic_store(&s->hold, true);
    ect_push_producer *p = prod_open(600000, 150000);
    item_buf b;
    item_make(&b, "hung", 0, 4096);
    ect_push_item it = borrowed(&b, f->addr);
    assert_int_equal(ect_push_producer_reserve(p, &it), 0);
    assert_int_equal(ect_push_producer_flush(p), 1);
    uint64_t end = ect_now_ms() + 10000;
    while (atomic_load(&s->n_op[WIRE_OP_RESERVE_BATCH]) == 0) { /* the lane waits for it */
        assert_true(ect_now_ms() < end);
        test_nap_ms(1);
    }
    ect_push_producer_close(p);
    assert_int_equal(atomic_load(&released), 1);
    /* The shard answers to nobody, its thread ends; end the reservation that
     * answer made as its TTL would (its table is ours once it is joined). */
    atomic_store(&s->hold, false);
    fake_kill(s);
    bool cancelled = false;
    assert_int_equal(rsv_cancel(s->t, "hung-0", NULL, true, false, ect_now_ms(), &cancelled), 0);
    assert_true(cancelled);
    fake_close(f);
    free(b.data);
}

/* A producer that requires shm refuses a shard offering tcp: the item fails
 * naming both, nothing is written, the reservations are abandoned. */
static void test_transport_mismatch(void **st) {
    (void)st;
    fake *f = fake_open(2, "tcp");
    ect_push_producer_opts o;
    ect_push_producer_opts_init(&o);
    o.transport = "ucx-or-so";
    ect_push_producer *p = NULL;
    assert_err(ect_push_producer_open(&o, &p), ECT_EINVAL, "transport");
    o.transport = "shm";
    o.control_timeout_ms = 5000;
    assert_int_equal(ect_push_producer_open(&o, &p), 0);
    const char *addr = f->addr;
    item_buf b;
    item_make(&b, "tm", 0, 4096);
    ect_push_item it = item_of(&b, addr);
    ect_push_result r;
    push_one(p, &it, &r, 20);
    assert_int_equal(r.status, ECT_EIO);
    assert_non_null(strstr(r.error, "offers transport 'tcp'"));
    assert_non_null(strstr(r.error, "requires 'shm'"));
    assert_string_equal(r.transport, "");
    assert_int_equal(r.shards, 2);
    ect_push_producer_stat ps;
    ect_push_producer_stats(p, &ps);
    assert_int_equal(ps.write_batches, 0);
    for (int s = 0; s < 2; s++) {
        assert_int_equal(shard_stats(&f->sh[s]).live, 0);
        assert_int_equal(atomic_load(&f->sh[s].n_op[WIRE_OP_COMPLETE_BATCH]), 0);
    }
    close_all(f, p, &b);
}

/* The reserve_batch of a step goes to the shards in parallel: with every
 * shard holding its answer for 1.5 s, the shards are seen answering at the
 * same time (counted in the fake: an overlap, not a duration); one after
 * another there would never be more than one. */
static void test_shards_in_parallel(void **st) {
    (void)st;
    fake *f = fake_open(4, "tcp");
    for (int s = 0; s < 4; s++) atomic_store(&f->sh[s].delay_ms, 1500);
    atomic_store(&delaying_now, 0);
    atomic_store(&delaying_max, 0);
    ect_push_producer *p = prod_open(5000, 150000);
    const char *addr = f->addr;
    item_buf b;
    item_make(&b, "par", 0, 4096);
    ect_push_item it = item_of(&b, addr);
    ect_push_result r;
    push_one(p, &it, &r, 20);
    assert_int_equal(r.status, 0);
    assert_true(atomic_load(&delaying_max) >= 2);
    for (int s = 0; s < 4; s++) expect_bytes(&f->sh[s], "par-0", b.seed, b.nbytes);
    close_all(f, p, &b);
}

/* A consumer that names its transport in `peers` (ours does), or has another
 * number of shards than the producer expects: the item fails at discovery,
 * before any reserve reaches a shard. */
static void test_mismatch_costs_the_consumer_nothing(void **st) {
    (void)st;
    fake *f = fake_open(2, "tcp");
    f->peers_transport = true;
    const char *addr = f->addr;
    item_buf b;
    item_make(&b, "mm", 0, 4096);
    for (int round = 0; round < 2; round++) {
        ect_push_producer_opts o;
        ect_push_producer_opts_init(&o);
        o.control_timeout_ms = 5000;
        if (round == 0)
            o.transport = "shm";
        else
            o.expect_shards = 3;
        ect_push_producer *p = NULL;
        assert_int_equal(ect_push_producer_open(&o, &p), 0);
        ect_push_item it = item_of(&b, addr);
        ect_push_result r;
        push_one(p, &it, &r, 20);
        assert_true(r.status != 0);
        assert_non_null(strstr(r.error, "nothing was reserved"));
        assert_non_null(strstr(r.error, round == 0 ? "offers transport 'tcp', this producer "
                                                     "requires 'shm'"
                                                   : "has 2 shard(s)"));
        ect_push_producer_close(p);
    }
    for (int s = 0; s < 2; s++) {
        assert_int_equal(atomic_load(&f->sh[s].n_op[WIRE_OP_RESERVE_BATCH]), 0);
        assert_int_equal(shard_stats(&f->sh[s]).live, 0);
    }
    fake_close(f);
    free(b.data);
}

/* A full staging pool: reserve hands the unflushed items over and waits for
 * room (here the first item fails fast against a refused address and frees
 * its copy); with no wait allowed, or when nothing frees, it is ECT_EFULL;
 * an item larger than the pool is refused at once, saying so. */
static void test_staging_waits_for_room(void **st) {
    (void)st;
    fake *f = fake_open(1, "tcp");
    const char *live = f->addr;
    char dead[32];
    snprintf(dead, sizeof dead, "127.0.0.1:%d", 1); /* refused at once */
    ect_push_producer_opts o;
    ect_push_producer_opts_init(&o);
    o.staging_size = 1u << 20;
    o.control_timeout_ms = 5000;
    ect_push_producer *p = NULL;
    assert_int_equal(ect_push_producer_open(&o, &p), 0);
    item_buf big, a, b, c;
    item_make(&big, "st", 0, 2u << 20);
    item_make(&a, "st", 1, 1u << 20);
    item_make(&b, "st", 2, 1u << 20);
    item_make(&c, "st", 3, 1u << 20);
    ect_push_item it = item_of(&big, live);
    assert_err(ect_push_producer_reserve(p, &it), ECT_EFULL, "larger than the staging pool");
    it = item_of(&a, dead);
    assert_int_equal(ect_push_producer_reserve(p, &it), 0); /* fills the pool, not flushed */
    it = item_of(&b, live);
    assert_int_equal(ect_push_producer_reserve(p, &it), 0); /* waited: a failed and freed */
    ect_push_result r[2];
    wait_results(p, r, 1, 20);
    assert_string_equal(r[0].transfer_id, a.tid);
    assert_true(r[0].status != 0);
    ect_push_producer_stat ps;
    ect_push_producer_stats(p, &ps);
    assert_int_equal(ps.staging_waits, 1);
    ect_push_producer_close(p);
    /* nothing frees the pool (b waits for a consumer that answers slowly) */
    o.staging_wait_ms = 200;
    assert_int_equal(ect_push_producer_open(&o, &p), 0);
    atomic_store(&f->sh[0].delay_ms, 3000);
    b.tid[0] = 'S';
    it = item_of(&b, live);
    assert_int_equal(ect_push_producer_reserve(p, &it), 0);
    it = item_of(&c, live);
    assert_err(ect_push_producer_reserve(p, &it), ECT_EFULL, "stayed full");
    o.staging_wait_ms = 0; /* and without a wait: at once */
    ect_push_producer *q = NULL;
    assert_int_equal(ect_push_producer_open(&o, &q), 0);
    it = item_of(&a, dead);
    a.tid[0] = 'T';
    it = item_of(&a, dead);
    assert_int_equal(ect_push_producer_reserve(q, &it), 0);
    it = item_of(&c, dead);
    assert_err(ect_push_producer_reserve(q, &it), ECT_EFULL, NULL);
    ect_push_producer_close(q);
    wait_results(p, r, 1, 20);
    assert_int_equal(r[0].status, 0);
    ect_push_producer_close(p);
    fake_close(f);
    free(big.data);
    free(a.data);
    free(b.data);
    free(c.data);
}

/* Sets the option at offset `off` (of `size` bytes) to v. */
static void set_opt(ect_push_producer_opts *o, size_t off, size_t size, int64_t v) {
    char *f = (char *)o + off;
    if (size == sizeof(int)) {
        int i = (int)v;
        memcpy(f, &i, sizeof i);
    } else {
        uint64_t u = (uint64_t)v;
        memcpy(f, &u, sizeof u);
    }
}

#define OPT(field, v)                                                                              \
    {                                                                                              \
        offsetof(ect_push_producer_opts, field), sizeof(((ect_push_producer_opts *)0)->field), v,  \
            #field                                                                                 \
    }

static void test_bad_args(void **st) {
    (void)st;
    ect_push_producer_opts o;
    ect_push_producer_opts_init(&o);
    assert_int_equal(o.push_wait_ms, 60000);
    assert_int_equal(o.staging_wait_ms, 60000);
    assert_int_equal(o.expect_shards, 0);
    assert_int_equal(o.down_backoff_ms, 1000);
    assert_int_equal(o.down_backoff_max_ms, 30000);
    /* each option out of its range: refused, naming it */
    static const struct {
        size_t off, size;
        int64_t v;
        const char *name;
    } bad_opts[] = {
        OPT(push_wait_ms, 0),          OPT(staging_wait_ms, 3600001), OPT(expect_shards, 65),
        OPT(control_timeout_ms, 0),    OPT(refresh_after_ms, 0),      OPT(down_backoff_ms, 0),
        OPT(down_backoff_max_ms, 999),
    };
    for (size_t i = 0; i < ECT_ARRAY_LEN(bad_opts); i++) {
        ect_push_producer *p = (ect_push_producer *)&o;
        ect_push_producer_opts_init(&o);
        set_opt(&o, bad_opts[i].off, bad_opts[i].size, bad_opts[i].v);
        assert_err(ect_push_producer_open(&o, &p), ECT_EINVAL, bad_opts[i].name);
        assert_null(p);
    }
    /* each item field wrong: refused at once, naming it, nothing queued */
    static const struct {
        const char *transfer_id, *consumer, *dtype;
        uint64_t nbytes;
        const char *text; /* NULL: any */
    } bad_items[] = {
        {"bad-0", "no-port", "bfloat16", 4096, "consumer 'no-port' is not HOST:PORT"},
        {"bad-0", "127.0.0.1:0", "bfloat16", 4096, "consumer"},
        {"bad-0", "::1:5000", "bfloat16", 4096, "consumer"}, /* IPv6 in brackets */
        {"bad-0", "127.0.0.1:5000", "bfloat16", 4095, "nbytes"},
        {"bad-0", "127.0.0.1:5000", "complex1024", 4096, NULL},
        {"", "127.0.0.1:5000", "bfloat16", 4096, "transfer_id"},
    };
    ect_push_producer *p = prod_open(1000, 1000);
    item_buf b;
    item_make(&b, "bad", 0, 4096);
    for (size_t i = 0; i < ECT_ARRAY_LEN(bad_items); i++) {
        ect_push_item it = item_of(&b, bad_items[i].consumer);
        it.transfer_id = bad_items[i].transfer_id;
        it.dtype = bad_items[i].dtype;
        it.nbytes = bad_items[i].nbytes;
        assert_err(ect_push_producer_reserve(p, &it), ECT_EINVAL, bad_items[i].text);
    }
    assert_int_equal(ect_push_producer_pending(p), 0);
    ect_push_producer_close(p);
    ect_push_producer_close(NULL);
    free(b.data);
}

/* ------------------------------------------------ against the real consumer */

static void real_consumer(int tp, const char *kind) {
    ect_push_consumer_opts o;
    ect_push_consumer_opts_init(&o);
    o.pool_size = 64u << 20;
    o.transport = kind;
    test_inst in;
    test_inst_open(&in, tp, &o); /* tp ranks of one instance, consecutive ports */
    ect_push_consumer **c = in.c;
    int base = in.base;
    ect_push_producer *p = prod_open(5000, 150000);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", base);
    enum { K = 6 };
    item_buf b[K];
    for (int i = 0; i < K; i++) {
        item_make(&b[i], kind, i, 65536u * (unsigned)(i + 1));
        ect_push_item it = item_of(&b[i], addr);
        if (i % 2) { /* half borrowed, half copied */
            it.release = on_release;
            it.release_user = b[i].data;
        }
        assert_int_equal(ect_push_producer_reserve(p, &it), 0);
    }
    atomic_store(&released, 0);
    assert_int_equal(ect_push_producer_flush(p), K);
    ect_push_result r[K];
    wait_results(p, r, K, 30);
    for (int i = 0; i < K; i++) assert_int_equal(r[i].status, 0);
    assert_int_equal(atomic_load(&released), K / 2);
    for (int s = 0; s < tp; s++) {
        for (int i = 0; i < K; i++) {
            ect_push_view v;
            assert_int_equal(ect_push_consumer_take(c[s], b[i].tid, &v), 0);
            assert_int_equal(v.nbytes, b[i].nbytes);
            assert_string_equal(v.mm_hash, b[i].hash);
            assert_true(test_check_pattern(v.data, v.nbytes, b[i].seed));
            assert_int_equal(ect_push_consumer_release(c[s], &v), 0);
        }
        /* Delivered (taken, then released): the reservations end at once and
         * the bytes stay resident for dedup. */
        ect_push_consumer_stat cs;
        ect_push_consumer_stats(c[s], &cs);
        assert_int_equal(cs.live, 0);
        assert_int_equal(cs.resident, K);
        assert_int_equal(cs.bad_requests, 0);
    }
    ect_push_producer_stat ps;
    ect_push_producer_stats(p, &ps);
    assert_int_equal(ps.reserve_batches, (uint64_t)tp);
    assert_int_equal(ps.complete_batches, (uint64_t)tp);
    assert_int_equal(ps.staged_bytes_in_use, 0);
    ect_push_producer_close(p);
    for (int s = 0; s < tp; s++) ect_push_consumer_close(c[s]);
    for (int i = 0; i < K; i++) free(b[i].data);
}

static void test_real_consumer(void **st) {
    (void)st;
    real_consumer(2, "tcp");
    real_consumer(4, "shm");
}

/* shm offers (docs/PROTOCOL.md "shm", "Offers"): one-item steps, one after
 * the other, from our producer to our shard over shm. The producer names
 * its shm id in every reserve_batch; the shard offers each window on the
 * producer's connection before replying, so a step after the first writes
 * with no BEGIN (counted by the producer's shm transport). A producer that
 * does not name an id (as an upstream one never does) writes every step
 * with a BEGIN, and its items land the same. */
static uint64_t steps_over_shm(bool name_id, uint64_t *offers) {
    ect_push_consumer_opts o;
    ect_push_consumer_opts_init(&o);
    o.pool_size = 16u << 20;
    o.transport = "shm";
    test_inst in;
    test_inst_open(&in, 1, &o);
    ect_push_producer *p = prod_open(5000, 150000);
    if (!name_id) p->batch.shm_id = 0; /* before the first reserve */
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", in.base);
    enum { K = 12 };
    for (int i = 0; i < K; i++) {
        item_buf b;
        item_make(&b, name_id ? "offered" : "asked", i, 65536u);
        ect_push_item it = item_of(&b, addr);
        assert_int_equal(ect_push_producer_reserve(p, &it), 0);
        assert_int_equal(ect_push_producer_flush(p), 1);
        ect_push_result r;
        wait_results(p, &r, 1, 30);
        assert_int_equal(r.status, 0);
        ect_push_view v;
        assert_int_equal(ect_push_consumer_take(in.c[0], b.tid, &v), 0);
        assert_true(test_check_pattern(v.data, v.nbytes, b.seed));
        assert_int_equal(ect_push_consumer_release(in.c[0], &v), 0);
        free(b.data);
    }
    uint64_t begins = 0;
    *offers = 0;
    for (pp_xport *e = p->xports; e; e = e->next)
        if (!strcmp(e->kind, "shm")) shm_counts(e->x, &begins, offers);
    ect_push_producer_close(p);
    ect_push_consumer_close(in.c[0]);
    return begins;
}

static void test_shm_steps_offered(void **st) {
    (void)st;
    uint64_t offers;
    /* The first step connects (nothing to offer to yet); a later step asks
     * only when its offer was skipped (it met the shard's connection thread
     * mid-GRANT, or a full socket: offers never wait), and each skip is
     * counted: every BEGIN but the first two is accounted for (the second
     * step writes into the spare the first reserve was granted before the
     * connection existed: docs/PROTOCOL.md "a spare range granted ahead"). */
    uint64_t skips0 = shm_offer_skips();
    uint64_t begins = steps_over_shm(true, &offers);
    uint64_t skips = shm_offer_skips() - skips0;
    assert_true(begins >= 1 && begins <= 2 + skips);
    assert_true(offers + skips >= 8);
    begins = steps_over_shm(false, &offers);
    assert_int_equal(begins, 12);
    assert_int_equal(offers, 0);
}

/* ------------------------------------------------ dead and hung consumers */

/* Binds shard s again on its old port after fake_kill (a restart). */
static void fake_revive(fake *f, shard *s) {
    s->rep = zmq_socket(f->zctx, ZMQ_REP);
    int zero = 0;
    zmq_setsockopt(s->rep, ZMQ_LINGER, &zero, sizeof zero);
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", s->port);
    int rc = -1;
    for (int i = 0; i < 100 && rc != 0; i++) /* the old listener may linger a moment */
        if ((rc = zmq_bind(s->rep, ep)) != 0) usleep(20000);
    assert_int_equal(rc, 0);
    atomic_store(&s->die_after_op, 0);
    atomic_store(&s->stop, false);
    pthread_create(&s->th, NULL, serve, s);
}

static ect_push_producer *prod_open_backoff(int control_timeout_ms, int backoff_ms,
                                            int backoff_max_ms) {
    ect_push_producer_opts o;
    ect_push_producer_opts_init(&o);
    o.staging_size = 32u << 20;
    o.control_timeout_ms = control_timeout_ms;
    o.connect_timeout_ms = 1000;
    o.io_timeout_ms = 2000;
    o.down_backoff_ms = backoff_ms;
    o.down_backoff_max_ms = backoff_max_ms;
    ect_push_producer *p = NULL;
    assert_int_equal(ect_push_producer_open(&o, &p), 0);
    return p;
}

/* The deterministic case of test_release_off_the_caller: an address held
 * down after a refused exchange fails the next push inside the flush's own
 * round (no exchange goes out), so the flush meets a release callback and a
 * result at once; both go to the dispatcher, the callback never runs on the
 * caller's thread. */
static void test_release_off_the_caller_held_down(void **st) {
    (void)st;
    ect_push_producer *p = prod_open_backoff(2000, 60000, 60000);
    caller_thread = pthread_self();
    atomic_store(&released_on_caller, 0);
    atomic_store(&released_where, 0);
    item_buf b[2];
    for (int i = 0; i < 2; i++) {
        item_make(&b[i], "nobody", i, 1024);
        ect_push_item it = item_of(&b[i], "127.0.0.1:1");
        it.release = on_release_where;
        it.release_user = b[i].data;
        ect_push_result r;
        assert_int_equal(ect_push_producer_reserve(p, &it), 0);
        assert_int_equal(flush_counted(p), 1);
        wait_results(p, &r, 1, 10);
        assert_int_not_equal(r.status, 0);
        assert_non_null(strstr(r.error, "127.0.0.1:1"));
        assert_int_equal(atomic_load(&released_where), i + 1);
    }
    assert_int_equal(atomic_load(&released_on_caller), 0);
    ect_push_producer_close(p);
    for (int i = 0; i < 2; i++) free(b[i].data);
}

#define DEAD_N 200
#define DEAD_STEPS 10
#define LIVE_PER_STEP 2

/* The consumer dies (both ranks) after a good step; 200 items in 10 steps
 * then all fail, together far faster than one control timeout per step
 * (10 s each: the old behaviour took >= 100 s; the bound is 3 timeouts, which
 * a loaded machine does not reach), each naming the address, while
 * a second, healthy consumer's items pushed in the same steps all land. After
 * a restart on the same ports and one backoff period, pushes work again. */
static void test_dead_consumer_fails_fast(void **st) {
    (void)st;
    const int ctl_ms = 10000;
    fake *dead = fake_open(2, "tcp"), *live = fake_open(1, "tcp");
    ect_push_producer *p = prod_open_backoff(ctl_ms, 300, 1200);
    const char *daddr = dead->addr, *laddr = live->addr;
    item_buf warm;
    item_make(&warm, "warm", 0, 4096);
    ect_push_item wi = item_of(&warm, daddr);
    ect_push_result wr;
    push_one(p, &wi, &wr, 20);
    assert_int_equal(wr.status, 0); /* discovered, sockets connected */
    fake_kill(&dead->sh[0]);
    fake_kill(&dead->sh[1]);

    item_buf *bd = calloc(DEAD_N, sizeof *bd);
    item_buf bl[DEAD_STEPS * LIVE_PER_STEP];
    ect_push_result *r = calloc(DEAD_N + DEAD_STEPS * LIVE_PER_STEP, sizeof *r);
    uint64_t t0 = ect_now_ms();
    for (int s = 0, d = 0; s < DEAD_STEPS; s++) {
        for (int k = 0; k < DEAD_N / DEAD_STEPS; k++, d++) {
            item_make(&bd[d], "dead", d, 1024);
            ect_push_item it = item_of(&bd[d], daddr);
            assert_int_equal(ect_push_producer_reserve(p, &it), 0);
        }
        for (int k = 0; k < LIVE_PER_STEP; k++) {
            int i = s * LIVE_PER_STEP + k;
            item_make(&bl[i], "live", i, 8192);
            ect_push_item it = item_of(&bl[i], laddr);
            assert_int_equal(ect_push_producer_reserve(p, &it), 0);
        }
        assert_int_equal(ect_push_producer_flush(p), DEAD_N / DEAD_STEPS + LIVE_PER_STEP);
        usleep(20000); /* separate steps, as an engine's would be */
    }
    size_t total = DEAD_N + DEAD_STEPS * LIVE_PER_STEP;
    wait_results(p, r, total, 30);
    uint64_t took = ect_now_ms() - t0;
    /* one timeout per step would be >= 10 s; 3 timeouts leave room for a
     * loaded machine yet catch any per-step or per-item wait */
    assert_true(took < 3u * (uint64_t)ctl_ms);
    char port[16];
    snprintf(port, sizeof port, ":%d", dead->sh[0].port);
    char port1[16];
    snprintf(port1, sizeof port1, ":%d", dead->sh[1].port);
    size_t n_dead = 0, n_live = 0;
    for (size_t i = 0; i < total; i++) {
        if (!strncmp(r[i].transfer_id, "live-", 5)) {
            assert_int_equal(r[i].status, 0);
            n_live++;
            continue;
        }
        n_dead++;
        assert_int_not_equal(r[i].status, 0);
        assert_non_null(strstr(r[i].error, "unreachable"));
        assert_true(strstr(r[i].error, port) || strstr(r[i].error, port1));
        assert_non_null(strstr(r[i].error, "127.0.0.1"));
    }
    assert_int_equal(n_dead, DEAD_N);
    assert_int_equal(n_live, DEAD_STEPS * LIVE_PER_STEP);
    for (int i = 0; i < DEAD_STEPS * LIVE_PER_STEP; i++)
        expect_bytes(&live->sh[0], bl[i].tid, bl[i].seed, bl[i].nbytes);

    /* restart on the same ports: after the backoff (at most 1.2 s) the next
     * push probes, finds it and goes through */
    fake_revive(dead, &dead->sh[0]);
    fake_revive(dead, &dead->sh[1]);
    usleep(1300 * 1000);
    item_buf again;
    item_make(&again, "again", 0, 4096);
    ect_push_item ai = item_of(&again, daddr);
    ect_push_result ar;
    push_one(p, &ai, &ar, 20);
    assert_int_equal(ar.status, 0);
    for (int s = 0; s < 2; s++) expect_bytes(&dead->sh[s], "again-0", again.seed, again.nbytes);
    expect_drained(live, p);
    ect_push_producer_close(p);
    fake_close(dead);
    fake_close(live);
    for (int i = 0; i < DEAD_N; i++) free(bd[i].data);
    for (int i = 0; i < DEAD_STEPS * LIVE_PER_STEP; i++) free(bl[i].data);
    free(bd);
    free(r);
    free(warm.data);
    free(again.data);
}

/* A consumer that accepts connections but never answers (alive but hung:
 * a listening socket nobody serves) costs its own item the control timeout,
 * but a healthy consumer's items in the same step land before that (their
 * results come first: an order, not a time); the next push to the hung one
 * fails without an exchange (held down: no control request goes out). */
static void test_hung_consumer_does_not_block_others(void **st) {
    (void)st;
    const int ctl_ms = 10000;
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    assert_int_equal(bind(lfd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(lfd, 16), 0);
    assert_int_equal(getsockname(lfd, (struct sockaddr *)&a, &alen), 0);
    char haddr[64], laddr[64];
    snprintf(haddr, sizeof haddr, "127.0.0.1:%d", ntohs(a.sin_port));
    fake *live = fake_open(1, "tcp");
    snprintf(laddr, sizeof laddr, "%s", live->addr);
    ect_push_producer *p = prod_open_backoff(ctl_ms, 5000, 5000);
    item_buf h, l[4];
    item_make(&h, "hung", 0, 1024);
    ect_push_item hi = item_of(&h, haddr);
    assert_int_equal(ect_push_producer_reserve(p, &hi), 0); /* first in the step */
    for (int i = 0; i < 4; i++) {
        item_make(&l[i], "ok", i, 8192);
        ect_push_item it = item_of(&l[i], laddr);
        assert_int_equal(ect_push_producer_reserve(p, &it), 0);
    }
    assert_int_equal(ect_push_producer_flush(p), 5);
    ect_push_result r[5];
    wait_results(p, r, 4, 20);
    for (int i = 0; i < 4; i++) { /* first, before the hung exchange's timeout */
        assert_int_equal(r[i].status, 0);
        assert_int_equal(strncmp(r[i].transfer_id, "ok-", 3), 0);
    }
    wait_results(p, r + 4, 1, 20);
    assert_string_equal(r[4].transfer_id, "hung-0");
    assert_int_equal(r[4].status, ECT_ETIMEDOUT);
    assert_non_null(strstr(r[4].error, haddr));
    assert_non_null(strstr(r[4].error, "unreachable"));
    free(h.data);
    item_make(&h, "hung", 1, 1024); /* held down now: fails at once */
    hi = item_of(&h, haddr);
    ect_push_producer_stat before, after;
    ect_push_producer_stats(p, &before);
    assert_int_equal(ect_push_producer_reserve(p, &hi), 0);
    assert_int_equal(ect_push_producer_flush(p), 1);
    wait_results(p, r, 1, 20);
    ect_push_producer_stats(p, &after);
    assert_int_equal(after.control_requests, before.control_requests); /* nothing sent */
    assert_int_not_equal(r[0].status, 0);
    assert_non_null(strstr(r[0].error, "unreachable"));
    assert_non_null(strstr(r[0].error, haddr));
    for (int i = 0; i < 4; i++) expect_bytes(&live->sh[0], l[i].tid, l[i].seed, l[i].nbytes);
    ect_push_producer_close(p);
    close(lfd);
    fake_close(live);
    for (int i = 0; i < 4; i++) free(l[i].data);
    free(h.data);
}

/* ------------------------------------- a spare range granted ahead (ect_put) */

/* An upstream-style shard (the fake: it reads only the fields it knows, so
 * it never grants a spare) never gets an ect_put: every lone step is
 * reserve_batch + complete_batch, and the items land. */
static void test_upstream_shard_never_gets_put(void **st) {
    (void)st;
    fake *f = fake_open(1, "tcp");
    ect_push_producer *p = prod_open(5000, 150000);
    enum { STEPS = 6 };
    for (int i = 0; i < STEPS; i++) {
        item_buf b;
        item_make(&b, "up", i, 65536);
        ect_push_item it = item_of(&b, f->addr);
        ect_push_result r;
        push_one_lent(p, &it, &r, 10);
        assert_int_equal(r.status, 0);
        expect_bytes(&f->sh[0], b.tid, b.seed, b.nbytes);
        free(b.data);
    }
    assert_int_equal(atomic_load(&f->sh[0].n_op[WIRE_OP_ECT_PUT]), 0);
    assert_int_equal(atomic_load(&f->sh[0].n_op[WIRE_OP_RESERVE_BATCH]), STEPS);
    assert_int_equal(atomic_load(&f->sh[0].n_op[WIRE_OP_COMPLETE_BATCH]), STEPS);
    ect_push_producer_stat ps;
    ect_push_producer_stats(p, &ps);
    assert_int_equal(ps.puts, 0);
    expect_drained(f, p);
    ect_push_producer_close(p);
    fake_close(f);
}

/* One item pushed as a lone step through flush_poll into our consumer; its
 * bytes checked there (taken and released). Returns the control requests
 * the step cost. */
static uint64_t lone_into(ect_push_producer *p, ect_push_consumer *c, const char *addr,
                          const char *prefix, int i, uint64_t nbytes, const char *hash) {
    item_buf b;
    item_make(&b, prefix, i, nbytes);
    if (hash) snprintf(b.hash, sizeof b.hash, "%s", hash);
    ect_push_item it = item_of(&b, addr);
    ect_push_producer_stat before, after;
    ect_push_producer_stats(p, &before);
    ect_push_result r;
    push_one_lent(p, &it, &r, 10);
    if (r.status) fail_msg("%s: %s", b.tid, r.error);
    ect_push_producer_stats(p, &after);
    ect_push_view v;
    assert_int_equal(ect_push_consumer_take(c, b.tid, &v), 0);
    assert_int_equal(v.nbytes, nbytes);
    assert_true(test_check_pattern(v.data, v.nbytes, b.seed));
    assert_int_equal(ect_push_consumer_release(c, &v), 0);
    free(b.data);
    return after.control_requests - before.control_requests;
}

static void open_one(test_inst *in, const char *kind, uint64_t pool, char *addr, size_t cap) {
    ect_push_consumer_opts o;
    ect_push_consumer_opts_init(&o);
    o.pool_size = pool;
    o.transport = kind;
    test_inst_open(in, 1, &o);
    snprintf(addr, cap, "127.0.0.1:%d", in->base);
}

/* Against our shard, a lone step after the first costs one control request
 * (an ect_put into the spare the previous step was granted) and lands the
 * right bytes, over tcp and shm. */
static void puts_one_round_trip(const char *kind) {
    test_inst in;
    char addr[64];
    open_one(&in, kind, 16u << 20, addr, sizeof addr);
    ect_push_producer *p = prod_open(5000, 150000);
    lone_into(p, in.c[0], addr, "first", 0, 65536, NULL); /* peers, reserve (+ spare), complete */
    enum { STEPS = 20 };
    for (int i = 1; i <= STEPS; i++)
        assert_int_equal(lone_into(p, in.c[0], addr, kind, i, 65536 - 8u * (unsigned)i, NULL), 1);
    ect_push_producer_stat ps;
    ect_push_producer_stats(p, &ps);
    assert_int_equal(ps.puts, STEPS);
    assert_int_equal(ps.put_refusals, 0);
    assert_int_equal(ps.complete_batches, 1);
    ect_push_producer_close(p);
    test_inst_close_checked(&in);
}

static void test_put_one_round_trip(void **st) {
    (void)st;
    puts_one_round_trip("tcp");
    puts_one_round_trip("shm");
}

/* A put the shard refuses costs the item nothing but that round trip: an
 * mm_hash the shard has cached is not the plain case, so the put is refused
 * and the item is reserved the normal way, answered from the cache (dedup
 * still works: no bytes move); the next lone item uses the spare that
 * reserve granted. */
static void test_put_refused_cached_hash(void **st) {
    (void)st;
    test_inst in;
    char addr[64];
    open_one(&in, "tcp", 16u << 20, addr, sizeof addr);
    ect_push_producer *p = prod_open(5000, 150000);
    lone_into(p, in.c[0], addr, "c", 0, 65536, "same-hash");
    ect_push_consumer_stat cs0, cs1;
    ect_push_consumer_stats(in.c[0], &cs0);
    /* the same bytes under the same hash, another transfer_id: put refused,
     * reserve answered `cached` (the pattern's seed differs, so check the
     * bytes are the first item's: taken from the cache) */
    item_buf b;
    item_make(&b, "c", 0, 65536);
    snprintf(b.tid, sizeof b.tid, "c-again");
    snprintf(b.hash, sizeof b.hash, "same-hash");
    ect_push_item it = item_of(&b, addr);
    ect_push_result r;
    push_one_lent(p, &it, &r, 10);
    assert_int_equal(r.status, 0);
    ect_push_view v;
    assert_int_equal(ect_push_consumer_take(in.c[0], "c-again", &v), 0);
    assert_true(test_check_pattern(v.data, v.nbytes, b.seed));
    assert_int_equal(ect_push_consumer_release(in.c[0], &v), 0);
    free(b.data);
    ect_push_consumer_stats(in.c[0], &cs1);
    ect_push_producer_stat ps;
    ect_push_producer_stats(p, &ps);
    assert_int_equal(ps.puts, 1);
    assert_int_equal(ps.put_refusals, 1);
    assert_int_equal(ps.write_batches, 1); /* the reserve was answered `cached`: no write */
    assert_int_equal(lone_into(p, in.c[0], addr, "c", 2, 65536, NULL), 1); /* the next spare */
    ect_push_producer_close(p);
    test_inst_close_checked(&in);
}

/* Pool pressure frees spares: producer A holds a spare, producer B reserves
 * an item that fits only if the spare goes (the pool is otherwise full of
 * an item nobody released): B's reserve is served, not refused as full.
 * A's next lone item names the freed spare: the put is refused and the item
 * lands by the normal path. Nothing leaks (the shard drains). */
static void test_pool_pressure_frees_spares(void **st) {
    (void)st;
    test_inst in;
    char addr[64];
    open_one(&in, "shm", 4u << 20, addr, sizeof addr);
    ect_push_producer *a = prod_open(5000, 150000), *pb = prod_open(5000, 150000);
    lone_into(a, in.c[0], addr, "a", 0, 512u << 10, NULL); /* A holds a spare of 512 KiB */
    item_buf hold;
    item_make(&hold, "hold", 0, 3u << 20); /* 3 MiB kept READY (not taken; asks no spare) */
    ect_push_item it = item_of(&hold, addr);
    ect_push_result r;
    push_one_lent(pb, &it, &r, 10);
    assert_int_equal(r.status, 0);
    /* 4 MiB pool, first fit: A's first item (resident) 512 KiB, A's spare
     * 512 KiB, the held item 3 MiB: full */
    item_buf big;
    item_make(&big, "big", 0, 768u << 10); /* fits only once the resident and the spare go */
    it = item_of(&big, addr);
    push_one_lent(pb, &it, &r, 10);
    if (r.status) fail_msg("B: %s", r.error);
    ect_push_producer_stat ps;
    ect_push_producer_stats(pb, &ps);
    assert_int_equal(ps.full_refusals, 0);
    /* A's spare is gone: its put is refused, the item reserved and written */
    assert_int_equal(lone_into(a, in.c[0], addr, "a", 1, 65536, NULL), 2 + 1);
    ect_push_producer_stats(a, &ps);
    assert_int_equal(ps.puts, 1);
    assert_int_equal(ps.put_refusals, 1);
    ect_push_view v;
    assert_int_equal(ect_push_consumer_take(in.c[0], hold.tid, &v), 0);
    assert_int_equal(ect_push_consumer_release(in.c[0], &v), 0);
    assert_int_equal(ect_push_consumer_take(in.c[0], big.tid, &v), 0);
    assert_true(test_check_pattern(v.data, v.nbytes, big.seed));
    assert_int_equal(ect_push_consumer_release(in.c[0], &v), 0);
    ect_push_producer_close(a);
    ect_push_producer_close(pb);
    free(hold.data);
    free(big.data);
    test_inst_close_checked(&in);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_upstream_shard_never_gets_put),
        cmocka_unit_test(test_put_one_round_trip),
        cmocka_unit_test(test_put_refused_cached_hash),
        cmocka_unit_test(test_pool_pressure_frees_spares),
        cmocka_unit_test(test_bad_args),
        cmocka_unit_test(test_happy),
        cmocka_unit_test(test_round_trips_constant),
        cmocka_unit_test(test_failed_shard_abandons_others),
        cmocka_unit_test(test_consumer_killed_mid_push),
        cmocka_unit_test(test_unreachable_consumer),
        cmocka_unit_test(test_dead_consumer_fails_fast),
        cmocka_unit_test(test_hung_consumer_does_not_block_others),
        cmocka_unit_test(test_dedup),
        cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_refresh),
        cmocka_unit_test(test_shards_in_parallel),
        cmocka_unit_test(test_transport_mismatch),
        cmocka_unit_test(test_mismatch_costs_the_consumer_nothing),
        cmocka_unit_test(test_staging_waits_for_room),
        cmocka_unit_test(test_close_in_flight),
        cmocka_unit_test(test_close_during_a_hung_exchange),
        cmocka_unit_test(test_release_off_the_caller),
        cmocka_unit_test(test_release_off_the_caller_held_down),
        cmocka_unit_test(test_flush_on_a_running_lane),
        cmocka_unit_test(test_lone_steps_stay_on_the_lane),
        cmocka_unit_test(test_lone_steps_on_the_caller),
        cmocka_unit_test(test_poll_gives_up_a_hung_exchange),
        cmocka_unit_test(test_poll_gives_up_a_late_answer),
        cmocka_unit_test(test_steps_in_flight_pipelined),
        cmocka_unit_test(test_write_unwaited_with_steps_in_flight),
        cmocka_unit_test(test_steps_in_flight_land_intact),
        cmocka_unit_test(test_close_with_write_out),
        cmocka_unit_test(test_real_consumer),
        cmocka_unit_test(test_shm_steps_offered),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
