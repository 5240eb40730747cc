/*
 * shm_map_cost — what giving a producer a 16-page write window of a memfd
 * costs on this kernel, per window, written each round (docs/BENCHMARKS.md
 * "shm windows without a mapping each"):
 *
 *   fresh    a populated read-write mmap, the copy, an munmap (what the shm
 *            initiator did for a window no drop of its GRANT covered)
 *   parked   the window's own mapping kept PROT_NONE between rounds:
 *            mprotect read-write, the copy, mprotect PROT_NONE
 *   reserved one PROT_NONE mapping of the whole file, the window's pages
 *            mprotect read-write and back (the VMA split and merged)
 *   copy     the copy alone, into a mapping that stays
 *
 * over WINDOWS distinct windows in turn, ROUNDS times; with SIBLING 1 a
 * second thread of the process spins on another CPU, so TLB flushes must
 * reach it (as the bench's other threads make them).
 *
 *   shm_map_cost [WINDOWS [ROUNDS [SIBLING]]]     (default 128 200 0)
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define WPAGES 16

static atomic_int stop;

static void *spin(void *arg) {
    (void)arg;
    while (!atomic_load(&stop)) {
    }
    return NULL;
}

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static long minor_faults(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_minflt;
}

/* Time spent in each of a window's three steps, summed over the run. */
typedef struct steps {
    double open, copy, close;
    long faults;
} steps;

static void report(const char *name, const steps *s, long n) {
    printf("%-9s open %6.2f  copy %6.2f  close %6.2f  total %6.2f us/window  faults/window %.2f\n",
           name, s->open / (double)n, s->copy / (double)n, s->close / (double)n,
           (s->open + s->copy + s->close) / (double)n, (double)s->faults / (double)n);
}

int main(int argc, char **argv) {
    int nwin = argc > 1 ? atoi(argv[1]) : 128, rounds = argc > 2 ? atoi(argv[2]) : 200;
    int sibling = argc > 3 ? atoi(argv[3]) : 0;
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), wlen = WPAGES * pg, flen;
    if (nwin < 1 || rounds < 1) return 2;
    flen = (size_t)nwin * wlen;
    int fd = memfd_create("shm_map_cost", 0);
    char *src = malloc(wlen), **own = calloc((size_t)nwin, sizeof *own);
    if (fd < 0 || !src || !own || ftruncate(fd, (off_t)flen) != 0) return 1;
    memset(src, 7, wlen);
    char *all = mmap(NULL, flen, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (all == MAP_FAILED) return 1;
    memset(all, 1, flen); /* the file's pages exist before any timing */
    pthread_t th;
    if (sibling && pthread_create(&th, NULL, spin, NULL) != 0) return 1;
    long n = (long)nwin * rounds;
    steps fresh = {0}, parked = {0}, reserved = {0}, copy = {0};
    double t;

    fresh.faults = minor_faults();
    for (int r = 0; r < rounds; r++)
        for (int w = 0; w < nwin; w++) {
            t = now_us();
            char *b = mmap(NULL, wlen, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd,
                           (off_t)((size_t)w * wlen));
            if (b == MAP_FAILED) return 1;
            fresh.open += now_us() - t;
            t = now_us();
            memcpy(b, src, wlen);
            fresh.copy += now_us() - t;
            t = now_us();
            munmap(b, wlen);
            fresh.close += now_us() - t;
        }
    fresh.faults = minor_faults() - fresh.faults;

    for (int w = 0; w < nwin; w++) {
        own[w] = mmap(NULL, wlen, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd,
                      (off_t)((size_t)w * wlen));
        if (own[w] == MAP_FAILED || mprotect(own[w], wlen, PROT_NONE) != 0) return 1;
    }
    parked.faults = minor_faults();
    for (int r = 0; r < rounds; r++)
        for (int w = 0; w < nwin; w++) {
            t = now_us();
            if (mprotect(own[w], wlen, PROT_READ | PROT_WRITE) != 0) return 1;
            parked.open += now_us() - t;
            t = now_us();
            memcpy(own[w], src, wlen);
            parked.copy += now_us() - t;
            t = now_us();
            mprotect(own[w], wlen, PROT_NONE);
            parked.close += now_us() - t;
        }
    parked.faults = minor_faults() - parked.faults;
    for (int w = 0; w < nwin; w++) munmap(own[w], wlen);

    char *res = mmap(NULL, flen, PROT_NONE, MAP_SHARED, fd, 0);
    if (res == MAP_FAILED) return 1;
    reserved.faults = minor_faults();
    for (int r = 0; r < rounds; r++)
        for (int w = 0; w < nwin; w++) {
            char *b = res + (size_t)w * wlen;
            t = now_us();
            if (mprotect(b, wlen, PROT_READ | PROT_WRITE) != 0) return 1;
            reserved.open += now_us() - t;
            t = now_us();
            memcpy(b, src, wlen);
            reserved.copy += now_us() - t;
            t = now_us();
            mprotect(b, wlen, PROT_NONE);
            reserved.close += now_us() - t;
        }
    reserved.faults = minor_faults() - reserved.faults;
    munmap(res, flen);

    for (int r = 0; r < rounds; r++)
        for (int w = 0; w < nwin; w++) {
            t = now_us();
            memcpy(all + (size_t)w * wlen, src, wlen);
            copy.copy += now_us() - t;
        }
    atomic_store(&stop, 1);
    if (sibling) pthread_join(th, NULL);
    printf("%d windows of %d pages, %d rounds, sibling thread %d\n", nwin, WPAGES, rounds, sibling);
    report("fresh", &fresh, n);
    report("parked", &parked, n);
    report("reserved", &reserved, n);
    report("copy", &copy, n);
    munmap(all, flen);
    free(own);
    free(src);
    close(fd);
    return 0;
}
