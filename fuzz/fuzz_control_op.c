/*
 * fuzz_control_op — the control server's request handler (ctl_server_handle)
 * fed directly, no sockets. The input is split at '\n' into frames that one
 * detached shard handles in order (so sequences like reserve -> complete ->
 * cancel are reachable), the clock advancing 700 ms per frame with a reap
 * every few frames. Every frame must get a reply that is a JSON object with
 * a boolean "ok"; the table's invariants must hold after every frame; the
 * fake pool aborts on a double or unknown free, and once the shard is closed
 * every byte must be back.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "push/control_server.h"

#define SLOTS 64
#define CAP (1u << 20)

static struct {
    uint64_t off[SLOTS], size[SLOTS];
    bool live[SLOTS];
    uint64_t used;
} P;

static void check(bool ok) {
    if (!ok) abort(); /* not a trap: UCX catches SIGILL */
}

static int p_alloc(void *ctx, uint64_t nbytes, uint64_t *off) {
    (void)ctx;
    if (nbytes > CAP - P.used) return ECT_EFULL;
    for (int i = 0; i < SLOTS; i++)
        if (!P.live[i]) {
            P.live[i] = true;
            P.size[i] = nbytes;
            P.off[i] = (uint64_t)i * CAP; /* distinct, never overlapping */
            P.used += nbytes;
            *off = P.off[i];
            return 0;
        }
    return ECT_EFULL;
}

static void p_free(void *ctx, uint64_t off, uint64_t nbytes) {
    (void)ctx;
    check(off % CAP == 0 && off / CAP < SLOTS);
    int i = (int)(off / CAP);
    check(P.live[i] && P.size[i] == nbytes);
    P.live[i] = false;
    P.used -= nbytes;
}

static bool p_quiet(void *ctx, uint64_t off, uint64_t nbytes) {
    (void)ctx;
    (void)off;
    (void)nbytes;
    return false;
}

static const rsv_mem_ops ops = {p_alloc, p_free, p_quiet};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    memset(&P, 0, sizeof P);
    ctl_server_opts o;
    ctl_server_opts_init(&o);
    o.detached = true;
    o.port = 14579;
    o.tp_size = 2;
    o.base_port = 14579;
    o.rsv.mem = &ops;
    o.rsv.ttl_ms = 3000;
    o.rsv.pending_grace_ms = 2000;
    o.rsv.max_tombstones = 8;
    o.rsv.max_events = 8;
    o.dst_session = "127.0.0.1:9999";
    o.transport = "tcp";
    o.dst_key = "0123456789abcdef";
    o.pool_base = 1u << 30;
    ctl_server *s = NULL;
    check(ctl_server_open(NULL, &o, &s) == 0);
    uint64_t now = 1000;
    size_t start = 0, frames = 0;
    while (start <= size && frames < 64) {
        const uint8_t *nl = memchr(data + start, '\n', size - start);
        size_t end = nl ? (size_t)(nl - data) : size;
        char *reply = NULL;
        check(ctl_server_handle(s, data + start, end - start, now, &reply) == 0);
        json_error_t err;
        json_t *v = json_loads(reply, 0, &err);
        check(v && json_is_object(v) && json_is_boolean(json_object_get(v, "ok")));
        json_decref(v);
        free(reply);
        check(ctl_server_check(s) == 0);
        now += 700;
        if (++frames % 3 == 0) ctl_server_reap(s, now);
        if (!nl) break;
        start = end + 1;
    }
    ctl_server_close(s);
    check(P.used == 0);
    return 0;
}
