/*
 * bounce — the pinned ring a network receiver lands device-bound bytes in
 * (see memkind.h). The slots are one cuMemHostAlloc; each has an event
 * recorded after its copy, so refilling a slot waits only for that slot's
 * copy, never for the whole stream: with N slots, up to N - 1 copies run
 * behind the receive of the next slice. Copies go at pinned speed (the
 * reason for the bounce: a device copy from pageable memory is staged by the
 * driver through its own small pinned buffers, synchronously).
 */
#include <stdlib.h>

#include "mem/cuda.h"
#include "mem/memkind.h"
#include "util/util.h"

#define MAX_SLOTS 16

struct mem_bounce {
    int dev;
    size_t slot_bytes;
    int nslots, cur;
    uint8_t *buf;
    void *stream;
    void *ev[MAX_SLOTS];
    bool busy[MAX_SLOTS];
    int err; /* first failure since the last drain */
};

int bounce_open(int device, size_t slot_bytes, int nslots, mem_bounce **out) {
    *out = NULL;
    if (nslots < 2 || nslots > MAX_SLOTS || slot_bytes == 0)
        return ect_set_error(ECT_EINVAL, "bounce ring: 2..%d slots of > 0 bytes", MAX_SLOTS);
    mem_bounce *b = calloc(1, sizeof *b);
    if (!b) return ect_set_error(ECT_ENOMEM, "bounce ring");
    b->dev = device;
    b->slot_bytes = slot_bytes;
    b->nslots = nslots;
    void *buf = NULL;
    int rc = cuda_host_alloc((uint64_t)slot_bytes * (uint64_t)nslots, &buf);
    b->buf = buf;
    if (!rc) rc = cuda_stream_open(device, &b->stream);
    for (int i = 0; !rc && i < nslots; i++) rc = cuda_event_open(device, &b->ev[i]);
    if (rc) {
        bounce_close(b);
        return rc;
    }
    *out = b;
    return 0;
}

void bounce_close(mem_bounce *b) {
    if (!b) return;
    if (b->stream) cuda_stream_close(b->dev, b->stream); /* waits for the copies */
    for (int i = 0; i < b->nslots; i++) cuda_event_close(b->dev, b->ev[i]);
    cuda_host_free(b->buf);
    free(b);
}

int bounce_device(const mem_bounce *b) { return b->dev; }

int bounce_slot(mem_bounce *b, uint8_t **ptr, size_t *cap) {
    int i = b->cur;
    if (b->busy[i]) {
        int rc = cuda_event_wait(b->dev, b->ev[i]);
        b->busy[i] = false;
        if (rc) {
            if (!b->err) b->err = rc;
            return rc;
        }
    }
    *ptr = b->buf + (size_t)i * b->slot_bytes;
    *cap = b->slot_bytes;
    return 0;
}

int bounce_submit(mem_bounce *b, void *dst, size_t n) {
    int i = b->cur;
    int rc = cuda_copy_async(b->dev, b->stream, dst, b->buf + (size_t)i * b->slot_bytes, n);
    if (!rc) rc = cuda_event_record(b->dev, b->ev[i], b->stream);
    if (!rc) b->busy[i] = true;
    b->cur = (i + 1) % b->nslots;
    if (rc && !b->err) b->err = rc;
    return rc;
}

int bounce_drain(mem_bounce *b) {
    int rc = cuda_stream_wait(b->dev, b->stream);
    for (int i = 0; i < b->nslots; i++) b->busy[i] = false;
    if (!rc) rc = b->err;
    b->err = 0;
    return rc;
}
