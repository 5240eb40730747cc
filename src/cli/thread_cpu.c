/*
 * thread_cpu — the CPU time of this process's threads over intervals, summed
 * by thread name (`ect bench push --threads`, `ect bench pull --threads`). A
 * snapshot lists the tasks in /proc/self/task with their names (comm), then
 * reads each one's CPU clock (clock_gettime on the thread's CPU-time clock,
 * which the kernel brings up to date for a thread on a CPU at that moment;
 * /proc's schedstat is not, and would hand a running thread's earlier work,
 * the bench thread's raw rounds for one, to the next interval). An interval's
 * share is the sum of the differences by task id. A task born during an
 * interval counts from zero; one that ended during it is lost (lanes end
 * after seconds of idleness, not in a busy round).
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"

/* The first line of path into buf (no newline); false when unreadable. */
static bool read_line(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "r");
    if (!f) return false;
    bool ok = fgets(buf, (int)cap, f) != NULL;
    fclose(f);
    if (ok) buf[strcspn(buf, "\n")] = 0;
    return ok;
}

/* The CPU time of thread tid of this process, in ns; false once it ended.
 * The clock id is the kernel's for a thread's scheduler CPU clock (what
 * glibc's pthread_getcpuclockid builds from a thread's tid). */
static bool thread_cpu_ns(long tid, uint64_t *ns) {
    clockid_t id = (clockid_t)((~(unsigned)tid << 3) | 6u);
    struct timespec ts;
    if (clock_gettime(id, &ts) != 0) return false;
    *ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    return true;
}

bool cli_thr_snap_take(cli_thr_snap *s, bool before) {
    /* The calling thread's clock closest to the interval: first thing after
     * it, last thing before it (listing the tasks opens a file a task). */
    long self = (long)gettid();
    uint64_t self_ns = 0;
    if (!before && !thread_cpu_ns(self, &self_ns)) return false;
    s->n = 0;
    DIR *d = opendir("/proc/self/task");
    if (!d) return false;
    for (struct dirent *de; (de = readdir(d)) && s->n < CLI_THR_MAX;) {
        char *end;
        long tid = strtol(de->d_name, &end, 10);
        if (de->d_name[0] == '.' || *end || tid <= 0) continue;
        char path[64];
        cli_thr *t = &s->t[s->n];
        snprintf(path, sizeof path, "/proc/self/task/%ld/comm", tid);
        if (!read_line(path, t->name, sizeof t->name)) continue; /* ended meanwhile */
        t->tid = tid;
        s->n++;
    }
    closedir(d);
    size_t k = 0; /* the others' clocks in one tight pass */
    for (size_t i = 0; i < s->n; i++)
        if (s->t[i].tid == self || thread_cpu_ns(s->t[i].tid, &s->t[i].ns)) s->t[k++] = s->t[i];
    s->n = k;
    if (before && !thread_cpu_ns(self, &self_ns)) return false;
    for (size_t i = 0; i < s->n; i++)
        if (s->t[i].tid == self) s->t[i].ns = self_ns;
    return s->n > 0;
}

bool cli_thr_usable(const char *cmd) {
    static cli_thr_snap probe;
    if (cli_thr_snap_take(&probe, true)) return true;
    fprintf(stderr,
            "ect %s: --threads: cannot list this process's threads (/proc/self/task) or "
            "read their CPU clocks\n",
            cmd);
    return false;
}

void cli_thr_acc_add(cli_thr_acc *a, const cli_thr_snap *before, const cli_thr_snap *after,
                     uint64_t wall_ns) {
    a->wall_ns += wall_ns;
    for (size_t i = 0; i < after->n; i++) {
        const cli_thr *t = &after->t[i];
        uint64_t was = 0;
        for (size_t j = 0; j < before->n; j++)
            if (before->t[j].tid == t->tid) {
                was = before->t[j].ns;
                break;
            }
        if (t->ns <= was) continue;
        size_t k = 0;
        while (k < a->n && strcmp(a->t[k].name, t->name)) k++;
        if (k == a->n) {
            if (a->n == CLI_THR_MAX) continue;
            a->t[a->n++] = (cli_thr){.name = {0}};
            memcpy(a->t[k].name, t->name, sizeof t->name);
        }
        a->t[k].ns += t->ns - was;
    }
}

static int by_ns(const void *x, const void *y) {
    const cli_thr *a = x, *b = y;
    return a->ns < b->ns ? 1 : a->ns > b->ns ? -1 : strcmp(a->name, b->name);
}

void cli_thr_acc_print(cli_thr_acc *a, const char *rounds, bool json) {
    qsort(a->t, a->n, sizeof *a->t, by_ns);
    double all = 0;
    for (size_t i = 0; i < a->n; i++) all += (double)a->t[i].ns;
    double wall = a->wall_ns ? (double)a->wall_ns : 1;
    if (json) {
        printf(",\"threads\":{");
        for (size_t i = 0; i < a->n; i++) {
            char name[sizeof a->t[i].name];
            memcpy(name, a->t[i].name, sizeof name);
            for (char *c = name; *c; c++)
                if (*c < 0x20 || *c > 0x7e || *c == '"' || *c == '\\') *c = '?';
            printf("%s\"%s\":", i ? "," : "", name);
            cli_json_num((double)a->t[i].ns / wall);
        }
        printf("}");
        return;
    }
    printf("     threads, share of one CPU over the %s rounds: all %.2f:", rounds, all / wall);
    for (size_t i = 0; i < a->n && (double)a->t[i].ns / wall >= 0.005; i++)
        printf("%s %s %.2f", i ? "," : "", a->t[i].name, (double)a->t[i].ns / wall);
    printf("\n");
}
