/*
 * bench_push — `ect bench push`: generation-2 pushes through ect_push_producer
 * into one consumer shard (ect_push_consumer) in this process over loopback,
 * in steps of 1, 8 and 32 items of 64 KiB, 4.5 MiB and 16 MiB, over tcp and
 * shm. A step is timed from the first reserve to the last result
 * (reserve_batch, one write_batch, complete_batch). Beside each row, the limit
 * measured in the same run from the same sources: the transport's raw
 * ect_xport_write_batch of the same k writes into a region of the same kind
 * (a memfd pool registered with a target of its own), and the ratio
 * push / raw. A row's seconds are split into rounds (~100 ms, at least 3 of
 * each kind), push rounds and raw rounds in turn (run_row), so a change of
 * load on a busy machine hits both alike: a push round drains its steps
 * before the raw round starts, the warm-ups stay untimed, and each column
 * sums its own kind's rounds.
 *
 * The shard is the library's own, opened with an ephemeral control port; no
 * scheduler listens to its events (they queue and the oldest are dropped,
 * which costs the shard nothing measurable; the warning each drop logs is
 * kept quiet unless ECT_LOG asks for it). After each step the bench takes
 * and releases every item on the shard and evicts the resident copies,
 * outside the timed span and without a round trip, so every step allocates
 * afresh.
 *
 * Two hosts (tcp): `--server` runs one consumer shard and its scheduler (as
 * `ect push-consumer` does: every ready item accepted, taken and released as
 * it arrives, resident copies evicted) beside bench_remote's control
 * listener, which tells clients the shard's port and serves the raw-TCP
 * limit; `--client H:P` pushes the same steps to it and measures that limit
 * (k x n bytes, one byte back) between the same two hosts in the same run,
 * its rounds alternated with the push's as on loopback.
 */
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <time.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/bench_remote.h"
#include "cli/cli.h"
#include "ectransfer.h"

/* ------------------------------------------------------ a consumer shard */

typedef struct shard {
    ect_push_consumer *c;
    /* the raw limit's target: a region like the shard's pool, its own key */
    ect_pool *raw_pool;
    ect_xport *raw_x;
    char raw_key[ECT_XPORT_KEY_MAX];
} shard;

static void shard_close(shard *s) {
    if (!s) return;
    ect_push_consumer_close(s->c);
    ect_xport_close(s->raw_x);
    ect_pool_close(s->raw_pool);
    free(s);
}

static int shard_open(const char *kind, uint64_t pool_bytes, shard **out) {
    if (!getenv("ECT_LOG")) ect_log_set_level(ECT_LOG_ERROR); /* see the top of the file */
    shard *s = calloc(1, sizeof *s);
    if (!s) return ECT_ENOMEM;
    ect_push_consumer_opts co;
    ect_push_consumer_opts_init(&co);
    co.ec_port = 0;
    co.pool_size = pool_bytes;
    co.transport = kind;
    int rc = ect_push_consumer_open(&co, &s->c);
    ect_pool_opts po;
    ect_pool_opts_init(&po);
    po.capacity = pool_bytes;
    po.use_memfd = 1;
    if (!rc) rc = ect_pool_open(&po, &s->raw_pool);
    if (!rc) rc = ect_xport_open(kind, NULL, &s->raw_x);
    if (!rc)
        rc =
            ect_xport_register(s->raw_x, ect_pool_base(s->raw_pool), ect_pool_capacity(s->raw_pool),
                               ect_pool_fd(s->raw_pool), 0, s->raw_key);
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
    double cpu_us; /* process CPU time (every thread: producer and shard) per item */
    /* the latency limit (rows with one step in flight): p50 of a bare control
     * round trip to the same shard (ect_push_ping), and p50 / (2 x rtt + raw
     * p50), raw p50 being one raw write_batch of the step's k items */
    double rtt_ms, lat_ratio;
    size_t rounds, raw_rounds; /* the timed rounds of the push and of the limit */
    cli_thr_acc *thr;          /* --threads: CPU by thread over the push rounds (else NULL) */
    bool ok;
} row;

static void no_release(void *u, const void *d, uint64_t n) {
    (void)u;
    (void)d;
    (void)n;
}

#define MAX_LAT 200000

static uint64_t cpu_ns(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (uint64_t)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000000ull +
           (uint64_t)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1000ull;
}

/* Takes and releases one finished item on the shard (no round trip). */
static int shard_clear_one(shard *s, const char *tid) {
    ect_push_view v;
    int rc = ect_push_consumer_take(s->c, tid, &v);
    if (!rc) rc = ect_push_consumer_release(s->c, &v);
    return rc;
}

/* prefix then v in decimal into buf (64 bytes): the ids of the items, as
 * "%s%" PRIu64 " would write them, without a printf per item (a tenth of the
 * bench's own thread at one step in flight). */
static void bench_id(char buf[64], const char *prefix, uint64_t v) {
    char digits[20];
    size_t n = 0, lp = strlen(prefix);
    do {
        digits[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    memcpy(buf, prefix, lp);
    for (size_t i = 0; i < n; i++) buf[lp + i] = digits[n - 1 - i];
    buf[lp + n] = '\0';
}

#define PING_N 300
#define PING_BLOCK 16           /* round trips per block between steps */
#define PING_EVERY_NS 50000000u /* a block every 50 ms of the timed push */

/* Where a row's control round trips are timed and the samples taken
 * between its steps. */
typedef struct pinger {
    const char *host;
    int port;
    uint64_t rtt[PING_N + PING_BLOCK];
    size_t n;
    bool off; /* a block failed: no more between steps */
} pinger;

/* One block of round trips into pg (while room is left); its time is the
 * caller's to leave out of the push's span. A block that fails stops the
 * blocks (run_ping then times its own, and says why those fail). */
static void ping_block(pinger *pg) {
    if (pg->off || PING_N + PING_BLOCK - pg->n < PING_BLOCK) return;
    if (ect_push_ping(pg->host, pg->port, 30000, pg->rtt + pg->n, PING_BLOCK) == 0)
        pg->n += PING_BLOCK;
    else
        pg->off = true;
}

/* A row's push side: the producer, the items' sources and shape, room for
 * the results, and the sums over its timed rounds. */
typedef struct push_job {
    shard *s;         /* NULL: a remote consumer (the server clears the items) */
    const char *addr; /* the shard's control address */
    ect_push_producer *p;
    void **src;
    size_t k, inflight;
    uint64_t n, *serial;
    uint64_t shape[1];
    pinger *pg;
    ect_push_result *res; /* k x inflight */
    uint64_t *lat;        /* MAX_LAT per-item latencies of the timed rounds */
    size_t nlat, rounds;
    uint64_t busy_ns, cpu_ns, items, steps, next_ping;
} push_job;

/* Reserves one step of k items and flushes it; with inflight 1 the step is
 * waited for next, so it is flushed and its results polled in one call
 * (ect_push_producer_flush_poll, which runs a lone step on this thread, as
 * a latency-bound caller would): *m results, *polled set. */
static int push_step(push_job *j, size_t *m, bool *polled) {
    for (size_t i = 0; i < j->k; i++) {
        uint64_t id = (*j->serial)++;
        char tid[64], hash[64];
        bench_id(tid, "b-", id);
        bench_id(hash, "bh-", id);
        ect_push_item item = {.transfer_id = tid,
                              .consumer = j->addr,
                              .mm_hash = hash,
                              .shape = j->shape,
                              .ndim = 1,
                              .dtype = "bfloat16",
                              .nbytes = j->n,
                              .data = j->src[i],
                              .release = no_release};
        int rc = ect_push_producer_reserve(j->p, &item);
        if (rc) return rc;
    }
    if (j->inflight != 1) {
        ect_push_producer_flush(j->p);
        return 0;
    }
    *polled = true;
    int f = ect_push_producer_flush_poll(j->p, j->res, j->k * j->inflight, 1000, m);
    return f < 0 ? f : 0;
}

/* Checks m results, keeps their latencies (timed rounds) and frees their
 * items on the shard, without a round trip. */
static int push_settle(push_job *j, size_t m, bool warm) {
    int rc = 0;
    for (size_t i = 0; i < m; i++) {
        if (j->res[i].status) {
            fprintf(stderr, "ect bench push: %s failed: %s\n", j->res[i].transfer_id,
                    j->res[i].error);
            rc = j->res[i].status;
        }
        if (!warm && j->nlat < MAX_LAT) j->lat[j->nlat++] = j->res[i].latency_ns;
        if (!rc && j->s) rc = shard_clear_one(j->s, j->res[i].transfer_id);
    }
    if (m && j->s) ect_push_consumer_evict(j->s->c, SIZE_MAX);
    return rc;
}

/* One round of the push: starts steps until dur_ns pass (at least
 * min_steps), keeping up to `inflight` in flight (a new step is queued and
 * flushed as soon as fewer than `inflight` steps' items are unfinished),
 * then drains them: when it returns nothing is in flight. With inflight 1
 * the time spent clearing the shard (take + release + evict, no round trip)
 * is not counted: no step moves meanwhile. With more in flight it is: the
 * other steps move while this thread clears, so leaving it out would credit
 * the push with time it did not spend. With inflight 1, a block of bare
 * control round trips (the row's latency limit, run_ping) is timed every
 * PING_EVERY_NS between two steps of the timed rounds, its time left out
 * like the clearing: the limit is sampled across the same seconds as the
 * steps it is set beside. A timed round (!warm) adds to j's sums. */
static int push_round(push_job *j, uint64_t dur_ns, size_t min_steps, bool warm) {
    uint64_t t_start = cli_now_ns(), clear_ns = 0, cpu0 = cpu_ns();
    uint64_t t_end = t_start + dur_ns, deadline = cli_now_ms() + 60000;
    size_t started = 0, outstanding = 0, done = 0, rcap = j->k * j->inflight;
    int rc = 0;
    for (;;) {
        size_t m = 0;
        bool polled = false;
        while (!rc && outstanding + j->k <= rcap && (started < min_steps || cli_now_ns() < t_end)) {
            rc = push_step(j, &m, &polled);
            if (!rc) {
                outstanding += j->k;
                started++;
            }
        }
        if (rc || outstanding == 0) break;
        if (cli_now_ms() > deadline) {
            rc = ECT_ETIMEDOUT;
            break;
        }
        if (!polled || !m) m = ect_push_producer_poll(j->p, j->res, rcap, 1000);
        uint64_t c0 = cli_now_ns();
        rc = push_settle(j, m, warm);
        outstanding -= m;
        done += m;
        if (!rc && !warm && j->inflight == 1 && !outstanding && cli_now_ns() >= j->next_ping) {
            ping_block(j->pg); /* between two steps: nothing in flight */
            j->next_ping = cli_now_ns() + PING_EVERY_NS;
        }
        clear_ns += cli_now_ns() - c0;
    }
    if (!rc && !warm) {
        j->busy_ns += cli_now_ns() - t_start - (j->inflight == 1 ? clear_ns : 0);
        j->cpu_ns += cpu_ns() - cpu0;
        j->items += done;
        j->steps += started;
        j->rounds++;
    }
    return rc;
}

/* The limit's side of a row: one call moves the same k x n bytes (loopback:
 * raw_batch; two hosts: bench_remote_sink_iter); NULL fn: not measured. */
typedef struct raw_side {
    cli_iter_fn fn;
    void *ctx;
} raw_side;

/* A timed push round; with thr, the CPU of each thread over it (the two
 * snapshots lie outside the round's own clocks; bench_push checked once
 * that they can be taken, and a round whose snapshot fails is not added). */
static int push_round_threads(push_job *j, uint64_t dur_ns, cli_thr_acc *thr) {
    static cli_thr_snap a, b; /* one bench thread */
    if (!thr) return push_round(j, dur_ns, 1, false);
    bool before = cli_thr_snap_take(&a, true);
    uint64_t t0 = cli_now_ns();
    int rc = push_round(j, dur_ns, 1, false);
    uint64_t wall = cli_now_ns() - t0;
    if (!rc && before && cli_thr_snap_take(&b, false)) cli_thr_acc_add(thr, &a, &b, wall);
    return rc;
}

/* Measures a row into r: untimed, the push's warm-up (`inflight` steps, and
 * for warm_s seconds) and the limit's (one call, and for warm_s seconds);
 * then cli_round_count(secs) rounds of each kind, a push round and a limit
 * round in turn, each secs / that count long. A push round drains its steps
 * before the limit's round starts, so neither runs beside the other, and a
 * change of load on a busy machine hits both alike. The push's columns come
 * from its rounds only; raw GB/s and p50 from the limit's. A limit call
 * that fails stops the limit's rounds (its columns stay NaN). */
static int run_row(push_job *j, raw_side *raw, double secs, double warm_s, row *r) {
    size_t rounds = cli_round_count(secs);
    uint64_t dur = (uint64_t)(secs * 1e9) / rounds, warm_ns = (uint64_t)(warm_s * 1e9);
    cli_rounds lim = {.lat = malloc(MAX_LAT * sizeof(uint64_t)), .cap = MAX_LAT};
    ect_push_producer_stat st0, st1;
    int rc = lim.lat ? push_round(j, warm_ns, j->inflight, true) : ECT_ENOMEM;
    cli_rounds wl = lim; /* the limit's warm-up: its times are dropped */
    if (!rc && raw->fn && cli_round(raw->fn, raw->ctx, warm_ns, SIZE_MAX, &wl) != 0) raw->fn = NULL;
    ect_push_producer_stats(j->p, &st0);
    j->next_ping = cli_now_ns() + PING_EVERY_NS;
    for (size_t i = 0; !rc && i < rounds; i++) {
        rc = push_round_threads(j, dur, r->thr);
        if (!rc && raw->fn && cli_round(raw->fn, raw->ctx, dur, SIZE_MAX, &lim) != 0)
            raw->fn = NULL;
    }
    ect_push_producer_stats(j->p, &st1);
    if (!rc && j->steps) {
        cli_sort_u64(j->lat, j->nlat);
        r->items_s = (double)j->items / ((double)j->busy_ns / 1e9);
        r->gbps = (double)j->items * (double)j->n / (double)j->busy_ns;
        r->p50_ms = (double)cli_pct_u64(j->lat, j->nlat, 50) / 1e6;
        r->p99_ms = (double)cli_pct_u64(j->lat, j->nlat, 99) / 1e6;
        r->cpu_us = j->items ? (double)j->cpu_ns / 1e3 / (double)j->items : NAN;
        r->rt_per_step = (double)(st1.control_requests - st0.control_requests) / (double)j->steps;
        r->rounds = j->rounds;
        r->ok = true;
    }
    if (!rc && raw->fn && lim.n) {
        cli_timing t;
        cli_rounds_summarize(&lim, j->k * j->n, &t);
        r->raw_gbps = t.gbps;
        r->raw_p50_ms = t.p50_us / 1e3;
        r->raw_rounds = lim.rounds;
    }
    free(lim.lat);
    return rc;
}

/* The loopback limit: the same k writes as one ect_xport_write_batch into a
 * region of the raw pool, from the same sources. */
typedef struct raw_batch {
    ect_xport *ini;
    const char *session;
    ect_write *w;
    size_t k;
} raw_batch;

static int raw_batch_iter(void *p) {
    raw_batch *b = p;
    return ect_xport_write_batch(b->ini, b->session, b->w, b->k, NULL);
}

/* Allocates the limit's region (k x n bytes in s's raw pool) and points b's
 * k writes (w: room for k) at it from src; *off for ect_pool_free. */
static int raw_batch_open(shard *s, ect_xport *ini, void **src, size_t k, uint64_t n, ect_write *w,
                          raw_batch *b, uint64_t *off) {
    int rc = ect_pool_alloc(s->raw_pool, n * k, off);
    if (rc) return rc;
    for (size_t j = 0; j < k; j++) {
        w[j].src = src[j];
        w[j].dst_addr = (uint64_t)(uintptr_t)ect_pool_base(s->raw_pool) + *off + j * n;
        w[j].len = n;
        w[j].dst_key = s->raw_key;
    }
    *b = (raw_batch){.ini = ini, .session = ect_xport_session(s->raw_x), .w = w, .k = k};
    return 0;
}

/* The latency limit of a row: bare control round trips to the shard
 * (ect_push_ping: the producer's control client, op event_port), the blocks
 * timed between the push's steps (push_round) and, when those are fewer than
 * PING_N (a short row), PING_N right after; their p50 in r->rtt_ms, and
 * r->lat_ratio = push p50 / (2 x rtt + raw p50): a step with one in flight
 * is a reserve and a complete round trip around one write of its items.
 * Only for rows with one step in flight (with more, a step also waits
 * behind the others). */
static int run_ping(pinger *pg, size_t fl, row *r) {
    if (fl != 1) return 0;
    if (pg->n < PING_N) {
        int rc = ect_push_ping(pg->host, pg->port, 30000, pg->rtt, PING_N);
        if (rc) return rc;
        pg->n = PING_N;
    }
    cli_sort_u64(pg->rtt, pg->n);
    r->rtt_ms = (double)cli_pct_u64(pg->rtt, pg->n, 50) / 1e6;
    r->lat_ratio = r->p50_ms / (2 * r->rtt_ms + r->raw_p50_ms);
    return 0;
}

/* One row of the table, or one JSON object of the list (server: the remote
 * host, or NULL on loopback). */
static void print_row(bool json, bool *first, const char *kind, uint64_t n, size_t k, size_t fl,
                      const row *r, const char *server) {
    double ratio = r->gbps / r->raw_gbps;
    char sz[32];
    cli_fmt_size(n, sz, sizeof sz);
    if (json) {
        printf("%s{\"transport\":\"%s\",\"size\":%" PRIu64 ",\"step\":%zu,"
               "\"inflight\":%zu,\"items_per_s\":",
               *first ? "" : ",", kind, n, k, fl);
        const char *names[] = {
            "gbps",     "p50_ms",     "p99_ms",     "cpu_us_per_item", "round_trips_per_step",
            "raw_gbps", "raw_p50_ms", "ctl_rtt_ms", "p50_over_limit",  "ratio"};
        const double vals[] = {r->gbps,     r->p50_ms,     r->p99_ms, r->cpu_us,    r->rt_per_step,
                               r->raw_gbps, r->raw_p50_ms, r->rtt_ms, r->lat_ratio, ratio};
        cli_json_num(r->items_s);
        for (size_t i = 0; i < CLI_ARRAY_LEN(vals); i++) {
            printf(",\"%s\":", names[i]);
            cli_json_num(vals[i]);
        }
        printf(",\"rounds\":%zu,\"raw_rounds\":%zu", r->rounds, r->raw_rounds);
        if (server) printf(",\"limit\":\"raw-tcp\",\"server\":\"%s\"", server);
        if (r->thr) cli_thr_acc_print(r->thr, "push", true);
        printf("}");
        *first = false;
    } else {
        char rtt[16] = "       -", lim[16] = "      -";
        if (isfinite(r->rtt_ms)) snprintf(rtt, sizeof rtt, "%8.3f", r->rtt_ms);
        if (isfinite(r->lat_ratio)) snprintf(lim, sizeof lim, "%7.2f", r->lat_ratio);
        printf(
            "%-4s %9s %4zu %3zu %9.0f %8.2f %8.2f %8.2f %6.1f %8.1f   %8.2f %8.2f %s %s  %6.2f\n",
            kind, sz, k, fl, r->items_s, r->gbps, r->p50_ms, r->p99_ms, r->rt_per_step, r->cpu_us,
            r->raw_gbps, r->raw_p50_ms, rtt, lim, ratio);
        if (r->thr) cli_thr_acc_print(r->thr, "push", false);
    }
    fflush(stdout);
}

/* The cases of one run: every size x step x inflight, in that order. */
typedef struct cases {
    const uint64_t *sizes, *steps, *flights;
    size_t nsizes, nsteps, nflights;
    bool json, *first;
    bool threads; /* --threads */
    void **src;
    double secs, warm;
    uint64_t *serial;
} cases;

/* Measures one case into r (r->ok when it did); returns 0 or an error. */
typedef int (*case_fn)(void *ctx, const cases *cs, uint64_t n, size_t k, size_t fl, row *r);

/* Runs fn on every case and prints its row (kind: the transport; server:
 * the remote host or NULL). Returns CLI_EXIT_OK or CLI_EXIT_FAIL. */
static int run_cases(const cases *cs, const char *kind, const char *server, case_fn fn, void *ctx) {
    int rc = CLI_EXIT_OK;
    for (size_t zi = 0; zi < cs->nsizes; zi++) {
        for (size_t ki = 0; ki < cs->nsteps * cs->nflights; ki++) {
            uint64_t n = cs->sizes[zi];
            size_t k = (size_t)cs->steps[ki / cs->nflights];
            size_t fl = (size_t)cs->flights[ki % cs->nflights];
            row r;
            cli_thr_acc thr;
            memset(&r, 0, sizeof r);
            memset(&thr, 0, sizeof thr);
            r.thr = cs->threads ? &thr : NULL;
            r.raw_gbps = NAN;
            r.raw_p50_ms = NAN;
            r.rtt_ms = NAN;
            r.lat_ratio = NAN;
            if (fn(ctx, cs, n, k, fl, &r) != 0 || !r.ok) {
                fprintf(stderr, "ect bench push: %s%s%s %" PRIu64 " B x %zu: %s\n", kind,
                        server ? " to " : "", server ? server : "", n, k, ect_last_error());
                rc = CLI_EXIT_FAIL;
                continue;
            }
            print_row(cs->json, cs->first, kind, n, k, fl, &r, server);
        }
    }
    return rc;
}

/* A push_job for k items of n bytes with fl in flight; *j->res and j->lat
 * allocated (push_job_close frees them). */
static int push_job_open(push_job *j, shard *s, const char *addr, ect_push_producer *p,
                         const cases *cs, uint64_t n, size_t k, size_t fl, pinger *pg) {
    *j = (push_job){.s = s,
                    .addr = addr,
                    .p = p,
                    .src = cs->src,
                    .k = k,
                    .inflight = fl,
                    .n = n,
                    .serial = cs->serial,
                    .shape = {n / 2},
                    .pg = pg,
                    .res = calloc(k * fl, sizeof(ect_push_result)),
                    .lat = malloc(MAX_LAT * sizeof(uint64_t))};
    return j->res && j->lat ? 0 : ECT_ENOMEM;
}

static void push_job_close(push_job *j) {
    free(j->res);
    free(j->lat);
}

typedef struct local_ctx {
    shard *s;
    ect_push_producer *p;
    ect_xport *ini;
} local_ctx;

/* Loopback: the push and the transport's raw write_batch of the same k
 * writes, their rounds alternated (run_row). */
static int local_case(void *ctx, const cases *cs, uint64_t n, size_t k, size_t fl, row *r) {
    local_ctx *l = ctx;
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", ect_push_consumer_port(l->s->c));
    pinger pg = {.host = "127.0.0.1", .port = ect_push_consumer_port(l->s->c)};
    push_job j;
    raw_batch b;
    uint64_t off = 0;
    ect_write *w = calloc(k, sizeof *w);
    int e = push_job_open(&j, l->s, addr, l->p, cs, n, k, fl, &pg);
    if (!e) e = w ? raw_batch_open(l->s, l->ini, cs->src, k, n, w, &b, &off) : ECT_ENOMEM;
    if (!e) {
        raw_side raw = {raw_batch_iter, &b};
        e = run_row(&j, &raw, cs->secs, 0, r);
        if (!e && !raw.fn) e = ECT_EIO; /* the raw write failed: ect_last_error says why */
        ect_pool_free(l->s->raw_pool, off);
    }
    push_job_close(&j);
    free(w);
    return e ? e : run_ping(&pg, fl, r);
}

typedef struct remote_ctx {
    const char *host, *addr;
    int port, push_port;
    ect_push_producer *p;
} remote_ctx;

/* Two hosts: the push to the server's shard and raw TCP to the same server,
 * their rounds alternated (run_row). */
static int remote_case(void *ctx, const cases *cs, uint64_t n, size_t k, size_t fl, row *r) {
    remote_ctx *m = ctx;
    pinger pg = {.host = m->host, .port = m->push_port};
    push_job j;
    bench_remote_sink sink;
    int e = push_job_open(&j, NULL, m->addr, m->p, cs, n, k, fl, &pg);
    if (!e) {
        bool open = bench_remote_sink_open(m->host, m->port, cs->src, k, (size_t)n, &sink) == 0;
        raw_side raw = {open ? bench_remote_sink_iter : NULL, &sink};
        e = run_row(&j, &raw, cs->secs, cs->warm, r);
        if (!e && !raw.fn)
            fprintf(stderr, "ect bench push: client: raw TCP limit to %s failed\n", m->host);
        if (open) bench_remote_sink_close(&sink);
    }
    push_job_close(&j);
    if (e) return e;
    if (run_ping(&pg, fl, r) != 0)
        fprintf(stderr, "ect bench push: client: control round trips to %s failed: %s\n", m->host,
                ect_last_error());
    return 0;
}

/* ------------------------------------------------------------ two hosts */

typedef struct push_srv {
    ect_push_consumer *c;
    ect_push_scheduler *s;
    volatile bool stop;
    uint64_t items;
} push_srv;

/* Accepts every ready item, takes and releases it, evicts the resident
 * copies (each step allocates afresh, as on loopback). */
static void *push_srv_loop(void *p) {
    push_srv *v = p;
    pthread_setname_np(pthread_self(), "ect-bench-sched");
    while (!v->stop) {
        ect_push_scheduler_wait(v->s, 100); /* sleeps until an item lands (stop: within 100 ms) */
        ect_push_sched_item it;
        bool any = false;
        while (ect_push_scheduler_next(v->s, &it) == 0) {
            any = true;
            ect_push_view view;
            if (ect_push_consumer_take(v->c, it.transfer_id, &view) != 0 ||
                ect_push_consumer_release(v->c, &view) != 0) {
                fprintf(stderr, "ect bench push: server: %s: %s\n", it.transfer_id,
                        ect_last_error());
                ect_push_scheduler_fail(v->s, it.transfer_id, "consumer could not take the item");
                continue;
            }
            ect_push_scheduler_loaded(v->s, it.transfer_id);
            ect_push_scheduler_finished(v->s, it.transfer_id);
            v->items++;
        }
        while (ect_push_scheduler_next_failed(v->s, &it) == 0)
            fprintf(stderr, "ect bench push: server: transfer %s failed: %s: %s\n", it.transfer_id,
                    ect_push_state_name(it.state), it.error);
        if (any) ect_push_consumer_evict(v->c, SIZE_MAX);
    }
    return NULL;
}

static int push_server(const bench_remote_args *a, uint64_t pool) {
    if (!getenv("ECT_LOG")) ect_log_set_level(ECT_LOG_ERROR);
    push_srv v = {0};
    ect_push_consumer_opts co;
    ect_push_consumer_opts_init(&co);
    co.ec_ip = a->host;
    co.ec_port = 0;
    co.pool_size = pool;
    co.transport = "tcp";
    co.advertise = a->advertise;
    co.data_port = (int)a->data_port;
    int rc = CLI_EXIT_FAIL;
    pthread_t th;
    bool started = false;
    if (ect_push_consumer_open(&co, &v.c) != 0) {
        fprintf(stderr, "ect bench push: server: %s\n", ect_last_error());
        goto out;
    }
    ect_push_scheduler_opts so;
    ect_push_scheduler_opts_init(&so);
    so.consumer_host = !ect_host_is_wildcard(a->host) ? a->host
                       : strchr(a->host, ':')         ? "::1"
                                                      : "127.0.0.1";
    so.consumer_port = ect_push_consumer_port(v.c);
    so.tp_size = 1;
    so.accept_any = 1;
    if (ect_push_scheduler_open(&so, &v.s) != 0) {
        fprintf(stderr, "ect bench push: server: scheduler: %s\n", ect_last_error());
        goto out;
    }
    /* ready only once the scheduler reached the shard */
    for (uint64_t end = cli_now_ms() + 60000;;) {
        ect_push_scheduler_poll(v.s);
        ect_push_scheduler_stat st;
        ect_push_scheduler_stats(v.s, &st);
        if (st.shards == 1) break;
        if (cli_now_ms() > end) {
            fprintf(stderr, "ect bench push: server: the scheduler did not reach the shard\n");
            goto out;
        }
        struct timespec ts = {0, 2 * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (pthread_create(&th, NULL, push_srv_loop, &v) != 0) goto out;
    started = true;
    /* the xport target of the listener takes any port: --data-port is the shard's */
    rc = bench_remote_serve("push", a->host, (int)a->port, 0, a->advertise,
                            ect_push_consumer_port(v.c));
out:
    v.stop = true;
    if (started) pthread_join(th, NULL);
    if (started) fprintf(stderr, "ect bench push: server: %" PRIu64 " items\n", v.items);
    ect_push_scheduler_close(v.s);
    ect_push_consumer_close(v.c);
    return rc;
}

/* Pushes every case to the server at host:port and beside each row the
 * raw-TCP limit between the same two hosts. */
static int push_client(const char *host, int port, cases *cs) {
    if (!getenv("ECT_LOG")) ect_log_set_level(ECT_LOG_ERROR);
    int pp = 0;
    if (bench_remote_push_port(host, port, &pp) != 0) {
        fprintf(stderr,
                "ect bench push: client: no push server at %s port %d (ect bench push --server)\n",
                host, port);
        return CLI_EXIT_FAIL;
    }
    char addr[300];
    snprintf(addr, sizeof addr, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, pp);
    remote_ctx m = {.host = host, .addr = addr, .port = port, .push_port = pp};
    ect_push_producer_opts po;
    ect_push_producer_opts_init(&po);
    po.staging_size = 0;
    if (ect_push_producer_open(&po, &m.p) != 0) {
        fprintf(stderr, "ect bench push: client: %s\n", ect_last_error());
        return CLI_EXIT_FAIL;
    }
    /* transfer ids new to the server on every run (it remembers them a TTL) */
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    *cs->serial = (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec;
    int rc = run_cases(cs, "tcp", host, remote_case, &m);
    ect_push_producer_close(m.p);
    return rc;
}

static void help(void) {
    printf("usage: ect bench push [--json] [--transport tcp,shm] [--seconds S] [--steps 1,8,32]\n"
           "                      [--sizes 64KiB,4.5MiB,16MiB]\n\n"
           "Pushes through ect_push_producer into one consumer shard (ect_push_consumer) in\n"
           "this process on loopback, in steps of k items, and beside each row the\n"
           "transport's raw ect_xport_write_batch of the same k writes into a region of the\n"
           "same kind, measured in the same run: the row's push rounds and raw rounds\n"
           "alternate (~100 ms each, at least 3 of each; a push round drains its steps\n"
           "before the raw round starts), so a change of load hits both alike.\n"
           "Columns (each from its own kind's rounds): items/s, GB/s, per-item latency\n"
           "p50/p99 (reserve to result),\n"
           "control round trips per step (every op the producer sent, per shard), CPU time of\n"
           "the whole process (producer and shard, every thread) per item of the push rounds\n"
           "in microseconds\n"
           "(a per-item cost that a busy machine does not inflate much), raw GB/s and\n"
           "p50 of one raw batch (ms), with one step in flight the p50 of a bare control round\n"
           "trip to the same shard (rtt ms: ect_push_ping, op event_port; a block of 16 every\n"
           "50 ms between the row's steps, untimed, so limit and steps share their seconds)\n"
           "and p50/lim = push\n"
           "p50 / (2 x rtt + raw p50) (a step is a reserve and a complete round trip around\n"
           "one write; '-' with more in flight), and ratio = push GB/s / raw GB/s.\n\n"
           "  --json            one JSON list of rows (rounds, raw_rounds: the timed rounds\n"
           "                    of the push and of the limit)\n"
           "  --transport LIST  comma-separated back ends (default tcp,shm)\n"
           "  --seconds S       time of a row's push rounds, and of its raw rounds, 0.05..60,\n"
           "                    or 300ms (default 0.3)\n"
           "  --steps LIST      items per step (default 1,8,32; each 1..256)\n"
           "  --sizes LIST      item sizes (default 64KiB,4.5MiB,16MiB)\n"
           "  --inflight LIST   steps kept in flight (default 1: each step waits for the\n"
           "                    previous one's results; N: a new step starts whenever fewer\n"
           "                    than N are unfinished); column `fl`\n"
           "  --threads         after each row, the CPU of every thread over the row's push\n"
           "                    rounds, summed by thread name (README \"Threads\"), as a\n"
           "                    share of one CPU; JSON: \"threads\": {NAME: SHARE}\n"
           "  --pool-size SIZE  server: the shard's pool (default 1GiB)\n\n"
           "Two hosts (tcp), as `ect bench xport`: on one, `ect bench push --server`; on the\n"
           "other, `ect bench push --client HOST:PORT` pushes the same steps to it (JSON rows\n"
           "add limit and server); the raw column is then raw TCP between the same two hosts\n"
           "(k x n bytes, one byte back), measured in the same run; cpu is the client's.\n"
           "  --server          run one consumer shard and its scheduler (items released as\n"
           "                    they arrive) and the raw-TCP sink until SIGINT/SIGTERM;\n"
           "                    prints {\"event\":\"ready\",...,\"push_port\":N} once it listens\n"
           "  --host H          server: bind address (default 0.0.0.0; :: for IPv6)\n"
           "  --port P          server: control port (default 14590; 0: any free port)\n"
           "  --data-port P     server: the shard's fixed data-plane port (default: any)\n"
           "  --advertise HOST  server: the host producers are told to write to\n"
           "  --client H:P      run against the server at H:P ([v6]:P for IPv6)\n"
           "  --warmup D        client: untimed pushes before each measurement (default 200ms)\n"
           "Goals (issue 5): ratio >= 0.8 for 4.5 MiB items; round trips per step the same\n"
           "for k = 32 as for k = 1. Issue 13: p50/lim <= 1 for 64 KiB at k = 1.\n");
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

int bench_push(int argc, char **argv) {
    static const struct option opts[] = {{"json", no_argument, 0, 'j'},
                                         {"transport", required_argument, 0, 't'},
                                         {"seconds", required_argument, 0, 's'},
                                         {"steps", required_argument, 0, 'k'},
                                         {"sizes", required_argument, 0, 'z'},
                                         {"inflight", required_argument, 0, 'f'},
                                         {"pool-size", required_argument, 0, 'Z'},
                                         {"threads", no_argument, 0, 'T'},
                                         BENCH_REMOTE_OPTIONS,
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    bench_remote_args ra;
    bench_remote_args_init(&ra);
    uint64_t pool = 1ull << 30;
    bool json = false, threads = false;
    double secs = 0.3;
    const char *list = "tcp,shm";
    uint64_t steps[MAX_LIST] = {1, 8, 32}, sizes[MAX_LIST] = {64 << 10, 4718592, 16 << 20};
    uint64_t flights[MAX_LIST] = {1};
    size_t nsteps = 3, nsizes = 3, nflights = 1;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "jt:s:k:z:f:h", opts, NULL)) != -1) {
        int ar = bench_remote_arg("push", c, optarg, &ra);
        if (ar < 0) return CLI_EXIT_USAGE;
        if (ar > 0) continue;
        switch (c) {
        case 'Z':
            if (!cli_parse_size("--pool-size", optarg, &pool) || pool < (1u << 20))
                return cli_usage_error("bench push", "--pool-size: at least 1MiB");
            break;
        case 'j': json = true; break;
        case 'T': threads = true; break;
        case 't': list = optarg; break;
        case 's':
            if (!cli_parse_seconds("bench push", optarg, 0.05, 60, &secs)) return CLI_EXIT_USAGE;
            break;
        case 'k':
            if (!parse_list("--steps", optarg, steps, &nsteps, false)) return CLI_EXIT_USAGE;
            break;
        case 'z':
            if (!parse_list("--sizes", optarg, sizes, &nsizes, true)) return CLI_EXIT_USAGE;
            break;
        case 'f':
            if (!parse_list("--inflight", optarg, flights, &nflights, false)) return CLI_EXIT_USAGE;
            break;
        case 'h': help(); return CLI_EXIT_OK;
        default: return cli_bad_flag("bench push", opts);
        }
    }
    if (optind < argc)
        return cli_usage_error("bench push", "unexpected argument '%s'", argv[optind]);
    char ch[256];
    int cp = 0;
    if (bench_remote_check("push", &ra, ch, sizeof ch, &cp) != CLI_EXIT_OK) return CLI_EXIT_USAGE;
    if (ra.server) return push_server(&ra, pool);
    if (threads && !cli_thr_usable("bench push")) return CLI_EXIT_FAIL;
    char kinds[64];
    snprintf(kinds, sizeof kinds, "%s", list);
    for (char *save = NULL, *k = strtok_r(kinds, ",", &save); k; k = strtok_r(NULL, ",", &save))
        if (strcmp(k, "tcp") && strcmp(k, "shm") && strcmp(k, "ucx"))
            return cli_usage_error("bench push", "--transport: '%s' is not tcp, shm or ucx", k);
    uint64_t maxk = 0, maxn = 0;
    uint64_t maxf = 0;
    for (size_t i = 0; i < nsteps; i++) maxk = steps[i] > maxk ? steps[i] : maxk;
    for (size_t i = 0; i < nflights; i++) maxf = flights[i] > maxf ? flights[i] : maxf;
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
        printf("%-4s %9s %4s %3s %9s %8s %8s %8s %6s %8s   %8s %8s %8s %7s  %6s\n", "xprt", "size",
               "k", "fl", "items/s", "GB/s", "p50 ms", "p99 ms", "rt/stp", "cpu us/i", "raw GB/s",
               "raw p50", "rtt ms", "p50/lim", "ratio");
    int rc = CLI_EXIT_OK;
    bool first = true;
    uint64_t serial = 0;
    cases cs = {.sizes = sizes,
                .steps = steps,
                .flights = flights,
                .nsizes = nsizes,
                .nsteps = nsteps,
                .nflights = nflights,
                .json = json,
                .first = &first,
                .threads = threads,
                .src = src,
                .secs = secs,
                .warm = ra.warm_ms / 1000,
                .serial = &serial};
    if (ra.client) rc = push_client(ch, cp, &cs);
    snprintf(kinds, sizeof kinds, "%s", ra.client ? "" : list);
    for (char *save = NULL, *kind = strtok_r(kinds, ",", &save); kind;
         kind = strtok_r(NULL, ",", &save)) {
        local_ctx l = {0};
        ect_push_producer_opts po;
        ect_push_producer_opts_init(&po);
        po.staging_size = 0;
        if (shard_open(kind, maxk * maxn * (maxf + 1) + (64u << 20), &l.s) ||
            ect_xport_open(kind, NULL, &l.ini) || ect_push_producer_open(&po, &l.p)) {
            fprintf(stderr, "ect bench push: %s: %s\n", kind, ect_last_error());
            rc = CLI_EXIT_FAIL;
        } else if (run_cases(&cs, kind, NULL, local_case, &l) != CLI_EXIT_OK) {
            rc = CLI_EXIT_FAIL;
        }
        ect_push_producer_close(l.p);
        ect_xport_close(l.ini);
        shard_close(l.s);
    }
    if (json) printf("]\n");
    for (size_t j = 0; j < maxk; j++) free(src[j]);
    free(src);
    return rc;
}
