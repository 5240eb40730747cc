/*
 * inventory — what a pull producer has published, for ECTransferRequest:
 * read from its pool's resident items (mem/resident), which keep each item's
 * shape and dtype string as saved. The pool is the one record of what is
 * resident, so an item reclaimed to make room is gone from the answer at the
 * same moment, with no copy to keep in step.
 */
#include <stdlib.h>
#include <string.h>

#include "mem/pool.h"
#include "pull/pull_internal.h"
#include "util/util.h"

typedef struct snap {
    wire_pull_item *items;
    size_t n, cap;
    int rc;
} snap;

static void add_one(void *ctx, const char *mm_hash, const ect_resident_info *info) {
    snap *s = ctx;
    if (s->rc) return;
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        wire_pull_item *n = realloc(s->items, cap * sizeof *n);
        if (!n) {
            s->rc = ECT_ENOMEM;
            return;
        }
        s->items = n;
        s->cap = cap;
    }
    wire_pull_item *it = &s->items[s->n];
    memset(it, 0, sizeof *it);
    if (!(it->mm_hash = strdup(mm_hash))) {
        s->rc = ECT_ENOMEM;
        return;
    }
    it->ndim = info->ndim;
    for (uint32_t d = 0; d < info->ndim && d < WIRE_MAX_NDIM; d++) it->shape[d] = info->shape[d];
    memcpy(it->dtype, info->dtype,
           sizeof it->dtype < sizeof info->dtype ? sizeof it->dtype : sizeof info->dtype);
    it->dtype[sizeof it->dtype - 1] = '\0';
    it->num_bytes = info->nbytes;
    s->n++;
}

int pull_inv_snapshot(ect_pool *pool, char *const *filter, size_t n_filter, wire_pull_item **items,
                      size_t *n) {
    snap s = {0};
    pool_each_resident(pool, filter, n_filter, add_one, &s);
    if (s.rc) {
        pull_inv_items_free(s.items, s.n);
        *items = NULL;
        *n = 0;
        return ect_set_error(ECT_ENOMEM, "pull inventory: out of memory");
    }
    *items = s.items;
    *n = s.n;
    return 0;
}

void pull_inv_items_free(wire_pull_item *items, size_t n) {
    for (size_t i = 0; i < n; i++) free(items[i].mm_hash);
    free(items);
}
