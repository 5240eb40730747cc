/*
 * push_items — the C side of scripts/bench-python.py: pushes COUNT items of one
 * shape and dtype into a consumer instance through ect_push_producer (opened
 * from a JSON configuration, as the Python binding does), in steps of STEP
 * items (one flush each), each item's bytes copied into the staging pool
 * during the reserve (what PushProducer.push does), from STEP distinct
 * buffers made before the clock starts. One untimed warm-up step first (the
 * consumer's shards discovered, data-plane connections made, staging pages
 * touched), as the Python side does. Prints one JSON line: items, bytes,
 * seconds (first timed reserve to last result), failed.
 *
 *   push_items HOST:PORT COUNT STEP NBYTES DTYPE SHAPE(AxB...) PREFIX [CONFIG_JSON]
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

int main(int argc, char **argv) {
    if (argc < 8) {
        fprintf(stderr, "usage: push_items HOST:PORT COUNT STEP NBYTES DTYPE SHAPE PREFIX "
                        "[CONFIG_JSON]\n");
        return 2;
    }
    const char *to = argv[1], *dtype = argv[5], *prefix = argv[7];
    long count = atol(argv[2]), step = atol(argv[3]);
    uint64_t nbytes = strtoull(argv[4], NULL, 10);
    uint64_t shape[ECT_POOL_MAX_NDIM];
    size_t ndim = 0;
    for (char *s = argv[6], *end; *s && ndim < ECT_POOL_MAX_NDIM; s = *end ? end + 1 : end) {
        shape[ndim++] = strtoull(s, &end, 10);
        if (end == s) return 2;
    }
    if (count < 1 || step < 1 || nbytes == 0) return 2;
    const char *config = argc > 8 ? argv[8] : "{}";
    ect_push_producer *p;
    if (ect_push_producer_open_config(config, &p) != 0) {
        fprintf(stderr, "push_items: %s\n", ect_last_error());
        return 1;
    }
    unsigned char **bufs = calloc((size_t)step, sizeof *bufs);
    for (long i = 0; i < step; i++) {
        bufs[i] = malloc(nbytes);
        if (!bufs[i]) return 1;
        uint64_t x = 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1);
        for (uint64_t k = 0; k + 8 <= nbytes; k += 8) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            memcpy(bufs[i] + k, &x, 8);
        }
    }
    ect_push_result *res = calloc(256, sizeof *res);
    long done = 0, failed = 0;
    double t0 = 0;
    for (long i = -step; i < count; i++) { /* i < 0: the warm-up step */
        if (i == 0) {
            while (done < step) {
                size_t n = ect_push_producer_poll(p, res, 256, 100);
                for (size_t k = 0; k < n; k++) failed += res[k].status != 0, done++;
            }
            done = 0;
            t0 = now_s();
        }
        char tid[128], hash[128];
        snprintf(tid, sizeof tid, "%s-%ld", prefix, i);
        snprintf(hash, sizeof hash, "%s-h%ld", prefix, i);
        ect_push_item it = {.transfer_id = tid, .consumer = to, .mm_hash = hash,
                            .shape = shape, .ndim = ndim, .dtype = dtype, .nbytes = nbytes,
                            .data = bufs[(i + step) % step]};
        int rc;
        while ((rc = ect_push_producer_reserve(p, &it)) == ECT_EFULL) {
            /* staging full: the step so far goes out, then room comes back */
            ect_push_producer_flush(p);
            size_t n = ect_push_producer_poll(p, res, 256, 100);
            for (size_t k = 0; k < n; k++) failed += res[k].status != 0, done++;
        }
        if (rc != 0) {
            fprintf(stderr, "push_items: %s\n", ect_last_error());
            return 1;
        }
        if ((i + step + 1) % step == 0 || i + 1 == count) ect_push_producer_flush(p);
        /* collect what finished, without waiting, so results never pile up */
        size_t n = ect_push_producer_poll(p, res, 256, 0);
        for (size_t k = 0; k < n; k++) failed += res[k].status != 0, done++;
    }
    while (done < count) {
        size_t n = ect_push_producer_poll(p, res, 256, 100);
        for (size_t k = 0; k < n; k++) {
            if (res[k].status != 0 && failed++ == 0)
                fprintf(stderr, "push_items: %s: %s\n", res[k].transfer_id, res[k].error);
            done++;
        }
    }
    double secs = now_s() - t0;
    printf("{\"items\": %ld, \"bytes\": %" PRIu64 ", \"seconds\": %.6f, \"failed\": %ld}\n", count,
           nbytes * (uint64_t)count, secs, failed);
    ect_push_producer_close(p);
    for (long i = 0; i < step; i++) free(bufs[i]);
    free(bufs);
    free(res);
    return failed ? 1 : 0;
}
