/*
 * scheduler — ect_push_scheduler: the transfers table (xfer_) fed by the
 * event inbox, plus one background thread that sends the table's remote
 * cancels, so no call on the scheduler's thread ever waits on the network.
 *
 * The cancel thread has its own ZMQ context and control client; jobs go to
 * it through a mutex-guarded queue and come back with their outcome, which
 * poll() hands to xfer_cancel_done (a failure is retried only to that shard,
 * up to cancel_attempts sends). Closing shuts the thread's context down,
 * which interrupts an exchange blocked on a dead shard at once.
 *
 * Lost events: a transfer still waiting recheck_ms after it became known is
 * asked for with `status` on the shards that have not reported it (the same
 * thread, the same queue; at most RECHECK_MAX_QUEUED questions at once), and
 * a ready answer is applied as that shard's event. So an event a stray PULL
 * took, or one the shard's full queue dropped, costs at most a few seconds,
 * never the item (docs/PROTOCOL.md "Lost events").
 *
 * With accept_any, an item whose every event was lost is not known at all;
 * every recheck_ms the same thread asks each shard for what is ready on it
 * (`ect_ready`, an extension: one cursor per shard, again at once while the
 * shard says more remain) and applies each listed item as that shard's
 * event. A shard that does not know the op (upstream) or refuses it is not
 * asked again.
 *
 * Arrivals: an event that makes an entry AVAILABLE (every shard reported it)
 * appends its id to the ready queue that ect_push_scheduler_next pops; the
 * state is checked again when popped, so a cancel in between is harmless.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zmq.h>

#include "ectransfer.h"
#include "push/control_client.h"
#include "push/event_inbox.h"
#include "push/transfers.h"
#include "util/metrics.h"
#include "util/keys.h"
#include "util/util.h"

#define MOD "sched"
#define SCHED_DRAIN_MAX 4096

/* How a listing (ect_ready) ended. */
typedef enum { LIST_OK, LIST_FAILED, LIST_UNKNOWN_OP, LIST_REFUSED } list_end;

/* A job for the background thread: a remote cancel (the table's), a
 * `status` question about an item whose event never came (recheck), or an
 * `ect_ready` listing of shard j.shard (listing). */
typedef struct job {
    bool recheck, listing;
    xfer_cancel_job j; /* recheck: transfer_id and shard only; listing: shard */
    int port;
    bool ok;
    wire_status_result st; /* recheck: the answer (st.found false: not there) */
    /* listing: the cursor asked with, how it ended, the items (heap, owned
     * by the job), the next cursor and whether more remain */
    uint64_t after;
    list_end end;
    wire_ready_item *items;
    size_t n;
    uint64_t next;
    bool more;
} job;

#define LIST_MAX 256 /* items per ect_ready request */

#define RECHECK_MAX_QUEUED 256 /* status questions in flight at once */

typedef struct jobq {
    job *v;
    size_t head, n, cap; /* v[head .. head + n) */
} jobq;

struct ect_push_scheduler {
    ect_push_scheduler_opts o;
    char host[256];
    void *zctx; /* the PULL socket's */
    char *curve_keys;
    ect_keyset *keys; /* NULL: keys off */
    inbox *in;
    xfer_table *t;
    uint64_t last_drain;
    char **ready; /* ids that became AVAILABLE, FIFO */
    size_t nready, capready;
    ect_push_scheduler_stat st;
    /* cancel thread */
    void *cctx;
    pthread_t thr;
    bool thr_started;
    atomic_bool stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    jobq todo, done;        /* guarded by mu */
    size_t rechecks_queued; /* [mu] recheck jobs in todo or being asked */
    uint64_t next_recheck;  /* when pump_rechecks next walks the table */
    /* ect_ready listings (accept_any and recheck_ms only): per shard */
    uint64_t next_listing;                /* when every shard is asked next */
    uint64_t list_after[XFER_MAX_SHARDS]; /* the cursor */
    bool list_off[XFER_MAX_SHARDS];       /* upstream or refused: not asked again */
    bool list_again[XFER_MAX_SHARDS];     /* more remain: ask at once */
    bool list_asking[XFER_MAX_SHARDS];    /* [mu] a listing queued, in flight or unapplied */
    /* metrics: the stats as of the last poll, for a scrape on another thread
     * (the scheduler itself belongs to the caller's thread) */
    met_source *met;
    pthread_mutex_t snap_mu;
    ect_push_scheduler_stat snap; /* [snap_mu] */
};

static const char *const state_names[] = {"?",         "WAITING_EVENT", "AVAILABLE",   "LOADING",
                                          "READY",     "RESIDENT",      "UNAVAILABLE", "EXPIRED",
                                          "CANCELLED", "FAILED"};

const char *ect_push_state_name(ect_push_state s) {
    return (s >= ECT_PUSH_WAITING_EVENT && s <= ECT_PUSH_FAILED) ? state_names[s] : "?";
}

void ect_push_scheduler_opts_init(ect_push_scheduler_opts *o) {
    memset(o, 0, sizeof *o);
    o->consumer_host = "127.0.0.1";
    o->consumer_port = 14579;
    o->tp_size = 1;
    o->push_wait_ms = XFER_DEFAULT_PUSH_WAIT_MS;
    o->ttl_ms = XFER_DEFAULT_TTL_MS;
    o->max_tombstones = XFER_DEFAULT_MAX_TOMBSTONES;
    o->control_timeout_s = 30.0;
    o->cancel_attempts = XFER_DEFAULT_CANCEL_ATTEMPTS;
    o->min_drain_interval_ms = 5;
    o->recheck_ms = XFER_DEFAULT_RECHECK_MS;
}

static int jobq_push(jobq *q, const job *j) {
    if (q->head + q->n == q->cap && q->head) { /* slide down instead of growing */
        memmove(q->v, q->v + q->head, q->n * sizeof *q->v);
        q->head = 0;
    }
    if (q->head + q->n == q->cap) {
        size_t cap = q->cap ? 2 * q->cap : 16;
        job *v = realloc(q->v, cap * sizeof *v);
        if (!v) return ECT_ENOMEM;
        q->v = v;
        q->cap = cap;
    }
    q->v[q->head + q->n++] = *j;
    return 0;
}

/* The oldest job; the queue must not be empty. O(1): a burst of thousands
 * of finishing cancels is drained without moving the rest each time. */
static job jobq_pop(jobq *q) {
    job j = q->v[q->head++];
    if (--q->n == 0) q->head = 0;
    return j;
}

/* Asks j's shard for `status` of j's transfer; fills j->st and j->ok. */
static void ask_status(ect_push_scheduler *s, ctl_client *cli, job *j) {
    wire_ctl_request q = {.op = WIRE_OP_STATUS};
    snprintf(q.u.status.transfer_id, sizeof q.u.status.transfer_id, "%s", j->j.transfer_id);
    wire_ctl_reply r;
    memset(&j->st, 0, sizeof j->st);
    j->ok = ctl_call_ok(cli, s->host, j->port, &q, &r) == 0;
    if (!j->ok) {
        ECT_LOGD_ID(MOD, j->j.transfer_id, NULL, "status %s on shard %d: %s", j->j.transfer_id,
                    j->port, ect_last_error());
        return;
    }
    j->st = r.u.status;
    wire_ctl_reply_clear(&r);
}

/* Asks j's shard for what is ready past j->after; fills j's answer. */
static void ask_ready(ect_push_scheduler *s, ctl_client *cli, job *j) {
    wire_ctl_request q = {.op = WIRE_OP_ECT_READY};
    q.u.ready.after = j->after;
    q.u.ready.max = LIST_MAX;
    q.u.ready.age_ms = s->o.recheck_ms; /* an event merely on its way is not a lost one */
    wire_ctl_reply r;
    j->end = LIST_FAILED;
    if (ctl_call(cli, s->host, j->port, &q, &r)) {
        ECT_LOGD(MOD, "ect_ready on shard %d: %s", j->port, ect_last_error());
        return;
    }
    if (!r.ok) {
        const char *unknown = "unknown control op: 'ect_ready'";
        j->end = strcmp(r.error, unknown) == 0 ? LIST_UNKNOWN_OP : LIST_REFUSED;
        if (j->end == LIST_UNKNOWN_OP)
            ECT_LOGD(MOD, "shard %d does not list ready items (upstream): not asked again",
                     j->port);
        else
            ECT_LOGW(MOD,
                     "shard %d refused ect_ready: %.200s; not asked again (an item whose every "
                     "event is lost there is not recovered)",
                     j->port, r.error);
        wire_ctl_reply_clear(&r);
        return;
    }
    j->end = LIST_OK;
    j->items = r.u.ready.items;
    j->n = r.u.ready.n;
    j->next = r.u.ready.next;
    j->more = r.u.ready.more;
    r.u.ready.items = NULL;
    r.u.ready.n = 0;
    wire_ctl_reply_clear(&r);
}

static void *cancel_main(void *arg) {
    ect_push_scheduler *s = arg;
    pthread_setname_np(pthread_self(), "ect-sched-cncl");
    ctl_client *cli = NULL;
    if (ctl_client_open(s->cctx, ctl_timeout_ms(s->o.control_timeout_s), &cli)) {
        ECT_LOGE(MOD, "cancel thread: %s", ect_last_error());
        return NULL;
    }
    ctl_client_set_keys(cli, s->keys);
    pthread_mutex_lock(&s->mu);
    while (!atomic_load(&s->stop)) {
        if (s->todo.n == 0) {
            pthread_cond_wait(&s->cv, &s->mu);
            continue;
        }
        job j = jobq_pop(&s->todo);
        pthread_mutex_unlock(&s->mu);
        if (j.recheck) {
            ask_status(s, cli, &j);
            pthread_mutex_lock(&s->mu);
            if (jobq_push(&s->done, &j)) {
                ECT_LOGE(MOD, "cancel thread: out of memory");
                s->rechecks_queued--;
            }
            continue;
        }
        if (j.listing) {
            ask_ready(s, cli, &j);
            pthread_mutex_lock(&s->mu);
            if (jobq_push(&s->done, &j)) { /* asked again at the next interval */
                ECT_LOGE(MOD, "cancel thread: out of memory");
                free(j.items);
                s->list_asking[j.j.shard] = false;
            }
            continue;
        }
        wire_ctl_request q = {.op = WIRE_OP_CANCEL};
        ect_strcpy_cut(q.u.cancel.transfer_id, sizeof q.u.cancel.transfer_id, j.j.transfer_id);
        ect_strcpy_cut(q.u.cancel.reservation_id, sizeof q.u.cancel.reservation_id,
                       j.j.reservation_id);
        wire_ctl_reply r;
        j.ok = ctl_call_ok(cli, s->host, j.port, &q, &r) == 0;
        if (j.ok)
            wire_ctl_reply_clear(&r);
        else
            ECT_LOGW_ID(MOD, j.j.transfer_id, NULL, "cancel %s on shard %d (attempt %u): %s",
                        j.j.transfer_id, j.port, j.j.attempt, ect_last_error());
        pthread_mutex_lock(&s->mu);
        if (jobq_push(&s->done, &j)) ECT_LOGE(MOD, "cancel thread: out of memory");
    }
    pthread_mutex_unlock(&s->mu);
    ctl_client_close(cli);
    return NULL;
}

static void collect(void *ctx, met_out *o) {
    ect_push_scheduler *s = ctx;
    pthread_mutex_lock(&s->snap_mu);
    ect_push_scheduler_stat st = s->snap;
    pthread_mutex_unlock(&s->snap_mu);
    char l[96];
    met_out_gauge(o, "ectransfer_peers_up",
                  "Peers reached (push scheduler: consumer shards discovered).", NULL, st.shards);
    met_out_counter(o, "ectransfer_events_total", "Events applied by the scheduler.", NULL,
                    st.events);
    met_out_counter(o, "ectransfer_bad_requests_total",
                    "Frames refused as malformed or an unknown op.", NULL, st.bad_frames);
    met_out_counter(o, "ectransfer_late_events_total",
                    "Events for transfers already ended, ignored.", NULL, st.late_events);
    met_out_counter(o, "ectransfer_events_recovered_total",
                    "Shard reports learnt from `status` because their event was lost.", NULL,
                    st.recovered);
    met_out_counter(o, "ectransfer_events_listed_total",
                    "Items learnt from a shard's `ect_ready` listing: every event of them lost.",
                    NULL, st.listed);
    met_out_control_requests(o, st.cancels_sent + st.cancels_failed + st.rechecks);
    met_out_failure(o, "cancel_failed", st.cancels_failed);
    met_out_gauge(o, "ectransfer_transfers",
                  "Transfers the scheduler tracks (live) and remembers (tombstones).",
                  met_labels(l, sizeof l, "state", "live", (const char *)NULL), (double)st.live);
    met_out_gauge(o, "ectransfer_transfers",
                  "Transfers the scheduler tracks (live) and remembers (tombstones).",
                  met_labels(l, sizeof l, "state", "tombstone", (const char *)NULL),
                  (double)st.tombstones);
}

int ect_push_scheduler_open(const ect_push_scheduler_opts *o, ect_push_scheduler **out) {
    if (out) *out = NULL;
    if (!o || !out) return ect_set_error(ECT_EINVAL, "push scheduler: opts and out required");
    if (!o->consumer_host || !*o->consumer_host || strlen(o->consumer_host) > 255)
        return ect_set_error(ECT_EINVAL, "consumer_host: required, at most 255 bytes");
    if (o->consumer_port < 1 || o->consumer_port > 65535)
        return ect_set_error(ECT_EINVAL, "consumer_port %d: 1..65535", o->consumer_port);
    if (o->tp_size < 1 || o->tp_size > XFER_MAX_SHARDS)
        return ect_set_error(ECT_EINVAL, "tp_size %d: 1..%d", o->tp_size, XFER_MAX_SHARDS);
    if (!(o->control_timeout_s > 0))
        return ect_set_error(ECT_EINVAL, "control_timeout_s must be > 0");
    ect_push_scheduler *s = calloc(1, sizeof *s);
    if (!s) return ect_set_error(ECT_ENOMEM, "push scheduler: out of memory");
    s->o = *o;
    ect_strcpy_cut(s->host, sizeof s->host, o->consumer_host);
    s->o.consumer_host = s->host;
    s->o.curve_keys = NULL;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_mutex_init(&s->snap_mu, NULL);
    int rc = 0;
    if (o->curve_keys && (!(s->curve_keys = strdup(o->curve_keys)) ||
                          (rc = ect_keys_load(s->curve_keys, &s->keys)))) {
        if (!rc) rc = ect_set_error(ECT_ENOMEM, "push scheduler: out of memory");
        goto fail;
    }
    s->o.curve_keys = s->curve_keys;
    xfer_opts xo;
    xfer_opts_init(&xo);
    xo.tp_size = (size_t)o->tp_size;
    xo.push_wait_ms = o->push_wait_ms;
    xo.ttl_ms = o->ttl_ms;
    xo.max_tombstones = o->max_tombstones;
    xo.cancel_attempts = o->cancel_attempts;
    xo.recheck_ms = o->recheck_ms;
    if ((rc = xfer_open(&xo, &s->t))) goto fail;
    s->zctx = zmq_ctx_new();
    s->cctx = zmq_ctx_new();
    if (!s->zctx || !s->cctx) {
        rc = ect_set_error(ECT_EIO, "push scheduler: zmq_ctx_new failed");
        goto fail;
    }
    inbox_opts io = {.host = s->host,
                     .port = o->consumer_port,
                     .tp_size = o->tp_size,
                     .timeout_ms = ctl_timeout_ms(o->control_timeout_s),
                     .retry_ms = 200,
                     .keys = s->keys};
    if ((rc = inbox_open(s->zctx, &io, &s->in))) goto fail;
    if (pthread_create(&s->thr, NULL, cancel_main, s) != 0) {
        rc = ect_set_error(ECT_EIO, "push scheduler: cannot start the cancel thread");
        goto fail;
    }
    s->thr_started = true;
    if ((rc = met_source_add("push_scheduler", NULL, collect, s, &s->met))) goto fail;
    *out = s;
    return 0;
fail:
    ECT_RETURN_AFTER(rc, ect_push_scheduler_close(s));
}

void ect_push_scheduler_close(ect_push_scheduler *s) {
    if (!s) return;
    met_source_remove(s->met);
    pthread_mutex_lock(&s->mu);
    atomic_store(&s->stop, true);
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (s->cctx) zmq_ctx_shutdown(s->cctx);
    if (s->thr_started) pthread_join(s->thr, NULL);
    if (s->cctx) zmq_ctx_term(s->cctx);
    inbox_close(s->in);
    if (s->zctx) zmq_ctx_term(s->zctx);
    xfer_close(s->t);
    for (size_t i = 0; i < s->nready; i++) free(s->ready[i]);
    free(s->ready);
    for (jobq *q = &s->todo; q; q = q == &s->todo ? &s->done : NULL)
        for (size_t i = 0; i < q->n; i++) free(q->v[q->head + i].items);
    free(s->todo.v);
    free(s->done.v);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->snap_mu);
    ect_keys_free(s->keys);
    free(s->curve_keys);
    free(s);
}

static void push_ready(ect_push_scheduler *s, const char *tid) {
    if (s->nready == s->capready) {
        size_t cap = s->capready ? 2 * s->capready : 16;
        char **v = realloc(s->ready, cap * sizeof *v);
        if (!v) goto oom;
        s->ready = v;
        s->capready = cap;
    }
    char *d = strdup(tid);
    if (!d) goto oom;
    s->ready[s->nready++] = d;
    return;
oom:
    ECT_LOGE_ID(MOD, tid, NULL, "out of memory queueing %s; it stays AVAILABLE until it expires",
                tid);
}

static void check_available(ect_push_scheduler *s, const char *tid) {
    xfer_info info;
    if (xfer_get(s->t, tid, &info) == 0 && info.state == XFER_AVAILABLE) push_ready(s, tid);
}

static void on_event(void *user, const wire_event *ev, size_t shard) {
    ect_push_scheduler *s = user;
    xfer_event xe = {.transfer_id = ev->transfer_id,
                     .shard = shard,
                     .ready = ev->ready,
                     .reservation_id = ev->reservation_id,
                     .mm_hash = ev->mm_hash,
                     .nbytes = ev->tensor.nbytes,
                     .shape = ev->tensor.shape,
                     .ndim = ev->tensor.ndim,
                     .dtype = ev->tensor.dtype,
                     .error = ev->error};
    uint64_t now = ect_now_ms();
    int rc = xfer_on_event(s->t, &xe, now);
    if (rc < 0) {
        ECT_LOGW_ID(MOD, ev->transfer_id, NULL, "event for %s refused: %s", ev->transfer_id,
                    ect_last_error());
        s->st.bad_frames++;
        return;
    }
    s->st.events++;
    if (rc == XFER_EV_ORPHAN && s->o.accept_any) {
        if (xfer_expect(s->t, ev->transfer_id, ev->mm_hash[0] ? ev->mm_hash : NULL, now) == 0)
            check_available(s, ev->transfer_id);
        return;
    }
    if (rc == XFER_EV_APPLIED) check_available(s, ev->transfer_id);
}

/* A shard's report learnt by asking (`status`, or `ect_ready` when
 * listing), applied exactly as that shard's readiness event, and counted: a
 * new report of a waiting item as recovered, a listed item unknown before as
 * listed (each logged once). Caller: the scheduler's thread, without mu. */
static void apply_report(ect_push_scheduler *s, const wire_event *ev, size_t shard, int port,
                         bool listing) {
    const char *via = listing ? "ect_ready" : "status";
    uint64_t before = s->st.events;
    xfer_info in, after;
    bool known = xfer_get(s->t, ev->transfer_id, &in) == 0;
    bool had = known && in.state == XFER_WAITING_EVENT;
    on_event(s, ev, shard);
    if (s->st.events > before) s->st.events--; /* not an event */
    if (xfer_get(s->t, ev->transfer_id, &after) != 0) return;
    if (!known && listing) {
        s->st.listed++;
        ECT_LOGI_ID(MOD, ev->transfer_id, NULL,
                    "transfer_id=%s: ready on shard %d per `%s`; every event of it was lost",
                    ev->transfer_id, port, via);
    } else if (had && after.reported > in.reported) {
        s->st.recovered++;
        ECT_LOGI_ID(MOD, ev->transfer_id, NULL,
                    "transfer_id=%s: ready on shard %d per `%s`; its event was lost",
                    ev->transfer_id, port, via);
    }
}

/* A recheck answer: ready on that shard counts as its event. */
static void apply_recheck(ect_push_scheduler *s, const job *d) {
    if (!d->ok || !d->st.found || !d->st.ready) return;
    wire_event ev;
    memset(&ev, 0, sizeof ev);
    snprintf(ev.transfer_id, sizeof ev.transfer_id, "%s", d->j.transfer_id);
    snprintf(ev.mm_hash, sizeof ev.mm_hash, "%s", d->st.mm_hash);
    snprintf(ev.reservation_id, sizeof ev.reservation_id, "%s", d->st.reservation_id);
    ev.ready = true;
    ev.tensor = d->st.tensor;
    apply_report(s, &ev, d->j.shard, d->port, false);
}

/* A listing's answer: each item counts as that shard's readiness event; the
 * cursor moves on (and the shard is asked again at once while more remain),
 * or the shard is not asked again (upstream, or refused). Frees the items. */
static void apply_listing(ect_push_scheduler *s, job *d) {
    size_t k = d->j.shard;
    if (d->end == LIST_UNKNOWN_OP || d->end == LIST_REFUSED) s->list_off[k] = true;
    for (size_t i = 0; d->end == LIST_OK && i < d->n; i++) {
        const wire_ready_item *it = &d->items[i];
        wire_event ev;
        memset(&ev, 0, sizeof ev);
        memcpy(ev.transfer_id, it->transfer_id, sizeof ev.transfer_id);
        memcpy(ev.mm_hash, it->mm_hash, sizeof ev.mm_hash);
        memcpy(ev.reservation_id, it->reservation_id, sizeof ev.reservation_id);
        ev.ready = true;
        ev.tensor = it->tensor;
        apply_report(s, &ev, k, d->port, true);
    }
    if (d->end == LIST_OK) {
        s->list_after[k] = d->next;
        s->list_again[k] = d->more;
    }
    free(d->items);
    d->items = NULL;
    pthread_mutex_lock(&s->mu); /* only now: a listing queued before used the old cursor */
    s->list_asking[k] = false;
    pthread_mutex_unlock(&s->mu);
}

/* Queues an ect_ready listing for each shard due: all of them every
 * recheck_ms, one whose last answer said more remain at once; never two
 * for one shard. Only with accept_any (items never expected). Caller holds
 * mu; the shard ports are known. */
static void queue_listings(ect_push_scheduler *s, const int *ports, uint64_t now) {
    if (!s->o.accept_any || !s->o.recheck_ms) return;
    bool due = now >= s->next_listing;
    if (due) s->next_listing = now + s->o.recheck_ms;
    for (size_t k = 0; k < (size_t)s->o.tp_size; k++) {
        if (s->list_off[k] || s->list_asking[k] || !(due || s->list_again[k])) continue;
        job j = {.listing = true, .port = ports[k], .after = s->list_after[k]};
        j.j.shard = k;
        if (jobq_push(&s->todo, &j)) break; /* out of memory: asked again next round */
        s->list_asking[k] = true;
        s->list_again[k] = false;
    }
}

/* Queues `status` questions for items whose events are overdue (at most
 * every recheck_ms / 4, at most RECHECK_MAX_QUEUED at once). Caller holds mu;
 * the shard ports are known. */
static void queue_rechecks(ect_push_scheduler *s, const int *ports, uint64_t now) {
    if (!s->o.recheck_ms || now < s->next_recheck) return;
    s->next_recheck = now + (s->o.recheck_ms / 4 ? s->o.recheck_ms / 4 : 1);
    xfer_recheck rc[64];
    while (s->rechecks_queued + 64 <= RECHECK_MAX_QUEUED) {
        size_t k = xfer_take_rechecks(s->t, now, rc, 64);
        for (size_t i = 0; i < k; i++) {
            job j = {.recheck = true, .port = ports[rc[i].shard]};
            _Static_assert(sizeof j.j.transfer_id == sizeof rc[i].transfer_id, "id sizes");
            memcpy(j.j.transfer_id, rc[i].transfer_id, sizeof j.j.transfer_id);
            j.j.shard = rc[i].shard;
            if (jobq_push(&s->todo, &j)) break; /* out of memory: asked again next round */
            s->rechecks_queued++;
            s->st.rechecks++;
        }
        if (k == 0) break; /* the table has none due (each taken entry waits again) */
    }
}

/* Hands finished jobs to the table (cancels) or applies them (rechecks), and
 * new ones to the thread. */
static void pump_cancels(ect_push_scheduler *s) {
    int ports[XFER_MAX_SHARDS];
    size_t n = inbox_shards(s->in, ports, XFER_MAX_SHARDS);
    job answers[64];
    size_t na = 0;
    pthread_mutex_lock(&s->mu);
    while (s->done.n && na < 64) { /* the rest next poll */
        job d = jobq_pop(&s->done);
        if (d.recheck || d.listing) {
            if (d.recheck) s->rechecks_queued--;
            answers[na++] = d; /* applied below, without mu */
            continue;
        }
        xfer_cancel_done(s->t, &d.j, d.ok);
        if (d.ok)
            s->st.cancels_sent++;
        else
            s->st.cancels_failed++;
    }
    if (n == (size_t)s->o.tp_size) { /* shard ports known: send what the table queued */
        xfer_cancel_job jobs[64];
        size_t k;
        while ((k = xfer_take_cancels(s->t, jobs, 64)) > 0) {
            for (size_t i = 0; i < k; i++) {
                job j = {.j = jobs[i], .port = ports[jobs[i].shard]};
                if (jobq_push(&s->todo, &j)) xfer_cancel_done(s->t, &jobs[i], false);
            }
            if (k < 64) break;
        }
        queue_rechecks(s, ports, ect_now_ms());
        queue_listings(s, ports, ect_now_ms());
        if (s->todo.n) pthread_cond_signal(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    for (size_t i = 0; i < na; i++) {
        if (answers[i].listing)
            apply_listing(s, &answers[i]);
        else
            apply_recheck(s, &answers[i]);
    }
}

int ect_push_scheduler_poll(ect_push_scheduler *s) {
    uint64_t now = ect_now_ms();
    size_t got = 0;
    if (now - s->last_drain >= s->o.min_drain_interval_ms || s->last_drain == 0) {
        s->last_drain = now;
        got = inbox_drain(s->in, on_event, s, SCHED_DRAIN_MAX);
    }
    xfer_reap(s->t, ect_now_ms());
    pump_cancels(s);
    ect_push_scheduler_stat st;
    ect_push_scheduler_stats(s, &st);
    pthread_mutex_lock(&s->snap_mu);
    s->snap = st;
    pthread_mutex_unlock(&s->snap_mu);
    return (int)got;
}

int ect_push_scheduler_wait(ect_push_scheduler *s, int timeout_ms) {
    if (!s || timeout_ms < 0)
        return ect_set_error(ECT_EINVAL, "ect_push_scheduler_wait: NULL scheduler or negative timeout");
    if (!s->nready) {
        /* the lost-event rechecks run in poll: wake for the next one */
        uint64_t now = ect_now_ms(), due = s->next_recheck;
        if (due && due > now && due - now < (uint64_t)timeout_ms) timeout_ms = (int)(due - now);
        if (due && due <= now) timeout_ms = 0;
        inbox_wait(s->in, timeout_ms);
    }
    s->last_drain = 0; /* drain now, whatever min_drain_interval_ms says */
    return ect_push_scheduler_poll(s);
}

static void fill_item(ect_push_sched_item *it, const char *tid, const xfer_info *in) {
    memset(it, 0, sizeof *it);
    ect_strcpy_cut(it->transfer_id, sizeof it->transfer_id, tid);
    it->state = (ect_push_state)in->state;
    it->retryable = in->retryable;
    it->reported = (uint32_t)in->reported;
    ect_strcpy_cut(it->mm_hash, sizeof it->mm_hash, in->mm_hash);
    it->nbytes = in->nbytes;
    it->ndim = (uint32_t)in->ndim;
    for (size_t i = 0; i < in->ndim && i < ECT_POOL_MAX_NDIM; i++) it->shape[i] = in->shape[i];
    ect_strcpy_cut(it->dtype, sizeof it->dtype, in->dtype);
    ect_strcpy_cut(it->error, sizeof it->error, in->error);
}

int ect_push_scheduler_expect(ect_push_scheduler *s, const char *transfer_id, const char *mm_hash) {
    int rc = xfer_expect(s->t, transfer_id, mm_hash, ect_now_ms());
    if (rc == 0) check_available(s, transfer_id);
    return rc;
}

int ect_push_scheduler_state(ect_push_scheduler *s, const char *transfer_id,
                             ect_push_sched_item *item) {
    xfer_info in;
    int rc = xfer_get(s->t, transfer_id, &in);
    if (rc) return rc;
    fill_item(item, transfer_id, &in);
    return 0;
}

int ect_push_scheduler_next(ect_push_scheduler *s, ect_push_sched_item *item) {
    while (s->nready) {
        char *tid = s->ready[0];
        memmove(s->ready, s->ready + 1, (s->nready - 1) * sizeof *s->ready);
        s->nready--;
        xfer_info in;
        int rc = xfer_get(s->t, tid, &in);
        if (rc == 0 && in.state == XFER_AVAILABLE && xfer_start_load(s->t, tid) == 0) {
            xfer_get(s->t, tid, &in);
            fill_item(item, tid, &in);
            free(tid);
            return 0;
        }
        free(tid);
    }
    return ect_set_error(ECT_ENOTFOUND, "no transfer has arrived on every shard");
}

int ect_push_scheduler_loaded(ect_push_scheduler *s, const char *transfer_id) {
    int rc = xfer_loaded(s->t, transfer_id);
    if (rc == 0) rc = xfer_resident(s->t, transfer_id);
    return rc;
}

int ect_push_scheduler_next_failed(ect_push_scheduler *s, ect_push_sched_item *item) {
    if (!s || !item) return ect_set_error(ECT_EINVAL, "ect_push_scheduler_next_failed: NULL");
    xfer_failure f;
    if (xfer_take_failures(s->t, &f, 1) == 0)
        return ect_set_error(ECT_ENOTFOUND, "no transfer failed since the last call");
    memset(item, 0, sizeof *item);
    xfer_info in;
    if (xfer_get(s->t, f.transfer_id, &in) == 0) fill_item(item, f.transfer_id, &in);
    ect_strcpy_cut(item->transfer_id, sizeof item->transfer_id, f.transfer_id);
    ect_strcpy_cut(item->mm_hash, sizeof item->mm_hash, f.mm_hash);
    item->state = (ect_push_state)f.state;
    item->retryable = f.state == XFER_UNAVAILABLE || f.state == XFER_EXPIRED;
    item->reported = (uint32_t)f.reported;
    ect_strcpy_cut(item->error, sizeof item->error, f.error);
    return 0;
}

int ect_push_scheduler_fail(ect_push_scheduler *s, const char *transfer_id, const char *reason) {
    return xfer_fail(s->t, transfer_id, reason ? reason : "load failed", ect_now_ms());
}

int ect_push_scheduler_finished(ect_push_scheduler *s, const char *transfer_id) {
    return xfer_finished(s->t, transfer_id, ect_now_ms());
}

int ect_push_scheduler_cancel(ect_push_scheduler *s, const char *transfer_id) {
    return xfer_cancel(s->t, transfer_id, ect_now_ms());
}

void ect_push_scheduler_stats(ect_push_scheduler *s, ect_push_scheduler_stat *st) {
    *st = s->st;
    int ports[XFER_MAX_SHARDS];
    st->shards = (uint32_t)inbox_shards(s->in, ports, XFER_MAX_SHARDS);
    st->bad_frames += inbox_bad_frames(s->in);
    xfer_stats xs;
    xfer_get_stats(s->t, &xs);
    st->live = xs.live;
    st->tombstones = xs.tombstones;
    st->late_events = xs.late_events;
}
