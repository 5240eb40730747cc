/* Push protocol, consumer side: one consumer shard (TP 1) and the instance's
 * scheduler, as an inference engine embeds them. Accepts any transfer every
 * shard reported (a real engine calls ect_push_scheduler_expect for the
 * transfer ids its requests name), reads each item zero-copy, prints its
 * FNV-1a checksum and releases it to the resident cache.
 *
 *   push_consumer PORT COUNT      (then run push_producer 127.0.0.1:PORT)
 */
#define _POSIX_C_SOURCE 200809L
#include <ectransfer.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static uint64_t fnv1a(const void *p, uint64_t n) {
    const unsigned char *b = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint64_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static void nap(void) { nanosleep(&(struct timespec){0, 1000000}, NULL); }

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: push_consumer PORT COUNT\n");
        return 2;
    }
    ect_push_consumer_opts co;
    ect_push_consumer_opts_init(&co);
    co.ec_port = atoi(argv[1]);
    co.pool_size = 64u << 20; /* default: 1 GB */
    ect_push_consumer *shard;
    if (ect_push_consumer_open(&co, &shard) != 0) {
        fprintf(stderr, "consumer: %s\n", ect_last_error());
        return 1;
    }
    ect_push_scheduler_opts so;
    ect_push_scheduler_opts_init(&so);
    so.consumer_port = co.ec_port;
    so.accept_any = 1;
    ect_push_scheduler *sched;
    if (ect_push_scheduler_open(&so, &sched) != 0) {
        fprintf(stderr, "scheduler: %s\n", ect_last_error());
        ect_push_consumer_close(shard);
        return 1;
    }
    int want = atoi(argv[2]), got = 0, rc = 1, ready = 0;
    for (int ms = 0; ms < 30000 && got < want; ms++) {
        ect_push_scheduler_poll(sched);
        ect_push_scheduler_stat st;
        ect_push_scheduler_stats(sched, &st);
        if (st.shards && !ready) { /* discovery done: events reach us */
            printf("ready\n");
            fflush(stdout);
            ready = 1;
        }
        ect_push_sched_item it;
        while (ect_push_scheduler_next(sched, &it) == 0) { /* arrived on every shard */
            ect_push_view v;
            if (ect_push_consumer_take(shard, it.transfer_id, &v) != 0) {
                ect_push_scheduler_fail(sched, it.transfer_id, ect_last_error());
                continue;
            }
            printf("%s %" PRIu64 " bytes checksum %016" PRIx64 "\n", v.transfer_id, v.nbytes,
                   fnv1a(v.data, v.nbytes));
            fflush(stdout);
            ect_push_consumer_release(shard, &v); /* bytes stay resident for dedup */
            ect_push_scheduler_loaded(sched, it.transfer_id);
            ect_push_scheduler_cancel(sched, it.transfer_id); /* finished: shards forget it */
            got++;
        }
        nap();
    }
    if (got == want) rc = 0;
    ect_push_scheduler_close(sched);
    ect_push_consumer_close(shard);
    return rc;
}
