/*
 * xport — internal interface of the data plane. ect_xport (xport.c) owns the
 * options, the session string and the table of registered regions; each back
 * end (tcp.c, shm.c, ucx.c) is one const table of function pointers that
 * xport.c picks by name. The region table is the one place where a target
 * decides whether a write may land: key, range and liveness are checked
 * there, and a region being written holds a reference that unregister waits
 * for.
 */
#ifndef ECT_XPORT_H
#define ECT_XPORT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include <uthash.h>

#include "ect_config.h"
#include "ectransfer.h"
#include "util/spares.h"

struct xp_win_ref {
    uint64_t addr, end;  /* [addr, end) in the target's address space */
    struct xp_region *w; /* the window */
};

typedef struct xp_region {
    uint64_t token;  /* tcp/shm key: random 64-bit token, hash key */
    uint64_t id;     /* unique per target, never reused */
    uint8_t *addr;   /* first byte in the target's address space */
    uint64_t len;    /* bytes */
    int fd;          /* our duplicate of the backing fd, or -1 */
    uint64_t fd_off; /* offset of addr's byte in fd */
    int refs;        /* writes in progress (receive or copy); guarded by regs.mu */
    char *keystr;    /* the key string handed out: keybuf, or malloc'd by a back end */
    char keybuf[17]; /* the token's 16 hex digits (tcp, shm) */
    void *be;        /* back end's per-region data (ucx memory handle) */
    int kind;        /* ECT_MEM_HOST, _PINNED or _CUDA (as mem reported it) */
    int device;      /* CUDA device ordinal of a _CUDA region */
    /* shm, _CUDA regions: the IPC handle of the allocation and the region's
     * offset in it (filled by the back end's reg) */
    uint8_t ipc[64];
    uint64_t ipc_off;
    /* A window (xp_window_open): a sub-range of a registered region with its
     * own token, the one key a peer may write one reservation with. */
    struct xp_region *parent; /* the region it lies in; NULL for a region */
    bool priv;                /* region: refuses its own token (only windows write) */
    bool dead;                /* window closed while written: freed by the last release */
    struct xp_region *next_dead;
    /* A region: its open windows sorted by address (none overlap), each
     * with its range inline (a search reads one array, not each window), so
     * a window's overlap check is a binary search, not a walk of the table. */
    struct xp_win_ref *wins;
    size_t nwins, capwins;
    UT_hash_handle hh; /* by token */
} xp_region;

/* Closed windows' entries kept for reuse (xp_regions.spare_wins). */
#define XP_SPARE_WINDOWS 1024
/* Ids of regions gone kept for the shm target's drops (xp_regions.gone). */
#define XP_GONE_LOG 4096

typedef struct xp_regions {
    pthread_mutex_t mu; /* guards the table and refs; never held across I/O */
    pthread_cond_t cv;  /* signalled when a region's refs drop to 0 */
    xp_region *by_token;
    uint64_t next_id;
    struct ect_xport *owner; /* frees dead windows (NULL: standalone table, fuzzers) */
    xp_region *dead;         /* closed windows still referenced */
    uint64_t refused;        /* writes refused (wrong key, range, dead window) */
    uint64_t refused_logged; /* refused as of the last log line */
    uint64_t refused_log_ms; /* when that line went out */
    /* Closed windows' entries kept for the next opens (a window per item
     * then costs no calloc): at most XP_SPARE_WINDOWS, and never more than
     * were open at once. windows_allocated counts the entries calloc'd. */
    ect_spares spare_wins; /* linked through next_dead */
    uint64_t windows_allocated;
    /* The ids of the last XP_GONE_LOG regions and windows taken out of
     * by_token, the k-th (from 0) at gone[k % XP_GONE_LOG]; gone_seq counts
     * them. A reader that kept its place asks only what went since (the shm
     * target's drops: per GRANT or OFFER, the windows closed since, not a
     * walk of every region open); one that fell further behind walks. */
    uint64_t gone[XP_GONE_LOG];
    uint64_t gone_seq;
} xp_regions;

typedef struct xp_backend xp_backend;

struct ect_xport {
    const xp_backend *be;
    ect_xport_opts opts;
    char listen[256];  /* copy of opts.listen */
    char session[300]; /* what peers write to */
    xp_regions regs;
    void *impl; /* back end's state */
    /* Data-plane keys, or NULL: off: a reference on the set ect_xport_open
     * loaded from opts.curve_keys, or on the role's own (xp_open_keyed).
     * With keys every connection runs the handshake of auth.h after its
     * hello. */
    struct ect_keyset *keys;
    _Atomic uint64_t auth_refused; /* connections refused by the handshake */
    /* shm initiator: the id its connections send after a HELLO asking for
     * offers (xp_set_offer_id); 0: they do not ask. */
    uint64_t offer_id;
};

/*
 * A back end. Every function returns 0 or a negative ECT_E* code with the
 * detail set through ect_set_error. None is called with regs.mu held.
 */
struct xp_backend {
    const char *name;           /* "tcp", "shm", "ucx" */
    const char *session_prefix; /* what every session of this kind starts with ("" for tcp) */
    bool device_regions;        /* can be the target of writes into CUDA regions */
    bool device_sources;        /* writes device sources itself; else xport.c stages them
                                   into pinned host memory before calling write_batch */
    /* Starts the target (listening socket, threads) and fills x->session.
     * Blocks only for socket setup. On failure leaves nothing behind. */
    int (*open)(ect_xport *x);
    /* Stops the target threads and drops every cached peer connection and
     * mapping. Called once, after which no other function is called. */
    void (*close)(ect_xport *x);
    /* Optional: frees what close kept for unreg (ucx context); called after
     * every region is gone. */
    void (*destroy)(ect_xport *x);
    /* Optional: back-end work for a new region (ucx: map + pack the rkey),
     * may replace r->keystr (xp_region_key_replace). Called before the region
     * is visible to peers. */
    int (*reg)(ect_xport *x, xp_region *r);
    /* Optional: undo reg; called after the last reference is gone. */
    void (*unreg)(ect_xport *x, xp_region *r);
    /* Writes a validated batch (n >= 1, each write has src, dst_key and a
     * session of this kind). Blocks until acknowledged, failed or timed out;
     * safe from any number of threads at once. Fills st[0..n). */
    int (*write_batch)(ect_xport *x, const char *session, const ect_write *w, size_t n, int *st);
    /* Optional: offers windows to the initiator named by id (xp_window_offer). */
    int (*offer)(ect_xport *x, uint64_t id, const char *const *keys, size_t n);
    /* Optional: write_batch's writes that need no answer from the peer
     * (xp_write_ready); never waits. */
    int (*write_ready)(ect_xport *x, const char *session, const ect_write *w, size_t n, int *st);
};

extern const xp_backend xp_tcp_backend;
extern const xp_backend xp_shm_backend;
#if ECT_HAVE_UCX
extern const xp_backend xp_ucx_backend;
#endif

/* ---- opening with a loaded key set (xport.c) */
struct ect_keyset;
/* ect_xport_open with keys, the key set its caller already loaded (a role's
 * CurveZMQ sockets use the same set), instead of reading opts->curve_keys
 * (ignored) again: the transport takes a reference on keys (ect_keys_ref,
 * dropped at close or on failure), so both sides hold the same keys however
 * the directory changes. keys NULL: keys off. */
int xp_open_keyed(const char *kind, const ect_xport_opts *opts, struct ect_keyset *keys,
                  ect_xport **out);

/* ---- region table (xport.c) */
/* Finds the region with this token and takes a reference if [addr, addr+len)
 * lies inside it. Returns 0, ECT_EACCES (the address is in a region but the
 * token is wrong), ECT_ERANGE (right token, range outside the region) or
 * ECT_ENOTFOUND (no such region); sets the error detail. Thread-safe. */
int xp_region_acquire(xp_regions *t, uint64_t token, uint64_t addr, uint64_t len, xp_region **out);
void xp_region_release(xp_regions *t, xp_region *r);
/* True while a write into the region that starts at addr is being received
 * (the region holds a reference: tcp receives, the shm slow path's copies);
 * false when no such region is registered. The shm fast path and ucx puts
 * take no reference, so they are invisible here. Thread-safe; takes
 * regs.mu for the lookup only. */
bool xp_region_busy(ect_xport *x, const void *addr);
/* True while a write into some region or window overlapping
 * [addr, addr + len) holds a reference (closed windows included until their
 * last write ends). Thread-safe. */
bool xp_range_busy(ect_xport *x, const void *addr, uint64_t len);

/* ---- windows: one reservation's write key (docs/PROTOCOL.md "Write
 * windows"). A window is [offset, offset + len) of the registered region
 * whose key is region_key, with a fresh random 64-bit token (getrandom) of
 * its own; a peer's write is accepted with that token only inside the
 * window and only until xp_window_close. Windows of one region never
 * overlap. Over shm the window is its own region to the peer (its own slot,
 * and a grant that maps only its pages). Over ucx the window has its own
 * ucp_mem_map of exactly its bytes and its own packed rkey (the key string
 * is the ucx key of the window: its address, length and rkey), unmapped at
 * close; what the target can enforce there depends on the UCX transport
 * (docs/PROTOCOL.md "Write windows"). ECT_ENOTFOUND (no such region),
 * ECT_ERANGE, ECT_EEXIST (overlaps a live window), ECT_EFULL (shm: no free
 * slot), ECT_ENOMEM, or the ucx registration's error. key gets the window's
 * key string (16 hex digits for tcp/shm). Thread-safe; never blocks on
 * I/O. */
int xp_window_open(ect_xport *x, const char *region_key, uint64_t offset, uint64_t len,
                   char key[ECT_XPORT_KEY_MAX]);
/* Offers (shm; docs/PROTOCOL.md "shm", "Offers") the open windows
 * keys[0..n) (at most SHM_CHUNK, 250, are taken) to the one live connection
 * whose initiator sent id: their mapping details are queued on its socket
 * before this returns, so the initiator's write into them takes the fast
 * path, no BEGIN. Never blocks; 0, or an error (no such connection, it is
 * busy: ECT_EBUSY, its socket full, another transport: ECT_ENOTSUP) that
 * only means the initiator will ask with a BEGIN as before. Thread-safe. */
int xp_window_offer(ect_xport *x, uint64_t id, const char *const *keys, size_t n);
/* Writes, of w[0..n) (host sources), those that need no answer from the
 * peer and no new connection: shm writes into windows a cached connection
 * already maps (an offer, an earlier grant), a memcpy each. Never waits on
 * the peer. st[i]: 0 written, a negative ECT_E* code failed, 1 not written
 * (write it with ect_xport_write_batch). Transports without such writes
 * set every st[i] to 1. Returns how many were settled (st[i] <= 0).
 * Thread-safe. */
size_t xp_write_ready(ect_xport *x, const char *session, const ect_write *w, size_t n, int *st);
/* Makes x's shm connections made from now on ask for offers and name
 * themselves `id` (non-zero; 0 stops asking). Call before x's first write. */
void xp_set_offer_id(ect_xport *x, uint64_t id);
/* Closes a window: from now on every write naming its token is refused
 * (ECT_ENOTFOUND, counted). Never waits: a write already accepted finishes
 * landing and the window's memory is released after it (xp_range_busy says
 * when). ECT_ENOTFOUND for an unknown key. Thread-safe. */
int xp_window_close(ect_xport *x, const char *key);
/* Closes n windows as xp_window_close each, under one lock of the region
 * table (a request that ends many reservations). Returns how many keys named
 * no open window (skipped; the error is set when any did). */
size_t xp_window_close_many(ect_xport *x, const char *const *keys, size_t n);
/* Makes the region whose key is region_key refuse writes naming its own
 * token (ECT_EACCES): only its windows accept writes. */
int xp_region_set_private(ect_xport *x, const char *region_key);
/* Writes refused by this target since it opened. Thread-safe. */
uint64_t xp_refused(ect_xport *x);
/* Window entries calloc'd so far (the rest were closed windows' reused). */
uint64_t xp_windows_allocated(ect_xport *x);
/* Parses a 16-hex-digit tcp/shm key; ECT_EINVAL with "dst_key" otherwise. */
int xp_key_parse(const char *s, uint64_t *token);

/* r's key becomes ks (malloc'd, r owns it); a previous malloc'd one is freed. */
void xp_region_key_replace(xp_region *r, char *ks);

/* ---- data-plane authentication (auth.c does the handshake) */
/* Counts a connection the handshake refused and logs why (at most once a
 * second per transport handle, naming the peer). Thread-safe. */
void xp_auth_refused_log(ect_xport *x, const char *peer, const char *why);
/* Connections refused by the handshake since open. Thread-safe. */
uint64_t xp_auth_refused(ect_xport *x);
/* "HOST:PORT" of fd's peer ("the unix-socket peer pid N" for AF_UNIX), for
 * logs. */
void xp_peer_name(int fd, char *buf, size_t cap);

/* ---- sockets (xport_net.c) */
/* Splits "HOST:PORT" or "[V6]:PORT"; ECT_EINVAL naming `what` otherwise. */
int xp_parse_hostport(const char *what, const char *s, char *host, size_t cap, int *port);
/* Non-blocking connect with a timeout; TCP_NODELAY set; fd left blocking.
 * ECT_ECONNREFUSED, ECT_ETIMEDOUT or ECT_EINVAL (bad host). */
int xp_tcp_connect(const char *host, int port, int timeout_ms, int *fd);
/* Listening socket on host:port; *port_out gets the bound port. */
int xp_tcp_listen(const char *host, int port, int *fd, int *port_out);
/* Sends / receives exactly len bytes, waiting at most timeout_ms for each
 * step of progress. ECT_ECLOSED on EOF or reset, ECT_ETIMEDOUT. */
int xp_send_all(int fd, const void *buf, size_t len, int timeout_ms);
int xp_recv_all(int fd, void *buf, size_t len, int timeout_ms);

/* ---- connection server (xport_net.c): an accept thread plus one thread per
 * connection, at most max_conns at once and max_per_peer from one peer IP
 * address (a unix-socket peer counts against max_conns only); a connection
 * over either cap is accepted and closed at once. Running out of
 * descriptors on accept is logged (once a second) and waited out (10 ms
 * back-off) while the connections already served go on. fn serves one
 * connection until it returns; it should poll stopfd (readable once
 * stopping) besides its socket. The server closes fd. */
typedef struct xp_server xp_server;
typedef void (*xp_conn_fn)(void *ctx, int fd, int stopfd);
/* Takes ownership of listen_fd, also on failure. */
int xp_server_start(int listen_fd, xp_conn_fn fn, void *ctx, int max_conns, int max_per_peer,
                    xp_server **out);
/* Connections refused by the caps since start. */
uint64_t xp_server_refused(xp_server *s);
/* Logs a warning at most once a second per *last_ms (a caller's static). */
void xp_log_limited(_Atomic uint64_t *last_ms, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Stops accepting, wakes and joins every connection thread. Accepts NULL. */
void xp_server_stop(xp_server *s);

/* Little-endian codec helpers. */
static inline void xp_put_u16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static inline void xp_put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void xp_put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint16_t xp_get_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t xp_get_u32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}
static inline uint64_t xp_get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

#endif
