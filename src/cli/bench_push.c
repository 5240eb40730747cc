/*
 * bench_push — `ect bench push`: generation-2 pushes through ect_push_producer
 * into one consumer shard in this process over loopback, in steps of 1, 8 and
 * 32 items of 64 KiB, 4.5 MiB and 16 MiB, over tcp and shm. A step is timed
 * from the first reserve to the last result (reserve_batch, one write_batch,
 * complete_batch). Beside each row, the limit measured in the same run on the
 * same buffers: the transport's raw ect_xport_write_batch of the same k
 * writes into the same destination region, and the ratio push / raw.
 *
 * The consumer shard is the smallest real one: a REP socket on its own
 * thread answering peers / reserve_batch / complete_batch / cancel over a
 * reservation table (rsv_) on a memfd pool registered with the transport.
 * After each step the bench frees the items on the shard (cancel), outside
 * the timed span and without a round trip, so every step allocates afresh.
 */
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zmq.h>

#include "cli/cli.h"
#include "ectransfer.h"
#include "push/reservations.h"
#include "util/util.h"
#include "wire/control_msg.h"

/* ------------------------------------------------------ a consumer shard */

typedef struct shard {
    void *zctx, *rep;
    int port;
    pthread_t th;
    atomic_bool stop;
    pthread_mutex_t mu;
    ect_pool *pool;
    ect_xport *x;
    char key[ECT_XPORT_KEY_MAX];
    rsv_table *t;
    char kind[8];
} shard;

static void answer(shard *s, const void *buf, size_t len, char **out) {
    wire_ctl_request req;
    int rc = wire_ctl_decode_request(buf, len, &req);
    if (rc) {
        if (wire_ctl_encode_decode_failure(rc, out)) *out = NULL;
        return;
    }
    wire_ctl_reply rep;
    memset(&rep, 0, sizeof rep);
    rep.op = req.op;
    rep.ok = true;
    uint64_t now = ect_now_ms();
    uint16_t port = (uint16_t)s->port;
    wire_reserve_outcome *ro = NULL;
    wire_complete_result *co = NULL;
    pthread_mutex_lock(&s->mu);
    switch (req.op) {
    case WIRE_OP_PEERS:
        rep.u.peers.n = 1;
        rep.u.peers.ports = &port;
        break;
    case WIRE_OP_RESERVE_BATCH:
        ro = calloc(req.u.reserve_batch.n, sizeof *ro);
        rep.u.reserve_batch.n = ro ? req.u.reserve_batch.n : 0;
        rep.u.reserve_batch.items = ro;
        for (size_t i = 0; ro && i < req.u.reserve_batch.n; i++) {
            const wire_reserve_req *r = &req.u.reserve_batch.items[i].req;
            rsv_request rr = {r->transfer_id,  r->mm_hash,     r->tensor.nbytes,
                              r->tensor.shape, r->tensor.ndim, r->tensor.dtype};
            rsv_reply ry;
            if (req.u.reserve_batch.items[i].rc || rsv_reserve(s->t, &rr, now, &ry)) {
                ro[i].error = strdup(ect_last_error());
                continue;
            }
            ro[i].ok = true;
            wire_reserve_result *res = &ro[i].result;
            res->cancelled = ry.cancelled;
            snprintf(res->reservation_id, sizeof res->reservation_id, "%s", ry.reservation_id);
            if (ry.cancelled) continue;
            snprintf(res->dst_session, sizeof res->dst_session, "%s", ect_xport_session(s->x));
            res->dst_ptr = (uint64_t)(uintptr_t)ect_pool_base(s->pool) + ry.offset;
            res->nbytes = ry.nbytes;
            res->write = ry.write;
            res->ready = ry.ready;
            res->cached = ry.cached;
            snprintf(res->transport, sizeof res->transport, "%s", s->kind);
            res->dst_key = s->key;
        }
        break;
    case WIRE_OP_COMPLETE_BATCH:
        co = calloc(req.u.complete_batch.n, sizeof *co);
        rep.u.complete_batch.n = co ? req.u.complete_batch.n : 0;
        rep.u.complete_batch.items = co;
        for (size_t i = 0; co && i < req.u.complete_batch.n; i++)
            rsv_complete(s->t, req.u.complete_batch.items[i].transfer_id,
                         req.u.complete_batch.items[i].reservation_id, now, &co[i].completed,
                         &co[i].became_ready);
        break;
    case WIRE_OP_CANCEL:
        if (rsv_cancel(s->t, req.u.cancel.transfer_id, req.u.cancel.reservation_id,
                       req.u.cancel.abandon, req.u.cancel.refresh, now, &rep.u.cancelled)) {
            rep.ok = false;
            rep.error = (char *)ect_last_error();
        }
        break;
    default: rep.ok = false; rep.error = "not served by the bench shard";
    }
    while (rsv_event_peek(s->t)) rsv_event_pop(s->t);
    pthread_mutex_unlock(&s->mu);
    if (wire_ctl_encode_reply(&rep, out)) *out = NULL;
    for (size_t i = 0; ro && i < rep.u.reserve_batch.n; i++) free(ro[i].error);
    free(ro);
    free(co);
    wire_ctl_request_clear(&req);
}

static void *serve(void *arg) {
    shard *s = arg;
    while (!atomic_load(&s->stop)) {
        zmq_pollitem_t pi = {s->rep, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&pi, 1, 50) <= 0) continue;
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, s->rep, 0) < 0) {
            zmq_msg_close(&m);
            continue;
        }
        char *out = NULL;
        answer(s, zmq_msg_data(&m), zmq_msg_size(&m), &out);
        zmq_msg_close(&m);
        const char *fallback = "{\"ok\":false,\"error\":\"bench shard: out of memory\"}";
        zmq_send(s->rep, out ? out : fallback, strlen(out ? out : fallback), 0);
        free(out);
    }
    return NULL;
}

static void shard_close(shard *s) {
    if (!s) return;
    if (s->th) {
        atomic_store(&s->stop, true);
        pthread_join(s->th, NULL);
    }
    if (s->rep) zmq_close(s->rep);
    if (s->zctx) zmq_ctx_term(s->zctx);
    ect_xport_close(s->x);
    rsv_close(s->t);
    ect_pool_close(s->pool);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

static int shard_open(const char *kind, uint64_t pool_bytes, shard **out) {
    shard *s = calloc(1, sizeof *s);
    if (!s) return ECT_ENOMEM;
    pthread_mutex_init(&s->mu, NULL);
    snprintf(s->kind, sizeof s->kind, "%s", kind);
    ect_pool_opts po;
    ect_pool_opts_init(&po);
    po.capacity = pool_bytes;
    po.use_memfd = 1;
    int rc = ect_pool_open(&po, &s->pool);
    if (!rc) rc = ect_xport_open(kind, NULL, &s->x);
    if (!rc)
        rc = ect_xport_register(s->x, ect_pool_base(s->pool), ect_pool_capacity(s->pool),
                                ect_pool_fd(s->pool), 0, s->key);
    rsv_opts ro;
    rsv_opts_init(&ro);
    ro.mem = &rsv_pool_ops;
    ro.mem_ctx = s->pool;
    if (!rc) rc = rsv_open(&ro, &s->t);
    if (!rc) {
        s->zctx = zmq_ctx_new();
        s->rep = s->zctx ? zmq_socket(s->zctx, ZMQ_REP) : NULL;
        int zero = 0;
        char ep[128];
        size_t len = sizeof ep;
        if (!s->rep || zmq_setsockopt(s->rep, ZMQ_LINGER, &zero, sizeof zero) ||
            zmq_bind(s->rep, "tcp://127.0.0.1:*") ||
            zmq_getsockopt(s->rep, ZMQ_LAST_ENDPOINT, ep, &len))
            rc = ect_set_error(ECT_EIO, "bench shard: cannot bind a REP socket");
        else
            s->port = atoi(strrchr(ep, ':') + 1);
    }
    if (!rc && pthread_create(&s->th, NULL, serve, s)) rc = ECT_ENOMEM;
    if (rc) {
        shard_close(s);
        return rc;
    }
    *out = s;
    return 0;
}

/* --------------------------------------------------------------- timing */

typedef struct row {
    double items_s, gbps, p50_ms, p99_ms, rt_per_step, raw_gbps, raw_p50_ms;
    bool ok;
} row;

static void no_release(void *u, const void *d, uint64_t n) {
    (void)u;
    (void)d;
    (void)n;
}

#define MAX_LAT 200000

/* Pushes steps of k items of n bytes until `secs` pass (at least 3 steps). */
static int run_push(shard *s, ect_push_producer *p, void **src, size_t k, uint64_t n, double secs,
                    uint64_t *serial, row *r) {
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", s->port);
    uint64_t shape[1] = {n / 2};
    ect_push_result *res = calloc(k, sizeof *res);
    uint64_t *lat = malloc(MAX_LAT * sizeof *lat);
    char(*tids)[64] = calloc(k, sizeof *tids);
    if (!res || !lat || !tids) {
        free(res);
        free(lat);
        free(tids);
        return ECT_ENOMEM;
    }
    size_t nlat = 0, steps = 0;
    uint64_t busy_ns = 0, items = 0;
    ect_push_producer_stat st0, st1;
    int rc = 0;
    uint64_t t_end = 0;
    for (int warm = 1; warm >= 0 && !rc; warm--) {
        ect_push_producer_stats(p, &st0);
        uint64_t t_start = ect_now_ns();
        t_end = t_start + (uint64_t)(secs * 1e9);
        for (size_t it = 0; !rc && (it < 3 || ect_now_ns() < t_end) && (!warm || it < 1); it++) {
            uint64_t t0 = ect_now_ns();
            for (size_t j = 0; j < k && !rc; j++) {
                uint64_t id = (*serial)++;
                snprintf(tids[j], sizeof tids[j], "b-%" PRIu64, id);
                char hash[64];
                snprintf(hash, sizeof hash, "bh-%" PRIu64, id);
                ect_push_item item = {.transfer_id = tids[j],
                                      .consumer = addr,
                                      .mm_hash = hash,
                                      .shape = shape,
                                      .ndim = 1,
                                      .dtype = "bfloat16",
                                      .nbytes = n,
                                      .data = src[j],
                                      .release = no_release};
                rc = ect_push_producer_reserve(p, &item);
            }
            if (rc) break;
            ect_push_producer_flush(p);
            size_t got = 0;
            uint64_t deadline = ect_now_ms() + 60000;
            while (got < k && ect_now_ms() < deadline) {
                size_t m = ect_push_producer_poll(p, res + got, k - got, 1000);
                for (size_t i = got; i < got + m; i++) {
                    if (res[i].status) {
                        fprintf(stderr, "ect bench push: %s failed: %s\n", res[i].transfer_id,
                                res[i].error);
                        rc = res[i].status;
                    }
                    if (!warm && nlat < MAX_LAT) lat[nlat++] = res[i].latency_ns;
                }
                got += m;
            }
            if (got < k && !rc) rc = ECT_ETIMEDOUT;
            uint64_t t1 = ect_now_ns();
            if (!warm) {
                busy_ns += t1 - t0;
                items += k;
                steps++;
            }
            /* free the items on the shard, untimed and without a round trip */
            pthread_mutex_lock(&s->mu);
            for (size_t j = 0; j < k; j++) {
                bool c;
                rsv_cancel(s->t, tids[j], NULL, true, false, ect_now_ms(), &c);
            }
            pthread_mutex_unlock(&s->mu);
        }
    }
    ect_push_producer_stats(p, &st1);
    if (!rc && steps) {
        cli_sort_u64(lat, nlat);
        r->items_s = (double)items / ((double)busy_ns / 1e9);
        r->gbps = (double)items * (double)n / (double)busy_ns;
        r->p50_ms = (double)cli_pct_u64(lat, nlat, 50) / 1e6;
        r->p99_ms = (double)cli_pct_u64(lat, nlat, 99) / 1e6;
        r->rt_per_step = (double)(st1.control_requests - st0.control_requests) / (double)steps;
        r->ok = true;
    }
    free(res);
    free(lat);
    free(tids);
    return rc;
}

/* The raw limit: the same k writes as one ect_xport_write_batch. */
static int run_raw(shard *s, ect_xport *ini, void **src, size_t k, uint64_t n, double secs,
                   row *r) {
    uint64_t off = 0;
    ect_write *w = calloc(k, sizeof *w);
    uint64_t *lat = malloc(MAX_LAT * sizeof *lat);
    int rc = (w && lat) ? ect_pool_alloc(s->pool, n * k, &off) : ECT_ENOMEM;
    if (rc) {
        free(w);
        free(lat);
        return rc;
    }
    for (size_t j = 0; j < k; j++) {
        w[j].src = src[j];
        w[j].dst_addr = (uint64_t)(uintptr_t)ect_pool_base(s->pool) + off + j * n;
        w[j].len = n;
        w[j].dst_key = s->key;
    }
    const char *sess = ect_xport_session(s->x);
    rc = ect_xport_write_batch(ini, sess, w, k, NULL); /* warm-up: connect, map */
    size_t it = 0;
    uint64_t busy = 0, end = ect_now_ns() + (uint64_t)(secs * 1e9);
    for (; !rc && (it < 3 || ect_now_ns() < end) && it < MAX_LAT; it++) {
        uint64_t t0 = ect_now_ns();
        rc = ect_xport_write_batch(ini, sess, w, k, NULL);
        lat[it] = ect_now_ns() - t0;
        busy += lat[it];
    }
    if (!rc) {
        cli_sort_u64(lat, it);
        r->raw_gbps = (double)it * (double)k * (double)n / (double)busy;
        r->raw_p50_ms = (double)cli_pct_u64(lat, it, 50) / 1e6;
    }
    ect_pool_free(s->pool, off);
    free(w);
    free(lat);
    return rc;
}

static void help(void) {
    printf("usage: ect bench push [--json] [--transport tcp,shm] [--seconds S] [--steps 1,8,32]\n"
           "                      [--sizes 64KiB,4.5MiB,16MiB]\n\n"
           "Pushes through ect_push_producer into one consumer shard in this process (REP +\n"
           "reservation table + transport target on loopback), in steps of k items, and beside\n"
           "each row the transport's raw ect_xport_write_batch of the same k writes measured in\n"
           "the same run. Columns: items/s, GB/s, per-item latency p50/p99 (reserve to result),\n"
           "control round trips per step (every op the producer sent, per shard), raw GB/s and\n"
           "p50 of one raw batch, and ratio = push GB/s / raw GB/s.\n\n"
           "  --json            one JSON list of rows\n"
           "  --transport LIST  comma-separated back ends (default tcp,shm)\n"
           "  --seconds S       time per row and per raw limit, 0.05..60 (default 0.3)\n"
           "  --steps LIST      items per step (default 1,8,32; each 1..256)\n"
           "  --sizes LIST      item sizes (default 64KiB,4.5MiB,16MiB)\n"
           "Goals (issue 5): ratio >= 0.8 for 4.5 MiB items; round trips per step the same\n"
           "for k = 32 as for k = 1.\n");
}

#define MAX_LIST 8

static bool parse_list(const char *flag, const char *s, uint64_t *v, size_t *n, bool size) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    *n = 0;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (*n == MAX_LIST) {
            fprintf(stderr, "ect bench push: %s: at most %d values\n", flag, MAX_LIST);
            return false;
        }
        if (size ? !cli_parse_size(flag, t, &v[*n]) : !cli_parse_u64(flag, t, 1, 256, &v[*n]))
            return false;
        if (size && (v[*n] < 2 || v[*n] % 2 || v[*n] > (256ull << 20))) {
            fprintf(stderr, "ect bench push: %s: sizes must be even, 2 B .. 256 MiB\n", flag);
            return false;
        }
        (*n)++;
    }
    return *n > 0;
}

/* JSON numbers unrounded (%.17g round-trips a double): a reader that
 * recomputes a ratio gets exactly the one printed. */
static void jnum(double v) {
    if (isfinite(v))
        printf("%.17g", v);
    else
        printf("null");
}

int bench_push(int argc, char **argv) {
    static const struct option opts[] = {{"json", no_argument, 0, 'j'},
                                         {"transport", required_argument, 0, 't'},
                                         {"seconds", required_argument, 0, 's'},
                                         {"steps", required_argument, 0, 'k'},
                                         {"sizes", required_argument, 0, 'z'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    bool json = false;
    double secs = 0.3;
    const char *list = "tcp,shm";
    uint64_t steps[MAX_LIST] = {1, 8, 32}, sizes[MAX_LIST] = {64 << 10, 4718592, 16 << 20};
    size_t nsteps = 3, nsizes = 3;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "jt:s:k:z:h", opts, NULL)) != -1) {
        switch (c) {
        case 'j': json = true; break;
        case 't': list = optarg; break;
        case 's': {
            char *end;
            secs = strtod(optarg, &end);
            if (*end || !(secs >= 0.05 && secs <= 60))
                return cli_usage_error("bench push", "--seconds must be 0.05..60, got '%s'",
                                       optarg);
            break;
        }
        case 'k':
            if (!parse_list("--steps", optarg, steps, &nsteps, false)) return CLI_EXIT_USAGE;
            break;
        case 'z':
            if (!parse_list("--sizes", optarg, sizes, &nsizes, true)) return CLI_EXIT_USAGE;
            break;
        case 'h': help(); return CLI_EXIT_OK;
        default: return cli_bad_flag("bench push", opts);
        }
    }
    if (optind < argc)
        return cli_usage_error("bench push", "unexpected argument '%s'", argv[optind]);
    char kinds[64];
    snprintf(kinds, sizeof kinds, "%s", list);
    for (char *save = NULL, *k = strtok_r(kinds, ",", &save); k; k = strtok_r(NULL, ",", &save))
        if (strcmp(k, "tcp") && strcmp(k, "shm") && strcmp(k, "ucx"))
            return cli_usage_error("bench push", "--transport: '%s' is not tcp, shm or ucx", k);
    uint64_t maxk = 0, maxn = 0;
    for (size_t i = 0; i < nsteps; i++) maxk = steps[i] > maxk ? steps[i] : maxk;
    for (size_t i = 0; i < nsizes; i++) maxn = sizes[i] > maxn ? sizes[i] : maxn;
    void **src = calloc(maxk, sizeof *src);
    for (size_t j = 0; src && j < maxk; j++) {
        if (!(src[j] = malloc(maxn))) break;
        memset(src[j], (int)(j * 37 + 1), maxn);
    }
    if (!src || !src[maxk - 1]) {
        fprintf(stderr, "ect bench push: out of memory for %" PRIu64 " x %" PRIu64 " bytes\n", maxk,
                maxn);
        for (size_t j = 0; src && j < maxk; j++) free(src[j]);
        free(src);
        return CLI_EXIT_FAIL;
    }
    if (json)
        printf("[");
    else
        printf("%-4s %9s %4s %9s %8s %8s %8s %6s   %8s %8s  %6s\n", "xprt", "size", "k", "items/s",
               "GB/s", "p50 ms", "p99 ms", "rt/stp", "raw GB/s", "raw p50", "ratio");
    int rc = CLI_EXIT_OK;
    bool first = true;
    uint64_t serial = 0;
    snprintf(kinds, sizeof kinds, "%s", list);
    for (char *save = NULL, *kind = strtok_r(kinds, ",", &save); kind;
         kind = strtok_r(NULL, ",", &save)) {
        shard *s = NULL;
        ect_xport *ini = NULL;
        ect_push_producer *p = NULL;
        ect_push_producer_opts po;
        ect_push_producer_opts_init(&po);
        po.staging_size = 0;
        if (shard_open(kind, maxk * maxn * 2 + (64u << 20), &s) ||
            ect_xport_open(kind, NULL, &ini) || ect_push_producer_open(&po, &p)) {
            fprintf(stderr, "ect bench push: %s: %s\n", kind, ect_last_error());
            ect_push_producer_close(p);
            ect_xport_close(ini);
            shard_close(s);
            rc = CLI_EXIT_FAIL;
            continue;
        }
        for (size_t zi = 0; zi < nsizes; zi++) {
            for (size_t ki = 0; ki < nsteps; ki++) {
                uint64_t n = sizes[zi];
                size_t k = (size_t)steps[ki];
                row r;
                memset(&r, 0, sizeof r);
                r.raw_gbps = NAN;
                r.raw_p50_ms = NAN;
                int e = run_push(s, p, src, k, n, secs, &serial, &r);
                if (!e) e = run_raw(s, ini, src, k, n, secs, &r);
                if (e || !r.ok) {
                    fprintf(stderr, "ect bench push: %s %" PRIu64 " B x %zu: %s\n", kind, n, k,
                            ect_last_error());
                    rc = CLI_EXIT_FAIL;
                    continue;
                }
                double ratio = r.gbps / r.raw_gbps;
                char sz[32];
                cli_fmt_size(n, sz, sizeof sz);
                if (json) {
                    printf("%s\n {\"transport\":\"%s\",\"size\":%" PRIu64 ",\"step\":%zu,"
                           "\"items_per_s\":",
                           first ? "" : ",", kind, n, k);
                    jnum(r.items_s);
                    printf(",\"gbps\":");
                    jnum(r.gbps);
                    printf(",\"p50_ms\":");
                    jnum(r.p50_ms);
                    printf(",\"p99_ms\":");
                    jnum(r.p99_ms);
                    printf(",\"round_trips_per_step\":");
                    jnum(r.rt_per_step);
                    printf(",\"raw_gbps\":");
                    jnum(r.raw_gbps);
                    printf(",\"raw_p50_ms\":");
                    jnum(r.raw_p50_ms);
                    printf(",\"ratio\":");
                    jnum(ratio);
                    printf("}");
                    first = false;
                } else {
                    printf("%-4s %9s %4zu %9.0f %8.2f %8.2f %8.2f %6.1f   %8.2f %8.2f  %6.2f\n",
                           kind, sz, k, r.items_s, r.gbps, r.p50_ms, r.p99_ms, r.rt_per_step,
                           r.raw_gbps, r.raw_p50_ms, ratio);
                }
                fflush(stdout);
            }
        }
        ect_push_producer_close(p);
        ect_xport_close(ini);
        shard_close(s);
    }
    if (json) printf("\n]\n");
    for (size_t j = 0; j < maxk; j++) free(src[j]);
    free(src);
    return rc;
}
