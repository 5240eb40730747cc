/*
 * producer_run — the push producer's dispatcher thread. It owns the REQ
 * sockets (through one ctl_client), the transports and the push_ table, and
 * turns the table's actions into batched exchanges, one round per kind:
 *
 *   RESERVE   grouped by shard address  -> one reserve_batch per shard,
 *                                           shards in parallel (lanes)
 *   REFRESH / ABANDON                    -> one cancel each (rare)
 *   WRITE     grouped by (kind, session) -> one ect_xport_write_batch each,
 *                                           sessions on parallel threads
 *   COMPLETE  grouped by shard address  -> one complete_batch per shard,
 *                                           shards in parallel (lanes)
 *   RELEASE_SOURCE / FINISHED            -> local
 *
 * A step (a flush) of k items therefore costs one reserve_batch and one
 * complete_batch per shard whatever k is; the table's next actions after each
 * round are computed at once, so the three rounds run back to back.
 *
 * Failure of an exchange fails the items it carried on that shard (the table
 * then abandons their other shards) and forgets the consumer's cached peers,
 * so a restarted consumer is rediscovered.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utlist.h>
#include <zmq.h>

#include "push/producer.h"
#include "util/util.h"

#define MOD "producer"
#define WAKE_MS 50

static void count(ect_push_producer *p, uint64_t *field) {
    pthread_mutex_lock(&p->mu);
    p->st.control_requests++;
    (*field)++;
    pthread_mutex_unlock(&p->mu);
}

static pitem *dfind(ect_push_producer *p, const char *id) {
    pitem *it = NULL;
    HASH_FIND(dh, p->disp_items, id, strlen(id), it);
    return it;
}

/* The control port of shard i of the item's consumer. */
static int shard_port(ect_push_producer *p, const pitem *it, size_t i) {
    (void)p;
    return it && it->ports && i < it->n_shards ? it->ports[i] : -1;
}

static void forget_consumer(ect_push_producer *p, const pitem *it) {
    pp_consumer *c = NULL;
    HASH_FIND_STR(p->consumers, it->consumer, c);
    if (c) {
        HASH_DEL(p->consumers, c);
        free(c);
    }
    ctl_forget_peers(p->ctl, it->host, it->port);
}

/* A timeout or a transport failure says the consumer may be gone; an answer,
 * even {"ok": false} or an undecodable one, says it is alive. */
static bool unreachable_rc(int rc) {
    return rc == ECT_ETIMEDOUT || rc == ECT_ECONNREFUSED || rc == ECT_EIO;
}

/* The down table's key for a control address: "host:port", "[v6]:port". */
static void addr_key(const char *host, int port, char *buf, size_t cap) {
    bool v6 = strchr(host, ':') != NULL;
    snprintf(buf, cap, v6 ? "[%s]:%d" : "%s:%d", host, port);
}

static bool held_down(ect_push_producer *p, const char *host, int port, char *why, size_t cap) {
    char key[PUSH_ADDR_MAX + 16];
    addr_key(host, port, key, sizeof key);
    return down_blocked(p->downs, key, ect_now_ms(), why, cap);
}

/* After an exchange with the control address host:port: success forgets any
 * backoff; a transport failure holds the address down and rewrites `err`
 * (room for `cap`) as "consumer HOST:PORT unreachable: ...". Keyed per shard
 * address, so a dead rank does not hold back the abandons to its live peers. */
static void note_exchange(ect_push_producer *p, const char *host, int port, int rc, char *err,
                          size_t cap) {
    char key[PUSH_ADDR_MAX + 16];
    addr_key(host, port, key, sizeof key);
    if (!rc) {
        down_ok(p->downs, key);
        return;
    }
    if (!unreachable_rc(rc)) return;
    char cause[320];
    snprintf(cause, sizeof cause, "%s", err);
    uint64_t ms = down_fail(p->downs, key, cause, ect_now_ms());
    snprintf(err, cap, "consumer %.100s unreachable: %.190s", key, cause);
    ECT_LOGW(MOD, "consumer %s unreachable (%s); failing its pushes at once for %" PRIu64 " ms",
             key, cause, ms);
}

static int discover(ect_push_producer *p, pitem *it) {
    pp_consumer *c = NULL;
    HASH_FIND_STR(p->consumers, it->consumer, c);
    if (c) {
        it->n_shards = c->n;
        if (!(it->ports = malloc(c->n * sizeof *it->ports)))
            return ect_set_error(ECT_ENOMEM, "out of memory");
        memcpy(it->ports, c->ports, c->n * sizeof *c->ports);
        return 0;
    }
    int ports[PUSH_MAX_SHARDS];
    size_t n = 0;
    ctl_forget_peers(p->ctl, it->host, it->port); /* count a real exchange */
    count(p, &p->st.peers_requests);
    int rc = ctl_peers(p->ctl, it->host, it->port, ports, PUSH_MAX_SHARDS, &n);
    if (rc) return rc;
    if (n < 1) return ect_set_error(ECT_EPROTO, "peers: the consumer reported no shards");
    if (!(c = calloc(1, sizeof *c))) return ect_set_error(ECT_ENOMEM, "out of memory");
    snprintf(c->consumer, sizeof c->consumer, "%s", it->consumer);
    c->n = n;
    memcpy(c->ports, ports, n * sizeof *ports);
    HASH_ADD_STR(p->consumers, consumer, c);
    it->n_shards = n;
    if (!(it->ports = malloc(n * sizeof *it->ports)))
        return ect_set_error(ECT_ENOMEM, "out of memory");
    memcpy(it->ports, ports, n * sizeof *ports);
    return 0;
}

/* Ends an item the table does not know (discovery or push_add failed). */
static void finish_local(ect_push_producer *p, pitem *it, int status, const char *error) {
    pthread_mutex_lock(&p->mu);
    bool staging = it->stage_queued;
    pp_finish_locked(p, it, status, error);
    pthread_mutex_unlock(&p->mu);
    if (!staging) pp_release_src(p, it);
}

static void take_new(ect_push_producer *p, pitem *list) {
    /* A consumer whose discovery failed fails the rest of this hand-over at
     * once: k items must not cost k control timeouts. */
    char bad[PUSH_ADDR_MAX + 1] = "", bad_err[320] = "";
    int bad_rc = 0;
    while (list) {
        pitem *it = list;
        list = it->next;
        it->next = NULL;
        char err[320];
        if (bad_rc && !strcmp(bad, it->consumer)) {
            finish_local(p, it, bad_rc, bad_err);
            continue;
        }
        if (held_down(p, it->host, it->port, err, sizeof err)) {
            finish_local(p, it, ECT_ECONNREFUSED, err);
            continue;
        }
        bool cached = false;
        {
            pp_consumer *c = NULL;
            HASH_FIND_STR(p->consumers, it->consumer, c);
            cached = c != NULL;
        }
        int rc = discover(p, it);
        if (!cached) {
            snprintf(err, sizeof err, "%.300s", rc ? ect_last_error() : "");
            note_exchange(p, it->host, it->port, rc, err, sizeof err);
            /* it answered: its ranks are back too (a restart may reuse ports) */
            for (size_t i = 0; !rc && i < it->n_shards; i++) {
                char key[PUSH_ADDR_MAX + 16];
                addr_key(it->host, it->ports[i], key, sizeof key);
                down_ok(p->downs, key);
            }
        }
        if (rc && !(!cached && unreachable_rc(rc)))
            snprintf(err, sizeof err, "discovering the shards of %s failed: %.250s", it->consumer,
                     ect_last_error());
        if (rc) {
            snprintf(bad, sizeof bad, "%s", it->consumer);
            memcpy(bad_err, err, sizeof bad_err);
            bad_rc = rc;
            finish_local(p, it, rc, err);
            continue;
        }
        it->keys = calloc(it->n_shards, sizeof *it->keys);
        it->kinds = calloc(it->n_shards, sizeof *it->kinds);
        push_item pi = {.transfer_id = it->transfer_id,
                        .consumer = it->consumer,
                        .mm_hash = it->mm_hash,
                        .nbytes = it->nbytes,
                        .shape = it->shape,
                        .ndim = it->ndim,
                        .dtype = it->dtype,
                        .n_shards = it->n_shards};
        if (!it->keys || !it->kinds)
            rc = ect_set_error(ECT_ENOMEM, "out of memory");
        else
            rc = push_add(p->table, &pi, ect_now_ms());
        if (rc) {
            snprintf(err, sizeof err, "%s", ect_last_error());
            finish_local(p, it, rc, err);
            continue;
        }
        it->in_table = true;
        HASH_ADD(dh, p->disp_items, transfer_id, strlen(it->transfer_id), it);
        pthread_mutex_lock(&p->mu);
        bool staged = it->src_held && !it->stage_queued;
        pthread_mutex_unlock(&p->mu);
        if (staged) push_source_ready(p->table, it->transfer_id, ect_now_ms());
    }
}

static void take_stages(ect_push_producer *p, pitem *list) {
    while (list) {
        pitem *it = list;
        list = it->snext;
        it->snext = NULL;
        pthread_mutex_lock(&p->mu);
        it->stage_queued = false;
        bool done = it->phase == PI_DONE;
        pthread_mutex_unlock(&p->mu);
        /* A record that ended meanwhile no longer wants it: we own it again. */
        if (done || !it->in_table ||
            push_source_ready(p->table, it->transfer_id, ect_now_ms()) != 0)
            pp_release_src(p, it);
    }
}

/* ---------------------------------------------------------------- rounds */

typedef struct group {
    char addr[PUSH_ADDR_MAX + 1 + 16]; /* shard "host:port", or "kind|session" */
    size_t *idx;
    size_t n;
    /* write groups */
    ect_xport *x;
    const char *session;
    ect_write *w;
    int *status;
    int rc;
} group;

typedef struct groups {
    group *g;
    size_t n, cap;
} groups;

static group *group_for(groups *gs, const char *addr, size_t max_members) {
    for (size_t i = 0; i < gs->n; i++)
        if (!strcmp(gs->g[i].addr, addr)) return &gs->g[i];
    if (gs->n == gs->cap) {
        size_t cap = gs->cap ? gs->cap * 2 : 8;
        group *n = realloc(gs->g, cap * sizeof *n);
        if (!n) return NULL;
        gs->g = n;
        gs->cap = cap;
    }
    group *g = &gs->g[gs->n];
    memset(g, 0, sizeof *g);
    snprintf(g->addr, sizeof g->addr, "%s", addr);
    if (!(g->idx = malloc(max_members * sizeof *g->idx))) return NULL;
    gs->n++;
    return g;
}

static void groups_free(groups *gs) {
    for (size_t i = 0; i < gs->n; i++) {
        free(gs->g[i].idx);
        free(gs->g[i].w);
        free(gs->g[i].status);
    }
    free(gs->g);
    memset(gs, 0, sizeof *gs);
}

/* Groups the actions of `kind` by their shard's control address. */
static int group_by_shard(ect_push_producer *p, const push_action *a, size_t n,
                          push_action_kind kind, groups *gs) {
    for (size_t i = 0; i < n; i++) {
        if (a[i].kind != kind) continue;
        pitem *it = dfind(p, a[i].transfer_id);
        int port = it ? shard_port(p, it, a[i].shard) : -1;
        char addr[PUSH_ADDR_MAX + 16];
        snprintf(addr, sizeof addr, "%s:%d", it ? it->host : "?", port);
        group *g = group_for(gs, addr, n);
        if (!g) return ect_set_error(ECT_ENOMEM, "out of memory");
        g->idx[g->n++] = i;
    }
    return 0;
}

static const pitem *group_item(ect_push_producer *p, const push_action *a, const group *g) {
    return dfind(p, a[g->idx[0]].transfer_id);
}

/* ------------------------------------------------- parallel exchanges
 *
 * The batches of one round go to different shards; sent one after another
 * they would cost TP round trips. Each shard address gets a lane: a thread
 * with its own control client (REQ sockets belong to one thread), started on
 * first use, which runs one exchange at a time. A round with a single batch
 * runs on the dispatcher's own client. */

typedef struct xchg {
    const char *host;
    int port;
    bool want_ok; /* ctl_call_ok: an {"ok": false} reply is a failure */
    bool held;    /* not sent: the consumer is held down (err says so) */
    wire_ctl_request req;
    wire_ctl_reply rep;
    int rc;
    char err[320];
} xchg;

typedef struct pp_lane {
    char addr[PUSH_ADDR_MAX + 16];
    ect_push_producer *p;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    xchg *job;
    bool busy, stop, started;
    UT_hash_handle hh;
} pp_lane;

static void exchange(ctl_client *c, xchg *x) {
    if (x->port <= 0) {
        x->rc = ECT_ENOTFOUND;
        snprintf(x->err, sizeof x->err, "shard address unknown");
        return;
    }
    x->rc = x->want_ok ? ctl_call_ok(c, x->host, x->port, &x->req, &x->rep)
                       : ctl_call(c, x->host, x->port, &x->req, &x->rep);
    if (x->rc) snprintf(x->err, sizeof x->err, "%.300s", ect_last_error());
}

static void *lane_main(void *arg) {
    pp_lane *l = arg;
    ctl_client *c = NULL;
    int orc = ctl_client_open(l->p->zctx, l->p->o.control_timeout_ms, &c);
    if (!orc) ctl_client_fail_fast(c, true);
    char oerr[160];
    snprintf(oerr, sizeof oerr, "%s", orc ? ect_last_error() : "");
    pthread_mutex_lock(&l->mu);
    for (;;) {
        while (!l->stop && !l->job) pthread_cond_wait(&l->cv, &l->mu);
        if (l->stop) break;
        xchg *x = l->job;
        pthread_mutex_unlock(&l->mu);
        if (orc) {
            x->rc = orc;
            snprintf(x->err, sizeof x->err, "control client: %s", oerr);
        } else {
            exchange(c, x);
        }
        pthread_mutex_lock(&l->mu);
        l->job = NULL;
        l->busy = false;
        pthread_cond_broadcast(&l->cv);
    }
    pthread_mutex_unlock(&l->mu);
    ctl_client_close(c);
    return NULL;
}

static pp_lane *lane_for(ect_push_producer *p, const xchg *x) {
    char addr[PUSH_ADDR_MAX + 16];
    snprintf(addr, sizeof addr, "%s:%d", x->host, x->port);
    pp_lane *l = NULL;
    HASH_FIND_STR(p->lanes, addr, l);
    if (l) return l;
    if (!(l = calloc(1, sizeof *l))) return NULL;
    snprintf(l->addr, sizeof l->addr, "%s", addr);
    l->p = p;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    if (pthread_create(&l->th, NULL, lane_main, l)) {
        pthread_cond_destroy(&l->cv);
        pthread_mutex_destroy(&l->mu);
        free(l);
        return NULL;
    }
    l->started = true;
    HASH_ADD_STR(p->lanes, addr, l);
    return l;
}

void pp_lanes_close(ect_push_producer *p) {
    pp_lane *l, *tmp;
    HASH_ITER(hh, p->lanes, l, tmp) {
        pthread_mutex_lock(&l->mu);
        l->stop = true;
        pthread_cond_broadcast(&l->cv);
        pthread_mutex_unlock(&l->mu);
        pthread_join(l->th, NULL);
        HASH_DEL(p->lanes, l);
        pthread_cond_destroy(&l->cv);
        pthread_mutex_destroy(&l->mu);
        free(l);
    }
}

/* Runs the exchanges of xs[0..n) that have no rc yet (one that could not be
 * built keeps its error), in parallel when there are several. */
static void run_exchanges(ect_push_producer *p, xchg *xs, size_t n) {
    size_t todo = 0;
    for (size_t i = 0; i < n; i++) todo += xs[i].rc == 0;
    pp_lane **lanes = todo > 1 ? calloc(n, sizeof *lanes) : NULL;
    for (size_t i = 0; i < n; i++) {
        xchg *x = &xs[i];
        if (x->rc) continue;
        pp_lane *l = lanes ? lane_for(p, x) : NULL;
        if (!l) { /* a single exchange, or no thread: run it here */
            exchange(p->ctl, x);
            continue;
        }
        pthread_mutex_lock(&l->mu);
        l->job = x;
        l->busy = true;
        pthread_cond_broadcast(&l->cv);
        pthread_mutex_unlock(&l->mu);
        lanes[i] = l;
    }
    for (size_t i = 0; lanes && i < n; i++) {
        pp_lane *l = lanes[i];
        if (!l) continue;
        pthread_mutex_lock(&l->mu);
        while (l->busy) pthread_cond_wait(&l->cv, &l->mu);
        pthread_mutex_unlock(&l->mu);
    }
    free(lanes);
}

static void do_reserves(ect_push_producer *p, const push_action *a, size_t n) {
    groups gs = {0};
    xchg *xs = NULL;
    if (group_by_shard(p, a, n, PUSH_ACT_RESERVE, &gs) ||
        (gs.n && !(xs = calloc(gs.n, sizeof *xs)))) {
        /* out of memory: fail them all, the table abandons what it holds */
        for (size_t i = 0; i < n; i++)
            if (a[i].kind == PUSH_ACT_RESERVE)
                push_reserve_done(p->table, a[i].transfer_id, a[i].shard, NULL, "out of memory",
                                  ect_now_ms());
        groups_free(&gs);
        return;
    }
    for (size_t gi = 0; gi < gs.n; gi++) {
        group *g = &gs.g[gi];
        const pitem *it0 = group_item(p, a, g);
        xchg *x = &xs[gi];
        x->host = it0->host;
        x->port = shard_port(p, it0, a[g->idx[0]].shard);
        x->req.op = WIRE_OP_RESERVE_BATCH;
        if (x->port > 0 && held_down(p, x->host, x->port, x->err, sizeof x->err)) {
            x->rc = ECT_ECONNREFUSED;
            x->held = true;
            continue;
        }
        wire_reserve_item *items = calloc(g->n, sizeof *items);
        if (!items) {
            x->rc = ECT_ENOMEM;
            snprintf(x->err, sizeof x->err, "out of memory");
            continue;
        }
        for (size_t k = 0; k < g->n; k++) {
            const push_action *ac = &a[g->idx[k]];
            wire_reserve_req *r = &items[k].req;
            snprintf(r->transfer_id, sizeof r->transfer_id, "%s", ac->transfer_id);
            snprintf(r->mm_hash, sizeof r->mm_hash, "%s", ac->mm_hash);
            r->tensor.nbytes = ac->nbytes;
            r->tensor.ndim = (uint32_t)ac->ndim;
            memcpy(r->tensor.shape, ac->shape, sizeof r->tensor.shape);
            snprintf(r->tensor.dtype, sizeof r->tensor.dtype, "%s", ac->dtype);
        }
        x->req.u.reserve_batch.n = g->n;
        x->req.u.reserve_batch.items = items;
        count(p, &p->st.reserve_batches);
    }
    run_exchanges(p, xs, gs.n);
    for (size_t gi = 0; gi < gs.n; gi++) {
        group *g = &gs.g[gi];
        xchg *x = &xs[gi];
        const pitem *it0 = group_item(p, a, g);
        int rc = x->rc;
        char err[320];
        snprintf(err, sizeof err, "%.300s", x->err);
        if (!x->held && x->port > 0) note_exchange(p, x->host, x->port, rc, err, sizeof err);
        if (rc) {
            forget_consumer(p, it0);
        } else if (!x->rep.ok) {
            snprintf(err, sizeof err, "refused: %.200s", x->rep.error ? x->rep.error : "");
            rc = ECT_EPROTO;
        }
        for (size_t k = 0; k < g->n; k++) {
            const push_action *ac = &a[g->idx[k]];
            pitem *it = dfind(p, ac->transfer_id);
            if (rc) {
                if (it && !it->why[0] && unreachable_rc(rc))
                    snprintf(it->why, sizeof it->why, "shard %zu: %.170s", ac->shard, err);
                push_reserve_done(p->table, ac->transfer_id, ac->shard, NULL, err, ect_now_ms());
                continue;
            }
            const wire_reserve_outcome *o = &x->rep.u.reserve_batch.items[k];
            if (!o->ok) {
                push_reserve_done(p->table, ac->transfer_id, ac->shard, NULL,
                                  o->error ? o->error : "refused", ect_now_ms());
                continue;
            }
            const wire_reserve_result *r = &o->result;
            if (it && ac->shard < it->n_shards) {
                free(it->keys[ac->shard]);
                it->keys[ac->shard] = r->dst_key ? strdup(r->dst_key) : NULL;
                snprintf(it->kinds[ac->shard], sizeof it->kinds[ac->shard], "%s",
                         r->transport[0] ? r->transport : "tcp");
            }
            push_reservation pr = {.reservation_id = r->reservation_id,
                                   .dst_session = r->dst_session,
                                   .dst_ptr = r->dst_ptr,
                                   .write = r->write,
                                   .ready = r->ready,
                                   .cached = r->cached,
                                   .cancelled = r->cancelled};
            push_reserve_done(p->table, ac->transfer_id, ac->shard, &pr, NULL, ect_now_ms());
        }
        wire_ctl_reply_clear(&x->rep);
        free(x->req.u.reserve_batch.items);
    }
    free(xs);
    groups_free(&gs);
}

static void do_completes(ect_push_producer *p, const push_action *a, size_t n) {
    groups gs = {0};
    xchg *xs = NULL;
    if (group_by_shard(p, a, n, PUSH_ACT_COMPLETE, &gs) ||
        (gs.n && !(xs = calloc(gs.n, sizeof *xs)))) {
        for (size_t i = 0; i < n; i++)
            if (a[i].kind == PUSH_ACT_COMPLETE)
                push_complete_done(p->table, a[i].transfer_id, a[i].shard, false, false);
        groups_free(&gs);
        return;
    }
    for (size_t gi = 0; gi < gs.n; gi++) {
        group *g = &gs.g[gi];
        const pitem *it0 = group_item(p, a, g);
        xchg *x = &xs[gi];
        x->host = it0->host;
        x->port = shard_port(p, it0, a[g->idx[0]].shard);
        x->want_ok = true;
        x->req.op = WIRE_OP_COMPLETE_BATCH;
        if (x->port > 0 && held_down(p, x->host, x->port, x->err, sizeof x->err)) {
            x->rc = ECT_ECONNREFUSED;
            x->held = true;
            continue;
        }
        wire_complete_req *items = calloc(g->n, sizeof *items);
        if (!items) {
            x->rc = ECT_ENOMEM;
            snprintf(x->err, sizeof x->err, "out of memory");
        } else {
            for (size_t k = 0; k < g->n; k++) {
                snprintf(items[k].transfer_id, sizeof items[k].transfer_id, "%s",
                         a[g->idx[k]].transfer_id);
                snprintf(items[k].reservation_id, sizeof items[k].reservation_id, "%s",
                         a[g->idx[k]].reservation_id);
            }
            x->req.u.complete_batch.n = g->n;
            x->req.u.complete_batch.items = items;
            count(p, &p->st.complete_batches);
        }
    }
    run_exchanges(p, xs, gs.n);
    for (size_t gi = 0; gi < gs.n; gi++) {
        group *g = &gs.g[gi];
        xchg *x = &xs[gi];
        const pitem *it0 = group_item(p, a, g);
        if (!x->held && x->port > 0)
            note_exchange(p, x->host, x->port, x->rc, x->err, sizeof x->err);
        if (x->rc) {
            ECT_LOGW(MOD, "complete_batch to %s failed: %s", g->addr, x->err);
            forget_consumer(p, it0);
        }
        for (size_t k = 0; k < g->n; k++) {
            const push_action *ac = &a[g->idx[k]];
            pitem *it = dfind(p, ac->transfer_id);
            if (x->rc && it && !it->why[0] && unreachable_rc(x->rc))
                snprintf(it->why, sizeof it->why, "shard %zu: %.170s", ac->shard, x->err);
            bool done = !x->rc && x->rep.u.complete_batch.items[k].completed;
            push_complete_done(p->table, ac->transfer_id, ac->shard, x->rc == 0, done);
        }
        wire_ctl_reply_clear(&x->rep);
        free(x->req.u.complete_batch.items);
    }
    free(xs);
    groups_free(&gs);
}

/* REFRESH and ABANDON: a cancel each. */
static void do_cancels(ect_push_producer *p, const push_action *a, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const push_action *x = &a[i];
        if (x->kind != PUSH_ACT_REFRESH && x->kind != PUSH_ACT_ABANDON) continue;
        pitem *it = dfind(p, x->transfer_id);
        int port = it ? shard_port(p, it, x->shard) : -1;
        wire_ctl_request req;
        memset(&req, 0, sizeof req);
        req.op = WIRE_OP_CANCEL;
        snprintf(req.u.cancel.transfer_id, sizeof req.u.cancel.transfer_id, "%s", x->transfer_id);
        snprintf(req.u.cancel.reservation_id, sizeof req.u.cancel.reservation_id, "%s",
                 x->reservation_id);
        req.u.cancel.abandon = true;
        req.u.cancel.refresh = x->kind == PUSH_ACT_REFRESH;
        wire_ctl_reply rep;
        memset(&rep, 0, sizeof rep);
        char err[320];
        int rc;
        if (port > 0 && held_down(p, it->host, port, err, sizeof err)) {
            rc = ECT_ECONNREFUSED; /* its TTL ends the reservation */
        } else {
            count(p, &p->st.cancels);
            rc = port > 0 ? ctl_call_ok(p->ctl, it->host, port, &req, &rep)
                          : ect_set_error(ECT_ENOTFOUND, "shard address unknown");
            snprintf(err, sizeof err, "%.300s", rc ? ect_last_error() : "");
            if (port > 0) note_exchange(p, it->host, port, rc, err, sizeof err);
        }
        if (rc) {
            ECT_LOGW(MOD, "cancel of %s on shard %zu failed: %s", x->transfer_id, x->shard, err);
            if (it) forget_consumer(p, it);
        }
        wire_ctl_reply_clear(&rep);
        if (x->kind == PUSH_ACT_REFRESH) {
            if (!rc) {
                pthread_mutex_lock(&p->mu);
                p->st.refreshes++;
                pthread_mutex_unlock(&p->mu);
            }
            push_refresh_done(p->table, x->transfer_id, x->shard, rc == 0);
        } else {
            push_abandon_done(p->table, x->transfer_id, x->shard, rc == 0);
        }
    }
}

static ect_xport *xport_for(ect_push_producer *p, const char *kind) {
    for (pp_xport *e = p->xports; e; e = e->next)
        if (!strcmp(e->kind, kind)) return e->x;
    ect_xport_opts xo;
    ect_xport_opts_init(&xo);
    char listen[PP_HOST_MAX + 8];
    snprintf(listen, sizeof listen, "%s:0", p->listen_host);
    xo.listen = listen;
    xo.connect_timeout_ms = p->o.connect_timeout_ms;
    xo.io_timeout_ms = p->o.io_timeout_ms;
    ect_xport *x = NULL;
    if (ect_xport_open(kind, &xo, &x)) return NULL;
    pp_xport *e = calloc(1, sizeof *e);
    if (!e) {
        ect_xport_close(x);
        ect_set_error(ECT_ENOMEM, "out of memory");
        return NULL;
    }
    snprintf(e->kind, sizeof e->kind, "%s", kind);
    e->x = x;
    LL_PREPEND(p->xports, e);
    return x;
}

static void *write_group(void *arg) {
    group *g = arg;
    g->rc = ect_xport_write_batch(g->x, g->session, g->w, g->n, g->status);
    return NULL;
}

static void do_writes(ect_push_producer *p, const push_action *a, size_t n) {
    groups gs = {0};
    bool oom = false;
    for (size_t i = 0; i < n && !oom; i++) {
        if (a[i].kind != PUSH_ACT_WRITE) continue;
        pitem *it = dfind(p, a[i].transfer_id);
        const char *kind = it && a[i].shard < it->n_shards ? it->kinds[a[i].shard] : "?";
        char addr[PUSH_ADDR_MAX + 1 + 16];
        snprintf(addr, sizeof addr, "%s|%s", kind, a[i].dst_session);
        group *g = group_for(&gs, addr, n);
        if (!g) {
            oom = true;
            break;
        }
        g->session = a[i].dst_session;
        g->idx[g->n++] = i;
    }
    size_t nthreads = 0;
    pthread_t *th = calloc(gs.n ? gs.n : 1, sizeof *th);
    bool *started = calloc(gs.n ? gs.n : 1, sizeof *started);
    if (!th || !started) oom = true;
    for (size_t gi = 0; !oom && gi < gs.n; gi++) {
        group *g = &gs.g[gi];
        g->w = calloc(g->n, sizeof *g->w);
        g->status = calloc(g->n, sizeof *g->status);
        if (!g->w || !g->status) {
            oom = true;
            break;
        }
        const pitem *it0 = dfind(p, a[g->idx[0]].transfer_id);
        g->x = it0 ? xport_for(p, it0->kinds[a[g->idx[0]].shard]) : NULL;
        if (it0 && p->transport[0] && strcmp(p->transport, it0->kinds[a[g->idx[0]].shard])) {
            for (size_t k = 0; k < g->n; k++) {
                pitem *it = dfind(p, a[g->idx[k]].transfer_id);
                if (it && !it->why[0])
                    snprintf(it->why, sizeof it->why,
                             "shard %zu offers transport '%s' but this producer requires '%s'",
                             a[g->idx[k]].shard, it0->kinds[a[g->idx[0]].shard], p->transport);
                g->status[k] = ECT_ENOTSUP;
            }
            g->rc = ECT_ENOTSUP;
            g->session = NULL;
            continue;
        }
        if (!g->x) {
            ECT_LOGW(MOD, "no transport for %s: %s", g->addr, ect_last_error());
            g->rc = ECT_ENOTSUP;
            for (size_t k = 0; k < g->n; k++) g->status[k] = ECT_ENOTSUP;
            g->n = g->n; /* reported below */
            g->session = NULL;
            continue;
        }
        for (size_t k = 0; k < g->n; k++) {
            const push_action *x = &a[g->idx[k]];
            pitem *it = dfind(p, x->transfer_id);
            g->w[k].src = it ? it->src : NULL;
            g->w[k].dst_addr = x->dst_ptr;
            g->w[k].len = x->nbytes;
            g->w[k].dst_key = it ? it->keys[x->shard] : NULL;
            if (!g->w[k].src || !g->w[k].dst_key) g->session = NULL; /* refuse the group */
        }
        if (!g->session) {
            g->rc = ECT_EPROTO;
            for (size_t k = 0; k < g->n; k++) g->status[k] = ECT_EPROTO;
            continue;
        }
        pthread_mutex_lock(&p->mu);
        p->st.write_batches++;
        pthread_mutex_unlock(&p->mu);
        /* the last group runs on this thread */
        if (gi + 1 < gs.n && pthread_create(&th[gi], NULL, write_group, g) == 0) {
            started[gi] = true;
            nthreads++;
        } else {
            write_group(g);
        }
    }
    for (size_t gi = 0; gi < gs.n; gi++)
        if (started && started[gi]) pthread_join(th[gi], NULL);
    for (size_t gi = 0; gi < gs.n; gi++) {
        group *g = &gs.g[gi];
        for (size_t k = 0; k < g->n; k++) {
            const push_action *x = &a[g->idx[k]];
            bool ok = !oom && g->status && g->status[k] == 0;
            pitem *it = dfind(p, x->transfer_id);
            if (ok && it && !it->used_kind[0] && it->kinds)
                snprintf(it->used_kind, sizeof it->used_kind, "%s", it->kinds[x->shard]);
            if (!ok && it && !it->why[0])
                snprintf(it->why, sizeof it->why, "writing to %.100s (shard %zu) failed: %s",
                         g->addr, x->shard,
                         g->status ? ect_strerror(g->status[k]) : "out of memory");
            if (!ok)
                ECT_LOGW(MOD, "write of %s to %s failed: %s", x->transfer_id, g->addr,
                         g->status ? ect_strerror(g->status[k]) : "out of memory");
            push_write_done(p->table, x->transfer_id, x->shard, ok);
        }
    }
    if (oom) /* writes never grouped: fail them */
        for (size_t i = 0; i < n; i++) {
            bool grouped = false;
            for (size_t gi = 0; gi < gs.n && !grouped; gi++)
                for (size_t k = 0; k < gs.g[gi].n; k++) grouped |= gs.g[gi].idx[k] == i;
            if (a[i].kind == PUSH_ACT_WRITE && !grouped)
                push_write_done(p->table, a[i].transfer_id, a[i].shard, false);
        }
    free(th);
    free(started);
    groups_free(&gs);
}

static void do_local(ect_push_producer *p, const push_action *a, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const push_action *x = &a[i];
        pitem *it = dfind(p, x->transfer_id);
        if (!it) continue;
        if (x->kind == PUSH_ACT_RELEASE_SOURCE) pp_release_src(p, it);
        if (x->kind != PUSH_ACT_FINISHED) continue;
        int status = x->state == PUSH_DONE        ? 0
                     : x->state == PUSH_CANCELLED ? ECT_ECANCELED
                                                  : ECT_EIO;
        HASH_DELETE(dh, p->disp_items, it);
        for (size_t s = 0; s < it->n_shards; s++) free(it->keys[s]);
        free(it->keys);
        free(it->kinds);
        free(it->ports);
        it->keys = NULL;
        it->kinds = NULL;
        it->ports = NULL;
        it->in_table = false;
        pthread_mutex_lock(&p->mu);
        bool staging = it->stage_queued;
        pp_finish_locked(p, it, status, status == ECT_EIO && it->why[0] ? it->why : x->error);
        pthread_mutex_unlock(&p->mu);
        if (!staging) pp_release_src(p, it); /* a source the table never saw */
    }
}

/* Runs the table until it has nothing more to do now. */
static void run_rounds(ect_push_producer *p) {
    for (;;) {
        pthread_mutex_lock(&p->mu);
        bool stop = p->stop; /* closing: no new round (see the end of pp_dispatch_main) */
        pthread_mutex_unlock(&p->mu);
        if (stop) return;
        size_t n = push_next_actions(p->table, ect_now_ms(), p->acts, p->acts_cap);
        if (!n) return;
        do_reserves(p, p->acts, n);
        do_cancels(p, p->acts, n);
        do_writes(p, p->acts, n);
        do_completes(p, p->acts, n);
        do_local(p, p->acts, n);
    }
}

void *pp_dispatch_main(void *arg) {
    ect_push_producer *p = arg;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        if (!p->stop && !p->handed && !p->stage_h && !p->n_cancels) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            uint64_t ns = (uint64_t)ts.tv_nsec + WAKE_MS * 1000000ull;
            ts.tv_sec += (time_t)(ns / 1000000000ull);
            ts.tv_nsec = (long)(ns % 1000000000ull);
            pthread_cond_timedwait(&p->wake, &p->mu, &ts);
        }
        if (p->stop) {
            pthread_mutex_unlock(&p->mu);
            break;
        }
        pitem *handed = p->handed, *stages = p->stage_h;
        p->handed = p->handed_tail = NULL;
        p->stage_h = NULL;
        char **cancels = p->cancels;
        size_t n_cancels = p->n_cancels;
        p->cancels = NULL;
        p->n_cancels = p->cap_cancels = 0;
        pp_expire_locked(p, ect_now_ms());
        pthread_mutex_unlock(&p->mu);

        take_new(p, handed);
        take_stages(p, stages);
        for (size_t i = 0; i < n_cancels; i++) {
            if (dfind(p, cancels[i])) push_cancel(p->table, cancels[i], ect_now_ms());
            free(cancels[i]);
        }
        free(cancels);
        run_rounds(p);
    }
    /* Closing: what is still in flight fails here without contacting the
     * consumer (a control exchange could take the full timeout); the shards'
     * TTL ends their reservations. */
    pitem *it, *tmp;
    HASH_ITER(dh, p->disp_items, it, tmp) {
        HASH_DELETE(dh, p->disp_items, it);
        it->in_table = false;
        pthread_mutex_lock(&p->mu);
        pp_finish_locked(p, it, ECT_ECLOSED, "push producer closed");
        pthread_mutex_unlock(&p->mu);
    }
    pthread_mutex_lock(&p->mu);
    for (pitem *h = p->handed; h; h = h->next) pp_finish_locked(p, h, ECT_ECLOSED, "closed");
    p->handed = p->handed_tail = NULL;
    pthread_mutex_unlock(&p->mu);
    pp_lanes_close(p);
    ctl_client_close(p->ctl);
    p->ctl = NULL;
    while (p->xports) {
        pp_xport *e = p->xports;
        LL_DELETE(p->xports, e);
        ect_xport_close(e->x);
        free(e);
    }
    pp_consumer *c, *ctmp;
    HASH_ITER(hh, p->consumers, c, ctmp) {
        HASH_DEL(p->consumers, c);
        free(c);
    }
    return NULL;
}
