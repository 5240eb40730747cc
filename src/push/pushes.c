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
 * tombstones, so a repeated transfer_id is refused (dedup).
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

#include "util/idtab.h"

#include "push/pushes.h"

#define MOD "push"

typedef enum { ST_NONE = 0, ST_SENT, ST_OK, ST_FAILED } step;
/* reserve additionally: cancelled by the consumer, or being refreshed */
enum { RS_CANCELLED = ST_FAILED + 1, RS_REFRESHING, RS_FULL, RS_GIVING_BACK };

typedef struct shard_st {
    int rsv;
    step write, complete, abandon;
    bool write_needed; /* the shard answered write: true */
    char rid[ECT_ID_LEN + 1];
    char session[PUSH_ADDR_MAX + 1];
    uint64_t dst_ptr, dst_key, reserved_at;
} shard_st;

typedef struct prec {
    char *transfer_id, *consumer, *mm_hash;
    uint64_t nbytes;
    uint64_t shape[WIRE_MAX_NDIM];
    size_t ndim;
    char dtype[PUSH_DTYPE_MAX + 1];
    size_t n;
    shard_st *sh;
    push_state state, ending; /* ending: 0, PUSH_FAILED or PUSH_CANCELLED */
    bool staged, released, finishing;
    uint64_t created;
    char error[160];
    /* back-pressure */
    bool waiting_room;    /* a shard refused as full; not yet every shard reserved */
    uint64_t retry_at;    /* reserve again at this time (0: not backing off) */
    uint64_t backoff;     /* the last backoff (ms) */
    unsigned retries;     /* rounds refused as full */
    char full_error[120]; /* the latest refusal, for the failure text */
    idt_node node;        /* by transfer_id; live records, then tombstones (dedup) */
} prec;

#define PREC(n) IDT_ENTRY(n, prec, node)

struct push_table {
    push_opts o;
    uint64_t now, wake;
    idtab ids;
    push_stats st;
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

static void rec_free(prec *r) {
    free(r->transfer_id);
    free(r->consumer);
    free(r->mm_hash);
    free(r->sh);
    free(r);
}

/* idt_ops.drop: a tombstone expired or went over the cap (or close). */
static void on_drop(void *ctx, idt_node *n) {
    (void)ctx;
    rec_free(PREC(n));
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
    idt_init(&t->ids, o->ttl_ms, o->max_tombstones, &(idt_ops){.drop = on_drop});
    *out = t;
    return 0;
}

void push_close(push_table *t) {
    if (!t) return;
    idt_clear(&t->ids);
    free(t);
}

static prec *find(const push_table *t, const char *id) {
    idt_node *n = idt_find(&t->ids, id);
    return n ? PREC(n) : NULL;
}

static int check_str(const char *s, size_t max, const char *field) {
    if (!s || !*s) return ect_set_error(ECT_EINVAL, "%s must be a non-empty string", field);
    if (strlen(s) > max)
        return ect_set_error(ECT_EINVAL, "%s is longer than %zu bytes", field, max);
    return 0;
}

int push_add(push_table *t, const push_item *it, uint64_t now_ms) {
    int rc;
    if ((rc = check_str(it->transfer_id, PUSH_KEY_MAX, "transfer_id")) ||
        (rc = check_str(it->consumer, PUSH_ADDR_MAX, "consumer")) ||
        (rc = check_str(it->mm_hash, PUSH_KEY_MAX, "mm_hash")))
        return rc;
    if (it->n_shards < 1 || it->n_shards > PUSH_MAX_SHARDS)
        return ect_set_error(ECT_EINVAL, "n_shards must be 1..%d, not %zu", PUSH_MAX_SHARDS,
                             it->n_shards);
    if (it->ndim && !it->shape) return ect_set_error(ECT_EINVAL, "shape is missing");
    if ((rc = wire_check_nbytes(it->dtype, it->shape, it->ndim, it->nbytes, "push"))) return rc;
    if (now_ms > t->now) t->now = now_ms;
    prec *r = find(t, it->transfer_id);
    if (r)
        return ect_set_error(ECT_EEXIST, "transfer_id '%s' already pushed (%s)", it->transfer_id,
                             push_state_name(r->state));
    if (!(r = calloc(1, sizeof *r)) || !(r->transfer_id = strdup(it->transfer_id)) ||
        !(r->consumer = strdup(it->consumer)) || !(r->mm_hash = strdup(it->mm_hash)) ||
        !(r->sh = calloc(it->n_shards, sizeof *r->sh))) {
        if (r) rec_free(r);
        return ect_set_error(ECT_ENOMEM, "push: out of memory");
    }
    r->nbytes = it->nbytes;
    r->ndim = it->ndim;
    if (it->ndim) memcpy(r->shape, it->shape, it->ndim * sizeof *it->shape);
    snprintf(r->dtype, sizeof r->dtype, "%s", wire_dtype_canonical(it->dtype));
    r->n = it->n_shards;
    r->state = PUSH_WAITING_INPUTS;
    r->created = t->now;
    r->node.id = r->transfer_id;
    if (idt_add(&t->ids, &r->node, IDT_LIVE, 0)) {
        rec_free(r);
        return ect_set_error(ECT_ENOMEM, "push: out of memory");
    }
    return 0;
}

static void fail(prec *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(prec *r, const char *fmt, ...) {
    if (r->ending) return; /* the first cause is the one reported */
    r->ending = PUSH_FAILED;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->error, sizeof r->error, fmt, ap);
    va_end(ap);
    ECT_LOGW(MOD, "transfer_id=%s failed: %s", r->transfer_id, r->error);
}

static void cancel_rec(prec *r, const char *why) {
    if (r->ending) return;
    r->ending = PUSH_CANCELLED;
    r->state = PUSH_CANCEL_PENDING;
    snprintf(r->error, sizeof r->error, "%s", why);
}

int push_source_ready(push_table *t, const char *transfer_id, uint64_t now_ms) {
    prec *r = find(t, transfer_id);
    if (!r) return ect_set_error(ECT_ENOTFOUND, "no push for transfer_id '%s'", transfer_id);
    if (now_ms > t->now) t->now = now_ms;
    if (r->state != PUSH_WAITING_INPUTS || r->ending || r->staged)
        return ect_set_error(ECT_ESTATE,
                             "push of transfer_id '%s' does not wait for its source (%s%s)",
                             transfer_id, push_state_name(r->state),
                             r->ending   ? ", ending"
                             : r->staged ? ", staged"
                                         : "");
    r->staged = true;
    return 0;
}

int push_cancel(push_table *t, const char *transfer_id, uint64_t now_ms) {
    prec *r = find(t, transfer_id);
    if (!r) return ect_set_error(ECT_ENOTFOUND, "no push for transfer_id '%s'", transfer_id);
    if (now_ms > t->now) t->now = now_ms;
    if (r->state == PUSH_CANCELLED || r->state == PUSH_CANCEL_PENDING || r->ending) return 0;
    if (is_final(r->state))
        return ect_set_error(ECT_ESTATE, "push of transfer_id '%s' is already %s", transfer_id,
                             push_state_name(r->state));
    cancel_rec(r, "cancelled by the engine");
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

static push_action *emit(out_buf *o, const prec *r, push_action_kind k, size_t shard) {
    if (o->n >= o->max) return NULL;
    push_action *a = &o->a[o->n++];
    memset(a, 0, sizeof *a);
    a->kind = k;
    a->shard = shard;
    snprintf(a->transfer_id, sizeof a->transfer_id, "%s", r->transfer_id);
    snprintf(a->consumer, sizeof a->consumer, "%s", r->consumer);
    snprintf(a->mm_hash, sizeof a->mm_hash, "%s", r->mm_hash);
    a->nbytes = r->nbytes;
    a->ndim = r->ndim;
    memcpy(a->shape, r->shape, sizeof a->shape);
    memcpy(a->dtype, r->dtype, sizeof a->dtype);
    if (shard < r->n) {
        const shard_st *s = &r->sh[shard];
        memcpy(a->reservation_id, s->rid, sizeof a->reservation_id);
        memcpy(a->dst_session, s->session, sizeof a->dst_session);
        a->dst_ptr = s->dst_ptr;
        a->dst_key = s->dst_key;
    }
    a->state = r->state;
    a->retries = r->retries;
    return a;
}

static bool in_flight(const prec *r) {
    for (size_t i = 0; i < r->n; i++) {
        const shard_st *s = &r->sh[i];
        if (s->rsv == ST_SENT || s->rsv == RS_REFRESHING || s->rsv == RS_GIVING_BACK ||
            s->write == ST_SENT || s->complete == ST_SENT || s->abandon == ST_SENT)
            return true;
    }
    return false;
}

static void entomb(push_table *t, prec *r, push_state s) {
    r->state = s;
    if (s == PUSH_DONE) t->st.done++;
    if (s == PUSH_FAILED) t->st.failed++;
    if (s == PUSH_CANCELLED) t->st.cancelled++;
    idt_move(&t->ids, &r->node, IDT_TOMBS, t->now);
}

/* Releases the source, then reports; each needs one slot of `o`, and a
 * record whose report did not fit finishes on the next call. */
static bool finish(push_table *t, prec *r, out_buf *o, push_state s) {
    r->finishing = true;
    if (r->staged && !r->released) {
        if (!emit(o, r, PUSH_ACT_RELEASE_SOURCE, SIZE_MAX)) return false;
        r->released = true;
    }
    push_action *a = emit(o, r, PUSH_ACT_FINISHED, SIZE_MAX);
    if (!a) return false;
    a->state = s;
    snprintf(a->error, sizeof a->error, "%s", s == PUSH_DONE ? "" : r->error);
    entomb(t, r, s);
    return true;
}

/* The back-pressure step of a record waiting for room (see the top of the
 * file). Returns 1 to wait, 0 to go on and reserve, -1 when `o` is out of
 * room. May fail the record (its deadline passed). */
static int back_pressure(push_table *t, prec *r, out_buf *o) {
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
            shard_st *s = &r->sh[i];
            if (s->rsv != ST_OK) continue;
            if (!emit(o, r, PUSH_ACT_GIVE_BACK, i)) return -1;
            s->rsv = RS_GIVING_BACK;
            t->st.give_backs++;
            any = true;
        }
        if (any) return 1;
        for (size_t i = 0; i < r->n; i++)
            if (r->sh[i].rsv == RS_FULL) memset(&r->sh[i], 0, sizeof r->sh[i]);
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
static bool advance(push_table *t, prec *r, out_buf *o) {
    uint64_t now = t->now;
    if (!r->ending && r->state == PUSH_WAITING_INPUTS && !r->staged &&
        now - r->created >= t->o.input_wait_ms)
        fail(r, "the encoder output was not saved within %" PRIu64 " ms", t->o.input_wait_ms);
    if (r->ending) {
        if (in_flight(r)) return true;
        bool any = false;
        for (size_t i = 0; i < r->n; i++) {
            shard_st *s = &r->sh[i];
            if (s->rsv != ST_OK || s->abandon != ST_NONE) continue;
            if (!emit(o, r, PUSH_ACT_ABANDON, i)) return false;
            s->abandon = ST_SENT;
            any = true;
        }
        return any ? true : finish(t, r, o, r->ending);
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
            shard_st *s = &r->sh[i];
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
        if (!all_reserved || !r->staged) return true;
        /* A reservation older than the refresh age may expire under the
         * write: give it back and reserve anew first. */
        for (size_t i = 0; i < r->n; i++) {
            shard_st *s = &r->sh[i];
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
            shard_st *s = &r->sh[i];
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
            shard_st *s = &r->sh[i];
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
        if (!advance(t, PREC(n), &o)) break;
    }
    return o.n;
}

uint64_t push_next_wake(const push_table *t) { return t->wake; }

/* ---- outcomes */

static int shard_of(push_table *t, const char *id, size_t shard, prec **rp) {
    prec *r = find(t, id);
    if (!r) return ect_set_error(ECT_ENOTFOUND, "no push for transfer_id '%s'", id ? id : "");
    if (shard >= r->n)
        return ect_set_error(ECT_ESTATE, "transfer_id '%s' has no shard %zu", id, shard);
    *rp = r;
    return 0;
}

static int stray(const char *what, const char *id, size_t shard) {
    return ect_set_error(ECT_ESTATE, "no %s in flight for transfer_id '%s' on shard %zu", what, id,
                         shard);
}

int push_reserve_done(push_table *t, const char *transfer_id, size_t shard,
                      const push_reservation *res, const char *error, uint64_t now_ms) {
    prec *r = NULL;
    int rc = shard_of(t, transfer_id, shard, &r);
    if (rc) return rc;
    shard_st *s = &r->sh[shard];
    if (s->rsv != ST_SENT) return stray("reserve", transfer_id, shard);
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
    s->rsv = ST_OK;
    snprintf(s->rid, sizeof s->rid, "%s", res->reservation_id);
    snprintf(s->session, sizeof s->session, "%s", res->dst_session ? res->dst_session : "");
    s->dst_ptr = res->dst_ptr;
    s->dst_key = res->dst_key;
    s->write_needed = res->write;
    s->reserved_at = t->now;
    return 0;
}

int push_reserve_full(push_table *t, const char *transfer_id, size_t shard, const char *error,
                      uint64_t now_ms) {
    prec *r = NULL;
    int rc = shard_of(t, transfer_id, shard, &r);
    if (rc) return rc;
    shard_st *s = &r->sh[shard];
    if (s->rsv != ST_SENT) return stray("reserve", transfer_id, shard);
    if (now_ms > t->now) t->now = now_ms;
    s->rsv = RS_FULL;
    r->waiting_room = true;
    t->st.full_refusals++;
    snprintf(r->full_error, sizeof r->full_error, "shard %zu: %.100s", shard,
             error ? error : "EC consumer buffer pool is full");
    return 0;
}

int push_refresh_done(push_table *t, const char *transfer_id, size_t shard, bool ok) {
    prec *r = NULL;
    int rc = shard_of(t, transfer_id, shard, &r);
    if (rc) return rc;
    shard_st *s = &r->sh[shard];
    if (s->rsv != RS_REFRESHING && s->rsv != RS_GIVING_BACK)
        return stray("refresh", transfer_id, shard);
    if (!ok) { /* the old reservation may live on: abandon it on the way out */
        bool give_back = s->rsv == RS_GIVING_BACK;
        s->rsv = ST_OK;
        fail(r, "%s the reservation on shard %zu failed",
             give_back ? "giving back (another shard was full)" : "refreshing", shard);
        return 0;
    }
    memset(s, 0, sizeof *s); /* reserve again from scratch */
    return 0;
}

int push_write_done(push_table *t, const char *transfer_id, size_t shard, bool ok) {
    prec *r = NULL;
    int rc = shard_of(t, transfer_id, shard, &r);
    if (rc) return rc;
    shard_st *s = &r->sh[shard];
    if (s->write != ST_SENT) return stray("write", transfer_id, shard);
    s->write = ok ? ST_OK : ST_FAILED;
    if (!ok) fail(r, "writing to %.64s (shard %zu) failed", s->session, shard);
    return 0;
}

int push_complete_done(push_table *t, const char *transfer_id, size_t shard, bool ok,
                       bool completed) {
    prec *r = NULL;
    int rc = shard_of(t, transfer_id, shard, &r);
    if (rc) return rc;
    shard_st *s = &r->sh[shard];
    if (s->complete != ST_SENT) return stray("complete", transfer_id, shard);
    s->complete = ok && completed ? ST_OK : ST_FAILED;
    if (!ok)
        fail(r, "complete on shard %zu failed", shard);
    else if (!completed)
        fail(r, "shard %zu did not accept the completion (reservation cancelled or expired)",
             shard);
    return 0;
}

int push_abandon_done(push_table *t, const char *transfer_id, size_t shard, bool ok) {
    prec *r = NULL;
    int rc = shard_of(t, transfer_id, shard, &r);
    if (rc) return rc;
    shard_st *s = &r->sh[shard];
    if (s->abandon != ST_SENT) return stray("abandon", transfer_id, shard);
    s->abandon = ok ? ST_OK : ST_FAILED;
    if (!ok)
        ECT_LOGW(MOD, "abandoning transfer_id=%s on shard %zu failed; its TTL will end it",
                 transfer_id, shard);
    return 0;
}

int push_get(const push_table *t, const char *transfer_id, push_info *info) {
    const prec *r = find(t, transfer_id);
    if (!r) return ect_set_error(ECT_ENOTFOUND, "no push for transfer_id '%s'", transfer_id);
    memset(info, 0, sizeof *info);
    info->state = r->state;
    info->source_staged = r->staged;
    info->n_shards = r->n;
    info->retries = r->retries;
    info->waiting_room = r->waiting_room;
    for (size_t i = 0; i < r->n; i++) {
        info->reserved += r->sh[i].rsv == ST_OK;
        info->written += r->sh[i].write == ST_OK;
        info->completed += r->sh[i].complete == ST_OK;
    }
    memcpy(info->error, r->error, sizeof info->error);
    return 0;
}

void push_get_stats(const push_table *t, push_stats *st) {
    *st = t->st;
    st->live = idt_live(&t->ids);
    st->tombstones = idt_count(&t->ids, IDT_TOMBS);
    st->tombstones_dropped = t->ids.dropped;
}

int push_check(const push_table *t) {
    int rc = idt_check(&t->ids);
    if (rc) return rc;
    for (int l = IDT_TOMBS; l < IDT_LISTS; l++)
        for (const idt_node *n = idt_first(&t->ids, l); n; n = n->next) {
            const prec *r = PREC(n);
            if (is_final(r->state) != (l == IDT_TOMBS))
                return ect_set_error(ECT_ESTATE, "%s is %s on the wrong list", r->transfer_id,
                                     push_state_name(r->state));
            if (is_final(r->state)) {
                if (in_flight(r))
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
            for (size_t i = 0; i < r->n; i++) {
                const shard_st *s = &r->sh[i];
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
