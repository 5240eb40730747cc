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

/** What this build of the library compiled in, by name: "build_type"
 *  ("RelWithDebInfo", "Debug", ...), "sanitize" ("", "address" or
 *  "thread"), "transports" ("tcp shm", or "tcp shm ucx" when UCX was
 *  found). A static string, or NULL for another name. Any thread. */
ECT_API const char *ect_build_info(const char *what);

/** Splits the address s, "HOST:PORT" or "[V6]:PORT" (brackets stripped from
 *  the host), into host (room for cap bytes, NUL included) and *port, which
 *  must lie in [min_port, max_port]. A bare IPv6 address without brackets is
 *  refused (its last colon cannot be told from the port's). The library's one
 *  address parser: every role and the `ect` tool read addresses with it.
 *  Returns 0, or ECT_EINVAL with ect_last_error() "WHAT 'S' is not
 *  HOST:PORT (port MIN..MAX)". Any thread. */
ECT_API int ect_hostport_parse(const char *what, const char *s, int min_port, int max_port,
                               char *host, size_t cap, int *port);

/** Creates the key directory dir (mode 0700, and dir/accept/) and a new CURVE
 *  key pair in it: dir/self.secret (mode 0600) and dir/self.public, each 40
 *  characters of Z85 and a newline (docs/SECURITY.md has the layout; a peer
 *  is accepted by copying its self.public to dir/accept/NAME.public). Never
 *  replaces an existing pair: ECT_EEXIST. Writes the public key's Z85 text
 *  to public_z85 (41 bytes with the NUL) unless NULL. ECT_ENOTSUP when libzmq
 *  lacks CURVE. Any thread. */
ECT_API int ect_keygen(const char *dir, char public_z85[41]);

/** Nonzero for a host that binds every interface and so can never be told to
 *  a peer: "", "*", "0.0.0.0", "::", "::0", "[::]" (and NULL). Any thread. */
ECT_API int ect_host_is_wildcard(const char *host);

/* ------------------------------------------- ABI checks for bindings */

/** The binary interface's version: raised whenever a public struct changes
 *  its layout or a function its meaning, so a binding (ctypes, cffi) built
 *  against one version refuses another at load instead of misreading it. */
#define ECT_ABI_VERSION 4

/** ECT_ABI_VERSION of the library actually loaded. */
ECT_API int ect_abi_version(void);

/** sizeof the public struct named type_name ("ect_push_view",
 *  "ect_push_result", ...: every struct this header defines), or 0 for a
 *  name it does not define. A binding that mirrors a struct compares its own
 *  size with this at load. Any thread. */
ECT_API size_t ect_sizeof(const char *type_name);

/* Fixed lengths of the character arrays in public structs, NUL included. */
#define ECT_DTYPE_LEN 32         /* dtype names (the same as ECT_POOL_DTYPE_MAX) */
#define ECT_MM_HASH_LEN 256      /* mm_hash (ECT_MM_HASH_MAX + 1) */
#define ECT_TRANSFER_ID_LEN 256  /* transfer_id */
#define ECT_SESSION_ID_LEN 257   /* a pull producer's producer_session_id */
#define ECT_SCHED_ERROR_LEN 160  /* ect_push_sched_item.error */
#define ECT_RESULT_ERROR_LEN 192 /* ect_push_result.error */
#define ECT_TRANSPORT_LEN 16     /* a data plane's name ("tcp", "shm", "ucx") */
#define ECT_CUDA_LIBRARY_LEN 256 /* ect_cuda_info.library */
#define ECT_CUDA_NAME_LEN 128    /* ect_cuda_info.device0 */
#define ECT_CUDA_WHY_LEN 320     /* ect_cuda_info.why */
/** ect_last_error() texts are at most ECT_ERROR_LEN - 1 bytes. */
#define ECT_ERROR_LEN 512

/* -------------------------------------------------------------- logging */

/** Log levels, most severe first. The library logs what is at or above the
 *  level chosen by ect_log_set_level, else by the environment variable
 *  ECT_LOG=error|warn|info|debug (default warn). */
typedef enum ect_log_level {
    ECT_LOG_ERROR = 0,
    ECT_LOG_WARN = 1,
    ECT_LOG_INFO = 2,
    ECT_LOG_DEBUG = 3,
} ect_log_level;

/** One log line as a handler receives it. Every pointer is valid during the
 *  handler call only. Fields may be added at the end in a later version
 *  (the library allocates the record; a handler only reads it). */
typedef struct ect_log_record {
    ect_log_level level;
    const char *module;      /* the part of the library: "consumer", "producer", "pool", ... */
    const char *message;     /* one line, no trailing newline, at most 1023 bytes */
    uint64_t realtime_ns;    /* CLOCK_REALTIME when logged (nanoseconds since the epoch) */
    uint64_t thread_id;      /* the logging thread's OS id (gettid) */
    const char *transfer_id; /* the transfer the line concerns, or NULL */
    const char *mm_hash;     /* the item it concerns, or NULL */
    const char *role;        /* ect_log_set_role's, else the program's name */
    uint64_t pid;            /* the process id */
} ect_log_record;

/** Receives the library's log lines instead of stderr. Runs on whichever
 *  thread logs (the caller's or one of the library's own threads), possibly
 *  on several threads at once; it must not call ect_log_set_handler. */
typedef void (*ect_log_fn)(void *user, const ect_log_record *rec);

/** Sends every log line that passes the level to fn(user, record); NULL
 *  restores the default (one line per message on stderr, as
 *  ect_log_set_role describes). When it returns, no call to the previous handler is still
 *  running, so its user data may be freed. Any thread, except from inside a
 *  handler. */
ECT_API void ect_log_set_handler(ect_log_fn fn, void *user);

/** Names the process's role in every log line ("push-consumer", "encoder
 *  worker 3"; at most 63 bytes kept); NULL or "" goes back to the program's
 *  name, the default. The `ect` tool sets its command's name. Any thread.
 *
 *  Without a handler, lines go to stderr as
 *  "2026-12-01T03:04:05.678Z warn pid=4242 role=ROLE module=MODULE
 *  [transfer_id=T] [mm_hash=H]: MESSAGE" (RFC 3339 UTC time with
 *  milliseconds; the id fields when the line concerns one transfer or item),
 *  or, with the environment variable ECT_LOG_FORMAT=json, as one JSON object
 *  a line with the keys time, level, pid, role, module, transfer_id and
 *  mm_hash (when known), message. An ECT_LOG or ECT_LOG_FORMAT value that is
 *  not understood is said once on stderr, and the default is used. */
ECT_API void ect_log_set_role(const char *role);

/** Sets the level (an ect_log_level); -1 goes back to reading ECT_LOG. Any
 *  thread. */
ECT_API void ect_log_set_level(int level);

/** The level in force now. */
ECT_API int ect_log_get_level(void);

/* -------------------------------------------------------------- metrics */

/** The metrics of every role object open in this process (push consumer
 *  shards, push schedulers and producers, pull producers and consumers), in
 *  the Prometheus text exposition format 0.0.4: names ectransfer_*, labels
 *  role, shard and, where it applies, transport / direction / reason /
 *  state; never a label per transfer. Objects appear while open (counters
 *  start at 0 when one opens). The list of names is in README "Operating".
 *  Caller owns the result (free()); NULL when out of memory (ECT_ENOMEM in
 *  ect_last_error()). Any thread; no object's progress waits on it. */
ECT_API char *ect_metrics_text(void);

typedef struct ect_metrics_server ect_metrics_server;

/** Serves ect_metrics_text() over HTTP on host:port (port 0 = any free
 *  port; host "0.0.0.0", "::" or "*" for every interface, as for a control
 *  port) from a thread of its own: GET or HEAD /metrics answers 200
 *  "text/plain; version=0.0.4"; another path 404, another method 405, a
 *  request head that does not parse or is over 8 KiB 400. One connection at
 *  a time, closed after each answer; a client silent for 2 s is dropped.
 *  Errors: ECT_EINVAL (host, port); ECT_EEXIST "address in use"; ECT_EIO,
 *  ECT_ENOMEM. Caller owns *out (ect_metrics_server_close); *out is NULL on
 *  failure. */
ECT_API int ect_metrics_serve(const char *host, int port, ect_metrics_server **out);

/** The bound port (the one chosen when port 0 was asked). */
ECT_API int ect_metrics_server_port(const ect_metrics_server *m);

/** Stops the thread (at once; a connection being answered is finished
 *  first) and closes the socket. NULL is fine. */
ECT_API void ect_metrics_server_close(ect_metrics_server *m);

/** Asks the push consumer shard whose control port is host:port for its
 *  status (the ect_status control op, an extension: docs/PROTOCOL.md) and
 *  sets *json to the result, a compact JSON object: shard, tp_size, port,
 *  transport, pool {capacity, used, resident}, reservations by state,
 *  peers (the instance's control ports), events {queued, sent, dropped},
 *  refused by reason, errors (the latest refusals other than "full", newest
 *  first, each {time (RFC 3339), error}). Blocks up to about 2 x timeout_ms.
 *  Caller owns *json (free()); *json is NULL on failure. Errors:
 *  ECT_ECONNREFUSED (nothing listens there) or ECT_ETIMEDOUT (no answer),
 *  both "no consumer answers at HOST:PORT ..."; ECT_ENOTSUP the peer
 *  answered "unknown control op" (an upstream consumer, which has no such
 *  op); ECT_EPROTO another refusal or an undecodable reply; ECT_EINVAL.
 *  Any thread. */
ECT_API int ect_push_status(const char *host, int port, int timeout_ms, char **json);

/** ect_push_status with CurveZMQ: curve_keys is a key directory
 *  (docs/SECURITY.md) whose accept/ holds the consumer's public key, and
 *  whose self.public the consumer accepts; NULL: as ect_push_status. A
 *  consumer that refuses our key: ECT_EACCES. A key directory that does not
 *  load: its loader's ECT_EINVAL / ECT_EIO. Any thread. */
ECT_API int ect_push_status_keyed(const char *host, int port, int timeout_ms,
                                  const char *curve_keys, char **json);
/** Measures bare control round trips to the push consumer shard whose
 *  control port is host:port: one REQ socket of the control client the
 *  producer uses, one untimed exchange that connects, then n exchanges of
 *  the `event_port` op (a no-op every consumer, ours or upstream, answers;
 *  nothing new on the wire), one after the other from the calling thread.
 *  rtt_ns (n entries; NULL when n is 0) gets each exchange's time in ns,
 *  send to reply decoded. The limit `ect bench push` sets beside a step's
 *  latency. Blocks up to about 2 x timeout_ms per exchange. Errors:
 *  ECT_ECONNREFUSED / ECT_ETIMEDOUT ("no consumer answers at HOST:PORT"),
 *  ECT_EPROTO (a refusal or an undecodable reply), ECT_EINVAL. Any thread. */
ECT_API int ect_push_ping(const char *host, int port, int timeout_ms, uint64_t *rtt_ns, size_t n);

/* --------------------------------------------------------------- dtypes */

/** Element size in bytes of a torch dtype name ("bfloat16" or
 *  "torch.bfloat16", "float8_e4m3fn", ...); 0 if the name is unknown. */
ECT_API size_t ect_dtype_size(const char *name);

/* ------------------------------------------------- memory kinds, CUDA */

/*
 * Memory kinds. Host memory is what every call takes by default. With the
 * CUDA driver present, pools and registered regions may also be pinned host
 * memory (registered with CUDA, so device copies run at full speed) or CUDA
 * device memory. The library never links CUDA: it loads the driver API
 * (libcuda.so.1, or the file named by the environment variable
 * ECT_CUDA_LIBRARY) at run time, the first time something asks for a
 * pinned or device kind (or ect_cuda_get_info is called). Without it every
 * such request fails with ECT_ENOTSUP naming why, and nothing else changes.
 *
 * Device memory is never touched by the host: the library copies with the
 * driver (cuMemcpyAsync on a stream of its own, waited for before a call
 * reports the bytes landed). Memory handed to the library must be ready:
 * synchronize the stream that produced it first.
 *
 * Threading: every function here is safe from any thread at once.
 */
typedef enum ect_mem_kind {
    ECT_MEM_AUTO = -1,  /* ask the driver what the memory is (where a call allows it) */
    ECT_MEM_HOST = 0,   /* ordinary host memory */
    ECT_MEM_PINNED = 1, /* host memory registered with CUDA (cuMemHostRegister) */
    ECT_MEM_CUDA = 2,   /* CUDA device memory (cuMemAlloc) */
} ect_mem_kind;

/** "host", "pinned", "cuda"; "?" outside the enum. */
ECT_API const char *ect_mem_kind_name(int kind);

/** Parses a device spec: "cpu" or "host" (ECT_MEM_HOST), "pinned"
 *  (ECT_MEM_PINNED), "cuda" (ECT_MEM_CUDA, device 0) or "cuda:N". NULL or ""
 *  is host. Fills *kind and *device (either may be NULL). ECT_EINVAL with
 *  the accepted forms otherwise. Needs no driver. */
ECT_API int ect_mem_parse_device(const char *spec, int *kind, int *device);

/** What the CUDA driver offers this process. */
typedef struct ect_cuda_info {
    int available;                      /* 1 if the driver API loaded and found a device */
    int driver_version;                 /* cuDriverGetVersion, e.g. 13000; 0 if unavailable */
    int devices;                        /* CUDA devices */
    char library[ECT_CUDA_LIBRARY_LEN]; /* the library file asked for */
    char device0[ECT_CUDA_NAME_LEN];    /* name of device 0 ("" if none) */
    char why[ECT_CUDA_WHY_LEN];         /* why it is unavailable ("" if available) */
} ect_cuda_info;

/** Loads the driver API if not done yet and fills *info. Returns 0 if CUDA
 *  is available, else ECT_ENOTSUP (info->why and ect_last_error() say why). */
ECT_API int ect_cuda_get_info(ect_cuda_info *info);

/** What `ptr` points to: *kind gets ECT_MEM_CUDA (device memory, *device its
 *  ordinal), ECT_MEM_PINNED (host memory registered with CUDA) or
 *  ECT_MEM_HOST (anything else, and always when the process has not loaded
 *  the CUDA driver: this call never loads it). device may be NULL. */
ECT_API void ect_mem_kind_of(const void *ptr, int *kind, int *device);

/** Allocates nbytes of `kind` on `device` (ignored for host): host (malloc),
 *  pinned (cuMemHostAlloc) or CUDA (cuMemAlloc). Caller owns *out
 *  (ect_mem_free with the same kind). Errors: ECT_EINVAL (nbytes 0, bad kind
 *  or device); ECT_ENOTSUP (no CUDA, naming why); ECT_ENOMEM. */
ECT_API int ect_mem_alloc(int kind, int device, uint64_t nbytes, void **out);

/** Frees what ect_mem_alloc returned. Accepts NULL. */
ECT_API void ect_mem_free(int kind, void *ptr);

/** Copies nbytes between any two kinds (host, pinned, device; the kinds are
 *  asked of the driver) and returns once the bytes are in place. Regions must
 *  not overlap. Errors: ECT_EINVAL (NULL with nbytes > 0); ECT_EIO (the
 *  driver refused the copy, naming its error). */
ECT_API int ect_mem_copy(void *dst, const void *src, uint64_t nbytes);

/* -------------------------------- buffer pool: alloc, pool, resident */

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
    int mem_kind;   /* ECT_MEM_HOST (default); ECT_MEM_PINNED: the host region is registered
                       with CUDA; ECT_MEM_CUDA: device memory (cuMemAlloc), ect_pool_base is a
                       device address the host must not touch, and use_memfd, huge_pages and
                       mlock must be 0. Pinned and CUDA need the driver (ECT_ENOTSUP without) */
    int device;     /* CUDA device ordinal for ECT_MEM_CUDA; default 0 */
    void *external; /* caller-owned memory of `capacity` bytes and kind mem_kind (aligned to
                       `alignment`) to carve instead of mapping a region: the pool never frees
                       it (pinned: registers it unless it already is, and undoes only its own
                       registration); use_memfd, huge_pages and mlock must be 0. Default NULL */
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
    int mem_kind;            /* ECT_MEM_HOST, ECT_MEM_PINNED or ECT_MEM_CUDA */
    int device;              /* CUDA device ordinal (ECT_MEM_CUDA), else 0 */
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
 *  2 MiB; a CUDA region is one cuMemAlloc of that length; an external one is
 *  the caller's) and creates its allocator and resident cache. opts may be
 *  NULL for the defaults. Caller owns *out (ect_pool_close); *out is NULL on
 *  failure. Errors: ECT_EINVAL naming the bad option; ECT_ENOMEM or ECT_EIO
 *  when the system (or the CUDA driver) refuses the memory or the memfd;
 *  ECT_ENOTSUP for a pinned or CUDA pool without the driver. */
ECT_API int ect_pool_open(const ect_pool_opts *opts, ect_pool **out);

/** Unmaps the region (frees the device memory, undoes a pinned
 *  registration; leaves external memory alone), closes the memfd and frees
 *  everything, resident items and outstanding allocations included; the
 *  reclaim callback is not called.
 *  Accepts NULL. The caller must make sure no peer still writes into the
 *  region (unregister it from the transport first). */
ECT_API void ect_pool_close(ect_pool *pool);

/** Start of the region, aligned to 2 MiB. Owned by the pool; valid until
 *  ect_pool_close. No lock. */
ECT_API void *ect_pool_base(const ect_pool *pool);

/** The pool's memory kind (ECT_MEM_HOST, _PINNED, _CUDA) and, for CUDA, its
 *  device ordinal. No lock. */
ECT_API int ect_pool_mem_kind(const ect_pool *pool);
ECT_API int ect_pool_device(const ect_pool *pool);

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

/* -------------------------------------------------------- data plane */

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
    uint64_t stripe_min;    /* tcp: a write of at least twice this many bytes is striped,
                               in pieces of at least this size; a batch of smaller writes
                               keeps to one connection; default 1 MiB */
    int connect_timeout_ms; /* connecting to a peer, 1..600000; default 5000 */
    int io_timeout_ms;      /* a connection that makes no progress this long fails its
                               unfinished writes (both sides), 1..3600000; default 30000.
                               A target also drops a connection that sends no hello
                               within it */
    int max_conns;          /* target: connections served at once (one thread each),
                               1..65536; more are accepted and closed at once; default 512 */
    int max_conns_per_peer; /* target, tcp/ucx: of those, from one peer IP address,
                               1..max_conns; default 64 */
    const char *curve_keys; /* key directory (docs/SECURITY.md): each session starts with a
                               handshake in which both sides prove they hold a key the other
                               accepts, before any byte lands (tcp, shm; docs/PROTOCOL.md
                               "Data-plane handshake"). Loaded at open: a bad directory fails
                               open (ECT_EINVAL naming the file); ucx with keys fails open
                               ECT_ENOTSUP. A peer that is refused, or keys on one side only,
                               fail the initiator's writes ECT_EACCES saying which. The
                               string is copied at open. NULL (default): off, wire as before */
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
 *  caller keeps its own). Regions may not overlap (ECT_EEXIST). Host memory
 *  only: CUDA device memory is refused (ECT_EINVAL; use
 *  ect_xport_register_mem). */
ECT_API int ect_xport_register(ect_xport *x, void *addr, uint64_t len, int fd, uint64_t fd_offset,
                               char key[ECT_XPORT_KEY_MAX]);

/** Registers [addr, addr + len) of memory kind `mem_kind` as a write target
 *  (caller-owned memory is fine: an engine may hand its own buffer; it must
 *  stay allocated until unregistered). The transport asks the driver what the
 *  memory is and refuses a kind that does not match it (ECT_EINVAL);
 *  ECT_MEM_AUTO takes whatever it is. Host and pinned regions behave as
 *  ect_xport_register (fd and fd_offset as there). A CUDA device region:
 *    tcp  payload lands in a pinned bounce ring and is copied to the device
 *         behind the network (the copy of one slice overlaps the receive of
 *         the next); a write is acknowledged only once its bytes are on the
 *         device;
 *    shm  needs no fd: same-host peers receive a CUDA IPC handle of the
 *         allocation and copy into it with the driver (device-to-device from
 *         a device source, host-to-device from a host one);
 *    ucx  not supported (ECT_ENOTSUP).
 *  Errors as ect_xport_register, plus ECT_ENOTSUP without the CUDA driver. */
ECT_API int ect_xport_register_mem(ect_xport *x, void *addr, uint64_t len, int mem_kind, int fd,
                                   uint64_t fd_offset, char key[ECT_XPORT_KEY_MAX]);

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
 *  ECT_ETIMEDOUT no progress within io_timeout_ms, ECT_EIO the target
 *  could not place the bytes (a device copy failed). Connections are cached
 *  per session and re-established after a failure. A write's src may be CUDA
 *  device memory (asked of the driver when the process has it loaded): tcp
 *  and ucx stage it with one device-to-host copy into pinned memory; shm
 *  copies it straight into the peer's region (device-to-device into a CUDA
 *  region). Safe from any thread. */
ECT_API int ect_xport_write_batch(ect_xport *x, const char *peer_session, const ect_write *writes,
                                  size_t n, int *statuses);

/** Stops the target threads, closes connections, unregisters every region,
 *  unmaps peers' memory and frees x. Accepts NULL. */
ECT_API void ect_xport_close(ect_xport *x);

/* ----------------------------------------- configuration as JSON text */

/*
 * Every role also opens from a configuration written as one JSON object
 * (ect_X_open_config): the stable interface for bindings (ctypes, cffi) and
 * for configuration files; the options structs stay for C callers. Keys are
 * upstream's ec_transfer_config / ec_connector_extra_config names where one
 * exists, ours otherwise; a key left out keeps the struct's default.
 *
 * One vocabulary serves a whole instance, so one file can configure every
 * role of it: the shared keys below are accepted by every role, including a
 * role that does not use them (each open call lists what it reads). Any
 * other key must be one the role reads. Refused with ECT_EINVAL, the detail
 * naming the key: text that is not one JSON object, a duplicate key, an
 * unknown key, a key of another role, a value of the wrong type or out of
 * range. Integers may be written as integral reals (1e9). Strings are copied.
 *
 * Shared keys:
 *   "ec_ip"               string   the consumer instance's address (upstream default
 *                                  "127.0.0.1"); a pull producer's bind address
 *   "ec_port"             integer  the base control port, 0..65535 (default 14579)
 *   "ec_buffer_size"      integer  bytes of the role's registered pool (consumer pool,
 *                                  producer staging, pull pools); >= 0
 *   "tp_size", "tp_rank"  integer  1..64 and 0..63: the consumer instance's TP layout
 *   "dp_index"            integer  0..65535: the data-parallel replica
 *   "control_timeout_s"   number   each control exchange, > 0 and <= 3600 (default 30)
 *   "push_wait_timeout_s" number   a scheduler's wait for an item to arrive, and a
 *                                  producer's wait for room in a full consumer pool
 *                                  (push_wait_ms), > 0 (default 60)
 *   "ec_buffer_device"    string   where a consumer's pool lives: "cpu", "pinned",
 *                                  "cuda" or "cuda:N" (pool_device; default "cpu")
 *   "transport"           string   "tcp", "shm" or "ucx"
 *
 * For bindings, the consumers (push and pull) also read "pool_memory": the
 * address, as a JSON integer (never a real: a double cannot carry every
 * address), of caller-owned memory of ec_buffer_size bytes and
 * ec_buffer_device's kind to use as the pool (the opts' pool_memory). A
 * binding that allocates the pool itself (ect_mem_alloc) decides when it
 * is freed, so views it handed out can outlive the consumer even when the
 * pool is device memory. Not for files: a wrong address is undefined
 * behaviour.
 */

/* --------------------------------------- generation 2: consumer side */

/*
 * Push protocol (generation 2), consumer side. See SPEC.md "Generation 2".
 *
 * ect_push_consumer: one per receiving TP rank. It owns a buffer pool (memfd
 * backed, so the shm transport can map it), a transport target with the pool
 * registered, and a control server (REP on ec_port + dp_index x tp_size +
 * tp_rank, PUSH on an ephemeral port) run by one background thread.
 * Producers reserve, write and complete; the consumer's engine takes READY
 * items as zero-copy views and releases them to the resident cache.
 *
 * Threading: ect_push_consumer_take, _release, _finish, _stats, _evict and the port
 * getters are safe from any thread at once (they take the reservation
 * table's mutex, never across I/O). _open and _close must not race with any
 * other call on the same handle.
 */
typedef struct ect_push_consumer ect_push_consumer;

typedef struct ect_push_consumer_opts {
    const char *ec_ip;         /* bind address of the control sockets; default "127.0.0.1";
                                  "0.0.0.0" / "::" only when asked. Copied at open */
    int ec_port;               /* base port, default 14579; 0: ephemeral control port
                                  (tests; `peers` then lists only this shard) */
    int tp_size;               /* 1..64, default 1 */
    int tp_rank;               /* 0..tp_size-1, default 0 */
    int dp_index;              /* >= 0, default 0; control port = ec_port + dp_index x tp_size
                                  + tp_rank */
    uint64_t pool_size;        /* bytes, default 1,000,000,000 */
    const char *transport;     /* "tcp" (default), "shm" or "ucx" */
    const char *xport_listen;  /* tcp/ucx data-plane listen "HOST:PORT"; default ec_ip:0 */
    uint64_t ttl_ms;           /* reservation and tombstone lifetime, default 300000 */
    uint64_t pending_grace_ms; /* a cancelled or expired reservation whose writer never
                                  finished is freed this long after, once the transport shows
                                  no write landing in the pool (tcp, shm; ucx: after the grace
                                  alone); default 300000 */
    int reap_interval_ms;      /* default 1000 */
    size_t max_events;         /* event backlog, default 4096 (oldest dropped) */
    size_t max_tombstones;     /* default 65536 */
    const char *pool_device;   /* where the pool lives (upstream's ec_buffer_device): NULL or
                                  "cpu" (default, memfd host memory), "pinned" (host memory
                                  registered with CUDA), "cuda" or "cuda:N" (device memory;
                                  views then point to the device). Not with ucx. Copied */
    void *pool_memory;         /* caller-owned memory of pool_size bytes, of pool_device's
                                  kind, 256-byte aligned, used as the pool instead of
                                  allocating one (an engine's own buffer); must outlive the
                                  consumer. A host buffer has no fd, so shm refuses it.
                                  Default NULL */
    const char *advertise;     /* host (name, IPv4 or IPv6) producers are told in dst_session
                                  instead of the bound one (NAT, a Kubernetes service). NULL
                                  (default): the bound host; for a wildcard bind ("0.0.0.0",
                                  "::") the local address of the interface that routes to each
                                  requesting producer, never the wildcard. Copied */
    int data_port;             /* fixed tcp/ucx data-plane port of rank 0 of dp_index 0; rank r
                                  listens on data_port + dp_index x tp_size + tp_rank (as the
                                  control ports). 0 (default): any free port. xport_listen,
                                  when set, wins */
    const char *curve_keys;    /* key directory (docs/SECURITY.md, `ect keygen`): with it,
                                  every ZMQ socket speaks CurveZMQ and every data-plane
                                  session starts with a key handshake; a peer without an
                                  accepted key gets nothing. NULL (default): off, plain
                                  ZMQ as upstream speaks it. Copied at open */
    int event_auth_off;        /* without curve_keys only: nonzero makes the event port plain
                                  ZMQ with no handshake, as upstream's scheduler needs; then
                                  any PULL that connects takes a share of the events. 0
                                  (default): the port asks a per-shard secret that our
                                  scheduler learns from the event_port reply
                                  (docs/SECURITY.md "Plain mode") */
    const char *trusted_peers; /* addresses (comma-separated IPv4/IPv6 literals) allowed to
                                  cancel any reservation and read its id in `status`: the
                                  instance's scheduler. NULL (default): every address of this
                                  host's interfaces; "*": every peer. complete is always bound
                                  to the reserving address (docs/PROTOCOL.md "Reservations
                                  belong to their peer"). Copied at open */
    int max_conns;             /* data-plane connections served at once, 1..65536; default 512
                                  (ect_xport_opts.max_conns) */
    int max_conns_per_peer;    /* of those, from one peer IP address, 1..max_conns; default 64
                                  (ect_xport_opts.max_conns_per_peer) */
} ect_push_consumer_opts;

/** A READY item taken for reading: `data` points into the consumer's pool
 *  and stays valid and unchanged until ect_push_consumer_release. */
typedef struct ect_push_view {
    const void *data;
    uint64_t nbytes;
    uint32_t ndim;
    uint64_t shape[ECT_POOL_MAX_NDIM];
    char dtype[ECT_DTYPE_LEN];
    char mm_hash[ECT_MM_HASH_LEN];
    char transfer_id[ECT_TRANSFER_ID_LEN];
    int mem_kind; /* ECT_MEM_HOST, _PINNED, or _CUDA: `data` is a device address */
    int device;   /* CUDA device ordinal of a device view */
} ect_push_view;

typedef struct ect_push_consumer_stat {
    uint64_t pool_used;      /* bytes allocated in the pool (rounded sizes) */
    uint64_t pool_capacity;  /* usable bytes */
    uint64_t live;           /* reservations not in a tombstone state */
    uint64_t tombstones;     /* CANCELLED + EXPIRED entries kept */
    uint64_t buffers;        /* allocations the table holds */
    uint64_t resident;       /* buffers kept resident after release */
    uint64_t events_queued;  /* events not yet sent */
    uint64_t events_sent;    /* events sent on the PUSH socket */
    uint64_t events_dropped; /* dropped because the backlog was full */
    uint64_t bad_requests;   /* frames answered "malformed" or "unknown op" */
    uint64_t evictions;      /* resident buffers reclaimed */
    uint64_t peak_live;      /* most reservations live at once since open */
    uint64_t peak_held;      /* most bytes the reservation table held at once (reservations
                                and resident items, rounded sizes) */
    uint64_t finished;       /* delivered reservations ended by _release or _finish */
    uint64_t abandoned;      /* reservations producers abandoned (cancel with abandon) */
    uint64_t expired;        /* reservations the reaper ended: READY but not released within
                                ttl_ms, or a writer silent past it */
    uint64_t refused_full;   /* reserves refused "EC consumer buffer pool is full" */
    uint64_t refused_other;  /* reserves refused otherwise (a transfer_id ended within the
                                TTL, a conflict, a bad field) */
    uint64_t writes_refused; /* data-plane writes the transport refused: a key that is no
                                live reservation's, a range outside it, a window closed by
                                complete / cancel / expiry (docs/PROTOCOL.md "Write windows") */
    uint64_t spares; /* spare ranges held for producers (docs/PROTOCOL.md "Extension: a spare
                        range granted ahead"): in pool_used, not freed by _evict (one per
                        producer connection, each ends at its TTL, under pressure or at close) */
} ect_push_consumer_stat;

/** Fills the defaults above. */
ECT_API void ect_push_consumer_opts_init(ect_push_consumer_opts *opts);

/** Maps the pool, opens the transport and registers the pool, binds the
 *  control sockets and starts the control thread. Caller owns *out
 *  (ect_push_consumer_close); *out is NULL on failure. Errors: ECT_EINVAL
 *  naming the option; ECT_EEXIST "address in use" when the control port is
 *  taken; ECT_ENOTSUP for a transport not compiled in; ECT_ENOMEM, ECT_EIO. */
ECT_API int ect_push_consumer_open(const ect_push_consumer_opts *opts, ect_push_consumer **out);

/** ect_push_consumer_open from a JSON object (see "configuration as JSON
 *  text"). Reads ec_ip, ec_port, tp_size, tp_rank, dp_index, ec_buffer_size
 *  (pool_size), transport, ec_buffer_device (pool_device), and its own keys
 *  xport_listen, advertise and trusted_peers (strings), data_port, ttl_ms,
 *  pending_grace_ms, reap_interval_ms, max_events, max_tombstones,
 *  max_conns, max_conns_per_peer, pool_memory (integers; pool_memory for
 *  bindings, see "configuration as JSON text"). Caller owns *out. Errors:
 *  those of the configuration, then those of ect_push_consumer_open. */
ECT_API int ect_push_consumer_open_config(const char *json, ect_push_consumer **out);

/** Stops the control thread, closes the sockets and the transport (no peer
 *  writes after this), then frees every reservation and the pool. Views
 *  still taken become invalid. Accepts NULL. */
ECT_API void ect_push_consumer_close(ect_push_consumer *c);

/** The bound control port and event (PUSH) port; the transport session. */
ECT_API int ect_push_consumer_port(const ect_push_consumer *c);
ECT_API int ect_push_consumer_event_port(const ect_push_consumer *c);
ECT_API const char *ect_push_consumer_session(const ect_push_consumer *c);

/** Takes the READY item transfer_id for zero-copy reading: fills *view and
 *  holds a lease so no cancel, reaper or reclaim frees the bytes until
 *  ect_push_consumer_release. Errors: ECT_ENOTFOUND unknown transfer_id;
 *  ECT_ESTATE not READY (still being written, cancelled, expired). */
ECT_API int ect_push_consumer_take(ect_push_consumer *c, const char *transfer_id,
                                   ect_push_view *view);

/** Ends the lease of a taken view and, when view->transfer_id is set (take
 *  sets it), finishes the transfer on this shard: its reservation ends at
 *  once, so the pool never waits for the scheduler's remote cancel to reuse
 *  the room (a later take of that transfer_id gets ECT_ENOTFOUND, and a
 *  producer reserving it again is answered `cancelled`, reason "already
 *  delivered"). The bytes stay resident so a later reserve of the same
 *  mm_hash is answered `cached` without moving bytes (least-recently-used
 *  reclaim when the pool is full). Clear view->transfer_id to end only the
 *  lease (several views of one take, given back one by one; the transfer
 *  then ends with ect_push_consumer_finish). The view must not be read
 *  afterwards. Errors: ECT_ENOTFOUND, ECT_ESTATE (not leased). */
ECT_API int ect_push_consumer_release(ect_push_consumer *c, const ect_push_view *view);

/** Finishes transfer_id on this shard without ending any lease: its
 *  delivered (READY) reservation ends at once, exactly as a release with
 *  view->transfer_id set ends it (a later take gets ECT_ENOTFOUND, a
 *  producer reserving it again is answered `cancelled`), while every view
 *  still taken keeps its bytes: they stay leased until each is released
 *  with view->transfer_id cleared, and are resident for dedup after that.
 *  For engines and bindings whose views are given back one by one (or
 *  later, by a garbage collector): end the transfer here when the engine
 *  is done with it, and the leases as the views go. It may be called
 *  before any take (an item the engine already holds from elsewhere).
 *  Errors: ECT_EINVAL (NULL or empty transfer_id); ECT_ENOTFOUND unknown
 *  transfer_id; ECT_ESTATE not READY: still being written, or already ended
 *  (finished, cancelled by the scheduler, expired); nothing changes then. */
ECT_API int ect_push_consumer_finish(ect_push_consumer *c, const char *transfer_id);

/** Frees up to `max` unleased resident items no reservation uses, least
 *  recently used first; returns how many were freed. */
ECT_API size_t ect_push_consumer_evict(ect_push_consumer *c, size_t max);

/** Frees every spare range the shard holds for producers (docs/PROTOCOL.md
 *  "Extension: a spare range granted ahead"; _evict leaves them), closing
 *  their write windows: a producer's put naming one is then refused and its
 *  item reserved the normal way. For a shard about to stop (its pool should
 *  read empty); returns how many were freed. */
ECT_API size_t ect_push_consumer_drop_spares(ect_push_consumer *c);

/** Fills *st. */
ECT_API void ect_push_consumer_stats(ect_push_consumer *c, ect_push_consumer_stat *st);

/** The shard's pool (for ect_pool_stats, ect_pool_mem_kind); its memfd
 *  (ect_pool_fd) lets a binding map the same bytes itself, so that views it
 *  hands out stay mapped after ect_push_consumer_close (a device pool has no
 *  fd: a binding allocates it itself and passes it as pool_memory). Owned by
 *  c. Any thread. */
ECT_API ect_pool *ect_push_consumer_pool(ect_push_consumer *c);

/*
 * ect_push_scheduler: the consumer instance's scheduler. It learns readiness
 * events from every shard (PULL connected to each shard's event port; the
 * shards are discovered with `peers` and `event_port` on a background
 * thread, so an unreachable consumer never blocks the caller) and counts an
 * item as arrived only when every shard reported it. Per transfer:
 * WAITING_EVENT -> AVAILABLE -> LOADING -> READY -> RESIDENT, or
 * UNAVAILABLE (no event from all shards within push_wait_ms; retryable),
 * EXPIRED (not loaded within ttl_ms), CANCELLED, FAILED (an abandoned event
 * or shards that disagree). Leaving a live state for a tombstone sends a
 * cancel to every shard (cancel_attempts tries, a retry only to the shards
 * that failed) from a background thread.
 *
 * Threading: every function except _open and _close must be called from one
 * thread at a time (the scheduler's); none blocks on the network.
 */
typedef struct ect_push_scheduler ect_push_scheduler;

typedef enum ect_push_state {
    ECT_PUSH_WAITING_EVENT = 1,
    ECT_PUSH_AVAILABLE,
    ECT_PUSH_LOADING,
    ECT_PUSH_READY,
    ECT_PUSH_RESIDENT,
    ECT_PUSH_UNAVAILABLE,
    ECT_PUSH_EXPIRED,
    ECT_PUSH_CANCELLED,
    ECT_PUSH_FAILED,
} ect_push_state;

/** "WAITING_EVENT", ...; "?" outside the enum. */
ECT_API const char *ect_push_state_name(ect_push_state s);

typedef struct ect_push_scheduler_opts {
    const char *consumer_host; /* host of the consumer instance's shards; default "127.0.0.1" */
    int consumer_port;         /* control port of any shard of the instance (rank 0 is
                                  ec_port + dp_index x tp_size); default 14579 */
    int tp_size;               /* shards of the instance, 1..64, default 1; discovery
                                  waits until `peers` reports exactly this many */
    uint64_t push_wait_ms;     /* WAITING_EVENT -> UNAVAILABLE, default 60000 */
    uint64_t ttl_ms;           /* AVAILABLE -> EXPIRED and tombstone lifetime, default 300000 */
    size_t max_tombstones;     /* default 65536 */
    double control_timeout_s;  /* REQ timeout, default 30; max(1, ceil(s x 1000)) ms */
    unsigned cancel_attempts;  /* sends per shard for one cancel, default 2 */
    uint64_t min_drain_interval_ms; /* poll() drains events at most this often, default 5 */
    int accept_any;                 /* nonzero: a transfer reported by every shard is accepted
                                       (expected on arrival) even if never expected; default 0 */
    const char *curve_keys;         /* key directory (docs/SECURITY.md, `ect keygen`): with it,
                                       every ZMQ socket speaks CurveZMQ and every data-plane
                                       session starts with a key handshake; a peer without an
                                       accepted key gets nothing. NULL (default): off, plain
                                       ZMQ as upstream speaks it. Copied at open */
    uint64_t recheck_ms;            /* a lost readiness event cannot lose an item: a transfer
                                       still waiting this long is asked for with `status` on
                                       every shard that has not reported it (then after 2x, 4x,
                                       8x this), and a ready answer counts as that shard's
                                       event (docs/PROTOCOL.md "Lost events"); with accept_any,
                                       each shard is also asked every recheck_ms for the items
                                       ready on it for that long (`ect_ready`, an extension
                                       upstream shards refuse: then not asked again), so an
                                       item whose every event was lost still arrives. Default
                                       1000; 0: off (events only, as upstream) */
} ect_push_scheduler_opts;

/** What the scheduler knows of one transfer. */
typedef struct ect_push_sched_item {
    char transfer_id[ECT_TRANSFER_ID_LEN];
    ect_push_state state;
    int retryable;     /* UNAVAILABLE, EXPIRED: the request may be retried */
    uint32_t reported; /* shards that reported it ready */
    char mm_hash[ECT_MM_HASH_LEN];
    uint64_t nbytes;
    uint32_t ndim;
    uint64_t shape[ECT_POOL_MAX_NDIM];
    char dtype[ECT_DTYPE_LEN];
    char error[ECT_SCHED_ERROR_LEN]; /* why FAILED / UNAVAILABLE / EXPIRED */
} ect_push_sched_item;

typedef struct ect_push_scheduler_stat {
    uint32_t shards;         /* shards discovered (0 until discovery succeeded) */
    uint64_t events;         /* events applied */
    uint64_t bad_frames;     /* undecodable event frames (each cost only itself) */
    uint64_t late_events;    /* for cancelled / finished transfers, ignored */
    uint64_t cancels_sent;   /* remote cancels answered */
    uint64_t cancels_failed; /* attempts that failed */
    uint64_t live, tombstones;
    uint64_t rechecks;  /* `status` questions sent for items whose events were missing */
    uint64_t recovered; /* shard reports learnt from `status`, not from an event (each
                           one a lost or late event) */
    uint64_t listed;    /* accept_any: items that became known only from a shard's
                           `ect_ready` listing (every event of them lost; docs/PROTOCOL.md
                           "Lost events: the scheduler lists what is ready") */
} ect_push_scheduler_stat;

/** Fills the defaults above. */
ECT_API void ect_push_scheduler_opts_init(ect_push_scheduler_opts *opts);

/** Creates the table and starts discovery in the background; returns at
 *  once. Caller owns *out (ect_push_scheduler_close). Errors: ECT_EINVAL
 *  naming the option; ECT_ENOMEM; ECT_EIO. */
ECT_API int ect_push_scheduler_open(const ect_push_scheduler_opts *opts, ect_push_scheduler **out);

/** ect_push_scheduler_open from a JSON object (see "configuration as JSON
 *  text"). Reads ec_ip (consumer_host), ec_port, dp_index and tp_size
 *  (consumer_port = ec_port + dp_index x tp_size, which must be >= 1),
 *  push_wait_timeout_s (push_wait_ms = ceil(s x 1000)), control_timeout_s,
 *  and its own keys ttl_ms, max_tombstones, cancel_attempts,
 *  min_drain_interval_ms, recheck_ms (integers) and accept_any (true /
 *  false). Caller
 *  owns *out. */
ECT_API int ect_push_scheduler_open_config(const char *json, ect_push_scheduler **out);

/** Stops the background thread (an exchange in flight may take up to the
 *  control timeout to give up) and frees everything. Accepts NULL. */
ECT_API void ect_push_scheduler_close(ect_push_scheduler *s);

/** Waits for transfer_id (mm_hash may be NULL): its push wait starts now.
 *  Errors: ECT_EINVAL bad id; ECT_EEXIST already expected or finished. */
ECT_API int ect_push_scheduler_expect(ect_push_scheduler *s, const char *transfer_id,
                                      const char *mm_hash);

/** Drains pending events without blocking, applies timeouts and collects
 *  the results of background cancels. Returns the number of events applied
 *  (>= 0), or ECT_ENOMEM. */
ECT_API int ect_push_scheduler_poll(ect_push_scheduler *s);

/** ect_push_scheduler_poll that blocks: when no arrived transfer is waiting
 *  for ect_push_scheduler_next, waits up to timeout_ms (0: not at all) for a
 *  readiness event (cut short by the next lost-event recheck), then drains
 *  whatever came, ignoring min_drain_interval_ms. Returns as poll does; 0
 *  after a timeout with nothing new. ECT_EINVAL for a NULL scheduler or a
 *  negative timeout. Lets a consumer loop sleep until an item lands instead
 *  of polling on a timer (ect push-consumer does). */
ECT_API int ect_push_scheduler_wait(ect_push_scheduler *s, int timeout_ms);

/** Fills *item for transfer_id. ECT_ENOTFOUND when unknown. */
ECT_API int ect_push_scheduler_state(ect_push_scheduler *s, const char *transfer_id,
                                     ect_push_sched_item *item);

/** The next transfer that arrived on every shard (AVAILABLE), moved to
 *  LOADING; fills *item. ECT_ENOTFOUND when none is waiting. */
ECT_API int ect_push_scheduler_next(ect_push_scheduler *s, ect_push_sched_item *item);

/** LOADING -> READY -> RESIDENT once the engine took the item (and released
 *  it to the resident cache). ECT_ESTATE from another state. */
ECT_API int ect_push_scheduler_loaded(ect_push_scheduler *s, const char *transfer_id);

/** The next transfer that ended badly since the last call, oldest first:
 *  FAILED (abandoned by the producer, shards that disagree), UNAVAILABLE
 *  (not on every shard within push_wait_ms; in accept_any mode also an item
 *  some shards reported and the others never did) or EXPIRED (not loaded
 *  within ttl_ms); item->error says why. Failures the engine reported with
 *  ect_push_scheduler_fail are not listed. At most 4096 wait (the oldest is
 *  dropped). ECT_ENOTFOUND when none. */
ECT_API int ect_push_scheduler_next_failed(ect_push_scheduler *s, ect_push_sched_item *item);

/** Marks transfer_id failed (a load that went wrong); cancels it on every
 *  shard. */
ECT_API int ect_push_scheduler_fail(ect_push_scheduler *s, const char *transfer_id,
                                    const char *reason);

/** RESIDENT -> CANCELLED (the request is finished) without telling the
 *  shards: use it when the engine released the item on every rank with
 *  ect_push_consumer_release, which already ended the reservation there, so
 *  a remote cancel per shard would only cost round trips. Otherwise use
 *  ect_push_scheduler_cancel. ECT_ENOTFOUND unknown; ECT_ESTATE not RESIDENT
 *  (nothing changes). */
ECT_API int ect_push_scheduler_finished(ect_push_scheduler *s, const char *transfer_id);

/** Any state -> CANCELLED (request freed or finished); queues a cancel to
 *  every shard, sent by the background thread. Idempotent on finished
 *  transfers. ECT_ENOTFOUND when unknown. */
ECT_API int ect_push_scheduler_cancel(ect_push_scheduler *s, const char *transfer_id);

/** Fills *st. */
ECT_API void ect_push_scheduler_stats(ect_push_scheduler *s, ect_push_scheduler_stat *st);

/* --------------------------------------- generation 2: producer side */

/*
 * Push producer (generation 2, SPEC "Producer side"): pushes encoder outputs
 * into the reservations of a consumer instance's shards (one per TP rank).
 *
 * Per item: reserve on EVERY shard (shards discovered through `peers` at the
 * consumer's base address and cached; the shard count and the consumer's
 * transport are checked there, before anything is reserved), stage the
 * source once, one batched ect_xport_write_batch per destination session
 * (sessions concurrently), complete per shard. A shard whose pool is full is
 * back-pressure, not a failure (see push_wait_ms): the item waits and
 * reserves again. A shard that fails otherwise makes the item fail and the
 * reservations already made on the other shards are abandoned (cancel with
 * abandon). A reservation older than refresh_after_ms is refreshed before the
 * write. The data plane (tcp, shm, ucx) is the one each shard names in its
 * reserve reply; the producer opens that initiator on first use.
 *
 * Steps: ect_push_producer_reserve only queues; ect_push_producer_flush ends
 * the step and hands every queued item to the dispatcher at once, which sends
 * ONE reserve_batch per shard, ONE write_batch per destination session and
 * ONE complete_batch per shard for the whole step (plus one `peers` per
 * consumer the first time), so k items cost the same number of control round
 * trips per shard as one.
 *
 * Threading: one dispatcher thread per producer owns the push records, the
 * transports and a control client; when a round has batches for several
 * shards, each shard address's batch runs on that address's lane thread
 * (started on first use, owning its own REQ socket), so the shards are asked
 * in parallel; an address's complete_batch ops run on a second lane of their
 * own, so the completes of one step travel beside the next step's reserve
 * (steps in flight; order per address is kept); write batches to different sessions run on
 * short-lived helper threads. Every ect_push_producer_* call except _open and _close is safe from
 * any thread at once and never waits on the network (the only wait is ect_push_producer_poll's
 * timeout, chosen by the caller; _flush_poll may run a lone step's work meanwhile, see there).
 * _close must not race with any other call.
 *
 * Finished transfers (done, failed, cancelled) are reported once each by
 * ect_push_producer_poll; until polled, results wait in a queue that grows
 * with them (poll regularly). A transfer_id is accepted once: again while in
 * flight or within ttl_ms after it finished, reserve answers ECT_EEXIST.
 */
typedef struct ect_push_producer ect_push_producer;

/** Called once the producer no longer reads a borrowed source (after every
 *  reserve, write and complete of its transfer settled, or when the push
 *  failed or was cancelled). Runs on one of the producer's own threads (the
 *  dispatcher, or the control lane that settled the transfer's last
 *  exchange; never inside _flush), inside a waiting _flush_poll that ran the
 *  step (see there), or on the caller's thread from _cancel of
 *  an unflushed item or from _close; it must not call ect_push_producer_*
 *  functions of the same producer. */
typedef void (*ect_push_release_fn)(void *user, const void *data, uint64_t nbytes);

typedef struct ect_push_producer_opts {
    uint64_t staging_size;     /* bytes of the staging pool that copied sources live in
                                  until written; default 256 MiB; 0 = borrow only */
    int control_timeout_ms;    /* each control exchange, 1..3600000; default 30000 (SPEC).
                                  Waited out only for a consumer that is connected but
                                  silent: a refused connect or a connection the consumer
                                  closes fails the exchange at once. Exchanges run on one
                                  thread per consumer shard address, so one consumer's
                                  slow exchanges never delay pushes to the others */
    uint64_t refresh_after_ms; /* refresh a reservation older than this before writing;
                                  default 150000 (SPEC) */
    uint64_t input_wait_ms;    /* fail an item whose source is not staged by then;
                                  default 300000 */
    uint64_t ttl_ms;           /* finished transfer_ids are refused this long (dedup);
                                  default 300000 */
    size_t max_tombstones;     /* at most this many finished ids remembered; default 65536 */
    int connect_timeout_ms;    /* data plane: passed to the transports; default 5000 */
    int io_timeout_ms;         /* data plane: a write making no progress this long fails;
                                  default 30000 */
    const char *listen_host;   /* where the producer's own transports listen (they must
                                  open a target): default "127.0.0.1"; copied */
    const char *transport;     /* NULL or "" (default): use whatever data plane each shard
                                  names in its reserve reply; else "tcp", "shm" or "ucx":
                                  an item whose shard names another fails (its reservations
                                  abandoned) without writing; copied */
    int down_backoff_ms;       /* a consumer whose control exchange failed (timeout,
                                  connection refused or closed) is held down this long:
                                  its pushes fail at once with "consumer HOST:PORT
                                  unreachable: <last failure>"; then one probe goes out,
                                  and each further failure doubles the period; success
                                  ends it. 1..3600000; default 1000 */
    int down_backoff_max_ms;   /* the doubling stops here; down_backoff_ms..3600000;
                                  default 30000 */
    uint64_t push_wait_ms;     /* back-pressure: a reserve a shard refuses with "EC consumer
                                  buffer pool is full" is not a failure. The item stays
                                  staged, gives back its reservations on the other shards
                                  (so no two items can each hold what the other waits for)
                                  and reserves again after a backoff (2 ms doubling to
                                  200 ms). Items the consumer got later wait behind it, so
                                  the order holds; other consumers are not slowed. An item
                                  still without room push_wait_ms after its _reserve fails
                                  with "the consumer's pool stayed full for N ms ...".
                                  Upstream push_wait_timeout_s; 1..86400000; default 60000 */
    uint64_t staging_wait_ms;  /* a copied source (release NULL) that does not fit in the
                                  staging pool makes _reserve / _stage wait up to this long
                                  for room (pushes in flight free it as their writes land),
                                  after handing this thread's unflushed items to the
                                  dispatcher so they can drain; then ECT_EFULL. 0: fail at
                                  once. At most 3600000; default 60000 */
    uint32_t expect_shards;    /* 0 (default): any; else the consumer must report exactly this
                                  many shards (TP ranks): an item for one that reports
                                  another number fails before anything is reserved */
    const char *curve_keys;    /* key directory (docs/SECURITY.md, `ect keygen`): with it,
                                  every ZMQ socket speaks CurveZMQ and every data-plane
                                  session starts with a key handshake; a peer without an
                                  accepted key gets nothing. NULL (default): off, plain
                                  ZMQ as upstream speaks it. Copied at open */
} ect_push_producer_opts;

/** One item to push. Every pointer is read during the call only, except
 *  `data` when `release` is set (borrowed until release fires). */
typedef struct ect_push_item {
    const char *transfer_id; /* unique per push, 1..255 bytes */
    const char *consumer;    /* the consumer's control address "HOST:PORT" (TP rank 0) */
    const char *mm_hash;     /* content hash, 1..255 bytes (the consumer dedups on it) */
    const uint64_t *shape;
    size_t ndim;       /* 0..8 */
    const char *dtype; /* torch dtype name, "bfloat16" or "torch.bfloat16" */
    uint64_t nbytes;   /* must equal product(shape) x dtype size */
    /* The source, or NULL to stage it later with ect_push_producer_stage.
     * It may be CUDA device memory (found out from the pointer when the
     * process has the CUDA driver loaded; synchronize the stream that wrote
     * it first). */
    const void *data;
    /* NULL: `data` is copied once into the staging pool during the call and
     * the caller keeps its buffer (a device source: one device-to-host copy,
     * into staging that is pinned on first use). Else `data` is borrowed
     * (zero copy): it must stay valid and unchanged until
     * release(release_user, data, nbytes) fires, which it does exactly once
     * if the call succeeded and never if it failed. A borrowed device source
     * crosses tcp/ucx with one device-to-host copy into pinned memory, and
     * shm with none (device-to-device into a CUDA pool through CUDA IPC). */
    ect_push_release_fn release;
    void *release_user;
} ect_push_item;

/** Outcome of one transfer. status: 0 done on every shard, ECT_ECANCELED
 *  cancelled (by _cancel or by the consumer), else the error (text in
 *  `error`). latency_ns: from _reserve to the outcome. shards: the
 *  consumer's shards (TP ranks) the item went to, 0 when discovery failed.
 *  transport: the data plane the bytes went over, "" when nothing was
 *  written (every shard answered `cached`, or it failed before writing). */
typedef struct ect_push_result {
    char transfer_id[ECT_TRANSFER_ID_LEN];
    int status;
    char error[ECT_RESULT_ERROR_LEN];
    uint64_t latency_ns;
    uint32_t shards;
    char transport[ECT_TRANSPORT_LEN];
    uint32_t retries; /* reserve rounds the consumer refused as full before the outcome
                         (back-pressure, see push_wait_ms); 0 when room was there */
} ect_push_result;

/** Counters since open (for benchmarks and tests). */
typedef struct ect_push_producer_stats {
    uint64_t steps;            /* flushes that handed over at least one item */
    uint64_t control_requests; /* control exchanges sent (every op) */
    uint64_t reserve_batches, complete_batches, write_batches, peers_requests, cancels;
    uint64_t done, failed, cancelled, refreshes;
    uint64_t staged_bytes_in_use; /* staging pool bytes held now */
    uint64_t full_refusals;       /* reserves a shard refused as full (one per shard) */
    uint64_t retries;             /* reserve rounds started again after such a refusal */
    uint64_t give_backs;          /* reservations given back meanwhile */
    uint64_t staging_waits;       /* _reserve / _stage calls that waited for staging room */
    uint64_t puts;                /* lone items sent as one ect_put into a spare range the shard
                                     granted ahead (docs/PROTOCOL.md); counted in control_requests */
    uint64_t put_refusals;        /* ... refused (or their write failed): reserved the normal way */
} ect_push_producer_stat;

/** Fills the defaults above. */
ECT_API void ect_push_producer_opts_init(ect_push_producer_opts *opts);

/** Validates opts (ECT_EINVAL naming the field), creates the staging pool and
 *  starts the dispatcher. opts may be NULL for the defaults. Caller owns *out
 *  (ect_push_producer_close); *out is NULL on failure. */
ECT_API int ect_push_producer_open(const ect_push_producer_opts *opts, ect_push_producer **out);

/** ect_push_producer_open from a JSON object (see "configuration as JSON
 *  text"). Reads ec_buffer_size (staging_size), control_timeout_s
 *  (control_timeout_ms = max(1, ceil(s x 1000)), as upstream converts it),
 *  push_wait_timeout_s (push_wait_ms, converted the same way), transport,
 *  and its own keys refresh_after_ms, input_wait_ms, ttl_ms,
 *  max_tombstones, connect_timeout_ms, io_timeout_ms, down_backoff_ms,
 *  down_backoff_max_ms, staging_wait_ms, expect_shards (integers) and
 *  listen_host (string). The consumer's
 *  address comes with each item, so ec_ip and ec_port are not read. Caller
 *  owns *out. */
ECT_API int ect_push_producer_open_config(const char *json, ect_push_producer **out);

/** Queues an item for the current step; nothing is sent until
 *  ect_push_producer_flush. A copied source (release NULL) goes into the
 *  staging pool on the calling thread; when the pool is full the call hands
 *  every unflushed item to the dispatcher (an early end of the step, so they
 *  can drain) and waits up to opts.staging_wait_ms for room. Errors:
 *  ECT_EINVAL naming the field; ECT_EEXIST transfer_id already pushed
 *  (dedup); ECT_EFULL the staging pool stayed full (or the item is larger
 *  than it); ECT_ECLOSED closing; ECT_ENOMEM. Any thread; never blocks on
 *  the network (only the staging wait above, bounded by its option). */
ECT_API int ect_push_producer_reserve(ect_push_producer *p, const ect_push_item *item);

/** Stages the source of an item queued without `data` (same copy / borrow
 *  rules as ect_push_item; a full staging pool waits as _reserve does). The
 *  writes go out with the next flush. Errors: ECT_ENOTFOUND unknown
 *  transfer_id; ECT_ESTATE already staged or finished; ECT_EINVAL nbytes
 *  differs from the item's; ECT_EFULL; ECT_ENOMEM. */
ECT_API int ect_push_producer_stage(ect_push_producer *p, const char *transfer_id, const void *data,
                                    uint64_t nbytes, ect_push_release_fn release,
                                    void *release_user);

/** Ends the step: hands every item and stage queued since the last flush to
 *  the dispatcher, which batches them per shard and per session. Returns the
 *  number of items handed over, or ECT_ECLOSED. Any thread; non-blocking. */
ECT_API int ect_push_producer_flush(ect_push_producer *p);

/** _flush, then _poll(p, out, max, timeout_ms) into *polled, in one call:
 *  for a caller that waits for its step right away (the latency case, one
 *  step in flight). When the step is lone (nothing else in flight, no result
 *  unpolled) and timeout_ms != 0, the flush leaves the step's control
 *  exchange to this call instead of waking the address's lane thread, and
 *  the wait runs the step itself on the calling thread: the exchange on the
 *  lane's connection, the write, the complete, the result and the step's
 *  release callbacks. A lone step then crosses no thread (two wake-ups
 *  fewer than _flush + _poll). Release callbacks may therefore run inside
 *  this call (never inside _reserve or _flush). The network never holds the
 *  call much past its timeout: an exchange still waiting for its reply then
 *  is handed back to the lane thread, which goes on reading it with its own
 *  control timeout and outcome. Steps in flight, max 0 or timeout_ms 0:
 *  exactly _flush then _poll. Not with CurveZMQ keys (curve_keys): their
 *  sockets belong to the lane threads, so the step goes there. Returns what
 *  _flush returns (items flushed, or ECT_ECLOSED: then nothing is polled);
 *  ECT_EINVAL for a NULL p or polled, or out NULL with max > 0. Any thread. */
ECT_API int ect_push_producer_flush_poll(ect_push_producer *p, ect_push_result *out, size_t max,
                                         int timeout_ms, size_t *polled);

/** Cancels a transfer: an unflushed one ends at once; one in flight is
 *  abandoned on its shards once its actions in flight settled. It is reported
 *  by poll with ECT_ECANCELED (unless it finished first). Errors:
 *  ECT_ENOTFOUND (unknown or already finished). Any thread; non-blocking. */
ECT_API int ect_push_producer_cancel(ect_push_producer *p, const char *transfer_id);

/** Moves up to max finished transfers into out, waiting up to timeout_ms
 *  (0: do not wait, -1: forever) for at least one. Returns how many. Any
 *  thread.
 *
 *  A plain poll only waits; ect_push_producer_flush_poll is the call that
 *  may run a lone step on the calling thread (see there). */
ECT_API size_t ect_push_producer_poll(ect_push_producer *p, ect_push_result *out, size_t max,
                                      int timeout_ms);

/** Items queued or in flight that have not finished yet (finished ones wait in
 *  poll's queue and no longer count). Any thread. */
ECT_API size_t ect_push_producer_pending(ect_push_producer *p);

/** Fills *st. Any thread. */
ECT_API void ect_push_producer_stats(ect_push_producer *p, ect_push_producer_stat *st);

/** Stops the dispatcher, cuts short every control exchange in progress (its
 *  reply is not waited for), waits for the data-plane writes in flight (each
 *  up to io_timeout_ms: they read the sources), fails what is still in
 *  flight with ECT_ECLOSED without contacting the consumer (its reservations
 *  end by their TTL), fires every pending release callback, closes the
 *  transports and frees p. Accepts NULL. */
ECT_API void ect_push_producer_close(ect_push_producer *p);

/* ------------------------------------------------------ generation 1 */

/*
 * Generation 1 (pull). A producer announces items over ZMQ PUB/SUB and serves
 * pulls over ROUTER; a consumer scheduler learns what is available without
 * blocking; a consumer pulls an item and the producer writes it into the
 * consumer's registered pool through the data plane. Wire formats:
 * docs/PROTOCOL.md ("Generation 1: pull").
 *
 * Threading: each handle is thread-compatible, not thread-safe, except where
 * a function says otherwise. A scheduler's and a consumer's ZMQ sockets are
 * owned by the thread that calls them (use each from one thread at a time).
 * A producer runs three kinds of thread of its own: the save thread (owns the
 * PUB socket), the ROUTER thread (owns the ROUTER socket) and one write lane
 * per consumer session (started on demand, ended after 5 s idle), so one slow
 * or absent consumer never delays another.
 */

/** What a scheduler knows of an available item (and what load needs). */
typedef struct ect_pull_meta {
    uint64_t nbytes;
    uint32_t ndim;
    uint64_t shape[ECT_POOL_MAX_NDIM];
    char dtype[ECT_POOL_DTYPE_MAX];               /* as announced, e.g. "torch.bfloat16" */
    char producer_session_id[ECT_SESSION_ID_LEN]; /* the producer start that announced it */
} ect_pull_meta;

typedef struct ect_pull_producer ect_pull_producer;

typedef struct ect_pull_producer_opts {
    const char *host;          /* ec_ip to bind ROUTER and PUB on; default "127.0.0.1"; copied */
    int port;                  /* ec_port: ROUTER on port, PUB on port + 1; default 14579;
                                  0 = an ephemeral pair (ect_pull_producer_port tells it) */
    const char *transport;     /* data plane back end: "tcp" (default), "shm", "ucx" */
    const char *xport_listen;  /* tcp/ucx listen address; default "HOST:0" */
    uint64_t pool_size;        /* producer pool bytes (memfd); default 1,000,000,000 */
    uint64_t alignment;        /* default 64 (generation 1) */
    int connect_timeout_ms;    /* data-plane connect to a consumer; default 3000 */
    int io_timeout_ms;         /* data-plane write without progress; default 10000 */
    uint32_t max_lanes;        /* consumer sessions served at once; default 256; a pull for
                                  a new session beyond it is refused with ECT_EBUSY */
    uint32_t page_items;       /* items per ECTransferReady, 1..4096; default 4096 */
    uint64_t max_queued_bytes; /* bytes saved but not yet stored by the save thread;
                               default 1 GiB; a save that would pass it (unless nothing
                               waits) is refused with ECT_EBUSY */
    const char *connect_allow; /* where a pull may make this producer write (the host of an
                                  ECTransferPull's consumer_session_id): NULL (default) =
                                  only the IP address the pull came from; "*" = anywhere;
                                  else a comma-separated list of IP addresses. shm sessions
                                  are same-host and always allowed. Others are refused with
                                  ECT_EACCES before any connect. Copied */
    const char *curve_keys;    /* key directory (docs/SECURITY.md, `ect keygen`): with it,
                                  every ZMQ socket speaks CurveZMQ and every data-plane
                                  session starts with a key handshake; a peer without an
                                  accepted key gets nothing. NULL (default): off, plain
                                  ZMQ as upstream speaks it. Copied at open */
    /* Of max_lanes, the lanes (consumer sessions served at once) that pulls
     * from one peer IP address may hold; default 32. A pull for a new session
     * beyond it is refused with ECT_EBUSY, so a peer naming many sessions
     * that never answer (tarpits) cannot take the lanes other peers need. */
    uint32_t max_lanes_per_peer;
} ect_pull_producer_opts;

typedef struct ect_pull_producer_stat {
    uint64_t saved;         /* items copied into the pool and published */
    uint64_t save_failed;   /* items dropped by the save thread (pool full, bad input) */
    uint64_t notifications; /* ECHashNotification messages published */
    uint64_t pulls_ok;      /* ECTransferComplete with status 0 */
    uint64_t pulls_failed;  /* ECTransferComplete with a non-zero status */
    uint64_t malformed;     /* ROUTER frames dropped as malformed */
    uint64_t requests;      /* ECTransferRequest answered */
    uint64_t evicted;       /* items reclaimed from the pool (least recently used) */
    uint64_t lanes;         /* write lanes running now */
} ect_pull_producer_stat;

/** Called once when the producer no longer needs the bytes given to
 *  ect_pull_producer_save (on the save thread, or in ect_pull_producer_close
 *  for items still queued). */
typedef void (*ect_pull_release_fn)(void *user, const void *data);

/** Fills the defaults above. */
ECT_API void ect_pull_producer_opts_init(ect_pull_producer_opts *opts);

/** Opens the pool (memfd), the data plane (registers the pool), binds ROUTER
 *  and PUB and starts the save and ROUTER threads, with a fresh random
 *  session id. Caller owns *out. Errors: ECT_EINVAL naming the bad option;
 *  ECT_EIO when a port cannot be bound; pool and transport errors. */
ECT_API int ect_pull_producer_open(const ect_pull_producer_opts *opts, ect_pull_producer **out);

/** ect_pull_producer_open from a JSON object (see "configuration as JSON
 *  text"). Reads ec_ip (host), ec_port (port), ec_buffer_size (pool_size),
 *  transport, and its own keys xport_listen and connect_allow (strings),
 *  alignment, connect_timeout_ms, io_timeout_ms, max_lanes,
 *  max_lanes_per_peer, page_items, max_queued_bytes (integers). Caller owns
 *  *out. */
ECT_API int ect_pull_producer_open_config(const char *json, ect_pull_producer **out);

/** Queues an item and returns at once. data may be CUDA device memory (see
 *  ect_push_item.data). With release == NULL the bytes are
 *  copied before returning (a heap snapshot); otherwise they are borrowed and
 *  must stay unchanged until release(user, data) is called. The save thread
 *  then copies them into the pool (reclaiming least-recently-used items when
 *  it needs room) and publishes them, several per ECHashNotification when
 *  they are ready together. Saving a hash that is already held re-announces
 *  it. Errors (release is then never called): ECT_EINVAL (empty or over-long
 *  mm_hash, unknown dtype, shape/dtype not matching nbytes, nbytes 0, NULL
 *  data); ECT_ENOMEM; ECT_EBUSY when the bytes waiting for the save thread
 *  would pass opts.max_queued_bytes; ECT_ECLOSED while closing. Safe from
 *  any thread. */
ECT_API int ect_pull_producer_save(ect_pull_producer *p, const char *mm_hash, const void *data,
                                   uint64_t nbytes, const uint64_t *shape, size_t ndim,
                                   const char *dtype, ect_pull_release_fn release, void *user);

/** Waits until every item saved before the call is published or dropped.
 *  ECT_ETIMEDOUT after timeout_ms. Safe from any thread. */
ECT_API int ect_pull_producer_flush(ect_pull_producer *p, int timeout_ms);

/** The bound ec_port (ROUTER; PUB is port + 1). */
ECT_API int ect_pull_producer_port(const ect_pull_producer *p);
/** This start's producer_session_id (32 hex chars). Owned by p. */
ECT_API const char *ect_pull_producer_session_id(const ect_pull_producer *p);
/** The producer's pool (for ect_pool_stats). Owned by p. */
ECT_API ect_pool *ect_pull_producer_pool(ect_pull_producer *p);
/** Fills *st. Safe from any thread. */
ECT_API void ect_pull_producer_stats(ect_pull_producer *p, ect_pull_producer_stat *st);

/** Closes in the spec's order: poison-pills the save queue and joins the
 *  save thread (5 s bound, releasing queued items), stops the ROUTER thread
 *  and the write lanes (a write in progress ends within the data plane's
 *  timeouts), unregisters the pool, closes the data plane and the sockets
 *  (LINGER 0), terminates the ZMQ context, unmaps the pool. Accepts NULL. */
ECT_API void ect_pull_producer_close(ect_pull_producer *p);

typedef struct ect_pull_scheduler ect_pull_scheduler;

typedef struct ect_pull_scheduler_opts {
    const char *producer;   /* "HOST:PORT" of the producer's ec_port; required; copied */
    int request_retry_ms;   /* re-ask the inventory when unanswered this long; default 2000 */
    const char *curve_keys; /* key directory (docs/SECURITY.md, `ect keygen`): with it,
                               every ZMQ socket speaks CurveZMQ and every data-plane
                               session starts with a key handshake; a peer without an
                               accepted key gets nothing. NULL (default): off, plain
                               ZMQ as upstream speaks it. Copied at open */
} ect_pull_scheduler_opts;

typedef struct ect_pull_scheduler_stat {
    uint64_t notifications;   /* ECHashNotification received */
    uint64_t ready_pages;     /* ECTransferReady received */
    uint64_t malformed;       /* frames dropped (SUB or DEALER) */
    uint64_t session_changes; /* producer restarts seen (its hashes forgotten) */
    uint64_t available;       /* hashes known now */
    int synced;               /* 1 once the inventory answer of the current session arrived */
} ect_pull_scheduler_stat;

ECT_API void ect_pull_scheduler_opts_init(ect_pull_scheduler_opts *opts);

/** Connects SUB (producer port + 1, SUBSCRIBE "", RCVTIMEO 0) and a DEALER
 *  (port) and queues an ECTransferRequest for everything the producer already
 *  holds (answered asynchronously; nothing here blocks on the network). */
ECT_API int ect_pull_scheduler_open(const ect_pull_scheduler_opts *opts, ect_pull_scheduler **out);

/** ect_pull_scheduler_open from a JSON object (see "configuration as JSON
 *  text"): the producer is "ec_ip:ec_port" (both shared keys, the port
 *  1..65535); its own key request_retry_ms (integer). Caller owns *out. */
ECT_API int ect_pull_scheduler_open_config(const char *json, ect_pull_scheduler **out);

/** Drains every queued notification and inventory page without blocking,
 *  then answers: 1 and *meta filled (meta may be NULL) if mm_hash is
 *  available, 0 if not, or a negative ECT_E* code (ECT_EINVAL bad mm_hash). */
ECT_API int ect_pull_scheduler_has(ect_pull_scheduler *s, const char *mm_hash, ect_pull_meta *meta);

/** Drains like has() without asking. Returns 0. */
ECT_API int ect_pull_scheduler_poll(ect_pull_scheduler *s);

/** Calls fn for every available hash (after a poll). fn must not call the
 *  scheduler. Returns the number of hashes visited. */
ECT_API size_t ect_pull_scheduler_foreach(ect_pull_scheduler *s,
                                          void (*fn)(void *user, const char *mm_hash,
                                                     const ect_pull_meta *meta),
                                          void *user);

/** Forgets mm_hash (e.g. after a load failed with ECT_ENOTFOUND: evicted). */
ECT_API void ect_pull_scheduler_forget(ect_pull_scheduler *s, const char *mm_hash);

ECT_API void ect_pull_scheduler_stats(ect_pull_scheduler *s, ect_pull_scheduler_stat *st);

/** Closes the sockets (LINGER 0) and terminates the context. Accepts NULL. */
ECT_API void ect_pull_scheduler_close(ect_pull_scheduler *s);

typedef struct ect_pull_consumer ect_pull_consumer;

typedef struct ect_pull_consumer_opts {
    const char *producer;     /* "HOST:PORT" of the producer's ec_port; required; copied */
    const char *transport;    /* "tcp" (default), "shm", "ucx"; the producer's must match */
    const char *xport_listen; /* tcp/ucx listen address; default "127.0.0.1:0" */
    uint64_t pool_size;       /* consumer pool bytes (memfd); default 1,000,000,000 */
    uint64_t alignment;       /* default 64 */
    int timeout_ms;           /* wait for ECTransferComplete; default 60000 (RCVTIMEO) */
    int quarantine_ms;        /* how long a timed-out region stays unusable unless its late
                                 completion arrives first; default 60000 */
    const char *pool_device;  /* NULL or "cpu" (default), "pinned", "cuda" or "cuda:N": as
                                 ect_push_consumer_opts.pool_device; copied */
    void *pool_memory;        /* caller-owned memory of pool_size bytes, of pool_device's
                                 kind, aligned to `alignment`, used as the pool instead of
                                 allocating one; must outlive the consumer. A host buffer
                                 has no fd, so shm refuses it. Default NULL */
    const char *advertise;    /* host the producer is told in consumer_session_id instead of
                                 the listen host. NULL (default): the listen host; for a
                                 wildcard listen ("0.0.0.0", "::") the local address of the
                                 interface that routes to the producer. Copied */
    int data_port;            /* fixed tcp/ucx data-plane port; 0 (default): any free port.
                                 The listen host is xport_listen's, or 127.0.0.1 */
    const char *curve_keys;   /* key directory (docs/SECURITY.md, `ect keygen`): with it,
                                 every ZMQ socket speaks CurveZMQ and every data-plane
                                 session starts with a key handshake; a peer without an
                                 accepted key gets nothing. NULL (default): off, plain
                                 ZMQ as upstream speaks it. Copied at open */
    int max_conns;            /* data-plane connections served at once, 1..65536; default 512
                                 (ect_xport_opts.max_conns) */
    int max_conns_per_peer;   /* of those, from one peer IP address, 1..max_conns; default 64
                                 (ect_xport_opts.max_conns_per_peer) */
} ect_pull_consumer_opts;

/** A loaded item: valid, and leased in the consumer's pool, until
 *  ect_pull_consumer_release(mm_hash). */
typedef struct ect_pull_view {
    const void *data;
    uint64_t nbytes;
    uint32_t ndim;
    uint64_t shape[ECT_POOL_MAX_NDIM];
    char dtype[ECT_POOL_DTYPE_MAX];
    int cached;   /* 1 if it came from the pool's resident cache (no transfer) */
    int mem_kind; /* ECT_MEM_HOST, _PINNED, or _CUDA: `data` is a device address */
    int device;   /* CUDA device ordinal of a device view */
} ect_pull_view;

typedef struct ect_pull_consumer_stat {
    uint64_t local;         /* loads answered by the resident cache */
    uint64_t remote;        /* loads pulled successfully */
    uint64_t failed;        /* pulls answered with a non-zero status */
    uint64_t timeouts;      /* pulls that timed out */
    uint64_t stale;         /* completions dropped as not this request's */
    uint64_t malformed;     /* undecodable frames dropped */
    uint64_t quarantined;   /* timed-out regions not yet freed */
    uint64_t producer_lost; /* times the connection to the producer was lost (each fails the
                               pull in flight and every later one at once, with that cause,
                               until the producer is reachable again) */
} ect_pull_consumer_stat;

ECT_API void ect_pull_consumer_opts_init(ect_pull_consumer_opts *opts);

/** Opens the pool (memfd), the data plane (registers the pool) and connects
 *  a DEALER to the producer. Caller owns *out. */
ECT_API int ect_pull_consumer_open(const ect_pull_consumer_opts *opts, ect_pull_consumer **out);

/** ect_pull_consumer_open from a JSON object (see "configuration as JSON
 *  text"): the producer is "ec_ip:ec_port" (port 1..65535); ec_buffer_size
 *  (pool_size), transport, ec_buffer_device (pool_device), and its own keys
 *  xport_listen and advertise (strings), data_port, alignment, timeout_ms,
 *  quarantine_ms, max_conns, max_conns_per_peer, pool_memory (integers).
 *  Caller owns *out. */
ECT_API int ect_pull_consumer_open_config(const char *json, ect_pull_consumer **out);

/** Loads mm_hash: from the resident cache if present, else allocates
 *  meta->nbytes, sends ECTransferPull (dst_ptr = pool base, dst_offset = the
 *  region's offset, plus a write key valid for that range and this pull
 *  only, and a fresh request token) and waits
 *  up to timeout_ms for the ECTransferComplete carrying the same mm_hash and
 *  token. On success the item is resident and leased and *view describes it.
 *  Errors: ECT_EINVAL (bad mm_hash or meta); ECT_EFULL (consumer pool full);
 *  ECT_ETIMEDOUT (no answer: the region is quarantined, see quarantine_ms);
 *  ECT_ECLOSED (the connection to the producer was lost, noticed at once
 *  from a closed connection or after a 5 s heartbeat timeout: the pull in
 *  flight fails and so does every later load, without waiting, until the
 *  producer is reachable again; stat.producer_lost counts the losses);
 *  the producer's non-zero status (ECT_ENOTFOUND unknown or evicted hash,
 *  ECT_EACCES / ECT_ERANGE write refused, ECT_ECONNREFUSED unreachable ...;
 *  the region is freed); ect_last_error() names the cause. */
ECT_API int ect_pull_consumer_load(ect_pull_consumer *c, const char *mm_hash,
                                   const ect_pull_meta *meta, ect_pull_view *view);

/** Loads n items as ect_pull_consumer_load does each, with every pull in
 *  flight at once: items resident in the cache are answered from it, and the
 *  ECTransferPull requests of the others all go out (each with its own
 *  region, write key and token) before any completion is awaited; the
 *  completions are taken in whatever order they arrive, so the n round trips
 *  overlap instead of following one another. Nothing new on the wire: the
 *  same messages as n loads (a producer answers each pull on its own; an
 *  upstream one, which echoes no token, is matched by mm_hash). metas: n
 *  entries (NULL: every item must be resident). timeout_ms bounds the wait
 *  for all of them, counted from the last request sent. statuses (n entries)
 *  gets 0 or item i's error as ect_pull_consumer_load would return it;
 *  views[i] is valid (and leased: release it) exactly when statuses[i] is 0.
 *  Returns 0 when every item loaded, else the first failed item's error,
 *  whose text ect_last_error() keeps; ECT_EINVAL (NULL arrays),
 *  ECT_ENOMEM. Like every call on a consumer, not thread-safe. */
ECT_API int ect_pull_consumer_load_many(ect_pull_consumer *c, size_t n,
                                        const char *const *mm_hashes, const ect_pull_meta *metas,
                                        ect_pull_view *views, int *statuses);

/** Drops the lease of a load; the item stays resident (reclaimed least
 *  recently used when the pool needs room). */
ECT_API int ect_pull_consumer_release(ect_pull_consumer *c, const char *mm_hash);

/** The consumer's pool. Owned by c. */
ECT_API ect_pool *ect_pull_consumer_pool(ect_pull_consumer *c);
ECT_API void ect_pull_consumer_stats(ect_pull_consumer *c, ect_pull_consumer_stat *st);

/** Unregisters the pool, closes the data plane, the DEALER (LINGER 0), the
 *  ZMQ context and the pool. Never waits for the producer. Accepts NULL. */
ECT_API void ect_pull_consumer_close(ect_pull_consumer *c);

#ifdef __cplusplus
}
#endif
#endif /* ECTRANSFER_H */
