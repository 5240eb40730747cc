/*
 * bench_pull — `ect bench pull`: generation-1 pulls, producer and consumer in
 * this process over loopback. For each transport (tcp, shm), item size
 * (64 KiB, 4.5 MiB, 16 MiB) and case (1 item; 32 one after the other; 32 in
 * flight at once with one ect_pull_consumer_load_many), one measurement is
 * the consumer loading all `count` items (ECTransferPull -> producer write
 * lane -> data-plane write -> ECTransferComplete), then dropping them from
 * its pool so the next round pulls again. One after the other, each item is
 * dropped before the next is pulled (its region, and over shm its mapping,
 * is reused); in flight, the 32 items are held until all arrived, in 32
 * regions, as a consumer that needs them all holds them. The in-flight rows
 * have a consumer of their own, so their regions (and over shm the write
 * windows the producer mapped) do not change the pattern of the others.
 *
 * The limit, measured in the same run: the same bytes, from the same
 * producer pool memory, written with ect_xport_write_batch one item per call
 * into a registered memfd region of another handle of the same transport
 * (what a pull costs without the protocol). The in-flight rows add a second,
 * stricter one: the same writes batched as the producer's lane batches the
 * pulls queued for one consumer (up to 64 items / 4 MiB per write_batch).
 * Pull and raw rounds alternate, so a change of load on a busy machine hits
 * all alike.
 */
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cli/cli.h"
#include "ectransfer.h"

#define MiB (1024ull * 1024)

typedef struct row {
    double gbps, p50_ms, raw_gbps, raw_p50_ms;
    double bat_gbps; /* in-flight rows: the same writes batched as the lane does; else NaN */
    /* process CPU time (every thread: consumer, producer, data plane) per
     * item of the pull rounds, and of the limit's rounds (the batched one
     * for in-flight rows) */
    double cpu_us, lim_cpu_us;
    cli_thr_acc *thr; /* --threads: CPU by thread over the pull rounds (else NULL) */
    bool ok;
} row;

typedef int (*round_fn)(void *ctx);

/* Alternates rounds of a (pull) and b (raw) for `ms` in all (at least 3 of
 * each, at most 1000), so load changes on a busy machine hit both alike;
 * fills each one's p50 round time and GB/s at that median, and the CPU time
 * per item of a's rounds and of the limit's (c's when given, else b's). With
 * r->thr, also the CPU of each thread over a's rounds (the snapshots lie
 * outside the rounds' clocks; a round whose snapshot fails is not added). */
static int timed_pair(round_fn a, round_fn b, round_fn c, void *ctx, uint64_t bytes, int items,
                      int ms, row *r) {
    static uint64_t la[1000], lb[1000], lc[1000];
    static cli_thr_snap sa, sb; /* one bench thread */
    /* warm-up: connections, page faults */
    if (a(ctx) != 0 || b(ctx) != 0 || (c && c(ctx) != 0)) return -1;
    size_t n = 0;
    uint64_t t0 = cli_now_ns(), budget = (uint64_t)ms * 1000000ull, cpu_a = 0, cpu_lim = 0;
    while (n < 1000 && (n < 3 || cli_now_ns() - t0 < budget)) {
        bool snap = r->thr && cli_thr_snap_take(&sa, true);
        uint64_t ca = cli_cpu_ns(), t = cli_now_ns();
        if (a(ctx) != 0) return -1;
        uint64_t u = cli_now_ns(), cb = cli_cpu_ns();
        if (snap && cli_thr_snap_take(&sb, false)) cli_thr_acc_add(r->thr, &sa, &sb, u - t);
        if (b(ctx) != 0) return -1;
        uint64_t v = cli_now_ns(), cc = cli_cpu_ns();
        if (c && c(ctx) != 0) return -1;
        uint64_t ce = cli_cpu_ns();
        cpu_a += cb - ca;
        cpu_lim += c ? ce - cc : cc - cb;
        la[n] = u - t;
        lb[n] = v - u;
        lc[n] = cli_now_ns() - v;
        n++;
    }
    r->cpu_us = (double)cpu_a / 1e3 / (double)n / (double)items;
    r->lim_cpu_us = (double)cpu_lim / 1e3 / (double)n / (double)items;
    cli_sort_u64(la, n);
    cli_sort_u64(lb, n);
    cli_sort_u64(lc, n);
    r->bat_gbps = c ? (double)bytes / (double)cli_pct_u64(lc, n, 50) : NAN;
    /* Medians, not means: on a shared 2-core machine a few rounds stall for
     * tens of ms, and one stall would decide the mean of a short run. */
    r->gbps = (double)bytes / (double)cli_pct_u64(la, n, 50);
    r->raw_gbps = (double)bytes / (double)cli_pct_u64(lb, n, 50);
    r->p50_ms = (double)cli_pct_u64(la, n, 50) / 1e6;
    r->raw_p50_ms = (double)cli_pct_u64(lb, n, 50) / 1e6;
    return 0;
}

typedef struct ctx {
    ect_pull_consumer *c;
    ect_pull_meta meta;
    char (*names)[64];
    int count;
    bool many; /* all `count` pulls in flight at once (one load_many) */
    /* raw */
    ect_xport *init;
    const char *session, *key;
    const uint8_t **src;
    uint8_t *dst;
    uint64_t size;
} ctx;

static int pull_round(void *arg) {
    ctx *x = arg;
    ect_pool *pool = ect_pull_consumer_pool(x->c);
    if (x->many) { /* every pull in flight at once: one load_many */
        const char *hashes[32];
        ect_pull_meta metas[32];
        ect_pull_view views[32];
        int st[32];
        for (int i = 0; i < x->count; i++) {
            hashes[i] = x->names[i];
            metas[i] = x->meta;
        }
        int rc = ect_pull_consumer_load_many(x->c, (size_t)x->count, hashes, metas, views, st);
        for (int i = 0; i < x->count; i++) {
            if (st[i] == 0) {
                if (views[i].cached) rc = rc ? rc : -1;
                ect_pull_consumer_release(x->c, x->names[i]);
                ect_pool_remove(pool, x->names[i]);
            }
        }
        if (rc) fprintf(stderr, "ect bench pull: load_many: %s\n", ect_last_error());
        return rc ? -1 : 0;
    }
    for (int i = 0; i < x->count; i++) {
        ect_pull_view v;
        if (ect_pull_consumer_load(x->c, x->names[i], &x->meta, &v) != 0 || v.cached) {
            fprintf(stderr, "ect bench pull: load %s: %s\n", x->names[i], ect_last_error());
            return -1;
        }
        ect_pull_consumer_release(x->c, x->names[i]);
        ect_pool_remove(pool, x->names[i]);
    }
    return 0;
}

/* How the producer's write lane batches the pulls queued for one consumer
 * (src/pull/producer.c): at most this many items and bytes per write_batch,
 * at least one item. The in-flight rows' limit groups its writes alike. */
#define LANE_BATCH_ITEMS 64
#define LANE_BATCH_BYTES (4ull << 20)

/* The in-flight rows' second limit: the same writes, batched as the
 * producer's lane batches the pulls queued for one consumer. */
static int batched_round(void *arg) {
    ctx *x = arg;
    {
        ect_write w[32];
        for (int i = 0; i < x->count;) {
            size_t n = 0;
            uint64_t bytes = 0;
            while (i < x->count && n < LANE_BATCH_ITEMS &&
                   (n == 0 || bytes + x->size <= LANE_BATCH_BYTES)) {
                w[n++] =
                    (ect_write){.src = x->src[i],
                                .dst_addr = (uint64_t)(uintptr_t)(x->dst + (uint64_t)i * x->size),
                                .len = x->size,
                                .dst_key = x->key};
                bytes += x->size;
                i++;
            }
            if (ect_xport_write_batch(x->init, x->session, w, n, NULL) != 0) {
                fprintf(stderr, "ect bench pull: raw write: %s\n", ect_last_error());
                return -1;
            }
        }
        return 0;
    }
}

static int raw_round(void *arg) {
    ctx *x = arg;
    for (int i = 0; i < x->count; i++) {
        ect_write w = {.src = x->src[i],
                       .dst_addr = (uint64_t)(uintptr_t)(x->dst + (uint64_t)i * x->size),
                       .len = x->size,
                       .dst_key = x->key};
        if (ect_xport_write_batch(x->init, x->session, &w, 1, NULL) != 0) {
            fprintf(stderr, "ect bench pull: raw write: %s\n", ect_last_error());
            return -1;
        }
    }
    return 0;
}

/* the cases of a size: items, and whether they are all in flight at once */
static const struct {
    int count;
    bool many;
} cases[3] = {{1, false}, {32, false}, {32, true}};

static int one_kind(const char *kind, const uint64_t *sizes, size_t nsizes, int ms, bool json,
                    bool inflight_only, bool threads, bool *first) {
    const uint64_t pool_bytes = 32 * 16 * MiB + 64 * MiB;
    ect_pull_producer_opts po;
    ect_pull_producer_opts_init(&po);
    po.port = 0;
    po.transport = kind;
    po.pool_size = pool_bytes;
    ect_pull_producer *p = NULL;
    ect_pull_consumer *c = NULL, *cm = NULL; /* cm: the in-flight rows' own consumer */
    ect_xport *tgt = NULL, *init = NULL;
    uint8_t *dst = MAP_FAILED;
    int fd = -1, rc = 0;
    char key[ECT_XPORT_KEY_MAX], addr[64];
    if (ect_pull_producer_open(&po, &p) != 0) goto fail;
    snprintf(addr, sizeof addr, "127.0.0.1:%d", ect_pull_producer_port(p));
    ect_pull_consumer_opts co;
    ect_pull_consumer_opts_init(&co);
    co.producer = addr;
    co.transport = kind;
    co.pool_size = pool_bytes;
    co.timeout_ms = 30000;
    if (ect_pull_consumer_open(&co, &c) != 0 || ect_pull_consumer_open(&co, &cm) != 0) goto fail;
    if (ect_xport_open(kind, NULL, &tgt) != 0 || ect_xport_open(kind, NULL, &init) != 0) goto fail;
    fd = memfd_create("ect-bench-pull", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)(32 * 16 * MiB)) != 0) goto fail;
    dst = mmap(NULL, 32 * 16 * MiB, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (dst == MAP_FAILED) goto fail;
    if (ect_xport_register(tgt, dst, 32 * 16 * MiB, fd, 0, key) != 0) goto fail;

    static char names[32][64];
    const uint8_t *src[32];
    for (size_t si = 0; si < nsizes; si++) {
        uint64_t size = sizes[si];
        uint8_t *data = malloc(size);
        if (!data) goto fail;
        for (uint64_t k = 0; k < size; k++) data[k] = (uint8_t)(k * 131 + si);

        for (int i = 0; i < 32; i++) {
            snprintf(names[i], sizeof names[i], "bench-%" PRIu64 "-%d", size, i);
            uint64_t shape[1] = {size};
            if (ect_pull_producer_save(p, names[i], data, size, shape, 1, "uint8", NULL, NULL) !=
                0) {
                free(data);
                goto fail;
            }
        }
        free(data);
        if (ect_pull_producer_flush(p, 60000) != 0) goto fail;
        ect_pool *pp = ect_pull_producer_pool(p);
        for (int i = 0; i < 32; i++) {
            ect_resident_info info;
            if (ect_pool_lookup(pp, names[i], &info) != 0) goto fail;
            src[i] = (const uint8_t *)ect_pool_base(pp) + info.offset;
        }
        for (int ci = inflight_only ? 2 : 0; ci < 3; ci++) {
            int count = cases[ci].count, fl = cases[ci].many ? count : 1;
            ctx x = {.c = cases[ci].many ? cm : c,
                     .names = names,
                     .count = count,
                     .many = cases[ci].many,
                     .init = init,
                     .session = ect_xport_session(tgt),
                     .key = key,
                     .src = src,
                     .dst = dst,
                     .size = size};
            x.meta.nbytes = size;
            x.meta.ndim = 1;
            x.meta.shape[0] = size;
            snprintf(x.meta.dtype, sizeof x.meta.dtype, "uint8");
            row r = {0};
            cli_thr_acc thr;
            memset(&thr, 0, sizeof thr);
            r.thr = threads ? &thr : NULL;
            uint64_t bytes = size * (uint64_t)count;
            if (timed_pair(pull_round, raw_round, x.many ? batched_round : NULL, &x, bytes, count,
                           2 * ms, &r) != 0)
                goto fail;
            char sz[32];
            cli_fmt_size(size, sz, sizeof sz);
            double ratio = r.gbps / r.raw_gbps;
            if (json) {
                printf("%s{\"transport\":\"%s\",\"size\":%" PRIu64
                       ",\"items\":%d,\"inflight\":%d,\"gbps\":%.17g,\"p50_ms\":%.17g,"
                       "\"raw_gbps\":%.17g,\"raw_p50_ms\":%.17g,\"ratio\":%.17g,"
                       "\"raw_batched_gbps\":",
                       *first ? "" : ",", kind, size, count, fl, r.gbps, r.p50_ms, r.raw_gbps,
                       r.raw_p50_ms, ratio);
                cli_json_num(r.bat_gbps);
                printf(",\"ratio_batched\":");
                cli_json_num(r.gbps / r.bat_gbps);
                printf(",\"cpu_us_per_item\":%.17g,\"limit_cpu_us_per_item\":%.17g", r.cpu_us,
                       r.lim_cpu_us);
                if (r.thr) cli_thr_acc_print(r.thr, "pull", true);
                printf("}");
                *first = false;
            } else {
                char bat[48];
                if (isfinite(r.bat_gbps))
                    snprintf(bat, sizeof bat, " %10.3f %7.2f", r.bat_gbps, r.gbps / r.bat_gbps);
                else
                    snprintf(bat, sizeof bat, " %10s %7s", "-", "-");
                printf("%-5s %10s %5d %3d %10.3f %12.3f %10.3f %12.3f %7.2f%s %8.2f %8.2f\n", kind,
                       sz, count, fl, r.gbps, r.p50_ms, r.raw_gbps, r.raw_p50_ms, ratio, bat,
                       r.cpu_us, r.lim_cpu_us);
                if (r.thr) cli_thr_acc_print(r.thr, "pull", false);
            }
            fflush(stdout);
        }
        for (int i = 0; i < 32; i++) ect_pool_remove(pp, names[i]);
    }
    goto done;
fail:
    fprintf(stderr, "ect bench pull: %s: %s\n", kind, ect_last_error());
    rc = -1;
done:
    ect_pull_consumer_close(c);
    ect_pull_consumer_close(cm);
    ect_pull_producer_close(p);
    ect_xport_close(init);
    ect_xport_close(tgt);
    if (dst != MAP_FAILED) munmap(dst, 32 * 16 * MiB);
    if (fd >= 0) close(fd);
    return rc;
}

static void help(void) {
    printf(
        "usage: ect bench pull [--json] [--ms N] [--transport tcp,shm] [--sizes LIST]\n"
        "                      [--inflight-only] [--threads]\n\n"
        "Generation-1 pulls in this process over loopback: 1 and 32 items of 64 KiB, 4.5 MiB\n"
        "and 16 MiB loaded one after the other (pull round trip + write + completion), and\n"
        "32 with every pull in flight at once (ect_pull_consumer_load_many; column fl),\n"
        "beside the same bytes written with ect_xport_write_batch one item per call (raw,\n"
        "ratio) and, for the in-flight rows, batched as the producer's write lane batches\n"
        "the pulls queued for one consumer, up to 64 items / 4 MiB per call (batch, ratio b).\n"
        "cpu us/i: the process's CPU time (every thread) per item of the pull rounds; lim\n"
        "us/i: the same of the limit's rounds (the batched one for in-flight rows).\n\n"
        "  --json         one JSON list of rows: transport, size, items, inflight (1 or items),\n"
        "                 gbps (item bytes of a round over its median time), p50_ms (per\n"
        "                 round of `items` loads),\n"
        "                 raw_gbps, raw_p50_ms, ratio (gbps / raw_gbps), raw_batched_gbps\n"
        "                 and ratio_batched (in-flight rows; null for the others),\n"
        "                 cpu_us_per_item and limit_cpu_us_per_item\n"
        "  --ms N         time per measurement, pull and raw each (bare: ms, or 1s; default 400)\n"
        "  --transport L  comma-separated back ends (default tcp,shm)\n"
        "  --sizes LIST   item sizes, each 1 B .. 16 MiB (default 64KiB,4.5MiB,16MiB)\n"
        "  --inflight-only  only the rows with every pull in flight (fl 32), e.g. to profile "
        "them\n"
        "  --threads      after each row, the CPU of every thread over the row's pull rounds,\n"
        "                 summed by thread name (README \"Threads\"), as a share of one CPU;\n"
        "                 JSON: \"threads\": {NAME: SHARE}\n");
}

int bench_pull(int argc, char **argv) {
    static const struct option opts[] = {{"json", no_argument, 0, 'j'},
                                         {"ms", required_argument, 0, 'm'},
                                         {"transport", required_argument, 0, 't'},
                                         {"sizes", required_argument, 0, 'z'},
                                         {"inflight-only", no_argument, 0, 'i'},
                                         {"threads", no_argument, 0, 'T'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    bool json = false, inflight_only = false, threads = false;
    uint64_t ms = 400;
    char kinds[64] = "tcp,shm";
    uint64_t sizes[8] = {64 * 1024, 4718592, 16 * MiB};
    size_t nsizes = 3;
    optind = 1;
    int ch;
    while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (ch) {
        case 'j': json = true; break;
        case 'i': inflight_only = true; break;
        case 'T': threads = true; break;
        case 'm':
            if (!cli_parse_duration_u64("--ms", optarg, 1, 1, 60000, &ms)) return CLI_EXIT_USAGE;
            break;
        case 't': snprintf(kinds, sizeof kinds, "%s", optarg); break;
        case 'z': {
            char buf[256];
            snprintf(buf, sizeof buf, "%s", optarg);
            nsizes = 0;
            for (char *sv = NULL, *t = strtok_r(buf, ",", &sv); t; t = strtok_r(NULL, ",", &sv)) {
                if (nsizes == 8) return cli_usage_error("bench pull", "--sizes: at most 8 values");
                if (!cli_parse_size("--sizes", t, &sizes[nsizes])) return CLI_EXIT_USAGE;
                if (sizes[nsizes] < 1 || sizes[nsizes] > 16 * MiB)
                    return cli_usage_error("bench pull", "--sizes: each 1 B .. 16 MiB");
                nsizes++;
            }
            if (!nsizes) return cli_usage_error("bench pull", "--sizes: no size given");
            break;
        }
        case 'h': help(); return CLI_EXIT_OK;
        default: return cli_bad_flag("bench pull", opts);
        }
    }
    if (optind < argc)
        return cli_usage_error("bench pull", "unexpected argument '%s'", argv[optind]);
    if (threads && !cli_thr_usable("bench pull")) return CLI_EXIT_FAIL;
    if (json)
        printf("[");
    else
        printf("%-5s %10s %5s %3s %10s %12s %10s %12s %7s %10s %7s %8s %8s\n", "xport", "size",
               "items", "fl", "pull GB/s", "pull p50 ms", "raw GB/s", "raw p50 ms", "ratio",
               "batch GB/s", "ratio b", "cpu us/i", "lim us/i");
    bool first = true;
    int rc = CLI_EXIT_OK;
    char *save = NULL;
    for (char *k = strtok_r(kinds, ",", &save); k; k = strtok_r(NULL, ",", &save))
        if (one_kind(k, sizes, nsizes, (int)ms, json, inflight_only, threads, &first) != 0)
            rc = CLI_EXIT_FAIL;
    if (json) printf("]\n");
    return rc;
}
