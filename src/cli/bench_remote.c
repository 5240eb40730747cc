/*
 * bench_remote — `ect bench xport --server` / `--client HOST:PORT`: the tcp
 * data plane measured between two hosts, as ucx_perftest does it: one host
 * runs the server (a tcp target plus a small control listener), the other
 * names it and drives the run, printing the same table and JSON as the
 * loopback bench. The raw-TCP limit is measured between the same two hosts
 * in the same run, against the same server, its rounds alternated with the
 * writes' (cli_timed_pair). `ect bench push --server` runs
 * the same listener beside a push consumer (bench_push.c) and tells its
 * control port.
 *
 * Control protocol (text lines on one TCP connection each, ours only):
 *   "REG N\n"  the server maps and registers N bytes and answers
 *              "OK KEY ADDR SESSION\n" (SESSION's host: --advertise, or the
 *              local address of this control connection, never a wildcard);
 *              the region lives until the client closes the connection.
 *   "RAW N\n"  the connection becomes a raw sink: N bytes in, one byte back,
 *              until the client closes it.
 *   "PUSH\n"   (push server) "OK PORT\n": the push consumer's control port.
 *   anything else: "ERR text\n" and the connection is closed.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cli/bench_remote.h"
#include "cli/cli.h"
#include "ectransfer.h"

#define MAX_REG (1ull << 30)

static volatile sig_atomic_t stop_flag;
static void on_signal(int sig) {
    (void)sig;
    stop_flag = 1;
}

static int read_line(int fd, char *buf, size_t cap) {
    size_t n = 0;
    while (n + 1 < cap) {
        char ch;
        ssize_t k = recv(fd, &ch, 1, 0);
        if (k <= 0) return -1;
        if (ch == '\n') break;
        buf[n++] = ch;
    }
    buf[n] = '\0';
    return (int)n;
}

static int send_all(int fd, const void *p, size_t n) {
    const uint8_t *b = p;
    while (n) {
        ssize_t k = send(fd, b, n, MSG_NOSIGNAL);
        if (k <= 0) return -1;
        b += k;
        n -= (size_t)k;
    }
    return 0;
}

/* ---- server */

typedef struct srv {
    ect_xport *t;
    const char *advertise;
    int push_port;
} srv;

typedef struct conn {
    srv *s;
    int fd;
} conn;

/* The host part of the target's session, told as this connection's local
 * address (or --advertise). */
static void told_session(srv *s, int fd, char *out, size_t cap) {
    const char *sess = ect_xport_session(s->t);
    char host[256], local[NI_MAXHOST] = "";
    int port = 0;
    if (ect_hostport_parse("session", sess, 0, 65535, host, sizeof host, &port) != 0) {
        snprintf(out, cap, "%s", sess);
        return;
    }
    if (s->advertise) {
        snprintf(local, sizeof local, "%s", s->advertise);
    } else {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0 ||
            getnameinfo((struct sockaddr *)&ss, sl, local, sizeof local, NULL, 0, NI_NUMERICHOST) !=
                0)
            snprintf(local, sizeof local, "%s", host);
        if (strncmp(local, "::ffff:", 7) == 0 && strchr(local + 7, '.'))
            memmove(local, local + 7, strlen(local + 7) + 1);
    }
    snprintf(out, cap, strchr(local, ':') ? "[%s]:%d" : "%s:%d", local, port);
}

static void *serve(void *p) {
    conn *c = p;
    pthread_setname_np(pthread_self(), "ect-bench-conn");
    char line[128];
    uint64_t n = 0;
    if (read_line(c->fd, line, sizeof line) < 0) goto out;
    if (sscanf(line, "REG %" SCNu64, &n) == 1 && n > 0 && n <= MAX_REG) {
        int fd = memfd_create("bench_remote", MFD_CLOEXEC);
        void *dst = MAP_FAILED;
        if (fd >= 0 && ftruncate(fd, (off_t)n) == 0)
            dst = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        char key[ECT_XPORT_KEY_MAX], reply[ECT_XPORT_KEY_MAX + 400], sess[300];
        if (dst == MAP_FAILED || ect_xport_register(c->s->t, dst, n, fd, 0, key) != 0) {
            snprintf(reply, sizeof reply, "ERR cannot register %" PRIu64 " bytes: %s\n", n,
                     dst == MAP_FAILED ? strerror(errno) : ect_last_error());
            send_all(c->fd, reply, strlen(reply));
        } else {
            told_session(c->s, c->fd, sess, sizeof sess);
            snprintf(reply, sizeof reply, "OK %s %" PRIu64 " %s\n", key, (uint64_t)(uintptr_t)dst,
                     sess);
            if (send_all(c->fd, reply, strlen(reply)) == 0) {
                char ch;
                while (recv(c->fd, &ch, 1, 0) > 0) {
                } /* until the client is done */
            }
            ect_xport_unregister(c->s->t, key);
        }
        if (dst != MAP_FAILED) munmap(dst, n);
        if (fd >= 0) close(fd);
    } else if (sscanf(line, "RAW %" SCNu64, &n) == 1 && n > 0 && n <= MAX_REG) {
        uint8_t *buf = malloc(n);
        for (bool on = buf != NULL; on;) {
            size_t got = 0;
            while (got < n) {
                ssize_t k = recv(c->fd, buf + got, n - got, 0);
                if (k <= 0) {
                    on = false;
                    break;
                }
                got += (size_t)k;
            }
            uint8_t a = 1;
            if (on && send(c->fd, &a, 1, MSG_NOSIGNAL) != 1) on = false;
        }
        free(buf);
    } else if (strcmp(line, "PUSH") == 0 && c->s->push_port > 0) {
        char reply[32];
        snprintf(reply, sizeof reply, "OK %d\n", c->s->push_port);
        send_all(c->fd, reply, strlen(reply));
    } else {
        static const char bad[] = "ERR expected REG N or RAW N (N 1..2^30)\n";
        send_all(c->fd, bad, sizeof bad - 1);
    }
out:
    close(c->fd);
    free(c);
    return NULL;
}

int bench_remote_serve(const char *name, const char *host, int port, int data_port,
                       const char *advertise, int push_port) {
    ect_xport_opts o;
    ect_xport_opts_init(&o);
    char listen_addr[300];
    snprintf(listen_addr, sizeof listen_addr, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host,
             data_port);
    o.listen = listen_addr;
    srv s = {.advertise = advertise, .push_port = push_port};
    if (ect_xport_open("tcp", &o, &s.t) != 0) {
        fprintf(stderr, "ect bench %s: server: %s\n", name, ect_last_error());
        return CLI_EXIT_FAIL;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV},
                    *res = NULL;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int l = -1, one = 1;
    if (getaddrinfo(host, ps, &hints, &res) == 0) {
        l = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (l >= 0) setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (l >= 0 && (bind(l, res->ai_addr, res->ai_addrlen) != 0 || listen(l, 16) != 0)) {
            close(l);
            l = -1;
        }
        freeaddrinfo(res);
    }
    if (l < 0) {
        fprintf(stderr, "ect bench %s: server: cannot listen on %s port %d: %s\n", name, host, port,
                strerror(errno));
        ect_xport_close(s.t);
        return CLI_EXIT_FAIL;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(l, (struct sockaddr *)&ss, &sl);
    int bound = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                               : ((struct sockaddr_in *)&ss)->sin_port);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    printf("{\"event\":\"ready\",\"bench\":\"%s\",\"host\":\"%s\",\"port\":%d,"
           "\"session\":\"%s\"",
           name, host, bound, ect_xport_session(s.t));
    if (push_port > 0) printf(",\"push_port\":%d", push_port);
    printf("}\n");
    fflush(stdout);
    unsigned served = 0;
    while (!stop_flag) {
        struct pollfd pf = {.fd = l, .events = POLLIN};
        if (poll(&pf, 1, 200) <= 0) continue; /* EINTR on a signal: the loop tests stop_flag */
        int fd = accept4(l, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) continue;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        conn *c = malloc(sizeof *c);
        pthread_t th;
        if (!c) {
            close(fd);
            continue;
        }
        *c = (conn){.s = &s, .fd = fd};
        if (pthread_create(&th, NULL, serve, c) != 0) {
            close(fd);
            free(c);
            continue;
        }
        pthread_detach(th);
        served++;
    }
    close(l);
    /* Connections still open end with the process; the target closes first
     * so no write lands after. */
    ect_xport_close(s.t);
    fprintf(stderr, "ect bench %s: server: %u connection(s) served\n", name, served);
    return CLI_EXIT_OK;
}

int bench_xport_server(const char *host, int port, int data_port, const char *advertise) {
    return bench_remote_serve("xport", host, port, data_port, advertise, 0);
}

/* ---- client */

static int dial(const char *host, int port) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV},
                    *res = NULL;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    if (getaddrinfo(host, ps, &hints, &res) != 0) return -1;
    int fd = -1, one = 1;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd >= 0) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

int bench_remote_sink_iter(void *p) {
    bench_remote_sink *c = p;
    for (size_t j = 0; j < c->k; j++)
        if (send_all(c->fd, c->src[j], c->n) != 0) return -1;
    uint8_t a;
    return recv(c->fd, &a, 1, 0) == 1 ? 0 : -1;
}

int bench_remote_sink_open(const char *host, int port, void *const *src, size_t k, size_t n,
                           bench_remote_sink *out) {
    char line[64];
    snprintf(line, sizeof line, "RAW %zu\n", k * n);
    *out = (bench_remote_sink){.fd = dial(host, port), .src = src, .k = k, .n = n};
    if (out->fd >= 0 && k * n <= MAX_REG && send_all(out->fd, line, strlen(line)) == 0) return 0;
    bench_remote_sink_close(out);
    return -1;
}

void bench_remote_sink_close(bench_remote_sink *s) {
    if (s->fd >= 0) close(s->fd);
    s->fd = -1;
}

/* Runs fn for `warm` seconds untimed (warm-up); 0, or -1 when a call failed. */
static int warm_up(cli_iter_fn fn, void *ctx, double warm) {
    uint64_t end = cli_now_ns() + (uint64_t)(warm * 1e9);
    while (cli_now_ns() < end)
        if (fn(ctx) != 0) return -1;
    return 0;
}

/* One row of the client: wc's writes and the raw-TCP limit through sink
 * (NULL: none), each warmed up for `warm` seconds, then their rounds
 * alternated (cli_timed_pair). When the limit fails, the writes are timed
 * alone and lim is left not ok. -1 when a write failed. */
static int client_row(cli_write_ctx *wc, bench_remote_sink *sink, size_t n, double warm,
                      double secs, cli_timing *us, cli_timing *lim) {
    if (warm_up(cli_write_iter, wc, warm) != 0) return -1;
    if (sink && warm_up(bench_remote_sink_iter, sink, warm) == 0 &&
        cli_timed_pair(cli_write_iter, wc, n, bench_remote_sink_iter, sink, n, secs, us, lim) == 0)
        return 0;
    lim->ok = false;
    return cli_timed(cli_write_iter, wc, n, secs, us);
}

int bench_remote_push_port(const char *host, int port, int *push_port) {
    char line[128] = "";
    int fd = dial(host, port);
    int e = fd < 0 || send_all(fd, "PUSH\n", 5) != 0 || read_line(fd, line, sizeof line) < 0 ||
                    sscanf(line, "OK %d", push_port) != 1
                ? -1
                : 0;
    if (fd >= 0) close(fd);
    return e;
}

void bench_remote_args_init(bench_remote_args *a) {
    memset(a, 0, sizeof *a);
    a->host = "0.0.0.0";
    a->port = 14590;
    a->warm_ms = 200;
}

int bench_remote_arg(const char *name, int c, const char *arg, bench_remote_args *a) {
    char cmd[32];
    snprintf(cmd, sizeof cmd, "bench %s", name);
    switch (c) {
    case 'S': a->server = true; return 1;
    case 'C': a->client = arg; return 1;
    case 'H': a->host = arg; return 1;
    case 'A':
        if (!*arg || ect_host_is_wildcard(arg) || strlen(arg) > 255) {
            cli_usage_error(cmd,
                            "--advertise '%s': a host name or address clients can reach, not a "
                            "wildcard",
                            arg);
            return -1;
        }
        a->advertise = arg;
        return 1;
    case 'p': return cli_parse_u64("--port", arg, 0, 65535, &a->port) ? 1 : -1;
    case 'P': return cli_parse_u64("--data-port", arg, 0, 65535, &a->data_port) ? 1 : -1;
    case 'w': return cli_parse_duration("--warmup", arg, 1000, 0, 60000, &a->warm_ms) ? 1 : -1;
    default: return 0;
    }
}

int bench_remote_check(const char *name, bench_remote_args *a, char *host, size_t hostcap,
                       int *port) {
    char cmd[32];
    snprintf(cmd, sizeof cmd, "bench %s", name);
    if (a->server && a->client)
        return cli_usage_error(cmd, "--server and --client exclude each other");
    if (a->client && !cli_parse_hostport("--client", a->client, host, hostcap, port))
        return CLI_EXIT_USAGE;
    return CLI_EXIT_OK;
}

int bench_xport_client(const char *host, int port, double secs, double warm, bool json) {
    static const uint64_t sizes[] = {64 << 10, 1 << 20, 9 << 19, 16 << 20, 64 << 20};
    ect_xport *x = NULL;
    ect_xport_opts o;
    ect_xport_opts_init(&o);
    if (ect_xport_open("tcp", &o, &x) != 0) {
        fprintf(stderr, "ect bench xport: client: %s\n", ect_last_error());
        return CLI_EXIT_FAIL;
    }
    if (json)
        printf("[");
    else
        printf("%-4s %9s %8s %8s %8s   %-12s %8s %8s %8s   %6s\n", "xprt", "size", "GB/s", "p50 us",
               "p99 us", "limit", "GB/s", "p50 us", "p99 us", "ratio");
    int rc = CLI_EXIT_OK;
    for (size_t k = 0; k < CLI_ARRAY_LEN(sizes) && rc == CLI_EXIT_OK; k++) {
        size_t n = (size_t)sizes[k];
        uint8_t *src = malloc(n);
        int cfd = dial(host, port);
        char line[ECT_XPORT_KEY_MAX + 400], key[ECT_XPORT_KEY_MAX], sess[300];
        uint64_t addr = 0;
        cli_timing us = {0}, lim = {0};
        if (!src || cfd < 0) {
            fprintf(stderr, "ect bench xport: client: cannot reach the server at %s port %d: %s\n",
                    host, port, strerror(errno));
            rc = CLI_EXIT_FAIL;
            goto next;
        }
        memset(src, 0xab, n);
        snprintf(line, sizeof line, "REG %zu\n", n);
        if (send_all(cfd, line, strlen(line)) != 0 || read_line(cfd, line, sizeof line) < 0 ||
            sscanf(line, "OK %2047s %" SCNu64 " %299s", key, &addr, sess) != 3) {
            fprintf(stderr, "ect bench xport: client: the server refused %zu bytes: %s\n", n, line);
            rc = CLI_EXIT_FAIL;
            goto next;
        }
        cli_write_ctx wc = {
            .x = x, .session = sess, .w = {.src = src, .dst_addr = addr, .len = n, .dst_key = key}};
        /* the limit: raw TCP to the same server host, same bytes, same sync */
        void *one[1] = {src};
        bench_remote_sink sink;
        bool have_sink = bench_remote_sink_open(host, port, one, 1, n, &sink) == 0;
        int e = client_row(&wc, have_sink ? &sink : NULL, n, warm, secs, &us, &lim);
        if (have_sink) bench_remote_sink_close(&sink);
        if (e != 0) {
            fprintf(stderr, "ect bench xport: client: write to %s failed: %s\n", sess,
                    ect_last_error());
            rc = CLI_EXIT_FAIL;
            goto next;
        }
        if (!lim.ok) fprintf(stderr, "ect bench xport: client: raw TCP limit to %s failed\n", host);
        char sz[32], extra[600];
        snprintf(extra, sizeof extra, ",\"server\":\"%s\",\"session\":\"%s\"", host, sess);
        xport_row(json, k > 0, "tcp", n, cli_fmt_size(n, sz, sizeof sz), 0, &us, "raw-tcp", &lim,
                  extra);
    next:
        if (cfd >= 0) close(cfd);
        free(src);
    }
    if (json) printf("]\n");
    ect_xport_close(x);
    return rc;
}
