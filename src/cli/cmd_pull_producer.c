/*
 * cmd_pull_producer — `ect pull-producer`: a generation-1 producer that saves
 * deterministic synthetic items (or files), prints one JSON line per
 * published mm_hash with its checksum, and serves pulls until SIGINT or
 * SIGTERM.
 *
 * Every mm_hash ends in "-" + the 16-hex-digit cli_checksum of its bytes
 * ("syn-3-1a2b...", "file-1a2b..."), so `ect pull` can verify what it loaded
 * without knowing how it was made.
 */
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "ectransfer.h"

static volatile sig_atomic_t stop_flag;
static void on_signal(int sig) {
    (void)sig;
    stop_flag = 1;
}

static void help(void) {
    printf(
        "usage: ect pull-producer [--host H] [--port P] [--pool-size SIZE] [--metrics-port P]\n"
        "                         [--transport tcp|shm|ucx] [--count N --size SIZE | --file F "
        "...]\n"
        "                         [--connect-allow ADDRS] [--max-lanes-per-peer N]\n"
        "                         [--curve-keys DIR]\n"
        "\n"
        "Generation-1 producer: ROUTER on PORT, PUB on PORT+1. Saves N synthetic items of SIZE\n"
        "bytes (deterministic bytes; dtype uint8, shape [SIZE]) or the given files, prints one\n"
        "JSON line per published item {mm_hash, nbytes, checksum, dtype, shape, status}\n"
        "(status \"ok\"), then the readiness line {\"event\":\"ready\",\"serving\":true,\n"
        "\"host\",\"port\",\"pub_port\",\"transport\",\"session_id\"} and serves pulls until "
        "SIGINT/SIGTERM (exit 0).\n"
        "\n"
        "  --host H          address to bind (default 127.0.0.1)\n"
        "  --port P          ec_port (default 14579; 0 = an ephemeral pair, printed)\n"
        "  --pool-size SIZE  producer pool (default 1GiB)\n"
        "  --transport T     data plane: tcp (default), shm, ucx\n"
        "  --count N         synthetic items (default 4 unless --file is given)\n"
        "  --size SIZE       bytes per synthetic item (default 4.5MiB)\n"
        "  --file F          save file F (repeatable; items are saved in order)\n"
        "  --metrics-port P  serve Prometheus metrics at http://H:P/metrics (0: any free\n"
        "                    port, given as \"metrics_port\" in the readiness line)\n"
        "  --connect-allow A where pulls may make this producer write: '*' (anywhere) or\n"
        "                    comma-separated IP addresses (default: only the address each\n"
        "                    pull came from)\n"
        "  --max-lanes-per-peer N  consumer sessions one peer address may have served at\n"
        "                    once (write lanes; default 32): more get EBUSY, so a peer\n"
        "                    naming sessions that never answer cannot take every lane\n"
        "  --curve-keys DIR  CurveZMQ on every ZMQ socket (docs/SECURITY.md): DIR from `ect\n"
        "                    keygen`, with the peers' public keys in DIR/accept/; default off\n");
}

/* Deterministic synthetic bytes of item i (cli_fill_synthetic). */
static void fill_synthetic(uint8_t *d, uint64_t n, uint64_t i) {
    cli_fill_synthetic(d, n, 0x9e3779b97f4a7c15ull * (i + 1));
}

static void free_data(void *user, const void *data) {
    (void)user;
    free((void *)data);
}

static int read_file(const char *path, uint8_t **data, uint64_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    size_t cap = 1 << 20, len = 0;
    uint8_t *b = malloc(cap);
    for (;;) {
        if (!b) break;
        if (len == cap) {
            uint8_t *nb = realloc(b, cap * 2);
            if (!nb) {
                free(b);
                b = NULL;
                break;
            }
            b = nb;
            cap *= 2;
        }
        size_t r = fread(b + len, 1, cap - len, f);
        len += r;
        if (r == 0) break;
    }
    int err = ferror(f);
    fclose(f);
    if (!b || err || len == 0) {
        free(b);
        return -1;
    }
    *data = b;
    *n = len;
    return 0;
}

int cmd_pull_producer(int argc, char **argv) {
    static const struct option opts[] = {{"host", required_argument, 0, 'H'},
                                         {"port", required_argument, 0, 'p'},
                                         {"pool-size", required_argument, 0, 'P'},
                                         {"transport", required_argument, 0, 't'},
                                         {"count", required_argument, 0, 'n'},
                                         {"size", required_argument, 0, 's'},
                                         {"file", required_argument, 0, 'f'},
                                         {"metrics-port", required_argument, 0, 'M'},
                                         {"connect-allow", required_argument, 0, 'A'},
                                         {"curve-keys", required_argument, 0, 'K'},
                                         {"max-lanes-per-peer", required_argument, 0, 'L'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *curve_keys = NULL;
    const char *host = "127.0.0.1", *transport = "tcp", *allow = NULL;
    uint64_t port = 14579, pool = 1ull << 30, count = 0, size = 4718592, per_peer = 0;
    bool have_count = false, have_size = false;
    const char *files[256];
    int nfiles = 0, metrics_port = -1;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'H': host = optarg; break;
        case 'p':
            if (!cli_parse_u64("--port", optarg, 0, 65534, &port)) return CLI_EXIT_USAGE;
            break;
        case 'P':
            if (!cli_parse_size("--pool-size", optarg, &pool)) return CLI_EXIT_USAGE;
            break;
        case 't': transport = optarg; break;
        case 'A': allow = optarg; break;
        case 'L':
            if (!cli_parse_u64("--max-lanes-per-peer", optarg, 1, UINT32_MAX, &per_peer))
                return CLI_EXIT_USAGE;
            break;
        case 'n':
            if (!cli_parse_u64("--count", optarg, 1, 1000000, &count)) return CLI_EXIT_USAGE;
            have_count = true;
            break;
        case 's':
            if (!cli_parse_size("--size", optarg, &size) || size == 0)
                return cli_usage_error("pull-producer", "--size must be at least 1 byte");
            have_size = true;
            break;
        case 'f':
            if (nfiles == 256) return cli_usage_error("pull-producer", "at most 256 --file");
            files[nfiles++] = optarg;
            break;
        case 'M':
            if (!cli_parse_metrics_port("pull-producer", optarg, &metrics_port))
                return CLI_EXIT_USAGE;
            break;
        case 'K': curve_keys = optarg; break;
        case 'h': help(); return CLI_EXIT_OK;
        default: return cli_bad_flag("pull-producer", opts);
        }
    }
    if (optind < argc)
        return cli_usage_error("pull-producer", "unexpected argument '%s'", argv[optind]);
    if (nfiles && (have_count || have_size))
        return cli_usage_error("pull-producer", "--file excludes --count and --size");
    if (!nfiles && !have_count) count = 4;

    ect_pull_producer_opts o;
    ect_pull_producer_opts_init(&o);
    o.curve_keys = curve_keys;
    o.host = host;
    o.port = (int)port;
    o.pool_size = pool;
    o.transport = transport;
    o.connect_allow = allow;
    if (per_peer) o.max_lanes_per_peer = (uint32_t)per_peer;
    ect_pull_producer *p = NULL;
    if (ect_pull_producer_open(&o, &p) != 0) {
        fprintf(stderr, "ect pull-producer: %s\n", ect_last_error());
        return CLI_EXIT_FAIL;
    }
    ect_metrics_server *ms = NULL;
    if (!cli_metrics_start("pull-producer", host, metrics_port, &ms)) {
        ect_pull_producer_close(p);
        return CLI_EXIT_FAIL;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    uint64_t n_items = nfiles ? (uint64_t)nfiles : count;
    int rc = CLI_EXIT_OK;
    for (uint64_t i = 0; i < n_items && !stop_flag; i++) {
        uint8_t *d = NULL;
        uint64_t n = size;
        char hash[64];
        if (nfiles) {
            if (read_file(files[i], &d, &n) != 0) {
                fprintf(stderr,
                        "ect pull-producer: cannot read '%s' (missing, empty or unreadable)\n",
                        files[i]);
                rc = CLI_EXIT_FAIL;
                break;
            }
        } else {
            d = malloc(n);
            if (!d) {
                fprintf(stderr, "ect pull-producer: out of memory for item %" PRIu64 "\n", i);
                rc = CLI_EXIT_FAIL;
                break;
            }
            fill_synthetic(d, n, i);
        }
        uint64_t sum = cli_checksum(d, n);
        if (nfiles)
            snprintf(hash, sizeof hash, "file-%016" PRIx64, sum);
        else
            snprintf(hash, sizeof hash, "syn-%" PRIu64 "-%016" PRIx64, i, sum);
        uint64_t shape[1] = {n};
        if (ect_pull_producer_save(p, hash, d, n, shape, 1, "uint8", free_data, NULL) != 0) {
            fprintf(stderr, "ect pull-producer: save %s: %s\n", hash, ect_last_error());
            free(d);
            rc = CLI_EXIT_FAIL;
            break;
        }
        /* Printed once it is published (after the flush below). */
        if (ect_pull_producer_flush(p, 60000) != 0) {
            fprintf(stderr, "ect pull-producer: %s\n", ect_last_error());
            rc = CLI_EXIT_FAIL;
            break;
        }
        if (ect_pool_lookup(ect_pull_producer_pool(p), hash, NULL) != 0) {
            fprintf(stderr, "ect pull-producer: %s was not stored (pool too small?)\n", hash);
            rc = CLI_EXIT_FAIL;
            break;
        }
        printf("{\"mm_hash\":\"%s\",\"nbytes\":%" PRIu64 ",\"checksum\":\"%016" PRIx64
               "\",\"dtype\":\"uint8\",\"shape\":[%" PRIu64 "],\"status\":\"ok\"}\n",
               hash, n, sum, n);
        fflush(stdout);
    }
    if (rc == CLI_EXIT_OK) {
        printf("{\"event\":\"ready\",\"serving\":true,\"host\":\"%s\",\"port\":%d,"
               "\"pub_port\":%d,\"transport\":\"%s\",\"session_id\":\"%s\"",
               host, ect_pull_producer_port(p), ect_pull_producer_port(p) + 1, transport,
               ect_pull_producer_session_id(p));
        if (ms) printf(",\"metrics_port\":%d", ect_metrics_server_port(ms));
        printf("}\n");
        fflush(stdout);
        while (!stop_flag) usleep(50000);
    }
    ect_pull_producer_stat st;
    ect_pull_producer_stats(p, &st);
    fprintf(stderr,
            "ect pull-producer: saved %" PRIu64 ", pulls ok %" PRIu64 ", failed %" PRIu64
            ", malformed %" PRIu64 ", evicted %" PRIu64 "\n",
            st.saved, st.pulls_ok, st.pulls_failed, st.malformed, st.evicted);
    ect_metrics_server_close(ms);
    ect_pull_producer_close(p);
    return rc;
}
