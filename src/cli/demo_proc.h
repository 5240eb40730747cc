/*
 * demo_proc — the child processes of `ect demo`: each is this same `ect`
 * binary (/proc/self/exe) running one of the daemon commands, with stdout and
 * stderr on pipes the parent reads line by line, and stdin on a pipe the
 * parent writes to (demo_send: the producer's "go"). Children run in their own
 * process group (a terminal's Ctrl-C reaches only the parent, which stops
 * them in order) and get SIGKILL if the parent dies (PR_SET_PDEATHSIG), so
 * none outlives the demo.
 */
#ifndef ECT_CLI_DEMO_PROC_H
#define ECT_CLI_DEMO_PROC_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#define DEMO_MAX_CHILDREN 4

/* Called for each complete line (NUL-terminated, newline stripped). */
typedef void (*demo_line_fn)(void *user, int child, bool is_stderr, char *line);

typedef struct demo_child {
    pid_t pid;    /* 0: slot free; -1: exited and reaped */
    int fd[2];    /* stdout, stderr pipes (-1 once at EOF) */
    int in;       /* the write end of its stdin pipe (-1: closed) */
    char *buf[2]; /* partial line per stream */
    size_t len[2];
    int status; /* waitpid status once reaped */
    char name[32];
    char errtail[2048]; /* last stderr bytes, for error reports */
} demo_child;

typedef struct demo_procs {
    demo_child c[DEMO_MAX_CHILDREN];
    demo_line_fn on_line;
    void *user;
    int batch_ms; /* after reading output, pause this long before the next poll,
                     so the lines come in batches: fewer wake-ups (0: none) */
} demo_procs;

/* Starts `ect ARGV...` (argv[0] is the command name, NULL-terminated) in
 * slot (the child runs `ect ARGV...`); false with a message on stderr. */
bool demo_spawn(demo_procs *p, int slot, const char *name, char *const argv[]);

/* Writes line and a newline to the child's stdin (a pipe the parent holds:
 * a child never reads the demo's own stdin). False when the child's stdin
 * is closed or gone (no SIGPIPE). */
bool demo_send(demo_procs *p, int slot, const char *line);

/* Delivers the complete lines of n bytes read from stream (0 stdout, 1
 * stderr) of the child in slot: a line is its bytes up to a newline, or
 * each 1 MiB of a longer one; the rest waits for more. data is written
 * into (lines are handed over NUL-terminated where they lie). */
void demo_feed(demo_procs *p, int slot, int stream, char *data, size_t n);

/* Waits up to timeout_ms for output, delivers complete lines to on_line and
 * reaps children that exited; when it read something, then pauses batch_ms.
 * Returns false only when poll itself failed. */
bool demo_pump(demo_procs *p, int timeout_ms);

/* True when the child in slot exited (and was reaped); its status in
 * p->c[slot].status. */
bool demo_exited(const demo_procs *p, int slot);

/* Sends sig, then waits up to grace_ms for the child to exit (reading its
 * output meanwhile), then SIGKILLs and reaps it. Returns its wait status. */
int demo_stop(demo_procs *p, int slot, int sig, int grace_ms);

/* Stops every running child (SIGTERM, 3 s, SIGKILL) and frees buffers. */
void demo_stop_all(demo_procs *p);

#endif
