/*
 * thread_rtt — what a hand-off round trip between two threads of
 * execution costs on this machine, without any socket: the floor under a
 * control round trip (docs/BENCHMARKS.md "Where issue 13 stands").
 *
 * One side bumps a counter in shared memory and waits for the other to
 * bump a second one, ROUNDS times, each way:
 *
 *   futex-thread   two threads of one process, each sleeping in
 *                  FUTEX_WAIT until the other's FUTEX_WAKE
 *   futex-process  the same between two processes (a shared anonymous
 *                  mapping and shared futexes), as a producer and a
 *                  consumer on one host would be
 *   spin-thread    two threads that poll the counter and never sleep
 *                  (each holds a CPU the whole time)
 *
 * and prints the p50 and p99 round trip of each in microseconds.
 *
 *   thread_rtt [ROUNDS]     (default 20000, 100..10000000)
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* The two counters, each on its own cache line. */
typedef struct pair {
    _Alignas(64) _Atomic uint32_t ping;
    _Alignas(64) _Atomic uint32_t pong;
} pair;

typedef struct side {
    pair *p;
    long rounds;
    int op_private; /* FUTEX_PRIVATE_FLAG within a process, 0 across */
    int spin;
} side;

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

/* A side that has not answered in this long is gone (the other process
 * died): the run fails rather than waits for ever. */
#define GIVE_UP_US 10e6

/* Waits until *w no longer holds v: 0, or -1 after GIVE_UP_US without a
 * change. */
static int wait_change(const side *s, _Atomic uint32_t *w, uint32_t v) {
    const struct timespec second = {1, 0};
    double start = 0;
    for (unsigned long n = 0; atomic_load(w) == v; n++) {
        if (s->spin && n % 4096) continue;
        if (start == 0)
            start = now_us();
        else if (now_us() - start > GIVE_UP_US)
            return -1;
        if (!s->spin) syscall(SYS_futex, w, FUTEX_WAIT | s->op_private, v, &second, NULL, 0);
    }
    return 0;
}

static void bump(const side *s, _Atomic uint32_t *w) {
    atomic_fetch_add(w, 1);
    if (!s->spin) syscall(SYS_futex, w, FUTEX_WAKE | s->op_private, 1, NULL, NULL, 0);
}

/* The answering side: waits for each ping, answers with a pong. */
static void *answer(void *arg) {
    const side *s = arg;
    for (long i = 0; i < s->rounds; i++) {
        if (wait_change(s, &s->p->ping, (uint32_t)i) != 0) return NULL;
        bump(s, &s->p->pong);
    }
    return NULL;
}

/* The asking side: times each ping until its pong into rt[0..rounds).
 * -1 when the other side stopped answering. */
static int ask(const side *s, double *rt) {
    for (long i = 0; i < s->rounds; i++) {
        double t = now_us();
        bump(s, &s->p->ping);
        if (wait_change(s, &s->p->pong, (uint32_t)i) != 0) return -1;
        rt[i] = now_us() - t;
    }
    return 0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void report(const char *name, double *rt, long n) {
    qsort(rt, (size_t)n, sizeof *rt, cmp_double);
    /* nearest rank, as every bench here (src/cli/latency.c) */
    long i50 = (n * 50 + 99) / 100 - 1, i99 = (n * 99 + 99) / 100 - 1;
    printf("%-14s rtt p50 %8.2f us   p99 %8.2f us   (%ld round trips)\n", name, rt[i50], rt[i99],
           n);
    fflush(stdout);
}

static pair *shared_pair(void) {
    pair *p = mmap(NULL, sizeof *p, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    atomic_store(&p->ping, 0);
    atomic_store(&p->pong, 0);
    return p;
}

/* Each run_* prints its line, or says on stderr why it has none: 0 or -1. */
static int run_threads(const char *name, long rounds, int spin, double *rt) {
    pair *p = shared_pair();
    if (!p) {
        perror("thread_rtt: mmap");
        return -1;
    }
    side s = {p, rounds, FUTEX_PRIVATE_FLAG, spin};
    pthread_t th;
    int rc = pthread_create(&th, NULL, answer, &s);
    if (rc != 0) {
        fprintf(stderr, "thread_rtt: pthread_create: %s\n", strerror(rc));
        munmap(p, sizeof *p);
        return -1;
    }
    rc = ask(&s, rt);
    pthread_join(th, NULL);
    munmap(p, sizeof *p);
    if (rc != 0) {
        fprintf(stderr, "thread_rtt: %s: the other thread stopped answering\n", name);
        return -1;
    }
    report(name, rt, rounds);
    return 0;
}

static int run_processes(long rounds, double *rt) {
    pair *p = shared_pair();
    if (!p) {
        perror("thread_rtt: mmap");
        return -1;
    }
    side s = {p, rounds, 0, 0};
    pid_t pid = fork();
    if (pid < 0) {
        perror("thread_rtt: fork");
        munmap(p, sizeof *p);
        return -1;
    }
    if (pid == 0) {
        answer(&s);
        _exit(0);
    }
    int rc = ask(&s, rt);
    if (rc != 0) kill(pid, SIGKILL);
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    munmap(p, sizeof *p);
    if (rc != 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "thread_rtt: futex-process: the other process stopped answering\n");
        return -1;
    }
    report("futex-process", rt, rounds);
    return 0;
}

int main(int argc, char **argv) {
    long rounds = 20000;
    if (argc > 2 || (argc == 2 && argv[1][0] == '-')) {
        fprintf(stderr, "usage: thread_rtt [ROUNDS]   (default 20000, 100..10000000)\n");
        return 2;
    }
    if (argc == 2) {
        char *end;
        errno = 0;
        rounds = strtol(argv[1], &end, 10);
        if (errno || *end || end == argv[1] || rounds < 100 || rounds > 10000000) {
            fprintf(stderr,
                    "thread_rtt: ROUNDS must be a whole number from 100 to 10000000, not "
                    "'%s'\n",
                    argv[1]);
            return 2;
        }
    }
    double *rt = malloc(sizeof *rt * (size_t)rounds);
    if (!rt) {
        fprintf(stderr, "thread_rtt: out of memory for %ld round trips\n", rounds);
        return 1;
    }
    int rc = 0;
    if (run_threads("futex-thread", rounds, 0, rt) != 0 || run_processes(rounds, rt) != 0 ||
        run_threads("spin-thread", rounds, 1, rt) != 0)
        rc = 1;
    free(rt);
    return rc;
}
