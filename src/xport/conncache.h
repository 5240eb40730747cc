/*
 * conncache — the initiator's connections, cached per peer session; one
 * cache serves every back end that keeps connections (tcp, shm). A batch
 * takes its connections out (xp_cache_take) and gives them back when the
 * peer acknowledged everything (xp_cache_give); a connection that failed is
 * closed instead, so the next batch connects anew. Taking checks that an
 * idle connection is still alive: a target that went away reads EOF, and
 * anything readable at all on an idle connection is out of protocol, except
 * what the back end's alive op reads (shm OFFERs).
 *
 * Thread-safe: one mutex guards the peer table and the idle lists, held for
 * list updates only, never across I/O (connecting is the caller's, outside).
 */
#ifndef ECT_XPORT_CONNCACHE_H
#define ECT_XPORT_CONNCACHE_H

#include <pthread.h>
#include <stdbool.h>

#include <uthash.h>

/* A cached connection: its socket and the back end's state for it (or NULL). */
typedef struct xp_conn {
    int fd;
    void *ctx;
} xp_conn;

/* What a back end tells the cache. */
typedef struct xp_conn_ops {
    /* Parses a session string into the back end's peer address (*addr,
     * malloc'd, freed with free() when the cache ends); ECT_EINVAL naming
     * the session when it is not one of this back end's. */
    int (*parse)(const char *session, void **addr);
    /* Closes a connection the cache drops (dead, or the idle list full). */
    void (*close)(xp_conn c);
    /* Optional: true when an idle connection is alive, having read what a
     * target may send between batches (shm OFFERs); NULL: xp_fd_quiet. */
    bool (*alive)(xp_conn c);
} xp_conn_ops;

/* One peer session: its parsed address and its idle connections. Peers live
 * as long as the cache. */
typedef struct xp_peer {
    char session[300];
    void *addr; /* from ops->parse; read-only after creation */
    xp_conn *idle;
    int nidle; /* guarded by the cache's mutex */
    UT_hash_handle hh;
} xp_peer;

typedef struct xp_conncache {
    const xp_conn_ops *ops;
    int max_idle; /* idle connections kept per peer */
    pthread_mutex_t mu;
    xp_peer *peers;
} xp_conncache;

/* A cache keeping at most max_idle (>= 1) idle connections per peer. */
void xp_cache_init(xp_conncache *c, const xp_conn_ops *ops, int max_idle);
/* Closes every idle connection and frees the peers. */
void xp_cache_fini(xp_conncache *c);
/* The peer of `session`, created (and its session parsed) on first use. 0,
 * ECT_EINVAL (a session too long or that ops->parse refuses), ECT_ENOMEM. */
int xp_cache_peer(xp_conncache *c, const char *session, xp_peer **out);
/* An idle connection of p that is still alive (dead ones are closed on the
 * way): true and *out filled, or false when the caller must connect. */
bool xp_cache_take(xp_conncache *c, xp_peer *p, xp_conn *out);
/* Puts a connection that served a batch cleanly back on p's idle list, or
 * closes it when the list is full. */
void xp_cache_give(xp_conncache *c, xp_peer *p, xp_conn conn);

/* True while nothing is readable on fd and the peer has not closed it: the
 * state of a connection between batches. Never blocks. */
bool xp_fd_quiet(int fd);

#endif
