/* Pull protocol (generation 1), producer side: saves one embedding, which the
 * producer announces on PUB, and serves pulls on ROUTER for SECONDS.
 *
 *   pull_producer SECONDS        (prints "port P hash H checksum C")
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

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: pull_producer SECONDS\n");
        return 2;
    }
    ect_pull_producer_opts o;
    ect_pull_producer_opts_init(&o);
    o.port = 0;              /* ephemeral ROUTER/PUB pair; default 14579 */
    o.pool_size = 64u << 20; /* default: 1 GB */
    ect_pull_producer *p;
    if (ect_pull_producer_open(&o, &p) != 0) {
        fprintf(stderr, "producer: %s\n", ect_last_error());
        return 1;
    }
    const uint64_t shape[2] = {576, 4096}, nbytes = 576 * 4096 * 2;
    unsigned char *emb = malloc(nbytes);
    if (!emb) return 1;
    for (uint64_t i = 0; i < nbytes; i++) emb[i] = (unsigned char)(i * 13 + 5);
    uint64_t sum = fnv1a(emb, nbytes);
    char mm_hash[64];
    snprintf(mm_hash, sizeof mm_hash, "example-%016" PRIx64, sum);
    /* release NULL: copied before save returns, so emb is ours again */
    int rc = ect_pull_producer_save(p, mm_hash, emb, nbytes, shape, 2, "bfloat16", NULL, NULL);
    free(emb);
    if (rc != 0 || ect_pull_producer_flush(p, 10000) != 0) {
        fprintf(stderr, "save: %s\n", ect_last_error());
        ect_pull_producer_close(p);
        return 1;
    }
    printf("port %d hash %s checksum %016" PRIx64 "\n", ect_pull_producer_port(p), mm_hash, sum);
    fflush(stdout);
    nanosleep(&(struct timespec){atoi(argv[1]), 0}, NULL); /* serving on its own threads */
    ect_pull_producer_close(p);
    return 0;
}
