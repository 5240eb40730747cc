/*
 * memkind — internal helpers on memory kinds for the layers above mem (the
 * public ect_mem_* calls are in ectransfer.h): what a pointer is, pinned
 * staging buffers, and the bounce ring a network target uses to land bytes
 * in device memory (mem/bounce.c). Other layers ask here what memory is and
 * never call the driver themselves.
 */
#ifndef ECT_MEM_MEMKIND_H
#define ECT_MEM_MEMKIND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ectransfer.h"

/* True if ptr is CUDA device memory (*device its ordinal; may be NULL).
 * False whenever the process has no CUDA driver loaded. Any thread. */
bool mem_is_device(const void *ptr, int *device);

/* A pinned host buffer of at least n bytes (*cap its size) for staging a
 * device source; give it back with mem_stage_put. ECT_ENOTSUP without CUDA.
 * Any thread. */
int mem_stage_get(uint64_t n, void **buf, uint64_t *cap);
void mem_stage_put(void *buf, uint64_t cap);

/*
 * Bounce ring: a few pinned slots and a stream on one device. A receiver
 * fills a slot, submits it (an asynchronous host-to-device copy to its
 * destination), fills the next one while that copy runs, and drains before
 * it reports the bytes landed. One user (thread) at a time.
 */
typedef struct mem_bounce mem_bounce;

/* nslots slots of slot_bytes each, pinned, on `device`. */
int bounce_open(int device, size_t slot_bytes, int nslots, mem_bounce **out);
/* Drains, then frees. Accepts NULL. */
void bounce_close(mem_bounce *b);
int bounce_device(const mem_bounce *b);
/* The next slot to fill (waits until its previous copy finished): *ptr and
 * its size *cap. */
int bounce_slot(mem_bounce *b, uint8_t **ptr, size_t *cap);
/* Queues the copy of the slot's first n bytes to device address dst and
 * moves to the next slot. */
int bounce_submit(mem_bounce *b, void *dst, size_t n);
/* Waits for every queued copy. 0, or the first error since the last drain. */
int bounce_drain(mem_bounce *b);

#endif
