/*
 * push_items — the C side of scripts/bench-python.py: pushes items of one
 * shape and dtype into a consumer instance through one ect_push_producer
 * (opened from a JSON configuration, as the Python binding does), in steps of
 * STEP items (one flush each), each item's bytes copied into the staging pool
 * during the reserve (what PushProducer.push does), from STEP distinct
 * buffers made before any clock starts. The producer lives for the whole
 * process, like the Python one in the bench: each line "COUNT PREFIX" read
 * from stdin is one round, an untimed warm-up step and then COUNT items
 * timed from the first reserve to the last result, answered with one JSON
 * line: items, bytes, seconds, failed. EOF ends it.
 *
 *   push_items HOST:PORT STEP NBYTES DTYPE SHAPE(AxB...) [CONFIG_JSON]
 */
#define _POSIX_C_SOURCE 200809L
#include <ectransfer.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

typedef struct bench {
    ect_push_producer *p;
    const char *to, *dtype;
    uint64_t shape[ECT_POOL_MAX_NDIM];
    size_t ndim;
    uint64_t nbytes;
    long step;
    unsigned char **bufs;
    ect_push_result res[256];
    long done, failed;
} bench;

static void collect(bench *b, int timeout_ms) {
    size_t n = ect_push_producer_poll(b->p, b->res, 256, timeout_ms);
    for (size_t k = 0; k < n; k++) {
        if (b->res[k].status != 0 && b->failed++ == 0)
            fprintf(stderr, "push_items: %s: %s\n", b->res[k].transfer_id, b->res[k].error);
        b->done++;
    }
}

/* One round: a warm-up step, then count items timed. Returns seconds, < 0 on error. */
static double round_(bench *b, long count, const char *prefix) {
    double t0 = 0;
    b->done = b->failed = 0;
    for (long i = -b->step; i < count; i++) { /* i < 0: the warm-up step */
        if (i == 0) {
            while (b->done < b->step) collect(b, 100);
            b->done = 0;
            t0 = now_s();
        }
        char tid[200], hash[200];
        snprintf(tid, sizeof tid, "%s-%ld", prefix, i);
        snprintf(hash, sizeof hash, "%s-h%ld", prefix, i);
        ect_push_item it = {.transfer_id = tid,
                            .consumer = b->to,
                            .mm_hash = hash,
                            .shape = b->shape,
                            .ndim = b->ndim,
                            .dtype = b->dtype,
                            .nbytes = b->nbytes,
                            .data = b->bufs[(i + b->step) % b->step]};
        int rc;
        while ((rc = ect_push_producer_reserve(b->p, &it)) == ECT_EFULL) {
            /* staging full: the step so far goes out, then room comes back */
            ect_push_producer_flush(b->p);
            collect(b, 100);
        }
        if (rc != 0) {
            fprintf(stderr, "push_items: %s\n", ect_last_error());
            return -1;
        }
        if ((i + b->step + 1) % b->step == 0 || i + 1 == count) ect_push_producer_flush(b->p);
        collect(b, 0); /* what finished, without waiting, so results never pile up */
    }
    while (b->done < count) collect(b, 100);
    return now_s() - t0;
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: push_items HOST:PORT STEP NBYTES DTYPE SHAPE [CONFIG_JSON]\n");
        return 2;
    }
    static bench b;
    b.to = argv[1];
    b.step = atol(argv[2]);
    b.nbytes = strtoull(argv[3], NULL, 10);
    b.dtype = argv[4];
    for (char *s = argv[5], *end; *s && b.ndim < ECT_POOL_MAX_NDIM; s = *end ? end + 1 : end) {
        b.shape[b.ndim++] = strtoull(s, &end, 10);
        if (end == s) return 2;
    }
    if (b.step < 1 || b.nbytes == 0) return 2;
    if (ect_push_producer_open_config(argc > 6 ? argv[6] : "{}", &b.p) != 0) {
        fprintf(stderr, "push_items: %s\n", ect_last_error());
        return 1;
    }
    b.bufs = calloc((size_t)b.step, sizeof *b.bufs);
    for (long i = 0; b.bufs && i < b.step; i++) {
        b.bufs[i] = malloc(b.nbytes);
        if (!b.bufs[i]) return 1;
        uint64_t x = 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1);
        for (uint64_t k = 0; k + 8 <= b.nbytes; k += 8) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            memcpy(b.bufs[i] + k, &x, 8);
        }
    }
    char line[256], prefix[160];
    long count;
    int rc = 0;
    while (fgets(line, sizeof line, stdin)) {
        if (sscanf(line, "%ld %159s", &count, prefix) != 2 || count < 1) {
            rc = 2;
            break;
        }
        double secs = round_(&b, count, prefix);
        if (secs < 0) {
            rc = 1;
            break;
        }
        printf("{\"items\": %ld, \"bytes\": %" PRIu64 ", \"seconds\": %.6f, \"failed\": %ld}\n",
               count, b.nbytes * (uint64_t)count, secs, b.failed);
        fflush(stdout);
    }
    ect_push_producer_close(b.p);
    for (long i = 0; b.bufs && i < b.step; i++) free(b.bufs[i]);
    free(b.bufs);
    return rc;
}
