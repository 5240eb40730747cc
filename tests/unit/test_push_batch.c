/*
 * Tests for push/batch, the push producer's batcher, without sockets: a
 * records table and a batcher run rounds, and the tests play the consumer by
 * filling in the exchanges' replies. They check what would cross the wire
 * (one reserve_batch and one complete_batch per shard address, one write
 * batch per destination session carrying each shard's region key), that
 * discovery's checks fail items before anything is reserved, that a dead
 * address is held down (its next work settles at once, nothing sent), and
 * the statuses and texts the items end with.
 */
#include <stdio.h>
#include <stdlib.h>

#include "testutil.h"
#include "push/batch.h"

#define NOW 1000
#define NBYTES 4096

static const uint64_t SHAPE[1] = {2048};

typedef struct fx {
    push_table *t;
    pbatch b;
    push_action a[256];
    push_final fin[64]; /* reports seen */
    size_t nfin;
    char src[NBYTES];
} fx;

static fx *fx_open(const char *transport, unsigned expect_shards) {
    fx *f = calloc(1, sizeof *f);
    push_opts o;
    push_opts_init(&o);
    assert_int_equal(push_open(&o, &f->t), 0);
    f->b.t = f->t;
    assert_int_equal(down_open(1000, 4000, &f->b.downs), 0);
    snprintf(f->b.transport, sizeof f->b.transport, "%s", transport);
    f->b.expect_shards = expect_shards;
    return f;
}

static void fx_close(fx *f) {
    push_close(f->t);
    down_close(f->b.downs);
    free(f);
}

static void add(fx *f, const char *tid, const char *host, int port) {
    char consumer[64];
    snprintf(consumer, sizeof consumer, "%s:%d", host, port);
    push_source src = {.data = f->src};
    push_item it = {.transfer_id = tid,
                    .consumer = consumer,
                    .host = host,
                    .port = port,
                    .mm_hash = tid,
                    .nbytes = NBYTES,
                    .shape = SHAPE,
                    .ndim = 1,
                    .dtype = "bfloat16",
                    .src = &src};
    assert_int_equal(push_add(f->t, &it, NOW, NULL), 0);
}

/* One round: the table's actions into exchanges (returned in order); the
 * reports go to f->fin. */
static px *round_(fx *f) {
    size_t n = push_next_actions(f->t, NOW, f->a, 256);
    assert_int_equal(push_check(f->t), 0);
    px *xs = NULL;
    pb_build(&f->b, f->a, n, NOW, &xs);
    for (size_t i = 0; i < n; i++)
        if (f->a[i].kind == PUSH_ACT_FINISHED) f->fin[f->nfin++] = f->a[i].fin;
    return xs;
}

static size_t count(const px *x) {
    size_t n = 0;
    for (; x; x = x->next) n++;
    return n;
}

/* Answers a peers exchange with ports base, base+1, ... */
static void answer_peers(px *x, int base, size_t n, const char *transport) {
    assert_int_equal(x->kind, PX_PEERS);
    assert_int_equal(x->req.op, WIRE_OP_PEERS);
    x->rep.op = WIRE_OP_PEERS;
    x->rep.ok = true;
    x->rep.u.peers.n = n;
    x->rep.u.peers.ports = calloc(n ? n : 1, sizeof *x->rep.u.peers.ports);
    for (size_t i = 0; i < n; i++) x->rep.u.peers.ports[i] = (uint16_t)(base + (int)i);
    snprintf(x->rep.u.peers.transport, sizeof x->rep.u.peers.transport, "%s", transport);
}

/* Answers every item of a reserve_batch: write into dst 0x1000 * (k + 1) at
 * session "sess-PORT" with key "key-PORT", transport `kind`. */
static void answer_reserve(px *x, const char *kind) {
    assert_int_equal(x->req.op, WIRE_OP_RESERVE_BATCH);
    x->rep.op = WIRE_OP_RESERVE_BATCH;
    x->rep.ok = true;
    x->rep.u.reserve_batch.n = x->n;
    x->rep.u.reserve_batch.items = calloc(x->n, sizeof *x->rep.u.reserve_batch.items);
    for (size_t k = 0; k < x->n; k++) {
        wire_reserve_outcome *o = &x->rep.u.reserve_batch.items[k];
        o->ok = true;
        snprintf(o->result.reservation_id, sizeof o->result.reservation_id, "rid-%zu", k);
        snprintf(o->result.dst_session, sizeof o->result.dst_session, "sess-%d", x->port);
        o->result.dst_ptr = 0x1000 * (k + 1);
        o->result.write = true;
        snprintf(o->result.transport, sizeof o->result.transport, "%s", kind);
        char key[32];
        snprintf(key, sizeof key, "key-%d", x->port);
        o->result.dst_key = strdup(key);
    }
}

static void answer_complete(px *x) {
    assert_int_equal(x->req.op, WIRE_OP_COMPLETE_BATCH);
    x->rep.op = WIRE_OP_COMPLETE_BATCH;
    x->rep.ok = true;
    x->rep.u.complete_batch.n = x->n;
    x->rep.u.complete_batch.items = calloc(x->n, sizeof *x->rep.u.complete_batch.items);
    for (size_t k = 0; k < x->n; k++) x->rep.u.complete_batch.items[k].completed = true;
}

/* Drops exchanges nobody answers (they never went out). */
static void free_all(px *xs) {
    while (xs) {
        px *next = xs->next;
        px_free(xs);
        xs = next;
    }
}

static void settle_all(fx *f, px *xs) {
    while (xs) {
        px *next = xs->next;
        pb_settle(&f->b, xs, NOW);
        xs = next;
    }
}

/* Two consumers of two shards, three items each: one peers per consumer,
 * then per shard one reserve_batch and one complete_batch, one write batch
 * per destination session with each shard's key; the reports say DONE. */
static void test_one_exchange_per_shard_and_session(void **state) {
    (void)state;
    fx *f = fx_open("", 0);
    const char *tids[6] = {"a0", "a1", "a2", "b0", "b1", "b2"};
    for (int i = 0; i < 6; i++) add(f, tids[i], "127.0.0.1", i < 3 ? 7000 : 8000);
    px *xs = round_(f);
    assert_int_equal(count(xs), 2); /* discovery: once per consumer */
    assert_string_equal(xs->key, "127.0.0.1:7000");
    assert_string_equal(xs->next->key, "127.0.0.1:8000");
    answer_peers(xs, 7000, 2, "tcp");
    answer_peers(xs->next, 8000, 2, "tcp");
    settle_all(f, xs);
    xs = round_(f);
    assert_int_equal(count(xs), 4); /* a reserve_batch per shard */
    static const char *keys[4] = {"127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:8000",
                                  "127.0.0.1:8001"};
    int k = 0;
    for (px *x = xs; x; x = x->next, k++) {
        assert_int_equal(x->kind, PX_RESERVE);
        assert_string_equal(x->key, keys[k]);
        assert_int_equal(x->n, 3);
        assert_int_equal(x->req.u.reserve_batch.n, 3);
        const wire_reserve_req *q = &x->req.u.reserve_batch.items[1].req;
        assert_string_equal(q->transfer_id, k < 2 ? "a1" : "b1");
        assert_string_equal(q->mm_hash, q->transfer_id);
        assert_int_equal(q->tensor.nbytes, NBYTES);
        assert_int_equal(q->tensor.shape[0], 2048);
        answer_reserve(x, "tcp");
    }
    settle_all(f, xs);
    xs = round_(f); /* the sources were given: the writes */
    assert_int_equal(count(xs), 4);
    k = 0;
    for (px *x = xs; x; x = x->next, k++) {
        char key[64], dst_key[32];
        snprintf(key, sizeof key, "tcp|sess-%d", k < 2 ? 7000 + k : 7998 + k);
        snprintf(dst_key, sizeof dst_key, "key-%d", k < 2 ? 7000 + k : 7998 + k);
        assert_int_equal(x->kind, PX_WRITE);
        assert_string_equal(x->key, key);
        assert_int_equal(x->n, 3);
        for (size_t m = 0; m < 3; m++) {
            assert_ptr_equal(x->w[m].src, f->src);
            assert_int_equal(x->w[m].len, NBYTES);
            assert_int_equal(x->w[m].dst_addr, 0x1000 * (m + 1));
            assert_string_equal(x->w[m].dst_key, dst_key);
        }
        /* the executor wrote them all */
    }
    settle_all(f, xs);
    xs = round_(f);
    assert_int_equal(count(xs), 4); /* a complete_batch per shard */
    for (px *x = xs; x; x = x->next) {
        assert_int_equal(x->kind, PX_COMPLETE);
        assert_string_equal(x->req.u.complete_batch.items[2].reservation_id, "rid-2");
        answer_complete(x);
    }
    settle_all(f, xs);
    assert_null(round_(f));
    assert_int_equal(f->nfin, 6);
    for (size_t i = 0; i < 6; i++) {
        assert_int_equal(f->fin[i].status, 0);
        assert_string_equal(f->fin[i].transport, "tcp");
        assert_int_equal(f->fin[i].n_shards, 2);
    }
    assert_int_equal(f->b.n.peers_requests, 2);
    assert_int_equal(f->b.n.reserve_batches, 4);
    assert_int_equal(f->b.n.write_batches, 4);
    assert_int_equal(f->b.n.complete_batches, 4);
    assert_int_equal(f->b.n.control_requests, 10);
    fx_close(f);
}

/* Groups are told apart by every part of their key: two hosts on the same
 * port are two control exchanges, one session named by two data planes is
 * two write batches (each keyed as before: "host:port", "kind|session"). */
static void test_groups_tell_hosts_and_planes_apart(void **state) {
    (void)state;
    fx *f = fx_open("", 0);
    add(f, "a0", "127.0.0.1", 7000);
    add(f, "a1", "127.0.0.1", 7000);
    add(f, "b0", "127.0.0.2", 7000);
    px *xs = round_(f);
    assert_int_equal(count(xs), 2);
    answer_peers(xs, 7000, 1, "tcp");
    answer_peers(xs->next, 7000, 1, "tcp");
    settle_all(f, xs);
    xs = round_(f);
    assert_int_equal(count(xs), 2); /* one reserve_batch per host */
    assert_string_equal(xs->key, "127.0.0.1:7000");
    assert_int_equal(xs->n, 2);
    assert_string_equal(xs->next->key, "127.0.0.2:7000");
    assert_int_equal(xs->next->n, 1);
    answer_reserve(xs, "tcp"); /* both answer session "sess-7000" */
    answer_reserve(xs->next, "shm");
    settle_all(f, xs);
    xs = round_(f);
    assert_int_equal(count(xs), 2); /* one write batch per data plane */
    assert_int_equal(xs->kind, PX_WRITE);
    assert_string_equal(xs->key, "tcp|sess-7000");
    assert_string_equal(xs->xkind, "tcp");
    assert_string_equal(xs->session, "sess-7000");
    assert_int_equal(xs->n, 2);
    assert_string_equal(xs->next->key, "shm|sess-7000");
    assert_string_equal(xs->next->xkind, "shm");
    assert_int_equal(xs->next->n, 1);
    free_all(xs);
    fx_close(f);
}

/* What discovery may answer, and what the items end with: one table. */
static void test_discovery_outcomes(void **state) {
    (void)state;
    static const struct {
        const char *name;
        const char *required; /* the producer's transport */
        unsigned expect;      /* expect_shards */
        int rc;               /* the exchange's */
        size_t n;             /* shards answered */
        const char *offers;   /* transport answered */
        int status;           /* the item's (0: discovered, goes on) */
        const char *text;     /* in its error */
    } cases[] = {
        {"fine", "", 0, 0, 2, "tcp", 0, ""},
        {"shard count", "", 3, 0, 2, "tcp", ECT_EPROTO,
         "has 2 shard(s) (TP ranks), this "
         "producer expects 3; nothing was reserved"},
        {"transport", "shm", 0, 0, 2, "tcp", ECT_ENOTSUP,
         "offers transport 'tcp', this producer requires 'shm'; nothing was reserved"},
        {"silent about transport", "shm", 0, 0, 1, "", 0, ""},
        {"no shards", "", 0, 0, 0, "", ECT_EPROTO, "the consumer reported no shards"},
        {"too many shards", "", 0, 0, 65, "", ECT_ERANGE, "65 shards, at most 64"},
        {"refused", "", 0, ECT_EPROTO, 0, "", ECT_EPROTO, "discovering the shards of c:9 failed"},
        {"unreachable", "", 0, ECT_ETIMEDOUT, 0, "", ECT_ETIMEDOUT, "consumer c:9 unreachable"},
    };
    for (size_t i = 0; i < ECT_ARRAY_LEN(cases); i++) {
        fx *f = fx_open(cases[i].required, cases[i].expect);
        add(f, "t", "c", 9);
        px *x = round_(f);
        assert_non_null(x);
        if (cases[i].rc) {
            x->rc = cases[i].rc;
            snprintf(x->err, sizeof x->err, "no answer");
        } else {
            answer_peers(x, 100, cases[i].n, cases[i].offers);
        }
        pb_settle(&f->b, x, NOW);
        px *xs = round_(f);
        if (!cases[i].status) {
            assert_int_equal(count(xs), cases[i].n); /* reserves, one per shard */
            settle_all(f, xs);                       /* (unanswered: they fail) */
        } else {
            assert_null(xs); /* nothing reserved anywhere */
            assert_int_equal(f->nfin, 1);
            assert_int_equal(f->fin[0].status, cases[i].status);
            if (!strstr(f->fin[0].error, cases[i].text))
                fail_msg("%s: '%s' lacks '%s'", cases[i].name, f->fin[0].error, cases[i].text);
        }
        fx_close(f);
    }
}

/* A consumer that did not answer is held down: the next item's discovery is
 * not sent, it fails at once naming the address; after the backoff a probe
 * goes out again. */
static void test_dead_address_held_down(void **state) {
    (void)state;
    fx *f = fx_open("", 0);
    add(f, "t0", "h", 5);
    px *x = round_(f);
    x->rc = ECT_ECONNREFUSED;
    snprintf(x->err, sizeof x->err, "connection refused");
    pb_settle(&f->b, x, NOW);
    assert_null(round_(f));
    assert_int_equal(f->fin[0].status, ECT_ECONNREFUSED);
    assert_non_null(strstr(f->fin[0].error, "consumer h:5 unreachable: connection refused"));
    uint64_t sent = f->b.n.control_requests;
    add(f, "t1", "h", 5);
    assert_null(round_(f)); /* settled at once, not sent */
    assert_null(round_(f)); /* (it ends on the next round) */
    assert_int_equal(f->b.n.control_requests, sent);
    assert_int_equal(f->nfin, 2);
    assert_non_null(strstr(f->fin[1].error, "retrying in"));
    add(f, "t2", "h", 5);
    size_t n = push_next_actions(f->t, NOW + 1000, f->a, 256);
    px *xs = NULL;
    pb_build(&f->b, f->a, n, NOW + 1000, &xs); /* the backoff ran out: a probe */
    assert_int_equal(count(xs), 1);
    assert_int_equal(f->b.n.control_requests, sent + 1);
    px_free(xs);
    fx_close(f);
}

/* Reserve replies item by item: full is back-pressure, a refusal fails the
 * item with the shard's text, `cancelled` with a reason cancels it saying
 * why; an unreachable shard fails its items naming it and forgets the
 * consumer's shards (the next item discovers them again). */
static void test_reserve_outcomes(void **state) {
    (void)state;
    fx *f = fx_open("", 0);
    const char *tids[4] = {"full", "refused", "cancelled", "fine"};
    for (int i = 0; i < 4; i++) add(f, tids[i], "h", 5);
    px *x = round_(f);
    answer_peers(x, 5, 1, "tcp");
    pb_settle(&f->b, x, NOW);
    x = round_(f);
    assert_int_equal(x->n, 4);
    answer_reserve(x, "tcp");
    wire_reserve_outcome *o = x->rep.u.reserve_batch.items;
    o[0].ok = false;
    o[0].error = strdup("EC consumer buffer pool is full");
    o[1].ok = false;
    o[1].error = strdup("conflicting in-flight tensor for mm_hash 'refused'");
    o[2].result.cancelled = true;
    snprintf(o[2].result.reason, sizeof o[2].result.reason, "already delivered");
    pb_settle(&f->b, x, NOW);
    push_info in;
    assert_int_equal(push_get(f->t, "full", &in), 0);
    assert_true(in.waiting_room);
    assert_int_equal(push_get(f->t, "fine", &in), 0);
    assert_int_equal(in.reserved, 1);
    settle_all(f, round_(f)); /* the writes (unanswered: status 0) */
    free_all(round_(f));
    assert_int_equal(f->nfin, 2);
    assert_string_equal(f->fin[0].transfer_id, "refused");
    assert_int_equal(f->fin[0].status, ECT_EIO);
    assert_non_null(strstr(f->fin[0].error, "reserve on shard 0 failed: conflicting"));
    assert_string_equal(f->fin[1].transfer_id, "cancelled");
    assert_int_equal(f->fin[1].status, ECT_ECANCELED);
    assert_string_equal(f->fin[1].error, "refused by shard 0: already delivered");
    fx_close(f);

    f = fx_open("", 0);
    add(f, "u", "h", 5);
    x = round_(f);
    answer_peers(x, 5, 1, "tcp");
    pb_settle(&f->b, x, NOW);
    x = round_(f);
    x->rc = ECT_ETIMEDOUT;
    snprintf(x->err, sizeof x->err, "timed out");
    pb_settle(&f->b, x, NOW);
    free_all(round_(f));
    assert_int_equal(f->fin[0].status, ECT_EIO);
    assert_string_equal(f->fin[0].error, "shard 0: consumer h:5 unreachable: timed out");
    add(f, "v", "h", 5); /* forgotten: discovered again (held down: at once) */
    assert_null(round_(f));
    assert_null(round_(f));
    assert_int_equal(f->nfin, 2);
    assert_int_equal(f->fin[1].status, ECT_ECONNREFUSED);
    fx_close(f);
}

/* Writes: to a shard offering another transport than required, without a
 * region key, or failing: each item fails naming the cause, and what it
 * reserved is abandoned. */
static void test_write_refusals(void **state) {
    (void)state;
    static const struct {
        const char *required, *kind;
        bool drop_key;
        int write_status; /* the executor's, when it goes out */
        const char *text;
    } cases[] = {
        {"shm", "tcp", false, 0, "shard 0 offers transport 'tcp' but this producer requires 'shm'"},
        {"", "tcp", true, 0, "writing to tcp|sess-5 (shard 0) failed: "},
        {"", "shm", false, ECT_EIO, "writing to shm|sess-5 (shard 0) failed: "},
    };
    for (size_t i = 0; i < ECT_ARRAY_LEN(cases); i++) {
        fx *f = fx_open(cases[i].required, 0);
        add(f, "t", "h", 5);
        px *x = round_(f);
        answer_peers(x, 5, 1, "");
        pb_settle(&f->b, x, NOW);
        x = round_(f);
        answer_reserve(x, cases[i].kind);
        if (cases[i].drop_key) {
            free(x->rep.u.reserve_batch.items[0].result.dst_key);
            x->rep.u.reserve_batch.items[0].result.dst_key = NULL;
        }
        pb_settle(&f->b, x, NOW);
        x = round_(f);
        if (cases[i].write_status) {
            assert_non_null(x); /* it went out and failed */
            x->status[0] = cases[i].write_status;
            pb_settle(&f->b, x, NOW);
        } else {
            assert_null(x); /* refused at once: nothing went out */
        }
        x = round_(f);
        assert_non_null(x); /* the abandon */
        assert_int_equal(x->kind, PX_CANCEL);
        assert_true(x->req.u.cancel.abandon);
        assert_false(x->req.u.cancel.refresh);
        settle_all(f, x);
        free_all(round_(f));
        assert_int_equal(f->nfin, 1);
        assert_int_equal(f->fin[0].status, ECT_EIO);
        if (!strstr(f->fin[0].error, cases[i].text))
            fail_msg("case %zu: '%s' lacks '%s'", i, f->fin[0].error, cases[i].text);
        assert_int_equal(f->b.n.write_batches, cases[i].write_status ? 1 : 0);
        fx_close(f);
    }
}

int main(void) {
    ect_log_set_level(ECT_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_exchange_per_shard_and_session),
        cmocka_unit_test(test_groups_tell_hosts_and_planes_apart),
        cmocka_unit_test(test_discovery_outcomes),
        cmocka_unit_test(test_dead_address_held_down),
        cmocka_unit_test(test_reserve_outcomes),
        cmocka_unit_test(test_write_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
