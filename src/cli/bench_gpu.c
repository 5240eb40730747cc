/*
 * bench_gpu — `ect bench gpu`: moving items into GPU memory, beside the
 * limits measured in the same run. The target is a child process (forked
 * before this process loads CUDA) holding three regions: a host memfd pool
 * and a device pool on a tcp transport, and the same device pool on a shm
 * transport (reached by CUDA IPC). This process writes one item per batch,
 * timed from the call to the acknowledgement (bytes on the device):
 *
 *   tcp host pool      host item -> host pool over tcp (the baseline)
 *   tcp gpu pool       host item -> device pool over tcp (pinned bounce ring
 *                      in the target, copy pipelined behind the network);
 *                      goal >= 0.9 x the same run's tcp host pool
 *   tcp gpu->gpu       device item -> device pool over tcp (one
 *                      device-to-host copy staged here, then as above);
 *                      compared with tcp host pool
 *   ipc d2d            device item -> device pool over shm by CUDA IPC;
 *                      goal >= 0.5 x the device-to-device copy
 *   ipc h2d            pinned host item -> device pool over shm by CUDA IPC;
 *                      compared with the pinned host-to-device copy
 * and the limits, in this process: cuMemcpyAsync + stream sync of the same
 * bytes pinned host -> device and device -> device (what ect_mem_copy does).
 * The two tcp cases alternate over two rounds and each keeps its better
 * round, so a drift of the machine's load hits both alike.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/cli.h"
#include "ectransfer.h"

#define MAX_SIZES 8

typedef struct target_info {
    int ok;
    char why[300];
    char tcp_session[300], shm_session[300];
    char host_key[ECT_XPORT_KEY_MAX], dev_tcp_key[ECT_XPORT_KEY_MAX],
        dev_shm_key[ECT_XPORT_KEY_MAX];
    uint64_t host_addr, dev_addr, len;
} target_info;

static int rd(int fd, void *b, size_t n) {
    for (size_t got = 0; got < n;) {
        ssize_t k = read(fd, (char *)b + got, n - got);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        got += (size_t)k;
    }
    return 0;
}

static int wr(int fd, const void *b, size_t n) {
    for (size_t put = 0; put < n;) {
        ssize_t k = write(fd, (const char *)b + put, n - put);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        put += (size_t)k;
    }
    return 0;
}

/* The target process: opens everything, reports, waits for EOF on `in`. */
static void target_main(int in, int out, uint64_t len, int device) {
    target_info t;
    memset(&t, 0, sizeof t);
    ect_xport *tcp = NULL, *shm = NULL;
    void *dev = NULL;
    uint8_t *host = MAP_FAILED;
    int fd = memfd_create("ect-bench-gpu", MFD_CLOEXEC);
    int rc = ect_mem_alloc(ECT_MEM_CUDA, device, len, &dev);
    if (!rc) rc = ect_xport_open("tcp", NULL, &tcp);
    if (!rc) rc = ect_xport_open("shm", NULL, &shm);
    if (!rc &&
        (fd < 0 || ftruncate(fd, (off_t)len) != 0 ||
         (host = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED)) {
        rc = ECT_ENOMEM;
        snprintf(t.why, sizeof t.why, "host pool of %" PRIu64 " bytes: %s", len, strerror(errno));
    }
    if (!rc) rc = ect_xport_register(tcp, host, len, fd, 0, t.host_key);
    if (!rc) rc = ect_xport_register_mem(tcp, dev, len, ECT_MEM_CUDA, -1, 0, t.dev_tcp_key);
    if (!rc) rc = ect_xport_register_mem(shm, dev, len, ECT_MEM_CUDA, -1, 0, t.dev_shm_key);
    t.ok = rc == 0;
    if (rc && !t.why[0]) snprintf(t.why, sizeof t.why, "%s", ect_last_error());
    if (!rc) {
        memset(host, 0, len);
        snprintf(t.tcp_session, sizeof t.tcp_session, "%s", ect_xport_session(tcp));
        snprintf(t.shm_session, sizeof t.shm_session, "%s", ect_xport_session(shm));
        t.host_addr = (uint64_t)(uintptr_t)host;
        t.dev_addr = (uint64_t)(uintptr_t)dev;
        t.len = len;
    }
    wr(out, &t, sizeof t);
    char b;
    while (t.ok && read(in, &b, 1) != 0) {
    }
    ect_xport_close(shm);
    ect_xport_close(tcp);
    ect_mem_free(ECT_MEM_CUDA, dev);
    _exit(t.ok ? 0 : 1);
}

typedef cli_timing stats;

typedef struct cp_ctx {
    void *dst;
    const void *src;
    uint64_t n;
} cp_ctx;

static int cp_iter(void *p) {
    cp_ctx *c = p;
    return ect_mem_copy(c->dst, c->src, c->n);
}

/* One write of n bytes from src to dst (key) at session, as a timed call. */
static cli_write_ctx write_ctx(ect_xport *x, const char *session, const void *src, uint64_t dst,
                               const char *key, uint64_t n) {
    return (cli_write_ctx){x, session, {.src = src, .dst_addr = dst, .len = n, .dst_key = key}};
}

static void help(void) {
    printf("usage: ect bench gpu [--json] [--sizes LIST] [--seconds S] [--device N]\n\n"
           "Items written into GPU memory of a target process (forked; same host, loopback)\n"
           "beside limits measured in the same run. Cases:\n"
           "  tcp host pool  host item -> host pool over tcp (the baseline)\n"
           "  tcp gpu pool   host item -> GPU pool over tcp (pinned bounce ring, copy behind\n"
           "                 the network); goal >= 0.9 x tcp host pool\n"
           "  tcp gpu->gpu   GPU item -> GPU pool over tcp (staged by one device-to-host copy);\n"
           "                 vs tcp host pool\n"
           "  ipc d2d        GPU item -> GPU pool over shm by CUDA IPC; goal >= 0.5 x the\n"
           "                 device-to-device copy (cuMemcpyAsync + sync, this process)\n"
           "  ipc h2d        pinned host item -> GPU pool over shm by CUDA IPC; vs the pinned\n"
           "                 host-to-device copy\n"
           "One item per batch, timed call to acknowledgement (bytes on the device). GB/s is\n"
           "10^9 B/s. The two tcp pool cases alternate over two rounds, each keeping its best.\n"
           "  --sizes LIST   item sizes (default 4.5MiB,64MiB)\n"
           "  --seconds S    time per measurement, 0.02..60, or 200ms (default 0.5)\n"
           "  --device N     CUDA device (default 0)\n"
           "  --json         one JSON list of rows: case, size, gbps, p50_us, limit,\n"
           "                 limit_gbps, ratio, goal (null when none)\n"
           "Needs the CUDA driver (`ect info`); fails with the reason otherwise.\n");
}

typedef struct row {
    const char *name, *limit;
    uint64_t size;
    stats s, lim;
    double goal; /* NAN: none */
} row;

static void print_row(const row *r, bool json, bool *first) {
    double ratio = r->s.ok && r->lim.ok && r->lim.gbps > 0 ? r->s.gbps / r->lim.gbps : NAN;
    char sz[32];
    if (json) {
        printf("%s{\"case\":\"%s\",\"size\":%" PRIu64 ",\"gbps\":%.3f,\"p50_us\":%.1f,"
               "\"limit\":\"%s\",",
               *first ? "" : ",", r->name, r->size, r->s.gbps, r->s.p50_us, r->limit);
        if (r->lim.ok)
            printf("\"limit_gbps\":%.3f,\"ratio\":%.3f,\"goal\":", r->lim.gbps, ratio);
        else
            printf("\"limit_gbps\":null,\"ratio\":null,\"goal\":");
        if (isnan(r->goal))
            printf("null}");
        else
            printf("%.2f}", r->goal);
        *first = false;
    } else {
        char goal[48] = "";
        if (!isnan(r->goal))
            snprintf(goal, sizeof goal, "goal >= %.2f: %s", r->goal,
                     ratio >= r->goal ? "met" : "MISSED");
        char lg[16] = "-", rt[16] = "-";
        if (r->lim.ok) {
            snprintf(lg, sizeof lg, "%.2f", r->lim.gbps);
            snprintf(rt, sizeof rt, "%.2f", ratio);
        }
        printf("%-16s %9s %9.2f %9.1f   %-16s %9s   %6s   %s\n", r->name,
               cli_fmt_size(r->size, sz, sizeof sz), r->s.gbps, r->s.p50_us, r->limit, lg, rt,
               goal);
    }
    fflush(stdout);
}

static int parse_sizes(const char *list, uint64_t *sizes, size_t *n) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list);
    *n = 0;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (*n == MAX_SIZES) return cli_usage_error("bench gpu", "--sizes: at most %d", MAX_SIZES);
        if (!cli_parse_size("--sizes", t, &sizes[*n])) return CLI_EXIT_USAGE;
        if (sizes[*n] == 0 || sizes[*n] > (4ull << 30))
            return cli_usage_error("bench gpu", "--sizes: each 1 B .. 4 GiB");
        (*n)++;
    }
    if (*n == 0) return cli_usage_error("bench gpu", "--sizes: empty list");
    return 0;
}

int bench_gpu(int argc, char **argv) {
    static const struct option opts[] = {
        {"json", no_argument, 0, 'j'},          {"sizes", required_argument, 0, 'z'},
        {"seconds", required_argument, 0, 's'}, {"device", required_argument, 0, 'd'},
        {"help", no_argument, 0, 'h'},          {0, 0, 0, 0}};
    bool json = false;
    double secs = 0.5;
    uint64_t sizes[MAX_SIZES], device = 0;
    size_t nsizes = 0;
    int rc = parse_sizes("4.5MiB,64MiB", sizes, &nsizes), c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "jz:s:d:h", opts, NULL)) != -1) {
        switch (c) {
        case 'j': json = true; break;
        case 'z':
            if ((rc = parse_sizes(optarg, sizes, &nsizes))) return rc;
            break;
        case 's':
            if (!cli_parse_seconds("bench gpu", optarg, 0.02, 60, &secs)) return CLI_EXIT_USAGE;
            break;
        case 'd':
            if (!cli_parse_u64("--device", optarg, 0, 1023, &device)) return CLI_EXIT_USAGE;
            break;
        case 'h': help(); return CLI_EXIT_OK;
        default: return cli_bad_flag("bench gpu", opts);
        }
    }
    if (optind < argc)
        return cli_usage_error("bench gpu", "unexpected argument '%s'", argv[optind]);
    uint64_t len = 0;
    for (size_t i = 0; i < nsizes; i++)
        if (sizes[i] > len) len = sizes[i];
    len = (len + (2u << 20) - 1) & ~(uint64_t)((2u << 20) - 1);

    /* The target first: it must be forked before this process loads CUDA. */
    int to[2], from[2];
    if (pipe(to) != 0 || pipe(from) != 0) {
        fprintf(stderr, "ect bench gpu: pipe: %s\n", strerror(errno));
        return CLI_EXIT_FAIL;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "ect bench gpu: fork: %s\n", strerror(errno));
        return CLI_EXIT_FAIL;
    }
    if (pid == 0) {
        close(to[1]);
        close(from[0]);
        target_main(to[0], from[1], len, (int)device);
    }
    close(to[0]);
    close(from[1]);
    signal(SIGPIPE, SIG_IGN);
    target_info t;
    memset(&t, 0, sizeof t);
    if (rd(from[0], &t, sizeof t) != 0 || !t.ok) {
        fprintf(stderr, "ect bench gpu: target: %s\n", t.why[0] ? t.why : "died");
        close(to[1]);
        close(from[0]);
        waitpid(pid, NULL, 0);
        return CLI_EXIT_FAIL;
    }
    ect_cuda_info ci;
    ect_cuda_get_info(&ci);
    ect_xport *tcp = NULL, *shm = NULL;
    void *hsrc = NULL, *psrc = NULL, *dsrc = NULL, *ddst = NULL;
    rc = CLI_EXIT_OK;
    if (ect_xport_open("tcp", NULL, &tcp) || ect_xport_open("shm", NULL, &shm) ||
        ect_mem_alloc(ECT_MEM_HOST, 0, len, &hsrc) ||
        ect_mem_alloc(ECT_MEM_PINNED, 0, len, &psrc) ||
        ect_mem_alloc(ECT_MEM_CUDA, (int)device, len, &dsrc) ||
        ect_mem_alloc(ECT_MEM_CUDA, (int)device, len, &ddst)) {
        fprintf(stderr, "ect bench gpu: setup: %s\n", ect_last_error());
        rc = CLI_EXIT_FAIL;
    }
    if (rc == CLI_EXIT_OK) {
        cli_fill_synthetic(hsrc, len, 1);
        cli_fill_synthetic(psrc, len, 2);
        if (ect_mem_copy(dsrc, psrc, len) != 0) rc = CLI_EXIT_FAIL;
    }
    if (rc == CLI_EXIT_OK && !json)
        printf("# %s, %d device(s), device %d: %s; %.2f s per measurement\n"
               "%-16s %9s %9s %9s   %-16s %9s   %6s\n",
               ci.library, ci.devices, (int)device, ci.device0, secs, "case", "size", "GB/s",
               "p50 us", "limit", "GB/s", "ratio");
    else if (rc == CLI_EXIT_OK)
        printf("[");
    bool first = true;
    for (size_t k = 0; rc == CLI_EXIT_OK && k < nsizes; k++) {
        uint64_t n = sizes[k];
        stats h2d = {0}, d2d = {0}, th[2] = {{0}}, tg[2] = {{0}}, tgg = {0}, id2d = {0}, ih2d = {0};
        cp_ctx cph = {ddst, psrc, n}, cpd = {ddst, dsrc, n};
        cli_write_ctx host = write_ctx(tcp, t.tcp_session, hsrc, t.host_addr, t.host_key, n);
        cli_write_ctx gpu = write_ctx(tcp, t.tcp_session, hsrc, t.dev_addr, t.dev_tcp_key, n);
        cli_write_ctx gg = write_ctx(tcp, t.tcp_session, dsrc, t.dev_addr, t.dev_tcp_key, n);
        cli_write_ctx ipd = write_ctx(shm, t.shm_session, dsrc, t.dev_addr, t.dev_shm_key, n);
        cli_write_ctx iph = write_ctx(shm, t.shm_session, psrc, t.dev_addr, t.dev_shm_key, n);
        const char *what = "";
        if ((what = "pinned h2d copy", cli_timed(cp_iter, &cph, n, secs, &h2d)) ||
            (what = "d2d copy", cli_timed(cp_iter, &cpd, n, secs, &d2d)) ||
            (what = "tcp host pool", cli_timed(cli_write_iter, &host, n, secs / 2, &th[0])) ||
            (what = "tcp gpu pool", cli_timed(cli_write_iter, &gpu, n, secs / 2, &tg[0])) ||
            (what = "tcp host pool", cli_timed(cli_write_iter, &host, n, secs / 2, &th[1])) ||
            (what = "tcp gpu pool", cli_timed(cli_write_iter, &gpu, n, secs / 2, &tg[1])) ||
            (what = "tcp gpu->gpu", cli_timed(cli_write_iter, &gg, n, secs, &tgg)) ||
            (what = "ipc d2d", cli_timed(cli_write_iter, &ipd, n, secs, &id2d)) ||
            (what = "ipc h2d", cli_timed(cli_write_iter, &iph, n, secs, &ih2d))) {
            fprintf(stderr, "ect bench gpu: %s of %" PRIu64 " bytes failed: %s\n", what, n,
                    ect_last_error());
            rc = CLI_EXIT_FAIL;
            break;
        }
        stats thb = th[0].gbps >= th[1].gbps ? th[0] : th[1];
        stats tgb = tg[0].gbps >= tg[1].gbps ? tg[0] : tg[1];
        const stats none = {.ok = false};
        row rows[] = {
            {"tcp host pool", "-", n, thb, none, NAN},
            {"tcp gpu pool", "tcp host pool", n, tgb, thb, 0.9},
            {"tcp gpu->gpu", "tcp host pool", n, tgg, thb, NAN},
            {"ipc d2d", "d2d copy", n, id2d, d2d, 0.5},
            {"ipc h2d", "pinned h2d copy", n, ih2d, h2d, NAN},
            {"d2d copy", "-", n, d2d, none, NAN},
            {"pinned h2d copy", "-", n, h2d, none, NAN},
        };
        for (size_t i = 0; i < CLI_ARRAY_LEN(rows); i++) print_row(&rows[i], json, &first);
    }
    if (json && rc == CLI_EXIT_OK) printf("]\n");
    ect_xport_close(tcp);
    ect_xport_close(shm);
    ect_mem_free(ECT_MEM_HOST, hsrc);
    ect_mem_free(ECT_MEM_PINNED, psrc);
    ect_mem_free(ECT_MEM_CUDA, dsrc);
    ect_mem_free(ECT_MEM_CUDA, ddst);
    close(to[1]); /* the target exits on EOF */
    close(from[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    return rc;
}
