/*
 * shm_wire — the messages of the shm transport (docs/PROTOCOL.md "shm"):
 * HELLO and its reply, BEGIN, GRANT (with its drop list and CUDA IPC
 * trailer) and DONE, each an encoder the sending side fills a buffer with
 * and a decoder the receiving side checks a received buffer with; and the
 * layout of the control segment both sides map. Pure: no I/O, never reads
 * past the length it was given, never trusts a count it did not check
 * against that length. The fuzz target fuzz/fuzz_shm_msg.c drives every
 * decoder with arbitrary bytes and wants whatever decodes to encode back to
 * the same bytes.
 *
 * Decoders return 0 or ECT_EPROTO with a detail naming the message.
 */
#ifndef ECT_SHM_WIRE_H
#define ECT_SHM_WIRE_H

#include <stddef.h>
#include <stdint.h>

#define SHM_MAGIC_HELLO 0x48534345u /* "ECSH" */
#define SHM_MAGIC_BEGIN 0x42534345u /* "ECSB" */
#define SHM_MAGIC_GRANT 0x47534345u /* "ECSG" */
#define SHM_MAGIC_DONE 0x44534345u  /* "ECSD" */
#define SHM_MAGIC_ID 0x49534345u    /* "ECSI" */
#define SHM_MAGIC_OFFER 0x4F534345u /* "ECSO" */
#define SHM_VERSION 1
/* HELLO flags (u16 at offset 6, formerly 0): bit 0 = the initiator has
 * data-plane keys and the handshake (xport/auth.h) follows the HELLO. */
#define SHM_HELLO_AUTH 1u
/* HELLO flags bit 1 = the initiator keeps a pool's memory file once per
 * connection (GRANT entries may then carry a file number, SHM_GF_FILE and
 * file drops; docs/PROTOCOL.md "shm", "Memory files once per connection"). */
#define SHM_HELLO_FILES 2u
/* HELLO flags bit 2 = the initiator accepts OFFERs (windows granted with no
 * BEGIN, docs/PROTOCOL.md "shm", "Offers"); a target that sends them sets
 * the same bit in its HELLO reply, and the initiator's ID message follows. */
#define SHM_HELLO_OFFERS 4u
#define SHM_CHUNK 250 /* writes per BEGIN; below SCM_MAX_FD (253) */
#define SHM_MAX_DROP 256
#define SHM_HELLO_LEN 8
#define SHM_HELLO_REPLY_LEN 12
#define SHM_DONE_LEN 8
#define SHM_ID_LEN 16
#define SHM_OENT 56 /* bytes of one OFFER entry: a GRANT entry, then the window's key */
#define SHM_OFFER_MAX (16 + SHM_OENT * SHM_CHUNK + 8 * SHM_MAX_DROP)
#define SHM_BENT 24 /* bytes of one BEGIN entry */
#define SHM_BEGIN_MAX (8 + SHM_BENT * SHM_CHUNK)
#define SHM_GENT 48    /* bytes of one GRANT entry */
#define SHM_IPC_LEN 88 /* bytes of one IPC trailer record */
#define SHM_GRANT_MAX (16 + SHM_GENT * SHM_CHUNK + 8 * SHM_MAX_DROP + SHM_IPC_LEN * SHM_CHUNK)

/* The control segment: one per connection, SHM_SLOTS slots of {u64 state,
 * u64 users} (state = (region id << 1) | 1 while registered, 0 after; users
 * = copies in progress), accessed with sequentially consistent atomics. */
#define SHM_SLOTS 1024
typedef struct shm_slot {
    uint64_t state;
    uint64_t users;
} shm_slot;
#define SHM_SEG_LEN (SHM_SLOTS * sizeof(shm_slot))

/* GRANT entry flags */
#define SHM_GF_FD 1u   /* the region's fd is attached (fds in entry order) */
#define SHM_GF_IPC 2u  /* the region is CUDA memory: its record is in the IPC trailer */
#define SHM_GF_FILE 4u /* no fd attached: the region lies in file `file`, attached before */
/* A drop list entry with this bit set names a file number (low 32 bits)
 * whose memory is gone, not a region id (region ids stay below 2^63). */
#define SHM_DROP_FILE (1ull << 63)

/* ---- HELLO (initiator -> target) and its reply (target -> initiator, with
 * the control segment's fd attached). */
void shm_hello_encode(uint8_t out[SHM_HELLO_LEN]);
int shm_hello_decode(const uint8_t *buf, size_t len);
/* The HELLO's flags (u16 at offset 6) of a HELLO or reply that decoded. */
uint16_t shm_hello_flags(const uint8_t *buf);
/* flags: 0, or SHM_HELLO_OFFERS towards an initiator that asked for them. */
void shm_hello_reply_encode(uint8_t out[SHM_HELLO_REPLY_LEN], uint16_t flags);
/* Also requires the reply's slot count to be SHM_SLOTS. */
int shm_hello_reply_decode(const uint8_t *buf, size_t len);

/* ---- ID (initiator -> target, once, right after a HELLO reply that set
 * SHM_HELLO_OFFERS): the initiator's id (non-zero), which producers name in
 * their reserve requests ("ect_shm_id"). */
void shm_id_encode(uint8_t out[SHM_ID_LEN], uint64_t id);
/* Checks magic, the reserved u32 (0), the exact length and id != 0. */
int shm_id_decode(const uint8_t *buf, size_t len, uint64_t *id);

/* ---- BEGIN (initiator -> target): up to SHM_CHUNK writes to grant. */
typedef struct shm_begin_entry {
    uint64_t addr, len, token;
} shm_begin_entry;
/* Writes n (1..SHM_CHUNK) entries into out (SHM_BEGIN_MAX bytes); returns
 * the message's length. */
size_t shm_begin_encode(uint8_t *out, const shm_begin_entry *e, uint32_t n);
/* Checks magic, n (1..SHM_CHUNK) and the exact length; *n on success. */
int shm_begin_decode(const uint8_t *buf, size_t len, uint32_t *n);
/* Entry i (< n) of a BEGIN that shm_begin_decode accepted. */
void shm_begin_entry_get(const uint8_t *buf, uint32_t i, shm_begin_entry *e);

/* ---- GRANT (target -> initiator): one entry per BEGIN entry, the drop
 * list, the IPC trailer. */
typedef struct shm_grant_entry {
    uint64_t key; /* OFFER only: the window's key (token) */
    int32_t status;
    uint32_t flags;
    uint64_t rid, raddr, rlen, fd_off;
    uint32_t slot;
    uint32_t file; /* 0, or the connection's number for the region's memory file */
    /* SHM_GF_IPC only: */
    const uint8_t *ipc_handle; /* 64 bytes (inside the message, when decoded) */
    uint64_t ipc_off;          /* the region's offset in its IPC allocation */
    uint64_t proc_token;       /* the target process's token */
    uint32_t device;           /* the target's device ordinal */
} shm_grant_entry;

typedef struct shm_grant {
    uint32_t n, ndrop, nfds;
    uint32_t stride;      /* bytes per entry: SHM_GENT (GRANT) or SHM_OENT (OFFER) */
    const uint8_t *drops; /* ndrop x u64 region ids */
} shm_grant;

/* Building a GRANT of n entries in buf (SHM_GRANT_MAX bytes): entry i; drop
 * k (< SHM_MAX_DROP) after the n entries; then shm_grant_finish writes the
 * header and appends the nipc IPC records (ipc, SHM_IPC_LEN bytes each, in
 * entry order) after the drops, and returns the message's length. */
void shm_grant_put_entry(uint8_t *buf, uint32_t i, const shm_grant_entry *e);
void shm_grant_put_drop(uint8_t *buf, uint32_t n, uint32_t k, uint64_t rid);
size_t shm_grant_finish(uint8_t *buf, uint32_t n, uint32_t ndrop, uint32_t nfds, const uint8_t *ipc,
                        uint32_t nipc);
/* Writes one IPC trailer record (SHM_IPC_LEN bytes) at rec. */
void shm_grant_put_ipc(uint8_t *rec, const uint8_t handle[64], uint64_t ipc_off,
                       uint64_t proc_token, uint32_t device);

/* Checks a GRANT of `len` bytes answering a BEGIN of n writes, with nfds
 * descriptors received alongside: magic, counts, flags, exact length and
 * the number of fd-flagged entries. 0 and *g filled, or ECT_EPROTO. */
int shm_grant_decode(const uint8_t *buf, size_t len, uint32_t n, int nfds, shm_grant *g);
/* Entry i (< g->n) of a GRANT that shm_grant_decode accepted. The IPC
 * record of entry i is found by counting the IPC-flagged entries before it,
 * so call it with increasing i and pass the running count in *ipc_seen. */
void shm_grant_entry_get(const uint8_t *buf, const shm_grant *g, uint32_t i, uint32_t *ipc_seen,
                         shm_grant_entry *e);

/* ---- OFFER (target -> initiator, answers nothing): n (1..SHM_CHUNK)
 * windows granted with no BEGIN, each entry a GRANT entry (status 0, flags
 * SHM_GF_FD or SHM_GF_FILE) followed by the window's u64 key, then the drop
 * list as in a GRANT; no IPC trailer. Built like a GRANT: entry i, drop k
 * after the n entries, then shm_offer_finish writes the header and returns
 * the message's length. */
void shm_offer_put_entry(uint8_t *buf, uint32_t i, const shm_grant_entry *e);
void shm_offer_put_drop(uint8_t *buf, uint32_t n, uint32_t k, uint64_t rid);
size_t shm_offer_finish(uint8_t *buf, uint32_t n, uint32_t ndrop, uint32_t nfds);
/* Checks an OFFER of len bytes with nfds descriptors: magic, counts, each
 * entry's status (0), flags (exactly one of SHM_GF_FD, SHM_GF_FILE, file
 * rules as in a GRANT) and slot (< SHM_SLOTS), the exact length and the
 * fd count. Entries are read with shm_grant_entry_get (e->key filled). */
int shm_offer_decode(const uint8_t *buf, size_t len, int nfds, shm_grant *g);
/* The magic of a received message (0 when shorter than 4 bytes). */
uint32_t shm_msg_magic(const uint8_t *buf, size_t len);

/* ---- DONE (initiator -> target, not answered): the copies of a GRANT of
 * n entries are over. */
void shm_done_encode(uint8_t out[SHM_DONE_LEN], uint32_t n);
/* Checks magic, the exact length and that it answers n. */
int shm_done_decode(const uint8_t *buf, size_t len, uint32_t n);

#endif
