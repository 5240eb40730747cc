/*
 * producer — the public calls of the push producer (see ectransfer.h). They
 * run on the caller's threads and touch the records table (pushes.h) only
 * under the producer's mutex: reserve adds a held record (after copying its
 * source into the staging pool when it is not borrowed), flush releases the
 * held records and queues their reserves (producer_run.c), poll drains the
 * results. Nothing here touches a socket but a waiting poll lent to a lone
 * step (below), so no other call waits on the network.
 *
 * ect_push_producer_flush_poll lends its thread (producer_lanes.c, pp_lend);
 * a plain poll never does. Its flush, when the step is lone, leaves the step's
 * exchange queued on its idle lane without a wake-up (pp_lane_submit,
 * "quiet"), and the poll that follows in the same call runs it and what
 * follows (settle, write, complete, result) as the lane's thread would;
 * between lends it waits for a result or for more work left to it
 * (lend_seq). Its timeout hands an exchange still waiting for a reply back
 * to the lane's thread, which goes on reading it. A plain flush wakes the
 * lane as before. Lanes left asleep are woken by flush_poll on its way out
 * (pp_wake_quiet), and a quiet submit made when no flush_poll is in progress
 * (p->lenders 0) wakes its lane at once: nothing else needs to.
 *
 * Dedup: the table remembers every transfer_id from reserve until ttl_ms
 * after it finished (at most max_tombstones finished ones), so a repeated
 * transfer_id is refused at once on the caller's thread.
 *
 * Staging back-pressure: a copy that does not fit waits (staging_wait_ms) on
 * `room`, which every free of staging memory signals. Before waiting it
 * hands the unflushed queue to the dispatcher: the caller may be filling the
 * pool with items of its own step, and those only drain once sent.
 */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zmq.h>

#include "mem/memkind.h"
#include "mem/pool.h"
#include "push/producer.h"
#include "util/hostport.h"
#include "util/sync.h"
#include "util/metrics.h"
#include "util/util.h"
#include "wire/dtype.h"

#define MOD "producer"

void ect_push_producer_opts_init(ect_push_producer_opts *o) {
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->staging_size = 256ull << 20;
    o->control_timeout_ms = CTL_DEFAULT_TIMEOUT_MS;
    o->refresh_after_ms = PUSH_DEFAULT_REFRESH_MS;
    o->input_wait_ms = PUSH_DEFAULT_TTL_MS;
    o->ttl_ms = PUSH_DEFAULT_TTL_MS;
    o->max_tombstones = PUSH_DEFAULT_MAX_TOMBSTONES;
    o->connect_timeout_ms = 5000;
    o->io_timeout_ms = 30000;
    o->listen_host = "127.0.0.1";
    o->down_backoff_ms = 1000;
    o->down_backoff_max_ms = 30000;
    o->push_wait_ms = PUSH_DEFAULT_PUSH_WAIT_MS;
    o->staging_wait_ms = 60000;
    o->expect_shards = 0;
}

static int check_opts(const ect_push_producer_opts *o) {
    if (o->control_timeout_ms < 1 || o->control_timeout_ms > 3600000)
        return ect_set_error(ECT_EINVAL, "control_timeout_ms must be 1..3600000, not %d",
                             o->control_timeout_ms);
    if (o->refresh_after_ms == 0) return ect_set_error(ECT_EINVAL, "refresh_after_ms must be > 0");
    if (o->input_wait_ms == 0) return ect_set_error(ECT_EINVAL, "input_wait_ms must be > 0");
    if (o->ttl_ms == 0) return ect_set_error(ECT_EINVAL, "ttl_ms must be > 0");
    if (o->max_tombstones == 0) return ect_set_error(ECT_EINVAL, "max_tombstones must be > 0");
    if (o->connect_timeout_ms < 1 || o->connect_timeout_ms > 600000)
        return ect_set_error(ECT_EINVAL, "connect_timeout_ms must be 1..600000, not %d",
                             o->connect_timeout_ms);
    if (o->io_timeout_ms < 1 || o->io_timeout_ms > 3600000)
        return ect_set_error(ECT_EINVAL, "io_timeout_ms must be 1..3600000, not %d",
                             o->io_timeout_ms);
    if (o->down_backoff_ms < 1 || o->down_backoff_ms > 3600000)
        return ect_set_error(ECT_EINVAL, "down_backoff_ms must be 1..3600000, not %d",
                             o->down_backoff_ms);
    if (o->down_backoff_max_ms < o->down_backoff_ms || o->down_backoff_max_ms > 3600000)
        return ect_set_error(ECT_EINVAL,
                             "down_backoff_max_ms must be down_backoff_ms (%d)..3600000, not %d",
                             o->down_backoff_ms, o->down_backoff_max_ms);
    if (o->push_wait_ms < 1 || o->push_wait_ms > 86400000)
        return ect_set_error(ECT_EINVAL, "push_wait_ms must be 1..86400000, not %" PRIu64,
                             o->push_wait_ms);
    if (o->staging_wait_ms > 3600000)
        return ect_set_error(ECT_EINVAL, "staging_wait_ms must be 0..3600000, not %" PRIu64,
                             o->staging_wait_ms);
    if (o->expect_shards > PUSH_MAX_SHARDS)
        return ect_set_error(ECT_EINVAL, "expect_shards must be 0..%d, not %u", PUSH_MAX_SHARDS,
                             o->expect_shards);
    if (!o->listen_host || !*o->listen_host || strlen(o->listen_host) > PUSH_HOST_MAX)
        return ect_set_error(ECT_EINVAL, "listen_host must be a non-empty host name");
    if (o->transport && *o->transport && strcmp(o->transport, "tcp") &&
        strcmp(o->transport, "shm") && strcmp(o->transport, "ucx"))
        return ect_set_error(ECT_EINVAL, "transport must be tcp, shm or ucx, not '%.32s'",
                             o->transport);
    return 0;
}

static void collect(void *ctx, met_out *o);

int ect_push_producer_open(const ect_push_producer_opts *opts, ect_push_producer **out) {
    if (!out) return ect_set_error(ECT_EINVAL, "ect_push_producer_open: out is NULL");
    *out = NULL;
    ect_push_producer_opts def;
    if (!opts) {
        ect_push_producer_opts_init(&def);
        opts = &def;
    }
    int rc = check_opts(opts);
    if (rc) return rc;
    ect_push_producer *p = calloc(1, sizeof *p);
    if (!p) return ect_set_error(ECT_ENOMEM, "push producer: out of memory");
    p->o = *opts;
    ect_strcpy_cut(p->listen_host, sizeof p->listen_host, opts->listen_host);
    p->o.listen_host = p->listen_host;
    ect_strcpy_cut(p->transport, sizeof p->transport, opts->transport ? opts->transport : "");
    p->o.transport = p->transport;
    p->o.curve_keys = NULL;
    if (opts->curve_keys && (!(p->curve_keys = strdup(opts->curve_keys)) ||
                             (rc = ect_keys_load(p->curve_keys, &p->keys)))) {
        if (!rc) rc = ect_set_error(ECT_ENOMEM, "push producer: out of memory");
        free(p->curve_keys);
        free(p);
        return rc;
    }
    p->o.curve_keys = p->curve_keys;
    p->done_tail = &p->done;
    pthread_mutex_init(&p->mu, NULL);
    ect_cond_init(&p->wake);
    ect_cond_init(&p->results);
    ect_cond_init(&p->room);
    ect_cond_init(&p->baton);
    pthread_mutex_init(&p->wmu, NULL);
    pthread_cond_init(&p->wcv, NULL);
    if (opts->staging_size) {
        ect_pool_opts po;
        ect_pool_opts_init(&po);
        po.capacity = opts->staging_size;
        po.use_memfd = 1; /* shm peers may map it one day; costs nothing */
        if ((rc = ect_pool_open(&po, &p->pool))) goto fail;
    }
    push_opts pso;
    push_opts_init(&pso);
    pso.refresh_after_ms = opts->refresh_after_ms;
    pso.input_wait_ms = opts->input_wait_ms;
    pso.ttl_ms = opts->ttl_ms;
    pso.max_tombstones = opts->max_tombstones;
    pso.push_wait_ms = opts->push_wait_ms;
    if ((rc = push_open(&pso, &p->table))) goto fail;
    p->batch.t = p->table;
    ect_strcpy_cut(p->batch.transport, sizeof p->batch.transport, p->transport);
    p->batch.expect_shards = opts->expect_shards;
    /* Our shm connections ask shards to offer windows with the reserve reply
     * (docs/PROTOCOL.md "shm", "Offers"), named by this id. */
    if (!p->transport[0] || !strcmp(p->transport, "shm"))
        while (!p->batch.shm_id) p->batch.shm_id = ect_random_u64();
    while (!p->batch.spare_id) p->batch.spare_id = ect_random_u64(); /* names its spares */
    p->acts_cap = 1024;
    if (!(p->acts = calloc(p->acts_cap, sizeof *p->acts)) || !(p->zctx = zmq_ctx_new())) {
        rc = ect_set_error(ECT_ENOMEM, "push producer: out of memory");
        goto fail;
    }
    if ((rc = down_open((uint64_t)opts->down_backoff_ms, (uint64_t)opts->down_backoff_max_ms,
                        &p->batch.downs)) ||
        (rc = pp_lanes_open(p)) || (rc = pp_write_lanes_open(p)))
        goto fail;
    if (pthread_create(&p->thread, NULL, pp_dispatch_main, p)) {
        rc = ect_set_error(ECT_ENOMEM, "push producer: cannot start the dispatcher thread");
        goto fail;
    }
    p->thread_started = true;
    if ((rc = met_source_add("push_producer", NULL, collect, p, &p->met))) goto fail;
    *out = p;
    return 0;
fail:
    ect_push_producer_close(p);
    return rc;
}

static int check_str(const char *s, size_t max, const char *field) {
    if (!s || !*s) return ect_set_error(ECT_EINVAL, "%s must be a non-empty string", field);
    if (strlen(s) > max)
        return ect_set_error(ECT_EINVAL, "%s is longer than %zu bytes", field, max);
    return 0;
}

/* Ends the step: releases the held records and stages, and queues their
 * reserves on this thread when no thread runs rounds (producer.h, "the
 * baton"; whatever could block is handed to the dispatcher), else leaves
 * them to the one that does. Returns how many records. Caller holds mu; it
 * may be dropped meanwhile. */
static size_t flush_locked(ect_push_producer *p, bool lend) {
    size_t n = push_flush(p->table);
    if (n) p->st.steps++;
    p->kick = true;
    /* A lone step (nothing else in flight) flushed by flush_poll is left to
     * the poll that follows; with steps in flight the lanes keep theirs, so
     * that the caller is free to flush the next step as soon as a result is
     * in. Without keys only: a libzmq REQ is not lent (control_client.h). */
    if (lend && n && !p->keys) {
        push_stats ps;
        push_get_stats(p->table, &ps);
        p->kick_lender |= ps.live == n && !p->unreported;
    }
    pp_run_locked(p, PP_RUN_CALLER, NULL);
    return n;
}

/* ect_pool_alloc of a staging copy, waiting for room (see the top). */
static int staging_alloc(ect_push_producer *p, uint64_t n, uint64_t *off) {
    int rc = ect_pool_alloc(p->pool, n, off);
    if (rc != ECT_EFULL) return rc;
    uint64_t cap = ect_pool_capacity(p->pool);
    if (n > cap)
        return ect_set_error(ECT_EFULL,
                             "the item (%" PRIu64
                             " bytes) is larger than the staging pool (%" PRIu64
                             " bytes): raise staging_size or borrow the source",
                             n, cap);
    if (!p->o.staging_wait_ms) return rc;
    uint64_t t0 = ect_now_ms(), end = t0 + p->o.staging_wait_ms;
    pthread_mutex_lock(&p->mu);
    p->st.staging_waits++;
    flush_locked(p, false);
    for (;;) {
        if (p->stop) {
            pthread_mutex_unlock(&p->mu);
            return ect_set_error(ECT_ECLOSED, "push producer is closing");
        }
        /* Allocating under mu is fine (the pool has its own lock and frees
         * signal `room` under mu), and it closes the gap between a failed
         * try and the wait, where a free could be missed. */
        if ((rc = ect_pool_alloc(p->pool, n, off)) != ECT_EFULL) break;
        uint64_t now = ect_now_ms();
        if (now >= end) break;
        ect_cond_wait_until(&p->room, &p->mu, ect_deadline_ns(end - now > 100 ? 100 : end - now));
    }
    pthread_mutex_unlock(&p->mu);
    if (rc == ECT_EFULL)
        return ect_set_error(ECT_EFULL,
                             "the staging pool (%" PRIu64 " bytes) stayed full for %" PRIu64
                             " ms (staging_wait_ms) with %" PRIu64 " bytes wanted",
                             cap, ect_now_ms() - t0, n);
    return rc;
}

/* Takes the source: borrowed, or copied into the staging pool. Caller holds no lock. */
static int take_src(ect_push_producer *p, push_source *src, const void *data, uint64_t nbytes,
                    ect_push_release_fn release, void *user) {
    memset(src, 0, sizeof *src);
    if (!data && nbytes) return ect_set_error(ECT_EINVAL, "data is NULL");
    if (release) {
        src->data = data;
        src->release = release;
        src->user = user;
        return 0;
    }
    if (!p->pool)
        return ect_set_error(ECT_EINVAL, "release is NULL but the producer has no staging pool "
                                         "(staging_size 0): borrow the source");
    uint64_t off = 0;
    /* A device source is copied device-to-host by the driver; the staging
     * pool is pinned on the first one so that copy runs at bus speed. */
    if (nbytes && mem_is_device(data, NULL) && ect_pool_mem_kind(p->pool) == ECT_MEM_HOST &&
        pool_pin(p->pool) != 0)
        ECT_LOGW(MOD, "pinning the staging pool failed (%s): device copies run slower",
                 ect_last_error());
    int rc = staging_alloc(p, nbytes ? nbytes : 1, &off);
    if (rc) return rc;
    if ((rc = ect_mem_copy((char *)ect_pool_base(p->pool) + off, data, nbytes))) {
        char why[256];
        ect_strcpy_cut(why, sizeof why, ect_last_error());
        ect_pool_free(p->pool, off);
        return ect_set_error(rc, "staging the source: %s", why);
    }
    src->data = (char *)ect_pool_base(p->pool) + off;
    src->pool_off = off;
    return 0;
}

/* Gives a source back: fires its release callback, or frees its staging
 * copy and returns true (the caller wakes a staging wait). Without mu. */
static bool give_back_src(ect_push_producer *p, const push_source *src, uint64_t nbytes) {
    if (src->release) {
        src->release(src->user, src->data, nbytes);
        return false;
    }
    if (!src->data) return false;
    ect_pool_free(p->pool, src->pool_off);
    return true;
}

/* give_back_src, and a staging wait hears of the room. Call without mu. */
static void release_src(ect_push_producer *p, const push_source *src, uint64_t nbytes) {
    if (!give_back_src(p, src, nbytes)) return;
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->room);
    pthread_mutex_unlock(&p->mu);
}

/* A source never handed to the table: a staging copy is freed, a borrowed
 * one stays the caller's (its callback never fires). */
static void drop_src(ect_push_producer *p, const push_source *src) {
    if (!src->release && src->data) release_src(p, src, 0);
}

int ect_push_producer_reserve(ect_push_producer *p, const ect_push_item *item) {
    if (!p || !item) return ect_set_error(ECT_EINVAL, "ect_push_producer_reserve: NULL argument");
    int rc;
    if ((rc = check_str(item->transfer_id, PUSH_KEY_MAX, "transfer_id")) ||
        (rc = check_str(item->mm_hash, PUSH_KEY_MAX, "mm_hash")) ||
        (rc = check_str(item->consumer, PUSH_ADDR_MAX, "consumer")))
        return rc;
    if (item->ndim > WIRE_MAX_NDIM)
        return ect_set_error(ECT_EINVAL, "ndim must be 0..%d, not %zu", WIRE_MAX_NDIM, item->ndim);
    if (item->ndim && !item->shape) return ect_set_error(ECT_EINVAL, "shape is NULL");
    if (!item->dtype) return ect_set_error(ECT_EINVAL, "dtype is NULL");
    if ((rc = wire_check_nbytes(item->dtype, item->shape, item->ndim, item->nbytes, "item")))
        return rc;
    char host[PUSH_HOST_MAX + 1];
    int port;
    if ((rc = ect_hostport_parse("consumer", item->consumer, 1, 65535, host, sizeof host, &port)))
        return rc;
    /* A repeated id is refused before its source is copied (push_add refuses
     * it again under the same lock that adds): one lookup per item when the
     * source is borrowed. */
    bool copies = item->data && !item->release;
    pthread_mutex_lock(&p->mu);
    bool known = copies && push_find(p->table, item->transfer_id) != NULL, closing = p->stop;
    pthread_mutex_unlock(&p->mu);
    if (closing) return ect_set_error(ECT_ECLOSED, "push producer is closing");
    if (known)
        return ect_set_error(ECT_EEXIST, "transfer_id '%s' already pushed", item->transfer_id);
    push_source src = {0};
    if (item->data &&
        (rc = take_src(p, &src, item->data, item->nbytes, item->release, item->release_user)))
        return rc;
    push_item pi = {.transfer_id = item->transfer_id,
                    .consumer = item->consumer,
                    .host = host,
                    .port = port,
                    .mm_hash = item->mm_hash,
                    .nbytes = item->nbytes,
                    .shape = item->shape,
                    .ndim = item->ndim,
                    .dtype = item->dtype,
                    .held = true,
                    .src = item->data ? &src : NULL,
                    .t0_ns = ect_now_ns()};
    pthread_mutex_lock(&p->mu);
    /* the table refuses a racing reserve of the same id (dedup) */
    rc = p->stop ? ect_set_error(ECT_ECLOSED, "push producer is closing")
                 : push_add(p->table, &pi, pp_now(p), NULL);
    pthread_mutex_unlock(&p->mu);
    if (rc) drop_src(p, &src);
    if (rc == ECT_EEXIST)
        return ect_set_error(ECT_EEXIST, "transfer_id '%s' already pushed", item->transfer_id);
    return rc;
}

int ect_push_producer_stage(ect_push_producer *p, const char *transfer_id, const void *data,
                            uint64_t nbytes, ect_push_release_fn release, void *release_user) {
    if (!p || !transfer_id) return ect_set_error(ECT_EINVAL, "ect_push_producer_stage: NULL");
    pthread_mutex_lock(&p->mu);
    int rc = push_stage_begin(p->table, transfer_id, nbytes); /* holds the record while we copy */
    pthread_mutex_unlock(&p->mu);
    if (rc) return rc;
    push_source src;
    int crc = take_src(p, &src, data, nbytes, release, release_user);
    pthread_mutex_lock(&p->mu);
    rc = push_stage_end(p->table, transfer_id, crc ? NULL : &src, pp_now(p));
    pthread_mutex_unlock(&p->mu);
    if (crc) return crc;
    if (rc) drop_src(p, &src); /* cancelled while we copied: never fire the callback */
    return rc;
}

/* ect_push_producer_flush; lend: the caller polls next (flush_poll). */
static int flush(ect_push_producer *p, bool lend) {
    pthread_mutex_lock(&p->mu);
    if (p->stop) {
        pthread_mutex_unlock(&p->mu);
        return ect_set_error(ECT_ECLOSED, "push producer is closing");
    }
    size_t n = flush_locked(p, lend);
    pthread_mutex_unlock(&p->mu);
    return (int)n;
}

int ect_push_producer_flush(ect_push_producer *p) {
    if (!p) return ect_set_error(ECT_EINVAL, "ect_push_producer_flush: NULL");
    return flush(p, false);
}

static void push_result(ect_push_producer *p, const ect_push_result *r) {
    if (p->res_n == p->res_cap) {
        size_t cap = p->res_cap ? p->res_cap * 2 : 64;
        ect_push_result *n = malloc(cap * sizeof *n);
        if (!n) { /* keep the newest: drop the oldest result */
            ECT_LOGW(MOD, "out of memory: dropping the result of %s",
                     p->res[p->res_head].transfer_id);
            p->res_head = (p->res_head + 1) % p->res_cap;
            p->res_n--;
        } else {
            for (size_t i = 0; i < p->res_n; i++) n[i] = p->res[(p->res_head + i) % p->res_cap];
            free(p->res);
            p->res = n;
            p->res_cap = cap;
            p->res_head = 0;
        }
    }
    p->res[(p->res_head + p->res_n) % p->res_cap] = *r;
    p->res_n++;
}

void pp_count_finished_locked(ect_push_producer *p, const push_action *a, size_t n) {
    for (size_t i = 0; i < n; i++) p->unreported += a[i].kind == PUSH_ACT_FINISHED;
}

static const char *const met_kinds[PP_MET_KINDS] = {"tcp", "shm", "ucx", "other"};

static size_t met_kind(const char *t) {
    for (size_t k = 0; k + 1 < PP_MET_KINDS; k++)
        if (strcmp(t, met_kinds[k]) == 0) return k;
    return PP_MET_KINDS - 1;
}

static void collect(void *ctx, met_out *o) {
    ect_push_producer *p = ctx;
    ect_push_producer_stat st;
    ect_push_producer_stats(p, &st);
    uint64_t b[PP_MET_KINDS], n[PP_MET_KINDS];
    pthread_mutex_lock(&p->mu);
    memcpy(b, p->moved_bytes, sizeof b);
    memcpy(n, p->moved_items, sizeof n);
    pthread_mutex_unlock(&p->mu);
    char l[128];
    for (size_t k = 0; k < PP_MET_KINDS; k++) {
        met_labels(l, sizeof l, "transport", met_kinds[k], "direction", "out", (const char *)NULL);
        met_out_moved(o, l, b[k], n[k]);
    }
    met_out_latency(o, "reserve_to_done", &p->latency);
    met_out_failure(o, "failed", st.failed);
    met_out_failure(o, "cancelled", st.cancelled);
    met_out_counter(o, "ectransfer_refusals_total",
                    "Reserves refused, by reason (full is back-pressure: producers retry).",
                    met_labels(l, sizeof l, "reason", "full", (const char *)NULL),
                    st.full_refusals);
    met_out_counter(o, "ectransfer_retries_total",
                    "Reserve rounds started again after a full pool refused them.", NULL,
                    st.retries);
    met_out_control_requests(o, st.control_requests);
    met_out_gauge(o, "ectransfer_peers_held_down",
                  "Consumer addresses held down after failed exchanges (backoff running).", NULL,
                  (double)atomic_load(&p->batch.held_down));
    if (p->pool) {
        ect_pool_stat ps;
        ect_pool_stats(p->pool, &ps);
        met_out_pool(o, (double)ps.capacity, (double)ps.used, (double)ps.resident_bytes);
    }
}

/* Queues the result of a finished record (mu held; the caller wakes poll). */
static void finish_locked(ect_push_producer *p, const push_final *f) {
    ect_push_result r;
    memset(&r, 0, sizeof r);
    ect_strcpy_cut(r.transfer_id, sizeof r.transfer_id, f->transfer_id);
    r.status = f->status;
    ect_strcpy_cut(r.error, sizeof r.error, f->error);
    r.latency_ns = ect_now_ns() - f->t0_ns;
    r.shards = (uint32_t)f->n_shards;
    ect_strcpy_cut(r.transport, sizeof r.transport, f->transport);
    r.retries = f->retries;
    push_result(p, &r);
    if (f->status == 0) {
        met_observe_ns(&p->latency, r.latency_ns);
        if (f->transport[0]) { /* something was written (not every shard `cached`) */
            size_t k = met_kind(f->transport);
            p->moved_bytes[k] += f->nbytes * (f->n_shards ? f->n_shards : 1);
            p->moved_items[k]++;
        }
    }
    if (f->status == 0)
        p->st.done++;
    else if (f->status == ECT_ECANCELED)
        p->st.cancelled++;
    else
        p->st.failed++;
    p->unreported--;
}

void pp_local(ect_push_producer *p, const push_action *a, size_t n) {
    /* Sources first (a record's release comes before its report), then every
     * result under one lock with one wake-up of poll and of a staging wait. */
    bool freed = false, finished = false;
    for (size_t i = 0; i < n; i++)
        if (a[i].kind == PUSH_ACT_RELEASE_SOURCE)
            freed |= give_back_src(p, &a[i].fin.src, a[i].fin.nbytes);
    for (size_t i = 0; i < n && !finished; i++) finished = a[i].kind == PUSH_ACT_FINISHED;
    if (!freed && !finished) return;
    pthread_mutex_lock(&p->mu);
    for (size_t i = 0; i < n; i++)
        if (a[i].kind == PUSH_ACT_FINISHED) finish_locked(p, &a[i].fin);
    pthread_mutex_unlock(&p->mu);
    /* After the unlock: a poll woken under it would block on mu at once.
     * Its wait looks at the results under mu, so it cannot miss them. */
    if (freed) pthread_cond_broadcast(&p->room);
    if (finished) pthread_cond_broadcast(&p->results);
}

int ect_push_producer_cancel(ect_push_producer *p, const char *transfer_id) {
    if (!p || !transfer_id) return ect_set_error(ECT_EINVAL, "ect_push_producer_cancel: NULL");
    pthread_mutex_lock(&p->mu);
    push_rec *r = push_find(p->table, transfer_id);
    if (!r || r->state == PUSH_DONE || r->state == PUSH_CANCELLED || r->state == PUSH_FAILED) {
        pthread_mutex_unlock(&p->mu);
        return ect_set_error(ECT_ENOTFOUND, "no push in flight for transfer_id '%s'", transfer_id);
    }
    push_action fin[2];
    size_t n = 0;
    int rc = push_cancel(p->table, transfer_id, pp_now(p), fin, &n);
    pp_count_finished_locked(p, fin, n);
    if (!n) { /* it went out: the dispatcher abandons it */
        p->kick = true;
        pthread_cond_signal(&p->wake);
    }
    pthread_mutex_unlock(&p->mu);
    pp_local(p, fin, n); /* nothing went out: it ends here */
    return rc;
}

/* Lends this thread to the lanes while they have work left to it and no
 * result is in (pp_lend), up to the poll's own end (ms; 0: none). Caller
 * holds mu; it is dropped meanwhile. */
static void lend_locked(ect_push_producer *p, uint64_t end_ms) {
    while (!p->res_n && !p->stop && (!end_ms || ect_now_ms() < end_ms)) {
        pthread_mutex_unlock(&p->mu);
        bool ran = pp_lend(p, end_ms);
        pthread_mutex_lock(&p->mu);
        if (!ran) return;
    }
}

/* Poll's wait (timeout_ms != 0) for a result, up to the timeout (< 0:
 * none). lend (flush_poll): meanwhile lends this thread to the work left to
 * it, and between lends also wakes for more such work (lend_seq). Caller
 * holds mu. */
static void wait_locked(ect_push_producer *p, int timeout_ms, bool lend) {
    uint64_t end_ms = timeout_ms < 0 ? 0 : ect_now_ms() + (uint64_t)timeout_ms;
    uint64_t end_ns = timeout_ms < 0 ? 0 : ect_deadline_ns((uint64_t)timeout_ms);
    while (!p->res_n && !p->stop) {
        uint64_t seq = p->lend_seq;
        if (lend) lend_locked(p, end_ms);
        if (p->res_n || p->stop || (end_ms && ect_now_ms() >= end_ms)) break;
        if (lend && p->lend_seq != seq) continue; /* more was left to it meanwhile */
        p->pollers++;
        bool out = false;
        if (timeout_ms < 0)
            pthread_cond_wait(&p->results, &p->mu);
        else
            out = ect_cond_wait_until(&p->results, &p->mu, end_ns) != 0;
        p->pollers--;
        if (out) break;
    }
}

static size_t poll_results(ect_push_producer *p, ect_push_result *out, size_t max,
                           int timeout_ms, bool lend) {
    pthread_mutex_lock(&p->mu);
    if (!p->res_n && timeout_ms != 0) wait_locked(p, timeout_ms, lend);
    size_t n = 0;
    while (n < max && p->res_n) {
        out[n++] = p->res[p->res_head];
        p->res_head = (p->res_head + 1) % p->res_cap;
        p->res_n--;
    }
    pthread_mutex_unlock(&p->mu);
    return n;
}

size_t ect_push_producer_poll(ect_push_producer *p, ect_push_result *out, size_t max,
                              int timeout_ms) {
    if (!p || !out || !max) return 0;
    return poll_results(p, out, max, timeout_ms, false);
}

int ect_push_producer_flush_poll(ect_push_producer *p, ect_push_result *out, size_t max,
                                 int timeout_ms, size_t *polled) {
    if (polled) *polled = 0;
    if (!p || !polled || (max && !out))
        return ect_set_error(ECT_EINVAL, "ect_push_producer_flush_poll: NULL argument");
    /* A lender while counted: a lane left asleep by this flush's round is
     * woken by whoever sees the count at 0 (pp_lane_submit, pp_wake_quiet
     * below), so no step waits for a poll that is gone. */
    bool lend = max && timeout_ms != 0;
    if (lend) atomic_fetch_add(&p->lenders, 1);
    int n = flush(p, lend);
    if (n >= 0 && max) *polled = poll_results(p, out, max, timeout_ms, lend);
    if (lend) {
        atomic_fetch_sub(&p->lenders, 1);
        pp_wake_quiet(p);
    }
    return n;
}

size_t ect_push_producer_pending(ect_push_producer *p) {
    if (!p) return 0;
    pthread_mutex_lock(&p->mu);
    push_stats ps;
    push_get_stats(p->table, &ps);
    size_t n = ps.live + p->unreported;
    pthread_mutex_unlock(&p->mu);
    return n;
}

void ect_push_producer_stats(ect_push_producer *p, ect_push_producer_stat *st) {
    if (!p || !st) return;
    pthread_mutex_lock(&p->mu);
    *st = p->st;
    const pb_counts *c = &p->batch.n;
    st->control_requests = c->control_requests;
    st->peers_requests = c->peers_requests;
    st->reserve_batches = c->reserve_batches;
    st->complete_batches = c->complete_batches;
    st->cancels = c->cancels;
    st->write_batches = c->write_batches;
    st->refreshes = c->refreshes;
    st->puts = c->puts;
    st->put_refusals = c->put_refusals;
    push_stats ps;
    push_get_stats(p->table, &ps);
    st->full_refusals = ps.full_refusals;
    st->retries = ps.retries;
    st->give_backs = ps.give_backs;
    pthread_mutex_unlock(&p->mu);
    if (p->pool) {
        ect_pool_stat pst;
        ect_pool_stats(p->pool, &pst);
        st->staged_bytes_in_use = pst.used;
    }
}

void ect_push_producer_close(ect_push_producer *p) {
    if (!p) return;
    met_source_remove(p->met);
    if (p->thread_started) {
        pthread_mutex_lock(&p->mu);
        p->stop = true;
        pthread_cond_broadcast(&p->wake);
        pthread_cond_broadcast(&p->results);
        pthread_cond_broadcast(&p->room);
        pthread_cond_broadcast(&p->baton);
        pthread_mutex_unlock(&p->mu);
        /* A control exchange in progress ends now, not at its control
         * timeout (a shard that never answers would hold close for all of
         * it): the context's shutdown wakes every wait of the lanes' clients
         * (ECT_EIO), and `closing` keeps a lane from starting another
         * exchange, whose wait that shutdown, seen once, would not wake
         * again. The dispatcher fails every item still in flight with
         * ECT_ECLOSED, whatever its exchanges' outcome. */
        atomic_store(&p->closing, true);
        if (p->zctx) zmq_ctx_shutdown(p->zctx);
        pthread_join(p->thread, NULL);
    }
    /* Single-threaded from here. The dispatcher ended every record (their
     * sources given back), closed the lanes and the transports on its way
     * out (or never started). */
    if (p->lanes) pp_lanes_close(p);
    lanes_close(p->wlanes, true);
    pp_routes_free(p);
    while (p->done) {
        px *x = p->done;
        p->done = x->next;
        px_free(x);
    }
    free(p->res);
    free(p->acts);
    push_close(p->table);
    down_close(p->batch.downs);
    pb_spares_free(&p->batch);
    if (p->zctx) zmq_ctx_term(p->zctx);
    ect_pool_close(p->pool);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->results);
    pthread_cond_destroy(&p->room);
    pthread_cond_destroy(&p->baton);
    pthread_cond_destroy(&p->wcv);
    pthread_mutex_destroy(&p->wmu);
    pthread_mutex_destroy(&p->mu);
    ect_keys_free(p->keys);
    free(p->curve_keys);
    free(p);
}
