/*
 * bench_xport — `ect bench xport`: batch writes of 64 KiB .. 64 MiB per
 * transport, target and initiator in this process over loopback, each batch
 * one write, timed from the call to the acknowledgement. Beside each, the
 * limit measured in the same run on the same buffers:
 *   tcp  a raw blocking TCP socket pair streaming the same bytes, the
 *        receiver answering one byte per message (the same "sync");
 *   shm  one memcpy of the same bytes on one thread;
 *   ucx  `ucx_perftest -t ucp_put_bw` over loopback as a subprocess (skipped
 *        when ucx_perftest is not installed); its latency is its p50
 *        overhead, it reports no p99.
 * The writes' rounds and the limit's alternate (cli_timed_pair: ~100 ms
 * each, at least 3 of each), so a change of load on a busy machine hits
 * both alike; likewise the 32 x 64 KiB batch and its one 2 MiB write, and a
 * new connection's write and a cached one's. ucx_perftest, a process of its
 * own, runs after the writes.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/bench_remote.h"
#include "cli/cli.h"
#include "ectransfer.h"

typedef cli_timing stats;

/* ---- the transport under test */

/* ---- small writes in one batch */

#define SMALL_N 32
#define SMALL_LEN (64u << 10)

typedef struct batch_ctx {
    ect_xport *x;
    const char *session;
    ect_write w[SMALL_N];
} batch_ctx;

static int batch_iter(void *p) {
    batch_ctx *c = p;
    return ect_xport_write_batch(c->x, c->session, c->w, SMALL_N, NULL);
}

/* ---- limit: memcpy */

typedef struct cp_ctx {
    void *dst;
    const void *src;
    size_t n;
} cp_ctx;

static int cp_iter(void *p) {
    cp_ctx *c = p;
    memcpy(c->dst, c->src, c->n);
    __asm__ volatile("" ::: "memory");
    return 0;
}

/* ---- limit: raw blocking TCP */

typedef struct raw_ctx {
    int cfd, sfd;
    uint8_t *dst;
    const uint8_t *src;
    size_t n;
    volatile int stop;
} raw_ctx;

static void *raw_server(void *p) {
    raw_ctx *c = p;
    pthread_setname_np(pthread_self(), "ect-bench-raw");
    for (;;) {
        size_t got = 0;
        while (got < c->n) {
            ssize_t k = recv(c->sfd, c->dst + got, c->n - got, 0);
            if (k <= 0) return NULL;
            got += (size_t)k;
        }
        uint8_t a = 1;
        if (send(c->sfd, &a, 1, MSG_NOSIGNAL) != 1) return NULL;
    }
}

static int raw_iter(void *p) {
    raw_ctx *c = p;
    size_t sent = 0;
    while (sent < c->n) {
        ssize_t k = send(c->cfd, c->src + sent, c->n - sent, MSG_NOSIGNAL);
        if (k <= 0) return -1;
        sent += (size_t)k;
    }
    uint8_t a;
    return recv(c->cfd, &a, 1, 0) == 1 ? 0 : -1;
}

static int raw_pair(int *cfd, int *sfd) {
    int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    if (l < 0 || bind(l, (struct sockaddr *)&sa, sl) != 0 || listen(l, 1) != 0 ||
        getsockname(l, (struct sockaddr *)&sa, &sl) != 0) {
        if (l >= 0) close(l);
        return -1;
    }
    *cfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (*cfd < 0 || connect(*cfd, (struct sockaddr *)&sa, sl) != 0) {
        close(l);
        return -1;
    }
    *sfd = accept(l, NULL, NULL);
    close(l);
    if (*sfd < 0) return -1;
    setsockopt(*cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(*sfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return 0;
}

/* The raw pair and its receiving thread, ready for raw_iter on c; 0 or -1. */
static int raw_open(raw_ctx *c, pthread_t *th) {
    if (raw_pair(&c->cfd, &c->sfd) != 0) return -1;
    if (pthread_create(th, NULL, raw_server, c) == 0) return 0;
    close(c->cfd);
    close(c->sfd);
    return -1;
}

static void raw_close(raw_ctx *c, pthread_t th) {
    shutdown(c->cfd, SHUT_RDWR);
    shutdown(c->sfd, SHUT_RDWR);
    pthread_join(th, NULL);
    close(c->cfd);
    close(c->sfd);
}

/* ---- limit: ucx_perftest -t ucp_put_bw on loopback */

static int free_port(void) {
    int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    int port = -1;
    if (l >= 0 && bind(l, (struct sockaddr *)&sa, sl) == 0 &&
        getsockname(l, (struct sockaddr *)&sa, &sl) == 0)
        port = ntohs(sa.sin_port);
    if (l >= 0) close(l);
    return port;
}

static int perftest_limit(size_t n, int iters, stats *s) {
    if (system("command -v ucx_perftest >/dev/null 2>&1") != 0) return -1;
    int port = free_port();
    if (port < 0) return -1;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    pid_t srv = fork();
    if (srv < 0) return -1;
    if (srv == 0) {
        int dn = open("/dev/null", O_WRONLY);
        if (dn >= 0) {
            dup2(dn, 1);
            dup2(dn, 2);
        }
        execlp("ucx_perftest", "ucx_perftest", "-p", ps, (char *)NULL);
        _exit(127);
    }
    usleep(300000);
    char cmd[256];
    snprintf(cmd, sizeof cmd,
             "timeout 60 ucx_perftest 127.0.0.1 -p %d -t ucp_put_bw -s %zu -n %d 2>/dev/null", port,
             n, iters);
    FILE *f = popen(cmd, "r");
    char line[512];
    int rc = -1;
    while (f && fgets(line, sizeof line, f)) {
        double it, p50, avg, overall, bwa, bwo;
        if (sscanf(line, " Final: %lf %lf %lf %lf %lf %lf", &it, &p50, &avg, &overall, &bwa,
                   &bwo) == 6) {
            s->gbps = bwo * 1048576.0 / 1e9; /* ucx_perftest's MB is 2^20 bytes */
            s->p50_us = p50;
            s->p99_us = NAN;
            s->ok = true;
            rc = 0;
        }
    }
    if (f) pclose(f);
    kill(srv, SIGTERM);
    waitpid(srv, NULL, 0);
    return rc;
}

/* ---- driver */

static void help(void) {
    printf("usage: ect bench xport [--json] [--transport tcp,shm,ucx] [--seconds S]\n"
           "                        [--curve-keys DIR]\n\n"
           "Batch writes of 64 KiB, 1 MiB, 4.5 MiB, 16 MiB and 64 MiB per transport (target\n"
           "and initiator in this process, loopback), one write per batch, beside the limit\n"
           "measured in the same run: raw blocking TCP for tcp, single-thread memcpy for shm,\n"
           "ucx_perftest -t ucp_put_bw for ucx (UCX_TLS applies to both). GB/s is 10^9 B/s;\n"
           "latency is per batch, call to acknowledgement. The last row per transport is one\n"
           "batch of 32 x 64 KiB writes beside one 2 MiB write (limit 1x2MiB), then (tcp, shm)\n"
           "\"new conn\": a fresh initiator per write (connect, hello, and the handshake with\n"
           "keys) and one 64 KiB write, beside the same write on a cached connection. A row's\n"
           "rounds and its limit's alternate (~100 ms each, at least 3 of each), so a change\n"
           "of load hits both alike (ucx_perftest, a process of its own, runs after).\n"
           "  --transport LIST  comma-separated subset (default: every one compiled in)\n"
           "  --seconds S       time per measurement (a row's and its limit's each), 0.05..60,\n"
           "                    or 300ms (default 0.5)\n"
           "  --json            one JSON list of rows: transport, size, gbps, limit, limit_gbps,\n"
           "                    ratio, p50_us, p99_us, limit_p50_us, limit_p99_us, rounds and\n"
           "                    limit_rounds (loopback rows measured in alternated rounds; \"new\n"
           "                    conn\" rows: new_conn true, and keys true with --curve-keys)\n"
           "  --curve-keys DIR  tcp, shm: both sides use the key directory DIR (it must accept\n"
           "                    its own key: cp DIR/self.public DIR/accept/self.public), so\n"
           "                    every connection runs the data-plane handshake (ucx skipped)\n"
           "\n"
           "Two hosts (tcp), as ucx_perftest: on one, `ect bench xport --server`; on the other,\n"
           "`ect bench xport --client HOST:PORT` prints the same table (JSON rows add server,\n"
           "session), the limit being raw TCP between the same two hosts in the same run,\n"
           "its rounds alternated with the writes'.\n"
           "  --server          serve writes and raw-TCP sinks until SIGINT/SIGTERM; prints\n"
           "                    "
           "{\"event\":\"ready\",\"bench\":\"xport\",\"host\",\"port\",\"session\"}\n"
           "  --host H          server: bind address (default 0.0.0.0; :: for IPv6)\n"
           "  --port P          server: control port (default 14590; 0: any free port)\n"
           "  --data-port P     server: fixed data-plane port (default: any free port)\n"
           "  --advertise HOST  server: the host clients are told to write to (default: the\n"
           "                    local address of each client's control connection)\n"
           "  --client H:P      run against the server at H:P ([v6]:P for IPv6)\n"
           "  --warmup D        client: untimed writes before each measurement (default 200ms;\n"
           "                    bare: seconds)\n");
}

/* The buffers of one row: a source of n bytes and a target region of n bytes
 * (memfd, shared mapping) registered with t under key. */
typedef struct row_bufs {
    size_t n;
    int fd;
    uint8_t *dst, *src; /* dst is NULL when not mapped */
    char key[ECT_XPORT_KEY_MAX];
} row_bufs;

/* CLI_EXIT_OK, or CLI_EXIT_FAIL said on stderr; row_bufs_close either way. */
static int row_bufs_open(row_bufs *b, ect_xport *t, const char *kind, size_t n) {
    *b = (row_bufs){.n = n, .fd = memfd_create("bench_xport", MFD_CLOEXEC), .src = malloc(n)};
    if (b->fd >= 0 && ftruncate(b->fd, (off_t)n) == 0) {
        void *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, b->fd, 0);
        b->dst = m == MAP_FAILED ? NULL : m;
    }
    if (!b->dst || !b->src || ect_xport_register(t, b->dst, n, b->fd, 0, b->key) != 0) {
        fprintf(stderr, "ect bench xport: %s: setup of %zu bytes failed: %s\n", kind, n,
                ect_last_error());
        return CLI_EXIT_FAIL;
    }
    return CLI_EXIT_OK;
}

static void row_bufs_close(row_bufs *b) {
    if (b->dst) munmap(b->dst, b->n);
    if (b->fd >= 0) close(b->fd);
    free(b->src);
}

/* One write_batch of SMALL_N x 64 KiB beside one write of the same 2 MiB on
 * the same transport, same buffers, same run, their rounds alternated: what
 * small items cost the data plane itself (limit "1x2MiB"). */
static int small_batch(const char *kind, ect_xport *t, ect_xport *i, double secs, bool json,
                       bool *first) {
    size_t n = (size_t)SMALL_N * SMALL_LEN;
    row_bufs rb;
    int rc = row_bufs_open(&rb, t, kind, n);
    uint8_t *dst = rb.dst, *src = rb.src;
    char *key = rb.key;
    stats us = {0}, lim = {0};
    if (rc == CLI_EXIT_OK) {
        memset(src, 0xab, n);
        batch_ctx b = {.x = i, .session = ect_xport_session(t)};
        for (size_t k = 0; k < SMALL_N; k++)
            b.w[k] = (ect_write){.src = src + k * SMALL_LEN,
                                 .dst_addr = (uint64_t)(uintptr_t)dst + k * SMALL_LEN,
                                 .len = SMALL_LEN,
                                 .dst_key = key};
        cli_write_ctx c = {
            .x = i,
            .session = ect_xport_session(t),
            .w = {.src = src, .dst_addr = (uint64_t)(uintptr_t)dst, .len = n, .dst_key = key}};
        if (cli_timed_pair(batch_iter, &b, n, cli_write_iter, &c, n, secs, &us, &lim) != 0) {
            fprintf(stderr, "ect bench xport: %s: write failed: %s\n", kind, ect_last_error());
            rc = CLI_EXIT_FAIL;
        }
        ect_xport_unregister(t, key);
    }
    if (rc == CLI_EXIT_OK) {
        xport_row(json, !*first, kind, SMALL_LEN, "32x64KiB", SMALL_N, &us, "1x2MiB", &lim, "");
        *first = false;
    }
    row_bufs_close(&rb);
    return rc;
}

/* ---- connection setup: a fresh initiator per write */

static const char *bench_keys; /* --curve-keys */

typedef struct conn_ctx {
    const char *kind;
    const ect_xport_opts *o;
    const char *session;
    ect_write w;
} conn_ctx;

static int conn_iter(void *p) {
    conn_ctx *c = p;
    ect_xport *i = NULL;
    int rc = ect_xport_open(c->kind, c->o, &i);
    if (!rc) rc = ect_xport_write_batch(i, c->session, &c->w, 1, NULL);
    ect_xport_close(i);
    return rc;
}

/* The "new conn" row: connect + hello (+ handshake with keys) + one 64 KiB
 * write with a fresh initiator each time, beside the same write on i's
 * cached connection, their rounds alternated. */
static int new_conn_row(const char *kind, const ect_xport_opts *o, ect_xport *t, ect_xport *i,
                        double secs, bool json, bool *first) {
    row_bufs rb;
    int rc = row_bufs_open(&rb, t, kind, SMALL_LEN);
    stats us = {0}, lim = {0};
    if (rc == CLI_EXIT_OK) {
        memset(rb.src, 0xcd, SMALL_LEN);
        ect_write w = {.src = rb.src,
                       .dst_addr = (uint64_t)(uintptr_t)rb.dst,
                       .len = SMALL_LEN,
                       .dst_key = rb.key};
        conn_ctx cc = {kind, o, ect_xport_session(t), w};
        cli_write_ctx c = {.x = i, .session = ect_xport_session(t), .w = w};
        if (cli_timed_pair(conn_iter, &cc, SMALL_LEN, cli_write_iter, &c, SMALL_LEN, secs, &us,
                           &lim) != 0) {
            fprintf(stderr, "ect bench xport: %s: write failed: %s\n", kind, ect_last_error());
            rc = CLI_EXIT_FAIL;
        }
        ect_xport_unregister(t, rb.key);
    }
    if (rc == CLI_EXIT_OK) {
        xport_row(json, !*first, kind, SMALL_LEN, "new conn", 0, &us, "cached", &lim,
                  bench_keys ? ",\"new_conn\":true,\"keys\":true" : ",\"new_conn\":true");
        *first = false;
    }
    row_bufs_close(&rb);
    return rc;
}

/* One size row: c's writes beside the limit of kind on the same buffers,
 * their rounds alternated (ucx: ucx_perftest after the writes; the limit
 * left unmeasured, lim->ok false, when it cannot run). -1 when a write
 * failed. */
static int size_row(const char *kind, cli_write_ctx *c, double secs, stats *us, stats *lim) {
    size_t n = (size_t)c->w.len;
    uint8_t *dst = (uint8_t *)(uintptr_t)c->w.dst_addr;
    const uint8_t *src = c->w.src;
    if (strcmp(kind, "tcp") == 0) {
        raw_ctx r = {.dst = dst, .src = src, .n = n};
        pthread_t th;
        if (raw_open(&r, &th) != 0) return cli_timed(cli_write_iter, c, n, secs, us);
        int rc = cli_timed_pair(cli_write_iter, c, n, raw_iter, &r, n, secs, us, lim);
        raw_close(&r, th);
        return rc;
    }
    if (strcmp(kind, "shm") == 0) {
        cp_ctx cp = {.dst = dst, .src = src, .n = n};
        return cli_timed_pair(cli_write_iter, c, n, cp_iter, &cp, n, secs, us, lim);
    }
    if (cli_timed(cli_write_iter, c, n, secs, us) != 0) return -1;
    int iters = (int)(secs * us->gbps * 1e9 / (double)n);
    perftest_limit(n, iters < 20 ? 20 : iters > 20000 ? 20000 : iters, lim);
    return 0;
}

static int one_kind(const char *kind, double secs, bool json, bool *first) {
    static const uint64_t sizes[] = {64 << 10, 1 << 20, 9 << 19, 16 << 20, 64 << 20};
    ect_xport *t = NULL, *i = NULL;
    ect_xport_opts o;
    ect_xport_opts_init(&o);
    o.curve_keys = bench_keys;
    if (bench_keys && strcmp(kind, "ucx") == 0) {
        fprintf(stderr, "ect bench xport: ucx skipped: it cannot run the data-plane handshake\n");
        return CLI_EXIT_OK;
    }
    if (ect_xport_open(kind, &o, &t) != 0 || ect_xport_open(kind, &o, &i) != 0) {
        fprintf(stderr, "ect bench xport: %s: %s\n", kind, ect_last_error());
        ect_xport_close(t);
        return CLI_EXIT_FAIL;
    }
    const char *limit = strcmp(kind, "tcp") == 0   ? "raw-tcp"
                        : strcmp(kind, "shm") == 0 ? "memcpy"
                                                   : "ucx_perftest";
    int rc = CLI_EXIT_OK;
    for (size_t k = 0; k < CLI_ARRAY_LEN(sizes) && rc == CLI_EXIT_OK; k++) {
        size_t n = (size_t)sizes[k];
        row_bufs rb;
        rc = row_bufs_open(&rb, t, kind, n);
        uint8_t *dst = rb.dst, *src = rb.src;
        char *key = rb.key;
        stats us = {0}, lim = {0};
        if (rc == CLI_EXIT_OK) {
            memset(src, 0xab, n);
            memset(dst, 0, n);
            cli_write_ctx c = {
                .x = i,
                .session = ect_xport_session(t),
                .w = {.src = src, .dst_addr = (uint64_t)(uintptr_t)dst, .len = n, .dst_key = key}};
            if (size_row(kind, &c, secs, &us, &lim) != 0) {
                fprintf(stderr, "ect bench xport: %s: write failed: %s\n", kind, ect_last_error());
                rc = CLI_EXIT_FAIL;
            }
            ect_xport_unregister(t, key);
        }
        if (rc == CLI_EXIT_OK) {
            char sz[32];
            xport_row(json, !*first, kind, n, cli_fmt_size(n, sz, sizeof sz), 0, &us, limit, &lim,
                      "");
            *first = false;
        }
        row_bufs_close(&rb);
    }
    if (rc == CLI_EXIT_OK && strcmp(kind, "ucx") != 0)
        rc = small_batch(kind, t, i, secs, json, first);
    if (rc == CLI_EXIT_OK && strcmp(kind, "ucx") != 0)
        rc = new_conn_row(kind, &o, t, i, secs, json, first);
    ect_xport_close(i);
    ect_xport_close(t);
    return rc;
}

int bench_xport(int argc, char **argv) {
    static const struct option opts[] = {{"json", no_argument, 0, 'j'},
                                         {"transport", required_argument, 0, 't'},
                                         {"seconds", required_argument, 0, 's'},
                                         {"curve-keys", required_argument, 0, 'K'},
                                         BENCH_REMOTE_OPTIONS,
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    bool json = false;
    double secs = 0.5;
    bench_remote_args ra;
    bench_remote_args_init(&ra);
    const char *list = cli_have_transport("ucx") ? "tcp,shm,ucx" : "tcp,shm";
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "jt:s:h", opts, NULL)) != -1) {
        int r = bench_remote_arg("xport", c, optarg, &ra);
        if (r < 0) return CLI_EXIT_USAGE;
        if (r > 0) continue;
        switch (c) {
        case 'j': json = true; break;
        case 't': list = optarg; break;
        case 's':
            if (!cli_parse_seconds("bench xport", optarg, 0.05, 60, &secs)) return CLI_EXIT_USAGE;
            break;
        case 'K': bench_keys = optarg; break;
        case 'h': help(); return CLI_EXIT_OK;
        default: return cli_bad_flag("bench xport", opts);
        }
    }
    if (optind < argc)
        return cli_usage_error("bench xport", "unexpected argument '%s'", argv[optind]);
    char ch[256];
    int cp = 0;
    if (bench_remote_check("xport", &ra, ch, sizeof ch, &cp) != CLI_EXIT_OK) return CLI_EXIT_USAGE;
    if (ra.server)
        return bench_xport_server(ra.host, (int)ra.port, (int)ra.data_port, ra.advertise);
    if (ra.client) return bench_xport_client(ch, cp, secs, ra.warm_ms / 1000, json);
    char kinds[64];
    snprintf(kinds, sizeof kinds, "%s", list);
    for (char *save = NULL, *k = strtok_r(kinds, ",", &save); k; k = strtok_r(NULL, ",", &save)) {
        if (strcmp(k, "tcp") && strcmp(k, "shm") && strcmp(k, "ucx"))
            return cli_usage_error("bench xport", "--transport: '%s' is not tcp, shm or ucx", k);
        if (strcmp(k, "ucx") == 0 && !cli_have_transport("ucx"))
            return cli_usage_error("bench xport", "--transport: ucx is not compiled in");
    }
    if (json)
        printf("[");
    else
        printf("%-4s %9s %8s %8s %8s   %-12s %8s %8s %8s   %6s\n", "xprt", "size", "GB/s", "p50 us",
               "p99 us", "limit", "GB/s", "p50 us", "p99 us", "ratio");
    snprintf(kinds, sizeof kinds, "%s", list);
    bool first = true;
    int rc = CLI_EXIT_OK;
    for (char *save = NULL, *k = strtok_r(kinds, ",", &save); k; k = strtok_r(NULL, ",", &save)) {
        int r = one_kind(k, secs, json, &first);
        if (r != CLI_EXIT_OK) rc = r;
    }
    if (json) printf("]\n");
    return rc;
}

void xport_row(bool json, bool comma, const char *kind, size_t size, const char *label, int batch,
               const cli_timing *us, const char *limit, const cli_timing *lim, const char *extra) {
    double ratio = lim->ok && lim->gbps > 0 ? us->gbps / lim->gbps : NAN;
    double lg = lim->ok ? lim->gbps : NAN, l50 = lim->ok ? lim->p50_us : NAN,
           l99 = lim->ok ? lim->p99_us : NAN;
    if (json) {
        printf("%s{\"transport\":\"%s\",\"size\":%zu,", comma ? "," : "", kind, size);
        if (batch) printf("\"batch\":%d,", batch);
        printf("\"gbps\":");
        cli_json_num(us->gbps);
        printf(",\"limit\":\"%s\",\"limit_gbps\":", limit);
        cli_json_num(lg);
        printf(",\"ratio\":");
        cli_json_num(ratio);
        printf(",\"p50_us\":");
        cli_json_num(us->p50_us);
        printf(",\"p99_us\":");
        cli_json_num(us->p99_us);
        printf(",\"limit_p50_us\":");
        cli_json_num(l50);
        printf(",\"limit_p99_us\":");
        cli_json_num(l99);
        if (us->rounds) printf(",\"rounds\":%zu", us->rounds);
        if (lim->ok && lim->rounds) printf(",\"limit_rounds\":%zu", lim->rounds);
        printf("%s}", extra);
    } else {
        printf("%-4s %9s %8.2f %8.1f %8.1f   %-12s %8.2f %8.1f %8.1f   %6.2f\n", kind, label,
               us->gbps, us->p50_us, us->p99_us, limit, lg, l50, l99, ratio);
    }
    fflush(stdout);
}
