/*
 * batch — see batch.h. Building walks the round's actions once per kind and
 * groups them by the string key their exchange goes to; settling maps the
 * reply's items back to the members in the order they were put in, so the
 * k-th item of a reserve_batch answers the k-th member.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "push/batch.h"
#include "util/hostport.h"
#include "util/util.h"

#define MOD "producer"

bool pb_unreachable_rc(int rc) {
    return rc == ECT_ETIMEDOUT || rc == ECT_ECONNREFUSED || rc == ECT_EIO;
}

static void spare_free(pb_spare *sp) {
    if (!sp) return;
    free(sp->dst_key);
    free(sp);
}

void pb_spares_free(pbatch *b) {
    while (b->spares) {
        pb_spare *sp = b->spares;
        b->spares = sp->next;
        spare_free(sp);
    }
}

/* Unlinks and returns the spare of the shard address key, or NULL. */
static pb_spare *spare_take(pbatch *b, const char *key) {
    for (pb_spare **pp = &b->spares; *pp; pp = &(*pp)->next) {
        if (strcmp((*pp)->key, key)) continue;
        pb_spare *sp = *pp;
        *pp = sp->next;
        sp->next = NULL;
        return sp;
    }
    return NULL;
}

/* Keeps the spare a reply of x's shard granted (its "ect_spare"), in place
 * of the one held for that address: the shard keeps one per peer. */
static void spare_keep(pbatch *b, const px *x) {
    if (x->rc || !x->rep.ok || !x->rep.has_spare) return;
    const wire_reserve_result *r = &x->rep.spare;
    spare_free(spare_take(b, x->key));
    pb_spare *sp = calloc(1, sizeof *sp);
    if (!sp || strlen(r->reservation_id) > ECT_ID_LEN || !r->dst_session[0] ||
        strlen(r->dst_session) > PUSH_ADDR_MAX ||
        (r->dst_key && !(sp->dst_key = strdup(r->dst_key)))) {
        spare_free(sp); /* no memory, or not a range we can write: the shard's TTL frees it */
        return;
    }
    ect_strcpy_cut(sp->key, sizeof sp->key, x->key);
    ect_strcpy_cut(sp->rid, sizeof sp->rid, r->reservation_id);
    ect_strcpy_cut(sp->session, sizeof sp->session, r->dst_session);
    ect_strcpy_cut(sp->kind, sizeof sp->kind, r->transport[0] ? r->transport : "tcp");
    sp->dst_ptr = r->dst_ptr;
    sp->nbytes = r->nbytes;
    sp->next = b->spares;
    b->spares = sp;
}

void px_free(px *x) {
    if (!x) return;
    spare_free(x->spare);
    wire_ctl_reply_clear(&x->rep);
    if (x->req.op == WIRE_OP_RESERVE_BATCH) free(x->req.u.reserve_batch.items);
    if (x->req.op == WIRE_OP_COMPLETE_BATCH) free(x->req.u.complete_batch.items);
    free(x->m);
    free(x->w);
    free(x->status);
    free(x);
}

static px *px_new(px_kind kind, size_t max_members) {
    px *x = calloc(1, sizeof *x);
    if (!x || !(x->m = calloc(max_members ? max_members : 1, sizeof *x->m))) {
        free(x);
        return NULL;
    }
    x->kind = kind;
    return x;
}

/* ---------------------------------------------------------------- settle */

/* After an exchange with the control address x->key: success forgets any
 * backoff; a transport failure holds the address down and rewrites x->err
 * as "consumer HOST:PORT unreachable: ...". Keyed per shard address, so a
 * dead rank does not hold back the abandons to its live peers. */
static void note_exchange(pbatch *b, px *x, uint64_t now) {
    if (x->held) return;
    if (!x->rc) {
        down_ok(b->downs, x->key);
        atomic_store(&b->held_down, down_count(b->downs));
        return;
    }
    if (!pb_unreachable_rc(x->rc)) return;
    char cause[PX_ERR_MAX];
    ect_strcpy_cut(cause, sizeof cause, x->err);
    uint64_t ms = down_fail(b->downs, x->key, cause, now);
    atomic_store(&b->held_down, down_count(b->downs));
    snprintf(x->err, sizeof x->err, "consumer %.100s unreachable: %.190s", x->key, cause);
    ECT_LOGW(MOD, "consumer %s unreachable (%s); failing its pushes at once for %" PRIu64 " ms",
             x->key, cause, ms);
}

/* A discovery came back: the consumer's shards, or why there are none. */
static void settle_peers(pbatch *b, px *x, uint64_t now) {
    const wire_ctl_reply *rep = &x->rep;
    if (!x->rc && rep->u.peers.n > PUSH_MAX_SHARDS) {
        x->rc = ECT_ERANGE;
        snprintf(x->err, sizeof x->err, "%.200s reports %zu shards, at most %d supported", x->key,
                 rep->u.peers.n, PUSH_MAX_SHARDS);
    } else if (!x->rc && rep->u.peers.n < 1) {
        x->rc = ECT_EPROTO;
        snprintf(x->err, sizeof x->err, "peers: the consumer reported no shards");
    }
    note_exchange(b, x, now);
    int rc = x->rc;
    char text[400] = "";
    size_t n = rc ? 0 : rep->u.peers.n;
    const char *transport = rc ? "" : rep->u.peers.transport;
    if (!rc && b->expect_shards && n != b->expect_shards) {
        rc = ECT_EPROTO;
        snprintf(text, sizeof text,
                 "the consumer %.100s has %zu shard(s) (TP ranks), this producer expects %u; "
                 "nothing was reserved",
                 x->consumer, n, b->expect_shards);
    } else if (!rc && b->transport[0] && transport[0] && strcmp(b->transport, transport)) {
        rc = ECT_ENOTSUP;
        snprintf(text, sizeof text,
                 "the consumer %.100s offers transport '%.32s', this producer requires '%s'; "
                 "nothing was reserved",
                 x->consumer, transport, b->transport);
    }
    if (rc) {
        if (text[0])
            ECT_LOGW(MOD, "%s", text);
        else if (pb_unreachable_rc(rc))
            ect_strcpy_cut(text, sizeof text, x->err);
        else
            snprintf(text, sizeof text, "discovering the shards of %.100s failed: %.250s",
                     x->consumer, x->err);
        push_peers_done(b->t, x->consumer, rc, text, NULL, 0, NULL);
        return;
    }
    int ports[PUSH_MAX_SHARDS];
    for (size_t i = 0; i < n; i++) {
        ports[i] = rep->u.peers.ports[i];
        /* it answered: its ranks are back too (a restart may reuse their ports) */
        char key[PX_KEY_MAX];
        ect_hostport_format(x->host, ports[i], key, sizeof key);
        down_ok(b->downs, key);
    }
    atomic_store(&b->held_down, down_count(b->downs));
    push_peers_done(b->t, x->consumer, 0, NULL, ports, n, transport);
}

/* The exchange failed or was refused (rc): the items it carried on this
 * shard fail, with the cause named when the consumer is unreachable. */
static void note_unreachable(const px *x, const px_member *m) {
    if (pb_unreachable_rc(x->rc)) push_note_cause(m->rec, "shard %zu: %.170s", m->shard, x->err);
}

static void settle_reserve(pbatch *b, px *x, uint64_t now) {
    note_exchange(b, x, now);
    spare_keep(b, x);
    if (x->rc) {
        push_forget_consumer(b->t, x->m[0].rec->consumer);
    } else if (!x->rep.ok) {
        char why[PX_ERR_MAX];
        snprintf(why, sizeof why, "refused: %.200s", x->rep.error ? x->rep.error : "");
        ect_strcpy_cut(x->err, sizeof x->err, why);
        x->rc = ECT_EPROTO;
    }
    size_t got = x->rc ? 0 : x->rep.u.reserve_batch.n;
    for (size_t k = 0; k < x->n; k++) {
        const px_member *m = &x->m[k];
        if (x->rc || k >= got) {
            note_unreachable(x, m);
            push_reserve_done(b->t, m->rec, m->shard, NULL, x->rc ? x->err : "no reply", now);
            continue;
        }
        const wire_reserve_outcome *o = &x->rep.u.reserve_batch.items[k];
        if (!o->ok && o->error && strstr(o->error, "buffer pool is full") &&
            !strstr(o->error, "more than the whole pool")) {
            /* upstream's text: back-pressure, not a failure of the item (ours
             * says when the item could never fit: that one fails at once) */
            push_reserve_full(b->t, m->rec, m->shard, o->error, now);
            continue;
        }
        if (!o->ok) {
            push_reserve_done(b->t, m->rec, m->shard, NULL, o->error ? o->error : "refused", now);
            continue;
        }
        const wire_reserve_result *r = &o->result;
        if (r->cancelled && r->reason[0])
            push_note_cause(m->rec, "refused by shard %zu: %.170s", m->shard, r->reason);
        push_reservation pr = {.reservation_id = r->reservation_id,
                               .dst_session = r->dst_session,
                               .dst_ptr = r->dst_ptr,
                               .dst_key = r->dst_key,
                               .transport = r->transport,
                               .write = r->write,
                               .ready = r->ready,
                               .cached = r->cached,
                               .cancelled = r->cancelled};
        push_reserve_done(b->t, m->rec, m->shard, &pr, NULL, now);
    }
}

/* The reservation a put made: the spare's range, bound to the item. */
static push_reservation put_reservation(const pb_spare *sp) {
    return (push_reservation){.reservation_id = sp->rid,
                              .dst_session = sp->session,
                              .dst_ptr = sp->dst_ptr,
                              .dst_key = sp->dst_key,
                              .transport = sp->kind,
                              .write = true};
}

/* An ect_put came back: done in one exchange, or refused (its write failed,
 * the shard said no, or an upstream shard does not know the op): the item
 * is reserved again the normal way. A transport failure fails it as a
 * reserve's would. */
static void settle_put(pbatch *b, px *x, uint64_t now) {
    const px_member *m = &x->m[0];
    if (x->put_unsent) {
        b->n.put_refusals++;
        push_reserve_undo(b->t, m->rec, m->shard);
        return;
    }
    note_exchange(b, x, now);
    if (x->rc) {
        push_forget_consumer(b->t, m->rec->consumer);
        note_unreachable(x, m);
        push_reserve_done(b->t, m->rec, m->shard, NULL, x->err, now);
        return;
    }
    if (!x->rep.ok) {
        ECT_LOGD_ID(MOD, m->rec->transfer_id, NULL, "ect_put on %s refused (%s); reserving", x->key,
                    x->rep.error ? x->rep.error : "");
        b->n.put_refusals++;
        push_reserve_undo(b->t, m->rec, m->shard);
        return;
    }
    spare_keep(b, x);
    push_reservation pr = put_reservation(x->spare);
    push_put_done(b->t, m->rec, m->shard, &pr, x->rep.u.complete.completed, now);
}

static void settle_complete(pbatch *b, px *x, uint64_t now) {
    note_exchange(b, x, now);
    if (x->rc) {
        ECT_LOGW(MOD, "complete_batch to %s failed: %s", x->key, x->err);
        push_forget_consumer(b->t, x->m[0].rec->consumer);
    }
    size_t got = x->rc ? 0 : x->rep.u.complete_batch.n;
    for (size_t k = 0; k < x->n; k++) {
        const px_member *m = &x->m[k];
        if (x->rc) note_unreachable(x, m);
        bool done = k < got && x->rep.u.complete_batch.items[k].completed;
        push_complete_done(b->t, m->rec, m->shard, x->rc == 0 && k < got, done);
    }
}

static void settle_cancel(pbatch *b, px *x, uint64_t now) {
    const px_member *m = &x->m[0];
    note_exchange(b, x, now);
    if (x->rc) {
        ECT_LOGW_ID(MOD, m->rec->transfer_id, NULL, "cancel of %s on shard %zu failed: %s",
                    m->rec->transfer_id, m->shard, x->err);
        push_forget_consumer(b->t, m->rec->consumer);
    }
    if (m->kind == PUSH_ACT_ABANDON) {
        push_abandon_done(b->t, m->rec, m->shard, x->rc == 0);
        return;
    }
    if (!x->rc && m->kind == PUSH_ACT_REFRESH) b->n.refreshes++;
    push_refresh_done(b->t, m->rec, m->shard, x->rc == 0);
}

static void settle_write(pbatch *b, px *x) {
    for (size_t k = 0; k < x->n; k++) {
        const px_member *m = &x->m[k];
        int st = x->status ? x->status[k] : ECT_ENOMEM;
        if (st) {
            push_note_cause(m->rec, "writing to %.100s (shard %zu) failed: %s", x->key, m->shard,
                            ect_strerror(st));
            ECT_LOGW_ID(MOD, m->rec->transfer_id, m->rec->mm_hash, "write of %s to %s failed: %s",
                        m->rec->transfer_id, x->key, ect_strerror(st));
        }
        push_write_done(b->t, m->rec, m->shard, st == 0);
    }
}

void pb_settle(pbatch *b, px *x, uint64_t now) {
    switch (x->kind) {
    case PX_PEERS: settle_peers(b, x, now); break;
    case PX_RESERVE: settle_reserve(b, x, now); break;
    case PX_COMPLETE: settle_complete(b, x, now); break;
    case PX_CANCEL: settle_cancel(b, x, now); break;
    case PX_WRITE: settle_write(b, x); break;
    case PX_PUT: settle_put(b, x, now); break;
    }
    px_free(x);
}

/* ----------------------------------------------------------------- build */

typedef struct groups {
    px **g;
    size_t n, cap;
} groups;

/* The control group for host:port, or NULL. Matching the fields the key is
 * made of finds the same group as matching the key, without formatting a key
 * per action (the key holds both whole: PX_KEY_MAX). */
static px *group_find_addr(const groups *gs, const char *host, int port) {
    for (size_t i = 0; i < gs->n; i++)
        if (gs->g[i]->port == port && !strcmp(gs->g[i]->host, host)) return gs->g[i];
    return NULL;
}

/* The write group for a data plane and session, or NULL (as above). */
static px *group_find_plane(const groups *gs, const char *kind, const char *session) {
    for (size_t i = 0; i < gs->n; i++)
        if (!strcmp(gs->g[i]->xkind, kind) && !strcmp(gs->g[i]->session, session)) return gs->g[i];
    return NULL;
}

/* A new group keyed `key`, appended to gs, or NULL (out of memory). */
static px *group_new(groups *gs, px_kind kind, const char *key, size_t max_members) {
    if (gs->n == gs->cap) {
        size_t cap = gs->cap ? gs->cap * 2 : 8;
        px **n = realloc(gs->g, cap * sizeof *n);
        if (!n) return NULL;
        gs->g = n;
        gs->cap = cap;
    }
    px *x = px_new(kind, max_members);
    if (!x) return NULL;
    ect_strcpy_cut(x->key, sizeof x->key, key);
    gs->g[gs->n++] = x;
    return x;
}

/* Settles at once an exchange that cannot go out (rc, err already set). */
static void settle_now(pbatch *b, px *x, uint64_t now) {
    x->held = true;
    pb_settle(b, x, now);
}

/* The exchange goes out, unless its address is unknown or held down. */
static void launch(pbatch *b, px *x, uint64_t now, px ***tail, uint64_t *counter) {
    if (x->port <= 0) {
        x->rc = ECT_ENOTFOUND;
        snprintf(x->err, sizeof x->err, "shard address unknown");
    } else if (down_blocked(b->downs, x->key, now, x->err, sizeof x->err)) {
        x->rc = ECT_ECONNREFUSED;
    }
    if (x->rc) {
        settle_now(b, x, now);
        return;
    }
    b->n.control_requests++;
    (*counter)++;
    **tail = x;
    *tail = &x->next;
}

/* Fails the actions of `kind` at once (no memory for their exchange). */
static void fail_members(pbatch *b, const px_member *m, size_t n, uint64_t now) {
    for (size_t k = 0; k < n; k++) {
        if (m[k].kind == PUSH_ACT_RESERVE)
            push_reserve_done(b->t, m[k].rec, m[k].shard, NULL, "out of memory", now);
        else if (m[k].kind == PUSH_ACT_COMPLETE)
            push_complete_done(b->t, m[k].rec, m[k].shard, false, false);
        else if (m[k].kind == PUSH_ACT_WRITE)
            push_write_done(b->t, m[k].rec, m[k].shard, false);
        else if (m[k].kind == PUSH_ACT_ABANDON)
            push_abandon_done(b->t, m[k].rec, m[k].shard, false);
        else
            push_refresh_done(b->t, m[k].rec, m[k].shard, false);
    }
}

static void fail_kind(pbatch *b, const push_action *a, size_t n, push_action_kind kind,
                      uint64_t now) {
    for (size_t i = 0; i < n; i++)
        if (a[i].kind == kind) fail_members(b, &(px_member){kind, a[i].rec, a[i].shard}, 1, now);
}

/* Groups the actions of `kind` by their shard's control address. */
static bool group_by_shard(const push_action *a, size_t n, push_action_kind kind, px_kind xk,
                           groups *gs) {
    for (size_t i = 0; i < n; i++) {
        if (a[i].kind != kind) continue;
        const push_rec *r = a[i].rec;
        int port = r->sh[a[i].shard].port;
        px *x = group_find_addr(gs, r->host, port);
        if (!x) {
            char key[PX_KEY_MAX];
            ect_hostport_format(r->host, port, key, sizeof key);
            if (!(x = group_new(gs, xk, key, n))) return false;
            ect_strcpy_cut(x->host, sizeof x->host, r->host);
            x->port = port;
        }
        x->m[x->n++] = (px_member){kind, a[i].rec, a[i].shard};
    }
    return true;
}

static void fail_groups(pbatch *b, groups *gs, uint64_t now) {
    for (size_t i = 0; i < gs->n; i++) {
        fail_members(b, gs->g[i]->m, gs->g[i]->n, now);
        px_free(gs->g[i]);
    }
    free(gs->g);
    memset(gs, 0, sizeof *gs);
}

static void build_peers(pbatch *b, const push_action *a, size_t n, uint64_t now, px ***tail) {
    for (size_t i = 0; i < n; i++) {
        if (a[i].kind != PUSH_ACT_PEERS) continue;
        px *x = px_new(PX_PEERS, 1);
        if (!x) {
            push_peers_done(b->t, a[i].consumer, ECT_ENOMEM, "out of memory starting the discovery",
                            NULL, 0, NULL);
            continue;
        }
        ect_strcpy_cut(x->consumer, sizeof x->consumer, a[i].consumer);
        ect_strcpy_cut(x->host, sizeof x->host, a[i].host);
        x->port = a[i].port;
        ect_hostport_format(x->host, x->port, x->key, sizeof x->key);
        x->want_ok = true;
        x->req.op = WIRE_OP_PEERS;
        launch(b, x, now, tail, &b->n.peers_requests);
    }
}

/* q: the reserve fields of r (a reserve_batch item, an ect_put). */
static void reserve_req_of(wire_reserve_req *q, const push_rec *r) {
    ect_strcpy_cut(q->transfer_id, sizeof q->transfer_id, r->transfer_id);
    ect_strcpy_cut(q->mm_hash, sizeof q->mm_hash, r->mm_hash);
    q->tensor.nbytes = r->nbytes;
    q->tensor.ndim = (uint32_t)r->ndim;
    memcpy(q->tensor.shape, r->shape, sizeof q->tensor.shape);
    ect_strcpy_cut(q->tensor.dtype, sizeof q->tensor.dtype, r->dtype);
}

/* The request items of a batch: one per member. */
static bool reserve_items(px *x) {
    wire_reserve_item *items = calloc(x->n, sizeof *items);
    if (!items) return false;
    for (size_t k = 0; k < x->n; k++) {
        reserve_req_of(&items[k].req, x->m[k].rec);
    }
    x->req.op = WIRE_OP_RESERVE_BATCH;
    x->req.u.reserve_batch.n = x->n;
    x->req.u.reserve_batch.items = items;
    return true;
}

static bool complete_items(px *x) {
    wire_complete_req *items = calloc(x->n, sizeof *items);
    if (!items) return false;
    for (size_t k = 0; k < x->n; k++) {
        const push_rec *r = x->m[k].rec;
        ect_strcpy_cut(items[k].transfer_id, sizeof items[k].transfer_id, r->transfer_id);
        ect_strcpy_cut(items[k].reservation_id, sizeof items[k].reservation_id,
                       r->sh[x->m[k].shard].rid);
    }
    x->want_ok = true;
    x->req.op = WIRE_OP_COMPLETE_BATCH;
    x->req.u.complete_batch.n = x->n;
    x->req.u.complete_batch.items = items;
    return true;
}

/* Items from this size on ask for no spare: their copy dwarfs the round
 * trip a put saves, and over shm the put's window (a second range, so the
 * initiator parks and revives a mapping each step) made 4.5 MiB steps
 * slower (docs/BENCHMARKS.md, ninth pass). */
#define PB_SPARE_MAX_ITEM (1u << 20)

/* x is a lone step's reserve: one item, nothing else of this producer live.
 * Only such a step uses (and asks for) a spare: with steps in flight the
 * reserve of the next overlaps this one's write anyway, and a put there,
 * waiting for the spare the previous put brings, measured slower
 * (docs/BENCHMARKS.md, ninth pass). */
static bool lone_step(pbatch *b, const px *x) {
    if (b->no_spares || x->n != 1) return false;
    push_stats st;
    push_get_stats(b->t, &st);
    return st.live == 1;
}

/* Whether a lone item (x's one member) goes out as an ect_put into the
 * spare its shard granted: the spare fits it, its source is staged, and the
 * spare's data plane is one this producer may use. Takes the spare. */
static bool put_fits(pbatch *b, px *x) {
    const push_rec *r = x->m[0].rec;
    if (!lone_step(b, x) || !r->staged || r->stage_held || !r->src.data) return false;
    pb_spare *sp = spare_take(b, x->key);
    if (!sp) return false;
    if (sp->nbytes < r->nbytes || !sp->dst_key ||
        (b->transport[0] && strcmp(b->transport, sp->kind))) {
        spare_free(sp); /* of no use to this item: the next grant replaces it */
        return false;
    }
    x->spare = sp;
    return true;
}

/* Makes x (a lone reserve) an ect_put into x->spare: the write and the
 * request. False out of memory (x stays a reserve). */
static bool put_build(px *x) {
    const push_rec *r = x->m[0].rec;
    const pb_spare *sp = x->spare;
    x->w = calloc(1, sizeof *x->w);
    x->status = calloc(1, sizeof *x->status);
    if (!x->w || !x->status) return false;
    x->w[0] = (ect_write){
        .src = r->src.data, .dst_addr = sp->dst_ptr, .len = r->nbytes, .dst_key = sp->dst_key};
    ect_strcpy_cut(x->xkind, sizeof x->xkind, sp->kind);
    x->session = sp->session;
    reserve_req_of(&x->req.u.put.item, r);
    ect_strcpy_cut(x->req.u.put.spare_id, sizeof x->req.u.put.spare_id, sp->rid);
    x->req.op = WIRE_OP_ECT_PUT;
    x->kind = PX_PUT;
    return true;
}

/* A lone step's reserve asks its shard for a spare of the item's size; so
 * does every put (docs/PROTOCOL.md, "a spare range granted ahead"). An
 * upstream shard ignores the key. */
static uint64_t spare_ask(pbatch *b, const px *x) {
    uint64_t n = x->m[0].rec->nbytes;
    return n < PB_SPARE_MAX_ITEM && lone_step(b, x) ? n : 0;
}

/* RESERVE and COMPLETE: one batch per shard address. */
static void build_batches(pbatch *b, const push_action *a, size_t n, uint64_t now, px ***tail,
                          push_action_kind kind) {
    px_kind xk = kind == PUSH_ACT_RESERVE ? PX_RESERVE : PX_COMPLETE;
    groups gs = {0};
    if (!group_by_shard(a, n, kind, xk, &gs)) {
        fail_groups(b, &gs, now);
        fail_kind(b, a, n, kind, now);
        return;
    }
    for (size_t gi = 0; gi < gs.n; gi++) {
        px *x = gs.g[gi];
        if (xk == PX_RESERVE && put_fits(b, x)) {
            if (!put_build(x)) {
                fail_members(b, x->m, x->n, now);
                px_free(x);
                continue;
            }
            x->req.shm_id = b->shm_id ? b->shm_id : b->spare_id;
            x->req.spare = x->m[0].rec->nbytes;
            launch(b, x, now, tail, &b->n.puts);
            continue;
        }
        if (!(xk == PX_RESERVE ? reserve_items(x) : complete_items(x))) {
            fail_members(b, x->m, x->n, now);
            px_free(x);
            continue;
        }
        if (xk == PX_RESERVE) x->req.shm_id = b->shm_id; /* shm offers (PROTOCOL.md "shm") */
        if (xk == PX_RESERVE) x->req.spare = spare_ask(b, x);
        if (x->req.spare && !x->req.shm_id) x->req.shm_id = b->spare_id; /* names the owner */
        launch(b, x, now, tail, xk == PX_RESERVE ? &b->n.reserve_batches : &b->n.complete_batches);
    }
    free(gs.g);
}

/* REFRESH, GIVE_BACK and ABANDON: a cancel each. An abandon to an address
 * held down is not sent: the shard's TTL ends that reservation. */
static void build_cancels(pbatch *b, const push_action *a, size_t n, uint64_t now, px ***tail) {
    for (size_t i = 0; i < n; i++) {
        if (a[i].kind != PUSH_ACT_REFRESH && a[i].kind != PUSH_ACT_ABANDON &&
            a[i].kind != PUSH_ACT_GIVE_BACK)
            continue;
        px_member m = {a[i].kind, a[i].rec, a[i].shard};
        px *x = px_new(PX_CANCEL, 1);
        if (!x) {
            fail_members(b, &m, 1, now);
            continue;
        }
        const push_rec *r = m.rec;
        x->m[x->n++] = m;
        ect_strcpy_cut(x->host, sizeof x->host, r->host);
        x->port = r->sh[m.shard].port;
        ect_hostport_format(x->host, x->port, x->key, sizeof x->key);
        x->want_ok = true;
        x->req.op = WIRE_OP_CANCEL;
        wire_cancel_req *c = &x->req.u.cancel;
        ect_strcpy_cut(c->transfer_id, sizeof c->transfer_id, r->transfer_id);
        ect_strcpy_cut(c->reservation_id, sizeof c->reservation_id, r->sh[m.shard].rid);
        c->abandon = true;
        c->refresh = m.kind != PUSH_ACT_ABANDON; /* frees at once, no event */
        launch(b, x, now, tail, &b->n.cancels);
    }
}

/* Refuses a write group at once: every member gets `rc`. */
static void refuse_writes(pbatch *b, px *x, int rc, uint64_t now) {
    if (!x->status) x->status = calloc(x->n, sizeof *x->status);
    for (size_t k = 0; x->status && k < x->n; k++) x->status[k] = rc;
    x->rc = rc;
    settle_now(b, x, now);
}

static void build_writes(pbatch *b, const push_action *a, size_t n, uint64_t now, px ***tail) {
    groups gs = {0};
    for (size_t i = 0; i < n; i++) {
        if (a[i].kind != PUSH_ACT_WRITE) continue;
        const push_shard *s = &a[i].rec->sh[a[i].shard];
        px *x = group_find_plane(&gs, s->kind, s->session);
        if (!x) {
            char key[PX_KEY_MAX];
            ect_strcpy_cut(key, sizeof key, s->kind);
            ect_strcat_cut(key, sizeof key, "|");
            ect_strcat_cut(key, sizeof key, s->session);
            if (!(x = group_new(&gs, PX_WRITE, key, n))) {
                fail_groups(b, &gs, now);
                fail_kind(b, a, n, PUSH_ACT_WRITE, now);
                return;
            }
            ect_strcpy_cut(x->xkind, sizeof x->xkind, s->kind);
            x->session = s->session;
        }
        x->m[x->n++] = (px_member){PUSH_ACT_WRITE, a[i].rec, a[i].shard};
    }
    for (size_t gi = 0; gi < gs.n; gi++) {
        px *x = gs.g[gi];
        if (b->transport[0] && strcmp(b->transport, x->xkind)) {
            for (size_t k = 0; k < x->n; k++)
                push_note_cause(x->m[k].rec,
                                "shard %zu offers transport '%s' but this producer requires '%s'",
                                x->m[k].shard, x->xkind, b->transport);
            refuse_writes(b, x, ECT_ENOTSUP, now);
            continue;
        }
        x->w = calloc(x->n, sizeof *x->w);
        x->status = calloc(x->n, sizeof *x->status);
        if (!x->w || !x->status) {
            refuse_writes(b, x, ECT_ENOMEM, now);
            continue;
        }
        bool whole = true;
        for (size_t k = 0; k < x->n; k++) {
            const push_rec *r = x->m[k].rec;
            const push_shard *s = &r->sh[x->m[k].shard];
            x->w[k] = (ect_write){.src = r->src.data,
                                  .dst_addr = s->dst_ptr,
                                  .len = r->nbytes,
                                  .dst_key = s->dst_key};
            whole &= r->src.data != NULL && s->dst_key != NULL;
        }
        if (!whole) { /* no source or no region key: refuse the group */
            refuse_writes(b, x, ECT_EPROTO, now);
            continue;
        }
        b->n.write_batches++;
        **tail = x;
        *tail = &x->next;
    }
    free(gs.g);
}

void pb_build(pbatch *b, const push_action *a, size_t n, uint64_t now, px **out) {
    px **tail = out;
    while (*tail) tail = &(*tail)->next;
    build_peers(b, a, n, now, &tail);
    build_batches(b, a, n, now, &tail, PUSH_ACT_RESERVE);
    build_cancels(b, a, n, now, &tail);
    build_writes(b, a, n, now, &tail);
    build_batches(b, a, n, now, &tail, PUSH_ACT_COMPLETE);
}
