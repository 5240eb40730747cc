/* Push protocol, producer side (the encoder): pushes one LLaVA-size embedding
 * (576 x 4096 bfloat16, 4.5 MiB) into a consumer instance and waits for the
 * outcome. The bytes are copied into the producer's staging pool during
 * reserve, so the buffer could be reused at once.
 *
 *   push_producer HOST:PORT      (the consumer's TP rank 0 control address)
 */
#include <ectransfer.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

static uint64_t fnv1a(const void *p, uint64_t n) {
    const unsigned char *b = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint64_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: push_producer HOST:PORT\n");
        return 2;
    }
    const uint64_t shape[2] = {576, 4096};
    const uint64_t nbytes = 576 * 4096 * 2;
    unsigned char *emb = malloc(nbytes);
    if (!emb) return 1;
    for (uint64_t i = 0; i < nbytes; i++) emb[i] = (unsigned char)(i * 31 + 7);
    char mm_hash[64];
    snprintf(mm_hash, sizeof mm_hash, "example-%016" PRIx64, fnv1a(emb, nbytes));

    ect_push_producer_opts o;
    ect_push_producer_opts_init(&o);
    o.staging_size = 16u << 20; /* default: 256 MiB */
    ect_push_producer *p;
    if (ect_push_producer_open(&o, &p) != 0) {
        fprintf(stderr, "producer: %s\n", ect_last_error());
        free(emb);
        return 1;
    }
    ect_push_item it = {.transfer_id = "example-req-1",
                        .consumer = argv[1],
                        .mm_hash = mm_hash,
                        .shape = shape,
                        .ndim = 2,
                        .dtype = "bfloat16",
                        .nbytes = nbytes,
                        .data = emb}; /* release NULL: copied now */
    int rc = 1;
    if (ect_push_producer_reserve(p, &it) != 0) {
        fprintf(stderr, "reserve: %s\n", ect_last_error());
    } else {
        ect_push_producer_flush(p); /* end of the step: one batch per shard */
        ect_push_result r;
        if (ect_push_producer_poll(p, &r, 1, 60000) == 1) {
            printf("%s %s checksum %016" PRIx64 " in %.2f ms%s%s\n", r.transfer_id,
                   r.status == 0 ? "done" : "failed", fnv1a(emb, nbytes), r.latency_ns / 1e6,
                   r.status ? ": " : "", r.error);
            rc = r.status == 0 ? 0 : 1;
        } else {
            fprintf(stderr, "no outcome within 60 s\n");
        }
    }
    ect_push_producer_close(p);
    free(emb);
    return rc;
}
