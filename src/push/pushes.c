/*
 * pushes — the producer's push records. See pushes.h for the contract; this
 * file explains the bookkeeping.
 *
 * Each record keeps one small state machine per shard (reserve, write,
 * complete, abandon, each NONE -> SENT -> OK | FAILED) and one for the whole
 * transfer. push_next_actions walks the live records and, for each, hands
 * out what its current state allows and marks it SENT; the *_done calls mark
 * the outcome and, on a failure or a `cancelled` reply, set `ending` (FAILED
 * or CANCELLED). An ending record stops starting new work, waits until no
 * action is in flight, abandons every reservation it still holds, and only
 * then releases the source and reports. Finished records stay one TTL as
 * tombstones in the id table, so a repeated transfer_id is refused (dedup).
 *
 * A record without shards waits for its consumer's discovery: the consumer
 * table holds, per consumer address, either a discovery in flight or the
 * shards it answered. A failed discovery fails the records still waiting
 * (the walk finds them: discovery failures are rare, the live list short).
 *
 * Back-pressure lives in advance() too: a shard's reserve that came back
 * "full" is RS_FULL; once no reserve of the round is in flight the record
 * gives back every reservation it holds (RS_GIVING_BACK, then NONE), sets
 * `retry_at` and waits; at retry_at its NONE shards are reserved again.
 * `waiting_room` marks such a record (from the first refusal until a round
 * gets every shard); the walk collects their consumers so that younger
 * records for the same consumer do not start (the FIFO rule of pushes.h).
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "push/pushes.h"

#define MOD "push"

typedef enum { ST_NONE = 0, ST_SENT, ST_OK, ST_FAILED } step;
/* reserve additionally: cancelled by the consumer, or being refreshed */
enum { RS_CANCELLED = ST_FAILED + 1, RS_REFRESHING, RS_FULL, RS_GIVING_BACK };

#define REC(n) IDT_ENTRY(n, push_rec, node)

/* What discovery knows of a consumer address. */
typedef struct pcons {
    char *consumer;
    char host[PUSH_HOST_MAX + 1];
    int port;
    bool known; /* false: a PEERS is in flight */
    size_t n;
    int ports[PUSH_MAX_SHARDS];
    char transport[PUSH_KIND_MAX + 1];
    UT_hash_handle hh;
} pcons;

struct push_table {
    push_opts o;
    uint64_t now, wake;
    idtab ids;
    pcons *cons;
    bool aborting; /* push_abort_all: end without abandoning */
    push_stats st;
    push_rec *spares; /* finished records with inline ids, for the next ones */
    size_t nspares;
    size_t compact; /* compact tombstones */
};

static const char *const names[] = {"?",    "WAITING_INPUTS", "WRITING",   "NOTIFYING",
                                    "DONE", "CANCEL_PENDING", "CANCELLED", "FAILED"};

const char *push_state_name(push_state s) {
    return (s >= PUSH_WAITING_INPUTS && s <= PUSH_FAILED) ? names[s] : "?";
}

static bool is_final(push_state s) {
    return s == PUSH_DONE || s == PUSH_CANCELLED || s == PUSH_FAILED;
}

void push_opts_init(push_opts *o) {
    memset(o, 0, sizeof *o);
    o->refresh_after_ms = PUSH_DEFAULT_REFRESH_MS;
    o->input_wait_ms = PUSH_DEFAULT_TTL_MS;
    o->ttl_ms = PUSH_DEFAULT_TTL_MS;
    o->max_tombstones = PUSH_DEFAULT_MAX_TOMBSTONES;
    o->push_wait_ms = PUSH_DEFAULT_PUSH_WAIT_MS;
    o->retry_min_ms = PUSH_DEFAULT_RETRY_MIN_MS;
    o->retry_max_ms = PUSH_DEFAULT_RETRY_MAX_MS;
}

static void shard_key_free(push_shard *s) {
    if (s->dst_key != s->key_buf) free(s->dst_key);
    s->dst_key = NULL;
}

/* s->dst_key = a copy of key (NULL: none); a short one in the shard itself.
 * ECT_ENOMEM leaves s as it was. */
static int shard_key_set(push_shard *s, const char *key) {
    size_t len = key ? strlen(key) : 0;
    char *copy = NULL;
    if (key && len > PUSH_KEY_INLINE && !(copy = strdup(key))) return ECT_ENOMEM;
    shard_key_free(s);
    if (copy)
        s->dst_key = copy;
    else if (key)
        s->dst_key = memcpy(s->key_buf, key, len + 1);
    return 0;
}

/* Forgets a shard's reservation (keeps its control port). */
static void shard_reset(push_shard *s) {
    int port = s->port;
    shard_key_free(s);
    memset(s, 0, sizeof *s);
    s->port = port;
}

/* A record's shards and keys go; the record itself stays allocated. */
static void rec_clear(push_rec *r) {
    for (size_t i = 0; r->sh && i < r->n; i++) shard_key_free(&r->sh[i]);
    if (r->sh != &r->sh_one) free(r->sh);
    r->sh = NULL;
}

/* Frees a record (also idt_ops.drop, ctx the table or NULL: a tombstone
 * expired or went over the cap, or close; one a stage still copies into
 * stays, see on_pinned). A full record with inline ids becomes a spare of
 * the table (at most PUSH_SPARES_MAX): the next record needs no allocation
 * and no fresh page. */
static void rec_free(void *ctx, idt_node *n) {
    push_table *t = ctx;
    push_rec *r = REC(n);
    if (r->tomb && t) t->compact--;
    if (!r->tomb) rec_clear(r);
    if (r->tomb || !t || r->transfer_id != r->ids || t->nspares >= PUSH_SPARES_MAX) {
        free(r);
        return;
    }
    r->disc_next = t->spares;
    t->spares = r;
    t->nspares++;
}

static bool on_pinned(void *ctx, const idt_node *n) {
    (void)ctx;
    return REC(n)->staging;
}

int push_open(const push_opts *o, push_table **out) {
    *out = NULL;
    if (!o) return ect_set_error(ECT_EINVAL, "push_opts: NULL");
    if (o->refresh_after_ms == 0)
        return ect_set_error(ECT_EINVAL, "push_opts.refresh_after_ms must be > 0");
    if (o->input_wait_ms == 0)
        return ect_set_error(ECT_EINVAL, "push_opts.input_wait_ms must be > 0");
    if (o->ttl_ms == 0) return ect_set_error(ECT_EINVAL, "push_opts.ttl_ms must be > 0");
    if (o->max_tombstones == 0)
        return ect_set_error(ECT_EINVAL, "push_opts.max_tombstones must be > 0");
    if (o->push_wait_ms == 0)
        return ect_set_error(ECT_EINVAL, "push_opts.push_wait_ms must be > 0");
    if (o->retry_min_ms == 0 || o->retry_max_ms < o->retry_min_ms)
        return ect_set_error(ECT_EINVAL, "push_opts: 0 < retry_min_ms <= retry_max_ms");
    push_table *t = calloc(1, sizeof *t);
    if (!t) return ect_set_error(ECT_ENOMEM, "push table: out of memory");
    t->o = *o;
    idt_init(&t->ids, o->ttl_ms, o->max_tombstones,
             &(idt_ops){.drop = rec_free, .pinned = on_pinned, .ctx = t});
    *out = t;
    return 0;
}

static void cons_free(push_table *t, pcons *c) {
    HASH_DEL(t->cons, c);
    free(c->consumer);
    free(c);
}

void push_close(push_table *t) {
    if (!t) return;
    idt_clear(&t->ids);
    while (t->spares) {
        push_rec *r = t->spares;
        t->spares = r->disc_next;
        free(r);
    }
    pcons *c, *tmp;
    HASH_ITER(hh, t->cons, c, tmp) cons_free(t, c);
    free(t);
}

push_rec *push_find(const push_table *t, const char *id) {
    idt_node *n = idt_find(&t->ids, id);
    return n ? REC(n) : NULL;
}

static pcons *cons_find(const push_table *t, const char *consumer) {
    pcons *c = NULL;
    HASH_FIND_STR(t->cons, consumer, c);
    return c;
}

static int check_str(const char *s, size_t max, const char *field) {
    if (!s || !*s) return ect_set_error(ECT_EINVAL, "%s must be a non-empty string", field);
    if (strlen(s) > max)
        return ect_set_error(ECT_EINVAL, "%s is longer than %zu bytes", field, max);
    return 0;
}

/* Gives r its n shards (control ports, or unknown); one lives in the record. */
static int set_shards(push_rec *r, size_t n, const int *ports) {
    if (n == 1)
        r->sh = &r->sh_one;
    else if (!(r->sh = calloc(n, sizeof *r->sh)))
        return ect_set_error(ECT_ENOMEM, "push: out of memory");
    r->n = n;
    for (size_t i = 0; ports && i < n; i++) r->sh[i].port = ports[i];
    return 0;
}

/* A zeroed record with its transfer_id, consumer and mm_hash: in the record
 * when they fit (a spare of the table if there is one), else in the same
 * allocation after it; or NULL. */
static push_rec *rec_alloc(push_table *t, const push_item *it) {
    size_t lt = strlen(it->transfer_id), lc = strlen(it->consumer), lm = strlen(it->mm_hash);
    size_t ids = lt + lc + lm + 3;
    push_rec *r;
    if (ids <= PUSH_IDS_INLINE && t->spares) {
        r = t->spares;
        t->spares = r->disc_next;
        t->nspares--;
        memset(r, 0, sizeof *r);
    } else if (!(r = calloc(1, sizeof *r + (ids <= PUSH_IDS_INLINE ? 0 : ids)))) {
        return NULL;
    } else {
        t->st.records++;
    }
    r->transfer_id = ids <= PUSH_IDS_INLINE ? r->ids : (char *)(r + 1);
    memcpy(r->transfer_id, it->transfer_id, lt + 1);
    r->consumer = memcpy(r->transfer_id + lt + 1, it->consumer, lc + 1);
    r->mm_hash = memcpy(r->consumer + lc + 1, it->mm_hash, lm + 1);
    return r;
}

int push_add(push_table *t, const push_item *it, uint64_t now_ms, push_rec **out) {
    int rc;
    if (out) *out = NULL;
    if ((rc = check_str(it->transfer_id, PUSH_KEY_MAX, "transfer_id")) ||
        (rc = check_str(it->consumer, PUSH_ADDR_MAX, "consumer")) ||
        (rc = check_str(it->mm_hash, PUSH_KEY_MAX, "mm_hash")))
        return rc;
    if (it->n_shards > PUSH_MAX_SHARDS || (!it->n_shards && (!it->host || !*it->host)))
        return ect_set_error(ECT_EINVAL,
                             "n_shards must be 1..%d (or 0 with the consumer's host and port), "
                             "not %zu",
                             PUSH_MAX_SHARDS, it->n_shards);
    if (it->host && strlen(it->host) > PUSH_HOST_MAX)
        return ect_set_error(ECT_EINVAL, "host is longer than %d bytes", PUSH_HOST_MAX);
    if (it->ndim > WIRE_MAX_NDIM || (it->ndim && !it->shape))
        return ect_set_error(ECT_EINVAL, "shape is missing or has more than %d dimensions",
                             WIRE_MAX_NDIM);
    if ((rc = wire_check_nbytes(it->dtype, it->shape, it->ndim, it->nbytes, "push"))) return rc;
    if (now_ms > t->now) t->now = now_ms;
    push_rec *r = push_find(t, it->transfer_id);
    if (r)
        return ect_set_error(ECT_EEXIST, "transfer_id '%s' already pushed (%s)", it->transfer_id,
                             push_state_name(r->state));
    if (!(r = rec_alloc(t, it)) || (it->n_shards && set_shards(r, it->n_shards, it->ports))) {
        if (r) rec_free(t, &r->node);
        return ect_set_error(ECT_ENOMEM, "push: out of memory");
    }
    ect_strcpy_cut(r->host, sizeof r->host, it->host ? it->host : "");
    r->port = it->port;
    r->nbytes = it->nbytes;
    r->ndim = it->ndim;
    if (it->ndim) memcpy(r->shape, it->shape, it->ndim * sizeof *it->shape);
    ect_strcpy_cut(r->dtype, sizeof r->dtype, wire_dtype_canonical(it->dtype));
    r->state = PUSH_WAITING_INPUTS;
    r->status = ECT_EIO;
    r->created = t->now;
    r->t0_ns = it->t0_ns;
    r->held = it->held;
    if (it->src) {
        r->src = *it->src;
        r->staged = true;
    }
    r->node.id = r->transfer_id;
    if (idt_add(&t->ids, &r->node, IDT_LIVE, 0)) {
        rec_free(t, &r->node);
        return ect_set_error(ECT_ENOMEM, "push: out of memory");
    }
    if (out) *out = r;
    return 0;
}

size_t push_flush(push_table *t) {
    size_t n = 0;
    for (idt_node *nd = idt_first(&t->ids, IDT_LIVE); nd; nd = nd->next) {
        push_rec *r = REC(nd);
        n += r->held;
        r->held = false;
        r->stage_held = false;
    }
    return n;
}

static void fail_code(push_rec *r, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void fail_code(push_rec *r, int status, const char *fmt, ...) {
    if (r->ending) return; /* the first cause is the one reported */
    r->ending = PUSH_FAILED;
    r->status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->error, sizeof r->error, fmt, ap);
    va_end(ap);
    ECT_LOGW_ID(MOD, r->transfer_id, r->mm_hash, "transfer_id=%s failed: %s", r->transfer_id,
                r->error);
}

#define fail(r, ...) fail_code(r, ECT_EIO, __VA_ARGS__)

static void cancel_rec(push_rec *r, const char *why) {
    if (r->ending) return;
    r->ending = PUSH_CANCELLED;
    r->state = PUSH_CANCEL_PENDING;
    ect_strcpy_cut(r->error, sizeof r->error, why);
}

void push_note_cause(push_rec *r, const char *fmt, ...) {
    if (r->cause[0]) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->cause, sizeof r->cause, fmt, ap);
    va_end(ap);
}

/* ECT_ESTATE unless r waits for its source. */
static int wants_source(const push_rec *r, const char *transfer_id) {
    if (is_final(r->state))
        return ect_set_error(ECT_ESTATE, "transfer_id '%s' is finished", transfer_id);
    if (r->state != PUSH_WAITING_INPUTS || r->ending || r->staged || r->staging)
        return ect_set_error(ECT_ESTATE,
                             "push of transfer_id '%s' does not wait for its source (%s%s)",
                             transfer_id, push_state_name(r->state),
                             r->ending                 ? ", ending"
                             : r->staged || r->staging ? ", already staged"
                                                       : "");
    return 0;
}

static void stage(push_rec *r, const push_source *src) {
    if (src) r->src = *src;
    r->staged = true;
    r->stage_held = !r->held; /* a flushed record uses it from the next flush */
}

int push_source_ready(push_table *t, const char *transfer_id, const push_source *src,
                      uint64_t now_ms) {
    push_rec *r = push_find(t, transfer_id);
    if (!r) return ect_set_error(ECT_ENOTFOUND, "no push for transfer_id '%s'", transfer_id);
    if (now_ms > t->now) t->now = now_ms;
    int rc = wants_source(r, transfer_id);
    if (rc) return rc;
    stage(r, src);
    r->stage_held = false; /* no step boundary here: the table's own callers */
    return 0;
}

int push_stage_begin(push_table *t, const char *transfer_id, uint64_t nbytes) {
    push_rec *r = push_find(t, transfer_id);
    if (!r) return ect_set_error(ECT_ENOTFOUND, "no push for transfer_id '%s'", transfer_id);
    int rc = wants_source(r, transfer_id);
    if (rc) return rc;
    if (nbytes != r->nbytes)
        return ect_set_error(ECT_EINVAL, "nbytes %" PRIu64 " differs from the item's %" PRIu64,
                             nbytes, r->nbytes);
    r->staging = true;
    return 0;
}

int push_stage_end(push_table *t, const char *transfer_id, const push_source *src,
                   uint64_t now_ms) {
    push_rec *r = push_find(t, transfer_id);
    if (!r || !r->staging)
        return ect_set_error(ECT_ESTATE, "no stage of '%s' in progress", transfer_id);
    if (now_ms > t->now) t->now = now_ms;
    r->staging = false;
    if (!src) return 0;
    if (is_final(r->state) || r->ending)
        return ect_set_error(ECT_ESTATE, "transfer_id '%s' finished while staging", transfer_id);
    stage(r, src);
    return 0;
}

/* ---- action generation */

#define MAX_CONGESTED 64

typedef struct out_buf {
    push_action *a;
    size_t n, max;
    /* consumers with a record waiting for room, seen so far in this walk;
     * beyond MAX_CONGESTED consumers the FIFO rule is not applied to more */
    const char *congested[MAX_CONGESTED];
    size_t ncong;
} out_buf;

static bool is_congested(const out_buf *o, const char *consumer) {
    for (size_t i = 0; i < o->ncong; i++)
        if (strcmp(o->congested[i], consumer) == 0) return true;
    return false;
}

static void mark_congested(out_buf *o, const char *consumer) {
    if (!is_congested(o, consumer) && o->ncong < MAX_CONGESTED) o->congested[o->ncong++] = consumer;
}

static void note_wake(push_table *t, uint64_t at) {
    if (!t->wake || at < t->wake) t->wake = at;
}

static push_action *emit(out_buf *o, push_rec *r, push_action_kind k, size_t shard) {
    if (o->n >= o->max) return NULL;
    push_action *a = &o->a[o->n++];
    a->kind = k;
    a->rec = r;
    a->shard = shard;
    return a;
}

static bool in_flight(const push_rec *r) {
    for (size_t i = 0; i < r->n; i++) {
        const push_shard *s = &r->sh[i];
        if (s->rsv == ST_SENT || s->rsv == RS_REFRESHING || s->rsv == RS_GIVING_BACK ||
            s->write == ST_SENT || s->complete == ST_SENT || s->abandon == ST_SENT)
            return true;
    }
    return false;
}

static void shard_counts(const push_rec *r, uint16_t *reserved, uint16_t *written,
                         uint16_t *completed) {
    if (r->tomb) {
        *reserved = r->reserved, *written = r->written, *completed = r->completed;
        return;
    }
    *reserved = *written = *completed = 0;
    for (size_t i = 0; i < r->n; i++) {
        *reserved += r->sh[i].rsv == ST_OK;
        *written += r->sh[i].write == ST_OK;
        *completed += r->sh[i].complete == ST_OK;
    }
}

/* r's head and ids in an allocation of their own, in r's place in the table;
 * r is freed or kept as a spare. Without memory r stays whole. */
static void compact(push_table *t, push_rec *r) {
    size_t le = strlen(r->error), lt = strlen(r->transfer_id), lc = strlen(r->consumer),
           lm = strlen(r->mm_hash);
    push_rec *c = malloc(PUSH_REC_HEAD + le + 1 + lt + lc + lm + 3);
    if (!c) return;
    memcpy(c, r, PUSH_REC_HEAD + le + 1);
    shard_counts(r, &c->reserved, &c->written, &c->completed);
    c->tomb = true;
    c->transfer_id = memcpy(c->error + le + 1, r->transfer_id, lt + 1);
    c->consumer = memcpy(c->transfer_id + lt + 1, r->consumer, lc + 1);
    c->mm_hash = memcpy(c->consumer + lc + 1, r->mm_hash, lm + 1);
    c->node.id = c->transfer_id;
    idt_replace(&t->ids, &r->node, &c->node);
    t->compact++;
    rec_free(t, &r->node);
}

static void entomb(push_table *t, push_rec *r, push_state s) {
    r->state = s;
    if (s == PUSH_DONE) t->st.done++;
    if (s == PUSH_FAILED) t->st.failed++;
    if (s == PUSH_CANCELLED) t->st.cancelled++;
    idt_move(&t->ids, &r->node, IDT_TOMBS, t->now);
    compact(t, r);
}

/* A local action: what it needs travels with it (the record may go). */
static push_action *emit_final(out_buf *o, push_rec *r, push_action_kind k) {
    push_action *a = emit(o, r, k, SIZE_MAX);
    if (!a) return NULL;
    a->rec = NULL;
    push_final *f = &a->fin;
    ect_strcpy_cut(f->transfer_id, sizeof f->transfer_id, r->transfer_id);
    f->src = r->src;
    f->nbytes = r->nbytes;
    return a;
}

/* Releases the source, then reports; each needs one slot of `o`, and a
 * record whose report did not fit finishes on the next call. */
static bool finish(push_table *t, push_rec *r, out_buf *o, push_state s) {
    r->finishing = true;
    if (r->staged && !r->released) {
        if (!emit_final(o, r, PUSH_ACT_RELEASE_SOURCE)) return false;
        r->released = true;
    }
    push_action *a = emit_final(o, r, PUSH_ACT_FINISHED);
    if (!a) return false;
    push_final *f = &a->fin;
    f->state = s;
    f->status = s == PUSH_DONE ? 0 : s == PUSH_CANCELLED ? ECT_ECANCELED : r->status;
    ect_strcpy_cut(f->error, sizeof f->error,
                   s == PUSH_DONE ? ""
                   : r->cause[0] && (f->status == ECT_EIO || f->status == ECT_ECANCELED)
                       ? r->cause
                       : r->error);
    f->retries = r->retries;
    f->n_shards = r->n;
    memcpy(f->transport, r->used_kind, sizeof f->transport);
    f->t0_ns = r->t0_ns;
    entomb(t, r, s);
    return true;
}

/* A record without shards: its consumer's discovery. Returns 1 to wait, 0
 * once it has its shards, -1 when `o` is out of room. */
static int discover(push_table *t, push_rec *r, out_buf *o) {
    pcons *c = cons_find(t, r->consumer);
    if (c && !c->known) return 1;
    if (c) {
        if (!set_shards(r, c->n, c->ports)) return 0;
        fail_code(r, ECT_ENOMEM, "out of memory");
        return 1;
    }
    if (o->n >= o->max) return -1;
    if (!(c = calloc(1, sizeof *c)) || !(c->consumer = strdup(r->consumer))) {
        free(c);
        fail_code(r, ECT_ENOMEM, "out of memory starting the discovery");
        return 1;
    }
    ect_strcpy_cut(c->host, sizeof c->host, r->host);
    c->port = r->port;
    HASH_ADD_KEYPTR(hh, t->cons, c->consumer, strlen(c->consumer), c);
    push_action *a = emit(o, NULL, PUSH_ACT_PEERS, SIZE_MAX);
    a->consumer = c->consumer;
    a->host = c->host;
    a->port = c->port;
    return 1;
}

/* The back-pressure step of a record waiting for room (see the top of the
 * file). Returns 1 to wait, 0 to go on and reserve, -1 when `o` is out of
 * room. May fail the record (its deadline passed). */
static int back_pressure(push_table *t, push_rec *r, out_buf *o) {
    uint64_t now = t->now;
    bool full = false;
    for (size_t i = 0; i < r->n; i++) {
        int st = r->sh[i].rsv;
        if (st == ST_SENT || st == RS_GIVING_BACK) return 1; /* the round settles first */
        full |= st == RS_FULL;
    }
    if (full) {
        bool any = false;
        for (size_t i = 0; i < r->n; i++) {
            push_shard *s = &r->sh[i];
            if (s->rsv != ST_OK) continue;
            if (!emit(o, r, PUSH_ACT_GIVE_BACK, i)) return -1;
            s->rsv = RS_GIVING_BACK;
            t->st.give_backs++;
            any = true;
        }
        if (any) return 1;
        for (size_t i = 0; i < r->n; i++)
            if (r->sh[i].rsv == RS_FULL) shard_reset(&r->sh[i]);
        r->retries++;
        r->backoff = r->backoff ? r->backoff * 2 : t->o.retry_min_ms;
        if (r->backoff > t->o.retry_max_ms) r->backoff = t->o.retry_max_ms;
        r->retry_at = now + r->backoff;
    }
    if (!r->retry_at) return 0;
    if (now - r->created >= t->o.push_wait_ms) {
        fail(r,
             "the consumer's pool stayed full for %" PRIu64
             " ms (push_wait_ms; %u reserve round(s) refused); last: %s",
             now - r->created, r->retries, r->full_error);
        return 1;
    }
    if (now < r->retry_at) {
        note_wake(t, r->retry_at);
        return 1;
    }
    r->retry_at = 0;
    t->st.retries++;
    return 0;
}

/* Hands out what r may do now. Returns false when `o` ran out of room. */
static bool advance(push_table *t, push_rec *r, out_buf *o) {
    uint64_t now = t->now;
    bool staged = r->staged && !r->stage_held;
    if (!r->ending && r->state == PUSH_WAITING_INPUTS && !staged &&
        now - r->created >= t->o.input_wait_ms)
        fail(r, "the encoder output was not saved within %" PRIu64 " ms", t->o.input_wait_ms);
    if (r->ending) {
        if (in_flight(r)) return true;
        bool any = false;
        for (size_t i = 0; i < r->n && !t->aborting; i++) {
            push_shard *s = &r->sh[i];
            if (s->rsv != ST_OK || s->abandon != ST_NONE) continue;
            if (!emit(o, r, PUSH_ACT_ABANDON, i)) return false;
            s->abandon = ST_SENT;
            any = true;
        }
        return any ? true : finish(t, r, o, r->ending);
    }
    if (!r->n) {
        int w = discover(t, r, o);
        if (w < 0) return false;
        if (w > 0) return r->ending ? advance(t, r, o) : true;
    }
    if (r->state == PUSH_WAITING_INPUTS && r->waiting_room) {
        int w = back_pressure(t, r, o);
        if (w < 0) return false;
        if (w > 0 && r->ending) return advance(t, r, o);
        if (w > 0) {
            mark_congested(o, r->consumer);
            return true;
        }
    } else if (r->state == PUSH_WAITING_INPUTS && is_congested(o, r->consumer)) {
        bool started = false;
        for (size_t i = 0; i < r->n; i++) started |= r->sh[i].rsv != ST_NONE;
        if (!started) { /* FIFO: older records of this consumer wait for room first */
            if (now - r->created < t->o.push_wait_ms) return true;
            fail(r,
                 "waited %" PRIu64 " ms (push_wait_ms) behind earlier items for room in the "
                 "consumer's pool, which stayed full",
                 now - r->created);
            return advance(t, r, o);
        }
    }
    bool all_reserved = true, wait = false;
    switch (r->state) {
    case PUSH_WAITING_INPUTS:
        for (size_t i = 0; i < r->n; i++) {
            push_shard *s = &r->sh[i];
            if (s->rsv == ST_NONE) {
                if (!emit(o, r, PUSH_ACT_RESERVE, i)) return false;
                s->rsv = ST_SENT;
            }
            all_reserved &= s->rsv == ST_OK;
        }
        if (all_reserved) { /* room on every shard: the wait is over */
            r->waiting_room = false;
            r->backoff = 0;
        } else if (r->waiting_room) { /* a retry round in flight */
            mark_congested(o, r->consumer);
        }
        if (!all_reserved || !staged) return true;
        /* A reservation older than the refresh age may expire under the
         * write: give it back and reserve anew first. */
        for (size_t i = 0; i < r->n; i++) {
            push_shard *s = &r->sh[i];
            if (!s->write_needed || now - s->reserved_at < t->o.refresh_after_ms) continue;
            if (!emit(o, r, PUSH_ACT_REFRESH, i)) return false;
            s->rsv = RS_REFRESHING;
            t->st.refreshes++;
            wait = true;
        }
        if (wait) return true;
        r->state = PUSH_WRITING;
        /* fall through */
    case PUSH_WRITING:
        for (size_t i = 0; i < r->n; i++) {
            push_shard *s = &r->sh[i];
            if (!s->write_needed) continue;
            if (s->write == ST_NONE) {
                if (!emit(o, r, PUSH_ACT_WRITE, i)) return false;
                s->write = ST_SENT;
            }
            wait |= s->write != ST_OK;
        }
        if (wait) return true;
        r->state = PUSH_NOTIFYING;
        /* fall through */
    case PUSH_NOTIFYING:
        for (size_t i = 0; i < r->n; i++) {
            push_shard *s = &r->sh[i];
            if (!s->write_needed) continue;
            if (s->complete == ST_NONE) {
                if (!emit(o, r, PUSH_ACT_COMPLETE, i)) return false;
                s->complete = ST_SENT;
            }
            wait |= s->complete != ST_OK;
        }
        return wait ? true : finish(t, r, o, PUSH_DONE);
    default: return true;
    }
}

size_t push_next_actions(push_table *t, uint64_t now_ms, push_action *out, size_t max) {
    if (now_ms > t->now) t->now = now_ms;
    idt_expire(&t->ids, t->now);
    t->wake = 0;
    out_buf o = {.a = out, .max = max};
    for (idt_node *n = idt_first(&t->ids, IDT_LIVE), *next; n; n = next) {
        next = n->next; /* advance may entomb it */
        push_rec *r = REC(n);
        if (r->held) continue;
        if (!advance(t, r, &o)) break;
    }
    return o.n;
}

uint64_t push_next_wake(const push_table *t) { return t->wake; }

int push_cancel(push_table *t, const char *transfer_id, uint64_t now_ms, push_action *out,
                size_t *n) {
    if (n) *n = 0;
    push_rec *r = push_find(t, transfer_id);
    if (!r) return ect_set_error(ECT_ENOTFOUND, "no push for transfer_id '%s'", transfer_id);
    if (now_ms > t->now) t->now = now_ms;
    if (r->state == PUSH_CANCELLED || r->state == PUSH_CANCEL_PENDING || r->ending) return 0;
    if (is_final(r->state))
        return ect_set_error(ECT_ESTATE, "push of transfer_id '%s' is already %s", transfer_id,
                             push_state_name(r->state));
    if (!r->held) {
        cancel_rec(r, "cancelled by the engine");
        return 0;
    }
    /* nothing went out: it ends here */
    cancel_rec(r, "cancelled before it was sent");
    r->held = false;
    if (!out) return 0;
    out_buf o = {.a = out, .max = 2};
    bool ended = finish(t, r, &o, PUSH_CANCELLED);
    (void)ended; /* two slots always fit a record with nothing in flight */
    *n = o.n;
    return 0;
}

void push_abort_all(push_table *t, const char *why) {
    t->aborting = true;
    for (idt_node *n = idt_first(&t->ids, IDT_LIVE); n; n = n->next) {
        push_rec *r = REC(n);
        r->held = false;
        r->ending = 0; /* closing overrides any cause */
        fail_code(r, ECT_ECLOSED, "%s", why);
        r->cause[0] = '\0';
        for (size_t i = 0; i < r->n; i++) { /* what was in flight settles as failed */
            push_shard *s = &r->sh[i];
            if (s->rsv == ST_SENT || s->rsv == RS_REFRESHING || s->rsv == RS_GIVING_BACK)
                s->rsv = ST_FAILED;
            if (s->write == ST_SENT) s->write = ST_FAILED;
            if (s->complete == ST_SENT) s->complete = ST_FAILED;
            if (s->abandon == ST_SENT) s->abandon = ST_FAILED;
        }
    }
}

/* ---- outcomes */

int push_peers_done(push_table *t, const char *consumer, int rc, const char *why, const int *ports,
                    size_t n, const char *transport) {
    pcons *c = cons_find(t, consumer);
    if (!c || c->known)
        return ect_set_error(ECT_ESTATE, "no discovery in flight for consumer '%s'", consumer);
    if (!rc && (n < 1 || n > PUSH_MAX_SHARDS)) {
        rc = ECT_EPROTO;
        why = "peers: the consumer reported no shards";
    }
    if (rc) {
        for (idt_node *nd = idt_first(&t->ids, IDT_LIVE); nd; nd = nd->next) {
            push_rec *r = REC(nd);
            if (!r->n && !strcmp(r->consumer, consumer))
                fail_code(r, rc, "%s", why ? why : ect_strerror(rc));
        }
        cons_free(t, c);
        return 0;
    }
    c->known = true;
    c->n = n;
    memcpy(c->ports, ports, n * sizeof *ports);
    ect_strcpy_cut(c->transport, sizeof c->transport, transport ? transport : "");
    return 0;
}

void push_forget_consumer(push_table *t, const char *consumer) {
    pcons *c = cons_find(t, consumer);
    if (c && c->known) cons_free(t, c);
}

static int shard_of(push_rec *r, size_t shard) {
    if (shard >= r->n)
        return ect_set_error(ECT_ESTATE, "transfer_id '%s' has no shard %zu", r->transfer_id,
                             shard);
    return 0;
}

static int stray(const char *what, const push_rec *r, size_t shard) {
    return ect_set_error(ECT_ESTATE, "no %s in flight for transfer_id '%s' on shard %zu", what,
                         r->transfer_id, shard);
}

int push_reserve_done(push_table *t, push_rec *r, size_t shard, const push_reservation *res,
                      const char *error, uint64_t now_ms) {
    int rc = shard_of(r, shard);
    if (rc) return rc;
    push_shard *s = &r->sh[shard];
    if (s->rsv != ST_SENT) return stray("reserve", r, shard);
    if (now_ms > t->now) t->now = now_ms;
    if (!res) {
        s->rsv = ST_FAILED;
        fail(r, "reserve on shard %zu failed: %.130s", shard, error ? error : "no reply");
        return 0;
    }
    if (res->cancelled) {
        s->rsv = RS_CANCELLED;
        cancel_rec(r, "the consumer cancelled the transfer");
        return 0;
    }
    if (!res->reservation_id || strlen(res->reservation_id) > ECT_ID_LEN ||
        (res->write &&
         (!res->dst_session || !*res->dst_session || strlen(res->dst_session) > PUSH_ADDR_MAX))) {
        s->rsv = ST_FAILED;
        fail(r, "reserve on shard %zu: malformed reply", shard);
        return 0;
    }
    if (shard_key_set(s, res->dst_key)) {
        s->rsv = ST_FAILED;
        fail_code(r, ECT_ENOMEM, "reserve on shard %zu: out of memory", shard);
        return 0;
    }
    s->rsv = ST_OK;
    ect_strcpy_cut(s->rid, sizeof s->rid, res->reservation_id);
    ect_strcpy_cut(s->session, sizeof s->session, res->dst_session ? res->dst_session : "");
    s->dst_ptr = res->dst_ptr;
    ect_strcpy_cut(s->kind, sizeof s->kind,
                   res->transport && *res->transport ? res->transport : "tcp");
    s->write_needed = res->write;
    s->reserved_at = t->now;
    return 0;
}

int push_put_done(push_table *t, push_rec *r, size_t shard, const push_reservation *res,
                  bool completed, uint64_t now_ms) {
    int rc = push_reserve_done(t, r, shard, res, NULL, now_ms);
    if (rc) return rc;
    push_shard *s = &r->sh[shard];
    if (s->rsv != ST_OK) return 0; /* refused as malformed: the record failed */
    s->write = ST_OK;
    if (!r->used_kind[0]) memcpy(r->used_kind, s->kind, sizeof r->used_kind);
    s->complete = completed ? ST_OK : ST_FAILED;
    if (!completed)
        fail(r, "shard %zu did not accept the completion (reservation cancelled or expired)",
             shard);
    return 0;
}

int push_reserve_undo(push_table *t, push_rec *r, size_t shard) {
    (void)t;
    int rc = shard_of(r, shard);
    if (rc) return rc;
    push_shard *s = &r->sh[shard];
    if (s->rsv != ST_SENT) return stray("reserve", r, shard);
    s->rsv = ST_NONE;
    return 0;
}

int push_reserve_full(push_table *t, push_rec *r, size_t shard, const char *error,
                      uint64_t now_ms) {
    int rc = shard_of(r, shard);
    if (rc) return rc;
    push_shard *s = &r->sh[shard];
    if (s->rsv != ST_SENT) return stray("reserve", r, shard);
    if (now_ms > t->now) t->now = now_ms;
    s->rsv = RS_FULL;
    r->waiting_room = true;
    t->st.full_refusals++;
    snprintf(r->full_error, sizeof r->full_error, "shard %zu: %.100s", shard,
             error ? error : "EC consumer buffer pool is full");
    return 0;
}

int push_refresh_done(push_table *t, push_rec *r, size_t shard, bool ok) {
    (void)t;
    int rc = shard_of(r, shard);
    if (rc) return rc;
    push_shard *s = &r->sh[shard];
    if (s->rsv != RS_REFRESHING && s->rsv != RS_GIVING_BACK) return stray("refresh", r, shard);
    if (!ok) { /* the old reservation may live on: abandon it on the way out */
        bool give_back = s->rsv == RS_GIVING_BACK;
        s->rsv = ST_OK;
        fail(r, "%s the reservation on shard %zu failed",
             give_back ? "giving back (another shard was full)" : "refreshing", shard);
        return 0;
    }
    shard_reset(s); /* reserve again from scratch */
    return 0;
}

int push_write_done(push_table *t, push_rec *r, size_t shard, bool ok) {
    (void)t;
    int rc = shard_of(r, shard);
    if (rc) return rc;
    push_shard *s = &r->sh[shard];
    if (s->write != ST_SENT) return stray("write", r, shard);
    s->write = ok ? ST_OK : ST_FAILED;
    if (ok && !r->used_kind[0]) memcpy(r->used_kind, s->kind, sizeof r->used_kind);
    if (!ok) fail(r, "writing to %.64s (shard %zu) failed", s->session, shard);
    return 0;
}

int push_complete_done(push_table *t, push_rec *r, size_t shard, bool ok, bool completed) {
    (void)t;
    int rc = shard_of(r, shard);
    if (rc) return rc;
    push_shard *s = &r->sh[shard];
    if (s->complete != ST_SENT) return stray("complete", r, shard);
    s->complete = ok && completed ? ST_OK : ST_FAILED;
    if (!ok)
        fail(r, "complete on shard %zu failed", shard);
    else if (!completed)
        fail(r, "shard %zu did not accept the completion (reservation cancelled or expired)",
             shard);
    return 0;
}

int push_abandon_done(push_table *t, push_rec *r, size_t shard, bool ok) {
    (void)t;
    int rc = shard_of(r, shard);
    if (rc) return rc;
    push_shard *s = &r->sh[shard];
    if (s->abandon != ST_SENT) return stray("abandon", r, shard);
    s->abandon = ok ? ST_OK : ST_FAILED;
    if (!ok)
        ECT_LOGW_ID(MOD, r->transfer_id, NULL,
                    "abandoning transfer_id=%s on shard %zu failed; its TTL will end it",
                    r->transfer_id, shard);
    return 0;
}

int push_get(const push_table *t, const char *transfer_id, push_info *info) {
    const push_rec *r = push_find(t, transfer_id);
    if (!r) return ect_set_error(ECT_ENOTFOUND, "no push for transfer_id '%s'", transfer_id);
    memset(info, 0, sizeof *info);
    info->state = r->state;
    info->source_staged = r->staged;
    info->n_shards = r->n;
    info->retries = r->retries;
    info->waiting_room = r->waiting_room;
    uint16_t rs, wr, co;
    shard_counts(r, &rs, &wr, &co);
    info->reserved = rs;
    info->written = wr;
    info->completed = co;
    ect_strcpy_cut(info->error, sizeof info->error, r->error);
    return 0;
}

void push_get_stats(const push_table *t, push_stats *st) {
    *st = t->st;
    st->live = idt_live(&t->ids);
    st->tombstones = idt_count(&t->ids, IDT_TOMBS);
    st->tombstones_dropped = t->ids.dropped;
    st->spares = t->nspares;
    st->compact = t->compact;
}

int push_check(const push_table *t) {
    int rc = idt_check(&t->ids);
    if (rc) return rc;
    for (int l = IDT_TOMBS; l < IDT_LISTS; l++)
        for (const idt_node *n = idt_first(&t->ids, l); n; n = n->next) {
            const push_rec *r = REC(n);
            if (is_final(r->state) != (l == IDT_TOMBS))
                return ect_set_error(ECT_ESTATE, "%s is %s on the wrong list", r->transfer_id,
                                     push_state_name(r->state));
            if (is_final(r->state)) {
                if (!r->tomb && in_flight(r))
                    return ect_set_error(ECT_ESTATE, "%s ended with actions in flight",
                                         r->transfer_id);
                if (r->staged != r->released)
                    return ect_set_error(ECT_ESTATE, "%s ended without releasing its source",
                                         r->transfer_id);
                continue;
            }
            if (r->released && !r->finishing)
                return ect_set_error(ECT_ESTATE, "%s released its source while live",
                                     r->transfer_id);
            if (r->held && r->n && r->sh[0].rsv != ST_NONE)
                return ect_set_error(ECT_ESTATE, "%s went out while held", r->transfer_id);
            for (size_t i = 0; i < r->n; i++) {
                const push_shard *s = &r->sh[i];
                bool past_reserve = r->state == PUSH_WRITING || r->state == PUSH_NOTIFYING;
                if (past_reserve && !r->ending && (s->rsv != ST_OK || !r->staged))
                    return ect_set_error(ECT_ESTATE, "%s is %s before every shard reserved",
                                         r->transfer_id, push_state_name(r->state));
                if ((s->write != ST_NONE || s->complete != ST_NONE) && !s->write_needed)
                    return ect_set_error(ECT_ESTATE, "%s wrote to shard %zu that needs no write",
                                         r->transfer_id, i);
                if (s->complete != ST_NONE && s->write != ST_OK)
                    return ect_set_error(ECT_ESTATE,
                                         "%s completed shard %zu before its write landed",
                                         r->transfer_id, i);
                if (s->abandon != ST_NONE && !r->ending)
                    return ect_set_error(ECT_ESTATE, "%s abandoned shard %zu while going on",
                                         r->transfer_id, i);
            }
        }
    if (idt_count(&t->ids, IDT_TOMBS) > t->o.max_tombstones)
        return ect_set_error(ECT_ESTATE, "push tombstone cap exceeded");
    return 0;
}
