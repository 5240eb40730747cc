/*
 * transfers — the consumer scheduler's table. See transfers.h for the
 * contract; this file explains the bookkeeping.
 *
 * Entries live in the id table (util/idtab) on one of two lists. The live
 * list holds every non-tombstone entry, orphans included (items some shard
 * reported before the scheduler expected them; upstream's producer learns
 * the transfer_id from the same request, so its events can overtake the
 * scheduler). Its deadlines differ by state (push wait, TTL), so the reaper
 * walks it whole; it holds only in-flight requests. Tombstones are the
 * table's: each due one TTL after it was made, capped, oldest first.
 *
 * Remote cancels are jobs with their own copies of the ids, so an entry can
 * be forgotten while its cancels are still being sent and retried.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/idtab.h"

#include <utlist.h>

#include "push/transfers.h"

#define MOD "xfer"

typedef struct xent {
    char *transfer_id;
    char *mm_hash; /* "" until known */
    bool have_tensor;
    uint64_t nbytes;
    uint64_t shape[WIRE_MAX_NDIM];
    size_t ndim;
    char dtype[XFER_DTYPE_MAX + 1];
    xfer_state state;
    bool expected;
    uint64_t mask;       /* shards that reported ready */
    uint64_t recheck_at; /* when to ask the missing shards with `status` (0: not set yet) */
    unsigned rechecks;   /* rounds asked so far */
    char (*rids)[ECT_ID_LEN + 1];
    char error[160];
    idt_node node; /* live: deadline = push wait or TTL by state */
} xent;

#define XENT(n) IDT_ENTRY(n, xent, node)

typedef struct job_node {
    xfer_cancel_job job;
    struct job_node *prev, *next;
} job_node;

typedef struct fail_node {
    xfer_failure f;
    struct fail_node *prev, *next;
} fail_node;

struct xfer_table {
    xfer_opts o;
    uint64_t now, all_mask;
    idtab ids;
    job_node *jobs;
    fail_node *fails;
    size_t n_fails;
    bool engine_fail; /* xfer_fail in progress: not a failure to report */
    bool no_cancels;  /* xfer_finished in progress: the shards ended it themselves */
    xfer_stats st;
};

static const char *const names[] = {"?",         "WAITING_EVENT", "AVAILABLE",   "LOADING",
                                    "READY",     "RESIDENT",      "UNAVAILABLE", "EXPIRED",
                                    "CANCELLED", "FAILED"};

const char *xfer_state_name(xfer_state s) {
    return (s >= XFER_WAITING_EVENT && s <= XFER_FAILED) ? names[s] : "?";
}

static bool is_tomb(xfer_state s) { return s >= XFER_UNAVAILABLE; }

void xfer_opts_init(xfer_opts *o) {
    memset(o, 0, sizeof *o);
    o->tp_size = 1;
    o->push_wait_ms = XFER_DEFAULT_PUSH_WAIT_MS;
    o->ttl_ms = XFER_DEFAULT_TTL_MS;
    o->max_tombstones = XFER_DEFAULT_MAX_TOMBSTONES;
    o->max_orphans = XFER_DEFAULT_MAX_ORPHANS;
    o->cancel_attempts = XFER_DEFAULT_CANCEL_ATTEMPTS;
    o->recheck_ms = XFER_DEFAULT_RECHECK_MS;
}

static void ent_free_mem(xent *e) {
    free(e->transfer_id);
    free(e->mm_hash);
    free(e->rids);
    free(e);
}

/* idt_ops.drop: a tombstone expired or went over the cap (or close). */
static void on_drop(void *ctx, idt_node *n) {
    xfer_table *t = ctx;
    xent *e = XENT(n);
    if (!is_tomb(e->state) && !e->expected) t->st.orphans--;
    ent_free_mem(e);
}

int xfer_open(const xfer_opts *o, xfer_table **out) {
    *out = NULL;
    if (!o) return ect_set_error(ECT_EINVAL, "xfer_opts: NULL");
    if (o->tp_size < 1 || o->tp_size > XFER_MAX_SHARDS)
        return ect_set_error(ECT_EINVAL, "xfer_opts.tp_size must be 1..%d, not %zu",
                             XFER_MAX_SHARDS, o->tp_size);
    if (o->push_wait_ms == 0)
        return ect_set_error(ECT_EINVAL, "xfer_opts.push_wait_ms must be > 0");
    if (o->ttl_ms == 0) return ect_set_error(ECT_EINVAL, "xfer_opts.ttl_ms must be > 0");
    if (o->max_tombstones == 0)
        return ect_set_error(ECT_EINVAL, "xfer_opts.max_tombstones must be > 0");
    if (o->max_orphans == 0) return ect_set_error(ECT_EINVAL, "xfer_opts.max_orphans must be > 0");
    if (o->cancel_attempts == 0)
        return ect_set_error(ECT_EINVAL, "xfer_opts.cancel_attempts must be > 0");
    xfer_table *t = calloc(1, sizeof *t);
    if (!t) return ect_set_error(ECT_ENOMEM, "transfer table: out of memory");
    t->o = *o;
    t->all_mask = o->tp_size == 64 ? UINT64_MAX : (UINT64_C(1) << o->tp_size) - 1;
    idt_init(&t->ids, o->ttl_ms, o->max_tombstones, &(idt_ops){.drop = on_drop, .ctx = t});
    *out = t;
    return 0;
}

static void ent_delete(xfer_table *t, xent *e) {
    idt_remove(&t->ids, &e->node);
    if (!is_tomb(e->state) && !e->expected) t->st.orphans--;
    ent_free_mem(e);
}

void xfer_close(xfer_table *t) {
    if (!t) return;
    idt_clear(&t->ids);
    job_node *j, *jt;
    DL_FOREACH_SAFE(t->jobs, j, jt) free(j);
    fail_node *f, *ft;
    DL_FOREACH_SAFE(t->fails, f, ft) free(f);
    free(t);
}

static void note_failure(xfer_table *t, const xent *e, xfer_state s, const char *error) {
    fail_node *n;
    if (t->n_fails >= XFER_MAX_FAILURES) {
        n = t->fails; /* reuse the oldest */
        DL_DELETE(t->fails, n);
        t->n_fails--;
        t->st.failures_dropped++;
    } else if (!(n = calloc(1, sizeof *n))) {
        t->st.failures_dropped++;
        return;
    }
    memset(&n->f, 0, sizeof n->f);
    ect_strcpy_cut(n->f.transfer_id, sizeof n->f.transfer_id, e->transfer_id);
    ect_strcpy_cut(n->f.mm_hash, sizeof n->f.mm_hash, e->mm_hash);
    n->f.state = s;
    n->f.reported = (size_t)__builtin_popcountll(e->mask);
    ect_strcpy_cut(n->f.error, sizeof n->f.error, error);
    DL_APPEND(t->fails, n);
    t->n_fails++;
}

/* Moves up to max payloads (member `field`) from the head of the node list
 * `head` into out, counting them in n and off *count. */
#define TAKE(n, head, field, out, max, count)                                                      \
    do {                                                                                           \
        while ((n) < (max) && (head)) {                                                            \
            __typeof__(head) x_ = (head);                                                          \
            (out)[(n)++] = x_->field;                                                              \
            DL_DELETE((head), x_);                                                                 \
            (*(count))--;                                                                          \
            free(x_);                                                                              \
        }                                                                                          \
    } while (0)

size_t xfer_take_failures(xfer_table *t, xfer_failure *out, size_t max) {
    size_t n = 0;
    TAKE(n, t->fails, f, out, max, &t->n_fails);
    return n;
}

static xent *find(const xfer_table *t, const char *id) {
    idt_node *n = idt_find(&t->ids, id);
    return n ? XENT(n) : NULL;
}

static int check_key(const char *s, const char *field) {
    if (!s || !*s) return ect_set_error(ECT_EINVAL, "%s must be a non-empty string", field);
    if (strlen(s) > XFER_KEY_MAX)
        return ect_set_error(ECT_EINVAL, "%s is longer than %d bytes", field, XFER_KEY_MAX);
    return 0;
}

static void queue_job(xfer_table *t, const char *tid, const char *rid, size_t shard,
                      unsigned attempt) {
    job_node *j = calloc(1, sizeof *j);
    if (!j) {
        ECT_LOGE_ID(MOD, tid, NULL, "out of memory queueing a remote cancel of transfer_id=%s",
                    tid);
        t->st.cancels_given_up++;
        return;
    }
    ect_strcpy_cut(j->job.transfer_id, sizeof j->job.transfer_id, tid);
    ect_strcpy_cut(j->job.reservation_id, sizeof j->job.reservation_id, rid ? rid : "");
    j->job.shard = shard;
    j->job.attempt = attempt;
    DL_APPEND(t->jobs, j);
    t->st.cancels_queued++;
}

/* A live entry becomes tombstone `s`: every shard is told to cancel (those
 * that never reported get a pre-cancel, refusing a late producer). */
static void entomb(xfer_table *t, xent *e, xfer_state s, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void entomb(xfer_table *t, xent *e, xfer_state s, const char *fmt, ...) {
    bool was_live = !is_tomb(e->state);
    if (was_live) {
        if (!e->expected) t->st.orphans--;
        for (size_t i = 0; i < t->o.tp_size && !t->no_cancels; i++)
            queue_job(t, e->transfer_id, (e->mask >> i) & 1 ? e->rids[i] : "", i, 1);
    }
    e->state = s;
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->error, sizeof e->error, fmt, ap);
        va_end(ap);
    }
    if (was_live && s != XFER_CANCELLED && !t->engine_fail) note_failure(t, e, s, e->error);
    idt_move(&t->ids, &e->node, IDT_TOMBS, t->now); /* last: the cap may drop the oldest */
}

static xent *ent_new(xfer_table *t, const char *tid, const char *mm_hash, bool expected,
                     uint64_t deadline) {
    xent *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->transfer_id = strdup(tid);
    e->mm_hash = strdup(mm_hash ? mm_hash : "");
    e->rids = calloc(t->o.tp_size, sizeof *e->rids);
    if (!e->transfer_id || !e->mm_hash || !e->rids) {
        ent_free_mem(e);
        return NULL;
    }
    e->state = XFER_WAITING_EVENT;
    e->expected = expected;
    e->node.id = e->transfer_id;
    if (idt_add(&t->ids, &e->node, IDT_LIVE, deadline)) {
        ent_free_mem(e);
        return NULL;
    }
    if (!expected) {
        t->st.orphans++;
        if (t->st.orphans > t->o.max_orphans) {
            idt_node *n = idt_first(&t->ids, IDT_LIVE);
            while (n && XENT(n)->expected) n = n->next;
            xent *o = XENT(n);
            ECT_LOGW_ID(MOD, o->transfer_id, NULL,
                        "%zu unexpected items kept; forgetting transfer_id=%s", t->o.max_orphans,
                        o->transfer_id);
            t->st.orphans_dropped++;
            ent_delete(t, o);
        }
    }
    return e;
}

int xfer_expect(xfer_table *t, const char *transfer_id, const char *mm_hash, uint64_t now_ms) {
    int rc;
    if ((rc = check_key(transfer_id, "transfer_id"))) return rc;
    if (mm_hash && *mm_hash && (rc = check_key(mm_hash, "mm_hash"))) return rc;
    if (now_ms > t->now) t->now = now_ms;
    xent *e = find(t, transfer_id);
    if (e && e->expected)
        return ect_set_error(ECT_EEXIST, "transfer_id '%s' is already expected (%s)", transfer_id,
                             xfer_state_name(e->state));
    if (!e) {
        if (!ent_new(t, transfer_id, mm_hash, true, t->now + t->o.push_wait_ms))
            return ect_set_error(ECT_ENOMEM, "expect: out of memory");
        return 0;
    }
    /* Adopt what the shards already reported. */
    e->expected = true;
    if (!is_tomb(e->state)) t->st.orphans--;
    if (e->state == XFER_WAITING_EVENT) e->node.deadline = t->now + t->o.push_wait_ms;
    if (mm_hash && *mm_hash && !*e->mm_hash) {
        char *h = strdup(mm_hash);
        if (!h) return ect_set_error(ECT_ENOMEM, "expect: out of memory");
        free(e->mm_hash);
        e->mm_hash = h;
    } else if (mm_hash && *mm_hash && strcmp(mm_hash, e->mm_hash) && !is_tomb(e->state)) {
        entomb(t, e, XFER_FAILED, "shards reported mm_hash '%.64s', the request has '%.64s'",
               e->mm_hash, mm_hash);
    }
    return 0;
}

static bool tensor_matches(const xent *e, const xfer_event *ev) {
    return e->nbytes == ev->nbytes && e->ndim == ev->ndim &&
           strcmp(e->dtype, ev->dtype ? ev->dtype : "") == 0 &&
           (ev->ndim == 0 || memcmp(e->shape, ev->shape, ev->ndim * sizeof *ev->shape) == 0);
}

static int apply_ready(xfer_table *t, xent *e, const xfer_event *ev) {
    const char *h = ev->mm_hash ? ev->mm_hash : "";
    if (e->state != XFER_WAITING_EVENT) {
        t->st.duplicate_events++;
        return XFER_EV_DUPLICATE;
    }
    if (*e->mm_hash && strcmp(e->mm_hash, h)) {
        entomb(t, e, XFER_FAILED, "shard %zu reported mm_hash '%.48s', expected '%.48s'", ev->shard,
               h, e->mm_hash);
        return XFER_EV_APPLIED;
    }
    if (e->have_tensor && !tensor_matches(e, ev)) {
        entomb(t, e, XFER_FAILED, "shard %zu reported another shape, dtype or size", ev->shard);
        return XFER_EV_APPLIED;
    }
    if ((e->mask >> ev->shard) & 1) {
        /* The producer gave the shard's reservation back and reserved anew
         * (back-pressure on another shard): cancel the newest one. */
        if (ev->reservation_id && *ev->reservation_id)
            ect_strcpy_cut(e->rids[ev->shard], sizeof e->rids[ev->shard], ev->reservation_id);
        t->st.duplicate_events++;
        return XFER_EV_DUPLICATE;
    }
    if (!*e->mm_hash) {
        char *c = strdup(h);
        if (!c) return ect_set_error(ECT_ENOMEM, "event: out of memory");
        free(e->mm_hash);
        e->mm_hash = c;
    }
    if (!e->have_tensor) {
        e->have_tensor = true;
        e->nbytes = ev->nbytes;
        e->ndim = ev->ndim;
        if (ev->ndim) memcpy(e->shape, ev->shape, ev->ndim * sizeof *ev->shape);
        ect_strcpy_cut(e->dtype, sizeof e->dtype, ev->dtype ? ev->dtype : "");
    }
    e->mask |= UINT64_C(1) << ev->shard;
    ect_strcpy_cut(e->rids[ev->shard], sizeof e->rids[ev->shard],
                   ev->reservation_id ? ev->reservation_id : "");
    if (e->mask == t->all_mask) { /* arrived only once every shard has it */
        e->state = XFER_AVAILABLE;
        e->node.deadline = t->now + t->o.ttl_ms;
    }
    return XFER_EV_APPLIED;
}

int xfer_on_event(xfer_table *t, const xfer_event *ev, uint64_t now_ms) {
    int rc;
    if ((rc = check_key(ev->transfer_id, "event transfer_id"))) return rc;
    if (ev->shard >= t->o.tp_size)
        return ect_set_error(ECT_EINVAL, "event shard %zu out of range (tp_size %zu)", ev->shard,
                             t->o.tp_size);
    if (ev->ready) {
        if ((rc = check_key(ev->mm_hash, "event mm_hash"))) return rc;
        if (ev->ndim > WIRE_MAX_NDIM || (ev->ndim && !ev->shape))
            return ect_set_error(ECT_EINVAL, "event shape: at most %d dimensions", WIRE_MAX_NDIM);
    }
    if (now_ms > t->now) t->now = now_ms;
    xent *e = find(t, ev->transfer_id);
    if (!e && !(e = ent_new(t, ev->transfer_id, NULL, false, t->now + t->o.ttl_ms)))
        return ect_set_error(ECT_ENOMEM, "event: out of memory");
    if (is_tomb(e->state)) {
        t->st.late_events++;
        return XFER_EV_LATE;
    }
    if (!ev->ready) {
        if (e->state == XFER_READY || e->state == XFER_RESIDENT) {
            t->st.duplicate_events++; /* the bytes are already here */
            return XFER_EV_DUPLICATE;
        }
        entomb(t, e, XFER_FAILED, "abandoned by shard %zu: %.100s", ev->shard,
               ev->error ? ev->error : "the producer gave up");
        return !e->expected ? XFER_EV_ORPHAN : XFER_EV_APPLIED;
    }
    rc = apply_ready(t, e, ev);
    return rc > 0 && !e->expected ? XFER_EV_ORPHAN : rc;
}

static int step(xfer_table *t, const char *id, xfer_state from, xfer_state to) {
    xent *e = find(t, id);
    if (!e || !e->expected)
        return ect_set_error(ECT_ENOTFOUND, "no expected transfer_id '%s'", id ? id : "(null)");
    if (e->state != from)
        return ect_set_error(ECT_ESTATE, "transfer_id '%s' is %s; %s -> %s refused", id,
                             xfer_state_name(e->state), xfer_state_name(from), xfer_state_name(to));
    e->state = to;
    return 0;
}

int xfer_start_load(xfer_table *t, const char *id) {
    return step(t, id, XFER_AVAILABLE, XFER_LOADING);
}
int xfer_loaded(xfer_table *t, const char *id) { return step(t, id, XFER_LOADING, XFER_READY); }
int xfer_resident(xfer_table *t, const char *id) { return step(t, id, XFER_READY, XFER_RESIDENT); }

int xfer_fail(xfer_table *t, const char *id, const char *reason, uint64_t now_ms) {
    xent *e = find(t, id);
    if (!e) return ect_set_error(ECT_ENOTFOUND, "no transfer_id '%s'", id ? id : "(null)");
    if (is_tomb(e->state))
        return ect_set_error(ECT_ESTATE, "transfer_id '%s' is already %s", id,
                             xfer_state_name(e->state));
    if (now_ms > t->now) t->now = now_ms;
    t->engine_fail = true;
    entomb(t, e, XFER_FAILED, "%.150s", reason ? reason : "failed");
    t->engine_fail = false;
    return 0;
}

int xfer_cancel(xfer_table *t, const char *id, uint64_t now_ms) {
    xent *e = find(t, id);
    if (!e) return ect_set_error(ECT_ENOTFOUND, "no transfer_id '%s'", id ? id : "(null)");
    if (now_ms > t->now) t->now = now_ms;
    if (e->state == XFER_CANCELLED) return 0;
    if (is_tomb(e->state)) { /* keep the reason; its cancels already went out */
        e->state = XFER_CANCELLED;
        return 0;
    }
    entomb(t, e, XFER_CANCELLED, NULL);
    return 0;
}

int xfer_finished(xfer_table *t, const char *id, uint64_t now_ms) {
    xent *e = find(t, id);
    if (!e) return ect_set_error(ECT_ENOTFOUND, "no transfer_id '%s'", id ? id : "(null)");
    if (e->state != XFER_RESIDENT)
        return ect_set_error(ECT_ESTATE, "transfer_id '%s' is %s, not RESIDENT", id,
                             xfer_state_name(e->state));
    if (now_ms > t->now) t->now = now_ms;
    t->no_cancels = true;
    entomb(t, e, XFER_CANCELLED, NULL);
    t->no_cancels = false;
    return 0;
}

size_t xfer_reap(xfer_table *t, uint64_t now_ms) {
    size_t n = 0;
    if (now_ms > t->now) t->now = now_ms;
    for (idt_node *nd = idt_first(&t->ids, IDT_LIVE), *next; nd; nd = next) {
        next = nd->next;
        xent *e = XENT(nd);
        if (nd->deadline > t->now) continue;
        if (!e->expected) {
            if (e->mask) { /* some shards have it, the others never did */
                char why[160];
                snprintf(why, sizeof why,
                         "reported by %d of %zu shards, never by all within %" PRIu64 " ms",
                         __builtin_popcountll(e->mask), t->o.tp_size, t->o.ttl_ms);
                note_failure(t, e, XFER_UNAVAILABLE, why);
            }
            ent_delete(t, e); /* nobody asked for it; its shards expire it */
            n++;
        } else if (e->state == XFER_WAITING_EVENT) {
            entomb(t, e, XFER_UNAVAILABLE,
                   "not pushed to every shard within %" PRIu64 " ms (%d of %zu reported); "
                   "retryable",
                   t->o.push_wait_ms, __builtin_popcountll(e->mask), t->o.tp_size);
            n++;
        } else if (e->state == XFER_AVAILABLE) {
            entomb(t, e, XFER_EXPIRED, "not loaded within %" PRIu64 " ms; retryable", t->o.ttl_ms);
            n++;
        }
    }
    return n + idt_expire(&t->ids, t->now);
}

int xfer_get(const xfer_table *t, const char *id, xfer_info *info) {
    const xent *e = find(t, id);
    if (!e) return ect_set_error(ECT_ENOTFOUND, "no transfer_id '%s'", id ? id : "(null)");
    memset(info, 0, sizeof *info);
    info->state = e->state;
    info->expected = e->expected;
    info->retryable = e->state == XFER_UNAVAILABLE || e->state == XFER_EXPIRED;
    info->reported = (size_t)__builtin_popcountll(e->mask);
    ect_strcpy_cut(info->mm_hash, sizeof info->mm_hash, e->mm_hash);
    memcpy(info->dtype, e->dtype, sizeof info->dtype);
    memcpy(info->shape, e->shape, sizeof info->shape);
    info->ndim = e->ndim;
    info->nbytes = e->nbytes;
    memcpy(info->error, e->error, sizeof info->error);
    return 0;
}

size_t xfer_take_cancels(xfer_table *t, xfer_cancel_job *out, size_t max) {
    size_t n = 0;
    TAKE(n, t->jobs, job, out, max, &t->st.cancels_queued);
    return n;
}

void xfer_cancel_done(xfer_table *t, const xfer_cancel_job *job, bool ok) {
    if (ok) return;
    if (job->attempt < t->o.cancel_attempts) {
        queue_job(t, job->transfer_id, job->reservation_id, job->shard, job->attempt + 1);
        return;
    }
    ECT_LOGW_ID(MOD, job->transfer_id, NULL,
                "giving up cancelling transfer_id=%s on shard %zu after %u attempts",
                job->transfer_id, job->shard, job->attempt);
    t->st.cancels_given_up++;
}

size_t xfer_take_rechecks(xfer_table *t, uint64_t now_ms, xfer_recheck *out, size_t max) {
    if (!t->o.recheck_ms) return 0;
    if (now_ms > t->now) t->now = now_ms;
    size_t n = 0;
    for (idt_node *nd = idt_first(&t->ids, IDT_LIVE); nd; nd = nd->next) {
        xent *e = XENT(nd);
        if (e->state != XFER_WAITING_EVENT || (!e->expected && !e->mask)) continue;
        if (!e->recheck_at) { /* first seen: its first round is one interval away */
            e->recheck_at = t->now + t->o.recheck_ms;
            continue;
        }
        if (e->recheck_at > t->now) continue;
        size_t missing = t->o.tp_size - (size_t)__builtin_popcountll(e->mask);
        if (missing > max - n) break; /* whole entries only; the rest next time */
        for (size_t i = 0; i < t->o.tp_size; i++) {
            if ((e->mask >> i) & 1) continue;
            snprintf(out[n].transfer_id, sizeof out[n].transfer_id, "%s", e->transfer_id);
            out[n++].shard = i;
        }
        if (e->rechecks < 3) e->rechecks++;
        e->recheck_at = t->now + (t->o.recheck_ms << e->rechecks);
        t->st.rechecks += missing;
    }
    return n;
}

void xfer_get_stats(const xfer_table *t, xfer_stats *st) {
    *st = t->st;
    st->live = idt_live(&t->ids);
    st->tombstones = idt_count(&t->ids, IDT_TOMBS);
    st->tombstones_dropped = t->ids.dropped;
}

int xfer_check(const xfer_table *t) {
    int rc = idt_check(&t->ids);
    if (rc) return rc;
    size_t orphans = 0, jobs = 0;
    for (int l = IDT_TOMBS; l < IDT_LISTS; l++)
        for (const idt_node *n = idt_first(&t->ids, l); n; n = n->next) {
            const xent *e = XENT(n);
            if (is_tomb(e->state) != (l == IDT_TOMBS))
                return ect_set_error(ECT_ESTATE, "%s is %s on the wrong list", e->transfer_id,
                                     xfer_state_name(e->state));
            if (is_tomb(e->state)) continue;
            orphans += !e->expected;
            if (e->state != XFER_WAITING_EVENT && e->mask != t->all_mask)
                return ect_set_error(ECT_ESTATE, "%s is %s with shards %#" PRIx64 " of %#" PRIx64,
                                     e->transfer_id, xfer_state_name(e->state), e->mask,
                                     t->all_mask);
            if (e->mask & ~t->all_mask)
                return ect_set_error(ECT_ESTATE, "%s: shard bit out of range", e->transfer_id);
        }
    for (const job_node *j = t->jobs; j; j = j->next) {
        jobs++;
        if (j->job.shard >= t->o.tp_size || j->job.attempt < 1 ||
            j->job.attempt > t->o.cancel_attempts)
            return ect_set_error(ECT_ESTATE, "bad cancel job for %s", j->job.transfer_id);
    }
    if (orphans != t->st.orphans || jobs != t->st.cancels_queued)
        return ect_set_error(ECT_ESTATE, "transfer table counters drifted");
    if (idt_count(&t->ids, IDT_TOMBS) > t->o.max_tombstones || orphans > t->o.max_orphans)
        return ect_set_error(ECT_ESTATE, "transfer table over its caps");
    return 0;
}
