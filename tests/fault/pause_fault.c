/*
 * pause_fault — fault injection for tests/cli/netns_faults.sh and
 * push_faults.sh, kept out of the shipped `ect`. Preloaded (LD_PRELOAD) into `ect push`, it stops
 * the process's data plane for good at one point of a push and names the point in the file
 * $ECT_FAULT_MARK, so the test can kill -9 the producer exactly there (a readiness event, not a
 * sleep). $ECT_FAULT_PAUSE picks the point:
 *
 *   after_reserve    the first connect() to the consumer's data plane: the
 *                    first step's reserves were answered, no byte written;
 *   during_write     the sendmsg() that would take the bytes sent to the data
 *                    plane past $ECT_FAULT_BYTES (default 1 MiB): part of the
 *                    first items landed, none is complete. Data-plane
 *                    sendmsg() calls are cut to 256 KiB each meanwhile (a
 *                    partial send, which the transport must handle anyway),
 *                    so the point falls inside a write;
 *   before_complete  the first zmq_send() of a control frame whose op is
 *                    "complete" or "complete_batch", or the first send() of
 *                    the ZMTP bytes of one (the control client speaks ZMTP
 *                    itself when no CURVE keys are set): every write of the
 *                    step acknowledged, nothing completed.
 *
 * The consumer's data plane is the TCP ports $ECT_FAULT_DATA_PORT ..
 * + $ECT_FAULT_DATA_PORTS - 1 (its --data-port and TP size). Once paused,
 * every thread that reaches any of these calls stops too. Everything else
 * passes through unchanged.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#define CUT_BYTES (256 * 1024)

static atomic_bool paused;
static atomic_ullong data_bytes;

static const char *point(void) {
    const char *p = getenv("ECT_FAULT_PAUSE");
    return p ? p : "";
}

/* Marks the point (once) and blocks the calling thread until the kill. */
static void stop_here(const char *name) {
    if (!atomic_exchange(&paused, true)) {
        const char *mark = getenv("ECT_FAULT_MARK");
        if (mark) {
            int fd = open(mark, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
            if (fd >= 0) {
                ssize_t w = write(fd, name, strlen(name));
                (void)w;
                close(fd);
            }
        }
    }
    for (;;) pause();
}

static bool data_port(int port) {
    const char *b = getenv("ECT_FAULT_DATA_PORT"), *n = getenv("ECT_FAULT_DATA_PORTS");
    if (!b) return false;
    int base = atoi(b), cnt = n ? atoi(n) : 1;
    return port >= base && port < base + cnt;
}

static int addr_port(const struct sockaddr *sa) {
    if (!sa) return -1;
    if (sa->sa_family == AF_INET) return ntohs(((const struct sockaddr_in *)sa)->sin_port);
    if (sa->sa_family == AF_INET6) return ntohs(((const struct sockaddr_in6 *)sa)->sin6_port);
    return -1;
}

static bool data_fd(int fd) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) != 0) return false;
    return data_port(addr_port((struct sockaddr *)&ss));
}

int connect(int fd, const struct sockaddr *sa, socklen_t len) {
    static int (*real)(int, const struct sockaddr *, socklen_t);
    if (!real) real = (int (*)(int, const struct sockaddr *, socklen_t))dlsym(RTLD_NEXT, "connect");
    if (!real) abort();
    if (data_port(addr_port(sa))) {
        if (atomic_load(&paused)) stop_here("");
        if (strcmp(point(), "after_reserve") == 0) stop_here("after_reserve");
    }
    return real(fd, sa, len);
}

ssize_t sendmsg(int fd, const struct msghdr *m, int flags) {
    static ssize_t (*real)(int, const struct msghdr *, int);
    if (!real) real = (ssize_t(*)(int, const struct msghdr *, int))dlsym(RTLD_NEXT, "sendmsg");
    if (!real) abort();
    if (strcmp(point(), "during_write") != 0 || !data_fd(fd)) return real(fd, m, flags);
    if (atomic_load(&paused)) stop_here("");
    const char *b = getenv("ECT_FAULT_BYTES");
    unsigned long long limit = b ? strtoull(b, NULL, 10) : 1024 * 1024;
    if (atomic_load(&data_bytes) >= limit) stop_here("during_write");
    /* at most CUT_BYTES per call: the same iovecs, the last one shortened */
    struct iovec iov[64];
    struct msghdr c = *m;
    size_t n = 0, total = 0;
    for (size_t i = 0; i < m->msg_iovlen && i < 64 && total < CUT_BYTES; i++) {
        iov[n] = m->msg_iov[i];
        if (total + iov[n].iov_len > CUT_BYTES) iov[n].iov_len = CUT_BYTES - total;
        total += iov[n++].iov_len;
    }
    c.msg_iov = iov;
    c.msg_iovlen = n;
    ssize_t k = real(fd, &c, flags);
    if (k > 0) atomic_fetch_add(&data_bytes, (unsigned long long)k);
    return k;
}

/* A control frame whose op is complete or complete_batch, before it leaves. */
static void check_complete(const void *buf, size_t len) {
    if (strcmp(point(), "before_complete") == 0 && buf && len < (1u << 24) &&
        (memmem(buf, len, "\"op\":\"complete", 14) || memmem(buf, len, "\"op\": \"complete", 15)))
        stop_here("before_complete");
}

int zmq_send(void *s, const void *buf, size_t len, int flags); /* libzmq's, interposed */
int zmq_send(void *s, const void *buf, size_t len, int flags) {
    static int (*real)(void *, const void *, size_t, int);
    if (!real) real = (int (*)(void *, const void *, size_t, int))dlsym(RTLD_NEXT, "zmq_send");
    if (!real) abort();
    check_complete(buf, len);
    return real(s, buf, len, flags);
}

ssize_t send(int fd, const void *buf, size_t len, int flags) {
    static ssize_t (*real)(int, const void *, size_t, int);
    if (!real) real = (ssize_t(*)(int, const void *, size_t, int))dlsym(RTLD_NEXT, "send");
    if (!real) abort();
    check_complete(buf, len);
    return real(fd, buf, len, flags);
}
