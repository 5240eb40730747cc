/*
 * shm — the pieces of the shm back end (docs/PROTOCOL.md "shm") that its
 * three files share: shm.c (socket messaging, the process token, the back
 * end's table), shm_target.c (the listener, control segments, region slots,
 * granting) and shm_initiator.c (connections, mappings, copies). The message
 * layouts are shm_wire's.
 */
#ifndef ECT_XPORT_SHM_H
#define ECT_XPORT_SHM_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "xport/conncache.h"
#include "xport/shm_wire.h"
#include "xport/xport.h"

struct conn_sent;

/* Target side: a live connection: its control segment and, for offers
 * (docs/PROTOCOL.md "shm", "Offers"), what its initiator was given. */
typedef struct shm_seg {
    shm_slot *slots;
    struct shm_seg *next;
    uint64_t init_id; /* the initiator's ID message, 0 before or without one; under smu */
    int fd;           /* the connection's socket */
    /* Guards cs and every GRANT or OFFER built and sent on fd (an OFFER is
     * sent from the control server's thread, which only try-locks it). */
    pthread_mutex_t mu;
    struct conn_sent *cs;
    uint8_t *obuf; /* an OFFER being built (SHM_OFFER_MAX), made on the first; under mu */
} shm_seg;

typedef struct shm_impl {
    xp_server *srv;
    pthread_mutex_t smu; /* guards segs and slot_state (target side) */
    shm_seg *segs;
    uint64_t slot_state[SHM_SLOTS]; /* master copy of every segment's states */
    int slot_next;       /* [smu] where the search for a free slot starts (after the last taken) */
    uint64_t drop_walks; /* drop lists made by a walk of every region (atomic) */
    xp_conncache cache;  /* the initiator's connections */
    /* initiator: BEGINs sent, OFFERs applied, windows written without a
     * mapping (shm_initiator.c, "direct"; tests, benchmarks) */
    uint64_t begins, offers, directs; /* __atomic builtins */
} shm_impl;

/* ---- shm.c: messaging over the SOCK_SEQPACKET sockets. */
/* The abstract address of session name `name` ("ect-..."). ECT_EINVAL when
 * empty or too long. */
int shm_make_addr(const char *name, struct sockaddr_un *sa, socklen_t *len);
/* True when the peer of fd runs under our uid. */
bool shm_same_uid(int fd);
/* Sends one message with nfds fds attached, waiting for room at most
 * timeout_ms. ECT_ECLOSED, ECT_ETIMEDOUT, ECT_EIO. */
int shm_msg_send(int fd, const void *buf, size_t len, const int *fds, int nfds, int timeout_ms);
/* Receives one message (and up to maxfds fds, the rest closed); *len gets
 * its size. The socket's SO_RCVTIMEO (shm_set_timeouts) bounds the wait:
 * with wait_forever the call keeps waiting (a server's stop shuts the
 * socket down, which ends it), else it fails with ECT_ETIMEDOUT. ECT_ECLOSED
 * at EOF; ECT_EPROTO for a message that did not fit. */
int shm_msg_recv(int fd, void *buf, size_t cap, size_t *len, int *fds, int maxfds, int *nfds,
                 bool wait_forever, int timeout_ms);
/* The same without waiting: 1 when no message is queued. */
int shm_msg_recv_now(int fd, void *buf, size_t cap, size_t *len, int *fds, int maxfds, int *nfds);
void shm_set_timeouts(int fd, int timeout_ms);
/* The data-plane handshake's I/O over a shm socket: one message of exactly
 * n bytes each way, bounded by timeout_ms. */
typedef struct shm_auth_io {
    int fd;
    int timeout_ms;
} shm_auth_io;
int shm_auth_send(void *ctx, const uint8_t *b, size_t n);
int shm_auth_recv(void *ctx, uint8_t *b, size_t n);
/* A random token of this process (drawn again after a fork): tells an
 * initiator whether a CUDA region's target runs in its own process. */
uint64_t shm_process_token(void);

/* ---- shm_target.c */
int shm_target_open(ect_xport *x, shm_impl *s, const char *name);
int shm_target_reg(ect_xport *x, xp_region *r);
void shm_target_unreg(ect_xport *x, xp_region *r);
/* Offers windows keys[0..n) to the one live connection whose initiator sent
 * ID `id` (backend offer op, xport.h); never blocks. */
int shm_target_offer(ect_xport *x, uint64_t id, const char *const *keys, size_t n);
/* Drop lists this target made by a walk of every region (a connection more
 * than XP_GONE_LOG regions behind); the rest read only what went since. */
uint64_t shm_target_drop_walks(ect_xport *x);
/* Offers skipped in this process (the connection busy or its socket full:
 * the initiator then asks with a BEGIN). Tests. */
uint64_t shm_offer_skips(void);

/* ---- shm_initiator.c */
/* A dropped window's mapping is parked PROT_NONE for a later window on its
 * pages: at most this many per connection, and this many bytes, and this
 * many in the process. */
#define SHM_PARK_MAPS 256
#define SHM_PARK_BYTES (64ull << 20)
#define SHM_PARK_PROCESS 4096
/* An offered window of at most this many bytes, in a pool file the
 * connection holds, that no retired mapping covers is written with
 * pwrite(2) into the file instead of being mapped ("direct") when it is
 * offered alone (an OFFER of one entry: a lone step's), or when the
 * connection's offered windows do not nearly always land on pages their
 * own OFFER freed (the reuse score below SHM_REUSE_MAP): no mapping, so no
 * mprotect to revive and park it, nor the TLB shootdown of the park, nor a
 * fresh mapping's faults. */
#define SHM_DIRECT_MAX (256u << 10)
/* The reuse score: a moving average over the connection's small windows
 * in units of 1 / SHM_REUSE_ONE, each window weighing 1 / SHM_REUSE_SPAN;
 * a new connection starts at SHM_REUSE_ONE (map, as before). */
#define SHM_REUSE_ONE 65536u
#define SHM_REUSE_SPAN 128u
/* New windows no retired mapping covers are mapped only at or above this
 * score: a mapping pays for its revival or fresh mmap (and its park) only
 * when nearly every later window on its pages takes it over. */
#define SHM_REUSE_MAP (SHM_REUSE_ONE / 8 * 7)
/* A message's closed direct windows remembered for the score. */
#define SHM_GONE_MAX 64
/* A larger offered window that no retired mapping covers is direct too,
 * but only where a page-table change is dear, and only when it does not
 * lie on pages its own message freed (one step in flight: mapped once,
 * the windows after it take the mapping over with no system call). It
 * has no score: a fresh or revived mapping of a large window costs ~17
 * pwrites of it there, so one elsewhere, which no successor takes over,
 * is never worth mapping, and one on freed pages is mapped at once (a
 * score's climb back would cost steps of pwrite first, then the same
 * fresh mappings). Dear: an mprotect pair and a copy through the pages it
 * changed cost more than SHM_REMAP_DEAR times a pwrite(2) of the same
 * SHM_REMAP_PROBE bytes (measured once per process, the best of three; a
 * guest whose hypervisor shadows its page tables refaults every page it
 * changed, ~9 us a page here). Elsewhere a revived or fresh mapping,
 * copied into on two threads, beats one thread's pwrite of a large
 * window, and it is mapped as before. */
#define SHM_REMAP_DEAR 2u
#define SHM_REMAP_PROBE (256u << 10)
/* Tests: measure (the default), or take page-table changes as cheap or as
 * dear without measuring. */
enum { SHM_REMAP_MEASURE, SHM_REMAP_CHEAP, SHM_REMAP_IS_DEAR };
void shm_remap_mode(int mode);
/* Whether page-table changes are dear here (measured on the first call in
 * measure mode). */
bool shm_remaps_dear(void);
extern const xp_conn_ops shm_conn_ops;
/* BEGINs x's initiator sent and OFFERs it applied since open. */
void shm_counts(ect_xport *x, uint64_t *begins, uint64_t *offers);
/* Windows x's initiator took as direct (SHM_DIRECT_MAX) since open. */
uint64_t shm_direct_count(ect_xport *x);
int shm_write_batch(ect_xport *x, const char *session, const ect_write *w, size_t n, int *st);
/* backend write_ready (xp_write_ready): the fast-path writes only, on a
 * cached connection; never connects, never sends a BEGIN. */
int shm_write_ready(ect_xport *x, const char *session, const ect_write *w, size_t n, int *st);

#endif
