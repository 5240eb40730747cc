/*
 * producer_run — the push producer's dispatcher thread. It owns the REQ
 * sockets (through one ctl_client), the transports and the push_ table, and
 * turns the table's actions into batched exchanges, one round per kind:
 *
 *   RESERVE   grouped by shard address  -> one reserve_batch per shard
 *   REFRESH / ABANDON                    -> one cancel each (rare)
 *   WRITE     grouped by (kind, session) -> one ect_xport_write_batch each,
 *                                           sessions on parallel threads
 *   COMPLETE  grouped by shard address  -> one complete_batch per shard
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
        int rc = discover(p, it);
        if (rc) {
            snprintf(err, sizeof err, "discovering the shards of %s failed: %s", it->consumer,
                     ect_last_error());
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

static void do_reserves(ect_push_producer *p, const push_action *a, size_t n) {
    groups gs = {0};
    if (group_by_shard(p, a, n, PUSH_ACT_RESERVE, &gs)) {
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
        int port = shard_port(p, it0, a[g->idx[0]].shard);
        wire_ctl_request req;
        memset(&req, 0, sizeof req);
        req.op = WIRE_OP_RESERVE_BATCH;
        wire_reserve_item *items = calloc(g->n, sizeof *items);
        wire_ctl_reply rep;
        memset(&rep, 0, sizeof rep);
        int rc = items ? 0 : ect_set_error(ECT_ENOMEM, "out of memory");
        for (size_t k = 0; !rc && k < g->n; k++) {
            const push_action *x = &a[g->idx[k]];
            wire_reserve_req *r = &items[k].req;
            snprintf(r->transfer_id, sizeof r->transfer_id, "%s", x->transfer_id);
            snprintf(r->mm_hash, sizeof r->mm_hash, "%s", x->mm_hash);
            r->tensor.nbytes = x->nbytes;
            r->tensor.ndim = (uint32_t)x->ndim;
            memcpy(r->tensor.shape, x->shape, sizeof r->tensor.shape);
            snprintf(r->tensor.dtype, sizeof r->tensor.dtype, "%s", x->dtype);
        }
        if (!rc) {
            req.u.reserve_batch.n = g->n;
            req.u.reserve_batch.items = items;
            count(p, &p->st.reserve_batches);
            rc = port > 0 ? ctl_call(p->ctl, it0->host, port, &req, &rep)
                          : ect_set_error(ECT_ENOTFOUND, "shard address unknown");
        }
        char err[320];
        if (rc) {
            snprintf(err, sizeof err, "%.200s", ect_last_error());
            forget_consumer(p, it0);
        } else if (!rep.ok) {
            snprintf(err, sizeof err, "refused: %.200s", rep.error ? rep.error : "");
            rc = ECT_EPROTO;
        }
        for (size_t k = 0; k < g->n; k++) {
            const push_action *x = &a[g->idx[k]];
            pitem *it = dfind(p, x->transfer_id);
            if (rc) {
                push_reserve_done(p->table, x->transfer_id, x->shard, NULL, err, ect_now_ms());
                continue;
            }
            const wire_reserve_outcome *o = &rep.u.reserve_batch.items[k];
            if (!o->ok) {
                push_reserve_done(p->table, x->transfer_id, x->shard, NULL,
                                  o->error ? o->error : "refused", ect_now_ms());
                continue;
            }
            const wire_reserve_result *r = &o->result;
            if (it && x->shard < it->n_shards) {
                free(it->keys[x->shard]);
                it->keys[x->shard] = r->dst_key ? strdup(r->dst_key) : NULL;
                snprintf(it->kinds[x->shard], sizeof it->kinds[x->shard], "%s",
                         r->transport[0] ? r->transport : "tcp");
            }
            push_reservation pr = {.reservation_id = r->reservation_id,
                                   .dst_session = r->dst_session,
                                   .dst_ptr = r->dst_ptr,
                                   .write = r->write,
                                   .ready = r->ready,
                                   .cached = r->cached,
                                   .cancelled = r->cancelled};
            push_reserve_done(p->table, x->transfer_id, x->shard, &pr, NULL, ect_now_ms());
        }
        wire_ctl_reply_clear(&rep);
        free(items);
    }
    groups_free(&gs);
}

static void do_completes(ect_push_producer *p, const push_action *a, size_t n) {
    groups gs = {0};
    if (group_by_shard(p, a, n, PUSH_ACT_COMPLETE, &gs)) {
        for (size_t i = 0; i < n; i++)
            if (a[i].kind == PUSH_ACT_COMPLETE)
                push_complete_done(p->table, a[i].transfer_id, a[i].shard, false, false);
        groups_free(&gs);
        return;
    }
    for (size_t gi = 0; gi < gs.n; gi++) {
        group *g = &gs.g[gi];
        const pitem *it0 = group_item(p, a, g);
        int port = shard_port(p, it0, a[g->idx[0]].shard);
        wire_complete_req *items = calloc(g->n, sizeof *items);
        wire_ctl_request req;
        memset(&req, 0, sizeof req);
        req.op = WIRE_OP_COMPLETE_BATCH;
        wire_ctl_reply rep;
        memset(&rep, 0, sizeof rep);
        int rc = items ? 0 : ect_set_error(ECT_ENOMEM, "out of memory");
        for (size_t k = 0; !rc && k < g->n; k++) {
            snprintf(items[k].transfer_id, sizeof items[k].transfer_id, "%s",
                     a[g->idx[k]].transfer_id);
            snprintf(items[k].reservation_id, sizeof items[k].reservation_id, "%s",
                     a[g->idx[k]].reservation_id);
        }
        if (!rc) {
            req.u.complete_batch.n = g->n;
            req.u.complete_batch.items = items;
            count(p, &p->st.complete_batches);
            rc = port > 0 ? ctl_call_ok(p->ctl, it0->host, port, &req, &rep)
                          : ect_set_error(ECT_ENOTFOUND, "shard address unknown");
        }
        if (rc) {
            ECT_LOGW(MOD, "complete_batch to %s failed: %s", g->addr, ect_last_error());
            forget_consumer(p, it0);
        }
        for (size_t k = 0; k < g->n; k++) {
            const push_action *x = &a[g->idx[k]];
            bool done = !rc && rep.u.complete_batch.items[k].completed;
            push_complete_done(p->table, x->transfer_id, x->shard, rc == 0, done);
        }
        wire_ctl_reply_clear(&rep);
        free(items);
    }
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
        count(p, &p->st.cancels);
        int rc = port > 0 ? ctl_call_ok(p->ctl, it->host, port, &req, &rep)
                          : ect_set_error(ECT_ENOTFOUND, "shard address unknown");
        if (rc) {
            ECT_LOGW(MOD, "cancel of %s on shard %zu failed: %s", x->transfer_id, x->shard,
                     ect_last_error());
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
