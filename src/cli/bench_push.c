/*
 * bench_push — `ect bench push`: generation-2 pushes through ect_push_producer
 * into one consumer shard (ect_push_consumer) in this process over loopback,
 * in steps of 1, 8 and 32 items of 64 KiB, 4.5 MiB and 16 MiB, over tcp and
 * shm. A step is timed from the first reserve to the last result
 * (reserve_batch, one write_batch, complete_batch). Beside each row, the limit
 * measured in the same run from the same sources: the transport's raw
 * ect_xport_write_batch of the same k writes into a region of the same kind
 * (a memfd pool registered with a target of its own), and the ratio
 * push / raw.
 *
 * The shard is the library's own, opened with an ephemeral control port; no
 * scheduler listens to its events (they queue and the oldest are dropped,
 * which costs the shard nothing measurable; the warning each drop logs is
 * kept quiet unless ECT_LOG asks for it). After each step the bench takes
 * and releases every item on the shard and evicts the resident copies,
 * outside the timed span and without a round trip, so every step allocates
 * afresh.
 */
#include <getopt.h>
#include <sys/resource.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* Pushes steps of k items of n bytes until `secs` pass (at least 3 steps),
 * keeping up to `inflight` steps in flight: a new step is queued and flushed
 * as soon as fewer than `inflight` steps' items are unfinished. The time
 * spent clearing the shard (take + release + evict, no round trip) is not
 * counted. With inflight 1 every step waits for the previous one's results. */
static int run_push(shard *s, ect_push_producer *p, void **src, size_t k, uint64_t n, double secs,
                    size_t inflight, uint64_t *serial, row *r) {
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", ect_push_consumer_port(s->c));
    uint64_t shape[1] = {n / 2};
    size_t rcap = k * inflight;
    ect_push_result *res = calloc(rcap, sizeof *res);
    uint64_t *lat = malloc(MAX_LAT * sizeof *lat);
    if (!res || !lat) {
        free(res);
        free(lat);
        return ECT_ENOMEM;
    }
    size_t nlat = 0, steps = 0;
    uint64_t busy_ns = 0, items = 0;
    ect_push_producer_stat st0, st1;
    int rc = 0;
    for (int warm = 1; warm >= 0 && !rc; warm--) {
        ect_push_producer_stats(p, &st0);
        uint64_t t_start = cli_now_ns(), clear_ns = 0, cpu0 = cpu_ns();
        uint64_t t_end = t_start + (uint64_t)(secs * 1e9);
        size_t started = 0, outstanding = 0, done_items = 0;
        size_t want_steps = warm ? inflight : 3;
        uint64_t deadline = cli_now_ms() + 60000;
        for (;;) {
            bool more = started < want_steps || (!warm && cli_now_ns() < t_end);
            while (!rc && more && outstanding + k <= k * inflight) {
                for (size_t j = 0; j < k && !rc; j++) {
                    uint64_t id = (*serial)++;
                    char tid[64], hash[64];
                    snprintf(tid, sizeof tid, "b-%" PRIu64, id);
                    snprintf(hash, sizeof hash, "bh-%" PRIu64, id);
                    ect_push_item item = {.transfer_id = tid,
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
                outstanding += k;
                started++;
                more = started < want_steps || (!warm && cli_now_ns() < t_end);
            }
            if (rc || outstanding == 0) break;
            if (cli_now_ms() > deadline) {
                rc = ECT_ETIMEDOUT;
                break;
            }
            size_t m = ect_push_producer_poll(p, res, rcap, 1000);
            uint64_t c0 = cli_now_ns();
            for (size_t i = 0; i < m; i++) {
                if (res[i].status) {
                    fprintf(stderr, "ect bench push: %s failed: %s\n", res[i].transfer_id,
                            res[i].error);
                    rc = res[i].status;
                }
                if (!warm && nlat < MAX_LAT) lat[nlat++] = res[i].latency_ns;
                /* free the item on the shard, untimed and without a round trip */
                if (!rc) rc = shard_clear_one(s, res[i].transfer_id);
            }
            if (m) ect_push_consumer_evict(s->c, SIZE_MAX);
            clear_ns += cli_now_ns() - c0;
            outstanding -= m;
            done_items += m;
        }
        if (!warm) {
            busy_ns = cli_now_ns() - t_start - clear_ns;
            r->cpu_us = done_items ? (double)(cpu_ns() - cpu0) / 1e3 / (double)done_items : NAN;
            items = done_items;
            steps = started;
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
    return rc;
}

/* The raw limit: the same k writes as one ect_xport_write_batch. */
static int run_raw(shard *s, ect_xport *ini, void **src, size_t k, uint64_t n, double secs,
                   row *r) {
    uint64_t off = 0;
    ect_write *w = calloc(k, sizeof *w);
    uint64_t *lat = malloc(MAX_LAT * sizeof *lat);
    int rc = (w && lat) ? ect_pool_alloc(s->raw_pool, n * k, &off) : ECT_ENOMEM;
    if (rc) {
        free(w);
        free(lat);
        return rc;
    }
    for (size_t j = 0; j < k; j++) {
        w[j].src = src[j];
        w[j].dst_addr = (uint64_t)(uintptr_t)ect_pool_base(s->raw_pool) + off + j * n;
        w[j].len = n;
        w[j].dst_key = s->raw_key;
    }
    const char *sess = ect_xport_session(s->raw_x);
    rc = ect_xport_write_batch(ini, sess, w, k, NULL); /* warm-up: connect, map */
    size_t it = 0;
    uint64_t busy = 0, end = cli_now_ns() + (uint64_t)(secs * 1e9);
    for (; !rc && (it < 3 || cli_now_ns() < end) && it < MAX_LAT; it++) {
        uint64_t t0 = cli_now_ns();
        rc = ect_xport_write_batch(ini, sess, w, k, NULL);
        lat[it] = cli_now_ns() - t0;
        busy += lat[it];
    }
    if (!rc) {
        cli_sort_u64(lat, it);
        r->raw_gbps = (double)it * (double)k * (double)n / (double)busy;
        r->raw_p50_ms = (double)cli_pct_u64(lat, it, 50) / 1e6;
    }
    ect_pool_free(s->raw_pool, off);
    free(w);
    free(lat);
    return rc;
}

static void help(void) {
    printf("usage: ect bench push [--json] [--transport tcp,shm] [--seconds S] [--steps 1,8,32]\n"
           "                      [--sizes 64KiB,4.5MiB,16MiB]\n\n"
           "Pushes through ect_push_producer into one consumer shard (ect_push_consumer) in\n"
           "this process on loopback, in steps of k items, and beside each row the\n"
           "transport's raw ect_xport_write_batch of the same k writes into a region of the\n"
           "same kind, measured in the same run. Columns: items/s, GB/s, per-item latency p50/p99 "
           "(reserve to result),\n"
           "control round trips per step (every op the producer sent, per shard), CPU time of\n"
           "the whole process (producer and shard, every thread) per item in microseconds\n"
           "(a per-item cost that a busy machine does not inflate much), raw GB/s and\n"
           "p50 of one raw batch, and ratio = push GB/s / raw GB/s.\n\n"
           "  --json            one JSON list of rows\n"
           "  --transport LIST  comma-separated back ends (default tcp,shm)\n"
           "  --seconds S       time per row and per raw limit, 0.05..60, or 300ms (default 0.3)\n"
           "  --steps LIST      items per step (default 1,8,32; each 1..256)\n"
           "  --sizes LIST      item sizes (default 64KiB,4.5MiB,16MiB)\n"
           "  --inflight LIST   steps kept in flight (default 1: each step waits for the\n"
           "                    previous one's results; N: a new step starts whenever fewer\n"
           "                    than N are unfinished); column `fl`\n"
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

int bench_push(int argc, char **argv) {
    static const struct option opts[] = {
        {"json", no_argument, 0, 'j'},          {"transport", required_argument, 0, 't'},
        {"seconds", required_argument, 0, 's'}, {"steps", required_argument, 0, 'k'},
        {"sizes", required_argument, 0, 'z'},   {"inflight", required_argument, 0, 'f'},
        {"help", no_argument, 0, 'h'},          {0, 0, 0, 0}};
    bool json = false;
    double secs = 0.3;
    const char *list = "tcp,shm";
    uint64_t steps[MAX_LIST] = {1, 8, 32}, sizes[MAX_LIST] = {64 << 10, 4718592, 16 << 20};
    uint64_t flights[MAX_LIST] = {1};
    size_t nsteps = 3, nsizes = 3, nflights = 1;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "jt:s:k:z:f:h", opts, NULL)) != -1) {
        switch (c) {
        case 'j': json = true; break;
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
        printf("%-4s %9s %4s %3s %9s %8s %8s %8s %6s %8s   %8s %8s  %6s\n", "xprt", "size", "k",
               "fl", "items/s", "GB/s", "p50 ms", "p99 ms", "rt/stp", "cpu us/i", "raw GB/s",
               "raw p50", "ratio");
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
        if (shard_open(kind, maxk * maxn * (maxf + 1) + (64u << 20), &s) ||
            ect_xport_open(kind, NULL, &ini) || ect_push_producer_open(&po, &p)) {
            fprintf(stderr, "ect bench push: %s: %s\n", kind, ect_last_error());
            ect_push_producer_close(p);
            ect_xport_close(ini);
            shard_close(s);
            rc = CLI_EXIT_FAIL;
            continue;
        }
        for (size_t zi = 0; zi < nsizes; zi++) {
            for (size_t ki = 0; ki < nsteps * nflights; ki++) {
                uint64_t n = sizes[zi];
                size_t k = (size_t)steps[ki / nflights], fl = (size_t)flights[ki % nflights];
                row r;
                memset(&r, 0, sizeof r);
                r.raw_gbps = NAN;
                r.raw_p50_ms = NAN;
                int e = run_push(s, p, src, k, n, secs, fl, &serial, &r);
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
                           "\"inflight\":%zu,\"items_per_s\":",
                           first ? "" : ",", kind, n, k, fl);
                    cli_json_num(r.items_s);
                    printf(",\"gbps\":");
                    cli_json_num(r.gbps);
                    printf(",\"p50_ms\":");
                    cli_json_num(r.p50_ms);
                    printf(",\"p99_ms\":");
                    cli_json_num(r.p99_ms);
                    printf(",\"cpu_us_per_item\":");
                    cli_json_num(r.cpu_us);
                    printf(",\"round_trips_per_step\":");
                    cli_json_num(r.rt_per_step);
                    printf(",\"raw_gbps\":");
                    cli_json_num(r.raw_gbps);
                    printf(",\"raw_p50_ms\":");
                    cli_json_num(r.raw_p50_ms);
                    printf(",\"ratio\":");
                    cli_json_num(ratio);
                    printf("}");
                    first = false;
                } else {
                    printf("%-4s %9s %4zu %3zu %9.0f %8.2f %8.2f %8.2f %6.1f %8.1f   %8.2f %8.2f  "
                           "%6.2f\n",
                           kind, sz, k, fl, r.items_s, r.gbps, r.p50_ms, r.p99_ms, r.rt_per_step,
                           r.cpu_us, r.raw_gbps, r.raw_p50_ms, ratio);
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
