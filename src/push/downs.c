/*
 * downs — the producer's unreachable-consumer backoff (see downs.h). Entries
 * exist only while an address is down; success deletes them, so the table
 * holds at most the consumers that are failing now.
 */
#include "push/downs.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Out of memory inside uthash is reported, not fatal (down_fail checks). */
static _Thread_local int hash_oom;
#define HASH_NONFATAL_OOM 1
#define uthash_nonfatal_oom(obj) (hash_oom = 1)
#include <uthash.h>

#include "ectransfer.h"
#include "util/util.h"

typedef struct down_entry {
    char *addr;
    uint64_t backoff_ms;
    uint64_t until_ms;
    char err[DOWN_ERR_MAX];
    UT_hash_handle hh;
} down_entry;

struct down_table {
    uint64_t initial_ms, max_ms;
    down_entry *map;
};

int down_open(uint64_t initial_ms, uint64_t max_ms, down_table **out) {
    if (out) *out = NULL;
    if (!out) return ect_set_error(ECT_EINVAL, "down_open: out is NULL");
    if (initial_ms < 1 || max_ms < initial_ms)
        return ect_set_error(ECT_EINVAL,
                             "down backoff: initial %" PRIu64 " ms must be >= 1 and <= max %" PRIu64
                             " ms",
                             initial_ms, max_ms);
    down_table *t = calloc(1, sizeof *t);
    if (!t) return ect_set_error(ECT_ENOMEM, "down table: out of memory");
    t->initial_ms = initial_ms;
    t->max_ms = max_ms;
    *out = t;
    return 0;
}

static void entry_free(down_entry *e) {
    free(e->addr);
    free(e);
}

void down_close(down_table *t) {
    if (!t) return;
    down_entry *e, *tmp;
    HASH_ITER(hh, t->map, e, tmp) {
        HASH_DEL(t->map, e);
        entry_free(e);
    }
    free(t);
}

static down_entry *find(const down_table *t, const char *addr) {
    down_entry *e = NULL;
    if (t && addr) HASH_FIND_STR(t->map, addr, e);
    return e;
}

bool down_blocked(const down_table *t, const char *addr, uint64_t now_ms, char *why, size_t cap) {
    const down_entry *e = find(t, addr);
    if (!e || now_ms >= e->until_ms) return false;
    if (why && cap)
        snprintf(why, cap, "consumer %s unreachable: %s (retrying in %" PRIu64 " ms)", addr, e->err,
                 e->until_ms - now_ms);
    return true;
}

uint64_t down_fail(down_table *t, const char *addr, const char *error, uint64_t now_ms) {
    if (!t || !addr) return 0;
    down_entry *e = find(t, addr);
    if (!e) {
        if (!(e = calloc(1, sizeof *e)) || !(e->addr = strdup(addr))) {
            free(e);
            return 0;
        }
        e->backoff_ms = t->initial_ms;
        hash_oom = 0;
        HASH_ADD_KEYPTR(hh, t->map, e->addr, strlen(e->addr), e);
        if (hash_oom) {
            entry_free(e);
            return 0;
        }
    } else {
        e->backoff_ms = e->backoff_ms > t->max_ms / 2 ? t->max_ms : e->backoff_ms * 2;
    }
    e->until_ms = now_ms + e->backoff_ms;
    snprintf(e->err, sizeof e->err, "%s", error && *error ? error : "(no detail)");
    return e->backoff_ms;
}

void down_ok(down_table *t, const char *addr) {
    down_entry *e = find(t, addr);
    if (!e) return;
    HASH_DEL(t->map, e);
    entry_free(e);
}

size_t down_count(const down_table *t) { return t ? HASH_COUNT(t->map) : 0; }
