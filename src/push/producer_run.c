/*
 * producer_run — the push producer's dispatcher thread. It owns the
 * transports and the push_ table, and turns the table's actions into batched
 * exchanges, one round per kind:
 *
 *   RESERVE   grouped by shard address  -> one reserve_batch per shard
 *   REFRESH / ABANDON / GIVE_BACK        -> one cancel each (rare: GIVE_BACK only
 *                                           while a shard refuses as full)
 *   WRITE     grouped by (kind, session) -> one ect_xport_write_batch each,
 *                                           sessions on parallel threads
 *   COMPLETE  grouped by shard address  -> one complete_batch per shard
 *   RELEASE_SOURCE / FINISHED            -> local
 *
 * A step (a flush) of k items therefore costs one reserve_batch and one
 * complete_batch per shard whatever k is.
 *
 * Control exchanges (and shard discovery) never run on this thread: each goes
 * to the lane of its address (producer_lanes.c) and its outcome comes back on
 * p->done, so a consumer that is slow or hung holds up only its own work,
 * never another consumer's pushes. The table hands out no action twice while
 * one is in flight, which is what lets rounds overlap.
 *
 * A reserve a shard refuses because its pool is full is not a failure: the
 * table backs the item off and retries (pushes.h, "Back-pressure"); the
 * dispatcher's wait is cut short to the table's next retry time.
 *
 * Discovery checks what the producer can check before reserving anything:
 * the shard count (expect_shards) and the data plane the consumer names in
 * its `peers` answer (transport), so a mismatch costs the consumer nothing.
 *
 * Failure of an exchange fails the items it carried on that shard (the table
 * then abandons their other shards) and forgets the consumer's cached peers,
 * so a restarted consumer is rediscovered. A timeout or transport failure
 * also holds the address down (downs.h): work for it fails at once, naming it
 * and the last failure, until the backoff runs out and a probe goes out.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utlist.h>
#include <zmq.h>

#include "push/producer.h"
#include "util/sync.h"
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
}

static bool held_down(ect_push_producer *p, const char *host, int port, char *why, size_t cap) {
    char key[PUSH_ADDR_MAX + 16];
    pp_addr_key(host, port, key, sizeof key);
    return down_blocked(p->downs, key, ect_now_ms(), why, cap);
}

/* After an exchange with the control address host:port: success forgets any
 * backoff; a transport failure holds the address down and rewrites `err`
 * (room for `cap`) as "consumer HOST:PORT unreachable: ...". Keyed per shard
 * address, so a dead rank does not hold back the abandons to its live peers. */
static void note_exchange(ect_push_producer *p, const char *host, int port, int rc, char *err,
                          size_t cap) {
    char key[PUSH_ADDR_MAX + 16];
    pp_addr_key(host, port, key, sizeof key);
    if (!rc) {
        down_ok(p->downs, key);
        return;
    }
    if (!pp_unreachable_rc(rc)) return;
    char cause[320];
    snprintf(cause, sizeof cause, "%s", err);
    uint64_t ms = down_fail(p->downs, key, cause, ect_now_ms());
    snprintf(err, cap, "consumer %.100s unreachable: %.190s", key, cause);
    ECT_LOGW(MOD, "consumer %s unreachable (%s); failing its pushes at once for %" PRIu64 " ms",
             key, cause, ms);
}

/* Ends an item the table does not know (discovery or push_add failed). */
static void finish_local(ect_push_producer *p, pitem *it, int status, const char *error) {
    pthread_mutex_lock(&p->mu);
    bool staging = it->stage_queued;
    pp_finish_locked(p, it, status, error);
    pthread_mutex_unlock(&p->mu);
    if (!staging) pp_release_src(p, it);
}

/* Puts an item whose shards are known (c) into the table. */
static void add_item(ect_push_producer *p, pitem *it, const pp_consumer *c) {
    int rc = 0;
    it->n_shards = c->n;
    it->ports = malloc(c->n * sizeof *it->ports);
    it->keys = calloc(c->n, sizeof *it->keys);
    it->kinds = calloc(c->n, sizeof *it->kinds);
    if (!it->ports || !it->keys || !it->kinds) {
        rc = ect_set_error(ECT_ENOMEM, "out of memory");
    } else {
        memcpy(it->ports, c->ports, c->n * sizeof *c->ports);
        push_item pi = {.transfer_id = it->transfer_id,
                        .consumer = it->consumer,
                        .mm_hash = it->mm_hash,
                        .nbytes = it->nbytes,
                        .shape = it->shape,
                        .ndim = it->ndim,
                        .dtype = it->dtype,
                        .n_shards = it->n_shards};
        rc = push_add(p->table, &pi, ect_now_ms());
    }
    if (rc) {
        char err[320];
        snprintf(err, sizeof err, "%s", ect_last_error());
        finish_local(p, it, rc, err);
        return;
    }
    it->in_table = true;
    HASH_ADD(dh, p->disp_items, transfer_id, strlen(it->transfer_id), it);
    pthread_mutex_lock(&p->mu);
    bool staged = it->src_held && !it->stage_queued;
    pthread_mutex_unlock(&p->mu);
    if (staged) push_source_ready(p->table, it->transfer_id, ect_now_ms());
}

/* Fails every item waiting for a discovery. */
static void fail_waiting(ect_push_producer *p, pitem *list, int rc, const char *err) {
    while (list) {
        pitem *it = list;
        list = it->next;
        it->next = NULL;
        it->awaiting_peers = false;
        finish_local(p, it, it->cancel_early ? ECT_ECANCELED : rc,
                     it->cancel_early ? "cancelled" : err);
    }
}

/* Items of a consumer whose shards are not known wait for one peers exchange
 * on its lane (the dispatcher goes on meanwhile); a consumer held down fails
 * them at once. */
static void take_new(ect_push_producer *p, pitem *list) {
    while (list) {
        pitem *it = list;
        list = it->next;
        it->next = NULL;
        pp_disc *d = NULL;
        HASH_FIND_STR(p->discs, it->consumer, d);
        if (d) { /* a discovery is on its way: wait for it */
            it->awaiting_peers = true;
            if (d->waiting_tail)
                d->waiting_tail->next = it;
            else
                d->waiting = it;
            d->waiting_tail = it;
            continue;
        }
        pp_consumer *c = NULL;
        HASH_FIND_STR(p->consumers, it->consumer, c);
        if (c) {
            add_item(p, it, c);
            continue;
        }
        char err[320];
        if (held_down(p, it->host, it->port, err, sizeof err)) {
            finish_local(p, it, ECT_ECONNREFUSED, err);
            continue;
        }
        pp_job *j = calloc(1, sizeof *j);
        d = calloc(1, sizeof *d);
        if (j && d) {
            j->kind = PJ_PEERS;
            snprintf(j->host, sizeof j->host, "%s", it->host);
            j->port = it->port;
            j->disc = d;
            snprintf(d->consumer, sizeof d->consumer, "%s", it->consumer);
            d->waiting = d->waiting_tail = it;
        }
        if (!j || !d || pp_lane_submit(p, j)) {
            free(j);
            free(d);
            finish_local(p, it, ECT_ENOMEM, "out of memory starting the discovery");
            continue;
        }
        count(p, &p->st.peers_requests);
        it->awaiting_peers = true;
        HASH_ADD_STR(p->discs, consumer, d);
    }
}

/* A discovery came back: its waiting items go into the table, or fail. */
static void apply_peers(ect_push_producer *p, pp_job *j) {
    pp_disc *d = j->disc;
    HASH_DEL(p->discs, d);
    pitem *list = d->waiting;
    const char *consumer = d->consumer;
    int rc = j->rc;
    if (!rc && j->nports < 1) {
        rc = ECT_EPROTO;
        snprintf(j->err, sizeof j->err, "peers: the consumer reported no shards");
    }
    char err[320];
    snprintf(err, sizeof err, "%s", j->err);
    if (!j->held) note_exchange(p, j->host, j->port, rc, err, sizeof err);
    char text[400] = "";
    if (!rc && p->o.expect_shards && j->nports != p->o.expect_shards) {
        rc = ECT_EPROTO;
        snprintf(text, sizeof text,
                 "the consumer %.100s has %zu shard(s) (TP ranks), this producer expects %u; "
                 "nothing was reserved",
                 consumer, j->nports, p->o.expect_shards);
    } else if (!rc && p->transport[0] && j->transport[0] && strcmp(p->transport, j->transport)) {
        rc = ECT_ENOTSUP;
        snprintf(text, sizeof text,
                 "the consumer %.100s offers transport '%.32s', this producer requires '%s'; "
                 "nothing was reserved",
                 consumer, j->transport, p->transport);
    }
    pp_consumer *c = NULL;
    if (!rc && !(c = calloc(1, sizeof *c))) {
        rc = ECT_ENOMEM;
        snprintf(err, sizeof err, "out of memory");
    }
    if (rc) {
        if (text[0])
            ECT_LOGW(MOD, "%s", text);
        else if (pp_unreachable_rc(rc))
            snprintf(text, sizeof text, "%s", err);
        else
            snprintf(text, sizeof text, "discovering the shards of %.100s failed: %.250s", consumer,
                     err);
        fail_waiting(p, list, rc, text);
        free(d);
        return;
    }
    snprintf(c->consumer, sizeof c->consumer, "%s", consumer);
    c->n = j->nports;
    memcpy(c->ports, j->ports, j->nports * sizeof *j->ports);
    snprintf(c->transport, sizeof c->transport, "%s", j->transport);
    HASH_ADD_STR(p->consumers, consumer, c);
    /* it answered: its ranks are back too (a restart may reuse their ports) */
    for (size_t i = 0; i < c->n; i++) {
        char key[PUSH_ADDR_MAX + 16];
        pp_addr_key(j->host, c->ports[i], key, sizeof key);
        down_ok(p->downs, key);
    }
    free(d);
    while (list) {
        pitem *it = list;
        list = it->next;
        it->next = NULL;
        it->awaiting_peers = false;
        if (it->cancel_early)
            finish_local(p, it, ECT_ECANCELED, "cancelled");
        else
            add_item(p, it, c);
    }
}

/* A cancel for an item still waiting for its consumer's discovery: it ends
 * when the discovery does. */
static void cancel_waiting(ect_push_producer *p, const char *id) {
    pp_disc *d, *tmp;
    HASH_ITER(hh, p->discs, d, tmp) {
        for (pitem *it = d->waiting; it; it = it->next)
            if (!strcmp(it->transfer_id, id)) it->cancel_early = true;
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
        if (!done && it->awaiting_peers) continue; /* add_item hands it over */
        /* A record that ended meanwhile no longer wants it: we own it again. */
        if (done || !it->in_table ||
            push_source_ready(p->table, it->transfer_id, ect_now_ms()) != 0)
            pp_release_src(p, it);
    }
}

/* ---------------------------------------------------------------- rounds */

typedef struct group {
    lane_job lj; /* first: writes run on the write lane of `addr` */
    ect_push_producer *p;
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

/* --------------------------------------------------- control exchanges
 *
 * Each batch becomes a job on the lane of its shard address; its outcome is
 * applied (settle) when the lane hands it back, or at once when it never goes
 * out (the address is held down, no memory). */

static void apply_reserve(ect_push_producer *p, pp_job *j) {
    pitem *it0 = dfind(p, j->acts[0].transfer_id);
    int rc = j->rc;
    char err[320];
    snprintf(err, sizeof err, "%.300s", j->err);
    if (!j->held) note_exchange(p, j->host, j->port, rc, err, sizeof err);
    if (rc) {
        if (it0) forget_consumer(p, it0);
    } else if (!j->rep.ok) {
        snprintf(err, sizeof err, "refused: %.200s", j->rep.error ? j->rep.error : "");
        rc = ECT_EPROTO;
    }
    for (size_t k = 0; k < j->n; k++) {
        const push_action *ac = &j->acts[k];
        pitem *it = dfind(p, ac->transfer_id);
        if (rc) {
            if (it && !it->why[0] && pp_unreachable_rc(rc))
                snprintf(it->why, sizeof it->why, "shard %zu: %.170s", ac->shard, err);
            push_reserve_done(p->table, ac->transfer_id, ac->shard, NULL, err, ect_now_ms());
            continue;
        }
        const wire_reserve_outcome *o = &j->rep.u.reserve_batch.items[k];
        if (!o->ok && o->error && strstr(o->error, "buffer pool is full") &&
            !strstr(o->error, "more than the whole pool")) {
            /* upstream's text: back-pressure, not a failure of the item (ours
             * says when the item could never fit: that one fails at once) */
            push_reserve_full(p->table, ac->transfer_id, ac->shard, o->error, ect_now_ms());
            continue;
        }
        if (!o->ok) {
            push_reserve_done(p->table, ac->transfer_id, ac->shard, NULL,
                              o->error ? o->error : "refused", ect_now_ms());
            continue;
        }
        if (o->result.cancelled && o->result.reason[0] && it && !it->why[0])
            snprintf(it->why, sizeof it->why, "refused by shard %zu: %.170s", ac->shard,
                     o->result.reason);
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
}

static void apply_complete(ect_push_producer *p, pp_job *j) {
    pitem *it0 = dfind(p, j->acts[0].transfer_id);
    if (!j->held) note_exchange(p, j->host, j->port, j->rc, j->err, sizeof j->err);
    if (j->rc) {
        ECT_LOGW(MOD, "complete_batch to %s:%d failed: %s", j->host, j->port, j->err);
        if (it0) forget_consumer(p, it0);
    }
    for (size_t k = 0; k < j->n; k++) {
        const push_action *ac = &j->acts[k];
        pitem *it = dfind(p, ac->transfer_id);
        if (j->rc && it && !it->why[0] && pp_unreachable_rc(j->rc))
            snprintf(it->why, sizeof it->why, "shard %zu: %.170s", ac->shard, j->err);
        bool done = !j->rc && j->rep.u.complete_batch.items[k].completed;
        push_complete_done(p->table, ac->transfer_id, ac->shard, j->rc == 0, done);
    }
}

static void apply_cancel(ect_push_producer *p, pp_job *j) {
    const push_action *x = &j->acts[0];
    pitem *it = dfind(p, x->transfer_id);
    if (!j->held) note_exchange(p, j->host, j->port, j->rc, j->err, sizeof j->err);
    if (j->rc) {
        ECT_LOGW(MOD, "cancel of %s on shard %zu failed: %s", x->transfer_id, x->shard, j->err);
        if (it) forget_consumer(p, it);
    }
    if (x->kind == PUSH_ACT_REFRESH || x->kind == PUSH_ACT_GIVE_BACK) {
        if (!j->rc && x->kind == PUSH_ACT_REFRESH) {
            pthread_mutex_lock(&p->mu);
            p->st.refreshes++;
            pthread_mutex_unlock(&p->mu);
        }
        push_refresh_done(p->table, x->transfer_id, x->shard, j->rc == 0);
    } else {
        push_abandon_done(p->table, x->transfer_id, x->shard, j->rc == 0);
    }
}

/* Applies a finished job to the table and frees it. */
static void settle(ect_push_producer *p, pp_job *j) {
    switch (j->kind) {
    case PJ_PEERS: apply_peers(p, j); break;
    case PJ_RESERVE: apply_reserve(p, j); break;
    case PJ_COMPLETE: apply_complete(p, j); break;
    case PJ_CANCEL: apply_cancel(p, j); break;
    }
    pp_job_free(j);
}

/* A job for the actions a[idx[0..m)] (all on one shard address). NULL when
 * out of memory. */
static pp_job *job_new(ect_push_producer *p, pp_job_kind kind, const push_action *a,
                       const size_t *idx, size_t m) {
    pp_job *j = calloc(1, sizeof *j);
    if (!j || !(j->acts = calloc(m, sizeof *j->acts))) {
        free(j);
        return NULL;
    }
    j->kind = kind;
    j->n = m;
    for (size_t k = 0; k < m; k++) j->acts[k] = a[idx[k]];
    const pitem *it0 = dfind(p, a[idx[0]].transfer_id);
    j->port = it0 ? shard_port(p, it0, a[idx[0]].shard) : -1;
    snprintf(j->host, sizeof j->host, "%s", it0 ? it0->host : "?");
    return j;
}

/* Sends j on its lane, or settles it at once when it cannot go out. */
static void launch(ect_push_producer *p, pp_job *j) {
    if (!j->rc && j->port <= 0) {
        j->rc = ECT_ENOTFOUND;
        snprintf(j->err, sizeof j->err, "shard address unknown");
    }
    if (!j->rc && held_down(p, j->host, j->port, j->err, sizeof j->err)) {
        j->rc = ECT_ECONNREFUSED;
        j->held = true;
    }
    if (!j->rc) {
        if (!pp_lane_submit(p, j)) return; /* the lane owns it now: do not touch it */
        j->rc = ECT_ENOMEM;
        snprintf(j->err, sizeof j->err, "%.300s", ect_last_error());
    }
    if (j->rc) {
        j->held = true;
        settle(p, j);
    }
}

/* Fails one action at once (out of memory before its job is sent). */
static void fail_action(ect_push_producer *p, const push_action *ac) {
    if (ac->kind == PUSH_ACT_RESERVE)
        push_reserve_done(p->table, ac->transfer_id, ac->shard, NULL, "out of memory",
                          ect_now_ms());
    else if (ac->kind == PUSH_ACT_COMPLETE)
        push_complete_done(p->table, ac->transfer_id, ac->shard, false, false);
    else if (ac->kind == PUSH_ACT_REFRESH || ac->kind == PUSH_ACT_GIVE_BACK)
        push_refresh_done(p->table, ac->transfer_id, ac->shard, false);
    else if (ac->kind == PUSH_ACT_ABANDON)
        push_abandon_done(p->table, ac->transfer_id, ac->shard, false);
}

/* Fails the actions of `kind` at once (out of memory before any job). */
static void fail_all(ect_push_producer *p, const push_action *a, size_t n, push_action_kind kind) {
    for (size_t i = 0; i < n; i++)
        if (a[i].kind == kind) fail_action(p, &a[i]);
}

static void do_reserves(ect_push_producer *p, const push_action *a, size_t n) {
    groups gs = {0};
    if (group_by_shard(p, a, n, PUSH_ACT_RESERVE, &gs)) {
        groups_free(&gs);
        fail_all(p, a, n, PUSH_ACT_RESERVE);
        return;
    }
    for (size_t gi = 0; gi < gs.n; gi++) {
        group *g = &gs.g[gi];
        pp_job *j = job_new(p, PJ_RESERVE, a, g->idx, g->n);
        wire_reserve_item *items = j ? calloc(g->n, sizeof *items) : NULL;
        if (!items) {
            pp_job_free(j);
            for (size_t k = 0; k < g->n; k++) fail_action(p, &a[g->idx[k]]);
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
        j->req.op = WIRE_OP_RESERVE_BATCH;
        j->req.u.reserve_batch.n = g->n;
        j->req.u.reserve_batch.items = items;
        count(p, &p->st.reserve_batches);
        launch(p, j);
    }
    groups_free(&gs);
}

static void do_completes(ect_push_producer *p, const push_action *a, size_t n) {
    groups gs = {0};
    if (group_by_shard(p, a, n, PUSH_ACT_COMPLETE, &gs)) {
        groups_free(&gs);
        fail_all(p, a, n, PUSH_ACT_COMPLETE);
        return;
    }
    for (size_t gi = 0; gi < gs.n; gi++) {
        group *g = &gs.g[gi];
        pp_job *j = job_new(p, PJ_COMPLETE, a, g->idx, g->n);
        wire_complete_req *items = j ? calloc(g->n, sizeof *items) : NULL;
        if (!items) {
            pp_job_free(j);
            for (size_t k = 0; k < g->n; k++) fail_action(p, &a[g->idx[k]]);
            continue;
        }
        for (size_t k = 0; k < g->n; k++) {
            snprintf(items[k].transfer_id, sizeof items[k].transfer_id, "%s",
                     a[g->idx[k]].transfer_id);
            snprintf(items[k].reservation_id, sizeof items[k].reservation_id, "%s",
                     a[g->idx[k]].reservation_id);
        }
        j->want_ok = true;
        j->req.op = WIRE_OP_COMPLETE_BATCH;
        j->req.u.complete_batch.n = g->n;
        j->req.u.complete_batch.items = items;
        count(p, &p->st.complete_batches);
        launch(p, j);
    }
    groups_free(&gs);
}

/* REFRESH, GIVE_BACK and ABANDON: a cancel each. An abandon to an address
 * held down is not sent: the shard's TTL ends that reservation. */
static void do_cancels(ect_push_producer *p, const push_action *a, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const push_action *x = &a[i];
        if (x->kind != PUSH_ACT_REFRESH && x->kind != PUSH_ACT_ABANDON &&
            x->kind != PUSH_ACT_GIVE_BACK)
            continue;
        pp_job *j = job_new(p, PJ_CANCEL, a, &i, 1);
        if (!j) {
            fail_action(p, x);
            continue;
        }
        j->want_ok = true;
        j->req.op = WIRE_OP_CANCEL;
        snprintf(j->req.u.cancel.transfer_id, sizeof j->req.u.cancel.transfer_id, "%s",
                 x->transfer_id);
        snprintf(j->req.u.cancel.reservation_id, sizeof j->req.u.cancel.reservation_id, "%s",
                 x->reservation_id);
        j->req.u.cancel.abandon = true;
        j->req.u.cancel.refresh = x->kind != PUSH_ACT_ABANDON; /* frees at once, no event */
        count(p, &p->st.cancels);
        launch(p, j);
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

static void write_group(group *g) {
    g->rc = ect_xport_write_batch(g->x, g->session, g->w, g->n, g->status);
}

/* lane_ops.run of the write lanes: one group, then the round hears of it. */
static void write_lane_run(void *ctx, lane *l, void *state, lane_job *lj) {
    ect_push_producer *p = ctx;
    (void)l;
    (void)state;
    write_group((group *)lj);
    pthread_mutex_lock(&p->wmu);
    p->wpending--;
    pthread_cond_signal(&p->wcv);
    pthread_mutex_unlock(&p->wmu);
}

int pp_write_lanes_open(ect_push_producer *p) {
    lane_ops o = {.run = write_lane_run, .ctx = p};
    return lanes_open(&o, PP_MAX_LANES, PP_LANE_IDLE_MS, &p->wlanes);
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
        /* sessions in parallel, each on its write lane; the last group runs on this thread */
        bool queued = false;
        if (gi + 1 < gs.n) {
            pthread_mutex_lock(&p->wmu);
            p->wpending++;
            pthread_mutex_unlock(&p->wmu);
            queued = lanes_submit(p->wlanes, g->addr, &g->lj) == 0;
            if (!queued) {
                pthread_mutex_lock(&p->wmu);
                p->wpending--;
                pthread_mutex_unlock(&p->wmu);
            }
        }
        if (!queued) write_group(g);
    }
    pthread_mutex_lock(&p->wmu);
    while (p->wpending) pthread_cond_wait(&p->wcv, &p->wmu);
    pthread_mutex_unlock(&p->wmu);
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
        it->retries = x->retries;
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
        pp_finish_locked(p, it, status,
                         (status == ECT_EIO || status == ECT_ECANCELED) && it->why[0] ? it->why
                                                                                      : x->error);
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

/* The table's counters the public stats show. */
static void copy_table_stats(ect_push_producer *p) {
    push_stats ps;
    push_get_stats(p->table, &ps);
    pthread_mutex_lock(&p->mu);
    p->st.full_refusals = ps.full_refusals;
    p->st.retries = ps.retries;
    p->st.give_backs = ps.give_backs;
    pthread_mutex_unlock(&p->mu);
}

void *pp_dispatch_main(void *arg) {
    ect_push_producer *p = arg;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        if (!p->stop && !p->handed && !p->stage_h && !p->n_cancels && !p->done) {
            uint64_t ms = WAKE_MS, wake = push_next_wake(p->table), now = ect_now_ms();
            if (wake) ms = wake <= now ? 0 : wake - now < ms ? wake - now : ms;
            ect_cond_wait_until(&p->wake, &p->mu, ect_deadline_ns(ms));
        }
        if (p->stop) {
            pthread_mutex_unlock(&p->mu);
            break;
        }
        pp_job *done = p->done;
        p->done = p->done_tail = NULL;
        pitem *handed = p->handed, *stages = p->stage_h;
        p->handed = p->handed_tail = NULL;
        p->stage_h = NULL;
        char **cancels = p->cancels;
        size_t n_cancels = p->n_cancels;
        p->cancels = NULL;
        p->n_cancels = p->cap_cancels = 0;
        pp_expire_locked(p, ect_now_ms());
        pthread_mutex_unlock(&p->mu);

        while (done) {
            pp_job *j = done;
            done = j->next;
            settle(p, j);
        }
        take_new(p, handed);
        take_stages(p, stages);
        for (size_t i = 0; i < n_cancels; i++) {
            if (dfind(p, cancels[i]))
                push_cancel(p->table, cancels[i], ect_now_ms());
            else
                cancel_waiting(p, cancels[i]);
            free(cancels[i]);
        }
        free(cancels);
        run_rounds(p);
        copy_table_stats(p);
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
    /* the lanes are gone: what they handed back is only freed */
    pthread_mutex_lock(&p->mu);
    pp_job *done = p->done;
    p->done = p->done_tail = NULL;
    pthread_mutex_unlock(&p->mu);
    while (done) {
        pp_job *j = done;
        done = j->next;
        pp_job_free(j);
    }
    pp_disc *d, *dtmp;
    HASH_ITER(hh, p->discs, d, dtmp) {
        HASH_DEL(p->discs, d);
        fail_waiting(p, d->waiting, ECT_ECLOSED, "push producer closed");
        free(d);
    }
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
