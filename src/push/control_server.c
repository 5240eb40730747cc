/*
 * control_server — REP + PUSH thread over the reservation table. The
 * handler (ctl_server_handle) is the only place that turns decoded requests
 * into table calls and table answers into replies; the thread only moves
 * frames, runs the reaper and drains the event queue. The lock is held for
 * table calls and for encoding what they return, never across zmq_send or
 * zmq_recv, so the consumer's take/release never wait on the network.
 *
 * Refusals: every reserve the shard refuses is counted by class (pool full,
 * tombstoned transfer_id, conflict, active writer, bad request, other) and
 * each class is logged at most once a second, with the count since its last
 * line and the latest text as the example, so an operator sees what a busy
 * shard turns away without a line per item. Expiries the reaper makes are
 * logged the same way. The wire replies themselves are upstream's texts.
 */
#include "push/control_server.h"
#include "push/control_listener.h"
#include "push/peer_guard.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <uthash.h>
#include <zmq.h>

#include "util/hostport.h"
#include "util/spares.h"
#include "util/util.h"
#include "util/zauth.h"
#include "wire/control_msg.h"

#define MOD "ctlsrv"
#define LOG_EVERY_MS 1000
static int do_ready(ctl_server *s, const wire_ctl_request *q, uint64_t now, wire_ctl_reply *rep);

enum { RF_FULL, RF_TOMB, RF_CONFLICT, RF_BUSY, RF_INVALID, RF_OTHER, RF_N };

static const char *const rf_what[RF_N] = {
    "EC consumer buffer pool is full (producers wait and retry)",
    "transfer_id refused: answered `cancelled`",
    "conflict",
    "reservation still has an active writer",
    "bad request",
    "other",
};

/* One refusal class: touched by the handling thread only; totals atomic. */
typedef struct refusal {
    uint64_t window;  /* since the last log line */
    uint64_t last_ms; /* when that line went out */
    char example[240];
    atomic_uint_fast64_t total;
} refusal;

/* An open write window: the writer reservation it belongs to and its key. */
typedef struct ctl_window {
    char transfer_id[RSV_KEY_MAX + 1];
    char reservation_id[ECT_ID_LEN + 1];
    char key[ECT_XPORT_KEY_MAX];
    UT_hash_handle hh;       /* by transfer_id */
    struct ctl_window *next; /* on the spare list */
} ctl_window;

#define SPARE_WINDOWS 64 /* closed windows kept for reuse: no malloc per item */
/* The spares grow with the most windows open at once, up to this: a shard
 * with k steps of n items in flight reuses k x n entries each round. */
#define SPARE_WINDOWS_MAX 1024

struct ctl_server {
    ctl_server_opts o;
    ctl_window *wins;    /* guarded by mu */
    ctl_window *spare_wins; /* [mu] the spares' windows, by reservation_id (their id) */
    uint64_t swept_spares;  /* [mu] the table's spares_dropped at the last spare sweep */
    ctl_window *closing; /* [mu] dropped, keys not closed yet (close_pending) */
    ect_spares spare;    /* [mu] closed windows for reuse */
    char ip[256], session[WIRE_SESSION_MAX + 1], transport[WIRE_TRANSPORT_MAX + 1];
    char advertise[256];
    /* The peer of the request being handled ("" unknown) and the session
     * last told to a peer, cached per peer (the handling thread only). */
    char peer[64], told_peer[64], told[WIRE_SESSION_MAX + 1];
    char who[64]; /* the peer in canonical form: reservation owners (peer_guard.h) */
    peer_guard *guard;
    char *dst_key;
    pthread_mutex_t mu;
    rsv_table *tab;
    void *rep, *push;
    ctl_listener *lst; /* the control port without CURVE: our own ZMTP listener, else rep */
    int port, event_port;
    char event_secret[WIRE_SECRET_MAX + 1]; /* "" unless the event port asks PLAIN */
    pthread_t thr;
    bool thr_started;
    atomic_bool stop;
    atomic_uint_fast64_t events_sent, bad_requests;
    refusal rf[RF_N];
    uint64_t seen_expired_ready, seen_expired_writing, seen_abandoned; /* reaper log */
    uint64_t expiry_log_ms;
    uint64_t swept_expired; /* [mu] the table's expired_writing at the last full sweep */
    atomic_uint_fast64_t bytes_in, items_in, requests; /* metrics */
    atomic_uint_fast64_t window_entries;               /* window entries malloc'd */
    ctl_error last_err[CTL_LAST_ERRORS];               /* [mu] newest at last_err_head - 1 */
    size_t last_err_head, last_err_n;                  /* [mu] */
    /* A batch's request items and reply items, kept from one request to the
     * next: no item array allocated, nor fresh pages zeroed, per request.
     * Whoever holds keep_mu uses them; a request handled at the same time on
     * another thread (ctl_server_handle is thread-safe) uses the heap. */
    pthread_mutex_t keep_mu;
    wire_ctl_keep req_keep, rep_keep;
};

void ctl_server_opts_init(ctl_server_opts *o) {
    memset(o, 0, sizeof *o);
    o->ip = "127.0.0.1";
    o->tp_size = 1;
    o->reap_interval_ms = CTL_DEFAULT_REAP_INTERVAL_MS;
    o->poll_ms = CTL_DEFAULT_POLL_MS;
    rsv_opts_init(&o->rsv);
}

/* ------------------------------------------------------------- handler */

static void fill_tensor(wire_tensor *t, uint64_t nbytes, const uint64_t *shape, size_t ndim,
                        const char *dtype) {
    t->nbytes = nbytes;
    t->ndim = (uint32_t)ndim;
    memcpy(t->shape, shape, ndim * sizeof *shape);
    ect_strcpy_cut(t->dtype, sizeof t->dtype, dtype);
}

/* The data-plane session this request's peer is told: the bound one with
 * its host replaced by the advertised host, or, for a wildcard bind, by the
 * local address that routes to the peer (never 0.0.0.0). Handling thread. */
static const char *told_session(ctl_server *s) {
    if (s->told[0] && strcmp(s->told_peer, s->peer) == 0) return s->told;
    if (ect_session_advertise(s->session, s->advertise, s->peer[0] ? s->peer : NULL, s->told,
                              sizeof s->told) != 0) {
        ect_clear_error();
        ect_strcpy_cut(s->told, sizeof s->told, s->session);
    }
    ect_strcpy_cut(s->told_peer, sizeof s->told_peer, s->peer);
    return s->told;
}

/* Counts a refusal of class k; the text is kept as the example. Caller: the
 * handling thread. */
static void refused(ctl_server *s, int k, const char *text) {
    refusal *f = &s->rf[k];
    f->window++;
    atomic_fetch_add(&f->total, 1);
    snprintf(f->example, sizeof f->example, "%.200s", text);
    if (k == RF_FULL) return; /* back-pressure, not an error worth a status line */
    ctl_error *e = &s->last_err[s->last_err_head];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    e->realtime_ms = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
    snprintf(e->text, sizeof e->text, "%.200s", text);
    s->last_err_head = (s->last_err_head + 1) % CTL_LAST_ERRORS;
    if (s->last_err_n < CTL_LAST_ERRORS) s->last_err_n++;
}

static int refusal_class(int rc) {
    switch (rc) {
    case ECT_EFULL: return RF_FULL;
    case ECT_EEXIST: return RF_CONFLICT;
    case ECT_EBUSY: return RF_BUSY;
    case ECT_EINVAL:
    case ECT_EOVERFLOW: return RF_INVALID;
    default: return RF_OTHER;
    }
}

/* Logs each class with refusals in its window once LOG_EVERY_MS passed since
 * its last line. Called without the table lock (the handling thread). */
static void log_refusals(ctl_server *s, uint64_t now) {
    for (int k = 0; k < RF_N; k++) {
        refusal *f = &s->rf[k];
        if (!f->window || now - f->last_ms < LOG_EVERY_MS) continue;
        double secs = f->last_ms ? (double)(now - f->last_ms) / 1000.0 : 1.0;
        ECT_LOGW(MOD, "shard %d: refused %" PRIu64 " reserve(s) in the last %.1f s: %s; latest: %s",
                 s->port, f->window, secs > 1e6 ? 1.0 : secs, rf_what[k], f->example);
        f->window = 0;
        f->last_ms = now;
    }
}

/* Logs what the reaper ended since the last line (at most once a second). */
static void log_expiries(ctl_server *s, uint64_t now) {
    if (now - s->expiry_log_ms < LOG_EVERY_MS) return;
    rsv_stats st;
    pthread_mutex_lock(&s->mu);
    rsv_get_stats(s->tab, &st);
    pthread_mutex_unlock(&s->mu);
    uint64_t r = st.expired_ready - s->seen_expired_ready;
    uint64_t w = st.expired_writing - s->seen_expired_writing;
    uint64_t a = st.abandoned - s->seen_abandoned;
    if (r || w)
        ECT_LOGW(MOD,
                 "shard %d: %" PRIu64 " reservation(s) expired: %" PRIu64
                 " READY but never taken and released within the TTL, %" PRIu64
                 " writer(s) silent past the TTL",
                 s->port, r + w, r, w);
    if (a) ECT_LOGI(MOD, "shard %d: %" PRIu64 " transfer(s) abandoned by producers", s->port, a);
    s->seen_expired_ready = st.expired_ready;
    s->seen_expired_writing = st.expired_writing;
    s->seen_abandoned = st.abandoned;
    s->expiry_log_ms = now;
}

/* A window entry: a spare one, else a new one (NULL out of memory). */
static ctl_window *window_new(ctl_server *s) {
    ctl_window *w = ect_spares_get(&s->spare);
    if (w) return w;
    atomic_fetch_add(&s->window_entries, 1);
    return malloc(sizeof *w); /* not calloc: the key alone is 2 KiB, set by the caller */
}

/* Gives w back: kept as a spare up to SPARE_WINDOWS, else freed. */
static void window_put(ctl_server *s, ctl_window *w) { ect_spares_put(&s->spare, w); }

/* Takes w off the open windows; its key is closed by the next
 * close_pending, with the others the same request dropped. Under mu. */
static void drop_window(ctl_server *s, ctl_window *w) {
    HASH_DEL(s->wins, w);
    w->next = s->closing;
    s->closing = w;
}

#define CLOSE_CHUNK 64

/* Closes the keys of every dropped window, CLOSE_CHUNK at a time through
 * win_close_many (one lock of the transport's table), else win_close each,
 * and keeps the entries as spares. Under mu, before mu is let go and before
 * a window opens: a window never outlives the request that ended its
 * reservation, and a range is free again before it is reused. */
static void close_pending(ctl_server *s) {
    while (s->closing) {
        const char *keys[CLOSE_CHUNK];
        ctl_window *got[CLOSE_CHUNK];
        size_t n = 0;
        for (; s->closing && n < CLOSE_CHUNK; n++) {
            got[n] = s->closing;
            keys[n] = got[n]->key;
            s->closing = got[n]->next;
        }
        if (s->o.win_close_many)
            s->o.win_close_many(s->o.win_ctx, keys, n);
        else if (s->o.win_close)
            for (size_t i = 0; i < n; i++) s->o.win_close(s->o.win_ctx, keys[i]);
        for (size_t i = 0; i < n; i++) window_put(s, got[i]);
    }
}

/* True while w's reservation (st, found: rc 0) is still the WRITING writer
 * with the reservation id the window was opened for. */
static bool window_writable(const ctl_window *w, int found, const rsv_brief *st) {
    return found == 0 && st->state == RSV_WRITING && st->writer &&
           strcmp(st->reservation_id, w->reservation_id) == 0;
}

/* Closes every window whose reservation is no longer writable. Under mu;
 * after each reap and whenever the table expired writers on its own (its
 * reserve reaps too): notes the expiry count it has seen. */
static void sweep_windows(ctl_server *s) {
    ctl_window *w, *tmp;
    HASH_ITER(hh, s->wins, w, tmp) {
        rsv_brief st;
        if (!window_writable(w, rsv_brief_get(s->tab, w->transfer_id, &st), &st)) drop_window(s, w);
    }
    rsv_stats rs;
    rsv_get_stats(s->tab, &rs);
    s->swept_expired = rs.expired_writing;
}

/* Takes a spare's window off spare_wins; closed by the next close_pending. */
static void drop_spare_window(ctl_server *s, ctl_window *w) {
    HASH_DEL(s->spare_wins, w);
    w->next = s->closing;
    s->closing = w;
}

/* Closes the window of every spare the table no longer holds (expired,
 * freed for a reserve, replaced), when it dropped one since the last look.
 * Under mu; before any window opens (a freed range may be granted again). */
static void sweep_spares(ctl_server *s) {
    rsv_stats rs;
    rsv_get_stats(s->tab, &rs);
    if (rs.spares_dropped == s->swept_spares) return;
    s->swept_spares = rs.spares_dropped;
    ctl_window *w, *tmp;
    HASH_ITER(hh, s->spare_wins, w, tmp) {
        if (!rsv_spare_held(s->tab, w->reservation_id)) drop_spare_window(s, w);
    }
}

static void close_all_windows(ctl_server *s) {
    ctl_window *w, *tmp;
    HASH_ITER(hh, s->wins, w, tmp) drop_window(s, w);
    HASH_ITER(hh, s->spare_wins, w, tmp) drop_spare_window(s, w);
}

/* What a request did to transfer_id, once the table answered. A writer
 * that became READY (nbytes: its size, from the guard's lookup before the
 * op) is counted and its window closed, with no lookup: it is no longer
 * WRITING. Else a window of transfer_id is closed when its reservation is
 * no longer writable: one lookup, none when it has no window. Under mu. */
static void settle_id(ctl_server *s, const char *transfer_id, bool became_ready, uint64_t nbytes) {
    ctl_window *w = NULL;
    if (s->wins) HASH_FIND_STR(s->wins, transfer_id, w);
    if (became_ready) {
        atomic_fetch_add(&s->bytes_in, nbytes);
        atomic_fetch_add(&s->items_in, 1);
        if (w) drop_window(s, w);
        return;
    }
    rsv_brief st;
    if (w && !window_writable(w, rsv_brief_get(s->tab, transfer_id, &st), &st)) drop_window(s, w);
}

/* After a request that may have changed states: a writer leaves WRITING
 * only by an op naming it (settle_id) or by the table's reaper, which
 * counts it (expired_writing): a count moved since the last sweep sweeps
 * every window, so a window lives exactly while its reservation is
 * writable, with table lookups per named item rather than per request and
 * open window. Under mu. */
static void settle_expired(ctl_server *s) {
    if (!s->wins) return;
    rsv_stats rs;
    rsv_get_stats(s->tab, &rs);
    if (rs.expired_writing != s->swept_expired) sweep_windows(s);
}

/* Opens the window of a reservation told to write; *key points at its key.
 * On failure the reservation is abandoned again (nothing stays held) and the
 * error is set: ECT_EFULL when the transport has no room for another window. */
static int open_window(ctl_server *s, const char *transfer_id, const rsv_reply *rep, uint64_t now,
                       const char **key) {
    *key = s->dst_key;
    if (!s->o.win_open) return 0;
    ctl_window *w;
    HASH_FIND_STR(s->wins, transfer_id, w);
    if (w) drop_window(s, w); /* a stale entry: replace it */
    sweep_spares(s);          /* a spare freed for this reserve: its window goes first */
    close_pending(s);         /* what this request ended frees its range first */
    int rc = ECT_ENOMEM;
    if ((w = window_new(s))) {
        memset(&w->hh, 0, sizeof w->hh);
        w->key[0] = '\0';
        ect_strcpy_cut(w->transfer_id, sizeof w->transfer_id, transfer_id);
        ect_strcpy_cut(w->reservation_id, sizeof w->reservation_id, rep->reservation_id);
        rc = s->o.win_open(s->o.win_ctx, rep->offset, rep->nbytes, w->key);
    }
    if (rc) {
        char why[300];
        ect_strcpy_cut(why, sizeof why, w ? ect_last_error() : "out of memory");
        if (w) window_put(s, w);
        bool cancelled;
        (void)rsv_cancel(s->tab, transfer_id, rep->reservation_id, true, false, now, &cancelled);
        return ect_set_error(rc == ECT_ENOMEM ? ECT_ENOMEM : ECT_EFULL,
                             "EC consumer buffer pool is full: no write window for "
                             "transfer_id '%.64s' (%s)",
                             transfer_id, why);
    }
    HASH_ADD_STR(s->wins, transfer_id, w);
    size_t open_now = HASH_COUNT(s->wins);
    if (open_now > s->spare.max && open_now <= SPARE_WINDOWS_MAX) s->spare.max = open_now;
    *key = w->key;
    return 0;
}

/* ECT_EACCES (with the reply's text set) when transfer_id names a live
 * reservation of another peer that this request's peer may not `act` on;
 * else 0 (unknown ids and tombstones: no owner to protect). *nbytes (when
 * not NULL): the reservation's size, 0 unknown. Under the lock. */
static int guard_live(ctl_server *s, pg_act act, const char *transfer_id, uint64_t *nbytes) {
    rsv_brief st;
    int found = rsv_brief_get(s->tab, transfer_id, &st);
    if (nbytes) *nbytes = found == 0 ? st.nbytes : 0;
    if (found != 0 || st.state == RSV_CANCELLED || st.state == RSV_EXPIRED ||
        pg_allow(s->guard, act, s->who, st.owner, transfer_id))
        return 0;
    if (act == PG_RESERVE)
        return ect_set_error(ECT_EEXIST,
                             "conflicting reservation for transfer_id '%.64s': " CTL_NOT_OWNER,
                             transfer_id);
    return ect_set_error(ECT_EACCES, "transfer_id '%.64s': " CTL_NOT_OWNER, transfer_id);
}

/* The table's request for a reserve's fields (reserve, a reserve_batch
 * item, ect_put), owned by the requesting peer. Borrows r's strings. */
static rsv_request rsv_request_of(const ctl_server *s, const wire_reserve_req *r) {
    return (rsv_request){.transfer_id = r->transfer_id,
                         .mm_hash = r->mm_hash,
                         .nbytes = r->tensor.nbytes,
                         .shape = r->tensor.shape,
                         .ndim = r->tensor.ndim,
                         .dtype = r->tensor.dtype,
                         .owner = s->who};
}

/* One reserve under the lock; on failure *err is the text for the reply. */
static int do_reserve(ctl_server *s, const wire_reserve_req *r, uint64_t now,
                      wire_reserve_result *res) {
    rsv_request q = rsv_request_of(s, r);
    rsv_reply rep;
    memset(res, 0, sizeof *res);
    int rc = guard_live(s, PG_RESERVE, r->transfer_id, NULL);
    if (!rc) rc = rsv_reserve(s->tab, &q, now, &rep);
    if (rc) {
        refused(s, refusal_class(rc), ect_last_error());
        return rc;
    }
    if (rep.cancelled) {
        res->cancelled = true;
        if (rep.why == RSV_END_FINISHED || rep.why == RSV_END_ABANDONED ||
            rep.why == RSV_END_EXPIRED || rep.why == RSV_END_CANCELLED)
            snprintf(res->reason, sizeof res->reason,
                     "transfer_id '%.64s' was %s %" PRIu64 " ms ago; ids are kept %" PRIu64
                     " ms (TTL): use a new one",
                     r->transfer_id, rsv_end_text(rep.why), rep.ended_ms_ago, s->o.rsv.ttl_ms);
        else
            snprintf(res->reason, sizeof res->reason, "transfer_id '%.64s' was %s", r->transfer_id,
                     rsv_end_text(rep.why));
        refused(s, RF_TOMB, res->reason);
        return 0;
    }
    const char *key = s->dst_key;
    if (rep.write && (rc = open_window(s, r->transfer_id, &rep, now, &key)) != 0) {
        refused(s, refusal_class(rc), ect_last_error());
        return rc;
    }
    if (key && !(res->dst_key = strdup(key))) {
        bool cancelled;
        if (rep.write)
            (void)rsv_cancel(s->tab, r->transfer_id, rep.reservation_id, true, false, now,
                             &cancelled);
        settle_id(s, r->transfer_id, false, 0);
        return ect_set_error(ECT_ENOMEM, "EC consumer out of memory");
    }
    ect_strcpy_cut(res->reservation_id, sizeof res->reservation_id, rep.reservation_id);
    ect_strcpy_cut(res->dst_session, sizeof res->dst_session, told_session(s));
    res->dst_ptr = s->o.pool_base + rep.offset;
    res->nbytes = rep.nbytes;
    res->write = rep.write;
    res->ready = rep.ready;
    res->cached = rep.cached;
    ect_strcpy_cut(res->transport, sizeof res->transport, s->transport);
    return 0;
}

/* The ect_status result (docs/PROTOCOL.md, extension) as compact JSON text,
 * or NULL when out of memory. Under the lock. */
static char *status_json(ctl_server *s) {
    rsv_stats st;
    rsv_get_stats(s->tab, &st);
    uint64_t counts[RSV_EXPIRED + 1];
    rsv_count_states(s->tab, counts);
    json_t *o = json_object(), *pool = json_object(), *rs = json_object(), *peers = json_array(),
           *ev = json_object(), *rf = json_object(), *errs = json_array();
    int base = s->o.base_port ? s->o.base_port : s->port - s->o.tp_rank;
    int n = (s->o.base_port || s->o.port) ? s->o.tp_size : 1;
    if (!s->o.base_port && !s->o.port) base = s->port;
    json_object_set_new(o, "shard", json_integer(s->o.tp_rank));
    json_object_set_new(o, "tp_size", json_integer(s->o.tp_size));
    json_object_set_new(o, "port", json_integer(s->port));
    json_object_set_new(o, "transport", json_string(s->transport));
    json_object_set_new(pool, "capacity", json_integer((json_int_t)s->o.rsv.capacity));
    json_object_set_new(pool, "used", json_integer((json_int_t)st.bytes_held));
    json_object_set_new(pool, "resident", json_integer((json_int_t)st.published_bytes));
    json_object_set_new(pool, "spares", json_integer((json_int_t)st.spares));
    json_object_set_new(pool, "spare_bytes", json_integer((json_int_t)st.spare_bytes));
    json_object_set_new(o, "pool", pool);
    for (int k = RSV_WRITING; k <= RSV_EXPIRED; k++)
        json_object_set_new(rs, rsv_state_name((rsv_state)k), json_integer((json_int_t)counts[k]));
    json_object_set_new(o, "reservations", rs);
    for (int i = 0; i < n; i++) json_array_append_new(peers, json_integer(base + i));
    json_object_set_new(o, "peers", peers);
    json_object_set_new(ev, "queued", json_integer((json_int_t)st.events));
    json_object_set_new(ev, "sent", json_integer((json_int_t)atomic_load(&s->events_sent)));
    json_object_set_new(ev, "dropped", json_integer((json_int_t)st.events_dropped));
    json_object_set_new(o, "events", ev);
    static const char *const rf_name[RF_N] = {"full", "cancelled", "conflict",
                                              "busy", "invalid",   "other"};
    for (int k = 0; k < RF_N; k++)
        json_object_set_new(rf, rf_name[k], json_integer((json_int_t)atomic_load(&s->rf[k].total)));
    json_object_set_new(o, "refused", rf);
    for (size_t i = 0; i < s->last_err_n; i++) {
        const ctl_error *e =
            &s->last_err[(s->last_err_head + CTL_LAST_ERRORS - 1 - i) % CTL_LAST_ERRORS];
        char when[32];
        json_t *je = json_object();
        json_object_set_new(je, "time",
                            json_string(ect_rfc3339_ms(e->realtime_ms, when, sizeof when)));
        json_object_set_new(je, "error", json_string(e->text));
        json_array_append_new(errs, je);
    }
    json_object_set_new(o, "errors", errs);
    json_t *pr = json_object(); /* requests refused as another peer's (peer_guard.h) */
    static const char *const pg_name[PG_N] = {"complete", "cancel", "status", "reserve", "ready"};
    for (int k = 0; k < PG_N; k++)
        json_object_set_new(pr, pg_name[k],
                            json_integer((json_int_t)pg_refused(s->guard, (pg_act)k)));
    json_object_set_new(o, "peer_refused", pr);
    char *txt = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    return txt;
}

static void out_of_memory(int *rc, char *errtext) {
    *rc = ECT_ENOMEM;
    snprintf(errtext, WIRE_ERROR_MAX + 1, "EC consumer out of memory");
}

/* n zeroed reply items of `size` bytes, or NULL with the error set: in
 * keep's memory when keep is not NULL (wire_ctl_reply_clear_kept). */
static void *reply_items(size_t n, size_t size, wire_ctl_keep *keep, int *rc, char *errtext) {
    size_t bytes = (n ? n : 1) * size;
    void *items = keep ? (wire_ctl_keep_reserve(keep, bytes) ? keep->mem : NULL) : calloc(1, bytes);
    if (!items) out_of_memory(rc, errtext);
    else if (keep) memset(items, 0, bytes);
    return items;
}

/* Offers the windows a reserve or reserve_batch that named its producer's
 * shm connection ("ect_shm_id") opened, in messages of at most
 * CTL_OFFER_MAX, before the reply goes out. Under mu. */
#define CTL_OFFER_MAX 250
static void offer_windows(ctl_server *s, const wire_ctl_request *q, const wire_ctl_reply *rep) {
    const char *keys[CTL_OFFER_MAX];
    size_t n = 0;
    if (!q->shm_id || !s->o.win_offer) return;
    if (q->op == WIRE_OP_RESERVE && rep->u.reserve.write && rep->u.reserve.dst_key)
        keys[n++] = rep->u.reserve.dst_key;
    if (rep->has_spare && rep->spare.dst_key) keys[n++] = rep->spare.dst_key;
    for (size_t i = 0; q->op == WIRE_OP_RESERVE_BATCH && i < rep->u.reserve_batch.n; i++) {
        const wire_reserve_outcome *oc = &rep->u.reserve_batch.items[i];
        if (!oc->ok || !oc->result.write || !oc->result.dst_key) continue;
        keys[n++] = oc->result.dst_key;
        if (n == CTL_OFFER_MAX) {
            s->o.win_offer(s->o.win_ctx, q->shm_id, keys, n);
            n = 0;
        }
    }
    if (n) s->o.win_offer(s->o.win_ctx, q->shm_id, keys, n);
}

/* Grants the spare a reserve, reserve_batch or ect_put asked for
 * ("ect_spare", docs/PROTOCOL.md "a spare range granted ahead") into
 * rep->spare, with a window of its own; nothing when the pool has no free
 * range without reclaiming (the reply then has no "ect_spare"). Under mu. */
/* A spare's owner: the peer's address, and the producer's id when the
 * request names one (ect_shm_id), so producers on one host hold one each. */
static void spare_owner(const ctl_server *s, const wire_ctl_request *q,
                        char out[RSV_OWNER_MAX + 1]) {
    char h[17];
    ect_strcpy_cut(out, RSV_OWNER_MAX + 1, s->who);
    if (!q->shm_id) return;
    wctl_shm_id_format(q->shm_id, h);
    ect_strcat_cut(out, RSV_OWNER_MAX + 1, "#");
    ect_strcat_cut(out, RSV_OWNER_MAX + 1, h);
}

static void grant_spare(ctl_server *s, const wire_ctl_request *q, uint64_t now,
                        wire_ctl_reply *rep) {
    rsv_reply rr;
    char owner[RSV_OWNER_MAX + 1];
    spare_owner(s, q, owner);
    if (!q->spare || rsv_spare_grant(s->tab, owner, q->spare, now, &rr)) return;
    sweep_spares(s); /* the peer's previous spare, replaced */
    const char *key = s->dst_key;
    ctl_window *w = NULL;
    int rc = 0;
    if (s->o.win_open) {
        close_pending(s);
        rc = ECT_ENOMEM;
        if ((w = window_new(s))) {
            memset(&w->hh, 0, sizeof w->hh);
            w->key[0] = w->transfer_id[0] = '\0';
            ect_strcpy_cut(w->reservation_id, sizeof w->reservation_id, rr.reservation_id);
            rc = s->o.win_open(s->o.win_ctx, rr.offset, rr.nbytes, w->key);
        }
        if (!rc) {
            HASH_ADD_STR(s->spare_wins, reservation_id, w);
            key = w->key;
        } else if (w) {
            window_put(s, w);
        }
    }
    if (!rc && key && !(rep->spare.dst_key = strdup(key))) rc = ECT_ENOMEM;
    if (rc) { /* no window or no memory: no spare (its window, if any, closes) */
        (void)rsv_spare_free(s->tab, rr.reservation_id);
        sweep_spares(s);
        return;
    }
    wire_reserve_result *sp = &rep->spare;
    ect_strcpy_cut(sp->reservation_id, sizeof sp->reservation_id, rr.reservation_id);
    ect_strcpy_cut(sp->dst_session, sizeof sp->dst_session, told_session(s));
    sp->dst_ptr = s->o.pool_base + rr.offset;
    sp->nbytes = rr.nbytes;
    sp->write = true;
    ect_strcpy_cut(sp->transport, sizeof sp->transport, s->transport);
    rep->has_spare = true;
}

/* ect_put: binds the peer's spare to the item (the plain case only,
 * rsv_spare_bind), moves the spare's window to it and completes it, as a
 * complete would. On failure nothing changed and the error is set. Under mu. */
static int do_put(ctl_server *s, const wire_ctl_request *q, uint64_t now,
                  wire_complete_result *res) {
    const wire_reserve_req *r = &q->u.put.item;
    rsv_request rq = rsv_request_of(s, r);
    char owner[RSV_OWNER_MAX + 1];
    spare_owner(s, q, owner);
    rsv_reply rr;
    int rc = rsv_spare_bind(s->tab, q->u.put.spare_id, owner, &rq, now, &rr);
    if (rc) return rc;
    ctl_window *w = NULL, *old = NULL;
    HASH_FIND_STR(s->spare_wins, q->u.put.spare_id, w);
    if (w) { /* the window is the item's now: closed as a completed writer's */
        HASH_DEL(s->spare_wins, w);
        memset(&w->hh, 0, sizeof w->hh);
        ect_strcpy_cut(w->transfer_id, sizeof w->transfer_id, r->transfer_id);
        HASH_FIND_STR(s->wins, r->transfer_id, old);
        if (old) drop_window(s, old);
        HASH_ADD_STR(s->wins, transfer_id, w);
    }
    rsv_complete(s->tab, r->transfer_id, rr.reservation_id, now, &res->completed,
                 &res->became_ready);
    settle_id(s, r->transfer_id, res->became_ready, r->tensor.nbytes);
    return 0;
}

static int handle_decoded(ctl_server *s, const wire_ctl_request *q, uint64_t now,
                          wire_ctl_keep *keep, char **reply) {
    wire_ctl_reply rep;
    memset(&rep, 0, sizeof rep);
    rep.op = q->op;
    rep.ok = true;
    int rc = 0;
    char errtext[WIRE_ERROR_MAX + 1] = "";
    pthread_mutex_lock(&s->mu);
    switch (q->op) {
    case WIRE_OP_RESERVE:
        rc = do_reserve(s, &q->u.reserve, now, &rep.u.reserve);
        if (rc) ect_strcpy_cut(errtext, sizeof errtext, ect_last_error());
        break;
    case WIRE_OP_RESERVE_BATCH: {
        size_t n = q->u.reserve_batch.n;
        rep.u.reserve_batch.items =
            reply_items(n, sizeof *rep.u.reserve_batch.items, keep, &rc, errtext);
        if (!rep.u.reserve_batch.items) break;
        rep.u.reserve_batch.n = n;
        for (size_t i = 0; i < n; i++) {
            const wire_reserve_item *it = &q->u.reserve_batch.items[i];
            wire_reserve_outcome *oc = &rep.u.reserve_batch.items[i];
            if (it->rc) {
                refused(s, RF_INVALID, it->error);
                oc->error = strdup(it->error);
            } else if (do_reserve(s, &it->req, now, &oc->result) == 0) {
                oc->ok = true;
                continue;
            } else {
                oc->error = strdup(ect_last_error());
            }
            if (!oc->error) {
                out_of_memory(&rc, errtext);
                break;
            }
        }
        break;
    }
    case WIRE_OP_STATUS: {
        rsv_status st;
        if (rsv_status_get(s->tab, q->u.status.transfer_id, &st) == 0 &&
            st.state != RSV_CANCELLED && st.state != RSV_EXPIRED) {
            wire_status_result *r = &rep.u.status;
            r->found = true;
            ect_strcpy_cut(r->mm_hash, sizeof r->mm_hash, st.mm_hash);
            r->ready = st.ready;
            /* The id is the reserver's capability: others see "" (peer_guard.h). */
            if (pg_allow(s->guard, PG_STATUS, s->who, st.owner, q->u.status.transfer_id))
                ect_strcpy_cut(r->reservation_id, sizeof r->reservation_id, st.reservation_id);
            fill_tensor(&r->tensor, st.nbytes, st.shape, st.ndim, st.dtype);
        }
        break;
    }
    case WIRE_OP_EVENT_PORT:
        if (s->event_port <= 0) {
            rc = ECT_ESTATE;
            snprintf(errtext, sizeof errtext, "event port not bound (detached shard)");
        }
        rep.u.event_port = (uint16_t)s->event_port;
        snprintf(rep.event_secret, sizeof rep.event_secret, "%s", s->event_secret);
        break;
    case WIRE_OP_PEERS: {
        int base = s->o.base_port ? s->o.base_port : s->port - s->o.tp_rank;
        size_t n = (s->o.base_port || s->o.port) ? (size_t)s->o.tp_size : 1;
        if (!s->o.base_port && !s->o.port) base = s->port;
        rep.u.peers.ports = reply_items(n, sizeof *rep.u.peers.ports, NULL, &rc, errtext);
        if (!rep.u.peers.ports) break;
        rep.u.peers.n = n;
        ect_strcpy_cut(rep.u.peers.transport, sizeof rep.u.peers.transport, s->transport);
        for (size_t i = 0; i < n; i++) rep.u.peers.ports[i] = (uint16_t)(base + (int)i);
        if (base < 1 || base + (int)n - 1 > 65535) {
            rc = ECT_ESTATE;
            snprintf(errtext, sizeof errtext, "control port unknown (detached shard)");
        }
        break;
    }
    case WIRE_OP_COMPLETE: {
        uint64_t nbytes;
        if ((rc = guard_live(s, PG_COMPLETE, q->u.complete.transfer_id, &nbytes))) {
            snprintf(errtext, sizeof errtext, "%s", ect_last_error());
            break;
        }
        rsv_complete(s->tab, q->u.complete.transfer_id, q->u.complete.reservation_id, now,
                     &rep.u.complete.completed, &rep.u.complete.became_ready);
        settle_id(s, q->u.complete.transfer_id, rep.u.complete.became_ready, nbytes);
        break;
    }
    case WIRE_OP_COMPLETE_BATCH: {
        size_t n = q->u.complete_batch.n;
        rep.u.complete_batch.items =
            reply_items(n, sizeof *rep.u.complete_batch.items, keep, &rc, errtext);
        if (!rep.u.complete_batch.items) break;
        rep.u.complete_batch.n = n;
        for (size_t i = 0; i < n; i++) { /* another peer's item: (false, false), counted */
            const wire_complete_req *it = &q->u.complete_batch.items[i];
            wire_complete_result *res = &rep.u.complete_batch.items[i];
            uint64_t nbytes;
            if (guard_live(s, PG_COMPLETE, it->transfer_id, &nbytes)) continue;
            rsv_complete(s->tab, it->transfer_id, it->reservation_id, now, &res->completed,
                         &res->became_ready);
            settle_id(s, it->transfer_id, res->became_ready, nbytes);
        }
        break;
    }
    case WIRE_OP_CANCEL: {
        const wire_cancel_req *c = &q->u.cancel;
        if ((rc = guard_live(s, PG_CANCEL, c->transfer_id, NULL))) {
            snprintf(errtext, sizeof errtext, "%s", ect_last_error());
            break;
        }
        rc = rsv_cancel(s->tab, c->transfer_id, c->reservation_id, c->abandon, c->refresh, now,
                        &rep.u.cancelled);
        if (rc) ect_strcpy_cut(errtext, sizeof errtext, ect_last_error());
        settle_id(s, c->transfer_id, false, 0);
        break;
    }
    case WIRE_OP_ECT_READY:
        if ((rc = do_ready(s, q, now, &rep)))
            ect_strcpy_cut(errtext, sizeof errtext, ect_last_error());
        break;
    case WIRE_OP_ECT_STATUS:
        if (!(rep.u.ect_status = status_json(s))) out_of_memory(&rc, errtext);
        break;
    case WIRE_OP_ECT_PUT:
        rc = do_put(s, q, now, &rep.u.complete);
        if (rc) {
            ect_strcpy_cut(errtext, sizeof errtext, ect_last_error());
            ECT_LOGD(MOD, "shard %d: %s", s->port, errtext);
        }
        break;
    default:
        rc = ECT_ENOTSUP;
        snprintf(errtext, sizeof errtext, "unknown control op: '%d'", (int)q->op);
        break;
    }
    if (!rc) grant_spare(s, q, now, &rep);
    settle_expired(s);
    sweep_spares(s);
    close_pending(s);
    if (!rc) offer_windows(s, q, &rep);
    pthread_mutex_unlock(&s->mu);
    if (q->op == WIRE_OP_RESERVE || q->op == WIRE_OP_RESERVE_BATCH) log_refusals(s, now);
    int erc;
    if (rc) {
        erc = wire_ctl_encode_error(errtext, reply);
    } else {
        erc = wire_ctl_encode_reply(&rep, reply);
        if (erc && erc != ECT_ENOMEM) { /* our own result refused: say so, never go silent */
            char why[512];
            snprintf(why, sizeof why, "EC consumer could not encode its reply: %s",
                     ect_last_error());
            ECT_LOGE(MOD, "%s", why);
            erc = wire_ctl_encode_error(why, reply);
        }
    }
    wire_ctl_reply_clear_kept(&rep, keep); /* dst_key is a copy (a window may close) */
    return erc;
}

int ctl_server_handle(ctl_server *s, const void *buf, size_t len, uint64_t now_ms, char **reply) {
    *reply = NULL;
    atomic_fetch_add(&s->requests, 1);
    wire_ctl_request q;
    bool kept = pthread_mutex_trylock(&s->keep_mu) == 0;
    wire_ctl_keep *req_keep = kept ? &s->req_keep : NULL, *rep_keep = kept ? &s->rep_keep : NULL;
    int rc = wire_ctl_decode_request_kept(buf, len, &q, req_keep);
    if (rc) {
        if (kept) pthread_mutex_unlock(&s->keep_mu);
        atomic_fetch_add(&s->bad_requests, 1);
        ECT_LOGD(MOD, "refused request: %s", ect_last_error());
        return wire_ctl_encode_decode_failure(rc, reply);
    }
    if (q.op == WIRE_OP_RESERVE_BATCH || q.op == WIRE_OP_COMPLETE_BATCH)
        ECT_LOGD(MOD, "shard %d: %s of %zu item(s)", s->port, wire_ctl_op_name(q.op),
                 q.op == WIRE_OP_RESERVE_BATCH ? q.u.reserve_batch.n : q.u.complete_batch.n);
    else
        ECT_LOGD(MOD, "shard %d: %s", s->port, wire_ctl_op_name(q.op));
    rc = handle_decoded(s, &q, now_ms, rep_keep, reply);
    wire_ctl_request_clear_kept(&q, req_keep);
    if (kept) pthread_mutex_unlock(&s->keep_mu);
    return rc;
}

/* -------------------------------------------------------------- thread */

/* Sends queued events until the PUSH socket would block. The event is
 * encoded under the lock and popped only after it went out; if another
 * thread changed the queue meanwhile, the head is compared before popping. */
static void flush_events(ctl_server *s) {
    for (;;) {
        char *frame = NULL;
        rsv_event copy;
        pthread_mutex_lock(&s->mu);
        const rsv_event *e = rsv_event_peek(s->tab);
        if (!e) {
            pthread_mutex_unlock(&s->mu);
            return;
        }
        copy = *e;
        pthread_mutex_unlock(&s->mu);
        wire_event we;
        memset(&we, 0, sizeof we);
        ect_strcpy_cut(we.transfer_id, sizeof we.transfer_id, copy.transfer_id);
        ect_strcpy_cut(we.mm_hash, sizeof we.mm_hash, copy.st.mm_hash);
        ect_strcpy_cut(we.reservation_id, sizeof we.reservation_id, copy.st.reservation_id);
        we.ready = copy.kind == RSV_EV_READY;
        fill_tensor(&we.tensor, copy.st.nbytes, copy.st.shape, copy.st.ndim, copy.st.dtype);
        we.shard = (uint16_t)s->port;
        int rc = wire_ctl_encode_event(&we, &frame);
        bool sent = false;
        if (rc == 0) {
            sent = zmq_send(s->push, frame, strlen(frame), ZMQ_DONTWAIT) >= 0;
            free(frame);
            if (!sent && errno != EAGAIN) ECT_LOGW(MOD, "event send: %s", zmq_strerror(errno));
        } else {
            ECT_LOGE_ID(MOD, copy.transfer_id, NULL, "dropping unencodable event for %s: %s",
                        copy.transfer_id, ect_last_error());
        }
        if (!sent && rc == 0) return; /* stays queued */
        pthread_mutex_lock(&s->mu);
        e = rsv_event_peek(s->tab);
        if (e && memcmp(e, &copy, sizeof copy) == 0) rsv_event_pop(s->tab);
        pthread_mutex_unlock(&s->mu);
        if (sent) atomic_fetch_add(&s->events_sent, 1);
    }
}

static const char oom_reply[] = "{\"ok\":false,\"error\":\"EC consumer out of memory\"}";

/* The reply to one request from peer pa (NULL or "" unknown): a body that
 * came in several frames is malformed. Returns the text to send, which is
 * *owned (caller frees) or, out of memory, a static text: REP must answer
 * every request to take the next. The handling thread. */
static const char *answer(ctl_server *s, const char *pa, const void *body, size_t len, bool multi,
                          char **owned) {
    ect_strcpy_cut(s->peer, sizeof s->peer, pa ? pa : "");
    pg_canon(pa && *pa ? pa : NULL, s->who, sizeof s->who);
    char *reply = NULL;
    int rc;
    if (multi) {
        atomic_fetch_add(&s->bad_requests, 1);
        rc = wire_ctl_encode_error(WIRE_CTL_MALFORMED, &reply);
    } else {
        rc = ctl_server_handle(s, body, len, ect_now_ms(), &reply);
    }
    if (rc || !reply) {
        free(reply);
        reply = NULL;
    }
    *owned = reply;
    return reply ? reply : oom_reply;
}

static const char *answer_fn(void *ctx, const char *peer, const void *body, size_t len, bool multi,
                             char **owned) {
    return answer(ctx, peer, body, len, multi, owned);
}

/* The libzmq REP path (CURVE keys): one request off the socket, answered. */
static void serve_one(ctl_server *s) {
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    if (zmq_msg_recv(&msg, s->rep, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&msg);
        return;
    }
    bool multi = zmq_msg_more(&msg);
    const char *pa = zmq_msg_gets(&msg, "Peer-Address"); /* TCP peers: their address */
    char peer[64];
    ect_strcpy_cut(peer, sizeof peer, pa ? pa : "");
    while (zmq_msg_more(&msg)) { /* a raw peer may send parts: drain them, answer once */
        zmq_msg_close(&msg);
        zmq_msg_init(&msg);
        if (zmq_msg_recv(&msg, s->rep, 0) < 0) break;
    }
    char *owned = NULL;
    const char *reply = answer(s, peer, zmq_msg_data(&msg), zmq_msg_size(&msg), multi, &owned);
    zmq_msg_close(&msg);
    if (zmq_send(s->rep, reply, strlen(reply), 0) < 0)
        ECT_LOGW(MOD, "reply send: %s", zmq_strerror(errno));
    free(owned);
}

/* One wait for requests (up to poll_ms) and the answers. False: the ZMQ
 * context is gone. */
static bool serve_requests(ctl_server *s) {
    if (s->lst) {
        ctl_listener_pass(s->lst, s->o.poll_ms);
        return true;
    }
    zmq_pollitem_t it = {.socket = s->rep, .events = ZMQ_POLLIN};
    int n = zmq_poll(&it, 1, s->o.poll_ms);
    if (n < 0 && errno == ETERM) return false;
    if (n > 0 && (it.revents & ZMQ_POLLIN)) serve_one(s);
    return true;
}

static void *server_main(void *arg) {
    ctl_server *s = arg;
    pthread_setname_np(pthread_self(), "ect-ctl-server");
    uint64_t next_reap = ect_now_ms() + (uint64_t)s->o.reap_interval_ms;
    while (!atomic_load(&s->stop)) {
        if (!serve_requests(s)) break;
        uint64_t now = ect_now_ms();
        if (now >= next_reap) {
            ctl_server_reap(s, now);
            next_reap = now + (uint64_t)s->o.reap_interval_ms;
            log_refusals(s, now);
            log_expiries(s, now);
        }
        flush_events(s);
    }
    return NULL;
}

/* ---------------------------------------------------------------- open */

static int bind_socket(void *sock, const char *ip, int port, int *bound) {
    char ep[300];
    ect_tcp_endpoint(ip, port, ep, sizeof ep); /* port 0: any free port */
    if (zmq_bind(sock, ep) != 0) {
        int e = errno;
        if (e == EADDRINUSE) return ect_set_error(ECT_EEXIST, "%s: address in use", ep);
        return ect_set_error(ECT_EIO, "bind %s: %s", ep, zmq_strerror(e));
    }
    char last[300];
    size_t sz = sizeof last;
    if (zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, last, &sz) != 0)
        return ect_set_error(ECT_EIO, "bind %s: cannot read the bound port", ep);
    *bound = ect_tcp_endpoint_port(last);
    if (*bound <= 0) return ect_set_error(ECT_EIO, "bind %s: bad endpoint %s", ep, last);
    return 0;
}

/* Security options go on before bind (ZMQ applies them to later
 * connections only). */
static int secure_sockets(ctl_server *s, const ctl_server_opts *o) {
    if (!o->keys && !o->event_secret) return 0;
    if (!o->auth) return ect_set_error(ECT_EINVAL, "control server: keys need a ZAP handler");
    if (o->keys) {
        int rc = zauth_curve_server(s->rep, o->keys);
        return rc ? rc : zauth_curve_server(s->push, o->keys);
    }
    snprintf(s->event_secret, sizeof s->event_secret, "%s", o->event_secret);
    return zauth_plain_server(o->auth, s->push, s->event_secret);
}

static int check_opts(const ctl_server_opts *o) {
    if (!o->ip || !*o->ip || strlen(o->ip) > 255)
        return ect_set_error(ECT_EINVAL, "control server ip: required, at most 255 bytes");
    if (o->port < 0 || o->port > 65535)
        return ect_set_error(ECT_EINVAL, "control server port %d: 0..65535", o->port);
    if (o->tp_size < 1 || o->tp_size > 64)
        return ect_set_error(ECT_EINVAL, "tp_size %d: 1..64", o->tp_size);
    if (o->tp_rank < 0 || o->tp_rank >= o->tp_size)
        return ect_set_error(ECT_EINVAL, "tp_rank %d: 0..tp_size-1", o->tp_rank);
    if (o->base_port < 0 || o->base_port + o->tp_size - 1 > 65535)
        return ect_set_error(ECT_EINVAL, "base_port %d: ranks beyond port 65535", o->base_port);
    if (o->handshake_ms < 0 || o->max_conns < 0)
        return ect_set_error(ECT_EINVAL, "handshake_ms and max_conns must be >= 0");
    if (o->reap_interval_ms < 1 || o->poll_ms < 1)
        return ect_set_error(ECT_EINVAL, "reap_interval_ms and poll_ms must be >= 1");
    if (!o->dst_session || strlen(o->dst_session) > WIRE_SESSION_MAX)
        return ect_set_error(ECT_EINVAL, "dst_session: required, at most %d bytes",
                             WIRE_SESSION_MAX);
    if (o->advertise && strlen(o->advertise) > 255)
        return ect_set_error(ECT_EINVAL, "advertise: at most 255 bytes");
    if (o->transport && strlen(o->transport) > WIRE_TRANSPORT_MAX)
        return ect_set_error(ECT_EINVAL, "transport: at most %d bytes", WIRE_TRANSPORT_MAX);
    if (o->event_secret && strlen(o->event_secret) > WIRE_SECRET_MAX)
        return ect_set_error(ECT_EINVAL, "event_secret: at most %d bytes", WIRE_SECRET_MAX);
    if (o->dst_key && strlen(o->dst_key) > WIRE_KEY_MAX)
        return ect_set_error(ECT_EINVAL, "dst_key: at most %d bytes", WIRE_KEY_MAX);
    return 0;
}

/* The control port as our own ZMTP 3.0 REP listener (no CURVE keys). */
static int listen_control(ctl_server *s) {
    ctl_listener_opts lo = {.ip = s->o.ip,
                            .port = s->o.port,
                            .max_msg = (uint64_t)CTL_MAX_RECV_BYTES,
                            .handshake_ms = s->o.handshake_ms,
                            .max_conns = s->o.max_conns,
                            .fn = answer_fn,
                            .ctx = s};
    int rc = ctl_listener_open(&lo, &s->lst);
    if (!rc) s->port = ctl_listener_port(s->lst);
    return rc;
}

int ctl_server_open(void *zctx, const ctl_server_opts *o, ctl_server **out) {
    *out = NULL;
    if (!o) return ect_set_error(ECT_EINVAL, "control server: options required");
    int rc = check_opts(o);
    if (rc) return rc;
    if (!o->detached && !zctx) return ect_set_error(ECT_EINVAL, "control server: zctx required");
    ctl_server *s = calloc(1, sizeof *s);
    if (!s) return ect_set_error(ECT_ENOMEM, "control server: out of memory");
    s->o = *o;
    s->spare = ECT_SPARES_INIT(ctl_window, next, SPARE_WINDOWS);
    ect_strcpy_cut(s->ip, sizeof s->ip, o->ip);
    s->o.ip = s->ip;
    ect_strcpy_cut(s->session, sizeof s->session, o->dst_session);
    ect_strcpy_cut(s->advertise, sizeof s->advertise, o->advertise ? o->advertise : "");
    ect_strcpy_cut(s->transport, sizeof s->transport, o->transport ? o->transport : "");
    if (o->dst_key && !(s->dst_key = strdup(o->dst_key))) {
        free(s);
        return ect_set_error(ECT_ENOMEM, "control server: out of memory");
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->keep_mu, NULL);
    rc = rsv_open(&o->rsv, &s->tab);
    if (!rc) rc = pg_open(o->trusted_peers, &s->guard);
    if (rc) goto fail;
    s->o.trusted_peers = NULL; /* not kept: the guard has its copy */
    if (o->detached) {
        s->port = o->port;
        *out = s;
        return 0;
    }
    s->rep = o->keys ? zmq_socket(zctx, ZMQ_REP) : NULL; /* else listen_control */
    s->push = zmq_socket(zctx, ZMQ_PUSH);
    if ((o->keys && !s->rep) || !s->push) {
        rc = ect_set_error(ECT_EIO, "control server: zmq_socket: %s", zmq_strerror(errno));
        goto fail;
    }
    int zero = 0, one = 1;
    int64_t maxmsg = CTL_MAX_RECV_BYTES;
    int ipv6 = strchr(o->ip, ':') != NULL || strcmp(o->ip, "*") == 0;
    zmq_setsockopt(s->push, ZMQ_LINGER, &zero, sizeof zero);
    if (ipv6) zmq_setsockopt(s->push, ZMQ_IPV6, &one, sizeof one);
    if (s->rep) {
        zmq_setsockopt(s->rep, ZMQ_LINGER, &zero, sizeof zero);
        zmq_setsockopt(s->rep, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
        if (ipv6) zmq_setsockopt(s->rep, ZMQ_IPV6, &one, sizeof one);
    }
    rc = secure_sockets(s, o);
    if (!rc) rc = s->rep ? bind_socket(s->rep, o->ip, o->port, &s->port) : listen_control(s);
    if (!rc) rc = bind_socket(s->push, o->ip, 0, &s->event_port);
    if (rc) goto fail;
    if (o->keys) {
        zauth_local_server(s->port, o->keys);
        zauth_local_server(s->event_port, o->keys);
    }
    if (pthread_create(&s->thr, NULL, server_main, s) != 0) {
        rc = ect_set_error(ECT_EIO, "control server: cannot start its thread");
        goto fail;
    }
    s->thr_started = true;
    ECT_LOGI(MOD, "shard %d/%d: control %s:%d, events port %d", o->tp_rank, o->tp_size, o->ip,
             s->port, s->event_port);
    *out = s;
    return 0;
fail:
    ctl_server_close(s);
    return rc;
}

void ctl_server_stop(ctl_server *s) {
    if (!s) return;
    atomic_store(&s->stop, true);
    if (s->thr_started) pthread_join(s->thr, NULL);
    s->thr_started = false;
    ctl_listener_close(s->lst);
    s->lst = NULL;
    if (s->rep) zmq_close(s->rep);
    if (s->push) zmq_close(s->push);
    if (s->o.keys && s->rep) {
        zauth_local_server_gone(s->port);
        zauth_local_server_gone(s->event_port);
    }
    s->rep = s->push = NULL;
    pthread_mutex_lock(&s->mu);
    close_all_windows(s);
    close_pending(s);
    ect_spares_clear(&s->spare);
    pthread_mutex_unlock(&s->mu);
}

void ctl_server_close(ctl_server *s) {
    if (!s) return;
    ctl_server_stop(s);
    rsv_close(s->tab);
    pg_close(s->guard);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->keep_mu);
    wire_ctl_keep_free(&s->req_keep);
    wire_ctl_keep_free(&s->rep_keep);
    free(s->dst_key);
    free(s);
}

/* ------------------------------------------------------------ accessors */

int ctl_server_port(const ctl_server *s) { return s->port; }
int ctl_server_event_port(const ctl_server *s) { return s->event_port; }

size_t ctl_server_reap(ctl_server *s, uint64_t now_ms) {
    pthread_mutex_lock(&s->mu);
    size_t n = rsv_reap(s->tab, now_ms);
    if (s->wins) sweep_windows(s);
    sweep_spares(s);
    close_pending(s);
    pthread_mutex_unlock(&s->mu);
    return n;
}

size_t ctl_server_drop_spares(ctl_server *s) {
    pthread_mutex_lock(&s->mu);
    size_t n = rsv_spare_free_all(s->tab);
    sweep_spares(s);
    close_pending(s);
    pthread_mutex_unlock(&s->mu);
    return n;
}

size_t ctl_server_evict(ctl_server *s, size_t max) {
    pthread_mutex_lock(&s->mu);
    size_t n = rsv_evict_resident(s->tab, max);
    pthread_mutex_unlock(&s->mu);
    return n;
}

int ctl_server_take(ctl_server *s, const char *transfer_id, rsv_status *st) {
    pthread_mutex_lock(&s->mu);
    int rc = rsv_take(s->tab, transfer_id, ect_now_ms(), st);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int ctl_server_release(ctl_server *s, const char *mm_hash, const char *transfer_id) {
    pthread_mutex_lock(&s->mu);
    uint64_t now = ect_now_ms();
    int rc = rsv_release(s->tab, mm_hash, now);
    if (!rc && transfer_id && *transfer_id) /* finding a tombstone there is fine */
        (void)rsv_finish(s->tab, transfer_id, now);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int ctl_server_finish(ctl_server *s, const char *transfer_id) {
    pthread_mutex_lock(&s->mu);
    int rc = rsv_finish(s->tab, transfer_id, ect_now_ms());
    pthread_mutex_unlock(&s->mu);
    return rc;
}

void ctl_server_refusals(ctl_server *s, ctl_refusals *out) {
    out->full = atomic_load(&s->rf[RF_FULL].total);
    out->tomb = atomic_load(&s->rf[RF_TOMB].total);
    out->conflict = atomic_load(&s->rf[RF_CONFLICT].total);
    out->busy = atomic_load(&s->rf[RF_BUSY].total);
    out->invalid = atomic_load(&s->rf[RF_INVALID].total);
    out->other = atomic_load(&s->rf[RF_OTHER].total);
    out->peer_complete = pg_refused(s->guard, PG_COMPLETE);
    out->peer_cancel = pg_refused(s->guard, PG_CANCEL);
    out->peer_status = pg_refused(s->guard, PG_STATUS);
    out->peer_reserve = pg_refused(s->guard, PG_RESERVE);
}

void ctl_server_stats(ctl_server *s, rsv_stats *st) {
    pthread_mutex_lock(&s->mu);
    rsv_get_stats(s->tab, st);
    pthread_mutex_unlock(&s->mu);
}

int ctl_server_check(ctl_server *s) {
    pthread_mutex_lock(&s->mu);
    int rc = rsv_check(s->tab);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

uint64_t ctl_server_events_sent(ctl_server *s) { return atomic_load(&s->events_sent); }

void ctl_server_counters(ctl_server *s, ctl_counters *c) {
    c->bytes_in = atomic_load(&s->bytes_in);
    c->items_in = atomic_load(&s->items_in);
    c->requests = atomic_load(&s->requests);
    c->window_entries = atomic_load(&s->window_entries);
}

void ctl_server_count_states(ctl_server *s, uint64_t counts[RSV_EXPIRED + 1]) {
    pthread_mutex_lock(&s->mu);
    rsv_count_states(s->tab, counts);
    pthread_mutex_unlock(&s->mu);
}

size_t ctl_server_last_errors(ctl_server *s, ctl_error *out, size_t max) {
    pthread_mutex_lock(&s->mu);
    size_t n = s->last_err_n < max ? s->last_err_n : max;
    for (size_t i = 0; i < n; i++) /* newest first */
        out[i] = s->last_err[(s->last_err_head + CTL_LAST_ERRORS - 1 - i) % CTL_LAST_ERRORS];
    pthread_mutex_unlock(&s->mu);
    return n;
}
uint64_t ctl_server_bad_requests(ctl_server *s) { return atomic_load(&s->bad_requests); }

/* ---- ect_ready (docs/PROTOCOL.md "Lost events: the scheduler lists what is
 * ready"): the items ready here, for the consumer's own scheduler. */

typedef struct ready_acc {
    wire_ready_item *v;
    size_t n, cap;
    bool oom;
} ready_acc;

/* rsv_ready_fn: one listed item into the reply. */
static void ready_add(void *ctx, const char *transfer_id, uint64_t seq, const rsv_status *st) {
    ready_acc *a = ctx;
    if (a->oom) return;
    if (a->n == a->cap) {
        size_t cap = a->cap ? 2 * a->cap : 16;
        wire_ready_item *v = realloc(a->v, cap * sizeof *v);
        if (!v) {
            a->oom = true;
            return;
        }
        a->v = v;
        a->cap = cap;
    }
    wire_ready_item *it = &a->v[a->n++];
    memset(it, 0, sizeof *it);
    it->seq = seq;
    ect_strcpy_cut(it->transfer_id, sizeof it->transfer_id, transfer_id);
    ect_strcpy_cut(it->mm_hash, sizeof it->mm_hash, st->mm_hash);
    ect_strcpy_cut(it->reservation_id, sizeof it->reservation_id, st->reservation_id);
    fill_tensor(&it->tensor, st->nbytes, st->shape, st->ndim, st->dtype);
}

/* The listing for a trusted peer (peer_guard.h, PG_READY; the refusal is
 * counted in peer_refused.ready); ECT_EACCES / ECT_ENOMEM with the reply's
 * text set. Under the lock. */
static int do_ready(ctl_server *s, const wire_ctl_request *q, uint64_t now, wire_ctl_reply *rep) {
    if (!pg_allow(s->guard, PG_READY, s->who, "", "(every ready item)"))
        return ect_set_error(ECT_EACCES, "%s", CTL_READY_REFUSED);
    ready_acc a = {0};
    rsv_ready_list(s->tab, q->u.ready.after, q->u.ready.age_ms, q->u.ready.max, now, ready_add, &a,
                   &rep->u.ready.next, &rep->u.ready.more);
    if (a.oom) {
        free(a.v);
        return ect_set_error(ECT_ENOMEM, "EC consumer out of memory");
    }
    rep->u.ready.items = a.v;
    rep->u.ready.n = a.n;
    ECT_LOGD(MOD, "shard %d: ect_ready after %" PRIu64 ": %zu item(s), next %" PRIu64 "%s", s->port,
             q->u.ready.after, a.n, rep->u.ready.next, rep->u.ready.more ? ", more" : "");
    return 0;
}
