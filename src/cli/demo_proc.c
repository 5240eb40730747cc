/*
 * demo_proc — spawning, reading and stopping the children of `ect demo`.
 * Every wait here is bounded; a child that ignores SIGTERM gets SIGKILL.
 */
#include "cli/demo_proc.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"

#define LINE_MAX_BYTES (1u << 20)

static long long now_ms(void) { return (long long)cli_now_ms(); }

/* Closes both ends of each of n pipes. */
static void close_pipes(int (*pp)[2], int n) {
    for (int i = 0; i < n; i++) {
        close(pp[i][0]);
        close(pp[i][1]);
    }
}

bool demo_spawn(demo_procs *p, int slot, const char *name, char *const argv[]) {
    demo_child *c = &p->c[slot];
    int pp[3][2]; /* the child's stdout, stderr, stdin */
    for (int i = 0; i < 3; i++)
        if (pipe2(pp[i], O_CLOEXEC) != 0) {
            fprintf(stderr, "ect demo: pipe: %s\n", strerror(errno));
            close_pipes(pp, i);
            return false;
        }
    pid_t parent = getpid();
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "ect demo: fork: %s\n", strerror(errno));
        close_pipes(pp, 3);
        return false;
    }
    if (pid == 0) {
        /* Own process group: a terminal's SIGINT reaches only the parent. */
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127); /* the parent died before prctl */
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        signal(SIGPIPE, SIG_DFL);
        dup2(pp[0][1], STDOUT_FILENO);
        dup2(pp[1][1], STDERR_FILENO);
        dup2(pp[2][0], STDIN_FILENO);
        size_t n = 0;
        while (argv[n]) n++;
        char **full = calloc(n + 2, sizeof *full);
        if (!full) _exit(127);
        full[0] = "ect";
        memcpy(full + 1, argv, n * sizeof *argv);
        execv("/proc/self/exe", full);
        fprintf(stderr, "ect demo: exec /proc/self/exe: %s\n", strerror(errno));
        _exit(127);
    }
    close(pp[0][1]);
    close(pp[1][1]);
    close(pp[2][0]);
    if (c->pid != 0 && c->in >= 0) close(c->in); /* the slot's previous child's */
    /* room for the lines of a batch_ms pause and more: the child never
     * waits on a full pipe meanwhile (a refusal leaves the default 64 KiB) */
    fcntl(pp[0][0], F_SETPIPE_SZ, 1 << 20);
    memset(c, 0, sizeof *c);
    c->pid = pid;
    c->fd[0] = pp[0][0];
    c->fd[1] = pp[1][0];
    c->in = pp[2][1];
    snprintf(c->name, sizeof c->name, "%s", name);
    return true;
}

bool demo_send(demo_procs *p, int slot, const char *line) {
    demo_child *c = &p->c[slot];
    if (c->in < 0) return false;
    size_t n = strlen(line);
    char *buf = malloc(n + 1);
    if (!buf) return false;
    memcpy(buf, line, n);
    buf[n++] = '\n';
    /* a child gone makes the write fail with EPIPE, not kill the parent */
    struct sigaction ign = {.sa_handler = SIG_IGN}, old;
    sigaction(SIGPIPE, &ign, &old);
    size_t done = 0;
    while (done < n) {
        ssize_t w = write(c->in, buf + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        done += (size_t)w;
    }
    sigaction(SIGPIPE, &old, NULL);
    free(buf);
    return done == n;
}

static void keep_tail(demo_child *c, const char *line) {
    size_t have = strlen(c->errtail), add = strlen(line) + 1;
    if (add >= sizeof c->errtail) {
        snprintf(c->errtail, sizeof c->errtail, "%s\n", line + add - sizeof c->errtail + 2);
        return;
    }
    if (have + add >= sizeof c->errtail) {
        size_t drop = have + add - sizeof c->errtail + 1;
        memmove(c->errtail, c->errtail + drop, have - drop + 1);
        have -= drop;
    }
    snprintf(c->errtail + have, sizeof c->errtail - have, "%s\n", line);
}

/* Hands a complete line of stream s of child i to on_line (stderr's also to
 * the error tail). */
static void deliver(demo_procs *p, int i, int s, char *line) {
    if (s == 1) keep_tail(&p->c[i], line);
    p->on_line(p->user, i, s == 1, line);
}

/* Appends n bytes of one line to stream s's partial line, delivering it in
 * pieces of LINE_MAX_BYTES when it grows past that. False when out of
 * memory (the bytes are dropped). */
static bool append_partial(demo_procs *p, int i, int s, const char *data, size_t n) {
    demo_child *c = &p->c[i];
    if (!c->buf[s] && !(c->buf[s] = malloc(LINE_MAX_BYTES + 1))) return false;
    while (n > 0) {
        if (c->len[s] == LINE_MAX_BYTES) {
            c->buf[s][c->len[s]] = '\0';
            c->len[s] = 0;
            deliver(p, i, s, c->buf[s]);
        }
        size_t room = LINE_MAX_BYTES - c->len[s], k = n < room ? n : room;
        memcpy(c->buf[s] + c->len[s], data, k);
        c->len[s] += k;
        data += k;
        n -= k;
    }
    return true;
}

void demo_feed(demo_procs *p, int i, int s, char *data, size_t n) {
    demo_child *c = &p->c[i];
    while (n > 0) {
        char *nl = memchr(data, '\n', n);
        size_t span = nl ? (size_t)(nl - data) : n;
        if (nl && c->len[s] == 0 && span <= LINE_MAX_BYTES) {
            *nl = '\0'; /* a whole line in data: read where it is */
            deliver(p, i, s, data);
        } else {
            if (!append_partial(p, i, s, data, span)) return;
            if (nl) {
                c->buf[s][c->len[s]] = '\0';
                c->len[s] = 0;
                deliver(p, i, s, c->buf[s]);
            }
        }
        span += nl != NULL;
        data += span;
        n -= span;
    }
}

/* Reads what is there on stream s of child i; delivers complete lines; at
 * the end of the stream, the last one and closes it. */
static void read_stream(demo_procs *p, int i, int s) {
    demo_child *c = &p->c[i];
    char chunk[65536];
    ssize_t n = read(c->fd[s], chunk, sizeof chunk);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
    if (n > 0) {
        demo_feed(p, i, s, chunk, (size_t)n);
        return;
    }
    if (c->len[s] > 0) { /* last line without a newline */
        c->buf[s][c->len[s]] = '\0';
        deliver(p, i, s, c->buf[s]);
    }
    close(c->fd[s]);
    c->fd[s] = -1;
    free(c->buf[s]);
    c->buf[s] = NULL;
    c->len[s] = 0;
}

/* Reaps the children that exited: every one when all is set, else those
 * whose output reached its end (a child's exit closes its pipes, so that
 * spares a waitpid per child on every pump). */
static void reap(demo_procs *p, bool all) {
    for (int i = 0; i < DEMO_MAX_CHILDREN; i++) {
        demo_child *c = &p->c[i];
        if (c->pid <= 0 || (!all && (c->fd[0] >= 0 || c->fd[1] >= 0))) continue;
        int st;
        if (waitpid(c->pid, &st, WNOHANG) == c->pid) {
            c->status = st;
            c->pid = -1;
            if (c->in >= 0) close(c->in);
            c->in = -1;
        }
    }
}

bool demo_pump(demo_procs *p, int timeout_ms) {
    struct pollfd pf[DEMO_MAX_CHILDREN * 2];
    int who[DEMO_MAX_CHILDREN * 2], n = 0;
    for (int i = 0; i < DEMO_MAX_CHILDREN; i++)
        for (int s = 0; s < 2; s++)
            if (p->c[i].pid != 0 && p->c[i].fd[s] >= 0) {
                pf[n].fd = p->c[i].fd[s];
                pf[n].events = POLLIN;
                who[n++] = i * 2 + s;
            }
    int r = poll(pf, (nfds_t)n, timeout_ms);
    if (r < 0 && errno != EINTR) return false;
    for (int k = 0; r > 0 && k < n; k++)
        if (pf[k].revents) read_stream(p, who[k] / 2, who[k] % 2);
    /* a quiet poll also reaps a child whose pipes stay open */
    reap(p, r <= 0);
    if (r > 0 && p->batch_ms > 0) { /* let the next lines gather meanwhile */
        struct timespec ts = {0, (long)p->batch_ms * 1000000L};
        nanosleep(&ts, NULL);
    }
    return true;
}

bool demo_exited(const demo_procs *p, int slot) {
    const demo_child *c = &p->c[slot];
    /* exited, and its output read to the end */
    return c->pid == -1 && c->fd[0] < 0 && c->fd[1] < 0;
}

int demo_stop(demo_procs *p, int slot, int sig, int grace_ms) {
    demo_child *c = &p->c[slot];
    if (c->pid > 0) kill(c->pid, sig);
    long long end = now_ms() + grace_ms;
    while (c->pid > 0 && now_ms() < end) demo_pump(p, 20);
    if (c->pid > 0) {
        kill(c->pid, SIGKILL);
        int st = 0;
        while (waitpid(c->pid, &st, 0) < 0 && errno == EINTR) {
        }
        c->status = st;
        c->pid = -1;
    }
    /* drain what the child left in its pipes (bounded: the writer is gone) */
    end = now_ms() + 1000;
    while ((c->fd[0] >= 0 || c->fd[1] >= 0) && now_ms() < end) demo_pump(p, 20);
    if (c->in >= 0) close(c->in);
    c->in = -1;
    for (int s = 0; s < 2; s++) {
        if (c->fd[s] >= 0) close(c->fd[s]);
        c->fd[s] = -1;
        free(c->buf[s]);
        c->buf[s] = NULL;
    }
    return c->status;
}

void demo_stop_all(demo_procs *p) {
    for (int i = 0; i < DEMO_MAX_CHILDREN; i++)
        if (p->c[i].pid > 0) kill(p->c[i].pid, SIGTERM);
    for (int i = 0; i < DEMO_MAX_CHILDREN; i++)
        if (p->c[i].pid != 0) demo_stop(p, i, SIGTERM, 3000);
}
