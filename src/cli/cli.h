/*
 * cli — the `ect` command-line tool. Each command is one function in its own
 * file (cmd_<name>.c) registered in the table in main.c. Commands parse their
 * own flags with getopt_long, print `--help` to stdout, and report bad flags
 * on stderr with what is accepted, returning exit code 2.
 */
#ifndef ECT_CLI_H
#define ECT_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "ectransfer.h"

typedef struct cli_cmd {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv); /* argv[0] is the command name */
} cli_cmd;

#define CLI_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* Exit codes. */
#define CLI_EXIT_OK 0
#define CLI_EXIT_FAIL 1
#define CLI_EXIT_USAGE 2

/* The command being run ("push-consumer", "bench xport"): parse errors say
 * "ect CMD: --flag: ...". main sets it; cmd_bench refines it. */
extern const char *cli_command;
void cli_set_command(const char *name);

/* Durations: a number with a unit, us, ms, s, m or h ("500ms", "30s", "2m",
 * "1.5s"); a bare number is in the flag's historical unit, bare_ms
 * milliseconds each (1 for a flag that took milliseconds, 1000 for
 * seconds). cli_duration_ms: 0, or -1 for text that is not one (no output).
 * cli_parse_duration: also checks [min_ms, max_ms] and on error prints
 * "ect CMD: FLAG: ..." and returns false. */
int cli_duration_ms(const char *s, double bare_ms, double *out_ms);
bool cli_parse_duration(const char *flag, const char *s, double bare_ms, double min_ms,
                        double max_ms, double *out_ms);
bool cli_parse_duration_u64(const char *flag, const char *s, double bare_ms, uint64_t min_ms,
                            uint64_t max_ms, uint64_t *out_ms);

/* Parses sizes like "4096", "64KiB", "4.5MiB", "1GiB", "1.5GB", "16k".
 * Binary suffixes (KiB, MiB, GiB, TiB, and K/M/G/T) are powers of 1024;
 * KB/MB/GB/TB are powers of 1000. Returns false with a message on stderr. */
bool cli_parse_size(const char *flag, const char *s, uint64_t *out);
/* Parses a non-negative integer within [min, max]. */
bool cli_parse_u64(const char *flag, const char *s, uint64_t min, uint64_t max, uint64_t *out);
/* Parses a number of seconds within [min, max] for `cmd`'s --seconds; false
 * after saying what is accepted on stderr (the caller exits CLI_EXIT_USAGE). */
bool cli_parse_seconds(const char *cmd, const char *s, double min, double max, double *out);
/* Prints a JSON number unrounded (%.17g round-trips a double, so a reader
 * that recomputes a ratio gets exactly the one printed); null when not finite. */
void cli_json_num(double v);
/* Parses "HOST:PORT" ("[v6]:PORT" too) into host (NUL-terminated) and port. */
bool cli_parse_hostport(const char *flag, const char *s, char *host, size_t hostcap, int *port);
/* Prints "ect CMD: MSG" and "try 'ect CMD --help'" to stderr; returns CLI_EXIT_USAGE. */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* For getopt_long's '?': lists the accepted flags of `opts` and the --help
 * hint on stderr; returns CLI_EXIT_USAGE. */
struct option;
int cli_bad_flag(const char *cmd, const struct option *opts);
/* Formats a byte count as "4.5 MiB" into buf. */
const char *cli_fmt_size(uint64_t bytes, char *buf, size_t cap);

/* clock.c: the monotonic clock; the CPU time of the process (every
 * thread); 64 random bits and 32 random hex digits (like a uuid4 hex) from
 * the OS random source. */
uint64_t cli_now_ns(void);
uint64_t cli_now_ms(void);
uint64_t cli_cpu_ns(void);
uint64_t cli_random_u64(void);
void cli_random_id(char out[33]);
/* args.c: whether the library was built with transport `kind` ("ucx"),
 * as ect_build_info("transports") lists them. */
bool cli_have_transport(const char *kind);
/* a * b into *out; false on overflow. */
static inline bool cli_mul_u64(uint64_t a, uint64_t b, uint64_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}

/* metrics_port.c: `--metrics-port P` (0..65535, 0 = any free port) of the
 * long-running commands; false after saying why on stderr. cli_metrics_start
 * serves GET /metrics on host:port when port >= 0 (else *out stays NULL)
 * and names the address on stderr; false after saying why. */
bool cli_parse_metrics_port(const char *cmd, const char *s, int *port);
bool cli_metrics_start(const char *cmd, const char *host, int port, ect_metrics_server **out);

/* Commands. */
int cmd_info(int argc, char **argv);
int cmd_bench(int argc, char **argv);

/* Bench sub-commands: `ect bench NAME [--json]`. */
typedef struct cli_bench {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv);
} cli_bench;

/* bench_alloc.c: `ect bench alloc` (mem/alloc against a linear first-fit list). */
int bench_alloc(int argc, char **argv);

/* bench_xport.c: `ect bench xport` (tcp/shm/ucx batch writes vs raw TCP, memcpy, ucx_perftest). */
int bench_xport(int argc, char **argv);

/* bench_gpu.c: `ect bench gpu` (GPU pools over tcp and shm/CUDA IPC vs device copies). */
int bench_gpu(int argc, char **argv);

/* checksum.c: XXH3_64bits (seed 0) over every byte (printed as 16 hex
 * digits); the one checksum every command prints and compares. */
#include <stddef.h>
uint64_t cli_checksum(const void *data, size_t n);
/* checksum.c: n deterministic bytes from `state`: per 4 KiB page p, a fixed
 * 64 KiB random block read from an offset of page key k_p (the splitmix64
 * finalizer of state + (p + 1) x golden ratio), each word XOR k_p (the last
 * word cut to n). Same state, same bytes; every word differs between two
 * states. */
void cli_fill_synthetic(void *buf, uint64_t n, uint64_t state);
/* checksum.c: cli_fill_synthetic(buf, n, state), then cli_checksum of it,
 * in one pass over the bytes. */
uint64_t cli_fill_synthetic_checksum(void *buf, uint64_t n, uint64_t state);

/* cmd_pull_producer.c / cmd_pull.c: generation-1 producer and consumer. */
int cmd_pull_producer(int argc, char **argv);
int cmd_pull(int argc, char **argv);
/* bench_pull.c: `ect bench pull` (pull round trips vs raw transport writes). */
int bench_pull(int argc, char **argv);

/* cmd_push.c: `ect push` (generation-2 producer). bench_push.c: `ect bench push`. */
int cmd_push(int argc, char **argv);
int bench_push(int argc, char **argv);

/* cmd_push_consumer.c: `ect push-consumer` (generation-2 consumer instance). */
int cmd_push_consumer(int argc, char **argv);
/* cmd_status.c: `ect status HOST:PORT` (a consumer shard's ect_status). */
int cmd_status(int argc, char **argv);
/* cmd_keygen.c: `ect keygen DIR` (a key directory for --curve-keys). */
int cmd_keygen(int argc, char **argv);

/* cmd_demo.c: `ect demo` (push or pull end to end in separate processes, verified). */
int cmd_demo(int argc, char **argv);

/* latency.c: sorts v ascending; the p-th percentile (0..100) of a sorted v
 * by nearest rank: v[ceil(n x p / 100) - 1] (v[0] for p = 0; 0 when n = 0).
 * Every command's p50 / p99 is this one. */
void cli_sort_u64(uint64_t *v, size_t n);
uint64_t cli_pct_u64(const uint64_t *sorted, size_t n, unsigned p);

/* latency.c: one timed measurement: GB/s over the whole run, p50 and p99 of
 * one call in microseconds; ok once measured. */
typedef struct cli_timing {
    double gbps, p50_us, p99_us;
    bool ok;
    size_t rounds; /* cli_timed_pair: the rounds it was measured in (else 0) */
} cli_timing;
typedef int (*cli_iter_fn)(void *ctx);
/* A cli_iter_fn context: one ect_xport_write_batch of w to session. */
typedef struct cli_write_ctx {
    ect_xport *x;
    const char *session;
    ect_write w;
} cli_write_ctx;
int cli_write_iter(void *ctx);
/* Calls fn twice to warm up, then until `secs` pass (at least 5 times, at
 * most CLI_MAX_ITERS), timing each call; each call moves `bytes`. 0, or -1
 * when a call failed or memory ran out. */
#define CLI_MAX_ITERS 20000
int cli_timed(cli_iter_fn fn, void *ctx, uint64_t bytes, double secs, cli_timing *s);
/* Fills s from n per-call times (ns; sorted here) and the run's total. */
void cli_summarize(uint64_t *lat, size_t n, uint64_t bytes, uint64_t total_ns, cli_timing *s);

/* latency.c: a measurement taken in rounds that alternate with another's
 * (a bench's own side and its limit), so a change of load on a busy machine
 * hits both alike. lat holds cap per-call times (ns), n used; busy_ns sums
 * them; rounds counts the rounds run. */
typedef struct cli_rounds {
    uint64_t *lat;
    size_t n, cap, rounds;
    uint64_t busy_ns;
} cli_rounds;
/* A round every CLI_ROUND_NS of a measurement's seconds, at least
 * CLI_MIN_ROUNDS: the rounds of each kind for `secs` of each. */
#define CLI_ROUND_NS 100000000ull
#define CLI_MIN_ROUNDS 3
size_t cli_round_count(double secs);
/* One round: calls fn, timing each call into r, until dur_ns pass (at least
 * once), at most `most` calls and while r has room. 0, or -1 when a call
 * failed. */
int cli_round(cli_iter_fn fn, void *ctx, uint64_t dur_ns, size_t most, cli_rounds *r);
/* Fills s from r: GB/s (bytes per call) over the calls' summed time, p50 and
 * p99 of one call (sorts r->lat), rounds. */
void cli_rounds_summarize(cli_rounds *r, uint64_t bytes, cli_timing *s);
/* As cli_timed for two measurements at once: warms each up (two calls), then
 * alternates rounds of a and of b, cli_round_count(secs) of each, a round
 * secs / that count long (at least 5 calls of each in all, at most
 * CLI_MAX_ITERS, spread evenly over the rounds). 0, or -1 when a call failed
 * or memory ran out. */
int cli_timed_pair(cli_iter_fn fa, void *ca, uint64_t bytes_a, cli_iter_fn fb, void *cb,
                   uint64_t bytes_b, double secs, cli_timing *sa, cli_timing *sb);

/* thread_cpu.c: CPU time by thread name over intervals (`ect bench push
 * --threads`, `ect bench pull --threads`): the tasks of /proc/self/task,
 * their names (comm) and their CPU clocks. */
#define CLI_THR_MAX 64
typedef struct cli_thr {
    long tid; /* snapshots only */
    uint64_t ns;
    char name[16];
} cli_thr;
typedef struct cli_thr_snap {
    size_t n;
    cli_thr t[CLI_THR_MAX];
} cli_thr_snap;
typedef struct cli_thr_acc {
    size_t n;
    cli_thr t[CLI_THR_MAX]; /* one per name: its summed ns */
    uint64_t wall_ns;       /* the intervals' wall time */
} cli_thr_acc;
/* A snapshot taken just before an interval (before) or just after it; the
 * calling thread's own clock is read closest to the interval. False when no
 * task could be read (no /proc). */
bool cli_thr_snap_take(cli_thr_snap *s, bool before);
/* Whether snapshots can be taken here; if not, says so on stderr as `ect
 * <cmd>: --threads: ...` (fails at once, not with an empty line under every
 * row). */
bool cli_thr_usable(const char *cmd);
/* Adds the CPU between two snapshots, by name, and the interval's wall time. */
void cli_thr_acc_add(cli_thr_acc *a, const cli_thr_snap *before, const cli_thr_snap *after,
                     uint64_t wall_ns);
/* Text: one line, names of at least 0.5 % of one CPU, busiest first, as a
 * share over the `rounds` ("push", "pull") rounds; JSON:
 * `,"threads":{NAME:SHARE,...}` inside the row's object. Sorts a. */
void cli_thr_acc_print(cli_thr_acc *a, const char *rounds, bool json);

/* json_out.c: s needs no JSON escape (printable ASCII, no '"' or '\\'). */
bool cli_json_plain(const char *s);
/* json_out.c: v as jansson prints json_real(v) (17 significant digits, ".0"
 * when integral, a bare exponent): its length, or -1 (not finite, or cap
 * short). */
int cli_json_real(char *buf, size_t cap, double v);
/* json_out.c: `ect push`'s line for one item, on stdout (not flushed). */
typedef struct cli_push_line {
    const char *transfer_id, *mm_hash;
    uint64_t nbytes, checksum;
    const ect_push_result *r;
} cli_push_line;
void cli_print_push_line(const cli_push_line *p);

/* bench_xport.c: one row of `ect bench xport` (loopback and two-host): the
 * table line, or one JSON object when json (comma: a ',' before it). label is
 * the size column's text, batch the writes in one batch (0: no "batch"
 * field), extra more JSON fields (",\"k\":v", or ""). The limit's figures
 * are NaN unless lim->ok. Flushes stdout. */
void xport_row(bool json, bool comma, const char *kind, size_t size, const char *label, int batch,
               const cli_timing *us, const char *limit, const cli_timing *lim, const char *extra);

#endif
