/*
 * ectransfer — move multimodal encoder outputs (embedding tensors) from an
 * encoder instance to the prefill/decode instances that need them.
 *
 * This is the whole public API; every name starts with `ect_`. Everything is
 * thread-compatible but not thread-safe unless a function says otherwise.
 *
 * Conventions:
 *  - Functions return 0 on success or a negative ECT_E* code. The calling
 *    thread's ect_last_error() then holds a sentence saying what went wrong.
 *  - Constructors take an options struct filled by its _init function and
 *    return the handle through an out-parameter, set to NULL on failure.
 *  - Destructors accept NULL.
 */
#ifndef ECTRANSFER_H
#define ECTRANSFER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(ECT_BUILDING_LIBRARY)
#define ECT_API __attribute__((visibility("default")))
#else
#define ECT_API
#endif

/* ------------------------------------------------------------------ util */

/** Error codes. 0 is success; every error is negative. */
typedef enum ect_err {
    ECT_OK = 0,
    ECT_EINVAL = -1,       /* invalid argument or option */
    ECT_ENOMEM = -2,       /* out of memory (process heap) */
    ECT_EFULL = -3,        /* pool is full */
    ECT_ENOTFOUND = -4,    /* no such item, hash, region or peer */
    ECT_EPROTO = -5,       /* malformed message or protocol violation */
    ECT_ETIMEDOUT = -6,    /* timed out */
    ECT_EIO = -7,          /* I/O error from the OS */
    ECT_ECONNREFUSED = -8, /* peer refused or unreachable */
    ECT_ECLOSED = -9,      /* handle or connection closed */
    ECT_EBUSY = -10,       /* resource in use (leased, being written) */
    ECT_EEXIST = -11,      /* already exists / conflicting entry */
    ECT_ERANGE = -12,      /* value or address out of range */
    ECT_EACCES = -13,      /* permission denied or wrong key */
    ECT_ENOTSUP = -14,     /* not supported by this build or back end */
    ECT_ECANCELED = -15,   /* cancelled */
    ECT_ESTATE = -16,      /* operation illegal in the current state */
    ECT_EOVERFLOW = -17,   /* arithmetic overflow in sizes */
} ect_err;

/** A fixed English sentence for an error code; never NULL. */
ECT_API const char *ect_strerror(int err);

/** Detail text of the last error on the calling thread ("" if none). The
 *  string stays valid until the next failing ect_ call on this thread. */
ECT_API const char *ect_last_error(void);

/** Library version, e.g. "0.1.0". */
ECT_API const char *ect_version(void);

/* --------------------------------------------------------------- dtypes */

/** Element size in bytes of a torch dtype name ("bfloat16" or
 *  "torch.bfloat16", "float8_e4m3fn", ...); 0 if the name is unknown. */
ECT_API size_t ect_dtype_size(const char *name);

/* @@ECT_API_MEM@@ (buffer pool: alloc, pool, resident) */

/*
 * Buffer pool: one memory region carved by a first-fit, coalescing allocator,
 * plus the resident cache of items kept after use (mm_hash -> region, shape,
 * dtype; lease counts; least-recently-used reclaim).
 *
 * Threading: every ect_pool_* function except ect_pool_open and
 * ect_pool_close is safe from any thread at once; each takes the pool's one
 * mutex for its whole duration (ect_pool_base, _fd and _capacity read
 * immutable fields and take no lock). ect_pool_close must not race with any
 * other call on the same pool. The reclaim callback runs on the calling thread
 * after the mutex is released (see ect_pool_reclaim_fn).
 *
 * Ownership: an offset returned by ect_pool_alloc is owned by the caller until
 * it is passed to ect_pool_free or handed to the resident cache with
 * ect_pool_put, which then owns it until the item is removed or reclaimed.
 * Memory at an offset may be read and written through ect_pool_base() + offset
 * only while the caller owns it or holds a lease on the item naming it.
 */
typedef struct ect_pool ect_pool;

/** Longest mm_hash the resident cache accepts, in bytes (NUL excluded). */
#define ECT_MM_HASH_MAX 255
/** Most dimensions of a resident item's shape. */
#define ECT_POOL_MAX_NDIM 8
/** Longest dtype name stored with a resident item, NUL included. */
#define ECT_POOL_DTYPE_MAX 32

/** Tells the pool's owner that items were reclaimed (least recently used,
 *  unleased) to make room: their memory is already free and may already be
 *  handed out again. Called once per item, on the thread whose
 *  ect_pool_alloc or ect_pool_reclaim reclaimed it, after the pool's mutex
 *  is released and before that call returns; it may call ect_pool_*
 *  functions. mm_hash is valid only during the call. */
typedef void (*ect_pool_reclaim_fn)(void *user, const char *mm_hash, uint64_t offset,
                                    uint64_t nbytes);

typedef struct ect_pool_opts {
    uint64_t capacity;              /* bytes; default 1,000,000,000 (upstream ec_buffer_size);
                                       at most 2^62; the usable part is rounded down to alignment */
    uint64_t alignment;             /* power of two, 1 .. 2^30; default 256 */
    int use_memfd;                  /* back the region with a memfd (mode 0600) that a same-host
                                       peer can map (ect_pool_fd); default 0: anonymous mmap */
    int huge_pages;                 /* ask for 2 MiB huge pages; if refused, warns and uses normal
                                       pages with a transparent-huge-page hint; default 0 */
    int mlock;                      /* pin the region in RAM; if refused, warns and goes on
                                       unpinned; default 0 */
    ect_pool_reclaim_fn on_reclaim; /* may be NULL; default NULL */
    void *reclaim_user;             /* passed to on_reclaim */
} ect_pool_opts;

typedef struct ect_pool_stat {
    uint64_t capacity;       /* usable bytes (capacity rounded down to alignment) */
    uint64_t alignment;      /* bytes */
    uint64_t used;           /* allocated bytes, residents included (rounded sizes) */
    uint64_t free;           /* capacity - used */
    uint64_t largest_free;   /* the largest allocation that would succeed right now */
    uint64_t fragments;      /* free blocks */
    uint64_t allocations;    /* allocated blocks, residents included */
    uint64_t residents;      /* items in the resident cache */
    uint64_t resident_bytes; /* bytes they hold (rounded sizes) */
    uint64_t leased;         /* resident items with at least one lease */
    uint64_t reclaimed;      /* items reclaimed since open */
    int memfd;               /* 1 if backed by a memfd */
    int huge_pages;          /* 1 if huge pages were obtained (0 after a fallback) */
    int locked;              /* 1 if mlock succeeded (0 after a fallback) */
} ect_pool_stat;

/** What the resident cache knows about an item. */
typedef struct ect_resident_info {
    uint64_t offset; /* into the pool's region */
    uint64_t nbytes; /* the item's bytes, product(shape) x element size */
    uint32_t ndim;
    uint64_t shape[ECT_POOL_MAX_NDIM];
    char dtype[ECT_POOL_DTYPE_MAX]; /* as given to ect_pool_put */
    uint32_t leases;                /* after this call */
} ect_resident_info;

/** Fills the defaults above. */
ECT_API void ect_pool_opts_init(ect_pool_opts *opts);

/** Maps the region (base aligned to 2 MiB, length capacity rounded up to
 *  2 MiB) and creates its allocator and resident cache. opts may be NULL for
 *  the defaults. Caller owns *out (ect_pool_close); *out is NULL on failure.
 *  Errors: ECT_EINVAL naming the bad option; ECT_ENOMEM or ECT_EIO when the
 *  system refuses the mapping or the memfd. */
ECT_API int ect_pool_open(const ect_pool_opts *opts, ect_pool **out);

/** Unmaps the region, closes the memfd and frees everything, resident items
 *  and outstanding allocations included; the reclaim callback is not called.
 *  Accepts NULL. The caller must make sure no peer still writes into the
 *  region (unregister it from the transport first). */
ECT_API void ect_pool_close(ect_pool *pool);

/** Start of the region, aligned to 2 MiB. Owned by the pool; valid until
 *  ect_pool_close. No lock. */
ECT_API void *ect_pool_base(const ect_pool *pool);

/** Usable bytes from ect_pool_base (what a transport registers). No lock. */
ECT_API uint64_t ect_pool_capacity(const ect_pool *pool);

/** The memfd backing the region (its bytes from offset 0 are the region), or
 *  -1 for an anonymous region. Owned by the pool: do not close it; dup it or
 *  pass it over a unix socket to share the region with a same-host peer. No
 *  lock. */
ECT_API int ect_pool_fd(const ect_pool *pool);

/** Allocates nbytes (rounded up to the alignment), first fit, and stores the
 *  offset from ect_pool_base in *offset; the caller owns the allocation. When
 *  nothing fits, reclaims unleased resident items (least recently used first,
 *  reported to on_reclaim) until it fits, and retries. Errors: ECT_EINVAL for
 *  nbytes 0; ECT_EFULL "pool is full" when nothing fits even after reclaim
 *  (the detail says how much is free, leased and resident); ECT_ENOMEM (heap). */
ECT_API int ect_pool_alloc(ect_pool *pool, uint64_t nbytes, uint64_t *offset);

/** Frees an allocation the caller owns. Errors, each changing nothing:
 *  ECT_ERANGE beyond the capacity; ECT_ESTATE for an offset in free space
 *  (double free, never allocated); ECT_ENOTFOUND inside an allocation but not
 *  its start; ECT_EBUSY when a resident item owns it (use ect_pool_remove). */
ECT_API int ect_pool_free(ect_pool *pool, uint64_t offset);

/** Fills *stats. */
ECT_API void ect_pool_stats(ect_pool *pool, ect_pool_stat *stats);

/** Makes the allocation at offset a resident item named mm_hash, holding
 *  nbytes = product(shape) x size of dtype (at most the allocation's size),
 *  most recently used, with one lease when `lease` is nonzero (so it cannot be
 *  reclaimed before the caller is done with it), else none. Takes ownership
 *  of the allocation on success; on failure the caller still owns it.
 *  Errors: ECT_EINVAL (mm_hash empty or longer than ECT_MM_HASH_MAX; unknown
 *  dtype; ndim over ECT_POOL_MAX_NDIM; shape/dtype not matching nbytes;
 *  nbytes larger than the allocation); ECT_ENOTFOUND (no allocation starts
 *  at offset); ECT_EEXIST (mm_hash already resident, or the allocation
 *  already belongs to another item); ECT_ENOMEM (heap). */
ECT_API int ect_pool_put(ect_pool *pool, const char *mm_hash, uint64_t offset, uint64_t nbytes,
                         const uint64_t *shape, size_t ndim, const char *dtype, int lease);

/** Looks mm_hash up, adds one lease (it cannot be reclaimed or removed until
 *  released) and marks it most recently used; fills *info (may be NULL).
 *  Every successful acquire needs one ect_pool_release. ECT_ENOTFOUND if not
 *  resident; ECT_EOVERFLOW past 2^32 - 1 leases. For this function and the
 *  three below, an empty or over-long mm_hash is ECT_EINVAL. */
ECT_API int ect_pool_acquire(ect_pool *pool, const char *mm_hash, ect_resident_info *info);

/** Looks mm_hash up without leasing it and marks it most recently used;
 *  fills *info (may be NULL). The item may be reclaimed right after: read its
 *  memory only under a lease. ECT_ENOTFOUND if not resident. */
ECT_API int ect_pool_lookup(ect_pool *pool, const char *mm_hash, ect_resident_info *info);

/** Drops one lease and marks the item most recently used. ECT_ENOTFOUND if
 *  not resident; ECT_ESTATE if it holds no lease. */
ECT_API int ect_pool_release(ect_pool *pool, const char *mm_hash);

/** Forgets mm_hash and frees its memory (on_reclaim is not called).
 *  ECT_ENOTFOUND if not resident; ECT_EBUSY while it is leased. */
ECT_API int ect_pool_remove(ect_pool *pool, const char *mm_hash);

/** Reclaims unleased items, least recently used first, until an allocation
 *  of nbytes would fit (what ect_pool_alloc does when full); on_reclaim hears
 *  of each. Returns 0 if nbytes fits now; ECT_EFULL if it cannot; ECT_EINVAL
 *  for nbytes 0. */
ECT_API int ect_pool_reclaim(ect_pool *pool, uint64_t nbytes);

/* @@ECT_API_XPORT@@ (data plane) */

/*
 * Data plane: one-sided, acknowledged batch writes into a peer's registered
 * memory. Every transport handle is both a target (it registers regions that
 * peers write into and serves them from its own threads) and an initiator (it
 * writes into peers' regions). Back ends, chosen by name at open:
 *   "tcp"  built in; session "HOST:PORT"; the target receives straight into
 *          the destination and the initiator sends straight from the source.
 *   "shm"  built in, same host and same user only; session "shm:@NAME" (an
 *          abstract unix socket). Regions must be backed by a file descriptor
 *          (memfd or /dev/shm); the initiator maps them and copies with memcpy.
 *   "ucx"  when compiled in (see `ect info`); session "ucx:HOST:PORT".
 * Threading: ect_xport_write_batch, ect_xport_register, ect_xport_unregister
 * and ect_xport_session may be called from any thread at once;
 * ect_xport_close must not race with any other call on the same handle.
 */
typedef struct ect_xport ect_xport;

/** Bytes of a region key string, NUL included (a ucx key is a packed rkey). */
#define ECT_XPORT_KEY_MAX 2048

typedef struct ect_xport_opts {
    const char *listen;     /* tcp, ucx: "HOST:PORT" the target listens on, port 0 =
                               ephemeral; default "127.0.0.1:0"; copied at open */
    int conns_per_peer;     /* tcp: connections one batch may stripe large writes over,
                               1..64; default 2 */
    uint64_t stripe_min;    /* tcp: a batch of at least twice this many bytes is striped,
                               in pieces of at least this size; default 1 MiB */
    int connect_timeout_ms; /* connecting to a peer, 1..600000; default 5000 */
    int io_timeout_ms;      /* a connection that makes no progress this long fails its
                               unfinished writes (both sides), 1..3600000; default 30000 */
} ect_xport_opts;

/** One write of a batch: `len` bytes from local `src` to the peer's address
 *  `dst_addr`, inside the region whose key string is `dst_key`. */
typedef struct ect_write {
    const void *src;
    uint64_t dst_addr;
    uint64_t len;
    const char *dst_key;
} ect_write;

/** Fills the defaults above. */
ECT_API void ect_xport_opts_init(ect_xport_opts *opts);

/** Opens back end `kind` ("tcp", "shm" or "ucx") and starts its target
 *  threads. opts may be NULL for the defaults. Caller owns *out. Returns
 *  ECT_ENOTSUP for a back end not compiled in, ECT_EINVAL for a bad option. */
ECT_API int ect_xport_open(const char *kind, const ect_xport_opts *opts, ect_xport **out);

/** The back end's name ("tcp", "shm", "ucx"). */
ECT_API const char *ect_xport_kind(const ect_xport *x);

/** The session string peers pass to ect_xport_write_batch to reach this
 *  target. Owned by x, valid until ect_xport_close. */
ECT_API const char *ect_xport_session(const ect_xport *x);

/** Registers [addr, addr + len) as a write target and writes its key string
 *  (NUL-terminated, at most ECT_XPORT_KEY_MAX bytes) into key. fd is a file
 *  descriptor whose bytes from fd_offset are the same memory (a memfd or
 *  /dev/shm segment), or -1 if none; shm requires one (it is duplicated, the
 *  caller keeps its own). Regions may not overlap (ECT_EEXIST). */
ECT_API int ect_xport_register(ect_xport *x, void *addr, uint64_t len, int fd, uint64_t fd_offset,
                               char key[ECT_XPORT_KEY_MAX]);

/** Unregisters the region with this key. Blocks while a write into it is
 *  being received or copied; later writes to it are refused. ECT_ENOTFOUND
 *  for an unknown key. */
ECT_API int ect_xport_unregister(ect_xport *x, const char *key);

/** Writes a batch to the target at peer_session and returns once the target
 *  acknowledged every byte. Returns 0 if every write landed, else the error
 *  of the first failed write; statuses (n entries, may be NULL) gets 0 or an
 *  ECT_E* code per write: ECT_EACCES wrong key, ECT_ERANGE outside the
 *  region, ECT_ENOTFOUND no such region, ECT_ECONNREFUSED target
 *  unreachable, ECT_ECLOSED target vanished before acknowledging,
 *  ECT_ETIMEDOUT no progress within io_timeout_ms. Connections are cached
 *  per session and re-established after a failure. Safe from any thread. */
ECT_API int ect_xport_write_batch(ect_xport *x, const char *peer_session, const ect_write *writes,
                                  size_t n, int *statuses);

/** Stops the target threads, closes connections, unregisters every region,
 *  unmaps peers' memory and frees x. Accepts NULL. */
ECT_API void ect_xport_close(ect_xport *x);

/* @@ECT_API_PUSH@@ (generation 2: consumer side) */

/* @@ECT_API_PUSH_PRODUCER@@ (generation 2: producer side) */

/* @@ECT_API_PULL@@ (generation 1) */

#ifdef __cplusplus
}
#endif
#endif /* ECTRANSFER_H */
