/*
 * consumer — ect_push_consumer: one receiving TP rank. Wires a memfd pool,
 * a transport target with the whole pool registered as one region, and a
 * control server whose reservation table allocates from the pool.
 *
 * Close order matters because producers write into the pool with one-sided
 * writes: the control thread stops first (no new reservations), then the
 * transport (no write can land any more), and only then are the table's
 * buffers freed and the pool unmapped.
 *
 * The reservation table's optional `write_active` hook asks the transport
 * whether a write into the pool is being received right now: the region's
 * reference count, which the tcp target and the shm slow path hold for every
 * accepted write. The shm fast path and ucx puts are invisible to the target,
 * so for them the hook only sees the pending grace go by. A range is quiet
 * when no write is being received into the pool at all; that is coarser than
 * the range but never wrong in the unsafe direction.
 *
 * The pool may live on a GPU (opts.pool_device "cuda"): it is then one CUDA
 * allocation registered as a device region, views point to the device, and
 * the transports land bytes there (tcp through a pinned bounce ring, shm by
 * CUDA IPC); nothing else here changes, since the reservation table only
 * does arithmetic on offsets.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zmq.h>

#include "ectransfer.h"
#include "mem/pool.h"
#include "push/control_server.h"
#include "util/metrics.h"
#include "util/hostport.h"
#include "util/keys.h"
#include "util/util.h"
#include "util/zauth.h"
#include "xport/xport.h"

#define MOD "consumer"

struct ect_push_consumer {
    ect_push_consumer_opts o;
    char ip[256], advertise[256];
    char pool_device[32];
    ect_pool *pool;
    ect_xport *xp;
    char key[ECT_XPORT_KEY_MAX];
    bool registered;
    void *zctx;
    char *curve_keys;
    ect_keyset *keys; /* NULL: keys off */
    zauth *auth;      /* ZAP handler on zctx; NULL when nothing is checked */
    ctl_server *srv;
    rsv_mem_ops mem;
    met_source *met;
};

void ect_push_consumer_opts_init(ect_push_consumer_opts *o) {
    memset(o, 0, sizeof *o);
    o->ec_ip = "127.0.0.1";
    o->ec_port = 14579;
    o->tp_size = 1;
    o->pool_size = 1000000000ull;
    o->transport = "tcp";
    o->ttl_ms = RSV_DEFAULT_TTL_MS;
    o->pending_grace_ms = RSV_DEFAULT_TTL_MS;
    o->reap_interval_ms = CTL_DEFAULT_REAP_INTERVAL_MS;
    o->max_events = RSV_DEFAULT_MAX_EVENTS;
    o->max_tombstones = RSV_DEFAULT_MAX_TOMBSTONES;
    ect_xport_opts xo; /* the data plane's caps, as its own defaults */
    ect_xport_opts_init(&xo);
    o->max_conns = xo.max_conns;
    o->max_conns_per_peer = xo.max_conns_per_peer;
}

static int mem_alloc(void *ctx, uint64_t nbytes, uint64_t *offset) {
    ect_push_consumer *c = ctx;
    return pool_try_alloc(c->pool, nbytes, offset); /* the table words a full pool's error */
}

static void mem_free(void *ctx, uint64_t offset, uint64_t nbytes) {
    ect_push_consumer *c = ctx;
    int rc = ect_pool_free(c->pool, offset);
    if (rc)
        ECT_LOGE(MOD, "freeing %" PRIu64 " bytes at %" PRIu64 ": %s", nbytes, offset,
                 ect_last_error());
}

static bool mem_write_active(void *ctx, uint64_t offset, uint64_t nbytes) {
    ect_push_consumer *c = ctx;
    (void)offset;
    (void)nbytes;
    if (!c->xp || !c->registered) return false;
    return xp_range_busy(c->xp, (uint8_t *)ect_pool_base(c->pool) + offset, nbytes);
}

/* One writer reservation's own key over its range (docs/PROTOCOL.md "Write
 * windows"). */
static int win_open(void *ctx, uint64_t offset, uint64_t nbytes, char key[ECT_XPORT_KEY_MAX]) {
    ect_push_consumer *c = ctx;
    return xp_window_open(c->xp, c->key, offset, nbytes, key);
}

static void win_close(void *ctx, const char *key) {
    ect_push_consumer *c = ctx;
    if (xp_window_close(c->xp, key) != 0)
        ECT_LOGE(MOD, "closing write window %s: %s", key, ect_last_error());
}

/* Offers windows to a producer's shm connection (docs/PROTOCOL.md "shm",
 * "Offers"); a failure only means the producer asks for them itself. */
static void win_offer(void *ctx, uint64_t shm_id, const char *const *keys, size_t n) {
    ect_push_consumer *c = ctx;
    (void)xp_window_offer(c->xp, shm_id, keys, n);
}

static void win_close_many(void *ctx, const char *const *keys, size_t n) {
    ect_push_consumer *c = ctx;
    if (xp_window_close_many(c->xp, keys, n) != 0)
        ECT_LOGE(MOD, "closing %zu write windows: %s", n, ect_last_error());
}

static int check_opts(const ect_push_consumer_opts *o) {
    if (!o->ec_ip || !*o->ec_ip || strlen(o->ec_ip) > 255)
        return ect_set_error(ECT_EINVAL, "ec_ip: required, at most 255 bytes");
    if (o->tp_size < 1 || o->tp_size > 64)
        return ect_set_error(ECT_EINVAL, "tp_size %d: must be 1..64", o->tp_size);
    if (o->tp_rank < 0 || o->tp_rank >= o->tp_size)
        return ect_set_error(ECT_EINVAL, "tp_rank %d: must be 0..tp_size-1", o->tp_rank);
    if (o->dp_index < 0 || o->dp_index > 65535)
        return ect_set_error(ECT_EINVAL, "dp_index %d: must be >= 0", o->dp_index);
    if (o->ec_port < 0 || o->ec_port > 65535)
        return ect_set_error(ECT_EINVAL, "ec_port %d: must be 0..65535", o->ec_port);
    if (o->ec_port && (int64_t)o->ec_port + (int64_t)(o->dp_index + 1) * o->tp_size - 1 > 65535)
        return ect_set_error(ECT_EINVAL,
                             "ec_port %d + dp_index %d x tp_size %d: control ports beyond 65535",
                             o->ec_port, o->dp_index, o->tp_size);
    if (o->pool_size == 0) return ect_set_error(ECT_EINVAL, "pool_size must be > 0");
    if (o->advertise &&
        (!*o->advertise || strlen(o->advertise) > 255 || ect_host_is_wildcard(o->advertise)))
        return ect_set_error(ECT_EINVAL,
                             "advertise '%.64s': a host name or address peers can "
                             "reach, 1..255 bytes, not a wildcard",
                             o->advertise);
    if (o->data_port < 0 || o->data_port > 65535 ||
        (o->data_port && (long)o->data_port + (long)o->dp_index * o->tp_size + o->tp_rank > 65535))
        return ect_set_error(ECT_EINVAL,
                             "data_port %d + dp_index %d x tp_size %d + tp_rank %d: data ports "
                             "beyond 65535",
                             o->data_port, o->dp_index, o->tp_size, o->tp_rank);
    if (!o->transport) return ect_set_error(ECT_EINVAL, "transport: tcp, shm or ucx");
    if (o->ttl_ms == 0) return ect_set_error(ECT_EINVAL, "ttl_ms must be > 0");
    if (o->reap_interval_ms < 1) return ect_set_error(ECT_EINVAL, "reap_interval_ms must be >= 1");
    if (o->max_events == 0) return ect_set_error(ECT_EINVAL, "max_events must be > 0");
    if (o->max_tombstones == 0) return ect_set_error(ECT_EINVAL, "max_tombstones must be > 0");
    int kind;
    if (o->pool_device && strlen(o->pool_device) >= 32)
        return ect_set_error(ECT_EINVAL, "pool_device: too long");
    if (ect_mem_parse_device(o->pool_device, &kind, NULL) != 0)
        return ect_set_error(ECT_EINVAL, "pool_device: %s", ect_last_error());
    if (kind == ECT_MEM_CUDA && strcmp(o->transport, "ucx") == 0)
        return ect_set_error(ECT_ENOTSUP,
                             "pool_device %s: the ucx transport cannot receive into "
                             "CUDA memory (use tcp or shm)",
                             o->pool_device);
    if (o->pool_memory && kind == ECT_MEM_HOST && strcmp(o->transport, "shm") == 0)
        return ect_set_error(ECT_EINVAL, "pool_memory: shm needs an fd-backed pool; a caller's "
                                         "host buffer has none (use tcp, or a CUDA buffer)");
    return 0;
}

/* The shard's metrics (metrics.h): read at scrape time from the table, the
 * pool and the control server's counters. */
static void collect(void *ctx, met_out *o) {
    ect_push_consumer *c = ctx;
    ect_push_consumer_stat st;
    ect_push_consumer_stats(c, &st);
    ect_pool_stat ps;
    ect_pool_stats(c->pool, &ps);
    ctl_counters cc;
    ctl_server_counters(c->srv, &cc);
    rsv_stats rs;
    ctl_server_stats(c->srv, &rs);
    char l[160];
    met_labels(l, sizeof l, "transport", ect_xport_kind(c->xp), "direction", "in",
               (const char *)NULL);
    met_out_moved(o, l, cc.bytes_in, cc.items_in);
    met_out_pool(o, (double)ps.capacity, (double)ps.used, (double)rs.published_bytes);
    uint64_t counts[RSV_EXPIRED + 1];
    ctl_server_count_states(c->srv, counts);
    for (int k = RSV_WRITING; k <= RSV_EXPIRED; k++)
        met_out_gauge(
            o, "ectransfer_reservations", "Reservations by state, tombstones included.",
            met_labels(l, sizeof l, "state", rsv_state_name((rsv_state)k), (const char *)NULL),
            (double)counts[k]);
    ctl_refusals rf;
    ctl_server_refusals(c->srv, &rf);
    static const char *const rh =
        "Reserves refused, by reason (full is back-pressure: producers retry).";
    const struct {
        const char *why;
        uint64_t v;
    } refs[] = {{"full", rf.full}, {"cancelled", rf.tomb},  {"conflict", rf.conflict},
                {"busy", rf.busy}, {"invalid", rf.invalid}, {"other", rf.other}};
    for (size_t i = 0; i < ECT_ARRAY_LEN(refs); i++)
        met_out_counter(o, "ectransfer_refusals_total", rh,
                        met_labels(l, sizeof l, "reason", refs[i].why, (const char *)NULL),
                        refs[i].v);
    static const char *const ph =
        "Requests refused because the reservation belongs to another peer, by op "
        "(status: reservation ids withheld).";
    const struct {
        const char *op;
        uint64_t v;
    } prefs[] = {{"complete", rf.peer_complete},
                 {"cancel", rf.peer_cancel},
                 {"status", rf.peer_status},
                 {"reserve", rf.peer_reserve}};
    for (size_t i = 0; i < ECT_ARRAY_LEN(prefs); i++)
        met_out_counter(o, "ectransfer_peer_refusals_total", ph,
                        met_labels(l, sizeof l, "op", prefs[i].op, (const char *)NULL), prefs[i].v);
    met_out_failure(o, "expired", st.expired);
    met_out_failure(o, "abandoned", st.abandoned);
    met_out_control_requests(o, cc.requests);
    met_out_counter(o, "ectransfer_bad_requests_total",
                    "Frames refused as malformed or an unknown op.", NULL, st.bad_requests);
    met_out_counter(o, "ectransfer_events_sent_total", "Events sent to the scheduler.", NULL,
                    st.events_sent);
    met_out_counter(o, "ectransfer_events_dropped_total",
                    "Events dropped because the backlog was full.", NULL, st.events_dropped);
    met_out_counter(o, "ectransfer_delivered_total", "Transfers the engine took and finished.",
                    NULL, st.finished);
    met_out_counter(o, "ectransfer_evictions_total", "Resident items reclaimed.", NULL,
                    st.evictions);
}

int ect_push_consumer_open(const ect_push_consumer_opts *opts, ect_push_consumer **out) {
    if (out) *out = NULL;
    if (!opts || !out) return ect_set_error(ECT_EINVAL, "push consumer: opts and out required");
    int rc = check_opts(opts);
    if (rc) return rc;
    ect_push_consumer *c = calloc(1, sizeof *c);
    if (!c) return ect_set_error(ECT_ENOMEM, "push consumer: out of memory");
    c->o = *opts;
    ect_strcpy_cut(c->ip, sizeof c->ip, opts->ec_ip);
    ect_strcpy_cut(c->advertise, sizeof c->advertise, opts->advertise ? opts->advertise : "");
    c->o.advertise = c->advertise[0] ? c->advertise : NULL;
    c->o.ec_ip = c->ip;
    c->o.transport = NULL;
    c->o.xport_listen = NULL;
    ect_strcpy_cut(c->pool_device, sizeof c->pool_device,
                   opts->pool_device ? opts->pool_device : "cpu");
    c->o.pool_device = c->pool_device;
    c->o.curve_keys = NULL;
    if (opts->curve_keys && (!(c->curve_keys = strdup(opts->curve_keys)) ||
                             (rc = ect_keys_load(c->curve_keys, &c->keys)))) {
        if (!rc) rc = ect_set_error(ECT_ENOMEM, "push consumer: out of memory");
        goto fail;
    }
    c->o.curve_keys = c->curve_keys;

    ect_pool_opts po;
    ect_pool_opts_init(&po);
    po.capacity = opts->pool_size;
    ect_mem_parse_device(c->pool_device, &po.mem_kind, &po.device);
    po.external = opts->pool_memory;
    po.use_memfd = po.mem_kind != ECT_MEM_CUDA && !po.external;
    if ((rc = ect_pool_open(&po, &c->pool))) goto fail;

    ect_xport_opts xo;
    ect_xport_opts_init(&xo);
    char listen[300];
    int dport =
        opts->data_port ? opts->data_port + opts->dp_index * opts->tp_size + opts->tp_rank : 0;
    ect_hostport_format(c->ip, dport, listen, sizeof listen);
    xo.listen = opts->xport_listen ? opts->xport_listen : listen;
    xo.max_conns = opts->max_conns;
    xo.max_conns_per_peer = opts->max_conns_per_peer;
    if ((rc = xp_open_keyed(opts->transport, &xo, c->keys, &c->xp))) goto fail;
    if ((rc = ect_xport_register_mem(c->xp, ect_pool_base(c->pool), ect_pool_capacity(c->pool),
                                     ect_pool_mem_kind(c->pool), ect_pool_fd(c->pool), 0, c->key)))
        goto fail;
    c->registered = true;
    /* Peers write only through a reservation's window; the pool's own key is
     * not handed out (on every transport: ucx windows are their own rkeys). */
    bool windows = true;
    if ((rc = xp_region_set_private(c->xp, c->key))) goto fail;

    c->mem.alloc = mem_alloc;
    c->mem.free = mem_free;
    c->mem.write_active = mem_write_active;
    if (!(c->zctx = zmq_ctx_new())) {
        rc = ect_set_error(ECT_EIO, "push consumer: zmq_ctx_new failed");
        goto fail;
    }
    ctl_server_opts so;
    ctl_server_opts_init(&so);
    so.ip = c->ip;
    so.tp_size = opts->tp_size;
    so.tp_rank = opts->tp_rank;
    if (opts->ec_port) {
        so.base_port = opts->ec_port + opts->dp_index * opts->tp_size;
        so.port = so.base_port + opts->tp_rank;
    }
    so.reap_interval_ms = opts->reap_interval_ms;
    so.rsv.mem = &c->mem;
    so.rsv.mem_ctx = c;
    so.rsv.ttl_ms = opts->ttl_ms;
    so.rsv.pending_grace_ms = opts->pending_grace_ms;
    so.rsv.max_events = opts->max_events;
    so.rsv.max_tombstones = opts->max_tombstones;
    so.rsv.capacity = ect_pool_capacity(c->pool);
    so.dst_session = ect_xport_session(c->xp);
    so.advertise = c->advertise[0] ? c->advertise : NULL;
    so.transport = ect_xport_kind(c->xp);
    so.dst_key = windows ? NULL : c->key;
    so.win_open = windows ? win_open : NULL;
    so.win_close = win_close;
    so.win_offer = windows && !strcmp(ect_xport_kind(c->xp), "shm") ? win_offer : NULL;
    so.win_close_many = win_close_many;
    so.win_ctx = c;
    so.trusted_peers = opts->trusted_peers;
    so.pool_base = (uint64_t)(uintptr_t)ect_pool_base(c->pool);
    char secret[ZAUTH_SECRET_LEN + 1];
    zauth_new_secret(secret);
    so.keys = c->keys;
    so.event_secret = !c->keys && !opts->event_auth_off ? secret : NULL;
    if ((so.keys || so.event_secret) &&
        (rc = zauth_open(c->zctx, c->keys, "push consumer", &c->auth)))
        goto fail;
    so.auth = c->auth;
    if ((rc = ctl_server_open(c->zctx, &so, &c->srv))) goto fail;
    char shard[16];
    snprintf(shard, sizeof shard, "%d", opts->tp_rank);
    if ((rc = met_source_add("push_consumer", shard, collect, c, &c->met))) goto fail;
    *out = c;
    return 0;
fail:
    ECT_RETURN_AFTER(rc, ect_push_consumer_close(c));
}

void ect_push_consumer_close(ect_push_consumer *c) {
    if (!c) return;
    met_source_remove(c->met); /* no scrape reads it any more */
    ctl_server_stop(c->srv);   /* no new reservations, events or reaping */
    ect_xport_close(c->xp);    /* no remote write lands after this */
    c->xp = NULL;
    c->registered = false;
    ctl_server_close(c->srv); /* gives every buffer back to the pool */
    zauth_close(c->auth);     /* after the sockets it checks, before the context */
    if (c->zctx) zmq_ctx_term(c->zctx);
    ect_keys_free(c->keys);
    free(c->curve_keys);
    ect_pool_close(c->pool);
    free(c);
}

int ect_push_consumer_port(const ect_push_consumer *c) { return ctl_server_port(c->srv); }
int ect_push_consumer_event_port(const ect_push_consumer *c) {
    return ctl_server_event_port(c->srv);
}
const char *ect_push_consumer_session(const ect_push_consumer *c) {
    return ect_xport_session(c->xp);
}

int ect_push_consumer_take(ect_push_consumer *c, const char *transfer_id, ect_push_view *view) {
    if (view) memset(view, 0, sizeof *view);
    if (!c || !transfer_id || !view)
        return ect_set_error(ECT_EINVAL, "push consumer take: NULL argument");
    rsv_status st;
    int rc = ctl_server_take(c->srv, transfer_id, &st);
    if (rc) return rc;
    view->data = (const uint8_t *)ect_pool_base(c->pool) + st.offset;
    view->nbytes = st.nbytes;
    view->ndim = (uint32_t)st.ndim;
    for (size_t i = 0; i < st.ndim && i < ECT_POOL_MAX_NDIM; i++) view->shape[i] = st.shape[i];
    ect_strcpy_cut(view->dtype, sizeof view->dtype, st.dtype);
    ect_strcpy_cut(view->mm_hash, sizeof view->mm_hash, st.mm_hash);
    ect_strcpy_cut(view->transfer_id, sizeof view->transfer_id, transfer_id);
    view->mem_kind = ect_pool_mem_kind(c->pool);
    view->device = ect_pool_device(c->pool);
    return 0;
}

int ect_push_consumer_release(ect_push_consumer *c, const ect_push_view *view) {
    if (!c || !view) return ect_set_error(ECT_EINVAL, "push consumer release: NULL argument");
    return ctl_server_release(c->srv, view->mm_hash, view->transfer_id);
}

int ect_push_consumer_finish(ect_push_consumer *c, const char *transfer_id) {
    if (!c || !transfer_id || !*transfer_id)
        return ect_set_error(ECT_EINVAL, "push consumer finish: NULL or empty argument");
    return ctl_server_finish(c->srv, transfer_id);
}

size_t ect_push_consumer_evict(ect_push_consumer *c, size_t max) {
    return ctl_server_evict(c->srv, max);
}

size_t ect_push_consumer_drop_spares(ect_push_consumer *c) {
    return c ? ctl_server_drop_spares(c->srv) : 0;
}

void ect_push_consumer_stats(ect_push_consumer *c, ect_push_consumer_stat *st) {
    memset(st, 0, sizeof *st);
    ect_pool_stat ps;
    ect_pool_stats(c->pool, &ps);
    rsv_stats rs;
    ctl_server_stats(c->srv, &rs);
    st->pool_used = ps.used;
    st->pool_capacity = ps.capacity;
    st->live = rs.live;
    st->tombstones = rs.tombstones;
    st->buffers = rs.buffers;
    st->resident = rs.resident;
    st->events_queued = rs.events;
    st->events_sent = ctl_server_events_sent(c->srv);
    st->events_dropped = rs.events_dropped;
    st->bad_requests = ctl_server_bad_requests(c->srv);
    st->evictions = rs.evictions;
    st->peak_live = rs.peak_live;
    st->peak_held = rs.peak_bytes;
    st->finished = rs.finished;
    st->abandoned = rs.abandoned;
    st->expired = rs.expired_ready + rs.expired_writing;
    ctl_refusals rf;
    ctl_server_refusals(c->srv, &rf);
    st->refused_full = rf.full;
    st->refused_other = rf.tomb + rf.conflict + rf.busy + rf.invalid + rf.other;
    st->writes_refused = c->xp ? xp_refused(c->xp) : 0;
    st->spares = rs.spares;
}

ect_pool *ect_push_consumer_pool(ect_push_consumer *c) { return c ? c->pool : NULL; }
