/* Pull protocol (generation 1), consumer side: the scheduler learns what the
 * producer holds without blocking; the consumer pulls one item into its own
 * registered pool and reads it in place.
 *
 *   pull_consumer HOST:PORT MM_HASH
 */
#define _POSIX_C_SOURCE 200809L
#include <ectransfer.h>
#include <inttypes.h>
#include <stdio.h>
#include <time.h>

static uint64_t fnv1a(const void *p, uint64_t n) {
    const unsigned char *b = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint64_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: pull_consumer HOST:PORT MM_HASH\n");
        return 2;
    }
    ect_pull_scheduler_opts so;
    ect_pull_scheduler_opts_init(&so);
    so.producer = argv[1];
    ect_pull_scheduler *s;
    if (ect_pull_scheduler_open(&so, &s) != 0) {
        fprintf(stderr, "scheduler: %s\n", ect_last_error());
        return 1;
    }
    ect_pull_meta meta;
    int have = 0;
    for (int i = 0; i < 1000 && have != 1; i++) { /* up to 10 s */
        have = ect_pull_scheduler_has(s, argv[2], &meta);
        if (have != 1) nanosleep(&(struct timespec){0, 10000000}, NULL);
    }
    ect_pull_consumer_opts co;
    ect_pull_consumer_opts_init(&co);
    co.producer = argv[1];
    co.pool_size = 64u << 20; /* default: 1 GB */
    ect_pull_consumer *c = NULL;
    int rc = 1;
    ect_pull_view v;
    if (have != 1)
        fprintf(stderr, "%s is not available at %s\n", argv[2], argv[1]);
    else if (ect_pull_consumer_open(&co, &c) != 0 ||
             ect_pull_consumer_load(c, argv[2], &meta, &v) != 0)
        fprintf(stderr, "load: %s\n", ect_last_error());
    else {
        printf("%s %" PRIu64 " bytes %s checksum %016" PRIx64 "\n", argv[2], v.nbytes, v.dtype,
               fnv1a(v.data, v.nbytes));
        ect_pull_consumer_release(c, argv[2]); /* stays resident until reclaimed */
        rc = 0;
    }
    ect_pull_consumer_close(c);
    ect_pull_scheduler_close(s);
    return rc;
}
