/*
 * cmd_push_consumer — `ect push-consumer`: one consumer instance of the push
 * protocol (generation 2) in one process: a consumer (pool + transport +
 * control server) per TP rank and the instance's scheduler.
 *
 * The producer chooses transfer ids, so this command cannot expect them in
 * advance: its scheduler runs in "accept any" mode, where a transfer that
 * every shard reported ready is accepted on arrival. For each one it takes
 * the item on every rank (zero-copy), checks that each rank's bytes are
 * readable and identical (every TP rank receives its own full copy), prints
 * one JSON line, releases the item to the resident cache (a later push of
 * the same mm_hash is answered `cached`) and finishes the transfer, which
 * cancels it on every shard so the reservation tables stay small.
 *
 * Whatever goes wrong is said on stderr as it happens: transfers the
 * scheduler gave up on (abandoned by the producer, not on every rank within
 * the push wait, expired), and, at most once a second per rank, how many
 * reservations expired, were abandoned or were refused since the last line
 * (the shards' own once-a-second log lines give the refusal texts).
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "cli/cli.h"
#include "ectransfer.h"

#define MAX_TP 64

static volatile sig_atomic_t stop_flag;

static void on_signal(int sig) {
    (void)sig;
    stop_flag = 1;
}

static void help(void) {
    printf(
        "usage: ect push-consumer --host H --port P [--tp N] [--dp-index I] [--pool-size SIZE]\n"
        "                         [--transport tcp|shm|ucx] [--count N] [--ttl D]\n"
        "                         [--pool-device cpu|pinned|cuda|cuda:N] [--metrics-port P]\n"
        "                         [--advertise HOST] [--data-port P] [--keep-resident N]\n"
        "                         [--curve-keys DIR] [--event-auth secret|none]\n"
        "\n"
        "Runs one push-protocol consumer instance: a control server per TP rank, bound on\n"
        "H at ports P + dp_index x N + rank, plus the instance's scheduler. Every transfer\n"
        "that all N shards report ready is accepted (the producer picks transfer ids), taken\n"
        "on every rank, verified readable and identical across ranks, printed, released to\n"
        "the resident cache (a later push of the same mm_hash is answered `cached`) and\n"
        "finished. Runs until SIGINT or SIGTERM (or --count items), then closes cleanly.\n"
        "\n"
        "  --host H          address to bind the control sockets and transport on (IPv4,\n"
        "                    IPv6 as ::1 or [::1], a name; 0.0.0.0 or :: for every interface)\n"
        "  --advertise HOST  host producers are told as the data-plane address (NAT, a\n"
        "                    service name); default: --host, or for a wildcard --host the\n"
        "                    address of the interface that routes to each producer\n"
        "  --data-port P     fixed data-plane port (tcp, ucx) of rank 0; rank r listens on\n"
        "                    P + dp_index x N + r, as the control ports; default: any free port\n"
        "  --port P          base control port (ec_port), e.g. 14579\n"
        "  --tp N            tensor-parallel ranks (shards), 1..64; default 1\n"
        "  --dp-index I      data-parallel index; default 0\n"
        "  --pool-size SIZE  buffer pool per rank (\"1GiB\", \"64MiB\"); default 1000000000\n"
        "  --transport T     tcp (default), shm or ucx\n"
        "  --count N         exit 0 after N items (default: run until a signal)\n"
        "  --keep-resident N after each round of items, evict each rank's least recently used\n"
        "                    resident copies beyond N (default: keep all the pool holds, the\n"
        "                    pool evicting them only when it needs the room). A small N keeps\n"
        "                    the memory the pool cycles through small (`ect demo` keeps 64:\n"
        "                    its repeats come 32 items after their first)\n"
        "  --ttl D           reservation TTL (90s, 5m; bare: seconds; default 300s); the pending\n"
        "                    grace is the same\n"
        "  --pool-device D   where each rank's pool lives (upstream ec_buffer_device): cpu\n"
        "                    (default), pinned (host memory registered with CUDA), cuda or\n"
        "                    cuda:N (GPU memory: tcp lands bytes through a pinned bounce ring,\n"
        "                    shm by CUDA IPC; not with ucx). Needs the CUDA driver (`ect info`)\n"
        "  --metrics-port P  serve Prometheus metrics at http://H:P/metrics (0: any free\n"
        "                    port, given as \"metrics_port\" in the ready line)\n"
        "  --curve-keys DIR  authenticate every peer (docs/SECURITY.md): DIR is a key\n"
        "                    directory made by `ect keygen`; only producers and schedulers\n"
        "                    whose public key is in DIR/accept/ get any answer or event.\n"
        "                    Default: off, plain ZMQ as upstream speaks it\n"
        "  --event-auth M    without --curve-keys: secret (default) makes each rank's event\n"
        "                    port ask a per-rank secret our scheduler learns from the\n"
        "                    event_port reply, so a stray PULL gets no events; none serves\n"
        "                    any PULL (an upstream scheduler needs it)\n"
        "\n"
        "Output on stdout, one JSON object a line: first, once every shard listens and the\n"
        "scheduler reached every one (push from then on),\n"
        "  {\"event\":\"ready\",\"host\",\"ports\",\"data_ports\",[\"advertise\"],\"transport\",\n"
        "   \"pool_size\",\"pool_device\"[,\"metrics_port\"]}  (data_ports: each rank's\n"
        "   data-plane port; [] for shm)\n"
        "then one line per item:\n"
        "  {\"transfer_id\",\"mm_hash\",\"nbytes\",\"shape\",\"dtype\",\"checksum\",\"status\"}\n"
        "status is \"ok\" (only items read and verified are printed);\n"
        "checksum is XXH3_64bits (seed 0) of the bytes as 16 hex digits (as `ect push` prints);\n"
        "dtype is the canonical name (\"float32\" for a reserve of \"torch.float32\").\n"
        "On stderr, as they happen: \"ect push-consumer: transfer T failed: ...\" for every\n"
        "transfer that fails (abandoned by the producer, not on every rank within the push\n"
        "wait, never loaded, a rank whose bytes differ); at most once a second per rank, the\n"
        "reservations that expired or were abandoned and the reserves refused since the\n"
        "last such line (a full pool is not a failure: producers wait and retry); the\n"
        "shards' own warnings say why each refusal happened. For people, \"ect\n"
        "push-consumer: ready ...\" tells that every shard listens, and \"... scheduler\n"
        "connected to N shard(s)\" comes with the ready event. At exit, per rank: live\n"
        "reservations and bytes in use (0 and 0 after a clean run), the peaks, and the\n"
        "totals of refused, expired and abandoned reservations.\n");
}

/* Prints o as one compact JSON line on stdout; takes o. flush: at once
 * (else the main loop flushes once per round of items, before it waits). */
static void print_line(json_t *o, bool flush) {
    char *txt = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (txt) {
        printf("%s\n", txt);
        if (flush) fflush(stdout);
        free(txt);
    }
    json_decref(o);
}

/* An item's line. The common one (ids, hash and dtype in plain ASCII) is
 * printed directly, byte for byte what jansson prints for it (jansson was
 * 3 % of `ect demo`'s samples here); anything else goes through jansson. */
static void print_item(const ect_push_view *v, uint64_t ck) {
    if (cli_json_plain(v->transfer_id) && cli_json_plain(v->mm_hash) && cli_json_plain(v->dtype)) {
        printf("{\"transfer_id\":\"%s\",\"mm_hash\":\"%s\",\"nbytes\":%" PRIu64 ",\"shape\":[",
               v->transfer_id, v->mm_hash, v->nbytes);
        for (uint32_t i = 0; i < v->ndim; i++) printf("%s%" PRIu64, i ? "," : "", v->shape[i]);
        printf("],\"dtype\":\"%s\",\"checksum\":\"%016" PRIx64 "\",\"status\":\"ok\"}\n", v->dtype,
               ck);
        return;
    }
    json_t *o = json_object();
    json_t *shape = json_array();
    for (uint32_t i = 0; i < v->ndim; i++)
        json_array_append_new(shape, json_integer((json_int_t)v->shape[i]));
    char cks[17];
    snprintf(cks, sizeof cks, "%016" PRIx64, ck);
    json_object_set_new(o, "transfer_id", json_string(v->transfer_id));
    json_object_set_new(o, "mm_hash", json_string(v->mm_hash));
    json_object_set_new(o, "nbytes", json_integer((json_int_t)v->nbytes));
    json_object_set_new(o, "shape", shape);
    json_object_set_new(o, "dtype", json_string(v->dtype));
    json_object_set_new(o, "checksum", json_string(cks));
    json_object_set_new(o, "status", json_string("ok"));
    print_line(o, false);
}

/* The machine-readable readiness line (stdout): every shard listens and the
 * scheduler reached every one, so a producer may push now. */
static void print_ready(const char *host, uint64_t first_port, uint64_t tp, const char *transport,
                        uint64_t pool, const char *pool_device, const char *advertise,
                        ect_push_consumer **cons, int metrics_port) {
    json_t *o = json_object(), *ports = json_array(), *dports = json_array();
    for (uint64_t r = 0; r < tp; r++) {
        json_array_append_new(ports, json_integer((json_int_t)(first_port + r)));
        /* the data-plane port each rank listens on (tcp, ucx; shm has none) */
        const char *sess = ect_push_consumer_session(cons[r]);
        const char *hp = strncmp(sess, "ucx:", 4) == 0 ? sess + 4 : sess;
        char h[256];
        int dport = 0;
        if (strncmp(sess, "shm:", 4) != 0 &&
            ect_hostport_parse("session", hp, 0, 65535, h, sizeof h, &dport) == 0)
            json_array_append_new(dports, json_integer(dport));
    }
    json_object_set_new(o, "event", json_string("ready"));
    json_object_set_new(o, "host", json_string(host));
    json_object_set_new(o, "ports", ports);
    json_object_set_new(o, "data_ports", dports);
    if (advertise) json_object_set_new(o, "advertise", json_string(advertise));
    json_object_set_new(o, "transport", json_string(transport));
    json_object_set_new(o, "pool_size", json_integer((json_int_t)pool));
    json_object_set_new(o, "pool_device", json_string(pool_device));
    if (metrics_port >= 0) json_object_set_new(o, "metrics_port", json_integer(metrics_port));
    print_line(o, true);
}

/* Takes the item on every rank, checks and prints it. Returns true when done. */
static bool consume(ect_push_consumer **cons, int tp, ect_push_scheduler *s,
                    const ect_push_sched_item *it) {
    ect_push_view views[MAX_TP];
    int taken = 0;
    uint64_t ck0 = 0;
    bool ok = true;
    for (int r = 0; r < tp; r++) {
        if (ect_push_consumer_take(cons[r], it->transfer_id, &views[r]) != 0) {
            fprintf(stderr, "ect push-consumer: take %s on rank %d: %s\n", it->transfer_id, r,
                    ect_last_error());
            ok = false;
            break;
        }
        taken++;
        uint64_t ck = 0;
        if (views[r].mem_kind == ECT_MEM_CUDA) { /* checksum a host copy of the device bytes */
            void *h = views[r].nbytes ? malloc(views[r].nbytes) : NULL;
            if (views[r].nbytes && (!h || ect_mem_copy(h, views[r].data, views[r].nbytes))) {
                fprintf(stderr, "ect push-consumer: %s: copying rank %d's device bytes: %s\n",
                        it->transfer_id, r, h ? ect_last_error() : "out of memory");
                free(h);
                ok = false;
                break;
            }
            ck = cli_checksum(h, views[r].nbytes);
            free(h);
        } else {
            ck = cli_checksum(views[r].data, views[r].nbytes);
        }
        if (r == 0) ck0 = ck;
        if (ck != ck0 || views[r].nbytes != views[0].nbytes) {
            fprintf(stderr,
                    "ect push-consumer: %s: rank %d checksum %016" PRIx64 " differs from rank 0 "
                    "%016" PRIx64 "\n",
                    it->transfer_id, r, ck, ck0);
            ok = false;
            break;
        }
    }
    if (ok) print_item(&views[0], ck0);
    for (int r = 0; r < taken; r++)
        if (ect_push_consumer_release(cons[r], &views[r]) != 0)
            fprintf(stderr, "ect push-consumer: release %s: %s\n", it->transfer_id,
                    ect_last_error());
    if (ok) {
        ect_push_scheduler_loaded(s, it->transfer_id);
        /* every rank's release ended its reservation: no remote cancels */
        ect_push_scheduler_finished(s, it->transfer_id);
    } else {
        ect_push_scheduler_fail(s, it->transfer_id, "consumer could not read the item");
    }
    return ok;
}

/* --keep-resident: evicts each rank's least recently used resident copies
 * beyond keep (leased ones and those a reservation uses stay). */
static void trim_resident(ect_push_consumer **cons, int tp, uint64_t keep) {
    for (int r = 0; r < tp; r++) {
        ect_push_consumer_stat st;
        ect_push_consumer_stats(cons[r], &st);
        if (st.resident > keep) ect_push_consumer_evict(cons[r], (size_t)(st.resident - keep));
    }
}

/* The main loop's longest sleep in ect_push_scheduler_wait: an event wakes
 * it at once; this bounds how late the once-a-second report, the readiness
 * line and a signal are seen. */
#define IDLE_WAIT_MS 50

/* Says on stderr what changed on each rank since the last call: expired and
 * abandoned reservations, refused reserves. */
static void report_changes(ect_push_consumer **cons, int tp, ect_push_consumer_stat *last) {
    for (int r = 0; r < tp; r++) {
        ect_push_consumer_stat st;
        ect_push_consumer_stats(cons[r], &st);
        ect_push_consumer_stat *l = &last[r];
        if (st.expired > l->expired)
            fprintf(stderr,
                    "ect push-consumer: rank %d: %" PRIu64
                    " reservation(s) expired (not completed, or not taken, within the TTL)\n",
                    r, st.expired - l->expired);
        if (st.abandoned > l->abandoned)
            fprintf(stderr,
                    "ect push-consumer: rank %d: %" PRIu64
                    " transfer(s) abandoned by the producer\n",
                    r, st.abandoned - l->abandoned);
        if (st.refused_full > l->refused_full || st.refused_other > l->refused_other)
            fprintf(stderr,
                    "ect push-consumer: rank %d: refused %" PRIu64
                    " reserve(s) as full (the producer "
                    "retries), %" PRIu64 " otherwise\n",
                    r, st.refused_full - l->refused_full, st.refused_other - l->refused_other);
        *l = st;
    }
}

int cmd_push_consumer(int argc, char **argv) {
    static const struct option opts[] = {{"host", required_argument, 0, 'H'},
                                         {"port", required_argument, 0, 'p'},
                                         {"tp", required_argument, 0, 't'},
                                         {"dp-index", required_argument, 0, 'd'},
                                         {"pool-size", required_argument, 0, 's'},
                                         {"transport", required_argument, 0, 'x'},
                                         {"count", required_argument, 0, 'n'},
                                         {"ttl", required_argument, 0, 'T'},
                                         {"pool-device", required_argument, 0, 'D'},
                                         {"metrics-port", required_argument, 0, 'M'},
                                         {"advertise", required_argument, 0, 'A'},
                                         {"data-port", required_argument, 0, 'P'},
                                         {"curve-keys", required_argument, 0, 'K'},
                                         {"event-auth", required_argument, 0, 'E'},
                                         {"keep-resident", required_argument, 0, 'R'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *host = NULL, *transport = "tcp", *pool_device = "cpu", *advertise = NULL;
    const char *curve_keys = NULL;
    int event_auth_off = 0;
    uint64_t port = 0, tp = 1, dp = 0, pool = 1000000000ull, count = 0, ttl = 300000, dport = 0;
    uint64_t keep_resident = UINT64_MAX; /* --keep-resident; UINT64_MAX: no trimming */
    int c, metrics_port = -1;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'H': host = optarg; break;
        case 'p':
            if (!cli_parse_u64("--port", optarg, 1, 65535, &port)) return CLI_EXIT_USAGE;
            break;
        case 't':
            if (!cli_parse_u64("--tp", optarg, 1, MAX_TP, &tp)) return CLI_EXIT_USAGE;
            break;
        case 'd':
            if (!cli_parse_u64("--dp-index", optarg, 0, 65535, &dp)) return CLI_EXIT_USAGE;
            break;
        case 's':
            if (!cli_parse_size("--pool-size", optarg, &pool)) return CLI_EXIT_USAGE;
            break;
        case 'x':
            if (strcmp(optarg, "tcp") && strcmp(optarg, "shm") && strcmp(optarg, "ucx"))
                return cli_usage_error("push-consumer", "--transport %s: expected tcp, shm or ucx",
                                       optarg);
            transport = optarg;
            break;
        case 'n':
            if (!cli_parse_u64("--count", optarg, 1, UINT64_MAX, &count)) return CLI_EXIT_USAGE;
            break;
        case 'T':
            if (!cli_parse_duration_u64("--ttl", optarg, 1000, 1, 86400000, &ttl))
                return CLI_EXIT_USAGE;
            break;
        case 'D':
            if (ect_mem_parse_device(optarg, NULL, NULL) != 0)
                return cli_usage_error("push-consumer",
                                       "--pool-device %s: expected cpu, pinned, "
                                       "cuda or cuda:N",
                                       optarg);
            pool_device = optarg;
            break;
        case 'M':
            if (!cli_parse_metrics_port("push-consumer", optarg, &metrics_port))
                return CLI_EXIT_USAGE;
            break;
        case 'A':
            if (!*optarg || strlen(optarg) > 255 || ect_host_is_wildcard(optarg))
                return cli_usage_error("push-consumer",
                                       "--advertise '%s': a host name or address producers can "
                                       "reach, not a wildcard",
                                       optarg);
            advertise = optarg;
            break;
        case 'P':
            if (!cli_parse_u64("--data-port", optarg, 1, 65535, &dport)) return CLI_EXIT_USAGE;
            break;
        case 'K': curve_keys = optarg; break;
        case 'R':
            if (!cli_parse_u64("--keep-resident", optarg, 0, UINT32_MAX, &keep_resident))
                return CLI_EXIT_USAGE;
            break;
        case 'E':
            if (strcmp(optarg, "secret") && strcmp(optarg, "none"))
                return cli_usage_error("push-consumer", "--event-auth %s: expected secret or none",
                                       optarg);
            event_auth_off = strcmp(optarg, "none") == 0;
            break;
        case 'h': help(); return CLI_EXIT_OK;
        default: return cli_bad_flag("push-consumer", opts);
        }
    }
    if (optind < argc)
        return cli_usage_error("push-consumer", "unexpected argument '%s'", argv[optind]);
    if (!host) return cli_usage_error("push-consumer", "--host is required");
    if (!port) return cli_usage_error("push-consumer", "--port is required");
    if (pool == 0) return cli_usage_error("push-consumer", "--pool-size must be > 0");
    uint64_t last = port + (dp + 1) * tp - 1;
    if (last > 65535)
        return cli_usage_error("push-consumer",
                               "--port %" PRIu64 " + --dp-index %" PRIu64 " x --tp %" PRIu64
                               ": control ports beyond 65535",
                               port, dp, tp);
    if (dport && dport + (dp + 1) * tp - 1 > 65535)
        return cli_usage_error("push-consumer",
                               "--data-port %" PRIu64 " + --dp-index %" PRIu64 " x --tp %" PRIu64
                               ": data ports beyond 65535",
                               dport, dp, tp);

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    ect_push_consumer *cons[MAX_TP] = {0};
    ect_push_scheduler *s = NULL;
    ect_metrics_server *ms = NULL;
    int rc = CLI_EXIT_OK;
    uint64_t done = 0;
    for (uint64_t r = 0; r < tp; r++) {
        ect_push_consumer_opts o;
        ect_push_consumer_opts_init(&o);
        o.ec_ip = host;
        o.ec_port = (int)port;
        o.tp_size = (int)tp;
        o.tp_rank = (int)r;
        o.dp_index = (int)dp;
        o.pool_size = pool;
        o.transport = transport;
        o.ttl_ms = ttl;
        o.pending_grace_ms = ttl;
        o.pool_device = pool_device;
        o.advertise = advertise;
        o.data_port = (int)dport;
        o.curve_keys = curve_keys;
        o.event_auth_off = event_auth_off;
        if (ect_push_consumer_open(&o, &cons[r]) != 0) {
            fprintf(stderr, "ect push-consumer: rank %" PRIu64 ": %s\n", r, ect_last_error());
            rc = CLI_EXIT_FAIL;
            goto out;
        }
    }
    if (!cli_metrics_start("push-consumer", host, metrics_port, &ms)) {
        rc = CLI_EXIT_FAIL;
        goto out;
    }
    ect_push_scheduler_opts so;
    ect_push_scheduler_opts_init(&so);
    /* The in-process scheduler reaches the shards on loopback when they bind
     * every interface. */
    so.consumer_host = !ect_host_is_wildcard(host) ? host : strchr(host, ':') ? "::1" : "127.0.0.1";
    so.consumer_port = (int)(port + dp * tp);
    so.tp_size = (int)tp;
    so.accept_any = 1;
    /* drain the shards' events on every poll: this loop sleeps in
     * ect_push_scheduler_wait until an event comes, and an item taken soon
     * after it landed is still in cache for its checksum (the default 5 ms
     * let ~50 items of 128 KiB pile up) */
    so.min_drain_interval_ms = 0;
    so.ttl_ms = ttl;
    so.curve_keys = curve_keys; /* the shards accept their own key when DIR/accept/ has it */
    if (ect_push_scheduler_open(&so, &s) != 0) {
        fprintf(stderr, "ect push-consumer: scheduler: %s\n", ect_last_error());
        rc = CLI_EXIT_FAIL;
        goto out;
    }
    fprintf(stderr,
            "ect push-consumer: ready on %s ports %" PRIu64 "..%" PRIu64 " (tp %" PRIu64
            ", %s, pool %" PRIu64 " bytes per rank on %s)\n",
            host, port + dp * tp, last, tp, transport, pool, pool_device);
    bool announced = false;
    ect_push_consumer_stat prev[MAX_TP];
    memset(prev, 0, sizeof prev);
    uint64_t next_report = cli_now_ms() + 1000;
    while (!stop_flag && (!count || done < count)) {
        ect_push_scheduler_wait(s, IDLE_WAIT_MS); /* until an item lands */
        ect_push_sched_item it;
        bool any = false;
        while (ect_push_scheduler_next(s, &it) == 0) {
            any = true;
            if (consume(cons, (int)tp, s, &it)) done++;
        }
        /* trimmed before the round's lines go out: whoever reads them sees
         * the cache as it is now */
        if (any && keep_resident != UINT64_MAX) trim_resident(cons, (int)tp, keep_resident);
        if (any) fflush(stdout); /* this round's item lines, in one write */
        while (ect_push_scheduler_next_failed(s, &it) == 0)
            fprintf(stderr, "ect push-consumer: transfer %s failed: %s: %s\n", it.transfer_id,
                    ect_push_state_name(it.state), it.error);
        if (cli_now_ms() >= next_report) {
            next_report = cli_now_ms() + 1000;
            report_changes(cons, (int)tp, prev);
        }
        if (!announced) {
            ect_push_scheduler_stat st;
            ect_push_scheduler_stats(s, &st);
            if (st.shards == tp) {
                fprintf(stderr, "ect push-consumer: scheduler connected to %u shard(s)\n",
                        st.shards);
                print_ready(host, port + dp * tp, tp, transport, pool, pool_device, advertise, cons,
                            ms ? ect_metrics_server_port(ms) : -1);
                announced = true;
            }
        }
    }
    /* Let the remote cancels of failed transfers go out before closing: until
     * none was answered for 100 ms, for at most 2 s. */
    uint64_t answered = UINT64_MAX, quiet_since = cli_now_ms(), t_end = cli_now_ms() + 2000;
    while (cli_now_ms() < t_end && cli_now_ms() - quiet_since < 100) {
        ect_push_scheduler_poll(s);
        ect_push_scheduler_stat st;
        ect_push_scheduler_stats(s, &st);
        if (st.cancels_sent + st.cancels_failed != answered) {
            answered = st.cancels_sent + st.cancels_failed;
            quiet_since = cli_now_ms();
        }
        struct timespec ts = {0, 2 * 1000000L};
        nanosleep(&ts, NULL);
    }
    ect_push_sched_item fit;
    while (ect_push_scheduler_next_failed(s, &fit) == 0)
        fprintf(stderr, "ect push-consumer: transfer %s failed: %s: %s\n", fit.transfer_id,
                ect_push_state_name(fit.state), fit.error);
    report_changes(cons, (int)tp, prev);
    /* What is left per rank once the resident copies are dropped: after a
     * clean run (and after a killed producer's reservations expired) both
     * numbers are 0, which the script tests check. */
    for (uint64_t r = 0; r < tp; r++) {
        ect_push_consumer_evict(cons[r], SIZE_MAX);
        ect_push_consumer_drop_spares(cons[r]); /* stopping: nobody will put into them */
        ect_push_consumer_stat st;
        ect_push_consumer_stats(cons[r], &st);
        fprintf(stderr,
                "ect push-consumer: rank %" PRIu64 ": %" PRIu64 " live reservations, %" PRIu64
                " bytes in use, %" PRIu64 " events dropped, %" PRIu64 " bad requests\n",
                r, st.live, st.pool_used, st.events_dropped, st.bad_requests);
        fprintf(stderr,
                "ect push-consumer: rank %" PRIu64 ": peaks %" PRIu64 " reservations, %" PRIu64
                " bytes held; totals %" PRIu64 " delivered, %" PRIu64 " refused as full, %" PRIu64
                " refused otherwise, %" PRIu64 " expired, %" PRIu64 " abandoned\n",
                r, st.peak_live, st.peak_held, st.finished, st.refused_full, st.refused_other,
                st.expired, st.abandoned);
    }
    fprintf(stderr, "ect push-consumer: %" PRIu64 " items\n", done);
out:
    ect_metrics_server_close(ms);
    ect_push_scheduler_close(s);
    for (uint64_t r = 0; r < tp; r++) ect_push_consumer_close(cons[r]);
    return rc;
}
