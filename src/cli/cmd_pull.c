/*
 * cmd_pull — `ect pull`: a generation-1 consumer (scheduler + worker in one
 * process). Learns what a producer holds, loads the chosen items, verifies
 * each and prints one JSON line per item. Verification: when an mm_hash ends
 * in "-" + 16 hex digits (what `ect pull-producer` publishes), the loaded
 * bytes' cli_checksum must equal them; the size must always match the
 * announced nbytes.
 *
 * A load refused for want of room or of a free producer lane (ECT_EFULL,
 * ECT_EBUSY) is asked again with a backoff until --timeout: pressure is
 * waited out, not reported as a failure. The summary counts moved (loaded
 * with the announced size and, when the hash carries one, the checksum),
 * verified (of those, the ones whose hash carried a checksum to compare),
 * retried (moved after more than one attempt) and failed items.
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "ectransfer.h"

static void help(void) {
    printf(
        "usage: ect pull --from HOST:PORT [--hash H ... | --all] [--transport tcp|shm|ucx]\n"
        "                [--timeout D] [--wait D] [--pool-size SIZE]\n"
        "                [--listen HOST] [--advertise HOST] [--data-port P] [--curve-keys DIR]\n"
        "\n"
        "Asks the producer at HOST:PORT (its ec_port) what it holds, pulls the named items\n"
        "(or every item with --all), verifies them and prints one JSON line per item\n"
        "{mm_hash, nbytes, checksum, status, latency_ms, attempts}, then on stderr\n"
        "\"ect pull: M moved, V verified, R retried, F failed of N items\". A load the\n"
        "producer or this pool refuses for want of room or lanes (busy, full) is asked\n"
        "again with a backoff until --timeout (attempts > 1: retried). Exit 1 if any item\n"
        "failed.\n"
        "\n"
        "  --from HOST:PORT  the producer (required)\n"
        "  --hash H          an item to pull (repeatable)\n"
        "  --all             every item the producer holds\n"
        "  --transport T     data plane, as the producer's: tcp (default), shm, ucx\n"
        "  --timeout D       per-pull completion timeout, and how long a refused load is\n"
        "                    retried (500ms, 30s; bare: milliseconds; default 60s)\n"
        "  --wait D          how long to wait to learn the items (default 10s)\n"
        "  --pool-size SIZE  consumer pool (default 1GiB)\n"
        "  --listen HOST     where this consumer's data plane (tcp, ucx) listens for the\n"
        "                    producer's writes: 127.0.0.1 (default), an address of this host,\n"
        "                    or 0.0.0.0 / :: (the producer is then told the address of the\n"
        "                    interface that routes to it)\n"
        "  --advertise HOST  the host the producer is told to write to (NAT, a name)\n"
        "  --data-port P     fixed data-plane port (default: any free port)\n"
        "  --curve-keys DIR  CurveZMQ on every ZMQ socket (docs/SECURITY.md): DIR from `ect\n"
        "                    keygen`, with the peers' public keys in DIR/accept/; default off\n");
}

typedef struct item_list {
    char **hash;
    ect_pull_meta *meta;
    size_t n, cap;
} item_list;

static void collect(void *user, const char *h, const ect_pull_meta *m) {
    item_list *l = user;
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 16;
        char **nh = realloc(l->hash, nc * sizeof *nh);
        if (!nh) return;
        l->hash = nh;
        ect_pull_meta *nm = realloc(l->meta, nc * sizeof *nm);
        if (!nm) return;
        l->meta = nm;
        l->cap = nc;
    }
    l->hash[l->n] = strdup(h);
    if (!l->hash[l->n]) return;
    l->meta[l->n] = *m;
    l->n++;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The checksum embedded in an mm_hash ("...-<16 hex>"), if any. */
static bool embedded_sum(const char *h, uint64_t *sum) {
    const char *dash = strrchr(h, '-');
    if (!dash || strlen(dash + 1) != 16) return false;
    char *end;
    *sum = strtoull(dash + 1, &end, 16);
    return *end == '\0';
}

static void json_str(const char *s) {
    putchar('"');
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            printf("\\%c", ch);
        else if (ch < 0x20)
            printf("\\u%04x", ch);
        else
            putchar(ch);
    }
    putchar('"');
}

int cmd_pull(int argc, char **argv) {
    static const struct option opts[] = {{"from", required_argument, 0, 'f'},
                                         {"hash", required_argument, 0, 'H'},
                                         {"all", no_argument, 0, 'a'},
                                         {"transport", required_argument, 0, 't'},
                                         {"timeout", required_argument, 0, 'T'},
                                         {"wait", required_argument, 0, 'w'},
                                         {"pool-size", required_argument, 0, 'P'},
                                         {"listen", required_argument, 0, 'L'},
                                         {"advertise", required_argument, 0, 'A'},
                                         {"data-port", required_argument, 0, 'D'},
                                         {"curve-keys", required_argument, 0, 'K'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *curve_keys = NULL;
    const char *from = NULL, *transport = "tcp", *listen_host = "127.0.0.1", *advertise = NULL;
    uint64_t dport = 0;
    const char *hashes[1024];
    size_t nh = 0;
    bool all = false;
    uint64_t timeout = 60000, wait_ms = 10000, pool = 1ull << 30;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'f': from = optarg; break;
        case 'H':
            if (nh == 1024) return cli_usage_error("pull", "at most 1024 --hash");
            if (!optarg[0] || strlen(optarg) > ECT_MM_HASH_MAX)
                return cli_usage_error("pull", "--hash must be 1..%d bytes", ECT_MM_HASH_MAX);
            hashes[nh++] = optarg;
            break;
        case 'a': all = true; break;
        case 't': transport = optarg; break;
        case 'T':
            if (!cli_parse_duration_u64("--timeout", optarg, 1, 1, 3600000, &timeout))
                return CLI_EXIT_USAGE;
            break;
        case 'w':
            if (!cli_parse_duration_u64("--wait", optarg, 1, 0, 3600000, &wait_ms))
                return CLI_EXIT_USAGE;
            break;
        case 'P':
            if (!cli_parse_size("--pool-size", optarg, &pool)) return CLI_EXIT_USAGE;
            break;
        case 'L':
            if (!*optarg || strlen(optarg) > 250)
                return cli_usage_error("pull", "--listen: a host, 1..250 bytes");
            listen_host = optarg;
            break;
        case 'A':
            if (!*optarg || strlen(optarg) > 255 || ect_host_is_wildcard(optarg))
                return cli_usage_error("pull",
                                       "--advertise '%s': a host name or address the producer "
                                       "can reach, not a wildcard",
                                       optarg);
            advertise = optarg;
            break;
        case 'D':
            if (!cli_parse_u64("--data-port", optarg, 1, 65535, &dport)) return CLI_EXIT_USAGE;
            break;
        case 'K': curve_keys = optarg; break;
        case 'h': help(); return CLI_EXIT_OK;
        default: return cli_bad_flag("pull", opts);
        }
    }
    if (optind < argc) return cli_usage_error("pull", "unexpected argument '%s'", argv[optind]);
    if (!from) return cli_usage_error("pull", "--from HOST:PORT is required");
    char host[256];
    int port;
    if (!cli_parse_hostport("--from", from, host, sizeof host, &port)) return CLI_EXIT_USAGE;
    if ((nh > 0) == all) return cli_usage_error("pull", "give either --hash H ... or --all");

    ect_pull_scheduler_opts so;
    ect_pull_scheduler_opts_init(&so);
    so.curve_keys = curve_keys;
    so.producer = from;
    ect_pull_scheduler *s = NULL;
    if (ect_pull_scheduler_open(&so, &s) != 0) {
        fprintf(stderr, "ect pull: %s\n", ect_last_error());
        return CLI_EXIT_FAIL;
    }
    /* Learn: for --all until the inventory answer is complete; for --hash
     * until every named item is known. */
    item_list l = {0};
    for (uint64_t waited = 0;; waited += 5) {
        ect_pull_scheduler_poll(s);
        ect_pull_scheduler_stat st;
        ect_pull_scheduler_stats(s, &st);
        bool done = all ? st.synced != 0 : true;
        for (size_t i = 0; !all && i < nh; i++)
            if (ect_pull_scheduler_has(s, hashes[i], NULL) != 1) done = false;
        if (done || waited >= wait_ms) break;
        usleep(5000);
    }
    ect_pull_scheduler_foreach(s, collect, &l);
    int rc = CLI_EXIT_OK;
    if (all) {
        ect_pull_scheduler_stat st;
        ect_pull_scheduler_stats(s, &st);
        if (!st.synced) {
            fprintf(stderr,
                    "ect pull: %s did not answer the inventory request within %" PRIu64 " ms\n",
                    from, wait_ms);
            rc = CLI_EXIT_FAIL;
        }
        qsort(l.hash, l.n, sizeof *l.hash, cmp_str); /* meta is looked up again below */
    }
    ect_pull_consumer_opts co;
    ect_pull_consumer_opts_init(&co);
    co.curve_keys = curve_keys;
    co.producer = from;
    co.transport = transport;
    co.timeout_ms = (int)timeout;
    co.pool_size = pool;
    char listen[300];
    const char *lh = listen_host[0] == '[' ? listen_host + 1 : listen_host;
    size_t lhl = strlen(lh) - (listen_host[0] == '[' && lh[strlen(lh) - 1] == ']');
    snprintf(listen, sizeof listen, strchr(lh, ':') ? "[%.*s]:0" : "%.*s:0", (int)lhl, lh);
    co.xport_listen = listen;
    co.advertise = advertise;
    co.data_port = (int)dport;
    ect_pull_consumer *cons = NULL;
    if (ect_pull_consumer_open(&co, &cons) != 0) {
        fprintf(stderr, "ect pull: %s\n", ect_last_error());
        ect_pull_scheduler_close(s);
        return CLI_EXIT_FAIL;
    }
    size_t total = all ? l.n : nh;
    size_t failed = 0, moved = 0, verified = 0, retried = 0;
    for (size_t i = 0; i < total; i++) {
        const char *h = all ? l.hash[i] : hashes[i];
        ect_pull_meta m;
        char status[512] = "ok";
        char sum_hex[17] = "";
        uint64_t nbytes = 0;
        double lat_ms = 0;
        unsigned attempts = 0;
        if (ect_pull_scheduler_has(s, h, &m) != 1) {
            snprintf(status, sizeof status, "error: %s is not available at %s", h, from);
        } else {
            ect_pull_view v;
            struct timespec t1, t2;
            clock_gettime(CLOCK_MONOTONIC, &t1);
            int r;
            uint64_t give_up = cli_now_ms() + timeout, backoff = 10;
            for (;;) { /* a refusal for want of room or lanes is waited out */
                attempts++;
                r = ect_pull_consumer_load(cons, h, &m, &v);
                bool never_fits = m.nbytes > ect_pool_capacity(ect_pull_consumer_pool(cons));
                if ((r != ECT_EBUSY && (r != ECT_EFULL || never_fits)) ||
                    cli_now_ms() + backoff > give_up)
                    break;
                usleep((useconds_t)(backoff * 1000));
                backoff = backoff * 2 > 500 ? 500 : backoff * 2;
            }
            clock_gettime(CLOCK_MONOTONIC, &t2);
            lat_ms =
                (double)(t2.tv_sec - t1.tv_sec) * 1e3 + (double)(t2.tv_nsec - t1.tv_nsec) / 1e6;
            if (r != 0) {
                snprintf(status, sizeof status, "error: %s", ect_last_error());
            } else {
                uint64_t sum = cli_checksum(v.data, v.nbytes), want;
                nbytes = v.nbytes;
                bool sum_known = embedded_sum(h, &want);
                snprintf(sum_hex, sizeof sum_hex, "%016" PRIx64, sum);
                if (v.nbytes != m.nbytes)
                    snprintf(status, sizeof status, "error: %" PRIu64 " bytes, announced %" PRIu64,
                             v.nbytes, m.nbytes);
                else if (sum_known && want != sum)
                    snprintf(status, sizeof status, "error: checksum %s, mm_hash says %016" PRIx64,
                             sum_hex, want);
                ect_pull_consumer_release(cons, h);
                if (strcmp(status, "ok") == 0) {
                    moved++;
                    verified += sum_known;
                    retried += attempts > 1;
                }
            }
        }
        if (strcmp(status, "ok") != 0) failed++;
        printf("{\"mm_hash\":");
        json_str(h);
        printf(",\"nbytes\":%" PRIu64 ",\"checksum\":\"%s\",\"status\":", nbytes, sum_hex);
        json_str(status);
        printf(",\"latency_ms\":%.3f,\"attempts\":%u}\n", lat_ms, attempts);
        fflush(stdout);
    }
    fprintf(stderr, "ect pull: %zu moved, %zu verified, %zu retried, %zu failed of %zu items\n",
            moved, verified, retried, failed, total);
    if (failed) rc = CLI_EXIT_FAIL;
    if (all && total == 0) fprintf(stderr, "ect pull: %s holds no items\n", from);
    for (size_t i = 0; i < l.n; i++) free(l.hash[i]);
    free(l.hash);
    free(l.meta);
    ect_pull_consumer_close(cons);
    ect_pull_scheduler_close(s);
    return rc;
}
